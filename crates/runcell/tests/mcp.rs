//! runcell's MCP server driven by a real MCP client, the official Python SDK (`mcp` 2.x,
//! installed by scripts/test.sh into target/mcp-venv), over stdio (`runcell mcp`) and over
//! Streamable HTTP (`runcell serve`, `/mcp`, with an API key): the tool list and its schemas,
//! every language, errors as `isError` results, a plot as an image block, files in and out,
//! progress notifications, and cancellation that leaves no process behind. Raw JSON-RPC
//! exchanges check a client of an older protocol (2025-06-18) on both transports, and
//! `runcell tools` is checked against the MCP tool list.
//!
//! The Python client (tests/mcp/client.py) only drives the session and reports what it saw
//! as JSON; the assertions are here.

mod common;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{
    assert_host_clean, assert_marker_gone, assert_no_panic, marker, runcell_bin, ServeProcess,
};
use reqwest::blocking::Client;
use runcell_runtimes::Language;
use serde_json::{json, Value};

const KEY: &str = "mcp-test-key-0123456789";

/// The Python interpreter of the venv that has the `mcp` package.
fn python() -> PathBuf {
    if let Some(p) = std::env::var_os("RUNCELL_TEST_PYTHON") {
        return p.into();
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/mcp-venv/bin/python");
    assert!(
        p.exists(),
        "the Python MCP client is not installed at {}: run scripts/test.sh, or \
         python3 -m venv target/mcp-venv && target/mcp-venv/bin/pip install mcp==2.3.0",
        p.display()
    );
    p
}

fn client_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/client.py")
}

/// The tools this host should have: one per installed runtime.
fn expected_tools() -> Vec<String> {
    let host = runcell_runtimes::Host::default();
    Language::ALL
        .iter()
        .filter(|&&l| runcell_runtimes::locate(l, &host).is_ok())
        .map(|l| format!("code_exec_{}", l.name()))
        .collect()
}

/// Read a child's output on a thread, so that a test can wait with a deadline.
fn collect(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Wait for `child`, killing it after `within` (hang protection, not an assertion on speed).
fn wait_or_kill(child: &mut Child, within: Duration, what: &str) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {within:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Run `cmd` (stdin /dev/null) to its end, killed after `within`: its status, stdout and
/// stderr.
fn output_within(
    cmd: &mut Command,
    within: Duration,
    what: &str,
) -> (std::process::ExitStatus, String, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let out = collect(child.stdout.take().unwrap());
    let err = collect(child.stderr.take().unwrap());
    let status = wait_or_kill(&mut child, within, what);
    (status, out.join().unwrap(), err.join().unwrap())
}

/// Run tests/mcp/client.py and return its report; its stderr (with the stdio server's) too.
fn run_client(args: &[&str], env: &[(&str, &str)]) -> (Value, String) {
    let (status, out, err) = output_within(
        Command::new(python())
            .arg(client_script())
            .args(args)
            .envs(env.iter().copied()),
        Duration::from_secs(300),
        "the Python MCP client",
    );
    assert!(status.success(), "client failed ({status}):\n{err}\n{out}");
    let report: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("the client's report is not JSON ({e}): {out}\n{err}"));
    for (name, outcome) in report["scenarios"].as_object().expect("scenarios") {
        assert_eq!(outcome, "ok", "scenario {name} failed: {outcome:#}\n{err}");
    }
    (report, err)
}

/// `runcell tools --format FORMAT`.
fn tools_json(format: &str) -> Value {
    let out = Command::new(runcell_bin())
        .args(["tools", "--format", format])
        .output()
        .expect("runcell tools");
    assert!(out.status.success(), "{out:?}");
    assert_no_panic(&String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("runcell tools prints JSON")
}

fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or_default()
}

fn is_error(result: &Value) -> bool {
    result["isError"].as_bool().unwrap_or(false)
}

fn category(result: &Value) -> &str {
    result["structuredContent"]["error"]["category"]
        .as_str()
        .unwrap_or("ok")
}

/// The tool list as a client saw it: the expected tools, with the schemas `runcell tools`
/// prints (one source of truth), each sane on its own.
fn check_tools(tools: &Value) {
    let names: Vec<&str> = tools
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, expected_tools(), "{tools:#}");
    let reference = tools_json("mcp");
    for (tool, want) in tools
        .as_array()
        .unwrap()
        .iter()
        .zip(reference.as_array().unwrap())
    {
        let name = tool["name"].as_str().unwrap();
        assert_eq!(tool["inputSchema"], want["inputSchema"], "{name}");
        assert_eq!(tool["outputSchema"], want["outputSchema"], "{name}");
        assert_eq!(tool["description"], want["description"], "{name}");
        let input = &tool["inputSchema"];
        assert_eq!(input["type"], "object", "{name}");
        assert_eq!(input["required"], json!(["code"]), "{name}");
        for p in ["code", "timeout", "files"] {
            assert!(input["properties"][p].is_object(), "{name}: {p}: {input:#}");
        }
        let output = &tool["outputSchema"];
        assert_eq!(output["type"], "object", "{name}");
        for p in ["stdout", "stderr", "exit_code", "error", "files", "usage"] {
            assert!(output["properties"][p].is_object(), "{name}: {p}");
        }
        // The description is what a model writes its code from.
        let d = tool["description"].as_str().unwrap();
        for want in ["No network", "/workspace", "Limits:", "timeout"] {
            assert!(d.contains(want), "{name}: {want:?} missing: {d}");
        }
    }
}

