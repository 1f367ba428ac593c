//! Shared helpers for the tests that need real services (Kafka, PostgreSQL).
//!
//! A missing service FAILS the test with the command that starts it. Only outside CI,
//! `SLUICE_SKIP_INTEGRATION=1` turns that into an announced skip.

pub mod faults;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;

/// Bootstrap servers of the local broker (`SLUICE_TEST_BROKERS`, default 127.0.0.1:9092).
pub fn brokers() -> String {
    std::env::var("SLUICE_TEST_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// PostgreSQL URL of the test database.
pub fn postgres_url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://sluice:sluice@127.0.0.1:55432/sluice_test".into())
}

/// Whether this runs in CI (`CI` set, not empty and not `false`): a missing service fails
/// the test there, whatever `SLUICE_SKIP_INTEGRATION` says.
pub fn in_ci() -> bool {
    std::env::var("CI").map(|v| !v.is_empty() && v != "false").unwrap_or(false)
}

fn may_skip(what: &str, fix: &str, why: &str) -> bool {
    if !in_ci() && std::env::var("SLUICE_SKIP_INTEGRATION").as_deref() == Ok("1") {
        eprintln!("SKIPPING: {what} is unreachable ({why}) and SLUICE_SKIP_INTEGRATION=1");
        return true;
    }
    panic!(
        "{what} is unreachable ({why}). Start it with `{fix}` (or set SLUICE_SKIP_INTEGRATION=1 outside CI to skip)"
    );
}

/// Check the broker answers metadata; `false` means skip (only when allowed).
pub fn require_kafka() -> bool {
    let consumer: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().expect("kafka client config");
    match consumer.fetch_metadata(None, Duration::from_secs(5)) {
        Ok(_) => true,
        Err(e) => !may_skip(&format!("Kafka at {}", brokers()), "deploy/local/kafka.sh start", &e.to_string()),
    }
}

/// Check PostgreSQL answers; `false` means skip (only when allowed).
pub async fn require_postgres() -> bool {
    match tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await {
        Ok((client, conn)) => {
            tokio::spawn(conn);
            let ok = client.simple_query("select 1").await.is_ok();
            ok || !may_skip("PostgreSQL", "deploy/local/postgres.sh start", "select 1 failed")
        }
        Err(e) => !may_skip(
            &format!("PostgreSQL at {}", redact(&postgres_url())),
            "deploy/local/postgres.sh start",
            &e.to_string(),
        ),
    }
}

/// Confluent API base of the shared schema registry (`SLUICE_TEST_SCHEMA_REGISTRY_URL`,
/// default `deploy/local/schema-registry.sh url`: http://127.0.0.1:18081/apis/ccompat/v7).
pub fn schema_registry_url() -> String {
    std::env::var("SLUICE_TEST_SCHEMA_REGISTRY_URL")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "http://127.0.0.1:18081/apis/ccompat/v7".into())
}

/// The loopback port and path of an `http://127.0.0.1:PORT/PATH` registry URL.
pub fn registry_port_and_path(url: &str) -> (u16, String) {
    let rest =
        url.strip_prefix("http://127.0.0.1:").unwrap_or_else(|| panic!("{url} is not http://127.0.0.1:PORT/..."));
    let (port, path) = rest.split_once('/').unwrap_or((rest, ""));
    (port.parse().unwrap_or_else(|_| panic!("port of {url}")), format!("/{path}"))
}

/// Check the schema registry answers; `false` means skip (only when allowed).
pub fn require_schema_registry() -> bool {
    let url = schema_registry_url();
    let (port, path) = registry_port_and_path(&url);
    match http_get(port, &format!("{path}/subjects")) {
        Some((200, _, _)) => true,
        other => !may_skip(
            &format!("the schema registry at {url}"),
            "deploy/local/schema-registry.sh start",
            &format!("GET /subjects answered {other:?}"),
        ),
    }
}

fn fxhash(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn redact(url: &str) -> String {
    sluice::sysdb::redact_url(url)
}

/// A random suffix for topic, group and collection names.
pub fn suffix() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_string()
}

/// The repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// Path of the `sluice` binary built for this test profile (`cargo build --bin sluice`
/// must have run; the test command does it).
pub fn sluice_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/deps/<test> -> target/<profile>/sluice
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let bin = dir.join("sluice");
    assert!(bin.exists(), "{} is missing: run `cargo build --bin sluice` first (scripts/test.sh does)", bin.display());
    bin
}

