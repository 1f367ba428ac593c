//! A worker's batch commit: plan (decode, route, fold; the sysdb read once) -> apply (DLQ
//! entries, backfill tasks, then the sysdb transaction) -> after the commit (position,
//! caches, counters). A range the sysdb refuses because of one record is split until that
//! record is alone; retries follow the one retry policy (`crate::retry`).
//!
//! Exactly once into the sysdb (`docs/design.md` section 9, invariants 2 and 15): a batch
//! and its `next_offset` commit together, only if the position is still the batch's
//! start. DLQ entries are produced and acknowledged before that commit (a crash in between
//! produces them again: at least once, never lost); a retried batch of the same replica
//! does not produce them again.

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tracing::{debug, debug_span, error, info, warn, Instrument, Span};

use super::{batch_span, RangeOutcome, Worker, DLQ_LOG, FATAL_ATTEMPTS};
use crate::events::{CasConflict, SysdbRetry};
use crate::failpoint;
use crate::kafka::producer::Outgoing;
use crate::kafka::Msg;
use crate::materialize::FoldError;
use crate::metrics;
use crate::positions::{self, IncompatibleDelta, PositionDelta};
use crate::processor::batch::{self, kinds, BatchCounts, BatchError, DlqEntry, Known};
use crate::processor::function_batches;
use crate::record::BackfillTask;
use crate::sysdb::{BatchCommit, CommitReport};

/// The longest wait between two attempts.
const MAX_DELAY: Duration = Duration::from_secs(5);

/// A batch prepared for its commit.
pub(super) struct Plan {
    pub commit: Arc<BatchCommit>,
    pub dlq: Vec<DlqEntry>,
    pub tasks: Vec<BackfillTask>,
    pub counts: BatchCounts,
    /// Data records applied per collection (for per-collection metrics).
    pub applied: Vec<(String, u64)>,
}

