//! Hostile input against the real broker: a corpus of nasty records (huge ids, 10,000
//! metadata keys, a 100 KB metadata value, NaN and infinite embeddings, a 100,000-dim
//! embedding, a 10 MB document, invalid UTF-8, a truncated datum, garbage, an empty
//! value) interleaved with good records, produced raw (keyed by collection id) to a
//! `sluice init`-ed topic. One `sluice process` replica must materialize exactly the good
//! records (the reference model of them), send every nasty one to the DLQ with the exact
//! `sluice.error.kind` expected, never exit, and keep its peak RSS (VmHWM) under
//! [`RSS_BOUND_MB`].
//!
//! Large messages: the broker's default `message.max.bytes` is ~1 MB, so the test raises
//! `max.message.bytes` to 16 MiB on the log and DLQ topics (Kafka's own configs tool) for
//! its own producer. The replica keeps librdkafka's default producer limit (1,000,000
//! bytes), so the DLQ copy of the 10 MB record is refused locally: the replica must send the
//! DLQ entry without its payload (header `sluice.payload.omitted=too_large`) instead of
//! retrying forever and stalling the partition. The consumer side needs nothing: librdkafka fetches a message larger than
//! `fetch.max.bytes`/`max.partition.fetch.bytes` anyway (KIP-74), up to
//! `receive.message.max.bytes` (default 100 MB), and `queued.max.messages.kbytes` (2 MiB
//! per partition in Sluice) is a soft prefetch bound.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use sluice::record::codec::{decode, encode};
use sluice::record::{LogRecord, MetaValue, Metadata, Operation};
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{assert_records_match_model, brokers, repo_root, require_kafka, Env};

/// Peak resident set size allowed for the replica, in MB.
const RSS_BOUND_MB: u64 = 400;
const LARGE: &str = "16777216";
const WAIT: Duration = Duration::from_secs(60);

