//! A borrowed view of a `LogRecord` datum: [`decode_ref`] checks the bytes exactly as
//! [`super::codec::decode`] does and returns a [`LogRecordRef`] whose strings, embedding
//! and metadata point into the input. Nothing is copied and, for maps of up to
//! [`INLINE_KEYS`] keys, nothing is allocated.
//!
//! Contract, each pinned by a test in `borrowed_tests.rs`:
//! - `decode_ref` accepts exactly the inputs `decode` accepts and refuses the others with
//!   the same [`DecodeError`] (same kind, field and position);
//! - `decode_ref(b)?.to_owned() == decode(b)?`, bit for bit (NaN payloads included);
//! - [`validate_ref`] returns what [`super::validate::validate`] returns on the owned record.
//!
//! The metadata map is kept as its raw, already checked encoding ([`MetadataRef`]) and read
//! again on each iteration: the decoder walks it once to check it (value kinds, UTF-8,
//! block sizes, duplicate keys) and a consumer that only looks up a few keys, or none,
//! pays for no allocation. Entries come in the datum's order, not sorted by key.

use std::collections::HashSet;
use std::fmt;

use super::codec::{f32s_from_le_bytes, DecodeError, Reader};
use super::validate::{validate, Limits, ValidationError};
use super::{BackfillRef, Embedding, Encoding, LogRecord, MetaValue, Metadata, Operation};

/// A `LogRecord` datum viewed in place. See the module documentation.
#[derive(Debug, Clone)]
pub struct LogRecordRef<'a> {
    pub collection_id: &'a str,
    pub id: &'a str,
    pub operation: Operation,
    pub embedding: Option<EmbeddingRef<'a>>,
    pub encoding: Encoding,
    pub metadata: Option<MetadataRef<'a>>,
    pub document: Option<&'a str>,
    /// Only on `BACKFILL_FN` markers, which are rare: owned.
    pub backfill: Option<BackfillRef>,
}

impl LogRecordRef<'_> {
    /// The owned record, equal to what [`super::codec::decode`] returns for the same bytes.
    #[allow(clippy::wrong_self_convention)]
    pub fn to_owned(&self) -> LogRecord {
        LogRecord {
            collection_id: self.collection_id.to_owned(),
            id: self.id.to_owned(),
            operation: self.operation,
            embedding: self.embedding.map(Embedding::from),
            encoding: self.encoding,
            metadata: self.metadata.map(|m| m.to_owned()),
            document: self.document.map(str::to_owned),
            backfill: self.backfill.clone(),
        }
    }
}

/// The `embedding` bytes: packed little-endian f32, a whole number of values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct EmbeddingRef<'a> {
    bytes: &'a [u8],
}

impl<'a> EmbeddingRef<'a> {
    /// `None` when the length is not a multiple of 4.
    pub fn new(bytes: &'a [u8]) -> Option<Self> {
        (bytes.len() % 4 == 0).then_some(EmbeddingRef { bytes })
    }

    /// The view of bytes already checked to be a whole number of values (an
    /// [`super::Embedding`]'s).
    pub(crate) fn whole(bytes: &'a [u8]) -> Self {
        debug_assert_eq!(bytes.len() % 4, 0);
        EmbeddingRef { bytes }
    }

    /// Number of values (the dimension).
    pub fn len(&self) -> usize {
        self.bytes.len() / 4
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The raw packed bytes (also the sysdb's storage format).
    pub fn as_bytes(&self) -> &'a [u8] {
        self.bytes
    }

    /// The value at `index`, bit for bit.
    pub fn get(&self, index: usize) -> Option<f32> {
        let at = index.checked_mul(4)?;
        let c = self.bytes.get(at..at.checked_add(4)?)?;
        Some(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    /// The values, bit for bit (NaN payloads included).
    pub fn iter(&self) -> impl ExactSizeIterator<Item = f32> + 'a {
        self.bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    }

    pub fn to_vec(&self) -> Vec<f32> {
        f32s_from_le_bytes(self.bytes).unwrap_or_default()
    }
}

impl fmt::Debug for EmbeddingRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// A metadata value borrowed from the datum. `Null` means "remove this key" on merge.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetaValueRef<'a> {
    Null,
    String(&'a str),
    Long(i64),
    Double(f64),
    Bool(bool),
}

impl MetaValueRef<'_> {
    #[allow(clippy::wrong_self_convention)]
    pub fn to_owned(&self) -> MetaValue {
        match *self {
            MetaValueRef::Null => MetaValue::Null,
            MetaValueRef::String(s) => MetaValue::String(s.to_owned()),
            MetaValueRef::Long(l) => MetaValue::Long(l),
            MetaValueRef::Double(d) => MetaValue::Double(d),
            MetaValueRef::Bool(b) => MetaValue::Bool(b),
        }
    }
}

/// The metadata map as its checked encoding (every block, up to and including the closing
/// zero count). Keys are unique; iteration is in the datum's order.
#[derive(Clone, Copy)]
pub struct MetadataRef<'a> {
    raw: &'a [u8],
    len: usize,
}

