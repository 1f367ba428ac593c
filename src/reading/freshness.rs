//! How fresh one collection is: its partition's sysdb position against the high
//! watermark, the lag in records and in seconds, and the last change applied to this
//! collection and when it was produced.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use crate::kafka::cluster::{timestamp_at, MetadataClient};
use crate::kafka::{ClientSettings, KafkaError};
use crate::sysdb::{Sysdb, SysdbError};

/// How long reading one record's timestamp may take.
const TIMESTAMP_WAIT: Duration = Duration::from_secs(2);

/// The freshness of one collection.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Freshness {
    pub collection: String,
    pub topic: String,
    pub partition: i32,
    /// The partition's sysdb position: the next offset to apply.
    pub sysdb_next_offset: i64,
    pub high_watermark: i64,
    /// Records in the partition not applied yet (every collection of the partition).
    pub lag_records: i64,
    /// 0 when caught up; else how long the oldest record not applied yet has waited
    /// (now - its producer timestamp); `None` when that record has no timestamp.
    pub lag_seconds: Option<f64>,
    /// The offset of the last record applied to this collection.
    pub last_applied_offset: i64,
    /// Its producer timestamp (ms since the Unix epoch); `None` when it has none or
    /// retention deleted it.
    pub last_applied_time_ms: Option<i64>,
    /// Why the partition is halted; `None` = running.
    pub halted: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum FreshnessError {
    #[error("collection {0:?} is not known to the sysdb (see `sluice collections list`)")]
    UnknownCollection(String),
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    #[error(transparent)]
    Broker(#[from] KafkaError),
}

fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Read the freshness of `collection` from the sysdb and the broker.
pub async fn freshness(
    sysdb: &Sysdb,
    settings: &ClientSettings,
    topic: &str,
    collection: &str,
) -> Result<Freshness, FreshnessError> {
    let row =
        sysdb.collection(collection).await?.ok_or_else(|| FreshnessError::UnknownCollection(collection.into()))?;
    let state = sysdb.partition_states(topic).await?.into_iter().find(|s| s.partition == row.partition);
    let (next, halted) = state.map(|s| (s.next_offset, s.halted_reason)).unwrap_or((0, None));
    let settings = settings.clone();
    let t = topic.to_string();
    let (p, last) = (row.partition, row.log_position);
    let (high, oldest_waiting_ms, last_ms) =
        tokio::task::spawn_blocking(move || -> Result<(i64, Option<i64>, Option<i64>), KafkaError> {
            let high = MetadataClient::new(&settings, None)?.watermarks(&t, p)?.1;
            let waiting = if high > next {
                timestamp_at(&settings, &t, p, next, TIMESTAMP_WAIT)?.and_then(|(_, ts)| ts)
            } else {
                None
            };
            // The record at `last` may be gone (retention) and the read then finds a
            // later one: only the record itself counts.
            let last = if last >= 0 {
                timestamp_at(&settings, &t, p, last, TIMESTAMP_WAIT)?.filter(|(o, _)| *o == last).and_then(|(_, ts)| ts)
            } else {
                None
            };
            Ok((high, waiting, last))
        })
        .await
        .map_err(|e| KafkaError::Broker { what: "freshness".into(), message: e.to_string() })??;
    let lag_records = high - next;
    let lag_seconds =
        if lag_records <= 0 { Some(0.0) } else { oldest_waiting_ms.map(|ts| ((now_ms() - ts).max(0) as f64) / 1000.0) };
    Ok(Freshness {
        collection: collection.to_string(),
        topic: topic.to_string(),
        partition: p,
        sysdb_next_offset: next,
        high_watermark: high,
        lag_records,
        lag_seconds,
        last_applied_offset: last,
        last_applied_time_ms: last_ms,
        halted,
    })
}