/// A per-test environment: unique topic prefix, group and sysdb.
#[derive(Debug, Clone)]
pub struct Env {
    pub prefix: String,
    pub group: String,
    pub sysdb: String,
    pub dir: PathBuf,
    pub extra: Vec<(String, String)>,
    /// Extra TOML appended to the test config (sections other than [kafka] and the
    /// first [processor] keys must not repeat those tables; use `[processor]` keys via
    /// `processor_toml`).
    pub processor_toml: String,
    /// Extra `[kafka]` keys.
    pub kafka_toml: String,
    /// Extra whole sections (e.g. `[backfill]\nchunk_size = 50`), appended last.
    pub sections_toml: String,
    /// Removes the test's directory, database and topics once the last clone of this
    /// environment is dropped, unless the test is failing (then it says where they are).
    pub cleanup: std::sync::Arc<Cleanup>,
}

/// What a test leaves behind: removed when it passes, kept and named when it fails (a
/// day of runs filled a 19 GB disk when nothing was removed).
#[derive(Debug)]
pub struct Cleanup {
    dir: PathBuf,
    /// The PostgreSQL database of the test, if any: the server's URL and the name.
    database: Option<(String, String)>,
    prefix: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "the failed test keeps its files in {}{} (topics {}.*)",
                self.dir.display(),
                self.database.as_ref().map(|(_, d)| format!(" and its PostgreSQL database {d}")).unwrap_or_default(),
                self.prefix
            );
            return;
        }
        if std::env::var_os("SLUICE_KEEP_TEST_FILES").is_some() {
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        let (database, prefix) = (self.database.clone(), self.prefix.clone());
        // A fresh thread and runtime: this may run inside the test's own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            rt.block_on(async {
                if let Some((server, db)) = database {
                    if let Ok((client, conn)) = tokio_postgres::connect(&server, tokio_postgres::NoTls).await {
                        tokio::spawn(conn);
                        let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)")).await;
                    }
                }
                let settings = sluice::kafka::ClientSettings::new(brokers());
                let topics: Vec<String> = ["log", "backfill", "dlq", "changes", "changes.progress"]
                    .iter()
                    .map(|t| format!("{prefix}.{t}"))
                    .collect();
                let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
                let _ = sluice::kafka::cluster::delete_topics(&settings, &refs).await;
            });
            Some(())
        })
        .join();
    }
}

