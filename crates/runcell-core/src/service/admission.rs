//! Admission: places in line, the memory of the bodies they carry, and the sandbox slots, each
//! shared fairly between API keys.
//!
//! * A **place in line** ([`Ticket`]) is taken before anything of a request is read: at most
//!   `max_concurrent + max_queue` exist, and one key holds at most its share of them (see
//!   [`crate::session::owner_share`]: everything with one key, half each with two, room for
//!   a newcomer with many). Beyond them, 429.
//! * The **body budget**: the bytes a request holds in the server's memory (its body while it
//!   is read and parsed, a waiting run's request, an agent request's conversation) are taken
//!   from one budget of `places × max_body_bytes`, again shared between keys. A run waiting
//!   for a person's approval gives its place back but keeps its bytes: the memory of waiting
//!   runs is bounded too.
//! * A **slot** is a sandbox running: `max_concurrent` at most. When one frees, it goes to the
//!   waiting request of the key that runs the fewest sandboxes now (the oldest of its
//!   requests), so that no key's runs wait behind another key's queue.
//! * The **memory ledger**: what runcell admits must fit in what its container (or host) may
//!   hold. A one-shot run holds its memory and its disk limits (tmpfs pages are memory) while
//!   it has its slot; a live session holds its own from creation to end ([`MemoryHold`]); the
//!   warm pool's sandboxes were taken off the budget when it was made. A run that does not fit
//!   waits in line for one to end, as for a slot; one that could never fit is refused (503,
//!   naming memory). Those behind a waiting run do not overtake it, unless it cannot fit
//!   beside the live sessions' holds: it would hold every other key's runs back for as long
//!   as a session lives, so it waits without holding anybody back. Without the ledger, runs
//!   sized at `usable / max_concurrent` each and sessions admitted against all of `usable`
//!   could together reach twice the memory, and the container's OOM killer would have to
//!   find the rest.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use crate::error::RunError;
use crate::session::owner_share;

/// How much the server admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionPolicy {
    /// Sandboxes running at once.
    pub max_concurrent: usize,
    /// Requests waiting for a sandbox beyond those.
    pub max_queue: usize,
    /// The largest request body: each place in line may hold this much in memory.
    pub max_body_bytes: u64,
    /// The API keys that share the server (1 without keys).
    pub keys: usize,
}

impl AdmissionPolicy {
    /// One sandbox at a time, nobody else waiting: a command-line run.
    pub fn single() -> AdmissionPolicy {
        AdmissionPolicy {
            max_concurrent: 1,
            max_queue: 0,
            max_body_bytes: u64::MAX / 4,
            keys: 1,
        }
    }

    fn places(&self) -> usize {
        self.max_concurrent.saturating_add(self.max_queue).max(1)
    }

    /// The most the request bodies of every place in line may hold of the server's memory
    /// (`places × max_body`): the server's, so it also comes off the memory ledger.
    pub fn body_budget(&self) -> u64 {
        (self.places() as u64).saturating_mul(self.max_body_bytes)
    }
}

/// Who holds a place: an API key's id (`None` without keys).
type Owner = Option<String>;

#[derive(Default)]
struct State {
    places: usize,
    places_by: HashMap<Owner, usize>,
    bytes: u64,
    bytes_by: HashMap<Owner, u64>,
    running: usize,
    running_by: HashMap<Owner, usize>,
    /// When each key last got a slot (a count of grants): among keys that run as few
    /// sandboxes, the one served longest ago goes first.
    last_grant: HashMap<Owner, u64>,
    grants: u64,
    waiting: Vec<Waiter>,
    next_waiter: u64,
    closed: bool,
    /// Bytes of the memory ledger held: granted slots' runs plus live sessions.
    memory: u64,
    /// Of those, the bytes live sessions hold ([`MemoryHold`]s): what the running slots'
    /// ending does not give back.
    sessions: u64,
}

/// A request waiting for a slot. A grant is counted as running when it is sent; the waiter
/// turns it into a [`Slot`] (or gives it back, if it left meanwhile).
struct Waiter {
    id: u64,
    owner: Owner,
    /// Bytes of the memory ledger its run holds once granted.
    need: u64,
    grant: oneshot::Sender<()>,
}

