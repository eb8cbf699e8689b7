//! The curated Python data-science stack (numpy, pandas, matplotlib, scipy, sympy, pillow,
//! openpyxl) that every sandboxed Python run gets, read-only.
//!
//! The stack is a venv made from the host's Python (`python3 -m venv --without-pip`), filled
//! by the host's pip from `python/requirements.lock` (every distribution pinned, with sha256
//! hashes), and kept at `<data_dir>/python/<stack id>/`. The id hashes the lock, the Python
//! files runcell installs into the stack and the host Python's version, so a new lock or a
//! Python upgrade gets a fresh directory and old ones are left alone.
//!
//! The sandbox binds the stack read-only at the same absolute path (its `pyvenv.cfg` points at
//! `/usr/bin`, which the sandbox has too) and runs `<root>/bin/python3`. Everything is
//! byte-compiled at setup, matplotlib's font cache is built at setup and copied into each
//! sandbox's `/tmp` (see [`PythonStack::sandbox_files`]), and `MPLBACKEND=module://runcell_plots`
//! turns shown (or still open) figures into PNG files under `/workspace/figures`.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use runcell_jail::RootEntry;

pub use crate::setup::{SetupError, SetupEvent};
use sha2::{Digest, Sha256};

/// Every distribution of the stack, pinned with sha256 hashes (pip `--require-hashes` format).
pub const LOCK: &str = include_str!("../python/requirements.lock");
/// The matplotlib backend installed into the stack's site-packages.
pub const PLOTS_MODULE: &str = include_str!("../python/runcell_plots.py");
/// Run by the stack's interpreter at setup: checks the stack, builds the font cache.
const SETUP_SCRIPT: &str = include_str!("../python/setup_stack.py");
/// Bumped when the layout of a stack directory changes (part of the stack id).
const LAYOUT: &str = "runcell-python-stack/1";

/// The packages the stack exists for (distribution names as in the lock).
pub const REQUIRED_PACKAGES: [&str; 7] = [
    "numpy",
    "pandas",
    "matplotlib",
    "scipy",
    "sympy",
    "pillow",
    "openpyxl",
];

/// matplotlib's configuration and cache directory inside the sandbox (writable; seeded with
/// the prebuilt font cache by [`PythonStack::sandbox_files`]).
pub const SANDBOX_MPLCONFIGDIR: &str = "/tmp/.config/matplotlib";
/// The matplotlib backend every run uses.
pub const PLOTS_BACKEND: &str = "module://runcell_plots";
/// Where `runcell_plots` writes figures (unless `RUNCELL_FIGURES_DIR` says otherwise).
pub const FIGURES_DIR: &str = "/workspace/figures";

/// runcell's own files inside a stack directory.
const RUNCELL_DIR: &str = "runcell";
/// Written last: a stack directory without it is not a stack.
const MARKER: &str = "runcell/complete";
/// The files of this directory are copied into every sandbox's MPLCONFIGDIR.
const MPLCONFIG: &str = "runcell/mplconfig";
const TMP_PREFIX: &str = ".tmp-";
const STALE_PREFIX: &str = ".stale-";
/// pip learned `--python` in 22.3.
const MIN_PIP: (u32, u32) = (22, 3);
/// How many lines of a failed command's output an error keeps.
const TAIL_LINES: usize = 25;

/// An installed stack.
#[derive(Debug, Clone)]
pub struct PythonStack {
    /// The stack id (also the directory name).
    pub id: String,
    /// The venv: `<data_dir>/python/<id>`. Bound read-only into the sandbox at this same path.
    pub root: PathBuf,
    /// The interpreter to run in the sandbox: `<root>/bin/python3`.
    pub python: PathBuf,
    /// The installed distributions, (name, version), sorted by name.
    pub packages: Vec<(String, String)>,
    files: Arc<OnceLock<SandboxFiles>>,
}

/// (absolute sandbox path, content) of each file to write into a sandbox.
type SandboxFiles = Vec<(PathBuf, Vec<u8>)>;

impl PythonStack {
    /// A stack at `root` with nothing read from it (for tests of what it sets).
    pub fn at(root: PathBuf) -> PythonStack {
        PythonStack {
            id: String::new(),
            python: root.join("bin/python3"),
            root,
            packages: Vec::new(),
            files: Arc::default(),
        }
    }

    /// The installed stack for this lock and host Python, if complete (its marker file, written
    /// last, is there).
    pub fn find(data_dir: &Path, host_python: &Path) -> Option<PythonStack> {
        find_id(
            data_dir,
            &stack_id(LOCK, &cached_identity(data_dir, host_python)?),
        )
    }

    /// Files to write into each sandbox before a Python program starts, as (absolute sandbox
    /// path, content): matplotlib's prebuilt font cache, into the writable
    /// [`SANDBOX_MPLCONFIGDIR`] under `/tmp` (its parent directories must be created).
    /// Read once, then served from memory. Empty if the files cannot be read; matplotlib then
    /// rebuilds its cache in the sandbox (about a second), which is slow but correct.
    pub fn sandbox_files(&self) -> Vec<(PathBuf, Vec<u8>)> {
        self.files
            .get_or_init(|| read_sandbox_files(&self.root.join(MPLCONFIG)))
            .clone()
    }

    /// Extra environment for Python programs; these values replace any of the same name in the
    /// run's plan (`MPLBACKEND=Agg`, `PATH`).
    ///
    /// `OPENBLAS_NUM_THREADS`/`OMP_NUM_THREADS` are 1: OpenBLAS (in numpy and scipy) otherwise
    /// starts one thread per host CPU at import, which ignores the CPU quota and can exhaust
    /// the run's process limit on a large host. A run given more CPUs may raise them.
    pub fn env(&self) -> Vec<(String, String)> {
        let base_path = crate::base_env()
            .into_iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v)
            .unwrap_or_else(|| "/usr/bin:/bin".to_string());
        vec![
            ("MPLBACKEND".into(), PLOTS_BACKEND.into()),
            ("MPLCONFIGDIR".into(), SANDBOX_MPLCONFIGDIR.into()),
            ("OPENBLAS_NUM_THREADS".into(), "1".into()),
            ("OMP_NUM_THREADS".into(), "1".into()),
            (
                "VIRTUAL_ENV".into(),
                self.root.to_string_lossy().into_owned(),
            ),
            (
                "PATH".into(),
                format!("{}:{base_path}", self.root.join("bin").display()),
            ),
        ]
    }

    /// The stack as a read-only bind at the same path in the sandbox.
    pub fn root_entry(&self) -> RootEntry {
        RootEntry::Bind {
            path: self.root.clone(),
            dir: true,
        }
    }
}

