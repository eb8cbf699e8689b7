//! How errors become messages. One rule for the whole workspace: an error's `Display` says
//! what failed at its own level and never repeats its source; the source is reachable through
//! [`std::error::Error::source`], and the edge that shows an error to a person or a model
//! prints the whole chain with [`chain`].

use std::error::Error;

use serde::{Deserialize, Serialize};

/// "creating the cgroup: writing memory.max: Permission denied (os error 13)": an error and
/// its sources, each once (the jail's implementation, shared by every crate).
pub use runcell_jail::error_chain as chain;

/// The OS error behind a failure, as a verdict reports it.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct OsError {
    /// The errno value (13).
    pub errno: i32,
    /// Its symbolic name (EACCES), when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// The first OS error in an error's chain of sources: an I/O error's errno, or one the sandbox
/// reported from inside (a [`runcell_jail::SandboxError`] knows where to look).
pub fn os_error(e: &(dyn Error + 'static)) -> Option<OsError> {
    let found = match e.downcast_ref::<runcell_jail::SandboxError>() {
        Some(sandbox) => sandbox.os_error(),
        None => {
            let mut cur: Option<&(dyn Error + 'static)> = Some(e);
            let mut found = None;
            while let Some(err) = cur {
                if let Some(os) = err
                    .downcast_ref::<std::io::Error>()
                    .and_then(runcell_jail::OsError::from_io)
                {
                    found = Some(os);
                    break;
                }
                cur = err.source();
            }
            found
        }
    }?;
    Some(OsError {
        errno: found.errno,
        name: found.name.map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("writing memory.max")]
    struct Step(#[source] std::io::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("creating the cgroup")]
    struct Outer(#[source] Step);

    #[test]
    fn the_chain_is_printed_once_and_the_errno_found() {
        let e = Outer(Step(std::io::Error::from_raw_os_error(13)));
        let text = chain(&e);
        assert!(
            text.starts_with("creating the cgroup: writing memory.max: "),
            "{text}"
        );
        assert_eq!(text.matches("os error 13").count(), 1, "{text}");
        let os = os_error(&e).unwrap();
        assert_eq!(os.errno, 13);
        assert_eq!(os.name.as_deref(), Some("EACCES"));
    }
}
