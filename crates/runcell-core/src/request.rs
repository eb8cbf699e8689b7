//! The one request type that the CLI, the HTTP API and MCP all fill in.

use serde::{Deserialize, Serialize};

use crate::limits::LimitOverrides;

/// Run `code` in `language`. Unknown fields are rejected, so a typo in a limit name is an
/// error rather than a silently ignored limit.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
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
    /// Files to place in /workspace before the program starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<InputFile>,
}

/// A file for /workspace: `path` is relative to it; the content is given either as UTF-8 text
/// (`content`) or as base64 (`content_base64`), exactly one of the two.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    pub path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

impl InputFile {
    pub fn text(path: impl Into<String>, content: impl Into<String>) -> Self {
        InputFile {
            path: path.into(),
            content: Some(content.into()),
            content_base64: None,
        }
    }

    pub fn bytes(path: impl Into<String>, content: &[u8]) -> Self {
        use base64::Engine as _;
        InputFile {
            path: path.into(),
            content: None,
            content_base64: Some(base64::engine::general_purpose::STANDARD.encode(content)),
        }
    }
}

/// Check a relative path for /workspace: plain components only, no `..`, not absolute, no
/// empty or `.` components, no NUL, bounded length. Returns the components joined by '/'.
pub fn workspace_path(path: &str) -> Result<String, String> {
    if path.is_empty() {
        return Err("a file path is empty".into());
    }
    if path.len() > 1024 {
        // The first 40 bytes, or fewer: never cut a character in two.
        let mut end = 40;
        while !path.is_char_boundary(end) {
            end -= 1;
        }
        return Err(format!("the file path '{}…' is too long", &path[..end]));
    }
    if path.starts_with('/') {
        return Err(format!(
            "the file path '{path}' is absolute; give a path relative to /workspace"
        ));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => continue,
            ".." => return Err(format!("the file path '{path}' leaves /workspace ('..')")),
            p if p.contains('\0') => return Err("a file path contains a NUL byte".into()),
            p if p.len() > 255 => return Err(format!("a component of '{path}' is too long")),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(format!("the file path '{path}' names no file"));
    }
    Ok(parts.join("/"))
}

impl ExecRequest {
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> Self {
        ExecRequest {
            language: language.into(),
            code: code.into(),
            stdin: None,
            limits: LimitOverrides::default(),
            files: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workspace_paths_cannot_escape() {
        assert_eq!(workspace_path("data.csv").unwrap(), "data.csv");
        assert_eq!(workspace_path("./in//sub/x.txt").unwrap(), "in/sub/x.txt");
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/..",
            ".",
            "./",
            "a\0b",
        ] {
            assert!(workspace_path(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(workspace_path(&"x".repeat(300)).is_err());
    }

    #[test]
    fn input_files_take_text_or_base64() {
        let r: ExecRequest = serde_json::from_str(
            r#"{"language":"python","code":"","files":[{"path":"a.txt","content":"hi"},{"path":"b.bin","content_base64":"AAE="}]}"#,
        )
        .unwrap();
        assert_eq!(r.files[0], InputFile::text("a.txt", "hi"));
        assert_eq!(r.files[1], InputFile::bytes("b.bin", &[0, 1]));
    }

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
