//! The positions report of `sluice offsets show` and the admin API: per partition, the
//! sysdb position (authoritative), the group offset (lagging), the high watermark, the lag
//! and whether the partition is halted and why.

use crate::config::Config;
use crate::kafka::admin::MetadataClient;
use crate::kafka::KafkaError;
use crate::sysdb::{Sysdb, SysdbError};

/// Why the report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// One row of `offsets show`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct OffsetRow {
    pub topic: String,
    pub partition: i32,
    pub sysdb_next_offset: Option<i64>,
    pub group_offset: Option<i64>,
    pub high_watermark: i64,
    /// high watermark − sysdb position (the authoritative lag).
    pub lag: i64,
    /// `running`, or `halted: <reason>` when the processor stopped the partition.
    pub status: String,
    /// When the current halt began (ms since the Unix epoch), if halted.
    pub halted_at_ms: Option<i64>,
}

/// The `status` column of a partition: `running` or `halted: <reason>`.
pub fn partition_status(halted_reason: Option<&str>) -> String {
    match halted_reason {
        None => "running".to_string(),
        Some(reason) => format!("halted: {reason}"),
    }
}

pub async fn offset_rows(config: &Config, sysdb: &Sysdb) -> Result<Vec<OffsetRow>, OffsetsError> {
    let topic = config.kafka.log_topic();
    let states: std::collections::HashMap<i32, crate::sysdb::PartitionState> =
        sysdb.partition_states(&topic).await?.into_iter().map(|s| (s.partition, s)).collect();
    let settings = crate::kafka::ClientSettings::from_config(config);
    let group = config.kafka.group.clone();
    let t = topic.clone();
    let (n, group_offsets, marks) = tokio::task::spawn_blocking(move || -> Result<_, KafkaError> {
        let md = MetadataClient::new(&settings, Some(&group))?;
        let n = md.partition_count(&t)?;
        let ps: Vec<i32> = (0..n).collect();
        let g = md.group_offsets(&t, &ps)?;
        let marks = ps.iter().map(|p| md.watermarks(&t, *p)).collect::<Result<Vec<_>, _>>()?;
        Ok((n, g, marks))
    })
    .await
    .map_err(|e| OffsetsError::Kafka(KafkaError::Config(format!("offset query task failed: {e}"))))??;
    Ok((0..n)
        .map(|p| {
            let (low, high) = marks[p as usize];
            let state = states.get(&p);
            let s = state.map(|st| st.next_offset);
            OffsetRow {
                topic: topic.clone(),
                partition: p,
                sysdb_next_offset: s,
                group_offset: group_offsets.get(&p).copied(),
                high_watermark: high,
                lag: high - s.unwrap_or(low).max(low.min(s.unwrap_or(low))),
                status: partition_status(state.and_then(|st| st.halted_reason.as_deref())),
                halted_at_ms: state.and_then(|st| st.halted_at_ms),
            }
        })
        .collect())
}
