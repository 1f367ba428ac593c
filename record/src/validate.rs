//! Semantic checks on a decoded [`LogRecord`], beyond what the Avro schema can say.
//!
//! A record that fails goes to the DLQ with [`ValidationError::kind`] as the reason
//! (docs/design.md invariant 10); it is never applied. Structural problems (bad bytes, an
//! embedding whose byte length is not a multiple of 4) are decode errors
//! ([`super::codec::DecodeError`]), not validation errors.
//!
//! Decisions recorded here:
//! - Non-finite floats are rejected everywhere: NaN or ±inf in an embedding, and NaN or
//!   ±inf metadata doubles (NaN is not equal to itself, which breaks merges, statistics
//!   grouping and JSON output).
//! - `id` must be non-empty on data operations only; a `BACKFILL_FN` marker is identified
//!   by its `backfill` payload, whose `request_id` and `function_id` must be non-empty.
//! - `max_id_bytes` bounds `collection_id`, `id` and metadata keys alike.
//! - An embedding present but empty (dimension 0) is rejected: the first embedding fixes
//!   a collection's dimension.
//! - The dimension check against the collection's fixed dimension needs the sysdb and is
//!   done by the processor, not here.
//! - U+0000 is rejected in every string of a record (`collection_id`, `id`, metadata keys
//!   and string values, the document, the backfill request and function ids): PostgreSQL
//!   text cannot hold it while SQLite can, and a record must be accepted or refused the
//!   same way whatever the backend. The error names the field.
//! - `max_id_bytes` is capped at [`MAX_ID_BYTES_CAP`] (1024): the records table is keyed
//!   by `(collection_id, id)`, and PostgreSQL refuses a B-tree entry larger than about
//!   2.7 KB (SQLSTATE 54000). Two ids of 1024 bytes plus the tuple and varlena headers
//!   stay below it; the other indexed text columns hold one such id plus short names
//!   (function ids, bounded statistics output ids).

use serde::{Deserialize, Deserializer};

use super::{LogRecord, MetaValue, Operation};

/// Size limits on log records (config section `[limits]`). Every field is optional.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// Maximum length in bytes (UTF-8) of `collection_id`, `id` and each metadata key.
    /// Default 1024, which is also the most it may be set to ([`MAX_ID_BYTES_CAP`]).
    #[serde(default = "Limits::default_max_id_bytes", deserialize_with = "capped_id_bytes")]
    pub max_id_bytes: usize,
    /// Maximum number of metadata keys in one log record (null values count). Default 64.
    #[serde(default = "Limits::default_max_metadata_keys")]
    pub max_metadata_keys: usize,
    /// Maximum length in bytes of one metadata string value. Default 65536 (64 KiB).
    #[serde(default = "Limits::default_max_metadata_value_bytes")]
    pub max_metadata_value_bytes: usize,
    /// Maximum length in bytes of the document. Default 1048576 (1 MiB).
    #[serde(default = "Limits::default_max_document_bytes")]
    pub max_document_bytes: usize,
    /// Maximum embedding dimension (number of f32 values). Default 65536.
    #[serde(default = "Limits::default_max_embedding_dim")]
    pub max_embedding_dim: usize,
}

/// The largest `max_id_bytes` accepted: `collection_id` and `id` together key the records
/// table, and a key of two such ids stays under PostgreSQL's B-tree entry limit (about
/// 2,700 bytes including headers).
pub const MAX_ID_BYTES_CAP: usize = 1024;

fn capped_id_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<usize, D::Error> {
    let v = usize::deserialize(d)?;
    if v > MAX_ID_BYTES_CAP {
        return Err(serde::de::Error::custom(format!(
            "max_id_bytes = {v} is more than {MAX_ID_BYTES_CAP}: (collection_id, id) must fit in one PostgreSQL index entry"
        )));
    }
    Ok(v)
}

