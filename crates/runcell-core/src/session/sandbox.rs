//! A session's sandbox: built once with the session's limits (memory, processes and disk are
//! the whole session's), with the language's session interpreter started in it (Python,
//! Node, Ruby, bash keep their variables and definitions; see `runcell-runtimes/runners/`);
//! for Go, calls run as programs compiled in the same sandbox (the workspace's files
//! persist). Wall time is per call. A call that runs out of time (or output, or is cancelled)
//! is interrupted first (SIGINT: Python's KeyboardInterrupt), so that the interpreter keeps
//! its state where it survives; where it does not (a memory kill, a crash, an exit), the
//! interpreter is restarted and the verdict says that the state was lost (`state_lost`, and
//! a warning). A session never dies silently.
//!
//! A session created with `network` has its own egress proxy for its whole life (a new one
//! with each sandbox it is rebuilt into); each call's verdict reports the connections made
//! during that call, and the connections a call leaves open are cut when it ends (its
//! processes are stopped until the next call). A session created with `packages` installs
//! its layer when it is created, and holds it (the cache never evicts a layer in use) until
//! it ends.

use std::sync::Arc;
use std::time::{Duration, Instant};

use runcell_jail::{KillSwitch, OutputSink, Sandbox};
use runcell_runtimes::{Invocation, Language, Runtime};

use crate::engine::{
    sandbox_failure, sandbox_files, sandbox_spec, Engine, RunIn, ValidRequest,
    INTERPRETER_START_TIMEOUT, NO_INTERPRETER,
};
use crate::error::{ErrorKind, RunError};
use crate::limits::{Limit, LimitOverrides, Limits, Scope};
use crate::verdict::{ErrorCategory, NetworkConnection, NetworkReport, Verdict};

/// What a session lost in a call, for its verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Lost {
    /// The interpreter was restarted: variables, imports and definitions are gone.
    State,
    /// The sandbox was rebuilt: the files in /workspace are gone too.
    Everything,
}

/// A sandbox that keeps its interpreter (or, for Go, its files) between calls.
pub struct Session {
    language: Language,
    /// The runtime with the session's environment variables, and without them (a call's own
    /// are checked against, and added over, the session's).
    pub(super) runtime: Runtime,
    base_runtime: Runtime,
    /// The session's environment (its interpreter's, and the commands' run beside it).
    pub(super) env: Vec<(String, String)>,
    /// The session's limits as asked, and as resolved; and the policy's defaults (to tell a
    /// limit the request lowered from one it left alone).
    overrides: LimitOverrides,
    limits: Limits,
    defaults: Limits,
    /// The session's initial files.
    pub(super) files: Vec<runcell_jail::InputFile>,
    /// The destinations its proxy lets through (empty: no network, no proxy).
    network: Vec<runcell_proxy::NetRule>,
    /// The proxy serving its sandbox (with `network`).
    proxy: Option<runcell_proxy::ProxyHandle>,
    /// Connections recorded by the proxy of a sandbox that was rebuilt since the last call:
    /// the next call's report carries them.
    earlier: Vec<NetworkConnection>,
    /// Its package layer, held (never evicted) until the session ends.
    layer: Option<crate::packages::Layer>,
    pub(super) sandbox: Option<Sandbox>,
    /// The session interpreter's command; `None` for Go (calls run as programs).
    interpreter: Option<Invocation>,
    /// How long the interpreter may live: its CPU rlimit covers that much time.
    lifetime: Duration,
    pub(super) cells: u64,
    executions: u64,
    /// A loss that happened outside a call (a file operation had to rebuild the sandbox): the
    /// next call's verdict reports it.
    pub(super) pending: Option<Lost>,
    /// Where its interpreter is forked from, with the modules it imports first: `None` for a
    /// session with an environment, packages or network of its own (its interpreter starts
    /// the usual way).
    templates: Option<(Arc<crate::templates::Templates>, Vec<String>)>,
}

