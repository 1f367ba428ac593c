//! The `sluice` command line. The shapes of these commands and of their JSON output are
//! a contract other tools and the tests depend on.

pub mod commands;
pub mod schema;
/// JSON lines live with the record types; re-exported for the commands and tests.
pub use crate::record::jsonl;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

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
    /// Configuration.
    Config {
        #[command(subcommand)]
        command: ConfigCmd,
    },
    /// The log record schema in the schema registry (`[schema_registry] url`).
    Schema {
        #[command(subcommand)]
        command: SchemaCmd,
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
    /// Operator override of a partition's sysdb position (audited).
    Reset {
        #[arg(long)]
        partition: i32,
        #[arg(long)]
        to: i64,
        #[arg(long, default_value = "operator reset")]
        reason: String,
    },
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

#[derive(Debug, Subcommand)]
pub enum SchemaCmd {
    /// Is FILE.avsc compatible (by the subject's rule, BACKWARD by default) with every
    /// version of the subject `<topic_prefix>.log-value`, and can Sluice read data written
    /// with it? Exit 1 if not, with the reasons.
    Check {
        file: PathBuf,
        /// Check against the latest version only.
        #[arg(long)]
        latest: bool,
    },
    /// The subject's versions and their schema ids.
    Show {
        #[arg(long, value_enum, default_value_t = Format::Human)]
        format: Format,
    },
}