fn kafka_tool(args: &[&str]) -> String {
    let out = Command::new(repo_root().join("deploy/local/kafka-tool.sh")).args(args).output().expect("kafka-tool.sh");
    assert!(out.status.success(), "kafka-tool.sh {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn allow_large_messages(topic: &str) {
    kafka_tool(&[
        "configs",
        "--bootstrap-server",
        &brokers(),
        "--entity-type",
        "topics",
        "--entity-name",
        topic,
        "--alter",
        "--add-config",
        &format!("max.message.bytes={LARGE}"),
    ]);
}

/// A consumed DLQ message: payload and headers.
type Consumed = (Vec<u8>, BTreeMap<String, String>);

/// Every message of `topic` up to its high watermarks.
fn read_all(topic: &str, partitions: i32) -> Vec<Consumed> {
    sluice_integration_tests::consume_all(topic, partitions, Duration::from_secs(60))
        .into_iter()
        .map(|m| (m.payload, m.headers))
        .collect()
}

/// Peak resident set size of a process, in kB (`VmHWM` of `/proc/<pid>/status`).
fn peak_rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("/proc status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// The nasty corpus for collection `c`: (name, payload, exact DLQ kind expected).
fn nasty(c: &str) -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let data = |id: &str| LogRecord::data(c, id, Operation::Upsert);
    let mut out = Vec::new();

    out.push(("id over 1 KiB", encode(&data(&"i".repeat(1500))), "id_too_long"));
    out.push(("empty id", encode(&LogRecord::data(c, "", Operation::Add)), "empty_id"));

    let mut r = data("many-keys");
    r.metadata = Some((0..10_000).map(|i| (format!("key-{i}"), MetaValue::Long(i))).collect());
    out.push(("10,000 metadata keys", encode(&r), "too_many_metadata_keys"));

    let mut r = data("big-value");
    r.metadata = Some(Metadata::from_iter([("v".to_string(), MetaValue::String("x".repeat(100 * 1024)))]));
    out.push(("100 KB metadata value", encode(&r), "metadata_value_too_large"));

    let mut r = data("nan-metadata");
    r.metadata = Some(Metadata::from_iter([("d".to_string(), MetaValue::Double(f64::NAN))]));
    out.push(("NaN metadata double", encode(&r), "non_finite_metadata_double"));

    for (name, bad) in
        [("NaN embedding", f32::NAN), ("+inf embedding", f32::INFINITY), ("-inf embedding", f32::NEG_INFINITY)]
    {
        let mut r = data(name);
        r.embedding = Some(vec![0.5, bad, 0.25, 1.0].into());
        out.push((name, encode(&r), "non_finite_embedding"));
    }

    let mut r = data("huge-embedding");
    r.embedding = Some(vec![0.5; 100_000].into());
    out.push(("100,000-dim embedding", encode(&r), "embedding_too_large"));

    let mut r = data("huge-document");
    r.document = Some("d".repeat(10 * 1024 * 1024));
    out.push(("10 MB document", encode(&r), "document_too_large"));

    // Invalid UTF-8 in the document: hand-built by overwriting the string's bytes.
    let mut r = data("bad-utf8");
    r.document = Some("abcd".into());
    let mut bytes = encode(&r);
    let at = bytes.windows(4).rposition(|w| w == b"abcd").expect("document bytes");
    bytes[at + 1] = 0xff;
    bytes[at + 2] = 0xfe;
    out.push(("invalid UTF-8 document", bytes, "invalid_utf8"));

    // Invalid UTF-8 in the record id (the collection id stays valid).
    let mut bytes = encode(&data("idXY"));
    let at = bytes.windows(4).position(|w| w == b"idXY").expect("id bytes");
    bytes[at + 2] = 0xc3; // a lead byte followed by ASCII: invalid
    out.push(("invalid UTF-8 id", bytes, "invalid_utf8"));

    // Truncated: the last byte (the backfill union branch) is missing.
    let mut r = data("truncated");
    r.document = Some("hello world".into());
    let bytes = encode(&r);
    out.push(("truncated datum", bytes[..bytes.len() - 1].to_vec(), "truncated"));

    // Truncated inside the document: its declared length exceeds what remains.
    out.push(("cut inside a string", bytes[..bytes.len() - 5].to_vec(), "length_overflow"));

    // Garbage: an overlong varint where the collection id's length should be.
    out.push(("0xff garbage", vec![0xff; 64], "varint_overflow"));
    // Garbage: a datum followed by junk.
    let mut bytes = encode(&data("trailing"));
    bytes.extend_from_slice(b"junk");
    out.push(("trailing junk", bytes, "trailing_bytes"));
    // Garbage: a declared length far beyond the input (must not allocate it).
    let mut bytes = vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f];
    bytes.extend_from_slice(&[b'z'; 32]);
    out.push(("length 2^62", bytes, "length_overflow"));
    // Garbage: negative length.
    out.push(("negative length", vec![0x01, b'a', b'b'], "negative_length"));
    // Random bytes (fixed xorshift seed): the first varint happens to be negative.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let random: Vec<u8> = (0..4096)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    assert_eq!(decode(&random).map_err(|e| e.kind()).err(), Some("negative_length"));
    out.push(("4 KiB random bytes", random, "negative_length"));
    out.push(("empty value", Vec::new(), "empty_payload"));
    out
}

