//! One partition's worker: batches messages, folds them, commits each batch with its
//! position in one sysdb transaction (CAS), then asks for the lagging group commit.
//! What this delivers (exactly once into the sysdb, the DLQ at least once) is
//! `docs/design.md` section 9; how a commit keeps it is in `partition/commit.rs`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
// The runtime's clock, not the OS's: the same instants in a replica, and simulated time
// (paused, advanced by the runtime) in the processor's deterministic simulation.
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug_span, error, info_span, warn, Span};

use super::batch::{DlqEntry, Known};
use super::function_batches;
use super::seams::{Metadata, Outbound};
use crate::config::{Config, OnDataLoss};
use crate::events::{DataLossGap, SysdbRetry, WatermarkRetry};
use crate::health::Health;
use crate::kafka::consumer::{Command, Commander};
use crate::kafka::Msg;
use crate::metrics::Metrics;
use crate::positions;
use crate::sysdb::Sysdb;

mod commit;

/// DLQ log lines: at most 20 per kind per 10 s (the metric counts every one).
static DLQ_LOG: crate::ratelimit::RateLimiter = crate::ratelimit::RateLimiter::new(Duration::from_secs(10), 20);

/// What a worker shares with the others.
pub struct Shared {
    pub config: Config,
    pub sysdb: Arc<Sysdb>,
    /// DLQ entries and backfill tasks go out here.
    pub producer: Outbound,
    pub commander: Commander,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub metadata: Metadata,
    pub topic: String,
    pub dlq_topic: String,
    pub backfill_topic: String,
    pub topic_partitions: i32,
    /// The schema registry writer schemas come from (`None`: every record is read as
    /// `schemas/log_record.avsc`, its schema id ignored).
    pub registry: Option<Arc<crate::schema_registry::SchemaRegistry>>,
    /// Where readers waiting for a read token see this replica's commits.
    pub board: Arc<crate::reading::board::Board>,
    /// The change feed's relay (`[changelog] enabled`): one task per owned partition.
    pub relay: Option<Arc<crate::changelog::Relay>>,
    /// The simulation's view of the commit path (`None` in every other test).
    #[cfg(test)]
    pub hooks: Option<Arc<dyn super::seams::CommitHooks>>,
}

impl Shared {
    /// Halt a partition visibly: its gauge, the replica's readiness (naming the reason),
    /// the consumer paused, and the reason stored in the sysdb for `sluice offsets show`.
    pub fn halt(&self, partition: i32, reason: String) {
        self.metrics.partition_halted(partition, true);
        self.health.set_halted(partition, Some(reason.clone()));
        self.commander.send(Command::Pause(vec![partition]));
        persist_halt(self, partition, Some(reason));
    }

    /// Set the halted state found at assignment (`None` = running).
    pub fn set_halted(&self, partition: i32, reason: Option<String>) {
        self.metrics.partition_halted(partition, reason.is_some());
        self.health.set_halted(partition, reason);
    }
}

/// Store (best effort, in the background) why a partition halted; the operator's reset
/// clears it.
fn persist_halt(shared: &Shared, partition: i32, reason: Option<String>) {
    let sysdb = shared.sysdb.clone();
    let topic = shared.topic.clone();
    tokio::spawn(async move {
        if let Err(e) = sysdb.set_partition_halted(&topic, partition, reason.as_deref()).await {
            warn!(%e, partition, "cannot store the partition's halted state in the sysdb (the replica still reports it)");
        }
    });
}

/// Messages from the router to a worker, in the consumer's order.
#[derive(Debug)]
pub enum WorkerMsg {
    Messages(Vec<Msg>),
    /// The assignment took effect with this generation.
    Generation(u64),
    Seeked {
        offset: i64,
        generation: u64,
    },
    /// The partition's fetch position fell below its log start: compare with the
    /// watermarks after committing what is buffered.
    CheckGap,
    /// Everything before `offset` was handed over; what lies between the last message and
    /// `offset` are transaction markers or aborted records.
    Position {
        offset: i64,
        generation: u64,
    },
    /// The consumer could not seek (bounded retries): halt.
    SeekFailed {
        offset: i64,
        error: String,
    },
}

