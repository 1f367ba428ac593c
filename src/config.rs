//! Configuration: a TOML file (`--config`), overridden by environment variables, overridden
//! by command-line flags. Every key can be set as `SLUICE_<SECTION>__<KEY>` (e.g.
//! `SLUICE_PROCESSOR__BATCH_MAX_RECORDS=1000`; `[librdkafka]` keys with `_` for `.`:
//! `SLUICE_LIBRDKAFKA__SASL_MECHANISMS`); the named variables `SLUICE_BROKERS`,
//! `SLUICE_SYSDB`, `SLUICE_GROUP`, `SLUICE_INSTANCE_ID`, `SLUICE_TOPIC_PREFIX`,
//! `SLUICE_HTTP`, `SLUICE_READ_TOKEN`, `SLUICE_ADMIN_TOKEN`, `SLUICE_SASL_USERNAME`,
//! `SLUICE_SASL_PASSWORD`,
//! `SLUICE_SCHEMA_REGISTRY_URL` (and `_USERNAME`, `_PASSWORD`, `_CA_FILE`) apply after those. Unknown keys are rejected.
//! Every field's doc comment is the user's reference: `sluice config docs` renders them
//! (docs/configuration.md), `sluice config show` prints the effective values, secrets as
//! `***`.

pub mod docs;
pub mod memory;

use std::collections::BTreeMap;
use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize, Serializer};
use thiserror::Error;

use crate::record::framing::Framing;
use crate::record::validate::Limits;

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("invalid config file {path}: {message}")]
    Parse { path: String, message: String },
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// The whole configuration.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub kafka: KafkaConfig,
    pub sysdb: SysdbConfig,
    pub sqlite: SqliteConfig,
    pub processor: ProcessorConfig,
    /// Validation limits applied to every log record (oversized input goes to the DLQ).
    pub limits: Limits,
    pub http: HttpConfig,
    pub backfill: BackfillConfig,
    pub changelog: ChangelogConfig,
    pub wasm: WasmConfig,
    pub metrics: MetricsConfig,
    pub schema_registry: SchemaRegistryConfig,
    pub telemetry: TelemetryConfig,
    /// librdkafka options passed through unchanged to every client (consumer, producer,
    /// admin): SASL/SSL settings, `client.id`, tuning. Values are strings. Sluice's own
    /// settings (`enable.auto.commit`, `enable.auto.offset.store`, `partitioner`, ...)
    /// win over these where correctness depends on them. Example for SASL/SCRAM over TLS:
    /// `"security.protocol" = "SASL_SSL"`, `"sasl.mechanisms" = "SCRAM-SHA-512"`,
    /// `"ssl.ca.location" = "/path/ca.pem"`, `"sasl.username"`, `"sasl.password"`.
    /// Env: `SLUICE_SASL_USERNAME` / `SLUICE_SASL_PASSWORD` set `sasl.username` /
    /// `sasl.password` (preferred for the password: keeps it out of files). Secret values
    /// (keys containing `password`, `secret` or `key`) are never logged; `sluice config
    /// show` prints `***`. Env: `SLUICE_LIBRDKAFKA__<KEY>` with `_` for `.`.
    /// Tuning the consumer gets unless set here: `queued.max.messages.kbytes` 2048 and
    /// `queued.min.messages` 10000 (the prefetch bounds per partition, in bytes and in
    /// messages), `fetch.queue.backoff.ms` 10 and `fetch.wait.max.ms` 20 (librdkafka:
    /// 65536, 100000, 1000 and 500), so a partition that fell behind for a moment is
    /// fetched again at once instead of after up to a second.
    #[serde(serialize_with = "serialize_librdkafka")]
    pub librdkafka: BTreeMap<String, String>,
}

/// How a replica's partitions are shared in the consumer group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum RebalanceProtocol {
    /// `cooperative-sticky`: incremental rebalances, only moved partitions stop.
    Cooperative,
    /// `range`: every rebalance revokes everything (eager).
    Eager,
}

/// Where a partition with no sysdb row and no group offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResetPolicy {
    Earliest,
    Latest,
}

/// What to do when the sysdb position is below the partition's log-start offset
/// (retention deleted records that were never processed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnDataLoss {
    /// Stop the partition with an error and a metric until an operator decides
    /// (`sluice offsets reset`).
    Halt,
    /// Record the gap (partition, from, to, time) in the sysdb and continue.
    Skip,
}

/// What happens to records of a collection the sysdb does not know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum UnknownCollections {
    /// Register it on the partition it arrived on (if that is its murmur2 partition).
    Register,
    /// Send its records to the DLQ (reason `unknown_collection`).
    Reject,
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaConfig {
    /// Bootstrap servers, comma separated. Env: `SLUICE_BROKERS`.
    pub brokers: String,
    /// Consumer group of the processor replicas. Env: `SLUICE_GROUP`.
    pub group: String,
    /// Topic names are `<prefix>.log`, `<prefix>.backfill`, `<prefix>.dlq`.
    /// Env: `SLUICE_TOPIC_PREFIX`.
    pub topic_prefix: String,
    /// Framing of log record values: `plain` (Avro datum) or `confluent` (magic byte 0 +
    /// 4-byte schema id + datum). Never guessed.
    pub framing: Framing,
    /// Schema id written in the Confluent header by `sluice produce` when
    /// `framing = "confluent"` (the id your schema registry gave `schemas/log_record.avsc`).
    pub confluent_schema_id: u32,
    /// Partition count `sluice init` creates the log topic with.
    pub partitions: i32,
    /// Replication factor `sluice init` creates topics with.
    pub replication_factor: i32,
    /// `cooperative` (default) or `eager`.
    pub rebalance_protocol: RebalanceProtocol,
    /// Start of a partition with neither a sysdb row nor a group offset.
    pub auto_offset_reset: ResetPolicy,
    /// librdkafka `session.timeout.ms` (librdkafka default 45000).
    pub session_timeout_ms: u32,
    /// Static group membership (`group.instance.id`) of this replica's processor
    /// consumer, unique per replica and stable across its restarts (e.g. the pod name of
    /// a StatefulSet). A replica restarted after a crash then gets its partitions back at
    /// once instead of after `session_timeout_ms`; but a replica stopped for good keeps
    /// its partitions unassigned until that timeout. Unset: dynamic membership.
    /// Env: `SLUICE_INSTANCE_ID`.
    pub instance_id: Option<String>,
    /// librdkafka `max.poll.interval.ms` (librdkafka default 300000).
    pub max_poll_interval_ms: u32,
    /// Timeout for metadata, watermark and committed-offset requests.
    pub request_timeout_ms: u32,
}

impl Default for KafkaConfig {
    fn default() -> Self {
        KafkaConfig {
            brokers: "127.0.0.1:9092".into(),
            group: "sluice".into(),
            topic_prefix: "sluice".into(),
            framing: Framing::Plain,
            confluent_schema_id: 1,
            partitions: 8,
            replication_factor: 1,
            rebalance_protocol: RebalanceProtocol::Cooperative,
            auto_offset_reset: ResetPolicy::Earliest,
            session_timeout_ms: 45_000,
            instance_id: None,
            max_poll_interval_ms: 300_000,
            request_timeout_ms: 10_000,
        }
    }
}

