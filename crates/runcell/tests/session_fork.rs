//! Pausing and resuming sessions (issue 24) through the real HTTP API: a pause freezes the
//! session's cgroup (its CPU counter does not move while frozen, its state is kept), resume
//! and any call run it again, another key gets 404, a paused session past `paused_ttl` is
//! reaped, and the metrics count it all.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{assert_host_clean, cgroup_roots, ServeProcess, LOADED_MARGIN};
use reqwest::blocking::Client;
use reqwest::Method;
use serde_json::{json, Value};

const KEY_A: &str = "pause-key-a-0123456789";
const KEY_B: &str = "pause-key-b-0123456789";

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap()
}

fn server(extra: &[&str]) -> ServeProcess {
    let mut args = vec!["--pool", "python=0", "--api-key", KEY_A, "--api-key", KEY_B];
    args.extend_from_slice(extra);
    ServeProcess::start(&args, &[])
}

fn call(
    s: &ServeProcess,
    key: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let mut req = client()
        .request(method, s.url(path))
        .header("authorization", format!("Bearer {key}"));
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

fn create(s: &ServeProcess) -> String {
    let (st, v) = call(
        s,
        KEY_A,
        Method::POST,
        "/v1/sessions",
        Some(json!({"language": "python"})),
    );
    assert_eq!(st, 201, "{v}");
    assert_eq!(v["state"], "running", "{v}");
    assert!(v.get("paused_at").is_none(), "{v}");
    v["id"].as_str().unwrap().to_string()
}

fn code(s: &ServeProcess, id: &str, code: &str) -> Value {
    let (st, v) = call(
        s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/execute"),
        Some(json!({ "code": code })),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["exit_code"], 0, "{v}");
    v
}

fn metrics(s: &ServeProcess) -> String {
    client()
        .get(s.url("/metrics"))
        .header("authorization", format!("Bearer {KEY_A}"))
        .send()
        .unwrap()
        .text()
        .unwrap()
}

/// The cgroup directory (the CPU accounting one on v1) of server `pid`'s only sandbox.
fn sandbox_cpu_group(pid: u32) -> PathBuf {
    let prefix = format!("{pid}-");
    let roots = cgroup_roots();
    let root = roots
        .iter()
        .find(|r| {
            let p = r.to_string_lossy();
            p.contains("/cpuacct/") || p.contains("/cpu,cpuacct/") || p == "/sys/fs/cgroup/runcell"
        })
        .expect("a cgroup root with CPU accounting");
    let groups: Vec<PathBuf> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(&prefix) && !name.ends_with("-template")
        })
        .map(|e| e.path())
        .collect();
    assert_eq!(groups.len(), 1, "one sandbox: {groups:?}");
    groups[0].clone()
}

/// The group's CPU time so far, in nanoseconds.
fn cpu_ns(group: &std::path::Path) -> u64 {
    if let Ok(s) = std::fs::read_to_string(group.join("cpuacct.usage")) {
        return s.trim().parse().unwrap();
    }
    let stat = std::fs::read_to_string(group.join("cpu.stat")).unwrap();
    let usec: u64 = stat
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    usec * 1000
}

/// Whether the group says it is frozen (v1 `freezer.state`, v2 `cgroup.events`).
fn frozen(pid: u32) -> bool {
    let prefix = format!("{pid}-");
    for root in cgroup_roots() {
        for e in std::fs::read_dir(&root).unwrap().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) || name.ends_with("-template") {
                continue;
            }
            if let Ok(s) = std::fs::read_to_string(e.path().join("freezer.state")) {
                return s.trim() == "FROZEN";
            }
            if let Ok(s) = std::fs::read_to_string(e.path().join("cgroup.events")) {
                return s.lines().any(|l| l == "frozen 1");
            }
        }
    }
    false
}

