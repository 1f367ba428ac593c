//! Inputs from the world outside our own producer, against the real broker and the real
//! binary, on SQLite and PostgreSQL:
//! - transactional producers (commit and abort markers, the last offset of the log a
//!   marker): the position covers the markers, lag reaches 0, and a log whose idle tail
//!   was deleted (log start = high watermark) is not mistaken for data loss;
//! - a record the sysdb refuses: found by splitting the batch, sent to the DLQ, the rest
//!   applied; the partition never stalls;
//! - a commit whose outcome was unknown but that landed with a marker: the function cache
//!   is refreshed, so no live change after the marker is missed;
//! - a worker stuck on its sysdb: the replica still stops on SIGTERM within its shutdown
//!   timeout, and `/readyz` says why it is not ready meanwhile.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use sluice::record::codec::encode;
use sluice::record::{LogRecord, MetaValue, Operation};
use sluice_integration_tests::{
    assert_records_match_model, brokers, consume_all, free_port, http_get, jsonl_lines, require_kafka,
    require_postgres, small_workload, Env,
};

const WAIT: Duration = Duration::from_secs(120);

fn on_both(name: &str, test: fn(Env)) {
    if !require_kafka() {
        return;
    }
    test(Env::sqlite(name));
    let rt = tokio::runtime::Runtime::new().unwrap();
    if rt.block_on(require_postgres()) {
        let env = rt.block_on(Env::postgres(name));
        test(env);
    }
}

// ---------------------------------------------------------------------------------------
// Transactional producers.

/// A transactional producer keyed like Sluice's (murmur2 over the collection id).
fn transactional_producer() -> ThreadedProducer<DefaultProducerContext> {
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("transactional.id", format!("it-txn-{}", sluice_integration_tests::suffix()))
        .set("partitioner", "murmur2_random")
        .create()
        .expect("transactional producer");
    p.init_transactions(Duration::from_secs(30)).expect("init_transactions");
    p
}

/// One transaction holding `records`, committed or aborted.
fn transaction(p: &ThreadedProducer<DefaultProducerContext>, topic: &str, records: &[LogRecord], commit: bool) {
    p.begin_transaction().expect("begin_transaction");
    for r in records {
        let payload = encode(r);
        p.send(BaseRecord::to(topic).key(r.collection_id.as_bytes()).payload(&payload))
            .map_err(|(e, _)| e)
            .expect("send");
    }
    if commit {
        p.commit_transaction(Duration::from_secs(30)).expect("commit_transaction");
    } else {
        // Deliver the records first: aborted records must be in the log for the consumer
        // to step over, and an abort while partitions are still being added to the
        // transaction can be refused by the broker ("invalid state").
        p.flush(Duration::from_secs(30)).expect("flush before abort_transaction");
        p.abort_transaction(Duration::from_secs(30)).expect("abort_transaction");
    }
}

#[test]
fn transactional_producers_lag_reaches_zero_and_an_idle_deleted_tail_is_no_gap() {
    on_both("txn", transactional);
}