impl Limits {
    pub const fn default_max_id_bytes() -> usize {
        1024
    }
    pub const fn default_max_metadata_keys() -> usize {
        64
    }
    pub const fn default_max_metadata_value_bytes() -> usize {
        64 * 1024
    }
    pub const fn default_max_document_bytes() -> usize {
        1 << 20
    }
    pub const fn default_max_embedding_dim() -> usize {
        65536
    }

    /// The defaults, as a constant.
    pub const DEFAULT: Limits = Limits {
        max_id_bytes: Self::default_max_id_bytes(),
        max_metadata_keys: Self::default_max_metadata_keys(),
        max_metadata_value_bytes: Self::default_max_metadata_value_bytes(),
        max_document_bytes: Self::default_max_document_bytes(),
        max_embedding_dim: Self::default_max_embedding_dim(),
    };
}

impl Default for Limits {
    fn default() -> Self {
        Limits::DEFAULT
    }
}

/// Why a decoded log record is refused. Metadata keys in errors are cut to 64 characters.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("collection_id is empty")]
    EmptyCollectionId,
    #[error("collection_id is {len} bytes, more than the limit of {max}")]
    CollectionIdTooLong { len: usize, max: usize },
    #[error("id is empty")]
    EmptyId,
    #[error("id is {len} bytes, more than the limit of {max}")]
    IdTooLong { len: usize, max: usize },
    #[error("BACKFILL_FN record without a backfill payload")]
    BackfillWithoutPayload,
    #[error("BACKFILL_FN record with an empty backfill.{field}")]
    EmptyBackfillRef { field: &'static str },
    #[error("{} record carries a backfill payload, which only BACKFILL_FN may", operation.symbol())]
    PayloadOnDataOperation { operation: Operation },
    #[error("embedding is present but empty")]
    EmptyEmbedding,
    #[error("embedding has {dim} dimensions, more than the limit of {max}")]
    EmbeddingTooLarge { dim: usize, max: usize },
    #[error("embedding value at index {index} is NaN or infinite")]
    NonFiniteEmbedding { index: usize },
    #[error("{count} metadata keys, more than the limit of {max}")]
    TooManyMetadataKeys { count: usize, max: usize },
    #[error("a metadata key is empty")]
    MetadataKeyEmpty,
    #[error("metadata key `{key}` is {len} bytes, more than the limit of {max}")]
    MetadataKeyTooLong { key: String, len: usize, max: usize },
    #[error("metadata value of `{key}` is {len} bytes, more than the limit of {max}")]
    MetadataValueTooLarge { key: String, len: usize, max: usize },
    #[error("metadata value of `{key}` is a NaN or infinite double")]
    NonFiniteMetadataDouble { key: String },
    #[error("document is {len} bytes, more than the limit of {max}")]
    DocumentTooLarge { len: usize, max: usize },
    /// `field` names where: `collection_id`, `id`, `metadata key`, `metadata value of
    /// `<key>``, `document`, `backfill.request_id`, `backfill.function_id`.
    #[error("{field} contains the character U+0000")]
    NulCharacter { field: String },
}

impl ValidationError {
    /// Stable snake_case label, used as the DLQ reason and as a metric label value.
    pub fn kind(&self) -> &'static str {
        match self {
            ValidationError::EmptyCollectionId => "empty_collection_id",
            ValidationError::CollectionIdTooLong { .. } => "collection_id_too_long",
            ValidationError::EmptyId => "empty_id",
            ValidationError::IdTooLong { .. } => "id_too_long",
            ValidationError::BackfillWithoutPayload => "backfill_without_payload",
            ValidationError::EmptyBackfillRef { .. } => "empty_backfill_ref",
            ValidationError::PayloadOnDataOperation { .. } => "payload_on_data_operation",
            ValidationError::EmptyEmbedding => "empty_embedding",
            ValidationError::EmbeddingTooLarge { .. } => "embedding_too_large",
            ValidationError::NonFiniteEmbedding { .. } => "non_finite_embedding",
            ValidationError::TooManyMetadataKeys { .. } => "too_many_metadata_keys",
            ValidationError::MetadataKeyEmpty => "metadata_key_empty",
            ValidationError::MetadataKeyTooLong { .. } => "metadata_key_too_long",
            ValidationError::MetadataValueTooLarge { .. } => "metadata_value_too_large",
            ValidationError::NonFiniteMetadataDouble { .. } => "non_finite_metadata_double",
            ValidationError::DocumentTooLarge { .. } => "document_too_large",
            ValidationError::NulCharacter { .. } => "nul_character",
        }
    }
}

