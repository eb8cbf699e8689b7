//! The one intake: which fields of the one request ([`ExecRequest`]) each door may send, which
//! each target needs, and the schemas every door publishes, all from two tables.
//!
//! * The **capability table** ([`Source::may_set`]): who is asking. The HTTP API and the
//!   operator's command line may set every field; an MCP client (a model behind a client)
//!   sends the code, its files, a timeout, and network and packages where the operator allows
//!   some; a model in runcell's own agent loop sends only the code, its files and a timeout.
//!   A model never sizes its own sandbox.
//! * The **target table** ([`TargetKind::rule`]): where the request goes. A one-shot run needs
//!   a language and code; a session is created without code; a call in a session takes its
//!   language and its sandbox's limits from the session (it may set the limits that apply to
//!   each program: its clocks and output caps); a session's network and packages are asked
//!   for when it is created, and are its own.
//!
//! A door parses a body with [`parse`] (a key the door may not send stops the parser before
//! its value is read), the run service checks the request against its target with
//! [`check`] and, for a session, merges it with the session's settings ([`merge_call`]): what
//! cannot be honoured is refused, never dropped. The OpenAPI document, the MCP tools, the
//! agent's tools and `runcell tools` all take their input schemas from [`request_schema`].
//!
//! Adding a field to the request is one variant of [`Field`], its row in these tables and its
//! schema here, and the engine's use of it.

use std::time::Duration;

use serde::de::DeserializeSeed;
use serde_json::{json, Map, Value};

use crate::engine::EngineConfig;
use crate::error::RunError;
use crate::limits::{Limit, LimitOverrides, Scope};
use crate::request::{ExecRequest, Field, FieldSet, InputFile, NetworkRequest, RequestSeed};
use crate::units::format_size;
use runcell_runtimes::Language;

/// Who is asking: the door's kind, whose row of the capability table applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Source {
    /// The HTTP API (`/v1/execute`, `/v1/sessions`), a client program with an API key.
    Api,
    /// An MCP client's tool call (stdio or Streamable HTTP): a model writes the arguments.
    Mcp,
    /// A tool call of a model in runcell's own agent loop (`/v1/agents`, `runcell agent`).
    Model,
    /// The operator at the command line (`runcell run`, `runcell repl`).
    Operator,
}

impl Source {
    /// The fields this source may ever send.
    pub fn fields(self) -> FieldSet {
        Field::all().filter(|&f| self.may_set(f)).collect()
    }

    /// The capability table.
    pub fn may_set(self, field: Field) -> bool {
        match self {
            Source::Api | Source::Operator => true,
            // A model writes code, gives it files and asks for time; the operator's
            // defaults size its sandbox. Network and packages are offered to MCP clients
            // where the operator allows some (see `Offers`); a model in the agent loop gets
            // neither (nobody reads its requests before they run).
            Source::Mcp => matches!(
                field,
                Field::Code
                    | Field::Files
                    | Field::Network
                    | Field::Packages
                    | Field::Limit(Limit::Timeout)
            ),
            Source::Model => matches!(
                field,
                Field::Code | Field::Files | Field::Limit(Limit::Timeout)
            ),
        }
    }

    /// Whether the fields the operator's policy does not offer (network, packages) are left
    /// out of this source's schema and keys, rather than refused by value: a model is shown
    /// only what it can use; the HTTP API keeps one shape whatever the policy.
    fn gated_by_policy(self) -> bool {
        matches!(self, Source::Mcp | Source::Model)
    }
}

/// Where a request goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A fresh sandbox, thrown away after the run.
    OneShot,
    /// Create a session (no code runs).
    CreateSession,
    /// Create a session and run the request as its first call (an MCP call with
    /// `session_id: "new"`, the agent loop's first run of a language).
    NewSession,
    /// A call in the caller's session with this id.
    Session(String),
}

impl Target {
    pub fn kind(&self) -> TargetKind {
        match self {
            Target::OneShot => TargetKind::OneShot,
            Target::CreateSession => TargetKind::CreateSession,
            Target::NewSession => TargetKind::NewSession,
            Target::Session(_) => TargetKind::Session,
        }
    }

    /// `"new"` or a session id (MCP's `session_id`).
    pub fn session(text: &str) -> Target {
        if text == "new" {
            Target::NewSession
        } else {
            Target::Session(text.to_string())
        }
    }
}

/// A [`Target`] without its session id: what the target table is indexed by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TargetKind {
    OneShot,
    CreateSession,
    NewSession,
    Session,
}

