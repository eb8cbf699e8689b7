//! runcell-runtimes: the languages runcell runs, what each needs from the host, and how a
//! program in each is compiled and started inside a sandbox.
#![forbid(unsafe_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use runcell_jail::{Overlay, RootEntry};

pub mod go_cache;
pub mod python_stack;
pub mod setup;

pub use setup::{default_data_dir, SetupError, SetupEvent};

/// A supported language.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Language {
    Python,
    Node,
    Ruby,
    Go,
    Bash,
}

impl Language {
    pub const ALL: [Language; 5] = [
        Language::Python,
        Language::Node,
        Language::Ruby,
        Language::Go,
        Language::Bash,
    ];

    /// Parse a language name as users and models write it.
    pub fn parse(name: &str) -> Option<Language> {
        Some(match name.trim().to_ascii_lowercase().as_str() {
            "python" | "python3" | "py" => Language::Python,
            "node" | "nodejs" | "javascript" | "js" => Language::Node,
            "ruby" | "rb" => Language::Ruby,
            "go" | "golang" => Language::Go,
            "bash" | "sh" | "shell" => Language::Bash,
            _ => return None,
        })
    }

    /// The language of a source file, from its extension.
    pub fn from_path(path: &Path) -> Option<Language> {
        Some(
            match path.extension()?.to_str()?.to_ascii_lowercase().as_str() {
                "py" => Language::Python,
                "js" | "mjs" | "cjs" => Language::Node,
                "rb" => Language::Ruby,
                "go" => Language::Go,
                "sh" | "bash" => Language::Bash,
                _ => return None,
            },
        )
    }

    /// The canonical name (used in verdicts and listings).
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Node => "node",
            Language::Ruby => "ruby",
            Language::Go => "go",
            Language::Bash => "bash",
        }
    }

    /// The names `parse` accepts, for error messages.
    pub fn accepted_names() -> &'static str {
        "python, node (javascript), ruby, go, bash"
    }

    /// The file the code is written to, in /workspace.
    pub fn source_file(self) -> &'static str {
        match self {
            Language::Python => "main.py",
            Language::Node => "main.js",
            Language::Ruby => "main.rb",
            Language::Go => "main.go",
            Language::Bash => "main.sh",
        }
    }

    /// Where to look for the runtime on the host, in order.
    fn candidates(self) -> &'static [&'static str] {
        match self {
            Language::Python => &["/usr/bin/python3"],
            Language::Node => &["/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"],
            Language::Ruby => &["/usr/bin/ruby", "/usr/local/bin/ruby"],
            Language::Go => &["/usr/bin/go", "/usr/local/go/bin/go", "/usr/lib/go/bin/go"],
            Language::Bash => &["/usr/bin/bash", "/bin/bash"],
        }
    }

    /// How an operator installs the runtime (Debian and Ubuntu package names).
    pub fn install_hint(self) -> &'static str {
        match self {
            Language::Python => "apt-get install python3",
            Language::Node => "apt-get install nodejs",
            Language::Ruby => "apt-get install ruby",
            Language::Go => "apt-get install golang-go",
            Language::Bash => "apt-get install bash",
        }
    }

    fn display_name(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::Node => "Node.js",
            Language::Ruby => "Ruby",
            Language::Go => "Go",
            Language::Bash => "bash",
        }
    }
}

/// The runtime of a language is not installed on this host.
#[derive(Debug, thiserror::Error)]
#[error("{name} is not installed on this host (looked for {looked}); the operator can install it with: {hint}")]
pub struct Unavailable {
    pub language: Language,
    name: &'static str,
    looked: String,
    pub hint: &'static str,
}

/// A located runtime.
#[derive(Debug, Clone)]
pub struct Runtime {
    pub language: Language,
    /// The executable, as a path that is valid inside the sandbox (the host path: the host
    /// directories it lives in are bound at the same place).
    pub executable: PathBuf,
    /// Prepared host directories bound read-only at the same path (a Python stack's venv).
    pub extra_binds: Vec<PathBuf>,
    /// Host directories shown read-only at a fixed sandbox path (host, sandbox): a package
    /// layer, wherever the data directory is.
    pub shown: Vec<(PathBuf, PathBuf)>,
    /// Prepared caches shown writable through an overlay (Go's build cache).
    pub overlays: Vec<Overlay>,
    /// Environment added by what was prepared.
    pub extra_env: Vec<(String, String)>,
    /// Files placed in the sandbox before each program (absolute sandbox path, content).
    pub sandbox_files: Vec<(PathBuf, Vec<u8>)>,
    /// The curated Python packages (name, version), when the stack is installed.
    pub python_stack: Option<Vec<(String, String)>>,
}

