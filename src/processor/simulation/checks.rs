//! The invariants at quiet points (lag 0, the records against the reference model, the DLQ) and the outcome.

use super::*;

impl World {
    /// Read the sysdb positions: each must be at or past what was seen before.
    pub(super) async fn positions(&mut self) -> Option<HashMap<i32, i64>> {
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
    pub(super) async fn check_group_offsets(&mut self, committed: &[(usize, i32, i64)]) {
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
    pub(super) async fn quiet(&mut self) {
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
    pub(super) async fn check_state(&mut self, positions: &[i64]) {
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

    pub(super) async fn finish(mut self) -> Outcome {
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
        let (commits, zombie_batches, zombie_commits, outages) = {
            let st = self.journal.state();
            (st.commits, st.zombie_batches, st.zombie_commits, st.outages)
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
            outages,
        }
    }
}
