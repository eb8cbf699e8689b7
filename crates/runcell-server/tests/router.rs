//! The router in-process (no socket, no sandbox): authentication, error bodies, limits and
//! admission. Runs that reach the engine are tested over real HTTP in
//! `crates/runcell/tests/http.rs`.

use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use runcell_core::EngineConfig;
use runcell_server::{app, ApiKey, AppState, AuditLog, ServerConfig};
use serde_json::Value;
use tower::ServiceExt;

fn config(keys: &[&str]) -> ServerConfig {
    let mut c = ServerConfig::new(EngineConfig::for_host());
    c.api_keys = keys
        .iter()
        .enumerate()
        .map(|(i, k)| ApiKey::new(format!("key-{}", i + 1), *k))
        .collect();
    c
}

fn router(c: &ServerConfig) -> Router {
    app(AppState::new(c, AuditLog::off()))
}

async fn send(r: &Router, req: Request<Body>) -> (StatusCode, axum::http::HeaderMap, Value) {
    let res = r.clone().oneshot(req).await.expect("infallible");
    let status = res.status();
    let headers = res.headers().clone();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): {}",
            String::from_utf8_lossy(&bytes)
        )
    });
    (status, headers, json)
}

fn get(path: &str) -> Request<Body> {
    Request::get(path).body(Body::empty()).unwrap()
}

fn post(body: impl Into<Body>) -> Request<Body> {
    Request::post("/v1/execute").body(body.into()).unwrap()
}

fn assert_error(json: &Value, category: &str) -> String {
    assert_eq!(json["error"]["category"], category, "{json}");
    let msg = json["error"]["message"]
        .as_str()
        .expect("message")
        .to_string();
    assert!(!msg.is_empty());
    msg
}

