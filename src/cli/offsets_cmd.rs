//! `sluice offsets show | reconcile | reset | history | wait`.

use anyhow::{bail, Result};
use tracing::info;

use super::context::{open_sysdb, open_sysdb_read};
use super::output;
use super::{FormatArg, OffsetsCmd, ResetArgs};
use crate::config::Config;
use crate::kafka::cluster::MetadataClient;
use crate::offsets::offset_rows;
use crate::offsets::{
    format_rfc3339_ms, history, lagging, parse_duration, parse_rfc3339_ms, reset, wait_caught_up, HistoryEntry,
    OffsetRow, PartitionSelection, ResetReport, ResetRequest, ResetTarget,
};
use crate::sysdb::Sysdb;
use serde_json::json;

pub async fn run(config: &Config, cmd: OffsetsCmd) -> Result<()> {
    let topic = config.kafka.log_topic();
    match cmd {
        OffsetsCmd::Show { format } => {
            let sysdb = open_sysdb_read(config).await?;
            let rows = offset_rows(config, &sysdb).await?;
            output::rows(format.format, &rows, |rows| {
                let mut header = vec!["TOPIC", "PARTITION", "SYSDB_NEXT", "GROUP", "HIGH_WATERMARK", "LAG", "STATUS"];
                if config.changelog.enabled {
                    header.extend(["CHANGES_PUBLISHED", "CHANGES_PENDING"]);
                }
                let mut t = output::table(&header);
                let o = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
                for r in rows {
                    // A reason is one line in the table (the JSON keeps it whole).
                    let mut row = vec![
                        r.topic.clone(),
                        r.partition.to_string(),
                        o(r.sysdb_next_offset),
                        o(r.group_offset),
                        r.high_watermark.to_string(),
                        r.lag.to_string(),
                        r.status.replace(['\n', '\r'], " "),
                    ];
                    if let Some(c) = &r.changelog {
                        row.push(c.changelog_published_seq.to_string());
                        row.push(c.changelog_unpublished.to_string());
                    }
                    t.add_row(row);
                }
                t
            })?;
        }
        OffsetsCmd::Reconcile { format } => {
            let sysdb = open_sysdb_read(config).await?;
            let positions: Vec<(i32, i64)> = sysdb.positions(&topic).await?.into_iter().collect();
            let settings = config.client_settings();
            let group = config.kafka.group.clone();
            let t = topic.clone();
            let n = positions.len();
            let pushed = positions.clone();
            tokio::task::spawn_blocking(move || {
                MetadataClient::new(&settings, Some(&group))?.commit_group_offsets(&t, &positions)
            })
            .await??;
            let v = json!({
                "group": config.kafka.group,
                "topic": topic,
                "positions": pushed.iter().map(|(p, o)| json!({"partition": p, "next_offset": o})).collect::<Vec<_>>(),
            });
            output::one(format.format, &v, || format!("pushed {n} sysdb positions into group {}", config.kafka.group))?;
        }
        other => {
            // A reset writes (and may migrate); history and wait only read.
            let sysdb = match &other {
                OffsetsCmd::Reset(_) => open_sysdb(config).await?,
                _ => open_sysdb_read(config).await?,
            };
            return run_on(config, &sysdb, other).await;
        }
    }
    Ok(())
}

/// The subcommands that take an open sysdb (reset writes, history and wait read).
async fn run_on(config: &Config, sysdb: &Sysdb, cmd: OffsetsCmd) -> Result<()> {
    match cmd {
        OffsetsCmd::Reset(args) => reset_cmd(config, sysdb, args).await,
        OffsetsCmd::History { format } => history_cmd(config, sysdb, format).await,
        OffsetsCmd::Wait { timeout, format } => wait_cmd(config, sysdb, &timeout, format).await,
        OffsetsCmd::Show { .. } | OffsetsCmd::Reconcile { .. } => unreachable!("handled by run"),
    }
}

/// Who is recorded in the audit row.
fn actor() -> String {
    std::env::var("USER").or_else(|_| std::env::var("LOGNAME")).unwrap_or_else(|_| "unknown".into())
}

/// The request a command line asks for.
pub fn reset_request(args: &ResetArgs, actor: &str) -> Result<ResetRequest> {
    let target = match (&args.to, args.to_earliest, args.to_latest, &args.to_datetime, &args.shift_by) {
        (Some(n), ..) => ResetTarget::To(*n),
        (_, true, ..) => ResetTarget::Earliest,
        (_, _, true, ..) => ResetTarget::Latest,
        (_, _, _, Some(t), _) => ResetTarget::Datetime(parse_rfc3339_ms(t).map_err(anyhow::Error::msg)?),
        (_, _, _, _, Some(d)) => ResetTarget::ShiftBy(*d),
        _ => bail!("give one target: --to N, --to-earliest, --to-latest, --to-datetime T or --shift-by N"),
    };
    let partitions =
        if args.all_partitions { PartitionSelection::All } else { PartitionSelection::List(args.partition.clone()) };
    let execute = if args.execute {
        match args.reason.as_deref().map(str::trim) {
            Some(r) if !r.is_empty() => Some((actor.to_string(), r.to_string())),
            _ => bail!("--execute needs --reason TEXT (it is audited with the reset)"),
        }
    } else {
        None
    };
    Ok(ResetRequest { partitions, target, clamp: args.clamp, force: args.force, execute })
}

