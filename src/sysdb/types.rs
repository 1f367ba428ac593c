//! What the sysdb stores and returns, shared by the front (`mod.rs`) and both backends.

use crate::functions::{FunctionStatus, OutputDelta};
use crate::positions::PositionDelta;
use crate::record::Record;

/// A collection as the sysdb knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CollectionRow {
    pub id: String,
    /// The log topic partition fixed at registration (murmur2 of the id).
    pub partition: i32,
    /// Embedding dimension, fixed by the first applied embedding.
    pub dimension: Option<u32>,
    /// Offset of the last applied record of this collection, -1 if none.
    pub log_position: i64,
    pub record_count: i64,
}

/// The per-collection part of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct CollectionUpdate {
    pub id: String,
    /// Insert the collection row if it does not exist (auto-registration), with this
    /// partition. An existing row's partition is never changed.
    pub partition: i32,
    pub dimension: Option<u32>,
    pub log_position: i64,
    /// Net change of the live record count in this batch.
    pub record_count_delta: i64,
    /// Final state per touched id: `Some` = upsert this record, `None` = delete the id.
    pub writes: Vec<(String, Option<Record>)>,
}

/// Everything one batch commits, atomically.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchCommit {
    pub topic: String,
    pub delta: PositionDelta,
    pub collections: Vec<CollectionUpdate>,
    /// Attached functions of the batch's collections (see [`FunctionBatch`]).
    pub functions: Vec<FunctionBatch>,
    /// Whether the change feed is on: the batch's `changes`, and the changes its
    /// function outputs make, go to the changelog outbox in the same transaction
    /// (`docs/changes.md`).
    pub changelog: bool,
    /// The batch's record changes for the change feed, in the order the fold applied
    /// them (empty when `changelog` is off).
    pub changes: Vec<OutboxChange>,
}

/// What a materialized change did to its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChangeOp {
    /// The record did not exist before.
    Insert,
    /// The record existed and still does.
    Update,
    /// The record existed and is gone.
    Delete,
    /// The record's current state, published by a snapshot of the partition's records
    /// (`docs/changes.md` section 2), not by a change.
    Snapshot,
}

impl ChangeOp {
    /// The stored and published name (`sluice.operation` header).
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeOp::Insert => "insert",
            ChangeOp::Update => "update",
            ChangeOp::Delete => "delete",
            ChangeOp::Snapshot => "snapshot",
        }
    }

    pub fn parse(s: &str) -> Option<ChangeOp> {
        match s {
            "insert" => Some(ChangeOp::Insert),
            "update" => Some(ChangeOp::Update),
            "delete" => Some(ChangeOp::Delete),
            "snapshot" => Some(ChangeOp::Snapshot),
            _ => None,
        }
    }
}

/// One change of one record, as the changelog outbox stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxChange {
    pub collection_id: String,
    pub record_id: String,
    pub op: ChangeOp,
    /// The log offset of the change (for a function output: the greatest input offset
    /// that contributed to the write).
    pub source_offset: i64,
    /// The record after the change, a `ChangeRecord` datum
    /// (`sluice_record::change::encode_change`); `None` for a delete.
    pub value: Option<Vec<u8>>,
}

impl OutboxChange {
    /// Bytes the change takes in a transaction: key and value.
    pub fn bytes(&self) -> usize {
        self.collection_id.len() + 1 + self.record_id.len() + self.value.as_ref().map_or(0, Vec::len)
    }
}

/// A changelog outbox row: a change of `partition` with its sequence number (per
/// partition, from 0, in commit order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangelogEntry {
    pub partition: i32,
    pub seq: i64,
    pub change: OutboxChange,
    pub created_at_ms: i64,
}

/// A partition's changelog state (`sluice offsets show`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangelogPosition {
    pub partition: i32,
    /// The next sequence number a change will take.
    pub next_seq: i64,
    /// The last sequence number the relay committed to Kafka, as it told the sysdb after
    /// the commit (`-1`: none yet). A copy: the progress topic is authoritative.
    pub published_seq: i64,
    /// Rows in the outbox (published ones not deleted yet included).
    pub outbox_records: i64,
    /// `created_at_ms` of the oldest row after `published_seq`, if any.
    pub oldest_unpublished_ms: Option<i64>,
    /// Bytes (keys and values, [`OutboxChange::bytes`]) of the changes after
    /// `published_seq`: what `changelog.outbox_max_bytes` bounds.
    pub unpublished_bytes: i64,
    /// The partition's snapshot ([`ChangelogSnapshot`]).
    pub snapshot: ChangelogSnapshot,
}