impl Env {
    /// SQLite sysdb in a fresh temporary directory.
    pub fn sqlite(name: &str) -> Env {
        let s = suffix();
        let dir = std::env::temp_dir().join(format!("sluice-it-{name}-{s}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let prefix = format!("it-{name}-{s}");
        Env {
            prefix: prefix.clone(),
            group: format!("it-{name}-{s}"),
            sysdb: format!("sqlite://{}", dir.join("sysdb.db").display()),
            cleanup: std::sync::Arc::new(Cleanup { dir: dir.clone(), database: None, prefix }),
            dir,
            extra: Vec::new(),
            processor_toml: String::new(),
            kafka_toml: String::new(),
            sections_toml: String::new(),
        }
    }

    /// A fresh PostgreSQL database (created from the test database's server).
    pub async fn postgres(name: &str) -> Env {
        Env::postgres_on(&postgres_url(), name).await
    }

    /// A fresh PostgreSQL database on the server of `server` (a URL of one of its
    /// databases), e.g. a private server that the test stops.
    pub async fn postgres_on(server: &str, name: &str) -> Env {
        let s = suffix();
        // PostgreSQL cuts names at 63 bytes: shorten the test's name so that the unique
        // suffix always stays in (a long name would otherwise meet an earlier run's).
        let short: String =
            name.replace('-', "_").chars().filter(char::is_ascii).take(63 - "it__".len() - s.len()).collect();
        let db = format!("it_{short}_{s}");
        let (client, conn) = tokio_postgres::connect(server, tokio_postgres::NoTls).await.expect("postgres");
        tokio::spawn(conn);
        client.batch_execute(&format!("CREATE DATABASE {db}")).await.expect("create database");
        let url = format!("{}/{db}", &server[..server.rfind('/').expect("db in url")]);
        let dir = std::env::temp_dir().join(format!("sluice-it-{name}-{s}"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let prefix = format!("it-{name}-{s}");
        Env {
            prefix: prefix.clone(),
            group: format!("it-{name}-{s}"),
            sysdb: url,
            cleanup: std::sync::Arc::new(Cleanup {
                dir: dir.clone(),
                database: Some((server.to_string(), db)),
                prefix,
            }),
            dir,
            extra: Vec::new(),
            processor_toml: String::new(),
            kafka_toml: String::new(),
            sections_toml: String::new(),
        }
    }

    pub fn log_topic(&self) -> String {
        format!("{}.log", self.prefix)
    }
    pub fn dlq_topic(&self) -> String {
        format!("{}.dlq", self.prefix)
    }

    /// Path of this test's config file (short session timeout so that a killed replica's
    /// partitions move within seconds).
    pub fn config_path(&self) -> PathBuf {
        let p = self.dir.join(format!(
            "sluice-{:x}.toml",
            fxhash(&format!("{}\n{}\n{}", self.kafka_toml, self.processor_toml, self.sections_toml))
        ));
        if !p.exists() {
            std::fs::write(
                &p,
                format!(
                    "[kafka]\n{}{}\n[processor]\nshutdown_timeout_ms = 15000\nbatch_max_records = 200\n{}\n{}\n",
                    if self.kafka_toml.contains("session_timeout_ms") { "" } else { "session_timeout_ms = 6000\n" },
                    self.kafka_toml,
                    self.processor_toml,
                    self.sections_toml
                ),
            )
            .expect("write config");
        }
        p
    }

    /// The same environment with extra `[kafka]` keys (e.g. `rebalance_protocol = "eager"`).
    pub fn with_kafka(&self, toml: &str) -> Env {
        let mut e = self.clone();
        e.kafka_toml = toml.to_string();
        e
    }

    /// The same environment with extra whole TOML sections.
    pub fn with_sections(&self, toml: &str) -> Env {
        let mut e = self.clone();
        e.sections_toml = toml.to_string();
        e
    }

    /// The same environment with extra `[processor]` keys (e.g. `on_data_loss = "skip"`).
    pub fn with_processor(&self, toml: &str) -> Env {
        let mut e = self.clone();
        e.processor_toml = toml.to_string();
        e
    }

    /// A `sluice` command with this environment.
    pub fn cmd(&self) -> Command {
        let mut c = Command::new(sluice_bin());
        c.env("SLUICE_CONFIG", self.config_path());
        c.env("SLUICE_BROKERS", brokers())
            .env("SLUICE_SYSDB", &self.sysdb)
            .env("SLUICE_GROUP", &self.group)
            .env("SLUICE_TOPIC_PREFIX", &self.prefix)
            .env("SLUICE_HTTP", "")
            .env_remove("SLUICE_FAILPOINT");
        for (k, v) in &self.extra {
            c.env(k, v);
        }
        c
    }

    /// Run a command to completion; panics with its output on failure.
    pub fn run(&self, args: &[&str]) -> String {
        let out = self.cmd().args(args).output().expect("spawn sluice");
        assert!(
            out.status.success(),
            "sluice {args:?} failed: {}\nstdout: {}\nstderr: {}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `sluice offsets show --format json`: one object per partition.
    pub fn offsets(&self) -> Vec<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_str(&self.run(&["offsets", "show", "--format", "json"])).expect("offsets json");
        v.as_array().expect("offsets array").clone()
    }

    /// `sluice produce` of the given JSON lines.
    pub fn produce(&self, lines: &[String]) {
        let path = self.dir.join(format!("input-{}.jsonl", suffix()));
        std::fs::write(&path, lines.join("\n")).expect("write input");
        self.run(&["produce", path.to_str().expect("utf8 path")]);
    }

    /// Start a `sluice process` replica; its log goes to a file in the test dir.
    pub fn spawn_replica(&self, name: &str, envs: &[(&str, &str)]) -> Replica {
        self.spawn_replica_with(name, &[], envs)
    }

    /// Start `sluice process ARGS...` (e.g. `--roles backfill`).
    pub fn spawn_replica_with(&self, name: &str, args: &[&str], envs: &[(&str, &str)]) -> Replica {
        let log = self.dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let mut c = self.cmd();
        c.arg("process").args(args).stdout(Stdio::null()).stderr(file);
        for (k, v) in envs {
            c.env(k, v);
        }
        let child = c.spawn().expect("spawn sluice process");
        Replica { child, log }
    }

    /// Poll `sluice offsets show` until every partition has a sysdb position equal to its
    /// high watermark (lag 0), or panic after `timeout`.
    pub fn wait_caught_up(&self, timeout: Duration) -> serde_json::Value {
        let deadline = Instant::now() + timeout;
        loop {
            let out = self.cmd().args(["offsets", "show", "--format", "json"]).output().expect("offsets show");
            if out.status.success() {
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("offsets json");
                // Every partition has a sysdb position (a replica took it) equal to the
                // high watermark: an empty partition nobody processed also reads lag 0.
                let done = v.as_array().map(|rows| {
                    !rows.is_empty()
                        && rows.iter().all(|r| {
                            r["lag"].as_i64() == Some(0)
                                && r["sysdb_next_offset"].as_i64().is_some()
                                && r["sysdb_next_offset"].as_i64() == r["high_watermark"].as_i64()
                        })
                });
                if done == Some(true) {
                    return v;
                }
                if Instant::now() > deadline {
                    panic!("not caught up after {timeout:?}: {v:#}");
                }
            } else if Instant::now() > deadline {
                panic!("offsets show failed: {}", String::from_utf8_lossy(&out.stderr));
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// `both_backends!(name, body)`: a module `name` with two tests running `body(env)`, one
/// on a fresh SQLite sysdb and one on a fresh PostgreSQL database (skipped outside CI
/// only when the service is missing, like every integration test).
#[macro_export]
macro_rules! both_backends {
    ($name:ident, $body:ident) => {
        mod $name {
            use super::*;
            #[test]
            fn sqlite() {
                if !$crate::require_kafka() {
                    return;
                }
                $body($crate::Env::sqlite(stringify!($name)));
            }
            #[tokio::test(flavor = "multi_thread")]
            async fn postgres() {
                if !$crate::require_kafka() || !$crate::require_postgres().await {
                    return;
                }
                let env = $crate::Env::postgres(stringify!($name)).await;
                tokio::task::spawn_blocking(move || $body(env)).await.unwrap();
            }
        }
    };
}

/// A small deterministic workload: `records` over `collections` collections of 30 ids,
/// 4-dim embeddings, every operation (50% add, 20% update, 15% upsert, 15% delete).
pub fn small_workload(records: usize, seed: u64, prefix: &str, collections: usize) -> Vec<sluice::record::LogRecord> {
    sluice::workload::generate(&sluice::workload::WorkloadSpec {
        records,
        collections,
        dim: 4,
        ids_per_collection: 30,
        mix: [50, 20, 15, 15],
        seed,
        collection_prefix: format!("{prefix}-c"),
    })
    .collect()
}

/// A running `sluice process`.
pub struct Replica {
    pub child: Child,
    pub log: PathBuf,
}

impl Replica {
    /// SIGKILL, like a crash.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// SIGTERM and wait; returns the exit status code.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return s.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.kill9();
        None
    }

    /// Wait for the process to exit by itself (e.g. at a fail point).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(s)) = self.child.try_wait() {
                return Some(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Wait until `needle` is in the replica's log; panics with the log after `timeout`.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while !self.log_text().contains(needle) {
            assert!(
                Instant::now() < deadline,
                "{needle:?} never appeared in {}:\n{}",
                self.log.display(),
                self.log_text()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A free local port for a replica to listen on (bound, then released).
///
/// Chosen at random below the kernel's ephemeral range (32768 and up), so that the
/// outgoing connections of this and other test processes (Kafka clients open many)
/// cannot take it between its release and the replica's bind; never the same port twice
/// in one test process; never a port of the local services.
pub fn free_port() -> u16 {
    use std::sync::Mutex;
    static GIVEN: Mutex<Vec<u16>> = Mutex::new(Vec::new());
    // Ports of local services that may be down for a moment (a broker being restarted).
    const SERVICES: [u16; 9] = [29092, 29093, 29094, 29192, 29193, 29392, 29393, 19090, 19092];
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..10_000 {
        let port = 20_000 + (uuid::Uuid::new_v4().as_u128() % 12_000) as u16;
        if given.contains(&port) || SERVICES.contains(&port) {
            continue;
        }
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            given.push(port);
            return port;
        }
    }
    panic!("no free port in 20000-31999");
}

/// `GET path` over a raw HTTP/1.1 connection: `(status, content type, body)`, or `None`
/// while nothing listens.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    let content_type = head
        .lines()
        .find_map(|l| {
            l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    Some((status, content_type, body.to_string()))
}

/// `series → value` of a Prometheus/OpenMetrics text exposition.
pub fn metric_samples(text: &str) -> std::collections::BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// Log records as `sluice produce` input lines.
pub fn jsonl_lines(records: &[sluice::record::LogRecord]) -> Vec<String> {
    records.iter().map(|r| sluice::cli::jsonl::log_record_to_json(r).to_string()).collect()
}

/// The log as the reference model must see it, with the real Kafka offsets.
///
/// `log` lists the records the test expects to be applied, in produce order. The log
/// topic is read back (every partition, from its start) and each record of `log` is
/// matched, per collection and in order, to the message that carries it on the
/// collection's home partition, so the model is fed the real Kafka offsets. Messages the
/// test does not list (bad input sent to the DLQ, a copy on the wrong partition) are taken
/// as not applied; BACKFILL_FN markers always count. Records of `log` that are no longer
/// in the topic are allowed only where retention moved the partition's start above 0;
/// they are taken as preceding it.
pub struct ModelLog {
    /// `(offset, record)` of every collection, in offset order within each: the input of
    /// `sluice::materialize::model::reference`.
    pub log: Vec<(i64, sluice::record::LogRecord)>,
    /// Collections whose records all precede the start of their partition (retention):
    /// their position is only known to be below this offset.
    pub position_before: std::collections::BTreeMap<String, i64>,
    /// Partitions of the log topic.
    pub partitions: i32,
}

impl ModelLog {
    /// The `log_position` the model expects per collection: the last offset of the
    /// collection's records that were not refused (a marker counts).
    pub fn expected_positions(
        &self,
        model: &sluice::materialize::model::ModelState,
    ) -> std::collections::BTreeMap<String, i64> {
        let mut positions = std::collections::BTreeMap::new();
        for (o, r) in &self.log {
            if !model.collections[&r.collection_id].rejected.contains(o) {
                let p = positions.entry(r.collection_id.clone()).or_insert(-1);
                *p = (*p).max(*o);
            }
        }
        positions
    }
}

/// [`ModelLog`] of `env`'s log topic for the records `log` the test produced.
pub fn model_log(env: &Env, log: &[sluice::record::LogRecord]) -> ModelLog {
    use sluice::record::{partitioner::partition_for, LogRecord, Operation};
    use std::collections::{BTreeMap, BTreeSet};

    let rows: serde_json::Value =
        serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).expect("offsets json");
    let partitions = rows.as_array().expect("offset rows").len() as i32;
    assert!(partitions > 0, "the log topic has partitions");
    // The brokers the test's commands use (an `extra` SLUICE_BROKERS overrides the default).
    let bootstrap =
        env.extra.iter().rev().find(|(k, _)| k == "SLUICE_BROKERS").map_or_else(brokers, |(_, v)| v.clone());
    let messages = consume_all_from(&bootstrap, &env.log_topic(), partitions, Duration::from_secs(180));
    let mut first_offset: BTreeMap<i32, i64> = BTreeMap::new();
    // Per collection: the decoded messages of its home partition, in offset order.
    let mut in_kafka: BTreeMap<String, Vec<(i64, LogRecord)>> = BTreeMap::new();
    for m in &messages {
        first_offset.entry(m.partition).or_insert(m.offset);
        let decoded = sluice::record::codec::decode(&m.payload).ok().or_else(|| {
            // Confluent framing: magic byte 0 and a 4-byte schema id.
            (m.payload.len() > 5 && m.payload[0] == 0)
                .then(|| sluice::record::codec::decode(&m.payload[5..]).ok())
                .flatten()
        });
        let Some(rec) = decoded else { continue };
        if partition_for(rec.collection_id.as_bytes(), partitions as u32) as i32 != m.partition {
            continue;
        }
        in_kafka.entry(rec.collection_id.clone()).or_default().push((m.offset, rec));
    }
    for v in in_kafka.values_mut() {
        v.sort_by_key(|(o, _)| *o);
    }
    let mut expected_log: BTreeMap<String, Vec<LogRecord>> = BTreeMap::new();
    for r in log {
        expected_log.entry(r.collection_id.clone()).or_default().push(r.clone());
    }
    // Match from the end (a truncated log misses a prefix), markers always included.
    let mut model_log: Vec<(i64, LogRecord)> = Vec::new();
    // Collections whose last expected record is no longer in the topic: position unknown.
    let mut position_before: BTreeMap<String, i64> = BTreeMap::new();
    let cids: BTreeSet<String> = expected_log.keys().chain(in_kafka.keys()).cloned().collect();
    for cid in &cids {
        let home = partition_for(cid.as_bytes(), partitions as u32) as i32;
        let kafka = in_kafka.get(cid).map(Vec::as_slice).unwrap_or_default();
        let wanted = expected_log.get(cid).map(Vec::as_slice).unwrap_or_default();
        let mut matched: Vec<(i64, LogRecord)> = Vec::new();
        let mut k = kafka.len();
        let mut w = wanted.len();
        while k > 0 {
            k -= 1;
            let (o, r) = &kafka[k];
            if r.operation == Operation::BackfillFn {
                matched.push((*o, r.clone()));
            } else if w > 0 && wanted[w - 1] == *r {
                w -= 1;
                matched.push((*o, r.clone()));
            }
        }
        if w > 0 {
            let start = first_offset.get(&home).copied().unwrap_or(0);
            assert!(
                start > 0,
                "{w} records of {cid} (the first: {:?}) are not in partition {home} of {} in produce order",
                wanted[0],
                env.log_topic()
            );
            // Gone with retention: they preceded the partition's first offset.
            for (i, r) in wanted[..w].iter().enumerate().rev() {
                matched.push((start - w as i64 + i as i64, r.clone()));
            }
            if matched.iter().all(|(o, _)| *o < start) {
                position_before.insert(cid.clone(), start);
            }
        }
        matched.reverse();
        model_log.extend(matched);
    }
    ModelLog { log: model_log, position_before, partitions }
}

/// The sysdb holds exactly what the reference model of the real log says ([`model_log`]).
///
/// Per collection: the records as `sluice records` prints them, the record count
/// and `log_position` (the last applied offset) equal the model, and the sysdb holds
/// exactly the model's collections plus the output collections of the attached functions.
pub fn assert_records_match_model(env: &Env, log: &[sluice::record::LogRecord]) {
    use sluice::cli::jsonl::record_to_json;
    use std::collections::{BTreeMap, BTreeSet};

    let matched = model_log(env, log);
    let model = sluice::materialize::model::reference(&matched.log);
    let expected_positions = matched.expected_positions(&model);
    let position_before = &matched.position_before;

    let listed: serde_json::Value =
        serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).expect("collections json");
    let in_sysdb: BTreeMap<String, (i64, i64)> = listed
        .as_array()
        .expect("collections array")
        .iter()
        .map(|c| {
            let id = c["id"].as_str().expect("collection id").to_string();
            (id, (c["log_position"].as_i64().expect("log_position"), c["records"].as_i64().expect("records")))
        })
        .collect();
    let functions: serde_json::Value =
        serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).expect("functions json");
    let outputs: BTreeSet<String> = functions
        .as_array()
        .expect("functions array")
        .iter()
        .filter_map(|f| f["output"].as_str().map(str::to_string))
        .collect();
    let expected_ids: BTreeSet<String> = expected_positions.keys().map(|c| c.to_string()).collect();
    let actual_ids: BTreeSet<String> = in_sysdb.keys().filter(|c| !outputs.contains(*c)).cloned().collect();
    assert_eq!(actual_ids, expected_ids, "the collections in the sysdb (besides function outputs {outputs:?})");

    for (cid, cm) in &model.collections {
        let expected: Vec<serde_json::Value> = cm.records.values().map(record_to_json).collect();
        let actual: Vec<serde_json::Value> = env
            .run(&["records", cid, "--format", "jsonl"])
            .lines()
            .map(|l| serde_json::from_str(l).expect("record JSON"))
            .collect();
        assert_eq!(actual, expected, "records of {cid}");
        let Some(&(position, count)) = in_sysdb.get(cid) else { continue };
        assert_eq!(count, cm.records.len() as i64, "record count of {cid}");
        match position_before.get(cid) {
            Some(start) => {
                assert!(position < *start, "log_position of {cid}: {position}, its records all precede offset {start}")
            }
            None => assert_eq!(position, expected_positions[cid], "log_position of {cid}"),
        }
    }
}

/// One message read back from a topic.
#[derive(Debug, Clone)]
pub struct ConsumedMsg {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    pub headers: std::collections::BTreeMap<String, String>,
}

/// Read every partition of `topic` from the beginning up to the high watermark it has
/// when called (everything produced before), with a plain consumer (no group offsets).
/// Panics if that takes longer than `timeout`.
pub fn consume_all(topic: &str, partitions: i32, timeout: Duration) -> Vec<ConsumedMsg> {
    consume_all_from(&brokers(), topic, partitions, timeout)
}

/// [`consume_all`] from the given bootstrap servers.
pub fn consume_all_from(bootstrap: &str, topic: &str, partitions: i32, timeout: Duration) -> Vec<ConsumedMsg> {
    use rdkafka::message::{Headers, Message};
    use rdkafka::{Offset, TopicPartitionList};
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", format!("it-reader-{}", suffix()))
        .set("enable.auto.commit", "false")
        // Like the processor: committed transactions only. Transaction markers and aborted
        // records are never delivered; the consumer's position steps over them.
        .set("isolation.level", "read_committed")
        .create()
        .expect("consumer");
    let mut highs = std::collections::BTreeMap::new();
    // Records below the log start are gone (retention, DeleteRecords): reading starts there.
    let mut next = std::collections::BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (low, high) = consumer.fetch_watermarks(topic, p, Duration::from_secs(10)).expect("watermarks");
        highs.insert(p, high);
        next.insert(p, low);
        tpl.add_partition_offset(topic, p, Offset::Beginning).expect("tpl");
    }
    consumer.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + timeout;
    while next.iter().any(|(p, n)| *n < highs[p]) {
        assert!(Instant::now() < deadline, "consumed {} records, positions {next:?} short of {highs:?}", out.len());
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                next.insert(m.partition(), m.offset() + 1);
                let mut headers = std::collections::BTreeMap::new();
                if let Some(hs) = m.headers() {
                    for i in 0..hs.count() {
                        let h = hs.get(i);
                        headers.insert(
                            h.key.to_string(),
                            String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                        );
                    }
                }
                out.push(ConsumedMsg {
                    partition: m.partition(),
                    offset: m.offset(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().unwrap_or_default().to_vec(),
                    headers,
                });
            }
            Some(Err(e)) => panic!("consumer error: {e}"),
            None => {
                // Nothing delivered: the position may have passed transaction markers.
                if let Ok(positions) = consumer.position() {
                    for e in positions.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            let n = next.entry(e.partition()).or_insert(0);
                            *n = (*n).max(o);
                        }
                    }
                }
            }
        }
    }
    out
}

/// Deletes the topics when dropped (best effort, also when the test panics).
pub struct TopicGuard(pub Vec<String>);

impl Drop for TopicGuard {
    fn drop(&mut self) {
        let topics = std::mem::take(&mut self.0);
        // A fresh thread and runtime: this may run inside the test's own runtime.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
            let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
            let settings = sluice::kafka::ClientSettings::new(brokers());
            rt.block_on(sluice::kafka::cluster::delete_topics(&settings, &refs)).ok()
        })
        .join();
    }
}

/// One HTTP/1.1 request to a replica's server on 127.0.0.1:`port` (`Connection: close`):
/// `(status, JSON body or Null)`, or `None` while nothing listens or the answer is cut.
pub fn try_http(port: u16, method: &str, path: &str, body: Option<&str>) -> Option<(u16, serde_json::Value)> {
    http_request(port, method, path, None, body).map(|a| (a.status, a.body))
}

/// An HTTP answer: its status, its head (status line and headers) and its JSON body
/// (`Null` when the body is not JSON).
pub struct HttpAnswer {
    pub status: u16,
    pub head: String,
    pub body: serde_json::Value,
}

impl HttpAnswer {
    /// The value of a header (case-insensitive name).
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|l| {
            l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.trim().to_string())
        })
    }
}

