//! DLQ redrive: `sluice dlq list` and `sluice dlq replay` (and the admin API's `/dlq`).
//!
//! The DLQ topic is read from its log start to its high watermark with a plain assigned
//! consumer ([`crate::kafka::dlq_reader::read_all`]). A replay re-produces an entry's original
//! key and payload into the log topic (the same key, so the partitioner picks the same
//! partition) with provenance headers, waits for the broker's acknowledgement, and then
//! records the entry in the sysdb (`dlq_replays`); entries recorded there are skipped, so
//! replaying twice does not duplicate.
//!
//! The one window left: a crash (or a sysdb failure) after the acknowledgement and before
//! the sysdb row means the next replay produces that entry again, and the record is then
//! applied twice, once per copy. A second add of an id is ignored (it exists), and an
//! upsert, update or delete repeated with nothing of that id in between leaves the same
//! state; only a write to the same id between the two copies is undone by the second
//! copy. Each copy carries
//! `sluice.replayed-from`, so an operator can find both in the log. The window is one
//! produce wide per entry; closing it would need the produce and the row in one
//! transaction across Kafka and the sysdb, which this tool does not have.
//!
//! The processor can put the same source record into the DLQ twice (it is at-least-once):
//! entries are deduplicated by their source (topic, partition, offset), and only the
//! first is replayed.

use std::collections::{HashMap, HashSet};

use crate::config::Config;
use crate::kafka::dlq_reader::{self as kdlq, DlqMessage};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::KafkaError;
use crate::sysdb::{now_ms, DlqReplayRow, Sysdb, SysdbError};

/// Why a DLQ command failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum DlqError {
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    /// The entry was produced into the log but could not be recorded: replaying again
    /// before fixing the sysdb would produce it once more.
    #[error(
        "DLQ entry {dlq_partition}/{dlq_offset} was replayed to {log_partition}/{log_offset} but the sysdb did not \
         record it ({error}); fix the sysdb before replaying again, or that entry is produced twice"
    )]
    Unrecorded { dlq_partition: i32, dlq_offset: i64, log_partition: i32, log_offset: i64, error: SysdbError },
}

/// Which entries a list or a replay takes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct DlqFilter {
    pub kind: Option<String>,
    pub collection: Option<String>,
    /// Entries produced at or after this time (ms since the Unix epoch).
    pub since_ms: Option<i64>,
    /// At most this many entries (the first ones).
    pub limit: Option<usize>,
}

/// A DLQ entry as listed.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DlqEntryView {
    pub dlq_partition: i32,
    pub dlq_offset: i64,
    /// When the processor produced the entry (ms since the Unix epoch).
    pub timestamp_ms: Option<i64>,
    pub source_topic: Option<String>,
    pub source_partition: Option<i32>,
    pub source_offset: Option<i64>,
    pub kind: String,
    pub message: String,
    /// The record's key (the collection id, for keyed producers), as text.
    pub collection: Option<String>,
    pub payload_bytes: usize,
    /// The DLQ holds no payload (it was too large for the DLQ topic): not replayable here.
    pub payload_omitted: bool,
    /// Where a replay put it in the log, if it was replayed.
    pub replayed_to: Option<ReplayedTo>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct ReplayedTo {
    pub partition: i32,
    pub offset: i64,
    pub at_ms: i64,
}

impl DlqEntryView {
    fn from_message(m: &DlqMessage, replayed: Option<ReplayedTo>) -> DlqEntryView {
        let h = |k: &str| m.headers.get(k).cloned();
        DlqEntryView {
            dlq_partition: m.partition,
            dlq_offset: m.offset,
            timestamp_ms: m.timestamp_ms,
            source_topic: h(kdlq::SOURCE_TOPIC),
            source_partition: h(kdlq::SOURCE_PARTITION).and_then(|v| v.parse().ok()),
            source_offset: h(kdlq::SOURCE_OFFSET).and_then(|v| v.parse().ok()),
            kind: h(kdlq::ERROR_KIND).unwrap_or_default(),
            message: h(kdlq::ERROR_MESSAGE).unwrap_or_default(),
            collection: m.key.as_deref().map(|k| String::from_utf8_lossy(k).into_owned()),
            payload_bytes: m.payload.len(),
            payload_omitted: m.headers.contains_key(kdlq::PAYLOAD_OMITTED),
            replayed_to: replayed,
        }
    }

    fn matches(&self, f: &DlqFilter) -> bool {
        f.kind.as_deref().is_none_or(|k| self.kind == k)
            && f.collection.as_deref().is_none_or(|c| self.collection.as_deref() == Some(c))
            && f.since_ms.is_none_or(|t| self.timestamp_ms.is_some_and(|ts| ts >= t))
    }
}

