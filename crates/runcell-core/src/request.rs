//! The one request type: the HTTP API deserializes it, MCP deserializes a tool call's
//! arguments into it, the CLI builds it from its flags, and the agent loop and sessions will
//! do the same. Its limits are flattened into it under their wire names (`timeout`,
//! `memory`, `cpus`, ...; see [`crate::limits`]).

use std::collections::BTreeMap;

use serde::de::DeserializeSeed;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::limits::{Limit, LimitOverrides};

/// The one request of runcell, as every door receives it: a one-shot run (`POST /v1/execute`,
/// an MCP call, a model's tool call, `runcell run`), a session's creation (`POST
/// /v1/sessions`) or a call in a session. Which fields a door may send, and which a target
/// requires, is the intake's table ([`crate::intake`]); this type only holds what was sent.
/// Its limits are flattened into it under their wire names (`timeout`, `memory`, ...).
///
/// Deserialized by hand (see below), not with `#[serde(flatten)]`: flatten buffers every
/// value it does not recognise before looking at it, so a body of megabytes of nested
/// arrays under an unknown key would be held several times over in memory before it is
/// refused. Here an unknown key, a key the door may not send, or a value of the wrong shape
/// stops the parser at once, before its value is read.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ExecRequest {
    /// python, node (or javascript), ruby, go, bash.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// The program's source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Bytes fed to the program's standard input (otherwise it reads /dev/null).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdin: Option<String>,
    /// Files to place in /workspace before the program starts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<InputFile>,
    /// Limits to change from the operator's defaults.
    #[serde(flatten)]
    pub limits: LimitOverrides,
    /// Network by permission: the destinations this run may reach, within the operator's
    /// policy. Without it the run has no network at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkRequest>,
    /// Python packages the curated stack lacks, installed (binary wheels only) from the
    /// operator's index before the run, within the operator's package policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub packages: Vec<String>,
    /// A new session's idle time to live, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<f64>,
    /// Environment variables for the program (a session's for every call), beside the ones
    /// runcell sets.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

/// One field of [`ExecRequest`] as the wire names it: the request's own, and each limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Field {
    Language,
    Code,
    Stdin,
    Files,
    Network,
    Packages,
    Ttl,
    Env,
    Limit(Limit),
}

/// The request's own fields, in the order documentation lists them.
const OWN_FIELDS: [Field; 8] = [
    Field::Language,
    Field::Code,
    Field::Stdin,
    Field::Files,
    Field::Network,
    Field::Packages,
    Field::Ttl,
    Field::Env,
];

impl Field {
    /// Every field: the request's own, then the limits.
    pub fn all() -> impl Iterator<Item = Field> {
        OWN_FIELDS
            .into_iter()
            .chain(Limit::ALL.iter().map(|&l| Field::Limit(l)))
    }

    /// The key in a request body.
    pub fn name(self) -> &'static str {
        match self {
            Field::Language => "language",
            Field::Code => "code",
            Field::Stdin => "stdin",
            Field::Files => "files",
            Field::Network => "network",
            Field::Packages => "packages",
            Field::Ttl => "ttl",
            Field::Env => "env",
            Field::Limit(l) => l.name(),
        }
    }

    pub fn from_name(name: &str) -> Option<Field> {
        Field::all().find(|f| f.name() == name)
    }

    fn bit(self) -> u64 {
        let i = match self {
            Field::Limit(l) => {
                OWN_FIELDS.len() + Limit::ALL.iter().position(|&x| x == l).unwrap_or(0)
            }
            own => OWN_FIELDS.iter().position(|&x| x == own).unwrap_or(0),
        };
        1 << i
    }
}

impl std::fmt::Display for Field {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A set of [`Field`]s.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FieldSet(u64);

impl FieldSet {
    pub const EMPTY: FieldSet = FieldSet(0);

    pub fn all() -> FieldSet {
        Field::all().collect()
    }

    pub fn contains(self, f: Field) -> bool {
        self.0 & f.bit() != 0
    }

    pub fn with(self, f: Field) -> FieldSet {
        FieldSet(self.0 | f.bit())
    }

    pub fn without(self, f: Field) -> FieldSet {
        FieldSet(self.0 & !f.bit())
    }

    pub fn and(self, other: FieldSet) -> FieldSet {
        FieldSet(self.0 & other.0)
    }

