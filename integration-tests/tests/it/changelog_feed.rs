//! The change feed (`docs/changes.md`) against the real broker, on SQLite and PostgreSQL.
//!
//! The acceptance run: two replicas, four replicas killed (three at fail points: between
//! the sysdb commit of a batch and the relay's Kafka commit of its changes, twice, and
//! between that commit and the sysdb's copy of the progress; one SIGKILL at no particular
//! point under load), a replica frozen (SIGSTOP) inside a relay transaction past the
//! session timeout and woken as a zombie, a function attached midway. A read_committed
//! reader then folds the changes topic into a copy of the state, which must equal `sluice
//! records` for every collection (the function's output included); every changelog
//! sequence number of a partition appears once, without a hole; the source offsets of
//! data changes are exactly those the log's records changed a record at (a reference fold
//! of the log topic), each once; and each record's changes come in source-offset order.
//! The Python consumer of `docs/examples/fold_changes.py` folds the topic to the same state.
//!
//! Also: a full outbox pauses its partition; the test's own broker stopped for 20 s under
//! load (the outbox grows, `/readyz` says why, nothing is lost); the snapshot of records
//! that predate the feed, with live changes during it and asked again by `sluice changes
//! snapshot`; values framed for a schema registry.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::record_to_json;
use sluice::record::change::{decode_change, split_change_key};
use sluice::record::Operation;
use sluice_integration_tests::both_backends;
use sluice_integration_tests::faults::{attach, expect_abort_at, wait_status, workload, PrivateKafka};
use sluice_integration_tests::{
    brokers, consume_all, consume_all_from, free_port, http_get, jsonl_lines, repo_root, venv_python, ConsumedMsg, Env,
    Replica,
};

const WAIT: Duration = Duration::from_secs(240);
const PARTITIONS: i32 = 4;

/// `sluice records <collection>` as JSON values, by id.
fn records(env: &Env, collection: &str) -> BTreeMap<String, Value> {
    let out = env.cmd().args(["records", collection, "--format", "jsonl"]).output().expect("spawn sluice");
    assert!(out.status.success(), "records {collection}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("record JSON");
            (v["id"].as_str().expect("id").to_string(), v)
        })
        .collect()
}

fn collections(env: &Env) -> Vec<String> {
    let v: Value = serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).expect("collections");
    v.as_array().expect("array").iter().map(|c| c["id"].as_str().expect("id").to_string()).collect()
}

/// The changes topic folded in offset order per partition: `collection -> id -> record`.
fn fold(msgs: &[ConsumedMsg]) -> BTreeMap<String, BTreeMap<String, Value>> {
    let mut state: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
    for m in msgs {
        let key = m.key.as_deref().expect("a change has a key");
        let (collection, id) = split_change_key(key).expect("collection NUL id");
        if m.payload.is_empty() {
            state.entry(collection.to_string()).or_default().remove(id);
        } else {
            let (c, r) = decode_change(&m.payload).expect("a ChangeRecord value");
            assert_eq!((c.as_str(), r.id.as_str()), (collection, id), "value and key name the same record");
            state.entry(c).or_default().insert(r.id.clone(), record_to_json(&r));
        }
    }
    state.retain(|_, v| !v.is_empty());
    state
}

/// A folded state in a form both folds print alike: embeddings as f32 values, no offsets
/// (`sluice records` does not print them).
fn comparable(mut state: Value) -> Value {
    for records in state.as_object_mut().expect("collections").values_mut() {
        for r in records.as_object_mut().expect("records").values_mut() {
            let r = r.as_object_mut().expect("record");
            r.remove("offset");
            if let Some(Value::Array(e)) = r.get_mut("embedding") {
                for x in e.iter_mut() {
                    *x = serde_json::json!(x.as_f64().expect("a float") as f32 as f64);
                }
            }
        }
    }
    state
}

/// The brokers `env`'s commands use (an `extra` SLUICE_BROKERS overrides the shared one).
fn env_brokers(env: &Env) -> String {
    env.extra.iter().rev().find(|(k, _)| k == "SLUICE_BROKERS").map_or_else(brokers, |(_, v)| v.clone())
}

