//! Network by permission (issue 13): a run that asks for destinations reaches them, and only
//! them, through runcell's egress proxy. The destination here is a small HTTP server on the
//! host's 127.0.0.2 (which the sandbox's own NO_PROXY does not cover), allowed by naming the
//! address and port literally, as a loopback address must be. Nothing reaches the internet.

mod common;
use common::*;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// A host HTTP server on 127.0.0.2: every request is answered `hello from the host` (or, for
/// `/big`, 1 MiB of zeros). Counts the connections it accepted.
struct HostServer {
    port: u16,
    accepted: Arc<AtomicU32>,
}

impl HostServer {
    fn start() -> HostServer {
        let l = TcpListener::bind("127.0.0.2:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let accepted = Arc::new(AtomicU32::new(0));
        let a = accepted.clone();
        std::thread::spawn(move || {
            for s in l.incoming() {
                let Ok(mut s) = s else { continue };
                a.fetch_add(1, Ordering::SeqCst);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    let mut got = Vec::new();
                    while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                        match s.read(&mut buf) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => got.extend_from_slice(&buf[..n]),
                        }
                    }
                    let body: Vec<u8> = if got.starts_with(b"GET /big") {
                        vec![0u8; 1 << 20]
                    } else {
                        b"hello from the host\n".to_vec()
                    };
                    let _ = write!(
                        s,
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(&body);
                });
            }
        });
        HostServer { port, accepted }
    }

    fn entry(&self) -> String {
        format!("127.0.0.2:{}", self.port)
    }

    fn url(&self, path: &str) -> String {
        format!("http://127.0.0.2:{}{path}", self.port)
    }
}

fn connections(r: &Run) -> Vec<serde_json::Value> {
    r.verdict["network"]["connections"]
        .as_array()
        .unwrap_or_else(|| panic!("no network report: {:#}", r.verdict))
        .clone()
}

#[test]
fn an_allowed_host_is_reached_by_python_and_curl_and_recorded() {
    let srv = HostServer::start();
    let allow = srv.entry();
    let r = run(
        "python",
        &format!(
            "import urllib.request\nprint(urllib.request.urlopen({:?}, timeout=10).read().decode().strip())",
            srv.url("/")
        ),
        &["--allow-net", &allow],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "hello from the host\n");
    let c = connections(&r);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["host"], "127.0.0.2");
    assert_eq!(c[0]["port"], srv.port);
    assert_eq!(c[0]["allowed"], true);
    assert_eq!(c[0]["address"], "127.0.0.2");
    assert!(c[0]["bytes_out"].as_u64().unwrap() > 0 && c[0]["bytes_in"].as_u64().unwrap() > 0);

    // curl: a plain request (absolute URI) and a CONNECT tunnel (-p).
    let r = run(
        "bash",
        &format!("curl -sS {u}; curl -sS -p {u}", u = srv.url("/")),
        &["--allow-net", &allow],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "hello from the host\nhello from the host\n");
    assert_eq!(connections(&r).len(), 2);

    assert!(srv.accepted.load(Ordering::SeqCst) >= 3);
}

/// Node's http and fetch ignore HTTP_PROXY themselves: runcell's preloaded module sends them
/// through the proxy.
#[test]
#[cfg_attr(not(host_node), ignore = "needs node")]
fn node_http_and_fetch_go_through_the_proxy() {
    let srv = HostServer::start();
    let allow = srv.entry();
    let r = run(
        "node",
        &format!(
            r#"const http = require("http");
http.get({u:?}, (res) => {{ let d = ""; res.on("data", (c) => d += c); res.on("end", async () => {{
  console.log("http " + d.trim());
  const f = await fetch({u:?});
  console.log("fetch " + (await f.text()).trim());
  try {{ await fetch("https://example.com/"); }} catch (e) {{ console.log("refused " + e.cause.code); }}
}}); }});"#,
            u = srv.url("/")
        ),
        &["--allow-net", &allow],
    );
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "http hello from the host\nfetch hello from the host\nrefused ERUNCELL_REFUSED\n"
    );
    assert_eq!(connections(&r).len(), 3);
}

#[test]
fn what_is_not_allowed_is_refused_with_a_message_the_code_sees() {
    let srv = HostServer::start();
    let before = srv.accepted.load(Ordering::SeqCst);
    let r = run(
        "python",
        &format!(
            r#"
import socket, urllib.request, urllib.error
def get(url):
    try:
        urllib.request.urlopen(url, timeout=10)
        return "OK"
    except urllib.error.HTTPError as e:
        return "%d %s" % (e.code, e.reason)
    except Exception as e:
        return "ERR %s" % e
print("other=" + get("http://example.com/"))
print("tls=" + get("https://example.com/"))
# (With the final dot the name is not the sandbox's own "localhost" of NO_PROXY: it goes to
# the proxy, which resolves it to the host's loopback.)
print("name_to_loopback=" + get("http://localhost.:{port}/"))
print("metadata=" + get("http://169.254.169.254/latest/meta-data/"))
print("other_port=" + get("http://127.0.0.2:{other}/"))
def direct(host, port):
    try:
        socket.create_connection((host, port), timeout=3)
        return "CONNECTED"
    except OSError as e:
        return type(e).__name__
print("direct_host=" + direct("127.0.0.2", {port}))
print("direct_world=" + direct("1.1.1.1", 443))
try:
    socket.getaddrinfo("example.com", 80)
    print("dns=RESOLVED")
except socket.gaierror:
    print("dns=GAIERROR")
"#,
            port = srv.port,
            other = srv.port.wrapping_add(1).max(1)
        ),
        &[
            "--allow-net",
            &srv.entry(),
            "--allow-net",
            &format!("localhost:{}", srv.port),
            "--allow-net",
            "169.254.169.254",
        ],
    );
    r.assert_ok();
    let out = r.stdout();
    let line = |k: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap_or_else(|| panic!("no {k} in {out}"))
            .to_string()
    };
    assert!(
        line("other").starts_with(
            "403 runcell refused: example.com:80 is not on this run's network allowlist"
        ),
        "{out}"
    );
    assert!(line("tls").contains("403"), "{out}");
    assert!(
        line("name_to_loopback").contains("a name never grants such an address"),
        "{out}"
    );
    assert!(
        line("metadata").contains("the cloud metadata service"),
        "{out}"
    );
    assert!(
        line("other_port").contains("not on this run's network allowlist"),
        "{out}"
    );
    assert_eq!(line("direct_host"), "ConnectionRefusedError", "{out}");
    assert_eq!(line("direct_world"), "OSError", "{out}");
    assert_eq!(line("dns"), "GAIERROR", "{out}");
    let c = connections(&r);
    assert_eq!(c.len(), 5, "{c:?}");
    assert!(
        c.iter()
            .all(|c| c["allowed"] == false && c["reason"].is_string()),
        "{c:?}"
    );
    assert_eq!(
        srv.accepted.load(Ordering::SeqCst),
        before,
        "the host server was reached"
    );
}

