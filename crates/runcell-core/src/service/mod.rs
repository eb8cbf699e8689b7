//! The one run service: every door (the HTTP API, MCP over stdio and HTTP, the agent loop in
//! the server and on the command line, `runcell run` and `runcell repl`) runs code through
//! it, and it does for each the same steps, in this order:
//!
//! 1. **Admission** ([`RunService::reserve`]): a place in line before anything of the
//!    request is read, within the key's share ([`admission`]).
//! 2. **Intake** ([`RunService::admit`]): the request checked against its target, merged with
//!    its session's settings, within the per-key network narrowing, and validated against the
//!    operator's policy (the engine's validation, done once).
//! 3. **Approval**: a run that asks for network waits for a person where the operator
//!    requires it, out of line but with its bytes held ([`approvals`]).
//! 4. **A slot** ([`Admitted::run`]): a sandbox slot, granted fairly between keys.
//! 5. **The engine or the session**, on a blocking thread, with a kill switch that fires when
//!    the caller goes away, at shutdown, or when the caller's deadline passes.
//! 6. **Audit and metrics**: every refusal and every verdict is reported to the
//!    [`Observer`], also for a run nobody waits for any more.
//!
//! A door only translates its wire format into an [`ExecRequest`] (parsed with
//! [`crate::intake::parse`] for its [`Source`] and [`Target`]) and renders the verdict or the
//! [`RunError`].

pub mod admission;
pub mod approvals;
pub mod observe;
pub mod remote;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use runcell_jail::{KillSwitch, OutputSink};

pub use admission::{Admission, AdmissionPolicy, AdmissionStats, MemoryHold, Slot, Ticket};
pub use approvals::{Approvals, Decision, PendingRun};
pub use observe::{language_label, Caller, Observer, Quiet, RunSummary};
pub use remote::{Credential, RemoteFuture, RemoteSessions};

use crate::engine::{Engine, ValidRequest};
use crate::error::{ErrorKind, RunError};
use crate::intake::{check, merge_call, Offers, Source, Target};
use crate::limits::{LimitOverrides, Millis};
use crate::request::ExecRequest;
use crate::session::{SessionInfo, SessionPolicy, Sessions, WorkspaceListing};
use crate::verdict::{ErrorCategory, Verdict};

/// The kill switches of the runs whose sandboxes exist right now, with what an operator sees
/// of each (`GET /v1/admin/overview`).
#[derive(Clone, Default)]
pub struct RunRegistry(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    next: u64,
    runs: HashMap<u64, (KillSwitch, LiveRun)>,
    /// Set once the grace period is over: runs registered afterwards are killed at once.
    killing: bool,
}

/// What kind of run holds a sandbox.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunKind {
    /// A run in a fresh sandbox.
    OneShot,
    /// A call in a session (or a new session's first call).
    Session,
    /// The server's own readiness probe.
    Probe,
}

impl RunKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RunKind::OneShot => "one-shot",
            RunKind::Session => "session",
            RunKind::Probe => "probe",
        }
    }
}

/// A run whose sandbox exists now: who asked, what, since when. Never its code.
#[derive(Debug, Clone)]
pub struct LiveRun {
    pub kind: RunKind,
    pub language: &'static str,
    pub key_id: Option<String>,
    pub request_id: String,
    pub session_id: Option<String>,
    pub started_at: std::time::SystemTime,
    pub started: Instant,
}

impl LiveRun {
    fn new(kind: RunKind, language: &'static str, caller: Option<&Caller>) -> LiveRun {
        LiveRun {
            kind,
            language,
            key_id: caller.and_then(|c| c.key_id.clone()),
            request_id: caller.map(|c| c.request_id.clone()).unwrap_or_default(),
            session_id: None,
            started_at: std::time::SystemTime::now(),
            started: Instant::now(),
        }
    }
}

/// A registered run; leaves the registry when dropped (when its blocking task ends).
pub struct RunEntry {
    registry: RunRegistry,
    id: u64,
}

impl Drop for RunEntry {
    fn drop(&mut self) {
        self.registry.lock().runs.remove(&self.id);
    }
}

impl RunRegistry {
    fn lock(&self) -> MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn register(&self, ks: KillSwitch, run: LiveRun) -> RunEntry {
        let mut r = self.lock();
        if r.killing {
            ks.trigger();
        }
        r.next += 1;
        let id = r.next;
        r.runs.insert(id, (ks, run));
        RunEntry {
            registry: self.clone(),
            id,
        }
    }

    /// Kill every running sandbox (and any started from now on). Returns how many.
    pub fn kill_all(&self) -> usize {
        let mut r = self.lock();
        r.killing = true;
        for (ks, _) in r.runs.values() {
            ks.trigger();
        }
        r.runs.len()
    }

    /// Sandboxes running now.
    pub fn active(&self) -> usize {
        self.lock().runs.len()
    }

    /// The runs whose sandboxes exist now, oldest first.
    pub fn list(&self) -> Vec<LiveRun> {
        let mut runs: Vec<(u64, LiveRun)> = self
            .lock()
            .runs
            .iter()
            .map(|(id, (_, run))| (*id, run.clone()))
            .collect();
        runs.sort_by_key(|(id, _)| *id);
        runs.into_iter().map(|(_, run)| run).collect()
    }
}

