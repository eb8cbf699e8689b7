//! The OpenAPI document: generated from the handlers and the types they use, plus the
//! security schemes and a hand-written entry for `/mcp`.

use runcell_core::intake::{self, SchemaContext, Source, TargetKind};
use utoipa::{Modify, OpenApi};
use utoipa_axum::router::OpenApiRouter;

use crate::routes;
use crate::state::AppState;

#[derive(OpenApi)]
#[openapi(
    info(
        title = "runcell",
        description = "Run untrusted code (Python, JavaScript, Ruby, Go, bash) in a sandbox and \
                       get a structured verdict.",
        license(name = "Apache-2.0")
    ),
    modifiers(&SecuritySchemes, &McpPath),
    security(("bearer" = []), ("api_key" = [])),
    tags(
        (name = "execute", description = "Running code"),
        (name = "operations", description = "Health, metrics and this document"),
        (name = "mcp", description = "The MCP server"),
        (name = "admin", description = "The operator's view (admin keys): GET /console is its page")
    )
)]
struct ApiDoc;

struct SecuritySchemes;

impl Modify for SecuritySchemes {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{
            ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme,
        };
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// `/mcp` is served by the MCP SDK, not by a handler of ours: it is described here by hand,
/// as a pointer to the protocol.
struct McpPath;

impl Modify for McpPath {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::path::{
            HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn, PathItem,
        };
        use utoipa::openapi::request_body::RequestBodyBuilder;
        use utoipa::openapi::{ContentBuilder, ObjectBuilder, Type};
        use utoipa::openapi::{Response as OaResponse, ResponsesBuilder};
        let op = |summary: &str, ok: &[(&str, &str)]| {
            let mut responses = ResponsesBuilder::new();
            for (code, what) in ok {
                responses = responses.response(*code, OaResponse::new(*what));
            }
            OperationBuilder::new()
                .tag("mcp")
                .summary(Some(summary))
                .description(Some(
                    "The Model Context Protocol over Streamable HTTP (JSON-RPC; protocol \
                     versions 2025-06-18 to 2026-07-28): tools code_exec_python, code_exec_node, \
                     code_exec_ruby, code_exec_go, code_exec_bash. Same API keys as the rest of \
                     the API. Clients must accept both application/json and text/event-stream. \
                     See docs/mcp.md.",
                ))
                .responses(
                    responses
                        .response(
                            "400",
                            OaResponse::new(
                                "Not a JSON-RPC message, or a missing or unknown protocol \
                                 version or session",
                            ),
                        )
                        .response("401", OaResponse::new("No or a wrong API key"))
                        .response("404", OaResponse::new("No such session (it ended)"))
                        .response(
                            "406",
                            OaResponse::new(
                                "The Accept header does not allow application/json and \
                                 text/event-stream",
                            ),
                        )
                        .response(
                            "415",
                            OaResponse::new("A POST whose Content-Type is not application/json"),
                        ),
                )
                .build()
        };
        let mut post = op(
            "Send a JSON-RPC message",
            &[
                ("200", "A JSON-RPC response or an event stream"),
                ("202", "A notification or a response, accepted"),
            ],
        );
        post.request_body = Some(utoipa::openapi::RefOr::T(
            RequestBodyBuilder::new()
                .description(Some(
                    "One JSON-RPC 2.0 message (a request, notification or response)",
                ))
                .content(
                    "application/json",
                    ContentBuilder::new()
                        .schema(Some(
                            ObjectBuilder::new()
                                .schema_type(Type::Object)
                                .property(
                                    "jsonrpc",
                                    ObjectBuilder::new()
                                        .schema_type(Type::String)
                                        .enum_values(Some(["2.0"])),
                                )
                                .required("jsonrpc"),
                        ))
                        .build(),
                )
                .required(Some(utoipa::openapi::Required::True))
                .build(),
        ));
        // GET and DELETE address a session the server opened at initialize.
        let with_session = |mut operation: utoipa::openapi::path::Operation| {
            operation.parameters = Some(vec![utoipa::openapi::RefOr::T(
                ParameterBuilder::new()
                    .name("Mcp-Session-Id")
                    .parameter_in(ParameterIn::Header)
                    .required(utoipa::openapi::Required::True)
                    .description(Some("The session id the server returned at initialize"))
                    .schema(Some(ObjectBuilder::new().schema_type(Type::String)))
                    .build(),
            )]);
            operation
        };
        let mut item = PathItem::new(HttpMethod::Post, post);
        item.get = Some(with_session(op(
            "Open the event stream of a session (older protocol versions)",
            &[("200", "The session's event stream")],
        )));
        item.delete = Some(with_session(op(
            "End a session (older protocol versions)",
            &[("204", "The session ended")],
        )));
        openapi.paths.paths.insert("/mcp".to_string(), item);
    }
}