impl KafkaConfig {
    pub fn log_topic(&self) -> String {
        format!("{}.log", self.topic_prefix)
    }
    pub fn backfill_topic(&self) -> String {
        format!("{}.backfill", self.topic_prefix)
    }
    pub fn dlq_topic(&self) -> String {
        format!("{}.dlq", self.topic_prefix)
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SysdbConfig {
    /// `sqlite://PATH` (embedded default) or `postgres://USER:PASS@HOST:PORT/DB`.
    /// Env: `SLUICE_SYSDB`. The password (in the userinfo or a `password=` query
    /// parameter) is never logged nor shown.
    #[serde(serialize_with = "serialize_url")]
    pub url: String,
}

impl Default for SysdbConfig {
    fn default() -> Self {
        SysdbConfig { url: "sqlite://sluice.db".into() }
    }
}

/// How the SQLite sysdb bounds its stores, in bytes (used when `sysdb.url` is
/// `sqlite://`). The layout is explained in `docs/sqlite.md`: small transactions append
/// their record changes to a *delta* that is merged into the records in large runs, and
/// embeddings and documents go to an append-only *value log* that compaction keeps within
/// a multiple of the live values.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SqliteConfig {
    /// The records delta is merged once it holds this many row changes (default 4,096:
    /// a merge of that size cost ~10 ms and cut the writer's CPU per record by a third
    /// against merging every 1,024).
    pub delta_max_rows: u32,
    /// ...or once its rows' keys, metadata and the embeddings and documents they appended
    /// take this many bytes (default 32 MiB), so that large records are merged after a
    /// few of them, not thousands (the values they overwrote are compacted only then).
    pub delta_max_bytes: u64,
    /// The processor keeps the unmerged delta in memory for its reads: every key, and the
    /// metadata of as many rows as fit in this many bytes (default 16 MiB); the metadata
    /// of the others is read from the delta table when needed.
    pub delta_cache_bytes: u64,
    /// Compaction starts when the bytes of dead values (overwritten or deleted records'
    /// embeddings and documents) exceed this many times the live values' bytes, plus
    /// `dead_value_slack_bytes` (default 2.0: the value log holds up to about three times
    /// the live values). Lower saves disk and costs CPU: at 1.0, more of the oldest
    /// values are still live when compaction reaches them and are copied forward.
    pub dead_value_ratio: f64,
    /// Dead bytes always allowed beside the ratio (default 64 MiB): a small database is
    /// never compacted value by value.
    pub dead_value_slack_bytes: u64,
    /// The most bytes of values one commit's compaction examines, and the most it copies
    /// (default 64 MiB); compaction goes on over later commits. Each commit examines
    /// twice the bytes it appended (at least 1 MiB), up to this bound.
    pub compaction_step_bytes: u64,
    /// Read-only connections for reads (admin API, CLI, backfill scans; default 2). Reads
    /// never use the writer: they run in one snapshot each, never wait for a commit and
    /// never merge or compact.
    pub reader_connections: u32,
}

impl SqliteConfig {
    pub const DEFAULT: SqliteConfig = SqliteConfig {
        delta_max_rows: 4096,
        delta_max_bytes: 32 << 20,
        delta_cache_bytes: 16 << 20,
        dead_value_ratio: 2.0,
        dead_value_slack_bytes: 64 << 20,
        compaction_step_bytes: 64 << 20,
        reader_connections: 2,
    };
}

impl Default for SqliteConfig {
    fn default() -> Self {
        SqliteConfig::DEFAULT
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ProcessorConfig {
    /// A batch closes at this many records (default 20,000)...
    pub batch_max_records: usize,
    /// ...or this many payload bytes (default 16 MiB)...
    ///
    /// Memory: a batch being committed holds its payload, its decoded records (which
    /// share the payload's embeddings but own their ids, metadata and documents) and the
    /// stored records they replace: at most three times this value plus a chunk, per
    /// partition. The whole bound of a replica is in
    /// "Memory: the worst case" at the end of this reference. A lower value lowers it and
    /// costs CPU per record (on W1, 8 MiB: about 6% more; 4 MiB: about a sixth more).
    /// Measured peaks of a W1 drain on 8 partitions: 266-294 MB at 16 MiB. The allocator
    /// (mimalloc) returns freed memory to the system 10-100 ms after it is freed
    /// (`MIMALLOC_PURGE_DELAY`, in milliseconds, in the environment: 10 by default).
    /// Memory it returned is faulted in again by the next batches: on W1 drains, 1000 took
    /// about a tenth less CPU and raised the peak by 55-70 MB; 100, about 4% less and 20-30
    /// MB more.
    pub batch_max_bytes: usize,
    /// ...or, once nothing more waits for the worker, after lingering for more records:
    /// while the partition is behind (see `batch_linger_behind_ms`), a batch lingers a
    /// tenth of its newest record's age, at most this long after its first record
    /// arrived (default 100). The wait a batch adds stays a tenth of the delay its
    /// records already have, and a partition deep in a backlog commits few large
    /// batches (measured on a W1 drain: 13% less CPU per record than a fixed 5 ms).
    /// Under load the records that arrive during a commit form the next batch, up to the
    /// limits above, so batches grow with the load. 0 never lingers.
    pub batch_linger_ms: u64,
    /// A batch lingers only while its newest record is at least this many milliseconds
    /// old by its Kafka timestamp, i.e. while the partition is behind the head of its log
    /// (default 20). A batch of fresher records commits as soon as nothing more waits for
    /// the worker: caught up, latency is one commit; behind, batches grow for throughput.
    /// Measured at 10,000 records/s: p50 3 ms and p99 53 ms without lingering against
    /// 10 ms and 84-380 ms with a 5 ms linger. 0 always lingers.
    pub batch_linger_behind_ms: u64,
    /// `register` (default) or `reject` records of collections the sysdb does not know.
    pub unknown_collections: UnknownCollections,
    /// `halt` (default) or `skip` when retention deleted unprocessed records.
    pub on_data_loss: OnDataLoss,
    /// Upper bound for a graceful shutdown (SIGTERM/SIGINT) before the process exits.
    pub shutdown_timeout_ms: u64,
}

impl Default for ProcessorConfig {
    fn default() -> Self {
        ProcessorConfig {
            batch_max_records: 20_000,
            batch_max_bytes: 16 << 20,
            batch_linger_ms: 100,
            batch_linger_behind_ms: 20,
            unknown_collections: UnknownCollections::Register,
            on_data_loss: OnDataLoss::Halt,
            shutdown_timeout_ms: 20_000,
        }
    }
}

/// The schema registry (Confluent REST API) producers register their writer schemas in.
/// With a `url`, the processor decodes each record with the writer schema its Confluent
/// header names (schema evolution), and `sluice produce`, the HTTP ingest and attach
/// markers write the id the registry gives `schemas/log_record.avsc` under the subject
/// `<topic_prefix>.log-value`. Needs `kafka.framing = "confluent"`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SchemaRegistryConfig {
    /// API base, e.g. `http://127.0.0.1:18081/apis/ccompat/v7` (Apicurio) or
    /// `https://registry:8081` (Confluent). Unset: no registry. Env:
    /// `SLUICE_SCHEMA_REGISTRY_URL`. Credentials in it are never shown.
    #[serde(serialize_with = "serialize_opt_url")]
    pub url: Option<String>,
    /// Basic auth user. Env: `SLUICE_SCHEMA_REGISTRY_USERNAME`.
    pub username: Option<String>,
    /// Basic auth password. Env: `SLUICE_SCHEMA_REGISTRY_PASSWORD` (preferred). Never
    /// logged; `sluice config show` prints `***`.
    pub password: Option<Secret>,
    /// PEM file of the CA(s) that signed the registry's TLS certificate (added to the
    /// public roots). Env: `SLUICE_SCHEMA_REGISTRY_CA_FILE`.
    pub ca_file: Option<std::path::PathBuf>,
    /// The id the registry gave `schemas/log_record.avsc`, found at start-up (not a
    /// setting).
    #[serde(skip)]
    #[schemars(skip)]
    pub writer_schema_id: Option<u32>,
}

impl SchemaRegistryConfig {
    /// Whether a registry is configured.
    pub fn enabled(&self) -> bool {
        self.url.as_deref().is_some_and(|u| !u.trim().is_empty())
    }
}

/// What `/metrics` exports beyond the fixed families.
#[derive(Debug, Clone, Default, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Export `sluice_collection_records_processed_total{collection}`: one series per
    /// collection. Off by default: with many collections this is unbounded cardinality
    /// for Prometheus.
    pub per_collection: bool,
}

/// Traces of `sluice process` exported over OTLP: one trace per batch (a `batch` root
/// span with `fetch_wait`, `decode`, `fold`, `dlq`, `commit` and `group_commit_request`
/// children). Off unless an endpoint is set; off, no exporter runs and the child spans
/// are disabled at their call sites.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// OTLP/HTTP base URL of the collector, e.g. `http://127.0.0.1:4318` (traces go to
    /// `<url>/v1/traces`; a URL already ending in `/v1/traces` is used as is). Unset: the
    /// standard `OTEL_EXPORTER_OTLP_ENDPOINT` applies when set, else no export.
    /// Credentials in it are never shown.
    #[serde(serialize_with = "serialize_opt_url")]
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported spans.
    pub service_name: String,
    /// Fraction of batches traced, 0.0 to 1.0 (decided per trace, at its root).
    pub sample_ratio: f64,
    /// OTLP transport: `http/protobuf` (the only one built in; a collector's port 4318).
    pub protocol: OtlpProtocol,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: None,
            service_name: "sluice".into(),
            sample_ratio: 1.0,
            protocol: OtlpProtocol::HttpProtobuf,
        }
    }
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum OtlpProtocol {
    /// Protobuf over HTTP (OTLP/HTTP, port 4318 by convention).
    #[serde(rename = "http/protobuf")]
    HttpProtobuf,
}

