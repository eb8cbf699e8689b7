//! Vetted package installs (Python), in two phases. A request may ask for packages the curated
//! stack lacks (`"packages": ["tabulate==0.9.0"]`), within the operator's policy (a list of
//! names, or any from the index):
//!
//! 1. the install: a sandbox of its own, whose only reachable destinations are the configured
//!    package index (and its file hosts), runs pip with binary wheels only (`--only-binary
//!    :all:`: no sdist is built, so no package code runs at install time) into /workspace;
//!    what it wrote is collected into a layer of the cache, named by the hash of the
//!    requirement set, the index and the interpreter, and written there once, atomically;
//! 2. the run: the layer is shown read-only at its host path and put on `PYTHONPATH`; the run
//!    is offline unless the request also asked for network.
//!
//! A layer already in the cache is used without any install.

use std::path::Path;
use std::time::Duration;

use runcell_proxy::NetRule;
use sha2::{Digest, Sha256};

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
    /// How long an install may take.
    pub install_timeout: Duration,
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

/// One requirement: a name, optional extras, optional version specifiers. Nothing else (no
/// URLs, paths, options, markers): pip must not be told where else to look.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Requirement {
    pub name: String,
    pub text: String,
}

/// Parse and check `asked` against the policy.
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
    let mut reqs = Vec::new();
    for a in asked {
        let r = parse_requirement(a)?;
        if !policy.allow_any && !policy.allow.iter().any(|n| normalize_name(n) == r.name) {
            return Err(format!(
                "the package {:?} is not allowed here; the packages allowed are: {}",
                r.name,
                policy.allow.join(", ")
            ));
        }
        reqs.push(r);
    }
    reqs.sort();
    reqs.dedup();
    Ok(reqs)
}

fn parse_requirement(text: &str) -> Result<Requirement, String> {
    let t = text.trim();
    let bad = || {
        format!(
            "{text:?} is not a requirement runcell installs: give a name with optional extras \
             and version specifiers, e.g. tabulate==0.9.0 or pandas[excel]>=2,<3"
        )
    };
    let name_end = t
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.'))
        .unwrap_or(t.len());
    let name = &t[..name_end];
    if name.is_empty() || !name.starts_with(|c: char| c.is_ascii_alphanumeric()) || name.len() > 100
    {
        return Err(bad());
    }
    let mut rest = &t[name_end..];
    if let Some(r) = rest.strip_prefix('[') {
        let (extras, after) = r.split_once(']').ok_or_else(bad)?;
        if !extras.split(',').all(|e| {
            !e.trim().is_empty()
                && e.trim()
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        }) {
            return Err(bad());
        }
        rest = after;
    }
    let spec = rest.trim();
    if !spec.is_empty() {
        for clause in spec.split(',') {
            let c = clause.trim();
            let op_len = ["===", "==", ">=", "<=", "~=", "!=", "<", ">"]
                .iter()
                .find(|op| c.starts_with(**op))
                .map(|op| op.len())
                .ok_or_else(bad)?;
            let version = c[op_len..].trim();
            if version.is_empty()
                || !version
                    .chars()
                    .all(|ch| ch.is_ascii_alphanumeric() || ".*+!-_".contains(ch))
            {
                return Err(bad());
            }
        }
    }
    Ok(Requirement {
        name: normalize_name(name),
        text: t.to_string(),
    })
}

/// The layer's name: the hash of the requirement set, the index and the interpreter.
pub fn layer_key(reqs: &[Requirement], index_url: &str, interpreter: &Path) -> String {
    let mut h = Sha256::new();
    for r in reqs {
        h.update(r.text.as_bytes());
        h.update(b"\n");
    }
    h.update(index_url.as_bytes());
    h.update(b"\n");
    h.update(interpreter.as_os_str().as_encoded_bytes());
    crate::to_hex(&h.finalize())[..32].to_string()
}

/// The marker of a complete layer.
pub const COMPLETE: &str = ".runcell-complete";

/// The installer's script (bash): pip, binary wheels only, into /workspace/site.
pub fn install_script(reqs: &[Requirement], policy: &PackagePolicy) -> String {
    let quote = |s: &str| format!("'{}'", s.replace('\'', "'\\''"));
    let mut args = vec![
        "/usr/bin/python3".to_string(),
        "-m".into(),
        "pip".into(),
        "install".into(),
        "--only-binary=:all:".into(),
        "--no-cache-dir".into(),
        "--disable-pip-version-check".into(),
        "--no-input".into(),
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
    args.extend(reqs.iter().map(|r| quote(&r.text)));
    format!(
        "if ! /usr/bin/python3 -m pip --version >/dev/null 2>&1; then\n  echo 'pip is not \
         installed on this host (Debian: python3-pip)' >&2\n  exit 3\nfi\n{}\n",
        args.join(" ")
    )
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
        let a = layer_key(
            &check(&["tabulate==0.9.0".into()], &policy(&["tabulate"])).unwrap(),
            "i",
            "/p".as_ref(),
        );
        let b = layer_key(
            &check(&["tabulate==0.9.1".into()], &policy(&["tabulate"])).unwrap(),
            "i",
            "/p".as_ref(),
        );
        assert_ne!(a, b);
        assert_eq!(a.len(), 32);
    }
}