/// The OpenAPI document of the API, generated from the handlers and the types they use.
pub fn openapi() -> utoipa::openapi::OpenApi {
    OpenApiRouter::<AppState>::with_openapi(ApiDoc::openapi())
        .merge(routes::authenticated())
        .merge(routes::public())
        .into_openapi()
}

/// The request bodies of the API, as the intake's tables describe them for the HTTP API:
/// `POST /v1/execute` (a one-shot run), `POST /v1/sessions` (a session's creation) and
/// `POST /v1/sessions/{id}/execute` (a call in a session). Each is a component of the document;
/// [`served`] writes them again within this server's policy.
const REQUEST_BODIES: [(&str, TargetKind); 3] = [
    ("ExecRequest", TargetKind::OneShot),
    ("SessionRequest", TargetKind::CreateSession),
    ("CellRequest", TargetKind::Session),
];

/// One request body's schema: the intake's, with its files as `InputFile` components and an
/// example of its own (in the numeric form a policy's bounds take, when there is one).
fn request_body(
    target: TargetKind,
    policy: Option<(&runcell_core::EngineConfig, &runcell_core::SessionPolicy)>,
) -> serde_json::Value {
    use serde_json::json;
    let mut ctx = SchemaContext::new(Source::Api, target);
    if let Some((engine, sessions)) = policy {
        ctx = ctx.with_policy(engine, sessions.max_ttl);
    }
    let mut s = intake::request_schema(&ctx);
    if s["properties"]["files"].is_object() {
        s["properties"]["files"]["items"] = json!({"$ref": "#/components/schemas/InputFile"});
    }
    let bounded = policy.is_some();
    s["examples"] = match target {
        TargetKind::OneShot if bounded => {
            json!([{"language": "python", "code": "print(6 * 7)", "timeout": 10, "memory": 268435456}])
        }
        TargetKind::OneShot => {
            json!([{"language": "python", "code": "print(6 * 7)", "timeout": 10, "memory": "256M"}])
        }
        TargetKind::CreateSession if bounded => {
            json!([{"language": "python", "ttl": 600, "memory": 536870912}])
        }
        TargetKind::CreateSession => json!([{"language": "python", "ttl": 600, "memory": "512M"}]),
        _ => json!([{"code": "x = 41\nprint(x + 1)", "timeout": 10}]),
    };
    s
}

/// A request body as a type the handlers' descriptions name: its schema is
/// [`REQUEST_BODIES`]' entry `N`.
pub struct RequestBody<const N: usize>;

impl<const N: usize> utoipa::PartialSchema for RequestBody<N> {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        runcell_core::schema::openapi(request_body(REQUEST_BODIES[N].1, None))
    }
}

impl<const N: usize> utoipa::ToSchema for RequestBody<N> {
    fn name() -> std::borrow::Cow<'static, str> {
        REQUEST_BODIES[N].0.into()
    }

    fn schemas(
        schemas: &mut Vec<(
            String,
            utoipa::openapi::RefOr<utoipa::openapi::schema::Schema>,
        )>,
    ) {
        schemas.push((
            "InputFile".into(),
            runcell_core::schema::openapi(runcell_core::InputFile::schema_value()),
        ));
    }
}

/// `POST /v1/execute`'s body.
pub type ExecRequest = RequestBody<0>;
/// `POST /v1/sessions`' body.
pub type SessionRequest = RequestBody<1>;
/// `POST /v1/sessions/{id}/execute`'s body.
pub type CellRequest = RequestBody<2>;