/// Attached functions as WebAssembly components (`sluice functions attach --wasm`): the
/// limits of each instance, the same on every replica (a replica
/// with other limits could fail a change another one passes). A function that exceeds one
/// is marked `failed` with the limit named; the collection and the other functions go on.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct WasmConfig {
    /// Fuel of one call of a component (`deltas` of one change, or `init`): about one
    /// WebAssembly instruction each. Deterministic: a change that needs more fails the
    /// same way on every replica and in every backfill. The default, 2e9, is seconds of
    /// work for a change; a component that loops forever fails after it.
    pub fuel_per_change: u64,
    /// Wall-clock bound of one call, in milliseconds: the backstop for a host too slow
    /// for the fuel bound. The one limit that depends on the machine, so that a change
    /// could pass on one replica and fail on another: keep it well above what the fuel
    /// allows.
    pub epoch_deadline_ms: u64,
    /// Linear memory one instance may grow to, in bytes (default 256 MiB). Each worker
    /// (one per assigned partition) and each running backfill holds an instance of every
    /// WebAssembly function of its collections; a component built with componentize-py
    /// starts at about 20 MB.
    pub max_memory_bytes: usize,
    /// Where compiled components are kept between runs, by the SHA-256 of their bytes.
    /// Empty: beside a SQLite sysdb file (`<file>.wasm-cache`), else
    /// `sluice-wasm-cache` in the temporary directory. As trusted as the binary: the files
    /// hold machine code.
    pub cache_dir: String,
}

impl Default for WasmConfig {
    fn default() -> Self {
        let limits = crate::functions::wasm::Limits::DEFAULT;
        WasmConfig {
            fuel_per_change: limits.fuel_per_change,
            epoch_deadline_ms: limits.epoch_deadline_ms,
            max_memory_bytes: limits.max_memory_bytes,
            cache_dir: String::new(),
        }
    }
}

impl Config {
    /// The WebAssembly host's limits and cache directory (`[wasm]`).
    pub fn wasm_host(&self) -> (crate::functions::wasm::Limits, std::path::PathBuf) {
        let limits = crate::functions::wasm::Limits {
            fuel_per_change: self.wasm.fuel_per_change,
            epoch_deadline_ms: self.wasm.epoch_deadline_ms,
            max_memory_bytes: self.wasm.max_memory_bytes,
        };
        let dir = if !self.wasm.cache_dir.is_empty() {
            std::path::PathBuf::from(&self.wasm.cache_dir)
        } else {
            let file = self.sysdb.url.strip_prefix("sqlite://").map(std::path::Path::new);
            crate::functions::wasm::default_cache_dir(file)
        };
        (limits, dir)
    }
}

/// The backfill worker (a role of `sluice process`).
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct BackfillConfig {
    /// Records per backfill chunk (one transaction each). Smaller chunks hold the
    /// function's row for less time, so live batches of that collection wait less.
    pub chunk_size: usize,
    /// ...or this many bytes of the fields the function reads (default 16 MiB), whichever
    /// comes first: a chunk of records with large metadata or documents stays small.
    pub chunk_max_bytes: usize,
    /// Backfills running at once in this replica.
    pub concurrency: usize,
    /// Pause between two chunks of one backfill, to leave room for live processing.
    pub pause_ms: u64,
    /// The share of wall time a backfill may take while this replica commits live
    /// batches, in (0, 1]. After each chunk, while a live batch committed within the last
    /// second, the worker pauses `(1 / live_share - 1)` times the chunk's duration, so live
    /// processing keeps about `1 - live_share` of the sysdb writer and of the CPU. With
    /// no live batch committing, chunks follow each other without a pause. `1` turns
    /// the throttle off. It sees only this replica's live batches.
    pub live_share: f64,
    /// How often the sysdb is scanned for `backfilling` functions that no worker runs
    /// (start-up, a crashed replica's backfill, a lost task).
    pub scan_interval_ms: u64,
    /// How often the outbox relay republishes markers not yet acknowledged.
    pub relay_interval_ms: u64,
}

impl Default for BackfillConfig {
    fn default() -> Self {
        BackfillConfig {
            chunk_size: 1000,
            chunk_max_bytes: 16 << 20,
            concurrency: 2,
            pause_ms: 0,
            live_share: 0.1,
            scan_interval_ms: 5_000,
            relay_interval_ms: 2_000,
        }
    }
}

/// The change feed (`docs/changes.md`): every materialized change of a record published
/// to `<topic_prefix>.<topic_suffix>`, exactly once for read_committed consumers, in the
/// order the sysdb applied them per record.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct ChangelogConfig {
    /// Write every change to the sysdb's changelog outbox in its batch's transaction, and
    /// publish it with a transactional producer per partition. Off by default. `sluice
    /// init` creates the topics when on.
    pub enabled: bool,
    /// The changes topic is `<kafka.topic_prefix>.<topic_suffix>`; its progress topic
    /// (the relay's last published outbox sequence per partition, compacted) is that
    /// name followed by `.progress`.
    pub topic_suffix: String,
    /// `cleanup.policy` of the changes topic: `compact` keeps the latest change of each
    /// record (deletes as tombstones), `delete` keeps every change for the retention
    /// time, `compact,delete` both.
    pub cleanup_policy: String,
    /// A partition's relay uses `transactional.id = <transactional_id_prefix><partition>`:
    /// the partition's next owner takes the same id, which fences the previous owner's
    /// producer (its open transaction is aborted, its later commits refused). Empty:
    /// `<kafka.group>.changes.`.
    pub transactional_id_prefix: String,
    /// `transaction.timeout.ms` of the relay's producers. Checked at start against the
    /// broker's `transaction.max.timeout.ms` (a longer one is refused by the broker).
    pub transaction_timeout_ms: u64,
    /// A transaction carries at most this many changes...
    pub max_records_per_transaction: usize,
    /// ...or this many bytes of keys and values (at least one change).
    pub max_bytes_per_transaction: usize,
    /// How often a relay with nothing to publish looks at the outbox again.
    pub poll_interval_ms: u64,
    /// Published outbox rows are deleted at most this many per statement.
    pub delete_step_rows: usize,
    /// The outbox of one partition may hold this many bytes (keys and values) of
    /// unpublished changes. At the bound (the broker refuses the relay's transactions or
    /// is away) the partition pauses before its next batch, named in `/readyz`, until
    /// the relay publishes again; nothing is dropped.
    pub outbox_max_bytes: u64,
    /// Per owned partition, the bytes of committed changes a worker hands to the relay
    /// in memory, so that a relay that keeps up publishes them without reading them back
    /// from the outbox (it reads the outbox when it fell further behind, after a restart,
    /// and for changes written elsewhere). 0: always read the outbox.
    pub handoff_max_bytes: u64,
    /// `compression.type` of the relay's producers: `none`, `gzip`, `snappy`, `lz4` or
    /// `zstd`. Embeddings (random-looking floats) hardly compress; documents and
    /// metadata do. Measured on W1 (384-dim embeddings): BENCHMARKS.md.
    pub compression: String,
}

