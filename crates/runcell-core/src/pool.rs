//! Warm sandboxes: built before the request that uses them arrives.
//!
//! A pool keeps, per language, a few sandboxes whose isolation is complete (namespaces, root,
//! cgroup with its limits, seccomp policy loaded: step P17 of `docs/isolation.md`) and whose
//! pid 1 waits for its first program. A one-shot request takes one, runs in it exactly as in
//! a sandbox built for it, and the sandbox is destroyed afterwards; a background thread builds
//! the next one. A warm sandbox has never served another request, so nothing of one run can
//! be seen by the next.
//!
//! **Which requests a warm sandbox fits.** What a sandbox is built with — the memory, process,
//! CPU, disk and I/O limits — is fixed when it is built; the rest (timeouts, output caps,
//! open files, output files) applies per program. The pool builds each language's sandboxes
//! with the policy's default limits, and a request whose sandbox-level limits
//! ([`SandboxKey`]) are exactly those takes a warm one; any other request is built cold, as
//! without a pool (a miss in the metrics). The verdict is the same either way.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use runcell_jail::Sandbox;
use runcell_runtimes::Language;

use crate::limits::{Limit, Limits, Scope};

/// What a sandbox is built with: requests equal in this get identical sandboxes. Derived from
/// the limits table: every limit of [`Scope::Sandbox`] (its cgroup, its disk, the warm
/// interpreter's rlimits), so that a limit added there is part of the key by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SandboxKey {
    pub language: Language,
    /// The raw value of each limit of [`Limit::ALL`] that is [`Scope::Sandbox`]; zero for the
    /// others (which never differ between keys).
    values: [u64; MAX_LIMITS],
}

/// Room for every limit of the table (checked by a test).
const MAX_LIMITS: usize = 16;

impl SandboxKey {
    /// `base` with this key's sandbox-level limits.
    pub fn apply(&self, base: Limits) -> Limits {
        let mut l = base;
        for (i, &limit) in Limit::ALL.iter().enumerate() {
            if limit.scope() == Scope::Sandbox {
                l.set(limit, self.values[i]);
            }
        }
        l
    }

    pub fn new(language: Language, l: &Limits) -> SandboxKey {
        let mut values = [0; MAX_LIMITS];
        for (i, &limit) in Limit::ALL.iter().enumerate() {
            if limit.scope() == Scope::Sandbox {
                values[i] = l.get(limit);
            }
        }
        SandboxKey { language, values }
    }
}

/// Modules a language's warm interpreters import before they are ready (Python:
/// `numpy`, `pandas`, ...), so that the request's own `import` finds them loaded.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preload(pub BTreeMap<Language, Vec<String>>);

impl Preload {
    /// Set one language's list from `LANG=MOD,MOD` (`python=numpy,pandas`); later calls for the
    /// same language add to it.
    pub fn set_text(&mut self, entry: &str) -> Result<(), String> {
        let (lang, mods) = entry.split_once('=').ok_or_else(|| {
            format!("preload entry {entry:?}: expected LANG=MODULE[,MODULE...], e.g. python=numpy,pandas")
        })?;
        let language = Language::parse(lang.trim()).ok_or_else(|| {
            format!(
                "preload entry {entry:?}: unknown language {:?}",
                lang.trim()
            )
        })?;
        let modules = mods.split(',').map(str::trim).filter(|m| !m.is_empty());
        self.add(language, modules)
    }

    pub fn add<'a>(
        &mut self,
        language: Language,
        modules: impl IntoIterator<Item = &'a str>,
    ) -> Result<(), String> {
        if language != Language::Python {
            return Err(format!(
                "preloading is for Python only (its warm interpreter imports the modules), not {}",
                language.name()
            ));
        }
        let list = self.0.entry(language).or_default();
        for m in modules {
            if !runcell_runtimes::is_module_name(m) {
                return Err(format!("preload: {m:?} is not a Python module name"));
            }
            if !list.iter().any(|x| x == m) {
                list.push(m.to_string());
            }
        }
        Ok(())
    }

    pub fn of(&self, language: Language) -> &[String] {
        self.0.get(&language).map_or(&[], Vec::as_slice)
    }
}

/// What one idle warm sandbox is counted to hold in the memory ledger: its interpreter's
/// working set. Measured: about 2 MiB for a bare Python interpreter and 71 MiB with numpy,
/// pandas and matplotlib preloaded (docs/serve.md, "The host's own reserve"); counted with room to spare.
pub const WARM_BARE_BYTES: u64 = 16 << 20;
pub const WARM_PRELOADED_BYTES: u64 = 128 << 20;

