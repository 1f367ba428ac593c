//! The sysdb: the authoritative store of partition positions, collections and their
//! materialized records (docs/design.md sections 1-3).
//!
//! Two backends behind one front, with the same tests: SQLite (embedded default: one
//! file, WAL) and PostgreSQL (replicas on several machines). [`Sysdb`] is an enum rather
//! than a trait object so that call sites stay plain `async fn` calls. The front checks
//! arguments once and runs the rules both backends share (the attach rules in
//! `attach_rules.rs`, output semantics in `outputs.rs`); a backend holds only SQL and its
//! locking, one file per concern (positions, records, the batch commit, attached
//! functions and their outbox, the audit trail), so that `sqlite/X.rs` and `postgres/X.rs`
//! differ in dialect. Backends import `types.rs` and `error.rs`, never this front.
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
//! transaction.

pub mod attach_rules;
mod changelog;
#[cfg(any(test, feature = "testkit"))]
pub mod conformance;
mod error;
mod migrations;
mod outputs;
pub mod postgres;
pub mod sqlite;
mod stored_fields;
mod types;

use std::collections::HashMap;
use std::sync::Arc;

pub use attach_rules::{AttachConflict, AttachOutcome};
pub use error::{retry_unavailable, ErrorClass, Result, SysdbError, OPERATOR_WRITE_BUDGET};
pub use types::*;

