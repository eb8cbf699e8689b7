//! Which interpreters are forked from a template, and the templates' lives (the mechanism is
//! runcell-jail's `template`; docs/isolation.md, "Templates").
//!
//! One template per (Python, environment, preloads): the pool's refills, sessions, and
//! one-shot runs that find no warm sandbox all fork theirs from it. A run or session with an
//! environment, packages or network of its own starts its interpreter itself, and so does any
//! interpreter whose fork fails (counted, and the template retired).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runcell_jail::{Outcome, Program, Sandbox, SandboxError, Template, TemplateSpec};
use runcell_runtimes::Language;

/// A template is replaced after this long, or this many forks: what one fork could learn of
/// another through the template's shared state (its hash seed) is bounded in time and count.
const MAX_AGE: Duration = Duration::from_secs(600);
const MAX_FORKS: u64 = 1000;
/// How long a template may take to start and import its preloads.
const START_TIMEOUT: Duration = Duration::from_secs(120);
/// After a template failed to start, interpreters start the usual way this long.
const RETRY_AFTER: Duration = Duration::from_secs(30);
/// A fork passes through three processes in the sandbox's cgroup (C, G, H: docs/isolation.md,
/// F2-F6) besides its pid 1: a run whose process limit is smaller (`pids` below 3, a process
/// rlimit of pids + 2) starts its interpreter the usual way.
const MIN_PROCESSES: u64 = 5;

/// Templates alive at once, at most.
const MAX_LIVE: usize = 8;

/// Counters for `/metrics` and `doctor`.
#[derive(Debug, Default)]
pub struct TemplateStats {
    pub starts: AtomicU64,
    pub start_failures: AtomicU64,
    pub start_ns: AtomicU64,
    pub forks_ok: AtomicU64,
    pub forks_failed: AtomicU64,
    pub fork_ns: AtomicU64,
}

/// A snapshot of the templates, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplatesNow {
    /// Alive and serving forks.
    pub live: u64,
    /// Waiting to be tried again after a failure.
    pub failed: u64,
}

/// The templates' figures for `/metrics` (Python's: the one language with templates).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TemplatesReport {
    pub now: TemplatesNow,
    pub starts: u64,
    pub start_failures: u64,
    pub start_seconds: f64,
    pub forks_ok: u64,
    pub forks_failed: u64,
    /// Seconds spent in forks that succeeded (over `forks_ok`: the mean fork time).
    pub fork_seconds: f64,
}

#[derive(Default)]
struct Slot {
    template: Option<Template>,
    retry_after: Option<Instant>,
}

/// The templates of an engine (shared by its clones, its pool and its sessions).
pub struct Templates {
    enabled: bool,
    helper_exe: PathBuf,
    slots: Mutex<HashMap<TemplateSpec, Arc<Mutex<Slot>>>>,
    libraries: Mutex<HashMap<PathBuf, Option<PathBuf>>>,
    /// Shut down ([`Templates::shutdown`]): no template starts any more.
    closed: std::sync::atomic::AtomicBool,
    pub stats: TemplateStats,
}

