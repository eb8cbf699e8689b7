//! The loop: ask the model, run the code it writes, hand it the verdict, until it answers or
//! a bound is reached.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use runcell_core::Verdict;
use serde::Serialize;
use serde_json::Value;

use crate::conversation::{Conversation, Item, StopReason, ToolCall, ToolSpec, Turn, Usage};

/// Why a model call failed (after the model's own retries).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModelError {
    /// The upstream could not be reached, or answered 5xx every time.
    #[error("the model's API is unavailable: {0}")]
    Unavailable(String),
    /// 429 every time.
    #[error("the model's API is rate-limiting: {0}")]
    RateLimited(String),
    /// It did not answer in time.
    #[error("the model's API did not answer in time: {0}")]
    Timeout(String),
    /// It answered something that is not a response of its format.
    #[error("the model's API answered garbage: {0}")]
    Malformed(String),
    /// It refused the request (4xx other than 429): a wrong model, key or request.
    #[error("the model's API refused the request: {0}")]
    Refused(String),
}

impl ModelError {
    /// The category an agent request that fails with this error has.
    pub fn category(&self) -> &'static str {
        match self {
            ModelError::Unavailable(_) => "upstream_unavailable",
            ModelError::RateLimited(_) => "upstream_rate_limited",
            ModelError::Timeout(_) => "upstream_timeout",
            ModelError::Malformed(_) => "upstream_malformed",
            ModelError::Refused(_) => "upstream_refused",
        }
    }
}

/// A model behind one upstream.
pub trait Model: Send + Sync {
    /// One call: the conversation so far and the tools offered; bounded by `within`.
    fn complete<'a>(
        &'a self,
        conv: &'a Conversation,
        tools: &'a [ToolSpec],
        within: Duration,
    ) -> BoxFuture<'a, Result<Turn, ModelError>>;
}

/// Where the code runs: one call of a `code_exec_*` tool (its language from the name) with its
/// arguments; the verdict, or why nothing ran (a refusal in words).
pub trait Tools: Send + Sync {
    /// Run one call within `within` (what is left of the request's budget): the run's own
    /// timeout is cut to it.
    fn run<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
        within: Duration,
    ) -> BoxFuture<'a, Result<Verdict, String>>;

    /// The text the model gets for a verdict (the MCP server's trimmed text).
    fn result_text(&self, verdict: &Verdict) -> String {
        runcell_mcp::result::summary(verdict)
    }
}

/// The loop's bounds.
#[derive(Debug, Clone, PartialEq)]
pub struct Bounds {
    /// Model calls at most.
    pub max_iterations: u32,
    /// Runs per tool at most (a tool not named here has `default_max_calls`).
    pub max_calls: BTreeMap<String, u32>,
    pub default_max_calls: u32,
    /// Consecutive failed runs after which the model is told to answer with what it has.
    pub max_code_retries: u32,
    /// The whole request's wall-clock budget: model calls and runs together.
    pub deadline: Duration,
    /// The most the conversation may hold (the model's texts and calls, the tool results):
    /// the loop's memory is bounded whatever the model answers.
    pub max_conversation_bytes: usize,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            max_iterations: 10,
            max_calls: BTreeMap::new(),
            default_max_calls: 10,
            max_code_retries: 3,
            deadline: Duration::from_secs(300),
            max_conversation_bytes: 8 << 20,
        }
    }
}

/// What the loop reports as it goes (for a live UI).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Event {
    /// The model is asked (call number, from 1).
    ModelCall { n: u32 },
    /// The model said something on its way (text beside tool calls).
    Text { text: String },
    /// A run starts.
    RunStarted { tool: String, code: String },
    /// A run ended (its verdict as a step records it: see [`Step`]).
    RunFinished {
        tool: String,
        code: String,
        verdict: Box<Verdict>,
    },
    /// A tool call that did not run, and what the model was told.
    Refused { tool: String, message: String },
}

