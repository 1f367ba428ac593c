//! One partition's worker: batches messages, folds them, commits each batch with its
//! position in one sysdb transaction (CAS), then asks for the lagging group commit.
//!
//! Delivery guarantee: every log record is applied to the sysdb exactly once, because a
//! batch and its `next_offset` commit atomically and conditionally on the batch's start.
//! DLQ entries are produced (and acknowledged) before that commit, so a crash in between
//! may produce a DLQ entry twice: the DLQ is at-least-once, never lossy.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::batch::{self, kinds, BatchCounts, BatchError, DlqEntry, Known};
use super::functions;
use crate::api::Health;
use crate::config::{Config, OnDataLoss};
use crate::failpoint;
use crate::kafka::admin::MetadataClient;
use crate::kafka::consumer::{Command, Commander};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::Msg;
use crate::metrics::{self, Metrics};
use crate::positions::{self, IncompatibleDelta, PositionDelta};
use crate::sysdb::Sysdb;

/// DLQ log lines: at most 20 per kind per 10 s (the metric counts every one).
static DLQ_LOG: crate::ratelimit::RateLimiter = crate::ratelimit::RateLimiter::new(Duration::from_secs(10), 20);

/// What a worker shares with the others.
pub struct Shared {
    pub config: Config,
    pub sysdb: Arc<Sysdb>,
    pub producer: Producer,
    pub commander: Commander,
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    pub metadata: Arc<std::sync::Mutex<MetadataClient>>,
    pub topic: String,
    pub dlq_topic: String,
    pub backfill_topic: String,
    pub topic_partitions: i32,
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
    Seeked { offset: i64, generation: u64 },
    /// The partition's fetch position fell below its log start: compare with the
    /// watermarks after committing what is buffered.
    CheckGap,
    /// Everything before `offset` was handed over; what lies between the last message and
    /// `offset` are transaction markers or aborted records.
    Position { offset: i64, generation: u64 },
    /// The consumer could not seek (bounded retries): halt.
    SeekFailed { offset: i64, error: String },
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
    known: HashMap<String, Known>,
    functions: functions::FunctionCache,
    halted: bool,
    stop: CancellationToken,
    /// Records of the range being committed that go to the DLQ whatever a retry decides
    /// (already produced there, or refused by the sysdb), by offset.
    forced_dlq: HashMap<i64, DlqEntry>,
    /// Offsets of `forced_dlq` whose DLQ entry is acknowledged: never produced again by a
    /// retry of the same range.
    dlq_produced: HashSet<i64>,
}

impl Worker {
    pub fn new(partition: i32, shared: Arc<Shared>, next: i64, halted: bool, stop: CancellationToken) -> Self {
        Worker {
            partition,
            shared,
            next,
            generation: 0,
            buf: Vec::new(),
            buf_bytes: 0,
            first_at: None,
            known: HashMap::new(),
            functions: functions::FunctionCache::default(),
            halted,
            stop,
            forced_dlq: HashMap::new(),
            dlq_produced: HashSet::new(),
        }
    }

