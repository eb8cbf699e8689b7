//! Every supported language: hello world, errors, language selection (flag, alias, file
//! extension, stdin), and the key attacks repeated in each language (host files, writes to
//! system paths, host network, identity, environment, memory).

mod common;
use common::*;

use std::io::Write;
use std::net::TcpListener;
use std::process::Stdio;

const SECRET_VAR: &str = "RUNCELL_TEST_SECRET";

fn secret() -> String {
    format!("lang-secret-{}", unique_digits())
}

/// The host listener must never have seen a connection.
fn assert_no_connection(l: &TcpListener) {
    l.set_nonblocking(true).unwrap();
    assert!(
        matches!(l.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the host listener saw a connection from the sandbox"
    );
}

/// The outcomes every language's attack program must report.
fn expect_attacks(r: &Run) {
    r.assert_ok();
    r.expect(&[
        ("uid", "1000"),
        ("shadow", "ENOENT"),
        ("host_root", "ENOENT"),
        ("write_usr", "EROFS"),
        ("write_etc", "EROFS"),
        ("connect_host", "ECONNREFUSED"),
        ("secret", "absent"),
        ("hostname", "runcell"),
        ("workspace", "OK"),
    ]);
}

// ---------------------------------------------------------------------------------------------
// Python
// ---------------------------------------------------------------------------------------------

#[test]
fn python_hello_world_and_its_environment() {
    let r = run("python", "import sys, os\nprint('hello', sys.version_info[0])\nprint(sorted(k for k in os.environ if k.startswith('PYTHON') or k == 'MPLBACKEND'))", &[]);
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "hello 3\n['MPLBACKEND', 'PYTHONDONTWRITEBYTECODE', 'PYTHONUNBUFFERED']\n"
    );
    assert_eq!(r.verdict["language"], "python");
}

#[test]
fn python_exception_is_a_runtime_error_naming_it() {
    let r = run("python", "x = 1\nprint(y)", &[]);
    r.assert_category("runtime_error");
    assert_eq!(r.exit_code(), Some(1));
    assert!(
        r.message().contains("NameError: name 'y' is not defined"),
        "{}",
        r.message()
    );
    assert!(r.stderr_out().contains("Traceback"));
}

#[test]
fn python_subprocesses_work() {
    let r = run(
        "python",
        "import subprocess\nprint(subprocess.run(['echo', 'child'], capture_output=True, text=True).stdout.strip())\nprint(subprocess.call(['false']))",
        &["--timeout", "10"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "child\n1\n");
}

#[test]
fn python_attacks() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = secret();
    let r = run_with(
        "python",
        &py(&format!(
            r#"
print("uid=%d" % os.getuid())
read("shadow", "/etc/shadow")
attempt("host_root", lambda: os.listdir("/root"))
write("write_usr", "/usr/pwned")
write("write_etc", "/etc/pwned")
attempt("connect_host", lambda: socket.create_connection(("127.0.0.1", {port}), timeout=3))
print("secret=" + ("present" if "{SECRET_VAR}" in os.environ else "absent"))
print("hostname=" + socket.gethostname())
write("workspace", "/workspace/out.txt")
"#
        )),
        &[],
        |c| {
            c.env(SECRET_VAR, &s);
        },
    );
    expect_attacks(&r);
    assert_no_connection(&l);
    assert_not_on_host("/usr/pwned");
    assert_not_on_host("/etc/pwned");
}

// ---------------------------------------------------------------------------------------------
// Node
// ---------------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(host_node), ignore = "needs node on this host")]
fn node_hello_world() {
    let r = run("node", "console.log('hello', 6 * 7)", &[]);
    r.assert_ok();
    assert_eq!(r.stdout(), "hello 42\n");
    assert_eq!(r.verdict["language"], "node");
}

#[test]
#[cfg_attr(not(host_node), ignore = "needs node on this host")]
fn javascript_is_an_alias_of_node() {
    for alias in ["javascript", "js", "nodejs"] {
        let r = run(alias, "console.log(typeof process.versions.node)", &[]);
        r.assert_ok();
        assert_eq!(r.stdout(), "string\n");
        assert_eq!(r.verdict["language"], "node", "{alias}");
    }
}

