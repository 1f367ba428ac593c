//! The SQLite record layout: small rows, and the large values in an append-only log.
//!
//! `records(collection_id, id, metadata, last_offset, value)` holds what is looked up
//! and rewritten by key; `record_values(seq, collection_id, id, embedding, document)`
//! holds a record's embedding and document, appended at the end of the table (`seq` is
//! its rowid, so a new value is written at the table's last page) and pointed at by
//! `records.value`. A record with neither embedding nor document has no value
//! (`value` NULL).
//!
//! Why: with the values inside the row, every upsert of a ~1.8 KB record rewrites a
//! random 16 KiB page, which SQLite writes twice (WAL, then the database file); a batch
//! of a few thousand records rewrote about as many pages. Appending the values writes
//! them once, in order, and only the small rows are rewritten in place.
//!
//! An overwritten or deleted record leaves its old value behind. [`compact`] keeps the
//! log within about [`SPACE_FACTOR`] times the live values: at the end of a transaction
//! that appended values, it looks at the oldest values, copies the live ones to the end
//! (re-pointing their records) and deletes the rest in one range. It runs inside the same
//! transaction as the writes, so a crash leaves either both or neither: there is no
//! pending list and no separate recovery. Liveness is a key lookup: a value is live
//! when its record (found by the `(collection_id, id)` it carries) still points at it.
//! The bound uses `value_log.records`, the number of rows of `records` (each has at most
//! one live value), kept by every transaction that adds or removes records from the
//! same counts it adds to `collections.record_count` ([`count_records`]). Triggers on
//! `records` would keep it too, but a statement that fires a trigger needs a statement
//! journal: measured, that copied one 16 KiB page per record written.
//!
//! The records delta: a small transaction appends its row changes to `record_delta`
//! (no key; a delete is a row with a NULL `last_offset`) instead of rewriting `records`,
//! one 16 KiB page per record; the newest row of a key there overrides `records`. The
//! transaction that finds [`DELTA_MERGE_ROWS`] rows merges them in key order
//! ([`merge_delta`]); large transactions merge first and write `records` directly
//! ([`Target`]). The processor reads the unmerged rows from memory ([`DeltaCache`]);
//! every other reader of `records` merges first. Compaction needs a complete `records`
//! (its liveness check reads it): it runs after a merge, or in a transaction that merged
//! first.

use rusqlite::{params, CachedStatement, Connection};

use super::Result;
use crate::record::Record;
use crate::sysdb::codec::{encode_embedding, encode_metadata};

/// The columns of a whole record, `records r` joined with its value `v`, in the order
/// `raw_record` reads them.
pub(super) const RECORD_COLUMNS: &str = "r.id, v.embedding, r.metadata, v.document, r.last_offset";

/// `records r` with its value; every read of whole records uses it.
pub(super) const RECORDS_WITH_VALUES: &str = "records r LEFT JOIN record_values v ON v.seq = r.value";

/// The log may span this many times the records (plus [`SLACK`]) before compaction
/// copies anything. The less room, the more live values each compaction copies: under
/// uniform overwrites the fraction f of the tail still live solves f = e^(-factor(1-f)),
/// about 20% at 2 and 6% at 3, so each appended value costs 0.25 or 0.06 copies.
/// Measured on a 1M-record W1 drain: 2 cost 0.9-1.4 more CPU-s per 1M records than 3
/// (17.7-18.2 against 16.3-17.4) and wrote 6.1-6.5 KB per record against 4.7-5.0. The
/// price of 3 is space: the value log holds up to three times the live embeddings and
/// documents.
pub(super) const SPACE_FACTOR: i64 = 3;

/// The log may span this many values beyond [`SPACE_FACTOR`] times the records before
/// compaction starts (a small database is never compacted value by value).
pub(super) const SLACK: i64 = 4096;

/// At most this many times the values a transaction appended are examined by its
/// compaction (at least [`MIN_EXAMINED`]): the log catches up over several
/// transactions after a burst of deletes instead of stalling one of them.
const EXAMINE_PER_APPENDED: i64 = 2;
const MIN_EXAMINED: i64 = 1024;

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
/// through the delta would write them twice.
pub(super) const DIRECT_WRITES: usize = 1024;

/// A transaction that finds this many rows or more in `record_delta` merges it. Measured
/// SQL-only (`bench/sqlite-layout`, 150-record transactions, every key read first):
/// 4,096 rows cut the writer and checkpointer CPU per record by 38%; a merge took ~10 ms.
pub(super) const DELTA_MERGE_ROWS: i64 = 4096;

