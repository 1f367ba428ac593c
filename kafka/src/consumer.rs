//! The processor's group consumer, polled on a dedicated OS thread.
//!
//! Why a thread: rebalance callbacks run inside `poll`, on whatever thread polls. Here that thread is ours, so the callback may block on a channel
//! reply from the async processor (which reads the sysdb) without stalling the tokio
//! runtime, and the async side never waits on this thread, so nothing can deadlock.
//!
//! Assignment (design.md invariant 1): the `rebalance` override asks the processor for each
//! partition's starting offset (the sysdb `next_offset`; the group offset or the reset
//! policy only when the sysdb has no row), **writes those offsets into the partition list
//! and only then assigns** (`incremental_assign` for cooperative-sticky, `assign` for
//! eager) — never assign-then-seek, whose seek races the fetcher that assign already started. `auto.offset.reset=error`, so an
//! out-of-range position is reported, never silently reset to the earliest or latest offset.
//!
//! Ordering: events and messages share one bounded channel, so a `Revoke` is seen after
//! every message fetched before it. Each assignment and seek bumps the partition's
//! *generation*; messages carry it and the processor drops stale ones.
//!
//! Partition queues: every partition gets its own librdkafka queue before it is assigned
//! (`split_partition_queue`), so none of its messages ever reaches the shared consumer
//! queue, which then carries only callbacks and errors. The thread takes at most one
//! chunk from each partition's queue in turn, so busy partitions reach their workers
//! interleaved, not one after another as a fetch response lists them.
//!
//! Back-pressure is not reading: a partition whose worker is behind (`Throttle`), or
//! every partition while the channel is full, is simply not polled. librdkafka stops
//! fetching a partition once its queue holds `queued.max.messages.kbytes` or
//! `queued.min.messages` (both apply per partition with partition queues), and nothing it
//! prefetched is thrown away, as a pause would. Heartbeats and rebalances go on, because polling does:
//! `max.poll.interval.ms` is never exceeded by a slow worker.
//! Only halted partitions are paused.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc as std_mpsc, Arc, Mutex, OnceLock, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::consumer::base_consumer::PartitionQueue;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, RebalanceProtocol};
use rdkafka::error::{KafkaError as RdError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::cluster::MetadataClient;
use super::{ClientSettings, KafkaError, Msg, PartitionInfo};

/// Consumer settings (from `[kafka]`).
#[derive(Debug, Clone)]
pub struct ConsumerSettings {
    pub client: ClientSettings,
    pub group: String,
    pub topic: String,
    pub cooperative: bool,
    pub session_timeout_ms: u32,
    /// `group.instance.id` (static membership), if configured.
    pub instance_id: Option<String>,
    pub max_poll_interval_ms: u32,
    /// Capacity of the event channel, in events (a message chunk is one event).
    pub channel_capacity: usize,
}

/// The processor's answer for one partition being assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartDecision {
    pub partition: i32,
    /// Next offset to read.
    pub offset: i64,
    /// Assign but keep paused (partition halted, e.g. on a data-loss gap).
    pub paused: bool,
}

/// What the consumer thread tells the processor, in order.
#[derive(Debug)]
pub enum Event {
    /// Partitions are being assigned; reply with where each starts. The consumer thread
    /// waits for the reply, then assigns.
    Assign { partitions: Vec<PartitionInfo>, reply: oneshot::Sender<Vec<StartDecision>> },
    /// The assignment took effect with these generations.
    Assigned { partitions: Vec<(StartDecision, u64)> },
    /// Partitions are being revoked; stop their work and answer on `done` (the thread
    /// waits a bounded time, then unassigns anyway).
    Revoke { partitions: Vec<i32>, done: std_mpsc::SyncSender<()> },
    /// Messages, in fetch order.
    Messages(Vec<Msg>),
    /// A seek took effect; messages of older generations are stale.
    Seeked { partition: i32, offset: i64, generation: u64 },
    /// The fetch position of these partitions fell below their log start (retention
    /// deleted records before they were read). Only the partitions whose own position is
    /// out of range are named: the consumer error itself carries no partition.
    OffsetOutOfRange { partitions: Vec<i32> },
    /// Everything fetched for the partition was handed over, and the consumer's position
    /// is past the last message handed over: transaction markers or aborted records
    /// follow it. The processor may move the partition's position there.
    Position { partition: i32, offset: i64, generation: u64 },
    /// A seek could not be done after bounded retries: the partition cannot go on.
    SeekFailed { partition: i32, offset: i64, error: String },
    /// The consumer failed for good (authentication, fatal error).
    Fatal(String),
}

/// Commands to the consumer thread.
#[derive(Debug)]
pub enum Command {
    /// Commit these group offsets (next to read), asynchronously. Best effort.
    Commit(Vec<(i32, i64)>),
    /// Halted partitions: paused until resumed (back-pressure never resumes them).
    Pause(Vec<i32>),
    Resume(Vec<i32>),
    /// Back-pressure from one slow partition: stop reading its queue (or read it again)
    /// without touching the others. Not a pause: what librdkafka prefetched stays.
    Throttle {
        partition: i32,
        on: bool,
    },
    Seek {
        partition: i32,
        offset: i64,
    },
    /// Leave the group and stop the thread.
    Shutdown,
}

