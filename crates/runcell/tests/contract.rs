//! The request contract of every front end, pinned as tables: which requests HTTP
//! (`POST /v1/execute`), MCP (`runcell mcp`, `tools/call`), the CLI (`runcell run --json`) and
//! the TOML configuration (`runcell tools|serve --config`) accept, and how they refuse the
//! others (status or exit code, error category, the `limit` named, a word of the message).
//!
//! Black box on purpose: only the built binary is driven, never a crate's Rust API, so the
//! same table holds before and after the request types are rewritten (issue 9), and proves
//! that a request accepted or refused today is accepted or refused the same way.
//!
//! What is pinned, and what is left free:
//! * status, exit code and `error.category` exactly;
//! * `error.limit` where today's answer has one (a row without it does not assert its
//!   absence: naming the limit in more refusals is an improvement, not a change of contract);
//! * a word the message must contain (the field, the offending value), never the wording;
//! * the verdict's `limits` keys of today (`timeout_ms`, `memory_bytes`, `cpu_millis`, ...)
//!   and their values: the rewrite adds human names beside them, so the old keys are checked
//!   present, not that the key set is exactly this.
//!
//! Accepted rows run `true` in bash (a few milliseconds each), so the whole file takes
//! seconds.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use common::{assert_no_panic, runcell_bin, ServeProcess};
use serde_json::{json, Value};

/// The verdict's `limits` keys of today, each of which must stay readable.
const OLD_LIMIT_KEYS: [&str; 8] = [
    "timeout_ms",
    "compile_timeout_ms",
    "memory_bytes",
    "cpu_millis",
    "pids",
    "disk_bytes",
    "output_bytes",
    "open_files",
];

/// The documented defaults, as the verdict reports them under the old names.
const DEFAULT_LIMITS: [(&str, u64); 8] = [
    ("timeout_ms", 30_000),
    ("compile_timeout_ms", 60_000),
    ("memory_bytes", 256 << 20),
    ("cpu_millis", 1000),
    ("pids", 64),
    ("disk_bytes", 64 << 20),
    ("output_bytes", 1 << 20),
    ("open_files", 1024),
];

/// How long one answer may take before the test gives up: hang protection for a loaded
/// 2-core machine, not an assertion on speed (every accepted row runs `true`).
const ANSWER_WITHIN: Duration = Duration::from_secs(60);

/// What a row expects.
enum Expect {
    /// Accepted and run: the verdict's `limits` has these old-name values (plus every old key).
    Ok(&'static [(&'static str, u64)]),
    /// Accepted and run, and stdout is exactly this.
    Stdout(&'static str),
    /// Refused as `invalid_request`, naming `limit` when Some, the message containing every
    /// word of `mentions`.
    Refused {
        limit: Option<&'static str>,
        mentions: &'static [&'static str],
    },
}

use Expect::{Ok as Accepted, Refused, Stdout};

const fn refused(mentions: &'static [&'static str]) -> Expect {
    Refused {
        limit: None,
        mentions,
    }
}

