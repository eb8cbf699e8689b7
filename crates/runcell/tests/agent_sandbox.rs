//! agent-sandbox's runtime contract (`runcell serve --agent-sandbox-listen`), checked two ways:
//!
//! * the checks of agent-sandbox's own `examples/python-runtime-sandbox/tester.py`, written
//!   again here against runcell's listener (health, `echo 'hello world'`, upload → exists →
//!   download → list, `..` refused with 403 "Access denied", an unsafe upload name refused),
//!   plus what a demanding user of the SDK expects: exit codes kept, files that persist
//!   between commands while each command starts afresh in the workspace, a symbolic link out
//!   of it refused, bodies beyond the caps refused;
//! * the real Python SDK (`k8s-agent-sandbox`, pinned, installed by scripts/test.sh into
//!   target/agent-sandbox-venv) driving the listener through its direct connection
//!   (`SandboxDirectConnectionConfig(api_url=...)`): tests/agent_sandbox/client.py builds the
//!   SDK's `Sandbox` against the URL (no Kubernetes API: its lookups of the Sandbox object
//!   answer "none") and reports what it saw as JSON; the assertions are here. Without the SDK
//!   (or without the data stack, for the check that needs it) the test is reported ignored.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_host_clean, ServeProcess};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// How long the pod's session may take to be made (a loaded machine builds a Python sandbox
/// in well under this; the wait ends as soon as it is ready).
const READY_WITHIN: Duration = Duration::from_secs(120);

/// `runcell serve` with the contract on a port of its own, and its base URL.
fn serve(extra: &[&str]) -> (ServeProcess, String) {
    let mut args = vec![
        "--pool",
        "python=0",
        "--agent-sandbox-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let server = ServeProcess::start(&args, &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let base = loop {
        let log = server.log();
        if let Some(rest) = log.split("runtime contract on http://").nth(1) {
            break format!("http://{}", rest.split_whitespace().next().unwrap());
        }
        assert!(
            Instant::now() < deadline,
            "the contract's listener did not start: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    (server, base)
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(180))
        .build()
        .unwrap()
}

/// Wait until `GET /` says the pod is ready (503 "starting" until its session is made).
fn wait_ready(c: &Client, base: &str, server: &ServeProcess) -> Value {
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let r = c.get(format!("{base}/")).send().unwrap();
        let status = r.status().as_u16();
        let body: Value = r.json().unwrap();
        if status == 200 {
            return body;
        }
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["status"], "starting");
        assert!(
            Instant::now() < deadline,
            "not ready within {READY_WITHIN:?}: {}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn execute(c: &Client, base: &str, command: &str) -> Value {
    let r = c
        .post(format!("{base}/execute"))
        .json(&json!({ "command": command }))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200, "{command}");
    r.json().unwrap()
}

/// A multipart body with one `file` part named `filename`, as `requests` sends it.
fn upload(c: &Client, base: &str, filename: &str, content: &[u8]) -> Response {
    let boundary = "runcellboundary0123456789";
    let mut body = format!(
        "--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"{filename}\"\r\n\r\n"
    )
    .into_bytes();
    body.extend_from_slice(content);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    c.post(format!("{base}/upload"))
        .header(
            "content-type",
            format!("multipart/form-data; boundary={boundary}"),
        )
        .body(body)
        .send()
        .unwrap()
}

fn get(c: &Client, base: &str, path: &str) -> (u16, Vec<u8>) {
    let r = c.get(format!("{base}{path}")).send().unwrap();
    (r.status().as_u16(), r.bytes().unwrap().to_vec())
}

fn get_json(c: &Client, base: &str, path: &str) -> (u16, Value) {
    let (s, b) = get(c, base, path);
    let v = serde_json::from_slice(&b)
        .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {}", String::from_utf8_lossy(&b)));
    (s, v)
}

