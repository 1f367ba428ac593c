//! The sysdb: the authoritative store of partition positions, collections and their
//! materialized records (docs/design.md sections 1-3).
//!
//! Two backends behind one type, with the same tests: SQLite (embedded default: one
//! file, WAL) and PostgreSQL (replicas on several machines). [`Sysdb`] is an enum rather
//! than a trait object so that call sites stay plain `async fn` calls.
//!
//! The one write that matters is [`Sysdb::commit_batch`]: a batch's record changes, the
//! collections' `log_position`s and the partition's `next_offset` commit in **one
//! transaction**, conditional on the partition's `next_offset` still being the batch's
//! start (compare-and-set, [`crate::positions::PositionDelta`]). A replica that lost the
//! partition fails the CAS and its batch is dropped whole.
//!
//! Attached functions (docs/design.md section 7) live here too: the same transaction reads
//! each function's status and applies markers, preimages and output deltas
//! ([`FunctionBatch`]); [`Sysdb::backfill_step`] applies one backfill chunk per
//! transaction. The rules both backends share are in `outputs.rs`; each backend's SQL
//! and locking is in `sqlite/functions.rs` and `postgres/functions.rs`.

mod codec;
#[cfg(any(test, feature = "testkit"))]
pub mod conformance;
mod outputs;
pub mod postgres;
mod schema;
pub mod sqlite;

use std::collections::HashMap;
use std::sync::Arc;

use thiserror::Error;

use crate::functions::{Function, FunctionStatus, OutputDelta};
use crate::positions::{IncompatibleDelta, PositionDelta};
use crate::record::Record;

/// What a caller can do about a [`SysdbError`] (see [`SysdbError::class`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The compare-and-set failed: another replica or an operator moved the partition.
    /// Nothing was written; the batch must be dropped, not retried.
    Conflict,
    /// The database cannot be reached, is overloaded, locked or read-only right now:
    /// retry the same batch with backoff.
    Transient,
    /// The database refused a value of this batch (bad text, an index entry too large):
    /// retrying the same batch cannot help, a batch without the offending record can
    /// succeed.
    Record,
    /// Configuration or an unexpected database error: retrying will not help and the
    /// fault is not in one record.
    Fatal,
}

/// Errors of the sysdb, classified by [`SysdbError::class`]: a CAS conflict is an
/// expected outcome (another replica or an operator moved the partition); `Unavailable`
/// is retryable; `Rejected` points at the batch's data; the rest are not retryable.
/// `Clone`: one failed group commit (SQLite) answers every batch of the group.
#[derive(Debug, Clone, Error)]
pub enum SysdbError {
    #[error(transparent)]
    Conflict(#[from] IncompatibleDelta),
    /// The database cannot be reached or is read-only right now; retry with backoff.
    #[error("sysdb unavailable ({backend}): {message}")]
    Unavailable { backend: &'static str, message: String },
    /// The database refused a value of this batch; retrying cannot help, another batch
    /// without the offending record can succeed.
    #[error("sysdb rejected a value ({backend}): {message}")]
    Rejected { backend: &'static str, message: String },
    /// The sysdb URL or its contents are not usable (bad URL, schema from a newer version).
    #[error("sysdb configuration: {0}")]
    Config(String),
    /// Anything else the database reported.
    #[error("sysdb error ({backend}): {message}")]
    Database { backend: &'static str, message: String },
}

impl SysdbError {
    pub fn class(&self) -> ErrorClass {
        match self {
            SysdbError::Conflict(_) => ErrorClass::Conflict,
            SysdbError::Unavailable { .. } => ErrorClass::Transient,
            SysdbError::Rejected { .. } => ErrorClass::Record,
            SysdbError::Config(_) | SysdbError::Database { .. } => ErrorClass::Fatal,
        }
    }

    /// `class() == ErrorClass::Transient`.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Transient
    }
}

pub type Result<T, E = SysdbError> = std::result::Result<T, E>;

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

/// Result of attaching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOutcome {
    /// New function row and its outbox row, committed together.
    Created(FunctionRow, OutboxRow),
    /// The same function (name and parameters) is already attached, not detached, to the
    /// same (collection, output): nothing was written.
    Existing(FunctionRow),
    /// The attach breaks a rule: nothing was written.
    Refused(AttachConflict),
}

/// Why an attach was refused. Each names the function (or collection) in the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachConflict {
    /// The output name is a collection of data records that no function writes.
    OutputIsData { output: String },
    /// A non-detached function already writes the output: a different input, or the same
    /// input with another function or other parameters.
    OutputWrittenBy(FunctionRow),
    /// The output still holds records that this detached function wrote (detached
    /// without dropping its output).
    OutputLeftBy(FunctionRow),
    /// The input collection is the output of this non-detached function.
    InputIsOutputOf(FunctionRow),
    /// The output collection is the input of this non-detached function.
    OutputIsInputOf(FunctionRow),
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
}

/// How large one backfill chunk may be: `records` records, and it closes after the
/// record that reaches `bytes` of the fields the function reads (at least one record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkLimit {
    pub records: usize,
    pub bytes: usize,
}