fn check_languages(languages: &Value) {
    for name in expected_tools() {
        let lang = name.trim_start_matches("code_exec_");
        let r = &languages[lang];
        assert!(!is_error(r), "{lang}: {r:#}");
        assert_eq!(
            r["structuredContent"]["stdout"],
            format!("hello from {lang}\n"),
            "{lang}: {r:#}"
        );
        assert_eq!(r["structuredContent"]["exit_code"], 0, "{lang}");
        assert_eq!(r["structuredContent"]["language"], lang, "{lang}");
        assert!(
            text(r).contains(&format!("hello from {lang}")),
            "{lang}: {r:#}"
        );
    }
}

fn check_errors(errors: &Value) {
    let r = &errors["runtime_error"];
    assert!(is_error(r), "{r:#}");
    assert_eq!(category(r), "runtime_error", "{r:#}");
    let t = text(r);
    assert!(t.contains("error: runtime_error:"), "{t}");
    assert!(t.contains("ValueError: boom"), "{t}");
    assert!(t.contains("Changing the code can help"), "{t}");

    let r = &errors["timeout"];
    assert!(is_error(r), "{r:#}");
    assert_eq!(category(r), "timeout", "{r:#}");
    assert_eq!(r["structuredContent"]["exit_code"], 124);
    assert_eq!(r["structuredContent"]["limits"]["timeout_ms"], 500);
    assert!(text(r).contains("error: timeout:"), "{}", text(r));

    // Bad arguments are tool results the model can correct, not protocol errors.
    for (case, want) in [
        ("bad_argument", "unknown field `language`"),
        ("missing_code", "missing field `code`"),
        ("timeout_over_max", "maximum"),
    ] {
        let r = &errors[case];
        assert!(is_error(r), "{case}: {r:#}");
        assert_eq!(category(r), "invalid_request", "{case}: {r:#}");
        assert!(text(r).contains(want), "{case}: {}", text(r));
        assert!(text(r).contains("Fix the tool arguments"), "{case}");
    }

    // An unknown tool is a protocol error (invalid params).
    let r = &errors["unknown_tool"];
    assert_eq!(r["raised"], "MCPError", "{r:#}");
    assert_eq!(r["code"], -32602, "{r:#}");
}

