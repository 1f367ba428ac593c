//! Database outages while processing and backfilling: PostgreSQL stopped and restarted,
//! the SQLite file locked by another process. The processor retries with backoff, never
//! lets the group offset pass the sysdb, reports not-ready while the sysdb is
//! unreachable, and ends with exact results.
//!
//! One test per backend, run one after the other inside a single test function. The
//! PostgreSQL one stops and restarts a server of its own (`deploy/local/postgres.sh` with
//! `SLUICE_PG_DIR` and `SLUICE_PG_PORT`), never the shared one: the other tests of the
//! binary run at the same time.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::record_to_json;
use sluice::functions::model::reference_outputs;
use sluice::record::{LogRecord, Record};
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{
    assert_records_match_model, free_port, http_get, jsonl_lines, metric_samples, repo_root, require_kafka, Env,
    Replica,
};

const WAIT: Duration = Duration::from_secs(180);

fn workload(n: usize, seed: u64, prefix: &str) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records: n,
        collections: 4,
        dim: 4,
        ids_per_collection: 300,
        seed,
        collection_prefix: format!("{prefix}-c"),
        ..Default::default()
    })
    .collect()
}

fn readyz(port: u16) -> Option<(u16, String)> {
    http_get(port, "/readyz").map(|(s, _, b)| (s, b))
}

/// Every partition's group offset gauge is at or below its sysdb gauge. /metrics must
/// answer (also while the sysdb is down) and show the partitions' sysdb positions.
fn group_never_ahead(port: u16) {
    let Some((200, _, body)) = http_get(port, "/metrics") else {
        panic!("/metrics on port {port} did not answer 200: {:?}", http_get(port, "/metrics").map(|(s, _, _)| s))
    };
    let m = metric_samples(&body);
    assert!(
        m.keys().any(|k| k.starts_with("sluice_partition_sysdb_next_offset{")),
        "no sluice_partition_sysdb_next_offset series on /metrics:\n{body}"
    );
    for (k, group) in m.iter().filter(|(k, _)| k.starts_with("sluice_partition_group_offset{")) {
        let sysdb_key = k.replace("sluice_partition_group_offset", "sluice_partition_sysdb_next_offset");
        let sysdb = m.get(&sysdb_key).unwrap_or_else(|| panic!("{k} has no {sysdb_key} beside it"));
        assert!(group <= sysdb, "group offset {group} ahead of the sysdb {sysdb} ({k})");
    }
}

fn assert_exact(env: &Env, log: &[LogRecord], function_output: Option<(&str, &str)>) {
    assert_records_match_model(env, log);
    let indexed: Vec<(i64, LogRecord)> = log.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    if let Some((collection, output)) = function_output {
        let model = reference_outputs(&indexed, collection, "statistics");
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
            .run(&["records", output, "--format", "jsonl"])
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(actual, expected, "statistics output");
    }
}

/// Produce in the background while `during` runs; returns everything produced.
fn produce_during(env: &Env, seed: u64, during: impl FnOnce()) -> Vec<LogRecord> {
    let chunks: Vec<Vec<LogRecord>> = (0..10).map(|i| workload(300, seed + i, &env.prefix)).collect();
    let all: Vec<LogRecord> = chunks.iter().flatten().cloned().collect();
    let env2 = env.clone();
    let producer = std::thread::spawn(move || {
        for c in &chunks {
            env2.produce(&jsonl_lines(c));
            std::thread::sleep(Duration::from_millis(300));
        }
    });
    during();
    producer.join().unwrap();
    all
}

