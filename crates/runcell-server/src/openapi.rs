//! The OpenAPI document: generated from the handlers and the types they use, plus the
//! security schemes and a hand-written entry for `/mcp`.

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
        (name = "mcp", description = "The MCP server")
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
