//! The server's configuration: command-line flags, then environment variables (both read by
//! the binary's argument parser), then an optional TOML file, in that order of precedence.
//!
//! ```toml
//! listen = "0.0.0.0:8080"
//! max_concurrent = 4          # sandboxes at once (default: cores)
//! max_queue = 16              # waiting beyond those (default: 4 x max_concurrent)
//! max_connections = 4096      # client connections at once (default: from the open-files limit)
//! max_connections_per_peer = 256   # from one address (default: a quarter of those)
//! max_body = "64M"            # larger request bodies get 413
//! shutdown_grace = "30s"
//! strict = true               # refuse to run when an isolation layer is missing
//! audit_log = "/var/log/runcell/audit.jsonl"   # or "stderr" (default) or "off"
//!
//! [[api_keys]]
//! id = "team-a"               # what the audit log shows
//! key = "..."
//! allow_net = ["api.github.com:443"]   # optional: this key's runs may ask only for these
//!                                      # (within [network] allow as well)
//! admin = false               # true: this key may approve runs (/v1/approvals)
//!
//! [network]                   # network by permission: what runs may ask for (none by default)
//! allow = ["api.github.com:443", "*.pypi.org:443", "127.0.0.2:8080"]
//! max_connections = 64        # per run
//! max_bytes = "64M"           # per run, both ways
//! approval = true             # runs that ask for network wait for a person's approval
//! approval_timeout = "5m"     # (GET/POST /v1/approvals with an admin key)
//! approval_by = "admin"       # or "client": MCP clients' users approve (elicitation)
//!
//! [packages]                  # vetted package installs (Python; none by default)
//! allow = ["tabulate", "openpyxl"]   # or ["*"]: any from the index
//! index_url = "https://pypi.org/simple"   # a private mirror works (then its own file hosts)
//! file_hosts = ["files.pythonhosted.org:443"]
//! install_timeout = "5m"       # and never longer than what is left of the request's timeout
//! cache_max = "2G"             # the installed layers on disk, together (least recently used go)
//!
//! [limits.default]            # what a request gets when it does not ask
//! timeout = "10s"
//! memory = "256M"
//!
//! [limits.max]                # the most a request may ask for
//! timeout = "2m"
//! memory = "2G"
//! cpus = 2
//!
//! [pool]                      # warm sandboxes kept ready per language (default: a small
//! python = 2                  # Python pool, one per two cores, at most 4); 0 turns one off
//!
//! [preload]                   # modules the warm Python interpreters import ahead
//! python = ["numpy", "pandas", "matplotlib.pyplot"]
//!
//! [sessions]                  # stateful sessions (POST /v1/sessions)
//! max = 32                    # live sessions at most (429 beyond)
//! per_key = 8                 # per API key
//! ttl = "10m"                 # idle time before a session ends, unless a request asks
//! max_ttl = "1h"              # the longest idle TTL a request may ask for
//! lifetime = "4h"             # a session ends this long after its creation
//!
//! [caps]                      # sizes and counts of code, stdin and files
//! code = "1M"
//! input_total = "64M"
//! ```

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use runcell_core::limits::{limit_names, Limit, LimitOverrides, Limits, Policy};
use runcell_core::units::{parse_duration, parse_size};
use serde::Deserialize;
use serde_json::Value;

use crate::audit::AuditTarget;
use crate::auth::ApiKey;
use crate::{ServerConfig, ServerError};

/// The TOML file. Unknown keys are an error: a misspelt limit must not be ignored.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    #[serde(default)]
    pub api_keys: Vec<FileKey>,
    pub max_concurrent: Option<usize>,
    pub max_queue: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    pub max_body: Option<toml::Value>,
    pub shutdown_grace: Option<toml::Value>,
    pub strict: Option<bool>,
    pub audit_log: Option<String>,
    #[serde(default)]
    pub limits: FileLimits,
    #[serde(default)]
    pub caps: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub pool: BTreeMap<String, usize>,
    #[serde(default)]
    pub preload: BTreeMap<String, Vec<String>>,
    #[serde(default)]
    pub sessions: FileSessions,
    #[serde(default)]
    pub network: FileNetwork,
    #[serde(default)]
    pub packages: FilePackages,
    #[serde(default)]
    pub agent: FileAgent,
}