async fn reset_cmd(config: &Config, sysdb: &Sysdb, args: ResetArgs) -> Result<()> {
    let req = reset_request(&args, &actor())?;
    let report = reset(config, sysdb, &req).await?;
    if report.executed {
        for r in &report.rows {
            info!(partition = r.partition, from = ?r.sysdb_next_offset, to = r.target, "sysdb position reset");
        }
    }
    output::one(args.format.format, &report, || reset_text(&report).trim_end().to_string())?;
    if report.group_committed == Some(false) {
        eprintln!(
            "warning: the sysdb positions moved but the group offsets were not committed ({}); \
             the processors start from the sysdb positions, `sluice offsets reconcile` pushes them into the group once it is empty",
            report.group_error.as_deref().unwrap_or("unknown error")
        );
    }
    Ok(())
}

fn opt(v: Option<i64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// The plan (or what was done) as a table.
pub fn reset_text(r: &ResetReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{} reset of {} (group {}, {}{})",
        if r.executed { "executed" } else { "dry run:" },
        r.topic,
        r.group,
        r.group_state,
        if r.active_members.is_empty() {
            String::new()
        } else {
            format!(
                ", active members: {}",
                r.active_members.iter().map(|m| format!("{} ({})", m.id, m.host)).collect::<Vec<_>>().join(", ")
            )
        }
    );
    let _ = writeln!(
        s,
        "{:>9} {:>12} {:>12} {:>12} {:>12} {:>14}",
        "PARTITION",
        if r.executed { "SYSDB_WAS" } else { "SYSDB_NEXT" },
        "GROUP",
        "TARGET",
        "LOG_START",
        "HIGH_WATERMARK"
    );
    for row in &r.rows {
        let target = if row.clamped {
            format!("{} (clamped from {})", row.target, row.requested)
        } else {
            row.target.to_string()
        };
        let _ = writeln!(
            s,
            "{:>9} {:>12} {:>12} {:>12} {:>12} {:>14}",
            row.partition,
            opt(row.sysdb_next_offset),
            opt(row.group_offset),
            target,
            row.log_start,
            row.high_watermark
        );
    }
    if !r.executed {
        let _ = writeln!(s, "nothing changed; run again with --execute --reason TEXT to apply");
        return s;
    }
    for row in &r.rows {
        let _ = writeln!(
            s,
            "partition {}: sysdb next_offset {} -> {} (audited)",
            row.partition,
            row.sysdb_next_offset.map(|p| p.to_string()).unwrap_or_else(|| "none".into()),
            row.target
        );
    }
    if r.group_committed == Some(true) {
        let _ = writeln!(s, "group offsets committed");
    }
    s
}

async fn history_cmd(config: &Config, sysdb: &Sysdb, format: FormatArg) -> Result<()> {
    let entries = history(config, sysdb).await?;
    output::listing(format.format, &entries, history_text)
}

pub fn history_text(entries: &[HistoryEntry]) -> String {
    use std::fmt::Write as _;
    let mut s =
        format!("{:<24} {:<5} {:>9} {:>12} {:>12}  {:<12} REASON\n", "AT", "KIND", "PARTITION", "FROM", "TO", "WHO");
    for e in entries {
        let _ = match e {
            HistoryEntry::Reset { partition, at_ms, actor, reason, from_offset, to_offset } => writeln!(
                s,
                "{:<24} {:<5} {:>9} {:>12} {:>12}  {:<12} {}",
                format_rfc3339_ms(*at_ms),
                "reset",
                partition,
                opt(*from_offset),
                to_offset,
                actor,
                reason.replace(['\n', '\r'], " ")
            ),
            HistoryEntry::Gap { partition, at_ms, from_offset, to_offset } => writeln!(
                s,
                "{:<24} {:<5} {:>9} {:>12} {:>12}  {:<12} data loss: offsets {from_offset}..{to_offset} were gone",
                format_rfc3339_ms(*at_ms),
                "gap",
                partition,
                from_offset,
                to_offset,
                "-"
            ),
        };
    }
    s
}

async fn wait_cmd(config: &Config, sysdb: &Sysdb, timeout: &str, format: FormatArg) -> Result<()> {
    let timeout = parse_duration(timeout).map_err(anyhow::Error::msg)?;
    let every = std::time::Duration::from_millis(500).min(timeout.max(std::time::Duration::from_millis(50)));
    match wait_caught_up(config, sysdb, timeout, every).await? {
        Ok(rows) => {
            output::listing(format.format, &rows, |rows| format!("caught up: {} partitions, lag 0", rows.len()))
        }
        Err(rows) => {
            let lag: Vec<&OffsetRow> = lagging(&rows);
            output::listing(format.format, &lag, |lag| {
                lag.iter()
                    .map(|r| {
                        format!(
                            "partition {}: lag {} (sysdb next {}, high watermark {}, {})\n",
                            r.partition,
                            r.lag,
                            opt(r.sysdb_next_offset),
                            r.high_watermark,
                            r.status
                        )
                    })
                    .collect()
            })?;
            bail!(
                "{} of {} partitions still lag after {timeout:?}: {}",
                lag.len(),
                rows.len(),
                lag.iter().map(|r| format!("{}/{} lag {}", r.topic, r.partition, r.lag)).collect::<Vec<_>>().join(", ")
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::offsets::partition_status;

    #[test]
    fn partition_status_names_the_halt_reason() {
        assert_eq!(partition_status(None), "running");
        assert_eq!(partition_status(Some("record refused at offset 7")), "halted: record refused at offset 7");
    }
}
