//! Resource limits: what a request may ask for, the operator's defaults and maxima, and the
//! validation that turns one into the other before anything is started.

use serde::{Deserialize, Serialize};

use crate::units::{format_duration, format_size};
use std::time::Duration;

/// The limits one run gets. Units are in the field names.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Wall-clock time of the program.
    pub timeout_ms: u64,
    /// Wall-clock time of the compile step (Go).
    pub compile_timeout_ms: u64,
    /// Memory, swap included.
    pub memory_bytes: u64,
    /// CPU bandwidth in thousandths of a core (1000 = one full core).
    pub cpu_millis: u64,
    /// Processes and threads.
    pub pids: u64,
    /// /tmp + /workspace + /dev/shm together.
    pub disk_bytes: u64,
    /// Each of stdout and stderr.
    pub output_bytes: u64,
    /// Open file descriptors per process.
    pub open_files: u64,
}

/// Limits a request asks for; every field is optional and falls back to the policy default.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct LimitOverrides {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compile_timeout_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pids: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disk_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open_files: Option<u64>,
}

impl Limits {
    /// runcell's defaults: 30 s, 1 CPU, 256 MiB, 64 processes, 64 MiB of disk, 1 MiB of output.
    pub const DEFAULT: Limits = Limits {
        timeout_ms: 30_000,
        compile_timeout_ms: 60_000,
        memory_bytes: 256 << 20,
        cpu_millis: 1000,
        pids: 64,
        disk_bytes: 64 << 20,
        output_bytes: 1 << 20,
        open_files: 1024,
    };

    /// The smallest values that still let a runtime start.
    pub const MINIMUM: Limits = Limits {
        timeout_ms: 10,
        compile_timeout_ms: 100,
        memory_bytes: 16 << 20,
        cpu_millis: 10,
        pids: 1,
        disk_bytes: 1 << 20,
        output_bytes: 1,
        open_files: 16,
    };

    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms)
    }
    pub fn compile_timeout(&self) -> Duration {
        Duration::from_millis(self.compile_timeout_ms)
    }

    /// RLIMIT_CPU (soft) for a phase with this timeout: a backstop behind the wall clock, the
    /// CPU seconds the program could burn at its CPU share over the whole timeout, plus one.
    pub fn cpu_rlimit_seconds(&self, timeout: Duration) -> u64 {
        (timeout.as_secs_f64() * (self.cpu_millis as f64 / 1000.0).max(1.0)).ceil() as u64 + 1
    }
}

/// A limit that a request got wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LimitError {
    /// The limit's field name.
    pub limit: &'static str,
    pub message: String,
}

/// One range check: field name, value, minimum, maximum, how to print a value.
type Check<'a> = (&'static str, u64, u64, u64, &'a dyn Fn(u64) -> String);

/// The operator's policy: defaults and the most a request may ask for.
#[derive(
    Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema, utoipa::ToSchema,
)]
pub struct Policy {
    pub defaults: Limits,
    pub max: Limits,
    /// Largest accepted program source.
    pub max_code_bytes: u64,
    /// Largest accepted stdin.
    pub max_stdin_bytes: u64,
    /// Input files: largest single file, and all of them together (also never more than the
    /// run's disk limit, where they are stored).
    pub max_input_file_bytes: u64,
    pub max_input_total_bytes: u64,
    pub max_input_files: u64,
    /// Output files: how many are returned, and up to which size (each, and all together)
    /// their content is included; beyond that only path, size, type and sha256 come back.
    pub max_output_files: u64,
    pub max_output_file_bytes: u64,
    pub max_output_total_bytes: u64,
}

impl Policy {
    /// Maxima for this host: no more memory than it has, no more cores than it has, and
    /// generous but finite caps elsewhere.
    pub fn for_host(host_memory_bytes: u64, host_cpus: u64) -> Policy {
        Policy {
            defaults: Limits::DEFAULT,
            max: Limits {
                timeout_ms: 3_600_000,
                compile_timeout_ms: 600_000,
                memory_bytes: host_memory_bytes.max(Limits::DEFAULT.memory_bytes),
                cpu_millis: host_cpus.max(1) * 1000,
                pids: 4096,
                disk_bytes: 16 << 30,
                output_bytes: 64 << 20,
                open_files: 65_536,
            },
            max_code_bytes: 1 << 20,
            max_stdin_bytes: 16 << 20,
            max_input_file_bytes: 32 << 20,
            max_input_total_bytes: 64 << 20,
            max_input_files: 1000,
            max_output_files: 100,
            max_output_file_bytes: 10 << 20,
            max_output_total_bytes: 32 << 20,
        }
    }

