//! The simulated broker: the log topic, the DLQ, group offsets and retention.

use super::*;

pub(super) enum Entry {
    /// A record delivered to read_committed consumers; `record` is `None` for poison.
    Data { key: Bytes, payload: Bytes, record: Option<Box<LogRecord>> },
    /// A transaction's commit or abort marker: takes an offset, never delivered.
    Marker,
    /// A record of an aborted transaction: takes an offset, never delivered.
    Aborted,
}

#[derive(Default)]
pub(super) struct PartitionLog {
    pub(super) entries: Vec<Entry>,
    pub(super) log_start: i64,
}

impl PartitionLog {
    pub(super) fn high(&self) -> i64 {
        self.entries.len() as i64
    }
}

#[derive(Default)]
pub(super) struct BrokerState {
    pub(super) logs: Vec<PartitionLog>,
    pub(super) group: HashMap<i32, i64>,
    /// (source partition, source offset, kind) of every DLQ entry produced.
    pub(super) dlq: Vec<(i32, i64, String)>,
    /// DLQ produce attempts per source record.
    pub(super) attempts: HashMap<(i32, i64), u64>,
}

pub(super) struct Broker {
    pub(super) seed: u64,
    pub(super) state: Mutex<BrokerState>,
}

impl Broker {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, BrokerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

pub(super) fn header<'a>(out: &Outgoing<'a>, name: &str) -> Option<&'a [u8]> {
    out.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

pub(super) fn header_i64(out: &Outgoing<'_>, name: &str) -> i64 {
    header(out, name).and_then(|v| std::str::from_utf8(v).ok()).and_then(|v| v.parse().ok()).unwrap_or(-1)
}

impl SimulatedBroker for Broker {
    fn produce(&self, out: Outgoing<'_>) -> Result<Delivered, KafkaError> {
        let partition = header_i64(&out, "sluice.source.partition") as i32;
        let offset = header_i64(&out, "sluice.source.offset");
        let kind = header(&out, "sluice.error.kind").map(|k| String::from_utf8_lossy(k).into_owned());
        let mut st = self.state();
        let attempt = st.attempts.entry((partition, offset)).or_insert(0);
        *attempt += 1;
        // One produce in five fails (the worker retries until it is acknowledged).
        if mix(&[self.seed, 1, partition as u64, offset as u64, *attempt]).is_multiple_of(5) {
            return Err(KafkaError::Delivery {
                topic: out.topic.into(),
                message: "simulated broker: timed out".into(),
            });
        }
        st.dlq.push((partition, offset, kind.unwrap_or_default()));
        Ok(Delivered { partition: 0, offset: st.dlq.len() as i64 - 1 })
    }

    fn watermarks(&self, partition: i32) -> (i64, i64) {
        let st = self.state();
        st.logs.get(partition as usize).map_or((0, 0), |l| (l.log_start, l.high()))
    }

    fn group_offset(&self, partition: i32) -> Option<i64> {
        self.state().group.get(&partition).copied()
    }
}
