//! The change feed's outbox, the part both backends share (`docs/changes.md`): the
//! changes a function's output writes make, and how the relay's reads are bounded.
//!
//! Each backend appends a transaction's changes at its end, in the order they were
//! applied: the batch's record changes (from the processor's fold), then its function
//! outputs' changes. The append takes the partition's next sequence numbers from its
//! `changelog_partitions` row, which it updates: on PostgreSQL that row's lock is held to
//! the commit, so two transactions that write changes of one partition (a batch and a
//! backfill chunk) commit in sequence order, and the relay, reading in sequence order,
//! never passes a sequence number that a later commit fills in.

use super::types::{ChangeOp, ChangelogEntry, OutboxChange};
use crate::record::change::encode_change;
use crate::record::Record;

/// The change of an output record written as `record` (`existed`: it was there before).
pub(crate) fn put(collection: &str, record: &Record, existed: bool) -> OutboxChange {
    OutboxChange {
        collection_id: collection.to_string(),
        record_id: record.id.clone(),
        op: if existed { ChangeOp::Update } else { ChangeOp::Insert },
        source_offset: record.offset,
        value: Some(encode_change(collection, record)),
    }
}

/// The change of an output record removed by a write at `offset`.
pub(crate) fn delete(collection: &str, id: &str, offset: i64) -> OutboxChange {
    OutboxChange {
        collection_id: collection.to_string(),
        record_id: id.to_string(),
        op: ChangeOp::Delete,
        source_offset: offset,
        value: None,
    }
}

/// Keep rows (in sequence order) until `max_bytes` of changes are taken (at least one
/// row): the relay's transaction bound.
pub(crate) fn within_bytes(rows: Vec<ChangelogEntry>, max_bytes: usize) -> Vec<ChangelogEntry> {
    let mut bytes = 0usize;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        if !out.is_empty() && bytes + r.change.bytes() > max_bytes {
            break;
        }
        bytes += r.change.bytes();
        out.push(r);
    }
    out
}