fn check_plot(r: &Value) {
    assert!(!is_error(r), "{r:#}");
    let images: Vec<&Value> = r["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|b| b["type"] == "image")
        .collect();
    assert_eq!(images.len(), 1, "{r:#}");
    assert_eq!(images[0]["mimeType"], "image/png");
    // base64 of the PNG signature, \x89PNG\r\n\x1a\n.
    assert!(
        images[0]["data"]
            .as_str()
            .unwrap()
            .starts_with("iVBORw0KGgo"),
        "not a PNG"
    );
    let files = r["structuredContent"]["files"].as_array().unwrap();
    let fig = files
        .iter()
        .find(|f| f["path"] == "figures/figure-1.png")
        .unwrap_or_else(|| panic!("no figure: {r:#}"));
    assert_eq!(fig["mime_type"], "image/png");
    assert_eq!(fig["content_base64"], images[0]["data"]);
    assert!(
        text(r).contains("figures/figure-1.png (image/png"),
        "{}",
        text(r)
    );
}

fn check_files(r: &Value) {
    assert!(!is_error(r), "{r:#}");
    let seen: Value =
        serde_json::from_str(r["structuredContent"]["stdout"].as_str().unwrap().trim()).unwrap();
    assert_eq!(
        seen,
        json!({"text": "héllo files\n", "blob": [0, 1, 2, 250, 255]})
    );
    let blocks = r["content"].as_array().unwrap();
    let resource = |uri: &str| {
        blocks
            .iter()
            .find(|b| b["type"] == "resource" && b["resource"]["uri"] == uri)
            .unwrap_or_else(|| panic!("no resource {uri}: {r:#}"))
    };
    let out_txt = resource("runcell:///workspace/out.txt");
    assert_eq!(out_txt["resource"]["text"], "HÉLLO FILES\n");
    assert_eq!(out_txt["resource"]["mimeType"], "text/plain");
    let out_bin = resource("runcell:///workspace/out.bin");
    // base64 of [255, 250, 2, 1, 0].
    assert_eq!(out_bin["resource"]["blob"], "//oCAQA=");
    let files: BTreeSet<&str> = r["structuredContent"]["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert!(
        files.contains("out.txt") && files.contains("out.bin"),
        "{files:?}"
    );
}

fn check_progress(p: &Value) {
    let r = &p["result"];
    assert!(!is_error(r), "{r:#}");
    let stdout = r["structuredContent"]["stdout"].as_str().unwrap();
    let stderr = r["structuredContent"]["stderr"].as_str().unwrap();
    assert_eq!(stdout, "line1\nline2\nline3\nlast\n");
    assert_eq!(stderr, "oops\n");
    let events = p["events"].as_array().unwrap();
    assert!(!events.is_empty(), "no progress notifications: {p:#}");
    let mut last = 0.0;
    let mut streamed = String::new();
    for e in events {
        let progress = e["progress"].as_f64().unwrap();
        assert!(progress > last, "progress must increase: {events:?}");
        last = progress;
        streamed.push_str(e["message"].as_str().unwrap());
    }
    // All of stdout and stderr went out, each in order; how the two interleave is up to
    // the kernel's scheduling.
    assert_eq!(last as usize, stdout.len() + stderr.len(), "{events:?}");
    let mut got: Vec<&str> = streamed.lines().collect();
    let mut want: Vec<&str> = stdout.lines().chain(stderr.lines()).collect();
    got.sort();
    want.sort();
    assert_eq!(got, want);
}

/// `session_id`: "new" starts a session whose id comes back in structuredContent and in the
/// text; the id continues it; another "new" and a call without one see nothing of it; a wrong
/// language, an unknown id and a malformed one are tool errors.
fn check_sessions(r: &Value) {
    let first = &r["first"];
    assert!(!is_error(first), "{first:#}");
    let sid = first["structuredContent"]["session_id"].as_str().unwrap();
    assert!(sid.starts_with("ses"), "{first:#}");
    assert!(
        text(first).contains(sid),
        "the text names the session: {first:#}"
    );
    assert_eq!(first["structuredContent"]["execution_count"], 1);
    let second = &r["second"];
    assert!(!is_error(second), "{second:#}");
    assert_eq!(
        second["structuredContent"]["stdout"], "42 k\n",
        "{second:#}"
    );
    assert_eq!(second["structuredContent"]["session_id"], sid);
    assert_eq!(second["structuredContent"]["execution_count"], 2);
    let other = &r["other"];
    assert_eq!(
        other["structuredContent"]["stdout"], "False []\n",
        "{other:#}"
    );
    assert_ne!(other["structuredContent"]["session_id"], sid);
    assert_eq!(r["fresh"]["structuredContent"]["stdout"], "False\n");
    assert!(r["fresh"]["structuredContent"].get("session_id").is_none());
    let shell = &r["shell_in_session"];
    assert!(!is_error(shell), "{shell:#}");
    assert_eq!(shell["structuredContent"]["session_id"], sid, "{shell:#}");
    assert!(
        shell["structuredContent"]["stdout"]
            .as_str()
            .unwrap()
            .starts_with("hi\n"),
        "{shell:#}"
    );
    for (name, want) in [
        ("wrong_language", "invalid_request"),
        ("unknown", "not_found"),
        ("bad", "invalid_request"),
    ] {
        assert!(is_error(&r[name]), "{name}: {:#}", r[name]);
        assert!(text(&r[name]).contains(want), "{name}: {:#}", r[name]);
    }
}

fn check_cancel(c: &Value, m: &str) {
    assert_eq!(c["alive_before_cancel"], true, "{c:#}");
    assert_eq!(c["finished"], false, "the call was not cancelled: {c:#}");
    assert_eq!(
        c["left_after_cancel"],
        json!([]),
        "the sandbox outlived its cancelled call: {c:#}"
    );
    assert_eq!(c["after"]["structuredContent"]["stdout"], "still here\n");
    assert_marker_gone(m, common::LOADED_MARGIN);
}

#[test]
#[cfg_attr(
    not(all(host_mcp_client, host_python_stack)),
    ignore = "needs the Python MCP client (scripts/test.sh installs it in target/mcp-venv) and the Python data stack"
)]
fn stdio_with_the_python_sdk() {
    let m = marker("mcpstdio");
    let bin = runcell_bin();
    let (report, stderr) = run_client(
        &["stdio", bin.to_str().unwrap()],
        &[("RUNCELL_TEST_MARKER", m.as_str())],
    );
    assert_eq!(report["protocol_version"], "2026-07-28");
    assert!(
        stderr.contains("serving MCP on stdio"),
        "logs go to stderr: {stderr}"
    );
    assert_no_panic(&stderr);
    check_tools(&report["tools"]);
    check_languages(&report["languages"]);
    check_errors(&report["errors"]);
    check_plot(&report["plot"]);
    check_files(&report["files"]);
    check_progress(&report["progress"]);
    check_cancel(&report["cancel"], &m);
    check_sessions(&report["sessions"]);
    // The server exited with its client, leaving nothing behind.
    let pids = report["server_pids"].as_array().unwrap();
    assert_eq!(pids.len(), 1, "{report:#}");
    let pid = pids[0].as_u64().unwrap() as u32;
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_host_clean(pid);
}

/// `runcell serve` as a child process, on a free loopback port, with these API keys.
struct Server(ServeProcess);

impl Server {
    fn start(keys: &[&str]) -> Server {
        let args: Vec<&str> = keys.iter().flat_map(|k| ["--api-key", k]).collect();
        Server(ServeProcess::start(&args, &[]))
    }

    fn url(&self) -> String {
        self.0.url("/mcp")
    }

    fn port(&self) -> &str {
        self.0.port()
    }

    fn log(&self) -> String {
        self.0.log()
    }