#[test]
fn a_network_entry_that_is_not_an_entry_is_an_invalid_request() {
    let r = run(
        "python",
        "print(1)",
        &["--allow-net", "http://example.com/x"],
    );
    r.assert_category("invalid_request");
    assert!(r.message().contains("not a URL"), "{}", r.message());
}

#[test]
fn without_allow_net_a_run_has_no_proxy_and_no_report() {
    let r = run(
        "python",
        "import os; print(os.environ.get('HTTPS_PROXY'))",
        &[],
    );
    r.assert_ok();
    assert_eq!(r.stdout(), "None\n");
    assert!(r.verdict.get("network").is_none(), "{:#}", r.verdict);
}

fn post(s: &common::ServeProcess, key: &str, body: serde_json::Value) -> (u16, serde_json::Value) {
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/execute"))
        .header("x-api-key", key)
        .json(&body)
        .timeout(std::time::Duration::from_secs(60))
        .send()
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().unwrap())
}

/// `runcell serve` with this TOML configuration (written 0600, as a file with keys must be)
/// and `extra` flags; the directory lives as long as the returned guard.
fn serve_with_config(toml: &str, extra: &[&str]) -> (tempfile::TempDir, common::ServeProcess) {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runcell.toml");
    std::fs::write(&config, toml).unwrap();
    std::fs::set_permissions(&config, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut args = vec!["--pool", "python=0", "--config", config.to_str().unwrap()];
    args.extend_from_slice(extra);
    let s = common::ServeProcess::start(&args, &[]);
    (dir, s)
}

const KEY_A: &str = "egress-key-a-0123456789";
const KEY_B: &str = "egress-key-b-0123456789";

/// Over HTTP: the operator's policy (TOML [network] and per-key allow_net), the request's
/// `network`, caps on connections and bytes per run, an audit line per connection, metrics.
#[test]
fn the_server_bounds_requests_by_its_policy_and_audits_every_connection() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"team-b\"\nkey = \"{KEY_B}\"\nallow_net = []\n\
             [network]\nallow = [\"{}\", \"*.example.org:443\"]\nmax_connections = 2\nmax_bytes = \"300K\"\n",
            srv.entry()
        ),
        &[],
    );
    let fetch = |path: &str| {
        format!(
            "import urllib.request\ntry:\n    print(len(urllib.request.urlopen({:?}, timeout=10).read()))\nexcept Exception as e:\n    print('ERR', e)",
            srv.url(path)
        )
    };
    let net = serde_json::json!({"allow": [srv.entry()]});

    let (status, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": fetch("/"), "network": net}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["stdout"], "20\n", "{v}");
    assert_eq!(v["network"]["connections"][0]["allowed"], true, "{v}");

    // Beyond the policy: 400 naming the entry and what the policy allows.
    let (status, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": "print(1)", "network": {"allow": ["example.com"]}}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["category"], "invalid_request");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains("example.com is not allowed by this server's policy")
            && m.contains("*.example.org:443"),
        "{m}"
    );

    // A key with its own (empty) allowlist may ask for nothing.
    let (status, v) = post(
        &s,
        KEY_B,
        serde_json::json!({"language": "python", "code": "print(1)", "network": net}),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not allowed for this API key"),
        "{v}"
    );

    // Two connections per run: the third is refused.
    let three = format!("{c}\n{c}\n{c}", c = fetch("/"));
    let (_, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": three, "network": net}),
    );
    let out = v["stdout"].as_str().unwrap();
    assert_eq!(out.lines().filter(|l| *l == "20").count(), 2, "{v}");
    assert!(out.contains("used its 2 connections"), "{out}");

    // 300 KiB per run: a 1 MiB download is cut.
    let (_, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": fetch("/big"), "network": net}),
    );
    assert!(v["stdout"].as_str().unwrap().starts_with("ERR"), "{v}");
    let cut = &v["network"]["connections"][0];
    assert!(cut["reason"].as_str().unwrap().contains("cut"), "{v}");
    assert!(cut["bytes_in"].as_u64().unwrap() <= 300 << 10, "{v}");

    let log = s.log();
    let lines: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|l| l["event"] == "network")
        .collect();
    assert_eq!(lines.len(), 5, "an audit line per connection: {log}");
    assert!(lines
        .iter()
        .all(|l| l["key_id"] == "team-a" && l["request_id"].is_string()));
    assert_eq!(lines.iter().filter(|l| l["allowed"] == false).count(), 1);
    let metrics = reqwest::blocking::Client::new()
        .get(s.url("/metrics"))
        .header("x-api-key", KEY_A)
        .send()
        .unwrap()
        .text()
        .unwrap();
    for line in [
        "runcell_network_connections_total{decision=\"allowed\"} 4",
        "runcell_network_connections_total{decision=\"refused\"} 1",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

/// The isolation attacks again, with one destination allowed: host loopback services (TCP,
/// UDP, abstract unix sockets), the outside world and DNS stay unreachable directly, and the
/// proxy lets none of them through either, however the request is dressed up.
#[test]
fn with_one_destination_allowed_the_attacks_still_find_no_way_out() {
    use std::net::UdpSocket;
    use std::os::linux::net::SocketAddrExt;
    let srv = HostServer::start();
    let secret = TcpListener::bind("127.0.0.1:0").unwrap();
    let sport = secret.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_nonblocking(true).unwrap();
    let uport = udp.local_addr().unwrap().port();
    let name = format!("runcell-egress-test-{}", std::process::id());
    let abs = std::os::unix::net::UnixListener::bind_addr(
        &std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap(),
    )
    .unwrap();
    abs.set_nonblocking(true).unwrap();
    let own: Vec<String> = runcell_proxy::addr::own_addresses(
        "/proc/net/fib_trie".as_ref(),
        "/proc/net/if_inet6".as_ref(),
    )
    .prefixes()
    .map(|(a, _)| a)
    .filter(|a| !a.is_loopback())
    .map(|a| a.to_string())
    .collect();
    let own_v4 = own
        .iter()
        .find(|a| !a.contains(':'))
        .cloned()
        .unwrap_or("10.0.0.1".into());
    let r = run(
        "python",
        &py(&format!(
            r#"
def raw(req):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(req.encode())
    data = b""
    while True:
        c = s.recv(65536)
        if not c:
            break
        data += c
    return data.decode("latin1")
def status(req):
    return raw(req).split("\r\n")[0][:12].replace(" ", "_")
attempt("tcp_host_loopback", lambda: socket.create_connection(("127.0.0.1", {sport}), timeout=3))
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
u.sendto(b"x", ("127.0.0.1", {uport}))
abs_sock = socket.socket(socket.AF_UNIX)
attempt("abstract", lambda: abs_sock.connect("\0{name}"))
attempt("world", lambda: socket.create_connection(("1.1.1.1", 443), timeout=3))
try:
    socket.getaddrinfo("example.com", 80)
    print("dns=RESOLVED")
except socket.gaierror:
    print("dns=GAIERROR")
print("connect_host_loopback=" + status("CONNECT 127.0.0.1:{sport} HTTP/1.1\r\n\r\n"))
print("connect_host_own=" + status("CONNECT {own_v4}:{port} HTTP/1.1\r\n\r\n"))
print("connect_proxy_itself=" + status("CONNECT 127.0.0.1:3128 HTTP/1.1\r\n\r\n"))
print("userinfo_trick=" + status("GET http://127.0.0.2:{port}@127.0.0.1:{sport}/ HTTP/1.1\r\n\r\n"))
print("mapped_v6=" + status("CONNECT [::ffff:127.0.0.2]:{port} HTTP/1.1\r\n\r\n"))
print("integer_ip=" + status("GET http://2130706433:{sport}/ HTTP/1.1\r\n\r\n"))
print("short_ip=" + status("GET http://127.1:{sport}/ HTTP/1.1\r\n\r\n"))
# A second request on an allowed connection goes to the allowed host, whatever it names.
both = raw("GET http://127.0.0.2:{port}/ HTTP/1.1\r\nHost: x\r\n\r\nGET http://127.0.0.1:{sport}/ HTTP/1.1\r\n\r\n")
print("smuggled=" + str(both.count("hello from the host")))
"#,
            port = srv.port,
        )),
        &["--allow-net", &srv.entry(), "--timeout", "30"],
    );
    r.assert_ok();
    r.expect(&[
        ("tcp_host_loopback", "ECONNREFUSED"),
        ("abstract", "ECONNREFUSED"),
        ("world", "ENETUNREACH"),
        ("dns", "GAIERROR"),
        ("connect_host_loopback", "HTTP/1.1_403"),
        ("connect_host_own", "HTTP/1.1_403"),
        ("connect_proxy_itself", "HTTP/1.1_403"),
        ("userinfo_trick", "HTTP/1.1_403"),
        ("mapped_v6", "HTTP/1.1_403"),
        ("integer_ip", "HTTP/1.1_403"),
        ("short_ip", "HTTP/1.1_403"),
        ("smuggled", "1"),
    ]);
    secret.set_nonblocking(true).unwrap();
    assert!(
        secret.accept().is_err(),
        "the host's loopback service was reached"
    );
    let mut b = [0u8; 8];
    assert!(
        udp.recv(&mut b).is_err(),
        "the host's UDP service received a datagram"
    );
    assert!(
        abs.accept().is_err(),
        "the host's abstract socket was reached"
    );
}

const BOSS: &str = "egress-admin-key-0123456789";

/// With `approval = true`, a run that asks for network waits until an admin key approves it
/// (it runs), denies it (403 `approval_denied`) or lets its deadline pass (504
/// `approval_timeout`); ordinary keys can neither list nor decide.
#[test]
fn over_http_a_networked_run_waits_for_an_admin_to_approve_or_deny_it() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"boss\"\nkey = \"{BOSS}\"\nadmin = true\n\
             [network]\nallow = [\"{}\"]\napproval = true\napproval_timeout = \"10s\"\n",
            srv.entry()
        ),
        &[],
    );
    let s = std::sync::Arc::new(s);
    let code = format!(
        "import urllib.request\nprint(urllib.request.urlopen({:?}, timeout=10).read().decode().strip())",
        srv.url("/")
    );
    let body = serde_json::json!({"language": "python", "code": code, "network": {"allow": [srv.entry()]}});
    let client = reqwest::blocking::Client::new();
    let list = |key: &str| {
        let r = client
            .get(s.url("/v1/approvals"))
            .header("x-api-key", key)
            .send()
            .unwrap();
        (r.status().as_u16(), r.json::<serde_json::Value>().unwrap())
    };
    let waiting = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let (status, v) = list(BOSS);
            assert_eq!(status, 200, "{v}");
            if let Some(first) = v["approvals"].as_array().and_then(|a| a.first()) {
                return first.clone();
            }
            assert!(std::time::Instant::now() < deadline, "no run waits");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let decide = |id: &str, key: &str, decision: &str| {
        client
            .post(s.url(&format!("/v1/approvals/{id}")))
            .header("x-api-key", key)
            .json(&serde_json::json!({"decision": decision}))
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    for (decision, want_status) in [("approve", 200), ("deny", 403)] {
        let (s2, b2) = (s.clone(), body.clone());
        let run = std::thread::spawn(move || post(&s2, KEY_A, b2));
        let pending = waiting();
        assert_eq!(pending["key_id"], "team-a");
        assert_eq!(pending["language"], "python");
        assert_eq!(pending["destinations"][0], srv.entry());
        assert!(pending["code_sha256"].as_str().unwrap().len() == 64);
        let id = pending["id"].as_str().unwrap();
        assert_eq!(list(KEY_A).0, 403, "an ordinary key lists nothing");
        assert_eq!(
            decide(id, KEY_A, decision),
            403,
            "an ordinary key decides nothing"
        );
        assert_eq!(decide(id, BOSS, decision), 200);
        assert_eq!(decide(id, BOSS, decision), 404, "decided once");
        let (status, v) = run.join().unwrap();
        assert_eq!(status, want_status, "{v}");
        if decision == "approve" {
            assert_eq!(v["stdout"], "hello from the host\n", "{v}");
        } else {
            assert_eq!(v["error"]["category"], "approval_denied", "{v}");
            assert!(v["error"]["message"]
                .as_str()
                .unwrap()
                .contains(&srv.entry()));
        }
    }
    // An admin key's own run: it may not approve it (another admin must), it may deny it.
    let (s2, b2) = (s.clone(), body.clone());
    let run = std::thread::spawn(move || post(&s2, BOSS, b2));
    let pending = waiting();
    assert_eq!(pending["key_id"], "boss");
    let id = pending["id"].as_str().unwrap();
    assert_eq!(
        decide(id, BOSS, "approve"),
        403,
        "a key approves its own run"
    );
    assert_eq!(decide(id, BOSS, "deny"), 200);
    let (status, v) = run.join().unwrap();
    assert_eq!(status, 403, "{v}");
    assert_eq!(v["error"]["category"], "approval_denied", "{v}");
    // Nobody decides: refused at the deadline, and no longer listed.
    let (status, v) = post(&s, KEY_A, body.clone());
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["category"], "approval_timeout");
    assert_eq!(list(BOSS).1["approvals"], serde_json::json!([]));
    // A run without network never waits.
    let (status, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": "print(1)"}),
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("1\n")), "{v}");
}

