//! Observable events: each writes its log line and its metric in one place, so the two
//! never drift apart (Vector's `internal_events` pattern). A caller builds the event with
//! what it knows and calls `emit`; what is logged and what is counted is decided here.
//!
//! An event is for a thing that happened that an operator may look for in the logs and
//! on a dashboard at once: a refused compare-and-set, a retried sysdb call, a data-loss
//! gap, a group offset found ahead of the sysdb, a backfill's steps. Counters without a
//! log line (records by operation) and log lines without a counter stay where they are.

use std::fmt::Display;
use std::time::Duration;

use tracing::{info, warn};

use crate::metrics::{backfill_status, Metrics};

/// A batch the sysdb's compare-and-set refused: another replica or an operator moved the
/// partition (docs/design.md invariant 2). The batch is dropped and the position read again.
pub(crate) struct CasConflict<'a> {
    pub partition: i32,
    pub error: &'a dyn Display,
}

impl CasConflict<'_> {
    pub(crate) fn emit(self, m: &Metrics) {
        m.sysdb_cas_conflict();
        warn!(e = %self.error, partition = self.partition, "batch refused by the sysdb compare-and-set; re-reading the position");
    }
}

/// A sysdb call that failed and will be tried again after a backoff.
pub(crate) struct SysdbRetry<'a> {
    /// The log line: what failed, and that it is retried.
    pub what: &'static str,
    pub partition: Option<i32>,
    pub error: &'a dyn Display,
}

impl SysdbRetry<'_> {
    pub(crate) fn emit(self, m: &Metrics) {
        m.sysdb_retry();
        match self.partition {
            Some(p) => warn!(e = %self.error, partition = p, "{}", self.what),
            None => warn!(e = %self.error, "{}", self.what),
        }
    }
}

/// A partition whose position is below its log start: records deleted by retention before
/// they were processed (docs/design.md invariant 11). `recorded`: skipped and recorded in
/// the sysdb (`on_data_loss = "skip"`), else the partition halts (its halt says why).
pub(crate) struct DataLossGap {
    pub partition: i32,
    pub from: i64,
    pub to: i64,
    pub recorded: bool,
}

impl DataLossGap {
    pub(crate) fn emit(self, m: &Metrics) {
        m.gap();
        if self.recorded {
            warn!(
                partition = self.partition,
                from = self.from,
                to = self.to,
                "records deleted before processing; gap recorded and skipped (on_data_loss = \"skip\")"
            );
        } else {
            warn!(partition = self.partition, from = self.from, to = self.to, "data-loss gap: the partition halts");
        }
    }
}

/// A watermark read that failed and will be tried again.
pub(crate) struct WatermarkRetry<'a> {
    pub partition: i32,
    pub error: &'a dyn Display,
}

impl WatermarkRetry<'_> {
    pub(crate) fn emit(self, m: &Metrics) {
        m.watermark_retry();
        warn!(e = %self.error, partition = self.partition, "cannot read the watermarks; retrying");
    }
}

/// At assignment, the group offset was ahead of the sysdb position: the sysdb wins
/// (docs/design.md invariant 1) and the records in between are read again.
pub(crate) struct GroupOffsetAhead {
    pub partition: i32,
    pub sysdb: i64,
    pub group: Option<i64>,
}

impl GroupOffsetAhead {
    pub(crate) fn emit(self, m: &Metrics) {
        m.group_offset_ahead();
        warn!(
            partition = self.partition,
            sysdb = self.sysdb,
            group = ?self.group,
            "group offset is AHEAD of the sysdb position; the sysdb wins (records after it will be re-read and applied once)"
        );
    }
}

/// An attached function failed (a WebAssembly trap, an exhausted limit, an error it
/// returned, a component that cannot run): it is marked `failed` with `reason`, its
/// deltas stop, the collection and the other functions go on
/// (`sluice_function_failures_total{function, kind}` and an error line).
pub(crate) struct FunctionFailed<'a> {
    pub function: &'a str,
    /// A [`crate::functions::FailureKind::as_str`], or `load` (the component cannot be
    /// loaded or instantiated).
    pub kind: &'static str,
    /// `live` (a batch found it) or `backfill`.
    pub during: &'static str,
    pub reason: &'a str,
}

impl FunctionFailed<'_> {
    pub(crate) fn emit(self, m: &Metrics) {
        m.function_failure(self.function, self.kind);
        tracing::error!(
            function = self.function,
            kind = self.kind,
            during = self.during,
            reason = self.reason,
            "attached function failed: marked failed, its output stops (detach it and attach a fixed version)"
        );
    }
}

/// What happened to a backfill (`sluice_backfill_tasks_total{status}` and its log line).
pub(crate) enum Backfill<'a> {
    /// A task arrived from the backfill topic.
    Received,
    /// A backfill began (from a task or the periodic scan).
    Started { function: &'a str, collection: &'a str, marker_offset: Option<i64>, cursor: Option<&'a str> },
    /// Nothing to do: duplicate task, detached function, another worker has it.
    Skipped { function: &'a str, why: &'static str },
    /// It could not go on; the next scan retries (`what` failed).
    Failed { function: &'a str, what: &'static str, error: &'a dyn Display },
    /// The walk is complete: the function is ready.
    Finished { function: &'a str, took: Duration, throttled: Duration },
}

impl Backfill<'_> {
    pub(crate) fn emit(self, m: &Metrics) {
        match self {
            Backfill::Received => m.backfill_task(backfill_status::RECEIVED),
            Backfill::Started { function, collection, marker_offset, cursor } => {
                m.backfill_task(backfill_status::STARTED);
                info!(function, collection, marker_offset = ?marker_offset, cursor = ?cursor, "backfill started");
            }
            Backfill::Skipped { function, why } => {
                m.backfill_task(backfill_status::SKIPPED);
                info!(function, why, "backfill skipped");
            }
            Backfill::Failed { function, what, error } => {
                m.backfill_task(backfill_status::FAILED);
                warn!(e = %error, function, "{what}; the next scan retries");
            }
            Backfill::Finished { function, took, throttled } => {
                m.backfill_task(backfill_status::FINISHED);
                m.observe_backfill_duration(took);
                info!(
                    function,
                    elapsed_ms = took.as_millis() as u64,
                    throttled_ms = throttled.as_millis() as u64,
                    "backfill finished: function is ready"
                );
            }
        }
    }
}