/// Sysdb attempts of a batch that fails with a non-transient, non-record error before the
/// partition halts.
const FATAL_ATTEMPTS: u32 = 5;

/// How long a stopping worker may spend committing what it holds.
const FINISH_BUDGET: Duration = Duration::from_secs(7);

/// How long the watermark read of a gap check is retried before the partition halts.
const WATERMARK_RETRY_FOR: Duration = Duration::from_secs(30);

/// How a range of messages ended.
enum RangeOutcome {
    Committed,
    /// The sysdb refused a value of the range (attributable to a record): split it.
    Rejected(String),
    /// Not committed and not to be retried here: a CAS conflict (resynced) or a halt.
    Abandoned,
}

pub struct Worker {
    partition: i32,
    shared: Arc<Shared>,
    /// The sysdb `next_offset` as of our last commit (or the assignment).
    next: i64,
    generation: u64,
    buf: Vec<Msg>,
    buf_bytes: usize,
    first_at: Option<Instant>,
    /// The trace of the buffered batch: its `batch` root span and the `fetch_wait` child,
    /// both opened when the first record arrived.
    trace: Option<(Span, Span)>,
    known: HashMap<String, Known>,
    functions: function_batches::FunctionCache,
    halted: bool,
    stop: CancellationToken,
    /// Cancelled when the router stopped waiting for this worker (a revoke or shutdown
    /// ran out of time): from then on the partition may be another replica's, and a batch
    /// still in flight must not commit. The sysdb compare-and-set refuses it anyway; the
    /// fence keeps it from even trying.
    fence: CancellationToken,
    /// Records of the range being committed that go to the DLQ whatever a retry decides
    /// (already produced there, or refused by the sysdb), by offset.
    forced_dlq: HashMap<i64, DlqEntry>,
    /// Offsets of `forced_dlq` whose DLQ entry is acknowledged: never produced again by a
    /// retry of the same range.
    dlq_produced: HashSet<i64>,
}

impl Worker {
    pub fn new(
        partition: i32,
        shared: Arc<Shared>,
        next: i64,
        halted: bool,
        stop: CancellationToken,
        fence: CancellationToken,
    ) -> Self {
        Worker {
            partition,
            shared,
            next,
            generation: 0,
            buf: Vec::new(),
            buf_bytes: 0,
            first_at: None,
            trace: None,
            known: HashMap::new(),
            functions: function_batches::FunctionCache::default(),
            halted,
            stop,
            fence,
            forced_dlq: HashMap::new(),
            dlq_produced: HashSet::new(),
        }
    }

    pub async fn run(mut self, mut inbox: mpsc::Receiver<WorkerMsg>) {
        let stop = self.stop.clone();
        loop {
            // Caught up, a batch closes as soon as the inbox is empty (a deadline already
            // passed); behind, it lingers to grow, the longer the further behind.
            let deadline = self.first_at.map(|t| t + self.linger());
            let msg = tokio::select! {
                biased;
                _ = stop.cancelled() => {
                    self.finish().await;
                    return;
                }
                m = recv_until(&mut inbox, deadline) => m,
            };
            let msg = match msg {
                Received::Timeout => {
                    if self.flush_unless_stopped().await {
                        return;
                    }
                    continue;
                }
                Received::Closed => return,
                Received::Msg(m) => m,
            };
            let stopped = match msg {
                WorkerMsg::Messages(msgs) => {
                    for m in msgs {
                        self.accept(m);
                    }
                    let p = &self.shared.config.processor;
                    if self.buf.len() >= p.batch_max_records || self.buf_bytes >= p.batch_max_bytes {
                        self.flush_unless_stopped().await
                    } else {
                        false
                    }
                }
                WorkerMsg::Generation(g) => {
                    self.generation = g;
                    false
                }
                WorkerMsg::Seeked { offset, generation } => {
                    self.generation = generation;
                    self.buf.clear();
                    self.buf_bytes = 0;
                    self.first_at = None;
                    self.discard_trace();
                    self.next = offset;
                    false
                }
                WorkerMsg::CheckGap => {
                    // Commit what was fetched first: only what lies past it can be a gap.
                    self.flush_unless_stopped().await || {
                        self.check_gap().await;
                        false
                    }
                }
                WorkerMsg::Position { offset, generation } => {
                    if generation != self.generation || self.halted {
                        false
                    } else {
                        self.flush_unless_stopped().await || self.cover_position(offset).await
                    }
                }
                WorkerMsg::SeekFailed { offset, error } => {
                    self.halt(format!("the consumer could not seek to offset {offset}: {error}"));
                    false
                }
            };
            if stopped {
                return;
            }
        }
    }