/// One HTTP/1.1 request over a fresh connection to 127.0.0.1:`port`, with a bearer token
/// when given; `None` while nothing listens (or the answer does not come within 120 s).
pub fn http_request(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> Option<HttpAnswer> {
    http_request_bytes(port, method, path, token, "application/json", body.unwrap_or("").as_bytes())
}

/// [`http_request`] with a body of any bytes and its content type.
pub fn http_request_bytes(
    port: u16,
    method: &str,
    path: &str,
    token: Option<&str>,
    content_type: &str,
    body: &[u8],
) -> Option<HttpAnswer> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(120))).ok()?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n");
    if let Some(t) = token {
        head.push_str(&format!("Authorization: Bearer {t}\r\n"));
    }
    head.push_str(&format!("Content-Type: {content_type}\r\nContent-Length: {}\r\n\r\n", body.len()));
    s.write_all(head.as_bytes()).ok()?;
    s.write_all(body).ok()?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (head, body) = text.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some(HttpAnswer {
        status,
        head: head.to_string(),
        body: serde_json::from_str(body).unwrap_or(serde_json::Value::Null),
    })
}

/// [`try_http`] to a server that must answer.
pub fn http(port: u16, method: &str, path: &str, body: Option<&str>) -> (u16, serde_json::Value) {
    try_http(port, method, path, body)
        .unwrap_or_else(|| panic!("no HTTP answer from 127.0.0.1:{port} to {method} {path}"))
}

