//! The `sluice` command line. The shapes of these commands and of their JSON output are
//! a contract other tools and the tests depend on.

pub mod commands;
pub mod dlq;
pub mod offsets_cmd;
/// JSON lines live with the record types; re-exported for the commands and tests.
pub use crate::record::jsonl;

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "Kafka-backed stream processor for collection logs")]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Debug, Args)]
pub struct Global {
    /// TOML configuration file.
    #[arg(long, global = true, env = "SLUICE_CONFIG")]
    pub config: Option<PathBuf>,
    /// Bootstrap servers (overrides config and SLUICE_BROKERS).
    #[arg(long, global = true)]
    pub brokers: Option<String>,
    /// sysdb URL, sqlite://PATH or postgres://... (overrides config and SLUICE_SYSDB).
    #[arg(long, global = true)]
    pub sysdb: Option<String>,
    /// Consumer group (overrides config and SLUICE_GROUP).
    #[arg(long, global = true)]
    pub group: Option<String>,
    /// Topic prefix (overrides config and SLUICE_TOPIC_PREFIX).
    #[arg(long, global = true)]
    pub topic_prefix: Option<String>,
    /// HTTP listen address (overrides config and SLUICE_HTTP).
    #[arg(long, global = true)]
    pub http: Option<String>,
    /// Log format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum Format {
    #[default]
    Human,
    Json,
    Jsonl,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create the log, backfill and DLQ topics (idempotent) and migrate the sysdb.
    Init {
        #[arg(long)]
        partitions: Option<i32>,
        #[arg(long)]
        replication_factor: Option<i32>,
    },
    /// Run a replica: consume the log topic and materialize it into the sysdb; run the
    /// backfill worker and the outbox relay.
    Process {
        /// Roles to run, comma separated: processor, backfill, relay.
        #[arg(long, default_value = "processor,backfill,relay")]
        roles: String,
    },
    /// Attached functions: attach, list, detach.
    Functions {
        #[command(subcommand)]
        command: FunctionsCmd,
    },
    /// Produce JSON lines (a file or - for stdin) as log records.
    Produce {
        #[arg(default_value = "-")]
        input: String,
    },
    /// Print a collection's materialized records, sorted by id.
    Records {
        collection: String,
        #[arg(long, value_enum, default_value_t = Format::Jsonl)]
        format: Format,
    },
    /// Collections.
    Collections {
        #[command(subcommand)]
        command: CollectionsCmd,
    },
    /// Partition positions: sysdb (authoritative), group (lagging), high watermark.
    Offsets {
        #[command(subcommand)]
        command: OffsetsCmd,
    },
    /// The dead-letter topic: list its entries, replay them into the log.
    Dlq {
        #[command(subcommand)]
        command: DlqCmd,
    },
    /// Configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// Print `records=N sha256=HEX`: a canonical checksum of every materialized record
    /// (function outputs excluded), comparable across implementations (benchmarks).
    Checksum,
    /// Print a deterministic synthetic workload as JSON lines (demo and benchmarks).
    Workload {
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        #[arg(long, default_value_t = 64)]
        collections: usize,
        #[arg(long, default_value_t = 384)]
        dim: usize,
        #[arg(long, default_value_t = 1_000)]
        ids_per_collection: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        #[arg(long, default_value = "collection-")]
        collection_prefix: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum CollectionsCmd {
    List {
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
}

#[derive(Debug, Subcommand)]
pub enum OffsetsCmd {
    Show {
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Push the sysdb positions into the consumer group (stop the replicas first).
    Reconcile,
    /// Move partitions' positions, the sysdb's (audited) and the group's: prints the plan
    /// and changes nothing unless --execute.
    Reset(ResetArgs),
    /// Operator resets and recorded data-loss gaps, oldest first.
    History {
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Wait until no partition lags (exit 0), or exit 1 at the timeout naming those that do.
    Wait {
        /// How long to wait: 30s, 5m, 1h, 250ms (a bare number is seconds).
        #[arg(long, default_value = "5m")]
        timeout: String,
    },
}

/// `offsets reset`: one target, and explicit partitions or all of them.
#[derive(Debug, Args)]
#[command(group(ArgGroup::new("target").required(true).args(["to", "to_earliest", "to_latest", "to_datetime", "shift_by"])))]
#[command(group(ArgGroup::new("which").required(true).args(["partition", "all_partitions"])))]
pub struct ResetArgs {
    /// A partition of the log topic (repeatable).
    #[arg(long)]
    pub partition: Vec<i32>,
    /// Every partition of the log topic.
    #[arg(long)]
    pub all_partitions: bool,
    /// This offset (the next record to read).
    #[arg(long, allow_hyphen_values = true)]
    pub to: Option<i64>,
    /// The log start (first offset still stored).
    #[arg(long)]
    pub to_earliest: bool,
    /// The high watermark (skip everything stored).
    #[arg(long)]
    pub to_latest: bool,
    /// The first record at or after this RFC 3339 time (e.g. 2026-12-01T18:00:00Z).
    #[arg(long)]
    pub to_datetime: Option<String>,
    /// The current position (sysdb, else the group offset) plus N (may be negative).
    #[arg(long, allow_hyphen_values = true)]
    pub shift_by: Option<i64>,
    /// Move a target outside [log start, high watermark] to the nearest bound instead of
    /// refusing it.
    #[arg(long)]
    pub clamp: bool,
    /// Write the plan (without it, a dry run).
    #[arg(long)]
    pub execute: bool,
    /// Reset even though the consumer group has active members.
    #[arg(long)]
    pub force: bool,
    /// Why (audited; required with --execute).
    #[arg(long)]
    pub reason: Option<String>,
    #[arg(long, value_enum, default_value_t = Format::Human)]
    pub format: Format,
}

/// `sluice dlq`: entries with their source, kind and message.
#[derive(Debug, Subcommand)]
pub enum DlqCmd {
    /// List DLQ entries (read from the DLQ topic's start to its high watermark).
    List {
        #[command(flatten)]
        filter: DlqFilterArgs,
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Re-produce the chosen entries' original bytes into the log (same key), once each:
    /// a dry run listing them unless --execute.
    Replay {
        #[command(flatten)]
        filter: DlqFilterArgs,
        #[arg(long)]
        execute: bool,
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
}

/// Which DLQ entries.
#[derive(Debug, Args)]
pub struct DlqFilterArgs {
    /// Only this kind (`document_too_large`, `sysdb_rejected`, ...).
    #[arg(long)]
    pub kind: Option<String>,
    /// Only this collection (the record's key).
    #[arg(long)]
    pub collection: Option<String>,
    /// Only entries produced at or after this RFC 3339 time.
    #[arg(long)]
    pub since: Option<String>,
    /// At most N entries.
    #[arg(long)]
    pub limit: Option<usize>,
}

#[derive(Debug, Subcommand)]
pub enum FunctionsCmd {
    /// Attach a function; prints {"function_id", "status", "marker"} as JSON.
    Attach {
        collection: String,
        /// record_counter, statistics or normalize.
        #[arg(long)]
        function: String,
        /// The output collection.
        #[arg(long)]
        output: String,
        /// Function parameter KEY=VALUE (repeatable).
        #[arg(long)]
        param: Vec<String>,
    },
    /// List functions (all, or of one input collection).
    List {
        collection: Option<String>,
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
    /// Detach a function; both the live path and the backfill stop.
    Detach {
        function_id: String,
        /// Also delete the output collection.
        #[arg(long)]
        drop_output: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Print the effective configuration, secrets redacted.
    Show,
}
