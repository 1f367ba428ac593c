//! What the processor talks to outside the sysdb, each behind one small type: the group
//! consumer (its events and commands, [`ConsumerLink`]), the producer of DLQ entries and
//! backfill tasks ([`Outbound`]), and the broker's watermarks and group offsets
//! ([`Metadata`]). In a replica each is the Kafka client; in the processor's
//! deterministic simulation (tests only) each is a simulated
//! broker, and the router, the workers, the batch planner and the commit path run
//! unchanged against it.
//!
//! The real path pays one `match` per produce or metadata read and nothing per consumed
//! message: messages still arrive as chunks on the consumer thread's channel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use crate::kafka::cluster::MetadataClient;
use crate::kafka::consumer::{Commander, ConsumerHandle, Event};
use crate::kafka::producer::{Delivered, Outgoing, Producer};
use crate::kafka::KafkaError;

/// The group consumer as the router sees it.
pub struct ConsumerLink {
    /// The consumer's events, in order (assignments, messages, revokes, ...).
    pub events: mpsc::Receiver<Event>,
    /// Where the router and the workers send commands (group commits, seeks, pauses).
    pub commander: Commander,
    /// The librdkafka consumer thread, joined when the router ends (`None`: a consumer
    /// played by the simulation, which sees the router's `Shutdown` command).
    pub handle: Option<ConsumerHandle>,
}

/// Where DLQ entries and backfill tasks are produced, acknowledged before the batch
/// commits.
pub enum Outbound {
    Kafka(Producer),
    #[cfg(test)]
    Simulated(Arc<dyn SimulatedBroker>),
}

impl Outbound {
    /// Produce one record and wait for its acknowledgement.
    pub async fn send(&self, out: Outgoing<'_>) -> Result<Delivered, KafkaError> {
        match self {
            Outbound::Kafka(p) => p.send(out).await,
            #[cfg(test)]
            Outbound::Simulated(b) => b.produce(out),
        }
    }
}

/// The broker's view of the log topic's partitions: watermarks and the group's offsets.
#[derive(Clone)]
pub enum Metadata {
    Kafka(Arc<Mutex<MetadataClient>>),
    #[cfg(test)]
    Simulated(Arc<dyn SimulatedBroker>),
}

impl Metadata {
    /// A partition's (log start, high watermark). The Kafka client blocks, so it runs off
    /// the async workers.
    pub async fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        match self {
            Metadata::Kafka(md) => {
                let md = md.clone();
                let topic = topic.to_string();
                tokio::task::spawn_blocking(move || {
                    md.lock().unwrap_or_else(|e| e.into_inner()).watermarks(&topic, partition)
                })
                .await
                .unwrap_or_else(|e| Err(blocking_failed("watermarks", e)))
            }
            #[cfg(test)]
            Metadata::Simulated(b) => Ok(b.watermarks(partition)),
        }
    }

    /// Per partition: its high watermark and the group's committed offset, if any.
    pub async fn broker_offsets(
        &self,
        topic: &str,
        partitions: Vec<i32>,
    ) -> Result<Vec<(i32, i64, Option<i64>)>, KafkaError> {
        match self {
            Metadata::Kafka(md) => {
                let md = md.clone();
                let topic = topic.to_string();
                tokio::task::spawn_blocking(move || {
                    let md = md.lock().unwrap_or_else(|e| e.into_inner());
                    let group: HashMap<i32, i64> = md.group_offsets(&topic, &partitions)?;
                    partitions.iter().map(|&p| Ok((p, md.watermarks(&topic, p)?.1, group.get(&p).copied()))).collect()
                })
                .await
                .unwrap_or_else(|e| Err(blocking_failed("watermarks and group offsets", e)))
            }
            #[cfg(test)]
            Metadata::Simulated(b) => {
                Ok(partitions.into_iter().map(|p| (p, b.watermarks(p).1, b.group_offset(p))).collect())
            }
        }
    }
}

fn blocking_failed(what: &str, e: tokio::task::JoinError) -> KafkaError {
    KafkaError::Broker { what: what.into(), message: format!("the blocking task reading it failed: {e}") }
}

/// The simulated broker behind [`Outbound::Simulated`] and [`Metadata::Simulated`].
#[cfg(test)]
pub trait SimulatedBroker: Send + Sync {
    /// Produce to the DLQ or the backfill topic (it may fail, as a broker does).
    fn produce(&self, out: Outgoing<'_>) -> Result<Delivered, KafkaError>;
    /// (log start, high watermark) of a partition of the log topic.
    fn watermarks(&self, partition: i32) -> (i64, i64);
    /// The group's committed offset of a partition of the log topic.
    fn group_offset(&self, partition: i32) -> Option<i64>;
}

/// A known mistake the simulation must catch, switched on in one simulated replica.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mistake {
    /// (a) Ask for the group commit before the sysdb commit.
    GroupCommitFirst,
    /// (b) Start an assigned partition at the group offset, not the sysdb position.
    StartFromGroupOffset,
    /// (c) Commit a batch without the compare-and-set on the position.
    SkipCompareAndSet,
    /// (d) Count the transaction marker a position report lands after as one more
    ///     record: the position-only commit goes one offset too far.
    MarkerCountedAsRecord,
    /// (e) Confirm a revoke before the revoked partitions' workers have stopped: their
    ///     last batch goes to the sysdb after the partition may have a new owner.
    ConfirmRevokeFirst,
}

/// What the simulation sees of a replica's commit path, and how it stalls it.
#[cfg(test)]
pub trait CommitHooks: Send + Sync {
    /// Awaited right before the sysdb commit of the batch `[from, to)`: a slow sysdb, or a
    /// replica frozen (its process stopped) until the simulation wakes it.
    fn before_commit(
        &self,
        partition: i32,
        from: i64,
        to: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;
    /// The sysdb accepted the batch `[from, to)`.
    fn committed(&self, partition: i32, from: i64, to: i64);
    /// The router confirms the revoke of `partitions` to the consumer (their workers are
    /// stopped): from here on this replica hands no batch of them to the sysdb.
    fn revoke_confirmed(&self, partitions: &[i32]);
    /// The mistake this replica makes, if any.
    fn mistake(&self) -> Option<Mistake>;
    /// A sysdb outage at this attempt to commit the batch `[from, to)`, if any.
    fn outage(&self, partition: i32, from: i64, to: i64) -> Option<Outage>;
}

/// A sysdb outage the simulation puts at a commit: both are `SysdbError::Unavailable`, a
/// transient error the worker retries the batch after.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outage {
    /// The sysdb did not answer: nothing was written.
    Refused,
    /// The connection dropped during COMMIT after the transaction landed: the worker does
    /// not know, and its retry must find the position already at the batch's end.
    LandedUnknown,
}