#[test]
fn pause_freezes_the_session_and_resume_continues_it() {
    let s = server(&[]);
    let id = create(&s);
    // A busy thread in the interpreter (between calls pid 1 stops the interpreter, threads
    // and all; a process left behind by a cell is ended with it).
    code(
        &s,
        &id,
        "import threading, time\n\
         n = 0\n\
         def spin():\n    global n\n    while True:\n        n += 1\n\
         threading.Thread(target=spin, daemon=True).start()\n\
         time.sleep(0.2)\n\
         kept = {'a': [1, 2, 3]}",
    );
    let group = sandbox_cpu_group(s.pid());

    // Another key: 404, and nothing paused.
    for op in ["pause", "resume"] {
        let (st, v) = call(
            &s,
            KEY_B,
            Method::POST,
            &format!("/v1/sessions/{id}/{op}"),
            None,
        );
        assert_eq!(st, 404, "{op} by another key: {v}");
    }
    assert!(!frozen(s.pid()));

    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/pause"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "paused", "{v}");
    assert!(v["paused_at"].as_str().unwrap().ends_with('Z'), "{v}");
    assert!(frozen(s.pid()), "the session's cgroup is frozen");
    let (st, v) = call(&s, KEY_A, Method::GET, &format!("/v1/sessions/{id}"), None);
    assert_eq!((st, v["state"].as_str()), (200, Some("paused")), "{v}");

    // Frozen: the counter does not move, whatever time passes.
    let before = cpu_ns(&group);
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(cpu_ns(&group), before, "a frozen session used CPU");

    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/pause"),
        None,
    );
    assert_eq!(st, 409, "a second pause: {v}");
    assert_eq!(v["error"]["category"], "conflict", "{v}");

    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["state"], "running", "{v}");
    assert!(v.get("paused_at").is_none(), "{v}");
    assert!(!frozen(s.pid()));
    // Resuming a running session: nothing to do.
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/resume"),
        None,
    );
    assert_eq!((st, v["state"].as_str()), (200, Some("running")), "{v}");

    // The state is kept and the thread goes on.
    let v = code(
        &s,
        &id,
        "m = n\n\
         while n == m:\n    time.sleep(0.01)\n\
         print(kept['a'], flush=True)",
    );
    assert_eq!(v["stdout"], "[1, 2, 3]\n", "{v}");

    let text = metrics(&s);
    for line in [
        "runcell_sessions_paused_total 1\n",
        "runcell_sessions_resumed_total 1\n",
    ] {
        assert!(text.contains(line), "{line}{text}");
    }
    let (st, _) = call(
        &s,
        KEY_A,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    );
    assert_eq!(st, 204);
}

#[test]
fn a_call_on_a_paused_session_resumes_it_and_delete_ends_it() {
    let s = server(&[]);
    let id = create(&s);
    code(&s, &id, "x = 41");
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/pause"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let v = code(&s, &id, "print(x + 1)");
    assert_eq!(v["stdout"], "42\n", "{v}");
    let (_, v) = call(&s, KEY_A, Method::GET, &format!("/v1/sessions/{id}"), None);
    assert_eq!(v["state"], "running", "{v}");
    // A file operation resumes it too.
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/pause"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let (st, v) = call(
        &s,
        KEY_A,
        Method::GET,
        &format!("/v1/sessions/{id}/files"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let (_, v) = call(&s, KEY_A, Method::GET, &format!("/v1/sessions/{id}"), None);
    assert_eq!(v["state"], "running", "{v}");
    assert!(metrics(&s).contains("runcell_sessions_resumed_total 2\n"));
    // A paused session is deleted with nothing left behind.
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{id}/pause"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let (st, _) = call(
        &s,
        KEY_A,
        Method::DELETE,
        &format!("/v1/sessions/{id}"),
        None,
    );
    assert_eq!(st, 204);
    let pid = s.pid();
    drop(s);
    assert_host_clean(pid);
}

