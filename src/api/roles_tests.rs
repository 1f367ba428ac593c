//! The routes' roles held to `docs/openapi.yaml`, and applied: every documented operation
//! has the role of [`ROUTES`] as its `x-sluice-role` and the security requirements that
//! go with it, every route of the table is documented, and every documented route,
//! called through the whole router (in-process, an in-memory SQLite sysdb, no broker)
//! with no token, a wrong one, the read token and the admin token, under each
//! combination of configured tokens, answers as its role says. The same walk against a
//! real replica: `integration-tests/tests/it/http_roles.rs`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, StatusCode};
use axum::routing::get;
use serde_yaml::Value as Yaml;
use tower::ServiceExt;

use super::*;
use crate::api::{router, Admin, AppState, Health};
use crate::config::{Config, Secret};
use crate::metrics::Metrics;
use crate::sysdb::Sysdb;

const OPENAPI: &str = include_str!("../../docs/openapi.yaml");
const READ: &str = "read-t0ken-for-tests";
const ADMIN: &str = "admin-t0ken-for-tests";
const METHODS: [&str; 8] = ["get", "put", "post", "delete", "options", "head", "patch", "trace"];

/// One operation of the OpenAPI document.
#[derive(Debug, Clone)]
struct Operation {
    method: String,
    path: String,
    role: Role,
    doc: Yaml,
}

fn parse_role(s: &str) -> Option<Role> {
    [Role::Open, Role::Read, Role::Admin].into_iter().find(|r| r.as_str() == s)
}

/// Every operation of `docs/openapi.yaml`, each with its `x-sluice-role` (which it must
/// have).
fn documented() -> Vec<Operation> {
    let doc: Yaml = serde_yaml::from_str(OPENAPI).expect("docs/openapi.yaml is YAML");
    let paths = doc["paths"].as_mapping().expect("docs/openapi.yaml has paths");
    let mut ops = Vec::new();
    for (path, item) in paths {
        let path = path.as_str().expect("a path is a string");
        for method in METHODS {
            let Some(op) = item.get(method) else { continue };
            let role = op.get("x-sluice-role").and_then(Yaml::as_str).unwrap_or_else(|| {
                panic!(
                    "{} {path} in docs/openapi.yaml has no x-sluice-role (open, read or admin)",
                    method.to_uppercase()
                )
            });
            let role = parse_role(role).unwrap_or_else(|| {
                panic!("{} {path}: x-sluice-role {role:?} is not open, read or admin", method.to_uppercase())
            });
            ops.push(Operation { method: method.to_uppercase(), path: path.to_string(), role, doc: op.clone() });
        }
    }
    assert!(ops.len() >= ROUTES.len(), "only {} operations found in docs/openapi.yaml", ops.len());
    ops
}

/// The names of the security schemes of each alternative of an operation's `security`.
fn security(op: &Operation) -> Vec<Vec<String>> {
    let alternatives = op.doc.get("security").and_then(Yaml::as_sequence).unwrap_or_else(|| {
        panic!("{} {} in docs/openapi.yaml states no security (open routes: `security: []`)", op.method, op.path)
    });
    alternatives
        .iter()
        .map(|alt| {
            let schemes = alt.as_mapping().expect("a security requirement is a mapping");
            schemes.keys().map(|k| k.as_str().expect("a scheme name").to_string()).collect()
        })
        .collect()
}

