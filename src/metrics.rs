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
//! (no second copy to keep in sync, and no rdkafka type leaves the `sluice-kafka` crate).

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use crate::kafka::consumer::ConsumerStats;
use crate::materialize::IgnoreReason;
use crate::record::Operation;
use crate::sysdb::sqlite::SqliteStats;

/// The `Content-Type` of [`Metrics::encode`]'s output (OpenMetrics text 1.0.0).
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// `sluice_control_records_total{result}`: a BACKFILL_FN marker that started a backfill.
pub(crate) const CONTROL_BACKFILL_STARTED: &str = "backfill_started";
/// `sluice_control_records_total{result}`: a marker without effect (duplicate, unknown or
/// detached function).
pub(crate) const CONTROL_IGNORED: &str = "ignored";

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
pub(crate) struct PartitionLabel {
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
    /// Producer timestamp (ms) of the last record this replica applied on the partition;
    /// unknown until the first batch after the assignment commits.
    applied_ts_ms: Option<i64>,
    /// With the change feed on: changes in the outbox not published yet, and when the
    /// oldest of them was committed (ms since the Unix epoch; `None`: nothing waits).
    changelog: Option<(i64, Option<i64>)>,
}

type GaugeFamily = Family<PartitionLabel, Gauge>;

/// Per-partition gauges. Only tracked (assigned) partitions have series; updates for an
/// untracked partition (a late broker answer after a revoke) are dropped under the same
/// lock that removes the series, so a revoked partition never reappears.
#[derive(Debug, Default)]
struct PartitionGauges {
    /// Shared with [`LagSecondsCollector`], which derives the time lag at scrape time.
    state: Arc<Mutex<BTreeMap<i32, PartitionState>>>,
    high_watermark: GaugeFamily,
    sysdb_next_offset: GaugeFamily,
    group_offset: GaugeFamily,
    lag_records: GaugeFamily,
    commit_debt_records: GaugeFamily,
    halted: GaugeFamily,
    changelog_outbox_records: GaugeFamily,
}

fn lock_state(state: &Mutex<BTreeMap<i32, PartitionState>>) -> MutexGuard<'_, BTreeMap<i32, PartitionState>> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as i64)
}

/// `sluice_partition_lag_seconds{partition}` at `now_ms`: while records are waiting
/// (lag > 0), the age of the last applied record (now - its producer timestamp, at least
/// 0); 0 once caught up (lag <= 0); no value while records wait and no record has been
/// applied since the assignment (the age is unknown).
fn lag_seconds(s: &PartitionState, now_ms: i64) -> Option<f64> {
    let lag = s.high.zip(s.sysdb).map(|(h, n)| h - n)?;
    if lag <= 0 {
        return Some(0.0);
    }
    s.applied_ts_ms.map(|t| (now_ms - t).max(0) as f64 / 1000.0)
}

impl PartitionGauges {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<i32, PartitionState>> {
        lock_state(&self.state)
    }

