//! The backfill worker (a role of `sluice process`).
//!
//! It learns of work from the backfill topic (tasks produced by the processor for each
//! accepted marker) and from a periodic sysdb scan for `backfilling` functions (start-up,
//! a crashed replica's backfill, a lost task). For each function it walks the collection
//! as of the marker in id order, one chunk per transaction
//! ([`crate::sysdb::Sysdb::backfill_step`], conditional on the cursor), so a crash or a
//! duplicate worker never applies a chunk twice, and live processing goes on between
//! chunks. Concurrency and chunk size are bounded (`[backfill]` config).

pub mod attach;
pub(crate) mod components;
pub(crate) mod marker_relay;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::Config;
use crate::events::{Backfill, FunctionFailed};
use crate::functions::FunctionStatus;
use crate::kafka::tasks::TaskConsumer;
use crate::metrics::Metrics;
use crate::sysdb::{StepResult, Sysdb};

/// How long a task may wait for the commit of the batch that holds its marker.
const AWAIT_MARKER_COMMIT: Duration = Duration::from_secs(30);

/// Shared state of the worker.
#[derive(Clone)]
pub(crate) struct Worker {
    config: Config,
    sysdb: Arc<Sysdb>,
    metrics: Arc<Metrics>,
    running: Arc<Mutex<HashSet<String>>>,
    permits: Arc<Semaphore>,
    stop: CancellationToken,
}

impl Worker {
    pub(crate) fn new(config: Config, sysdb: Arc<Sysdb>, metrics: Arc<Metrics>, stop: CancellationToken) -> Worker {
        let permits = Arc::new(Semaphore::new(config.backfill.concurrency));
        Worker { config, sysdb, metrics, running: Arc::default(), permits, stop }
    }

    /// Consume tasks and scan the sysdb until `stop` is cancelled.
    pub(crate) async fn run(self) -> Result<(), crate::kafka::KafkaError> {
        let settings = self.config.client_settings();
        let group = format!("{}.backfill", self.config.kafka.group);
        let (consumer, mut tasks) = TaskConsumer::start(&settings, &group, &self.config.kafka.backfill_topic())?;
        let mut scan = tokio::time::interval(Duration::from_millis(self.config.backfill.scan_interval_ms));
        let stop = self.stop.clone();
        info!(group = %group, "backfill worker started");
        loop {
            tokio::select! {
                task = tasks.recv() => match task {
                    Some(bytes) => {
                        Backfill::Received.emit(&self.metrics);
                        match crate::record::avro::decode_backfill_task(&bytes) {
                            Ok(t) => self.spawn(t.function_id),
                            Err(e) => warn!(%e, "undecodable backfill task ignored"),
                        }
                    }
                    None => break,
                },
                _ = scan.tick() => self.scan().await,
                _ = stop.cancelled() => break,
            }
        }
        if let Err(e) = tokio::task::spawn_blocking(move || consumer.shutdown(Duration::from_secs(5))).await {
            warn!(%e, "backfill task consumer shutdown task failed");
        }
        // Let running backfills notice the stop between chunks.
        let _ = tokio::time::timeout(
            Duration::from_secs(10),
            self.permits.acquire_many(self.config.backfill.concurrency as u32),
        )
        .await;
        info!("backfill worker stopped");
        Ok(())
    }

    async fn scan(&self) {
        match self.sysdb.functions(None).await {
            Ok(rows) => {
                for r in rows.into_iter().filter(|r| r.status == FunctionStatus::Backfilling) {
                    self.spawn(r.id);
                }
            }
            Err(e) => warn!(%e, "backfill scan: sysdb error; will retry"),
        }
    }

