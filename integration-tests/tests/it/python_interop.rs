//! Log records written by another language's Avro stack decode to exactly what was
//! written (`schemas/log_record.avsc` is the contract for producers in any language,
//! docs/design.md section 1).
//!
//! `python/produce_log_records.py` writes ~500 randomized records with fastavro
//! (`schemaless_writer`, plain datums) through confluent-kafka (key = collection id,
//! `partitioner=murmur2_random`), plus one Confluent-framed copy per operation, and
//! describes every message in a JSON file. Each consumed message must
//! - sit on `partition_for(collection_id, partitions)` at the offset Python was told;
//! - decode with Sluice's hand-written codec (after `unframe` with the message's framing)
//!   to the described record: embeddings bit-exact, metadata values typed as Python typed
//!   them (int -> Long, float -> Double, bool -> Bool, None -> Null, str -> String,
//!   doubles bit-exact, -0.0 included);
//! - decode identically with the generic apache-avro path (`decode_generic`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::kafka::cluster::ensure_topic;
use sluice::kafka::ClientSettings;
use sluice::record::avro::decode_generic;
use sluice::record::codec::decode;
use sluice::record::framing::{unframe, Framing};
use sluice::record::partitioner::partition_for;
use sluice::record::{BackfillRef, Encoding, LogRecord, MetaValue, Metadata, Operation};
use sluice_integration_tests::venv_python;
use sluice_integration_tests::{brokers, repo_root, require_kafka, suffix, TopicGuard};

const PARTITIONS: i32 = 5;
const COUNT: usize = 500;
const SEED: u64 = 7;

/// Reads every partition of `topic` from the beginning up to its current high watermark;
/// returns `(partition, offset) -> (key, value)`.
fn consume_all(topic: &str, partitions: i32, timeout: Duration) -> BTreeMap<(i32, i64), (Vec<u8>, Vec<u8>)> {
    sluice_integration_tests::consume_all(topic, partitions, timeout)
        .into_iter()
        .map(|m| ((m.partition, m.offset), (m.key.expect("keyed record"), m.payload)))
        .collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

fn opt_str(v: &Value, field: &str) -> Option<String> {
    match &v[field] {
        Value::Null => None,
        Value::String(s) => Some(s.clone()),
        other => panic!("{field}: expected string or null, got {other}"),
    }
}

/// A Python-typed JSON value as the metadata value fastavro wrote: JSON keeps Python's
/// int/float distinction (`1` vs `1.0`).
fn meta_value(v: &Value) -> MetaValue {
    match v {
        Value::Null => MetaValue::Null,
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::String(s) => MetaValue::String(s.clone()),
        Value::Number(n) if n.is_i64() => MetaValue::Long(n.as_i64().expect("i64")),
        Value::Number(n) if n.is_f64() => MetaValue::Double(n.as_f64().expect("f64")),
        other => panic!("metadata value {other} is neither i64 nor f64"),
    }
}

/// The record the JSON description says Python wrote.
fn expected_record(r: &Value) -> LogRecord {
    let symbol = r["operation"].as_str().expect("operation");
    let operation =
        Operation::ALL.into_iter().find(|o| o.symbol() == symbol).unwrap_or_else(|| panic!("operation {symbol}"));
    assert_eq!(r["encoding"], "FLOAT32");
    LogRecord {
        collection_id: r["collection_id"].as_str().expect("collection_id").to_string(),
        id: r["id"].as_str().expect("id").to_string(),
        operation,
        embedding: r["embedding"]
            .as_array()
            .map(|values| values.iter().map(|x| x.as_f64().expect("f32 value") as f32).collect()),
        encoding: Encoding::Float32,
        metadata: r["metadata"]
            .as_object()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), meta_value(v))).collect::<Metadata>()),
        document: opt_str(r, "document"),
        backfill: r["backfill"].as_object().map(|b| BackfillRef {
            request_id: b["request_id"].as_str().expect("request_id").to_string(),
            function_id: b["function_id"].as_str().expect("function_id").to_string(),
        }),
    }
}

/// A comparable form with floats as bit patterns (`==` on floats would equate 0.0 and
/// -0.0; the contract is bit-exact).
#[derive(Debug, PartialEq)]
enum Bits {
    Null,
    String(String),
    Long(i64),
    Double(u64),
    Bool(bool),
}

fn metadata_bits(m: &Option<Metadata>) -> Option<BTreeMap<String, Bits>> {
    m.as_ref().map(|m| {
        m.iter()
            .map(|(k, v)| {
                let b = match v {
                    MetaValue::Null => Bits::Null,
                    MetaValue::String(s) => Bits::String(s.clone()),
                    MetaValue::Long(i) => Bits::Long(*i),
                    MetaValue::Double(d) => Bits::Double(d.to_bits()),
                    MetaValue::Bool(b) => Bits::Bool(*b),
                };
                (k.clone(), b)
            })
            .collect()
    })
}

