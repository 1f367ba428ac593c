//! Every metric Sluice exports, declared in one place (docs/metrics.md).
//!
//! Built on the official Rust client, [`prometheus-client`](https://docs.rs/prometheus-client):
//! it is maintained under the Prometheus organisation, its metric families are typed
//! (`Family<Labels, Counter>`: a label set is a struct, so a call site cannot invent a
//! label name or pass a label value of the wrong kind), it encodes the OpenMetrics text
//! format that Prometheus scrapes, and it has no process-global registry: [`Metrics::new`]
//! owns its [`Registry`], so tests (and several processors in one test binary) never see
//! each other's values.
//!
//! Conventions: names are `sluice_<subsystem>_<name>_<unit>`; counters are
//! registered without `_total` and the encoder appends it; durations are histograms in
//! seconds with explicit buckets. Label values are bounded: every label value that is not
//! a partition number is a `&'static str` (an operation symbol, a DLQ kind, an ignore
//! reason, a result), so only the code can name one, never a record; partition series
//! exist only for the partitions this replica is assigned and are removed on revoke.
//! Per-collection labels are deliberately absent (cardinality; a config switch may add
//! them later).
//!
//! Consumer-side counters (group offset commits, rebalances) are atomics the consumer
//! thread maintains in [`ConsumerStats`]; a [`Collector`] reads them at scrape time
//! (no second copy to keep in sync, and no rdkafka type leaves `src/kafka/`).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::kafka::consumer::ConsumerStats;
use crate::materialize::IgnoreReason;
use crate::record::Operation;

/// The `Content-Type` of [`Metrics::encode`]'s output (OpenMetrics text 1.0.0).
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `sluice_control_records_total{result}`: a BACKFILL_FN marker that started a backfill.
pub const CONTROL_BACKFILL_STARTED: &str = "backfill_started";
/// `sluice_control_records_total{result}`: a marker without effect (duplicate, unknown or
/// detached function).
pub const CONTROL_IGNORED: &str = "ignored";