    /// Apply a request's overrides to the defaults and check every value against the minimum
    /// and the maximum. Nothing is clamped silently: out of range is an error naming the limit.
    pub fn resolve(&self, o: &LimitOverrides) -> Result<Limits, LimitError> {
        let d = self.defaults;
        let l = Limits {
            timeout_ms: o.timeout_ms.unwrap_or(d.timeout_ms),
            compile_timeout_ms: o.compile_timeout_ms.unwrap_or(d.compile_timeout_ms),
            memory_bytes: o.memory_bytes.unwrap_or(d.memory_bytes),
            cpu_millis: o.cpu_millis.unwrap_or(d.cpu_millis),
            pids: o.pids.unwrap_or(d.pids),
            disk_bytes: o.disk_bytes.unwrap_or(d.disk_bytes),
            output_bytes: o.output_bytes.unwrap_or(d.output_bytes),
            open_files: o.open_files.unwrap_or(d.open_files),
        };
        let (min, max) = (Limits::MINIMUM, self.max);
        let ms = |v: u64| format_duration(Duration::from_millis(v));
        let cores = |v: u64| format!("{} CPU", v as f64 / 1000.0);
        let plain = |v: u64| v.to_string();
        let checks: [Check<'_>; 8] = [
            (
                "timeout_ms",
                l.timeout_ms,
                min.timeout_ms,
                max.timeout_ms,
                &ms,
            ),
            (
                "compile_timeout_ms",
                l.compile_timeout_ms,
                min.compile_timeout_ms,
                max.compile_timeout_ms,
                &ms,
            ),
            (
                "memory_bytes",
                l.memory_bytes,
                min.memory_bytes,
                max.memory_bytes,
                &format_size,
            ),
            (
                "cpu_millis",
                l.cpu_millis,
                min.cpu_millis,
                max.cpu_millis,
                &cores,
            ),
            ("pids", l.pids, min.pids, max.pids, &plain),
            (
                "disk_bytes",
                l.disk_bytes,
                min.disk_bytes,
                max.disk_bytes,
                &format_size,
            ),
            (
                "output_bytes",
                l.output_bytes,
                min.output_bytes,
                max.output_bytes,
                &format_size,
            ),
            (
                "open_files",
                l.open_files,
                min.open_files,
                max.open_files,
                &plain,
            ),
        ];
        for (name, v, lo, hi, fmt) in checks {
            if v < lo {
                return Err(LimitError {
                    limit: name,
                    message: format!("{name} is {}, below the minimum of {}", fmt(v), fmt(lo)),
                });
            }
            if v > hi {
                return Err(LimitError {
                    limit: name,
                    message: format!("{name} is {}, above the maximum of {}", fmt(v), fmt(hi)),
                });
            }
        }
        Ok(l)
    }
}

/// Total memory of the host from a meminfo file (normally /proc/meminfo).
pub fn host_memory_bytes(meminfo: &std::path::Path) -> Option<u64> {
    runcell_jail::MemInfo::read(meminfo).ok()?.total_bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> Policy {
        Policy::for_host(8 << 30, 2)
    }

    #[test]
    fn defaults_apply_when_nothing_is_asked() {
        assert_eq!(
            policy().resolve(&LimitOverrides::default()).unwrap(),
            Limits::DEFAULT
        );
    }

    #[test]
    fn overrides_within_range_are_taken() {
        let l = policy()
            .resolve(&LimitOverrides {
                timeout_ms: Some(5000),
                memory_bytes: Some(512 << 20),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(l.timeout_ms, 5000);
        assert_eq!(l.memory_bytes, 512 << 20);
        assert_eq!(l.pids, 64);
    }

    #[test]
    fn out_of_range_names_the_limit_and_the_bound() {
        let e = policy()
            .resolve(&LimitOverrides {
                memory_bytes: Some(64 << 30),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.limit, "memory_bytes");
        assert!(
            e.message.contains("above the maximum of 8 GiB"),
            "{}",
            e.message
        );
        let e = policy()
            .resolve(&LimitOverrides {
                cpu_millis: Some(8000),
                ..Default::default()
            })
            .unwrap_err();
        assert!(e.message.contains("2 CPU"), "{}", e.message);
        let e = policy()
            .resolve(&LimitOverrides {
                timeout_ms: Some(0),
                ..Default::default()
            })
            .unwrap_err();
        assert_eq!(e.limit, "timeout_ms");
        assert!(e.message.contains("below the minimum"));
    }

    #[test]
    fn meminfo_is_parsed() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("meminfo");
        std::fs::write(&p, "MemTotal:       24571604 kB\nMemFree: 1 kB\n").unwrap();
        assert_eq!(host_memory_bytes(&p), Some(24571604 * 1024));
        assert_eq!(host_memory_bytes(&dir.path().join("nope")), None);
    }
}