fn add<K: Clone + Eq + std::hash::Hash>(m: &mut HashMap<K, usize>, k: &K, n: isize) {
    let e = m.entry(k.clone()).or_default();
    *e = e.saturating_add_signed(n);
    if *e == 0 {
        m.remove(k);
    }
}

fn add_bytes(m: &mut HashMap<Owner, u64>, k: &Owner, n: u64, up: bool) {
    let e = m.entry(k.clone()).or_default();
    *e = if up {
        e.saturating_add(n)
    } else {
        e.saturating_sub(n)
    };
    if *e == 0 {
        m.remove(k);
    }
}

/// Others than `owner` that hold something in `m`.
fn others<V>(m: &HashMap<Owner, V>, owner: &Owner) -> usize {
    m.keys().filter(|k| *k != owner).count()
}

struct Shared {
    policy: AdmissionPolicy,
    /// The memory ledger's budget; `None`: no ledger (memory unknown).
    memory_budget: Option<u64>,
    state: Mutex<State>,
}

impl Shared {
    /// Whether `need` more bytes fit in the ledger now.
    fn fits(&self, s: &State, need: u64) -> bool {
        self.memory_budget
            .is_none_or(|budget| s.memory.saturating_add(need) <= budget)
    }

    /// Whether `need` bytes would fit once the running slots have ended, beside the live
    /// sessions' holds: only such a waiter may hold the others back (one that needs the
    /// sessions' memory would hold them for as long as a session lives).
    fn fits_beside_sessions(&self, s: &State, need: u64) -> bool {
        self.memory_budget
            .is_none_or(|budget| s.sessions.saturating_add(need) <= budget)
    }

    /// Whether a waiting request holds back the others that need memory: it is served first
    /// in the fair order, and the memory it waits for is the running slots'.
    fn blocks(&self, s: &State, w: &Waiter) -> bool {
        w.need > 0 && self.fits_beside_sessions(s, w.need)
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The server's admission. Cheap to clone.
#[derive(Clone)]
pub struct Admission(Arc<Shared>);

/// What admission holds now, for `/metrics`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AdmissionStats {
    /// Places in line held (running, waiting for a slot, being read, delivered).
    pub places: usize,
    /// Sandboxes running.
    pub running: usize,
    /// Requests waiting for a slot.
    pub waiting: usize,
    /// Bytes of the body budget held.
    pub bytes: u64,
    /// Bytes of the memory ledger held (runs with a slot, live sessions).
    pub memory: u64,
}

impl Admission {
    pub fn new(policy: AdmissionPolicy) -> Admission {
        Admission::with_memory(policy, None)
    }

    /// Admission with a memory ledger of `memory_budget` bytes (see the module): what runs and
    /// sessions hold together never exceeds it.
    pub fn with_memory(policy: AdmissionPolicy, memory_budget: Option<u64>) -> Admission {
        Admission(Arc::new(Shared {
            policy,
            memory_budget,
            state: Mutex::default(),
        }))
    }

    /// The memory ledger's budget.
    pub fn memory_budget(&self) -> Option<u64> {
        self.0.memory_budget
    }

    /// Hold `bytes` of the memory ledger until the hold is dropped (a live session's memory
    /// and disk), or refuse now: 429 when the runs and sessions of the moment leave too little,
    /// naming memory.
    pub fn hold_memory(&self, bytes: u64) -> Result<MemoryHold, RunError> {
        let shared = &self.0;
        let mut s = shared.lock();
        if !shared.fits(&s, bytes) {
            let budget = shared.memory_budget.unwrap_or(0);
            return Err(RunError::rate_limited(format!(
                "Not enough memory: the runs and sessions of the moment hold {} of the {} \
                 the server may give them, and this needs {} more (memory and disk). Retry \
                 once a run or a session has ended, or ask for less memory or disk.",
                crate::units::format_size(s.memory),
                crate::units::format_size(budget),
                crate::units::format_size(bytes)
            )));
        }
        s.memory += bytes;
        s.sessions += bytes;
        // A waiter that needed this memory no longer fits beside the sessions: it no longer
        // holds the others back.
        hand_on(shared, &mut s);
        Ok(MemoryHold {
            shared: shared.clone(),
            bytes,
        })
    }

    pub fn policy(&self) -> &AdmissionPolicy {
        &self.0.policy
    }

