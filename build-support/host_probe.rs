//! Host probes for test-only cfgs, shared by the build scripts of the crates whose tests
//! depend on the host (`#[path]`-included, so no crate depends on it).
//!
//! Why a build script: libtest has no run-time "skip". A test that returns early when its
//! precondition is missing reports as a pass, which hides that it never ran. Probing at build
//! time lets a test say `#[cfg_attr(not(host_ruby), ignore = "needs ruby")]`, and cargo then
//! reports it as ignored, with the reason. scripts/test.sh installs the runtimes, runs
//! `runcell setup` and builds the MCP client's venv before `cargo test`, so there every probe
//! is true and nothing is ignored.
//!
//! Staleness: each probe names what it looked at with `rerun-if-changed`, so installing a
//! runtime or the Python stack re-runs the probe. A path that does not exist is never named
//! (cargo would then re-run the script, and rebuild the crate, on every build); its nearest
//! directory that exists is watched instead, when that directory is small. The user id and
//! the cgroup mounts cannot be watched; a test built under other conditions than it runs
//! under fails loudly rather than passing (see each test's own precondition checks).

#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};

/// Every cfg a probe can set, declared in every crate that includes this file so that a
/// misspelled name is a warning (`unexpected_cfgs`).
pub const ALL: &[&str] = &[
    "host_root",
    "host_cgroup_v1",
    "host_cgroup_v2",
    "host_node",
    "host_ruby",
    "host_ruby_in_usr_local",
    "host_go",
    "host_python3",
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
];

/// The runtimes' executables where runcell looks for them (runcell-runtimes' candidates).
const NODE: &[&str] = &["/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"];
const RUBY: &[&str] = &["/usr/bin/ruby", "/usr/local/bin/ruby"];
const GO: &[&str] = &["/usr/bin/go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"];

/// Declare every cfg, then probe and set the `wanted` ones.
pub fn emit(wanted: &[&str]) {
    for name in ALL {
        println!("cargo::rustc-check-cfg=cfg({name})");
    }
    println!("cargo::rerun-if-changed=../../build-support/host_probe.rs");
    println!("cargo::rerun-if-env-changed=RUNCELL_DATA_DIR");
    println!("cargo::rerun-if-env-changed=RUNCELL_TEST_PYTHON");
    for name in wanted {
        assert!(ALL.contains(name), "unknown host probe {name}");
        if probe(name) {
            println!("cargo::rustc-cfg={name}");
        }
    }
}

fn probe(name: &str) -> bool {
    match name {
        "host_root" => effective_uid() == Some(0),
        "host_cgroup_v1" => cgroup_v1_memory(),
        "host_cgroup_v2" => cgroup_v2_memory(),
        "host_node" => any_file(NODE),
        "host_ruby" => any_file(RUBY),
        "host_ruby_in_usr_local" => any_file(&["/usr/local/bin/ruby"]),
        "host_go" => any_file(GO),
        "host_python3" => any_file(&["/usr/bin/python3"]),
        "host_setpriv" => any_file(&["/usr/bin/setpriv"]),
        "host_prlimit" => any_file(&["/usr/bin/prlimit"]),
        "host_unshare" => any_file(&["/usr/bin/unshare"]),
        "host_nsenter" => any_file(&["/usr/bin/nsenter"]),
        "host_ipcmk" => any_file(&["/usr/bin/ipcmk"]),
        "host_python_stack" => complete_under(&data_dir().join("python"), "runcell/complete"),
        // The shared library templates embed (docs/isolation.md, "Templates").
        "host_libpython" => std::process::Command::new("/usr/bin/python3")
            .args([
                "-I",
                "-c",
                "import os, sysconfig as s; print(os.path.join(s.get_config_var('LIBDIR') or '', s.get_config_var('INSTSONAME') or ''))",
            ])
            .output()
            .ok()
            .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()))
            .is_some_and(|p| p.is_file()),
        "host_go_cache" => complete_under(&data_dir().join("go"), ".runcell-complete"),
        "host_mcp_client" => mcp_client(),
        "host_agent_clients" => venv_with("agent-venv", &["openai", "anthropic"]),
        "host_promtool" => any_file(&["/usr/bin/promtool"]),
        "host_ts_mcp_client" => {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
            let dir = manifest.join("../../target/ts-mcp");
            let _ = fs::create_dir_all(&dir);
            println!("cargo::rerun-if-changed={}", dir.display());
            dir.join("node_modules/@modelcontextprotocol/sdk/package.json")
                .is_file()
        }
        "host_schemathesis" => venv_with("validators-venv", &["schemathesis"]),
        "host_e2b_sdk" => venv_with("e2b-venv", &["e2b", "e2b_code_interpreter"]),
        "host_e2b_sdk_oldest" => venv_with("e2b-old-venv", &["e2b", "e2b_code_interpreter"]),
        "host_agent_sandbox_sdk" => venv_with("agent-sandbox-venv", &["k8s_agent_sandbox"]),
        "host_e2b_js_sdk" => {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
            let dir = manifest.join("../../target/e2b-js");
            let _ = fs::create_dir_all(&dir);
            println!("cargo::rerun-if-changed={}", dir.display());
            dir.join("node_modules/@e2b/code-interpreter/package.json")
                .is_file()
        }
        "host_validators" => venv_with(
            "validators-venv",
            &["openapi_spec_validator", "prometheus_client"],
        ),
        "host_test_wheels" => {
            let manifest =
                PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
            let dir = manifest.join("../../target/test-wheels");
            let _ = fs::create_dir_all(&dir);
            println!("cargo::rerun-if-changed={}", dir.display());
            dir.join("tabulate-0.9.0-py3-none-any.whl").is_file()
        }
        _ => unreachable!(),
    }
}

