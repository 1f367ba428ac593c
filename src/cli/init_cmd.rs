//! `sluice init`: the topics and the sysdb, created or migrated.

use anyhow::{bail, Result};
use serde::Serialize;

use super::context::{open_sysdb, preflight};
use super::output::{self, Format};
use crate::config::Config;
use crate::kafka::cluster::{ensure_topic, TopicOutcome};

#[derive(Serialize)]
struct InitTopic {
    topic: String,
    created: bool,
    partitions: i32,
}

#[derive(Serialize)]
struct InitReport {
    topics: Vec<InitTopic>,
    sysdb: &'static str,
    log_partitions: i32,
}

pub async fn init(config: &Config, partitions: Option<i32>, rf: Option<i32>, format: Format) -> Result<()> {
    preflight(config).await?;
    let settings = config.client_settings();
    let partitions = partitions.unwrap_or(config.kafka.partitions);
    let rf = rf.unwrap_or(config.kafka.replication_factor);
    let log = config.kafka.log_topic();
    let sysdb = open_sysdb(config).await?;
    let mut actual = partitions;
    let mut topics = Vec::new();
    for (topic, n) in
        [(log.clone(), partitions), (config.kafka.backfill_topic(), partitions), (config.kafka.dlq_topic(), partitions)]
    {
        match ensure_topic(&settings, &topic, n, rf, &[]).await? {
            TopicOutcome::Created => topics.push(InitTopic { topic, created: true, partitions: n }),
            TopicOutcome::AlreadyExists { partitions: have } => {
                if topic == log {
                    actual = have;
                }
                topics.push(InitTopic { topic, created: false, partitions: have });
            }
        }
    }
    // The change feed: as many partitions as the log (a change of source partition p goes
    // to partition p), its cleanup policy as configured; its progress topic compacted.
    if config.changelog.enabled {
        let changes = config.changes_topic();
        let progress = config.changes_progress_topic();
        for (topic, policy) in [(changes.clone(), config.changelog.cleanup_policy.as_str()), (progress, "compact")] {
            match ensure_topic(&settings, &topic, actual, rf, &[("cleanup.policy", policy)]).await? {
                TopicOutcome::Created => topics.push(InitTopic { topic, created: true, partitions: actual }),
                TopicOutcome::AlreadyExists { partitions: have } => {
                    if have != actual {
                        bail!("{topic} has {have} partitions but {log} has {actual}: the change feed needs one partition per log partition");
                    }
                    topics.push(InitTopic { topic, created: false, partitions: have });
                }
            }
        }
    }
    if let Some(known) = sysdb.topic_partitions(&log).await? {
        if known != actual {
            bail!("the sysdb records {known} partitions for {log} but the topic has {actual}: collections would move partitions; refusing (partition counts are fixed)");
        }
    }
    sysdb.set_topic_partitions(&log, actual).await?;
    let report = InitReport { topics, sysdb: sysdb.backend(), log_partitions: actual };
    output::one(format, &report, || {
        let mut lines: Vec<String> = report
            .topics
            .iter()
            .map(|t| {
                if t.created {
                    format!("created topic {} ({} partitions, replication factor {rf})", t.topic, t.partitions)
                } else {
                    format!("topic {} exists ({} partitions)", t.topic, t.partitions)
                }
            })
            .collect();
        lines.push(format!("sysdb {} migrated; {log} has {actual} partitions", report.sysdb));
        lines.join("\n")
    })
}
