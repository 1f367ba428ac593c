//! The processor end to end against the real broker, on SQLite and PostgreSQL, each
//! checked against the reference model (docs/design.md section 5).

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::faults::expect_abort_at;
use sluice_integration_tests::{assert_records_match_model, jsonl_lines, require_kafka, require_postgres, Env};

const WAIT: Duration = Duration::from_secs(120);

fn workload(records: usize, seed: u64, prefix: &str) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records,
        collections: 6,
        dim: 8,
        ids_per_collection: 40,
        mix: [50, 20, 15, 15],
        seed,
        collection_prefix: format!("{prefix}-c"),
    })
    .collect()
}

/// Every collection's records, record count and `log_position` in the sysdb equal the
/// reference model of everything produced, fed the real Kafka offsets, and no other
/// collection exists.
fn assert_matches_model(env: &Env, produced: &[LogRecord]) {
    assert_records_match_model(env, produced);
}

fn positions(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "show", "--format", "json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn init(env: &Env, partitions: u32) {
    env.run(&["init", "--partitions", &partitions.to_string()]);
}

fn crash_after_sysdb_commit_then_restart(env: Env) {
    init(&env, 3);
    let produced = workload(3_000, 7, &env.prefix);
    env.produce(&jsonl_lines(&produced));
    // Abort right after the 2nd sysdb commit, before its group commit.
    let mut r = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", "after_sysdb_commit:2")]);
    expect_abort_at(&mut r, "after_sysdb_commit", WAIT);
    let before: Value = serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).unwrap();
    let sysdb_sum: i64 = before.as_array().unwrap().iter().map(|r| r["sysdb_next_offset"].as_i64().unwrap_or(0)).sum();
    let group_sum: i64 = before.as_array().unwrap().iter().map(|r| r["group_offset"].as_i64().unwrap_or(0)).sum();
    assert!(group_sum < sysdb_sum, "the group offset lags the sysdb after the crash ({group_sum} vs {sysdb_sum})");

    let r2 = env.spawn_replica("restart", &[]);
    let offsets = env.wait_caught_up(WAIT);
    // The restarted replica started every partition that had a sysdb position there, not
    // at the lagging group offset: the committed batch is not applied a second time.
    let starts: BTreeMap<i64, String> = r2
        .log_text()
        .lines()
        .filter(|l| l.contains("partition starts"))
        .filter_map(|l| {
            let field = |k: &str| l.split_once(&format!(" {k}="))?.1.split_whitespace().next().map(str::to_string);
            Some((field("partition")?.parse().ok()?, format!("{}/{}", field("offset")?, field("source")?)))
        })
        .collect();
    for row in before.as_array().unwrap() {
        if let Some(pos) = row["sysdb_next_offset"].as_i64() {
            let p = row["partition"].as_i64().unwrap();
            assert_eq!(
                starts.get(&p),
                Some(&format!("{pos}/Sysdb")),
                "partition {p} restarts at its sysdb position (group offset {}):\n{}",
                row["group_offset"],
                r2.log_text()
            );
        }
    }
    assert_matches_model(&env, &produced);
    // The group offset catches up to the sysdb position.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let v: Value = serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).unwrap();
        if v.as_array().unwrap().iter().all(|r| r["group_offset"] == r["sysdb_next_offset"] || r["high_watermark"] == 0)
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "group offsets never caught up: {v:#} (was {offsets:#})");
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn crash_before_sysdb_commit_then_restart(env: Env) {
    init(&env, 2);
    let produced = workload(2_000, 11, &env.prefix);
    env.produce(&jsonl_lines(&produced));
    let mut r = env.spawn_replica("crash", &[("SLUICE_FAILPOINT", "before_sysdb_commit:1")]);
    expect_abort_at(&mut r, "before_sysdb_commit", WAIT);
    // The aborted batch was the first commit: nothing reached the sysdb.
    let after_crash = positions(&env);
    let committed: i64 = after_crash.iter().map(|p| p["sysdb_next_offset"].as_i64().unwrap_or(0)).sum();
    assert_eq!(committed, 0, "no batch committed before the abort: {after_crash:?}");
    let _r2 = env.spawn_replica("restart", &[]);
    env.wait_caught_up(WAIT);
    assert_matches_model(&env, &produced);
}

fn boundaries(env: Env) {
    // Empty partitions: 4 partitions, records for one collection only.
    init(&env, 4);
    let mut r = env.spawn_replica("r1", &[]);
    env.wait_caught_up(WAIT); // all empty: positions created at 0
    let produced: Vec<LogRecord> =
        workload(300, 3, &env.prefix).into_iter().filter(|r| r.collection_id.ends_with("-c1")).collect();
    env.produce(&jsonl_lines(&produced));
    env.wait_caught_up(WAIT); // a batch ending exactly at the high watermark
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0), "graceful stop exits 0");
    // Restart at the last offset: nothing is re-applied, new records are.
    let more: Vec<LogRecord> =
        workload(200, 4, &env.prefix).into_iter().filter(|r| r.collection_id.ends_with("-c1")).collect();
    env.produce(&jsonl_lines(&more));
    let _r2 = env.spawn_replica("r2", &[]);
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = produced.iter().chain(&more).cloned().collect();
    assert_matches_model(&env, &all);
}

#[test]
fn sqlite_crash_after_sysdb_commit_reapplies_nothing() {
    if !require_kafka() {
        return;
    }
    crash_after_sysdb_commit_then_restart(Env::sqlite("crash-after"));
}

#[test]
fn sqlite_crash_before_sysdb_commit_applies_batch_once() {
    if !require_kafka() {
        return;
    }
    crash_before_sysdb_commit_then_restart(Env::sqlite("crash-before"));
}

#[test]
fn sqlite_offset_boundaries_empty_partitions_and_restart_at_end() {
    if !require_kafka() {
        return;
    }
    boundaries(Env::sqlite("bounds"));
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_crash_after_sysdb_commit_reapplies_nothing() {
    if !require_kafka() || !require_postgres().await {
        return;
    }
    let env = Env::postgres("crash-after").await;
    tokio::task::spawn_blocking(move || crash_after_sysdb_commit_then_restart(env)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_crash_before_sysdb_commit_applies_batch_once() {
    if !require_kafka() || !require_postgres().await {
        return;
    }
    let env = Env::postgres("crash-before").await;
    tokio::task::spawn_blocking(move || crash_before_sysdb_commit_then_restart(env)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_offset_boundaries_empty_partitions_and_restart_at_end() {
    if !require_kafka() || !require_postgres().await {
        return;
    }
    let env = Env::postgres("bounds").await;
    tokio::task::spawn_blocking(move || boundaries(env)).await.unwrap();
}
