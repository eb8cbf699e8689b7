//! The API's routes, one module per resource, each handler with its OpenAPI description.

pub mod admin;
pub mod agents;
pub mod approvals;
pub mod execute;
pub mod ops;
pub mod sessions;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

/// The routes that need a key, with their OpenAPI description.
pub(crate) fn authenticated() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(execute::execute))
        .routes(routes!(ops::runtimes))
        .routes(routes!(ops::metrics))
        .routes(routes!(agents::run))
        .routes(routes!(agents::run_chat_completions))
        .routes(routes!(approvals::list))
        .routes(routes!(approvals::decide))
        .routes(routes!(admin::overview))
        .routes(routes!(sessions::create, sessions::list))
        .routes(routes!(sessions::get, sessions::delete))
        .routes(routes!(sessions::execute))
        .routes(routes!(sessions::pause))
        .routes(routes!(sessions::fork))
        .routes(routes!(sessions::resume))
        .routes(routes!(sessions::list_files))
        .routes(routes!(sessions::get_file, sessions::put_file))
        .route(
            "/v1/sessions/{id}/files/{dir}/{*rest}",
            axum::routing::get(sessions::get_nested_file).put(sessions::put_nested_file),
        )
}

/// The routes anyone may call.
pub(crate) fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(crate::cluster::readyz))
        .routes(routes!(ops::openapi_json))
}
