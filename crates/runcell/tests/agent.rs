//! The agent loop (issue 12) with real sandboxes and a scripted model: the first run fails
//! with ModuleNotFoundError, the error reaches the model as a tool error with its category,
//! the corrected run builds on the first one's state (one session per language), the answer
//! comes back, and the request's sessions are gone afterwards.
//!
//! The route and CLI tests put `runcell serve` and `runcell agent` in front of
//! tests/upstream/scripted.py, a scripted model API that speaks both wire formats and checks
//! its answers and runcell's requests against the official `anthropic` and `openai` Python
//! packages; /v1/agents is also driven by the official `openai` client
//! (tests/upstream/openai_client.py). Both need target/agent-venv (scripts/test.sh builds it).

mod common;

use common::upstream::*;

use std::path::Path;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use runcell_agent::tools::{offered, ServiceTools};
use runcell_agent::{
    run_agent, Bounds, Conversation, Item, Model, ModelError, StopReason, ToolCall, ToolSpec, Turn,
    Usage,
};
use runcell_core::{Caller, Engine, EngineConfig, RunService};
use serde_json::{json, Value};

struct Scripted {
    turns: Mutex<Vec<Turn>>,
    seen: Mutex<Vec<Conversation>>,
}

impl Model for Scripted {
    fn complete<'a>(
        &'a self,
        conv: &'a Conversation,
        _: &'a [ToolSpec],
        _: Duration,
    ) -> BoxFuture<'a, Result<Turn, ModelError>> {
        self.seen.lock().unwrap().push(conv.clone());
        let t = self.turns.lock().unwrap().pop();
        Box::pin(async move { t.ok_or_else(|| ModelError::Malformed("over".into())) })
    }
}

