//! `runcell serve` over real HTTP on loopback: auth, every language, files, streaming, limits,
//! body cap, malformed input, 429, client disconnects and graceful shutdown. Each test starts
//! its own server (as a child process, `--listen 127.0.0.1:0`, the port read from its log).

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Command, Stdio};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use common::{assert_host_clean, assert_marker_gone, marker, runcell_bin, wait_for_marker};
use reqwest::blocking::{Client, Response};
use serde_json::{json, Value};

struct Server {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Server {
    fn start(args: &[&str]) -> Server {
        Server::start_env(args, &[])
    }

    fn start_env(args: &[&str], env: &[(&str, &str)]) -> Server {
        let mut cmd = Command::new(runcell_bin());
        cmd.args(["serve", "--listen", "127.0.0.1:0"])
            .args(args)
            .env_remove("RUNCELL_API_KEY")
            .env_remove("RUNCELL_LISTEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("start runcell serve");
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let log2 = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    let addr = rest.split_whitespace().next().unwrap_or("").to_string();
                    let _ = tx.send(addr);
                }
                log2.lock().unwrap().push_str(&(line + "\n"));
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(10))
            .unwrap_or_else(|_| panic!("server did not start: {}", log.lock().unwrap()));
        Server {
            child,
            base: format!("http://{addr}"),
            log,
        }
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
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

    /// SIGTERM, then the exit status (within `within`).
    fn terminate(&mut self, within: Duration) -> std::process::ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok);
        let deadline = Instant::now() + within;
        loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "server did not exit: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let log = self.log();
        assert!(!log.contains("panicked"), "the server panicked: {log}");
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
    let s = Server::start_env(&["--api-key", "cli-key"], &[("RUNCELL_API_KEY", "ignored")]);
    let c = client();
    let res = c.get(s.url("/healthz")).send().unwrap();
    assert_eq!(json_of(res), (200, json!({"status": "ok"})));

    let body = json!({"language": "python", "code": "print(1)"});
    let (st, v) = json_of(c.post(s.url("/v1/execute")).json(&body).send().unwrap());
    assert_eq!((st, category(&v)), (401, "unauthorized"), "{v}");
    for wrong in [
        "Bearer nope",
        "Bearer cli-keyx",
        "Bearer ignored",
        "cli-key",
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
        .header("authorization", "Bearer cli-key")
        .json(&body)
        .send()
        .unwrap();
    let (st, v) = json_of(res);
    assert_eq!((st, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
    let res = c
        .get(s.url("/v1/runtimes"))
        .header("x-api-key", "cli-key")
        .send()
        .unwrap();
    assert_eq!(json_of(res).0, 200);
    assert!(
        !s.log().contains("cli-key"),
        "a key was logged: {}",
        s.log()
    );

    // Keys from the environment, comma-separated.
    let s = Server::start_env(&[], &[("RUNCELL_API_KEY", "env-a,env-b")]);
    for (h, k) in [("x-api-key", "env-b"), ("authorization", "Bearer env-a")] {
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
    assert_eq!(v["limits"]["timeout_ms"], 10_000);
    assert_eq!(v["limits"]["memory_bytes"], 128 << 20);
    // A failing program is still a 200: it is the program's outcome.
    let (st, v) = s.execute(json!({"language": "bash", "code": "echo oops >&2; exit 3"}));
    assert_eq!((st, category(&v)), (200, "runtime_error"), "{v}");
    assert_eq!(v["exit_code"], 3);
    assert_eq!(v["stderr"], "oops\n");
    let (st, v) = s.execute(json!({"language": "bash", "code": "sleep 5", "timeout": 0.3}));
    assert_eq!((st, category(&v)), (200, "timeout"), "{v}");
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
    let (e, d) = events.next().expect("first event");
    let first_at = started.elapsed();
    assert_eq!(
        (e.as_str(), d["text"].as_str()),
        ("stdout", Some("first\n"))
    );
    let rest = events.rest();
    let end_at = started.elapsed();
    assert!(
        end_at - first_at >= Duration::from_millis(700),
        "the first chunk came {first_at:?}, the end {end_at:?}: not streamed"
    );
    let names: Vec<&str> = rest.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["stderr", "stdout", "result"], "{rest:?}");
    assert_eq!(rest[0].1["text"], "warn\n");
    assert_eq!(rest[1].1["text"], "second\n");
    let verdict = &rest[2].1;
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
    let s = Server::start(&[]);
    // Streaming: dropped after the first chunk.
    let m = marker("sse");
    let mut events = s.stream(json!({
        "language": "bash",
        "code": format!("(exec -a {m} sleep 1000) & echo started; wait"),
    }));
    events.until_stdout("started");
    assert!(wait_for_marker(&m, Duration::from_secs(5)));
    drop(events);
    assert_marker_gone(&m, Duration::from_secs(5));

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
    assert!(wait_for_marker(&m, Duration::from_secs(5)));
    assert!(t.join().unwrap(), "the request should have timed out");
    assert_marker_gone(&m, Duration::from_secs(5));
    // The server keeps serving, and nothing of the runs is left.
    let (st, _) = s.execute(json!({"language": "bash", "code": "true"}));
    assert_eq!(st, 200);
    let pid = s.pid();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !common::cgroups_of(pid).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_host_clean(pid);
}

#[test]
fn sigterm_lets_running_executions_finish() {
    let mut s = Server::start(&[]);
    let mut events =
        s.stream(json!({"language": "bash", "code": "echo started; sleep 1; echo done"}));
    events.until_stdout("started");
    let pid = s.pid();
    let t = std::thread::spawn(move || events.rest());
    std::thread::sleep(Duration::from_millis(100));
    let status = s.terminate(Duration::from_secs(10));
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
    let mut s = Server::start(&["--shutdown-grace", "500ms"]);
    let m = marker("grace");
    let mut events = s.stream(json!({
        "language": "bash",
        "code": format!("(exec -a {m} sleep 1000) & echo started; wait"),
    }));
    events.until_stdout("started");
    let pid = s.pid();
    let started = Instant::now();
    let status = s.terminate(Duration::from_secs(10));
    assert!(status.success(), "{status:?}: {}", s.log());
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let rest = events.rest();
    let (e, v) = rest.last().expect("a result");
    assert_eq!(e, "result", "{rest:?}");
    assert_ne!(category(v), "ok", "{v}");
    assert_marker_gone(&m, Duration::from_secs(5));
    assert_host_clean(pid);
}