fn transactional(env: Env) {
    env.run(&["init", "--partitions", "2"]);
    let topic = env.log_topic();
    let p = transactional_producer();
    let a = small_workload(300, 31, &env.prefix, 4);
    let b = small_workload(200, 32, &env.prefix, 4);
    transaction(&p, &topic, &a, true);
    transaction(&p, &topic, &b, false);
    let mut r1 = env.spawn_replica("r1", &[]);
    // Every partition's last offset is now a transaction marker: caught up means the
    // sysdb position equals the high watermark.
    env.wait_caught_up(WAIT);
    r1.kill9();
    let c = small_workload(300, 33, &env.prefix, 4);
    let d = small_workload(100, 34, &env.prefix, 4);
    transaction(&p, &topic, &c, true);
    transaction(&p, &topic, &d, false);
    let mut r2 = env.spawn_replica("r2", &[]);
    let rows = env.wait_caught_up(WAIT);
    for row in rows.as_array().unwrap() {
        assert_eq!(row["lag"].as_i64(), Some(0), "{row}");
    }
    // (The collections' names are random: a partition may hold none of them.)
    assert!(rows.as_array().unwrap().iter().any(|r| r["high_watermark"].as_i64() > Some(0)), "{rows}");
    let committed: Vec<LogRecord> = a.iter().chain(&c).cloned().collect();
    assert_records_match_model(&env, &committed);
    assert_eq!(r2.terminate(Duration::from_secs(30)), Some(0), "{}", r2.log_text());
    let checksum = env.run(&["checksum"]);

    // Retention deletes the idle tail: the log start moves to the high watermark (the
    // same thing a deleted last segment does). The position covers the markers, so the
    // next assignment finds no gap.
    let highs: Vec<(i32, i64)> = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["partition"].as_i64().unwrap() as i32, r["high_watermark"].as_i64().unwrap()))
        .collect();
    delete_records_before(&topic, &highs);
    let r3 = env.spawn_replica("r3", &[]);
    env.wait_caught_up(WAIT);
    std::thread::sleep(Duration::from_secs(2));
    let log = r3.log_text();
    assert!(log.contains("partition starts"), "r3 never started its partitions:\n{log}");
    assert!(!log.contains("HALTED") && !log.contains("gap"), "an idle deleted tail was taken for data loss:\n{log}");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let gaps = rt.block_on(async { sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().gaps(&topic).await.unwrap() });
    assert!(gaps.is_empty(), "no gap was lost: {gaps:?}");
    for row in env.offsets() {
        assert_eq!(row["lag"].as_i64(), Some(0), "{row}");
    }
    drop(r3);
    // The log is gone now; the state is what it was.
    assert_eq!(env.run(&["checksum"]), checksum, "the state changed after the idle tail was deleted");
}

/// Delete every record before `offset` in each partition (Kafka's DeleteRecords, what
/// retention does to whole segments).
fn delete_records_before(topic: &str, offsets: &[(i32, i64)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().expect("admin client");
    let mut tpl = TopicPartitionList::new();
    for (p, o) in offsets {
        tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).unwrap();
    }
    let rt = tokio::runtime::Runtime::new().unwrap();
    let res = rt.block_on(admin.delete_records(&tpl, &AdminOptions::new())).expect("delete_records");
    for e in res.elements() {
        assert!(e.error().is_ok(), "delete records of partition {}: {:?}", e.partition(), e.error());
    }
}

// ---------------------------------------------------------------------------------------
// A record the sysdb refuses.

/// Install a rule in the sysdb that refuses records whose id starts with `poison`, the
/// way a database refuses a value (PostgreSQL: a data exception, SQLSTATE 22012; SQLite:
/// a trigger that aborts the statement).
fn install_poison_rule(env: &Env) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    if let Some(path) = env.sysdb.strip_prefix("sqlite://") {
        let db = rusqlite::Connection::open(path).unwrap();
        // Wherever the record is written: `records`, or the records delta that small
        // transactions append to (src/sysdb/sqlite/values.rs).
        for table in ["records", "record_delta"] {
            db.execute_batch(&format!(
                "CREATE TRIGGER poison_{table} BEFORE INSERT ON {table} WHEN NEW.id LIKE 'poison%' BEGIN SELECT RAISE(ABORT, 'value refused: poison'); END;"
            ))
            .unwrap();
        }
    } else {
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&env.sysdb, tokio_postgres::NoTls).await.unwrap();
            tokio::spawn(conn);
            client
                .batch_execute("ALTER TABLE records ADD CONSTRAINT poison CHECK (id NOT LIKE 'poison%' OR 1 / (length(id) - length(id)) = 1)")
                .await
                .unwrap();
        });
    }
}

#[test]
fn a_record_the_sysdb_refuses_goes_to_the_dlq_and_the_rest_is_applied() {
    on_both("refused", refused_record);
}

