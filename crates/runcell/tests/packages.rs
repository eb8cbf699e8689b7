//! Vetted package installs (issue 13): a run asks for a package the curated stack lacks; it is
//! installed, binary wheels only, in a sandbox of its own that reaches only the package index
//! (here a local PEP 503 index of one wheel on the host's 127.0.0.2), kept in the cache by the
//! hash of the requirement set, and shown read-only to the run, which stays offline. The next
//! run that asks for the same set uses the cache without touching the index.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

const WHEEL: &str = "tabulate-0.9.0-py3-none-any.whl";

fn wheel() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/test-wheels")
        .join(WHEEL)
}

/// A static server of `root` on 127.0.0.2 (GET only; a directory serves its index.html).
/// Counts the requests.
fn serve(root: PathBuf) -> (u16, Arc<AtomicU32>) {
    let l = TcpListener::bind("127.0.0.2:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let hits = Arc::new(AtomicU32::new(0));
    let h = hits.clone();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            h.fetch_add(1, Ordering::SeqCst);
            let root = root.clone();
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut chunk) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let line = String::from_utf8_lossy(&buf)
                    .lines()
                    .next()
                    .unwrap_or("")
                    .to_string();
                let path = line.split(' ').nth(1).unwrap_or("/");
                let path = path.split(['?', '#']).next().unwrap_or("/");
                let mut file = root.join(path.trim_start_matches('/'));
                if file.is_dir() {
                    file = file.join("index.html");
                }
                let (status, body) = match std::fs::read(&file) {
                    Ok(b) if !path.contains("..") => ("200 OK", b),
                    _ => ("404 Not Found", b"not found".to_vec()),
                };
                let kind = if file.extension().is_some_and(|e| e == "whl") {
                    "application/octet-stream"
                } else {
                    "text/html"
                };
                let _ = write!(
                    s,
                    "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(&body);
            });
        }
    });
    (port, hits)
}

/// A PEP 503 index with tabulate 0.9.0's wheel.
fn index() -> (tempfile::TempDir, String, Arc<AtomicU32>) {
    let dir = tempfile::tempdir().unwrap();
    let files = dir.path().join("files");
    std::fs::create_dir_all(&files).unwrap();
    std::fs::copy(wheel(), files.join(WHEEL)).unwrap();
    let page = dir.path().join("simple/tabulate");
    std::fs::create_dir_all(&page).unwrap();
    std::fs::write(
        page.join("index.html"),
        format!("<!DOCTYPE html><html><body><a href=\"/files/{WHEEL}\">{WHEEL}</a></body></html>"),
    )
    .unwrap();
    std::fs::create_dir_all(dir.path().join("simple/nothing-here")).unwrap();
    std::fs::write(
        dir.path().join("simple/nothing-here/index.html"),
        "<!DOCTYPE html><html><body></body></html>",
    )
    .unwrap();
    let (port, hits) = serve(dir.path().to_path_buf());
    (dir, format!("http://127.0.0.2:{port}/simple"), hits)
}

#[test]
#[cfg_attr(
    not(host_test_wheels),
    ignore = "needs target/test-wheels (scripts/test.sh downloads tabulate's wheel from PyPI)"
)]
fn a_package_is_installed_once_from_the_index_and_used_read_only_from_the_cache() {
    let (_index_dir, index_url, hits) = index();
    // (Not under /tmp: the sandbox has its own /tmp, which would hide the layer.)
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let code = r#"
import os, tabulate
print(tabulate.__version__)
print(tabulate.tabulate([[1, 2]], headers=["a", "b"]).splitlines()[0].split())
try:
    open(os.path.join(os.path.dirname(tabulate.__file__), "x"), "w")
    print("layer=WRITABLE")
except OSError as e:
    print("layer=" + type(e).__name__)
"#;
    let go = || {
        run_args(
            &[
                "--package",
                "tabulate==0.9.0",
                "--package-index",
                &index_url,
                "-c",
                code,
            ],
            |c| {
                c.env("RUNCELL_DATA_DIR", data.path());
            },
        )
    };
    let r = go();
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "0.9.0\n['a', 'b']\nlayer=OSError\n",
        "{:#}",
        r.verdict
    );
    let p = &r.verdict["packages"];
    assert_eq!(p["requirements"], serde_json::json!(["tabulate==0.9.0"]));
    assert_eq!(p["cached"], false, "{p}");
    assert!(p["install_seconds"].as_f64().unwrap() > 0.0);
    assert!(
        r.verdict.get("network").is_none(),
        "the run itself is offline"
    );
    let layer = data
        .path()
        .join("packages")
        .join(p["layer"].as_str().unwrap());
    assert!(layer.join(".runcell-complete").is_file());
    assert!(layer.join("site/tabulate/__init__.py").is_file());
    let seen = hits.load(Ordering::SeqCst);
    assert!(seen >= 2, "the index was asked {seen} times");

    // The same set again: from the cache, the index untouched.
    let r = go();
    r.assert_ok();
    assert_eq!(r.verdict["packages"]["cached"], true, "{:#}", r.verdict);
    assert_eq!(
        hits.load(Ordering::SeqCst),
        seen,
        "the index was asked again"
    );
}

