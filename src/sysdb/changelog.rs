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

/// The changes of an output collection dropped by a detach: a delete of each of its
/// records, at source offset -1 (an operator's action, no log record).
pub(crate) fn dropped(collection: &str, ids: impl IntoIterator<Item = String>) -> Vec<OutboxChange> {
    ids.into_iter().map(|id| delete(collection, &id, -1)).collect()
}

/// Rows taken in sequence order while they fit in `max_bytes` of changes (at least one
/// row): the relay's transaction bound. Backends read rows one by one into it and stop
/// at the first it refuses, so no more than the bound and one row are ever held.
pub(crate) struct WithinBytes {
    max_bytes: usize,
    bytes: usize,
    pub rows: Vec<ChangelogEntry>,
}

impl WithinBytes {
    pub(crate) fn new(max_bytes: usize) -> Self {
        WithinBytes { max_bytes, bytes: 0, rows: Vec::new() }
    }

    /// Take `row` if it fits; `false`: it does not, stop reading.
    pub(crate) fn take(&mut self, row: ChangelogEntry) -> bool {
        let b = row.change.bytes();
        if !self.rows.is_empty() && self.bytes.saturating_add(b) > self.max_bytes {
            return false;
        }
        self.bytes += b;
        self.rows.push(row);
        true
    }
}