#[test]
fn sqlite_hostile_records_go_to_the_dlq_with_exact_kinds_and_memory_stays_bounded() {
    if !require_kafka() {
        return;
    }
    let started = Instant::now();
    let partitions = 2;
    // The replica keeps librdkafka's default producer limit (1,000,000 bytes): the DLQ copy
    // of the 10 MB record cannot be produced whole, and must not stall the partition.
    let env = Env::sqlite("hostile");
    env.run(&["init", "--partitions", &partitions.to_string()]);
    allow_large_messages(&env.log_topic());
    allow_large_messages(&env.dlq_topic());

    let good: Vec<LogRecord> = generate(&WorkloadSpec {
        records: 300,
        collections: 3,
        dim: 4,
        ids_per_collection: 25,
        mix: [50, 20, 15, 15],
        seed: 11,
        collection_prefix: format!("{}-c", env.prefix),
    })
    .collect();
    let c0 = good[0].collection_id.clone();
    let corpus = nasty(&c0);
    let expected: BTreeMap<Vec<u8>, (&str, &str)> = corpus.iter().map(|(n, p, k)| (p.clone(), (*n, *k))).collect();
    assert_eq!(expected.len(), corpus.len(), "every nasty payload is distinct");

    let prod: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("enable.idempotence", "true")
        .set("partitioner", "murmur2_random")
        .set("message.max.bytes", LARGE)
        .create()
        .expect("producer");
    let topic = env.log_topic();
    let send = |key: &str, payload: &[u8]| {
        prod.send(BaseRecord::to(&topic).key(key).payload(payload)).map_err(|(e, _)| e).expect("enqueue");
    };
    // Interleave: a nasty record after every few good ones, all keyed by collection id.
    let every = good.len() / (corpus.len() + 1);
    let mut nasty_iter = corpus.iter();
    for (i, r) in good.iter().enumerate() {
        send(&r.collection_id, &encode(r));
        if (i + 1) % every == 0 {
            if let Some((_, payload, _)) = nasty_iter.next() {
                send(&c0, payload);
            }
        }
    }
    for (_, payload, _) in nasty_iter {
        send(&c0, payload);
    }
    prod.flush(Duration::from_secs(30)).expect("flush");

    let mut replica = env.spawn_replica("r1", &[]);
    let pid = replica.child.id();
    env.wait_caught_up(WAIT);
    assert!(matches!(replica.child.try_wait(), Ok(None)), "the replica exited:\n{}", replica.log_text());
    let peak_kb = peak_rss_kb(pid);
    eprintln!("replica peak RSS (VmHWM): {} MB", peak_kb / 1024);

    // Every good record is materialized as the reference model says (at its Kafka offset).
    assert_records_match_model(&env, &good);

    // Every nasty record is in the DLQ, exactly once, with the expected kind, and names
    // the partition and offset where it really is in the log.
    let log: BTreeMap<(i32, i64), Vec<u8>> =
        sluice_integration_tests::consume_all(&topic, partitions, Duration::from_secs(60))
            .into_iter()
            .map(|m| ((m.partition, m.offset), m.payload))
            .collect();
    let dlq = read_all(&env.dlq_topic(), partitions);
    let mut seen: BTreeMap<&str, &str> = BTreeMap::new();
    let oversized: BTreeMap<&str, &str> =
        corpus.iter().filter(|(_, p, _)| p.len() > 1_000_000).map(|(n, _, k)| (*k, *n)).collect();
    for (payload, h) in &dlq {
        let partition: i32 = h
            .get("sluice.source.partition")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("source partition: {h:?}"));
        let offset: i64 = h
            .get("sluice.source.offset")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("source offset: {h:?}"));
        let source =
            log.get(&(partition, offset)).unwrap_or_else(|| panic!("{partition}/{offset} is not in the log: {h:?}"));
        if h.get("sluice.payload.omitted").map(String::as_str) == Some("too_large") {
            assert!(payload.is_empty(), "an omitted payload is empty");
            let kind = h.get("sluice.error.kind").map(String::as_str).unwrap_or_default();
            let name =
                oversized.get(kind).unwrap_or_else(|| panic!("payload omitted for an unexpected kind {kind}: {h:?}"));
            assert_eq!(
                expected.get(source).map(|(n, _)| n),
                Some(name),
                "the omitted DLQ payload's source {partition}/{offset} is the {name} record"
            );
            assert!(seen.insert(name, kind).is_none(), "{name} is in the DLQ twice");
            continue;
        }
        assert!(
            payload == source,
            "the DLQ payload ({} bytes) is not the message at its source {partition}/{offset} ({} bytes): {h:?}",
            payload.len(),
            source.len()
        );
        let Some((name, kind)) = expected.get(payload) else {
            panic!("unexpected DLQ record ({} bytes, headers {h:?})", payload.len());
        };
        assert_eq!(
            h.get("sluice.error.kind").map(String::as_str),
            Some(*kind),
            "{name}: {:?}",
            h.get("sluice.error.message")
        );
        assert!(h.get("sluice.error.message").is_some_and(|m| !m.is_empty()), "{name}: {h:?}");
        assert_eq!(h.get("sluice.source.topic"), Some(&topic), "{name}");
        assert!(seen.insert(name, kind).is_none(), "{name} is in the DLQ twice");
    }
    let missing: Vec<&str> = corpus.iter().map(|(n, _, _)| *n).filter(|n| !seen.contains_key(n)).collect();
    assert!(missing.is_empty(), "not in the DLQ: {missing:?}");
    eprintln!("DLQ kinds: {seen:#?}");

    assert!(matches!(replica.child.try_wait(), Ok(None)), "the replica exited:\n{}", replica.log_text());
    assert!(peak_kb / 1024 < RSS_BOUND_MB, "peak RSS {} MB over the {RSS_BOUND_MB} MB bound", peak_kb / 1024);
    assert_eq!(replica.terminate(Duration::from_secs(30)), Some(0), "graceful stop exits 0");
    eprintln!("hostile input: {} good + {} nasty records in {:?}", good.len(), corpus.len(), started.elapsed());
}