/// What the warm pool of `sizes` holds while idle, with `preload`'s modules imported.
pub fn warm_reserve_bytes(sizes: &PoolSizes, preload: &Preload) -> u64 {
    sizes
        .0
        .iter()
        .map(|(&language, &n)| {
            let each = if preload.of(language).is_empty() {
                WARM_BARE_BYTES
            } else {
                WARM_PRELOADED_BYTES
            };
            each.saturating_mul(n as u64)
        })
        .sum()
}

/// How many warm sandboxes to keep per language.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSizes(pub BTreeMap<Language, usize>);

/// The most warm sandboxes of one language.
pub const MAX_POOL_SIZE: usize = 64;

impl PoolSizes {
    /// The default: a small Python pool (Python is what agents run most), one warm sandbox
    /// per two cores, at least one and at most four, never more than the sandboxes allowed
    /// at once.
    pub fn default_for(cpus: u64, max_concurrent: usize) -> PoolSizes {
        let n = ((cpus / 2).clamp(1, 4) as usize).min(max_concurrent);
        PoolSizes(BTreeMap::from([(Language::Python, n)]))
    }

    /// Set one entry from `LANG=N` (`python=2`; `N` = 0 turns that language's pool off).
    pub fn set_text(&mut self, entry: &str) -> Result<(), String> {
        let (lang, n) = entry
            .split_once('=')
            .ok_or_else(|| format!("pool entry {entry:?}: expected LANG=N, e.g. python=2"))?;
        let language = Language::parse(lang.trim())
            .ok_or_else(|| format!("pool entry {entry:?}: unknown language {:?}", lang.trim()))?;
        let n: usize = n
            .trim()
            .parse()
            .map_err(|_| format!("pool entry {entry:?}: {:?} is not a count", n.trim()))?;
        self.set(language, n)
    }

    pub fn set(&mut self, language: Language, n: usize) -> Result<(), String> {
        if n > MAX_POOL_SIZE {
            return Err(format!(
                "pool size for {} must be at most {MAX_POOL_SIZE}, not {n}",
                language.name()
            ));
        }
        self.0.insert(language, n);
        Ok(())
    }

    /// Set every entry of a comma-separated list (`python=2,node=1`, as in `RUNCELL_POOL`).
    pub fn set_list(&mut self, list: &str) -> Result<(), String> {
        list.split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .try_for_each(|e| self.set_text(e))
    }

    pub fn total(&self) -> usize {
        self.0.values().sum()
    }
}

/// Figures of one language's pool, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PoolStats {
    pub language: Option<Language>,
    /// Warm sandboxes wanted.
    pub target: usize,
    /// Warm sandboxes ready now.
    pub ready: usize,
    /// Requests that took a warm sandbox.
    pub hits: u64,
    /// Requests of this language that were built cold: limits other than the pool's, or the
    /// pool was empty.
    pub misses: u64,
    /// Sandboxes built for the pool, and the seconds that took in all.
    pub refills: u64,
    pub refill_seconds: f64,
    /// Builds that failed (the pool retries with a growing pause).
    pub refill_failures: u64,
}

/// A sandbox built ahead, with its language's warm interpreter started in it when the
/// language has one.
pub struct Warm {
    pub sandbox: Sandbox,
    /// A warm interpreter waits for one cell (`Sandbox::run_cell`); otherwise the sandbox
    /// waits for a program (`Sandbox::run`).
    pub interpreter: bool,
    /// When it was built (set by the pool).
    pub built: Instant,
}

/// Builds one warm sandbox of a key; the error is a message for the log.
pub type Builder = dyn Fn(&SandboxKey) -> Result<Warm, String> + Send + Sync;

struct Slot {
    key: SandboxKey,
    target: usize,
    ready: Vec<Warm>,
    building: usize,
    hits: u64,
    misses: u64,
    refills: u64,
    refill_seconds: f64,
    refill_failures: u64,
    /// No new build before this (after failures).
    retry_at: Option<Instant>,
    backoff: Duration,
}

struct Shared {
    slots: Mutex<Vec<Slot>>,
    wake: Condvar,
    stop: AtomicBool,
    /// Misses of languages that have no pool (counted for the metrics all the same).
    unpooled_misses: Mutex<BTreeMap<Language, u64>>,
}