#[test]
#[cfg_attr(not(host_node), ignore = "needs node on this host")]
fn node_exception_is_a_runtime_error() {
    let r = run("node", "throw new TypeError('bad thing')", &[]);
    r.assert_category("runtime_error");
    assert_eq!(r.exit_code(), Some(1));
    assert!(
        r.stderr_out().contains("TypeError: bad thing"),
        "{:#}",
        r.verdict
    );
}

#[test]
#[cfg_attr(not(host_node), ignore = "needs node on this host")]
fn node_attacks() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = secret();
    let code = format!(
        r#"
const fs = require("fs"), net = require("net"), os = require("os");
const attempt = (label, f) => {{ try {{ f(); console.log(label + "=OK"); }} catch (e) {{ console.log(label + "=" + e.code); }} }};
console.log("uid=" + process.getuid());
attempt("shadow", () => fs.readFileSync("/etc/shadow"));
attempt("host_root", () => fs.readdirSync("/root"));
attempt("write_usr", () => fs.writeFileSync("/usr/pwned", "x"));
attempt("write_etc", () => fs.writeFileSync("/etc/pwned", "x"));
console.log("secret=" + ("{SECRET_VAR}" in process.env ? "present" : "absent"));
console.log("hostname=" + os.hostname());
attempt("workspace", () => fs.writeFileSync("/workspace/out.txt", "x"));
try {{ require("child_process").execFileSync("unshare", ["-r", "true"], {{stdio: "pipe"}}); console.log("spawn_unshare=OK"); }}
catch (e) {{ console.log("spawn_unshare=exit" + e.status + ":" + /not permitted/.test(String(e.stderr))); }}
const sock = net.connect({port}, "127.0.0.1");
sock.on("connect", () => {{ console.log("connect_host=OK"); sock.destroy(); }});
sock.on("error", (e) => console.log("connect_host=" + e.code));
"#
    );
    let r = run_with("node", &code, &["--timeout", "10"], |c| {
        c.env(SECRET_VAR, &s);
    });
    expect_attacks(&r);
    // `unshare -r` fails with "Operation not permitted" and exit status 1.
    assert_eq!(r.out("spawn_unshare"), "exit1:true", "{:#}", r.verdict);
    assert!(r.stderr_out().is_empty() || !r.stderr_out().contains(&s));
    assert_no_connection(&l);
    assert_not_on_host("/usr/pwned");
}

#[test]
#[cfg_attr(not(host_node), ignore = "needs node on this host")]
fn node_memory_bomb_hits_the_memory_limit() {
    let r = run(
        "node",
        "const a = []; while (true) { a.push(Buffer.alloc(1 << 20, 1)); }",
        &["--memory", "64M", "--timeout", "20"],
    );
    r.assert_category("memory_limit");
    assert_eq!(r.exit_code(), Some(137));
}

