//! The agent loop (issue 12) with real sandboxes and a scripted model: the first run fails
//! with ModuleNotFoundError, the error reaches the model as a tool error with its category,
//! the corrected run builds on the first one's state (one session per language), the answer
//! comes back, and the request's sessions are gone afterwards.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use futures_util::future::BoxFuture;
use runcell_agent::tools::{offered, SessionTools};
use runcell_agent::{
    run_agent, Bounds, Conversation, Item, Model, ModelError, StopReason, ToolCall, ToolSpec, Turn,
    Usage,
};
use runcell_core::{Engine, EngineConfig, KillSwitch, SessionPolicy, Sessions};
use serde_json::json;

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
    let sessions = Sessions::new(engine, SessionPolicy::default());
    let (tools, unknown) = offered(
        &catalog,
        &["code_exec_python".into(), "code_exec_cobol".into()],
    );
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
    let runner = SessionTools::new(
        sessions.clone(),
        None,
        Vec::new(),
        KillSwitch::new().unwrap(),
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

/// A scripted OpenAI-compatible upstream on a loopback port: each connection gets the next
/// canned Chat Completions answer; the requests' bodies are kept.
fn scripted_openai(
    answers: Vec<serde_json::Value>,
) -> (String, std::sync::Arc<Mutex<Vec<serde_json::Value>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = std::sync::Arc::new(Mutex::new(Vec::new()));
    let seen2 = seen.clone();
    std::thread::spawn(move || {
        for answer in answers {
            let (mut sock, _) = listener.accept().unwrap();
            let mut got = Vec::new();
            let mut buf = [0u8; 65536];
            let body = loop {
                let n = sock.read(&mut buf).unwrap();
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_string();
                if let Some(i) = text.find("\r\n\r\n") {
                    let len = text[..i]
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if got.len() >= i + 4 + len {
                        break got[i + 4..i + 4 + len].to_vec();
                    }
                }
            };
            seen2
                .lock()
                .unwrap()
                .push(serde_json::from_slice(&body).unwrap());
            let text = answer.to_string();
            let res = format!("HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{text}", text.len());
            sock.write_all(res.as_bytes()).unwrap();
        }
    });
    (base, seen)
}

fn chat(content: Option<&str>, code: Option<&str>) -> serde_json::Value {
    let mut message = json!({"role": "assistant", "content": content});
    if let Some(code) = code {
        message["tool_calls"] = json!([{"id": format!("call_{}", code.len()), "type": "function",
            "function": {"name": "code_exec_python", "arguments": json!({"code": code}).to_string()}}]);
    }
    json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "scripted",
        "choices": [{"index": 0, "message": message,
            "finish_reason": if code.is_some() { "tool_calls" } else { "stop" }}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}})
}

#[test]
fn the_agents_route_runs_the_loop_against_an_openai_compatible_upstream() {
    let (base, seen) = scripted_openai(vec![
        chat(None, Some("import no_such_module_here")),
        chat(None, Some("print(6 * 7)")),
        chat(Some("42"), None),
    ]);
    let s = common::ServeProcess::start(
        &[
            "--pool",
            "python=0",
            "--agent-upstream",
            "openai",
            "--agent-base-url",
            &base,
            "--agent-model",
            "scripted",
        ],
        &[("RUNCELL_AGENT_API_KEY", "sk-upstream-secret")],
    );
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/agents"))
        .json(&json!({"messages": [{"role": "user", "content": "6 times 7?"}],
            "tools": [{"type": "heroku_tool", "name": "code_exec_python", "runtime_params": {"max_calls": 5}}]}))
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 200);
    let v: serde_json::Value = res.json().unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "42");
    assert_eq!(v["usage"]["total_tokens"], 39);
    assert_eq!(v["runcell"]["code_attempts"], 2);
    assert_eq!(
        v["runcell"]["steps"][0]["verdict"]["error"]["category"],
        "runtime_error"
    );
    assert_eq!(v["runcell"]["steps"][1]["verdict"]["stdout"], "42\n");
    let seen = seen.lock().unwrap();
    // The second model call carries the failed run as a tool message naming the error.
    let msgs = seen[1]["messages"].as_array().unwrap();
    let tool = msgs.iter().find(|m| m["role"] == "tool").unwrap();
    assert!(
        tool["content"]
            .as_str()
            .unwrap()
            .contains("ModuleNotFoundError"),
        "{tool}"
    );
    assert_eq!(seen[0]["tools"][0]["function"]["name"], "code_exec_python");
    // The upstream key is in no answer and no log line.
    assert!(!v.to_string().contains("sk-upstream-secret"));
    assert!(!s.log().contains("sk-upstream-secret"));
    // The request's sessions ended with it; each run was audited.
    let log = s.log();
    assert_eq!(log.matches("\"session_id\":\"ses_").count(), 2, "{log}");
    let metrics = reqwest::blocking::get(s.url("/metrics"))
        .unwrap()
        .text()
        .unwrap();
    for line in [
        "runcell_agent_requests_total{outcome=\"ok\"} 1",
        "runcell_agent_model_calls_total 3",
        "runcell_agent_runs_total 2",
        "runcell_agent_tokens_total{kind=\"prompt\"} 30",
    ] {
        assert!(metrics.contains(line), "{line} in\n{metrics}");
    }
}

