//! The change feed's Kafka side (`docs/changes.md`): a transactional producer per source
//! partition, whose every transaction carries a run of changes and, last, the relay's
//! progress (the outbox sequence number of its last change) on the progress topic; the
//! progress read back after a restart; the broker's bound on transaction timeouts.
//!
//! Every call here blocks (librdkafka's transactional API waits for the coordinator):
//! callers run them on the blocking pool.

use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError as RdError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer as _, ThreadedProducer};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::{broker_err, ClientSettings, KafkaError};

/// One change message of a transaction.
#[derive(Debug, Clone, Copy)]
pub struct ChangeMessage<'a> {
    pub key: &'a [u8],
    /// `None`: a tombstone (the record was deleted).
    pub value: Option<&'a [u8]>,
    pub headers: &'a [(&'a str, &'a [u8])],
}

/// Why a transaction did not commit, by what the caller does next.
#[derive(Debug, thiserror::Error)]
pub enum TxnError {
    /// Another producer with the same `transactional.id` took over (a new owner of the
    /// partition): this producer is unusable; stop publishing (a new owner publishes).
    #[error("fenced by a newer producer of the same transactional.id: {0}")]
    Fenced(String),
    /// The transaction was aborted (nothing of it is visible to read_committed readers):
    /// publish the same run again, with the same producer.
    #[error("transaction aborted: {0}")]
    Aborted(String),
    /// The producer is unusable for another reason (a fatal error): create a new one,
    /// which first completes or aborts whatever this one left open.
    #[error("transactional producer failed: {0}")]
    Fatal(String),
}

/// Where a committed transaction's time went.
#[derive(Debug, Clone, Copy)]
pub struct PublishTimes {
    /// Beginning it and handing every message to the producer (which waits only when the
    /// producer's queue is full).
    pub send: Duration,
    /// `commit_transaction`: every message acknowledged by the broker (measured: nearly
    /// all of it), then the transaction's end written by its coordinator.
    pub commit: Duration,
}

/// A transactional producer for one source partition's changes.
pub struct TxnProducer {
    inner: ThreadedProducer<DefaultProducerContext>,
    timeout: Duration,
}

fn classify(e: &RdError) -> (bool, bool, bool) {
    // (fenced, retriable, requires abort)
    let code = e.rdkafka_error_code();
    // `Fenced` is librdkafka's local code once the broker said ProducerFenced.
    let fenced = matches!(
        code,
        Some(RDKafkaErrorCode::ProducerFenced | RDKafkaErrorCode::InvalidProducerEpoch | RDKafkaErrorCode::Fenced)
    );
    match e {
        RdError::Transaction(t) => (fenced, t.is_retriable(), t.txn_requires_abort()),
        _ => (fenced, false, false),
    }
}

fn is_fatal(e: &RdError) -> bool {
    matches!(e, RdError::Transaction(t) if t.is_fatal())
}

impl TxnProducer {
    /// Create the producer and run `init_transactions`: any transaction a previous
    /// producer with this `transactional_id` left open is aborted (and that producer is
    /// fenced) before this returns. `transaction_timeout_ms` must not exceed the broker's
    /// `transaction.max.timeout.ms` ([`broker_max_transaction_timeout_ms`]).
    pub fn start(
        settings: &ClientSettings,
        transactional_id: &str,
        transaction_timeout_ms: u64,
        compression: &str,
    ) -> Result<TxnProducer, KafkaError> {
        let mut c = settings.client_config();
        c.set("transactional.id", transactional_id);
        c.set("transaction.timeout.ms", transaction_timeout_ms.to_string());
        c.set("enable.idempotence", "true");
        c.set("acks", "all");
        c.set("linger.ms", "5");
        c.set("compression.type", compression);
        // The transaction's commit reports every failure of its messages: a report per
        // delivered message would only be polled and dropped (a profile of a replica
        // with the feed on had ~5% of its CPU in the producers' polling threads).
        c.set("delivery.report.only.error", "true");
        let inner: ThreadedProducer<DefaultProducerContext> =
            c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
        let timeout = settings.timeout().max(Duration::from_secs(30));
        inner
            .init_transactions(timeout)
            .map_err(|e| broker_err(format!("init_transactions of {transactional_id}"), e))?;
        Ok(TxnProducer { inner, timeout })
    }