/// Sends commands to the consumer thread and wakes it; cheap to clone.
#[derive(Debug, Clone)]
pub struct Commander {
    commands: std_mpsc::Sender<Command>,
    wake: std_mpsc::SyncSender<()>,
}

impl Commander {
    /// A commander whose commands go to the returned receiver instead of a consumer
    /// thread: for a consumer played by something other than librdkafka (the processor's
    /// deterministic simulation reads the commands and answers with [`Event`]s).
    pub fn detached() -> (Commander, std_mpsc::Receiver<Command>) {
        let (commands, receiver) = std_mpsc::channel();
        // Nobody waits for wake-ups: the receiver is dropped and `send` ignores it.
        let (wake, _) = std_mpsc::sync_channel(1);
        (Commander { commands, wake }, receiver)
    }

    pub fn send(&self, cmd: Command) {
        // The thread only goes away on shutdown; a send error then is harmless. A full
        // wake channel means a wake-up is already pending.
        let _ = self.commands.send(cmd);
        let _ = self.wake.try_send(());
    }
}

/// Counters the thread maintains (read by the metrics module).
#[derive(Debug, Default)]
pub struct ConsumerStats {
    pub commits_ok: AtomicU64,
    pub commits_failed: AtomicU64,
    pub rebalances_assign: AtomicU64,
    pub rebalances_revoke: AtomicU64,
    pub backpressure_pauses: AtomicU64,
    pub seek_retries: AtomicU64,
}

/// Handle of the consumer thread.
pub struct ConsumerHandle {
    commands: Commander,
    thread: Option<JoinHandle<()>>,
    pub stats: Arc<ConsumerStats>,
}

impl ConsumerHandle {
    /// Create the consumer, subscribe, and start polling on a new thread.
    pub fn start(settings: ConsumerSettings) -> Result<(ConsumerHandle, mpsc::Receiver<Event>), KafkaError> {
        let (tx, rx) = mpsc::channel(settings.channel_capacity.max(4));
        let (cmd_tx, cmd_rx) = std_mpsc::channel();
        // Wake-ups of the thread: a command, or a partition queue that received messages.
        let (wake_tx, wake_rx) = std_mpsc::sync_channel(1);
        let stats = Arc::new(ConsumerStats::default());
        let metadata = MetadataClient::new(&settings.client, Some(&settings.group))?;
        let ctx = Ctx {
            topic: settings.topic.clone(),
            events: tx,
            state: Mutex::new(State::default()),
            metadata,
            stats: stats.clone(),
            consumer: OnceLock::new(),
        };
        let mut c = settings.client.client_config();
        c.set("group.id", &settings.group)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "error")
            .set("enable.partition.eof", "false")
            // Never apply aborted transactions; positions past transaction markers (see
            // `report_positions`) rely on it. `[librdkafka]` may not override it.
            .set("isolation.level", "read_committed")
            .set("session.timeout.ms", settings.session_timeout_ms.to_string())
            .set("max.poll.interval.ms", settings.max_poll_interval_ms.to_string())
            .set("partition.assignment.strategy", if settings.cooperative { "cooperative-sticky" } else { "range" })
            .set_log_level(RDKafkaLogLevel::Warning);
        if !settings.client.librdkafka.contains_key("queued.max.messages.kbytes") {
            // Prefetch bound, per partition with partition queues (librdkafka default
            // 65536 KiB): records wait here while their worker is behind.
            c.set("queued.max.messages.kbytes", PREFETCH_KBYTES.to_string());
        }
        if !settings.client.librdkafka.contains_key("queued.min.messages") {
            // librdkafka fetches a partition until its queue holds this many messages
            // (default 100,000) or the kilobytes above. Small records hit the count
            // late: 2 MiB of 100-byte records is 20,000 messages per partition, each with
            // librdkafka's own per-message overhead on top of its bytes.
            c.set("queued.min.messages", PREFETCH_MESSAGES.to_string());
        }
        if !settings.client.librdkafka.contains_key("fetch.queue.backoff.ms") {
            // Once a partition's queue holds its bound, librdkafka fetches it again only
            // after this delay (default 1000 ms): a worker that falls behind for a moment
            // then waited a whole second for records the broker had.
            c.set("fetch.queue.backoff.ms", FETCH_QUEUE_BACKOFF_MS.to_string());
        }
        if !settings.client.librdkafka.contains_key("fetch.wait.max.ms") {
            // librdkafka keeps one fetch request in flight per broker, and it leaves a
            // partition whose queue holds its bound out of the request. When every
            // partition left in it is caught up, the broker holds the request for this
            // long (default 500 ms) while the left-out partition's worker empties its
            // queue and waits: a backlog on one partition drained in half-second steps.
            c.set("fetch.wait.max.ms", FETCH_WAIT_MAX_MS.to_string());
        }
        if let Some(id) = &settings.instance_id {
            c.set("group.instance.id", id);
        }
        let consumer: BaseConsumer<Ctx> = c.create_with_context(ctx).map_err(|e| KafkaError::Config(e.to_string()))?;
        consumer
            .subscribe(&[&settings.topic])
            .map_err(|e| super::broker_err(format!("subscribe to {}", settings.topic), e))?;
        let thread = std::thread::Builder::new()
            .name("sluice-consumer".into())
            .spawn({
                let wake_tx = wake_tx.clone();
                move || poll_loop(consumer, cmd_rx, wake_tx, wake_rx)
            })
            .map_err(|e| KafkaError::Config(format!("cannot spawn consumer thread: {e}")))?;
        let commands = Commander { commands: cmd_tx, wake: wake_tx };
        Ok((ConsumerHandle { commands, thread: Some(thread), stats }, rx))
    }

    pub fn send(&self, cmd: Command) {
        self.commands.send(cmd);
    }

    /// A cloneable sender of commands, for the partition workers.
    pub fn commander(&self) -> Commander {
        self.commands.clone()
    }

    /// Leave the group and join the thread, waiting at most `timeout` (the thread is
    /// detached after that).
    pub fn shutdown(mut self, timeout: Duration) {
        self.commands.send(Command::Shutdown);
        if let Some(t) = self.thread.take() {
            if !super::join_within(t, timeout) {
                warn!("consumer thread did not stop within {timeout:?}; leaving it behind");
            }
        }
    }
}