    /// SIGTERM, wait, and check nothing of its runs is left.
    fn stop(mut self) {
        let pid = self.0.pid();
        let status = self.0.terminate(Duration::from_secs(60));
        assert!(status.success(), "{status}: {}", self.log());
        assert_host_clean(pid);
    }
}

#[test]
#[cfg_attr(
    not(all(host_mcp_client, host_python_stack)),
    ignore = "needs the Python MCP client (scripts/test.sh installs it in target/mcp-venv) and the Python data stack"
)]
fn http_with_the_python_sdk() {
    let s = Server::start(&[KEY]);
    let url = s.url();

    // A current client (2026-07-28: stateless; cancelling closes the request's stream).
    let m = marker("mcphttp");
    let (report, _) = run_client(
        &["http", &url],
        &[
            ("RUNCELL_TEST_KEY", KEY),
            ("RUNCELL_TEST_MARKER", m.as_str()),
        ],
    );
    assert_eq!(report["protocol_version"], "2026-07-28");
    check_tools(&report["tools"]);
    check_languages(&report["languages"]);
    check_errors(&report["errors"]);
    check_plot(&report["plot"]);
    check_files(&report["files"]);
    check_progress(&report["progress"]);
    check_cancel(&report["cancel"], &m);
    check_sessions(&report["sessions"]);

    // A handshake-era client (initialize, Mcp-Session-Id; cancelling sends
    // notifications/cancelled).
    let m = marker("mcplegacy");
    let (report, _) = run_client(
        &[
            "http",
            &url,
            "--mode",
            "legacy",
            "--scenarios",
            "tools,errors,progress,cancel",
        ],
        &[
            ("RUNCELL_TEST_KEY", KEY),
            ("RUNCELL_TEST_MARKER", m.as_str()),
        ],
    );
    assert_eq!(report["protocol_version"], "2025-11-25");
    check_tools(&report["tools"]);
    check_errors(&report["errors"]);
    check_progress(&report["progress"]);
    check_cancel(&report["cancel"], &m);

    // Calls went through the server's audit log, with the key's id and the MCP interface.
    let log = s.log();
    assert!(
        log.lines()
            .any(|l| l.contains("\"interface\":\"mcp-http\"") && l.contains("\"key_id\":\"key-1\"")),
        "{log}"
    );

    // Without the key, or with a wrong one: 401, before anything of MCP.
    let http = Client::new();
    for auth in [None, Some("Bearer wrong-key-0123456789")] {
        let mut req = http
            .post(&url)
            .header("accept", "application/json, text/event-stream")
            .json(&initialize("2025-06-18"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let res = req.send().unwrap();
        assert_eq!(res.status(), 401, "{auth:?}");
    }
    s.stop();
}

/// POST one JSON-RPC message to `/mcp` with the test key, in `session` (2025-06-18) if given.
fn post_mcp(
    http: &Client,
    url: &str,
    body: &Value,
    session: Option<&str>,
) -> reqwest::blocking::Response {
    let mut req = http
        .post(url)
        .header("authorization", format!("Bearer {KEY}"))
        .header("accept", "application/json, text/event-stream")
        .json(body);
    if let Some(id) = session {
        req = req
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18");
    }
    req.send().unwrap()
}

fn initialize(version: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": version,
        "capabilities": {},
        "clientInfo": {"name": "raw-test", "version": "1.0"}}})
}