/// A test host in a network namespace this test makes (a veth pair, 10.213.x.0/30), for the
/// clients that never send loopback destinations to a proxy (Go's): Go's net/http reaches it
/// through the proxy, the host being allowed by its literal address and port.
#[test]
#[cfg_attr(not(host_go), ignore = "needs go")]
fn go_reaches_a_test_host_in_a_network_namespace_through_the_proxy() {
    let ns = TestHost::start();
    let entry = format!("{}:{}", ns.addr, ns.port);
    let r = run(
        "go",
        &format!(
            r#"package main

import (
	"fmt"
	"io"
	"net/http"
)

func main() {{
	res, err := http.Get("http://{entry}/")
	if err != nil {{
		fmt.Println("ERR", err)
		return
	}}
	b, _ := io.ReadAll(res.Body)
	fmt.Print(string(b))
	// Refused by the proxy: plain HTTP gets its 403 as the answer.
	res, err = http.Get("http://{addr}:{other}/")
	if err != nil {{
		fmt.Println("ERR", err)
		return
	}}
	fmt.Println("other:", res.StatusCode)
}}
"#,
            addr = ns.addr,
            other = ns.port + 1
        ),
        &["--allow-net", &entry, "--timeout", "60"],
    );
    r.assert_ok();
    assert_eq!(
        r.stdout(),
        "hello from the namespace\nother: 403\n",
        "{:#}",
        r.verdict
    );
    let c = connections(&r);
    assert_eq!(c.len(), 2, "{c:?}");
    // Records come in the order the connections ended, and Go closes its first connection
    // while it makes the second: each is found by its port.
    let on = |port: u16| c.iter().find(|x| x["port"] == port).unwrap();
    assert_eq!(on(ns.port)["allowed"], true, "{c:?}");
    assert_eq!(on(ns.port)["address"], ns.addr.as_str());
    assert_eq!(on(ns.port + 1)["allowed"], false, "{c:?}");
}

