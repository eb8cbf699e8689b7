//! Test-only cfgs from probes of this host (see build-support/host_probe.rs): the integration
//! tests use them to report a test whose precondition is missing as ignored, never as passed.

#[path = "../../build-support/host_probe.rs"]
mod host_probe;

fn main() {
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
        "host_ipcmk",
        "host_python_stack",
        "host_go_cache",
        "host_mcp_client",
        "host_agent_clients",
        "host_test_wheels",
    ]);
}
