//! The audit trail: recorded gaps, operator resets, DLQ entries replayed into the log.

use super::PostgresSysdb;
use crate::sysdb::error::Result;
use crate::sysdb::types::{DlqReplayRow, GapRow, ResetRow};

impl PostgresSysdb {
    pub async fn gaps(&self, topic: &str) -> Result<Vec<GapRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, partition, from_offset, to_offset, recorded_at_ms FROM gaps WHERE topic = $1 ORDER BY id",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| GapRow {
                topic: r.get(0),
                partition: r.get(1),
                from_offset: r.get(2),
                to_offset: r.get(3),
                recorded_at_ms: r.get(4),
            })
            .collect())
    }

    pub async fn resets(&self, topic: &str) -> Result<Vec<ResetRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, partition, from_offset, to_offset, actor, reason, at_ms FROM offset_resets WHERE topic = $1 ORDER BY id",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| ResetRow {
                topic: r.get(0),
                partition: r.get(1),
                from_offset: r.get(2),
                to_offset: r.get(3),
                actor: r.get(4),
                reason: r.get(5),
                at_ms: r.get(6),
            })
            .collect())
    }

    pub async fn record_dlq_replay(&self, r: &DlqReplayRow) -> Result<bool> {
        let client = self.client().await?;
        let n = client
            .execute(
                "INSERT INTO dlq_replays (topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (topic, dlq_partition, dlq_offset) DO NOTHING",
                &[&r.topic, &r.dlq_partition, &r.dlq_offset, &r.replayed_at_ms, &r.log_partition, &r.log_offset],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn dlq_replays(&self, topic: &str) -> Result<Vec<DlqReplayRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset FROM dlq_replays
                 WHERE topic = $1 ORDER BY dlq_partition, dlq_offset",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| DlqReplayRow {
                topic: r.get(0),
                dlq_partition: r.get(1),
                dlq_offset: r.get(2),
                replayed_at_ms: r.get(3),
                log_partition: r.get(4),
                log_offset: r.get(5),
            })
            .collect())
    }
}