#[derive(Default)]
struct State {
    generations: HashMap<i32, u64>,
    next_generation: u64,
    /// Events that did not fit in the channel, in order.
    overflow: VecDeque<Event>,
    assigned: HashSet<i32>,
    /// Paused on the processor's request (halted); back-pressure never resumes these.
    held: HashSet<i32>,
    /// Paused because their worker is behind (per-partition back-pressure).
    throttled: HashSet<i32>,
    /// Next offset after the last message handed over (or the start offset), per partition.
    handed: HashMap<i32, i64>,
    /// Last position reported with [`Event::Position`], per partition.
    reported: HashMap<i32, i64>,
}

impl State {
    fn bump(&mut self, partition: i32) -> u64 {
        self.next_generation += 1;
        self.generations.insert(partition, self.next_generation);
        self.reported.remove(&partition);
        self.next_generation
    }

    /// Partitions whose queue may be read now: not halted, not throttled.
    fn runnable(&self, partitions: impl IntoIterator<Item = i32>) -> Vec<i32> {
        partitions.into_iter().filter(|p| !self.held.contains(p) && !self.throttled.contains(p)).collect()
    }
}

struct Ctx {
    topic: String,
    events: mpsc::Sender<Event>,
    state: Mutex<State>,
    metadata: MetadataClient,
    stats: Arc<ConsumerStats>,
    /// The consumer itself, for splitting partition queues inside the rebalance callback
    /// (set once the poll thread owns it; weak, as the consumer owns this context).
    consumer: OnceLock<Weak<BaseConsumer<Ctx>>>,
}

impl Ctx {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        // A panic while holding the lock would already have ended the thread.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Send in order: first any overflow, then `ev`, blocking (used by callbacks, which
    /// need the processor to see the event before they continue).
    fn send_blocking(&self, ev: Event) -> bool {
        let overflow: Vec<Event> = self.state().overflow.drain(..).collect();
        for e in overflow {
            if self.events.blocking_send(e).is_err() {
                return false;
            }
        }
        self.events.blocking_send(ev).is_ok()
    }

