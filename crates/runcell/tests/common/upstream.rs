//! A scripted model API for the agent loop's tests (tests/upstream/scripted.py, which checks
//! runcell's requests and its own answers against the official `anthropic` and `openai`
//! Python packages in target/agent-venv), and helpers to drive `POST /v1/agents`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};

use super::ServeProcess;

/// The venv with the official `openai` and `anthropic` packages.
pub fn venv_python() -> PathBuf {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/agent-venv/bin/python");
    assert!(
        p.exists(),
        "the openai and anthropic Python packages are not installed at {}: run scripts/test.sh",
        p.display()
    );
    p
}

pub fn upstream_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/upstream")
}

/// tests/upstream/scripted.py on a loopback port, replaying `steps` in one wire format.
pub struct ScriptedUpstream {
    child: Child,
    pub base: String,
    dir: tempfile::TempDir,
}

impl ScriptedUpstream {
    pub fn start(wire: &str, steps: Value) -> ScriptedUpstream {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("script.json"), steps.to_string()).unwrap();
        let mut child = Command::new(venv_python())
            .arg(upstream_dir().join("scripted.py"))
            .args(["--wire", wire, "--script"])
            .arg(dir.path().join("script.json"))
            .arg("--record")
            .arg(dir.path().join("requests.jsonl"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let root = line
            .trim()
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("scripted upstream did not start: {line:?}"))
            .to_string();
        // Each vendor's base URL as its SDK has it: Anthropic's without /v1, OpenAI's with.
        let base = if wire == "openai" {
            format!("{root}/v1")
        } else {
            root
        };
        ScriptedUpstream { child, base, dir }
    }

    /// The requests runcell sent, each checked by the upstream (`invalid` says what was wrong).
    pub fn requests(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.path().join("requests.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// The requests, asserting that every one of them was valid in its wire format.
    pub fn valid_requests(&self) -> Vec<Value> {
        let r = self.requests();
        for q in &r {
            assert!(
                q.get("invalid").is_none(),
                "runcell sent an invalid request: {q}"
            );
        }
        r
    }

    /// `runcell serve` with this upstream behind /v1/agents.
    pub fn serve(&self, wire: &str, extra: &[&str]) -> ServeProcess {
        let mut args = vec![
            "--pool",
            "python=0",
            "--agent-upstream",
            wire,
            "--agent-base-url",
            &self.base,
            "--agent-model",
            "scripted-model",
        ];
        args.extend_from_slice(extra);
        ServeProcess::start(&args, &[("RUNCELL_AGENT_API_KEY", UPSTREAM_KEY)])
    }
}

impl Drop for ScriptedUpstream {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub const UPSTREAM_KEY: &str = "sk-upstream-secret-4711";

pub fn agents(s: &ServeProcess, body: Value) -> (u16, Value) {
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/agents"))
        .json(&body)
        .timeout(Duration::from_secs(90))
        .send()
        .unwrap();
    let status = res.status().as_u16();
    (status, res.json().unwrap())
}

pub fn ask(question: &str, extra: Value) -> Value {
    let mut body = json!({"messages": [{"role": "user", "content": question}],
        "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

/// The server's log once `done` says it holds what the test waits for (at most a minute: hang
/// protection, not a timing assertion).
pub fn log_with(s: &ServeProcess, done: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let log = s.log();
        if done(&log) || std::time::Instant::now() > deadline {
            return log;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The tool results runcell sent in one request, in the wire's own shape: (text, is_error).
pub fn tool_results(wire: &str, request: &Value) -> Vec<(String, bool)> {
    let msgs = request["body"]["messages"].as_array().unwrap();
    if wire == "openai" {
        msgs.iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                let text = m["content"].as_str().unwrap().to_string();
                let err = text.starts_with("ERROR");
                (text, err)
            })
            .collect()
    } else {
        msgs.iter()
            .filter_map(|m| m["content"].as_array())
            .flatten()
            .filter(|b| b["type"] == "tool_result")
            .map(|b| {
                (
                    b["content"].as_str().unwrap().to_string(),
                    b["is_error"].as_bool().unwrap(),
                )
            })
            .collect()
    }
}

/// The audit lines of runs (not of model calls) in a server's log.
pub fn run_lines(log: &str) -> Vec<Value> {
    log.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l.get("event").is_none() && l.get("code_sha256").is_some())
        .collect()
}
