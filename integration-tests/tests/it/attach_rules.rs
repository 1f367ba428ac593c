//! Attach rules and lost markers end to end, against the real broker and binary, on SQLite
//! and PostgreSQL: every refused attach through the CLI (exit code 1, a message that names
//! what is in the way and the fix, nothing stored), and a marker passed by an operator
//! `offsets reset` republished by the outbox relay until the function is ready with outputs
//! equal to the reference model.

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::record::LogRecord;
use sluice_integration_tests::both_backends;
use sluice_integration_tests::faults::workload;
use sluice_integration_tests::try_http;
use sluice_integration_tests::{free_port, http_get, jsonl_lines, metric_samples, Env};

const WAIT: Duration = Duration::from_secs(120);

fn attach(env: &Env, collection: &str, function: &str, output: &str) -> Value {
    serde_json::from_str(
        env.run(&["functions", "attach", collection, "--function", function, "--output", output, "--format", "json"])
            .trim(),
    )
    .unwrap()
}

fn functions(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["functions", "list", "--format", "json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn function(env: &Env, id: &str) -> Value {
    functions(env).into_iter().find(|f| f["id"] == id).unwrap_or_else(|| panic!("function {id} not listed"))
}

fn wait_status(env: &Env, id: &str, status: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let f = function(env, id);
        if f["status"] == status {
            return f;
        }
        assert!(Instant::now() < deadline, "function {id} never became {status}: {f}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `sluice functions attach` must exit 1 with every needle in its message, and store
/// nothing (no new function).
fn refused(env: &Env, collection: &str, function: &str, output: &str, needles: &[&str]) -> String {
    let before = functions(env).len();
    let out = env
        .cmd()
        .args(["functions", "attach", collection, "--function", function, "--output", output])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "attach {collection} {function} -> {output} should be refused: {stderr}");
    assert!(out.stdout.is_empty(), "a refused attach printed a result: {}", String::from_utf8_lossy(&out.stdout));
    let message = stderr
        .lines()
        .find(|l| l.starts_with("sluice: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"))
        .to_string();
    assert!(message.contains("attach refused"), "{message}");
    for needle in needles {
        assert!(
            message.contains(needle),
            "the refusal of {collection} {function} -> {output} does not name {needle:?}: {message}"
        );
    }
    assert_eq!(functions(env).len(), before, "a refused attach stored a function");
    message
}

/// The output collection equals the function over the whole `log` of `collection`.
fn assert_outputs(env: &Env, log: &[LogRecord], collection: &str, function: &str, output: &str) {
    let expected = sluice_integration_tests::faults::expected_outputs(log, collection, function);
    assert!(!expected.is_empty(), "the reference of {function} over {collection} is empty: a vacuous comparison");
    let out = env.cmd().args(["records", output, "--format", "jsonl"]).output().unwrap();
    assert!(out.status.success(), "records {output}: {}", String::from_utf8_lossy(&out.stderr));
    let actual: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(actual, expected, "{function} output {output} differs from the reference");
}

/// `POST path` with a JSON body: `(status, JSON body)`, or `None` while nothing listens.
fn http_post(port: u16, path: &str, body: &str) -> Option<(u16, Value)> {
    try_http(port, "POST", path, Some(body))
}

/// Wait until one series on a replica's `/metrics` satisfies `ok`.
fn wait_metric(port: u16, series: &str, ok: impl Fn(f64) -> bool, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        let got = http_get(port, "/metrics").and_then(|(_, _, body)| metric_samples(&body).get(series).copied());
        if got.is_some_and(&ok) {
            return;
        }
        assert!(Instant::now() < deadline, "{series} is {got:?}, never as expected");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn partition0(env: &Env) -> Value {
    let v: Value = serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).unwrap();
    v.as_array().unwrap().iter().find(|r| r["partition"] == 0).cloned().expect("partition 0 in offsets show")
}

// Every refusal through the CLI, the idempotent re-attach, and re-attaching after a detach:
// refused while the output keeps the old records, fresh and exact after --drop-output.
both_backends!(refused_attaches_name_the_conflict_and_the_fix, refusals);
fn refusals(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(400, 31, &env.prefix, 2, 60);
    let c1 = data[0].collection_id.clone();
    let c2 = data.iter().map(|r| &r.collection_id).find(|c| **c != c1).expect("two collections").clone();
    let port = free_port();
    let _r = env.spawn_replica("r1", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);

    let first = attach(&env, &c1, "record_counter", "count");
    let id = first["function_id"].as_str().unwrap().to_string();
    assert_eq!(first["marker"], "published");
    let again = attach(&env, &c1, "record_counter", "count");
    assert_eq!(
        (again["function_id"].as_str(), again["marker"].as_str()),
        (Some(id.as_str()), Some("existing")),
        "the same attach again"
    );

    // The output is written by a live function: another function, or another input.
    refused(&env, &c1, "statistics", "count", &[&id, "\"count\"", "already written by", "--drop-output"]);
    refused(&env, &c2, "record_counter", "count", &[&id, "\"count\"", "already written by", "--output"]);
    // The admin API refuses the same way: 400 with the message.
    let body = serde_json::json!({"collection": c2, "function": "record_counter", "output": "count"}).to_string();
    let deadline = Instant::now() + WAIT;
    let (status, err) = loop {
        if let Some(answer) = http_post(port, "/api/v1/functions", &body) {
            break answer;
        }
        assert!(Instant::now() < deadline, "the admin API never answered");
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!((status, err["error"].as_str()), (400, Some("bad_request")), "{err}");
    let message = err["message"].as_str().unwrap_or_default();
    assert!(message.contains(&id) && message.contains("already written by"), "{message}");
    // A data collection as output.
    refused(&env, &c1, "record_counter", &c2, &[&format!("{c2:?}"), "holds data", "--output"]);
    // A function's output as input (it would never see live changes: refused).
    refused(
        &env,
        "count",
        "statistics",
        "count-stats",
        &[&id, "\"count\"", "output of", &format!("attach statistics to {c1:?} instead")],
    );
    // A function's input as output.
    let on_c2 = attach(&env, &c2, "statistics", "c2-stats")["function_id"].as_str().unwrap().to_string();
    refused(&env, &c1, "record_counter", &c2, &[&on_c2, &format!("{c2:?}"), "is the input of", "--output"]);
    // Another input's output.
    refused(&env, &c1, "statistics", "c2-stats", &[&on_c2, "already written by"]);
    // Under "reject", an unregistered collection (its marker would be dead-lettered).
    let strict = env.with_processor("unknown_collections = \"reject\"\n");
    let unknown = format!("{}-never-produced", env.prefix);
    refused(
        &strict,
        &unknown,
        "record_counter",
        "unknown-count",
        &[&format!("{unknown:?}"), "not registered", "unknown_collections = \"reject\""],
    );
    // ... a registered one is fine under "reject".
    let strict_ok = attach(&strict, &c2, "record_counter", "c2-count");
    assert_eq!(strict_ok["marker"], "published");

    wait_status(&env, &id, "ready", WAIT);
    assert_outputs(&env, &data, &c1, "record_counter", "count");

    // Detached without --drop-output: the records stay, attaching there again is refused
    // with the command that drops them.
    env.run(&["functions", "detach", &id]);
    let msg = refused(
        &env,
        &c1,
        "record_counter",
        "count",
        &[&id, "detached", &format!("sluice functions detach {id} --drop-output")],
    );
    assert!(msg.contains("--output"), "the refusal also offers another output name: {msg}");
    env.run(&["functions", "detach", &id, "--drop-output"]);
    let fresh = attach(&env, &c1, "record_counter", "count");
    let fresh_id = fresh["function_id"].as_str().unwrap().to_string();
    assert_ne!(fresh_id, id);
    assert_eq!(fresh["marker"], "published");
    let more = workload(200, 32, &env.prefix, 2, 60);
    env.produce(&jsonl_lines(&more));
    wait_status(&env, &fresh_id, "ready", WAIT);
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = data.iter().chain(&more).cloned().collect();
    assert_outputs(&env, &all, &c1, "record_counter", "count");
}

// A marker written while no replica ran, then skipped by `offsets reset` to the high
// watermark: the function is left awaiting a marker that no replica will read. A relay
// sees the partition past the marker's offset and publishes it again (once), the gauge
// shows the function waiting, and a replica then starts it from the republished marker:
// ready, with exact outputs.
both_backends!(a_marker_passed_by_an_offsets_reset_is_republished, lost_marker);
fn lost_marker(env: Env) {
    env.run(&["init", "--partitions", "1"]);
    let env = env.with_sections("[backfill]\nrelay_interval_ms = 300\n");
    let data = workload(500, 41, &env.prefix, 2, 120);
    let c = data[0].collection_id.clone();
    env.produce(&jsonl_lines(&data));
    let mut r1 = env.spawn_replica("r1", &[]);
    env.wait_caught_up(WAIT);
    r1.terminate(Duration::from_secs(30)).expect("r1 stops");

    let attached = attach(&env, &c, "statistics", "stats");
    assert_eq!(attached["marker"], "published");
    let id = attached["function_id"].as_str().unwrap().to_string();
    let p = partition0(&env);
    let (next, high) = (p["sysdb_next_offset"].as_i64().unwrap(), p["high_watermark"].as_i64().unwrap());
    assert_eq!(next + 1, high, "the marker is the only record not yet applied: {p}");
    env.run(&[
        "offsets",
        "reset",
        "--partition",
        "0",
        "--to",
        &high.to_string(),
        "--reason",
        "skip past the marker",
        "--execute",
    ]);
    assert_eq!(function(&env, &id)["status"], "awaiting_marker");

    // A replica that only runs the outbox relay: it republishes the lost marker once,
    // and reports the function awaiting it (no processor reads the partition).
    let port = free_port();
    let mut relay =
        env.spawn_replica_with("relay", &["--roles", "relay"], &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    wait_metric(port, "sluice_markers_republished_total", |v| v == 1.0, WAIT);
    wait_metric(port, "sluice_functions_awaiting_marker_oldest_seconds", |v| v >= 1.0, WAIT);
    let relay_log = relay.log_text();
    assert_eq!(relay_log.matches("outbox relay republished a lost marker").count(), 1, "one republish:\n{relay_log}");
    relay.terminate(Duration::from_secs(30)).expect("the relay replica stops");
    assert_eq!(function(&env, &id)["status"], "awaiting_marker");

    let port = free_port();
    let r2 = env.spawn_replica("r2", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    let f = wait_status(&env, &id, "ready", WAIT);
    assert!(
        f["marker_offset"].as_i64().unwrap() >= high,
        "the backfill started at the skipped marker (offset {next}), not at the republished one: {f}"
    );
    assert_outputs(&env, &data, &c, "statistics", "stats");
    wait_metric(port, "sluice_functions_awaiting_marker_oldest_seconds", |v| v == 0.0, WAIT);

    // Live changes after the republished marker keep the output exact.
    let more = workload(200, 42, &env.prefix, 2, 120);
    env.produce(&jsonl_lines(&more));
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = data.iter().chain(&more).cloned().collect();
    assert_outputs(&env, &all, &c, "statistics", "stats");
    let log = r2.log_text();
    assert!(!log.contains("outbox relay republished a lost marker"), "the marker was republished again:\n{log}");
}

// A lost marker of a collection that is still not registered, under "reject": republishing
// it would only dead-letter it again, so the relay leaves it (and says so); the gauge shows
// the function waiting.
both_backends!(a_lost_marker_of_an_unregistered_collection_under_reject_is_left, lost_under_reject);
fn lost_under_reject(env: Env) {
    env.run(&["init", "--partitions", "1"]);
    let env = env.with_sections("[backfill]\nrelay_interval_ms = 300\n");
    let c = format!("{}-unregistered", env.prefix);
    // Attached while the policy was "register": allowed, the marker is published.
    let attached = attach(&env, &c, "record_counter", "count");
    assert_eq!(attached["marker"], "published");
    let id = attached["function_id"].as_str().unwrap().to_string();
    env.run(&["offsets", "reset", "--partition", "0", "--to", "1", "--reason", "skip past the marker", "--execute"]);

    let strict = env.with_processor("unknown_collections = \"reject\"\n");
    let port = free_port();
    let relay =
        strict.spawn_replica_with("relay", &["--roles", "relay"], &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    wait_metric(port, "sluice_functions_awaiting_marker_oldest_seconds", |v| v >= 1.0, WAIT);
    let deadline = Instant::now() + WAIT;
    while !relay.log_text().contains("lost marker not republished") {
        assert!(Instant::now() < deadline, "the relay never said why it left the marker:\n{}", relay.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    wait_metric(port, "sluice_markers_republished_total", |v| v == 0.0, WAIT);
    assert!(!relay.log_text().contains("republished a lost marker"));
    assert_eq!(function(&env, &id)["status"], "awaiting_marker");
}
