//! Partition positions and halts, the topic's partition count, gaps and operator
//! resets (the moves of a position).

use std::collections::HashMap;

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

use super::store::SqliteSysdb;
use crate::positions::PositionDelta;
use crate::sysdb::error::Result;
use crate::sysdb::types::{now_ms, PartitionState};

pub(super) fn read_next_offset(conn: &Connection, topic: &str, partition: i32) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT next_offset FROM partitions WHERE topic = ?1 AND partition = ?2")?
        .query_row(params![topic, partition], |r| r.get(0))
        .optional()?)
}

pub(super) fn write_next_offset(
    conn: &Connection,
    topic: &str,
    partition: i32,
    next_offset: i64,
    now: i64,
) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(params![topic, partition, next_offset, now])?;
    Ok(())
}

/// Sets or clears a halt (?3 = reason or NULL, ?4 = now); a halt that goes on keeps its
/// start time.
const HALT_SQL: &str = "UPDATE partitions SET
        halted_at_ms = CASE WHEN ?3 IS NULL THEN NULL WHEN halted_reason IS NULL THEN ?4 ELSE halted_at_ms END,
        halted_reason = ?3
     WHERE topic = ?1 AND partition = ?2";

impl SqliteSysdb {
    pub async fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        let (key, value) = (key.to_string(), value.to_string());
        self.write(move |c, _w| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, value],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn meta(&self, key: &str) -> Result<Option<String>> {
        let key = key.to_string();
        self.read(move |c| Ok(c.query_row("SELECT value FROM meta WHERE key = ?1", [&key], |r| r.get(0)).optional()?))
            .await
    }

    pub async fn positions(&self, topic: &str) -> Result<HashMap<i32, i64>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT partition, next_offset FROM partitions WHERE topic = ?1")?;
            let rows = stmt.query_map([&topic], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<HashMap<i32, i64>>>()?)
        })
        .await
    }

    pub async fn partition_states(&self, topic: &str) -> Result<Vec<PartitionState>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT partition, next_offset, halted_reason, halted_at_ms FROM partitions WHERE topic = ?1 ORDER BY partition",
            )?;
            let rows = stmt.query_map([&topic], |r| {
                Ok(PartitionState { partition: r.get(0)?, next_offset: r.get(1)?, halted_reason: r.get(2)?, halted_at_ms: r.get(3)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    /// Whether the partition had a row.
    pub async fn set_partition_halted(&self, topic: &str, partition: i32, reason: Option<&str>) -> Result<bool> {
        let (topic, reason) = (topic.to_string(), reason.map(str::to_string));
        self.write(move |c, _w| {
            Ok(c.prepare_cached(HALT_SQL)?.execute(params![topic, partition, reason, now_ms()])? > 0)
        })
        .await
    }

    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        let topic = topic.to_string();
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (topic, partition) DO NOTHING",
                params![topic, partition, next_offset, now_ms()],
            )?;
            let stored = read_next_offset(&tx, &topic, partition)?
                .ok_or_else(|| super::store::invalid(format!("partition {partition}: row vanished after insert")))?;
            tx.commit()?;
            Ok(stored)
        })
        .await
    }

    pub async fn record_gap(&self, topic: &str, delta: PositionDelta) -> Result<()> {
        let topic = topic.to_string();
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            delta.check(read_next_offset(&tx, &topic, delta.partition)?)?;
            let now = now_ms();
            tx.execute(
                "INSERT INTO gaps (topic, partition, from_offset, to_offset, recorded_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![topic, delta.partition, delta.from, delta.to, now],
            )?;
            write_next_offset(&tx, &topic, delta.partition, delta.to, now)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn reset_position(
        &self,
        topic: &str,
        partition: i32,
        to: i64,
        actor: &str,
        reason: &str,
    ) -> Result<Option<i64>> {
        let (topic, actor, reason) = (topic.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let previous = read_next_offset(&tx, &topic, partition)?;
            let now = now_ms();
            write_next_offset(&tx, &topic, partition, to, now)?;
            tx.execute(
                "UPDATE partitions SET halted_reason = NULL, halted_at_ms = NULL WHERE topic = ?1 AND partition = ?2",
                params![topic, partition],
            )?;
            tx.execute(
                "INSERT INTO offset_resets (topic, partition, from_offset, to_offset, actor, reason, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![topic, partition, previous, to, actor, reason, now],
            )?;
            tx.commit()?;
            Ok(previous)
        })
        .await
    }
}