// ---------------------------------------------------------------------------------------------
// Ruby
// ---------------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn ruby_hello_world() {
    let r = run("ruby", "puts \"hello #{6 * 7}\"", &[]);
    r.assert_ok();
    assert_eq!(r.stdout(), "hello 42\n");
    assert_eq!(r.verdict["language"], "ruby");
}

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn ruby_exception_is_a_runtime_error() {
    let r = run("ruby", "raise ArgumentError, 'bad thing'", &[]);
    r.assert_category("runtime_error");
    assert_eq!(r.exit_code(), Some(1));
    assert!(r.message().contains("bad thing"), "{}", r.message());
}

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn ruby_attacks() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = secret();
    let code = format!(
        r##"
require "socket"
def attempt(label)
  yield
  puts "#{{label}}=OK"
rescue SystemCallError => e
  puts "#{{label}}=#{{e.class.name.split('::').last}}"
end
puts "uid=#{{Process.uid}}"
attempt("shadow") {{ File.read("/etc/shadow") }}
attempt("host_root") {{ Dir.children("/root") }}
attempt("write_usr") {{ File.write("/usr/pwned", "x") }}
attempt("write_etc") {{ File.write("/etc/pwned", "x") }}
attempt("connect_host") {{ TCPSocket.new("127.0.0.1", {port}) }}
puts "secret=#{{ENV.key?("{SECRET_VAR}") ? "present" : "absent"}}"
puts "hostname=#{{Socket.gethostname}}"
attempt("workspace") {{ File.write("/workspace/out.txt", "x") }}
attempt("ptrace") {{ Process.kill(:KILL, 1) }}
"##
    );
    let r = run_with("ruby", &code, &[], |c| {
        c.env(SECRET_VAR, &s);
    });
    expect_attacks(&r);
    assert!(matches!(r.out("ptrace").as_str(), "EPERM" | "OK"));
    assert_no_connection(&l);
    assert_not_on_host("/usr/pwned");
}

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn ruby_memory_bomb_hits_the_memory_limit() {
    let r = run(
        "ruby",
        "s = 'x' * 1024\nloop { s << s }",
        &["--memory", "64M", "--timeout", "20"],
    );
    r.assert_category("memory_limit");
    assert_eq!(r.exit_code(), Some(137));
}

// ---------------------------------------------------------------------------------------------
// Bash
// ---------------------------------------------------------------------------------------------

#[test]
fn bash_hello_world_with_pipes_and_children() {
    let r = run(
        "bash",
        "echo hello | tr a-z A-Z\nx=$(seq 3 | wc -l)\necho \"lines=$x\"",
        &["--timeout", "10"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "HELLO\nlines=3\n");
    assert_eq!(r.verdict["language"], "bash");
}

#[test]
fn bash_exit_code_is_kept() {
    let r = run("bash", "echo out\nexit 7", &["--timeout", "10"]);
    r.assert_category("runtime_error");
    assert_eq!(r.exit_code(), Some(7));
    assert_eq!(r.code, Some(7));
}

#[test]
fn bash_attacks() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = secret();
    // Builtins and redirections report strerror; map the few we expect to errno names.
    let code = format!(
        r#"
name() {{
  case "$1" in
    *"No such file or directory"*) echo ENOENT ;;
    *"Read-only file system"*) echo EROFS ;;
    *"Connection refused"*) echo ECONNREFUSED ;;
    *"Permission denied"*) echo EACCES ;;
    *"Operation not permitted"*) echo EPERM ;;
    *) echo "OTHER:$1" ;;
  esac
}}
try() {{
  local label=$1; shift
  if "$@" 2>/tmp/err; then echo "$label=OK"; else echo "$label=$(name "$(cat /tmp/err)")"; fi
}}
echo "uid=$(id -u)"
try shadow cat /etc/shadow
try host_root ls /root
try write_usr touch /usr/pwned
try write_etc touch /etc/pwned
try connect_host bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'
if [ -n "${{{SECRET_VAR}+set}}" ]; then echo secret=present; else echo secret=absent; fi
echo "hostname=$(hostname)"
try workspace touch /workspace/out.txt
try unshare unshare -r true
try mount mount -t tmpfs none /mnt
"#
    );
    let r = run_with("bash", &code, &["--timeout", "10"], |c| {
        c.env(SECRET_VAR, &s);
    });
    expect_attacks(&r);
    assert_eq!(r.out("unshare"), "EPERM", "{:#}", r.verdict);
    assert_ne!(r.out("mount"), "OK");
    assert_no_connection(&l);
    assert_not_on_host("/usr/pwned");
}

// ---------------------------------------------------------------------------------------------
// Go
// ---------------------------------------------------------------------------------------------

