//! The operator's whole policy, resolved once from the settings (defaults < the TOML file <
//! the environment < the flags: see the binary's settings model) and taken by every command:
//! `runcell serve`, `mcp`, `tools`, `run`, `repl` and `agent`. Each uses the parts it needs:
//! the engine's (limits, caps, strictness, network, packages) by all of them, the server's
//! (listen, keys, connections) by `serve`, the agent's model by `serve` and `agent`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::EngineConfig;
use crate::limits::LimitPolicy;
use crate::pool::{PoolSizes, Preload};
use crate::service::AdmissionPolicy;
use crate::session::SessionPolicy;

/// A configured API key with its id (what logs show). `Debug` never shows the key.
#[derive(Clone)]
pub struct ApiKey {
    pub id: String,
    key: String,
    /// This key's runs may ask only for destinations these entries cover (within the
    /// server's network policy too). `None`: the server's policy alone.
    pub allow_net: Option<Vec<runcell_proxy::NetRule>>,
    /// May approve or deny runs waiting for network approval (`/v1/approvals`).
    pub admin: bool,
}

impl ApiKey {
    pub fn new(id: impl Into<String>, key: impl Into<String>) -> ApiKey {
        ApiKey {
            id: id.into(),
            key: key.into(),
            allow_net: None,
            admin: false,
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}, redacted)", self.id)
    }
}

/// Where audit lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AuditTarget {
    Stderr,
    File(PathBuf),
    Off,
}

impl AuditTarget {
    /// `stderr`, `off`, or a file path.
    pub fn parse(s: &str) -> AuditTarget {
        match s.trim() {
            "stderr" | "-" => AuditTarget::Stderr,
            "off" | "none" => AuditTarget::Off,
            path => AuditTarget::File(PathBuf::from(path)),
        }
    }
}

/// The model behind the agent loop, as the settings name it (checked when resolved; the
/// agent crate builds its client from it).
#[derive(Clone, PartialEq, Eq)]
pub struct AgentSettings {
    /// `anthropic` or `openai`.
    pub upstream: String,
    /// The model API's base URL; `None`: the vendor's public one.
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    /// The model a request gets when it names none.
    pub model: String,
    /// The models a request may name; empty: any.
    pub models: Vec<String>,
    /// The wall-clock budget of one agent request.
    pub timeout: Option<Duration>,
    pub max_iterations: Option<u32>,
    pub max_calls: Option<u32>,
    pub max_code_retries: Option<u32>,
}

impl std::fmt::Debug for AgentSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentSettings")
            .field("upstream", &self.upstream)
            .field("model", &self.model)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

/// The operator's policy. `Debug` never shows a key.
#[derive(Clone, Debug)]
pub struct Policy {
    /// How runs are sandboxed and bounded: limits, caps, strictness, network, packages.
    pub engine: EngineConfig,
    /// Default 127.0.0.1:8080.
    pub listen: SocketAddr,
    /// Where agent-sandbox's runtime contract is served (no authentication: opt-in).
    pub agent_sandbox_listen: Option<SocketAddr>,
    /// Accepted API keys. Empty: no authentication, which is only allowed on loopback.
    pub api_keys: Vec<ApiKey>,
    /// Sandboxes running at once. Default: the number of cores.
    pub max_concurrent: usize,
    /// Requests waiting for a sandbox beyond those. Default: 4 × max_concurrent.
    pub max_queue: usize,
    /// Largest request body. Default: the policy's code, stdin and input-file caps (base64
    /// counted) plus 1 MiB.
    pub max_body_bytes: usize,
    /// Client connections open at once, in total and from one address; `None`: derived at
    /// start from the open-files limit.
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    /// On SIGTERM/SIGINT, how long running executions may take before they are killed.
    pub shutdown_grace: Duration,
    /// Where the audit log goes (default: stderr).
    pub audit: AuditTarget,
    /// Warm sandboxes kept ready per language.
    pub pool: PoolSizes,
    /// Modules the warm Python interpreters import before they are ready.
    pub preload: Preload,
    /// What sessions may do: how many, how long.
    pub sessions: SessionPolicy,
    /// The model behind the agent loop; `None`: not configured.
    pub agent: Option<AgentSettings>,
    /// The commit this runcell was built from (`runcell_build_info`).
    pub commit: Option<String>,
    /// Several servers behind one address (`cluster.*`); `None`: a single server.
    pub cluster: Option<crate::cluster::ClusterSettings>,
}

/// The default body cap for a limits policy: room for the largest code, stdin and input files
/// (base64 is 4/3 of the bytes) plus JSON overhead.
pub fn default_max_body_bytes(policy: &LimitPolicy) -> usize {
    let total = policy.max_code_bytes
        + policy.max_stdin_bytes
        + policy.max_input_total_bytes.div_ceil(3) * 4
        + (1 << 20);
    usize::try_from(total).unwrap_or(usize::MAX)
}

impl Policy {
    /// The defaults around `engine`: loopback, no keys, a sandbox per core.
    pub fn new(engine: EngineConfig) -> Policy {
        let cores = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        Policy {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            agent_sandbox_listen: None,
            api_keys: Vec::new(),
            max_concurrent: cores,
            max_queue: 4 * cores,
            max_body_bytes: default_max_body_bytes(&engine.policy),
            max_connections: None,
            max_connections_per_peer: None,
            shutdown_grace: Duration::from_secs(30),
            audit: AuditTarget::Stderr,
            pool: PoolSizes::default(),
            preload: Preload::default(),
            sessions: SessionPolicy::default(),
            agent: None,
            commit: None,
            cluster: None,
            engine,
        }
    }

    /// What admission allows: the line, the body budget, and the keys that share them.
    pub fn admission(&self) -> AdmissionPolicy {
        AdmissionPolicy {
            max_concurrent: self.max_concurrent.max(1),
            max_queue: self.max_queue,
            max_body_bytes: self.max_body_bytes as u64,
            keys: self.api_keys.len().max(1),
        }
    }
}

impl Default for Policy {
    fn default() -> Self {
        Policy::new(EngineConfig::for_host())
    }
}
