//! The one request type that the CLI, the HTTP API and MCP all fill in.

use serde::{Deserialize, Serialize};

use crate::limits::LimitOverrides;

/// Run `code` in `language`. Unknown fields are rejected, so a typo in a limit name is an
/// error rather than a silently ignored limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    /// python, node (or javascript), ruby, go, bash.
    pub language: String,
    /// The program's source.
    pub code: String,
    /// Bytes fed to the program's standard input (otherwise it reads /dev/null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Limits to change from the operator's defaults.
    #[serde(default)]
    pub limits: LimitOverrides,
}

impl ExecRequest {
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> Self {
        ExecRequest {
            language: language.into(),
            code: code.into(),
            stdin: None,
            limits: LimitOverrides::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fields_are_rejected() {
        let ok: ExecRequest = serde_json::from_str(
            r#"{"language":"python","code":"print(1)","limits":{"timeout_ms":500}}"#,
        )
        .unwrap();
        assert_eq!(ok.limits.timeout_ms, Some(500));
        assert!(serde_json::from_str::<ExecRequest>(
            r#"{"language":"python","code":"","timeot":5}"#
        )
        .is_err());
        assert!(serde_json::from_str::<ExecRequest>(
            r#"{"language":"python","code":"","limits":{"memory":5}}"#
        )
        .is_err());
    }
}
