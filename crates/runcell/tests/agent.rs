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