impl Default for ChangelogConfig {
    fn default() -> Self {
        ChangelogConfig {
            enabled: false,
            topic_suffix: "changes".into(),
            cleanup_policy: "compact".into(),
            transactional_id_prefix: String::new(),
            transaction_timeout_ms: 60_000,
            max_records_per_transaction: 5_000,
            max_bytes_per_transaction: 4 << 20,
            poll_interval_ms: 50,
            delete_step_rows: 5_000,
            outbox_max_bytes: 1 << 30,
            handoff_max_bytes: 8 << 20,
            compression: "lz4".into(),
        }
    }
}

impl Config {
    /// `<topic_prefix>.<changelog.topic_suffix>`.
    pub fn changes_topic(&self) -> String {
        format!("{}.{}", self.kafka.topic_prefix, self.changelog.topic_suffix)
    }

    /// The changes topic's progress topic.
    pub fn changes_progress_topic(&self) -> String {
        format!("{}.progress", self.changes_topic())
    }

    /// The relay's `transactional.id` of `partition`.
    pub fn changelog_transactional_id(&self, partition: i32) -> String {
        let prefix = if self.changelog.transactional_id_prefix.is_empty() {
            format!("{}.changes.", self.kafka.group)
        } else {
            self.changelog.transactional_id_prefix.clone()
        };
        format!("{prefix}{partition}")
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct HttpConfig {
    /// Listen address of `/metrics`, `/healthz`, `/readyz` and the API under `/api/v1`.
    /// Env: `SLUICE_HTTP`. Empty disables the server. `sluice process` refuses to start
    /// (exit code 2) when this address is reachable from other machines (anything but a
    /// loopback address: `0.0.0.0`, `::`, a LAN address, a host name that resolves to
    /// one) while neither `read_token` nor `admin_token` is set, unless
    /// `allow_unauthenticated` is true.
    pub listen: String,
    /// Bearer token of the read role: `GET` requests under `/api/v1` (records,
    /// collections, functions, offsets, DLQ entries) need `Authorization: Bearer
    /// <token>` with this token or `admin_token` once either token is set. Compared in
    /// constant time. `/metrics`, `/healthz` and `/readyz` never need a token. Unset or
    /// empty: no read token. Env: `SLUICE_READ_TOKEN` (preferred: keeps it out of files).
    /// Never logged; `sluice config show` prints `***`. The roles, and what each
    /// combination of tokens allows: docs/operations.md, "Roles and tokens".
    pub read_token: Option<Secret>,
    /// Bearer token of the admin role: it changes state (`POST` and `DELETE` under
    /// `/api/v1`: records in, attach, detach, offset resets, DLQ replays) and reads
    /// everything the read token reads. Compared in constant time. With `read_token` set
    /// and this one unset, every change is refused (403) whatever the request carries.
    /// Must differ from `read_token`. Env: `SLUICE_ADMIN_TOKEN` (preferred: keeps it out
    /// of files). Never logged; `sluice config show` prints `***`.
    pub admin_token: Option<Secret>,
    /// Serve the API without any token on a non-loopback `listen` address, on purpose
    /// (e.g. behind a proxy that authenticates, on a network only trusted clients reach).
    /// Without it `sluice process` refuses that configuration. It changes nothing else:
    /// with neither token set every request is served, on any address.
    pub allow_unauthenticated: bool,
    /// How much lower than the replica's own the CPU priority of the threads that read and
    /// build record pages is (added to their nice value, as `nice -n`; Linux; 0-19; on
    /// PostgreSQL the read itself stays on the server's threads). On a replica whose cores
    /// are busy, the processor's batches and commits then go first and readers take the
    /// CPU that is left; on idle cores it changes nothing. 0 serves the pages on the HTTP
    /// server's own threads.
    pub render_nice: i32,
}

impl Default for HttpConfig {
    fn default() -> Self {
        HttpConfig {
            listen: "127.0.0.1:9464".into(),
            read_token: None,
            admin_token: None,
            allow_unauthenticated: false,
            render_nice: 10,
        }
    }
}

impl HttpConfig {
    /// The read token when one is set and non-empty.
    pub fn read_token(&self) -> Option<&str> {
        self.read_token.as_ref().map(Secret::expose).filter(|t| !t.is_empty())
    }

    /// The admin token when one is set and non-empty.
    pub fn admin_token(&self) -> Option<&str> {
        self.admin_token.as_ref().map(Secret::expose).filter(|t| !t.is_empty())
    }

    /// The check `sluice process` makes before it starts anything: a server reachable
    /// from other machines (`listen` not a loopback address, host names resolved) must
    /// have a token, or say with `allow_unauthenticated` that it serves without one on
    /// purpose.
    pub fn check_exposure(&self) -> Result<(), ConfigError> {
        self.check_exposure_with(|addr| std::net::ToSocketAddrs::to_socket_addrs(addr).map(Iterator::collect))
    }

    /// [`HttpConfig::check_exposure`] with the resolver given (tests).
    fn check_exposure_with(
        &self,
        resolve: impl Fn(&str) -> std::io::Result<Vec<std::net::SocketAddr>>,
    ) -> Result<(), ConfigError> {
        let listen = self.listen.trim();
        if listen.is_empty()
            || self.read_token().is_some()
            || self.admin_token().is_some()
            || self.allow_unauthenticated
        {
            return Ok(());
        }
        let reached = match resolve(listen) {
            Ok(addrs) if !addrs.is_empty() => {
                let outside: Vec<String> =
                    addrs.iter().filter(|a| !a.ip().to_canonical().is_loopback()).map(ToString::to_string).collect();
                if outside.is_empty() {
                    return Ok(());
                }
                format!("binds {}, which other machines can reach", outside.join(", "))
            }
            Ok(_) => "resolves to no address, so it cannot be shown to be a loopback address".to_string(),
            Err(e) => format!("cannot be resolved ({e}), so it cannot be shown to be a loopback address"),
        };
        Err(ConfigError::Invalid(format!(
            "http.listen = {listen:?} {reached}, and neither http.read_token nor http.admin_token is set: \
             anyone who reaches it could read every record. Set http.read_token (SLUICE_READ_TOKEN) \
             and http.admin_token (SLUICE_ADMIN_TOKEN), or set http.allow_unauthenticated = true \
             (SLUICE_HTTP__ALLOW_UNAUTHENTICATED=true) to serve without a credential on purpose, \
             or listen on a loopback address such as 127.0.0.1"
        )))
    }
}

/// A secret string (held by `secrecy`, wiped from memory on drop): `Debug` and
/// `Serialize` print `***`, so neither a logged config nor `config show` shows it.
#[derive(Clone, Deserialize)]
#[serde(transparent)]
pub struct Secret(secrecy::SecretString);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(secrecy::SecretString::from(value.into()))
    }

    /// The value itself, for the one place that needs it.
    pub fn expose(&self) -> &str {
        secrecy::ExposeSecret::expose_secret(&self.0)
    }
}

impl PartialEq for Secret {
    fn eq(&self, other: &Secret) -> bool {
        self.expose() == other.expose()
    }
}

impl Eq for Secret {}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("\"***\"")
    }
}

/// What every secret serializes as.
pub const REDACTED: &str = "***";

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

impl JsonSchema for Secret {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({ "type": "string", "description": "secret (shown as ***)" })
    }
    fn inline_schema() -> bool {
        true
    }
}

fn serialize_url<S: Serializer>(url: &str, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&crate::redact::redact_url(url))
}

fn serialize_opt_url<S: Serializer>(url: &Option<String>, s: S) -> Result<S::Ok, S::Error> {
    match url {
        Some(u) => s.serialize_some(&crate::redact::redact_url(u)),
        None => s.serialize_none(),
    }
}

fn serialize_librdkafka<S: Serializer>(map: &BTreeMap<String, String>, s: S) -> Result<S::Ok, S::Error> {
    redacted_librdkafka(map).serialize(s)
}