fn short_key(key: &str) -> String {
    const MAX_CHARS: usize = 64;
    match key.char_indices().nth(MAX_CHARS) {
        Some((cut, _)) => format!("{}…", &key[..cut]),
        None => key.to_string(),
    }
}

/// Checks a decoded record against the limits; the first violation found is returned.
pub fn validate(record: &LogRecord, limits: &Limits) -> Result<(), ValidationError> {
    use ValidationError as E;

    let cid = record.collection_id.len();
    if cid == 0 {
        return Err(E::EmptyCollectionId);
    }
    if cid > limits.max_id_bytes {
        return Err(E::CollectionIdTooLong { len: cid, max: limits.max_id_bytes });
    }
    if record.id.len() > limits.max_id_bytes {
        return Err(E::IdTooLong { len: record.id.len(), max: limits.max_id_bytes });
    }

    match (record.operation, &record.backfill) {
        (Operation::BackfillFn, None) => return Err(E::BackfillWithoutPayload),
        (Operation::BackfillFn, Some(b)) => {
            if b.request_id.is_empty() {
                return Err(E::EmptyBackfillRef { field: "request_id" });
            }
            if b.function_id.is_empty() {
                return Err(E::EmptyBackfillRef { field: "function_id" });
            }
        }
        (operation, Some(_)) => return Err(E::PayloadOnDataOperation { operation }),
        (_, None) => {
            if record.id.is_empty() {
                return Err(E::EmptyId);
            }
        }
    }

    if let Some(embedding) = &record.embedding {
        if embedding.is_empty() {
            return Err(E::EmptyEmbedding);
        }
        if embedding.len() > limits.max_embedding_dim {
            return Err(E::EmbeddingTooLarge { dim: embedding.len(), max: limits.max_embedding_dim });
        }
        if let Some(index) = embedding.iter().position(|v| !v.is_finite()) {
            return Err(E::NonFiniteEmbedding { index });
        }
    }

    if let Some(metadata) = &record.metadata {
        if metadata.len() > limits.max_metadata_keys {
            return Err(E::TooManyMetadataKeys { count: metadata.len(), max: limits.max_metadata_keys });
        }
        for (key, value) in metadata {
            if key.is_empty() {
                return Err(E::MetadataKeyEmpty);
            }
            if key.len() > limits.max_id_bytes {
                return Err(E::MetadataKeyTooLong { key: short_key(key), len: key.len(), max: limits.max_id_bytes });
            }
            match value {
                MetaValue::String(s) if s.len() > limits.max_metadata_value_bytes => {
                    return Err(E::MetadataValueTooLarge {
                        key: short_key(key),
                        len: s.len(),
                        max: limits.max_metadata_value_bytes,
                    });
                }
                MetaValue::Double(d) if !d.is_finite() => {
                    return Err(E::NonFiniteMetadataDouble { key: short_key(key) });
                }
                _ => {}
            }
        }
    }

    if let Some(document) = &record.document {
        if document.len() > limits.max_document_bytes {
            return Err(E::DocumentTooLarge { len: document.len(), max: limits.max_document_bytes });
        }
    }
    check_nul(record)
}

fn has_nul(s: &str) -> bool {
    s.as_bytes().contains(&0)
}

