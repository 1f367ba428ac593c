//! `sluice process`: the consumer-group replica's main loop.
//!
//! The router receives the consumer thread's events in order, answers assignments from
//! the sysdb ([`start::resolve_start`]), runs one [`partition::Worker`] task per assigned
//! partition, and stops workers on revoke before the consumer unassigns.

pub mod batch;
pub mod function_batches;
pub mod partition;
pub mod seams;
#[cfg(test)]
mod simulation;
pub mod start;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, warn};

use crate::config::Config;
use crate::events::{DataLossGap, GroupOffsetAhead, SysdbRetry};
use crate::health::Health;
use crate::kafka::cluster::MetadataClient;
use crate::kafka::consumer::{Command, ConsumerHandle, ConsumerSettings, Event, StartDecision};
use crate::kafka::producer::Producer;
use crate::kafka::{KafkaError, Msg, PartitionInfo};
use crate::metrics::Metrics;
use crate::sysdb::Sysdb;
use partition::{Shared, Worker, WorkerMsg};
use seams::{ConsumerLink, Metadata, Outbound};
use start::{resolve_start, HaltReason, Start};

/// Inbox size of a worker, in message chunks (each up to 1 MiB). A worker takes nothing
/// from its inbox while its batch commits; what arrives meanwhile waits here, then in the
/// router's backlog, then in librdkafka's queue of the partition, and the next batch
/// forms from it afterwards. A deeper inbox only holds more memory: on W1 drains (8
/// partitions, 4 interleaved pairs per step), 8 to 4 and 4 to 2 chunks kept the CPU
/// (median ratios 1.004 and 1.006) and lowered the peak RSS by about 48 and 44 MB.
const WORKER_INBOX: usize = 2;

/// Backlogged message chunks of one worker at which the consumer stops reading its
/// partition (and reads it again once the backlog is empty). Bounds a worker's backlog to
/// about this many chunks beyond its inbox; the partition's records then wait in
/// librdkafka's queue of it, and nothing is fetched twice.
const BACKLOG_PAUSE_AT: usize = 2;

/// How often the router moves backlogged messages into inboxes that have room, while any
/// backlog exists: a worker empties its small inbox in one go, and what waits should reach
/// it before it decides that nothing more is coming.
const BACKLOG_DRAIN_INTERVAL: Duration = Duration::from_millis(1);

/// How often the partition gauges read the high watermarks and group offsets.
const GAUGE_REFRESH: Duration = Duration::from_secs(5);

struct WorkerHandle {
    inbox: mpsc::Sender<WorkerMsg>,
    /// What did not fit in the inbox, in order; at `BACKLOG_PAUSE_AT` chunks the
    /// consumer stops reading the partition, so this stays bounded.
    backlog: VecDeque<WorkerMsg>,
    /// Whether the consumer stopped reading the partition because of `backlog`.
    throttled: bool,
    /// Tells the worker to commit what it holds (bounded) and exit.
    stop: CancellationToken,
    /// Set when the router stops waiting for the worker: no commit after that.
    fence: CancellationToken,
    task: JoinHandle<()>,
}

/// The assigned partitions' workers. The router never waits on a worker: a message that
/// does not fit in a worker's inbox waits in that worker's backlog and the consumer stops
/// reading its partition, so one stuck partition never stops the others, a revoke or a
/// shutdown.
struct Workers {
    map: BTreeMap<i32, WorkerHandle>,
    commander: crate::kafka::consumer::Commander,
    /// The processor's token: each worker's is a child of it.
    stop: CancellationToken,
}

/// A router that is dropped while it runs (its task aborted: the simulation's crash of a
/// replica) takes its workers with it, fenced first: nothing of it commits after it is
/// gone. A router that returns has stopped every worker already, so this finds none.
impl Drop for Workers {
    fn drop(&mut self) {
        for (_, w) in std::mem::take(&mut self.map) {
            w.fence.cancel();
            w.task.abort();
        }
    }
}

