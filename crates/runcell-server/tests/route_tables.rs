//! The route tables the generated reference lists (`runcell __reference names`) are the
//! router's: each listed method of each E2B route is routed (whatever its handler then
//! answers), and a method not listed gets 405. In-process, no sandbox.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use runcell_core::EngineConfig;
use runcell_server::{app, ApiKey, AppState, AuditLog, ServerConfig};
use tower::ServiceExt;

const KEY: &str = "0123456789abcdef0123";

#[tokio::test]
async fn every_listed_e2b_route_and_method_is_routed_and_no_other_method() {
    let mut config = ServerConfig::new(EngineConfig::for_host());
    config.api_keys = vec![ApiKey::new("key-1", KEY)];
    let router = app(AppState::new(&config, AuditLog::off()));
    let all = [
        Method::GET,
        Method::POST,
        Method::PUT,
        Method::DELETE,
        Method::PATCH,
    ];
    let routes = runcell_server::e2b::routes();
    assert!(!routes.is_empty());
    for (path, methods) in routes {
        // A parameter's value that names nothing: the handler answers, not the router.
        let concrete = path
            .split('/')
            .map(|s| if s.starts_with('{') { "nothing" } else { s })
            .collect::<Vec<_>>()
            .join("/");
        for method in &all {
            let listed = methods.contains(&method.as_str());
            let req = Request::builder()
                .method(method.clone())
                .uri(&concrete)
                .header("x-api-key", KEY)
                .header("content-type", "application/json")
                .body(Body::from("{"))
                .unwrap();
            let status = router.clone().oneshot(req).await.unwrap().status();
            if listed {
                assert_ne!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is listed but not routed"
                );
            } else {
                assert_eq!(
                    status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is routed but not listed in e2b's route table"
                );
            }
        }
    }
}