    /// One transaction: every change to `topic`/`partition`, in order, then the progress
    /// message (`progress` on `progress_topic`/`partition`, key = the partition number),
    /// then commit. A commit that timed out or failed retriably is committed again (the
    /// transaction is still open; committing twice is what librdkafka asks for). An
    /// abortable error aborts the transaction: nothing of it is visible.
    pub fn publish(
        &self,
        topic: &str,
        progress_topic: &str,
        partition: i32,
        changes: &[ChangeMessage<'_>],
        progress: i64,
    ) -> Result<PublishTimes, TxnError> {
        let began = Instant::now();
        self.inner.begin_transaction().map_err(|e| self.failed("begin_transaction", e))?;
        for m in changes {
            let mut headers = OwnedHeaders::new_with_capacity(m.headers.len());
            for (k, v) in m.headers {
                headers = headers.insert(Header { key: k, value: Some(*v) });
            }
            let mut rec: BaseRecord<'_, [u8], [u8]> =
                BaseRecord::to(topic).partition(partition).key(m.key).headers(headers);
            if let Some(v) = m.value {
                rec = rec.payload(v);
            }
            self.send(rec)?;
        }
        let key = partition.to_string();
        let value = progress.to_string();
        self.send(BaseRecord::to(progress_topic).partition(partition).key(key.as_bytes()).payload(value.as_bytes()))?;
        let sent = began.elapsed();
        sluice_base::failpoint::hit("before_changelog_kafka_commit");
        let committing = Instant::now();
        let deadline = committing + self.timeout * 4;
        loop {
            match self.inner.commit_transaction(self.timeout) {
                Ok(()) => return Ok(PublishTimes { send: sent, commit: committing.elapsed() }),
                Err(e) => {
                    let (fenced, retriable, abort) = classify(&e);
                    if fenced || is_fatal(&e) {
                        return Err(self.failed("commit_transaction", e));
                    }
                    if abort {
                        let _ = self.inner.abort_transaction(self.timeout);
                        return Err(TxnError::Aborted(format!("commit_transaction: {e}")));
                    }
                    let timed_out = e.rdkafka_error_code() == Some(RDKafkaErrorCode::OperationTimedOut);
                    if (retriable || timed_out) && Instant::now() < deadline {
                        tracing::warn!(error = %e, partition, "changelog commit did not complete; committing again");
                        continue;
                    }
                    return Err(TxnError::Fatal(format!("commit_transaction: {e}")));
                }
            }
        }
    }

    fn send(&self, mut rec: BaseRecord<'_, [u8], [u8]>) -> Result<(), TxnError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match self.inner.send(rec) {
                Ok(()) => return Ok(()),
                Err((RdError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) if Instant::now() < deadline => {
                    rec = r;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err((e, _)) => {
                    // The run cannot be published whole: abort what was sent of it.
                    let failed = self.failed("send", e);
                    if let TxnError::Fatal(m) = failed {
                        return match self.inner.abort_transaction(self.timeout) {
                            Ok(()) => Err(TxnError::Aborted(m)),
                            Err(_) => Err(TxnError::Fatal(m)),
                        };
                    }
                    return Err(failed);
                }
            }
        }
    }

    /// Classify a failed call; an error that needs the transaction aborted is reported as
    /// [`TxnError::Aborted`] after the caller aborts it.
    fn failed(&self, what: &str, e: RdError) -> TxnError {
        let (fenced, _, abort) = classify(&e);
        if fenced {
            TxnError::Fenced(format!("{what}: {e}"))
        } else if is_fatal(&e) {
            TxnError::Fatal(format!("{what}: {e}"))
        } else if abort {
            let _ = self.inner.abort_transaction(self.timeout);
            TxnError::Aborted(format!("{what}: {e}"))
        } else {
            // Not abortable, not fatal: treat the transaction as failed; a new producer
            // (whose init aborts it) starts clean.
            TxnError::Fatal(format!("{what}: {e}"))
        }
    }
}

/// The last progress the relay of `partition` committed on `progress_topic` (the outbox
/// sequence number of its last published change), read with `read_committed`: `None` when
/// it never committed one. Call after [`TxnProducer::start`] for that partition, so that
/// no transaction of its `transactional.id` is still open.
pub fn read_progress(
    settings: &ClientSettings,
    progress_topic: &str,
    partition: i32,
    timeout: Duration,
) -> Result<Option<i64>, KafkaError> {
    let mut c = settings.client_config();
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("isolation.level", "read_committed");
    c.set("group.id", format!("sluice-changelog-progress-{}", uuid::Uuid::new_v4()));
    let consumer: BaseConsumer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let what = || format!("progress of partition {partition} on {progress_topic}");
    let (low, high) =
        consumer.fetch_watermarks(progress_topic, partition, settings.timeout()).map_err(|e| broker_err(what(), e))?;
    // Each transaction adds its progress message and a commit (or abort) marker: the last
    // progress is near the end. Read a window back from the high watermark, wider each
    // time nothing committed was found in it.
    let mut window = 64i64;
    let deadline = Instant::now() + timeout;
    let mut end = high;
    loop {
        let start = (end - window).max(low);
        if start >= end {
            return Ok(None);
        }
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(progress_topic, partition, Offset::Offset(start))
            .map_err(|e| broker_err(what(), e))?;
        consumer.assign(&tpl).map_err(|e| broker_err(what(), e))?;
        let mut last: Option<i64> = None;
        let mut next = start;
        while next < end {
            if Instant::now() > deadline {
                return Err(broker_err(what(), format!("read to {next} of [{start}, {end}) in {timeout:?}")));
            }
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    next = m.offset() + 1;
                    if m.offset() >= end {
                        break;
                    }
                    let value =
                        m.payload().and_then(|p| std::str::from_utf8(p).ok()).and_then(|s| s.parse::<i64>().ok());
                    match value {
                        Some(v) => last = Some(last.map_or(v, |l| l.max(v))),
                        None => {
                            return Err(broker_err(what(), format!("offset {} holds no progress value", m.offset())))
                        }
                    }
                }
                Some(Err(e)) => return Err(broker_err(what(), e)),
                None => {
                    // Markers and aborted records are skipped: the position moves past them.
                    if let Ok(positions) = consumer.position() {
                        for e in positions.elements() {
                            if let Offset::Offset(o) = e.offset() {
                                next = next.max(o);
                            }
                        }
                    }
                }
            }
        }
        if last.is_some() || start == low {
            return Ok(last);
        }
        end = start;
        window *= 4;
    }
}

/// The broker's `transaction.max.timeout.ms` (of the first broker in the metadata): a
/// producer asking for a longer `transaction.timeout.ms` fails at `init_transactions`
/// with InvalidTransactionTimeout. `None` if the broker does not say.
pub async fn broker_max_transaction_timeout_ms(settings: &ClientSettings) -> Result<Option<u64>, KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        settings.client_config().create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let broker = {
        let md =
            admin.inner().fetch_metadata(None, settings.timeout()).map_err(|e| broker_err("metadata (brokers)", e))?;
        md.brokers().first().map(|b| b.id()).ok_or_else(|| broker_err("metadata (brokers)", "no broker"))?
    };
    let opts = AdminOptions::new().request_timeout(Some(settings.timeout()));
    let results = admin
        .describe_configs([&ResourceSpecifier::Broker(broker)], &opts)
        .await
        .map_err(|e| broker_err("describe broker configs", e))?;
    for r in results {
        let r = r.map_err(|code| broker_err("describe broker configs", code))?;
        if let Some(v) = r.get("transaction.max.timeout.ms").and_then(|e| e.value.as_deref()) {
            return Ok(v.parse().ok());
        }
    }
    Ok(None)
}