fn assert_same(actual: &LogRecord, expected: &LogRecord, what: &str) {
    let emb_bits = |r: &LogRecord| r.embedding.as_ref().map(|e| e.iter().map(|x| x.to_bits()).collect::<Vec<u32>>());
    assert_eq!(emb_bits(actual), emb_bits(expected), "{what}: embedding bits");
    assert_eq!(
        metadata_bits(&actual.metadata),
        metadata_bits(&expected.metadata),
        "{what}: metadata (typed, bit-exact)"
    );
    assert_eq!(actual, expected, "{what}: whole record");
}

#[tokio::test(flavor = "multi_thread")]
async fn python_fastavro_records_decode_exactly_and_land_on_partition_for() {
    if !require_kafka() {
        return;
    }
    let started = Instant::now();
    let settings = ClientSettings::new(brokers());
    let topic = format!("it-python-interop-{}", suffix());
    let _guard = TopicGuard(vec![topic.clone()]);
    ensure_topic(&settings, &topic, PARTITIONS, 1, &[]).await.expect("create topic");

    let dir = std::env::temp_dir().join(format!("sluice-it-python-interop-{}", suffix()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let expected_path = dir.join("expected.json");
    let python = venv_python();
    let out = Command::new(&python)
        .arg(repo_root().join("integration-tests/python/produce_log_records.py"))
        .args(["--brokers", &brokers(), "--topic", &topic])
        .arg("--schema")
        .arg(repo_root().join("schemas/log_record.avsc"))
        .arg("--out")
        .arg(&expected_path)
        .args(["--count", &COUNT.to_string(), "--seed", &SEED.to_string()])
        .output()
        .expect("spawn produce_log_records.py");
    assert!(
        out.status.success(),
        "produce_log_records.py failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let described: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&expected_path).expect("read expected.json"))
            .expect("expected json");
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(described.len(), COUNT + Operation::ALL.len(), "{COUNT} plain records + one framed copy per operation");

    let consumed = tokio::task::block_in_place(|| consume_all(&topic, PARTITIONS, Duration::from_secs(20)));
    assert_eq!(consumed.len(), described.len(), "the topic holds exactly the described messages");

    let mut framed = 0;
    let mut ops = BTreeSet::new();
    let mut value_kinds = std::collections::HashSet::new();
    let mut partitions_used = BTreeSet::new();
    let mut embedding_dims = BTreeSet::new();
    let mut negative_zero_double = false;
    let mut seen = HashMap::new();
    for (i, d) in described.iter().enumerate() {
        let position = (d["partition"].as_i64().expect("partition") as i32, d["offset"].as_i64().expect("offset"));
        let what = format!("message {i} at {}/{}", position.0, position.1);
        assert!(seen.insert(position, i).is_none(), "{what}: two descriptions for one position");
        let (key, value) = consumed.get(&position).unwrap_or_else(|| panic!("{what}: not in the topic"));
        let expected = expected_record(&d["record"]);

        assert_eq!(key, &unhex(d["key_hex"].as_str().expect("key_hex")), "{what}: key");
        assert_eq!(key.as_slice(), expected.collection_id.as_bytes(), "{what}: key is the collection id");
        assert_eq!(
            position.0 as u32,
            partition_for(key, PARTITIONS as u32),
            "{what}: collection {:?} is on the partition_for partition",
            expected.collection_id
        );

        let framing = match d["framing"].as_str() {
            Some("plain") => Framing::Plain,
            Some("confluent") => Framing::Confluent,
            other => panic!("{what}: framing {other:?}"),
        };
        let (schema_id, datum) = unframe(framing, value).unwrap_or_else(|e| panic!("{what}: unframe: {e}"));
        assert_eq!(schema_id.map(u64::from), d["schema_id"].as_u64(), "{what}: schema id");
        let decoded = decode(datum).unwrap_or_else(|e| panic!("{what}: decode: {e}"));
        assert_same(&decoded, &expected, &what);
        let generic = decode_generic(datum).unwrap_or_else(|e| panic!("{what}: decode_generic: {e}"));
        assert_same(&generic, &expected, &format!("{what} (apache-avro)"));

        framed += usize::from(framing == Framing::Confluent);
        ops.insert(decoded.operation);
        partitions_used.insert(position.0);
        embedding_dims.insert(decoded.embedding.as_ref().map(sluice::record::Embedding::len));
        for v in decoded.metadata.iter().flat_map(|m| m.values()) {
            value_kinds.insert(std::mem::discriminant(v));
            negative_zero_double |= matches!(v, MetaValue::Double(x) if x.to_bits() == (-0.0f64).to_bits());
        }
    }

    // The randomized input covers what this test claims to check.
    assert_eq!(framed, Operation::ALL.len(), "one Confluent-framed message per operation");
    assert_eq!(ops.len(), Operation::ALL.len(), "all five operations: {ops:?}");
    assert_eq!(value_kinds.len(), 5, "metadata values of all five types");
    assert!(negative_zero_double, "a -0.0 metadata double survives bit-exact");
    assert!(
        embedding_dims.contains(&None) && embedding_dims.len() > 10,
        "null and many embedding dims: {embedding_dims:?}"
    );
    assert!(partitions_used.len() > 1, "collections spread over partitions: {partitions_used:?}");
    eprintln!("python interop: {} messages checked in {:?}", described.len(), started.elapsed());
}
