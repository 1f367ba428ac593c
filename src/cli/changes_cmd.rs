//! `sluice changes snapshot`: ask the change feed for a snapshot of partitions' records
//! (`docs/changes.md` section 2); each partition's relay publishes it.

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::context::open_sysdb;
use super::{output, ChangesCmd};
use crate::config::Config;

pub async fn run(config: &Config, cmd: ChangesCmd) -> Result<()> {
    match cmd {
        ChangesCmd::Snapshot { partition, format } => {
            if !config.changelog.enabled {
                bail!(
                    "the change feed is off ([changelog] enabled = false): no relay would publish a snapshot; \
                     enable it (and run `sluice init`) first"
                );
            }
            let sysdb = open_sysdb(config).await?;
            let topic = config.kafka.log_topic();
            let count = sysdb.topic_partitions(&topic).await?.with_context(|| {
                format!("the sysdb does not know how many partitions {topic} has: run `sluice init`")
            })?;
            let mut partitions = partition;
            if partitions.is_empty() {
                partitions = (0..count).collect();
            }
            if let Some(p) = partitions.iter().find(|p| !(0..count).contains(*p)) {
                bail!("partition {p} does not exist in {topic} (it has partitions 0..{count})");
            }
            partitions.sort_unstable();
            partitions.dedup();
            sysdb.changelog_request_snapshot(&partitions).await?;
            let v = json!({ "topic": config.changes_topic(), "partitions": partitions, "requested": true });
            output::one(format.format, &v, || {
                format!(
                    "snapshot requested for partitions {partitions:?}: each partition's relay publishes its records to {} \
                     as they are now (progress: `sluice offsets show`, changelog_snapshot_pending)",
                    config.changes_topic()
                )
            })
        }
    }
}
