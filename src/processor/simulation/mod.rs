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
//! chance (sysdb latency, a failed group commit, a failed DLQ produce, chunk sizes) is a
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
//! Determinism: time is tokio's paused clock (a current-thread runtime; the sysdb's
//! blocking calls hold the clock still while they run), and the schedule and every
//! chance come from the seed. The wall clock decides nothing here: messages carry no
//! producer timestamp, so a batch lingers the configured time (`partition::linger_for`
//! reads the clock only to age a timestamp), and the sysdb's `now_ms` columns are data. Two things in the real code are not decided by the
//! simulation: the order in which concurrent SQLite calls finish on the blocking pool,
//! and the branch tokio's unbiased `select!` in the router picks when several are ready.
//! They can change how records are cut into batches and when a batch lands, so the
//! trace records only what the seed decides and what a correct protocol makes certain:
//! the schedule's events, the coordinator's assignments, and at each quiet point the
//! positions, the records' digest and the DLQ's offsets. A test replays seeds and
//! requires identical traces; [`run`] also keeps a timed log for a replay by hand.

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
use super::seams::{CommitHooks, ConsumerLink, Metadata, Mistake, Outbound, SimulatedBroker};
use super::ProcessorError;
use crate::config::Config;
use crate::kafka::consumer::{Command, Commander, Event, StartDecision};
use crate::kafka::producer::{Delivered, Outgoing};
use crate::kafka::{KafkaError, Msg, PartitionInfo};
use crate::materialize::model::reference;
use crate::record::{Embedding, LogRecord, MetaValue, Operation, Record};
use crate::sysdb::Sysdb;

#[cfg(test)]
mod tests;

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
}

/// Run one seed, with `mistake` switched on in every replica (or none).
pub(crate) fn run(seed: u64, mistake: Option<Mistake>) -> Outcome {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime");
    rt.block_on(async move {
        let mut world = World::new(seed, mistake).await;
        world.run().await;
        world.finish().await
    })
}

// ---------------------------------------------------------------------------------------
// The schedule

#[derive(Debug, Clone)]
enum Action {
    Produce {
        partition: i32,
        entries: usize,
    },
    Kill(usize),
    Restart(usize),
    Freeze(usize),
    Thaw(usize),
    /// Wait until the world caught up and check the state; then maybe retention.
    Quiet {
        retention: Option<(i32, u64)>,
    },
}

/// Everything a seed decides up front.
struct Schedule {
    partitions: i32,
    replicas: usize,
    cooperative: bool,
    batch_max_records: usize,
    linger_ms: u64,
    /// (delay before, action).
    steps: Vec<(Duration, Action)>,
}

impl Schedule {
    fn draw(rng: &mut ChaCha8Rng) -> Schedule {
        let partitions = rng.random_range(1..=3);
        let replicas = rng.random_range(1..=3);
        let mut steps = Vec::new();
        let n = rng.random_range(6..=16);
        let mut frozen: Vec<(usize, usize)> = Vec::new(); // (replica, thaw at step)
        for i in 0..n {
            let delay = Duration::from_millis(rng.random_range(0..1500));
            let action = match rng.random_range(0..100) {
                0..=54 => {
                    Action::Produce { partition: rng.random_range(0..partitions), entries: rng.random_range(1..=16) }
                }
                55..=64 => Action::Kill(rng.random_range(0..replicas)),
                65..=74 => Action::Restart(rng.random_range(0..replicas)),
                75..=84 => {
                    let r = rng.random_range(0..replicas);
                    frozen.push((r, i + rng.random_range(1..=4)));
                    Action::Freeze(r)
                }
                _ => Action::Quiet {
                    retention: rng
                        .random_bool(0.5)
                        .then(|| (rng.random_range(0..partitions), rng.random_range(0..=u64::from(u32::MAX)))),
                },
            };
            steps.push((delay, action));
            // A frozen replica is woken some steps later, after a delay that is shorter or
            // longer than the session timeout.
            for (r, _) in frozen.iter().filter(|(_, at)| *at == i) {
                let d = Duration::from_millis(rng.random_range(0..2 * SESSION_TIMEOUT.as_millis() as u64));
                steps.push((d, Action::Thaw(*r)));
            }
            frozen.retain(|(_, at)| *at != i);
        }
        for (r, _) in frozen {
            steps.push((Duration::from_millis(rng.random_range(0..15_000)), Action::Thaw(r)));
        }
        steps.push((Duration::ZERO, Action::Quiet { retention: None }));
        Schedule {
            partitions,
            replicas,
            cooperative: rng.random_bool(0.5),
            batch_max_records: rng.random_range(1..=40),
            linger_ms: rng.random_range(0..=20),
            steps,
        }
    }
}

// ---------------------------------------------------------------------------------------
// The broker

enum Entry {
    /// A record delivered to read_committed consumers; `record` is `None` for poison.
    Data { key: Bytes, payload: Bytes, record: Option<Box<LogRecord>> },
    /// A transaction's commit or abort marker: takes an offset, never delivered.
    Marker,
    /// A record of an aborted transaction: takes an offset, never delivered.
    Aborted,
}

#[derive(Default)]
struct PartitionLog {
    entries: Vec<Entry>,
    log_start: i64,
}

impl PartitionLog {
    fn high(&self) -> i64 {
        self.entries.len() as i64
    }
}