impl Engine {
    /// Build a session's sandbox and start its interpreter. `lifetime` bounds how long it
    /// may live.
    pub fn open_session(
        &self,
        v: &ValidRequest,
        overrides: LimitOverrides,
        lifetime: Duration,
        cancel: Option<&KillSwitch>,
    ) -> Result<Session, RunError> {
        let mut runtime = self
            .locate(v.language())
            .map_err(|e| RunError::new(ErrorKind::RuntimeUnavailable, e.to_string()))?;
        // Phase one of a package install, as for a one-shot run, within the creation's
        // timeout; the layer is the session's until it ends.
        let mut layer = None;
        if !v.packages().is_empty() {
            let deadline = Instant::now() + v.limits().timeout();
            let l = self
                .package_layers()
                .layer(self, v.packages(), &runtime, deadline, cancel)
                .map_err(|verdict| install_failure(*verdict))?;
            runtime = runtime.with_python_path(l.site());
            layer = Some(l);
        }
        if !v.network().is_empty() {
            runtime = runtime.with_proxy(runcell_proxy::SANDBOX_PROXY_PORT);
        }
        // The session's environment is its interpreter's, and every call's.
        let base_runtime = runtime;
        let runtime =
            crate::engine::with_request_env(&base_runtime, v.env()).map_err(RunError::invalid)?;
        // A plain session forks its interpreter from the pool's template, preloads imported.
        let plain = v.env().is_empty() && v.packages().is_empty() && v.network().is_empty();
        let preload = match plain {
            true => self.interpreter_preload(v.language()),
            false => Vec::new(),
        };
        let interpreter = runtime.interpreter(&preload, true);
        let templates =
            (plain && self.templates().enabled()).then(|| (self.templates().clone(), preload));
        let mut s = Session {
            language: v.language(),
            interpreter,
            runtime,
            base_runtime,
            env: v.env().to_vec(),
            overrides,
            limits: *v.limits(),
            defaults: self.policy().defaults,
            files: v.files().to_vec(),
            network: v.network().to_vec(),
            proxy: None,
            earlier: Vec::new(),
            layer,
            sandbox: None,
            lifetime,
            cells: 0,
            executions: 0,
            pending: None,
            templates,
        };
        s.start_sandbox(self)?;
        Ok(s)
    }
}

/// Whether a language's session interpreter reports a cell's results (see [`super::results`]):
/// Python (displays, figures, exceptions), Node and Ruby (the last value, the exception).
/// The fewest processes and threads a node session's interpreter starts with (seven threads,
/// and the sandbox's pid 1).
const NODE_SESSION_MIN_PIDS: u64 = 8;

fn reports_results(language: Language) -> bool {
    matches!(language, Language::Python | Language::Node | Language::Ruby)
}

/// Read the cell's results report from the sandbox's /tmp (through pid 1, never a link,
/// within the cap) into the verdict.
fn read_results(sandbox: &mut Sandbox, verdict: &mut Verdict) {
    // A fixed cap the interpreter knows too (it leaves results out past it, and says so), so
    // that a large display costs what is past the cap, not the whole report.
    let cap = super::results::MAX_RESULTS_BYTES;
    let read = sandbox.read_tmp_file(
        &runcell_jail::CollectLimits {
            max_files: 1,
            max_file_bytes: cap,
            max_total_bytes: cap,
            max_entries: 1,
            max_read_bytes: cap,
            deadline_ms: 10_000,
        },
        super::results::RESULTS_FILE,
    );
    let mut c = match read {
        Ok(c) => c,
        Err(e) => {
            verdict.warnings.push(format!(
                "The cell's displayed results could not be read: {}",
                crate::error::chain(&e)
            ));
            return;
        }
    };
    let Some(file) = c.files.first() else {
        // No report (a language's runner that had nothing to say).
        return;
    };
    let bytes = match file.blob {
        Some(i) if i < c.blobs.len() => c.blobs.swap_remove(i),
        _ => {
            verdict.warnings.push(format!(
                "The cell's displayed results were dropped: their report is {} bytes, more than \
                 the {cap} bytes a call's results may have. Save large outputs to files in \
                 /workspace instead.",
                file.size
            ));
            return;
        }
    };
    let parsed = super::results::parse(&bytes);
    verdict.warnings.extend(parsed.warnings);
    verdict.results = Some(parsed.results);
    verdict.exception = parsed.exception;
}