#[test]
fn every_documented_operation_has_the_role_of_the_table_and_every_route_is_documented() {
    let ops = documented();
    for op in &ops {
        let what = format!("{} {}", op.method, op.path);
        let method = axum::http::Method::from_bytes(op.method.as_bytes()).unwrap();
        assert_eq!(
            role_of(&method, &op.path),
            Some(op.role),
            "{what}: docs/openapi.yaml says x-sluice-role {}, src/api/roles.rs ROUTES says otherwise",
            op.role.as_str()
        );
        let want: Vec<Vec<String>> = match op.role {
            Role::Open => vec![],
            Role::Read => vec![vec!["readToken".into()], vec!["adminToken".into()]],
            Role::Admin => vec![vec!["adminToken".into()]],
        };
        assert_eq!(security(op), want, "{what}: the security of a {} route", op.role.as_str());
        let responses = op.doc["responses"].as_mapping().expect("responses");
        let has = |code: &str| responses.contains_key(Yaml::String(code.into()));
        assert_eq!(
            has("401"),
            op.role != Role::Open,
            "{what}: a 401 response is documented exactly for read and admin routes"
        );
        assert_eq!(has("403"), op.role == Role::Admin, "{what}: a 403 response is documented exactly for admin routes");
    }
    for (method, path, role) in ROUTES {
        assert!(
            ops.iter().any(|op| op.method == *method && op.path == *path),
            "{method} {path} ({}) is in src/api/roles.rs ROUTES but not in docs/openapi.yaml",
            role.as_str()
        );
    }
    let doc: Yaml = serde_yaml::from_str(OPENAPI).unwrap();
    for scheme in ["readToken", "adminToken"] {
        let s = &doc["components"]["securitySchemes"][scheme];
        assert_eq!((s["type"].as_str(), s["scheme"].as_str()), (Some("http"), Some("bearer")), "{scheme}: {s:?}");
    }
}

fn config(read: Option<&str>, admin: Option<&str>) -> Config {
    let mut c = Config::default();
    c.kafka.brokers = "127.0.0.1:1".into();
    c.kafka.topic_prefix = "roles-test".into();
    // Reads that ask the broker (offsets, the DLQ) give up quickly: any answer but 401 or
    // 403 is what this test wants from them.
    c.kafka.request_timeout_ms = 300;
    c.http.read_token = read.map(Secret::new);
    c.http.admin_token = admin.map(Secret::new);
    c
}

async fn app(read: Option<&str>, admin: Option<&str>) -> axum::Router {
    let sysdb = Sysdb::open("sqlite::memory:").await.unwrap();
    sysdb.init_position("roles-test.log", 0, 0).await.unwrap();
    let admin = Admin::new(config(read, admin), Arc::new(sysdb)).unwrap();
    router(AppState { metrics: Metrics::new(), health: Health::new(), admin: Some(Arc::new(admin)) })
}

/// What a request answers: `(status, WWW-Authenticate, error code, message)`.
async fn call(
    app: &axum::Router,
    method: &str,
    uri: &str,
    token: Option<&str>,
) -> (StatusCode, String, String, String) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    // Not JSON: a change that gets past its role stops at its body, before it changes or
    // produces anything.
    let body = if method == "POST" { Body::from("not json") } else { Body::empty() };
    let resp = app.clone().oneshot(req.body(body).unwrap()).await.unwrap();
    let status = resp.status();
    let challenge = resp.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_string()).unwrap_or_default();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let text = |k: &str| v[k].as_str().unwrap_or_default().to_string();
    (status, challenge, text("error"), text("message"))
}

/// What a request should answer, as a class.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// Anything but 401 and 403: the request reached its handler.
    Served,
    Unauthorized,
    Forbidden,
}

/// The documented rule (docs/operations.md, "Roles and tokens"), written out again here
/// rather than calling `Access::check`, so that the two are compared.
fn expected(role: Role, read_set: bool, admin_set: bool, token: Option<&str>) -> Answer {
    let shown_read = read_set && token == Some(READ);
    let shown_admin = admin_set && token == Some(ADMIN);
    match role {
        _ if !read_set && !admin_set => Answer::Served,
        Role::Open => Answer::Served,
        Role::Read if shown_read || shown_admin => Answer::Served,
        Role::Read => Answer::Unauthorized,
        Role::Admin if !admin_set || shown_read => Answer::Forbidden,
        Role::Admin if shown_admin => Answer::Served,
        Role::Admin => Answer::Unauthorized,
    }
}

fn classify(got: &(StatusCode, String, String, String)) -> Answer {
    match got.0 {
        StatusCode::UNAUTHORIZED => Answer::Unauthorized,
        StatusCode::FORBIDDEN => Answer::Forbidden,
        _ => Answer::Served,
    }
}

