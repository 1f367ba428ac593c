//! `partition_for` (the Java client's default partitioner, docs/design.md section 2) agrees
//! with where real clients put keyed records: rdkafka through Sluice's own producer
//! (`partitioner=murmur2_random`) and the Python client (confluent-kafka, same setting),
//! checked from the delivery reports and again by consuming the topic back.
//!
//! Keys: UUID strings, unicode strings (up to 4-byte UTF-8) and random bytes of every
//! length 1..=64 (so every murmur2 tail length 0-3 occurs). A negative control shows the
//! check has teeth: librdkafka's default partitioner (`consistent_random`, CRC32) puts
//! some of the same keys elsewhere.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sluice::kafka::cluster::ensure_topic;
use sluice::kafka::producer::{Outgoing, Producer};
use sluice::kafka::ClientSettings;
use sluice::record::partitioner::partition_for;
use sluice::workload::Rng;
use sluice_integration_tests::venv_python;
use sluice_integration_tests::{brokers, consume_all, repo_root, require_kafka, suffix, TopicGuard};

const PARTITIONS: i32 = 7;

/// 300 keys: 100 UUID strings, 100 unicode strings, 100 random byte strings.
fn keys() -> Vec<Vec<u8>> {
    let mut rng = Rng::new(0x5eed_1ce5);
    let mut keys = Vec::new();
    for _ in 0..100 {
        let bytes = (u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64())).to_le_bytes();
        keys.push(uuid::Builder::from_random_bytes(bytes).into_uuid().to_string().into_bytes());
    }
    // ASCII, Latin-1, Greek, Cyrillic, CJK, Hiragana, astral emoji.
    let ranges: [(u32, u32); 7] = [
        (0x21, 0x7e),
        (0xc0, 0xff),
        (0x391, 0x3c9),
        (0x410, 0x44f),
        (0x4e00, 0x9fff),
        (0x3041, 0x3096),
        (0x1f300, 0x1f64f),
    ];
    for _ in 0..100 {
        let len = 1 + rng.below(24);
        let s: String = (0..len)
            .map(|_| {
                let (lo, hi) = ranges[rng.below(ranges.len())];
                char::from_u32(lo + rng.below((hi - lo + 1) as usize) as u32).expect("valid scalar value")
            })
            .collect();
        keys.push(s.into_bytes());
    }
    for i in 0..100u64 {
        let len = 1 + (i % 64) as usize; // every length 1..=64, every tail length
        keys.push((0..len).map(|_| rng.next_u64() as u8).collect());
    }
    keys
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
}

