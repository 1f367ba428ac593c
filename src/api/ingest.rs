//! `POST /api/v1/collections/{id}/records`: produce log records for clients without a
//! Kafka library.
//!
//! The body is one JSON object or an array of them, each shaped like a `sluice produce`
//! line (`id`, `operation`, `embedding`, `metadata`, `document`) without `collection`,
//! which comes from the path (an item may repeat it, but only with the same value). All
//! items are parsed and validated first ([`parse_items`], pure): the `[limits]` of the
//! config, and the embedding dimension against the collection's fixed dimension (or the
//! first embedding of the request when none is fixed yet); if **any** item is invalid,
//! nothing is produced and the response lists every problem by index.
//!
//! Valid requests are encoded and framed like `sluice produce` and produced to the log
//! topic keyed by the collection id (so murmur2 puts them on the collection's partition),
//! in request order, with the idempotent producer; the response (202) comes after every
//! record is acknowledged and gives the offsets. A record is materialized once the
//! collection's `log_position` reaches its offset. Delivery is at least once: a 503 after
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
use crate::record::jsonl;
use crate::record::validate::{validate, Limits};
use crate::record::LogRecord;

/// Parse and validate the items of a request for `collection` whose embedding dimension
/// is `dimension` (if fixed). Either every item becomes a log record, or every problem is
/// reported.
pub fn parse_items(
    items: &[Value],
    collection: &str,
    limits: &Limits,
    dimension: Option<usize>,
) -> Result<Vec<LogRecord>, Vec<ItemError>> {
    let mut records = Vec::with_capacity(items.len());
    let mut errors = Vec::new();
    let mut dimension = dimension;
    let fail = |index: usize, error: &str, message: String| ItemError { index, error: error.to_string(), message };
    for (index, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            errors.push(fail(index, "malformed", "expected a JSON object".into()));
            continue;
        };
        let mut obj = obj.clone();
        match obj.get("collection") {
            None => {
                obj.insert("collection".into(), Value::String(collection.to_string()));
            }
            Some(Value::String(c)) if c == collection => {}
            Some(other) => {
                errors.push(fail(
                    index,
                    "collection_mismatch",
                    format!("\"collection\" is {other} but the path names {collection:?} (leave the field out)"),
                ));
                continue;
            }
        }
        let record = match jsonl::parse_value(&Value::Object(obj)) {
            Ok(r) => r,
            Err(message) => {
                errors.push(fail(index, "malformed", message));
                continue;
            }
        };
        if let Err(e) = validate(&record, limits) {
            errors.push(fail(index, e.kind(), e.to_string()));
            continue;
        }
        if let Some(e) = &record.embedding {
            match dimension {
                Some(d) if d != e.len() => {
                    errors.push(fail(
                        index,
                        "dimension_mismatch",
                        format!("embedding has {} dimensions but collection {collection:?} has {d}", e.len()),
                    ));
                    continue;
                }
                Some(_) => {}
                None => dimension = Some(e.len()),
            }
        }
        records.push(record);
    }
    if errors.is_empty() {
        Ok(records)
    } else {
        Err(errors)
    }
}

/// The items of a request body: one JSON object or a non-empty array (pure; the items
/// are checked by [`parse_items`]). Also the entry point of the `http_records_body` fuzz
/// target.
pub fn parse_body(body: &[u8]) -> Result<Vec<Value>, HttpError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| HttpError::new(ErrorCode::BadJson, format!("the body is not valid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        v @ Value::Object(_) => vec![v],
        _ => {
            return Err(HttpError::new(
                ErrorCode::BadJson,
                "expected a JSON object (one record) or an array of objects",
            ))
        }
    };
    if items.is_empty() {
        return Err(HttpError::bad_request("the array holds no records"));
    }
    Ok(items)
}

/// The log message value of a record, framed as the config says (as `sluice produce`).
fn payload(config: &Config, record: &LogRecord) -> Vec<u8> {
    encode_framed(config.kafka.framing, config.writer_schema_id(), record)
}

pub async fn post_records(
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
    let body = json!({
        "collection": collection,
        "delivered": delivered.len(),
        "topic": topic,
        "partition": delivered.first().map(|d| d.partition),
        "first_offset": delivered.iter().map(|d| d.offset).min(),
        "last_offset": delivered.iter().map(|d| d.offset).max(),
    });
    Ok((StatusCode::ACCEPTED, Json(body)).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;

    fn items(json: &str) -> Vec<Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn items_take_the_collection_from_the_path() {
        let v = items(
            r#"[{"id":"a","operation":"upsert","embedding":[1,2],"metadata":{"k":1},"document":"d"},{"id":"b","operation":"delete","collection":"c"}]"#,
        );
        let recs = parse_items(&v, "c", &Limits::DEFAULT, None).unwrap();
        assert_eq!(recs.len(), 2);
        assert!(recs.iter().all(|r| r.collection_id == "c"));
        assert_eq!((recs[0].operation, recs[1].operation), (Operation::Upsert, Operation::Delete));
        assert_eq!(recs[0].embedding, Some(vec![1.0, 2.0]));
    }

    #[test]
    fn every_invalid_item_is_reported_by_index_and_kind() {
        let limits = Limits { max_id_bytes: 4, ..Limits::DEFAULT };
        let v = items(
            r#"[{"id":"ok","operation":"add"},
                7,
                {"id":"toolong","operation":"add"},
                {"id":"x","operation":"merge"},
                {"id":"y","operation":"add","collection":"other"},
                {"id":"z","operation":"add","embedding":[1,2,3]},
                {"id":"","operation":"add"},
                {"id":"w","operation":"add","extra":true}]"#,
        );
        let errors = parse_items(&v, "c", &limits, Some(2)).unwrap_err();
        let got: Vec<(usize, &str)> = errors.iter().map(|e| (e.index, e.error.as_str())).collect();
        assert_eq!(
            got,
            [
                (1, "malformed"),
                (2, "id_too_long"),
                (3, "malformed"),
                (4, "collection_mismatch"),
                (5, "dimension_mismatch"),
                (6, "empty_id"),
                (7, "malformed")
            ]
        );
        assert!(errors[2].message.contains("merge"), "{:?}", errors[2]);
        assert!(errors[6].message.contains("extra"), "{:?}", errors[6]);
    }

    #[test]
    fn the_first_embedding_fixes_the_dimension_of_a_new_collection() {
        let v = items(
            r#"[{"id":"a","operation":"add","embedding":[1,2]},{"id":"b","operation":"add","embedding":[1,2,3]}]"#,
        );
        let errors = parse_items(&v, "new", &Limits::DEFAULT, None).unwrap_err();
        assert_eq!(errors.len(), 1);
        assert_eq!((errors[0].index, errors[0].error.as_str()), (1, "dimension_mismatch"));
    }
}
