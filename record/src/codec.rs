//! Hand-written Avro binary codec for [`LogRecord`], the hot path of the processor.
//!
//! It reads and writes the exact Avro binary encoding of `schemas/log_record.avsc` (the
//! fields in schema order, zig-zag varint longs, length-prefixed bytes and strings, union
//! branch indexes as longs, maps as blocks) without going through `apache_avro::types::Value`.
//! The generic apache-avro path in [`super::avro`] is its oracle in property tests and its
//! baseline in `record/benches/decode.rs`. [`super::borrowed::decode_ref`] reads the same
//! datum in place (no owned copy) with the same checks and errors.
//!
//! The decoder assumes the *current* writer schema. Data written with another schema
//! version must go through [`super::avro::GenericDecoder`], which does schema resolution.
//!
//! Safety properties of [`decode`], each pinned by a test:
//! - it never panics, whatever the input;
//! - it allocates O(input length): every declared length and map count is checked against
//!   the bytes that remain *before* anything is allocated;
//! - it consumes the whole input (trailing bytes are an error);
//! - every error names the field and the byte position ([`DecodeError`]), and has a stable
//!   label ([`DecodeError::kind`]) used as the DLQ reason.

use super::{BackfillRef, Embedding, Encoding, LogRecord, MetaValue, Metadata, Operation};
use bytes::Bytes;

