//! The one settings model: every setting of runcell is one row of [`SETTINGS`], with its key
//! in the TOML file (`sessions.max`), its flag and its environment variable. The values the
//! sources give are merged generically, each source over the one before it:
//!
//! ```text
//! defaults  <  the TOML file (--config, RUNCELL_CONFIG)  <  the environment  <  the flags
//! ```
//!
//! (a list of `NAME=VALUE` entries, such as the limits, is merged entry by entry), and resolved
//! once into the one [`Policy`] that every command takes: `serve`, `mcp`, `tools`, `run`,
//! `repl` and `agent`. A command's flags are the rows whose argument id it defines; the file
//! and the environment apply to all of them. An error names the setting and where its value
//! came from.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::parser::ValueSource;
use clap::ArgMatches;
use runcell_core::limits::{limit_names, Limit, LimitOverrides, Limits, CAP_NAMES};
use runcell_core::policy::{AgentSettings, ApiKey, AuditTarget, Policy};
use runcell_core::units::{parse_duration, parse_size};
use runcell_core::EngineConfig;

/// How a setting's value is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One value.
    One,
    /// On or off (a flag is on; `RUNCELL_X=0`, `false`, `no`, `off` are off).
    Bool,
    /// A list: TOML array; comma-separated in the environment; repeated (or comma-separated)
    /// flags.
    List,
    /// `NAME=VALUE` entries: a TOML table; comma-separated entries in the environment;
    /// repeated (or comma-separated) flags. Merged entry by entry.
    Pairs,
    /// As `Pairs`, but an entry's value may hold commas (`python=numpy,pandas`): one entry per
    /// flag or variable.
    PairsWhole,
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// Its key in the TOML file (dotted: `sessions.max` is `max` under `[sessions]`).
    pub key: &'static str,
    /// The clap id of its flag in any command that takes it.
    pub arg: Option<&'static str>,
    /// Its environment variable.
    pub env: Option<&'static str>,
    pub shape: Shape,
    /// What it does, for a setting without a flag (a flag's help says it otherwise); for one
    /// with a flag, what the file form adds. The generated reference
    /// (`runcell __reference settings`) refuses a setting with neither.
    pub help: Option<&'static str>,
}

const fn s(key: &'static str, arg: &'static str, env: &'static str, shape: Shape) -> Setting {
    Setting {
        key,
        arg: Some(arg),
        env: Some(env),
        shape,
        help: None,
    }
}

/// A setting without a flag: a secret (flags show in `ps`) or one an orchestrator sets.
const fn no_flag(
    key: &'static str,
    env: &'static str,
    shape: Shape,
    help: &'static str,
) -> Setting {
    Setting {
        key,
        arg: None,
        env: Some(env),
        shape,
        help: Some(help),
    }
}

/// A setting of the file alone.
const fn file_only(key: &'static str, shape: Shape, help: &'static str) -> Setting {
    Setting {
        key,
        arg: None,
        env: None,
        shape,
        help: Some(help),
    }
}

/// A setting with a flag, and what its file form adds to the flag's help.
const fn with_file_note(setting: Setting, help: &'static str) -> Setting {
    Setting {
        help: Some(help),
        ..setting
    }
}

use Shape::{Bool, List, One, Pairs, PairsWhole};

/// Every setting. (`api_keys` in the file are `[[api_keys]]` tables with `id`, `key`,
/// `allow_net`, `admin`; from a flag or the environment they are a list of keys.)
pub const SETTINGS: &[Setting] = &[
    s("listen", "listen", "RUNCELL_LISTEN", One),
    s(
        "agent_sandbox.listen",
        "agent_sandbox_listen",
        "RUNCELL_AGENT_SANDBOX_LISTEN",
        One,
    ),
    with_file_note(
        s("api_keys", "api_keys", "RUNCELL_API_KEY", List),
        "In the file, keys are [[api_keys]] tables: `id` (the name the audit log and the \
         metrics use), `key`, and optionally `allow_net` (HOST[:PORT] entries: the network \
         this key's runs may ask for, within network.allow) and `admin = true` (the key may \
         also approve runs waiting for network). A file that holds keys must be readable by \
         its owner only (chmod 600). Keys from the flag or the environment replace the \
         file's.",
    ),
    s("admin_keys", "admin_keys", "RUNCELL_ADMIN_KEY", List),
    s(
        "max_concurrent",
        "max_concurrent",
        "RUNCELL_MAX_CONCURRENT",
        One,
    ),
    s("max_queue", "max_queue", "RUNCELL_MAX_QUEUE", One),
    s(
        "max_connections",
        "max_connections",
        "RUNCELL_MAX_CONNECTIONS",
        One,
    ),
    s(
        "max_connections_per_peer",
        "max_connections_per_peer",
        "RUNCELL_MAX_CONNECTIONS_PER_PEER",
        One,
    ),
    s("max_body", "max_body", "RUNCELL_MAX_BODY", One),
    s(
        "shutdown_grace",
        "shutdown_grace",
        "RUNCELL_SHUTDOWN_GRACE",
        One,
    ),
    s("strict", "strict", "RUNCELL_STRICT", Bool),
    s("templates", "templates", "RUNCELL_TEMPLATES", One),
    s("audit_log", "audit_log", "RUNCELL_AUDIT_LOG", One),
    s(
        "limits.default",
        "default_limits",
        "RUNCELL_DEFAULT_LIMITS",
        Pairs,
    ),
    s("limits.max", "max_limits", "RUNCELL_MAX_LIMITS", Pairs),
    s("caps", "caps", "RUNCELL_CAPS", Pairs),
    s("pool", "pool", "RUNCELL_POOL", Pairs),
    s("preload", "preload", "RUNCELL_PRELOAD", PairsWhole),
    s("sessions.max", "max_sessions", "RUNCELL_MAX_SESSIONS", One),
    s(
        "sessions.per_key",
        "max_sessions_per_key",
        "RUNCELL_MAX_SESSIONS_PER_KEY",
        One,
    ),
    s("sessions.ttl", "session_ttl", "RUNCELL_SESSION_TTL", One),
    s(
        "sessions.max_ttl",
        "session_max_ttl",
        "RUNCELL_SESSION_MAX_TTL",
        One,
    ),
    s(
        "sessions.lifetime",
        "session_lifetime",
        "RUNCELL_SESSION_LIFETIME",
        One,
    ),
    s(
        "sessions.paused_ttl",
        "session_paused_ttl",
        "RUNCELL_SESSION_PAUSED_TTL",
        One,
    ),
    s(
        "agent.upstream",
        "agent_upstream",
        "RUNCELL_AGENT_UPSTREAM",
        One,
    ),
    s(
        "agent.base_url",
        "agent_base_url",
        "RUNCELL_AGENT_BASE_URL",
        One,
    ),
    s(
        "agent.api_key",
        "agent_api_key",
        "RUNCELL_AGENT_API_KEY",
        One,
    ),
    s("agent.model", "agent_model", "RUNCELL_AGENT_MODEL", One),
    s("agent.models", "agent_models", "RUNCELL_AGENT_MODELS", List),
    s(
        "agent.timeout",
        "agent_timeout",
        "RUNCELL_AGENT_TIMEOUT",
        One,
    ),
    file_only(
        "agent.max_iterations",
        One,
        "The most model calls an agent request (POST /v1/agents) may ask for; a request \
         that does not ask gets 10 [default: 30].",
    ),
    file_only(
        "agent.max_calls",
        One,
        "The most code runs per tool an agent request may ask for; a request that does not \
         ask gets 10 [default: 30].",
    ),
    file_only(
        "agent.max_code_retries",
        One,
        "The most failed runs in a row an agent request may ask for before the model is told \
         to answer with what it has; a request that does not ask gets 3 [default: 10].",
    ),
    s("network.allow", "allow_net", "RUNCELL_ALLOW_NET", List),
    s(
        "network.max_connections",
        "net_max_connections",
        "RUNCELL_NET_MAX_CONNECTIONS",
        One,
    ),
    s(
        "network.max_bytes",
        "net_max_bytes",
        "RUNCELL_NET_MAX_BYTES",
        One,
    ),
    s(
        "network.approval",
        "net_approval",
        "RUNCELL_NET_APPROVAL",
        Bool,
    ),
    s(
        "network.approval_timeout",
        "net_approval_timeout",
        "RUNCELL_NET_APPROVAL_TIMEOUT",
        One,
    ),
    s(
        "network.approval_by",
        "net_approval_by",
        "RUNCELL_NET_APPROVAL_BY",
        One,
    ),
    s(
        "packages.allow",
        "allow_packages",
        "RUNCELL_ALLOW_PACKAGES",
        List,
    ),
    s(
        "packages.index_url",
        "package_index",
        "RUNCELL_PACKAGE_INDEX",
        One,
    ),
    s(
        "packages.cache_max",
        "package_cache_max",
        "RUNCELL_PACKAGE_CACHE_MAX",
        One,
    ),
    file_only(
        "packages.file_hosts",
        List,
        "HOST:PORT entries the package installs may also reach to download the wheels the \
         index links to (a mirror that serves its own files needs none) [default: \
         files.pythonhosted.org:443 with the default index, none with another].",
    ),
    file_only(
        "packages.install_timeout",
        One,
        "How long one package install (resolving and downloading the wheels, in a sandbox of \
         its own) may take (seconds, or with a unit) [default: 5m].",
    ),
    s("cluster.pod", "cluster_pod", "RUNCELL_POD_NAME", One),
    no_flag(
        "cluster.key",
        "RUNCELL_CLUSTER_KEY",
        One,
        "The secret the servers of a cluster share, at least 32 bytes: it authenticates \
         the session ids every server hands out (so that no client can forge one). No flag: \
         flags show in ps. Needs cluster.pod.",
    ),
    no_flag(
        "cluster.peer_url",
        "RUNCELL_CLUSTER_PEER_URL",
        One,
        "How to reach another server of the cluster: a URL with {pod} where its name goes \
         (e.g. http://{pod}.runcell-pods.default.svc.cluster.local:8080, a headless \
         Service's names). Needs cluster.pod.",
    ),
    no_flag(
        "cluster.peers",
        "RUNCELL_CLUSTER_PEERS",
        Pairs,
        "The other servers of the cluster by name, as POD=URL entries (a TOML table; \
         comma-separated in the environment), beside or instead of cluster.peer_url. Needs \
         cluster.pod.",
    ),
];

