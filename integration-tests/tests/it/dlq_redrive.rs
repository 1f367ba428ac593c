//! DLQ redrive against the real broker and the real binary, on SQLite and PostgreSQL:
//!
//! * A replica with a low `max_document_bytes` sends records whose only fault is a large
//!   document to the DLQ (`document_too_large`), and bytes that are not a record at all
//!   too; `sluice dlq list` shows each with its kind and source offset, and filters by
//!   kind, collection, time and count.
//! * A dry-run replay produces nothing. With the limit raised, `dlq replay --execute`
//!   re-produces the chosen entries (same key, same partition, provenance headers) and
//!   the records equal the reference model of the log with the replayed copies applied.
//! * Replaying again (by the CLI and by the admin API) produces nothing more: the log
//!   holds one copy per entry. `GET /api/v1/dlq` lists what `dlq list` does.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use serde_json::Value;
use sluice::record::{LogRecord, Operation};
use sluice_integration_tests::http;
use sluice_integration_tests::{
    assert_records_match_model, both_backends, brokers, consume_all, jsonl_lines, small_workload, ConsumedMsg, Env,
};

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 2;
const KIND: &str = "document_too_large";

fn json(env: &Env, args: &[&str]) -> Value {
    serde_json::from_str(&env.run(args)).unwrap_or_else(|e| panic!("sluice {args:?}: not JSON: {e}"))
}

fn entries(env: &Env, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["dlq", "list", "--format", "json"];
    args.extend_from_slice(extra);
    json(env, &args).as_array().unwrap().clone()
}

/// `POST path` with a JSON body to a replica's API: `(status, JSON body)`.
fn http_post(port: u16, path: &str, body: &str) -> (u16, Value) {
    http(port, "POST", path, Some(body))
}

fn log_messages(env: &Env) -> Vec<ConsumedMsg> {
    consume_all(&env.log_topic(), PARTITIONS, Duration::from_secs(60))
}