/// A network namespace with one end of a veth pair, an address, and an HTTP server in it.
/// Made without `ip netns add`, which would mount a file and change the host's mount table
/// under the other tests' checks: the namespace is the server's own (`unshare --net`), and
/// ends with it.
struct TestHost {
    host_if: String,
    addr: String,
    port: u16,
    server: std::process::Child,
}

impl TestHost {
    fn start() -> TestHost {
        let n = std::process::id() % 200 + 20;
        let (host_if, ns_if) = (format!("rce{n}h"), format!("rce{n}n"));
        let (host_ip, addr) = (format!("10.213.{n}.1"), format!("10.213.{n}.2"));
        let port = 18000 + (std::process::id() % 1000) as u16;
        let dir = tempfile::tempdir().unwrap().keep();
        std::fs::write(dir.join("index.html"), "hello from the namespace\n").unwrap();
        // The server waits for its address, which is given from outside below.
        let script = format!(
            "while ! ip -o addr show dev {ns_if} 2>/dev/null | grep -q ' {addr}/'; do sleep 0.05; done; \
             exec python3 -m http.server {port} --bind {addr} --directory {}",
            dir.display()
        );
        let server = std::process::Command::new("unshare")
            .args(["--net", "sh", "-c", &script])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let pid = server.id().to_string();
        let netns = format!("--net=/proc/{pid}/ns/net");
        let run = |cmd: &[&str]| {
            let st = std::process::Command::new(cmd[0])
                .args(&cmd[1..])
                .status()
                .unwrap();
            assert!(st.success(), "{cmd:?}");
        };
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &host_if])
            .stderr(std::process::Stdio::null())
            .status();
        // (unshare has made the namespace once its child runs: wait for it to differ.)
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_link(format!("/proc/{pid}/ns/net")).ok()
            == std::fs::read_link("/proc/self/ns/net").ok()
        {
            assert!(std::time::Instant::now() < deadline, "no namespace");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        run(&[
            "ip", "link", "add", &host_if, "type", "veth", "peer", "name", &ns_if, "netns", &pid,
        ]);
        run(&[
            "ip",
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &host_if,
        ]);
        run(&["ip", "link", "set", &host_if, "up"]);
        run(&[
            "nsenter",
            &netns,
            "ip",
            "addr",
            "add",
            &format!("{addr}/30"),
            "dev",
            &ns_if,
        ]);
        run(&["nsenter", &netns, "ip", "link", "set", &ns_if, "up"]);
        run(&["nsenter", &netns, "ip", "link", "set", "lo", "up"]);
        // Ready when it answers from the host.
        while std::net::TcpStream::connect((addr.as_str(), port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the test host did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        TestHost {
            host_if,
            addr,
            port,
            server,
        }
    }
}

impl Drop for TestHost {
    fn drop(&mut self) {
        // The namespace ends with its last process, and its veth end with it; the host's end
        // is deleted now as well.
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.host_if])
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// Runs waiting for approval hold no place in line (found by our red team: ten of them locked
/// everyone out with 429s for five minutes), and one key may have only a few waiting.
#[test]
fn runs_waiting_for_approval_do_not_fill_the_queue() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"boss\"\nkey = \"{BOSS}\"\nadmin = true\n\
             [network]\nallow = [\"{}\"]\napproval = true\napproval_timeout = \"60s\"\n",
            srv.entry()
        ),
        &["--max-concurrent", "1", "--max-queue", "1"],
    );
    let s = std::sync::Arc::new(s);
    let body = serde_json::json!({"language": "python", "code": "print(1)",
        "network": {"allow": [srv.entry()]}});
    let client = reqwest::blocking::Client::new();
    let list = || {
        client
            .get(s.url("/v1/approvals"))
            .header("x-api-key", BOSS)
            .send()
            .unwrap()
            .json::<serde_json::Value>()
            .unwrap()["approvals"]
            .as_array()
            .unwrap()
            .clone()
    };
    // One after the other (a key's share of this two-place line is one place, which a run
    // holds only until it starts waiting): each is listed before the next is sent.
    let mut waiting = Vec::new();
    for n in 1..=9 {
        let (s2, b2) = (s.clone(), body.clone());
        waiting.push(std::thread::spawn(move || post(&s2, KEY_A, b2)));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while list().len() < n.min(8) {
            assert!(std::time::Instant::now() < deadline, "runs did not wait");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
    // The ninth is refused at once (the key has eight waiting).
    let ninth = waiting.pop().unwrap().join().unwrap();
    assert_eq!(ninth.0, 429, "the ninth of one key is refused: {}", ninth.1);
    // Eight wait; a plain run still gets in.
    let (status, v) = post(
        &s,
        KEY_A,
        serde_json::json!({"language": "python", "code": "print(2)"}),
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("2\n")), "{v}");
    for p in list() {
        let id = p["id"].as_str().unwrap();
        client
            .post(s.url(&format!("/v1/approvals/{id}")))
            .header("x-api-key", BOSS)
            .json(&serde_json::json!({"decision": "deny"}))
            .send()
            .unwrap();
    }
    let statuses: Vec<u16> = waiting.into_iter().map(|h| h.join().unwrap().0).collect();
    assert_eq!(statuses, [403; 8], "{statuses:?}");
}

