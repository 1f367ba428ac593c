//! A record as SQLite returns it, before decoding, shared by every read of whole
//! records; and the backend's name in its errors.

use crate::record::Record;
use crate::sysdb::error::Result;
use crate::sysdb::stored_fields::decode_record;

/// The backend's name in errors and logs.
pub(super) const BACKEND: &str = "sqlite";

pub(super) type RawRecord = (String, Option<Vec<u8>>, Option<String>, Option<String>, i64);

pub(super) fn raw_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

pub(super) fn decode_raw((id, emb, md, doc, off): RawRecord) -> Result<Record> {
    decode_record(BACKEND, id, emb, md, doc, off)
}
