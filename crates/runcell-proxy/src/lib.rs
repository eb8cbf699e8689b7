//! runcell-proxy: network by permission. A run that asks for destinations gets an HTTP/HTTPS
//! forward proxy on its sandbox's own loopback (the sandbox keeps no route of its own); the
//! proxy lets through only what the run's allowlist names, within what the operator's policy
//! allows, never to special addresses by name, and records every connection.
//!
//! * [`rules`]: allowlist entries, matching, and what a policy covers;
//! * [`addr`]: the addresses a name never grants;
//! * [`proxy`]: the proxy of one run.
#![forbid(unsafe_code)]

pub mod addr;
pub mod proxy;
pub mod rules;

pub use proxy::{start, Connection, Permit, ProxyHandle};
pub use rules::{first_not_covered, parse_rules, Destination, HostPattern, NetRule, RuleError};

/// The port of the proxy on the sandbox's loopback (`http://127.0.0.1:3128`).
pub const SANDBOX_PROXY_PORT: u16 = 3128;
