//! The tools, defined once: one `code_exec_<language>` per runtime installed on this host,
//! each with a description built from the runtime's real version, the packages really
//! installed and the operator's limits, an input schema cut from the engine's request, and the
//! verdict's schema as output schema. MCP serves this list; `runcell tools` renders the same
//! list for Anthropic and OpenAI tool calling (see [`crate::formats`]).

use std::sync::Arc;
use std::time::Duration;

use rmcp::model::{JsonObject, Tool, ToolAnnotations};
use runcell_core::intake::{self, SchemaContext, Source, TargetKind};
use runcell_core::limits::Limits;
use runcell_core::request::Field;
use runcell_core::units::{format_duration, format_size};
#[cfg(test)]
use runcell_core::InputFile;
use runcell_core::{
    python_stack, Engine, EngineConfig, ExecRequest, Language, LimitPolicy, Offers, RuntimeStatus,
    SessionPolicy, Verdict,
};
use serde_json::{json, Value};

/// The arguments a `code_exec_*` tool may take: the intake's fields for an MCP client (see
/// [`runcell_core::intake`]'s capability table: the code, its files, a timeout, and network
/// and packages where the operator offers them), and `session_id`. A model is not the party
/// that should size its own sandbox: the other limits stay the operator's defaults.
pub fn arguments(offers: Offers) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = intake::allowed(Source::Mcp, TargetKind::OneShot, offers)
        .iter()
        .map(Field::name)
        .collect();
    names.push("session_id");
    names
}

/// An installed runtime, as the catalog describes it.
pub type RuntimeInfo = RuntimeStatus;

/// One tool.
#[derive(Debug, Clone)]
pub struct ToolDef {
    /// `code_exec_python`, ...
    pub name: String,
    pub language: Language,
    /// A short human-readable title: "Run Python 3.11.2".
    pub title: String,
    pub description: String,
    pub input_schema: Arc<JsonObject>,
}

/// The tools of this host.
#[derive(Debug, Clone)]
pub struct Catalog {
    tools: Vec<ToolDef>,
    output_schema: Arc<JsonObject>,
    /// Network approval: a call that asks for network runs only once the client's user
    /// accepted (elicitation), asked within this time. `None`: no approval asked here.
    approval: Option<std::time::Duration>,
    /// What the operator's policy offers beyond the basics (network, packages).
    offers: Offers,
}

/// The tool name of a language.
pub fn tool_name(language: Language) -> String {
    format!("code_exec_{}", language.name())
}

fn object(v: Value) -> JsonObject {
    match v {
        Value::Object(o) => o,
        _ => JsonObject::new(),
    }
}

/// The schema of `structuredContent`: the verdict as it is serialised.
pub fn output_schema() -> JsonObject {
    object(runcell_core::schema::inline_output_schema::<Verdict>())
}

fn seconds(ms: u64) -> String {
    format_duration(Duration::from_millis(ms))
}

fn cores(cpu_millis: u64) -> String {
    let n = cpu_millis as f64 / 1000.0;
    let n = if n.fract() == 0.0 {
        format!("{}", n as u64)
    } else {
        format!("{n}")
    };
    format!("{n} CPU core{}", if n == "1" { "" } else { "s" })
}

/// What `session_id` does, for the schema and the description.
const SESSION_ID_HELP: &str = "Omit for a fresh, isolated run. \"new\" starts a session whose \
    variables, imports, definitions and /workspace files persist between calls (its id comes \
    back in structuredContent.session_id); pass that id to run more code in it.";

/// Take `session_id` out of a call's arguments: where the call runs.
pub fn session_target(
    arguments: &mut Option<JsonObject>,
) -> Result<Option<runcell_core::Target>, String> {
    let Some(args) = arguments.as_mut() else {
        return Ok(None);
    };
    match args.remove("session_id") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() && s.len() <= 128 => {
            Ok(Some(runcell_core::Target::session(&s)))
        }
        Some(other) => Err(format!(
            "session_id must be \"new\" or the id of a session, not {other}."
        )),
    }
}

