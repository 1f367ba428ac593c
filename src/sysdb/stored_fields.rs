//! How record fields are stored, identically on both backends.
//!
//! * **Embedding**: little-endian packed `f32` (`BLOB` / `BYTEA`), the same bytes the
//!   log record carries; every bit pattern round-trips (NaN payloads, -0.0, subnormals).
//! * **Metadata**: JSON text, an object of key → value, `NULL` when empty:
//!   - `String` → JSON string, `Bool` → JSON bool;
//!   - `Long` → JSON integer (`-9223372036854775808` … `9223372036854775807`);
//!   - finite `Double` → a JSON number always written with a fraction or an exponent
//!     (`1.0`, `-0.0`, `1e300`: serde_json's shortest round-trip form), so it reads back
//!     as a double; reading, a number that fits an `i64` is a `Long`, anything else a
//!     `Double`. serde_json's `float_roundtrip` feature makes parsing exact, so every
//!     finite `f64` reads back bit-identical;
//!   - non-finite `Double` (JSON has none) → `{"f64": "NaN" | "Infinity" | "-Infinity"}`
//!     (NaN payload bits are not kept);
//!   - `Null` ("remove the key" in a log record) never reaches a materialized record and
//!     is not written.

use serde::de::{self, Deserialize, Deserializer, MapAccess, Visitor};
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::Value;

use super::error::SysdbError;
use crate::record::{Embedding, MetaValue, Metadata, Record};

/// Tag of the object that carries a non-finite double.
const NON_FINITE_TAG: &str = "f64";

/// Little-endian packed f32: the embedding's own bytes, as decoded from the log.
pub(crate) fn encode_embedding(v: &Embedding) -> &[u8] {
    v.as_le_bytes()
}

/// The stored bytes as an embedding, without a copy.
pub(crate) fn decode_embedding(bytes: Vec<u8>) -> Result<Embedding, String> {
    let len = bytes.len();
    Embedding::from_le_bytes(bytes.into())
        .ok_or_else(|| format!("stored embedding has {len} bytes, not a multiple of 4"))
}

/// JSON text of `metadata`, `None` when it has no (non-null) key. Serialized straight
/// from the map (no intermediate `serde_json::Value` tree: this runs for every record
/// written); the output is identical to building the `Value` (tested).
pub(crate) fn encode_metadata(metadata: &Metadata) -> Option<String> {
    if metadata.values().all(|v| matches!(v, MetaValue::Null)) {
        return None;
    }
    Some(serde_json::to_string(&StoredMetadata(metadata)).expect("metadata serializes to JSON"))
}

struct StoredMetadata<'a>(&'a Metadata);

impl Serialize for StoredMetadata<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in self.0 {
            match v {
                MetaValue::Null => {}
                MetaValue::String(s) => map.serialize_entry(k, s)?,
                MetaValue::Long(i) => map.serialize_entry(k, i)?,
                MetaValue::Bool(b) => map.serialize_entry(k, b)?,
                MetaValue::Double(d) if d.is_finite() => map.serialize_entry(k, d)?,
                MetaValue::Double(d) => map.serialize_entry(k, &NonFinite(non_finite_name(*d)))?,
            }
        }
        map.end()
    }
}

fn non_finite_name(d: f64) -> &'static str {
    if d.is_nan() {
        "NaN"
    } else if d > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

/// `{"f64": "NaN" | "Infinity" | "-Infinity"}`.
struct NonFinite(&'static str);

impl Serialize for NonFinite {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(NON_FINITE_TAG, self.0)?;
        map.end()
    }
}

pub(crate) fn decode_metadata(text: Option<&str>) -> Result<Metadata, String> {
    let Some(text) = text else { return Ok(Metadata::new()) };
    let mut de = serde_json::Deserializer::from_str(text);
    let out = de.deserialize_map(MetadataVisitor).map_err(|e| {
        if e.is_data() {
            e.to_string()
        } else {
            format!("stored metadata is not JSON: {e}")
        }
    })?;
    de.end().map_err(|e| format!("stored metadata is not JSON: {e}"))?;
    Ok(out)
}

