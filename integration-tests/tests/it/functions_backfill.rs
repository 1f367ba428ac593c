//! Attached functions and backfill end to end against the real broker, on SQLite and
//! PostgreSQL (docs/design.md section 7, invariants 6-9). Every output is checked against the
//! reference model: the function over the whole history.

use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use serde_json::Value;
use sluice::record::codec::encode;
use sluice::record::LogRecord;
use sluice_integration_tests::both_backends;
use sluice_integration_tests::faults::workload;
use sluice_integration_tests::{assert_records_match_model, brokers, jsonl_lines, Env, Replica};

const WAIT: Duration = Duration::from_secs(180);
const FUNCTIONS: [&str; 3] = ["record_counter", "statistics", "normalize"];

fn attach(env: &Env, collection: &str, function: &str, output: &str) -> Value {
    serde_json::from_str(
        env.run(&["functions", "attach", collection, "--function", function, "--output", output, "--format", "json"])
            .trim(),
    )
    .unwrap()
}

/// A read-only command, run again while opening the SQLite sysdb hits the replica's
/// write lock (opening takes it briefly; a long backfill chunk can hold it past the
/// busy timeout on a loaded machine).
fn run_read(env: &Env, args: &[&str]) -> String {
    for _ in 0..30 {
        let out = env.cmd().args(args).output().expect("spawn sluice");
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return String::from_utf8_lossy(&out.stdout).into_owned();
        }
        if !err.contains("database is locked") {
            panic!("sluice {args:?} failed: {}\nstderr: {err}", out.status);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("sluice {args:?}: the sysdb stayed locked");
}

fn functions(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&run_read(env, &["functions", "list", "--format", "json"]))
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

/// The output collection equals the function over the whole `log` of `collection`.
fn assert_outputs(env: &Env, log: &[LogRecord], collection: &str, function: &str, output: &str) {
    let expected = sluice_integration_tests::faults::expected_outputs(log, collection, function);
    let out = env.cmd().args(["records", output, "--format", "jsonl"]).output().unwrap();
    let actual: Vec<Value> = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    } else {
        Vec::new()
    };
    let actual: Vec<Value> =
        actual.into_iter().filter(|v| !(function == "record_counter" && v["metadata"]["total_count"] == 0)).collect();
    assert_eq!(actual.len(), expected.len(), "{function} output {output}: record count");
    assert_eq!(actual, expected, "{function} output {output}");
}

fn max_lag(env: &Env) -> i64 {
    let v: Value = serde_json::from_str(&run_read(env, &["offsets", "show", "--format", "json"])).unwrap();
    v.as_array().unwrap().iter().map(|r| r["lag"].as_i64().unwrap_or(0)).max().unwrap_or(0)
}

fn slow_backfill(env: &Env) -> Env {
    env.with_sections("[backfill]\nchunk_size = 40\npause_ms = 60\nscan_interval_ms = 500\n")
}

fn wait_log(r: &Replica, needle: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !r.log_text().contains(needle) {
        assert!(Instant::now() < deadline, "{needle:?} never appeared in {}", r.log.display());
        std::thread::sleep(Duration::from_millis(100));
    }
}

