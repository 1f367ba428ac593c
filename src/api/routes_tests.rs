//! The admin API driven through the whole router with `tower::ServiceExt::oneshot`, on an
//! in-memory SQLite sysdb and no broker (the producer points at a closed port; nothing
//! here produces). Producing and attaching against a real broker and replica:
//! `integration-tests/tests/it/admin_api.rs`.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Method, Request, StatusCode};
use serde_json::Value;
use tower::ServiceExt;

use super::*;
use crate::api::{router, AppState, Health};
use crate::config::Config;
use crate::config::Secret;
use crate::metrics::Metrics;
use crate::positions::PositionDelta;
use crate::record::{MetaValue, Metadata, Record};
use crate::sysdb::Sysdb;
use crate::sysdb::{BatchCommit, CollectionUpdate};

const TOKEN: &str = "t0ken-for-tests";

fn config(token: Option<&str>) -> Config {
    let mut c = Config::default();
    c.kafka.brokers = "127.0.0.1:1".into();
    c.kafka.topic_prefix = "admin-test".into();
    c.http.admin_token = token.map(Secret::new);
    c
}

/// A sysdb holding collection `c` with `n` records `r000`, `r001`, ... (dimension 2).
async fn sysdb_with(n: usize) -> Arc<Sysdb> {
    let db = Sysdb::open("sqlite::memory:").await.unwrap();
    let topic = "admin-test.log";
    db.init_position(topic, 0, 0).await.unwrap();
    let writes = (0..n)
        .map(|i| {
            let mut metadata = Metadata::new();
            metadata.insert("i".into(), MetaValue::Long(i as i64));
            let r = Record {
                id: format!("r{i:03}"),
                embedding: Some(vec![i as f32, 1.0].into()),
                metadata,
                document: None,
                offset: i as i64,
            };
            (r.id.clone(), Some(r))
        })
        .collect();
    let batch = BatchCommit {
        topic: topic.into(),
        delta: PositionDelta::new(0, 0, n as i64).unwrap(),
        collections: vec![CollectionUpdate {
            id: "c".into(),
            partition: 0,
            dimension: Some(2),
            log_position: n as i64 - 1,
            record_count_delta: n as i64,
            writes,
        }],
        functions: Vec::new(),
        changelog: false,
        changes: Vec::new(),
    };
    db.commit_batch(batch).await.unwrap();
    Arc::new(db)
}

async fn app(token: Option<&str>, records: usize) -> Router {
    let admin = Admin::new(config(token), sysdb_with(records).await).unwrap();
    router(AppState { metrics: Metrics::new(), health: Health::new(), admin: Some(Arc::new(admin)) })
}

/// One request: `(status, JSON body or Null)`.
async fn call(app: &Router, method: Method, uri: &str, token: Option<&str>, body: Option<&str>) -> (StatusCode, Value) {
    let mut req = Request::builder().method(method).uri(uri);
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req
        .header("content-type", "application/json")
        .body(body.map(|b| Body::from(b.to_string())).unwrap_or_default())
        .unwrap();
    let resp = app.clone().oneshot(req).await.unwrap();
    let status = resp.status();
    let bytes = axum::body::to_bytes(resp.into_body(), usize::MAX).await.unwrap();
    (status, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

async fn get(app: &Router, uri: &str) -> (StatusCode, Value) {
    call(app, Method::GET, uri, None, None).await
}

fn assert_error(got: &(StatusCode, Value), status: StatusCode, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"], code, "{}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "no message: {}", got.1);
}

#[tokio::test]
async fn collections_are_listed_and_shown_and_ops_routes_still_answer() {
    let app = app(None, 3).await;
    let (status, v) = get(&app, "/api/v1/collections").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["collections"][0]["id"], "c");
    assert_eq!(v["collections"][0]["records"], 3);
    assert_eq!(v["collections"][0]["dimension"], 2);
    assert_eq!(v["collections"][0]["log_position"], 2);
    assert_eq!(get(&app, "/healthz").await.0, StatusCode::OK);
    assert_eq!(get(&app, "/readyz").await.0, StatusCode::SERVICE_UNAVAILABLE);
}

#[tokio::test]
async fn an_unknown_collection_is_a_404_with_a_stable_code() {
    let app = app(None, 1).await;
    assert_error(&get(&app, "/api/v1/collections/nope/records").await, StatusCode::NOT_FOUND, "unknown_collection");
    assert_error(&get(&app, "/api/v1/collections/nope").await, StatusCode::NOT_FOUND, "unknown_collection");
}

