//! runcell at its container's memory limit (issue 23).
//!
//! Inside a 1 GiB container runcell sized everything from the node's /proc/meminfo: one request
//! within the derived maxima (memory 1500M, disk 1500M) filled its tmpfs, those pages belonged
//! to no process, and the container's OOM killer took the server. Here a v1 memory cgroup with
//! a 1 GiB limit stands in for the container: `runcell serve` starts inside it, its maxima must
//! come from that limit, and what a hostile key can send at the maxima at once (runs filling
//! their tmpfs and allocating to the memory maximum, fork bombs, sessions holding memory) must
//! end as those runs' errors while the server lives on. Once with cgroups (runs' groups under
//! the container's), once without (a read-only cgroupfs, as in an unprivileged pod): then the
//! memory ledger and the OOM order (sandbox processes 1000) are what keep the server alive.
//!
//! The figures (limit, maxima, peak use of the container group, OOM kills) are printed.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use reqwest::blocking::Client;
use serde_json::{json, Value};

const GIB: u64 = 1 << 30;
const MIB: u64 = 1 << 20;

/// A v1 memory group with a 1 GiB limit (memory+swap too where swap is accounted), removed
/// with what runcell left in it when dropped.
struct ContainerGroup {
    dir: PathBuf,
}

impl ContainerGroup {
    fn new(tag: &str) -> ContainerGroup {
        let dir = PathBuf::from(format!(
            "/sys/fs/cgroup/memory/runcell-ctest-{tag}-{}",
            std::process::id()
        ));
        std::fs::create_dir(&dir).expect("make the test's memory group");
        std::fs::write(dir.join("memory.limit_in_bytes"), GIB.to_string()).unwrap();
        let memsw = dir.join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            std::fs::write(&memsw, GIB.to_string()).unwrap();
        }
        ContainerGroup { dir }
    }

    fn procs(&self) -> String {
        self.dir.join("cgroup.procs").display().to_string()
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    fn value(&self, file: &str) -> u64 {
        self.read(file).trim().parse().unwrap_or(0)
    }

    /// OOM kills of processes in the group itself (v1 counts them per group: the server is
    /// here, the sandboxes' processes are in groups below).
    fn oom_kills(&self) -> u64 {
        self.read("memory.oom_control")
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill ")?.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for ContainerGroup {
    fn drop(&mut self) {
        // Children first (runcell's base group and any run group left), then the group.
        fn remove(dir: &Path) {
            if let Ok(entries) = std::fs::read_dir(dir) {
                for e in entries.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        remove(&e.path());
                    }
                }
            }
            for _ in 0..100 {
                if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            eprintln!("could not remove {}", dir.display());
        }
        remove(&self.dir);
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(600))
        .build()
        .unwrap()
}