/// What a target makes of a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rule {
    /// It must be there.
    Required,
    /// It may be there.
    Optional,
    /// It may be there empty (or null), or with the session's own value, set when it was
    /// created (a call cannot change it; [`merge_call`] compares): the key is kept so that
    /// one body shape serves every target.
    SessionOwn,
    /// The key is refused, with a reason.
    Refused,
}

impl TargetKind {
    /// The target table.
    pub fn rule(self, field: Field) -> Rule {
        use Rule::*;
        match (self, field) {
            // A call runs in its session's language (a door that knows the language, an MCP
            // tool's, sets it, and it must match; a caller does not send it).
            (TargetKind::Session, Field::Language) => Refused,
            (_, Field::Language) => Required,
            (TargetKind::CreateSession, Field::Code | Field::Stdin) => Refused,
            (_, Field::Code) => Required,
            // A session's proxy and package layer are set up when it is created, and serve
            // every call.
            (TargetKind::Session, Field::Network | Field::Packages) => SessionOwn,
            (TargetKind::CreateSession, Field::Ttl) => Optional,
            (_, Field::Ttl) => Refused,
            // What a session's sandbox was built with is its own; each call may set what
            // applies to one program.
            (TargetKind::Session, Field::Limit(l)) if l.scope() == Scope::Sandbox => Refused,
            _ => Optional,
        }
    }

    /// The fields the target takes at all.
    pub fn fields(self) -> FieldSet {
        Field::all()
            .filter(|&f| self.rule(f) != Rule::Refused)
            .collect()
    }

    fn required(self) -> FieldSet {
        Field::all()
            .filter(|&f| self.rule(f) == Rule::Required)
            .collect()
    }

    /// Why the target refuses `field`, in words a caller can act on.
    fn refusal(self, field: Field) -> String {
        match (self, field) {
            (TargetKind::CreateSession, Field::Code | Field::Stdin) => format!(
                "a session is created without {field}: send it to /v1/sessions/{{id}}/execute"
            ),
            (_, Field::Ttl) => "ttl is set when a session is created".to_string(),
            (TargetKind::Session, Field::Language) => {
                "a call runs in its session's language: leave out \"language\"".to_string()
            }
            (_, f @ (Field::Network | Field::Packages)) => session_own(f),
            (TargetKind::Session, Field::Limit(l)) => format!(
                "{l} is the session's own, set when it was created (its sandbox is built with \
                 it); a call may set only {}. Create a new session for other limits",
                program_limits()
            ),
            (_, f) => format!("{f} cannot be given here"),
        }
    }
}

/// The limits a call in a session may set.
fn program_limits() -> String {
    Limit::ALL
        .iter()
        .filter(|l| l.scope() == Scope::Program)
        .map(|l| l.name())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Why a call cannot change its session's network or packages.
fn session_own(field: Field) -> String {
    format!(
        "{field} is the session's own, set when it was created (its proxy and package layer \
         serve every call): leave out \"{field}\" (or repeat the session's value), or create \
         a new session with the {field} this code needs"
    )
}

/// What the operator's policy offers beyond the basics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Offers {
    /// Some destinations may be asked for.
    pub network: bool,
    /// Some packages may be asked for.
    pub packages: bool,
}

impl Offers {
    pub fn of(config: &EngineConfig) -> Offers {
        Offers {
            network: !config.network.allow.is_empty(),
            packages: config.packages.enabled(),
        }
    }

    fn fields(self) -> FieldSet {
        let mut all = FieldSet::all();
        if !self.network {
            all = all.without(Field::Network);
        }
        if !self.packages {
            all = all.without(Field::Packages);
        }
        all
    }
}

/// The keys a request from `source` to `target` may carry.
pub fn allowed(source: Source, target: TargetKind, offers: Offers) -> FieldSet {
    let mut set = source.fields().and(target.fields());
    if source.gated_by_policy() {
        set = set.and(offers.fields());
    }
    set
}

/// Parse a request body (or a tool call's arguments) from `source` for `target`. A key the
/// source may never send is an unknown field (as far as that door is concerned it does not
/// exist); a key the target cannot take is refused with the reason.
pub fn parse<'de, D: serde::Deserializer<'de>>(
    d: D,
    source: Source,
    target: TargetKind,
    offers: Offers,
) -> Result<ExecRequest, D::Error> {
    let may = allowed(source, target, offers);
    let visible = if source.gated_by_policy() {
        source.fields().and(offers.fields())
    } else {
        source.fields()
    };
    let refusal = move |f: Field| visible.contains(f).then(|| target.refusal(f));
    RequestSeed {
        allowed: may,
        refusal: &refusal,
    }
    .deserialize(d)
}