/// Why bytes are not a valid `LogRecord` datum. `pos` is the byte offset in the datum
/// (after any framing) where the offending item starts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("input ends inside field `{field}` (item starting at byte {pos})")]
    Truncated { field: &'static str, pos: usize },
    #[error("varint in field `{field}` at byte {pos} is longer than 10 bytes or overflows 64 bits")]
    VarintOverflow { field: &'static str, pos: usize },
    #[error("negative length {len} in field `{field}` at byte {pos}")]
    NegativeLength { field: &'static str, len: i64, pos: usize },
    #[error("field `{field}` at byte {pos} declares {len} but only {max} fit in the remaining input")]
    LengthOverflow { field: &'static str, len: u64, max: usize, pos: usize },
    #[error("union branch {index} out of range 0..{branches} in field `{field}` at byte {pos}")]
    BadUnionIndex { field: &'static str, index: i64, branches: u8, pos: usize },
    #[error("enum index {index} out of range 0..{symbols} in field `{field}` at byte {pos}")]
    BadEnumIndex { field: &'static str, index: i64, symbols: u8, pos: usize },
    #[error("invalid UTF-8 in field `{field}` at byte {pos}")]
    InvalidUtf8 { field: &'static str, pos: usize },
    #[error("boolean byte {byte:#04x} (must be 0 or 1) in field `{field}` at byte {pos}")]
    BadBool { field: &'static str, byte: u8, pos: usize },
    #[error("map block in field `{field}` at byte {pos} declares {declared} bytes but its entries take {actual}")]
    BadBlockSize { field: &'static str, declared: u64, actual: usize, pos: usize },
    #[error("duplicate key in field `{field}` at byte {pos}")]
    DuplicateMapKey { field: &'static str, pos: usize },
    #[error("embedding of {len} bytes at byte {pos} is not a multiple of 4 (packed f32)")]
    EmbeddingNotMultipleOf4 { len: usize, pos: usize },
    #[error("{count} trailing bytes after the record, from byte {pos}")]
    TrailingBytes { count: usize, pos: usize },
}

impl DecodeError {
    /// Stable snake_case label, used as the DLQ reason and as a metric label value.
    pub fn kind(&self) -> &'static str {
        match self {
            DecodeError::Truncated { .. } => "truncated",
            DecodeError::VarintOverflow { .. } => "varint_overflow",
            DecodeError::NegativeLength { .. } => "negative_length",
            DecodeError::LengthOverflow { .. } => "length_overflow",
            DecodeError::BadUnionIndex { .. } => "bad_union_index",
            DecodeError::BadEnumIndex { .. } => "bad_enum_index",
            DecodeError::InvalidUtf8 { .. } => "invalid_utf8",
            DecodeError::BadBool { .. } => "bad_bool",
            DecodeError::BadBlockSize { .. } => "bad_block_size",
            DecodeError::DuplicateMapKey { .. } => "duplicate_map_key",
            DecodeError::EmbeddingNotMultipleOf4 { .. } => "embedding_not_multiple_of_4",
            DecodeError::TrailingBytes { .. } => "trailing_bytes",
        }
    }

    /// The byte position the error points at.
    pub fn pos(&self) -> usize {
        match *self {
            DecodeError::Truncated { pos, .. }
            | DecodeError::VarintOverflow { pos, .. }
            | DecodeError::NegativeLength { pos, .. }
            | DecodeError::LengthOverflow { pos, .. }
            | DecodeError::BadUnionIndex { pos, .. }
            | DecodeError::BadEnumIndex { pos, .. }
            | DecodeError::InvalidUtf8 { pos, .. }
            | DecodeError::BadBool { pos, .. }
            | DecodeError::BadBlockSize { pos, .. }
            | DecodeError::DuplicateMapKey { pos, .. }
            | DecodeError::EmbeddingNotMultipleOf4 { pos, .. }
            | DecodeError::TrailingBytes { pos, .. } => pos,
        }
    }
}

// ---------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------

/// Decodes one `LogRecord` datum (no framing), consuming exactly all of `input`. The
/// embedding is copied into bytes of its own; [`decode_shared`] slices it instead.
pub fn decode(input: &[u8]) -> Result<LogRecord, DecodeError> {
    decode_in(input, None)
}

/// [`decode`] of a datum held in shared bytes: the embedding is a slice of `datum`, not
/// a copy (the processor's path: a batch's records share the buffers the consumer filled).
pub fn decode_shared(datum: &Bytes) -> Result<LogRecord, DecodeError> {
    decode_in(datum, Some(datum))
}

fn decode_in(input: &[u8], owner: Option<&Bytes>) -> Result<LogRecord, DecodeError> {
    let mut r = Reader { buf: input, pos: 0 };
    let collection_id = r.string("collection_id")?;
    let id = r.string("id")?;
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
            let (data, pos) = r.bytes("embedding")?;
            let bytes = match owner {
                Some(owner) => owner.slice_ref(data),
                None => Bytes::copy_from_slice(data),
            };
            Some(Embedding::from_le_bytes(bytes).ok_or(DecodeError::EmbeddingNotMultipleOf4 { len: data.len(), pos })?)
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
        _ => Some(r.metadata()?),
    };
    let document = match r.union_index("document", 2)? {
        0 => None,
        _ => Some(r.string("document")?),
    };
    let backfill = match r.union_index("backfill", 2)? {
        0 => None,
        _ => Some(BackfillRef {
            request_id: r.string("backfill.request_id")?,
            function_id: r.string("backfill.function_id")?,
        }),
    };
    let count = r.remaining();
    if count != 0 {
        return Err(DecodeError::TrailingBytes { count, pos: r.pos });
    }
    Ok(LogRecord { collection_id, id, operation, embedding, encoding, metadata, document, backfill })
}

/// Converts packed little-endian f32 bytes to floats, bit for bit (NaN payloads included).
/// Returns `None` when the length is not a multiple of 4.
#[inline]
pub fn f32s_from_le_bytes(bytes: &[u8]) -> Option<Vec<f32>> {
    if bytes.len() % 4 != 0 {
        return None;
    }
    // The loop must sit in this function's body, over `chunks_exact(4)`, for the optimizer
    // to see the constant chunk size and turn it into a vectorized copy (a memcpy on
    // little-endian targets). `collect()`/`extend()` compile to the same copy only when
    // they happen to be inlined; when they are not, they are a scalar loop with a runtime
    // chunk size, 3-4x slower on 1536 dimensions (seen in the benchmark).
    let n = bytes.len() / 4;
    let mut out: Vec<f32> = Vec::with_capacity(n);
    let mut written = 0;
    for (dst, c) in out.spare_capacity_mut().iter_mut().zip(bytes.chunks_exact(4)) {
        dst.write(f32::from_le_bytes([c[0], c[1], c[2], c[3]]));
        written += 1;
    }
    debug_assert_eq!(written, n);
    // SAFETY: the capacity is at least `n` and `chunks_exact(4)` yields exactly `n`
    // chunks, so the loop initialized the first `written == n` elements.
    unsafe { out.set_len(written) };
    Some(out)
}

/// Packs floats as little-endian f32 bytes (the `embedding` wire format).
pub fn f32s_to_le_bytes(values: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * 4);
    put_f32s(&mut out, values);
    out
}

/// A cursor over a datum. Shared with the borrowed decoder ([`super::borrowed`]), so both
/// decoders read every primitive the same way and refuse it with the same error.
/// A map block whose header [`Reader::map_block`] read: its entry count, and what
/// [`Reader::end_map_block`] checks once the entries are read.
pub(crate) struct MapBlock {
    pub(crate) entries: u64,
    declared_size: Option<u64>,
    /// Where the block starts (the position its errors name).
    pos: usize,
    entries_start: usize,
}

pub(crate) struct Reader<'a> {
    pub(crate) buf: &'a [u8],
    pub(crate) pos: usize,
}

impl<'a> Reader<'a> {
    #[inline]
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len().saturating_sub(self.pos)
    }

    /// A zig-zag varint long, at most 10 bytes; the 10th byte may only carry bit 63.
    #[inline(always)]
    pub(crate) fn long(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        // Union branches, enum indexes, short lengths: almost every varint is one byte.
        if let Some(&b) = self.buf.get(self.pos) {
            if b < 0x80 {
                self.pos += 1;
                return Ok(i64::from(b >> 1) ^ -i64::from(b & 1));
            }
        }
        self.long_multibyte(field)
    }

    #[inline(never)]
    fn long_multibyte(&mut self, field: &'static str) -> Result<i64, DecodeError> {
        let start = self.pos;
        let mut z: u64 = 0;
        let mut shift = 0u32;
        loop {
            let Some(&b) = self.buf.get(self.pos) else {
                return Err(DecodeError::Truncated { field, pos: start });
            };
            self.pos += 1;
            if shift == 63 {
                if b > 1 {
                    return Err(DecodeError::VarintOverflow { field, pos: start });
                }
                z |= u64::from(b) << 63;
                break;
            }
            z |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
        }
        Ok((z >> 1) as i64 ^ -((z & 1) as i64))
    }

    #[inline]
    pub(crate) fn union_index(&mut self, field: &'static str, branches: u8) -> Result<u8, DecodeError> {
        let pos = self.pos;
        let index = self.long(field)?;
        match u8::try_from(index) {
            Ok(i) if i < branches => Ok(i),
            _ => Err(DecodeError::BadUnionIndex { field, index, branches, pos }),
        }
    }

    /// Length-prefixed bytes, borrowed from the input. The length is checked against the
    /// remaining input before anything else, so a lying length never causes an allocation.
    #[inline]
    pub(crate) fn bytes(&mut self, field: &'static str) -> Result<(&'a [u8], usize), DecodeError> {
        let start = self.pos;
        let len = self.long(field)?;
        let Ok(len_u) = u64::try_from(len) else {
            return Err(DecodeError::NegativeLength { field, len, pos: start });
        };
        let max = self.remaining();
        let end = match usize::try_from(len_u) {
            Ok(n) if n <= max => self.pos + n,
            _ => return Err(DecodeError::LengthOverflow { field, len: len_u, max, pos: start }),
        };
        let data_pos = self.pos;
        let Some(data) = self.buf.get(data_pos..end) else {
            return Err(DecodeError::Truncated { field, pos: start });
        };
        self.pos = end;
        Ok((data, data_pos))
    }

    #[inline]
    fn string(&mut self, field: &'static str) -> Result<String, DecodeError> {
        self.str_ref(field).map(str::to_owned)
    }

    /// A length-prefixed UTF-8 string, borrowed from the input.
    #[inline]
    pub(crate) fn str_ref(&mut self, field: &'static str) -> Result<&'a str, DecodeError> {
        let (data, data_pos) = self.bytes(field)?;
        match std::str::from_utf8(data) {
            Ok(s) => Ok(s),
            Err(e) => Err(DecodeError::InvalidUtf8 { field, pos: data_pos + e.valid_up_to() }),
        }
    }

    pub(crate) fn fixed<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let pos = self.pos;
        let bytes = self
            .buf
            .get(pos..pos.saturating_add(N))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or(DecodeError::Truncated { field, pos })?;
        self.pos += N;
        Ok(bytes)
    }

    /// Map blocks: `count` (long); if negative, `-count` entries preceded by the block's
    /// byte size; a zero count ends the map. Any number of blocks is accepted.
    fn metadata(&mut self) -> Result<Metadata, DecodeError> {
        const FIELD: &str = "metadata";
        let mut map = Metadata::new();
        while let Some(block) = self.map_block(FIELD)? {
            // One allocation for the usual few keys; more grow the vector as they come
            // (validation refuses more than `max_metadata_keys` after decoding).
            map.reserve(usize::try_from(block.entries.min(16)).unwrap_or(16));
            for _ in 0..block.entries {
                let key_pos = self.pos;
                let key = self.string("metadata.key")?;
                let value = self.meta_value()?;
                // Writers often send keys in order: appending is then one comparison.
                let refused = map.try_append(key, value).and_then(|(key, value)| map.try_insert(key, value));
                if refused.is_some() {
                    return Err(DecodeError::DuplicateMapKey { field: FIELD, pos: key_pos });
                }
            }
            self.end_map_block(FIELD, block)?;
        }
        Ok(map)
    }

    /// The header of a map block, checked: `None` for the end block (count 0). A negative
    /// count is followed by the block's byte size. Every entry takes at least 2 bytes (key
    /// length, value branch), so a count that cannot fit the input left is refused before
    /// any entry is read, which also bounds what the caller allocates; so is a byte size
    /// larger than the input left.
    #[inline]
    pub(crate) fn map_block(&mut self, field: &'static str) -> Result<Option<MapBlock>, DecodeError> {
        let pos = self.pos;
        let count = self.long(field)?;
        if count == 0 {
            return Ok(None);
        }
        let entries = count.unsigned_abs();
        let declared_size = if count < 0 {
            let size_pos = self.pos;
            let size = self.long(field)?;
            let Ok(size) = u64::try_from(size) else {
                return Err(DecodeError::NegativeLength { field, len: size, pos: size_pos });
            };
            Some(size)
        } else {
            None
        };
        let max = self.remaining();
        if entries > (max / 2) as u64 {
            return Err(DecodeError::LengthOverflow { field, len: entries, max: max / 2, pos });
        }
        if let Some(size) = declared_size {
            if size > max as u64 {
                return Err(DecodeError::LengthOverflow { field, len: size, max, pos });
            }
        }
        Ok(Some(MapBlock { entries, declared_size, pos, entries_start: self.pos }))
    }

    /// After a block's entries: its declared byte size, if it has one, must be what they took.
    #[inline]
    pub(crate) fn end_map_block(&self, field: &'static str, block: MapBlock) -> Result<(), DecodeError> {
        if let Some(declared) = block.declared_size {
            let actual = self.pos - block.entries_start;
            if actual as u64 != declared {
                return Err(DecodeError::BadBlockSize { field, declared, actual, pos: block.pos });
            }
        }
        Ok(())
    }

    fn meta_value(&mut self) -> Result<MetaValue, DecodeError> {
        const FIELD: &str = "metadata.value";
        Ok(match self.union_index(FIELD, 5)? {
            0 => MetaValue::Null,
            1 => MetaValue::String(self.string(FIELD)?),
            2 => MetaValue::Long(self.long(FIELD)?),
            3 => MetaValue::Double(f64::from_le_bytes(self.fixed::<8>(FIELD)?)),
            _ => {
                let pos = self.pos;
                match self.fixed::<1>(FIELD)?[0] {
                    0 => MetaValue::Bool(false),
                    1 => MetaValue::Bool(true),
                    byte => return Err(DecodeError::BadBool { field: FIELD, byte, pos }),
                }
            }
        })
    }
}

// ---------------------------------------------------------------------------------------
// Encoding
// ---------------------------------------------------------------------------------------

/// Encodes a `LogRecord` datum (no framing). Byte-identical to apache-avro's encoding of
/// the same record, except that metadata entries are written in key order (apache-avro
/// writes a `HashMap`'s arbitrary order). Maps are written as one positive-count block.
pub fn encode(record: &LogRecord) -> Vec<u8> {
    let mut out = Vec::with_capacity(encoded_len_hint(record));
    encode_into(record, &mut out);
    out
}

/// Appends the encoding of `record` to `out`.
pub fn encode_into(record: &LogRecord, out: &mut Vec<u8>) {
    put_str(out, &record.collection_id);
    put_str(out, &record.id);
    put_long(out, i64::from(record.operation.avro_index()));
    match &record.embedding {
        None => put_long(out, 0),
        Some(values) => {
            put_long(out, 1);
            put_long(out, values.as_le_bytes().len() as i64);
            out.extend_from_slice(values.as_le_bytes());
        }
    }
    match record.encoding {
        Encoding::Float32 => put_long(out, 0),
    }
    match &record.metadata {
        None => put_long(out, 0),
        Some(map) => {
            put_long(out, 1);
            if !map.is_empty() {
                put_long(out, map.len() as i64);
                for (key, value) in map {
                    put_str(out, key);
                    put_meta_value(out, value);
                }
            }
            put_long(out, 0);
        }
    }
    match &record.document {
        None => put_long(out, 0),
        Some(doc) => {
            put_long(out, 1);
            put_str(out, doc);
        }
    }
    match &record.backfill {
        None => put_long(out, 0),
        Some(b) => {
            put_long(out, 1);
            put_str(out, &b.request_id);
            put_str(out, &b.function_id);
        }
    }
}

/// An upper-bound-ish capacity estimate, so `encode` allocates once.
fn encoded_len_hint(record: &LogRecord) -> usize {
    let mut n = 64 + record.collection_id.len() + record.id.len();
    n += record.embedding.as_ref().map_or(0, |e| e.len() * 4);
    n += record.metadata.as_ref().map_or(0, |m| m.iter().map(|(k, v)| 20 + k.len() + meta_len(v)).sum());
    n += record.document.as_ref().map_or(0, String::len);
    n += record.backfill.as_ref().map_or(0, |b| b.request_id.len() + b.function_id.len());
    n
}

fn meta_len(v: &MetaValue) -> usize {
    match v {
        MetaValue::String(s) => s.len(),
        _ => 0,
    }
}

pub(crate) fn put_meta_value(out: &mut Vec<u8>, value: &MetaValue) {
    match value {
        MetaValue::Null => put_long(out, 0),
        MetaValue::String(s) => {
            put_long(out, 1);
            put_str(out, s);
        }
        MetaValue::Long(l) => {
            put_long(out, 2);
            put_long(out, *l);
        }
        MetaValue::Double(d) => {
            put_long(out, 3);
            out.extend_from_slice(&d.to_le_bytes());
        }
        MetaValue::Bool(b) => {
            put_long(out, 4);
            out.push(u8::from(*b));
        }
    }
}

#[inline]
pub(crate) fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

#[inline]
pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
    put_long(out, s.len() as i64);
    out.extend_from_slice(s.as_bytes());
}

#[inline]
/// Appends floats as little-endian f32 bytes (the one packing of embeddings: the wire
/// format and the sysdb's storage format are the same).
pub fn put_f32s(out: &mut Vec<u8>, values: &[f32]) {
    // As in `f32s_from_le_bytes`: fixed-size chunks over a slice already sized, so the
    // loop is a vectorized copy. One `extend_from_slice` per value checks the capacity
    // each time and stays scalar (measured: 4% of a W1 drain's CPU).
    let start = out.len();
    out.resize(start + values.len() * 4, 0);
    for (dst, v) in out[start..].chunks_exact_mut(4).zip(values) {
        dst.copy_from_slice(&v.to_le_bytes());
    }
}

#[cfg(test)]
#[path = "codec_tests.rs"]
pub(crate) mod tests;