#[test]
fn the_reference_testers_checks_pass_against_runcell() {
    // Caps small enough to cross: commands up to 64 KiB, files up to 1 MiB.
    let (mut server, base) = serve(&["--cap", "code=64K", "--cap", "input_file=1M"]);
    let c = client();

    // Health (the readiness probe).
    let health = wait_ready(&c, &base, &server);
    assert_eq!(health["status"], "ok");

    // Execute: the tester's exact check, and what a user of the SDK expects of a shell.
    let r = execute(&c, &base, "echo 'hello world'");
    assert_eq!(r["stdout"], "hello world\n", "{r}");
    assert_eq!(r["exit_code"], 0);
    assert_eq!(r["timed_out"], false);
    // The pod stays ready while commands run (the probe never waits for the session).
    let long = {
        let (c, base) = (c.clone(), base.clone());
        std::thread::spawn(move || execute(&c, &base, "sleep 1; echo slept"))
    };
    for _ in 0..5 {
        let r = c.get(format!("{base}/")).send().unwrap();
        assert_eq!(r.status().as_u16(), 200);
    }
    assert_eq!(long.join().unwrap()["stdout"], "slept\n");
    // Requests sent at once (an async client's `gather`) wait their turn: none is told the
    // session is busy.
    let at_once: Vec<_> = (0..4)
        .map(|i| {
            let (c, base) = (c.clone(), base.clone());
            std::thread::spawn(move || execute(&c, &base, &format!("echo {i}")))
        })
        .collect();
    for (i, h) in at_once.into_iter().enumerate() {
        assert_eq!(h.join().unwrap()["stdout"], format!("{i}\n"));
    }
    let r = execute(&c, &base, "echo oops >&2; exit 3");
    assert_eq!(r["exit_code"], 3, "{r}");
    assert_eq!(r["stderr"], "oops\n");
    let r = execute(&c, &base, "false");
    assert_eq!(r["exit_code"], 1);
    let r = execute(&c, &base, "kill -9 $$");
    assert_eq!(r["exit_code"], 137, "a signal is 128 + N: {r}");
    let r = execute(&c, &base, "no-such-command-here");
    assert_eq!(r["exit_code"], 127, "{r}");
    // Files persist between commands; nothing else of a command's shell does, and every
    // command starts in the workspace (the reference's base directory, also /app).
    execute(
        &c,
        &base,
        "echo kept > persisted.txt; cd /tmp; export GONE=1",
    );
    let r = execute(
        &c,
        &base,
        "pwd; echo \"[$GONE]\"; cat persisted.txt /app/persisted.txt",
    );
    assert_eq!(r["stdout"], "/workspace\n[]\nkept\nkept\n", "{r}");
    // Python, as the reference image has it: `python` is the session's own interpreter.
    let r = execute(
        &c,
        &base,
        "python -c 'import sys; print(sys.version_info[0])'",
    );
    assert_eq!(r["stdout"], "3\n", "{r}");
    // The command's timeout (the SDK's `command_timeout`): killed, 124, `timed_out`.
    let r = c
        .post(format!("{base}/execute"))
        .json(&json!({"command": "echo started; sleep 30", "timeout_seconds": 0.5}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let r: Value = r.json().unwrap();
    assert_eq!(r["exit_code"], 124, "{r}");
    assert_eq!(r["timed_out"], true);
    assert_eq!(r["stdout"], "started\n");
    assert!(r["stderr"].as_str().unwrap().contains("runcell: "), "{r}");
    // A body that is not the contract's.
    let r = c
        .post(format!("{base}/execute"))
        .json(&json!({"cmd": "ls"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 422);

    // List and exists.
    let (s, v) = get_json(&c, &base, "/list/.");
    assert_eq!(s, 200);
    assert!(v.is_array(), "{v}");
    let (s, v) = get_json(&c, &base, "/exists/");
    assert_eq!(s, 200);
    assert_eq!(v, json!({"path": "", "exists": true}));
    let (_, v) = get_json(&c, &base, "/exists/does_not_exist");
    assert_eq!(v, json!({"path": "does_not_exist", "exists": false}));

    // Traversal, relative and absolute, on every route that takes a path.
    for path in [
        "/exists/..%2F..%2Fetc%2Fpasswd",
        "/exists/%2F..%2Fetc%2Fpasswd",
        "/list/..%2F..",
        "/download/..%2F..%2Fetc%2Fpasswd",
    ] {
        let (s, v) = get_json(&c, &base, path);
        assert_eq!(s, 403, "{path}: {v}");
        assert_eq!(v["message"], "Access denied", "{path}");
    }
    // An absolute path names a file below the workspace, as the reference re-roots it.
    let (_, v) = get_json(&c, &base, "/exists/%2Fpersisted.txt");
    assert_eq!(v["exists"], true, "{v}");

    // Upload → exists → download → list → clean up (the tester's round trip).
    let r = upload(
        &c,
        &base,
        "test_upload.txt",
        b"Hello world from upload test",
    );
    assert_eq!(r.status().as_u16(), 200);
    let v: Value = r.json().unwrap();
    assert!(
        v["message"]
            .as_str()
            .unwrap()
            .contains("uploaded successfully"),
        "{v}"
    );
    let (_, v) = get_json(&c, &base, "/exists/test_upload.txt");
    assert_eq!(v["exists"], true);
    let (s, b) = get(&c, &base, "/download/test_upload.txt");
    assert_eq!(s, 200);
    assert_eq!(b, b"Hello world from upload test");
    let (_, v) = get_json(&c, &base, "/list/");
    let entry = v
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "test_upload.txt")
        .unwrap_or_else(|| panic!("not listed: {v}"))
        .clone();
    assert_eq!(entry["size"], 28);
    assert_eq!(entry["type"], "file");
    assert!(entry["mod_time"].as_f64().unwrap() > 1.6e9, "{entry}");
    let r = execute(&c, &base, "rm test_upload.txt");
    assert_eq!(r["exit_code"], 0);
    let (_, v) = get_json(&c, &base, "/exists/test_upload.txt");
    assert_eq!(v["exists"], false);
    // Nested paths: parents are made; the command sees the file; the listing shows the
    // directory; a binary file comes back byte for byte.
    let binary: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    assert_eq!(
        upload(&c, &base, "data/input.bin", &binary)
            .status()
            .as_u16(),
        200
    );
    let (_, v) = get_json(&c, &base, "/list/.");
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "data" && e["type"] == "directory"),
        "{v}"
    );
    let r = execute(&c, &base, "wc -c < data/input.bin");
    assert_eq!(r["stdout"], "70000\n");
    assert_eq!(get(&c, &base, "/download/data%2Finput.bin").1, binary);
    assert_eq!(get(&c, &base, "/download/data/input.bin").1, binary);
    let (s, v) = get_json(&c, &base, "/list/data%2Finput.bin");
    assert_eq!(s, 404, "a file is not a directory: {v}");
    assert_eq!(get(&c, &base, "/download/nothing-here").0, 404);
    // The unsafe upload name.
    let r = upload(&c, &base, "../../unsafe_upload.txt", b"malicious payload");
    assert_eq!(r.status().as_u16(), 403);
    let v: Value = r.json().unwrap();
    assert!(v["message"].as_str().unwrap().contains("Access denied"));

    // A symbolic link out of the workspace: judged by where it leads (403), never followed
    // by a download or an upload.
    let r = execute(&c, &base, "ln -s /etc escape && ln -s /etc/hostname leak");
    assert_eq!(r["exit_code"], 0, "{r}");
    for path in ["/list/escape", "/exists/escape%2Fhostname", "/exists/leak"] {
        let (s, v) = get_json(&c, &base, path);
        assert_eq!(s, 403, "{path}: {v}");
    }
    assert_eq!(get(&c, &base, "/download/leak").0, 404);
    assert_eq!(get(&c, &base, "/download/escape%2Fhostname").0, 404);
    let r = upload(&c, &base, "escape/x.txt", b"x");
    assert_eq!(r.status().as_u16(), 409, "not written through a link");

    // Bodies beyond the caps: refused before they are read whole.
    let r = c
        .post(format!("{base}/execute"))
        .json(&json!({ "command": "x".repeat(200 << 10) }))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 413);
    let r = upload(&c, &base, "big.bin", &vec![b'x'; 2 << 20]);
    assert_eq!(r.status().as_u16(), 413);

    // Still the same session, and the files still there.
    let r = execute(&c, &base, "cat persisted.txt");
    assert_eq!(r["stdout"], "kept\n");

    let pid = server.pid();
    assert!(server.terminate(Duration::from_secs(60)).success());
    assert_host_clean(pid);
    let log = server.log();
    assert!(
        log.contains("\"interface\":\"agent-sandbox\""),
        "the contract's runs are audited as its interface: {log}"
    );
}