    fn tpl(&self, partitions: impl IntoIterator<Item = i32>) -> TopicPartitionList {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(&self.topic, p);
        }
        tpl
    }

    fn on_assign(&self, consumer: &BaseConsumer<Ctx>, tpl: &mut TopicPartitionList) {
        self.stats.rebalances_assign.fetch_add(1, Ordering::Relaxed);
        let partitions: Vec<i32> =
            tpl.elements().iter().filter(|e| e.topic() == self.topic).map(|e| e.partition()).collect();
        // Watermarks and group offsets can be briefly unavailable right after a leader
        // election ("Leader high watermark is not caught up"): retry for a bounded time.
        let mut attempt = 0;
        let infos = loop {
            match self.partition_infos(&partitions) {
                Err(e) if attempt < ASSIGN_INFO_RETRIES => {
                    attempt += 1;
                    warn!(%e, attempt, "partition info not available yet during assignment; retrying");
                    std::thread::sleep(Duration::from_millis(500));
                }
                other => break other,
            }
        };
        let infos = match infos {
            Ok(i) => i,
            Err(e) => {
                // Without watermarks we cannot check for gaps; fail loudly rather than
                // guess. The group will reassign after the session times out.
                error!(%e, "cannot read partition info during assignment");
                self.send_blocking(Event::Fatal(format!("assignment failed: {e}")));
                return;
            }
        };
        let (reply_tx, reply_rx) = oneshot::channel();
        if !self.send_blocking(Event::Assign { partitions: infos, reply: reply_tx }) {
            return;
        }
        let Ok(decisions) = reply_rx.blocking_recv() else {
            warn!("processor went away during assignment");
            return;
        };
        for d in &decisions {
            if let Err(e) = tpl.set_partition_offset(&self.topic, d.partition, Offset::Offset(d.offset)) {
                error!(%e, partition = d.partition, "cannot set the starting offset");
            }
        }
        // Each partition's own queue before the assignment starts its fetch: librdkafka then
        // never forwards its messages to the shared queue (the flag stays set across
        // revokes), so no message of it can be read out of order from two queues.
        match self.consumer.get().and_then(Weak::upgrade) {
            Some(c) => {
                for d in &decisions {
                    if c.split_partition_queue(&self.topic, d.partition).is_none() {
                        error!(partition = d.partition, "cannot give the partition its own queue");
                    }
                }
            }
            None => error!("the consumer is not set up for partition queues; its messages use the shared queue"),
        }
        let assigned = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_assign(tpl),
            _ => consumer.assign(tpl),
        };
        if let Err(e) = assigned {
            error!(%e, "assign failed");
            self.send_blocking(Event::Fatal(format!("assign failed: {e}")));
            return;
        }
        // Halted partitions stay paused.
        let held: Vec<i32> = decisions.iter().filter(|d| d.paused).map(|d| d.partition).collect();
        if !held.is_empty() {
            if let Err(e) = consumer.pause(&self.tpl(held.iter().copied())) {
                error!(%e, "cannot pause partitions at assignment");
            }
        }
        let with_gen = {
            let mut st = self.state();
            st.held.extend(held.iter().copied());
            decisions
                .iter()
                .map(|d| {
                    st.assigned.insert(d.partition);
                    st.throttled.remove(&d.partition);
                    st.handed.insert(d.partition, d.offset);
                    (*d, st.bump(d.partition))
                })
                .collect::<Vec<_>>()
        };
        info!(partitions = ?partitions, "assigned");
        self.send_blocking(Event::Assigned { partitions: with_gen });
    }

    fn partition_infos(&self, partitions: &[i32]) -> Result<Vec<PartitionInfo>, KafkaError> {
        let group = self.metadata.group_offsets(&self.topic, partitions)?;
        partitions
            .iter()
            .map(|&p| {
                let (low, high) = self.metadata.watermarks(&self.topic, p)?;
                Ok(PartitionInfo { partition: p, group_offset: group.get(&p).copied(), low, high })
            })
            .collect()
    }

    fn on_revoke(&self, consumer: &BaseConsumer<Ctx>, tpl: &TopicPartitionList) {
        self.stats.rebalances_revoke.fetch_add(1, Ordering::Relaxed);
        let partitions: Vec<i32> =
            tpl.elements().iter().filter(|e| e.topic() == self.topic).map(|e| e.partition()).collect();
        {
            let mut st = self.state();
            for p in &partitions {
                st.bump(*p); // anything fetched before is stale from now on
                st.assigned.remove(p);
                st.held.remove(p);
                st.throttled.remove(p);
                st.handed.remove(p);
            }
        }
        let (done_tx, done_rx) = std_mpsc::sync_channel(1);
        if self.send_blocking(Event::Revoke { partitions: partitions.clone(), done: done_tx }) {
            // Let in-flight batches finish their sysdb commit (bounded).
            if done_rx.recv_timeout(Duration::from_secs(10)).is_err() {
                warn!(partitions = ?partitions, "processor did not confirm the revoke in 10s; unassigning anyway");
            }
        }
        let r = match consumer.rebalance_protocol() {
            RebalanceProtocol::Cooperative => consumer.incremental_unassign(tpl),
            _ => consumer.unassign(),
        };
        if let Err(e) = r {
            warn!(%e, "unassign failed");
        }
        info!(partitions = ?partitions, "revoked");
    }
}

impl ClientContext for Ctx {
    fn error(&self, error: RdError, reason: &str) {
        if let RdError::Global(code) = &error {
            if matches!(
                code,
                RDKafkaErrorCode::Authentication | RDKafkaErrorCode::SaslAuthenticationFailed | RDKafkaErrorCode::Fatal
            ) {
                let _ = self.events.try_send(Event::Fatal(format!("{error}: {reason}")));
            }
        }
        warn!(%error, reason, "kafka client error");
    }
}

impl ConsumerContext for Ctx {
    fn rebalance(&self, consumer: &BaseConsumer<Self>, err: RDKafkaRespErr, tpl: &mut TopicPartitionList) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => self.on_assign(consumer, tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => self.on_revoke(consumer, tpl),
            other => {
                error!(error = ?other, "rebalance error; dropping the assignment");
                let _ = consumer.unassign();
            }
        }
    }

    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        // Counted where the synchronous commit returns (`commit_pending`); this is only
        // a trace of what librdkafka reports.
        if let Err(e) = result {
            debug!(%e, offsets = ?offsets.to_topic_map(), "commit callback reported a failure");
        }
    }
}

/// Group commits are coalesced to at most one per interval (they only lag anyway).
const COMMIT_INTERVAL: Duration = Duration::from_millis(100);

/// What the poll thread hands to the group-commit thread.
enum CommitMsg {
    /// Offsets the sysdb already holds (next offset per partition).
    Offsets(Vec<(i32, i64)>),
    /// Commit what is pending now, then stop (shutdown).
    Finish,
}