/// [`parse`] of JSON text, with the HTTP API's messages: an invalid request names what is
/// wrong (a field, a type, a value), malformed JSON says so.
pub fn parse_json(
    bytes: &[u8],
    source: Source,
    target: TargetKind,
    offers: Offers,
) -> Result<ExecRequest, RunError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    parse(&mut de, source, target, offers)
        .and_then(|r| de.end().map(|()| r))
        .map_err(json_error)
}

/// [`parse`] of a JSON value (tool call arguments).
pub fn parse_value(
    value: Value,
    source: Source,
    target: TargetKind,
    offers: Offers,
) -> Result<ExecRequest, RunError> {
    parse(value, source, target, offers).map_err(json_error)
}

/// A serde error as the intake's refusal.
pub fn json_error(e: serde_json::Error) -> RunError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Data => RunError::invalid(format!("Invalid request: {e}.")),
        _ => RunError::invalid(format!("The request body is not valid JSON: {e}.")),
    }
}

/// Check a parsed request against its target: the required fields are there, and what the
/// target takes only empty is empty.
pub fn check(req: &ExecRequest, target: TargetKind) -> Result<(), RunError> {
    for field in target.required().iter() {
        let present = match field {
            Field::Language => req.language.is_some(),
            Field::Code => req.code.is_some(),
            _ => true,
        };
        if !present {
            return Err(RunError::invalid(format!(
                "Invalid request: missing field `{field}`."
            )));
        }
    }
    // (What a call in a session may repeat of its session is for [`merge_call`] to compare.)
    Ok(())
}

/// What a session keeps of the request that created it: each call is merged with it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSettings {
    pub language: Language,
    /// The limits the creation asked for (each call's program limits replace theirs).
    pub overrides: LimitOverrides,
    /// The destinations its proxy lets through, normalised and sorted (empty: no network).
    pub network: Vec<String>,
    /// The requirements its package layer holds, normalised (empty: none).
    pub packages: Vec<String>,
}

/// Longest list a call's `network` or `packages` is compared with its session's (a session's
/// own are within the policy's caps, far below this).
const MAX_COMPARED: usize = 1024;

/// A call's `network` entries as a session keeps them: normalised, sorted, each once.
pub fn session_network(allow: &[String]) -> Result<Vec<String>, RunError> {
    if allow.len() > MAX_COMPARED {
        return Err(RunError::invalid(format!(
            "Invalid request: {} network entries is more than a session may have.",
            allow.len()
        )));
    }
    let rules = runcell_proxy::parse_rules(allow)
        .map_err(|e| RunError::invalid(format!("Invalid network request: {e}.")))?;
    Ok(network_entries(&rules))
}

/// Checked entries as a session keeps them: written out, sorted, each once.
pub fn network_entries(rules: &[runcell_proxy::NetRule]) -> Vec<String> {
    let mut v: Vec<String> = rules.iter().map(ToString::to_string).collect();
    v.sort();
    v.dedup();
    v
}

/// A call in a session as a whole request: the session's language and limits, with the
/// call's code, stdin, files and program limits. What the session cannot honour is refused.
pub fn merge_call(call: &ExecRequest, session: &SessionSettings) -> Result<ExecRequest, RunError> {
    let mut language = session.language;
    if let Some(asked) = &call.language {
        if Language::parse(asked) == Some(Language::Bash) {
            // A shell command runs in any session's sandbox, as its own program beside the
            // session's interpreter (a door that sets the language asks for it: E2B's
            // `commands.run`).
            language = Language::Bash;
        } else if Language::parse(asked) != Some(language) {
            return Err(RunError::invalid(format!(
                "This is a {0} session: run its code with the {0} tool (or language), or start \
                 a new session.",
                language.name()
            )));
        }
    }
    if language == Language::Node && call.stdin.is_some() {
        return Err(RunError::invalid(
            "stdin is not available in a node session (its interpreter cannot take a new \
             standard input per call): pass the data as a file in `files` and read it from \
             /workspace.",
        ));
    }
    // The session's network and packages: a call may leave them out, or repeat them (a door
    // that sends the same body for every call); another value is refused, never dropped.
    let asked_network = call.network.as_ref().map_or(&[][..], |n| &n.allow[..]);
    if !asked_network.is_empty() && session_network(asked_network)? != session.network {
        return Err(RunError::invalid(format!(
            "Invalid request: {} (it has {}).",
            session_own(Field::Network),
            if session.network.is_empty() {
                "no network".to_string()
            } else {
                session.network.join(", ")
            }
        )));
    }
    if !call.packages.is_empty() {
        if call.packages.len() > MAX_COMPARED {
            return Err(RunError::invalid(format!(
                "Invalid request: {}.",
                session_own(Field::Packages)
            )));
        }
        let asked = crate::packages::normalize(&call.packages)
            .map_err(|e| RunError::invalid(format!("Invalid packages: {e}.")))?;
        if asked != session.packages {
            return Err(RunError::invalid(format!(
                "Invalid request: {} (it has {}).",
                session_own(Field::Packages),
                if session.packages.is_empty() {
                    "none".to_string()
                } else {
                    session.packages.join(", ")
                }
            )));
        }
    }
    let mut limits = session.overrides;
    for &l in Limit::ALL {
        match (l.scope(), call.limits.get(l)) {
            (Scope::Program, Some(v)) => limits.set(l, Some(v)),
            (Scope::Sandbox, Some(_)) => {
                return Err(RunError::invalid(format!(
                    "Invalid request: {}.",
                    TargetKind::Session.refusal(Field::Limit(l))
                ))
                .with_limit(l))
            }
            _ => {}
        }
    }
    Ok(ExecRequest {
        language: Some(language.name().to_string()),
        limits,
        network: None,
        packages: Vec::new(),
        ttl: None,
        ..call.clone()
    })
}