    pub fn minus(self, other: FieldSet) -> FieldSet {
        FieldSet(self.0 & !other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The fields, in documentation order.
    pub fn iter(self) -> impl Iterator<Item = Field> {
        Field::all().filter(move |f| self.contains(*f))
    }
}

impl FromIterator<Field> for FieldSet {
    fn from_iter<I: IntoIterator<Item = Field>>(it: I) -> FieldSet {
        it.into_iter().fold(FieldSet::EMPTY, FieldSet::with)
    }
}

impl InputFile {
    /// Its JSON Schema: the path as [`workspace_path`] accepts it, and `content` or
    /// `content_base64` (canonical base64, as the decoder takes it), exactly one of them (the
    /// other absent or null).
    pub fn schema_value() -> Value {
        // A real component: not "", "." or "..", no '/' or NUL, at most 255 characters.
        const R: &str =
            r"([^/\x00.][^/\x00]{0,254}|\.[^/\x00.][^/\x00]{0,253}|\.\.[^/\x00]{1,253})";
        // "." components before the first real one, then any of "", "." or real ones: relative,
        // never "..", at least one real component.
        let path = format!(r"^(\.(/\.?)*/)?{R}(/(\.?|{R}))*$");
        const BASE64: &str = r"^[\t\n\x0b\x0c\r ]*([A-Za-z0-9+/]{4})*([A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?[\t\n\x0b\x0c\r ]*$";
        json!({
            "type": "object",
            "description": "A file for /workspace: `path` is relative to it; the content is given \
                either as UTF-8 text (`content`) or as base64 (`content_base64`), exactly one of \
                the two.",
            "properties": {
                "path": {
                    "type": "string",
                    "description": "Path relative to /workspace, e.g. data.csv or input/a.txt: at \
                        most 1024 bytes, each name at most 255 bytes (UTF-8), no `..`.",
                    "minLength": 1,
                    "maxLength": runcell_jail::MAX_PATH_BYTES,
                    "pattern": path,
                },
                "content": {"type": ["string", "null"], "description": "The file's content as UTF-8 text."},
                "content_base64": {
                    "type": ["string", "null"],
                    "pattern": BASE64,
                    "description": "The file's content, base64-encoded (standard alphabet, padded).",
                },
            },
            "required": ["path"],
            "additionalProperties": false,
            "oneOf": [
                {"required": ["content"], "properties": {"content": {"type": "string"}, "content_base64": {"type": "null"}}},
                {"required": ["content_base64"], "properties": {"content_base64": {"type": "string"}, "content": {"type": "null"}}},
            ],
        })
    }
}

impl schemars::JsonSchema for InputFile {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "InputFile".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::Schema::try_from(InputFile::schema_value()).unwrap_or_default()
    }
}

impl utoipa::PartialSchema for InputFile {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        crate::schema::openapi(InputFile::schema_value())
    }
}

impl utoipa::ToSchema for InputFile {}

impl NetworkRequest {
    /// Its JSON Schema, inline (the request's schema is written by hand).
    pub fn schema_value() -> Value {
        json!({
            "type": ["object", "null"],
            "description": "Network by permission: the destinations this run may reach through \
                runcell's egress proxy, within the operator's policy. Without it the run has no \
                network at all.",
            "properties": {"allow": {
                "type": "array",
                "items": {"type": "string", "examples": ["api.github.com:443", "*.pypi.org:443", "127.0.0.2:8080"]},
                "description": "HOST[:PORT] entries: a name, *.domain (its subdomains) or a \
                    literal address; without a port, every port."
            }},
            "required": ["allow"],
            "additionalProperties": false,
        })
    }
}

/// What a run asks of the network.
#[derive(
    Debug,
    Clone,
    Default,
    PartialEq,
    Eq,
    Serialize,
    Deserialize,
    schemars::JsonSchema,
    utoipa::ToSchema,
)]
#[serde(deny_unknown_fields)]
pub struct NetworkRequest {
    /// Destinations as `HOST[:PORT]`: a name (`api.github.com`), a wildcard over a domain's
    /// subdomains (`*.pypi.org:443`) or a literal address (`127.0.0.2:8080`). Without a port,
    /// every port. Each must be within the operator's policy.
    pub allow: Vec<String>,
}

/// A file for /workspace: `path` is relative to it; the content is given either as UTF-8 text
/// (`content`) or as base64 (`content_base64`), exactly one of the two.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InputFile {
    /// Path relative to /workspace, e.g. data.csv or input/a.txt.
    pub path: String,
    /// The file's content as UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The file's content, base64-encoded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_base64: Option<String>,
}

