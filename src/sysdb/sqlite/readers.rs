//! Reads that never write: reader connections, and pages of records with the unmerged
//! delta folded in at read time.
//!
//! A reader connection is `query_only` (a read-only open when the command only reads), so
//! a read cannot begin a write transaction, take the write lock, merge or compact; in WAL
//! mode it neither waits for a commit nor delays one. Each read runs in one snapshot: a
//! deferred transaction whose first statement fixes what every later statement of it sees.

use rusqlite::{params, Connection};

use super::rows::{raw_record, RawRecord};
use super::values::{self, RECORDS_WITH_VALUES, RECORD_COLUMNS};
use crate::sysdb::error::Result;

/// A page of `collection` in id order after `after` (exclusive), at most `limit` records,
/// in one snapshot: the records of `records` merged with the newest delta row of each key
/// (a delete there hides the key), read as two ordered streams and joined here. Memory:
/// the page, and the delta rows of one key at a time (SQLite sorts the collection's delta
/// rows, spilling to a temporary file past its cache).
pub(super) fn list_page(c: &Connection, collection: &str, after: Option<&str>, limit: usize) -> Result<Vec<RawRecord>> {
    let snapshot = c.unchecked_transaction()?;
    let after_clause = if after.is_some() { "AND id > ?2" } else { "AND ?2 IS NULL" };
    let mut delta_stmt = snapshot.prepare_cached(&format!(
        "SELECT id, metadata, last_offset, value FROM record_delta WHERE collection_id = ?1 {after_clause} ORDER BY id, seq"
    ))?;
    let r_after = if after.is_some() { "AND r.id > ?2" } else { "AND ?2 IS NULL" };
    let mut records_stmt = snapshot.prepare_cached(&format!(
        "SELECT {RECORD_COLUMNS} FROM {RECORDS_WITH_VALUES} WHERE r.collection_id = ?1 {r_after} ORDER BY r.id"
    ))?;
    let mut delta_rows = delta_stmt.query(params![collection, after])?;
    let mut records = records_stmt.query(params![collection, after])?;

    // The newest delta row of the next key: (id, metadata, last_offset (None = deleted), value).
    type Newest = (String, Option<String>, Option<i64>, Option<i64>);
    let mut pending_delta: Option<Newest> = None;
    let mut next_delta = |pending: &mut Option<Newest>| -> Result<Option<Newest>> {
        let mut current = pending.take();
        while let Some(r) = delta_rows.next()? {
            let row: Newest = (r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?);
            match &current {
                Some(cur) if cur.0 != row.0 => {
                    *pending = Some(row);
                    return Ok(current);
                }
                _ => current = Some(row),
            }
        }
        Ok(current)
    };
    let mut next_record = || -> Result<Option<RawRecord>> {
        Ok(match records.next()? {
            Some(r) => Some(raw_record(r)?),
            None => None,
        })
    };
    let mut page = Vec::with_capacity(limit.min(4096));
    let mut d = next_delta(&mut pending_delta)?;
    let mut rec = next_record()?;
    while page.len() < limit {
        let take_delta = match (&d, &rec) {
            (None, None) => break,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (Some(dk), Some(rk)) => dk.0 <= rk.0,
        };
        if take_delta {
            let (id, metadata, last_offset, value) = d.take().expect("a delta row");
            if rec.as_ref().is_some_and(|r| r.0 == id) {
                rec = next_record()?; // the delta row overrides it
            }
            if let Some(offset) = last_offset {
                let (embedding, document) = match value {
                    Some(seq) => values::read_value(&snapshot, seq)?,
                    None => (None, None),
                };
                page.push((id, embedding, metadata, document, offset));
            }
            d = next_delta(&mut pending_delta)?;
        } else {
            page.push(rec.take().expect("a record"));
            rec = next_record()?;
        }
    }
    Ok(page)
}
