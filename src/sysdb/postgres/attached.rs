//! Attached functions on PostgreSQL (docs/design.md section 7; the rules are in `outputs.rs`,
//! shared with SQLite).
//!
//! **Locking.** The function row is the lock that orders a batch commit against a
//! backfill step of the same function (`READ COMMITTED` throughout):
//! * `commit_batch` reads its functions with `SELECT … ORDER BY id FOR SHARE` right after
//!   the partition CAS (the partition lock already orders batches among themselves;
//!   sorted ids keep the lock order fixed);
//! * `backfill_step` starts with `SELECT … FOR UPDATE` on its function;
//! * `detach_function` takes the row with `FOR UPDATE` too.
//!
//! So a step never runs between a batch's status read and its commit, and a batch that
//! waited for a step (or a detach) reads the status that step left (READ COMMITTED
//! re-reads the latest committed row version after the wait). Every other statement
//! comes after the function lock in both paths, so the two cannot deadlock.
//!
//! **One snapshot per chunk.** The chunk is one statement: current rows and preimages in
//! a `UNION ALL` of two index-ordered, individually limited branches, merged by id
//! (`COLLATE "C"`, byte order, the same as SQLite and Rust).
//!
//! **Round trips.** A plan is applied with a few `UNNEST` statements whatever its size:
//! counters (one upsert `RETURNING` the new counts), count records (one upsert), zeros
//! (one delete), map puts (one statement, version and tombstone checks inside), map
//! removes (one statement), then the output collection row. Preimages of the whole batch
//! are one insert. Record-count deltas come from comparing what a statement wrote with
//! the statement's own snapshot (a data-modifying CTE's siblings see the table as it was
//! before the statement).

use std::collections::{HashMap, HashSet};

use deadpool_postgres::Transaction;
use tokio_postgres::Row;

use super::records::decode_row;
use super::{invalid, PostgresSysdb, TxError, BACKEND};
use crate::functions::{Function, FunctionStatus, Reads};
use crate::record::Record;
use crate::sysdb::attach_rules::{self, AttachFacts, AttachOutcome, Decision};
use crate::sysdb::changelog;
use crate::sysdb::error::{Result, SysdbError};
use crate::sysdb::outputs::{self, FunctionState, MapWrite, OutputPlan, RawFunction, FUNCTION_COLUMNS};
use crate::sysdb::stored_fields::{encode_embedding, encode_metadata, encode_params};
use crate::sysdb::types::{
    now_ms, BatchCommit, ChunkLimit, CommitReport, FunctionRow, NewFunction, OutboxChange, OutboxRow, StepResult,
};

fn raw_function(r: &Row) -> RawFunction {
    RawFunction {
        id: r.get(0),
        collection_id: r.get(1),
        function: r.get(2),
        output_collection: r.get(3),
        params: r.get(4),
        status: r.get(5),
        request_id: r.get(6),
        marker_offset: r.get(7),
        backfill_cursor: r.get(8),
        backfill_done: r.get(9),
        backfill_total: r.get(10),
        created_at_ms: r.get(11),
        updated_at_ms: r.get(12),
        failed_reason: r.get(13),
    }
}

fn outbox_row(r: &Row) -> OutboxRow {
    OutboxRow {
        id: r.get(0),
        function_id: r.get(1),
        collection_id: r.get(2),
        partition: r.get(3),
        request_id: r.get(4),
        created_at_ms: r.get(5),
        published_offset: r.get(6),
    }
}

/// Key of the advisory lock that serializes attaches (any value, fixed): the attach rules
/// read several rows (writers and readers of both collections), which a unique index
/// alone cannot guard against two attaches racing on READ COMMITTED.
const ATTACH_LOCK_KEY: i64 = 0x5c1c_e0a7_7ac4;

/// Sent markers of functions still waiting for them, whose partition moved past them.
const LOST_MARKERS: &str =
    "SELECT o.id, o.function_id, o.collection_id, o.partition, o.request_id, o.created_at_ms, o.published_offset
     FROM functions f
     JOIN outbox o ON o.function_id = f.id AND o.request_id = f.request_id
     JOIN partitions p ON p.topic = $1 AND p.partition = o.partition
     WHERE f.status = 'awaiting_marker' AND f.failed_reason IS NULL AND o.sent_at_ms IS NOT NULL AND o.published_offset IS NOT NULL
       AND p.next_offset > o.published_offset
     ORDER BY o.id LIMIT $2";

const LOCK_FUNCTIONS: &str =
    "SELECT id, status, request_id, marker_offset, output_collection, failed_reason FROM functions WHERE id = ANY($1::text[]) ORDER BY id FOR SHARE";
/// Marks a function failed in the batch (or backfill) transaction that found it failing;
/// its preimages are of no more use.
const MARK_FAILED: &str =
    "UPDATE functions SET failed_reason = $2, failed_at_ms = $3, updated_at_ms = $3 WHERE id = $1 AND status <> 'detached'";