    pub async fn run(mut self, mut inbox: mpsc::Receiver<WorkerMsg>) {
        let linger = Duration::from_millis(self.shared.config.processor.batch_linger_ms);
        let stop = self.stop.clone();
        loop {
            let deadline = self.first_at.map(|t| t + linger);
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
        if offset <= self.next || !self.buf.is_empty() {
            return false;
        }
        let stop = self.stop.clone();
        let commit = self.commit_range(Vec::new(), offset);
        tokio::pin!(commit);
        tokio::select! {
            _ = &mut commit => false,
            _ = stop.cancelled() => {
                let _ = tokio::time::timeout(FINISH_BUDGET, commit).await;
                true
            }
        }
    }

    fn accept(&mut self, m: Msg) {
        if m.generation != self.generation || self.halted {
            return;
        }
        let expected = self.buf.last().map(|l| positions::next_offset_after(l.offset)).unwrap_or(self.next);
        if m.offset < expected {
            return; // already applied or buffered (a re-fetch after a seek)
        }
        self.buf_bytes += m.payload.as_ref().map_or(0, Vec::len);
        if self.first_at.is_none() {
            self.first_at = Some(Instant::now());
        }
        self.buf.push(m);
    }

    async fn flush(&mut self) {
        let msgs = std::mem::take(&mut self.buf);
        self.buf_bytes = 0;
        self.first_at = None;
        let Some(last) = msgs.last() else { return };
        let to = positions::next_offset_after(last.offset);
        self.commit_range(msgs, to).await;
    }

    /// Commit `msgs` (in offset order, possibly none) and move the position to `to`. A
    /// range the sysdb refuses because of a value in it is split in halves until the
    /// refused record is alone; that record goes to the DLQ (`sysdb_rejected`) and the
    /// rest commits. Each part is an ordinary batch with its own position delta.
    async fn commit_range(&mut self, msgs: Vec<Msg>, to: i64) {
        let started = Instant::now();
        let mut work: VecDeque<(usize, usize, i64)> = VecDeque::from([(0, msgs.len(), to)]);
        while let Some((a, b, to)) = work.pop_front() {
            match self.commit_part(&msgs[a..b], to).await {
                RangeOutcome::Committed => {}
                RangeOutcome::Abandoned => break,
                RangeOutcome::Rejected(error) => {
                    if b - a > 1 {
                        let mid = a + (b - a) / 2;
                        work.push_front((mid, b, to));
                        work.push_front((a, mid, positions::next_offset_after(msgs[mid - 1].offset)));
                    } else if b - a == 1 && !self.forced_dlq.contains_key(&msgs[a].offset) {
                        let offset = msgs[a].offset;
                        let message = format!(
                            "the {} sysdb refused this record ({error}); fix the producer or the limits, then replay it from the DLQ",
                            self.shared.sysdb.backend()
                        );
                        self.forced_dlq.insert(offset, DlqEntry { offset, kind: kinds::SYSDB_REJECTED, message });
                        work.push_front((a, b, to));
                    } else {
                        self.halt(format!(
                            "the sysdb refuses the batch [{}, {to}) even without its records: {error}",
                            self.next
                        ));
                        break;
                    }
                }
            }
        }
        self.forced_dlq.clear();
        self.dlq_produced.clear();
        self.shared.metrics.observe_batch_duration(started.elapsed());
    }

    /// Commit one part, retrying transient failures with backoff (indefinitely, visibly:
    /// `/readyz` reports the sysdb unavailable) and other database failures a bounded
    /// number of times before halting.
    async fn commit_part(&mut self, msgs: &[Msg], to: i64) -> RangeOutcome {
        let delta = match PositionDelta::new(self.partition, self.next, to) {
            Ok(d) => d,
            Err(e) => {
                self.halt(format!("internal error: batch ending at {to} does not follow the position {}: {e}", self.next));
                return RangeOutcome::Abandoned;
            }
        };
        let span = info_span!("batch", topic = %self.shared.topic, partition = self.partition, from = delta.from, to = delta.to);
        let mut backoff = Duration::from_millis(100);
        let mut retried = false;
        let mut fatal_attempts = 0;
        loop {
            let outcome = self.process(msgs, delta).instrument(span.clone()).await;
            if !matches!(&outcome, Err(BatchError::Transient(_))) {
                self.shared.health.set_sysdb_unavailable(None);
            }
            // A commit whose outcome was unknown (the connection dropped during COMMIT)
            // that in fact landed: the retry finds the position already at our `to`.
            let landed_before = retried
                && matches!(&outcome, Err(BatchError::Conflict(IncompatibleDelta::PositionMoved { stored, .. })) if *stored == delta.to);
            let outcome = if landed_before {
                info!(partition = self.partition, to = delta.to, "the previous, uncertain commit of this batch had landed");
                // What that commit did to functions (a marker accepted) is not known here:
                // read them again, as after any commit that moved a function.
                self.functions.clear();
                self.after_commit_position(delta.to);
                Ok(())
            } else {
                outcome
            };
            match outcome {
                Ok(()) => return RangeOutcome::Committed,
                Err(BatchError::Conflict(e)) => {
                    self.shared.metrics.sysdb_cas_conflict();
                    warn!(%e, partition = self.partition, "batch refused by the sysdb compare-and-set; re-reading the position");
                    self.forget_caches();
                    self.resync().await;
                    return RangeOutcome::Abandoned;
                }
                Err(BatchError::Record(e)) => {
                    warn!(%e, partition = self.partition, from = delta.from, to = delta.to, records = msgs.len(), "the sysdb refused a value of this batch; isolating the record");
                    self.forget_caches();
                    return RangeOutcome::Rejected(e.to_string());
                }
                Err(BatchError::Bug(message)) => {
                    self.halt(format!("internal error in batch [{}, {}): {message}", delta.from, delta.to));
                    return RangeOutcome::Abandoned;
                }
                Err(BatchError::Transient(e)) => {
                    self.shared.metrics.sysdb_retry();
                    self.shared.health.set_sysdb_unavailable(Some(e.to_string()));
                    warn!(%e, partition = self.partition, retry_in = ?backoff, "sysdb unavailable; retrying the batch");
                }
                Err(BatchError::Fatal(e)) => {
                    self.shared.metrics.sysdb_retry();
                    fatal_attempts += 1;
                    if fatal_attempts >= FATAL_ATTEMPTS {
                        self.halt(format!("the sysdb failed batch [{}, {}) {fatal_attempts} times: {e}", delta.from, delta.to));
                        return RangeOutcome::Abandoned;
                    }
                    warn!(%e, partition = self.partition, attempt = fatal_attempts, retry_in = ?backoff, "batch commit failed; retrying");
                }
            }
            retried = true;
            self.forget_caches();
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
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
        self.next = to;
        self.shared.metrics.partition_sysdb_next(self.partition, to);
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
        self.shared.halt(self.partition, reason);
    }

    /// After a CAS conflict: adopt the sysdb position and seek there.
    async fn resync(&mut self) {
        let mut backoff = Duration::from_millis(200);
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
                    self.shared.metrics.sysdb_retry();
                    warn!(%e, "cannot re-read the position; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = self.stop.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    async fn process(&mut self, msgs: &[Msg], delta: PositionDelta) -> Result<(), BatchError> {
        let cfg = &self.shared.config;
        let started = Instant::now();
        let mut decoded = batch::decode_all(msgs, cfg.kafka.framing, &cfg.limits);
        // A record a previous attempt sent to the DLQ (or the sysdb refused) stays there:
        // never both in the DLQ and applied.
        if !self.forced_dlq.is_empty() {
            for (offset, r) in decoded.iter_mut() {
                if let Some(entry) = self.forced_dlq.get(offset) {
                    *r = Err(entry.clone());
                }
            }
        }

        // Learn the collections this batch names.
        let names: HashSet<&str> =
            decoded.iter().filter_map(|(_, r)| r.as_ref().ok()).map(|r| r.collection_id.as_str()).collect();
        for name in names {
            if !self.known.contains_key(name) {
                let k = match self.shared.sysdb.collection(name).await? {
                    Some(row) => Known::Registered(row),
                    None => Known::Unknown,
                };
                self.known.insert(name.to_string(), k);
            }
        }
        let routed = batch::route(
            decoded,
            self.partition,
            self.shared.topic_partitions,
            &self.known,
            cfg.processor.unknown_collections,
        );
        let mut dlq = routed.dlq;
        let mut counts = BatchCounts::default();
        let mut updates = Vec::new();
        let mut function_batches = Vec::new();
        let mut tasks = Vec::new();
        let now_ms = crate::sysdb::now_ms();
        // The functions attached to each collection, read once: the same list decides
        // which records are read whole (their preimages) and which deltas are computed.
        let mut attached_by: Vec<Vec<functions::Attached>> = Vec::with_capacity(routed.collections.len());
        // The current state of every record the batch names, in one read (whole records
        // only where the fold may need them: `batch::ids_to_read`).
        let mut wanted: Vec<(String, Vec<(String, bool)>)> = Vec::with_capacity(routed.collections.len());
        for (id, (row, records)) in &routed.collections {
            let markers = functions::markers(records);
            let named: Vec<&str> = markers.iter().map(|(_, b)| b.function_id.as_str()).collect();
            let attached = self.functions.get(&self.shared.sysdb, id, &named).await?.to_vec();
            let with_functions = !markers.is_empty() || !attached.is_empty();
            wanted.push((id.clone(), batch::ids_to_read(records, row.as_ref().and_then(|r| r.dimension), with_functions)));
            attached_by.push(attached);
        }
        let mut current_all = self.shared.sysdb.get_records_many(wanted).await?;
        for ((id, (row, records)), attached) in routed.collections.iter().zip(&attached_by) {
            let current = current_all.remove(id).unwrap_or_default();
            let (update, outcome) =
                batch::fold_collection(id, row.as_ref(), self.partition, records, &current, &mut counts, &mut dlq)
                    .map_err(|e| BatchError::Bug(format!("fold of collection {id:?}: {e}")))?;
            if let Some(u) = update {
                if self.shared.metrics.per_collection() {
                    let applied = records.iter().filter(|(_, r)| r.operation.is_data()).count() - outcome.rejected.len();
                    self.shared.metrics.collection_records(id, applied as u64);
                }
                updates.push(u);
            }
            if !attached.is_empty() {
                let markers = functions::markers(records);
                function_batches.extend(functions::function_batches(attached, &outcome, &markers));
                tasks.extend(functions::tasks(attached, &markers, &self.shared.topic, self.partition, now_ms));
            }
        }
        dlq.sort_by_key(|d| d.offset);
        self.produce_dlq(msgs, &dlq).await;
        // Barrier (invariant 7): the backfill tasks are acknowledged before the commit.
        self.produce_tasks(&tasks).await;
        if !tasks.is_empty() {
            failpoint::hit("after_backfill_task");
        }

        failpoint::hit("before_sysdb_commit");
        let commit = Arc::new(batch::commit(&self.shared.topic, delta, updates, function_batches));
        let commit_started = Instant::now();
        let committed = self.shared.sysdb.commit_shared(Arc::clone(&commit)).await;
        self.shared.metrics.observe_sysdb_commit(commit_started.elapsed());
        let report = committed?;
        failpoint::hit("after_sysdb_commit");
        if !report.markers_accepted.is_empty() && failpoint::fail("marker_commit_outcome") {
            // As if the connection dropped during COMMIT: the batch landed, we do not know.
            return Err(BatchError::Transient(crate::sysdb::SysdbError::Unavailable {
                backend: self.shared.sysdb.backend(),
                message: "fail point: the outcome of the commit is unknown".into(),
            }));
        }
        self.after_commit_position(delta.to);
        for (function_id, offset) in &report.markers_accepted {
            info!(partition = self.partition, function = %function_id, marker_offset = offset, "backfill marker processed: function is backfilling");
        }
        if !report.markers_accepted.is_empty() {
            self.functions.clear();
        }
        let committed_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);

        // The commit is in: update caches and counters.
        for u in &commit.collections {
            let prev = match self.known.get(&u.id) {
                Some(Known::Registered(r)) => r.record_count,
                _ => 0,
            };
            self.known.insert(
                u.id.clone(),
                Known::Registered(crate::sysdb::CollectionRow {
                    id: u.id.clone(),
                    partition: u.partition,
                    dimension: u.dimension,
                    log_position: u.log_position,
                    record_count: prev + u.record_count_delta,
                }),
            );
        }
        let m = &self.shared.metrics;
        for (op, n) in &counts.by_operation {
            m.records_processed(op, *n);
        }
        for (reason, n) in &counts.ignored {
            m.records_ignored(reason, *n);
        }
        for d in &dlq {
            m.dlq_record(d.kind);
        }
        m.control_records(metrics::CONTROL_BACKFILL_STARTED, report.markers_accepted.len() as u64);
        m.control_records(metrics::CONTROL_IGNORED, counts.controls.saturating_sub(report.markers_accepted.len() as u64));
        m.batch_committed();
        // Every message of the batch (DLQ'd ones included) is done at this commit.
        m.observe_end_to_end(committed_ms, msgs.iter().map(|msg| msg.timestamp_ms));
        debug!(records = msgs.len(), dlq = dlq.len(), elapsed_ms = started.elapsed().as_millis() as u64, "batch committed");
        Ok(())
    }

    /// Produce the backfill tasks to the backfill topic and wait for the acknowledgements
    /// (retrying until delivered: the batch must not commit before its tasks are out).
    async fn produce_tasks(&self, tasks: &[crate::record::BackfillTask]) {
        for t in tasks {
            let payload = match crate::record::avro::encode_backfill_task(t) {
                Ok(p) => p,
                Err(e) => {
                    error!(%e, "internal: cannot encode a backfill task");
                    continue;
                }
            };
            let mut backoff = Duration::from_millis(100);
            loop {
                let out = Outgoing {
                    topic: &self.shared.backfill_topic,
                    partition: None,
                    key: Some(t.function_id.as_bytes()),
                    payload: &payload,
                    headers: &[],
                };
                match self.shared.producer.send(out).await {
                    Ok(_) => break,
                    Err(e) => {
                        warn!(%e, function = %t.function_id, "backfill task produce failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            info!(function = %t.function_id, marker_offset = t.marker_offset, "backfill task produced");
        }
    }

    /// Produce every DLQ entry and wait for the acknowledgements; retries until delivered
    /// (bad input is never dropped silently). An entry already acknowledged for this range
    /// (a retried batch) is not produced again.
    async fn produce_dlq(&mut self, msgs: &[Msg], dlq: &[DlqEntry]) {
        if dlq.is_empty() {
            return;
        }
        let by_offset: HashMap<i64, &Msg> = msgs.iter().map(|m| (m.offset, m)).collect();
        let partition = self.partition.to_string();
        for d in dlq {
            if self.dlq_produced.contains(&d.offset) {
                continue;
            }
            let m = by_offset.get(&d.offset);
            let offset = d.offset.to_string();
            let headers: [(&str, &[u8]); 5] = [
                ("sluice.source.topic", self.shared.topic.as_bytes()),
                ("sluice.source.partition", partition.as_bytes()),
                ("sluice.source.offset", offset.as_bytes()),
                ("sluice.error.kind", d.kind.as_bytes()),
                ("sluice.error.message", d.message.as_bytes()),
            ];
            let mut payload = m.and_then(|m| m.payload.as_deref()).unwrap_or_default();
            let key = m.and_then(|m| m.key.as_deref());
            let mut headers: Vec<(&str, &[u8])> = headers.to_vec();
            let mut backoff = Duration::from_millis(100);
            loop {
                let out = Outgoing { topic: &self.shared.dlq_topic, partition: None, key, payload, headers: &headers };
                match self.shared.producer.send(out).await {
                    Ok(_) => break,
                    Err(crate::kafka::KafkaError::TooLarge { size, .. }) => {
                        // Retrying cannot help and must not stall the partition: the DLQ
                        // entry goes without the payload; its source headers point at the
                        // original record, which stays in the log topic.
                        warn!(offset = d.offset, size, "record too large for the DLQ; sending the entry without its payload");
                        payload = &[];
                        headers.push(("sluice.payload.omitted", b"too_large"));
                    }
                    Err(e) => {
                        warn!(%e, offset = d.offset, "DLQ produce failed; retrying");
                        tokio::time::sleep(backoff).await;
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                    }
                }
            }
            self.dlq_produced.insert(d.offset);
            self.forced_dlq.entry(d.offset).or_insert_with(|| d.clone());
            if let crate::ratelimit::Verdict::Log { suppressed } = DLQ_LOG.check(d.kind) {
                info!(partition = self.partition, offset = d.offset, kind = d.kind, message = %d.message, suppressed_before = suppressed, "record sent to the DLQ");
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
        self.shared.metrics.gap();
        match self.shared.config.processor.on_data_loss {
            OnDataLoss::Halt => {
                let from = self.next;
                self.halt(format!(
                    "records [{from}, {low}) were deleted by retention before being processed (on_data_loss = \"halt\"); to accept the loss: `sluice offsets reset --partition {p} --to {low}`"
                ));
            }
            OnDataLoss::Skip => match self.shared.sysdb.record_gap(&self.shared.topic, p, self.next, low).await {
                Ok(()) => {
                    warn!(partition = p, from = self.next, to = low, "data-loss gap recorded; skipping (on_data_loss = \"skip\")");
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
        let mut backoff = Duration::from_millis(100);
        loop {
            let md = self.shared.metadata.clone();
            let topic = self.shared.topic.clone();
            let p = self.partition;
            let wm = tokio::task::spawn_blocking(move || md.lock().unwrap_or_else(|e| e.into_inner()).watermarks(&topic, p)).await;
            match wm {
                Ok(Ok((low, _high))) => return Some(low),
                Ok(Err(e)) => warn!(%e, partition = p, retry_in = ?backoff, "cannot read the watermarks; retrying"),
                Err(e) => warn!(%e, partition = p, "watermark read task failed; retrying"),
            }
            self.shared.metrics.watermark_retry();
            if Instant::now() + backoff > deadline {
                return None;
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = self.stop.cancelled() => return None,
            }
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    }

    pub fn is_halted(&self) -> bool {
        self.halted
    }
}

/// What a worker's inbox gave.
enum Received {
    Msg(WorkerMsg),
    /// The linger deadline passed first.
    Timeout,
    Closed,
}

async fn recv_until(inbox: &mut mpsc::Receiver<WorkerMsg>, deadline: Option<Instant>) -> Received {
    let next = match deadline {
        Some(d) => match tokio::time::timeout_at(d.into(), inbox.recv()).await {
            Ok(m) => m,
            Err(_) => return Received::Timeout,
        },
        None => inbox.recv().await,
    };
    next.map_or(Received::Closed, Received::Msg)
}
