//! The API's routes, one module per resource, each handler with its OpenAPI description.

pub mod execute;
pub mod ops;

use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::state::AppState;

/// The routes that need a key, with their OpenAPI description.
pub(crate) fn authenticated() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(execute::execute))
        .routes(routes!(ops::runtimes))
        .routes(routes!(ops::metrics))
}

/// The routes anyone may call.
pub(crate) fn public() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(ops::healthz))
        .routes(routes!(ops::openapi_json))
}
