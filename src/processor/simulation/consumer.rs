//! What is produced, and each replica's simulated consumer: fetches, positions, the commands it answers.

use super::*;

impl World {
    pub(super) fn produce(&mut self, partition: i32, entries: usize) {
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

    pub(super) fn data_entry(&self, names: &[String], h: u64) -> Entry {
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
    pub(super) async fn tick(&mut self) {
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
    pub(super) fn pump(&mut self, r: usize, committed: &mut Vec<(usize, i32, i64)>) {
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
}