/// Places in line kept until a response is delivered (the HTTP server's delivery guard, an
/// MCP response over HTTP): a verdict waiting for a client that reads slowly holds memory.
#[derive(Clone, Default)]
pub struct Hold(Arc<Mutex<Vec<Ticket>>>);

impl Hold {
    pub fn keep(&self, ticket: &Ticket) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(ticket.clone());
    }
}

/// What the service is built with besides the engine.
#[derive(Clone)]
pub struct ServiceConfig {
    pub admission: AdmissionPolicy,
    pub sessions: SessionPolicy,
    /// Keys whose runs may ask only for these destinations (within the server's policy).
    pub key_networks: HashMap<String, Vec<runcell_proxy::NetRule>>,
    /// How session ids are minted and read (clustered or not).
    pub ids: crate::cluster::SessionIds,
    /// Keep one memory ledger for one-shot runs and sessions (see [`admission`]): a server's
    /// door. Off for one run at a time at the command line, whose run is within the maxima.
    pub memory_ledger: bool,
}

impl ServiceConfig {
    /// One run at a time for the operator at the command line.
    pub fn local() -> ServiceConfig {
        ServiceConfig {
            admission: AdmissionPolicy::single(),
            sessions: SessionPolicy::default(),
            key_networks: HashMap::new(),
            ids: crate::cluster::SessionIds::local(),
            memory_ledger: false,
        }
    }
}

/// The run service. Cheap to clone.
#[derive(Clone)]
pub struct RunService {
    inner: Arc<Inner>,
}

struct Inner {
    engine: Engine,
    sessions: Arc<Sessions>,
    admission: Admission,
    approvals: Arc<Approvals>,
    observer: Arc<dyn Observer>,
    runs: RunRegistry,
    key_networks: HashMap<String, Vec<runcell_proxy::NetRule>>,
    /// How calls reach the sessions of other servers (set by a clustered server).
    remote: std::sync::OnceLock<Arc<dyn RemoteSessions>>,
}

/// One request for the service: who asks, through which door, where it goes, what it is.
#[derive(Debug, Clone)]
pub struct Call {
    pub caller: Caller,
    pub source: Source,
    pub target: Target,
    pub request: ExecRequest,
    /// The run's network access was approved by the caller's own user already (an MCP
    /// client's user, where the operator chose so): no operator approval is waited for.
    pub approved: bool,
    /// The caller's own deadline (an agent request's budget): the run's timeout is cut to
    /// what is left of it.
    pub deadline: Option<Instant>,
}

impl Call {
    pub fn new(caller: Caller, source: Source, target: Target, request: ExecRequest) -> Call {
        Call {
            caller,
            source,
            target,
            request,
            approved: false,
            deadline: None,
        }
    }
}

impl RunService {
    /// The service over `engine`, with its own session table.
    pub fn new(engine: Engine, config: ServiceConfig, observer: Arc<dyn Observer>) -> RunService {
        // One memory ledger for one-shot runs and live sessions: what all runs may use, less
        // what the warm pool's sandboxes hold and what the request bodies in line may hold of
        // the server's own memory (both are memory of the container runcell runs in).
        let bodies = config.admission.body_budget();
        let budget = engine
            .memory_budget()
            .filter(|_| config.memory_ledger)
            .map(|b| b.saturating_sub(bodies));
        let admission = Admission::with_memory(config.admission, budget);
        let sessions = Sessions::build(
            engine.clone(),
            config.sessions,
            Some(admission.clone()),
            config.ids,
        );
        RunService {
            inner: Arc::new(Inner {
                engine,
                sessions,
                admission,
                approvals: Arc::default(),
                observer,
                runs: RunRegistry::default(),
                key_networks: config.key_networks,
                remote: std::sync::OnceLock::new(),
            }),
        }
    }

    /// For the operator at the command line: one run at a time, nobody told.
    pub fn local(engine: Engine) -> RunService {
        RunService::new(engine, ServiceConfig::local(), Arc::new(Quiet))
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.inner.sessions
    }

    pub fn approvals(&self) -> &Arc<Approvals> {
        &self.inner.approvals
    }

    pub fn runs(&self) -> &RunRegistry {
        &self.inner.runs
    }

    pub fn admission(&self) -> &Admission {
        &self.inner.admission
    }

    /// Let calls into other servers' sessions be carried out there (once, at start-up; a
    /// later call is ignored).
    pub fn set_remote(&self, port: Arc<dyn RemoteSessions>) {
        let _ = self.inner.remote.set(port);
    }

    /// The server holding the session `call` goes into, when that is another server of the
    /// cluster reachable through the [`RemoteSessions`] port: only for an id whose tag is
    /// valid (a forged one is unknown here, and answered here).
    pub fn elsewhere(&self, call: &Call) -> Option<String> {
        self.inner.remote.get()?;
        let Target::Session(id) = &call.target else {
            return None;
        };
        match self.inner.sessions.ids().owner(id) {
            crate::cluster::Owner::Peer(pod) => Some(pod),
            _ => None,
        }
    }

