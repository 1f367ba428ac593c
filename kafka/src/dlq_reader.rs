//! Reading the dead-letter topic back, and the header names its entries (and their
//! replays into the log) carry.
//!
//! The processor produces an entry with the original key and payload and the headers
//! [`SOURCE_TOPIC`], [`SOURCE_PARTITION`], [`SOURCE_OFFSET`], [`ERROR_KIND`],
//! [`ERROR_MESSAGE`] (and [`PAYLOAD_OMITTED`] when the payload was too large for the DLQ).
//! A replay re-produces the original bytes into the log with [`REPLAYED_FROM`]
//! (`<dlq partition>/<dlq offset>`) and [`REPLAYED_SOURCE_PARTITION`] /
//! [`REPLAYED_SOURCE_OFFSET`] (where the record was first).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use super::{broker_err, ClientSettings, KafkaError};

pub const SOURCE_TOPIC: &str = "sluice.source.topic";
pub const SOURCE_PARTITION: &str = "sluice.source.partition";
pub const SOURCE_OFFSET: &str = "sluice.source.offset";
pub const ERROR_KIND: &str = "sluice.error.kind";
pub const ERROR_MESSAGE: &str = "sluice.error.message";
pub const PAYLOAD_OMITTED: &str = "sluice.payload.omitted";
pub const REPLAYED_FROM: &str = "sluice.replayed-from";
pub const REPLAYED_SOURCE_PARTITION: &str = "sluice.replayed.source-partition";
pub const REPLAYED_SOURCE_OFFSET: &str = "sluice.replayed.source-offset";

/// One message of the DLQ topic, owned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqMessage {
    pub partition: i32,
    pub offset: i64,
    /// Producer (create) timestamp in ms, if any.
    pub timestamp_ms: Option<i64>,
    pub key: Option<Vec<u8>>,
    pub payload: Vec<u8>,
    /// Header values as text (lossy UTF-8); a repeated key keeps its last value.
    pub headers: BTreeMap<String, String>,
}

/// Read every partition of `topic` from its log start up to the high watermark it has
/// when called, with a plain assigned consumer (no group membership, nothing committed) that sees
/// committed transactions only. Gives up after `timeout`.
pub fn read_all(settings: &ClientSettings, topic: &str, timeout: Duration) -> Result<Vec<DlqMessage>, KafkaError> {
    let mut c = settings.client_config();
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("isolation.level", "read_committed");
    // librdkafka wants a group id even for an assigned consumer; this one never joins a
    // group and never commits, so nothing is created on the broker under its name.
    c.set("group.id", format!("sluice-dlq-reader-{}", uuid::Uuid::new_v4()));
    let consumer: BaseConsumer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let md = consumer
        .fetch_metadata(Some(topic), settings.timeout())
        .map_err(|e| broker_err(format!("metadata of {topic}"), e))?;
    let partitions = match md.topics().iter().find(|t| t.name() == topic) {
        Some(t) if t.error().is_none() && !t.partitions().is_empty() => t.partitions().len() as i32,
        _ => return Err(broker_err(format!("metadata of {topic}"), "topic does not exist; run `sluice init`")),
    };
    let mut high = BTreeMap::new();
    let mut next = BTreeMap::new();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        let (lo, hi) = consumer
            .fetch_watermarks(topic, p, settings.timeout())
            .map_err(|e| broker_err(format!("watermarks of {topic}/{p}"), e))?;
        if lo < hi {
            high.insert(p, hi);
            next.insert(p, lo);
            tpl.add_partition_offset(topic, p, Offset::Offset(lo)).map_err(|e| broker_err("build offsets", e))?;
        }
    }
    let mut out = Vec::new();
    if high.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl).map_err(|e| broker_err(format!("assign {topic}"), e))?;
    let deadline = Instant::now() + timeout;
    while next.iter().any(|(p, n)| *n < high[p]) {
        if Instant::now() > deadline {
            return Err(broker_err(
                format!("read {topic}"),
                format!("read {} messages in {timeout:?}, positions {next:?} short of {high:?}", out.len()),
            ));
        }
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                next.insert(m.partition(), m.offset() + 1);
                if m.offset() >= high.get(&m.partition()).copied().unwrap_or(0) {
                    continue;
                }
                let mut headers = BTreeMap::new();
                if let Some(hs) = m.headers() {
                    for h in hs.iter() {
                        headers.insert(h.key.to_string(), String::from_utf8_lossy(h.value.unwrap_or_default()).into());
                    }
                }
                out.push(DlqMessage {
                    partition: m.partition(),
                    offset: m.offset(),
                    timestamp_ms: m.timestamp().to_millis(),
                    key: m.key().map(<[u8]>::to_vec),
                    payload: m.payload().unwrap_or_default().to_vec(),
                    headers,
                });
            }
            Some(Err(e)) => return Err(broker_err(format!("read {topic}"), e)),
            None => {
                // Nothing delivered: the position may have passed transaction markers.
                if let Ok(positions) = consumer.position() {
                    for e in positions.elements() {
                        if let Offset::Offset(o) = e.offset() {
                            let n = next.entry(e.partition()).or_insert(0);
                            *n = (*n).max(o);
                        }
                    }
                }
            }
        }
    }
    out.sort_by_key(|m| (m.partition, m.offset));
    Ok(out)
}
