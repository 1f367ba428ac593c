//! Attaching and detaching functions, and publishing their BACKFILL_FN markers.
//!
//! Attach = one sysdb transaction (function row with a fresh request id + outbox row),
//! then one small marker (no embedding, no padding) published to the collection's
//! partition. If publishing fails, the marker stays in the outbox and the relay in
//! `sluice process` republishes it until acknowledged; a duplicate marker is harmless
//! (its request id is no longer pending when the processor sees it again).
//!
//! Attach rules (checked in the attach transaction, see [`refusal`] for the messages):
//! an output is written by one live function only, is never a data collection, never a
//! function's input, and a function never reads another function's output (outputs are
//! written in the sysdb, not through the log, so it would never see their live changes).
//! Under `processor.unknown_collections = "reject"` attaching to an unregistered
//! collection is refused: its marker would be dead-lettered.
//!
//! Lost markers: a marker the processor passed without starting its function (dead-
//! lettered, skipped in a data-loss gap, passed by `offsets reset`) leaves the function
//! `awaiting_marker` forever. The relay finds those by the offset where each marker was
//! published and publishes them again ([`relay_once`]); it also exports the age of the
//! oldest function still awaiting its marker.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;
use thiserror::Error;
use tracing::{info, warn};

use crate::config::{Config, UnknownCollections};
use crate::functions::{build, FunctionError};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::KafkaError;
use crate::record::framing::encode_framed;
use crate::record::partitioner::partition_for;
use crate::record::{BackfillRef, LogRecord, Operation};
use crate::sysdb::{AttachConflict, AttachOutcome, FunctionRow, NewFunction, OutboxRow, Sysdb, SysdbError};

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
    /// The attach breaks a rule; the message names what is in the way and the fix.
    #[error("attach refused: {0}")]
    Refused(String),
}

fn describe(f: &FunctionRow) -> String {
    format!(
        "function {} ({} on {:?} -> {:?}, {})",
        f.id,
        f.function,
        f.collection_id,
        f.output_collection,
        f.status.as_str()
    )
}

