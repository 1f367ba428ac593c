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
//!
//! The snapshot (`docs/changes.md` section 2): a partition's records, walked in
//! (collection, id) order in chunks, each chunk one write transaction that appends the
//! records' current state (operation `snapshot`) and advances the partition's cursor. A
//! chunk reads the records after it holds what orders the partition's changes (SQLite's
//! one writer; on PostgreSQL the `changelog_partitions` row lock, taken first), so a batch
//! either committed before the chunk (which then reads its writes) or appends its changes
//! after the chunk's: the last message of every record is its current state.

use super::types::{ChangeOp, ChangelogEntry, OutboxChange, SnapshotStep};
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

/// The snapshot message of a record as it is now: operation `snapshot`, source offset
/// the record's own (the log offset of its last change).
pub(crate) fn snapshot(collection: &str, record: &Record) -> OutboxChange {
    OutboxChange {
        collection_id: collection.to_string(),
        record_id: record.id.clone(),
        op: ChangeOp::Snapshot,
        source_offset: record.offset,
        value: Some(encode_change(collection, record)),
    }
}

/// One snapshot chunk being filled: at most `max_records` records, and it closes after the
/// record that reaches `max_bytes` (at least one record), like a relay transaction, so a
/// chunk is published by one transaction.
pub(crate) struct SnapshotChunk {
    max_records: usize,
    max_bytes: usize,
    bytes: usize,
    pub changes: Vec<OutboxChange>,
}

impl SnapshotChunk {
    pub(crate) fn new(max_records: usize, max_bytes: usize) -> Self {
        SnapshotChunk { max_records: max_records.max(1), max_bytes: max_bytes.max(1), bytes: 0, changes: Vec::new() }
    }

    /// Records still wanted.
    pub(crate) fn room(&self) -> usize {
        if self.full() {
            0
        } else {
            self.max_records - self.changes.len()
        }
    }

    pub(crate) fn full(&self) -> bool {
        self.changes.len() >= self.max_records || self.bytes >= self.max_bytes
    }

    /// Add `record` of `collection` (the caller stops once [`SnapshotChunk::full`]).
    pub(crate) fn take(&mut self, collection: &str, record: &Record) {
        let change = snapshot(collection, record);
        self.bytes += change.bytes();
        self.changes.push(change);
    }

    /// The chunk's cursor: its last record.
    pub(crate) fn cursor(&self) -> Option<(String, String)> {
        self.changes.last().map(|c| (c.collection_id.clone(), c.record_id.clone()))
    }

    /// What the step did, the walk complete when it ran out of records before it was full.
    pub(crate) fn step(&self, total_before: i64) -> SnapshotStep {
        let records = self.changes.len();
        SnapshotStep::Appended {
            records,
            bytes: self.changes.iter().map(|c| c.bytes() as i64).sum(),
            cursor: self.cursor(),
            finished: !self.full(),
            total: total_before + records as i64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Metadata;

    fn rec(id: &str, doc_bytes: usize) -> Record {
        Record {
            id: id.into(),
            embedding: None,
            metadata: Metadata::new(),
            document: Some("x".repeat(doc_bytes)),
            offset: 7,
        }
    }

    #[test]
    fn a_snapshot_chunk_closes_at_its_records_or_after_the_record_reaching_its_bytes() {
        let mut c = SnapshotChunk::new(3, usize::MAX);
        assert_eq!(c.room(), 3);
        for id in ["a", "b", "c"] {
            c.take("col", &rec(id, 1));
        }
        assert!(c.full());
        assert_eq!(c.room(), 0);
        let SnapshotStep::Appended { records, finished, cursor, total, .. } = c.step(10) else { panic!("appended") };
        assert_eq!((records, finished, total), (3, false, 13), "a full chunk does not finish the walk");
        assert_eq!(cursor, Some(("col".into(), "c".into())));
        assert_eq!(c.changes[0].op, ChangeOp::Snapshot);
        assert_eq!(c.changes[0].source_offset, 7, "the record's own offset");

        let mut big = SnapshotChunk::new(100, 500);
        big.take("col", &rec("a", 1000));
        assert!(big.full(), "one record past the bytes closes the chunk");
        let mut short = SnapshotChunk::new(100, 10_000);
        short.take("col", &rec("a", 10));
        assert!(matches!(short.step(0), SnapshotStep::Appended { finished: true, records: 1, .. }));
        assert!(matches!(
            SnapshotChunk::new(5, 5).step(4),
            SnapshotStep::Appended { finished: true, records: 0, total: 4, .. }
        ));
    }
}
