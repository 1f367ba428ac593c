//! Reads that include a write (docs/reading.md), against the real broker on SQLite and
//! PostgreSQL: a thousand produce-then-read pairs over HTTP with a replica under load;
//! the same while one processor is killed (-9) and another frozen past the session
//! timeout; tokens ahead of the log (the wait runs out and names the partition), `--wait
//! 0`, tokens of another topic and malformed ones, merged tokens, `read_level=latest`,
//! and a collection's freshness.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice_integration_tests::{both_backends, free_port, http, metric_samples, try_http, Env, LogProducer, Replica};

const WAIT: Duration = Duration::from_secs(120);
/// Produce-then-read pairs per scenario, and the clients that share them.
const PAIRS: usize = 1000;
const CLIENTS: usize = 8;

fn init(env: &Env, partitions: u32) {
    env.run(&["init", "--partitions", &partitions.to_string()]);
}

fn replica_http(env: &Env, name: &str, args: &[&str]) -> (Replica, u16) {
    let port = free_port();
    let r = env.spawn_replica_with(name, args, &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    let deadline = Instant::now() + WAIT;
    while try_http(port, "GET", "/healthz", None).is_none() {
        assert!(Instant::now() < deadline, "replica {name} never answered on {port}:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    (r, port)
}

/// W1's shape in the background (64 collections, 384-dim embeddings) at a steady pace
/// until `stop`: the replica under load while the clients read their writes.
fn background_load(env: &Env, partitions: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<usize> {
    let env = env.clone();
    std::thread::spawn(move || {
        let producer = LogProducer::new(&env, partitions, 1 << 20);
        let spec = sluice::workload::WorkloadSpec {
            records: usize::MAX,
            collections: 64,
            dim: 384,
            ids_per_collection: 1000,
            mix: [10, 20, 60, 10],
            seed: 11,
            collection_prefix: "w1-c".into(),
        };
        let mut sent = 0;
        let started = Instant::now();
        for r in sluice::workload::generate(&spec) {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            producer.send(&r);
            sent += 1;
            // About 2,000 records/s: load the replica without starving the clients.
            if sent % 200 == 0 {
                let due = Duration::from_millis(sent as u64 / 2);
                if let Some(wait) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(wait);
                }
            }
        }
        producer.flush();
        sent
    })
}

/// `CLIENTS` threads share `PAIRS` pairs: each upserts its probe record over HTTP (to
/// `write_port`) with the pair's number as its document, then reads the collection at
/// least the answer's token (from `read_port`) and requires exactly that document: the
/// read includes its write, and no later write of the same client exists yet. Returns
/// the wait of each read.
fn produce_then_read(write_port: u16, read_port: u16, wait_ms: u64) -> Vec<Duration> {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let next = next.clone();
            std::thread::spawn(move || {
                let collection = format!("rw-client-{c}");
                let mut waits = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= PAIRS {
                        return waits;
                    }
                    let body = json!({"id": "probe", "operation": "upsert", "document": i.to_string(), "embedding": [1.0, 2.0]})
                        .to_string();
                    let (status, answer) =
                        http(write_port, "POST", &format!("/api/v1/collections/{collection}/records"), Some(&body));
                    assert_eq!(status, 202, "write {i}: {answer}");
                    let token = answer["token"].as_str().unwrap_or_else(|| panic!("write {i}: no token in {answer}"));
                    let t = Instant::now();
                    let (status, read) = http(
                        read_port,
                        "GET",
                        &format!("/api/v1/collections/{collection}/records?at_least={token}&wait_ms={wait_ms}"),
                        None,
                    );
                    waits.push(t.elapsed());
                    assert_eq!(status, 200, "read {i} at least {token}: {read}");
                    let docs: Vec<&str> =
                        read["records"].as_array().unwrap().iter().filter_map(|r| r["document"].as_str()).collect();
                    assert_eq!(docs, vec![i.to_string().as_str()], "read {i} at least {token} misses its write: {read}");
                }
            })
        })
        .collect();
    let mut waits: Vec<Duration> = clients.into_iter().flat_map(|c| c.join().expect("client")).collect();
    waits.sort();
    waits
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 * p) as usize).min(sorted.len() - 1)]
}

