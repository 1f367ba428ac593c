//! Soak: two replicas under steady load for a stated time; one of them is killed with
//! SIGKILL and restarted every few minutes, a function is attached midway. At the end the
//! state equals the reference model; the long-lived replica's RSS growth after warm-up,
//! open file descriptors and threads are reported and bounded.
//!
//! `SLUICE_SOAK_SECONDS` (default 150: the CI version), `SLUICE_SOAK_RATE` records/s
//! (default 1000), `SLUICE_SOAK_KILL_EVERY` seconds (default 30),
//! `SLUICE_SOAK_MAX_RSS_GROWTH` percent (default 25), `SLUICE_SOAK_REPLICA_ENV`
//! (`K=V,K=V`: extra environment for both replicas, e.g. `MALLOC_ARENA_MAX=2` to compare
//! allocator settings), `SLUICE_SOAK_SAMPLES` (a path: every sample as CSV). The long run:
//! `scripts/soak.sh 30` (30 minutes, see docs/soak.md).
//!
//! Every second the long-lived replica is sampled: the partitions it holds (the
//! `sluice_partition_sysdb_next_offset` series of its /metrics: one per assigned
//! partition), RSS with its anonymous and file-backed parts, open descriptors and threads.
//! A replica's RSS follows its assignment (each partition has its own prefetch queue and
//! processor state), so besides the overall growth the test reports the growth between
//! samples taken with the same number of partitions held.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::{log_record_to_json, record_to_json};
use sluice::functions::model::reference_outputs;
use sluice::record::partitioner::partition_for;
use sluice::record::{LogRecord, Record};
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{assert_records_match_model, free_port, http_get, require_kafka, Env, Replica};

/// How long an assignment must have been held before a sample counts as taken with it
/// (a newly assigned partition's prefetch queue and processor state fill first).
const SETTLE_SECONDS: f64 = 15.0;

fn env_u64(k: &str, d: u64) -> u64 {
    std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d)
}