/// The tester's ML check, with the libraries of runcell's data stack: `python` in a command
/// is the session's interpreter, with the stack's packages.
#[test]
#[cfg_attr(
    not(host_python_stack),
    ignore = "needs the Python data stack (runcell setup; scripts/test.sh runs it)"
)]
fn commands_get_the_sessions_python_and_its_data_stack() {
    let (mut server, base) = serve(&[]);
    let c = client();
    wait_ready(&c, &base, &server);
    let r = execute(
        &c,
        &base,
        "python -c 'import pandas as pd, numpy as np; print(\"ml-ok\", int(pd.Series(np.arange(3)).sum()))'",
    );
    assert_eq!(r["stdout"], "ml-ok 3\n", "{r}");
    assert_eq!(r["exit_code"], 0);
    let pid = server.pid();
    assert!(server.terminate(Duration::from_secs(60)).success());
    assert_host_clean(pid);
}

#[test]
fn a_session_that_ended_is_made_again() {
    // A session TTL of 1 s: the pod's session expires while idle, and the next request gets a
    // new one (its files are gone, as the warning of a lost session says elsewhere).
    let (mut server, base) = serve(&["--session-max-ttl", "1s", "--session-ttl", "1s"]);
    let c = client();
    wait_ready(&c, &base, &server);
    execute(&c, &base, "echo a > a.txt");
    // Wait until it has expired (the health check says so, and starts a new one).
    let deadline = Instant::now() + READY_WITHIN;
    loop {
        let r = c.get(format!("{base}/")).send().unwrap();
        if r.status().as_u16() == 503 {
            break;
        }
        assert!(Instant::now() < deadline, "the session did not expire");
        std::thread::sleep(Duration::from_millis(100));
    }
    let r = execute(&c, &base, "ls; echo done");
    assert_eq!(r["exit_code"], 0, "{r}");
    assert!(r["stdout"].as_str().unwrap().ends_with("done\n"), "{r}");
    let pid = server.pid();
    assert!(server.terminate(Duration::from_secs(60)).success());
    assert_host_clean(pid);
}

