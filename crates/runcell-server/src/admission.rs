//! Admission: a place in line before the body is read, the operator's policy checked once
//! the request is known, then a slot to run in.

use std::sync::Arc;
use std::time::Instant;

use runcell_core::{ExecRequest, KillSwitch, OutputSink, ValidRequest, Verdict};
use tokio::sync::OwnedSemaphorePermit;

use crate::audit::{AuditRequest, Caller};
use crate::deliver::Hold;
use crate::error::ApiError;
use crate::state::AppState;

/// A place in line, before the request is known.
pub struct Reservation {
    pub(crate) state: AppState,
    pub(crate) permit: OwnedSemaphorePermit,
}

impl Reservation {
    /// Check the request against the operator's policy (400 naming the limit and its
    /// maximum); a refused request is counted and audited.
    ///
    /// This is the engine's own validation, done once, before the request waits for a slot
    /// (and before a stream's 200 is sent): what is checked here is not checked again.
    pub async fn admit(self, req: ExecRequest, caller: Caller) -> Result<Admitted, ApiError> {
        let Reservation { state, permit } = self;
        let s = &state.inner;
        let audit = AuditRequest::from(&req);
        if let Err(e) = key_network_check(&state, &req, &caller) {
            s.metrics.rejected(e.category);
            s.audit.record(&caller, &audit, Err(e.category), 0.0);
            return Err(e);
        }
        let validated = if req.files.is_empty() {
            s.engine.validate(&req)
        } else {
            // Decoding the input files (tens of MiB of base64 at the policy's caps) is CPU
            // work: it must not hold up the threads that serve every other connection.
            let engine = s.engine.clone();
            tokio::task::spawn_blocking(move || engine.validate(&req))
                .await
                .map_err(|_| ApiError::internal("Checking the request failed unexpectedly."))?
        };
        let valid = match validated {
            Ok(v) => v,
            Err(e) => {
                let e = ApiError::from(e);
                s.metrics.rejected(e.category);
                s.audit.record(&caller, &audit, Err(e.category), 0.0);
                return Err(e);
            }
        };
        // Network approval over HTTP (an MCP client's user approves through elicitation,
        // before the call gets here).
        let net = &s.engine.config().network;
        let mut permit = permit;
        let by_client = net.approval_by_client && caller.interface == "mcp-http";
        if net.approval && !valid.network().is_empty() && !by_client {
            let run = crate::approvals::PendingRun {
                id: String::new(),
                key_id: caller.key_id.clone(),
                request_id: caller.request_id.clone(),
                language: audit.language().to_string(),
                destinations: valid.network().iter().map(|r| r.to_string()).collect(),
                code_sha256: audit.code_sha256().to_string(),
                code_bytes: audit.code_bytes(),
                requested_at: String::new(),
                expires_at: String::new(),
            };
            let dests = run.destinations.join(", ");
            // The wait holds no place in line: runs waiting for a person must not fill the
            // queue for everyone else (a key may have a few waiting at once).
            drop(permit);
            let decision = s.approvals.wait(run, net.approval_timeout).await;
            let refused = match decision {
                crate::approvals::Decision::Approved => None,
                crate::approvals::Decision::Denied => Some(ApiError::new(
                    axum::http::StatusCode::FORBIDDEN,
                    "approval_denied",
                    format!(
                        "An operator denied this run's network access ({dests}); it did not \
                         run. Run it without \"network\", or ask the operator."
                    ),
                )),
                crate::approvals::Decision::TooMany(n) => Some(ApiError::rate_limited(format!(
                    "This API key already has {n} runs waiting for network approval; wait for \
                     them to be decided."
                ))),
                crate::approvals::Decision::TimedOut => Some(ApiError::new(
                    axum::http::StatusCode::GATEWAY_TIMEOUT,
                    "approval_timeout",
                    format!(
                        "No operator approved this run's network access ({dests}) within {} s; \
                         it did not run.",
                        net.approval_timeout.as_secs()
                    ),
                )),
            };
            if let Some(e) = refused {
                s.metrics.rejected(e.category);
                s.audit.record(&caller, &audit, Err(e.category), 0.0);
                return Err(e);
            }
            // Approved: a place in line again (429 if the server filled up meanwhile).
            permit = state.reserve()?.permit;
        }
        Ok(Admitted {
            state,
            permit: Arc::new(permit),
            req: valid,
            audit,
            caller,
            admitted: Instant::now(),
        })
    }
}

/// A request that may run: it waits for a sandbox slot, runs, and is counted and audited.
pub struct Admitted {
    state: AppState,
    /// Also kept by the response until it is delivered (see [`Admitted::hold_until_delivered`]).
    permit: Arc<OwnedSemaphorePermit>,
    req: ValidRequest,
    audit: AuditRequest,
    caller: Caller,
    admitted: Instant,
}

impl Admitted {
    /// Keep this request's place in line until the response of the HTTP request that carries
    /// `hold` has been delivered (or dropped), and not only until the run is over: a response
    /// waiting for a client that reads slowly holds the verdict in memory.
    pub fn hold_until_delivered(&self, hold: &Hold) {
        hold.keep(self.permit.clone());
    }

    /// Wait for a slot and run. Dropping the future (a client that went away, a cancelled
    /// MCP call) kills the sandbox; the run is still counted and audited, as `cancelled`.
    pub async fn run(self, sink: Box<dyn OutputSink + Send>) -> Result<Verdict, ApiError> {
        let Admitted {
            state,
            permit,
            req,
            audit,
            caller,
            admitted,
        } = self;
        let s = &state.inner;
        let running = {
            let _queued = s.metrics.queued();
            s.running
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ApiError::unavailable("The server is shutting down."))?
        };
        let ks = KillSwitch::new().map_err(|e| {
            tracing::error!(error = %e, "cannot create a kill switch");
            ApiError::unavailable("The server cannot start a run right now. Retry shortly.")
        })?;
        let entry = s.runs.register(ks.clone());
        let st = state.clone();
        let finish = move |verdict: &Verdict| {
            let seconds = admitted.elapsed().as_secs_f64();
            st.inner
                .metrics
                .executed(caller.interface, verdict, seconds);
            st.inner.audit.record(&caller, &audit, Ok(verdict), seconds);
            if let Some(net) = &verdict.network {
                st.inner.metrics.network(net);
                st.inner.audit.network(&caller, net);
            }
        };
        s.engine
            .execute_blocking(req, sink, ks, (permit, running, entry), finish)
            .await
            .map_err(|_| ApiError::internal("The execution failed unexpectedly."))
    }
}

/// A key with its own network entries: what its runs ask for must be within them too (the
/// server's policy is checked by the engine's validation).
fn key_network_check(state: &AppState, req: &ExecRequest, caller: &Caller) -> Result<(), ApiError> {
    let (Some(asked), Some(key)) = (&req.network, &caller.key_id) else {
        return Ok(());
    };
    let Some(allowed) = state.inner.key_networks.get(key) else {
        return Ok(());
    };
    let asked = runcell_proxy::parse_rules(&asked.allow)
        .map_err(|e| ApiError::invalid(format!("Invalid network request: {e}.")))?;
    match runcell_proxy::first_not_covered(allowed, &asked) {
        None => Ok(()),
        Some(r) => {
            let list: Vec<String> = allowed.iter().map(|r| r.to_string()).collect();
            Err(ApiError::invalid(format!(
                "Invalid network request: {r} is not allowed for this API key, which may ask for: {}.",
                if list.is_empty() { "nothing".to_string() } else { list.join(", ") }
            )))
        }
    }
}