    /// Carry out `call` in its session on server `pod` (see [`RunService::elsewhere`]): the
    /// owner admits, runs and audits it; a refusal (the owner's or the peer being
    /// unreachable) is counted here as one. The caller's place in line here (its ticket) is
    /// the door's, held while the answer comes back.
    pub async fn run_elsewhere(
        &self,
        pod: &str,
        call: Call,
        sink: Box<dyn OutputSink + Send>,
    ) -> Result<Verdict, RunError> {
        let summary = RunSummary::from(&call.request);
        let (Some(port), Target::Session(id)) = (self.inner.remote.get(), &call.target) else {
            return Err(RunError::internal(
                "A call into another server's session went astray.",
            ));
        };
        let r = port
            .execute(
                pod,
                id,
                &call.request,
                call.caller.credential.as_ref(),
                sink,
            )
            .await;
        if let Err(e) = &r {
            self.refused(&call.caller, &summary, e);
        }
        r
    }

    /// What the operator's policy offers to the doors that show only what is usable.
    pub fn offers(&self) -> Offers {
        Offers::of(self.inner.engine.config())
    }

    /// A place in line for `caller`, taken before anything of its request is read.
    pub fn reserve(&self, caller: &Caller) -> Result<Ticket, RunError> {
        self.inner
            .admission
            .reserve(caller.key_id.as_deref())
            .inspect_err(|e| self.refused(caller, &RunSummary::default(), e))
    }

    /// A ticket for a body that is not a run's (no place in line; its bytes are counted).
    pub fn reserve_bytes(&self, caller: &Caller) -> Ticket {
        self.inner.admission.unlined(caller.key_id.as_deref())
    }

    /// Report a request a door refused before it reached the service (a body that is not a
    /// request, an approval its user did not give): counted and audited like any refusal.
    pub fn refused(&self, caller: &Caller, run: &RunSummary, e: &RunError) {
        self.inner.observer.refused(caller, run, e);
    }