struct MetadataVisitor;

impl<'de> Visitor<'de> for MetadataVisitor {
    type Value = Metadata;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("stored metadata is not a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<Metadata, A::Error> {
        let mut out = Metadata::new();
        while let Some(k) = access.next_key::<String>()? {
            let v: StoredValue =
                access.next_value().map_err(|e| de::Error::custom(format!("metadata key {k:?}: {e}")))?;
            let meta = match v {
                StoredValue::Null => continue,
                StoredValue::Meta(m) => m,
            };
            out.insert(k, meta);
        }
        Ok(out)
    }
}

enum StoredValue {
    Null,
    Meta(MetaValue),
}

impl<'de> Deserialize<'de> for StoredValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StoredValueVisitor)
    }
}

struct StoredValueVisitor;

impl<'de> Visitor<'de> for StoredValueVisitor {
    type Value = StoredValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a string, number, boolean, null or a tagged non-finite double")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<StoredValue, E> {
        Ok(StoredValue::Meta(MetaValue::String(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<StoredValue, E> {
        Ok(StoredValue::Meta(MetaValue::String(v)))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<StoredValue, E> {
        Ok(StoredValue::Meta(MetaValue::Bool(v)))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<StoredValue, E> {
        Ok(StoredValue::Meta(MetaValue::Long(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<StoredValue, E> {
        // Beyond i64 it can only have been written as a double.
        Ok(StoredValue::Meta(i64::try_from(v).map_or(MetaValue::Double(v as f64), MetaValue::Long)))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<StoredValue, E> {
        Ok(StoredValue::Meta(MetaValue::Double(v)))
    }
    fn visit_unit<E: de::Error>(self) -> Result<StoredValue, E> {
        Ok(StoredValue::Null)
    }
    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<StoredValue, A::Error> {
        Err(de::Error::custom("unexpected array value"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut access: A) -> Result<StoredValue, A::Error> {
        // Like a lookup of the "f64" key: other keys are ignored.
        let mut tag: Option<String> = None;
        while let Some(k) = access.next_key::<String>()? {
            if k == NON_FINITE_TAG && tag.is_none() {
                if let serde_json::Value::String(s) = access.next_value::<serde_json::Value>()? {
                    tag = Some(s);
                }
            } else {
                access.next_value::<de::IgnoredAny>()?;
            }
        }
        let d = match tag.as_deref() {
            Some("NaN") => f64::NAN,
            Some("Infinity") => f64::INFINITY,
            Some("-Infinity") => f64::NEG_INFINITY,
            _ => return Err(de::Error::custom("unexpected object value")),
        };
        Ok(StoredValue::Meta(MetaValue::Double(d)))
    }
}

/// JSON text of a function's parameters (an object of strings).
pub(crate) fn encode_params(params: &std::collections::BTreeMap<String, String>) -> String {
    Value::Object(params.iter().map(|(k, v)| (k.clone(), Value::String(v.clone()))).collect()).to_string()
}

pub(crate) fn decode_params(text: &str) -> Result<std::collections::BTreeMap<String, String>, String> {
    serde_json::from_str(text).map_err(|e| format!("stored parameters are not a JSON object of strings: {e}"))
}

/// A stored row back into a [`Record`]; a value that does not decode is a `Database`
/// error naming the record (it can only come from a corrupted or foreign write).
pub(crate) fn decode_record(
    backend: &'static str,
    id: String,
    embedding: Option<Vec<u8>>,
    metadata: Option<String>,
    document: Option<String>,
    offset: i64,
) -> Result<Record, SysdbError> {
    let bad = |message: String| SysdbError::Database { backend, message: format!("record {id:?}: {message}") };
    let embedding = match embedding {
        Some(bytes) => Some(decode_embedding(bytes).map_err(bad)?),
        None => None,
    };
    let metadata = decode_metadata(metadata.as_deref()).map_err(bad)?;
    Ok(Record { id, embedding, metadata, document, offset })
}

/// Metadata equality where doubles compare by bits (`-0.0 != 0.0`, `NaN == NaN`):
/// what "round-trips exactly" means.
#[cfg(any(test, feature = "testkit"))]
pub(crate) fn metadata_bit_eq(a: &Metadata, b: &Metadata) -> bool {
    a.len() == b.len()
        && a.iter().zip(b.iter()).all(|((ka, va), (kb, vb))| {
            ka == kb
                && match (va, vb) {
                    (MetaValue::Double(x), MetaValue::Double(y)) => {
                        x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
                    }
                    _ => va == vb,
                }
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The straightforward `Value`-tree encoding: the oracle of the serializer above.
    fn encode_metadata_via_value(metadata: &Metadata) -> Option<String> {
        let mut map = serde_json::Map::new();
        for (k, v) in metadata {
            let json = match v {
                MetaValue::Null => continue,
                MetaValue::String(s) => Value::String(s.clone()),
                MetaValue::Long(i) => Value::Number(serde_json::Number::from(*i)),
                MetaValue::Bool(b) => Value::Bool(*b),
                MetaValue::Double(d) => match serde_json::Number::from_f64(*d) {
                    Some(n) => Value::Number(n),
                    None => {
                        let name = if d.is_nan() {
                            "NaN"
                        } else if *d > 0.0 {
                            "Infinity"
                        } else {
                            "-Infinity"
                        };
                        let mut tagged = serde_json::Map::new();
                        tagged.insert(NON_FINITE_TAG.to_string(), Value::String(name.to_string()));
                        Value::Object(tagged)
                    }
                },
            };
            map.insert(k.clone(), json);
        }
        if map.is_empty() {
            return None;
        }
        Some(Value::Object(map).to_string())
    }

    fn decode_metadata_via_value(text: Option<&str>) -> Result<Metadata, String> {
        let mut out = Metadata::new();
        let Some(text) = text else { return Ok(out) };
        let value: Value = serde_json::from_str(text).map_err(|e| format!("stored metadata is not JSON: {e}"))?;
        let Value::Object(map) = value else {
            return Err("stored metadata is not a JSON object".to_string());
        };
        for (k, v) in map {
            let meta = match v {
                Value::String(s) => MetaValue::String(s),
                Value::Bool(b) => MetaValue::Bool(b),
                Value::Number(n) => match n.as_i64() {
                    Some(i) => MetaValue::Long(i),
                    None => MetaValue::Double(
                        n.as_f64().ok_or_else(|| format!("metadata key {k:?}: number {n} out of range"))?,
                    ),
                },
                Value::Object(tagged) => match tagged.get(NON_FINITE_TAG).and_then(Value::as_str) {
                    Some("NaN") => MetaValue::Double(f64::NAN),
                    Some("Infinity") => MetaValue::Double(f64::INFINITY),
                    Some("-Infinity") => MetaValue::Double(f64::NEG_INFINITY),
                    _ => return Err(format!("metadata key {k:?}: unexpected object value")),
                },
                Value::Null => continue,
                Value::Array(_) => return Err(format!("metadata key {k:?}: unexpected array value")),
            };
            out.insert(k, meta);
        }
        Ok(out)
    }

    fn one(v: MetaValue) -> Metadata {
        let mut m = Metadata::new();
        m.insert("k".to_string(), v);
        m
    }

    fn round_trip(m: &Metadata) -> Metadata {
        decode_metadata(encode_metadata(m).as_deref()).unwrap()
    }

    #[test]
    fn integral_doubles_stay_doubles_and_longs_stay_longs() {
        for d in [1.0, -0.0, 0.0, 1e300, -1e-300, 9007199254740993.0, 1e16, f64::MAX, f64::MIN_POSITIVE, 5e-324] {
            let m = one(MetaValue::Double(d));
            assert!(metadata_bit_eq(&round_trip(&m), &m), "{d:e} -> {:?}", encode_metadata(&m));
        }
        for i in [i64::MIN, i64::MAX, 0, -1, 1 << 53] {
            let m = one(MetaValue::Long(i));
            assert_eq!(round_trip(&m), m);
        }
        assert_eq!(encode_metadata(&one(MetaValue::Double(1.0))).unwrap(), r#"{"k":1.0}"#);
        assert_eq!(encode_metadata(&one(MetaValue::Double(-0.0))).unwrap(), r#"{"k":-0.0}"#);
    }

    #[test]
    fn non_finite_doubles_are_tagged() {
        for d in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            let m = one(MetaValue::Double(d));
            assert!(metadata_bit_eq(&round_trip(&m), &m), "{d}");
        }
    }

    #[test]
    fn empty_and_null_only_metadata_is_stored_as_null() {
        assert_eq!(encode_metadata(&Metadata::new()), None);
        assert_eq!(encode_metadata(&one(MetaValue::Null)), None);
        assert_eq!(decode_metadata(None).unwrap(), Metadata::new());
    }

    #[test]
    fn corrupt_values_are_errors() {
        assert!(decode_metadata(Some("[1]")).is_err());
        assert!(decode_metadata(Some("{\"k\":[1]}")).is_err());
        assert!(decode_metadata(Some("nope")).is_err());
        assert!(decode_embedding(vec![0, 0, 0]).is_err());
    }

    #[test]
    fn params_round_trip() {
        let p = std::collections::BTreeMap::from([
            ("k".to_string(), "v \" ☃".to_string()),
            ("a".to_string(), String::new()),
        ]);
        assert_eq!(decode_params(&encode_params(&p)).unwrap(), p);
        assert_eq!(encode_params(&std::collections::BTreeMap::new()), "{}");
        assert!(decode_params("{\"k\":1}").is_err());
    }

    #[test]
    fn embeddings_keep_every_bit() {
        let v = [f32::from_bits(0x7fc0_1234), -0.0, f32::MIN_POSITIVE / 2.0, f32::MAX, f32::NEG_INFINITY, 0.1];
        let back = decode_embedding(encode_embedding(&v[..].into()).to_vec()).unwrap();
        assert_eq!(
            back.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
    }

    proptest! {
        #[test]
        fn every_finite_double_and_every_long_round_trips(d in any::<f64>().prop_filter("finite", |d| d.is_finite()), i in any::<i64>(), s in ".*", b in any::<bool>()) {
            let mut m = Metadata::new();
            m.insert("d".into(), MetaValue::Double(d));
            m.insert("i".into(), MetaValue::Long(i));
            m.insert("s".into(), MetaValue::String(s));
            m.insert("b".into(), MetaValue::Bool(b));
            let back = round_trip(&m);
            prop_assert!(metadata_bit_eq(&back, &m), "{:?} -> {:?}", m, back);
        }

        #[test]
        fn the_direct_codec_matches_the_value_tree(entries in proptest::collection::vec((".{0,6}", 0u8..6, any::<u64>(), ".{0,8}"), 0..6)) {
            let mut m = Metadata::new();
            for (k, kind, bits, s) in entries {
                let v = match kind {
                    0 => MetaValue::Null,
                    1 => MetaValue::String(s),
                    2 => MetaValue::Long(bits as i64),
                    3 => MetaValue::Bool(bits % 2 == 0),
                    4 => MetaValue::Double(f64::from_bits(bits)),
                    _ => MetaValue::Double([f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -0.0][(bits % 4) as usize]),
                };
                m.insert(k, v);
            }
            let text = encode_metadata(&m);
            prop_assert_eq!(&text, &encode_metadata_via_value(&m));
            let a = decode_metadata(text.as_deref()).unwrap();
            let b = decode_metadata_via_value(text.as_deref()).unwrap();
            prop_assert!(metadata_bit_eq(&a, &b), "{:?} vs {:?}", a, b);
        }

        #[test]
        fn every_double_bit_pattern_that_is_finite_round_trips(bits in any::<u64>()) {
            let d = f64::from_bits(bits);
            prop_assume!(d.is_finite());
            let m = one(MetaValue::Double(d));
            prop_assert!(metadata_bit_eq(&round_trip(&m), &m));
        }
    }
}