fn setting(key: &str) -> Option<&'static Setting> {
    SETTINGS.iter().find(|s| s.key == key)
}

/// The environment variable of a flag's setting, for its help text.
pub fn env_of(arg: &str) -> Option<&'static str> {
    SETTINGS
        .iter()
        .find(|s| s.arg == Some(arg))
        .and_then(|s| s.env)
}

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    File(PathBuf),
    Env(&'static str),
    Flag(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File(p) => write!(f, "the file {}", p.display()),
            Origin::Env(v) => write!(f, "the environment variable {v}"),
            Origin::Flag(flag) => write!(f, "the flag --{flag}"),
        }
    }
}

/// A setting refused: which one, where its value came from, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{key} (from {origin}): {message}")]
pub struct SettingsError {
    pub key: String,
    pub origin: String,
    pub message: String,
}

/// A value as a source wrote it: text (a flag, a variable) or TOML (the file).
#[derive(Debug, Clone, PartialEq)]
enum Raw {
    Text(String),
    Toml(toml::Value),
}

impl Raw {
    /// The value as text, as a flag would give it.
    fn text(&self) -> Option<String> {
        match self {
            Raw::Text(t) => Some(t.clone()),
            Raw::Toml(toml::Value::String(s)) => Some(s.clone()),
            Raw::Toml(toml::Value::Integer(i)) => Some(i.to_string()),
            Raw::Toml(toml::Value::Float(f)) => Some(f.to_string()),
            Raw::Toml(toml::Value::Boolean(b)) => Some(b.to_string()),
            Raw::Toml(_) => None,
        }
    }
}

/// One source's values: key -> value; a `Pairs` setting's entries as `key.NAME`.
#[derive(Debug, Clone, Default)]
struct Layer {
    values: BTreeMap<String, (Raw, Origin)>,
    /// The `[[api_keys]]` tables of the file.
    key_tables: Vec<(FileKey, Origin)>,
}

/// An `[[api_keys]]` entry.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct FileKey {
    id: String,
    key: String,
    #[serde(default)]
    allow_net: Option<Vec<String>>,
    #[serde(default)]
    admin: bool,
}

/// Every source's values, merged.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: BTreeMap<String, (Raw, Origin)>,
    key_tables: Vec<(FileKey, Origin)>,
    /// The entries of each `Pairs` setting, in order, each name once (the latest source's).
    pairs: BTreeMap<&'static str, Vec<(String, Raw, Origin)>>,
}

fn err(key: &str, origin: &Origin, message: impl Into<String>) -> SettingsError {
    SettingsError {
        key: key.to_string(),
        origin: origin.to_string(),
        message: message.into(),
    }
}

impl Settings {
    /// Gather the sources: the file (if any), the environment (as `env` gives it), and the
    /// flags a command's `matches` hold.
    pub fn gather(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<OsString>,
        matches: Option<&ArgMatches>,
    ) -> Result<Settings, SettingsError> {
        let mut layers = Vec::new();
        if let Some(path) = file {
            layers.push(file_layer(path)?);
        }
        layers.push(env_layer(env)?);
        if let Some(m) = matches {
            layers.push(flag_layer(m)?);
        }
        Ok(Settings::merge(layers))
    }

    /// Each source over the one before it; `Pairs` entry by entry.
    fn merge(layers: Vec<Layer>) -> Settings {
        let mut out = Settings::default();
        for layer in layers {
            if !layer.key_tables.is_empty() {
                out.key_tables = layer.key_tables;
            }
            for (key, (raw, origin)) in layer.values {
                if let Some((setting, name)) = pair_key(&key) {
                    let entries = out.pairs.entry(setting).or_default();
                    entries.retain(|(n, _, _)| *n != name);
                    entries.push((name, raw, origin));
                } else {
                    out.values.insert(key, (raw, origin));
                }
            }
        }
        out
    }

    /// A default of the command's own for `key`, below every source.
    pub fn default_to(&mut self, key: &str, text: &str) {
        self.values.entry(key.to_string()).or_insert((
            Raw::Text(text.to_string()),
            Origin::Flag(format!("{}'s default", key.replace('_', "-"))),
        ));
    }

    fn get(&self, key: &str) -> Option<&(Raw, Origin)> {
        self.values.get(key)
    }

