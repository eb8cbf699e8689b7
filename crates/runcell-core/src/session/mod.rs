//! Sessions: a sandbox that outlives its calls, with an interpreter that keeps its state.
//!
//! * [`sandbox`]: one session's sandbox and interpreter, and how a call runs in it;
//! * [`files`]: its /workspace seen from outside (list, read, write);
//! * [`policy`]: what a server allows of sessions, and how keys share what idle sessions
//!   hold;
//! * [`info`]: what the API says about a session.
//!
//! [`Sessions`] keeps the live sessions of a server: ids, owners (the API key that created a
//! session; another key gets `not_found`), caps per owner and in total, each key's share of
//! the memory and disk idle sessions hold, an idle TTL and a maximum lifetime, and a reaper
//! that ends expired sessions with nothing left behind. Between calls a session's processes
//! are stopped by its sandbox's pid 1 (see docs/isolation.md), so an idle session uses no
//! CPU. What may be asked of a session, and how a call is merged with the session's own
//! settings, is the intake's ([`crate::intake`]); admission, audit and metrics are the run
//! service's ([`crate::service`]).

mod files;
mod fork;
mod info;
mod policy;
pub mod results;
mod sandbox;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant, SystemTime};

use runcell_jail::{KillSwitch, OutputSink};

pub use fork::ForkSource;
pub use info::{rfc3339, SessionInfo, SessionState, WorkspaceFile, WorkspaceListing};
pub use policy::{owner_share, Holdings, SessionPolicy};
pub use sandbox::Session;

use crate::cluster::{Owner, SessionIds};
use crate::engine::{Engine, ValidRequest};
use crate::error::{ErrorKind, RunError};
use crate::intake::SessionSettings;
use crate::limits::{LimitOverrides, Limits};
use crate::verdict::Verdict;

/// A live session in the table.
struct Slot {
    id: String,
    /// What the session was created with (each call is merged with it).
    settings: SessionSettings,
    owner: Option<String>,
    created: Instant,
    created_at: SystemTime,
    /// Memory and disk it holds while idle (its limits).
    holds: u64,
    /// The same bytes in the server's memory ledger, given back when the session ends.
    _memory: Option<crate::service::MemoryHold>,
    state: Mutex<SlotState>,
}

struct SlotState {
    /// `None` while a call runs (the call holds it), or before it is built.
    session: Option<Session>,
    last_used: Instant,
    /// The kill switch of the running call.
    running: Option<KillSwitch>,
    /// Ended (deleted, expired): the running call closes the session when it returns.
    closed: bool,
    executions: u64,
    limits: Limits,
    /// Idle time to live: changed by [`Sessions::set_ttl`] (E2B's `set_timeout`).
    ttl: Duration,
    /// When it was paused (its sandbox frozen); `None` while it runs. While paused, the
    /// policy's `paused_ttl` replaces `ttl`, counted from the pause.
    paused_at: Option<SystemTime>,
}

impl SlotState {
    /// The idle time to live that applies now.
    fn idle_ttl(&self, policy: &SessionPolicy) -> Duration {
        match self.paused_at {
            Some(_) => policy.paused_ttl,
            None => self.ttl,
        }
    }
}

#[derive(Default)]
struct Table {
    slots: HashMap<String, Arc<Slot>>,
    shutting_down: bool,
    /// Taking no new session (the server is being removed); the live ones go on.
    draining: bool,
}

impl Table {
    /// What the live sessions hold, seen from `owner`.
    fn holdings(&self, owner: Option<&str>) -> Holdings {
        let mut h = Holdings {
            total: 0,
            owner: 0,
            others: 0,
        };
        let mut others = HashSet::new();
        for s in self.slots.values() {
            h.total = h.total.saturating_add(s.holds);
            if s.owner.as_deref() == owner {
                h.owner = h.owner.saturating_add(s.holds);
            } else {
                others.insert(s.owner.clone());
            }
        }
        h.others = others.len();
        h
    }
}

/// Figures for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SessionStats {
    pub live: usize,
    pub created: u64,
    pub expired: u64,
    pub deleted: u64,
    pub paused: u64,
    pub resumed: u64,
    pub forked: u64,
}

/// A live session, its owner (the API key's id; `None` without keys) and when it was last
/// used (RFC 3339, UTC).
#[derive(Debug, Clone)]
pub struct OwnedSession {
    pub owner: Option<String>,
    pub last_used_at: String,
    pub info: SessionInfo,
}