#[tokio::test]
async fn healthz_is_public_and_the_api_needs_a_key() {
    let r = router(&config(&["k1", "k2"]));
    let (s, _, j) = send(&r, get("/healthz")).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(
        j,
        serde_json::json!({"status": "ok", "sandboxes_running": 0})
    );
    let (s, _, _) = send(&r, get("/openapi.json")).await;
    assert_eq!(s, StatusCode::OK, "the API's description is public");

    let (s, h, j) = send(&r, get("/v1/runtimes")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert!(h.contains_key("www-authenticate"));
    assert_error(&j, "unauthorized");

    let wrong = Request::get("/v1/runtimes")
        .header("authorization", "Bearer k3")
        .body(Body::empty())
        .unwrap();
    let (s, _, j) = send(&r, wrong).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    let msg = assert_error(&j, "unauthorized");
    assert!(!msg.contains("k3"), "the key is echoed: {msg}");

    // A key does not get a body past authentication either.
    let (s, _, j) = send(&r, post(r#"{"language":"python","code":"print(1)"}"#)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_error(&j, "unauthorized");

    let (s, _, _) = send(&r, get("/metrics")).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED, "metrics need a key");

    for (name, value) in [("authorization", "Bearer k1"), ("x-api-key", "k2")] {
        let req = Request::get("/v1/runtimes")
            .header(name, value)
            .body(Body::empty())
            .unwrap();
        let (s, _, j) = send(&r, req).await;
        assert_eq!(s, StatusCode::OK, "{name}: {j}");
        assert_eq!(j["runtimes"].as_array().map(Vec::len), Some(5), "{j}");
    }
}

#[tokio::test]
async fn runtimes_lists_languages_and_limits() {
    let r = router(&config(&[]));
    let (s, _, j) = send(&r, get("/v1/runtimes")).await;
    assert_eq!(s, StatusCode::OK);
    let names: Vec<&str> = j["runtimes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["language"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["python", "node", "ruby", "go", "bash"]);
    for l in j["runtimes"].as_array().unwrap() {
        assert!(l["available"].is_boolean(), "{l}");
    }
    assert_eq!(j["limits"]["default"]["timeout_ms"], 30_000);
    assert!(j["limits"]["maximum"]["memory_bytes"].as_u64().unwrap() >= 256 << 20);
}

#[tokio::test]
async fn unknown_routes_and_methods_are_json_errors() {
    let r = router(&config(&[]));
    let (s, _, j) = send(&r, get("/nope")).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_error(&j, "not_found");
    let (s, h, j) = send(&r, get("/v1/execute")).await;
    assert_eq!(s, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(h["allow"], "POST");
    assert_error(&j, "method_not_allowed");
}

#[tokio::test]
async fn malformed_and_mistyped_bodies_are_400() {
    let r = router(&config(&[]));
    for body in [
        "",
        "{",
        "not json",
        "[]",
        "null",
        r#"{"language":"python"}"#,
        r#"{"language":1,"code":"print(1)"}"#,
        r#"{"language":"python","code":["print(1)"]}"#,
        r#"{"language":"python","code":"print(1)","timeout":"soon"}"#,
        r#"{"language":"python","code":"print(1)","timeout":-3}"#,
        r#"{"language":"python","code":"print(1)","memory":true}"#,
        r#"{"language":"python","code":"print(1)","pids":1.5}"#,
        r#"{"language":"python","code":"print(1)","cpus":"one"}"#,
        r#"{"language":"python","code":"print(1)","files":"a.txt"}"#,
        r#"{"language":"python","code":"print(1)","colour":"blue"}"#,
        r#"{"language":"cobol","code":"DISPLAY 1"}"#,
    ] {
        let (s, _, j) = send(&r, post(body)).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {j}");
        assert_error(&j, "invalid_request");
    }
    // Not UTF-8 at all.
    let (s, _, j) = send(&r, post(Bytes::from_static(b"\xff\xfe{}"))).await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert_error(&j, "invalid_request");
}

#[tokio::test]
async fn limits_above_the_maximum_name_the_limit_and_the_maximum() {
    let c = config(&[]);
    let max = c.engine.policy.max;
    let r = router(&c);
    for (body, limit) in [
        (
            format!(
                r#"{{"language":"python","code":"","memory":{}}}"#,
                max.memory.0 + 1
            ),
            "memory",
        ),
        (
            r#"{"language":"python","code":"","timeout":86400}"#.into(),
            "timeout",
        ),
        (
            r#"{"language":"python","code":"","pids":1000000}"#.into(),
            "pids",
        ),
        (
            r#"{"language":"python","code":"","disk":"1T"}"#.into(),
            "disk",
        ),
        (
            r#"{"language":"python","code":"","cpus":4096}"#.into(),
            "cpus",
        ),
        (
            r#"{"language":"python","code":"","output":"1G"}"#.into(),
            "output",
        ),
        (
            r#"{"language":"python","code":"","open_files":10000000}"#.into(),
            "open_files",
        ),
    ] {
        let (s, _, j) = send(&r, post(body.clone())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {j}");
        let msg = assert_error(&j, "invalid_request");
        assert_eq!(j["error"]["limit"], limit, "{j}");
        assert!(
            msg.contains(limit) && msg.contains("above the maximum of"),
            "{body}: {msg}"
        );
    }
    let (s, _, j) = send(
        &r,
        post(r#"{"language":"python","code":"","timeout":0.001}"#),
    )
    .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    assert!(assert_error(&j, "invalid_request").contains("below the minimum"));
}

#[tokio::test]
async fn oversized_bodies_are_413() {
    let mut c = config(&[]);
    c.max_body_bytes = 1000;
    let r = router(&c);
    let big = format!(
        r#"{{"language":"python","code":"print(1)","stdin":"{}"}}"#,
        "x".repeat(2000)
    );
    // With a Content-Length (refused before reading) ...
    let req = Request::post("/v1/execute")
        .header("content-length", big.len())
        .body(Body::from(big.clone()))
        .unwrap();
    let (s, _, j) = send(&r, req).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&j, "payload_too_large");
    // ... and streamed without one (refused once the cap is crossed).
    let chunks: Vec<Result<Bytes, std::io::Error>> = big
        .as_bytes()
        .chunks(100)
        .map(|c| Ok(Bytes::copy_from_slice(c)))
        .collect();
    let req = post(Body::from_stream(futures_util::stream::iter(chunks)));
    let (s, _, j) = send(&r, req).await;
    assert_eq!(s, StatusCode::PAYLOAD_TOO_LARGE);
    assert_error(&j, "payload_too_large");
}

// The clock is paused: a sleep ends only when every other task is idle, not after wall time.
#[tokio::test(start_paused = true)]
async fn beyond_the_running_and_queued_slots_is_429() {
    let mut c = config(&[]);
    c.max_concurrent = 1;
    c.max_queue = 1;
    let r = router(&c);
    // Two requests whose bodies never finish hold both slots (admission comes before the
    // body is read).
    let mut holders = Vec::new();
    let mut senders = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
        let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }));
        tx.send(Ok(Bytes::from_static(b"{"))).await.unwrap();
        senders.push(tx);
        let r = r.clone();
        holders.push(tokio::spawn(async move { r.oneshot(post(body)).await }));
    }
    // With the clock paused this returns once both holders are parked on their bodies, i.e.
    // admitted (the metrics gauges count sandboxes, not admissions, so cannot tell).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (s, h, j) = send(&r, post(r#"{"language":"python","code":"print(1)"}"#)).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{j}");
    assert_eq!(h["retry-after"], "1");
    assert_error(&j, "rate_limited");
    // Releasing the slots (the bodies end, malformed) lets requests in again.
    drop(senders);
    for h in holders {
        let res = h.await.unwrap().unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    }
    let (s, _, j) = send(&r, post(r#"{"language":"python","code":"","pids":0}"#)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    assert!(assert_error(&j, "invalid_request").contains("pids"));
}

#[test]
fn debug_output_never_shows_keys() {
    let c = config(&["supersecret"]);
    let dbg = format!("{c:?}");
    assert!(!dbg.contains("supersecret"), "{dbg}");
    assert!(dbg.contains("redacted"));
}

#[test]
fn the_default_body_cap_fits_the_largest_allowed_input() {
    let c = config(&[]);
    let p = &c.engine.policy;
    assert!(
        c.max_body_bytes as u64
            >= p.max_code_bytes + p.max_stdin_bytes + p.max_input_total_bytes * 4 / 3
    );
}

#[tokio::test]
async fn serve_refuses_a_public_address_without_a_key() {
    let mut c = config(&[]);
    c.listen = "0.0.0.0:0".parse().unwrap();
    let e = runcell_server::serve(c).await.unwrap_err();
    assert!(e.to_string().contains("without an API key"), "{e}");
}

#[tokio::test]
async fn metrics_count_rejections_and_show_capacity() {
    let mut c = config(&["k1"]);
    c.max_concurrent = 3;
    c.max_queue = 5;
    let r = router(&c);
    send(&r, get("/v1/runtimes")).await;
    let bad = Request::post("/v1/execute")
        .header("x-api-key", "k1")
        .header("content-type", "application/json")
        .body(Body::from("{nope"))
        .unwrap();
    send(&r, bad).await;
    // What Prometheus sends: OpenMetrics first.
    let om = Request::get("/metrics")
        .header("x-api-key", "k1")
        .header(
            "accept",
            "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        )
        .body(Body::empty())
        .unwrap();
    let res = r.clone().oneshot(om).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("application/openmetrics-text"));
    assert!(res.headers().contains_key("x-request-id"));
    let text =
        String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap();
    assert!(text.ends_with("# EOF\n"));
    assert!(text.contains("# TYPE runcell_rejections counter"), "{text}");
    // Anything else (curl, text/plain): the classic format, whose counter TYPE lines name
    // the samples, without "# EOF".
    for accept in [None, Some("text/plain;version=0.0.4"), Some("*/*")] {
        let mut req = Request::get("/metrics").header("x-api-key", "k1");
        if let Some(a) = accept {
            req = req.header("accept", a);
        }
        let res = r
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        assert_eq!(
            res.headers()["content-type"].to_str().unwrap(),
            "text/plain; version=0.0.4; charset=utf-8",
            "{accept:?}"
        );
        let classic =
            String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec())
                .unwrap();
        assert!(!classic.contains("# EOF"), "{classic}");
        assert!(
            classic.contains("# TYPE runcell_rejections_total counter"),
            "{classic}"
        );
        for family in [
            "runcell_build_info{version=",
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_open_fds ",
            "process_start_time_seconds ",
        ] {
            assert!(classic.contains(family), "{family} in {classic}");
        }
        // Every family has HELP and TYPE (promtool's lint).
        for line in classic.lines().filter(|l| l.starts_with("# TYPE ")) {
            let name = line.split(' ').nth(2).unwrap();
            assert!(
                classic.contains(&format!("# HELP {name} ")),
                "no HELP for {name}"
            );
        }
    }
    for needle in [
        "runcell_rejections_total{reason=\"unauthorized\"} 1",
        "runcell_rejections_total{reason=\"invalid_request\"} 1",
        "runcell_sandboxes_running 0",
        "runcell_queue_depth 0",
        "runcell_max_concurrent 3",
        "runcell_max_queue 5",
    ] {
        assert!(text.contains(needle), "missing {needle}:\n{text}");
    }
}

/// Every route the server answers is in the OpenAPI document, and every path in the
/// document is served.
/// The operator's console: a page without data, behind a strict content security policy, over
/// an overview that only admin keys read (and anyone on a server without keys, which answers
/// loopback only).
#[tokio::test]
async fn the_console_page_is_locked_down_and_its_overview_needs_an_admin_key() {
    let mut c = config(&["k1", "boss"]);
    c.api_keys[1].admin = true;
    let r = router(&c);
    for (path, kind) in [
        ("/console", "text/html"),
        ("/console/app.js", "text/javascript"),
        ("/console/style.css", "text/css"),
    ] {
        let res = r.clone().oneshot(get(path)).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let h = res.headers();
        let csp = h["content-security-policy"].to_str().unwrap();
        assert!(csp.starts_with("default-src 'none'; script-src 'self'; style-src 'self';"));
        assert!(csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'none'"));
        assert!(!csp.contains("unsafe"));
        assert!(
            h["content-type"].to_str().unwrap().starts_with(kind),
            "{path}"
        );
        assert_eq!(h["x-content-type-options"], "nosniff");
        assert_eq!(h["referrer-policy"], "no-referrer");
        assert_eq!(h["cache-control"], "no-store");
    }
    let overview = |key: Option<&'static str>| {
        let mut req = Request::get("/v1/admin/overview");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        req.body(Body::empty()).unwrap()
    };
    let (s, _, j) = send(&r, overview(None)).await;
    assert_eq!(s, StatusCode::UNAUTHORIZED);
    assert_error(&j, "unauthorized");
    let (s, _, j) = send(&r, overview(Some("k1"))).await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert!(assert_error(&j, "forbidden").contains("admin key"));
    let (s, _, j) = send(&r, overview(Some("boss"))).await;
    assert_eq!(s, StatusCode::OK, "{j}");
    for field in ["runs", "sessions", "recent_runs", "approvals", "pool"] {
        assert!(j[field].is_array(), "{field}: {j}");
    }
    assert_eq!(j["metrics"]["sandboxes_running"], 0);
    assert!(j["metrics"]["executions"].is_object(), "{j}");
    assert!(
        j["metrics"]["rejections"]["unauthorized"].as_u64() >= Some(1),
        "{j}"
    );
    assert!(j["templates"]["live"].is_u64(), "{j}");
    // Without keys (loopback only), any local caller reads it.
    let (s, _, j) = send(&router(&config(&[])), overview(None)).await;
    assert_eq!(s, StatusCode::OK, "{j}");
}

#[tokio::test]
async fn the_openapi_document_covers_every_route() {
    let r = router(&config(&["k1"]));
    let (s, _, doc) = send(&r, get("/openapi.json")).await;
    assert_eq!(s, StatusCode::OK);
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."), "{doc}");
    let paths = doc["paths"].as_object().unwrap();
    let expected = [
        ("/v1/execute", "post"),
        ("/v1/runtimes", "get"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        ("/mcp", "post"),
        ("/v1/sessions", "post"),
        ("/v1/agents", "post"),
        ("/v1/agents/chat/completions", "post"),
        ("/v1/approvals", "get"),
        ("/v1/approvals/{id}", "post"),
        ("/v1/admin/overview", "get"),
        ("/v1/sessions/{id}", "get"),
        ("/v1/sessions/{id}/execute", "post"),
        ("/v1/sessions/{id}/files", "get"),
        ("/v1/sessions/{id}/files/{path}", "put"),
        ("/v1/sessions/{id}/fork", "post"),
        ("/v1/sessions/{id}/pause", "post"),
        ("/v1/sessions/{id}/resume", "post"),
    ];
    for (path, method) in expected {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} missing"
        );
    }
    assert_eq!(
        paths.len(),
        expected.len(),
        "undocumented extra paths: {paths:?}"
    );
    // Every response is described (OpenAPI requires it; openapi-spec-validator fails without).
    for (path, item) in paths {
        for (method, op) in item.as_object().unwrap() {
            for (code, r) in op["responses"].as_object().unwrap() {
                assert!(
                    r["description"].is_string(),
                    "{method} {path} {code} has no description"
                );
            }
        }
    }
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let req = Request::builder()
                .method(method.to_uppercase().as_str())
                .uri(path.as_str())
                .header("x-api-key", "k1")
                .body(Body::from("{}"))
                .unwrap();
            let res = r.clone().oneshot(req).await.unwrap();
            let s = res.status();
            let body = axum::body::to_bytes(res.into_body(), 1 << 20)
                .await
                .unwrap();
            let text = String::from_utf8_lossy(&body);
            // A route that is served answers something else than "no such route"; a session
            // path answers 404 for the session it does not know ("No session {id}").
            let unknown_resource = s == StatusCode::NOT_FOUND && text.contains("No session");
            assert!(
                (s != StatusCode::NOT_FOUND || unknown_resource)
                    && s != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is documented but not served: {s} {text}"
            );
        }
    }
    // The "no such endpoint" answer names every route's first two segments, so a client that
    // got a path wrong learns the right one.
    let (s, _, j) = send(
        &r,
        Request::get("/v1/nope")
            .header("x-api-key", "k1")
            .body(Body::empty())
            .unwrap(),
    )
    .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let msg = assert_error(&j, "not_found");
    for path in paths.keys() {
        let prefix: String = path
            .split('/')
            .filter(|p| !p.is_empty())
            .take(2)
            .map(|p| format!("/{p}"))
            .collect();
        assert!(msg.contains(&prefix), "{prefix} is not named in: {msg}");
    }
    // The schemas the handlers use are in it, generated from the types.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for name in [
        "ExecRequest",
        "Verdict",
        "ErrorBody",
        "RuntimesResponse",
        "Limits",
        "InputFile",
    ] {
        assert!(schemas.contains_key(name), "schema {name} missing");
    }
    let verdict = &schemas["Verdict"]["properties"];
    for field in [
        "stdout",
        "stderr",
        "exit_code",
        "error",
        "usage",
        "files",
        "execution_time",
    ] {
        assert!(verdict.get(field).is_some(), "Verdict.{field} missing");
    }
    let body = &schemas["ExecRequest"];
    assert_eq!(body["required"], serde_json::json!(["language", "code"]));
    // The limits are the request's own fields, with the names verdicts use.
    for limit in [
        "timeout",
        "memory",
        "cpus",
        "pids",
        "disk",
        "output",
        "open_files",
    ] {
        assert!(body["properties"][limit].is_object(), "ExecRequest.{limit}");
    }
    assert_eq!(
        body["properties"]["files"]["items"]["$ref"],
        "#/components/schemas/InputFile"
    );
    // What this server's policy bounds is in the request schemas it serves, so that a
    // request valid by the document is one it accepts (schemathesis checks that both ways).
    let file = &schemas["InputFile"];
    assert_eq!(file["oneOf"].as_array().map(Vec::len), Some(2), "{file}");
    assert_eq!(file["properties"]["path"]["minLength"], 1);
    for request in ["ExecRequest", "SessionRequest"] {
        let props = &schemas[request]["properties"];
        // This server allows no network and no packages.
        assert_eq!(
            props["network"]["properties"]["allow"]["maxItems"], 0,
            "{request}"
        );
        assert_eq!(props["packages"]["maxItems"], 0, "{request}");
        assert!(
            props["memory"]["maximum"].is_u64(),
            "{request}: {}",
            props["memory"]
        );
    }
    assert!(schemas["SessionRequest"]["properties"]["ttl"]["maximum"].is_number());
    assert!(schemas["CellRequest"]["properties"]["timeout"]["maximum"].is_number());
    let agents = &paths["/v1/agents"]["post"];
    let agent_request = &agents["requestBody"]["content"]["application/json"]["schema"];
    assert_eq!(
        agent_request["required"],
        serde_json::json!(["messages", "tools"])
    );
    let streamed =
        &paths["/v1/execute"]["post"]["responses"]["200"]["content"]["text/event-stream"]["schema"];
    assert_eq!(
        streamed["oneOf"].as_array().map(Vec::len),
        Some(3),
        "{streamed}"
    );
    assert_eq!(
        paths["/v1/sessions/{id}/files/{path}"]["put"]["requestBody"]["required"],
        false
    );
    let limits = &schemas["Limits"]["properties"];
    assert!(limits["memory"].is_object() && limits["memory_bytes"]["deprecated"] == true);
    let schemes = doc["components"]["securitySchemes"].as_object().unwrap();
    assert!(schemes.contains_key("bearer") && schemes.contains_key("api_key"));
}

