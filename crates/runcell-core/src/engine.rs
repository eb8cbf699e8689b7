//! The engine: validate a request against the policy, find the runtime, build a sandbox, run
//! the program (compiling first where needed) and turn what happened into a verdict.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use runcell_jail::{
    CgroupLimits, CollectLimits, Enforcement, InputFile, IoLimits, KillSwitch, Outcome, OutputSink,
    Program, Rlimits, Sandbox, SandboxSpec,
};
use runcell_runtimes::{Host, Invocation, Language, Runtime, WORKSPACE};

use crate::limits::{FileTableError, Limit, LimitError, LimitOverrides, LimitPolicy, Limits};
use crate::pool::{Held, Pool, PoolSizes, PoolStats, Preload, SandboxKey, Warm};
use crate::request::{workspace_path, ExecRequest, PathError};
use crate::units::format_size;
use crate::verdict::{classify, lossy, EnforcementReport, ErrorCategory, Phase, Usage, Verdict};

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    pub policy: LimitPolicy,
    /// Refuse to run when any isolation layer is missing.
    pub strict: bool,
    /// The runcell binary, exec'd as the sandbox helper.
    pub helper_exe: PathBuf,
    pub hostname: String,
    /// How long building a sandbox may take.
    pub setup_timeout: Duration,
    /// Where `runcell setup` put prepared runtimes (Python stack, Go cache).
    pub host: Host,
    /// The memory all runs may use together (the memory runcell may use, less a reserve for
    /// the server and, on a bare host, for the host): the limit of the cgroup every run's
    /// group is made in, and the budget of the memory ledger (runs, sessions, warm sandboxes).
    /// `None`: no such limit.
    pub all_runs_memory_bytes: Option<u64>,
    /// The memory runcell may use and where the figure came from (the machine's, or the limit
    /// of the cgroup it runs in): what `all_runs_memory_bytes` was derived from.
    pub memory: Option<runcell_jail::MemoryCeiling>,
    /// The disk the host's files a run sees are on (`major:minor`), whose reads and writes
    /// the `io_read` and `io_write` limits throttle. `None`: not on a block device.
    pub io_device: Option<(u32, u32)>,
    /// Which destinations runs may ask for, and how much network each may use.
    pub network: crate::network::NetworkPolicy,
    /// Which packages runs may ask for, and from where.
    pub packages: crate::packages::PackagePolicy,
    /// Fork Python interpreters from templates (docs/isolation.md, "Templates") where the
    /// host allows it: `serve` turns it on by default, the one-run commands leave it off.
    pub templates: bool,
}

impl EngineConfig {
    /// Defaults for this host.
    pub fn for_host() -> EngineConfig {
        // The machine's memory, or less: the limit of the cgroup runcell runs in (a container,
        // a pod, a unit with MemoryMax=), which is what the kernel enforces.
        let memory = runcell_jail::memory_ceiling(
            "/proc/meminfo".as_ref(),
            "/proc/self/mountinfo".as_ref(),
            "/proc/self/cgroup".as_ref(),
        );
        // Cores are already the container's: available_parallelism honours cgroup CPU quotas.
        let cpus = std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1);
        // What runs may use of it: all but a reserve for the server (and the host).
        let usable = memory
            .as_ref()
            .map(|m| crate::limits::usable_memory_of(m.bytes, m.source.is_cgroup()));
        let mut policy = LimitPolicy::for_host(usable.unwrap_or(1 << 30), cpus);
        // A sandbox inherits this process's hard limit of open files: more cannot be granted,
        // so it cannot be offered either.
        if let Some(hard) = runcell_jail::open_files_hard_limit() {
            policy.clamp_open_files(hard);
        }
        // The runtimes and their libraries are read from /usr.
        let disk = runcell_jail::block_device_of("/usr".as_ref(), "/sys/dev/block".as_ref());
        if let Some(d) = disk {
            let (read, write) = crate::limits::io_defaults(d.rotational);
            policy.defaults.io_read = crate::limits::Bytes(read);
            policy.defaults.io_write = crate::limits::Bytes(write);
        }
        if let Some(file_max) = crate::limits::host_file_max("/proc/sys/fs/file-max".as_ref()) {
            // One run at a time (the CLI); a server shares it again by its concurrency.
            policy.share_file_table(file_max, 1);
        }
        EngineConfig {
            policy,
            strict: false,
            helper_exe: PathBuf::from("/proc/self/exe"),
            hostname: "runcell".into(),
            setup_timeout: Duration::from_secs(20),
            host: Host::default(),
            all_runs_memory_bytes: usable,
            memory,
            io_device: disk.map(|d| (d.major, d.minor)),
            network: Default::default(),
            packages: Default::default(),
            templates: false,
        }
    }
}

/// Runs requests. Cheap to share between threads.
#[derive(Debug, Clone)]
pub struct Engine {
    config: EngineConfig,
    /// Warm sandboxes, when a pool was started ([`Engine::start_pool`]). Shared by the
    /// engine's clones; the last one dropped destroys the warm sandboxes.
    pool: Option<Arc<Pool>>,
    /// What the warm pool holds while idle (see [`crate::pool::warm_reserve_bytes`]).
    warm_reserve: u64,
    /// Runtimes located in the last [`RUNTIME_TTL`], shared by the engine's clones.
    runtimes: Arc<Mutex<HashMap<Language, (Instant, Runtime)>>>,
    /// Package installs in flight, shared by the engine's clones (see [`crate::packages`]).
    packages: crate::packages::Packages,
    /// The templates interpreters are forked from, shared by the engine's clones, its pool
    /// and its sessions.
    templates: Arc<crate::templates::Templates>,
    /// The modules the warm pool's interpreters import (and so the templates').
    preload: Preload,
}