/// One run of the loop. Its verdict is kept bounded: stdout and stderr cut to
/// [`STEP_OUTPUT_BYTES`] each, the files' contents left out (their names, sizes and digests
/// kept), so that an answer's steps never hold every run's whole output.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Step {
    pub tool: String,
    pub code: String,
    pub verdict: Verdict,
}

/// The most of each of stdout and stderr a step keeps (the model is given its own trimmed
/// text of the whole).
pub const STEP_OUTPUT_BYTES: usize = 16 * 1024;

/// A verdict as a step keeps it (see [`Step`]).
pub fn step_verdict(mut v: Verdict) -> Verdict {
    let mut cut = false;
    for (text, truncated) in [
        (&mut v.stdout, &mut v.stdout_truncated),
        (&mut v.stderr, &mut v.stderr_truncated),
    ] {
        if text.len() > STEP_OUTPUT_BYTES {
            let mut end = STEP_OUTPUT_BYTES;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            *truncated = true;
            cut = true;
        }
    }
    for f in &mut v.files {
        if f.content_base64.take().is_some() {
            f.truncated = true;
            cut = true;
        }
    }
    if cut {
        v.warnings.push(format!(
            "In the agent's steps, stdout and stderr are cut to {} KiB each and files are \
             listed without their content.",
            STEP_OUTPUT_BYTES / 1024
        ));
    }
    v
}

/// How the loop ended well: with an answer (or the last words it got when a bound stopped it).
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub answer: String,
    /// `stop`, `length` (the model ran out of tokens), `max_iterations`.
    pub finish_reason: &'static str,
    pub usage: Usage,
    pub steps: Vec<Step>,
    pub code_attempts: u32,
    pub model_calls: u32,
    pub model: Option<String>,
}

/// How the loop failed: a category and what happened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{category}: {message}")]
pub struct AgentError {
    /// `upstream_unavailable`, `upstream_rate_limited`, `upstream_timeout`,
    /// `upstream_malformed`, `upstream_refused`, `timeout` (the request's own budget).
    pub category: &'static str,
    pub message: String,
    /// The model calls made before it failed.
    pub model_calls: u32,
}

impl AgentError {
    /// Every category a failed loop has: the model errors' and the loop's own.
    pub const CATEGORIES: &'static [&'static str] = &[
        "upstream_unavailable",
        "upstream_rate_limited",
        "upstream_timeout",
        "upstream_malformed",
        "upstream_refused",
        "timeout",
        "conversation_too_large",
    ];
}