/// Node's http, https and fetch through the egress proxy (see [`Runtime::with_proxy`]).
pub const NODE_PROXY_PRELOAD: &str = include_str!("../runners/node_proxy.js");
/// Where that module is placed in the sandbox.
pub const NODE_PROXY_PATH: &str = "/tmp/.runcell/node-proxy.js";

/// The warm Python interpreter's program (see [`Runtime::interpreter`]): one-shot cells for
/// the warm pool, and a session's cells.
pub const PYTHON_RUNNER: &str = include_str!("../runners/python.py");
/// The session interpreters of the other languages that have one.
pub const NODE_RUNNER: &str = include_str!("../runners/node.js");
pub const RUBY_RUNNER: &str = include_str!("../runners/ruby.rb");
pub const BASH_RUNNER: &str = include_str!("../runners/bash.sh");

/// Where a session's cell source is written (the interpreter reads it and removes it): in
/// /tmp, so that a session's /workspace holds only the user's files.
pub const SESSION_CELL_DIR: &str = "/tmp";
/// Where a bash session's cell finds its stdin (the shell cannot receive a descriptor).
pub const BASH_SESSION_STDIN: &str = "/tmp/.runcell-stdin";
/// Where a session call's own environment variables are given to the session's interpreter
/// (`NAME=value` entries, each ended by a NUL byte): it sets them for that call only, and
/// removes the file.
pub const SESSION_CALL_ENV: &str = "/tmp/.runcell-env";

/// Whether `name` can be a module to preload: dotted Python identifiers (`numpy`,
/// `matplotlib.pyplot`), nothing that could be read as an option.
pub fn is_module_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 200
        && name.split('.').all(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .is_some_and(|c| c == '_' || c.is_ascii_alphabetic())
                && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
        })
}

/// Where runcell keeps what `runcell setup` prepares.
#[derive(Debug, Clone)]
pub struct Host {
    pub data_dir: PathBuf,
}

impl Default for Host {
    fn default() -> Self {
        Host {
            data_dir: default_data_dir(),
        }
    }
}

/// A command to run in the sandbox.
#[derive(Debug, Clone)]
pub struct Invocation {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
}

/// How to run a program: write its source, optionally compile, then run.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Absolute sandbox path of the source file.
    pub source_path: PathBuf,
    pub compile: Option<Invocation>,
    pub run: Invocation,
}

/// The working directory of every program.
pub const WORKSPACE: &str = "/workspace";

/// /workspace's second name in every sandbox: E2B's home directory.
pub const HOME_ALIAS: &str = "/home/user";

/// /workspace's third name in every sandbox: the base directory of agent-sandbox's reference
/// runtime (`SANDBOX_BASE_DIR`, `/app` by default), where its users' commands find the files
/// they uploaded.
pub const APP_ALIAS: &str = "/app";

/// Where a run sees its package layer (the installed packages' `site`), whatever the host path
/// of the data directory: first on `PYTHONPATH`, read-only.
pub const PACKAGES_PATH: &str = "/opt/runcell/packages";
/// Where a compiled binary goes (outside /workspace, so it is not mistaken for an output).
const GO_BINARY: &str = "/tmp/.runcell/main";

/// Find a language's runtime on the host, with what `runcell setup` prepared for it.
pub fn locate(language: Language, host: &Host) -> Result<Runtime, Unavailable> {
    let mut rt = locate_in(language, Path::new("/"))?;
    if language == Language::Python {
        if let Some(stack) = python_stack::PythonStack::find(&host.data_dir, &rt.executable) {
            rt.executable = stack.python.clone();
            rt.extra_binds.push(stack.root.clone());
            rt.extra_env = stack.env();
            rt.sandbox_files = stack.sandbox_files();
            rt.python_stack = Some(stack.packages.clone());
        }
    }
    if language == Language::Go {
        if let Some(cache) = go_cache::find(&host.data_dir, &rt) {
            rt.overlays.push(Overlay {
                lower: cache.dir,
                target: PathBuf::from(go_cache::SANDBOX_GOCACHE),
            });
        }
    }
    Ok(rt)
}

