//! Soak: two replicas under steady load for a stated time; one of them is killed with
//! SIGKILL and restarted every few minutes, a function is attached midway. At the end the
//! state equals the reference model; the long-lived replica's RSS growth after warm-up,
//! open file descriptors and threads are reported and bounded.
//!
//! `SLUICE_SOAK_SECONDS` (default 150: the CI version), `SLUICE_SOAK_RATE` records/s
//! (default 1000), `SLUICE_SOAK_KILL_EVERY` seconds (default 30). The long run:
//! `scripts/soak.sh 30` (30 minutes, see docs/soak.md).

use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::{log_record_to_json, record_to_json};
use sluice::materialize::model::{reference, reference_outputs};
use sluice::record::{LogRecord, Record};
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{free_port, require_kafka, Env, Replica};

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn soak_two_replicas_with_kills_and_a_function_attached_midway() {
    if !require_kafka() {
        return;
    }
    let seconds = env_u64("SLUICE_SOAK_SECONDS", 150);
    let rate = env_u64("SLUICE_SOAK_RATE", 1000);
    let kill_every = env_u64("SLUICE_SOAK_KILL_EVERY", 30);
    let env = Env::sqlite("soak");
    env.run(&["init", "--partitions", "4"]);
    let long_port = free_port();
    let long_lived: Replica = env.spawn_replica("long-lived", &[("SLUICE_HTTP", &format!("127.0.0.1:{long_port}"))]);
    let pid = long_lived.child.id();
    let mut victim = env.spawn_replica("victim-0", &[]);
    let started = Instant::now();
    let mut produced: Vec<LogRecord> = Vec::new();
    let mut kills = 0;
    let mut last_kill = Instant::now();
    let mut attached: Option<String> = None;
    let mut attached_at = 0.0f64;
    let mut samples: Vec<(f64, u64, usize, u64)> = Vec::new(); // (t, rss KiB, fds, threads)
    let mut chunk_no = 0u64;
    let target_collection = "soak-target".to_string();
    while started.elapsed() < Duration::from_secs(seconds) {
        let tick = Instant::now();
        let chunk: Vec<LogRecord> = generate(&WorkloadSpec {
            records: rate as usize,
            collections: 8,
            dim: 8,
            ids_per_collection: 2_000,
            seed: 9_000 + chunk_no,
            collection_prefix: format!("{}-c", env.prefix),
            ..Default::default()
        })
        .map(|mut r| {
            if r.collection_id.ends_with("-c0") {
                r.collection_id = target_collection.clone();
            }
            r
        })
        .collect();
        chunk_no += 1;
        env.produce(&chunk.iter().map(|r| log_record_to_json(r).to_string()).collect::<Vec<_>>());
        produced.extend(chunk);
        if attached.is_none() && started.elapsed() > Duration::from_secs(seconds / 2) {
            let v: Value = serde_json::from_str(
                env.run(&["functions", "attach", &target_collection, "--function", "statistics", "--output", "soak-stats"]).trim(),
            )
            .unwrap();
            attached = Some(v["function_id"].as_str().unwrap().to_string());
            attached_at = started.elapsed().as_secs_f64();
        }
        if last_kill.elapsed() > Duration::from_secs(kill_every) {
            victim.kill9();
            kills += 1;
            victim = env.spawn_replica(&format!("victim-{kills}"), &[]);
            last_kill = Instant::now();
        }
        samples.push((
            started.elapsed().as_secs_f64(),
            proc_status(pid, "VmRSS:").unwrap_or(0),
            fds(pid),
            proc_status(pid, "Threads:").unwrap_or(0),
        ));
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    env.wait_caught_up(Duration::from_secs(300));
    if let Some(id) = &attached {
        let deadline = Instant::now() + Duration::from_secs(300);
        loop {
            let fl: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
            if fl.as_array().unwrap().iter().any(|f| f["id"] == *id && f["status"] == "ready") {
                break;
            }
            assert!(Instant::now() < deadline, "backfill never finished: {fl}");
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    // Exactness.
    let log: Vec<(i64, LogRecord)> = produced.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    for (cid, cm) in &reference(&log).collections {
        let expected: Vec<Value> = cm.records.values().map(record_to_json).collect();
        let actual: Vec<Value> = env.run(&["records", cid]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(actual, expected, "records of {cid}");
    }
    let model = reference_outputs(&log, &target_collection, "statistics");
    let expected: Vec<Value> = model
        .iter()
        .map(|(id, m)| record_to_json(&Record { id: id.clone(), embedding: m.embedding.clone(), metadata: m.metadata.clone(), document: m.document.clone(), offset: 0 }))
        .collect();
    let actual: Vec<Value> = env.run(&["records", "soak-stats"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(actual, expected, "statistics output");

    // Resources of the long-lived replica after warm-up: once every kind of activity has
    // happened (the function attached and its backfill run, a kill since then).
    let warm_from = attached_at + kill_every as f64;
    let warm = samples.iter().find(|s| s.0 >= warm_from).copied().expect("a sample after warm-up: run longer");
    let last = *samples.last().unwrap();
    let peak_rss = samples.iter().filter(|s| s.0 >= warm.0).map(|s| s.1).max().unwrap();
    let growth = (last.1 as f64 - warm.1 as f64) / warm.1.max(1) as f64 * 100.0;
    eprintln!(
        "soak: {seconds} s, {} records at {rate}/s, {kills} kills; long-lived replica: RSS {} KiB after warm-up -> {} KiB at the end (peak {peak_rss}, growth {growth:.1}%), fds {} -> {}, threads {} -> {}",
        produced.len(),
        warm.1,
        last.1,
        warm.2,
        last.2,
        warm.3,
        last.3
    );
    assert!(kills >= 2, "the victim was killed at least twice ({kills})");
    // The goal is < 10% (checked by the long run, `scripts/soak.sh`, which sets
    // SLUICE_SOAK_MAX_RSS_GROWTH=10); the short CI run is a leak smoke check with a wider
    // bound, because a replica's RSS also follows how many partitions it holds (each has
    // its own prefetch buffer) and two minutes see few rebalances.
    let max_growth = env_u64("SLUICE_SOAK_MAX_RSS_GROWTH", 25) as f64;
    assert!(growth < max_growth, "RSS grew {growth:.1}% after warm-up (bound {max_growth}%)");
    assert!(last.2 <= warm.2 + 8, "file descriptors leak: {} -> {}", warm.2, last.2);
    assert!(last.3 <= warm.3 + 4, "threads leak: {} -> {}", warm.3, last.3);
    drop(long_lived);
}