    /// Run the backfill of `function_id` unless this replica already runs it.
    fn spawn(&self, function_id: String) {
        {
            let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
            if !running.insert(function_id.clone()) {
                return;
            }
        }
        let w = self.clone();
        tokio::spawn(async move {
            let permit = w.permits.clone().acquire_owned().await;
            if permit.is_ok() {
                w.backfill(&function_id).await;
            }
            w.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&function_id);
        });
    }

    async fn backfill(&self, function_id: &str) {
        // A task is produced (and acknowledged) *before* the batch that holds its marker
        // commits (design.md invariant 7), so it often arrives while the function still awaits its
        // marker: wait for that commit (bounded) instead of leaving it to the next scan.
        let mut waited = Duration::ZERO;
        let row = loop {
            match self.sysdb.function(function_id).await {
                Ok(Some(r)) if r.status == FunctionStatus::AwaitingMarker && waited < AWAIT_MARKER_COMMIT => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    waited += Duration::from_millis(50);
                }
                other => break other,
            }
        };
        let row = match row {
            Ok(Some(r)) if r.status == FunctionStatus::Backfilling => r,
            Ok(_) => {
                Backfill::Skipped { function: function_id, why: "not backfilling" }.emit(&self.metrics);
                return;
            }
            Err(e) => {
                Backfill::Failed { function: function_id, what: "cannot read the function", error: &e }
                    .emit(&self.metrics);
                return;
            }
        };
        let f = match components::build_function(&self.sysdb, &row).await {
            Ok(f) => f,
            Err(components::BuildError::Component(reason)) => {
                // Deterministic: another try would fail alike. Marked failed, not retried.
                match self.sysdb.mark_function_failed(function_id, &reason).await {
                    Ok(true) => {
                        FunctionFailed { function: function_id, kind: "load", during: "backfill", reason: &reason }
                            .emit(&self.metrics)
                    }
                    Ok(false) => {}
                    Err(e) => {
                        Backfill::Failed { function: function_id, what: "cannot mark the function failed", error: &e }
                            .emit(&self.metrics)
                    }
                }
                return;
            }
            Err(e) => {
                Backfill::Failed { function: function_id, what: "function cannot be built", error: &e }
                    .emit(&self.metrics);
                return;
            }
        };
        Backfill::Started {
            function: function_id,
            collection: &row.collection_id,
            marker_offset: row.marker_offset,
            cursor: row.backfill_cursor.as_deref(),
        }
        .emit(&self.metrics);
        let started = Instant::now();
        let mut cursor = row.backfill_cursor.clone();
        let mut delays = crate::retry::default_backoff();
        let chunk = crate::sysdb::ChunkLimit {
            records: self.config.backfill.chunk_size,
            bytes: self.config.backfill.chunk_max_bytes,
            changelog: self.config.changelog.enabled,
        };
        let pause = Duration::from_millis(self.config.backfill.pause_ms);
        let mut throttled = Duration::ZERO;
        let mut live = LiveLoad::new(self.metrics.batches_committed());
        loop {
            if self.stop.is_cancelled() {
                return;
            }
            crate::failpoint::hit("before_backfill_chunk_commit");
            match self.sysdb.backfill_step(function_id, cursor.as_deref(), chunk, f.as_ref()).await {
                Ok(StepResult::Applied { processed, cursor: c, finished, held }) => {
                    crate::failpoint::hit("after_backfill_chunk_commit");
                    self.metrics.records_backfilled(processed as u64);
                    cursor = c;
                    delays = crate::retry::default_backoff();
                    if finished {
                        Backfill::Finished { function: function_id, took: started.elapsed(), throttled }
                            .emit(&self.metrics);
                        return;
                    }
                    let live_active = live.active(self.metrics.batches_committed(), Instant::now());
                    let yield_for = live_yield(held, live_active, self.config.backfill.live_share);
                    if !yield_for.is_zero() {
                        throttled += yield_for;
                        tokio::select! {
                            _ = tokio::time::sleep(yield_for) => {}
                            _ = self.stop.cancelled() => return,
                        }
                    }
                }
                Ok(StepResult::CursorMoved { .. }) => {
                    // Another worker advanced it: let that one finish (the scan takes
                    // over again if it dies).
                    Backfill::Skipped { function: function_id, why: "another worker moved the cursor" }
                        .emit(&self.metrics);
                    return;
                }
                Ok(StepResult::Failed { failure }) => {
                    // The step marked it failed in its own transaction.
                    FunctionFailed {
                        function: function_id,
                        kind: failure.kind.as_str(),
                        during: "backfill",
                        reason: &failure.reason,
                    }
                    .emit(&self.metrics);
                    return;
                }
                Ok(StepResult::NotBackfilling) => {
                    Backfill::Skipped {
                        function: function_id,
                        why: "no longer backfilling (detached or done elsewhere)",
                    }
                    .emit(&self.metrics);
                    return;
                }
                Err(e) if e.is_retryable() => {
                    warn!(%e, function = function_id, "backfill step failed; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))) => {}
                        _ = self.stop.cancelled() => return,
                    }
                    continue;
                }
                Err(e) => {
                    Backfill::Failed { function: function_id, what: "backfill step failed", error: &e }
                        .emit(&self.metrics);
                    return;
                }
            }
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            } else {
                tokio::task::yield_now().await;
            }
        }
    }
}