#[tokio::test]
async fn records_page_with_a_cursor_until_next_is_null() {
    let app = app(None, 7).await;
    let mut after: Option<String> = None;
    let mut seen = Vec::new();
    let mut pages = 0;
    loop {
        let uri = match &after {
            Some(a) => format!("/api/v1/collections/c/records?limit=3&after={a}"),
            None => "/api/v1/collections/c/records?limit=3".into(),
        };
        let (status, v) = get(&app, &uri).await;
        assert_eq!(status, StatusCode::OK, "{v}");
        pages += 1;
        let recs = v["records"].as_array().unwrap();
        assert!(recs.len() <= 3);
        seen.extend(recs.iter().map(|r| r["id"].as_str().unwrap().to_string()));
        match v["next"].as_str() {
            Some(n) => {
                assert_eq!(recs.last().unwrap()["id"], n, "next is the last id of the page");
                after = Some(n.to_string());
            }
            None => break,
        }
    }
    assert_eq!(pages, 3, "7 records in pages of 3");
    assert_eq!(seen, (0..7).map(|i| format!("r{i:03}")).collect::<Vec<_>>());

    let (_, v) = get(&app, "/api/v1/collections/c/records").await;
    assert_eq!(v["records"].as_array().unwrap().len(), 7, "default page holds them all");
    assert_eq!(v["next"], Value::Null);
    let r = &v["records"][1];
    assert_eq!(
        (r["embedding"].clone(), r["metadata"]["i"].clone(), r["offset"].clone()),
        (serde_json::json!([1.0, 1.0]), 1.into(), 1.into())
    );
    // Exactly one full page: no empty extra page.
    let (_, v) = get(&app, "/api/v1/collections/c/records?limit=7").await;
    assert_eq!(v["next"], Value::Null);
}

#[tokio::test]
async fn bad_paging_parameters_are_bad_requests() {
    let app = app(None, 1).await;
    for uri in [
        "/api/v1/collections/c/records?limit=0",
        "/api/v1/collections/c/records?limit=1001",
        "/api/v1/collections/c/records?limit=ten",
        "/api/v1/collections/c/records?offset=3",
    ] {
        assert_error(&get(&app, uri).await, StatusCode::BAD_REQUEST, "bad_request");
    }
    assert_eq!(get(&app, "/api/v1/collections/c/records?limit=1000").await.0, StatusCode::OK);
}

