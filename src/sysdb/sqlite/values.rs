//! The SQLite record layout: small rows, and the large values in an append-only log.
//!
//! `records(collection_id, id, metadata, last_offset, value, value_bytes)` holds what is
//! looked up and rewritten by key; `record_values(seq, collection_id, id, embedding,
//! document)` holds a record's embedding and document, appended at the end of the table
//! (`seq` is its rowid, so a new value is written at the table's last page) and pointed at
//! by `records.value`. A record with neither embedding nor document has no value (`value`
//! NULL). `value_bytes` is the size of the value it points at.
//!
//! Why: with the values inside the row, every upsert of a ~1.8 KB record rewrites a
//! random 16 KiB page, which SQLite writes twice (WAL, then the database file); a batch
//! of a few thousand records rewrote about as many pages. Appending the values writes
//! them once, in order, and only the small rows are rewritten in place.
//!
//! **Bounded in bytes.** An overwritten or deleted record leaves its old value behind.
//! `value_log` keeps `log_bytes` (every value in the log) and `live_bytes` (the values
//! `records` points at), so the dead bytes are their difference. [`compact`] runs at the
//! end of a transaction that changed `records` when the dead bytes pass
//! `dead_value_ratio` times the live ones plus `dead_value_slack_bytes`: it examines the
//! oldest values, frees the dead ones, copies the live ones to the end (re-pointing their
//! records) and deletes the rest, examining and copying at most `compaction_step_bytes`
//! per commit and going on over later commits. It runs inside the same transaction as the
//! writes, so a crash leaves either both or neither. Liveness is a key lookup: a value is
//! live when its record (found by the `(collection_id, id)` it carries) still points at
//! it. Triggers on `records` would keep the byte counts too, but a statement that fires a
//! trigger needs a statement journal: measured, that copied one 16 KiB page per record.
//!
//! The records delta: a small transaction appends its row changes to `record_delta`
//! (no key; a delete is a row with a NULL `last_offset`) instead of rewriting `records`,
//! one 16 KiB page per record; the newest row of a key there overrides `records`. The
//! transaction that finds `delta_max_rows` rows, or `delta_max_bytes` of keys, metadata
//! and the values they appended, merges them in key order ([`merge_delta`]); large transactions merge first
//! and write `records` directly ([`Target`]). The processor finds unmerged rows through
//! [`DeltaCache`]; reads fold them in at read time (`sqlite/readers.rs`) and never merge.
//! Compaction needs a complete `records` (its liveness check reads it): it runs after a
//! merge, or in a transaction that merged first.

use std::collections::HashMap;

use rusqlite::{params, CachedStatement, Connection, OptionalExtension};

use crate::config::SqliteConfig;
use crate::record::Record;
use crate::sysdb::error::Result;
use crate::sysdb::stored_fields::{encode_embedding, encode_metadata};

/// The columns of a whole record, `records r` joined with its value `v`, in the order
/// `raw_record` reads them.
pub(super) const RECORD_COLUMNS: &str = "r.id, v.embedding, r.metadata, v.document, r.last_offset";

/// `records r` with its value; every read of whole records uses it.
pub(super) const RECORDS_WITH_VALUES: &str = "records r LEFT JOIN record_values v ON v.seq = r.value";

/// The bytes of the value a `records r` row points at: `value_bytes`, or for rows written
/// before schema step 10, the lengths of the value itself (headers only: SQLite reads a
/// length without the content).
const OLD_VALUE_BYTES: &str =
    "COALESCE(r.value_bytes, (SELECT COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0)
     FROM record_values v WHERE v.seq = r.value), 0)";

/// [`OLD_VALUE_BYTES`] of the row a `DELETE FROM records ... RETURNING` removes (a
/// RETURNING clause names the table itself, not an alias).
const DELETED_VALUE_BYTES: &str =
    "COALESCE(records.value_bytes, (SELECT COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0)
     FROM record_values v WHERE v.seq = records.value), 0)";

/// A compaction examines at least this many bytes (when it runs at all): a transaction
/// that deleted records appends nothing, and the dead bytes it left must still go.
const MIN_EXAMINED_BYTES: i64 = 1 << 20;

/// Where a transaction writes its records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Target {
    /// Appended to `record_delta`: a small transaction writes the delta's last page or two
    /// instead of one `records` page per record, and `records` is rewritten at merges,
    /// where thousands of changes share its pages.
    Delta,
    /// Straight into `records`, in a transaction that merged the delta first (so nothing
    /// in the delta can hide these writes).
    Records,
}