// a. Attach to a big collection while producing to it and to other collections of the
//    same partition; exact at the end; live lag bounded during the backfill.
both_backends!(attach_to_200k_records_under_live_load, big_attach);
fn big_attach(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    // 100 chunks with a 100 ms pause after each: the backfill lasts 10 s or more whatever
    // the machine, so the live load below surely overlaps it (measured without the pause:
    // 1-2 s, which a loaded CI machine could spend between two samples).
    let env = env.with_sections("[backfill]\nchunk_size = 2000\nscan_interval_ms = 500\npause_ms = 100\n");
    let big = workload(200_000, 21, &env.prefix, 1, 150_000);
    let target = big[0].collection_id.clone();
    let _r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&big));
    env.wait_caught_up(WAIT);
    let ids: Vec<String> = FUNCTIONS
        .iter()
        .map(|f| attach(&env, &target, f, &format!("{target}-{f}"))["function_id"].as_str().unwrap().to_string())
        .collect();
    // Live load during the backfill: the same collection and others.
    let live: Vec<LogRecord> = workload(6_000, 22, &env.prefix, 4, 1_000)
        .into_iter()
        .map(|mut r| {
            if r.collection_id.ends_with("-c1") {
                r.collection_id = target.clone();
            }
            r
        })
        .collect();
    // Samples of (functions, sum of the sysdb positions, functions): a function listed as
    // `backfilling` both before a position read and after a later one was backfilling
    // throughout (its status only moves forward), so positions that grew in between are
    // live records applied during its backfill.
    let sample = |env: &Env| {
        let before = functions(env);
        let rows: Value = serde_json::from_str(&run_read(env, &["offsets", "show", "--format", "json"])).unwrap();
        let applied: i64 = rows.as_array().unwrap().iter().map(|r| r["sysdb_next_offset"].as_i64().unwrap_or(0)).sum();
        (before, applied, functions(env))
    };
    let backfilling = |fs: &[Value], id: &str| {
        fs.iter()
            .find(|f| f["id"] == id)
            .filter(|f| f["status"] == "backfilling")
            .map(|f| f["backfill_done"].as_i64().unwrap_or(0))
    };
    let mut samples = Vec::new();
    let mut peak_lag = 0;
    for chunk in live.chunks(500) {
        env.produce(&jsonl_lines(chunk));
        peak_lag = peak_lag.max(max_lag(&env));
        samples.push(sample(&env));
    }
    let deadline = Instant::now() + WAIT;
    while !functions(&env)
        .iter()
        .filter(|f| ids.contains(&f["id"].as_str().unwrap().to_string()))
        .all(|f| f["status"] == "ready")
    {
        assert!(Instant::now() < deadline, "the backfills never finished: {:?}", functions(&env));
        samples.push(sample(&env));
    }
    let overlap = ids.iter().find_map(|id| {
        samples.iter().enumerate().find_map(|(i, (a_before, a_applied, _))| {
            let a_done = backfilling(a_before, id)?;
            samples[i + 1..].iter().find_map(|(_, b_applied, b_after)| {
                let b_done = backfilling(b_after, id)?;
                (b_applied > a_applied && b_done > a_done).then(|| {
                    format!(
                        "function {id}: {} live records applied and {} records backfilled while it was backfilling",
                        b_applied - a_applied,
                        b_done - a_done
                    )
                })
            })
        })
    });
    let overlap = overlap.unwrap_or_else(|| panic!("no live record was applied while a function was backfilling ({} samples): the live load did not overlap the backfill", samples.len()));
    eprintln!("overlap: {overlap}");
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = big.iter().chain(&live).cloned().collect();
    for f in FUNCTIONS {
        assert_outputs(&env, &all, &target, f, &format!("{target}-{f}"));
    }
    assert_records_match_model(&env, &all);
    eprintln!("peak live lag during the backfill: {peak_lag} records");
    assert!(peak_lag <= 5_000, "live lag during the backfill stayed within 5,000 records, got {peak_lag}");
}

// b. kill -9 the backfill worker mid-backfill and restart it.
both_backends!(backfill_worker_killed_mid_backfill_resumes_exactly, killed_worker);
fn killed_worker(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let env = slow_backfill(&env);
    let data = workload(4_000, 31, &env.prefix, 1, 3_000);
    let c = data[0].collection_id.clone();
    let _p = env.spawn_replica_with("processor", &["--roles", "processor,relay"], &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    let mut worker = env.spawn_replica_with("worker1", &["--roles", "backfill"], &[]);
    let id = attach(&env, &c, "statistics", "stats")["function_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    loop {
        let f = function(&env, &id);
        if f["backfill_done"].as_i64().unwrap_or(0) > 200 {
            break;
        }
        assert!(Instant::now() < deadline, "backfill never progressed: {f}");
        std::thread::sleep(Duration::from_millis(50));
    }
    worker.kill9();
    let done_at_kill = function(&env, &id)["backfill_done"].as_i64().unwrap();
    assert_eq!(function(&env, &id)["status"], "backfilling", "killed mid-way");
    let _worker2 = env.spawn_replica_with("worker2", &["--roles", "backfill"], &[]);
    let f = wait_status(&env, &id, "ready", WAIT);
    assert!(f["backfill_done"].as_i64().unwrap() >= done_at_kill);
    assert_eq!(f["backfill_done"], f["backfill_total"], "every as-of-marker record once: {f}");
    assert_outputs(&env, &data, &c, "statistics", "stats");
}

// c. Crash after the task is produced and before the batch commit: a duplicate task.
both_backends!(crash_between_task_and_commit_is_harmless, crash_after_task);
fn crash_after_task(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(1_500, 41, &env.prefix, 2, 500);
    let c = data[0].collection_id.clone();
    let mut r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));
    let id = attach(&env, &c, "record_counter", "count")["function_id"].as_str().unwrap().to_string();
    let mut crash = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", "after_backfill_task:1")]);
    // Its own fail point, not another abort (the batch commit's, say) that would leave
    // the function awaiting its marker as well.
    sluice_integration_tests::faults::expect_abort_at(&mut crash, "after_backfill_task", WAIT);
    assert_eq!(function(&env, &id)["status"], "awaiting_marker", "the batch did not commit");
    let r2 = env.spawn_replica("r2", &[]);
    wait_status(&env, &id, "ready", WAIT);
    wait_log(&r2, "backfill task produced", Duration::from_secs(5)); // the second task
    assert_outputs(&env, &data, &c, "record_counter", "count");
}