/// What a request schema is written for: a door's source and target, and (when known) the
/// operator's policy, which bounds the values, and the tool's language.
#[derive(Debug, Clone, Copy)]
pub struct SchemaContext<'a> {
    pub source: Source,
    pub target: TargetKind,
    /// The policy whose bounds the schema states; `None`: the general shape, unbounded.
    pub policy: Option<&'a EngineConfig>,
    /// The longest idle time to live a session may ask for (with a policy).
    pub max_ttl: Option<Duration>,
    /// A tool's language (MCP, the agent loop): its code's description.
    pub language: Option<Language>,
}

impl<'a> SchemaContext<'a> {
    pub fn new(source: Source, target: TargetKind) -> SchemaContext<'a> {
        SchemaContext {
            source,
            target,
            policy: None,
            max_ttl: None,
            language: None,
        }
    }

    pub fn with_policy(mut self, policy: &'a EngineConfig, max_ttl: Duration) -> Self {
        self.policy = Some(policy);
        self.max_ttl = Some(max_ttl);
        self
    }

    pub fn for_language(mut self, language: Language) -> Self {
        self.language = Some(language);
        self
    }

    fn offers(&self) -> Offers {
        self.policy.map(Offers::of).unwrap_or(Offers {
            network: true,
            packages: true,
        })
    }

    /// A model reads this schema (MCP, the agent loop): plain numbers and short words.
    fn for_model(&self) -> bool {
        matches!(self.source, Source::Mcp | Source::Model)
    }
}

/// The JSON Schema of a request from `ctx.source` to `ctx.target`: its properties, required
/// fields and bounds, from the tables above and the policy. No `$ref`: every subschema is
/// inline (tool-calling APIs do not resolve references).
pub fn request_schema(ctx: &SchemaContext) -> Value {
    let fields = allowed(ctx.source, ctx.target, ctx.offers());
    let mut props = Map::new();
    for f in fields.iter() {
        props.insert(f.name().to_string(), field_schema(f, ctx));
    }
    let required: Vec<&str> = fields
        .and(ctx.target.required())
        .iter()
        .map(Field::name)
        .collect();
    let mut schema = json!({
        "type": "object",
        "properties": props,
        "required": required,
        "additionalProperties": false,
    });
    if let (Some(p), true, true) = (
        ctx.policy,
        fields.contains(Field::Limit(Limit::Pids)),
        fields.contains(Field::Limit(Limit::OpenFiles)),
    ) {
        let mut tiers = p.policy.file_table_tiers();
        if tiers.is_empty() {
            // No pids and open_files fit in the file table a run may hold: nothing is valid.
            tiers.push(json!({"not": {}}));
        }
        schema["anyOf"] = json!(tiers);
    }
    schema
}