impl<'a> MetadataRef<'a> {
    /// Number of entries (null values included).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The entries in the datum's order.
    pub fn iter(&self) -> MetadataIter<'a> {
        MetadataIter { r: Reader { buf: self.raw, pos: 0 }, left_in_block: 0, left: self.len }
    }

    /// The value of `key`, by a scan of the entries.
    pub fn get(&self, key: &str) -> Option<MetaValueRef<'a>> {
        self.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The owned map, as [`super::codec::decode`] builds it.
    #[allow(clippy::wrong_self_convention)]
    pub fn to_owned(&self) -> Metadata {
        self.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
    }
}

impl fmt::Debug for MetadataRef<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

/// Iterator over a [`MetadataRef`]'s entries.
pub struct MetadataIter<'a> {
    r: Reader<'a>,
    left_in_block: u64,
    left: usize,
}

impl<'a> Iterator for MetadataIter<'a> {
    type Item = (&'a str, MetaValueRef<'a>);

    fn next(&mut self) -> Option<Self::Item> {
        // The bytes were checked by `decode_ref`, so none of these reads fails; if one
        // did, the iteration would just end.
        if self.left == 0 {
            return None;
        }
        while self.left_in_block == 0 {
            let count = self.r.long(FIELD).ok()?;
            if count == 0 {
                return None;
            }
            if count < 0 {
                self.r.long(FIELD).ok()?;
            }
            self.left_in_block = count.unsigned_abs();
        }
        let key = self.r.str_ref(KEY_FIELD).ok()?;
        let value = meta_value_ref(&mut self.r).ok()?;
        self.left_in_block -= 1;
        self.left -= 1;
        Some((key, value))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for MetadataIter<'_> {}

// ---------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------

const FIELD: &str = "metadata";
const KEY_FIELD: &str = "metadata.key";
const VALUE_FIELD: &str = "metadata.value";

/// Keys of a map checked for duplicates without allocating: the first `INLINE_KEYS` keys
/// are compared one by one; a bigger map moves to a hash set (so a datum of many keys
/// costs O(n), not O(n²)).
pub const INLINE_KEYS: usize = 16;

struct KeySet<'a> {
    inline: [&'a str; INLINE_KEYS],
    n: usize,
    spilled: Option<HashSet<&'a str>>,
}

impl<'a> KeySet<'a> {
    fn new() -> Self {
        KeySet { inline: [""; INLINE_KEYS], n: 0, spilled: None }
    }

    /// `false` if `key` was already there.
    #[inline]
    fn insert(&mut self, key: &'a str) -> bool {
        if let Some(set) = &mut self.spilled {
            return set.insert(key);
        }
        if self.inline[..self.n].contains(&key) {
            return false;
        }
        if self.n < INLINE_KEYS {
            self.inline[self.n] = key;
            self.n += 1;
        } else {
            let mut set: HashSet<&'a str> = self.inline.iter().copied().collect();
            set.insert(key);
            self.spilled = Some(set);
        }
        true
    }
}

/// Decodes one `LogRecord` datum (no framing) in place, consuming exactly all of `input`.
/// Accepts and refuses exactly what [`super::codec::decode`] does, with the same errors.
pub fn decode_ref(input: &[u8]) -> Result<LogRecordRef<'_>, DecodeError> {
    let mut r = Reader { buf: input, pos: 0 };
    let collection_id = r.str_ref("collection_id")?;
    let id = r.str_ref("id")?;
    let operation = {
        let pos = r.pos;
        let index = r.long("operation")?;
        u32::try_from(index).ok().and_then(Operation::from_avro_index).ok_or(DecodeError::BadEnumIndex {
            field: "operation",
            index,
            symbols: 5,
            pos,
        })?
    };
    let embedding = match r.union_index("embedding", 2)? {
        0 => None,
        _ => {
            let (data, data_pos) = r.bytes("embedding")?;
            Some(
                EmbeddingRef::new(data)
                    .ok_or(DecodeError::EmbeddingNotMultipleOf4 { len: data.len(), pos: data_pos })?,
            )
        }
    };
    let encoding = {
        let pos = r.pos;
        match r.long("encoding")? {
            0 => Encoding::Float32,
            index => return Err(DecodeError::BadEnumIndex { field: "encoding", index, symbols: 1, pos }),
        }
    };
    let metadata = match r.union_index("metadata", 2)? {
        0 => None,
        _ => Some(metadata_ref(&mut r)?),
    };
    let document = match r.union_index("document", 2)? {
        0 => None,
        _ => Some(r.str_ref("document")?),
    };
    let backfill = match r.union_index("backfill", 2)? {
        0 => None,
        _ => Some(BackfillRef {
            request_id: r.str_ref("backfill.request_id")?.to_owned(),
            function_id: r.str_ref("backfill.function_id")?.to_owned(),
        }),
    };
    let count = r.remaining();
    if count != 0 {
        return Err(DecodeError::TrailingBytes { count, pos: r.pos });
    }
    Ok(LogRecordRef { collection_id, id, operation, embedding, encoding, metadata, document, backfill })
}

/// Checks the map's blocks in the same order, with the same errors, as the owned decoder.
fn metadata_ref<'a>(r: &mut Reader<'a>) -> Result<MetadataRef<'a>, DecodeError> {
    let start = r.pos;
    let mut keys = KeySet::new();
    let mut len = 0usize;
    while let Some(block) = r.map_block(FIELD)? {
        for _ in 0..block.entries {
            let key_pos = r.pos;
            let key = r.str_ref(KEY_FIELD)?;
            meta_value_ref(r)?;
            if !keys.insert(key) {
                return Err(DecodeError::DuplicateMapKey { field: FIELD, pos: key_pos });
            }
            len += 1;
        }
        r.end_map_block(FIELD, block)?;
    }
    Ok(MetadataRef { raw: &r.buf[start..r.pos], len })
}