/// Regression (issue 21): runs waiting for approval gave their place in line back and kept
/// their bodies outside admission (15 waiting runs held 916 MiB). A waiting run still holds
/// its body's bytes of the server's body budget: with a budget of one 1 MiB body, a run
/// waiting with 600 KiB leaves room for a small body, not for another 600 KiB.
#[test]
fn runs_waiting_for_approval_hold_their_bodies_within_the_budget() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"boss\"\nkey = \"{BOSS}\"\nadmin = true\n\
             [network]\nallow = [\"{}\"]\napproval = true\napproval_timeout = \"60s\"\n",
            srv.entry()
        ),
        &[
            "--max-concurrent",
            "1",
            "--max-queue",
            "0",
            "--max-body",
            "1M",
        ],
    );
    let s = std::sync::Arc::new(s);
    let padding = "x".repeat(600 << 10);
    let body = serde_json::json!({"language": "python", "code": "print(1)",
        "network": {"allow": [srv.entry()]},
        "files": [{"path": "pad.txt", "content": padding}]});
    // One key (the admin's, which runs code too): the whole budget is its own.
    let (s2, b2) = (s.clone(), body);
    let waiting = std::thread::spawn(move || post(&s2, BOSS, b2));
    let client = reqwest::blocking::Client::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let listed = client
            .get(s.url("/v1/approvals"))
            .header("x-api-key", BOSS)
            .send()
            .unwrap()
            .json::<serde_json::Value>()
            .unwrap()["approvals"]
            .as_array()
            .unwrap()
            .len();
        if listed == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the run did not wait");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // Its place in line is free (a small run gets in and runs) ...
    let (status, v) = post(
        &s,
        BOSS,
        serde_json::json!({"language": "python", "code": "print(2)"}),
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("2\n")), "{v}");
    // ... but its bytes are held: another 600 KiB body does not fit beside them.
    let (status, v) = post(
        &s,
        BOSS,
        serde_json::json!({"language": "python", "code": "print(3)",
            "files": [{"path": "pad.txt", "content": padding}]}),
    );
    assert_eq!(status, 429, "{v}");
    assert_eq!(v["error"]["category"], "rate_limited", "{v}");
    // Denied, the waiting run gives its bytes back.
    let id = client
        .get(s.url("/v1/approvals"))
        .header("x-api-key", BOSS)
        .send()
        .unwrap()
        .json::<serde_json::Value>()
        .unwrap()["approvals"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    client
        .post(s.url(&format!("/v1/approvals/{id}")))
        .header("x-api-key", BOSS)
        .json(&serde_json::json!({"decision": "deny"}))
        .send()
        .unwrap();
    assert_eq!(waiting.join().unwrap().0, 403);
    let (status, v) = post(
        &s,
        BOSS,
        serde_json::json!({"language": "python", "code": "print(open('pad.txt').read(3))",
            "files": [{"path": "pad.txt", "content": padding}]}),
    );
    assert_eq!((status, v["stdout"].as_str()), (200, Some("xxx\n")), "{v}");
}

