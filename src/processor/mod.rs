//! `sluice process`: the consumer-group replica's main loop.
//!
//! The router receives the consumer thread's events in order, answers assignments from
//! the sysdb ([`start::resolve_start`]), runs one [`partition::Worker`] task per assigned
//! partition, and stops workers on revoke before the consumer unassigns.

pub mod batch;
pub mod functions;
pub mod partition;
pub mod start;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Context};
use tokio::sync::{mpsc, oneshot, Notify};
use tokio::task::JoinHandle;
use tracing::{error, info, warn};

use crate::api::Health;
use crate::config::Config;
use crate::kafka::admin::MetadataClient;
use crate::kafka::consumer::{Command, ConsumerHandle, ConsumerSettings, Event, StartDecision};
use crate::kafka::producer::Producer;
use crate::kafka::{ClientSettings, KafkaError, Msg, PartitionInfo};
use crate::metrics::Metrics;
use crate::sysdb::Sysdb;
use partition::{Shared, Worker, WorkerMsg};
use start::{resolve_start, HaltReason, Start};

/// Inbox size of a worker, in message chunks.
const WORKER_INBOX: usize = 8;

/// How often the partition gauges read the high watermarks and group offsets.
const GAUGE_REFRESH: Duration = Duration::from_secs(5);

/// Kafka client settings from the config.
pub fn client_settings(config: &Config) -> ClientSettings {
    ClientSettings {
        brokers: config.kafka.brokers.clone(),
        librdkafka: config.librdkafka.clone(),
        request_timeout_ms: config.kafka.request_timeout_ms,
    }
}

struct WorkerHandle {
    inbox: mpsc::Sender<WorkerMsg>,
    task: JoinHandle<()>,
}

