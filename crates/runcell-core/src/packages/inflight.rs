//! The installs in flight in this process, one per requirement key: the first request for a
//! set installs it; a second one for the same set waits for it to end, each bounded by its own
//! deadline and kill switch; a request for another set never waits (there is no lock shared
//! by all installs).
//!
//! An install's end is an eventfd, readable for good once written, so that a waiter polls it
//! next to its own kill switch without any polling interval.

use std::collections::HashMap;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use runcell_jail::KillSwitch;
use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags, Timespec};

/// The registry. Owned by the engine (its clones share it).
#[derive(Debug, Default)]
pub(super) struct InFlight(Mutex<HashMap<String, Arc<Done>>>);

/// Readable once the install it belongs to is over (whichever way it ended).
#[derive(Debug)]
pub(super) struct Done(OwnedFd);

/// Install now (holding the ticket), or wait for the request that does.
pub(super) enum Turn<'a> {
    Install(Ticket<'a>),
    Wait(Arc<Done>),
}

/// The right to install one key; dropping it (the install ended, failed, panicked) wakes the
/// waiters and lets the next request take the key.
pub(super) struct Ticket<'a> {
    registry: &'a InFlight,
    key: String,
    done: Arc<Done>,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Waited {
    /// The install is over: look in the cache again.
    Done,
    TimedOut,
    Cancelled,
}

impl InFlight {
    pub(super) fn begin(&self, key: &str) -> io::Result<Turn<'_>> {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(done) = map.get(key) {
            return Ok(Turn::Wait(done.clone()));
        }
        let done = Arc::new(Done(eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?));
        map.insert(key.to_string(), done.clone());
        Ok(Turn::Install(Ticket {
            registry: self,
            key: key.to_string(),
            done,
        }))
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut map = self.registry.0.lock().unwrap_or_else(|e| e.into_inner());
        if map
            .get(&self.key)
            .is_some_and(|d| Arc::ptr_eq(d, &self.done))
        {
            map.remove(&self.key);
        }
        drop(map);
        let _ = rustix::io::write(&self.done.0, &1u64.to_ne_bytes());
    }
}

impl Done {
    /// Wait until the install is over, `deadline` passes or `cancel` fires.
    pub(super) fn wait(&self, deadline: Instant, cancel: Option<&KillSwitch>) -> Waited {
        loop {
            let now = Instant::now();
            if now >= deadline {
                return Waited::TimedOut;
            }
            let left = deadline - now;
            let timeout = Timespec {
                tv_sec: left.as_secs() as _,
                tv_nsec: left.subsec_nanos() as _,
            };
            let mut fds = vec![PollFd::new(&self.0, PollFlags::IN)];
            if let Some(c) = cancel {
                fds.push(PollFd::new(c, PollFlags::IN));
            }
            match poll(&mut fds, Some(&timeout)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                // Cannot wait: as if the time were up (never a busy loop).
                Err(_) => return Waited::TimedOut,
            }
            if fds.get(1).is_some_and(|f| !f.revents().is_empty()) {
                return Waited::Cancelled;
            }
            if !fds[0].revents().is_empty() {
                return Waited::Done;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn one_install_per_key_and_none_shared_between_keys() {
        let r = InFlight::default();
        let a = match r.begin("a").unwrap() {
            Turn::Install(t) => t,
            Turn::Wait(_) => panic!("first"),
        };
        // Another key installs at once, whatever "a" does.
        assert!(matches!(r.begin("b").unwrap(), Turn::Install(_)));
        let Turn::Wait(done) = r.begin("a").unwrap() else {
            panic!("second request for a")
        };
        // Its own deadline bounds the wait.
        let soon = Instant::now() + Duration::from_millis(1);
        assert_eq!(done.wait(soon, None), Waited::TimedOut);
        // And its own kill switch.
        let ks = KillSwitch::new().unwrap();
        ks.trigger();
        let later = Instant::now() + Duration::from_secs(3600);
        assert_eq!(done.wait(later, Some(&ks)), Waited::Cancelled);
        // The install ends (however): the waiter wakes, the key is free again.
        drop(a);
        assert_eq!(done.wait(later, None), Waited::Done);
        assert_eq!(r.len(), 0);
        assert!(matches!(r.begin("a").unwrap(), Turn::Install(_)));
    }

    #[test]
    fn a_waiter_wakes_when_the_install_ends_on_another_thread() {
        let r = Arc::new(InFlight::default());
        let (tx, rx) = std::sync::mpsc::channel();
        let (end_tx, end_rx) = std::sync::mpsc::channel::<()>();
        let r2 = r.clone();
        let installer = std::thread::spawn(move || {
            let Turn::Install(t) = r2.begin("k").unwrap() else {
                panic!()
            };
            tx.send(()).unwrap();
            // Hold the ticket until the waiter is registered below, then end.
            end_rx.recv().unwrap();
            drop(t);
        });
        rx.recv().unwrap();
        let Turn::Wait(done) = r.begin("k").unwrap() else {
            panic!()
        };
        end_tx.send(()).unwrap();
        let far = Instant::now() + Duration::from_secs(3600);
        assert_eq!(done.wait(far, None), Waited::Done);
        installer.join().unwrap();
    }
}