const DROP_PREIMAGES: &str = "DELETE FROM preimages WHERE function_id = $1";
const START_BACKFILL: &str =
    "UPDATE functions SET status = 'backfilling', marker_offset = $2, updated_at_ms = $3 WHERE id = $1";
const INSERT_PREIMAGES: &str =
    "INSERT INTO preimages (function_id, record_id, embedding, metadata, document, last_offset)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::int8[])
     ON CONFLICT (function_id, record_id) DO NOTHING";
const ADD_COUNTERS: &str = "INSERT INTO function_counters AS fc (function_id, output_id, count)
     SELECT $1, u.output_id, u.delta FROM UNNEST($2::text[], $3::int8[]) AS u(output_id, delta)
     ON CONFLICT (function_id, output_id) DO UPDATE SET count = fc.count + EXCLUDED.count
     RETURNING fc.output_id, fc.count";
/// Upsert count records; returns each id, its stored `last_offset` and whether it existed
/// before (the sibling subquery sees the table as it was before the statement).
const UPSERT_COUNT_RECORDS: &str = "WITH up AS (
         INSERT INTO records AS r (collection_id, id, embedding, metadata, document, last_offset)
         SELECT $1, u.id, NULL, u.metadata, NULL, u.last_offset FROM UNNEST($2::text[], $3::text[], $4::int8[]) AS u(id, metadata, last_offset)
         ON CONFLICT (collection_id, id) DO UPDATE SET
             embedding = NULL, metadata = EXCLUDED.metadata, document = NULL,
             last_offset = GREATEST(r.last_offset, EXCLUDED.last_offset)
         RETURNING r.id, r.last_offset
     )
     SELECT up.id, up.last_offset, EXISTS (SELECT 1 FROM records x WHERE x.collection_id = $1 AND x.id = up.id) FROM up";
/// Counters at zero that remove their record; returns the ids of the records that went.
const DROP_ZERO_COUNTS: &str = "WITH c AS (
         DELETE FROM function_counters WHERE function_id = $1 AND output_id = ANY($3::text[]) AND count = 0
     ), d AS (
         DELETE FROM records WHERE collection_id = $2 AND id = ANY($3::text[]) RETURNING id
     )
     SELECT id FROM d";
/// Map puts (`$7` = versioned: only if newer than the stored record and the id's
/// tombstone, which an applied put clears). Returns each applied id and whether it
/// existed before.
const PUT_MAPS: &str = "WITH u AS (
         SELECT * FROM UNNEST($2::text[], $3::bytea[], $4::text[], $5::text[], $6::int8[]) AS u(id, embedding, metadata, document, last_offset)
     ), ok AS (
         SELECT u.* FROM u
         WHERE NOT $7::bool
            OR NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.collection_id = $1 AND t.id = u.id AND t.last_offset >= u.last_offset)
     ), up AS (
         INSERT INTO records AS r (collection_id, id, embedding, metadata, document, last_offset)
         SELECT $1, ok.id, ok.embedding, ok.metadata, ok.document, ok.last_offset FROM ok
         ON CONFLICT (collection_id, id) DO UPDATE SET
             embedding = EXCLUDED.embedding, metadata = EXCLUDED.metadata,
             document = EXCLUDED.document, last_offset = EXCLUDED.last_offset
         WHERE NOT $7::bool OR r.last_offset < EXCLUDED.last_offset
         RETURNING r.id
     ), cleared AS (
         DELETE FROM tombstones t USING up WHERE $7::bool AND t.collection_id = $1 AND t.id = up.id
     )
     SELECT up.id, EXISTS (SELECT 1 FROM records x WHERE x.collection_id = $1 AND x.id = up.id) FROM up";
/// Map removes (`$4` = versioned: only if newer than the stored record and tombstone,
/// leaving a tombstone). Returns the ids of the records that went.
const REMOVE_MAPS: &str = "WITH u AS (
         SELECT * FROM UNNEST($2::text[], $3::int8[]) AS u(id, last_offset)
     ), ok AS (
         SELECT u.* FROM u
         WHERE NOT $4::bool OR (
                 NOT EXISTS (SELECT 1 FROM records r WHERE r.collection_id = $1 AND r.id = u.id AND r.last_offset >= u.last_offset)
             AND NOT EXISTS (SELECT 1 FROM tombstones t WHERE t.collection_id = $1 AND t.id = u.id AND t.last_offset >= u.last_offset))
     ), del AS (
         DELETE FROM records r USING ok WHERE r.collection_id = $1 AND r.id = ok.id RETURNING r.id
     ), tomb AS (
         INSERT INTO tombstones AS t (collection_id, id, last_offset)
         SELECT $1, ok.id, ok.last_offset FROM ok WHERE $4::bool
         ON CONFLICT (collection_id, id) DO UPDATE SET last_offset = GREATEST(t.last_offset, EXCLUDED.last_offset)
     )
     SELECT id FROM del";