    /// Run `req` in a fresh sandbox for the server itself (the readiness probe): it takes a
    /// place in line, a slot and its memory on the ledger like any one-shot run (with no API
    /// key), and shutdown kills it; it is neither counted nor audited (no client asked for it).
    /// Errors are admission's (429: the server is full; 503: shutting down, or the limits never
    /// fit) or the request's (invalid); a sandbox that fails is a verdict.
    pub async fn run_internal(&self, req: &ExecRequest) -> Result<Verdict, RunError> {
        let s = self.inner.clone();
        let valid = s.engine.validate(req).map_err(RunError::from)?;
        let ticket = s.admission.reserve(None)?;
        let memory = valid
            .limits()
            .memory
            .0
            .saturating_add(valid.limits().disk.0);
        let slot = ticket.slot_with_memory(memory).await?;
        let kill = KillSwitch::new().map_err(|e| {
            tracing::error!(error = %e, "cannot create a kill switch");
            RunError::unavailable("The server cannot start a run right now. Retry shortly.")
        })?;
        let entry = s.runs.register(
            kill.clone(),
            LiveRun::new(RunKind::Probe, valid.language().name(), None),
        );
        let mut guard = kill.kill_on_drop();
        let engine = s.engine.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            let _held = (entry, ticket);
            // The slot goes back once the sandbox is torn down, not with the verdict.
            engine.execute_valid_holding(
                &valid,
                &mut runcell_jail::NoSink,
                Some(&kill),
                Box::new(slot),
            )
        })
        .await
        .map_err(|_| RunError::internal("The execution failed unexpectedly."));
        guard.disarm();
        verdict
    }

    /// Stop: no new slot, every running sandbox killed, every session ended. Blocking (the
    /// sessions' sandboxes are torn down).
    pub fn shutdown(&self) {
        self.inner.admission.close();
        self.inner.runs.kill_all();
        self.inner.sessions.close_all();
        // The templates go last: nothing forks from them any more.
        self.inner.engine.templates().shutdown();
    }

    /// The intake of one request: checked against its target, merged with its session,
    /// validated against the policy, approved where that is needed. The place in line is
    /// `ticket`'s.
    pub async fn admit(&self, ticket: Ticket, call: Call) -> Result<Admitted, RunError> {
        let summary = RunSummary::from(&call.request);
        let caller = call.caller.clone();
        match self.intake(&ticket, call).await {
            Ok(admitted) => Ok(admitted),
            Err((mut summary_with_session, e)) => {
                if summary_with_session.language.is_empty() {
                    summary_with_session = summary;
                }
                self.refused(&caller, &summary_with_session, &e);
                Err(e)
            }
        }
    }

    async fn intake(
        &self,
        ticket: &Ticket,
        call: Call,
    ) -> Result<Admitted, (RunSummary, RunError)> {
        let s = &self.inner;
        let owner = call.caller.key_id.clone();
        let kind = call.target.kind();
        let mut summary = RunSummary::from(&call.request);
        let fail = |summary: &RunSummary, e: RunError| (summary.clone(), e);
        check(&call.request, kind).map_err(|e| fail(&summary, e))?;
        let mut request = match &call.target {
            Target::Session(id) => {
                summary.session_id = Some(id.clone());
                let settings = s
                    .sessions
                    .settings(owner.as_deref(), id)
                    .map_err(|e| fail(&summary, e))?;
                let merged = merge_call(&call.request, &settings).map_err(|e| fail(&summary, e))?;
                summary.language = observe::language_label(merged.language());
                merged
            }
            _ => call.request,
        };
        let mut warnings = Vec::new();
        if let Some(deadline) = call.deadline {
            cut_to_deadline(&mut request, deadline, self.engine(), &mut warnings)
                .map_err(|e| fail(&summary, e))?;
        }
        self.key_network_check(&request, &call.caller)
            .map_err(|e| fail(&summary, e))?;
        let ttl = match call.target {
            Target::CreateSession => s
                .sessions
                .policy()
                .ttl(request.ttl)
                .map_err(|e| fail(&summary, e))?,
            _ => s.sessions.policy().default_ttl,
        };
        let overrides = request.limits;
        let target = call.target.clone();
        let engine = s.engine.clone();
        // Decoding input files (tens of MiB of base64 at the policy's caps) is CPU work: off
        // the threads that serve every other connection.
        // (The request's files are decoded once: a creation shares them with what it checks.)
        let validated = tokio::task::spawn_blocking(move || match target {
            Target::CreateSession => {
                let v = Arc::new(engine.validate(&request)?);
                Ok((v.clone(), Some(v)))
            }
            // A new session is created from the language and limits alone; its first call
            // brings the code and the files (not copied into the creation's request).
            Target::NewSession => {
                let mut request = request;
                let (code, stdin) = (request.code.take(), request.stdin.take());
                let files = std::mem::take(&mut request.files);
                let creation = ExecRequest {
                    code: Some(String::new()),
                    ..request.clone()
                };
                (request.code, request.stdin, request.files) = (code, stdin, files);
                Ok((
                    Arc::new(engine.validate(&request)?),
                    Some(Arc::new(engine.validate(&creation)?)),
                ))
            }
            _ => Ok((Arc::new(engine.validate(&request)?), None)),
        })
        .await
        .map_err(|_| {
            fail(
                &summary,
                RunError::internal("Checking the request failed unexpectedly."),
            )
        })?
        .map_err(|e: crate::engine::ValidationError| fail(&summary, RunError::from(e)))?;
        let (valid, create) = validated;
        self.approve(
            ticket,
            &call.caller,
            &summary,
            &valid,
            call.source,
            call.approved,
        )
        .await
        .map_err(|e| fail(&summary, e))?;
        let kill = KillSwitch::new().map_err(|e| {
            tracing::error!(error = %e, "cannot create a kill switch");
            fail(
                &summary,
                RunError::unavailable("The server cannot start a run right now. Retry shortly."),
            )
        })?;
        Ok(Admitted {
            service: self.clone(),
            kill,
            ticket: ticket.clone(),
            caller: call.caller,
            summary,
            target: call.target,
            valid,
            create: create.map(|v| (v, overrides, ttl)),
            warnings,
            admitted: Instant::now(),
        })
    }

    /// A key with its own network entries: what its runs ask for must be within them too (the
    /// server's policy is checked by the engine's validation).
    fn key_network_check(&self, req: &ExecRequest, caller: &Caller) -> Result<(), RunError> {
        let (Some(asked), Some(key)) = (&req.network, &caller.key_id) else {
            return Ok(());
        };
        let Some(allowed) = self.inner.key_networks.get(key) else {
            return Ok(());
        };
        let asked = runcell_proxy::parse_rules(&asked.allow)
            .map_err(|e| RunError::invalid(format!("Invalid network request: {e}.")))?;
        match runcell_proxy::first_not_covered(allowed, &asked) {
            None => Ok(()),
            Some(r) => {
                let list: Vec<String> = allowed.iter().map(|r| r.to_string()).collect();
                Err(RunError::invalid(format!(
                    "Invalid network request: {r} is not allowed for this API key, which may ask for: {}.",
                    if list.is_empty() { "nothing".to_string() } else { list.join(", ") }
                )))
            }
        }
    }

    /// Wait for an operator's approval where the policy requires one. The wait holds no
    /// place in line (runs waiting for a person must not fill the queue for everyone else)
    /// but keeps the request's bytes; a key may have a few waiting at once.
    async fn approve(
        &self,
        ticket: &Ticket,
        caller: &Caller,
        summary: &RunSummary,
        valid: &ValidRequest,
        source: Source,
        approved: bool,
    ) -> Result<(), RunError> {
        let net = &self.inner.engine.config().network;
        if !net.approval || valid.network().is_empty() || approved || source == Source::Operator {
            return Ok(());
        }
        let run = PendingRun {
            id: String::new(),
            key_id: caller.key_id.clone(),
            request_id: caller.request_id.clone(),
            language: summary.language.to_string(),
            destinations: valid.network().iter().map(|r| r.to_string()).collect(),
            code_sha256: summary.code_sha256.clone(),
            code_bytes: summary.code_bytes,
            requested_at: String::new(),
            expires_at: String::new(),
        };
        let dests = run.destinations.join(", ");
        ticket.release_place();
        let decision = self.inner.approvals.wait(run, net.approval_timeout).await;
        match decision {
            Decision::Approved => ticket.retake_place(),
            Decision::Denied => Err(RunError::new(
                ErrorKind::ApprovalDenied,
                format!(
                    "An operator denied this run's network access ({dests}); it did not run. \
                     Run it without \"network\", or ask the operator."
                ),
            )),
            Decision::TooMany(n) => Err(RunError::rate_limited(format!(
                "This API key already has {n} runs waiting for network approval; wait for \
                 them to be decided."
            ))),
            Decision::TimedOut => Err(RunError::new(
                ErrorKind::ApprovalTimeout,
                format!(
                    "No operator approved this run's network access ({dests}) within {} s; it \
                     did not run.",
                    net.approval_timeout.as_secs()
                ),
            )),
        }
    }

    /// Describe one of the caller's sessions.
    pub fn session(&self, caller: &Caller, id: &str) -> Result<SessionInfo, RunError> {
        self.inner.sessions.get(caller.key_id.as_deref(), id)
    }

    /// The caller's live sessions.
    pub fn sessions_of(&self, caller: &Caller) -> Vec<SessionInfo> {
        self.inner.sessions.list(caller.key_id.as_deref())
    }

    /// Give one of the caller's sessions a new idle TTL, counted from now (seconds, within
    /// the policy).
    pub fn set_session_ttl(
        &self,
        caller: &Caller,
        id: &str,
        ttl: Option<f64>,
    ) -> Result<SessionInfo, RunError> {
        self.inner
            .sessions
            .set_ttl(caller.key_id.as_deref(), id, ttl)
    }

    /// Fork one of the caller's sessions: a new session, created through admission like any
    /// other (the caps per key, the memory ledger, an approval of its network), with a copy
    /// of the parent's workspace and (Python) interpreter state. `ticket` is the request's
    /// place in line. Refusals for want of room (the caps on sessions) are `conflict`: the
    /// parent is fine, the fork is what does not fit.
    pub async fn fork_session(
        &self,
        ticket: Ticket,
        caller: &Caller,
        id: String,
    ) -> Result<(SessionInfo, crate::ForkSource), RunError> {
        let sessions = self.inner.sessions.clone();
        let owner = caller.key_id.clone();
        let parent = id.clone();
        let (mut source, ttl) = blocking(move || {
            let ttl = sessions.get(owner.as_deref(), &parent)?.ttl;
            Ok((sessions.fork_source(owner.as_deref(), &parent)?, ttl))
        })
        .await?;
        let mut request = source.request.clone();
        request.ttl = Some(ttl);
        // The copy's files are its creation's: no need to keep them twice.
        source.request.files = Vec::new();
        let as_conflict = |e: RunError| match e.kind {
            ErrorKind::RateLimited => RunError::new(ErrorKind::Conflict, e.message),
            _ => e,
        };
        let call = Call::new(caller.clone(), Source::Api, Target::CreateSession, request);
        let admitted = self.admit(ticket, call).await.map_err(as_conflict)?;
        let info = admitted.create().await.map_err(as_conflict)?;
        let sessions = self.inner.sessions.clone();
        let owner = caller.key_id.clone();
        let child = info.id.clone();
        let has_state = source.has_state;
        let loaded =
            blocking(move || sessions.finish_fork(owner.as_deref(), &child, has_state)).await;
        if let Err(e) = loaded {
            // A copy without its state is not what was asked for: it goes.
            let _ = self.delete_session(caller, info.id.clone()).await;
            return Err(e);
        }
        self.inner
            .observer
            .session_event(caller, "session_forked", &info.id, Some(&id));
        let info = self.session(caller, &info.id)?;
        Ok((info, source))
    }

    /// Pause one of the caller's sessions (its sandbox frozen; see [`Sessions::pause`]).
    pub async fn pause_session(
        &self,
        caller: &Caller,
        id: String,
    ) -> Result<SessionInfo, RunError> {
        let sessions = self.inner.sessions.clone();
        let owner = caller.key_id.clone();
        let info = blocking(move || sessions.pause(owner.as_deref(), &id)).await?;
        self.inner
            .observer
            .session_event(caller, "session_paused", &info.id, None);
        Ok(info)
    }

    /// Resume one of the caller's sessions (a running one is left as it is).
    pub async fn resume_session(
        &self,
        caller: &Caller,
        id: String,
    ) -> Result<(SessionInfo, crate::Resumed), RunError> {
        let sessions = self.inner.sessions.clone();
        let owner = caller.key_id.clone();
        let (info, resumed) = blocking(move || sessions.resume(owner.as_deref(), &id)).await?;
        if resumed == crate::Resumed::Thawed {
            self.inner
                .observer
                .session_event(caller, "session_resumed", &info.id, None);
        }
        Ok((info, resumed))
    }

    /// End one of the caller's sessions (its sandbox torn down off the async threads).
    pub async fn delete_session(&self, caller: &Caller, id: String) -> Result<(), RunError> {
        let sessions = self.inner.sessions.clone();
        let owner = caller.key_id.clone();
        blocking(move || sessions.delete(owner.as_deref(), &id)).await
    }

    /// Whether a session exists for the caller and is free (before a file's body is read).
    pub fn check_session_idle(&self, caller: &Caller, id: &str) -> Result<(), RunError> {
        self.inner
            .sessions
            .check_idle(caller.key_id.as_deref(), id)
            .inspect_err(|e| self.file_refused(caller, e))
    }

    /// The files of a session's /workspace. `ticket` is the operation's place in line.
    pub async fn list_files(
        &self,
        ticket: &Ticket,
        caller: &Caller,
        id: String,
    ) -> Result<WorkspaceListing, RunError> {
        let owner = caller.key_id.clone();
        self.file_op(ticket, caller, 0, move |sessions| {
            sessions.list_files(owner.as_deref(), &id)
        })
        .await
    }

    /// One file of a session's /workspace (`None`: no such file). Its bytes are taken from
    /// `ticket`'s share of the body budget while they are in memory: a file crosses the
    /// server's memory whole, up to the per-file cap, so that much is held before it is read.
    pub async fn read_file(
        &self,
        ticket: &Ticket,
        caller: &Caller,
        id: String,
        path: String,
    ) -> Result<Option<Vec<u8>>, RunError> {
        let owner = caller.key_id.clone();
        let cap = self.inner.engine.policy().max_input_file_bytes;
        self.file_op(ticket, caller, cap, move |sessions| {
            sessions.read_file(owner.as_deref(), &id, &path)
        })
        .await
    }

    /// Write one file into a session's /workspace (its body was read within `ticket`).
    pub async fn write_file(
        &self,
        ticket: &Ticket,
        caller: &Caller,
        id: String,
        path: String,
        data: Vec<u8>,
    ) -> Result<(), RunError> {
        let owner = caller.key_id.clone();
        self.file_op(ticket, caller, 0, move |sessions| {
            sessions.write_file(owner.as_deref(), &id, &path, data)
        })
        .await
    }

    /// A file operation on a session: it holds `bytes` more of the body budget, takes a slot
    /// like a run (pid 1 does the work, and a session whose sandbox was lost is rebuilt
    /// first), and runs off the async threads. Its refusals are counted like a run's.
    async fn file_op<T: Send + 'static>(
        &self,
        ticket: &Ticket,
        caller: &Caller,
        bytes: u64,
        op: impl FnOnce(&Sessions) -> Result<T, RunError> + Send + 'static,
    ) -> Result<T, RunError> {
        let result = async {
            ticket.take_bytes(bytes)?;
            let slot = ticket.slot().await?;
            let held = (slot, ticket.clone());
            let sessions = self.inner.sessions.clone();
            blocking(move || {
                let _held = held;
                op(&sessions)
            })
            .await
        };
        result.await.inspect_err(|e| self.file_refused(caller, e))
    }

    /// A file operation refused: counted (it describes no run to audit).
    fn file_refused(&self, caller: &Caller, e: &RunError) {
        self.inner
            .observer
            .refused(caller, &RunSummary::default(), e);
    }
}