/// Wait until the folded topic equals the records of every collection; returns the
/// messages read last.
fn wait_feed_equals_records(env: &Env) -> Vec<ConsumedMsg> {
    let deadline = Instant::now() + WAIT;
    loop {
        let msgs = consume_all_from(
            &env_brokers(env),
            &format!("{}.changes", env.prefix),
            PARTITIONS,
            Duration::from_secs(120),
        );
        let folded = fold(&msgs);
        let mut want: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for c in collections(env) {
            let r = records(env, &c);
            if !r.is_empty() {
                want.insert(c, r);
            }
        }
        if folded == want {
            return msgs;
        }
        if Instant::now() > deadline {
            let names: BTreeSet<&String> = folded.keys().chain(want.keys()).collect();
            let diff: Vec<String> = names
                .into_iter()
                .filter(|c| folded.get(*c) != want.get(*c))
                .map(|c| {
                    format!(
                        "{c}: feed {} records, sysdb {}",
                        folded.get(c).map_or(0, BTreeMap::len),
                        want.get(c).map_or(0, BTreeMap::len)
                    )
                })
                .collect();
            panic!("the folded change feed never equalled the records: {diff:?}");
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The offsets of the log topic's records that changed a record, per partition: the log
/// read back and folded by the rules of `docs/design.md` section 5 (an ADD of a live id, an
/// UPDATE or DELETE of an absent one change nothing; an UPSERT always does; markers are
/// control records). The workloads here have one embedding dimension, so nothing is
/// refused.
fn applied_offsets(env: &Env) -> BTreeSet<(i32, i64)> {
    let msgs = consume_all_from(&env_brokers(env), &env.log_topic(), PARTITIONS, Duration::from_secs(180));
    let mut live: BTreeSet<(String, String)> = BTreeSet::new();
    let mut applied = BTreeSet::new();
    for m in &msgs {
        let r = sluice::record::codec::decode(&m.payload).expect("a log record");
        let key = (r.collection_id.clone(), r.id.clone());
        let changed = match r.operation {
            Operation::Add => live.insert(key),
            Operation::Upsert => {
                live.insert(key);
                true
            }
            Operation::Update => live.contains(&key),
            Operation::Delete => live.remove(&key),
            Operation::BackfillFn => false,
        };
        if changed {
            applied.insert((m.partition, m.offset));
        }
    }
    applied
}

/// The exactly-once checks of a folded feed: each partition's sequence numbers once each,
/// from 0, without a hole, with every header; the source offsets of data changes (not
/// snapshot messages, not the outputs named) once each, and each record's changes in
/// source-offset order. Returns those source offsets.
fn audit(msgs: &[ConsumedMsg], outputs: &[&str]) -> BTreeSet<(i32, i64)> {
    let mut seqs: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for m in msgs {
        assert_eq!(
            m.headers.get("sluice.source.partition").map(String::as_str),
            Some(m.partition.to_string().as_str())
        );
        let seq: i64 = m.headers["sluice.changelog.seq"].parse().expect("seq header");
        seqs.entry(m.partition).or_default().push(seq);
        for h in ["sluice.source.offset", "sluice.operation", "sluice.collection", "sluice.version"] {
            assert!(m.headers.contains_key(h), "header {h} on every change");
        }
    }
    for (p, s) in &seqs {
        assert_eq!(*s, (0..s.len() as i64).collect::<Vec<_>>(), "partition {p}: sequence numbers once each, in order");
    }
    let mut seen: BTreeSet<(i32, i64)> = BTreeSet::new();
    let mut last: BTreeMap<(String, String), i64> = BTreeMap::new();
    for m in msgs.iter().filter(|m| {
        !outputs.contains(&m.headers["sluice.collection"].as_str()) && m.headers["sluice.operation"] != "snapshot"
    }) {
        let offset: i64 = m.headers["sluice.source.offset"].parse().expect("offset header");
        assert!(seen.insert((m.partition, offset)), "source offset {}/{offset} published twice", m.partition);
        let (c, id) = split_change_key(m.key.as_deref().expect("key")).expect("key");
        if let Some(prev) = last.insert((c.to_string(), id.to_string()), offset) {
            assert!(prev < offset, "{c}/{id}: change at {offset} after one at {prev}");
        }
    }
    seen
}

/// The feed's unpublished changes and what its outbox took in all, summed over the
/// partitions, read from the sysdb itself (`offsets show` needs the broker).
fn outbox_totals(env: &Env) -> (i64, i64, i64) {
    let url = env.sysdb.clone();
    // A thread of its own: this may run on a runtime's blocking thread.
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        rt.block_on(async {
            let db = sluice::sysdb::Sysdb::open_existing(&url).await.expect("open the sysdb");
            let rows = db.changelog_positions().await.expect("changelog positions");
            let unpublished = rows.iter().map(|c| (c.next_seq - 1 - c.published_seq).max(0)).sum();
            let taken = rows.iter().map(|c| c.next_seq).sum();
            let published = rows.iter().map(|c| c.published_seq + 1).sum();
            (unpublished, taken, published)
        })
    })
    .join()
    .expect("sysdb read")
}

/// The number of collections, `at_least` or more, whose workload (`{prefix}-c0`, ...)
/// reaches every partition of the log.
fn covering_collections(prefix: &str, at_least: usize) -> usize {
    let mut covered = std::collections::BTreeSet::new();
    for n in 0.. {
        covered
            .insert(sluice::record::partitioner::partition_for(format!("{prefix}-c{n}").as_bytes(), PARTITIONS as u32));
        if n + 1 >= at_least && covered.len() == PARTITIONS as usize {
            return n + 1;
        }
    }
    unreachable!()
}

fn signal(r: &Replica, sig: &str) {
    let ok = std::process::Command::new("kill").args([sig, &r.child.id().to_string()]).status().expect("kill");
    assert!(ok.success(), "kill {sig}");
}

/// Keep producing small workloads once `r` owns partitions, until it aborts at fail point
/// `name` (it must have changes to publish when it gets there, whichever partitions the
/// group gave it).
fn produce_until_abort(env: &Env, r: &mut Replica, name: &str, seed: u64) {
    r.wait_for_log("partition starts", WAIT);
    let deadline = Instant::now() + WAIT;
    let mut seed = seed;
    while r.child.try_wait().expect("try_wait").is_none() {
        assert!(Instant::now() < deadline, "never reached fail point {name}:\n{}", r.log_text());
        env.produce(&jsonl_lines(&workload(150, seed, &env.prefix, 6, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    expect_abort_at(r, name, Duration::from_secs(10));
}

both_backends!(changes_exactly_once_through_kills, exactly_once);
fn exactly_once(env: Env) {
    let began = Instant::now();
    let env = env.with_sections(
        "[changelog]\nenabled = true\ntransaction_timeout_ms = 30000\nmax_records_per_transaction = 50\n",
    );
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    // Every partition gets records, so that whichever partitions a replica is given, it
    // has changes to publish and reaches its fail point.
    let n_collections = covering_collections(&env.prefix, 6);
    let first = workload(1_500, 41, &env.prefix, n_collections, 60);
    env.produce(&jsonl_lines(&first));

    // Kill 1: after a batch's sysdb commit, before the relay's Kafka commit of its changes.
    let mut a = env.spawn_replica("a1", &[("SLUICE_FAILPOINT", "before_changelog_kafka_commit:3")]);
    let mut b = env.spawn_replica("b1", &[]);
    produce_until_abort(&env, &mut a, "before_changelog_kafka_commit", 100);

    // A function attached midway: its output's changes (backfilled and live) join the feed.
    let collection = first[0].collection_id.clone();
    let output = format!("{}-count", env.prefix);
    let f = attach(&env, &collection, "record_counter", &output);
    let fid = f["function_id"].as_str().expect("function id").to_string();

    // Kill 2: after the relay's Kafka commit, before the sysdb's copy of the progress: the
    // next relay must read the progress back from Kafka and republish nothing.
    let mut a = env.spawn_replica("a2", &[("SLUICE_FAILPOINT", "after_changelog_kafka_commit:2")]);
    produce_until_abort(&env, &mut a, "after_changelog_kafka_commit", 200);
    // Kill 3: before the Kafka commit again, now with the function running.
    let mut a = env.spawn_replica("a3", &[("SLUICE_FAILPOINT", "before_changelog_kafka_commit:2")]);
    produce_until_abort(&env, &mut a, "before_changelog_kafka_commit", 300);

    // Kill 4: SIGKILL of the other replica at no chosen point, with records and changes in
    // flight (it committed batches and relay transactions just before).
    let mut seed = 350;
    let mut a = env.spawn_replica("a4", &[]);
    a.wait_for_log("partition starts", WAIT);
    for _ in 0..6 {
        env.produce(&jsonl_lines(&workload(150, seed, &env.prefix, n_collections, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(250));
    }
    b.kill9();
    env.produce(&jsonl_lines(&workload(150, seed, &env.prefix, n_collections, 60)));
    seed += 1;

    // Frozen inside a relay transaction (changes sent, not committed) past the session
    // timeout: the partition's next owner fences its producer and aborts the open
    // transaction; woken up as a zombie, its commit is refused and nothing of it is ever
    // visible.
    let mut z = env.spawn_replica(
        "zombie",
        &[("SLUICE_FAILPOINT", "sleep_before_changelog_kafka_commit:2"), ("SLUICE_FAILPOINT_SLEEP_MS", "3000")],
    );
    z.wait_for_log("partition starts", WAIT);
    let deadline = Instant::now() + WAIT;
    while !z.log_text().contains("fail point sleep_before_changelog_kafka_commit reached") {
        assert!(Instant::now() < deadline, "the zombie never reached its fail point:\n{}", z.log_text());
        env.produce(&jsonl_lines(&workload(150, seed, &env.prefix, n_collections, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(&z, "-STOP");
    for _ in 0..10 {
        env.produce(&jsonl_lines(&workload(100, seed, &env.prefix, n_collections, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    signal(&z, "-CONT");
    z.wait_for_log("changelog relay fenced by a newer owner", WAIT);
    z.terminate(Duration::from_secs(30));

    let mut b = env.spawn_replica("b2", &[]);
    wait_status(&env, &fid, "ready", WAIT);
    env.wait_caught_up(WAIT);
    let msgs = wait_feed_equals_records(&env);
    // `offsets show` follows: every change published, by the sysdb's copy of the progress.
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = env.offsets();
        if rows.iter().all(|r| r["changelog_unpublished"] == 0 && r["changelog_published_seq"].is_i64()) {
            break;
        }
        assert!(Instant::now() < deadline, "offsets show never reached an empty outbox: {rows:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // The consumer example of docs/changes.md folds the same topic to the same state.
    let out = std::process::Command::new(venv_python())
        .arg(repo_root().join("docs/examples/fold_changes.py"))
        .args([brokers().as_str(), &format!("{}.changes", env.prefix)])
        .output()
        .expect("run docs/examples/fold_changes.py");
    assert!(out.status.success(), "fold_changes.py: {}", String::from_utf8_lossy(&out.stderr));
    let python: Value = serde_json::from_slice(&out.stdout).expect("fold_changes.py prints JSON");
    let rust = serde_json::to_value(fold(&msgs)).expect("fold as JSON");
    assert_eq!(comparable(python), comparable(rust), "the Python example's fold differs");
    // A reset's plan says that the records it re-applies are published again.
    let busiest = env.offsets().into_iter().max_by_key(|r| r["sysdb_next_offset"].as_i64()).expect("a partition");
    let p = busiest["partition"].to_string();
    let plan = env.run(&["offsets", "reset", "--partition", &p, "--to", "0"]);
    assert!(plan.contains("the change feed is on") && plan.contains("published to"), "the reset plan: {plan}");
    a.kill9();
    b.terminate(Duration::from_secs(30));

    // Exactly once: sequence numbers and data changes once each, in order per record; and
    // the data changes are exactly the log records that changed a record.
    let seen = audit(&msgs, &[output.as_str()]);
    let applied = applied_offsets(&env);
    let missing: Vec<_> = applied.difference(&seen).take(10).collect();
    let extra: Vec<_> = seen.difference(&applied).take(10).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "source offsets that changed a record ({}) and those in the feed ({}) differ: missing {missing:?}, not applied {extra:?}",
        applied.len(),
        seen.len()
    );
    assert!(msgs.iter().any(|m| m.headers["sluice.collection"] == output), "the function's output is in the feed");
    println!(
        "change feed through 4 kills and a zombie: {} messages over {PARTITIONS} partitions, {} data changes (= the log's applied records), {:.0?}",
        msgs.len(),
        seen.len(),
        began.elapsed()
    );
}

// Back-pressure: a relay stalled inside its transaction (a broker that does not answer)
// lets its partition's outbox reach `outbox_max_bytes`; the partition pauses, named in
// `/readyz`, and resumes once the relay publishes again. Nothing is dropped: the feed
// ends equal to the records.
both_backends!(a_full_outbox_pauses_the_partition, back_pressure);
fn back_pressure(env: Env) {
    let env =
        env.with_sections("[changelog]\nenabled = true\noutbox_max_bytes = 3000\nmax_records_per_transaction = 10\n");
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut r = env.spawn_replica(
        "stalled",
        &[
            ("SLUICE_FAILPOINT", "sleep_before_changelog_kafka_commit:1"),
            ("SLUICE_FAILPOINT_SLEEP_MS", "20000"),
            ("SLUICE_HTTP", &listen),
        ],
    );
    r.wait_for_log("partition starts", WAIT);
    env.produce(&jsonl_lines(&workload(1_000, 51, &env.prefix, 6, 60)));
    r.wait_for_log("fail point sleep_before_changelog_kafka_commit reached", WAIT);
    // Records keep coming while the relay is stalled: the stalled partition's next batch
    // finds its outbox full.
    let deadline = Instant::now() + Duration::from_secs(18);
    let mut seed = 52;
    loop {
        let ready = http_get(port, "/readyz");
        if let Some((503, _, body)) = &ready {
            if body.contains("changelog outbox holds") {
                break;
            }
        }
        assert!(Instant::now() < deadline, "/readyz never named a full changelog outbox: {ready:?}");
        env.produce(&jsonl_lines(&workload(100, seed, &env.prefix, 6, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(100));
    }
    let paused = env.offsets();
    assert!(
        paused.iter().any(|p| p["lag"].as_i64() > Some(0) && p["changelog_unpublished"].as_i64() > Some(0)),
        "a paused partition has records waiting and changes unpublished: {paused:?}"
    );
    r.wait_for_log("the partition resumes", WAIT);
    env.wait_caught_up(WAIT);
    wait_feed_equals_records(&env);
    let deadline = Instant::now() + WAIT;
    while http_get(port, "/readyz").map(|(s, _, _)| s) != Some(200) {
        assert!(Instant::now() < deadline, "/readyz never came back: {:?}", http_get(port, "/readyz"));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(r.log_text().contains("changelog outbox full"), "the pause is in the log");
    r.terminate(Duration::from_secs(30));
}

// Kafka stopped for 20 s under load, on a broker of the test's own: a partition's worker
// (held at a fail point while the broker was up, so that its records are fetched and
// waiting) applies them while the broker is away; their changes stay in the outbox, which
// grows until the partition pauses at `outbox_max_bytes` (small: the changes of the held
// batch alone fill it, so the partition's next batch pauses however the records were cut
// into batches), and `/readyz` says so. Nothing
// is published meanwhile. Once the broker is back the relay publishes everything, and the
// folded feed equals the records, each change once. The group's session timeout (40 s)
// outlasts the outage: with the tests' usual 6 s the consumer would give its partitions up
// as lost a few seconds into it, and the replica would apply nothing more until the broker
// is back (which loses nothing either, but shows no growth).
both_backends!(the_feed_survives_kafka_stopped_for_20s, kafka_away);
fn kafka_away(env: Env) {
    let kafka = PrivateKafka::start(&env.dir);
    let mut env = env.with_kafka("session_timeout_ms = 40000\n").with_sections(
        "[changelog]\nenabled = true\noutbox_max_bytes = 4000\ntransaction_timeout_ms = 20000\nmax_records_per_transaction = 100\n",
    );
    env.extra.push(("SLUICE_BROKERS".into(), kafka.bootstrap()));
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let mut r = env.spawn_replica(
        "r",
        &[
            ("SLUICE_FAILPOINT", "sleep_before_sysdb_commit:1"),
            ("SLUICE_FAILPOINT_SLEEP_MS", "22000"),
            ("SLUICE_HTTP", &listen),
        ],
    );
    r.wait_for_log("partition starts", WAIT);
    // A paced load; the first batch's worker sleeps at its sysdb commit meanwhile.
    let mut seed = 500;
    env.produce(&jsonl_lines(&workload(200, seed, &env.prefix, 6, 80)));
    r.wait_for_log("fail point sleep_before_sysdb_commit reached", WAIT);
    let held = Instant::now();
    // Bounded in time, not in count: on a loaded machine eight `produce` calls took 21 s,
    // and the broker must stop well before the held worker wakes (22 s).
    for _ in 0..8 {
        if held.elapsed() > Duration::from_secs(8) {
            break;
        }
        seed += 1;
        env.produce(&jsonl_lines(&workload(300, seed, &env.prefix, 6, 80)));
        std::thread::sleep(Duration::from_millis(200));
    }
    std::thread::sleep(Duration::from_secs(1)); // fetched by the replica

    kafka.stop();
    let stopped = Instant::now();
    assert!(
        held.elapsed() < Duration::from_secs(20),
        "the broker stopped {:?} after the worker was held: too late, it may have woken with the broker up",
        held.elapsed()
    );
    let (_, taken_at_stop, published_at_stop) = outbox_totals(&env);
    let mut readyz = None;
    let mut most_unpublished = 0;
    // At least 20 s, and on until /readyz says so (at most 34 s, inside the session
    // timeout): the held worker wakes 22 s after it was held, which can be 19 s into the
    // outage, and only then commits the batches that fill the outbox.
    while stopped.elapsed() < Duration::from_secs(20)
        || (readyz.is_none() && stopped.elapsed() < Duration::from_secs(34))
    {
        if let Some((503, _, body)) = http_get(port, "/readyz") {
            if body.contains("changelog outbox holds") {
                readyz = Some(body);
            }
        }
        most_unpublished = most_unpublished.max(outbox_totals(&env).0);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (unpublished, taken, published) = outbox_totals(&env);
    assert!(
        r.log_text().contains("fail point sleep_before_sysdb_commit: awake"),
        "the worker woke while Kafka was away"
    );
    assert_eq!(published, published_at_stop, "nothing is published while the broker is away");
    assert!(
        taken > taken_at_stop,
        "the outbox grows while the broker is away: {taken_at_stop} changes taken at the stop, {taken} after {:?}",
        stopped.elapsed()
    );
    let why = readyz.unwrap_or_else(|| {
        panic!(
            "/readyz never said the outbox was full: {:?}; changes (unpublished, taken, published): {:?}",
            http_get(port, "/readyz"),
            outbox_totals(&env)
        )
    });
    assert!(why.contains("paused: its changelog outbox holds"), "{why}");
    println!(
        "Kafka away {:?}: outbox {} -> {} changes taken, {unpublished} unpublished (at most {most_unpublished}); /readyz: {why}",
        stopped.elapsed(),
        taken_at_stop,
        taken
    );

    kafka.restart();
    env.wait_caught_up(WAIT);
    let msgs = wait_feed_equals_records(&env);
    let deadline = Instant::now() + WAIT;
    while outbox_totals(&env).0 > 0 {
        assert!(Instant::now() < deadline, "the outbox never emptied: {:?}", outbox_totals(&env));
        std::thread::sleep(Duration::from_millis(500));
    }
    let seen = audit(&msgs, &[]);
    assert_eq!(seen, applied_offsets(&env), "every record that changed a record is in the feed once");
    assert!(r.log_text().contains("changelog outbox full"), "the pause is in the log");
    r.terminate(Duration::from_secs(30));
    println!("Kafka away 20 s: {} changes published once each after the broker came back", msgs.len());
}

// The snapshot (`docs/changes.md` section 2): records written while the feed was off get
// a message each when a replica with the feed on starts (its partitions had no feed
// before), walked in chunks while live changes go on; the folded topic then equals the
// records. `sluice changes snapshot --partition P` publishes P's records once more.
both_backends!(a_snapshot_publishes_records_that_predate_the_feed, snapshot_on_enable);
fn snapshot_on_enable(env: Env) {
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    env.produce(&jsonl_lines(&workload(12_000, 71, &env.prefix, 6, 2_000)));
    let mut off = env.spawn_replica("feed-off", &[]);
    env.wait_caught_up(WAIT);
    off.terminate(Duration::from_secs(30));
    let before: usize = collections(&env).iter().map(|c| records(&env, c).len()).sum();

    let on = env.with_sections("[changelog]\nenabled = true\nmax_records_per_transaction = 50\n");
    on.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let mut r = on.spawn_replica("feed-on", &[]);
    r.wait_for_log("changelog snapshot started", WAIT);
    // Live changes while the snapshot walks.
    for seed in 0..10 {
        on.produce(&jsonl_lines(&workload(300, 80 + seed, &on.prefix, 6, 2_000)));
        std::thread::sleep(Duration::from_millis(100));
    }
    let deadline = Instant::now() + WAIT;
    loop {
        let rows = on.offsets();
        if rows.iter().all(|p| p["changelog_snapshot_pending"] == false) {
            break;
        }
        assert!(Instant::now() < deadline, "the snapshot never finished: {rows:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    on.wait_caught_up(WAIT);
    let msgs = wait_feed_equals_records(&on);
    let snapshot = |m: &&ConsumedMsg| m.headers["sluice.operation"] == "snapshot";
    let snapshotted = msgs.iter().filter(snapshot).count();
    assert!(snapshotted >= before / 2, "{snapshotted} snapshot messages for {before} records that predate the feed");
    for m in msgs.iter().filter(snapshot) {
        let (_, record) = decode_change(&m.payload).expect("a snapshot message has the record");
        assert_eq!(m.headers["sluice.source.offset"], record.offset.to_string(), "a snapshot's offset is the record's");
    }
    let live = audit(&msgs, &[]);
    let finished = r.log_text().matches("changelog snapshot finished").count();
    assert!(finished >= 1, "the snapshot's end is in the log");
    // Asked again, for one partition: its records once more, after everything else.
    let busiest = on.offsets().into_iter().max_by_key(|p| p["changelog_snapshot_records"].as_i64()).expect("a row");
    let p = busiest["partition"].as_i64().expect("partition") as i32;
    let in_partition: usize = collections(&on)
        .iter()
        .filter(|c| sluice::record::partitioner::partition_for(c.as_bytes(), PARTITIONS as u32) as i32 == p)
        .map(|c| records(&on, c).len())
        .sum();
    let first_count = msgs.iter().filter(|m| m.partition == p).filter(snapshot).count();
    let out = on.run(&["changes", "snapshot", "--partition", &p.to_string(), "--format", "json"]);
    let answer: Value = serde_json::from_str(&out).expect("changes snapshot JSON");
    assert_eq!(answer["requested"], true, "{out}");
    assert_eq!(answer["partitions"], serde_json::json!([p]), "{out}");
    let deadline = Instant::now() + WAIT;
    let again = loop {
        let msgs = wait_feed_equals_records(&on);
        let n = msgs.iter().filter(|m| m.partition == p).filter(snapshot).count();
        let pending = on.offsets().iter().any(|row| row["partition"] == p && row["changelog_snapshot_pending"] == true);
        if !pending && n >= first_count + in_partition {
            break msgs;
        }
        assert!(
            Instant::now() < deadline,
            "the second snapshot of partition {p} never finished ({n} snapshot messages)"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let second_count = again.iter().filter(|m| m.partition == p).filter(snapshot).count() - first_count;
    assert_eq!(second_count, in_partition, "the second snapshot of partition {p}: each of its records once");
    // Every message of the second snapshot comes after the partition's earlier messages.
    let first_seq_again = again
        .iter()
        .filter(|m| m.partition == p)
        .filter(snapshot)
        .skip(first_count)
        .map(|m| m.headers["sluice.changelog.seq"].parse::<i64>().expect("seq"))
        .min()
        .expect("a second snapshot");
    assert!(msgs
        .iter()
        .filter(|m| m.partition == p)
        .all(|m| m.headers["sluice.changelog.seq"].parse::<i64>().expect("seq") < first_seq_again));
    // How much the live changes interleaved with the first snapshot (timing: reported).
    let interleaved = msgs
        .iter()
        .filter(|m| m.headers["sluice.operation"] != "snapshot")
        .filter(|m| {
            let seq = |x: &ConsumedMsg| x.headers["sluice.changelog.seq"].parse::<i64>().expect("seq");
            msgs.iter().filter(|x| x.partition == m.partition).filter(snapshot).any(|x| seq(x) > seq(m))
        })
        .count();
    audit(&again, &[]);
    r.terminate(Duration::from_secs(30));
    println!(
        "snapshot: {before} records predated the feed, {snapshotted} snapshot messages, {} live changes ({interleaved} published before the snapshot ended); partition {p} again: {second_count}",
        live.len()
    );
}

// With a schema registry: change values carry the Confluent framing with the id the
// registry gave `schemas/change_record.avsc` under `<changes topic>-value`, and both
// folds (this test's and the Python example's with `--confluent`) read them.
#[test]
fn changes_through_a_schema_registry() {
    if !sluice_integration_tests::require_kafka() || !sluice_integration_tests::require_schema_registry() {
        return;
    }
    let url = sluice_integration_tests::schema_registry_url();
    let env = Env::sqlite("changes-registry")
        .with_kafka("framing = \"confluent\"\n")
        .with_sections(&format!("[schema_registry]\nurl = \"{url}\"\n[changelog]\nenabled = true\n"));
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    env.produce(&jsonl_lines(&workload(600, 61, &env.prefix, 4, 40)));
    let mut r = env.spawn_replica("r", &[]);
    env.wait_caught_up(WAIT);
    let topic = format!("{}.changes", env.prefix);
    let (port, path) = sluice_integration_tests::registry_port_and_path(&url);
    let latest = http_get(port, &format!("{path}/subjects/{topic}-value/versions/latest"))
        .unwrap_or_else(|| panic!("the registry does not answer for {topic}-value"));
    assert_eq!(latest.0, 200, "the change record schema is registered under {topic}-value: {latest:?}");
    let id = serde_json::from_str::<Value>(&latest.2).expect("registry JSON")["id"].as_u64().expect("schema id");
    let deadline = Instant::now() + WAIT;
    let msgs = loop {
        let msgs = consume_all(&topic, PARTITIONS, Duration::from_secs(120));
        let framed: Vec<ConsumedMsg> = msgs
            .iter()
            .map(|m| {
                let mut m = m.clone();
                if !m.payload.is_empty() {
                    assert_eq!(m.payload[0], 0, "the Confluent magic byte");
                    assert_eq!(
                        u64::from(u32::from_be_bytes(m.payload[1..5].try_into().unwrap())),
                        id,
                        "the registry's id"
                    );
                    m.payload.drain(..5);
                }
                m
            })
            .collect();
        let mut want: BTreeMap<String, BTreeMap<String, Value>> = BTreeMap::new();
        for c in collections(&env) {
            let recs = records(&env, &c);
            if !recs.is_empty() {
                want.insert(c, recs);
            }
        }
        if fold(&framed) == want {
            break framed;
        }
        assert!(Instant::now() < deadline, "the folded feed never equalled the records");
        std::thread::sleep(Duration::from_secs(1));
    };
    let out = std::process::Command::new(venv_python())
        .arg(repo_root().join("docs/examples/fold_changes.py"))
        .args([brokers().as_str(), &topic, "--confluent"])
        .output()
        .expect("run docs/examples/fold_changes.py");
    assert!(out.status.success(), "fold_changes.py --confluent: {}", String::from_utf8_lossy(&out.stderr));
    let python: Value = serde_json::from_slice(&out.stdout).expect("fold_changes.py prints JSON");
    assert_eq!(comparable(python), comparable(serde_json::to_value(fold(&msgs)).unwrap()));
    r.terminate(Duration::from_secs(30));
}