/// Run the processor until `shutdown` resolves (then leave the group and return Ok).
pub async fn run(
    config: Config,
    sysdb: Arc<Sysdb>,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let settings = client_settings(&config);
    let topic = config.kafka.log_topic();
    let topic_partitions = match sysdb.topic_partitions(&topic).await? {
        Some(n) => n,
        None => {
            let s = settings.clone();
            let t = topic.clone();
            tokio::task::spawn_blocking(move || crate::kafka::admin::partition_count(&s, &t))
                .await?
                .with_context(|| format!("topic {topic} not found: run `sluice init` first"))?
        }
    };
    let producer = Producer::new(&settings, &[])?;
    let metadata = Arc::new(std::sync::Mutex::new(MetadataClient::new(&settings, Some(&config.kafka.group))?));
    let (consumer, mut events) = ConsumerHandle::start(ConsumerSettings {
        client: settings.clone(),
        group: config.kafka.group.clone(),
        topic: topic.clone(),
        cooperative: config.kafka.rebalance_protocol == crate::config::RebalanceProtocol::Cooperative,
        session_timeout_ms: config.kafka.session_timeout_ms,
        instance_id: config.kafka.instance_id.clone(),
        max_poll_interval_ms: config.kafka.max_poll_interval_ms,
        // 16 halved throughput on small records (W3: 80k -> 17k records/s): a full channel
        // pauses the partitions, and every pause/resume costs a refetch.
        channel_capacity: 256,
    })?;
    metrics.attach_consumer(consumer.stats.clone());
    health.consumer_started();
    let shared = Arc::new(Shared {
        dlq_topic: config.kafka.dlq_topic(),
        backfill_topic: config.kafka.backfill_topic(),
        config: config.clone(),
        sysdb: sysdb.clone(),
        producer,
        commander: consumer.commander(),
        metrics: metrics.clone(),
        health: health.clone(),
        metadata,
        topic: topic.clone(),
        topic_partitions,
    });
    info!(topic = %topic, group = %config.kafka.group, sysdb = sysdb.backend(), "processor started");
    let refresh_now = Arc::new(Notify::new());
    let refresh = tokio::spawn(refresh_partition_gauges(shared.clone(), refresh_now.clone()));

    let mut workers: HashMap<i32, WorkerHandle> = HashMap::new();
    tokio::pin!(shutdown);
    let mut stopping = false;
    let mut fatal: Option<String> = None;
    let shutdown_timeout = Duration::from_millis(config.processor.shutdown_timeout_ms);
    let mut stop_deadline: Option<tokio::time::Instant> = None;
    loop {
        let ev = tokio::select! {
            ev = events.recv() => ev,
            _ = &mut shutdown, if !stopping => {
                info!("shutdown requested: committing in-flight batches and leaving the group");
                health.stopping("shutdown requested");
                stopping = true;
                stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                consumer.send(Command::Shutdown);
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
                        consumer.send(Command::Shutdown);
                        stopping = true;
                        stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                        drop(reply);
                    }
                }
            }
            Event::Assigned { partitions } => {
                for (d, generation) in partitions {
                    if let Some(w) = workers.get(&d.partition) {
                        let _ = w.inbox.send(WorkerMsg::Generation(generation)).await;
                    }
                }
                health.assignment_completed();
                refresh_now.notify_one();
            }
            Event::Revoke { partitions, done } => {
                stop_workers(&mut workers, &partitions).await;
                forget_partitions(&shared, &partitions);
                let _ = done.send(());
            }
            Event::Messages(msgs) => route_messages(&workers, msgs).await,
            Event::Seeked { partition, offset, generation } => {
                if let Some(w) = workers.get(&partition) {
                    let _ = w.inbox.send(WorkerMsg::Seeked { offset, generation }).await;
                }
            }
            Event::OffsetOutOfRange => {
                for w in workers.values() {
                    let _ = w.inbox.send(WorkerMsg::CheckGap).await;
                }
            }
            Event::Fatal(msg) => {
                error!(error = %msg, "fatal consumer error");
                health.stopping(format!("fatal consumer error: {msg}"));
                fatal = Some(msg);
                if !stopping {
                    consumer.send(Command::Shutdown);
                    stopping = true;
                    stop_deadline = Some(tokio::time::Instant::now() + shutdown_timeout);
                }
            }
        }
    }
    let all: Vec<i32> = workers.keys().copied().collect();
    stop_workers(&mut workers, &all).await;
    forget_partitions(&shared, &all);
    refresh.abort();
    tokio::task::spawn_blocking(move || consumer.shutdown(Duration::from_secs(5))).await?;
    info!("processor stopped");
    match fatal {
        Some(m) => Err(anyhow!("processor stopped on a fatal error: {m}")),
        None => Ok(()),
    }
}

async fn sleep_until_opt(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

async fn route_messages(workers: &HashMap<i32, WorkerHandle>, msgs: Vec<Msg>) {
    let mut by_partition: HashMap<i32, Vec<Msg>> = HashMap::new();
    for m in msgs {
        by_partition.entry(m.partition).or_default().push(m);
    }
    for (p, ms) in by_partition {
        if let Some(w) = workers.get(&p) {
            let _ = w.inbox.send(WorkerMsg::Messages(ms)).await;
        }
    }
}

async fn stop_workers(workers: &mut HashMap<i32, WorkerHandle>, partitions: &[i32]) {
    let mut waits = Vec::new();
    for p in partitions {
        if let Some(w) = workers.remove(p) {
            let (tx, rx) = oneshot::channel();
            let _ = w.inbox.send(WorkerMsg::Stop(tx)).await;
            waits.push((w.task, rx));
        }
    }
    for (task, rx) in waits {
        let _ = tokio::time::timeout(Duration::from_secs(9), rx).await;
        task.abort();
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
/// consumer lag (PITFALLS item 13).
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
        let md = shared.metadata.clone();
        let topic = shared.topic.clone();
        let read = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64, Option<i64>)>, KafkaError> {
            let md = md.lock().unwrap_or_else(|e| e.into_inner());
            let group = md.group_offsets(&topic, &partitions)?;
            partitions.iter().map(|&p| Ok((p, md.watermarks(&topic, p)?.1, group.get(&p).copied()))).collect()
        })
        .await;
        match read {
            Ok(Ok(rows)) => {
                for (p, high, group) in rows {
                    shared.metrics.partition_broker_offsets(p, high, group);
                }
                if failing {
                    info!("partition gauges: watermarks and group offsets readable again");
                    failing = false;
                }
            }
            // Logged once per outage, not every 5 s.
            Ok(Err(e)) if !failing => {
                warn!(error = %e, "partition gauges: cannot read watermarks or group offsets; keeping the last values");
                failing = true;
            }
            Ok(Err(_)) => {}
            Err(e) => warn!(error = %e, "partition gauges: refresh task failed"),
        }
    }
}