/// The venv python (`deploy/local/python-env.sh` is idempotent and prints its path).
pub fn venv_python() -> String {
    let out = Command::new(repo_root().join("deploy/local/python-env.sh"))
        .current_dir(repo_root())
        .stderr(Stdio::inherit())
        .output()
        .expect("run deploy/local/python-env.sh");
    assert!(out.status.success(), "deploy/local/python-env.sh failed ({}); see its stderr above", out.status);
    String::from_utf8(out.stdout).expect("utf8 path").trim().to_string()
}

/// Log records produced straight from the test (no JSON lines file in between), each to
/// its collection's partition, as the Java client's partitioner would: for workloads too
/// large to write as a file first. Waits for every delivery in [`LogProducer::flush`].
pub struct LogProducer {
    producer: rdkafka::producer::ThreadedProducer<rdkafka::producer::DefaultProducerContext>,
    topic: String,
    partitions: u32,
}

impl LogProducer {
    /// A producer for `env`'s log topic of `partitions` partitions that sends messages of
    /// up to `max_message_bytes`.
    pub fn new(env: &Env, partitions: u32, max_message_bytes: usize) -> LogProducer {
        Self::with_compression(env, partitions, max_message_bytes, "none")
    }

    /// The same, compressing its batches with `codec` (`lz4`, `zstd`, ...): for tests that
    /// write gigabytes of repetitive values, which then take megabytes of the broker's disk.
    pub fn with_compression(env: &Env, partitions: u32, max_message_bytes: usize, codec: &str) -> LogProducer {
        let producer = ClientConfig::new()
            .set("bootstrap.servers", brokers())
            .set("message.max.bytes", max_message_bytes.to_string())
            .set("linger.ms", "5")
            .set("compression.type", codec)
            .create()
            .expect("producer");
        LogProducer { producer, topic: env.log_topic(), partitions }
    }

