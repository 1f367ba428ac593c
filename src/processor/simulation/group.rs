//! The coordinator: which replica owns which partition, and the rebalances that move them.

use super::*;

impl World {
    /// The sticky, balanced assignment of the partitions over the members.
    pub(super) fn target(&self) -> BTreeMap<i32, usize> {
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
    pub(super) async fn rebalance(&mut self) {
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
    pub(super) async fn settle(&mut self, d: Duration) {
        let until = Instant::now() + d;
        while Instant::now() < until {
            self.tick().await;
        }
    }

    pub(super) async fn revoke(&mut self, r: usize, ps: Vec<i32>) {
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

    pub(super) async fn assign(&mut self, r: usize, ps: Vec<i32>) {
        {
            // Assigned again: its batches may go to the sysdb again.
            let mut st = self.journal.state();
            for p in &ps {
                st.revoked.remove(&(r, *p));
            }
        }
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
}