/// Runs `python/produce_keyed.py` on `keys`; returns `(key, partition, offset)` per delivery.
fn produce_with_python(python: &str, topic: &str, partitioner: &str, keys: &[Vec<u8>]) -> Vec<(Vec<u8>, i32, i64)> {
    let script = repo_root().join("integration-tests/python/produce_keyed.py");
    let mut child = Command::new(python)
        .arg(&script)
        .args(["--brokers", &brokers(), "--topic", topic, "--partitioner", partitioner])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn produce_keyed.py");
    let input: String = keys.iter().map(|k| hex(k) + "\n").collect();
    child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write keys");
    let out = child.wait_with_output().expect("produce_keyed.py");
    assert!(
        out.status.success(),
        "produce_keyed.py failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("utf8 output")
        .lines()
        .map(|line| {
            let cols: Vec<&str> = line.split(' ').collect();
            assert_eq!(cols.len(), 3, "`hex_key partition offset`, got {line:?}");
            (unhex(cols[0]), cols[1].parse().expect("partition"), cols[2].parse().expect("offset"))
        })
        .collect()
}

/// Every delivery is on `partition_for`, the consumed topic holds exactly the deliveries,
/// and the keys spread over all partitions (so agreement is not an accident of one
/// partition).
fn assert_deliveries_and_topic_agree(topic: &str, keys: &[Vec<u8>], delivered: &[(Vec<u8>, i32, i64)]) {
    assert_eq!(delivered.len(), keys.len(), "one delivery report per key");
    let mut sent: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
    let mut reported: Vec<&[u8]> = delivered.iter().map(|d| d.0.as_slice()).collect();
    sent.sort();
    reported.sort();
    assert_eq!(reported, sent, "the delivery reports name exactly the keys sent");
    for (key, partition, _) in delivered {
        assert_eq!(
            *partition as u32,
            partition_for(key, PARTITIONS as u32),
            "key {} (utf8: {:?}) was delivered to partition {partition}",
            hex(key),
            String::from_utf8_lossy(key)
        );
    }
    let consumed: Vec<(i32, i64, Vec<u8>)> = consume_all(topic, PARTITIONS, Duration::from_secs(20))
        .into_iter()
        .map(|m| (m.partition, m.offset, m.key.expect("keyed record")))
        .collect();
    let by_position: HashMap<(i32, i64), &[u8]> = delivered.iter().map(|(k, p, o)| ((*p, *o), k.as_slice())).collect();
    assert_eq!(consumed.len(), keys.len(), "the topic holds exactly the produced records");
    for (p, o, key) in &consumed {
        assert_eq!(*p as u32, partition_for(key, PARTITIONS as u32), "consumed key {} on partition {p}", hex(key));
        assert_eq!(
            by_position.get(&(*p, *o)).copied(),
            Some(key.as_slice()),
            "consumed {p}/{o} is the reported delivery"
        );
    }
    let used: std::collections::BTreeSet<i32> = delivered.iter().map(|d| d.1).collect();
    assert_eq!(used.len(), PARTITIONS as usize, "300 keys use all {PARTITIONS} partitions");
}

#[tokio::test(flavor = "multi_thread")]
async fn rdkafka_murmur2_random_puts_every_key_on_partition_for() {
    if !require_kafka() {
        return;
    }
    let started = Instant::now();
    let settings = ClientSettings::new(brokers());
    let topic = format!("it-partitioner-rs-{}", suffix());
    let _guard = TopicGuard(vec![topic.clone()]);
    ensure_topic(&settings, &topic, PARTITIONS, 1, &[]).await.expect("create topic");
    let keys = keys();
    // Sluice's producer sets partitioner=murmur2_random; no explicit partition.
    let producer = Producer::new(&settings, &[("message.timeout.ms", "20000")]).expect("producer");
    let payloads: Vec<Vec<u8>> = (0..keys.len()).map(|i| format!("rs-{i}").into_bytes()).collect();
    let items: Vec<Outgoing<'_>> = keys
        .iter()
        .zip(&payloads)
        .map(|(k, v)| Outgoing { topic: &topic, partition: None, key: Some(k), payload: v, headers: &[] })
        .collect();
    let delivered: Vec<(Vec<u8>, i32, i64)> = producer
        .send_all(&items)
        .await
        .into_iter()
        .zip(&keys)
        .map(|(r, k)| {
            let d = r.expect("delivered");
            (k.clone(), d.partition, d.offset)
        })
        .collect();
    tokio::task::block_in_place(|| assert_deliveries_and_topic_agree(&topic, &keys, &delivered));
    eprintln!("rdkafka partitioner interop took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn python_client_murmur2_random_puts_every_key_on_partition_for() {
    if !require_kafka() {
        return;
    }
    let started = Instant::now();
    let settings = ClientSettings::new(brokers());
    let topic = format!("it-partitioner-py-{}", suffix());
    let control = format!("it-partitioner-py-default-{}", suffix());
    let _guard = TopicGuard(vec![topic.clone(), control.clone()]);
    ensure_topic(&settings, &topic, PARTITIONS, 1, &[]).await.expect("create topic");
    ensure_topic(&settings, &control, PARTITIONS, 1, &[]).await.expect("create control topic");
    let keys = keys();
    let python = venv_python();

    let delivered = produce_with_python(&python, &topic, "murmur2_random", &keys);
    tokio::task::block_in_place(|| assert_deliveries_and_topic_agree(&topic, &keys, &delivered));

    // Negative control: librdkafka's default partitioner disagrees for some keys, so the
    // assertions above would catch a producer that forgot the setting.
    let default = produce_with_python(&python, &control, "consistent_random", &keys);
    let moved = default.iter().filter(|(k, p, _)| *p as u32 != partition_for(k, PARTITIONS as u32)).count();
    assert!(
        moved > keys.len() / 2,
        "consistent_random should disagree with partition_for for most keys, moved {moved}"
    );
    eprintln!(
        "python partitioner interop took {:?} ({moved}/{} keys elsewhere under consistent_random)",
        started.elapsed(),
        keys.len()
    );
}