#[test]
#[cfg_attr(not(host_go), ignore = "needs go on this host")]
fn go_hello_world_reports_compile_time() {
    let r = run(
        "go",
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(\"hello\", 6*7) }\n",
        &["--timeout", "20"],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "hello 42\n");
    assert_eq!(r.verdict["language"], "go");
    assert!(
        r.verdict["compile_time"].as_f64().is_some_and(|t| t > 0.0),
        "{:#}",
        r.verdict
    );
}

#[test]
#[cfg_attr(not(host_go), ignore = "needs go on this host")]
fn go_compile_error_is_a_compile_error_with_the_compiler_message() {
    let r = run(
        "go",
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Printn(\"x\") }\n",
        &[],
    );
    r.assert_category("compile_error");
    assert!(r.message().contains("undefined"), "{}", r.message());
    assert!(r.message().contains("main.go:5"), "{}", r.message());
    assert_ne!(r.exit_code(), Some(0));
    // runcell's own status says "did not compile", apart from an invalid request's 2.
    assert_eq!(r.code, Some(65));
    assert_eq!(r.stdout(), "");
    // The human summary gives the compile time, not the (zero) run time.
    let out = std::process::Command::new(runcell_bin())
        .args(["run", "--lang", "go", "-c"])
        .arg("package main\n\nfunc main() { x }\n")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(65));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("of compiling") && !err.contains("after 0.000 s"),
        "{err}"
    );
}

#[test]
#[cfg_attr(not(host_go), ignore = "needs go on this host")]
fn go_panic_is_a_runtime_error_with_exit_code_2() {
    let r = run(
        "go",
        "package main\n\nfunc main() { panic(\"boom\") }\n",
        &[],
    );
    r.assert_category("runtime_error");
    assert_eq!(r.exit_code(), Some(2));
    assert_eq!(r.code, Some(2));
    assert!(r.stderr_out().contains("panic: boom"), "{:#}", r.verdict);
}

#[test]
#[cfg_attr(not(host_go), ignore = "needs go on this host")]
fn go_compile_timeout_is_enforced() {
    let r = run(
        "go",
        "package main\n\nimport \"fmt\"\n\nfunc main() { fmt.Println(1) }\n",
        &["--compile-timeout", "100ms"],
    );
    r.assert_category("timeout");
    assert_eq!(r.exit_code(), Some(124));
    assert!(
        r.message().to_lowercase().contains("compil"),
        "{}",
        r.message()
    );
}

#[test]
#[cfg_attr(not(host_go), ignore = "needs go on this host")]
fn go_attacks() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let s = secret();
    let code = format!(
        r#"package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
)

func name(err error) string {{
	if err == nil {{
		return "OK"
	}}
	for _, e := range []syscall.Errno{{syscall.ENOENT, syscall.EROFS, syscall.EPERM, syscall.EACCES, syscall.ECONNREFUSED, syscall.ENOSYS, syscall.EINVAL}} {{
		if errors.Is(err, e) {{
			switch e {{
			case syscall.ENOENT:
				return "ENOENT"
			case syscall.EROFS:
				return "EROFS"
			case syscall.EPERM:
				return "EPERM"
			case syscall.EACCES:
				return "EACCES"
			case syscall.ECONNREFUSED:
				return "ECONNREFUSED"
			case syscall.ENOSYS:
				return "ENOSYS"
			case syscall.EINVAL:
				return "EINVAL"
			}}
		}}
	}}
	return "OTHER:" + err.Error()
}}