const UPSERT_OUTPUT_COLLECTION: &str =
    "INSERT INTO collections AS c (id, partition, dimension, log_position, record_count, created_at_ms)
     VALUES ($1, $2, $3, -1, $4, $5)
     ON CONFLICT (id) DO UPDATE SET
         dimension = COALESCE(c.dimension, EXCLUDED.dimension),
         record_count = c.record_count + EXCLUDED.record_count";

/// Lock (`FOR SHARE`) and read the batch's functions. Called right after the CAS.
pub(super) async fn lock_functions(
    tx: &Transaction<'_>,
    batch: &BatchCommit,
) -> Result<HashMap<String, Option<FunctionState>>, TxError> {
    let mut states: HashMap<String, Option<FunctionState>> =
        batch.functions.iter().map(|f| (f.function_id.clone(), None)).collect();
    if states.is_empty() {
        return Ok(states);
    }
    let ids: Vec<&str> = states.keys().map(String::as_str).collect();
    let rows = tx.query(&tx.prepare_cached(LOCK_FUNCTIONS).await?, &[&ids]).await?;
    for r in rows {
        let id: String = r.get(0);
        let status: String = r.get(1);
        let status = FunctionStatus::parse(&status)
            .ok_or_else(|| invalid(format!("function {id:?}: unknown status {status:?}")))?;
        let failed_reason: Option<String> = r.get(5);
        let status = outputs::effective_status(status, failed_reason.as_deref());
        let state =
            FunctionState { status, request_id: r.get(2), marker_offset: r.get(3), output_collection: r.get(4) };
        states.insert(id, Some(state));
    }
    Ok(states)
}

/// The function batches of a commit, inside its transaction (after the record writes):
/// status transitions, preimages, output writes.
pub(super) async fn commit_functions(
    tx: &Transaction<'_>,
    batch: &BatchCommit,
    mut states: HashMap<String, Option<FunctionState>>,
    now: i64,
    mut changes: Option<&mut Vec<OutboxChange>>,
) -> Result<CommitReport, TxError> {
    if batch.functions.is_empty() {
        return Ok(CommitReport::default());
    }
    let decisions = outputs::decide_all(&mut states, &batch.functions);
    for d in decisions.iter().filter(|d| d.accepted_marker.is_some()) {
        tx.execute(&tx.prepare_cached(START_BACKFILL).await?, &[&d.function_id, &d.accepted_marker, &now]).await?;
    }
    for d in &decisions {
        if let Some(reason) = d.fail {
            tx.execute(&tx.prepare_cached(MARK_FAILED).await?, &[&d.function_id, &reason, &now]).await?;
            tx.execute(&tx.prepare_cached(DROP_PREIMAGES).await?, &[&d.function_id]).await?;
        }
    }
    let mut pre = (
        Vec::<&str>::new(),
        Vec::<&str>::new(),
        Vec::<Option<&[u8]>>::new(),
        Vec::<Option<String>>::new(),
        Vec::<Option<&str>>::new(),
        Vec::<i64>::new(),
    );
    let mut seen = HashSet::new();
    for d in &decisions {
        for (id, r) in &d.preimages {
            if seen.insert((d.function_id, *id)) {
                pre.0.push(d.function_id);
                pre.1.push(id);
                pre.2.push(r.embedding.as_ref().map(encode_embedding));
                pre.3.push(encode_metadata(&r.metadata));
                pre.4.push(r.document.as_deref());
                pre.5.push(r.offset);
            }
        }
    }
    if !pre.0.is_empty() {
        tx.execute(&tx.prepare_cached(INSERT_PREIMAGES).await?, &[&pre.0, &pre.1, &pre.2, &pre.3, &pre.4, &pre.5])
            .await?;
    }
    for d in decisions.iter().filter(|d| !d.plan.is_empty()) {
        apply_plan(tx, d.function_id, &d.output_collection, batch.delta.partition, &d.plan, changes.as_deref_mut())
            .await?;
    }
    Ok(outputs::report(&decisions))
}