impl<'de> Deserialize<'de> for ExecRequest {
    /// Every field accepted (the intake narrows it for each door: [`RequestSeed`]).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        RequestSeed::any().deserialize(d)
    }
}

/// Why a key the request may not carry is refused: as unknown (the door does not know the
/// field at all), or with a reason (the door knows it, the target cannot take it).
pub type Refusal = dyn Fn(Field) -> Option<String> + Sync;

/// Deserializes an [`ExecRequest`] whose keys must be among `allowed`: any other key stops
/// the parser before its value is read. A key that names a field outside `allowed` is
/// refused with `refusal`'s message for it, or as an unknown field.
pub struct RequestSeed<'a> {
    pub allowed: FieldSet,
    pub refusal: &'a Refusal,
}

impl RequestSeed<'static> {
    /// Every field.
    pub fn any() -> RequestSeed<'static> {
        RequestSeed {
            allowed: FieldSet::all(),
            refusal: &|_| None,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for RequestSeed<'_> {
    type Value = ExecRequest;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<ExecRequest, D::Error> {
        d.deserialize_map(RequestVisitor(self))
    }
}

struct RequestVisitor<'a>(RequestSeed<'a>);

impl<'de> serde::de::Visitor<'de> for RequestVisitor<'_> {
    type Value = ExecRequest;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a request object")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<ExecRequest, A::Error> {
        use serde::de::Error;
        let RequestSeed { allowed, refusal } = self.0;
        let (mut language, mut code, mut stdin, mut files) = (None, None, None, None);
        let (mut network, mut packages, mut ttl, mut env) = (None, None, None, None);
        let mut limits = crate::limits::LimitsBuilder::default();
        while let Some(key) = map.next_key::<String>()? {
            let field = Field::from_name(&key).filter(|f| allowed.contains(*f));
            let Some(field) = field else {
                if let Some(why) = Field::from_name(&key).and_then(refusal) {
                    return Err(A::Error::custom(why));
                }
                return Err(A::Error::unknown_field(&key, expected_keys(allowed)));
            };
            match field {
                // As their schemas say: the language, the code and the files are never null.
                Field::Language => set(&mut language, "language", map.next_value::<String>()?)?,
                Field::Code => set(&mut code, "code", map.next_value::<String>()?)?,
                Field::Stdin => set(&mut stdin, "stdin", map.next_value::<Option<String>>()?)?,
                Field::Files => set(&mut files, "files", map.next_value::<Vec<InputFile>>()?)?,
                Field::Network => set(
                    &mut network,
                    "network",
                    map.next_value::<Option<NetworkRequest>>()?,
                )?,
                Field::Packages => set(
                    &mut packages,
                    "packages",
                    map.next_value::<Option<Vec<String>>>()?,
                )?,
                Field::Ttl => set(&mut ttl, "ttl", map.next_value::<Option<Ttl>>()?)?,
                Field::Env => set(
                    &mut env,
                    "env",
                    map.next_value::<Option<BTreeMap<String, String>>>()?,
                )?,
                Field::Limit(limit) => limits.next_value(limit, &mut map)?,
            }
        }
        Ok(ExecRequest {
            language,
            code,
            stdin: stdin.flatten(),
            files: files.unwrap_or_default(),
            limits: limits.finish(),
            network: network.flatten(),
            packages: packages.flatten().unwrap_or_default(),
            ttl: ttl.flatten().map(|t| t.0),
            env: env.flatten().unwrap_or_default(),
        })
    }
}

/// A session's idle time to live: a number of seconds.
struct Ttl(f64);

impl<'de> Deserialize<'de> for Ttl {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        // Read as a number: nothing else of the body is built (an array here would be, as a
        // value, before it was refused).
        f64::deserialize(d)
            .map(Ttl)
            .map_err(|e| D::Error::custom(format!("ttl must be a number of seconds ({e})")))
    }
}

/// The keys a request may have here, for the message of an unknown one.
fn expected_keys(allowed: FieldSet) -> &'static [&'static str] {
    // A handful of distinct sets exist (one per door and target); each is built once.
    static KEYS: std::sync::Mutex<Vec<(u64, &'static [&'static str])>> =
        std::sync::Mutex::new(Vec::new());
    let mut known = KEYS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, keys)) = known.iter().find(|(set, _)| *set == allowed.0) {
        return keys;
    }
    let keys: Vec<&'static str> = allowed.iter().map(Field::name).collect();
    let keys: &'static [&'static str] = Box::leak(keys.into_boxed_slice());
    known.push((allowed.0, keys));
    keys
}

