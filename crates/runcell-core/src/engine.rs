//! The engine: validate a request against the policy, find the runtime, build a sandbox, run
//! the program (compiling first where needed) and turn what happened into a verdict.

use std::path::PathBuf;
use std::time::Duration;

use runcell_jail::{
    CgroupLimits, CollectLimits, Enforcement, InputFile, KillSwitch, Outcome, OutputSink, Program,
    Rlimits, Sandbox, SandboxSpec,
};
use runcell_runtimes::{Host, Invocation, Language, Runtime, WORKSPACE};

use crate::limits::{Limits, Policy};
use crate::request::ExecRequest;
use crate::verdict::{classify, lossy, EnforcementReport, ErrorCategory, Phase, Usage, Verdict};

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub policy: Policy,
    /// Refuse to run when any isolation layer is missing.
    pub strict: bool,
    /// The runcell binary, exec'd as the sandbox helper.
    pub helper_exe: PathBuf,
    pub hostname: String,
    /// How long building a sandbox may take.
    pub setup_timeout: Duration,
    /// Where `runcell setup` put prepared runtimes (Python stack, Go cache).
    pub host: Host,
}

impl EngineConfig {
    /// Defaults for this host.
    pub fn for_host() -> EngineConfig {
        let memory = crate::limits::host_memory_bytes("/proc/meminfo".as_ref()).unwrap_or(1 << 30);
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        EngineConfig {
            policy: Policy::for_host(memory, cpus),
            strict: false,
            helper_exe: PathBuf::from("/proc/self/exe"),
            hostname: "runcell".into(),
            setup_timeout: Duration::from_secs(20),
            host: Host::default(),
        }
    }
}

/// Runs requests. Cheap to share between threads.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
}

/// A request that passed validation.
struct Validated {
    language: Language,
    limits: Limits,
    /// The input files, decoded, at their sandbox paths.
    files: Vec<InputFile>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        Engine { config }
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// Check a request against the policy without running anything. The error is the
    /// message of an `invalid_request` verdict.
    fn validate(&self, req: &ExecRequest) -> Result<Validated, String> {
        let language = Language::parse(&req.language).ok_or_else(|| {
            format!(
                "Unknown language '{}'. Use one of: {}.",
                req.language,
                Language::accepted_names()
            )
        })?;
        let p = &self.config.policy;
        if req.code.len() as u64 > p.max_code_bytes {
            return Err(format!(
                "The code is {} bytes, more than the {} byte limit. Send a shorter program.",
                req.code.len(),
                p.max_code_bytes
            ));
        }
        if req.code.contains('\0') {
            return Err("The code contains a NUL byte.".into());
        }
        if let Some(s) = &req.stdin {
            if s.len() as u64 > p.max_stdin_bytes {
                return Err(format!(
                    "stdin is {} bytes, more than the {} byte limit.",
                    s.len(),
                    p.max_stdin_bytes
                ));
            }
        }
        let limits = p
            .resolve(&req.limits)
            .map_err(|e| format!("Invalid limit: {}.", e.message))?;
        let files = self.validate_files(req, language, &limits)?;
        Ok(Validated {
            language,
            limits,
            files,
        })
    }

    /// Decode and check the input files: safe relative paths, one content each, within the
    /// per-file, total and count caps, and within the run's disk limit where they are stored.
    fn validate_files(
        &self,
        req: &ExecRequest,
        language: Language,
        limits: &Limits,
    ) -> Result<Vec<InputFile>, String> {
        use base64::Engine as _;
        let p = &self.config.policy;
        if req.files.len() as u64 > p.max_input_files {
            return Err(format!(
                "{} input files is more than the limit of {}.",
                req.files.len(),
                p.max_input_files
            ));
        }
        let mut seen = std::collections::HashSet::new();
        let mut total = 0u64;
        let mut out = Vec::with_capacity(req.files.len());
        for f in &req.files {
            let rel = crate::request::workspace_path(&f.path)
                .map_err(|e| format!("Invalid file: {e}."))?;
            if rel == language.source_file() {
                return Err(format!(
                    "Invalid file: {rel} is where the code itself is written; give the file another name."
                ));
            }
            if !seen.insert(rel.clone()) {
                return Err(format!("Invalid file: {rel} is given twice."));
            }
            let content = match (&f.content, &f.content_base64) {
                (Some(text), None) => text.clone().into_bytes(),
                (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| {
                        format!("Invalid file: {rel}: content_base64 is not valid base64 ({e}).")
                    })?,
                _ => {
                    return Err(format!(
                        "Invalid file: {rel} needs exactly one of content and content_base64."
                    ))
                }
            };
            if content.len() as u64 > p.max_input_file_bytes {
                return Err(format!(
                    "Invalid file: {rel} is {}, more than the limit of {} per file.",
                    crate::units::format_size(content.len() as u64),
                    crate::units::format_size(p.max_input_file_bytes)
                ));
            }
            total += content.len() as u64;
            out.push(InputFile {
                path: PathBuf::from(WORKSPACE).join(&rel),
                mode: 0o644,
                content,
            });
        }
        // A file cannot also be a directory of another one (nor of the program's own file):
        // "a" and "a/b" would fail while the sandbox is set up, as if the host were at fault.
        for rel in seen
            .iter()
            .map(String::as_str)
            .chain([language.source_file()])
        {
            let mut dirs = rel.match_indices('/').map(|(i, _)| &rel[..i]);
            if let Some(dir) = dirs.find(|d| seen.contains(*d) || *d == language.source_file()) {
                return Err(format!(
                    "Invalid file: {dir} is a file, so it cannot also be the directory of {rel}."
                ));
            }
        }
        let cap = p.max_input_total_bytes.min(limits.disk_bytes);
        if total > cap {
            return Err(format!(
                "The input files total {}, more than {} (the {}).",
                crate::units::format_size(total),
                crate::units::format_size(cap),
                if cap == limits.disk_bytes {
                    "disk limit of the run"
                } else {
                    "limit for input files"
                }
            ));
        }
        Ok(out)
    }

