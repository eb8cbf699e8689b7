//! Network by permission: the operator's policy (which destinations runs may ask for, and how
//! much each run may use), a run's validated allowlist, and the permit its egress proxy
//! enforces (see `runcell-proxy` and docs/isolation.md, "Network by permission").

use std::time::Duration;

use runcell_proxy::{NetRule, Permit, RuleError};

/// The operator's network policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkPolicy {
    /// What runs may ask for. Empty: no network for anyone (the default).
    pub allow: Vec<NetRule>,
    /// Connections per run, tried or made.
    pub max_connections: u32,
    /// Bytes per run, both ways together.
    pub max_bytes: u64,
    /// How long connecting to one destination may take.
    pub connect_timeout: Duration,
    /// A run that asks for network waits for a person's approval (the server's
    /// `/v1/approvals`, or the MCP client's user through elicitation).
    pub approval: bool,
    /// How long such a run waits before it is refused.
    pub approval_timeout: Duration,
    /// Over MCP (HTTP), the client's user approves through elicitation instead of the admin
    /// queue. Off by default: the client is the caller itself, so its "user" may be an agent
    /// approving its own runs. (`runcell mcp` on stdio always asks its local user.)
    pub approval_by_client: bool,
}

impl Default for NetworkPolicy {
    fn default() -> Self {
        NetworkPolicy {
            allow: Vec::new(),
            max_connections: 64,
            max_bytes: 64 << 20,
            connect_timeout: Duration::from_secs(10),
            approval: false,
            approval_timeout: Duration::from_secs(300),
            approval_by_client: false,
        }
    }
}

/// What is wrong with a run's network request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NetworkError {
    #[error("Invalid network request: {0}.")]
    Entry(RuleError),
    #[error(
        "Invalid network request: this server allows no network (its operator can allow \
         destinations with --allow-net); remove \"network\" to run offline."
    )]
    NoneAllowed,
    #[error(
        "Invalid network request: {entry} is not allowed by this server's policy, which allows: \
         {policy}."
    )]
    NotAllowed { entry: String, policy: String },
}

impl NetworkPolicy {
    /// A run's allowlist checked against the policy: each entry within one of the policy's.
    pub fn check(&self, asked: &[String]) -> Result<Vec<NetRule>, NetworkError> {
        let rules = runcell_proxy::parse_rules(asked).map_err(NetworkError::Entry)?;
        if rules.is_empty() {
            return Ok(rules);
        }
        if self.allow.is_empty() {
            return Err(NetworkError::NoneAllowed);
        }
        if let Some(r) = runcell_proxy::first_not_covered(&self.allow, &rules) {
            return Err(NetworkError::NotAllowed {
                entry: r.to_string(),
                policy: self.describe(),
            });
        }
        Ok(rules)
    }

    /// The policy's entries, for messages.
    pub fn describe(&self) -> String {
        let v: Vec<String> = self.allow.iter().map(|r| r.to_string()).collect();
        v.join(", ")
    }

    /// What the proxy of a run with `allow` enforces.
    pub(crate) fn permit(&self, allow: &[NetRule]) -> Permit {
        Permit {
            allow: allow.to_vec(),
            policy: self.allow.clone(),
            max_connections: self.max_connections,
            max_bytes: self.max_bytes,
            connect_timeout: self.connect_timeout,
            own: runcell_proxy::addr::own_addresses_checked(
                "/proc/net/fib_trie".as_ref(),
                "/proc/net/if_inet6".as_ref(),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_asks_within_the_policy() {
        let p = NetworkPolicy {
            allow: runcell_proxy::parse_rules(&["*.pypi.org:443", "127.0.0.2:8080"]).unwrap(),
            ..Default::default()
        };
        assert_eq!(p.check(&["files.pypi.org:443".into()]).unwrap().len(), 1);
        assert!(p.check(&[]).unwrap().is_empty());
        let e = p.check(&["example.com".into()]).unwrap_err().to_string();
        assert!(
            e.contains("example.com is not allowed")
                && e.contains("*.pypi.org:443, 127.0.0.2:8080"),
            "{e}"
        );
        let e = p.check(&["files.pypi.org".into()]).unwrap_err().to_string();
        assert!(
            e.contains("files.pypi.org is not allowed"),
            "every port is more than 443: {e}"
        );
        let e = p.check(&["http://x".into()]).unwrap_err().to_string();
        assert!(e.contains("not a URL"), "{e}");
        let e = NetworkPolicy::default()
            .check(&["a.com".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("allows no network") && e.contains("--allow-net"),
            "{e}"
        );
    }
}
