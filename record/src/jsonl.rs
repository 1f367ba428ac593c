//! The JSON-lines input of `sluice produce` and the JSON output of records.
//!
//! Input, one object per line:
//! `{"collection": str, "id": str, "operation": "add|update|upsert|delete",
//!   "embedding": [numbers]|null, "metadata": {str: str|int|float|bool|null}|null,
//!   "document": str|null}`.

use serde_json::{json, Map, Value};

use crate::{Embedding, Encoding, LogRecord, MetaValue, Metadata, Operation, Record};

/// Parse one input line into a log record (not yet validated against limits).
pub fn parse_line(line: &str) -> Result<LogRecord, String> {
    let v: Value = serde_json::from_str(line).map_err(|e| format!("not valid JSON: {e}"))?;
    parse_value(&v)
}

/// Parse one already-decoded input object (the admin API's `POST .../records` items).
pub fn parse_value(v: &Value) -> Result<LogRecord, String> {
    let obj = v.as_object().ok_or("expected a JSON object")?;
    for k in obj.keys() {
        if !["collection", "id", "operation", "embedding", "metadata", "document"].contains(&k.as_str()) {
            return Err(format!("unknown field {k:?}"));
        }
    }
    let s = |k: &str| -> Result<String, String> {
        obj.get(k).and_then(Value::as_str).map(str::to_string).ok_or_else(|| format!("field {k:?} must be a string"))
    };
    let operation = match s("operation")?.to_ascii_lowercase().as_str() {
        "add" => Operation::Add,
        "update" => Operation::Update,
        "upsert" => Operation::Upsert,
        "delete" => Operation::Delete,
        other => return Err(format!("operation {other:?} is not one of add, update, upsert, delete")),
    };
    let embedding = match obj.get("embedding") {
        None | Some(Value::Null) => None,
        Some(Value::Array(a)) => Some(
            a.iter()
                .enumerate()
                .map(|(i, x)| x.as_f64().map(|f| f as f32).ok_or_else(|| format!("embedding[{i}] is not a number")))
                .collect::<Result<Vec<f32>, String>>()?,
        ),
        Some(_) => return Err("embedding must be an array of numbers or null".into()),
    };
    let metadata = match obj.get("metadata") {
        None | Some(Value::Null) => None,
        Some(Value::Object(m)) => {
            Some(m.iter().map(|(k, v)| Ok((k.clone(), meta_from_json(k, v)?))).collect::<Result<Metadata, String>>()?)
        }
        Some(_) => return Err("metadata must be an object or null".into()),
    };
    let document = match obj.get("document") {
        None | Some(Value::Null) => None,
        Some(Value::String(d)) => Some(d.clone()),
        Some(_) => return Err("document must be a string or null".into()),
    };
    Ok(LogRecord {
        collection_id: s("collection")?,
        id: s("id")?,
        operation,
        embedding: embedding.map(Embedding::from),
        encoding: Encoding::Float32,
        metadata,
        document,
        backfill: None,
    })
}

fn meta_from_json(k: &str, v: &Value) -> Result<MetaValue, String> {
    Ok(match v {
        Value::Null => MetaValue::Null,
        Value::Bool(b) => MetaValue::Bool(*b),
        Value::String(s) => MetaValue::String(s.clone()),
        Value::Number(n) => match n.as_i64() {
            Some(i) => MetaValue::Long(i),
            None => MetaValue::Double(n.as_f64().ok_or_else(|| format!("metadata {k:?}: number out of range"))?),
        },
        _ => return Err(format!("metadata {k:?}: nested values are not supported")),
    })
}

pub fn meta_to_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::Null => Value::Null,
        MetaValue::Bool(b) => Value::Bool(*b),
        MetaValue::String(s) => Value::String(s.clone()),
        MetaValue::Long(i) => json!(i),
        MetaValue::Double(d) => serde_json::Number::from_f64(*d).map(Value::Number).unwrap_or(Value::Null),
    }
}

/// A materialized record as `{"id", "embedding", "metadata", "document"}`.
pub fn record_to_json(r: &Record) -> Value {
    let metadata: Map<String, Value> = r.metadata.iter().map(|(k, v)| (k.clone(), meta_to_json(v))).collect();
    json!({
        "id": r.id,
        "embedding": r.embedding,
        "metadata": if metadata.is_empty() { Value::Null } else { Value::Object(metadata) },
        "document": r.document,
    })
}

/// A materialized record serialized straight from the stored record, the same text as
/// [`record_to_json`] (with `"offset"` when asked for) but without building a JSON tree
/// first: a page of 1,000 W1 records is 384,000 embedding numbers, and a tree of them
/// was most of what a page read cost the replica. Keys in the order `record_to_json`'s
/// map writes them (sorted); each f32 written as the f64 it is, like the tree did.
pub struct RecordJson<'a> {
    pub record: &'a Record,
    pub with_offset: bool,
}