/// The document as this server serves it: the generated one with its request bodies written
/// by the intake within this server's policy (the limits' ranges, a session's idle TTL, the
/// destinations and packages runs may ask for), so that a request the document calls valid
/// is one this server accepts. Where a policy cannot be said exactly, the schema is the
/// stricter side (numbers without the string forms, the policy's own entries), and the
/// description says what else is accepted.
pub fn served(
    engine: &runcell_core::EngineConfig,
    sessions: &runcell_core::SessionPolicy,
    agent: Option<&runcell_agent::api::AgentPolicy>,
) -> serde_json::Value {
    let mut doc = serde_json::to_value(openapi()).unwrap_or_default();
    // utoipa's object schema has no `oneOf` beside `properties`: the component is written as
    // JSON Schema has it, with its "exactly one content" rule.
    if let Some(file) = doc.pointer_mut("/components/schemas/InputFile") {
        *file = runcell_core::InputFile::schema_value();
    }
    for (name, target) in REQUEST_BODIES {
        if let Some(schema) = doc.pointer_mut(&format!("/components/schemas/{name}")) {
            *schema = request_body(target, Some((engine, sessions)));
        }
    }
    session_files(&mut doc);
    agent_schemas(&mut doc, agent);
    event_streams(&mut doc);
    doc
}

/// A session file's upload and download.
fn session_files(doc: &mut serde_json::Value) {
    use serde_json::json;
    // An upload without a body writes an empty file (HTTP cannot tell a missing body from an
    // empty one).
    if let Some(body) =
        doc.pointer_mut("/paths/~1v1~1sessions~1{id}~1files~1{path}/put/requestBody")
    {
        body["required"] = json!(false);
        body["description"] = json!("The file's bytes (none: an empty file)");
    }
    // A file written can be read back.
    if let Some(written) =
        doc.pointer_mut("/paths/~1v1~1sessions~1{id}~1files~1{path}/put/responses/204")
    {
        written["links"] = json!({"GetWrittenFile": {
            "operationId": "get_session_file",
            "parameters": {"id": "$request.path.id", "path": "$request.path.path"},
            "description": "The file just written",
        }});
    }
}

/// The agent loop's request and answer.
fn agent_schemas(doc: &mut serde_json::Value, agent: Option<&runcell_agent::api::AgentPolicy>) {
    use serde_json::json;
    // The agent loop's request within this server's bounds (a server without a model answers
    // 503 whatever is sent: its defaults are shown).
    let default_agent;
    let agent = match agent {
        Some(a) => a,
        None => {
            default_agent = runcell_agent::api::AgentPolicy::default();
            &default_agent
        }
    };
    for path in ["/v1/agents", "/v1/agents/chat/completions"] {
        let op = format!("/paths/{}/post", path.replace('/', "~1"));
        if let Some(op) = doc.pointer_mut(&op) {
            op["requestBody"]["content"]["application/json"]["schema"] =
                runcell_agent::api::AgentRequest::schema(agent);
            let ok = &mut op["responses"]["200"]["content"];
            ok["application/json"]["schema"] = runcell_agent::api::completion_schema();
            ok["text/event-stream"]["schema"] = json!({
                "type": "object",
                "description": "One server-sent event: `data` is a chat.completion.chunk (JSON), \
                    an error body ({\"error\": ...}), or [DONE] at the end.",
                "properties": {"data": {"type": "string"}},
                "required": ["data"],
            });
        }
    }
}

/// The events of a streamed run.
fn event_streams(doc: &mut serde_json::Value) {
    use serde_json::{json, Value};
    // A run's events (Open API 3.1: the schema of an event stream describes one event).
    let json_data = |schema: Value| json!({"type": "string", "contentMediaType": "application/json", "contentSchema": schema});
    let output =
        json!({"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]});
    let run_event = json!({
        "oneOf": [
            {"type": "object", "properties": {"event": {"enum": ["stdout", "stderr"]}, "data": json_data(output)}, "required": ["event", "data"]},
            {"type": "object", "properties": {"event": {"const": "result"}, "data": json_data(json!({"$ref": "#/components/schemas/Verdict"}))}, "required": ["event", "data"]},
            {"type": "object", "properties": {"event": {"const": "error"}, "data": json_data(json!({"$ref": "#/components/schemas/ErrorBody"}))}, "required": ["event", "data"]},
        ],
        "description": "One server-sent event: `stdout` or `stderr` ({\"text\": ...}) as the program writes, then `result` (the verdict) or `error` (an error body).",
    });
    for path in ["/v1/execute", "/v1/sessions/{id}/execute"] {
        let at = format!(
            "/paths/{}/post/responses/200/content/text~1event-stream/schema",
            path.replace('/', "~1")
        );
        if let Some(schema) = doc.pointer_mut(&at) {
            *schema = run_event.clone();
        }
    }
}
