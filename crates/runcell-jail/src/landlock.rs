//! Landlock: the sandboxed program may write only under /tmp, /workspace and /dev/shm (and to
//! the harmless character devices), and read/execute the rest of its (already minimal) tree.
//!
//! The mount namespace already hides the host; Landlock is the second, independent layer: even
//! if a bind mount were ever writable by mistake, the program could not write through it. With
//! ABI 6 it also scopes abstract unix sockets and signals to the sandbox's own domain, so the
//! program cannot signal the sandbox's pid 1 (which is outside the domain).

use landlock::{
    path_beneath_rules, Access, AccessFs, CompatLevel, Compatible, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetError, RulesetStatus, Scope, ABI,
};

use crate::protocol::LandlockStatus;

/// Directories where the program may create, write and delete.
pub const WRITABLE_DIRS: &[&str] = &["/tmp", "/workspace", "/dev/shm"];
/// Devices the program may open for writing.
pub const WRITABLE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full"];

/// Restrict the calling thread (and its future children). Best effort across kernels: the
/// returned status says what was enforced, and is reported in the verdict.
pub fn restrict_self() -> Result<LandlockStatus, RulesetError> {
    let abi = ABI::V6;
    let status = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))?
        .scope(Scope::AbstractUnixSocket)?
        .scope(Scope::Signal)?
        .create()?
        .add_rules(path_beneath_rules(["/"], AccessFs::from_read(abi)))?
        .add_rules(path_beneath_rules(WRITABLE_DIRS, AccessFs::from_all(abi)))?
        .add_rules(path_beneath_rules(
            WRITABLE_DEVICES,
            AccessFs::WriteFile | AccessFs::ReadFile | AccessFs::IoctlDev,
        ))?
        .restrict_self()?;
    Ok(match status.ruleset {
        RulesetStatus::FullyEnforced => LandlockStatus::Full,
        RulesetStatus::PartiallyEnforced => LandlockStatus::Partial,
        RulesetStatus::NotEnforced => LandlockStatus::None,
    })
}