/// The JSON-RPC messages of a response: one JSON body, or the `data:` lines of an SSE stream.
fn messages(res: reqwest::blocking::Response) -> Vec<Value> {
    let is_sse = res
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));
    let body = res.text().unwrap();
    if !is_sse {
        return vec![serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}"))];
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .filter(|d| !d.is_empty())
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// The response to request `id` among `msgs`, checking that everything before it is a
/// notification.
fn response(msgs: &[Value], id: u64) -> &Value {
    let pos = msgs
        .iter()
        .position(|m| m["id"] == id)
        .unwrap_or_else(|| panic!("no response to {id}: {msgs:#?}"));
    for m in &msgs[..pos] {
        assert!(m["method"].is_string() && m.get("id").is_none(), "{m}");
    }
    &msgs[pos]
}

#[test]
fn older_protocol_over_http_raw() {
    let s = Server::start(&[KEY]);
    let http = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let post = |body: &Value, session: Option<&str>| post_mcp(&http, &s.url(), body, session);
    let res = post(&initialize("2025-06-18"), None);
    assert_eq!(res.status(), 200);
    let session = res
        .headers()
        .get("mcp-session-id")
        .expect("a session id for a handshake-era client")
        .to_str()
        .unwrap()
        .to_string();
    let msgs = messages(res);
    let init = &response(&msgs, 1)["result"];
    assert_eq!(init["protocolVersion"], "2025-06-18", "{init:#}");
    assert!(init["capabilities"]["tools"].is_object(), "{init:#}");
    assert_eq!(init["serverInfo"]["name"], "runcell");

    let res = post(
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&session),
    );
    assert_eq!(res.status(), 202);

    let res = post(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
        Some(&session),
    );
    assert_eq!(res.status(), 200);
    let msgs = messages(res);
    let tools = &response(&msgs, 2)["result"]["tools"];
    let names: Vec<&str> = tools
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, expected_tools());
    assert_eq!(
        tools,
        &tools_json("mcp"),
        "the listing is what `runcell tools` prints"
    );

    let res = post(
        &json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "code_exec_bash",
            "arguments": {"code": "echo hi; sleep 0.2; echo err >&2"},
            "_meta": {"progressToken": "p3"}}}),
        Some(&session),
    );
    assert_eq!(res.status(), 200);
    let msgs = messages(res);
    let result = &response(&msgs, 3)["result"];
    assert_eq!(result["isError"], false, "{result:#}");
    assert_eq!(result["structuredContent"]["stdout"], "hi\n");
    assert_eq!(result["structuredContent"]["stderr"], "err\n");
    assert!(text(result).contains("--- stdout ---\nhi"), "{result:#}");
    // resultType belongs to 2026-07-28; a 2025-06-18 client does not get it.
    assert!(result.get("resultType").is_none(), "{result:#}");
    let progress: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    assert!(!progress.is_empty(), "{msgs:#?}");
    let streamed: String = progress
        .iter()
        .map(|p| {
            assert_eq!(p["params"]["progressToken"], "p3");
            p["params"]["message"].as_str().unwrap()
        })
        .collect();
    let mut lines: Vec<&str> = streamed.lines().collect();
    lines.sort();
    assert_eq!(lines, ["err", "hi"]);

    // An error verdict is a result with isError, not a JSON-RPC error.
    let res = post(
        &json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "code_exec_bash", "arguments": {"code": "exit 7"}}}),
        Some(&session),
    );
    let msgs = messages(res);
    let r = response(&msgs, 4);
    assert!(r.get("error").is_none(), "{r:#}");
    assert_eq!(r["result"]["isError"], true);
    assert_eq!(r["result"]["structuredContent"]["exit_code"], 7);
    assert_eq!(category(&r["result"]), "runtime_error");

    // Arguments that are not a request: an invalid_request result, audited and counted like
    // any refused request.
    let res = post(
        &json!({"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {
            "name": "code_exec_bash", "arguments": {"code": 5}}}),
        Some(&session),
    );
    let msgs = messages(res);
    assert_eq!(category(&response(&msgs, 5)["result"]), "invalid_request");
    let log = s.log();
    assert!(
        log.lines().any(|l| l.contains("\"interface\":\"mcp-http\"")
            && l.contains("\"category\":\"invalid_request\"")),
        "no audit line for the refused call: {log}"
    );
    let metrics = http
        .get(s.0.url("/metrics"))
        .header("authorization", format!("Bearer {KEY}"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("runcell_rejections_total{reason=\"invalid_request\"} 1"),
        "{metrics}"
    );

    let res = http
        .delete(s.url())
        .header("authorization", format!("Bearer {KEY}"))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .unwrap();
    // 204, as the official SDKs expect (they log "Session termination failed" on a 202).
    assert_eq!(res.status(), 204);
    s.stop();
}

/// A session call's displayed results (issue 22): an image as an MCP image block, the value
/// of the last expression as a text block, the bundles in structuredContent.
#[test]
fn session_results_are_image_and_text_blocks() {
    let s = Server::start(&[KEY]);
    let http = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let post = |body: &Value| post_mcp(&http, &s.url(), body, None);
    let res = post(&initialize("2025-06-18"));
    assert_eq!(res.status(), 200);
    let session = res
        .headers()
        .get("mcp-session-id")
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let post = |body: &Value| post_mcp(&http, &s.url(), body, Some(&session));
    assert_eq!(
        post(&json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).status(),
        202
    );
    // A 1x1 PNG, displayed by an object that offers it, and a final value.
    let code = "import base64\n\
        class Dot:\n    def _repr_png_(self):\n        return base64.b64decode(\
        'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==')\n\
        display(Dot())\n6 * 7";
    let res = post(
        &json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
        "name": "code_exec_python", "arguments": {"code": code, "session_id": "new"}}}),
    );
    let msgs = messages(res);
    let result = &response(&msgs, 2)["result"];
    assert_eq!(result["isError"], false, "{result:#}");
    let blocks = result["content"].as_array().unwrap();
    let image = blocks
        .iter()
        .find(|b| b["type"] == "image")
        .unwrap_or_else(|| panic!("no image block: {result:#}"));
    assert_eq!(image["mimeType"], "image/png");
    assert!(image["data"].as_str().unwrap().starts_with("iVBORw0KGgo"));
    assert!(
        blocks
            .iter()
            .any(|b| b["text"] == "result 2 (the value of the last expression):\n42"),
        "{result:#}"
    );
    let results = result["structuredContent"]["results"].as_array().unwrap();
    assert_eq!(results.len(), 2, "{result:#}");
    assert_eq!(results[1]["is_main_result"], true);
    s.stop();
}

