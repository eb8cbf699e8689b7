//! The command line: invalid requests, exit codes, output encoding, the human (non-JSON) mode,
//! limits echoed in the verdict, and `runcell doctor`.

mod common;
use common::*;

use std::process::Stdio;

/// An invalid request: category, exit code 2, no program ran, no panic.
fn assert_invalid(r: &Run, mentions: &str) {
    r.assert_category("invalid_request");
    assert_eq!(r.code, Some(2), "runcell's exit code: {:#}", r.verdict);
    assert_eq!(r.exit_code(), None, "no program ran: {:#}", r.verdict);
    assert!(
        r.message()
            .to_lowercase()
            .contains(&mentions.to_lowercase()),
        "message {:?} should mention {mentions:?}",
        r.message()
    );
    assert!(
        r.stderr.is_empty(),
        "--json prints nothing on stderr: {}",
        r.stderr
    );
}

#[test]
fn an_unknown_language_is_an_invalid_request() {
    let r = run("cobol", "DISPLAY 'HI'.", &[]);
    assert_invalid(&r, "cobol");
    assert!(
        r.message().contains("python"),
        "lists the accepted names: {}",
        r.message()
    );
}

#[test]
fn bad_limit_values_are_invalid_requests() {
    let cases: &[(&[&str], &str)] = &[
        (&["--timeout", "-5"], "--timeout"),
        (&["--timeout", "999999"], "timeout"),
        (&["--timeout", "abc"], "--timeout"),
        (&["--timeout", "0"], "timeout"),
        (&["--compile-timeout", "1h"], "compile_timeout"),
        (&["--memory", "1Q"], "--memory"),
        (&["--memory", "100T"], "memory"),
        (&["--memory", "1K"], "memory"),
        (&["--memory", "-1G"], "--memory"),
        (&["--cpus", "0"], "--cpus"),
        (&["--cpus", "-1"], "--cpus"),
        (&["--cpus", "NaN"], "--cpus"),
        (&["--cpus", "1000"], "cpu"),
        (&["--pids", "abc"], "--pids"),
        (&["--pids", "0"], "pids"),
        (&["--pids", "-3"], "--pids"),
        (&["--pids", "100000"], "pids"),
        (&["--disk", "0"], "disk"),
        (&["--disk", "1P"], "--disk"),
        (&["--output", "0"], "output"),
        (&["--open-files", "3"], "open_files"),
        (&["--open-files", "1e9"], "--open-files"),
    ];
    for (args, mention) in cases {
        let r = run("python", "print('must not run')", args);
        assert_invalid(&r, mention);
        assert_eq!(r.stdout(), "", "{args:?}");
    }
}

#[test]
fn code_over_1_mib_is_an_invalid_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.py");
    let mut code = "# padding\n".repeat((1 << 20) / 10 + 1);
    code.push_str("print('must not run')\n");
    std::fs::write(&path, &code).unwrap();
    let r = run_args(&[path.to_str().unwrap()], |_| {});
    assert_invalid(&r, "1048576");
}

#[test]
fn missing_directory_and_non_utf8_files_are_invalid_requests() {
    let r = run_args(&["/nonexistent/main.py"], |_| {});
    assert_invalid(&r, "/nonexistent/main.py");

    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.py");
    std::fs::write(&bad, b"print(1)\n# \xff\xfe\n").unwrap();
    let r = run_args(&[bad.to_str().unwrap()], |_| {});
    assert_invalid(&r, "UTF-8");

    // A directory cannot be read as a file.
    let r = run_args(&[dir.path().to_str().unwrap()], |_| {});
    assert_invalid(&r, "Cannot read");

    let r = run_args(
        &["--stdin", "/nonexistent/input.txt", "-c", "print(1)"],
        |_| {},
    );
    assert_invalid(&r, "/nonexistent/input.txt");
}

