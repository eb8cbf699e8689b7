//! `POST /v1/agents`: the agent loop in front of the operator's model. The request is Chat
//! Completions shaped (messages, the code tools with their `max_calls`, files); the model
//! writes code, it runs in a session of the caller's (one per language, ended with the
//! request), the verdict goes back to the model, and the answer is a `chat.completion` with
//! the `runcell` extension (the steps, the counts). Each run is admitted, counted and audited
//! like any execution.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures_util::future::BoxFuture;
use runcell_agent::api::AgentRequest;
use runcell_agent::{Conversation, Model, ModelError, ServiceTools, ToolSpec, Turn};
use runcell_core::Caller;
use serde_json::Value;

use super::execute::parse_body;
use crate::audit::ModelCall;
use crate::error::{ApiError, ErrorBody};
use crate::extract::Reserved;
use crate::state::AppState;

/// The upstream, each of whose calls is counted and audited (also a call the loop abandons
/// when the request's budget runs out).
struct AuditedModel {
    upstream: runcell_agent::Upstream,
    state: AppState,
    caller: Caller,
}

/// How a model call ended: its outcome, tokens (prompt, completion), tool calls, and the
/// model that answered.
type CallEnd = (&'static str, (u64, u64), usize, Option<String>);

/// Records one model call when it ends, or when its future is dropped unfinished.
struct CallRecord<'a> {
    model: &'a AuditedModel,
    started: Instant,
    done: Option<CallEnd>,
}

impl Drop for CallRecord<'_> {
    fn drop(&mut self) {
        let (outcome, tokens, tool_calls, answered_by) =
            self.done
                .take()
                .unwrap_or(("upstream_timeout", (0, 0), 0, None));
        let seconds = self.started.elapsed().as_secs_f64();
        let m = self.model;
        m.state
            .inner
            .metrics
            .agent_model_call(outcome, seconds, tokens);
        m.state.inner.audit.model_call(
            &m.caller,
            &ModelCall {
                upstream: m.upstream.wire.name(),
                model: answered_by.as_deref().unwrap_or(&m.upstream.model),
                outcome,
                prompt_tokens: tokens.0,
                completion_tokens: tokens.1,
                tool_calls,
                duration_seconds: (seconds * 1000.0).round() / 1000.0,
            },
        );
    }
}

impl Model for AuditedModel {
    fn complete<'a>(
        &'a self,
        conv: &'a Conversation,
        tools: &'a [ToolSpec],
        within: Duration,
    ) -> BoxFuture<'a, Result<Turn, ModelError>> {
        Box::pin(async move {
            let mut record = CallRecord {
                model: self,
                started: Instant::now(),
                done: None,
            };
            let r = self.upstream.complete(conv, tools, within).await;
            record.done = Some(match &r {
                Ok(t) => (
                    "ok",
                    (t.usage.prompt_tokens, t.usage.completion_tokens),
                    t.calls.len(),
                    t.model.clone(),
                ),
                Err(e) => (e.category(), (0, 0), 0, None),
            });
            r
        })
    }
}

/// Run the agent loop: the model answers, using the code tools, within the bounds.
#[utoipa::path(post, path = "/v1/agents", tag = "agents", operation_id = "run_agent",
    request_body(content = Object, description = "Chat Completions shaped: `messages`, \
        `tools` ([{\"type\": \"runcell_tool\", \"name\": \"code_exec_python\", \
        \"runtime_params\": {\"max_calls\": 5}}]), optional `model`, `files`, \
        `max_iterations`, `max_code_retries`."),
    responses(
        (status = 200, description = "A chat.completion with the `runcell` extension", body = Object),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 502, description = "The model's API failed (down, refusing, answering garbage)", body = ErrorBody),
        (status = 503, description = "No model is configured", body = ErrorBody),
        (status = 504, description = "The model's API or the request's budget ran out of time", body = ErrorBody),
    ))]