/// A call whose stream the client closed, or whose session it ended, is cancelled at once
/// (its sandbox killed, the run audited as `cancelled`), never left to run to its timeout for
/// nobody (the TypeScript SDK aborts a call by closing its stream).
#[test]
fn closing_the_stream_or_the_session_cancels_the_call() {
    let s = Server::start(&[KEY]);
    let http = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let post = |body: &Value, session: Option<&str>| post_mcp(&http, &s.url(), body, session);
    let res = post(&initialize("2025-06-18"), None);
    let session = res.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    drop(messages(res));
    post(
        &json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&session),
    );
    // Start a long call and read its stream until the program has started.
    let start_call = |id: u64| {
        let mut res = post(
            &json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": {
                "name": "code_exec_bash",
                "arguments": {"code": "echo started; sleep 300", "timeout": 600},
                "_meta": {"progressToken": id}}}),
            Some(&session),
        );
        assert_eq!(res.status(), 200);
        let mut seen = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&seen).contains("started") {
            let n = res.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "the stream ended early: {}",
                String::from_utf8_lossy(&seen)
            );
            seen.extend_from_slice(&buf[..n]);
        }
        res
    };
    let cancelled = || {
        s.log()
            .lines()
            .filter(|l| {
                l.contains("\"interface\":\"mcp-http\"") && l.contains("\"category\":\"cancelled\"")
            })
            .count()
    };
    let wait_for = |n: usize, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        while cancelled() < n {
            assert!(
                Instant::now() < deadline,
                "{what}: the call was not cancelled: {}",
                s.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    // The client closes the call's stream (and sends no cancellation).
    drop(start_call(10));
    wait_for(1, "stream closed");

    // The client ends the session while a call runs.
    let res = start_call(11);
    let del = http
        .delete(s.url())
        .header("authorization", format!("Bearer {KEY}"))
        .header("mcp-session-id", &session)
        .header("mcp-protocol-version", "2025-06-18")
        .send()
        .unwrap();
    assert_eq!(del.status(), 204);
    wait_for(2, "session ended");
    drop(res);
    s.stop();
}

/// A session (older protocol versions) belongs to the key that opened it: another key that
/// learns its id can neither call in it nor end it (before, any valid key could).
#[test]
fn an_mcp_session_is_its_openers_only() {
    const OTHER: &str = "mcp-test-other-key-0123456789";
    let s = Server::start(&[KEY, OTHER]);
    let http = Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let send = |method: reqwest::Method, key: &str, body: Option<&Value>, session: Option<&str>| {
        let mut req = http
            .request(method, s.url())
            .header("authorization", format!("Bearer {key}"))
            .header("accept", "application/json, text/event-stream");
        if let Some(body) = body {
            req = req.json(body);
        }
        if let Some(id) = session {
            req = req
                .header("mcp-session-id", id)
                .header("mcp-protocol-version", "2025-06-18");
        }
        req.send().unwrap()
    };
    let res = send(
        reqwest::Method::POST,
        KEY,
        Some(&initialize("2025-06-18")),
        None,
    );
    assert_eq!(res.status(), 200);
    let session = res.headers()["mcp-session-id"]
        .to_str()
        .unwrap()
        .to_string();
    drop(messages(res));
    let initialized = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    let res = send(
        reqwest::Method::POST,
        KEY,
        Some(&initialized),
        Some(&session),
    );
    assert_eq!(res.status(), 202);
    let list = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"});
    // The other key: as if the session did not exist.
    let res = send(reqwest::Method::POST, OTHER, Some(&list), Some(&session));
    assert_eq!(res.status(), 404);
    let res = send(reqwest::Method::DELETE, OTHER, None, Some(&session));
    assert_eq!(res.status(), 404);
    // Its own key still can.
    let res = send(reqwest::Method::POST, KEY, Some(&list), Some(&session));
    assert_eq!(res.status(), 200);
    let msgs = messages(res);
    assert!(response(&msgs, 2)["result"]["tools"].is_array());
    let res = send(reqwest::Method::DELETE, KEY, None, Some(&session));
    assert!(res.status().is_success(), "{}", res.status());
    s.stop();
}

#[test]
fn http_without_keys_guards_against_dns_rebinding() {
    // Without API keys (loopback only), a request must name a loopback host, and a browser's
    // Origin must be a loopback one: a page on evil.example whose name resolves to 127.0.0.1
    // cannot drive the server.
    let s = Server::start(&[]);
    let http = Client::new();
    let port = s.port().to_string();
    let post = |host: Option<String>, origin: Option<&str>| {
        let mut req = http
            .post(s.url())
            .header("accept", "application/json, text/event-stream")
            .json(&initialize("2025-06-18"));
        if let Some(h) = host {
            req = req.header("host", h);
        }
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        req.send().unwrap().status().as_u16()
    };
    assert_eq!(post(None, None), 200);
    assert_eq!(post(Some(format!("localhost:{port}")), None), 200);
    assert_eq!(post(None, Some(&format!("http://localhost:{port}"))), 200);
    assert_eq!(post(Some(format!("evil.example:{port}")), None), 403);
    assert_eq!(post(None, Some("http://evil.example")), 403);
    s.stop();
}

/// One JSON-RPC line to the stdio server.
fn send(stdin: &mut impl Write, msg: Value) {
    let mut line = serde_json::to_string(&msg).unwrap();
    line.push('\n');
    stdin.write_all(line.as_bytes()).unwrap();
    stdin.flush().unwrap();
}

#[test]
fn older_protocol_over_stdio_raw() {
    let mut child = Command::new(runcell_bin())
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start runcell mcp");
    let pid = child.id();
    let mut stdin = child.stdin.take().unwrap();
    let err = collect(child.stderr.take().unwrap());
    // Every line on stdout must be a JSON-RPC message: nothing else may go there.
    let (tx, rx) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut all = Vec::new();
    let mut until = |id: u64| -> Vec<Value> {
        let mut got = Vec::new();
        loop {
            let line = rx
                .recv_timeout(Duration::from_secs(120))
                .unwrap_or_else(|_| panic!("no answer to {id}; so far: {got:#?}"));
            let msg: Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("stdout carried a non-JSON line ({e}): {line:?}"));
            all.push(msg.clone());
            let done = msg["id"] == id;
            got.push(msg);
            if done {
                return got;
            }
        }
    };

    send(&mut stdin, initialize("2025-06-18"));
    let msgs = until(1);
    let init = &response(&msgs, 1)["result"];
    assert_eq!(init["protocolVersion"], "2025-06-18", "{init:#}");
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );

    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"}),
    );
    let msgs = until(2);
    let tools = &response(&msgs, 2)["result"]["tools"];
    assert_eq!(tools, &tools_json("mcp"));

    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {
            "name": "code_exec_python",
            "arguments": {"code": "print(6 * 7)"},
            "_meta": {"progressToken": 9}}}),
    );
    let msgs = until(3);
    let result = &response(&msgs, 3)["result"];
    assert_eq!(result["isError"], false, "{result:#}");
    assert_eq!(result["structuredContent"]["stdout"], "42\n");
    assert!(result.get("resultType").is_none(), "{result:#}");
    let progress: Vec<&Value> = msgs
        .iter()
        .filter(|m| m["method"] == "notifications/progress")
        .collect();
    // print() writes "42" and "\n" separately: one notification or two.
    let mut streamed = String::new();
    for p in &progress {
        assert_eq!(p["params"]["progressToken"], 9);
        assert_eq!(p["params"]["_meta"]["runcell/stream"], "stdout");
        streamed.push_str(p["params"]["message"].as_str().unwrap());
    }
    assert_eq!(streamed, "42\n", "{msgs:#?}");

    // Invalid input is an isError result too.
    send(
        &mut stdin,
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {
            "name": "code_exec_python", "arguments": {"code": "print(1)", "timeout": -5}}}),
    );
    let msgs = until(4);
    let r = response(&msgs, 4);
    assert_eq!(r["result"]["isError"], true, "{r:#}");
    assert_eq!(category(&r["result"]), "invalid_request");

    // Closing stdin ends the server.
    drop(stdin);
    let status = wait_or_kill(&mut child, Duration::from_secs(30), "runcell mcp");
    assert!(status.success(), "{status}");
    let err = err.join().unwrap();
    assert_no_panic(&err);
    assert!(err.contains("serving MCP on stdio"), "{err}");
    // The SDK's own chatter stays below the default log level.
    assert!(!err.contains("serve_inner"), "{err}");
    // Drain what is left: still JSON only.
    while let Ok(line) = rx.try_recv() {
        let parsed: Result<Value, _> = serde_json::from_str(&line);
        assert!(parsed.is_ok(), "stdout carried a non-JSON line: {line:?}");
    }
    assert!(!all.is_empty());
    assert_host_clean(pid);
}