impl std::fmt::Debug for Templates {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Templates")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

impl Templates {
    pub fn new(enabled: bool, helper_exe: &Path) -> Templates {
        Templates {
            enabled,
            helper_exe: helper_exe.to_path_buf(),
            slots: Mutex::default(),
            libraries: Mutex::default(),
            closed: Default::default(),
            stats: TemplateStats::default(),
        }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Whether this host can fork interpreters at all, and why not: root with a pool of ids
    /// (each sandbox its own host uid: a template takes it), seccomp, and the runtime
    /// Python's shared library.
    pub fn available(python: &Path) -> Result<PathBuf, String> {
        let shape = runcell_jail::Shape::current();
        if shape.identity != runcell_jail::Identity::HostRoot {
            return Err("templates need runcell to run as root on the host".into());
        }
        if !shape.powers.switch_ids || shape.pool.is_none() {
            return Err("templates need a pool of host ids for the sandboxes".into());
        }
        runcell_jail::find_libpython(python).map_err(|e| crate::error::chain(&e))
    }

    /// Start `program`'s interpreter (a warm one: `[python, "-c", runner, ...]`) in `sandbox`:
    /// forked from the template of its Python, environment and `preload` when templates are on
    /// and one can be had, otherwise the usual way. As [`Sandbox::start_interpreter`].
    pub fn start_interpreter(
        &self,
        sandbox: &mut Sandbox,
        program: &Program,
        language: Language,
        preload: &[String],
    ) -> Result<Option<Outcome>, SandboxError> {
        if language == Language::Python && self.enabled {
            match self.try_fork(sandbox, program, preload) {
                Some(Ok(r)) => return Ok(r),
                Some(Err(e)) => {
                    tracing::warn!(error = %crate::error::chain(&e), "an interpreter could not be forked from its template; starting it the usual way");
                    if !sandbox.is_ready() {
                        return Err(e);
                    }
                }
                None => {}
            }
        }
        sandbox.start_interpreter(program, &mut runcell_jail::NoSink)
    }

    /// Fork `program`'s interpreter into `sandbox` and nothing else: `None` when there is no
    /// template to fork from (templates off, none for this Python, or one failed lately).
    pub fn start_interpreter_forked_only(
        &self,
        sandbox: &mut Sandbox,
        program: &Program,
        preload: &[String],
    ) -> Option<Result<Option<Outcome>, SandboxError>> {
        if !self.enabled {
            return None;
        }
        self.try_fork(sandbox, program, preload)
    }

    fn library(&self, python: &Path) -> Option<PathBuf> {
        let mut cache = self.libraries.lock().unwrap_or_else(|e| e.into_inner());
        cache
            .entry(python.to_path_buf())
            .or_insert_with(|| match Templates::available(python) {
                Ok(l) => Some(l),
                Err(why) => {
                    tracing::info!(python = %python.display(), why, "no templates for this Python");
                    None
                }
            })
            .clone()
    }

    fn slot(&self, spec: &TemplateSpec) -> Option<Arc<Mutex<Slot>>> {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(s) = slots.get(spec) {
            return Some(s.clone());
        }
        if slots.len() >= MAX_LIVE {
            // Forget slots with nothing alive to make room; none: no template for this one.
            slots.retain(|_, s| {
                s.try_lock()
                    .map(|s| s.template.is_some() || s.retry_after.is_some())
                    .unwrap_or(true)
            });
            if slots.len() >= MAX_LIVE {
                return None;
            }
        }
        Some(slots.entry(spec.clone()).or_default().clone())
    }

    fn try_fork(
        &self,
        sandbox: &mut Sandbox,
        program: &Program,
        preload: &[String],
    ) -> Option<Result<Option<Outcome>, SandboxError>> {
        if program.argv.get(1).map(String::as_str) != Some("-c")
            || self.closed.load(Ordering::SeqCst)
            || program.rlimits.processes < MIN_PROCESSES
        {
            return None;
        }
        let python = PathBuf::from(program.argv.first()?);
        let library = self.library(&python)?;
        let spec = TemplateSpec {
            program: python,
            library,
            env: program.env.clone(),
            preload: preload.to_vec(),
        };
        let slot = self.slot(&spec)?;
        let mut slot = slot.lock().unwrap_or_else(|e| e.into_inner());
        if self.closed.load(Ordering::SeqCst) {
            slot.template = None;
            return None;
        }
        if let Some(t) = slot.template.as_mut() {
            if t.age() > MAX_AGE || t.forks() >= MAX_FORKS || !t.is_healthy() {
                slot.template = None;
            }
        }
        if slot.template.is_none() {
            if slot.retry_after.is_some_and(|t| Instant::now() < t) {
                return None;
            }
            let started = Instant::now();
            match Template::start(&spec, &self.helper_exe, START_TIMEOUT) {
                Ok(t) => {
                    self.stats.starts.fetch_add(1, Ordering::Relaxed);
                    self.stats
                        .start_ns
                        .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
                    slot.retry_after = None;
                    slot.template = Some(t);
                }
                Err(e) => {
                    self.stats.start_failures.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(error = %crate::error::chain(&e), "a template could not start; interpreters start the usual way for now");
                    slot.retry_after = Some(Instant::now() + RETRY_AFTER);
                    return None;
                }
            }
        }
        let template = slot.template.as_mut()?;
        let started = Instant::now();
        let r = sandbox.start_interpreter_forked(template, program, &mut runcell_jail::NoSink);
        match &r {
            Ok(_) => {
                self.stats.forks_ok.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .fork_ns
                    .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
            }
            Err(e) => {
                self.stats.forks_failed.fetch_add(1, Ordering::Relaxed);
                // A template that failed a fork is not trusted with the next one: the next
                // fork starts a new one (only a template that fails to start waits RETRY_AFTER).
                tracing::warn!(error = %crate::error::chain(e), forks = template.forks(), "a fork from a template failed; the template is retired");
                slot.template = None;
            }
        }
        Some(r)
    }

    /// Stop every template (their cgroups removed); later interpreters start the usual way.
    pub fn shutdown(&self) {
        let slots: Vec<_> = {
            let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
            slots.drain().map(|(_, s)| s).collect()
        };
        self.closed.store(true, Ordering::SeqCst);
        for s in slots {
            s.lock().unwrap_or_else(|e| e.into_inner()).template = None;
        }
    }

    /// Every figure, read now.
    pub fn report(&self) -> TemplatesReport {
        let secs = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 / 1e9;
        TemplatesReport {
            now: self.now(),
            starts: self.stats.starts.load(Ordering::Relaxed),
            start_failures: self.stats.start_failures.load(Ordering::Relaxed),
            start_seconds: secs(&self.stats.start_ns),
            forks_ok: self.stats.forks_ok.load(Ordering::Relaxed),
            forks_failed: self.stats.forks_failed.load(Ordering::Relaxed),
            fork_seconds: secs(&self.stats.fork_ns),
        }
    }

    /// How many templates are alive, and how many wait to be retried.
    pub fn now(&self) -> TemplatesNow {
        let slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let mut now = TemplatesNow::default();
        for s in slots.values() {
            // A slot in use is forking: it has a live template.
            match s.try_lock() {
                Ok(s) if s.template.is_some() => now.live += 1,
                Ok(s) if s.retry_after.is_some() => now.failed += 1,
                Ok(_) => {}
                Err(_) => now.live += 1,
            }
        }
        now
    }
}