#[inline]
fn meta_value_ref<'a>(r: &mut Reader<'a>) -> Result<MetaValueRef<'a>, DecodeError> {
    Ok(match r.union_index(VALUE_FIELD, 5)? {
        0 => MetaValueRef::Null,
        1 => MetaValueRef::String(r.str_ref(VALUE_FIELD)?),
        2 => MetaValueRef::Long(r.long(VALUE_FIELD)?),
        3 => MetaValueRef::Double(f64::from_le_bytes(r.fixed::<8>(VALUE_FIELD)?)),
        _ => {
            let pos = r.pos;
            match r.fixed::<1>(VALUE_FIELD)?[0] {
                0 => MetaValueRef::Bool(false),
                1 => MetaValueRef::Bool(true),
                byte => return Err(DecodeError::BadBool { field: VALUE_FIELD, byte, pos }),
            }
        }
    })
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

/// [`super::validate::validate`] on the borrowed form, with the same result. A record that
/// passes every check is accepted without allocating; one that fails any is handed to
/// `validate` on its owned copy, so the error reported (the first in `validate`'s order,
/// which visits metadata by key) is exactly the same.
pub fn validate_ref(record: &LogRecordRef<'_>, limits: &Limits) -> Result<(), ValidationError> {
    if passes(record, limits) {
        Ok(())
    } else {
        validate(&record.to_owned(), limits)
    }
}

fn has_nul(s: &str) -> bool {
    s.as_bytes().contains(&0)
}

/// Whether `validate` accepts the record: the conjunction of all its checks.
fn passes(r: &LogRecordRef<'_>, limits: &Limits) -> bool {
    let max_id = limits.max_id_bytes;
    if r.collection_id.is_empty() || r.collection_id.len() > max_id || r.id.len() > max_id {
        return false;
    }
    let payload_ok = match (r.operation, &r.backfill) {
        (Operation::BackfillFn, None) => false,
        (Operation::BackfillFn, Some(b)) => {
            !b.request_id.is_empty() && !b.function_id.is_empty() && !has_nul(&b.request_id) && !has_nul(&b.function_id)
        }
        (_, Some(_)) => false,
        (_, None) => !r.id.is_empty(),
    };
    if !payload_ok || has_nul(r.collection_id) || has_nul(r.id) {
        return false;
    }
    if let Some(e) = &r.embedding {
        if e.is_empty() || e.len() > limits.max_embedding_dim || !e.iter().all(f32::is_finite) {
            return false;
        }
    }
    if let Some(m) = &r.metadata {
        if m.len() > limits.max_metadata_keys {
            return false;
        }
        for (key, value) in m.iter() {
            if key.is_empty() || key.len() > max_id || has_nul(key) {
                return false;
            }
            match value {
                MetaValueRef::String(s) if s.len() > limits.max_metadata_value_bytes || has_nul(s) => return false,
                MetaValueRef::Double(d) if !d.is_finite() => return false,
                _ => {}
            }
        }
    }
    if let Some(d) = r.document {
        if d.len() > limits.max_document_bytes || has_nul(d) {
            return false;
        }
    }
    true
}

#[cfg(test)]
#[path = "borrowed_tests.rs"]
mod tests;
