//! The Avro schemas (`schemas/*.avsc`, embedded at build time) and apache-avro's generic
//! path for them: `LogRecord` <-> `apache_avro::types::Value`, generic encode/decode with
//! schema resolution, and the `BackfillTask` codec.
//!
//! The generic path is not the processor's hot path ([`super::codec`] is): it is the oracle
//! for the hand-written codec's property tests, the baseline of `record/benches/decode.rs`, the
//! way to read data written with an older schema version, and the codec of backfill tasks
//! (one per marker, not hot).

use std::collections::HashMap;
use std::sync::OnceLock;

use apache_avro::rabin::Rabin;
use apache_avro::schema_compatibility::SchemaCompatibility;
use apache_avro::types::Value;
use apache_avro::Schema;

use super::{BackfillRef, BackfillTask, Embedding, Encoding, LogRecord, MetaValue, Metadata, Operation};

/// `schemas/log_record.avsc`, the contract for producers in any language.
pub const LOG_RECORD_SCHEMA_JSON: &str = include_str!("../../schemas/log_record.avsc");
/// `schemas/backfill_task.avsc`.
pub const BACKFILL_TASK_SCHEMA_JSON: &str = include_str!("../../schemas/backfill_task.avsc");

/// The parsed `sluice.v1.LogRecord` schema.
pub fn log_record_schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| parse_embedded(LOG_RECORD_SCHEMA_JSON, "log_record.avsc"))
}

/// The parsed `sluice.v1.BackfillTask` schema.
pub fn backfill_task_schema() -> &'static Schema {
    static SCHEMA: OnceLock<Schema> = OnceLock::new();
    SCHEMA.get_or_init(|| parse_embedded(BACKFILL_TASK_SCHEMA_JSON, "backfill_task.avsc"))
}

fn parse_embedded(json: &str, file: &str) -> Schema {
    // The text is compiled into the binary and parsed by a unit test, so a failure here
    // is a build defect, not a runtime condition.
    Schema::parse_str(json).unwrap_or_else(|e| panic!("embedded schemas/{file} does not parse: {e}"))
}

/// The 64-bit Rabin fingerprint (CRC-64-AVRO) of the schema's Parsing Canonical Form, as
/// the Avro specification and Java's `SchemaNormalization.parsingFingerprint64` define it.
pub fn rabin_fingerprint(schema: &Schema) -> u64 {
    // apache-avro returns the fingerprint as its 8 little-endian bytes.
    let fp = schema.fingerprint::<Rabin>();
    let mut le = [0u8; 8];
    for (dst, src) in le.iter_mut().zip(fp.bytes.iter()) {
        *dst = *src;
    }
    u64::from_le_bytes(le)
}

/// Rabin fingerprint of [`log_record_schema`].
pub fn log_record_fingerprint() -> u64 {
    static FP: OnceLock<u64> = OnceLock::new();
    *FP.get_or_init(|| rabin_fingerprint(log_record_schema()))
}

/// Rabin fingerprint of [`backfill_task_schema`].
pub fn backfill_task_fingerprint() -> u64 {
    static FP: OnceLock<u64> = OnceLock::new();
    *FP.get_or_init(|| rabin_fingerprint(backfill_task_schema()))
}

