//! The positions a replica knows without asking: what its own workers just committed, and
//! what the one shared poll of the sysdb last read for the other partitions. Readers that
//! wait for a read token watch this board instead of polling the sysdb each.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::sysdb::Sysdb;

/// Positions and halts of the log topic's partitions, as last seen.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    /// Partition -> the sysdb's next offset.
    pub positions: HashMap<i32, i64>,
    /// Partition -> why it is halted.
    pub halted: HashMap<i32, String>,
}

/// The board: one per replica, shared by the processor (which raises positions as it
/// commits) and the HTTP API's readers (which wait on it).
#[derive(Debug)]
pub struct Board {
    seen: watch::Sender<Seen>,
    poll_wanted: Notify,
}

impl Board {
    pub fn new() -> Arc<Board> {
        Arc::new(Board { seen: watch::Sender::new(Seen::default()), poll_wanted: Notify::new() })
    }

    /// A worker of this replica committed partition `partition` up to `next` (after the
    /// commit returned, so a read that starts now sees it).
    pub fn committed(&self, partition: i32, next: i64) {
        self.seen.send_if_modified(|s| {
            let e = s.positions.entry(partition).or_insert(i64::MIN);
            let moved = *e < next;
            *e = (*e).max(next);
            moved
        });
    }

    /// What the sysdb said replaces what was seen: an operator reset may have moved a
    /// position back. A poll that read before one of this replica's commits landed only
    /// lowers a position until the next commit or poll: a waiter waits a little longer,
    /// never answers early.
    fn polled(&self, positions: HashMap<i32, i64>, halted: HashMap<i32, String>) {
        let next = Seen { positions, halted };
        self.seen.send_if_modified(|s| {
            let changed = *s != next;
            *s = next;
            changed
        });
    }

    pub fn subscribe(&self) -> watch::Receiver<Seen> {
        self.seen.subscribe()
    }

    /// Ask the shared poller for a fresh read of the sysdb; many waiters asking at once
    /// cost one read.
    pub fn want_poll(&self) {
        self.poll_wanted.notify_one();
    }

    /// The shared poller: reads the positions and halts once per request, at most once
    /// per `interval`, until `stop`.
    pub fn spawn_poller(
        self: &Arc<Self>,
        sysdb: Arc<Sysdb>,
        topic: String,
        interval: Duration,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let board = self.clone();
        tokio::spawn(async move {
            let mut failing = false;
            loop {
                tokio::select! {
                    _ = board.poll_wanted.notified() => {}
                    _ = stop.cancelled() => return,
                }
                match sysdb.partition_states(&topic).await {
                    Ok(states) => {
                        failing = false;
                        let positions = states.iter().map(|s| (s.partition, s.next_offset)).collect();
                        let halted =
                            states.into_iter().filter_map(|s| s.halted_reason.map(|r| (s.partition, r))).collect();
                        board.polled(positions, halted);
                    }
                    Err(e) if !failing => {
                        warn!(error = %e, "readers waiting for a token: cannot read the positions; retrying");
                        failing = true;
                    }
                    Err(_) => {}
                }
                tokio::select! {
                    _ = tokio::time::sleep(interval) => {}
                    _ = stop.cancelled() => return,
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commits_only_raise_and_a_poll_replaces() {
        let b = Board::new();
        let rx = b.subscribe();
        b.committed(0, 10);
        b.committed(0, 5);
        assert_eq!(rx.borrow().positions[&0], 10, "a commit never moves the board back");
        b.polled(HashMap::from([(0, 2), (1, 3)]), HashMap::from([(1, "gap".to_string())]));
        assert_eq!(rx.borrow().positions, HashMap::from([(0, 2), (1, 3)]), "an operator reset back is seen");
        assert_eq!(rx.borrow().halted[&1], "gap");
        b.committed(0, 12);
        assert_eq!(rx.borrow().positions[&0], 12);
    }
}