/// The input schema of one tool: the intake's schema for an MCP client's one-shot run
/// within this operator's policy, with this language's words, and `session_id`.
fn input_schema(language: Language, config: &EngineConfig, sessions: &SessionPolicy) -> JsonObject {
    let ctx = SchemaContext::new(Source::Mcp, TargetKind::OneShot)
        .with_policy(config, sessions.max_ttl)
        .for_language(language);
    let mut schema = object(intake::request_schema(&ctx));
    if let Some(Value::Object(props)) = schema.get_mut("properties") {
        props.insert(
            "session_id".into(),
            json!({
                "type": "string",
                "description": SESSION_ID_HELP,
            }),
        );
        if let Some(Value::Object(items)) = props.get_mut("files").and_then(|f| f.get_mut("items"))
        {
            // The item's own words: its fields are described where a model reads them.
            items.remove("description");
        }
    }
    schema
}

/// The packages of the Python data stack worth naming, with their versions.
fn named_packages(packages: &[(String, String)]) -> Vec<String> {
    python_stack::REQUIRED_PACKAGES
        .iter()
        .map(|want| {
            let norm = python_stack::normalize(want);
            match packages
                .iter()
                .find(|(name, _)| python_stack::normalize(name) == norm)
            {
                Some((_, version)) => format!("{want} {version}"),
                None => want.to_string(),
            }
        })
        .collect()
}

fn display_version(rt: &RuntimeInfo) -> String {
    match &rt.version {
        Some(v) => format!(" {}", v.trim_start_matches('v').trim_start_matches("go")),
        None => String::new(),
    }
}

/// Whether this Node.js runs a `.js` file that uses ES module syntax as a module (syntax
/// detection, on by default since 22.7 and 20.19).
fn node_detects_modules(version: Option<&str>) -> bool {
    let Some(v) = version else { return false };
    let mut parts = v
        .trim_start_matches('v')
        .split('.')
        .map(|p| p.parse::<u32>().ok());
    match (parts.next().flatten(), parts.next().flatten()) {
        (Some(major), _) if major >= 23 => true,
        (Some(22), Some(minor)) => minor >= 7,
        (Some(20), Some(minor)) => minor >= 19,
        _ => false,
    }
}