    pub fn stats(&self) -> AdmissionStats {
        let s = self.0.lock();
        AdmissionStats {
            places: s.places,
            running: s.running,
            waiting: s.waiting.len(),
            bytes: s.bytes,
            memory: s.memory,
        }
    }

    /// A place in line for `owner`, or 429: the server is full, or the key holds its share.
    pub fn reserve(&self, owner: Option<&str>) -> Result<Ticket, RunError> {
        let owner: Owner = owner.map(str::to_string);
        take_place(&self.0, &owner)?;
        Ok(Ticket(Arc::new(TicketInner {
            shared: self.0.clone(),
            owner,
            held: Mutex::new(Held {
                place: true,
                bytes: 0,
            }),
        })))
    }

    /// A ticket that holds bytes of the body budget but no place in line: the body of a
    /// request that is not a run (an MCP message, an approval's decision).
    pub fn unlined(&self, owner: Option<&str>) -> Ticket {
        Ticket(Arc::new(TicketInner {
            shared: self.0.clone(),
            owner: owner.map(str::to_string),
            held: Mutex::new(Held {
                place: false,
                bytes: 0,
            }),
        }))
    }

    /// No new slot from now on: waiting requests are refused (shutdown).
    pub fn close(&self) {
        let waiting = {
            let mut s = self.0.lock();
            s.closed = true;
            std::mem::take(&mut s.waiting)
        };
        // Their senders dropped: each waiter wakes with an error.
        drop(waiting);
    }
}

fn take_place(shared: &Shared, owner: &Owner) -> Result<(), RunError> {
    let p = &shared.policy;
    let mut s = shared.lock();
    if s.places >= p.places() {
        return Err(RunError::rate_limited(format!(
            "The server is at capacity ({} executions running, {} waiting). Retry shortly.",
            p.max_concurrent, p.max_queue
        )));
    }
    let mine = s.places_by.get(owner).copied().unwrap_or(0);
    let share =
        (owner_share(p.places() as u64, p.keys, others(&s.places_by, owner)) as usize).max(1);
    if mine >= share {
        return Err(RunError::rate_limited(format!(
            "This API key has {mine} requests in line, its share of the server's {} places \
             (shared with the other keys). Retry when one of them has finished.",
            p.places()
        )));
    }
    s.places += 1;
    add(&mut s.places_by, owner, 1);
    Ok(())
}

struct Held {
    place: bool,
    bytes: u64,
}

struct TicketInner {
    shared: Arc<Shared>,
    owner: Owner,
    held: Mutex<Held>,
}

impl TicketInner {
    fn held(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Drop for TicketInner {
    fn drop(&mut self) {
        let held = self.held();
        let (place, bytes) = (held.place, held.bytes);
        drop(held);
        let mut s = self.shared.lock();
        if place {
            s.places -= 1;
            add(&mut s.places_by, &self.owner, -1);
        }
        s.bytes = s.bytes.saturating_sub(bytes);
        add_bytes(&mut s.bytes_by, &self.owner, bytes, false);
    }
}

/// A place in line and the bytes it holds; given back when the last clone is dropped (a
/// response being delivered keeps a clone, so the place is held until the client has it).
#[derive(Clone)]
pub struct Ticket(Arc<TicketInner>);

impl std::fmt::Debug for Ticket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ticket")
            .field("owner", &self.0.owner)
            .finish()
    }
}

impl Ticket {
    pub fn owner(&self) -> Option<&str> {
        self.0.owner.as_deref()
    }

    /// Hold `n` more bytes of the body budget (a body being read, a request kept while it
    /// waits), or 429 when the budget, or the key's share of it, is spent.
    pub fn take_bytes(&self, n: u64) -> Result<(), RunError> {
        let shared = &self.0.shared;
        let p = &shared.policy;
        let budget = p.body_budget();
        let mut held = self.0.held();
        let mut s = shared.lock();
        let owner = &self.0.owner;
        let mine = s.bytes_by.get(owner).copied().unwrap_or(0);
        let share = owner_share(budget, p.keys, others(&s.bytes_by, owner));
        if s.bytes.saturating_add(n) > budget || mine.saturating_add(n) > share {
            return Err(RunError::rate_limited(
                "The server is receiving or holding too many request bodies at once. Retry \
                 shortly.",
            ));
        }
        s.bytes += n;
        add_bytes(&mut s.bytes_by, owner, n, true);
        held.bytes += n;
        Ok(())
    }

