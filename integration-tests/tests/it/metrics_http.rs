//! `/metrics`, `/healthz` and `/readyz` of a real `sluice process` replica against the
//! real broker: the partition gauges agree with `sluice offsets show`, the record counters
//! with what was produced, and readiness follows the assignment and halted partitions.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::log_record_to_json;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{free_port, http_get, require_kafka, Env, Replica};

const WAIT: Duration = Duration::from_secs(120);

/// `series → value` of a text exposition (series = name plus its labels as printed).
fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (k, v) = l.rsplit_once(' ').expect("sample line");
            (k.to_string(), v.parse().expect("numeric sample"))
        })
        .collect()
}

fn scrape(port: u16) -> BTreeMap<String, f64> {
    let (status, content_type, body) = http_get(port, "/metrics").expect("metrics endpoint answers");
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("application/openmetrics-text") || content_type.starts_with("text/plain"),
        "unexpected content type {content_type:?}"
    );
    samples(&body)
}

fn readyz(port: u16) -> Option<(u16, Value)> {
    http_get(port, "/readyz").map(|(status, _, body)| (status, serde_json::from_str(&body).expect("readyz JSON body")))
}

fn offsets(env: &Env) -> Vec<Value> {
    let v: Value = serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).unwrap();
    v.as_array().unwrap().clone()
}

/// Poll `/readyz` from the replica's start until it is ready; every earlier answer must be
/// a 503 saying it is starting. Returns how many such 503s were seen.
fn wait_ready(port: u16, replica: &mut Replica) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut starting = 0;
    loop {
        assert!(replica.child.try_wait().unwrap().is_none(), "replica exited:\n{}", replica.log_text());
        match readyz(port) {
            Some((200, v)) => {
                assert_eq!(v["ready"], true);
                return starting;
            }
            Some((503, v)) => {
                assert_eq!(v["ready"], false);
                let reason = v["reason"].as_str().unwrap_or_default();
                assert!(reason.starts_with("starting"), "not ready for another reason than start-up: {v}");
                starting += 1;
            }
            Some((status, v)) => panic!("/readyz answered {status}: {v}"),
            None => {}
        }
        assert!(Instant::now() < deadline, "replica never became ready:\n{}", replica.log_text());
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn workload(env: &Env) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records: 2_000,
        collections: 5,
        dim: 4,
        ids_per_collection: 30,
        mix: [50, 20, 15, 15],
        seed: 99,
        collection_prefix: format!("{}-c", env.prefix),
    })
    .collect()
}