impl serde::Serialize for RecordJson<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        struct Floats<'a>(&'a Embedding);
        impl serde::Serialize for Floats<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.collect_seq(self.0.iter().map(f64::from))
            }
        }
        struct Meta<'a>(&'a Metadata);
        impl serde::Serialize for Meta<'_> {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                let mut m = serializer.serialize_map(Some(self.0.len()))?;
                for (k, v) in self.0.iter() {
                    match v {
                        MetaValue::Null => m.serialize_entry(k, &())?,
                        MetaValue::Bool(b) => m.serialize_entry(k, b)?,
                        MetaValue::String(s) => m.serialize_entry(k, s)?,
                        MetaValue::Long(i) => m.serialize_entry(k, i)?,
                        // A non-finite double is null, as `meta_to_json` makes it.
                        MetaValue::Double(d) if d.is_finite() => m.serialize_entry(k, d)?,
                        MetaValue::Double(_) => m.serialize_entry(k, &())?,
                    }
                }
                m.end()
            }
        }
        let r = self.record;
        let mut m = serializer.serialize_map(Some(4 + usize::from(self.with_offset)))?;
        m.serialize_entry("document", &r.document)?;
        m.serialize_entry("embedding", &r.embedding.as_ref().map(Floats))?;
        m.serialize_entry("id", &r.id)?;
        if r.metadata.is_empty() {
            m.serialize_entry("metadata", &())?;
        } else {
            m.serialize_entry("metadata", &Meta(&r.metadata))?;
        }
        if self.with_offset {
            m.serialize_entry("offset", &r.offset)?;
        }
        m.end()
    }
}

/// A log record as an input line (the inverse of [`parse_line`] for data records).
pub fn log_record_to_json(r: &LogRecord) -> Value {
    json!({
        "collection": r.collection_id,
        "id": r.id,
        "operation": r.operation.symbol().to_ascii_lowercase(),
        "embedding": r.embedding,
        "metadata": r.metadata.as_ref().map(|m| m.iter().map(|(k, v)| (k.clone(), meta_to_json(v))).collect::<Map<_, _>>()),
        "document": r.document,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_field_and_rejects_bad_lines() {
        let r = parse_line(r#"{"collection":"c","id":"1","operation":"upsert","embedding":[1,2.5],"metadata":{"a":1,"b":1.5,"c":"x","d":true,"e":null},"document":"doc"}"#).unwrap();
        assert_eq!(r.operation, Operation::Upsert);
        assert_eq!(r.embedding, Some(vec![1.0, 2.5].into()));
        let m = r.metadata.unwrap();
        assert_eq!(m.get("a"), Some(&MetaValue::Long(1)));
        assert_eq!(m.get("b"), Some(&MetaValue::Double(1.5)));
        assert_eq!(m.get("e"), Some(&MetaValue::Null));
        assert!(parse_line("{").is_err());
        assert!(parse_line(r#"{"collection":"c","id":"1","operation":"merge"}"#).unwrap_err().contains("merge"));
        assert!(parse_line(r#"{"collection":"c","id":"1","operation":"add","extra":1}"#)
            .unwrap_err()
            .contains("extra"));
        assert!(parse_line(r#"{"collection":"c","id":"1","operation":"add","embedding":["x"]}"#).is_err());
    }

    #[test]
    fn record_json_writes_the_same_text_as_the_json_tree() {
        let mut metadata = Metadata::new();
        metadata.insert("b".into(), MetaValue::Double(0.1));
        metadata.insert("a".into(), MetaValue::Long(-7));
        metadata.insert("c".into(), MetaValue::String("x\"y".into()));
        metadata.insert("d".into(), MetaValue::Bool(true));
        metadata.insert("e".into(), MetaValue::Double(f64::NAN));
        let full = Record {
            id: "r1".into(),
            embedding: Some(vec![0.1, -2.5, f32::MIN_POSITIVE, 1e30, f32::NAN, f32::INFINITY, 3.0].into()),
            metadata,
            document: Some("doc \u{e9}".into()),
            offset: 42,
        };
        let bare = Record { id: "r2".into(), embedding: None, metadata: Metadata::new(), document: None, offset: 0 };
        for r in [&full, &bare] {
            let tree = record_to_json(r);
            assert_eq!(
                serde_json::to_string(&RecordJson { record: r, with_offset: false }).unwrap(),
                serde_json::to_string(&tree).unwrap()
            );
            let mut with = tree.clone();
            with["offset"] = json!(r.offset);
            assert_eq!(
                serde_json::to_string(&RecordJson { record: r, with_offset: true }).unwrap(),
                serde_json::to_string(&with).unwrap()
            );
        }
    }

    #[test]
    fn round_trips_through_log_record_json() {
        let line =
            r#"{"collection":"c","id":"1","operation":"add","embedding":[0.5],"metadata":{"k":"v"},"document":null}"#;
        let r = parse_line(line).unwrap();
        assert_eq!(parse_line(&log_record_to_json(&r).to_string()).unwrap(), r);
    }
}
