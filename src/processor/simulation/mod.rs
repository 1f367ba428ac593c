//! The position protocol under deterministic simulation (tests only).
//!
//! One seed names a whole world: a simulated broker (a log topic of a few partitions
//! whose records are adds, updates, upserts and deletes of a few ids, transaction markers
//! and aborted transactions, poison records; a DLQ; group offsets; retention moving the
//! log start), a group coordinator (eager or cooperative rebalances, a session timeout),
//! and a few replicas. Each replica is the REAL processor: the router
//! ([`super::route`]), its partition workers, the batch planner and the commit path,
//! against one REAL SQLite sysdb in a temporary file that every replica shares, as
//! replicas on one machine do. Only the consumer thread, the producer and the metadata
//! client are played by the simulation, through the seams of `processor/seams.rs`.
//!
//! What happens to the world is drawn from the seed up front ([`Schedule`]): records
//! produced, replicas killed (a crash drops everything not committed to the sysdb) and
//! restarted, replicas frozen (a stopped process: its batch in flight waits before the
//! sysdb commit) and woken, after the session timeout, as zombies whose partitions went to
//! others meanwhile, quiet points where the world must catch up, retention. Per-batch
//! chance (sysdb latency, a sysdb outage at a commit — nothing written, or the commit
//! landed with its outcome unknown — a failed group commit, a failed DLQ produce, chunk
//! sizes) is a
//! hash of the seed and of what it applies to, so it does not depend on how many other
//! draws happened before.
//!
//! Invariants, checked while the world runs (`docs/design.md` section 8):
//! - the group offset is never ahead of the sysdb position (invariant 3): checked right
//!   after the simulated broker applies a group commit;
//! - a sysdb position never moves back, and each commit starts where the previous one
//!   on its partition ended: no batch skipped or applied twice, and a zombie's batch never
//!   commits once the partition moved on (invariant 2);
//! - at each quiet point every partition's position reaches its high watermark (lag 0,
//!   invariant 13, transaction markers included) and the stored records equal the
//!   reference model's fold of the log up to that position (invariant 5; section 9,
//!   exactly once), poison records are in the DLQ (invariant 10).
//!
//! Determinism: time is tokio's paused clock on a current-thread runtime, and the
//! schedule and every chance come from the seed. The real code's own sources of chance are
//! pinned down: the sysdb's blocking calls run inline on the runtime's thread
//! (`sysdb::sqlite::inline`: which calls overlap in a group commit and when each finishes
//! is then the simulation's, not the blocking pool's), the processor keeps its partitions
//! in ordered maps (its workers are fed and stopped in partition order), and the branch
//! an unbiased `select!` polls first comes from the runtime's generator, seeded from the
//! world's seed (tokio's `rng_seed`, an unstable API: `.cargo/config.toml` turns it on),
//! as does the retry policy's jitter (fastrand's per-thread generator).
//! The wall clock decides nothing: messages carry no producer timestamp, so a batch
//! lingers the configured time (`partition::linger_for` reads the clock only to age a
//! timestamp), and the sysdb's `now_ms` columns are data. So a seed replays bit for bit:
//! the same timed log, every line, which a test checks on a few hundred seeds. The trace
//! (what [`run`] returns for comparison) keeps what the seed decides and what a correct
//! protocol makes certain: the schedule's events, the coordinator's assignments, and at
//! each quiet point the positions, the records' digest and the DLQ's offsets.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::mpsc as std_mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::partition::Shared;
use super::seams::{CommitHooks, ConsumerLink, Metadata, Mistake, Outage, Outbound, SimulatedBroker};
use super::ProcessorError;
use crate::config::Config;
use crate::kafka::consumer::{Command, Commander, Event, StartDecision};
use crate::kafka::producer::{Delivered, Outgoing};
use crate::kafka::{KafkaError, Msg, PartitionInfo};
use crate::materialize::model::reference;
use crate::record::{Embedding, LogRecord, MetaValue, Operation, Record};
use crate::sysdb::Sysdb;

