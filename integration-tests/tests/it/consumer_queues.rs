//! The group consumer against the real broker, driven directly (no processor, no sysdb):
//! - every partition is read from its own queue, a chunk each in turn, so the records of
//!   busy partitions reach their workers interleaved, not one partition after another as a
//!   fetch response lists them;
//! - back-pressure on one partition (`Throttle`) stops that partition alone, and once
//!   lifted its records go on exactly where they stopped: none lost, none repeated.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::ClientConfig;
use sluice::kafka::consumer::{Command, ConsumerHandle, ConsumerSettings, Event, StartDecision};
use sluice::kafka::{ClientSettings, Msg};
use sluice_integration_tests::{brokers, require_kafka, suffix};
use tokio::sync::mpsc::Receiver;

const PARTITIONS: i32 = 4;
const WAIT: Duration = Duration::from_secs(60);

/// A new topic whose partition `p` holds `counts[p]` messages of 200 bytes, offsets 0...
fn topic_with(counts: &[usize]) -> String {
    let topic = format!("it-queues-{}", suffix());
    let settings = ClientSettings::new(brokers());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(sluice::kafka::cluster::ensure_topic(&settings, &topic, PARTITIONS, 1, &[])).expect("create topic");
    let p: ThreadedProducer<DefaultProducerContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).set("linger.ms", "5").create().expect("producer");
    let payload = vec![b'x'; 200];
    for (partition, &n) in counts.iter().enumerate() {
        for i in 0..n {
            let key = format!("k{i}");
            let mut record = BaseRecord::to(&topic).partition(partition as i32).key(&key).payload(&payload);
            loop {
                match p.send(record) {
                    Ok(()) => break,
                    Err((_, r)) => {
                        record = r;
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
            }
        }
    }
    p.flush(Duration::from_secs(30)).expect("flush");
    topic
}

/// A consumer of `topic` in a new group, started and assigned every partition from offset
/// 0. Returns it with its event channel.
fn assigned(topic: &str, rt: &tokio::runtime::Runtime) -> (ConsumerHandle, Receiver<Event>) {
    let settings = ConsumerSettings {
        client: ClientSettings::new(brokers()),
        group: format!("it-queues-{}", suffix()),
        topic: topic.to_string(),
        cooperative: true,
        session_timeout_ms: 10_000,
        instance_id: None,
        max_poll_interval_ms: 300_000,
        // Small, so that the thread blocks on it and its order of reading shows.
        channel_capacity: 4,
    };
    let (handle, mut rx) = ConsumerHandle::start(settings).expect("start the consumer");
    let deadline = Instant::now() + WAIT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rt.block_on(async { tokio::time::timeout(left, rx.recv()).await }).expect("no assignment in time") {
            Some(Event::Assign { partitions, reply }) => {
                let decisions = partitions
                    .iter()
                    .map(|p| StartDecision { partition: p.partition, offset: 0, paused: false })
                    .collect();
                reply.send(decisions).expect("reply to the assignment");
            }
            Some(Event::Assigned { partitions }) => {
                assert_eq!(partitions.len(), PARTITIONS as usize, "every partition assigned at once");
                return (handle, rx);
            }
            Some(other) => panic!("unexpected event before the assignment: {other:?}"),
            None => panic!("the consumer stopped"),
        }
    }
}

/// The next chunk of messages, or None when none comes within `within`.
fn next_chunk(rx: &mut Receiver<Event>, rt: &tokio::runtime::Runtime, within: Duration) -> Option<Vec<Msg>> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rt.block_on(async { tokio::time::timeout(left, rx.recv()).await }) {
            Err(_) => return None,
            Ok(Some(Event::Messages(chunk))) => return Some(chunk),
            Ok(Some(Event::Position { .. })) => {}
            Ok(Some(other)) => panic!("unexpected event: {other:?}"),
            Ok(None) => panic!("the consumer stopped"),
        }
    }
}