/// A row change waiting in the delta: metadata, last offset (`None`: deleted), value.
type DeltaRow = (Option<String>, Option<i64>, Option<i64>);

/// The unmerged delta in memory, for the processor's reads of the keys it is about to
/// write (the delta has no key to search by). It mirrors the rows of `record_delta` with
/// `seq <= last_seq` as of `merges` merges: [`DeltaCache::sync`], inside a read
/// transaction, reads what other connections appended since, and starts over after a
/// merge (a merge empties the delta, and rowids start again from 1).
#[derive(Default)]
pub(super) struct DeltaCache {
    merges: i64,
    last_seq: i64,
    /// By collection, then id: a lookup by `&str` allocates nothing.
    rows: std::collections::HashMap<String, std::collections::HashMap<String, DeltaRow>>,
}

impl DeltaCache {
    /// Bring the cache up to the connection's snapshot; call it inside a read transaction
    /// that the following [`DeltaCache::get`] calls share.
    pub fn sync(&mut self, c: &Connection) -> Result<()> {
        let merges: i64 = c.prepare_cached("SELECT delta_merges FROM value_log")?.query_row([], |r| r.get(0))?;
        if merges != self.merges {
            self.rows.clear();
            self.last_seq = 0;
            self.merges = merges;
        }
        let mut stmt = c.prepare_cached(
            "SELECT seq, collection_id, id, metadata, last_offset, value FROM record_delta WHERE seq > ?1 ORDER BY seq",
        )?;
        let mut rows = stmt.query([self.last_seq])?;
        while let Some(r) = rows.next()? {
            self.last_seq = r.get(0)?;
            let collection: String = r.get(1)?;
            self.rows.entry(collection).or_default().insert(r.get(2)?, (r.get(3)?, r.get(4)?, r.get(5)?));
        }
        Ok(())
    }

    /// The key's state in the delta: `None` if the delta has no row for it (read
    /// `records`), `Some(None)` if it was deleted, else the record (`whole`: with its
    /// embedding and document, read from the value log).
    pub fn get(
        &self,
        c: &Connection,
        collection: &str,
        id: &str,
        whole: bool,
    ) -> Result<Option<Option<super::RawRecord>>> {
        let Some((metadata, offset, value)) = self.rows.get(collection).and_then(|ids| ids.get(id)) else {
            return Ok(None);
        };
        let Some(offset) = offset else { return Ok(Some(None)) };
        let (embedding, document) = match (whole, value) {
            (true, Some(v)) => c
                .prepare_cached("SELECT embedding, document FROM record_values WHERE seq = ?1")?
                .query_row([v], |r| Ok((r.get(0)?, r.get(1)?)))?,
            _ => (None, None),
        };
        Ok(Some(Some((id.to_string(), embedding, metadata.clone(), document, *offset))))
    }
}

/// Fold `record_delta` into `records` once it holds [`DELTA_MERGE_ROWS`] rows (`force`:
/// whatever it holds): the newest row of each key, in key order, then empty it and
/// compact the value log for the values those rows appended. Runs
/// inside the caller's transaction, so a crash leaves the delta or its merge, never half.
/// When it runs it counts a merge in `value_log.delta_merges`, even with an empty delta:
/// every transaction that changes `records` itself runs it first, and readers that keep
/// the delta in memory ([`DeltaCache`]) start over when the count moves. Returns the rows
/// merged, or `None` if it did not run.
pub(super) fn merge_delta(tx: &Connection, force: bool) -> Result<Option<i64>> {
    // Rows are only ever deleted all at once, so rowids run 1..=n: the last one is the
    // count, read from the b-tree's edge instead of a scan of the delta.
    let rows: i64 = tx.prepare_cached("SELECT COALESCE(max(seq), 0) FROM record_delta")?.query_row([], |r| r.get(0))?;
    if !force && rows < DELTA_MERGE_ROWS {
        return Ok(None);
    }
    let began = std::time::Instant::now();
    if rows > 0 {
        let mut newest: std::collections::BTreeMap<(String, String), DeltaRow> = std::collections::BTreeMap::new();
        {
            let mut stmt = tx.prepare_cached(
                "SELECT collection_id, id, metadata, last_offset, value FROM record_delta ORDER BY seq",
            )?;
            let mut q = stmt.query([])?;
            while let Some(r) = q.next()? {
                newest.insert((r.get(0)?, r.get(1)?), (r.get(2)?, r.get(3)?, r.get(4)?));
            }
        }
        let mut upsert = tx.prepare_cached(UPSERT_RECORD)?;
        let mut delete = tx.prepare_cached(DELETE_RECORD)?;
        for ((c, id), (metadata, offset, value)) in &newest {
            match offset {
                Some(o) => upsert.execute(params![c, id, metadata, o, value])?,
                None => delete.execute(params![c, id])?,
            };
        }
        tx.prepare_cached("DELETE FROM record_delta")?.execute([])?;
        // The values those rows appended were left to this moment: `compact` reads
        // `records` to tell live values, which is complete only now.
        compact(tx, rows as usize)?;
    }
    tx.prepare_cached("UPDATE value_log SET delta_merges = delta_merges + 1")?.execute([])?;
    if rows > 0 {
        tracing::debug!(rows, force, elapsed_ms = began.elapsed().as_millis() as u64, "records delta merged");
    }
    Ok(Some(rows))
}

