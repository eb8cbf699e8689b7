//! The code interpreter's calls (E2B's Jupyter server, port 49999): `POST /execute` runs code
//! in the sandbox's Python session and answers one JSON object per line as it runs, and
//! `/contexts` describes the one context a sandbox has.
//!
//! `/execute` is a call in the session, through the one intake (`Source::Api`, the session
//! target) and the run service, streamed as the sessions route streams its events:
//!
//! ```text
//! {"type":"number_of_executions","execution_count":3}
//! {"type":"stdout","text":"hello\n","timestamp":"..."}        as the code writes
//! {"type":"result","text":"2","html":...,"is_main_result":true} the verdict's `results`
//! {"type":"error","name":"NameError","value":"...","traceback":"..."}  its `exception`
//! {"type":"end_of_execution"}
//! ```

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::header::CONTENT_TYPE;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use runcell_core::stream::TextSink;
use runcell_core::verdict::ErrorCategory;
use runcell_core::{intake, Call, Source, Stream, Target, TargetKind, Verdict};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;
use tracing::Instrument;

use super::access::SandboxRequest;
use super::{E2bError, HOME};
use crate::routes::execute::AbortOnDrop;
use crate::state::AppState;

/// A line is sent after this long without output, so that a client (and the server) notice
/// a connection that went away; the SDKs ignore it.
pub const KEEPALIVE: Duration = Duration::from_secs(5);

/// The one context of a sandbox: its Python session.
pub const DEFAULT_CONTEXT: &str = "default";

/// `POST /execute`'s body (Python sends nulls, JS leaves keys out).
#[derive(Debug, Deserialize)]
pub struct ExecuteBody {
    pub code: String,
    #[serde(default)]
    pub context_id: Option<String>,
    #[serde(default)]
    pub language: Option<String>,
    #[serde(default)]
    pub env_vars: Option<BTreeMap<String, String>>,
}

fn now() -> String {
    humantime::format_rfc3339_micros(std::time::SystemTime::now()).to_string()
}

/// Check what `/execute` asks of a sandbox that has one Python context.
pub fn check_body(b: &ExecuteBody) -> Result<(), E2bError> {
    if b.context_id.is_some() && b.language.is_some() {
        return Err(E2bError::invalid(
            "Send a context_id or a language, not both.",
        ));
    }
    if let Some(c) = b.context_id.as_deref().filter(|c| *c != DEFAULT_CONTEXT) {
        return Err(E2bError::new(
            StatusCode::NOT_FOUND,
            format!(
                "No context {:?}: a sandbox here has one Python context, \"{DEFAULT_CONTEXT}\".",
                c.chars().take(64).collect::<String>()
            ),
        ));
    }
    if let Some(l) = b
        .language
        .as_deref()
        .filter(|l| !l.eq_ignore_ascii_case("python"))
    {
        return Err(E2bError::invalid(format!(
            "Language {:?} is not available: a sandbox here runs Python (run other languages \
             with runcell's own API).",
            l.chars().take(64).collect::<String>()
        )));
    }
    Ok(())
}

/// The `result` line of a displayed result: its MIME bundle under E2B's names.
pub fn result_line(r: &runcell_core::verdict::DisplayResult) -> Value {
    let mut line = Map::new();
    line.insert("type".into(), json!("result"));
    let mut extra = Map::new();
    for (mime, v) in &r.data {
        let key = match mime.as_str() {
            "text/plain" => "text",
            "text/html" => "html",
            "text/markdown" => "markdown",
            "image/svg+xml" => "svg",
            "image/png" => "png",
            "image/jpeg" => "jpeg",
            "application/pdf" => "pdf",
            "text/latex" => "latex",
            "application/json" => "json",
            "application/javascript" => "javascript",
            _ => {
                extra.insert(mime.clone(), v.clone());
                continue;
            }
        };
        line.insert(key.into(), v.clone());
    }
    if !extra.is_empty() {
        line.insert("extra".into(), Value::Object(extra));
    }
    line.insert("is_main_result".into(), json!(r.is_main_result));
    Value::Object(line)
}

/// The `error` line of a call that failed: its exception, or (a call stopped by a limit,
/// where no exception was reported) the verdict's error.
pub fn error_line(v: &Verdict) -> Option<Value> {
    if let Some(e) = &v.exception {
        return Some(json!({"type": "error", "name": e.name, "value": e.value,
            "traceback": e.traceback}));
    }
    let e = v.error.as_ref()?;
    if e.category == ErrorCategory::RuntimeError {
        // Where the session reported no exception of its own, Python's last line of a
        // traceback still names it: `ValueError: bad value`.
        if let Some((name, value)) = last_exception_line(&v.stderr) {
            return Some(json!({"type": "error", "name": name, "value": value,
                "traceback": v.stderr}));
        }
    }
    let name = match e.category {
        ErrorCategory::Timeout => "TimeoutError",
        ErrorCategory::MemoryLimit => "MemoryError",
        _ => "RuncellError",
    };
    Some(json!({"type": "error", "name": name, "value": e.message, "traceback": ""}))
}

