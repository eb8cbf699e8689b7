//! Ending a run from another thread.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use rustix::event::{eventfd, EventfdFlags};

/// Kills a running sandbox from another thread (client went away, server shutting down).
/// Once triggered it stays triggered: use one per run.
///
/// It is an eventfd: the run loop polls it next to the output pipes and the control socket,
/// so a trigger ends the wait at once without any polling interval.
#[derive(Clone, Debug)]
pub struct KillSwitch(Arc<OwnedFd>);

impl KillSwitch {
    pub fn new() -> io::Result<Self> {
        let fd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(KillSwitch(Arc::new(fd)))
    }

    pub fn trigger(&self) {
        let _ = rustix::io::write(&*self.0, &1u64.to_ne_bytes());
    }

    /// A guard that triggers this switch when dropped, unless disarmed first: hold it in the
    /// future that waits for the run, so that dropping the future (a client that went away, a
    /// cancelled call) kills the sandbox.
    pub fn kill_on_drop(&self) -> KillOnDrop {
        KillOnDrop(Some(self.clone()))
    }

    pub(super) fn fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }

    /// Whether it has been triggered (it stays so). For waits outside a run, e.g. a request
    /// that waits for another one's package install between steps.
    pub fn is_triggered(&self) -> bool {
        let mut fds = [rustix::event::PollFd::new(
            &*self.0,
            rustix::event::PollFlags::IN,
        )];
        let now = super::timespec(std::time::Duration::ZERO);
        matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
    }
}

/// Readable once triggered: a waiter can poll it next to its own descriptors.
impl AsFd for KillSwitch {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// See [`KillSwitch::kill_on_drop`].
#[derive(Debug)]
pub struct KillOnDrop(Option<KillSwitch>);

impl KillOnDrop {
    /// The run ended: dropping the guard no longer kills anything.
    pub fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(ks) = self.0.take() {
            ks.trigger();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn triggered(ks: &KillSwitch) -> bool {
        let mut buf = [0u8; 8];
        rustix::io::read(ks.fd(), &mut buf).is_ok()
    }

    #[test]
    fn kill_on_drop_triggers_unless_disarmed() {
        let ks = KillSwitch::new().unwrap();
        let mut guard = ks.kill_on_drop();
        guard.disarm();
        drop(guard);
        assert!(!triggered(&ks));
        drop(ks.kill_on_drop());
        assert!(triggered(&ks));
    }

    #[test]
    fn asking_whether_it_was_triggered_does_not_reset_it() {
        let ks = KillSwitch::new().unwrap();
        assert!(!ks.is_triggered());
        ks.clone().trigger();
        assert!(ks.is_triggered());
        assert!(ks.is_triggered(), "still triggered");
    }
}