impl Workers {
    /// Hand `msg` to the partition's worker, in order, without waiting.
    fn deliver(&mut self, partition: i32, msg: WorkerMsg) {
        let Some(w) = self.map.get_mut(&partition) else { return };
        if !w.backlog.is_empty() {
            w.backlog.push_back(msg);
            // Past the pause, only chunks already on their way arrive (at most a channel's).
            debug_assert!(
                w.backlog.len() <= BACKLOG_PAUSE_AT + crate::config::memory::CHANNEL_CHUNKS as usize + 1,
                "design.md invariant 16: partition {partition}'s backlog holds {} chunks",
                w.backlog.len()
            );
            // The consumer stops reading the partition; its records wait in librdkafka's
            // queue of it (bounded there), and nothing is thrown away or fetched twice.
            if w.backlog.len() >= BACKLOG_PAUSE_AT && !w.throttled {
                w.throttled = true;
                self.commander.send(Command::Throttle { partition, on: true });
            }
            return;
        }
        match w.inbox.try_send(msg) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(msg)) => w.backlog.push_back(msg),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Move backlogs into inboxes as room frees up; read again the partitions whose backlog emptied.
    fn drain_backlogs(&mut self) {
        for (&p, w) in self.map.iter_mut() {
            if w.backlog.is_empty() {
                continue;
            }
            while let Some(msg) = w.backlog.pop_front() {
                match w.inbox.try_send(msg) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(msg)) => {
                        w.backlog.push_front(msg);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => w.backlog.clear(),
                }
            }
            if w.backlog.is_empty() && w.throttled {
                w.throttled = false;
                self.commander.send(Command::Throttle { partition: p, on: false });
            }
        }
    }

    fn any_backlog(&self) -> bool {
        self.map.values().any(|w| !w.backlog.is_empty())
    }

    /// Stop these partitions' workers: each commits what it holds, bounded by `deadline`;
    /// a worker still running then is aborted (its uncommitted batch is simply re-read by
    /// the partition's next owner from the sysdb position).
    async fn stop(&mut self, partitions: &[i32], deadline: tokio::time::Instant) {
        let mut tasks = Vec::new();
        for p in partitions {
            if let Some(w) = self.map.remove(p) {
                w.stop.cancel();
                tasks.push((*p, w.fence, w.task));
            }
        }
        for (p, fence, mut task) in tasks {
            if tokio::time::timeout_at(deadline, &mut task).await.is_err() {
                warn!(partition = p, "partition worker did not stop in time; fencing and aborting it");
                fence.cancel();
                task.abort();
            }
        }
    }
}