/// Run session work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RunError> + Send + 'static,
) -> Result<T, RunError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| RunError::internal("The session operation failed unexpectedly."))?
}

/// The smallest timeout a run is given when its caller's deadline is near.
const SHORTEST_RUN: Duration = Duration::from_millis(10);

/// Cut the request's timeout to what is left before `deadline` (an agent request's budget):
/// a model's run never outlasts the request that asked for it.
fn cut_to_deadline(
    req: &mut ExecRequest,
    deadline: Instant,
    engine: &Engine,
    warnings: &mut Vec<String>,
) -> Result<(), RunError> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left < SHORTEST_RUN {
        return Err(RunError::new(
            ErrorKind::RequestTimeout,
            "The request's time budget is spent: the code did not run.",
        ));
    }
    let asked = req
        .limits
        .timeout
        .unwrap_or(engine.policy().defaults.timeout);
    let left_ms = Millis(left.as_millis().min(u64::MAX as u128) as u64);
    if asked > left_ms {
        req.limits.timeout = Some(left_ms);
        warnings.push(format!(
            "timeout: cut to {} s, what was left of the request's time budget.",
            left_ms.0 as f64 / 1000.0
        ));
    }
    Ok(())
}

/// A request that may run: it waits for a slot, runs, and is counted and audited.
pub struct Admitted {
    service: RunService,
    /// Stops the run from outside (a terminal's Ctrl-C), as dropping the run's future does.
    kill: KillSwitch,
    ticket: Ticket,
    caller: Caller,
    summary: RunSummary,
    target: Target,
    valid: Arc<ValidRequest>,
    /// A new session's own request, the limits it asked for and its TTL.
    create: Option<(Arc<ValidRequest>, LimitOverrides, Duration)>,
    warnings: Vec<String>,
    admitted: Instant,
}