/// Write a plan into the output collection (semantics: `outputs.rs`). `partition`
/// registers the output collection if its row is missing. With `changes`, each write that
/// applied is appended to it as a change of the output record.
async fn apply_plan(
    tx: &Transaction<'_>,
    function_id: &str,
    output: &str,
    partition: i32,
    plan: &OutputPlan,
    mut changes: Option<&mut Vec<OutboxChange>>,
) -> Result<(), TxError> {
    let mut count_delta = 0i64;
    let mut dimension: Option<i32> = None;
    if !plan.counts.is_empty() {
        let ids: Vec<&str> = plan.counts.iter().map(|c| c.output_id.as_str()).collect();
        let deltas: Vec<i64> = plan.counts.iter().map(|c| c.delta).collect();
        let rows = tx.query(&tx.prepare_cached(ADD_COUNTERS).await?, &[&function_id, &ids, &deltas]).await?;
        let counts: HashMap<String, i64> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        let (mut up_ids, mut up_meta, mut up_offsets, mut zeros) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut up_values = HashMap::new();
        let mut zero_offsets = HashMap::new();
        for c in &plan.counts {
            let count = *counts
                .get(&c.output_id)
                .ok_or_else(|| invalid(format!("counter {:?} not returned by its upsert", c.output_id)))?;
            if c.removes_at(count) {
                zeros.push(c.output_id.as_str());
                zero_offsets.insert(c.output_id.as_str(), c.offset);
            } else {
                let meta = c.metadata(count);
                up_ids.push(c.output_id.as_str());
                up_meta.push(encode_metadata(&meta));
                up_offsets.push(c.offset);
                up_values.insert(c.output_id.as_str(), meta);
            }
        }
        if !up_ids.is_empty() {
            let rows = tx
                .query(&tx.prepare_cached(UPSERT_COUNT_RECORDS).await?, &[&output, &up_ids, &up_meta, &up_offsets])
                .await?;
            for r in &rows {
                let (id, last_offset, existed): (String, i64, bool) = (r.get(0), r.get(1), r.get(2));
                if !existed {
                    count_delta += 1;
                }
                if let Some(out) = changes.as_deref_mut() {
                    let metadata = up_values.get(id.as_str()).cloned().unwrap_or_default();
                    let rec = Record { id, embedding: None, metadata, document: None, offset: last_offset };
                    out.push(changelog::put(output, &rec, existed));
                }
            }
        }
        if !zeros.is_empty() {
            let rows = tx.query(&tx.prepare_cached(DROP_ZERO_COUNTS).await?, &[&function_id, &output, &zeros]).await?;
            count_delta -= rows.len() as i64;
            if let Some(out) = changes.as_deref_mut() {
                for r in &rows {
                    let id: &str = r.get(0);
                    out.push(changelog::delete(output, id, zero_offsets.get(id).copied().unwrap_or(-1)));
                }
            }
        }
    }
    let puts: Vec<&Record> =
        plan.maps.iter().filter_map(|w| if let MapWrite::Put(r) = w { Some(r) } else { None }).collect();
    if !puts.is_empty() {
        let ids: Vec<&str> = puts.iter().map(|r| r.id.as_str()).collect();
        let embeddings: Vec<Option<&[u8]>> = puts.iter().map(|r| r.embedding.as_ref().map(encode_embedding)).collect();
        let metadata: Vec<Option<String>> = puts.iter().map(|r| encode_metadata(&r.metadata)).collect();
        let documents: Vec<Option<&str>> = puts.iter().map(|r| r.document.as_deref()).collect();
        let offsets: Vec<i64> = puts.iter().map(|r| r.offset).collect();
        let rows = tx
            .query(
                &tx.prepare_cached(PUT_MAPS).await?,
                &[&output, &ids, &embeddings, &metadata, &documents, &offsets, &plan.versioned],
            )
            .await?;
        let mut applied = HashSet::with_capacity(rows.len());
        let mut existed_before = HashMap::with_capacity(rows.len());
        for r in &rows {
            let id: String = r.get(0);
            let existed: bool = r.get(1);
            if !existed {
                count_delta += 1;
            }
            existed_before.insert(id.clone(), existed);
            applied.insert(id);
        }
        if let Some(out) = changes.as_deref_mut() {
            // In plan order, as SQLite appends them.
            for r in puts.iter().filter(|r| applied.contains(&r.id)) {
                out.push(changelog::put(output, r, existed_before.get(&r.id).copied().unwrap_or(false)));
            }
        }
        // The first applied put (in plan order) with an embedding fixes a new dimension.
        if let Some(e) = puts.iter().filter(|r| applied.contains(&r.id)).find_map(|r| r.embedding.as_ref()) {
            dimension = Some(
                i32::try_from(e.len()).map_err(|_| invalid(format!("output embedding of {} dimensions", e.len())))?,
            );
        }
    }
    let removes: Vec<(&str, i64)> = plan
        .maps
        .iter()
        .filter_map(|w| if let MapWrite::Remove { id, offset } = w { Some((id.as_str(), *offset)) } else { None })
        .collect();
    if !removes.is_empty() {
        let ids: Vec<&str> = removes.iter().map(|r| r.0).collect();
        let offsets: Vec<i64> = removes.iter().map(|r| r.1).collect();
        let rows =
            tx.query(&tx.prepare_cached(REMOVE_MAPS).await?, &[&output, &ids, &offsets, &plan.versioned]).await?;
        count_delta -= rows.len() as i64;
        if let Some(out) = changes {
            let gone: HashSet<&str> = rows.iter().map(|r| r.get::<_, &str>(0)).collect();
            for (id, offset) in removes.iter().filter(|(id, _)| gone.contains(id)) {
                out.push(changelog::delete(output, id, *offset));
            }
        }
    }
    if count_delta != 0 || dimension.is_some() {
        tx.execute(
            &tx.prepare_cached(UPSERT_OUTPUT_COLLECTION).await?,
            &[&output, &partition, &dimension, &count_delta, &now_ms()],
        )
        .await?;
    }
    Ok(())
}