/// Overrides from the environment and the command line, highest precedence last.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub brokers: Option<String>,
    pub sysdb: Option<String>,
    pub group: Option<String>,
    pub topic_prefix: Option<String>,
    pub http: Option<String>,
    /// `SLUICE_READ_TOKEN` (environment only: a flag would show in `ps`).
    pub read_token: Option<String>,
    /// `SLUICE_ADMIN_TOKEN` (environment only: a flag would show in `ps`).
    pub admin_token: Option<String>,
    /// `SLUICE_SASL_USERNAME` → `[librdkafka] sasl.username`.
    pub sasl_username: Option<String>,
    /// `SLUICE_SASL_PASSWORD` → `[librdkafka] sasl.password` (environment only; never
    /// logged: `Secret`).
    pub sasl_password: Option<Secret>,
    /// `SLUICE_INSTANCE_ID` → `[kafka] instance_id`.
    pub instance_id: Option<String>,
    /// `SLUICE_SCHEMA_REGISTRY_URL`, `_USERNAME`, `_PASSWORD`, `_CA_FILE` →
    /// `[schema_registry]`.
    pub schema_registry_url: Option<String>,
    pub schema_registry_username: Option<String>,
    pub schema_registry_password: Option<Secret>,
    pub schema_registry_ca_file: Option<String>,
}

impl Overrides {
    /// Read `SLUICE_BROKERS`, `SLUICE_SYSDB`, `SLUICE_GROUP`, `SLUICE_INSTANCE_ID`, `SLUICE_TOPIC_PREFIX`,
    /// `SLUICE_HTTP`, `SLUICE_READ_TOKEN`, `SLUICE_ADMIN_TOKEN`, `SLUICE_SASL_USERNAME`,
    /// `SLUICE_SASL_PASSWORD`.
    pub fn from_env() -> Overrides {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        Overrides {
            brokers: var("SLUICE_BROKERS"),
            sysdb: var("SLUICE_SYSDB"),
            group: var("SLUICE_GROUP"),
            instance_id: var("SLUICE_INSTANCE_ID"),
            topic_prefix: var("SLUICE_TOPIC_PREFIX"),
            // Empty is meaningful here: it disables the HTTP server.
            http: std::env::var("SLUICE_HTTP").ok(),
            read_token: var("SLUICE_READ_TOKEN"),
            admin_token: var("SLUICE_ADMIN_TOKEN"),
            sasl_username: var("SLUICE_SASL_USERNAME"),
            sasl_password: var("SLUICE_SASL_PASSWORD").map(Secret::new),
            schema_registry_url: var("SLUICE_SCHEMA_REGISTRY_URL"),
            schema_registry_username: var("SLUICE_SCHEMA_REGISTRY_USERNAME"),
            schema_registry_password: var("SLUICE_SCHEMA_REGISTRY_PASSWORD").map(Secret::new),
            schema_registry_ca_file: var("SLUICE_SCHEMA_REGISTRY_CA_FILE"),
        }
    }

    /// `other`'s values win where set.
    pub fn then(mut self, other: Overrides) -> Overrides {
        self.brokers = other.brokers.or(self.brokers);
        self.sysdb = other.sysdb.or(self.sysdb);
        self.group = other.group.or(self.group);
        self.instance_id = other.instance_id.or(self.instance_id);
        self.topic_prefix = other.topic_prefix.or(self.topic_prefix);
        self.http = other.http.or(self.http);
        self.read_token = other.read_token.or(self.read_token);
        self.admin_token = other.admin_token.or(self.admin_token);
        self.sasl_username = other.sasl_username.or(self.sasl_username);
        self.sasl_password = other.sasl_password.or(self.sasl_password);
        self.schema_registry_url = other.schema_registry_url.or(self.schema_registry_url);
        self.schema_registry_username = other.schema_registry_username.or(self.schema_registry_username);
        self.schema_registry_password = other.schema_registry_password.or(self.schema_registry_password);
        self.schema_registry_ca_file = other.schema_registry_ca_file.or(self.schema_registry_ca_file);
        self
    }
}

impl Config {
    pub fn from_toml(text: &str, path: &str) -> Result<Config, ConfigError> {
        toml::from_str(text).map_err(|e| ConfigError::Parse { path: path.into(), message: e.to_string() })
    }

    /// Load the file (if any), overlay the `SLUICE_<SECTION>__<KEY>` variables of this
    /// process's environment, apply the overrides, validate.
    pub fn load(path: Option<&Path>, overrides: Overrides) -> Result<Config, ConfigError> {
        Config::load_with_env(path, std::env::vars(), overrides)
    }