/// The warm pool. Dropping it stops the refill thread, destroys every warm sandbox, and waits
/// for the sandboxes given to [`Pool::dispose`] to be torn down.
pub struct Pool {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
    /// Sandboxes whose run is over, torn down off the request's path (a bounded queue: past
    /// it, the caller tears down itself, so finished sandboxes never pile up).
    disposal: Option<std::sync::mpsc::SyncSender<(Sandbox, Held)>>,
    disposer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("stats", &self.stats())
            .finish()
    }
}

/// What a finished run holds until its sandbox is torn down (its admission slot and its
/// memory on the ledger): dropped only after the sandbox's teardown, so that the next run
/// is not admitted beside a sandbox that still holds its processes, memory and cgroup.
pub type Held = Box<dyn Send>;

/// Finished sandboxes waiting for the teardown thread at most.
const TEARDOWN_QUEUE: usize = 4;
/// A warm sandbox older than this is replaced rather than used: its overlays of the host's
/// directories and its copy of `ld.so.cache` should not outlive a package upgrade by long.
const MAX_AGE: Duration = Duration::from_secs(600);

const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// How long after a take its replacement starts to be built.
const REFILL_DELAY: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

impl Pool {
    /// Start filling: one slot per `(key, size)`; `build` makes a sandbox for a key.
    pub fn start(slots: Vec<(SandboxKey, usize)>, build: Box<Builder>) -> Pool {
        let shared = Arc::new(Shared {
            slots: Mutex::new(
                slots
                    .into_iter()
                    .filter(|(_, n)| *n > 0)
                    .map(|(key, target)| Slot {
                        key,
                        target,
                        ready: Vec::new(),
                        building: 0,
                        hits: 0,
                        misses: 0,
                        refills: 0,
                        refill_seconds: 0.0,
                        refill_failures: 0,
                        retry_at: None,
                        backoff: FIRST_BACKOFF,
                    })
                    .collect(),
            ),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            unpooled_misses: Mutex::new(BTreeMap::new()),
        });
        let s = shared.clone();
        let span = tracing::Span::current();
        let thread = std::thread::Builder::new()
            .name("runcell-pool".into())
            .spawn(move || {
                let _g = span.enter();
                refill_loop(&s, &*build)
            })
            .ok();
        if thread.is_none() {
            tracing::warn!("could not start the warm pool's thread: every run starts cold");
        }
        let (disposal, rx) = std::sync::mpsc::sync_channel::<(Sandbox, Held)>(TEARDOWN_QUEUE);
        let span = tracing::Span::current();
        let disposer = std::thread::Builder::new()
            .name("runcell-teardown".into())
            .spawn(move || {
                let _g = span.enter();
                for (sandbox, held) in rx {
                    if let Err(e) = sandbox.destroy() {
                        tracing::warn!(error = %crate::error::chain(&e), "sandbox teardown failed");
                    }
                    // Only now is the run's slot given back.
                    drop(held);
                }
            })
            .ok();
        Pool {
            shared,
            thread,
            disposal: disposer.is_some().then_some(disposal),
            disposer,
        }
    }

    /// Tear down a sandbox whose run is over (every process of the run already killed and
    /// reaped by its pid 1) on the pool's teardown thread, so that the verdict need not wait
    /// for pid 1's exit and the cgroup's removal; `held` is dropped once it is torn down.
    /// Gives both back when there is no such thread: the caller destroys the sandbox, then
    /// drops `held`.
    #[must_use]
    pub fn dispose(&self, sandbox: Sandbox, held: Held) -> Option<(Sandbox, Held)> {
        match &self.disposal {
            Some(tx) => match tx.try_send((sandbox, held)) {
                Ok(()) => None,
                Err(
                    std::sync::mpsc::TrySendError::Full(s)
                    | std::sync::mpsc::TrySendError::Disconnected(s),
                ) => Some(s),
            },
            None => Some((sandbox, held)),
        }
    }