func main() {{
	fmt.Printf("uid=%d\n", os.Getuid())
	_, err := os.ReadFile("/etc/shadow")
	fmt.Println("shadow=" + name(err))
	_, err = os.ReadDir("/root")
	fmt.Println("host_root=" + name(err))
	fmt.Println("write_usr=" + name(os.WriteFile("/usr/pwned", []byte("x"), 0o644)))
	fmt.Println("write_etc=" + name(os.WriteFile("/etc/pwned", []byte("x"), 0o644)))
	_, err = net.Dial("tcp", "127.0.0.1:{port}")
	fmt.Println("connect_host=" + name(err))
	if _, ok := os.LookupEnv("{SECRET_VAR}"); ok {{
		fmt.Println("secret=present")
	}} else {{
		fmt.Println("secret=absent")
	}}
	h, _ := os.Hostname()
	fmt.Println("hostname=" + h)
	fmt.Println("workspace=" + name(os.WriteFile("/workspace/out.txt", []byte("x"), 0o644)))
	fmt.Println("mount=" + name(syscall.Mount("none", "/tmp", "tmpfs", 0, "")))
	fmt.Println("unshare=" + name(syscall.Unshare(syscall.CLONE_NEWUSER)))
	fmt.Println("setuid0=" + name(syscall.Setuid(0)))
	_, _, e := syscall.RawSyscall(syscall.SYS_PTRACE, syscall.PTRACE_ATTACH, 1, 0)
	fmt.Println("ptrace=" + name(e))
	fmt.Println("chroot=" + name(syscall.Chroot("/tmp")))
}}
"#
    );
    let r = run_with("go", &code, &["--timeout", "20"], |c| {
        c.env(SECRET_VAR, &s);
    });
    expect_attacks(&r);
    r.expect(&[
        ("mount", "EPERM"),
        ("unshare", "EPERM"),
        ("ptrace", "EPERM"),
        ("chroot", "EPERM"),
    ]);
    // Go's Setuid goes through all threads; uid 0 is unmapped.
    assert!(
        matches!(r.out("setuid0").as_str(), "EINVAL" | "EPERM"),
        "{}",
        r.out("setuid0")
    );
    assert_no_connection(&l);
    assert_not_on_host("/usr/pwned");
}

// ---------------------------------------------------------------------------------------------
// Choosing the language
// ---------------------------------------------------------------------------------------------

fn run_file(name: &str, content: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    run_args(&["--timeout", "20", path.to_str().unwrap()], |_| {})
}

#[test]
#[cfg_attr(
    not(all(host_node, host_ruby, host_go)),
    ignore = "needs node, ruby and go on this host"
)]
fn the_language_is_inferred_from_the_file_extension() {
    let cases = [
        ("main.rb", "puts RUBY_ENGINE", "ruby", "ruby\n"),
        (
            "main.py",
            "import sys; print(sys.implementation.name)",
            "python",
            "cpython\n",
        ),
        (
            "main.js",
            "console.log(typeof require)",
            "node",
            "function\n",
        ),
        (
            "main.mjs",
            "console.log(typeof process)",
            "node",
            "object\n",
        ),
        ("main.sh", "echo $BASH_VERSINFO | cut -c1", "bash", "5\n"),
        (
            "main.go",
            "package main\nimport \"fmt\"\nfunc main() { fmt.Println(\"go\") }\n",
            "go",
            "go\n",
        ),
    ];
    for (file, code, lang, out) in cases {
        let r = run_file(file, code);
        r.assert_ok();
        assert_eq!(r.verdict["language"], lang, "{file}");
        assert_eq!(r.stdout(), out, "{file}");
    }
}

#[test]
fn an_unknown_extension_is_refused_and_no_extension_is_python() {
    // An extension runcell does not know is not guessed to be Python (issue 14).
    let r = run_file("script.txt", "print('py')");
    r.assert_category("invalid_request");
    assert!(r.message().contains("--lang"), "{}", r.message());
    // A file without any extension is still Python.
    let r = run_file("script", "print('py')");
    r.assert_ok();
    assert_eq!(r.verdict["language"], "python");
    assert_eq!(r.stdout(), "py\n");
}

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn lang_flag_overrides_the_extension() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("main.py");
    std::fs::write(&path, "puts 'ruby wins'").unwrap();
    let r = run_args(&["--lang", "ruby", path.to_str().unwrap()], |_| {});
    r.assert_ok();
    assert_eq!(r.stdout(), "ruby wins\n");
}

#[test]
#[cfg_attr(not(host_ruby), ignore = "needs ruby on this host")]
fn dash_reads_the_code_from_stdin() {
    let mut child = std::process::Command::new(runcell_bin())
        .args(["run", "--json", "--lang", "ruby", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"puts 'from stdin'")
        .unwrap();
    let pid = child.id();
    let out = child.wait_with_output().unwrap();
    assert_host_clean(pid);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["stdout"], "from stdin\n", "{v:#}");
    assert_eq!(v["language"], "ruby");
    assert_eq!(out.status.code(), Some(0));
}
