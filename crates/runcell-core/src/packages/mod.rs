//! Vetted package installs (Python), in two phases. A request may ask for packages the curated
//! stack lacks (`"packages": ["tabulate==0.9.0"]`), within the operator's policy (a list of
//! names, or any from the index):
//!
//! 1. the install ([`install`]): a sandbox of its own, whose only reachable destinations are
//!    the configured package index (and its file hosts), runs pip with binary wheels only
//!    (`--only-binary :all:`: no sdist is built, so no package code runs at install time) into
//!    /workspace/site; what it wrote there is copied out one file at a time into a new layer
//!    of the cache (so the server never holds more than one file of it), within what is left
//!    of the request's timeout;
//! 2. the run: the layer's `site` is shown read-only at its host path and put on `PYTHONPATH`;
//!    the run is offline unless the request also asked for network.
//!
//! The cache ([`cache`], under `<data dir>/packages`) is bounded and shared:
//! * a request's requirements are normalised (PEP 503 names, sorted extras and specifiers, one
//!   requirement per name), so `Tabulate` and `tabulate` are one requirement set; the set, the
//!   index and the interpreter make its *key*; a small alias record `keys/<key>` names the
//!   content layer the set installed;
//! * a content layer `layers/<hash of its files>` is shared by every set that installed the
//!   same files (`x`, `x!=0.1` and `x>=0` are one layer on disk);
//! * its total size stays within the operator's `cache_max_bytes`: a new layer evicts the
//!   least recently used layers no run is using (a run holds its layer with a shared `flock`
//!   until it ends; eviction needs the exclusive one), and a layer larger than the whole cache
//!   is refused. Locks on files, not in memory, so that servers sharing a data dir agree.
//!
//! A layer already in the cache is used without any install. One install per key at a time in
//! this process ([`inflight`]): a second request for the same set waits for the first, bounded
//! by its own timeout and cancellation; requests for other sets never wait for it.

mod cache;
mod inflight;
mod install;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use runcell_jail::KillSwitch;
use runcell_proxy::NetRule;
use runcell_runtimes::Runtime;
use sha2::{Digest, Sha256};

use crate::engine::Engine;
use crate::verdict::{ErrorCategory, PackagesReport, Verdict};

/// The operator's package policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackagePolicy {
    /// Names (PEP 503 normalized) a request may ask for. Empty and not `allow_any`: none.
    pub allow: Vec<String>,
    /// Any package from the index.
    pub allow_any: bool,
    /// The simple index (PEP 503), e.g. `https://pypi.org/simple`.
    pub index_url: String,
    /// Where the index's files are served from, when not from its own host (PyPI's are on
    /// files.pythonhosted.org).
    pub file_hosts: Vec<String>,
    /// Requirements per request.
    pub max_requirements: usize,
    /// How long an install may take (and never longer than what is left of its request's
    /// timeout).
    pub install_timeout: Duration,
    /// The most the package cache may hold on disk, all layers together: beyond it the least
    /// recently used layers that no run is using are removed, and a layer larger than this is
    /// refused.
    pub cache_max_bytes: u64,
}

impl Default for PackagePolicy {
    fn default() -> Self {
        PackagePolicy::new()
    }
}

impl PackagePolicy {
    pub fn new() -> PackagePolicy {
        PackagePolicy {
            allow: Vec::new(),
            allow_any: false,
            index_url: "https://pypi.org/simple".into(),
            file_hosts: vec!["files.pythonhosted.org:443".into()],
            max_requirements: 16,
            install_timeout: Duration::from_secs(300),
            cache_max_bytes: 2 << 30,
        }
    }
    /// Whether any package may be asked for at all.
    pub fn enabled(&self) -> bool {
        self.allow_any || !self.allow.is_empty()
    }

