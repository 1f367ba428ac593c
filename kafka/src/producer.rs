//! Producing: log records (`sluice produce`, markers), DLQ entries and backfill tasks.
//!
//! Every producer is idempotent (`enable.idempotence=true`, hence `acks=all`, per-partition
//! order kept through retries) and uses `partitioner=murmur2_random`, the Java client's
//! partitioner for keyed records, so that any-language producers agree on a collection's
//! partition.

use std::time::Duration;

use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer as _};

use super::{ClientSettings, KafkaError};
use sluice_record::partitioner::RDKAFKA_PARTITIONER;

/// One record to produce.
#[derive(Debug, Clone, Copy)]
pub struct Outgoing<'a> {
    pub topic: &'a str,
    /// Explicit partition; `None` lets the (murmur2) partitioner choose from the key.
    pub partition: Option<i32>,
    pub key: Option<&'a [u8]>,
    pub payload: &'a [u8],
    pub headers: &'a [(&'a str, &'a [u8])],
}

/// Where a record landed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub partition: i32,
    pub offset: i64,
}

/// An idempotent producer.
#[derive(Clone)]
pub struct Producer {
    inner: FutureProducer,
    delivery_timeout: Duration,
}

impl Producer {
    /// `overrides` win over the pass-through options (e.g. `message.timeout.ms` in tests).
    pub fn new(settings: &ClientSettings, overrides: &[(&str, &str)]) -> Result<Self, KafkaError> {
        let mut c = settings.client_config();
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        c.set("partitioner", RDKAFKA_PARTITIONER);
        c.set("linger.ms", "5");
        c.set("compression.type", "lz4");
        for (k, v) in overrides {
            c.set(*k, *v);
        }
        let delivery_timeout = c
            .get("message.timeout.ms")
            .and_then(|v| v.parse::<u64>().ok())
            .map(Duration::from_millis)
            .unwrap_or(Duration::from_secs(300));
        let inner: FutureProducer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
        Ok(Producer { inner, delivery_timeout })
    }

    /// Produce one record and wait for its acknowledgement.
    pub async fn send(&self, out: Outgoing<'_>) -> Result<Delivered, KafkaError> {
        let mut headers = OwnedHeaders::new_with_capacity(out.headers.len());
        for (k, v) in out.headers {
            headers = headers.insert(Header { key: k, value: Some(*v) });
        }
        let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(out.topic).payload(out.payload).headers(headers);
        if let Some(k) = out.key {
            rec = rec.key(k);
        }
        if let Some(p) = out.partition {
            rec = rec.partition(p);
        }
        match self.inner.send(rec, self.delivery_timeout).await {
            Ok(d) => Ok(Delivered { partition: d.partition, offset: d.offset }),
            Err((e, _)) if e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::MessageSizeTooLarge) => {
                Err(KafkaError::TooLarge { topic: out.topic.to_string(), size: out.payload.len() })
            }
            Err((e, _)) => Err(KafkaError::Delivery { topic: out.topic.to_string(), message: e.to_string() }),
        }
    }

    /// Wait until everything queued is delivered (or the timeout passes).
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaError> {
        self.inner.flush(timeout).map_err(|e| KafkaError::Delivery { topic: "*".into(), message: e.to_string() })
    }
}

impl Producer {
    /// Enqueue many records (waiting while the local queue is full) and then wait for
    /// every acknowledgement. Results are in input order.
    pub async fn send_all(&self, items: &[Outgoing<'_>]) -> Vec<Result<Delivered, KafkaError>> {
        let mut futures = Vec::with_capacity(items.len());
        for out in items {
            let mut rec: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(out.topic).payload(out.payload);
            if !out.headers.is_empty() {
                let mut headers = OwnedHeaders::new_with_capacity(out.headers.len());
                for (k, v) in out.headers {
                    headers = headers.insert(Header { key: k, value: Some(*v) });
                }
                rec = rec.headers(headers);
            }
            if let Some(k) = out.key {
                rec = rec.key(k);
            }
            if let Some(p) = out.partition {
                rec = rec.partition(p);
            }
            loop {
                match self.inner.send_result(rec) {
                    Ok(f) => {
                        futures.push(Ok(f));
                        break;
                    }
                    Err((
                        rdkafka::error::KafkaError::MessageProduction(rdkafka::types::RDKafkaErrorCode::QueueFull),
                        r,
                    )) => {
                        rec = r;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err((e, _)) => {
                        futures
                            .push(Err(KafkaError::Delivery { topic: out.topic.to_string(), message: e.to_string() }));
                        break;
                    }
                }
            }
        }
        let mut results = Vec::with_capacity(futures.len());
        for (f, out) in futures.into_iter().zip(items) {
            results.push(match f {
                Ok(f) => match f.await {
                    Ok(Ok(d)) => Ok(Delivered { partition: d.partition, offset: d.offset }),
                    Ok(Err((e, _))) => {
                        Err(KafkaError::Delivery { topic: out.topic.to_string(), message: e.to_string() })
                    }
                    Err(_) => {
                        Err(KafkaError::Delivery { topic: out.topic.to_string(), message: "producer dropped".into() })
                    }
                },
                Err(e) => Err(e),
            });
        }
        results
    }
}