/// How long a located runtime is reused. Locating one reads a dozen files (the Python
/// stack's marker and its font cache among them): off a warm run's path, which takes about a
/// millisecond in all, while a runtime installed or upgraded is seen within seconds.
const RUNTIME_TTL: Duration = Duration::from_secs(2);

/// A request that passed [`Engine::validate`]: everything it asks is within the policy, its
/// input files are decoded, and it can run.
#[derive(Debug, Clone)]
pub struct ValidRequest {
    language: Language,
    limits: Limits,
    code: String,
    stdin: Option<Vec<u8>>,
    /// The input files, decoded, at their sandbox paths.
    files: Vec<InputFile>,
    /// The destinations the run may reach; empty: no network.
    network: Vec<runcell_proxy::NetRule>,
    /// The packages to install for it (Python).
    packages: Vec<crate::packages::Requirement>,
    /// Environment variables the request adds for its program.
    env: Vec<(String, String)>,
}

/// Environment variables a request may add, at most, and their names and values together.
pub const MAX_ENV_VARS: usize = 64;
pub const MAX_ENV_BYTES: u64 = 64 << 10;

/// A request's `env` checked: names a shell would take, values without NUL, within the caps.
fn checked_env(
    env: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<(String, String)>, ValidationError> {
    if env.len() > MAX_ENV_VARS {
        return Err(ValidationError::Env(format!(
            "{} variables is more than the limit of {MAX_ENV_VARS}",
            env.len()
        )));
    }
    let total: u64 = env.iter().map(|(k, v)| (k.len() + v.len()) as u64).sum();
    if total > MAX_ENV_BYTES {
        return Err(ValidationError::Env(format!(
            "the variables hold {}, more than the limit of {}",
            format_size(total),
            format_size(MAX_ENV_BYTES)
        )));
    }
    for (k, v) in env {
        let name_ok = k.len() <= 128
            && k.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !name_ok {
            return Err(ValidationError::Env(format!(
                "{:?} is not a variable name (letters, digits and underscores, not starting \
                 with a digit)",
                crate::request::prefix(k, 64)
            )));
        }
        if v.contains('\0') {
            return Err(ValidationError::Env(format!(
                "the value of {k} contains a NUL byte"
            )));
        }
        if runcell_runtimes::RESERVED_ENV.contains(&k.as_str()) {
            return Err(ValidationError::Env(format!(
                "{k} is set by runcell for the runtime; it cannot be changed"
            )));
        }
    }
    Ok(env.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// `runtime` with a request's environment variables, which must not name any runcell sets for
/// it (its PATH, HOME, the interpreter's settings, a package layer's PYTHONPATH, the proxy's
/// variables): the verdict's refusal names the first.
pub(crate) fn with_request_env(
    runtime: &Runtime,
    env: &[(String, String)],
) -> Result<Runtime, String> {
    if env.is_empty() {
        return Ok(runtime.clone());
    }
    let plan = runtime.plan();
    let interpreter = runtime.interpreter(&[], true);
    let ours: Vec<&str> = plan
        .run
        .env
        .iter()
        .chain(plan.compile.iter().flat_map(|c| c.env.iter()))
        .chain(interpreter.iter().flat_map(|i| i.env.iter()))
        .map(|(k, _)| k.as_str())
        .filter(|k| !runcell_runtimes::OVERRIDABLE_ENV.contains(k))
        .collect();
    if let Some((k, _)) = env.iter().find(|(k, _)| ours.contains(&k.as_str())) {
        return Err(format!(
            "Invalid env: {k} is set by runcell for this run; it cannot be changed."
        ));
    }
    let mut rt = runtime.clone();
    // What runcell sets that a request may change (the data stack's thread counts) is the
    // request's value, once.
    rt.extra_env
        .retain(|(k, _)| !env.iter().any(|(e, _)| e == k));
    rt.extra_env.extend(env.iter().cloned());
    Ok(rt)
}

impl ValidRequest {
    pub fn language(&self) -> Language {
        self.language
    }

    /// The destinations the run may reach (empty: no network).
    pub fn network(&self) -> &[runcell_proxy::NetRule] {
        &self.network
    }

    /// The packages to install for it (Python; empty: none).
    pub fn packages(&self) -> &[crate::packages::Requirement] {
        &self.packages
    }

    /// The limits the run gets.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// The input files, decoded, at their sandbox paths.
    pub fn files(&self) -> &[InputFile] {
        &self.files
    }

    /// The environment variables the request adds.
    pub fn env(&self) -> &[(String, String)] {
        &self.env
    }
}

/// What a request got wrong, found before anything runs. The `Display` text is a message a
/// model (or a person) can act on; front ends build their own answers from the fields.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    /// The name is cut to 64 characters: it can be as large as the request.
    #[error("Unknown language '{0}'. Use one of: {accepted}.", accepted = Language::accepted_names())]
    UnknownLanguage(String),
    #[error("The code is {bytes} bytes, more than the {max} byte limit. Send a shorter program.")]
    CodeTooLarge { bytes: u64, max: u64 },
    #[error("The code contains a NUL byte.")]
    CodeHasNul,
    #[error("stdin is {bytes} bytes, more than the {max} byte limit.")]
    StdinTooLarge { bytes: u64, max: u64 },
    /// A limit outside its range: which limit, its value, the minimum and the maximum.
    #[error("Invalid limit: {0}.")]
    Limit(LimitError),
    #[error("Invalid limits: {0}.")]
    FileTable(FileTableError),
    #[error("{count} input files is more than the limit of {max}.")]
    TooManyFiles { count: u64, max: u64 },
    #[error("Invalid file: {0}.")]
    FilePath(PathError),
    #[error("Invalid file: {0} is where the code itself is written; give the file another name.")]
    FileIsSource(String),
    #[error("Invalid file: {0} is given twice.")]
    FileTwice(String),
    #[error("{0}")]
    Network(crate::network::NetworkError),
    #[error("Invalid packages: {0}.")]
    Packages(String),
    #[error("Invalid env: {0}.")]
    Env(String),
    #[error("Invalid file: {0} needs exactly one of content and content_base64.")]
    FileContent(String),
    #[error("Invalid file: {path}: content_base64 is not valid base64 ({reason}).")]
    FileBase64 { path: String, reason: String },
    #[error("Invalid file: {path} is {}, more than the limit of {} per file.", format_size(*.bytes), format_size(*.max))]
    FileTooLarge { path: String, bytes: u64, max: u64 },
    #[error("Invalid file: {dir} is a file, so it cannot also be the directory of {path}.")]
    FileUnderFile { dir: String, path: String },
    #[error("The input files total {}, more than {} (the {}).", format_size(*.total), format_size(*.cap),
        if *.disk_bound { "disk limit of the run" } else { "limit for input files" })]
    InputTooLarge {
        total: u64,
        cap: u64,
        disk_bound: bool,
    },
}

