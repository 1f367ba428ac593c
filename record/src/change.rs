//! The change feed's message contract (`docs/changes.md`): the key of a change, and its
//! value, a `sluice.v1.ChangeRecord` (`schemas/change_record.avsc`) holding the record as
//! it is after the change. A delete has no value (a tombstone), so that a compacted topic
//! keeps, per record, only its latest state.
//!
//! The key is the collection id, one NUL byte, then the record id. Validation refuses
//! U+0000 in every id (`validate.rs`), so the first NUL splits a key unambiguously, and
//! one record always has the same key (compaction keeps the latest per record).

use std::sync::OnceLock;

use apache_avro::types::Value;
use apache_avro::Schema;

use super::codec::{put_long, put_meta_value, put_str};
use super::{Embedding, MetaValue, Metadata, Record};

/// `schemas/change_record.avsc`.
pub const CHANGE_RECORD_SCHEMA_JSON: &str = include_str!("../../schemas/change_record.avsc");

/// The parsed `sluice.v1.ChangeRecord` schema.
pub fn change_record_schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| {
        Schema::parse_str(CHANGE_RECORD_SCHEMA_JSON)
            .unwrap_or_else(|e| panic!("embedded schemas/change_record.avsc does not parse: {e}"))
    })
}

/// The key of a change of record `id` of `collection_id`: `collection_id`, NUL, `id`.
pub fn change_key(collection_id: &str, id: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(collection_id.len() + 1 + id.len());
    key.extend_from_slice(collection_id.as_bytes());
    key.push(0);
    key.extend_from_slice(id.as_bytes());
    key
}

/// `(collection id, record id)` of a change key; `None` if it is not one.
pub fn split_change_key(key: &[u8]) -> Option<(&str, &str)> {
    let nul = key.iter().position(|b| *b == 0)?;
    let collection = std::str::from_utf8(&key[..nul]).ok()?;
    let id = std::str::from_utf8(&key[nul + 1..]).ok()?;
    Some((collection, id))
}

/// The `ChangeRecord` datum (no framing) of `record`, a record of `collection_id` after a
/// change. Metadata entries are written in key order, as one block.
pub fn encode_change(collection_id: &str, record: &Record) -> Vec<u8> {
    let metadata: usize = record
        .metadata
        .iter()
        .map(|(k, v)| 12 + k.len() + if let MetaValue::String(s) = v { s.len() } else { 0 })
        .sum();
    let hint = 32
        + collection_id.len()
        + record.id.len()
        + record.embedding.as_ref().map_or(0, |e| 4 * e.len())
        + record.document.as_ref().map_or(0, String::len)
        + metadata;
    let mut out = Vec::with_capacity(hint);
    put_str(&mut out, collection_id);
    put_str(&mut out, &record.id);
    match &record.embedding {
        None => put_long(&mut out, 0),
        Some(e) => {
            put_long(&mut out, 1);
            let bytes = e.as_le_bytes();
            put_long(&mut out, bytes.len() as i64);
            out.extend_from_slice(bytes);
        }
    }
    // The map's values have no null branch: a materialized record holds no null value
    // (one would be a bug upstream; it is written as an empty string rather than a
    // datum the schema cannot read).
    let entries: Vec<(&String, &MetaValue)> = record.metadata.iter().collect();
    if !entries.is_empty() {
        put_long(&mut out, entries.len() as i64);
        for (k, v) in entries {
            put_str(&mut out, k);
            let mut one = Vec::new();
            match v {
                MetaValue::Null => {
                    put_long(&mut out, 0);
                    put_str(&mut out, "");
                    continue;
                }
                other => put_meta_value(&mut one, other),
            }
            // `put_meta_value` writes the log schema's union index, whose branch 0 is
            // null: here the branches start at string, one lower.
            let (index, rest) = split_union_index(&one);
            put_long(&mut out, index - 1);
            out.extend_from_slice(rest);
        }
    }
    put_long(&mut out, 0);
    match &record.document {
        None => put_long(&mut out, 0),
        Some(d) => {
            put_long(&mut out, 1);
            put_str(&mut out, d);
        }
    }
    put_long(&mut out, record.offset);
    out
}

/// The union index (a one-byte zigzag long: 0..=4) and the rest of a value that
/// `put_meta_value` wrote.
fn split_union_index(bytes: &[u8]) -> (i64, &[u8]) {
    (i64::from(bytes[0] >> 1), &bytes[1..])
}