fn dlq_redrive(env: Env) {
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let low = env.with_sections("[limits]\nmax_document_bytes = 100\n");

    // Good records with a few large-document upserts among them, then bytes that are not
    // a record, keyed by a collection.
    let good: Vec<LogRecord> = small_workload(160, 21, &env.prefix, 3);
    let collections: BTreeSet<String> = good.iter().map(|r| r.collection_id.clone()).collect();
    let big: Vec<LogRecord> = collections
        .iter()
        .flat_map(|c| {
            (0..2).map(move |i| {
                let mut r = LogRecord::data(c.as_str(), format!("big-{i}").as_str(), Operation::Upsert);
                r.embedding = Some(vec![0.5, -0.25, 1.0, i as f32].into());
                r.document = Some(format!("{i}:{}", "x".repeat(300)));
                r
            })
        })
        .collect();
    let mut produced = good[..80].to_vec();
    produced.extend_from_slice(&big[..3]);
    produced.extend_from_slice(&good[80..]);
    produced.extend_from_slice(&big[3..]);
    env.produce(&jsonl_lines(&produced));
    let c0 = collections.iter().next().unwrap().clone();
    let prod: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    let topic = env.log_topic();
    for garbage in [&b"\xff\xfenot avro"[..], &b"\x02"[..]] {
        prod.send(BaseRecord::to(&topic).key(c0.as_str()).payload(garbage)).map_err(|(e, _)| e).expect("enqueue");
    }
    prod.flush(Duration::from_secs(30)).expect("flush");

    // Where the large records and the garbage are in the log.
    let before = log_messages(&env);
    let big_at: BTreeMap<(i32, i64), LogRecord> = before
        .iter()
        .filter_map(|m| {
            let r = sluice::record::codec::decode(&m.payload).ok()?;
            r.id.starts_with("big-").then_some(((m.partition, m.offset), r))
        })
        .collect();
    assert_eq!(big_at.len(), big.len());
    let garbage_at: BTreeSet<(i32, i64)> = before
        .iter()
        .filter(|m| sluice::record::codec::decode(&m.payload).is_err())
        .map(|m| (m.partition, m.offset))
        .collect();
    assert_eq!(garbage_at.len(), 2);

    let mut r1 = low.spawn_replica("r1", &[]);
    low.wait_caught_up(WAIT);
    assert_eq!(r1.terminate(Duration::from_secs(30)), Some(0), "{}", r1.log_text());

    // `dlq list`: each entry with its kind and source offset.
    let all = entries(&env, &[]);
    assert_eq!(all.len(), big.len() + 2, "{all:#?}");
    let src = |e: &Value| (e["source_partition"].as_i64().unwrap() as i32, e["source_offset"].as_i64().unwrap());
    let listed_big: BTreeSet<(i32, i64)> = all.iter().filter(|e| e["kind"] == KIND).map(src).collect();
    assert_eq!(listed_big, big_at.keys().copied().collect::<BTreeSet<_>>(), "sources of {KIND}");
    let listed_garbage: BTreeSet<(i32, i64)> = all.iter().filter(|e| e["kind"] != KIND).map(src).collect();
    assert_eq!(listed_garbage, garbage_at, "sources of the undecodable entries");
    for e in &all {
        assert!(e["replayed_to"].is_null(), "{e}");
        assert!(e["timestamp_ms"].as_i64().is_some_and(|t| t > 0), "{e}");
        assert!(!e["message"].as_str().unwrap_or_default().is_empty(), "{e}");
        if e["kind"] == KIND {
            assert!(e["message"].as_str().unwrap().contains("document is"), "{e}");
        }
    }
    assert_eq!(entries(&env, &["--kind", KIND]).len(), big.len());
    let of_c0 = entries(&env, &["--collection", &c0]);
    assert_eq!(of_c0.len(), 2 + 2, "two large records and the garbage of {c0}: {of_c0:#?}");
    assert!(of_c0.iter().all(|e| e["collection"] == c0.as_str()));
    assert_eq!(entries(&env, &["--limit", "1"]).len(), 1);
    assert!(entries(&env, &["--since", "2999-01-01T00:00:00Z"]).is_empty());
    assert_eq!(entries(&env, &["--since", "2000-01-01T00:00:00Z"]).len(), all.len());
    let table = env.run(&["dlq", "list", "--kind", KIND]);
    assert!(table.lines().count() == big.len() + 1 && table.contains(KIND), "{table}");

    // A dry run produces nothing.
    let highs = |msgs: &[ConsumedMsg]| msgs.iter().map(|m| (m.partition, m.offset)).max();
    let plan = json(&env, &["dlq", "replay", "--kind", KIND, "--format", "json"]);
    assert_eq!(plan["executed"], false);
    assert_eq!(plan["entries"].as_array().unwrap().len(), big.len(), "{plan:#}");
    assert_eq!(highs(&log_messages(&env)), highs(&before), "a dry run produced into the log");
    assert!(entries(&env, &[]).iter().all(|e| e["replayed_to"].is_null()), "a dry run recorded replays");

    // The limit raised (the default configuration), replayed, processed.
    let done = json(&env, &["dlq", "replay", "--kind", KIND, "--execute", "--format", "json"]);
    assert_eq!(done["executed"], true);
    assert_eq!(done["entries"].as_array().unwrap().len(), big.len(), "{done:#}");
    let port = sluice_integration_tests::free_port();
    let mut r2 = env.spawn_replica("r2", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    env.wait_caught_up(WAIT);
    // The admin API lists the same entries and, asked to replay them again, skips them all.
    let listed = loop {
        match sluice_integration_tests::http_get(port, &format!("/api/v1/dlq?kind={KIND}")) {
            Some((200, _, body)) => break serde_json::from_str::<Value>(&body).unwrap(),
            Some((status, _, body)) => panic!("GET /api/v1/dlq: {status} {body}"),
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    };
    assert_eq!(listed["entries"].as_array().unwrap(), &entries(&env, &["--kind", KIND]));
    let (status, again) = http_post(port, "/api/v1/dlq/replay", &format!(r#"{{"kind":"{KIND}","execute":true}}"#));
    assert_eq!(status, 200, "{again}");
    assert!(again["entries"].as_array().unwrap().is_empty(), "{again:#}");
    assert_eq!(again["already_replayed"].as_array().unwrap().len(), big.len(), "{again:#}");
    assert_eq!(r2.terminate(Duration::from_secs(30)), Some(0), "{}", r2.log_text());
    // The applied records: every good one, then the large ones in their original order.
    let mut applied = good.clone();
    applied.extend(big_at.values().cloned());
    let order: BTreeMap<String, usize> = produced
        .iter()
        .enumerate()
        .filter(|(_, r)| r.id.starts_with("big-"))
        .map(|(i, r)| (format!("{}/{}", r.collection_id, r.id), i))
        .collect();
    applied[good.len()..].sort_by_key(|r| order[&format!("{}/{}", r.collection_id, r.id)]);
    assert_records_match_model(&env, &applied);

    // Provenance: one copy per entry, on the original partition, naming its DLQ entry and
    // its source.
    let check_copies = |env: &Env| {
        let replayed: Vec<ConsumedMsg> =
            log_messages(env).into_iter().filter(|m| m.headers.contains_key("sluice.replayed-from")).collect();
        assert_eq!(replayed.len(), big.len(), "replayed copies in the log");
        let listed = entries(env, &["--kind", KIND]);
        let mut froms = BTreeSet::new();
        for m in &replayed {
            let from = &m.headers["sluice.replayed-from"];
            assert!(froms.insert(from.clone()), "{from} replayed twice");
            let e = listed
                .iter()
                .find(|e| format!("{}/{}", e["dlq_partition"], e["dlq_offset"]) == *from)
                .unwrap_or_else(|| panic!("no DLQ entry {from}"));
            let (sp, so) = src(e);
            assert_eq!(m.partition, sp, "the copy of {from} is on its original partition");
            assert_eq!(m.headers["sluice.replayed.source-partition"], sp.to_string());
            assert_eq!(m.headers["sluice.replayed.source-offset"], so.to_string());
            assert_eq!(m.payload, before.iter().find(|b| (b.partition, b.offset) == (sp, so)).unwrap().payload);
            assert_eq!(e["replayed_to"]["offset"].as_i64(), Some(m.offset), "{e}");
        }
    };
    check_copies(&env);

    // Again: nothing more is produced.
    let again = json(&env, &["dlq", "replay", "--kind", KIND, "--execute", "--format", "json"]);
    assert!(again["entries"].as_array().unwrap().is_empty(), "{again:#}");
    assert_eq!(again["already_replayed"].as_array().unwrap().len(), big.len());
    check_copies(&env);
    // The undecodable entries were not chosen and stay unreplayed.
    assert!(entries(&env, &[]).iter().filter(|e| e["kind"] != KIND).all(|e| e["replayed_to"].is_null()));
}

both_backends!(dlq_redrive_end_to_end, dlq_redrive);