impl ValidationError {
    /// The limit the error is about, if it is about one.
    pub fn limit(&self) -> Option<Limit> {
        match self {
            ValidationError::Limit(e) => Some(e.limit),
            ValidationError::FileTable(_) => Some(Limit::OpenFiles),
            _ => None,
        }
    }
}

impl From<LimitError> for ValidationError {
    fn from(e: LimitError) -> Self {
        ValidationError::Limit(e)
    }
}

/// A language as the host has it: available with its version (and, for Python, the data
/// stack's packages), or unavailable and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeStatus {
    pub language: Language,
    pub version: Option<String>,
    /// Python only: the installed distributions (name, version), when `runcell setup` has
    /// installed the data stack.
    pub packages: Option<Vec<(String, String)>>,
    /// Why it cannot run here; `None` when it can.
    pub unavailable: Option<String>,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Self {
        let templates = Arc::new(crate::templates::Templates::new(
            config.templates,
            &config.helper_exe,
        ));
        Engine {
            config,
            pool: None,
            warm_reserve: 0,
            runtimes: Arc::default(),
            packages: Default::default(),
            templates,
            preload: Preload::default(),
        }
    }

    /// The runtime of `language` on this host (see [`RUNTIME_TTL`]).
    pub(crate) fn locate(
        &self,
        language: Language,
    ) -> Result<Runtime, runcell_runtimes::Unavailable> {
        let mut cache = self.runtimes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, rt)) = cache.get(&language) {
            if at.elapsed() < RUNTIME_TTL {
                return Ok(rt.clone());
            }
        }
        let rt = runcell_runtimes::locate(language, &self.config.host)?;
        cache.insert(language, (Instant::now(), rt.clone()));
        Ok(rt)
    }

    /// Keep warm sandboxes ready: `sizes` per language, built with the policy's default
    /// limits (see [`crate::pool`] for which requests they fit), with the language's warm
    /// interpreter started in them where it has one (Python), after importing `preload`.
    /// Languages this host cannot run get no pool. Replaces a pool started before.
    pub fn start_pool(&mut self, sizes: &PoolSizes, preload: &Preload) {
        // Sessions' and cold one-shot runs' interpreters import these too when forked from a
        // template, whether or not a pool is kept.
        self.preload = preload.clone();
        let defaults = match self.config.policy.resolve(&LimitOverrides::default()) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "the default limits are outside the policy: no warm pool");
                return;
            }
        };
        let slots: Vec<(SandboxKey, usize)> = sizes
            .0
            .iter()
            .filter(|(_, &n)| n > 0)
            .filter(|(&language, _)| runcell_runtimes::locate(language, &self.config.host).is_ok())
            .map(|(&language, &n)| (SandboxKey::new(language, &defaults), n))
            .collect();
        self.pool = None;
        self.warm_reserve = 0;
        if slots.is_empty() {
            return;
        }
        let started = PoolSizes(slots.iter().map(|(k, n)| (k.language, *n)).collect());
        self.warm_reserve = crate::pool::warm_reserve_bytes(&started, preload);
        let config = self.config.clone();
        let preload = preload.clone();
        let templates = self.templates.clone();
        // A warm interpreter keeps its CPU rlimit for whatever timeout its request will ask:
        // the longest the policy allows (the wall clock is the supervisor's, per request).
        let longest = self.config.policy.max.timeout();
        let build = move |key: &SandboxKey| -> Result<Warm, String> {
            let runtime =
                runcell_runtimes::locate(key.language, &config.host).map_err(|e| e.to_string())?;
            let limits = key.apply(defaults);
            let spec = sandbox_spec(&config, &limits, &runtime);
            let mut sandbox = Sandbox::create(&spec).map_err(|e| crate::error::chain(&e))?;
            let inv_preload = preload.of(key.language).to_vec();
            let Some(inv) = runtime.interpreter(&inv_preload, false) else {
                return Ok(Warm {
                    sandbox,
                    interpreter: false,
                    built: std::time::Instant::now(),
                });
            };
            let enforcement = sandbox.enforcement().clone();
            let files = sandbox_files(&runtime);
            let mut program =
                Engine::program(&inv, &limits, longest, &runtime, &enforcement, files, None);
            program.wall_timeout = INTERPRETER_START_TIMEOUT;
            let started =
                templates.start_interpreter(&mut sandbox, &program, key.language, &inv_preload);
            match started {
                Ok(None) => Ok(Warm {
                    sandbox,
                    interpreter: true,
                    built: std::time::Instant::now(),
                }),
                Ok(Some(outcome)) => Err(format!(
                    "the warm interpreter ended while starting ({:?}): {}",
                    outcome.end,
                    String::from_utf8_lossy(&outcome.stderr).trim_end()
                )),
                Err(e) => Err(crate::error::chain(&e)),
            }
        };
        self.pool = Some(Arc::new(Pool::start(slots, Box::new(build))));
    }

    /// The memory ledger's budget: what all runs may use together, less what the warm pool
    /// holds. `None`: the memory is unknown.
    /// The templates interpreters are forked from.
    pub fn templates(&self) -> &Arc<crate::templates::Templates> {
        &self.templates
    }

    /// The modules a warm interpreter of `language` imports before its first cell: the pool's
    /// preloads when its interpreters are forked from templates (a session's too, so that it
    /// forks from the same template), none otherwise.
    pub fn interpreter_preload(&self, language: Language) -> Vec<String> {
        if self.templates.enabled() {
            self.preload.of(language).to_vec()
        } else {
            Vec::new()
        }
    }

    pub fn memory_budget(&self) -> Option<u64> {
        self.config
            .all_runs_memory_bytes
            .map(|all| all.saturating_sub(self.warm_reserve))
    }

    /// The warm pool's figures per language (empty without a pool).
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pool.as_ref().map(|p| p.stats()).unwrap_or_default()
    }

    /// Wait until the warm pool is full, at most `within`; whether it is (true without a
    /// pool). For tests and benchmarks.
    pub fn wait_pool_filled(&self, within: Duration) -> bool {
        self.pool.as_ref().is_none_or(|p| p.wait_filled(within))
    }

    /// The package layers (a session installs its own when it is created).
    pub(crate) fn package_layers(&self) -> &crate::packages::Packages {
        &self.packages
    }

    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    pub fn policy(&self) -> &LimitPolicy {
        &self.config.policy
    }

    /// Every language and whether this host can run it. Asking a runtime its version runs
    /// host programs: call it from a blocking context.
    pub fn runtimes(&self) -> Vec<RuntimeStatus> {
        Language::ALL
            .iter()
            .map(
                |&language| match runcell_runtimes::locate(language, &self.config.host) {
                    Ok(rt) => RuntimeStatus {
                        language,
                        version: rt.version(),
                        packages: rt.python_stack.clone(),
                        unavailable: None,
                    },
                    Err(e) => RuntimeStatus {
                        language,
                        version: None,
                        packages: None,
                        unavailable: Some(e.to_string()),
                    },
                },
            )
            .collect()
    }

    /// Check a request against the policy without running anything: the language, the sizes
    /// of code and stdin, every limit, and the input files (decoded here, once).
    pub fn validate(&self, req: &ExecRequest) -> Result<ValidRequest, ValidationError> {
        let asked = req.language();
        let language = Language::parse(asked).ok_or_else(|| {
            let mut name = crate::request::prefix(asked, 64).to_string();
            if name.len() < asked.len() {
                name.push('…');
            }
            ValidationError::UnknownLanguage(name)
        })?;
        let p = &self.config.policy;
        let code = req.code();
        if code.len() as u64 > p.max_code_bytes {
            return Err(ValidationError::CodeTooLarge {
                bytes: code.len() as u64,
                max: p.max_code_bytes,
            });
        }
        if code.contains('\0') {
            return Err(ValidationError::CodeHasNul);
        }
        if let Some(s) = &req.stdin {
            if s.len() as u64 > p.max_stdin_bytes {
                return Err(ValidationError::StdinTooLarge {
                    bytes: s.len() as u64,
                    max: p.max_stdin_bytes,
                });
            }
        }
        let limits = p.resolve(&req.limits)?;
        p.check_file_table(&limits)
            .map_err(ValidationError::FileTable)?;
        let files = self.validate_files(req, language, &limits)?;
        let network = match &req.network {
            None => Vec::new(),
            Some(n) => self
                .config
                .network
                .check(&n.allow)
                .map_err(ValidationError::Network)?,
        };
        let packages = if req.packages.is_empty() {
            Vec::new()
        } else if language != Language::Python {
            return Err(ValidationError::Packages(format!(
                "packages are installed for Python runs only, not {}",
                language.name()
            )));
        } else {
            crate::packages::check(&req.packages, &self.config.packages)
                .map_err(ValidationError::Packages)?
        };
        Ok(ValidRequest {
            language,
            limits,
            code: code.to_string(),
            stdin: req.stdin.clone().map(String::into_bytes),
            files,
            network,
            packages,
            env: checked_env(&req.env)?,
        })
    }

    /// Decode and check the input files: safe relative paths, one content each, within the
    /// per-file, total and count caps, and within the run's disk limit where they are stored.
    fn validate_files(
        &self,
        req: &ExecRequest,
        language: Language,
        limits: &Limits,
    ) -> Result<Vec<InputFile>, ValidationError> {
        use base64::Engine as _;
        let p = &self.config.policy;
        if req.files.len() as u64 > p.max_input_files {
            return Err(ValidationError::TooManyFiles {
                count: req.files.len() as u64,
                max: p.max_input_files,
            });
        }
        let mut seen = std::collections::HashSet::new();
        let mut total = 0u64;
        let mut out = Vec::with_capacity(req.files.len());
        for f in &req.files {
            let rel = workspace_path(&f.path).map_err(ValidationError::FilePath)?;
            if rel == language.source_file() {
                return Err(ValidationError::FileIsSource(rel));
            }
            if !seen.insert(rel.clone()) {
                return Err(ValidationError::FileTwice(rel));
            }
            let content = match (&f.content, &f.content_base64) {
                (Some(text), None) => text.clone().into_bytes(),
                (None, Some(b64)) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| ValidationError::FileBase64 {
                        path: rel.clone(),
                        reason: e.to_string(),
                    })?,
                _ => return Err(ValidationError::FileContent(rel)),
            };
            if content.len() as u64 > p.max_input_file_bytes {
                return Err(ValidationError::FileTooLarge {
                    path: rel,
                    bytes: content.len() as u64,
                    max: p.max_input_file_bytes,
                });
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
                return Err(ValidationError::FileUnderFile {
                    dir: dir.to_string(),
                    path: rel.to_string(),
                });
            }
        }
        let cap = p.max_input_total_bytes.min(limits.disk.0);
        if total > cap {
            return Err(ValidationError::InputTooLarge {
                total,
                cap,
                disk_bound: cap == limits.disk.0,
            });
        }
        Ok(out)
    }

    /// Validate and run a request. Never panics on bad input: every failure is a verdict with
    /// a category (an invalid request is an `invalid_request` verdict).
    pub fn execute(
        &self,
        req: &ExecRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        match self.validate(req) {
            Ok(v) => self.execute_valid(&v, sink, cancel),
            Err(e) => Verdict::failed(ErrorCategory::InvalidRequest, e.to_string()),
        }
    }

    /// Run a validated request: find the runtime, build a sandbox, compile where needed, run,
    /// collect the output files and tear the sandbox down.
    pub fn execute_valid(
        &self,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> Verdict {
        self.execute_valid_holding(v, sink, cancel, Box::new(()))
    }

    /// [`execute_valid`](Self::execute_valid), keeping `held` (a run's admission slot and
    /// its memory on the ledger) until the run's sandbox is torn down, which a server does
    /// after the verdict, off the request's path: the slot must not admit the next run
    /// while this run's sandbox still holds its memory and cgroup.
    pub fn execute_valid_holding(
        &self,
        v: &ValidRequest,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        held: Held,
    ) -> Verdict {
        let mut runtime = match self.locate(v.language) {
            Ok(r) => r,
            Err(e) => {
                let mut verdict = Verdict::failed(ErrorCategory::RuntimeUnavailable, e.to_string());
                verdict.language = Some(v.language.name().into());
                return verdict;
            }
        };
        // Held until the run is over: a layer in use is never evicted.
        let mut layer = None;
        if !v.packages.is_empty() {
            let deadline = Instant::now() + v.limits.timeout();
            match self
                .packages
                .layer(self, &v.packages, &runtime, deadline, cancel)
            {
                Ok(l) => {
                    runtime = runtime.with_python_path(l.site());
                    layer = Some(l);
                }
                Err(mut verdict) => {
                    verdict.language = Some(v.language.name().into());
                    return *verdict;
                }
            }
        }
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
        let mut verdict = self.run(v, &runtime, sink, cancel, held);
        verdict.language = Some(v.language.name().into());
        verdict.limits = Some(v.limits);
        verdict.packages = layer.map(|l| l.report().clone());
        verdict
    }

    pub(crate) fn program(
        inv: &Invocation,
        limits: &Limits,
        timeout: Duration,
        runtime: &Runtime,
        enforcement: &Enforcement,
        files: Vec<InputFile>,
        stdin: Option<Vec<u8>>,
    ) -> Program {
        let address_space_bytes = (!enforcement.cgroup_limits.memory
            && runtime.tolerates_address_space_limit())
        .then_some(limits.memory.0);
        Program {
            argv: inv.argv.clone(),
            env: inv.env.clone(),
            cwd: PathBuf::from(WORKSPACE),
            files,
            stdin,
            rlimits: Rlimits {
                cpu_seconds: limits.cpu_rlimit_seconds(timeout),
                open_files: limits.open_files.0,
                // The sandbox's pid 1 runs as the same uid and counts too. With a pids cgroup
                // the rlimit sits one above it: the kernel checks the rlimit first, and only a
                // refusal by the cgroup is counted (pids.events), which is how a fork bomb is
                // told apart from a program that failed for another reason.
                processes: if enforcement.cgroup_limits.pids {
                    limits.pids.0 + 2
                } else {
                    limits.pids.0 + 1
                },
                file_size_bytes: limits.disk.0,
                address_space_bytes,
            },
            wall_timeout: timeout,
            stdout_cap: limits.output.0,
            stderr_cap: limits.output.0,
        }
    }

    fn run(
        &self,
        v: &ValidRequest,
        runtime: &Runtime,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
        held: Held,
    ) -> Verdict {
        let limits = &v.limits;
        // Network by permission: a fresh sandbox with the proxy's listener on its loopback,
        // and the runtime told where the proxy is (no warm sandbox has either).
        let networked = !v.network.is_empty();
        // A warm sandbox has neither the proxy's listener nor a package layer, and its
        // interpreter started with runcell's environment only.
        let fresh = networked || !v.packages.is_empty() || !v.env.is_empty();
        let with_proxy;
        let runtime = if networked {
            with_proxy = runtime.with_proxy(runcell_proxy::SANDBOX_PROXY_PORT);
            &with_proxy
        } else {
            runtime
        };
        let with_env = match with_request_env(runtime, &v.env) {
            Ok(rt) => rt,
            Err(message) => return Verdict::failed(ErrorCategory::InvalidRequest, message),
        };
        let runtime = &with_env;
        // A warm sandbox built with the same sandbox-level limits, or a new one.
        let key = SandboxKey::new(v.language, limits);
        let warm = match fresh {
            false => self.pool.as_ref().and_then(|p| p.take(&key)),
            true => None,
        };
        let (mut sandbox, interpreter) = match warm {
            Some(w) => (w.sandbox, w.interpreter),
            None => {
                let mut spec = sandbox_spec(&self.config, limits, runtime);
                if networked {
                    spec.proxy_port = Some(runcell_proxy::SANDBOX_PROXY_PORT);
                }
                let mut sandbox = match Sandbox::create(&spec) {
                    Ok(s) => s,
                    Err(e) => return sandbox_failure("could not be set up", &e),
                };
                // No warm sandbox: with templates, its interpreter is forked and the request
                // runs as its one cell, as in a warm one (the imports are the template's).
                let grafted = !fresh && self.graft_one_shot(&mut sandbox, v, runtime);
                if !sandbox.is_ready() {
                    match Sandbox::create(&spec) {
                        Ok(s) => sandbox = s,
                        Err(e) => return sandbox_failure("could not be set up", &e),
                    }
                }
                (sandbox, grafted)
            }
        };
        if let Some(refused) = self.strict_refusal(&sandbox) {
            return refused;
        }
        let proxy = match networked {
            false => None,
            true => {
                let permit = self.config.network.permit(&v.network);
                match sandbox
                    .take_proxy_listener()
                    .map(|l| runcell_proxy::start(l, permit))
                {
                    Some(Ok(p)) => Some(p),
                    Some(Err(e)) => {
                        let e = runcell_jail::SandboxError::Protocol(format!(
                            "the egress proxy did not start: {e}"
                        ));
                        return sandbox_failure("could not be set up", &e);
                    }
                    None => {
                        let e = runcell_jail::SandboxError::Protocol(
                            "no listening socket for the egress proxy".into(),
                        );
                        return sandbox_failure("could not be set up", &e);
                    }
                }
            }
        };
        let how = if interpreter {
            RunIn::OneShotCell
        } else {
            RunIn::FreshSandbox
        };
        let (mut verdict, _) = self.run_in(&mut sandbox, how, v, runtime, sink, cancel);
        if let Some(p) = proxy {
            verdict.network = Some(crate::verdict::NetworkReport {
                connections: p.finish().into_iter().map(Into::into).collect(),
            });
        }
        // A server (which has a pool) tears sandboxes down off the request's path: every
        // process of the run is dead already; what is left is pid 1, the helper and the
        // cgroup. A teardown failure is then in the log only.
        let (sandbox, held) = match &self.pool {
            Some(p) => match p.dispose(sandbox, held) {
                None => return verdict,
                Some(s) => s,
            },
            None => (sandbox, held),
        };
        if let Err(e) = sandbox.destroy() {
            tracing::warn!(error = %crate::error::chain(&e), "sandbox teardown failed");
            // The run itself is complete; a teardown problem is the host's to fix, but it must
            // not pass unnoticed.
            verdict
                .warnings
                .push(format!("teardown: {}", crate::error::chain(&e)));
        }
        // The slot goes back after the teardown, not with the verdict.
        drop(held);
        verdict
    }

    /// Fork a one-shot run's interpreter into `sandbox` from a template (see
    /// [`Engine::run`]); false when there is none to fork from, or the fork failed (the
    /// request then runs as a program, as without templates).
    fn graft_one_shot(&self, sandbox: &mut Sandbox, v: &ValidRequest, runtime: &Runtime) -> bool {
        if !self.templates.enabled() || v.language != Language::Python {
            return false;
        }
        let preload = self.preload.of(v.language).to_vec();
        let Some(inv) = runtime.interpreter(&preload, false) else {
            return false;
        };
        let enforcement = sandbox.enforcement().clone();
        let files = sandbox_files(runtime);
        let longest = self.config.policy.max.timeout();
        let mut program =
            Engine::program(&inv, &v.limits, longest, runtime, &enforcement, files, None);
        program.wall_timeout = INTERPRETER_START_TIMEOUT;
        matches!(
            self.templates
                .start_interpreter_forked_only(sandbox, &program, &preload),
            Some(Ok(None))
        )
    }

    /// Strict mode checks what this sandbox really got, not only what the host offers: a
    /// cgroup hierarchy without the pids controller, swap without accounting, ...
    pub(crate) fn strict_refusal(&self, sandbox: &Sandbox) -> Option<Verdict> {
        if !self.config.strict {
            return None;
        }
        let missing = sandbox.enforcement().missing();
        if missing.is_empty() {
            return None;
        }
        let mut v = Verdict::failed(
            ErrorCategory::SandboxFailure,
            format!(
                "Strict mode: refusing to run because these isolation layers are missing: {}. \
                 Run `runcell doctor` for how to fix them.",
                missing.join("; ")
            ),
        );
        v.enforcement = EnforcementReport::from(sandbox.enforcement());
        Some(v)
    }

    /// Run a validated request in `sandbox` (compiling first where needed), and collect the
    /// files it wrote: the verdict, and the outcome of the program or cell when one ran.
    pub(crate) fn run_in(
        &self,
        sandbox: &mut Sandbox,
        how: RunIn,
        v: &ValidRequest,
        runtime: &Runtime,
        sink: &mut dyn OutputSink,
        cancel: Option<&KillSwitch>,
    ) -> (Verdict, Option<Outcome>) {
        let limits = &v.limits;
        let plan = runtime.plan();
        let source_path = match how {
            RunIn::SessionCell(n) | RunIn::SessionCommand(n) => runtime.session_cell_path(n),
            _ => plan.source_path.clone(),
        };
        let mut run = plan.run.clone();
        let mut content = v.code.clone().into_bytes();
        // A command beside a session's interpreter: its script is what it carries for itself
        // alone (its own `envs`), so it never lands in the sandbox where later code would find
        // it: it goes as `bash -c`'s argument. One too long for an argument (the kernel's
        // MAX_ARG_STRLEN, 128 KiB) is written where cells are, and removes itself first (bash
        // reads on through the descriptor it opened).
        let mut source_file = true;
        if let RunIn::SessionCommand(_) = how {
            let from = plan.source_path.to_string_lossy().into_owned();
            if let Some(i) = run.argv.iter().position(|a| *a == from) {
                if content.len() <= COMMAND_ARG_BYTES && !content.contains(&0) {
                    run.argv
                        .splice(i..=i, ["-c".to_string(), v.code.clone(), "bash".into()]);
                    source_file = false;
                } else {
                    run.argv[i] = source_path.to_string_lossy().into_owned();
                    let mut script = format!("rm -f -- '{}'\n", source_path.display()).into_bytes();
                    script.append(&mut content);
                    content = script;
                }
            }
        }
        let source = InputFile {
            path: source_path.clone(),
            mode: 0o644,
            content,
        };
        let enforcement = sandbox.enforcement().clone();
        let cell = matches!(how, RunIn::OneShotCell | RunIn::SessionCell(_));

        let mut compile_time = None;
        let mut files = Vec::new();
        if source_file {
            files.push(source);
        }
        files.extend(v.files.iter().cloned());
        if how == RunIn::FreshSandbox {
            // (A warm interpreter's sandbox, and a session's, got them when they started.)
            files.extend(sandbox_files(runtime));
        }
        if matches!(how, RunIn::SessionCell(_)) && !v.env.is_empty() {
            // A session's interpreter started long ago: the call's own variables reach it as
            // a file, which it applies for this call only (the names and values were checked,
            // names against the runtime's own too, by `with_request_env`).
            let mut content = Vec::new();
            for (k, val) in &v.env {
                content.extend_from_slice(k.as_bytes());
                content.push(b'=');
                content.extend_from_slice(val.as_bytes());
                content.push(0);
            }
            files.push(InputFile {
                path: PathBuf::from(runcell_runtimes::SESSION_CALL_ENV),
                mode: 0o600,
                content,
            });
        }
        let mut stdin = v.stdin.clone();
        if cell && v.language == Language::Bash {
            // A shell cannot take a new stdin per cell: it reads it from a file.
            if let Some(data) = stdin.take() {
                files.push(InputFile {
                    path: PathBuf::from(runcell_runtimes::BASH_SESSION_STDIN),
                    mode: 0o600,
                    content: data,
                });
            }
        }
        if let Some(compile) = plan.compile.as_ref().filter(|_| !cell) {
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
                Err(e) => return (self.sandbox_failed(sandbox, e), None),
            };
            compile_time = Some(outcome.wall.as_secs_f64());
            let (code, error) = classify(&outcome, limits, Phase::Compile);
            if error.is_some() {
                let mut verdict = verdict_from(&outcome, code, error, sandbox);
                verdict.compile_time = compile_time;
                verdict.execution_time = 0.0;
                return (verdict, None);
            }
        }
        let program = Self::program(
            &run,
            limits,
            limits.timeout(),
            runtime,
            &enforcement,
            files,
            stdin,
        );
        let ran = match how {
            RunIn::OneShotCell => sandbox.run_cell(&program, None, sink, cancel),
            RunIn::SessionCell(_) => sandbox.run_cell(&program, Some(&source_path), sink, cancel),
            _ => sandbox.run(&program, sink, cancel),
        };
        let outcome = match ran {
            Ok(o) => o,
            Err(runcell_jail::SandboxError::NoInterpreter) => {
                return (
                    Verdict::failed(ErrorCategory::SandboxFailure, NO_INTERPRETER),
                    None,
                )
            }
            Err(e) => return (self.sandbox_failed(sandbox, e), None),
        };
        let (code, error) = classify(&outcome, limits, Phase::Run);
        let mut verdict = verdict_from(&outcome, code, error, sandbox);
        verdict.compile_time = compile_time;
        verdict
            .warnings
            .extend(memory_fallback_note(sandbox, runtime));
        // Every process of the run is dead now (pid 1 killed and reaped them before it
        // reported; a session's interpreter excepted); what they left in /workspace is the
        // output. A sandbox killed outright (cancelled, or pid 1 lost) has no files to give.
        if let Ok(collected) = sandbox.collect(&self.collect_limits(limits)) {
            let notes;
            (verdict.files, verdict.files_omitted, notes) = crate::files::to_verdict(collected);
            verdict.warnings.extend(notes);
        }
        (verdict, Some(outcome))
    }

    fn collect_limits(&self, limits: &Limits) -> CollectLimits {
        let p = &self.config.policy;
        CollectLimits {
            max_files: limits.output_files.0,
            max_file_bytes: p.max_output_file_bytes,
            max_total_bytes: p.max_output_total_bytes,
            max_entries: 100_000,
            // All the data a run can hold fits in its disk limit; anything beyond is holes.
            max_read_bytes: limits.disk.0,
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
        if e.os_error().is_some_and(|o| o.errno == libc_enospc()) {
            // The inputs (the code itself, for a session) did not fit: the run's disk is full.
            let mut v = Verdict::failed(
                ErrorCategory::DiskLimit,
                "The disk is full (/tmp, /workspace and /dev/shm share the disk limit): the \
                 code and its files could not be written. Delete files (in a session: PUT an \
                 empty file over a large one, or remove it in a short call), or ask for more \
                 disk.",
            );
            v.enforcement = EnforcementReport::from(sandbox.enforcement());
            return v;
        }
        let mut v = sandbox_failure("failed while running the program", &e);
        v.enforcement = EnforcementReport::from(sandbox.enforcement());
        v
    }
}