fn proc_status(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn fds(pid: u32) -> Option<usize> {
    std::fs::read_dir(format!("/proc/{pid}/fd")).ok().map(|d| d.count())
}

/// The long-lived replica must still run: a dead one reads as no growth at all.
fn assert_alive(r: &mut Replica, t: f64) {
    if let Some(status) = r.child.try_wait().expect("try_wait") {
        panic!("the long-lived replica exited ({status}) at t={t:.0} s; its log:\n{}", r.log_text());
    }
}

/// One resource sample of the running replica; every value must be there and non-zero.
fn measure(pid: u32, t: f64) -> (u64, u64, u64, usize, u64) {
    let field = |f: &str| {
        proc_status(pid, f)
            .filter(|v| *v > 0)
            .unwrap_or_else(|| panic!("{f} of the long-lived replica (pid {pid}) at t={t:.0} s is missing or 0"))
    };
    let fds =
        fds(pid).filter(|n| *n > 0).unwrap_or_else(|| panic!("no open descriptors listed for pid {pid} at t={t:.0} s"));
    (
        field("VmRSS:"),
        field("RssAnon:"),
        proc_status(pid, "RssFile:").unwrap_or_else(|| panic!("RssFile of pid {pid} at t={t:.0} s")),
        fds,
        field("Threads:"),
    )
}

/// The partitions the replica holds, as a bit set: one
/// `sluice_partition_sysdb_next_offset{partition="N"}` series per assigned partition
/// (removed on revoke). `None` while /metrics does not answer.
fn partitions_held(port: u16) -> Option<u32> {
    let Some((200, _, body)) = http_get(port, "/metrics") else { return None };
    let mut held = 0u32;
    for l in body.lines().filter_map(|l| l.strip_prefix("sluice_partition_sysdb_next_offset{")) {
        let p: u32 = l.split_once("partition=\"")?.1.split_once('"')?.0.parse().ok()?;
        held |= 1 << p;
    }
    Some(held)
}

/// One sample of the long-lived replica (sizes in KiB).
#[derive(Debug, Clone, Copy)]
struct Sample {
    t: f64,
    /// Partitions held (bit set; `None`: /metrics did not answer).
    held: Option<u32>,
    /// Seconds the current assignment has lasted (since the last change).
    held_for: f64,
    rss: u64,
    anon: u64,
    file: u64,
    fds: usize,
    threads: u64,
}

fn mb(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

fn pct(from: u64, to: u64) -> f64 {
    (to as f64 - from as f64) / from.max(1) as f64 * 100.0
}

fn held_str(h: Option<u32>) -> String {
    h.map_or("?".into(), |h| (0..32).filter(|p| h & (1 << p) != 0).map(|p| p.to_string()).collect::<Vec<_>>().join(" "))
}

/// Median RSS and anonymous RSS (KiB) of some samples, and the time span they cover.
#[derive(Debug, Clone, Copy)]
struct Level {
    from: f64,
    to: f64,
    rss: u64,
    anon: u64,
}

fn level(samples: &[Sample]) -> Level {
    let median = |f: fn(&Sample) -> u64| {
        let mut v: Vec<u64> = samples.iter().map(f).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    Level { from: samples[0].t, to: samples[samples.len() - 1].t, rss: median(|s| s.rss), anon: median(|s| s.anon) }
}

/// The level of the first and of the last `window` seconds of `samples` (in time order),
/// if they span at least two windows. Medians, so that one sample taken in the middle of
/// a batch (RSS moves by a few MB within seconds) does not decide the growth.
fn growth(samples: &[Sample], window: f64) -> Option<(Level, Level)> {
    let (first, last) = (samples.first()?.t, samples.last()?.t);
    if last - first < 2.0 * window {
        return None;
    }
    let a: Vec<Sample> = samples.iter().filter(|s| s.t <= first + window).copied().collect();
    let b: Vec<Sample> = samples.iter().filter(|s| s.t >= last - window).copied().collect();
    Some((level(&a), level(&b)))
}

/// Settled samples after warm-up (the assignment unchanged for SETTLE_SECONDS), by the
/// number of partitions held.
fn settled_by_held(samples: &[Sample], warm_from: f64) -> BTreeMap<u32, Vec<Sample>> {
    let mut by_held: BTreeMap<u32, Vec<Sample>> = BTreeMap::new();
    for s in samples.iter().filter(|s| s.t >= warm_from && s.held_for >= SETTLE_SECONDS) {
        if let Some(h) = s.held {
            by_held.entry(h.count_ones()).or_default().push(*s);
        }
    }
    by_held
}

fn describe((a, b): (Level, Level)) -> String {
    format!(
        "{:.1} MB (t={:.0}-{:.0} s) -> {:.1} MB (t={:.0}-{:.0} s): {:+.1}% (anon {:.1} -> {:.1} MB, {:+.1}%)",
        mb(a.rss),
        a.from,
        a.to,
        mb(b.rss),
        b.from,
        b.to,
        pct(a.rss, b.rss),
        mb(a.anon),
        mb(b.anon),
        pct(a.anon, b.anon)
    )
}

fn table(samples: &[Sample], step: f64) -> String {
    let mut out = String::from("     t  partitions  settled    RSS MB   anon MB   file MB   fds  threads\n");
    let mut next = 0.0;
    let mut prev_held = None;
    for (i, s) in samples.iter().enumerate() {
        if s.t >= next || s.held != prev_held || i + 1 == samples.len() {
            let _ = writeln!(
                out,
                "{:>6.0}  {:>10}  {:>7}  {:>8.1}  {:>8.1}  {:>8.1}  {:>4}  {:>7}",
                s.t,
                held_str(s.held),
                if s.held_for >= SETTLE_SECONDS { "yes" } else { "" },
                mb(s.rss),
                mb(s.anon),
                mb(s.file),
                s.fds,
                s.threads
            );
            if s.t >= next {
                next = s.t + step;
            }
        }
        prev_held = s.held;
    }
    out
}

#[test]
fn soak_two_replicas_with_kills_and_a_function_attached_midway() {
    if !require_kafka() {
        return;
    }
    let seconds = env_u64("SLUICE_SOAK_SECONDS", 150);
    let rate = env_u64("SLUICE_SOAK_RATE", 1000);
    let kill_every = env_u64("SLUICE_SOAK_KILL_EVERY", 30);
    let replica_env: Vec<(String, String)> = std::env::var("SLUICE_SOAK_REPLICA_ENV")
        .unwrap_or_default()
        .split(',')
        .filter(|kv| !kv.trim().is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("SLUICE_SOAK_REPLICA_ENV is K=V,K=V");
            (k.trim().to_string(), v.trim().to_string())
        })
        .collect();
    let env = Env::sqlite("soak");
    env.run(&["init", "--partitions", "4"]);
    let long_port = free_port();
    let http = format!("127.0.0.1:{long_port}");
    let mut long_env: Vec<(&str, &str)> = replica_env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let victim_env = long_env.clone();
    long_env.push(("SLUICE_HTTP", &http));
    let mut long_lived: Replica = env.spawn_replica("long-lived", &long_env);
    let pid = long_lived.child.id();
    let mut victim = env.spawn_replica("victim-0", &victim_env);
    // The function goes on a collection of a partition the long-lived replica holds, so
    // that the replica whose resources are measured also applies it (the more demanding
    // path: the function's output and counters are written with every batch). Sticky
    // assignment keeps that partition there: a killed victim's partitions go to its
    // successor. Wait for the two replicas to share the partitions first.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (mut initial, mut since) = (None, Instant::now());
    loop {
        let held = partitions_held(long_port);
        if held != initial {
            (initial, since) = (held, Instant::now());
        }
        if initial.is_some_and(|h| (1..4).contains(&h.count_ones())) && since.elapsed() > Duration::from_secs(5) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas did not share the partitions within 60 s (long-lived holds {})",
            held_str(initial)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let initial = initial.unwrap();
    let target_collection = (0..)
        .map(|i| format!("soak-target-{i}"))
        .find(|c| initial & (1 << partition_for(c.as_bytes(), 4)) != 0)
        .unwrap();
    let target_partition = partition_for(target_collection.as_bytes(), 4);
    eprintln!(
        "soak: {seconds} s at {rate}/s, kill every {kill_every} s, replica env {replica_env:?}, logs in {}; the long-lived replica holds partitions {}, the function goes on {target_collection} (partition {target_partition})",
        env.dir.display(),
        held_str(Some(initial))
    );
    let started = Instant::now();
    let mut produced: Vec<LogRecord> = Vec::new();
    let mut kills = 0;
    let mut last_kill = Instant::now();
    let mut attached: Option<String> = None;
    let mut attached_at = 0.0f64;
    let mut samples: Vec<Sample> = Vec::new();
    let mut held_since = 0.0f64;
    let mut chunk_no = 0u64;
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
                env.run(&[
                    "functions",
                    "attach",
                    &target_collection,
                    "--function",
                    "statistics",
                    "--output",
                    "soak-stats",
                    "--format",
                    "json",
                ])
                .trim(),
            )
            .unwrap();
            attached = Some(v["function_id"].as_str().unwrap().to_string());
            attached_at = started.elapsed().as_secs_f64();
        }
        if last_kill.elapsed() > Duration::from_secs(kill_every) {
            victim.kill9();
            kills += 1;
            victim = env.spawn_replica(&format!("victim-{kills}"), &victim_env);
            last_kill = Instant::now();
        }
        let t = started.elapsed().as_secs_f64();
        assert_alive(&mut long_lived, t);
        let held = partitions_held(long_port);
        assert!(held.is_some(), "the long-lived replica's /metrics did not answer at t={t:.0} s");
        let (rss, anon, file, fds, threads) = measure(pid, t);
        assert_alive(&mut long_lived, t);
        if samples.last().is_some_and(|p| p.held != held) {
            held_since = t;
        }
        samples.push(Sample { t, held, held_for: t - held_since, rss, anon, file, fds, threads });
        if let Some(rest) = Duration::from_secs(1).checked_sub(tick.elapsed()) {
            std::thread::sleep(rest);
        }
    }
    if let Ok(path) = std::env::var("SLUICE_SOAK_SAMPLES") {
        let mut csv = String::from("t,held,held_for,rss_kib,anon_kib,file_kib,fds,threads\n");
        for s in &samples {
            let _ = writeln!(
                csv,
                "{:.1},{},{:.1},{},{},{},{},{}",
                s.t,
                held_str(s.held),
                s.held_for,
                s.rss,
                s.anon,
                s.file,
                s.fds,
                s.threads
            );
        }
        std::fs::write(&path, csv).expect("write SLUICE_SOAK_SAMPLES");
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
    assert_alive(&mut long_lived, started.elapsed().as_secs_f64());
    // Exactness.
    assert_records_match_model(&env, &produced);
    let log: Vec<(i64, LogRecord)> = produced.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let model = reference_outputs(&log, &target_collection, "statistics");
    let expected: Vec<Value> = model
        .iter()
        .map(|(id, m)| {
            record_to_json(&Record {
                id: id.clone(),
                embedding: m.embedding.clone(),
                metadata: m.metadata.clone(),
                document: m.document.clone(),
                offset: 0,
            })
        })
        .collect();
    let actual: Vec<Value> = env
        .run(&["records", "soak-stats", "--format", "jsonl"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(actual, expected, "statistics output");

    // Resources of the long-lived replica after warm-up: once every kind of activity has
    // happened (the function attached and its backfill run, a kill since then).
    let warm_from = attached_at + kill_every as f64;
    let warm = *samples.iter().find(|s| s.t >= warm_from).expect("a sample after warm-up: run longer");
    let last = *samples.last().unwrap();
    let peak_rss = samples.iter().filter(|s| s.t >= warm.t).map(|s| s.rss).max().unwrap();
    let raw_growth = pct(warm.rss, last.rss);
    eprintln!("soak: long-lived replica samples (every {} s and at every assignment change; settled: the assignment held for >= {SETTLE_SECONDS} s):", (seconds / 90).max(5));
    eprint!("{}", table(&samples, (seconds / 90).max(5) as f64));
    eprintln!(
        "soak: {seconds} s, {} records at {rate}/s, {kills} kills; long-lived replica: RSS {:.1} MB ({} partitions held) after warm-up (t={:.0} s) -> {:.1} MB ({} held) at the end (peak {:.1} MB), first to last sample {raw_growth:+.1}% (anon {:.1} -> {:.1} MB, file {:.1} -> {:.1} MB), fds {} -> {}, threads {} -> {}",
        produced.len(),
        mb(warm.rss),
        held_str(warm.held),
        warm.t,
        mb(last.rss),
        held_str(last.held),
        mb(peak_rss),
        mb(warm.anon),
        mb(last.anon),
        mb(warm.file),
        mb(last.file),
        warm.fds,
        last.fds,
        warm.threads,
        last.threads
    );
    // Growth levels: medians of the first and the last `window` seconds after warm-up,
    // over all samples (overall) and over the settled samples of each assignment size
    // (like for like: not fooled by the replica holding more or fewer partitions).
    let window = ((seconds as f64 - warm_from) / 4.0).clamp(10.0, 60.0);
    let after: Vec<Sample> = samples.iter().filter(|s| s.t >= warm_from).copied().collect();
    let overall = growth(&after, window).expect("samples after warm-up: run longer");
    let with_target = after.iter().filter(|s| s.held.is_some_and(|h| h & (1 << target_partition) != 0)).count();
    eprintln!("soak: the long-lived replica held the function's partition {target_partition} in {with_target} of {} samples after warm-up", after.len());
    eprintln!("soak: overall (medians of {window:.0} s windows): {}", describe(overall));
    let by_held = settled_by_held(&samples, warm_from);
    for (h, ss) in &by_held {
        match growth(ss, window) {
            Some(g) => eprintln!("soak: holding {h} partition(s), settled, {} samples: {}", ss.len(), describe(g)),
            None => {
                eprintln!("soak: holding {h} partition(s), settled, {} samples: too short a span to compare", ss.len())
            }
        }
    }
    // The bound applies like for like: to the settled samples of the assignment size held
    // longest after warm-up; to all samples if no assignment lasted two windows.
    let (what, bounded) = by_held
        .iter()
        .max_by_key(|(_, ss)| ss.len())
        .and_then(|(h, ss)| Some((format!("holding {h} partition(s)"), growth(ss, window)?)))
        .unwrap_or_else(|| ("overall (no assignment lasted two windows)".into(), overall));
    let bounded_growth = pct(bounded.0.rss, bounded.1.rss);
    assert!(kills >= 2, "the victim was killed at least twice ({kills})");
    // The goal is < 10% (the long run, `scripts/soak.sh`, sets SLUICE_SOAK_MAX_RSS_GROWTH=10);
    // the CI run compares two ~11 s windows 45 s apart: a leak smoke check, wider bound.
    let max_growth = env_u64("SLUICE_SOAK_MAX_RSS_GROWTH", 25) as f64;
    assert!(
        bounded_growth < max_growth,
        "RSS grew {bounded_growth:.1}% after warm-up, {what} (bound {max_growth}%; overall {:+.1}%)",
        pct(overall.0.rss, overall.1.rss)
    );
    assert!(last.fds <= warm.fds + 8, "file descriptors leak: {} -> {}", warm.fds, last.fds);
    assert!(last.threads <= warm.threads + 4, "threads leak: {} -> {}", warm.threads, last.threads);
    assert_alive(&mut long_lived, started.elapsed().as_secs_f64());
    drop(long_lived);
}