/// Run the processor until `stop` is cancelled (then commit what is in flight within the
/// shutdown timeout, leave the group and return Ok).
/// Why the processor stopped other than by being told to.
#[derive(Debug, thiserror::Error)]
pub enum ProcessorError {
    #[error(transparent)]
    Sysdb(#[from] crate::sysdb::SysdbError),
    #[error(transparent)]
    Kafka(#[from] KafkaError),
    #[error("topic {topic} not found: run `sluice init` first ({source})")]
    TopicMissing { topic: String, source: KafkaError },
    #[error("processor stopped on a fatal error: {0}")]
    Fatal(String),
    #[error("an internal task of the processor failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

pub async fn run(
    config: Config,
    sysdb: Arc<Sysdb>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    board: Arc<crate::reading::board::Board>,
    stop: CancellationToken,
) -> Result<(), ProcessorError> {
    let settings = config.client_settings();
    let topic = config.kafka.log_topic();
    // Retried like every sysdb read of the start: a sysdb slow to hand out a connection
    // (a loaded server) must not end the replica (the chaos run met it).
    let topic_partitions = match retry_sysdb(&metrics, || async {
        if crate::failpoint::fail("processor_start_sysdb") {
            return Err(crate::sysdb::SysdbError::Unavailable {
                backend: sysdb.backend(),
                message: "fail point: no connection within the timeout".into(),
            });
        }
        sysdb.topic_partitions(&topic).await
    })
    .await?
    {
        Some(n) => n,
        None => {
            let s = settings.clone();
            let t = topic.clone();
            tokio::task::spawn_blocking(move || crate::kafka::cluster::partition_count(&s, &t))
                .await?
                .map_err(|source| ProcessorError::TopicMissing { topic: topic.clone(), source })?
        }
    };
    let producer = Producer::new(&settings, &[])?;
    // The change feed's relay: checked against the broker before anything is consumed (a
    // transaction timeout the broker refuses would fail every partition's producer).
    let relay = if config.changelog.enabled {
        Some(
            crate::changelog::Relay::prepare(&config, sysdb.clone(), metrics.clone(), topic_partitions)
                .await
                .map_err(|e| ProcessorError::Fatal(e.to_string()))?,
        )
    } else {
        None
    };
    let metadata =
        Metadata::Kafka(Arc::new(std::sync::Mutex::new(MetadataClient::new(&settings, Some(&config.kafka.group))?)));
    let (consumer, events) = ConsumerHandle::start(ConsumerSettings {
        client: settings.clone(),
        group: config.kafka.group.clone(),
        topic: topic.clone(),
        cooperative: config.kafka.rebalance_protocol == crate::config::RebalanceProtocol::Cooperative,
        session_timeout_ms: config.kafka.session_timeout_ms,
        instance_id: config.kafka.instance_id.clone(),
        max_poll_interval_ms: config.kafka.max_poll_interval_ms,
        // A full channel only stops the reading (nothing is paused or fetched twice), so
        // it needs no more room than keeps the router busy.
        channel_capacity: 32,
    })?;
    metrics.attach_consumer(consumer.stats.clone());
    health.consumer_started();
    let shared = Arc::new(Shared {
        dlq_topic: config.kafka.dlq_topic(),
        backfill_topic: config.kafka.backfill_topic(),
        config: config.clone(),
        sysdb: sysdb.clone(),
        producer: Outbound::Kafka(producer),
        commander: consumer.commander(),
        metrics: metrics.clone(),
        health: health.clone(),
        metadata,
        topic: topic.clone(),
        topic_partitions,
        registry: crate::schema_registry::SchemaRegistry::from_config(&config.schema_registry)
            .map_err(|e| ProcessorError::Fatal(e.to_string()))?
            .map(Arc::new),
        board,
        relay,
        #[cfg(test)]
        hooks: None,
    });
    info!(topic = %topic, group = %config.kafka.group, sysdb = sysdb.backend(), "processor started");
    let commander = consumer.commander();
    route(shared, ConsumerLink { events, commander, handle: Some(consumer) }, stop).await
}

/// The router's loop, from a started consumer to the end: answer assignments, hand
/// messages to the workers, stop them on revoke and at shutdown, then stop the consumer.
pub(crate) async fn route(
    shared: Arc<Shared>,
    consumer: ConsumerLink,
    stop: CancellationToken,
) -> Result<(), ProcessorError> {
    let ConsumerLink { mut events, commander, handle } = consumer;
    let health = shared.health.clone();
    let config = shared.config.clone();
    let refresh_now = Arc::new(Notify::new());
    let refresh = AbortOnDrop(tokio::spawn(refresh_partition_gauges(shared.clone(), refresh_now.clone())));

    let mut workers = Workers { map: BTreeMap::new(), commander: commander.clone(), stop: stop.clone() };
    let mut stopping = false;
    let mut fatal: Option<String> = None;
    let shutdown_timeout = Duration::from_millis(config.processor.shutdown_timeout_ms);
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    loop {
        let backlog = workers.any_backlog();
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = tokio::time::sleep(BACKLOG_DRAIN_INTERVAL), if backlog => {
                workers.drain_backlogs();
                continue;
            }
            _ = stop.cancelled(), if !stopping => {
                info!("shutdown requested: committing in-flight batches and leaving the group");
                health.stopping("shutdown requested");
                stopping = true;
                stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                commander.send(Command::Shutdown);
                continue;
            }
            _ = sleep_until_opt(stop_deadline) => {
                warn!("shutdown timeout reached; exiting");
                break;
            }
        };
        let Some(ev) = ev else { break };
        match ev {
            Event::Assign { partitions, reply } => {
                let decisions = assign(&shared, &mut workers, partitions).await;
                match decisions {
                    Ok(d) => {
                        let _ = reply.send(d);
                    }
                    Err(e) => {
                        error!(error = %e, "cannot load positions for the assignment; exiting so another replica takes over");
                        health.stopping(format!("cannot load positions for the assignment: {e}"));
                        fatal = Some(e.to_string());
                        commander.send(Command::Shutdown);
                        stopping = true;
                        stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                        drop(reply);
                    }
                }
            }
            Event::Assigned { partitions } => {
                for (d, generation) in partitions {
                    workers.deliver(d.partition, WorkerMsg::Generation(generation));
                }
                health.assignment_completed();
                refresh_now.notify_one();
            }
            Event::Revoke { partitions, done } => {
                let mut done = Some(done);
                #[cfg(test)]
                if shared.hooks.as_ref().is_some_and(|h| h.mistake() == Some(seams::Mistake::ConfirmRevokeFirst)) {
                    confirm_revoke(&shared, &partitions, done.take());
                }
                // The consumer thread waits up to 10 s for `done`: the revoked partitions'
                // workers commit what they hold, or are fenced and aborted, before it.
                workers.stop(&partitions, tokio::time::Instant::now() + REVOKE_BUDGET).await;
                forget_partitions(&shared, &partitions);
                confirm_revoke(&shared, &partitions, done.take());
            }
            Event::Messages(msgs) => route_messages(&mut workers, msgs),
            Event::Seeked { partition, offset, generation } => {
                workers.deliver(partition, WorkerMsg::Seeked { offset, generation });
            }
            Event::OffsetOutOfRange { partitions } => {
                for p in partitions {
                    workers.deliver(p, WorkerMsg::CheckGap);
                }
            }
            Event::Position { partition, offset, generation } => {
                workers.deliver(partition, WorkerMsg::Position { offset, generation });
            }
            Event::SeekFailed { partition, offset, error } => {
                workers.deliver(partition, WorkerMsg::SeekFailed { offset, error });
            }
            Event::Fatal(msg) => {
                error!(error = %msg, "fatal consumer error");
                health.stopping(format!("fatal consumer error: {msg}"));
                fatal = Some(msg);
                if !stopping {
                    commander.send(Command::Shutdown);
                    stopping = true;
                    stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                }
            }
        }
    }
    let all: Vec<i32> = workers.map.keys().copied().collect();
    // Within the shutdown timeout whatever a worker is doing (at least a short grace
    // when the timeout already ran out).
    let grace = stop_deadline
        .map(|d| d.max(tokio::time::Instant::now() + Duration::from_millis(500)))
        .unwrap_or_else(|| tokio::time::Instant::now() + REVOKE_BUDGET);
    workers.stop(&all, grace).await;
    forget_partitions(&shared, &all);
    drop(refresh);
    if let Some(consumer) = handle {
        tokio::task::spawn_blocking(move || consumer.shutdown(Duration::from_secs(5))).await?;
    }
    info!("processor stopped");
    match fatal {
        Some(m) => Err(ProcessorError::Fatal(m)),
        None => Ok(()),
    }
}

/// A task that ends when its handle is dropped, whichever way the router ends.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Answer the consumer thread that the revoke of `partitions` is done (once: `None` when
/// it was answered already).
fn confirm_revoke(shared: &Shared, partitions: &[i32], done: Option<std::sync::mpsc::SyncSender<()>>) {
    let Some(done) = done else { return };
    #[cfg(test)]
    if let Some(hooks) = &shared.hooks {
        hooks.revoke_confirmed(partitions);
    }
    #[cfg(not(test))]
    let _ = (shared, partitions);
    let _ = done.send(());
}

/// How long a revoke lets the revoked partitions' workers commit what they hold (the
/// consumer thread waits 10 s for the answer).
const REVOKE_BUDGET: Duration = Duration::from_secs(8);

fn route_messages(workers: &mut Workers, msgs: Vec<Msg>) {
    let mut by_partition: BTreeMap<i32, Vec<Msg>> = BTreeMap::new();
    for m in msgs {
        by_partition.entry(m.partition).or_default().push(m);
    }
    for (p, ms) in by_partition {
        workers.deliver(p, WorkerMsg::Messages(ms));
    }
}

/// Revoked (or stopped) partitions: drop their gauges and their halted state.
fn forget_partitions(shared: &Shared, partitions: &[i32]) {
    for p in partitions {
        shared.metrics.partition_revoked(*p);
    }
    shared.health.partitions_revoked(partitions);
}

/// Every [`GAUGE_REFRESH`], and when `now` is notified (after an assignment): read the
/// high watermarks and the group's committed offsets of the assigned partitions for the
/// partition gauges. The lag is computed from the sysdb position, never from librdkafka's
/// consumer lag.
async fn refresh_partition_gauges(shared: Arc<Shared>, now: Arc<Notify>) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = now.notified() => {}
        }
        let partitions = shared.metrics.tracked_partitions();
        if partitions.is_empty() {
            continue;
        }
        match shared.metadata.broker_offsets(&shared.topic, partitions).await {
            Ok(rows) => {
                for (p, high, group) in rows {
                    shared.metrics.partition_broker_offsets(p, high, group);
                }
                if failing {
                    info!("partition gauges: watermarks and group offsets readable again");
                    failing = false;
                }
            }
            // Logged once per outage, not every 5 s.
            Err(e) if !failing => {
                warn!(error = %e, "partition gauges: cannot read watermarks or group offsets; keeping the last values");
                failing = true;
            }
            Err(_) => {}
        }
        if shared.relay.is_some() {
            match shared.sysdb.changelog_positions().await {
                Ok(positions) => {
                    let known: HashMap<i32, _> = positions.into_iter().map(|c| (c.partition, c)).collect();
                    for p in shared.metrics.tracked_partitions() {
                        let (unpublished, oldest) = known.get(&p).map_or((0, None), |c| {
                            ((c.next_seq - 1 - c.published_seq).max(0), c.oldest_unpublished_ms)
                        });
                        shared.metrics.partition_changelog(p, unpublished, oldest);
                    }
                }
                Err(e) => debug!(error = %e, "partition gauges: cannot read the changelog outbox"),
            }
        }
    }
}