/// A verdict that ends a session operation (its sandbox could not be built or rebuilt) as the
/// refusal it is: the host's failure, or the request's.
pub(super) fn failure(v: Verdict) -> RunError {
    let kind = match v.category() {
        Some(ErrorCategory::InvalidRequest) => ErrorKind::InvalidRequest,
        Some(ErrorCategory::RuntimeUnavailable) => ErrorKind::RuntimeUnavailable,
        _ => ErrorKind::SandboxFailure,
    };
    RunError::new(kind, v.error.map(|e| e.message).unwrap_or_default())
}

/// A session's package install that failed, as the refusal of its creation: an install that
/// did not finish within the creation's timeout is the request's to fix (a longer timeout), a
/// cancelled one is the caller's going away; the rest as any sandbox's failure.
fn install_failure(v: Verdict) -> RunError {
    let kind = match v.category() {
        Some(ErrorCategory::Timeout) => ErrorKind::InvalidRequest,
        Some(ErrorCategory::Cancelled) => ErrorKind::Unavailable,
        _ => return failure(v),
    };
    let message = v.error.map(|e| e.message).unwrap_or_default();
    RunError::new(kind, format!("{message} The session was not created."))
}

impl Session {
    pub fn language(&self) -> Language {
        self.language
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    pub fn execution_count(&self) -> u64 {
        self.executions
    }

    /// A new sandbox with the session's files (and the runtime's), its interpreter started.
    pub(super) fn start_sandbox(&mut self, engine: &Engine) -> Result<(), RunError> {
        self.sandbox = None;
        // The proxy served the sandbox that is gone (its listener was in that sandbox's
        // network namespace): what it recorded goes to the next call's report.
        if let Some(p) = self.proxy.take() {
            self.earlier
                .extend(p.finish().into_iter().map(NetworkConnection::from));
        }
        let networked = !self.network.is_empty();
        let mut spec = sandbox_spec(engine.config(), &self.limits, &self.runtime);
        if networked {
            spec.proxy_port = Some(runcell_proxy::SANDBOX_PROXY_PORT);
        }
        let mut sandbox = Sandbox::create(&spec)
            .map_err(|e| failure(sandbox_failure("of the session could not be set up", &e)))?;
        if let Some(refused) = engine.strict_refusal(&sandbox) {
            return Err(failure(refused));
        }
        if networked {
            let permit = engine.config().network.permit(&self.network);
            let started = sandbox
                .take_proxy_listener()
                .map(|l| runcell_proxy::start(l, permit));
            let why = match started {
                Some(Ok(p)) => {
                    self.proxy = Some(p);
                    None
                }
                Some(Err(e)) => Some(format!("the egress proxy did not start: {e}")),
                None => Some("no listening socket for the egress proxy".to_string()),
            };
            if let Some(why) = why {
                let e = runcell_jail::SandboxError::Protocol(why);
                return Err(failure(sandbox_failure(
                    "of the session could not be set up",
                    &e,
                )));
            }
        }
        sandbox.set_persistent(true);
        let mut files = sandbox_files(&self.runtime);
        files.extend(self.files.iter().cloned());
        if self.interpreter.is_some() {
            self.sandbox = Some(sandbox);
            return self.start_interpreter(files);
        }
        sandbox
            .put_files(&files)
            .map_err(|e| failure(sandbox_failure("could not receive the session's files", &e)))?;
        self.sandbox = Some(sandbox);
        Ok(())
    }

    /// Start the session's interpreter in its sandbox (again, after it ended).
    fn start_interpreter(&mut self, files: Vec<runcell_jail::InputFile>) -> Result<(), RunError> {
        // Node.js starts seven threads (its main thread, V8's workers, libuv's) and hangs,
        // rather than failing, when it cannot create one: a session below that would wait out
        // the start timeout (found by schemathesis: `pids: 4` held its request two minutes).
        let pids = self.limits.get(Limit::Pids);
        if self.language == Language::Node && pids < NODE_SESSION_MIN_PIDS {
            self.sandbox = None;
            return Err(RunError::invalid(format!(
                "A node session needs `pids` of at least {NODE_SESSION_MIN_PIDS} (Node.js starts \
                 seven threads, and waits forever for one it cannot create); this one asked for \
                 {pids}. Create the session with a larger `pids`, or without it for the default."
            ))
            .with_limit(Limit::Pids));
        }
        let (Some(inv), Some(sandbox)) = (&self.interpreter, self.sandbox.as_mut()) else {
            return Ok(());
        };
        let enforcement = sandbox.enforcement().clone();
        let mut program = Engine::program(
            inv,
            &self.limits,
            self.lifetime,
            &self.runtime,
            &enforcement,
            files,
            None,
        );
        program.wall_timeout = INTERPRETER_START_TIMEOUT;
        let started = match &self.templates {
            Some((templates, preload)) => {
                templates.start_interpreter(sandbox, &program, self.language, preload)
            }
            None => sandbox.start_interpreter(&program, &mut runcell_jail::NoSink),
        };
        match started {
            Ok(None) => Ok(()),
            Ok(Some(outcome)) => {
                self.sandbox = None;
                let (_, error) =
                    crate::verdict::classify(&outcome, &self.limits, crate::verdict::Phase::Run);
                let stderr = String::from_utf8_lossy(&outcome.stderr);
                let said = crate::request::prefix(stderr.trim(), 200).to_string();
                let timed_out = outcome.end == runcell_jail::End::TimedOut;
                let blamed = error
                    .as_ref()
                    .filter(|_| !timed_out)
                    .and_then(|e| self.blame(e.category));
                Err(match blamed {
                    // The session's own limits can be too small for its interpreter (a node
                    // with one process, or with a handful of open files, a memory limit below
                    // Python's): that is the request's to fix.
                    Some(limit) => RunError::invalid(format!(
                        "The session's interpreter could not start within the session's \
                         limits: it ended ({}) with `{}` at {}, below the default of {}{}. \
                         Create the session with a larger `{}`, or without it for the default.",
                        error.as_ref().map_or("", |e| e.category.as_str()),
                        limit.name(),
                        limit.kind().describe(self.limits.get(limit)),
                        limit.kind().describe(self.defaults.get(limit)),
                        if said.is_empty() {
                            String::new()
                        } else {
                            format!("; it said: {said}")
                        },
                        limit.name(),
                    ))
                    .with_limit(limit),
                    // A start that takes too long, or a default too small, is the host's (the
                    // operator's) to fix.
                    None => RunError::new(
                        ErrorKind::SandboxFailure,
                        format!(
                            "The session's interpreter ended while starting ({:?}): {}",
                            outcome.end,
                            stderr.trim_end()
                        ),
                    ),
                })
            }
            Err(e) => {
                self.sandbox = None;
                Err(failure(sandbox_failure(
                    "could not start the session's interpreter",
                    &e,
                )))
            }
        }
    }

    /// Which limit the request set is to blame for an interpreter that could not start with
    /// `category`: the one the category names, if the request set it; otherwise a
    /// sandbox-level limit the request lowered below the default (a crash, such as Node's
    /// SIGSEGV with a few open files, names no limit of its own).
    fn blame(&self, category: ErrorCategory) -> Option<Limit> {
        let named = match category {
            ErrorCategory::MemoryLimit => Some(Limit::Memory),
            ErrorCategory::ProcessLimit => Some(Limit::Pids),
            ErrorCategory::OutputLimit => Some(Limit::Output),
            ErrorCategory::DiskLimit => Some(Limit::Disk),
            _ => None,
        };
        if let Some(l) = named {
            return self.overrides.get(l).is_some().then_some(l);
        }
        Limit::ALL.iter().copied().find(|&l| {
            l.scope() == Scope::Sandbox
                && self
                    .overrides
                    .get(l)
                    .is_some_and(|v| v < self.defaults.get(l))
        })
    }

    /// The sandbox, rebuilt if it ended (its files are lost then).
    pub(super) fn ensure_sandbox(&mut self, engine: &Engine) -> Result<&mut Sandbox, RunError> {
        let alive = self.sandbox.as_mut().is_some_and(|s| s.is_ready());
        if !alive {
            self.start_sandbox(engine)?;
            self.pending = Some(Lost::Everything);
        }
        self.sandbox
            .as_mut()
            .ok_or_else(|| RunError::new(ErrorKind::SandboxFailure, "no sandbox"))
    }

    /// Run one call. The verdict is a one-shot run's, plus `execution_count` and `state_lost`
    /// (the caller adds `session_id`).
    pub fn execute(
        &mut self,
        engine: &Engine,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        self.executions += 1;
        let mut lost = self.pending.take();
        if let Some(p) = &self.proxy {
            p.begin_call();
        }
        let mut verdict = self.run_once(engine, v, sink, cancel, &mut lost);
        if !self.network.is_empty() {
            // The call's connections (and those of a sandbox rebuilt since the last call);
            // what it left open is cut now (its processes are stopped until the next call).
            let mut connections = std::mem::take(&mut self.earlier);
            if let Some(p) = &self.proxy {
                connections.extend(p.end_call().into_iter().map(NetworkConnection::from));
            }
            verdict.network = Some(NetworkReport { connections });
        }
        verdict.packages = self.layer.as_ref().map(|l| l.report().clone());
        verdict.language = Some(self.language.name().into());
        verdict.limits = Some(*v.limits());
        verdict.execution_count = Some(self.executions);
        verdict.state_lost = Some(lost.is_some());
        match lost {
            Some(Lost::State) => verdict.warnings.push(
                "The session's state was lost: its interpreter ended (a memory kill, a crash, \
                 an exit, or an interruption it did not survive) and was restarted. Variables, \
                 imports and definitions from earlier calls are gone; the files in /workspace \
                 are kept. Run the setup code again."
                    .into(),
            ),
            Some(Lost::Everything) => verdict.warnings.push(
                "The session's state was lost: its sandbox ended and was rebuilt. Variables, \
                 imports, definitions and the files written to /workspace are gone (the \
                 session's initial files are back). Run the setup code again."
                    .into(),
            ),
            None => {}
        }
        verdict
    }

    fn run_once(
        &mut self,
        engine: &Engine,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        lost: &mut Option<Lost>,
    ) -> Verdict {
        if let Err(e) = self.ensure_sandbox(engine) {
            return Verdict::failed(ErrorCategory::SandboxFailure, e.message);
        }
        *lost = (*lost).max(self.pending.take());
        if v.language() != self.language {
            return self.run_command(engine, v, sink, cancel, lost);
        }
        // The call's own environment variables, checked as at creation (not a name runcell
        // sets for the runtime), over the session's: a Go program gets them as any program;
        // an interpreter gets them in a file with the cell (see `Engine::run_in`).
        let runtime = if v.env().is_empty() {
            self.runtime.clone()
        } else {
            let mut env = self.env.clone();
            env.retain(|(k, _)| !v.env().iter().any(|(c, _)| c == k));
            env.extend(v.env().iter().cloned());
            match crate::engine::with_request_env(&self.base_runtime, &env) {
                Ok(rt) => rt,
                Err(message) => return Verdict::failed(ErrorCategory::InvalidRequest, message),
            }
        };
        let has_interpreter = self.interpreter.is_some();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let how = if has_interpreter {
                self.cells += 1;
                RunIn::SessionCell(self.cells)
            } else {
                RunIn::SessionProgram
            };
            let Some(sandbox) = self.sandbox.as_mut() else {
                return Verdict::failed(ErrorCategory::SandboxFailure, "no sandbox");
            };
            let (mut verdict, outcome) = engine.run_in(sandbox, how, v, &runtime, sink, cancel);
            let no_interpreter = outcome.is_none()
                && verdict
                    .error
                    .as_ref()
                    .is_some_and(|e| e.message == NO_INTERPRETER);
            if no_interpreter && attempt == 1 {
                // It ended between calls: start it again, and run the call in the new one.
                *lost = (*lost).max(Some(Lost::State));
                if let Err(e) = self.start_interpreter(Vec::new()) {
                    return Verdict::failed(ErrorCategory::SandboxFailure, e.message);
                }
                continue;
            }
            let sandbox_alive = self.sandbox.as_mut().is_some_and(|s| s.is_ready());
            if !sandbox_alive {
                // pid 1 itself was killed (a memory kill that took it, a cancellation that
                // could not be done gently): the next call gets a new sandbox.
                *lost = (*lost).max(Some(Lost::Everything));
                if let Err(e) = self.start_sandbox(engine) {
                    verdict
                        .warnings
                        .push(format!("The session could not be rebuilt: {}", e.message));
                }
            } else if has_interpreter && outcome.as_ref().is_some_and(|o| !o.interpreter_alive) {
                *lost = (*lost).max(Some(Lost::State));
                // Restarted now, so that the next call finds it ready.
                if let Err(e) = self.start_interpreter(Vec::new()) {
                    verdict.warnings.push(format!(
                        "The session's interpreter could not be restarted: {}",
                        e.message
                    ));
                }
            } else if let (Some(o), Some(err)) = (&outcome, verdict.error.as_mut()) {
                if matches!(
                    o.end,
                    runcell_jail::End::TimedOut
                        | runcell_jail::End::OutputLimit(_)
                        | runcell_jail::End::Cancelled
                ) && has_interpreter
                {
                    if o.end == runcell_jail::End::Cancelled {
                        err.message = "The call was interrupted (Ctrl-C, a cancelled call, or \
                                       a client that went away)."
                            .into();
                    }
                    err.message.push_str(
                        " The call was interrupted (SIGINT); the session's interpreter survived \
                         and keeps its state.",
                    );
                }
            }
            // What the cell displayed, and its exception: reported by an interpreter that
            // ended the cell itself (a dead or restarted one reports nothing, so nothing stale
            // is read).
            if has_interpreter
                && reports_results(self.language)
                && outcome.as_ref().is_some_and(|o| o.interpreter_alive)
            {
                if let Some(sandbox) = self.sandbox.as_mut() {
                    if sandbox.is_ready() {
                        read_results(sandbox, &mut verdict);
                    }
                }
            }
            return verdict;
        }
    }

