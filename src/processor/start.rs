//! Where a newly assigned partition starts (docs/design.md invariants 1 and 11), as a pure function.

use crate::config::{OnDataLoss, ResetPolicy};
use crate::kafka::PartitionInfo;

/// Where the starting offset came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartSource {
    /// The sysdb row (the normal case).
    Sysdb,
    /// No sysdb row: the group's committed offset (first start / migration).
    GroupOffset,
    /// No sysdb row and no group offset: the configured reset policy.
    Reset,
}

/// The decision for one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Start {
    pub partition: i32,
    /// Next offset to read.
    pub offset: i64,
    pub source: StartSource,
    /// `(from, to)`: records `[from, to)` were deleted before being processed.
    pub gap: Option<(i64, i64)>,
    /// Assign but do not consume (halted on a gap, or the sysdb is ahead of the log).
    pub halted: Option<HaltReason>,
    /// The group offset is ahead of the sysdb (the sysdb wins; warn and count).
    pub group_ahead: bool,
    /// A sysdb row must be created with `offset` before the first batch.
    pub needs_row: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltReason {
    /// Retention deleted records the sysdb never saw (`on_data_loss = "halt"`).
    DataLoss { from: i64, to: i64 },
    /// The sysdb position is beyond the partition's high watermark: the topic was
    /// recreated or the broker lost data. Only an operator can decide.
    AheadOfLog { sysdb: i64, high: i64 },
}

/// Decide the start of one partition from the sysdb row (if any) and what the broker says.
pub fn resolve_start(sysdb: Option<i64>, info: PartitionInfo, reset: ResetPolicy, on_loss: OnDataLoss) -> Start {
    let (candidate, source) = match (sysdb, info.group_offset) {
        (Some(n), _) => (n, StartSource::Sysdb),
        (None, Some(g)) => (g, StartSource::GroupOffset),
        (None, None) => (
            match reset {
                ResetPolicy::Earliest => info.low,
                ResetPolicy::Latest => info.high,
            },
            StartSource::Reset,
        ),
    };
    let group_ahead = matches!((sysdb, info.group_offset), (Some(n), Some(g)) if g > n);
    let mut start = Start {
        partition: info.partition,
        offset: candidate,
        source,
        gap: None,
        halted: None,
        group_ahead,
        needs_row: sysdb.is_none(),
    };
    if candidate < info.low {
        // Records [candidate, low) are gone. A group offset below the log start is the
        // same loss seen from a first start: no silent reset either way.
        match on_loss {
            OnDataLoss::Halt => start.halted = Some(HaltReason::DataLoss { from: candidate, to: info.low }),
            OnDataLoss::Skip => {
                start.gap = Some((candidate, info.low));
                start.offset = info.low;
            }
        }
    } else if candidate > info.high {
        start.halted = Some(HaltReason::AheadOfLog { sysdb: candidate, high: info.high });
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(group: Option<i64>, low: i64, high: i64) -> PartitionInfo {
        PartitionInfo { partition: 2, group_offset: group, low, high }
    }

    #[test]
    fn sysdb_wins_over_the_group_offset_either_way() {
        let behind = resolve_start(Some(50), info(Some(10), 0, 100), ResetPolicy::Earliest, OnDataLoss::Halt);
        assert_eq!((behind.offset, behind.source, behind.group_ahead), (50, StartSource::Sysdb, false));
        let ahead = resolve_start(Some(50), info(Some(90), 0, 100), ResetPolicy::Earliest, OnDataLoss::Halt);
        assert_eq!((ahead.offset, ahead.group_ahead, ahead.needs_row), (50, true, false));
    }

    #[test]
    fn group_offset_then_reset_policy_only_without_a_row() {
        let g = resolve_start(None, info(Some(7), 0, 100), ResetPolicy::Latest, OnDataLoss::Halt);
        assert_eq!((g.offset, g.source, g.needs_row), (7, StartSource::GroupOffset, true));
        let e = resolve_start(None, info(None, 3, 100), ResetPolicy::Earliest, OnDataLoss::Halt);
        assert_eq!((e.offset, e.source), (3, StartSource::Reset));
        let l = resolve_start(None, info(None, 3, 100), ResetPolicy::Latest, OnDataLoss::Halt);
        assert_eq!(l.offset, 100);
    }

    #[test]
    fn boundaries_are_not_gaps() {
        // Empty partition, a position exactly at the log start and exactly at the end.
        for (n, low, high) in [(0, 0, 0), (5, 5, 9), (9, 5, 9)] {
            let s = resolve_start(Some(n), info(None, low, high), ResetPolicy::Earliest, OnDataLoss::Halt);
            assert_eq!((s.offset, s.gap, s.halted), (n, None, None), "n={n} low={low} high={high}");
        }
    }

    #[test]
    fn a_gap_halts_or_is_skipped_and_recorded() {
        let h = resolve_start(Some(4), info(None, 10, 20), ResetPolicy::Earliest, OnDataLoss::Halt);
        assert_eq!(h.halted, Some(HaltReason::DataLoss { from: 4, to: 10 }));
        assert_eq!(h.offset, 4);
        let s = resolve_start(Some(4), info(None, 10, 20), ResetPolicy::Earliest, OnDataLoss::Skip);
        assert_eq!((s.offset, s.gap, s.halted), (10, Some((4, 10)), None));
    }

    #[test]
    fn sysdb_beyond_the_log_halts() {
        let s = resolve_start(Some(30), info(None, 0, 20), ResetPolicy::Earliest, OnDataLoss::Skip);
        assert_eq!(s.halted, Some(HaltReason::AheadOfLog { sysdb: 30, high: 20 }));
    }
}
