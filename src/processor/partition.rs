//! One partition's worker: batches messages, folds them, commits each batch with its
//! position in one sysdb transaction (CAS), then asks for the lagging group commit.
//!
//! Delivery guarantee: every log record is applied to the sysdb exactly once, because a
//! batch and its `next_offset` commit atomically and conditionally on the batch's start.
//! DLQ entries are produced (and acknowledged) before that commit, so a crash in between
//! may produce a DLQ entry twice: the DLQ is at-least-once, never lossy.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tracing::{debug, error, info, info_span, warn, Instrument};

use super::batch::{self, BatchCounts, DlqEntry, Known};
use super::functions;
use crate::api::Health;
use crate::config::{Config, OnDataLoss};
use crate::failpoint;
use crate::kafka::admin::MetadataClient;
use crate::kafka::consumer::{Command, Commander};
use crate::kafka::producer::{Outgoing, Producer};
use crate::kafka::Msg;
use crate::metrics::{self, Metrics};
use crate::positions::PositionDelta;
use crate::sysdb::{Sysdb, SysdbError};

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
    /// Halt or resume a partition: its gauge and the replica's readiness together.
    pub fn set_halted(&self, partition: i32, halted: bool) {
        self.metrics.partition_halted(partition, halted);
        self.health.set_halted(partition, halted);
    }
}

/// Messages from the router to a worker, in the consumer's order.
#[derive(Debug)]
pub enum WorkerMsg {
    Messages(Vec<Msg>),
    /// The assignment took effect with this generation.
    Generation(u64),
    Seeked { offset: i64, generation: u64 },
    /// A fetch went out of range somewhere: compare our position with the log start.
    CheckGap,
    /// Revoke or shutdown: commit what is buffered (bounded), then acknowledge and exit.
    Stop(tokio::sync::oneshot::Sender<()>),
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
}