/// `Name: value` (or a bare `Name`) of a traceback's last line, if it has that shape.
pub fn last_exception_line(stderr: &str) -> Option<(String, String)> {
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty())?;
    let (name, value) = last.split_once(": ").unwrap_or((last, ""));
    let ok = !name.is_empty()
        && name.len() <= 200
        && name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.');
    ok.then(|| {
        let short = name.rsplit('.').next().unwrap_or(name);
        (short.to_string(), value.to_string())
    })
}

fn line(v: &Value) -> Bytes {
    let mut s = v.to_string();
    s.push('\n');
    Bytes::from(s)
}

enum Message {
    Output(Stream, String),
    Done(Box<Result<Verdict, E2bError>>),
}

/// `POST /execute`.
pub async fn execute(
    State(state): State<AppState>,
    mut req: SandboxRequest,
) -> Result<Response, E2bError> {
    let limit = state.inner.max_body_bytes;
    let (ticket, bytes) = req.reserve_and_read(&state, limit, true).await?;
    let body: ExecuteBody = serde_json::from_slice(&bytes)
        .map_err(|e| E2bError::invalid(format!("Invalid request body: {e}.")))?;
    drop(bytes);
    check_body(&body)?;
    // The call's own environment variables (over the sandbox's, for this call only) are
    // the request's `env`, checked by the intake as at creation.
    let request = intake::parse_value(
        json!({ "code": body.code, "env": body.env_vars.unwrap_or_default() }),
        Source::Api,
        TargetKind::Session,
        state.service().offers(),
    )
    .inspect_err(|e| state.inner.metrics.rejected(e.category()))?;
    let session = req.sandbox.session.clone();
    super::wait_until_free(&state, &req.caller, &session).await?;
    let count = state
        .service()
        .session(&req.caller, &session)?
        .execution_count
        + 1;
    let call = Call::new(
        req.caller.clone(),
        Source::Api,
        Target::Session(session),
        request,
    );
    // Checked (the session exists, is free, the call fits) before the 200 is sent.
    let admitted = state.service().admit(ticket, call).await?;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let done = tx.clone();
    let task = tokio::spawn(
        async move {
            let sink = TextSink::new(move |stream, text| {
                let _ = tx.send(Message::Output(stream, text));
            });
            let r = admitted.run(Box::new(sink)).await.map_err(E2bError::from);
            let _ = done.send(Message::Done(Box::new(r)));
        }
        .in_current_span(),
    );
    let abort = AbortOnDrop(task.abort_handle());
    let first = line(&json!({"type": "number_of_executions", "execution_count": count}));
    let lines = futures_util::stream::unfold(
        (rx_take(&mut rx), Some(abort), Some(first)),
        |(mut rx, abort, first)| async move {
            if let Some(f) = first {
                return Some((Ok::<_, Infallible>(f), (rx, abort, None)));
            }
            // Once the verdict's lines are out (the guard gone), the stream ends.
            abort.as_ref()?;
            let msg = match tokio::time::timeout(KEEPALIVE, rx.recv()).await {
                Err(_) => {
                    return Some((Ok(line(&json!({"type": "keepalive"}))), (rx, abort, None)))
                }
                Ok(m) => m,
            };
            let out = match msg {
                Some(Message::Output(stream, text)) => {
                    let kind = match stream {
                        Stream::Stdout => "stdout",
                        Stream::Stderr => "stderr",
                    };
                    return Some((
                        Ok(line(
                            &json!({"type": kind, "text": text, "timestamp": now()}),
                        )),
                        (rx, abort, None),
                    ));
                }
                Some(Message::Done(done)) => match *done {
                    Ok(v) => {
                        let mut out = Vec::new();
                        for r in v.results.iter().flatten() {
                            out.extend_from_slice(&line(&result_line(r)));
                        }
                        if let Some(e) = error_line(&v) {
                            out.extend_from_slice(&line(&e));
                        }
                        out.extend_from_slice(&line(&json!({"type": "end_of_execution"})));
                        out
                    }
                    Err(e) => {
                        let mut out = line(&json!({"type": "error", "name": "RuncellError",
                        "value": e.message, "traceback": ""}))
                        .to_vec();
                        out.extend_from_slice(&line(&json!({"type": "end_of_execution"})));
                        out
                    }
                },
                None => line(&json!({"type": "error", "name": "RuncellError",
                    "value": "The execution failed unexpectedly.", "traceback": ""}))
                .to_vec(),
            };
            Some((Ok(Bytes::from(out)), (rx, None, None)))
        },
    );
    let mut res = Body::from_stream(lines).into_response();
    res.headers_mut().insert(
        CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    res.headers_mut()
        .insert("x-accel-buffering", HeaderValue::from_static("no"));
    Ok(res)
}

fn rx_take<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> mpsc::UnboundedReceiver<T> {
    let (_, empty) = mpsc::unbounded_channel();
    std::mem::replace(rx, empty)
}

fn default_context() -> Value {
    json!({"id": DEFAULT_CONTEXT, "language": "python", "cwd": HOME})
}

/// `GET /contexts`: the sandbox's one context.
pub async fn list_contexts(_req: SandboxRequest) -> Json<Value> {
    Json(json!([default_context()]))
}

/// `POST /contexts`: a sandbox here has one Python context; asking for another is refused
/// (a new sandbox gives separate state).
pub async fn create_context(
    State(state): State<AppState>,
    mut req: SandboxRequest,
) -> Result<Json<Value>, E2bError> {
    let (_ticket, bytes) = req.reserve_and_read(&state, 4096, true).await?;
    let v: Value = if bytes.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(&bytes)
            .map_err(|e| E2bError::invalid(format!("Invalid request body: {e}.")))?
    };
    let _ = state;
    Err(E2bError::invalid(format!(
        "A sandbox here has one context (Python, {HOME}); more contexts ({}) are not \
         supported: create another sandbox for separate state.",
        v.get("language")
            .and_then(Value::as_str)
            .unwrap_or("python")
    )))
}