#[test]
#[cfg_attr(
    not(host_agent_sandbox_sdk),
    ignore = "needs the k8s-agent-sandbox SDK (scripts/test.sh installs it in target/agent-sandbox-venv)"
)]
fn the_python_sdk_drives_the_contract() {
    let python =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/agent-sandbox-venv/bin/python");
    let (mut server, base) = serve(&[]);
    let c = client();
    wait_ready(&c, &base, &server);
    let out = Command::new(python)
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agent_sandbox/client.py"))
        .env("SANDBOX_URL", &base)
        .output()
        .expect("run the SDK client");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the SDK client failed: {}\n{stdout}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        server.log()
    );
    let r: Value =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(r["sdk_version"], "1.0.8");
    assert_eq!(
        r["hello"],
        json!({"stdout": "hello world\n", "exit_code": 0, "timed_out": false})
    );
    assert_eq!(r["exit_code"], 7);
    assert_eq!(r["timeout"], json!({"exit_code": 124, "timed_out": true}));
    assert_eq!(r["read"], "a,b\n1,2\n");
    assert_eq!(r["streamed_read_bytes"], 300_000);
    assert_eq!(r["streamed_write_matches"], true);
    assert_eq!(r["exists"], json!([true, false]));
    let listed = r["listed"].as_array().unwrap();
    assert!(
        listed.contains(&json!(["data", "directory"]))
            && listed.contains(&json!(["big.bin", "file"])),
        "{listed:?}"
    );
    assert_eq!(r["listed_in_data"], json!([["in.csv", "file", 8]]));
    assert_eq!(r["cat_from_command"], "a,b\n1,2\n");
    assert_eq!(r["unsafe_refused_by_sdk"], true);
    assert_eq!(r["unsafe_refused_by_runcell"], 403);
    assert_eq!(r["delete"], "NotImplementedError");
    let pid = server.pid();
    assert!(server.terminate(Duration::from_secs(60)).success());
    assert_host_clean(pid);
}
