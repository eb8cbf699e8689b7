//! What the API says about a session: its description, its files, and the times in them.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::limits::Limits;

/// A session's description (`GET /v1/sessions/{id}`, and the answer to its creation).
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct SessionInfo {
    pub id: String,
    pub language: String,
    /// RFC 3339, UTC.
    pub created_at: String,
    /// When the session ends unless it is used before (RFC 3339, UTC): the idle TTL from its
    /// last use, and never later than its maximum lifetime.
    pub expires_at: String,
    /// Idle seconds before it ends.
    pub ttl: f64,
    /// Calls run so far.
    pub execution_count: u64,
    /// A call is running now.
    pub busy: bool,
    /// `running`, or `paused` (its processes frozen, its memory kept: see
    /// `POST /v1/sessions/{id}/pause`).
    pub state: SessionState,
    /// When it was paused (RFC 3339, UTC); absent while it runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paused_at: Option<String>,
    pub limits: Limits,
    /// The destinations its code may reach through its egress proxy (set when it was
    /// created; empty: no network).
    pub network: Vec<String>,
    /// The packages installed for it when it was created (normalised requirements; empty:
    /// none).
    pub packages: Vec<String>,
}

/// Whether a session's processes may run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    Running,
    Paused,
}

/// One file of a session's /workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct WorkspaceFile {
    /// Relative to /workspace.
    pub path: String,
    pub size: u64,
}

/// The files of a session's /workspace (`GET /v1/sessions/{id}/files`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema, utoipa::ToSchema)]
pub struct WorkspaceListing {
    pub files: Vec<WorkspaceFile>,
    /// Files left out (past the listing's caps, or names that cannot be returned faithfully).
    pub omitted: u64,
}

/// `t` as RFC 3339 in UTC, to the second.
pub fn rfc3339(t: SystemTime) -> String {
    let secs = t
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_dates() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_795_000_000);
        assert_eq!(rfc3339(t), "2026-11-18T11:06:40Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00Z");
    }
}