/// What a model needs to know to write a working program the first time.
fn description(rt: &RuntimeInfo, policy: &LimitPolicy) -> (String, String) {
    let v = display_version(rt);
    let d: &Limits = &policy.defaults;
    let (title, intro, env) = match rt.language {
        Language::Python => {
            let env = match &rt.packages {
                Some(p) if !p.is_empty() => format!(
                    "- Installed: the standard library and {} (with their dependencies). Nothing \
                     else can be installed: there is no pip and no network.\n\
                     - Plots: matplotlib figures come back as PNG images by themselves: call \
                     plt.show() or leave figures open at the end (they are saved to \
                     /workspace/figures/). plt.savefig('name.png') works too.\n",
                    named_packages(p).join(", ")
                ),
                _ => "- Installed: only the standard library (this server has no third-party \
                      packages: no numpy, pandas or matplotlib). Nothing can be installed.\n"
                    .to_string(),
            };
            (
                format!("Run Python{v}"),
                format!("Run a Python{v} program"),
                env,
            )
        }
        Language::Node => (
            format!("Run JavaScript (Node.js{v})"),
            format!("Run a JavaScript program with Node.js{v}"),
            format!(
                "{}- Only Node's built-in modules are available (fs, path, crypto, ...); no \
                 npm packages can be installed.\n",
                if node_detects_modules(rt.version.as_deref()) {
                    "- The code is saved as main.js and runs as CommonJS (require) unless it \
                     uses ES module syntax (import, export, top-level await): then it runs as \
                     an ES module, where require is not defined. Do not mix the two.\n"
                } else {
                    "- It runs as a CommonJS script: use require(), not import; there is no \
                     top-level await (wrap async code in an async function and call it).\n"
                }
            ),
        ),
        Language::Ruby => (
            format!("Run Ruby{v}"),
            format!("Run a Ruby{v} program"),
            "- The standard library and the gems bundled with Ruby are available; no other \
             gems can be installed.\n"
                .to_string(),
        ),
        Language::Go => (
            format!("Run Go{v}"),
            format!("Compile and run a Go{v} program"),
            format!(
                "- Write a complete program: package main with a func main(). Only the standard \
                 library is available; no modules can be downloaded.\n\
                 - It is compiled with go build first (up to {}, not counted in `timeout`); \
                 compiler errors come back with the error category compile_error.\n",
                seconds(d.compile_timeout.0)
            ),
        ),
        Language::Bash => (
            format!("Run bash{v}"),
            format!("Run a bash{v} script"),
            "- The host's command-line tools under /usr/bin are available read-only \
             (coreutils, grep, sed, awk and whatever else the host has installed).\n"
                .to_string(),
        ),
    };
    let session_note = match rt.language {
        Language::Go => " (for Go, only the files persist: each call is a new program)",
        Language::Node => " (a session's cells run like the Node REPL: no stdin)",
        _ => "",
    };
    let text = format!(
        "{intro} in a fresh, isolated sandbox and get back its stdout, stderr, exit code and \
         the files it writes.\n\
         {env}\
         - No network: nothing can be downloaded, and no outside service can be reached.\n\
         - Every call starts from scratch: nothing persists between calls (no variables, no \
         files), so send everything the program needs in `code` and `files`; unless you pass \
         `session_id`: \"new\" starts a session that keeps variables, definitions and files \
         between calls, and its returned id continues it{session_note}.\n\
         - The working directory is /workspace. `files` are written there before the program \
         starts. Every file the program creates or changes under /workspace comes back with \
         the result (images as images; up to {} files, {} each), so write output files \
         there; use /tmp for scratch files that should not come back.\n\
         - Limits: {} wall-clock by default (set `timeout` in seconds, at most {}), {} of \
         memory, {}, {} processes and threads, {} of disk for /workspace and /tmp together, \
         {} each of stdout and stderr. A program that exceeds a limit is stopped and the \
         result says which limit it hit.\n\
         - stdin is empty. Only stdout, stderr and files come back: print the results you \
         need. A failed run comes back as an error with its category (runtime_error, \
         timeout, memory_limit, ...) and what to change.",
        policy.output_files_returned(),
        format_size(policy.max_output_file_bytes),
        seconds(d.timeout.0),
        seconds(policy.max.timeout.0),
        format_size(d.memory.0),
        cores(d.cpus.0),
        d.pids.0,
        format_size(d.disk.0),
        format_size(d.output.0),
    );
    (title, text)
}

impl Catalog {
    /// The tools for these runtimes under this configuration. Pure: the same inputs give the
    /// same catalog.
    pub fn new(config: &EngineConfig, runtimes: &[RuntimeInfo]) -> Catalog {
        let sessions = SessionPolicy::default();
        let tools = runtimes
            .iter()
            .filter(|rt| rt.unavailable.is_none())
            .map(|rt| {
                let (title, description) = description(rt, &config.policy);
                ToolDef {
                    name: tool_name(rt.language),
                    language: rt.language,
                    title,
                    description,
                    input_schema: Arc::new(input_schema(rt.language, config, &sessions)),
                }
            })
            .collect();
        Catalog {
            tools,
            output_schema: Arc::new(output_schema()),
            approval: config
                .network
                .approval
                .then_some(config.network.approval_timeout),
            offers: Offers::of(config),
        }
    }

    /// The catalog of this host: the runtimes it has and the engine's configuration. Runs the
    /// runtimes' binaries: call it from a blocking context.
    pub fn for_host(engine: &Engine) -> Catalog {
        Catalog::new(engine.config(), &engine.runtimes())
    }

    pub fn tools(&self) -> &[ToolDef] {
        &self.tools
    }

    /// Ask the client's user to approve calls that ask for network (within `within`), or not.
    pub fn set_approval(&mut self, within: Option<std::time::Duration>) {
        self.approval = within;
    }

    /// How long the client's user has to approve a call that asks for network, when the
    /// operator requires approval.
    pub fn approval(&self) -> Option<std::time::Duration> {
        self.approval
    }

