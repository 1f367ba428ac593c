//! The one offset convention, and the position algebra the processor commits with.
//!
//! Two numbers describe progress and they are easy to mix up (one is "next to read", the other "last applied"):
//!
//! * `next_offset` (per partition, in the sysdb): the **next Kafka offset to read**. This
//!   is Kafka's own convention — a committed group offset means the same thing — so it is
//!   what goes into the assignment and into the group commit unchanged.
//! * `log_position` (per collection): the offset of the **last applied** record of that
//!   collection, `-1` when none has been applied.
//!
//! The only conversions between them are [`next_offset_after`] and
//! [`last_applied_before`]. Nothing else in the code adds or subtracts 1 from an offset.

use thiserror::Error;

/// `log_position` of a collection (or partition) to which nothing has been applied.
pub const NO_POSITION: i64 = -1;

/// The `next_offset` that follows the record at `last_applied` (inclusive → exclusive).
/// `next_offset_after(NO_POSITION) == 0`.
pub const fn next_offset_after(last_applied: i64) -> i64 {
    last_applied + 1
}

/// The last applied offset implied by a `next_offset` (exclusive → inclusive).
/// `last_applied_before(0) == NO_POSITION`.
pub const fn last_applied_before(next_offset: i64) -> i64 {
    next_offset - 1
}

/// Progress of one partition in one batch: the half-open offset range `[from, to)`,
/// i.e. the batch read from `next_offset == from` and leaves `next_offset == to`.
/// It applies only where the stored position is still `from` (compare-and-set).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionDelta {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
}

/// Why a [`PositionDelta`] cannot be applied to the stored position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
pub enum IncompatibleDelta {
    /// Someone else moved the partition (a zombie replica, an operator reset): the batch
    /// must be dropped and the worker must re-read the sysdb position.
    #[error("partition {partition}: batch starts at offset {expected} but the sysdb holds next_offset {stored}; another replica or an operator moved it")]
    PositionMoved { partition: i32, expected: i64, stored: i64 },
    /// The sysdb has no row for the partition but the batch does not start at its
    /// recorded starting point.
    #[error("partition {partition}: the sysdb has no position but the batch expected one at {expected}")]
    Missing { partition: i32, expected: i64 },
}

/// A delta whose `to` is before its `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("partition {partition}: position would move backwards from {from} to {to}")]
pub struct BackwardsDelta {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
}

impl PositionDelta {
    /// A delta covering the records `[from, to)`; `to == from` is an empty (no-op) delta.
    pub fn new(partition: i32, from: i64, to: i64) -> Result<Self, BackwardsDelta> {
        if to < from || from < 0 {
            return Err(BackwardsDelta { partition, from, to });
        }
        Ok(PositionDelta { partition, from, to })
    }

    /// Check the delta against the stored `next_offset` without changing anything.
    /// `stored == None` means the sysdb has no row for the partition yet; a delta is then
    /// accepted only when the caller created the row with `from` in the same transaction,
    /// so `None` is always incompatible here.
    pub fn check(&self, stored: Option<i64>) -> Result<(), IncompatibleDelta> {
        match stored {
            Some(s) if s == self.from => Ok(()),
            Some(s) => {
                Err(IncompatibleDelta::PositionMoved { partition: self.partition, expected: self.from, stored: s })
            }
            None => Err(IncompatibleDelta::Missing { partition: self.partition, expected: self.from }),
        }
    }

    /// The `log_position` of the last record inside the delta, or `None` if it is empty.
    pub fn last_applied(&self) -> Option<i64> {
        (self.to > self.from).then(|| last_applied_before(self.to))
    }
}

/// Whether a group commit of `candidate` should be sent given the last one sent: group
/// offsets only move forward (design.md invariant 3).
pub fn group_commit_advances(last_committed: Option<i64>, candidate: i64) -> bool {
    match last_committed {
        Some(c) => candidate > c,
        None => candidate >= 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn conversions_at_the_boundaries() {
        assert_eq!(next_offset_after(NO_POSITION), 0);
        assert_eq!(last_applied_before(0), NO_POSITION);
        assert_eq!(next_offset_after(0), 1);
        assert_eq!(last_applied_before(1), 0);
    }

    #[test]
    fn delta_cas_accepts_only_its_start() {
        let d = PositionDelta::new(3, 10, 15).unwrap();
        assert!(d.check(Some(10)).is_ok());
        assert_eq!(d.check(Some(15)), Err(IncompatibleDelta::PositionMoved { partition: 3, expected: 10, stored: 15 }));
        assert_eq!(d.check(None), Err(IncompatibleDelta::Missing { partition: 3, expected: 10 }));
        assert_eq!(d.last_applied(), Some(14));
        assert_eq!(PositionDelta::new(3, 10, 10).unwrap().last_applied(), None);
        assert!(PositionDelta::new(3, 10, 9).is_err());
    }

    #[test]
    fn group_commits_never_go_backwards() {
        assert!(group_commit_advances(None, 0));
        assert!(group_commit_advances(Some(4), 5));
        assert!(!group_commit_advances(Some(5), 5));
        assert!(!group_commit_advances(Some(6), 5));
    }

    proptest! {
        /// Chaining deltas from any start reaches the sum of the batches, and a replay
        /// of any earlier delta is refused (no double-apply).
        #[test]
        fn chained_deltas_refuse_replays(start in 0i64..1000, sizes in proptest::collection::vec(0i64..50, 1..20)) {
            let mut stored = start;
            let mut applied = Vec::new();
            for s in sizes {
                let d = PositionDelta::new(0, stored, stored + s).unwrap();
                prop_assert!(d.check(Some(stored)).is_ok());
                stored = d.to;
                applied.push(d);
            }
            for d in applied.iter().filter(|d| d.to > d.from) {
                prop_assert!(d.check(Some(stored)).is_err() || d.from == stored);
            }
            prop_assert_eq!(last_applied_before(next_offset_after(stored)), stored);
        }
    }
}