fn post(s: &ServeProcess, path: &str, body: Value) -> (u16, Value) {
    let res = client()
        .post(s.url(path))
        .json(&body)
        .send()
        .expect("request");
    let status = res.status().as_u16();
    let text = res.text().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn get(s: &ServeProcess, path: &str) -> (u16, Value) {
    let res = client().get(s.url(path)).send().expect("request");
    let status = res.status().as_u16();
    let text = res.text().unwrap_or_default();
    (
        status,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

/// Fill the scratch disk until it is full, then allocate (touched pages) until stopped.
const FILL_THEN_ALLOCATE: &str = "\
import os
n = 0
try:
    with open('/tmp/fill', 'wb') as f:
        while True:
            f.write(b'\\x01' * (1 << 20)); n += 1
except OSError:
    pass
print('disk MiB', n, flush=True)
held = []
while True:
    held.append(b'\\x02' * (16 << 20))
";

/// What one hostile request did: its kind, the HTTP status and the error category (or "ok").
type Outcome = (&'static str, u16, String);

fn category(status: u16, v: &Value) -> String {
    match v["error"]["category"].as_str() {
        Some(c) => c.to_string(),
        None if status == 200 || status == 201 => "ok".into(),
        None => format!("status {status}"),
    }
}

/// Everything at once: two runs at the memory and disk maxima that fill their disk and then
/// allocate, a fork bomb, two sessions at the memory maximum that allocate past it, and two
/// runs at the defaults that allocate past them.
fn hostile_load(s: &ServeProcess, max_memory: u64, max_disk: u64) -> Vec<Outcome> {
    let mut threads: Vec<std::thread::JoinHandle<Vec<Outcome>>> = Vec::new();
    for _ in 0..2 {
        let body = json!({"language": "python", "code": FILL_THEN_ALLOCATE,
            "memory": max_memory, "disk": max_disk, "timeout": "60s"});
        let url = s.url("/v1/execute");
        threads.push(std::thread::spawn(move || {
            let res = client().post(url).json(&body).send().expect("request");
            let st = res.status().as_u16();
            let v: Value = res.json().unwrap_or(Value::Null);
            vec![("fill", st, category(st, &v))]
        }));
    }
    {
        let body = json!({"language": "bash", "code": "f(){ f | f & }; f; sleep 5",
            "timeout": "10s"});
        let url = s.url("/v1/execute");
        threads.push(std::thread::spawn(move || {
            let res = client().post(url).json(&body).send().expect("request");
            let st = res.status().as_u16();
            let v: Value = res.json().unwrap_or(Value::Null);
            vec![("fork bomb", st, category(st, &v))]
        }));
    }
    for _ in 0..2 {
        let base = s.base.clone();
        threads.push(std::thread::spawn(move || {
            let c = client();
            let res = c
                .post(format!("{base}/v1/sessions"))
                .json(&json!({"language": "python", "memory": max_memory}))
                .send()
                .expect("request");
            let st = res.status().as_u16();
            let v: Value = res.json().unwrap_or(Value::Null);
            let mut out = vec![("session create", st, category(st, &v))];
            if let Some(id) = v["id"].as_str() {
                let res = c
                    .post(format!("{base}/v1/sessions/{id}/execute"))
                    .json(&json!({"code": "held = []\nwhile True:\n    held.append(b'\\x03' * (16 << 20))\n",
                        "timeout": "60s"}))
                    .send()
                    .expect("request");
                let st = res.status().as_u16();
                let v: Value = res.json().unwrap_or(Value::Null);
                out.push(("session allocate", st, category(st, &v)));
                let _ = c.delete(format!("{base}/v1/sessions/{id}")).send();
            }
            out
        }));
    }
    for _ in 0..2 {
        let body = json!({"language": "python", "timeout": "60s",
            "code": "held = []\nwhile True:\n    held.append(b'\\x04' * (16 << 20))\n"});
        let url = s.url("/v1/execute");
        threads.push(std::thread::spawn(move || {
            let res = client().post(url).json(&body).send().expect("request");
            let st = res.status().as_u16();
            let v: Value = res.json().unwrap_or(Value::Null);
            vec![("allocate", st, category(st, &v))]
        }));
    }
    threads
        .into_iter()
        .flat_map(|t| t.join().expect("a load thread panicked"))
        .collect()
}

/// The server in `group` through `wrapper`, then the figures, the load, and the checks.
fn at_the_limit(group: &ContainerGroup, wrapper: &[&str], expect_cgroup: bool) {
    let s = ServeProcess::start_via(
        wrapper,
        "127.0.0.1:0",
        &[
            "--max-concurrent",
            "2",
            "--max-queue",
            "8",
            "--pool",
            "python=1",
        ],
        &[],
    );
    let pid = s.pid();
    let in_group = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        in_group.contains(group.dir.file_name().unwrap().to_str().unwrap()),
        "the server runs in the test's group: {in_group}"
    );

    let (st, rt) = get(&s, "/v1/runtimes");
    assert_eq!(st, 200, "{rt}");
    let memory = &rt["memory"];
    let max_memory = rt["limits"]["maximum"]["memory"].as_u64().unwrap();
    let max_disk = rt["limits"]["maximum"]["disk"].as_u64().unwrap();
    let all_runs = memory["all_runs_bytes"].as_u64().unwrap();
    let ledger = memory["ledger_bytes"].as_u64().unwrap();
    eprintln!(
        "FIGURES limit {} MiB ({}); all runs {} MiB; ledger {} MiB; max memory {} MiB; \
         max disk {} MiB",
        memory["bytes"].as_u64().unwrap_or(0) / MIB,
        memory["source"],
        all_runs / MIB,
        ledger / MIB,
        max_memory / MIB,
        max_disk / MIB
    );
    assert_eq!(memory["bytes"], GIB, "sized from the group's limit: {rt}");
    assert!(
        memory["source"].as_str().unwrap().contains("runcell-ctest"),
        "{rt}"
    );
    assert!(all_runs < GIB && ledger <= all_runs, "{rt}");
    assert!(
        max_memory + max_disk <= ledger,
        "a run at both maxima fits in the ledger: {rt}"
    );

    // Sandbox processes are the OOM killer's first choice.
    let (st, v) = post(
        &s,
        "/v1/execute",
        json!({"language": "bash", "code": "cat /proc/self/oom_score_adj"}),
    );
    assert_eq!((st, &v["stdout"]), (200, &json!("1000\n")), "{v}");

    let outcomes = hostile_load(&s, max_memory, max_disk);
    eprintln!("OUTCOMES {outcomes:?}");
    eprintln!(
        "FIGURES peak use of the group {} MiB; times the group's limit was hit {}; OOM kills \
         in the group {}",
        group.value("memory.max_usage_in_bytes") / MIB,
        group.value("memory.failcnt"),
        group.oom_kills()
    );

    // The server is alive, the same process, and answers.
    assert!(Path::new(&format!("/proc/{pid}")).exists(), "server gone");
    let (st, v) = get(&s, "/healthz");
    assert_eq!(st, 200, "{v}");
    let (st, v) = post(
        &s,
        "/v1/execute",
        json!({"language": "python", "code": "print(6 * 7)"}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["stdout"], "42\n", "{v}");
    assert_eq!(
        group.oom_kills(),
        0,
        "no process of the group itself (the server) was OOM-killed"
    );
    assert!(
        s.log().find("panicked").is_none(),
        "the server's log: {}",
        s.log()
    );

    // Each run ended in its own limits; none was granted what it could not hold.
    let memory_errors = ["memory_limit", "disk_limit", "runtime_error"];
    for (kind, st, cat) in &outcomes {
        match *kind {
            "fill" | "allocate" | "session allocate" => assert!(
                memory_errors.contains(&cat.as_str()),
                "{kind}: {st} {cat} ({outcomes:?})"
            ),
            "fork bomb" => assert!(
                ["process_limit", "timeout", "ok", "memory_limit"].contains(&cat.as_str()),
                "{kind}: {st} {cat}"
            ),
            // A session that does not fit beside the runs of the moment is refused, naming
            // memory; or created.
            "session create" => assert!(
                *st == 201 || *st == 429,
                "{kind}: {st} {cat} ({outcomes:?})"
            ),
            _ => unreachable!(),
        }
    }
    let enforcement_cgroup = {
        let (_, v) = post(
            &s,
            "/v1/execute",
            json!({"language": "bash", "code": "true"}),
        );
        v["enforcement"]["cgroup"]
            .as_str()
            .unwrap_or("")
            .to_string()
    };
    if expect_cgroup {
        assert_eq!(enforcement_cgroup, "v1");
        // The runs' groups are under the container's group, inside its limit.
        let base = group.dir.join("runcell");
        assert!(
            base.is_dir(),
            "runcell's groups live under the container's group"
        );
        assert_eq!(
            std::fs::read_to_string(base.join("memory.limit_in_bytes"))
                .unwrap()
                .trim(),
            all_runs.to_string()
        );
    } else {
        assert_eq!(enforcement_cgroup, "none");
    }
}

#[test]
#[cfg_attr(not(host_root), ignore = "needs root to make a memory cgroup")]
#[cfg_attr(
    host_cgroup_v2,
    ignore = "makes a v1 memory group; the v2 placement is pinned by the jail's fake-fs tests"
)]
fn the_server_survives_its_containers_memory_limit_with_cgroups() {
    if !Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        eprintln!("SKIP: no v1 memory hierarchy at /sys/fs/cgroup/memory");
        return;
    }
    let group = ContainerGroup::new("cg");
    let procs = group.procs();
    at_the_limit(
        &group,
        &["sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", &procs],
        true,
    );
}

#[test]
#[cfg_attr(
    not(all(host_root, host_unshare)),
    ignore = "needs root and unshare (util-linux) for a private mount namespace"
)]
#[cfg_attr(
    host_cgroup_v2,
    ignore = "makes a v1 memory group; the v2 placement is pinned by the jail's fake-fs tests"
)]
fn the_server_survives_its_containers_memory_limit_without_cgroups() {
    if !Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        eprintln!("SKIP: no v1 memory hierarchy at /sys/fs/cgroup/memory");
        return;
    }
    let group = ContainerGroup::new("nocg");
    let procs = group.procs();
    // As in an unprivileged pod: the cgroup filesystems are there but read-only, so runcell
    // reads its limit but makes no groups (limits by rlimits and the tmpfs size only).
    let script = "echo $$ > \"$0\" && \
        for m in $(awk '{for (i = 7; i <= NF; i++) if ($i == \"-\") { \
            if ($(i+1) == \"cgroup\" || $(i+1) == \"cgroup2\") print $5; break } }' \
            /proc/self/mountinfo); do mount -o remount,bind,ro \"$m\" || exit 1; done && \
        exec \"$@\"";
    at_the_limit(
        &group,
        &[
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            &procs,
        ],
        false,
    );
}
