//! The `sluice` command line. The shapes of these commands and of their JSON output are
//! a contract other tools and the tests depend on (see [`output`] for `--format`).

pub mod changes_cmd;
pub mod collections_cmd;
pub mod config_cmd;
mod context;
pub mod dlq_cmd;
pub mod functions_cmd;
pub mod init_cmd;
pub mod offsets_cmd;
pub mod output;
pub mod produce_cmd;
pub mod records_cmd;
pub mod schema_cmd;
pub mod token_cmd;
pub mod workload_cmd;
/// JSON lines live with the record types; re-exported for the commands and tests.
pub use crate::record::jsonl;
pub use output::{Format, FormatArg};

use std::path::PathBuf;

use clap::{ArgGroup, Args, Parser, Subcommand, ValueEnum};

/// Printed at the end of `sluice --help`.
const AFTER_HELP: &str = "\
Exit codes:
  0  success (also when the reader of stdout closes the pipe early, e.g. `| head -1`)
  1  failure (the command ran and failed: broker or sysdb unreachable, invalid input, ...)
  2  usage (unknown flag or subcommand, invalid argument, invalid configuration)

Every printing command takes --format table|json|jsonl (default table): json is one
JSON document, jsonl one JSON object per line.
Configuration: file (--config), then SLUICE_SECTION__KEY environment variables (any key,
e.g. SLUICE_PROCESSOR__BATCH_MAX_RECORDS=1000), then the named variables and flags below.
`sluice config docs` lists every key.";

