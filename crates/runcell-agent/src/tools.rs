//! The code tools of one agent request: the MCP server's `code_exec_*` tools (same
//! descriptions), with the input schema the intake gives a model (the code, its files, a
//! timeout: a model never sizes its own sandbox), run through runcell's one run service in one
//! session per language, so that each step builds on the previous ones. The sessions belong
//! to the request's caller and end with the request; every run holds the request's place in
//! line and is cut to what is left of the request's time budget.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use runcell_core::intake::{self, SchemaContext, Source, TargetKind};
use runcell_core::{
    Call, Caller, EngineConfig, InputFile, Language, NoSink, RunService, Target, Ticket, Verdict,
};
use runcell_mcp::Catalog;
use serde_json::Value;

use crate::conversation::ToolSpec;
use crate::run::Tools;

/// The tools offered to the model for these tool names (those this host has; others are
/// left out, and `unknown` says which).
pub fn offered(
    catalog: &Catalog,
    config: &EngineConfig,
    names: &[String],
) -> (Vec<ToolSpec>, Vec<String>) {
    let mut specs = Vec::new();
    let mut unknown = Vec::new();
    for name in names {
        match catalog.tools().iter().find(|t| &t.name == name) {
            Some(def) => {
                // The loop keeps the state itself (a session per language): its schema is a
                // call's, for a model.
                let ctx = SchemaContext::new(Source::Model, TargetKind::NewSession)
                    .with_policy(config, Duration::ZERO)
                    .for_language(def.language);
                specs.push(ToolSpec {
                    name: def.name.clone(),
                    // The sentence about `session_id` does not apply: calls share their state.
                    description: def.description.clone(),
                    input_schema: intake::request_schema(&ctx),
                });
            }
            None => unknown.push(name.clone()),
        }
    }
    (specs, unknown)
}

/// Runs the calls of one agent request through the run service, in sessions of its caller.
pub struct ServiceTools {
    service: RunService,
    caller: Caller,
    /// The request's place in line: every run of the request holds it.
    ticket: Ticket,
    /// Files present in every run (written into each session when it starts).
    files: Vec<InputFile>,
    /// Language -> its session's id, once created.
    ids: Arc<Mutex<BTreeMap<Language, String>>>,
    /// The request's time budget ends here.
    deadline: Instant,
    /// Runs asked for (admitted or not), for the runs-per-request histogram.
    runs: AtomicU32,
}

impl ServiceTools {
    pub fn new(
        service: RunService,
        caller: Caller,
        ticket: Ticket,
        files: Vec<InputFile>,
        deadline: Instant,
    ) -> ServiceTools {
        ServiceTools {
            service,
            caller,
            ticket,
            files,
            ids: Arc::default(),
            deadline,
            runs: AtomicU32::new(0),
        }
    }

    /// The runs asked for so far.
    pub fn runs(&self) -> u32 {
        self.runs.load(Ordering::Relaxed)
    }

    fn take_ids(&self) -> Vec<String> {
        std::mem::take(&mut *self.ids.lock().unwrap_or_else(|e| e.into_inner()))
            .into_values()
            .collect()
    }

    /// End the request's sessions now (blocking: their sandboxes are torn down).
    pub fn close(&self) {
        let sessions = self.service.sessions().clone();
        for id in self.take_ids() {
            let _ = sessions.delete(self.caller.key_id.as_deref(), &id);
        }
    }
}

/// The request's sessions end with it, also when it is abandoned (a client that went away
/// drops the loop mid-run): their sandboxes are torn down off the async threads.
impl Drop for ServiceTools {
    fn drop(&mut self) {
        let ids = self.take_ids();
        if ids.is_empty() {
            return;
        }
        let sessions = self.service.sessions().clone();
        let owner = self.caller.key_id.clone();
        let close = move || {
            for id in ids {
                let _ = sessions.delete(owner.as_deref(), &id);
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(close);
            }
            Err(_) => close(),
        }
    }
}

impl Tools for ServiceTools {
    fn run<'a>(
        &'a self,
        tool: &'a str,
        arguments: &'a Value,
        within: Duration,
    ) -> BoxFuture<'a, Result<Verdict, String>> {
        Box::pin(async move {
            self.runs.fetch_add(1, Ordering::Relaxed);
            let language = tool
                .strip_prefix("code_exec_")
                .and_then(Language::parse)
                .ok_or_else(|| format!("{tool} is not a code tool"))?;
            let existing = self
                .ids
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(&language)
                .cloned();
            let target = match existing {
                Some(id) => Target::Session(id),
                None => Target::NewSession,
            };
            // The model's arguments, as the intake lets a model send them: nothing that sizes
            // the sandbox.
            let mut req = intake::parse_value(
                arguments.clone(),
                Source::Model,
                target.kind(),
                self.service.offers(),
            )
            .map_err(|e| {
                // Counted and audited like any refusal (the model asked for it).
                self.service.refused(
                    &self.caller,
                    &runcell_core::RunSummary::of_language(language.name()),
                    &e,
                );
                format!("{}: {}", e.category(), e.message)
            })?;
            req.language = Some(language.name().to_string());
            if target == Target::NewSession {
                // The request's files are in every run: written when its session starts.
                let mut all = self.files.clone();
                all.append(&mut req.files);
                req.files = all;
            }
            let new = target == Target::NewSession;
            let mut call = Call::new(self.caller.clone(), Source::Model, target, req);
            call.deadline = Some(self.deadline.min(Instant::now() + within));
            let admitted = self
                .service
                .admit(self.ticket.clone(), call)
                .await
                .map_err(|e| format!("{}: {}", e.category(), e.message))?;
            let verdict = admitted
                .run(Box::new(NoSink))
                .await
                .map_err(|e| format!("{}: {}", e.category(), e.message))?;
            if new {
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

    /// The MCP server's trimmed text (with the text of displayed results), without the
    /// session's id: the loop keeps the session
    /// itself, and a model that passed the id back would be refused (it is not an argument
    /// of these tools).
    fn result_text(&self, verdict: &Verdict) -> String {
        let shown = Verdict {
            session_id: None,
            execution_count: None,
            ..verdict.clone()
        };
        runcell_mcp::result::summary_with_results(&shown)
    }
}
