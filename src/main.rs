//! The `sluice` binary: parses the command line, loads the configuration, sets up logs,
//! and dispatches. Exit codes: 0 success (a closed stdout pipe included), 1 failure (the
//! error is printed with its context chain), 2 usage (clap's own code for an invalid
//! command line; also an invalid configuration or read token, and `sluice process` serving
//! HTTP on an address other machines reach without a token: `HttpConfig::check_exposure`).

use std::io::Write;

use clap::Parser;
use sluice::cli::{Cli, Cmd, ConfigCmd, LogFormat};
use sluice::config::{Config, Overrides};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let g = &cli.global;
    let flags = Overrides {
        brokers: g.brokers.clone(),
        sysdb: g.sysdb.clone(),
        group: g.group.clone(),
        topic_prefix: g.topic_prefix.clone(),
        http: g.http.clone(),
        ..Overrides::default()
    };
    let config = match Config::load(g.config.as_deref(), Overrides::from_env().then(flags)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("sluice: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    // A replica's server reachable from other machines needs a token (or the explicit
    // `http.allow_unauthenticated`): a configuration error, before anything starts.
    if matches!(cli.command, Cmd::Process { .. }) {
        if let Err(e) = config.http.check_exposure() {
            eprintln!("sluice: {e}");
            return std::process::ExitCode::from(2);
        }
    }
    // Traces are exported by `sluice process` only, and only with an endpoint.
    let otlp = match &cli.command {
        Cmd::Process { .. } => {
            sluice::telemetry::endpoint(&config.telemetry, std::env::var(sluice::telemetry::OTEL_ENDPOINT_VAR).ok())
        }
        _ => None,
    };
    let telemetry = match init_logs(cli.global.log_format, otlp.as_deref(), &config) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sluice: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async move {
        // Writers of log records frame them with the id the schema registry gives
        // `schemas/log_record.avsc` (registered once, here, when a registry is configured).
        let mut config = config;
        if matches!(
            cli.command,
            Cmd::Produce { .. }
                | Cmd::Process { .. }
                | Cmd::Functions { command: sluice::cli::FunctionsCmd::Attach { .. } }
        ) {
            sluice::schema_registry::prepare_writer(&mut config).await?;
        }
        match cli.command {
            Cmd::Init { partitions, replication_factor, format } => {
                sluice::cli::init_cmd::init(&config, partitions, replication_factor, format.format).await
            }
            Cmd::Process { roles } => match sluice::replica::Roles::parse(&roles) {
                Ok(roles) => sluice::replica::run(config, roles).await,
                Err(e) => Err(e),
            },
            Cmd::Schema { command } => sluice::cli::schema_cmd::run(&config, command).await,
            Cmd::Checksum { read, format } => sluice::cli::records_cmd::checksum(&config, &read, format.format).await,
            Cmd::Token { command } => sluice::cli::token_cmd::run(&config, command).await,
            Cmd::Functions { command } => sluice::cli::functions_cmd::run(&config, command).await,
            Cmd::Produce { input, dry_run, rejects, format } => {
                sluice::cli::produce_cmd::produce(&config, &input, dry_run, rejects.as_deref(), format.format).await
            }
            Cmd::Records { collection, read, format } => {
                sluice::cli::records_cmd::records(&config, &collection, &read, format.format).await
            }
            Cmd::Collections { command } => sluice::cli::collections_cmd::run(&config, command).await,
            Cmd::Offsets { command } => sluice::cli::offsets_cmd::run(&config, command).await,
            Cmd::Dlq { command } => sluice::cli::dlq_cmd::run(&config, command).await,
            Cmd::Config { command: ConfigCmd::Show { format } } => sluice::cli::config_cmd::show(&config, format),
            Cmd::Config { command: ConfigCmd::Docs } => sluice::cli::config_cmd::docs(),
            Cmd::Workload { records, collections, dim, ids_per_collection, seed, collection_prefix } => {
                sluice::cli::workload_cmd::run(&sluice::workload::WorkloadSpec {
                    records,
                    collections,
                    dim,
                    ids_per_collection,
                    seed,
                    collection_prefix,
                    ..Default::default()
                })
            }
        }
    });
    // The spans of the last batches are still queued: export them before exiting.
    if let Some(t) = telemetry {
        t.shutdown();
    }
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        // `sluice records ... | head` closes the pipe early: the reader has what it wanted,
        // which is not an error (exit 0, nothing on stderr).
        Err(e) if sluice::cli::output::is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // stderr closed too: nothing left to tell.
            let _ = writeln!(std::io::stderr(), "sluice: {e:#}");
            // A malformed read token, or one of another topic, is a usage error.
            let bad_token = e.chain().any(|c| {
                c.downcast_ref::<sluice::token::TokenError>().is_some()
                    || matches!(
                        c.downcast_ref::<sluice::reading::ReadError>(),
                        Some(sluice::reading::ReadError::Token(_))
                    )
            });
            if bad_token {
                std::process::ExitCode::from(2)
            } else {
                std::process::ExitCode::FAILURE
            }
        }
    }
}

/// Logs to stderr (`SLUICE_LOG` filter, human or JSON lines) and, with an OTLP endpoint,
/// the trace export beside them.
fn init_logs(
    format: LogFormat,
    otlp: Option<&str>,
    config: &Config,
) -> anyhow::Result<Option<sluice::telemetry::Telemetry>> {
    let filter = || EnvFilter::try_from_env("SLUICE_LOG").unwrap_or_else(|_| EnvFilter::new("info,rdkafka=warn"));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let Some(endpoint) = otlp else {
        // No export: the plain log subscriber, one global filter (the batch's child spans
        // are debug-level: disabled at their call sites).
        let builder = tracing_subscriber::fmt().with_env_filter(filter()).with_ansi(ansi).with_writer(std::io::stderr);
        match format {
            LogFormat::Human => builder.init(),
            LogFormat::Json => builder.json().init(),
        }
        return Ok(None);
    };
    // With the export, each layer has its own filter: the log lines keep `SLUICE_LOG`, the
    // export sees the processor's spans whatever the log level.
    let (telemetry, otel) = sluice::telemetry::Telemetry::start(&config.telemetry, endpoint)?;
    let fmt = tracing_subscriber::fmt::layer().with_ansi(ansi).with_writer(std::io::stderr);
    let fmt: Box<dyn Layer<Registry> + Send + Sync> = match format {
        LogFormat::Human => fmt.with_filter(filter()).boxed(),
        LogFormat::Json => fmt.json().with_filter(filter()).boxed(),
    };
    tracing_subscriber::registry().with(fmt).with(otel).init();
    tracing::info!(endpoint = %telemetry.url(), service = %config.telemetry.service_name, sample_ratio = config.telemetry.sample_ratio, "exporting traces over OTLP/HTTP");
    Ok(Some(telemetry))
}

/// mimalloc for ordinary allocations, the system allocator for large ones (src/alloc.rs).
#[global_allocator]
static GLOBAL: sluice::alloc::Split = sluice::alloc::Split;