    pub fn get(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    pub fn output_schema(&self) -> &Arc<JsonObject> {
        &self.output_schema
    }

    /// A tool as MCP lists it.
    pub fn mcp_tool(&self, def: &ToolDef) -> Tool {
        Tool::new(
            def.name.clone(),
            def.description.clone(),
            def.input_schema.clone(),
        )
        .with_title(def.title.clone())
        .with_raw_output_schema(self.output_schema.clone())
        .with_annotations(
            ToolAnnotations::with_title(def.title.clone())
                // The sandbox is thrown away after each call and has no network: nothing
                // outside it changes, and nothing outside it is reached.
                .destructive(false)
                .open_world(false)
                .idempotent(false),
        )
    }

    pub fn mcp_tools(&self) -> Vec<Tool> {
        self.tools.iter().map(|t| self.mcp_tool(t)).collect()
    }

    /// Turn a call's arguments into the one request, for `target` (from `session_id`), or
    /// the message of an `invalid_request` result. Whether the values are within the policy
    /// is the run service's validation.
    pub fn request(
        &self,
        def: &ToolDef,
        arguments: Option<JsonObject>,
        target: TargetKind,
    ) -> Result<ExecRequest, String> {
        let args = arguments.unwrap_or_default();
        const USAGE: &str = "Pass `code` (a string), and optionally `timeout` (seconds) and \
                             `files` ([{\"path\", \"content\"}] or [{\"path\", \"content_base64\"}]).";
        // The tool's schema says seconds, as a number; the HTTP API's strings with units
        // ("10s") are not part of it.
        match args.get("timeout") {
            None | Some(Value::Null) | Some(Value::Number(_)) => {}
            Some(other) => {
                return Err(format!(
                    "timeout must be a positive number of seconds, not {other}."
                ))
            }
        }
        let mut req = intake::parse(Value::Object(args), Source::Mcp, target, self.offers)
            .map_err(|e| format!("Invalid arguments for {}: {e}. {USAGE}", def.name))?;
        req.language = Some(def.language.name().to_string());
        intake::check(&req, target)
            .map_err(|e| format!("Invalid arguments for {}: {}", def.name, e.message))?;
        Ok(req)
    }

    /// What the operator's policy offers.
    pub fn offers(&self) -> Offers {
        self.offers
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> EngineConfig {
        let mut c = EngineConfig::for_host();
        c.policy = LimitPolicy::for_host(8 << 30, 2);
        c.network = Default::default();
        c.packages = Default::default();
        c
    }

    fn runtimes() -> Vec<RuntimeInfo> {
        vec![
            RuntimeInfo {
                language: Language::Python,
                version: Some("3.11.2".into()),
                packages: Some(vec![
                    ("numpy".into(), "2.4.6".into()),
                    ("Pillow".into(), "12.0.0".into()),
                    ("matplotlib".into(), "3.11.2".into()),
                ]),
                unavailable: None,
            },
            RuntimeInfo {
                language: Language::Go,
                version: Some("1.19.8".into()),
                packages: None,
                unavailable: None,
            },
        ]
    }

    fn obj(v: Value) -> Option<JsonObject> {
        match v {
            Value::Object(o) => Some(o),
            _ => None,
        }
    }

    #[test]
    fn one_tool_per_installed_runtime() {
        let c = Catalog::new(&policy(), &runtimes());
        let names: Vec<&str> = c.tools().iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["code_exec_python", "code_exec_go"]);
        assert!(c.get("code_exec_ruby").is_none());
    }

    #[test]
    fn descriptions_name_versions_packages_and_limits() {
        let c = Catalog::new(&policy(), &runtimes());
        let py = &c.get("code_exec_python").unwrap().description;
        for want in [
            "Python 3.11.2",
            "numpy 2.4.6",
            "pillow 12.0.0",
            "matplotlib 3.11.2",
            "No network",
            "/workspace",
            "PNG images",
            "30 s wall-clock",
            "at most 60 min",
            "256 MiB",
            "1 CPU core",
        ] {
            assert!(py.contains(want), "{want:?} missing from {py}");
        }
        let go = &c.get("code_exec_go").unwrap().description;
        assert!(
            go.contains("Go 1.19.8") && go.contains("compile_error"),
            "{go}"
        );

        let bare = Catalog::new(
            &policy(),
            &[RuntimeInfo {
                language: Language::Python,
                version: Some("3.11.2".into()),
                packages: None,
                unavailable: None,
            }],
        );
        let d = &bare.tools()[0].description;
        assert!(
            d.contains("only the standard library") && !d.contains("PNG"),
            "{d}"
        );
    }

    #[test]
    fn node_module_syntax_depends_on_the_version() {
        for (v, want) in [
            ("20.20.2", true),
            ("v20.19.0", true),
            ("20.18.1", false),
            ("22.6.0", false),
            ("22.7.0", true),
            ("24.1.0", true),
            ("18.19.0", false),
            ("junk", false),
        ] {
            assert_eq!(node_detects_modules(Some(v)), want, "{v}");
        }
        assert!(!node_detects_modules(None));
    }

    #[test]
    fn input_schema_is_an_object_with_code_required_and_policy_bounds() {
        let c = Catalog::new(&policy(), &runtimes());
        let s = Value::Object((*c.tools()[0].input_schema).clone());
        assert_eq!(s["type"], "object");
        assert_eq!(s["required"], json!(["code"]));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["timeout"]["maximum"], json!(3600));
        assert_eq!(s["properties"]["files"]["type"], "array");
        let item = &s["properties"]["files"]["items"];
        assert_eq!(item["required"], json!(["path"]));
        assert!(item["properties"]["content_base64"].is_object());
        let text = s.to_string();
        assert!(!text.contains("$ref") && !text.contains("$defs"), "{text}");
    }