const UPSERT_RECORD: &str =
    "INSERT INTO records (collection_id, id, metadata, last_offset, value) VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         metadata = excluded.metadata, last_offset = excluded.last_offset, value = excluded.value";
const DELETE_RECORD: &str = "DELETE FROM records WHERE collection_id = ?1 AND id = ?2";

/// The prepared statements that write records in one transaction, and how many values
/// they appended (what [`compact`] is told).
pub(super) struct RecordWriter<'c> {
    append_value: CachedStatement<'c>,
    upsert: CachedStatement<'c>,
    delete: CachedStatement<'c>,
    pub appended: usize,
}

impl<'c> RecordWriter<'c> {
    /// Writes into `records`, [`Target::Records`]: the caller merged the delta in this
    /// transaction first.
    pub fn new(tx: &'c Connection) -> Result<Self> {
        Self::with_target(tx, Target::Records)
    }

    pub fn with_target(tx: &'c Connection, target: Target) -> Result<Self> {
        let (upsert, delete) = match target {
            Target::Records => (tx.prepare_cached(UPSERT_RECORD)?, tx.prepare_cached(DELETE_RECORD)?),
            Target::Delta => (
                tx.prepare_cached(
                    "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value) VALUES (?1, ?2, ?3, ?4, ?5)",
                )?,
                tx.prepare_cached(
                    "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value) VALUES (?1, ?2, NULL, NULL, NULL)",
                )?,
            ),
        };
        Ok(RecordWriter {
            append_value: tx.prepare_cached(
                "INSERT INTO record_values (collection_id, id, embedding, document) VALUES (?1, ?2, ?3, ?4)",
            )?,
            upsert,
            delete,
            appended: 0,
        })
    }

    /// Insert or replace the record `id` of `collection`.
    pub fn put(&mut self, collection: &str, record: &Record) -> Result<()> {
        self.put_parts(
            collection,
            &record.id,
            record.embedding.as_ref().map(encode_embedding),
            encode_metadata(&record.metadata),
            record.document.as_deref(),
            record.offset,
        )
    }

    pub fn put_parts(
        &mut self,
        collection: &str,
        id: &str,
        embedding: Option<&[u8]>,
        metadata: Option<String>,
        document: Option<&str>,
        offset: i64,
    ) -> Result<()> {
        let value = if embedding.is_some() || document.is_some() {
            self.appended += 1;
            Some(self.append_value.insert(params![collection, id, embedding, document])?)
        } else {
            None
        };
        self.upsert.execute(params![collection, id, metadata, offset, value])?;
        Ok(())
    }

    /// Remove the record `id` of `collection` (nothing if absent); its value is left to
    /// [`compact`].
    pub fn delete(&mut self, collection: &str, id: &str) -> Result<()> {
        self.delete.execute(params![collection, id])?;
        Ok(())
    }
}

/// Add `delta` to the number of records the value log's bound is computed from.
pub(super) fn count_records(tx: &Connection, delta: i64) -> Result<()> {
    if delta != 0 {
        tx.prepare_cached("UPDATE value_log SET records = records + ?1")?.execute([delta])?;
    }
    Ok(())
}