/// A partition's snapshot of its records (`docs/changes.md` section 2): requested when the
/// feed is first enabled for a partition that holds records, or by `sluice changes
/// snapshot`; walked by the relay in chunks ([`SnapshotStep`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ChangelogSnapshot {
    /// When the pending snapshot was requested (ms since the Unix epoch); `None`: none
    /// pending.
    pub requested_at_ms: Option<i64>,
    /// Records the pending snapshot appended so far, or the last one in all.
    pub records: i64,
    /// When the last snapshot finished, if one did.
    pub finished_at_ms: Option<i64>,
}

impl ChangelogSnapshot {
    pub fn pending(&self) -> bool {
        self.requested_at_ms.is_some()
    }
}

/// What one snapshot step did ([`crate::sysdb::Sysdb::changelog_snapshot_step`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotStep {
    /// No snapshot is pending for the partition.
    Idle,
    /// A chunk was appended to the outbox: `records` records of `bytes` bytes (keys and
    /// values); `cursor` is the last record's (collection, id); `finished` when the walk
    /// is complete (the snapshot is no longer pending); `total`: records of this snapshot
    /// so far.
    Appended { records: usize, bytes: i64, cursor: Option<(String, String)>, finished: bool, total: i64 },
}

/// What one batch brings to one attached function. The sysdb decides **inside the batch
/// transaction**, from the function's stored status (read there, never cached), what
/// applies (docs/design.md section 7):
/// * `awaiting_marker`: the first marker whose request id is the function's moves it to
///   `backfilling` at that offset O; changes after O apply as below; other markers are
///   ignored. Without such a marker nothing applies.
/// * `backfilling` at O: only changes with offset > O apply their deltas; such a change
///   whose `before` was last written before O (`before.offset < O`) saves `before` as the
///   function's preimage of that id, unless one is saved already.
/// * `ready`: every change applies its deltas; no preimages.
/// * `detached` (or gone): nothing applies.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionBatch {
    pub function_id: String,
    /// BACKFILL_FN markers of this function in the batch: `(offset, request_id)`.
    pub markers: Vec<(i64, String)>,
    /// The input collection's changes in offset order, with this function's deltas.
    pub changes: Vec<FunctionChange>,
    /// The function failed on one of the batch's changes (`changes` is then empty): the
    /// batch transaction marks it failed with this reason, unless it is detached or
    /// failed already.
    pub failure: Option<String>,
}

/// One input change as a function sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct FunctionChange {
    pub offset: i64,
    pub id: String,
    /// The record before the change (its `offset` says when it was last written): the
    /// preimage candidate.
    pub before: Option<Record>,
    pub deltas: Vec<OutputDelta>,
}

/// What the batch transaction did with markers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommitReport {
    /// `(function_id, marker offset)` of markers that started a backfill.
    pub markers_accepted: Vec<(String, i64)>,
    /// Markers that were duplicates, of unknown or detached functions.
    pub markers_ignored: usize,
    /// With the change feed on and changes written: where they went in the outbox.
    pub appended: Option<AppendedChanges>,
}

/// The changes a batch's transaction appended to its partition's outbox: the batch's own
/// (`BatchCommit::changes`) numbered from `first_seq` on, then `outputs` (its function
/// outputs' changes) right after them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppendedChanges {
    pub first_seq: i64,
    pub outputs: Vec<OutboxChange>,
}

/// An attached function as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionRow {
    pub id: String,
    pub collection_id: String,
    /// Registry name (`record_counter`, ...).
    pub function: String,
    pub output_collection: String,
    pub params: std::collections::BTreeMap<String, String>,
    pub status: FunctionStatus,
    /// Fresh per attach; the marker carries it.
    pub request_id: String,
    pub marker_offset: Option<i64>,
    /// Last input id the backfill has covered (ids are walked in order).
    pub backfill_cursor: Option<String>,
    pub backfill_done: i64,
    /// Size of the collection as of the marker, known once the backfill starts.
    pub backfill_total: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    /// Why the function failed (status [`FunctionStatus::Failed`]); kept after a detach.
    pub failed_reason: Option<String>,
}