fn under_load(env: Env) {
    let partitions = 4;
    init(&env, partitions);
    let (replica, port) = replica_http(&env, "r1", &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let load = background_load(&env, partitions, stop.clone());
    let waits = produce_then_read(port, port, 60_000);
    stop.store(true, Ordering::Relaxed);
    let sent = load.join().expect("load");
    eprintln!(
        "{PAIRS} produce-then-read pairs beside {sent} W1 records: read waits p50 {:?}, p99 {:?}, max {:?}",
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        waits.last().unwrap()
    );
    assert!(sent > 1000, "the background load sent only {sent} records");
    // The replica counted the waits: one `covered` observation per read.
    let m = metric_samples(&http_text(port, "/metrics"));
    let covered = m.get("sluice_read_wait_seconds_count{result=\"covered\"}").copied().unwrap_or(0.0);
    assert_eq!(covered as usize, PAIRS, "sluice_read_wait_seconds_count{{result=\"covered\"}}");
    drop(replica);
}

fn http_text(port: u16, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

both_backends!(a_thousand_reads_include_their_writes_under_load, under_load);

fn signal(r: &Replica, sig: &str) {
    let ok = Command::new("kill").arg(format!("-{sig}")).arg(r.child.id().to_string()).status().unwrap().success();
    assert!(ok, "kill -{sig}");
}

fn kills_and_freezes(env: Env) {
    let partitions = 4;
    init(&env, partitions);
    // The HTTP front: no processor of its own (`--roles backfill`), so its waiters learn
    // every position from the shared poll of the sysdb; it is never killed.
    let (_front, port) = replica_http(&env, "front", &["--roles", "backfill"]);
    let mut p1 = env.spawn_replica("p1", &[]);
    let p2 = env.spawn_replica("p2", &[]);
    let stop = Arc::new(AtomicBool::new(false));
    let chaos = {
        let stop = stop.clone();
        let env = env.clone();
        std::thread::spawn(move || {
            let mut cycles = 0;
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(2));
                p1.kill9();
                std::thread::sleep(Duration::from_secs(1));
                p1 = env.spawn_replica(&format!("p1-{cycles}"), &[]);
                std::thread::sleep(Duration::from_secs(2));
                // Frozen past the 6 s session timeout: its partitions move to p1.
                signal(&p2, "STOP");
                std::thread::sleep(Duration::from_secs(8));
                signal(&p2, "CONT");
                cycles += 1;
            }
            (p1, p2, cycles)
        })
    };
    let waits = produce_then_read(port, port, 60_000);
    stop.store(true, Ordering::Relaxed);
    let (_p1, _p2, cycles) = chaos.join().expect("chaos");
    eprintln!(
        "{PAIRS} pairs through {cycles} kill and freeze cycles: read waits p50 {:?}, p99 {:?}, max {:?}",
        percentile(&waits, 0.5),
        percentile(&waits, 0.99),
        waits.last().unwrap()
    );
    assert!(cycles >= 1, "no kill and freeze cycle happened during the reads");
}

both_backends!(reads_include_their_writes_while_replicas_are_killed_and_frozen, kills_and_freezes);

/// A CLI read: `(exit code, stdout, stderr)`.
fn cli(env: &Env, args: &[&str]) -> (i32, String, String) {
    let out = env.cmd().args(args).output().expect("spawn sluice");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn produced_token(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("token: "))
        .unwrap_or_else(|| panic!("no token line in {out:?}"))
        .to_string()
}

/// A token for the same topic whose `partition` asks for `offset`.
fn raised(token: &str, partition: i32, offset: i64) -> String {
    let fingerprint = token.split('.').nth(1).expect("fingerprint");
    format!("1.{fingerprint}.{partition}-{offset}")
}