/// The chunk, one statement: each branch walks its primary key in id order from the
/// cursor and stops at `$4` rows; the merge keeps the first `$4` ids overall. The fields
/// the function does not read (`reads`) are selected as typed NULLs, so a chunk of
/// `record_counter` never ships an embedding or a document.
fn chunk_sql(after_cursor: bool, reads: Reads) -> String {
    let cols = |alias: &str| outputs::chunk_columns(reads, [alias; 3], ["NULL::bytea", "NULL::text", "NULL::text"]);
    let (r_after, p_after) =
        if after_cursor { (" AND r.id COLLATE \"C\" > $5", " AND p.record_id COLLATE \"C\" > $5") } else { ("", "") };
    format!(
        "(SELECT r.id, {r}, r.last_offset FROM records r
         WHERE r.collection_id = $1 AND r.last_offset < $2{r_after}
           AND NOT EXISTS (SELECT 1 FROM preimages p WHERE p.function_id = $3 AND p.record_id = r.id)
         ORDER BY r.id COLLATE \"C\" LIMIT $4)
     UNION ALL
     (SELECT p.record_id, {p}, p.last_offset FROM preimages p
         WHERE p.function_id = $3{p_after}
         ORDER BY p.record_id COLLATE \"C\" LIMIT $4)
     ORDER BY 1 LIMIT $4",
        r = cols("r"),
        p = cols("p"),
    )
}
const AS_OF_SIZE: &str = "SELECT
     (SELECT count(*) FROM records r WHERE r.collection_id = $1 AND r.last_offset < $2
        AND NOT EXISTS (SELECT 1 FROM preimages p WHERE p.function_id = $3 AND p.record_id = r.id))
   + (SELECT count(*) FROM preimages WHERE function_id = $3)";

async fn backfill_once(
    client: &mut deadpool_postgres::Object,
    function_id: &str,
    expected: Option<&str>,
    limit: ChunkLimit,
    f: &dyn Function,
) -> Result<StepResult, TxError> {
    let limit = ChunkLimit { records: limit.records.max(1), bytes: limit.bytes.max(1), ..limit };
    let began = std::time::Instant::now();
    let tx = client.transaction().await?;
    let stmt = tx
        .prepare_cached(&format!(
            "SELECT {FUNCTION_COLUMNS}, (SELECT c.partition FROM collections c WHERE c.id = functions.collection_id) FROM functions WHERE id = $1 FOR UPDATE"
        ))
        .await?;
    let Some(r) = tx.query_opt(&stmt, &[&function_id]).await? else {
        tx.rollback().await?;
        return Ok(StepResult::NotBackfilling);
    };
    let partition: Option<i32> = r.get(14);
    let row = raw_function(&r).decode(BACKEND)?;
    if row.status != FunctionStatus::Backfilling {
        tx.rollback().await?;
        return Ok(StepResult::NotBackfilling);
    }
    if row.backfill_cursor.as_deref() != expected {
        tx.rollback().await?;
        return Ok(StepResult::CursorMoved { cursor: row.backfill_cursor });
    }
    let marker = row
        .marker_offset
        .ok_or_else(|| invalid(format!("function {function_id:?} is backfilling without a marker offset")))?;
    if row.backfill_total.is_none() {
        let total: i64 = tx
            .query_one(&tx.prepare_cached(AS_OF_SIZE).await?, &[&row.collection_id, &marker, &function_id])
            .await?
            .get(0);
        tx.execute("UPDATE functions SET backfill_total = $2 WHERE id = $1", &[&function_id, &total]).await?;
    }
    let limit_sql = i64::try_from(limit.records).unwrap_or(i64::MAX);
    let reads = f.reads();
    let (records, cut) = {
        let stmt = tx.prepare_cached(&chunk_sql(row.backfill_cursor.is_some(), reads)).await?;
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&row.collection_id, &marker, &function_id, &limit_sql];
        if let Some(after) = &row.backfill_cursor {
            params.push(after);
        }
        // Streamed, so that a chunk cut by its byte bound never holds the rest in memory.
        let stream = tx.query_raw(&stmt, params).await?;
        futures_util::pin_mut!(stream);
        let mut records = Vec::new();
        let mut bytes = 0usize;
        let mut cut = false;
        while let Some(r) = futures_util::StreamExt::next(&mut stream).await {
            if bytes >= limit.bytes {
                cut = true;
                break;
            }
            let record = decode_row(&r?)?;
            bytes = bytes.saturating_add(outputs::chunk_bytes(&record));
            records.push(record);
        }
        (records, cut)
    };
    let plan = match outputs::backfill_plan(&records, f) {
        Ok(plan) => plan,
        Err(failure) => {
            // The chunk applies nothing; the function is failed from this transaction on.
            let now = now_ms();
            tx.execute(&tx.prepare_cached(MARK_FAILED).await?, &[&function_id, &failure.reason, &now]).await?;
            tx.execute(&tx.prepare_cached(DROP_PREIMAGES).await?, &[&function_id]).await?;
            tx.commit().await?;
            return Ok(StepResult::Failed { failure });
        }
    };
    if !plan.is_empty() {
        // Records exist, so the input collection has a row; 0 is never used in practice.
        let partition = partition.unwrap_or(0);
        let mut changes = limit.changelog.then(Vec::new);
        apply_plan(&tx, function_id, &row.output_collection, partition, &plan, changes.as_mut()).await?;
        if let Some(changes) = &changes {
            super::changelog::begin_in(&tx, partition).await?;
            super::changelog::append(&tx, partition, changes.iter()).await?;
        }
    }
    let processed = records.len();
    let cursor = records.last().map(|r| r.id.clone()).or(row.backfill_cursor);
    let finished = !cut && processed < limit.records;
    tx.execute(
        &tx.prepare_cached(
            "UPDATE functions SET backfill_cursor = $2, backfill_done = backfill_done + $3, updated_at_ms = $4,
                 status = CASE WHEN $5 THEN 'ready' ELSE status END
             WHERE id = $1",
        )
        .await?,
        &[&function_id, &cursor, &(processed as i64), &now_ms(), &finished],
    )
    .await?;
    if finished {
        tx.execute("DELETE FROM preimages WHERE function_id = $1", &[&function_id]).await?;
        tx.execute("DELETE FROM tombstones WHERE collection_id = $1", &[&row.output_collection]).await?;
    }
    tx.commit().await?;
    Ok(StepResult::Applied { processed, cursor, finished, held: began.elapsed() })
}

