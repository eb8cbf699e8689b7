//! Test-only cfgs from probes of this host (see build-support/host_probe.rs): the unit tests
//! that need a runtime or a real cgroup v1 hierarchy report as ignored where it is missing.

#[path = "../../build-support/host_probe.rs"]
mod host_probe;

fn main() {
    host_probe::emit(&[
        "host_root",
        "host_cgroup_v1",
        "host_node",
        "host_ruby",
        "host_go",
    ]);
}