/// One field's schema in a context.
fn field_schema(field: Field, ctx: &SchemaContext) -> Value {
    let policy = ctx.policy;
    match field {
        Field::Language => json!({
            "type": "string",
            "enum": ["python", "python3", "py", "node", "nodejs", "javascript", "js", "ruby",
                "rb", "go", "golang", "bash", "sh", "shell"],
            "description": "python, node (or javascript), ruby, go or bash.",
        }),
        Field::Code => json!({
            "type": "string",
            "description": match ctx.language {
                Some(Language::Python) => "The complete Python program. Print what you want to see.",
                Some(Language::Node) => "The complete JavaScript program (a CommonJS script run by node).",
                Some(Language::Ruby) => "The complete Ruby program.",
                Some(Language::Go) => "The complete Go program: package main with a func main().",
                Some(Language::Bash) => "The bash script.",
                None => "The program's source.",
            },
        }),
        Field::Stdin => json!({
            "type": ["string", "null"],
            "description": if ctx.target == TargetKind::Session {
                "Text fed to the call's standard input. Not in a node session (its interpreter \
                 cannot take a new standard input per call): pass such data as a file."
            } else {
                "Text fed to the program's standard input."
            },
        }),
        Field::Files => {
            let mut files = json!({
                "type": "array",
                "items": InputFile::schema_value(),
                "description": "Files placed in /workspace (the working directory) before the \
                    program starts. Give each either `content` (UTF-8 text) or \
                    `content_base64` (binary), not both.",
            });
            if let Some(p) = policy {
                let p = &p.policy;
                // At most `max_input_files`, each path once: said in words, not as
                // `maxItems`, since a fuzzer's longest array repeats one path (a duplicate is
                // refused). Identical entries are a duplicate in either reading.
                files["uniqueItems"] = json!(true);
                files["description"] = json!(format!(
                    "Files placed in /workspace (the working directory) before the program \
                     starts, at most {} files (each path once) of up to {} each. Give each \
                     either `content` (UTF-8 text) or `content_base64` (binary), not both.",
                    p.max_input_files,
                    format_size(p.max_input_file_bytes)
                ));
            }
            files
        }
        Field::Network => network_schema(ctx),
        Field::Packages => packages_schema(ctx),
        Field::Ttl => {
            let mut ttl = json!({
                "type": ["number", "null"],
                "exclusiveMinimum": 0,
                "description": "Seconds the session may stay idle before it ends (default 600).",
            });
            if let Some(max) = ctx.max_ttl {
                ttl["maximum"] = json!(max.as_secs_f64());
            }
            ttl
        }
        Field::Env => {
            let mut env = json!({
                "type": ["object", "null"],
                "description": format!(
                    "Environment variables for {}, beside the ones runcell sets for the \
                     runtime (PATH, HOME, LANG, ... cannot be changed; OMP_NUM_THREADS and \
                     OPENBLAS_NUM_THREADS may): at most {} names of letters, digits and \
                     underscores, {} in all.",
                    match ctx.target {
                        TargetKind::Session => {
                            "this call only (over the session's own; they are undone after \
                             the call)"
                        }
                        TargetKind::OneShot => "the program",
                        _ => "the session (every call's)",
                    },
                    crate::engine::MAX_ENV_VARS,
                    format_size(crate::engine::MAX_ENV_BYTES)
                ),
                "additionalProperties": {"type": "string"},
                "maxProperties": crate::engine::MAX_ENV_VARS,
            });
            if policy.is_some() {
                // The served document (JSON Schema 2020-12) says which names are accepted,
                // and which runcell keeps; the generic schema stays within what every
                // OpenAPI library reads (utoipa's has no `propertyNames`).
                env["propertyNames"] = json!({
                    "pattern": "^[A-Za-z_][A-Za-z0-9_]*$",
                    "maxLength": 128,
                    "not": {"enum": runcell_runtimes::RESERVED_ENV},
                });
            }
            env
        }
        Field::Limit(l) => limit_schema(l, ctx),
    }
}

fn limit_schema(l: Limit, ctx: &SchemaContext) -> Value {
    let doc = match (l, ctx.target) {
        (Limit::Timeout, TargetKind::CreateSession) => {
            "Wall-clock time of each call (default of the session's calls)."
        }
        _ => l.doc(),
    };
    let Some(config) = ctx.policy else {
        return l.kind().request_schema(doc);
    };
    let p = &config.policy;
    if ctx.for_model() && l == Limit::Timeout {
        // A model reads seconds, as a number.
        let max_s = p.max.timeout.0 as f64 / 1000.0;
        return json!({
            "type": "number",
            "exclusiveMinimum": 0,
            "maximum": if max_s.fract() == 0.0 { json!(p.max.timeout.0 / 1000) } else { json!(max_s) },
            "description": format!(
                "Wall-clock time limit in seconds (default {}, at most {}).",
                p.defaults.timeout.0 as f64 / 1000.0,
                max_s
            ),
        });
    }
    let mut schema = p.bounded_limit_schema(l, doc);
    if l == Limit::OpenFiles {
        let description = format!(
            "{} With `pids`, within the host's file table: pids × open_files at most {}.",
            schema["description"].as_str().unwrap_or_default(),
            p.max_open_files_per_run
        );
        schema["description"] = json!(description);
    }
    schema
}

