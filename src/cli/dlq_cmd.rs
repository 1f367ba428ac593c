//! `sluice dlq list | replay`.

use anyhow::{Context, Result};

use super::output;
use super::{DlqCmd, DlqFilterArgs};
use crate::config::Config;
use crate::dead_letters::{list, replay, DlqEntryView, DlqFilter, ReplayReport};
use crate::kafka::producer::Producer;
use crate::offsets::{format_rfc3339_ms, parse_rfc3339_ms};

pub async fn run(config: &Config, cmd: DlqCmd) -> Result<()> {
    super::context::preflight(config).await?;
    let sysdb = super::context::open_sysdb(config).await?;
    match cmd {
        DlqCmd::List { filter, format } => {
            let entries = list(config, &sysdb, &filter_of(&filter)?).await?;
            output::listing(format.format, &entries, entries_text)?;
        }
        DlqCmd::Replay { filter, execute, format } => {
            let producer = Producer::new(&config.client_settings(), &[]).context("cannot create the producer")?;
            let report = replay(config, &sysdb, &producer, &filter_of(&filter)?, execute).await?;
            output::one(format.format, &report, || replay_text(&report).trim_end().to_string())?;
        }
    }
    Ok(())
}

fn filter_of(a: &DlqFilterArgs) -> Result<DlqFilter> {
    Ok(DlqFilter {
        kind: a.kind.clone(),
        collection: a.collection.clone(),
        since_ms: a.since.as_deref().map(parse_rfc3339_ms).transpose().map_err(anyhow::Error::msg)?,
        limit: a.limit,
    })
}

pub fn entries_text(entries: &[DlqEntryView]) -> String {
    use std::fmt::Write as _;
    let mut s = format!(
        "{:<14} {:<16} {:<26} {:<24} {:<24} {:<14} MESSAGE\n",
        "DLQ", "SOURCE", "KIND", "COLLECTION", "TIME", "REPLAYED_TO"
    );
    for e in entries {
        let _ = writeln!(
            s,
            "{:<14} {:<16} {:<26} {:<24} {:<24} {:<14} {}",
            format!("{}/{}", e.dlq_partition, e.dlq_offset),
            format!(
                "{}/{}",
                e.source_partition.map(|p| p.to_string()).unwrap_or_else(|| "?".into()),
                e.source_offset.map(|o| o.to_string()).unwrap_or_else(|| "?".into())
            ),
            e.kind,
            e.collection.as_deref().unwrap_or("-"),
            e.timestamp_ms.map(format_rfc3339_ms).unwrap_or_else(|| "-".into()),
            e.replayed_to.map(|r| format!("{}/{}", r.partition, r.offset)).unwrap_or_else(|| "-".into()),
            e.message.replace(['\n', '\r'], " ")
        );
    }
    s
}

pub fn replay_text(r: &ReplayReport) -> String {
    let mut s = String::new();
    if r.executed {
        s.push_str(&format!("replayed {} entries into the log\n", r.entries.len()));
    } else {
        s.push_str(&format!(
            "dry run: {} entries would be replayed (run again with --execute to produce them)\n",
            r.entries.len()
        ));
    }
    s.push_str(&entries_text(&r.entries));
    for (what, list) in [
        ("already replayed (skipped)", &r.already_replayed),
        ("duplicates of an earlier DLQ entry of the same source record (skipped)", &r.duplicates),
        ("without a payload in the DLQ (skipped; replay them from their source offset)", &r.not_replayable),
    ] {
        if !list.is_empty() {
            s.push_str(&format!(
                "{} {what}: {}\n",
                list.len(),
                list.iter().map(|e| format!("{}/{}", e.dlq_partition, e.dlq_offset)).collect::<Vec<_>>().join(", ")
            ));
        }
    }
    s
}