/// Answer an assignment: read the sysdb positions, decide each partition's start, create
/// missing rows, record skipped gaps, and start the workers.
async fn assign(
    shared: &Arc<Shared>,
    workers: &mut HashMap<i32, WorkerHandle>,
    partitions: Vec<PartitionInfo>,
) -> anyhow::Result<Vec<StartDecision>> {
    let cfg = &shared.config;
    let positions = retry_sysdb(&shared.metrics, || shared.sysdb.positions(&shared.topic)).await?;
    let mut decisions = Vec::new();
    for info in partitions {
        let mut s: Start =
            resolve_start(positions.get(&info.partition).copied(), info, cfg.kafka.auto_offset_reset, cfg.processor.on_data_loss);
        if s.group_ahead {
            shared.metrics.group_offset_ahead();
            warn!(partition = info.partition, sysdb = s.offset, group = ?info.group_offset, "group offset is AHEAD of the sysdb position; the sysdb wins (records after it will be re-read and applied once)");
        }
        if s.needs_row {
            let from = s.gap.map(|(from, _)| from).unwrap_or(s.offset);
            let stored = retry_sysdb(&shared.metrics, || shared.sysdb.init_position(&shared.topic, info.partition, from)).await?;
            if stored != from {
                // Another replica created the row meanwhile: decide again from it.
                s = resolve_start(Some(stored), info, cfg.kafka.auto_offset_reset, cfg.processor.on_data_loss);
            }
        }
        if let Some((from, to)) = s.gap {
            retry_sysdb(&shared.metrics, || shared.sysdb.record_gap(&shared.topic, info.partition, from, to)).await?;
            shared.metrics.gap();
            warn!(partition = info.partition, from, to, "records deleted before processing; gap recorded and skipped (on_data_loss = \"skip\")");
        }
        match s.halted {
            Some(HaltReason::DataLoss { from, to }) => {
                shared.metrics.gap();
                error!(partition = info.partition, from, to, "records [{from}, {to}) were deleted by retention before being processed: partition HALTED (on_data_loss = \"halt\"). To accept the loss: `sluice offsets reset --partition {} --to {to}` (or set on_data_loss = \"skip\")", info.partition);
            }
            Some(HaltReason::AheadOfLog { sysdb, high }) => {
                error!(partition = info.partition, sysdb, high, "the sysdb position is beyond the partition's high watermark (topic recreated or broker data lost): partition HALTED; fix with `sluice offsets reset`");
            }
            None => {}
        }
        let halted = s.halted.is_some();
        shared.metrics.partition_assigned(info.partition, s.offset, info.high, info.group_offset, halted);
        shared.set_halted(info.partition, halted);
        let (tx, rx) = mpsc::channel(WORKER_INBOX);
        let worker = Worker::new(info.partition, shared.clone(), s.offset, halted);
        let task = tokio::spawn(worker.run(rx));
        if let Some(old) = workers.insert(info.partition, WorkerHandle { inbox: tx, task }) {
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
    let mut backoff = Duration::from_millis(100);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Err(e) if e.is_retryable() && tokio::time::Instant::now() < deadline => {
                metrics.sysdb_retry();
                warn!(%e, "sysdb unavailable; retrying");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(3));
            }
            other => return other,
        }
    }
}
