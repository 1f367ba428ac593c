//! Partition positions and halts, the topic's partition count, gaps and operator
//! resets (the moves of a position).

use std::collections::HashMap;

use super::PostgresSysdb;
use crate::positions::PositionDelta;
use crate::sysdb::error::Result;
use crate::sysdb::types::{now_ms, PartitionState};

/// The partition's row locked for the rest of the transaction: the compare-and-set of
/// every move reads the position through it.
pub(super) const SELECT_FOR_UPDATE: &str =
    "SELECT next_offset FROM partitions WHERE topic = $1 AND partition = $2 FOR UPDATE";
impl PostgresSysdb {
    pub async fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[&key, &value],
            )
            .await?;
        Ok(())
    }

    pub async fn meta(&self, key: &str) -> Result<Option<String>> {
        let client = self.client().await?;
        Ok(client.query_opt("SELECT value FROM meta WHERE key = $1", &[&key]).await?.map(|r| r.get(0)))
    }

    pub async fn positions(&self, topic: &str) -> Result<HashMap<i32, i64>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached("SELECT partition, next_offset FROM partitions WHERE topic = $1").await?;
        Ok(client.query(&stmt, &[&topic]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub async fn partition_states(&self, topic: &str) -> Result<Vec<PartitionState>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT partition, next_offset, halted_reason, halted_at_ms FROM partitions WHERE topic = $1 ORDER BY partition",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| PartitionState {
                partition: r.get(0),
                next_offset: r.get(1),
                halted_reason: r.get(2),
                halted_at_ms: r.get(3),
            })
            .collect())
    }

    /// Whether the partition had a row.
    pub async fn set_partition_halted(&self, topic: &str, partition: i32, reason: Option<&str>) -> Result<bool> {
        let client = self.client().await?;
        // A halt that goes on keeps its start time; clearing resets both columns.
        let changed = client
            .execute(
                "UPDATE partitions SET
                     halted_at_ms = CASE WHEN $3::text IS NULL THEN NULL WHEN halted_reason IS NULL THEN $4 ELSE halted_at_ms END,
                     halted_reason = $3::text
                 WHERE topic = $1 AND partition = $2",
                &[&topic, &partition, &reason, &now_ms()],
            )
            .await?;
        Ok(changed > 0)
    }

    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        let client = self.client().await?;
        // Rows are never deleted, so insert-if-absent then read is race-free.
        client
            .execute(
                "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (topic, partition) DO NOTHING",
                &[&topic, &partition, &next_offset, &now_ms()],
            )
            .await?;
        Ok(client
            .query_one("SELECT next_offset FROM partitions WHERE topic = $1 AND partition = $2", &[&topic, &partition])
            .await?
            .get(0))
    }

    pub async fn record_gap(&self, topic: &str, delta: PositionDelta) -> Result<()> {
        let (partition, from, to) = (delta.partition, delta.from, delta.to);
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let stored: Option<i64> = tx.query_opt(SELECT_FOR_UPDATE, &[&topic, &partition]).await?.map(|r| r.get(0));
        if let Err(conflict) = delta.check(stored) {
            tx.rollback().await?;
            return Err(conflict.into());
        }
        let now = now_ms();
        tx.execute(
            "INSERT INTO gaps (topic, partition, from_offset, to_offset, recorded_at_ms) VALUES ($1, $2, $3, $4, $5)",
            &[&topic, &partition, &from, &to, &now],
        )
        .await?;
        tx.execute(
            "UPDATE partitions SET next_offset = $3, updated_at_ms = $4 WHERE topic = $1 AND partition = $2",
            &[&topic, &partition, &to, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn reset_position(
        &self,
        topic: &str,
        partition: i32,
        to: i64,
        actor: &str,
        reason: &str,
    ) -> Result<Option<i64>> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Lock the row (if any) so that the audited `from_offset` is the value replaced.
        let previous: Option<i64> = tx.query_opt(SELECT_FOR_UPDATE, &[&topic, &partition]).await?.map(|r| r.get(0));
        let now = now_ms();
        tx.execute(
            "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES ($1, $2, $3, $4)
             ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at_ms = EXCLUDED.updated_at_ms",
            &[&topic, &partition, &to, &now],
        )
        .await?;
        tx.execute(
            "UPDATE partitions SET halted_reason = NULL, halted_at_ms = NULL WHERE topic = $1 AND partition = $2",
            &[&topic, &partition],
        )
        .await?;
        tx.execute(
            "INSERT INTO offset_resets (topic, partition, from_offset, to_offset, actor, reason, at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&topic, &partition, &previous, &to, &actor, &reason, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(previous)
    }
}