fn wait_not_ready(port: u16, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        group_never_ahead(port);
        if let Some((503, body)) = readyz(port) {
            if body.contains(needle) {
                return;
            }
        }
        assert!(Instant::now() < deadline, "/readyz never reported {needle:?}: {:?}", readyz(port));
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn wait_ready(port: u16) {
    let deadline = Instant::now() + WAIT;
    while readyz(port).map(|(s, _)| s) != Some(200) {
        group_never_ahead(port);
        assert!(Instant::now() < deadline, "/readyz never became 200 again: {:?}", readyz(port));
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn function_status(env: &Env, id: &str) -> Value {
    let fl: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
    fl.as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("function {id} not listed: {fl}"))
}

/// This test's own PostgreSQL server, on a free port, its files in `.local/postgres-outage`
/// (kept for the next run; the test's database is dropped). Stopped when dropped.
struct PrivatePostgres {
    dir: PathBuf,
    port: u16,
}

impl PrivatePostgres {
    fn start() -> PrivatePostgres {
        let pg = PrivatePostgres { dir: repo_root().join(".local/postgres-outage"), port: free_port() };
        // A server left running by an interrupted run listens on another port.
        pg.script("stop");
        pg.script("start");
        pg
    }

    /// `postgres.sh CMD` on this server; panics unless it succeeds.
    fn script(&self, cmd: &str) -> String {
        let out = Command::new(repo_root().join("deploy/local/postgres.sh"))
            .arg(cmd)
            .env("SLUICE_PG_DIR", &self.dir)
            .env("SLUICE_PG_PORT", self.port.to_string())
            .env("SLUICE_PG_SHARED_BUFFERS", "128MB")
            .output()
            .expect("run deploy/local/postgres.sh");
        assert!(
            out.status.success(),
            "postgres.sh {cmd} (SLUICE_PG_DIR={}, SLUICE_PG_PORT={}): {}",
            self.dir.display(),
            self.port,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn url(&self) -> String {
        self.script("url")
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("deploy/local/postgres.sh"))
            .arg("stop")
            .env("SLUICE_PG_DIR", &self.dir)
            .env("SLUICE_PG_PORT", self.port.to_string())
            .output();
    }
}

fn postgres_restart_during_processing_and_backfill(server: &PrivatePostgres, env: Env) {
    env.run(&["init", "--partitions", "3"]);
    let env = env.with_sections("[backfill]\nchunk_size = 20\npause_ms = 50\nscan_interval_ms = 500\n");
    let base = workload(2_000, 1, &env.prefix);
    env.produce(&jsonl_lines(&base));
    let port = free_port();
    let p = port.to_string();
    // The backfill stalls before its 3rd chunk commit for STALL: PostgreSQL goes down
    // while the function is surely `backfilling` (only a chunk commit can end it).
    const STALL: Duration = Duration::from_secs(12);
    let stall_ms = STALL.as_millis().to_string();
    let r: Replica = env.spawn_replica(
        "r1",
        &[
            ("SLUICE_HTTP", &format!("127.0.0.1:{p}")),
            ("SLUICE_FAILPOINT", "sleep_before_backfill_chunk_commit:3"),
            ("SLUICE_FAILPOINT_SLEEP_MS", &stall_ms),
        ],
    );
    env.wait_caught_up(WAIT);
    let c = base[0].collection_id.clone();
    let attached: Value = serde_json::from_str(
        env.run(&["functions", "attach", &c, "--function", "statistics", "--output", "stats", "--format", "json"])
            .trim(),
    )
    .unwrap();
    let id = attached["function_id"].as_str().unwrap().to_string();
    let live = produce_during(&env, 10, || {
        let deadline = Instant::now() + WAIT;
        while !r.log_text().contains("fail point sleep_before_backfill_chunk_commit reached") {
            assert!(Instant::now() < deadline, "the backfill never reached its 3rd chunk commit:\n{}", r.log_text());
            std::thread::sleep(Duration::from_millis(50));
        }
        let stalled_at = Instant::now();
        let f = function_status(&env, &id);
        assert_eq!(f["status"], "backfilling", "the function is backfilling when PostgreSQL stops: {f}");
        server.script("stop");
        assert!(
            stalled_at.elapsed() < STALL,
            "PostgreSQL stopped {:?} after the stall began: the chunk may have committed",
            stalled_at.elapsed()
        );
        assert!(
            !r.log_text().contains("fail point sleep_before_backfill_chunk_commit: awake"),
            "the stalled chunk woke before the database stopped"
        );
        wait_not_ready(port, "sysdb unavailable");
        std::thread::sleep(Duration::from_secs(3));
        server.script("start");
        wait_ready(port);
    });
    env.wait_caught_up(WAIT);
    let id = id.as_str();
    let deadline = Instant::now() + WAIT;
    loop {
        let fl: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
        if fl.as_array().unwrap().iter().any(|f| f["id"] == id && f["status"] == "ready") {
            break;
        }
        assert!(Instant::now() < deadline, "backfill never finished after the outage: {fl}");
        std::thread::sleep(Duration::from_millis(300));
    }
    group_never_ahead(port);
    let all: Vec<LogRecord> = base.iter().chain(&live).cloned().collect();
    assert_exact(&env, &all, Some((&c, "stats")));
    assert!(r.log_text().contains("retrying"), "the outage was seen and retried");
}

fn sqlite_locked_by_another_process(env: Env) {
    env.run(&["init", "--partitions", "3"]);
    let base = workload(1_000, 2, &env.prefix);
    env.produce(&jsonl_lines(&base));
    let port = free_port();
    let r = env.spawn_replica("r1", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    env.wait_caught_up(WAIT);
    let path = env.sysdb.strip_prefix("sqlite://").unwrap().to_string();
    let live = produce_during(&env, 20, || {
        // Another process holds the database's write lock for 8 s (longer than the
        // 5 s busy timeout): every commit fails with SQLITE_BUSY meanwhile.
        let conn = rusqlite::Connection::open(&path).unwrap();
        conn.execute_batch("BEGIN EXCLUSIVE").unwrap();
        wait_not_ready(port, "sysdb unavailable");
        std::thread::sleep(Duration::from_secs(2));
        conn.execute_batch("COMMIT").unwrap();
        drop(conn);
        wait_ready(port);
    });
    env.wait_caught_up(WAIT);
    let all: Vec<LogRecord> = base.iter().chain(&live).cloned().collect();
    assert_exact(&env, &all, None);
    assert!(r.log_text().contains("retrying"), "the lock was seen and retried");
}

#[tokio::test(flavor = "multi_thread")]
async fn sysdb_outages_are_retried_reported_and_end_exact() {
    if !require_kafka() {
        return;
    }
    let server = PrivatePostgres::start();
    let pg_env = Env::postgres_on(&server.url(), "outage").await;
    // The server is stopped after the environment (its database) is gone.
    tokio::task::spawn_blocking(move || {
        sqlite_locked_by_another_process(Env::sqlite("locked"));
        postgres_restart_during_processing_and_backfill(&server, pg_env);
        drop(server);
    })
    .await
    .unwrap();
}