    /// A warm sandbox for `key`, if one is ready; counts a hit or a miss either way.
    pub fn take(&self, key: &SandboxKey) -> Option<Warm> {
        let mut slots = lock(&self.shared.slots);
        let Some(slot) = slots.iter_mut().find(|s| s.key == *key) else {
            let same_language = slots.iter_mut().find(|s| s.key.language == key.language);
            match same_language {
                Some(slot) => slot.misses += 1,
                None => {
                    drop(slots);
                    *lock(&self.shared.unpooled_misses)
                        .entry(key.language)
                        .or_default() += 1;
                }
            }
            return None;
        };
        // A sandbox whose pid 1 died while it waited (killed from outside, its interpreter
        // gone), or that is too old, is thrown away (torn down after the lock is released).
        let mut discarded = Vec::new();
        let mut found = None;
        while let Some(mut warm) = slot.ready.pop() {
            if warm.built.elapsed() < MAX_AGE && warm.sandbox.is_ready() {
                found = Some(warm);
                break;
            }
            discarded.push(warm);
        }
        if found.is_some() {
            slot.hits += 1;
        } else {
            slot.misses += 1;
        }
        // The replacement is built a moment later, not while this request runs: building a
        // sandbox takes locks the request's own steps need (on cgroup v1 the move into a
        // cgroup waits for an RCU grace period and holds up forks and exits meanwhile), and
        // a small request is over by then.
        if slot.retry_at.is_none() {
            slot.retry_at = Some(Instant::now() + REFILL_DELAY);
        }
        self.shared.wake.notify_all();
        drop(slots);
        for warm in discarded {
            tracing::debug!("a warm sandbox died or aged while it waited; discarded");
            if let Some(s) = self.dispose(warm.sandbox, Box::new(())) {
                drop(s);
            }
        }
        found
    }

    /// The figures of every language with a pool or a miss.
    pub fn stats(&self) -> Vec<PoolStats> {
        let slots = lock(&self.shared.slots);
        let mut by_language: BTreeMap<Language, PoolStats> = BTreeMap::new();
        for s in slots.iter() {
            let e = by_language.entry(s.key.language).or_default();
            e.language = Some(s.key.language);
            e.target += s.target;
            e.ready += s.ready.len();
            e.hits += s.hits;
            e.misses += s.misses;
            e.refills += s.refills;
            e.refill_seconds += s.refill_seconds;
            e.refill_failures += s.refill_failures;
        }
        drop(slots);
        for (&language, &n) in lock(&self.shared.unpooled_misses).iter() {
            let e = by_language.entry(language).or_default();
            e.language = Some(language);
            e.misses += n;
        }
        by_language.into_values().collect()
    }

