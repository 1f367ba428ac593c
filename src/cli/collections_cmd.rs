//! `sluice collections list | show`.

use anyhow::Result;
use serde::Serialize;

use super::context::open_sysdb_read;
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
    let CollectionsCmd::List { format } = cmd;
    let sysdb = open_sysdb_read(config).await?;
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