#[test]
fn metrics_agree_with_offsets_show_and_the_workload() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("metrics-http");
    env.run(&["init", "--partitions", "3"]);
    let produced = workload(&env);
    let lines: Vec<String> = produced.iter().map(|r| log_record_to_json(r).to_string()).collect();
    env.produce(&lines);

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut replica = env.spawn_replica("r1", &[("SLUICE_HTTP", listen.as_str())]);
    let starting = wait_ready(port, &mut replica);
    eprintln!("/readyz answered 503 \"starting\" {starting} times before the first assignment");
    let (status, _, _) = http_get(port, "/healthz").expect("healthz answers");
    assert_eq!(status, 200);

    env.wait_caught_up(WAIT);

    // The gauges equal `offsets show` once the periodic refresh (5 s) has seen the last
    // group commit; both sides are polled until they agree, and until the group offset,
    // committed after the sysdb and only ever behind it, has caught up with the sysdb.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (rows, m) = loop {
        let rows = offsets(&env);
        let m = scrape(port);
        let agree = rows.iter().all(|r| {
            let p = r["partition"].as_i64().unwrap();
            let g = |name: &str| m.get(&format!("sluice_partition_{name}{{partition=\"{p}\"}}")).map(|v| *v as i64);
            g("sysdb_next_offset") == r["sysdb_next_offset"].as_i64()
                && r["group_offset"] == r["sysdb_next_offset"]
                && g("group_offset") == r["group_offset"].as_i64()
                && g("high_watermark") == r["high_watermark"].as_i64()
        });
        if agree {
            break (rows, m);
        }
        let gauges: Vec<_> = m.iter().filter(|(k, _)| k.starts_with("sluice_partition_")).collect();
        assert!(Instant::now() < deadline, "gauges never matched `offsets show`:\n{rows:#?}\n{gauges:#?}");
        std::thread::sleep(Duration::from_millis(500));
    };
    for r in &rows {
        let p = r["partition"].as_i64().unwrap();
        let label = format!("{{partition=\"{p}\"}}");
        assert_eq!(m[&format!("sluice_partition_lag_records{label}")], 0.0, "partition {p} caught up");
        assert_eq!(
            m[&format!("sluice_partition_commit_debt_records{label}")],
            0.0,
            "partition {p} group offset caught up"
        );
        assert_eq!(m[&format!("sluice_partition_halted{label}")], 0.0);
        assert_eq!(m[&format!("sluice_partition_lag_seconds{label}")], 0.0, "partition {p} caught up: 0 s behind");
    }
    // The process series of the real binary (Linux: read from /proc at scrape time).
    if cfg!(target_os = "linux") {
        for name in
            ["process_resident_memory_bytes", "process_cpu_seconds_total", "process_open_fds", "process_threads"]
        {
            assert!(m.get(name).is_some_and(|v| *v > 0.0), "{name} = {:?}", m.get(name));
        }
        assert!(m["process_threads"] >= 2.0, "a tokio runtime and librdkafka run threads");
    }
    let total_high: i64 = rows.iter().map(|r| r["high_watermark"].as_i64().unwrap()).sum();
    assert_eq!(total_high, produced.len() as i64, "every produced record is in the log");

    // Counters: every produced record is a data record, none goes to the DLQ, so each is
    // applied (possibly as an ignored no-op) and counted under its operation.
    let mut expected: BTreeMap<String, f64> = BTreeMap::new();
    for r in &produced {
        assert!(r.operation.is_data());
        *expected
            .entry(format!("sluice_records_processed_total{{operation=\"{}\"}}", r.operation.symbol()))
            .or_default() += 1.0;
    }
    let processed: BTreeMap<String, f64> = m
        .iter()
        .filter(|(k, v)| k.starts_with("sluice_records_processed_total{") && **v > 0.0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    assert_eq!(processed, expected, "records processed by operation");
    let sum = |prefix: &str| m.iter().filter(|(k, _)| k.starts_with(prefix)).map(|(_, v)| v).sum::<f64>();
    assert_eq!(sum("sluice_records_processed_total{"), produced.len() as f64);
    assert_eq!(sum("sluice_dlq_records_total"), 0.0, "no DLQ entries");
    assert!(sum("sluice_records_ignored_total{") > 0.0, "the mix has no-op records (e.g. deletes of absent ids)");
    let batches = m["sluice_batches_total"];
    assert!(batches >= 3.0, "at least one batch per partition, got {batches}");
    assert_eq!(m["sluice_batch_duration_seconds_count"], batches);
    assert_eq!(m["sluice_sysdb_commit_duration_seconds_count"], batches);
    assert_eq!(m["sluice_end_to_end_latency_seconds_count"], produced.len() as f64, "one latency per record");
    assert!(m["sluice_rebalances_total{kind=\"assign\"}"] >= 1.0);
    // Group commits are synchronous and coalesced, so their results are counted.
    assert!(m["sluice_offset_commits_total{result=\"ok\"}"] >= 1.0, "group commits counted");
    assert!(m.contains_key("sluice_offset_commits_total{result=\"failed\"}"));
    assert_eq!(m["sluice_sysdb_cas_conflicts_total"], 0.0);
    assert_eq!(m["sluice_gaps_total"], 0.0);
    assert_eq!(m.get("sluice_build_info{version=\"0.1.0\"}"), Some(&1.0));

    // Graceful stop: exits 0 and the HTTP server goes away with the processor.
    assert_eq!(replica.terminate(Duration::from_secs(30)), Some(0), "{}", replica.log_text());
    assert!(http_get(port, "/healthz").is_none(), "HTTP server still up after the replica exited");
}

#[test]
fn readyz_is_503_while_a_partition_is_halted() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("metrics-halted");
    env.run(&["init", "--partitions", "2"]);
    // A sysdb position beyond the (empty) log: partition 1 is assigned but halted.
    // `offsets reset` refuses such a target, so the position is written directly.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let sysdb = sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap();
        sysdb.reset_position(&env.log_topic(), 1, 1000, "test", "beyond the log").await.unwrap();
    });

    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let replica = env.spawn_replica("r1", &[("SLUICE_HTTP", listen.as_str())]);
    let deadline = Instant::now() + WAIT;
    let (status, v) = loop {
        match readyz(port) {
            Some((503, v)) if v["reason"].as_str().unwrap_or_default().starts_with("starting") => {}
            Some(answer) => break answer,
            None => {}
        }
        assert!(Instant::now() < deadline, "no assignment:\n{}", replica.log_text());
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status, 503, "{v}");
    assert_eq!(v["ready"], false);
    let reason = v["reason"].as_str().unwrap();
    assert!(reason.contains("partition 1 halted: the sysdb position 1000 is beyond"), "{reason}");
    assert_eq!(http_get(port, "/healthz").expect("healthz").0, 200, "alive while not ready");

    let m = scrape(port);
    assert_eq!(m["sluice_partition_halted{partition=\"1\"}"], 1.0);
    assert_eq!(m["sluice_partition_halted{partition=\"0\"}"], 0.0);
    assert_eq!(m["sluice_partition_sysdb_next_offset{partition=\"1\"}"], 1000.0);
    assert_eq!(m["sluice_partition_high_watermark{partition=\"1\"}"], 0.0);
    assert_eq!(
        m["sluice_partition_lag_records{partition=\"1\"}"], -1000.0,
        "sysdb beyond the log shows as negative lag"
    );
}

