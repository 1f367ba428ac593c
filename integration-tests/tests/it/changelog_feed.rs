//! The change feed (`docs/changes.md`) against the real broker, on SQLite and PostgreSQL:
//! two replicas, replicas killed at fail points between the sysdb commit of a batch and
//! the relay's Kafka commit of its changes (and between that commit and the sysdb's copy
//! of the progress), a function attached midway. A read_committed reader then folds the
//! changes topic into a copy of the state, which must equal `sluice records` for every
//! collection (the function's output included); every changelog sequence number of a
//! partition appears once, without a hole (also after a replica frozen inside a relay
//! transaction past the session timeout is fenced); every applied source offset of a data
//! collection appears once; and each record's changes come in source-offset order. The
//! Python consumer of `docs/examples/fold_changes.py` folds the topic to the same state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::record_to_json;
use sluice::record::change::{decode_change, split_change_key};
use sluice_integration_tests::both_backends;
use sluice_integration_tests::faults::{attach, expect_abort_at, wait_status, workload};
use sluice_integration_tests::{
    brokers, consume_all, free_port, http_get, jsonl_lines, repo_root, venv_python, ConsumedMsg, Env, Replica,
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

/// Wait until the folded topic equals the records of every collection; returns the
/// messages read last.
fn wait_feed_equals_records(env: &Env) -> Vec<ConsumedMsg> {
    let deadline = Instant::now() + WAIT;
    loop {
        let msgs = consume_all(&format!("{}.changes", env.prefix), PARTITIONS, Duration::from_secs(120));
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
    let env = env.with_sections(
        "[changelog]\nenabled = true\ntransaction_timeout_ms = 30000\nmax_records_per_transaction = 50\n",
    );
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let first = workload(1_500, 41, &env.prefix, 6, 60);
    env.produce(&jsonl_lines(&first));

    // Killed after a batch's sysdb commit, before the relay's Kafka commit of its changes.
    let mut a = env.spawn_replica("a1", &[("SLUICE_FAILPOINT", "before_changelog_kafka_commit:3")]);
    let b = env.spawn_replica("b", &[]);
    produce_until_abort(&env, &mut a, "before_changelog_kafka_commit", 100);

    // A function attached midway: its output's changes (backfilled and live) join the feed.
    let collection = first[0].collection_id.clone();
    let output = format!("{}-count", env.prefix);
    let f = attach(&env, &collection, "record_counter", &output);
    let fid = f["function_id"].as_str().expect("function id").to_string();

    // Killed after the relay's Kafka commit, before the sysdb's copy of the progress: the
    // next relay must read the progress back from Kafka and republish nothing.
    let mut a = env.spawn_replica("a2", &[("SLUICE_FAILPOINT", "after_changelog_kafka_commit:2")]);
    produce_until_abort(&env, &mut a, "after_changelog_kafka_commit", 200);
    // And once more before the Kafka commit, now with the function running.
    let mut a = env.spawn_replica("a3", &[("SLUICE_FAILPOINT", "before_changelog_kafka_commit:2")]);
    produce_until_abort(&env, &mut a, "before_changelog_kafka_commit", 300);

    // Frozen inside a relay transaction (changes sent, not committed) past the session
    // timeout: the partition's next owner fences its producer and aborts the open
    // transaction; woken up, its commit is refused and nothing of it is ever visible.
    let mut z = env.spawn_replica(
        "zombie",
        &[("SLUICE_FAILPOINT", "sleep_before_changelog_kafka_commit:2"), ("SLUICE_FAILPOINT_SLEEP_MS", "3000")],
    );
    z.wait_for_log("partition starts", WAIT);
    let deadline = Instant::now() + WAIT;
    let mut seed = 400;
    while !z.log_text().contains("fail point sleep_before_changelog_kafka_commit reached") {
        assert!(Instant::now() < deadline, "the zombie never reached its fail point:\n{}", z.log_text());
        env.produce(&jsonl_lines(&workload(150, seed, &env.prefix, 6, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_millis(200));
    }
    signal(&z, "-STOP");
    for _ in 0..10 {
        env.produce(&jsonl_lines(&workload(100, seed, &env.prefix, 6, 60)));
        seed += 1;
        std::thread::sleep(Duration::from_secs(1));
    }
    signal(&z, "-CONT");
    z.wait_for_log("changelog relay fenced by a newer owner", WAIT);
    z.terminate(Duration::from_secs(30));

    let mut a = env.spawn_replica("a4", &[]);
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
    let mut b = b;
    a.terminate(Duration::from_secs(30));
    b.terminate(Duration::from_secs(30));

    // Exactly once: each partition's sequence numbers once each, from 0, without a hole.
    let mut seqs: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    for m in &msgs {
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
    // Every source offset that changed a record of a data collection: once, and a record's
    // changes in source-offset order.
    let mut seen: BTreeSet<(i32, i64)> = BTreeSet::new();
    let mut last: BTreeMap<(String, String), i64> = BTreeMap::new();
    for m in msgs.iter().filter(|m| m.headers["sluice.collection"] != output) {
        let offset: i64 = m.headers["sluice.source.offset"].parse().expect("offset header");
        assert!(seen.insert((m.partition, offset)), "source offset {}/{offset} published twice", m.partition);
        let (c, id) = split_change_key(m.key.as_deref().expect("key")).expect("key");
        if let Some(prev) = last.insert((c.to_string(), id.to_string()), offset) {
            assert!(prev < offset, "{c}/{id}: change at {offset} after one at {prev}");
        }
    }
    assert!(msgs.iter().any(|m| m.headers["sluice.collection"] == output), "the function's output is in the feed");
    println!("change feed: {} messages over {} partitions, {} data changes", msgs.len(), seqs.len(), seen.len());
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