impl From<usize> for ChunkLimit {
    /// A count alone (tests): no bound in bytes.
    fn from(records: usize) -> Self {
        ChunkLimit { records, bytes: usize::MAX }
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

/// The sysdb, opened from a URL: `sqlite://PATH` (or `sqlite::memory:` for tests) or
/// `postgres://...` / `postgresql://...`.
pub enum Sysdb {
    Sqlite(sqlite::SqliteSysdb),
    Postgres(postgres::PostgresSysdb),
}

macro_rules! dispatch {
    ($self:ident, $s:ident => $e:expr) => {
        match $self {
            Sysdb::Sqlite($s) => $e,
            Sysdb::Postgres($s) => $e,
        }
    };
}

impl Sysdb {
    /// Open and migrate (migrations are embedded and idempotent), with the default
    /// `[sqlite]` settings.
    pub async fn open(url: &str) -> Result<Sysdb> {
        Sysdb::open_with(url, &crate::config::SqliteConfig::DEFAULT).await
    }

    /// [`Sysdb::open`] with the `[sqlite]` settings (used for `sqlite://` URLs only).
    pub async fn open_with(url: &str, sqlite: &crate::config::SqliteConfig) -> Result<Sysdb> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            Ok(Sysdb::Sqlite(sqlite::SqliteSysdb::open_tuned(path, sqlite).await?))
        } else if url == "sqlite::memory:" {
            Ok(Sysdb::Sqlite(sqlite::SqliteSysdb::open_tuned(":memory:", sqlite).await?))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Sysdb::Postgres(postgres::PostgresSysdb::open(url).await?))
        } else {
            Err(SysdbError::Config(format!(
                "unsupported sysdb URL {:?}: use sqlite://PATH or postgres://USER:PASS@HOST:PORT/DB",
                redact_url(url)
            )))
        }
    }

    /// Open a sysdb that `sluice init` created, for commands that only read: creates,
    /// migrates and writes nothing (a missing SQLite file stays missing; SQLite opens
    /// read-only connections and no checkpoint thread, so a file the user may only read
    /// works). A sysdb without Sluice's schema or at another version is an error that says
    /// to run `sluice init`. Calling a method that writes on it is an error.
    pub async fn open_existing(url: &str) -> Result<Sysdb> {
        if let Some(path) = url.strip_prefix("sqlite://") {
            Ok(Sysdb::Sqlite(sqlite::SqliteSysdb::open_existing(path).await?))
        } else if url == "sqlite::memory:" {
            Ok(Sysdb::Sqlite(sqlite::SqliteSysdb::open_existing(":memory:").await?))
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Ok(Sysdb::Postgres(postgres::PostgresSysdb::open_existing(url).await?))
        } else {
            Sysdb::open(url).await
        }
    }

    /// The SQLite writer's counters (merges, compactions, write transactions); `None` on
    /// PostgreSQL.
    pub fn sqlite_stats(&self) -> Option<Arc<sqlite::SqliteStats>> {
        match self {
            Sysdb::Sqlite(s) => Some(s.stats()),
            Sysdb::Postgres(_) => None,
        }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Sysdb::Sqlite(_) => "sqlite",
            Sysdb::Postgres(_) => "postgres",
        }
    }

    /// Highest applied migration version (see `schema.rs`).
    pub async fn schema_version(&self) -> Result<i64> {
        dispatch!(self, s => s.schema_version().await)
    }

    /// Record the log topic's partition count (set by `sluice init`).
    pub async fn set_topic_partitions(&self, topic: &str, partitions: i32) -> Result<()> {
        dispatch!(self, s => s.set_topic_partitions(topic, partitions).await)
    }

    pub async fn topic_partitions(&self, topic: &str) -> Result<Option<i32>> {
        dispatch!(self, s => s.topic_partitions(topic).await)
    }

    /// `next_offset` of each partition of `topic` that has a row.
    pub async fn positions(&self, topic: &str) -> Result<HashMap<i32, i64>> {
        dispatch!(self, s => s.positions(topic).await)
    }

    /// Every partition row of `topic`, ordered by partition, with its halt.
    pub async fn partition_states(&self, topic: &str) -> Result<Vec<PartitionState>> {
        dispatch!(self, s => s.partition_states(topic).await)
    }

    /// Mark the partition halted with `reason` (`Some`), or running again (`None`).
    /// Halting an already halted partition replaces the reason and keeps the time the
    /// halt began. The partition's row must exist (it does once its position was
    /// initialized): halting a partition without one is a `Database` error, clearing it
    /// is a no-op. `next_offset` is not touched.
    pub async fn set_partition_halted(&self, topic: &str, partition: i32, reason: Option<&str>) -> Result<()> {
        dispatch!(self, s => s.set_partition_halted(topic, partition, reason).await)
    }

    /// Create the partition's row with `next_offset` if none exists; returns the stored
    /// value (the existing one if there was a row).
    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        dispatch!(self, s => s.init_position(topic, partition, next_offset).await)
    }

    pub async fn collections(&self) -> Result<Vec<CollectionRow>> {
        dispatch!(self, s => s.collections().await)
    }

    pub async fn collection(&self, id: &str) -> Result<Option<CollectionRow>> {
        dispatch!(self, s => s.collection(id).await)
    }

    /// The stored rows of the collections among `ids`, in one read (one blocking task on
    /// SQLite, one statement on PostgreSQL); unknown ids are missing from the answer.
    pub async fn collections_named(&self, ids: Vec<String>) -> Result<HashMap<String, CollectionRow>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        dispatch!(self, s => s.collections_named(ids).await)
    }

    /// Current records of `collection` among `ids` (absent ids are simply missing).
    pub async fn get_records(&self, collection: &str, ids: &[String]) -> Result<HashMap<String, Record>> {
        dispatch!(self, s => s.get_records(collection, ids).await)
    }

    /// Current records of several collections at once (one blocking task on SQLite, one
    /// statement on PostgreSQL): `wanted` is (collection, [(id, full)]); collections and
    /// ids that hold nothing are simply missing from the answer. With `full == false`
    /// the backend MAY leave out the embedding and the document (SQLite does; the
    /// caller must only ask that when the fold cannot need them, see
    /// `processor::batch::ids_to_read`).
    pub async fn get_records_many(
        &self,
        wanted: Vec<(String, Vec<(String, bool)>)>,
    ) -> Result<HashMap<String, HashMap<String, Record>>> {
        dispatch!(self, s => s.get_records_many(wanted).await)
    }

    /// Records of a collection in id order, after `after_id` (exclusive), at most `limit`.
    pub async fn list_records(&self, collection: &str, after_id: Option<&str>, limit: usize) -> Result<Vec<Record>> {
        dispatch!(self, s => s.list_records(collection, after_id, limit).await)
    }

    /// Commit a batch atomically with compare-and-set on the partition position.
    /// `SysdbError::Conflict` leaves the sysdb untouched. Takes the batch owned or shared
    /// (`Arc`): SQLite writes on a blocking thread, which needs it without a copy.
    pub async fn commit_batch(&self, batch: impl Into<Arc<BatchCommit>>) -> Result<CommitReport> {
        let batch = batch.into();
        match self {
            Sysdb::Sqlite(s) => s.commit_batch(batch).await,
            Sysdb::Postgres(s) => s.commit_batch(&batch).await,
        }
    }

    /// Attach a function: in ONE transaction, insert the function (`awaiting_marker`,
    /// `request_id` from `new`), register the output collection on `new.partition` if
    /// missing, and insert the outbox row; or return the existing non-detached function
    /// with the same (collection, function, parameters, output); or refuse
    /// ([`AttachConflict`]) when the output is taken (another live writer, a data
    /// collection, records left by a detached function), or when the input is a live
    /// function's output or the output a live function's input. An output left empty by
    /// a detached function is reused (its stale tombstones are cleared).
    pub async fn attach_function(&self, new: &NewFunction) -> Result<AttachOutcome> {
        dispatch!(self, s => s.attach_function(new).await)
    }

    /// Functions, all or of one input collection, ordered by creation.
    pub async fn functions(&self, collection: Option<&str>) -> Result<Vec<FunctionRow>> {
        dispatch!(self, s => s.functions(collection).await)
    }

    pub async fn function(&self, id: &str) -> Result<Option<FunctionRow>> {
        dispatch!(self, s => s.function(id).await)
    }

    /// Detach: status `detached`, preimages deleted; with `drop_output` the output
    /// collection (records, counters, tombstones, row) is deleted too — unless another
    /// non-detached function writes that output (re-attached since), then only this
    /// function's counters go. Returns the row as it was before, `None` if unknown.
    pub async fn detach_function(&self, id: &str, drop_output: bool) -> Result<Option<FunctionRow>> {
        dispatch!(self, s => s.detach_function(id, drop_output).await)
    }

    /// Outbox rows not marked sent, oldest first.
    pub async fn outbox_pending(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        dispatch!(self, s => s.outbox_pending(limit).await)
    }

    /// Mark a pending outbox row sent, published at log offset `published_offset` (the
    /// delivery report's; `None` if unknown). A row already sent is left as it is.
    pub async fn mark_outbox_sent(&self, id: i64, published_offset: Option<i64>) -> Result<()> {
        dispatch!(self, s => s.mark_outbox_sent(id, published_offset).await)
    }

    /// Lost markers: sent outbox rows of functions still `awaiting_marker` (with the
    /// row's request id) whose partition of `topic` has a sysdb `next_offset` past the
    /// offset where the marker was published — the processor passed the marker without
    /// starting the function (dead-lettered, skipped in a data-loss gap, or passed by an
    /// operator reset). Read in one statement (one snapshot), so a marker that a batch
    /// accepted is never reported. Oldest first, at most `limit`.
    pub async fn lost_markers(&self, topic: &str, limit: usize) -> Result<Vec<OutboxRow>> {
        dispatch!(self, s => s.lost_markers(topic, limit).await)
    }

    /// Record that a lost marker was published again, at `published_offset`.
    pub async fn mark_marker_republished(&self, id: i64, published_offset: i64) -> Result<()> {
        dispatch!(self, s => s.mark_marker_republished(id, published_offset).await)
    }

    /// `created_at_ms` of the oldest function still `awaiting_marker`, if any.
    pub async fn oldest_awaiting_marker_ms(&self) -> Result<Option<i64>> {
        dispatch!(self, s => s.oldest_awaiting_marker_ms().await)
    }

    /// One backfill chunk of `function_id`, in one transaction that holds the function
    /// row (no batch of its collection commits in between): check it is `backfilling`
    /// with `backfill_cursor == expected_cursor`; read, **in one statement**, the next
    /// `limit.records` ids after the cursor (fewer once `limit.bytes` are read) of the collection as of the marker O — current records
    /// with `last_offset < O` that have no preimage, and the function's preimages; apply
    /// `f`'s deltas for each as an insert (`before = None`, `after = record`, offset = the
    /// record's offset) with versioned output writes; advance the cursor and
    /// `backfill_done` (and set `backfill_total` on the first step). A chunk that ran out of
    /// records (shorter than `limit.records` and not cut by `limit.bytes`) finishes:
    /// status `ready`, preimages and the output's tombstones deleted.
    pub async fn backfill_step(
        &self,
        function_id: &str,
        expected_cursor: Option<&str>,
        limit: impl Into<ChunkLimit>,
        f: &dyn Function,
    ) -> Result<StepResult> {
        let limit = limit.into();
        dispatch!(self, s => s.backfill_step(function_id, expected_cursor, limit, f).await)
    }

    /// Preimages currently saved for a function (tests and inspection).
    pub async fn preimage_count(&self, function_id: &str) -> Result<i64> {
        dispatch!(self, s => s.preimage_count(function_id).await)
    }

    /// Record a data-loss gap and move the partition from `from` to `to` (CAS on `from`).
    pub async fn record_gap(&self, topic: &str, partition: i32, from: i64, to: i64) -> Result<()> {
        dispatch!(self, s => s.record_gap(topic, partition, from, to).await)
    }

    pub async fn gaps(&self, topic: &str) -> Result<Vec<GapRow>> {
        dispatch!(self, s => s.gaps(topic).await)
    }

    /// Operator override of a partition's `next_offset`, audited in the same transaction,
    /// which also clears the partition's halt. Returns the previous value (None if there
    /// was no row).
    pub async fn reset_position(
        &self,
        topic: &str,
        partition: i32,
        to: i64,
        actor: &str,
        reason: &str,
    ) -> Result<Option<i64>> {
        dispatch!(self, s => s.reset_position(topic, partition, to, actor, reason).await)
    }

    pub async fn resets(&self, topic: &str) -> Result<Vec<ResetRow>> {
        dispatch!(self, s => s.resets(topic).await)
    }

    /// Record that a DLQ entry was replayed (after the broker acknowledged the produce).
    /// Returns false, changing nothing, when that entry was recorded already.
    pub async fn record_dlq_replay(&self, row: &DlqReplayRow) -> Result<bool> {
        dispatch!(self, s => s.record_dlq_replay(row).await)
    }

    /// The replays recorded for a DLQ topic, by DLQ partition and offset.
    pub async fn dlq_replays(&self, dlq_topic: &str) -> Result<Vec<DlqReplayRow>> {
        dispatch!(self, s => s.dlq_replays(dlq_topic).await)
    }
}

pub use crate::redact::redact_url;

/// `meta` key holding a topic's partition count.
pub(crate) fn topic_partitions_key(topic: &str) -> String {
    format!("topic_partitions:{topic}")
}

pub(crate) fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_one_class_and_only_transient_is_retryable() {
        let cases = [
            (SysdbError::Conflict(IncompatibleDelta::Missing { partition: 0, expected: 1 }), ErrorClass::Conflict),
            (SysdbError::Unavailable { backend: "x", message: String::new() }, ErrorClass::Transient),
            (SysdbError::Rejected { backend: "x", message: String::new() }, ErrorClass::Record),
            (SysdbError::Config(String::new()), ErrorClass::Fatal),
            (SysdbError::Database { backend: "x", message: String::new() }, ErrorClass::Fatal),
        ];
        for (e, class) in cases {
            assert_eq!(e.class(), class, "{e:?}");
            assert_eq!(e.is_retryable(), class == ErrorClass::Transient, "{e:?}");
        }
    }
}