/// Buckets of `sluice_batch_duration_seconds` (a whole flush: decode → DLQ → commit).
const BATCH_BUCKETS: [f64; 15] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];
/// Buckets of `sluice_sysdb_commit_duration_seconds` (one `commit_batch` transaction).
const SYSDB_COMMIT_BUCKETS: [f64; 14] =
    [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Buckets of `sluice_end_to_end_latency_seconds` (produce timestamp → sysdb commit);
/// wide, because a replica catching up on a backlog sees minutes or hours.
const END_TO_END_BUCKETS: [f64; 17] =
    [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct PartitionLabel {
    pub partition: i32,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabel {
    operation: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabel {
    result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionLabel {
    version: &'static str,
}

/// What this replica knows about one assigned partition; the lag and commit-debt gauges
/// are derived from it on every change.
#[derive(Debug, Default, Clone, Copy)]
struct PartitionState {
    high: Option<i64>,
    sysdb: Option<i64>,
    group: Option<i64>,
    halted: bool,
}

type GaugeFamily = Family<PartitionLabel, Gauge>;

/// Per-partition gauges. Only tracked (assigned) partitions have series; updates for an
/// untracked partition (a late broker answer after a revoke) are dropped under the same
/// lock that removes the series, so a revoked partition never reappears.
#[derive(Debug, Default)]
struct PartitionGauges {
    state: Mutex<BTreeMap<i32, PartitionState>>,
    high_watermark: GaugeFamily,
    sysdb_next_offset: GaugeFamily,
    group_offset: GaugeFamily,
    lag_records: GaugeFamily,
    commit_debt_records: GaugeFamily,
    halted: GaugeFamily,
}

impl PartitionGauges {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<i32, PartitionState>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn families(&self) -> [&GaugeFamily; 6] {
        [
            &self.high_watermark,
            &self.sysdb_next_offset,
            &self.group_offset,
            &self.lag_records,
            &self.commit_debt_records,
            &self.halted,
        ]
    }

    /// Set every gauge of `p` from `s` (called with the state lock held).
    fn publish(&self, p: i32, s: &PartitionState) {
        let l = PartitionLabel { partition: p };
        let set = |f: &GaugeFamily, v: Option<i64>| match v {
            Some(v) => {
                f.get_or_create(&l).set(v);
            }
            None => {
                f.remove(&l);
            }
        };
        set(&self.high_watermark, s.high);
        set(&self.sysdb_next_offset, s.sysdb);
        set(&self.group_offset, s.group);
        // Lag from the sysdb position, the authoritative one (never librdkafka's
        // consumer_lag, which follows the fetch position).
        set(&self.lag_records, s.high.zip(s.sysdb).map(|(h, n)| h - n));
        set(&self.commit_debt_records, s.sysdb.zip(s.group).map(|(n, g)| n - g));
        set(&self.halted, Some(i64::from(s.halted)));
    }

    fn update(&self, p: i32, f: impl FnOnce(&mut PartitionState)) {
        let mut m = self.lock();
        if let Some(s) = m.get_mut(&p) {
            f(s);
            let s = *s;
            self.publish(p, &s);
        }
    }
}

/// Reads [`ConsumerStats`] at scrape time. Before a consumer is attached (or in a process
/// without one) the families are still exported, with zeros.
#[derive(Debug, Default)]
struct ConsumerCollector {
    stats: Mutex<Option<Arc<ConsumerStats>>>,
}

impl ConsumerCollector {
    fn encode_counter(
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        label: &'static str,
        values: &[(&'static str, u64)],
    ) -> fmt::Result {
        let mut m = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
        for (value, n) in values {
            let labels = [(label, *value)];
            ConstCounter::new(*n).encode(m.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

impl Collector for ConsumerCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let stats = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let get = |f: fn(&ConsumerStats) -> &std::sync::atomic::AtomicU64| {
            stats.as_deref().map_or(0, |s| f(s).load(Ordering::Relaxed))
        };
        Self::encode_counter(
            &mut encoder,
            "offset_commits",
            "Group offset commits (the lagging copy of the sysdb position), by result; failures are expected around rebalances",
            "result",
            &[("ok", get(|s| &s.commits_ok)), ("failed", get(|s| &s.commits_failed))],
        )?;
        Self::encode_counter(
            &mut encoder,
            "rebalances",
            "Rebalance callbacks of the group consumer, by kind",
            "kind",
            &[("assign", get(|s| &s.rebalances_assign)), ("revoke", get(|s| &s.rebalances_revoke))],
        )?;
        let m = encoder.encode_descriptor(
            "consumer_backpressure_pauses",
            "Times the consumer paused its partitions because the processor's queue was full",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(get(|s| &s.backpressure_pauses)).encode(m)?;
        let m = encoder.encode_descriptor(
            "consumer_seek_retries",
            "Seeks that failed and were retried (after bounded retries the partition halts)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(get(|s| &s.seek_retries)).encode(m)
    }
}

/// The registry and every metric of a replica. Cheap to share (`Arc`); all updates are
/// atomic or briefly locked.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    partitions: PartitionGauges,
    consumer: Arc<ConsumerCollector>,
    records_processed: Family<OperationLabel, Counter>,
    records_ignored: Family<ReasonLabel, Counter>,
    dlq_records: Family<ReasonLabel, Counter>,
    control_records: Family<ResultLabel, Counter>,
    sysdb_cas_conflicts: Counter,
    gaps: Counter,
    group_offset_ahead: Counter,
    sysdb_retries: Counter,
    watermark_retries: Counter,
    batches: Counter,
    batch_duration: Histogram,
    sysdb_commit_duration: Histogram,
    end_to_end_latency: Histogram,
    backfill_tasks: Family<StatusLabel, Counter>,
    records_backfilled: Counter,
    backfill_duration: Histogram,
    markers_published: Family<ResultLabel, Counter>,
    /// `sluice_collection_records_processed_total{collection}`: only filled when
    /// `[metrics] per_collection = true` (one series per collection: cardinality).
    per_collection: Option<Family<CollectionLabel, Counter>>,
    /// Lost markers: see `backfill::attach::relay_once`.
    markers_republished: Counter,
    awaiting_marker_oldest: Gauge<f64, std::sync::atomic::AtomicU64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct CollectionLabel {
    collection: String,
}

/// `sluice_backfill_tasks_total{status}` values.
pub mod backfill_status {
    /// A task arrived from the backfill topic.
    pub const RECEIVED: &str = "received";
    /// A backfill started (from a task or the sysdb scan).
    pub const STARTED: &str = "started";
    /// A backfill walked the whole collection; the function is ready.
    pub const FINISHED: &str = "finished";
    /// A task or scan found nothing to do (duplicate, detached, another worker has it).
    pub const SKIPPED: &str = "skipped";
    /// A backfill step failed (it is retried by the next scan).
    pub const FAILED: &str = "failed";
    pub const ALL: [&str; 5] = [RECEIVED, STARTED, FINISHED, SKIPPED, FAILED];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct StatusLabel {
    status: &'static str,
}

/// Buckets of `sluice_backfill_duration_seconds` (one whole backfill).
const BACKFILL_BUCKETS: [f64; 12] = [0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0];

impl Metrics {
    /// A fresh registry with every family registered (prefix `sluice_`).
    pub fn new() -> Arc<Metrics> {
        Metrics::with_options(false)
    }

    /// `per_collection`: also export `sluice_collection_records_processed_total{collection}`.
    pub fn with_options(per_collection: bool) -> Arc<Metrics> {
        let mut r = Registry::with_prefix("sluice");
        let partitions = PartitionGauges::default();
        let p = &partitions;
        r.register(
            "partition_high_watermark",
            "High watermark (next offset to be written) of an assigned partition, refreshed every 5 s",
            p.high_watermark.clone(),
        );
        r.register(
            "partition_sysdb_next_offset",
            "Next offset to apply according to the sysdb: the authoritative position",
            p.sysdb_next_offset.clone(),
        );
        r.register(
            "partition_group_offset",
            "The consumer group's committed offset: a lagging copy of the sysdb position, refreshed every 5 s",
            p.group_offset.clone(),
        );
        r.register(
            "partition_lag_records",
            "Records not yet applied: high watermark - sysdb next offset",
            p.lag_records.clone(),
        );
        r.register(
            "partition_commit_debt_records",
            "How far the group offset lags the sysdb: sysdb next offset - group offset",
            p.commit_debt_records.clone(),
        );
        r.register("partition_halted", "1 while an assigned partition is halted (data-loss gap, sysdb beyond the log, a batch the sysdb keeps refusing, a failed seek); the reason is in /readyz, `sluice offsets show` and the log", p.halted.clone());

        let m = Metrics {
            registry: Registry::default(), // replaced below, once everything is registered
            partitions,
            consumer: Arc::new(ConsumerCollector::default()),
            records_processed: Family::default(),
            records_ignored: Family::default(),
            dlq_records: Family::default(),
            control_records: Family::default(),
            sysdb_cas_conflicts: Counter::default(),
            gaps: Counter::default(),
            group_offset_ahead: Counter::default(),
            sysdb_retries: Counter::default(),
            watermark_retries: Counter::default(),
            batches: Counter::default(),
            batch_duration: Histogram::new(BATCH_BUCKETS),
            sysdb_commit_duration: Histogram::new(SYSDB_COMMIT_BUCKETS),
            end_to_end_latency: Histogram::new(END_TO_END_BUCKETS),
            backfill_tasks: Family::default(),
            records_backfilled: Counter::default(),
            backfill_duration: Histogram::new(BACKFILL_BUCKETS),
            markers_published: Family::default(),
            per_collection: per_collection.then(Family::default),
            markers_republished: Counter::default(),
            awaiting_marker_oldest: Gauge::default(),
        };
        if let Some(f) = &m.per_collection {
            r.register(
                "collection_records_processed",
                "Data records applied, per collection (enabled by [metrics] per_collection)",
                f.clone(),
            );
        }
        r.register(
            "backfill_tasks",
            "Backfill tasks and runs, by status (received, started, finished, skipped, failed)",
            m.backfill_tasks.clone(),
        );
        r.register(
            "records_backfilled",
            "Records of collections as of their marker that backfills have applied to functions",
            m.records_backfilled.clone(),
        );
        r.register_with_unit(
            "backfill_duration",
            "Duration of a whole backfill, from its start in this replica to the function being ready",
            Unit::Seconds,
            m.backfill_duration.clone(),
        );
        r.register(
            "markers_published",
            "BACKFILL_FN markers published by attach or the outbox relay, by result (ok, failed)",
            m.markers_published.clone(),
        );
        r.register(
            "markers_republished",
            "Lost BACKFILL_FN markers published again by the outbox relay (the partition moved past a marker while its function still awaited it)",
            m.markers_republished.clone(),
        );
        r.register_with_unit(
            "functions_awaiting_marker_oldest",
            "Age of the oldest function still awaiting its BACKFILL_FN marker (0 when none), refreshed by the outbox relay",
            Unit::Seconds,
            m.awaiting_marker_oldest.clone(),
        );
        r.register("records_processed", "Data records applied to the sysdb, by operation", m.records_processed.clone());
        r.register(
            "records_ignored",
            "Records that had no effect (e.g. ADD of an existing id), by reason",
            m.records_ignored.clone(),
        );
        r.register(
            "dlq_records",
            "Records sent to the dead-letter topic, by reason (error kind)",
            m.dlq_records.clone(),
        );
        r.register("control_records", "Control (function) records, by result", m.control_records.clone());
        r.register(
            "sysdb_cas_conflicts",
            "Batches refused by the sysdb compare-and-set (another writer moved the position)",
            m.sysdb_cas_conflicts.clone(),
        );
        r.register("gaps", "Data-loss gaps found (records deleted by retention before being applied)", m.gaps.clone());
        r.register(
            "group_offset_ahead",
            "Assignments where the group offset was ahead of the sysdb position (the sysdb wins)",
            m.group_offset_ahead.clone(),
        );
        r.register("sysdb_retries", "Sysdb operations retried after an error", m.sysdb_retries.clone());
        r.register("batches", "Batches committed to the sysdb", m.batches.clone());
        r.register(
            "watermark_retries",
            "Watermark reads of a partition worker retried after an error (after bounded retries the partition halts)",
            m.watermark_retries.clone(),
        );
        r.register_with_unit(
            "batch_duration",
            "Duration of a whole batch flush: decode, fold, DLQ, sysdb commit (retries included)",
            Unit::Seconds,
            m.batch_duration.clone(),
        );
        r.register_with_unit(
            "sysdb_commit_duration",
            "Duration of one sysdb batch transaction (commit_batch)",
            Unit::Seconds,
            m.sysdb_commit_duration.clone(),
        );
        r.register_with_unit(
            "end_to_end_latency",
            "Per record: producer timestamp to the sysdb commit that applied it",
            Unit::Seconds,
            m.end_to_end_latency.clone(),
        );
        r.register("build", "Build information", Info::new(VersionLabel { version: env!("CARGO_PKG_VERSION") }));
        r.register_collector(Box::new(m.consumer.clone()));
        // Series that exist from the start at 0, so that rate() and dashboards see them
        // before the first occurrence (DLQ kinds are many and rare: created on first use).
        for op in Operation::ALL.into_iter().filter(|o| o.is_data()) {
            let _ = m.records_processed.get_or_create(&OperationLabel { operation: op.symbol() });
        }
        for reason in IgnoreReason::ALL {
            let _ = m.records_ignored.get_or_create(&ReasonLabel { reason: reason.label() });
        }
        for result in [CONTROL_BACKFILL_STARTED, CONTROL_IGNORED] {
            let _ = m.control_records.get_or_create(&ResultLabel { result });
        }
        for status in backfill_status::ALL {
            let _ = m.backfill_tasks.get_or_create(&StatusLabel { status });
        }
        for result in ["ok", "failed"] {
            let _ = m.markers_published.get_or_create(&ResultLabel { result });
        }
        Arc::new(Metrics { registry: r, ..m })
    }

    /// The whole registry in the OpenMetrics text format ([`CONTENT_TYPE`]).
    pub fn encode(&self) -> String {
        let mut out = String::with_capacity(8 * 1024);
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// Export this consumer's commit and rebalance counters from now on.
    pub fn attach_consumer(&self, stats: Arc<ConsumerStats>) {
        *self.consumer.stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
    }

    // ---- records and batches ------------------------------------------------------

    /// `operation` is an [`Operation::symbol`](crate::record::Operation::symbol).
    pub fn records_processed(&self, operation: &'static str, n: u64) {
        if n > 0 {
            self.records_processed.get_or_create(&OperationLabel { operation }).inc_by(n);
        }
    }

    /// Records applied to one collection (no-op unless per-collection labels are on).
    pub fn collection_records(&self, collection: &str, n: u64) {
        if let Some(f) = &self.per_collection {
            if n > 0 {
                f.get_or_create(&CollectionLabel { collection: collection.to_string() }).inc_by(n);
            }
        }
    }

    /// Whether per-collection series are exported.
    pub fn per_collection(&self) -> bool {
        self.per_collection.is_some()
    }

    /// `reason` is an [`IgnoreReason::label`](crate::materialize::IgnoreReason::label).
    pub fn records_ignored(&self, reason: &'static str, n: u64) {
        if n > 0 {
            self.records_ignored.get_or_create(&ReasonLabel { reason }).inc_by(n);
        }
    }

    /// `reason` is the DLQ entry's kind (also its `sluice.error.kind` header).
    pub fn dlq_record(&self, reason: &'static str) {
        self.dlq_records.get_or_create(&ReasonLabel { reason }).inc();
    }

    pub fn control_records(&self, result: &'static str, n: u64) {
        if n > 0 {
            self.control_records.get_or_create(&ResultLabel { result }).inc_by(n);
        }
    }

    /// `status` is one of [`backfill_status`].
    pub fn backfill_task(&self, status: &'static str) {
        self.backfill_tasks.get_or_create(&StatusLabel { status }).inc();
    }

    pub fn records_backfilled(&self, n: u64) {
        self.records_backfilled.inc_by(n);
    }

    pub fn observe_backfill_duration(&self, d: Duration) {
        self.backfill_duration.observe(d.as_secs_f64());
    }

    pub fn marker_published(&self, ok: bool) {
        self.markers_published.get_or_create(&ResultLabel { result: if ok { "ok" } else { "failed" } }).inc();
    }

    pub fn sysdb_cas_conflict(&self) {
        self.sysdb_cas_conflicts.inc();
    }

    pub fn gap(&self) {
        self.gaps.inc();
    }

    pub fn group_offset_ahead(&self) {
        self.group_offset_ahead.inc();
    }

    pub fn sysdb_retry(&self) {
        self.sysdb_retries.inc();
    }

    pub fn watermark_retry(&self) {
        self.watermark_retries.inc();
    }

    pub fn batch_committed(&self) {
        self.batches.inc();
    }

    pub fn observe_batch_duration(&self, d: Duration) {
        self.batch_duration.observe(d.as_secs_f64());
    }

    pub fn observe_sysdb_commit(&self, d: Duration) {
        self.sysdb_commit_duration.observe(d.as_secs_f64());
    }

    /// One observation per record: `committed_ms - produced_ms` (clamped at 0 against
    /// clock skew). Records without a producer timestamp are not observed.
    pub fn observe_end_to_end(&self, committed_ms: i64, produced_ms: impl IntoIterator<Item = Option<i64>>) {
        for t in produced_ms.into_iter().flatten().filter(|t| *t > 0) {
            self.end_to_end_latency.observe((committed_ms - t).max(0) as f64 / 1000.0);
        }
    }

    // ---- lost markers ---------------------------------------------------------------

    /// A lost marker was published again.
    pub fn marker_republished(&self) {
        self.markers_republished.inc();
    }

    /// Age in seconds of the oldest function awaiting its marker (0 when none).
    pub fn set_awaiting_marker_oldest(&self, seconds: f64) {
        self.awaiting_marker_oldest.set(seconds);
    }

    // ---- partitions ---------------------------------------------------------------

    /// Start tracking an assigned partition with what the assignment knew.
    pub fn partition_assigned(&self, partition: i32, sysdb_next: i64, high: i64, group: Option<i64>, halted: bool) {
        let s = PartitionState { high: Some(high), sysdb: Some(sysdb_next), group, halted };
        let mut m = self.partitions.lock();
        m.insert(partition, s);
        self.partitions.publish(partition, &s);
    }

    /// Stop tracking a revoked partition and remove its series.
    pub fn partition_revoked(&self, partition: i32) {
        let mut m = self.partitions.lock();
        m.remove(&partition);
        let l = PartitionLabel { partition };
        for f in self.partitions.families() {
            f.remove(&l);
        }
    }

    /// The sysdb position of a partition moved (a batch commit, a gap skip, a re-read).
    /// The high watermark is at least any position read from the log, so the cached one
    /// is raised with it (the lag never goes negative between two refreshes).
    pub fn partition_sysdb_next(&self, partition: i32, next: i64) {
        self.partitions.update(partition, |s| {
            s.sysdb = Some(next);
            s.high = Some(s.high.map_or(next, |h| h.max(next)));
        });
    }

    pub fn partition_halted(&self, partition: i32, halted: bool) {
        self.partitions.update(partition, |s| s.halted = halted);
    }

    /// What the broker said (periodic refresh). `group` is `None` when the group has no
    /// committed offset for the partition. A watermark read before a commit that lands
    /// first is older than the sysdb position: a consuming partition's high watermark is
    /// at least its sysdb position (only a halted one may be behind: sysdb beyond the log).
    pub fn partition_broker_offsets(&self, partition: i32, high: i64, group: Option<i64>) {
        self.partitions.update(partition, |s| {
            s.high = Some(match s.sysdb {
                Some(n) if !s.halted => high.max(n),
                _ => high,
            });
            s.group = group;
        });
    }

    /// Partitions with series (the assigned ones), in order.
    pub fn tracked_partitions(&self) -> Vec<i32> {
        self.partitions.lock().keys().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every exported sample name (metric families with their type suffix).
    const SAMPLES: &[&str] = &[
        "sluice_partition_high_watermark{",
        "sluice_partition_sysdb_next_offset{",
        "sluice_partition_group_offset{",
        "sluice_partition_lag_records{",
        "sluice_partition_commit_debt_records{",
        "sluice_partition_halted{",
        "sluice_records_processed_total{",
        "sluice_records_ignored_total{",
        "sluice_dlq_records_total{",
        "sluice_control_records_total{",
        "sluice_offset_commits_total{",
        "sluice_rebalances_total{",
        "sluice_consumer_backpressure_pauses_total ",
        "sluice_consumer_seek_retries_total ",
        "sluice_watermark_retries_total ",
        "sluice_sysdb_cas_conflicts_total ",
        "sluice_gaps_total ",
        "sluice_group_offset_ahead_total ",
        "sluice_sysdb_retries_total ",
        "sluice_batches_total ",
        "sluice_batch_duration_seconds_bucket{",
        "sluice_sysdb_commit_duration_seconds_bucket{",
        "sluice_end_to_end_latency_seconds_bucket{",
        "sluice_build_info{",
    ];

    fn exercised() -> Arc<Metrics> {
        let m = Metrics::new();
        m.partition_assigned(0, 10, 12, Some(7), false);
        m.records_processed("ADD", 3);
        m.records_ignored("add_existing", 1);
        m.dlq_record("truncated");
        m.control_records(CONTROL_IGNORED, 1);
        m.batch_committed();
        m.observe_batch_duration(Duration::from_millis(3));
        m.observe_sysdb_commit(Duration::from_millis(1));
        m.observe_end_to_end(10_000, [Some(9_500), None]);
        m
    }

    /// `name value` of every sample line.
    fn samples(text: &str) -> BTreeMap<String, f64> {
        text.lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.rsplit_once(' '))
            .map(|(k, v)| (k.to_string(), v.parse().expect("numeric sample")))
            .collect()
    }

    #[test]
    fn encoding_contains_every_family() {
        let m = exercised();
        let text = m.encode();
        for name in SAMPLES {
            assert!(text.contains(name), "{name} missing from:\n{text}");
        }
        // Before anything happened: the families of bounded, known label values are
        // there at 0 (partition gauges appear with the assignment, DLQ kinds on first use).
        let fresh = samples(&Metrics::new().encode());
        for series in [
            "sluice_records_processed_total{operation=\"UPSERT\"}",
            "sluice_records_ignored_total{reason=\"delete_missing\"}",
            "sluice_control_records_total{result=\"ignored\"}",
            "sluice_offset_commits_total{result=\"failed\"}",
            "sluice_batch_duration_seconds_count",
            "sluice_gaps_total",
        ] {
            assert_eq!(fresh.get(series), Some(&0.0), "{series} missing from a fresh registry");
        }
        assert!(!fresh.keys().any(|k| k.contains("BACKFILL_FN")), "control records are not data operations");
        assert!(text.ends_with("# EOF\n"), "OpenMetrics ends with # EOF");
        let s = samples(&text);
        assert_eq!(s["sluice_build_info{version=\"0.1.0\"}"], 1.0);
        assert_eq!(s["sluice_records_processed_total{operation=\"ADD\"}"], 3.0);
        assert_eq!(s["sluice_end_to_end_latency_seconds_count"], 1.0, "records without a timestamp are not observed");
        assert_eq!(s["sluice_end_to_end_latency_seconds_sum"], 0.5);
    }

    #[test]
    fn partition_gauges_derive_lag_and_debt_and_vanish_on_revoke() {
        let m = exercised();
        m.partition_assigned(3, 100, 150, None, true);
        let s = samples(&m.encode());
        assert_eq!(s["sluice_partition_lag_records{partition=\"0\"}"], 2.0);
        assert_eq!(s["sluice_partition_commit_debt_records{partition=\"0\"}"], 3.0);
        assert_eq!(s["sluice_partition_halted{partition=\"3\"}"], 1.0);
        assert!(!s.contains_key("sluice_partition_group_offset{partition=\"3\"}"), "no group offset, no series");

        // A commit beyond the cached high watermark raises it: no negative lag.
        m.partition_sysdb_next(0, 20);
        m.partition_halted(3, false);
        let s = samples(&m.encode());
        assert_eq!(s["sluice_partition_high_watermark{partition=\"0\"}"], 20.0);
        assert_eq!(s["sluice_partition_lag_records{partition=\"0\"}"], 0.0);
        assert_eq!(s["sluice_partition_commit_debt_records{partition=\"0\"}"], 13.0);
        assert_eq!(s["sluice_partition_halted{partition=\"3\"}"], 0.0);
        m.partition_broker_offsets(0, 25, Some(20));
        let s = samples(&m.encode());
        assert_eq!(s["sluice_partition_lag_records{partition=\"0\"}"], 5.0);
        assert_eq!(s["sluice_partition_commit_debt_records{partition=\"0\"}"], 0.0);
        // A watermark read before the last commit does not make the lag negative...
        m.partition_sysdb_next(0, 30);
        m.partition_broker_offsets(0, 25, Some(20));
        assert_eq!(samples(&m.encode())["sluice_partition_lag_records{partition=\"0\"}"], 0.0);
        // ...but a halted partition whose sysdb position is beyond the log shows it.
        m.partition_assigned(4, 50, 40, None, true);
        m.partition_broker_offsets(4, 40, None);
        assert_eq!(samples(&m.encode())["sluice_partition_lag_records{partition=\"4\"}"], -10.0);
        m.partition_revoked(4);

        m.partition_revoked(3);
        // A late broker answer or commit for a revoked partition does not resurrect it.
        m.partition_broker_offsets(3, 200, Some(100));
        m.partition_sysdb_next(3, 160);
        let text = m.encode();
        assert!(!text.contains("partition=\"3\""), "revoked partition still exported:\n{text}");
        assert_eq!(m.tracked_partitions(), vec![0]);
    }

    #[test]
    fn label_values_stay_bounded() {
        let m = exercised();
        // However many records and batches go through, the series are those of the label
        // values the code names (static strings) and of the assigned partitions.
        for i in 0..10_000u64 {
            m.records_processed(["ADD", "UPDATE", "UPSERT", "DELETE"][(i % 4) as usize], 1);
            m.records_ignored(["add_existing", "update_missing", "delete_missing"][(i % 3) as usize], 1);
            m.dlq_record(["truncated", "misrouted"][(i % 2) as usize]);
            m.partition_sysdb_next(0, i as i64);
            m.partition_broker_offsets(1, i as i64, Some(0)); // not assigned: no series
        }
        let text = m.encode();
        let series = |prefix: &str| samples(&text).keys().filter(|k| k.starts_with(prefix)).count();
        assert_eq!(series("sluice_records_processed_total{"), 4);
        assert_eq!(series("sluice_records_ignored_total{"), 3);
        assert_eq!(series("sluice_dlq_records_total{"), 2);
        assert_eq!(series("sluice_partition_high_watermark{"), 1);
        assert_eq!(series("sluice_offset_commits_total{"), 2);
        assert_eq!(series("sluice_rebalances_total{"), 2);
        // No label carries anything but a partition number or a snake_case/upper-case word.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            if let Some((_, rest)) = line.split_once('{') {
                let labels = rest.split_once('}').expect("closing brace").0;
                for kv in labels.split(',') {
                    let v = kv.split_once('=').expect("k=v").1.trim_matches('"');
                    assert!(
                        v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '+' | '-')),
                        "unexpected label value {v:?} in {line}"
                    );
                }
            }
        }
    }

    #[test]
    fn consumer_counters_are_read_at_scrape_time() {
        let m = Metrics::new();
        let s = samples(&m.encode());
        assert_eq!(s["sluice_offset_commits_total{result=\"ok\"}"], 0.0);
        let stats = Arc::new(ConsumerStats::default());
        m.attach_consumer(stats.clone());
        stats.commits_ok.fetch_add(5, Ordering::Relaxed);
        stats.commits_failed.fetch_add(1, Ordering::Relaxed);
        stats.rebalances_assign.fetch_add(2, Ordering::Relaxed);
        let s = samples(&m.encode());
        assert_eq!(s["sluice_offset_commits_total{result=\"ok\"}"], 5.0);
        assert_eq!(s["sluice_offset_commits_total{result=\"failed\"}"], 1.0);
        assert_eq!(s["sluice_rebalances_total{kind=\"assign\"}"], 2.0);
        assert_eq!(s["sluice_rebalances_total{kind=\"revoke\"}"], 0.0);
        stats.commits_ok.fetch_add(1, Ordering::Relaxed);
        assert_eq!(samples(&m.encode())["sluice_offset_commits_total{result=\"ok\"}"], 6.0);
    }
}

#[cfg(test)]
mod per_collection_tests {
    use super::*;

    #[test]
    fn per_collection_series_only_behind_the_switch() {
        let off = Metrics::new();
        off.collection_records("c1", 3);
        assert!(!off.encode().contains("sluice_collection_records_processed"));
        let on = Metrics::with_options(true);
        on.collection_records("c1", 3);
        assert!(
            on.encode().contains("sluice_collection_records_processed_total{collection=\"c1\"} 3"),
            "{}",
            on.encode()
        );
    }
}