/// ENOSPC (28 on every Linux architecture).
fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}

/// Where [`Engine::run_in`] runs a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RunIn {
    /// A sandbox that has run nothing yet: it gets the runtime's files with the request's.
    FreshSandbox,
    /// A warm pool's sandbox whose interpreter runs the request as its one cell.
    OneShotCell,
    /// A session's interpreter, as its cell number `n`.
    SessionCell(u64),
    /// A session's sandbox without an interpreter (Go): the request runs as a program.
    SessionProgram,
    /// A program in another language than the session's (a shell command in a Python
    /// session), run beside the session's interpreter as its own program. Its source is
    /// written where cells are (number `n`), not in /workspace, which is the user's.
    SessionCommand(u64),
}

/// The longest command script given to `bash -c` as an argument (well below the kernel's
/// 128 KiB for one argument).
const COMMAND_ARG_BYTES: usize = 96 << 10;

/// The message of a cell sent to a sandbox whose interpreter is gone (sessions restart it).
pub(crate) const NO_INTERPRETER: &str = "The session's interpreter is not running.";

/// How long a warm interpreter may take to start and import its preload modules.
pub(crate) const INTERPRETER_START_TIMEOUT: Duration = Duration::from_secs(120);

/// The files the runtime places in every sandbox (matplotlib's configuration).
pub(crate) fn sandbox_files(runtime: &Runtime) -> Vec<InputFile> {
    runtime
        .sandbox_files
        .iter()
        .map(|(path, content)| InputFile {
            path: path.clone(),
            mode: 0o644,
            content: content.clone(),
        })
        .collect()
}

