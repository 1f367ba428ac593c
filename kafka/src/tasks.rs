//! A plain consumer of the backfill topic. Tasks are idempotent requests — the worker
//! acts only on what the sysdb says is pending — so this consumer uses the group's own
//! offsets (auto commit after delivery) and needs none of the processor's machinery.

use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::{ClientSettings, KafkaError};

/// Handle of the task consumer thread.
pub struct TaskConsumer {
    stop: CancellationToken,
    thread: Option<JoinHandle<()>>,
}

impl TaskConsumer {
    /// Subscribe to `topic` in `group` and forward every message value.
    pub fn start(
        settings: &ClientSettings,
        group: &str,
        topic: &str,
    ) -> Result<(TaskConsumer, mpsc::Receiver<Vec<u8>>), KafkaError> {
        let mut c = settings.client_config();
        c.set("group.id", group)
            .set("enable.auto.commit", "true")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false");
        let consumer: BaseConsumer = c.create().map_err(|e| KafkaError::Config(e.to_string()))?;
        consumer.subscribe(&[topic]).map_err(|e| super::broker_err(format!("subscribe to {topic}"), e))?;
        let (tx, rx) = mpsc::channel(1024);
        let stop = CancellationToken::new();
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("sluice-tasks".into())
            .spawn(move || {
                while !flag.is_cancelled() {
                    match consumer.poll(Duration::from_millis(200)) {
                        Some(Ok(m)) => {
                            if let Some(p) = m.payload() {
                                if tx.blocking_send(p.to_vec()).is_err() {
                                    break;
                                }
                            }
                        }
                        Some(Err(e)) => warn!(%e, "backfill task consumer error"),
                        None => {}
                    }
                }
                drop(consumer);
            })
            .map_err(|e| KafkaError::Config(format!("cannot spawn the task consumer thread: {e}")))?;
        Ok((TaskConsumer { stop, thread: Some(thread) }, rx))
    }

    /// Stop polling and leave the group (bounded wait, off the async runtime).
    pub fn shutdown(mut self, timeout: Duration) {
        self.stop.cancel();
        if let Some(t) = self.thread.take() {
            if !super::join_within(t, timeout) {
                warn!("backfill task consumer did not stop within {timeout:?}; leaving it behind");
            }
        }
    }
}