/// A field given twice is an error, as serde's derive makes it.
fn set<T, E: serde::de::Error>(slot: &mut Option<T>, name: &'static str, v: T) -> Result<(), E> {
    if slot.is_some() {
        return Err(E::duplicate_field(name));
    }
    *slot = Some(v);
    Ok(())
}

impl InputFile {
    pub fn text(path: impl Into<String>, content: impl Into<String>) -> Self {
        InputFile {
            path: path.into(),
            content: Some(content.into()),
            content_base64: None,
        }
    }

    pub fn bytes(path: impl Into<String>, content: &[u8]) -> Self {
        use base64::Engine as _;
        InputFile {
            path: path.into(),
            content: None,
            content_base64: Some(base64::engine::general_purpose::STANDARD.encode(content)),
        }
    }
}

/// Why a path cannot be a file in /workspace.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("a file path is empty")]
    Empty,
    #[error("the file path '{0}…' is too long")]
    TooLong(String),
    #[error("the file path '{0}' is absolute; give a path relative to /workspace")]
    Absolute(String),
    #[error("the file path '{0}' leaves /workspace ('..')")]
    Escapes(String),
    #[error("a file path contains a NUL byte")]
    Nul,
    #[error("a component of '{0}' is too long")]
    ComponentTooLong(String),
    #[error("the file path '{0}' names no file")]
    NoFile(String),
}

/// At most `max` bytes of `s`, never cutting a character in two.
pub(crate) fn prefix(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// Check a relative path for /workspace: plain components only, no `..`, not absolute, no
/// empty or `.` components, no NUL, bounded length. Returns the components joined by '/'.
pub fn workspace_path(path: &str) -> Result<String, PathError> {
    if path.is_empty() {
        return Err(PathError::Empty);
    }
    if path.len() > runcell_jail::MAX_PATH_BYTES {
        return Err(PathError::TooLong(prefix(path, 40).to_string()));
    }
    if path.starts_with('/') {
        return Err(PathError::Absolute(path.into()));
    }
    let mut parts = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => continue,
            ".." => return Err(PathError::Escapes(path.into())),
            p if p.contains('\0') => return Err(PathError::Nul),
            p if p.len() > 255 => return Err(PathError::ComponentTooLong(path.into())),
            p => parts.push(p),
        }
    }
    if parts.is_empty() {
        return Err(PathError::NoFile(path.into()));
    }
    Ok(parts.join("/"))
}

/// What parsing a JSON body costs in memory beyond its bytes, as far as its shape shows it:
/// each value, member and element a parser builds is a node of tens of bytes however short
/// its text (`[0,0,...]` is two bytes a node), so a body is charged [`JSON_NODE_BYTES`] per
/// node before it is parsed. Counts the separators and openings outside strings; a body that
/// is not JSON is charged for what it would be.
pub fn json_parse_bytes(body: &[u8]) -> u64 {
    let (mut nodes, mut in_string, mut escaped) = (0u64, false, false);
    for &b in body {
        if in_string {
            match b {
                _ if escaped => escaped = false,
                b'\\' => escaped = true,
                b'"' => in_string = false,
                _ => {}
            }
        } else {
            match b {
                b'"' => in_string = true,
                b'[' | b'{' | b',' | b':' => nodes += 1,
                _ => {}
            }
        }
    }
    nodes.saturating_mul(JSON_NODE_BYTES)
}

/// What one parsed JSON node (a value in a vector, a member in a map with its key) costs at
/// most, with its allocation and a growing vector's spare room.
pub const JSON_NODE_BYTES: u64 = 96;

impl ExecRequest {
    pub fn new(language: impl Into<String>, code: impl Into<String>) -> Self {
        ExecRequest {
            language: Some(language.into()),
            code: Some(code.into()),
            stdin: None,
            limits: LimitOverrides::default(),
            files: Vec::new(),
            network: None,
            packages: Vec::new(),
            ttl: None,
            env: BTreeMap::new(),
        }
    }

    /// The language as sent ("" when none was).
    pub fn language(&self) -> &str {
        self.language.as_deref().unwrap_or_default()
    }

    /// The code as sent ("" when none was).
    pub fn code(&self) -> &str {
        self.code.as_deref().unwrap_or_default()
    }