/// How long reading the DLQ may take.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(120);

async fn read(config: &Config) -> Result<Vec<DlqMessage>, DlqError> {
    let settings = config.client_settings();
    let topic = config.kafka.dlq_topic();
    Ok(tokio::task::spawn_blocking(move || kdlq::read_all(&settings, &topic, READ_TIMEOUT))
        .await
        .map_err(|e| KafkaError::Config(format!("DLQ read task failed: {e}")))??)
}

async fn replays(config: &Config, sysdb: &Sysdb) -> Result<HashMap<(i32, i64), ReplayedTo>, DlqError> {
    Ok(sysdb
        .dlq_replays(&config.kafka.dlq_topic())
        .await?
        .into_iter()
        .map(|r| {
            (
                (r.dlq_partition, r.dlq_offset),
                ReplayedTo { partition: r.log_partition, offset: r.log_offset, at_ms: r.replayed_at_ms },
            )
        })
        .collect())
}

/// The DLQ entries that pass `filter`, in DLQ (partition, offset) order.
pub(crate) async fn list(config: &Config, sysdb: &Sysdb, filter: &DlqFilter) -> Result<Vec<DlqEntryView>, DlqError> {
    let messages = read(config).await?;
    let replayed = replays(config, sysdb).await?;
    let mut out: Vec<DlqEntryView> = messages
        .iter()
        .map(|m| DlqEntryView::from_message(m, replayed.get(&(m.partition, m.offset)).copied()))
        .filter(|v| v.matches(filter))
        .collect();
    if let Some(n) = filter.limit {
        out.truncate(n);
    }
    Ok(out)
}

/// What a replay chose and did.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ReplayReport {
    pub executed: bool,
    /// The entries replayed (or, in a dry run, that would be), in produce order.
    pub entries: Vec<DlqEntryView>,
    /// Matching entries skipped because they were replayed before.
    pub already_replayed: Vec<DlqEntryView>,
    /// Matching entries skipped because an earlier DLQ entry has the same source record.
    pub duplicates: Vec<DlqEntryView>,
    /// Matching entries without a payload (too large for the DLQ): replay them from
    /// their source offset in the log instead.
    pub not_replayable: Vec<DlqEntryView>,
}

/// Replay the entries that pass `filter` (a dry run unless `execute`).
pub(crate) async fn replay(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    filter: &DlqFilter,
    execute: bool,
) -> Result<ReplayReport, DlqError> {
    let messages = read(config).await?;
    let replayed = replays(config, sysdb).await?;
    let views: Vec<DlqEntryView> = messages
        .iter()
        .map(|m| DlqEntryView::from_message(m, replayed.get(&(m.partition, m.offset)).copied()))
        .collect();
    let by_position: HashMap<(i32, i64), &DlqMessage> = messages.iter().map(|m| ((m.partition, m.offset), m)).collect();
    let mut report = select(views, filter);
    report.executed = execute;
    let chosen: Vec<(DlqEntryView, &DlqMessage)> = std::mem::take(&mut report.entries)
        .into_iter()
        .map(|v| {
            let m = by_position[&(v.dlq_partition, v.dlq_offset)];
            (v, m)
        })
        .collect();
    let log_topic = config.kafka.log_topic();
    let dlq_topic = config.kafka.dlq_topic();
    for (mut v, m) in chosen {
        if execute {
            let from = format!("{}/{}", m.partition, m.offset);
            let sp = v.source_partition.map(|p| p.to_string()).unwrap_or_default();
            let so = v.source_offset.map(|o| o.to_string()).unwrap_or_default();
            let headers: [(&str, &[u8]); 3] = [
                (kdlq::REPLAYED_FROM, from.as_bytes()),
                (kdlq::REPLAYED_SOURCE_PARTITION, sp.as_bytes()),
                (kdlq::REPLAYED_SOURCE_OFFSET, so.as_bytes()),
            ];
            let out = Outgoing {
                topic: &log_topic,
                partition: None,
                key: m.key.as_deref(),
                payload: &m.payload,
                headers: &headers,
            };
            let delivered = producer.send(out).await?;
            let row = DlqReplayRow {
                topic: dlq_topic.clone(),
                dlq_partition: m.partition,
                dlq_offset: m.offset,
                replayed_at_ms: now_ms(),
                log_partition: delivered.partition,
                log_offset: delivered.offset,
            };
            if let Err(error) = sysdb.record_dlq_replay(&row).await {
                return Err(DlqError::Unrecorded {
                    dlq_partition: m.partition,
                    dlq_offset: m.offset,
                    log_partition: delivered.partition,
                    log_offset: delivered.offset,
                    error,
                });
            }
            v.replayed_to = Some(ReplayedTo {
                partition: delivered.partition,
                offset: delivered.offset,
                at_ms: row.replayed_at_ms,
            });
        }
        report.entries.push(v);
    }
    Ok(report)
}

