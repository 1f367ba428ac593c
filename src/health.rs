//! Liveness and readiness of a replica, as the processor reports it.
//!
//! `/healthz` only needs the process to answer. `/readyz` needs a *ready* replica: its
//! consumer is running (not starting, not shutting down), it has completed a partition
//! assignment (possibly empty) whose positions were loaded from the sysdb, and none of its
//! assigned partitions is halted. Later rebalances do not flip readiness (a cooperative
//! revoke is not always followed by an assignment callback); a halted partition does, until
//! it is revoked or resumed, and so does a partition whose batch waits for a writer schema
//! the schema registry cannot serve (it is named with the registry's error), and a
//! partition paused because its changelog outbox is full (`docs/changes.md`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Default)]
struct State {
    consuming: bool,
    assigned: bool,
    stopping: Option<String>,
    /// Halted partitions and why.
    halted: BTreeMap<i32, String>,
    /// Set while sysdb calls fail with a retryable error: the last such error.
    sysdb_unavailable: Option<String>,
    /// Partitions whose next batch waits for writer schemas the registry cannot serve.
    waiting_for_schema: BTreeMap<i32, String>,
    /// Partitions paused because their changelog outbox is full (`docs/changes.md`).
    changelog_full: BTreeMap<i32, String>,
}

/// Shared between the processor (writer) and the HTTP server (reader).
#[derive(Debug, Default)]
pub struct Health {
    state: Mutex<State>,
}

impl Health {
    pub fn new() -> Arc<Health> {
        Arc::new(Health::default())
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The group consumer is created and polling.
    pub fn consumer_started(&self) {
        self.lock().consuming = true;
    }

    /// An assignment (possibly empty) took effect, its positions read from the sysdb.
    pub fn assignment_completed(&self) {
        self.lock().assigned = true;
    }

    /// Shutdown or a fatal error: not ready any more, for good.
    pub fn stopping(&self, reason: impl Into<String>) {
        let mut s = self.lock();
        s.consuming = false;
        if s.stopping.is_none() {
            s.stopping = Some(reason.into());
        }
    }

    /// A partition halted (`Some(reason)`) or running again (`None`).
    pub fn set_halted(&self, partition: i32, reason: Option<String>) {
        let mut s = self.lock();
        match reason {
            Some(r) => {
                s.halted.insert(partition, r);
            }
            None => {
                s.halted.remove(&partition);
            }
        }
    }

    /// A sysdb call failed with a retryable error (`Some`) or succeeded (`None`).
    pub fn set_sysdb_unavailable(&self, error: Option<String>) {
        let mut s = self.lock();
        if s.sysdb_unavailable.is_some() != error.is_some() || error.is_some() {
            s.sysdb_unavailable = error;
        }
    }

    /// A partition's batch waits for writer schemas the registry cannot serve (`Some`:
    /// what it waits for) or no longer does (`None`).
    pub fn set_waiting_for_schema(&self, partition: i32, waiting: Option<String>) {
        let mut s = self.lock();
        match waiting {
            Some(w) => {
                s.waiting_for_schema.insert(partition, w);
            }
            None => {
                s.waiting_for_schema.remove(&partition);
            }
        }
    }

    /// A partition paused because its changelog outbox reached its bound (`Some`: how
    /// full), or resumed (`None`).
    pub fn set_changelog_full(&self, partition: i32, full: Option<String>) {
        let mut s = self.lock();
        match full {
            Some(w) => {
                s.changelog_full.insert(partition, w);
            }
            None => {
                s.changelog_full.remove(&partition);
            }
        }
    }

    /// Revoked partitions are no longer this replica's concern.
    pub fn partitions_revoked(&self, partitions: &[i32]) {
        let mut s = self.lock();
        for p in partitions {
            s.halted.remove(p);
            s.waiting_for_schema.remove(p);
            s.changelog_full.remove(p);
        }
    }

    /// `Ok` when ready, else why not (for the operator: the `/readyz` body).
    pub fn readiness(&self) -> Result<(), String> {
        let s = self.lock();
        if let Some(why) = &s.stopping {
            return Err(format!("stopping: {why}"));
        }
        if !s.consuming {
            return Err("starting: the group consumer is not running yet".into());
        }
        if !s.assigned {
            return Err(
                "starting: waiting for the first partition assignment (positions are loaded from the sysdb)".into()
            );
        }
        if let Some(e) = &s.sysdb_unavailable {
            return Err(format!("sysdb unavailable (retrying with backoff): {e}"));
        }
        if !s.waiting_for_schema.is_empty() {
            let each: Vec<String> = s
                .waiting_for_schema
                .iter()
                .map(|(p, why)| format!("partition {p} waits for the schema registry: {why}"))
                .collect();
            return Err(format!(
                "{} (the partition resumes by itself when the registry answers; check the registry's URL and health)",
                each.join("; ")
            ));
        }
        if !s.changelog_full.is_empty() {
            let each: Vec<String> = s
                .changelog_full
                .iter()
                .map(|(p, why)| format!("partition {p} paused: its changelog outbox {why}"))
                .collect();
            return Err(format!(
                "{} (nothing is dropped; it resumes once the relay publishes to the changes topic again: check the broker)",
                each.join("; ")
            ));
        }
        if !s.halted.is_empty() {
            let each: Vec<String> = s.halted.iter().map(|(p, why)| format!("partition {p} halted: {why}")).collect();
            return Err(format!("{}; see `sluice offsets show` and `sluice offsets reset`", each.join("; ")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_after_an_assignment_and_without_halted_partitions() {
        let h = Health::new();
        assert!(h.readiness().unwrap_err().contains("not running"));
        h.consumer_started();
        assert!(h.readiness().unwrap_err().contains("first partition assignment"));
        h.assignment_completed();
        assert_eq!(h.readiness(), Ok(()));
        h.set_halted(2, Some("the sysdb refuses the batch".into()));
        let why = h.readiness().unwrap_err();
        assert!(why.contains("partition 2 halted: the sysdb refuses the batch"), "{why}");
        h.partitions_revoked(&[2]);
        assert_eq!(h.readiness(), Ok(()));
        h.set_halted(1, Some("gap".into()));
        h.set_halted(1, None);
        assert_eq!(h.readiness(), Ok(()));
        h.set_sysdb_unavailable(Some("connection refused".into()));
        assert!(h.readiness().unwrap_err().contains("sysdb unavailable"));
        h.set_sysdb_unavailable(None);
        assert_eq!(h.readiness(), Ok(()));
        h.set_waiting_for_schema(3, Some("batch [10, 20): schema id 7: connection refused".into()));
        let why = h.readiness().unwrap_err();
        assert!(why.contains("partition 3 waits for the schema registry: batch [10, 20)"), "{why}");
        h.set_waiting_for_schema(3, None);
        assert_eq!(h.readiness(), Ok(()));
        h.set_waiting_for_schema(4, Some("x".into()));
        h.partitions_revoked(&[4]);
        assert_eq!(h.readiness(), Ok(()));
        h.set_changelog_full(5, Some("holds 3000 bytes".into()));
        let why = h.readiness().unwrap_err();
        assert!(why.contains("partition 5 paused: its changelog outbox holds 3000 bytes"), "{why}");
        h.set_changelog_full(5, None);
        assert_eq!(h.readiness(), Ok(()));
        h.set_changelog_full(6, Some("x".into()));
        h.partitions_revoked(&[6]);
        assert_eq!(h.readiness(), Ok(()));
        h.stopping("shutdown requested");
        h.stopping("later reasons do not replace the first");
        assert_eq!(h.readiness(), Err("stopping: shutdown requested".into()));
    }
}
