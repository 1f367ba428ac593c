//! Counters of the SQLite writer's work, kept by the sysdb and read by the metrics at
//! scrape time (`sluice_sqlite_*`, docs/metrics.md): write transactions, merges of the
//! records delta by reason, compactions of the value log and the bytes they moved.

use std::sync::atomic::{AtomicU64, Ordering};

use super::values::{Compaction, MergeReason};

#[derive(Debug, Default)]
pub struct SqliteStats {
    write_transactions: AtomicU64,
    merges: [AtomicU64; 3],
    compactions: AtomicU64,
    examined_bytes: AtomicU64,
    copied_bytes: AtomicU64,
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SqliteStatsSnapshot {
    /// Write transactions begun on the writer connection (batch groups, backfill steps,
    /// attaches, resets, ...). Reads never begin one.
    pub write_transactions: u64,
    /// Merges of the records delta, by reason: (`rows`, `bytes`, `writer`).
    pub merges: [(&'static str, u64); 3],
    pub compactions: u64,
    pub compaction_examined_bytes: u64,
    pub compaction_copied_bytes: u64,
}

impl SqliteStats {
    pub(super) fn write_transaction(&self) {
        self.write_transactions.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn merged(&self, reason: MergeReason) {
        let i = MergeReason::ALL.iter().position(|r| *r == reason).unwrap_or(0);
        self.merges[i].fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn compacted(&self, c: Compaction) {
        self.compactions.fetch_add(1, Ordering::Relaxed);
        self.examined_bytes.fetch_add(c.examined_bytes.max(0) as u64, Ordering::Relaxed);
        self.copied_bytes.fetch_add(c.copied_bytes.max(0) as u64, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> SqliteStatsSnapshot {
        let merges = std::array::from_fn(|i| (MergeReason::ALL[i].as_str(), self.merges[i].load(Ordering::Relaxed)));
        SqliteStatsSnapshot {
            write_transactions: self.write_transactions.load(Ordering::Relaxed),
            merges,
            compactions: self.compactions.load(Ordering::Relaxed),
            compaction_examined_bytes: self.examined_bytes.load(Ordering::Relaxed),
            compaction_copied_bytes: self.copied_bytes.load(Ordering::Relaxed),
        }
    }
}
