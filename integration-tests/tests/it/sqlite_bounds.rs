//! The SQLite store bounded in bytes and safe to read, against the real broker: read
//! commands on a sysdb the user may only read, reads that never merge, write or wait for
//! the writer, the database file under rewritten large documents, the replica's memory
//! under records at the validation limits (before and after a kill -9), and a full disk.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::record::{Embedding, LogRecord, MetaValue, Metadata, Operation};
use sluice_integration_tests::faults::{assert_outputs, attach, wait_status};
use sluice_integration_tests::{
    assert_records_match_model, brokers, free_port, http_get, jsonl_lines, metric_samples, require_kafka,
    small_workload, Env, LogProducer, Replica, RssPeak,
};

const WAIT: Duration = Duration::from_secs(240);
const MIB: u64 = 1 << 20;

fn sqlite_path(env: &Env) -> PathBuf {
    PathBuf::from(env.sysdb.strip_prefix("sqlite://").expect("a SQLite sysdb"))
}

/// A mount that is undone when dropped (before the test's directory is removed).
struct Mount(PathBuf);

impl Mount {
    fn run(args: &[&str]) {
        let out = Command::new("mount").args(args).output().expect("run mount");
        assert!(
            out.status.success(),
            "mount {args:?} failed (these tests run as root, as CI does): {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// `src` again at `dst`, read-only (even root cannot write through it).
    fn read_only_view(src: &Path, dst: &Path) -> Mount {
        std::fs::create_dir_all(dst).unwrap();
        Self::run(&["--bind", src.to_str().unwrap(), dst.to_str().unwrap()]);
        let m = Mount(dst.to_path_buf());
        Self::run(&["-o", "remount,bind,ro", dst.to_str().unwrap()]);
        m
    }

    /// A tmpfs of `bytes` at `dst`: a small file system a test can fill.
    fn tmpfs(dst: &Path, bytes: u64) -> Mount {
        std::fs::create_dir_all(dst).unwrap();
        Self::run(&["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs", dst.to_str().unwrap()]);
        Mount(dst.to_path_buf())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

fn scrape(port: u16) -> std::collections::BTreeMap<String, f64> {
    let (status, _, body) = http_get(port, "/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    metric_samples(&body)
}

fn wait_ready(port: u16, r: &mut Replica) {
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some((200, _, _)) = http_get(port, "/readyz") {
            return;
        }
        assert!(r.child.try_wait().ok().flatten().is_none(), "the replica exited:\n{}", r.log_text());
        assert!(Instant::now() < deadline, "never ready:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Rows waiting in the records delta, read through a read-only connection.
fn delta_rows(path: &Path) -> i64 {
    let conn = rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).unwrap();
    conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap()
}

// ---------------------------------------------------------------------------------------
// Read-only sysdb.

/// The read commands on a read-only view of the sysdb (a bind mount remounted read-only:
/// a backup, a read-only volume, another user's file): while a replica runs, after it
/// stopped (the `-wal` and `-shm` files exist), and with the database file alone (they
/// are gone), every read command answers, and the checksum equals the one read through
/// the writable path.
#[test]
fn read_commands_work_on_a_sysdb_the_user_may_only_read() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("readonly");
    env.run(&["init", "--partitions", "2"]);
    let data = small_workload(800, 3, &env.prefix, 4);
    let mut r = env.spawn_replica("r1", &[]);
    env.produce(&jsonl_lines(&data));
    env.wait_caught_up(WAIT);
    let c = data[0].collection_id.clone();
    attach(&env, &c, "record_counter", "count");
    let expected = env.run(&["checksum"]);

    let view = env.dir.with_file_name(format!("{}-ro", env.dir.file_name().unwrap().to_str().unwrap()));
    let _mount = Mount::read_only_view(&env.dir, &view);
    let mut ro = env.clone();
    ro.sysdb = format!("sqlite://{}", view.join(sqlite_path(&env).file_name().unwrap()).display());
    let read_all = |what: &str| {
        assert_eq!(ro.run(&["checksum"]), expected, "checksum through the read-only view ({what})");
        assert!(ro.run(&["records", &c, "--format", "jsonl"]).lines().count() > 0, "records ({what})");
        let listed: Value = serde_json::from_str(&ro.run(&["collections", "list", "--format", "json"])).unwrap();
        assert!(listed.as_array().unwrap().len() >= 4, "collections list ({what}): {listed}");
        let offsets: Value = serde_json::from_str(&ro.run(&["offsets", "show", "--format", "json"])).unwrap();
        assert_eq!(offsets.as_array().unwrap().len(), 2, "offsets show ({what})");
        let functions: Value = serde_json::from_str(&ro.run(&["functions", "list", "--format", "json"])).unwrap();
        assert_eq!(functions.as_array().unwrap().len(), 1, "functions list ({what})");
    };
    assert!(view.join("sysdb.db-wal").exists() && view.join("sysdb.db-shm").exists(), "a running replica's WAL");
    read_all("replica running");
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));
    read_all("replica stopped");
    // The last connection to close checkpoints and removes the WAL files: then the file
    // alone is the database (a copy, a backup), read as immutable.
    let last = rusqlite::Connection::open(sqlite_path(&env)).unwrap();
    last.query_row("SELECT count(*) FROM partitions", [], |r| r.get::<_, i64>(0)).unwrap();
    drop(last);
    assert!(!view.join("sysdb.db-wal").exists() && !view.join("sysdb.db-shm").exists(), "no WAL files left");
    read_all("no WAL files");
}

// ---------------------------------------------------------------------------------------
// Reads never write.

/// Reads with rows waiting in the records delta: hundreds of pages over HTTP, `sluice
/// records` and `sluice checksum` begin no write transaction and merge nothing (the
/// replica's counters stay, the delta keeps its rows), see the unmerged rows, and answer
/// while another connection holds the database's write lock.
#[test]
fn reads_never_merge_write_or_wait_for_the_writer() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("reads");
    env.run(&["init", "--partitions", "2"]);
    let port = free_port();
    let mut r = env.spawn_replica("r1", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    wait_ready(port, &mut r);
    // Small commits: everything stays in the delta (far below its bounds).
    let data = small_workload(400, 5, &env.prefix, 3);
    for chunk in data.chunks(100) {
        env.produce(&jsonl_lines(chunk));
        std::thread::sleep(Duration::from_millis(200));
    }
    env.wait_caught_up(WAIT);
    let path = sqlite_path(&env);
    let waiting = delta_rows(&path);
    assert!(waiting > 0, "the test needs rows in the delta");
    let counters = |m: &std::collections::BTreeMap<String, f64>| {
        let merges: f64 =
            m.iter().filter(|(k, _)| k.starts_with("sluice_sqlite_delta_merges_total")).map(|(_, v)| v).sum();
        (m["sluice_sqlite_write_transactions_total"], merges)
    };
    let before = counters(&scrape(port));

    let collections: Vec<String> = {
        let mut c: Vec<String> = data.iter().map(|r| r.collection_id.clone()).collect();
        c.sort();
        c.dedup();
        c
    };
    let mut reads = 0;
    for _ in 0..20 {
        for c in &collections {
            let mut after: Option<String> = None;
            let mut paged = Vec::new();
            loop {
                let path = match &after {
                    Some(a) => format!("/api/v1/collections/{c}/records?limit=7&after={a}"),
                    None => format!("/api/v1/collections/{c}/records?limit=7"),
                };
                let (status, _, body) = http_get(port, &path).expect("an answer");
                assert_eq!(status, 200, "{body}");
                reads += 1;
                let v: Value = serde_json::from_str(&body).unwrap();
                paged.extend(v["records"].as_array().unwrap().iter().map(|r| r["id"].as_str().unwrap().to_string()));
                match v["next"].as_str() {
                    Some(n) => after = Some(n.to_string()),
                    None => break,
                }
            }
            let listed: Vec<String> = env
                .run(&["records", c, "--format", "jsonl"])
                .lines()
                .map(|l| serde_json::from_str::<Value>(l).unwrap()["id"].as_str().unwrap().to_string())
                .collect();
            assert_eq!(paged, listed, "pages of {c} over HTTP and `sluice records` agree");
        }
    }
    env.run(&["checksum"]);
    assert!(reads >= 100, "{reads} reads");
    assert_eq!(counters(&scrape(port)), before, "reads began a write transaction or merged the delta");
    assert_eq!(delta_rows(&path), waiting, "reads merged the delta");
    assert_records_match_model(&env, &data);

    // Another connection holds the write lock (a long transaction of another process):
    // reads still answer at once.
    let holder = rusqlite::Connection::open(&path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = Instant::now();
    let (status, _, body) =
        http_get(port, &format!("/api/v1/collections/{}/records?limit=50", collections[0])).expect("an answer");
    let took = started.elapsed();
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(took < Duration::from_secs(2), "a read waited {took:?} for the writer's lock");
}

// ---------------------------------------------------------------------------------------
// The file under rewritten large documents.

/// Create the log topic before `sluice init` so that it takes messages of `max` bytes.
fn log_topic_for_large_messages(env: &Env, partitions: i32, max: u64) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let settings = sluice::kafka::ClientSettings::new(brokers());
    rt.block_on(sluice::kafka::cluster::ensure_topic(
        &settings,
        &env.log_topic(),
        partitions,
        1,
        &[("max.message.bytes", &max.to_string())],
    ))
    .expect("create the log topic");
    env.run(&["init", "--partitions", &partitions.to_string()]);
}

/// Samples a file's size every 100 ms; the largest seen.
fn watch_size(path: PathBuf) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<u64>) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = stop.clone();
    let t = std::thread::spawn(move || {
        let mut peak = 0;
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            peak = peak.max(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0));
            std::thread::sleep(Duration::from_millis(100));
        }
        peak.max(std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0))
    });
    (stop, t)
}

