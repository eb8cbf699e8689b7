//! Connections as a bounded resource. Opening one needs no key, and each holds a file
//! descriptor: without bounds, a client (or a few) that opens connections and sends nothing,
//! or half a request, exhausts the process's descriptors and starves the authenticated
//! callers. So:
//!
//! * at start the soft `RLIMIT_NOFILE` is raised to the hard one (a common soft limit is
//!   1024), and the default caps are derived from it, leaving room for the sandboxes;
//! * the connections open at once are capped in total and per peer address (refused ones are
//!   closed at once and counted);
//! * a connection that has not carried an authenticated request within
//!   [`UNAUTHENTICATED_GRACE`] of opening is closed (an answer in flight gets
//!   [`UNAUTHENTICATED_DRAIN`]), instead of living for the full header deadline.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a connection may stay open without an authenticated request.
pub const UNAUTHENTICATED_GRACE: Duration = Duration::from_secs(10);
/// Once that is over, how long an answer in flight on it (a public endpoint's or a 401) gets
/// before the connection is closed.
pub const UNAUTHENTICATED_DRAIN: Duration = Duration::from_secs(1);

/// File descriptors kept for everything but client connections: the listener, logs, the audit
/// file, runtime probes.
const FDS_BASE: u64 = 128;
/// File descriptors one running sandbox takes in the server (pipes, its control socket, the
/// kill switch, pidfd, cgroup files), with room to spare.
const FDS_PER_SANDBOX: u64 = 32;

/// Connections a peer gets per place in the server's line by default (a request, a response
/// being delivered, an idle kept-alive connection and an event stream each).
const PER_PLACE: usize = 4;
/// ... and at least this many.
const PER_PEER_FLOOR: usize = 64;

/// The caps, and the connections counted against them.
#[derive(Clone, Debug)]
pub struct ConnectionLimits {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max_total: usize,
    max_per_peer: usize,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    total: usize,
    by_peer: HashMap<IpAddr, usize>,
}

/// Why a connection was not taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    Total,
    PerPeer,
}

impl Refused {
    pub const ALL: [Refused; 2] = [Refused::Total, Refused::PerPeer];

    /// Its reason in `runcell_rejections_total`.
    pub fn reason(self) -> &'static str {
        match self {
            Refused::Total => "too_many_connections",
            Refused::PerPeer => "too_many_connections_from_peer",
        }
    }
}

impl ConnectionLimits {
    /// At most `max_total` connections, at most `max_per_peer` of them from one address.
    pub fn new(max_total: usize, max_per_peer: usize) -> ConnectionLimits {
        ConnectionLimits {
            inner: Arc::new(Inner {
                max_total: max_total.max(1),
                max_per_peer: max_per_peer.max(1),
                open: Mutex::new(Open::default()),
            }),
        }
    }

    /// No caps (tests, embedding).
    pub fn unlimited() -> ConnectionLimits {
        ConnectionLimits::new(usize::MAX, usize::MAX)
    }

    /// The default caps for a process allowed `open_files` descriptors running
    /// `max_concurrent` sandboxes with `max_queue` waiting: what is left after the
    /// sandboxes' share, and per peer what one peer can use of the server (its requests in
    /// line, the responses being delivered to it, its event streams: [`PER_PLACE`] a place
    /// and [`PER_PEER_FLOOR`] at least), never more than a quarter of the total. A reverse
    /// proxy in front is one peer: raise it there.
    pub fn for_fd_limit(
        open_files: u64,
        max_concurrent: usize,
        max_queue: usize,
    ) -> (usize, usize) {
        let reserved = FDS_BASE + FDS_PER_SANDBOX * max_concurrent as u64;
        let total = open_files.saturating_sub(reserved).clamp(16, 1 << 20) as usize;
        let usable = max_concurrent
            .saturating_add(max_queue)
            .saturating_mul(PER_PLACE)
            .max(PER_PEER_FLOOR);
        (total, usable.min(total / 4).max(8))
    }

    pub fn max_total(&self) -> usize {
        self.inner.max_total
    }

    pub fn max_per_peer(&self) -> usize {
        self.inner.max_per_peer
    }

    /// Count a new connection from `peer`, or say which cap it would break.
    pub fn admit(&self, peer: IpAddr) -> Result<ConnectionGuard, Refused> {
        let mut open = self.inner.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= self.inner.max_total {
            return Err(Refused::Total);
        }
        let n = open.by_peer.entry(peer).or_insert(0);
        if *n >= self.inner.max_per_peer {
            return Err(Refused::PerPeer);
        }
        *n += 1;
        open.total += 1;
        Ok(ConnectionGuard {
            limits: self.clone(),
            peer,
        })
    }

    /// Connections open now.
    pub fn open(&self) -> usize {
        self.inner
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .total
    }
}

/// A counted connection; uncounted when dropped (when the connection is closed).
#[derive(Debug)]
pub struct ConnectionGuard {
    limits: ConnectionLimits,
    peer: IpAddr,
}

impl Drop for ConnectionGuard {
    fn drop(&mut self) {
        let mut open = self
            .limits
            .inner
            .open
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.by_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                open.by_peer.remove(&self.peer);
            }
        }
    }
}

/// Set in a connection's requests' extensions; the auth middleware marks it once a request
/// on the connection has passed it.
#[derive(Debug, Clone, Default)]
pub struct Authenticated(Arc<AtomicBool>);

impl Authenticated {
    pub fn mark(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_hold_in_total_and_per_peer_and_free_on_close() {
        let l = ConnectionLimits::new(3, 2);
        let a: IpAddr = "127.0.0.2".parse().unwrap();
        let b: IpAddr = "127.0.0.3".parse().unwrap();
        let a1 = l.admit(a).unwrap();
        let _a2 = l.admit(a).unwrap();
        assert_eq!(l.admit(a).unwrap_err(), Refused::PerPeer);
        let _b1 = l.admit(b).unwrap();
        assert_eq!(l.admit(b).unwrap_err(), Refused::Total);
        drop(a1);
        assert_eq!(l.open(), 2);
        let _b2 = l.admit(b).unwrap();
        assert_eq!(l.open(), 3);
    }

    #[test]
    fn default_caps_leave_room_for_the_sandboxes() {
        let (total, per_peer) = ConnectionLimits::for_fd_limit(1024, 2, 8);
        assert_eq!(total, 1024 - 128 - 64);
        assert_eq!(
            per_peer, 64,
            "what one peer can use of a server of 10 places"
        );
        // A tiny limit still serves a few.
        assert_eq!(ConnectionLimits::for_fd_limit(100, 8, 32).0, 16);
    }

    /// Regression (issue 21): one peer could hold thousands of connections (a quarter of a
    /// raised open-files limit); by default it gets what it can use of the server.
    #[test]
    fn one_peer_gets_what_it_can_use_of_the_server() {
        let (total, per_peer) = ConnectionLimits::for_fd_limit(1 << 20, 2, 8);
        assert!(total > 100_000);
        assert_eq!(per_peer, 64);
        let (_, per_peer) = ConnectionLimits::for_fd_limit(1 << 20, 64, 256);
        assert_eq!(per_peer, 320 * 4);
        // Never more than a quarter of the connections.
        let (total, per_peer) = ConnectionLimits::for_fd_limit(4096, 64, 256);
        assert_eq!(per_peer, total / 4);
    }
}
