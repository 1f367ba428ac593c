//! The admin API (`/api/v1`, `docs/openapi.yaml`) of a real `sluice process` replica
//! against the real broker: the admin token (missing, wrong, right), bad JSON, unknown
//! collections, records posted over HTTP and then materialized, paging through them, an
//! invalid batch producing nothing, offsets, and functions attached and detached over HTTP.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_integration_tests::{free_port, require_kafka, Env, Replica};

const WAIT: Duration = Duration::from_secs(120);
const TOKEN: &str = "it-admin-token-0123456789";

/// One HTTP/1.1 request over a fresh connection: `(status, JSON body or Null)`, or `None`
/// while nothing listens.
fn request(port: u16, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> Option<(u16, Value)> {
    sluice_integration_tests::http_request(port, method, path, token, body).map(|a| (a.status, a.body))
}

struct Api {
    port: u16,
}

impl Api {
    fn call(&self, method: &str, path: &str, token: Option<&str>, body: Option<&str>) -> (u16, Value) {
        request(self.port, method, path, token, body).unwrap_or_else(|| panic!("{method} {path}: no answer"))
    }
    /// A read: with only the admin token configured, reads need it too.
    fn get(&self, path: &str) -> (u16, Value) {
        self.call("GET", path, Some(TOKEN), None)
    }
    /// A mutating request with the right token.
    fn send(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        self.call(method, path, Some(TOKEN), body)
    }
}

fn assert_error(got: &(u16, Value), status: u16, code: &str) {
    assert_eq!(got.0, status, "{}", got.1);
    assert_eq!(got.1["error"], code, "{}", got.1);
    assert!(got.1["message"].as_str().is_some_and(|m| !m.is_empty()), "{}", got.1);
}

/// Init the topics, start a replica serving HTTP with a token, wait until it answers.
fn start(env: &Env) -> (Replica, Api) {
    env.run(&["init", "--partitions", "2"]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut replica = env.spawn_replica("r1", &[("SLUICE_HTTP", &listen), ("SLUICE_ADMIN_TOKEN", TOKEN)]);
    let deadline = Instant::now() + WAIT;
    while request(port, "GET", "/readyz", None, None).map(|(s, _)| s) != Some(200) {
        assert!(replica.child.try_wait().unwrap().is_none(), "replica exited:\n{}", replica.log_text());
        assert!(Instant::now() < deadline, "replica not ready:\n{}", replica.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    (replica, Api { port })
}

/// Poll `GET /collections/{c}` until `records` reaches `count` and the log position
/// `offset`.
fn wait_materialized(api: &Api, c: &str, count: i64, offset: i64) -> Value {
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, v) = api.get(&format!("/api/v1/collections/{c}"));
        if status == 200 && v["records"] == count && v["log_position"].as_i64() >= Some(offset) {
            return v;
        }
        assert!(status == 200 || status == 404, "{status} {v}");
        assert!(Instant::now() < deadline, "collection {c} not materialized: {status} {v}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn record(i: usize) -> Value {
    json!({"id": format!("doc-{i:03}"), "operation": "upsert", "embedding": [i as f64, 0.5], "metadata": {"i": i}, "document": format!("text {i}")})
}

#[test]
fn records_posted_over_http_are_materialized_and_paged_behind_the_token() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("admin-api");
    let (_replica, api) = start(&env);
    let c = format!("{}-docs", env.prefix);
    let path = format!("/api/v1/collections/{c}/records");
    let batch = Value::Array((0..25).map(record).collect()).to_string();

    // Auth: missing and wrong tokens are refused before anything else, reads included
    // (every route and token: http_roles.rs).
    assert_error(&api.call("GET", &path, None, None), 401, "unauthorized");
    assert_error(&api.call("POST", &path, None, Some(&batch)), 401, "unauthorized");
    assert_error(&api.call("POST", &path, Some("it-admin-token-0123456788"), Some(&batch)), 401, "unauthorized");
    assert_error(&api.call("POST", &path, Some("wrong"), Some("{")), 401, "unauthorized");
    // Unknown collection, before anything was posted to it.
    assert_error(&api.get(&path), 404, "unknown_collection");
    assert_error(&api.get(&format!("/api/v1/collections/{c}")), 404, "unknown_collection");
    // Bad JSON with the right token.
    assert_error(&api.send("POST", &path, Some(r#"[{"id": "a", "operation": "#)), 400, "bad_json");

    // Right token: produced, acknowledged, then materialized by the replica.
    let (status, v) = api.send("POST", &path, Some(&batch));
    assert_eq!(status, 202, "{v}");
    assert_eq!(v["delivered"], 25);
    assert_eq!(v["topic"], env.log_topic());
    let last = v["last_offset"].as_i64().unwrap();
    assert_eq!(last - v["first_offset"].as_i64().unwrap(), 24, "one partition, consecutive offsets: {v}");
    let shown = wait_materialized(&api, &c, 25, last);
    assert_eq!(shown["dimension"], 2);
    assert_eq!(shown["partition"], v["partition"]);

    // Paging: 10 + 10 + 5, in id order, `next` null on the last page.
    let mut after: Option<String> = None;
    let mut pages = Vec::new();
    let mut ids = Vec::new();
    loop {
        let q = after.as_ref().map(|a| format!("&after={a}")).unwrap_or_default();
        let (status, page) = api.get(&format!("{path}?limit=10{q}"));
        assert_eq!(status, 200, "{page}");
        let recs = page["records"].as_array().unwrap();
        pages.push(recs.len());
        ids.extend(recs.iter().map(|r| r["id"].as_str().unwrap().to_string()));
        match page["next"].as_str() {
            Some(n) => after = Some(n.to_string()),
            None => break,
        }
    }
    assert_eq!(pages, [10, 10, 5]);
    assert_eq!(ids, (0..25).map(|i| format!("doc-{i:03}")).collect::<Vec<_>>());
    let (_, first) = api.get(&format!("{path}?limit=1"));
    let r0 = &first["records"][0];
    assert_eq!(
        (&r0["embedding"], &r0["metadata"], &r0["document"]),
        (&json!([0.0, 0.5]), &json!({"i": 0}), &json!("text 0"))
    );
    assert_error(&api.get(&format!("{path}?limit=1001")), 400, "bad_request");

    // An invalid item stops the whole request: the valid item next to it is never
    // produced. A later sentinel on the same partition proves the log was read past it.
    let bad = json!([{"id": "never", "operation": "add"}, {"id": "x", "operation": "add", "embedding": [1, 2, 3]}])
        .to_string();
    let (status, v) = api.send("POST", &path, Some(&bad));
    assert_error(&(status, v.clone()), 400, "invalid_record");
    assert_eq!(
        v["items"],
        json!([{"index": 1, "error": "dimension_mismatch", "message": format!("embedding has 3 dimensions but collection {c:?} has 2")}])
    );
    let (status, v) = api.send("POST", &path, Some(r#"{"id": "sentinel", "operation": "add", "document": "s"}"#));
    assert_eq!(status, 202, "{v}");
    wait_materialized(&api, &c, 26, v["last_offset"].as_i64().unwrap());
    let (_, all) = api.get(&format!("{path}?limit=1000"));
    let ids: Vec<&str> = all["records"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap()).collect();
    assert!(ids.contains(&"sentinel") && !ids.contains(&"never"), "{ids:?}");

    // The API agrees with the CLI, and offsets are served.
    let (_, listed) = api.get("/api/v1/collections");
    let cli: Value = serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).unwrap();
    assert_eq!(listed["collections"], cli);
    let (status, offsets) = api.get("/api/v1/offsets");
    assert_eq!(status, 200, "{offsets}");
    assert_eq!(offsets["partitions"].as_array().unwrap().len(), 2);
}

#[test]
fn a_function_attached_over_http_is_listed_backfilled_and_detached() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("admin-fn");
    let (_replica, api) = start(&env);
    let c = format!("{}-in", env.prefix);
    let out = format!("{c}-count");
    let (status, v) = api.send(
        "POST",
        &format!("/api/v1/collections/{c}/records"),
        Some(&Value::Array((0..10).map(record).collect()).to_string()),
    );
    assert_eq!(status, 202, "{v}");
    wait_materialized(&api, &c, 10, v["last_offset"].as_i64().unwrap());

    let attach = json!({"collection": c, "function": "record_counter", "output": out}).to_string();
    assert_error(&api.call("POST", "/api/v1/functions", None, Some(&attach)), 401, "unauthorized");
    let (status, attached) = api.send("POST", "/api/v1/functions", Some(&attach));
    assert_eq!(status, 201, "{attached}");
    assert_eq!(attached["marker"], "published");
    let id = attached["function_id"].as_str().unwrap().to_string();
    // Attaching the same (collection, output) again changes nothing.
    let (status, again) = api.send("POST", "/api/v1/functions", Some(&attach));
    assert_eq!((status, &again["function_id"], &again["marker"]), (200, &json!(id), &json!("existing")));

    let (status, listed) = api.get(&format!("/api/v1/functions?collection={c}"));
    assert_eq!(status, 200, "{listed}");
    assert_eq!(
        listed["functions"].as_array().unwrap().iter().map(|f| f["id"].clone()).collect::<Vec<_>>(),
        [json!(id)]
    );
    let deadline = Instant::now() + WAIT;
    loop {
        let (status, f) = api.get(&format!("/api/v1/functions/{id}"));
        assert_eq!(status, 200, "{f}");
        if f["status"] == "ready" {
            assert_eq!(
                (&f["collection"], &f["output"], &f["function"]),
                (&json!(c), &json!(out), &json!("record_counter"))
            );
            break;
        }
        assert!(Instant::now() < deadline, "function never ready: {f}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let (_, shown) = api.get(&format!("/api/v1/collections/{c}"));
    assert_eq!(shown["functions"][0]["id"], json!(id), "{shown}");

    assert_error(&api.call("DELETE", &format!("/api/v1/functions/{id}"), Some("wrong"), None), 401, "unauthorized");
    let (status, detached) = api.send("DELETE", &format!("/api/v1/functions/{id}?drop_output=true"), None);
    assert_eq!(status, 200, "{detached}");
    assert_eq!((&detached["detached"]["id"], &detached["output_dropped"]), (&json!(id), &json!(true)));
    assert_eq!(api.get(&format!("/api/v1/functions/{id}")).1["status"], "detached");
    assert_error(&api.get(&format!("/api/v1/collections/{out}")), 404, "unknown_collection");
    assert_error(&api.send("DELETE", "/api/v1/functions/no-such-function", None), 404, "unknown_function");
}