/// Without keys the server is for local clients only: a web page the user visits must not be
/// able to run code through it, by DNS rebinding (its own name as `Host`) or by a
/// cross-origin "simple" POST (no preflight for `text/plain`).
#[tokio::test]
async fn without_a_key_browsers_of_other_sites_are_refused() {
    let r = router(&config(&[]));
    let body = r#"{"language":"python","code":"","pids":0}"#;
    for (host, origin) in [
        ("evil.example:8080", None),
        ("127.0.0.1:8080", Some("http://evil.example")),
        ("localhost:8080", Some("null")),
    ] {
        for (method, path) in [
            ("POST", "/v1/execute"),
            ("GET", "/v1/runtimes"),
            ("GET", "/metrics"),
        ] {
            let mut req = Request::builder()
                .method(method)
                .uri(path)
                .header("host", host)
                .header("content-type", "text/plain");
            if let Some(o) = origin {
                req = req.header("origin", o);
            }
            let (s, _, j) = send(&r, req.body(Body::from(body)).unwrap()).await;
            assert_eq!(
                s,
                StatusCode::FORBIDDEN,
                "{method} {path} {host} {origin:?}: {j}"
            );
            assert_error(&j, "forbidden");
        }
    }
    // Local clients, browsers on a local page included, are served.
    for (host, origin) in [
        ("127.0.0.1:8080", None),
        ("localhost:8080", Some("http://localhost:3000")),
    ] {
        let mut req = Request::post("/v1/execute").header("host", host);
        if let Some(o) = origin {
            req = req.header("origin", o);
        }
        let (s, _, j) = send(&r, req.body(Body::from(body)).unwrap()).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{host}: {j}");
        assert!(assert_error(&j, "invalid_request").contains("pids"));
    }
    // With a key, the key is the guard.
    let r = router(&config(&["k1"]));
    let req = Request::get("/v1/runtimes")
        .header("host", "runcell.example.com")
        .header("origin", "https://agents.example.com")
        .header("x-api-key", "k1")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&r, req).await.0, StatusCode::OK);
}

