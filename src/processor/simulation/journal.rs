//! The commits the sysdb accepted, as the workers report them, and the invariants checked on them.

use super::*;

#[derive(Default)]
pub(super) struct JournalState {
    /// Per partition, where the last accepted commit ended.
    pub(super) last_to: HashMap<i32, i64>,
    /// Replicas the coordinator expelled while they were frozen (zombies once woken).
    pub(super) expelled: BTreeSet<usize>,
    /// (replica, partition) whose revoke the replica confirmed, until it is assigned the
    /// partition again: no batch of it may go to the sysdb from that replica.
    pub(super) revoked: BTreeSet<(usize, i32)>,
    pub(super) violations: Vec<(&'static str, String)>,
    pub(super) commits: u64,
    pub(super) zombie_batches: u64,
    pub(super) zombie_commits: u64,
    /// Sysdb outages put at commits: (nothing written, landed with the outcome unknown).
    pub(super) outages: (u64, u64),
}

#[derive(Default)]
pub(super) struct Journal(Mutex<JournalState>);

impl Journal {
    pub(super) fn state(&self) -> std::sync::MutexGuard<'_, JournalState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One replica's hooks: a sysdb latency per batch, the freeze, the journal of commits.
pub(super) struct Hooks {
    pub(super) replica: usize,
    pub(super) seed: u64,
    pub(super) mistake: Option<Mistake>,
    pub(super) frozen: watch::Sender<bool>,
    pub(super) journal: Arc<Journal>,
    /// The batches whose commit this replica attempted: an outage meets a batch's first
    /// attempt only, so its retry goes through.
    pub(super) attempted: Mutex<BTreeSet<(i32, i64, i64)>>,
}

impl CommitHooks for Hooks {
    fn before_commit(
        &self,
        partition: i32,
        from: i64,
        to: i64,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        let h = mix(&[self.seed, 2, partition as u64, from as u64, to as u64]);
        // A quarter of the batches meet a slow sysdb (up to 40 ms).
        let delay = if h.is_multiple_of(4) { Duration::from_millis(h / 4 % 40) } else { Duration::ZERO };
        let mut frozen = self.frozen.subscribe();
        let (journal, replica) = (self.journal.clone(), self.replica);
        Box::pin(async move {
            if !delay.is_zero() {
                tokio::time::sleep(delay).await;
            }
            let _ = frozen.wait_for(|f| !*f).await;
            let mut st = journal.state();
            if st.expelled.contains(&replica) {
                st.zombie_batches += 1;
            }
            // What follows this hook is the sysdb commit, with no await before it.
            if st.revoked.contains(&(replica, partition)) {
                st.violations.push((
                    "no batch goes to the sysdb after its partition's revoke is confirmed",
                    format!(
                        "r{replica} handed partition {partition} [{from}, {to}) to the sysdb after confirming the revoke of the partition"
                    ),
                ));
            }
        })
    }

    fn committed(&self, partition: i32, from: i64, to: i64) {
        let mut st = self.journal.state();
        st.commits += 1;
        if st.expelled.contains(&self.replica) {
            // Allowed only in sequence: the partition's new owner has not committed yet.
            st.zombie_commits += 1;
        }
        if let Some(&last) = st.last_to.get(&partition) {
            if from != last {
                let (what, who) = if st.expelled.contains(&self.replica) {
                    ("a zombie's batch committed", "zombie")
                } else {
                    ("a batch committed out of sequence", "replica")
                };
                st.violations.push((
                    what,
                    format!(
                        "{who} r{} committed partition {partition} [{from}, {to}) after the position had reached {last}",
                        self.replica
                    ),
                ));
            }
        }
        st.last_to.insert(partition, to);
    }

    fn revoke_confirmed(&self, partitions: &[i32]) {
        let mut st = self.journal.state();
        for &p in partitions {
            st.revoked.insert((self.replica, p));
        }
    }

    fn mistake(&self) -> Option<Mistake> {
        self.mistake
    }

    fn outage(&self, partition: i32, from: i64, to: i64) -> Option<Outage> {
        if !self.attempted.lock().unwrap_or_else(|e| e.into_inner()).insert((partition, from, to)) {
            return None;
        }
        // One batch in 16 meets an outage at its first attempt: half before anything was
        // written, half after the transaction landed.
        let h = mix(&[self.seed, 6, self.replica as u64, partition as u64, from as u64, to as u64]);
        let outage = match h % 32 {
            0 => Outage::Refused,
            1 => Outage::LandedUnknown,
            _ => return None,
        };
        let mut st = self.journal.state();
        match outage {
            Outage::Refused => st.outages.0 += 1,
            Outage::LandedUnknown => st.outages.1 += 1,
        }
        Some(outage)
    }
}
