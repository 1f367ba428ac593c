//! Running a replica (`sluice process`): its roles (processor, backfill worker, outbox
//! relay), the sysdb it opens, the connection preflight, the HTTP server, and how it stops.
//!
//! One cancellation token stops everything: SIGTERM or Ctrl-C cancels it (the handler is
//! installed first, so a signal during start-up is a clean stop too), and every role,
//! including each partition worker below the processor, watches a child of it. The
//! processor commits what it holds within `processor.shutdown_timeout_ms` and leaves the
//! group; the other roles get a bounded time after it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::health::Health;
use crate::kafka::producer::Producer;
use crate::metrics::Metrics;
use crate::reading::board::Board;
use crate::sysdb::{redact_url, Sysdb};

/// How long start-up waits for a sysdb that answers "unavailable" (restarting, busy,
/// out of connections) before giving up.
const SYSDB_OPEN_FOR: Duration = Duration::from_secs(60);

/// How long start-up waits for a broker that does not answer (down, restarting, or too
/// busy to answer within the request timeout) before giving up. A broker that refuses
/// (authentication, TLS) fails the start at once.
const BROKER_WAIT_FOR: Duration = Duration::from_secs(60);

/// How long the backfill worker and the relay get to stop after the processor has.
const ROLE_STOP_BUDGET: Duration = Duration::from_secs(15);
/// How often the readers' shared poll may read the positions while someone waits.
const BOARD_POLL: Duration = Duration::from_millis(100);

/// Which parts of a replica run (`sluice process --roles`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roles {
    pub processor: bool,
    pub backfill: bool,
    pub relay: bool,
}

impl Roles {
    pub const ALL: Roles = Roles { processor: true, backfill: true, relay: true };

    /// Parse `processor,backfill,relay` (any subset, at least one).
    pub fn parse(s: &str) -> Result<Roles> {
        let mut r = Roles { processor: false, backfill: false, relay: false };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part {
                "processor" => r.processor = true,
                "backfill" => r.backfill = true,
                "relay" => r.relay = true,
                "all" => r = Roles::ALL,
                other => bail!("unknown role {other:?}: roles are processor, backfill, relay (comma separated)"),
            }
        }
        if r == (Roles { processor: false, backfill: false, relay: false }) {
            bail!("--roles needs at least one of processor, backfill, relay");
        }
        Ok(r)
    }
}

/// Run a replica until SIGTERM / Ctrl-C (then stop cleanly and return Ok) or a fatal
/// error.
pub async fn run(config: Config, roles: Roles) -> Result<()> {
    let (limits, cache_dir) = config.wasm_host();
    crate::functions::wasm::Host::configure(limits, Some(cache_dir))
        .context("cannot start the WebAssembly host of attached functions")?;
    let stop = CancellationToken::new();
    // Registered before anything else: from here on SIGTERM is ours, not the default
    // action that would kill the process mid-start.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let on_signal = stop.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("shutdown requested");
        on_signal.cancel();
    });
    let started = tokio::select! {
        s = start(&config, &stop) => s?,
        _ = stop.cancelled() => {
            info!("stopped during start-up");
            return Ok(());
        }
    };
    let Started { sysdb, metrics, health, board, server } = started;
    let mut background = Vec::new();
    if roles.processor || roles.backfill {
        // Not joined: a compile cannot be interrupted; the runtime gives one under way two
        // seconds at exit, then leaves it (the cache file is written atomically).
        tokio::spawn(crate::backfill::components::compile_ahead(sysdb.clone(), stop.child_token()));
    }
    if roles.backfill {
        let worker = crate::backfill::Worker::new(config.clone(), sysdb.clone(), metrics.clone(), stop.child_token());
        background.push(tokio::spawn(worker.run()));
    }
    if roles.relay {
        let producer = Producer::new(&config.client_settings(), &[])?;
        let relay = crate::backfill::marker_relay::relay(
            config.clone(),
            sysdb.clone(),
            producer,
            metrics.clone(),
            stop.child_token(),
        );
        background.push(tokio::spawn(async move {
            relay.await;
            Ok(())
        }));
    }
    let result = if roles.processor {
        let token = stop.child_token();
        crate::processor::run(config, sysdb, metrics, health, board, token).await.map_err(anyhow::Error::from)
    } else {
        health.consumer_started();
        health.assignment_completed();
        stop.cancelled().await;
        Ok(())
    };
    stop.cancel();
    for task in background {
        match tokio::time::timeout(ROLE_STOP_BUDGET, task).await {
            Ok(Ok(Err(e))) => warn!(error = %e, "background role stopped with an error"),
            Ok(Err(e)) => warn!(error = %e, "background role panicked"),
            Err(_) => warn!("background role did not stop in time"),
            Ok(Ok(Ok(()))) => {}
        }
    }
    if let Some(server) = server {
        server.shutdown().await;
    }
    result
}