/// A transaction with this many record writes or more writes `records` directly
/// ([`Target::Records`]): its changes share most pages of `records` already, and going
/// through the delta would write them twice. So does one whose keys and metadata reach
/// the delta's byte bound.
pub(super) const DIRECT_WRITES: usize = 1024;

/// What one write transaction changed in `value_log`'s counts, written once at its end
/// ([`Account::flush`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Account {
    /// Bytes added to (or, by compaction, removed from) the value log.
    pub log_bytes: i64,
    /// Change of the bytes of the values `records` points at.
    pub live_bytes: i64,
    /// Keys, metadata and value bytes appended through the delta.
    pub delta_bytes: i64,
    /// Bytes of values this transaction appended (compaction's pace).
    pub appended_bytes: i64,
}

impl Account {
    /// Add the counts to `value_log` (nothing when there is nothing to add).
    pub(super) fn flush(&mut self, tx: &Connection) -> Result<()> {
        if self.log_bytes != 0 || self.live_bytes != 0 || self.delta_bytes != 0 {
            tx.prepare_cached(
                "UPDATE value_log SET log_bytes = log_bytes + ?1, live_bytes = live_bytes + ?2, delta_bytes = delta_bytes + ?3",
            )?
            .execute(params![self.log_bytes, self.live_bytes, self.delta_bytes])?;
        }
        let appended = self.appended_bytes;
        *self = Account { appended_bytes: appended, ..Account::default() };
        Ok(())
    }
}

/// The size of a value: its embedding's packed bytes and its document's UTF-8 bytes.
fn value_size(embedding: Option<&[u8]>, document: Option<&str>) -> i64 {
    (embedding.map_or(0, <[u8]>::len) + document.map_or(0, str::len)) as i64
}

/// The bytes a delta row counts toward `delta_max_bytes` (besides its value's).
fn delta_row_size(collection: &str, id: &str, metadata: Option<&str>) -> i64 {
    (collection.len() + id.len() + metadata.map_or(0, str::len)) as i64
}

/// About the bytes `metadata` takes as JSON text (keys, values, quotes and separators),
/// to choose where a transaction writes before encoding it.
pub(super) fn metadata_size(metadata: &crate::record::Metadata) -> usize {
    use crate::record::MetaValue;
    metadata
        .iter()
        .map(|(k, v)| {
            k.len()
                + 4
                + match v {
                    MetaValue::String(s) => s.len() + 2,
                    MetaValue::Null | MetaValue::Bool(_) => 5,
                    MetaValue::Long(_) | MetaValue::Double(_) => 20,
                }
        })
        .sum()
}

/// A row change waiting in the delta, as [`DeltaCache`] holds it.
#[derive(Debug, Clone)]
struct DeltaEntry {
    seq: i64,
    /// `None`: deleted.
    last_offset: Option<i64>,
    value: Option<i64>,
    /// The row's metadata when it fit in the cache's budget, else read by `seq`.
    metadata: Option<Option<String>>,
    /// Bytes of metadata this entry holds.
    metadata_bytes: usize,
}

/// The unmerged delta for the processor's reads of the keys it is about to write (the
/// delta has no key to search by): every key with its newest row's position (bounded by
/// the delta's own bounds: at most `delta_max_rows` keys, whose bytes count toward
/// `delta_max_bytes`), and the metadata of as many rows as fit in `delta_cache_bytes` (the
/// others are read from `record_delta` by rowid). It mirrors the rows of `record_delta` with `seq <=
/// last_seq` as of `merges` merges: [`DeltaCache::sync`], inside a read transaction,
/// reads what other connections appended since, and starts over after a merge (a merge
/// empties the delta, and rowids start again from 1).
#[derive(Default)]
pub(super) struct DeltaCache {
    merges: i64,
    last_seq: i64,
    /// At most this many bytes of metadata are held (`delta_cache_bytes`).
    budget: usize,
    metadata_bytes: usize,
    /// By collection, then id: a lookup by `&str` allocates nothing.
    rows: HashMap<String, HashMap<String, DeltaEntry>>,
}

impl DeltaCache {
    pub(super) fn new(budget: usize) -> DeltaCache {
        DeltaCache { budget, ..DeltaCache::default() }
    }