/// Install the stack (idempotent: returns the existing one at once if complete).
///
/// Builds in a temporary sibling directory (`<data_dir>/python/.tmp-<id>-<pid>-<n>`) and
/// renames it into place only when everything succeeded, so a failed or interrupted setup
/// never leaves a half-installed stack that [`PythonStack::find`] would accept; leftovers of
/// interrupted setups are removed by the next one. Streams progress through `progress`.
pub fn setup(
    data_dir: &Path,
    host_python: &Path,
    progress: &mut dyn FnMut(SetupEvent),
) -> Result<PythonStack, SetupError> {
    let info = python_info(host_python)?;
    if let Some(wanted) = lock_python_tag(LOCK) {
        if info.tag() != wanted {
            return Err(SetupError::PythonUnsupported {
                path: host_python.to_path_buf(),
                found: format!("Python {} ({})", info.version, info.tag()),
                wanted: wanted.to_string(),
            });
        }
    }
    let id = stack_id(LOCK, &info.identity());
    if let Some(stack) = find_id(data_dir, &id) {
        progress(SetupEvent::Done { reused: true });
        return Ok(stack);
    }

    let step = "preparing the data directory";
    let base = data_dir.join("python");
    fs::create_dir_all(&base).map_err(io_err(step, &base))?;
    // The stack's paths are baked into it (script shebangs, .pyc names) and the sandbox binds
    // it at the same path: make that path absolute and free of symlinks.
    let data_dir = &fs::canonicalize(data_dir).map_err(io_err(step, data_dir))?;
    let base = data_dir.join("python");
    for dir in [data_dir, base.as_path()] {
        add_mode(dir, 0o555).map_err(io_err(step, dir))?;
    }
    if let Some(blocked) = untraversable_ancestor(data_dir) {
        progress(SetupEvent::Warning(format!(
            "{} is not searchable by other users; sandboxes running as an unprivileged uid cannot reach the Python stack below it (chmod o+x it, or choose another data directory)",
            blocked.display()
        )));
    }
    remove_leftovers(&base);

    let root = base.join(&id);
    if fs::symlink_metadata(&root).is_ok() {
        // A concurrent setup may just have finished.
        if let Some(stack) = find_id(data_dir, &id) {
            progress(SetupEvent::Done { reused: true });
            return Ok(stack);
        }
        // A directory without the marker: never accepted by `find`, so nothing uses it.
        let aside = base.join(format!("{STALE_PREFIX}{id}-{}", unique()));
        fs::rename(&root, &aside).map_err(io_err("moving an incomplete stack aside", &root))?;
        let _ = fs::remove_dir_all(&aside);
    }

    let tmp = base.join(format!(
        "{TMP_PREFIX}{id}-{}-{}",
        std::process::id(),
        unique()
    ));
    let guard = RemoveOnDrop(tmp.clone());
    build(&tmp, &root, host_python, &info, progress)?;

    progress(SetupEvent::Step("moving the stack into place".into()));
    if let Err(e) = fs::rename(&tmp, &root) {
        // Another setup may have finished first.
        if let Some(stack) = find_id(data_dir, &id) {
            drop(guard);
            progress(SetupEvent::Done { reused: true });
            return Ok(stack);
        }
        return Err(io_err("moving the stack into place", &root)(e));
    }
    std::mem::forget(guard);
    let stack = find_id(data_dir, &id).ok_or_else(|| SetupError::Unexpected {
        step: "moving the stack into place".into(),
        detail: format!(
            "{} is not a complete stack after the rename",
            root.display()
        ),
    })?;
    progress(SetupEvent::Done { reused: false });
    Ok(stack)
}