/// The group-commit thread: commits run off the poll thread, so a slow coordinator (a
/// synchronous commit took up to 180 ms under load) never stops the fetching of every
/// partition. Requests arriving while a commit is in flight are merged (highest offset
/// per partition) into the next one, at most one per [`COMMIT_INTERVAL`].
///
/// A commit may race a revoke on the poll thread; what it carries is still a position the
/// sysdb holds (design.md invariant 3), and the group generation fences it: once the
/// partition belongs to a new generation, a commit of the old one is refused.
fn commit_loop(consumer: Arc<BaseConsumer<Ctx>>, requests: std_mpsc::Receiver<CommitMsg>) {
    let mut last_commit: HashMap<i32, i64> = HashMap::new();
    let mut pending: HashMap<i32, i64> = HashMap::new();
    let mut last_commit_at = Instant::now() - COMMIT_INTERVAL;
    // After a failed commit: the delay before the next attempt grows (100 ms to 5 s).
    let mut interval = COMMIT_INTERVAL;
    let mut failures = sluice_base::retry::default_backoff();
    let merge = |pending: &mut HashMap<i32, i64>, offsets: Vec<(i32, i64)>| {
        for (p, o) in offsets {
            let e = pending.entry(p).or_insert(o);
            *e = (*e).max(o);
        }
    };
    loop {
        let wait = interval.saturating_sub(last_commit_at.elapsed());
        // A closed channel (the poll thread is gone) is a finish too.
        let (first, mut finish) = if pending.is_empty() {
            match requests.recv() {
                Ok(m) => (Some(m), false),
                Err(_) => (None, true),
            }
        } else {
            match requests.recv_timeout(wait) {
                Ok(m) => (Some(m), false),
                Err(std_mpsc::RecvTimeoutError::Timeout) => (None, false),
                Err(std_mpsc::RecvTimeoutError::Disconnected) => (None, true),
            }
        };
        for msg in first.into_iter().chain(std::iter::from_fn(|| requests.try_recv().ok())) {
            match msg {
                CommitMsg::Offsets(offsets) => merge(&mut pending, offsets),
                CommitMsg::Finish => finish = true,
            }
        }
        if !pending.is_empty() && (finish || last_commit_at.elapsed() >= interval) {
            if commit_pending(&consumer, &mut pending, &mut last_commit) {
                interval = COMMIT_INTERVAL;
                failures = sluice_base::retry::default_backoff();
            } else {
                interval = failures.next().unwrap_or(Duration::from_secs(5)).max(COMMIT_INTERVAL);
            }
            last_commit_at = Instant::now();
        }
        if finish {
            return;
        }
    }
}

/// Commit the pending group offsets synchronously: only for partitions we own, only
/// forward (design.md invariant 3). Synchronous because rust-rdkafka 0.39 never delivers the
/// results of manual async commits to `commit_callback` (rust-rdkafka #856), and the
/// result is what the `sluice_offset_commits_total{result}` counter reports. Coalescing
/// keeps this to one short round trip per interval.
///
/// A failed commit puts its offsets back into `pending` (unless newer ones arrived) and
/// returns false: the caller retries after a backoff, so the last commit of an idle
/// partition is not lost to one refusal.
fn commit_pending(
    consumer: &BaseConsumer<Ctx>,
    pending: &mut HashMap<i32, i64>,
    last_commit: &mut HashMap<i32, i64>,
) -> bool {
    let ctx = consumer.context();
    let assigned = ctx.state().assigned.clone();
    let mut tpl = TopicPartitionList::new();
    let mut sent = Vec::new();
    for (p, o) in pending.drain() {
        if assigned.contains(&p) && sluice_base::positions::group_commit_advances(last_commit.get(&p).copied(), o) {
            let _ = tpl.add_partition_offset(&ctx.topic, p, Offset::Offset(o));
            sent.push((p, o));
        }
    }
    if sent.is_empty() {
        return true;
    }
    sluice_base::failpoint::hit("before_group_commit");
    let result = if sluice_base::failpoint::fail("group_commit") {
        Err(RdError::ConsumerCommit(RDKafkaErrorCode::RebalanceInProgress))
    } else {
        consumer.commit(&tpl, CommitMode::Sync)
    };
    match result {
        Ok(()) => {
            sluice_base::failpoint::hit("after_group_commit");
            ctx.stats.commits_ok.fetch_add(1, Ordering::Relaxed);
            last_commit.extend(sent);
            true
        }
        Err(e) => {
            // Expected around revokes (ILLEGAL_GENERATION, "Erroneous state"): group
            // offsets only lag; the same offsets (or newer ones) are committed later.
            ctx.stats.commits_failed.fetch_add(1, Ordering::Relaxed);
            debug!(%e, "group offset commit failed (best effort); retrying later");
            for (p, o) in sent {
                let e = pending.entry(p).or_insert(o);
                *e = (*e).max(o);
            }
            false
        }
    }
}

/// Retries (500 ms apart) of the watermark and group-offset reads of an assignment.
const ASSIGN_INFO_RETRIES: u32 = 60;

/// How many messages one `Messages` event carries at most...
const CHUNK: usize = 512;

/// ...and how many bytes of keys and payloads (a message larger than this is a chunk of
/// its own). Every buffer between the consumer and the workers holds a bounded number of
/// chunks, so this turns their bounds into bytes whatever the record size.
const CHUNK_BYTES: usize = 1 << 20;

/// Whether a chunk of `messages` messages and `bytes` bytes (keys and payloads) is full.
fn chunk_is_full(messages: usize, bytes: usize) -> bool {
    messages >= CHUNK || bytes >= CHUNK_BYTES
}

/// How often the consumer's positions are compared with what was handed over.
const POSITION_INTERVAL: Duration = Duration::from_millis(200);

/// Attempts of a seek before the partition is given up ([`Event::SeekFailed`]); retries
/// back off from 100 ms to 5 s (about 25 s in all).
const SEEK_ATTEMPTS: u32 = 10;

/// A seek that failed and waits for its next attempt.
struct PendingSeek {
    offset: i64,
    attempts: u32,
    next_at: Instant,
}