    fn text(&self, key: &str) -> Result<Option<(String, &Origin)>, SettingsError> {
        match self.get(key) {
            None => Ok(None),
            Some((raw, origin)) => match raw.text() {
                Some(t) => Ok(Some((t, origin))),
                None => Err(err(key, origin, "expected a single value")),
            },
        }
    }

    fn count(&self, key: &str) -> Result<Option<usize>, SettingsError> {
        let Some((t, origin)) = self.text(key)? else {
            return Ok(None);
        };
        t.trim()
            .parse::<usize>()
            .map(Some)
            .map_err(|_| err(key, origin, format!("'{t}' is not a whole number")))
    }

    fn duration(&self, key: &str) -> Result<Option<Duration>, SettingsError> {
        match self.get(key) {
            None => Ok(None),
            Some((Raw::Toml(toml::Value::Integer(n)), origin)) => u64::try_from(*n)
                .map(|n| Some(Duration::from_secs(n)))
                .map_err(|_| err(key, origin, "must be a duration such as 30s")),
            Some((Raw::Toml(toml::Value::Float(f)), origin)) => {
                if f.is_finite() && *f >= 0.0 {
                    Ok(Some(Duration::from_secs_f64(*f)))
                } else {
                    Err(err(key, origin, "must be a duration such as 30s"))
                }
            }
            Some((raw, origin)) => {
                let t = raw
                    .text()
                    .ok_or_else(|| err(key, origin, "must be a duration such as 30s"))?;
                parse_duration(&t)
                    .map(Some)
                    .map_err(|_| err(key, origin, format!("'{t}' is not a duration such as 30s")))
            }
        }
    }

    fn size(&self, key: &str) -> Result<Option<u64>, SettingsError> {
        let Some((t, origin)) = self.text(key)? else {
            return Ok(None);
        };
        parse_size(&t)
            .map(Some)
            .map_err(|e| err(key, origin, format!("{e} (a size such as 64M)")))
    }

    fn bool(&self, key: &str) -> Result<Option<bool>, SettingsError> {
        match self.get(key) {
            None => Ok(None),
            Some((Raw::Toml(toml::Value::Boolean(b)), _)) => Ok(Some(*b)),
            Some((Raw::Text(t), _)) => Ok(Some(!matches!(
                t.trim().to_ascii_lowercase().as_str(),
                "" | "0" | "false" | "no" | "off" | "n" | "f"
            ))),
            Some((_, origin)) => Err(err(key, origin, "must be true or false")),
        }
    }

    fn list(&self, key: &str) -> Result<Option<(Vec<String>, &Origin)>, SettingsError> {
        match self.get(key) {
            None => Ok(None),
            Some((Raw::Text(t), origin)) => Ok(Some((split_list(t), origin))),
            Some((Raw::Toml(toml::Value::Array(items)), origin)) => {
                let mut out = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) => out.push(s.clone()),
                        _ => return Err(err(key, origin, "expected a list of strings")),
                    }
                }
                Ok(Some((out, origin)))
            }
            Some((_, origin)) => Err(err(key, origin, "expected a list of strings")),
        }
    }

    fn pairs(&self, key: &'static str) -> &[(String, Raw, Origin)] {
        self.pairs.get(key).map_or(&[], Vec::as_slice)
    }

    fn origin_of(&self, key: &str) -> Option<&Origin> {
        self.get(key).map(|(_, o)| o).or_else(|| {
            self.pairs
                .get(key)
                .and_then(|p| p.last().map(|(_, _, o)| o))
        })
    }
}

fn split_list(t: &str) -> Vec<String> {
    t.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(str::to_string)
        .collect()
}

/// `limits.default.memory` -> (`limits.default`, `memory`) for a `Pairs` setting's entry.
fn pair_key(key: &str) -> Option<(&'static str, String)> {
    SETTINGS
        .iter()
        .filter(|s| matches!(s.shape, Pairs | PairsWhole))
        .find_map(|s| {
            key.strip_prefix(s.key)
                .and_then(|rest| rest.strip_prefix('.'))
                .map(|name| (s.key, name.to_string()))
        })
}

/// The file's values. A file that holds keys and is readable by others than its owner is
/// refused, as ssh refuses such a private key; an unknown key is refused, not ignored.
fn file_layer(path: &Path) -> Result<Layer, SettingsError> {
    let origin = Origin::File(path.to_path_buf());
    let whole = |m: String| err("config", &origin, m);
    let text = std::fs::read_to_string(path).map_err(|e| whole(e.to_string()))?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| whole(e.to_string()))?;
    let mut layer = Layer::default();
    walk(&table, "", &origin, &mut layer)?;
    let has_secrets = !layer.key_tables.is_empty()
        || layer.values.contains_key("agent.api_key")
        || layer.values.contains_key("cluster.key");
    if has_secrets {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .map_err(|e| whole(e.to_string()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            return Err(whole(format!(
                "the file holds keys but its mode is {:o}: make it readable by its owner only \
                 (chmod 600)",
                mode & 0o777
            )));
        }
    }
    Ok(layer)
}

fn walk(
    table: &toml::Table,
    prefix: &str,
    origin: &Origin,
    layer: &mut Layer,
) -> Result<(), SettingsError> {
    for (k, v) in table {
        let key = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        if key == "api_keys" {
            let toml::Value::Array(items) = v else {
                return Err(err(&key, origin, "expected [[api_keys]] tables"));
            };
            for item in items {
                let entry: FileKey = item
                    .clone()
                    .try_into()
                    .map_err(|e: toml::de::Error| err(&key, origin, e.to_string()))?;
                layer.key_tables.push((entry, origin.clone()));
            }
            continue;
        }
        match setting(&key) {
            Some(s) if matches!(s.shape, Pairs | PairsWhole) => {
                let toml::Value::Table(entries) = v else {
                    return Err(err(&key, origin, "expected a table of NAME = VALUE"));
                };
                for (name, value) in entries {
                    layer.values.insert(
                        format!("{key}.{name}"),
                        (Raw::Toml(value.clone()), origin.clone()),
                    );
                }
            }
            Some(_) => {
                layer
                    .values
                    .insert(key, (Raw::Toml(v.clone()), origin.clone()));
            }
            None => match v {
                toml::Value::Table(t)
                    if SETTINGS
                        .iter()
                        .any(|s| s.key.starts_with(&format!("{key}."))) =>
                {
                    walk(t, &key, origin, layer)?
                }
                _ => {
                    return Err(err(
                        &key,
                        origin,
                        format!(
                            "unknown setting; the settings are: api_keys, {}",
                            SETTINGS
                                .iter()
                                .map(|s| s.key)
                                .filter(|k| *k != "api_keys" && *k != "admin_keys")
                                .collect::<Vec<_>>()
                                .join(", ")
                        ),
                    ))
                }
            },
        }
    }
    Ok(())
}

/// `NAME=VALUE` entries of a text value.
fn text_pairs(
    s: &Setting,
    text: &str,
    origin: &Origin,
    layer: &mut Layer,
) -> Result<(), SettingsError> {
    let entries: Vec<&str> = match s.shape {
        PairsWhole => vec![text],
        _ => text.split(',').collect(),
    };
    for entry in entries.into_iter().map(str::trim).filter(|e| !e.is_empty()) {
        let (name, value) = entry.split_once('=').ok_or_else(|| {
            err(
                s.key,
                origin,
                format!("'{entry}' is not NAME=VALUE (e.g. timeout=10s)"),
            )
        })?;
        layer.values.insert(
            format!("{}.{}", s.key, name.trim()),
            (Raw::Text(value.trim().to_string()), origin.clone()),
        );
    }
    Ok(())
}

