//! `GET /v1/approvals` and `POST /v1/approvals/{id}`: the runs waiting for network approval
//! (`--net-approval`), and an operator's decision. Both need an admin key (`admin = true` in
//! the TOML key entry, or `--admin-key`); a server without keys (loopback only) has no one to
//! tell apart, and lets any caller decide. No key approves its own run: the key that asked for
//! network is the party the approval guards against, admin or not (it may still deny it).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use runcell_core::service::PendingRun;
use runcell_core::Caller;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::error::{ApiError, ErrorBody};
use crate::extract::{Requester, Unlined};
use crate::state::AppState;

/// `GET /v1/approvals`.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct PendingRuns {
    pub approvals: Vec<PendingRun>,
}

/// `POST /v1/approvals/{id}`.
#[derive(Debug, Clone, Deserialize, Serialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DecisionBody {
    /// `approve` or `deny`.
    pub decision: DecisionKind,
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum DecisionKind {
    Approve,
    Deny,
}

/// Refuses (403) a caller whose key is not an admin key, on a server with keys; `what` says
/// what needed it ("Approving runs").
pub(crate) fn require_admin(state: &AppState, caller: &Caller, what: &str) -> Result<(), ApiError> {
    let admin = caller
        .key_id
        .as_ref()
        .is_some_and(|k| state.inner.admin_keys.contains(k));
    if !state.inner.keys.is_empty() && !admin {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "{what} needs an admin key (admin = true in its [[api_keys]] entry, or \
                 --admin-key)."
            ),
        ));
    }
    Ok(())
}

/// The runs waiting for network approval, oldest first.
#[utoipa::path(get, path = "/v1/approvals", tag = "approvals", operation_id = "list_approvals",
    responses(
        (status = 200, description = "The runs waiting for approval", body = PendingRuns),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 403, description = "Not an admin key", body = ErrorBody),
    ))]
pub(crate) async fn list(
    State(state): State<AppState>,
    Requester(caller): Requester,
) -> Result<Json<PendingRuns>, ApiError> {
    require_admin(&state, &caller, "Approving runs")?;
    Ok(Json(PendingRuns {
        approvals: state.service().approvals().list(),
    }))
}

/// Approve or deny one waiting run.
#[utoipa::path(post, path = "/v1/approvals/{id}", tag = "approvals", operation_id = "decide_approval",
    params(("id" = String, Path, description = "The run's id in GET /v1/approvals")),
    request_body = DecisionBody,
    responses(
        (status = 200, description = "Decided: the run goes on or is refused", body = DecisionBody),
        (status = 400, description = "Invalid body", body = ErrorBody),
        (status = 401, description = "No or a wrong API key", body = ErrorBody),
        (status = 403, description = "Not an admin key, or the key that asked for the run approving it", body = ErrorBody),
        (status = 404, description = "No run waits under this id (decided, expired or gone)", body = ErrorBody),
    ))]
pub(crate) async fn decide(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Unlined(mut req): Unlined,
) -> Result<Json<DecisionBody>, ApiError> {
    let caller = &req.caller;
    require_admin(&state, caller, "Approving runs")?;
    let bytes = req.read_json(Some(4096)).await?;
    let d: DecisionBody = super::execute::parse_body(&bytes)?;
    if d.decision == DecisionKind::Approve && req.caller.key_id.is_some() {
        let own = state
            .service()
            .approvals()
            .list()
            .into_iter()
            .any(|p| p.id == id && p.key_id == req.caller.key_id);
        if own {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "A key cannot approve its own run: another admin key must (it may deny it).",
            ));
        }
    }
    if state
        .service()
        .approvals()
        .decide(&id, d.decision == DecisionKind::Approve)
    {
        tracing::info!(approval = %id, decision = ?d.decision, by = ?req.caller.key_id,
            "network approval decided");
        Ok(Json(d))
    } else {
        Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!(
                "No run waits for approval under {id:?}: it was decided, expired or went away."
            ),
        ))
    }
}
