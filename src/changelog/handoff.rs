//! The committed changes of a partition's own batches, handed to its relay in memory so
//! that it publishes them without reading them back from the outbox.
//!
//! The outbox stays the record (a change is written there in its batch's transaction and
//! deleted once published); this is only a copy of its newest rows. The relay takes from
//! it a run that starts exactly at the sequence number it publishes next and has no hole;
//! anything else — a restart, a relay that fell behind past the bound, changes appended by
//! another writer (a backfill chunk, a detach, a snapshot step, another process on the
//! same SQLite file) — makes it read the outbox as before. A copy is only made after its
//! transaction committed, so every row it holds is in the outbox with the same number.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use crate::sysdb::{ChangelogEntry, OutboxChange};

/// Per partition, the copies of its latest committed changes, at most `max_bytes` each.
pub(crate) struct Handoff {
    max_bytes: usize,
    parts: Mutex<HashMap<i32, Tail>>,
}

#[derive(Default)]
struct Tail {
    rows: VecDeque<ChangelogEntry>,
    bytes: usize,
}

impl Handoff {
    pub(crate) fn new(max_bytes: usize) -> Handoff {
        Handoff { max_bytes, parts: Mutex::default() }
    }

    /// A transaction of `partition` committed `changes` numbered from `first_seq` on.
    /// Over the bound, the oldest copies go first (the relay reads those from the outbox).
    pub(crate) fn committed(
        &self,
        partition: i32,
        first_seq: i64,
        changes: impl IntoIterator<Item = OutboxChange>,
        now_ms: i64,
    ) {
        if self.max_bytes == 0 {
            return;
        }
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let tail = parts.entry(partition).or_default();
        if tail.rows.back().is_some_and(|last| last.seq >= first_seq) {
            // Numbers that went backwards: the outbox was not what this copy assumed (a
            // restored sysdb); forget the copies rather than hand over a stale one.
            *tail = Tail::default();
        }
        for (i, change) in changes.into_iter().enumerate() {
            tail.bytes += change.bytes();
            tail.rows.push_back(ChangelogEntry { partition, seq: first_seq + i as i64, change, created_at_ms: now_ms });
        }
        while tail.bytes > self.max_bytes {
            match tail.rows.pop_front() {
                Some(old) => tail.bytes -= old.change.bytes(),
                None => break,
            }
        }
    }

    /// How many of the leading `sizes` (bytes of a transaction's changes, in order) the
    /// bound would drop at once: those need not be copied at all.
    pub(crate) fn dropped_at_once(&self, sizes: &[usize]) -> usize {
        let mut room = self.max_bytes;
        let mut kept = 0;
        for &b in sizes.iter().rev() {
            if b > room {
                break;
            }
            room -= b;
            kept += 1;
        }
        sizes.len() - kept
    }

    /// The run of `partition`'s changes after `after_seq`, within `max_records` and
    /// `max_bytes` (at least one change), if the copies start right after it; `None`:
    /// read the outbox. Copies at or before `after_seq` (published) are dropped.
    pub(crate) fn take(
        &self,
        partition: i32,
        after_seq: i64,
        max_records: usize,
        max_bytes: usize,
    ) -> Option<Vec<ChangelogEntry>> {
        let mut parts = self.parts.lock().unwrap_or_else(|p| p.into_inner());
        let tail = parts.get_mut(&partition)?;
        while tail.rows.front().is_some_and(|r| r.seq <= after_seq) {
            if let Some(old) = tail.rows.pop_front() {
                tail.bytes -= old.change.bytes();
            }
        }
        if tail.rows.front()?.seq != after_seq + 1 {
            return None;
        }
        let (mut out, mut bytes) = (Vec::new(), 0usize);
        while let Some(next) = tail.rows.front() {
            let b = next.change.bytes();
            let expected = after_seq + 1 + out.len() as i64;
            if next.seq != expected || out.len() >= max_records.max(1) || (!out.is_empty() && bytes + b > max_bytes) {
                break;
            }
            bytes += b;
            tail.bytes -= b;
            out.extend(tail.rows.pop_front());
        }
        Some(out)
    }