    /// Run a call in another language (a shell command, see [`crate::intake::merge_call`])
    /// as its own program in the session's sandbox, beside the interpreter, which keeps its
    /// state. It gets the session's environment and its /workspace.
    fn run_command(
        &mut self,
        engine: &Engine,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        lost: &mut Option<Lost>,
    ) -> Verdict {
        let mut runtime = match engine.locate(v.language()) {
            Ok(r) => r,
            Err(e) => return Verdict::failed(ErrorCategory::RuntimeUnavailable, e.to_string()),
        };
        // What the session's interpreter has of its network and packages, a command has too:
        // its proxy (`curl`, `pip install` go through it) and its package layer's path.
        if let Some(l) = &self.layer {
            runtime = runtime.with_python_path(l.site());
        }
        if !self.network.is_empty() {
            runtime = runtime.with_proxy(runcell_proxy::SANDBOX_PROXY_PORT);
        }
        // The session's environment, with the call's own over it.
        let mut env = self.env.clone();
        env.retain(|(k, _)| !v.env().iter().any(|(c, _)| c == k));
        env.extend(v.env().iter().cloned());
        let runtime = match crate::engine::with_request_env(&runtime, &env) {
            Ok(r) => r,
            Err(e) => return Verdict::failed(ErrorCategory::InvalidRequest, e),
        };
        self.cells += 1;
        let Some(sandbox) = self.sandbox.as_mut() else {
            return Verdict::failed(ErrorCategory::SandboxFailure, "no sandbox");
        };
        let (mut verdict, _) = engine.run_in(
            sandbox,
            RunIn::SessionCommand(self.cells),
            v,
            &runtime,
            sink,
            cancel,
        );
        if !self.sandbox.as_mut().is_some_and(|s| s.is_ready()) {
            *lost = (*lost).max(Some(Lost::Everything));
            if let Err(e) = self.start_sandbox(engine) {
                verdict
                    .warnings
                    .push(format!("The session could not be rebuilt: {}", e.message));
            }
        }
        verdict
    }

    /// End the session: every process and the sandbox are gone when this returns.
    pub fn close(mut self) {
        if let Some(s) = self.sandbox.take() {
            if let Err(e) = s.destroy() {
                tracing::warn!(error = %crate::error::chain(&e), "session teardown failed");
            }
        }
        // Its proxy ends with it (every connection cut, its threads joined), and its package
        // layer is released (the cache may evict it from now on).
        if let Some(p) = self.proxy.take() {
            p.finish();
        }
        self.layer = None;
    }
}
