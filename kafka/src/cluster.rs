//! Topic administration and read-only offset queries (watermarks, group offsets), on
//! clients that are not members of the processor's consumer group.

use std::collections::HashMap;
use std::time::Duration;

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use super::{broker_err, ClientSettings, KafkaError};

/// Outcome of creating one topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TopicOutcome {
    Created,
    AlreadyExists { partitions: i32 },
}

/// Create `topic` with `partitions` and `replication` unless it exists (idempotent).
/// `configs` are topic-level settings such as `retention.ms`.
pub async fn ensure_topic(
    settings: &ClientSettings,
    topic: &str,
    partitions: i32,
    replication: i32,
    configs: &[(&str, &str)],
) -> Result<TopicOutcome, KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        settings.client_config().create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let mut new = NewTopic::new(topic, partitions, TopicReplication::Fixed(replication));
    for (k, v) in configs {
        new = new.set(k, v);
    }
    let opts = AdminOptions::new().operation_timeout(Some(settings.timeout()));
    let results =
        admin.create_topics([&new], &opts).await.map_err(|e| broker_err(format!("create topic {topic}"), e))?;
    match results.into_iter().next() {
        Some(Ok(_)) => Ok(TopicOutcome::Created),
        Some(Err((_, RDKafkaErrorCode::TopicAlreadyExists))) => {
            let partitions = partition_count(settings, topic)?;
            Ok(TopicOutcome::AlreadyExists { partitions })
        }
        Some(Err((t, code))) => Err(broker_err(format!("create topic {t}"), code)),
        None => Err(broker_err(format!("create topic {topic}"), "no result from the broker")),
    }
}

/// Delete topics (tests and tooling).
pub async fn delete_topics(settings: &ClientSettings, topics: &[&str]) -> Result<(), KafkaError> {
    let admin: AdminClient<DefaultClientContext> =
        settings.client_config().create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let opts = AdminOptions::new().operation_timeout(Some(settings.timeout()));
    admin.delete_topics(topics, &opts).await.map_err(|e| broker_err("delete topics", e))?;
    Ok(())
}

/// A blocking metadata client (no group membership). Call from a blocking context.
pub struct MetadataClient {
    consumer: BaseConsumer,
    timeout: Duration,
}

impl MetadataClient {
    /// `group` is only used to read or write that group's committed offsets.
    pub fn new(settings: &ClientSettings, group: Option<&str>) -> Result<Self, KafkaError> {
        let mut c = settings.client_config();
        c.set("enable.auto.commit", "false");
        c.set("enable.auto.offset.store", "false");
        if let Some(g) = group {
            c.set("group.id", g);
        }
        let consumer: BaseConsumer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
        Ok(MetadataClient { consumer, timeout: settings.timeout() })
    }