/// `[agent]`: the model behind `POST /v1/agents`.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileAgent {
    pub upstream: Option<String>,
    pub base_url: Option<String>,
    pub api_key: Option<String>,
    pub model: Option<String>,
    #[serde(default)]
    pub models: Vec<String>,
    pub max_iterations: Option<u32>,
    pub max_calls: Option<u32>,
    pub max_code_retries: Option<u32>,
    pub timeout: Option<toml::Value>,
}

impl std::fmt::Debug for FileAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileAgent")
            .field("upstream", &self.upstream)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("model", &self.model)
            .finish()
    }
}

/// `[sessions]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileSessions {
    pub max: Option<usize>,
    pub per_key: Option<usize>,
    pub ttl: Option<toml::Value>,
    pub max_ttl: Option<toml::Value>,
    pub lifetime: Option<toml::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileLimits {
    #[serde(default)]
    pub default: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub max: BTreeMap<String, toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileKey {
    pub id: String,
    pub key: String,
    /// This key's runs may ask only for destinations these entries cover.
    #[serde(default)]
    pub allow_net: Option<Vec<String>>,
    /// This key may approve or deny runs waiting for network approval.
    #[serde(default)]
    pub admin: bool,
}

/// `[packages]`: vetted package installs.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FilePackages {
    /// Names runs may ask for; `["*"]`: any from the index.
    #[serde(default)]
    pub allow: Vec<String>,
    pub index_url: Option<String>,
    pub file_hosts: Option<Vec<String>>,
    pub install_timeout: Option<toml::Value>,
    /// The most the package cache may hold on disk.
    pub cache_max: Option<toml::Value>,
}

/// `[network]`: network by permission.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileNetwork {
    #[serde(default)]
    pub allow: Vec<String>,
    pub max_connections: Option<u32>,
    pub max_bytes: Option<toml::Value>,
    /// Runs that ask for network wait for an approval.
    pub approval: Option<bool>,
    pub approval_timeout: Option<toml::Value>,
    /// Who approves MCP calls: "admin" (the queue, default) or "client" (the MCP client's
    /// user, through elicitation).
    pub approval_by: Option<String>,
}

impl std::fmt::Debug for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileKey({}, redacted)", self.id)
    }
}

impl FileConfig {
    /// Read and parse a config file. A file that holds API keys and is readable by others
    /// than its owner is refused, as ssh refuses such a private key.
    pub fn load(path: &Path) -> Result<FileConfig, ServerError> {
        let bad = |m: String| ServerError::Config(format!("{}: {m}", path.display()));
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let config: FileConfig = toml::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if !config.api_keys.is_empty() || config.agent.api_key.is_some() {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path)
                .map_err(|e| bad(e.to_string()))?
                .permissions()
                .mode();
            if mode & 0o077 != 0 {
                return Err(bad(format!(
                    "the file holds keys but its mode is {:o}: make it readable by its \
                     owner only (chmod 600)",
                    mode & 0o777
                )));
            }
        }
        Ok(config)
    }
}

/// What flags and environment variables set (the parser already let a flag win over its
/// variable). `None` and empty lists mean "not set here".
#[derive(Debug, Default, Clone)]
pub struct Overrides {
    pub listen: Option<SocketAddr>,
    pub api_keys: Vec<String>,
    pub max_concurrent: Option<usize>,
    pub max_queue: Option<usize>,
    pub max_connections: Option<usize>,
    pub max_connections_per_peer: Option<usize>,
    pub max_body: Option<String>,
    pub shutdown_grace: Option<String>,
    pub strict: bool,
    pub audit_log: Option<String>,
    /// `NAME=VALUE`, e.g. `timeout=10s`.
    pub default_limits: Vec<String>,
    pub max_limits: Vec<String>,
    pub caps: Vec<String>,
    /// `LANG=N` entries (each may be a comma-separated list), e.g. `python=2`.
    pub pool: Vec<String>,
    /// `LANG=MOD,MOD` entries, e.g. `python=numpy,pandas`.
    pub preload: Vec<String>,
    pub max_sessions: Option<usize>,
    pub max_sessions_per_key: Option<usize>,
    pub session_ttl: Option<String>,
    pub session_max_ttl: Option<String>,
    pub session_lifetime: Option<String>,
    pub agent_upstream: Option<String>,
    pub agent_base_url: Option<String>,
    pub agent_api_key: Option<String>,
    pub agent_model: Option<String>,
    /// Models a request may name (comma-separated entries allowed).
    pub agent_models: Vec<String>,
    /// What runs may ask of the network (comma-separated entries allowed).
    pub allow_net: Vec<String>,
    pub net_max_connections: Option<u32>,
    pub net_max_bytes: Option<String>,
    pub net_approval: bool,
    pub net_approval_timeout: Option<String>,
    pub net_approval_by: Option<String>,
    /// Keys that may approve runs (comma-separated entries allowed).
    pub admin_keys: Vec<String>,
    /// Packages runs may ask for (comma-separated entries allowed; `*`: any).
    pub allow_packages: Vec<String>,
    pub package_index: Option<String>,
    pub package_cache_max: Option<String>,
    /// The wall-clock budget of one agent request.
    pub agent_timeout: Option<String>,
}