    /// Bytes of metadata held (at most the budget).
    #[cfg(test)]
    pub(super) fn metadata_bytes(&self) -> usize {
        self.metadata_bytes
    }

    /// Bring the cache up to the connection's snapshot; call it inside a read transaction
    /// that the following [`DeltaCache::get`] calls share.
    pub(super) fn sync(&mut self, c: &Connection) -> Result<()> {
        let merges: i64 = c.prepare_cached("SELECT delta_merges FROM value_log")?.query_row([], |r| r.get(0))?;
        if merges != self.merges {
            self.rows.clear();
            self.metadata_bytes = 0;
            self.last_seq = 0;
            self.merges = merges;
        }
        let mut stmt = c.prepare_cached(
            "SELECT seq, collection_id, id, metadata, last_offset, value FROM record_delta WHERE seq > ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([self.last_seq])?;
        while let Some(r) = rows.next()? {
            let seq: i64 = r.get(0)?;
            self.last_seq = seq;
            let collection: String = r.get(1)?;
            let id: String = r.get(2)?;
            let metadata: Option<String> = r.get(3)?;
            let meta_bytes = metadata.as_ref().map_or(0, String::len);
            let ids = self.rows.entry(collection).or_default();
            if let Some(old) = ids.remove(&id) {
                self.metadata_bytes -= old.metadata_bytes;
            }
            let keep = self.metadata_bytes + meta_bytes <= self.budget;
            let held = if keep { meta_bytes } else { 0 };
            self.metadata_bytes += held;
            debug_assert!(
                self.metadata_bytes <= self.budget,
                "design.md invariant 16: the delta cache over its budget"
            );
            let entry = DeltaEntry {
                seq,
                last_offset: r.get(4)?,
                value: r.get(5)?,
                metadata: keep.then_some(metadata),
                metadata_bytes: held,
            };
            ids.insert(id, entry);
        }
        Ok(())
    }

    /// The key's state in the delta: `None` if the delta has no row for it (read
    /// `records`), `Some(None)` if it was deleted, else the record (`whole`: with its
    /// embedding and document, read from the value log).
    pub(super) fn get(
        &self,
        c: &Connection,
        collection: &str,
        id: &str,
        whole: bool,
    ) -> Result<Option<Option<super::rows::RawRecord>>> {
        let Some(entry) = self.rows.get(collection).and_then(|ids| ids.get(id)) else {
            return Ok(None);
        };
        let Some(offset) = entry.last_offset else { return Ok(Some(None)) };
        let metadata = match &entry.metadata {
            Some(m) => m.clone(),
            None => c
                .prepare_cached("SELECT metadata FROM record_delta WHERE seq = ?1")?
                .query_row([entry.seq], |r| r.get(0))?,
        };
        let (embedding, document) = match (whole, entry.value) {
            (true, Some(v)) => read_value(c, v)?,
            _ => (None, None),
        };
        Ok(Some(Some((id.to_string(), embedding, metadata, document, offset))))
    }
}

/// A value of the log by its `seq`: (embedding, document).
pub(super) fn read_value(c: &Connection, seq: i64) -> Result<(Option<Vec<u8>>, Option<String>)> {
    Ok(c.prepare_cached("SELECT embedding, document FROM record_values WHERE seq = ?1")?
        .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?)))?)
}

/// Why a merge ran (`sluice_sqlite_delta_merges_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MergeReason {
    /// The delta reached `delta_max_rows`.
    Rows,
    /// The delta reached `delta_max_bytes`.
    Bytes,
    /// A transaction that writes `records` directly (large, with function outputs, a
    /// backfill step, an attach or detach) merged first.
    Writer,
}

impl MergeReason {
    pub(super) const ALL: [MergeReason; 3] = [MergeReason::Rows, MergeReason::Bytes, MergeReason::Writer];

    pub(super) fn as_str(self) -> &'static str {
        match self {
            MergeReason::Rows => "rows",
            MergeReason::Bytes => "bytes",
            MergeReason::Writer => "writer",
        }
    }
}