mod broker;
mod checks;
mod consumer;
mod group;
mod journal;
mod schedule;
#[cfg(test)]
mod tests;
mod world;

use broker::*;
use journal::*;
use schedule::*;
use world::*;

/// How often the simulated consumers run: commands, group commits, deliveries.
const TICK: Duration = Duration::from_millis(10);
/// The group's session timeout: a replica silent this long loses its partitions.
const SESSION_TIMEOUT: Duration = Duration::from_secs(10);
/// How often a consumer reports positions past transaction markers (as the real one).
const POSITION_INTERVAL: Duration = Duration::from_millis(200);
/// How long the consumer waits for the processor to confirm a revoke (as the real one).
const REVOKE_WAIT: Duration = Duration::from_secs(10);
/// How long a quiet point waits for every partition to reach its high watermark.
const QUIET_WAIT: Duration = Duration::from_secs(120);
/// The event channel's capacity, in events (as the real consumer's).
const CHANNEL: usize = 32;

/// SplitMix64 over several values: the chance of one thing, independent of every other draw.
fn mix(values: &[u64]) -> u64 {
    let mut h = 0x243f_6a88_85a3_08d3_u64;
    for v in values {
        h ^= *v;
        h = h.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = h;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        h = z ^ (z >> 31);
    }
    h
}

/// A record's place in the log: (partition, offset).
type Offset = (i32, i64);

/// An invariant that broke, where and how.
#[derive(Debug, Clone)]
pub(crate) struct Failure {
    pub invariant: &'static str,
    /// The schedule's step during which it broke (0: the start).
    pub step: usize,
    pub at_ms: u64,
    pub detail: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at step {} (t={} ms): {}", self.invariant, self.step, self.at_ms, self.detail)
    }
}

/// What one seed's run gave.
pub(crate) struct Outcome {
    /// The protocol events the seed decides (identical on every replay of the seed).
    pub trace: Vec<String>,
    /// The same with simulated times and what the real code decided (for reading).
    pub log: Vec<String>,
    pub failure: Option<Failure>,
    /// The schedule's length, in steps.
    pub steps: usize,
    /// Simulated time the run took.
    pub sim_ms: u64,
    /// Commits the sysdb accepted.
    pub commits: u64,
    /// Batches a zombie tried to commit after it woke, and those the sysdb accepted
    /// (only in sequence: before the partition's new owner committed anything).
    pub zombie_batches: u64,
    pub zombie_commits: u64,
    /// Sysdb outages at commits: (nothing written, landed with the outcome unknown).
    pub outages: (u64, u64),
}

/// Run one seed, with `mistake` switched on in every replica (or none).
pub(crate) fn run(seed: u64, mistake: Option<Mistake>) -> Outcome {
    let mut builder = tokio::runtime::Builder::new_current_thread();
    builder.enable_all().start_paused(true);
    // The branch an unbiased `select!` polls first comes from the runtime's generator:
    // seeded from the world's seed where tokio's unstable API is on (`.cargo/config.toml`).
    #[cfg(tokio_unstable)]
    builder.rng_seed(tokio::runtime::RngSeed::from_bytes(&seed.to_le_bytes()));
    let rt = builder.build().expect("a current-thread runtime");
    // The sysdb's calls run inline on the runtime's thread (`sysdb::sqlite::inline`),
    // until this run ends, however it ends.
    struct Inline;
    impl Drop for Inline {
        fn drop(&mut self) {
            crate::sysdb::sqlite::inline::ON.with(|on| on.set(false));
        }
    }
    crate::sysdb::sqlite::inline::ON.with(|on| on.set(true));
    let _inline = Inline;
    // The retries' jitter (`sluice_base::retry`) comes from this thread's generator.
    fastrand::seed(seed);
    rt.block_on(async move {
        let mut world = World::new(seed, mistake).await;
        world.run().await;
        world.finish().await
    })
}