// d. Attach retried five times and a duplicate marker: one backfill, exact outputs.
both_backends!(attach_retried_and_marker_republished_backfills_once, retried_attach);
fn retried_attach(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(2_000, 51, &env.prefix, 2, 600);
    let c = data[0].collection_id.clone();
    let r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    let first = attach(&env, &c, "statistics", "stats");
    for _ in 0..4 {
        let again = attach(&env, &c, "statistics", "stats");
        assert_eq!(again["function_id"], first["function_id"]);
        assert_eq!(again["marker"], "existing", "no new marker on retry");
    }
    let id = first["function_id"].as_str().unwrap().to_string();
    wait_status(&env, &id, "ready", WAIT);
    // A republished marker (same request id) arrives later: ignored.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let row = rt.block_on(async {
        sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().function(&id).await.unwrap().unwrap()
    });
    let coll = rt.block_on(async {
        sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().collection(&c).await.unwrap().unwrap()
    });
    let marker = sluice::backfill::attach::marker_record(&sluice::sysdb::OutboxRow {
        id: 0,
        function_id: id.clone(),
        collection_id: c.clone(),
        partition: coll.partition,
        request_id: row.request_id.clone(),
        created_at_ms: 0,
        published_offset: None,
    });
    let prod: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    prod.send(BaseRecord::to(&env.log_topic()).key(&c).partition(coll.partition).payload(&encode(&marker)))
        .map_err(|(e, _)| e)
        .unwrap();
    prod.flush(Duration::from_secs(10)).unwrap();
    env.wait_caught_up(WAIT);
    assert_eq!(r.log_text().matches("backfill marker processed").count(), 1, "one backfill");
    assert_eq!(function(&env, &id)["status"], "ready");
    assert_eq!(functions(&env).len(), 1);
    assert_outputs(&env, &data, &c, "statistics", "stats");
}