fn try_seek(
    consumer: &BaseConsumer<Ctx>,
    seeks: &mut HashMap<i32, PendingSeek>,
    partition: i32,
    offset: i64,
    attempts: u32,
) {
    let ctx = consumer.context();
    match consumer.seek(&ctx.topic, partition, Offset::Offset(offset), Duration::from_secs(5)) {
        Ok(()) => {
            seeks.remove(&partition);
            let generation = {
                let mut st = ctx.state();
                st.handed.insert(partition, offset);
                st.bump(partition)
            };
            ctx.send_blocking(Event::Seeked { partition, offset, generation });
        }
        Err(e) => {
            ctx.stats.seek_retries.fetch_add(1, Ordering::Relaxed);
            let attempts = attempts + 1;
            if attempts >= SEEK_ATTEMPTS {
                seeks.remove(&partition);
                error!(%e, partition, offset, attempts, "seek failed; giving the partition up");
                push(ctx, Event::SeekFailed { partition, offset, error: e.to_string() });
            } else {
                // The replica's retry policy, as delays by attempt number.
                let wait =
                    sluice_base::retry::default_backoff().nth(attempts as usize - 1).unwrap_or(Duration::from_secs(5));
                warn!(%e, partition, offset, attempts, retry_in = ?wait, "seek failed; retrying");
                seeks.insert(partition, PendingSeek { offset, attempts, next_at: Instant::now() + wait });
            }
        }
    }
}

/// Report partitions whose consumer position is past the last message handed over (the
/// records in between are transaction markers or aborted records, which a
/// `read_committed` consumer never delivers). Called right after a chunk was queued, so
/// every message before the position has been handed over.
fn report_positions(consumer: &BaseConsumer<Ctx>) {
    let ctx = consumer.context();
    let Ok(positions) = consumer.position() else { return };
    let mut events = Vec::new();
    {
        let mut st = ctx.state();
        for e in positions.elements() {
            let (p, Offset::Offset(o)) = (e.partition(), e.offset()) else { continue };
            if e.topic() != ctx.topic || !st.assigned.contains(&p) || st.held.contains(&p) {
                continue;
            }
            let handed = st.handed.get(&p).copied().unwrap_or(i64::MAX);
            if o > handed && st.reported.get(&p) != Some(&o) {
                st.reported.insert(p, o);
                if let Some(&generation) = st.generations.get(&p) {
                    events.push(Event::Position { partition: p, offset: o, generation });
                }
            }
        }
    }
    for ev in events {
        push(ctx, ev);
    }
}

