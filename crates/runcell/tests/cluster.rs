//! Several servers behind one address (issue 23): three `runcell serve` processes stand in for
//! the pods runcell-0, runcell-1 and runcell-2 of a StatefulSet (one cluster key, one API key,
//! peer addresses from `cluster.peers` standing in for the headless Service's DNS). A session
//! created on one is continued through another; a forged id is refused without contacting any
//! peer; a restarted server answers `session_lost` for its old ids, directly and through a
//! peer; a draining server finishes its calls, fails readiness and refuses new sessions.

mod common;

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use common::ServeProcess;
use reqwest::blocking::Client;
use reqwest::Method;
use runcell_core::cluster::{ClusterSettings, SessionIds};
use serde_json::{json, Value};

const API_KEY: &str = "cluster-api-key-0123456789";
const CLUSTER_KEY: &str = "cluster-secret-key-0123456789abcdef";

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn call(base: &str, method: Method, path: &str, body: Option<Value>) -> (u16, Value) {
    let mut req = client()
        .request(method, format!("{base}{path}"))
        .header("authorization", format!("Bearer {API_KEY}"));
    if let Some(b) = body {
        req = req.json(&b);
    }
    let res = req.send().expect("request");
    let status = res.status().as_u16();
    let text = res.text().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// A port free now (the server binds it right after: a pod's address must be known to its
/// peers before it starts, as a StatefulSet's DNS names are).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Cluster {
    ports: [u16; 3],
    /// A listener standing in for the peer runcell-9: it must see no connection for a forged
    /// id.
    fake: TcpListener,
}

impl Cluster {
    fn new() -> Cluster {
        let fake = TcpListener::bind("127.0.0.1:0").unwrap();
        fake.set_nonblocking(true).unwrap();
        Cluster {
            ports: [free_port(), free_port(), free_port()],
            fake,
        }
    }

    fn peers(&self) -> String {
        let mut p: Vec<String> = self
            .ports
            .iter()
            .enumerate()
            .map(|(i, port)| format!("runcell-{i}=http://127.0.0.1:{port}"))
            .collect();
        p.push(format!(
            "runcell-9=http://{}",
            self.fake.local_addr().unwrap()
        ));
        p.join(",")
    }

    fn start(&self, i: usize, extra: &[&str]) -> ServeProcess {
        let pod = format!("runcell-{i}");
        let peers = self.peers();
        let mut args = vec!["--pool", "python=0", "--api-key", API_KEY];
        args.extend_from_slice(extra);
        ServeProcess::start_on(
            &format!("127.0.0.1:{}", self.ports[i]),
            &args,
            &[
                ("RUNCELL_POD_NAME", pod.as_str()),
                ("RUNCELL_CLUSTER_KEY", CLUSTER_KEY),
                ("RUNCELL_CLUSTER_PEERS", peers.as_str()),
            ],
        )
    }

    /// Whether anything connected to the fake peer.
    fn fake_was_contacted(&self) -> bool {
        match self.fake.accept() {
            Ok(_) => true,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
            Err(e) => panic!("fake peer: {e}"),
        }
    }
}

/// An id as server `pod` of a cluster with `key` would mint it.
fn id_of(pod: &str, key: &[u8]) -> String {
    SessionIds::new(Some(ClusterSettings {
        pod: pod.into(),
        key: key.to_vec(),
        peer_url: Some("http://{pod}:8080".into()),
        peers: BTreeMap::new(),
    }))
    .mint()
}

