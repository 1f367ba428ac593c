//! The change feed's outbox on SQLite (`sysdb/changelog.rs` for the rules both backends
//! share). The one writer orders every transaction, so sequence order is commit order.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::readers;
use super::rows::decode_raw;
use super::store::{invalid, SqliteSysdb};
use crate::sysdb::changelog::{SnapshotChunk, WithinBytes};
use crate::sysdb::error::Result;
use crate::sysdb::types::{
    now_ms, ChangeOp, ChangelogEntry, ChangelogPosition, ChangelogSnapshot, OutboxChange, SnapshotStep,
};

/// The partition's `changelog_partitions` row created if it has none: the feed starts for
/// the partition, with a snapshot pending when it already holds records (`?2`: now).
/// Returns whether it created the row with a snapshot pending.
const BEGIN: &str = "INSERT INTO changelog_partitions (partition, next_seq, outbox_bytes, snapshot_requested_at_ms)
     SELECT ?1, 0, 0, CASE WHEN EXISTS (SELECT 1 FROM collections WHERE partition = ?1 AND record_count > 0) THEN ?2 END
     WHERE true
     ON CONFLICT (partition) DO NOTHING
     RETURNING snapshot_requested_at_ms IS NOT NULL";

/// [`BEGIN`] inside the caller's write transaction (a backfill chunk or a detach that
/// appends changes: the first changes of a partition must not hide its older records).
pub(super) fn begin_in(tx: &Connection, partition: i32) -> Result<bool> {
    Ok(tx.prepare_cached(BEGIN)?.query_row(params![partition, now_ms()], |r| r.get(0)).optional()?.unwrap_or(false))
}

/// A partition's snapshot state: requested at, the cursor's collection and id, records so
/// far.
type SnapshotRow = (Option<i64>, Option<String>, Option<String>, i64);

/// One snapshot step inside a write transaction of the one writer (so no batch commits
/// while it reads): the chunk after the cursor, appended, the cursor advanced.
fn snapshot_step_sync(
    conn: &mut Connection,
    partition: i32,
    max_records: usize,
    max_bytes: usize,
) -> Result<SnapshotStep> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let row: Option<SnapshotRow> = tx
        .prepare_cached(
            "SELECT snapshot_requested_at_ms, snapshot_collection, snapshot_id, snapshot_records
             FROM changelog_partitions WHERE partition = ?1",
        )?
        .query_row([partition], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .optional()?;
    let Some((Some(_), cursor_collection, cursor_id, total)) = row else { return Ok(SnapshotStep::Idle) };
    let collections: Vec<String> = tx
        .prepare_cached("SELECT id FROM collections WHERE partition = ?1 AND id >= ?2 ORDER BY id")?
        .query_map(params![partition, cursor_collection.as_deref().unwrap_or("")], |r| r.get(0))?
        .collect::<rusqlite::Result<_>>()?;
    let mut chunk = SnapshotChunk::new(max_records, max_bytes);
    'walk: for collection in &collections {
        let mut after = if cursor_collection.as_ref() == Some(collection) { cursor_id.clone() } else { None };
        loop {
            let room = chunk.room();
            let page = readers::page_in(&tx, collection, after.as_deref(), room)?;
            let n = page.len();
            for raw in page {
                let record = decode_raw(raw)?;
                chunk.take(collection, &record);
                after = Some(record.id);
                if chunk.full() {
                    break 'walk;
                }
            }
            if n < room {
                break; // the collection is done
            }
        }
    }
    let now = now_ms();
    append(&tx, partition, &chunk.changes, now)?;
    let (finished, records) = (!chunk.full(), chunk.changes.len());
    let (c, i) = if finished { (None, None) } else { chunk.cursor().unzip() };
    tx.prepare_cached(
        "UPDATE changelog_partitions SET snapshot_collection = ?2, snapshot_id = ?3,
             snapshot_records = snapshot_records + ?4,
             snapshot_requested_at_ms = CASE WHEN ?5 THEN NULL ELSE snapshot_requested_at_ms END,
             snapshot_finished_at_ms = CASE WHEN ?5 THEN ?6 ELSE snapshot_finished_at_ms END
         WHERE partition = ?1",
    )?
    .execute(params![partition, c, i, records as i64, finished, now])?;
    tx.commit()?;
    Ok(chunk.step(total))
}