    /// The destinations the install may reach: the index's host and port, and the file hosts.
    pub fn destinations(&self) -> Result<Vec<NetRule>, String> {
        let (scheme, rest) = self
            .index_url
            .split_once("://")
            .ok_or_else(|| format!("the package index {:?} is not a URL", self.index_url))?;
        let default_port = match scheme {
            "https" => 443,
            "http" => 80,
            other => {
                return Err(format!(
                    "the package index's scheme {other:?} is not http(s)"
                ))
            }
        };
        let authority = rest.split('/').next().unwrap_or_default();
        let authority = authority.rsplit('@').next().unwrap_or(authority);
        let with_port = if authority.starts_with('[') {
            if authority.contains("]:") {
                authority.to_string()
            } else {
                format!("{authority}:{default_port}")
            }
        } else if authority.contains(':') {
            authority.to_string()
        } else {
            format!("{authority}:{default_port}")
        };
        let mut all = vec![with_port];
        all.extend(self.file_hosts.iter().cloned());
        runcell_proxy::parse_rules(&all).map_err(|e| format!("package index: {e}"))
    }
}

/// A name as PEP 503 compares them.
pub fn normalize_name(name: &str) -> String {
    let mut out = String::new();
    let mut sep = false;
    for c in name.chars() {
        if c == '-' || c == '_' || c == '.' {
            sep = true;
        } else {
            if sep && !out.is_empty() {
                out.push('-');
            }
            sep = false;
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// Whether `name` is a valid distribution (or extra) name: PEP 508 says ASCII letters, digits,
/// '-', '_' and '.', starting and ending with a letter or digit. pip refuses the others, and
/// normalising them would map e.g. `x_` onto `x`.
pub fn valid_name(name: &str) -> bool {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    name.len() <= MAX_NAME_BYTES
        && name.starts_with(alnum)
        && name.ends_with(alnum)
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// Longest name taken (PyPI's longest are under 80).
const MAX_NAME_BYTES: usize = 100;

/// Longest requirement taken, as asked.
const MAX_REQUIREMENT_BYTES: usize = 300;

/// One requirement: a name, optional extras, optional version specifiers. Nothing else (no
/// URLs, paths, options, markers): pip must not be told where else to look. Normalised, so
/// that two spellings of one requirement are equal.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requirement {
    /// The PEP 503 name.
    pub name: String,
    /// Normalised as names are, sorted, each once.
    pub extras: Vec<String>,
    /// Each an operator and a version, without blanks, the version in lower case (PEP 440
    /// compares versions without regard to case); sorted, each once.
    pub specifiers: Vec<String>,
    /// The canonical text: what pip is told, what the key hashes and what the verdict shows.
    pub text: String,
}

impl Requirement {
    fn new(name: String, mut extras: Vec<String>, mut specifiers: Vec<String>) -> Requirement {
        extras.sort();
        extras.dedup();
        specifiers.sort();
        specifiers.dedup();
        let mut text = name.clone();
        if !extras.is_empty() {
            text.push('[');
            text.push_str(&extras.join(","));
            text.push(']');
        }
        text.push_str(&specifiers.join(","));
        Requirement {
            name,
            extras,
            specifiers,
            text,
        }
    }

    /// Both together: pip combines two requirements of one name the same way (the union of
    /// the extras, all the specifiers).
    fn merge(self, other: Requirement) -> Requirement {
        let mut extras = self.extras;
        extras.extend(other.extras);
        let mut specifiers = self.specifiers;
        specifiers.extend(other.specifiers);
        Requirement::new(self.name, extras, specifiers)
    }
}

/// Parse and check `asked` against the policy: the requirements, normalised, one per name,
/// sorted by name.
pub fn check(asked: &[String], policy: &PackagePolicy) -> Result<Vec<Requirement>, String> {
    if asked.is_empty() {
        return Ok(Vec::new());
    }
    if !policy.enabled() {
        return Err(
            "this server allows no package installs (its operator can allow them in [packages])"
                .into(),
        );
    }
    if asked.len() > policy.max_requirements {
        return Err(format!(
            "{} requirements is more than the limit of {}",
            asked.len(),
            policy.max_requirements
        ));
    }
    let mut by_name: BTreeMap<String, Requirement> = BTreeMap::new();
    for a in asked {
        let r = parse_requirement(a)?;
        if !policy.allow_any && !policy.allow.iter().any(|n| normalize_name(n) == r.name) {
            return Err(format!(
                "the package {:?} is not allowed here; the packages allowed are: {}",
                r.name,
                policy.allow.join(", ")
            ));
        }
        let merged = match by_name.remove(&r.name) {
            Some(before) => before.merge(r),
            None => r,
        };
        by_name.insert(merged.name.clone(), merged);
    }
    Ok(by_name.into_values().collect())
}

/// `asked` normalised as [`check`] normalises it (one per name, sorted), without the policy:
/// the canonical texts, as a session keeps them to compare its calls' `packages` with.
pub fn normalize(asked: &[String]) -> Result<Vec<String>, String> {
    let mut by_name: BTreeMap<String, Requirement> = BTreeMap::new();
    for a in asked {
        let r = parse_requirement(a)?;
        let merged = match by_name.remove(&r.name) {
            Some(before) => before.merge(r),
            None => r,
        };
        by_name.insert(merged.name.clone(), merged);
    }
    Ok(by_name.into_values().map(|r| r.text).collect())
}

fn parse_requirement(text: &str) -> Result<Requirement, String> {
    let bad = || {
        format!(
            "{:?} is not a requirement runcell installs: give a name with optional extras \
             and version specifiers, e.g. tabulate==0.9.0 or pandas[excel]>=2,<3",
            crate::request::prefix(text, 120)
        )
    };
    if text.len() > MAX_REQUIREMENT_BYTES {
        return Err(format!(
            "a requirement of {} bytes is longer than the {MAX_REQUIREMENT_BYTES} taken",
            text.len()
        ));
    }
    let t = text.trim();
    let name_end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
        .unwrap_or(t.len());
    let name = &t[..name_end];
    if name.is_empty() {
        return Err(bad());
    }
    if !valid_name(name) {
        return Err(format!(
            "{:?} is not a requirement runcell installs: {name:?} is not a package name (a \
             name is ASCII letters, digits, '-', '_' and '.', and starts and ends with a \
             letter or digit: PEP 508)",
            crate::request::prefix(text, 120)
        ));
    }
    let mut rest = t[name_end..].trim_start();
    let mut extras = Vec::new();
    if let Some(r) = rest.strip_prefix('[') {
        let (inner, after) = r.split_once(']').ok_or_else(bad)?;
        for e in inner.split(',').map(str::trim) {
            if !valid_name(e) {
                return Err(bad());
            }
            extras.push(normalize_name(e));
        }
        rest = after.trim_start();
    }
    let mut specifiers = Vec::new();
    if !rest.is_empty() {
        for clause in rest.split(',') {
            let c = clause.trim();
            let op = ["===", "==", ">=", "<=", "~=", "!=", "<", ">"]
                .into_iter()
                .find(|op| c.starts_with(op))
                .ok_or_else(bad)?;
            let version = c[op.len()..].trim();
            if version.is_empty()
                || !version
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ".*+!-_".contains(ch))
            {
                return Err(bad());
            }
            specifiers.push(format!("{op}{}", version.to_ascii_lowercase()));
        }
    }
    Ok(Requirement::new(normalize_name(name), extras, specifiers))
}

/// The interpreter pip runs as in the install sandbox.
pub const INSTALLER: &str = "/usr/bin/python3";

/// A requirement set's key: the hash of the normalised set, the index and the interpreters
/// (the run's, and the installer's as its symlinks resolve, e.g. `/usr/bin/python3.11`, so
/// that an upgrade to another Python does not reuse wheels built for the one before).
pub fn layer_key(reqs: &[Requirement], index_url: &str, interpreters: &[PathBuf]) -> String {
    let mut h = Sha256::new();
    h.update(b"runcell packages 2\n");
    for r in reqs {
        h.update(r.text.as_bytes());
        h.update(b"\n");
    }
    h.update(b"index ");
    h.update(index_url.as_bytes());
    for i in interpreters {
        h.update(b"\ninterpreter ");
        h.update(i.as_os_str().as_encoded_bytes());
    }
    crate::to_hex(&h.finalize())[..32].to_string()
}

/// The installer's script (bash): pip, binary wheels only, into /workspace/site, without
/// bytecode (a layer's files get new times when they are copied out, so the `.pyc` files pip
/// would write are stale for every run; runs do not write bytecode).
pub fn install_script(reqs: &[Requirement], policy: &PackagePolicy) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut args = vec![
        INSTALLER.to_string(),
        "-m".into(),
        "pip".into(),
        "install".into(),
        // Neither the environment nor a user's configuration tells pip anything.
        "--isolated".into(),
        "--only-binary=:all:".into(),
        "--no-cache-dir".into(),
        "--no-compile".into(),
        "--disable-pip-version-check".into(),
        "--no-input".into(),
        "--progress-bar=off".into(),
        "--no-warn-script-location".into(),
        "--target".into(),
        "/workspace/site".into(),
        "--index-url".into(),
        quote(&policy.index_url),
    ];
    if let Some(rest) = policy.index_url.strip_prefix("http://") {
        // pip ignores a plain-HTTP index unless it is named trusted.
        let host = rest.split('/').next().unwrap_or_default();
        let host = host.rsplit('@').next().unwrap_or(host);
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        args.push("--trusted-host".into());
        args.push(quote(host));
    }
    // "--": whatever a requirement looked like, pip takes it as one.
    args.push("--".into());
    args.extend(reqs.iter().map(|r| quote(&r.text)));
    format!(
        "if ! {INSTALLER} -m pip --version >/dev/null 2>&1; then\n  echo 'pip is not \
         installed on this host (Debian: python3-pip)' >&2\n  exit 3\nfi\n{}\n",
        args.join(" ")
    )
}

/// The engine's package layers: the installs in flight in this process (the cache itself is
/// on disk). The engine's clones share it.
#[derive(Debug, Clone, Default)]
pub struct Packages {
    inflight: Arc<inflight::InFlight>,
}

/// A layer a run uses: its `site` directory, and what the verdict says of it. Holding it keeps
/// the layer in the cache (it is not evicted); drop it when the run is over.
#[derive(Debug)]
pub struct Layer {
    lease: cache::Lease,
    report: PackagesReport,
}

impl Layer {
    /// The directory to put on the run's `PYTHONPATH` (bound read-only).
    pub fn site(&self) -> PathBuf {
        self.lease.dir().join("site")
    }

    pub fn report(&self) -> &PackagesReport {
        &self.report
    }
}

impl Packages {
    /// The layer of `reqs` for a run of `python`: from the cache, or installed now (phase
    /// one), all within `deadline` (the request's timeout) and until `cancel` fires; or the
    /// verdict of why not.
    pub fn layer(
        &self,
        engine: &Engine,
        reqs: &[Requirement],
        python: &Runtime,
        deadline: Instant,
        cancel: Option<&KillSwitch>,
    ) -> Result<Layer, Box<Verdict>> {
        let config = engine.config();
        let policy = &config.packages;
        let installer = std::fs::canonicalize(INSTALLER).unwrap_or_else(|_| INSTALLER.into());
        let key = layer_key(
            reqs,
            &policy.index_url,
            &[python.executable.clone(), installer],
        );
        let cache = cache::Cache::new(
            config.host.data_dir.join("packages"),
            policy.cache_max_bytes,
        );
        let texts: Vec<String> = reqs.iter().map(|r| r.text.clone()).collect();
        let report = |lease: &cache::Lease, install: Option<Duration>| PackagesReport {
            requirements: texts.clone(),
            layer: lease.content_key().to_string(),
            cached: install.is_none(),
            install_seconds: install.map(|d| (d.as_secs_f64() * 1e6).round() / 1e6),
        };
        loop {
            if let Some(lease) = cache.lookup(&key) {
                let report = report(&lease, None);
                return Ok(Layer { lease, report });
            }
            match self.inflight.begin(&key).map_err(|e| {
                failed(
                    ErrorCategory::SandboxFailure,
                    format!("Installing packages: cannot wait for another install ({e})."),
                )
            })? {
                inflight::Turn::Install(_ticket) => {
                    // Installed by another request between the look and the ticket?
                    if let Some(lease) = cache.lookup(&key) {
                        let report = report(&lease, None);
                        return Ok(Layer { lease, report });
                    }
                    let started = Instant::now();
                    let job = install::Job {
                        engine,
                        cache: &cache,
                        key: &key,
                        reqs,
                        deadline,
                        cancel,
                    };
                    let lease = job.run()?;
                    let report = report(&lease, Some(started.elapsed()));
                    return Ok(Layer { lease, report });
                }
                inflight::Turn::Wait(done) => match done.wait(deadline, cancel) {
                    // Look again: installed, or the other install failed and this request
                    // tries on its own.
                    inflight::Waited::Done => continue,
                    inflight::Waited::TimedOut => {
                        return Err(failed(
                            ErrorCategory::Timeout,
                            format!(
                                "The packages {} did not finish installing within the request's \
                                 timeout: another request is installing them and this one \
                                 waited for it. Retry later (the layer is then likely in the \
                                 cache) or ask for a longer timeout.",
                                texts.join(" ")
                            ),
                        ))
                    }
                    inflight::Waited::Cancelled => {
                        return Err(failed(
                            ErrorCategory::Cancelled,
                            "The run was cancelled while it waited for its packages to be \
                             installed.",
                        ))
                    }
                },
            }
        }
    }
}

fn failed(category: ErrorCategory, message: impl Into<String>) -> Box<Verdict> {
    Box::new(Verdict::failed(category, message))
}

/// Whether `s` is a key as [`layer_key`] and the cache make them (32 lower-case hex digits):
/// what is read back from the disk is checked before it names a path.
fn is_key(s: &str) -> bool {
    s.len() == 32
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// `p`'s file name as a key, if it is one.
fn key_of(p: &Path) -> Option<&str> {
    p.file_name().and_then(|n| n.to_str()).filter(|n| is_key(n))
}
#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> PackagePolicy {
        let mut p = PackagePolicy::new();
        p.allow = allow.iter().map(|s| s.to_string()).collect();
        p
    }

    #[test]
    fn requirements_are_names_extras_and_versions_only() {
        let p = policy(&["tabulate", "Pandas"]);
        let r = check(
            &["tabulate==0.9.0".into(), "pandas[excel]>=2,<3".into()],
            &p,
        )
        .unwrap();
        assert_eq!(
            r.iter().map(|r| r.name.as_str()).collect::<Vec<_>>(),
            ["pandas", "tabulate"]
        );
        for bad in [
            "https://evil/x.whl",
            "tabulate @ https://evil/x.whl",
            "--index-url=https://evil",
            "-r req.txt",
            "./local",
            "tabulate; python_version<'4'",
            "tabulate==",
            "tabulate==0.9 --pre",
            "",
        ] {
            assert!(check(&[bad.into()], &p).is_err(), "{bad:?}");
        }
        let e = check(&["requests".into()], &p).unwrap_err();
        assert!(e.contains("not allowed") && e.contains("tabulate"), "{e}");
        let e = check(&["x".into()], &PackagePolicy::new()).unwrap_err();
        assert!(e.contains("no package installs"), "{e}");
        let mut any = policy(&[]);
        any.allow_any = true;
        assert!(check(&["Some_Package.Name==1".into()], &any).is_ok());
        assert_eq!(normalize_name("Some_Package.Name"), "some-package-name");
    }

    #[test]
    fn the_install_reaches_only_the_index_and_its_file_hosts() {
        let p = PackagePolicy::new();
        let d: Vec<String> = p
            .destinations()
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(d, ["pypi.org:443", "files.pythonhosted.org:443"]);
        let mut p = policy(&[]);
        p.index_url = "http://127.0.0.2:8080/simple".into();
        p.file_hosts.clear();
        let d: Vec<String> = p
            .destinations()
            .unwrap()
            .iter()
            .map(|r| r.to_string())
            .collect();
        assert_eq!(d, ["127.0.0.2:8080"]);
        let s = install_script(
            &check(&["tabulate==0.9.0".into()], &{
                let mut q = p.clone();
                q.allow_any = true;
                q
            })
            .unwrap(),
            &p,
        );
        assert!(
            s.contains("--only-binary=:all:") && s.contains("--trusted-host '127.0.0.2'"),
            "{s}"
        );
        assert!(
            s.contains("--no-compile") && s.contains("-- 'tabulate==0.9.0'"),
            "{s}"
        );
        let key = |r: &str| {
            layer_key(
                &check(&[r.into()], &policy(&["tabulate"])).unwrap(),
                "i",
                &["/p".into()],
            )
        };
        assert_ne!(key("tabulate==0.9.0"), key("tabulate==0.9.1"));
        assert_eq!(key("tabulate==0.9.0").len(), 32);
        assert!(is_key(&key("tabulate")));
    }

    /// Attack pass: each spelling of one requirement (`x`, `X`, `x ==1, >=0`) was a layer
    /// of its own, and `X_` was taken (pip refuses it; normalised it is `x`).
    #[test]
    fn spellings_of_one_requirement_set_are_one_key_and_invalid_names_are_refused() {
        let mut any = policy(&[]);
        any.allow_any = true;
        let key = |asked: &[&str]| {
            let reqs = check(
                &asked.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
                &any,
            )
            .unwrap();
            (
                layer_key(&reqs, "i", &["/p".into()]),
                reqs.iter().map(|r| r.text.clone()).collect::<Vec<_>>(),
            )
        };
        let (k, texts) = key(&["Tabulate[Wide_Chars , wide-chars]>=0.8 , ==0.9.0RC1"]);
        assert_eq!(texts, ["tabulate[wide-chars]==0.9.0rc1,>=0.8"]);
        for same in [
            &["tabulate[wide.chars]==0.9.0rc1,>=0.8"][..],
            &["TABULATE[wide_chars] >= 0.8, == 0.9.0rc1"],
            &[
                "tabulate>=0.8",
                "tabulate[wide-chars]==0.9.0rc1",
                "tabulate>=0.8",
            ],
        ] {
            assert_eq!(key(same).0, k, "{same:?}");
        }
        // The order of the set does not matter; its content does.
        assert_eq!(key(&["a", "b==1"]).0, key(&["B==1", "A"]).0);
        assert_ne!(key(&["a"]).0, key(&["a!=0.1"]).0);
        assert_ne!(key(&["a"]).0, key(&["a[x]"]).0);
        for bad in ["X_", "_x", "x-", "x.", "x[_e]", "x[e-]", "x[]", "x y"] {
            let e = check(&[bad.to_string()], &any).unwrap_err();
            assert!(
                e.contains("not a package name") || e.contains("not a requirement"),
                "{bad:?}: {e}"
            );
        }
        // Blanks around the parts are not part of them.
        assert_eq!(key(&["x ==1\n, <2"]).1, ["x<2,==1"]);
        let long = format!("x=={}", "1".repeat(400));
        assert!(check(&[long], &any).unwrap_err().contains("longer than"));
        assert!(valid_name("a") && valid_name("a.b-c_d9") && !valid_name(""));
    }
}