/// The message of a refused attach of `function` on `collection` writing `output`.
pub fn refusal(conflict: &AttachConflict, collection: &str, function: &str, output: &str) -> String {
    match conflict {
        AttachConflict::OutputIsData { output } => format!(
            "output collection {output:?} already exists and holds data from the log (no function writes it); \
             a function only writes a new collection of its own: choose another --output name"
        ),
        AttachConflict::OutputWrittenBy(f) if f.collection_id == collection && f.function != function => format!(
            "output collection {output:?} is already written by {}; to replace it, run `sluice functions detach {} --drop-output` \
             and attach again, or choose another --output name",
            describe(f),
            f.id
        ),
        AttachConflict::OutputWrittenBy(f) if f.collection_id == collection => format!(
            "output collection {output:?} is already written by {} with other parameters ({:?}); to change them, run \
             `sluice functions detach {} --drop-output` and attach again, or choose another --output name",
            describe(f),
            f.params,
            f.id
        ),
        AttachConflict::OutputWrittenBy(f) => format!(
            "output collection {output:?} is already written by {}; each output has one writer: choose another --output name \
             (or detach that function first: `sluice functions detach {} --drop-output`)",
            describe(f),
            f.id
        ),
        AttachConflict::OutputLeftBy(f) => format!(
            "output collection {output:?} still holds the records of {}, detached without --drop-output; \
             run `sluice functions detach {} --drop-output` to drop them, then attach again, or choose another --output name",
            describe(f),
            f.id
        ),
        AttachConflict::InputIsOutputOf(f) => format!(
            "collection {collection:?} is the output of {}; a function cannot take another function's output as its input \
             (outputs are written in the sysdb, not through the log, so it would never see their live changes): \
             attach {function} to {:?} instead",
            describe(f),
            f.collection_id
        ),
        AttachConflict::OutputIsInputOf(f) => format!(
            "output collection {output:?} is the input of {}; a function's output cannot be another function's input: \
             choose another --output name",
            describe(f)
        ),
    }
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
/// Returns the log offset the marker was written at.
pub async fn publish_marker(config: &Config, producer: &Producer, row: &OutboxRow) -> Result<i64, KafkaError> {
    let payload = encode_framed(config.kafka.framing, config.writer_schema_id(), &marker_record(row));
    let topic = config.kafka.log_topic();
    let delivered = producer
        .send(Outgoing {
            topic: &topic,
            partition: Some(row.partition),
            key: Some(row.collection_id.as_bytes()),
            payload: &payload,
            headers: &[],
        })
        .await?;
    Ok(delivered.offset)
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
        None if config.processor.unknown_collections == UnknownCollections::Reject => {
            return Err(AttachError::Refused(format!(
                "collection {collection:?} is not registered and processor.unknown_collections = \"reject\": its BACKFILL_FN marker \
                 would go to the dead-letter topic and the function would never start; attach to a registered collection, or \
                 register {collection:?} first (replicas register a collection on its first record while \
                 processor.unknown_collections = \"register\")"
            )))
        }
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
        AttachOutcome::Refused(conflict) => Err(AttachError::Refused(refusal(&conflict, collection, function, output))),
        AttachOutcome::Created(row, outbox) => {
            let marker = match publish_marker(config, producer, &outbox).await {
                Ok(offset) => {
                    sysdb.mark_outbox_sent(outbox.id, Some(offset)).await?;
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

/// How many outbox rows (pending, then lost) one relay pass handles at most.
const RELAY_BATCH: usize = 100;

/// One pass of the outbox relay: publish every pending marker and mark the acknowledged
/// ones sent (with the offset they were written at); then publish again every lost
/// marker (see [`Sysdb::lost_markers`]); then refresh the awaiting-marker gauge. Returns
/// how many markers were published.
pub async fn relay_once(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<usize, SysdbError> {
    let mut n = 0;
    let mut broker_ok = true;
    for row in sysdb.outbox_pending(RELAY_BATCH).await? {
        match publish_marker(config, producer, &row).await {
            Ok(offset) => {
                // Published but not yet marked sent: a crash here republishes the marker
                // (the processor ignores a duplicate).
                crate::failpoint::hit("after_relay_publish");
                sysdb.mark_outbox_sent(row.id, Some(offset)).await?;
                info!(function = %row.function_id, partition = row.partition, offset, "outbox relay published a pending marker");
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
                broker_ok = false;
                break;
            }
        }
    }
    if broker_ok {
        n += republish_lost(config, sysdb, producer, metrics).await?;
    }
    if let Some(m) = metrics {
        let oldest = sysdb.oldest_awaiting_marker_ms().await?;
        m.set_awaiting_marker_oldest(oldest.map_or(0.0, |t| (crate::sysdb::now_ms() - t).max(0) as f64 / 1000.0));
        // Backfill progress and status per function, from the same sysdb-wide source on
        // every replica (dashboards take the max over replicas).
        let functions = sysdb
            .functions(None)
            .await?
            .into_iter()
            .filter(|f| f.status != crate::functions::FunctionStatus::Detached)
            .map(|f| crate::metrics::FunctionGauge {
                id: f.id,
                collection: f.collection_id,
                status: f.status.as_str(),
                backfill_done: f.backfill_done,
                backfill_total: f.backfill_total,
            })
            .collect();
        m.set_functions(functions);
    }
    Ok(n)
}

/// The relay checks every `relay_interval_ms`: say it once a minute, not every pass.
static NOT_REPUBLISHED_LOG: crate::ratelimit::RateLimiter =
    crate::ratelimit::RateLimiter::new(Duration::from_secs(60), 1);

/// Publish again the markers the processor passed without starting their function.
async fn republish_lost(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<usize, SysdbError> {
    let mut n = 0;
    for row in sysdb.lost_markers(&config.kafka.log_topic(), RELAY_BATCH).await? {
        // Under "reject" a marker of an unregistered collection is dead-lettered again:
        // republishing it would loop. Leave it (the awaiting-marker alert shows it).
        if config.processor.unknown_collections == UnknownCollections::Reject
            && sysdb.collection(&row.collection_id).await?.is_none()
        {
            if let crate::ratelimit::Verdict::Log { suppressed } = NOT_REPUBLISHED_LOG.check("unregistered") {
                warn!(function = %row.function_id, collection = %row.collection_id, suppressed,
                    "lost marker not republished: the collection is not registered and processor.unknown_collections = \"reject\"; detach the function or register the collection");
            }
            continue;
        }
        match publish_marker(config, producer, &row).await {
            Ok(offset) => {
                sysdb.mark_marker_republished(row.id, offset).await?;
                warn!(
                    function = %row.function_id, partition = row.partition, lost_at = ?row.published_offset, offset,
                    "outbox relay republished a lost marker (the partition moved past it while the function was awaiting it)"
                );
                n += 1;
                if let Some(m) = metrics {
                    m.marker_published(true);
                    m.marker_republished();
                }
            }
            Err(e) => {
                warn!(%e, function = %row.function_id, "outbox relay could not republish a lost marker; will retry");
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
pub async fn relay(
    config: Config,
    sysdb: std::sync::Arc<Sysdb>,
    producer: Producer,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    stop: tokio_util::sync::CancellationToken,
) {
    let every = Duration::from_millis(config.backfill.relay_interval_ms);
    loop {
        if let Err(e) = relay_once(&config, &sysdb, &producer, Some(&metrics)).await {
            warn!(%e, "outbox relay: sysdb error; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
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