/// Fold `record_delta` into `records` when it holds `delta_max_rows` rows or
/// `delta_max_bytes` of keys and metadata (`force`: whatever it holds): the newest row of
/// each key, in key order, then empty it and account the live bytes the merge changed.
/// Runs inside the caller's transaction, so a crash leaves the delta or its merge, never
/// half. When it runs it counts a merge in `value_log.delta_merges`, even with an empty
/// delta: every transaction that changes `records` itself runs it first, and the
/// processor's [`DeltaCache`] starts over when the count moves. Memory: one key's rows at
/// a time (SQLite sorts the delta, spilling to a temporary file past its cache). Returns
/// why it ran, or `None` if it did not. The caller compacts afterwards (`records` is
/// complete then).
pub(super) fn merge_delta(
    tx: &Connection,
    force: bool,
    tuning: &SqliteConfig,
    acct: &mut Account,
) -> Result<Option<MergeReason>> {
    // Rows are only ever deleted all at once, so rowids run 1..=n: the last one is the
    // count, read from the b-tree's edge instead of a scan of the delta.
    let rows: i64 = tx.prepare_cached("SELECT COALESCE(max(seq), 0) FROM record_delta")?.query_row([], |r| r.get(0))?;
    let bytes: i64 = tx.prepare_cached("SELECT delta_bytes FROM value_log")?.query_row([], |r| r.get(0))?;
    let bytes = bytes + acct.delta_bytes;
    let reason = if force {
        MergeReason::Writer
    } else if rows >= i64::from(tuning.delta_max_rows) {
        MergeReason::Rows
    } else if bytes >= tuning.delta_max_bytes as i64 {
        MergeReason::Bytes
    } else {
        return Ok(None);
    };
    let began = std::time::Instant::now();
    if rows > 0 {
        // What the merged rows replace in `records`, read before they do (in key order).
        let replaced: i64 = tx
            .prepare_cached(&format!(
                "SELECT COALESCE(sum({OLD_VALUE_BYTES}), 0) FROM records r
                 WHERE (r.collection_id, r.id) IN (SELECT collection_id, id FROM record_delta)"
            ))?
            .query_row([], |r| r.get(0))?;
        let mut merged = 0i64;
        // Values the delta's rows appended: compaction paces itself on them (they were
        // left to this moment).
        let mut appended = 0i64;
        {
            let mut upsert = tx.prepare_cached(UPSERT_RECORD)?;
            let mut delete = tx.prepare_cached(DELETE_RECORD)?;
            let mut apply = |row: &DeltaRow| -> Result<()> {
                match row.last_offset {
                    Some(o) => {
                        upsert.execute(params![row.collection, row.id, row.metadata, o, row.value, row.value_bytes])?;
                        merged += row.value_bytes.unwrap_or(0);
                    }
                    None => {
                        delete.execute(params![row.collection, row.id])?;
                    }
                }
                Ok(())
            };
            let mut stmt = tx.prepare_cached(
                "SELECT collection_id, id, metadata, last_offset, value, value_bytes FROM record_delta
                 ORDER BY collection_id, id, seq",
            )?;
            let mut q = stmt.query([])?;
            let mut newest: Option<DeltaRow> = None;
            while let Some(r) = q.next()? {
                let row = DeltaRow {
                    collection: r.get(0)?,
                    id: r.get(1)?,
                    metadata: r.get(2)?,
                    last_offset: r.get(3)?,
                    value: r.get(4)?,
                    value_bytes: r.get(5)?,
                };
                appended += row.value_bytes.unwrap_or(0);
                if let Some(prev) = newest.take() {
                    if prev.collection != row.collection || prev.id != row.id {
                        apply(&prev)?;
                    }
                }
                newest = Some(row);
            }
            if let Some(last) = newest {
                apply(&last)?;
            }
        }
        tx.prepare_cached("DELETE FROM record_delta")?.execute([])?;
        acct.live_bytes += merged - replaced;
        acct.appended_bytes += appended;
    }
    tx.prepare_cached("UPDATE value_log SET delta_merges = delta_merges + 1, delta_bytes = 0")?.execute([])?;
    acct.delta_bytes = 0;
    if rows > 0 {
        tracing::debug!(
            rows,
            bytes,
            reason = reason.as_str(),
            elapsed_ms = began.elapsed().as_millis() as u64,
            "records delta merged"
        );
    }
    Ok(Some(reason))
}

/// One row of the delta as a merge reads it.
struct DeltaRow {
    collection: String,
    id: String,
    metadata: Option<String>,
    last_offset: Option<i64>,
    value: Option<i64>,
    value_bytes: Option<i64>,
}