/// 50 ids upserted 100 times each with 1 MiB documents (5 GB written, 50 MiB live; the
/// producer compresses them, so that the broker's disk keeps megabytes of them): the
/// database file never grows past the documented multiple of the live bytes
/// (`docs/sqlite.md`: `(1 + dead_value_ratio) x live + dead_value_slack_bytes +
/// compaction_step_bytes`), and the last version of every document is the one stored.
#[test]
fn rewritten_large_documents_keep_the_file_within_its_bound() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("rewrites");
    log_topic_for_large_messages(&env, 2, 2 * MIB);
    let r = env.spawn_replica("r1", &[]);
    let (stop, sizes) = watch_size(sqlite_path(&env));
    let producer = LogProducer::with_compression(&env, 2, 2 * MIB as usize, "lz4");
    let c = format!("{}-docs", env.prefix);
    let doc = |id: usize, round: usize| {
        let mut d = format!("{id}:{round}:");
        d.push_str(&"abcdefghij"[round % 10..round % 10 + 1].repeat(MIB as usize - d.len()));
        d
    };
    for round in 0..100 {
        for id in 0..50 {
            let mut r = LogRecord::data(&c, format!("id-{id:02}"), Operation::Upsert);
            r.document = Some(doc(id, round));
            producer.send(&r);
        }
        if round % 10 == 9 {
            producer.flush();
        }
    }
    producer.flush();
    env.wait_caught_up(WAIT);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let peak = sizes.join().unwrap();
    drop(r);
    let stored: Vec<Value> =
        env.run(&["records", &c, "--format", "jsonl"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(stored.len(), 50);
    for (i, s) in stored.iter().enumerate() {
        assert_eq!(s["document"].as_str().unwrap(), doc(i, 99), "the last version of id-{i:02}");
    }
    let live = 50 * MIB;
    let t = sluice::config::SqliteConfig::DEFAULT;
    let bound = ((1.0 + t.dead_value_ratio) * live as f64) as u64 + t.dead_value_slack_bytes + t.compaction_step_bytes;
    let wal = std::fs::metadata(format!("{}-wal", sqlite_path(&env).display())).map(|m| m.len()).unwrap_or(0);
    eprintln!(
        "rewritten documents: 5000 MiB written, {} MiB live; the file peaked at {} MiB ({:.2}x live), bound {} MiB; WAL now {} MiB",
        live / MIB,
        peak / MIB,
        peak as f64 / live as f64,
        bound / MIB,
        wal / MIB
    );
    assert!(peak <= bound, "the sysdb file reached {peak} bytes for {live} live bytes (bound {bound})");
}

// ---------------------------------------------------------------------------------------
// Hostile sizes.

const KEYS: usize = 16;

/// A record at the test's validation limits: 16 metadata values of 64 KiB, a 1 MiB
/// document, a 1,024-dimension embedding; its content follows (id, version).
fn hostile(c: &str, id: usize, version: usize) -> LogRecord {
    let mut r = LogRecord::data(c, format!("id-{id:04}"), Operation::Upsert);
    let mut md = Metadata::new();
    for k in 0..KEYS {
        let fill = char::from(b'a' + ((id + version + k) % 26) as u8);
        md.insert(format!("k{k:02}"), MetaValue::String(fill.to_string().repeat(64 * 1024)));
    }
    r.metadata = Some(md);
    let mut d = format!("{id}:{version}:");
    d.push_str(&"x".repeat(MIB as usize - d.len()));
    r.document = Some(d);
    let e: Vec<f32> = (0..1024).map(|i| (i + version) as f32 / 1024.0).collect();
    r.embedding = Some(Embedding::from(e));
    r
}

/// Upserts at the validation limits (`SLUICE_HOSTILE_RECORDS`: 1,000 by default, 2.1 GB
/// of the broker's disk, a backlog of 1 GB after the kill, twice the formula's bound;
/// 5,000 for the full run),
/// produced at a pace that keeps groups small, with a kill -9 in the middle: the
/// replica's peak anonymous memory stays under the formula of `docs/configuration.md`
/// (`sluice::config::memory`), before the kill and while the restarted replica catches
/// up, and the state is the last version of every record.
#[test]
fn hostile_sizes_stay_under_the_memory_formula() {
    if !require_kafka() {
        return;
    }
    let total: usize =
        std::env::var("SLUICE_HOSTILE_RECORDS").ok().and_then(|v| v.parse().ok()).unwrap_or(1_000).max(100);
    let env = Env::sqlite("hostile").with_sections(&format!(
        "[limits]\nmax_metadata_keys = {KEYS}\nmax_metadata_value_bytes = 65536\nmax_document_bytes = 1048576\n\
         [librdkafka]\n\"message.max.bytes\" = \"4194304\"\n"
    ));
    let max_message = 3 * MIB;
    let partitions = 2;
    log_topic_for_large_messages(&env, partitions, max_message);
    let config = sluice::config::Config::load_with_env(
        Some(&env.config_path()),
        Vec::<(String, String)>::new(),
        sluice::config::Overrides { sysdb: Some(env.sysdb.clone()), ..Default::default() },
    )
    .expect("the test's configuration");
    let no_wasm = sluice::config::memory::WasmLoad::default();
    let bound = sluice::config::memory::worst_case(&config, partitions as u64, max_message, no_wasm);
    let collections: Vec<String> = (0..4).map(|i| format!("{}-c{i}", env.prefix)).collect();
    let ids = 50;
    let producer = LogProducer::new(&env, partitions as u32, 4 * MIB as usize);
    let mut last = vec![vec![None::<usize>; ids]; collections.len()];
    let mut produce = |from: usize, to: usize, per_second: f64| {
        let began = Instant::now();
        for n in from..to {
            let (c, id) = (n % collections.len(), (n / collections.len()) % ids);
            producer.send(&hostile(&collections[c], id, n));
            last[c][id] = Some(n);
            let due = began + Duration::from_secs_f64((n - from) as f64 / per_second);
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
        }
        producer.flush();
    };

    let mut r1 = env.spawn_replica("r1", &[]);
    let peak1 = RssPeak::watch(r1.child.id());
    produce(0, total / 2, 100.0);
    std::thread::sleep(Duration::from_secs(2));
    r1.kill9();
    let peak1 = peak1.stop();
    // A backlog for the restarted replica: the second half arrives before it starts.
    produce(total / 2, total, 400.0);
    let r2 = env.spawn_replica("r2", &[]);
    let peak2 = RssPeak::watch(r2.child.id());
    env.wait_caught_up(WAIT);
    let peak2 = peak2.stop();
    eprintln!(
        "hostile sizes: {total} records of ~2.1 MiB; peak anonymous memory {} MiB before the kill, {} MiB catching up after it; formula {} MiB",
        peak1 / MIB,
        peak2 / MIB,
        bound / MIB
    );
    assert!(peak1 > 0 && peak2 > 0, "memory was sampled");
    assert!(peak1 <= bound, "peak {peak1} over the formula's {bound} bytes before the kill");
    assert!(peak2 <= bound, "peak {peak2} over the formula's {bound} bytes while catching up");
    drop(r2);
    // The state is the last version of every record: `sluice checksum` against the same
    // checksum of the expected records (regenerated from their versions, not kept).
    let mut hasher = <sha2::Sha256 as sha2::Digest>::new();
    let mut n = 0u64;
    let mut order: Vec<usize> = (0..collections.len()).collect();
    order.sort_by(|a, b| collections[*a].cmp(&collections[*b]));
    for ci in order {
        for (id, version) in last[ci].iter().enumerate() {
            let Some(v) = version else { continue };
            let r = hostile(&collections[ci], id, *v);
            let record = sluice::record::Record {
                id: r.id.clone(),
                embedding: r.embedding.clone(),
                metadata: r.metadata.clone().unwrap_or_default(),
                document: r.document.clone(),
                offset: 0,
            };
            sha2::Digest::update(
                &mut hasher,
                sluice::cli::records_cmd::canonical_line(&collections[ci], &record).as_bytes(),
            );
            n += 1;
        }
    }
    let expected: String = sha2::Digest::finalize(hasher).iter().map(|b| format!("{b:02x}")).collect();
    let got: Value = serde_json::from_str(&env.run(&["checksum", "--format", "json"])).unwrap();
    assert_eq!(got["records"], n, "records");
    assert_eq!(got["sha256"], expected, "the stored records are the last versions produced");
}

// ---------------------------------------------------------------------------------------
// A full disk.

/// The SQLite sysdb on a 64 MiB tmpfs, filled while records (some for the DLQ) arrive and
/// a backfill runs: commits fail as unavailable, `/readyz` answers 503 naming the full
/// disk, nothing is applied; once space is freed everything resumes by itself, the state
/// and the function's outputs equal the reference model, each DLQ entry is produced once
/// and `PRAGMA integrity_check` is `ok`.
#[test]
fn a_full_disk_pauses_commits_until_space_is_freed() {
    if !require_kafka() {
        return;
    }
    let base = Env::sqlite("diskfull");
    let disk = base.dir.join("disk");
    let _mount = Mount::tmpfs(&disk, 64 * MIB);
    let mut env = base.with_sections("[backfill]\nchunk_size = 25\npause_ms = 100\nscan_interval_ms = 500\n");
    env.sysdb = format!("sqlite://{}", disk.join("sysdb.db").display());
    env.run(&["init", "--partitions", "2"]);
    let port = free_port();
    // The backfill's first chunk waits 15 s before its commit, so that it meets the full
    // disk however fast it would otherwise finish (a loaded machine fills the disk slowly).
    let mut r = env.spawn_replica(
        "r1",
        &[
            ("SLUICE_HTTP", &format!("127.0.0.1:{port}")),
            ("SLUICE_FAILPOINT", "sleep_before_backfill_chunk_commit:1"),
            ("SLUICE_FAILPOINT_SLEEP_MS", "15000"),
        ],
    );
    wait_ready(port, &mut r);
    let first = small_workload(3_000, 21, &env.prefix, 4);
    env.produce(&jsonl_lines(&first));
    env.wait_caught_up(WAIT);
    let c = first[0].collection_id.clone();
    let f = attach(&env, &c, "statistics", "stats");
    let id = f["function_id"].as_str().unwrap().to_string();

    // Cut the WAL back to nothing (a commit reuses its blocks otherwise), then fill the
    // file system, leaving a few KiB, while the backfill runs.
    let db = rusqlite::Connection::open(disk.join("sysdb.db")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while db.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get::<_, i64>(0)).unwrap() != 0 {
        assert!(Instant::now() < deadline, "the WAL could not be truncated");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(db);
    // The replica keeps writing while the filler is made: fill in steps until less than
    // 64 KiB is left.
    let avail = || {
        let out = Command::new("df").args(["--output=avail", "-B1", disk.to_str().unwrap()]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).lines().nth(1).unwrap().trim().parse::<u64>().unwrap()
    };
    let mut fillers = Vec::new();
    while avail() > 64 * 1024 {
        assert!(fillers.len() < 20, "the tmpfs could not be filled: {} bytes left", avail());
        let filler = disk.join(format!("filler-{}", fillers.len()));
        let _ = Command::new("fallocate")
            .args(["-l", &(avail().saturating_sub(16 * 1024)).to_string(), filler.to_str().unwrap()])
            .status()
            .unwrap();
        fillers.push(filler);
    }
    // Records arrive: valid ones, and ones for the DLQ (a 5-dimension embedding in a
    // collection of 4 dimensions).
    let second = small_workload(2_000, 22, &env.prefix, 4);
    let mut bad = second[..20].to_vec();
    for b in &mut bad {
        b.operation = Operation::Upsert;
        b.embedding = Some(Embedding::from(vec![1.0f32; 5]));
    }
    let mut lines = jsonl_lines(&second);
    lines.extend(jsonl_lines(&bad));
    env.produce(&lines);
    let deadline = Instant::now() + WAIT;
    let why = loop {
        if let Some((503, _, body)) = http_get(port, "/readyz") {
            if body.contains("disk full") {
                break body;
            }
        }
        assert!(Instant::now() < deadline, "/readyz never named the full disk:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    eprintln!("/readyz while the disk is full: {why}");
    // The backfill (still walking the collection) meets the full disk too, and waits.
    let deadline = Instant::now() + Duration::from_secs(60);
    while !r.log_text().lines().any(|l| l.contains("backfill step failed; retrying") && l.contains("disk full")) {
        assert!(Instant::now() < deadline, "the backfill never met the full disk:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(3));
    let stuck: Value = serde_json::from_str(&env.run(&["offsets", "show", "--format", "json"])).unwrap();
    assert!(
        stuck.as_array().unwrap().iter().any(|p| p["lag"].as_i64().unwrap_or(0) > 0),
        "nothing can commit on a full disk: {stuck}"
    );
    assert!(r.child.try_wait().unwrap().is_none(), "the replica keeps running:\n{}", r.log_text());

    for filler in &fillers {
        let _ = std::fs::remove_file(filler);
    }
    env.wait_caught_up(WAIT);
    wait_status(&env, &id, "ready", WAIT);
    wait_ready(port, &mut r);
    let valid: Vec<LogRecord> = first.iter().chain(&second).cloned().collect();
    assert_records_match_model(&env, &valid);
    assert_outputs(&env, &valid, &c, "statistics", "stats");
    let dlq = sluice_integration_tests::consume_all(&env.dlq_topic(), 2, Duration::from_secs(60));
    let mut sources: Vec<(String, String)> = dlq
        .iter()
        .map(|m| (m.headers["sluice.source.partition"].clone(), m.headers["sluice.source.offset"].clone()))
        .collect();
    assert_eq!(sources.len(), bad.len(), "one DLQ entry per refused record: {sources:?}");
    sources.sort();
    sources.dedup();
    assert_eq!(sources.len(), bad.len(), "no DLQ entry twice");
    let conn = rusqlite::Connection::open_with_flags(disk.join("sysdb.db"), rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
        .unwrap();
    let check: String = conn.query_row("PRAGMA integrity_check", [], |r| r.get(0)).unwrap();
    assert_eq!(check, "ok");
    drop(conn);
    drop(r);
}