    pub fn partition_count(&self, topic: &str) -> Result<i32, KafkaError> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| broker_err(format!("metadata of {topic}"), e))?;
        let t = md.topics().iter().find(|t| t.name() == topic);
        match t {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(t.partitions().len() as i32),
            _ => Err(broker_err(format!("metadata of {topic}"), "topic does not exist; run `sluice init`")),
        }
    }

    /// Partition count of a topic, `None` when the broker says it does not exist (an
    /// unreachable broker is an error).
    pub fn topic_partitions(&self, topic: &str) -> Result<Option<i32>, KafkaError> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), self.timeout)
            .map_err(|e| broker_err(format!("metadata of {topic}"), e))?;
        match md.topics().iter().find(|t| t.name() == topic) {
            Some(t) if t.error().is_none() && !t.partitions().is_empty() => Ok(Some(t.partitions().len() as i32)),
            Some(t) => match t.error() {
                None => Ok(None),
                Some(e) if RDKafkaErrorCode::from(e) == RDKafkaErrorCode::UnknownTopicOrPartition => Ok(None),
                Some(e) => Err(broker_err(format!("metadata of {topic}"), RDKafkaErrorCode::from(e))),
            },
            None => Ok(None),
        }
    }

    /// The cluster's id (KRaft's `cluster.id`), which read tokens fingerprint.
    pub fn cluster_id(&self) -> Result<String, KafkaError> {
        self.consumer
            .client()
            .fetch_cluster_id(self.timeout)
            .ok_or_else(|| broker_err("cluster id", "no answer within the request timeout"))
    }

    /// `(low, high)` watermarks of a partition. This client is never polled, so its view
    /// of partition leaders is refreshed only on request: after a leader moved (a broker
    /// died) the query fails with "unknown partition" until the metadata is read again,
    /// which a failure here does before the caller's retry.
    pub fn watermarks(&self, topic: &str, partition: i32) -> Result<(i64, i64), KafkaError> {
        self.consumer.fetch_watermarks(topic, partition, self.timeout).map_err(|e| {
            let _ = self.consumer.fetch_metadata(Some(topic), self.timeout);
            broker_err(format!("watermarks of {topic}/{partition}"), e)
        })
    }

    /// Committed group offsets (next to read) of the given partitions; absent = none.
    ///
    /// A coordinator that is moving or loading is asked again (`while_coordinator_moves`).
    pub fn group_offsets(&self, topic: &str, partitions: &[i32]) -> Result<HashMap<i32, i64>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition(topic, *p);
        }
        let tpl = self
            .while_coordinator_moves(|| self.consumer.committed_offsets(tpl.clone(), self.timeout))
            .map_err(|e| broker_err(format!("committed offsets of {topic}"), e))?;
        Ok(tpl
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect())
    }

    /// The first offset whose timestamp is at or after `timestamp_ms` in each partition
    /// (the broker's ListOffsets by time); `None` when no record is that recent (the
    /// caller takes the high watermark).
    pub fn offsets_for_time(
        &self,
        topic: &str,
        partitions: &[i32],
        timestamp_ms: i64,
    ) -> Result<HashMap<i32, Option<i64>>, KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for p in partitions {
            tpl.add_partition_offset(topic, *p, Offset::Offset(timestamp_ms))
                .map_err(|e| broker_err("build offsets", e))?;
        }
        let tpl = self
            .consumer
            .offsets_for_times(tpl, self.timeout)
            .map_err(|e| broker_err(format!("offsets of {topic} by time"), e))?;
        let mut out = HashMap::new();
        for e in tpl.elements() {
            if let Err(err) = e.error() {
                return Err(broker_err(format!("offset of {topic}/{} by time", e.partition()), err));
            }
            out.insert(
                e.partition(),
                match e.offset() {
                    Offset::Offset(o) if o >= 0 => Some(o),
                    _ => None,
                },
            );
        }
        Ok(out)
    }

    /// The state and members of a consumer group (`Empty`/`Dead` with no members when
    /// nobody consumes; a group that never existed reads the same).
    pub fn describe_group(&self, group: &str) -> Result<GroupDescription, KafkaError> {
        let list = self
            .consumer
            .fetch_group_list(Some(group), self.timeout)
            .map_err(|e| broker_err(format!("describe group {group}"), e))?;
        let Some(g) = list.groups().iter().find(|g| g.name() == group) else {
            return Ok(GroupDescription { state: "Dead".into(), members: Vec::new() });
        };
        Ok(GroupDescription {
            state: g.state().to_string(),
            members: g
                .members()
                .iter()
                .map(|m| GroupMember {
                    id: m.id().to_string(),
                    client_id: m.client_id().to_string(),
                    host: m.client_host().to_string(),
                })
                .collect(),
        })
    }

    /// Commit offsets for the configured group from outside the group (`offsets reconcile`).
    /// The broker refuses this while the group has active members.
    pub fn commit_group_offsets(&self, topic: &str, offsets: &[(i32, i64)]) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        for (p, o) in offsets {
            tpl.add_partition_offset(topic, *p, Offset::Offset(*o)).map_err(|e| broker_err("build offsets", e))?;
        }
        self.while_coordinator_moves(|| self.consumer.commit(&tpl, CommitMode::Sync)).map_err(|e| {
            broker_err(format!("commit group offsets of {topic} (is the group empty? stop the replicas first)"), e)
        })
    }

    /// Run `request` to the group coordinator, asking again (with the retry policy's
    /// backoff, for up to the request timeout) while it answers that it is moving or
    /// loading the offsets topic: `NOT_COORDINATOR`, `COORDINATOR_LOAD_IN_PROGRESS`,
    /// `COORDINATOR_NOT_AVAILABLE`, all retriable in Kafka.
    fn while_coordinator_moves<T>(
        &self,
        mut request: impl FnMut() -> Result<T, rdkafka::error::KafkaError>,
    ) -> Result<T, rdkafka::error::KafkaError> {
        let deadline = std::time::Instant::now() + self.timeout;
        let mut delays = sluice_base::retry::backoff(Duration::from_millis(100), Duration::from_secs(1));
        loop {
            match request() {
                Err(e) if coordinator_moving(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(delays.next().unwrap_or(Duration::from_secs(1)));
                }
                outcome => return outcome,
            }
        }
    }
}

/// A consumer group as the broker describes it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupDescription {
    /// `Stable`, `PreparingRebalance`, `CompletingRebalance`, `Empty` or `Dead`.
    pub state: String,
    pub members: Vec<GroupMember>,
}

/// One active member of a consumer group.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GroupMember {
    pub id: String,
    pub client_id: String,
    pub host: String,
}

/// Partition count of a topic (blocking).
pub fn partition_count(settings: &ClientSettings, topic: &str) -> Result<i32, KafkaError> {
    MetadataClient::new(settings, None)?.partition_count(topic)
}

/// The offset and producer timestamp of the first committed record at or after `offset`
/// in a partition, read with a consumer of its own (not a group member); `None` when
/// there is no such record within `wait` (the offset is the end of the log). The
/// timestamp is `None` when the record has none.
pub fn timestamp_at(
    settings: &ClientSettings,
    topic: &str,
    partition: i32,
    offset: i64,
    wait: Duration,
) -> Result<Option<(i64, Option<i64>)>, KafkaError> {
    use rdkafka::Message;
    let mut c = settings.client_config();
    c.set("enable.auto.commit", "false");
    c.set("enable.auto.offset.store", "false");
    c.set("isolation.level", "read_committed");
    // librdkafka wants a group id even for an assigned consumer; nothing joins or commits
    // it (the offset is explicit), so the broker never sees this group.
    c.set("group.id", "sluice-timestamp-reader");
    let consumer: BaseConsumer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(offset)).map_err(|e| broker_err("build offsets", e))?;
    consumer.assign(&tpl).map_err(|e| broker_err(format!("read {topic}/{partition} at {offset}"), e))?;
    let deadline = std::time::Instant::now() + wait;
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        match consumer.poll(left.min(Duration::from_millis(200))) {
            Some(Ok(m)) if m.partition() == partition => return Ok(Some((m.offset(), m.timestamp().to_millis()))),
            Some(Ok(_)) | None => {}
            Some(Err(e)) => return Err(broker_err(format!("read {topic}/{partition} at {offset}"), e)),
        }
    }
    Ok(None)
}

/// The group coordinator is moving or loading: a retriable answer (`while_coordinator_moves`).
fn coordinator_moving(e: &rdkafka::error::KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::NotCoordinator
                | RDKafkaErrorCode::CoordinatorLoadInProgress
                | RDKafkaErrorCode::CoordinatorNotAvailable
        )
    )
}
