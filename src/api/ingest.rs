//! `POST /api/v1/collections/{id}/records`: produce log records for clients without a
//! Kafka library.
//!
//! The body is one JSON object or an array of them, each shaped like a `sluice produce`
//! line (`id`, `operation`, `embedding`, `metadata`, `document`) without `collection`,
//! which comes from the path (an item may repeat it, but only with the same value). All
//! items are parsed and validated first (`record::items::parse_items`, pure): the `[limits]` of the
//! config, and the embedding dimension against the collection's fixed dimension (or the
//! first embedding of the request when none is fixed yet); if **any** item is invalid,
//! nothing is produced and the response lists every problem by index.
//!
//! Valid requests are encoded and framed like `sluice produce` and produced to the log
//! topic keyed by the collection id (so murmur2 puts them on the collection's partition),
//! in request order, with the idempotent producer; the response (202) comes after every
//! record is acknowledged and gives the offsets and a read token: a read with
//! `at_least=TOKEN` includes every record of the request. Delivery is at least once: a 503 after
//! a partial delivery lists the undelivered items, and retrying the whole request may
//! apply the delivered ones twice (use `upsert` for safe retries).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use super::error::{ErrorCode, HttpError, ItemError};
use super::state::Admin;
use crate::config::{Config, UnknownCollections};
use crate::kafka::producer::Outgoing;
use crate::record::framing::encode_framed;
use crate::record::items::{self, parse_items, BodyError};
use crate::record::LogRecord;

/// The items of a request body, or the error response saying why it holds none.
fn parse_body(body: &[u8]) -> Result<Vec<Value>, HttpError> {
    items::parse_body(body).map_err(|e| match e {
        BodyError::NotJson(message) => HttpError::new(ErrorCode::BadJson, message),
        BodyError::Empty => HttpError::bad_request(e.to_string()),
    })
}

/// The log message value of a record, framed as the config says (as `sluice produce`).
fn payload(config: &Config, record: &LogRecord) -> Vec<u8> {
    encode_framed(config.kafka.framing, config.writer_schema_id(), record)
}

pub(crate) async fn post_records(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let Path(collection) = path?;
    let body = body?;
    let items = parse_body(&body)?;
    let config = admin.config();
    let row = admin.sysdb().collection(&collection).await?;
    if row.is_none() && config.processor.unknown_collections == UnknownCollections::Reject {
        return Err(HttpError::new(
            ErrorCode::UnknownCollection,
            format!("collection {collection:?} is not known and the processor rejects unknown collections (processor.unknown_collections = \"reject\")"),
        ));
    }
    let dimension = row.and_then(|r| r.dimension).map(|d| d as usize);
    let records = parse_items(&items, &collection, &config.limits, dimension).map_err(|errors| {
        let n = errors.len();
        HttpError::new(
            ErrorCode::InvalidRecord,
            format!("{n} of {} records are invalid; nothing was produced", items.len()),
        )
        .with_items(errors)
    })?;

    let topic = config.kafka.log_topic();
    let payloads: Vec<Vec<u8>> = records.iter().map(|r| payload(config, r)).collect();
    let outgoing: Vec<Outgoing<'_>> = payloads
        .iter()
        .map(|p| Outgoing {
            topic: &topic,
            partition: None,
            key: Some(collection.as_bytes()),
            payload: p,
            headers: &[],
        })
        .collect();
    let results = admin.producer().send_all(&outgoing).await;
    let mut delivered = Vec::with_capacity(results.len());
    let mut undelivered = Vec::new();
    for (index, r) in results.into_iter().enumerate() {
        match r {
            Ok(d) => delivered.push(d),
            Err(e) => undelivered.push(ItemError { index, error: "not_delivered".into(), message: e.to_string() }),
        }
    }
    if !undelivered.is_empty() {
        let message = format!(
            "{} of {} records were not delivered to {topic} (is the broker reachable?); the {} delivered ones will be materialized",
            undelivered.len(),
            records.len(),
            delivered.len()
        );
        return Err(HttpError::new(ErrorCode::Unavailable, message).with_items(undelivered));
    }
    // A read at least this token includes every record of the request.
    let token = match admin.tokens.token_of(delivered.iter().map(|d| (d.partition, d.offset))).await {
        Ok(t) => Some(t.to_string()),
        Err(e) => {
            tracing::warn!(error = %e, "records delivered, but no read token: the cluster id is unknown");
            None
        }
    };
    let body = json!({
        "token": token,
        "collection": collection,
        "delivered": delivered.len(),
        "topic": topic,
        "partition": delivered.first().map(|d| d.partition),
        "first_offset": delivered.iter().map(|d| d.offset).min(),
        "last_offset": delivered.iter().map(|d| d.offset).max(),
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}