fn call(id: &str, code: &str) -> Turn {
    Turn {
        text: None,
        calls: vec![ToolCall {
            id: id.into(),
            name: "code_exec_python".into(),
            arguments: json!({"code": code}),
        }],
        stop: StopReason::ToolUse,
        usage: Usage::default(),
        model: None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_import_is_fixed_in_the_same_session_and_answered() {
    let mut c = EngineConfig::for_host();
    c.helper_exe = common::runcell_bin();
    let engine = Engine::new(c);
    let catalog = runcell_mcp::Catalog::for_host(&engine);
    let (tools, unknown) = offered(
        &catalog,
        engine.config(),
        &["code_exec_python".into(), "code_exec_cobol".into()],
    );
    let service = RunService::local(engine);
    let sessions = service.sessions().clone();
    assert_eq!(unknown, ["code_exec_cobol"]);
    assert!(tools[0].input_schema["properties"]
        .get("session_id")
        .is_none());
    let mut turns = vec![
        call(
            "1",
            "data = [23, 45, 67, 12, 89, 34, 56, 78, 90, 11]\nimport no_such_module_here",
        ),
        call(
            "2",
            "import statistics\nprint(round(statistics.pstdev(data), 2))",
        ),
        Turn {
            text: Some("28.64".into()),
            calls: vec![],
            stop: StopReason::EndTurn,
            usage: Usage::default(),
            model: None,
        },
    ];
    turns.reverse();
    let model = Scripted {
        turns: Mutex::new(turns),
        seen: Mutex::new(Vec::new()),
    };
    let caller = Caller::local("agent");
    let ticket = service.reserve(&caller).unwrap();
    let runner = ServiceTools::new(
        service,
        caller,
        ticket,
        Vec::new(),
        std::time::Instant::now() + Bounds::default().deadline,
    );
    let conv = Conversation {
        system: None,
        items: vec![Item::User("std?".into())],
    };
    let o = run_agent(&model, &runner, &tools, conv, &Bounds::default(), &|_| {})
        .await
        .unwrap();
    assert_eq!(
        (o.answer.as_str(), o.code_attempts, o.model_calls),
        ("28.64", 2, 3)
    );
    assert_eq!(
        o.steps[0].verdict.error.as_ref().unwrap().category.as_str(),
        "runtime_error"
    );
    assert_eq!(
        o.steps[1].verdict.stdout, "28.64\n",
        "{:?}",
        o.steps[1].verdict
    );
    {
        let seen = model.seen.lock().unwrap();
        match &seen[1].items[2] {
            Item::ToolResult {
                content, is_error, ..
            } => {
                assert!(*is_error);
                assert!(
                    content.contains("runtime_error") && content.contains("ModuleNotFoundError"),
                    "{content}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sessions.stats().live, 1);
    tokio::task::spawn_blocking(move || runner.close())
        .await
        .unwrap();
    assert_eq!(sessions.stats().live, 0);
}

fn metrics(s: &common::ServeProcess) -> String {
    reqwest::blocking::get(s.url("/metrics"))
        .unwrap()
        .text()
        .unwrap()
}

/// The hosted example, in both wire formats: a failed import goes back to the model as a tool
/// error naming its category, the corrected run (in the same session: `data` is still
/// defined) answers, and the answer comes back with usage summed, each step, audit lines
/// for each model call and run, and metrics. The upstream key reaches the upstream only.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn a_failed_import_goes_back_as_a_tool_error_and_the_fix_answers_in_both_wire_formats() {
    for wire in ["anthropic", "openai"] {
        let up = ScriptedUpstream::start(
            wire,
            json!([
                {"text": "Let me compute it.",
                 "code": "data = [23, 45, 67, 12, 89, 34, 56, 78, 90, 11]\nimport scipy_not_here"},
                {"code": "import statistics\nprint(round(statistics.pstdev(data), 2))"},
                {"text": "The standard deviation is 28.64.", "usage": [30, 8]},
            ]),
        );
        let s = up.serve(wire, &[]);
        let (status, v) = agents(
            &s,
            json!({"messages": [{"role": "user", "content": "Standard deviation of [23, 45, 67, 12, 89, 34, 56, 78, 90, 11]?"}],
                "tools": [{"type": "heroku_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 5}}]}),
        );
        assert_eq!(status, 200, "{wire}: {v}");
        assert_eq!(v["object"], "chat.completion");
        assert_eq!(
            v["choices"][0]["message"]["content"],
            "The standard deviation is 28.64."
        );
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
        assert_eq!(v["model"], "scripted-model");
        assert_eq!(v["usage"]["prompt_tokens"], 50);
        assert_eq!(v["usage"]["total_tokens"], 64);
        assert_eq!(v["runcell"]["code_attempts"], 2);
        assert_eq!(v["runcell"]["model_calls"], 3);
        let steps = v["runcell"]["steps"].as_array().unwrap();
        assert_eq!(steps[0]["tool"], "code_exec_python");
        assert_eq!(steps[0]["verdict"]["error"]["category"], "runtime_error");
        assert_eq!(steps[1]["verdict"]["stdout"], "28.64\n");

        let reqs = up.valid_requests();
        assert_eq!(reqs.len(), 3, "{wire}");
        let results = tool_results(wire, &reqs[1]);
        assert_eq!(results.len(), 1, "{wire}: {results:?}");
        let (text, is_error) = &results[0];
        assert!(*is_error, "{wire}: {text}");
        assert!(
            text.contains("runtime_error") && text.contains("ModuleNotFoundError"),
            "{wire}: {text}"
        );
        assert!(
            !tool_results(wire, &reqs[2])[1].1,
            "{wire}: the fix is no error"
        );
        let tools = &reqs[0]["body"]["tools"];
        if wire == "anthropic" {
            assert_eq!(tools[0]["name"], "code_exec_python");
            assert!(tools[0]["input_schema"]["properties"]["code"].is_object());
            assert_eq!(reqs[0]["x_api_key"], UPSTREAM_KEY);
            assert_eq!(reqs[0]["anthropic_version"], "2023-06-01");
            assert_eq!(reqs[0]["path"], "/v1/messages");
        } else {
            assert_eq!(tools[0]["function"]["name"], "code_exec_python");
            assert_eq!(reqs[0]["authorization"], format!("Bearer {UPSTREAM_KEY}"));
            assert_eq!(reqs[0]["path"], "/v1/chat/completions");
        }
        let schema = if wire == "anthropic" {
            &tools[0]["input_schema"]
        } else {
            &tools[0]["function"]["parameters"]
        };
        assert!(
            schema["properties"].get("session_id").is_none(),
            "the loop keeps the session: {schema}"
        );
        assert_eq!(reqs[0]["body"]["model"], "scripted-model");

        // The server writes its audit lines before it answers; the test reads its stderr on a
        // thread of its own, which may not have them yet.
        let log = log_with(&s, |log| {
            log.matches("\"event\":\"model_call\"").count() >= 3
        });
        assert!(!v.to_string().contains(UPSTREAM_KEY));
        assert!(!log.contains(UPSTREAM_KEY), "{wire}: the key is in the log");
        let lines: Vec<Value> = log
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .collect();
        let calls: Vec<&Value> = lines
            .iter()
            .filter(|l| l["event"] == "model_call")
            .collect();
        assert_eq!(calls.len(), 3, "{wire}: {log}");
        assert!(calls
            .iter()
            .all(|c| c["upstream"] == wire && c["outcome"] == "ok"));
        assert_eq!(calls[0]["tool_calls"], 1);
        assert_eq!(
            lines
                .iter()
                .filter(|l| l["session_id"]
                    .as_str()
                    .is_some_and(|s| s.starts_with("ses")))
                .count(),
            2,
            "{wire}: an audit line per run: {log}"
        );
        let m = metrics(&s);
        for line in [
            "runcell_agent_requests_total{outcome=\"ok\"} 1",
            "runcell_agent_model_calls_total{outcome=\"ok\"} 3",
            "runcell_agent_runs_per_request_sum 2",
            "runcell_agent_tokens_total{kind=\"prompt\"} 50",
            "runcell_agent_tokens_total{kind=\"completion\"} 14",
            "runcell_sessions_created_total 1",
        ] {
            assert!(m.contains(line), "{wire}: {line} in\n{m}");
        }
        // The request's session ends with it (torn down off the request's path).
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !metrics(&s).contains("runcell_sessions 0\n") {
            assert!(
                std::time::Instant::now() < deadline,
                "{wire}: the session outlived its request"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// `max_calls` reached: the refused call goes back to the model telling it to answer; then
/// `max_code_retries` reached: after the second failure in a row, the result says to stop
/// running code and give the best answer.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn max_calls_and_max_code_retries_tell_the_model_to_answer() {
    let up = ScriptedUpstream::start(
        "anthropic",
        json!([
            {"code": "print(1)"},
            {"code": "print(2)"},
            {"text": "one call was all I had: 1"},
            {"code": "1/0"},
            {"code": "undefined_name"},
            {"text": "the code kept failing"},
        ]),
    );
    let s = up.serve("anthropic", &[]);
    let (status, v) = agents(
        &s,
        json!({"messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 1}}]}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["runcell"]["code_attempts"], 1);
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "one call was all I had: 1"
    );
    let reqs = up.valid_requests();
    let (text, is_error) = tool_results("anthropic", &reqs[2]).pop().unwrap();
    assert!(is_error);
    assert!(
        text.contains("at most 1 times") && text.contains("best answer"),
        "{text}"
    );

    let (status, v) = agents(&s, ask("q", json!({"max_code_retries": 2})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["runcell"]["code_attempts"], 2);
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "the code kept failing"
    );
    let reqs = up.valid_requests();
    let results = tool_results("anthropic", &reqs[5]);
    let (first, last) = (&results[0].0, &results[1].0);
    assert!(
        first.contains("ZeroDivisionError") && !first.contains("best answer"),
        "{first}"
    );
    assert!(
        last.contains("NameError")
            && last.contains("failed 2 times in a row")
            && last.contains("best answer"),
        "{last}"
    );
}

/// A tool that was not offered: the model is told which tools there are, and answers.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn a_tool_that_was_not_offered_is_refused_to_the_model() {
    let up = ScriptedUpstream::start(
        "openai",
        json!([
            {"code": "puts 1", "tool": "code_exec_ruby"},
            {"code": "print(1)"},
            {"text": "1"},
        ]),
    );
    let s = up.serve("openai", &[]);
    let (status, v) = agents(&s, ask("q", json!({})));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["runcell"]["code_attempts"], 1);
    let reqs = up.valid_requests();
    let (text, is_error) = tool_results("openai", &reqs[1]).pop().unwrap();
    assert!(is_error);
    assert!(
        text.contains("no tool named \"code_exec_ruby\"") && text.contains("code_exec_python"),
        "{text}"
    );
}

/// The upstream failing: a 429 then success is retried (Retry-After honoured); a 500 every
/// time, a malformed answer and a hang are errors with a category, 502 or 504, never a 500 or
/// a hang of runcell's own; each failed model call is audited and counted.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn upstream_failures_are_retried_or_answered_with_a_category() {
    for wire in ["anthropic", "openai"] {
        let up = ScriptedUpstream::start(
            wire,
            json!([
                {"status": 429, "retry_after": 0},
                {"text": "after the 429"},
                {"status": 500, "times": 3},
                {"raw": "<html>not json</html>"},
                {"json": {"id": "x", "unexpected": true}},
                {"hang": true},
            ]),
        );
        let s = up.serve(wire, &["--agent-timeout", "3s"]);
        let (status, v) = agents(&s, ask("q", json!({})));
        assert_eq!(status, 200, "{wire}: {v}");
        assert_eq!(v["choices"][0]["message"]["content"], "after the 429");
        assert_eq!(
            v["runcell"]["model_calls"], 1,
            "the retry is within one call"
        );

        let (status, v) = agents(&s, ask("q", json!({})));
        assert_eq!(
            (status, v["error"]["category"].as_str()),
            (502, Some("upstream_unavailable")),
            "{wire}: {v}"
        );
        assert!(
            v["error"]["message"].as_str().unwrap().contains("HTTP 500"),
            "{v}"
        );

        for _ in 0..2 {
            let (status, v) = agents(&s, ask("q", json!({})));
            assert_eq!(
                (status, v["error"]["category"].as_str()),
                (502, Some("upstream_malformed")),
                "{wire}: {v}"
            );
        }

        let started = std::time::Instant::now();
        let (status, v) = agents(&s, ask("q", json!({})));
        assert_eq!(status, 504, "{wire}: {v}");
        assert!(
            ["upstream_timeout", "timeout"].contains(&v["error"]["category"].as_str().unwrap()),
            "{v}"
        );
        assert!(started.elapsed() < Duration::from_secs(30));

        let reqs = up.valid_requests();
        assert_eq!(reqs.len(), 8, "{wire}: 2 + 3 + 1 + 1 + 1 requests");
        let m = metrics(&s);
        for line in [
            "runcell_agent_requests_total{outcome=\"ok\"} 1",
            "runcell_agent_requests_total{outcome=\"upstream_unavailable\"} 1",
            "runcell_agent_requests_total{outcome=\"upstream_malformed\"} 2",
            "runcell_agent_model_calls_total{outcome=\"upstream_malformed\"} 2",
        ] {
            assert!(m.contains(line), "{wire}: {line} in\n{m}");
        }
        let log = log_with(&s, |log| {
            log.matches("\"event\":\"model_call\"").count() >= 5
        });
        assert_eq!(
            log.matches("\"event\":\"model_call\"").count(),
            5,
            "{wire}: a line per model call, the abandoned one too: {log}"
        );
        assert!(!log.contains(UPSTREAM_KEY));
    }
}

/// The official openai Python client, its base URL at runcell's /v1/agents: a chat completion
/// and a stream of chunks, parsed by the client's own types, with runcell's API key.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn the_official_openai_client_drives_the_agents_route() {
    let up = ScriptedUpstream::start(
        "anthropic",
        json!([
            {"code": "print(6 * 7)"},
            {"text": "42"},
            {"text": "Running it.", "code": "import time\nprint('step one', flush=True)\ntime.sleep(0.3)\nprint(6 * 7)"},
            {"text": "It is 42."},
        ]),
    );
    let s = up.serve("anthropic", &["--api-key", "runcell-client-key-1234567"]);
    let out = Command::new(venv_python())
        .arg(upstream_dir().join("openai_client.py"))
        .arg(s.url("/v1/agents"))
        .arg("runcell-client-key-1234567")
        .output()
        .unwrap();
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("completion ok") && stdout.contains("stream ok"),
        "{stdout}\n{stderr}"
    );
    up.valid_requests();
}

/// `runcell agent`: each step on stderr as it happens, the answer on stdout; `--json` prints
/// the chat.completion object; an upstream that is not configured is a usage error.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn the_cli_shows_each_step_then_the_answer() {
    let up = ScriptedUpstream::start(
        "anthropic",
        json!([
            {"code": "print(open('n.txt').read().strip())"},
            {"text": "the file says 7"},
            {"code": "print(2 + 2)"},
            {"text": "4"},
        ]),
    );
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("n.txt");
    std::fs::write(&input, "7\n").unwrap();
    let agent = |extra: &[&str]| {
        Command::new(common::runcell_bin())
            .args([
                "agent",
                "What does n.txt say?",
                "--file",
                input.to_str().unwrap(),
                "--max-calls",
                "3",
            ])
            .args(extra)
            .env("RUNCELL_AGENT_UPSTREAM", "anthropic")
            .env("RUNCELL_AGENT_BASE_URL", &up.base)
            .env("RUNCELL_AGENT_MODEL", "scripted-model")
            .env("RUNCELL_AGENT_API_KEY", UPSTREAM_KEY)
            .output()
            .unwrap()
    };
    let out = agent(&[]);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout, "the file says 7\n");
    assert!(
        stderr.contains("--- code_exec_python ---") && stderr.contains("--- stdout ---\n7\n"),
        "{stderr}"
    );
    assert!(!stderr.contains(UPSTREAM_KEY));

    let out = agent(&["--json"]);
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "4");
    assert_eq!(v["runcell"]["steps"][0]["verdict"]["stdout"], "4\n");
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    up.valid_requests();

    let out = Command::new(common::runcell_bin())
        .args(["agent", "q"])
        .env_remove("RUNCELL_AGENT_UPSTREAM")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RUNCELL_AGENT_UPSTREAM"));
}

/// Regression (issue 21): the agent loop deserialized a model's tool arguments straight into
/// the request, so a model's `memory: "4G"` (and `disk`, `pids`, `cpus`) and a 3600 s
/// `timeout` were accepted up to the operator's maximum (MCP refused the same arguments), and
/// the request's time budget was checked only before model calls (a 3 s budget took 12.2 s).
/// Now a model never sizes its sandbox, and a run's timeout is cut to what is left of the
/// budget; the CLI's loop is the same code (ServiceTools).
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn a_model_never_sizes_its_sandbox_and_its_runs_end_with_the_budget() {
    let sleeper = "import time\ntime.sleep(60)\nprint('late')";
    let up = ScriptedUpstream::start(
        "openai",
        json!([
            {"arguments": {"code": "print(1)", "memory": "4G", "pids": 4096}},
            {"arguments": {"code": sleeper, "timeout": 3600}},
            {"text": "never asked"},
        ]),
    );
    let s = up.serve("openai", &["--agent-timeout", "6s"]);
    let (status, v) = agents(&s, ask("q", json!({})));
    assert_eq!(
        (status, v["error"]["category"].as_str()),
        (504, Some("timeout")),
        "{v}"
    );
    // The model was told that it may not size the sandbox; nothing of that call ran.
    let reqs = up.valid_requests();
    let results = tool_results("openai", &reqs[1]);
    assert!(
        results[0].1 && results[0].0.contains("unknown field `memory`"),
        "{results:?}"
    );
    // The sleeping run was cut to the budget (its limits say so), and never finished.
    let ran = |log: &str| -> Vec<Value> {
        run_lines(log)
            .into_iter()
            .filter(|l| l["category"] != "invalid_request")
            .collect()
    };
    let log = log_with(&s, |log| !ran(log).is_empty());
    let refused: Vec<Value> = run_lines(&log)
        .into_iter()
        .filter(|l| l["category"] == "invalid_request")
        .collect();
    assert_eq!(refused.len(), 1, "the refused call is audited: {log}");
    let runs = ran(&log);
    assert_eq!(runs.len(), 1, "only the second call ran: {log}");
    let timeout = runs[0]["limits"]["timeout"].as_f64().unwrap();
    assert!(
        timeout <= 6.0,
        "the run's timeout is cut to the budget: {}",
        runs[0]
    );
    assert_ne!(runs[0]["category"], "ok", "{}", runs[0]);
}

/// Regression (issue 21): an agent request kept every run's full verdict (10 tool calls of
/// 64 MiB output each answered 640 MiB). A step keeps at most 16 KiB of each of stdout and
/// stderr, and its files without their content; the model is given its own trimmed text.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn agent_steps_keep_a_bounded_record_of_each_run() {
    let up = ScriptedUpstream::start(
        "anthropic",
        json!([
            {"code": "print('x' * 500_000)\nopen('out.bin', 'wb').write(b'y' * 300_000)"},
            {"text": "done"},
        ]),
    );
    let s = up.serve("anthropic", &[]);
    let (status, v) = agents(&s, ask("q", json!({})));
    assert_eq!(status, 200, "{v}");
    let step = &v["runcell"]["steps"][0]["verdict"];
    let stdout = step["stdout"].as_str().unwrap();
    assert!(stdout.len() <= 16 * 1024, "{} bytes", stdout.len());
    assert_eq!(step["stdout_truncated"], true);
    let file = &step["files"][0];
    assert_eq!(
        (file["path"].as_str(), file["size"].as_u64()),
        (Some("out.bin"), Some(300_000))
    );
    assert!(file["content_base64"].is_null(), "{file}");
    assert!(v.to_string().len() < 100_000, "the answer stays small");
}

/// Regression (issue 21): `/v1/agents` requests took no place in line (150 requests of one
/// key made 150 simultaneous model calls with max_concurrent 2). An agent request holds a
/// place from its body to its answer, so requests beyond the line are refused at once.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn agent_requests_hold_a_place_in_line() {
    let up = ScriptedUpstream::start(
        "openai",
        json!([{"hang": true}, {"hang": true}, {"hang": true}]),
    );
    let s = std::sync::Arc::new(up.serve(
        "openai",
        &[
            "--max-concurrent",
            "1",
            "--max-queue",
            "1",
            "--shutdown-grace",
            "1s",
        ],
    ));
    // Two places: two requests wait on the model.
    let held: Vec<_> = (0..2)
        .map(|_| {
            let s = s.clone();
            std::thread::spawn(move || {
                let _ = reqwest::blocking::Client::new()
                    .post(s.url("/v1/agents"))
                    .json(&ask("q", json!({})))
                    .timeout(Duration::from_secs(120))
                    .send();
            })
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while up.requests().len() < 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "the model was never asked"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // The third is refused without asking the model (and at once: a server that let it in
    // would keep it waiting on the hanging model past this client's timeout).
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/agents"))
        .json(&ask("q", json!({})))
        .timeout(Duration::from_secs(20))
        .send()
        .expect("an answer, not a wait on the model");
    assert_eq!(res.status().as_u16(), 429);
    let v: Value = res.json().unwrap();
    assert_eq!(v["error"]["category"], "rate_limited", "{v}");
    assert_eq!(up.requests().len(), 2, "the model was asked only twice");
    // The model goes away: the waiting requests end, and so does the server.
    drop(up);
    for h in held {
        let _ = h.join();
    }
}

#[test]
fn without_an_upstream_the_agents_route_says_how_to_configure_one() {
    let s = common::ServeProcess::start(&["--pool", "python=0"], &[]);
    let (status, v) = agents(&s, ask("q", json!({})));
    assert_eq!(status, 503);
    assert_eq!(v["error"]["category"], "agent_unconfigured");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--agent-upstream"),
        "{v}"
    );
}

/// The request's files are checked before any model call: a path that leaves /workspace, and
/// a file where one of the offered tools writes its code, are 400s that name them, and the
/// model is never asked.
#[test]
#[cfg_attr(
    not(host_agent_clients),
    ignore = "needs the openai and anthropic Python packages (scripts/test.sh installs them in target/agent-venv)"
)]
fn the_files_are_checked_before_the_model_is_called() {
    let up = ScriptedUpstream::start("openai", json!([]));
    let s = up.serve("openai", &[]);
    let tools = json!([{"type": "runcell_tool", "name": "code_exec_python"},
                       {"type": "runcell_tool", "name": "code_exec_bash"}]);
    for (path, named) in [("../etc/x", "leaves /workspace"), ("main.sh", "main.sh")] {
        let (status, v) = agents(
            &s,
            ask(
                "q",
                json!({"tools": tools, "files": [{"path": path, "content": "x"}]}),
            ),
        );
        assert_eq!(status, 400, "{path}: {v}");
        assert_eq!(v["error"]["category"], "invalid_request", "{v}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(named),
            "{v}"
        );
    }
    assert!(
        up.requests().is_empty(),
        "a refused request reached the model"
    );
    // A file named like another language's source is fine when that tool is not offered (the
    // model is asked; this one has nothing scripted, so the answer is a 502).
    let (status, v) = agents(
        &s,
        ask("q", json!({"files": [{"path": "main.sh", "content": "x"}]})),
    );
    assert_eq!(status, 502, "{v}");
    assert!(!up.requests().is_empty());
}

/// schemathesis, pinned, drives the whole HTTP API of a live server from its OpenAPI document:
/// every check (server errors, status codes, content types, response schemas, event-stream
/// schemas, schema-valid requests accepted, schema-violating ones refused, stateful links),
/// seeded and bounded, and any finding or warning fails. The exceptions the document cannot
/// express are in tests/schemathesis/schemathesis.toml, each with its reason. The server has
/// an admin key (so /v1/approvals is reached), this scripted model behind /v1/agents (so the
/// loop answers; every request runcell sent it is checked against the openai SDK's types), and
/// short time limits (a run with 0.01 CPU then ends in seconds). It lives here because the
/// scripted model does.
#[test]
#[cfg_attr(
    not(all(host_schemathesis, host_agent_clients)),
    ignore = "needs schemathesis (target/validators-venv) and the openai/anthropic packages (target/agent-venv): scripts/test.sh installs both"
)]
fn schemathesis_finds_nothing_in_the_api() {
    const KEY: &str = "schemathesis-admin-key-0123456789";
    let up = ScriptedUpstream::start("openai", json!([{"text": "done", "times": 100000}]));
    let s = up.serve(
        "openai",
        &[
            "--admin-key",
            KEY,
            "--max-limit",
            "timeout=2",
            "--default-limit",
            "timeout=2",
            "--max-limit",
            "compile_timeout=4",
            "--default-limit",
            "compile_timeout=4",
        ],
    );
    // A client starts once the server says it is ready, as Kubernetes does: until its probe
    // sandbox is built, /readyz rightly answers 503, which schemathesis takes for a fault.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let st = reqwest::blocking::get(s.url("/readyz")).unwrap().status();
        if st == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "/readyz stayed {st}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // Its working directory keeps a cache of past findings: a fresh one each time, so that
    // the run is the seed's alone.
    let cwd = tempfile::tempdir().unwrap();
    let out = Command::new(root.join("../../target/validators-venv/bin/schemathesis"))
        .current_dir(cwd.path())
        .arg("--no-color")
        .arg("--config-file")
        .arg(root.join("tests/schemathesis/schemathesis.toml"))
        .args(["run", &s.url("/openapi.json")])
        .args(["--max-examples", "5", "--seed", "1"])
        .args(["--generation-database", "none", "--request-timeout", "30"])
        .args(["-H", &format!("Authorization: Bearer {KEY}")])
        .output()
        .unwrap();
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{report}");
    // It really ran, and every operation was tested.
    let count = |label: &str| {
        let at = report
            .find(label)
            .unwrap_or_else(|| panic!("no {label:?} in {report}"));
        report[at + label.len()..]
            .split(|c: char| !c.is_ascii_digit())
            .next()
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    };
    assert!(count("Selected: ") >= 19, "{report}");
    assert_eq!(count("Tested: "), count("Selected: "), "{report}");
    assert!(count("Test cases:\n  ") > 500, "{report}");
    up.valid_requests();
}
