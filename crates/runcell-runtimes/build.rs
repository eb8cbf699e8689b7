//! Test-only cfgs from probes of this host (see build-support/host_probe.rs).

#[path = "../../build-support/host_probe.rs"]
mod host_probe;

fn main() {
    host_probe::emit(&["host_python3"]);
}