fn env_layer(env: &dyn Fn(&str) -> Option<OsString>) -> Result<Layer, SettingsError> {
    let mut layer = Layer::default();
    for s in SETTINGS {
        let Some(var) = s.env else { continue };
        let Some(value) = env(var) else { continue };
        let origin = Origin::Env(var);
        let text = value
            .into_string()
            .map_err(|_| err(s.key, &origin, "is not valid UTF-8"))?;
        match s.shape {
            Pairs | PairsWhole => text_pairs(s, &text, &origin, &mut layer)?,
            _ => {
                layer
                    .values
                    .insert(s.key.to_string(), (Raw::Text(text), origin));
            }
        }
    }
    Ok(layer)
}

fn flag_layer(m: &ArgMatches) -> Result<Layer, SettingsError> {
    let mut layer = Layer::default();
    for s in SETTINGS {
        let Some(arg) = s.arg else { continue };
        // A command that does not take this flag, or did not get it.
        let Ok(Some(raw)) = m.try_get_raw(arg) else {
            continue;
        };
        if m.value_source(arg) != Some(ValueSource::CommandLine) {
            continue;
        }
        let origin = Origin::Flag(arg.replace('_', "-"));
        let values: Vec<String> = raw.map(|v| v.to_string_lossy().into_owned()).collect();
        match s.shape {
            Pairs | PairsWhole => {
                for v in &values {
                    text_pairs(s, v, &origin, &mut layer)?;
                }
            }
            Bool => {
                let on = m.get_flag(arg);
                layer.values.insert(
                    s.key.to_string(),
                    (Raw::Text(if on { "1" } else { "0" }.into()), origin),
                );
            }
            List => {
                layer
                    .values
                    .insert(s.key.to_string(), (Raw::Text(values.join(",")), origin));
            }
            One => {
                let v = values.into_iter().last().unwrap_or_default();
                layer
                    .values
                    .insert(s.key.to_string(), (Raw::Text(v), origin));
            }
        }
    }
    Ok(layer)
}

/// Where to listen: `ADDR:PORT` (`127.0.0.1:8080`, `[::1]:8080`, `0.0.0.0:8080`), a host
/// name and port (`localhost:8080`, resolved now; IPv4 first), or `:PORT` (loopback).
/// A key left as the example manifests ship it (`replace-me-with-openssl-rand-hex-32`): long
/// enough to pass for a key, and public.
fn is_placeholder(key: &str) -> bool {
    key.to_ascii_lowercase().contains("replace-me")
}

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

/// The limits of a `Pairs` setting onto `base`. A value is what a request would send
/// (`timeout = 10`, `memory = "256M"`, `cpus = 0.5`); from a flag, or as a TOML string, it is
/// the text a flag takes (`pids=8`, `cpus=0.5`).
fn apply_limits(
    base: Limits,
    key: &'static str,
    entries: &[(String, Raw, Origin)],
) -> Result<Limits, SettingsError> {
    let mut o = LimitOverrides::default();
    for (name, raw, origin) in entries {
        let entry_key = format!("{key}.{name}");
        let bad = |m: String| err(&entry_key, origin, m);
        let limit = Limit::from_name(name).ok_or_else(|| {
            bad(format!(
                "unknown limit '{name}'; the limits are: {}",
                limit_names()
            ))
        })?;
        match raw {
            Raw::Text(text) | Raw::Toml(toml::Value::String(text)) => o
                .set_text(limit, text)
                .map_err(|e| bad(format!("{name}: {e}")))?,
            Raw::Toml(v) => {
                // One limit as a request would send it, through the request's own parser.
                let value = serde_json::to_value(v).unwrap_or(serde_json::Value::Null);
                let one = serde_json::json!({ name: value });
                let parsed: LimitOverrides =
                    serde_json::from_value(one).map_err(|e| bad(e.to_string()))?;
                o.set(limit, parsed.get(limit));
            }
        }
    }
    Ok(o.apply_to(base))
}

impl Settings {
    /// The whole policy, for a host whose runtimes live in `host`.
    pub fn resolve(&self, host: runcell_runtimes::Host) -> Result<Policy, SettingsError> {
        let mut engine = EngineConfig::for_host();
        engine.host = host;
        self.resolve_onto(engine)
    }