/// Why a change value could not be read.
#[derive(Debug, thiserror::Error)]
#[error("change record: {0}")]
pub struct ChangeDecodeError(String);

/// Read a `ChangeRecord` datum (apache-avro's generic path: for consumers, tests and
/// tools, not a hot path): `(collection id, record)`.
pub fn decode_change(mut datum: &[u8]) -> Result<(String, Record), ChangeDecodeError> {
    let bad = |m: String| ChangeDecodeError(m);
    let value =
        apache_avro::from_avro_datum(change_record_schema(), &mut datum, None).map_err(|e| bad(e.to_string()))?;
    if !datum.is_empty() {
        return Err(bad(format!("{} trailing bytes", datum.len())));
    }
    let Value::Record(fields) = value else { return Err(bad("not a record".into())) };
    let mut collection = None;
    let mut record =
        Record { id: String::new(), embedding: None, metadata: Metadata::new(), document: None, offset: -1 };
    for (name, v) in fields {
        let v = match v {
            Value::Union(_, inner) => *inner,
            other => other,
        };
        match (name.as_str(), v) {
            ("collection_id", Value::String(s)) => collection = Some(s),
            ("id", Value::String(s)) => record.id = s,
            ("embedding", Value::Bytes(b)) => {
                record.embedding = Some(
                    Embedding::from_le_bytes(bytes::Bytes::from(b))
                        .ok_or_else(|| bad("embedding length is not a multiple of 4".into()))?,
                )
            }
            ("embedding", Value::Null) | ("document", Value::Null) => {}
            ("metadata", Value::Map(m)) => {
                for (k, v) in m {
                    let v = match v {
                        Value::Union(_, inner) => *inner,
                        other => other,
                    };
                    let mv = match v {
                        Value::String(s) => MetaValue::String(s),
                        Value::Long(l) => MetaValue::Long(l),
                        Value::Double(d) => MetaValue::Double(d),
                        Value::Boolean(b) => MetaValue::Bool(b),
                        other => return Err(bad(format!("metadata {k:?}: unexpected {other:?}"))),
                    };
                    record.metadata.insert(k, mv);
                }
            }
            ("document", Value::String(s)) => record.document = Some(s),
            ("offset", Value::Long(o)) => record.offset = o,
            (name, other) => return Err(bad(format!("field {name}: unexpected {other:?}"))),
        }
    }
    Ok((collection.ok_or_else(|| bad("no collection_id".into()))?, record))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record {
        let mut metadata = Metadata::new();
        metadata.insert("b".into(), MetaValue::Bool(true));
        metadata.insert("d".into(), MetaValue::Double(-0.5));
        metadata.insert("l".into(), MetaValue::Long(-300));
        metadata.insert("s".into(), MetaValue::String("x".repeat(200)));
        Record {
            id: "r1".into(),
            embedding: Some(vec![0.5f32, -2.0, 3.25].into()),
            metadata,
            document: Some("doc".into()),
            offset: 12_345_678_901,
        }
    }

    #[test]
    fn the_hand_written_encoding_is_what_apache_avro_writes_and_reads() {
        for r in
            [record(), Record { id: "e".into(), embedding: None, metadata: Metadata::new(), document: None, offset: 0 }]
        {
            let datum = encode_change("coll", &r);
            let (c, back) = decode_change(&datum).unwrap();
            assert_eq!((c.as_str(), &back), ("coll", &r));
        }
        // apache-avro's own writer gives the same bytes (one metadata key: it writes a
        // map in its hash order).
        let mut one = record();
        one.metadata.retain(|k, _| k == "s");
        let datum = encode_change("coll", &one);
        let value = apache_avro::from_avro_datum(change_record_schema(), &mut &datum[..], None).unwrap();
        assert_eq!(apache_avro::to_avro_datum(change_record_schema(), value).unwrap(), datum);
    }

    #[test]
    fn keys_split_back_and_differ_per_record() {
        let k = change_key("c", "a\u{1}b");
        assert_eq!(split_change_key(&k), Some(("c", "a\u{1}b")));
        assert_ne!(change_key("ab", "c"), change_key("a", "bc"));
        assert_eq!(split_change_key(b"no separator"), None);
    }
}