    fn families(&self) -> [&GaugeFamily; 7] {
        [
            &self.changelog_outbox_records,
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
        set(&self.changelog_outbox_records, s.changelog.map(|c| c.0));
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

/// Reads the SQLite writer's [`SqliteStats`] at scrape time; nothing is exported until a
/// SQLite sysdb is attached (none on PostgreSQL).
#[derive(Debug, Default)]
struct SqliteCollector {
    stats: Mutex<Option<Arc<SqliteStats>>>,
}

impl Collector for SqliteCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let Some(stats) = self.stats.lock().unwrap_or_else(|p| p.into_inner()).clone() else { return Ok(()) };
        let s = stats.snapshot();
        let m = encoder.encode_descriptor(
            "sqlite_write_transactions",
            "Write transactions begun on the SQLite writer (batch groups, backfill steps, attaches, resets); reads never begin one",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.write_transactions).encode(m)?;
        let m = encoder.encode_descriptor(
            "sqlite_compactions",
            "Compactions of the SQLite value log (a commit whose dead values passed the bound)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.compactions).encode(m)?;
        let m = encoder.encode_descriptor(
            "sqlite_compaction_examined_bytes",
            "Bytes of values the SQLite value log's compactions examined (the dead ones are freed)",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.compaction_examined_bytes).encode(m)?;
        let m = encoder.encode_descriptor(
            "sqlite_compaction_copied_bytes",
            "Bytes of live values the SQLite value log's compactions copied forward",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(s.compaction_copied_bytes).encode(m)?;
        ConsumerCollector::encode_counter(
            &mut encoder,
            "sqlite_delta_merges",
            "Merges of the SQLite records delta, by reason: rows or bytes (its bounds), writer (a transaction that writes records directly)",
            "reason",
            &s.merges,
        )
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
            "Times the consumer stopped reading because the processor's queue was full",
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

/// Derives `sluice_partition_lag_seconds` from the partition state at scrape time (the
/// age grows while nothing moves, so it cannot be a gauge set on events).
#[derive(Debug)]
struct LagSecondsCollector {
    state: Arc<Mutex<BTreeMap<i32, PartitionState>>>,
}

impl Collector for LagSecondsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let now = now_ms();
        let rows: Vec<(i32, f64)> =
            lock_state(&self.state).iter().filter_map(|(p, s)| Some((*p, lag_seconds(s, now)?))).collect();
        // Named with its unit, like the other partition gauges (no `# UNIT` line).
        let mut m = encoder.encode_descriptor(
            "partition_lag_seconds",
            "Time lag of an assigned partition: while records wait (lag_records > 0), now minus the producer timestamp of the last applied record; 0 when caught up",
            None,
            MetricType::Gauge,
        )?;
        for (partition, v) in rows {
            ConstGauge::new(v).encode(m.encode_family(&PartitionLabel { partition })?)?;
        }
        // The change feed's delay: how long the oldest unpublished change has waited.
        let rows: Vec<(i32, f64)> = lock_state(&self.state)
            .iter()
            .filter_map(|(p, s)| {
                let (_, oldest) = s.changelog?;
                Some((*p, oldest.map_or(0.0, |t| (now - t).max(0) as f64 / 1000.0)))
            })
            .collect();
        if !rows.is_empty() {
            let mut m = encoder.encode_descriptor(
                "changelog_publish_lag_seconds",
                "With the change feed on: how long the oldest change of the partition's outbox not yet published to the changes topic has waited since its commit; 0 when none waits",
                None,
                MetricType::Gauge,
            )?;
            for (partition, v) in rows {
                ConstGauge::new(v).encode(m.encode_family(&PartitionLabel { partition })?)?;
            }
        }
        Ok(())
    }
}

/// One function as the gauges show it (from the sysdb, refreshed by the outbox relay).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FunctionGauge {
    pub id: String,
    pub collection: String,
    /// A [`FunctionStatus::as_str`](crate::functions::FunctionStatus::as_str).
    pub status: &'static str,
    pub backfill_done: i64,
    /// Known once the backfill started.
    pub backfill_total: Option<i64>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionLabel {
    function: String,
    collection: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FunctionStatusLabel {
    function: String,
    collection: String,
    status: &'static str,
}

/// The last function snapshot, encoded at scrape time (a refresh replaces it whole, so a
/// detached function's series disappear with it).
#[derive(Debug, Default)]
struct FunctionsCollector {
    snapshot: Mutex<Vec<FunctionGauge>>,
}

impl Collector for FunctionsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let fns = self.snapshot.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let label = |f: &FunctionGauge| FunctionLabel { function: f.id.clone(), collection: f.collection.clone() };
        let mut m = encoder.encode_descriptor(
            "function_status",
            "1 for the current status of each attached function (awaiting_marker, backfilling, ready, failed); one series per function",
            None,
            MetricType::Gauge,
        )?;
        for f in &fns {
            let l = FunctionStatusLabel { function: f.id.clone(), collection: f.collection.clone(), status: f.status };
            ConstGauge::new(1i64).encode(m.encode_family(&l)?)?;
        }
        let mut m = encoder.encode_descriptor(
            "function_backfill_done_records",
            "Records of the input collection (as of the marker) the function's backfill has covered",
            None,
            MetricType::Gauge,
        )?;
        for f in &fns {
            ConstGauge::new(f.backfill_done).encode(m.encode_family(&label(f))?)?;
        }
        let mut m = encoder.encode_descriptor(
            "function_backfill_total_records",
            "Size of the input collection as of the function's marker (known once its backfill started)",
            None,
            MetricType::Gauge,
        )?;
        for f in fns.iter().filter(|f| f.backfill_total.is_some()) {
            ConstGauge::new(f.backfill_total.unwrap_or(0)).encode(m.encode_family(&label(f))?)?;
        }
        Ok(())
    }
}

/// `process_*` series in the Prometheus client convention, read from `/proc/self` at
/// scrape time (Linux only; elsewhere the collector is not registered). A file that
/// cannot be read or parsed leaves its series out of that scrape.
#[cfg(target_os = "linux")]
#[derive(Debug, Default)]
struct ProcessCollector;

#[cfg(target_os = "linux")]
mod procfs {
    /// The kernel reports times in /proc in USER_HZ units, 100 per second on every Linux
    /// architecture Sluice builds for.
    const USER_HZ: f64 = 100.0;

    #[derive(Debug, Default, PartialEq)]
    pub(super) struct Sample {
        pub cpu_seconds: Option<f64>,
        pub resident_bytes: Option<f64>,
        pub virtual_bytes: Option<f64>,
        pub threads: Option<f64>,
        pub open_fds: Option<f64>,
        pub max_fds: Option<f64>,
        pub start_time_seconds: Option<f64>,
    }

    /// `utime + stime` (seconds) and `starttime` (ticks since boot) of /proc/self/stat.
    pub(super) fn parse_stat(stat: &str) -> Option<(f64, f64)> {
        // The command name (field 2) is in parentheses and may contain spaces: split after it.
        let rest = &stat[stat.rfind(')')? + 1..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        // rest starts at field 3 (state): field n is f[n - 3].
        let utime: f64 = f.get(14 - 3)?.parse().ok()?;
        let stime: f64 = f.get(15 - 3)?.parse().ok()?;
        let start: f64 = f.get(22 - 3)?.parse().ok()?;
        Some(((utime + stime) / USER_HZ, start))
    }

    /// A `Key:   value kB` line of /proc/self/status, in bytes (or the bare number).
    pub(super) fn status_field(status: &str, key: &str) -> Option<f64> {
        let line = status.lines().find(|l| l.split(':').next() == Some(key))?;
        let mut it = line.split(':').nth(1)?.split_whitespace();
        let n: f64 = it.next()?.parse().ok()?;
        Some(if it.next() == Some("kB") { n * 1024.0 } else { n })
    }

    pub(super) fn read() -> Sample {
        let stat = std::fs::read_to_string("/proc/self/stat").ok();
        let status = std::fs::read_to_string("/proc/self/status").ok();
        let parsed = stat.as_deref().and_then(parse_stat);
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()
            .and_then(|s| s.lines().find_map(|l| l.strip_prefix("btime ")).and_then(|v| v.trim().parse::<f64>().ok()));
        let max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|s| {
            let l = s.lines().find(|l| l.starts_with("Max open files"))?;
            l["Max open files".len()..].split_whitespace().next()?.parse::<f64>().ok()
        });
        Sample {
            cpu_seconds: parsed.map(|p| p.0),
            start_time_seconds: parsed.zip(boot).map(|((_, start), boot)| boot + start / USER_HZ),
            resident_bytes: status.as_deref().and_then(|s| status_field(s, "VmRSS")),
            virtual_bytes: status.as_deref().and_then(|s| status_field(s, "VmSize")),
            threads: status.as_deref().and_then(|s| status_field(s, "Threads")),
            // The directory handle read_dir holds is one of the entries: not ours to count.
            open_fds: std::fs::read_dir("/proc/self/fd").ok().map(|d| d.count().saturating_sub(1) as f64),
            max_fds,
        }
    }
}

#[cfg(target_os = "linux")]
impl ProcessCollector {
    fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, v: Option<f64>) -> fmt::Result {
        if let Some(v) = v {
            ConstGauge::new(v).encode(encoder.encode_descriptor(name, help, None, MetricType::Gauge)?)?;
        }
        Ok(())
    }
}

#[cfg(target_os = "linux")]
impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let s = procfs::read();
        if let Some(v) = s.cpu_seconds {
            let m = encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds",
                None,
                MetricType::Counter,
            )?;
            ConstCounter::new(v).encode(m)?;
        }
        let e = &mut encoder;
        Self::gauge(e, "process_resident_memory_bytes", "Resident memory size in bytes", s.resident_bytes)?;
        Self::gauge(e, "process_virtual_memory_bytes", "Virtual memory size in bytes", s.virtual_bytes)?;
        Self::gauge(e, "process_open_fds", "Number of open file descriptors", s.open_fds)?;
        Self::gauge(e, "process_max_fds", "Maximum number of open file descriptors (soft limit)", s.max_fds)?;
        Self::gauge(e, "process_threads", "Number of OS threads in the process", s.threads)?;
        Self::gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds",
            s.start_time_seconds,
        )
    }
}

