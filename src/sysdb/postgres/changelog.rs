//! The change feed's outbox on PostgreSQL (`sysdb/changelog.rs` for the rules both
//! backends share). A transaction's changes are appended in one statement at its end: it
//! takes the sequence numbers from the partition's `changelog_partitions` row, whose lock
//! it holds to the commit, so sequence order is commit order for that partition.

use deadpool_postgres::Transaction;
use tokio_postgres::types::ToSql;

use super::records::{decode_row, RECORD_COLUMNS};
use super::{invalid, PostgresSysdb, TxError};
use crate::sysdb::changelog::{SnapshotChunk, WithinBytes};
use crate::sysdb::error::Result;
use crate::sysdb::types::{
    now_ms, ChangeOp, ChangelogEntry, ChangelogPosition, ChangelogSnapshot, OutboxChange, SnapshotStep,
};

/// The `changelog_partitions` rows of the partitions `$1` created where missing: the feed
/// starts for them, with a snapshot pending (`$2`: now) where they already hold records.
/// Returns the partitions it created with a snapshot pending.
const BEGIN: &str = "INSERT INTO changelog_partitions (partition, next_seq, outbox_bytes, snapshot_requested_at_ms)
     SELECT p, 0, 0, CASE WHEN EXISTS (SELECT 1 FROM collections c WHERE c.partition = p AND c.record_count > 0)
                          THEN $2::int8 END
     FROM UNNEST($1::int4[]) AS p
     ON CONFLICT (partition) DO NOTHING
     RETURNING partition, snapshot_requested_at_ms IS NOT NULL";

/// [`BEGIN`] for one partition inside the caller's transaction (a backfill chunk or a
/// detach that appends changes: the first changes of a partition must not hide its older
/// records). Right before the append, which locks the same row anyway.
pub(super) async fn begin_in(tx: &Transaction<'_>, partition: i32) -> std::result::Result<bool, TxError> {
    let rows = tx.query(&tx.prepare_cached(BEGIN).await?, &[&vec![partition], &now_ms()]).await?;
    Ok(rows.iter().any(|r| r.get::<_, bool>(1)))
}

/// `$1` partition, `$2` the number of changes, `$3..$7` their columns, `$8` now, `$9`
/// their bytes. Returns the first sequence number the changes took (a data-modifying
/// `WITH` runs to completion whether or not the outer query reads it).
pub(super) const APPEND: &str = "WITH s AS (
         INSERT INTO changelog_partitions AS c (partition, next_seq, outbox_bytes) VALUES ($1, $2, $9)
         ON CONFLICT (partition) DO UPDATE SET
             next_seq = c.next_seq + EXCLUDED.next_seq,
             outbox_bytes = c.outbox_bytes + EXCLUDED.outbox_bytes
         RETURNING c.next_seq - $2 AS first
     ), rows AS (
         INSERT INTO changelog_outbox (partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms)
         SELECT $1, s.first + u.ord - 1, u.collection_id, u.record_id, u.operation, u.source_offset, u.value, $8
         FROM s, UNNEST($3::text[], $4::text[], $5::text[], $6::int8[], $7::bytea[])
              WITH ORDINALITY AS u(collection_id, record_id, operation, source_offset, value, ord)
     )
     SELECT first FROM s";

/// A transaction's changes as the columns of [`APPEND`].
pub(super) struct ChangeRows<'a> {
    pub partition: i32,
    pub count: i64,
    collections: Vec<&'a str>,
    ids: Vec<&'a str>,
    ops: Vec<&'a str>,
    offsets: Vec<i64>,
    values: Vec<Option<&'a [u8]>>,
    pub now: i64,
    bytes: i64,
}

impl<'a> ChangeRows<'a> {
    pub(super) fn new(partition: i32, changes: impl Iterator<Item = &'a OutboxChange>) -> Self {
        let mut rows = ChangeRows {
            partition,
            count: 0,
            collections: Vec::new(),
            ids: Vec::new(),
            ops: Vec::new(),
            offsets: Vec::new(),
            values: Vec::new(),
            now: now_ms(),
            bytes: 0,
        };
        for c in changes {
            rows.bytes += c.bytes() as i64;
            rows.collections.push(&c.collection_id);
            rows.ids.push(&c.record_id);
            rows.ops.push(c.op.as_str());
            rows.offsets.push(c.source_offset);
            rows.values.push(c.value.as_deref());
        }
        rows.count = rows.ids.len() as i64;
        rows
    }

    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    pub(super) fn params(&self) -> Vec<&(dyn ToSql + Sync)> {
        vec![
            &self.partition,
            &self.count,
            &self.collections,
            &self.ids,
            &self.ops,
            &self.offsets,
            &self.values,
            &self.now,
            &self.bytes,
        ]
    }
}