/// A live function (not detached) found by `sql` with one text parameter.
async fn live_function(tx: &Transaction<'_>, sql: &str, key: &str) -> Result<Option<FunctionRow>, TxError> {
    let row = tx
        .query_opt(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE {sql} AND status <> 'detached' ORDER BY created_at_ms DESC, id LIMIT 1"), &[&key])
        .await?;
    Ok(row.map(|r| raw_function(&r).decode(BACKEND)).transpose()?)
}

/// What the attach rules decide from (`sysdb/attach_rules.rs`), read inside the attach
/// transaction, under the attach lock.
async fn attach_facts(tx: &Transaction<'_>, new: &NewFunction) -> Result<AttachFacts, TxError> {
    let exists = |sql: &'static str| async move {
        let found: bool = tx.query_one(sql, &[&new.output_collection]).await?.get(0);
        Ok::<_, TxError>(found)
    };
    Ok(AttachFacts {
        output_writer: live_function(tx, "output_collection = $1", &new.output_collection).await?,
        input_written_by: live_function(tx, "output_collection = $1", &new.collection_id).await?,
        output_read_by: live_function(tx, "collection_id = $1", &new.output_collection).await?,
        output_exists: exists("SELECT EXISTS (SELECT 1 FROM collections WHERE id = $1)").await?,
        output_last_writer: tx
            .query_opt(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE output_collection = $1 ORDER BY created_at_ms DESC, id LIMIT 1"), &[&new.output_collection])
            .await?
            .map(|r| raw_function(&r).decode(BACKEND))
            .transpose()?,
        output_has_records: exists("SELECT EXISTS (SELECT 1 FROM records WHERE collection_id = $1)").await?,
    })
}

/// Insert the function unless the attach rules say otherwise; `None` when the insert met
/// a conflicting row that the rules did not see (retry).
async fn attach_once(tx: &Transaction<'_>, new: &NewFunction, now: i64) -> Result<Option<AttachOutcome>, TxError> {
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&ATTACH_LOCK_KEY]).await?;
    match attach_rules::decide(new, attach_facts(tx, new).await?) {
        Decision::Answer(outcome) => return Ok(Some(outcome)),
        Decision::Insert { reuse_output: true } => {
            tx.execute("DELETE FROM tombstones WHERE collection_id = $1", &[&new.output_collection]).await?;
        }
        Decision::Insert { reuse_output: false } => {}
    }
    let inserted = tx
        .query_opt(
            &format!(
                "INSERT INTO functions ({FUNCTION_COLUMNS})
                 SELECT $1, $2, $3, $4, $5, 'awaiting_marker', $6, NULL, NULL, 0, NULL, s.at, s.at, NULL
                 FROM (SELECT GREATEST($7::int8, COALESCE(MAX(created_at_ms) + 1, $7::int8)) AS at FROM functions) s
                 ON CONFLICT DO NOTHING
                 RETURNING {FUNCTION_COLUMNS}"
            ),
            &[
                &new.id,
                &new.collection_id,
                &new.function,
                &new.output_collection,
                &encode_params(&new.params),
                &new.request_id,
                &now,
            ],
        )
        .await?;
    let Some(inserted) = inserted else { return Ok(None) };
    let row = raw_function(&inserted).decode(BACKEND)?;
    tx.execute(
        "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms) VALUES ($1, $2, NULL, -1, 0, $3)
         ON CONFLICT (id) DO NOTHING",
        &[&new.output_collection, &new.partition, &now],
    )
    .await?;
    let outbox_id: i64 = tx
        .query_one(
            "INSERT INTO outbox (function_id, collection_id, partition, request_id, created_at_ms, sent_at_ms)
             VALUES ($1, $2, $3, $4, $5, NULL) RETURNING id",
            &[&new.id, &new.collection_id, &new.partition, &new.request_id, &now],
        )
        .await?
        .get(0);
    let outbox = OutboxRow {
        id: outbox_id,
        function_id: new.id.clone(),
        collection_id: new.collection_id.clone(),
        partition: new.partition,
        request_id: new.request_id.clone(),
        created_at_ms: now,
        published_offset: None,
    };
    Ok(Some(AttachOutcome::Created(row, outbox)))
}

