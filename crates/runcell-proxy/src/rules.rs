//! Allowlist entries: `HOST[:PORT]`, where HOST is a name (`api.github.com`), a wildcard over
//! a domain's subdomains (`*.pypi.org`: `files.pypi.org`, `a.b.pypi.org`, not `pypi.org`
//! itself), or a literal address (`127.0.0.2`, `[::1]`). Without a port an entry allows every
//! port, as Deno's `--allow-net` does.
//!
//! The operator's policy bounds what a run may ask for: a run's entry must be
//! [covered](NetRule::covers) by one of the policy's. A special address (loopback, private,
//! link-local, metadata, the host's own: see [`crate::addr`]) is reachable only when both the
//! run and the operator name it literally with its port: a name never grants one, whatever it
//! resolves to.

use std::fmt;
use std::net::IpAddr;

/// What an entry's host part is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// A DNS name, lowercase, without a trailing dot.
    Name(String),
    /// `*.suffix`: any name strictly below `suffix`.
    Below(String),
    /// A literal address.
    Ip(IpAddr),
}

/// One allowlist entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetRule {
    pub host: HostPattern,
    /// `None`: every port.
    pub port: Option<u16>,
}

/// Why an entry cannot be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("network entry {entry:?}: {why}")]
pub struct RuleError {
    pub entry: String,
    pub why: String,
}

/// A name as DNS has it, lowercased and without a final dot; `None` when it is not one.
pub fn normalize_name(name: &str) -> Option<String> {
    let n = name.trim_end_matches('.').to_ascii_lowercase();
    let ok = !n.is_empty()
        && n.len() <= 253
        && n.split('.').all(|label| {
            !label.is_empty()
                && label.len() <= 63
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        });
    ok.then_some(n)
}

impl NetRule {
    pub fn parse(entry: &str) -> Result<NetRule, RuleError> {
        let err = |why: &str| RuleError {
            entry: entry.to_string(),
            why: why.to_string(),
        };
        let e = entry.trim();
        if e.is_empty() {
            return Err(err("empty"));
        }
        if e.contains("://") || e.contains('/') {
            return Err(err("give a host and an optional port, not a URL"));
        }
        // [v6]:port, [v6], v4:port, name:port, or a bare v6 address.
        let (host, port) = if let Some(rest) = e.strip_prefix('[') {
            let (h, after) = rest.split_once(']').ok_or_else(|| err("an unclosed '['"))?;
            match after {
                "" => (h, None),
                p => (
                    h,
                    Some(p.strip_prefix(':').ok_or_else(|| err("junk after ']'"))?),
                ),
            }
        } else if e.parse::<IpAddr>().is_ok() {
            (e, None)
        } else {
            match e.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (e, None),
            }
        };
        let port = match port {
            None => None,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(err("the port must be a number from 1 to 65535")),
                Ok(n) => Some(n),
            },
        };
        let host = if let Ok(ip) = host.parse::<IpAddr>() {
            HostPattern::Ip(ip)
        } else if let Some(suffix) = host.strip_prefix("*.") {
            HostPattern::Below(
                normalize_name(suffix).ok_or_else(|| err("not a host name after '*.'"))?,
            )
        } else if host.contains('*') {
            return Err(err("a wildcard may only be a leading '*.'"));
        } else {
            HostPattern::Name(normalize_name(host).ok_or_else(|| err("not a host name"))?)
        };
        if let HostPattern::Below(s) = &host {
            if !s.contains('.') {
                return Err(err("a wildcard needs a domain with a dot (*.example.com)"));
            }
        }
        Ok(NetRule { host, port })
    }

    /// Whether a connection to `host` (normalized name or address text) on `port` is allowed
    /// by this entry, as far as names go (special addresses are checked apart).
    pub fn matches(&self, host: &Destination, port: u16) -> bool {
        if self.port.is_some_and(|p| p != port) {
            return false;
        }
        match (&self.host, host) {
            (HostPattern::Name(n), Destination::Name(h)) => n == h,
            (HostPattern::Below(s), Destination::Name(h)) => is_below(h, s),
            (HostPattern::Ip(a), Destination::Ip(b)) => a == b,
            _ => false,
        }
    }

    /// Whether everything `other` allows, this entry allows too.
    pub fn covers(&self, other: &NetRule) -> bool {
        match (self.port, other.port) {
            (Some(_), None) => return false,
            (Some(a), Some(b)) if a != b => return false,
            _ => {}
        }
        match (&self.host, &other.host) {
            (HostPattern::Name(a), HostPattern::Name(b)) => a == b,
            (HostPattern::Ip(a), HostPattern::Ip(b)) => a == b,
            (HostPattern::Below(s), HostPattern::Name(n)) => is_below(n, s),
            (HostPattern::Below(s), HostPattern::Below(t)) => t == s || is_below(t, s),
            _ => false,
        }
    }

    /// This entry names exactly `ip` and `port` (what a special address needs).
    pub fn names_literally(&self, ip: IpAddr, port: u16) -> bool {
        self.host == HostPattern::Ip(ip) && self.port == Some(port)
    }
}