#[derive(Default)]
struct BrokerState {
    logs: Vec<PartitionLog>,
    group: HashMap<i32, i64>,
    /// (source partition, source offset, kind) of every DLQ entry produced.
    dlq: Vec<(i32, i64, String)>,
    /// DLQ produce attempts per source record.
    attempts: HashMap<(i32, i64), u64>,
}

struct Broker {
    seed: u64,
    state: Mutex<BrokerState>,
}

impl Broker {
    fn state(&self) -> std::sync::MutexGuard<'_, BrokerState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn header<'a>(out: &Outgoing<'a>, name: &str) -> Option<&'a [u8]> {
    out.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| *v)
}

fn header_i64(out: &Outgoing<'_>, name: &str) -> i64 {
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

// ---------------------------------------------------------------------------------------
// The commits the sysdb accepted, as the workers report them

#[derive(Default)]
struct JournalState {
    /// Per partition, where the last accepted commit ended.
    last_to: HashMap<i32, i64>,
    /// Replicas the coordinator expelled while they were frozen (zombies once woken).
    expelled: BTreeSet<usize>,
    violations: Vec<(&'static str, String)>,
    commits: u64,
    zombie_batches: u64,
    zombie_commits: u64,
}

#[derive(Default)]
struct Journal(Mutex<JournalState>);

impl Journal {
    fn state(&self) -> std::sync::MutexGuard<'_, JournalState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One replica's hooks: a sysdb latency per batch, the freeze, the journal of commits.
struct Hooks {
    replica: usize,
    seed: u64,
    mistake: Option<Mistake>,
    frozen: watch::Sender<bool>,
    journal: Arc<Journal>,
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

    fn mistake(&self) -> Option<Mistake> {
        self.mistake
    }
}

// ---------------------------------------------------------------------------------------
// Replicas and their simulated consumers

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Life {
    Down,
    Up,
    Frozen,
}

struct Part {
    fetch: i64,
    handed: i64,
    generation: u64,
    held: bool,
    throttled: bool,
    reported: Option<i64>,
    out_of_range_told: bool,
}

/// A running replica's consumer, as the simulation plays it.
struct Link {
    events: mpsc::Sender<Event>,
    overflow: VecDeque<Event>,
    commands: std_mpsc::Receiver<Command>,
    task: JoinHandle<Result<(), ProcessorError>>,
    stop: CancellationToken,
    parts: BTreeMap<i32, Part>,
    next_generation: u64,
    /// Group commits asked for, not yet accepted (coalesced, highest per partition).
    pending: BTreeMap<i32, i64>,
    commit_attempts: u64,
    last_position_check: Instant,
}

impl Link {
    fn push(&mut self, ev: Event) {
        if self.overflow.is_empty() {
            match self.events.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => self.overflow.push_back(ev),
                Err(mpsc::error::TrySendError::Closed(_)) => {}
            }
        } else {
            self.overflow.push_back(ev);
        }
    }

    /// Move the overflow into the channel; whether there is room for more.
    fn flush(&mut self) -> bool {
        while let Some(ev) = self.overflow.pop_front() {
            match self.events.try_send(ev) {
                Ok(()) => {}
                Err(mpsc::error::TrySendError::Full(ev)) => {
                    self.overflow.push_front(ev);
                    return false;
                }
                Err(mpsc::error::TrySendError::Closed(_)) => self.overflow.clear(),
            }
        }
        self.events.capacity() > 0
    }

    fn bump(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }
}

struct Replica {
    life: Life,
    link: Option<Link>,
    hooks: Arc<Hooks>,
    /// Since when the coordinator has not heard from it (down or frozen).
    silent_since: Option<Instant>,
}

#[derive(Default)]
struct Coordinator {
    members: BTreeSet<usize>,
    owner: BTreeMap<i32, usize>,
    generation: u64,
}

// ---------------------------------------------------------------------------------------
// The world

struct World {
    seed: u64,
    schedule: Schedule,
    topic: String,
    collections: Vec<Vec<String>>,
    broker: Arc<Broker>,
    sysdb: Arc<Sysdb>,
    _dir: tempfile::TempDir,
    config: Config,
    replicas: Vec<Replica>,
    coord: Coordinator,
    journal: Arc<Journal>,
    mistake: Option<Mistake>,
    trace: Vec<String>,
    log: Vec<String>,
    step: usize,
    started: Instant,
    /// The highest sysdb position seen per partition.
    seen: HashMap<i32, i64>,
    failure: Option<Failure>,
    /// Counter of records produced, for ids and values.
    produced: u64,
}

impl World {
    async fn new(seed: u64, mistake: Option<Mistake>) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let schedule = Schedule::draw(&mut rng);
        let dir = tempfile::tempdir().expect("a temporary directory");
        let url = format!("sqlite://{}", dir.path().join("sysdb.sqlite").display());
        let sysdb = Arc::new(Sysdb::open(&url).await.expect("the simulation's sysdb opens"));
        // A topic of its own per world: a mistake switched on for one world's topic (the
        // compare-and-set skipped) must not reach a world of the same seed running in
        // another test at the same time.
        static WORLDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let world_id = WORLDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let topic = format!("sim-{seed}-{world_id}.log");
        if mistake == Some(Mistake::SkipCompareAndSet) {
            crate::sysdb::set_skip_compare_and_set(&topic, true);
        }
        // Two collections per partition, named so that murmur2 puts them there.
        let mut collections = vec![Vec::new(); schedule.partitions as usize];
        let mut i = 0;
        while collections.iter().any(|c| c.len() < 2) {
            let name = format!("c{i}");
            let p = crate::record::partitioner::partition_for(name.as_bytes(), schedule.partitions as u32);
            if collections[p as usize].len() < 2 {
                collections[p as usize].push(name);
            }
            i += 1;
        }
        let mut config = Config::default();
        config.processor.batch_max_records = schedule.batch_max_records;
        config.processor.batch_linger_ms = schedule.linger_ms;
        config.processor.shutdown_timeout_ms = 5_000;
        let broker = Arc::new(Broker {
            seed,
            state: Mutex::new(BrokerState {
                logs: (0..schedule.partitions).map(|_| PartitionLog::default()).collect(),
                ..BrokerState::default()
            }),
        });
        let journal = Arc::new(Journal::default());
        let replicas = (0..schedule.replicas)
            .map(|r| Replica {
                life: Life::Down,
                link: None,
                hooks: Arc::new(Hooks {
                    replica: r,
                    seed,
                    mistake,
                    frozen: watch::channel(false).0,
                    journal: journal.clone(),
                }),
                silent_since: None,
            })
            .collect();
        let mut world = World {
            seed,
            topic,
            collections,
            broker,
            sysdb,
            _dir: dir,
            config,
            replicas,
            coord: Coordinator::default(),
            journal,
            mistake,
            trace: Vec::new(),
            log: Vec::new(),
            step: 0,
            started: Instant::now(),
            seen: HashMap::new(),
            failure: None,
            produced: 0,
            schedule,
        };
        let s = &world.schedule;
        world.note(format!(
            "world: {} partitions, {} replicas, {} rebalances, batches of up to {} records, linger {} ms, mistake {:?}",
            s.partitions,
            s.replicas,
            if s.cooperative { "cooperative" } else { "eager" },
            s.batch_max_records,
            s.linger_ms,
            mistake
        ));
        world
    }

    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A protocol event the seed decides: in the trace and the log.
    fn note(&mut self, line: String) {
        self.log.push(format!("t={:>7} ms  {line}", self.now_ms()));
        self.trace.push(line);
    }

    /// Something the real code decided: in the log only.
    fn observe(&mut self, line: String) {
        self.log.push(format!("t={:>7} ms    ({line})", self.now_ms()));
    }

    fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.failure.is_none() {
            let f = Failure { invariant, step: self.step, at_ms: self.now_ms(), detail };
            self.log.push(format!("t={:>7} ms  VIOLATION {f}", self.now_ms()));
            self.failure = Some(f);
        }
    }

    async fn run(&mut self) {
        for r in 0..self.replicas.len() {
            self.start_replica(r);
        }
        self.rebalance().await;
        let steps = std::mem::take(&mut self.schedule.steps);
        for (i, (delay, action)) in steps.iter().enumerate() {
            if self.failure.is_some() {
                break;
            }
            self.step = i + 1;
            self.wait(*delay).await;
            if self.failure.is_some() {
                break;
            }
            self.act(action.clone()).await;
        }
        self.schedule.steps = steps;
    }

    /// Let `d` of simulated time pass, with rebalances when a silent member times out.
    async fn wait(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until && self.failure.is_none() {
            self.tick().await;
            self.expire().await;
        }
    }

    /// Members silent for a session timeout leave the group.
    async fn expire(&mut self) {
        let expired: Vec<usize> = self
            .coord
            .members
            .iter()
            .copied()
            .filter(|&r| self.replicas[r].silent_since.is_some_and(|t| t.elapsed() >= SESSION_TIMEOUT))
            .collect();
        if expired.is_empty() {
            return;
        }
        for r in &expired {
            self.expel(*r, "silent for the session timeout");
        }
        self.rebalance().await;
    }

    fn expel(&mut self, r: usize, why: &str) {
        self.coord.members.remove(&r);
        self.coord.owner.retain(|_, o| *o != r);
        if self.replicas[r].life == Life::Frozen {
            self.journal.state().expelled.insert(r);
        }
        self.note(format!("coordinator: r{r} leaves the group: {why}"));
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::Produce { partition, entries } => self.produce(partition, entries),
            Action::Kill(r) => {
                if self.replicas[r].life == Life::Down {
                    self.note(format!("kill r{r}: already down"));
                    return;
                }
                self.note(format!("kill r{r}"));
                self.kill(r);
            }
            Action::Restart(r) => {
                if self.replicas[r].life != Life::Down {
                    self.note(format!("restart r{r}: not down"));
                    return;
                }
                self.note(format!("restart r{r}"));
                if self.coord.members.contains(&r) {
                    // A new member: the old one's membership ends first.
                    self.expel(r, "restarted as a new member");
                }
                self.start_replica(r);
                self.rebalance().await;
            }
            Action::Freeze(r) => {
                if self.replicas[r].life != Life::Up {
                    self.note(format!("freeze r{r}: not running"));
                    return;
                }
                // The process stops with a batch in flight: records arrive on one of its
                // partitions, its worker takes them, and the batch waits before the sysdb
                // commit until the replica wakes (as a zombie, if it slept past the
                // session timeout).
                self.replicas[r].hooks.frozen.send_replace(true);
                let owned: Vec<i32> = self.coord.owner.iter().filter(|(_, o)| **o == r).map(|(p, _)| *p).collect();
                if owned.is_empty() {
                    self.note(format!("freeze r{r}"));
                } else {
                    let p = owned[(mix(&[self.seed, 7, self.step as u64]) % owned.len() as u64) as usize];
                    self.note(format!("freeze r{r} with a batch in flight on partition {p}"));
                    self.produce(p, 2 + (mix(&[self.seed, 8, self.step as u64]) % 6) as usize);
                    self.settle(Duration::from_millis(100)).await;
                }
                self.replicas[r].life = Life::Frozen;
                self.replicas[r].silent_since = Some(Instant::now());
            }
            Action::Thaw(r) => self.thaw(r).await,
            Action::Quiet { retention } => {
                self.quiet().await;
                if let (Some((p, pick)), None) = (retention, &self.failure) {
                    let mut st = self.broker.state();
                    let log = &mut st.logs[p as usize];
                    // Only what every replica has processed: positions are at the high watermark.
                    let start = log.log_start + (pick % (log.high() - log.log_start + 1) as u64) as i64;
                    log.log_start = start;
                    drop(st);
                    self.note(format!("retention: partition {p} starts at {start}"));
                }
            }
        }
    }

