//! Attached functions on SQLite (docs/design.md section 7; the rules are in `outputs.rs`,
//! shared with PostgreSQL).
//!
//! Every write runs in a `BEGIN IMMEDIATE` transaction on the writer connection, i.e.
//! holding the database's only write lock: a batch commit and a backfill step never
//! interleave, and each reads the function's status inside its own transaction. The
//! backfill chunk is read by one compound `SELECT … UNION ALL SELECT … ORDER BY 1 LIMIT`
//! (SQLite merges the two index-ordered branches, no sort).

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::rows::{decode_raw, raw_record, RawRecord};
use super::store::{invalid, SqliteSysdb, Writing, BACKEND};
use super::values::{self, Account, RecordWriter, RECORDS_WITH_VALUES};
use crate::functions::{Function, FunctionFailure, FunctionStatus, Reads};
use crate::record::Record;
use crate::sysdb::attach_rules::{self, AttachFacts, AttachOutcome, Decision};
use crate::sysdb::changelog;
use crate::sysdb::error::Result;
use crate::sysdb::outputs::{self, FunctionState, MapWrite, OutputPlan, RawFunction, FUNCTION_COLUMNS};
use crate::sysdb::stored_fields::{encode_embedding, encode_metadata, encode_params};
use crate::sysdb::types::{
    now_ms, BatchCommit, ChunkLimit, CommitReport, FunctionRow, NewFunction, OutboxChange, OutboxRow, StepResult,
};