const UPSERT_RECORD: &str =
    "INSERT INTO records (collection_id, id, metadata, last_offset, value, value_bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         metadata = excluded.metadata, last_offset = excluded.last_offset, value = excluded.value,
         value_bytes = excluded.value_bytes";
const DELETE_RECORD: &str = "DELETE FROM records WHERE collection_id = ?1 AND id = ?2";

/// The prepared statements that write records in one transaction; what they change in
/// the value log's counts goes into the transaction's [`Account`].
pub(super) struct RecordWriter<'c> {
    target: Target,
    append_value: CachedStatement<'c>,
    upsert: CachedStatement<'c>,
    delete: CachedStatement<'c>,
    /// `Target::Records`: the bytes of the value a row points at, before it is replaced.
    old_bytes: Option<CachedStatement<'c>>,
}

impl<'c> RecordWriter<'c> {
    /// Writes into `records`, [`Target::Records`]: the caller merged the delta in this
    /// transaction first.
    pub(super) fn new(tx: &'c Connection) -> Result<Self> {
        Self::with_target(tx, Target::Records)
    }

    pub(super) fn with_target(tx: &'c Connection, target: Target) -> Result<Self> {
        let (upsert, delete, old_bytes) = match target {
            Target::Records => (
                tx.prepare_cached(UPSERT_RECORD)?,
                tx.prepare_cached(&format!(
                    "DELETE FROM records WHERE collection_id = ?1 AND id = ?2 RETURNING {DELETED_VALUE_BYTES}"
                ))?,
                Some(tx.prepare_cached(&format!(
                    "SELECT {OLD_VALUE_BYTES} FROM records r WHERE r.collection_id = ?1 AND r.id = ?2"
                ))?),
            ),
            Target::Delta => (
                tx.prepare_cached(
                    "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value, value_bytes) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )?,
                tx.prepare_cached(
                    "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value, value_bytes) VALUES (?1, ?2, NULL, NULL, NULL, NULL)",
                )?,
                None,
            ),
        };
        Ok(RecordWriter {
            target,
            append_value: tx.prepare_cached(
                "INSERT INTO record_values (collection_id, id, embedding, document) VALUES (?1, ?2, ?3, ?4)",
            )?,
            upsert,
            delete,
            old_bytes,
        })
    }

    /// Insert or replace the record `id` of `collection`.
    pub(super) fn put(&mut self, collection: &str, record: &Record, acct: &mut Account) -> Result<()> {
        self.put_parts(
            collection,
            &record.id,
            record.embedding.as_ref().map(encode_embedding),
            encode_metadata(&record.metadata),
            record.document.as_deref(),
            record.offset,
            acct,
        )
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn put_parts(
        &mut self,
        collection: &str,
        id: &str,
        embedding: Option<&[u8]>,
        metadata: Option<String>,
        document: Option<&str>,
        offset: i64,
        acct: &mut Account,
    ) -> Result<()> {
        let (value, value_bytes) = if embedding.is_some() || document.is_some() {
            let size = value_size(embedding, document);
            acct.log_bytes += size;
            acct.appended_bytes += size;
            (Some(self.append_value.insert(params![collection, id, embedding, document])?), Some(size))
        } else {
            (None, None)
        };
        match &mut self.old_bytes {
            Some(old) => {
                let replaced: i64 = old.query_row(params![collection, id], |r| r.get(0)).optional()?.unwrap_or(0);
                acct.live_bytes += value_bytes.unwrap_or(0) - replaced;
            }
            // The delta counts its rows and the values they appended: those values are
            // compacted only after the merge.
            None => acct.delta_bytes += delta_row_size(collection, id, metadata.as_deref()) + value_bytes.unwrap_or(0),
        }
        self.upsert.execute(params![collection, id, metadata, offset, value, value_bytes])?;
        Ok(())
    }

    /// Remove the record `id` of `collection` (nothing if absent); its value is left to
    /// [`compact`].
    pub(super) fn delete(&mut self, collection: &str, id: &str, acct: &mut Account) -> Result<()> {
        match self.target {
            Target::Records => {
                let freed: Option<i64> = self.delete.query_row(params![collection, id], |r| r.get(0)).optional()?;
                acct.live_bytes -= freed.unwrap_or(0);
            }
            Target::Delta => {
                self.delete.execute(params![collection, id])?;
                acct.delta_bytes += delta_row_size(collection, id, None);
            }
        }
        Ok(())
    }
}

/// Delete every record of `collection` (detach with `--drop-output`), accounting the
/// live bytes it frees. `records` must be complete (the delta merged in this transaction).
pub(super) fn delete_collection(tx: &Connection, collection: &str, acct: &mut Account) -> Result<usize> {
    let freed: i64 = tx
        .prepare_cached(&format!(
            "SELECT COALESCE(sum({OLD_VALUE_BYTES}), 0) FROM records r WHERE r.collection_id = ?1"
        ))?
        .query_row([collection], |r| r.get(0))?;
    let dropped = tx.prepare_cached("DELETE FROM records WHERE collection_id = ?1")?.execute([collection])?;
    acct.live_bytes -= freed;
    Ok(dropped)
}

/// What one compaction did (`sluice_sqlite_compaction_*`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compaction {
    pub examined_bytes: i64,
    pub copied_bytes: i64,
}

/// Keep the value log's dead bytes within `dead_value_ratio` times the live bytes plus
/// `dead_value_slack_bytes` (see the module docs). Call it at the end of a transaction
/// that changed `records` (after a merge, or with the delta merged first), with its
/// [`Account`] flushed. It examines twice the bytes the transaction appended (at least
/// [`MIN_EXAMINED_BYTES`]), at most `compaction_step_bytes`, and copies at most that many
/// bytes of live values; the oldest values first. Dead values are deleted before the live
/// ones are copied, so that the copies reuse their pages. It runs inside the caller's
/// transaction and opens no savepoint (one would copy every page the transaction already
/// changed into a sub-journal), so if it fails, the transaction fails like any of its
/// writes, and is retried.
pub(super) fn compact(tx: &Connection, tuning: &SqliteConfig, appended_bytes: i64) -> Result<Option<Compaction>> {
    let (log, live): (i64, i64) = tx
        .prepare_cached("SELECT log_bytes, live_bytes FROM value_log")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))?;
    let allowed = (tuning.dead_value_ratio * live as f64) as i64 + tuning.dead_value_slack_bytes as i64;
    let excess = (log - live) - allowed;
    if excess <= 0 {
        return Ok(None);
    }
    let step = tuning.compaction_step_bytes as i64;
    let examine = (2 * appended_bytes).max(MIN_EXAMINED_BYTES).min(step);
    let Some(lo) =
        tx.prepare_cached("SELECT min(seq) FROM record_values")?.query_row([], |r| r.get::<_, Option<i64>>(0))?
    else {
        return Ok(None);
    };
    let mut done = Compaction::default();
    // The live values of the examined range, oldest first: (seq, collection, id).
    let mut live_values: Vec<(i64, String, String)> = Vec::new();
    let mut cut = lo;
    {
        let mut stmt = tx.prepare_cached(
            "SELECT v.seq, v.collection_id, v.id,
                    COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0),
                    EXISTS (SELECT 1 FROM records r WHERE r.collection_id = v.collection_id AND r.id = v.id AND r.value = v.seq)
             FROM record_values v WHERE v.seq >= ?1 ORDER BY v.seq",
        )?;
        let mut rows = stmt.query([lo])?;
        while let Some(r) = rows.next()? {
            let (seq, bytes, is_live): (i64, i64, bool) = (r.get(0)?, r.get(3)?, r.get(4)?);
            if is_live {
                if done.copied_bytes + bytes > step && done.examined_bytes > 0 {
                    break;
                }
                done.copied_bytes += bytes;
                live_values.push((seq, r.get(1)?, r.get(2)?));
            }
            done.examined_bytes += bytes;
            cut = seq + 1;
            if done.examined_bytes >= examine || done.examined_bytes - done.copied_bytes >= excess {
                break;
            }
        }
    }
    if cut == lo {
        return Ok(None);
    }
    // Free the dead values first (the ranges between live ones), so that the copies below
    // take their pages instead of growing the file.
    {
        let mut free = tx.prepare_cached("DELETE FROM record_values WHERE seq >= ?1 AND seq < ?2")?;
        let mut from = lo;
        for (seq, _, _) in &live_values {
            if *seq > from {
                free.execute(params![from, seq])?;
            }
            from = seq + 1;
        }
        if cut > from {
            free.execute(params![from, cut])?;
        }
    }
    {
        let mut copy = tx.prepare_cached(
            "INSERT INTO record_values (collection_id, id, embedding, document)
             SELECT collection_id, id, embedding, document FROM record_values WHERE seq = ?1",
        )?;
        let mut repoint = tx.prepare_cached("UPDATE records SET value = ?1 WHERE collection_id = ?2 AND id = ?3")?;
        let mut drop_old = tx.prepare_cached("DELETE FROM record_values WHERE seq = ?1")?;
        for (seq, collection, id) in &live_values {
            let moved = copy.insert(params![seq])?;
            repoint.execute(params![moved, collection, id])?;
            drop_old.execute(params![seq])?;
        }
    }
    debug_assert!(
        done.copied_bytes <= step || live_values.len() == 1,
        "design.md invariant 16: one compaction copied {} bytes, over its step of {step}",
        done.copied_bytes
    );
    tx.prepare_cached("UPDATE value_log SET log_bytes = log_bytes - ?1")?
        .execute([done.examined_bytes - done.copied_bytes])?;
    tracing::debug!(
        examined_bytes = done.examined_bytes,
        copied_bytes = done.copied_bytes,
        excess,
        "value log compacted"
    );
    Ok(Some(done))
}