// e. Publishing fails at attach: the function waits, the relay publishes later.
both_backends!(marker_publish_failure_is_relayed_later, relayed_marker);
fn relayed_marker(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(1_000, 61, &env.prefix, 2, 400);
    let c = data[0].collection_id.clone();
    env.produce(&jsonl_lines(&data));
    // The attach command cannot reach any broker.
    let out = env
        .cmd()
        .args(["functions", "attach", &c, "--function", "normalize", "--output", "norm", "--format", "json"])
        .env("SLUICE_BROKERS", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(out.status.success(), "attach succeeds with the marker pending: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["marker"], "pending");
    let id = v["function_id"].as_str().unwrap().to_string();
    assert_eq!(function(&env, &id)["status"], "awaiting_marker");
    let r = env.spawn_replica("r1", &[]);
    wait_status(&env, &id, "ready", WAIT);
    wait_log(&r, "outbox relay published a pending marker", Duration::from_secs(5));
    env.wait_caught_up(WAIT);
    assert_outputs(&env, &data, &c, "normalize", "norm");
}

// f. Data records before and after a marker in one batch: all materialized in order,
//    only the marker diverted.
both_backends!(one_batch_with_a_marker_diverts_only_the_marker, marker_in_batch);
fn marker_in_batch(env: Env) {
    env.run(&["init", "--partitions", "1"]);
    let before = workload(60, 71, &env.prefix, 3, 30);
    let c = before[0].collection_id.clone();
    env.produce(&jsonl_lines(&before));
    let id = attach(&env, &c, "record_counter", "count")["function_id"].as_str().unwrap().to_string();
    let after = workload(60, 72, &env.prefix, 3, 30);
    env.produce(&jsonl_lines(&after));
    // 121 messages, one partition, all in the topic before the replica starts: one batch.
    let r = env.spawn_replica("r1", &[("SLUICE_LOG", "info,sluice::processor::partition=debug")]);
    wait_status(&env, &id, "ready", WAIT);
    env.wait_caught_up(WAIT);
    assert_eq!(r.log_text().matches("batch committed").count(), 1, "a single batch:\n{}", r.log_text());
    let all: Vec<LogRecord> = before.iter().chain(&after).cloned().collect();
    assert_records_match_model(&env, &all);
    assert_outputs(&env, &all, &c, "record_counter", "count");
    assert!(!r.log_text().contains("record sent to the DLQ"), "nothing went to the DLQ");
}

// g. Detach during a backfill: both paths stop; --drop-output removes the output.
both_backends!(detach_during_backfill_stops_both_paths, detach_midway);
fn detach_midway(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let env = slow_backfill(&env);
    let data = workload(3_000, 81, &env.prefix, 1, 2_500);
    let c = data[0].collection_id.clone();
    let _r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    let keep = attach(&env, &c, "record_counter", "kept")["function_id"].as_str().unwrap().to_string();
    let drop_id = attach(&env, &c, "statistics", "dropped")["function_id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + WAIT;
    while function(&env, &keep)["backfill_done"].as_i64().unwrap_or(0) < 100
        || function(&env, &drop_id)["backfill_done"].as_i64().unwrap_or(0) < 100
    {
        assert!(Instant::now() < deadline, "backfills never progressed");
        std::thread::sleep(Duration::from_millis(50));
    }
    env.run(&["functions", "detach", &keep]);
    env.run(&["functions", "detach", &drop_id, "--drop-output"]);
    let frozen_keep = env.run(&["records", "kept"]);
    let done = function(&env, &keep)["backfill_done"].clone();
    // More live changes after the detach.
    env.produce(&jsonl_lines(&workload(500, 82, &env.prefix, 1, 2_500)));
    env.wait_caught_up(WAIT);
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(function(&env, &keep)["status"], "detached");
    assert_eq!(function(&env, &keep)["backfill_done"], done, "the backfill stopped");
    assert_eq!(env.run(&["records", "kept"]), frozen_keep, "the live path stopped");
    let listed = env.run(&["collections", "list", "--format", "json"]);
    assert!(!listed.contains("\"dropped\""), "the dropped output collection is gone: {listed}");
    assert!(!env.cmd().args(["records", "dropped"]).output().unwrap().status.success());
}

// h. Records updated and deleted after the marker while the backfill runs.
both_backends!(changes_after_the_marker_during_backfill_are_exact, preimage_path);
fn preimage_path(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let env = env.with_sections("[backfill]\nchunk_size = 10\npause_ms = 100\nscan_interval_ms = 500\n");
    let data = workload(3_000, 91, &env.prefix, 1, 600);
    let c = data[0].collection_id.clone();
    let _r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    let ids: Vec<String> = FUNCTIONS
        .iter()
        .map(|f| attach(&env, &c, f, &format!("out-{f}"))["function_id"].as_str().unwrap().to_string())
        .collect();
    // Heavy churn on the same ids (updates, deletes, re-adds) while the backfill walks.
    let churn: Vec<LogRecord> = workload(3_000, 92, &env.prefix, 1, 600);
    let mut overlapped = 0;
    for chunk in churn.chunks(300) {
        env.produce(&jsonl_lines(chunk));
        std::thread::sleep(Duration::from_millis(150));
        if ids.iter().any(|id| function(&env, id)["status"] == "backfilling") {
            overlapped += 1;
        }
    }
    assert!(overlapped >= 3, "the churn overlapped the backfill ({overlapped} of 10 churn chunks)");
    for id in &ids {
        wait_status(&env, id, "ready", WAIT);
    }
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = data.iter().chain(&churn).cloned().collect();
    for f in FUNCTIONS {
        assert_outputs(&env, &all, &c, f, &format!("out-{f}"));
    }
}