impl fmt::Display for NetRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.host, self.port) {
            (HostPattern::Name(n), None) => write!(f, "{n}"),
            (HostPattern::Name(n), Some(p)) => write!(f, "{n}:{p}"),
            (HostPattern::Below(s), None) => write!(f, "*.{s}"),
            (HostPattern::Below(s), Some(p)) => write!(f, "*.{s}:{p}"),
            (HostPattern::Ip(IpAddr::V6(a)), None) => write!(f, "[{a}]"),
            (HostPattern::Ip(IpAddr::V6(a)), Some(p)) => write!(f, "[{a}]:{p}"),
            (HostPattern::Ip(a), None) => write!(f, "{a}"),
            (HostPattern::Ip(a), Some(p)) => write!(f, "{a}:{p}"),
        }
    }
}

/// `name` is strictly below `domain` (`a.b.pypi.org` below `pypi.org`).
fn is_below(name: &str, domain: &str) -> bool {
    name.strip_suffix(domain)
        .is_some_and(|head| head.len() > 1 && head.ends_with('.'))
}

/// Where a connection asks to go: a name or a literal address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    Name(String),
    Ip(IpAddr),
}

impl Destination {
    /// From the host part of a CONNECT authority or a URL (`[v6]` brackets allowed).
    pub fn parse(host: &str) -> Option<Destination> {
        let h = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        if let Ok(ip) = h.parse::<IpAddr>() {
            return Some(Destination::Ip(ip));
        }
        normalize_name(h).map(Destination::Name)
    }
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Destination::Name(n) => f.write_str(n),
            Destination::Ip(a) => write!(f, "{a}"),
        }
    }
}

/// Parse a list of entries (the policy's or a run's).
pub fn parse_rules<S: AsRef<str>>(entries: &[S]) -> Result<Vec<NetRule>, RuleError> {
    entries.iter().map(|e| NetRule::parse(e.as_ref())).collect()
}

/// The first of a run's entries that no entry of the policy covers.
pub fn first_not_covered<'a>(policy: &[NetRule], asked: &'a [NetRule]) -> Option<&'a NetRule> {
    asked.iter().find(|a| !policy.iter().any(|p| p.covers(a)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(s: &str) -> NetRule {
        NetRule::parse(s).unwrap()
    }

    #[test]
    fn entries_parse_and_print_back() {
        for (entry, shown) in [
            ("api.github.com", "api.github.com"),
            ("API.GitHub.com.:443", "api.github.com:443"),
            ("*.pypi.org:443", "*.pypi.org:443"),
            ("127.0.0.2:8080", "127.0.0.2:8080"),
            ("[::1]:8080", "[::1]:8080"),
            ("::1", "[::1]"),
            ("169.254.169.254", "169.254.169.254"),
        ] {
            assert_eq!(r(entry).to_string(), shown, "{entry}");
        }
        for bad in [
            "",
            "http://x.com",
            "x.com/path",
            "x.com:0",
            "x.com:70000",
            "*.com",
            "a*.b.com",
            "*",
            "[::1",
            "-x.com",
            "x..com",
        ] {
            assert!(NetRule::parse(bad).is_err(), "{bad:?} parsed");
        }
    }

    #[test]
    fn matching_names_wildcards_ports_and_addresses() {
        let name = |s: &str| Destination::parse(s).unwrap();
        assert!(r("api.github.com").matches(&name("API.github.com."), 443));
        assert!(r("api.github.com").matches(&name("api.github.com"), 22));
        assert!(!r("api.github.com:443").matches(&name("api.github.com"), 80));
        assert!(!r("api.github.com").matches(&name("github.com"), 443));
        assert!(r("*.pypi.org").matches(&name("files.pypi.org"), 443));
        assert!(r("*.pypi.org").matches(&name("a.b.pypi.org"), 443));
        assert!(!r("*.pypi.org").matches(&name("pypi.org"), 443));
        assert!(!r("*.pypi.org").matches(&name("evilpypi.org"), 443));
        assert!(r("127.0.0.2:8080").matches(&name("127.0.0.2"), 8080));
        assert!(!r("127.0.0.2:8080").matches(&name("localhost"), 8080));
        assert!(r("[::1]:80").matches(&name("[::1]"), 80));
    }

    #[test]
    fn a_policy_covers_what_is_narrower() {
        assert!(r("*.github.com").covers(&r("api.github.com:443")));
        assert!(r("*.github.com").covers(&r("*.api.github.com")));
        assert!(!r("*.github.com").covers(&r("github.com")));
        let everything_com = NetRule {
            host: HostPattern::Below("com".into()),
            port: None,
        };
        assert!(!r("*.github.com").covers(&everything_com));
        assert!(r("api.github.com").covers(&r("api.github.com:443")));
        assert!(!r("api.github.com:443").covers(&r("api.github.com")));
        assert!(!r("api.github.com:443").covers(&r("api.github.com:80")));
        assert!(r("127.0.0.2:8080").covers(&r("127.0.0.2:8080")));
        assert!(!r("127.0.0.2").covers(&r("localhost")));
        let policy = parse_rules(&["*.pypi.org:443", "127.0.0.2:8080"]).unwrap();
        let asked = parse_rules(&["files.pypi.org:443", "example.com"]).unwrap();
        assert_eq!(
            first_not_covered(&policy, &asked).map(|r| r.to_string()),
            Some("example.com".into())
        );
        assert!(r("127.0.0.2:8080").names_literally("127.0.0.2".parse().unwrap(), 8080));
        assert!(!r("127.0.0.2").names_literally("127.0.0.2".parse().unwrap(), 8080));
    }
}