impl Admitted {
    /// The request's place in line (a response being delivered keeps it: see [`Hold`]).
    pub fn ticket(&self) -> &Ticket {
        &self.ticket
    }

    /// The validated request.
    pub fn request(&self) -> &ValidRequest {
        &self.valid
    }

    /// The run's kill switch: triggered, it stops the run (a session's call is interrupted
    /// first), and the verdict says so.
    pub fn kill_switch(&self) -> KillSwitch {
        self.kill.clone()
    }

    /// Wait for a slot and run (in a fresh sandbox, a new session or the caller's session).
    /// Dropping the future (a client that went away, a cancelled call) kills the sandbox or
    /// interrupts the session's call; the run is still counted and audited.
    pub async fn run(self, sink: Box<dyn OutputSink + Send>) -> Result<Verdict, RunError> {
        let Admitted {
            service,
            kill: ks,
            ticket,
            caller,
            mut summary,
            target,
            valid,
            create,
            warnings,
            admitted,
        } = self;
        let s = service.inner.clone();
        // A one-shot run holds its memory and its (in-memory) disk in the ledger while it runs;
        // a session's call runs within what the session holds.
        let memory = match target {
            Target::OneShot => valid
                .limits()
                .memory
                .0
                .saturating_add(valid.limits().disk.0),
            _ => 0,
        };
        let slot = ticket
            .slot_with_memory(memory)
            .await
            .inspect_err(|e| s.observer.refused(&caller, &summary, e))?;
        let live = LiveRun {
            session_id: match &target {
                Target::Session(id) => Some(id.clone()),
                _ => None,
            },
            ..LiveRun::new(
                match target {
                    Target::OneShot => RunKind::OneShot,
                    _ => RunKind::Session,
                },
                summary.language,
                Some(&caller),
            )
        };
        let entry = s.runs.register(ks.clone(), live);
        let mut guard = ks.kill_on_drop();
        let owner = caller.key_id.clone();
        let span = tracing::Span::current();
        let kill = ks.clone();
        let (made, mut waiting) = NewSessions::watch(&s.sessions, owner.clone());
        let result = tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            let _held = (entry, ticket);
            let mut slot = Some(slot);
            let mut sink = sink;
            let r = match target {
                // A one-shot run's slot (and its memory on the ledger) goes back once its
                // sandbox is torn down, which may be after the verdict.
                Target::OneShot => Ok(s.engine.execute_valid_holding(
                    &valid,
                    &mut *sink,
                    Some(&kill),
                    Box::new(slot.take()),
                )),
                Target::Session(id) => {
                    s.sessions
                        .execute(owner.as_deref(), &id, &valid, &mut *sink, Some(&kill))
                }
                Target::NewSession => match create {
                    Some((c, overrides, ttl)) => s
                        .sessions
                        .create(owner.as_deref(), &c, overrides, ttl, Some(&kill))
                        .and_then(|info| made.made(&info.id).map(|()| info))
                        .and_then(|info| {
                            s.sessions.execute(
                                owner.as_deref(),
                                &info.id,
                                &valid,
                                &mut *sink,
                                Some(&kill),
                            )
                        }),
                    None => Err(RunError::internal("a new session without its request")),
                },
                Target::CreateSession => Err(RunError::internal("a session creation run as code")),
            };
            // Flush what the sink held back before the verdict is handed on.
            drop(sink);
            let r = r.map(|mut v| {
                v.warnings.extend(warnings);
                v
            });
            let seconds = admitted.elapsed().as_secs_f64();
            match &r {
                Ok(v) => {
                    summary.session_id = v.session_id.clone().or(summary.session_id.take());
                    s.observer.finished(&caller, &summary, v, seconds);
                }
                Err(e) => s.observer.refused(&caller, &summary, e),
            }
            r
        })
        .await
        .unwrap_or_else(|_| Err(RunError::internal("The execution failed unexpectedly.")));
        guard.disarm();
        waiting.answered();
        result
    }

    /// Create the session this request describes (`Target::CreateSession`). Building its
    /// sandbox takes a slot like a run.
    pub async fn create(self) -> Result<SessionInfo, RunError> {
        let Admitted {
            service,
            kill,
            ticket,
            caller,
            summary,
            create,
            ..
        } = self;
        let s = service.inner.clone();
        let Some((c, overrides, ttl)) = create else {
            return Err(RunError::internal("a session creation without its request"));
        };
        let slot = ticket
            .slot()
            .await
            .inspect_err(|e| s.observer.refused(&caller, &summary, e))?;
        let owner = caller.key_id.clone();
        let s2 = s.clone();
        let (made, mut waiting) = NewSessions::watch(&s.sessions, owner.clone());
        // A caller that goes away stops the session's package install.
        let mut guard = kill.kill_on_drop();
        let r = tokio::task::spawn_blocking(move || {
            let _held = (slot, ticket);
            s2.sessions
                .create(owner.as_deref(), &c, overrides, ttl, Some(&kill))
                .and_then(|info| made.made(&info.id).map(|()| info))
        })
        .await
        .unwrap_or_else(|_| Err(RunError::internal("The session could not be created.")));
        guard.disarm();
        waiting.answered();
        if let Err(e) = &r {
            s.observer.refused(&caller, &summary, e);
        }
        r
    }
}