    /// Stopping (revoke or shutdown): commit what is buffered, bounded.
    async fn finish(&mut self) {
        if !self.buf.is_empty() && !self.halted {
            let _ = tokio::time::timeout(FINISH_BUDGET, self.flush()).await;
        }
    }

    /// Flush; if told to stop meanwhile, give the flush a bounded time to end. Returns
    /// whether the worker must exit.
    async fn flush_unless_stopped(&mut self) -> bool {
        let stop = self.stop.clone();
        let flush = self.flush();
        tokio::pin!(flush);
        tokio::select! {
            _ = &mut flush => false,
            _ = stop.cancelled() => {
                let _ = tokio::time::timeout(FINISH_BUDGET, flush).await;
                true
            }
        }
    }

    /// Move the position over transaction markers and aborted records: a commit of the
    /// position alone, once the consumer went past them. Returns whether to exit.
    async fn cover_position(&mut self, offset: i64) -> bool {
        #[cfg(test)]
        let offset = match self.shared.hooks.as_ref().and_then(|h| h.mistake()) {
            Some(super::seams::Mistake::MarkerCountedAsRecord) => offset + 1,
            _ => offset,
        };
        if offset <= self.next || !self.buf.is_empty() {
            return false;
        }
        let stop = self.stop.clone();
        let commit = self.commit_range(Vec::new(), offset, None);
        tokio::pin!(commit);
        tokio::select! {
            _ = &mut commit => false,
            _ = stop.cancelled() => {
                let _ = tokio::time::timeout(FINISH_BUDGET, commit).await;
                true
            }
        }
    }

    /// How long the open batch may wait for more records after its first one arrived
    /// ([`linger_for`] over the newest buffered record).
    fn linger(&self) -> Duration {
        let p = &self.shared.config.processor;
        linger_for(
            p.batch_linger_ms,
            p.batch_linger_behind_ms,
            self.buf.last().and_then(|m| m.timestamp_ms),
            crate::sysdb::now_ms(),
        )
    }

    fn accept(&mut self, m: Msg) {
        if m.generation != self.generation || self.halted {
            return;
        }
        let expected = self.buf.last().map(|l| positions::next_offset_after(l.offset)).unwrap_or(self.next);
        if m.offset < expected {
            return; // already applied or buffered (a re-fetch after a seek)
        }
        self.buf_bytes += m.payload.as_ref().map_or(0, |p| p.len());
        if self.first_at.is_none() {
            self.first_at = Some(Instant::now());
            let batch = batch_span(&self.shared.topic, self.partition);
            let wait = debug_span!(parent: &batch, "fetch_wait");
            self.trace = Some((batch, wait));
        }
        self.buf.push(m);
    }

    async fn flush(&mut self) {
        let msgs = std::mem::take(&mut self.buf);
        self.buf_bytes = 0;
        self.first_at = None;
        // The wait ends here; the batch span goes on through the commit.
        let span = self.trace.take().map(|(batch, _wait)| batch);
        let Some(last) = msgs.last() else { return };
        let to = positions::next_offset_after(last.offset);
        self.commit_range(msgs, to, span).await;
    }

    /// The buffered batch was dropped uncommitted (a seek, a halt): so ends its trace.
    fn discard_trace(&mut self) {
        if let Some((batch, _wait)) = self.trace.take() {
            batch.record("outcome", "discarded");
        }
    }

    /// Caches that a failed or refused commit may have made stale.
    fn forget_caches(&mut self) {
        self.known.clear();
        self.functions.clear();
    }