/// Answer an assignment: read the sysdb positions, decide each partition's start, create
/// missing rows, record skipped gaps, and start the workers.
async fn assign(
    shared: &Arc<Shared>,
    workers: &mut Workers,
    partitions: Vec<PartitionInfo>,
) -> Result<Vec<StartDecision>, crate::sysdb::SysdbError> {
    let cfg = &shared.config;
    let positions = retry_sysdb(&shared.metrics, || shared.sysdb.positions(&shared.topic)).await?;
    if shared.relay.is_some() {
        // The change feed starts for these partitions before their first batch: one that
        // never had it and holds records gets a snapshot (`docs/changes.md` section 2).
        let ps: Vec<i32> = partitions.iter().map(|i| i.partition).collect();
        for p in retry_sysdb(&shared.metrics, || shared.sysdb.changelog_begin(&ps)).await? {
            info!(
                partition = p,
                "the change feed starts on a partition that holds records: a changelog snapshot is requested"
            );
        }
    }
    let mut decisions = Vec::new();
    for info in partitions {
        let mut s: Start = resolve_start(
            positions.get(&info.partition).copied(),
            info,
            cfg.kafka.auto_offset_reset,
            cfg.processor.on_data_loss,
        );
        #[cfg(test)]
        if shared.hooks.as_ref().and_then(|h| h.mistake()) == Some(seams::Mistake::StartFromGroupOffset) {
            if let Some(g) = info.group_offset {
                s.offset = g;
            }
        }
        if s.group_ahead {
            GroupOffsetAhead { partition: info.partition, sysdb: s.offset, group: info.group_offset }
                .emit(&shared.metrics);
        }
        if s.needs_row {
            let from = s.gap.map(|(from, _)| from).unwrap_or(s.offset);
            let stored =
                retry_sysdb(&shared.metrics, || shared.sysdb.init_position(&shared.topic, info.partition, from))
                    .await?;
            if stored != from {
                // Another replica created the row meanwhile: decide again from it.
                s = resolve_start(Some(stored), info, cfg.kafka.auto_offset_reset, cfg.processor.on_data_loss);
            }
        }
        if let Some((from, to)) = s.gap {
            retry_sysdb(&shared.metrics, || shared.sysdb.record_gap(&shared.topic, info.partition, from, to)).await?;
            DataLossGap { partition: info.partition, from, to, recorded: true }.emit(&shared.metrics);
        }
        let p = info.partition;
        let reason = match s.halted {
            Some(HaltReason::DataLoss { from, to }) => {
                DataLossGap { partition: p, from, to, recorded: false }.emit(&shared.metrics);
                Some(format!("records [{from}, {to}) were deleted by retention before being processed (on_data_loss = \"halt\"); to accept the loss: `sluice offsets reset --partition {p} --to {to}` (or set on_data_loss = \"skip\")"))
            }
            Some(HaltReason::AheadOfLog { sysdb, high }) => Some(format!(
                "the sysdb position {sysdb} is beyond the partition's high watermark {high} (topic recreated or broker data lost); fix with `sluice offsets reset --partition {p}`"
            )),
            None => None,
        };
        let halted = reason.is_some();
        if let Some(r) = &reason {
            error!(partition = p, reason = %r, "partition HALTED at assignment");
        }
        shared.metrics.partition_assigned(info.partition, s.offset, info.high, info.group_offset, halted);
        // The stored state follows: a halt is named in `sluice offsets show`; a partition
        // that starts cleanly is no longer reported halted by an earlier owner.
        if let Err(e) = shared.sysdb.set_partition_halted(&shared.topic, p, reason.as_deref()).await {
            warn!(%e, partition = p, "cannot store the partition's halted state in the sysdb");
        }
        shared.set_halted(info.partition, reason);
        let (tx, rx) = mpsc::channel(WORKER_INBOX);
        let stop = workers.stop.child_token();
        let fence = CancellationToken::new();
        let worker = Worker::new(info.partition, shared.clone(), s.offset, halted, stop.clone(), fence.clone());
        let task = tokio::spawn(worker.run(rx));
        if let Some(relay) = &shared.relay {
            // Stops with the worker (revoke, shutdown); the partition's next owner fences
            // its producer if it is slow to stop.
            tokio::spawn(relay.clone().run(info.partition, stop.clone()));
        }
        let handle = WorkerHandle { inbox: tx, backlog: VecDeque::new(), throttled: false, stop, fence, task };
        if let Some(old) = workers.map.insert(info.partition, handle) {
            old.stop.cancel();
            old.fence.cancel();
            old.task.abort();
        }
        info!(partition = info.partition, offset = s.offset, source = ?s.source, halted, "partition starts");
        // The group offset only lags; bring it up to the sysdb right away so that lag tools
        // agree even when no new record arrives (never backwards: the thread checks).
        if !halted && info.group_offset.is_none_or(|g| g < s.offset) {
            shared.commander.send(crate::kafka::consumer::Command::Commit(vec![(info.partition, s.offset)]));
        }
        decisions.push(StartDecision { partition: info.partition, offset: s.offset, paused: halted });
    }
    Ok(decisions)
}

/// Retry a retryable sysdb call with backoff for up to ~30 s.
async fn retry_sysdb<T, F, Fut>(metrics: &Metrics, mut f: F) -> Result<T, crate::sysdb::SysdbError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, crate::sysdb::SysdbError>>,
{
    let mut delays = crate::retry::backoff(Duration::from_millis(100), Duration::from_secs(3));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                SysdbRetry { what: "sysdb unavailable; retrying", partition: None, error: &e }.emit(metrics);
                tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(3))).await;
            }
            other => return other,
        }
    }
}