/// An input file path longer than allowed, made of multi-byte characters, used to panic the
/// engine (its message cut a character in two): a 500. It is a 400 like any bad path.
#[tokio::test]
async fn bad_input_file_paths_are_400_never_500() {
    let r = router(&config(&[]));
    for path in [format!("a{}", "é".repeat(600)), "é".repeat(1000)] {
        let body = serde_json::json!({"language": "bash", "code": "true",
            "files": [{"path": path, "content": "x"}]});
        let (s, _, j) = send(&r, post(body.to_string())).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
        assert!(
            assert_error(&j, "invalid_request").contains("too long"),
            "{j}"
        );
    }
    let body = r#"{"language":"bash","code":"true","files":[{"path":"a","content":"x"},{"path":"a/b","content":"y"}]}"#;
    let (s, _, j) = send(&r, post(body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    assert_error(&j, "invalid_request");
}

/// The engine validates a request once, input files included, before it waits for a slot and
/// before a stream's 200 is sent: a bad file is a 400 with or without an event stream (before
/// the engine's validation was the server's pre-check, files came back as a `result` event).
#[tokio::test]
async fn a_stream_is_refused_before_it_starts() {
    let r = router(&config(&[]));
    for body in [
        r#"{"language":"bash","code":"true","files":[{"path":"../x","content":"x"}]}"#,
        r#"{"language":"bash","code":"true","files":[{"path":"x","content_base64":"%%%"}]}"#,
        r#"{"language":"bash","code":"true","memory":"1T"}"#,
    ] {
        let req = Request::post("/v1/execute")
            .header("accept", "text/event-stream")
            .body(Body::from(body))
            .unwrap();
        let (s, h, j) = send(&r, req).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{body}: {j}");
        assert!(
            h["content-type"]
                .to_str()
                .unwrap()
                .starts_with("application/json"),
            "{body}"
        );
        assert_error(&j, "invalid_request");
    }
}

fn pending_body() -> (
    tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    Body,
) {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(1);
    let body = Body::from_stream(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    (tx, body)
}

fn mcp_post(body: Body) -> Request<Body> {
    Request::post("/mcp")
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body)
        .unwrap()
}

/// A JSON-RPC message that never finishes arriving gets the same deadline as an execute body
/// (it used to be waited for forever, holding what had arrived).
#[tokio::test(start_paused = true)]
async fn mcp_bodies_that_never_finish_get_408() {
    let r = router(&config(&[]));
    let (tx, body) = pending_body();
    tx.send(Ok(Bytes::from_static(b"{\"jsonrpc\":")))
        .await
        .unwrap();
    let res = tokio::time::timeout(Duration::from_secs(3600), r.clone().oneshot(mcp_post(body)))
        .await
        .expect("the body was waited for forever")
        .unwrap();
    assert_eq!(res.status(), StatusCode::REQUEST_TIMEOUT);
    let j: Value =
        serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_error(&j, "request_timeout");
    drop(tx);
}

/// MCP bodies being received share a budget (the room of `max_concurrent + max_queue` bodies):
/// beyond it, 429, so that many bodies trickled in cannot fill the server's memory.
#[tokio::test(start_paused = true)]
async fn mcp_bodies_being_received_are_bounded() {
    let mut c = config(&[]);
    c.max_concurrent = 1;
    c.max_queue = 0;
    c.max_body_bytes = 1000;
    let r = router(&c);
    let (tx, body) = pending_body();
    let held = tokio::spawn(r.clone().oneshot(mcp_post(body)));
    tx.send(Ok(Bytes::from(vec![b' '; 900]))).await.unwrap();
    // The 900 bytes are taken (the channel has room again once they are read).
    tx.send(Ok(Bytes::from_static(b" "))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(10)).await;
    let req = mcp_post(Body::from(vec![b' '; 200]));
    let (s, h, j) = send(&r, req).await;
    assert_eq!(s, StatusCode::TOO_MANY_REQUESTS, "{j}");
    assert_eq!(h["retry-after"], "1");
    assert_error(&j, "rate_limited");
    // Once the first body is over, its room is free again.
    drop(tx);
    let _ = held.await.unwrap().unwrap();
    let (s, _, j) = send(&r, mcp_post(Body::from(vec![b' '; 200]))).await;
    assert_ne!(s, StatusCode::TOO_MANY_REQUESTS, "{j}");
}

/// A connection that never completes a request head is closed (it used to stay open forever:
/// enough of them, no key needed, and the server is out of file descriptors).
#[tokio::test(start_paused = true)]
async fn connections_that_never_send_a_request_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = router(&config(&["k1"]));
    let (stop_tx, server) = serve_until_stopped(listener, r);
    // A complete request is answered ...
    let mut ok = tokio::net::TcpStream::connect(addr).await.unwrap();
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    ok.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    // ... a trickled head and an idle connection are closed.
    let mut slow = tokio::net::TcpStream::connect(addr).await.unwrap();
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        .await
        .unwrap();
    let mut idle = tokio::net::TcpStream::connect(addr).await.unwrap();
    for conn in [&mut slow, &mut idle] {
        let mut buf = Vec::new();
        let read =
            tokio::time::timeout(Duration::from_secs(3600), conn.read_to_end(&mut buf)).await;
        assert!(read.is_ok(), "the connection was kept open");
    }
    stop_tx.send(()).unwrap();
    server.await.unwrap();
}

/// Serve `router` on `listener` without connection caps until the sender is used.
fn serve_until_stopped(
    listener: tokio::net::TcpListener,
    router: Router,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(runcell_server::serve_connections(
        listener,
        router,
        async {
            let _ = stop_rx.await;
        },
        runcell_server::connections::ConnectionLimits::unlimited(),
        |_| {},
    ));
    (stop_tx, server)
}

/// A client that stops reading its response has its connection closed once the writes have
/// made no progress for a while (it used to keep it, and what was buffered for it, forever).
#[tokio::test(start_paused = true)]
async fn connections_that_stop_reading_are_closed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const SIZE: usize = 64 << 20;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let r = Router::new().route("/big", axum::routing::get(|| async { vec![b'x'; SIZE] }));
    let (stop_tx, server) = serve_until_stopped(listener, r);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut conn = socket.connect(addr).await.unwrap();
    conn.write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // The client reads nothing for ten minutes ...
    tokio::time::sleep(Duration::from_secs(600)).await;
    // ... and then gets what was buffered, not the rest.
    let mut got = 0;
    let mut buf = vec![0; 1 << 20];
    loop {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => got += n,
        }
    }
    assert!(got < SIZE, "the whole response was kept for the client");
    stop_tx.send(()).unwrap();
    server.await.unwrap();
}

/// The file-table bound is a 400 naming `open_files`, like any limit.
#[tokio::test]
async fn pids_times_open_files_is_bounded() {
    let r = router(&config(&[]));
    // (open_files within every host's hard limit: the product is what is too large.)
    let body = r#"{"language":"bash","code":"true","pids":4096,"open_files":1000}"#;
    let (s, _, j) = send(&r, post(body)).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{j}");
    assert!(assert_error(&j, "invalid_request").contains("pids × open_files"));
    assert_eq!(j["error"]["limit"], "open_files");
}