#[test]
#[cfg_attr(
    not(all(host_root, host_setpriv)),
    ignore = "needs root and setpriv (util-linux) to become nobody"
)]
fn an_unreadable_code_file_is_an_invalid_request() {
    // The file exists but runcell, run as nobody, may not read it.
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("secret.py");
    std::fs::write(&secret, "print(1)").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let argv: Vec<String> = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        runcell_bin().to_str().unwrap(),
        "run",
        "--json",
        secret.to_str().unwrap(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run_argv(&argv, |_| {});
    assert_invalid(&r, "Permission denied");
}

#[test]
fn no_code_is_an_invalid_request() {
    let r = run_args(&[], |_| {});
    assert_invalid(&r, "No code given");
}

#[test]
fn non_utf8_code_on_stdin_is_an_invalid_request() {
    let mut child = std::process::Command::new(runcell_bin())
        .args(["run", "--json", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"print(1)\xff")
            .unwrap();
    }
    let out = child.wait_with_output().unwrap();
    assert_no_panic(&String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["error"]["category"], "invalid_request");
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_unknown_flag_with_json_still_prints_an_invalid_request_verdict() {
    // An agent parses stdout: a typo in a flag must not leave it with nothing to parse.
    let out = runcell_raw(
        &["run", "--json", "--memroy", "64M", "-c", "print(1)"],
        |_| {},
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_no_panic(&stderr);
    assert_eq!(out.status.code(), Some(2));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| {
        panic!("`run --json` with an unknown flag printed no JSON verdict ({e}); stdout={stdout:?} stderr={stderr:?}")
    });
    assert_eq!(v["error"]["category"], "invalid_request");
}

#[test]
fn the_programs_exit_code_is_runcells_exit_code() {
    for code in [0, 1, 3, 42, 255] {
        let r = run("python", &format!("import sys\nsys.exit({code})"), &[]);
        assert_eq!(r.exit_code(), Some(code), "{:#}", r.verdict);
        assert_eq!(r.code, Some(code as i32));
        if code == 0 {
            r.assert_ok();
        } else {
            r.assert_category("runtime_error");
            assert!(
                r.message().contains(&format!("exited with code {code}")),
                "{}",
                r.message()
            );
        }
    }
}

#[test]
fn non_utf8_output_becomes_valid_json_with_replacement_characters() {
    let r = run(
        "python",
        "import sys\nsys.stdout.buffer.write(b'a\\xff\\xfeb\\n')\nsys.stderr.buffer.write(b'\\xc3(\\n')",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "a\u{FFFD}\u{FFFD}b\n");
    assert_eq!(r.stderr_out(), "\u{FFFD}(\n");
}

#[test]
fn control_characters_and_quotes_in_output_round_trip_through_json() {
    let r = run(
        "python",
        "import sys\nsys.stdout.write('q\"\\\\\\t\\x00\\x1b[31m\\u00e9\\U0001F600\\n')",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "q\"\\\t\0\x1b[31m\u{e9}\u{1F600}\n");
}

#[test]
fn without_json_output_passes_through_and_a_summary_goes_to_stderr() {
    let out = runcell_raw(
        &[
            "run",
            "-c",
            "import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(3)",
        ],
        |_| {},
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout), "to stdout\n");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_no_panic(&stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(
        lines.len(),
        2,
        "the program's stderr then one summary line: {stderr:?}"
    );
    assert_eq!(lines[0], "to stderr");
    assert!(
        lines[1].starts_with("runcell: runtime_error (exit code 3)"),
        "{}",
        lines[1]
    );
    assert_eq!(out.status.code(), Some(3));

    let out = runcell_raw(
        &["run", "--lang", "bash", "-c", "printf 'raw\\xff bytes'"],
        |_| {},
    );
    assert_eq!(
        out.stdout, b"raw\xff bytes",
        "without --json bytes pass through unchanged"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr:?}");
    assert!(stderr.starts_with("runcell: bash exited 0"), "{stderr}");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
fn without_json_an_invalid_request_exits_2_with_a_message() {
    let out = runcell_raw(&["run", "--timeout", "-5", "-c", "print(1)"], |_| {});
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_no_panic(&stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("invalid_request") && stderr.contains("--timeout"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}

#[test]
fn the_verdict_echoes_the_limits_in_force() {
    let r = run(
        "python",
        "print(1)",
        &[
            "--timeout",
            "7",
            "--memory",
            "96M",
            "--cpus",
            "0.5",
            "--pids",
            "20",
            "--disk",
            "8M",
            "--output",
            "4K",
            "--open-files",
            "64",
        ],
    );
    r.assert_ok();
    assert_eq!(
        without_io(&r.verdict["limits"]),
        serde_json::json!({
            "timeout": 7, "compile_timeout": 60, "memory": 96u64 << 20, "cpus": 0.5,
            "pids": 20, "disk": 8u64 << 20, "output": 4096, "open_files": 64, "output_files": 100,
            // The names of the previous release, kept readable for one more.
            "timeout_ms": 7000, "compile_timeout_ms": 60000, "memory_bytes": 96u64 << 20, "cpu_millis": 500,
            "disk_bytes": 8u64 << 20, "output_bytes": 4096
        })
    );
    // And they are really applied inside.
    let r = run(
        "python",
        "import os, resource\nprint(os.statvfs('/tmp').f_blocks * os.statvfs('/tmp').f_frsize)\nprint(resource.getrlimit(resource.RLIMIT_NOFILE)[0])",
        &["--disk", "8M", "--open-files", "64"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), format!("{}\n64\n", 8u64 << 20));
}

#[test]
fn defaults_are_the_documented_ones() {
    let r = run("python", "pass", &[]);
    r.assert_ok();
    assert_eq!(
        without_io(&r.verdict["limits"]),
        serde_json::json!({
            "timeout": 30, "compile_timeout": 60, "memory": 256u64 << 20, "cpus": 1,
            "pids": 64, "disk": 64u64 << 20, "output": 1u64 << 20, "open_files": 1024, "output_files": 100,
            "timeout_ms": 30000, "compile_timeout_ms": 60000, "memory_bytes": 256u64 << 20, "cpu_millis": 1000,
            "disk_bytes": 64u64 << 20, "output_bytes": 1u64 << 20
        })
    );
    assert_eq!(r.verdict["files"], serde_json::json!([]));
}

#[test]
fn stdin_dash_feeds_runcells_own_stdin() {
    let mut child = std::process::Command::new(runcell_bin())
        .args([
            "run",
            "--json",
            "--stdin",
            "-",
            "-c",
            "import sys\nprint(sys.stdin.read().upper())",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    {
        use std::io::Write;
        child
            .stdin
            .take()
            .unwrap()
            .write_all(b"piped input")
            .unwrap();
    }
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_host_clean(pid);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "PIPED INPUT\n", "{v:#}");
    assert_eq!(out.status.code(), Some(0));
}

#[test]
#[cfg_attr(
    not(all(host_node, host_ruby, host_go, host_python_stack, host_go_cache)),
    ignore = "needs every runtime and `runcell setup`"
)]
fn doctor_lists_layers_and_runtimes() {
    let out = runcell_raw(&["doctor"], |_| {});
    let text = String::from_utf8_lossy(&out.stdout);
    assert_no_panic(&String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{text}");
    for want in [
        "Isolation layers",
        "user namespaces",
        "seccomp",
        "landlock",
        "cgroups",
        "Runtimes",
        "python",
        "node",
        "ruby",
        "go",
        "bash",
        "Sandbox test",
    ] {
        assert!(text.contains(want), "doctor output lacks {want}: {text}");
    }
    assert!(!text.contains("MISSING"), "{text}");
    assert!(
        !text.contains('\x1b'),
        "no colours when stdout is not a terminal"
    );
}

#[test]
#[cfg_attr(
    not(all(host_node, host_ruby, host_go, host_python_stack, host_go_cache)),
    ignore = "needs every runtime and `runcell setup`"
)]
fn doctor_json_parses_and_reports_everything_available() {
    let out = runcell_raw(&["doctor", "--json"], |_| {});
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).expect("doctor --json prints JSON");
    let layers = v["layers"].as_array().unwrap();
    let names: Vec<&str> = layers.iter().map(|l| l["name"].as_str().unwrap()).collect();
    for want in ["user namespaces", "seccomp", "landlock", "cgroups"] {
        assert!(names.contains(&want), "{names:?}");
    }
    assert!(layers.iter().all(|l| l["available"] == true), "{v:#}");
    let runtimes = v["runtimes"].as_array().unwrap();
    let langs: Vec<&str> = runtimes
        .iter()
        .map(|r| r["language"].as_str().unwrap())
        .collect();
    assert_eq!(langs, ["python", "node", "ruby", "go", "bash"]);
    for rt in runtimes {
        assert_eq!(rt["available"], true, "{rt:#}");
        assert!(
            rt["version"].as_str().is_some_and(|s| !s.is_empty()),
            "{rt:#}"
        );
        assert!(
            rt["executable"]
                .as_str()
                .is_some_and(|p| p.starts_with('/')),
            "{rt:#}"
        );
    }
    assert_eq!(v["sandbox_test"]["ok"], true);
    assert_eq!(v["sandbox_test"]["enforcement"]["seccomp"], true);
    assert_eq!(
        v["sandbox_test"]["enforcement"]["cgroup"],
        host_cgroup_version()
    );
}

/// runcell under an address-space cap (so a bug cannot eat the host's memory), `--json`.
fn run_capped(args: &[&str]) -> Run {
    let mut argv: Vec<String> = ["prlimit", "--as=1073741824", "--"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    argv.push(runcell_bin().display().to_string());
    argv.extend(["run", "--json"].iter().map(|s| s.to_string()));
    argv.extend(args.iter().map(|s| s.to_string()));
    run_argv(&argv, |_| {})
}

#[test]
#[cfg_attr(not(host_prlimit), ignore = "needs prlimit (util-linux)")]
fn an_endless_code_file_is_refused_at_the_size_limit() {
    // /dev/zero never ends: runcell must stop reading past the 1 MiB code limit instead of
    // reading until it runs out of memory.
    let r = run_capped(&["--lang", "python", "/dev/zero"]);
    assert_invalid(&r, "1048576");
    // Refused before any sandbox is built: no time limit applies, only start-up.
    assert!(r.elapsed < LOADED_MARGIN, "{:?}", r.elapsed);
}

#[test]
#[cfg_attr(not(host_prlimit), ignore = "needs prlimit (util-linux)")]
fn an_endless_stdin_file_is_refused_at_the_size_limit() {
    let r = run_capped(&["--stdin", "/dev/zero", "-c", "print(1)"]);
    assert_invalid(&r, "16777216");
    // Refused before any sandbox is built: no time limit applies, only start-up.
    assert!(r.elapsed < LOADED_MARGIN, "{:?}", r.elapsed);
}

#[test]
#[cfg_attr(
    any(not(host_unshare), not(host_ruby), host_ruby_in_usr_local),
    ignore = "needs util-linux unshare and ruby in /usr/bin only"
)]
fn a_missing_runtime_is_runtime_unavailable_with_an_install_hint() {
    // Runtimes cannot be uninstalled for a test; instead runcell runs in a private mount
    // namespace (of its own process only) where /usr/bin/ruby is hidden under /dev/null.
    // The host's mount table is checked unchanged afterwards by the harness.
    let script = format!(
        "mount --bind /dev/null /usr/bin/ruby && exec {} run --json --lang ruby -c 'puts 1'",
        runcell_bin().display()
    );
    let argv: Vec<String> = [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let r = run_argv(&argv, |_| {});
    r.assert_category("runtime_unavailable");
    assert_eq!(r.code, Some(127), "{:#}", r.verdict);
    assert_eq!(r.exit_code(), None);
    assert_eq!(r.verdict["error"]["retryable"], false);
    assert!(
        r.message().contains("apt-get install ruby"),
        "{}",
        r.message()
    );
    // Still there for everyone else.
    assert!(std::fs::metadata("/usr/bin/ruby").unwrap().is_file());
}

/// `runcell tools --config` states the limits of the server configured by that file.
#[test]
fn tools_state_the_configured_limits() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runcell.toml");
    std::fs::write(
        &path,
        "[limits.default]\ntimeout = 10\n[limits.max]\ntimeout = \"2m\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(runcell_bin())
        .args(["tools", "--format", "anthropic", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let bash = tools
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "code_exec_bash")
        .expect("bash is always installed");
    assert_eq!(
        bash["input_schema"]["properties"]["timeout"]["maximum"],
        120
    );
    let d = bash["input_schema"]["properties"]["timeout"]["description"]
        .as_str()
        .unwrap();
    assert!(d.contains("default 10, at most 120"), "{d}");
    // A bad file is an error, not silently the defaults.
    std::fs::write(&path, "[limits.max]\ntimeot = 5\n").unwrap();
    let out = std::process::Command::new(runcell_bin())
        .args(["tools", "--config"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("timeot"));
}

/// Every limit of the request contract is reachable from the command line by its name, also
/// one without a flag of its own.
#[test]
fn any_limit_can_be_set_by_name() {
    let r = run(
        "bash",
        "true",
        &["--limit", "timeout=2500ms", "--limit", "memory=96M"],
    );
    r.assert_ok();
    assert_eq!(r.verdict["limits"]["timeout"], 2.5);
    assert_eq!(r.verdict["limits"]["memory"], 96u64 << 20);
    for (arg, want) in [
        ("frobs=1", "unknown limit 'frobs'"),
        ("timeout", "expected NAME=VALUE"),
        ("cpus=0", "positive number of cores"),
        ("memory=1T", "above the maximum"),
    ] {
        let r = run("bash", "true", &["--limit", arg]);
        r.assert_category("invalid_request");
        assert_eq!(r.code, Some(2), "{arg}");
        let message = r.verdict["error"]["message"].as_str().unwrap();
        assert!(message.contains(want), "{arg}: {message}");
    }
    for args in [
        &["--timeout", "1", "--limit", "timeout=5"][..],
        &["--limit", "timeout=1", "--limit", "timeout=5"][..],
    ] {
        let r = run("bash", "true", args);
        r.assert_category("invalid_request");
        let message = r.verdict["error"]["message"].as_str().unwrap();
        assert!(message.contains("given twice"), "{args:?}: {message}");
    }
}

/// Every process of a run may open `open_files` files: `pids × open_files` of one run reached
/// 300,000 entries of the host's file table (shared by every process on the host) before the
/// product was bounded. Each limit within its own maximum is not enough.
#[test]
fn the_host_file_table_is_not_one_runs_to_fill() {
    // (open_files within every host's hard limit: the product is what is too large.)
    let r = run("bash", "true", &["--pids", "4096", "--open-files", "4096"]);
    r.assert_category("invalid_request");
    assert_eq!(r.code, Some(2));
    let message = r.verdict["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("pids × open_files is 4096 × 4096"),
        "{message}"
    );
    // Many processes, or many files each, are fine.
    run("bash", "true", &["--pids", "512"]).assert_ok();
    run("bash", "true", &["--pids", "16", "--open-files", "16000"]).assert_ok();
}

/// A verdict's limits without the disk throughput ones, whose defaults depend on the host's
/// disk (checked on their own).
fn without_io(limits: &serde_json::Value) -> serde_json::Value {
    let mut l = limits.clone();
    let m = l.as_object_mut().unwrap();
    for k in ["io_read", "io_write"] {
        let v = m
            .remove(k)
            .unwrap_or_else(|| panic!("{k} missing from {limits}"));
        assert!(v.as_u64().unwrap() >= 1 << 20, "{k}: {v}");
    }
    l
}

/// A file whose extension runcell does not know is not run as Python.
#[test]
fn an_unknown_extension_without_lang_is_an_invalid_request() {
    let dir = tempfile::tempdir().unwrap();
    let ts = dir.path().join("a.ts");
    std::fs::write(&ts, "console.log(1)\n").unwrap();
    let r = run_args(&[ts.to_str().unwrap()], |_| {});
    assert_invalid(&r, "--lang");
    for ext in [".ts", ".py", ".js", ".rb", ".go", ".sh"] {
        assert!(r.message().contains(ext), "{ext}: {}", r.message());
    }
    // With --lang it runs.
    let r = run_args(&["--lang", "node", ts.to_str().unwrap()], |_| {});
    r.assert_ok();
    assert_eq!(r.stdout(), "1\n");
}

/// `--listen` takes a host name and a bare `:PORT` (loopback).
#[test]
fn serve_listens_on_a_host_name_or_a_bare_port() {
    use std::io::{BufRead, BufReader};
    for listen in ["localhost:0", ":0"] {
        let mut child = std::process::Command::new(runcell_bin())
            .args(["serve", "--pool", "python=0", "--listen", listen])
            .env_remove("RUNCELL_API_KEY")
            .env_remove("RUNCELL_LISTEN")
            .env_remove("RUNCELL_CONFIG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        let mut err = BufReader::new(child.stderr.take().unwrap());
        let mut found = None;
        for _ in 0..50 {
            line.clear();
            if err.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            if let Some(rest) = line.split("listening on http://").nth(1) {
                found = Some(rest.split_whitespace().next().unwrap_or("").to_string());
                break;
            }
        }
        let _ = child.kill();
        let _ = child.wait();
        let addr = found.unwrap_or_else(|| panic!("{listen}: no listening line; last: {line}"));
        assert!(addr.starts_with("127.0.0.1:"), "{listen}: {addr}");
    }
}

/// No limit is offered that the host cannot grant: more open files than the host's hard limit
/// is an invalid request, never a sandbox failure (which any client could otherwise cause).
#[test]
fn open_files_above_the_hosts_hard_limit_are_an_invalid_request() {
    let hard = runcell_core::open_files_hard_limit().expect("this host has a hard limit");
    let asked = (hard + 1).to_string();
    let r = run(
        "python",
        "print(1)",
        &["--pids", "2", "--open-files", &asked],
    );
    assert_invalid(&r, &format!("maximum of {hard}"));
    let doctor = std::process::Command::new(runcell_bin())
        .args(["doctor", "--json"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&doctor.stdout).unwrap();
    assert_eq!(v["host_limits"]["open_files_hard_limit"], hard);
    assert!(v["host_limits"]["open_files_maximum"].as_u64().unwrap() <= hard);
}

/// `--version` names the commit; `completion SHELL` prints a script for that shell.
#[test]
fn version_names_the_commit_and_completions_are_printed() {
    let out = std::process::Command::new(runcell_bin())
        .arg("--version")
        .output()
        .unwrap();
    let v = String::from_utf8_lossy(&out.stdout);
    assert!(
        v.starts_with("runcell ") && v.contains(" (") && v.trim_end().ends_with(')'),
        "{v}"
    );
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef runcell"),
        ("fish", "complete -c runcell"),
    ] {
        let out = std::process::Command::new(runcell_bin())
            .args(["completion", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        assert!(
            String::from_utf8_lossy(&out.stdout).contains(marker),
            "{shell}"
        );
    }
}
