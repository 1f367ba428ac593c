//! `sluice collections list | freshness`.

use anyhow::Result;
use serde::Serialize;

use super::context::{open_sysdb_read, wait_for_read};
use super::output;
use super::CollectionsCmd;
use crate::config::Config;

#[derive(Serialize)]
struct CollectionView<'a> {
    id: &'a str,
    partition: i32,
    log_position: i64,
    records: i64,
    dimension: Option<u32>,
}

pub async fn run(config: &Config, cmd: CollectionsCmd) -> Result<()> {
    let (read, format) = match cmd {
        CollectionsCmd::List { read, format } => (read, format),
        CollectionsCmd::Freshness { collection, format } => return freshness(config, &collection, format.format).await,
    };
    let sysdb = open_sysdb_read(config).await?;
    wait_for_read(config, &sysdb, &read, None).await?;
    let rows = sysdb.collections().await?;
    let views: Vec<CollectionView<'_>> = rows
        .iter()
        .map(|r| CollectionView {
            id: &r.id,
            partition: r.partition,
            log_position: r.log_position,
            records: r.record_count,
            dimension: r.dimension,
        })
        .collect();
    output::rows(format.format, &views, |views| {
        let mut t = output::table(&["COLLECTION", "PARTITION", "LOG_POSITION", "RECORDS", "DIMENSION"]);
        for v in views {
            t.add_row(vec![
                v.id.to_string(),
                v.partition.to_string(),
                v.log_position.to_string(),
                v.records.to_string(),
                v.dimension.map(|d| d.to_string()).unwrap_or_else(|| "-".into()),
            ]);
        }
        t
    })
}

/// `sluice collections freshness COLL`.
async fn freshness(config: &Config, collection: &str, format: output::Format) -> Result<()> {
    let sysdb = open_sysdb_read(config).await?;
    let f =
        crate::reading::freshness::freshness(&sysdb, &config.client_settings(), &config.kafka.log_topic(), collection)
            .await?;
    output::one(format, &f, || {
        let mut t = output::table(&[
            "COLLECTION",
            "PARTITION",
            "SYSDB_NEXT",
            "HIGH_WATERMARK",
            "LAG",
            "LAG_SECONDS",
            "LAST_APPLIED",
            "LAST_APPLIED_TIME",
            "STATUS",
        ]);
        let time = f.last_applied_time_ms.map(crate::offsets::format_rfc3339_ms).unwrap_or_else(|| "-".into());
        t.add_row(vec![
            f.collection.clone(),
            f.partition.to_string(),
            f.sysdb_next_offset.to_string(),
            f.high_watermark.to_string(),
            f.lag_records.to_string(),
            f.lag_seconds.map(|s| format!("{s:.3}")).unwrap_or_else(|| "-".into()),
            if f.last_applied_offset >= 0 { f.last_applied_offset.to_string() } else { "-".into() },
            time,
            match &f.halted {
                Some(r) => format!("HALTED: {r}"),
                None => "running".into(),
            },
        ]);
        t.trim_fmt().to_string()
    })
}