    /// Run a request and return its verdict. Never panics on bad input: every failure is a
    /// verdict with a category.
    pub fn execute(
        &self,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        let v = match self.validate(req) {
            Ok(v) => v,
            Err(message) => return Verdict::failed(ErrorCategory::InvalidRequest, message),
        };
        let runtime = match runcell_runtimes::locate(v.language, &self.config.host) {
            Ok(r) => r,
            Err(e) => {
                let mut verdict = Verdict::failed(ErrorCategory::RuntimeUnavailable, e.to_string());
                verdict.language = Some(v.language.name().into());
                return verdict;
            }
        };
        if self.config.strict {
            let missing: Vec<String> = runcell_jail::layers()
                .into_iter()
                .filter(|l| !l.available)
                .map(|l| l.name.to_string())
                .collect();
            if !missing.is_empty() {
                return Verdict::failed(
                    ErrorCategory::SandboxFailure,
                    format!(
                        "Strict mode: refusing to run because these isolation layers are \
                         missing on this host: {}. Run `runcell doctor` for how to fix them.",
                        missing.join(", ")
                    ),
                );
            }
        }
        let mut verdict = self.run(req, &v, &runtime, sink, cancel);
        verdict.language = Some(v.language.name().into());
        verdict.limits = Some(v.limits);
        verdict
    }

    fn sandbox_spec(&self, limits: &Limits, runtime: &Runtime) -> SandboxSpec {
        SandboxSpec {
            hostname: self.config.hostname.clone(),
            root: runtime.root_entries(),
            scratch_bytes: limits.disk_bytes,
            // One inode per 4 KiB of space, within sane bounds: enough for real work, not
            // enough for a million empty files.
            scratch_inodes: (limits.disk_bytes / 4096).clamp(1024, 1_000_000),
            cgroup: CgroupLimits {
                memory_bytes: Some(limits.memory_bytes),
                pids_max: Some(limits.pids),
                cpu_millis: Some(limits.cpu_millis),
            },
            setup_timeout: self.config.setup_timeout,
            helper_exe: self.config.helper_exe.clone(),
            overlays: runtime.overlays.clone(),
        }
    }

    fn program(
        inv: &Invocation,
        limits: &Limits,
        timeout: Duration,
        runtime: &Runtime,
        enforcement: &Enforcement,
        files: Vec<InputFile>,
        stdin: Option<Vec<u8>>,
    ) -> Program {
        // RLIMIT_CPU is a backstop for the wall clock: the CPU seconds the program could burn
        // at its CPU share over the whole timeout, plus one.
        let cpu_seconds = (timeout.as_secs_f64() * (limits.cpu_millis as f64 / 1000.0).max(1.0))
            .ceil() as u64
            + 1;
        let address_space_bytes = (!enforcement.cgroup_limits.memory
            && runtime.tolerates_address_space_limit())
        .then_some(limits.memory_bytes);
        Program {
            argv: inv.argv.clone(),
            env: inv.env.clone(),
            cwd: PathBuf::from(WORKSPACE),
            files,
            stdin,
            rlimits: Rlimits {
                cpu_seconds,
                open_files: limits.open_files,
                // The sandbox's pid 1 runs as the same uid and counts too. With a pids cgroup
                // the rlimit sits one above it: the kernel checks the rlimit first, and only a
                // refusal by the cgroup is counted (pids.events), which is how a fork bomb is
                // told apart from a program that failed for another reason.
                processes: if enforcement.cgroup_limits.pids {
                    limits.pids + 2
                } else {
                    limits.pids + 1
                },
                file_size_bytes: limits.disk_bytes,
                address_space_bytes,
            },
            wall_timeout: timeout,
            stdout_cap: limits.output_bytes,
            stderr_cap: limits.output_bytes,
        }
    }