/// Append `changes` to `partition`'s outbox inside the open write transaction, with the
/// partition's next sequence numbers; returns the first (`None`: no change).
pub(super) fn append(tx: &Connection, partition: i32, changes: &[OutboxChange], now: i64) -> Result<Option<i64>> {
    if changes.is_empty() {
        return Ok(None);
    }
    let n = changes.len() as i64;
    let bytes: i64 = changes.iter().map(|c| c.bytes() as i64).sum();
    let next: i64 = tx
        .prepare_cached(
            "INSERT INTO changelog_partitions (partition, next_seq, outbox_bytes) VALUES (?1, ?2, ?3)
             ON CONFLICT (partition) DO UPDATE SET
                 next_seq = next_seq + excluded.next_seq,
                 outbox_bytes = outbox_bytes + excluded.outbox_bytes
             RETURNING next_seq",
        )?
        .query_row(params![partition, n, bytes], |r| r.get(0))?;
    let mut insert = tx.prepare_cached(
        "INSERT INTO changelog_outbox (partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (i, c) in changes.iter().enumerate() {
        insert.execute(params![
            partition,
            next - n + i as i64,
            c.collection_id,
            c.record_id,
            c.op.as_str(),
            c.source_offset,
            c.value,
            now
        ])?;
    }
    Ok(Some(next - n))
}

/// An outbox row as read, its operation not parsed yet.
type RawEntry = (i32, i64, String, String, String, i64, Option<Vec<u8>>, i64);

fn entry(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawEntry> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?))
}