impl Worker {
    pub fn new(partition: i32, shared: Arc<Shared>, next: i64, halted: bool) -> Self {
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
        }
    }

    pub async fn run(mut self, mut inbox: mpsc::Receiver<WorkerMsg>) {
        let linger = Duration::from_millis(self.shared.config.processor.batch_linger_ms);
        loop {
            let deadline = self.first_at.map(|t| t + linger);
            let msg = match deadline {
                Some(d) => match tokio::time::timeout_at(d.into(), inbox.recv()).await {
                    Ok(m) => m,
                    Err(_) => {
                        self.flush().await;
                        continue;
                    }
                },
                None => inbox.recv().await,
            };
            let Some(msg) = msg else {
                return;
            };
            match msg {
                WorkerMsg::Messages(msgs) => {
                    for m in msgs {
                        self.accept(m);
                    }
                    let p = &self.shared.config.processor;
                    if self.buf.len() >= p.batch_max_records || self.buf_bytes >= p.batch_max_bytes {
                        self.flush().await;
                    }
                }
                WorkerMsg::Generation(g) => self.generation = g,
                WorkerMsg::Seeked { offset, generation } => {
                    self.generation = generation;
                    self.buf.clear();
                    self.buf_bytes = 0;
                    self.first_at = None;
                    self.next = offset;
                }
                WorkerMsg::CheckGap => self.check_gap().await,
                WorkerMsg::Stop(done) => {
                    if !self.buf.is_empty() {
                        let _ = tokio::time::timeout(Duration::from_secs(8), self.flush()).await;
                    }
                    let _ = done.send(());
                    return;
                }
            }
        }
    }

    fn accept(&mut self, m: Msg) {
        if m.generation != self.generation || self.halted {
            return;
        }
        let expected = self.buf.last().map(|l| l.offset + 1).unwrap_or(self.next);
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
        let delta = match PositionDelta::new(self.partition, self.next, last.offset + 1) {
            Ok(d) => d,
            Err(e) => {
                error!(%e, "internal: batch before the position; dropping it");
                return;
            }
        };
        let flush_started = Instant::now();
        let span = info_span!("batch", topic = %self.shared.topic, partition = self.partition, from = delta.from, to = delta.to);
        let mut backoff = Duration::from_millis(100);
        let mut retried = false;
        loop {
            let outcome = self.process(&msgs, delta).instrument(span.clone()).await;
            if !matches!(&outcome, Err(e) if e.is_retryable()) {
                self.shared.health.set_sysdb_unavailable(None);
            }
            // A commit whose outcome was unknown (the connection dropped during COMMIT)
            // that in fact landed: the retry finds the position already at our `to`.
            let landed_before = retried
                && matches!(&outcome, Err(SysdbError::Conflict(crate::positions::IncompatibleDelta::PositionMoved { stored, .. })) if *stored == delta.to);
            let outcome = if landed_before {
                info!(partition = self.partition, to = delta.to, "the previous, uncertain commit of this batch had landed");
                Ok(())
            } else {
                outcome
            };
            match outcome {
                Ok(()) => {
                    self.next = delta.to;
                    self.shared.metrics.partition_sysdb_next(self.partition, delta.to);
                    self.shared.metrics.observe_batch_duration(flush_started.elapsed());
                    self.shared.commander.send(Command::Commit(vec![(self.partition, delta.to)]));
                    return;
                }
                Err(SysdbError::Conflict(e)) => {
                    self.shared.metrics.sysdb_cas_conflict();
                    self.shared.metrics.observe_batch_duration(flush_started.elapsed());
                    warn!(%e, partition = self.partition, "batch refused by the sysdb compare-and-set; re-reading the position");
                    self.known.clear();
                    self.resync().await;
                    return;
                }
                Err(e) => {
                    self.shared.metrics.sysdb_retry();
                    if e.is_retryable() {
                        self.shared.health.set_sysdb_unavailable(Some(e.to_string()));
                    }
                    retried = true;
                    warn!(%e, partition = self.partition, retry_in = ?backoff, "batch commit failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                    self.known.clear();
                }
            }
        }
    }

    /// After a CAS conflict: adopt the sysdb position and seek there.
    async fn resync(&mut self) {
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
                    warn!(%e, "cannot re-read the position; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }
    }

    async fn process(&mut self, msgs: &[Msg], delta: PositionDelta) -> Result<(), SysdbError> {
        let cfg = &self.shared.config;
        let started = Instant::now();
        let decoded = batch::decode_all(msgs, cfg.kafka.framing, &cfg.limits);

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
                    .map_err(|e| SysdbError::Database { backend: "processor", message: e.to_string() })?;
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
    /// (bad input is never dropped silently, invariant 10).
    async fn produce_dlq(&self, msgs: &[Msg], dlq: &[DlqEntry]) {
        if dlq.is_empty() {
            return;
        }
        let by_offset: HashMap<i64, &Msg> = msgs.iter().map(|m| (m.offset, m)).collect();
        let partition = self.partition.to_string();
        for d in dlq {
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
            if let crate::ratelimit::Verdict::Log { suppressed } = DLQ_LOG.check(d.kind) {
                info!(partition = self.partition, offset = d.offset, kind = d.kind, message = %d.message, suppressed_before = suppressed, "record sent to the DLQ");
            }
        }
    }

    /// Compare our position with the partition's log start (invariant 11).
    async fn check_gap(&mut self) {
        let md = self.shared.metadata.clone();
        let topic = self.shared.topic.clone();
        let p = self.partition;
        let wm = tokio::task::spawn_blocking(move || {
            md.lock().unwrap_or_else(|e| e.into_inner()).watermarks(&topic, p)
        })
        .await;
        let Ok(Ok((low, _high))) = wm else { return };
        if self.next >= low || self.halted {
            return;
        }
        self.shared.metrics.gap();
        match self.shared.config.processor.on_data_loss {
            OnDataLoss::Halt => {
                error!(partition = p, from = self.next, to = low, "records were deleted by retention before being processed; partition HALTED (on_data_loss = \"halt\"). Decide with `sluice offsets reset --partition {p} --to {low}`");
                self.halted = true;
                self.shared.set_halted(p, true);
                self.shared.commander.send(Command::Pause(vec![p]));
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

    pub fn is_halted(&self) -> bool {
        self.halted
    }
}