    /// [`Config::load`] with the environment given (tests).
    pub fn load_with_env(
        path: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: Overrides,
    ) -> Result<Config, ConfigError> {
        let (text, name) = match path {
            Some(p) => (
                std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::Read { path: p.display().to_string(), source })?,
                p.display().to_string(),
            ),
            None => (String::new(), "(no config file)".to_string()),
        };
        let mut table: toml::Table =
            toml::from_str(&text).map_err(|e| ConfigError::Parse { path: name.clone(), message: e.to_string() })?;
        let mut from_env = Vec::new();
        for (var, value) in env {
            if let Some(rest) = var.strip_prefix(ENV_PREFIX).filter(|r| r.contains("__")) {
                overlay_env(&mut table, &var, rest, &value)?;
                from_env.push(var);
            }
        }
        let mut config: Config = Config::deserialize(table).map_err(|e| ConfigError::Parse {
            path: if from_env.is_empty() { name } else { format!("{name} with {}", from_env.join(", ")) },
            message: e.to_string(),
        })?;
        config.apply(overrides);
        config.validate()?;
        Ok(config)
    }

    /// The configuration as `sluice config show --format toml` prints it: every key,
    /// secrets as `***`.
    /// Optional keys that are unset (TOML has no null) appear as comments, so that every
    /// key is listed.
    pub fn to_toml_redacted(&self) -> Result<String, ConfigError> {
        let text =
            toml::to_string(self).map_err(|e| ConfigError::Invalid(format!("cannot print the configuration: {e}")))?;
        let json = self.redacted();
        let mut out = String::new();
        for line in text.lines() {
            out.push_str(line);
            out.push('\n');
            let section = line.strip_prefix('[').and_then(|l| l.strip_suffix(']'));
            if let Some(fields) = section.and_then(|s| json.get(s)).and_then(|v| v.as_object()) {
                for (k, v) in fields {
                    if v.is_null() {
                        out.push_str(&format!("# {k} is unset\n"));
                    }
                }
            }
        }
        Ok(out)
    }

    /// The configuration as a JSON value: every key, secrets as `***`.
    pub fn redacted(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or_default()
    }

    pub fn apply(&mut self, o: Overrides) {
        if let Some(v) = o.brokers {
            self.kafka.brokers = v;
        }
        if let Some(v) = o.sysdb {
            self.sysdb.url = v;
        }
        if let Some(v) = o.group {
            self.kafka.group = v;
        }
        if let Some(v) = o.instance_id {
            self.kafka.instance_id = Some(v);
        }
        if let Some(v) = o.topic_prefix {
            self.kafka.topic_prefix = v;
        }
        if let Some(v) = o.http {
            self.http.listen = v;
        }
        if let Some(v) = o.read_token {
            self.http.read_token = Some(Secret::new(v));
        }
        if let Some(v) = o.admin_token {
            self.http.admin_token = Some(Secret::new(v));
        }
        if let Some(v) = o.sasl_username {
            self.librdkafka.insert("sasl.username".into(), v);
        }
        if let Some(v) = o.sasl_password {
            self.librdkafka.insert("sasl.password".into(), v.expose().to_string());
        }
        if let Some(v) = o.schema_registry_url {
            self.schema_registry.url = Some(v);
        }
        if let Some(v) = o.schema_registry_username {
            self.schema_registry.username = Some(v);
        }
        if let Some(v) = o.schema_registry_password {
            self.schema_registry.password = Some(v);
        }
        if let Some(v) = o.schema_registry_ca_file {
            self.schema_registry.ca_file = Some(v.into());
        }
    }

    /// The writer schema id every writer of log records frames them with: the one the
    /// schema registry gave `schemas/log_record.avsc` (found at start-up), else
    /// `kafka.confluent_schema_id`.
    pub fn writer_schema_id(&self) -> u32 {
        self.schema_registry.writer_schema_id.unwrap_or(self.kafka.confluent_schema_id)
    }

    /// Cross-field checks at start-up.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let p = &self.processor;
        if p.batch_max_records == 0 || p.batch_max_bytes == 0 {
            return Err(ConfigError::Invalid("processor.batch_max_records and batch_max_bytes must be > 0".into()));
        }
        if self.backfill.chunk_size == 0 || self.backfill.chunk_max_bytes == 0 || self.backfill.concurrency == 0 {
            return Err(ConfigError::Invalid(
                "backfill.chunk_size, backfill.chunk_max_bytes and backfill.concurrency must be > 0".into(),
            ));
        }
        if self.wasm.fuel_per_change == 0 || self.wasm.epoch_deadline_ms == 0 || self.wasm.max_memory_bytes < (1 << 20)
        {
            return Err(ConfigError::Invalid(
                "wasm.fuel_per_change and wasm.epoch_deadline_ms must be > 0, wasm.max_memory_bytes at least 1 MiB"
                    .into(),
            ));
        }
        if !(self.backfill.live_share > 0.0 && self.backfill.live_share <= 1.0) {
            return Err(ConfigError::Invalid(format!(
                "backfill.live_share must be in (0, 1] (1 = no throttle), got {}",
                self.backfill.live_share
            )));
        }
        let c = &self.changelog;
        if c.enabled {
            if c.topic_suffix.is_empty() || c.topic_suffix.contains(['/', ' ']) {
                return Err(ConfigError::Invalid(format!(
                    "changelog.topic_suffix {:?} is not a topic name part",
                    c.topic_suffix
                )));
            }
            if !matches!(c.cleanup_policy.as_str(), "compact" | "delete" | "compact,delete" | "delete,compact") {
                return Err(ConfigError::Invalid(format!(
                    "changelog.cleanup_policy must be compact, delete or compact,delete, got {:?}",
                    c.cleanup_policy
                )));
            }
            if c.max_records_per_transaction == 0 || c.max_bytes_per_transaction == 0 || c.delete_step_rows == 0 {
                return Err(ConfigError::Invalid(
                    "changelog.max_records_per_transaction, max_bytes_per_transaction and delete_step_rows must be > 0"
                        .into(),
                ));
            }
            if c.transaction_timeout_ms < 1_000 {
                return Err(ConfigError::Invalid("changelog.transaction_timeout_ms must be at least 1000".into()));
            }
            if !matches!(c.compression.as_str(), "none" | "gzip" | "snappy" | "lz4" | "zstd") {
                return Err(ConfigError::Invalid(format!(
                    "changelog.compression must be none, gzip, snappy, lz4 or zstd, got {:?}",
                    c.compression
                )));
            }
        }
        let q = &self.sqlite;
        if q.delta_max_rows == 0 || q.delta_max_bytes == 0 || q.compaction_step_bytes < (1 << 20) {
            return Err(ConfigError::Invalid(
                "sqlite.delta_max_rows and delta_max_bytes must be > 0, sqlite.compaction_step_bytes at least 1 MiB (1048576)".into(),
            ));
        }
        if !(q.dead_value_ratio.is_finite() && q.dead_value_ratio >= 0.25) {
            return Err(ConfigError::Invalid(format!(
                "sqlite.dead_value_ratio must be a number >= 0.25 (dead bytes allowed per live byte), got {}",
                q.dead_value_ratio
            )));
        }
        if q.reader_connections == 0 || q.reader_connections > 64 {
            return Err(ConfigError::Invalid("sqlite.reader_connections must be between 1 and 64".into()));
        }
        if !(0..=19).contains(&self.http.render_nice) {
            return Err(ConfigError::Invalid(format!(
                "http.render_nice must be between 0 and 19 (a nice value added to the replica's own), not {}",
                self.http.render_nice
            )));
        }
        if self.kafka.partitions <= 0 || self.kafka.replication_factor <= 0 {
            return Err(ConfigError::Invalid("kafka.partitions and kafka.replication_factor must be > 0".into()));
        }
        if self.kafka.brokers.trim().is_empty() {
            return Err(ConfigError::Invalid("kafka.brokers is empty: set it or SLUICE_BROKERS".into()));
        }
        if u64::from(self.kafka.max_poll_interval_ms) <= p.batch_linger_ms {
            return Err(ConfigError::Invalid(
                "kafka.max_poll_interval_ms must exceed processor.batch_linger_ms".into(),
            ));
        }
        if p.shutdown_timeout_ms >= u64::from(self.kafka.session_timeout_ms) * 4 {
            return Err(ConfigError::Invalid(
                "processor.shutdown_timeout_ms must be well below 4x kafka.session_timeout_ms".into(),
            ));
        }
        if self.schema_registry.enabled() && self.kafka.framing == Framing::Plain {
            return Err(ConfigError::Invalid(
                "schema_registry.url is set but kafka.framing = \"plain\": records carry no schema id then; set kafka.framing = \"confluent\"".into(),
            ));
        }
        if let (Some(read), Some(admin)) = (self.http.read_token(), self.http.admin_token()) {
            if read == admin {
                return Err(ConfigError::Invalid(
                    "http.read_token and http.admin_token are the same token: whoever may read could also change state; give them different values".into(),
                ));
            }
        }
        let t = &self.telemetry;
        if !(0.0..=1.0).contains(&t.sample_ratio) {
            return Err(ConfigError::Invalid("telemetry.sample_ratio must be between 0.0 and 1.0".into()));
        }
        if let Some(endpoint) = t.otlp_endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
            match url::Url::parse(endpoint) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => {
                    return Err(ConfigError::Invalid(format!(
                        "telemetry.otlp_endpoint {:?} is not an http(s) URL (e.g. http://127.0.0.1:4318)",
                        crate::redact::redact_url(endpoint)
                    )))
                }
            }
        }
        // `isolation.level` is pinned to read_committed: aborted transactions must never be
        // applied, and positions past transaction markers rely on it.
        for key in
            ["enable.auto.commit", "enable.auto.offset.store", "group.id", "bootstrap.servers", "isolation.level"]
        {
            if self.librdkafka.contains_key(key) {
                return Err(ConfigError::Invalid(format!(
                    "[librdkafka] must not set {key:?}: Sluice controls it (use the [kafka] section)"
                )));
            }
        }
        check_librdkafka(&self.librdkafka)
    }
}

/// Prefix of every configuration environment variable.
const ENV_PREFIX: &str = "SLUICE_";

/// Set one `SLUICE_<SECTION>__<KEY>` variable into the parsed file. The value's TOML type
/// follows the key's default (numbers and booleans parsed, everything else a string);
/// an unknown section is an error here, an unknown key one at deserialization.
fn overlay_env(table: &mut toml::Table, var: &str, rest: &str, value: &str) -> Result<(), ConfigError> {
    let bad = |m: String| ConfigError::Invalid(format!("environment variable {var}: {m}"));
    let (section, key) = rest.split_once("__").ok_or_else(|| bad("expected SLUICE_<SECTION>__<KEY>".into()))?;
    let section = section.to_ascii_lowercase();
    let defaults = toml::Table::try_from(Config::default()).map_err(|e| bad(e.to_string()))?;
    let known: Vec<String> = schemars::schema_for!(Config)
        .get("properties")
        .and_then(|p| p.as_object())
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if !known.contains(&section) {
        return Err(bad(format!("no configuration section [{section}] (sections: {})", known.join(", "))));
    }
    let key =
        if section == "librdkafka" { key.to_ascii_lowercase().replace('_', ".") } else { key.to_ascii_lowercase() };
    let default = defaults.get(&section).and_then(|t| t.get(&key));
    let parsed = match default {
        Some(toml::Value::Integer(_)) => {
            toml::Value::Integer(value.trim().parse().map_err(|_| bad(format!("{key} must be an integer")))?)
        }
        Some(toml::Value::Float(_)) => {
            toml::Value::Float(value.trim().parse().map_err(|_| bad(format!("{key} must be a number")))?)
        }
        Some(toml::Value::Boolean(_)) => toml::Value::Boolean(match value.trim().to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => true,
            "false" | "0" | "no" | "off" => false,
            _ => return Err(bad(format!("{key} must be true or false"))),
        }),
        Some(toml::Value::Array(_)) => toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|mut t| t.remove("v"))
            .ok_or_else(|| bad(format!("{key} must be a TOML array")))?,
        _ => toml::Value::String(value.to_string()),
    };
    let entry = table.entry(section.clone()).or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match entry {
        toml::Value::Table(t) => {
            t.insert(key, parsed);
            Ok(())
        }
        _ => Err(bad(format!("[{section}] is not a table in the config file"))),
    }
}

