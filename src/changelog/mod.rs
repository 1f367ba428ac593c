//! The change feed's relay (`docs/changes.md`): per owned partition, publishes the sysdb's
//! changelog outbox to `<prefix>.changes` with a transactional producer, exactly once for
//! read_committed consumers, in outbox sequence order.
//!
//! Protocol, per partition `p` (the processor starts a relay when `p` is assigned and
//! stops it when `p` is revoked):
//!
//! 1. Start a producer with `transactional.id = <prefix><p>` and `init_transactions`: a
//!    previous owner's producer is fenced and its open transaction aborted.
//! 2. Read the last progress committed on the progress topic for `p` (read_committed):
//!    the sequence number of the last change published. Start after the greater of it
//!    and the sysdb's copy (`published_seq`; a copy is only written after a commit, so
//!    it is never ahead of what Kafka holds unless the progress topic was lost).
//! 3. Loop: read the next outbox rows after it (bounded in records and bytes), publish
//!    them and then a progress message with the last one's sequence number in ONE Kafka
//!    transaction, commit; then copy the progress into the sysdb and delete published
//!    rows in bounded steps. An aborted transaction is published again; a fenced or
//!    failed producer is replaced (back to 1).
//!
//! So a change is in Kafka's committed log at most once (a transaction either holds a run
//! and its progress, or nothing), and at least once (progress only moves past a run in
//! the transaction that holds it).
//!
//! The partition's worker hands each committed batch's changes to the relay in memory
//! (`handoff.rs`), so a relay that keeps up publishes them without reading the outbox
//! back; it reads the outbox after a restart, when it fell behind, or where another
//! writer appended changes.
//!
//! While a snapshot of the partition's records is pending (the feed was first enabled
//! for a partition that held records, or `sluice changes snapshot` asked for one), the
//! loop also takes snapshot steps (`Sysdb::changelog_snapshot_step`): each appends the
//! next chunk of records, as they are now, to the outbox, which the loop then publishes
//! like any change. A step is taken only while less than one transaction's worth of
//! changes waits, so the snapshot neither fills the outbox nor starves live changes.

mod handoff;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::Config;
use crate::kafka::changelog::{read_progress, ChangeMessage, TxnError, TxnProducer};
use crate::kafka::ClientSettings;
use crate::metrics::Metrics;
use crate::record::change::change_key;
use crate::record::framing::{frame, Framing};
use crate::sysdb::{AppendedChanges, ChangelogEntry, OutboxChange, SnapshotStep, Sysdb};
use handoff::Handoff;

/// The subject the change record schema is registered under: `<changes topic>-value`.
pub fn change_subject(config: &Config) -> String {
    format!("{}-value", config.changes_topic())
}

/// What every partition's relay shares.
pub struct Relay {
    config: Config,
    sysdb: Arc<Sysdb>,
    metrics: Arc<Metrics>,
    settings: ClientSettings,
    topic: String,
    progress_topic: String,
    /// With a schema registry: the id of `schemas/change_record.avsc` (Confluent framing).
    schema_id: Option<u32>,
    /// Per partition, the bytes of its unpublished changes as last known: read from the
    /// sysdb by the relay (at start, after each commit, every second while idle) and
    /// raised by the partition's worker after each commit. The worker pauses the
    /// partition while it is at `changelog.outbox_max_bytes`.
    backlog: std::sync::Mutex<std::collections::HashMap<i32, i64>>,
    /// Committed changes handed over by the workers (`handoff.rs`).
    handoff: Handoff,
}