/// Keep the value log within about [`SPACE_FACTOR`] times the live values (see the
/// module docs), after a transaction that appended `appended` values (none: nothing to
/// do). It runs inside the caller's transaction and opens no savepoint (one would copy
/// every page the transaction already changed into a sub-journal), so if it fails, the
/// transaction fails like any of its writes, and is retried.
pub(super) fn compact(tx: &Connection, appended: usize) -> Result<()> {
    if appended == 0 {
        return Ok(());
    }
    let live: i64 = tx.prepare_cached("SELECT records FROM value_log")?.query_row([], |r| r.get(0))?;
    // Two statements: SQLite answers a lone min() or max() of the rowid from the edge of
    // the b-tree, but both in one statement scan the table.
    let lo: Option<i64> = tx.prepare_cached("SELECT min(seq) FROM record_values")?.query_row([], |r| r.get(0))?;
    let hi: Option<i64> = tx.prepare_cached("SELECT max(seq) FROM record_values")?.query_row([], |r| r.get(0))?;
    let (Some(lo), Some(hi)) = (lo, hi) else { return Ok(()) };
    let excess = (hi - lo + 1) - SPACE_FACTOR * live - SLACK;
    if excess <= 0 {
        return Ok(());
    }
    let examined = excess.min((appended as i64 * EXAMINE_PER_APPENDED).max(MIN_EXAMINED));
    let cut = lo + examined;
    let live_values: Vec<(i64, String, String)> = tx
        .prepare_cached(
            "SELECT v.seq, v.collection_id, v.id FROM record_values v
             JOIN records r ON r.collection_id = v.collection_id AND r.id = v.id AND r.value = v.seq
             WHERE v.seq < ?1 ORDER BY v.seq",
        )?
        .query_map(params![cut], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    {
        let mut copy = tx.prepare_cached(
            "INSERT INTO record_values (collection_id, id, embedding, document)
             SELECT collection_id, id, embedding, document FROM record_values WHERE seq = ?1",
        )?;
        let mut repoint = tx.prepare_cached("UPDATE records SET value = ?1 WHERE collection_id = ?2 AND id = ?3")?;
        for (seq, collection, id) in &live_values {
            let moved = copy.insert(params![seq])?;
            repoint.execute(params![moved, collection, id])?;
        }
    }
    tx.prepare_cached("DELETE FROM record_values WHERE seq < ?1")?.execute(params![cut])?;
    Ok(())
}

/// The current records (the newest delta row of a key, else `records`; deletes left out)
/// in plain SQL, for tests: Sluice's own reads use [`DeltaCache`] or merge first. The
/// records without a delta row are an anti-join, which SQLite answers with an automatic
/// index; a row-value `NOT IN (subquery)` scanned the delta once per record.
#[cfg(test)]
pub(super) const CURRENT_RECORDS: &str = "(WITH d AS (SELECT collection_id, id, metadata, last_offset, value,
        row_number() OVER (PARTITION BY collection_id, id ORDER BY seq DESC) AS newest FROM record_delta)
    SELECT collection_id, id, metadata, last_offset, value FROM d WHERE newest = 1 AND last_offset IS NOT NULL
    UNION ALL
    SELECT r.collection_id, r.id, r.metadata, r.last_offset, r.value FROM records r
    LEFT JOIN d k ON k.newest = 1 AND k.collection_id = r.collection_id AND k.id = r.id WHERE k.id IS NULL)";

/// The layout's invariants, checked (tests only): every record's value exists and
/// carries its key, and the count of records is exact.
#[cfg(test)]
pub(super) fn check_layout(c: &Connection) -> std::result::Result<(), String> {
    let q = |sql: &str| -> i64 { c.query_row(sql, [], |r| r.get(0)).unwrap() };
    let dangling = q(&format!(
        "SELECT count(*) FROM {CURRENT_RECORDS} r WHERE r.value IS NOT NULL AND NOT EXISTS
         (SELECT 1 FROM record_values v WHERE v.seq = r.value AND v.collection_id = r.collection_id AND v.id = r.id)"
    ));
    if dangling != 0 {
        return Err(format!("{dangling} records point at a missing or foreign value"));
    }
    let records = q(&format!("SELECT count(*) FROM {CURRENT_RECORDS}"));
    let counted = q("SELECT records FROM value_log");
    if records != counted {
        return Err(format!("value_log counts {counted} records, there are {records}"));
    }
    Ok(())
}

/// Values in the log, live or not (tests only).
#[cfg(test)]
pub(super) fn log_span(c: &Connection) -> (i64, i64) {
    c.query_row(
        "SELECT COALESCE(max(seq) - min(seq) + 1, 0), (SELECT records FROM value_log) FROM record_values",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .unwrap()
}