/// Append `changes` to `partition`'s outbox inside `tx`; returns the first sequence
/// number they took (`None`: no change).
pub(super) async fn append<'a>(
    tx: &Transaction<'_>,
    partition: i32,
    changes: impl Iterator<Item = &'a OutboxChange>,
) -> std::result::Result<Option<i64>, TxError> {
    let rows = ChangeRows::new(partition, changes);
    if rows.is_empty() {
        return Ok(None);
    }
    let row = tx.query_one(&tx.prepare_cached(APPEND).await?, &rows.params()).await?;
    Ok(Some(row.get(0)))
}

impl PostgresSysdb {
    pub async fn changelog_pending(
        &self,
        partition: i32,
        after_seq: i64,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<Vec<ChangelogEntry>> {
        let limit = i64::try_from(max_records).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(
                "SELECT partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms
                 FROM changelog_outbox WHERE partition = $1 AND seq > $2 ORDER BY seq LIMIT $3",
            )
            .await?;
        let mut out = WithinBytes::new(max_bytes);
        // Streamed: no more than the byte bound and one row are held.
        let params: [&(dyn ToSql + Sync); 3] = [&partition, &after_seq, &limit];
        let stream = client.query_raw(&stmt, params).await?;
        futures_util::pin_mut!(stream);
        while let Some(r) = futures_util::StreamExt::next(&mut stream).await {
            let r = r?;
            let (partition, seq): (i32, i64) = (r.get(0), r.get(1));
            let op: String = r.get(4);
            let op = ChangeOp::parse(&op)
                .ok_or_else(|| invalid(format!("changelog row {partition}/{seq}: operation {op:?}")))?;
            let row = ChangelogEntry {
                partition,
                seq,
                change: OutboxChange {
                    collection_id: r.get(2),
                    record_id: r.get(3),
                    op,
                    source_offset: r.get(5),
                    value: r.get(6),
                },
                created_at_ms: r.get(7),
            };
            if !out.take(row) {
                break;
            }
        }
        Ok(out.rows)
    }

    pub async fn changelog_mark_published(&self, partition: i32, seq: i64) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                // The published changes leave the bound: their bytes, read before the rows
                // are deleted (only rows up to the old `published_seq` ever are).
                "UPDATE changelog_partitions c SET
                     outbox_bytes = c.outbox_bytes - (SELECT COALESCE(sum(octet_length(o.collection_id) + 1
                             + octet_length(o.record_id) + COALESCE(octet_length(o.value), 0)), 0)
                         FROM changelog_outbox o
                         WHERE o.partition = $1 AND o.seq > c.published_seq AND o.seq <= $2::int8),
                     published_seq = $2::int8,
                     published_at_ms = $3
                 WHERE c.partition = $1 AND c.published_seq < $2::int8",
                &[&partition, &seq, &now_ms()],
            )
            .await?;
        Ok(())
    }

    pub async fn changelog_unpublished_bytes(&self, partition: i32) -> Result<i64> {
        let client = self.client().await?;
        let row = client
            .query_opt("SELECT outbox_bytes FROM changelog_partitions WHERE partition = $1", &[&partition])
            .await?;
        Ok(row.map_or(0, |r| r.get(0)))
    }

    pub async fn changelog_trim(&self, partition: i32, through_seq: i64, limit: usize) -> Result<usize> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let n = client
            .execute(
                "DELETE FROM changelog_outbox WHERE partition = $1 AND seq IN
                 (SELECT seq FROM changelog_outbox WHERE partition = $1 AND seq <= $2 ORDER BY seq LIMIT $3)",
                &[&partition, &through_seq, &limit],
            )
            .await?;
        Ok(n as usize)
    }

    pub async fn changelog_begin(&self, partitions: Vec<i32>) -> Result<Vec<i32>> {
        let client = self.client().await?;
        let rows = client.query(BEGIN, &[&partitions, &now_ms()]).await?;
        let mut out: Vec<i32> = rows.iter().filter(|r| r.get::<_, bool>(1)).map(|r| r.get(0)).collect();
        out.sort_unstable();
        Ok(out)
    }

    pub async fn changelog_request_snapshot(&self, partitions: Vec<i32>) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO changelog_partitions AS c (partition, next_seq, outbox_bytes, snapshot_requested_at_ms)
                 SELECT p, 0, 0, $2::int8 FROM UNNEST($1::int4[]) AS p
                 ON CONFLICT (partition) DO UPDATE SET snapshot_requested_at_ms = EXCLUDED.snapshot_requested_at_ms,
                     snapshot_collection = NULL, snapshot_id = NULL, snapshot_records = 0",
                &[&partitions, &now_ms()],
            )
            .await?;
        Ok(())
    }

    pub async fn changelog_snapshot_pending(&self, partition: i32) -> Result<bool> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT snapshot_requested_at_ms IS NOT NULL FROM changelog_partitions WHERE partition = $1",
                &[&partition],
            )
            .await?;
        Ok(row.is_some_and(|r| r.get(0)))
    }

    /// One snapshot step in one transaction that takes the partition's
    /// `changelog_partitions` row lock FIRST, then reads the records (READ COMMITTED: each
    /// statement sees every transaction committed before it began). A batch of the
    /// partition takes the same lock to append its changes, so it either committed before
    /// the lock was granted (the chunk reads its writes) or appends after the chunk.
    pub async fn changelog_snapshot_step(
        &self,
        partition: i32,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<SnapshotStep> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let row = tx
            .query_opt(
                "SELECT snapshot_requested_at_ms, snapshot_collection, snapshot_id, snapshot_records
                 FROM changelog_partitions WHERE partition = $1 FOR UPDATE",
                &[&partition],
            )
            .await?;
        let Some(row) = row else { return Ok(SnapshotStep::Idle) };
        if row.get::<_, Option<i64>>(0).is_none() {
            return Ok(SnapshotStep::Idle);
        }
        let (cursor_collection, cursor_id, total): (Option<String>, Option<String>, i64) =
            (row.get(1), row.get(2), row.get(3));
        let collections: Vec<String> = tx
            .query(
                "SELECT id FROM collections WHERE partition = $1 AND id >= $2 ORDER BY id",
                &[&partition, &cursor_collection.as_deref().unwrap_or("")],
            )
            .await?
            .iter()
            .map(|r| r.get(0))
            .collect();
        let after_stmt = tx
            .prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM records WHERE collection_id = $1 AND id > $2 ORDER BY id LIMIT $3"
            ))
            .await?;
        let first_stmt = tx
            .prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM records WHERE collection_id = $1 ORDER BY id LIMIT $2"
            ))
            .await?;
        let mut chunk = SnapshotChunk::new(max_records, max_bytes);
        'walk: for collection in &collections {
            let after = if cursor_collection.as_ref() == Some(collection) { cursor_id.clone() } else { None };
            let room = chunk.room();
            let limit = i64::try_from(room).unwrap_or(i64::MAX);
            let rows = match &after {
                Some(a) => tx.query(&after_stmt, &[collection, a, &limit]).await?,
                None => tx.query(&first_stmt, &[collection, &limit]).await?,
            };
            for r in &rows {
                chunk.take(collection, &decode_row(r)?);
                if chunk.full() {
                    break 'walk;
                }
            }
        }
        let (finished, records) = (!chunk.full(), chunk.changes.len() as i64);
        let (c, i) = if finished { (None, None) } else { chunk.cursor().unzip() };
        append(&tx, partition, chunk.changes.iter()).await.map_err(crate::sysdb::error::SysdbError::from)?;
        tx.execute(
            "UPDATE changelog_partitions SET snapshot_collection = $2, snapshot_id = $3,
                 snapshot_records = snapshot_records + $4,
                 snapshot_requested_at_ms = CASE WHEN $5 THEN NULL ELSE snapshot_requested_at_ms END,
                 snapshot_finished_at_ms = CASE WHEN $5 THEN $6::int8 ELSE snapshot_finished_at_ms END
             WHERE partition = $1",
            &[&partition, &c, &i, &records, &finished, &now_ms()],
        )
        .await?;
        tx.commit().await?;
        Ok(chunk.step(total))
    }

    pub async fn changelog_positions(&self) -> Result<Vec<ChangelogPosition>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT c.partition, c.next_seq, c.published_seq, c.outbox_bytes,
                        (SELECT count(*) FROM changelog_outbox o WHERE o.partition = c.partition),
                        (SELECT o.created_at_ms FROM changelog_outbox o
                          WHERE o.partition = c.partition AND o.seq > c.published_seq ORDER BY o.seq LIMIT 1),
                        c.snapshot_requested_at_ms, c.snapshot_records, c.snapshot_finished_at_ms
                 FROM changelog_partitions c ORDER BY c.partition",
                &[],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| ChangelogPosition {
                partition: r.get(0),
                next_seq: r.get(1),
                published_seq: r.get(2),
                unpublished_bytes: r.get(3),
                outbox_records: r.get(4),
                oldest_unpublished_ms: r.get(5),
                snapshot: ChangelogSnapshot { requested_at_ms: r.get(6), records: r.get(7), finished_at_ms: r.get(8) },
            })
            .collect())
    }
}
