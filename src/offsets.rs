//! The positions report of `sluice offsets show` and the admin API: per partition, the
//! sysdb position (authoritative), the group offset (lagging), the high watermark, the lag
//! and whether the partition is halted and why. Also the operator's tools on positions:
//! `offsets reset` (planned and validated, a dry run unless executed), `offsets history`
//! (resets and recorded gaps) and `offsets wait` (until no partition lags).

use crate::config::Config;
use crate::kafka::cluster::MetadataClient;
use crate::kafka::KafkaError;
use crate::sysdb::{Sysdb, SysdbError};

/// Why the report could not be read.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// A reset request refused before anything was written.
    #[error(transparent)]
    Refused(ResetRefusal),
    /// A malformed request.
    #[error("{0}")]
    Invalid(String),
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
    /// With the change feed on (`docs/changes.md`): the partition's feed position.
    #[serde(skip_serializing_if = "Option::is_none", flatten)]
    pub changelog: Option<ChangelogColumns>,
}

/// A partition's change feed position in `offsets show`.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct ChangelogColumns {
    /// The last outbox sequence number the relay committed to Kafka (`-1`: none yet), as
    /// it told the sysdb after the commit.
    pub changelog_published_seq: i64,
    /// Changes in the outbox not published yet.
    pub changelog_unpublished: i64,
    /// When the oldest of them was committed (ms since the Unix epoch); null when none.
    pub changelog_oldest_unpublished_ms: Option<i64>,
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
    let settings = config.client_settings();
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
    let changelog: std::collections::HashMap<i32, crate::sysdb::ChangelogPosition> = if config.changelog.enabled {
        sysdb.changelog_positions().await?.into_iter().map(|c| (c.partition, c)).collect()
    } else {
        std::collections::HashMap::new()
    };
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
                changelog: config.changelog.enabled.then(|| match changelog.get(&p) {
                    Some(c) => ChangelogColumns {
                        changelog_published_seq: c.published_seq,
                        changelog_unpublished: (c.next_seq - 1 - c.published_seq).max(0),
                        changelog_oldest_unpublished_ms: c.oldest_unpublished_ms,
                    },
                    None => ChangelogColumns {
                        changelog_published_seq: -1,
                        changelog_unpublished: 0,
                        changelog_oldest_unpublished_ms: None,
                    },
                }),
            }
        })
        .collect())
}

/// Where `offsets reset` moves each chosen partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetTarget {
    /// An explicit offset (the next record to read).
    To(i64),
    /// The log start (first offset still stored).
    Earliest,
    /// The high watermark (skip everything stored).
    Latest,
    /// The first offset whose timestamp is at or after this time (ms since the Unix
    /// epoch); the high watermark when no record is that recent.
    Datetime(i64),
    /// The current position (sysdb, else the group offset) plus this (may be negative).
    ShiftBy(i64),
}

/// Which partitions `offsets reset` touches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PartitionSelection {
    List(Vec<i32>),
    All,
}

/// An `offsets reset` request. Nothing is written unless `execute` is set.
#[derive(Debug, Clone)]
pub struct ResetRequest {
    pub partitions: PartitionSelection,
    pub target: ResetTarget,
    /// Move a target outside `[log start, high watermark]` to the nearest bound instead of
    /// refusing it.
    pub clamp: bool,
    /// Reset even though the consumer group has active members.
    pub force: bool,
    /// `Some((actor, reason))` to write; `None` is a dry run.
    pub execute: Option<(String, String)>,
}

/// One partition of a reset plan.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ResetPlanRow {
    pub partition: i32,
    pub sysdb_next_offset: Option<i64>,
    pub group_offset: Option<i64>,
    /// What the target asked for, before clamping.
    pub requested: i64,
    /// Where the partition goes.
    pub target: i64,
    pub clamped: bool,
    pub log_start: i64,
    pub high_watermark: i64,
}