/// A session made for a caller that may go away before it learns the session's id (a client
/// that hung up, an agent request cut at its budget): whichever comes last, the session made
/// or the caller gone, ends it, so that no session outlives a caller that never knew it.
struct NewSessions {
    /// Ends a session by its id.
    end: Box<dyn Fn(&str) + Send + Sync>,
    state: Mutex<Orphan>,
}

#[derive(Default)]
struct Orphan {
    /// The caller stopped waiting before it got its answer.
    gone: bool,
    /// The session made (not yet handed over).
    made: Option<String>,
}

/// The side of [`NewSessions`] that makes the session (in the blocking task).
struct Maker(Arc<NewSessions>);

/// The side of [`NewSessions`] that waits for the answer: dropped before
/// [`Waiting::answered`], the caller is gone.
struct Waiting(Option<Arc<NewSessions>>);

impl NewSessions {
    /// For sessions of `owner` in `sessions`.
    fn watch(sessions: &Arc<Sessions>, owner: Option<String>) -> (Maker, Waiting) {
        let sessions = sessions.clone();
        NewSessions::ending_with(move |id| {
            let _ = sessions.delete(owner.as_deref(), id);
        })
    }

    fn ending_with(end: impl Fn(&str) + Send + Sync + 'static) -> (Maker, Waiting) {
        let shared = Arc::new(NewSessions {
            end: Box::new(end),
            state: Mutex::new(Orphan::default()),
        });
        (Maker(shared.clone()), Waiting(Some(shared)))
    }
}