/// `DELETE /contexts/{id}`: the one context cannot be removed.
pub async fn delete_context(Path(_id): Path<String>, _req: SandboxRequest) -> E2bError {
    E2bError::invalid("A sandbox's one context cannot be deleted: kill the sandbox instead.")
}

/// `POST /contexts/{id}/restart`: not supported (kill the sandbox and create another).
pub async fn restart_context(Path(_id): Path<String>, _req: SandboxRequest) -> E2bError {
    E2bError::invalid("Restarting a context is not supported: kill the sandbox and create another.")
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::verdict::{DisplayResult, ExceptionReport};

    #[test]
    fn results_are_named_as_e2b_names_them() {
        let r = DisplayResult {
            is_main_result: true,
            data: [
                ("text/plain".to_string(), json!("2")),
                ("text/html".to_string(), json!("<b>2</b>")),
                ("image/png".to_string(), json!("iVBOR")),
                ("application/vnd.custom".to_string(), json!("x")),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(
            result_line(&r),
            json!({"type": "result", "text": "2", "html": "<b>2</b>", "png": "iVBOR",
                "extra": {"application/vnd.custom": "x"}, "is_main_result": true})
        );
    }

    #[test]
    fn an_exception_is_an_error_line() {
        let mut v = Verdict::failed(ErrorCategory::RuntimeError, "exit 1");
        v.exception = Some(ExceptionReport {
            name: "ZeroDivisionError".into(),
            value: "division by zero".into(),
            traceback: "Traceback...".into(),
        });
        assert_eq!(error_line(&v).unwrap()["name"], "ZeroDivisionError");
        v.exception = None;
        v.stderr = "Traceback (most recent call last):\n  File ...\nmod.KeyError: 'k'\n".into();
        let e = error_line(&v).unwrap();
        assert_eq!(
            (e["name"].as_str(), e["value"].as_str()),
            (Some("KeyError"), Some("'k'"))
        );
        v.stderr = "some words here\n".into();
        assert_eq!(error_line(&v).unwrap()["name"], "RuncellError");
        v.error = None;
        assert!(error_line(&v).is_none());
    }

    #[test]
    fn bodies_asking_for_what_is_not_here_are_refused() {
        let body = |c: Option<&str>, l: Option<&str>| ExecuteBody {
            code: "1".into(),
            context_id: c.map(str::to_string),
            language: l.map(str::to_string),
            env_vars: None,
        };
        assert!(check_body(&body(None, None)).is_ok());
        assert!(check_body(&body(Some("default"), None)).is_ok());
        assert!(check_body(&body(None, Some("Python"))).is_ok());
        assert_eq!(
            check_body(&body(Some("x"), None)).unwrap_err().status,
            StatusCode::NOT_FOUND
        );
        assert_eq!(
            check_body(&body(None, Some("r"))).unwrap_err().status,
            StatusCode::BAD_REQUEST
        );
        assert!(check_body(&body(Some("default"), Some("python"))).is_err());
    }
}