/// What `offsets reset` would do (a dry run) or did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ResetReport {
    pub topic: String,
    pub group: String,
    pub group_state: String,
    /// Active members of the group when the plan was made.
    pub active_members: Vec<crate::kafka::cluster::GroupMember>,
    pub executed: bool,
    pub rows: Vec<ResetPlanRow>,
    /// After an executed reset: whether the group offsets were committed, and if not why
    /// (the sysdb positions moved in any case; the group offset only lags).
    pub group_committed: Option<bool>,
    pub group_error: Option<String>,
}

/// Why a reset request is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResetRefusal {
    #[error("topic {0} does not exist (run `sluice init`, or check --topic-prefix)")]
    UnknownTopic(String),
    #[error("partition {partition} does not exist in {topic} (it has partitions 0..{count})")]
    UnknownPartition { topic: String, partition: i32, count: i32 },
    #[error("no partition chosen: give --partition P (repeatable) or --all-partitions")]
    NoPartitions,
    #[error(
        "partition {partition}: target {target} is outside [log start {low}, high watermark {high}]; \
         choose another target or clamp it to the nearest bound (--clamp)"
    )]
    OutOfRange { partition: i32, target: i64, low: i64, high: i64 },
    #[error("partition {partition}: no sysdb position and no group offset to shift from")]
    NothingToShift { partition: i32 },
    #[error(
        "consumer group {group} has {} active member(s): {}; stop them first or pass --force \
         (the processors would then adopt the new sysdb positions on their next commit, and the group \
         offset commit is refused by the broker while they are members)",
        members.len(),
        members.iter().map(|m| format!("{} ({} on {})", m.id, m.client_id, m.host)).collect::<Vec<_>>().join(", ")
    )]
    ActiveMembers { group: String, members: Vec<crate::kafka::cluster::GroupMember> },
    #[error("a reason is required to execute a reset (--reason TEXT)")]
    NoReason,
}

impl From<ResetRefusal> for OffsetsError {
    fn from(r: ResetRefusal) -> Self {
        OffsetsError::Refused(r)
    }
}

/// Where `requested` lands within `[low, high]`: `Ok((target, clamped))`, or the refusal
/// when it is outside and `clamp` is off.
pub fn clamp_target(
    partition: i32,
    requested: i64,
    low: i64,
    high: i64,
    clamp: bool,
) -> Result<(i64, bool), ResetRefusal> {
    if (low..=high).contains(&requested) {
        Ok((requested, false))
    } else if clamp {
        Ok((requested.clamp(low, high), true))
    } else {
        Err(ResetRefusal::OutOfRange { partition, target: requested, low, high })
    }
}

struct KafkaView {
    group: crate::kafka::cluster::GroupDescription,
    group_offsets: std::collections::HashMap<i32, i64>,
    marks: Vec<(i64, i64)>,
    by_time: std::collections::HashMap<i32, Option<i64>>,
}