#[derive(Debug, Parser)]
#[command(name = "sluice", version, about = "Kafka-backed stream processor for collection logs", after_help = AFTER_HELP)]
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
    /// Bootstrap servers (overrides [kafka] brokers).
    #[arg(long, global = true, env = "SLUICE_BROKERS")]
    pub brokers: Option<String>,
    /// sysdb URL, sqlite://PATH or postgres://... (overrides [sysdb] url).
    #[arg(long, global = true, env = "SLUICE_SYSDB", hide_env_values = true)]
    pub sysdb: Option<String>,
    /// Consumer group (overrides [kafka] group).
    #[arg(long, global = true, env = "SLUICE_GROUP")]
    pub group: Option<String>,
    /// Topic prefix (overrides [kafka] topic_prefix).
    #[arg(long, global = true, env = "SLUICE_TOPIC_PREFIX")]
    pub topic_prefix: Option<String>,
    /// HTTP listen address, empty to disable (overrides [http] listen).
    #[arg(long, global = true, env = "SLUICE_HTTP")]
    pub http: Option<String>,
    /// Log format (logs go to stderr; filter with SLUICE_LOG, e.g. `debug`).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Human, env = "SLUICE_LOG_FORMAT")]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Human,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Cmd {
    /// Create the log, backfill and DLQ topics (idempotent) and create or migrate the sysdb.
    Init {
        /// Partition count of new topics (overrides [kafka] partitions).
        #[arg(long, env = "SLUICE_KAFKA__PARTITIONS")]
        partitions: Option<i32>,
        /// Replication factor of new topics (overrides [kafka] replication_factor).
        #[arg(long, env = "SLUICE_KAFKA__REPLICATION_FACTOR")]
        replication_factor: Option<i32>,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Run a replica: consume the log topic and materialize it into the sysdb; run the
    /// backfill worker and the outbox relay.
    Process {
        /// Roles to run, comma separated: processor, backfill, relay.
        #[arg(long, default_value = "processor,backfill,relay", env = "SLUICE_ROLES")]
        roles: String,
    },
    /// Attached functions: attach (a built-in or a WebAssembly component), list, show,
    /// detach, and test a component locally.
    Functions {
        #[command(subcommand)]
        command: FunctionsCmd,
    },
    /// Produce JSON lines (a file or - for stdin) as log records. The input is validated
    /// line by line; by default the first invalid line stops the run.
    Produce {
        /// Input file of JSON lines, or - for stdin.
        #[arg(default_value = "-")]
        input: String,
        /// Validate and count the input; produce nothing (no broker needed).
        #[arg(long)]
        dry_run: bool,
        /// Continue past invalid lines, writing each (line number, reason, line) to FILE
        /// as JSON lines.
        #[arg(long, value_name = "FILE", env = "SLUICE_PRODUCE_REJECTS")]
        rejects: Option<PathBuf>,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Print a collection's materialized records, sorted by id.
    Records {
        /// The collection id.
        collection: String,
        #[command(flatten)]
        read: ReadArgs,
        #[command(flatten)]
        format: FormatArg,
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
    /// The change feed (`[changelog] enabled`): ask for a snapshot of the records.
    Changes {
        #[command(subcommand)]
        command: ChangesCmd,
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
    /// The log record schema in the schema registry (`[schema_registry] url`).
    Schema {
        #[command(subcommand)]
        command: SchemaCmd,
    },
    /// Print `records=N sha256=HEX`: a canonical checksum of every materialized record
    /// (function outputs excluded), comparable across implementations (benchmarks).
    Checksum {
        #[command(flatten)]
        read: ReadArgs,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Read tokens: what a write prints (`sluice produce`) so that a read includes it.
    Token {
        #[command(subcommand)]
        command: TokenCmd,
    },
    /// Print a deterministic synthetic workload as JSON lines (demo and benchmarks).
    Workload {
        /// Log records to generate.
        #[arg(long, default_value_t = 10_000)]
        records: usize,
        /// Collections to spread them over.
        #[arg(long, default_value_t = 64)]
        collections: usize,
        /// Embedding dimension.
        #[arg(long, default_value_t = 384)]
        dim: usize,
        /// Distinct record ids per collection.
        #[arg(long, default_value_t = 1_000)]
        ids_per_collection: usize,
        /// Random seed (the same seed gives the same workload).
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Collection ids are this prefix followed by a number.
        #[arg(long, default_value = "collection-")]
        collection_prefix: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum ChangesCmd {
    /// Publish every record of the partitions again, as it is now (operation `snapshot`),
    /// after the changes already in the feed: for consumers that start from an empty
    /// topic, or after the feed was off for a while. Each partition's relay walks its
    /// records in chunks while live changes go on (`docs/changes.md` section 2).
    Snapshot {
        /// A partition to snapshot (repeatable); all partitions when none is given.
        #[arg(long)]
        partition: Vec<i32>,
        #[command(flatten)]
        format: FormatArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum CollectionsCmd {
    /// List the collections the sysdb knows.
    List {
        #[command(flatten)]
        read: ReadArgs,
        #[command(flatten)]
        format: FormatArg,
    },
    /// How fresh a collection is: its partition's sysdb position, high watermark, lag in
    /// records and seconds, and the last change applied to it and when it was produced.
    Freshness {
        /// The collection id.
        collection: String,
        #[command(flatten)]
        format: FormatArg,
    },
}

#[derive(Debug, Subcommand)]
pub enum TokenCmd {
    /// Merge read tokens into one that covers them all (the later offset per partition).
    Merge {
        /// Tokens (or comma-separated lists of tokens).
        #[arg(required = true)]
        tokens: Vec<String>,
        #[command(flatten)]
        format: FormatArg,
    },
    /// A token of everything written so far: the log topic's high watermarks (all its
    /// partitions, or those given), read from the broker now. A read with it includes every
    /// record acknowledged before this command ran.
    Latest {
        /// Only these partitions (repeat the flag or give a comma-separated list).
        #[arg(long = "partition", value_name = "P", value_delimiter = ',')]
        partitions: Vec<i32>,
        #[command(flatten)]
        format: FormatArg,
    },
}

/// What a read must include, and how long it may wait for that (docs/reading.md).
#[derive(Debug, Clone, Args, Default)]
pub struct ReadArgs {
    /// Answer only from a state that includes every record of this read token (printed by
    /// `sluice produce`, returned by the HTTP API's writes); repeat it or give a
    /// comma-separated list to wait for several.
    #[arg(long = "at-least", value_name = "TOKEN")]
    pub at_least: Vec<String>,
    /// How long to wait for the token before failing (exit 1, naming the partition
    /// behind): `500ms`, `10s`, `2m`; `0` fails at once when not covered.
    #[arg(long, value_name = "DURATION", default_value = "10s")]
    pub wait: humantime::Duration,
    /// `committed`: what the sysdb holds now (and any `--at-least`); `latest`: first read
    /// the high watermarks, then wait until the sysdb reaches them.
    #[arg(long, value_enum, default_value_t = crate::reading::ReadLevel::Committed)]
    pub read_level: crate::reading::ReadLevel,
}

impl ReadArgs {
    pub fn wish(&self) -> crate::reading::ReadWish {
        crate::reading::ReadWish { at_least: self.at_least.clone(), level: self.read_level, wait: Some(*self.wait) }
    }
}

#[derive(Debug, Subcommand)]
pub enum OffsetsCmd {
    /// Show each partition's positions and lag.
    Show {
        #[command(flatten)]
        format: FormatArg,
    },
    /// Push the sysdb positions into the consumer group (stop the replicas first).
    Reconcile {
        #[command(flatten)]
        format: FormatArg,
    },
    /// Move partitions' positions, the sysdb's (audited) and the group's: prints the plan
    /// and changes nothing unless --execute.
    Reset(ResetArgs),
    /// Operator resets and recorded data-loss gaps, oldest first.
    History {
        #[command(flatten)]
        format: FormatArg,
    },
    /// Wait until no partition lags (exit 0), or exit 1 at the timeout naming those that do.
    Wait {
        /// How long to wait: 30s, 5m, 1h, 250ms (a bare number is seconds).
        #[arg(long, default_value = "5m")]
        timeout: String,
        #[command(flatten)]
        format: FormatArg,
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
    #[command(flatten)]
    pub format: FormatArg,
}

/// `sluice dlq`: entries with their source, kind and message.
#[derive(Debug, Subcommand)]
pub enum DlqCmd {
    /// List DLQ entries (read from the DLQ topic's start to its high watermark).
    List {
        #[command(flatten)]
        filter: DlqFilterArgs,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Re-produce the chosen entries' original bytes into the log (same key), once each:
    /// a dry run listing them unless --execute.
    Replay {
        #[command(flatten)]
        filter: DlqFilterArgs,
        /// Produce the entries (without it: a dry run listing what would be replayed).
        #[arg(long)]
        execute: bool,
        #[command(flatten)]
        format: FormatArg,
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
    /// Attach a function; prints its id, status and marker offset.
    Attach {
        /// The input collection.
        collection: String,
        /// A built-in function: record_counter, statistics or normalize.
        #[arg(long, required_unless_present = "wasm", conflicts_with = "wasm")]
        function: Option<String>,
        /// A WebAssembly component of the `sluice:function` world (schemas/function.wit).
        /// It is checked (imports nothing, exports the world's major version), run once
        /// on a sample change, and stored in the sysdb by its SHA-256: every replica runs
        /// those bytes, not this file.
        #[arg(long, value_name = "FILE.wasm")]
        wasm: Option<PathBuf>,
        /// The output collection.
        #[arg(long)]
        output: String,
        /// A built-in function's parameter KEY=VALUE (repeatable).
        #[arg(long, conflicts_with = "wasm")]
        param: Vec<String>,
        /// With --wasm: the JSON text given to the component's `init` (default `{}`).
        #[arg(long, value_name = "JSON", requires = "wasm")]
        params: Option<String>,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Show one function in full: status, failed reason, parameters, times.
    Show {
        /// The function id (see `sluice functions list`).
        function_id: String,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Run a WebAssembly component over records, without a broker or a sysdb: the
    /// records are folded into changes as the processor folds them, the component's
    /// deltas applied as to an output collection; prints the deltas and the output.
    Test {
        /// The component (FILE.wasm).
        file: PathBuf,
        /// Records as JSON lines, the format `sluice produce` reads (- for stdin). The
        /// line number (from 0) is each record's offset.
        #[arg(long)]
        input: PathBuf,
        /// The JSON text given to the component's `init` (default `{}`).
        #[arg(long, value_name = "JSON")]
        params: Option<String>,
        /// Only the records of this collection (default: each collection of the input,
        /// on its own).
        #[arg(long)]
        collection: Option<String>,
        #[command(flatten)]
        format: FormatArg,
    },
    /// List functions (all, or of one input collection).
    List {
        /// Only the functions of this input collection.
        collection: Option<String>,
        /// Redraw the table every second (status and backfill progress) until interrupted
        /// (Ctrl-C); table format only.
        #[arg(long)]
        watch: bool,
        #[command(flatten)]
        format: FormatArg,
    },
    /// Detach a function; both the live path and the backfill stop.
    Detach {
        /// The function id (see `sluice functions list`).
        function_id: String,
        /// Also delete the output collection.
        #[arg(long)]
        drop_output: bool,
        #[command(flatten)]
        format: FormatArg,
    },
}

/// `config show` formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ConfigFormat {
    #[default]
    Toml,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCmd {
    /// Print the effective configuration: every key, secrets as `***`.
    Show {
        /// toml (a valid config file) or json (one document).
        #[arg(long, value_enum, default_value_t = ConfigFormat::Toml)]
        format: ConfigFormat,
    },
    /// Print the reference of every configuration key (Markdown; docs/configuration.md).
    Docs,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
        for arg in cmd.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            if arg.get_help().is_none() && arg.get_long_help().is_none() {
                missing.push(format!("{path} {id}: no help text"));
            }
        }
        for sub in cmd.get_subcommands() {
            if sub.get_about().is_none() && sub.get_name() != "help" {
                missing.push(format!("{path} {}: no description", sub.get_name()));
            }
            walk(sub, &format!("{path} {}", sub.get_name()), missing);
        }
    }

    #[test]
    fn every_flag_and_command_has_help_and_global_flags_name_their_variable() {
        let cmd = Cli::command();
        cmd.clone().debug_assert();
        let mut missing = Vec::new();
        walk(&cmd, "sluice", &mut missing);
        assert!(missing.is_empty(), "{missing:#?}");
        for arg in cmd.get_arguments().filter(|a| a.is_global_set()) {
            assert!(arg.get_env().is_some(), "--{} has no environment variable", arg.get_id());
        }
        // Every printing command takes --format with the same default.
        for path in [
            &["init"][..],
            &["produce"],
            &["records"],
            &["checksum"],
            &["collections", "list"],
            &["collections", "freshness"],
            &["token", "merge"],
            &["offsets", "show"],
            &["offsets", "reconcile"],
            &["offsets", "reset"],
            &["functions", "attach"],
            &["functions", "list"],
            &["functions", "detach"],
            &["changes", "snapshot"],
        ] {
            let mut c = &cmd;
            for p in path {
                c = c.find_subcommand(p).unwrap_or_else(|| panic!("{path:?}"));
            }
            let f = c.get_arguments().find(|a| a.get_id() == "format").unwrap_or_else(|| panic!("{path:?} --format"));
            assert_eq!(f.get_default_values(), ["table"], "{path:?}");
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum SchemaCmd {
    /// Is FILE.avsc compatible (by the subject's rule, BACKWARD by default) with every
    /// version of the subject `<topic_prefix>.log-value`, and can Sluice read data written
    /// with it? Exit 1 if not, with the reasons.
    Check {
        /// The candidate schema (an .avsc file).
        file: PathBuf,
        /// Check against the latest version only.
        #[arg(long)]
        latest: bool,
        #[command(flatten)]
        format: FormatArg,
    },
    /// The subject's versions and their schema ids.
    Show {
        #[command(flatten)]
        format: FormatArg,
    },
}