fn refusals(env: Env) {
    init(&env, 2);
    let lines: Vec<String> = (0..20)
        .map(|i| {
            json!({"collection": "c", "id": format!("id-{i}"), "operation": "upsert", "document": "d"}).to_string()
        })
        .collect();
    let path = env.dir.join("in.jsonl");
    std::fs::write(&path, lines.join("\n")).unwrap();
    let out = env.run(&["produce", path.to_str().unwrap()]);
    let token = produced_token(&out);
    let json_out: Value =
        serde_json::from_str(&env.run(&["produce", path.to_str().unwrap(), "--format", "json"])).unwrap();
    let token2 = json_out["token"].as_str().expect("token field of --format json").to_string();

    // No replica yet: the token is not covered. --wait 0 fails at once, naming the gap.
    let t = Instant::now();
    let (code, _, err) = cli(&env, &["records", "c", "--at-least", &token, "--wait", "0"]);
    assert_eq!(code, 1, "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "--wait 0 took {:?}", t.elapsed());
    assert!(err.contains("has not reached the read token") && err.contains("its sysdb position is 0"), "{err}");
    // A bounded wait runs out and says so.
    let t = Instant::now();
    let (code, _, err) = cli(&env, &["collections", "list", "--at-least", &token, "--wait", "1500ms"]);
    assert_eq!(code, 1, "{err}");
    assert!(t.elapsed() >= Duration::from_millis(1500), "gave up after {:?}", t.elapsed());
    assert!(err.contains("records to go"), "{err}");

    // With a replica the same reads succeed, merged tokens included.
    let (_r, port) = replica_http(&env, "r1", &[]);
    let merged = env.run(&["token", "merge", &token, &token2]).trim().to_string();
    let out = env.run(&["records", "c", "--at-least", &merged, "--format", "jsonl"]);
    assert_eq!(out.lines().count(), 20, "{out}");
    let sum = env.run(&["checksum", "--at-least", &format!("{token},{token2}")]);
    assert!(sum.starts_with("records=20 "), "{sum}");
    // `token latest` of the collection's partition is the merged token of both writes
    // (nothing else was written there); of all partitions it covers them too.
    let p_of = |t: &str| t.rsplit('.').next().unwrap().split_once('-').unwrap().0.to_string();
    let latest = env.run(&["token", "latest", "--partition", &p_of(&merged)]).trim().to_string();
    assert_eq!(latest, merged, "token latest of the written partition");
    let all = env.run(&["token", "latest", "--format", "json"]);
    let all: Value = serde_json::from_str(&all).unwrap();
    let all = all["token"].as_str().expect("token field").to_string();
    assert_eq!(all.rsplit('.').next().unwrap().split('_').count(), 2, "one entry per partition: {all}");
    let out = env.run(&["records", "c", "--at-least", &all, "--wait", "30s", "--format", "jsonl"]);
    assert_eq!(out.lines().count(), 20, "{out}");

    // A token ahead of the log: the wait runs out naming the partition and the gap.
    let (p, _) = token.rsplit('.').next().unwrap().split('_').next().unwrap().split_once('-').unwrap();
    let ahead = raised(&token, p.parse().unwrap(), 1_000_000);
    let t = Instant::now();
    let (status, body) =
        http(port, "GET", &format!("/api/v1/collections/c/records?at_least={ahead}&wait_ms=700"), None);
    assert_eq!((status, body["error"].as_str()), (504, Some("token_not_reached")), "{body}");
    assert!(t.elapsed() >= Duration::from_millis(700));
    let msg = body["message"].as_str().unwrap();
    assert!(msg.contains(&format!("partition {p} ")) && msg.contains("the token asks for 1000000"), "{msg}");
    let (code, _, err) = cli(&env, &["records", "c", "--at-least", &ahead, "--wait", "0"]);
    assert_eq!(code, 1, "{err}");

    // A token of another topic, and a malformed one: usage errors, 400 over HTTP.
    let other = Env::sqlite("read-tokens-other");
    init(&other, 1);
    let other_path = other.dir.join("in.jsonl");
    std::fs::write(&other_path, &lines[0]).unwrap();
    let foreign = produced_token(&other.run(&["produce", other_path.to_str().unwrap()]));
    for bad in [foreign.as_str(), "1.zz", "7.0000000000000001.0-1"] {
        let (code, _, err) = cli(&env, &["records", "c", "--at-least", bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        let (status, body) = http(port, "GET", &format!("/api/v1/collections?at_least={bad}"), None);
        assert_eq!((status, body["error"].as_str()), (400, Some("bad_token")), "{bad}: {body}");
    }
    let (code, _, err) = cli(&env, &["token", "merge", &token, &foreign]);
    assert_eq!(code, 2, "{err}");

    // read_level=latest: records produced without any token are in the answer.
    let more: Vec<String> = (20..30)
        .map(|i| {
            json!({"collection": "c", "id": format!("id-{i}"), "operation": "upsert", "document": "d"}).to_string()
        })
        .collect();
    std::fs::write(&path, more.join("\n")).unwrap();
    env.run(&["produce", path.to_str().unwrap()]);
    let out = env.run(&["records", "c", "--read-level", "latest", "--format", "jsonl"]);
    assert_eq!(out.lines().count(), 30, "{out}");

    // Freshness: caught up, with the last change's time; over HTTP the same numbers.
    let f: Value = serde_json::from_str(&env.run(&["collections", "freshness", "c", "--format", "json"])).unwrap();
    assert_eq!(f["lag_records"], 0, "{f}");
    assert_eq!(f["lag_seconds"], 0.0, "{f}");
    assert_eq!(f["sysdb_next_offset"], f["high_watermark"], "{f}");
    assert!(f["last_applied_time_ms"].as_i64().is_some(), "{f}");
    let (status, h) = http(port, "GET", "/api/v1/collections/c/freshness", None);
    assert_eq!(status, 200, "{h}");
    assert_eq!(
        (h["partition"].clone(), h["last_applied_offset"].clone()),
        (f["partition"].clone(), f["last_applied_offset"].clone())
    );
    let (status, h) = http(port, "GET", "/api/v1/collections/nope/freshness", None);
    assert_eq!((status, h["error"].as_str()), (404, Some("unknown_collection")), "{h}");
}

both_backends!(tokens_ahead_of_the_log_and_of_other_topics_are_refused, refusals);