/// What to build for a run with `limits` of `runtime`.
pub(crate) fn sandbox_spec(
    config: &EngineConfig,
    limits: &Limits,
    runtime: &Runtime,
) -> SandboxSpec {
    SandboxSpec {
        hostname: config.hostname.clone(),
        root: runtime.root_entries(),
        scratch_bytes: limits.disk.0,
        // One inode per 4 KiB of space, within sane bounds: enough for real work, not
        // enough for a million empty files.
        scratch_inodes: (limits.disk.0 / 4096).clamp(1024, 1_000_000),
        cgroup: CgroupLimits {
            memory_bytes: Some(limits.memory.0),
            pids_max: Some(limits.pids.0),
            cpu_millis: Some(limits.cpus.0),
            io: config.io_device.map(|device| IoLimits {
                device,
                read_bps: limits.io_read.0,
                write_bps: limits.io_write.0,
                // Operations too, so that a flood of small reads is bounded as well: one
                // per 4 KiB page of the throughput, and never fewer than a hundred.
                read_iops: (limits.io_read.0 / 4096).max(100),
                write_iops: (limits.io_write.0 / 4096).max(100),
            }),
        },
        setup_timeout: config.setup_timeout,
        helper_exe: config.helper_exe.clone(),
        overlays: runtime.overlays.clone(),
        all_runs_memory_bytes: config.all_runs_memory_bytes,
        proxy_port: None,
        templated: config.templates && runtime.language == Language::Python,
    }
}