    /// The position moved to `to` in the sysdb: remember it and ask for the lagging group
    /// commit.
    fn after_commit_position(&mut self, to: i64) {
        // Only the hand-over to the consumer thread, which commits the group offset later.
        let _span = debug_span!("group_commit_request", to).entered();
        debug_assert!(
            to > self.next,
            "design.md invariant 2: a committed batch moves partition {}'s position forward, not {} -> {to}",
            self.partition,
            self.next
        );
        self.next = to;
        self.shared.metrics.partition_sysdb_next(self.partition, to);
        self.shared.board.committed(self.partition, to);
        // The only group offset ever requested is a position the sysdb has just committed,
        // so the group offset is never ahead of it (design.md invariant 3).
        self.shared.commander.send(Command::Commit(vec![(self.partition, to)]));
    }

    /// Stop this partition, visibly, until an operator acts (`sluice offsets reset`) or the
    /// partition is reassigned.
    fn halt(&mut self, reason: String) {
        error!(partition = self.partition, position = self.next, reason = %reason, "partition HALTED; it stays halted until it is reassigned or reset (`sluice offsets show` names the reason)");
        self.halted = true;
        self.buf.clear();
        self.buf_bytes = 0;
        self.first_at = None;
        self.discard_trace();
        self.shared.halt(self.partition, reason);
    }

    /// After a CAS conflict: adopt the sysdb position and seek there.
    async fn resync(&mut self) {
        let mut delays = crate::retry::default_backoff();
        loop {
            match self.shared.sysdb.positions(&self.shared.topic).await {
                Ok(pos) => {
                    let stored = pos.get(&self.partition).copied().unwrap_or(self.next);
                    self.next = stored;
                    self.shared.metrics.partition_sysdb_next(self.partition, stored);
                    self.generation = 0; // drop everything until the seek is confirmed
                    self.shared.commander.send(Command::Seek { partition: self.partition, offset: stored });
                    return;
                }
                Err(e) => {
                    SysdbRetry {
                        what: "cannot re-read the position; retrying",
                        partition: Some(self.partition),
                        error: &e,
                    }
                    .emit(&self.shared.metrics);
                    tokio::select! {
                        _ = tokio::time::sleep(delays.next().unwrap_or(Duration::from_secs(5))) => {}
                        _ = self.stop.cancelled() => return,
                    }
                }
            }
        }
    }

    /// Compare our position with the partition's log start (gaps are loud). Called after
    /// the buffered records were committed, so `next` is the fetch position.
    async fn check_gap(&mut self) {
        if self.halted {
            return;
        }
        let p = self.partition;
        let Some(low) = self.log_start().await else {
            self.halt(format!(
                "cannot read the watermarks of partition {p} for {}s after an out-of-range fetch",
                WATERMARK_RETRY_FOR.as_secs()
            ));
            return;
        };
        if self.next >= low {
            return;
        }
        let recorded = self.shared.config.processor.on_data_loss == OnDataLoss::Skip;
        match self.shared.config.processor.on_data_loss {
            OnDataLoss::Halt => {
                let from = self.next;
                DataLossGap { partition: p, from, to: low, recorded }.emit(&self.shared.metrics);
                self.halt(format!(
                    "records [{from}, {low}) were deleted by retention before being processed (on_data_loss = \"halt\"); to accept the loss: `sluice offsets reset --partition {p} --to {low}`"
                ));
            }
            OnDataLoss::Skip => match self.shared.sysdb.record_gap(&self.shared.topic, p, self.next, low).await {
                Ok(()) => {
                    DataLossGap { partition: p, from: self.next, to: low, recorded }.emit(&self.shared.metrics);
                    self.next = low;
                    self.shared.metrics.partition_sysdb_next(p, low);
                    self.generation = 0;
                    self.shared.commander.send(Command::Seek { partition: p, offset: low });
                }
                Err(e) => warn!(%e, "cannot record the gap; will retry on the next check"),
            },
        }
    }

    /// The partition's log start offset, retried with backoff (counted) for a bounded time.
    async fn log_start(&self) -> Option<i64> {
        let deadline = Instant::now() + WATERMARK_RETRY_FOR;
        let mut delays = crate::retry::default_backoff();
        loop {
            let p = self.partition;
            match self.shared.metadata.watermarks(&self.shared.topic, p).await {
                Ok((low, _high)) => return Some(low),
                Err(e) => WatermarkRetry { partition: p, error: &e }.emit(&self.shared.metrics),
            }
            let wait = delays.next().unwrap_or(Duration::from_secs(5));
            if Instant::now() + wait > deadline {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = self.stop.cancelled() => return None,
            }
        }
    }

