//! The JSON items of a records request (`POST /api/v1/collections/{id}/records`): a body of
//! one JSON object or an array of them, each shaped like a `sluice produce` line without
//! `collection` (the path names it). Pure: the admin API produces what comes out, and the
//! `http_records_body` fuzz target feeds it arbitrary bytes.

use serde::Serialize;
use serde_json::Value;

use crate::jsonl;
use crate::validate::{validate, Limits};
use crate::LogRecord;

/// What is wrong with one item of a request body (a record of `POST .../records`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ItemError {
    /// 0-based position in the request's array (0 for a single object).
    pub index: usize,
    /// Stable: a validation kind (`id_too_long`, ... as in DLQ reasons), `malformed`,
    /// `collection_mismatch`, `dimension_mismatch` or `not_delivered`.
    pub error: String,
    pub message: String,
}

/// Why a request body holds no items.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// Not JSON, or JSON that is neither an object nor an array.
    #[error("{0}")]
    NotJson(String),
    /// An empty array.
    #[error("the array holds no records")]
    Empty,
}

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

/// The items of a request body: one JSON object or a non-empty array (the items are
/// checked by [`parse_items`]).
pub fn parse_body(body: &[u8]) -> Result<Vec<Value>, BodyError> {
    let value: Value =
        serde_json::from_slice(body).map_err(|e| BodyError::NotJson(format!("the body is not valid JSON: {e}")))?;
    let items = match value {
        Value::Array(items) => items,
        v @ Value::Object(_) => vec![v],
        _ => return Err(BodyError::NotJson("expected a JSON object (one record) or an array of objects".into())),
    };
    if items.is_empty() {
        return Err(BodyError::Empty);
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Operation;

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
        assert_eq!(recs[0].embedding, Some(vec![1.0, 2.0].into()));
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