impl Maker {
    /// The session is made: kept for the caller, or ended at once if the caller is gone.
    fn made(&self, id: &str) -> Result<(), RunError> {
        let mut st = self.0.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.gone {
            drop(st);
            (self.0.end)(id);
            return Err(RunError::unavailable(
                "The caller went away while its session was made; the session is ended.",
            ));
        }
        st.made = Some(id.to_owned());
        Ok(())
    }
}

impl Waiting {
    /// The caller has its answer (and the session's id with it).
    fn answered(&mut self) {
        self.0 = None;
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(shared) = self.0.take() else { return };
        let made = {
            let mut st = shared.state.lock().unwrap_or_else(|e| e.into_inner());
            st.gone = true;
            st.made.take()
        };
        let Some(id) = made else { return };
        // Ending a session tears its sandbox down (and kills a call still running in it):
        // off the async threads.
        let end = move || (shared.end)(&id);
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn_blocking(end);
            }
            Err(_) => end(),
        }
    }
}

/// The verdict of a request refused before it ran, for doors that answer with verdicts (the
/// command line).
pub fn refusal_verdict(e: &RunError) -> Verdict {
    let category = match e.kind {
        ErrorKind::RuntimeUnavailable => ErrorCategory::RuntimeUnavailable,
        ErrorKind::SandboxFailure
        | ErrorKind::Internal
        | ErrorKind::Unavailable
        | ErrorKind::Draining
        | ErrorKind::PeerUnavailable => ErrorCategory::SandboxFailure,
        _ => ErrorCategory::InvalidRequest,
    };
    Verdict::failed(category, e.message.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watched() -> (Maker, Waiting, Arc<Mutex<Vec<String>>>) {
        let ended = Arc::new(Mutex::new(Vec::new()));
        let e = ended.clone();
        let (maker, waiting) = NewSessions::ending_with(move |id| {
            e.lock().unwrap().push(id.to_owned());
        });
        (maker, waiting, ended)
    }

    /// The registry lists its runs oldest first, with who asked, and forgets each when its
    /// entry is dropped; killing all of them kills those registered afterwards too.
    #[test]
    fn the_registry_lists_live_runs_and_forgets_ended_ones() {
        let runs = RunRegistry::default();
        let caller = Caller {
            request_id: "r1".into(),
            key_id: Some("team-a".into()),
            ..Caller::default()
        };
        let first = runs.register(
            KillSwitch::new().unwrap(),
            LiveRun::new(RunKind::OneShot, "python", Some(&caller)),
        );
        let second = runs.register(
            KillSwitch::new().unwrap(),
            LiveRun::new(RunKind::Probe, "bash", None),
        );
        let list = runs.list();
        assert_eq!(list.len(), 2);
        assert_eq!(
            (
                list[0].kind.as_str(),
                list[0].language,
                list[0].key_id.as_deref()
            ),
            ("one-shot", "python", Some("team-a"))
        );
        assert_eq!(list[0].request_id, "r1");
        assert_eq!(
            (list[1].kind.as_str(), list[1].key_id.as_deref()),
            ("probe", None)
        );
        drop(first);
        assert_eq!(runs.list().len(), 1);
        assert_eq!(runs.active(), 1);
        drop(second);
        assert!(runs.list().is_empty());
        assert_eq!(runs.kill_all(), 0);
        let late = KillSwitch::new().unwrap();
        let _entry = runs.register(late.clone(), LiveRun::new(RunKind::Session, "python", None));
        assert!(late.is_triggered());
    }

    /// The server's own run (the readiness probe) is admitted like any run: with the only
    /// place in line held, it is refused (429) before any sandbox is built, and it holds
    /// nothing afterwards.
    #[tokio::test]
    async fn the_servers_own_run_goes_through_admission() {
        let mut c = crate::engine::EngineConfig::for_host();
        c.policy = crate::limits::LimitPolicy::for_host(8 << 30, 2);
        let service = RunService::local(Engine::new(c));
        let held = service.admission().reserve(None).unwrap();
        let e = service
            .run_internal(&ExecRequest::new("bash", "true"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::RateLimited, "{}", e.message);
        drop(held);
        // An invalid request is refused before it takes anything.
        let e = service
            .run_internal(&ExecRequest::new("cobol", "x"))
            .await
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidRequest, "{}", e.message);
        assert_eq!(service.admission().stats(), Default::default());
        assert_eq!(service.runs().active(), 0);
    }

    #[test]
    fn a_session_made_for_a_caller_that_went_away_is_ended() {
        // Gone before the session is made: it is ended as it is made, and no call runs in it.
        let (maker, waiting, ended) = watched();
        drop(waiting);
        assert!(maker.made("s1").is_err());
        assert_eq!(*ended.lock().unwrap(), ["s1"]);

        // Gone after: the waiting side ends it.
        let (maker, waiting, ended) = watched();
        maker.made("s2").unwrap();
        assert!(ended.lock().unwrap().is_empty());
        drop(waiting);
        assert_eq!(*ended.lock().unwrap(), ["s2"]);
    }

    #[test]
    fn a_session_handed_over_is_kept() {
        let (maker, mut waiting, ended) = watched();
        maker.made("s3").unwrap();
        waiting.answered();
        drop(waiting);
        drop(maker);
        assert!(ended.lock().unwrap().is_empty());
        // And a caller that went away with nothing made ends nothing.
        let (_maker, waiting, ended) = watched();
        drop(waiting);
        assert!(ended.lock().unwrap().is_empty());
    }
}
