//! A replica aborted (like `kill -9`) at each fail point of the backfill chunk commit, the
//! outbox relay and the group offset commit, then restarted: the records, the function
//! outputs and the backfill counters end exactly at the reference model's, and the group
//! offset is never ahead of the sysdb.

use std::time::Duration;

use serde_json::Value;
use sluice::record::LogRecord;
use sluice_integration_tests::both_backends;
use sluice_integration_tests::faults::{
    assert_group_never_ahead, assert_outputs, attach, expect_abort_at, function, offsets, wait_log, wait_status,
    workload,
};
use sluice_integration_tests::{assert_records_match_model, jsonl_lines, Env};

const WAIT: Duration = Duration::from_secs(120);

/// Data in the log, a replica that materialized it and stopped; a function attached while
/// no replica runs. Returns the data, the collection and the function id.
fn attached_while_stopped(env: &Env, function_name: &str, output: &str) -> (Vec<LogRecord>, String, String) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(1_500, 7, &env.prefix, 2, 700);
    let c = data[0].collection_id.clone();
    let mut r = env.spawn_replica("r0", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));
    let id = attach(env, &c, function_name, output)["function_id"].as_str().unwrap().to_string();
    (data, c, id)
}

/// The backfill is killed at `point` (3rd chunk), restarted, and ends exact.
fn backfill_chunk_crash(env: Env, point: &str) {
    let env = env.with_sections("[backfill]\nchunk_size = 50\nscan_interval_ms = 500\n");
    let (data, c, id) = attached_while_stopped(&env, "statistics", "stats");
    let mut crash = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", &format!("{point}:3"))]);
    expect_abort_at(&mut crash, point, WAIT);
    let f = function(&env, &id);
    assert_eq!(f["status"], "backfilling", "killed mid-backfill: {f}");
    let done_at_crash = f["backfill_done"].as_i64().unwrap();
    // Two chunks committed before the 3rd hit; after_*: the 3rd committed too.
    let committed = if point.starts_with("after") { 150 } else { 100 };
    assert_eq!(done_at_crash, committed, "chunks committed before the crash: {f}");
    let _r = env.spawn_replica("r1", &[]);
    let f = wait_status(&env, &id, "ready", WAIT);
    assert_eq!(f["backfill_done"], f["backfill_total"], "every as-of-marker record once: {f}");
    env.wait_caught_up(WAIT);
    assert_records_match_model(&env, &data);
    assert_outputs(&env, &data, &c, "statistics", "stats");
}

both_backends!(killed_before_a_backfill_chunk_commit, before_chunk);
fn before_chunk(env: Env) {
    backfill_chunk_crash(env, "before_backfill_chunk_commit");
}

both_backends!(killed_after_a_backfill_chunk_commit, after_chunk);
fn after_chunk(env: Env) {
    backfill_chunk_crash(env, "after_backfill_chunk_commit");
}

// The relay published a pending marker and died before marking it sent: the restarted
// relay publishes it again, the processor ignores the duplicate, one backfill.
both_backends!(killed_after_the_relay_published_a_marker, after_relay);
fn after_relay(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let data = workload(1_000, 9, &env.prefix, 2, 400);
    let c = data[0].collection_id.clone();
    env.produce(&jsonl_lines(&data));
    // The attach command cannot reach any broker: the marker stays in the outbox.
    let out = env
        .cmd()
        .args(["functions", "attach", &c, "--function", "record_counter", "--output", "count", "--format", "json"])
        .env("SLUICE_BROKERS", "127.0.0.1:1")
        .output()
        .unwrap();
    assert!(out.status.success(), "attach with the marker pending: {}", String::from_utf8_lossy(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["marker"], "pending");
    let id = v["function_id"].as_str().unwrap().to_string();
    let mut crash = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", "after_relay_publish:1")]);
    expect_abort_at(&mut crash, "after_relay_publish", WAIT);
    assert!(
        !crash.log_text().contains("outbox relay published a pending marker"),
        "died before marking the marker sent"
    );
    let r = env.spawn_replica("r1", &[]);
    // The outbox row was still pending: published a second time.
    wait_log(&r, "outbox relay published a pending marker", WAIT);
    let f = wait_status(&env, &id, "ready", WAIT);
    env.wait_caught_up(WAIT);
    assert_eq!(f["backfill_done"], f["backfill_total"], "{f}");
    let processed = crash.log_text().matches("backfill marker processed").count()
        + r.log_text().matches("backfill marker processed").count();
    assert_eq!(processed, 1, "two markers in the log, one backfill");
    assert_records_match_model(&env, &data);
    assert_outputs(&env, &data, &c, "record_counter", "count");
}

/// A replica killed at `point` (2nd group commit) while processing; restarted: exact, and
/// the group offset never ahead of the sysdb (checked right after the crash too).
fn group_commit_crash(env: Env, point: &str) {
    env.run(&["init", "--partitions", "2"]);
    let first = workload(800, 11, &env.prefix, 4, 100);
    env.produce(&jsonl_lines(&first));
    let mut crash = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", &format!("{point}:2"))]);
    // Keep records coming so that more than one commit is due.
    let second = workload(800, 12, &env.prefix, 4, 100);
    for chunk in second.chunks(200) {
        if crash.child.try_wait().ok().flatten().is_some() {
            break;
        }
        env.produce(&jsonl_lines(chunk));
        std::thread::sleep(Duration::from_millis(300));
    }
    expect_abort_at(&mut crash, point, WAIT);
    assert_group_never_ahead(&env);
    let all: Vec<LogRecord> = first.iter().chain(&second).cloned().collect();
    let r = env.spawn_replica("r1", &[]);
    // What the loop did not produce before the crash (it produces in order) goes in now.
    let in_log: i64 = offsets(&env).iter().map(|o| o["high_watermark"].as_i64().unwrap_or(0)).sum();
    if (in_log as usize) < all.len() {
        env.produce(&jsonl_lines(&all[in_log as usize..]));
    }
    env.wait_caught_up(WAIT);
    assert_records_match_model(&env, &all);
    // The restarted replica commits the group offset up to the sysdb, never past it.
    let deadline = std::time::Instant::now() + WAIT;
    while offsets(&env).iter().any(|o| o["group_offset"] != o["sysdb_next_offset"]) {
        assert_group_never_ahead(&env);
        assert!(std::time::Instant::now() < deadline, "the group offset never caught up");
        std::thread::sleep(Duration::from_millis(300));
    }
    drop(r);
}

both_backends!(killed_before_a_group_commit, before_group);
fn before_group(env: Env) {
    group_commit_crash(env, "before_group_commit");
}

both_backends!(killed_after_a_group_commit, after_group);
fn after_group(env: Env) {
    group_commit_crash(env, "after_group_commit");
}