    fn run(
        &self,
        req: &ExecRequest,
        v: &Validated,
        runtime: &Runtime,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        let limits = &v.limits;
        let spec = self.sandbox_spec(limits, runtime);
        let mut sandbox = match Sandbox::create(&spec) {
            Ok(s) => s,
            Err(e) => {
                return Verdict::failed(
                    ErrorCategory::SandboxFailure,
                    format!("The sandbox could not be set up ({}). This is a problem with the host, not with the program.", error_chain(&e)),
                )
            }
        };
        // Strict mode checks what this sandbox really got, not only what the host offers:
        // a cgroup hierarchy without the pids controller, swap without accounting, ...
        if self.config.strict {
            let missing = sandbox.enforcement().missing();
            if !missing.is_empty() {
                let mut v = Verdict::failed(
                    ErrorCategory::SandboxFailure,
                    format!(
                        "Strict mode: refusing to run because these isolation layers are \
                         missing: {}. Run `runcell doctor` for how to fix them.",
                        missing.join("; ")
                    ),
                );
                v.enforcement = EnforcementReport::from(sandbox.enforcement());
                return v;
            }
        }
        let plan = runtime.plan();
        let source = InputFile {
            path: plan.source_path.clone(),
            mode: 0o644,
            content: req.code.clone().into_bytes(),
        };
        let enforcement = sandbox.enforcement().clone();

        let mut compile_time = None;
        let mut files = vec![source];
        files.extend(v.files.iter().cloned());
        files.extend(
            runtime
                .sandbox_files
                .iter()
                .map(|(path, content)| InputFile {
                    path: path.clone(),
                    mode: 0o644,
                    content: content.clone(),
                }),
        );
        if let Some(compile) = &plan.compile {
            let program = Self::program(
                compile,
                limits,
                limits.compile_timeout(),
                runtime,
                &enforcement,
                std::mem::take(&mut files),
                None,
            );
            // Compiler output is not the program's output: it is not streamed.
            let outcome = match sandbox.run(&program, &mut runcell_jail::NoSink, cancel) {
                Ok(o) => o,
                Err(e) => return self.sandbox_failed(&sandbox, e),
            };
            compile_time = Some(outcome.wall.as_secs_f64());
            let (code, error) = classify(&outcome, limits, Phase::Compile);
            if error.is_some() {
                let mut verdict = verdict_from(&outcome, code, error, &sandbox);
                verdict.compile_time = compile_time;
                verdict.execution_time = 0.0;
                return verdict;
            }
        }
        let program = Self::program(
            &plan.run,
            limits,
            limits.timeout(),
            runtime,
            &enforcement,
            files,
            req.stdin.clone().map(String::into_bytes),
        );
        let outcome = match sandbox.run(&program, sink, cancel) {
            Ok(o) => o,
            Err(e) => return self.sandbox_failed(&sandbox, e),
        };
        let (code, error) = classify(&outcome, limits, Phase::Run);
        let mut verdict = verdict_from(&outcome, code, error, &sandbox);
        verdict.compile_time = compile_time;
        verdict
            .enforcement
            .missing
            .extend(memory_fallback_note(&sandbox, runtime));
        // Every process of the run is dead now (pid 1 killed and reaped them before it
        // reported); what they left in /workspace is the output. A sandbox killed outright
        // (cancelled, or pid 1 lost) has no files to give.
        if let Ok(collected) = sandbox.collect(&self.collect_limits(limits)) {
            (verdict.files, verdict.files_omitted) = crate::files::to_verdict(collected);
        }
        if let Err(e) = sandbox.destroy() {
            // The run itself is complete; a teardown problem is the host's to fix, but it must
            // not pass unnoticed.
            verdict
                .enforcement
                .missing
                .push(format!("teardown: {}", error_chain(&e)));
        }
        verdict
    }

    fn collect_limits(&self, limits: &Limits) -> CollectLimits {
        let p = &self.config.policy;
        CollectLimits {
            max_files: p.max_output_files,
            max_file_bytes: p.max_output_file_bytes,
            max_total_bytes: p.max_output_total_bytes,
            max_entries: 100_000,
            // All the data a run can hold fits in its disk limit; anything beyond is holes.
            max_read_bytes: limits.disk_bytes,
            deadline_ms: 10_000,
        }
    }