/// Regression (attack pass): an AnyIP route (`ip route add local 11.22.33.0/24 dev lo`) makes
/// every address of a prefix the host's own, but the proxy read only the "/32 host LOCAL"
/// routes of fib_trie, so a name resolving into the prefix reached a listener of the host
/// itself. The name is `185999693`, which the resolver reads as 11.22.33.77 (as it reads
/// `2130706433`), so no DNS is needed. runcell runs in a network namespace this test makes
/// (`unshare --net`, joined with `nsenter`), with that route and a listener on 11.22.33.77:
/// the host's own tables are not touched, and nothing leaves the namespace.
#[test]
fn a_name_resolving_into_an_anyip_prefix_of_the_host_is_refused() {
    use std::io::BufRead;
    let name = u32::from(std::net::Ipv4Addr::new(11, 22, 33, 77)).to_string();
    let script = "ip link set lo up && ip route add local 11.22.33.0/24 dev lo && \
                  exec python3 -c 'import socket\n\
                  s = socket.socket(); s.bind((\"11.22.33.77\", 8080)); s.listen()\n\
                  print(\"ready\", flush=True)\n\
                  c, _ = s.accept(); print(\"reached\", flush=True)'";
    let mut ns = std::process::Command::new("unshare")
        .args(["--net", "sh", "-c", script])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = std::io::BufReader::new(ns.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n", "the namespace was not set up");
    let entry = format!("{name}:8080");
    let code = py(&format!(
        r#"
s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
s.sendall(b"CONNECT {entry} HTTP/1.1\r\n\r\n")
print("status=" + s.recv(4096).decode("latin1").split("\r\n")[0][:12].replace(" ", "_"))
"#
    ));
    let argv: Vec<String> = [
        "nsenter".to_string(),
        format!("--net=/proc/{}/ns/net", ns.id()),
        runcell_bin().display().to_string(),
        "run".into(),
        "--json".into(),
        "--lang".into(),
        "python".into(),
        "-c".into(),
        code,
        "--allow-net".into(),
        entry,
        "--timeout".into(),
        "60".into(),
    ]
    .into();
    let r = run_argv(&argv, |_| {});
    let _ = ns.kill();
    let _ = ns.wait();
    let mut rest = String::new();
    let _ = out.read_to_string(&mut rest);
    r.assert_ok();
    r.expect(&[("status", "HTTP/1.1_403")]);
    assert_eq!(rest, "", "the host's own listener was reached");
    let c = connections(&r);
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["allowed"], false);
    let why = c[0]["reason"].as_str().unwrap();
    assert!(
        why.contains("11.22.33.77") && why.contains("the runcell host itself"),
        "{why}"
    );
}

// ---------------------------------------------------------------------------------------------
// Sessions (issue 22): network asked for when a session is created, served by the session's
// own proxy for its whole life.
// ---------------------------------------------------------------------------------------------

/// A request to the server's API with `key` (`None`: a GET).
fn api(
    s: &common::ServeProcess,
    key: &str,
    method: &str,
    path: &str,
    body: Option<serde_json::Value>,
) -> (u16, serde_json::Value) {
    let client = reqwest::blocking::Client::new();
    let mut req = match method {
        "GET" => client.get(s.url(path)),
        "DELETE" => client.delete(s.url(path)),
        _ => client.post(s.url(path)),
    }
    .header("x-api-key", key)
    .timeout(std::time::Duration::from_secs(120));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().unwrap();
    let status = res.status().as_u16();
    let text = res.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::Null),
    )
}

/// The threads of the server's egress proxies (each proxy has one accept thread of this name).
fn proxy_threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|rd| {
            rd.flatten()
                .filter(|t| {
                    std::fs::read_to_string(t.path().join("comm"))
                        .is_ok_and(|c| c.trim_end() == "runcell-proxy")
                })
                .count()
        })
        .unwrap_or(0)
}

/// Poll until the server runs `n` proxies (a bound against a hang, not a measurement).
fn wait_proxies(pid: u32, n: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while proxy_threads(pid) != n {
        assert!(
            std::time::Instant::now() < deadline,
            "the server runs {} proxies, not {n}",
            proxy_threads(pid)
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Python that fetches `url` and prints the answer, or `ERR` and why.
fn py_fetch(url: &str) -> String {
    format!(
        "import urllib.request\ntry:\n    print(urllib.request.urlopen({url:?}, timeout=10).read().decode().strip())\nexcept Exception as e:\n    print('ERR', e)"
    )
}

#[test]
fn a_session_with_a_destination_reaches_it_on_every_call_and_its_proxy_ends_with_it() {
    let srv = HostServer::start();
    let other = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [network]\nallow = [\"{}\", \"{}\"]\n",
            srv.entry(),
            other.entry()
        ),
        &[],
    );
    let pid = s.pid();
    assert_eq!(proxy_threads(pid), 0);
    let (status, info) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"language": "python", "network": {"allow": [srv.entry()]}})),
    );
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["network"], serde_json::json!([srv.entry()]), "{info}");
    assert_eq!(info["packages"], serde_json::json!([]), "{info}");
    let id = info["id"].as_str().unwrap().to_string();
    let exec = format!("/v1/sessions/{id}/execute");
    wait_proxies(pid, 1);

    // Two calls reach it; each verdict reports its own connection. The first keeps a
    // variable, the second finds it: one interpreter, one proxy.
    for call in 0..2 {
        let code = format!("n = {call}\n{}", py_fetch(&srv.url("/")));
        let (status, v) = api(
            &s,
            KEY_A,
            "POST",
            &exec,
            Some(serde_json::json!({"code": code})),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["stdout"], "hello from the host\n", "call {call}: {v}");
        let c = v["network"]["connections"].as_array().unwrap();
        assert_eq!(c.len(), 1, "call {call}: {c:?}");
        assert_eq!(
            (c[0]["allowed"].clone(), c[0]["port"].clone()),
            (true.into(), srv.port.into())
        );
    }
    assert_eq!(srv.accepted.load(Ordering::SeqCst), 2);
    // A destination the session was not created with (though the server's policy has it):
    // refused, and the refusal reported with the call.
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        &exec,
        Some(serde_json::json!({"code": format!("print(n)\n{}", py_fetch(&other.url("/")))})),
    );
    assert_eq!(status, 200, "{v}");
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("1\nERR"), "{v}");
    assert!(out.contains("403"), "{out}");
    let c = v["network"]["connections"].as_array().unwrap();
    assert_eq!(c.len(), 1, "{c:?}");
    assert_eq!(c[0]["allowed"], false);
    assert!(c[0]["reason"].as_str().unwrap().contains("not on"), "{c:?}");
    assert_eq!(other.accepted.load(Ordering::SeqCst), 0);
    // A call may repeat the session's network, not change it.
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        &exec,
        Some(serde_json::json!({"code": "print(2)", "network": {"allow": [srv.entry()]}})),
    );
    assert_eq!((status, v["stdout"].clone()), (200, "2\n".into()), "{v}");
    assert_eq!(v["network"]["connections"], serde_json::json!([]), "{v}");
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        &exec,
        Some(serde_json::json!({"code": "print(3)", "network": {"allow": [other.entry()]}})),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("network is the session's own"),
        "{v}"
    );

    // Deleted: its sandbox and its proxy are gone.
    let procs = common::sandbox_processes_of(pid);
    assert!(!procs.is_empty());
    let (status, v) = api(&s, KEY_A, "DELETE", &format!("/v1/sessions/{id}"), None);
    assert!(status == 204 || status == 200, "{status} {v}");
    wait_proxies(pid, 0);
    common::assert_processes_gone(&procs, std::time::Duration::from_secs(30));

    // Expired (its idle TTL): the same.
    let (status, info) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        Some(
            serde_json::json!({"language": "python", "ttl": 1, "network": {"allow": [srv.entry()]}}),
        ),
    );
    assert_eq!(status, 201, "{info}");
    wait_proxies(pid, 1);
    wait_proxies(pid, 0);
    let (status, _) = api(
        &s,
        KEY_A,
        "GET",
        &format!("/v1/sessions/{}", info["id"].as_str().unwrap()),
        None,
    );
    assert_eq!(status, 404);
}

