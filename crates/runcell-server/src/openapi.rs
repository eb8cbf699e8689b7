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
        use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
        use utoipa::openapi::{Response as OaResponse, ResponsesBuilder};
        let op = |summary: &str| {
            OperationBuilder::new()
                .tag("mcp")
                .summary(Some(summary))
                .description(Some(
                    "The Model Context Protocol over Streamable HTTP (JSON-RPC; protocol \
                     versions 2025-06-18 to 2026-07-28): tools code_exec_python, code_exec_node, \
                     code_exec_ruby, code_exec_go, code_exec_bash. Same API keys as the rest of \
                     the API. See docs/mcp.md.",
                ))
                .responses(
                    ResponsesBuilder::new()
                        .response(
                            "200",
                            OaResponse::new("A JSON-RPC response or an event stream"),
                        )
                        .response("401", OaResponse::new("No or a wrong API key")),
                )
                .build()
        };
        let mut item = PathItem::new(HttpMethod::Post, op("Send a JSON-RPC message"));
        item.get = Some(op(
            "Open the event stream of a session (older protocol versions)",
        ));
        item.delete = Some(op("End a session (older protocol versions)"));
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
