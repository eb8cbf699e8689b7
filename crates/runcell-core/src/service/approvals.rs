//! Network approval by the operator: with `--net-approval`, a run that asks for network
//! waits, before it runs, until a person with an admin key approves or denies it (over HTTP:
//! `GET /v1/approvals`, `POST /v1/approvals/{id}`), or until its deadline. (An MCP client's
//! user may approve instead, where the operator chose so: the MCP door asks, and the run
//! comes here approved.)

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use tokio::sync::oneshot;

use crate::session::rfc3339;

/// A run waiting for approval, as `GET /v1/approvals` lists it: who asks, for what, and
/// which code (its digest and size; the code itself may hold the user's data).
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct PendingRun {
    pub id: String,
    /// The API key's id (never the key).
    pub key_id: Option<String>,
    pub request_id: String,
    pub language: String,
    /// The destinations the run asks for.
    pub destinations: Vec<String>,
    pub code_sha256: String,
    pub code_bytes: usize,
    /// RFC 3339.
    pub requested_at: String,
    pub expires_at: String,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Approved,
    Denied,
    TimedOut,
    /// The key already has this many runs waiting.
    TooMany(usize),
}

/// Runs one API key may have waiting at once.
pub const MAX_PENDING_PER_KEY: usize = 8;

#[derive(Default)]
pub struct Approvals {
    pending: Mutex<BTreeMap<String, (PendingRun, oneshot::Sender<bool>)>>,
    next: AtomicU64,
}

impl std::fmt::Debug for Approvals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Approvals")
    }
}

/// Removes a run from the list when its wait ends, however (a client that went away too).
struct Listed<'a> {
    approvals: &'a Approvals,
    id: String,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.approvals.lock().remove(&self.id);
    }
}

impl Approvals {
    fn lock(
        &self,
    ) -> std::sync::MutexGuard<'_, BTreeMap<String, (PendingRun, oneshot::Sender<bool>)>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// List `run` (its `id`, times filled in here) and wait up to `within` for a decision.
    pub async fn wait(self: &Arc<Self>, mut run: PendingRun, within: Duration) -> Decision {
        let n = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut random = [0u8; 16];
        let _ = rustix::rand::getrandom(&mut random, rustix::rand::GetRandomFlags::empty());
        run.id = format!("apr_{n}_{}", crate::to_hex(&random));
        let now = SystemTime::now();
        run.requested_at = rfc3339(now);
        run.expires_at = rfc3339(now + within);
        let (tx, rx) = oneshot::channel();
        let id = run.id.clone();
        {
            let mut pending = self.lock();
            let mine = pending
                .values()
                .filter(|(r, _)| r.key_id == run.key_id)
                .count();
            if mine >= MAX_PENDING_PER_KEY {
                return Decision::TooMany(mine);
            }
            pending.insert(id.clone(), (run, tx));
        }
        let _listed = Listed {
            approvals: self,
            id,
        };
        match tokio::time::timeout(within, rx).await {
            Ok(Ok(true)) => Decision::Approved,
            Ok(Ok(false)) => Decision::Denied,
            Ok(Err(_)) | Err(_) => Decision::TimedOut,
        }
    }

    /// The runs waiting now, oldest first.
    pub fn list(&self) -> Vec<PendingRun> {
        let mut v: Vec<PendingRun> = self.lock().values().map(|(r, _)| r.clone()).collect();
        v.sort_by(|a, b| a.requested_at.cmp(&b.requested_at).then(a.id.cmp(&b.id)));
        v
    }

    /// Decide for the run `id`; false when no run waits under that id.
    pub fn decide(&self, id: &str, approve: bool) -> bool {
        match self.lock().remove(id) {
            Some((_, tx)) => tx.send(approve).is_ok(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run() -> PendingRun {
        PendingRun {
            id: String::new(),
            key_id: Some("team-a".into()),
            request_id: "r1".into(),
            language: "python".into(),
            destinations: vec!["api.github.com:443".into()],
            code_sha256: "00".into(),
            code_bytes: 8,
            requested_at: String::new(),
            expires_at: String::new(),
        }
    }

    #[tokio::test]
    async fn a_wait_ends_by_a_decision_or_its_deadline_and_leaves_the_list() {
        let a = Arc::new(Approvals::default());
        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.wait(run(), Duration::from_secs(30)).await });
        let id = loop {
            if let Some(r) = a.list().first() {
                break r.id.clone();
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        };
        assert!(id.starts_with("apr_"));
        assert!(!a.decide("apr_nope", true));
        assert!(a.decide(&id, false));
        assert_eq!(waiter.await.unwrap(), Decision::Denied);
        assert!(a.list().is_empty());

        let a2 = a.clone();
        let waiter = tokio::spawn(async move { a2.wait(run(), Duration::from_secs(30)).await });
        while a.list().is_empty() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(a.decide(&a.list()[0].id, true));
        assert_eq!(waiter.await.unwrap(), Decision::Approved);

        assert_eq!(
            a.wait(run(), Duration::from_millis(30)).await,
            Decision::TimedOut
        );
        assert!(a.list().is_empty());
    }
}