/// A `sandbox_failure` verdict: the host's problem, with the whole chain of causes in the
/// message and the OS error behind it (EACCES, EBUSY, ...) in `error.os_error`.
pub(crate) fn sandbox_failure(what: &str, e: &runcell_jail::SandboxError) -> Verdict {
    // The operator learns of it from the log, not only the client from its verdict.
    tracing::warn!(error = %crate::error::chain(e), "the sandbox {what}");
    let mut v = Verdict::failed(
        ErrorCategory::SandboxFailure,
        format!(
            "The sandbox {what} ({}). This is a problem with the host, not with the program.",
            crate::error::chain(e)
        ),
    );
    if let Some(err) = v.error.as_mut() {
        err.os_error = crate::error::os_error(e);
    }
    v
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
        warnings: Vec::new(),
        session_id: None,
        execution_count: None,
        state_lost: None,
        network: None,
        packages: None,
        results: None,
        exception: None,
    }
}

fn round_secs(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Bytes, Limit};

    fn engine() -> Engine {
        let mut c = EngineConfig::for_host();
        c.policy = LimitPolicy::for_host(8 << 30, 2);
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
        assert!(matches!(
            e.validate(&ExecRequest::new("python", big)),
            Err(ValidationError::CodeTooLarge { .. })
        ));

        let mut r = ExecRequest::new("python", "print(1)");
        r.limits.memory = Some(Bytes(1 << 40));
        let err = e.validate(&r).unwrap_err();
        assert_eq!(err.limit(), Some(Limit::Memory));
        let ValidationError::Limit(l) = &err else {
            panic!("{err:?}")
        };
        assert_eq!((l.value, l.maximum), (1 << 40, 8 << 30));
        assert_eq!(
            err.to_string(),
            "Invalid limit: memory is 1 TiB, above the maximum of 8 GiB."
        );
        let v = e.execute(&r, &mut runcell_jail::NoSink, None);
        assert_eq!(v.category(), Some(ErrorCategory::InvalidRequest));
        assert_eq!(v.exit_code, None);
    }

    #[test]
    fn long_language_names_are_cut_in_the_message() {
        let name = "\u{e9}".repeat(100_000);
        let err = engine().validate(&ExecRequest::new(name, "")).unwrap_err();
        assert!(err.to_string().len() < 1000);
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
            assert!(e.validate(&r).is_err(), "{paths:?}");
        }
        // Files side by side in a directory are fine.
        let mut r = ExecRequest::new("python", "print(1)");
        r.files = vec![file("d/a"), file("d/b"), file("d2")];
        assert_eq!(e.validate(&r).map(|v| v.files.len()), Ok(3));
    }
}
