//! Two jobs, both about this build:
//!
//! * Compiles the seccomp policy (`src/seccomp/policy.json`, the reviewed source of truth) to
//!   classic BPF for the target architecture, as Firecracker does with seccompiler, and writes
//!   the three programs to `OUT_DIR`, where `src/seccomp/mod.rs` embeds them. The sandbox's pid 1
//!   then installs ready-made programs instead of parsing JSON on every start.
//! * Test-only cfgs from probes of this host (see build-support/host_probe.rs): the unit tests
//!   that need a runtime or a real cgroup v1 or v2 hierarchy report as ignored where it is
//!   missing.

#[path = "src/seccomp/compile.rs"]
mod compile;
#[path = "../../build-support/host_probe.rs"]
mod host_probe;

use std::path::PathBuf;

const POLICY: &str = "src/seccomp/policy.json";

fn main() {
    host_probe::emit(&[
        "host_root",
        "host_cgroup_v1",
        "host_cgroup_v2",
        "host_node",
        "host_ruby",
        "host_go",
    ]);
    println!("cargo:rerun-if-changed={POLICY}");
    println!("cargo:rerun-if-changed=src/seccomp/compile.rs");
    println!("cargo:rerun-if-changed=build.rs");

    let target_arch = std::env::var("CARGO_CFG_TARGET_ARCH").expect("cargo sets the target arch");
    // policy.json names x86_64 syscalls (open, stat, fork, arch_prctl, ... do not exist on
    // aarch64 or riscv64, which seccompiler also supports): another architecture needs its
    // own reviewed policy, not a silent translation of this one.
    let arch = match target_arch.as_str() {
        "x86_64" => seccompiler::TargetArch::x86_64,
        other => panic!(
            "runcell-jail: no seccomp policy for the {other} architecture. {POLICY} is written \
             for x86_64 (its syscall names and argument checks are x86_64's); write and review a \
             policy for {other} before building runcell there."
        ),
    };
    let json =
        std::fs::read(POLICY).unwrap_or_else(|e| panic!("runcell-jail: reading {POLICY}: {e}"));
    let programs = compile::compile(&json, arch).unwrap_or_else(|e| {
        panic!("runcell-jail: {POLICY} does not compile for {target_arch}: {e}")
    });
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    for (name, prog) in [
        (compile::ALLOW, &programs.allow),
        (compile::DENY, &programs.deny),
        (compile::NOOP, &programs.noop),
    ] {
        let path = out.join(format!("seccomp_{name}.bpf"));
        std::fs::write(&path, compile::serialize(prog))
            .unwrap_or_else(|e| panic!("runcell-jail: writing {}: {e}", path.display()));
    }
}