/// Build a complete stack in `tmp`, for its final place `root`; the marker is written last.
fn build(
    tmp: &Path,
    root: &Path,
    host_python: &Path,
    info: &PythonInfo,
    progress: &mut dyn FnMut(SetupEvent),
) -> Result<(), SetupError> {
    let packages = parse_lock(LOCK).map_err(|detail| SetupError::Unexpected {
        step: "reading the lock".into(),
        detail,
    })?;

    let step = "creating venv";
    progress(SetupEvent::Step(step.into()));
    let mut cmd = host_command(host_python);
    cmd.args(["-m", "venv", "--without-pip"]).arg(tmp);
    match run_streamed(step, &mut cmd, progress) {
        Ok(_) => {}
        Err(SetupError::Command { output_tail, .. })
            if output_tail.contains("No module named venv")
                || output_tail.contains("ensurepip")
                || output_tail.contains("python3-venv") =>
        {
            return Err(SetupError::VenvUnavailable {
                python: host_python.to_path_buf(),
                detail: last_line(&output_tail),
                hint: "apt-get install python3-venv",
            });
        }
        Err(e) => return Err(e),
    }
    let venv_python = tmp.join("bin/python3");
    if fs::symlink_metadata(&venv_python).is_err() {
        return Err(SetupError::VenvUnavailable {
            python: host_python.to_path_buf(),
            detail: format!("{} was not created", venv_python.display()),
            hint: "apt-get install python3-venv",
        });
    }

    let step = "checking pip";
    progress(SetupEvent::Step(step.into()));
    check_pip(host_python)?;

    let own = tmp.join(RUNCELL_DIR);
    fs::create_dir_all(own.join("mplconfig")).map_err(io_err(step, &own))?;
    let lock_path = own.join("requirements.lock");
    fs::write(&lock_path, LOCK).map_err(io_err("writing the lock", &lock_path))?;

    let step = format!("installing {} packages", packages.len());
    progress(SetupEvent::Step(step.clone()));
    let mut cmd = host_command(host_python);
    cmd.args(["-m", "pip", "--python"])
        .arg(&venv_python)
        .args([
            "install",
            "--no-input",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
            "--only-binary=:all:",
            "--no-deps",
            "--require-hashes",
            // Byte-compiled below, with the final paths.
            "--no-compile",
            "--no-warn-script-location",
            "-r",
        ])
        .arg(&lock_path);
    // The operator's pip configuration (index, proxy, certificates) applies, but nothing that
    // would install somewhere other than the venv.
    for var in [
        "PIP_USER",
        "PIP_TARGET",
        "PIP_PREFIX",
        "PIP_ROOT",
        "PIP_PYTHON",
    ] {
        cmd.env_remove(var);
    }
    run_streamed(&step, &mut cmd, progress)?;

    let site = tmp
        .join("lib")
        .join(format!("python{}", info.major_minor()))
        .join("site-packages");
    let step = "installing the runcell_plots backend";
    progress(SetupEvent::Step(step.into()));
    let plots = site.join("runcell_plots.py");
    fs::write(&plots, PLOTS_MODULE).map_err(io_err(step, &plots))?;

    // The stack is read-only in the sandbox and PYTHONDONTWRITEBYTECODE=1 is set: without
    // .pyc files every import would compile from source. `unchecked-hash` .pyc files are used
    // without looking at the source's mtime, so they stay valid even if the tree is copied.
    // The recorded file names are the final ones.
    let step = "byte-compiling";
    progress(SetupEvent::Step(step.into()));
    let mut cmd = stack_command(&venv_python);
    cmd.args([
        "-m",
        "compileall",
        "-q",
        "-j0",
        "--invalidation-mode",
        "unchecked-hash",
        "-s",
    ])
    .arg(tmp)
    .arg("-p")
    .arg(root)
    .arg(&site);
    run_streamed(step, &mut cmd, progress)?;

    let step = "relocating scripts";
    progress(SetupEvent::Step(step.into()));
    relocate(tmp, root).map_err(|(path, e)| io_err(step, &path)(e))?;

    let step = "building matplotlib's font cache and checking the stack";
    progress(SetupEvent::Step(step.into()));
    let scratch = own.join("scratch");
    let mut cmd = stack_command(&venv_python);
    cmd.arg("-c")
        .arg(SETUP_SCRIPT)
        .arg(&lock_path)
        .env("MPLCONFIGDIR", own.join("mplconfig"))
        .env("MPLBACKEND", "agg")
        // Fonts of the operator's home are invisible in the sandbox: keep them out.
        .env("HOME", scratch.join("home"))
        .env("XDG_CACHE_HOME", scratch.join("cache"))
        .env("XDG_CONFIG_HOME", scratch.join("config"))
        .env("XDG_DATA_HOME", scratch.join("data"))
        .env("RUNCELL_FIGURES_DIR", scratch.join("figures"));
    let out = run_streamed(step, &mut cmd, progress)?;
    let _ = fs::remove_dir_all(&scratch);
    let report: serde_json::Value = out
        .iter()
        .rev()
        .find(|l| l.starts_with('{'))
        .and_then(|l| serde_json::from_str(l).ok())
        .ok_or_else(|| SetupError::Unexpected {
            step: step.into(),
            detail: "the check printed no report".into(),
        })?;
    let installed: Vec<(String, String)> = serde_json::from_value(report["packages"].clone())
        .map_err(|e| SetupError::Unexpected {
            step: step.into(),
            detail: format!("bad package list in the report: {e}"),
        })?;
    if let Some(dropped) = report["dropped_fonts"].as_array().filter(|d| !d.is_empty()) {
        progress(SetupEvent::Warning(format!(
            "{} fonts are outside /usr or not world-readable and were left out of matplotlib's font cache",
            dropped.len()
        )));
    }
    let report_path = own.join("setup-report.json");
    fs::write(&report_path, report.to_string()).map_err(io_err(step, &report_path))?;

    let step = "making the stack world-readable";
    progress(SetupEvent::Step(step.into()));
    crate::setup::make_world_readable(tmp)?;

    let marker = tmp.join(MARKER);
    let mut text = format!("{LAYOUT} {}\n", info.identity());
    for (name, version) in &installed {
        text.push_str(&format!("{name}=={version}\n"));
    }
    fs::write(&marker, text).map_err(io_err("writing the marker", &marker))?;
    add_mode(&marker, 0o444).map_err(io_err("writing the marker", &marker))?;
    Ok(())
}

