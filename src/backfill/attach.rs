//! Attaching and detaching functions, and publishing their BACKFILL_FN markers.
//!
//! Attach = one sysdb transaction (function row with a fresh request id + outbox row),
//! then one small marker (no embedding, no padding) published to the collection's
//! partition. If publishing fails, the marker stays in the outbox and the relay in
//! `sluice process` republishes it until acknowledged; a duplicate marker is harmless
//! (its request id is no longer pending when the processor sees it again).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;
use tracing::{info, warn};

use crate::config::Config;
use crate::functions::{build, FunctionError};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::KafkaError;
use crate::record::framing::{frame, Framing};
use crate::record::partitioner::partition_for;
use crate::record::{codec, BackfillRef, LogRecord, Operation};
use crate::sysdb::{AttachOutcome, FunctionRow, NewFunction, OutboxRow, Sysdb, SysdbError};

#[derive(Debug, Error)]
pub enum AttachError {
    #[error(transparent)]
    Function(#[from] FunctionError),
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    #[error("the sysdb does not know the partition count of {0}: run `sluice init` first")]
    NotInitialised(String),
    #[error("invalid attach request: {0}")]
    Invalid(String),
}

/// What attach reports (`sluice functions attach` prints it as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Attached {
    pub function_id: String,
    pub status: String,
    /// `published`, `pending` (the relay will publish it) or `existing` (nothing new).
    pub marker: String,
}

/// The marker record of an outbox row.
pub fn marker_record(row: &OutboxRow) -> LogRecord {
    let mut r = LogRecord::data(row.collection_id.clone(), String::new(), Operation::BackfillFn);
    r.backfill = Some(BackfillRef { request_id: row.request_id.clone(), function_id: row.function_id.clone() });
    r
}

/// Publish one outbox row's marker to its collection's partition and wait for the ack.
pub async fn publish_marker(config: &Config, producer: &Producer, row: &OutboxRow) -> Result<(), KafkaError> {
    let datum = codec::encode(&marker_record(row));
    let payload = match config.kafka.framing {
        Framing::Plain => datum,
        f => frame(f, config.kafka.confluent_schema_id, &datum),
    };
    let topic = config.kafka.log_topic();
    producer
        .send(Outgoing {
            topic: &topic,
            partition: Some(row.partition),
            key: Some(row.collection_id.as_bytes()),
            payload: &payload,
            headers: &[],
        })
        .await?;
    Ok(())
}

/// Attach `function` to `collection`, writing `output`.
pub async fn attach(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    collection: &str,
    function: &str,
    output: &str,
    params: BTreeMap<String, String>,
) -> Result<Attached, AttachError> {
    if collection.is_empty() || output.is_empty() {
        return Err(AttachError::Invalid("collection and output must not be empty".into()));
    }
    if collection == output {
        return Err(AttachError::Invalid("the output collection must differ from the input".into()));
    }
    build(function, &params)?; // validate the name and the parameters before writing
    let topic = config.kafka.log_topic();
    let partition = match sysdb.collection(collection).await? {
        Some(row) => row.partition,
        None => {
            let n = sysdb.topic_partitions(&topic).await?.ok_or_else(|| AttachError::NotInitialised(topic.clone()))?;
            partition_for(collection.as_bytes(), n as u32) as i32
        }
    };
    let new = NewFunction {
        id: uuid::Uuid::new_v4().to_string(),
        collection_id: collection.to_string(),
        partition,
        function: function.to_string(),
        output_collection: output.to_string(),
        params,
        request_id: uuid::Uuid::new_v4().to_string(),
    };
    match sysdb.attach_function(&new).await? {
        AttachOutcome::Existing(row) => {
            info!(function = %row.id, "function already attached; nothing published");
            Ok(Attached { function_id: row.id, status: row.status.as_str().into(), marker: "existing".into() })
        }
        AttachOutcome::Created(row, outbox) => {
            let marker = match publish_marker(config, producer, &outbox).await {
                Ok(()) => {
                    sysdb.mark_outbox_sent(outbox.id).await?;
                    "published"
                }
                Err(e) => {
                    warn!(%e, function = %row.id, "marker not published; the outbox relay of `sluice process` will publish it");
                    "pending"
                }
            };
            Ok(Attached { function_id: row.id, status: row.status.as_str().into(), marker: marker.into() })
        }
    }
}

/// One pass of the outbox relay: publish every pending marker, mark the acknowledged
/// ones sent. Returns how many were published.
pub async fn relay_once(config: &Config, sysdb: &Sysdb, producer: &Producer, metrics: Option<&crate::metrics::Metrics>) -> Result<usize, SysdbError> {
    let mut n = 0;
    for row in sysdb.outbox_pending(100).await? {
        match publish_marker(config, producer, &row).await {
            Ok(()) => {
                // Published but not yet marked sent: a crash here republishes the marker
                // (the processor ignores a duplicate).
                crate::failpoint::hit("after_relay_publish");
                sysdb.mark_outbox_sent(row.id).await?;
                info!(function = %row.function_id, partition = row.partition, "outbox relay published a pending marker");
                n += 1;
                if let Some(m) = metrics {
                    m.marker_published(true);
                }
            }
            Err(e) => {
                warn!(%e, function = %row.function_id, "outbox relay could not publish a marker; will retry");
                if let Some(m) = metrics {
                    m.marker_published(false);
                }
                break;
            }
        }
    }
    Ok(n)
}

/// The relay loop (a role of `sluice process`).
pub async fn relay(config: Config, sysdb: std::sync::Arc<Sysdb>, producer: Producer, metrics: std::sync::Arc<crate::metrics::Metrics>, mut stop: tokio::sync::watch::Receiver<bool>) {
    let every = Duration::from_millis(config.backfill.relay_interval_ms);
    loop {
        if let Err(e) = relay_once(&config, &sysdb, &producer, Some(&metrics)).await {
            warn!(%e, "outbox relay: sysdb error; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => return,
        }
    }
}

/// A function as `functions list` shows it.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionView {
    pub id: String,
    pub collection: String,
    pub function: String,
    pub output: String,
    pub status: String,
    pub marker_offset: Option<i64>,
    pub backfill_done: i64,
    pub backfill_total: Option<i64>,
}

impl From<&FunctionRow> for FunctionView {
    fn from(r: &FunctionRow) -> Self {
        FunctionView {
            id: r.id.clone(),
            collection: r.collection_id.clone(),
            function: r.function.clone(),
            output: r.output_collection.clone(),
            status: r.status.as_str().into(),
            marker_offset: r.marker_offset,
            backfill_done: r.backfill_done,
            backfill_total: r.backfill_total,
        }
    }
}