/// Plan a reset (validated against the topic, its watermarks and the group) and, when
/// asked, execute it: per partition the sysdb position and its audit row in one
/// transaction, then the group offsets committed from outside the group.
pub async fn reset(config: &Config, sysdb: &Sysdb, req: &ResetRequest) -> Result<ResetReport, OffsetsError> {
    if let Some((_, reason)) = &req.execute {
        if reason.trim().is_empty() {
            return Err(ResetRefusal::NoReason.into());
        }
    }
    if let ResetTarget::To(n) = req.target {
        if n < 0 {
            return Err(OffsetsError::Invalid(format!(
                "--to must be >= 0 (a Kafka offset: the next record to read), not {n}"
            )));
        }
    }
    let topic = config.kafka.log_topic();
    let settings = config.client_settings();
    let group = config.kafka.group.clone();
    let (t, g, sel, target) = (topic.clone(), group.clone(), req.partitions.clone(), req.target);
    let view =
        tokio::task::spawn_blocking(move || -> Result<Result<(Vec<i32>, KafkaView), ResetRefusal>, KafkaError> {
            let md = MetadataClient::new(&settings, Some(&g))?;
            let Some(count) = md.topic_partitions(&t)? else {
                return Ok(Err(ResetRefusal::UnknownTopic(t)));
            };
            let chosen: Vec<i32> = match sel {
                PartitionSelection::All => (0..count).collect(),
                PartitionSelection::List(ps) => {
                    if ps.is_empty() {
                        return Ok(Err(ResetRefusal::NoPartitions));
                    }
                    if let Some(&p) = ps.iter().find(|p| !(0..count).contains(*p)) {
                        return Ok(Err(ResetRefusal::UnknownPartition { topic: t, partition: p, count }));
                    }
                    let mut ps = ps;
                    ps.sort_unstable();
                    ps.dedup();
                    ps
                }
            };
            let group = md.describe_group(&g)?;
            let group_offsets = md.group_offsets(&t, &chosen)?;
            let marks = chosen.iter().map(|p| md.watermarks(&t, *p)).collect::<Result<Vec<_>, _>>()?;
            let by_time = match target {
                ResetTarget::Datetime(ms) => md.offsets_for_time(&t, &chosen, ms)?,
                _ => Default::default(),
            };
            Ok(Ok((chosen, KafkaView { group, group_offsets, marks, by_time })))
        })
        .await
        .map_err(|e| OffsetsError::Kafka(KafkaError::Config(format!("offset query task failed: {e}"))))??;
    let (chosen, view) = view?;
    let positions = sysdb.positions(&topic).await?;
    let mut rows = Vec::with_capacity(chosen.len());
    for (i, &p) in chosen.iter().enumerate() {
        let (low, high) = view.marks[i];
        let sysdb_next = positions.get(&p).copied();
        let group_offset = view.group_offsets.get(&p).copied();
        let requested = match req.target {
            ResetTarget::To(n) => n,
            ResetTarget::Earliest => low,
            ResetTarget::Latest => high,
            ResetTarget::Datetime(_) => view.by_time.get(&p).copied().flatten().unwrap_or(high),
            ResetTarget::ShiftBy(d) => match sysdb_next.or(group_offset) {
                Some(cur) => cur.saturating_add(d),
                None => return Err(ResetRefusal::NothingToShift { partition: p }.into()),
            },
        };
        let (target, clamped) = clamp_target(p, requested, low, high, req.clamp)?;
        rows.push(ResetPlanRow {
            partition: p,
            sysdb_next_offset: sysdb_next,
            group_offset,
            requested,
            target,
            clamped,
            log_start: low,
            high_watermark: high,
        });
    }
    let mut report = ResetReport {
        topic: topic.clone(),
        group: group.clone(),
        group_state: view.group.state.clone(),
        active_members: view.group.members.clone(),
        executed: false,
        rows,
        group_committed: None,
        group_error: None,
    };
    let Some((actor, reason)) = &req.execute else {
        return Ok(report);
    };
    if !report.active_members.is_empty() && !req.force {
        return Err(ResetRefusal::ActiveMembers { group, members: report.active_members }.into());
    }
    // The sysdb first: it is authoritative, and each partition's move and its audit row
    // commit together.
    for row in &mut report.rows {
        let previous = sysdb.reset_position(&topic, row.partition, row.target, actor, reason).await?;
        row.sysdb_next_offset = previous;
    }
    report.executed = true;
    // Then the group offsets, so that tools reading the group agree; a failure leaves
    // them lagging (the processor starts from the sysdb position anyway).
    let settings = config.client_settings();
    let offsets: Vec<(i32, i64)> = report.rows.iter().map(|r| (r.partition, r.target)).collect();
    let g = group.clone();
    let committed = tokio::task::spawn_blocking(move || {
        MetadataClient::new(&settings, Some(&g))?.commit_group_offsets(&topic, &offsets)
    })
    .await
    .map_err(|e| KafkaError::Config(format!("group commit task failed: {e}")))
    .and_then(|r| r);
    match committed {
        Ok(()) => report.group_committed = Some(true),
        Err(e) => {
            report.group_committed = Some(false);
            report.group_error = Some(e.to_string());
        }
    }
    Ok(report)
}