/// Why the relay cannot start at all.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error("changelog.transaction_timeout_ms = {wanted} exceeds the broker's transaction.max.timeout.ms = {max}: lower it (or raise the broker's)")]
    TransactionTimeout { wanted: u64, max: u64 },
    #[error("{topic} has {found:?} partitions, the log {log}: run `sluice init` with [changelog] enabled (it creates the changes topics, as many partitions as the log)")]
    Topic { topic: String, found: Option<i32>, log: i32 },
    #[error(transparent)]
    Kafka(#[from] crate::kafka::KafkaError),
    #[error("schema registry: {0}")]
    Registry(String),
    #[error("the topic check failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

impl Relay {
    /// Check the configuration against the broker (the changes topics exist with the
    /// log's partition count; `transaction.timeout.ms` against
    /// `transaction.max.timeout.ms`), register the change record schema when a registry
    /// is configured, and return what the partitions' relays share.
    pub async fn prepare(
        config: &Config,
        sysdb: Arc<Sysdb>,
        metrics: Arc<Metrics>,
        log_partitions: i32,
    ) -> Result<Arc<Relay>, RelayError> {
        let settings = config.client_settings();
        // The changes of log partition p go to partition p of both topics.
        let (s, topics) = (settings.clone(), [config.changes_topic(), config.changes_progress_topic()]);
        let found = tokio::task::spawn_blocking(move || {
            let md = crate::kafka::cluster::MetadataClient::new(&s, None)?;
            topics.map(|t| md.topic_partitions(&t).map(|n| (t, n))).into_iter().collect::<Result<Vec<_>, _>>()
        })
        .await??;
        for (topic, n) in found {
            if n != Some(log_partitions) {
                return Err(RelayError::Topic { topic, found: n, log: log_partitions });
            }
        }
        let wanted = config.changelog.transaction_timeout_ms;
        if let Some(max) = crate::kafka::changelog::broker_max_transaction_timeout_ms(&settings).await? {
            if wanted > max {
                return Err(RelayError::TransactionTimeout { wanted, max });
            }
        }
        let schema_id = match crate::schema_registry::SchemaRegistry::from_config(&config.schema_registry)
            .map_err(|e| RelayError::Registry(e.to_string()))?
        {
            None => None,
            Some(registry) => {
                let subject = change_subject(config);
                let schema = crate::record::change::CHANGE_RECORD_SCHEMA_JSON;
                let id = crate::schema_registry::retrying(5, || registry.register(&subject, schema))
                    .await
                    .map_err(|e| RelayError::Registry(e.to_string()))?;
                info!(subject = %subject, schema_id = id, "change record schema registered");
                Some(id)
            }
        };
        Ok(Arc::new(Relay {
            config: config.clone(),
            sysdb,
            metrics,
            settings,
            topic: config.changes_topic(),
            progress_topic: config.changes_progress_topic(),
            schema_id,
            backlog: std::sync::Mutex::default(),
            handoff: Handoff::new(config.changelog.handoff_max_bytes as usize),
        }))
    }

    /// Bytes of `partition`'s unpublished changes, as last known (0 before the relay
    /// read them).
    pub fn backlog_bytes(&self, partition: i32) -> i64 {
        self.backlog.lock().unwrap_or_else(|p| p.into_inner()).get(&partition).copied().unwrap_or(0)
    }

    /// A batch of `partition` committed changes of `bytes` bytes.
    pub fn add_backlog(&self, partition: i32, bytes: i64) {
        *self.backlog.lock().unwrap_or_else(|p| p.into_inner()).entry(partition).or_default() += bytes;
    }

    /// A batch of `partition` committed: its changes (`changes`, then its outputs' in
    /// `appended`) count in the backlog and are handed to the relay.
    pub fn committed(&self, partition: i32, changes: &[OutboxChange], appended: Option<AppendedChanges>) {
        let Some(appended) = appended else {
            self.add_backlog(partition, changes.iter().map(OutboxChange::bytes).sum::<usize>() as i64);
            return;
        };
        let sizes: Vec<usize> = changes.iter().chain(&appended.outputs).map(OutboxChange::bytes).collect();
        self.add_backlog(partition, sizes.iter().sum::<usize>() as i64);
        // Only the newest changes that fit the handoff's bound are copied (a batch larger
        // than it would have its oldest dropped right away); the relay reads the others
        // from the outbox.
        let skip = self.handoff.dropped_at_once(&sizes);
        let kept = changes
            .iter()
            .skip(skip)
            .cloned()
            .chain(appended.outputs.into_iter().skip(skip.saturating_sub(changes.len())));
        self.handoff.committed(partition, appended.first_seq + skip as i64, kept, crate::sysdb::now_ms());
    }

    /// Read `partition`'s unpublished bytes from the sysdb.
    async fn refresh_backlog(&self, partition: i32) {
        match self.sysdb.changelog_unpublished_bytes(partition).await {
            Ok(b) => {
                self.backlog.lock().unwrap_or_else(|p| p.into_inner()).insert(partition, b);
            }
            Err(e) => debug!(partition, error = %e, "changelog relay: cannot read the outbox's size"),
        }
    }

    /// Publish `partition`'s changes until `stop` is cancelled.
    pub async fn run(self: Arc<Self>, partition: i32, stop: CancellationToken) {
        // Known before a producer exists: with the broker away the bound still holds.
        self.refresh_backlog(partition).await;
        let mut delays = crate::retry::default_backoff();
        while !stop.is_cancelled() {
            match self.run_producer(partition, &stop).await {
                Ok(()) => break,
                Err(e) => {
                    warn!(partition, error = %e, "changelog relay: producer stopped; starting a new one");
                    let wait = delays.next().unwrap_or(Duration::from_secs(5));
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.cancelled() => break,
                    }
                }
            }
        }
        self.handoff.forget(partition);
    }

    /// One producer's life: init (fencing the previous one), recover the progress, then
    /// publish until stopped (`Ok`) or until the producer fails (`Err`).
    async fn run_producer(&self, partition: i32, stop: &CancellationToken) -> Result<(), String> {
        let cfg = &self.config.changelog;
        let txid = self.config.changelog_transactional_id(partition);
        let (settings, timeout, compression) =
            (self.settings.clone(), cfg.transaction_timeout_ms, cfg.compression.clone());
        let id = txid.clone();
        let producer = tokio::task::spawn_blocking(move || TxnProducer::start(&settings, &id, timeout, &compression))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let producer = Arc::new(producer);
        let result = self.publish(partition, &txid, &producer, stop).await;
        // Closing a producer can wait on the broker: off the async threads.
        tokio::task::spawn_blocking(move || drop(producer));
        result
    }

    /// Recover the progress, then publish until stopped (`Ok`) or until the producer
    /// fails (`Err`).
    async fn publish(
        &self,
        partition: i32,
        txid: &str,
        producer: &Arc<TxnProducer>,
        stop: &CancellationToken,
    ) -> Result<(), String> {
        let (settings, topic) = (self.settings.clone(), self.progress_topic.clone());
        let kafka_progress =
            tokio::task::spawn_blocking(move || read_progress(&settings, &topic, partition, Duration::from_secs(60)))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?;
        let position = self
            .sysdb
            .changelog_positions()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .find(|p| p.partition == partition);
        let stored = position.as_ref().map_or(-1, |p| p.published_seq);
        let next_seq = position.as_ref().map_or(0, |p| p.next_seq);
        if let Some(k) = kafka_progress.filter(|k| *k >= next_seq) {
            // The topic says more was published than this sysdb ever numbered: it was
            // written from another sysdb (a new one, or another deployment on the same
            // prefix), or this one was restored from an older backup (then the re-applied
            // changes take the same numbers and skipping them is right).
            warn!(
                partition,
                kafka_progress = k,
                next_seq,
                topic = %self.topic,
                "changelog relay: the changes topic's progress is ahead of this sysdb's outbox; the changes numbered up to it will not be published. If this sysdb is not a restore of the one that wrote the topic, give the feed a topic of its own (changelog.topic_suffix) or delete the topic and its progress topic"
            );
        }
        let last = kafka_progress.unwrap_or(-1).max(stored);
        if kafka_progress.is_some_and(|k| k > stored) {
            // The previous owner committed to Kafka and stopped before telling the sysdb.
            self.sysdb.changelog_mark_published(partition, last).await.map_err(|e| e.to_string())?;
        }
        info!(partition, transactional_id = %txid, kafka_progress = ?kafka_progress, sysdb_progress = stored, from_seq = last + 1, "changelog relay started");
        // The sysdb's bookkeeping after each Kafka commit (the copy of the progress, the
        // deletion of published rows, the outbox's size) runs beside the publishing, not
        // between its transactions: on SQLite each is a write behind the batch commits,
        // and done in line they took two thirds of every turn. Marks coalesce: the
        // housekeeper writes the latest progress when it gets to it.
        let (progress, published) = tokio::sync::watch::channel(last);
        let publishing = async move {
            let result = self.publish_loop(partition, producer, stop, last, &progress).await;
            // Dropping the sender tells the housekeeper to take its last round.
            drop(progress);
            result
        };
        let (result, ()) = tokio::join!(publishing, self.housekeep(partition, published, last, stop));
        result
    }

    /// Keep the sysdb's copy of the progress, the outbox's published rows and the
    /// backlog's size up with what the relay published (from `marked`, the progress the
    /// sysdb holds already); when the relay stops, one last mark and trim step.
    async fn housekeep(
        &self,
        partition: i32,
        mut published: tokio::sync::watch::Receiver<i64>,
        marked: i64,
        stop: &CancellationToken,
    ) {
        let mut settled = marked;
        let mut trimmed_through = -1i64;
        loop {
            let last_round = tokio::select! {
                changed = published.changed() => changed.is_err(),
                _ = tokio::time::sleep(Duration::from_secs(1)) => false,
            };
            let seq = *published.borrow_and_update();
            if seq > settled {
                match self.sysdb.changelog_mark_published(partition, seq).await {
                    Ok(()) => settled = seq,
                    // Only a copy: the next mark (or the next owner) writes it.
                    Err(e) => warn!(partition, error = %e, "changelog relay: cannot record the progress in the sysdb"),
                }
            }
            // Published rows go once their mark is written (the mark counts their bytes),
            // in bounded steps (each its own short write; one when the relay stops).
            let steps = if last_round || stop.is_cancelled() { 1 } else { 16 };
            for _ in 0..steps {
                if trimmed_through >= settled {
                    break;
                }
                trimmed_through = self.trim(partition, settled).await;
            }
            if last_round {
                return;
            }
            self.refresh_backlog(partition).await;
        }
    }

    /// Publish from `last + 1` on until stopped (`Ok`) or until the producer fails
    /// (`Err`), telling `progress` the progress of every committed transaction.
    async fn publish_loop(
        &self,
        partition: i32,
        producer: &Arc<TxnProducer>,
        stop: &CancellationToken,
        mut last: i64,
        progress: &tokio::sync::watch::Sender<i64>,
    ) -> Result<(), String> {
        let cfg = &self.config.changelog;
        let poll = Duration::from_millis(cfg.poll_interval_ms.max(1));
        let mut snapshot = SnapshotState::default();
        loop {
            if stop.is_cancelled() {
                return Ok(());
            }
            let turn = std::time::Instant::now();
            self.drive_snapshot(partition, &mut snapshot).await;
            let (max_records, max_bytes) = (cfg.max_records_per_transaction, cfg.max_bytes_per_transaction);
            let handed = self.handoff.take(partition, last, max_records, max_bytes);
            let from_memory = handed.is_some();
            let read = match handed {
                Some(rows) => Ok(rows),
                None => self.sysdb.changelog_pending(partition, last, max_records, max_bytes).await,
            };
            let rows = match read {
                Ok(rows) => rows,
                Err(e) => {
                    warn!(partition, error = %e, "changelog relay: cannot read the outbox; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(500)) => continue,
                        _ = stop.cancelled() => return Ok(()),
                    }
                }
            };
            if rows.is_empty() {
                tokio::select! {
                    _ = tokio::time::sleep(poll) => continue,
                    _ = stop.cancelled() => return Ok(()),
                }
            }
            if rows[0].seq != last + 1 && last >= 0 {
                warn!(
                    partition,
                    expected = last + 1,
                    found = rows[0].seq,
                    "changelog relay: outbox sequence has a hole"
                );
            }
            let through = rows.last().map_or(last, |r| r.seq);
            let read_ms = turn.elapsed().as_secs_f64() * 1e3;
            let batch = self.messages(&rows);
            let (p, topic, progress_topic) = (producer.clone(), self.topic.clone(), self.progress_topic.clone());
            let published = tokio::task::spawn_blocking(move || {
                let headers: Vec<Vec<(&str, &[u8])>> =
                    batch.iter().map(|m| m.headers.iter().map(|(k, v)| (*k, v.as_slice())).collect()).collect();
                let msgs: Vec<ChangeMessage<'_>> = batch
                    .iter()
                    .zip(&headers)
                    .map(|(m, h)| ChangeMessage { key: &m.key, value: m.value.as_deref(), headers: h })
                    .collect();
                p.publish(&topic, &progress_topic, partition, &msgs, through)
            })
            .await
            .map_err(|e| e.to_string())?;
            match published {
                Ok(times) => {
                    last = through;
                    crate::failpoint::hit("after_changelog_kafka_commit");
                    // Out of the backlog now; the housekeeper's next read of the outbox's
                    // size settles it.
                    self.add_backlog(partition, -(rows.iter().map(|r| r.change.bytes()).sum::<usize>() as i64));
                    progress.send_replace(last);
                    let ms = |d: Duration| d.as_secs_f64() * 1e3;
                    debug!(
                        partition,
                        from = rows[0].seq,
                        through,
                        changes = rows.len(),
                        from_memory,
                        read_ms,
                        send_ms = ms(times.send),
                        commit_ms = ms(times.commit),
                        turn_ms = ms(turn.elapsed()),
                        "changelog transaction committed"
                    );
                }
                Err(TxnError::Aborted(m)) => {
                    warn!(partition, error = %m, "changelog transaction aborted; publishing the run again");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e @ TxnError::Fenced(_)) => {
                    info!(partition, error = %e, "changelog relay fenced by a newer owner of the partition");
                    return Err(e.to_string());
                }
                Err(e @ TxnError::Fatal(_)) => return Err(e.to_string()),
            }
        }
    }

    /// While a snapshot of `partition` is pending, take its next step when less than one
    /// transaction's worth of changes waits (the loop publishes what it appended). Whether
    /// one is pending is read at start and then every second, so a snapshot that
    /// `sluice changes snapshot` asks for starts within a second.
    async fn drive_snapshot(&self, partition: i32, s: &mut SnapshotState) {
        if s.checked.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            s.checked = Some(std::time::Instant::now());
            match self.sysdb.changelog_snapshot_pending(partition).await {
                Ok(true) if s.started.is_none() => {
                    info!(
                        partition,
                        "changelog snapshot started: the partition's records are published as they are now"
                    );
                    s.started = Some(std::time::Instant::now());
                }
                Ok(_) => {}
                Err(e) => debug!(partition, error = %e, "changelog relay: cannot read whether a snapshot is pending"),
            }
        }
        let cfg = &self.config.changelog;
        if s.started.is_none() || self.backlog_bytes(partition) >= cfg.max_bytes_per_transaction as i64 {
            return;
        }
        match self
            .sysdb
            .changelog_snapshot_step(partition, cfg.max_records_per_transaction, cfg.max_bytes_per_transaction)
            .await
        {
            Ok(SnapshotStep::Idle) => s.started = None,
            Ok(SnapshotStep::Appended { records, bytes, cursor, finished, total }) => {
                self.add_backlog(partition, bytes);
                self.metrics.changelog_snapshot_records(partition, records as u64);
                debug!(partition, records, cursor = ?cursor, "changelog snapshot step appended");
                if finished {
                    let elapsed_ms = s.started.take().map_or(0, |t| t.elapsed().as_millis() as u64);
                    info!(partition, records = total, elapsed_ms, "changelog snapshot finished");
                }
            }
            Err(e) => warn!(partition, error = %e, "changelog snapshot step failed; taking it again"),
        }
    }

    /// Delete published rows through `seq`, one bounded step per call; returns how far
    /// the outbox is known trimmed.
    async fn trim(&self, partition: i32, seq: i64) -> i64 {
        let step = self.config.changelog.delete_step_rows;
        match self.sysdb.changelog_trim(partition, seq, step).await {
            Ok(n) if n < step => seq,
            Ok(_) => -1, // more to delete: the next idle turn takes another step
            Err(e) => {
                warn!(partition, error = %e, "changelog relay: cannot delete published outbox rows");
                -1
            }
        }
    }

    /// The Kafka messages of outbox rows: key, framed value (or none), headers.
    fn messages(&self, rows: &[ChangelogEntry]) -> Vec<OwnedMessage> {
        rows.iter()
            .map(|r| {
                let c = &r.change;
                let value = c.value.as_ref().map(|v| match self.schema_id {
                    Some(id) => frame(Framing::Confluent, id, v),
                    None => v.clone(),
                });
                OwnedMessage {
                    key: change_key(&c.collection_id, &c.record_id),
                    value,
                    headers: vec![
                        ("sluice.source.partition", r.partition.to_string().into_bytes()),
                        ("sluice.source.offset", c.source_offset.to_string().into_bytes()),
                        ("sluice.operation", c.op.as_str().as_bytes().to_vec()),
                        ("sluice.collection", c.collection_id.clone().into_bytes()),
                        ("sluice.changelog.seq", r.seq.to_string().into_bytes()),
                        ("sluice.version", env!("CARGO_PKG_VERSION").as_bytes().to_vec()),
                    ],
                }
            })
            .collect()
    }
}

/// A relay's view of its partition's snapshot.
#[derive(Default)]
struct SnapshotState {
    /// When the relay last read whether a snapshot is pending.
    checked: Option<std::time::Instant>,
    /// Since when this relay drives a pending snapshot (`None`: none pending).
    started: Option<std::time::Instant>,
}

/// A change message that owns its bytes (it crosses to the blocking pool).
struct OwnedMessage {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    headers: Vec<(&'static str, Vec<u8>)>,
}