const fn refused_limit(limit: &'static str, mentions: &'static [&'static str]) -> Expect {
    Refused {
        limit: Some(limit),
        mentions,
    }
}

/// The verdict's `limits` has every old key, and `expected` values for some of them.
fn assert_old_limit_names(limits: &Value, expected: &[(&str, u64)], row: &str) {
    for key in OLD_LIMIT_KEYS {
        assert!(
            limits[key].is_u64(),
            "{row}: the verdict's limits lost `{key}`: {limits}"
        );
    }
    for (key, value) in expected {
        assert_eq!(limits[*key], *value, "{row}: limits.{key} in {limits}");
    }
}

fn assert_mentions(message: &str, mentions: &[&str], row: &str) {
    for word in mentions {
        assert!(
            message.contains(word),
            "{row}: the message should name {word:?}: {message}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// HTTP: POST /v1/execute
// ---------------------------------------------------------------------------------------------

/// A body with `language: bash`, `code: true` and `extra` merged in (a null in `extra` is kept
/// as an explicit null).
fn bash_true(extra: Value) -> Value {
    let mut body = json!({"language": "bash", "code": "true"});
    for (k, v) in extra.as_object().expect("an object").clone() {
        body[k] = v;
    }
    body
}

fn file_body(files: Value) -> Value {
    bash_true(json!({ "files": files }))
}

fn http_rows() -> Vec<(&'static str, Value, Expect)> {
    vec![
        // --- accepted -------------------------------------------------------------------------
        (
            "no limits: the defaults",
            bash_true(json!({})),
            Accepted(&DEFAULT_LIMITS),
        ),
        (
            "timeout as a number of seconds",
            bash_true(json!({"timeout": 2.5})),
            Accepted(&[("timeout_ms", 2500)]),
        ),
        (
            "timeout as an integer",
            bash_true(json!({"timeout": 5})),
            Accepted(&[("timeout_ms", 5000)]),
        ),
        (
            "timeout with a unit",
            bash_true(json!({"timeout": "500ms"})),
            Accepted(&[("timeout_ms", 500)]),
        ),
        (
            "memory with a unit",
            bash_true(json!({"memory": "128M"})),
            Accepted(&[("memory_bytes", 128 << 20)]),
        ),
        (
            "memory with a unit after a space",
            bash_true(json!({"memory": "128 M"})),
            Accepted(&[("memory_bytes", 128 << 20)]),
        ),
        (
            "memory in bytes",
            bash_true(json!({"memory": 134_217_728})),
            Accepted(&[("memory_bytes", 128 << 20)]),
        ),
        (
            "cpus, pids, open_files, compile_timeout",
            bash_true(json!({"cpus": 0.5, "pids": 8, "open_files": 64, "compile_timeout": "90s"})),
            Accepted(&[
                ("cpu_millis", 500),
                ("pids", 8),
                ("open_files", 64),
                ("compile_timeout_ms", 90_000),
            ]),
        ),
        (
            "disk and output with units",
            bash_true(json!({"disk": "8M", "output": "1K"})),
            Accepted(&[("disk_bytes", 8 << 20), ("output_bytes", 1024)]),
        ),
        (
            "null limits are the defaults",
            bash_true(json!({"timeout": null, "memory": null, "cpus": null})),
            Accepted(&[
                ("timeout_ms", 30_000),
                ("memory_bytes", 256 << 20),
                ("cpu_millis", 1000),
            ]),
        ),
        (
            "stdin",
            json!({"language": "bash", "code": "cat", "stdin": "hi"}),
            Stdout("hi"),
        ),
        (
            "files with content and content_base64",
            json!({"language": "bash", "code": "cat a.txt d/b.bin",
                   "files": [{"path": "a.txt", "content": "x"},
                             {"path": "d/b.bin", "content_base64": "eXo="}]}),
            Stdout("xyz"),
        ),
        (
            "javascript is node",
            json!({"language": "javascript", "code": "console.log(1)"}),
            Stdout("1\n"),
        ),
        (
            "env",
            json!({"language": "bash", "code": "echo $GREETING", "env": {"GREETING": "hi"}}),
            Stdout("hi\n"),
        ),
        // --- refused: the shape of the body -----------------------------------------------------
        (
            "missing code",
            json!({"language": "bash"}),
            refused(&["code"]),
        ),
        (
            "missing language",
            json!({"code": "true"}),
            refused(&["language"]),
        ),
        (
            "unknown field",
            bash_true(json!({"timeot": 1})),
            refused(&["timeot"]),
        ),
        (
            "language not a string",
            json!({"language": 1, "code": "true"}),
            refused(&[]),
        ),
        (
            "unknown language",
            json!({"language": "cobol", "code": "true"}),
            refused(&["cobol"]),
        ),
        // --- refused: limit values that are not values --------------------------------------------
        (
            "negative timeout",
            bash_true(json!({"timeout": -1})),
            refused(&["timeout"]),
        ),
        (
            "timeout without a number",
            bash_true(json!({"timeout": "soon"})),
            refused(&["timeout", "soon"]),
        ),
        (
            "timeout as an array",
            bash_true(json!({"timeout": [1]})),
            refused(&["timeout"]),
        ),
        (
            "memory with an unknown unit",
            bash_true(json!({"memory": "12 parsecs"})),
            refused(&["memory", "parsecs"]),
        ),
        (
            "fractional memory bytes",
            bash_true(json!({"memory": 1.5})),
            refused(&["memory"]),
        ),
        (
            "negative memory",
            bash_true(json!({"memory": -5})),
            refused(&["memory"]),
        ),
        (
            "zero cpus",
            bash_true(json!({"cpus": 0})),
            refused(&["cpus"]),
        ),
        (
            "cpus as a string",
            bash_true(json!({"cpus": "2"})),
            refused(&[]),
        ),
        (
            "negative pids",
            bash_true(json!({"pids": -1})),
            refused(&["-1"]),
        ),
        // --- refused: limits outside the operator's range ------------------------------------------
        (
            "memory above the maximum",
            bash_true(json!({"memory": "1T"})),
            refused_limit("memory", &["memory"]),
        ),
        (
            "timeout above the maximum",
            bash_true(json!({"timeout": 1e12})),
            refused_limit("timeout", &["timeout"]),
        ),
        (
            "compile_timeout above the maximum",
            bash_true(json!({"compile_timeout": "2h"})),
            refused_limit("compile_timeout", &["compile_timeout"]),
        ),
        (
            "cpus above the maximum",
            bash_true(json!({"cpus": 4096})),
            refused_limit("cpus", &["cpus"]),
        ),
        (
            "pids above the maximum",
            bash_true(json!({"pids": 100_000})),
            refused_limit("pids", &["pids"]),
        ),
        (
            "timeout below the minimum",
            bash_true(json!({"timeout": 0})),
            refused_limit("timeout", &["timeout"]),
        ),
        (
            "memory below the minimum (1 MiB)",
            bash_true(json!({"memory": 1_048_576})),
            refused_limit("memory", &["memory"]),
        ),
        (
            "open_files below the minimum",
            bash_true(json!({"open_files": 0})),
            refused_limit("open_files", &["open_files"]),
        ),
        // --- refused: caps and files --------------------------------------------------------------
        (
            "code above the 1 MiB cap",
            json!({"language": "bash", "code": "#".repeat((1 << 20) + 1)}),
            refused(&["code"]),
        ),
        (
            "a file with `contents`",
            file_body(json!([{"path": "a", "contents": "x"}])),
            refused(&["contents"]),
        ),
        (
            "a file that is also a directory",
            file_body(json!([{"path": "a", "content": "x"}, {"path": "a/b", "content": "y"}])),
            refused(&["a/b"]),
        ),
        (
            "an absolute file path",
            file_body(json!([{"path": "/etc/x", "content": "x"}])),
            refused(&["/etc/x"]),
        ),
        (
            "a file path that leaves the workspace",
            file_body(json!([{"path": "../x", "content": "x"}])),
            refused(&["../x"]),
        ),
        (
            "both content and content_base64",
            file_body(json!([{"path": "x", "content": "x", "content_base64": "eA=="}])),
            refused(&["content_base64"]),
        ),
        (
            "neither content nor content_base64",
            file_body(json!([{"path": "x"}])),
            refused(&["content"]),
        ),
        (
            "bad base64",
            file_body(json!([{"path": "x", "content_base64": "!!!"}])),
            refused(&["base64"]),
        ),
        (
            "env naming a variable runcell sets",
            bash_true(json!({"env": {"PATH": "/x"}})),
            refused(&["PATH"]),
        ),
        (
            "env with a name that is not one",
            bash_true(json!({"env": {"1X": "y"}})),
            refused(&["1X"]),
        ),
        (
            "env not an object",
            bash_true(json!({"env": ["A=1"]})),
            refused(&["expected a map"]),
        ),
    ]
}

fn http_client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(ANSWER_WITHIN)
        .build()
        .unwrap()
}

fn post(client: &reqwest::blocking::Client, url: &str, body: String) -> (u16, Value) {
    let res = client
        .post(url)
        .header("content-type", "application/json")
        .body(body)
        .send()
        .expect("POST /v1/execute");
    let status = res.status().as_u16();
    let text = res.text().unwrap();
    let v = serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("not JSON ({e}), status {status}: {text}"));
    (status, v)
}

#[test]
fn http_execute_accepts_and_refuses_as_pinned() {
    let server = ServeProcess::start(&[], &[]);
    let client = http_client();
    let url = server.url("/v1/execute");
    let mut rows: Vec<(&str, String, Expect)> = http_rows()
        .into_iter()
        .map(|(name, body, expect)| (name, body.to_string(), expect))
        .collect();
    rows.push((
        "malformed JSON",
        r#"{"language": "bash", "code": "#.to_string(),
        refused(&["JSON"]),
    ));
    for (row, body, expect) in rows {
        let (status, v) = post(&client, &url, body);
        match expect {
            Accepted(limits) => {
                assert_eq!(status, 200, "{row}: {v}");
                assert_eq!(v["error"], Value::Null, "{row}: {v}");
                assert_old_limit_names(&v["limits"], limits, row);
            }
            Stdout(out) => {
                assert_eq!(status, 200, "{row}: {v}");
                assert_eq!(v["error"], Value::Null, "{row}: {v}");
                assert_eq!(v["stdout"], out, "{row}: {v}");
            }
            Refused { limit, mentions } => {
                assert_eq!(status, 400, "{row}: {v}");
                let e = &v["error"];
                assert_eq!(e["category"], "invalid_request", "{row}: {v}");
                if let Some(limit) = limit {
                    assert_eq!(e["limit"], limit, "{row}: {v}");
                }
                assert_mentions(e["message"].as_str().unwrap_or_default(), mentions, row);
            }
        }
    }
}

#[test]
fn http_runtimes_state_the_limits_under_the_old_names() {
    let server = ServeProcess::start(&[], &[]);
    let res = http_client()
        .get(server.url("/v1/runtimes"))
        .send()
        .expect("GET /v1/runtimes");
    assert_eq!(res.status().as_u16(), 200);
    let v: Value = res.json().unwrap();
    assert_old_limit_names(&v["limits"]["default"], &DEFAULT_LIMITS, "limits.default");
    assert_old_limit_names(
        &v["limits"]["maximum"],
        &[("timeout_ms", 3_600_000), ("pids", 4096)],
        "limits.maximum",
    );
    assert_old_limit_names(&v["policy"]["defaults"], &DEFAULT_LIMITS, "policy.defaults");
    assert_old_limit_names(&v["policy"]["max"], &[], "policy.max");
}

// ---------------------------------------------------------------------------------------------
// MCP over stdio: tools/call code_exec_bash
// ---------------------------------------------------------------------------------------------

/// `runcell mcp ARGS` with a JSON-RPC session initialized.
struct McpStdio {
    child: std::process::Child,
    stdin: Option<std::process::ChildStdin>,
    lines: mpsc::Receiver<String>,
    next_id: u64,
}

impl McpStdio {
    fn start(args: &[&str]) -> McpStdio {
        McpStdio::start_with(args, &[])
    }

    /// With these environment variables (settings such as RUNCELL_ALLOW_NET).
    fn start_with(args: &[&str], env: &[(&str, &str)]) -> McpStdio {
        let mut child = Command::new(runcell_bin())
            .arg("mcp")
            .args(args)
            .env_remove("RUNCELL_CONFIG")
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start runcell mcp");
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut s = McpStdio {
            child,
            stdin,
            lines,
            next_id: 1,
        };
        s.request(
            "initialize",
            json!({"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "contract", "version": "1"}}),
        );
        s.send(json!({"jsonrpc": "2.0", "method": "notifications/initialized"}));
        s
    }

    fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().unwrap();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
    }

    /// The JSON-RPC response (with `result` or `error`) to one request.
    fn request(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
        loop {
            let line = self
                .lines
                .recv_timeout(ANSWER_WITHIN)
                .unwrap_or_else(|_| panic!("runcell mcp did not answer {method} #{id}"));
            let msg: Value = serde_json::from_str(&line).expect("a JSON-RPC line");
            if msg["id"] == id {
                return msg;
            }
        }
    }

    fn call(&mut self, tool: &str, arguments: Value) -> Value {
        self.request("tools/call", json!({"name": tool, "arguments": arguments}))
    }
}

impl Drop for McpStdio {
    fn drop(&mut self) {
        // Closing stdin ends the server; kill it only if it does not go.
        drop(self.stdin.take());
        let deadline = std::time::Instant::now() + ANSWER_WITHIN;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mcp_rows() -> Vec<(&'static str, Value, Expect)> {
    let files = |f: Value| json!({"code": "true", "files": f});
    vec![
        // --- accepted -------------------------------------------------------------------------
        (
            "code only",
            json!({"code": "true"}),
            Accepted(&DEFAULT_LIMITS),
        ),
        (
            "code and a timeout",
            json!({"code": "true", "timeout": 5}),
            Accepted(&[("timeout_ms", 5000)]),
        ),
        (
            "a fractional timeout",
            json!({"code": "true", "timeout": 2.5}),
            Accepted(&[("timeout_ms", 2500)]),
        ),
        (
            "a null timeout",
            json!({"code": "true", "timeout": null}),
            Accepted(&[("timeout_ms", 30_000)]),
        ),
        (
            "files with content and content_base64",
            json!({"code": "cat a.txt d/b.bin",
                   "files": [{"path": "a.txt", "content": "x"},
                             {"path": "d/b.bin", "content_base64": "eXo="}]}),
            Stdout("xyz"),
        ),
        // --- refused ----------------------------------------------------------------------------
        ("missing code", json!({}), refused(&["code"])),
        ("code not a string", json!({"code": 1}), refused(&["code"])),
        (
            "an argument the tool does not take",
            json!({"code": "true", "memory": "128M"}),
            refused(&["memory"]),
        ),
        (
            "a zero timeout",
            json!({"code": "true", "timeout": 0}),
            refused(&["timeout"]),
        ),
        (
            "a negative timeout",
            json!({"code": "true", "timeout": -1}),
            refused(&["timeout"]),
        ),
        (
            "a timeout above the maximum",
            json!({"code": "true", "timeout": 7200}),
            refused(&["timeout"]),
        ),
        (
            "a huge timeout",
            json!({"code": "true", "timeout": 1e12}),
            refused(&["timeout"]),
        ),
        (
            "a timeout with a unit",
            json!({"code": "true", "timeout": "10s"}),
            refused(&["10s"]),
        ),
        (
            "an absolute file path",
            files(json!([{"path": "/etc/x", "content": "x"}])),
            refused(&["/etc/x"]),
        ),
        (
            "a file path that leaves the workspace",
            files(json!([{"path": "../x", "content": "x"}])),
            refused(&["../x"]),
        ),
        (
            "a file that is also a directory",
            files(json!([{"path": "a", "content": "x"}, {"path": "a/b", "content": "y"}])),
            refused(&["a/b"]),
        ),
        (
            "both content and content_base64",
            files(json!([{"path": "x", "content": "x", "content_base64": "eA=="}])),
            refused(&["content_base64"]),
        ),
        (
            "bad base64",
            files(json!([{"path": "x", "content_base64": "!!!"}])),
            refused(&["base64"]),
        ),
        (
            "a file with `contents`",
            files(json!([{"path": "x", "contents": "x"}])),
            refused(&["contents"]),
        ),
    ]
}

/// One tools/call answer checked against its row.
fn check_mcp_row(row: &str, msg: &Value, expect: &Expect) {
    let result = &msg["result"];
    assert!(result.is_object(), "{row}: a result, not an error: {msg}");
    let text = result["content"][0]["text"].as_str().unwrap_or_default();
    let verdict = &result["structuredContent"];
    match expect {
        Accepted(limits) => {
            assert_eq!(result["isError"], false, "{row}: {result}");
            assert_old_limit_names(&verdict["limits"], limits, row);
        }
        Stdout(out) => {
            assert_eq!(result["isError"], false, "{row}: {result}");
            assert_eq!(verdict["stdout"], *out, "{row}: {result}");
        }
        Refused { mentions, .. } => {
            assert_eq!(result["isError"], true, "{row}: {result}");
            assert!(text.contains("invalid_request"), "{row}: {text}");
            assert_eq!(
                verdict["error"]["category"], "invalid_request",
                "{row}: {result}"
            );
            assert_mentions(text, mentions, row);
        }
    }
}

#[test]
fn mcp_tool_arguments_are_accepted_and_refused_as_pinned() {
    let mut mcp = McpStdio::start(&[]);
    for (row, args, expect) in mcp_rows() {
        let msg = mcp.call("code_exec_bash", args);
        check_mcp_row(row, &msg, &expect);
    }
    // An unknown tool is a protocol error (invalid params), not a result.
    let msg = mcp.call("code_exec_cobol", json!({"code": "x"}));
    assert_eq!(msg["error"]["code"], -32602, "{msg}");
    assert!(msg.get("result").is_none(), "{msg}");
}

// ---------------------------------------------------------------------------------------------
// Calls in a session: HTTP, MCP (issue 21: one intake, one table for every door)
// ---------------------------------------------------------------------------------------------

/// A call in a bash session whose creation set `timeout` 20 and `memory` 128M: what a call may
/// set (its clocks and output caps) and what it may not (the session's sandbox, and the
/// network and packages it was created with, here none), refused with the reason, never
/// dropped.
fn http_session_call_rows() -> Vec<(&'static str, Value, Expect)> {
    vec![
        (
            "code only: the session's limits",
            json!({"code": "true"}),
            Accepted(&[("timeout_ms", 20_000), ("memory_bytes", 128 << 20)]),
        ),
        (
            "the call's own timeout",
            json!({"code": "true", "timeout": "2s"}),
            Accepted(&[("timeout_ms", 2000), ("memory_bytes", 128 << 20)]),
        ),
        (
            "the call's own output cap",
            json!({"code": "echo hello", "output": 2}),
            Stdout("he"),
        ),
        ("stdin", json!({"code": "cat", "stdin": "in"}), Stdout("in")),
        (
            "files",
            json!({"code": "cat f", "files": [{"path": "f", "content": "ff"}]}),
            Stdout("ff"),
        ),
        ("missing code", json!({}), refused(&["code"])),
        (
            "a limit of the session's sandbox",
            json!({"code": "true", "memory": "1G"}),
            refused(&["memory", "session's own"]),
        ),
        (
            "processes",
            json!({"code": "true", "pids": 8}),
            refused(&["pids", "session's own"]),
        ),
        (
            "network",
            json!({"code": "true", "network": {"allow": ["example.com:443"]}}),
            refused(&["network is the session's own", "no network"]),
        ),
        (
            "packages",
            json!({"code": "true", "packages": ["tabulate"]}),
            refused(&["packages is the session's own"]),
        ),
        (
            "empty network and packages",
            json!({"code": "true", "network": {"allow": []}, "packages": []}),
            Accepted(&[("timeout_ms", 20_000)]),
        ),
        (
            "a ttl",
            json!({"code": "true", "ttl": 5}),
            refused(&["ttl"]),
        ),
        (
            "a language",
            json!({"code": "true", "language": "bash"}),
            refused(&["language"]),
        ),
        (
            "an unknown field",
            json!({"code": "true", "timeot": 1}),
            refused(&["timeot"]),
        ),
        (
            "the session's env",
            json!({"code": "echo $FROM_CREATION"}),
            Stdout("created\n"),
        ),
        (
            "env of a call's own, over the session's",
            json!({"code": "echo $A $FROM_CREATION", "env": {"A": "1", "FROM_CREATION": "call"}}),
            Stdout("1 call\n"),
        ),
        (
            "the call's env is undone after it",
            json!({"code": "echo ${A:-unset} $FROM_CREATION"}),
            Stdout("unset created\n"),
        ),
        (
            "env of a call's own, checked as at creation",
            json!({"code": "true", "env": {"PATH": "/x"}}),
            refused(&["PATH"]),
        ),
    ]
}

#[test]
fn http_session_calls_are_accepted_and_refused_as_pinned() {
    let server = ServeProcess::start(&["--pool", "python=0"], &[]);
    let client = http_client();
    let (status, created) = post(
        &client,
        &server.url("/v1/sessions"),
        json!({"language": "bash", "timeout": 20, "memory": "128M",
               "env": {"FROM_CREATION": "created"}})
        .to_string(),
    );
    assert_eq!(status, 201, "{created}");
    let url = server.url(&format!(
        "/v1/sessions/{}/execute",
        created["id"].as_str().unwrap()
    ));
    for (row, body, expect) in http_session_call_rows() {
        let (status, v) = post(&client, &url, body.to_string());
        match expect {
            Accepted(limits) => {
                assert_eq!(status, 200, "{row}: {v}");
                assert_eq!(v["error"], Value::Null, "{row}: {v}");
                assert_old_limit_names(&v["limits"], limits, row);
            }
            Stdout(out) => {
                assert_eq!(status, 200, "{row}: {v}");
                assert_eq!(v["stdout"], out, "{row}: {v}");
            }
            Refused { limit, mentions } => {
                assert_eq!(status, 400, "{row}: {v}");
                assert_eq!(v["error"]["category"], "invalid_request", "{row}: {v}");
                if let Some(limit) = limit {
                    assert_eq!(v["error"]["limit"], limit, "{row}: {v}");
                }
                assert_mentions(v["error"]["message"].as_str().unwrap(), mentions, row);
            }
        }
    }
}

/// MCP's `session_id`: "new" starts a session (with network and packages where the operator
/// offers them), an id continues it; what an MCP tool takes is the same table's (code, files,
/// timeout; network and packages where the operator offers them, in a session only its own,
/// another refused with the reason).
fn mcp_session_rows() -> Vec<(&'static str, Value, Expect)> {
    vec![
        (
            "code in the session",
            json!({"code": "echo $X"}),
            Stdout("1\n"),
        ),
        (
            "a timeout of its own",
            json!({"code": "true", "timeout": 3}),
            Accepted(&[("timeout_ms", 3000)]),
        ),
        (
            "network in a session created without it",
            json!({"code": "true", "network": {"allow": ["127.0.0.2:9"]}}),
            refused(&["network is the session's own"]),
        ),
        (
            "packages in a session created without them",
            json!({"code": "true", "packages": ["tabulate"]}),
            refused(&["packages is the session's own"]),
        ),
        (
            "a limit the tool does not take",
            json!({"code": "true", "memory": "1G"}),
            refused(&["memory"]),
        ),
        (
            "a language",
            json!({"code": "true", "language": "go"}),
            refused(&["language"]),
        ),
    ]
}

#[test]
fn mcp_session_calls_are_accepted_and_refused_as_pinned() {
    // The operator offers network and packages: the tools take both keys.
    let mut mcp = McpStdio::start_with(
        &[],
        &[
            ("RUNCELL_ALLOW_NET", "127.0.0.2:9"),
            ("RUNCELL_ALLOW_PACKAGES", "tabulate"),
        ],
    );
    // A new session may ask for what the operator offers; a call in it may repeat it.
    let msg = mcp.call(
        "code_exec_bash",
        json!({"code": "true", "session_id": "new", "network": {"allow": ["127.0.0.2:9"]}}),
    );
    check_mcp_row(
        "network for a new session",
        &msg,
        &Accepted(&DEFAULT_LIMITS),
    );
    let networked = msg["result"]["structuredContent"]["session_id"]
        .as_str()
        .expect("the new session's id")
        .to_string();
    let msg = mcp.call(
        "code_exec_bash",
        json!({"code": "true", "session_id": networked, "network": {"allow": ["127.0.0.2:9"]}}),
    );
    check_mcp_row("its own network again", &msg, &Accepted(&DEFAULT_LIMITS));
    // Packages are for Python: a bash session is refused them, with the reason.
    let msg = mcp.call(
        "code_exec_bash",
        json!({"code": "true", "session_id": "new", "packages": ["tabulate"]}),
    );
    check_mcp_row(
        "packages for a new bash session",
        &msg,
        &refused(&["Python runs only"]),
    );
    let msg = mcp.call(
        "code_exec_bash",
        json!({"code": "export X=1", "session_id": "new"}),
    );
    check_mcp_row("a new session", &msg, &Accepted(&DEFAULT_LIMITS));
    let id = msg["result"]["structuredContent"]["session_id"]
        .as_str()
        .expect("the new session's id")
        .to_string();
    for (row, mut args, expect) in mcp_session_rows() {
        args["session_id"] = json!(id);
        let msg = mcp.call("code_exec_bash", args);
        check_mcp_row(row, &msg, &expect);
    }
    // Another language's tool in this session: refused, naming the session's.
    let msg = mcp.call("code_exec_python", json!({"code": "1", "session_id": id}));
    check_mcp_row("another tool", &msg, &refused(&["bash session"]));
}

// ---------------------------------------------------------------------------------------------
// Agent tool calls (issue 21): a model's arguments, as the intake lets a model send them
// ---------------------------------------------------------------------------------------------

/// One agent request whose model makes these tool calls in turn (python), then answers: what
/// each call got back (its text, and whether it is an error).
fn agent_tool_call_rows() -> Vec<(&'static str, Value, Expect)> {
    vec![
        ("code", json!({"code": "print(1)"}), Stdout("1")),
        (
            "a limit a model may not set",
            json!({"code": "print(2)", "memory": "4G"}),
            refused(&["unknown field `memory`"]),
        ),
        (
            "a timeout",
            json!({"code": "print(3)", "timeout": 5}),
            Stdout("3"),
        ),
        (
            "processes",
            json!({"code": "print(4)", "pids": 4096}),
            refused(&["unknown field `pids`"]),
        ),
        (
            "files",
            json!({"code": "print(open('f').read())", "files": [{"path": "f", "content": "5"}]}),
            Stdout("5"),
        ),
        (
            "network",
            json!({"code": "print(6)", "network": {"allow": ["127.0.0.2:9"]}}),
            refused(&["unknown field `network`"]),
        ),
        ("state kept", json!({"code": "print(1 + 6)"}), Stdout("7")),
        (
            "packages",
            json!({"code": "print(8)", "packages": ["tabulate"]}),
            refused(&["unknown field `packages`"]),
        ),
        ("more code", json!({"code": "print(9)"}), Stdout("9")),
        (
            "a session of its own choosing",
            json!({"code": "print(10)", "session_id": "new"}),
            refused(&["unknown field `session_id`"]),
        ),
        ("and more", json!({"code": "print(11)"}), Stdout("11")),
        (
            "a language",
            json!({"code": "print(12)", "language": "go"}),
            refused(&["unknown field `language`"]),
        ),
    ]
}

#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn agent_tool_calls_are_accepted_and_refused_as_pinned() {
    use common::upstream::{agents, ask, tool_results, ScriptedUpstream};
    let rows = agent_tool_call_rows();
    let mut steps: Vec<Value> = rows
        .iter()
        .map(|(_, args, _)| json!({"arguments": args}))
        .collect();
    steps.push(json!({"text": "done"}));
    let up = ScriptedUpstream::start("openai", Value::Array(steps));
    // The operator offers network and packages (to MCP clients and the API): a model in the
    // agent loop still may not ask for them.
    let s = up.serve(
        "openai",
        &["--allow-net", "127.0.0.2:9", "--allow-package", "tabulate"],
    );
    let (status, v) = agents(
        &s,
        ask(
            "q",
            json!({"tools": [{"type": "runcell_tool", "name": "code_exec_python",
                              "runtime_params": {"max_calls": 20}}],
                   "max_iterations": 20}),
        ),
    );
    assert_eq!(status, 200, "{v}");
    let reqs = up.valid_requests();
    let results = tool_results("openai", reqs.last().unwrap());
    assert_eq!(results.len(), rows.len(), "{results:?} {v} {}", reqs.len());
    for ((row, _, expect), (text, is_error)) in rows.iter().zip(&results) {
        match expect {
            Stdout(out) => {
                assert!(!is_error, "{row}: {text}");
                let printed = text.lines().skip_while(|l| *l != "--- stdout ---").nth(1);
                assert_eq!(printed, Some(*out), "{row}: {text}");
                assert!(
                    !text.contains("session_id"),
                    "the loop keeps the session: {text}"
                );
            }
            Refused { mentions, .. } => {
                assert!(is_error, "{row}: {text}");
                assert!(text.contains("invalid_request"), "{row}: {text}");
                assert_mentions(text, mentions, row);
            }
            Accepted(_) => unreachable!("rows say what ran by its output"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// CLI: runcell run --json
// ---------------------------------------------------------------------------------------------

fn cli_rows() -> Vec<(&'static str, Vec<&'static str>, Expect)> {
    let t = |extra: &[&'static str]| {
        let mut v = vec!["--lang", "bash", "-c", "true"];
        v.extend_from_slice(extra);
        v
    };
    vec![
        ("no flags: the defaults", t(&[]), Accepted(&DEFAULT_LIMITS)),
        (
            "--timeout 5",
            t(&["--timeout", "5"]),
            Accepted(&[("timeout_ms", 5000)]),
        ),
        (
            "--timeout 500ms",
            t(&["--timeout", "500ms"]),
            Accepted(&[("timeout_ms", 500)]),
        ),
        (
            "--memory 128M",
            t(&["--memory", "128M"]),
            Accepted(&[("memory_bytes", 128 << 20)]),
        ),
        (
            "--cpus 0.5",
            t(&["--cpus", "0.5"]),
            Accepted(&[("cpu_millis", 500)]),
        ),
        ("--pids 8", t(&["--pids", "8"]), Accepted(&[("pids", 8)])),
        (
            "--open-files 64",
            t(&["--open-files", "64"]),
            Accepted(&[("open_files", 64)]),
        ),
        (
            "--disk 8M",
            t(&["--disk", "8M"]),
            Accepted(&[("disk_bytes", 8 << 20)]),
        ),
        (
            "--output 1K",
            t(&["--output", "1K"]),
            Accepted(&[("output_bytes", 1024)]),
        ),
        (
            "--compile-timeout 90s",
            t(&["--compile-timeout", "90s"]),
            Accepted(&[("compile_timeout_ms", 90_000)]),
        ),
        (
            "--timeout soon",
            t(&["--timeout", "soon"]),
            refused(&["timeout", "soon"]),
        ),
        (
            "--timeout -1",
            t(&["--timeout", "-1"]),
            refused(&["timeout"]),
        ),
        (
            "--timeout 0 (below the minimum)",
            t(&["--timeout", "0"]),
            refused(&["timeout"]),
        ),
        (
            "--memory 1T (above the maximum)",
            t(&["--memory", "1T"]),
            refused(&["memory"]),
        ),
        (
            "--memory 1M (below the minimum)",
            t(&["--memory", "1M"]),
            refused(&["memory"]),
        ),
        (
            "--memory 12parsecs",
            t(&["--memory", "12parsecs"]),
            refused(&["memory", "parsecs"]),
        ),
        ("--cpus 0", t(&["--cpus", "0"]), refused(&["cpus"])),
        (
            "--cpus 4096 (above the maximum)",
            t(&["--cpus", "4096"]),
            refused(&["cpu"]),
        ),
        ("--pids -1", t(&["--pids", "-1"]), refused(&["pids"])),
        (
            "--lang cobol",
            vec!["--lang", "cobol", "-c", "true"],
            refused(&["cobol"]),
        ),
        (
            "an unknown flag",
            t(&["--timeot", "5"]),
            refused(&["--timeot"]),
        ),
        (
            "an input file path that leaves the workspace",
            t(&["--file", "/etc/hostname:../x"]),
            refused(&["../x"]),
        ),
    ]
}

#[test]
fn cli_flags_are_accepted_and_refused_as_pinned() {
    for (row, args, expect) in cli_rows() {
        let out = Command::new(runcell_bin())
            .args(["run", "--json"])
            .args(&args)
            .stdin(Stdio::null())
            .output()
            .expect("run runcell");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_no_panic(&stderr);
        let stdout = String::from_utf8_lossy(&out.stdout);
        let v: Value = serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("{row}: one JSON verdict ({e}): {stdout:?} {stderr}"));
        let code = out.status.code();
        match expect {
            Accepted(limits) => {
                assert_eq!(code, Some(0), "{row}: {v}");
                assert_eq!(v["error"], Value::Null, "{row}: {v}");
                assert_old_limit_names(&v["limits"], limits, row);
            }
            Stdout(s) => {
                assert_eq!(code, Some(0), "{row}: {v}");
                assert_eq!(v["stdout"], s, "{row}: {v}");
            }
            Refused { mentions, .. } => {
                assert_eq!(code, Some(2), "{row}: {v}");
                assert_eq!(v["error"]["category"], "invalid_request", "{row}: {v}");
                assert_mentions(v["error"]["message"].as_str().unwrap(), mentions, row);
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The TOML configuration
// ---------------------------------------------------------------------------------------------

const VALID_CONFIG: &str = r#"
[limits.default]
timeout = "10s"
memory = "128M"
cpus = 0.5
pids = 32

[limits.max]
timeout = "1m"
memory = "512M"

[caps]
code = "64K"
input_files = 10
"#;

/// Refused configurations, each with the words the error must contain (the setting).
const REFUSED_CONFIGS: [(&str, &str, &[&str]); 6] = [
    (
        "an unknown limit name",
        "[limits.default]\ntimout = \"10s\"\n",
        &["timout"],
    ),
    (
        "a default above the maximum",
        "[limits.default]\nmemory = \"1G\"\n[limits.max]\nmemory = \"512M\"\n",
        &["memory", "maximum"],
    ),
    (
        "a malformed size",
        "[limits.default]\nmemory = \"12 parsecs\"\n",
        &["memory", "parsecs"],
    ),
    (
        "a malformed duration",
        "[limits.max]\ntimeout = \"soon\"\n",
        &["timeout", "soon"],
    ),
    (
        "a malformed cap",
        "[caps]\ncode = \"lots\"\n",
        &["code", "lots"],
    ),
    ("an unknown cap", "[caps]\nfoo = 1\n", &["foo"]),
];

/// Run runcell with `args` and collect its output; a process still running after `within`
/// (a `serve` that accepted what it should have refused) is killed and fails the test.
fn output_within(args: &[&str], within: Duration) -> std::process::Output {
    let child = Command::new(runcell_bin())
        .args(args)
        .env_remove("RUNCELL_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runcell");
    let pid = child.id();
    // The child's exit closes its pipes: wait for that on a thread, with a deadline here.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(within) {
        Ok(out) => out.expect("wait for runcell"),
        Err(_) => {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
            panic!("runcell {args:?} was still running after {within:?}");
        }
    }
}

fn config_file(dir: &tempfile::TempDir, name: &str, text: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_toml_configuration_is_accepted_and_refused_as_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let valid = config_file(&dir, "valid.toml", VALID_CONFIG);

    // `runcell tools --config` parses the file like `serve` without listening.
    let out = Command::new(runcell_bin())
        .args(["tools", "--format", "mcp", "--config", &valid])
        .env_remove("RUNCELL_CONFIG")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tools: Value = serde_json::from_slice(&out.stdout).expect("the tools as JSON");
    assert!(tools.as_array().is_some_and(|t| !t.is_empty()), "{tools}");

    // `runcell serve --config` starts with it and applies it.
    let server = ServeProcess::start(&["--config", &valid], &[]);
    let v: Value = http_client()
        .get(server.url("/v1/runtimes"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_old_limit_names(
        &v["limits"]["default"],
        &[
            ("timeout_ms", 10_000),
            ("memory_bytes", 128 << 20),
            ("cpu_millis", 500),
            ("pids", 32),
        ],
        "configured defaults",
    );
    assert_old_limit_names(
        &v["limits"]["maximum"],
        &[("timeout_ms", 60_000), ("memory_bytes", 512 << 20)],
        "configured maximum",
    );
    let (status, v) = post(
        &http_client(),
        &server.url("/v1/execute"),
        bash_true(json!({"memory": "1G"})).to_string(),
    );
    assert_eq!(
        (status, &v["error"]["limit"]),
        (400, &json!("memory")),
        "{v}"
    );
    drop(server);

    // `runcell mcp --config` applies the configured maximum to the tool's timeout.
    let mut mcp = McpStdio::start(&["--config", &valid]);
    let msg = mcp.call("code_exec_bash", json!({"code": "true", "timeout": 120}));
    check_mcp_row(
        "timeout above the configured maximum",
        &msg,
        &refused(&["timeout"]),
    );
    let msg = mcp.call("code_exec_bash", json!({"code": "true"}));
    check_mcp_row(
        "the configured default",
        &msg,
        &Accepted(&[("timeout_ms", 10_000), ("memory_bytes", 128 << 20)]),
    );
    drop(mcp);

    for (i, (row, text, mentions)) in REFUSED_CONFIGS.iter().enumerate() {
        let file = config_file(&dir, &format!("refused-{i}.toml"), text);
        for cmd in [
            &["tools", "--format", "mcp", "--config", &file][..],
            &["serve", "--listen", "127.0.0.1:0", "--config", &file][..],
        ] {
            let out = output_within(cmd, ANSWER_WITHIN);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{row}: `{}` accepted it", cmd[0]);
            assert!(out.stdout.is_empty(), "{row}: {cmd:?} printed on stdout");
            assert!(
                stderr.contains("invalid configuration"),
                "{row}: {cmd:?}: {stderr}"
            );
            assert_mentions(&stderr, mentions, row);
            assert_no_panic(&stderr);
        }
    }
}
