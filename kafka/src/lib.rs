//! Everything that touches rdkafka. No rdkafka type leaves this module: the rest of the
//! code sees plain structs ([`Msg`], [`consumer::Event`], [`PartitionInfo`]) and
//! channel-based handles.

pub mod changelog;
pub mod cluster;
pub mod consumer;
pub mod dlq_reader;
pub mod preflight;
pub mod producer;
pub mod tasks;

use std::collections::BTreeMap;

use bytes::Bytes;
use rdkafka::config::ClientConfig;
use thiserror::Error;

/// One consumed log message. Its key and payload are slices of one buffer per chunk of
/// messages (the consumer copies a chunk out of librdkafka with one allocation).
#[derive(Debug, Clone)]
pub struct Msg {
    pub partition: i32,
    pub offset: i64,
    /// Assignment generation of the partition when the message was fetched; the processor
    /// drops messages of an older generation (after a revoke, a re-assign or a seek).
    pub generation: u64,
    pub key: Option<Bytes>,
    pub payload: Option<Bytes>,
    /// Producer (create) timestamp in ms, if any.
    pub timestamp_ms: Option<i64>,
}

/// What the broker says about a partition when it is assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionInfo {
    pub partition: i32,
    /// The group's committed offset (next to read), if any.
    pub group_offset: Option<i64>,
    /// Log-start offset (first offset still stored).
    pub low: i64,
    /// High watermark (next offset to be written).
    pub high: i64,
}

/// Kafka errors, classified for the caller.
#[derive(Debug, Error)]
pub enum KafkaError {
    #[error("kafka client configuration: {0}")]
    Config(String),
    #[error("kafka broker request failed ({what}): {message}; is the broker running? (deploy/local/kafka.sh start)")]
    Broker { what: String, message: String },
    #[error("delivery to {topic} failed: {message}")]
    Delivery { topic: String, message: String },
    /// The record is larger than the producer or the topic accepts: retrying cannot help.
    #[error("record of {size} bytes is too large for {topic} (producer message.max.bytes / topic max.message.bytes)")]
    TooLarge { topic: String, size: usize },
}

/// Connection settings shared by every client Sluice creates. `Debug` redacts secret
/// librdkafka values (`sasl.password`, ...).
#[derive(Clone)]
pub struct ClientSettings {
    pub brokers: String,
    /// Passed through unchanged (SASL/SSL, tuning).
    pub librdkafka: BTreeMap<String, String>,
    pub request_timeout_ms: u32,
}

impl std::fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSettings")
            .field("brokers", &self.brokers)
            .field("librdkafka", &sluice_base::redact::redacted_options(&self.librdkafka))
            .field("request_timeout_ms", &self.request_timeout_ms)
            .finish()
    }
}

impl ClientSettings {
    pub fn new(brokers: impl Into<String>) -> Self {
        ClientSettings { brokers: brokers.into(), librdkafka: BTreeMap::new(), request_timeout_ms: 10_000 }
    }

    pub(crate) fn client_config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.librdkafka {
            c.set(k, v);
        }
        c.set("bootstrap.servers", &self.brokers);
        c
    }

    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(u64::from(self.request_timeout_ms))
    }
}

/// Join a client thread, waiting at most `timeout`; a thread still running then is left
/// behind (closing an rdkafka client can block without bound). Returns whether it ended.
pub(crate) fn join_within(thread: std::thread::JoinHandle<()>, timeout: std::time::Duration) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    while !thread.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let ended = thread.is_finished();
    if ended {
        let _ = thread.join();
    }
    ended
}

pub(crate) fn broker_err(what: impl Into<String>, e: impl std::fmt::Display) -> KafkaError {
    KafkaError::Broker { what: what.into(), message: e.to_string() }
}

/// Check librdkafka options against librdkafka itself without echoing any value (its own
/// message for `"sasl.pasword" = "hunter2"` would carry `hunter2`): the error names the
/// key and says what is wrong with secrets replaced by `***`.
pub fn check_options(map: &BTreeMap<String, String>) -> Result<(), String> {
    const REDACTED: &str = "***";
    let mut c = ClientConfig::new();
    for (k, v) in map {
        c.set(k, v);
    }
    match c.create_native_config() {
        Ok(_) => Ok(()),
        Err(rdkafka::error::KafkaError::ClientConfig(_, desc, key, value)) => {
            let mut reason = if value.is_empty() { desc } else { desc.replace(&value, REDACTED) };
            if let Some(v) = map.get(&key).filter(|v| !v.is_empty()) {
                reason = reason.replace(v.as_str(), REDACTED);
            }
            Err(format!("invalid [librdkafka] key {key:?}: {reason}"))
        }
        Err(_) => Err("invalid [librdkafka] options".into()),
    }
}