#[tokio::test]
async fn mutations_need_the_admin_token_and_so_do_reads_without_a_read_token() {
    let app = app(Some(TOKEN), 1).await;
    let body = Some(r#"{"id":"x","operation":"add","embedding":[1,2,3]}"#);
    let uri = "/api/v1/collections/c/records";
    // Missing and wrong token: 401, whatever the body.
    let missing = call(&app, Method::POST, uri, None, body).await;
    assert_error(&missing, StatusCode::UNAUTHORIZED, "unauthorized");
    assert!(missing.1["message"].as_str().unwrap().contains("Authorization"), "{}", missing.1);
    let wrong = call(&app, Method::POST, uri, Some("t0ken-for-testz"), body).await;
    assert_error(&wrong, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_error(&call(&app, Method::POST, uri, None, Some("{")).await, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_error(
        &call(&app, Method::DELETE, "/api/v1/functions/f", Some("wrong"), None).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    assert_error(
        &call(&app, Method::POST, "/api/v1/functions", None, Some("{}")).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    // Right token: past the check (this body is invalid: dimension 3 vs 2, nothing produced).
    let right = call(&app, Method::POST, uri, Some(TOKEN), body).await;
    assert_error(&right, StatusCode::BAD_REQUEST, "invalid_record");
    // With only the admin token configured, reads need it too (the roles: roles_tests.rs).
    assert_error(&get(&app, "/api/v1/collections").await, StatusCode::UNAUTHORIZED, "unauthorized");
    assert_eq!(call(&app, Method::GET, "/api/v1/collections", Some(TOKEN), None).await.0, StatusCode::OK);
}

#[tokio::test]
async fn the_unauthorized_response_names_the_bearer_scheme() {
    let app = app(Some(TOKEN), 0).await;
    let req = Request::builder().method(Method::POST).uri("/api/v1/functions").body(Body::empty()).unwrap();
    let resp = app.oneshot(req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    assert_eq!(resp.headers()["content-type"], "application/json");
}

#[tokio::test]
async fn bad_json_is_refused_before_anything_is_produced() {
    let app = app(None, 1).await;
    let uri = "/api/v1/collections/c/records";
    assert_error(&call(&app, Method::POST, uri, None, Some("{\"id\": ")).await, StatusCode::BAD_REQUEST, "bad_json");
    assert_error(&call(&app, Method::POST, uri, None, Some("not json")).await, StatusCode::BAD_REQUEST, "bad_json");
    assert_error(&call(&app, Method::POST, uri, None, Some("42")).await, StatusCode::BAD_REQUEST, "bad_json");
    assert_error(&call(&app, Method::POST, uri, None, Some("[]")).await, StatusCode::BAD_REQUEST, "bad_request");
    assert_error(
        &call(&app, Method::POST, "/api/v1/functions", None, Some("{")).await,
        StatusCode::BAD_REQUEST,
        "bad_json",
    );
    assert_error(
        &call(&app, Method::POST, "/api/v1/functions", None, Some(r#"{"collection":"c"}"#)).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
}

#[tokio::test]
async fn invalid_records_are_listed_by_index_and_nothing_is_produced() {
    let app = app(None, 1).await;
    let body = r#"[{"id":"ok","operation":"upsert","embedding":[1,2]},{"id":"","operation":"add"},{"id":"b","operation":"frobnicate"},{"id":"d","operation":"add","embedding":[1]}]"#;
    let (status, v) = call(&app, Method::POST, "/api/v1/collections/c/records", None, Some(body)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
    assert_eq!(v["error"], "invalid_record");
    assert!(v["message"].as_str().unwrap().contains("3 of 4"), "{v}");
    assert_eq!(v["failed"], 3);
    let items: Vec<(u64, &str)> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["index"].as_u64().unwrap(), i["error"].as_str().unwrap()))
        .collect();
    assert_eq!(items, [(1, "empty_id"), (2, "malformed"), (3, "dimension_mismatch")]);
}

#[tokio::test]
async fn posting_to_an_unknown_collection_is_refused_when_the_processor_rejects_them() {
    let mut c = config(None);
    c.processor.unknown_collections = crate::config::UnknownCollections::Reject;
    let admin = Admin::new(c, sysdb_with(0).await).unwrap();
    let app = router(AppState { metrics: Metrics::new(), health: Health::new(), admin: Some(Arc::new(admin)) });
    let got =
        call(&app, Method::POST, "/api/v1/collections/new/records", None, Some(r#"{"id":"a","operation":"add"}"#))
            .await;
    assert_error(&got, StatusCode::NOT_FOUND, "unknown_collection");
}

#[tokio::test]
async fn an_oversized_body_is_a_413_json_error() {
    let app = app(None, 0).await;
    let big = format!(
        "[{}]",
        vec![
            r#"{"id":"a","operation":"add","document":"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}"#;
            300_000
        ]
        .join(",")
    );
    assert!(big.len() > MAX_BODY_BYTES);
    assert_error(
        &call(&app, Method::POST, "/api/v1/collections/c/records", None, Some(&big)).await,
        StatusCode::PAYLOAD_TOO_LARGE,
        "payload_too_large",
    );
}

#[tokio::test]
async fn unknown_endpoints_and_methods_are_json_errors() {
    let app = app(None, 0).await;
    assert_error(&get(&app, "/api/v1/nope").await, StatusCode::NOT_FOUND, "not_found");
    assert_error(
        &call(&app, Method::PUT, "/api/v1/collections", None, None).await,
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
    );
}

#[tokio::test]
async fn attach_refuses_an_unknown_function_or_bad_params_without_writing() {
    let app = app(None, 1).await;
    let unknown = call(
        &app,
        Method::POST,
        "/api/v1/functions",
        None,
        Some(r#"{"collection":"c","function":"nope","output":"o"}"#),
    )
    .await;
    assert_error(&unknown, StatusCode::BAD_REQUEST, "bad_request");
    assert!(unknown.1["message"].as_str().unwrap().contains("nope"), "{}", unknown.1);
    let same = call(
        &app,
        Method::POST,
        "/api/v1/functions",
        None,
        Some(r#"{"collection":"c","function":"record_counter","output":"c"}"#),
    )
    .await;
    assert_error(&same, StatusCode::BAD_REQUEST, "bad_request");
    let nested = call(
        &app,
        Method::POST,
        "/api/v1/functions",
        None,
        Some(r#"{"collection":"c","function":"record_counter","output":"o","params":{"a":[1]}}"#),
    )
    .await;
    assert_error(&nested, StatusCode::BAD_REQUEST, "bad_request");
}

#[tokio::test]
async fn unknown_functions_are_404s() {
    let app = app(Some(TOKEN), 0).await;
    let get = |uri: &'static str| call(&app, Method::GET, uri, Some(TOKEN), None);
    assert_error(&get("/api/v1/functions/nope").await, StatusCode::NOT_FOUND, "unknown_function");
    assert_error(
        &call(&app, Method::DELETE, "/api/v1/functions/nope", Some(TOKEN), None).await,
        StatusCode::NOT_FOUND,
        "unknown_function",
    );
    let (status, v) = get("/api/v1/functions?collection=c").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["functions"], serde_json::json!([]));
    let (status, v) = get("/api/v1/collections/c").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["functions"], serde_json::json!([]));
}

#[tokio::test]
async fn offsets_history_lists_resets_and_gaps_from_the_sysdb() {
    let admin = Admin::new(config(None), sysdb_with(2).await).unwrap();
    admin.sysdb.reset_position("admin-test.log", 1, 7, "alice", "replay the night").await.unwrap();
    admin.sysdb.record_gap("admin-test.log", 0, 2, 9).await.unwrap();
    let app = router(AppState { metrics: Metrics::new(), health: Health::new(), admin: Some(Arc::new(admin)) });
    let (status, v) = get(&app, "/api/v1/offsets/history").await;
    assert_eq!(status, StatusCode::OK, "{v}");
    assert_eq!(v["topic"], "admin-test.log");
    let entries = v["entries"].as_array().unwrap();
    assert_eq!(entries.len(), 2, "{v}");
    let reset = entries.iter().find(|e| e["kind"] == "reset").expect("the reset");
    assert_eq!(
        (&reset["partition"], &reset["actor"], &reset["reason"], &reset["from_offset"], &reset["to_offset"]),
        (
            &serde_json::json!(1),
            &serde_json::json!("alice"),
            &serde_json::json!("replay the night"),
            &Value::Null,
            &serde_json::json!(7)
        )
    );
    let gap = entries.iter().find(|e| e["kind"] == "gap").expect("the gap");
    assert_eq!(
        (&gap["partition"], &gap["from_offset"], &gap["to_offset"]),
        (&serde_json::json!(0), &serde_json::json!(2), &serde_json::json!(9))
    );
}

#[tokio::test]
async fn offsets_reset_and_dlq_replay_validate_before_touching_the_broker() {
    let app = app(Some(TOKEN), 0).await;
    let post = |uri: &'static str, body: &'static str| {
        let app = app.clone();
        async move { call(&app, Method::POST, uri, Some(TOKEN), Some(body)).await }
    };
    // Mutating: the token is needed (dry runs included).
    assert_error(
        &call(&app, Method::POST, "/api/v1/offsets/reset", None, Some(r#"{"partitions":[0],"to":1}"#)).await,
        StatusCode::UNAUTHORIZED,
        "unauthorized",
    );
    for (body, needle) in [
        (r#"{"partitions":[0]}"#, "exactly one target"),
        (r#"{"partitions":[0],"to":1,"to_latest":true}"#, "exactly one target"),
        (r#"{"to":1}"#, "all_partitions"),
        (r#"{"partitions":[0],"all_partitions":true,"to":1}"#, "all_partitions"),
        (r#"{"partitions":[0],"to":1,"execute":true}"#, "reason"),
        (r#"{"partitions":[0],"to":1,"execute":true,"reason":"  "}"#, "reason"),
        (r#"{"partitions":[0],"to_datetime":"yesterday"}"#, "RFC 3339"),
        (r#"{"partitions":[0],"to":-1}"#, ">= 0"),
    ] {
        let got = post("/api/v1/offsets/reset", body).await;
        assert_error(&got, StatusCode::BAD_REQUEST, "bad_request");
        assert!(got.1["message"].as_str().unwrap().contains(needle), "{body}: {}", got.1);
    }
    // Unknown fields are refused, not ignored.
    assert_error(
        &post("/api/v1/offsets/reset", r#"{"partition":0,"to":1}"#).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
    assert_error(&post("/api/v1/dlq/replay", r#"{"kinds":"x"}"#).await, StatusCode::BAD_REQUEST, "bad_request");
    assert_error(&post("/api/v1/dlq/replay", "not json").await, StatusCode::BAD_REQUEST, "bad_json");
    let since = post("/api/v1/dlq/replay", r#"{"since":"last week"}"#).await;
    assert_error(&since, StatusCode::BAD_REQUEST, "bad_request");
    assert_error(
        &call(&app, Method::GET, "/api/v1/dlq?since=never", Some(TOKEN), None).await,
        StatusCode::BAD_REQUEST,
        "bad_request",
    );
}
