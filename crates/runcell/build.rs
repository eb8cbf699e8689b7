//! Test-only cfgs from probes of this host (see build-support/host_probe.rs): the integration
//! tests use them to report a test whose precondition is missing as ignored, never as passed.

#[path = "../../build-support/host_probe.rs"]
mod host_probe;

fn main() {
    commit();
    host_probe::emit(&[
        "host_root",
        "host_cgroup_v2",
        "host_node",
        "host_ruby",
        "host_ruby_in_usr_local",
        "host_go",
        "host_setpriv",
        "host_prlimit",
        "host_unshare",
        "host_nsenter",
        "host_ipcmk",
        "host_python_stack",
        "host_libpython",
        "host_go_cache",
        "host_mcp_client",
        "host_agent_clients",
        "host_test_wheels",
        "host_promtool",
        "host_validators",
        "host_schemathesis",
        "host_ts_mcp_client",
        "host_e2b_sdk",
        "host_e2b_sdk_oldest",
        "host_e2b_js_sdk",
        "host_agent_sandbox_sdk",
    ]);
}

/// The commit this binary is built from (`runcell --version`): `RUNCELL_COMMIT` if set (a
/// build from a tarball), else git's, else "unknown commit".
fn commit() {
    println!("cargo::rerun-if-env-changed=RUNCELL_COMMIT");
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = std::env::var("RUNCELL_COMMIT")
        .ok()
        .or_else(|| git(&["rev-parse", "--short=12", "HEAD"]));
    if let Some(dir) = git(&["rev-parse", "--absolute-git-dir"]) {
        // A new commit moves HEAD or the branch it names.
        println!("cargo::rerun-if-changed={dir}/HEAD");
        if let Some(r) = git(&["symbolic-ref", "-q", "HEAD"]) {
            println!("cargo::rerun-if-changed={dir}/{r}");
        }
    }
    println!(
        "cargo::rustc-env=RUNCELL_COMMIT={}",
        commit.unwrap_or_else(|| "unknown commit".into())
    );
}