/// Regression: a session created without `network` has none: no proxy, no report, no way out.
#[test]
fn a_session_created_without_network_has_none() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"team-b\"\nkey = \"{KEY_B}\"\nallow_net = []\n\
             [network]\nallow = [\"{}\"]\n",
            srv.entry()
        ),
        &[],
    );
    // A key narrowed to no network cannot create a session with some.
    let (status, v) = api(
        &s,
        KEY_B,
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"language": "python", "network": {"allow": [srv.entry()]}})),
    );
    assert_eq!(status, 400, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not allowed for this API key"),
        "{v}"
    );
    let (status, info) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"language": "python"})),
    );
    assert_eq!(status, 201, "{info}");
    assert_eq!(info["network"], serde_json::json!([]));
    let exec = format!("/v1/sessions/{}/execute", info["id"].as_str().unwrap());
    let code = format!(
        "import os\nprint(os.environ.get('HTTP_PROXY'))\n{}",
        py_fetch(&srv.url("/"))
    );
    let (status, v) = api(
        &s,
        KEY_A,
        "POST",
        &exec,
        Some(serde_json::json!({"code": code})),
    );
    assert_eq!(status, 200, "{v}");
    let out = v["stdout"].as_str().unwrap();
    assert!(out.starts_with("None\nERR"), "{v}");
    assert!(v.get("network").is_none(), "{v}");
    assert_eq!(proxy_threads(s.pid()), 0);
    assert_eq!(srv.accepted.load(Ordering::SeqCst), 0);
}

/// With `approval = true`, a session that asks for network waits at its creation for an
/// admin (holding its place as a run does); the approval covers the session's calls, a denial
/// creates nothing.
#[test]
fn a_session_asking_for_network_waits_for_approval_at_its_creation() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [[api_keys]]\nid = \"boss\"\nkey = \"{BOSS}\"\nadmin = true\n\
             [network]\nallow = [\"{}\"]\napproval = true\napproval_timeout = \"60s\"\n",
            srv.entry()
        ),
        &[],
    );
    let s = std::sync::Arc::new(s);
    let waiting = || {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let (status, v) = api(&s, BOSS, "GET", "/v1/approvals", None);
            assert_eq!(status, 200, "{v}");
            if let Some(first) = v["approvals"].as_array().and_then(|a| a.first()) {
                return first.clone();
            }
            assert!(std::time::Instant::now() < deadline, "no creation waits");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    };
    let create = serde_json::json!({"language": "python", "network": {"allow": [srv.entry()]}});
    for decision in ["deny", "approve"] {
        let (s2, body) = (s.clone(), create.clone());
        let creating =
            std::thread::spawn(move || api(&s2, KEY_A, "POST", "/v1/sessions", Some(body)));
        let pending = waiting();
        assert_eq!(pending["destinations"][0], srv.entry());
        let id = pending["id"].as_str().unwrap();
        let (status, _) = api(
            &s,
            BOSS,
            "POST",
            &format!("/v1/approvals/{id}"),
            Some(serde_json::json!({"decision": decision})),
        );
        assert_eq!(status, 200);
        let (status, v) = creating.join().unwrap();
        let (_, listed) = api(&s, KEY_A, "GET", "/v1/sessions", None);
        if decision == "deny" {
            assert_eq!(status, 403, "{v}");
            assert_eq!(v["error"]["category"], "approval_denied", "{v}");
            assert_eq!(listed["sessions"], serde_json::json!([]), "{listed}");
            continue;
        }
        assert_eq!(status, 201, "{v}");
        // Its calls run without another approval.
        let exec = format!("/v1/sessions/{}/execute", v["id"].as_str().unwrap());
        for _ in 0..2 {
            let (status, r) = api(
                &s,
                KEY_A,
                "POST",
                &exec,
                Some(serde_json::json!({"code": py_fetch(&srv.url("/"))})),
            );
            assert_eq!(status, 200, "{r}");
            assert_eq!(r["stdout"], "hello from the host\n", "{r}");
        }
        let (_, v) = api(&s, BOSS, "GET", "/v1/approvals", None);
        assert_eq!(v["approvals"], serde_json::json!([]), "{v}");
    }
}

/// A session whose sandbox is lost (here every process of it killed from the host) is rebuilt
/// with its network: a new proxy for the new sandbox, the old one gone, the destination still
/// reached.
#[test]
fn a_session_rebuilt_after_its_sandbox_was_lost_keeps_its_network() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n[network]\nallow = [\"{}\"]\n",
            srv.entry()
        ),
        &[],
    );
    let pid = s.pid();
    let (status, info) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"language": "python", "network": {"allow": [srv.entry()]}})),
    );
    assert_eq!(status, 201, "{info}");
    let exec = format!("/v1/sessions/{}/execute", info["id"].as_str().unwrap());
    let fetch = serde_json::json!({"code": py_fetch(&srv.url("/"))});
    let (status, v) = api(&s, KEY_A, "POST", &exec, Some(fetch.clone()));
    assert_eq!(
        (status, v["stdout"].clone()),
        (200, "hello from the host\n".into()),
        "{v}"
    );
    let procs = common::sandbox_processes_of(pid);
    assert!(!procs.is_empty());
    for p in &procs {
        let _ = std::process::Command::new("kill")
            .args(["-KILL", &p.pid.to_string()])
            .status();
    }
    common::assert_processes_gone(&procs, std::time::Duration::from_secs(30));
    let (status, v) = api(&s, KEY_A, "POST", &exec, Some(fetch));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state_lost"], true, "{v}");
    assert_eq!(v["stdout"], "hello from the host\n", "{v}");
    let c = v["network"]["connections"].as_array().unwrap();
    assert_eq!(
        c.iter().filter(|c| c["allowed"] == true).count(),
        1,
        "{c:?}"
    );
    wait_proxies(pid, 1);
}