    /// The JSON Schema of a one-shot run's request through the HTTP API, the limits'
    /// properties included (see [`crate::intake::request_schema`] for every door's).
    pub fn schema() -> Value {
        use crate::intake::{request_schema, SchemaContext, Source, TargetKind};
        request_schema(&SchemaContext::new(Source::Api, TargetKind::OneShot))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bodys_parse_is_charged_by_its_shape() {
        let n = JSON_NODE_BYTES;
        assert_eq!(json_parse_bytes(br#"{"code": "print(1)"}"#), 2 * n);
        // Separators inside strings (escaped quotes too) are text.
        assert_eq!(json_parse_bytes(br#"{"code": "a, [b]: {\"c,\"}"}"#), 2 * n);
        // Two bytes a node: charged far beyond its length.
        let zeros = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(json_parse_bytes(zeros.as_bytes()), 1001 * n);
        assert!(json_parse_bytes(zeros.as_bytes()) > 40 * zeros.len() as u64);
    }
    use crate::limits::{Bytes, Count, MilliCpus, Millis};

    fn parse(json: &str) -> Result<ExecRequest, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn workspace_paths_cannot_escape() {
        assert_eq!(workspace_path("data.csv").unwrap(), "data.csv");
        assert_eq!(workspace_path("./in//sub/x.txt").unwrap(), "in/sub/x.txt");
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/..",
            ".",
            "./",
            "a\0b",
        ] {
            assert!(workspace_path(bad).is_err(), "{bad:?} must be rejected");
        }
        assert!(workspace_path(&"x".repeat(300)).is_err());
        // Cut inside a character: no panic.
        let long = format!("a{}", "\u{e9}".repeat(600));
        assert!(matches!(workspace_path(&long), Err(PathError::TooLong(_))));
    }

    #[test]
    fn the_input_file_schema_says_what_the_server_accepts() {
        use base64::Engine as _;
        let schema = InputFile::schema_value();
        let pattern = |p: &str| {
            regex::Regex::new(schema["properties"][p]["pattern"].as_str().unwrap()).unwrap()
        };
        let path = pattern("path");
        for p in [
            "a",
            "data.csv",
            "a/b.txt",
            "./a",
            "././a/b",
            "a/",
            "a//b",
            "a/./b",
            "...",
            ".x",
            "..x",
            "x..",
            "dir/.hidden",
            "",
            ".",
            "./",
            "/a",
            "..",
            "a/../b",
            "a/..",
            "../a",
            "a\0b",
            "n\u{d7}\u{10}/",
            ".//a",
            "a/.",
        ] {
            assert_eq!(path.is_match(p), workspace_path(p).is_ok(), "path {p:?}");
        }
        let b64 = pattern("content_base64");
        for v in [
            "",
            "AAE=",
            "QQ==",
            "QUJD",
            " QUJD\n",
            "QR==",
            "QUJ",
            "QUJE=",
            "Q===",
            "====",
            "QU=D",
            "Zm9vYg==",
            "Zm9vYmE=",
            "\u{1c}QUJD",
        ] {
            let ok = base64::engine::general_purpose::STANDARD
                .decode(v.trim())
                .is_ok();
            assert_eq!(b64.is_match(v), ok, "base64 {v:?}");
        }
    }

    #[test]
    fn input_files_take_text_or_base64() {
        let r = parse(
            r#"{"language":"python","code":"","files":[{"path":"a.txt","content":"hi"},{"path":"b.bin","content_base64":"AAE="}]}"#,
        )
        .unwrap();
        assert_eq!(r.files[0], InputFile::text("a.txt", "hi"));
        assert_eq!(r.files[1], InputFile::bytes("b.bin", &[0, 1]));
    }

    #[test]
    fn whole_numbers_written_as_floats_are_whole_numbers() {
        let r =
            parse(r#"{"language":"bash","code":"","pids":30.0,"memory":1e8,"output_files":0.0}"#)
                .unwrap();
        assert_eq!(r.limits.pids, Some(Count(30)));
        assert_eq!(r.limits.memory, Some(Bytes(100_000_000)));
        assert_eq!(r.limits.output_files, Some(Count(0)));
        for bad in [
            r#""pids":2.5"#,
            r#""memory":1.5"#,
            r#""pids":-1.0"#,
            r#""disk":1e300"#,
        ] {
            let e = parse(&format!(r#"{{"language":"bash","code":"",{bad}}}"#)).unwrap_err();
            assert!(e.contains("whole number"), "{bad}: {e}");
        }
    }

    #[test]
    fn limits_are_flattened_into_the_request() {
        let r = parse(
            r#"{"language":"python","code":"print(1)","timeout":2.5,"memory":"128M","disk":1048576,
               "output":"1K","cpus":0.5,"pids":8,"open_files":64,"compile_timeout":"90s",
               "stdin":"x","files":[{"path":"a.txt","content":"hi"}]}"#,
        )
        .unwrap();
        let l = r.limits;
        assert_eq!(l.timeout, Some(Millis(2500)));
        assert_eq!(l.compile_timeout, Some(Millis(90_000)));
        assert_eq!(l.memory, Some(Bytes(128 << 20)));
        assert_eq!(l.disk, Some(Bytes(1 << 20)));
        assert_eq!(l.output, Some(Bytes(1024)));
        assert_eq!(l.cpus, Some(MilliCpus(500)));
        assert_eq!(l.pids, Some(Count(8)));
        assert_eq!(l.open_files, Some(Count(64)));
        assert_eq!(r.stdin.as_deref(), Some("x"));
        // And back: the same names.
        let back = serde_json::to_value(&r).unwrap();
        assert_eq!(back["timeout"], json!(2.5));
        assert_eq!(back["memory"], json!(128 << 20));
        assert_eq!(parse(&back.to_string()).unwrap(), r);
        let r = parse(r#"{"language":"bash","code":"true","timeout":null}"#).unwrap();
        assert_eq!(r.limits, LimitOverrides::default());
    }

    #[test]
    fn bad_requests_are_refused() {
        for body in [
            r#"{"language":"python","code":"","timeot":5}"#,
            r#"{"language":"python","code":"","timeout_ms":5}"#,
            r#"{"language":"python","code":"","limits":{"timeout":5}}"#,
            r#"{"language":"python","code":"","timeout":-1}"#,
            r#"{"language":"python","code":"","timeout":"soon"}"#,
            r#"{"language":"python","code":"","memory":1.5}"#,
            r#"{"language":"python","code":"","cpus":"2"}"#,
            r#"{"language":1,"code":""}"#,
            r#"{"language":"python","code":"","files":[{"path":"a","contents":"x"}]}"#,
        ] {
            assert!(parse(body).is_err(), "{body} must be refused");
        }
        let e = parse(r#"{"language":"python","code":"","timeot":5}"#).unwrap_err();
        assert!(e.contains("unknown field `timeot`"), "{e}");
    }

    #[test]
    fn the_schema_lists_every_field() {
        let s = ExecRequest::schema();
        for name in [
            "language", "code", "stdin", "files", "timeout", "memory", "cpus",
        ] {
            assert!(s["properties"][name].is_object(), "{name}");
        }
        assert_eq!(s["additionalProperties"], json!(false));
    }
}

/// Property tests: a path or a request body from a client is arbitrary text; none of it may
/// panic the parser, and what is accepted is what the rest of runcell relies on.
#[cfg(test)]
mod proptests {
    use super::*;
    use crate::limits::{Limit, LimitPolicy, Limits};
    use proptest::prelude::*;

    /// Paths built from the pieces that matter ('/', '.', '..', NUL, multi-byte characters),
    /// and arbitrary strings, and long ones around the length bound.
    fn path_text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("/".to_string()),
            Just(".".to_string()),
            Just("..".to_string()),
            Just("\0".to_string()),
            Just("é".to_string()),
            Just("\u{1f600}".to_string()),
            "[a-z.]{1,8}",
            any::<String>(),
        ];
        prop_oneof![
            4 => prop::collection::vec(piece, 0..12).prop_map(|v| v.concat()),
            1 => any::<String>(),
            1 => ("[a-zé/.]{0,3}", 250usize..1100, prop::sample::select(vec!["a", "é", "\u{1f600}", "/", "a/"]))
                .prop_map(|(head, n, c)| format!("{head}{}", c.repeat(n / c.len()))),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The cut that keeps error messages short never splits a character.
        #[test]
        fn a_cut_message_is_a_whole_character_prefix(s in any::<String>(), max in 0usize..64) {
            let p = prefix(&s, max);
            prop_assert!(s.starts_with(p));
            prop_assert!(p.len() <= max);
            prop_assert!(p.len() == s.len() || p.len() + 4 > max, "{} of {}", p.len(), max);
        }

        #[test]
        fn an_accepted_workspace_path_is_plain_and_normal(path in path_text()) {
            match workspace_path(&path) {
                Ok(p) => {
                    prop_assert!(!p.starts_with('/'), "{p:?}");
                    prop_assert!(!p.contains('\0'), "{p:?}");
                    prop_assert!(!p.is_empty());
                    prop_assert!(p.len() <= runcell_jail::MAX_PATH_BYTES, "{}", p.len());
                    for c in p.split('/') {
                        prop_assert!(!matches!(c, "" | "." | ".."), "{path:?} -> {p:?}");
                        prop_assert!(c.len() <= 255);
                    }
                    prop_assert_eq!(workspace_path(&p), Ok(p.clone()));
                }
                // Every message, the ones that cut the path included, can be written.
                Err(e) => {
                    let _ = e.to_string();
                }
            }
        }
    }

    /// The keys a request body may have, and near misses.
    fn key() -> impl Strategy<Value = String> {
        let mut names: Vec<String> = Field::all().map(|f| f.name().to_string()).collect();
        names.extend(Limit::ALL.iter().map(|l| l.legacy_name().to_string()));
        names.extend(
            [
                "path",
                "content",
                "content_base64",
                "timeot",
                "limits",
                "",
                "Language",
            ]
            .map(String::from),
        );
        prop_oneof![
            6 => prop::sample::select(names),
            1 => any::<String>(),
        ]
    }

    fn leaf() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (0u64..100_000).prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            any::<f64>().prop_map(Value::from), // NaN and infinities become null
            (0.0f64..5000.0).prop_map(Value::from),
            "[0-9.]{1,6}(|ms|s|m|h|K|M|G|T|x)".prop_map(Value::from),
            any::<String>().prop_map(Value::from),
            "[A-Za-z0-9+/]{0,12}={0,2}".prop_map(Value::from),
        ]
    }

    fn json_value() -> impl Strategy<Value = Value> {
        leaf().prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((key(), inner), 0..6)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    /// A value for a limit: mostly of a shape some kind of limit takes, sometimes anything.
    fn limit_value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::Null),
            (0u64..100_000).prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            (0.0f64..5000.0).prop_map(Value::from),
            (0.0f64..1e20).prop_map(Value::from),
            "[0-9]{1,5}(\\.[0-9]{1,3})?[ ]?(|ms|s|min|m|h|K|M|G|T|MiB|bytes)".prop_map(Value::from),
            leaf(),
        ]
    }

    /// Limit entries: real names with plausible values, and now and then anything.
    fn limit_entries() -> impl Strategy<Value = Vec<(String, Value)>> {
        let names: Vec<String> = Limit::ALL.iter().map(|l| l.name().to_string()).collect();
        prop::collection::vec(
            prop_oneof![
                6 => (prop::sample::select(names), limit_value()),
                1 => (key(), json_value()),
            ],
            0..6,
        )
    }

    /// A body: often with language and code, so that many are accepted and reach the
    /// policy; then limits and files, and random keys from the real names and junk.
    fn body() -> impl Strategy<Value = Value> {
        let file = prop_oneof![
            4 => ("[a-z./é]{0,12}", any::<String>(), any::<bool>()).prop_map(|(path, content, b64)| {
                if b64 {
                    json!({"path": path, "content_base64": content})
                } else {
                    json!({"path": path, "content": content})
                }
            }),
            1 => prop::collection::vec((key(), json_value()), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ];
        (
            0u8..8,
            limit_entries(),
            prop::option::of(prop::collection::vec(file, 0..3).prop_map(Value::Array)),
            prop::option::of(prop_oneof![
                Just(Value::Null),
                any::<String>().prop_map(Value::from)
            ]),
        )
            .prop_map(|(base, extra, files, stdin)| {
                let mut m = serde_json::Map::new();
                // Mostly both required fields, sometimes one or none.
                if base != 0 {
                    m.insert("language".into(), json!("python"));
                }
                if base != 1 {
                    m.insert("code".into(), json!("print(1)"));
                }
                if let Some(f) = files {
                    m.insert("files".into(), f);
                }
                if let Some(s) = stdin {
                    m.insert("stdin".into(), s);
                }
                m.extend(extra);
                Value::Object(m)
            })
    }

    /// Check `resolve` against the definition: in range for every limit, or an error that
    /// names a limit that really is out of range.
    fn check_resolve(o: &LimitOverrides) -> Result<(), TestCaseError> {
        let policy = LimitPolicy::for_host(8 << 30, 2);
        let asked = o.apply_to(policy.defaults);
        match policy.resolve(o) {
            Ok(l) => {
                prop_assert_eq!(l, asked);
                for &limit in Limit::ALL {
                    let v = l.get(limit);
                    prop_assert!(
                        v >= Limits::MINIMUM.get(limit) && v <= policy.max.get(limit),
                        "{limit}: {v}"
                    );
                }
            }
            Err(e) => {
                let v = asked.get(e.limit);
                prop_assert_eq!(e.value, v);
                prop_assert!(
                    v < Limits::MINIMUM.get(e.limit) || v > policy.max.get(e.limit),
                    "{e}"
                );
                let _ = e.to_string();
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn any_body_is_parsed_or_refused_and_what_is_accepted_round_trips(body in body()) {
            let text = body.to_string();
            let from_value = serde_json::from_value::<ExecRequest>(body);
            let from_text = serde_json::from_str::<ExecRequest>(&text);
            prop_assert_eq!(from_value.is_ok(), from_text.is_ok(), "{}", text);
            if let Ok(r) = from_text {
                let back = serde_json::to_string(&r).unwrap();
                let again: ExecRequest = serde_json::from_str(&back)
                    .map_err(|e| TestCaseError::fail(format!("{back}: {e}")))?;
                prop_assert_eq!(&again, &r, "{}", back);
                check_resolve(&r.limits)?;
            }
        }

        /// JSON text can say a key twice, which a `Value` cannot: the first value must not be
        /// silently replaced, so such a body is refused or means one thing.
        #[test]
        fn a_body_with_repeated_keys_is_refused_or_round_trips(
            entries in limit_entries(),
            repeat in prop::collection::vec(prop::sample::select(vec!["language", "code", "stdin", "files", "timeout", "memory", "cpus"]), 0..3),
        ) {
            let mut parts = vec![r#""language":"python""#.to_string(), r#""code":"""#.to_string()];
            parts.extend(entries.iter().map(|(k, v)| format!("{}:{v}", Value::from(k.as_str()))));
            parts.extend(repeat.iter().map(|k| format!("\"{k}\":null")));
            let text = format!("{{{}}}", parts.join(","));
            if let Ok(r) = serde_json::from_str::<ExecRequest>(&text) {
                let mut keys: Vec<&str> = entries.iter().map(|(k, _)| k.as_str()).chain(repeat.iter().copied()).collect();
                keys.extend(["language", "code"]);
                let n = keys.len();
                keys.sort_unstable();
                keys.dedup();
                prop_assert_eq!(keys.len(), n, "a repeated key was accepted: {}", text);
                let back = serde_json::to_string(&r).unwrap();
                prop_assert_eq!(serde_json::from_str::<ExecRequest>(&back).ok(), Some(r));
            }
        }

        #[test]
        fn any_limits_object_is_parsed_or_refused(v in prop_oneof![
            3 => limit_entries().prop_map(|kv| Value::Object(kv.into_iter().collect())),
            1 => json_value(),
        ]) {
            if let Ok(o) = serde_json::from_value::<LimitOverrides>(v) {
                let back = serde_json::to_value(o).unwrap();
                let again: LimitOverrides = serde_json::from_value(back.clone())
                    .map_err(|e| TestCaseError::fail(format!("{back}: {e}")))?;
                prop_assert_eq!(again, o, "{}", back);
                check_resolve(&o)?;
            }
        }

        #[test]
        fn every_accepted_limit_value_reads_back_equal(
            limit in prop::sample::select(Limit::ALL.to_vec()),
            v in prop_oneof![
                any::<f64>().prop_map(Value::from),
                (0.0f64..1e17).prop_map(Value::from),
                any::<u64>().prop_map(Value::from),
            ],
        ) {
            let body = json!({ limit.name(): v });
            if let Ok(o) = serde_json::from_value::<LimitOverrides>(body.clone()) {
                let back = serde_json::to_value(o).unwrap();
                let again: LimitOverrides = serde_json::from_value(back.clone())
                    .map_err(|e| TestCaseError::fail(format!("{back}: {e}")))?;
                prop_assert_eq!(again, o, "{} -> {}", body, back);
            }
        }

        #[test]
        fn any_text_for_any_limit_is_parsed_or_refused(
            limit in prop::sample::select(Limit::ALL.to_vec()),
            text in prop_oneof![
                1 => any::<String>(),
                1 => "[ ]?-?[0-9.e]{0,25}(|ms|s|m|h|K|M|G|T|bytes)[ ]?",
                4 => "[0-9]{1,6}(\\.[0-9]{1,3})?(|ms|s|m|h|K|M|G|T|bytes)",
            ],
        ) {
            let mut o = LimitOverrides::default();
            if o.set_text(limit, &text).is_ok() {
                prop_assert!(o.get(limit).is_some());
                check_resolve(&o)?;
            }
        }
    }
}
