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
                    // The loop's runs share a session, and sessions run offline, with the
                    // pre-installed packages.
                    props.remove("network");
                    props.remove("packages");
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

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Language, String>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// End the request's sessions (blocking: their sandboxes are torn down).
    pub fn close(&self) {
        let ids: Vec<String> = std::mem::take(&mut *self.lock()).into_values().collect();
        for id in ids {
            let _ = self.sessions.delete(self.owner.as_deref(), &id);
        }
    }
}

/// A code tool's call as a request for a session: the language (from the tool's name), the
/// request (its arguments as the MCP tool's), and where it runs: the session `existing` names
/// for that language, or a new one, whose first run also gets `files` (the agent request's).
pub fn prepare_call(
    tool: &str,
    arguments: &Value,
    files: &[InputFile],
    existing: impl FnOnce(Language) -> Option<String>,
) -> Result<(Language, ExecRequest, SessionTarget), String> {
    let language = tool
        .strip_prefix("code_exec_")
        .and_then(Language::parse)
        .ok_or_else(|| format!("{tool} is not a code tool"))?;
    let mut args = arguments.clone();
    if let Some(o) = args.as_object_mut() {
        o.insert("language".into(), Value::String(language.name().into()));
    }
    let mut req: ExecRequest =
        serde_json::from_value(args).map_err(|e| format!("invalid arguments: {e}"))?;
    let target = match existing(language) {
        Some(id) => SessionTarget::Id(id),
        None => {
            let mut all = files.to_vec();
            all.append(&mut req.files);
            req.files = all;
            SessionTarget::New
        }
    };
    Ok((language, req, target))
}

impl Tools for SessionTools {
    fn run<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
    ) -> BoxFuture<'a, Result<Verdict, String>> {
        Box::pin(async move {
            let (language, req, target) = prepare_call(tool, arguments, &self.files, |l| {
                self.lock().get(&l).cloned()
            })?;
            let new = target == SessionTarget::New;
            let sessions = self.sessions.clone();
            let owner = self.owner.clone();
            let kill = self.kill.clone();
            let verdict = tokio::task::spawn_blocking(move || {
                sessions.run_request(owner.as_deref(), &target, &req, &mut NoSink, Some(&kill))
            })
            .await
            .map_err(|_| "the run failed unexpectedly".to_string())?
            .map_err(|e| e.to_string())?;
            if new {
                if let Some(id) = &verdict.session_id {
                    self.lock().insert(language, id.clone());
                }
            }
            Ok(verdict)
        })
    }
}
