//! Running on a blocking thread from async code: the one place where the HTTP API and the MCP
//! server hand a run to the engine.
//!
//! The engine starts its helper with `std::process::Command` and supervises it with blocking
//! calls, so a run occupies a blocking thread; nothing forks the threaded server. The future
//! returned here owns a kill switch armed to fire when it is dropped: a client that went away
//! or a cancelled MCP call kills the sandbox at once, and the blocking thread then finishes
//! quickly and runs `finish` (metrics, audit) as for any other run.

use crate::engine::{Engine, ValidRequest};
use crate::verdict::Verdict;
use runcell_jail::{KillSwitch, OutputSink};

/// The blocking task ended without a verdict (it panicked).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the execution failed unexpectedly")]
pub struct ExecutionFailed;

impl Engine {
    /// Run `req` on a blocking thread. `kill` stops the sandbox from outside (the caller may
    /// keep a clone, e.g. to kill every run at shutdown); it also fires when the returned
    /// future is dropped before the run is over. `hold` is dropped once the sandbox is gone
    /// (slots, permits); `finish` sees the verdict on the blocking thread after the sink has
    /// been flushed, also when nobody waits for the verdict any more.
    pub async fn execute_blocking<H, F>(
        &self,
        req: ValidRequest,
        mut sink: Box<dyn OutputSink + Send>,
        kill: KillSwitch,
        hold: H,
        finish: F,
    ) -> Result<Verdict, ExecutionFailed>
    where
        H: Send + 'static,
        F: FnOnce(&Verdict) + Send + 'static,
    {
        let mut guard = kill.kill_on_drop();
        let engine = self.clone();
        // The caller's span (its request id) follows the run onto the blocking thread.
        let span = tracing::Span::current();
        let verdict = tokio::task::spawn_blocking(move || {
            let _span = span.enter();
            let _hold = hold;
            let verdict = engine.execute_valid(&req, &mut *sink, Some(&kill));
            // Flush what the sink held back before the verdict is handed on.
            drop(sink);
            finish(&verdict);
            verdict
        })
        .await
        .map_err(|_| ExecutionFailed)?;
        guard.disarm();
        Ok(verdict)
    }
}
