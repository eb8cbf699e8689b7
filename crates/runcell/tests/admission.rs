//! The one run service's admission (issue 21), seen from outside through `runcell serve`:
//! every route that carries a body takes its place in line before reading it, a route that
//! names a session checks it before reading, and a key holds at most its share of the line.
//!
//! Before issue 21, `POST /v1/sessions`, `POST /v1/agents` and `PUT /v1/sessions/{id}/files/...`
//! read whole bodies before any place in line (50 bodies of 100 MiB took the server to about
//! 5 GiB), the PUT even before checking that its session existed. These tests send the head
//! of a large request and none of its body: a server that reads first would wait for the
//! body; one that admits first answers at once. (The memory figures are in
//! `benches/bodies.py`.)

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use common::ServeProcess;
use serde_json::Value;

const KEY_A: &str = "admission-key-a-0123456789";
const KEY_B: &str = "admission-key-b-0123456789";

/// How long an answer that needs no body may take: far below the server's 30 s body
/// deadline (a server that waited for the body would answer 408 only then), and generous for
/// a loaded machine.
const ANSWER_WITHIN: Duration = Duration::from_secs(20);

/// Send the head of a request announcing `length` bytes of body, and `sent` bytes of it.
fn open_request(s: &ServeProcess, method: &str, path: &str, length: u64, sent: usize) -> TcpStream {
    let mut c = TcpStream::connect(s.base.trim_start_matches("http://")).unwrap();
    write!(
        c,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {KEY_A}\r\n\
         Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
    )
    .unwrap();
    c.write_all(&vec![b' '; sent]).unwrap();
    c.flush().unwrap();
    c
}

/// The status and JSON body of the answer on `c`, which must come within [`ANSWER_WITHIN`].
fn answer(mut c: TcpStream) -> (u16, Value) {
    c.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match c.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf);
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break;
                    }
                }
            }
            Err(e) => panic!(
                "no answer within {ANSWER_WITHIN:?} ({e}): the server is waiting for the body; \
                 got so far: {}",
                String::from_utf8_lossy(&buf)
            ),
        }
    }
    let text = String::from_utf8_lossy(&buf).to_string();
    let (head, body) = text.split_once("\r\n\r\n").expect("an HTTP answer");
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