use crate::functions::Function;
use crate::positions::PositionDelta;
use crate::record::Record;

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

    /// An argument the front refuses, named for the backend it was meant for.
    fn invalid(&self, message: String) -> SysdbError {
        SysdbError::Database { backend: self.backend(), message }
    }

    pub fn backend(&self) -> &'static str {
        match self {
            Sysdb::Sqlite(_) => "sqlite",
            Sysdb::Postgres(_) => "postgres",
        }
    }

    /// Highest applied migration version (see `migrations.rs`).
    pub async fn schema_version(&self) -> Result<i64> {
        dispatch!(self, s => s.schema_version().await)
    }

    /// Record the log topic's partition count (set by `sluice init`).
    pub async fn set_topic_partitions(&self, topic: &str, partitions: i32) -> Result<()> {
        if partitions <= 0 {
            return Err(self.invalid(format!("{topic:?}: {partitions} is not a partition count")));
        }
        let key = topic_partitions_key(topic);
        dispatch!(self, s => s.set_meta(&key, &partitions.to_string()).await)
    }

    pub async fn topic_partitions(&self, topic: &str) -> Result<Option<i32>> {
        let key = topic_partitions_key(topic);
        let value = dispatch!(self, s => s.meta(&key).await)?;
        value
            .map(|v| {
                v.parse::<i32>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| self.invalid(format!("meta {key:?} is not a partition count: {v:?}")))
            })
            .transpose()
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
        let had_row = dispatch!(self, s => s.set_partition_halted(topic, partition, reason).await)?;
        if !had_row && reason.is_some() {
            return Err(self.invalid(format!("cannot halt partition {partition} of {topic:?}: it has no position row")));
        }
        Ok(())
    }

    /// Create the partition's row with `next_offset` if none exists; returns the stored
    /// value (the existing one if there was a row).
    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        if next_offset < 0 {
            return Err(self.invalid(format!("partition {partition}: next_offset {next_offset} is negative")));
        }
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
        let d = batch.delta;
        PositionDelta::new(d.partition, d.from, d.to).map_err(|e| self.invalid(e.to_string()))?;
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
        // Each backend reads the facts in its attach transaction and acts on the one
        // decision of `attach_rules::decide`.
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
        dispatch!(self, s => s.detach_function(id, drop_output, false).await)
    }

    /// [`Sysdb::detach_function`] with the change feed on (`changelog`): a dropped
    /// output's records get a delete change each (source offset -1: no log record made
    /// them) in the detach's transaction, so that a fold of the feed loses them too.
    pub async fn detach_function_feeding(
        &self,
        id: &str,
        drop_output: bool,
        changelog: bool,
    ) -> Result<Option<FunctionRow>> {
        dispatch!(self, s => s.detach_function(id, drop_output, changelog).await)
    }

    /// Store a WebAssembly component's bytes under their SHA-256 (lowercase hex), which
    /// the caller computed and checked; `world_version` is the `sluice:function/guest`
    /// version it exports. Storing the same hash again changes nothing: returns whether
    /// the bytes were new.
    pub async fn put_component(&self, sha256: &str, bytes: Vec<u8>, world_version: &str) -> Result<bool> {
        if crate::functions::wasm::sha256_hex(&bytes) != sha256 {
            return Err(self.invalid(format!("component {sha256}: the bytes have another SHA-256")));
        }
        dispatch!(self, s => s.put_component(sha256, bytes, world_version).await)
    }

    /// The bytes of the stored component `sha256`, `None` if none is stored.
    pub async fn component(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        dispatch!(self, s => s.component(sha256).await)
    }

    /// Mark a live function failed with `reason` outside a batch (its component cannot be
    /// loaded or instantiated where it must run): returns false, changing nothing, if it
    /// is detached, failed already or unknown. Its preimages are deleted.
    pub async fn mark_function_failed(&self, id: &str, reason: &str) -> Result<bool> {
        dispatch!(self, s => s.mark_function_failed(id, reason).await)
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
        let limit = ChunkLimit { records: limit.records.max(1), bytes: limit.bytes.max(1), ..limit };
        dispatch!(self, s => s.backfill_step(function_id, expected_cursor, limit, f).await)
    }

    /// The change feed's outbox rows of `partition` after sequence number `after_seq`, in
    /// sequence order: at most `max_records`, and no more than `max_bytes` of keys and
    /// values (at least one row). Sequence order is commit order (`docs/changes.md`).
    pub async fn changelog_pending(
        &self,
        partition: i32,
        after_seq: i64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<ChangelogEntry>> {
        let max_records = max_records.max(1);
        dispatch!(self, s => s.changelog_pending(partition, after_seq, max_records, max_bytes).await)
    }

    /// Record that the relay committed the changes of `partition` up to `seq` to Kafka (a
    /// copy of the progress topic's value, for reports and for deleting published rows;
    /// it never moves back).
    pub async fn changelog_mark_published(&self, partition: i32, seq: i64) -> Result<()> {
        dispatch!(self, s => s.changelog_mark_published(partition, seq).await)
    }

    /// Bytes of `partition`'s changes not published yet (what `changelog.outbox_max_bytes`
    /// bounds); 0 for a partition without changes.
    pub async fn changelog_unpublished_bytes(&self, partition: i32) -> Result<i64> {
        dispatch!(self, s => s.changelog_unpublished_bytes(partition).await)
    }

    /// Delete at most `limit` outbox rows of `partition` with a sequence number up to
    /// `through_seq` (published ones), oldest first; returns how many went.
    pub async fn changelog_trim(&self, partition: i32, through_seq: i64, limit: usize) -> Result<usize> {
        dispatch!(self, s => s.changelog_trim(partition, through_seq, limit.max(1)).await)
    }

    /// The change feed starts for `partitions` (the processor, before their first batch
    /// with the feed on): each that has no `changelog_partitions` row gets one, with a
    /// snapshot pending if it already holds records (`docs/changes.md` section 2). Returns
    /// the partitions whose snapshot this requested. Idempotent: a partition that has a
    /// row (the feed started for it before) is left as it is.
    pub async fn changelog_begin(&self, partitions: &[i32]) -> Result<Vec<i32>> {
        if partitions.is_empty() {
            return Ok(Vec::new());
        }
        dispatch!(self, s => s.changelog_begin(partitions.to_vec()).await)
    }

    /// Ask for a snapshot of each of `partitions` (`sluice changes snapshot`): pending from
    /// the first record again, also when one was under way.
    pub async fn changelog_request_snapshot(&self, partitions: &[i32]) -> Result<()> {
        if let Some(p) = partitions.iter().find(|p| **p < 0) {
            return Err(self.invalid(format!("partition {p} is negative")));
        }
        dispatch!(self, s => s.changelog_request_snapshot(partitions.to_vec()).await)
    }

    /// Whether a snapshot of `partition` is pending.
    pub async fn changelog_snapshot_pending(&self, partition: i32) -> Result<bool> {
        dispatch!(self, s => s.changelog_snapshot_pending(partition).await)
    }

    /// One step of `partition`'s pending snapshot, in one write transaction ordered with
    /// the partition's batch commits (`docs/changes.md` section 2): the next records
    /// after its cursor in (collection, id) order, at most `max_records` and closing after
    /// the record that reaches `max_bytes`, appended to the outbox with operation
    /// `snapshot` and their current state; the cursor advanced, and the snapshot no longer
    /// pending once the walk ran out of records. [`SnapshotStep::Idle`] when none is
    /// pending.
    pub async fn changelog_snapshot_step(
        &self,
        partition: i32,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<SnapshotStep> {
        dispatch!(self, s => s.changelog_snapshot_step(partition, max_records.max(1), max_bytes.max(1)).await)
    }

    /// Every partition's changelog state, by partition.
    pub async fn changelog_positions(&self) -> Result<Vec<ChangelogPosition>> {
        dispatch!(self, s => s.changelog_positions().await)
    }

    /// Preimages currently saved for a function (tests and inspection).
    pub async fn preimage_count(&self, function_id: &str) -> Result<i64> {
        dispatch!(self, s => s.preimage_count(function_id).await)
    }

    /// Record a data-loss gap and move the partition from `from` to `to` (CAS on `from`).
    pub async fn record_gap(&self, topic: &str, partition: i32, from: i64, to: i64) -> Result<()> {
        let delta = PositionDelta::new(partition, from, to).map_err(|e| self.invalid(format!("gap: {e}")))?;
        dispatch!(self, s => s.record_gap(topic, delta).await)
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
        if to < 0 {
            return Err(self.invalid(format!("partition {partition}: cannot reset to negative offset {to}")));
        }
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
fn topic_partitions_key(topic: &str) -> String {
    format!("topic_partitions:{topic}")
}