fn refused_record(env: Env) {
    // One partition, batches of up to 200 records: the poison record shares its batch
    // with others, which must still be applied.
    env.run(&["init", "--partitions", "1"]);
    install_poison_rule(&env);
    let mut log = small_workload(400, 41, &env.prefix, 3);
    let mut poison = log[150].clone();
    poison.operation = Operation::Upsert;
    poison.id = "poison-1".into();
    poison.metadata = Some([("k".to_string(), MetaValue::String("v".into()))].into_iter().collect());
    log.insert(151, poison);
    env.produce(&jsonl_lines(&log));
    let r = env.spawn_replica("r1", &[]);
    env.wait_caught_up(WAIT);
    r.wait_for_log("isolating the record", Duration::from_secs(5));
    assert!(!r.log_text().contains("HALTED"), "{}", r.log_text());
    let dlq = consume_all(&env.dlq_topic(), 1, Duration::from_secs(30));
    assert_eq!(dlq.len(), 1, "exactly the refused record is in the DLQ: {dlq:?}");
    assert_eq!(dlq[0].headers.get("sluice.error.kind").map(String::as_str), Some("sysdb_rejected"));
    assert_eq!(dlq[0].headers.get("sluice.source.offset").map(String::as_str), Some("151"));
    assert_eq!(dlq[0].headers.get("sluice.source.partition").map(String::as_str), Some("0"));
    let applied: Vec<LogRecord> = log.iter().filter(|r| r.id != "poison-1").cloned().collect();
    assert_records_match_model(&env, &applied);
}

// ---------------------------------------------------------------------------------------
// A commit that landed although its outcome was unknown, holding a marker.

#[test]
fn a_landed_marker_commit_refreshes_the_function_cache() {
    on_both("landed", landed_marker_commit);
}

