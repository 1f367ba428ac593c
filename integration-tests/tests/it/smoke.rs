//! Smoke tests of the local services and of the test helpers themselves:
//! - the broker round-trips records through a topic created by Sluice's admin code
//!   (`sluice::kafka::cluster::ensure_topic`) and Sluice's producer, read back by a plain
//!   rdkafka consumer, in order per partition;
//! - PostgreSQL answers `select 1`;
//! - an unreachable service FAILS a test with the command that starts it (and CI cannot
//!   opt out), which is what makes every other integration test trustworthy: a missing
//!   broker never turns into a silently green run.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use sluice::kafka::cluster::{ensure_topic, TopicOutcome};
use sluice::kafka::producer::{Outgoing, Producer};
use sluice::kafka::ClientSettings;
use sluice_integration_tests::{brokers, postgres_url, require_kafka, require_postgres, suffix, TopicGuard};

/// One consumed message.
struct Consumed {
    partition: i32,
    offset: i64,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
}

/// Reads every partition of `topic` from the beginning up to the high watermark it has
/// when called (everything produced before), with a plain rdkafka consumer (no group).
fn consume_all(topic: &str, partitions: i32, timeout: Duration) -> Vec<Consumed> {
    sluice_integration_tests::consume_all(topic, partitions, timeout)
        .into_iter()
        .map(|m| Consumed { partition: m.partition, offset: m.offset, key: m.key, payload: m.payload })
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn kafka_round_trips_100_records_in_order_per_partition() {
    if !require_kafka() {
        return;
    }
    let started = Instant::now();
    let settings = ClientSettings::new(brokers());
    let topic = format!("it-smoke-{}", suffix());
    let _guard = TopicGuard(vec![topic.clone()]);
    let outcome = ensure_topic(&settings, &topic, 3, 1, &[]).await.expect("create topic");
    assert_eq!(outcome, TopicOutcome::Created, "a fresh random topic name is created, not found");
    assert_eq!(
        ensure_topic(&settings, &topic, 3, 1, &[]).await.expect("ensure again"),
        TopicOutcome::AlreadyExists { partitions: 3 },
        "ensure_topic is idempotent"
    );

    let producer = Producer::new(&settings, &[("message.timeout.ms", "20000")]).expect("producer");
    let keys: Vec<String> = (0..100).map(|i| format!("key-{}", i % 10)).collect();
    let payloads: Vec<String> = (0..100).map(|i| format!("message {i} of 100")).collect();
    let items: Vec<Outgoing<'_>> = keys
        .iter()
        .zip(&payloads)
        .map(|(k, v)| Outgoing {
            topic: &topic,
            partition: None,
            key: Some(k.as_bytes()),
            payload: v.as_bytes(),
            headers: &[],
        })
        .collect();
    let delivered: Vec<_> = producer.send_all(&items).await.into_iter().map(|r| r.expect("delivered")).collect();

    // Expected per partition: the payloads in produce order, at offsets 0, 1, 2, ...
    let mut expected: BTreeMap<i32, Vec<(i64, &str, &str)>> = BTreeMap::new();
    for ((d, k), v) in delivered.iter().zip(&keys).zip(&payloads) {
        expected.entry(d.partition).or_default().push((d.offset, k, v));
    }
    assert!(expected.len() > 1, "10 distinct keys spread over more than one of 3 partitions: {:?}", expected.keys());
    for (p, rows) in &expected {
        let offsets: Vec<i64> = rows.iter().map(|r| r.0).collect();
        assert_eq!(
            offsets,
            (0..rows.len() as i64).collect::<Vec<_>>(),
            "delivery offsets of partition {p} follow produce order"
        );
    }

    let consumed = tokio::task::block_in_place(|| consume_all(&topic, 3, Duration::from_secs(20)));
    assert_eq!(consumed.len(), 100, "every produced record is consumed exactly once");
    let mut actual: BTreeMap<i32, Vec<(i64, &str, &str)>> = BTreeMap::new();
    for m in &consumed {
        let key = std::str::from_utf8(m.key.as_deref().expect("key")).expect("utf8 key");
        let payload = std::str::from_utf8(&m.payload).expect("utf8 payload");
        actual.entry(m.partition).or_default().push((m.offset, key, payload));
    }
    assert_eq!(actual, expected, "per partition: same payloads, same keys, same order, same offsets");
    eprintln!("kafka round trip took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn postgres_answers_select_1() {
    if !require_postgres().await {
        return;
    }
    let (client, conn) = tokio_postgres::connect(&postgres_url(), tokio_postgres::NoTls).await.expect("connect");
    tokio::spawn(conn);
    let row = client.query_one("select 1", &[]).await.expect("select 1");
    assert_eq!(row.get::<_, i32>(0), 1);
}

// ---------------------------------------------------------------------------------------
// The helpers fail loudly. Each case runs `helper_child` below in a child process (this
// same test binary) so that it can set CI / SLUICE_* variables and observe a panic
// without touching this process's environment.
// ---------------------------------------------------------------------------------------

const CHILD_VAR: &str = "SLUICE_SMOKE_CHILD";
const CLOSED: &str = "127.0.0.1:1";

/// Not a test of its own: the body the child processes run. Without `SLUICE_SMOKE_CHILD`
/// (e.g. under `cargo test -- --ignored`) it does nothing.
#[tokio::test]
#[ignore = "child process of the helpers_* tests"]
async fn helper_child() {
    let outcome = match std::env::var(CHILD_VAR).as_deref() {
        Ok("kafka") => require_kafka(),
        Ok("postgres") => require_postgres().await,
        _ => return,
    };
    println!("CHILD-OUTCOME: {}", if outcome { "reachable" } else { "skip" });
}

/// Runs `helper_child` checking `service`, with `env` set (`None` = removed).
fn run_child(service: &str, env: &[(&str, Option<&str>)]) -> (Output, String) {
    let mut c = Command::new(std::env::current_exe().expect("current exe"));
    c.args(["--exact", "smoke::helper_child", "--ignored", "--nocapture", "--test-threads=1"])
        .env(CHILD_VAR, service)
        .env("RUST_BACKTRACE", "0");
    for (k, v) in env {
        match v {
            Some(v) => c.env(k, v),
            None => c.env_remove(k),
        };
    }
    let out = c.output().expect("spawn the test binary");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out, text)
}

#[test]
fn helpers_fail_with_the_start_command_when_kafka_is_unreachable_even_if_skip_is_set_in_ci() {
    let (out, text) = run_child(
        "kafka",
        &[("SLUICE_TEST_BROKERS", Some(CLOSED)), ("CI", Some("1")), ("SLUICE_SKIP_INTEGRATION", Some("1"))],
    );
    assert!(!out.status.success(), "require_kafka must fail the test in CI:\n{text}");
    assert!(text.contains("panicked"), "the failure is a panic:\n{text}");
    assert!(text.contains("deploy/local/kafka.sh start"), "the panic names the start command:\n{text}");
    assert!(text.contains(&format!("Kafka at {CLOSED}")), "the panic names the address tried:\n{text}");
    assert!(!text.contains("CHILD-OUTCOME"), "require_kafka did not return:\n{text}");
}

#[test]
fn helpers_fail_when_kafka_is_unreachable_outside_ci_without_the_opt_in() {
    let (out, text) =
        run_child("kafka", &[("SLUICE_TEST_BROKERS", Some(CLOSED)), ("CI", None), ("SLUICE_SKIP_INTEGRATION", None)]);
    assert!(!out.status.success(), "require_kafka must fail the test:\n{text}");
    assert!(text.contains("deploy/local/kafka.sh start"), "the panic names the start command:\n{text}");
}

#[test]
fn helpers_skip_unreachable_kafka_only_when_opted_in_outside_ci_and_say_so() {
    let (out, text) = run_child(
        "kafka",
        &[("SLUICE_TEST_BROKERS", Some(CLOSED)), ("CI", None), ("SLUICE_SKIP_INTEGRATION", Some("1"))],
    );
    assert!(out.status.success(), "opted-in skip outside CI:\n{text}");
    assert!(text.contains("SKIPPING: Kafka at 127.0.0.1:1 is unreachable"), "the skip is announced:\n{text}");
    assert!(text.contains("CHILD-OUTCOME: skip"), "require_kafka returned false:\n{text}");
}

#[test]
fn helpers_fail_with_the_start_command_when_postgres_is_unreachable_in_ci() {
    let (out, text) = run_child(
        "postgres",
        &[
            ("SLUICE_TEST_POSTGRES_URL", Some("postgres://sluice:sluice@127.0.0.1:1/sluice_test")),
            ("CI", Some("1")),
            ("SLUICE_SKIP_INTEGRATION", Some("1")),
        ],
    );
    assert!(!out.status.success(), "require_postgres must fail the test in CI:\n{text}");
    assert!(text.contains("deploy/local/postgres.sh start"), "the panic names the start command:\n{text}");
    assert!(!text.contains("CHILD-OUTCOME"), "require_postgres did not return:\n{text}");
}