/// Which of the DLQ's entries a replay takes (`entries`, in source order, at most
/// `filter.limit`) and which matching ones it skips, and why. Pure: the tests call it.
pub(crate) fn select(views: Vec<DlqEntryView>, filter: &DlqFilter) -> ReplayReport {
    let mut report = ReplayReport {
        executed: false,
        entries: Vec::new(),
        already_replayed: Vec::new(),
        duplicates: Vec::new(),
        not_replayable: Vec::new(),
    };
    let source = |v: &DlqEntryView| (v.source_topic.clone(), v.source_partition, v.source_offset);
    let known_source = |v: &DlqEntryView| v.source_partition.is_some() && v.source_offset.is_some();
    // Sources replayed through any of their DLQ entries, matching the filter or not.
    let mut sources_done: HashSet<(Option<String>, Option<i32>, Option<i64>)> =
        views.iter().filter(|v| v.replayed_to.is_some() && known_source(v)).map(source).collect();
    for v in views.into_iter().filter(|v| v.matches(filter)) {
        if v.replayed_to.is_some() {
            report.already_replayed.push(v);
        } else if known_source(&v) && sources_done.contains(&source(&v)) {
            report.duplicates.push(v);
        } else if v.payload_omitted {
            report.not_replayable.push(v);
        } else {
            if known_source(&v) {
                sources_done.insert(source(&v));
            }
            report.entries.push(v);
        }
    }
    // The source order: a collection's records replay in the order they were first written.
    report.entries.sort_by_key(|v| (v.source_partition, v.source_offset, v.dlq_partition, v.dlq_offset));
    if let Some(n) = filter.limit {
        report.entries.truncate(n);
    }
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(dlq: (i32, i64), source: (i32, i64), kind: &str, collection: &str, at: i64) -> DlqEntryView {
        DlqEntryView {
            dlq_partition: dlq.0,
            dlq_offset: dlq.1,
            timestamp_ms: Some(at),
            source_topic: Some("p.log".into()),
            source_partition: Some(source.0),
            source_offset: Some(source.1),
            kind: kind.into(),
            message: "m".into(),
            collection: Some(collection.into()),
            payload_bytes: 10,
            payload_omitted: false,
            replayed_to: None,
        }
    }

    fn positions(vs: &[DlqEntryView]) -> Vec<(i32, i64)> {
        vs.iter().map(|v| (v.dlq_partition, v.dlq_offset)).collect()
    }

    #[test]
    fn a_replay_takes_each_source_record_once_in_source_order() {
        let mut replayed = entry((0, 1), (1, 5), "k", "a", 10);
        replayed.replayed_to = Some(ReplayedTo { partition: 1, offset: 90, at_ms: 11 });
        let mut omitted = entry((0, 4), (0, 8), "k", "a", 10);
        omitted.payload_omitted = true;
        let views = vec![
            entry((1, 0), (0, 7), "k", "b", 10),
            replayed,
            entry((0, 2), (1, 5), "k", "a", 12), // a second DLQ entry of a replayed source
            entry((0, 3), (0, 3), "k", "a", 12),
            entry((1, 1), (0, 3), "k", "a", 13), // a second DLQ entry of a chosen source
            omitted,
            entry((0, 5), (0, 9), "other", "a", 14),
        ];
        let all = select(views.clone(), &DlqFilter::default());
        assert_eq!(positions(&all.entries), [(0, 3), (1, 0), (0, 5)], "source order");
        assert_eq!(positions(&all.already_replayed), [(0, 1)]);
        assert_eq!(positions(&all.duplicates), [(0, 2), (1, 1)]);
        assert_eq!(positions(&all.not_replayable), [(0, 4)]);

        let kind = DlqFilter { kind: Some("k".into()), ..DlqFilter::default() };
        assert_eq!(positions(&select(views.clone(), &kind).entries), [(0, 3), (1, 0)]);
        let of_b = DlqFilter { collection: Some("b".into()), ..DlqFilter::default() };
        assert_eq!(positions(&select(views.clone(), &of_b).entries), [(1, 0)]);
        let since = DlqFilter { since_ms: Some(13), ..DlqFilter::default() };
        let later = select(views.clone(), &since);
        assert_eq!(
            positions(&later.entries),
            [(1, 1), (0, 5)],
            "the first of a pair filtered out: the second is taken"
        );
        let one = DlqFilter { limit: Some(1), ..DlqFilter::default() };
        assert_eq!(positions(&select(views, &one).entries), [(0, 3)]);
    }
}