#[test]
fn tools_command_prints_the_mcp_schemas_for_anthropic_and_openai() {
    let mcp = tools_json("mcp");
    let anthropic = tools_json("anthropic");
    let openai = tools_json("openai");
    let mcp = mcp.as_array().unwrap();
    let names: Vec<&str> = mcp.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, expected_tools());
    assert_eq!(anthropic.as_array().unwrap().len(), mcp.len());
    assert_eq!(openai.as_array().unwrap().len(), mcp.len());
    for (i, m) in mcp.iter().enumerate() {
        let a = &anthropic[i];
        assert_eq!(
            a.as_object().unwrap().keys().collect::<Vec<_>>(),
            ["description", "input_schema", "name"],
            "exactly Anthropic's tool fields"
        );
        assert_eq!(a["name"], m["name"]);
        assert_eq!(a["description"], m["description"]);
        assert_eq!(a["input_schema"], m["inputSchema"]);

        let o = &openai[i];
        assert_eq!(o["type"], "function");
        assert_eq!(o["function"]["name"], m["name"]);
        assert_eq!(o["function"]["description"], m["description"]);
        // Not normalised for OpenAI's strict mode (which would make every field required):
        // the very same schema.
        assert_eq!(o["function"]["parameters"], m["inputSchema"]);
        assert!(o["function"].get("strict").is_none());
    }
    let bad = Command::new(runcell_bin())
        .args(["tools", "--format", "yaml"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

/// A host HTTP server on 127.0.0.2 answering `hello from the host`; its port.
fn host_server() -> u16 {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.2:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = s.write_all(
                b"HTTP/1.1 200 OK\r\nContent-Length: 20\r\nConnection: close\r\n\r\nhello from the host\n",
            );
        }
    });
    port
}