    /// Hold what parsing `body` as JSON costs beyond its bytes (see
    /// [`crate::request::json_parse_bytes`]), before it is parsed: 429 as [`Ticket::take_bytes`],
    /// 413 for a body whose parse alone would take more than the whole budget.
    pub fn take_parse_bytes(&self, body: &[u8]) -> Result<(), RunError> {
        let n = crate::request::json_parse_bytes(body);
        let budget = self.0.shared.policy.body_budget();
        if n > budget {
            return Err(RunError::new(
                crate::error::ErrorKind::PayloadTooLarge,
                format!(
                    "The request body has too many JSON values: parsing it would take {} of \
                     memory, more than the server's {} for request bodies. Send fewer, larger \
                     values.",
                    crate::units::format_size(n),
                    crate::units::format_size(budget)
                ),
            ));
        }
        self.take_bytes(n)
    }

    /// Give back bytes no longer held (a body parsed into something smaller).
    pub fn give_back_bytes(&self, n: u64) {
        let mut held = self.0.held();
        let n = n.min(held.bytes);
        held.bytes -= n;
        let mut s = self.0.shared.lock();
        s.bytes = s.bytes.saturating_sub(n);
        add_bytes(&mut s.bytes_by, &self.0.owner, n, false);
    }

    /// Bytes held now.
    pub fn bytes(&self) -> u64 {
        self.0.held().bytes
    }

    /// Leave the line while waiting for something that is not the server's (a person's
    /// approval), keeping the bytes.
    pub fn release_place(&self) {
        let mut held = self.0.held();
        if !held.place {
            return;
        }
        held.place = false;
        let mut s = self.0.shared.lock();
        s.places -= 1;
        add(&mut s.places_by, &self.0.owner, -1);
    }

    /// Back in line (429 if the server filled up meanwhile).
    pub fn retake_place(&self) -> Result<(), RunError> {
        let mut held = self.0.held();
        if held.place {
            return Ok(());
        }
        take_place(&self.0.shared, &self.0.owner)?;
        held.place = true;
        Ok(())
    }

    /// A sandbox slot, waited for: granted fairly between keys (see the module). Dropping the
    /// future gives up the wait (or the slot, if it was just granted). The slot holds nothing
    /// of the memory ledger: a session's call runs within what the session holds.
    pub async fn slot(&self) -> Result<Slot, RunError> {
        self.slot_with_memory(0).await
    }