impl Worker {
    /// Commit `msgs` (in offset order, possibly none) and move the position to `to`. A
    /// range the sysdb refuses because of a value in it is split in halves until the
    /// refused record is alone; that record goes to the DLQ (`sysdb_rejected`) and the
    /// rest commits. Each part is an ordinary batch with its own position delta, and its
    /// own trace (`span`, opened when the first record arrived, is the first part's).
    pub(super) async fn commit_range(&mut self, msgs: Vec<Msg>, to: i64, span: Option<Span>) {
        let started = Instant::now();
        let mut span = span;
        let mut work: VecDeque<(usize, usize, i64)> = VecDeque::from([(0, msgs.len(), to)]);
        while let Some((a, b, to)) = work.pop_front() {
            let part_span = span.take().unwrap_or_else(|| batch_span(&self.shared.topic, self.partition));
            let outcome = self.commit_part(&msgs[a..b], to, &part_span).await;
            let name = match &outcome {
                RangeOutcome::Committed => "committed",
                RangeOutcome::Rejected(_) => "rejected",
                RangeOutcome::Abandoned if self.halted => "halted",
                RangeOutcome::Abandoned => "abandoned",
            };
            part_span.record("outcome", name);
            drop(part_span);
            match outcome {
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
    async fn commit_part(&mut self, msgs: &[Msg], to: i64, span: &Span) -> RangeOutcome {
        debug_assert!(
            msgs.first().is_none_or(|m| m.offset >= self.next) && msgs.last().is_none_or(|m| m.offset < to),
            "design.md invariant 2: partition {}'s batch [{}, {to}) holds offsets {:?}..{:?} outside it",
            self.partition,
            self.next,
            msgs.first().map(|m| m.offset),
            msgs.last().map(|m| m.offset)
        );
        let delta = match PositionDelta::new(self.partition, self.next, to) {
            Ok(d) => d,
            Err(e) => {
                self.halt(format!(
                    "internal error: batch ending at {to} does not follow the position {}: {e}",
                    self.next
                ));
                return RangeOutcome::Abandoned;
            }
        };
        span.record("from", delta.from);
        span.record("to", delta.to);
        span.record("records", msgs.len() as i64);
        let mut delays = crate::retry::default_backoff();
        let mut retried = false;
        let mut fatal_attempts = 0;
        loop {
            let outcome = self.process(msgs, delta).instrument(span.clone()).await;
            if !matches!(&outcome, Err(BatchError::Transient(_))) {
                self.shared.health.set_sysdb_unavailable(None);
            }
            if !matches!(&outcome, Err(BatchError::SchemaUnavailable(_))) {
                self.shared.health.set_waiting_for_schema(self.partition, None);
            }
            // A commit whose outcome was unknown (the connection dropped during COMMIT)
            // that in fact landed: the retry finds the position already at our `to`.
            let landed_before = retried
                && matches!(&outcome, Err(BatchError::Conflict(IncompatibleDelta::PositionMoved { stored, .. })) if *stored == delta.to);
            let outcome = if landed_before {
                info!(
                    partition = self.partition,
                    to = delta.to,
                    "the previous, uncertain commit of this batch had landed"
                );
                // What that commit did to functions (a marker accepted) is not known here:
                // read them again, as after any commit that moved a function.
                self.functions.clear();
                span.in_scope(|| self.after_commit_position(delta.to));
                Ok(())
            } else {
                outcome
            };
            match outcome {
                Ok(()) => return RangeOutcome::Committed,
                Err(BatchError::Conflict(e)) => {
                    CasConflict { partition: self.partition, error: &e }.emit(&self.shared.metrics);
                    self.forget_caches();
                    self.resync().await;
                    return RangeOutcome::Abandoned;
                }
                Err(BatchError::Record(e)) => {
                    warn!(%e, partition = self.partition, from = delta.from, to = delta.to, records = msgs.len(), "the sysdb refused a value of this batch; isolating the record");
                    self.forget_caches();
                    return RangeOutcome::Rejected(e.to_string());
                }
                Err(BatchError::Fenced) => {
                    warn!(
                        partition = self.partition,
                        from = delta.from,
                        to = delta.to,
                        "the partition was given up while this batch was in flight; dropping it uncommitted"
                    );
                    return RangeOutcome::Abandoned;
                }
                Err(BatchError::Bug(message)) => {
                    self.halt(format!("internal error in batch [{}, {}): {message}", delta.from, delta.to));
                    return RangeOutcome::Abandoned;
                }
                Err(BatchError::SchemaUnavailable(e)) => {
                    self.shared.health.set_waiting_for_schema(
                        self.partition,
                        Some(format!("batch [{}, {}): {e}", delta.from, delta.to)),
                    );
                    warn!(error = %e, partition = self.partition, from = delta.from, to = delta.to, "writer schema unavailable; the batch waits and retries");
                }
                Err(BatchError::Transient(e)) => {
                    self.shared.health.set_sysdb_unavailable(Some(e.to_string()));
                    SysdbRetry {
                        what: "sysdb unavailable; retrying the batch",
                        partition: Some(self.partition),
                        error: &e,
                    }
                    .emit(&self.shared.metrics);
                }
                Err(BatchError::Fatal(e)) => {
                    fatal_attempts += 1;
                    if fatal_attempts >= FATAL_ATTEMPTS {
                        self.halt(format!(
                            "the sysdb failed batch [{}, {}) {fatal_attempts} times: {e}",
                            delta.from, delta.to
                        ));
                        return RangeOutcome::Abandoned;
                    }
                    SysdbRetry { what: "batch commit failed; retrying", partition: Some(self.partition), error: &e }
                        .emit(&self.shared.metrics);
                }
            }
            retried = true;
            self.forget_caches();
            tokio::time::sleep(delays.next().unwrap_or(MAX_DELAY)).await;
        }
    }

    /// Decode, route and fold a batch: everything it will commit and emit, prepared with
    /// the sysdb read once (collections, functions, current records) and no side effect.
    async fn plan(&mut self, msgs: &[Msg], delta: PositionDelta) -> Result<Plan, BatchError> {
        let cfg = &self.shared.config;
        // Child spans of the batch, open while their part runs (debug level: disabled
        // unless traces are exported); decode includes fetching writer schemas.
        let decode_span = debug_span!("decode");
        // With a schema registry, every writer schema the batch names is fetched before
        // anything is decoded: the batch either has them all or waits (nothing skipped,
        // nothing to the DLQ because the registry was away).
        let schemas = match &self.shared.registry {
            None => None,
            Some(registry) => {
                let ids = crate::schema_registry::schema_ids(
                    msgs.iter().filter_map(|m| m.payload.as_deref()),
                    cfg.kafka.framing,
                );
                Some(registry.writer_schemas(&ids).await.map_err(|e| BatchError::SchemaUnavailable(e.to_string()))?)
            }
        };
        let mut decoded = batch::decode_all(msgs, cfg.kafka.framing, &cfg.limits, schemas.as_ref());
        if schemas.is_some() {
            if let Some((offset, Err(e))) =
                decoded.iter().find(|(_, r)| matches!(r, Err(e) if e.kind == kinds::SCHEMA_NOT_FETCHED))
            {
                return Err(BatchError::Bug(format!("record at offset {offset}: {}", e.message)));
            }
        }
        // A record a previous attempt sent to the DLQ (or the sysdb refused) stays there:
        // never both in the DLQ and applied.
        if !self.forced_dlq.is_empty() {
            for (offset, r) in decoded.iter_mut() {
                if let Some(entry) = self.forced_dlq.get(offset) {
                    *r = Err(entry.clone());
                }
            }
        }
        drop(decode_span);
        let _fold_span = debug_span!("fold");

        // Learn the collections this batch names that the worker has not seen: one read.
        let unseen: Vec<String> = decoded
            .iter()
            .filter_map(|(_, r)| r.as_ref().ok())
            .map(|r| r.collection_id.as_str())
            .filter(|name| !self.known.contains_key(*name))
            .collect::<BTreeSet<&str>>()
            .into_iter()
            .map(str::to_string)
            .collect();
        let mut rows = self.shared.sysdb.collections_named(unseen.clone()).await?;
        for name in unseen {
            let k = match rows.remove(&name) {
                Some(row) => Known::Registered(row),
                None => Known::Unknown,
            };
            self.known.insert(name, k);
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
        let mut applied = Vec::new();
        let mut failures = Vec::new();
        let now_ms = crate::sysdb::now_ms();
        // The functions attached to each collection, read once: the same list decides
        // which records are read whole (their preimages) and which deltas are computed.
        let mut attached_by: Vec<Vec<function_batches::Attached>> = Vec::with_capacity(routed.collections.len());
        // The current state of every record the batch names, in one read (whole records
        // only where the fold may need them: `batch::ids_to_read`).
        let mut wanted: Vec<(String, Vec<(String, bool)>)> = Vec::with_capacity(routed.collections.len());
        for (id, (row, records)) in &routed.collections {
            let markers = function_batches::markers(records);
            let named: Vec<&str> = markers.iter().map(|(_, b)| b.function_id.as_str()).collect();
            let attached = self.functions.get(&self.shared.sysdb, id, &named).await?.to_vec();
            // A function's deltas, and the preimages saved for it, need only the fields it
            // reads (`Function::reads`); a light read carries existence and metadata.
            let functions_read_values = attached.iter().any(|a| a.f.reads().values());
            wanted.push((
                id.clone(),
                batch::ids_to_read(records, row.as_ref().and_then(|r| r.dimension), functions_read_values),
            ));
            attached_by.push(attached);
        }
        report_unbuildable(&self.shared.sysdb, &self.shared.metrics, self.functions.take_unbuildable()).await?;
        let mut current_all = self.shared.sysdb.get_records_many(wanted).await?;
        let mut changes: Option<Vec<crate::sysdb::OutboxChange>> = cfg.changelog.enabled.then(Vec::new);
        for ((id, (row, records)), attached) in routed.collections.into_iter().zip(&attached_by) {
            let current = current_all.remove(&id).unwrap_or_default();
            let bug = |e: FoldError| BatchError::Bug(format!("fold of collection {id:?}: {e}"));
            // The change feed needs every change of the batch, as functions do.
            let folded = if attached.is_empty() && changes.is_none() {
                batch::fold_collection(&id, row.as_ref(), self.partition, records, current, &mut counts, &mut dlq)
                    .map_err(bug)?
            } else {
                let (folded, outcome) = batch::fold_collection_with_changes(
                    &id,
                    row.as_ref(),
                    self.partition,
                    &records,
                    &current,
                    &mut counts,
                    &mut dlq,
                )
                .map_err(bug)?;
                if let Some(changes) = changes.as_mut() {
                    batch::outbox_changes(&id, &outcome, changes);
                }
                let markers = function_batches::markers(&records);
                function_batches.extend(function_batches::function_batches(
                    attached,
                    &outcome,
                    &markers,
                    &mut failures,
                ));
                tasks.extend(function_batches::tasks(attached, &markers, &self.shared.topic, self.partition, now_ms));
                folded
            };
            if let Some(u) = folded.update {
                applied.push((id, folded.applied));
                updates.push(u);
            }
        }
        for f in &failures {
            crate::events::FunctionFailed { function: &f.function_id, kind: f.kind, during: "live", reason: &f.reason }
                .emit(&self.shared.metrics);
        }
        dlq.sort_by_key(|d| d.offset);
        let commit = batch::commit(&self.shared.topic, delta, updates, function_batches, changes);
        Ok(Plan { commit: Arc::new(commit), dlq, tasks, counts, applied })
    }

    /// Decode, fold and commit a batch with its position delta; on success the position,
    /// the caches and the counters follow.
    async fn process(&mut self, msgs: &[Msg], delta: PositionDelta) -> Result<(), BatchError> {
        self.wait_for_changelog_room().await?;
        let started = Instant::now();
        let plan = self.plan(msgs, delta).await?;
        let report = self.apply(msgs, &plan).await?;
        self.after_commit(msgs, &plan, &report, started);
        Ok(())
    }

    /// Back-pressure of the change feed (`docs/changes.md`): while the partition's
    /// unpublished changes hold `changelog.outbox_max_bytes` or more (the broker refuses
    /// the relay's transactions or is away), the partition pauses before its next batch,
    /// visibly (`/readyz`), and resumes once the relay publishes again. Nothing is
    /// dropped: the batch waits, and what arrives meanwhile stays in the consumer's
    /// bounded queues. A worker told to stop while paused gives the batch up uncommitted
    /// (the partition's next owner reads it again).
    async fn wait_for_changelog_room(&mut self) -> Result<(), BatchError> {
        let Some(relay) = self.shared.relay.clone() else { return Ok(()) };
        let bound = i64::try_from(self.shared.config.changelog.outbox_max_bytes).unwrap_or(i64::MAX);
        if relay.backlog_bytes(self.partition) < bound {
            return Ok(());
        }
        let mut told = false;
        loop {
            let held = relay.backlog_bytes(self.partition);
            if held < bound {
                break;
            }
            if !told {
                warn!(
                    partition = self.partition,
                    held, bound, "changelog outbox full: the partition pauses until the relay publishes"
                );
                told = true;
            }
            self.shared.health.set_changelog_full(
                self.partition,
                Some(format!("holds {held} bytes of unpublished changes (changelog.outbox_max_bytes = {bound})")),
            );
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = self.stop.cancelled() => break,
                _ = self.fence.cancelled() => break,
            }
        }
        self.shared.health.set_changelog_full(self.partition, None);
        if (self.stop.is_cancelled() || self.fence.is_cancelled()) && relay.backlog_bytes(self.partition) >= bound {
            return Err(BatchError::Fenced);
        }
        if told {
            info!(partition = self.partition, "changelog outbox below its bound: the partition resumes");
        }
        Ok(())
    }

    /// The side effects of a planned batch, in the order the guarantees need: DLQ entries,
    /// then backfill tasks (acknowledged before the commit: design.md invariant 7), then
    /// the sysdb transaction with its compare-and-set.
    async fn apply(&mut self, msgs: &[Msg], plan: &Plan) -> Result<CommitReport, BatchError> {
        self.produce_dlq(msgs, &plan.dlq).instrument(debug_span!("dlq", entries = plan.dlq.len() as i64)).await;
        self.produce_tasks(&plan.tasks).await;
        if !plan.tasks.is_empty() {
            failpoint::hit("after_backfill_task");
        }

        #[cfg(test)]
        let outage = match self.shared.hooks.clone() {
            Some(hooks) => {
                let d = plan.commit.delta;
                if hooks.mistake() == Some(crate::processor::seams::Mistake::GroupCommitFirst) {
                    self.shared.commander.send(crate::kafka::consumer::Command::Commit(vec![(self.partition, d.to)]));
                }
                hooks.before_commit(self.partition, d.from, d.to).await;
                hooks.outage(self.partition, d.from, d.to)
            }
            None => None,
        };
        #[cfg(test)]
        if outage == Some(crate::processor::seams::Outage::Refused) {
            return Err(BatchError::Transient(crate::sysdb::SysdbError::Unavailable {
                backend: self.shared.sysdb.backend(),
                message: "simulated outage: the sysdb did not answer".into(),
            }));
        }
        failpoint::hit("before_sysdb_commit");
        if self.fence.is_cancelled() {
            return Err(BatchError::Fenced);
        }
        let commit_started = Instant::now();
        let committed =
            self.shared.sysdb.commit_batch(Arc::clone(&plan.commit)).instrument(debug_span!("commit")).await;
        self.shared.metrics.observe_sysdb_commit(commit_started.elapsed());
        let report = committed?;
        #[cfg(test)]
        if let Some(hooks) = &self.shared.hooks {
            hooks.committed(self.partition, plan.commit.delta.from, plan.commit.delta.to);
            if outage == Some(crate::processor::seams::Outage::LandedUnknown) {
                return Err(BatchError::Transient(crate::sysdb::SysdbError::Unavailable {
                    backend: self.shared.sysdb.backend(),
                    message: "simulated outage: the connection dropped during COMMIT".into(),
                }));
            }
        }
        failpoint::hit("after_sysdb_commit");
        if !report.markers_accepted.is_empty() && failpoint::fail("marker_commit_outcome") {
            // As if the connection dropped during COMMIT: the batch landed, we do not know.
            return Err(BatchError::Transient(crate::sysdb::SysdbError::Unavailable {
                backend: self.shared.sysdb.backend(),
                message: "fail point: the outcome of the commit is unknown".into(),
            }));
        }
        Ok(report)
    }

    /// The commit is in: the position, caches and counters follow.
    fn after_commit(&mut self, msgs: &[Msg], plan: &Plan, report: &CommitReport, started: Instant) {
        self.after_commit_position(plan.commit.delta.to);
        if let Some(relay) = &self.shared.relay {
            relay.committed(self.partition, &plan.commit.changes, report.appended.clone());
        }
        for (function_id, offset) in &report.markers_accepted {
            info!(partition = self.partition, function = %function_id, marker_offset = offset, "backfill marker processed: function is backfilling");
        }
        if !report.markers_accepted.is_empty() {
            self.functions.clear();
        }
        let committed_ms = crate::sysdb::now_ms();

        for u in &plan.commit.collections {
            // The row as the commit left it, updated in place when the worker knows it.
            match self.known.get_mut(&u.id) {
                Some(Known::Registered(r)) => {
                    r.partition = u.partition;
                    r.dimension = u.dimension;
                    r.log_position = u.log_position;
                    r.record_count += u.record_count_delta;
                }
                _ => {
                    self.known.insert(
                        u.id.clone(),
                        Known::Registered(crate::sysdb::CollectionRow {
                            id: u.id.clone(),
                            partition: u.partition,
                            dimension: u.dimension,
                            log_position: u.log_position,
                            record_count: u.record_count_delta,
                        }),
                    );
                }
            }
        }
        let m = &self.shared.metrics;
        let counts = &plan.counts;
        for (op, n) in &counts.by_operation {
            m.records_processed(op, *n);
        }
        for (reason, n) in &counts.ignored {
            m.records_ignored(reason, *n);
        }
        for d in &plan.dlq {
            m.dlq_record(d.kind);
        }
        if m.per_collection() {
            for (id, n) in &plan.applied {
                m.collection_records(id, *n);
            }
        }
        m.control_records(metrics::CONTROL_BACKFILL_STARTED, report.markers_accepted.len() as u64);
        m.control_records(
            metrics::CONTROL_IGNORED,
            counts.controls.saturating_sub(report.markers_accepted.len() as u64),
        );
        m.batch_committed();
        // Every message of the batch (DLQ'd ones included) is done at this commit.
        m.observe_end_to_end(committed_ms, msgs.iter().map(|msg| msg.timestamp_ms));
        if let Some(ts) = msgs.iter().rev().find_map(|msg| msg.timestamp_ms) {
            m.partition_applied_timestamp(self.partition, ts);
        }
        debug!(
            records = msgs.len(),
            dlq = plan.dlq.len(),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "batch committed"
        );
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
            // The writer schema id of a record whose schema cannot be read.
            let schema_id = (d.kind == kinds::INCOMPATIBLE_SCHEMA)
                .then(|| crate::record::framing::unframe(self.shared.config.kafka.framing, payload).ok())
                .flatten()
                .and_then(|(id, _)| id)
                .map(|id| id.to_string());
            if let Some(id) = &schema_id {
                headers.push(("sluice.schema.id", id.as_bytes()));
            }
            let mut backoff = Duration::from_millis(100);
            loop {
                let out = Outgoing { topic: &self.shared.dlq_topic, partition: None, key, payload, headers: &headers };
                match self.shared.producer.send(out).await {
                    Ok(_) => break,
                    Err(crate::kafka::KafkaError::TooLarge { size, .. }) => {
                        // Retrying cannot help and must not stall the partition: the DLQ
                        // entry goes without the payload; its source headers point at the
                        // original record, which stays in the log topic.
                        warn!(
                            offset = d.offset,
                            size, "record too large for the DLQ; sending the entry without its payload"
                        );
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
}

/// Functions a worker could not build (their component cannot run here, and would not on
/// another try): marked failed, so that no replica keeps trying.
async fn report_unbuildable(
    sysdb: &crate::sysdb::Sysdb,
    metrics: &metrics::Metrics,
    failures: Vec<function_batches::NewFailure>,
) -> Result<(), BatchError> {
    for f in failures {
        if sysdb.mark_function_failed(&f.function_id, &f.reason).await? {
            crate::events::FunctionFailed { function: &f.function_id, kind: f.kind, during: "load", reason: &f.reason }
                .emit(metrics);
        }
    }
    Ok(())
}