    /// Forget `partition`'s copies (its relay stopped: the partition may move).
    pub(crate) fn forget(&self, partition: i32) {
        self.parts.lock().unwrap_or_else(|p| p.into_inner()).remove(&partition);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysdb::ChangeOp;

    fn change(id: &str, len: usize) -> OutboxChange {
        OutboxChange {
            collection_id: "c".into(),
            record_id: id.into(),
            op: ChangeOp::Insert,
            source_offset: 0,
            value: Some(vec![7; len]),
        }
    }

    fn seqs(rows: &Option<Vec<ChangelogEntry>>) -> Option<Vec<i64>> {
        rows.as_ref().map(|r| r.iter().map(|e| e.seq).collect())
    }

    #[test]
    fn a_run_is_handed_over_only_from_the_next_number_and_up_to_a_hole() {
        let h = Handoff::new(1 << 20);
        h.committed(0, 10, [change("a", 10), change("b", 10)], 1);
        // Another writer appended 12..=13 (not copied here); then our batch 14..=15.
        h.committed(0, 14, [change("c", 10), change("d", 10)], 2);
        assert_eq!(seqs(&h.take(0, 8, 100, 1 << 20)), None, "9 is not copied: read the outbox");
        assert_eq!(seqs(&h.take(0, 9, 100, 1 << 20)), Some(vec![10, 11]), "stops at the hole");
        assert_eq!(seqs(&h.take(0, 11, 100, 1 << 20)), None, "12 is not copied");
        assert_eq!(seqs(&h.take(0, 13, 100, 1 << 20)), Some(vec![14, 15]));
        assert_eq!(seqs(&h.take(0, 15, 100, 1 << 20)), None, "nothing newer");
        assert_eq!(seqs(&h.take(1, -1, 100, 1 << 20)), None, "another partition");
    }

    #[test]
    fn runs_respect_the_transaction_bounds_and_published_copies_are_dropped() {
        let h = Handoff::new(1 << 20);
        h.committed(3, 0, (0..10).map(|i| change(&i.to_string(), 100)), 1);
        let first = h.take(3, -1, 4, 1 << 20).unwrap();
        assert_eq!(first.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![0, 1, 2, 3]);
        assert_eq!(first[2].change.record_id, "2");
        // Bytes: at least one change, then while they fit.
        let bytes = change("x", 100).bytes();
        assert_eq!(seqs(&h.take(3, 3, 100, bytes * 2 + 1)), Some(vec![4, 5]));
        assert_eq!(seqs(&h.take(3, 5, 100, 1)), Some(vec![6]), "one change even over the byte bound");
        // The relay published 7 from the outbox meanwhile: 7 is dropped, 8 is next.
        assert_eq!(seqs(&h.take(3, 7, 100, 1 << 20)), Some(vec![8, 9]));
    }

    #[test]
    fn the_copies_stay_within_their_bound_oldest_first() {
        let one = change("x", 1000).bytes();
        let h = Handoff::new(one * 3);
        h.committed(0, 0, (0..5).map(|i| change(&i.to_string(), 1000)), 1);
        assert_eq!(seqs(&h.take(0, -1, 100, 1 << 20)), None, "0 and 1 were dropped: read them from the outbox");
        assert_eq!(seqs(&h.take(0, 1, 100, 1 << 20)), Some(vec![2, 3, 4]));
        // A batch larger than the bound keeps its newest changes only.
        h.committed(0, 5, (0..4).map(|i| change(&i.to_string(), 1000)), 2);
        assert_eq!(seqs(&h.take(0, 4, 100, 1 << 20)), None);
        // Numbers that go backwards drop the copies.
        h.committed(0, 20, [change("a", 10)], 3);
        h.committed(0, 3, [change("b", 10)], 4);
        assert_eq!(seqs(&h.take(0, 2, 100, 1 << 20)), Some(vec![3]));
        h.committed(0, 4, [change("c", 10)], 5);
        h.forget(0);
        assert_eq!(seqs(&h.take(0, 3, 100, 1 << 20)), None);
        // What the bound would drop at once is counted before anything is copied.
        assert_eq!(h.dropped_at_once(&[one, one, one, one]), 1);
        assert_eq!(h.dropped_at_once(&[one * 4, 1, 1]), 1);
        assert_eq!(h.dropped_at_once(&[]), 0);
        assert_eq!(Handoff::new(0).dropped_at_once(&[1, 1]), 2);
        assert_eq!(Handoff::new(0).take(0, -1, 1, 1), None);
    }
}