/// The first string of `record` that holds U+0000, named.
fn check_nul(record: &LogRecord) -> Result<(), ValidationError> {
    let nul = |field: &str| Err(ValidationError::NulCharacter { field: field.to_string() });
    if has_nul(&record.collection_id) {
        return nul("collection_id");
    }
    if has_nul(&record.id) {
        return nul("id");
    }
    if let Some(b) = &record.backfill {
        if has_nul(&b.request_id) {
            return nul("backfill.request_id");
        }
        if has_nul(&b.function_id) {
            return nul("backfill.function_id");
        }
    }
    for (key, value) in record.metadata.iter().flatten() {
        if has_nul(key) {
            // The key itself cannot be shown faithfully; its printable start can.
            return nul(&format!("metadata key `{}`", short_key(&key.replace('\0', "\\0"))));
        }
        if let MetaValue::String(s) = value {
            if has_nul(s) {
                return nul(&format!("metadata value of `{}`", short_key(key)));
            }
        }
    }
    if record.document.as_deref().is_some_and(has_nul) {
        return nul("document");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BackfillRef, Metadata};

    fn ok_record() -> LogRecord {
        let mut r = LogRecord::data("coll", "id-1", Operation::Upsert);
        r.embedding = Some(vec![0.25, -1.0, 3.5].into());
        r.metadata = Some(Metadata::from_iter([
            ("s".to_string(), MetaValue::String("v".into())),
            ("n".to_string(), MetaValue::Null),
            ("l".to_string(), MetaValue::Long(-3)),
            ("d".to_string(), MetaValue::Double(1.5)),
            ("b".to_string(), MetaValue::Bool(false)),
        ]));
        r.document = Some("doc".into());
        r
    }

    fn marker() -> LogRecord {
        let mut r = LogRecord::data("coll", "", Operation::BackfillFn);
        r.backfill = Some(BackfillRef { request_id: "req".into(), function_id: "fn".into() });
        r
    }

    fn kind_of(r: &LogRecord, limits: &Limits) -> &'static str {
        validate(r, limits).expect_err("should be refused").kind()
    }

    const SMALL: Limits = Limits {
        max_id_bytes: 4,
        max_metadata_keys: 2,
        max_metadata_value_bytes: 3,
        max_document_bytes: 5,
        max_embedding_dim: 3,
    };

    #[test]
    fn valid_data_records_and_markers_pass() {
        assert_eq!(validate(&ok_record(), &Limits::default()), Ok(()));
        assert_eq!(validate(&marker(), &Limits::default()), Ok(()));
        assert_eq!(validate(&LogRecord::data("c", "i", Operation::Delete), &Limits::default()), Ok(()));
    }

    #[test]
    fn limits_at_the_boundary_pass() {
        let mut r = LogRecord::data("cccc", "iiii", Operation::Add);
        r.embedding = Some(vec![1.0; 3].into());
        r.metadata = Some(Metadata::from_iter([
            ("kkkk".to_string(), MetaValue::String("vvv".into())),
            ("k".to_string(), MetaValue::Double(f64::MAX)),
        ]));
        r.document = Some("ddddd".into());
        assert_eq!(validate(&r, &SMALL), Ok(()));
    }

    #[test]
    fn ids() {
        assert_eq!(kind_of(&LogRecord::data("", "i", Operation::Add), &SMALL), "empty_collection_id");
        assert_eq!(kind_of(&LogRecord::data("ccccc", "i", Operation::Add), &SMALL), "collection_id_too_long");
        assert_eq!(kind_of(&LogRecord::data("c", "", Operation::Add), &SMALL), "empty_id");
        // Four characters, eight bytes: the limit is on bytes.
        assert_eq!(
            validate(&LogRecord::data("c", "éééé", Operation::Add), &SMALL),
            Err(ValidationError::IdTooLong { len: 8, max: 4 })
        );
    }

    #[test]
    fn backfill_payload_belongs_to_markers_only() {
        let mut r = marker();
        r.backfill = None;
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::BackfillWithoutPayload));
        let mut r = marker();
        r.backfill = Some(BackfillRef { request_id: String::new(), function_id: "f".into() });
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::EmptyBackfillRef { field: "request_id" }));
        r.backfill = Some(BackfillRef { request_id: "r".into(), function_id: String::new() });
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::EmptyBackfillRef { field: "function_id" }));
        let mut r = LogRecord::data("c", "i", Operation::Update);
        r.backfill = marker().backfill;
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::PayloadOnDataOperation { operation: Operation::Update }));
        assert_eq!(kind_of(&r, &SMALL), "payload_on_data_operation");
    }

    #[test]
    fn embeddings() {
        let mut r = LogRecord::data("c", "i", Operation::Add);
        r.embedding = Some(vec![].into());
        assert_eq!(kind_of(&r, &SMALL), "empty_embedding");
        r.embedding = Some(vec![0.0; 4].into());
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::EmbeddingTooLarge { dim: 4, max: 3 }));
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            r.embedding = Some(vec![0.0, bad, 1.0].into());
            assert_eq!(validate(&r, &SMALL), Err(ValidationError::NonFiniteEmbedding { index: 1 }));
        }
        assert_eq!(kind_of(&r, &SMALL), "non_finite_embedding");
    }

    #[test]
    fn metadata() {
        let with = |pairs: Vec<(&str, MetaValue)>| {
            let mut r = LogRecord::data("c", "i", Operation::Upsert);
            r.metadata = Some(pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect());
            r
        };
        let r = with(vec![("a", MetaValue::Null), ("b", MetaValue::Null), ("c", MetaValue::Null)]);
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::TooManyMetadataKeys { count: 3, max: 2 }));
        assert_eq!(kind_of(&with(vec![("", MetaValue::Long(1))]), &SMALL), "metadata_key_empty");
        assert_eq!(
            validate(&with(vec![("kkkkk", MetaValue::Long(1))]), &SMALL),
            Err(ValidationError::MetadataKeyTooLong { key: "kkkkk".into(), len: 5, max: 4 })
        );
        assert_eq!(
            validate(&with(vec![("k", MetaValue::String("vvvv".into()))]), &SMALL),
            Err(ValidationError::MetadataValueTooLarge { key: "k".into(), len: 4, max: 3 })
        );
        for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
            assert_eq!(
                validate(&with(vec![("x", MetaValue::Double(bad))]), &SMALL),
                Err(ValidationError::NonFiniteMetadataDouble { key: "x".into() })
            );
        }
        assert_eq!(kind_of(&with(vec![("x", MetaValue::Double(f64::NAN))]), &SMALL), "non_finite_metadata_double");
    }

    #[test]
    fn long_keys_are_cut_in_errors() {
        let key = "ü".repeat(100);
        let mut r = LogRecord::data("c", "i", Operation::Upsert);
        r.metadata = Some(Metadata::from_iter([(key, MetaValue::Double(f64::NAN))]));
        match validate(&r, &Limits::default()) {
            Err(ValidationError::NonFiniteMetadataDouble { key }) => {
                assert_eq!(key.chars().count(), 65)
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn documents() {
        let mut r = LogRecord::data("c", "i", Operation::Add);
        r.document = Some("dddddd".into());
        assert_eq!(validate(&r, &SMALL), Err(ValidationError::DocumentTooLarge { len: 6, max: 5 }));
        assert_eq!(kind_of(&r, &SMALL), "document_too_large");
    }

    #[test]
    fn limits_deserialize_with_defaults_and_reject_unknown_keys() {
        let all_default: Limits = toml::from_str("").expect("empty table");
        assert_eq!(all_default, Limits::default());
        assert_eq!(
            all_default,
            Limits {
                max_id_bytes: 1024,
                max_metadata_keys: 64,
                max_metadata_value_bytes: 65536,
                max_document_bytes: 1_048_576,
                max_embedding_dim: 65536,
            }
        );
        let some: Limits = toml::from_str("max_embedding_dim = 1536").expect("one key");
        assert_eq!(some, Limits { max_embedding_dim: 1536, ..Limits::default() });
        assert!(toml::from_str::<Limits>("max_embedding_dims = 1536").is_err());
    }

    #[test]
    fn nul_characters_are_refused_in_every_string_and_the_field_is_named() {
        let field = |r: &LogRecord| match validate(r, &Limits::default()) {
            Err(ValidationError::NulCharacter { field }) => field,
            other => panic!("expected NulCharacter, got {other:?}"),
        };
        let mut r = ok_record();
        r.collection_id = "co\0ll".into();
        assert_eq!(field(&r), "collection_id");
        assert_eq!(kind_of(&r, &Limits::default()), "nul_character");
        let mut r = ok_record();
        r.id = "\0".into();
        assert_eq!(field(&r), "id");
        let mut r = ok_record();
        r.id = "a\0b".into();
        assert_eq!(field(&r), "id");
        let mut r = ok_record();
        r.metadata.as_mut().unwrap().insert("k\0".into(), MetaValue::Long(1));
        assert_eq!(field(&r), "metadata key `k\\0`");
        let mut r = ok_record();
        r.metadata.as_mut().unwrap().insert("s".into(), MetaValue::String("x\0".into()));
        assert_eq!(field(&r), "metadata value of `s`");
        let mut r = ok_record();
        r.document = Some("end\0".into());
        assert_eq!(field(&r), "document");
        for (which, name) in [(0, "backfill.request_id"), (1, "backfill.function_id")] {
            let mut r = marker();
            let b = r.backfill.as_mut().unwrap();
            if which == 0 {
                b.request_id.push('\0');
            } else {
                b.function_id.push('\0');
            }
            assert_eq!(field(&r), name);
        }
        // Other control characters are fine: only U+0000 is unrepresentable.
        let mut r = ok_record();
        r.id = "a\u{1}b\u{7f}".into();
        r.document = Some("\u{1}".into());
        assert_eq!(validate(&r, &Limits::default()), Ok(()));
    }

    #[test]
    fn max_id_bytes_cannot_exceed_what_an_index_entry_holds() {
        let at_cap: Limits = toml::from_str("max_id_bytes = 1024").expect("the cap itself");
        assert_eq!(at_cap.max_id_bytes, MAX_ID_BYTES_CAP);
        let err = toml::from_str::<Limits>("max_id_bytes = 1025").expect_err("above the cap");
        assert!(err.to_string().contains("max_id_bytes"), "{err}");
        assert!(Limits::default().max_id_bytes <= MAX_ID_BYTES_CAP);
    }

    #[test]
    fn kinds_are_distinct_snake_case_labels() {
        let errors = [
            ValidationError::EmptyCollectionId,
            ValidationError::CollectionIdTooLong { len: 0, max: 0 },
            ValidationError::EmptyId,
            ValidationError::IdTooLong { len: 0, max: 0 },
            ValidationError::BackfillWithoutPayload,
            ValidationError::EmptyBackfillRef { field: "request_id" },
            ValidationError::PayloadOnDataOperation { operation: Operation::Add },
            ValidationError::EmptyEmbedding,
            ValidationError::EmbeddingTooLarge { dim: 0, max: 0 },
            ValidationError::NonFiniteEmbedding { index: 0 },
            ValidationError::TooManyMetadataKeys { count: 0, max: 0 },
            ValidationError::MetadataKeyEmpty,
            ValidationError::MetadataKeyTooLong { key: String::new(), len: 0, max: 0 },
            ValidationError::MetadataValueTooLarge { key: String::new(), len: 0, max: 0 },
            ValidationError::NonFiniteMetadataDouble { key: String::new() },
            ValidationError::DocumentTooLarge { len: 0, max: 0 },
            ValidationError::NulCharacter { field: String::new() },
        ];
        let kinds: std::collections::BTreeSet<_> = errors.iter().map(ValidationError::kind).collect();
        assert_eq!(kinds.len(), errors.len());
        assert!(kinds.iter().all(|k| k.chars().all(|c| c.is_ascii_lowercase() || c == '_')));
        assert!(errors.iter().all(|e| !e.to_string().is_empty()));
    }
}