/// The partitions whose position is below their log start, after an out-of-range error
/// (which names no partition). A partition whose watermarks cannot be read is named too:
/// its worker checks again, with retries.
fn out_of_range_partitions(consumer: &BaseConsumer<Ctx>) -> Vec<i32> {
    let ctx = consumer.context();
    let positions: HashMap<i32, i64> = consumer
        .position()
        .map(|tpl| {
            tpl.elements()
                .iter()
                .filter_map(|e| match e.offset() {
                    Offset::Offset(o) if e.topic() == ctx.topic => Some((e.partition(), o)),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let candidates: Vec<(i32, i64)> = {
        let st = ctx.state();
        st.assigned
            .iter()
            .filter(|p| !st.held.contains(p))
            .filter_map(|p| positions.get(p).or_else(|| st.handed.get(p)).map(|o| (*p, *o)))
            .collect()
    };
    candidates
        .into_iter()
        .filter(|&(p, position)| match ctx.metadata.watermarks(&ctx.topic, p) {
            Ok((low, _)) => position < low,
            Err(_) => true,
        })
        .map(|(p, _)| p)
        .collect()
}

/// The shared queue is polled this often at least, for callbacks (rebalances) and errors,
/// when no partition queue wakes the thread.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// While the channel to the processor is full, how often the thread looks for room.
const FULL_WAIT: Duration = Duration::from_millis(2);

/// librdkafka's prefetch bound per partition (`queued.max.messages.kbytes`), unless set
/// under `[librdkafka]`. On W1 drains (8 partitions, 4 interleaved pairs), 2 MiB against
/// 4 MiB lowered the peak RSS from 331 to 271 MB (medians) at the same CPU (0.986) and
/// rate; W4, W3, PostgreSQL and a paced run moved by at most 1.5% of CPU. (1 MiB ran dry
/// between fetches and cost time.)
pub const PREFETCH_KBYTES: u64 = 2048;

/// librdkafka's `queued.min.messages` (the prefetch bound per partition in messages),
/// unless set under `[librdkafka]`. It binds only for small records: W1's (1.5 KB) reach
/// [`PREFETCH_KBYTES`] at about 1,400 messages. On W3 drains (500k records of 102 bytes,
/// 8 partitions, 4 interleaved pairs), 10,000 against librdkafka's 100,000 lowered the
/// peak RSS from 330 to 264 MB (medians) at the same CPU (median ratio 0.98) and rate.
const PREFETCH_MESSAGES: usize = 10_000;

/// librdkafka's `fetch.queue.backoff.ms`, unless set under `[librdkafka]`.
const FETCH_QUEUE_BACKOFF_MS: u64 = 10;

/// librdkafka's `fetch.wait.max.ms`, unless set under `[librdkafka]`. Measured on a
/// backlog of 240k records where one partition held a quarter of them (and the slowest
/// records): caught up in 2.7-3.8 s at librdkafka's 500 ms, 1.5-1.75 s at 5 to 100 ms.
/// An idle replica costs the broker a fetch per this interval: 20 ms added ~1.5% of a
/// core on the local broker, 10 ms ~2%.
const FETCH_WAIT_MAX_MS: u64 = 20;

fn poll_loop(
    consumer: BaseConsumer<Ctx>,
    commands: std_mpsc::Receiver<Command>,
    wake_tx: std_mpsc::SyncSender<()>,
    wake: std_mpsc::Receiver<()>,
) {
    let consumer = Arc::new(consumer);
    let _ = consumer.context().consumer.set(Arc::downgrade(&consumer));
    let (commit_tx, commit_rx) = std_mpsc::channel();
    let committer = {
        let consumer = Arc::clone(&consumer);
        std::thread::Builder::new().name("sluice-group-commit".into()).spawn(move || commit_loop(consumer, commit_rx))
    };
    let committer = match committer {
        Ok(t) => t,
        Err(e) => {
            push(consumer.context(), Event::Fatal(format!("cannot spawn the group-commit thread: {e}")));
            return;
        }
    };
    let ctx = consumer.context();
    let mut last_position_check = Instant::now();
    let mut seeks: HashMap<i32, PendingSeek> = HashMap::new();
    let mut queues: BTreeMap<i32, PartitionQueue<Ctx>> = BTreeMap::new();
    let mut blocked = false;
    let mut shutting_down = false;
    loop {
        // 1. Commands.
        while let Ok(cmd) = commands.try_recv() {
            match cmd {
                Command::Commit(offsets) => {
                    // Coalesced there: at most one commit per COMMIT_INTERVAL.
                    let _ = commit_tx.send(CommitMsg::Offsets(offsets));
                }
                Command::Pause(ps) => {
                    ctx.state().held.extend(ps.iter().copied());
                    let _ = consumer.pause(&ctx.tpl(ps));
                }
                Command::Resume(ps) => {
                    let mut st = ctx.state();
                    for p in &ps {
                        st.held.remove(p);
                    }
                    let _ = consumer.resume(&ctx.tpl(ps));
                }
                Command::Throttle { partition, on } => {
                    let mut st = ctx.state();
                    if on {
                        st.throttled.insert(partition);
                    } else {
                        st.throttled.remove(&partition);
                    }
                }
                Command::Seek { partition, offset } => try_seek(&consumer, &mut seeks, partition, offset, 0),
                Command::Shutdown => shutting_down = true,
            }
        }
        if shutting_down {
            // The last group commit before leaving the group.
            let _ = commit_tx.send(CommitMsg::Finish);
            if committer.join().is_err() {
                warn!("the group-commit thread panicked");
            }
            break;
        }
        let due: Vec<(i32, i64, u32)> = seeks
            .iter()
            .filter(|(_, s)| s.next_at <= Instant::now())
            .map(|(p, s)| (*p, s.offset, s.attempts))
            .collect();
        for (p, offset, attempts) in due {
            try_seek(&consumer, &mut seeks, p, offset, attempts);
        }

        // 2. The shared queue: callbacks (a rebalance runs here), errors, and the messages
        //    of a partition that could not get its own queue.
        let mut more = take_chunk(&consumer, || consumer.poll(Duration::ZERO));
        sync_queues(&consumer, &mut queues, &wake_tx);

        // 3. One chunk from each partition that may be read, while the channel has room.
        let room = flush_overflow(ctx);
        if !room && !blocked {
            ctx.stats.backpressure_pauses.fetch_add(1, Ordering::Relaxed);
        }
        blocked = !room;
        if room {
            let runnable = ctx.state().runnable(queues.keys().copied());
            for p in runnable {
                if let Some(q) = queues.get(&p) {
                    more |= take_chunk(&consumer, || q.poll(Duration::ZERO));
                }
            }
        }
        if last_position_check.elapsed() >= POSITION_INTERVAL {
            last_position_check = Instant::now();
            report_positions(&consumer);
        }

        // 4. Nothing more waiting: sleep until a partition queue receives messages, a
        //    command arrives, or the shared queue is due.
        if !more {
            let next_seek = seeks.values().map(|s| s.next_at.saturating_duration_since(Instant::now())).min();
            let wait = if room { IDLE_WAIT } else { FULL_WAIT };
            let _ = wake.recv_timeout(next_seek.map_or(wait, |s| s.min(wait)));
        }
    }
    // Leave the group: dropping closes the consumer queue and polls until closed, which
    // runs the revoke path through our callback. It is unbounded, which
    // is why it happens here, on our own thread: `ConsumerHandle::shutdown` waits for it
    // with a timeout and leaves the thread behind if it hangs. The partition queues and
    // the group-commit thread hold the other references; both are gone now.
    drop(queues);
    drop(consumer);
    info!("consumer stopped");
}

/// Take up to one chunk of messages from `next` (a queue polled without waiting) and queue
/// it for the processor. Returns whether the chunk filled up, i.e. more may be waiting.
///
/// The chunk's messages stay borrowed from librdkafka until all are taken; then their keys
/// and payloads are copied into one buffer (one allocation per chunk, not two per
/// message) that every [`Msg`] of the chunk slices, and the shared state is locked once.
fn take_chunk<'q>(
    consumer: &BaseConsumer<Ctx>,
    mut next: impl FnMut() -> Option<KafkaResult<BorrowedMessage<'q>>>,
) -> bool {
    let ctx = consumer.context();
    let mut taken: Vec<BorrowedMessage<'q>> = Vec::new();
    let mut chunk_bytes = 0;
    while !chunk_is_full(taken.len(), chunk_bytes) {
        match next() {
            None => break,
            Some(Ok(m)) => {
                chunk_bytes += m.payload_len() + m.key().map_or(0, <[u8]>::len);
                taken.push(m);
            }
            Some(Err(RdError::MessageConsumption(RDKafkaErrorCode::AutoOffsetReset)))
            | Some(Err(RdError::MessageConsumption(RDKafkaErrorCode::OffsetOutOfRange))) => {
                let partitions = out_of_range_partitions(consumer);
                warn!(?partitions, "fetch offset out of range: records were deleted before they were processed");
                if !partitions.is_empty() {
                    push(ctx, Event::OffsetOutOfRange { partitions });
                }
            }
            Some(Err(e)) => {
                if matches!(e, RdError::MessageConsumptionFatal(_)) {
                    push(ctx, Event::Fatal(e.to_string()));
                }
                warn!(%e, "consumer error");
            }
        }
    }
    let full = chunk_is_full(taken.len(), chunk_bytes);
    if taken.is_empty() {
        return full;
    }
    let mut buf = Vec::with_capacity(chunk_bytes);
    for m in &taken {
        buf.extend_from_slice(m.key().unwrap_or_default());
        buf.extend_from_slice(m.payload().unwrap_or_default());
    }
    let buf = Bytes::from(buf);
    let mut at = 0;
    let mut slice = |part: Option<&[u8]>| {
        part.map(|p| {
            at += p.len();
            buf.slice(at - p.len()..at)
        })
    };
    let mut chunk: Vec<Msg> = Vec::with_capacity(taken.len());
    {
        let mut st = ctx.state();
        for m in &taken {
            st.handed.insert(m.partition(), m.offset() + 1);
            let (key, payload) = (slice(m.key()), slice(m.payload()));
            if let Some(generation) = st.generations.get(&m.partition()).copied() {
                chunk.push(Msg {
                    partition: m.partition(),
                    offset: m.offset(),
                    generation,
                    key,
                    payload,
                    timestamp_ms: m.timestamp().to_millis(),
                });
            }
        }
    }
    // The borrowed messages go back to librdkafka before the chunk is queued.
    drop(taken);
    if !chunk.is_empty() {
        push(ctx, Event::Messages(chunk));
    }
    full
}

/// Keep one queue handle per assigned partition: a new one for each partition assigned
/// since the last call (its queue was split off before the assignment, see `on_assign`),
/// none for revoked ones. Each queue wakes the thread when messages arrive in it.
fn sync_queues(
    consumer: &Arc<BaseConsumer<Ctx>>,
    queues: &mut BTreeMap<i32, PartitionQueue<Ctx>>,
    wake: &std_mpsc::SyncSender<()>,
) {
    let ctx = consumer.context();
    let assigned: Vec<i32> = {
        let st = ctx.state();
        if st.assigned.len() == queues.len() && queues.keys().all(|p| st.assigned.contains(p)) {
            return;
        }
        queues.retain(|p, _| st.assigned.contains(p));
        st.assigned.iter().copied().filter(|p| !queues.contains_key(p)).collect()
    };
    for p in assigned {
        match consumer.split_partition_queue(&ctx.topic, p) {
            Some(mut q) => {
                let wake = wake.clone();
                q.set_nonempty_callback(move || {
                    let _ = wake.try_send(());
                });
                queues.insert(p, q);
            }
            None => error!(partition = p, "cannot give the partition its own queue; it is read from the shared one"),
        }
    }
}

/// Queue an event without blocking: into the channel if it has room and nothing is
/// waiting ahead of it, else into the overflow.
fn push(ctx: &Ctx, ev: Event) {
    let mut st = ctx.state();
    if st.overflow.is_empty() {
        if let Err(mpsc::error::TrySendError::Full(ev)) = ctx.events.try_send(ev) {
            st.overflow.push_back(ev);
        }
    } else {
        st.overflow.push_back(ev);
    }
}

/// Move the overflow into the channel as far as it has room. Returns whether the channel
/// can take more (nothing overflows and it has room left).
fn flush_overflow(ctx: &Ctx) -> bool {
    let mut st = ctx.state();
    while let Some(ev) = st.overflow.pop_front() {
        match ctx.events.try_send(ev) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(ev)) => {
                st.overflow.push_front(ev);
                break;
            }
            Err(mpsc::error::TrySendError::Closed(_)) => {
                st.overflow.clear();
                break;
            }
        }
    }
    st.overflow.is_empty() && ctx.events.capacity() > 0
}

#[cfg(test)]
mod tests {
    use super::{chunk_is_full, CHUNK, CHUNK_BYTES};

    #[test]
    fn a_chunk_closes_at_512_messages_or_1_mib_and_a_larger_message_is_a_chunk_of_its_own() {
        assert!(!chunk_is_full(0, 0));
        assert!(!chunk_is_full(CHUNK - 1, CHUNK_BYTES - 1), "below both bounds: room for more");
        assert!(chunk_is_full(CHUNK, 0), "512 small messages");
        assert!(chunk_is_full(CHUNK - 1, CHUNK_BYTES), "1 MiB in fewer messages");
        assert!(chunk_is_full(1, CHUNK_BYTES + 5), "one message over 1 MiB: alone");
    }
}