pub(crate) async fn run(
    State(state): State<AppState>,
    mut req: Reserved,
) -> Result<Response, ApiError> {
    let Some(settings) = state.inner.agent.clone() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "agent_unconfigured",
            "No model is configured for /v1/agents. Start the server with --agent-upstream \
             anthropic|openai (RUNCELL_AGENT_UPSTREAM), --agent-model and the key in \
             RUNCELL_AGENT_API_KEY (or [agent] in the TOML file); for a local \
             OpenAI-compatible server, --agent-base-url http://host:port/v1.",
        ));
    };
    // The request holds its place in line from here to its answer (its runs take their slots
    // through it), and its body's bytes of the budget.
    let caller = req.caller.clone();
    let bytes = req.read_json(None).await?;
    // A request refused here is counted like any other door's refusal.
    let refused = |e: ApiError| {
        state.metrics().rejected(e.category);
        e
    };
    let request: AgentRequest = parse_body(&bytes).map_err(refused)?;
    drop(bytes);
    let valid = request
        .validate(&settings.policy)
        .map_err(|e| refused(ApiError::invalid(e)))?;
    // The conversation grows to at most this while the loop runs: held of the body budget.
    req.ticket
        .take_bytes(valid.bounds.max_conversation_bytes as u64)
        .inspect_err(|e| state.metrics().rejected(e.category()))?;
    // The host's runtimes as the server last found them (finding them runs host programs).
    let runtimes = state.runtime_statuses().await?;
    let catalog = runcell_mcp::Catalog::new(state.engine().config(), &runtimes);
    let (offered, unknown) =
        runcell_agent::tools::offered(&catalog, state.engine().config(), &valid.tools);
    if !unknown.is_empty() {
        return Err(refused(ApiError::invalid(format!(
            "tools: this server has no {}.",
            unknown.join(", ")
        ))));
    }
    // The files go into every run: checked now rather than in front of the model, once (off
    // the async threads: it decodes them), and then against each other offered tool's
    // language, whose source file they must not replace.
    let languages: Vec<runcell_core::Language> = valid
        .tools
        .iter()
        .filter_map(|t| runcell_core::Language::parse(t.strip_prefix("code_exec_")?))
        .collect();
    if let (Some(&first), false) = (languages.first(), valid.files.is_empty()) {
        let engine = state.engine().clone();
        let files = valid.files.clone();
        let checked = tokio::task::spawn_blocking(move || {
            let mut probe = runcell_core::ExecRequest::new(first.name(), "");
            probe.files = files;
            engine
                .validate(&probe)
                .map(|v| v.files().iter().map(|f| f.path.clone()).collect::<Vec<_>>())
        })
        .await
        .map_err(|_| ApiError::internal("The files could not be checked."))?;
        let paths = checked.map_err(|e| refused(ApiError::invalid(format!("files: {e}"))))?;
        for language in &languages[1..] {
            let source = std::path::Path::new(runcell_core::WORKSPACE).join(language.source_file());
            if paths.contains(&source) {
                return Err(refused(ApiError::invalid(format!(
                    "files: {} is where the {} tool writes its code; give the file another name.",
                    language.source_file(),
                    language.name()
                ))));
            }
        }
    }
    let upstream = AuditedModel {
        upstream: settings.upstream.for_request(&valid.model, &valid.sampling),
        state: state.clone(),
        caller: caller.clone(),
    };
    let tools = ServiceTools::new(
        state.service().clone(),
        caller,
        req.ticket.clone(),
        valid.files.clone(),
        Instant::now() + valid.bounds.deadline,
    );
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let id = format!("agent-{created}-{n}");
    let model = valid.model.clone();
    if valid.stream {
        return Ok(stream(state, upstream, tools, offered, valid, id, created));
    }
    let outcome = runcell_agent::run_agent(
        &upstream,
        &tools,
        &offered,
        valid.conversation.clone(),
        &valid.bounds,
        &|_| {},
    )
    .await;
    let runs = tools.runs();
    drop(tools);
    record(&state, &outcome, runs);
    let o = outcome.map_err(agent_error)?;
    Ok(Json(runcell_agent::api::completion(&id, created, &model, &o)).into_response())
}

/// `POST /v1/agents/chat/completions`: the same, where the official OpenAI SDKs send a chat
/// completion when their base URL is `http://runcell/v1/agents`, so that existing client code
/// runs the loop unchanged.
#[utoipa::path(post, path = "/v1/agents/chat/completions", tag = "agents",
    operation_id = "run_agent_chat_completions",
    request_body(content = Object, description = "As POST /v1/agents."),
    responses(
        (status = 200, description = "As POST /v1/agents", body = Object),
        (status = 400, description = "Invalid request", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 502, description = "The model's API failed", body = ErrorBody),
        (status = 503, description = "No model is configured", body = ErrorBody),
        (status = 504, description = "The model's API or the request's budget ran out of time", body = ErrorBody),
    ))]