/// A `Value` that does not have the shape of the Sluice record it is converted to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValueError {
    #[error("expected an Avro record, found {found}")]
    NotARecord { found: String },
    #[error("record has no field `{field}`")]
    MissingField { field: &'static str },
    #[error("field `{field}`: expected {expected}, found {found}")]
    WrongType { field: &'static str, expected: &'static str, found: String },
    #[error("field `{field}`: unknown enum symbol `{symbol}`")]
    UnknownSymbol { field: &'static str, symbol: String },
    #[error("embedding of {len} bytes is not a multiple of 4")]
    EmbeddingNotMultipleOf4 { len: usize },
}

/// Errors of the generic (apache-avro) path.
#[derive(Debug, thiserror::Error)]
pub enum GenericError {
    #[error("apache-avro: {0}")]
    Avro(#[from] apache_avro::Error),
    #[error(transparent)]
    Value(#[from] ValueError),
    #[error("{count} trailing bytes after the datum")]
    TrailingBytes { count: usize },
    #[error("the datum ends early: reading it needed bytes past its end")]
    Truncated,
    #[error("data written with the writer schema cannot be read with the reader schema: {0}")]
    Incompatible(#[from] apache_avro::error::CompatibilityError),
}

// ---------------------------------------------------------------------------------------
// LogRecord <-> Value
// ---------------------------------------------------------------------------------------

fn union(index: u32, value: Value) -> Value {
    Value::Union(index, Box::new(value))
}

/// Converts a record to the generic `Value` of `schemas/log_record.avsc`.
pub fn log_record_to_value(r: &LogRecord) -> Value {
    let op = r.operation;
    let embedding = match &r.embedding {
        None => union(0, Value::Null),
        Some(e) => union(1, Value::Bytes(e.as_le_bytes().to_vec())),
    };
    let metadata = match &r.metadata {
        None => union(0, Value::Null),
        Some(m) => {
            let map: HashMap<String, Value> = m.iter().map(|(k, v)| (k.clone(), meta_to_value(v))).collect();
            union(1, Value::Map(map))
        }
    };
    let document = match &r.document {
        None => union(0, Value::Null),
        Some(d) => union(1, Value::String(d.clone())),
    };
    let backfill = match &r.backfill {
        None => union(0, Value::Null),
        Some(b) => union(
            1,
            Value::Record(vec![
                ("request_id".into(), Value::String(b.request_id.clone())),
                ("function_id".into(), Value::String(b.function_id.clone())),
            ]),
        ),
    };
    Value::Record(vec![
        ("collection_id".into(), Value::String(r.collection_id.clone())),
        ("id".into(), Value::String(r.id.clone())),
        ("operation".into(), Value::Enum(op.avro_index(), op.symbol().into())),
        ("embedding".into(), embedding),
        ("encoding".into(), Value::Enum(0, "FLOAT32".into())),
        ("metadata".into(), metadata),
        ("document".into(), document),
        ("backfill".into(), backfill),
    ])
}

fn meta_to_value(v: &MetaValue) -> Value {
    match v {
        MetaValue::Null => union(0, Value::Null),
        MetaValue::String(s) => union(1, Value::String(s.clone())),
        MetaValue::Long(l) => union(2, Value::Long(*l)),
        MetaValue::Double(d) => union(3, Value::Double(*d)),
        MetaValue::Bool(b) => union(4, Value::Boolean(*b)),
    }
}

fn kind_of(v: &Value) -> String {
    // The variant name only: a Debug dump of a 6 KB embedding is no help in an error.
    let dbg = format!("{v:?}");
    dbg.split(['(', ' ', '{']).next().unwrap_or("?").to_string()
}

/// A decoded union is `Union(branch, value)`; the branch is implied by the value.
fn strip_union(v: Value) -> Value {
    match v {
        Value::Union(_, inner) => *inner,
        other => other,
    }
}

fn record_fields(v: Value) -> Result<HashMap<String, Value>, ValueError> {
    match v {
        Value::Record(fields) => Ok(fields.into_iter().collect()),
        other => Err(ValueError::NotARecord { found: kind_of(&other) }),
    }
}

fn take(fields: &mut HashMap<String, Value>, field: &'static str) -> Result<Value, ValueError> {
    fields.remove(field).map(strip_union).ok_or(ValueError::MissingField { field })
}

fn take_string(fields: &mut HashMap<String, Value>, field: &'static str) -> Result<String, ValueError> {
    match take(fields, field)? {
        Value::String(s) => Ok(s),
        other => Err(ValueError::WrongType { field, expected: "string", found: kind_of(&other) }),
    }
}

fn take_long(fields: &mut HashMap<String, Value>, field: &'static str) -> Result<i64, ValueError> {
    match take(fields, field)? {
        Value::Long(l) | Value::TimestampMillis(l) => Ok(l),
        Value::Int(i) => Ok(i64::from(i)),
        other => Err(ValueError::WrongType { field, expected: "long", found: kind_of(&other) }),
    }
}

fn take_symbol(fields: &mut HashMap<String, Value>, field: &'static str) -> Result<String, ValueError> {
    match take(fields, field)? {
        Value::Enum(_, symbol) => Ok(symbol),
        other => Err(ValueError::WrongType { field, expected: "enum", found: kind_of(&other) }),
    }
}

/// Converts a generic `Value` (as decoded, or resolved to the current schema) to a record.
/// Fields are looked up by name; enum values by symbol.
pub fn log_record_from_value(v: Value) -> Result<LogRecord, ValueError> {
    let mut f = record_fields(v)?;
    let collection_id = take_string(&mut f, "collection_id")?;
    let id = take_string(&mut f, "id")?;
    let symbol = take_symbol(&mut f, "operation")?;
    let operation = Operation::ALL
        .into_iter()
        .find(|op| op.symbol() == symbol)
        .ok_or(ValueError::UnknownSymbol { field: "operation", symbol })?;
    let embedding = match take(&mut f, "embedding")? {
        Value::Null => None,
        Value::Bytes(b) => {
            let len = b.len();
            Some(Embedding::from_le_bytes(b.into()).ok_or(ValueError::EmbeddingNotMultipleOf4 { len })?)
        }
        other => {
            return Err(ValueError::WrongType { field: "embedding", expected: "null or bytes", found: kind_of(&other) })
        }
    };
    let encoding = match take_symbol(&mut f, "encoding")?.as_str() {
        "FLOAT32" => Encoding::Float32,
        symbol => return Err(ValueError::UnknownSymbol { field: "encoding", symbol: symbol.into() }),
    };
    let metadata = match take(&mut f, "metadata")? {
        Value::Null => None,
        Value::Map(m) => {
            let mut out = Metadata::new();
            for (k, v) in m {
                out.insert(k, meta_from_value(v)?);
            }
            Some(out)
        }
        other => {
            return Err(ValueError::WrongType { field: "metadata", expected: "null or map", found: kind_of(&other) })
        }
    };
    let document = match take(&mut f, "document")? {
        Value::Null => None,
        Value::String(s) => Some(s),
        other => {
            return Err(ValueError::WrongType { field: "document", expected: "null or string", found: kind_of(&other) })
        }
    };
    let backfill = match take(&mut f, "backfill")? {
        Value::Null => None,
        rec @ Value::Record(_) => {
            let mut b = record_fields(rec)?;
            Some(BackfillRef {
                request_id: take_string(&mut b, "request_id")?,
                function_id: take_string(&mut b, "function_id")?,
            })
        }
        other => {
            return Err(ValueError::WrongType { field: "backfill", expected: "null or record", found: kind_of(&other) })
        }
    };
    Ok(LogRecord { collection_id, id, operation, embedding, encoding, metadata, document, backfill })
}

fn meta_from_value(v: Value) -> Result<MetaValue, ValueError> {
    Ok(match strip_union(v) {
        Value::Null => MetaValue::Null,
        Value::String(s) => MetaValue::String(s),
        Value::Long(l) => MetaValue::Long(l),
        Value::Int(i) => MetaValue::Long(i64::from(i)),
        Value::Double(d) => MetaValue::Double(d),
        Value::Float(x) => MetaValue::Double(f64::from(x)),
        Value::Boolean(b) => MetaValue::Bool(b),
        other => {
            return Err(ValueError::WrongType {
                field: "metadata.value",
                expected: "null, string, long, double or boolean",
                found: kind_of(&other),
            })
        }
    })
}

// ---------------------------------------------------------------------------------------
// Generic encode / decode
// ---------------------------------------------------------------------------------------

/// Encodes through apache-avro (`Value` + `to_avro_datum`, which validates the value).
pub fn encode_generic(r: &LogRecord) -> Result<Vec<u8>, GenericError> {
    Ok(apache_avro::to_avro_datum(log_record_schema(), log_record_to_value(r))?)
}

/// Decodes datums written with one writer schema into the current `LogRecord` shape.
///
/// Compatibility is checked once, at construction. When the writer schema is the current
/// schema (same Parsing Canonical Form) no per-datum resolution happens at all.
pub struct GenericDecoder {
    writer: Schema,
    /// `None` when the writer schema is the reader schema.
    reader: Option<Schema>,
}

impl GenericDecoder {
    /// A decoder for datums written with `writer`, read as `reader`.
    pub fn new(writer: Schema, reader: &Schema) -> Result<Self, GenericError> {
        SchemaCompatibility::can_read(&writer, reader)?;
        let same = writer.canonical_form() == reader.canonical_form();
        Ok(GenericDecoder { writer, reader: (!same).then(|| reader.clone()) })
    }

    /// A decoder for `LogRecord`s written with `writer`, read as the current schema.
    pub fn for_log_records(writer: Schema) -> Result<Self, GenericError> {
        Self::new(writer, log_record_schema())
    }

    /// The decoder for datums written with the current `LogRecord` schema.
    pub fn current() -> &'static GenericDecoder {
        static DECODER: OnceLock<GenericDecoder> = OnceLock::new();
        DECODER.get_or_init(|| GenericDecoder { writer: log_record_schema().clone(), reader: None })
    }

    /// Decodes one datum to a `Value` shaped by the reader schema, consuming all bytes.
    pub fn decode_value(&self, mut bytes: &[u8]) -> Result<Value, GenericError> {
        let value = apache_avro::from_avro_datum(&self.writer, &mut bytes, self.reader.as_ref())?;
        if !bytes.is_empty() {
            return Err(GenericError::TrailingBytes { count: bytes.len() });
        }
        Ok(value)
    }

    /// Decodes one `LogRecord` datum, consuming all bytes.
    pub fn decode(&self, bytes: &[u8]) -> Result<LogRecord, GenericError> {
        Ok(log_record_from_value(self.decode_value(bytes)?)?)
    }

    /// [`Self::decode`] that also refuses a datum cut short. apache-avro accepts some
    /// reads past the end of its input (a string's bytes, a varint), so the datum is
    /// decoded with guard bytes behind it: a decoder that touched one read past the end.
    /// For writer schemas from a registry, where nothing else checks the bytes.
    pub fn decode_strict(&self, bytes: &[u8]) -> Result<LogRecord, GenericError> {
        const GUARD: usize = 8;
        let mut padded = Vec::with_capacity(bytes.len() + GUARD);
        padded.extend_from_slice(bytes);
        padded.extend_from_slice(&[0u8; GUARD]);
        let mut rest = padded.as_slice();
        let value = apache_avro::from_avro_datum(&self.writer, &mut rest, self.reader.as_ref())?;
        match rest.len() {
            GUARD => Ok(log_record_from_value(value)?),
            n if n > GUARD => Err(GenericError::TrailingBytes { count: n - GUARD }),
            _ => Err(GenericError::Truncated),
        }
    }
}

/// Decodes a datum written with the current schema through apache-avro.
pub fn decode_generic(bytes: &[u8]) -> Result<LogRecord, GenericError> {
    GenericDecoder::current().decode(bytes)
}

// ---------------------------------------------------------------------------------------
// Writer schemas named by a schema registry
// ---------------------------------------------------------------------------------------

/// The schema id a record's Confluent header names, as the registry gave it.
pub type SchemaId = u32;

/// How records written with one writer schema (found in a schema registry by its id) are
/// decoded into `LogRecord`s: with the hand-written codec when the writer schema is the
/// schema that codec was written for (same Parsing Canonical Form fingerprint), else with
/// apache-avro's schema resolution into the current schema, or not at all when the writer
/// schema cannot be resolved to it.
#[derive(Debug)]
pub enum WriterDecoder {
    /// The writer schema is `schemas/log_record.avsc` (up to docs and formatting).
    Fast,
    /// Another schema the current one can read (an older or newer version).
    Resolve(Box<GenericDecoder>),
    /// A schema the current one cannot read, with why.
    Incompatible(String),
}

impl std::fmt::Debug for GenericDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GenericDecoder").field("resolving", &self.reader.is_some()).finish()
    }
}

/// Why a record could not be decoded with its writer schema.
#[derive(Debug, thiserror::Error)]
pub enum WriterDecodeError {
    #[error(transparent)]
    Fast(#[from] super::codec::DecodeError),
    #[error("decoding with the writer schema: {0}")]
    Resolve(#[from] GenericError),
    #[error("the writer schema cannot be read as sluice.v1.LogRecord: {0}")]
    Incompatible(String),
}

/// DLQ kind of a record whose writer schema cannot be resolved to the current schema.
pub const INCOMPATIBLE_SCHEMA: &str = "incompatible_schema";

impl WriterDecodeError {
    /// Stable snake_case label, used as the DLQ reason.
    pub fn kind(&self) -> &'static str {
        match self {
            WriterDecodeError::Fast(e) => e.kind(),
            WriterDecodeError::Resolve(GenericError::TrailingBytes { .. }) => "trailing_bytes",
            WriterDecodeError::Resolve(GenericError::Truncated) => "truncated",
            WriterDecodeError::Resolve(GenericError::Value(_)) => "invalid_value",
            WriterDecodeError::Resolve(GenericError::Avro(_)) => "malformed_datum",
            WriterDecodeError::Resolve(GenericError::Incompatible(_)) | WriterDecodeError::Incompatible(_) => {
                INCOMPATIBLE_SCHEMA
            }
        }
    }
}

impl WriterDecoder {
    /// The decoder for records written with the schema whose JSON text is `schema_json`.
    pub fn from_json(schema_json: &str) -> WriterDecoder {
        match Schema::parse_str(schema_json) {
            Ok(schema) => WriterDecoder::for_writer(schema),
            Err(e) => WriterDecoder::Incompatible(format!("the writer schema does not parse: {e}")),
        }
    }

    /// The decoder for records written with `writer`.
    pub fn for_writer(writer: Schema) -> WriterDecoder {
        if rabin_fingerprint(&writer) == log_record_fingerprint() {
            return WriterDecoder::Fast;
        }
        match GenericDecoder::for_log_records(writer) {
            Ok(d) => WriterDecoder::Resolve(Box::new(d)),
            Err(e) => WriterDecoder::Incompatible(e.to_string()),
        }
    }

    /// Decodes one datum (all its bytes) written with this decoder's writer schema.
    pub fn decode(&self, datum: &[u8]) -> Result<LogRecord, WriterDecodeError> {
        match self {
            WriterDecoder::Fast => Ok(super::codec::decode(datum)?),
            WriterDecoder::Resolve(d) => Ok(d.decode_strict(datum)?),
            WriterDecoder::Incompatible(why) => Err(WriterDecodeError::Incompatible(why.clone())),
        }
    }

    /// [`WriterDecoder::decode`] of a datum held in shared bytes: with the hand-written
    /// codec, the embedding is a slice of `datum` ([`super::codec::decode_shared`]).
    pub fn decode_shared(&self, datum: &bytes::Bytes) -> Result<LogRecord, WriterDecodeError> {
        match self {
            WriterDecoder::Fast => Ok(super::codec::decode_shared(datum)?),
            _ => self.decode(datum),
        }
    }
}

/// The writer schemas of one batch, by id, all found before the batch is decoded.
pub type WriterSchemas = HashMap<SchemaId, std::sync::Arc<WriterDecoder>>;

// ---------------------------------------------------------------------------------------
// BackfillTask
// ---------------------------------------------------------------------------------------

/// Converts a backfill task to the generic `Value` of `schemas/backfill_task.avsc`.
pub fn backfill_task_to_value(t: &BackfillTask) -> Value {
    Value::Record(vec![
        ("request_id".into(), Value::String(t.request_id.clone())),
        ("function_id".into(), Value::String(t.function_id.clone())),
        ("collection_id".into(), Value::String(t.collection_id.clone())),
        ("topic".into(), Value::String(t.topic.clone())),
        ("partition".into(), Value::Int(t.partition)),
        ("marker_offset".into(), Value::Long(t.marker_offset)),
        ("produced_at_ms".into(), Value::TimestampMillis(t.produced_at_ms)),
    ])
}

/// Converts a decoded `Value` to a backfill task.
pub fn backfill_task_from_value(v: Value) -> Result<BackfillTask, ValueError> {
    let mut f = record_fields(v)?;
    let partition = match take(&mut f, "partition")? {
        Value::Int(p) => p,
        other => return Err(ValueError::WrongType { field: "partition", expected: "int", found: kind_of(&other) }),
    };
    Ok(BackfillTask {
        request_id: take_string(&mut f, "request_id")?,
        function_id: take_string(&mut f, "function_id")?,
        collection_id: take_string(&mut f, "collection_id")?,
        topic: take_string(&mut f, "topic")?,
        partition,
        marker_offset: take_long(&mut f, "marker_offset")?,
        produced_at_ms: take_long(&mut f, "produced_at_ms")?,
    })
}

/// Encodes a backfill task datum (no framing).
pub fn encode_backfill_task(t: &BackfillTask) -> Result<Vec<u8>, GenericError> {
    Ok(apache_avro::to_avro_datum(backfill_task_schema(), backfill_task_to_value(t))?)
}

/// Decodes a backfill task datum written with the current schema, consuming all bytes.
pub fn decode_backfill_task(mut bytes: &[u8]) -> Result<BackfillTask, GenericError> {
    let value = apache_avro::from_avro_datum(backfill_task_schema(), &mut bytes, None)?;
    if !bytes.is_empty() {
        return Err(GenericError::TrailingBytes { count: bytes.len() });
    }
    Ok(backfill_task_from_value(value)?)
}

#[cfg(test)]
#[path = "avro_tests.rs"]
mod tests;