/// The current records (the newest delta row of a key, else `records`; deletes left out)
/// in plain SQL, for tests: Sluice's own reads fold the delta in Rust. The records
/// without a delta row are an anti-join, which SQLite answers with an automatic index; a
/// row-value `NOT IN (subquery)` scanned the delta once per record.
#[cfg(test)]
pub(super) const CURRENT_RECORDS: &str = "(WITH d AS (SELECT collection_id, id, metadata, last_offset, value, value_bytes,
        row_number() OVER (PARTITION BY collection_id, id ORDER BY seq DESC) AS newest FROM record_delta)
    SELECT collection_id, id, metadata, last_offset, value, value_bytes FROM d WHERE newest = 1 AND last_offset IS NOT NULL
    UNION ALL
    SELECT r.collection_id, r.id, r.metadata, r.last_offset, r.value, r.value_bytes FROM records r
    LEFT JOIN d k ON k.newest = 1 AND k.collection_id = r.collection_id AND k.id = r.id WHERE k.id IS NULL)";

/// The layout's invariants, checked (tests only): every record's value exists, carries
/// its key and has the size the record says; the log's byte counts are exact (live bytes
/// as of the last merge: with the delta empty, exactly the current records' values).
#[cfg(test)]
pub(super) fn check_layout(c: &Connection) -> std::result::Result<(), String> {
    let q = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    let size = "COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0)";
    let dangling = q(&format!(
        "SELECT count(*) FROM {CURRENT_RECORDS} r WHERE r.value IS NOT NULL AND NOT EXISTS
         (SELECT 1 FROM record_values v WHERE v.seq = r.value AND v.collection_id = r.collection_id AND v.id = r.id
            AND (r.value_bytes IS NULL OR r.value_bytes = {size}))"
    ));
    if dangling != 0 {
        return Err(format!("{dangling} records point at a missing or foreign value, or a value of another size"));
    }
    let log = q(&format!("SELECT COALESCE(sum({size}), 0) FROM record_values v"));
    let counted_log = q("SELECT log_bytes FROM value_log");
    if log != counted_log {
        return Err(format!("value_log counts {counted_log} bytes in the log, there are {log}"));
    }
    let live = q(&format!("SELECT COALESCE(sum({size}), 0) FROM records r JOIN record_values v ON v.seq = r.value"));
    let counted_live = q("SELECT live_bytes FROM value_log");
    if live != counted_live {
        return Err(format!("value_log counts {counted_live} live bytes, records point at {live}"));
    }
    let delta =
        q("SELECT COALESCE(sum(octet_length(collection_id) + octet_length(id) + COALESCE(octet_length(metadata), 0)
                                + COALESCE(value_bytes, 0)), 0) FROM record_delta");
    let counted_delta = q("SELECT delta_bytes FROM value_log");
    if delta != counted_delta {
        return Err(format!("value_log counts {counted_delta} delta bytes, the delta holds {delta}"));
    }
    Ok(())
}

/// (bytes in the log, live bytes) (tests only).
#[cfg(test)]
pub(super) fn log_bytes(c: &Connection) -> (i64, i64) {
    c.query_row("SELECT log_bytes, live_bytes FROM value_log", [], |r| Ok((r.get(0)?, r.get(1)?))).unwrap()
}