/// Note the offsets of `chunk`'s messages, per partition, in the order received.
fn record(seen: &mut BTreeMap<i32, Vec<i64>>, chunk: &[Msg]) {
    for m in chunk {
        seen.entry(m.partition).or_default().push(m.offset);
    }
}

/// Every partition's offsets as received must be 0, 1, 2, ... with nothing missing or
/// repeated, and match `counts`.
fn assert_contiguous(seen: &BTreeMap<i32, Vec<i64>>, counts: &[usize]) {
    for (p, &n) in counts.iter().enumerate() {
        let offsets = seen.get(&(p as i32)).cloned().unwrap_or_default();
        let expected: Vec<i64> = (0..n as i64).collect();
        assert!(offsets == expected, "partition {p}: {} offsets received, not 0..{n} in order", offsets.len());
    }
}

#[test]
fn partitions_are_read_in_turn_a_chunk_each() {
    if !require_kafka() {
        return;
    }
    // About 1.6 MB per partition: more than one fetch of each (1 MiB per partition per
    // fetch), about 12 chunks of 512 messages each.
    let counts = [6_000; PARTITIONS as usize];
    let topic = topic_with(&counts);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (handle, mut rx) = assigned(&topic, &rt);
    // Let librdkafka fetch every partition before anything is read.
    std::thread::sleep(Duration::from_secs(2));
    let total: usize = counts.iter().sum();
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    // The partitions in the order their messages arrived, one entry per run of messages.
    let mut runs: Vec<(i32, usize)> = Vec::new();
    let mut received = 0;
    while received < total {
        let chunk = next_chunk(&mut rx, &rt, WAIT).unwrap_or_else(|| panic!("only {received} of {total} messages"));
        received += chunk.len();
        record(&mut seen, &chunk);
        for m in &chunk {
            match runs.last_mut() {
                Some((p, n)) if *p == m.partition => *n += 1,
                _ => runs.push((m.partition, 1)),
            }
        }
    }
    assert_contiguous(&seen, &counts);
    // One shared queue hands over a fetch response's records partition by partition: runs
    // of about 4,000 messages here. Read in turn, a run is one chunk (512).
    assert!(
        runs.len() * 1024 >= total,
        "partitions were not read in turn: {} runs of one partition in {total} messages ({runs:?})",
        runs.len()
    );
    handle.shutdown(Duration::from_secs(10));
}

#[test]
fn a_throttled_partition_stops_alone_and_goes_on_where_it_stopped() {
    if !require_kafka() {
        return;
    }
    let counts = [20_000, 2_000, 2_000, 2_000];
    let topic = topic_with(&counts);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (handle, mut rx) = assigned(&topic, &rt);
    handle.send(Command::Throttle { partition: 0, on: true });
    let mut seen: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    let others: usize = counts[1..].iter().sum();
    let count = |seen: &BTreeMap<i32, Vec<i64>>, p: i32| seen.get(&p).map_or(0, Vec::len);
    // The other partitions are read to their end...
    while (1..PARTITIONS).map(|p| count(&seen, p)).sum::<usize>() < others {
        let chunk = next_chunk(&mut rx, &rt, WAIT).expect("the other partitions stopped too");
        record(&mut seen, &chunk);
    }
    // ...and nothing more of partition 0 comes while it is throttled, beyond what was read
    // before the command took effect (at most a chunk per pass of the thread).
    while let Some(chunk) = next_chunk(&mut rx, &rt, Duration::from_secs(1)) {
        record(&mut seen, &chunk);
    }
    let before = count(&seen, 0);
    assert!(before <= 4 * 512, "partition 0 went on while throttled: {before} of {} messages", counts[0]);
    // Lifted: the rest of partition 0, from where it stopped.
    handle.send(Command::Throttle { partition: 0, on: false });
    while count(&seen, 0) < counts[0] {
        let chunk = next_chunk(&mut rx, &rt, WAIT)
            .unwrap_or_else(|| panic!("partition 0 did not go on: {} of {}", count(&seen, 0), counts[0]));
        record(&mut seen, &chunk);
    }
    assert_contiguous(&seen, &counts);
    handle.shutdown(Duration::from_secs(10));
}