    /// Queue one record (Avro, plain framing), waiting while librdkafka's queue is full.
    pub fn send(&self, record: &sluice::record::LogRecord) {
        use rdkafka::producer::BaseRecord;
        let payload = sluice::record::codec::encode(record);
        let partition = sluice::record::partitioner::partition_for(record.collection_id.as_bytes(), self.partitions);
        let mut message = BaseRecord::to(&self.topic)
            .key(record.collection_id.as_bytes())
            .payload(&payload)
            .partition(partition as i32);
        loop {
            match self.producer.send(message) {
                Ok(()) => return,
                Err((
                    rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                    m,
                )) => {
                    message = m;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err((e, _)) => panic!("producing to {}: {e}", self.topic),
            }
        }
    }

    /// Wait until every queued record is acknowledged.
    pub fn flush(&self) {
        use rdkafka::producer::Producer;
        self.producer.flush(Duration::from_secs(120)).expect("every record acknowledged");
    }
}

/// The peak of a process's anonymous resident memory (`RssAnon` + `RssShmem` of
/// `/proc/PID/status`: its heap and stacks, not the file pages it maps), sampled every
/// 50 ms on a thread until [`RssPeak::stop`].
pub struct RssPeak {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<u64>>,
}

impl RssPeak {
    pub fn watch(pid: u32) -> RssPeak {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut peak = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { break };
                let kib = |key: &str| -> u64 {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix(key))
                        .and_then(|v| v.split_whitespace().next()?.parse().ok())
                        .unwrap_or(0)
                };
                peak = peak.max((kib("RssAnon:") + kib("RssShmem:")) * 1024);
                std::thread::sleep(Duration::from_millis(50));
            }
            peak
        });
        RssPeak { stop, thread: Some(thread) }
    }

    /// The peak in bytes (sampling ends when the process is gone, or now).
    pub fn stop(mut self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().map(|t| t.join().unwrap_or(0)).unwrap_or(0)
    }
}