impl SqliteSysdb {
    pub async fn changelog_pending(
        &self,
        partition: i32,
        after_seq: i64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<ChangelogEntry>> {
        let limit = i64::try_from(max_records).unwrap_or(i64::MAX);
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms
                 FROM changelog_outbox WHERE partition = ?1 AND seq > ?2 ORDER BY seq LIMIT ?3",
            )?;
            let mut out = WithinBytes::new(max_bytes);
            for row in stmt.query_map(params![partition, after_seq, limit], entry)? {
                let (partition, seq, collection_id, record_id, op, source_offset, value, created_at_ms) = row?;
                let op = ChangeOp::parse(&op)
                    .ok_or_else(|| invalid(format!("changelog row {partition}/{seq}: operation {op:?}")))?;
                let row = ChangelogEntry {
                    partition,
                    seq,
                    change: OutboxChange { collection_id, record_id, op, source_offset, value },
                    created_at_ms,
                };
                if !out.take(row) {
                    break;
                }
            }
            Ok(out.rows)
        })
        .await
    }

    pub async fn changelog_mark_published(&self, partition: i32, seq: i64) -> Result<()> {
        self.write(move |c, _w| {
            // The published changes leave the bound: their bytes, read before the rows
            // are deleted (only rows up to the old `published_seq` ever are).
            c.prepare_cached(
                "UPDATE changelog_partitions SET
                     outbox_bytes = outbox_bytes - (SELECT COALESCE(sum(octet_length(o.collection_id) + 1
                             + octet_length(o.record_id) + COALESCE(octet_length(o.value), 0)), 0)
                         FROM changelog_outbox o
                         WHERE o.partition = ?1 AND o.seq > changelog_partitions.published_seq AND o.seq <= ?2),
                     published_seq = ?2,
                     published_at_ms = ?3
                 WHERE partition = ?1 AND published_seq < ?2",
            )?
            .execute(params![partition, seq, now_ms()])?;
            Ok(())
        })
        .await
    }

    pub async fn changelog_unpublished_bytes(&self, partition: i32) -> Result<i64> {
        self.read(move |c| {
            Ok(c.prepare_cached("SELECT outbox_bytes FROM changelog_partitions WHERE partition = ?1")?
                .query_row([partition], |r| r.get(0))
                .optional()?
                .unwrap_or(0))
        })
        .await
    }

    pub async fn changelog_trim(&self, partition: i32, through_seq: i64, limit: usize) -> Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.write(move |c, _w| {
            // The oldest rows first, a bounded number: a long backlog is deleted in steps.
            let n = c
                .prepare_cached(
                    "DELETE FROM changelog_outbox WHERE partition = ?1 AND seq IN
                     (SELECT seq FROM changelog_outbox WHERE partition = ?1 AND seq <= ?2 ORDER BY seq LIMIT ?3)",
                )?
                .execute(params![partition, through_seq, limit])?;
            Ok(n)
        })
        .await
    }

    pub async fn changelog_begin(&self, partitions: Vec<i32>) -> Result<Vec<i32>> {
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let mut snapshots = Vec::new();
            for p in partitions {
                if begin_in(&tx, p)? {
                    snapshots.push(p);
                }
            }
            tx.commit()?;
            Ok(snapshots)
        })
        .await
    }

    pub async fn changelog_request_snapshot(&self, partitions: Vec<i32>) -> Result<()> {
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let now = now_ms();
            for p in partitions {
                tx.prepare_cached(
                    "INSERT INTO changelog_partitions (partition, next_seq, outbox_bytes, snapshot_requested_at_ms)
                     VALUES (?1, 0, 0, ?2)
                     ON CONFLICT (partition) DO UPDATE SET snapshot_requested_at_ms = excluded.snapshot_requested_at_ms,
                         snapshot_collection = NULL, snapshot_id = NULL, snapshot_records = 0",
                )?
                .execute(params![p, now])?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn changelog_snapshot_pending(&self, partition: i32) -> Result<bool> {
        self.read(move |c| {
            Ok(c.prepare_cached(
                "SELECT snapshot_requested_at_ms IS NOT NULL FROM changelog_partitions WHERE partition = ?1",
            )?
            .query_row([partition], |r| r.get(0))
            .optional()?
            .unwrap_or(false))
        })
        .await
    }

    pub async fn changelog_snapshot_step(
        &self,
        partition: i32,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<SnapshotStep> {
        self.write(move |c, _w| snapshot_step_sync(c, partition, max_records, max_bytes)).await
    }

    pub async fn changelog_positions(&self) -> Result<Vec<ChangelogPosition>> {
        self.read(|c| {
            type Part = (i32, i64, i64, i64, ChangelogSnapshot);
            let parts: Vec<Part> = c
                .prepare_cached(
                    "SELECT partition, next_seq, published_seq, outbox_bytes,
                            snapshot_requested_at_ms, snapshot_records, snapshot_finished_at_ms
                     FROM changelog_partitions ORDER BY partition",
                )?
                .query_map([], |r| {
                    let snapshot =
                        ChangelogSnapshot { requested_at_ms: r.get(4)?, records: r.get(5)?, finished_at_ms: r.get(6)? };
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, snapshot))
                })?
                .collect::<rusqlite::Result<_>>()?;
            let mut out = Vec::with_capacity(parts.len());
            let mut count = c.prepare_cached("SELECT count(*) FROM changelog_outbox WHERE partition = ?1")?;
            let mut oldest = c.prepare_cached(
                "SELECT created_at_ms FROM changelog_outbox WHERE partition = ?1 AND seq > ?2 ORDER BY seq LIMIT 1",
            )?;
            for (partition, next_seq, published_seq, unpublished_bytes, snapshot) in parts {
                let outbox_records: i64 = count.query_row([partition], |r| r.get(0))?;
                let oldest_unpublished_ms: Option<i64> =
                    oldest.query_row(params![partition, published_seq], |r| r.get(0)).optional()?;
                out.push(ChangelogPosition {
                    partition,
                    next_seq,
                    published_seq,
                    outbox_records,
                    oldest_unpublished_ms,
                    unpublished_bytes,
                    snapshot,
                });
            }
            Ok(out)
        })
        .await
    }
}