    pub fn is_halted(&self) -> bool {
        self.halted
    }
}

/// The root span of one batch's trace (no parent, whatever span is current); the range
/// and the outcome are recorded when known.
fn batch_span(topic: &str, partition: i32) -> Span {
    use tracing::field::Empty;
    info_span!(parent: None, "batch", topic = %topic, partition, from = Empty, to = Empty, records = Empty, outcome = Empty)
}

/// A batch lingers a tenth of how late its newest record already is: the wait it adds
/// stays small next to the delay its records have, and a partition deep in a backlog
/// commits few large batches (on W1, lingering up to 100 ms instead of 5 cut the CPU per
/// record by 13%: each transaction rewrites fewer pages per record).
const LINGER_SHARE_OF_LAG: i64 = 10;

/// The linger of a batch whose newest record has the Kafka timestamp `newest_ms`:
/// none while that record is less than `threshold_ms` old (the partition is at the head
/// of its log: latency is one commit), else a [`LINGER_SHARE_OF_LAG`]th of its age, at
/// most `max_ms`. A record without a timestamp, or a threshold of 0, lingers `max_ms`.
fn linger_for(max_ms: u64, threshold_ms: u64, newest_ms: Option<i64>, now_ms: i64) -> Duration {
    let max = Duration::from_millis(max_ms);
    let Some(newest) = newest_ms else { return max };
    if threshold_ms == 0 {
        return max;
    }
    let age = now_ms.saturating_sub(newest);
    if age < i64::try_from(threshold_ms).unwrap_or(i64::MAX) {
        return Duration::ZERO;
    }
    max.min(Duration::from_millis(u64::try_from(age / LINGER_SHARE_OF_LAG).unwrap_or(0)))
}

/// What a worker's inbox gave.
enum Received {
    Msg(WorkerMsg),
    /// The linger deadline passed (with a zero linger: the inbox is empty).
    Timeout,
    Closed,
}

async fn recv_until(inbox: &mut mpsc::Receiver<WorkerMsg>, deadline: Option<Instant>) -> Received {
    // The deadline passed (always so with a zero linger): take only what is already
    // waiting; an empty inbox closes the batch.
    if deadline.is_some_and(|d| d <= Instant::now()) {
        return match inbox.try_recv() {
            Ok(m) => Received::Msg(m),
            Err(mpsc::error::TryRecvError::Empty) => Received::Timeout,
            Err(mpsc::error::TryRecvError::Disconnected) => Received::Closed,
        };
    }
    let next = match deadline {
        Some(d) => match tokio::time::timeout_at(d, inbox.recv()).await {
            Ok(m) => m,
            Err(_) => return Received::Timeout,
        },
        None => inbox.recv().await,
    };
    next.map_or(Received::Closed, Received::Msg)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::linger_for;

    #[test]
    fn a_batch_lingers_only_behind_the_head_of_its_log_and_longer_the_further_behind() {
        let now = 1_000_000;
        let ms = Duration::from_millis;
        assert_eq!(linger_for(100, 20, Some(now - 3), now), ms(0), "fresh: commit at once");
        assert_eq!(linger_for(100, 20, Some(now + 50), now), ms(0), "a producer clock ahead: fresh");
        assert_eq!(linger_for(100, 20, Some(now - 20), now), ms(2), "20 ms old: behind, a tenth");
        assert_eq!(linger_for(100, 20, Some(now - 400), now), ms(40), "400 ms old: a tenth");
        assert_eq!(linger_for(100, 20, Some(now - 60_000), now), ms(100), "a backlog: the most");
        assert_eq!(linger_for(5, 20, Some(now - 60_000), now), ms(5), "the most is the setting");
        assert_eq!(linger_for(100, 20, None, now), ms(100), "no timestamp: the configured linger");
        assert_eq!(linger_for(100, 0, Some(now), now), ms(100), "0: always linger");
        assert_eq!(linger_for(0, 20, Some(now - 60_000), now), ms(0), "0: never linger");
    }
}