/// `locate` against another root directory (for tests).
pub fn locate_in(language: Language, root: &Path) -> Result<Runtime, Unavailable> {
    for c in language.candidates() {
        let host = root.join(c.trim_start_matches('/'));
        if is_executable(&host) {
            return Ok(Runtime::bare(language, PathBuf::from(c)));
        }
    }
    Err(Unavailable {
        language,
        name: language.display_name(),
        looked: language.candidates().join(", "),
        hint: language.install_hint(),
    })
}

fn is_executable(p: &Path) -> bool {
    fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// The environment every program gets; nothing of runcell's own environment is passed on.
/// The environment variables runcell sets for a run in any runtime (the base environment, the
/// interpreters' and compilers' settings, the data stack's, a package layer's, the egress
/// proxy's, the plots' directory): a request's `env` may not name them. A test checks every
/// runtime's environment against this list.
pub const RESERVED_ENV: &[&str] = &[
    "PATH",
    "HOME",
    "USER",
    "LOGNAME",
    "LANG",
    "TMPDIR",
    "PWD",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "PYTHONPATH",
    "MPLBACKEND",
    "MPLCONFIGDIR",
    "VIRTUAL_ENV",
    "RUNCELL_FIGURES_DIR",
    "GOCACHE",
    "GOPATH",
    "GOENV",
    "GOFLAGS",
    "GOPROXY",
    "GOTOOLCHAIN",
    "GOTELEMETRY",
    "CGO_ENABLED",
    "NODE_OPTIONS",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
];

/// Variables runcell sets that a request's `env` may change (the data stack's thread counts: a
/// run given more CPUs may raise them).
pub const OVERRIDABLE_ENV: &[&str] = &["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"];

pub fn base_env() -> Vec<(String, String)> {
    [
        ("PATH", "/usr/local/bin:/usr/bin:/bin"),
        ("HOME", "/tmp"),
        ("USER", "sandbox"),
        ("LOGNAME", "sandbox"),
        ("LANG", "C.UTF-8"),
        ("TMPDIR", "/tmp"),
        ("PWD", WORKSPACE),
    ]
    .iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

impl Runtime {
    /// The runtime as installed, with nothing prepared.
    pub fn bare(language: Language, executable: PathBuf) -> Runtime {
        Runtime {
            language,
            executable,
            extra_binds: Vec::new(),
            shown: Vec::new(),
            overlays: Vec::new(),
            extra_env: Vec::new(),
            sandbox_files: Vec::new(),
            python_stack: None,
        }
    }

    /// The host parts this runtime needs, read-only. Everything lives under /usr on current
    /// distributions; the top-level /bin, /lib, ... are symlinks into it on merged-/usr systems
    /// (recreated as symlinks) and real directories elsewhere (bound).
    pub fn root_entries(&self) -> Vec<RootEntry> {
        let mut entries = root_entries_in(Path::new("/"));
        entries.extend(self.extra_binds.iter().map(|p| RootEntry::Bind {
            path: p.clone(),
            dir: true,
        }));
        entries.extend(self.shown.iter().map(|(path, at)| RootEntry::BindAt {
            path: path.clone(),
            at: at.clone(),
        }));
        // E2B's home directory, where code written for E2B sandboxes finds its files: the
        // same /workspace under a second name (a symlink in the sandbox's own root; nothing
        // of the host).
        entries.push(RootEntry::Symlink {
            path: PathBuf::from(HOME_ALIAS),
            target: PathBuf::from(WORKSPACE),
        });
        // The same for code written for agent-sandbox's python-runtime image.
        entries.push(RootEntry::Symlink {
            path: PathBuf::from(APP_ALIAS),
            target: PathBuf::from(WORKSPACE),
        });
        entries
    }

    /// The runtime's version, asked from the host binary (for `doctor` and listings).
    pub fn version(&self) -> Option<String> {
        let arg = if self.language == Language::Go {
            "version"
        } else {
            "--version"
        };
        let out = Command::new(&self.executable)
            .arg(arg)
            .env_clear()
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        parse_version(self.language, &text)
    }

    /// The command of a warm interpreter for this language: one that imports `preload` and
    /// then runs cells (a one-shot cell, or a session's cells; see `runners/`). Python has one
    /// for both; Node, Ruby and bash only for sessions (`session`); Go none (a Go session
    /// compiles and runs each cell as a program).
    pub fn interpreter(&self, preload: &[String], session: bool) -> Option<Invocation> {
        let plan = self.plan();
        let exe = self.executable.to_string_lossy().into_owned();
        let argv = match self.language {
            Language::Python => {
                let mut argv = vec![
                    exe,
                    "-c".to_string(),
                    PYTHON_RUNNER.to_string(),
                    plan.source_path.to_string_lossy().into_owned(),
                ];
                argv.extend(preload.iter().cloned());
                argv
            }
            Language::Node if session => vec![exe, "-e".into(), NODE_RUNNER.into()],
            Language::Ruby if session => vec![exe, "-e".into(), RUBY_RUNNER.into()],
            Language::Bash if session => {
                vec![exe, "-c".into(), BASH_RUNNER.into(), "bash".into()]
            }
            _ => return None,
        };
        Some(Invocation {
            argv,
            env: plan.run.env,
        })
    }

    /// Where a session's cell number `n` is written for the interpreter to read.
    pub fn session_cell_path(&self, n: u64) -> PathBuf {
        let ext = self
            .language
            .source_file()
            .rsplit('.')
            .next()
            .unwrap_or("txt");
        Path::new(SESSION_CELL_DIR).join(format!(".runcell-cell-{n}.{ext}"))
    }

    /// The plan for running `source` (the file content is written by the caller).
    /// This runtime for a run with network by permission, whose egress proxy listens on the
    /// sandbox's loopback at `port`: the proxy variables that Python (urllib, requests, pip),
    /// curl, Ruby and Go honour, with only the sandbox's own loopback exempt; and for Node,
    /// whose http, https and fetch ignore them, a module preloaded with `--require` that
    /// sends their connections through the proxy.
    pub fn with_proxy(&self, port: u16) -> Runtime {
        let mut rt = self.clone();
        let url = format!("http://127.0.0.1:{port}");
        for k in [
            "HTTP_PROXY",
            "HTTPS_PROXY",
            "ALL_PROXY",
            "http_proxy",
            "https_proxy",
            "all_proxy",
        ] {
            rt.extra_env.push((k.into(), url.clone()));
        }
        for k in ["NO_PROXY", "no_proxy"] {
            rt.extra_env
                .push((k.into(), "localhost,127.0.0.1,::1".into()));
        }
        if self.language == Language::Node {
            rt.sandbox_files.push((
                PathBuf::from(NODE_PROXY_PATH),
                NODE_PROXY_PRELOAD.as_bytes().to_vec(),
            ));
            rt.extra_env.push((
                "NODE_OPTIONS".into(),
                format!("--require={NODE_PROXY_PATH}"),
            ));
        }
        rt
    }

    /// This runtime with `dir` (a package layer's `site`) shown read-only at
    /// [`PACKAGES_PATH`] and first on Python's module path.
    pub fn with_python_path(&self, dir: PathBuf) -> Runtime {
        let mut rt = self.clone();
        rt.shown.push((dir, PathBuf::from(PACKAGES_PATH)));
        rt.extra_env
            .push(("PYTHONPATH".into(), PACKAGES_PATH.to_string()));
        rt
    }

    pub fn plan(&self) -> Plan {
        let source_path = Path::new(WORKSPACE).join(self.language.source_file());
        let src = source_path.to_string_lossy().into_owned();
        let exe = self.executable.to_string_lossy().into_owned();
        let mut env = base_env();
        let (compile, argv) = match self.language {
            Language::Python => {
                env.extend(kv(&[
                    // The standard library is read-only and user modules should not leave
                    // __pycache__ directories in /workspace.
                    ("PYTHONDONTWRITEBYTECODE", "1"),
                    // Output reaches the caller as it is written, also when streamed.
                    ("PYTHONUNBUFFERED", "1"),
                    ("MPLBACKEND", "Agg"),
                ]));
                (None, vec![exe, src])
            }
            Language::Node | Language::Ruby | Language::Bash => (None, vec![exe, src]),
            Language::Go => {
                env.extend(go_cache::go_env(go_cache::SANDBOX_GOCACHE, "/tmp/go"));
                let compile = Invocation {
                    argv: vec![exe, "build".into(), "-o".into(), GO_BINARY.into(), src],
                    env: env.clone(),
                };
                (Some(compile), vec![GO_BINARY.to_string()])
            }
        };
        merge_env(&mut env, &self.extra_env);
        let compile = compile.map(|mut c| {
            merge_env(&mut c.env, &self.extra_env);
            c
        });
        Plan {
            source_path,
            compile,
            run: Invocation { argv, env },
        }
    }

    /// Whether the runtime copes with RLIMIT_AS as a memory limit. Node and Go reserve large
    /// virtual address ranges up front and fail under an address-space limit, so for them only
    /// the cgroup limits memory.
    pub fn tolerates_address_space_limit(&self) -> bool {
        matches!(
            self.language,
            Language::Python | Language::Ruby | Language::Bash
        )
    }
}

/// The version number in a runtime's `--version` (or `go version`) output.
pub fn parse_version(language: Language, text: &str) -> Option<String> {
    let first = text.lines().next()?;
    let word = match language {
        // "go version go1.19.8 linux/amd64"
        Language::Go => first.split_whitespace().nth(2)?.trim_start_matches("go"),
        // "v20.20.2"
        Language::Node => first.trim().trim_start_matches('v'),
        // "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)"
        Language::Bash => first
            .split_whitespace()
            .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?
            .split('(')
            .next()?,
        // "Python 3.11.2", "ruby 3.1.2p20 (2022-04-12 ...)"
        Language::Python | Language::Ruby => first.split_whitespace().nth(1)?,
    };
    (!word.is_empty()).then(|| word.to_string())
}

/// Add `extra` to `env`, replacing variables of the same name (execve keeps duplicates, and
/// getenv returns the first).
fn merge_env(env: &mut Vec<(String, String)>, extra: &[(String, String)]) {
    env.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    env.extend(extra.iter().cloned());
}

fn kv(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The read-only host entries, found relative to `host_root` (for tests).
pub fn root_entries_in(host_root: &Path) -> Vec<RootEntry> {
    let mut entries = vec![RootEntry::Bind {
        path: PathBuf::from("/usr"),
        dir: true,
    }];
    for top in ["/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"] {
        let host = host_root.join(&top[1..]);
        match fs::symlink_metadata(&host) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(target) = fs::read_link(&host) {
                    entries.push(RootEntry::Symlink {
                        path: PathBuf::from(top),
                        target,
                    });
                }
            }
            Ok(m) if m.is_dir() => entries.push(RootEntry::Bind {
                path: PathBuf::from(top),
                dir: true,
            }),
            _ => {}
        }
    }
    // The dynamic loader's cache, the alternatives symlinks that /usr/bin entries point into,
    // fontconfig's configuration (read by matplotlib), and the public CA certificates that
    // TLS clients verify servers with (OpenSSL's default paths lead there; Debian's pip uses
    // its bundle): without them a run allowed a destination, or a package install, could not
    // speak HTTPS. Only certificates: private keys live in /etc/ssl/private, never shown.
    for (path, dir) in [
        ("/etc/ld.so.cache", false),
        ("/etc/alternatives", true),
        ("/etc/fonts", true),
        ("/etc/ssl/certs", true),
    ] {
        let host = host_root.join(&path[1..]);
        let exists = fs::symlink_metadata(&host)
            .map(|m| m.is_dir() == dir && !m.file_type().is_symlink())
            .unwrap_or(false);
        if exists {
            entries.push(RootEntry::Bind {
                path: PathBuf::from(path),
                dir,
            });
        }
    }
    entries
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_variable_runcell_sets_is_reserved() {
        let mut envs: Vec<(String, String)> = base_env();
        for language in Language::ALL {
            let rt = Runtime::bare(language, PathBuf::from("/usr/bin/x"));
            for rt in [
                rt.clone(),
                rt.with_proxy(3128),
                rt.with_python_path(PathBuf::from("/layer")),
            ] {
                let plan = rt.plan();
                envs.extend(plan.run.env);
                envs.extend(plan.compile.into_iter().flat_map(|c| c.env));
                envs.extend(rt.interpreter(&[], true).into_iter().flat_map(|i| i.env));
                envs.extend(rt.interpreter(&[], false).into_iter().flat_map(|i| i.env));
            }
        }
        envs.extend(go_cache::go_env("/tmp/c", "/tmp/p"));
        envs.extend(python_stack::PythonStack::at(PathBuf::from("/stack")).env());
        for (k, _) in envs {
            assert!(
                RESERVED_ENV.contains(&k.as_str()) || OVERRIDABLE_ENV.contains(&k.as_str()),
                "{k} is set but neither reserved nor meant to be changed"
            );
        }
    }

    #[test]
    fn names_and_extensions() {
        assert_eq!(Language::parse("JavaScript"), Some(Language::Node));
        assert_eq!(Language::parse("python3"), Some(Language::Python));
        assert_eq!(Language::parse("golang"), Some(Language::Go));
        assert_eq!(Language::parse("cobol"), None);
        assert_eq!(
            Language::from_path(Path::new("x/a.mjs")),
            Some(Language::Node)
        );
        assert_eq!(Language::from_path(Path::new("a.RB")), Some(Language::Ruby));
        assert_eq!(Language::from_path(Path::new("Makefile")), None);
        for l in Language::ALL {
            assert_eq!(Language::parse(l.name()), Some(l));
            assert_eq!(Language::from_path(Path::new(l.source_file())), Some(l));
        }
    }

    #[test]
    fn locate_reports_missing_runtime_with_install_hint() {
        let dir = tempfile::tempdir().unwrap();
        let err = locate_in(Language::Go, dir.path()).unwrap_err();
        assert!(
            err.to_string().contains("apt-get install golang-go"),
            "{err}"
        );
        fs::create_dir_all(dir.path().join("usr/bin")).unwrap();
        let go = dir.path().join("usr/bin/go");
        fs::write(&go, "#!/bin/sh\n").unwrap();
        // Not executable yet: still unavailable.
        assert!(locate_in(Language::Go, dir.path()).is_err());
        fs::set_permissions(&go, fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(
            locate_in(Language::Go, dir.path()).unwrap().executable,
            PathBuf::from("/usr/bin/go")
        );
    }

    #[test]
    fn root_entries_follow_the_host_layout() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("usr/lib")).unwrap();
        std::os::unix::fs::symlink("usr/lib", dir.path().join("lib")).unwrap();
        fs::create_dir_all(dir.path().join("sbin")).unwrap();
        fs::create_dir_all(dir.path().join("etc/alternatives")).unwrap();
        fs::write(dir.path().join("etc/ld.so.cache"), "").unwrap();
        let e = root_entries_in(dir.path());
        assert!(e.contains(&RootEntry::Symlink {
            path: "/lib".into(),
            target: "usr/lib".into()
        }));
        assert!(e.contains(&RootEntry::Bind {
            path: "/sbin".into(),
            dir: true
        }));
        assert!(e.contains(&RootEntry::Bind {
            path: "/etc/ld.so.cache".into(),
            dir: false
        }));
        assert!(e.contains(&RootEntry::Bind {
            path: "/etc/alternatives".into(),
            dir: true
        }));
        assert!(!e
            .iter()
            .any(|x| matches!(x, RootEntry::Bind { path, .. } if path == Path::new("/etc/fonts"))));
    }

    #[test]
    fn versions_are_parsed_from_each_runtimes_output() {
        let cases = [
            (Language::Go, "go version go1.19.8 linux/amd64\n", "1.19.8"),
            (Language::Node, "v20.20.2\n", "20.20.2"),
            (
                Language::Bash,
                "GNU bash, version 5.2.15(1)-release (x86_64-pc-linux-gnu)\n",
                "5.2.15",
            ),
            (Language::Python, "Python 3.11.2\n", "3.11.2"),
            (
                Language::Ruby,
                "ruby 3.1.2p20 (2022-04-12 revision 4491bb740a) [x86_64-linux-gnu]\n",
                "3.1.2p20",
            ),
        ];
        for (l, text, want) in cases {
            assert_eq!(parse_version(l, text).as_deref(), Some(want), "{l:?}");
        }
        assert_eq!(parse_version(Language::Python, ""), None);
    }

    #[test]
    fn go_is_compiled_then_run_from_tmp() {
        let rt = Runtime::bare(Language::Go, "/usr/bin/go".into());
        let plan = rt.plan();
        let compile = plan.compile.unwrap();
        assert_eq!(compile.argv[1], "build");
        assert_eq!(plan.run.argv, vec![GO_BINARY.to_string()]);
        assert!(plan
            .run
            .env
            .iter()
            .any(|(k, v)| k == "CGO_ENABLED" && v == "0"));
    }
}
