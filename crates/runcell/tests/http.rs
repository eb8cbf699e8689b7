//! `runcell serve` over real HTTP on loopback: auth, every language, files, streaming, limits,
//! body cap, malformed input, 429, client disconnects and graceful shutdown. Each test starts
//! its own server (as a child process, `--listen 127.0.0.1:0`, the port read from its log).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{
    assert_host_clean, assert_marker_gone, marker, runcell_bin, wait_for_marker, ServeProcess,
    LOADED_MARGIN, START_WITHIN,
};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

/// The server under test, with the API's requests.
struct Server(ServeProcess);

impl std::ops::Deref for Server {
    type Target = ServeProcess;
    fn deref(&self) -> &ServeProcess {
        &self.0
    }
}

impl std::ops::DerefMut for Server {
    fn deref_mut(&mut self) -> &mut ServeProcess {
        &mut self.0
    }
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        Server(ServeProcess::start(args, env))
    }

    fn execute(&self, body: Value) -> (u16, Value) {
        let res = client()
            .post(self.url("/v1/execute"))
            .json(&body)
            .send()
            .expect("request");
        json_of(res)
    }

    fn stream(&self, body: Value) -> Events {
        let res = client()
            .post(self.url("/v1/execute"))
            .header("accept", "text/event-stream")
            .json(&body)
            .send()
            .expect("request");
        assert_eq!(res.status(), 200);
        assert!(res.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        Events {
            reader: BufReader::new(res),
        }
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn json_of(res: Response) -> (u16, Value) {
    let status = res.status().as_u16();
    let ct = res
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    let text = res.text().unwrap();
    assert!(ct.starts_with("application/json"), "{status} {ct}: {text}");
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    (status, v)
}

fn category(v: &Value) -> &str {
    v["error"]["category"].as_str().unwrap_or("ok")
}

/// Server-sent events, read as they arrive.
struct Events {
    reader: BufReader<Response>,
}

impl Events {
    /// The next (event, data) pair, skipping keep-alive comments; None at the end.
    fn next(&mut self) -> Option<(String, Value)> {
        let (mut event, mut data) = (String::new(), String::new());
        loop {
            let mut line = String::new();
            if self.reader.read_line(&mut line).ok()? == 0 {
                return None;
            }
            let line = line.trim_end_matches(['\r', '\n']);
            if line.is_empty() {
                if event.is_empty() && data.is_empty() {
                    continue;
                }
                let v = serde_json::from_str(&data).unwrap_or_else(|e| panic!("{e}: {data}"));
                return Some((event, v));
            }
            if let Some(e) = line.strip_prefix("event:") {
                event = e.trim().to_string();
            } else if let Some(d) = line.strip_prefix("data:") {
                data.push_str(d.strip_prefix(' ').unwrap_or(d));
            }
        }
    }

    /// Read until a stdout event containing `text`; panics at the result or the end.
    fn until_stdout(&mut self, text: &str) {
        while let Some((event, data)) = self.next() {
            assert_ne!(event, "result", "ended before printing {text}: {data}");
            if event == "stdout" && data["text"].as_str().unwrap().contains(text) {
                return;
            }
        }
        panic!("stream ended before {text}");
    }

    fn rest(mut self) -> Vec<(String, Value)> {
        let mut all = Vec::new();
        while let Some(e) = self.next() {
            all.push(e);
        }
        // Nothing follows the result.
        let mut tail = String::new();
        let _ = self.reader.read_to_string(&mut tail);
        assert!(
            tail.trim().is_empty() || tail.trim().starts_with(':'),
            "{tail}"
        );
        all
    }
}

#[test]
fn auth_both_header_styles_and_public_healthz() {
    let s = Server::start_env(
        &["--api-key", "cli-key-0123456789"],
        &[("RUNCELL_API_KEY", "ignored-0123456789")],
    );
    let c = client();
    let res = c.get(s.url("/healthz")).send().unwrap();
    assert_eq!(
        json_of(res),
        (200, json!({"status": "ok", "sandboxes_running": 0}))
    );

    let body = json!({"language": "python", "code": "print(1)"});
    let (st, v) = json_of(c.post(s.url("/v1/execute")).json(&body).send().unwrap());
    assert_eq!((st, category(&v)), (401, "unauthorized"), "{v}");
    for wrong in [
        "Bearer nope",
        "Bearer cli-key-0123456789x",
        "Bearer ignored-0123456789",
        "cli-key-0123456789",
    ] {
        let res = c
            .post(s.url("/v1/execute"))
            .header("authorization", wrong)
            .json(&body)
            .send()
            .unwrap();
        let (st, v) = json_of(res);
        assert_eq!((st, category(&v)), (401, "unauthorized"), "{wrong}: {v}");
    }
    let res = c
        .post(s.url("/v1/execute"))
        .header("x-api-key", "wrong")
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(json_of(res).0, 401);

    let res = c
        .post(s.url("/v1/execute"))
        .header("authorization", "Bearer cli-key-0123456789")
        .json(&body)
        .send()
        .unwrap();
    let (st, v) = json_of(res);
    assert_eq!((st, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
    let res = c
        .get(s.url("/v1/runtimes"))
        .header("x-api-key", "cli-key-0123456789")
        .send()
        .unwrap();
    assert_eq!(json_of(res).0, 200);
    assert!(
        !s.log().contains("cli-key-0123456789"),
        "a key was logged: {}",
        s.log()
    );

    // Keys from the environment, comma-separated.
    let s = Server::start_env(
        &[],
        &[(
            "RUNCELL_API_KEY",
            "env-key-a-0123456789,env-key-b-0123456789",
        )],
    );
    for (h, k) in [
        ("x-api-key", "env-key-b-0123456789"),
        ("authorization", "Bearer env-key-a-0123456789"),
    ] {
        let res = c.get(s.url("/v1/runtimes")).header(h, k).send().unwrap();
        assert_eq!(json_of(res).0, 200, "{h}: {k}");
    }
    let res = c.get(s.url("/v1/runtimes")).send().unwrap();
    assert_eq!(json_of(res).0, 401);
    assert!(!s.log().contains("WARNING"), "{}", s.log());
}

#[test]
fn without_a_key_only_loopback_and_a_loud_warning() {
    let s = Server::start(&[]);
    assert!(s.log().contains("WARNING: NO API KEY"), "{}", s.log());
    let out = Command::new(runcell_bin())
        .args(["serve", "--listen", "0.0.0.0:0"])
        .env_remove("RUNCELL_API_KEY")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("without an API key"), "{err}");
}

#[test]
fn print_one() {
    let s = Server::start(&[]);
    let (st, v) = s.execute(
        json!({"language": "python", "code": "print(1)", "timeout": 10, "memory": "128M"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "1\n");
    assert_eq!(v["exit_code"], 0);
    assert_eq!(v["error"], Value::Null);
    assert_eq!(v["language"], "python");
    assert_eq!(v["limits"]["timeout"], 10);
    assert_eq!(v["limits"]["timeout_ms"], 10_000);
    assert_eq!(v["limits"]["memory_bytes"], 128 << 20);
    // A failing program is still a 200: it is the program's outcome.
    let (st, v) = s.execute(json!({"language": "bash", "code": "echo oops >&2; exit 3"}));
    assert_eq!((st, category(&v)), (200, "runtime_error"), "{v}");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stderr"], "oops\n");
    let (st, v) = s.execute(json!({"language": "bash", "code": "sleep 5", "timeout": 0.3}));
    assert_eq!((st, category(&v)), (200, "timeout"), "{v}");
    // Each execution is counted by language and outcome.
    let metrics = client()
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for needle in [
        r#"runcell_executions_total{language="python",category="ok",interface="http"} 1"#,
        r#"runcell_executions_total{language="bash",category="runtime_error",interface="http"} 1"#,
        r#"runcell_executions_total{language="bash",category="timeout",interface="http"} 1"#,
        r#"runcell_execution_duration_seconds_count{language="bash"} 2"#,
        "runcell_sandboxes_running 0",
    ] {
        assert!(metrics.contains(needle), "missing {needle}:\n{metrics}");
    }
    let pid = s.pid();
    drop(s);
    assert_host_clean(pid);
}

#[test]
fn every_language() {
    let s = Server::start(&[]);
    let (st, rt) = json_of(client().get(s.url("/v1/runtimes")).send().unwrap());
    assert_eq!(st, 200);
    let programs = [
        ("python", "print(6*7)"),
        ("node", "console.log(6*7)"),
        ("ruby", "puts 6*7"),
        (
            "go",
            "package main\nimport \"fmt\"\nfunc main() { fmt.Println(6*7) }",
        ),
        ("bash", "echo $((6*7))"),
    ];
    let mut ran = Vec::new();
    let threads: Vec<_> = programs
        .iter()
        .filter(|(lang, _)| {
            rt["runtimes"]
                .as_array()
                .unwrap()
                .iter()
                .any(|r| r["language"] == *lang && r["available"] == true)
        })
        .map(|&(lang, code)| {
            ran.push(lang);
            let url = s.url("/v1/execute");
            std::thread::spawn(move || {
                let res = client()
                    .post(url)
                    .json(&json!({"language": lang, "code": code}))
                    .send()
                    .unwrap();
                (lang, json_of(res))
            })
        })
        .collect();
    for t in threads {
        let (lang, (st, v)) = t.join().unwrap();
        assert_eq!(st, 200, "{lang}: {v}");
        assert_eq!(v["stdout"], "42\n", "{lang}: {v}");
        assert_eq!(v["language"], lang);
    }
    assert!(ran.contains(&"python") && ran.contains(&"bash"), "{rt}");
    for r in rt["runtimes"].as_array().unwrap() {
        if r["available"] == true {
            assert!(r["version"].is_string(), "{r}");
        }
    }
}

#[test]
fn files_in_and_out() {
    let s = Server::start(&[]);
    let code = "import hashlib\n\
                data = open('in/data.csv').read()\n\
                raw = open('blob.bin', 'rb').read()\n\
                open('out.txt', 'w').write(data.upper() + str(len(raw)))\n\
                print(hashlib.sha256(raw).hexdigest())";
    let (st, v) = s.execute(json!({
        "language": "python",
        "code": code,
        "files": [
            {"path": "in/data.csv", "content": "a,b\n1,2\n"},
            {"path": "blob.bin", "content_base64": "AAEC/w=="},
        ],
    }));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    let files = v["files"].as_array().unwrap();
    let out = files
        .iter()
        .find(|f| f["path"] == "out.txt")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(out["content_base64"], "QSxCCjEsMgo0", "{out}"); // "A,B\n1,2\n4"
    assert_eq!(out["size"], 9);
    assert!(
        !files.iter().any(|f| f["path"] == "blob.bin"),
        "inputs are not outputs: {v}"
    );
    // An input file that escapes /workspace is the client's error.
    let (st, v) = s.execute(
        json!({"language": "python", "code": "", "files": [{"path": "../x", "content": ""}]}),
    );
    assert_eq!((st, category(&v)), (400, "invalid_request"), "{v}");
}

#[test]
fn streaming_sends_output_as_it_is_written() {
    let s = Server::start(&[]);
    let started = Instant::now();
    let mut events = s.stream(json!({
        "language": "python",
        "code": "import sys, time\nprint('first', flush=True)\nprint('warn', file=sys.stderr, flush=True)\ntime.sleep(1)\nprint('second')",
    }));
    // Chunks are what a read returned: "first\n" may come as "first" and "\n".
    events.until_stdout("first");
    let first_at = started.elapsed();
    let rest = events.rest();
    let end_at = started.elapsed();
    assert!(
        end_at - first_at >= Duration::from_millis(700),
        "the first chunk came {first_at:?}, the end {end_at:?}: not streamed"
    );
    let (result, output) = rest.split_last().expect("a result event");
    assert_eq!(result.0, "result", "{rest:?}");
    let text = |name: &str| -> String {
        output
            .iter()
            .filter(|(e, _)| e == name)
            .map(|(_, d)| d["text"].as_str().unwrap())
            .collect()
    };
    assert_eq!(text("stderr"), "warn\n", "{rest:?}");
    assert!(text("stdout").ends_with("second\n"), "{rest:?}");
    // stderr was written (and sent) before the program slept and printed "second".
    let warn = output.iter().position(|(e, _)| e == "stderr").unwrap();
    let second = output
        .iter()
        .position(|(e, d)| e == "stdout" && d["text"].as_str().unwrap().contains("second"))
        .unwrap();
    assert!(warn < second, "{rest:?}");
    assert!(
        output.iter().all(|(e, _)| e == "stdout" || e == "stderr"),
        "{rest:?}"
    );
    let verdict = &result.1;
    assert_eq!(verdict["stdout"], "first\nsecond\n");
    assert_eq!(verdict["exit_code"], 0);
}

#[test]
fn limits_above_the_maximum_are_400() {
    let s = Server::start(&[]);
    let (_, rt) = json_of(client().get(s.url("/v1/runtimes")).send().unwrap());
    let max_mem = rt["limits"]["maximum"]["memory_bytes"].as_u64().unwrap();
    let (st, v) =
        s.execute(json!({"language": "python", "code": "print(1)", "memory": max_mem + 1}));
    assert_eq!((st, category(&v)), (400, "invalid_request"), "{v}");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("memory") && msg.contains("maximum"), "{msg}");
    assert_eq!(v["error"]["limit"], "memory");
    let (st, v) = s.execute(json!({"language": "python", "code": "print(1)", "timeout": 1e9}));
    assert_eq!(
        (st, v["error"]["limit"].as_str()),
        (400, Some("timeout")),
        "{v}"
    );
    // The same through the stream: refused before the 200.
    let res = client()
        .post(s.url("/v1/execute"))
        .header("accept", "text/event-stream")
        .json(&json!({"language": "python", "code": "", "pids": 1_000_000}))
        .send()
        .unwrap();
    let (st, v) = json_of(res);
    assert_eq!(
        (st, v["error"]["limit"].as_str()),
        (400, Some("pids")),
        "{v}"
    );
}

#[test]
fn oversized_malformed_and_mistyped_bodies() {
    let s = Server::start(&["--max-body", "1M"]);
    let big = json!({"language": "python", "code": "print(1)", "stdin": "x".repeat(2 << 20)});
    let (st, v) = s.execute(big);
    assert_eq!((st, category(&v)), (413, "payload_too_large"), "{v}");
    for body in [
        "{\"language\": \"python\", \"code\": ",
        "not json",
        r#"{"language": 3, "code": "print(1)"}"#,
        r#"{"language": "python", "code": "print(1)", "timeout": "soon"}"#,
        r#"{"language": "python", "code": "print(1)", "unknown": 1}"#,
    ] {
        let res = client()
            .post(s.url("/v1/execute"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .unwrap();
        let (st, v) = json_of(res);
        assert_eq!((st, category(&v)), (400, "invalid_request"), "{body}: {v}");
    }
    // Still serving.
    let (st, v) = s.execute(json!({"language": "bash", "code": "echo ok"}));
    assert_eq!((st, v["stdout"].as_str()), (200, Some("ok\n")));
}

#[test]
fn beyond_running_and_queued_is_429() {
    let s = Server::start(&["--max-concurrent", "1", "--max-queue", "0"]);
    let mut long =
        s.stream(json!({"language": "bash", "code": "echo started; sleep 1.5; echo done"}));
    long.until_stdout("started");
    let res = client()
        .post(s.url("/v1/execute"))
        .json(&json!({"language": "python", "code": "print(1)"}))
        .send()
        .unwrap();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let (st, v) = json_of(res);
    assert_eq!((st, category(&v)), (429, "rate_limited"), "{v}");
    assert_eq!(retry.as_deref(), Some("1"));
    let rest = long.rest();
    assert_eq!(rest.last().unwrap().1["stdout"], "started\ndone\n");
    // The slot is free again once the run is over.
    let (st, v) = s.execute(json!({"language": "python", "code": "print(1)"}));
    assert_eq!((st, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
}

#[test]
fn a_client_that_disconnects_kills_its_sandbox() {
    // No warm pool: the end of the test checks that no sandbox at all is left while the
    // server still runs.
    let s = Server::start(&["--pool", "python=0"]);
    // Streaming: dropped after the first chunk.
    let m = marker("sse");
    let mut events = s.stream(json!({
        "language": "bash",
        "code": format!("(exec -a {m} sleep 1000) & echo started; wait"),
    }));
    events.until_stdout("started");
    assert!(wait_for_marker(&m, START_WITHIN));
    drop(events);
    assert_marker_gone(&m, LOADED_MARGIN);

    // Plain request: the client gives up (its timeout) and closes the connection.
    let m = marker("plain");
    let url = s.url("/v1/execute");
    let code = format!("(exec -a {m} sleep 1000) & wait");
    let t = std::thread::spawn(move || {
        Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap()
            .post(url)
            .json(&json!({"language": "bash", "code": code}))
            .send()
            .is_err()
    });
    assert!(wait_for_marker(&m, START_WITHIN));
    assert!(t.join().unwrap(), "the request should have timed out");
    assert_marker_gone(&m, LOADED_MARGIN);
    // The server keeps serving, and nothing of the runs is left.
    let (st, _) = s.execute(json!({"language": "bash", "code": "true"}));
    assert_eq!(st, 200);
    let pid = s.pid();
    let deadline = Instant::now() + LOADED_MARGIN;
    while !common::cgroups_of(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_host_clean(pid);
}

#[test]
fn sigterm_lets_running_executions_finish() {
    /// How long the program runs after "started" (within the default 30 s grace).
    const RUN_SECS: Duration = Duration::from_secs(1);
    let mut s = Server::start(&[]);
    let mut events = s.stream(json!({
        "language": "bash",
        "code": format!("echo started; sleep {}; echo done", RUN_SECS.as_secs()),
    }));
    events.until_stdout("started");
    let pid = s.pid();
    let t = std::thread::spawn(move || events.rest());
    // The run is going ("started" arrived): terminate now, the grace period lets it finish.
    let status = s.terminate(RUN_SECS + LOADED_MARGIN);
    assert!(status.success(), "{status:?}: {}", s.log());
    let rest = t.join().unwrap();
    let (e, v) = rest.last().expect("a result");
    assert_eq!(e, "result");
    assert_eq!(v["stdout"], "started\ndone\n", "{v}");
    assert_eq!(v["exit_code"], 0);
    assert_host_clean(pid);
}

#[test]
fn sigterm_kills_what_outlives_the_grace_period() {
    const GRACE: Duration = Duration::from_millis(500);
    let mut s = Server::start(&["--shutdown-grace", &format!("{}ms", GRACE.as_millis())]);
    let m = marker("grace");
    let mut events = s.stream(json!({
        "language": "bash",
        "code": format!("(exec -a {m} sleep 1000) & echo started; wait"),
    }));
    events.until_stdout("started");
    let pid = s.pid();
    let started = Instant::now();
    let status = s.terminate(GRACE + LOADED_MARGIN);
    assert!(status.success(), "{status:?}: {}", s.log());
    assert!(
        started.elapsed() < GRACE + LOADED_MARGIN,
        "{:?}",
        started.elapsed()
    );
    let rest = events.rest();
    let (e, v) = rest.last().expect("a result");
    assert_eq!(e, "result", "{rest:?}");
    assert_ne!(category(v), "ok", "{v}");
    assert_marker_gone(&m, LOADED_MARGIN);
    assert_host_clean(pid);
}

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    runcell_core::to_hex(&sha2::Sha256::digest(data))
}

/// Flags win over environment variables, which win over the TOML file; the audit log has one
/// line per execution with the key's id and never the key or the code.
#[test]
fn config_file_environment_and_flags_and_the_audit_log() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let audit = dir.path().join("audit.jsonl");
    let config = dir.path().join("runcell.toml");
    std::fs::write(
        &config,
        format!(
            "audit_log = {audit:?}\n\
             [[api_keys]]\nid = \"team-a\"\nkey = \"file-key-0123456789\"\n\
             [limits.default]\ntimeout = 4\n\
             [limits.max]\ntimeout = \"5s\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cfg = config.to_str().unwrap();
    let run = |s: &Server, timeout: u64| {
        let res = client()
            .post(s.url("/v1/execute"))
            .header("x-api-key", "file-key-0123456789")
            .json(&json!({"language": "bash", "code": "echo audited", "timeout": timeout}))
            .send()
            .unwrap();
        json_of(res)
    };

    let s = Server::start(&["--config", cfg]);
    let (st, v) = client()
        .post(s.url("/v1/execute"))
        .header("x-api-key", "file-key-0123456789")
        .json(&json!({"language": "bash", "code": "echo audited"}))
        .send()
        .map(json_of)
        .unwrap();
    assert_eq!(
        (st, v["limits"]["timeout_ms"].as_u64()),
        (200, Some(4000)),
        "{v}"
    );
    assert_eq!(run(&s, 5).0, 200);
    let (st, v) = run(&s, 6);
    assert_eq!((st, category(&v)), (400, "invalid_request"), "{v}");
    assert_eq!(v["error"]["limit"], "timeout");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum of 5 s"),
        "{v}"
    );
    drop(s);

    let s = Server::start_env(&["--config", cfg], &[("RUNCELL_MAX_LIMITS", "timeout=8")]);
    assert_eq!(run(&s, 7).0, 200);
    let (st, v) = run(&s, 9);
    assert!(
        st == 400
            && v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("maximum of 8 s"),
        "{v}"
    );
    drop(s);

    let s = Server::start_env(
        &["--config", cfg, "--max-limit", "timeout=6"],
        &[("RUNCELL_MAX_LIMITS", "timeout=8")],
    );
    let (st, v) = run(&s, 7);
    assert!(
        st == 400
            && v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("maximum of 6 s"),
        "{v}"
    );
    let log = s.log();
    drop(s);
    assert!(
        !log.contains("file-key-0123456789"),
        "a key was logged: {log}"
    );
    assert!(log.contains("API keys: team-a"), "{log}");

    let text = std::fs::read_to_string(&audit).unwrap();
    assert!(
        !text.contains("file-key-0123456789") && !text.contains("echo audited"),
        "{text}"
    );
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines.len(),
        6,
        "one line per execution, refused ones included: {text}"
    );
    let sha = sha256_hex(b"echo audited");
    for l in &lines {
        assert_eq!(l["key_id"], "team-a", "{l}");
        assert_eq!(l["language"], "bash", "{l}");
        assert_eq!(l["code_sha256"], sha.as_str(), "{l}");
        assert_eq!(l["interface"], "http", "{l}");
        assert_eq!(l["request_id"].as_str().map(str::len), Some(32), "{l}");
        assert!(
            l["time"].is_string() && l["duration_seconds"].is_number(),
            "{l}"
        );
        assert!(l["peer"].as_str().unwrap().starts_with("127.0.0.1:"), "{l}");
    }
    let categories: Vec<&str> = lines
        .iter()
        .map(|l| l["category"].as_str().unwrap())
        .collect();
    assert_eq!(
        categories,
        [
            "ok",
            "ok",
            "invalid_request",
            "ok",
            "invalid_request",
            "invalid_request"
        ]
    );
    assert_eq!(lines[0]["exit_code"], 0);
    assert_eq!(lines[0]["limits"]["timeout_ms"], 4000);
    assert!(lines[2]["exit_code"].is_null());
}

#[test]
fn serve_help_documents_every_setting() {
    let out = Command::new(runcell_bin())
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "--config",
        "RUNCELL_CONFIG",
        "--listen",
        "RUNCELL_LISTEN",
        "--api-key",
        "RUNCELL_API_KEY",
        "--max-concurrent",
        "--max-queue",
        "--max-body",
        "--shutdown-grace",
        "--default-limit",
        "RUNCELL_DEFAULT_LIMITS",
        "--max-limit",
        "RUNCELL_MAX_LIMITS",
        "--cap",
        "--audit-log",
        "RUNCELL_AUDIT_LOG",
        "--strict",
        "TOML",
        "[limits.max]",
        "[[api_keys]]",
    ] {
        assert!(
            help.contains(needle),
            "serve --help lacks {needle}:\n{help}"
        );
    }
}

/// A verdict waiting for a client that does not read it keeps its place in line until it is
/// delivered: otherwise each such client leaves a response of up to the output caps in the
/// server's memory and frees its slot for the next one, without bound.
#[test]
fn an_undelivered_response_keeps_its_place_in_line() {
    use std::io::Write;
    let s = Server::start(&["--max-concurrent", "1", "--max-queue", "0"]);
    // 48 MiB of output: far more than the sockets' buffers hold.
    let body = json!({
        "language": "bash",
        "code": "head -c 50331648 /dev/zero | tr '\\0' x",
        "output": "64M",
    })
    .to_string();
    let addr = s.base.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    write!(
        conn,
        "POST /v1/execute HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    // The run ends (it is counted) while its response waits for the client.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let text = client()
            .get(s.url("/metrics"))
            .send()
            .unwrap()
            .text()
            .unwrap();
        if text.contains(
            "runcell_executions_total{language=\"bash\",category=\"ok\",interface=\"http\"} 1",
        ) {
            break;
        }
        assert!(Instant::now() < deadline, "the run did not end: {text}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (st, v) = s.execute(json!({"language": "bash", "code": "true"}));
    assert_eq!((st, category(&v)), (429, "rate_limited"), "{v}");
    // Once the client has read its response, the place is free.
    let mut response = Vec::new();
    conn.read_to_end(&mut response).unwrap();
    assert!(response.starts_with(b"HTTP/1.1 200"));
    assert!(response.len() > 48 << 20, "{}", response.len());
    let (st, v) = s.execute(json!({"language": "bash", "code": "echo ok"}));
    assert_eq!((st, v["stdout"].as_str()), (200, Some("ok\n")), "{v}");
}

/// Opening a connection needs no key and each one holds a descriptor of the server: a client
/// that opens hundreds and sends half a request head must not starve the others (before the
/// fix, 1,100 such connections under `ulimit -n 1024` starved authenticated calls). They are
/// capped per address and in total, and one that has not carried an authenticated request is
/// closed after a short grace, while an authenticated keep-alive connection stays.
#[test]
fn idle_half_sent_connections_do_not_starve_authenticated_calls() {
    use std::io::Write;
    use std::net::TcpStream;
    const KEY: &str = "connections-test-key-0123456789";
    /// runcell_server::connections::UNAUTHENTICATED_GRACE.
    const GRACE: Duration = Duration::from_secs(10);
    let s = Server::start_env(
        &[
            "--max-connections",
            "64",
            "--max-connections-per-peer",
            "16",
        ],
        &[("RUNCELL_API_KEY", KEY)],
    );
    let addr = format!("127.0.0.1:{}", s.port());
    let keyed_request =
        format!("GET /v1/runtimes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n\r\n");
    // An authenticated keep-alive connection, from the same address as the attack.
    let mut keyed = TcpStream::connect(&addr).unwrap();
    keyed.write_all(keyed_request.as_bytes()).unwrap();
    let read_response = |c: &mut TcpStream| -> String {
        c.set_read_timeout(Some(START_WITHIN)).unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        // Until the head and the body announced by Content-Length are in.
        loop {
            let n = c.read(&mut buf).expect("a response");
            assert!(n > 0, "closed: {}", String::from_utf8_lossy(&got));
            got.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&got).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length: "))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if body.len() >= len {
                    return head.to_string();
                }
            }
        }
    };
    assert!(read_response(&mut keyed).starts_with("HTTP/1.1 200"));
    // 200 connections that send half a request head and wait.
    let mut attack = Vec::new();
    for _ in 0..200 {
        let mut c = TcpStream::connect(&addr).unwrap();
        let _ = c.write_all(b"POST /v1/execute HTTP/1.1\r\nHost: x\r\n");
        attack.push(c);
    }
    // Calls from another address still get through, at once.
    let other = Client::builder()
        .local_address("127.0.0.2".parse::<std::net::IpAddr>().unwrap())
        .timeout(START_WITHIN)
        .build()
        .unwrap();
    let res = other
        .get(s.url("/v1/runtimes"))
        .bearer_auth(KEY)
        .send()
        .expect("an authenticated call from another address is served");
    assert_eq!(res.status(), 200);
    // Beyond the per-address cap the attack's connections were closed at once; the rest are
    // closed when the grace is over.
    let mut buf = [0u8; 1024];
    let mut open = Vec::new();
    for mut c in attack {
        c.set_nonblocking(true).unwrap();
        match c.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => open.push(c),
            _ => {} // closed (EOF or reset)
        }
    }
    // The keyed connection counts against the address too.
    assert!(open.len() <= 15, "{} attack connections kept", open.len());
    let started = Instant::now();
    for mut c in open {
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(GRACE + LOADED_MARGIN)).unwrap();
        let closed = matches!(c.read(&mut buf), Ok(0) | Err(_));
        assert!(
            closed,
            "a half-sent connection was kept open past the grace"
        );
    }
    assert!(started.elapsed() < GRACE + LOADED_MARGIN);
    // The authenticated connection outlived the grace and still serves.
    keyed.write_all(keyed_request.as_bytes()).unwrap();
    assert!(read_response(&mut keyed).starts_with("HTTP/1.1 200"));
    let metrics = other
        .get(s.url("/metrics"))
        .bearer_auth(KEY)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains(r#"runcell_rejections_total{reason="too_many_connections_from_peer"}"#),
        "{metrics}"
    );
}

/// The output cap counts the output as it is delivered: before, a program that wrote control
/// bytes made the server hold (and send) six times the cap, each byte escaped as `\u0001`.
/// The verdict's JSON for a 64 KiB cap now stays within it, whatever the program writes.
#[test]
fn the_output_cap_bounds_the_delivered_size() {
    let s = Server::start(&[]);
    for (what, code) in [
        (
            "control bytes",
            "import sys; sys.stdout.buffer.write(b'\\x01' * (1 << 20))",
        ),
        (
            "invalid UTF-8",
            "import sys; sys.stdout.buffer.write(b'\\xff' * (1 << 20))",
        ),
        ("quotes", "import sys; sys.stdout.write('\"' * (1 << 20))"),
    ] {
        let res = client()
            .post(s.url("/v1/execute"))
            .json(&json!({"language": "python", "code": code, "output": "64K"}))
            .send()
            .expect("request");
        assert_eq!(res.status(), 200, "{what}");
        let body = res.bytes().unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["stdout_truncated"], true, "{what}");
        assert_eq!(v["error"]["category"], "output_limit", "{what}");
        let stdout_json = serde_json::to_string(&v["stdout"]).unwrap().len() - 2;
        assert!(
            stdout_json <= 64 << 10,
            "{what}: {stdout_json} bytes delivered"
        );
        assert!(
            stdout_json > 60 << 10,
            "{what}: the cap is used: {stdout_json}"
        );
        assert!(
            body.len() < (64 << 10) + 8192,
            "{what}: a {} byte body",
            body.len()
        );
    }
}

/// `kill -9` of the server mid-run: no process of the sandbox survives it (each sandbox's
/// helper dies with its supervisor's lifeline), and the next server sweeps the cgroups left.
#[test]
fn killing_the_server_mid_run_leaves_nothing_behind() {
    let tag = common::unique_digits();
    let mut s = Server::start(&[]);
    let pid = s.pid();
    let url = s.url("/v1/execute");
    let code = format!("import os\nos.execvp('sleep', ['sleep', '1000.{tag}'])");
    let request = std::thread::spawn(move || {
        let _ = client()
            .post(url)
            .json(&json!({"language": "python", "code": code, "timeout": 60}))
            .send();
    });
    assert!(
        wait_for_marker(&tag, START_WITHIN),
        "the program never ran (test is void)"
    );
    assert!(!common::cgroups_of(pid).is_empty(), "the run has cgroups");
    // The helper, the sandbox's pid 1 and the program.
    let procs = common::sandbox_processes_of(pid);
    assert!(procs.len() >= 3, "the run's processes: {procs:?}");
    s.child.kill().expect("SIGKILL runcell serve");
    s.child.wait().expect("reap runcell serve");
    assert_marker_gone(&tag, LOADED_MARGIN);
    common::assert_processes_gone(&procs, LOADED_MARGIN);
    request.join().unwrap();
    // The next server, at its first run, removes what the killed one left.
    let next = Server::start(&[]);
    let (status, v) = next.execute(json!({"language": "bash", "code": "true"}));
    assert_eq!(status, 200, "{v}");
    let deadline = Instant::now() + LOADED_MARGIN;
    while !common::cgroups_of(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        common::cgroups_of(pid),
        Vec::<std::path::PathBuf>::new(),
        "stale cgroups of the killed server"
    );
}

/// A keyless server started with `args` that has run `code` once, so that its counters have
/// samples.
fn server_after_one_run(args: &[&str], language: &str, code: &str) -> common::ServeProcess {
    let s = common::ServeProcess::start(args, &[]);
    let (status, v) = json_of(
        client()
            .post(s.url("/v1/execute"))
            .json(&json!({"language": language, "code": code}))
            .send()
            .unwrap(),
    );
    assert_eq!(status, 200, "{v:#}");
    s
}

/// `/metrics` as Prometheus' own tools read it: `promtool check metrics` passes on the classic
/// format (every counter's HELP and TYPE naming its `_total` samples).
#[test]
#[cfg_attr(
    not(host_promtool),
    ignore = "needs promtool (Debian's prometheus; scripts/test.sh installs it)"
)]
fn metrics_pass_promtool() {
    let s = server_after_one_run(&["--pool", "python=1"], "python", "print(1)");
    let text = client()
        .get(s.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool: {}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The outside of the server as its users' own tools read it: the served OpenAPI document
/// passes `openapi-spec-validator` (warnings are failures), and `/metrics` parses with
/// Prometheus' Python parsers, classic and OpenMetrics, into typed families only (a `TYPE`
/// line that does not name its samples leaves them "unknown").
#[test]
#[cfg_attr(
    not(host_validators),
    ignore = "needs openapi-spec-validator and prometheus_client (scripts/test.sh installs them in target/validators-venv)"
)]
fn openapi_and_metrics_pass_their_users_validators() {
    let s = server_after_one_run(&[], "bash", "echo hi");
    let dir = tempfile::tempdir().unwrap();
    let fetch = |path: &str, accept: &str, file: &str| {
        let res = client()
            .get(s.url(path))
            .header("accept", accept)
            .send()
            .unwrap();
        assert_eq!(res.status(), 200, "{path}");
        std::fs::write(dir.path().join(file), res.text().unwrap()).unwrap();
    };
    fetch("/openapi.json", "application/json", "openapi.json");
    fetch("/metrics", "text/plain;version=0.0.4", "classic.txt");
    fetch(
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
        "openmetrics.txt",
    );
    let script = r#"
import json, sys, warnings
warnings.simplefilter("error")
from openapi_spec_validator import validate
from prometheus_client.parser import text_string_to_metric_families as classic
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics
d = sys.argv[1]
validate(json.load(open(d + "/openapi.json")))
for name, parse in (("classic.txt", classic), ("openmetrics.txt", openmetrics)):
    families = list(parse(open(d + "/" + name).read()))
    untyped = [f.name for f in families if f.type in ("unknown", "untyped")]
    assert not untyped, (name, untyped)
    names = {f.name for f in families}
    for want in ("runcell_executions", "runcell_build_info", "process_cpu_seconds"):
        assert want in names, (name, want, sorted(names))
print("ok")
"#;
    let venv = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../target/validators-venv/bin/python");
    let out = Command::new(venv)
        .args(["-c", script])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