/// Network approval over MCP: the server requires it, and the official Python client's
/// elicitation callback answers. On 2026-07-28 the question comes as an input request the
/// client answers by retrying the call; on a handshake-era session as an elicitation request.
/// Accepted, the code runs with its network; declined or answered no, nothing runs.
#[test]
#[cfg_attr(
    not(all(host_mcp_client, host_python_stack)),
    ignore = "needs the Python MCP client (scripts/test.sh installs it in target/mcp-venv) and the Python data stack"
)]
fn network_approval_is_asked_of_the_user_through_elicitation() {
    let port = host_server();
    let entry = format!("127.0.0.2:{port}");
    let url = format!("http://127.0.0.2:{port}/");
    let s = ServeProcess::start(
        &[
            "--api-key",
            KEY,
            "--pool",
            "python=0",
            "--allow-net",
            &entry,
            "--net-approval",
            "--net-approval-by",
            "client",
        ],
        &[],
    );
    for mode in ["auto", "legacy"] {
        let (report, err) = run_client(
            &[
                "http",
                &s.url("/mcp"),
                "--mode",
                mode,
                "--scenarios",
                "approval",
            ],
            &[
                ("RUNCELL_TEST_KEY", KEY),
                ("RUNCELL_TEST_NET_URL", url.as_str()),
                ("RUNCELL_TEST_NET_ENTRY", entry.as_str()),
            ],
        );
        let a = &report["approval"];
        assert!(!is_error(&a["accept"]), "{mode}: {a:#}\n{err}");
        assert!(
            text(&a["accept"]).contains("hello from the host"),
            "{mode}: {a:#}"
        );
        assert!(is_error(&a["decline"]), "{mode}: {a:#}");
        assert!(text(&a["decline"]).contains("declined"), "{mode}: {a:#}");
        assert!(is_error(&a["refuse"]), "{mode}: {a:#}");
        assert!(
            text(&a["refuse"]).contains("did not approve"),
            "{mode}: {a:#}"
        );
        let asked = a["asked"].as_array().unwrap();
        assert_eq!(asked.len(), 3, "{mode}: {a:#}");
        assert!(
            asked.iter().all(|m| m.as_str().unwrap().contains(&entry)),
            "{a:#}"
        );
    }

    // By default an MCP client over HTTP cannot approve its own call (found by our red
    // team: it answered the input request itself): the call waits for the admin queue like
    // an HTTP one, and with no admin deciding, it is refused at the deadline.
    let s = ServeProcess::start(
        &[
            "--api-key",
            KEY,
            "--pool",
            "python=0",
            "--allow-net",
            &entry,
            "--net-approval",
            "--net-approval-timeout",
            "1s",
        ],
        &[],
    );
    let (report, err) = run_client(
        &["http", &s.url("/mcp"), "--scenarios", "approval"],
        &[
            ("RUNCELL_TEST_KEY", KEY),
            ("RUNCELL_TEST_NET_URL", url.as_str()),
            ("RUNCELL_TEST_NET_ENTRY", entry.as_str()),
        ],
    );
    let a = &report["approval"];
    assert_eq!(
        a["asked"],
        json!([]),
        "the client was not asked: {a:#}\n{err}"
    );
    for answer in ["accept", "decline", "refuse"] {
        assert!(is_error(&a[answer]), "{answer}: {a:#}");
        assert!(
            text(&a[answer]).contains("No operator approved"),
            "{answer}: {a:#}"
        );
    }
}

/// The official TypeScript SDK (the one the MCP Inspector, Claude Desktop's tooling and many
/// agents use) over stdio and Streamable HTTP: lists the tools, a call succeeds and a failing
/// one is an `isError` result, and the SDK warns about nothing (it validates every result
/// against the tool's output schema and printed a hundred lines for a non-standard format).
#[test]
#[cfg_attr(
    not(host_ts_mcp_client),
    ignore = "needs the TypeScript MCP SDK (scripts/test.sh installs it in target/ts-mcp with npm)"
)]
fn the_typescript_sdk_over_stdio_and_http_sees_no_warnings() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/ts-mcp");
    let script = dir.join("ts_client.mjs");
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/ts_client.mjs"),
        &script,
    )
    .unwrap();
    let drive = |args: &[&str]| {
        let (status, out, err) = output_within(
            Command::new("node").arg(&script).args(args),
            Duration::from_secs(120),
            "the TypeScript client",
        );
        let last = out.lines().last().unwrap_or_default();
        let report: Value = serde_json::from_str(last)
            .unwrap_or_else(|e| panic!("no report ({e}), {status}:\n{out}\n{err}"));
        assert!(status.success(), "{status}: {report:#}\n{err}");
        assert_eq!(report["warnings"], json!([]), "{err}");
        let tools: Vec<String> = serde_json::from_value(report["tools"].clone()).unwrap();
        assert_eq!(tools, expected_tools());
        assert_eq!(report["stdout"], "hi\n", "{report:#}");
        assert_eq!(report["isError"], false, "{report:#}");
        assert_eq!(report["badError"], true, "{report:#}");
    };
    let bin = runcell_bin();
    drive(&["stdio", bin.to_str().unwrap()]);
    let s = Server::start(&[KEY]);
    drive(&["http", &s.url(), KEY]);
    s.stop();
}