fn network_schema(ctx: &SchemaContext) -> Value {
    let mut schema = NetworkRequest::schema_value();
    let Some(config) = ctx.policy else {
        return schema;
    };
    let own = ctx.target.rule(Field::Network) == Rule::SessionOwn;
    let network = &config.network.allow;
    if own {
        schema["description"] = json!(format!(
            "The session's own, set when it was created: leave it out (or repeat the \
             session's entries). {}",
            schema["description"].as_str().unwrap_or_default()
        ));
    }
    if ctx.for_model() {
        schema["description"] = json!(format!(
            "Only when the code needs the network: the destinations it may reach (through an \
             HTTP(S) proxy the sandbox is set up to use), as HOST[:PORT] entries within what \
             this server allows: {}. Without it the code has no network.",
            config.network.describe()
        ));
        return schema;
    }
    let items = if network.is_empty() {
        json!({"type": "string", "description": "This server allows no network: the list must be empty."})
    } else {
        let entries: Vec<String> = network.iter().map(ToString::to_string).collect();
        json!({
            "type": "string",
            "enum": entries,
            "description": "An entry of this server's policy (an entry it covers is accepted \
                            too: a subdomain of a *.domain entry, a port of an entry without \
                            one; an API key may be narrowed further).",
        })
    };
    schema["properties"]["allow"]["items"] = items;
    if network.is_empty() {
        schema["properties"]["allow"]["maxItems"] = json!(0);
    }
    schema
}