fn raw_function(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawFunction> {
    Ok(RawFunction {
        id: r.get(0)?,
        collection_id: r.get(1)?,
        function: r.get(2)?,
        output_collection: r.get(3)?,
        params: r.get(4)?,
        status: r.get(5)?,
        request_id: r.get(6)?,
        marker_offset: r.get(7)?,
        backfill_cursor: r.get(8)?,
        backfill_done: r.get(9)?,
        backfill_total: r.get(10)?,
        created_at_ms: r.get(11)?,
        updated_at_ms: r.get(12)?,
        failed_reason: r.get(13)?,
    })
}

fn read_function(conn: &Connection, id: &str) -> Result<Option<FunctionRow>> {
    let raw = conn
        .prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE id = ?1"))?
        .query_row([id], raw_function)
        .optional()?;
    raw.map(|r| r.decode(BACKEND)).transpose()
}

/// `created_at_ms` of a new function: now, or 1 ms after the latest function if that is
/// not earlier, so that creation order is strict (see `sysdb/migrations.rs`).
fn creation_stamp(tx: &Connection) -> Result<i64> {
    let latest: Option<i64> =
        tx.prepare_cached("SELECT MAX(created_at_ms) FROM functions")?.query_row([], |r| r.get(0))?;
    Ok(latest.map_or(now_ms(), |l| now_ms().max(l + 1)))
}

fn outbox_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<OutboxRow> {
    Ok(OutboxRow {
        id: r.get(0)?,
        function_id: r.get(1)?,
        collection_id: r.get(2)?,
        partition: r.get(3)?,
        request_id: r.get(4)?,
        created_at_ms: r.get(5)?,
        published_offset: r.get(6)?,
    })
}

/// Sent markers of functions still waiting for them, whose partition moved past them.
const LOST_MARKERS: &str =
    "SELECT o.id, o.function_id, o.collection_id, o.partition, o.request_id, o.created_at_ms, o.published_offset
     FROM functions f
     JOIN outbox o ON o.function_id = f.id AND o.request_id = f.request_id
     JOIN partitions p ON p.topic = ?1 AND p.partition = o.partition
     WHERE f.status = 'awaiting_marker' AND f.failed_reason IS NULL AND o.sent_at_ms IS NOT NULL AND o.published_offset IS NOT NULL
       AND p.next_offset > o.published_offset
     ORDER BY o.id LIMIT ?2";

/// A live function (not detached) found by `sql` with one text parameter.
fn live_function(tx: &Connection, sql: &str, key: &str) -> Result<Option<FunctionRow>> {
    let raw = tx.prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE {sql} AND status <> 'detached' ORDER BY created_at_ms DESC, id LIMIT 1"))?
        .query_row([key], raw_function)
        .optional()?;
    raw.map(|r| r.decode(BACKEND)).transpose()
}

/// What the attach rules decide from (`sysdb/attach_rules.rs`), read inside the attach
/// transaction (which holds the database's write lock).
fn attach_facts(tx: &Connection, new: &NewFunction) -> Result<AttachFacts> {
    let exists =
        |sql: &str| -> Result<bool> { Ok(tx.prepare_cached(sql)?.query_row([&new.output_collection], |r| r.get(0))?) };
    Ok(AttachFacts {
        output_writer: live_function(tx, "output_collection = ?1", &new.output_collection)?,
        input_written_by: live_function(tx, "output_collection = ?1", &new.collection_id)?,
        output_read_by: live_function(tx, "collection_id = ?1", &new.output_collection)?,
        output_exists: exists("SELECT EXISTS (SELECT 1 FROM collections WHERE id = ?1)")?,
        output_last_writer: tx
            .prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE output_collection = ?1 ORDER BY created_at_ms DESC, id LIMIT 1"))?
            .query_row([&new.output_collection], raw_function)
            .optional()?
            .map(|r| r.decode(BACKEND))
            .transpose()?,
        output_has_records: exists("SELECT EXISTS (SELECT 1 FROM records WHERE collection_id = ?1)")?,
    })
}

/// Mark a function failed (unless detached) in the transaction that found it failing;
/// its preimages are of no more use.
fn mark_failed(tx: &Connection, function_id: &str, reason: &str, now: i64) -> Result<()> {
    tx.prepare_cached(
        "UPDATE functions SET failed_reason = ?2, failed_at_ms = ?3, updated_at_ms = ?3 WHERE id = ?1 AND status <> 'detached'",
    )?
    .execute(params![function_id, reason, now])?;
    tx.prepare_cached("DELETE FROM preimages WHERE function_id = ?1")?.execute([function_id])?;
    Ok(())
}

/// The function batches of a commit, inside its transaction (after the CAS and the
/// record writes): status transitions, preimages, output writes.
/// With `changes`, the output records' changes are appended to it (the change feed).
pub(super) fn commit_functions(
    tx: &Connection,
    batch: &BatchCommit,
    now: i64,
    acct: &mut Account,
    mut changes: Option<&mut Vec<OutboxChange>>,
) -> Result<CommitReport> {
    if batch.functions.is_empty() {
        return Ok(CommitReport::default());
    }
    let mut states: HashMap<String, Option<FunctionState>> = HashMap::new();
    {
        let mut stmt = tx.prepare_cached(
            "SELECT status, request_id, marker_offset, output_collection, failed_reason FROM functions WHERE id = ?1",
        )?;
        for fb in &batch.functions {
            if states.contains_key(&fb.function_id) {
                continue;
            }
            let row = stmt
                .query_row([&fb.function_id], |r| {
                    Ok((r.get::<_, String>(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get::<_, Option<String>>(4)?))
                })
                .optional()?;
            let state = row
                .map(|(status, request_id, marker_offset, output_collection, failed_reason)| {
                    let status = FunctionStatus::parse(&status)
                        .ok_or_else(|| invalid(format!("function {:?}: unknown status {status:?}", fb.function_id)))?;
                    let status = outputs::effective_status(status, failed_reason.as_deref());
                    Ok::<_, crate::sysdb::error::SysdbError>(FunctionState {
                        status,
                        request_id,
                        marker_offset,
                        output_collection,
                    })
                })
                .transpose()?;
            states.insert(fb.function_id.clone(), state);
        }
    }
    let decisions = outputs::decide_all(&mut states, &batch.functions);
    let mut start = tx.prepare_cached(
        "UPDATE functions SET status = 'backfilling', marker_offset = ?2, updated_at_ms = ?3 WHERE id = ?1",
    )?;
    let mut preimage = tx.prepare_cached(
        "INSERT INTO preimages (function_id, record_id, embedding, metadata, document, last_offset) VALUES (?1, ?2, ?3, ?4, ?5, ?6)
         ON CONFLICT (function_id, record_id) DO NOTHING",
    )?;
    for d in &decisions {
        if let Some(o) = d.accepted_marker {
            start.execute(params![d.function_id, o, now])?;
        }
        if let Some(reason) = d.fail {
            mark_failed(tx, d.function_id, reason, now)?;
        }
        for (id, r) in &d.preimages {
            let emb = r.embedding.as_ref().map(encode_embedding);
            preimage.execute(params![d.function_id, id, emb, encode_metadata(&r.metadata), r.document, r.offset])?;
        }
        if !d.plan.is_empty() {
            apply_plan(
                tx,
                d.function_id,
                &d.output_collection,
                batch.delta.partition,
                &d.plan,
                acct,
                changes.as_deref_mut(),
            )?;
        }
    }
    Ok(outputs::report(&decisions))
}

/// Write a plan into the output collection (semantics: `outputs.rs`). `partition`
/// registers the output collection if its row is missing. What it changes in the value
/// log's counts goes into `acct`; with `changes`, each write that applied is appended to
/// it as a change of the output record (a stale versioned write changes nothing).
fn apply_plan(
    tx: &Connection,
    function_id: &str,
    output: &str,
    partition: i32,
    plan: &OutputPlan,
    acct: &mut Account,
    mut changes: Option<&mut Vec<OutboxChange>>,
) -> Result<()> {
    let mut record_offset =
        tx.prepare_cached("SELECT last_offset FROM records WHERE collection_id = ?1 AND id = ?2")?;
    let mut records = RecordWriter::new(tx)?;
    let mut count_delta = 0i64;
    let mut dimension: Option<u32> = None;
    if !plan.counts.is_empty() {
        let mut add = tx.prepare_cached(
            "INSERT INTO function_counters (function_id, output_id, count) VALUES (?1, ?2, ?3)
             ON CONFLICT (function_id, output_id) DO UPDATE SET count = count + excluded.count
             RETURNING count",
        )?;
        let mut drop_counter =
            tx.prepare_cached("DELETE FROM function_counters WHERE function_id = ?1 AND output_id = ?2")?;
        for c in &plan.counts {
            let count: i64 = add.query_row(params![function_id, c.output_id, c.delta], |r| r.get(0))?;
            let existing: Option<i64> =
                record_offset.query_row(params![output, c.output_id], |r| r.get(0)).optional()?;
            if c.removes_at(count) {
                drop_counter.execute(params![function_id, c.output_id])?;
                if existing.is_some() {
                    records.delete(output, &c.output_id, acct)?;
                    count_delta -= 1;
                    if let Some(out) = changes.as_deref_mut() {
                        out.push(changelog::delete(output, &c.output_id, c.offset));
                    }
                }
            } else {
                let last_offset = existing.map_or(c.offset, |e| e.max(c.offset));
                let meta = c.metadata(count);
                let metadata = encode_metadata(&meta);
                records.put_parts(output, &c.output_id, None, metadata, None, last_offset, acct)?;
                if existing.is_none() {
                    count_delta += 1;
                }
                if let Some(out) = changes.as_deref_mut() {
                    let r = Record {
                        id: c.output_id.clone(),
                        embedding: None,
                        metadata: meta,
                        document: None,
                        offset: last_offset,
                    };
                    out.push(changelog::put(output, &r, existing.is_some()));
                }
            }
        }
    }
    if !plan.maps.is_empty() {
        let mut tombstone =
            tx.prepare_cached("SELECT last_offset FROM tombstones WHERE collection_id = ?1 AND id = ?2")?;
        let mut drop_tombstone = tx.prepare_cached("DELETE FROM tombstones WHERE collection_id = ?1 AND id = ?2")?;
        let mut set_tombstone = tx.prepare_cached(
            "INSERT INTO tombstones (collection_id, id, last_offset) VALUES (?1, ?2, ?3)
             ON CONFLICT (collection_id, id) DO UPDATE SET last_offset = max(last_offset, excluded.last_offset)",
        )?;
        for w in &plan.maps {
            let existing: Option<i64> = record_offset.query_row(params![output, w.id()], |r| r.get(0)).optional()?;
            let tomb: Option<i64> = if plan.versioned {
                tombstone.query_row(params![output, w.id()], |r| r.get(0)).optional()?
            } else {
                None
            };
            if plan.versioned && existing.max(tomb).is_some_and(|v| w.version() <= v) {
                continue; // stale: the output holds something newer
            }
            match w {
                MapWrite::Put(r) => {
                    if tomb.is_some() {
                        drop_tombstone.execute(params![output, r.id])?;
                    }
                    records.put(output, r, acct)?;
                    if existing.is_none() {
                        count_delta += 1;
                    }
                    if let Some(out) = changes.as_deref_mut() {
                        out.push(changelog::put(output, r, existing.is_some()));
                    }
                    if dimension.is_none() {
                        dimension = r.embedding.as_ref().map(|e| e.len() as u32);
                    }
                }
                MapWrite::Remove { id, offset } => {
                    if existing.is_some() {
                        records.delete(output, id, acct)?;
                        count_delta -= 1;
                        if let Some(out) = changes.as_deref_mut() {
                            out.push(changelog::delete(output, id, *offset));
                        }
                    }
                    if plan.versioned {
                        set_tombstone.execute(params![output, id, offset])?;
                    }
                }
            }
        }
    }
    if count_delta != 0 || dimension.is_some() {
        tx.prepare_cached(
            "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms) VALUES (?1, ?2, ?3, -1, ?4, ?5)
             ON CONFLICT (id) DO UPDATE SET
                 dimension = COALESCE(collections.dimension, excluded.dimension),
                 record_count = collections.record_count + excluded.record_count",
        )?
        .execute(params![output, partition, dimension, count_delta, now_ms()])?;
    }
    Ok(())
}

/// The next chunk of the collection as of the marker, in one statement: current records
/// last written before the marker without a preimage, and the function's preimages. The
/// fields the function does not read (`reads`) are selected as NULL, so a chunk of
/// `record_counter` never copies an embedding or a document out of the database, and
/// reads the value log only when the function reads one of them.
fn chunk_sql(after_cursor: bool, reads: Reads) -> String {
    let nulls = ["NULL"; 3];
    let (r_after, p_after) = if after_cursor { (" AND r.id > ?5", " AND p.record_id > ?5") } else { ("", "") };
    let records = if reads.values() { RECORDS_WITH_VALUES } else { "records r" };
    format!(
        "SELECT r.id, {r}, r.last_offset FROM {records}
     WHERE r.collection_id = ?1 AND r.last_offset < ?2{r_after}
       AND NOT EXISTS (SELECT 1 FROM preimages p WHERE p.function_id = ?3 AND p.record_id = r.id)
     UNION ALL
     SELECT p.record_id, {p}, p.last_offset FROM preimages p WHERE p.function_id = ?3{p_after}
     ORDER BY 1 LIMIT ?4",
        r = outputs::chunk_columns(reads, ["v", "r", "v"], nulls),
        p = outputs::chunk_columns(reads, ["p"; 3], nulls),
    )
}

/// Size of the collection as of the marker.
const AS_OF_SIZE: &str = "SELECT
     (SELECT count(*) FROM records r WHERE r.collection_id = ?1 AND r.last_offset < ?2
        AND NOT EXISTS (SELECT 1 FROM preimages p WHERE p.function_id = ?3 AND p.record_id = r.id))
   + (SELECT count(*) FROM preimages WHERE function_id = ?3)";

/// One backfill step in one write transaction. `compute` turns the chunk into its plan
/// (it runs the function, on the async side: see [`SqliteSysdb::backfill_step`]);
/// `None` aborts the step (rolled back).
fn backfill_step_sync(
    conn: &mut Connection,
    w: Writing<'_>,
    function_id: &str,
    expected: Option<&str>,
    limit: ChunkLimit,
    reads: Reads,
    compute: impl FnOnce(Vec<Record>) -> Option<std::result::Result<OutputPlan, FunctionFailure>>,
) -> Result<StepResult> {
    let limit = ChunkLimit { records: limit.records.max(1), bytes: limit.bytes.max(1), ..limit };
    let began = std::time::Instant::now();
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(row) = read_function(&tx, function_id)? else { return Ok(StepResult::NotBackfilling) };
    if row.status != FunctionStatus::Backfilling {
        return Ok(StepResult::NotBackfilling);
    }
    if row.backfill_cursor.as_deref() != expected {
        return Ok(StepResult::CursorMoved { cursor: row.backfill_cursor });
    }
    // The chunk is read from `records`, and the outputs are written there: fold the
    // records delta in first (`values::merge_delta`).
    let mut acct = Account::default();
    w.merge(&tx, true, &mut acct)?;
    let marker = row
        .marker_offset
        .ok_or_else(|| invalid(format!("function {function_id:?} is backfilling without a marker offset")))?;
    let now = now_ms();
    if row.backfill_total.is_none() {
        let total: i64 =
            tx.prepare_cached(AS_OF_SIZE)?.query_row(params![row.collection_id, marker, function_id], |r| r.get(0))?;
        tx.prepare_cached("UPDATE functions SET backfill_total = ?2 WHERE id = ?1")?
            .execute(params![function_id, total])?;
    }
    let limit_sql = i64::try_from(limit.records).unwrap_or(i64::MAX);
    let decoded = |raw: rusqlite::Result<RawRecord>| raw.map_err(Into::into).and_then(decode_raw);
    let (records, cut) = match &row.backfill_cursor {
        None => outputs::read_chunk(
            tx.prepare_cached(&chunk_sql(false, reads))?
                .query_map(params![row.collection_id, marker, function_id, limit_sql], raw_record)?
                .map(decoded),
            limit,
        )?,
        Some(after) => outputs::read_chunk(
            tx.prepare_cached(&chunk_sql(true, reads))?
                .query_map(params![row.collection_id, marker, function_id, limit_sql, after], raw_record)?
                .map(decoded),
            limit,
        )?,
    };
    let processed = records.len();
    let cursor = records.last().map(|r| r.id.clone()).or(row.backfill_cursor);
    let finished = !cut && processed < limit.records;
    let plan = match compute(records) {
        Some(Ok(plan)) => plan,
        Some(Err(failure)) => {
            // The chunk applies nothing; the function is failed from this transaction on.
            w.flush_and_compact(&tx, &mut acct)?;
            mark_failed(&tx, function_id, &failure.reason, now)?;
            tx.commit()?;
            return Ok(StepResult::Failed { failure });
        }
        None => return Err(invalid(format!("backfill step of {function_id:?} abandoned by its caller"))),
    };
    if !plan.is_empty() {
        let partition: Option<i32> = tx
            .prepare_cached("SELECT partition FROM collections WHERE id = ?1")?
            .query_row([&row.collection_id], |r| r.get(0))
            .optional()?;
        // Records exist, so the input collection has a row; 0 is never used in practice.
        let partition = partition.unwrap_or(0);
        let mut changes = limit.changelog.then(Vec::new);
        apply_plan(&tx, function_id, &row.output_collection, partition, &plan, &mut acct, changes.as_mut())?;
        if let Some(changes) = changes {
            super::changelog::begin_in(&tx, partition)?;
            super::changelog::append(&tx, partition, &changes, now)?;
        }
    }
    w.flush_and_compact(&tx, &mut acct)?;
    tx.prepare_cached(
        "UPDATE functions SET backfill_cursor = ?2, backfill_done = backfill_done + ?3, updated_at_ms = ?4,
             status = CASE WHEN ?5 THEN 'ready' ELSE status END
         WHERE id = ?1",
    )?
    .execute(params![function_id, cursor, processed as i64, now, finished])?;
    if finished {
        tx.prepare_cached("DELETE FROM preimages WHERE function_id = ?1")?.execute([function_id])?;
        tx.prepare_cached("DELETE FROM tombstones WHERE collection_id = ?1")?.execute([&row.output_collection])?;
    }
    tx.commit()?;
    Ok(StepResult::Applied { processed, cursor, finished, held: began.elapsed() })
}

impl SqliteSysdb {
    pub async fn attach_function(&self, new: &NewFunction) -> Result<AttachOutcome> {
        let new = new.clone();
        self.write(move |c, w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            // The rules ask whether the output collection holds records: in `records`.
            let mut acct = Account::default();
            w.merge(&tx, true, &mut acct)?;
            w.flush_and_compact(&tx, &mut acct)?;
            match attach_rules::decide(&new, attach_facts(&tx, &new)?) {
                Decision::Answer(outcome) => {
                    tx.commit()?;
                    return Ok(outcome);
                }
                Decision::Insert { reuse_output: true } => {
                    tx.prepare_cached("DELETE FROM tombstones WHERE collection_id = ?1")?.execute([&new.output_collection])?;
                }
                Decision::Insert { reuse_output: false } => {}
            }
            let now = creation_stamp(&tx)?;
            tx.prepare_cached(&format!(
                "INSERT INTO functions ({FUNCTION_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, 'awaiting_marker', ?6, NULL, NULL, 0, NULL, ?7, ?7, NULL)"
            ))?
            .execute(params![new.id, new.collection_id, new.function, new.output_collection, encode_params(&new.params), new.request_id, now])?;
            tx.prepare_cached(
                "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms) VALUES (?1, ?2, NULL, -1, 0, ?3)
                 ON CONFLICT (id) DO NOTHING",
            )?
            .execute(params![new.output_collection, new.partition, now])?;
            let outbox_id: i64 = tx
                .prepare_cached(
                    "INSERT INTO outbox (function_id, collection_id, partition, request_id, created_at_ms, sent_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, NULL) RETURNING id",
                )?
                .query_row(params![new.id, new.collection_id, new.partition, new.request_id, now], |r| r.get(0))?;
            let row = read_function(&tx, &new.id)?.ok_or_else(|| invalid(format!("function {:?} vanished after insert", new.id)))?;
            tx.commit()?;
            let outbox = OutboxRow {
                id: outbox_id,
                function_id: new.id,
                collection_id: new.collection_id,
                partition: new.partition,
                request_id: new.request_id,
                created_at_ms: now,
                published_offset: None,
            };
            Ok(AttachOutcome::Created(row, outbox))
        })
        .await
    }

    pub async fn functions(&self, collection: Option<&str>) -> Result<Vec<FunctionRow>> {
        let collection = collection.map(str::to_string);
        self.read(move |c| {
            let raws = match &collection {
                Some(coll) => c
                    .prepare_cached(&format!(
                        "SELECT {FUNCTION_COLUMNS} FROM functions WHERE collection_id = ?1 ORDER BY created_at_ms, id"
                    ))?
                    .query_map([coll], raw_function)?
                    .collect::<rusqlite::Result<Vec<_>>>()?,
                None => c
                    .prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions ORDER BY created_at_ms, id"))?
                    .query_map([], raw_function)?
                    .collect::<rusqlite::Result<Vec<_>>>()?,
            };
            raws.into_iter().map(|r| r.decode(BACKEND)).collect()
        })
        .await
    }

    pub async fn function(&self, id: &str) -> Result<Option<FunctionRow>> {
        let id = id.to_string();
        self.read(move |c| read_function(c, &id)).await
    }

    pub async fn detach_function(&self, id: &str, drop_output: bool, feed: bool) -> Result<Option<FunctionRow>> {
        let id = id.to_string();
        self.write(move |c, w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let Some(row) = read_function(&tx, &id)? else { return Ok(None) };
            tx.execute("UPDATE functions SET status = 'detached', updated_at_ms = ?2 WHERE id = ?1", params![id, now_ms()])?;
            tx.execute("DELETE FROM preimages WHERE function_id = ?1", [&id])?;
            if drop_output {
                let out = &row.output_collection;
                tx.execute("DELETE FROM function_counters WHERE function_id = ?1", [&id])?;
                // Never drop an output that a live function (attached again since) writes.
                let live: i64 = tx.query_row(
                    "SELECT count(*) FROM functions WHERE output_collection = ?1 AND id <> ?2 AND status <> 'detached'",
                    params![out, id],
                    |r| r.get(0),
                )?;
                if live == 0 {
                    let mut acct = Account::default();
                    w.merge(&tx, true, &mut acct)?;
                    if feed {
                        let partition: Option<i32> = tx
                            .prepare_cached("SELECT partition FROM collections WHERE id = ?1")?
                            .query_row([out], |r| r.get(0))
                            .optional()?;
                        if let Some(partition) = partition {
                            let ids = tx
                                .prepare_cached("SELECT id FROM records WHERE collection_id = ?1 ORDER BY id")?
                                .query_map([out], |r| r.get::<_, String>(0))?
                                .collect::<rusqlite::Result<Vec<_>>>()?;
                            let changes = changelog::dropped(out, ids);
                            super::changelog::begin_in(&tx, partition)?;
                            super::changelog::append(&tx, partition, &changes, now_ms())?;
                        }
                    }
                    values::delete_collection(&tx, out, &mut acct)?;
                    w.flush_and_compact(&tx, &mut acct)?;
                    tx.execute("DELETE FROM tombstones WHERE collection_id = ?1", [out])?;
                    tx.execute("DELETE FROM collections WHERE id = ?1", [out])?;
                } else {
                    tracing::warn!(function = %id, output = %out, "detach: output kept, another attached function writes it");
                }
            }
            tx.commit()?;
            Ok(Some(row))
        })
        .await
    }

    pub async fn outbox_pending(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT id, function_id, collection_id, partition, request_id, created_at_ms, published_offset FROM outbox
                 WHERE sent_at_ms IS NULL ORDER BY id LIMIT ?1",
            )?;
            let rows = stmt.query_map([limit], outbox_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn put_component(&self, sha256: &str, bytes: Vec<u8>, world_version: &str) -> Result<bool> {
        let (sha256, world_version) = (sha256.to_string(), world_version.to_string());
        self.write(move |c, _w| {
            let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
            let n = c
                .prepare_cached(
                    "INSERT INTO function_components (sha256, bytes, size, world_version, created_at_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT (sha256) DO NOTHING",
                )?
                .execute(params![sha256, bytes, size, world_version, now_ms()])?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn component(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        let sha256 = sha256.to_string();
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT bytes FROM function_components WHERE sha256 = ?1")?
                .query_row([&sha256], |r| r.get(0))
                .optional()?)
        })
        .await
    }

    pub async fn mark_function_failed(&self, id: &str, reason: &str) -> Result<bool> {
        let (id, reason) = (id.to_string(), reason.to_string());
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let live: bool = tx
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM functions WHERE id = ?1 AND status <> 'detached' AND failed_reason IS NULL)",
                )?
                .query_row([&id], |r| r.get(0))?;
            if live {
                mark_failed(&tx, &id, &reason, now_ms())?;
            }
            tx.commit()?;
            Ok(live)
        })
        .await
    }

    pub async fn mark_outbox_sent(&self, id: i64, published_offset: Option<i64>) -> Result<()> {
        self.write(move |c, _w| {
            c.prepare_cached(
                "UPDATE outbox SET sent_at_ms = ?2, published_offset = ?3 WHERE id = ?1 AND sent_at_ms IS NULL",
            )?
            .execute(params![id, now_ms(), published_offset])?;
            Ok(())
        })
        .await
    }

    pub async fn lost_markers(&self, topic: &str, limit: usize) -> Result<Vec<OutboxRow>> {
        let (topic, limit) = (topic.to_string(), i64::try_from(limit).unwrap_or(i64::MAX));
        self.read(move |c| {
            let mut stmt = c.prepare_cached(LOST_MARKERS)?;
            let rows = stmt.query_map(params![topic, limit], outbox_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            Ok(rows)
        })
        .await
    }

    pub async fn mark_marker_republished(&self, id: i64, published_offset: i64) -> Result<()> {
        self.write(move |c, _w| {
            c.prepare_cached("UPDATE outbox SET sent_at_ms = ?2, published_offset = ?3 WHERE id = ?1")?
                .execute(params![id, now_ms(), published_offset])?;
            Ok(())
        })
        .await
    }

    pub async fn oldest_awaiting_marker_ms(&self) -> Result<Option<i64>> {
        self.read(|c| {
            Ok(c.prepare_cached(
                "SELECT MIN(created_at_ms) FROM functions WHERE status = 'awaiting_marker' AND failed_reason IS NULL",
            )?
            .query_row([], |r| r.get(0))?)
        })
        .await
    }

    /// The transaction runs on the blocking pool, but `f` is borrowed (not `'static`):
    /// the blocking side reads the chunk and hands the records over a channel, this
    /// (async) side runs `f` and hands the plan back, and the blocking side applies it
    /// and commits — all in one transaction.
    pub async fn backfill_step(
        &self,
        function_id: &str,
        expected_cursor: Option<&str>,
        limit: ChunkLimit,
        f: &dyn Function,
    ) -> Result<StepResult> {
        let (function_id, expected) = (function_id.to_string(), expected_cursor.map(str::to_string));
        let (records_tx, records_rx) = tokio::sync::oneshot::channel::<Vec<Record>>();
        let (plan_tx, plan_rx) = tokio::sync::oneshot::channel::<std::result::Result<OutputPlan, FunctionFailure>>();
        let reads = f.reads();
        let step = self.write(move |c, w| {
            backfill_step_sync(c, w, &function_id, expected.as_deref(), limit, reads, move |records| {
                records_tx.send(records).ok()?;
                plan_rx.blocking_recv().ok()
            })
        });
        let compute = async move {
            if let Ok(records) = records_rx.await {
                let _ = plan_tx.send(outputs::backfill_plan(&records, f));
            }
        };
        let (result, ()) = tokio::join!(step, compute);
        result
    }

    pub async fn preimage_count(&self, function_id: &str) -> Result<i64> {
        let function_id = function_id.to_string();
        self.read(move |c| {
            Ok(c.query_row("SELECT count(*) FROM preimages WHERE function_id = ?1", [&function_id], |r| r.get(0))?)
        })
        .await
    }
}