    /// Wait until every slot is full or `within` has passed; whether it filled.
    pub fn wait_filled(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        let mut slots = lock(&self.shared.slots);
        loop {
            if slots.iter().all(|s| s.ready.len() >= s.target) {
                return true;
            }
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            slots = self
                .shared
                .wake
                .wait_timeout(slots, deadline - now)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Destroy what is left (dropping a sandbox tears it down and removes its cgroup).
        let ready: Vec<Warm> = lock(&self.shared.slots)
            .iter_mut()
            .flat_map(|s| std::mem::take(&mut s.ready))
            .collect();
        for warm in ready {
            if let Err(e) = warm.sandbox.destroy() {
                tracing::warn!(error = %crate::error::chain(&e), "warm sandbox teardown failed");
            }
        }
        // Let the teardown thread finish what it was given.
        self.disposal = None;
        if let Some(t) = self.disposer.take() {
            let _ = t.join();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Build, one at a time, for the slot that lacks the most; sleep when all are full.
fn refill_loop(shared: &Shared, build: &Builder) {
    let mut slots = lock(&shared.slots);
    loop {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let now = Instant::now();
        let next = slots
            .iter()
            .enumerate()
            .filter(|(_, s)| s.ready.len() + s.building < s.target)
            .filter(|(_, s)| s.retry_at.is_none_or(|t| t <= now))
            .max_by_key(|(_, s)| s.target - s.ready.len() - s.building)
            .map(|(i, _)| i);
        let Some(i) = next else {
            // Nothing to build now: sleep until a take, a stop, or the earliest retry.
            let wait = slots
                .iter()
                .filter_map(|s| s.retry_at)
                .min()
                .map_or(Duration::from_secs(60), |t| {
                    t.saturating_duration_since(now)
                });
            slots = shared
                .wake
                .wait_timeout(slots, wait.max(Duration::from_millis(1)))
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
            continue;
        };
        let key = slots[i].key;
        slots[i].building += 1;
        drop(slots);
        let started = Instant::now();
        let built = build(&key);
        let took = started.elapsed();
        slots = lock(&shared.slots);
        let slot = &mut slots[i];
        slot.building -= 1;
        match built {
            Ok(mut warm) => {
                warm.built = Instant::now();
                slot.refills += 1;
                slot.refill_seconds += took.as_secs_f64();
                slot.retry_at = None;
                slot.backoff = FIRST_BACKOFF;
                if shared.stop.load(Ordering::SeqCst) {
                    drop(slots);
                    drop(warm);
                    return;
                }
                slot.ready.push(warm);
                shared.wake.notify_all();
            }
            Err(e) => {
                slot.refill_failures += 1;
                tracing::warn!(
                    language = key.language.name(),
                    error = %e,
                    retry_in_ms = slot.backoff.as_millis() as u64,
                    "could not build a warm sandbox"
                );
                slot.retry_at = Some(Instant::now() + slot.backoff);
                slot.backoff = (slot.backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The warm pool is counted in the memory ledger by what its idle sandboxes hold.
    #[test]
    fn the_warm_reserve_counts_preloaded_sandboxes_more() {
        let mut sizes = PoolSizes::default();
        sizes.set_text("python=2").unwrap();
        sizes.set_text("bash=3").unwrap();
        let bare = Preload::default();
        assert_eq!(warm_reserve_bytes(&sizes, &bare), 5 * WARM_BARE_BYTES);
        let mut preload = Preload::default();
        preload.set_text("python=numpy").unwrap();
        assert_eq!(
            warm_reserve_bytes(&sizes, &preload),
            2 * WARM_PRELOADED_BYTES + 3 * WARM_BARE_BYTES
        );
        assert_eq!(warm_reserve_bytes(&PoolSizes::default(), &preload), 0);
    }

    #[test]
    fn sizes_parse_from_flags_and_lists() {
        let mut p = PoolSizes::default();
        p.set_text("python=2").unwrap();
        p.set_list("node=1, ruby=0,").unwrap();
        assert_eq!(p.0[&Language::Python], 2);
        assert_eq!(p.0[&Language::Node], 1);
        assert_eq!(p.0[&Language::Ruby], 0);
        assert_eq!(p.total(), 3);
        for bad in ["python", "cobol=1", "python=-1", "python=x", "python=65"] {
            assert!(PoolSizes::default().set_text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn preload_takes_python_module_names_only() {
        let mut p = Preload::default();
        p.set_text("python=numpy, pandas,matplotlib.pyplot")
            .unwrap();
        p.set_text("python=numpy,scipy").unwrap();
        assert_eq!(
            p.of(Language::Python),
            ["numpy", "pandas", "matplotlib.pyplot", "scipy"]
        );
        for bad in [
            "python",
            "node=lodash",
            "python=-c",
            "python=os;x",
            "python=a..b",
            "python=1x",
        ] {
            assert!(Preload::default().set_text(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_default_is_a_small_python_pool() {
        assert_eq!(
            PoolSizes::default_for(2, 8).0,
            BTreeMap::from([(Language::Python, 1)])
        );
        assert_eq!(PoolSizes::default_for(64, 8).0[&Language::Python], 4);
        assert_eq!(PoolSizes::default_for(8, 2).0[&Language::Python], 2);
    }

    #[test]
    fn every_sandbox_limit_is_in_the_key() {
        assert!(Limit::ALL.len() <= MAX_LIMITS);
        let base = Limits::DEFAULT;
        let key = SandboxKey::new(Language::Python, &base);
        for &limit in Limit::ALL {
            let mut other = base;
            other.set(limit, base.get(limit) + 1);
            let differs = SandboxKey::new(Language::Python, &other) != key;
            assert_eq!(differs, limit.scope() == Scope::Sandbox, "{limit}");
            // And a key gives back what it was made of.
            assert_eq!(
                SandboxKey::new(Language::Python, &other)
                    .apply(base)
                    .get(limit),
                if limit.scope() == Scope::Sandbox {
                    other.get(limit)
                } else {
                    base.get(limit)
                }
            );
        }
    }

    #[test]
    fn keys_differ_by_sandbox_limits_only() {
        let l = Limits::DEFAULT;
        let a = SandboxKey::new(Language::Python, &l);
        let mut m = l;
        m.timeout = crate::limits::Millis(l.timeout.0 + 1000);
        m.output = crate::limits::Bytes(l.output.0 + 1);
        assert_eq!(
            a,
            SandboxKey::new(Language::Python, &m),
            "per-program limits"
        );
        m.open_files = crate::limits::Count(l.open_files.0 + 1);
        assert_ne!(
            a,
            SandboxKey::new(Language::Python, &m),
            "a warm interpreter's rlimit"
        );
        m = l;
        m.memory = crate::limits::Bytes(l.memory.0 * 2);
        assert_ne!(a, SandboxKey::new(Language::Python, &m));
        assert_ne!(a, SandboxKey::new(Language::Node, &l));
    }
}