fn packages_schema(ctx: &SchemaContext) -> Value {
    let mut schema = json!({
        "type": ["array", "null"],
        "items": {"type": "string", "examples": ["tabulate==0.9.0"]},
        "description": "Python only: packages the curated stack lacks, as requirements (a \
            name, optional extras and version specifiers), installed as binary wheels from the \
            operator's index before the run, within its policy.",
    });
    let Some(config) = ctx.policy else {
        return schema;
    };
    let packages = &config.packages;
    if ctx.for_model() {
        let which = if packages.allow_any {
            format!("any package from {}", packages.index_url)
        } else {
            packages.allow.join(", ")
        };
        return json!({
            "type": "array",
            "items": {"type": "string"},
            "description": format!(
                "Only for a package the pre-installed stack lacks: requirements such as \
                 tabulate==0.9.0, installed (binary wheels) before the code runs. Allowed \
                 here: {which}."
            ),
        });
    }
    if ctx.target.rule(Field::Packages) == Rule::SessionOwn {
        schema["description"] = json!(
            "The session's own, installed when it was created: leave it out (or repeat the \
             session's requirements)."
        );
    }
    if !packages.enabled() {
        schema["maxItems"] = json!(0);
        schema["description"] = json!("This server installs no packages: the list must be empty.");
    } else {
        schema["maxItems"] = json!(packages.max_requirements);
        if !packages.allow_any {
            schema["items"]["enum"] = json!(packages.allow);
        }
    }
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_as(body: Value, source: Source, target: TargetKind) -> Result<ExecRequest, String> {
        parse_value(body, source, target, Offers::default())
            .and_then(|r| check(&r, target).map(|()| r))
            .map_err(|e| e.message)
    }

    #[test]
    fn a_model_never_sizes_its_sandbox() {
        for source in [Source::Mcp, Source::Model] {
            for limit in Limit::ALL.iter().filter(|&&l| l != Limit::Timeout) {
                let body = json!({"code": "x", limit.name(): 1});
                let e = parse_as(body, source, TargetKind::OneShot).unwrap_err();
                assert!(
                    e.contains(&format!("unknown field `{}`", limit.name())),
                    "{source:?} {limit}: {e}"
                );
            }
            // The language is the tool's: the door sets it, the model cannot.
            let e = parse_as(
                json!({"code": "x", "language": "go"}),
                source,
                TargetKind::OneShot,
            )
            .unwrap_err();
            assert!(e.contains("unknown field `language`"), "{e}");
        }
        // The agent loop's model gets no network or packages even where MCP clients do.
        let offers = Offers {
            network: true,
            packages: true,
        };
        assert!(allowed(Source::Mcp, TargetKind::OneShot, offers).contains(Field::Network));
        for target in [
            TargetKind::OneShot,
            TargetKind::NewSession,
            TargetKind::Session,
        ] {
            let model = allowed(Source::Model, target, offers);
            assert!(!model.contains(Field::Network), "{target:?}");
            assert!(!model.contains(Field::Packages), "{target:?}");
        }
        assert!(allowed(Source::Mcp, TargetKind::NewSession, offers).contains(Field::Network));
        // Without an offer, MCP clients do not see the keys at all.
        assert!(
            !allowed(Source::Mcp, TargetKind::OneShot, Offers::default()).contains(Field::Network)
        );
    }

    /// Issue 22: a session call may set its own env (the API's and the operator's), a model
    /// never, in a session or elsewhere.
    #[test]
    fn a_session_call_takes_env_from_the_api_only() {
        let body = json!({"code": "x", "env": {"A": "1"}});
        let r = parse_as(body.clone(), Source::Api, TargetKind::Session).unwrap();
        assert_eq!(r.env.get("A").map(String::as_str), Some("1"));
        for source in [Source::Mcp, Source::Model] {
            for target in [
                TargetKind::OneShot,
                TargetKind::NewSession,
                TargetKind::Session,
            ] {
                let e = parse_as(body.clone(), source, target).unwrap_err();
                assert!(
                    e.contains("unknown field `env`"),
                    "{source:?} {target:?}: {e}"
                );
                let offers = Offers {
                    network: true,
                    packages: true,
                };
                assert!(!allowed(source, target, offers).contains(Field::Env));
            }
        }
    }

    #[test]
    fn every_target_says_what_it_needs() {
        let e = parse_as(
            json!({"language": "python"}),
            Source::Api,
            TargetKind::OneShot,
        )
        .unwrap_err();
        assert!(e.contains("missing field `code`"), "{e}");
        let e = parse_as(json!({"code": "x"}), Source::Api, TargetKind::OneShot).unwrap_err();
        assert!(e.contains("missing field `language`"), "{e}");
        // A session is created without code; its call needs code and no language.
        let e = parse_as(
            json!({"language": "python", "code": null}),
            Source::Api,
            TargetKind::CreateSession,
        )
        .unwrap_err();
        assert!(e.contains("without code"), "{e}");
        assert!(parse_as(
            json!({"language": "python", "ttl": 60, "memory": "512M"}),
            Source::Api,
            TargetKind::CreateSession
        )
        .is_ok());
        assert!(parse_as(json!({"code": "x"}), Source::Api, TargetKind::Session).is_ok());
        // ttl only where a session is created.
        for target in [
            TargetKind::OneShot,
            TargetKind::Session,
            TargetKind::NewSession,
        ] {
            let body = json!({"language": "python", "code": "x", "ttl": 5});
            assert!(parse_as(body, Source::Api, target).is_err(), "{target:?}");
        }
    }

    #[test]
    fn sessions_take_network_and_packages_when_created_and_calls_keep_them() {
        for target in [TargetKind::CreateSession, TargetKind::NewSession] {
            let mut body = json!({
                "language": "python",
                "network": {"allow": ["example.com:443"]},
                "packages": ["tabulate"],
            });
            if target == TargetKind::NewSession {
                body["code"] = json!("x");
            }
            assert!(parse_as(body, Source::Api, target).is_ok(), "{target:?}");
        }
        // A call may leave them out or send them empty (one body shape for every target)...
        let body = json!({"code": "x", "network": {"allow": []}, "packages": []});
        let call = parse_as(body, Source::Api, TargetKind::Session).unwrap();
        let session = SessionSettings {
            language: Language::Python,
            overrides: LimitOverrides::default(),
            network: vec!["example.com:443".into()],
            packages: vec!["tabulate==0.9.0".into()],
        };
        let merged = merge_call(&call, &session).unwrap();
        assert!(merged.network.is_none() && merged.packages.is_empty());
        // ... or repeat the session's (in another spelling), but not change them.
        let body = json!({
            "code": "x",
            "network": {"allow": ["EXAMPLE.com:443", "example.com:443"]},
            "packages": ["Tabulate == 0.9.0"],
        });
        let call = parse_as(body, Source::Api, TargetKind::Session).unwrap();
        let merged = merge_call(&call, &session).unwrap();
        assert!(merged.network.is_none() && merged.packages.is_empty());
        let body = json!({"code": "x", "network": {"allow": ["other.com:443"]}});
        let call = parse_as(body, Source::Api, TargetKind::Session).unwrap();
        let e = merge_call(&call, &session).unwrap_err().message;
        assert!(e.contains("network is the session's own"), "{e}");
        assert!(e.contains("example.com:443"), "{e}");
        let body = json!({"code": "x", "packages": ["rich"]});
        let call = parse_as(body, Source::Api, TargetKind::Session).unwrap();
        let e = merge_call(&call, &session).unwrap_err().message;
        assert!(e.contains("packages is the session's own"), "{e}");
        // A session without network: a call cannot open it.
        let offline = SessionSettings {
            network: Vec::new(),
            packages: Vec::new(),
            ..session
        };
        let body = json!({"code": "x", "network": {"allow": ["example.com:443"]}});
        let call = parse_as(body, Source::Api, TargetKind::Session).unwrap();
        let e = merge_call(&call, &offline).unwrap_err().message;
        assert!(e.contains("it has no network"), "{e}");
    }

    #[test]
    fn a_call_takes_its_sessions_settings_and_refuses_what_it_cannot_honour() {
        let session = SessionSettings {
            language: Language::Python,
            overrides: serde_json::from_value(json!({"memory": "512M", "timeout": 5})).unwrap(),
            network: Vec::new(),
            packages: Vec::new(),
        };
        let call = parse_as(
            json!({"code": "x", "timeout": 2, "output": "1K"}),
            Source::Api,
            TargetKind::Session,
        )
        .unwrap();
        let merged = merge_call(&call, &session).unwrap();
        assert_eq!(merged.language.as_deref(), Some("python"));
        assert_eq!(merged.limits.memory, session.overrides.memory);
        assert_eq!(merged.limits.timeout, Some(crate::limits::Millis(2000)));
        assert_eq!(merged.limits.output, Some(crate::limits::Bytes(1024)));
        // The call's own timeout falls back to the session's.
        let call = parse_as(json!({"code": "x"}), Source::Api, TargetKind::Session).unwrap();
        assert_eq!(
            merge_call(&call, &session).unwrap().limits.timeout,
            Some(crate::limits::Millis(5000))
        );
        // A sandbox-level limit in a call: refused (by key from a body), never dropped.
        let e = parse_as(
            json!({"code": "x", "memory": "1G"}),
            Source::Api,
            TargetKind::Session,
        )
        .unwrap_err();
        assert!(e.contains("memory is the session's own"), "{e}");
        let mut call = ExecRequest::new("python", "x");
        call.limits.pids = Some(crate::limits::Count(3));
        let e = merge_call(&call, &session).unwrap_err();
        assert_eq!(e.limit, Some(Limit::Pids));
        // Another language: refused.
        let call = ExecRequest::new("go", "x");
        assert!(merge_call(&call, &session)
            .unwrap_err()
            .message
            .contains("python session"));
        // A shell command, which a door that sets the language may ask for: a bash program
        // in the session's sandbox, with the session's limits.
        let call = ExecRequest::new("bash", "echo hi");
        let merged = merge_call(&call, &session).unwrap();
        assert_eq!(merged.language.as_deref(), Some("bash"));
        assert_eq!(merged.limits.memory, session.overrides.memory);
        // A body cannot name a language for a session call at all.
        assert!(parse_as(
            json!({"code": "x", "language": "bash"}),
            Source::Api,
            TargetKind::Session
        )
        .is_err());
    }

    #[test]
    fn schemas_follow_the_tables() {
        for source in [Source::Api, Source::Mcp, Source::Model, Source::Operator] {
            for target in [
                TargetKind::OneShot,
                TargetKind::CreateSession,
                TargetKind::NewSession,
                TargetKind::Session,
            ] {
                let s = request_schema(&SchemaContext::new(source, target));
                let props = s["properties"].as_object().unwrap();
                let keys: FieldSet = props.keys().map(|k| Field::from_name(k).unwrap()).collect();
                assert_eq!(
                    keys,
                    allowed(
                        source,
                        target,
                        Offers {
                            network: true,
                            packages: true
                        }
                    ),
                    "{source:?} {target:?}"
                );
                for r in s["required"].as_array().unwrap() {
                    let f = Field::from_name(r.as_str().unwrap()).unwrap();
                    assert_eq!(target.rule(f), Rule::Required, "{source:?} {target:?} {f}");
                }
                assert_eq!(s["additionalProperties"], json!(false));
                assert!(!s.to_string().contains("$ref"));
            }
        }
    }

    #[test]
    fn a_bounded_schema_states_the_policy() {
        let mut config = EngineConfig::for_host();
        config.policy = crate::limits::LimitPolicy::for_host(8 << 30, 2);
        let ctx = SchemaContext::new(Source::Api, TargetKind::OneShot)
            .with_policy(&config, Duration::from_secs(3600));
        let s = request_schema(&ctx);
        assert_eq!(s["properties"]["memory"]["maximum"], json!(8u64 << 30));
        assert!(s["anyOf"].is_array());
        assert_eq!(s["properties"]["files"]["uniqueItems"], json!(true));
        let ctx = SchemaContext::new(Source::Mcp, TargetKind::OneShot)
            .with_policy(&config, Duration::from_secs(3600))
            .for_language(Language::Go);
        let s = request_schema(&ctx);
        assert_eq!(s["properties"]["timeout"]["maximum"], json!(3600));
        assert!(s["properties"]["code"]["description"]
            .as_str()
            .unwrap()
            .contains("package main"));
        assert!(s.get("anyOf").is_none());
    }
}