    #[test]
    fn output_schema_describes_the_verdict() {
        let s = Value::Object(output_schema());
        assert_eq!(s["type"], "object");
        for k in ["stdout", "stderr", "exit_code", "error", "files", "usage"] {
            assert!(s["properties"][k].is_object(), "{k}: {s}");
        }
        assert!(!s.to_string().contains("$ref"));
        assert!(
            s["properties"]["error"]["anyOf"].is_array()
                || s["properties"]["error"]["type"].is_array()
        );
    }

    #[test]
    fn arguments_become_a_request() {
        let c = Catalog::new(&policy(), &runtimes());
        let def = c.get("code_exec_python").unwrap();
        let req = c
            .request(
                def,
                obj(json!({"code": "print(1)", "timeout": 2.5,
                    "files": [{"path": "a.txt", "content": "hi"}]})),
                TargetKind::OneShot,
            )
            .unwrap();
        assert_eq!(req.language.as_deref(), Some("python"));
        assert_eq!(req.limits.timeout, Some(runcell_core::limits::Millis(2500)));
        assert_eq!(req.files, vec![InputFile::text("a.txt", "hi")]);
        let req = c
            .request(
                def,
                obj(json!({"code": "x", "timeout": null})),
                TargetKind::OneShot,
            )
            .unwrap();
        assert_eq!(req.limits.timeout, None);
    }

    #[test]
    fn bad_arguments_are_messages_not_panics() {
        let c = Catalog::new(&policy(), &runtimes());
        let def = c.get("code_exec_python").unwrap();
        let cases = [
            (None, "missing field `code`"),
            (obj(json!({"code": 1})), "invalid type"),
            (
                obj(json!({"code": "x", "language": "go"})),
                "unknown field `language`",
            ),
            (
                obj(json!({"code": "x", "memory": "1G"})),
                "unknown field `memory`",
            ),
            (
                obj(json!({"code": "x", "timeout": -1})),
                "timeout must be a number of seconds",
            ),
            (
                obj(json!({"code": "x", "timeout": "5"})),
                "positive number of seconds",
            ),
            (
                obj(json!({"code": "x", "files": [{"path": "a", "mode": 1}]})),
                "unknown field `mode`",
            ),
        ];
        for (args, want) in cases {
            let e = c
                .request(def, args.clone(), TargetKind::OneShot)
                .unwrap_err();
            assert!(e.contains(want), "{args:?}: {e}");
        }
        // Within the policy or not is the engine's call, made by the executor.
        let req = c
            .request(
                def,
                obj(json!({"code": "x", "timeout": 1e300})),
                TargetKind::OneShot,
            )
            .unwrap();
        let engine = runcell_core::Engine::new(policy());
        let e = engine.validate(&req).unwrap_err();
        assert_eq!(e.limit(), Some(runcell_core::Limit::Timeout));
        assert!(e.to_string().contains("maximum of 60 min"), "{e}");
    }
}