    /// The whole policy, onto the engine's defaults `engine` (the host's, or a test's).
    pub fn resolve_onto(&self, mut engine: EngineConfig) -> Result<Policy, SettingsError> {
        let origin = |key: &str| {
            self.origin_of(key)
                .map(ToString::to_string)
                .unwrap_or_else(|| "the defaults".to_string())
        };
        let fail = |key: &str, m: String| SettingsError {
            key: key.to_string(),
            origin: origin(key),
            message: m,
        };
        // Limits and caps first: the default body cap follows from them.
        let policy = &mut engine.policy;
        policy.defaults = apply_limits(
            policy.defaults,
            "limits.default",
            self.pairs("limits.default"),
        )?;
        policy.max = apply_limits(policy.max, "limits.max", self.pairs("limits.max"))?;
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
        for (name, raw, origin) in self.pairs("caps") {
            let key = format!("caps.{name}");
            let text = raw
                .text()
                .ok_or_else(|| err(&key, origin, "expected a size or a count"))?;
            policy.set_cap(name, &text).map_err(|e| {
                err(
                    &key,
                    origin,
                    if CAP_NAMES.contains(&name.as_str()) {
                        e
                    } else {
                        format!(
                            "unknown cap '{name}'; the caps are: {}",
                            CAP_NAMES.join(", ")
                        )
                    },
                )
            })?;
        }
        // Every default must lie between the minimum and the operator's maximum.
        policy
            .resolve(&LimitOverrides::default())
            .map_err(|e| fail("limits.default", format!("the default {e}")))?;
        engine.strict = self.bool("strict")?.unwrap_or(false);
        // Forked interpreters where the host allows them (docs/isolation.md, "Templates");
        // the one-run commands default to off (a template started for one run costs more
        // than it saves).
        engine.templates = self.bool("templates")?.unwrap_or(true);

        let mut c = Policy::new(engine);
        if let Some((t, origin)) = self.text("listen")? {
            c.listen = parse_listen(&t).map_err(|e| err("listen", origin, e))?;
        }
        if let Some((t, origin)) = self.text("agent_sandbox.listen")? {
            c.agent_sandbox_listen =
                Some(parse_listen(&t).map_err(|e| err("agent_sandbox.listen", origin, e))?);
        }
        self.api_keys(&mut c)?;
        if let Some(n) = self.count("max_concurrent")? {
            if n == 0 || n > runcell_server::MAX_SLOTS {
                return Err(fail(
                    "max_concurrent",
                    format!(
                        "max_concurrent must be between 1 and {}",
                        runcell_server::MAX_SLOTS
                    ),
                ));
            }
            c.max_concurrent = n;
            c.max_queue = 4 * n;
        }
        if let Some(n) = self.count("max_queue")? {
            if n > runcell_server::MAX_SLOTS {
                return Err(fail(
                    "max_queue",
                    format!("max_queue must be at most {}", runcell_server::MAX_SLOTS),
                ));
            }
            c.max_queue = n;
        }
        for key in ["max_connections", "max_connections_per_peer"] {
            if let Some(n) = self.count(key)? {
                if n == 0 {
                    return Err(fail(key, format!("{key} must be at least 1")));
                }
                if key == "max_connections" {
                    c.max_connections = Some(n);
                } else {
                    c.max_connections_per_peer = Some(n);
                }
            }
        }
        // The host's file table is shared by the runs at once (unless the operator set the cap).
        if !self
            .pairs("caps")
            .iter()
            .any(|(name, _, _)| name == "open_files_per_run")
        {
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
            .map_err(|e| fail("limits.default", format!("the default limits: {e}")))?;
        c.max_body_bytes = runcell_core::policy::default_max_body_bytes(&c.engine.policy);
        if let Some(n) = self.size("max_body")? {
            c.max_body_bytes = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(d) = self.duration("shutdown_grace")? {
            c.shutdown_grace = d;
        }
        if let Some((t, _)) = self.text("audit_log")? {
            c.audit = AuditTarget::parse(&t);
        }
        self.pool(&mut c)?;
        // The request bodies in line are the server's memory, within what its container may
        // hold: at most a quarter of what runs may use. Unless the operator set them, a small
        // container gets fewer places in line, then a smaller body cap.
        if let Some(all) = c.engine.all_runs_memory_bytes {
            let quarter = all / 4;
            let body = c.max_body_bytes.max(1) as u64;
            let places = |c: &Policy| (c.max_concurrent + c.max_queue) as u64;
            if places(&c) * body > quarter && self.count("max_queue")?.is_none() {
                c.max_queue =
                    usize::try_from((quarter / body).saturating_sub(c.max_concurrent as u64))
                        .unwrap_or(0)
                        .min(c.max_queue);
            }
            if places(&c) * body > quarter && self.size("max_body")?.is_none() {
                c.max_body_bytes = usize::try_from(quarter / places(&c)).unwrap_or(usize::MAX);
            }
        }
        // The memory runs may use is shared by the runs at once, unless the operator set the
        // maxima of memory and disk.
        // What the warm pool holds while idle is not theirs (the memory ledger's budget), nor
        // what the request bodies in line may hold.
        if let Some(all) = c.engine.all_runs_memory_bytes {
            let bodies = (c.max_concurrent + c.max_queue) as u64 * c.max_body_bytes as u64;
            let usable = all
                .saturating_sub(runcell_core::pool::warm_reserve_bytes(&c.pool, &c.preload))
                .saturating_sub(bodies);
            let explicit = |name: &str| self.pairs("limits.max").iter().any(|(n, _, _)| n == name);
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
        self.sessions(&mut c)?;
        self.network(&mut c)?;
        self.packages(&mut c)?;
        self.agent(&mut c)?;
        self.cluster(&mut c)?;
        Ok(c)
    }

    /// Several servers behind one address: all of `cluster.pod`, `cluster.key` and a way to
    /// reach the peers (`cluster.peer_url`, `cluster.peers`), or none of them.
    fn cluster(&self, c: &mut Policy) -> Result<(), SettingsError> {
        use runcell_core::cluster::{ClusterError, ClusterSettings};
        let pod = self.text("cluster.pod")?;
        let key = self.text("cluster.key")?;
        let peer_url = self.text("cluster.peer_url")?;
        let mut peers = BTreeMap::new();
        for (name, raw, origin) in self.pairs("cluster.peers") {
            let url = raw
                .text()
                .ok_or_else(|| err("cluster.peers", origin, "expected POD=URL entries"))?;
            peers.insert(name.clone(), url);
        }
        let origin_of = |key: &str| {
            self.origin_of(key)
                .map(ToString::to_string)
                .unwrap_or_else(|| "the defaults".into())
        };
        let Some((pod, pod_origin)) = pod else {
            let set = ["cluster.key", "cluster.peer_url", "cluster.peers"]
                .into_iter()
                .find(|&k| self.get(k).is_some() || !self.pairs(k).is_empty());
            return match set {
                None => Ok(()),
                Some(other) => Err(SettingsError {
                    key: other.into(),
                    origin: origin_of(other),
                    message: format!(
                        "{other} is set but cluster.pod is not: a clustered server needs its \
                         name (--cluster-pod, RUNCELL_POD_NAME)"
                    ),
                }),
            };
        };
        let Some((key, _)) = key else {
            return Err(err(
                "cluster.key",
                pod_origin,
                "cluster.pod is set but cluster.key is not: the servers of a cluster share a \
                 secret key (RUNCELL_CLUSTER_KEY, at least 32 bytes) that authenticates \
                 session ids",
            ));
        };
        if is_placeholder(&key) {
            return Err(err(
                "cluster.key",
                pod_origin,
                "cluster.key is an example's placeholder ('replace-me...'): replace it with a \
                 long random key (e.g. `openssl rand -hex 32`)",
            ));
        }
        let settings = ClusterSettings {
            pod: pod.trim().to_string(),
            key: key.into_bytes(),
            peer_url: peer_url.map(|(u, _)| u.trim().to_string()),
            peers,
        };
        settings.validate().map_err(|e| {
            let key = match &e {
                ClusterError::PodName(p) if *p == settings.pod => "cluster.pod",
                ClusterError::PodName(_) | ClusterError::PeerUrl(_) => "cluster.peers",
                ClusterError::KeyTooShort => "cluster.key",
                ClusterError::Template(_) | ClusterError::NoPeers => "cluster.peer_url",
            };
            SettingsError {
                key: key.into(),
                origin: origin_of(key),
                message: format!("{key}: {e}"),
            }
        })?;
        c.cluster = Some(settings);
        Ok(())
    }

    fn api_keys(&self, c: &mut Policy) -> Result<(), SettingsError> {
        // Keys from a flag or the environment replace the file's tables.
        c.api_keys = match self.list("api_keys")? {
            Some((keys, _)) => keys
                .iter()
                .enumerate()
                .map(|(i, k)| ApiKey::new(format!("key-{}", i + 1), k.as_str()))
                .collect(),
            None => {
                let mut keys = Vec::new();
                for (k, origin) in &self.key_tables {
                    let mut key = ApiKey::new(k.id.clone(), k.key.trim());
                    key.admin = k.admin;
                    if let Some(list) = &k.allow_net {
                        key.allow_net = Some(runcell_proxy::parse_rules(list).map_err(|e| {
                            err(
                                "api_keys",
                                origin,
                                format!("api key '{}': allow_net: {e}", k.id),
                            )
                        })?);
                    }
                    keys.push(key);
                }
                keys
            }
        };
        if let Some((admins, _)) = self.list("admin_keys")? {
            for (i, k) in admins.iter().enumerate() {
                let mut key = ApiKey::new(format!("admin-{}", i + 1), k.as_str());
                key.admin = true;
                c.api_keys.push(key);
            }
        }
        let mut ids = std::collections::HashSet::new();
        let origin = self
            .origin_of("api_keys")
            .or(self.key_tables.first().map(|(_, o)| o))
            .or(self.origin_of("admin_keys"))
            .map(ToString::to_string)
            .unwrap_or_else(|| "the defaults".into());
        let bad = |m: String| SettingsError {
            key: "api_keys".into(),
            origin: origin.clone(),
            message: m,
        };
        for k in &c.api_keys {
            if k.key().is_empty() {
                return Err(bad(format!("API key '{}' is empty", k.id)));
            }
            if is_placeholder(k.key()) {
                return Err(bad(format!(
                    "API key '{}' is an example's placeholder ('replace-me...'): replace it \
                     with a long random key (e.g. `openssl rand -hex 32`)",
                    k.id
                )));
            }
            if k.key().len() < 16 {
                return Err(bad(format!(
                    "API key '{}' is shorter than 16 characters: use a long random key \
                     (e.g. `openssl rand -hex 32`)",
                    k.id
                )));
            }
            if !ids.insert(k.id.clone()) {
                return Err(bad(format!("API key id '{}' is used twice", k.id)));
            }
        }
        Ok(())
    }

    fn pool(&self, c: &mut Policy) -> Result<(), SettingsError> {
        // The warm pool: the default for this machine, then the entries of every source.
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get() as u64);
        let mut pool = runcell_core::PoolSizes::default_for(cpus, c.max_concurrent);
        for (lang, raw, origin) in self.pairs("pool") {
            let n = raw.text().unwrap_or_default();
            pool.set_text(&format!("{lang}={n}"))
                .map_err(|e| err(&format!("pool.{lang}"), origin, e))?;
        }
        c.pool = pool;
        let mut preload = runcell_core::Preload::default();
        for (lang, raw, origin) in self.pairs("preload") {
            let key = format!("preload.{lang}");
            let modules: Vec<String> = match raw {
                Raw::Toml(toml::Value::Array(items)) => items
                    .iter()
                    .map(|m| m.as_str().map(str::to_string))
                    .collect::<Option<_>>()
                    .ok_or_else(|| err(&key, origin, "expected a list of module names"))?,
                other => split_list(&other.text().unwrap_or_default()),
            };
            let language = runcell_core::Language::parse(lang)
                .ok_or_else(|| err(&key, origin, format!("unknown language {lang:?}")))?;
            preload
                .add(language, modules.iter().map(String::as_str))
                .map_err(|e| err(&key, origin, e))?;
        }
        c.preload = preload;
        Ok(())
    }

    fn sessions(&self, c: &mut Policy) -> Result<(), SettingsError> {
        let sp = &mut c.sessions;
        if let Some(n) = self.count("sessions.max")? {
            sp.max_total = n;
        }
        if let Some(n) = self.count("sessions.per_key")? {
            sp.max_per_owner = n;
        }
        if let Some(d) = self.duration("sessions.ttl")? {
            sp.default_ttl = d;
        }
        if let Some(d) = self.duration("sessions.max_ttl")? {
            sp.max_ttl = d;
        }
        if let Some(d) = self.duration("sessions.lifetime")? {
            sp.max_lifetime = d;
        }
        if let Some(d) = self.duration("sessions.paused_ttl")? {
            sp.paused_ttl = d;
        }
        if sp.default_ttl > sp.max_ttl {
            sp.max_ttl = sp.default_ttl;
        }
        if sp.max_lifetime < sp.default_ttl {
            return Err(SettingsError {
                key: "sessions.lifetime".into(),
                origin: self
                    .origin_of("sessions.lifetime")
                    .or(self.origin_of("sessions.ttl"))
                    .map(ToString::to_string)
                    .unwrap_or_else(|| "the defaults".into()),
                message: format!(
                    "sessions: the lifetime ({} s) is shorter than the idle TTL ({} s)",
                    sp.max_lifetime.as_secs(),
                    sp.default_ttl.as_secs()
                ),
            });
        }
        Ok(())
    }

    fn network(&self, c: &mut Policy) -> Result<(), SettingsError> {
        let net = &mut c.engine.network;
        if let Some((allow, origin)) = self.list("network.allow")? {
            net.allow = runcell_proxy::parse_rules(&allow)
                .map_err(|e| err("network.allow", origin, format!("network: {e}")))?;
        }
        if let Some(n) = self.count("network.max_connections")? {
            if n == 0 {
                return Err(SettingsError {
                    key: "network.max_connections".into(),
                    origin: self
                        .origin_of("network.max_connections")
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    message: "network: max_connections must be at least 1".into(),
                });
            }
            net.max_connections = u32::try_from(n).unwrap_or(u32::MAX);
        }
        if let Some(n) = self.size("network.max_bytes")? {
            net.max_bytes = n;
        }
        if let Some(on) = self.bool("network.approval")? {
            net.approval = on;
        }
        if let Some((by, origin)) = self.text("network.approval_by")? {
            match by.trim() {
                "admin" => net.approval_by_client = false,
                "client" => net.approval_by_client = true,
                other => {
                    return Err(err(
                        "network.approval_by",
                        origin,
                        format!("network: approval_by {other:?} is not \"admin\" or \"client\""),
                    ))
                }
            }
        }
        if let Some(d) = self.duration("network.approval_timeout")? {
            net.approval_timeout = d;
        }
        Ok(())
    }

    fn packages(&self, c: &mut Policy) -> Result<(), SettingsError> {
        let pk = &mut c.engine.packages;
        if let Some((names, origin)) = self.list("packages.allow")? {
            pk.allow_any = names.iter().any(|n| n == "*");
            pk.allow = names.into_iter().filter(|n| n != "*").collect();
            if let Some(bad) = pk.allow.iter().find(|n| {
                n.is_empty()
                    || !n
                        .chars()
                        .all(|ch| ch.is_ascii_alphanumeric() || "-_.".contains(ch))
            }) {
                return Err(err(
                    "packages.allow",
                    origin,
                    format!("packages: {bad:?} is not a package name"),
                ));
            }
        }
        let hosts = self.list("packages.file_hosts")?.map(|(h, _)| h);
        if let Some((index, _)) = self.text("packages.index_url")? {
            pk.index_url = index;
            // A mirror serves its own files unless told otherwise.
            pk.file_hosts = hosts.unwrap_or_default();
        } else if let Some(hosts) = hosts {
            pk.file_hosts = hosts;
        }
        if let Some(d) = self.duration("packages.install_timeout")? {
            pk.install_timeout = d;
        }
        if let Some(n) = self.size("packages.cache_max")? {
            if n == 0 {
                return Err(SettingsError {
                    key: "packages.cache_max".into(),
                    origin: self
                        .origin_of("packages.cache_max")
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    message: "packages: cache_max must be more than 0".into(),
                });
            }
            pk.cache_max_bytes = n;
        }
        if pk.enabled() {
            let origin = self
                .origin_of("packages.index_url")
                .or(self.origin_of("packages.allow"))
                .map(ToString::to_string)
                .unwrap_or_default();
            pk.destinations().map_err(|e| SettingsError {
                key: "packages.index_url".into(),
                origin,
                message: format!("packages: {e}"),
            })?;
        }
        Ok(())
    }

    fn agent(&self, c: &mut Policy) -> Result<(), SettingsError> {
        let Some((upstream, origin)) = self.text("agent.upstream")? else {
            return Ok(());
        };
        if runcell_agent::Wire::parse(&upstream).is_none() {
            return Err(err(
                "agent.upstream",
                origin,
                format!("agent: upstream {upstream:?} is not anthropic or openai"),
            ));
        }
        let model = self.text("agent.model")?.map(|(m, _)| m).ok_or_else(|| {
            err(
                "agent.model",
                origin,
                "agent: a default model is needed (--agent-model, RUNCELL_AGENT_MODEL or \
                 [agent] model)",
            )
        })?;
        let whole = |key: &str| -> Result<Option<u32>, SettingsError> {
            Ok(self
                .count(key)?
                .map(|n| u32::try_from(n).unwrap_or(u32::MAX)))
        };
        c.agent = Some(AgentSettings {
            upstream,
            base_url: self.text("agent.base_url")?.map(|(t, _)| t),
            api_key: self.text("agent.api_key")?.map(|(t, _)| t),
            model,
            models: self
                .list("agent.models")?
                .map(|(m, _)| m)
                .unwrap_or_default(),
            timeout: self.duration("agent.timeout")?,
            max_iterations: whole("agent.max_iterations")?,
            max_calls: whole("agent.max_calls")?,
            max_code_retries: whole("agent.max_code_retries")?,
        });
        Ok(())
    }
}

/// The settings of the process: the file `config` names, the process's environment, and a
/// command's flags.
pub fn from_process(
    config: Option<&Path>,
    matches: Option<&ArgMatches>,
) -> Result<Settings, SettingsError> {
    Settings::gather(config, &|v| std::env::var_os(v), matches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use runcell_core::limits::LimitPolicy;

    fn engine() -> EngineConfig {
        let mut e = EngineConfig::for_host();
        e.policy = LimitPolicy::for_host(8 << 30, 2);
        e
    }

    fn file_with(text: &str) -> (tempfile::TempDir, PathBuf) {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runcell.toml");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        (dir, path)
    }

    /// The flags of `runcell serve ARGS`.
    fn serve_flags(args: &[&str]) -> ArgMatches {
        use clap::CommandFactory;
        let mut argv = vec!["runcell", "serve"];
        argv.extend_from_slice(args);
        let m = crate::Cli::command().get_matches_from(argv);
        m.subcommand_matches("serve").unwrap().clone()
    }

    fn resolve(
        toml_text: Option<&str>,
        env: &[(&str, &str)],
        flags: &[&str],
    ) -> Result<Policy, SettingsError> {
        let file = toml_text.map(file_with);
        let env: BTreeMap<String, String> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let m = serve_flags(flags);
        Settings::gather(
            file.as_ref().map(|(_, p)| p.as_path()),
            &|v| env.get(v).map(OsString::from),
            Some(&m),
        )?
        .resolve_onto(engine())
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
        [sessions]
        max = 5
        ttl = "2m"
        [network]
        allow = ["api.github.com:443"]
        approval = true
        [agent]
        upstream = "openai"
        model = "m"
        max_calls = 4
    "#;

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

    #[test]
    fn the_file_sets_everything() {
        let c = resolve(Some(FULL), &[], &[]).unwrap();
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
        assert_eq!(c.sessions.max_total, 5);
        assert_eq!(c.sessions.default_ttl, Duration::from_secs(120));
        assert_eq!(c.engine.network.allow.len(), 1);
        assert!(c.engine.network.approval);
        let agent = c.agent.unwrap();
        assert_eq!(
            (agent.upstream.as_str(), agent.max_calls),
            ("openai", Some(4))
        );
    }

    #[test]
    fn the_environment_wins_over_the_file_and_the_flags_over_both() {
        let env = [
            ("RUNCELL_MAX_QUEUE", "7"),
            ("RUNCELL_MAX_LIMITS", "timeout=40,pids=100"),
            ("RUNCELL_STRICT", "0"),
            ("RUNCELL_LISTEN", "127.0.0.1:1111"),
        ];
        let c = resolve(Some(FULL), &env, &[]).unwrap();
        assert_eq!(c.max_queue, 7, "the environment over the file");
        assert!(
            !c.engine.strict,
            "RUNCELL_STRICT=0 turns the file's strict off"
        );
        assert_eq!(c.listen, "127.0.0.1:1111".parse().unwrap());
        let p = &c.engine.policy;
        assert_eq!(p.max.timeout.0, 40_000);
        assert_eq!(p.max.pids.0, 100);
        assert_eq!(
            p.max.memory.0,
            1 << 30,
            "an entry the variable does not name"
        );

        let c = resolve(
            Some(FULL),
            &env,
            &[
                "--listen",
                "127.0.0.1:1234",
                "--api-key",
                "ffffffffffffffffffff",
                "--api-key",
                "eeeeeeeeeeeeeeeeeeee",
                "--max-queue",
                "2",
                "--max-limit",
                "timeout=30",
                "--default-limit",
                "memory=64M",
                "--cap",
                "code=1K",
                "--audit-log",
                "off",
            ],
        )
        .unwrap();
        assert_eq!(c.listen, "127.0.0.1:1234".parse().unwrap());
        assert_eq!(c.max_concurrent, 3, "from the file");
        assert_eq!(c.max_queue, 2, "the flag over the variable");
        let ids: Vec<_> = c.api_keys.iter().map(|k| k.id.as_str()).collect();
        assert_eq!(
            ids,
            ["key-1", "key-2"],
            "the flags' keys replace the file's"
        );
        let p = &c.engine.policy;
        assert_eq!(
            p.max.timeout.0, 30_000,
            "the flag's entry over the variable's"
        );
        assert_eq!(
            p.max.pids.0, 100,
            "the variable's entry the flag does not name"
        );
        assert_eq!(p.max.memory.0, 1 << 30, "the file's entry");
        assert_eq!(p.defaults.memory.0, 64 << 20);
        assert_eq!(p.defaults.timeout.0, 10_000, "from the file");
        assert_eq!(p.max_code_bytes, 1024);
        assert_eq!(c.audit, AuditTarget::Off);
    }

    #[test]
    fn the_agent_sandbox_listener_is_off_unless_an_address_is_named() {
        assert_eq!(resolve(None, &[], &[]).unwrap().agent_sandbox_listen, None);
        let file = "[agent_sandbox]\nlisten = \"0.0.0.0:8888\"\n";
        let c = resolve(Some(file), &[], &[]).unwrap();
        assert_eq!(
            c.agent_sandbox_listen,
            Some("0.0.0.0:8888".parse().unwrap())
        );
        let env = [("RUNCELL_AGENT_SANDBOX_LISTEN", ":9999")];
        let c = resolve(Some(file), &env, &[]).unwrap();
        assert_eq!(
            c.agent_sandbox_listen,
            Some("127.0.0.1:9999".parse().unwrap())
        );
        let c = resolve(Some(file), &env, &["--agent-sandbox-listen", "[::]:7777"]).unwrap();
        assert_eq!(c.agent_sandbox_listen, Some("[::]:7777".parse().unwrap()));
        let e = resolve(None, &[("RUNCELL_AGENT_SANDBOX_LISTEN", "nowhere")], &[])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("agent_sandbox.listen") && e.contains("RUNCELL_AGENT_SANDBOX_LISTEN"),
            "{e}"
        );
    }

    #[test]
    fn bad_settings_are_refused_naming_the_setting_and_its_source() {
        /// A file, variables, flags, and the words the error must contain.
        type Case<'a> = (
            Option<&'a str>,
            &'a [(&'a str, &'a str)],
            &'a [&'a str],
            &'a [&'a str],
        );
        let cases: [Case; 14] = [
            (None, &[], &["--max-concurrent", "99999999"],
             &["max_concurrent", "--max-concurrent", "between 1 and"]),
            (Some("max_queue = 9999999999\n"), &[], &[],
             &["max_queue", "runcell.toml", "at most"]),
            (None, &[], &["--default-limit", "timeout=2h"],
             &["the default timeout is 120 min, above the maximum of 60 min"]),
            (None, &[], &["--max-limit", "memry=1G"], &["memry", "--max-limit"]),
            (None, &[], &["--max-limit", "timeout"], &["NAME=VALUE"]),
            (None, &[("RUNCELL_CAPS", "cod=1")], &[],
             &["unknown cap", "RUNCELL_CAPS"]),
            (None, &[], &["--api-key", "short"], &["shorter than 16", "--api-key"]),
            (None, &[("RUNCELL_API_KEY", "replace-me-with-openssl-rand-hex-32")], &[],
             &["placeholder", "RUNCELL_API_KEY"]),
            (None, &[("RUNCELL_CLUSTER_KEY", "replace-me-with-another-openssl-rand-hex-32")],
             &["--cluster-pod", "runcell-0"], &["placeholder", "cluster.key"]),
            (Some("[limits.max]\ntimeout = \"1s\"\n"), &[], &[],
             &["the default timeout is 30 s, above the maximum of 1 s"]),
            (Some("[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef0\"\n[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef1\"\n"),
             &[], &[], &["used twice"]),
            (None, &[("RUNCELL_MAX_QUEUE", "lots")], &[],
             &["max_queue", "the environment variable RUNCELL_MAX_QUEUE", "'lots'"]),
            (Some("listn = \"x\"\n"), &[], &[], &["listn", "unknown setting"]),
            (Some("[limits.maximum]\ntimeout = 1\n"), &[], &[], &["limits.maximum"]),
        ];
        for (toml_text, env, flags, needles) in cases {
            let e = resolve(toml_text, env, flags).unwrap_err().to_string();
            for needle in needles {
                assert!(e.contains(needle), "expected '{needle}' in: {e}");
            }
        }
    }