#[tokio::test]
async fn every_documented_route_answers_each_token_as_its_role_says() {
    let ops = documented();
    let mut checked = 0;
    for (read, admin) in [(None, None), (Some(READ), Some(ADMIN)), (None, Some(ADMIN)), (Some(READ), None)] {
        let app = app(read, admin).await;
        for op in &ops {
            // Path parameters: an id nothing has (a 404 is as good as a 200 here).
            let uri = op.path.replace("{id}", "no-such-id");
            for token in [None, Some("wrong-token"), Some(READ), Some(ADMIN)] {
                let got = call(&app, &op.method, &uri, token).await;
                let want = expected(op.role, read.is_some(), admin.is_some(), token);
                let what = format!(
                    "{} {uri} ({} route) with read_token {read:?}, admin_token {admin:?}, showing {token:?}: {got:?}",
                    op.method,
                    op.role.as_str()
                );
                assert_eq!(classify(&got), want, "{what}");
                match want {
                    Answer::Unauthorized => {
                        assert_eq!((got.1.as_str(), got.2.as_str()), ("Bearer", "unauthorized"), "{what}")
                    }
                    Answer::Forbidden => assert_eq!(got.2, "forbidden", "{what}"),
                    // Past the guard: not its refusal of a route without a role.
                    Answer::Served => assert!(!got.3.contains("has no role"), "{what}"),
                }
                checked += 1;
            }
        }
    }
    assert_eq!(checked, ops.len() * 16);
}

#[tokio::test]
async fn head_is_a_read_and_unknown_paths_and_methods_stay_404_and_405_without_a_token() {
    let app = app(Some(READ), Some(ADMIN)).await;
    assert_eq!(call(&app, "HEAD", "/api/v1/collections", None).await.0, StatusCode::UNAUTHORIZED);
    assert_eq!(call(&app, "HEAD", "/api/v1/collections", Some(READ)).await.0, StatusCode::OK);
    let nope = call(&app, "GET", "/api/v1/nope", None).await;
    assert_eq!((nope.0, nope.2.as_str()), (StatusCode::NOT_FOUND, "not_found"), "{nope:?}");
    let put = call(&app, "PUT", "/api/v1/collections", None).await;
    assert_eq!((put.0, put.2.as_str()), (StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed"), "{put:?}");
    assert_eq!(call(&app, "GET", "/metrics", None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn a_route_without_a_role_is_refused_whatever_the_token() {
    for access in [Access::default(), Access::new(Some(READ), Some(ADMIN))] {
        let app = guarded(
            axum::Router::new()
                .route("/metrics", get(|| async { "scraped" }).post(|| async { "changed without a role" }))
                .route("/api/v1/secrets", get(|| async { "every record" })),
            access,
        );
        for token in [None, Some(READ), Some(ADMIN)] {
            let req = |uri: &str| {
                let mut r = Request::builder().uri(uri);
                if let Some(t) = token {
                    r = r.header("authorization", format!("Bearer {t}"));
                }
                r.body(Body::empty()).unwrap()
            };
            let resp = app.clone().oneshot(req("/api/v1/secrets")).await.unwrap();
            assert_eq!(resp.status(), StatusCode::INTERNAL_SERVER_ERROR, "{access:?} {token:?}");
            let body = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
            let text = String::from_utf8_lossy(&body);
            assert!(text.contains("GET /api/v1/secrets has no role in src/api/roles.rs"), "{text}");
            assert!(!text.contains("every record"), "{text}");
            // A route of the table beside it is served.
            assert_eq!(app.clone().oneshot(req("/metrics")).await.unwrap().status(), StatusCode::OK);
            // A method the table does not give a known path does not reach a handler.
            let mut post = req("/metrics");
            *post.method_mut() = axum::http::Method::POST;
            assert_eq!(app.clone().oneshot(post).await.unwrap().status(), StatusCode::METHOD_NOT_ALLOWED);
        }
    }
}