    fn sandbox_failed(&self, sandbox: &Sandbox, e: runcell_jail::SandboxError) -> Verdict {
        if let runcell_jail::SandboxError::InputExceedsMemory = e {
            let mut v = Verdict::failed(
                ErrorCategory::MemoryLimit,
                "The input files, stdin and code do not fit in the memory limit (files in \
                 /workspace are held in memory). Send less data or ask for more memory.",
            );
            v.enforcement = EnforcementReport::from(sandbox.enforcement());
            return v;
        }
        let cause = error_chain(&e);
        let mut v = Verdict::failed(
            ErrorCategory::SandboxFailure,
            format!("The sandbox failed while running the program ({cause}). This is a problem with the host, not with the program."),
        );
        v.enforcement = EnforcementReport::from(sandbox.enforcement());
        v
    }
}

/// An error and its sources, `: `-separated. The jail's errors name the failed step in their
/// message and carry the OS error behind it as their source.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text = format!("{text}: {s}");
        source = s.source();
    }
    text
}

/// What limits memory when the cgroup cannot: RLIMIT_AS per process for runtimes that
/// tolerate it, nothing for Node and Go (they reserve huge address ranges up front).
fn memory_fallback_note(sandbox: &Sandbox, runtime: &Runtime) -> Option<String> {
    if sandbox.enforcement().cgroup_limits.memory {
        return None;
    }
    Some(if runtime.tolerates_address_space_limit() {
        "memory: limited per process only (RLIMIT_AS), not for the run as a whole".to_string()
    } else {
        format!(
            "memory: not limited ({} cannot run under an address-space limit)",
            runtime.language.name()
        )
    })
}

fn verdict_from(
    outcome: &Outcome,
    exit_code: i32,
    error: Option<crate::verdict::VerdictError>,
    sandbox: &Sandbox,
) -> Verdict {
    Verdict {
        stdout: lossy(&outcome.stdout),
        stderr: lossy(&outcome.stderr),
        exit_code: Some(exit_code),
        execution_time: round_secs(outcome.wall),
        stdout_truncated: outcome.stdout_truncated,
        stderr_truncated: outcome.stderr_truncated,
        error,
        usage: Usage {
            cpu_time: round_secs(outcome.cpu),
            peak_memory_bytes: outcome.peak_memory_bytes,
        },
        files: Vec::new(),
        files_omitted: 0,
        enforcement: EnforcementReport::from(sandbox.enforcement()),
        language: None,
        compile_time: None,
        limits: None,
    }
}

fn round_secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine() -> Engine {
        let mut c = EngineConfig::for_host();
        c.policy = Policy::for_host(8 << 30, 2);
        Engine::new(c)
    }

    #[test]
    fn validation_rejects_bad_requests_before_anything_runs() {
        let e = engine();
        let v = e.execute(
            &ExecRequest::new("cobol", "x"),
            &mut runcell_jail::NoSink,
            None,
        );
        assert_eq!(v.category(), Some(ErrorCategory::InvalidRequest));
        assert!(v.error.unwrap().message.contains("python, node"));

        let big = "x".repeat((1 << 20) + 1);
        let v = e.execute(
            &ExecRequest::new("python", big),
            &mut runcell_jail::NoSink,
            None,
        );
        assert_eq!(v.category(), Some(ErrorCategory::InvalidRequest));

        let mut r = ExecRequest::new("python", "print(1)");
        r.limits.memory_bytes = Some(1 << 40);
        let v = e.execute(&r, &mut runcell_jail::NoSink, None);
        let err = v.error.unwrap();
        assert_eq!(err.category, ErrorCategory::InvalidRequest);
        assert!(err.message.contains("memory_bytes"), "{}", err.message);
        assert_eq!(v.exit_code, None);
    }

    #[test]
    fn input_files_that_cannot_all_exist_are_invalid_requests() {
        let e = engine();
        let file = |path: &str| crate::request::InputFile::text(path, "x");
        for paths in [
            vec!["a", "a/b"],
            vec!["a/b/c", "a/b"],
            vec!["a", "a/./b/c"],
            vec!["main.py/x"],
            // Longer than allowed, and cut (in the message) inside a character: no panic.
            vec![&*format!("a{}", "\u{e9}".repeat(600))],
        ] {
            let mut r = ExecRequest::new("python", "print(1)");
            r.files = paths.iter().map(|p| file(p)).collect();
            let v = e.execute(&r, &mut runcell_jail::NoSink, None);
            assert_eq!(
                v.category(),
                Some(ErrorCategory::InvalidRequest),
                "{paths:?}: {:?}",
                v.error
            );
        }
        // Files side by side in a directory are fine.
        let mut r = ExecRequest::new("python", "print(1)");
        r.files = vec![file("d/a"), file("d/b"), file("d2")];
        assert_eq!(
            e.validate_files(&r, Language::Python, &Limits::DEFAULT)
                .map(|f| f.len()),
            Ok(3)
        );
    }
}
