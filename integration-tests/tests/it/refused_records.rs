//! Records one backend would store and another refuse, end to end against the real broker
//! and the real binary, on SQLite and PostgreSQL: the outcome must not depend on the
//! backend.
//!
//! * A record whose id holds U+0000 (PostgreSQL text cannot) and one with U+0000 in a
//!   metadata value go to the DLQ with kind `nul_character`; nothing of them is stored.
//! * A record with a ~3 KB metadata value in a collection with `statistics` attached: the
//!   output id of that pair would exceed PostgreSQL's B-tree entry limit, so it is counted
//!   under a bounded, hashed output id (`<key>=h:...~<sha256>`) whose record holds the
//!   full key and value.
//! * Everything else of the partition is applied: the records equal the reference model
//!   of the accepted records, the statistics output equals the reference outputs, and the
//!   lag reaches 0.
//!
//! The second part checks that a halt stored in the sysdb shows in `offsets show` (table
//! and JSON) and that `offsets reset` clears it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use serde_json::Value;
use sluice::cli::jsonl::record_to_json;
use sluice::functions::model::reference_outputs;
use sluice::functions::statistics;
use sluice::record::codec::encode;
use sluice::record::{LogRecord, MetaValue, Metadata, Operation, Record};
use sluice::sysdb::Sysdb;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{
    assert_records_match_model, brokers, consume_all, jsonl_lines, require_kafka, require_postgres, Env,
};

const WAIT: Duration = Duration::from_secs(120);
const PARTITIONS: i32 = 2;

fn workload(records: usize, seed: u64, prefix: &str) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records,
        collections: 2,
        dim: 4,
        ids_per_collection: 40,
        mix: [45, 20, 15, 20],
        seed,
        collection_prefix: format!("{prefix}-c"),
    })
    .collect()
}

/// `len` characters an index cannot compress below its entry limit (xorshift over 64
/// symbols).
fn incompressible(len: usize, seed: u64) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            ALPHABET[(x % 64) as usize] as char
        })
        .collect()
}

fn attach(env: &Env, collection: &str, output: &str) -> String {
    let v: Value = serde_json::from_str(
        env.run(&[
            "functions",
            "attach",
            collection,
            "--function",
            "statistics",
            "--output",
            output,
            "--format",
            "json",
        ])
        .trim(),
    )
    .unwrap();
    v["function_id"].as_str().expect("function_id").to_string()
}