    async fn thaw(&mut self, r: usize) {
        if self.replicas[r].life != Life::Frozen {
            self.note(format!("thaw r{r}: not frozen"));
            return;
        }
        let zombie = !self.coord.members.contains(&r);
        self.note(format!("thaw r{r}{}", if zombie { " (a zombie: its partitions were reassigned)" } else { "" }));
        self.replicas[r].life = Life::Up;
        self.replicas[r].silent_since = None;
        self.replicas[r].hooks.frozen.send_replace(false);
        if zombie {
            // The consumer finds out it left the group: its partitions are lost.
            let lost: Vec<i32> =
                self.replicas[r].link.as_ref().map_or(Vec::new(), |l| l.parts.keys().copied().collect());
            if !lost.is_empty() {
                self.revoke(r, lost).await;
            }
            self.journal.state().expelled.remove(&r);
            self.coord.members.insert(r);
            self.rebalance().await;
        }
    }

    fn start_replica(&mut self, r: usize) {
        let (events_tx, events_rx) = mpsc::channel(CHANNEL);
        let (commander, commands) = Commander::detached();
        let stop = CancellationToken::new();
        let shared = Arc::new(Shared {
            config: self.config.clone(),
            sysdb: self.sysdb.clone(),
            producer: Outbound::Simulated(self.broker.clone()),
            commander: commander.clone(),
            metrics: crate::metrics::Metrics::new(),
            health: crate::health::Health::new(),
            metadata: Metadata::Simulated(self.broker.clone()),
            topic: self.topic.clone(),
            dlq_topic: format!("sim-{}.dlq", self.seed),
            backfill_topic: format!("sim-{}.backfill", self.seed),
            topic_partitions: self.schedule.partitions,
            registry: None,
            board: crate::reading::board::Board::new(),
            relay: None,
            hooks: Some(self.replicas[r].hooks.clone()),
        });
        let task = tokio::spawn(super::route(
            shared,
            ConsumerLink { events: events_rx, commander, handle: None },
            stop.clone(),
        ));
        let rep = &mut self.replicas[r];
        rep.hooks.frozen.send_replace(false);
        rep.link = Some(Link {
            events: events_tx,
            overflow: VecDeque::new(),
            commands,
            task,
            stop,
            parts: BTreeMap::new(),
            next_generation: 0,
            pending: BTreeMap::new(),
            commit_attempts: 0,
            last_position_check: Instant::now(),
        });
        rep.life = Life::Up;
        rep.silent_since = None;
        self.coord.members.insert(r);
    }