/// Where to listen: `ADDR:PORT` (`127.0.0.1:8080`, `[::1]:8080`, `0.0.0.0:8080`), a host
/// name and port (`localhost:8080`, resolved now; IPv4 first), or `:PORT` (loopback).
pub fn parse_listen(s: &str) -> Result<SocketAddr, String> {
    let t = s.trim();
    if let Ok(a) = t.parse::<SocketAddr>() {
        return Ok(a);
    }
    let bad = || format!("'{s}' is not an address such as 127.0.0.1:8080, localhost:8080 or :8080");
    if let Some(port) = t.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| bad())?;
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    let (host, port) = t.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().map_err(|_| bad())?;
    if host.is_empty() || host.contains(['/', ' ']) {
        return Err(bad());
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| format!("'{s}': {host} does not resolve ({e})"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(bad)
}

fn toml_to_json(v: &toml::Value) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn split_pair(pair: &str) -> Result<(String, Value), ServerError> {
    let (name, value) = pair.split_once('=').ok_or_else(|| {
        ServerError::Config(format!("'{pair}' is not NAME=VALUE (e.g. timeout=10s)"))
    })?;
    Ok((
        name.trim().to_string(),
        Value::String(value.trim().to_string()),
    ))
}

/// Later entries win: the file's values first, then the flags'.
fn merged(
    file: &BTreeMap<String, toml::Value>,
    flags: &[String],
) -> Result<Vec<(String, Value)>, ServerError> {
    let mut out: BTreeMap<String, Value> = file
        .iter()
        .map(|(k, v)| (k.clone(), toml_to_json(v)))
        .collect();
    for pair in flags {
        let (k, v) = split_pair(pair)?;
        out.insert(k, v);
    }
    Ok(out.into_iter().collect())
}

/// Limits from the file and the flags onto `base`. A value is what a request would send
/// (`timeout = 10`, `memory = "256M"`, `cpus = 0.5`); from a flag, or as a TOML string, it is
/// the text a flag takes (`pids=8`, `cpus=0.5`).
fn apply_limits(
    base: Limits,
    pairs: &[(String, Value)],
    which: &str,
) -> Result<Limits, ServerError> {
    let bad = |m: String| ServerError::Config(format!("{which} limits: {m}"));
    let mut o = LimitOverrides::default();
    for (name, v) in pairs {
        let limit = Limit::from_name(name).ok_or_else(|| {
            bad(format!(
                "unknown limit '{name}'; the limits are: {}",
                limit_names()
            ))
        })?;
        match v {
            Value::String(text) => o
                .set_text(limit, text)
                .map_err(|e| bad(format!("{name}: {e}")))?,
            other => {
                // One limit as a request would send it, through the request's own parser.
                let one = serde_json::json!({ name: other });
                let parsed: LimitOverrides =
                    serde_json::from_value(one).map_err(|e| bad(e.to_string()))?;
                o.set(limit, parsed.get(limit));
            }
        }
    }
    Ok(o.apply_to(base))
}

fn apply_caps(policy: &mut Policy, pairs: &[(String, Value)]) -> Result<(), ServerError> {
    for (name, v) in pairs {
        let text = match v {
            Value::String(s) => s.clone(),
            Value::Number(n) => n.to_string(),
            _ => {
                return Err(ServerError::Config(format!(
                    "cap {name}: expected a size or a count"
                )))
            }
        };
        policy.set_cap(name, &text).map_err(ServerError::Config)?;
    }
    Ok(())
}

fn size_setting(name: &str, v: &Value) -> Result<usize, ServerError> {
    let bytes = match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => parse_size(s).ok(),
        _ => None,
    }
    .ok_or_else(|| ServerError::Config(format!("{name} must be a size such as 64M")))?;
    Ok(usize::try_from(bytes).unwrap_or(usize::MAX))
}