/// The registry and every metric of a replica. Cheap to share (`Arc`); all updates are
/// atomic or briefly locked.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    partitions: PartitionGauges,
    consumer: Arc<ConsumerCollector>,
    sqlite: Arc<SqliteCollector>,
    functions: Arc<FunctionsCollector>,
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
    /// `sluice_function_failures_total{function, kind}`: attached functions found failing
    /// by this replica (one series per failed function: there are few).
    function_failures: Family<FunctionFailureLabel, Counter>,
    records_backfilled: Counter,
    /// Per partition, removed on revoke like the partition gauges (so no series without the
    /// feed).
    changelog_snapshot_records: Family<PartitionLabel, Counter>,
    backfill_duration: Histogram,
    markers_published: Family<ResultLabel, Counter>,
    /// `sluice_collection_records_processed_total{collection}`: only filled when
    /// `[metrics] per_collection = true` (one series per collection: cardinality).
    per_collection: Option<Family<CollectionLabel, Counter>>,
    /// Lost markers: see `backfill::marker_relay::relay_once`.
    markers_republished: Counter,
    awaiting_marker_oldest: Gauge<f64, std::sync::atomic::AtomicU64>,
    /// `sluice_read_wait_seconds{result}`: how long HTTP reads with a read token (or
    /// `read_level=latest`) waited.
    read_wait: Family<ResultLabel, Histogram, fn() -> Histogram>,
}