    /// A crash: the router and its workers are gone at once; what they did not commit is lost.
    fn kill(&mut self, r: usize) {
        let rep = &mut self.replicas[r];
        if let Some(link) = rep.link.take() {
            link.task.abort();
        }
        // A commit already on the sysdb's blocking pool may still land; its report
        // never comes, so the journal forgets where the positions stand.
        self.journal.state().last_to.clear();
        rep.hooks.frozen.send_replace(false);
        rep.life = Life::Down;
        rep.silent_since = Some(Instant::now());
    }

    /// The sticky, balanced assignment of the partitions over the members.
    fn target(&self) -> BTreeMap<i32, usize> {
        let members: Vec<usize> = self.coord.members.iter().copied().collect();
        let mut target = BTreeMap::new();
        if members.is_empty() {
            return target;
        }
        let n = self.schedule.partitions as usize;
        let quota = n.div_ceil(members.len());
        let mut load: BTreeMap<usize, usize> = members.iter().map(|m| (*m, 0)).collect();
        let mut free = Vec::new();
        for p in 0..self.schedule.partitions {
            match self.coord.owner.get(&p) {
                Some(o) if load.get(o).is_some_and(|l| *l < quota) => {
                    target.insert(p, *o);
                    *load.entry(*o).or_default() += 1;
                }
                _ => free.push(p),
            }
        }
        for p in free {
            let (&m, _) = load.iter().min_by_key(|(m, l)| (**l, **m)).expect("members");
            target.insert(p, m);
            *load.entry(m).or_default() += 1;
        }
        target
    }