#[test]
fn a_paused_session_past_paused_ttl_is_reaped() {
    let s = server(&["--session-paused-ttl", "1s"]);
    let paused = create(&s);
    let running = create(&s);
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        &format!("/v1/sessions/{paused}/pause"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    let deadline = Instant::now() + Duration::from_secs(10) + LOADED_MARGIN;
    loop {
        let (st, _) = call(
            &s,
            KEY_A,
            Method::GET,
            &format!("/v1/sessions/{paused}"),
            None,
        );
        if st == 404 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the paused session was not reaped"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The running one keeps its own (default, 10 min) TTL.
    let (st, v) = call(
        &s,
        KEY_A,
        Method::GET,
        &format!("/v1/sessions/{running}"),
        None,
    );
    assert_eq!(st, 200, "{v}");
    assert!(metrics(&s).contains("runcell_sessions_expired_total 1\n"));
    let pid = s.pid();
    drop(s);
    assert_host_clean(pid);
}

fn fork(s: &ServeProcess, key: &str, id: &str) -> (u16, Value) {
    call(
        s,
        key,
        Method::POST,
        &format!("/v1/sessions/{id}/fork"),
        None,
    )
}

#[test]
#[cfg_attr(not(host_python_stack), ignore = "needs the Python data stack")]
fn fork_copies_state_and_workspace_and_the_copies_are_independent() {
    let s = server(&[]);
    let parent = create(&s);
    code(
        &s,
        &parent,
        "import pandas as pd\n\
         x = 41\n\
         def f(a):\n    return a + x\n\
         g = lambda y: y * 2\n\
         def make(n):\n    def add(k):\n        return k + n\n    return add\n\
         adder = make(5)\n\
         class Pt:\n    def __init__(self, a):\n        self.a = a\n    def norm(self):\n        return self.a * 2\n\
         p = Pt(3)\n\
         df = pd.DataFrame({'v': [1, 2, 3]})\n\
         gen = (i for i in range(3))\n\
         open('data.txt', 'w').write('hello')\n\
         open('.runcell-fork-state', 'w').write('a file of the same name as the fork state')",
    );
    let (st, v) = fork(&s, KEY_B, &parent);
    assert_eq!(st, 404, "another key's fork: {v}");

    let (st, v) = fork(&s, KEY_A, &parent);
    assert_eq!(st, 201, "{v}");
    let child = v["id"].as_str().unwrap().to_string();
    assert_ne!(child, parent);
    assert_eq!(v["parent_id"], json!(parent), "{v}");
    assert_eq!(v["language"], "python", "{v}");
    assert_eq!(v["state"], "running", "{v}");
    assert_eq!(
        v["skipped"],
        json!([
            "gen",
            "/workspace/.runcell-fork-state (the name of the fork's state)"
        ]),
        "a generator cannot be copied, nor a file under the state's name: {v}"
    );
    assert!(v["state_bytes"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["workspace_files"], 1, "{v}");

    let check = "print(x, f(1), g(2), adder(1), p.norm(), isinstance(p, Pt), int(df.v.sum()), \
                 open('data.txt').read(), pd.__name__)";
    let out = code(&s, &child, check);
    assert_eq!(out["stdout"], "41 42 4 6 6 True 6 hello pandas\n", "{out}");
    assert!(!out["stdout"].as_str().unwrap().is_empty());
    assert_eq!(out["execution_count"], 1, "the copy's own count: {out}");

    // Independent from now on, both ways.
    code(
        &s,
        &child,
        "x = 100\ndf.loc[0, 'v'] = 10\np.a = 50\nopen('data.txt', 'w').write('child')",
    );
    let out = code(&s, &parent, check);
    assert_eq!(out["stdout"], "41 42 4 6 6 True 6 hello pandas\n", "{out}");
    code(&s, &parent, "x = 7");
    let out = code(
        &s,
        &child,
        "print(x, int(df.v.sum()), p.norm(), open('data.txt').read())",
    );
    assert_eq!(out["stdout"], "100 15 100 child\n", "{out}");

    let (st, v) = call(
        &s,
        KEY_B,
        Method::GET,
        &format!("/v1/sessions/{child}"),
        None,
    );
    assert_eq!(st, 404, "the copy is the same key's: {v}");
    assert!(metrics(&s).contains("runcell_sessions_forked_total 1\n"));
    for id in [&parent, &child] {
        let (st, _) = call(
            &s,
            KEY_A,
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            None,
        );
        assert_eq!(st, 204);
    }
    let pid = s.pid();
    drop(s);
    assert_host_clean(pid);
}

#[test]
fn a_fork_past_the_caps_on_sessions_is_a_conflict_and_bash_copies_its_workspace() {
    let s = server(&["--max-sessions-per-key", "2"]);
    let (st, v) = call(
        &s,
        KEY_A,
        Method::POST,
        "/v1/sessions",
        Some(json!({"language": "bash"})),
    );
    assert_eq!(st, 201, "{v}");
    let parent = v["id"].as_str().unwrap().to_string();
    // main.sh is where a bash run's code is written: a file of that name cannot travel as an
    // input file (found by schemathesis on a Go session's main.go).
    code(
        &s,
        &parent,
        "echo kept > a.txt; echo 'echo x' > main.sh; X=1",
    );
    let (st, v) = fork(&s, KEY_A, &parent);
    assert_eq!(st, 201, "{v}");
    assert_eq!(
        (v["state_bytes"].as_u64(), v["workspace_files"].as_u64()),
        (Some(0), Some(1)),
        "{v}"
    );
    assert_eq!(
        v["skipped"],
        json!(["/workspace/main.sh (where a call's code is written)"]),
        "{v}"
    );
    let child = v["id"].as_str().unwrap().to_string();
    let out = code(&s, &child, "cat a.txt; echo \"X=${X:-unset}\"");
    assert_eq!(out["stdout"], "kept\nX=unset\n", "{out}");
    // The key holds two sessions, its maximum: a third is no room for a copy.
    let (st, v) = fork(&s, KEY_A, &parent);
    assert_eq!(st, 409, "{v}");
    assert_eq!(v["error"]["category"], "conflict", "{v}");
    let (st, v) = fork(&s, KEY_A, "sesnosuchsession");
    assert_eq!(st, 404, "{v}");
}