#[test]
#[cfg_attr(
    not(host_test_wheels),
    ignore = "needs target/test-wheels (scripts/test.sh downloads tabulate's wheel from PyPI)"
)]
fn what_cannot_be_installed_is_refused_with_pips_reason() {
    let (_index_dir, index_url, _hits) = index();
    // (Not under /tmp: the sandbox has its own /tmp, which would hide the layer.)
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let r = run_args(
        &[
            "--package",
            "nothing-here==1.0",
            "--package-index",
            &index_url,
            "-c",
            "print(1)",
        ],
        |c| {
            c.env("RUNCELL_DATA_DIR", data.path());
        },
    );
    r.assert_category("invalid_request");
    assert!(
        r.message().contains("Installing nothing-here==1.0 failed")
            && r.message().contains("No matching distribution"),
        "{}",
        r.message()
    );
    assert!(
        r.verdict["exit_code"].is_null(),
        "nothing ran: {:#}",
        r.verdict
    );
    for (bad, says) in [
        ("tabulate @ https://example.com/x.whl", "not a requirement"),
        ("--index-url=http://evil", "not a requirement"),
    ] {
        let arg = format!("--package={bad}");
        let r = run_args(&[&arg, "-c", "print(1)"], |_| {});
        r.assert_category("invalid_request");
        assert!(r.message().contains(says), "{bad}: {}", r.message());
    }
    let r = run_args(
        &["--lang", "bash", "--package", "tabulate", "-c", "true"],
        |_| {},
    );
    r.assert_category("invalid_request");
    assert!(r.message().contains("Python runs only"), "{}", r.message());
}

/// Over HTTP: the operator's policy names the packages runs may ask for.
#[test]
#[cfg_attr(
    not(host_test_wheels),
    ignore = "needs target/test-wheels (scripts/test.sh downloads tabulate's wheel from PyPI)"
)]
fn the_server_installs_only_what_its_policy_allows() {
    let (_index_dir, index_url, _hits) = index();
    let data = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let s = common::ServeProcess::start(
        &[
            "--pool",
            "python=0",
            "--allow-package",
            "tabulate",
            "--package-index",
            &index_url,
        ],
        &[("RUNCELL_DATA_DIR", data.path().to_str().unwrap())],
    );
    let post = |body: serde_json::Value| {
        let res = reqwest::blocking::Client::new()
            .post(s.url("/v1/execute"))
            .json(&body)
            .timeout(std::time::Duration::from_secs(120))
            .send()
            .unwrap();
        (
            res.status().as_u16(),
            res.json::<serde_json::Value>().unwrap(),
        )
    };
    let (status, v) = post(serde_json::json!({"language": "python",
        "code": "import tabulate; print(tabulate.__version__)", "packages": ["tabulate==0.9.0"]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "0.9.0\n", "{v}");
    assert_eq!(v["packages"]["cached"], false);
    let (status, v) = post(serde_json::json!({"language": "python",
        "code": "print(1)", "packages": ["requests"]}));
    assert_eq!(status, 400, "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("\"requests\" is not allowed") && m.contains("tabulate"),
        "{m}"
    );
}
