//! The change feed's outbox on SQLite (`sysdb/changelog.rs` for the rules both backends
//! share). The one writer orders every transaction, so sequence order is commit order.

use rusqlite::{params, Connection, OptionalExtension};

use super::store::{invalid, SqliteSysdb};
use crate::sysdb::changelog::WithinBytes;
use crate::sysdb::error::Result;
use crate::sysdb::types::{now_ms, ChangeOp, ChangelogEntry, ChangelogPosition, OutboxChange};

/// Append `changes` to `partition`'s outbox inside the open write transaction, with the
/// partition's next sequence numbers.
pub(super) fn append(tx: &Connection, partition: i32, changes: &[OutboxChange], now: i64) -> Result<()> {
    if changes.is_empty() {
        return Ok(());
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
    Ok(())
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

    pub async fn changelog_positions(&self) -> Result<Vec<ChangelogPosition>> {
        self.read(|c| {
            let parts: Vec<(i32, i64, i64, i64)> = c
                .prepare_cached(
                    "SELECT partition, next_seq, published_seq, outbox_bytes FROM changelog_partitions ORDER BY partition",
                )?
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect::<rusqlite::Result<_>>()?;
            let mut out = Vec::with_capacity(parts.len());
            let mut count = c.prepare_cached("SELECT count(*) FROM changelog_outbox WHERE partition = ?1")?;
            let mut oldest = c.prepare_cached(
                "SELECT created_at_ms FROM changelog_outbox WHERE partition = ?1 AND seq > ?2 ORDER BY seq LIMIT 1",
            )?;
            for (partition, next_seq, published_seq, unpublished_bytes) in parts {
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
                });
            }
            Ok(out)
        })
        .await
    }
}