/// Hold `n` places with requests whose bodies trickle, until a small request is refused
/// (429): the state the tests start from. A probe may take a place before a holder's head is
/// read, and the holder then be refused: a holder that got an answer is opened again. Returns
/// the holders and the refusal (tried for 20 s, within the holders' own 30 s body deadline:
/// hang protection only).
fn hold_places(s: &ServeProcess, n: usize) -> (Vec<TcpStream>, Value) {
    let open = || open_request(s, "POST", "/v1/execute", 1000, 10);
    let answered = |c: &TcpStream| {
        c.set_nonblocking(true).unwrap();
        let got = c.peek(&mut [0u8; 1]);
        c.set_nonblocking(false).unwrap();
        !matches!(got, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
    };
    let mut held: Vec<TcpStream> = (0..n).map(|_| open()).collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (st, v) = answer(open_request(s, "POST", "/v1/execute", 10, 10));
        if st == 429 && !held.iter().any(answered) {
            return (held, v);
        }
        for h in held.iter_mut().filter(|h| answered(h)) {
            *h = open();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the holders never took their places: {st} {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Regression (issue 21): with the line full, every route that carries a body answers 429 at
/// once instead of reading the body first.
#[test]
fn bodies_wait_for_a_place_in_line_on_every_route() {
    // One place in line, and one key (so that the place is all the server's).
    let s = ServeProcess::start(
        &[
            "--api-key",
            KEY_A,
            "--max-concurrent",
            "1",
            "--max-queue",
            "0",
            "--pool",
            "python=0",
            "--agent-upstream",
            "openai",
            "--agent-base-url",
            "http://127.0.0.1:9/v1",
            "--agent-model",
            "m",
        ],
        &[],
    );
    // The one place: a request whose body trickles (it holds its place while it arrives).
    let (holder, v) = hold_places(&s, 1);
    assert_eq!(v["error"]["category"], "rate_limited", "{v}");
    // 50 MiB announced, none of it sent: each route refuses at once.
    let big = 50 << 20;
    for (method, path) in [
        ("POST", "/v1/sessions"),
        ("POST", "/v1/agents"),
        ("POST", "/v1/agents/chat/completions"),
        ("POST", "/v1/sessions/ses_0123456789abcdef/execute"),
        ("PUT", "/v1/sessions/ses_0123456789abcdef/files/data.csv"),
        ("GET", "/v1/sessions/ses_0123456789abcdef/files/data.csv"),
    ] {
        let (st, v) = answer(open_request(&s, method, path, big, 0));
        assert_eq!(st, 429, "{method} {path}: {v}");
        assert_eq!(
            v["error"]["category"], "rate_limited",
            "{method} {path}: {v}"
        );
    }
    drop(holder);
}

/// Regression (issue 21): a PUT of a file into a session that does not exist (or is another
/// key's) read its whole body before the session was looked up; it is refused first.
#[test]
fn a_put_to_a_missing_session_is_refused_before_its_body() {
    let s = ServeProcess::start(&["--api-key", KEY_A, "--pool", "python=0"], &[]);
    let c = open_request(
        &s,
        "PUT",
        "/v1/sessions/ses_0123456789abcdef0123456789abcdef/files/big.bin",
        30 << 20,
        0,
    );
    let (st, v) = answer(c);
    assert_eq!(st, 404, "{v}");
    assert_eq!(v["error"]["category"], "not_found", "{v}");
}

/// A key holds at most its share of the line (half of it with two keys), so that one key
/// cannot fill the queue for another; with one key, all of it.
#[test]
fn one_key_holds_at_most_its_share_of_the_line() {
    let s = ServeProcess::start(
        &[
            "--api-key",
            KEY_A,
            "--api-key",
            KEY_B,
            "--max-concurrent",
            "1",
            "--max-queue",
            "3",
            "--pool",
            "python=0",
        ],
        &[],
    );
    // Key A's two places (half of four), each held by a body that trickles.
    let (held, v) = hold_places(&s, 2);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("share"),
        "key A is refused for its share, not a full server: {v}"
    );
    // Key B runs all the same.
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/execute"))
        .header("authorization", format!("Bearer {KEY_B}"))
        .json(&serde_json::json!({"language": "bash", "code": "echo b"}))
        .timeout(Duration::from_secs(120))
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let v: Value = res.json().unwrap();
    assert_eq!(v["stdout"], "b\n", "{v}");
    drop(held);
}

/// Regression (issue 21): one peer could hold thousands of connections (a quarter of the
/// raised open-files limit). By default a peer gets what it can use of the server: four
/// connections per place in line, at least 64; the ones beyond are closed at once and counted.
#[test]
fn one_peer_holds_only_what_it_can_use_of_the_server() {
    // Ten places: the default cap per peer is 64.
    let s = ServeProcess::start(
        &[
            "--api-key",
            KEY_A,
            "--max-concurrent",
            "2",
            "--max-queue",
            "8",
            "--pool",
            "python=0",
        ],
        &[],
    );
    let addr = s.base.trim_start_matches("http://").to_string();
    let start = std::time::Instant::now();
    let held: Vec<TcpStream> = (0..100)
        .map(|_| {
            let c = TcpStream::connect(&addr).unwrap();
            c.set_nonblocking(true).unwrap();
            c
        })
        .collect();
    // All 100 are open at once: the server keeps 64 and closes the others as it accepts them.
    // (It closes the kept ones too, after 10 s without an authenticated request.)
    let closed = || {
        held.iter()
            .filter(|c| match (&**c).read(&mut [0u8; 1]) {
                Ok(_) => true,
                Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
            })
            .count()
    };
    let deadline = start + Duration::from_secs(20);
    while closed() < 36 {
        assert!(
            std::time::Instant::now() < deadline,
            "the connections beyond the peer's 64 were not closed: {} of 100",
            closed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // None of the 64 within the cap is closed: the refusals are at accept, long done. (A
    // machine so slow that this is seen after the kept ones' 10 s cannot tell.)
    std::thread::sleep(Duration::from_millis(500));
    let now_closed = closed();
    if start.elapsed() < Duration::from_secs(9) {
        assert_eq!(now_closed, 36, "a peer keeps 64 connections");
    } else {
        eprintln!("too slow to count the kept connections ({now_closed} closed)");
    }
    drop(held);
    // The server counts each refusal as it closes the connection; the counter is read once the
    // held ones are gone (hang protection only).
    let refused = |text: &str| -> u64 {
        text.lines()
            .find(|l| {
                l.starts_with("runcell_rejections_total{reason=\"too_many_connections_from_peer\"}")
            })
            .and_then(|l| l.split_whitespace().last())
            .and_then(|v| v.parse::<f64>().ok())
            .map_or(0, |v| v as u64)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let res = reqwest::blocking::Client::new()
            .get(s.url("/metrics"))
            .header("authorization", format!("Bearer {KEY_A}"))
            .send();
        if let Ok(res) = res {
            if res.status().as_u16() == 200 {
                let n = refused(&res.text().unwrap());
                // (At least: a metrics request made before the server saw the held ones
                // close is refused and counted too.)
                if n >= 36 {
                    break;
                }
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refusals were not counted"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Regression (review of issue 21): a body's bytes were held against the body budget, but not
/// what parsing it builds: `[0,0,...]` is two bytes a value and tens of bytes once parsed, so
/// a key's share of the budget in such bodies could take 16 to 32 times that in memory. Every
/// JSON door now holds the parse's cost before parsing; a body whose parse alone exceeds the
/// budget is 413, while a body of the same size in one long string is a run as before.
#[test]
fn a_body_is_charged_for_what_parsing_it_builds() {
    // A 1 MiB body cap: a 10 MiB body budget.
    let s = ServeProcess::start(
        &["--api-key", KEY_A, "--max-body", "1M", "--pool", "python=0"],
        &[],
    );
    let client = reqwest::blocking::Client::new();
    let zeros = format!("[{}0]", "0,".repeat(450_000));
    let post = |path: &str, body: String| {
        // (MCP answers JSON or an event stream; the others JSON.)
        let accept = if path == "/mcp" {
            "application/json, text/event-stream"
        } else {
            "application/json"
        };
        let res = client
            .post(s.url(path))
            .header("authorization", format!("Bearer {KEY_A}"))
            .header("content-type", "application/json")
            .header("accept", accept)
            .body(body)
            .send()
            .unwrap();
        let status = res.status().as_u16();
        (status, res.json::<Value>().unwrap_or(Value::Null))
    };
    let requests = [
        (
            "/v1/execute",
            format!(r#"{{"language":"python","code":"1","packages":{zeros}}}"#),
        ),
        (
            "/v1/sessions",
            format!(r#"{{"language":"python","packages":{zeros}}}"#),
        ),
        (
            "/mcp",
            format!(
                r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"execute_code","arguments":{{"language":"python","code":"1","x":{zeros}}}}}}}"#
            ),
        ),
    ];
    for (path, body) in requests {
        assert!(body.len() < 1 << 20, "within the body cap");
        let (status, v) = post(path, body);
        assert_eq!(status, 413, "{path}: {v}");
        assert_eq!(v["error"]["category"], "payload_too_large", "{path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("too many JSON values"),
            "{path}: {v}"
        );
    }
    // The same size in one string is charged its bytes: it runs.
    let text = "x".repeat(900_000);
    let (status, v) = post(
        "/v1/execute",
        format!(r#"{{"language":"python","code":"s = '{text}'\nprint(len(s))"}}"#),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "900000\n", "{v}");
}
