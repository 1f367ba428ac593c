//! Processor counters. A plain registry of labelled counters for now; the metrics
//! module exports them (issue: operations/metrics).

use std::collections::BTreeMap;
use std::sync::Mutex;

/// Labelled counters: `(name, label)` → value.
#[derive(Debug, Default)]
pub struct Counters {
    inner: Mutex<BTreeMap<(&'static str, String), u64>>,
}

impl Counters {
    pub fn add(&self, name: &'static str, label: &str, n: u64) {
        if n == 0 {
            return;
        }
        let mut m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        *m.entry((name, label.to_string())).or_default() += n;
    }

    pub fn get(&self, name: &'static str, label: &str) -> u64 {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        m.get(&(name, label.to_string())).copied().unwrap_or(0)
    }

    pub fn snapshot(&self) -> BTreeMap<(&'static str, String), u64> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

pub const RECORDS: &str = "records_processed";
pub const IGNORED: &str = "records_ignored";
pub const DLQ: &str = "dlq_records";
pub const CONTROL: &str = "control_records";
pub const CAS_CONFLICTS: &str = "sysdb_cas_conflicts";
pub const GAPS: &str = "gaps";
pub const GROUP_AHEAD: &str = "group_offset_ahead_of_sysdb";
pub const BATCHES: &str = "batches";
pub const SYSDB_RETRIES: &str = "sysdb_retries";