#[test]
fn without_an_upstream_the_agents_route_says_how_to_configure_one() {
    let s = common::ServeProcess::start(&["--pool", "python=0"], &[]);
    let res = reqwest::blocking::Client::new()
        .post(s.url("/v1/agents"))
        .json(&json!({"messages": [{"role": "user", "content": "q"}],
            "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}))
        .send()
        .unwrap();
    assert_eq!(res.status().as_u16(), 503);
    let v: serde_json::Value = res.json().unwrap();
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--agent-upstream"),
        "{v}"
    );
}

#[test]
fn the_agents_route_streams_chunks_with_the_steps_and_ends_with_done() {
    let (base, _seen) = scripted_openai(vec![
        chat(None, Some("print(6 * 7)")),
        chat(Some("42"), None),
    ]);
    let s = common::ServeProcess::start(
        &[
            "--pool",
            "python=0",
            "--agent-upstream",
            "openai",
            "--agent-base-url",
            &base,
            "--agent-model",
            "scripted",
        ],
        &[],
    );
    let text = reqwest::blocking::Client::new()
        .post(s.url("/v1/agents"))
        .json(
            &json!({"messages": [{"role": "user", "content": "6 times 7?"}], "stream": true,
            "tools": [{"type": "runcell_tool", "name": "code_exec_python"}]}),
        )
        .timeout(Duration::from_secs(60))
        .send()
        .unwrap()
        .text()
        .unwrap();
    let chunks: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(
        chunks
            .iter()
            .all(|c| c["object"] == "chat.completion.chunk"),
        "{text}"
    );
    let kinds: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["runcell"]["type"].as_str())
        .collect();
    assert!(
        kinds.contains(&"run_started") && kinds.contains(&"run_finished"),
        "{kinds:?}"
    );
    let answer: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(answer, "42");
    let last = chunks.last().unwrap();
    assert_eq!(last["choices"][0]["finish_reason"], "stop");
    assert_eq!(last["usage"]["total_tokens"], 26);
}

#[test]
fn the_cli_shows_each_step_then_the_answer() {
    let (base, _seen) = scripted_openai(vec![
        chat(None, Some("print(open('n.txt').read().strip())")),
        chat(Some("the file says 7"), None),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("n.txt");
    std::fs::write(&input, "7\n").unwrap();
    let out = std::process::Command::new(common::runcell_bin())
        .args([
            "agent",
            "What does n.txt say?",
            "--file",
            input.to_str().unwrap(),
            "--max-calls",
            "3",
        ])
        .env("RUNCELL_AGENT_UPSTREAM", "openai")
        .env("RUNCELL_AGENT_BASE_URL", &base)
        .env("RUNCELL_AGENT_MODEL", "scripted")
        .output()
        .unwrap();
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

    let out = std::process::Command::new(common::runcell_bin())
        .args(["agent", "q"])
        .env_remove("RUNCELL_AGENT_UPSTREAM")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RUNCELL_AGENT_UPSTREAM"));
}