/// What a resume did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resumed {
    /// The session was paused and runs again.
    Thawed,
    /// It was running already: nothing was done.
    AlreadyRunning,
}

/// The live sessions of a server.
pub struct Sessions {
    engine: Engine,
    /// The server's memory ledger, shared with one-shot runs (`None`: sessions are checked
    /// against the engine's budget alone).
    ledger: Option<crate::service::Admission>,
    policy: SessionPolicy,
    /// Mints this process's session ids and says where an id's session lives.
    ids: SessionIds,
    table: Arc<Mutex<Table>>,
    stats: Arc<Mutex<SessionStats>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// How often the reaper looks for expired sessions.
const REAP_EVERY: Duration = Duration::from_millis(500);

fn not_found(id: &str) -> RunError {
    RunError::new(
        ErrorKind::NotFound,
        format!(
            "No session {}: it does not exist, has ended, or belongs to another API key.",
            crate::request::prefix(id, 64)
        ),
    )
}

fn busy() -> RunError {
    RunError::new(
        ErrorKind::SessionBusy,
        "The session is running another call; wait for it to finish.",
    )
}

fn draining() -> RunError {
    RunError::new(
        ErrorKind::Draining,
        "This server is draining (it is being stopped) and takes no new session; retry: \
         another server will take it.",
    )
}

fn shutting_down() -> RunError {
    RunError::unavailable("The server is shutting down.")
}

impl Sessions {
    /// The session table, and its reaper thread (which ends with the table).
    pub fn new(engine: Engine, policy: SessionPolicy) -> Arc<Sessions> {
        Sessions::build(engine, policy, None, SessionIds::local())
    }

    /// As [`Sessions::new`], with ids from `ids` (a clustered server's).
    pub fn with_ids(engine: Engine, policy: SessionPolicy, ids: SessionIds) -> Arc<Sessions> {
        Sessions::build(engine, policy, None, ids)
    }

    /// The session table, whose sessions hold their memory and disk in `ledger`'s memory
    /// ledger, beside the one-shot runs it admits (when there is one), with ids from `ids`.
    pub(crate) fn build(
        engine: Engine,
        policy: SessionPolicy,
        ledger: Option<crate::service::Admission>,
        ids: SessionIds,
    ) -> Arc<Sessions> {
        let sessions = Arc::new(Sessions {
            engine,
            ledger,
            policy,
            ids,
            table: Arc::new(Mutex::new(Table::default())),
            stats: Arc::new(Mutex::new(SessionStats::default())),
        });
        let weak = Arc::downgrade(&sessions);
        let _ = std::thread::Builder::new()
            .name("runcell-session-reaper".into())
            .spawn(move || reaper(weak));
        sessions
    }

    pub fn policy(&self) -> &SessionPolicy {
        &self.policy
    }

    /// This process's session ids.
    pub fn ids(&self) -> &SessionIds {
        &self.ids
    }

    /// Take no new session from now on (the server is draining); live sessions go on.
    pub fn drain(&self) {
        lock(&self.table).draining = true;
    }