/// One entry of `offsets history`: an operator reset or a recorded data-loss gap.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum HistoryEntry {
    Reset { partition: i32, at_ms: i64, actor: String, reason: String, from_offset: Option<i64>, to_offset: i64 },
    Gap { partition: i32, at_ms: i64, from_offset: i64, to_offset: i64 },
}

impl HistoryEntry {
    pub fn at_ms(&self) -> i64 {
        match self {
            HistoryEntry::Reset { at_ms, .. } | HistoryEntry::Gap { at_ms, .. } => *at_ms,
        }
    }
}

/// Resets and gaps of the log topic, oldest first (resets before gaps at the same ms).
pub async fn history(config: &Config, sysdb: &Sysdb) -> Result<Vec<HistoryEntry>, OffsetsError> {
    let topic = config.kafka.log_topic();
    let mut out: Vec<HistoryEntry> = sysdb
        .resets(&topic)
        .await?
        .into_iter()
        .map(|r| HistoryEntry::Reset {
            partition: r.partition,
            at_ms: r.at_ms,
            actor: r.actor,
            reason: r.reason,
            from_offset: r.from_offset,
            to_offset: r.to_offset,
        })
        .collect();
    out.extend(sysdb.gaps(&topic).await?.into_iter().map(|g| HistoryEntry::Gap {
        partition: g.partition,
        at_ms: g.recorded_at_ms,
        from_offset: g.from_offset,
        to_offset: g.to_offset,
    }));
    // Stable: each source is in insertion order already.
    out.sort_by_key(HistoryEntry::at_ms);
    Ok(out)
}

/// The partitions that still lag (`lag > 0`, as `offsets show` computes it).
pub fn lagging(rows: &[OffsetRow]) -> Vec<&OffsetRow> {
    rows.iter().filter(|r| r.lag != 0).collect()
}

/// Poll the positions until no partition lags (`Ok(rows)`) or `timeout` passes
/// (`Err(rows)` with the last rows read).
pub async fn wait_caught_up(
    config: &Config,
    sysdb: &Sysdb,
    timeout: std::time::Duration,
    every: std::time::Duration,
) -> Result<Result<Vec<OffsetRow>, Vec<OffsetRow>>, OffsetsError> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let rows = offset_rows(config, sysdb).await?;
        if lagging(&rows).is_empty() {
            return Ok(Ok(rows));
        }
        if tokio::time::Instant::now() + every > deadline {
            return Ok(Err(rows));
        }
        tokio::time::sleep(every).await;
    }
}

/// Milliseconds since the Unix epoch of an RFC 3339 date-time
/// (`2026-12-01T18:00:00Z`, `2026-12-01T20:00:00.5+02:00`; `t`/`z` and a space for `T`
/// accepted).
pub fn parse_rfc3339_ms(s: &str) -> Result<i64, String> {
    let bad = || format!("{s:?} is not an RFC 3339 date-time such as 2026-12-01T18:00:00Z");
    let b = s.trim().as_bytes();
    if b.len() < 20 {
        return Err(bad());
    }
    let num = |r: std::ops::Range<usize>| -> Result<i64, String> {
        let part = b.get(r).ok_or_else(bad)?;
        if part.iter().all(u8::is_ascii_digit) {
            Ok(part.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')))
        } else {
            Err(bad())
        }
    };
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    if b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') || b[13] != b':' || b[16] != b':' {
        return Err(bad());
    }
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || day < 1
        || day > days_in_month(year, month)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return Err(bad());
    }
    let mut i = 19;
    let mut millis = 0i64;
    if b[i] == b'.' {
        let start = i + 1;
        i = start;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        if i == start {
            return Err(bad());
        }
        let frac = &b[start..i.min(start + 3)];
        millis = frac.iter().fold(0i64, |n, d| n * 10 + i64::from(d - b'0')) * 10i64.pow(3 - frac.len() as u32);
    }
    let offset_min = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(sign @ (b'+' | b'-')) if i + 6 == b.len() && b[i + 3] == b':' => {
            let (h, m) = (num(i + 1..i + 3)?, num(i + 4..i + 6)?);
            if h > 23 || m > 59 {
                return Err(bad());
            }
            if *sign == b'+' {
                h * 60 + m
            } else {
                -(h * 60 + m)
            }
        }
        _ => return Err(bad()),
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second.min(59) - offset_min * 60;
    Ok(secs * 1000 + millis)
}