/// A function to attach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFunction {
    pub id: String,
    pub collection_id: String,
    /// The input collection's partition (its marker goes there); the output collection is
    /// registered on the same partition.
    pub partition: i32,
    pub function: String,
    pub output_collection: String,
    pub params: std::collections::BTreeMap<String, String>,
    pub request_id: String,
}

/// An unsent (or not yet acknowledged) marker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxRow {
    pub id: i64,
    pub function_id: String,
    pub collection_id: String,
    pub partition: i32,
    pub request_id: String,
    pub created_at_ms: i64,
    /// Log offset where the marker was last published (`None` while pending).
    pub published_offset: Option<i64>,
}

/// Result of one backfill step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepResult {
    /// The function is not `backfilling` (ready, detached, gone): stop.
    NotBackfilling,
    /// The cursor is not where the caller expected (another worker advanced it): re-read.
    CursorMoved { cursor: Option<String> },
    /// A chunk was applied: `processed` as-of-marker records up to `cursor`; `finished`
    /// when the walk is complete (the function is now `ready`, its preimages deleted).
    /// `held`: how long the step's transaction ran (on SQLite, how long it held the one
    /// writer), without the wait for it; the worker's yield to live batches is measured
    /// from it.
    Applied { processed: usize, cursor: Option<String>, finished: bool, held: std::time::Duration },
    /// The function failed on a record of the chunk: the step applied nothing of the
    /// chunk and marked the function failed with `failure`'s reason.
    Failed { failure: crate::functions::FunctionFailure },
}

/// How large one backfill chunk may be: `records` records, and it closes after the
/// record that reaches `bytes` of the fields the function reads (at least one record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimit {
    pub records: usize,
    pub bytes: usize,
    /// Whether the change feed is on: the chunk's output changes go to the changelog
    /// outbox in its transaction.
    pub changelog: bool,
}

impl From<usize> for ChunkLimit {
    /// A count alone (tests): no bound in bytes, no change feed.
    fn from(records: usize) -> Self {
        ChunkLimit { records, bytes: usize::MAX, changelog: false }
    }
}

/// Position of one partition as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionPosition {
    pub partition: i32,
    pub next_offset: i64,
}

/// A partition's stored state: position and halt (`offsets show`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionState {
    pub partition: i32,
    pub next_offset: i64,
    /// Why the partition is halted; `None` = running.
    pub halted_reason: Option<String>,
    /// When the current halt began (ms since the Unix epoch); `None` when running.
    pub halted_at_ms: Option<i64>,
}

/// A recorded data-loss gap (`on_data_loss = "skip"`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GapRow {
    pub topic: String,
    pub partition: i32,
    pub from_offset: i64,
    pub to_offset: i64,
    pub recorded_at_ms: i64,
}

/// An operator reset, as audited.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetRow {
    pub topic: String,
    pub partition: i32,
    pub from_offset: Option<i64>,
    pub to_offset: i64,
    pub actor: String,
    pub reason: String,
    pub at_ms: i64,
}

/// A DLQ entry replayed into the log (`dlq_replays`): `topic` is the DLQ topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqReplayRow {
    pub topic: String,
    pub dlq_partition: i32,
    pub dlq_offset: i64,
    pub replayed_at_ms: i64,
    pub log_partition: i32,
    pub log_offset: i64,
}

/// Milliseconds since the Unix epoch, for the `*_at_ms` columns.
pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Topics whose batches commit without the compare-and-set on the position: the known
/// mistake (c) of the processor's simulation, switched on for its own world's topic alone
/// (every other test of the process keeps the check).
#[cfg(test)]
static SKIP_COMPARE_AND_SET: std::sync::Mutex<std::collections::BTreeSet<String>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// Whether `topic`'s batches skip the compare-and-set (tests only, see above).
#[cfg(test)]
pub(crate) fn skips_compare_and_set(topic: &str) -> bool {
    SKIP_COMPARE_AND_SET.lock().unwrap_or_else(|e| e.into_inner()).contains(topic)
}

/// Switch the mistake (c) on or off for `topic` (tests only).
#[cfg(test)]
pub(crate) fn set_skip_compare_and_set(topic: &str, on: bool) {
    let mut set = SKIP_COMPARE_AND_SET.lock().unwrap_or_else(|e| e.into_inner());
    if on {
        set.insert(topic.to_string());
    } else {
        set.remove(topic);
    }
}