    /// Whether [`Sessions::drain`] was called.
    pub fn draining(&self) -> bool {
        lock(&self.table).draining
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    pub fn stats(&self) -> SessionStats {
        let mut s = *lock(&self.stats);
        s.live = lock(&self.table).slots.len();
        s
    }

    /// Create a session for `owner` from a validated request (its language, files, limits,
    /// network and packages; `overrides` are the limits it asked for, which its calls are
    /// merged with). Blocking (it installs its packages and builds a sandbox); `cancel` stops
    /// a package install (a caller that went away).
    pub fn create(
        &self,
        owner: Option<&str>,
        v: &ValidRequest,
        overrides: LimitOverrides,
        ttl: Duration,
        cancel: Option<&KillSwitch>,
    ) -> Result<SessionInfo, RunError> {
        let holds = v.limits().memory.0.saturating_add(v.limits().disk.0);
        // A place in the table first (so that the caps hold under concurrent creations), the
        // sandbox after, outside the lock.
        let slot = {
            let mut t = lock(&self.table);
            if t.shutting_down {
                return Err(shutting_down());
            }
            if t.draining {
                return Err(draining());
            }
            if t.slots.len() >= self.policy.max_total {
                return Err(RunError::rate_limited(format!(
                    "The server has {} live sessions, its maximum. Delete a session or retry \
                     once one has expired.",
                    self.policy.max_total
                )));
            }
            let mine = t
                .slots
                .values()
                .filter(|s| s.owner.as_deref() == owner)
                .count();
            if mine >= self.policy.max_per_owner {
                return Err(RunError::rate_limited(format!(
                    "This API key has {mine} live sessions, its maximum. Delete one \
                     (DELETE /v1/sessions/{{id}}) or wait until one expires."
                )));
            }
            // Sessions hold their memory and their (in-memory) disk while idle: together they
            // stay within what all runs may use, or the kernel would have to find the room by
            // killing runs of other keys; and one key holds at most its share of that.
            let budget = match &self.ledger {
                Some(l) => l.memory_budget(),
                None => self.engine.config().all_runs_memory_bytes,
            };
            if let Some(budget) = budget {
                t.holdings(owner).admit(holds, budget, self.policy.keys)?;
            }
            // And with the one-shot runs of the moment: one ledger for both.
            let memory = match &self.ledger {
                Some(l) => Some(l.hold_memory(holds)?),
                None => None,
            };
            let slot = Arc::new(Slot {
                id: self.ids.mint(),
                settings: SessionSettings {
                    language: v.language(),
                    overrides,
                    network: crate::intake::network_entries(v.network()),
                    packages: v.packages().iter().map(|r| r.text.clone()).collect(),
                },
                owner: owner.map(str::to_string),
                created: Instant::now(),
                created_at: SystemTime::now(),
                holds,
                _memory: memory,
                state: Mutex::new(SlotState {
                    session: None,
                    last_used: Instant::now(),
                    running: None,
                    closed: false,
                    executions: 0,
                    limits: *v.limits(),
                    ttl,
                    paused_at: None,
                }),
            });
            t.slots.insert(slot.id.clone(), slot.clone());
            slot
        };
        // Busy while it is built: no call, file operation or reaper touches it meanwhile.
        lock(&slot.state).running = KillSwitch::new().ok();
        let opened = self
            .engine
            .open_session(v, overrides, self.policy.max_lifetime, cancel);
        let mut st = lock(&slot.state);
        st.running = None;
        match opened {
            Ok(session) if !st.closed => {
                st.session = Some(session);
                st.last_used = Instant::now();
                drop(st);
                lock(&self.stats).created += 1;
                Ok(self.info(&slot))
            }
            Ok(session) => {
                drop(st);
                session.close();
                Err(shutting_down())
            }
            Err(e) => {
                drop(st);
                lock(&self.table).slots.remove(&slot.id);
                Err(e)
            }
        }
    }

    fn find(&self, owner: Option<&str>, id: &str) -> Result<Arc<Slot>, RunError> {
        let t = lock(&self.table);
        match t.slots.get(id) {
            Some(s) if s.owner.as_deref() == owner => Ok(s.clone()),
            // Only an id whose tag is valid (clustered) can say its server restarted: a
            // forged one is unknown.
            None => match self.ids.owner(id) {
                Owner::Restarted => Err(RunError::session_lost(id)),
                Owner::Peer(pod) => Err(RunError::new(
                    ErrorKind::NotFound,
                    format!(
                        "Session {id} lives on server {pod}, and this request reached another \
                         server that did not pass it on (a request carrying \
                         runcell-forwarded-by never is): send it through the cluster's \
                         address without that header."
                    ),
                )),
                Owner::Here | Owner::Unknown => Err(not_found(id)),
            },
            _ => Err(not_found(id)),
        }
    }

    /// What a session was created with, for merging a call with it.
    pub fn settings(&self, owner: Option<&str>, id: &str) -> Result<SessionSettings, RunError> {
        Ok(self.find(owner, id)?.settings.clone())
    }

    /// Describe a session.
    pub fn get(&self, owner: Option<&str>, id: &str) -> Result<SessionInfo, RunError> {
        let slot = self.find(owner, id)?;
        Ok(self.info(&slot))
    }

    /// Give a session a new idle TTL, counted from now (E2B's `set_timeout`): within the
    /// policy's maximum, and never past the session's maximum lifetime, which still applies.
    pub fn set_ttl(
        &self,
        owner: Option<&str>,
        id: &str,
        asked: Option<f64>,
    ) -> Result<SessionInfo, RunError> {
        let ttl = self.policy.ttl(asked)?;
        let slot = self.find(owner, id)?;
        {
            let mut st = lock(&slot.state);
            if st.closed {
                return Err(not_found(id));
            }
            st.ttl = ttl;
            st.last_used = Instant::now();
        }
        Ok(self.info(&slot))
    }

    /// The caller's live sessions.
    pub fn list(&self, owner: Option<&str>) -> Vec<SessionInfo> {
        let slots: Vec<Arc<Slot>> = lock(&self.table)
            .slots
            .values()
            .filter(|s| s.owner.as_deref() == owner)
            .cloned()
            .collect();
        let mut out: Vec<SessionInfo> = slots.iter().map(|s| self.info(s)).collect();
        out.sort_by(|a, b| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        out
    }

    /// Every live session with its owner and its last use, for the operator's console
    /// (`GET /v1/admin/overview`), oldest first.
    pub fn list_all(&self) -> Vec<OwnedSession> {
        let slots: Vec<Arc<Slot>> = lock(&self.table).slots.values().cloned().collect();
        let mut out: Vec<OwnedSession> = slots
            .iter()
            .map(|s| {
                let idle = lock(&s.state).last_used.elapsed();
                OwnedSession {
                    owner: s.owner.clone(),
                    last_used_at: rfc3339(
                        SystemTime::now()
                            .checked_sub(idle)
                            .unwrap_or(SystemTime::UNIX_EPOCH),
                    ),
                    info: self.info(s),
                }
            })
            .collect();
        out.sort_by(|a, b| {
            (a.info.created_at.as_str(), a.info.id.as_str())
                .cmp(&(b.info.created_at.as_str(), b.info.id.as_str()))
        });
        out
    }

    fn info(&self, slot: &Slot) -> SessionInfo {
        let st = lock(&slot.state);
        let idle_end = st.last_used + st.idle_ttl(&self.policy);
        let life_end = slot.created + self.policy.max_lifetime;
        let end = idle_end.min(life_end);
        let expires = SystemTime::now() + end.saturating_duration_since(Instant::now());
        SessionInfo {
            id: slot.id.clone(),
            language: slot.settings.language.name().to_string(),
            created_at: rfc3339(slot.created_at),
            expires_at: rfc3339(expires),
            ttl: st.ttl.as_secs_f64(),
            execution_count: st.executions,
            busy: st.running.is_some(),
            state: match st.paused_at {
                Some(_) => SessionState::Paused,
                None => SessionState::Running,
            },
            paused_at: st.paused_at.map(rfc3339),
            limits: st.limits,
            network: slot.settings.network.clone(),
            packages: slot.settings.packages.clone(),
        }
    }

    /// Run `op` on the session, taken out of its slot for the while (`session_busy` while
    /// another operation has it) and put back after.
    fn with_session<T>(
        &self,
        owner: Option<&str>,
        id: &str,
        cancel: Option<&KillSwitch>,
        op: impl FnOnce(&mut Session, &Engine) -> T,
    ) -> Result<T, RunError> {
        let (slot, mut session) = self.checkout(owner, id, cancel)?;
        let r = op(&mut session, &self.engine);
        self.checkin(&slot, session);
        Ok(r)
    }

    /// Take the session out of its slot for an operation (`session_busy` while another runs).
    fn checkout(
        &self,
        owner: Option<&str>,
        id: &str,
        cancel: Option<&KillSwitch>,
    ) -> Result<(Arc<Slot>, Session), RunError> {
        let slot = self.find(owner, id)?;
        let mut st = lock(&slot.state);
        if st.closed {
            return Err(not_found(id));
        }
        let Some(mut session) = st.session.take() else {
            return Err(busy());
        };
        // A call or file operation on a paused session resumes it first (as E2B's connect).
        if st.paused_at.take().is_some() {
            if let Some(sb) = session.sandbox.as_mut() {
                sb.thaw();
            }
            lock(&self.stats).resumed += 1;
            tracing::info!(session = %slot.id, "session resumed by a call");
        }
        st.running = Some(match cancel {
            Some(k) => k.clone(),
            None => KillSwitch::new().map_err(|_| busy())?,
        });
        drop(st);
        Ok((slot, session))
    }

    /// Put the session back after an operation (or close it, if it ended meanwhile).
    fn checkin(&self, slot: &Slot, session: Session) {
        let mut st = lock(&slot.state);
        st.running = None;
        st.last_used = Instant::now();
        st.executions = session.execution_count();
        if st.closed {
            drop(st);
            session.close();
        } else {
            st.session = Some(session);
        }
    }

    /// What a fork of a session copies (its workspace and, for Python, its interpreter's
    /// globals): the new session's creation request, and what could not be copied. Blocking;
    /// `session_busy` while a call runs; a paused session is resumed first.
    pub fn fork_source(&self, owner: Option<&str>, id: &str) -> Result<ForkSource, RunError> {
        let settings = self.settings(owner, id)?;
        self.with_session(owner, id, None, |s, engine| {
            s.fork_source(engine, &settings)
        })?
    }

    /// Load a fork's copied state into the new session `id` (Python), and count the fork.
    pub fn finish_fork(
        &self,
        owner: Option<&str>,
        id: &str,
        has_state: bool,
    ) -> Result<(), RunError> {
        if has_state {
            self.with_session(owner, id, None, |s, engine| s.load_fork_state(engine))??;
        }
        lock(&self.stats).forked += 1;
        Ok(())
    }

    /// Pause a session: its sandbox's processes are frozen (the cgroup freezer), its memory
    /// kept, and it uses no CPU until it is resumed ([`Sessions::resume`], or any call or
    /// file operation). While paused, the policy's `paused_ttl` replaces its idle TTL.
    /// `conflict` if it is paused already, `session_busy` while a call runs.
    pub fn pause(&self, owner: Option<&str>, id: &str) -> Result<SessionInfo, RunError> {
        let slot = self.find(owner, id)?;
        {
            let mut st = lock(&slot.state);
            if st.closed {
                return Err(not_found(id));
            }
            if st.paused_at.is_some() {
                return Err(RunError::new(
                    ErrorKind::Conflict,
                    format!("Session {id} is paused already; resume it first."),
                ));
            }
            let Some(session) = st.session.as_mut() else {
                return Err(busy());
            };
            // Frozen under the slot's lock: no call can take the session meanwhile.
            let frozen = session.sandbox.as_mut().is_some_and(|sb| sb.freeze());
            if !frozen {
                if let Some(sb) = session.sandbox.as_mut() {
                    sb.thaw();
                }
                return Err(RunError::new(
                    ErrorKind::Conflict,
                    "This session cannot be paused: its sandbox has no cgroup freezer on this                      host (cgroup v1 without the freezer controller, or cgroup v2 before Linux                      5.2; see `runcell doctor`).",
                ));
            }
            st.paused_at = Some(SystemTime::now());
            st.last_used = Instant::now();
        }
        lock(&self.stats).paused += 1;
        Ok(self.info(&slot))
    }

    /// Resume a paused session (its processes thawed; its idle TTL counts from now). A
    /// session that runs already is left as it is ([`Resumed::AlreadyRunning`]).
    pub fn resume(
        &self,
        owner: Option<&str>,
        id: &str,
    ) -> Result<(SessionInfo, Resumed), RunError> {
        let slot = self.find(owner, id)?;
        let resumed = {
            let mut st = lock(&slot.state);
            if st.closed {
                return Err(not_found(id));
            }
            if st.paused_at.take().is_some() {
                // A paused session is never checked out (a checkout resumes it), so it is here.
                if let Some(sb) = st.session.as_mut().and_then(|s| s.sandbox.as_mut()) {
                    sb.thaw();
                }
                st.last_used = Instant::now();
                Resumed::Thawed
            } else {
                Resumed::AlreadyRunning
            }
        };
        if resumed == Resumed::Thawed {
            lock(&self.stats).resumed += 1;
        }
        Ok((self.info(&slot), resumed))
    }

    /// Whether the session exists for `owner` and is free now (a file upload checks this
    /// before it reads its body).
    pub fn check_idle(&self, owner: Option<&str>, id: &str) -> Result<(), RunError> {
        let slot = self.find(owner, id)?;
        let st = lock(&slot.state);
        if st.closed {
            return Err(not_found(id));
        }
        if st.session.is_none() {
            return Err(busy());
        }
        Ok(())
    }

    /// Run one call, validated against the session's settings. Blocking. The verdict carries
    /// `session_id`.
    pub fn execute(
        &self,
        owner: Option<&str>,
        id: &str,
        call: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Result<Verdict, RunError> {
        let mut verdict = self.with_session(owner, id, cancel, |s, engine| {
            s.execute(engine, call, sink, cancel)
        })?;
        verdict.session_id = Some(id.to_owned());
        Ok(verdict)
    }

    /// The files of a session's /workspace.
    pub fn list_files(&self, owner: Option<&str>, id: &str) -> Result<WorkspaceListing, RunError> {
        self.with_session(owner, id, None, |s, engine| s.list_files(engine))?
    }

    /// One file of a session's /workspace (`Ok(None)`: no such file).
    pub fn read_file(
        &self,
        owner: Option<&str>,
        id: &str,
        path: &str,
    ) -> Result<Option<Vec<u8>>, RunError> {
        self.with_session(owner, id, None, |s, engine| s.read_file(engine, path))?
    }

    /// Write one file into a session's /workspace.
    pub fn write_file(
        &self,
        owner: Option<&str>,
        id: &str,
        path: &str,
        data: Vec<u8>,
    ) -> Result<(), RunError> {
        self.with_session(owner, id, None, |s, engine| {
            s.write_file(engine, path, data)
        })?
    }

    /// End a session now (a running call is killed first). Blocking (the sandbox is torn down
    /// before this returns, unless a call still holds it: then when that call returns).
    pub fn delete(&self, owner: Option<&str>, id: &str) -> Result<(), RunError> {
        let slot = self.find(owner, id)?;
        lock(&self.table).slots.remove(&slot.id);
        lock(&self.stats).deleted += 1;
        end(&slot);
        Ok(())
    }

    /// End every session (server shutdown); new ones are refused from now on.
    pub fn close_all(&self) {
        let slots: Vec<Arc<Slot>> = {
            let mut t = lock(&self.table);
            t.shutting_down = true;
            t.slots.drain().map(|(_, s)| s).collect()
        };
        for slot in slots {
            end(&slot);
        }
    }

    /// End the sessions that expired (idle past their TTL, or past the maximum lifetime).
    fn reap(&self) {
        let now = Instant::now();
        let expired: Vec<Arc<Slot>> = {
            let mut t = lock(&self.table);
            let ids: Vec<String> = t
                .slots
                .values()
                .filter(|s| {
                    let st = lock(&s.state);
                    let idle =
                        st.running.is_none() && now >= st.last_used + st.idle_ttl(&self.policy);
                    let old = now >= s.created + self.policy.max_lifetime;
                    idle || old
                })
                .map(|s| s.id.clone())
                .collect();
            ids.iter().filter_map(|id| t.slots.remove(id)).collect()
        };
        if expired.is_empty() {
            return;
        }
        lock(&self.stats).expired += expired.len() as u64;
        for slot in expired {
            tracing::info!(session = %slot.id, "session expired");
            end(&slot);
        }
    }
}

impl Drop for Sessions {
    fn drop(&mut self) {
        self.close_all();
    }
}

/// Close a slot's session, or have its running call close it when it returns.
fn end(slot: &Slot) {
    let mut st = lock(&slot.state);
    st.closed = true;
    if let Some(k) = &st.running {
        k.trigger();
    }
    let mut session = st.session.take();
    // A paused session is thawed first: its teardown talks to its pid 1.
    if st.paused_at.take().is_some() {
        if let Some(sb) = session.as_mut().and_then(|s| s.sandbox.as_mut()) {
            sb.thaw();
        }
    }
    drop(st);
    if let Some(s) = session {
        s.close();
    }
}

fn reaper(sessions: Weak<Sessions>) {
    loop {
        std::thread::sleep(REAP_EVERY);
        let Some(s) = sessions.upgrade() else { return };
        s.reap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_runtimes::Language;

    fn slot(owner: Option<&str>, holds: u64) -> Arc<Slot> {
        Arc::new(Slot {
            id: SessionIds::local().mint(),
            settings: SessionSettings {
                language: Language::Python,
                overrides: LimitOverrides::default(),
                network: Vec::new(),
                packages: Vec::new(),
            },
            owner: owner.map(str::to_string),
            created: Instant::now(),
            created_at: SystemTime::now(),
            holds,
            _memory: None,
            state: Mutex::new(SlotState {
                session: None,
                last_used: Instant::now(),
                running: None,
                closed: false,
                executions: 0,
                limits: Limits::DEFAULT,
                ttl: Duration::from_secs(60),
                paused_at: None,
            }),
        })
    }

    #[test]
    fn holdings_count_the_owner_and_the_other_keys() {
        let mut t = Table::default();
        for (owner, holds) in [(Some("a"), 10), (Some("a"), 5), (Some("b"), 7), (None, 1)] {
            let s = slot(owner, holds);
            t.slots.insert(s.id.clone(), s);
        }
        let h = t.holdings(Some("a"));
        assert_eq!((h.total, h.owner, h.others), (23, 15, 2));
        let h = t.holdings(Some("c"));
        assert_eq!((h.owner, h.others), (0, 3));
    }
}