/// A JSON-RPC message to `/mcp` (a handshake-era client when `session` is set), and the text
/// of its answer (one JSON body or an event stream).
fn mcp(base: &str, body: Value, session: Option<&str>) -> (u16, Option<String>, String) {
    let mut req = client()
        .post(format!("{base}/mcp"))
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(id) = session {
        req = req
            .header("mcp-session-id", id)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let res = req.send().unwrap();
    let status = res.status().as_u16();
    let sid = res
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (status, sid, res.text().unwrap())
}

fn execute(base: &str, id: &str, code: &str) -> Value {
    let (st, v) = call(
        base,
        Method::POST,
        &format!("/v1/sessions/{id}/execute"),
        Some(json!({ "code": code })),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["session_id"], json!(id), "{v}");
    v
}

fn create(base: &str) -> String {
    let (st, v) = call(
        base,
        Method::POST,
        "/v1/sessions",
        Some(json!({"language": "python"})),
    );
    assert_eq!(st, 201, "{v}");
    v["id"].as_str().unwrap().to_string()
}

/// An MCP session (older protocol versions) initialized on `on`, whose id starts with
/// `prefix` (the server that holds it), and announced initialized through `then`.
fn mcp_open(on: &str, then: &str, prefix: &str) -> String {
    let (st, mcp_session, text) = mcp(
        on,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cluster-test", "version": "1.0"}}}),
        None,
    );
    assert_eq!(st, 200, "{text}");
    let mcp_session = mcp_session.expect("an Mcp-Session-Id");
    assert!(mcp_session.starts_with(prefix), "{mcp_session}");
    let (st, _, text) = mcp(
        then,
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        Some(&mcp_session),
    );
    assert_eq!(st, 202, "{text}");
    mcp_session
}

/// Wait (a bounded while, never asserting a duration) until `/readyz` answers `want`.
fn readyz_until(base: &str, want: u16) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let res = client().get(format!("{base}/readyz")).send().unwrap();
        let st = res.status().as_u16();
        let v: Value = res.json().unwrap();
        if st == want {
            return v;
        }
        assert!(Instant::now() < deadline, "/readyz stayed {st}: {v}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn sessions_follow_their_server_and_a_restart_loses_them() {
    let c = Cluster::new();
    let mut zero = c.start(0, &[]);
    let one = c.start(1, &[]);
    let two = c.start(2, &[]);

    // Created on runcell-0: the id names it.
    let id = create(&zero.base);
    assert!(id.starts_with("runcell980"), "{id}");
    assert!(id.len() <= 57, "{id}");

    // Continued through runcell-2: the state is runcell-0's.
    let v = execute(
        &zero.base,
        &id,
        "x = 41\nopen('kept.txt', 'w').write('kept')",
    );
    assert_eq!(v["execution_count"], json!(1), "{v}");
    let v = execute(&two.base, &id, "print(x + 1)");
    assert_eq!(v["stdout"], "42\n", "{v}");
    assert_eq!(v["execution_count"], json!(2), "{v}");
    let (st, files) = call(
        &two.base,
        Method::GET,
        &format!("/v1/sessions/{id}/files"),
        None,
    );
    assert_eq!(st, 200, "{files}");
    assert!(
        files["files"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f["path"] == "kept.txt"),
        "{files}"
    );
    // A file read streams back through the peer.
    let body = client()
        .get(two.base.clone() + &format!("/v1/sessions/{id}/files/kept.txt"))
        .header("authorization", format!("Bearer {API_KEY}"))
        .send()
        .unwrap();
    assert_eq!(body.status().as_u16(), 200);
    assert_eq!(body.text().unwrap(), "kept");
    let (st, info) = call(&one.base, Method::GET, &format!("/v1/sessions/{id}"), None);
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["execution_count"], json!(2), "{info}");
    // The owner checks the key, as for any request.
    let res = client()
        .get(two.base.clone() + &format!("/v1/sessions/{id}"))
        .header("authorization", "Bearer not-a-key-of-this-cluster")
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 401);

    // Forged ids: a bad tag, and a valid tag made with another key. Both name runcell-9,
    // whose address is the fake peer: refused here, and nobody is contacted.
    let genuine = id_of("runcell-9", CLUSTER_KEY.as_bytes());
    let mut tampered = genuine.clone().into_bytes();
    let last = tampered.len() - 1;
    tampered[last] = if tampered[last] == b'a' { b'b' } else { b'a' };
    let tampered = String::from_utf8(tampered).unwrap();
    let foreign = id_of("runcell-9", &[7u8; 32]);
    for forged in [&tampered, &foreign] {
        for path in [
            format!("/v1/sessions/{forged}"),
            format!("/v1/sessions/{forged}/files"),
        ] {
            let (st, v) = call(&one.base, Method::GET, &path, None);
            assert_eq!(st, 404, "{path}: {v}");
            assert_eq!(v["error"]["category"], "not_found", "{v}");
        }
        let (st, v) = call(
            &one.base,
            Method::POST,
            &format!("/v1/sessions/{forged}/execute"),
            Some(json!({"code": "print(1)"})),
        );
        assert_eq!(st, 404, "{v}");
    }
    assert!(
        !c.fake_was_contacted(),
        "a forged id made a server contact a peer"
    );
    // The control: the genuine id does reach runcell-9 (the fake), which hangs up: 503.
    let base = one.base.clone();
    let genuine2 = genuine.clone();
    let asked = std::thread::spawn(move || {
        call(
            &base,
            Method::GET,
            &format!("/v1/sessions/{genuine2}"),
            None,
        )
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while !c.fake_was_contacted() {
        assert!(Instant::now() < deadline, "the genuine id reached no peer");
        std::thread::sleep(Duration::from_millis(20));
    }
    let (st, v) = asked.join().unwrap();
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["category"], "peer_unavailable", "{v}");

    // An MCP session (older protocol versions) opened on runcell-0 is served through
    // runcell-2: its id names runcell-0 too.
    let mcp_session = mcp_open(&zero.base, &two.base, "runcell980");
    let (st, _, text) = mcp(
        &two.base,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "code_exec_bash", "arguments": {"code": "echo through-a-peer"}}}),
        Some(&mcp_session),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("through-a-peer"), "{text}");

    // runcell-0 restarts under the same name (and address): its old ids are lost, whoever is
    // asked.
    let status = zero.terminate(Duration::from_secs(120));
    assert!(status.success(), "{}", zero.log());
    drop(zero);
    let zero = c.start(0, &[]);
    for base in [&zero.base, &one.base] {
        let (st, v) = call(
            base,
            Method::POST,
            &format!("/v1/sessions/{id}/execute"),
            Some(json!({"code": "print(x)"})),
        );
        assert_eq!(st, 410, "{base}: {v}");
        assert_eq!(v["error"]["category"], "session_lost", "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(
            message.contains("restarted") && message.contains("Create a new session"),
            "{v}"
        );
    }
    // A new session there works.
    let fresh = create(&one.base);
    assert!(fresh.starts_with("runcell981"), "{fresh}");
    assert_eq!(execute(&zero.base, &fresh, "print(7)")["stdout"], "7\n");

    // The forwards were counted.
    let metrics = client()
        .get(two.base.clone() + "/metrics")
        .header("authorization", format!("Bearer {API_KEY}"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(
        metrics.contains("runcell_forwards_total{result=\"ok\"}"),
        "{metrics}"
    );
}

#[test]
fn a_draining_server_finishes_its_calls_and_takes_no_new_session() {
    let c = Cluster::new();
    let mut two = c.start(2, &["--shutdown-grace", "600s"]);
    let ready = readyz_until(&two.base, 200);
    assert_eq!(ready["status"], "ready", "{ready}");
    assert_eq!(ready["pod"], "runcell-2", "{ready}");

    let id = create(&two.base);
    let base = two.base.clone();
    let id2 = id.clone();
    let running = std::thread::spawn(move || {
        execute(&base, &id2, "import time\ntime.sleep(8)\nprint('finished')")
    });
    // Wait until the call runs, then SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (_, info) = call(&two.base, Method::GET, &format!("/v1/sessions/{id}"), None);
        if info["busy"] == json!(true) {
            break;
        }
        assert!(Instant::now() < deadline, "the call never started: {info}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &two.pid().to_string()])
        .status()
        .unwrap()
        .success();
    assert!(ok);

    let v = readyz_until(&two.base, 503);
    assert_eq!(v["status"], "draining", "{v}");
    let (st, v) = call(
        &two.base,
        Method::POST,
        "/v1/sessions",
        Some(json!({"language": "python"})),
    );
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["category"], "draining", "{v}");

    // The call in flight finishes, and the session takes further calls.
    let v = running.join().unwrap();
    assert_eq!(v["stdout"], "finished\n", "{v}");
    assert_eq!(execute(&two.base, &id, "print(1)")["stdout"], "1\n");
    let metrics = client()
        .get(two.base.clone() + "/metrics")
        .header("authorization", format!("Bearer {API_KEY}"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(metrics.contains("runcell_draining 1"), "{metrics}");

    // Once its last session is gone, it stops (well before the grace period).
    let (st, _) = call(
        &two.base,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    );
    assert!(st == 200 || st == 204, "{st}");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = two.child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "a drained server did not stop: {}",
            two.log()
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{}", two.log());
}

/// The E2B door's sandboxes are sessions: their ids name their server, the control plane's
/// and the data plane's requests (`E2b-Sandbox-Id`) are forwarded, and a restarted server's
/// sandboxes answer 410 `session_lost`.
#[test]
#[cfg_attr(not(host_python_stack), ignore = "needs the Python data stack")]
fn e2b_sandboxes_follow_their_server() {
    let c = Cluster::new();
    let mut zero = c.start(0, &[]);
    let one = c.start(1, &[]);
    let res = client()
        .post(zero.base.clone() + "/e2b/v2/sandboxes")
        .header("X-API-Key", API_KEY)
        .json(&json!({"templateID": "base"}))
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 201);
    let created: Value = res.json().unwrap();
    let id = created["sandboxID"].as_str().unwrap().to_string();
    let token = created["envdAccessToken"].as_str().unwrap().to_string();
    assert!(id.starts_with("runcell980"), "{id}");
    // `{port}-{sandboxID}` is one DNS label.
    assert!(format!("49999-{id}").len() <= 63, "{id}");
    let health = |base: &str| {
        client()
            .get(format!("{base}/e2b/health"))
            .header("E2b-Sandbox-Id", &id)
            .header("X-Access-Token", &token)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    let info = |base: &str| {
        client()
            .get(format!("{base}/e2b/sandboxes/{id}"))
            .header("X-API-Key", API_KEY)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(health(&one.base), 204);
    assert_eq!(info(&one.base), 200);

    assert!(zero.terminate(Duration::from_secs(120)).success());
    drop(zero);
    let zero = c.start(0, &[]);
    for base in [&zero.base, &one.base] {
        assert_eq!(health(base), 410, "{base}");
        assert_eq!(info(base), 410, "{base}");
    }
}

/// A current (2026-07-28, stateless) MCP request: its version and the client's capabilities
/// in `_meta`, no session.
fn stateless(id: u64, method: &str, mut params: Value) -> Value {
    params["_meta"] = json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "cluster-test", "version": "1.0"},
    });
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn stateless_mcp(base: &str, body: Value) -> (u16, String) {
    let mut req = client()
        .post(format!("{base}/mcp"))
        .header("authorization", format!("Bearer {API_KEY}"))
        .header("accept", "application/json, text/event-stream")
        .header("mcp-protocol-version", "2026-07-28")
        .header("mcp-method", body["method"].as_str().unwrap());
    if let Some(name) = body["params"]["name"].as_str() {
        req = req.header("mcp-name", name);
    }
    let res = req.json(&body).send().unwrap();
    let status = res.status().as_u16();
    (status, res.text().unwrap())
}

#[test]
fn mcp_tool_calls_run_in_the_session_their_arguments_name() {
    let c = Cluster::new();
    let mut zero = c.start(0, &[]);
    let one = c.start(1, &[]);
    let two = c.start(2, &[]);

    let id = create(&zero.base);
    assert!(id.starts_with("runcell980"), "{id}");
    execute(&zero.base, &id, "x = 41");

    // A stateless MCP call reaching runcell-2 runs in runcell-0's session: its state is there.
    let (st, text) = stateless_mcp(
        &two.base,
        stateless(
            1,
            "tools/call",
            json!({"name": "code_exec_python",
                   "arguments": {"code": "x += 1\nprint(x)", "session_id": id}}),
        ),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("42"), "{text}");
    assert!(!text.contains("\"isError\":true"), "{text}");

    // Within an MCP session of runcell-2 (older protocol versions), with a progress token:
    // the output comes back as it is written, as progress notifications.
    let mcp_session = mcp_open(&two.base, &two.base, "runcell982");
    let (st, _, text) = mcp(
        &two.base,
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "code_exec_python", "_meta": {"progressToken": "p1"},
            "arguments": {"code": "x += 1\nprint('now', x)", "session_id": id}}}),
        Some(&mcp_session),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("now 43"), "{text}");
    assert!(text.contains("notifications/progress"), "{text}");
    // The tool's language is checked against the session's by its owner, as for a local
    // call: bash runs beside the session's interpreter (in its workspace), node is refused.
    let (st, text) = stateless_mcp(
        &two.base,
        stateless(
            2,
            "tools/call",
            json!({"name": "code_exec_bash",
                   "arguments": {"code": "echo from-bash > b.txt; cat b.txt", "session_id": id}}),
        ),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("from-bash"), "{text}");
    assert!(!text.contains("\"isError\":true"), "{text}");
    let (st, text) = stateless_mcp(
        &two.base,
        stateless(
            2,
            "tools/call",
            json!({"name": "code_exec_node",
                   "arguments": {"code": "console.log(1)", "session_id": id}}),
        ),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("\"isError\":true"), "{text}");
    assert!(text.contains("This is a python session"), "{text}");
    // The owner counted the four calls that ran in its session, and has bash's file.
    let (st, info) = call(&zero.base, Method::GET, &format!("/v1/sessions/{id}"), None);
    assert_eq!(st, 200, "{info}");
    assert_eq!(info["execution_count"], json!(4), "{info}");
    let v = execute(&zero.base, &id, "print(open('b.txt').read().strip(), x)");
    assert_eq!(v["stdout"], "from-bash 43\n", "{v}");

    // A forged id (runcell-9's, tampered) in the arguments: refused by runcell-1 as unknown,
    // and runcell-9 (the fake) never contacted.
    let mut forged = id_of("runcell-9", CLUSTER_KEY.as_bytes()).into_bytes();
    let last = forged.len() - 1;
    forged[last] = if forged[last] == b'a' { b'b' } else { b'a' };
    let forged = String::from_utf8(forged).unwrap();
    let (st, text) = stateless_mcp(
        &one.base,
        stateless(
            3,
            "tools/call",
            json!({"name": "code_exec_python",
                   "arguments": {"code": "print(1)", "session_id": forged}}),
        ),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("\"isError\":true"), "{text}");
    assert!(text.contains("not_found"), "{text}");
    // The same forged id as an Mcp-Session-Id: the 404 of an unknown session, served here.
    let (st, _, text) = mcp(
        &one.base,
        json!({"jsonrpc": "2.0", "id": 4, "method": "tools/list"}),
        Some(&forged),
    );
    assert_eq!(st, 404, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["error"]["category"], "not_found", "{v}");
    assert!(
        !c.fake_was_contacted(),
        "a forged id in a tool's arguments made a server contact a peer"
    );

    // runcell-0 restarts: its session is lost, said through runcell-2 as the owner says it.
    let (st, old_mcp, text) = mcp(
        &zero.base,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cluster-test", "version": "1.0"}}}),
        None,
    );
    assert_eq!(st, 200, "{text}");
    let old_mcp = old_mcp.expect("an Mcp-Session-Id");
    let status = zero.terminate(Duration::from_secs(120));
    assert!(status.success(), "{}", zero.log());
    drop(zero);
    let zero = c.start(0, &[]);
    let (st, text) = stateless_mcp(
        &two.base,
        stateless(
            4,
            "tools/call",
            json!({"name": "code_exec_python",
                   "arguments": {"code": "print(x)", "session_id": id}}),
        ),
    );
    assert_eq!(st, 200, "{text}");
    assert!(text.contains("\"isError\":true"), "{text}");
    assert!(text.contains("session_lost"), "{text}");
    assert!(text.contains("restarted"), "{text}");
    // The MCP session runcell-0 opened before it restarted: 404 (clients start a new one on
    // it), saying why, directly and through runcell-1.
    for base in [&zero.base, &one.base] {
        let (st, _, text) = mcp(
            base,
            json!({"jsonrpc": "2.0", "id": 5, "method": "tools/list"}),
            Some(&old_mcp),
        );
        assert_eq!(st, 404, "{base}: {text}");
        let v: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["category"], "session_lost", "{v}");
    }
}