/// Watch `path` if it exists, else its nearest existing ancestor when that is a small
/// directory (a flat bin directory, an empty parent), else nothing.
fn watch(path: &Path) {
    if path.exists() {
        println!("cargo::rerun-if-changed={}", path.display());
        return;
    }
    let mut dir = path.parent();
    while let Some(d) = dir {
        if d.is_dir() {
            // cargo scans a watched directory recursively: only watch ones that are cheap.
            let small = fs::read_dir(d).map(|e| e.count() <= 4096).unwrap_or(false)
                && !matches!(
                    d.to_str(),
                    Some("/" | "/usr" | "/usr/lib" | "/var" | "/usr/local")
                );
            if small {
                println!("cargo::rerun-if-changed={}", d.display());
            }
            return;
        }
        dir = d.parent();
    }
}

fn any_file(paths: &[&str]) -> bool {
    let mut found = false;
    for p in paths {
        let p = Path::new(p);
        watch(p);
        found |= p.is_file();
    }
    found
}

fn effective_uid() -> Option<u32> {
    let status = fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

/// A cgroup v1 hierarchy with the memory controller is mounted.
fn cgroup_v1_memory() -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo.lines().any(|line| {
        line.split_once(" - ").is_some_and(|(_, tail)| {
            let mut fields = tail.split(' ');
            fields.next() == Some("cgroup")
                && fields
                    .nth(1)
                    .is_some_and(|opts| opts.split(',').any(|o| o == "memory"))
        })
    })
}

/// A cgroup v2 hierarchy is mounted whose root offers the memory controller (a hybrid host's
/// cgroup2 mount, with no controllers, does not count).
fn cgroup_v2_memory() -> bool {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    mountinfo.lines().any(|line| {
        let Some((head, tail)) = line.split_once(" - ") else {
            return false;
        };
        tail.split(' ').next() == Some("cgroup2")
            && head.split(' ').nth(4).is_some_and(|mount_point| {
                fs::read_to_string(Path::new(mount_point).join("cgroup.controllers"))
                    .is_ok_and(|c| c.split_whitespace().any(|c| c == "memory"))
            })
    })
}

/// runcell's data directory, as `runcell setup` chooses it (runcell-runtimes'
/// `default_data_dir`).
fn data_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("RUNCELL_DATA_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d);
    }
    if effective_uid() == Some(0) {
        return PathBuf::from("/var/lib/runcell");
    }
    if let Some(x) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(x).join("runcell");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/tmp".into());
    home.join(".local/share/runcell")
}

/// Some `base/<id>/<marker>` exists: a prepared runtime that `runcell setup` completed. Only
/// the markers are watched, not the trees (thousands of files) under them.
fn complete_under(base: &Path, marker: &str) -> bool {
    let markers: Vec<PathBuf> = fs::read_dir(base)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.path().join(marker))
                .filter(|m| m.is_file())
                .collect()
        })
        .unwrap_or_default();
    if markers.is_empty() {
        // Nothing complete: watch the directory that `runcell setup` will fill.
        if base.is_dir() {
            println!("cargo::rerun-if-changed={}", base.display());
        } else {
            watch(base);
        }
        return false;
    }
    for m in &markers {
        println!("cargo::rerun-if-changed={}", m.display());
    }
    true
}

/// The Python MCP client the MCP tests drive: `RUNCELL_TEST_PYTHON`, or the venv that
/// scripts/test.sh builds in target/mcp-venv with the `mcp` package installed.
fn mcp_client() -> bool {
    if let Some(p) = std::env::var_os("RUNCELL_TEST_PYTHON") {
        let p = PathBuf::from(p);
        watch(&p);
        return p.exists();
    }
    venv_with("mcp-venv", &["mcp"])
}

/// A venv under target/ that scripts/test.sh builds, with each of `packages` installed.
fn venv_with(name: &str, packages: &[&str]) -> bool {
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let venv = manifest.join("../../target").join(name);
    // The venv's place exists even before scripts/test.sh fills it, so that there is always
    // something small to watch (target/ itself changes on every build).
    let _ = fs::create_dir_all(&venv);
    let site: Vec<PathBuf> = fs::read_dir(venv.join("lib"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|py| fs::read_dir(py.path().join("site-packages")).ok())
        .flatten()
        .flatten()
        .map(|e| e.path())
        .collect();
    let dist_infos: Option<Vec<&PathBuf>> = packages
        .iter()
        .map(|p| {
            site.iter().find(|d| {
                let n = d.file_name().unwrap_or_default().to_string_lossy();
                n.starts_with(&format!("{p}-")) && n.ends_with(".dist-info")
            })
        })
        .collect();
    match (venv.join("bin/python").exists(), dist_infos) {
        (true, Some(ds)) => {
            println!(
                "cargo::rerun-if-changed={}",
                venv.join("pyvenv.cfg").display()
            );
            for d in ds {
                println!("cargo::rerun-if-changed={}", d.display());
            }
            true
        }
        _ => {
            println!("cargo::rerun-if-changed={}", venv.display());
            false
        }
    }
}
