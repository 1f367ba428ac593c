//! Replicas and their simulated consumers, the coordinator, and the world that runs them.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Life {
    Down,
    Up,
    Frozen,
}

pub(super) struct Part {
    pub(super) fetch: i64,
    pub(super) handed: i64,
    pub(super) generation: u64,
    pub(super) held: bool,
    pub(super) throttled: bool,
    pub(super) reported: Option<i64>,
    pub(super) out_of_range_told: bool,
}

/// A running replica's consumer, as the simulation plays it.
pub(super) struct Link {
    pub(super) events: mpsc::Sender<Event>,
    pub(super) overflow: VecDeque<Event>,
    pub(super) commands: std_mpsc::Receiver<Command>,
    pub(super) task: JoinHandle<Result<(), ProcessorError>>,
    pub(super) stop: CancellationToken,
    pub(super) parts: BTreeMap<i32, Part>,
    pub(super) next_generation: u64,
    /// Group commits asked for, not yet accepted (coalesced, highest per partition).
    pub(super) pending: BTreeMap<i32, i64>,
    pub(super) commit_attempts: u64,
    pub(super) last_position_check: Instant,
}

impl Link {
    pub(super) fn push(&mut self, ev: Event) {
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
    pub(super) fn flush(&mut self) -> bool {
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

    pub(super) fn bump(&mut self) -> u64 {
        self.next_generation += 1;
        self.next_generation
    }
}

pub(super) struct Replica {
    pub(super) life: Life,
    pub(super) link: Option<Link>,
    pub(super) hooks: Arc<Hooks>,
    /// Since when the coordinator has not heard from it (down or frozen).
    pub(super) silent_since: Option<Instant>,
}

#[derive(Default)]
pub(super) struct Coordinator {
    pub(super) members: BTreeSet<usize>,
    pub(super) owner: BTreeMap<i32, usize>,
    pub(super) generation: u64,
}

// ---------------------------------------------------------------------------------------
// The world

pub(super) struct World {
    pub(super) seed: u64,
    pub(super) schedule: Schedule,
    pub(super) topic: String,
    pub(super) collections: Vec<Vec<String>>,
    pub(super) broker: Arc<Broker>,
    pub(super) sysdb: Arc<Sysdb>,
    pub(super) _dir: tempfile::TempDir,
    pub(super) config: Config,
    pub(super) replicas: Vec<Replica>,
    pub(super) coord: Coordinator,
    pub(super) journal: Arc<Journal>,
    pub(super) mistake: Option<Mistake>,
    pub(super) trace: Vec<String>,
    pub(super) log: Vec<String>,
    pub(super) step: usize,
    pub(super) started: Instant,
    /// The highest sysdb position seen per partition.
    pub(super) seen: HashMap<i32, i64>,
    pub(super) failure: Option<Failure>,
    /// Counter of records produced, for ids and values.
    pub(super) produced: u64,
}

impl World {
    pub(super) async fn new(seed: u64, mistake: Option<Mistake>) -> World {
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
                    attempted: Mutex::new(BTreeSet::new()),
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

    pub(super) fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    /// A protocol event the seed decides: in the trace and the log.
    pub(super) fn note(&mut self, line: String) {
        self.log.push(format!("t={:>7} ms  {line}", self.now_ms()));
        self.trace.push(line);
    }

    /// Something the real code decided: in the log only.
    pub(super) fn observe(&mut self, line: String) {
        self.log.push(format!("t={:>7} ms    ({line})", self.now_ms()));
    }

    pub(super) fn fail(&mut self, invariant: &'static str, detail: String) {
        if self.failure.is_none() {
            let f = Failure { invariant, step: self.step, at_ms: self.now_ms(), detail };
            self.log.push(format!("t={:>7} ms  VIOLATION {f}", self.now_ms()));
            self.failure = Some(f);
        }
    }

    pub(super) async fn run(&mut self) {
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
    pub(super) async fn wait(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until && self.failure.is_none() {
            self.tick().await;
            self.expire().await;
        }
    }

    /// Members silent for a session timeout leave the group.
    pub(super) async fn expire(&mut self) {
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

    pub(super) fn expel(&mut self, r: usize, why: &str) {
        self.coord.members.remove(&r);
        self.coord.owner.retain(|_, o| *o != r);
        if self.replicas[r].life == Life::Frozen {
            self.journal.state().expelled.insert(r);
        }
        self.note(format!("coordinator: r{r} leaves the group: {why}"));
    }

    pub(super) async fn act(&mut self, action: Action) {
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

    pub(super) async fn thaw(&mut self, r: usize) {
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

    pub(super) fn start_replica(&mut self, r: usize) {
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
        let task = tokio::spawn(crate::processor::route(
            shared,
            ConsumerLink { events: events_rx, commander, handle: None },
            stop.clone(),
        ));
        // A new process: nothing of the last one's revokes applies to it.
        self.journal.state().revoked.retain(|(replica, _)| *replica != r);
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
    pub(super) fn kill(&mut self, r: usize) {
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
}