/// `2026-12-01T18:00:00.000Z` for milliseconds since the Unix epoch.
pub fn format_rfc3339_ms(ms: i64) -> String {
    let days = ms.div_euclid(86_400_000);
    let rest = ms.rem_euclid(86_400_000);
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{:03}Z",
        rest / 3_600_000,
        rest / 60_000 % 60,
        rest / 1000 % 60,
        rest % 1000
    )
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

// Howard Hinnant's days_from_civil / civil_from_days (proleptic Gregorian calendar).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn civil_from_days(z: i64) -> (i64, i64, i64) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    (if m <= 2 { yoe + era * 400 + 1 } else { yoe + era * 400 }, m, d)
}

/// A duration such as `30s`, `5m`, `1h`, `250ms`, or a bare number of seconds.
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n.parse().map_err(|_| format!("{s:?} is not a duration such as 30s, 5m, 250ms"))?;
    let ms = match unit {
        "" | "s" => n.checked_mul(1000),
        "ms" => Some(n),
        "m" => n.checked_mul(60_000),
        "h" => n.checked_mul(3_600_000),
        _ => None,
    }
    .ok_or_else(|| format!("{s:?} is not a duration such as 30s, 5m, 250ms"))?;
    Ok(std::time::Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_round_trips_and_honours_offsets() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00Z"), Ok(0));
        assert_eq!(parse_rfc3339_ms("2026-12-01T18:25:10.123Z"), Ok(1_796_149_510_123));
        assert_eq!(parse_rfc3339_ms("2026-12-01T20:25:10.123456+02:00"), Ok(1_796_149_510_123));
        assert_eq!(parse_rfc3339_ms("2026-12-01T16:25:10.1-02:00"), Ok(1_796_149_510_100));
        assert_eq!(
            parse_rfc3339_ms("2024-02-29T00:00:00Z").map(format_rfc3339_ms).as_deref(),
            Ok("2024-02-29T00:00:00.000Z")
        );
        assert_eq!(format_rfc3339_ms(1_796_149_510_123), "2026-12-01T18:25:10.123Z");
        for bad in [
            "2026-12-01",
            "2026-12-01T18:25:10",
            "2026-13-01T00:00:00Z",
            "2025-02-29T00:00:00Z",
            "yesterday",
            "2026-12-01T18:25:10+2",
        ] {
            assert!(parse_rfc3339_ms(bad).is_err(), "{bad} accepted");
        }
    }

    #[test]
    fn targets_outside_the_log_are_refused_unless_clamped() {
        assert_eq!(clamp_target(0, 5, 2, 9, false), Ok((5, false)));
        assert_eq!(clamp_target(0, 2, 2, 9, false), Ok((2, false)));
        assert_eq!(clamp_target(0, 9, 2, 9, false), Ok((9, false)));
        assert_eq!(
            clamp_target(3, 10, 2, 9, false),
            Err(ResetRefusal::OutOfRange { partition: 3, target: 10, low: 2, high: 9 })
        );
        assert!(clamp_target(3, 1, 2, 9, false).is_err());
        assert_eq!(clamp_target(3, 1_000_000, 2, 9, true), Ok((9, true)));
        assert_eq!(clamp_target(3, -4, 2, 9, true), Ok((2, true)));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(std::time::Duration::from_secs(30)));
        assert_eq!(parse_duration("7"), Ok(std::time::Duration::from_secs(7)));
        assert_eq!(parse_duration("250ms"), Ok(std::time::Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(std::time::Duration::from_secs(120)));
        assert!(parse_duration("2 weeks").is_err());
        assert!(parse_duration("s").is_err());
    }
}