/// Node's clients ignore HTTP_PROXY: a node session's interpreter gets runcell's preloaded
/// module too, and every call goes through the session's proxy.
#[test]
#[cfg_attr(not(host_node), ignore = "needs node")]
fn a_node_session_reaches_its_destination_through_its_proxy() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n[network]\nallow = [\"{}\"]\n",
            srv.entry()
        ),
        &[],
    );
    let (status, info) = api(
        &s,
        KEY_A,
        "POST",
        "/v1/sessions",
        Some(serde_json::json!({"language": "node", "network": {"allow": [srv.entry()]}})),
    );
    assert_eq!(status, 201, "{info}");
    let exec = format!("/v1/sessions/{}/execute", info["id"].as_str().unwrap());
    for _ in 0..2 {
        let code = format!(
            "(async () => console.log((await (await fetch({:?})).text()).trim()))()",
            srv.url("/")
        );
        let (status, v) = api(
            &s,
            KEY_A,
            "POST",
            &exec,
            Some(serde_json::json!({"code": code})),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["stdout"], "hello from the host\n", "{v}");
        assert_eq!(
            v["network"]["connections"].as_array().unwrap().len(),
            1,
            "{v}"
        );
    }
}

/// E2B's network settings map onto a session's `network`, within the policy: a sandbox
/// created with `network.allowOut` reaches that destination from `run_code`; one created
/// with only `allow_internet_access: true` (what older SDKs send on every create) reaches
/// nothing; a destination outside the policy is refused at creation.
#[test]
fn an_e2b_sandbox_reaches_what_its_allow_out_names_and_nothing_else() {
    let srv = HostServer::start();
    let (_config, s) = serve_with_config(
        &format!(
            "[[api_keys]]\nid = \"team-a\"\nkey = \"{KEY_A}\"\n\
             [network]\nallow = [\"{}\"]\n",
            srv.entry()
        ),
        &[],
    );
    let http = reqwest::blocking::Client::new();
    let create = |body: serde_json::Value| -> (u16, serde_json::Value) {
        let res = http
            .post(s.url("/e2b/v2/sandboxes"))
            .header("X-API-Key", KEY_A)
            .json(&body)
            .send()
            .unwrap();
        (res.status().as_u16(), res.json().unwrap())
    };
    // The code's stdout, from /execute's NDJSON lines.
    let run = |sandbox: &serde_json::Value, code: &str| -> String {
        let text = http
            .post(s.url("/e2b/execute"))
            .header("E2b-Sandbox-Id", sandbox["sandboxID"].as_str().unwrap())
            .header("E2b-Sandbox-Port", "49999")
            .header(
                "X-Access-Token",
                sandbox["envdAccessToken"].as_str().unwrap(),
            )
            .json(&serde_json::json!({ "code": code }))
            .send()
            .unwrap()
            .text()
            .unwrap();
        text.lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .filter(|v| v["type"] == "stdout")
            .map(|v| v["text"].as_str().unwrap_or_default().to_string())
            .collect()
    };
    let (status, open) = create(serde_json::json!({
        "templateID": "code-interpreter-v1",
        "network": { "allowOut": [srv.entry()], "denyOut": ["0.0.0.0/0"] },
    }));
    assert_eq!(status, 201, "{open}");
    assert_eq!(
        run(&open, &py_fetch(&srv.url("/"))),
        "hello from the host\n"
    );
    // A command in the same sandbox goes through its proxy too (`curl`, `pip install`).
    let start = serde_json::json!({
        "process": {"cmd": "/bin/bash", "args": ["-l", "-c", format!("curl -s {}", srv.url("/"))]},
        "stdin": false,
    })
    .to_string();
    let mut frame = vec![0u8];
    frame.extend((start.len() as u32).to_be_bytes());
    frame.extend(start.as_bytes());
    let answer = http
        .post(s.url("/e2b/process.Process/Start"))
        .header("E2b-Sandbox-Id", open["sandboxID"].as_str().unwrap())
        .header("X-Access-Token", open["envdAccessToken"].as_str().unwrap())
        .header("content-type", "application/connect+json")
        .header("connect-protocol-version", "1")
        .body(frame)
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    let (mut rest, mut stdout) = (&answer[..], Vec::new());
    while rest.len() >= 5 {
        let len = u32::from_be_bytes(rest[1..5].try_into().unwrap()) as usize;
        let msg: serde_json::Value = serde_json::from_slice(&rest[5..5 + len]).unwrap();
        if let Some(b) = msg["event"]["data"]["stdout"].as_str() {
            use base64::Engine as _;
            stdout.extend(base64::engine::general_purpose::STANDARD.decode(b).unwrap());
        }
        rest = &rest[5 + len..];
    }
    assert_eq!(
        String::from_utf8_lossy(&stdout).trim(),
        "hello from the host",
        "{}",
        String::from_utf8_lossy(&answer)
    );
    let (status, closed) = create(serde_json::json!({
        "templateID": "code-interpreter-v1",
        "allow_internet_access": true,
    }));
    assert_eq!(status, 201, "{closed}");
    assert!(run(&closed, &py_fetch(&srv.url("/"))).starts_with("ERR"));
    assert_eq!(srv.accepted.load(Ordering::SeqCst), 2);
    let (status, v) = create(serde_json::json!({
        "templateID": "code-interpreter-v1",
        "network": { "allowOut": ["example.com"] },
    }));
    assert_eq!(status, 400, "{v}");
    assert!(
        v["message"].as_str().unwrap().contains("example.com"),
        "{v}"
    );
}