    #[test]
    fn the_package_cache_is_bounded_by_the_file_the_environment_or_the_flag() {
        let c = resolve(None, &[], &[]).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 2 << 30);
        let f = "[packages]\ncache_max = \"512M\"\n";
        let c = resolve(Some(f), &[], &[]).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 512 << 20);
        let c = resolve(Some(f), &[("RUNCELL_PACKAGE_CACHE_MAX", "256M")], &[]).unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 256 << 20);
        let c = resolve(
            Some(f),
            &[("RUNCELL_PACKAGE_CACHE_MAX", "256M")],
            &["--package-cache-max", "1G"],
        )
        .unwrap();
        assert_eq!(c.engine.packages.cache_max_bytes, 1 << 30);
        let e = resolve(None, &[], &["--package-cache-max", "0"]).unwrap_err();
        assert!(e.to_string().contains("more than 0"), "{e}");
    }

    #[test]
    fn a_readable_file_with_keys_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let (_dir, path) = file_with("[[api_keys]]\nid = \"a\"\nkey = \"0123456789abcdef0\"\n");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = Settings::gather(Some(&path), &|_| None, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("chmod 600"), "{e}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let s = Settings::gather(Some(&path), &|_| None, None).unwrap();
        assert_eq!(s.resolve_onto(engine()).unwrap().api_keys.len(), 1);
    }

    #[test]
    fn cluster_settings_come_together_or_not_at_all() {
        const KEY: &str = "cluster-secret-key-0123456789abcdef";
        let env = [
            ("RUNCELL_POD_NAME", "runcell-1"),
            ("RUNCELL_CLUSTER_KEY", KEY),
            (
                "RUNCELL_CLUSTER_PEER_URL",
                "http://{pod}.runcell-pods.default.svc.cluster.local:8080",
            ),
            ("RUNCELL_CLUSTER_PEERS", "runcell-0=http://127.0.0.1:9000"),
        ];
        let c = resolve(None, &env, &[]).unwrap().cluster.unwrap();
        assert_eq!(c.pod, "runcell-1");
        assert_eq!(c.key, KEY.as_bytes());
        assert_eq!(c.peer_base("runcell-0").unwrap(), "http://127.0.0.1:9000");
        assert_eq!(
            c.peer_base("runcell-2").unwrap(),
            "http://runcell-2.runcell-pods.default.svc.cluster.local:8080"
        );
        // The flag over the environment, the file's table for the peers.
        let file = "[cluster]\npod = \"runcell-5\"\n[cluster.peers]\nruncell-0 = \"http://10.0.0.1:8080\"\n";
        let c = resolve(Some(file), &env[1..2], &["--cluster-pod", "runcell-7"])
            .unwrap()
            .cluster
            .unwrap();
        assert_eq!(c.pod, "runcell-7");
        assert_eq!(c.peer_base("runcell-0").unwrap(), "http://10.0.0.1:8080");
        assert!(resolve(None, &[], &[]).unwrap().cluster.is_none());

        type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str]);
        let cases: [Case; 6] = [
            (&env[..1], &["cluster.key", "RUNCELL_POD_NAME", "is not"]),
            (&env[1..], &["cluster.key is set but cluster.pod is not"]),
            (
                &env[2..3],
                &["cluster.peer_url is set but cluster.pod is not"],
            ),
            (
                &[
                    ("RUNCELL_POD_NAME", "Runcell_1"),
                    ("RUNCELL_CLUSTER_KEY", KEY),
                    env[2],
                ],
                &["cluster.pod", "DNS-1123"],
            ),
            (
                &[env[0], ("RUNCELL_CLUSTER_KEY", "short"), env[2]],
                &["cluster.key", "RUNCELL_CLUSTER_KEY", "at least 32"],
            ),
            (
                &[
                    env[0],
                    env[1],
                    ("RUNCELL_CLUSTER_PEER_URL", "http://runcell:8080"),
                ],
                &["cluster.peer_url", "{pod}"],
            ),
        ];
        for (env, needles) in cases {
            let e = resolve(None, env, &[]).unwrap_err().to_string();
            for needle in needles {
                assert!(e.contains(needle), "expected '{needle}' in: {e}");
            }
        }
    }

    #[test]
    fn every_flag_of_serve_is_a_setting_and_every_setting_has_one_source_each() {
        use clap::CommandFactory;
        let cmd = crate::Cli::command();
        let serve = cmd.find_subcommand("serve").unwrap();
        for arg in serve.get_arguments() {
            let id = arg.get_id().as_str();
            if matches!(id, "config" | "help") {
                continue;
            }
            assert!(
                SETTINGS.iter().any(|s| s.arg == Some(id)),
                "--{id} is not in the settings table"
            );
            assert!(
                arg.get_env().is_none(),
                "--{id} reads its variable through clap, not the settings model"
            );
        }
        let mut envs = std::collections::HashSet::new();
        for s in SETTINGS {
            if let Some(e) = s.env {
                assert!(envs.insert(e), "{e} twice");
            }
            if let Some(a) = s.arg {
                assert!(
                    serve.get_arguments().any(|x| x.get_id() == a),
                    "{}: serve has no --{a}",
                    s.key
                );
            }
        }
    }
}