fn landed_marker_commit(env: Env) {
    env.run(&["init", "--partitions", "1"]);
    let cid = format!("{}-c0", env.prefix);
    let before = small_workload(200, 51, &env.prefix, 1);
    env.produce(&jsonl_lines(&before));
    let r = env.spawn_replica("r1", &[("SLUICE_FAILPOINT", "fail_marker_commit_outcome:1")]);
    env.wait_caught_up(WAIT);
    let out = format!("{cid}-count");
    env.run(&["functions", "attach", &cid, "--function", "record_counter", "--output", &out]);
    r.wait_for_log("fail point fail_marker_commit_outcome reached", Duration::from_secs(30));
    r.wait_for_log("had landed", Duration::from_secs(30));
    // Live changes right after the marker, well within the function cache's lifetime.
    let after = small_workload(300, 52, &env.prefix, 1);
    env.produce(&jsonl_lines(&after));
    env.wait_caught_up(WAIT);
    let deadline = Instant::now() + WAIT;
    loop {
        let fns: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
        if fns[0]["status"] == "ready" {
            break;
        }
        assert!(Instant::now() < deadline, "function never ready: {fns}");
        std::thread::sleep(Duration::from_millis(300));
    }
    let all: Vec<LogRecord> = before.iter().chain(&after).cloned().collect();
    assert_records_match_model(&env, &all);
    let indexed: Vec<(i64, LogRecord)> = all.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let live = sluice::materialize::model::reference(&indexed).collections[&cid].records.len();
    let counted: Vec<Value> =
        env.run(&["records", &out, "--format", "jsonl"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let text = format!("{counted:?}");
    assert!(text.contains("\"total_count\""), "no counter record: {text}");
    let total = counted.iter().find_map(|r| r["metadata"]["total_count"].as_i64()).expect("total_count");
    assert_eq!(total, live as i64, "record_counter missed live changes after the marker: {text}\n{}", r.log_text());
}

// ---------------------------------------------------------------------------------------
// A worker stuck on its sysdb does not hold the replica's shutdown.

#[test]
fn sigterm_stops_a_replica_whose_worker_is_stuck_on_a_locked_sysdb() {
    if !require_kafka() {
        return;
    }
    // The test config's shutdown timeout is 15 s.
    let env = Env::sqlite("stuck");
    env.run(&["init", "--partitions", "2"]);
    // Enough records to fill the worker inboxes (2 chunks of up to 512, 2 more in the backlog) behind the stuck batch.
    let log = small_workload(20_000, 61, &env.prefix, 6);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let mut r = env.spawn_replica("r1", &[("SLUICE_HTTP", &addr)]);
    r.wait_for_log("partition starts", Duration::from_secs(60));
    // Another writer takes the SQLite write lock and holds it for the rest of the test.
    let path = env.sysdb.strip_prefix("sqlite://").unwrap().to_string();
    let locker = rusqlite::Connection::open(&path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE; INSERT INTO meta(key, value) VALUES ('it-lock', 'held');").unwrap();
    env.produce(&jsonl_lines(&log));
    // The batch cannot commit: /readyz must say why, not "ready".
    let deadline = Instant::now() + Duration::from_secs(60);
    let why = loop {
        if let Some((status, _, body)) = http_get(port, "/readyz") {
            if status == 503 && (body.contains("sysdb unavailable") || body.contains("halted")) {
                break body;
            }
        }
        assert!(Instant::now() < deadline, "readiness never reported the stuck sysdb:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    };
    println!("/readyz while the sysdb is locked: {why}");
    // Let the consumer fill the worker's inbox behind the stuck batch.
    std::thread::sleep(Duration::from_secs(3));
    let sent = Instant::now();
    let code = r.terminate(Duration::from_secs(45));
    let took = sent.elapsed();
    assert!(code.is_some(), "the replica ignored SIGTERM for 45 s (shutdown timeout 15 s):\n{}", r.log_text());
    // The shutdown timeout, then at most 5 s to close the consumer.
    assert!(took < Duration::from_secs(22), "stopping took {took:?} with a 15 s shutdown timeout");
    drop(locker);
}

// ---------------------------------------------------------------------------------------
// DLQ entries under retries: a batch retried while the sysdb is unavailable produces its
// DLQ entries once, and the records stay out of the sysdb.

#[test]
fn a_batch_retried_during_a_sysdb_outage_produces_each_dlq_entry_once() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("dlq-once");
    env.run(&["init", "--partitions", "1"]);
    let mut r = env.spawn_replica("r1", &[]);
    r.wait_for_log("partition starts", Duration::from_secs(60));
    let path = env.sysdb.strip_prefix("sqlite://").unwrap().to_string();
    let locker = rusqlite::Connection::open(&path).unwrap();
    locker.execute_batch("BEGIN IMMEDIATE; INSERT INTO meta(key, value) VALUES ('it-lock', 'held');").unwrap();
    // Good records with three undecodable ones among them, in one batch.
    let good = small_workload(100, 71, &env.prefix, 2);
    let topic = env.log_topic();
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("partitioner", "murmur2_random").create().unwrap();
    let key = good[0].collection_id.clone();
    let mut poison_offsets = Vec::new();
    let mut sent = 0i64;
    for (i, rec) in good.iter().enumerate() {
        if i % 40 == 10 {
            p.send(BaseRecord::to(&topic).key(key.as_bytes()).payload(&b"\xff\xfe not avro"[..]))
                .map_err(|(e, _)| e)
                .unwrap();
            poison_offsets.push(sent);
            sent += 1;
        }
        let payload = encode(rec);
        p.send(BaseRecord::to(&topic).key(rec.collection_id.as_bytes()).payload(&payload)).map_err(|(e, _)| e).unwrap();
        sent += 1;
    }
    p.flush(Duration::from_secs(30)).unwrap();
    // The batch fails again and again while the lock is held.
    let deadline = Instant::now() + Duration::from_secs(60);
    while r.log_text().matches("sysdb unavailable; retrying the batch").count() < 5 {
        assert!(Instant::now() < deadline, "the batch was not retried:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(locker);
    env.wait_caught_up(WAIT);
    let dlq = consume_all(&env.dlq_topic(), 1, Duration::from_secs(30));
    let dlq_offsets: Vec<i64> = dlq.iter().map(|m| m.headers["sluice.source.offset"].parse().unwrap()).collect();
    assert_eq!(dlq_offsets, poison_offsets, "each undecodable record once in the DLQ, in order");
    assert_records_match_model(&env, &good);
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));
}

// ---------------------------------------------------------------------------------------
// An out-of-range fetch names no partition: only a partition whose own position fell
// below its log start is checked; one whose records were fetched (and wait in its batch)
// is not taken for data loss.

#[test]
fn an_out_of_range_fetch_halts_only_the_partition_whose_records_are_gone() {
    if !require_kafka() {
        return;
    }
    // Partition 0's first batch (200 records, the test default) stalls 10 s before its
    // commit; meanwhile its backlog stops the reading of it, and its librdkafka queue
    // (1 KiB here) stops its fetching far below the end of its 4000 records, whatever the
    // speed of the machine. Fetches return about one small record batch each. Partition
    // 1's records wait 4 s in their batch.
    let env = Env::sqlite("oor").with_processor("batch_linger_ms = 4000\nbatch_linger_behind_ms = 0").with_sections(
        "[librdkafka]\n\"max.partition.fetch.bytes\" = \"256\"\n\"queued.max.messages.kbytes\" = \"1\"\n",
    );
    env.run(&["init", "--partitions", "2"]);
    let topic = env.log_topic();
    let on = |p: u32| -> String {
        (0..)
            .map(|i| format!("{}-p{p}-{i}", env.prefix))
            .find(|c| sluice::record::partitioner::partition_for(c.as_bytes(), 2) == p)
            .unwrap()
    };
    let (c0, c1) = (on(0), on(1));
    let recs = |cid: &str, n: usize, seed: u64| -> Vec<LogRecord> {
        small_workload(n, seed, &env.prefix, 1)
            .into_iter()
            .map(|mut r| {
                r.collection_id = cid.to_string();
                r
            })
            .collect()
    };
    // One record per producer batch, so that a fetch cannot take the whole backlog.
    let p: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("partitioner", "murmur2_random")
        .set("batch.num.messages", "1")
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let send = |rs: &[LogRecord]| {
        for r in rs {
            let payload = encode(r);
            p.send(BaseRecord::to(&topic).key(r.collection_id.as_bytes()).payload(&payload))
                .map_err(|(e, _)| e)
                .unwrap();
        }
        p.flush(Duration::from_secs(60)).unwrap();
    };
    send(&recs(&c0, 4000, 81));
    let r = env.spawn_replica(
        "r1",
        &[("SLUICE_FAILPOINT", "sleep_before_sysdb_commit:1"), ("SLUICE_FAILPOINT_SLEEP_MS", "10000")],
    );
    // Only partition 0 has records, so the stalled commit is partition 0's.
    r.wait_for_log("fail point sleep_before_sysdb_commit reached", Duration::from_secs(60));
    let p1_records = recs(&c1, 20, 82);
    send(&p1_records);
    // Partition 1's records are fetched and wait in their batch; partition 0 is fetched
    // no further, far below its high watermark. Delete everything below both high watermarks.
    std::thread::sleep(Duration::from_millis(1000));
    let highs: Vec<(i32, i64)> = (0..2).map(|p| (p, sluice_high(&topic, p))).collect();
    delete_records_before(&topic, &highs);
    assert!(
        !r.log_text().contains("sleep_before_sysdb_commit: awake"),
        "the records were deleted after partition 0's stall ended: raise SLUICE_FAILPOINT_SLEEP_MS"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    while !halted_partitions(&r.log_text()).contains(&0) {
        assert!(Instant::now() < deadline, "partition 0 lost its records but did not halt:\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    // Partition 1 commits its fetched records and is not halted.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = env.offsets();
        let p1 = rows.iter().find(|row| row["partition"] == 1).unwrap().clone();
        if p1["sysdb_next_offset"].as_i64() == Some(highs[1].1) {
            break;
        }
        assert!(Instant::now() < deadline, "partition 1 never committed its fetched records: {p1}\n{}", r.log_text());
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = r.log_text();
    assert_eq!(halted_partitions(&log), vec![0], "only partition 0 lost records:\n{log}");
    let got: Vec<Value> =
        env.run(&["records", &c1, "--format", "jsonl"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let indexed: Vec<(i64, LogRecord)> = p1_records.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let want = sluice::materialize::model::reference(&indexed).collections[&c1].records.len();
    assert_eq!(got.len(), want, "partition 1's records applied");
}

fn sluice_high(topic: &str, partition: i32) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    c.fetch_watermarks(topic, partition, Duration::from_secs(10)).unwrap().1
}

/// The partitions a replica's log says it halted.
fn halted_partitions(log: &str) -> Vec<i32> {
    let mut out: Vec<i32> = log
        .lines()
        .filter(|l| l.contains("partition HALTED"))
        .filter_map(|l| l.split(" partition=").nth(1)?.split(' ').next()?.parse().ok())
        .collect();
    out.dedup();
    out
}