    /// A rebalance: revoke (every partition under eager, the moving ones under
    /// cooperative), then assign, each member in turn, with delays in between.
    async fn rebalance(&mut self) {
        // Members that cannot answer (down, frozen) are left out, as their session ends.
        let silent: Vec<usize> =
            self.coord.members.iter().copied().filter(|&r| self.replicas[r].life != Life::Up).collect();
        for r in silent {
            self.expel(r, "cannot take part in the rebalance");
        }
        self.coord.generation += 1;
        let target = self.target();
        let owned: Vec<(i32, usize)> = self.coord.owner.iter().map(|(p, r)| (*p, *r)).collect();
        let mut revokes: BTreeMap<usize, Vec<i32>> = BTreeMap::new();
        for (p, r) in owned {
            if !self.schedule.cooperative || target.get(&p) != Some(&r) {
                revokes.entry(r).or_default().push(p);
            }
        }
        let mut assigns: BTreeMap<usize, Vec<i32>> = BTreeMap::new();
        for (p, r) in &target {
            if !self.schedule.cooperative || self.coord.owner.get(p) != Some(r) {
                assigns.entry(*r).or_default().push(*p);
            }
        }
        self.note(format!(
            "rebalance {}: revoke {:?}, assign {:?}",
            self.coord.generation,
            revokes.iter().map(|(r, ps)| format!("r{r}:{ps:?}")).collect::<Vec<_>>(),
            assigns.iter().map(|(r, ps)| format!("r{r}:{ps:?}")).collect::<Vec<_>>()
        ));
        for (r, ps) in revokes {
            self.revoke(r, ps).await;
        }
        let pause = Duration::from_millis(mix(&[self.seed, 3, self.coord.generation]) % 300);
        self.settle(pause).await;
        for (r, ps) in assigns {
            if self.replicas[r].life == Life::Up {
                self.assign(r, ps).await;
            }
        }
    }