    /// A sandbox slot that also holds `memory` bytes of the memory ledger (a one-shot run's
    /// memory and disk limits) while it is held: granted when both a slot and the memory are
    /// free, in the same fair order. 503 at once for a run that could never fit. One that
    /// cannot fit while the live sessions hold their memory waits without holding anybody
    /// back (see [`hand_on`]).
    pub async fn slot_with_memory(&self, memory: u64) -> Result<Slot, RunError> {
        let shared = &self.0.shared;
        let owner = self.0.owner.clone();
        if let Some(budget) = shared.memory_budget.filter(|&b| memory > b) {
            return Err(RunError::unavailable(format!(
                "Not enough memory: the run's memory and disk limits ({}) are more than the \
                 server may give all runs together ({}). Ask for less memory or disk.",
                crate::units::format_size(memory),
                crate::units::format_size(budget)
            )));
        }
        let rx = {
            let mut s = shared.lock();
            if s.closed {
                return Err(RunError::unavailable("The server is shutting down."));
            }
            // A free slot beside a waiter that holds the others back means it waits for
            // memory (hand_on serves it otherwise): a request that needs none (a session's
            // call) may take the slot, one that needs memory waits behind it.
            if s.running < shared.policy.max_concurrent
                && (memory == 0 || !s.waiting.iter().any(|w| shared.blocks(&s, w)))
                && shared.fits(&s, memory)
            {
                s.grant(&owner, memory);
                return Ok(Slot {
                    shared: shared.clone(),
                    owner,
                    memory,
                });
            }
            let (tx, rx) = oneshot::channel();
            s.next_waiter += 1;
            let id = s.next_waiter;
            s.waiting.push(Waiter {
                id,
                owner: owner.clone(),
                need: memory,
                grant: tx,
            });
            WaitGuard {
                shared: shared.clone(),
                id,
                owner,
                memory,
                rx: Some(rx),
            }
        };
        rx.wait().await
    }
}

/// A request waiting for a slot: leaves the waiting list when dropped.
struct WaitGuard {
    shared: Arc<Shared>,
    id: u64,
    owner: Owner,
    memory: u64,
    rx: Option<oneshot::Receiver<()>>,
}

impl WaitGuard {
    async fn wait(mut self) -> Result<Slot, RunError> {
        let Some(rx) = self.rx.as_mut() else {
            return Err(RunError::internal("a slot was waited for twice"));
        };
        match rx.await {
            Ok(()) => {
                self.rx = None;
                Ok(Slot {
                    shared: self.shared.clone(),
                    owner: self.owner.clone(),
                    memory: self.memory,
                })
            }
            Err(_) => {
                self.rx = None;
                Err(RunError::unavailable("The server is shutting down."))
            }
        }
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        let Some(mut rx) = self.rx.take() else { return };
        {
            let mut s = self.shared.lock();
            s.waiting.retain(|w| w.id != self.id);
            // It may have held the others back: those that fit now get their slots.
            hand_on(&self.shared, &mut s);
        }
        // Granted between the wake-up and now: give it back (its drop hands it on).
        rx.close();
        if rx.try_recv().is_ok() {
            drop(Slot {
                shared: self.shared.clone(),
                owner: self.owner.clone(),
                memory: self.memory,
            });
        }
    }
}

/// A sandbox running: given back (to the next waiter) when dropped.
pub struct Slot {
    shared: Arc<Shared>,
    owner: Owner,
    /// Bytes of the memory ledger it holds.
    memory: u64,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Slot")
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.running -= 1;
        s.memory = s.memory.saturating_sub(self.memory);
        add(&mut s.running_by, &self.owner, -1);
        hand_on(&self.shared, &mut s);
    }
}

/// Bytes of the memory ledger held outside a slot (a live session's memory and disk); given
/// back, and waiting runs served, when dropped.
pub struct MemoryHold {
    shared: Arc<Shared>,
    bytes: u64,
}