/// Run the loop over `conv` with `tools` offered, reporting to `events` as it goes.
pub async fn run_agent(
    model: &dyn Model,
    runner: &dyn Tools,
    offered: &[ToolSpec],
    mut conv: Conversation,
    bounds: &Bounds,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Result<Outcome, AgentError> {
    let started = Instant::now();
    let mut usage = Usage::default();
    let mut steps: Vec<Step> = Vec::new();
    let mut calls_by_tool: BTreeMap<String, u32> = BTreeMap::new();
    let mut failed_in_a_row = 0u32;
    let mut model_calls = 0u32;
    let mut last_text = String::new();
    let mut model_name = None;
    loop {
        if model_calls >= bounds.max_iterations {
            return Ok(Outcome {
                answer: last_text,
                finish_reason: "max_iterations",
                usage,
                code_attempts: steps.len() as u32,
                steps,
                model_calls,
                model: model_name,
            });
        }
        let left = bounds.deadline.saturating_sub(started.elapsed());
        if left.is_zero() {
            return Err(timeout(bounds, model_calls));
        }
        model_calls += 1;
        events(Event::ModelCall { n: model_calls });
        let turn = match tokio::time::timeout(left, model.complete(&conv, offered, left)).await {
            Ok(Ok(t)) => t,
            Ok(Err(e)) => {
                return Err(AgentError {
                    category: e.category(),
                    message: e.to_string(),
                    model_calls,
                });
            }
            Err(_) => return Err(timeout(bounds, model_calls)),
        };
        usage.add(turn.usage);
        model_name = turn.model.clone().or(model_name);
        if let Some(t) = turn.text.as_ref().filter(|t| !t.is_empty()) {
            last_text = t.clone();
        }
        if turn.calls.is_empty() {
            return Ok(Outcome {
                answer: turn.text.unwrap_or_default(),
                finish_reason: if turn.stop == StopReason::MaxTokens {
                    "length"
                } else {
                    "stop"
                },
                usage,
                code_attempts: steps.len() as u32,
                steps,
                model_calls,
                model: model_name,
            });
        }
        if let Some(t) = turn.text.clone().filter(|t| !t.is_empty()) {
            events(Event::Text { text: t });
        }
        conv.items.push(Item::Assistant {
            text: turn.text.clone(),
            calls: turn.calls.clone(),
        });
        for call in &turn.calls {
            let left = bounds.deadline.saturating_sub(started.elapsed());
            let (content, is_error) = one_call(
                call,
                runner,
                offered,
                bounds,
                left,
                &mut calls_by_tool,
                &mut failed_in_a_row,
                &mut steps,
                events,
            )
            .await
            .ok_or_else(|| timeout(bounds, model_calls))?;
            conv.items.push(Item::ToolResult {
                call_id: call.id.clone(),
                content,
                is_error,
            });
        }
        let held = conv.approx_bytes();
        if held > bounds.max_conversation_bytes {
            return Err(AgentError {
                category: "conversation_too_large",
                message: format!(
                    "The conversation grew to {held} bytes, more than the {} this request may \
                     hold: ask for less output, or a shorter task.",
                    bounds.max_conversation_bytes
                ),
                model_calls,
            });
        }
    }
}

fn timeout(bounds: &Bounds, model_calls: u32) -> AgentError {
    AgentError {
        category: "timeout",
        message: format!(
            "The agent request ran out of its {} s budget before the model answered.",
            bounds.deadline.as_secs()
        ),
        model_calls,
    }
}

/// Handle one tool call: refuse it with a message the model can act on, or run it within
/// `left` of the request's budget. The tool result's text and whether it is an error; `None`
/// when the budget ran out while it ran.
#[allow(clippy::too_many_arguments)] // (the loop's state, lent for one call)
async fn one_call(
    call: &ToolCall,
    runner: &dyn Tools,
    offered: &[ToolSpec],
    bounds: &Bounds,
    left: Duration,
    calls_by_tool: &mut BTreeMap<String, u32>,
    failed_in_a_row: &mut u32,
    steps: &mut Vec<Step>,
    events: &(dyn Fn(Event) + Send + Sync),
) -> Option<(String, bool)> {
    let refuse = |message: String| {
        events(Event::Refused {
            tool: call.name.clone(),
            message: message.clone(),
        });
        Some((message, true))
    };
    if !offered.iter().any(|t| t.name == call.name) {
        let names: Vec<&str> = offered.iter().map(|t| t.name.as_str()).collect();
        // The name is the model's: quoted, and only its start (it may be megabytes long).
        return refuse(format!(
            "There is no tool named {}. The tools are: {}.",
            short(&format!("{:?}", call.name)),
            names.join(", ")
        ));
    }
    let max = bounds
        .max_calls
        .get(&call.name)
        .copied()
        .unwrap_or(bounds.default_max_calls);
    let used = calls_by_tool.entry(call.name.clone()).or_default();
    if *used >= max {
        return refuse(format!(
            "{} may run at most {max} times in this request, and it has. Do not call it again: \
             give your best answer with what you have.",
            call.name
        ));
    }
    if *failed_in_a_row >= bounds.max_code_retries {
        return refuse(format!(
            "The code has failed {failed_in_a_row} times in a row. Do not run more code: give \
             your best answer with what you have, and say what did not work."
        ));
    }
    let Some(code) = call.arguments.get("code").and_then(Value::as_str) else {
        return refuse(format!(
            "The arguments of {} must be a JSON object with `code` (a string); got {}.",
            call.name,
            short(&call.arguments.to_string())
        ));
    };
    *used += 1;
    events(Event::RunStarted {
        tool: call.name.clone(),
        code: code.to_string(),
    });
    if left.is_zero() {
        return None;
    }
    // The run's timeout is cut to `left` by the run service; this bounds the rest (waiting
    // for a slot, building a session).
    let ran = tokio::time::timeout(left, runner.run(&call.name, &call.arguments, left)).await;
    let verdict = match ran {
        Err(_) => return None,
        Ok(Ok(v)) => v,
        Ok(Err(message)) => {
            *failed_in_a_row += 1;
            return refuse(format!("The code did not run: {message}"));
        }
    };
    let failed = verdict.error.is_some();
    *failed_in_a_row = if failed { *failed_in_a_row + 1 } else { 0 };
    let mut text = runner.result_text(&verdict);
    if failed && *failed_in_a_row >= bounds.max_code_retries {
        text.push_str(&format!(
            "\nThe code has now failed {failed_in_a_row} times in a row: do not run more code. \
             Give your best answer with what you have, and say what did not work."
        ));
    }
    let verdict = step_verdict(verdict);
    events(Event::RunFinished {
        tool: call.name.clone(),
        code: code.to_string(),
        verdict: Box::new(verdict.clone()),
    });
    steps.push(Step {
        tool: call.name.clone(),
        code: code.to_string(),
        verdict,
    });
    Some((text, failed))
}

fn short(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_string()
    } else {
        s.chars().take(200).collect::<String>() + "…"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::{ErrorCategory, VerdictError};
    use serde_json::json;

    #[test]
    fn every_model_error_category_is_listed() {
        let s = String::new;
        for e in [
            ModelError::Unavailable(s()),
            ModelError::RateLimited(s()),
            ModelError::Timeout(s()),
            ModelError::Malformed(s()),
            ModelError::Refused(s()),
        ] {
            assert!(AgentError::CATEGORIES.contains(&e.category()), "{e:?}");
        }
        let bounds = Bounds::default();
        assert!(AgentError::CATEGORIES.contains(&timeout(&bounds, 0).category));
    }
    use std::sync::Mutex;

    /// A model that replays turns and records what it was sent.
    struct Scripted {
        turns: Mutex<Vec<Result<Turn, ModelError>>>,
        seen: Mutex<Vec<Conversation>>,
    }

    impl Scripted {
        fn new(mut turns: Vec<Result<Turn, ModelError>>) -> Scripted {
            turns.reverse();
            Scripted {
                turns: Mutex::new(turns),
                seen: Mutex::new(Vec::new()),
            }
        }
    }

    impl Model for Scripted {
        fn complete<'a>(
            &'a self,
            conv: &'a Conversation,
            _tools: &'a [ToolSpec],
            _within: Duration,
        ) -> BoxFuture<'a, Result<Turn, ModelError>> {
            self.seen.lock().unwrap().push(conv.clone());
            let next = self.turns.lock().unwrap().pop();
            Box::pin(async move {
                next.unwrap_or_else(|| Err(ModelError::Malformed("script over".into())))
            })
        }
    }

    /// Runs "fail" as a ModuleNotFoundError and anything else as a success printing it.
    struct FakeRunner;

    impl Tools for FakeRunner {
        fn run<'a>(
            &'a self,
            _tool: &'a str,
            args: &'a Value,
            _within: Duration,
        ) -> BoxFuture<'a, Result<Verdict, String>> {
            let code = args["code"].as_str().unwrap_or_default().to_string();
            Box::pin(async move {
                let mut v = Verdict::failed(ErrorCategory::RuntimeError, "");
                v.exit_code = Some(if code == "fail" { 1 } else { 0 });
                if code == "fail" {
                    v.stderr = "ModuleNotFoundError: No module named 'scipy'\n".into();
                    v.error = Some(VerdictError::new(
                        ErrorCategory::RuntimeError,
                        "ModuleNotFoundError: No module named 'scipy'",
                    ));
                } else {
                    v.stdout = format!("{code}\n");
                    v.error = None;
                }
                Ok(v)
            })
        }

        fn result_text(&self, v: &Verdict) -> String {
            match &v.error {
                Some(e) => format!("error: {}: {}", e.category.as_str(), e.message),
                None => v.stdout.clone(),
            }
        }
    }

    fn call(id: &str, code: &str) -> Turn {
        Turn {
            text: None,
            calls: vec![ToolCall {
                id: id.into(),
                name: "code_exec_python".into(),
                arguments: json!({ "code": code }),
            }],
            stop: StopReason::ToolUse,
            usage: Usage {
                prompt_tokens: 10,
                completion_tokens: 1,
            },
            model: Some("m".into()),
        }
    }

    fn answer(text: &str) -> Turn {
        Turn {
            text: Some(text.into()),
            calls: Vec::new(),
            stop: StopReason::EndTurn,
            usage: Usage {
                prompt_tokens: 20,
                completion_tokens: 2,
            },
            model: Some("m".into()),
        }
    }

    fn tools() -> Vec<ToolSpec> {
        vec![ToolSpec {
            name: "code_exec_python".into(),
            description: "Run Python".into(),
            input_schema: json!({"type": "object"}),
        }]
    }

    fn conv() -> Conversation {
        Conversation {
            system: None,
            items: vec![Item::User("std?".into())],
        }
    }

    async fn go(model: &Scripted, bounds: &Bounds) -> (Result<Outcome, AgentError>, Vec<Event>) {
        let events = Mutex::new(Vec::new());
        let r = run_agent(model, &FakeRunner, &tools(), conv(), bounds, &|e| {
            events.lock().unwrap().push(e)
        })
        .await;
        (r, events.into_inner().unwrap())
    }

    fn last_result(model: &Scripted) -> (String, bool) {
        let seen = model.seen.lock().unwrap();
        match seen.last().unwrap().items.last().unwrap() {
            Item::ToolResult {
                content, is_error, ..
            } => (content.clone(), *is_error),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn a_failed_run_goes_back_as_an_error_and_the_fixed_one_answers() {
        let m = Scripted::new(vec![
            Ok(call("1", "fail")),
            Ok(call("2", "28.6")),
            Ok(answer("28.6")),
        ]);
        let (r, events) = go(&m, &Bounds::default()).await;
        let o = r.unwrap();
        assert_eq!(
            (
                o.answer.as_str(),
                o.finish_reason,
                o.code_attempts,
                o.model_calls
            ),
            ("28.6", "stop", 2, 3)
        );
        assert_eq!(
            o.usage,
            Usage {
                prompt_tokens: 40,
                completion_tokens: 4
            }
        );
        let seen = m.seen.lock().unwrap();
        match &seen[1].items[2] {
            Item::ToolResult {
                content, is_error, ..
            } => {
                assert!(*is_error);
                assert!(
                    content.contains("runtime_error") && content.contains("scipy"),
                    "{content}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(events
            .iter()
            .any(|e| matches!(e, Event::RunStarted { code, .. } if code == "fail")));
        assert_eq!(
            events
                .iter()
                .filter(|e| matches!(e, Event::RunFinished { .. }))
                .count(),
            2
        );
    }

    #[tokio::test]
    async fn max_calls_and_retries_are_told_to_the_model() {
        let mut b = Bounds::default();
        b.max_calls.insert("code_exec_python".into(), 1);
        let m = Scripted::new(vec![
            Ok(call("1", "ok")),
            Ok(call("2", "again")),
            Ok(answer("done")),
        ]);
        let (r, _) = go(&m, &b).await;
        assert_eq!(r.unwrap().code_attempts, 1);
        {
            let seen = m.seen.lock().unwrap();
            match seen[2].items.last().unwrap() {
                Item::ToolResult {
                    content, is_error, ..
                } => {
                    assert!(
                        *is_error && content.contains("at most 1 times"),
                        "{content}"
                    );
                }
                other => panic!("{other:?}"),
            }
        }

        let b = Bounds {
            max_code_retries: 2,
            ..Bounds::default()
        };
        let m = Scripted::new(vec![
            Ok(call("1", "fail")),
            Ok(call("2", "fail")),
            Ok(call("3", "fail")),
            Ok(answer("gave up")),
        ]);
        let (r, _) = go(&m, &b).await;
        let o = r.unwrap();
        assert_eq!((o.code_attempts, o.answer.as_str()), (2, "gave up"));
        let (content, is_error) = last_result(&m);
        assert!(
            is_error && content.contains("failed 2 times in a row"),
            "{content}"
        );
    }

    #[tokio::test]
    async fn unknown_tools_bad_arguments_and_upstream_failures() {
        let mut t = call("1", "x");
        t.calls[0].name = "rm_rf".into();
        let mut bad = call("2", "x");
        bad.calls[0].arguments = json!("{oops");
        let m = Scripted::new(vec![Ok(t), Ok(bad), Ok(answer("ok"))]);
        let (r, _) = go(&m, &Bounds::default()).await;
        assert_eq!(r.unwrap().code_attempts, 0);
        {
            let seen = m.seen.lock().unwrap();
            assert!(
                matches!(&seen[1].items[2], Item::ToolResult { content, is_error: true, .. } if content.contains("no tool named \"rm_rf\""))
            );
        }
        let (content, _) = last_result(&m);
        assert!(
            content.contains("must be a JSON object with `code`"),
            "{content}"
        );

        for (e, cat) in [
            (
                ModelError::Unavailable("500".into()),
                "upstream_unavailable",
            ),
            (ModelError::Malformed("x".into()), "upstream_malformed"),
            (
                ModelError::RateLimited("429".into()),
                "upstream_rate_limited",
            ),
        ] {
            let m = Scripted::new(vec![Err(e)]);
            let (r, _) = go(&m, &Bounds::default()).await;
            assert_eq!(r.unwrap_err().category, cat);
        }
    }

    #[tokio::test]
    async fn iterations_and_the_deadline_bound_the_loop() {
        let b = Bounds {
            max_iterations: 2,
            ..Bounds::default()
        };
        let m = Scripted::new(vec![
            Ok(call("1", "a")),
            Ok(call("2", "b")),
            Ok(call("3", "c")),
        ]);
        let (r, _) = go(&m, &b).await;
        let o = r.unwrap();
        assert_eq!((o.finish_reason, o.model_calls), ("max_iterations", 2));

        struct Hangs;
        impl Model for Hangs {
            fn complete<'a>(
                &'a self,
                _: &'a Conversation,
                _: &'a [ToolSpec],
                _: Duration,
            ) -> BoxFuture<'a, Result<Turn, ModelError>> {
                Box::pin(futures_util::future::pending())
            }
        }
        let b = Bounds {
            deadline: Duration::from_millis(50),
            ..Bounds::default()
        };
        let r = run_agent(&Hangs, &FakeRunner, &tools(), conv(), &b, &|_| {}).await;
        assert_eq!(r.unwrap_err().category, "timeout");
    }

    /// Regression: the refusal of an unknown tool quoted its whole name, so a model (or
    /// whoever answers in its place) could make the loop copy megabytes into the conversation
    /// and the events for each such call.
    #[tokio::test]
    async fn the_refusal_of_an_unknown_tool_quotes_a_bounded_name() {
        let mut t = call("1", "x");
        t.calls[0].name = "n".repeat(1 << 20);
        let m = Scripted::new(vec![Ok(t), Ok(answer("ok"))]);
        let (r, events) = go(&m, &Bounds::default()).await;
        r.unwrap();
        let (content, is_error) = last_result(&m);
        assert!(is_error && content.contains("no tool named"), "{content}");
        assert!(content.len() < 1000, "{} bytes", content.len());
        assert!(events
            .iter()
            .all(|e| !matches!(e, Event::Refused { message, .. } if message.len() >= 1000)));
    }
}