#[test]
fn a_replica_with_an_empty_assignment_is_ready() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("metrics-empty");
    env.run(&["init", "--partitions", "1"]);
    let (p1, p2) = (free_port(), free_port());
    let (l1, l2) = (format!("127.0.0.1:{p1}"), format!("127.0.0.1:{p2}"));
    let mut r1 = env.spawn_replica("r1", &[("SLUICE_HTTP", l1.as_str())]);
    wait_ready(p1, &mut r1);
    // The second member of a one-partition group gets nothing; it is still ready (and
    // exports no partition series).
    let mut r2 = env.spawn_replica("r2", &[("SLUICE_HTTP", l2.as_str())]);
    wait_ready(p2, &mut r2);
    let deadline = Instant::now() + WAIT;
    loop {
        let (m1, m2) = (scrape(p1), scrape(p2));
        let owned = |m: &BTreeMap<String, f64>| m.keys().any(|k| k.starts_with("sluice_partition_sysdb_next_offset{"));
        if owned(&m1) != owned(&m2) {
            break;
        }
        assert!(Instant::now() < deadline, "partition 0 is not owned by exactly one replica");
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(readyz(p1).unwrap().0, 200);
    assert_eq!(readyz(p2).unwrap().0, 200);
}

/// A partition stuck behind a record (its batch commit hangs) while the producers are idle:
/// the record lag stays flat, and `sluice_partition_lag_seconds` is the age of the last
/// applied record, growing while nothing moves, back to 0 once the commit lands.
#[test]
fn a_stuck_partition_shows_its_lag_in_seconds() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("metrics-stuck");
    env.run(&["init", "--partitions", "1"]);
    let records = workload(&env);
    let line = |i: usize| log_record_to_json(&records[i]).to_string();
    let before_first = std::time::SystemTime::now();
    env.produce(&[line(0)]);
    let after_first = std::time::SystemTime::now();

    // The first batch commits; the second one sleeps 20 s before its sysdb commit.
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut replica = env.spawn_replica(
        "r1",
        &[
            ("SLUICE_HTTP", listen.as_str()),
            ("SLUICE_FAILPOINT", "sleep_before_sysdb_commit:2"),
            ("SLUICE_FAILPOINT_SLEEP_MS", "20000"),
        ],
    );
    wait_ready(port, &mut replica);
    env.wait_caught_up(WAIT);
    assert_eq!(scrape(port)["sluice_partition_lag_seconds{partition=\"0\"}"], 0.0, "caught up: 0 s behind");
    std::thread::sleep(Duration::from_secs(2));
    env.produce(&[line(1)]);
    replica.wait_for_log("fail point sleep_before_sysdb_commit reached", WAIT);

    // The watermark refresh (5 s) sees the waiting record.
    let deadline = Instant::now() + Duration::from_secs(15);
    let m = loop {
        let m = scrape(port);
        if m.get("sluice_partition_lag_records{partition=\"0\"}") == Some(&1.0) {
            break m;
        }
        assert!(Instant::now() < deadline, "the waiting record never showed as lag: {m:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let age = |since: std::time::SystemTime| since.elapsed().unwrap().as_secs_f64();
    let behind = m["sluice_partition_lag_seconds{partition=\"0\"}"];
    // The age of record 0 (produced between before_first and after_first), to the
    // millisecond of its producer timestamp.
    assert!(
        behind >= age(after_first) - 1.0 && behind <= age(before_first) + 1.0,
        "lag seconds {behind}: not the age of the last applied record ({}..{})",
        age(after_first),
        age(before_first)
    );
    assert!(behind >= 2.0, "records wait, so the age counts: {behind}");
    std::thread::sleep(Duration::from_millis(1500));
    let later = scrape(port);
    assert_eq!(
        later["sluice_partition_sysdb_next_offset{partition=\"0\"}"],
        m["sluice_partition_sysdb_next_offset{partition=\"0\"}"],
        "the position is stuck"
    );
    let grown = later["sluice_partition_lag_seconds{partition=\"0\"}"];
    assert!(grown >= behind + 1.0, "lag seconds grow while nothing moves: {behind} -> {grown}");

    // The commit lands after the sleep: caught up, 0 s behind.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let m = scrape(port);
        if m.get("sluice_partition_lag_records{partition=\"0\"}") == Some(&0.0) {
            assert_eq!(m["sluice_partition_lag_seconds{partition=\"0\"}"], 0.0, "{m:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the stuck commit never landed:\n{}", replica.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(replica.terminate(Duration::from_secs(30)), Some(0), "{}", replica.log_text());
}