/// Buckets of `sluice_read_wait_seconds`.
const READ_WAIT_BUCKETS: [f64; 14] =
    [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

fn read_wait_histogram() -> Histogram {
    Histogram::new(READ_WAIT_BUCKETS)
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct CollectionLabel {
    collection: String,
}

/// `sluice_backfill_tasks_total{status}` values.
pub(crate) mod backfill_status {
    /// A task arrived from the backfill topic.
    pub(crate) const RECEIVED: &str = "received";
    /// A backfill started (from a task or the sysdb scan).
    pub(crate) const STARTED: &str = "started";
    /// A backfill walked the whole collection; the function is ready.
    pub(crate) const FINISHED: &str = "finished";
    /// A task or scan found nothing to do (duplicate, detached, another worker has it).
    pub(crate) const SKIPPED: &str = "skipped";
    /// A backfill step failed (it is retried by the next scan).
    pub(crate) const FAILED: &str = "failed";
    pub(crate) const ALL: [&str; 5] = [RECEIVED, STARTED, FINISHED, SKIPPED, FAILED];
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct FunctionFailureLabel {
    function: String,
    kind: &'static str,
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
        // The `process_*` series follow the Prometheus client convention (no prefix): they
        // live in the root registry, every Sluice family in the `sluice` sub-registry.
        let mut root = Registry::default();
        let r = root.sub_registry_with_prefix("sluice");
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
        r.register(
            "changelog_outbox_records",
            "With the change feed on: changes in the partition's changelog outbox not yet published to the changes topic (refreshed every 5 s)",
            p.changelog_outbox_records.clone(),
        );
        r.register("partition_halted", "1 while an assigned partition is halted (data-loss gap, sysdb beyond the log, a batch the sysdb keeps refusing, a failed seek); the reason is in /readyz, `sluice offsets show` and the log", p.halted.clone());

        let m = Metrics {
            registry: Registry::default(), // replaced below, once everything is registered
            partitions,
            consumer: Arc::new(ConsumerCollector::default()),
            sqlite: Arc::new(SqliteCollector::default()),
            functions: Arc::new(FunctionsCollector::default()),
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
            function_failures: Family::default(),
            records_backfilled: Counter::default(),
            changelog_snapshot_records: Family::default(),
            backfill_duration: Histogram::new(BACKFILL_BUCKETS),
            markers_published: Family::default(),
            per_collection: per_collection.then(Family::default),
            markers_republished: Counter::default(),
            awaiting_marker_oldest: Gauge::default(),
            read_wait: Family::new_with_constructor(read_wait_histogram),
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
            "function_failures",
            "Attached functions this replica found failing (a WebAssembly trap, fuel, memory or deadline exhausted, an \
             error it returned, a component that cannot be loaded), by function id and kind; each is marked failed",
            m.function_failures.clone(),
        );
        r.register(
            "records_backfilled",
            "Records of collections as of their marker that backfills have applied to functions",
            m.records_backfilled.clone(),
        );
        r.register(
            "changelog_snapshot_records",
            "With the change feed on: records that snapshots appended to the changelog outbox with their current state (docs/changes.md section 2)",
            m.changelog_snapshot_records.clone(),
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
        r.register_with_unit(
            "read_wait",
            "How long HTTP reads with a read token or read_level=latest waited, by result (covered, behind: the wait ran out, halted)",
            Unit::Seconds,
            m.read_wait.clone(),
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
        r.register_collector(Box::new(m.sqlite.clone()));
        r.register_collector(Box::new(LagSecondsCollector { state: m.partitions.state.clone() }));
        r.register_collector(Box::new(m.functions.clone()));
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
        #[cfg(target_os = "linux")]
        root.register_collector(Box::new(ProcessCollector));
        Arc::new(Metrics { registry: root, ..m })
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

    /// Export the SQLite writer's counters from now on.
    pub fn attach_sqlite(&self, stats: Arc<SqliteStats>) {
        *self.sqlite.stats.lock().unwrap_or_else(|p| p.into_inner()) = Some(stats);
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

    /// `kind`: a [`crate::functions::FailureKind::as_str`] or `load`.
    pub fn function_failure(&self, function: &str, kind: &'static str) {
        self.function_failures.get_or_create(&FunctionFailureLabel { function: function.to_string(), kind }).inc();
    }

    pub fn records_backfilled(&self, n: u64) {
        self.records_backfilled.inc_by(n);
    }

    /// A snapshot step appended `n` records to `partition`'s changelog outbox.
    pub fn changelog_snapshot_records(&self, partition: i32, n: u64) {
        self.changelog_snapshot_records.get_or_create(&PartitionLabel { partition }).inc_by(n);
    }

    pub fn observe_backfill_duration(&self, d: Duration) {
        self.backfill_duration.observe(d.as_secs_f64());
    }

    /// A read that waited for a read token: `result` is `covered`, `behind` or `halted`.
    pub(crate) fn observe_read_wait(&self, result: &'static str, d: Duration) {
        self.read_wait.get_or_create(&ResultLabel { result }).observe(d.as_secs_f64());
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

    /// Batches committed by this replica so far (the backfill throttle watches it).
    pub fn batches_committed(&self) -> u64 {
        self.batches.get()
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

    // ---- functions ------------------------------------------------------------------

    /// Replace the function snapshot behind `sluice_function_status` and the backfill
    /// progress gauges (detached functions are left out by the caller).
    pub fn set_functions(&self, functions: Vec<FunctionGauge>) {
        *self.functions.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = functions;
    }

    // ---- partitions ---------------------------------------------------------------

    /// Start tracking an assigned partition with what the assignment knew.
    pub fn partition_assigned(&self, partition: i32, sysdb_next: i64, high: i64, group: Option<i64>, halted: bool) {
        let s = PartitionState {
            high: Some(high),
            sysdb: Some(sysdb_next),
            group,
            halted,
            applied_ts_ms: None,
            changelog: None,
        };
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
        self.changelog_snapshot_records.remove(&l);
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

    /// A batch was applied on `partition`: `produced_ms` is the producer timestamp of its
    /// last record (the base of `sluice_partition_lag_seconds`).
    pub fn partition_applied_timestamp(&self, partition: i32, produced_ms: i64) {
        if produced_ms > 0 {
            self.partitions.update(partition, |s| s.applied_ts_ms = Some(produced_ms));
        }
    }

    /// The change feed's outbox of `partition`: `unpublished` changes, the oldest
    /// committed at `oldest_ms` (`None`: nothing waits).
    pub fn partition_changelog(&self, partition: i32, unpublished: i64, oldest_ms: Option<i64>) {
        self.partitions.update(partition, |s| s.changelog = Some((unpublished, oldest_ms)));
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
    pub(super) fn samples(text: &str) -> BTreeMap<String, f64> {
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
mod operator_series_tests {
    use super::tests::samples;
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn process_series_are_read_from_proc_at_scrape_time() {
        let m = Metrics::new();
        // Some CPU time, so that the counter is above 0 even on a coarse clock.
        let mut x = 0u64;
        let t = std::time::Instant::now();
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_mul(31).wrapping_add(7);
        }
        std::hint::black_box(x);
        let s = samples(&m.encode());
        for name in [
            "process_resident_memory_bytes",
            "process_virtual_memory_bytes",
            "process_cpu_seconds_total",
            "process_open_fds",
            "process_max_fds",
            "process_threads",
            "process_start_time_seconds",
        ] {
            let v = s.get(name).copied().unwrap_or_else(|| panic!("{name} missing"));
            assert!(v > 0.0, "{name} = {v}");
        }
        assert!(!s.keys().any(|k| k.starts_with("sluice_process")), "process series carry no sluice_ prefix");
        // Values follow the process: files opened now are counted at the next scrape (64
        // of them, with margin for tests of this binary closing files meanwhile).
        let before = s["process_open_fds"];
        let files: Vec<std::fs::File> = (0..64).map(|_| std::fs::File::open("/proc/self/stat").unwrap()).collect();
        let during = samples(&m.encode())["process_open_fds"];
        drop(files);
        assert!(during >= before + 32.0, "open fds {before} -> {during} with 64 more files open");
        let rss = s["process_resident_memory_bytes"];
        assert!(rss > 1024.0 * 1024.0, "RSS in bytes, not kB or pages: {rss}");
        let start = s["process_start_time_seconds"];
        let now = now_ms() as f64 / 1000.0;
        assert!(start <= now + 1.0 && start > now - 86_400.0, "start time {start} vs now {now}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn proc_stat_parsing_survives_odd_command_names() {
        let stat = "4242 (sluice (a) b) S 1 4242 4242 0 -1 4194560 1000 0 0 0 250 50 0 0 20 0 17 0 12345 1000000 900 18446744073709551615";
        let (cpu, start) = procfs::parse_stat(stat).expect("parsed");
        assert_eq!(cpu, 3.0, "(250 + 50) ticks at 100 per second");
        assert_eq!(start, 12345.0);
        assert_eq!(procfs::status_field("VmRSS:\t   2048 kB\nThreads:\t17\n", "VmRSS"), Some(2048.0 * 1024.0));
        assert_eq!(procfs::status_field("VmRSS:\t   2048 kB\nThreads:\t17\n", "Threads"), Some(17.0));
        assert_eq!(procfs::status_field("Threads:\t17\n", "VmRSS"), None);
    }

    #[test]
    fn changelog_gauges_follow_the_outbox_and_leave_with_the_partition() {
        let m = Metrics::new();
        m.partition_assigned(3, 10, 12, None, false);
        assert!(!m.encode().contains("sluice_changelog_"), "no feed, no series");
        m.partition_changelog(3, 5, Some(now_ms() - 60_000));
        let s = samples(&m.encode());
        assert_eq!(s["sluice_changelog_outbox_records{partition=\"3\"}"], 5.0);
        let lag = s["sluice_changelog_publish_lag_seconds{partition=\"3\"}"];
        assert!((59.0..70.0).contains(&lag), "{lag}");
        m.partition_changelog(3, 0, None);
        let s = samples(&m.encode());
        assert_eq!(s["sluice_changelog_publish_lag_seconds{partition=\"3\"}"], 0.0, "nothing waits: 0");
        m.partition_revoked(3);
        assert!(!m.encode().contains("sluice_changelog_"), "a revoked partition's series go");
    }

    #[test]
    fn lag_seconds_ages_the_last_applied_record_while_records_wait() {
        let now = 1_000_000_000;
        let s = |high, sysdb, ts| PartitionState {
            high: Some(high),
            sysdb: Some(sysdb),
            group: None,
            halted: false,
            applied_ts_ms: ts,
            changelog: None,
        };
        assert_eq!(lag_seconds(&s(10, 10, Some(now - 60_000)), now), Some(0.0), "caught up: 0, however old");
        assert_eq!(lag_seconds(&s(12, 10, Some(now - 60_000)), now), Some(60.0));
        assert_eq!(lag_seconds(&s(12, 10, None), now), None, "nothing applied yet: unknown, not 0");
        assert_eq!(lag_seconds(&s(12, 10, Some(now + 5_000)), now), Some(0.0), "clock skew clamps at 0");

        let m = Metrics::new();
        m.partition_assigned(2, 10, 15, None, false);
        let text = m.encode();
        assert!(!text.contains("sluice_partition_lag_seconds{"), "no age known yet:\n{text}");
        m.partition_applied_timestamp(2, now_ms() - 30_000);
        let v = samples(&m.encode())["sluice_partition_lag_seconds{partition=\"2\"}"];
        assert!((30.0..40.0).contains(&v), "lag seconds {v}");
        // Computed at scrape time: it grows while nothing moves.
        std::thread::sleep(Duration::from_millis(1100));
        let later = samples(&m.encode())["sluice_partition_lag_seconds{partition=\"2\"}"];
        assert!(later >= v + 1.0, "lag seconds did not grow: {v} -> {later}");
        m.partition_sysdb_next(2, 15);
        assert_eq!(samples(&m.encode())["sluice_partition_lag_seconds{partition=\"2\"}"], 0.0, "caught up");
        // A timestamp for a partition that is not assigned is dropped.
        m.partition_applied_timestamp(7, now_ms());
        m.partition_revoked(2);
        assert!(!m.encode().contains("sluice_partition_lag_seconds{"), "revoked: no series");
    }

    #[test]
    fn function_gauges_follow_the_snapshot() {
        let m = Metrics::new();
        let text = m.encode();
        assert!(text.contains("# TYPE sluice_function_status gauge"), "{text}");
        let f = |id: &str, status, done, total| FunctionGauge {
            id: id.into(),
            collection: "c1".into(),
            status,
            backfill_done: done,
            backfill_total: total,
        };
        m.set_functions(vec![f("f1", "backfilling", 40, Some(100)), f("f2", "awaiting_marker", 0, None)]);
        let s = samples(&m.encode());
        assert_eq!(s["sluice_function_status{function=\"f1\",collection=\"c1\",status=\"backfilling\"}"], 1.0);
        assert_eq!(s["sluice_function_status{function=\"f2\",collection=\"c1\",status=\"awaiting_marker\"}"], 1.0);
        assert_eq!(s["sluice_function_backfill_done_records{function=\"f1\",collection=\"c1\"}"], 40.0);
        assert_eq!(s["sluice_function_backfill_total_records{function=\"f1\",collection=\"c1\"}"], 100.0);
        assert!(!s.contains_key("sluice_function_backfill_total_records{function=\"f2\",collection=\"c1\"}"));
        // One status series per function: a status change replaces the old series.
        m.set_functions(vec![f("f1", "ready", 100, Some(100))]);
        let s = samples(&m.encode());
        let status: Vec<&String> = s.keys().filter(|k| k.starts_with("sluice_function_status{")).collect();
        assert_eq!(status, ["sluice_function_status{function=\"f1\",collection=\"c1\",status=\"ready\"}"]);
        assert_eq!(s["sluice_function_backfill_done_records{function=\"f1\",collection=\"c1\"}"], 100.0);
        assert!(!s.keys().any(|k| k.contains("\"f2\"")), "a function gone from the sysdb keeps no series");
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