fn wait_ready(env: &Env, id: &str) {
    let deadline = Instant::now() + WAIT;
    loop {
        let list: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
        let f = list
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("function {id} not listed"));
        if f["status"] == "ready" {
            return;
        }
        assert!(Instant::now() < deadline, "function {id} never became ready: {f}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The records of a collection as `sluice records` prints them (empty if unknown).
fn records_json(env: &Env, collection: &str) -> Vec<Value> {
    let out = env.cmd().args(["records", collection, "--format", "jsonl"]).output().unwrap();
    if !out.status.success() {
        return Vec::new();
    }
    String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// The statistics output equals the function over the accepted records of `collection`.
fn assert_statistics(env: &Env, accepted: &[LogRecord], collection: &str, output: &str) {
    let indexed: Vec<(i64, LogRecord)> = accepted.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let expected: Vec<Value> = reference_outputs(&indexed, collection, "statistics")
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
    let actual = records_json(env, output);
    assert_eq!(actual.len(), expected.len(), "statistics output {output}: record count");
    assert_eq!(actual, expected, "statistics output {output}");
}

fn offsets_json(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "show", "--format", "json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn refused_records(env: Env) {
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let mut replica = env.spawn_replica("r1", &[]);

    // A first load, then statistics attached to one collection (ready before the rest).
    let first = workload(120, 41, &env.prefix);
    let c = first[0].collection_id.clone();
    let output = format!("{c}-stats");
    env.produce(&jsonl_lines(&first));
    env.wait_caught_up(WAIT);
    let function_id = attach(&env, &c, &output);
    wait_ready(&env, &function_id);

    // The rest, produced raw (the NUL records cannot go through JSON tooling that might
    // refuse them first), keyed by collection id so each lands on its collection's
    // partition, in order.
    let long_value = incompressible(3000, 0x5eed);
    let mut long = LogRecord::data(c.as_str(), "long-value", Operation::Upsert);
    long.metadata = Some(Metadata::from_iter([
        ("blob".to_string(), MetaValue::String(long_value.clone())),
        ("color".to_string(), MetaValue::String("red".into())),
    ]));
    let mut nul_id = LogRecord::data(c.as_str(), "bad\0id", Operation::Upsert);
    nul_id.metadata = Some(Metadata::from_iter([("color".to_string(), MetaValue::String("red".into()))]));
    let mut nul_value = LogRecord::data(c.as_str(), "nul-in-value", Operation::Upsert);
    nul_value.metadata = Some(Metadata::from_iter([("note".to_string(), MetaValue::String("a\0b".into()))]));
    let second = workload(160, 42, &env.prefix);
    let (before, after) = second.split_at(80);

    let mut sent: Vec<LogRecord> = Vec::new();
    sent.extend_from_slice(before);
    sent.push(nul_id.clone());
    sent.push(long.clone());
    sent.push(nul_value.clone());
    sent.extend_from_slice(after);
    let prod: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .create()
        .expect("producer");
    let topic = env.log_topic();
    for r in &sent {
        prod.send(BaseRecord::to(&topic).key(&r.collection_id).payload(&encode(r)))
            .map_err(|(e, _)| e)
            .expect("enqueue");
    }
    prod.flush(Duration::from_secs(30)).expect("flush");

    // The lag reaches 0: the refused records did not stall their partition.
    env.wait_caught_up(WAIT);
    assert!(matches!(replica.child.try_wait(), Ok(None)), "the replica exited:\n{}", replica.log_text());

    // The NUL records are in the DLQ, once each, with their kind and the field named.
    let refused = [(encode(&nul_id), "id"), (encode(&nul_value), "metadata value of `note`")];
    let dlq = consume_all(&env.dlq_topic(), PARTITIONS, Duration::from_secs(60));
    assert_eq!(dlq.len(), refused.len(), "DLQ: {:?}", dlq.iter().map(|m| &m.headers).collect::<Vec<_>>());
    for (payload, field) in &refused {
        let m = dlq
            .iter()
            .find(|m| &m.payload == payload)
            .unwrap_or_else(|| panic!("the record with U+0000 in {field} is not in the DLQ"));
        assert_eq!(m.headers.get("sluice.error.kind").map(String::as_str), Some("nul_character"), "{:?}", m.headers);
        let message = m.headers.get("sluice.error.message").cloned().unwrap_or_default();
        assert!(message.contains(field), "message {message:?} does not name {field}");
    }

    // Everything accepted is applied exactly: records and statistics against the model.
    let accepted: Vec<LogRecord> = first
        .iter()
        .chain(&sent)
        .filter(|r| {
            !r.id.contains('\0')
                && !r
                    .metadata
                    .as_ref()
                    .is_some_and(|m| m.values().any(|v| matches!(v, MetaValue::String(s) if s.contains('\0'))))
        })
        .cloned()
        .collect();
    assert_eq!(accepted.len(), first.len() + sent.len() - 2);
    assert_records_match_model(&env, &accepted);
    assert!(
        records_json(&env, &c).iter().all(|r| r["id"] != "bad\0id" && r["id"] != "nul-in-value"),
        "a refused record was stored"
    );
    assert_statistics(&env, &accepted, &c, &output);

    // The long pair is counted under its bounded, hashed id, with the full value.
    let hashed = statistics::output_id("blob", &MetaValue::String(long_value.clone()));
    assert!(
        hashed.len() <= statistics::MAX_OUTPUT_ID_BYTES && hashed.starts_with("blob=h:s:"),
        "{}...",
        &hashed[..hashed.len().min(80)]
    );
    let outputs = records_json(&env, &output);
    let row = outputs.iter().find(|r| r["id"] == hashed.as_str()).unwrap_or_else(|| panic!("no output {hashed}"));
    assert_eq!(row["metadata"]["key"], "blob");
    assert_eq!(row["metadata"]["value"], long_value.as_str());
    assert_eq!(row["metadata"]["count"], 1);
    let longest = outputs.iter().map(|r| r["id"].as_str().unwrap().len()).max().unwrap();
    assert!(longest <= statistics::MAX_OUTPUT_ID_BYTES, "an output id of {longest} bytes");

    // Every partition runs, and says so.
    let rows = offsets_json(&env);
    assert_eq!(rows.len(), PARTITIONS as usize);
    assert!(rows.iter().all(|r| r["status"] == "running" && r["halted_at_ms"].is_null()), "{rows:#?}");
    assert_eq!(replica.terminate(Duration::from_secs(30)), Some(0), "graceful stop exits 0");

    // A halt stored in the sysdb shows in `offsets show`; `offsets reset` clears it.
    let position = rows[1]["sysdb_next_offset"].as_i64().expect("partition 1 has a position");
    // On a thread of its own: the PostgreSQL variant runs inside a runtime already.
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let sysdb = Sysdb::open(&env.sysdb).await.expect("open sysdb");
                sysdb
                    .set_partition_halted(&topic, 1, Some("record at offset 7 refused by the sysdb"))
                    .await
                    .expect("halt");
            })
        })
        .join()
        .unwrap()
    });
    let rows = offsets_json(&env);
    assert_eq!(rows[0]["status"], "running");
    assert_eq!(rows[1]["status"], "halted: record at offset 7 refused by the sysdb");
    assert!(rows[1]["halted_at_ms"].as_i64().is_some_and(|t| t > 0), "{:#}", rows[1]);
    let table = env.run(&["offsets", "show"]);
    let lines: BTreeMap<i32, &str> =
        table.lines().skip(1).map(|l| (l.split_whitespace().nth(1).unwrap().parse().unwrap(), l)).collect();
    assert!(table.lines().next().unwrap().ends_with("STATUS"), "{table}");
    assert!(lines[&0].ends_with("  running"), "{table}");
    assert!(lines[&1].ends_with("  halted: record at offset 7 refused by the sysdb"), "{table}");
    env.run(&[
        "offsets",
        "reset",
        "--partition",
        "1",
        "--to",
        &position.to_string(),
        "--reason",
        "resume after the halt",
        "--execute",
    ]);
    let rows = offsets_json(&env);
    assert!(rows.iter().all(|r| r["status"] == "running" && r["halted_at_ms"].is_null()), "{rows:#?}");
    assert_eq!(rows[1]["sysdb_next_offset"].as_i64(), Some(position));
}

#[test]
fn sqlite() {
    if !require_kafka() {
        return;
    }
    refused_records(Env::sqlite("refused"));
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres() {
    if !require_kafka() || !require_postgres().await {
        return;
    }
    let env = Env::postgres("refused").await;
    tokio::task::spawn_blocking(move || refused_records(env)).await.unwrap();
}
