//! `policy.json` to BPF, and BPF to bytes. Shared by `build.rs` (which embeds the result in
//! the crate) and the unit tests (which check that the embedded programs are a fresh compile
//! of the JSON), so both compile the policy the same way.

use std::collections::HashMap;
use std::fmt;

/// Name of the allowlist filter in `policy.json`.
pub const ALLOW: &str = "allow";
/// Name of the deny-list filter in `policy.json`.
pub const DENY: &str = "deny";
/// Name of the filter in `policy.json` whose syscalls return 0 without running.
pub const NOOP: &str = "noop";

/// Bytes per serialised instruction: `code` (u16 LE), `jt`, `jf` (u8 each), `k` (u32 LE), the
/// layout of `struct sock_filter`.
pub const INSN_BYTES: usize = 8;

/// Classic BPF programs are limited to this many instructions (`BPF_MAXINSNS`).
pub const MAX_INSNS: usize = 4096;

/// Why `policy.json` does not compile.
#[derive(Debug)]
pub enum CompileError {
    /// Malformed JSON, a syscall name unknown on the architecture, an invalid condition.
    Json(seccompiler::Error),
    /// The policy lacks one of the three filters.
    MissingFilter(&'static str),
    /// A filter is longer than the kernel accepts.
    TooLong { filter: &'static str, len: usize },
}

impl fmt::Display for CompileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CompileError::Json(e) => write!(f, "seccompiler rejects the policy: {e}"),
            CompileError::MissingFilter(name) => write!(f, "the policy has no {name:?} filter"),
            CompileError::TooLong { filter, len } => write!(
                f,
                "the {filter:?} filter has {len} instructions, more than the kernel's {MAX_INSNS}"
            ),
        }
    }
}

/// The three filters of a policy file, compiled for `arch`.
pub struct Programs {
    pub allow: seccompiler::BpfProgram,
    pub deny: seccompiler::BpfProgram,
    pub noop: seccompiler::BpfProgram,
}

/// Compiles the three filters of a policy file for `arch`.
pub fn compile(json: &[u8], arch: seccompiler::TargetArch) -> Result<Programs, CompileError> {
    let mut map: HashMap<String, seccompiler::BpfProgram> =
        seccompiler::compile_from_json(json, arch).map_err(CompileError::Json)?;
    let mut take = |name: &'static str| {
        let prog = map.remove(name).ok_or(CompileError::MissingFilter(name))?;
        if prog.len() > MAX_INSNS {
            return Err(CompileError::TooLong {
                filter: name,
                len: prog.len(),
            });
        }
        Ok(prog)
    };
    Ok(Programs {
        allow: take(ALLOW)?,
        deny: take(DENY)?,
        noop: take(NOOP)?,
    })
}

/// A program as bytes, [`INSN_BYTES`] per instruction.
pub fn serialize(prog: &[seccompiler::sock_filter]) -> Vec<u8> {
    let mut out = Vec::with_capacity(prog.len() * INSN_BYTES);
    for insn in prog {
        out.extend_from_slice(&insn.code.to_le_bytes());
        out.push(insn.jt);
        out.push(insn.jf);
        out.extend_from_slice(&insn.k.to_le_bytes());
    }
    out
}
