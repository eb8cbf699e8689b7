//! The open-files limit of runcell's own process (not of a sandbox: those get theirs from the
//! request). A server holds one descriptor per client connection and a few per running
//! sandbox; the common soft limit of 1024 is far below what the hard limit allows.

use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};

/// Raise the soft `RLIMIT_NOFILE` to the hard limit (capped at `ceiling`) and return the soft
/// limit now in force. An unlimited hard limit counts as `ceiling`.
/// The hard limit of open files this process (and so every sandbox it starts) has; `None`:
/// unlimited. A sandbox cannot be given more.
pub fn open_files_hard_limit() -> Option<u64> {
    getrlimit(Resource::Nofile).maximum
}

pub fn raise_open_files_limit(ceiling: u64) -> std::io::Result<u64> {
    let now = getrlimit(Resource::Nofile);
    let hard = now.maximum.unwrap_or(ceiling).min(ceiling);
    let soft = now.current.unwrap_or(ceiling);
    if soft >= hard {
        return Ok(soft);
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: now.maximum,
        },
    )?;
    Ok(hard)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Only ever raises the test runner's soft limit (never lowers it below where it was), so
    /// it cannot disturb the tests running beside it.
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one_within_the_ceiling() {
        let before = getrlimit(Resource::Nofile);
        let hard = before.maximum.unwrap_or(1 << 20).min(1 << 20);
        let soft = before.current.unwrap_or(hard);
        assert!(hard >= 2, "a hard open-files limit of {hard}");
        let got = raise_open_files_limit(hard - 1).unwrap();
        assert_eq!(got, soft.max(hard - 1));
        let got = raise_open_files_limit(hard).unwrap();
        assert_eq!(got, hard);
        assert_eq!(getrlimit(Resource::Nofile).current, Some(hard));
        assert_eq!(
            raise_open_files_limit(hard).unwrap(),
            hard,
            "nothing more to do"
        );
    }
}