fn duration_setting(name: &str, v: &Value) -> Result<Duration, ServerError> {
    match v {
        Value::Number(n) => n
            .as_f64()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .map(Duration::from_secs_f64),
        Value::String(s) => parse_duration(s).ok(),
        _ => None,
    }
    .ok_or_else(|| ServerError::Config(format!("{name} must be a duration such as 30s")))
}

/// The server configuration from the three sources, validated.
pub fn build(
    o: Overrides,
    file: FileConfig,
    mut engine: runcell_core::EngineConfig,
) -> Result<ServerConfig, ServerError> {
    // Limits and caps first: the default body cap follows from them.
    let policy = &mut engine.policy;
    policy.defaults = apply_limits(
        policy.defaults,
        &merged(&file.limits.default, &o.default_limits)?,
        "default",
    )?;
    policy.max = apply_limits(
        policy.max,
        &merged(&file.limits.max, &o.max_limits)?,
        "maximum",
    )?;
    // What the operator allows cannot exceed what the host can grant a sandbox.
    if let Some(hard) = runcell_core::open_files_hard_limit() {
        if let Some(asked) = policy.clamp_open_files(hard) {
            tracing::warn!(
                asked,
                host_hard_limit = hard,
                "the open_files maximum is above the host's hard limit of open files: lowered to it"
            );
        }
    }
    let caps = merged(&file.caps, &o.caps)?;
    apply_caps(policy, &caps)?;
    // Every default must lie between the minimum and the operator's maximum.
    policy
        .resolve(&LimitOverrides::default())
        .map_err(|e| ServerError::Config(format!("the default {e}")))?;
    engine.strict = o.strict || file.strict.unwrap_or(false);

    let mut c = ServerConfig::new(engine);
    if let Some(listen) = o.listen {
        c.listen = listen;
    } else if let Some(s) = &file.listen {
        c.listen = parse_listen(s).map_err(|e| ServerError::Config(format!("listen: {e}")))?;
    }
    c.api_keys = if !o.api_keys.is_empty() {
        o.api_keys
            .iter()
            .map(|k| k.trim())
            .filter(|k| !k.is_empty())
            .enumerate()
            .map(|(i, k)| ApiKey::new(format!("key-{}", i + 1), k))
            .collect()
    } else {
        let mut keys = Vec::new();
        for k in &file.api_keys {
            let mut key = ApiKey::new(k.id.clone(), k.key.trim());
            key.admin = k.admin;
            if let Some(list) = &k.allow_net {
                key.allow_net = Some(runcell_proxy::parse_rules(list).map_err(|e| {
                    ServerError::Config(format!("api key '{}': allow_net: {e}", k.id))
                })?);
            }
            keys.push(key);
        }
        keys
    };
    for (i, k) in o
        .admin_keys
        .iter()
        .flat_map(|k| k.split(','))
        .map(str::trim)
        .filter(|k| !k.is_empty())
        .enumerate()
    {
        let mut key = ApiKey::new(format!("admin-{}", i + 1), k);
        key.admin = true;
        c.api_keys.push(key);
    }
    let mut ids = std::collections::HashSet::new();
    for k in &c.api_keys {
        if k.key().is_empty() {
            return Err(ServerError::Config(format!("API key '{}' is empty", k.id)));
        }
        if k.key().len() < 16 {
            return Err(ServerError::Config(format!(
                "API key '{}' is shorter than 16 characters: use a long random key \
                 (e.g. `openssl rand -hex 32`)",
                k.id
            )));
        }
        if !ids.insert(k.id.clone()) {
            return Err(ServerError::Config(format!(
                "API key id '{}' is used twice",
                k.id
            )));
        }
    }
    if let Some(n) = o.max_concurrent.or(file.max_concurrent) {
        if n == 0 || n > crate::MAX_SLOTS {
            return Err(ServerError::Config(format!(
                "max_concurrent must be between 1 and {}",
                crate::MAX_SLOTS
            )));
        }
        c.max_concurrent = n;
        c.max_queue = 4 * n;
    }
    if let Some(n) = o.max_queue.or(file.max_queue) {
        if n > crate::MAX_SLOTS {
            return Err(ServerError::Config(format!(
                "max_queue must be at most {}",
                crate::MAX_SLOTS
            )));
        }
        c.max_queue = n;
    }
    for (name, value, slot) in [
        (
            "max_connections",
            o.max_connections.or(file.max_connections),
            &mut c.max_connections,
        ),
        (
            "max_connections_per_peer",
            o.max_connections_per_peer.or(file.max_connections_per_peer),
            &mut c.max_connections_per_peer,
        ),
    ] {
        if let Some(n) = value {
            if n == 0 {
                return Err(ServerError::Config(format!("{name} must be at least 1")));
            }
            *slot = Some(n);
        }
    }
    // The memory runs may use is shared by the runs at once, unless the operator set the
    // maxima of memory and disk.
    if let Some(usable) = c.engine.all_runs_memory_bytes {
        let set = merged(&file.limits.max, &o.max_limits)?;
        let explicit = |name: &str| set.iter().any(|(n, _)| n == name);
        let before = c.engine.policy.max;
        c.engine
            .policy
            .share_memory(usable, c.max_concurrent as u64);
        if explicit("memory") {
            c.engine.policy.max.memory = before.memory;
        }
        if explicit("disk") {
            c.engine.policy.max.disk = before.disk;
        }
    }
    // The host's file table is shared by the runs at once (unless the operator set the cap).
    if !caps.iter().any(|(name, _)| name == "open_files_per_run") {
        if let Some(file_max) =
            runcell_core::limits::host_file_max("/proc/sys/fs/file-max".as_ref())
        {
            c.engine
                .policy
                .share_file_table(file_max, c.max_concurrent as u64);
        }
    }
    c.engine
        .policy
        .check_file_table(&c.engine.policy.defaults)
        .map_err(|e| ServerError::Config(format!("the default limits: {e}")))?;
    if let Some(v) = o
        .max_body
        .map(Value::String)
        .or(file.max_body.as_ref().map(toml_to_json))
    {
        c.max_body_bytes = size_setting("max_body", &v)?;
    }
    if let Some(v) = o
        .shutdown_grace
        .map(Value::String)
        .or(file.shutdown_grace.as_ref().map(toml_to_json))
    {
        c.shutdown_grace = duration_setting("shutdown_grace", &v)?;
    }
    if let Some(s) = o.audit_log.or(file.audit_log) {
        c.audit = AuditTarget::parse(&s);
    }
    // The warm pool: the default for this machine, then the file's entries, then the flags'.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
    let mut pool = runcell_core::PoolSizes::default_for(cpus, c.max_concurrent);
    let bad = |m: String| ServerError::Config(m);
    for (lang, &n) in &file.pool {
        pool.set_text(&format!("{lang}={n}")).map_err(bad)?;
    }
    for entry in &o.pool {
        pool.set_list(entry).map_err(bad)?;
    }
    c.pool = pool;
    // Preloads: the flags' list for a language replaces the file's.
    let mut preload = runcell_core::Preload::default();
    let flagged: Vec<runcell_core::Language> = o
        .preload
        .iter()
        .filter_map(|e| {
            e.split_once('=')
                .and_then(|(l, _)| runcell_core::Language::parse(l.trim()))
        })
        .collect();
    for (lang, modules) in &file.preload {
        let language = runcell_core::Language::parse(lang)
            .ok_or_else(|| bad(format!("preload: unknown language {lang:?}")))?;
        if !flagged.contains(&language) {
            preload
                .add(language, modules.iter().map(String::as_str))
                .map_err(bad)?;
        }
    }
    for entry in &o.preload {
        preload.set_text(entry).map_err(bad)?;
    }
    c.preload = preload;
    // Sessions: flags, then the file, then the defaults.
    let fs = &file.sessions;
    let sp = &mut c.sessions;
    if let Some(n) = o.max_sessions.or(fs.max) {
        sp.max_total = n;
    }
    if let Some(n) = o.max_sessions_per_key.or(fs.per_key) {
        sp.max_per_owner = n;
    }
    for (name, flag, from_file, slot) in [
        ("sessions.ttl", &o.session_ttl, &fs.ttl, &mut sp.default_ttl),
        (
            "sessions.max_ttl",
            &o.session_max_ttl,
            &fs.max_ttl,
            &mut sp.max_ttl,
        ),
        (
            "sessions.lifetime",
            &o.session_lifetime,
            &fs.lifetime,
            &mut sp.max_lifetime,
        ),
    ] {
        if let Some(v) = flag
            .clone()
            .map(Value::String)
            .or(from_file.as_ref().map(toml_to_json))
        {
            *slot = duration_setting(name, &v)?;
        }
    }
    if sp.default_ttl > sp.max_ttl {
        sp.max_ttl = sp.default_ttl;
    }
    // Network by permission: flags (or the environment), then the file.
    let fnet = &file.network;
    let allow: Vec<String> = if o.allow_net.is_empty() {
        fnet.allow.clone()
    } else {
        o.allow_net
            .iter()
            .flat_map(|e| e.split(','))
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect()
    };
    c.engine.network.allow = runcell_proxy::parse_rules(&allow)
        .map_err(|e| ServerError::Config(format!("network: {e}")))?;
    if let Some(n) = o.net_max_connections.or(fnet.max_connections) {
        if n == 0 {
            return Err(ServerError::Config(
                "network: max_connections must be at least 1".into(),
            ));
        }
        c.engine.network.max_connections = n;
    }
    if let Some(v) = o
        .net_max_bytes
        .clone()
        .map(Value::String)
        .or(fnet.max_bytes.as_ref().map(toml_to_json))
    {
        c.engine.network.max_bytes = size_setting("network.max_bytes", &v)? as u64;
    }
    if o.net_approval || fnet.approval == Some(true) {
        c.engine.network.approval = true;
    }
    match o
        .net_approval_by
        .as_deref()
        .or(fnet.approval_by.as_deref())
        .map(str::trim)
    {
        None | Some("admin") => {}
        Some("client") => c.engine.network.approval_by_client = true,
        Some(other) => {
            return Err(ServerError::Config(format!(
                "network: approval_by {other:?} is not \"admin\" or \"client\""
            )))
        }
    }
    if let Some(v) = o
        .net_approval_timeout
        .clone()
        .map(Value::String)
        .or(fnet.approval_timeout.as_ref().map(toml_to_json))
    {
        c.engine.network.approval_timeout = duration_setting("network.approval_timeout", &v)?;
    }
    // Vetted package installs: flags (or the environment), then the file.
    let fp = &file.packages;
    let names: Vec<String> = if o.allow_packages.is_empty() {
        fp.allow.clone()
    } else {
        o.allow_packages
            .iter()
            .flat_map(|e| e.split(','))
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty())
            .collect()
    };
    let pk = &mut c.engine.packages;
    pk.allow_any = names.iter().any(|n| n == "*");
    pk.allow = names.into_iter().filter(|n| n != "*").collect();
    if let Some(bad) = pk.allow.iter().find(|n| {
        n.is_empty()
            || !n
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
    }) {
        return Err(ServerError::Config(format!(
            "packages: {bad:?} is not a package name"
        )));
    }
    if let Some(index) = o.package_index.clone().or(fp.index_url.clone()) {
        pk.index_url = index;
        // A mirror serves its own files unless told otherwise.
        pk.file_hosts = fp.file_hosts.clone().unwrap_or_default();
    } else if let Some(hosts) = &fp.file_hosts {
        pk.file_hosts = hosts.clone();
    }
    if let Some(t) = &fp.install_timeout {
        pk.install_timeout = duration_setting("packages.install_timeout", &toml_to_json(t))?;
    }
    if let Some(v) = o
        .package_cache_max
        .clone()
        .map(Value::String)
        .or(fp.cache_max.as_ref().map(toml_to_json))
    {
        pk.cache_max_bytes = size_setting("packages.cache_max", &v)? as u64;
        if pk.cache_max_bytes == 0 {
            return Err(ServerError::Config(
                "packages: cache_max must be more than 0".into(),
            ));
        }
    }
    if pk.enabled() {
        pk.destinations()
            .map_err(|e| ServerError::Config(format!("packages: {e}")))?;
    }
    // The agent loop's model: flags, then the file.
    let fa = &file.agent;
    if let Some(name) = o.agent_upstream.clone().or(fa.upstream.clone()) {
        let wire = runcell_agent::Wire::parse(&name).ok_or_else(|| {
            ServerError::Config(format!(
                "agent: upstream {name:?} is not anthropic or openai"
            ))
        })?;
        let model = o.agent_model.clone().or(fa.model.clone()).ok_or_else(|| {
            ServerError::Config(
                "agent: a default model is needed (--agent-model, RUNCELL_AGENT_MODEL or [agent] model)"
                    .into(),
            )
        })?;
        let base = o.agent_base_url.clone().or(fa.base_url.clone());
        let key = o.agent_api_key.clone().or(fa.api_key.clone());
        let mut models: Vec<String> = o
            .agent_models
            .iter()
            .flat_map(|m| m.split(','))
            .map(|m| m.trim().to_string())
            .filter(|m| !m.is_empty())
            .collect();
        if models.is_empty() {
            models = fa.models.clone();
        }
        let defaults = runcell_agent::api::AgentPolicy::default();
        let mut policy = runcell_agent::api::AgentPolicy {
            max_iterations: fa.max_iterations.unwrap_or(defaults.max_iterations),
            max_calls: fa.max_calls.unwrap_or(defaults.max_calls),
            max_code_retries: fa.max_code_retries.unwrap_or(defaults.max_code_retries),
            allowed_models: models,
            default_model: model.clone(),
            ..defaults
        };
        if let Some(t) = o
            .agent_timeout
            .clone()
            .map(Value::String)
            .or(fa.timeout.as_ref().map(toml_to_json))
        {
            policy.defaults.deadline = duration_setting("agent.timeout", &t)?;
        }
        c.agent = Some(crate::AgentSettings {
            upstream: runcell_agent::Upstream::new(wire, base.as_deref(), key, model),
            policy,
        });
    }
    if sp.max_lifetime < sp.default_ttl {
        return Err(ServerError::Config(format!(
            "sessions: the lifetime ({} s) is shorter than the idle TTL ({} s)",
            sp.max_lifetime.as_secs(),
            sp.default_ttl.as_secs()
        )));
    }
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_take_names_and_a_bare_port() {
        for (s, want) in [
            ("127.0.0.1:8080", "127.0.0.1:8080"),
            ("[::1]:8080", "[::1]:8080"),
            (":9000", "127.0.0.1:9000"),
            ("localhost:8081", "127.0.0.1:8081"),
            (" 0.0.0.0:80 ", "0.0.0.0:80"),
        ] {
            assert_eq!(parse_listen(s).unwrap(), want.parse().unwrap(), "{s}");
        }
        for bad in ["8080", "localhost", ":x", "host:99999", "a b:80", ""] {
            assert!(parse_listen(bad).is_err(), "{bad:?}");
        }
    }

    fn engine() -> runcell_core::EngineConfig {
        let mut e = runcell_core::EngineConfig::for_host();
        e.policy = Policy::for_host(8 << 30, 2);
        e
    }

    fn file(text: &str) -> FileConfig {
        toml::from_str(text).unwrap()
    }

    const FULL: &str = r#"
        listen = "0.0.0.0:9000"
        max_concurrent = 3
        max_body = "10M"
        shutdown_grace = 5
        strict = true
        audit_log = "/var/log/runcell.jsonl"
        [[api_keys]]
        id = "team-a"
        key = "0123456789abcdef0123"
        [limits.default]
        timeout = "10s"
        memory = "128M"
        [limits.max]
        timeout = 60
        memory = "1G"
        cpus = 1.5
        [caps]
        code = "64K"
        output_files = 10
    "#;

    #[test]
    fn the_file_sets_everything() {
        let c = build(Overrides::default(), file(FULL), engine()).unwrap();
        assert_eq!(c.listen, "0.0.0.0:9000".parse().unwrap());
        assert_eq!(c.max_concurrent, 3);
        assert_eq!(c.max_queue, 12);
        assert_eq!(c.max_body_bytes, 10 << 20);
        assert_eq!(c.shutdown_grace, Duration::from_secs(5));
        assert!(c.engine.strict);
        assert_eq!(c.audit, AuditTarget::File("/var/log/runcell.jsonl".into()));
        assert_eq!(c.api_keys.len(), 1);
        assert_eq!(c.api_keys[0].id, "team-a");
        let p = &c.engine.policy;
        assert_eq!(p.defaults.timeout.0, 10_000);
        assert_eq!(p.defaults.memory.0, 128 << 20);
        assert_eq!(p.max.timeout.0, 60_000);
        assert_eq!(p.max.memory.0, 1 << 30);
        assert_eq!(p.max.cpus.0, 1500);
        assert_eq!(p.max_code_bytes, 64 << 10);
        assert_eq!(p.output_files_returned(), 10);
    }

    #[test]
    fn the_package_cache_is_bounded_by_the_file_or_the_flag() {
        let c = build(Overrides::default(), file(""), engine()).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 2 << 30);
        let f = "[packages]\ncache_max = \"512M\"\n";
        let c = build(Overrides::default(), file(f), engine()).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 512 << 20);
        let o = Overrides {
            package_cache_max: Some("1G".into()),
            ..Overrides::default()
        };
        let c = build(o, file(f), engine()).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 1 << 30);
        for bad in ["cache_max = \"lots\"", "cache_max = 0"] {
            let e = build(
                Overrides::default(),
                file(&format!("[packages]\n{bad}\n")),
                engine(),
            )
            .unwrap_err();
            assert!(e.to_string().contains("cache_max"), "{e}");
        }
    }

    #[test]
    fn flags_and_environment_win_over_the_file() {
        let o = Overrides {
            listen: Some("127.0.0.1:1234".parse().unwrap()),
            api_keys: vec!["ffffffffffffffffffff".into(), "eeeeeeeeeeeeeeeeeeee".into()],
            max_queue: Some(2),
            max_limits: vec!["timeout=30".into()],
            default_limits: vec!["memory=64M".into()],
            caps: vec!["code=1K".into()],
            audit_log: Some("off".into()),
            ..Overrides::default()
        };
        let c = build(o, file(FULL), engine()).unwrap();
        assert_eq!(c.listen, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(c.max_concurrent, 3, "from the file");
        assert_eq!(c.max_queue, 2);
        let ids: Vec<_> = c.api_keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(
            ids,
            ["key-1", "key-2"],
            "the flags' keys replace the file's"
        );
        let p = &c.engine.policy;
        assert_eq!(p.max.timeout.0, 30_000);
        assert_eq!(p.max.memory.0, 1 << 30, "from the file");
        assert_eq!(p.defaults.memory.0, 64 << 20);
        assert_eq!(p.defaults.timeout.0, 10_000, "from the file");
        assert_eq!(p.max_code_bytes, 1024);
        assert_eq!(c.audit, AuditTarget::Off);
    }

    #[test]
    fn bad_settings_are_refused_with_a_reason() {
        let cases: [(&str, Overrides, &str); 9] = [
            ("", Overrides { max_concurrent: Some(usize::MAX), ..Default::default() },
             "max_concurrent must be between 1 and"),
            ("max_queue = 18446744073709551615\n", Overrides::default(),
             "max_queue must be at most"),
            ("", Overrides { default_limits: vec!["timeout=2h".into()], ..Default::default() },
             "the default timeout is 120 min, above the maximum of 60 min"),
            ("", Overrides { max_limits: vec!["memry=1G".into()], ..Default::default() },
             "memry"),
            ("", Overrides { max_limits: vec!["timeout".into()], ..Default::default() },
             "NAME=VALUE"),
            ("", Overrides { caps: vec!["cod=1".into()], ..Default::default() }, "unknown cap"),
            ("", Overrides { api_keys: vec!["short".into()], ..Default::default() },
             "shorter than 16"),
            ("[limits.max]\ntimeout = \"1s\"\n", Overrides::default(),
             "the default timeout is 30 s, above the maximum of 1 s"),
            ("[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef0\"\n[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef1\"\n",
             Overrides::default(), "used twice"),
        ];
        for (toml_text, o, needle) in cases {
            let e = build(o, file(toml_text), engine()).unwrap_err().to_string();
            assert!(e.contains(needle), "expected '{needle}' in: {e}");
        }
        assert!(toml::from_str::<FileConfig>("listn = \"x\"").is_err());
        assert!(toml::from_str::<FileConfig>("[limits.maximum]\ntimeout = 1").is_err());
    }

    #[test]
    fn a_readable_file_with_keys_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runcell.toml");
        std::fs::write(
            &path,
            "[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef0\"\n",
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = FileConfig::load(&path).unwrap_err().to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(FileConfig::load(&path).unwrap().api_keys.len(), 1);
    }
}