pub use crate::redact::is_secret_key;

/// Check the `[librdkafka]` options against librdkafka itself (`kafka::check_options`),
/// which never echoes a value.
fn check_librdkafka(map: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    crate::kafka::check_options(map).map_err(ConfigError::Invalid)
}

/// The librdkafka options with secret values replaced, for logs and `config show`.
pub fn redacted_librdkafka(map: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    crate::redact::redacted_options(map)
}

impl Config {
    /// The settings every Kafka client of a replica or a command uses.
    pub fn client_settings(&self) -> crate::kafka::ClientSettings {
        crate::kafka::ClientSettings {
            brokers: self.kafka.brokers.clone(),
            librdkafka: self.librdkafka.clone(),
            request_timeout_ms: self.kafka.request_timeout_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_rejected() {
        let err = Config::from_toml("[kafka]\nbrokerz = \"x\"\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("brokerz"), "{err}");
        assert!(Config::from_toml("nope = 1\n", "t.toml").is_err());
    }

    #[test]
    fn file_then_env_then_flags() {
        let mut c = Config::from_toml("[kafka]\nbrokers = \"file:1\"\ngroup = \"g\"\n", "t").unwrap();
        let env = Overrides { brokers: Some("env:1".into()), ..Default::default() };
        let flags = Overrides { group: Some("flag".into()), ..Default::default() };
        c.apply(env.then(flags));
        assert_eq!(c.kafka.brokers, "env:1");
        assert_eq!(c.kafka.group, "flag");
        assert_eq!(c.kafka.log_topic(), "sluice.log");
    }

    #[test]
    fn librdkafka_passthrough_and_redaction() {
        let c = Config::from_toml(
            "[librdkafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.password\" = \"hunter2\"\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        let r = redacted_librdkafka(&c.librdkafka);
        assert_eq!(r["sasl.password"], "***");
        assert_eq!(r["security.protocol"], "SASL_SSL");
        let bad = Config::from_toml("[librdkafka]\n\"enable.auto.commit\" = \"true\"\n", "t").unwrap();
        assert!(bad.validate().is_err());
        let uncommitted = Config::from_toml("[librdkafka]\n\"isolation.level\" = \"read_uncommitted\"\n", "t").unwrap();
        let err = uncommitted.validate().unwrap_err().to_string();
        assert!(err.contains("isolation.level"), "{err}");
    }

    #[test]
    fn admin_token_from_file_or_env_and_never_in_debug_output() {
        let mut c = Config::from_toml("[http]\nadmin_token = \"file-token\"\n", "t").unwrap();
        assert_eq!(c.http.admin_token(), Some("file-token"));
        assert!(!format!("{c:?}").contains("file-token"), "the token leaks through Debug");
        c.apply(Overrides { admin_token: Some("env-token".into()), ..Default::default() });
        assert_eq!(c.http.admin_token(), Some("env-token"));
        let empty = Config::from_toml("[http]\nadmin_token = \"\"\n", "t").unwrap();
        assert_eq!(empty.http.admin_token(), None, "an empty token means no token");
        assert_eq!(Config::default().http.admin_token(), None);
    }

    #[test]
    fn read_token_from_file_or_env_never_in_debug_output_and_never_the_admin_token() {
        let mut c = Config::from_toml("[http]\nread_token = \"file-read\"\n", "t").unwrap();
        assert_eq!(c.http.read_token(), Some("file-read"));
        assert!(!format!("{c:?}").contains("file-read"), "the token leaks through Debug");
        c.apply(Overrides { read_token: Some("env-read".into()), ..Default::default() });
        assert_eq!(c.http.read_token(), Some("env-read"));
        let shown = c.to_toml_redacted().unwrap();
        assert!(shown.contains("read_token = \"***\"") && !shown.contains("env-read"), "{shown}");
        assert_eq!(Config::from_toml("[http]\nread_token = \"\"\n", "t").unwrap().http.read_token(), None);
        let same = Config::from_toml("[http]\nread_token = \"tok\"\nadmin_token = \"tok\"\n", "t").unwrap();
        let err = same.validate().unwrap_err().to_string();
        assert!(err.contains("http.read_token and http.admin_token are the same"), "{err}");
        assert!(!err.contains("tok\""), "the token is not echoed: {err}");
        let differ = Config::from_toml("[http]\nread_token = \"r\"\nadmin_token = \"a\"\n", "t").unwrap();
        differ.validate().unwrap();
    }

    fn http(listen: &str, read: Option<&str>, admin: Option<&str>, allow: bool) -> HttpConfig {
        HttpConfig {
            listen: listen.into(),
            read_token: read.map(Secret::new),
            admin_token: admin.map(Secret::new),
            allow_unauthenticated: allow,
            ..HttpConfig::default()
        }
    }

    /// Resolves `*.lan` to a LAN address and `*.local` to loopback; literals as usual.
    fn fake_resolve(addr: &str) -> std::io::Result<Vec<std::net::SocketAddr>> {
        let (host, port) = addr.rsplit_once(':').expect("host:port");
        let port: u16 = port.parse().expect("port");
        match host {
            h if h.ends_with(".lan") => Ok(vec![([192, 168, 1, 20], port).into()]),
            h if h.ends_with(".local") => {
                Ok(vec![([127, 0, 0, 1], port).into(), (std::net::Ipv6Addr::LOCALHOST, port).into()])
            }
            h if h.ends_with(".mixed") => Ok(vec![([127, 0, 0, 1], port).into(), ([10, 0, 0, 7], port).into()]),
            h if h.ends_with(".invalid") => Err(std::io::Error::other("no such host")),
            _ => std::net::ToSocketAddrs::to_socket_addrs(addr).map(Iterator::collect),
        }
    }

    #[test]
    fn a_server_other_machines_reach_needs_a_token_or_says_it_does_not_on_purpose() {
        // Loopback (and no server at all) needs nothing.
        for listen in
            ["127.0.0.1:9464", "127.0.0.2:9464", "[::1]:9464", "[::ffff:127.0.0.1]:9464", "sluice.local:9464", ""]
        {
            http(listen, None, None, false)
                .check_exposure_with(fake_resolve)
                .unwrap_or_else(|e| panic!("{listen}: {e}"));
        }
        // Every other address is refused without a token, with the address and both fixes.
        for (listen, shown) in [
            ("0.0.0.0:9464", "0.0.0.0:9464"),
            ("[::]:9464", "[::]:9464"),
            ("192.168.1.5:9464", "192.168.1.5:9464"),
            ("sluice-0.lan:9464", "192.168.1.20:9464"),
            ("both.mixed:9464", "10.0.0.7:9464"),
            ("nowhere.invalid:9464", "cannot be resolved"),
        ] {
            let err = http(listen, None, None, false).check_exposure_with(fake_resolve).unwrap_err().to_string();
            for needle in [
                &format!("http.listen = {listen:?}"),
                shown,
                "http.read_token",
                "http.admin_token",
                "SLUICE_READ_TOKEN",
                "http.allow_unauthenticated = true",
            ] {
                assert!(err.contains(needle), "{listen}: {needle:?} missing from: {err}");
            }
            // Either token, or the explicit choice, lets it start.
            http(listen, Some("r"), None, false).check_exposure_with(fake_resolve).unwrap();
            http(listen, None, Some("a"), false).check_exposure_with(fake_resolve).unwrap();
            http(listen, None, None, true).check_exposure_with(fake_resolve).unwrap();
            // An empty token is no token.
            assert!(http(listen, Some(""), Some(""), false).check_exposure_with(fake_resolve).is_err());
        }
        // The real resolver: literals and localhost need no DNS server.
        assert!(http("0.0.0.0:1", None, None, false).check_exposure().is_err());
        http("127.0.0.1:1", None, None, false).check_exposure().unwrap();
        http("localhost:1", None, None, false).check_exposure().unwrap();
    }

    #[test]
    fn schema_registry_from_file_or_env_needs_confluent_framing_and_hides_its_password() {
        let plain = Config::from_toml("[schema_registry]\nurl = \"http://r:1\"\n", "t").unwrap();
        let err = plain.validate().unwrap_err().to_string();
        assert!(err.contains("framing"), "{err}");
        let mut c = Config::from_toml(
            "[kafka]\nframing = \"confluent\"\nconfluent_schema_id = 4\n[schema_registry]\nurl = \"http://u:p1@r:1\"\npassword = \"file-pass\"\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        assert_eq!(c.writer_schema_id(), 4, "without a registered id the configured one");
        c.apply(Overrides {
            schema_registry_username: Some("env-user".into()),
            schema_registry_password: Some(Secret::new("env-pass")),
            schema_registry_ca_file: Some("/ca.pem".into()),
            ..Default::default()
        });
        assert_eq!(c.schema_registry.username.as_deref(), Some("env-user"));
        assert_eq!(c.schema_registry.password.as_ref().map(Secret::expose), Some("env-pass"));
        let shown = serde_json::to_string(&c.redacted()["schema_registry"]).unwrap();
        assert!(!shown.contains("env-pass") && !shown.contains("p1"), "{shown}");
        assert!(shown.contains("\"***\"") && shown.contains("***@r:1"), "{shown}");
        assert!(!format!("{c:?}").contains("env-pass"));
        c.schema_registry.writer_schema_id = Some(9);
        assert_eq!(c.writer_schema_id(), 9);
        // `writer_schema_id` is found, never configured.
        assert!(Config::from_toml("[schema_registry]\nwriter_schema_id = 3\n", "t").is_err());
        assert!(!Config::default().schema_registry.enabled());
    }

    #[test]
    fn sasl_credentials_from_env_override_the_file_and_stay_redacted() {
        let mut c = Config::from_toml(
            "[librdkafka]\n\"sasl.username\" = \"file-user\"\n\"sasl.password\" = \"file-pass\"\n",
            "t",
        )
        .unwrap();
        let o = Overrides {
            sasl_username: Some("env-user".into()),
            sasl_password: Some(Secret::new("env-pass")),
            ..Default::default()
        };
        assert!(!format!("{o:?}").contains("env-pass"), "the password leaks through Debug");
        c.apply(Overrides::default().then(o));
        assert_eq!(c.librdkafka["sasl.username"], "env-user");
        assert_eq!(c.librdkafka["sasl.password"], "env-pass");
        let r = redacted_librdkafka(&c.librdkafka);
        assert_eq!(r["sasl.password"], "***");
        assert_eq!(r["sasl.username"], "env-user");
        // Without the variables the file's values stay.
        let mut d = Config::from_toml("[librdkafka]\n\"sasl.password\" = \"file-pass\"\n", "t").unwrap();
        d.apply(Overrides::default());
        assert_eq!(d.librdkafka["sasl.password"], "file-pass");
    }

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn every_key_settable_as_section_key_variable() {
        let c = Config::load_with_env(
            None,
            env(&[
                ("SLUICE_PROCESSOR__BATCH_MAX_RECORDS", "123"),
                ("SLUICE_KAFKA__INSTANCE_ID", "pod-0"),
                ("SLUICE_KAFKA__FRAMING", "confluent"),
                ("SLUICE_LIMITS__MAX_EMBEDDING_DIM", "7"),
                ("SLUICE_METRICS__PER_COLLECTION", "true"),
                ("SLUICE_HTTP__ADMIN_TOKEN", "tok"),
                ("SLUICE_HTTP__READ_TOKEN", "rtok"),
                ("SLUICE_HTTP__ALLOW_UNAUTHENTICATED", "true"),
                ("SLUICE_LIBRDKAFKA__CLIENT_ID", "me"),
                ("SLUICE_BROKERS", "ignored-here"),
                ("OTHER__X", "1"),
            ]),
            Overrides::default(),
        )
        .unwrap();
        assert_eq!(c.processor.batch_max_records, 123);
        assert_eq!(c.kafka.instance_id.as_deref(), Some("pod-0"));
        assert_eq!(c.kafka.framing, Framing::Confluent);
        assert_eq!(c.limits.max_embedding_dim, 7);
        assert!(c.metrics.per_collection);
        assert_eq!(c.http.admin_token(), Some("tok"));
        assert_eq!(c.http.read_token(), Some("rtok"));
        assert!(c.http.allow_unauthenticated);
        assert_eq!(c.librdkafka["client.id"], "me");
        // The named variables still apply, after (and over) the generic ones.
        let c = Config::load_with_env(
            None,
            env(&[("SLUICE_KAFKA__BROKERS", "generic:1")]),
            Overrides { brokers: Some("named:1".into()), ..Default::default() },
        )
        .unwrap();
        assert_eq!(c.kafka.brokers, "named:1");
        for bad in
            [("SLUICE_KAFKA__BROKERZ", "x"), ("SLUICE_NOPE__X", "1"), ("SLUICE_PROCESSOR__BATCH_MAX_RECORDS", "many")]
        {
            let err = Config::load_with_env(None, env(&[bad]), Overrides::default()).unwrap_err().to_string();
            assert!(err.contains(bad.0) || err.contains("brokerz"), "{err}");
        }
    }

    #[test]
    fn config_show_lists_every_key_and_no_secret() {
        let mut c = Config::from_toml(
            "[kafka]\ninstance_id = \"i-1\"\n[http]\nadmin_token = \"tok-secret\"\nread_token = \"rtok-secret\"\n\
             [sysdb]\nurl = \"postgres://u:pw-secret@h/db?password=q-secret&sslmode=disable\"\n\
             [librdkafka]\n\"sasl.password\" = \"sasl-secret\"\n\"ssl.key.pem\" = \"pem-secret\"\n\"client.id\" = \"cid\"\n",
            "t",
        )
        .unwrap();
        c.validate().unwrap();
        let toml_text = c.to_toml_redacted().unwrap();
        let json = serde_json::to_string(&c.redacted()).unwrap();
        for text in [&toml_text, &json] {
            for secret in ["tok-secret", "rtok-secret", "pw-secret", "q-secret", "sasl-secret", "pem-secret"] {
                assert!(!text.contains(secret), "{secret} leaks: {text}");
            }
            for key in [
                "session_timeout_ms",
                "instance_id",
                "max_poll_interval_ms",
                "request_timeout_ms",
                "confluent_schema_id",
                "shutdown_timeout_ms",
                "max_id_bytes",
                "max_embedding_dim",
                "admin_token",
                "read_token",
                "allow_unauthenticated",
                "cid",
                "sslmode",
            ] {
                assert!(text.contains(key), "{key} missing: {text}");
            }
        }
        // The TOML form is a valid config file again (secrets aside) and names unset keys.
        let back: toml::Table = toml::from_str(&toml_text).unwrap();
        assert_eq!(back["kafka"]["instance_id"].as_str(), Some("i-1"));
        c.kafka.instance_id = None;
        assert!(c.to_toml_redacted().unwrap().contains("# instance_id is unset"));
    }

    #[test]
    fn librdkafka_typos_are_refused_without_echoing_the_value() {
        let c = Config::from_toml("[librdkafka]\n\"sasl.pasword\" = \"hunter2\"\n", "t").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("invalid [librdkafka] key \"sasl.pasword\""), "{err}");
        assert!(!err.contains("hunter2"), "{err}");
        let c = Config::from_toml("[librdkafka]\n\"security.protocol\" = \"hunter2-proto\"\n", "t").unwrap();
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("security.protocol") && !err.contains("hunter2"), "{err}");
    }
}