/// How long after its last committed batch this replica's live processing still counts
/// as running. Batches commit every few to a few hundred milliseconds under load; a chunk
/// takes a few, so "a batch committed during this chunk" alone would miss most of them.
const LIVE_WINDOW: Duration = Duration::from_secs(1);

/// Whether live batches are committing, from the replica's batch counter.
struct LiveLoad {
    seen: u64,
    last_change: Option<Instant>,
}

impl LiveLoad {
    fn new(batches: u64) -> LiveLoad {
        LiveLoad { seen: batches, last_change: None }
    }

    /// `batches`: the counter now. Live load is on if it moved within [`LIVE_WINDOW`].
    fn active(&mut self, batches: u64, now: Instant) -> bool {
        if batches != self.seen {
            self.seen = batches;
            self.last_change = Some(now);
        }
        self.last_change.is_some_and(|t| now.duration_since(t) < LIVE_WINDOW)
    }
}

/// The longest single yield: a chunk that held the sysdb unusually long (the first one
/// counts the collection) must not stop the backfill for many seconds.
const MAX_LIVE_YIELD: Duration = Duration::from_secs(1);

/// How long a backfill leaves the sysdb to live processing after a chunk whose
/// transaction took `held` (its wait for the writer not included):
/// `(1 / live_share - 1) * held`, at most [`MAX_LIVE_YIELD`], while live batches commit
/// (`live_active`: a batch within [`LIVE_WINDOW`]), else nothing. Over a stretch of live
/// load, the backfill then takes about `live_share` of the time.
fn live_yield(held: Duration, live_active: bool, live_share: f64) -> Duration {
    if !(live_active && live_share > 0.0 && live_share < 1.0) {
        return Duration::ZERO;
    }
    held.mul_f64(1.0 / live_share - 1.0).min(MAX_LIVE_YIELD)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn live_load_lasts_a_window_after_the_last_committed_batch() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut live = LiveLoad::new(7);
        assert!(!live.active(7, t0), "no batch since the start");
        assert!(live.active(8, t0 + ms(10)));
        // Chunks between two batches still see the load...
        assert!(live.active(8, t0 + ms(500)));
        // ...until a whole window passes without one.
        assert!(!live.active(8, t0 + ms(10) + LIVE_WINDOW));
        assert!(live.active(9, t0 + ms(2000)));
    }

    #[test]
    fn a_backfill_yields_to_live_batches_in_proportion_to_its_chunks() {
        let ms = Duration::from_millis;
        // A 10 ms chunk beside live batches, 10% share: 90 ms for live, so the
        // backfill holds 10 of every 100 ms.
        assert_eq!(live_yield(ms(10), true, 0.1), ms(90));
        assert_eq!(live_yield(ms(30), true, 0.25), ms(90));
        // No live load: no pause.
        assert_eq!(live_yield(ms(10), false, 0.1), Duration::ZERO);
        // 1 turns the throttle off; an out-of-range share (refused by the config) too.
        assert_eq!(live_yield(ms(10), true, 1.0), Duration::ZERO);
        assert_eq!(live_yield(ms(10), true, 0.0), Duration::ZERO);
        // One long chunk (the first counts the collection) yields at most a second.
        assert_eq!(live_yield(ms(800), true, 0.1), MAX_LIVE_YIELD);
    }
}