/// What a replica has once it started.
struct Started {
    sysdb: Arc<Sysdb>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    board: Arc<Board>,
    server: Option<crate::api::Server>,
}

/// Preflight, sysdb, metrics and the HTTP server. The HTTP server starts before the
/// processor joins the group (so `/readyz` says "starting") and stops after it has left
/// (the last metrics stay scrapeable).
async fn start(config: &Config, stop: &CancellationToken) -> Result<Started> {
    preflight_patiently(config, stop).await?;
    let sysdb = Arc::new(open_sysdb_patiently(config, stop).await?);
    let metrics = Metrics::with_options(config.metrics.per_collection);
    if let Some(stats) = sysdb.sqlite_stats() {
        metrics.attach_sqlite(stats);
    }
    let health = Health::new();
    // Readers waiting for a read token: woken by the processor's commits, and by one
    // shared poll of the sysdb (at most every 100 ms, only while someone waits).
    let board = Board::new();
    board.spawn_poller(sysdb.clone(), config.kafka.log_topic(), BOARD_POLL, stop.child_token());
    let server = if config.http.listen.is_empty() {
        None
    } else {
        let mut strict = config.http.clone();
        strict.allow_unauthenticated = false;
        if strict.check_exposure().is_err() {
            warn!(
                listen = %config.http.listen,
                "serving every record without a credential to whoever reaches http.listen (http.allow_unauthenticated = true, no token set)"
            );
        }
        let admin =
            Arc::new(crate::api::Admin::new(config.clone(), sysdb.clone())?.with_reads(board.clone(), metrics.clone()));
        let state = crate::api::AppState { metrics: metrics.clone(), health: health.clone(), admin: Some(admin) };
        Some(crate::api::Server::start(&config.http.listen, state).await?)
    };
    Ok(Started { sysdb, metrics, health, board, server })
}

/// The connection preflight, repeated (bounded) while no broker answers: a replica
/// started while the broker restarts, or is too loaded to answer within the request
/// timeout, waits for it instead of exiting.
async fn preflight_patiently(config: &Config, stop: &CancellationToken) -> Result<()> {
    let deadline = Instant::now() + BROKER_WAIT_FOR;
    let mut delays = crate::retry::default_backoff();
    loop {
        match crate::kafka::preflight::check_once(&config.client_settings()).await {
            Ok(()) => return Ok(()),
            Err(f) if f.may_pass_later && Instant::now() < deadline => {
                warn!(error = %f.error, "no answer from the broker at start-up; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))) => {}
                    _ = stop.cancelled() => bail!("stopped while waiting for the broker"),
                }
            }
            Err(f) => return Err(f.error.into()),
        }
    }
}

/// Open the sysdb, waiting (bounded) while it answers "unavailable": a replica started
/// while PostgreSQL restarts or is out of connections waits instead of exiting.
async fn open_sysdb_patiently(config: &Config, stop: &CancellationToken) -> Result<Sysdb> {
    let deadline = Instant::now() + SYSDB_OPEN_FOR;
    let mut delays = crate::retry::default_backoff();
    loop {
        match Sysdb::open_with(&config.sysdb.url, &config.sqlite).await {
            Ok(db) => return Ok(db),
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                warn!(error = %e, "sysdb unavailable at start-up; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))) => {}
                    _ = stop.cancelled() => bail!("stopped while waiting for the sysdb"),
                }
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot open the sysdb at {}", redact_url(&config.sysdb.url)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_subsets_and_refuse_unknown_or_empty() {
        assert_eq!(Roles::parse("all").unwrap(), Roles::ALL);
        assert_eq!(Roles::parse("processor, relay").unwrap(), Roles { processor: true, backfill: false, relay: true });
        assert!(Roles::parse("processor,nope").unwrap_err().to_string().contains("unknown role \"nope\""));
        assert!(Roles::parse(" , ").is_err());
    }
}