/// The stack directory for `id`, if complete.
fn find_id(data_dir: &Path, id: &str) -> Option<PythonStack> {
    // Absolute and without symlinks: the sandbox binds the stack at this very path.
    let root = fs::canonicalize(data_dir).ok()?.join("python").join(id);
    let marker = fs::read_to_string(root.join(MARKER)).ok()?;
    let python = root.join("bin/python3");
    fs::symlink_metadata(&python).ok()?;
    let packages = marker
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (n, v) = l.split_once("==")?;
            Some((n.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    Some(PythonStack {
        id: id.to_string(),
        root,
        python,
        packages,
        files: Arc::default(),
    })
}

/// The id of the stack for a lock and a host Python identity: the lock's Python tag and the
/// first 16 hex digits of a sha256 over everything that goes into the stack.
pub fn stack_id(lock: &str, python_identity: &str) -> String {
    let mut h = Sha256::new();
    for part in [LAYOUT, lock, PLOTS_MODULE, SETUP_SCRIPT, python_identity] {
        h.update((part.len() as u64).to_le_bytes());
        h.update(part.as_bytes());
    }
    let hex = runcell_jail::to_hex(&h.finalize()[..8]);
    match lock_python_tag(lock) {
        Some(tag) => format!("{tag}-{hex}"),
        None => hex,
    }
}

/// One pinned distribution of the lock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockedPackage {
    pub name: String,
    pub version: String,
    /// sha256 hex digests of the allowed files.
    pub hashes: Vec<String>,
}

/// Parse a `--require-hashes` lock: every requirement `name==version` with at least one
/// `--hash=sha256:<64 hex>`; comments and continuation lines as pip reads them.
pub fn parse_lock(text: &str) -> Result<Vec<LockedPackage>, String> {
    let mut logical = Vec::new();
    let mut current = String::new();
    for line in text.lines() {
        let line = strip_comment(line);
        match line.trim_end().strip_suffix('\\') {
            Some(start) => {
                current.push_str(start);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    logical.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    if !current.trim().is_empty() {
        return Err(format!("continuation at the end of the lock: {current}"));
    }
    let mut packages: Vec<LockedPackage> = Vec::new();
    for line in logical {
        let mut words = line.split_whitespace();
        let requirement = words.next().unwrap_or_default();
        let (name, version) = requirement
            .split_once("==")
            .filter(|(n, v)| is_name(n) && !v.is_empty() && !v.contains(['=', '*', ',', ';']))
            .ok_or_else(|| format!("not pinned with ==: {line}"))?;
        let mut hashes = Vec::new();
        for word in words {
            let digest = word
                .strip_prefix("--hash=sha256:")
                .filter(|d| d.len() == 64 && d.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or_else(|| format!("unexpected {word:?} in: {line}"))?;
            hashes.push(digest.to_ascii_lowercase());
        }
        if hashes.is_empty() {
            return Err(format!("no --hash=sha256: for {requirement}"));
        }
        if packages
            .iter()
            .any(|p| normalize(&p.name) == normalize(name))
        {
            return Err(format!("{name} is pinned twice"));
        }
        packages.push(LockedPackage {
            name: name.to_string(),
            version: version.to_string(),
            hashes,
        });
    }
    Ok(packages)
}

/// The Python the lock was made for, from its `# python: cp311` header line.
pub fn lock_python_tag(lock: &str) -> Option<&str> {
    lock.lines()
        .find_map(|l| l.strip_prefix("# python:"))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// A distribution name normalized as PEP 503 does.
pub fn normalize(name: &str) -> String {
    let mut out = String::new();
    for c in name.chars() {
        if matches!(c, '-' | '_' | '.') {
            if !out.ends_with('-') {
                out.push('-');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// pip's rule: `#` starts a comment at the start of a line or after whitespace.
fn strip_comment(line: &str) -> &str {
    let bytes = line.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        if b == b'#' && (i == 0 || bytes[i - 1].is_ascii_whitespace()) {
            return &line[..i];
        }
    }
    line
}

/// What matters about the host's Python.
#[derive(Debug, Clone)]
struct PythonInfo {
    /// "3.11.2"
    version: String,
    /// "cpython-311"
    cache_tag: String,
    /// "x86_64"
    machine: String,
    /// `sys.version`, with the build date.
    full: String,
}

impl PythonInfo {
    fn identity(&self) -> String {
        format!("{} {} {}", self.cache_tag, self.machine, self.full)
    }

    /// "cp311"
    fn tag(&self) -> String {
        match self.cache_tag.strip_prefix("cpython-") {
            Some(n) => format!("cp{n}"),
            None => self.cache_tag.clone(),
        }
    }

    /// "3.11"
    fn major_minor(&self) -> String {
        self.version
            .split('.')
            .take(2)
            .collect::<Vec<_>>()
            .join(".")
    }
}

const IDENTITY_CODE: &str = "import os, sys\nprint(sys.version.split()[0])\nprint(sys.implementation.cache_tag)\nprint(os.uname().machine)\nprint(' '.join(sys.version.split()))";

/// Ask the host Python who it is; cached per interpreter file (an upgrade replaces the file,
/// so its inode or mtime changes and it is asked again).
/// The host Python's identity, remembered on disk beside the stacks (keyed by the
/// interpreter file's device, inode, mtime and size, so an upgrade is noticed): asking the
/// interpreter costs a process start, which every one-shot `runcell run` would pay.
fn cached_identity(data_dir: &Path, host_python: &Path) -> Option<String> {
    let meta = fs::metadata(host_python).ok()?;
    let key = format!(
        "{}-{}-{}-{}-{}",
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.size()
    );
    let file = data_dir.join("python").join(format!(".identity-{key}"));
    if let Ok(identity) = fs::read_to_string(&file) {
        return Some(identity);
    }
    let identity = python_info(host_python).ok()?.identity();
    // Best effort: a data directory we cannot write only costs the process start next time.
    if fs::create_dir_all(file.parent()?).is_ok() {
        let _ = fs::write(&file, &identity);
    }
    Some(identity)
}

fn python_info(host_python: &Path) -> Result<PythonInfo, SetupError> {
    type Key = (PathBuf, u64, u64, i64, i64, u64);
    static CACHE: OnceLock<Mutex<HashMap<Key, PythonInfo>>> = OnceLock::new();
    let missing = || SetupError::PythonMissing {
        path: host_python.to_path_buf(),
    };
    let meta = fs::metadata(host_python).map_err(|_| missing())?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(missing());
    }
    let key = (
        host_python.to_path_buf(),
        meta.dev(),
        meta.ino(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.size(),
    );
    let cache = CACHE.get_or_init(Mutex::default);
    if let Some(info) = cache.lock().unwrap_or_else(|e| e.into_inner()).get(&key) {
        return Ok(info.clone());
    }
    let step = "asking the host Python for its version";
    let out = Command::new(host_python)
        .args(["-I", "-S", "-c", IDENTITY_CODE])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .map_err(io_err(step, host_python))?;
    if !out.status.success() {
        return Err(SetupError::Command {
            step: step.into(),
            status: out.status,
            output_tail: tail_of(&String::from_utf8_lossy(&out.stderr)),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().map(str::trim);
    let mut next = || lines.next().filter(|l| !l.is_empty()).map(str::to_string);
    let (Some(version), Some(cache_tag), Some(machine), Some(full)) =
        (next(), next(), next(), next())
    else {
        return Err(SetupError::Unexpected {
            step: step.into(),
            detail: format!("unexpected answer: {text:?}"),
        });
    };
    let info = PythonInfo {
        version,
        cache_tag,
        machine,
        full,
    };
    cache
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key, info.clone());
    Ok(info)
}

/// The host's pip must exist and know `--python`.
fn check_pip(host_python: &Path) -> Result<(), SetupError> {
    let out = host_command(host_python)
        .args(["-m", "pip", "--version"])
        .stdin(Stdio::null())
        .output()
        .map_err(io_err("checking pip", host_python))?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let unavailable = |detail: String| SetupError::PipUnavailable {
        python: host_python.to_path_buf(),
        detail,
        hint: "apt-get install python3-pip",
    };
    if !out.status.success() {
        return Err(unavailable(last_line(&text)));
    }
    // "pip 23.0.1 from /usr/lib/python3/dist-packages/pip (python 3.11)"
    let version = text.split_whitespace().nth(1).unwrap_or_default();
    let mut parts = version.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let found = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if found < MIN_PIP {
        return Err(unavailable(format!(
            "pip {version} is too old: --python needs pip {}.{} or newer",
            MIN_PIP.0, MIN_PIP.1
        )));
    }
    Ok(())
}

/// A command run by the host Python with the operator's environment (pip's configuration
/// applies), minus what would make Python look elsewhere for its modules.
fn host_command(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    for var in [
        "PYTHONHOME",
        "PYTHONPATH",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

/// A command run by the stack's interpreter in a fixed environment.
fn stack_command(python: &Path) -> Command {
    let mut cmd = Command::new(python);
    cmd.env_clear()
        .env("PATH", "/usr/local/bin:/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env("OPENBLAS_NUM_THREADS", "1");
    cmd
}

/// Run a command, passing each line of its stdout and stderr to `progress` as it comes;
/// returns the stdout lines. A failure carries the last lines of both.
fn run_streamed(
    step: &str,
    cmd: &mut Command,
    progress: &mut dyn FnMut(SetupEvent),
) -> Result<Vec<String>, SetupError> {
    let program = PathBuf::from(cmd.get_program());
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(io_err(step, &program))?;
    let (tx, rx) = mpsc::channel::<(bool, String)>();
    let mut readers = Vec::new();
    if let Some(out) = child.stdout.take() {
        readers.push(spawn_reader(out, true, tx.clone()));
    }
    if let Some(err) = child.stderr.take() {
        readers.push(spawn_reader(err, false, tx.clone()));
    }
    drop(tx);
    let mut stdout = Vec::new();
    let mut tail = VecDeque::new();
    for (is_stdout, line) in rx {
        if tail.len() == TAIL_LINES {
            tail.pop_front();
        }
        tail.push_back(line.clone());
        progress(SetupEvent::Output(line.clone()));
        if is_stdout {
            stdout.push(line);
        }
    }
    for r in readers {
        let _ = r.join();
    }
    let status = child.wait().map_err(io_err(step, &program))?;
    if !status.success() {
        return Err(SetupError::Command {
            step: step.to_string(),
            status,
            output_tail: Vec::from(tail).join("\n"),
        });
    }
    Ok(stdout)
}

fn spawn_reader<R: Read + Send + 'static>(
    stream: R,
    is_stdout: bool,
    tx: mpsc::Sender<(bool, String)>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stream);
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let line = String::from_utf8_lossy(&buf).trim_end().to_string();
                    if tx.send((is_stdout, line)).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// Scripts in bin/ and pyvenv.cfg name the directory they were installed in; point them at the
/// final one. (Everything else of a venv is relocatable: site-packages paths are relative, the
/// .pyc files already carry the final names, matplotlib stores its own fonts relative to its
/// data directory.)
fn relocate(tmp: &Path, root: &Path) -> Result<(), (PathBuf, io::Error)> {
    let from = tmp.as_os_str().as_encoded_bytes();
    let to = root.as_os_str().as_encoded_bytes();
    let bin = tmp.join("bin");
    let entries = fs::read_dir(&bin).map_err(|e| (bin.clone(), e))?;
    let mut files = vec![tmp.join("pyvenv.cfg")];
    for entry in entries {
        let entry = entry.map_err(|e| (bin.clone(), e))?;
        if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
            files.push(entry.path());
        }
    }
    for path in files {
        let data = fs::read(&path).map_err(|e| (path.clone(), e))?;
        if let Some(new) = replace_bytes(&data, from, to) {
            let mode = fs::metadata(&path).map_err(|e| (path.clone(), e))?.mode();
            fs::write(&path, new).map_err(|e| (path.clone(), e))?;
            fs::set_permissions(&path, fs::Permissions::from_mode(mode & 0o7777))
                .map_err(|e| (path.clone(), e))?;
        }
    }
    Ok(())
}

/// `data` with every `from` replaced by `to`; None when `from` does not occur.
fn replace_bytes(data: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    if from.is_empty() {
        return None;
    }
    let mut out = Vec::with_capacity(data.len());
    let mut i = 0;
    let mut found = false;
    while i < data.len() {
        if data[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
            found = true;
        } else {
            out.push(data[i]);
            i += 1;
        }
    }
    found.then_some(out)
}

/// Add permission bits to a file or directory.
fn add_mode(path: &Path, bits: u32) -> io::Result<()> {
    let mode = fs::metadata(path)?.mode() & 0o7777;
    if mode | bits != mode {
        fs::set_permissions(path, fs::Permissions::from_mode(mode | bits))?;
    }
    Ok(())
}

/// The first ancestor of `dir` that other users cannot search, if any.
fn untraversable_ancestor(dir: &Path) -> Option<PathBuf> {
    let dir = fs::canonicalize(dir).ok()?;
    dir.ancestors()
        .skip(1)
        .find(|a| {
            fs::metadata(a)
                .map(|m| m.mode() & 0o001 == 0)
                .unwrap_or(false)
        })
        .map(Path::to_path_buf)
}

/// Remove what interrupted setups left: temporary directories whose process is gone, and
/// incomplete stacks moved aside.
fn remove_leftovers(base: &Path) {
    let Ok(entries) = fs::read_dir(base) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let dead = if let Some(rest) = name.strip_prefix(TMP_PREFIX) {
            // .tmp-<id>-<pid>-<n>
            let mut parts = rest.rsplitn(3, '-');
            let _n = parts.next();
            match parts.next().and_then(|p| p.parse::<u32>().ok()) {
                Some(pid) => !Path::new("/proc").join(pid.to_string()).exists(),
                None => false,
            }
        } else {
            name.starts_with(STALE_PREFIX)
        };
        if dead {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// A number unique enough for a temporary name.
fn unique() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

fn read_sandbox_files(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(PathBuf, Vec<u8>)> = entries
        .flatten()
        .filter(|e| e.file_type().map(|t| t.is_file()).unwrap_or(false))
        .filter_map(|e| {
            let content = fs::read(e.path()).ok()?;
            Some((Path::new(SANDBOX_MPLCONFIGDIR).join(e.file_name()), content))
        })
        .collect();
    files.sort();
    files
}

struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn io_err<'a>(step: &'a str, path: &'a Path) -> impl FnOnce(io::Error) -> SetupError + 'a {
    move |source| SetupError::Io {
        step: step.to_string(),
        path: path.to_path_buf(),
        source,
    }
}

fn tail_of(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
}

fn last_line(text: &str) -> String {
    text.lines()
        .rev()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lock_pins_every_distribution_with_hashes() {
        let packages = parse_lock(LOCK).expect("the lock parses");
        assert!(packages.len() >= REQUIRED_PACKAGES.len());
        for p in &packages {
            assert!(!p.version.is_empty(), "{p:?}");
            assert!(!p.hashes.is_empty(), "{p:?}");
        }
        for required in REQUIRED_PACKAGES {
            assert!(
                packages
                    .iter()
                    .any(|p| normalize(&p.name) == normalize(required)),
                "{required} is not in the lock"
            );
        }
        // Dependencies are pinned too, not only the top-level packages.
        for dep in ["python-dateutil", "kiwisolver", "mpmath", "et-xmlfile"] {
            assert!(
                packages.iter().any(|p| normalize(&p.name) == dep),
                "{dep} is not in the lock"
            );
        }
        assert_eq!(lock_python_tag(LOCK), Some("cp311"));
        // Every requirement line (not a comment, hash or continuation) carries `==`.
        for line in LOCK.lines() {
            let l = line.trim();
            if l.is_empty() || l.starts_with('#') || l.starts_with("--hash=") {
                continue;
            }
            assert!(l.contains("=="), "unpinned line: {line}");
            assert!(l.ends_with('\\'), "requirement without hashes: {line}");
        }
    }

    #[test]
    fn lock_parser_rejects_what_pip_would_not_install_pinned() {
        let h = "a".repeat(64);
        let ok = format!("# c\nfoo==1.0 \\\n    --hash=sha256:{h}  # why\nbar_baz==2 --hash=sha256:{h} --hash=sha256:{h}\n");
        let p = parse_lock(&ok).unwrap();
        assert_eq!(p.len(), 2);
        assert_eq!(p[1].name, "bar_baz");
        assert_eq!(p[1].hashes.len(), 2);
        assert!(parse_lock(&format!("foo>=1.0 --hash=sha256:{h}\n")).is_err());
        assert!(parse_lock("foo==1.0\n").is_err());
        assert!(parse_lock("foo==1.0 --hash=sha256:abc\n").is_err());
        assert!(parse_lock(&format!("foo==1.0 --hash=md5:{h}\n")).is_err());
        assert!(parse_lock(&format!(
            "foo==1 --hash=sha256:{h}\nFoo==2 --hash=sha256:{h}\n"
        ))
        .is_err());
        assert!(parse_lock(&format!("foo==1.0 \\\n --hash=sha256:{h} \\\n")).is_err());
    }

    #[test]
    fn stack_id_changes_with_the_lock_and_the_python() {
        let py = "cpython-311 x86_64 3.11.2 (main, Mar 13 2023) [GCC 12.2.0]";
        let id = stack_id(LOCK, py);
        assert_eq!(id, stack_id(LOCK, py), "deterministic");
        assert!(id.starts_with("cp311-"), "{id}");
        assert_eq!(id.len(), "cp311-".len() + 16);
        let other_lock = LOCK.replace("numpy==", "numpy==9");
        assert_ne!(id, stack_id(&other_lock, py));
        assert_ne!(
            id,
            stack_id(
                LOCK,
                "cpython-311 x86_64 3.11.9 (main, Feb 1 2025) [GCC 12.2.0]"
            )
        );
        assert_ne!(id, stack_id(LOCK, &py.replace("x86_64", "aarch64")));
    }

    fn fake_stack(data: &Path, id: &str, marker: bool) -> PathBuf {
        let root = data.join("python").join(id);
        fs::create_dir_all(root.join("bin")).unwrap();
        fs::create_dir_all(root.join(MPLCONFIG)).unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", root.join("bin/python3")).unwrap();
        fs::write(root.join(MPLCONFIG).join("fontlist-v1.json"), "{}").unwrap();
        if marker {
            fs::write(
                root.join(MARKER),
                format!("{LAYOUT} test\nnumpy==2.4.6\npandas==3.1.1\n"),
            )
            .unwrap();
        }
        root
    }

    #[test]
    fn find_wants_a_complete_stack() {
        let data = tempfile::tempdir().unwrap();
        assert!(find_id(data.path(), "cp311-0123456789abcdef").is_none());
        fake_stack(data.path(), "cp311-0123456789abcdef", false);
        assert!(
            find_id(data.path(), "cp311-0123456789abcdef").is_none(),
            "no marker: incomplete"
        );
        let root = fake_stack(data.path(), "cp311-fedcba9876543210", true);
        let s = find_id(data.path(), "cp311-fedcba9876543210").expect("complete");
        assert_eq!(s.root, root);
        assert_eq!(s.python, root.join("bin/python3"));
        assert!(s.root.is_absolute());
        assert_eq!(
            s.packages,
            vec![
                ("numpy".to_string(), "2.4.6".to_string()),
                ("pandas".to_string(), "3.1.1".to_string())
            ]
        );
        assert_eq!(
            s.sandbox_files(),
            vec![(
                PathBuf::from("/tmp/.config/matplotlib/fontlist-v1.json"),
                b"{}".to_vec()
            )]
        );
        // Read once: later changes on disk do not matter.
        fs::write(root.join(MPLCONFIG).join("fontlist-v1.json"), "changed").unwrap();
        assert_eq!(s.sandbox_files()[0].1, b"{}".to_vec());
        let env: HashMap<_, _> = s.env().into_iter().collect();
        assert_eq!(env["MPLBACKEND"], "module://runcell_plots");
        assert_eq!(env["MPLCONFIGDIR"], SANDBOX_MPLCONFIGDIR);
        assert!(env["PATH"].starts_with(&format!("{}/bin:", root.display())));
    }

    #[test]
    #[cfg_attr(not(host_python3), ignore = "needs /usr/bin/python3")]
    fn find_uses_the_host_pythons_identity() {
        let host = Path::new("/usr/bin/python3");
        let data = tempfile::tempdir().unwrap();
        assert!(PythonStack::find(data.path(), host).is_none());
        let info = python_info(host).unwrap();
        let id = stack_id(LOCK, &info.identity());
        fake_stack(data.path(), &id, false);
        assert!(PythonStack::find(data.path(), host).is_none());
        fs::write(
            data.path().join("python").join(&id).join(MARKER),
            "x\nnumpy==1\n",
        )
        .unwrap();
        assert_eq!(PythonStack::find(data.path(), host).unwrap().id, id);
        // Another Python (or none) does not see it.
        assert!(PythonStack::find(data.path(), Path::new("/nonexistent/python3")).is_none());
    }

    /// A stand-in for the host Python: answers the identity question, and fails (or not) at
    /// the venv and pip steps.
    fn fake_python(dir: &Path, tag: &str, venv_ok: bool) -> PathBuf {
        let path = dir.join("python3");
        let venv = if venv_ok {
            "for a; do d=$a; done; mkdir -p \"$d/bin\" && ln -s /usr/bin/python3 \"$d/bin/python3\"; exit 0"
        } else {
            "echo 'The virtual environment was not created successfully because ensurepip is not available.' >&2; exit 1"
        };
        let script = format!(
            "#!/bin/sh\ncase \"$*\" in\n\
             *'-m venv'*) {venv} ;;\n\
             *'-m pip --version'*) echo 'pip 23.0.1 from /usr/lib/python3/dist-packages/pip (python 3.11)'; exit 0 ;;\n\
             *'-m pip'*) echo 'Collecting numpy==2.4.6'; echo 'ERROR: Could not find a version that satisfies the requirement numpy==2.4.6' >&2; exit 1 ;;\n\
             *) printf '3.11.2\\n{tag}\\nx86_64\\n3.11.2 (fake)\\n' ;;\n\
             esac\n"
        );
        fs::write(&path, script).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn assert_nothing_left(data: &Path) {
        let base = data.join("python");
        let left: Vec<_> = fs::read_dir(&base)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "left behind: {left:?}");
    }

    #[test]
    fn failed_setup_leaves_nothing_find_would_accept() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");

        let err = setup(&data, &dir.path().join("missing"), &mut |_| {}).unwrap_err();
        assert!(matches!(err, SetupError::PythonMissing { .. }), "{err:?}");

        let py = fake_python(dir.path(), "cpython-311", false);
        let err = setup(&data, &py, &mut |_| {}).unwrap_err();
        assert!(matches!(err, SetupError::VenvUnavailable { .. }), "{err:?}");
        assert!(
            err.to_string().contains("apt-get install python3-venv"),
            "{err}"
        );
        assert_nothing_left(&data);

        let bin2 = dir.path().join("b2");
        fs::create_dir(&bin2).unwrap();
        let py = fake_python(&bin2, "cpython-311", true);
        let mut events = Vec::new();
        let err = setup(&data, &py, &mut |e| events.push(e)).unwrap_err();
        match &err {
            SetupError::Command {
                step, output_tail, ..
            } => {
                assert!(step.starts_with("installing "), "{step}");
                assert!(
                    output_tail.contains("Could not find a version"),
                    "{output_tail}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert!(events.contains(&SetupEvent::Step("creating venv".into())));
        assert!(events.contains(&SetupEvent::Output("Collecting numpy==2.4.6".into())));
        assert_nothing_left(&data);
        assert!(PythonStack::find(&data, &py).is_none());

        let bin3 = dir.path().join("b3");
        fs::create_dir(&bin3).unwrap();
        let py = fake_python(&bin3, "cpython-312", true);
        let err = setup(&data, &py, &mut |_| {}).unwrap_err();
        assert!(
            matches!(err, SetupError::PythonUnsupported { .. }),
            "{err:?}"
        );
    }

    #[test]
    fn leftovers_of_dead_setups_are_removed() {
        let data = tempfile::tempdir().unwrap();
        let base = data.path().join("python");
        // pid 0 never names a live process in /proc; our own pid does.
        let dead = base.join(format!("{TMP_PREFIX}cp311-00-0-1"));
        let alive = base.join(format!("{TMP_PREFIX}cp311-00-{}-1", std::process::id()));
        let stale = base.join(format!("{STALE_PREFIX}cp311-00-1"));
        let stack = base.join("cp311-00");
        for d in [&dead, &alive, &stale, &stack] {
            fs::create_dir_all(d).unwrap();
        }
        remove_leftovers(&base);
        assert!(!dead.exists() && !stale.exists());
        assert!(alive.exists() && stack.exists());
    }

    #[test]
    fn relocation_rewrites_script_paths() {
        let dir = tempfile::tempdir().unwrap();
        let tmp = dir.path().join(".tmp-x");
        let root = dir.path().join("x");
        fs::create_dir_all(tmp.join("bin")).unwrap();
        let script = tmp.join("bin/f2py");
        fs::write(
            &script,
            format!("#!{}/bin/python\nimport sys\n", tmp.display()),
        )
        .unwrap();
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(tmp.join("pyvenv.cfg"), "home = /usr/bin\n").unwrap();
        relocate(&tmp, &root).unwrap();
        assert_eq!(
            fs::read_to_string(&script).unwrap(),
            format!("#!{}/bin/python\nimport sys\n", root.display())
        );
        assert_eq!(fs::metadata(&script).unwrap().mode() & 0o777, 0o755);
        assert_eq!(
            fs::read_to_string(tmp.join("pyvenv.cfg")).unwrap(),
            "home = /usr/bin\n"
        );
    }

    #[test]
    fn world_readable_walk() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path().join("a/b");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("f"), "x").unwrap();
        fs::write(d.join("x"), "x").unwrap();
        fs::set_permissions(d.join("f"), fs::Permissions::from_mode(0o600)).unwrap();
        fs::set_permissions(d.join("x"), fs::Permissions::from_mode(0o700)).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o700)).unwrap();
        crate::setup::make_world_readable(&dir.path().join("a")).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&d), 0o755);
        assert_eq!(mode(&d.join("f")), 0o644);
        assert_eq!(mode(&d.join("x")), 0o755);
    }

    fn tree_bytes(path: &Path) -> u64 {
        let Ok(meta) = fs::symlink_metadata(path) else {
            return 0;
        };
        if meta.is_dir() {
            fs::read_dir(path)
                .map(|d| d.flatten().map(|e| tree_bytes(&e.path())).sum())
                .unwrap_or(0)
        } else {
            meta.len()
        }
    }

    /// The real thing: downloads the locked wheels (about 150 MB, 30-60 s), once.
    #[test]
    fn real_setup_installs_a_working_stack() {
        let host = Path::new("/usr/bin/python3");
        if std::env::var_os("RUNCELL_SKIP_PYTHON_STACK_SETUP").is_some() || !host.exists() {
            eprintln!(
                "skipped: RUNCELL_SKIP_PYTHON_STACK_SETUP is set or there is no {}",
                host.display()
            );
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let mut events = Vec::new();
        let started = std::time::Instant::now();
        let stack = setup(&data, host, &mut |e| {
            if let SetupEvent::Step(s) | SetupEvent::Warning(s) = &e {
                eprintln!("setup: {s}");
            }
            events.push(e)
        })
        .unwrap_or_else(|e| panic!("setup failed: {e}"));
        eprintln!(
            "setup took {:?}; the stack is {} MiB",
            started.elapsed(),
            tree_bytes(&data) >> 20
        );
        assert_eq!(events.last(), Some(&SetupEvent::Done { reused: false }));
        assert!(events.contains(&SetupEvent::Step("creating venv".into())));
        assert!(events.iter().any(|e| matches!(e, SetupEvent::Output(_))));
        assert!(
            !events.iter().any(|e| matches!(e, SetupEvent::Warning(_))),
            "{events:?}"
        );

        // Every locked distribution, at the locked version.
        let lock = parse_lock(LOCK).unwrap();
        assert_eq!(stack.packages.len(), lock.len());
        for p in &lock {
            assert!(
                stack
                    .packages
                    .iter()
                    .any(|(n, v)| normalize(n) == normalize(&p.name) && *v == p.version),
                "{} {} missing from {:?}",
                p.name,
                p.version,
                stack.packages
            );
        }

        // Idempotent and quick the second time; `find` agrees.
        let again = std::time::Instant::now();
        let mut events = Vec::new();
        let second = setup(&data, host, &mut |e| events.push(e)).unwrap();
        assert!(again.elapsed() < std::time::Duration::from_secs(5));
        assert_eq!(events, vec![SetupEvent::Done { reused: true }]);
        assert_eq!(second.root, stack.root);
        assert_eq!(PythonStack::find(&data, host).unwrap().root, stack.root);

        // Nothing of the temporary build directory is left or referenced.
        let base = data.join("python");
        // (Besides the stack, only the cached identity of the host Python.)
        let names: Vec<_> = fs::read_dir(&base)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| !n.to_string_lossy().starts_with(".identity-"))
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from(&stack.id)]);
        let f2py = fs::read_to_string(stack.root.join("bin/f2py")).unwrap();
        assert!(
            f2py.starts_with(&format!("#!{}/bin/python", stack.root.display())),
            "{f2py}"
        );
        assert!(!fs::read_to_string(stack.root.join("pyvenv.cfg"))
            .unwrap()
            .contains(TMP_PREFIX));

        // World-readable, directories traversable.
        let site = stack.root.join("lib/python3.11/site-packages");
        for p in [
            data.clone(),
            base.clone(),
            stack.root.clone(),
            site.clone(),
            site.join("numpy/__init__.py"),
            site.join("numpy/__pycache__/__init__.cpython-311.pyc"),
            site.join("runcell_plots.py"),
            site.join("__pycache__/runcell_plots.cpython-311.pyc"),
        ] {
            let mode = fs::metadata(&p).unwrap().mode();
            let want = if p.is_dir() { 0o005 } else { 0o004 };
            assert_eq!(mode & want, want, "{} is {mode:o}", p.display());
        }

        // The font cache: relative paths (matplotlib's own fonts) or files under /usr.
        let files = stack.sandbox_files();
        assert_eq!(
            files.len(),
            1,
            "{:?}",
            files.iter().map(|f| &f.0).collect::<Vec<_>>()
        );
        let (cache_path, cache) = &files[0];
        assert!(cache_path.starts_with(SANDBOX_MPLCONFIGDIR));
        let name = cache_path
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        assert!(
            name.starts_with("fontlist-v") && name.ends_with(".json"),
            "{name}"
        );
        let json: serde_json::Value = serde_json::from_slice(cache).unwrap();
        let mut fonts = 0;
        for entry in json["ttflist"]
            .as_array()
            .unwrap()
            .iter()
            .chain(json["afmlist"].as_array().unwrap())
        {
            let fname = entry["fname"].as_str().unwrap();
            if fname.starts_with('/') {
                assert!(
                    fname.starts_with("/usr/") && Path::new(fname).is_file(),
                    "{fname}"
                );
            } else {
                assert!(
                    site.join("matplotlib/mpl-data").join(fname).is_file(),
                    "{fname}"
                );
            }
            fonts += 1;
        }
        assert!(fonts > 10, "{fonts} fonts");

        // Run the stack's Python on the host the way the sandbox will: a scratch directory
        // stands in for /tmp (seeded with `sandbox_files`), another for /workspace.
        let fake_tmp = dir.path().join("sandbox-tmp");
        let workspace = dir.path().join("workspace");
        fs::create_dir_all(&workspace).unwrap();
        for (path, content) in &files {
            let host_path = fake_tmp.join(path.strip_prefix("/tmp").unwrap());
            fs::create_dir_all(host_path.parent().unwrap()).unwrap();
            fs::write(&host_path, content).unwrap();
        }
        let seeded = fake_tmp.join(cache_path.strip_prefix("/tmp").unwrap());
        let seeded_mtime = fs::metadata(&seeded).unwrap().modified().unwrap();
        let figures = workspace.join("figures");
        let run = |code: &str, figures_dir: &Path| {
            let mut cmd = Command::new(&stack.python);
            cmd.arg("-c").arg(code).env_clear().current_dir(&workspace);
            for (k, v) in crate::base_env().into_iter().chain(stack.env()) {
                cmd.env(k, v);
            }
            cmd.env("HOME", &fake_tmp)
                .env("TMPDIR", &fake_tmp)
                .env("PYTHONDONTWRITEBYTECODE", "1")
                .env("MPLCONFIGDIR", fake_tmp.join(".config/matplotlib"))
                .env("RUNCELL_FIGURES_DIR", figures_dir)
                .output()
                .unwrap()
        };
        let code = r#"
import numpy, pandas, matplotlib, scipy, sympy, PIL, openpyxl
import scipy.linalg, scipy.stats, sympy.abc
import matplotlib.pyplot as plt
assert matplotlib.get_backend() == "module://runcell_plots", matplotlib.get_backend()
assert type(plt.gcf().canvas).__name__ == "FigureCanvasAgg"
import os
figures = os.environ["RUNCELL_FIGURES_DIR"]
plt.close("all")
plt.plot([1, 2]); plt.title("one")
plt.show()
assert plt.get_fignums() == [], plt.get_fignums()
assert os.listdir(figures) == ["figure-1.png"], os.listdir(figures)
fig = plt.figure(); plt.bar([1, 2], [3, 4])
fig.savefig("explicit.png")
plt.show(block=False)
assert sorted(os.listdir(figures)) == ["figure-1.png", "figure-2.png"], os.listdir(figures)
plt.figure(); plt.plot([3, 1])  # never shown: saved at exit
assert not os.path.exists(os.path.join(figures, "figure-3.png"))
print(numpy.linalg.inv([[1.0, 2.0], [3.0, 4.0]]).round(1).tolist())
"#;
        let out = run(code, &figures);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            "[[-2.0, 1.0], [1.5, -0.5]]"
        );
        // No warnings, no cache rebuild (which would rewrite the seeded file).
        assert_eq!(stderr, "", "unexpected stderr");
        assert_eq!(
            fs::metadata(&seeded).unwrap().modified().unwrap(),
            seeded_mtime
        );
        for png in [
            "figures/figure-1.png",
            "figures/figure-2.png",
            "figures/figure-3.png",
            "explicit.png",
        ] {
            let bytes = fs::read(workspace.join(png)).unwrap_or_else(|e| panic!("{png}: {e}"));
            assert!(
                bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
                "{png} is not a PNG"
            );
        }
        assert!(!figures.join("figure-4.png").exists());

        // An unwritable figures directory is a warning, not a failure.
        let out = run(
            "import matplotlib.pyplot as plt\nplt.plot([1])\nplt.show()\nprint('still here')",
            Path::new("/proc/runcell-no-such-dir/figures"),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "still here");
        assert!(stderr.contains("runcell_plots: cannot save"), "{stderr}");

        // A program that never imports matplotlib does not load it.
        let out = run("import sys\nprint('matplotlib' in sys.modules)", &figures);
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "False");
    }
}