pub(crate) async fn run_chat_completions(
    state: State<AppState>,
    req: Reserved,
) -> Result<Response, ApiError> {
    run(state, req).await
}

/// Count and log one finished agent request (the runs are counted and audited as
/// executions already).
fn record(
    state: &AppState,
    r: &Result<runcell_agent::Outcome, runcell_agent::AgentError>,
    runs: u32,
) {
    match r {
        Ok(o) => {
            state.inner.metrics.agent("ok", runs);
            tracing::info!(
                model_calls = o.model_calls,
                runs = o.code_attempts,
                tokens = o.usage.total(),
                finish_reason = o.finish_reason,
                "agent request answered"
            );
        }
        Err(e) => {
            state.inner.metrics.agent(e.category, runs);
            tracing::warn!(category = e.category, model_calls = e.model_calls, runs,
                error = %e.message, "agent request failed");
        }
    }
}

fn agent_error(e: runcell_agent::AgentError) -> ApiError {
    let status = match e.category {
        "timeout" | "upstream_timeout" => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::BAD_GATEWAY,
    };
    ApiError::new(status, e.category, e.message)
}

/// The loop as server-sent `chat.completion.chunk`s: the steps as they happen (in the
/// `runcell` field of chunks with an empty delta), then the answer, the finish reason with
/// the usage, and `data: [DONE]`. An error ends the stream with `{"error": ...}` and
/// `[DONE]`. A client that goes away ends the loop (its runs are interrupted and its sessions
/// ended).
fn stream(
    state: AppState,
    upstream: AuditedModel,
    tools: ServiceTools,
    offered: Vec<runcell_agent::ToolSpec>,
    valid: runcell_agent::api::ValidAgentRequest,
    id: String,
    created: u64,
) -> Response {
    use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Value>();
    let model = valid.model.clone();
    let chunk = {
        let (id, model) = (id.clone(), model.clone());
        move |delta: Value, finish: Option<&str>, extra: Option<(&str, Value)>| {
            let mut c = serde_json::json!({
                "id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
            });
            if let Some((k, v)) = extra {
                c[k] = v;
            }
            c
        }
    };
    let events_tx = tx.clone();
    let state2 = state.clone();
    let chunk2 = chunk.clone();
    let task = tokio::spawn(async move {
        let _ = tx.send(chunk(
            serde_json::json!({"role": "assistant", "content": ""}),
            None,
            None,
        ));
        let on_event = move |e: runcell_agent::Event| {
            let _ = events_tx.send(chunk2(
                serde_json::json!({}),
                None,
                Some(("runcell", serde_json::to_value(&e).unwrap_or_default())),
            ));
        };
        let r = runcell_agent::run_agent(
            &upstream,
            &tools,
            &offered,
            valid.conversation.clone(),
            &valid.bounds,
            &on_event,
        )
        .await;
        let runs = tools.runs();
        drop(tools);
        record(&state2, &r, runs);
        match r {
            Ok(o) => {
                let _ = tx.send(chunk(serde_json::json!({"content": o.answer}), None, None));
                let usage = serde_json::json!({"prompt_tokens": o.usage.prompt_tokens,
                    "completion_tokens": o.usage.completion_tokens, "total_tokens": o.usage.total()});
                let summary = serde_json::json!({"code_attempts": o.code_attempts, "model_calls": o.model_calls});
                let mut last = chunk(
                    serde_json::json!({}),
                    Some(o.finish_reason),
                    Some(("usage", usage)),
                );
                last["runcell"] = summary;
                let _ = tx.send(last);
            }
            Err(e) => {
                let e = agent_error(e);
                let _ = tx.send(e.body());
            }
        }
    });
    let abort = super::execute::AbortOnDrop(task.abort_handle());
    let events = futures_util::stream::unfold((rx, Some(abort)), |(mut rx, abort)| async move {
        let abort = abort?;
        match rx.recv().await {
            Some(v) => Some((
                Ok::<_, std::convert::Infallible>(SseEvent::default().data(v.to_string())),
                (rx, Some(abort)),
            )),
            None => Some((Ok(SseEvent::default().data("[DONE]")), (rx, None))),
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::new().interval(state.inner.keep_alive))
        .into_response()
}