impl PostgresSysdb {
    pub async fn attach_function(&self, new: &NewFunction) -> Result<AttachOutcome> {
        let mut client = self.client().await?;
        // The insert met a row the rules did not see (a detach or attach that did not
        // take the attach lock): try again.
        for _ in 0..5 {
            let tx = client.transaction().await?;
            if let Some(outcome) = attach_once(&tx, new, now_ms()).await? {
                match outcome {
                    AttachOutcome::Created(..) => tx.commit().await?,
                    AttachOutcome::Existing(_) | AttachOutcome::Refused(_) => tx.rollback().await?,
                }
                return Ok(outcome);
            }
            tx.rollback().await?;
        }
        Err(SysdbError::Unavailable {
            backend: BACKEND,
            message: format!("attach of {:?}: the conflicting function kept changing", new.output_collection),
        })
    }

    pub async fn functions(&self, collection: Option<&str>) -> Result<Vec<FunctionRow>> {
        let client = self.client().await?;
        let rows = match collection {
            Some(c) => {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {FUNCTION_COLUMNS} FROM functions WHERE collection_id = $1 ORDER BY created_at_ms, id"
                    ))
                    .await?;
                client.query(&stmt, &[&c]).await?
            }
            None => {
                let stmt = client
                    .prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions ORDER BY created_at_ms, id"))
                    .await?;
                client.query(&stmt, &[]).await?
            }
        };
        rows.iter().map(|r| raw_function(r).decode(BACKEND)).collect()
    }

    pub async fn function(&self, id: &str) -> Result<Option<FunctionRow>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE id = $1")).await?;
        client.query_opt(&stmt, &[&id]).await?.map(|r| raw_function(&r).decode(BACKEND)).transpose()
    }

    pub async fn detach_function(&self, id: &str, drop_output: bool, feed: bool) -> Result<Option<FunctionRow>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let Some(r) =
            tx.query_opt(&format!("SELECT {FUNCTION_COLUMNS} FROM functions WHERE id = $1 FOR UPDATE"), &[&id]).await?
        else {
            tx.rollback().await?;
            return Ok(None);
        };
        let row = raw_function(&r).decode(BACKEND)?;
        tx.execute("UPDATE functions SET status = 'detached', updated_at_ms = $2 WHERE id = $1", &[&id, &now_ms()])
            .await?;
        tx.execute("DELETE FROM preimages WHERE function_id = $1", &[&id]).await?;
        if drop_output {
            let out = &row.output_collection;
            tx.execute("DELETE FROM function_counters WHERE function_id = $1", &[&id]).await?;
            // Never drop an output that a live function (attached again since) writes.
            let live: i64 = tx
                .query_one(
                    "SELECT count(*) FROM functions WHERE output_collection = $1 AND id <> $2 AND status <> 'detached'",
                    &[out, &id],
                )
                .await?
                .get(0);
            if live == 0 {
                if feed {
                    let partition: Option<i32> = tx
                        .query_opt("SELECT partition FROM collections WHERE id = $1", &[out])
                        .await?
                        .map(|r| r.get(0));
                    if let Some(partition) = partition {
                        let ids: Vec<String> = tx
                            .query("SELECT id FROM records WHERE collection_id = $1 ORDER BY id", &[out])
                            .await?
                            .iter()
                            .map(|r| r.get(0))
                            .collect();
                        let changes = changelog::dropped(out, ids);
                        super::changelog::begin_in(&tx, partition).await?;
                        super::changelog::append(&tx, partition, changes.iter()).await?;
                    }
                }
                tx.execute("DELETE FROM records WHERE collection_id = $1", &[out]).await?;
                tx.execute("DELETE FROM tombstones WHERE collection_id = $1", &[out]).await?;
                tx.execute("DELETE FROM collections WHERE id = $1", &[out]).await?;
            } else {
                tracing::warn!(function = %id, output = %out, "detach: output kept, another attached function writes it");
            }
        }
        tx.commit().await?;
        Ok(Some(row))
    }

    pub async fn outbox_pending(&self, limit: usize) -> Result<Vec<OutboxRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "SELECT id, function_id, collection_id, partition, request_id, created_at_ms, published_offset FROM outbox
                 WHERE sent_at_ms IS NULL ORDER BY id LIMIT $1",
            )
            .await?;
        Ok(client.query(&stmt, &[&limit]).await?.iter().map(outbox_row).collect())
    }

    pub async fn put_component(&self, sha256: &str, bytes: Vec<u8>, world_version: &str) -> Result<bool> {
        let client = self.client().await?;
        let size = i64::try_from(bytes.len()).unwrap_or(i64::MAX);
        let n = client
            .execute(
                "INSERT INTO function_components (sha256, bytes, size, world_version, created_at_ms)
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (sha256) DO NOTHING",
                &[&sha256, &bytes, &size, &world_version, &now_ms()],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn component(&self, sha256: &str) -> Result<Option<Vec<u8>>> {
        let client = self.client().await?;
        let row = client.query_opt("SELECT bytes FROM function_components WHERE sha256 = $1", &[&sha256]).await?;
        Ok(row.map(|r| r.get(0)))
    }

    pub async fn mark_function_failed(&self, id: &str, reason: &str) -> Result<bool> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let now = now_ms();
        let n = tx
            .execute(
                "UPDATE functions SET failed_reason = $2, failed_at_ms = $3, updated_at_ms = $3
                 WHERE id = $1 AND status <> 'detached' AND failed_reason IS NULL",
                &[&id, &reason, &now],
            )
            .await?;
        if n == 1 {
            tx.execute(DROP_PREIMAGES, &[&id]).await?;
        }
        tx.commit().await?;
        Ok(n == 1)
    }

    pub async fn mark_outbox_sent(&self, id: i64, published_offset: Option<i64>) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE outbox SET sent_at_ms = $2, published_offset = $3 WHERE id = $1 AND sent_at_ms IS NULL",
                &[&id, &now_ms(), &published_offset],
            )
            .await?;
        Ok(())
    }

    pub async fn lost_markers(&self, topic: &str, limit: usize) -> Result<Vec<OutboxRow>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let stmt = client.prepare_cached(LOST_MARKERS).await?;
        Ok(client.query(&stmt, &[&topic, &limit]).await?.iter().map(outbox_row).collect())
    }

    pub async fn mark_marker_republished(&self, id: i64, published_offset: i64) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "UPDATE outbox SET sent_at_ms = $2, published_offset = $3 WHERE id = $1",
                &[&id, &now_ms(), &published_offset],
            )
            .await?;
        Ok(())
    }

    pub async fn oldest_awaiting_marker_ms(&self) -> Result<Option<i64>> {
        let client = self.client().await?;
        Ok(client
            .query_one(
                "SELECT MIN(created_at_ms) FROM functions WHERE status = 'awaiting_marker' AND failed_reason IS NULL",
                &[],
            )
            .await?
            .get(0))
    }

    /// Deadlocks and serialization failures (not expected: see the module doc) are
    /// retried once, like batch commits.
    pub async fn backfill_step(
        &self,
        function_id: &str,
        expected_cursor: Option<&str>,
        limit: ChunkLimit,
        f: &dyn Function,
    ) -> Result<StepResult> {
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match backfill_once(&mut client, function_id, expected_cursor, limit, f).await {
                Ok(step) => return Ok(step),
                Err(TxError::Pg(e)) if attempt == 1 && super::is_retry_once(&e) => attempt += 1,
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn preimage_count(&self, function_id: &str) -> Result<i64> {
        let client = self.client().await?;
        Ok(client.query_one("SELECT count(*) FROM preimages WHERE function_id = $1", &[&function_id]).await?.get(0))
    }
}
