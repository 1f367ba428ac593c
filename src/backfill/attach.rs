//! Attaching and detaching functions, and publishing their BACKFILL_FN markers.
//!
//! Attach = one sysdb transaction (function row with a fresh request id + outbox row),
//! then one small marker (no embedding, no padding) published to the collection's
//! partition. If publishing fails, the marker stays in the outbox and the marker relay
//! (`marker_relay.rs`) republishes it until acknowledged; a duplicate marker is harmless
//! (its request id is no longer pending when the processor sees it again).
//!
//! Attach rules (checked in the attach transaction, see [`refusal`] for the messages):
//! an output is written by one live function only, is never a data collection, never a
//! function's input, and a function never reads another function's output (outputs are
//! written in the sysdb, not through the log, so it would never see their live changes).
//! Under `processor.unknown_collections = "reject"` attaching to an unregistered
//! collection is refused: its marker would be dead-lettered.
//!

use std::collections::BTreeMap;

use serde::Serialize;
use thiserror::Error;
use tracing::{info, warn};

use super::components;
use crate::config::{Config, UnknownCollections};
use crate::functions::{build, wasm, FunctionError};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::KafkaError;
use crate::record::framing::encode_framed;
use crate::record::partitioner::partition_for;
use crate::record::{BackfillRef, LogRecord, Operation};
use crate::sysdb::attach_rules::refusal;
use crate::sysdb::{AttachOutcome, FunctionRow, NewFunction, OutboxRow, Sysdb, SysdbError};

#[derive(Debug, Error)]
pub(crate) enum AttachError {
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

/// What attach reports (`sluice functions attach` prints it as JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Attached {
    pub function_id: String,
    pub status: String,
    /// `published`, `pending` (the relay will publish it) or `existing` (nothing new).
    pub marker: String,
    /// A published marker's read token: a read at least this token sees the function
    /// attached (its status past `awaiting_marker`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// The marker record of an outbox row.
pub fn marker_record(row: &OutboxRow) -> LogRecord {
    let mut r = LogRecord::data(row.collection_id.clone(), String::new(), Operation::BackfillFn);
    r.backfill = Some(BackfillRef { request_id: row.request_id.clone(), function_id: row.function_id.clone() });
    r
}

/// Publish one outbox row's marker to its collection's partition and wait for the ack.
/// Returns the log offset the marker was written at.
pub(crate) async fn publish_marker(config: &Config, producer: &Producer, row: &OutboxRow) -> Result<i64, KafkaError> {
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

/// What to attach: `function` with `params` to `collection`, writing `output`.
#[derive(Debug, Clone)]
pub(crate) struct AttachSpec<'a> {
    pub collection: &'a str,
    pub function: &'a str,
    pub output: &'a str,
    pub params: BTreeMap<String, String>,
}

/// Attach a function (see [`AttachSpec`]); a published marker's read token comes from
/// `tokens`.
pub(crate) async fn attach(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    spec: AttachSpec<'_>,
    tokens: &crate::reading::TokenSource,
) -> Result<Attached, AttachError> {
    let AttachSpec { collection, function, output, params } = spec;
    if collection.is_empty() || output.is_empty() {
        return Err(AttachError::Invalid("collection and output must not be empty".into()));
    }
    if collection == output {
        return Err(AttachError::Invalid("the output collection must differ from the input".into()));
    }
    // Validate the name and the parameters before writing; a WebAssembly function runs
    // once on a sample change (its component stored beforehand: `components.rs`).
    if function == wasm::NAME {
        wasm::params_of(&params).map_err(AttachError::Invalid)?;
        match components::check_function(sysdb, &params).await {
            Ok(()) => {}
            Err(components::BuildError::Sysdb(e)) => return Err(e.into()),
            Err(e) => return Err(AttachError::Refused(format!("the WebAssembly function does not run: {e}"))),
        }
    } else {
        build(function, &params)?;
    }
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
    // A replica holding the sysdb (SQLite's write lock, a frozen one past its session
    // timeout) must not make the operator's attach fail: nothing was written until it
    // commits.
    let outcome =
        crate::sysdb::retry_unavailable(crate::sysdb::OPERATOR_WRITE_BUDGET, "attach", || sysdb.attach_function(&new))
            .await?;
    match outcome {
        AttachOutcome::Existing(row) => {
            info!(function = %row.id, "function already attached; nothing published");
            Ok(Attached {
                function_id: row.id,
                status: row.status.as_str().into(),
                marker: "existing".into(),
                token: None,
            })
        }
        AttachOutcome::Refused(conflict) => Err(AttachError::Refused(refusal(&conflict, collection, function, output))),
        AttachOutcome::Created(row, outbox) => {
            let (marker, token) = match publish_marker(config, producer, &outbox).await {
                Ok(offset) => {
                    sysdb.mark_outbox_sent(outbox.id, Some(offset)).await?;
                    let token = match tokens.token_of([(outbox.partition, offset)]).await {
                        Ok(t) => Some(t.to_string()),
                        Err(e) => {
                            warn!(%e, function = %row.id, "marker published, but no read token: the cluster id is unknown");
                            None
                        }
                    };
                    ("published", token)
                }
                Err(e) => {
                    warn!(%e, function = %row.id, "marker not published; the outbox relay of `sluice process` will publish it");
                    ("pending", None)
                }
            };
            Ok(Attached { function_id: row.id, status: row.status.as_str().into(), marker: marker.into(), token })
        }
    }
}

/// A function as `functions list` shows it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FunctionView {
    pub id: String,
    pub collection: String,
    pub function: String,
    pub output: String,
    pub status: String,
    pub marker_offset: Option<i64>,
    pub backfill_done: i64,
    pub backfill_total: Option<i64>,
    /// Why it failed (status `failed`).
    pub failed_reason: Option<String>,
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
            failed_reason: r.failed_reason.clone(),
        }
    }
}