    /// Ticks for `d`, without expiring members (inside a rebalance).
    async fn settle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.tick().await;
        }
    }

    async fn revoke(&mut self, r: usize, ps: Vec<i32>) {
        for p in &ps {
            self.coord.owner.remove(p);
        }
        let Some(link) = self.replicas[r].link.as_mut() else { return };
        for p in &ps {
            // The consumer forgets them first: their later group commits are not sent.
            link.parts.remove(p);
            link.pending.remove(p);
        }
        let (done_tx, done_rx) = std_mpsc::sync_channel(1);
        link.push(Event::Revoke { partitions: ps.clone(), done: done_tx });
        let deadline = Instant::now() + REVOKE_WAIT;
        loop {
            match done_rx.try_recv() {
                Ok(()) | Err(std_mpsc::TryRecvError::Disconnected) => break,
                Err(std_mpsc::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                self.observe(format!("r{r} did not confirm the revoke of {ps:?} within 10 s"));
                break;
            }
            self.tick().await;
        }
    }

    async fn assign(&mut self, r: usize, ps: Vec<i32>) {
        let infos: Vec<PartitionInfo> = {
            let st = self.broker.state();
            ps.iter()
                .map(|&p| {
                    let log = &st.logs[p as usize];
                    PartitionInfo {
                        partition: p,
                        group_offset: st.group.get(&p).copied(),
                        low: log.log_start,
                        high: log.high(),
                    }
                })
                .collect()
        };
        if self.replicas[r].link.is_none() {
            return;
        }
        let Some(before) = self.positions().await else { return };
        let Some(link) = self.replicas[r].link.as_mut() else { return };
        let (reply_tx, mut reply_rx) = oneshot::channel();
        link.push(Event::Assign { partitions: infos, reply: reply_tx });
        let deadline = Instant::now() + Duration::from_secs(60);
        let decisions: Vec<StartDecision> = loop {
            match reply_rx.try_recv() {
                Ok(d) => break d,
                Err(oneshot::error::TryRecvError::Closed) => {
                    self.observe(format!("r{r} went away during the assignment of {ps:?}"));
                    return;
                }
                Err(oneshot::error::TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                self.fail(
                    "an assignment was not answered",
                    format!("r{r} did not answer the assignment of {ps:?} in 60 s"),
                );
                return;
            }
            self.tick().await;
        };
        // Where each partition starts: its sysdb position, as it was when the assignment
        // was asked for or as a zombie's last batch has moved it since.
        let Some(after) = self.positions().await else { return };
        for d in decisions.iter().filter(|d| !d.paused) {
            if let (Some(b), Some(a)) = (before.get(&d.partition), after.get(&d.partition)) {
                if d.offset < *b || d.offset > *a {
                    self.fail(
                        "a partition starts at its sysdb position",
                        format!(
                            "r{r} starts partition {} at {} while the sysdb held {b} (then {a})",
                            d.partition, d.offset
                        ),
                    );
                }
            }
        }
        let Some(link) = self.replicas[r].link.as_mut() else { return };
        let mut with_gen = Vec::new();
        for d in &decisions {
            let generation = link.bump();
            link.parts.insert(
                d.partition,
                Part {
                    fetch: d.offset,
                    handed: d.offset,
                    generation,
                    held: d.paused,
                    throttled: false,
                    reported: None,
                    out_of_range_told: false,
                },
            );
            with_gen.push((*d, generation));
        }
        link.push(Event::Assigned { partitions: with_gen });
        for d in &decisions {
            self.coord.owner.insert(d.partition, r);
        }
        self.observe(format!(
            "r{r} starts {:?}",
            decisions.iter().map(|d| (d.partition, d.offset, if d.paused { "halted" } else { "" })).collect::<Vec<_>>()
        ));
    }

    fn produce(&mut self, partition: i32, entries: usize) {
        let seed = self.seed;
        let names = self.collections[partition as usize].clone();
        let mut made = Vec::new();
        let mut i = 0;
        while i < entries {
            self.produced += 1;
            let h = mix(&[seed, 4, self.produced]);
            match h % 20 {
                // A transaction that commits: records, then its marker.
                0 | 1 => {
                    let n = 1 + (h >> 8) % 3;
                    for k in 0..n {
                        made.push(self.data_entry(&names, h.wrapping_add(k)));
                    }
                    made.push(Entry::Marker);
                    i += n as usize + 1;
                }
                // A transaction that aborts: its records are never delivered.
                2 => {
                    let n = 1 + (h >> 8) % 3;
                    for _ in 0..n {
                        made.push(Entry::Aborted);
                    }
                    made.push(Entry::Marker);
                    i += n as usize + 1;
                }
                // Poison: not Avro, or a key that is not the collection.
                3 => {
                    let payload = if h & 256 == 0 {
                        Bytes::from_static(&[0xff, 0xfe, 0x01])
                    } else {
                        let r = LogRecord::data(names[0].clone(), "x", Operation::Upsert);
                        Bytes::from(crate::record::framing::encode_framed(self.config.kafka.framing, 1, &r))
                    };
                    made.push(Entry::Data { key: Bytes::from_static(b"not-the-collection"), payload, record: None });
                    i += 1;
                }
                _ => {
                    made.push(self.data_entry(&names, h));
                    i += 1;
                }
            }
        }
        let mut st = self.broker.state();
        let log = &mut st.logs[partition as usize];
        let from = log.high();
        log.entries.extend(made);
        let to = log.high();
        drop(st);
        self.note(format!("produce partition {partition}: [{from}, {to})"));
    }

    fn data_entry(&self, names: &[String], h: u64) -> Entry {
        let collection = &names[(h >> 12) as usize % names.len()];
        let id = format!("id{}", (h >> 16) % 5);
        let op = match (h >> 20) % 4 {
            0 => Operation::Add,
            1 => Operation::Update,
            2 => Operation::Upsert,
            _ => Operation::Delete,
        };
        let mut r = LogRecord::data(collection.clone(), id, op);
        if op != Operation::Delete {
            if !(h >> 24).is_multiple_of(3) {
                // Mostly two dimensions; sometimes three, refused once the collection has two.
                let dim = if (h >> 26).is_multiple_of(10) { 3 } else { 2 };
                let values: Vec<f32> = (0..dim).map(|k| ((h >> (28 + k)) % 7) as f32 - 3.0).collect();
                r.embedding = Some(Embedding::from_f32s(&values));
            }
            if (h >> 32).is_multiple_of(2) {
                let value =
                    if (h >> 33).is_multiple_of(5) { MetaValue::Null } else { MetaValue::Long(((h >> 36) % 9) as i64) };
                r.metadata = Some([(format!("k{}", (h >> 40) % 3), value)].into_iter().collect());
            }
            if (h >> 44).is_multiple_of(3) {
                r.document = Some(format!("doc {}", (h >> 46) % 4));
            }
        }
        let payload = Bytes::from(crate::record::framing::encode_framed(self.config.kafka.framing, 1, &r));
        Entry::Data { key: Bytes::from(collection.clone().into_bytes()), payload, record: Some(Box::new(r)) }
    }

    /// One tick: each running replica's consumer does its work, then time moves on.
    async fn tick(&mut self) {
        let mut committed = Vec::new();
        for r in 0..self.replicas.len() {
            self.pump(r, &mut committed);
        }
        let violations = std::mem::take(&mut self.journal.state().violations);
        for (what, detail) in violations {
            self.fail(what, detail);
        }
        if !committed.is_empty() {
            self.check_group_offsets(&committed).await;
        }
        tokio::time::sleep(TICK).await;
    }

    /// The consumer of replica `r`: its process, commands, group commits and deliveries.
    fn pump(&mut self, r: usize, committed: &mut Vec<(usize, i32, i64)>) {
        if self.replicas[r].life != Life::Up {
            return;
        }
        let Some(link) = self.replicas[r].link.as_mut() else { return };
        if link.task.is_finished() {
            // It stopped by itself: only a fatal error does that here.
            self.replicas[r].link = None;
            self.replicas[r].life = Life::Down;
            self.replicas[r].silent_since = Some(Instant::now());
            self.fail("a processor stopped", format!("r{r}'s processor ended on its own"));
            return;
        }
        while let Ok(cmd) = link.commands.try_recv() {
            match cmd {
                Command::Commit(offsets) => {
                    for (p, o) in offsets {
                        if link.parts.contains_key(&p) {
                            let e = link.pending.entry(p).or_insert(o);
                            *e = (*e).max(o);
                        }
                    }
                }
                Command::Pause(ps) => {
                    for p in ps {
                        if let Some(part) = link.parts.get_mut(&p) {
                            part.held = true;
                        }
                    }
                }
                Command::Resume(ps) => {
                    for p in ps {
                        if let Some(part) = link.parts.get_mut(&p) {
                            part.held = false;
                        }
                    }
                }
                Command::Throttle { partition, on } => {
                    if let Some(part) = link.parts.get_mut(&partition) {
                        part.throttled = on;
                    }
                }
                Command::Seek { partition, offset } => {
                    if link.parts.contains_key(&partition) {
                        let generation = link.bump();
                        if let Some(part) = link.parts.get_mut(&partition) {
                            part.fetch = offset;
                            part.handed = offset;
                            part.generation = generation;
                            part.reported = None;
                            part.out_of_range_told = false;
                        }
                        link.push(Event::Seeked { partition, offset, generation });
                    }
                }
                Command::Shutdown => link.stop.cancel(),
            }
        }
        // Group commits: only for partitions this member owns, only forward; some fail
        // and are retried on a later tick.
        let pending = std::mem::take(&mut link.pending);
        {
            let mut st = self.broker.state();
            for (p, o) in pending {
                link.commit_attempts += 1;
                if mix(&[self.seed, 5, r as u64, link.commit_attempts]).is_multiple_of(4) {
                    link.pending.insert(p, o);
                    continue;
                }
                if self.coord.owner.get(&p) == Some(&r)
                    && crate::positions::group_commit_advances(st.group.get(&p).copied(), o)
                {
                    st.group.insert(p, o);
                    committed.push((r, p, o));
                }
            }
        }
        // Deliveries: a chunk per readable partition while the channel has room.
        if !link.flush() {
            return;
        }
        let st = self.broker.state();
        for (&p, part) in link.parts.iter_mut() {
            if part.held || part.throttled || link.events.capacity() == 0 {
                continue;
            }
            let log = &st.logs[p as usize];
            if part.fetch < log.log_start {
                if !part.out_of_range_told {
                    part.out_of_range_told = true;
                    let _ = link.events.try_send(Event::OffsetOutOfRange { partitions: vec![p] });
                }
                continue;
            }
            let max = 1 + (mix(&[self.seed, 6, r as u64, p as u64, part.fetch as u64]) % 12) as usize;
            let mut msgs = Vec::new();
            let mut at = part.fetch;
            while at < log.high() && msgs.len() < max {
                if let Entry::Data { key, payload, .. } = &log.entries[at as usize] {
                    msgs.push(Msg {
                        partition: p,
                        offset: at,
                        generation: part.generation,
                        key: Some(key.clone()),
                        payload: Some(payload.clone()),
                        timestamp_ms: None,
                    });
                }
                at += 1;
            }
            // The fetch position moves past markers and aborted records that follow.
            while at < log.high() && !matches!(log.entries[at as usize], Entry::Data { .. }) {
                at += 1;
            }
            part.fetch = at;
            if let Some(last) = msgs.last() {
                part.handed = last.offset + 1;
                let _ = link.events.try_send(Event::Messages(msgs));
            }
        }
        drop(st);
        if link.last_position_check.elapsed() >= POSITION_INTERVAL {
            link.last_position_check = Instant::now();
            let mut reports = Vec::new();
            for (&p, part) in link.parts.iter_mut() {
                if !part.held && part.fetch > part.handed && part.reported != Some(part.fetch) {
                    part.reported = Some(part.fetch);
                    reports.push(Event::Position { partition: p, offset: part.fetch, generation: part.generation });
                }
            }
            for ev in reports {
                link.push(ev);
            }
        }
    }

    /// Read the sysdb positions: each must be at or past what was seen before.
    async fn positions(&mut self) -> Option<HashMap<i32, i64>> {
        let positions = match self.sysdb.positions(&self.topic).await {
            Ok(p) => p,
            Err(e) => {
                self.fail("the sysdb answers", format!("cannot read positions: {e}"));
                return None;
            }
        };
        for (&p, &pos) in &positions {
            let seen = self.seen.entry(p).or_insert(pos);
            if pos < *seen {
                let before = *seen;
                self.fail(
                    "a sysdb position never moves back",
                    format!("partition {p} went from {before} back to {pos}"),
                );
                return None;
            }
            *seen = pos;
        }
        Some(positions)
    }

    /// Group offsets just accepted must not be ahead of the sysdb (read afterwards: the
    /// position can only have moved forward since).
    async fn check_group_offsets(&mut self, committed: &[(usize, i32, i64)]) {
        let Some(positions) = self.positions().await else { return };
        for &(r, p, o) in committed {
            let pos = positions.get(&p).copied().unwrap_or(-1);
            if o > pos {
                self.fail(
                    "the group offset is never ahead of the sysdb",
                    format!("r{r} committed group offset {o} for partition {p} while the sysdb holds {pos}"),
                );
                return;
            }
        }
    }

    /// Wait until every partition's position is at its high watermark, then compare the
    /// stored state with the reference model.
    async fn quiet(&mut self) {
        // Faults stop: frozen replicas wake (a zombie's batch must then be refused).
        for r in 0..self.replicas.len() {
            if self.replicas[r].life == Life::Frozen {
                self.thaw(r).await;
            }
        }
        if self.replicas.iter().all(|r| r.life == Life::Down) {
            self.note("quiet: every replica is down; restart r0".into());
            if self.coord.members.contains(&0) {
                self.expel(0, "restarted as a new member");
            }
            self.start_replica(0);
            self.rebalance().await;
        }
        let deadline = Instant::now() + QUIET_WAIT;
        let highs: Vec<i64> = {
            let st = self.broker.state();
            st.logs.iter().map(PartitionLog::high).collect()
        };
        loop {
            if self.failure.is_some() {
                return;
            }
            let Some(positions) = self.positions().await else { return };
            let behind: Vec<(i32, i64, i64)> = (0..self.schedule.partitions)
                .filter_map(|p| {
                    let pos = positions.get(&p).copied().unwrap_or(-1);
                    (pos != highs[p as usize]).then_some((p, pos, highs[p as usize]))
                })
                .collect();
            if behind.is_empty() {
                break;
            }
            if Instant::now() >= deadline {
                let halts = self.sysdb.partition_states(&self.topic).await.map(|s| {
                    s.into_iter()
                        .filter_map(|s| s.halted_reason.map(|r| format!("partition {}: {r}", s.partition)))
                        .collect::<Vec<_>>()
                });
                self.fail(
                    "lag reaches 0 once the world is quiet",
                    format!(
                        "after {} s (partition, position, high watermark): {behind:?}; halts: {halts:?}",
                        QUIET_WAIT.as_secs()
                    ),
                );
                return;
            }
            // While waiting, frozen members time out and others take over.
            for _ in 0..20 {
                self.tick().await;
            }
            self.expire().await;
        }
        self.check_state(&highs).await;
    }

    /// The stored records of every collection equal the reference model's fold of the log
    /// up to the partition's position; poison records are in the DLQ.
    async fn check_state(&mut self, positions: &[i64]) {
        let (log, poison, dlq): (Vec<(i64, LogRecord)>, Vec<Offset>, BTreeSet<Offset>) = {
            let st = self.broker.state();
            let mut log = Vec::new();
            let mut poison = Vec::new();
            for (p, l) in st.logs.iter().enumerate() {
                for (o, e) in l.entries.iter().enumerate().take(positions[p] as usize) {
                    match e {
                        Entry::Data { record: Some(r), .. } => log.push((o as i64, LogRecord::clone(r))),
                        Entry::Data { record: None, .. } => poison.push((p as i32, o as i64)),
                        _ => {}
                    }
                }
            }
            (log, poison, st.dlq.iter().map(|(p, o, _)| (*p, *o)).collect())
        };
        // The model wants each collection's records in offset order.
        let mut log = log;
        log.sort_by(|a, b| (a.1.collection_id.as_str(), a.0).cmp(&(b.1.collection_id.as_str(), b.0)));
        let model = reference(&log);
        let mut digest = 0u64;
        let mut live = 0usize;
        for name in self.collections.iter().flatten() {
            let stored = match self.sysdb.list_records(name, None, 10_000).await {
                Ok(r) => r,
                Err(e) => {
                    self.fail("the sysdb answers", format!("cannot list {name}: {e}"));
                    return;
                }
            };
            let expected: Vec<Record> =
                model.collections.get(name).map_or(Vec::new(), |c| c.records.values().cloned().collect());
            if stored != expected {
                let got: Vec<(String, i64)> = stored.iter().map(|r| (r.id.clone(), r.offset)).collect();
                let want: Vec<(String, i64)> = expected.iter().map(|r| (r.id.clone(), r.offset)).collect();
                self.fail(
                    "the state equals the reference model's fold of the log",
                    format!("collection {name}: stored (id, offset) {got:?}, the model has {want:?}"),
                );
                return;
            }
            for r in &stored {
                digest = mix(&[digest, r.offset as u64, r.id.len() as u64]);
            }
            live += stored.len();
        }
        if let Some(missing) = poison.iter().find(|k| !dlq.contains(k)) {
            self.fail(
                "bad input goes to the DLQ",
                format!("poison record at partition {} offset {} is not in the DLQ", missing.0, missing.1),
            );
            return;
        }
        let dlq_offsets: BTreeSet<(i32, i64)> = dlq.into_iter().filter(|(p, o)| *o < positions[*p as usize]).collect();
        self.note(format!(
            "quiet: positions {positions:?} at the high watermarks, {live} live records (digest {digest:016x}), DLQ {dlq_offsets:?}: as the model"
        ));
    }

    async fn finish(mut self) -> Outcome {
        // Stop the replicas as a shutdown does (the router ends on its own then).
        for r in 0..self.replicas.len() {
            if self.replicas[r].life == Life::Frozen {
                self.replicas[r].hooks.frozen.send_replace(false);
                self.replicas[r].life = Life::Up;
            }
            if let Some(link) = &self.replicas[r].link {
                link.stop.cancel();
            }
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && self.replicas.iter().any(|r| r.link.as_ref().is_some_and(|l| !l.task.is_finished()))
        {
            for r in 0..self.replicas.len() {
                if let Some(link) = self.replicas[r].link.as_mut() {
                    // Commands are read (a shutdown), nothing more is delivered.
                    while let Ok(cmd) = link.commands.try_recv() {
                        if let Command::Shutdown = cmd {
                            link.stop.cancel();
                        }
                    }
                }
            }
            tokio::time::sleep(TICK).await;
        }
        for r in 0..self.replicas.len() {
            if let Some(link) = self.replicas[r].link.take() {
                link.task.abort();
            }
        }
        if self.mistake == Some(Mistake::SkipCompareAndSet) {
            crate::sysdb::set_skip_compare_and_set(&self.topic, false);
        }
        let (commits, zombie_batches, zombie_commits) = {
            let st = self.journal.state();
            (st.commits, st.zombie_batches, st.zombie_commits)
        };
        let steps = self.schedule.steps.len();
        let sim_ms = self.now_ms();
        Outcome {
            trace: self.trace,
            log: self.log,
            failure: self.failure,
            steps,
            sim_ms,
            commits,
            zombie_batches,
            zombie_commits,
        }
    }
}