/// The answer to `request` on `c`, up to the end of its body (Content-Length framed), as
/// text; `None` if the server closed the connection.
fn raw_exchange(c: &mut std::net::TcpStream, request: &str) -> Option<String> {
    use std::io::{Read, Write};
    c.write_all(request.as_bytes()).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = c.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len: usize = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_string)
                })
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if body.len() >= len {
                return Some(text);
            }
        }
    }
}

/// A forwarded request keeps the client's connection past the unauthenticated grace only
/// when the owner's key check let the caller in: an unauthenticated request with a validly
/// tagged id to a route that needs no key check (an unmatched one) does not, even with a
/// forged `runcell-authenticated` header; the owner's header never reaches the client.
#[test]
fn forwarded_requests_authenticate_a_connection_only_with_a_key() {
    use std::io::Read;
    /// runcell_server::connections::UNAUTHENTICATED_GRACE and the drain after it (an idle
    /// keep-alive connection is closed after runcell_server::listener::HEADER_READ_TIMEOUT,
    /// 30 s, whatever it carried).
    const GRACE: Duration = Duration::from_secs(11);
    let c = Cluster::new();
    let zero = c.start(0, &[]);
    let _one = c.start(1, &[]);
    let id = id_of("runcell-1", CLUSTER_KEY.as_bytes());
    let addr = zero.base.trim_start_matches("http://").to_string();
    let mut open = std::net::TcpStream::connect(&addr).unwrap();
    let answer = raw_exchange(
        &mut open,
        &format!(
            "GET /v1/sessions/{id}/no-such-route HTTP/1.1\r\nHost: x\r\n\
             runcell-authenticated: 1\r\n\r\n"
        ),
    )
    .expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 404"), "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("runcell-authenticated"),
        "{answer}"
    );
    let keyed_request = format!(
        "GET /v1/sessions/{id} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {API_KEY}\r\n\r\n"
    );
    let mut keyed = std::net::TcpStream::connect(&addr).unwrap();
    // The id is from an earlier start of runcell-1: its key check passed, the session is lost.
    let answer = raw_exchange(&mut keyed, &keyed_request).expect("an answer");
    assert!(answer.starts_with("HTTP/1.1 410"), "{answer}");
    assert!(answer.contains("session_lost"), "{answer}");
    assert!(
        !answer
            .to_ascii_lowercase()
            .contains("runcell-authenticated"),
        "{answer}"
    );
    // Past the grace (and well within the 30 s a keep-alive connection may idle), the
    // unauthenticated connection is closed and the keyed one still serves.
    std::thread::sleep(GRACE + Duration::from_secs(8));
    open.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut buf = [0u8; 1024];
    let closed = match open.read(&mut buf) {
        Ok(n) => n == 0,
        Err(e) => !matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        ),
    };
    assert!(
        closed,
        "a connection that never authenticated was kept open"
    );
    let answer = raw_exchange(&mut keyed, &keyed_request).expect("the keyed connection is open");
    assert!(answer.starts_with("HTTP/1.1 410"), "{answer}");
}