impl std::fmt::Debug for MemoryHold {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryHold")
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Drop for MemoryHold {
    fn drop(&mut self) {
        let mut s = self.shared.lock();
        s.memory = s.memory.saturating_sub(self.bytes);
        s.sessions = s.sessions.saturating_sub(self.bytes);
        hand_on(&self.shared, &mut s);
    }
}

impl State {
    /// A slot (and `memory` bytes of the ledger) counted for `owner`.
    fn grant(&mut self, owner: &Owner, memory: u64) {
        self.running += 1;
        self.memory += memory;
        add(&mut self.running_by, owner, 1);
        self.grants += 1;
        let n = self.grants;
        self.last_grant.insert(owner.clone(), n);
    }
}

/// Give free slots to waiters: each to the oldest request of the key that runs the fewest
/// sandboxes now, and among those the key served longest ago. A waiter whose memory does not
/// fit yet is not overtaken by other runs that need memory (a large run would starve behind a
/// stream of small ones otherwise); only requests that need none (a session's call) pass it.
/// That holds only while the memory it waits for is the running slots' (they end within
/// their time limits): a waiter that needs memory live sessions hold (it would hold the
/// others back for as long as a session lives) is passed by all, and served when it fits.
fn hand_on(shared: &Shared, s: &mut State) {
    while s.running < shared.policy.max_concurrent && !s.waiting.is_empty() && !s.closed {
        let order = |s: &State, i: usize| {
            let w = &s.waiting[i];
            (
                s.running_by.get(&w.owner).copied().unwrap_or(0),
                s.last_grant.get(&w.owner).copied().unwrap_or(0),
                w.id,
            )
        };
        let fitting = |s: &State, pred: &dyn Fn(&Waiter) -> bool| {
            (0..s.waiting.len())
                .filter(|&i| pred(&s.waiting[i]))
                .min_by_key(|&i| order(s, i))
        };
        // The first of those that may hold the others back (or need no memory)...
        let first = fitting(s, &|w| w.need == 0 || shared.blocks(s, w));
        let pick = match first {
            Some(i) if shared.fits(s, s.waiting[i].need) => Some(i),
            // ...waits for memory: only requests that need none pass it.
            Some(_) => fitting(s, &|w| w.need == 0),
            // None does: the first that fits now.
            None => fitting(s, &|w| shared.fits(s, w.need)),
        };
        let Some(pick) = pick else { break };
        let w = s.waiting.remove(pick);
        if w.grant.send(()).is_ok() {
            s.grant(&w.owner, w.need);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn admission(max_concurrent: usize, max_queue: usize, keys: usize) -> Admission {
        Admission::new(AdmissionPolicy {
            max_concurrent,
            max_queue,
            max_body_bytes: 100,
            keys,
        })
    }

    #[test]
    fn places_are_bounded_in_total_and_per_key() {
        let a = admission(2, 8, 2);
        // One key of two: half of the ten places.
        let mine: Vec<Ticket> = (0..5).map(|_| a.reserve(Some("a")).unwrap()).collect();
        let e = a.reserve(Some("a")).unwrap_err();
        assert_eq!(e.kind, crate::error::ErrorKind::RateLimited);
        assert!(e.message.contains("share"), "{e}");
        // The other key still gets in, up to the total.
        let theirs: Vec<Ticket> = (0..5).map(|_| a.reserve(Some("b")).unwrap()).collect();
        assert!(a.reserve(Some("b")).is_err());
        assert_eq!(a.stats().places, 10);
        drop(mine);
        drop(theirs);
        assert_eq!(a.stats(), AdmissionStats::default());
        // With one key (or none), all of them.
        let a = admission(2, 8, 1);
        let all: Vec<Ticket> = (0..10).map(|_| a.reserve(None).unwrap()).collect();
        assert!(a.reserve(None).unwrap_err().message.contains("capacity"));
        drop(all);
    }

    #[test]
    fn a_ticket_is_one_place_however_cloned_and_keeps_its_bytes_out_of_line() {
        let a = admission(1, 1, 1);
        let t = a.reserve(None).unwrap();
        let kept = t.clone();
        drop(t);
        assert_eq!(a.stats().places, 1);
        kept.take_bytes(150).unwrap();
        // The budget is two places of 100 bytes.
        assert!(kept.take_bytes(60).is_err());
        kept.release_place();
        assert_eq!(a.stats().places, 0);
        assert_eq!(a.stats().bytes, 150);
        let other = a.reserve(None).unwrap();
        assert!(
            other.take_bytes(60).is_err(),
            "the waiting run's bytes still count"
        );
        kept.retake_place().unwrap();
        drop(kept);
        assert_eq!(a.stats().bytes, 0);
        drop(other);
        assert_eq!(a.stats(), AdmissionStats::default());
    }

    #[tokio::test]
    async fn slots_go_to_the_key_that_runs_the_fewest() {
        let a = admission(1, 20, 2);
        let first = a.reserve(Some("a")).unwrap();
        let running = first.slot().await.unwrap();
        // Key a queues three, then key b one: b is served before a's second.
        let queued_a: Vec<Ticket> = (0..3).map(|_| a.reserve(Some("a")).unwrap()).collect();
        let b = a.reserve(Some("b")).unwrap();
        let mut waits: Vec<_> = queued_a.iter().map(|t| Box::pin(t.slot())).collect();
        let mut wait_b = Box::pin(b.slot());
        // Register every waiter (in this order) before any slot frees.
        for w in &mut waits {
            assert!(futures_poll(w).is_none());
        }
        assert!(futures_poll(&mut wait_b).is_none());
        assert_eq!(a.stats().waiting, 4);
        drop(running);
        let got_b = futures_poll(&mut wait_b).expect("b's request got the slot");
        assert!(got_b.is_ok());
        for w in &mut waits {
            assert!(futures_poll(w).is_none(), "a's requests wait behind b's");
        }
        drop(got_b);
        assert!(futures_poll(&mut waits[0]).is_some());
    }

    #[tokio::test]
    async fn a_waiter_that_leaves_gives_its_grant_on() {
        let a = admission(1, 4, 1);
        let t1 = a.reserve(None).unwrap();
        let running = t1.slot().await.unwrap();
        let t2 = a.reserve(None).unwrap();
        let t3 = a.reserve(None).unwrap();
        let mut w2 = Box::pin(t2.slot());
        let mut w3 = Box::pin(t3.slot());
        assert!(futures_poll(&mut w2).is_none());
        assert!(futures_poll(&mut w3).is_none());
        // The slot is granted to t2, which leaves before it takes it.
        drop(running);
        drop(w2);
        let got = futures_poll(&mut w3).expect("t3 got the slot t2 left");
        assert!(got.is_ok());
        assert_eq!(a.stats().running, 1);
        drop(got);
        assert_eq!(a.stats().running, 0);
        a.close();
        let t4 = a.reserve(None).unwrap();
        assert!(t4.slot().await.is_err(), "no slot after close");
    }

    /// Regression (issue 23): runs sized at `usable / max_concurrent` each and sessions
    /// admitted against all of `usable` could together hold twice the memory. One ledger: a
    /// session's hold and the runs' holds share the budget, a run that does not fit waits for
    /// memory as for a slot, and one that could never fit is refused at once.
    #[tokio::test]
    async fn runs_and_sessions_share_one_memory_ledger() {
        let a = Admission::with_memory(
            AdmissionPolicy {
                max_concurrent: 4,
                max_queue: 8,
                max_body_bytes: 100,
                keys: 1,
            },
            Some(1000),
        );
        assert_eq!(a.memory_budget(), Some(1000));
        // A session holds 600 of it.
        let session = a.hold_memory(600).unwrap();
        assert_eq!(a.stats().memory, 600);
        // A run of 300 fits beside it; a second one does not, though slots are free: it waits.
        let t1 = a.reserve(None).unwrap();
        let run1 = t1.slot_with_memory(300).await.unwrap();
        let t2 = a.reserve(None).unwrap();
        let mut w2 = Box::pin(t2.slot_with_memory(300));
        assert!(futures_poll(&mut w2).is_none(), "no memory: it waits");
        assert_eq!(a.stats().waiting, 1);
        // A second session that does not fit is refused, naming memory.
        let e = a.hold_memory(200).unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::RateLimited);
        assert!(e.message.contains("Not enough memory"), "{}", e.message);
        // A run that could never fit is refused at once.
        let t3 = a.reserve(None).unwrap();
        let e = t3.slot_with_memory(1001).await.unwrap_err();
        assert_eq!(e.kind, crate::ErrorKind::Unavailable);
        assert!(e.message.contains("memory"), "{}", e.message);
        // A session's call holds nothing more: it runs within the session's hold, and passes
        // the run that waits for memory (it would wait for the session to end otherwise).
        let t4 = a.reserve(None).unwrap();
        let call = t4.slot().await.unwrap();
        assert_eq!(a.stats().memory, 900);
        drop(call);
        // The session ends: the waiting run gets its slot and its memory.
        drop(session);
        let run2 = futures_poll(&mut w2).expect("granted").unwrap();
        assert_eq!(a.stats().memory, 600);
        assert_eq!(a.stats().running, 2);
        drop((run1, run2));
        assert_eq!(a.stats().memory, 0);
        assert_eq!(a.stats().running, 0);
    }

    /// A waiter whose memory does not fit is not overtaken by smaller ones behind it (it would
    /// starve behind a stream of them).
    #[tokio::test]
    async fn a_large_run_is_not_overtaken_while_it_waits_for_memory() {
        let a = Admission::with_memory(
            AdmissionPolicy {
                max_concurrent: 4,
                max_queue: 8,
                max_body_bytes: 100,
                keys: 1,
            },
            Some(1000),
        );
        let t1 = a.reserve(None).unwrap();
        let small = t1.slot_with_memory(400).await.unwrap();
        let (t2, t3) = (a.reserve(None).unwrap(), a.reserve(None).unwrap());
        let mut big = Box::pin(t2.slot_with_memory(900));
        // 200 would fit beside the small run now, but it is behind the large one.
        let mut after = Box::pin(t3.slot_with_memory(200));
        assert!(futures_poll(&mut big).is_none());
        assert!(futures_poll(&mut after).is_none(), "behind the large one");
        drop(small);
        let got = futures_poll(&mut big).expect("granted").unwrap();
        assert!(
            futures_poll(&mut after).is_none(),
            "900 + 200 is over the budget"
        );
        drop(got);
        assert!(futures_poll(&mut after).expect("granted").is_ok());
    }

    fn ledger(max_concurrent: usize, keys: usize, budget: u64) -> Admission {
        Admission::with_memory(
            AdmissionPolicy {
                max_concurrent,
                max_queue: 8,
                max_body_bytes: 100,
                keys,
            },
            Some(budget),
        )
    }

    /// Regression (security review 4a): key x keeps an idle session and asks for a run that
    /// fits the budget but not beside the session. It used to wait first in line for as long
    /// as x kept the session, and every other key's run that needs memory waited behind it,
    /// with most of the budget free. It still waits (for the session to end), but the other
    /// key's small run passes it.
    #[tokio::test]
    async fn a_run_that_needs_the_sessions_memory_holds_nobody_back() {
        let a = ledger(4, 2, 1000);
        let session = a.hold_memory(600).unwrap();
        let x = a.reserve(Some("x")).unwrap();
        let mut blocker = Box::pin(x.slot_with_memory(500));
        assert!(futures_poll(&mut blocker).is_none(), "it waits");
        let y = a.reserve(Some("y")).unwrap();
        let mut small = Box::pin(y.slot_with_memory(100));
        let got = futures_poll(&mut small).expect("y's run is not held back");
        assert!(got.is_ok());
        assert_eq!(a.stats().memory, 700);
        assert!(futures_poll(&mut blocker).is_none());
        // The session ends: x's run fits beside y's and gets its slot.
        drop(session);
        let x_got = futures_poll(&mut blocker).expect("granted");
        assert!(x_got.is_ok());
        assert_eq!(a.stats().memory, 600);
        drop((got, x_got));
        assert_eq!((a.stats().running, a.stats().memory), (0, 0));
    }

    /// A waiter that fitted beside the sessions when it came, and no longer does because a
    /// session was created since, stops holding the others back at once.
    #[tokio::test]
    async fn a_session_created_behind_a_waiter_frees_the_line() {
        let a = ledger(4, 3, 1000);
        let z = a.reserve(Some("z")).unwrap();
        let running = z.slot_with_memory(300).await.unwrap();
        let (x, y) = (a.reserve(Some("x")).unwrap(), a.reserve(Some("y")).unwrap());
        let mut big = Box::pin(x.slot_with_memory(800));
        assert!(futures_poll(&mut big).is_none(), "it waits for z's run");
        let mut small = Box::pin(y.slot_with_memory(100));
        assert!(futures_poll(&mut small).is_none(), "behind the large one");
        // A session takes 300: 800 no longer fits beside it, even once z's run ends.
        let session = a.hold_memory(300).unwrap();
        let got = futures_poll(&mut small).expect("y's run passes the large one");
        assert!(got.is_ok());
        assert!(futures_poll(&mut big).is_none());
        // The large one is served when it fits.
        drop((got, running, session));
        assert!(futures_poll(&mut big).expect("granted").is_ok());
    }

    /// Regression (security review 4a): a waiter that held the others back and leaves hands
    /// the slots on; those behind it used to wait for an unrelated slot or hold to end.
    #[tokio::test]
    async fn a_cancelled_first_waiter_lets_the_others_in() {
        let a = ledger(4, 3, 1000);
        let z = a.reserve(Some("z")).unwrap();
        let running = z.slot_with_memory(300).await.unwrap();
        let (x, y) = (a.reserve(Some("x")).unwrap(), a.reserve(Some("y")).unwrap());
        let mut big = Box::pin(x.slot_with_memory(800));
        assert!(futures_poll(&mut big).is_none());
        let mut small = Box::pin(y.slot_with_memory(100));
        assert!(futures_poll(&mut small).is_none(), "behind the large one");
        // x's client goes away.
        drop(big);
        let got = futures_poll(&mut small).expect("y's run gets its slot");
        assert!(got.is_ok());
        assert_eq!(a.stats().waiting, 0);
        assert_eq!(a.stats().memory, 400);
        drop((got, running));
        assert_eq!((a.stats().running, a.stats().memory), (0, 0));
    }

    /// Poll a future once.
    fn futures_poll<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match std::pin::Pin::new(f).poll(&mut cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }
}
