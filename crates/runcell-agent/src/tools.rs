//! The code tools of one agent request: the MCP server's `code_exec_*` tools (same
//! descriptions, same input schemas, without `session_id`: the loop keeps the state itself),
//! run in one session per language, so that each step builds on the previous ones. The
//! sessions belong to the request's caller and end with the request.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use runcell_core::{
    ExecRequest, InputFile, KillSwitch, Language, NoSink, SessionTarget, Sessions, Verdict,
};
use runcell_mcp::Catalog;
use serde_json::Value;

use crate::conversation::ToolSpec;
use crate::run::Tools;

/// The tools offered to the model for these tool names (those this host has; others are
/// left out, and `unknown` says which).
pub fn offered(catalog: &Catalog, names: &[String]) -> (Vec<ToolSpec>, Vec<String>) {
    let mut specs = Vec::new();
    let mut unknown = Vec::new();
    for name in names {
        match catalog.tools().iter().find(|t| &t.name == name) {
            Some(def) => {
                let mut schema = Value::Object((*def.input_schema).clone());
                if let Some(props) = schema["properties"].as_object_mut() {
                    props.remove("session_id");
                }
                specs.push(ToolSpec {
                    name: def.name.clone(),
                    // The sentence about `session_id` does not apply: calls share their state.
                    description: def.description.clone(),
                    input_schema: schema,
                });
            }
            None => unknown.push(name.clone()),
        }
    }
    (specs, unknown)
}

/// Runs the calls of one agent request in sessions of `owner`.
pub struct SessionTools {
    sessions: Arc<Sessions>,
    owner: Option<String>,
    /// Files present in every run (written into each session when it starts).
    files: Vec<InputFile>,
    /// Language -> its session's id, once created.
    ids: Mutex<BTreeMap<Language, String>>,
    /// Stops the running call when the request is abandoned.
    kill: KillSwitch,
}

impl SessionTools {
    pub fn new(
        sessions: Arc<Sessions>,
        owner: Option<String>,
        files: Vec<InputFile>,
        kill: KillSwitch,
    ) -> SessionTools {
        SessionTools {
            sessions,
            owner,
            files,
            ids: Mutex::new(BTreeMap::new()),
            kill,
        }
    }

    /// End the request's sessions (blocking: their sandboxes are torn down).
    pub fn close(&self) {
        let ids: Vec<String> =
            std::mem::take(&mut *self.ids.lock().unwrap_or_else(|e| e.into_inner()))
                .into_values()
                .collect();
        for id in ids {
            let _ = self.sessions.delete(self.owner.as_deref(), &id);
        }
    }
}

impl Tools for SessionTools {
    fn run<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Verdict, String>> {
        Box::pin(async move {
            let language = tool
                .strip_prefix("code_exec_")
                .and_then(Language::parse)
                .ok_or_else(|| format!("{tool} is not a code tool"))?;
            let code = arguments["code"].as_str().unwrap_or_default().to_string();
            let existing = self
                .ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&language)
                .cloned();
            let mut req = ExecRequest::new(language.name(), code);
            if let Some(t) = arguments.get("timeout").filter(|t| !t.is_null()) {
                let probe = serde_json::json!({"language": "", "code": "", "timeout": t});
                let parsed: ExecRequest =
                    serde_json::from_value(probe).map_err(|e| format!("invalid timeout: {e}"))?;
                req.limits.timeout = parsed.limits.timeout;
            }
            if let Some(f) = arguments.get("files").filter(|f| !f.is_null()) {
                req.files =
                    serde_json::from_value(f.clone()).map_err(|e| format!("invalid files: {e}"))?;
            }
            let target = match &existing {
                Some(id) => SessionTarget::Id(id.clone()),
                None => {
                    // The request's own files come with the first run of each language.
                    let mut files = self.files.clone();
                    files.extend(std::mem::take(&mut req.files));
                    req.files = files;
                    SessionTarget::New
                }
            };
            let sessions = self.sessions.clone();
            let owner = self.owner.clone();
            let kill = self.kill.clone();
            let verdict = tokio::task::spawn_blocking(move || {
                sessions.run_request(owner.as_deref(), &target, &req, &mut NoSink, Some(&kill))
            })
            .await
            .map_err(|_| "the run failed unexpectedly".to_string())?
            .map_err(|e| e.to_string())?;
            if existing.is_none() {
                if let Some(id) = &verdict.session_id {
                    self.ids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(language, id.clone());
                }
            }
            Ok(verdict)
        })
    }
}
