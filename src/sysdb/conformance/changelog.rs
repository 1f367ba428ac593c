//! The change feed's outbox (`docs/changes.md`), the same on every backend: changes commit
//! with their batch (or not at all), take gap-free sequence numbers per partition in
//! commit order, include function outputs (live and backfilled), and folding them in
//! sequence order rebuilds the records.

use std::collections::BTreeMap;

use super::functions::{attach, del, marker, put, Log, TestCounter, TestMap};
use super::unique;
use crate::positions::PositionDelta;
use crate::record::change::{decode_change, encode_change};
use crate::record::{MetaValue, Metadata, Record};
use crate::sysdb::{
    BatchCommit, ChangeOp, ChangelogEntry, CollectionUpdate, OutboxChange, SnapshotStep, StepResult, Sysdb, SysdbError,
};

/// Every check below, in sequence.
pub async fn run_all(db: &Sysdb) {
    changes_commit_with_their_batch_in_sequence(db).await;
    function_outputs_join_the_feed_and_the_feed_rebuilds_the_records(db).await;
    a_snapshot_publishes_the_records_that_predate_the_feed(db).await;
    a_snapshot_step_and_batches_racing_keep_the_last_message_current(db).await;
}

/// A partition no other run uses: the outbox is keyed by partition alone (one log topic
/// per sysdb, as collections are), so checks on a shared database keep apart this way.
fn fresh_partition() -> i32 {
    1_000 + (uuid::Uuid::new_v4().as_u128() % 1_000_000_000) as i32
}

fn rec(id: &str, offset: i64) -> Record {
    Record {
        id: id.into(),
        embedding: Some(vec![offset as f32, 0.5].into()),
        metadata: Metadata::from_iter([("n".to_string(), MetaValue::Long(offset))]),
        document: Some(format!("{id}@{offset}")),
        offset,
    }
}

fn change(collection: &str, r: &Record, op: ChangeOp) -> OutboxChange {
    OutboxChange {
        collection_id: collection.into(),
        record_id: r.id.clone(),
        op,
        source_offset: r.offset,
        value: Some(encode_change(collection, r)),
    }
}

fn batch(
    topic: &str,
    p: i32,
    from: i64,
    to: i64,
    coll: &str,
    writes: Vec<(String, Option<Record>)>,
    changes: Vec<OutboxChange>,
) -> BatchCommit {
    let delta = writes.iter().map(|(_, w)| i64::from(w.is_some())).sum();
    BatchCommit {
        topic: topic.into(),
        delta: PositionDelta::new(p, from, to).expect("delta"),
        collections: vec![CollectionUpdate {
            id: coll.into(),
            partition: p,
            dimension: Some(2),
            log_position: to - 1,
            record_count_delta: delta,
            writes,
        }],
        functions: Vec::new(),
        changelog: true,
        changes,
    }
}

async fn pending(db: &Sysdb, p: i32) -> Vec<ChangelogEntry> {
    db.changelog_pending(p, -1, usize::MAX, usize::MAX).await.expect("changelog_pending")
}

pub async fn changes_commit_with_their_batch_in_sequence(db: &Sysdb) {
    let (topic, coll, p) = (unique("cl-topic"), unique("cl-coll"), fresh_partition());
    db.init_position(&topic, p, 0).await.expect("init");
    let (a, b, a2) = (rec("a", 0), rec("b", 1), rec("a", 2));
    let first = vec![
        change(&coll, &a, ChangeOp::Insert),
        change(&coll, &b, ChangeOp::Insert),
        change(&coll, &a2, ChangeOp::Update),
    ];
    db.commit_batch(batch(
        &topic,
        p,
        0,
        3,
        &coll,
        vec![("a".into(), Some(a2.clone())), ("b".into(), Some(b.clone()))],
        first.clone(),
    ))
    .await
    .expect("first batch");
    let rows = pending(db, p).await;
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1, 2], "sequence numbers from 0, in order");
    assert_eq!(rows.iter().map(|r| r.change.clone()).collect::<Vec<_>>(), first, "changes stored as given");

    // A zombie's batch (CAS refused) leaves no change behind; so does a batch without the feed.
    let zombie = batch(
        &topic,
        p,
        0,
        5,
        &coll,
        vec![("z".into(), Some(rec("z", 4)))],
        vec![change(&coll, &rec("z", 4), ChangeOp::Insert)],
    );
    assert!(matches!(db.commit_batch(zombie).await, Err(SysdbError::Conflict(_))), "a stale batch must conflict");
    let mut off = batch(&topic, p, 3, 4, &coll, vec![("c".into(), Some(rec("c", 3)))], Vec::new());
    off.changelog = false;
    db.commit_batch(off).await.expect("batch without the feed");
    assert_eq!(pending(db, p).await.len(), 3, "a refused batch or one without the feed adds no change");

    let deleted = OutboxChange {
        collection_id: coll.clone(),
        record_id: "b".into(),
        op: ChangeOp::Delete,
        source_offset: 4,
        value: None,
    };
    let more = vec![change(&coll, &rec("d", 5), ChangeOp::Insert), deleted.clone()];
    db.commit_batch(batch(&topic, p, 4, 6, &coll, vec![("b".into(), None), ("d".into(), Some(rec("d", 5)))], more))
        .await
        .expect("second batch");
    let after = db.changelog_pending(p, 2, usize::MAX, usize::MAX).await.expect("pending after 2");
    assert_eq!(after.iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4], "the next batch continues the sequence");
    assert_eq!(after[1].change, deleted, "a delete is stored without a value");
    let one = db.changelog_pending(p, -1, 10, 1).await.expect("pending bounded in bytes");
    assert_eq!(one.len(), 1, "a byte bound below one change still returns that change");
    let two = db.changelog_pending(p, -1, 2, usize::MAX).await.expect("pending bounded in records");
    assert_eq!(two.len(), 2);

    // The bound counts the bytes of what is not published yet.
    let all = pending(db, p).await;
    let bytes = |rows: &[ChangelogEntry]| rows.iter().map(|r| r.change.bytes() as i64).sum::<i64>();
    assert_eq!(db.changelog_unpublished_bytes(p).await.expect("bytes"), bytes(&all), "every change's bytes");
    assert_eq!(db.changelog_unpublished_bytes(fresh_partition()).await.expect("bytes"), 0, "no changes, no bytes");

    // Progress: a copy that never goes back; published rows deleted in bounded steps.
    db.changelog_mark_published(p, 2).await.expect("mark published");
    db.changelog_mark_published(p, 1).await.expect("mark published lower");
    let pos = db.changelog_positions().await.expect("positions").into_iter().find(|x| x.partition == p).expect("row");
    assert_eq!((pos.next_seq, pos.published_seq, pos.outbox_records), (5, 2, 5), "{pos:?}");
    assert_eq!(pos.oldest_unpublished_ms, Some(after[0].created_at_ms));
    assert_eq!(pos.unpublished_bytes, bytes(&all[3..]), "published changes leave the bound");
    assert_eq!(db.changelog_unpublished_bytes(p).await.expect("bytes"), bytes(&all[3..]));
    assert_eq!(db.changelog_trim(p, 2, 2).await.expect("trim"), 2, "a trim step deletes at most its bound");
    assert_eq!(db.changelog_trim(p, 2, 2).await.expect("trim"), 1);
    assert_eq!(db.changelog_trim(p, 2, 2).await.expect("trim"), 0, "nothing unpublished is deleted");
    assert_eq!(pending(db, p).await.iter().map(|r| r.seq).collect::<Vec<_>>(), [3, 4]);
    assert_eq!(db.changelog_unpublished_bytes(p).await.expect("bytes"), bytes(&all[3..]), "trimming changes no bound");
    db.changelog_mark_published(p, 4).await.expect("mark all published");
    assert_eq!(db.changelog_unpublished_bytes(p).await.expect("bytes"), 0, "all published: nothing held");
}

/// Fold changes in sequence order into `(collection, id) -> record`.
fn fold(rows: &[ChangelogEntry], into: &mut BTreeMap<(String, String), Record>) {
    fold_with(rows, into, true)
}

/// Fold changes and snapshot messages in sequence order; a delete of a record the feed
/// never showed is fine here (it predates the feed and the snapshot had not reached it).
fn fold_lenient(rows: &[ChangelogEntry], into: &mut BTreeMap<(String, String), Record>) {
    fold_with(rows, into, false)
}

/// The fold of both: `strict` = a delete must name a record the feed showed.
fn fold_with(rows: &[ChangelogEntry], into: &mut BTreeMap<(String, String), Record>, strict: bool) {
    for r in rows {
        let key = (r.change.collection_id.clone(), r.change.record_id.clone());
        match &r.change.value {
            Some(v) => {
                let (c, record) = decode_change(v).expect("a change value decodes");
                assert_eq!((&c, &record.id), (&key.0, &key.1), "value and key name the same record");
                into.insert(key, record);
            }
            None => {
                let removed = into.remove(&key).is_some();
                assert!(removed || !strict, "seq {}: a delete of {key:?}, which the feed never showed", r.seq);
            }
        }
    }
}

async fn records_of(db: &Sysdb, collections: &[&str]) -> BTreeMap<(String, String), Record> {
    let mut out = BTreeMap::new();
    for c in collections {
        for r in db.list_records(c, None, usize::MAX).await.expect("list_records") {
            out.insert((c.to_string(), r.id.clone()), r);
        }
    }
    out
}

pub async fn function_outputs_join_the_feed_and_the_feed_rebuilds_the_records(db: &Sysdb) {
    let p = fresh_partition();
    let mut log = Log::new(db, p).await;
    log.changelog = true;
    log.commit(db, &[put("a", "red"), put("b", "blue"), put("c", "red")], &[]).await;
    let counter = attach(db, &log, "test_counter", &unique("cl-count")).await;
    let map = attach(db, &log, "test_map", &unique("cl-map")).await;
    let fns: &[(&str, &dyn crate::functions::Function)] = &[(&counter.id, &TestCounter), (&map.id, &TestMap)];
    log.commit(db, &[marker(&counter), marker(&map), put("b", "red")], fns).await;
    // Backfill chunks with the feed on, interleaved with live batches.
    for (f, imp) in [(&counter, &TestCounter as &dyn crate::functions::Function), (&map, &TestMap)] {
        let mut cursor = None;
        loop {
            let limit = crate::sysdb::ChunkLimit { records: 1, bytes: usize::MAX, changelog: true };
            match db.backfill_step(&f.id, cursor.as_deref(), limit, imp).await.expect("backfill_step") {
                StepResult::Applied { cursor: c, finished, .. } => {
                    cursor = c;
                    if finished {
                        break;
                    }
                }
                other => panic!("backfill of {}: {other:?}", f.id),
            }
            log.commit(db, &[put("d", "green"), del("a")], fns).await;
        }
    }
    log.commit(db, &[del("c"), put("e", "blue"), put("b", "blue")], fns).await;

    let rows = pending(db, p).await;
    assert_eq!(
        rows.iter().map(|r| r.seq).collect::<Vec<_>>(),
        (0..rows.len() as i64).collect::<Vec<_>>(),
        "sequence numbers without a hole"
    );
    let mut folded = BTreeMap::new();
    fold(&rows, &mut folded);
    let want = records_of(db, &[&log.collection, &counter.output_collection, &map.output_collection]).await;
    assert_eq!(folded, want, "the feed folded in sequence order is the records, outputs included");
    let outputs = rows.iter().filter(|r| r.change.collection_id == counter.output_collection).count();
    assert!(outputs > 0, "the counter's output changes are in the feed");
    // An output dropped by a detach leaves the feed too: a delete of each of its records.
    db.detach_function_feeding(&map.id, true, true).await.expect("detach").expect("known");
    let rest =
        db.changelog_pending(p, rows.last().map_or(-1, |r| r.seq), usize::MAX, usize::MAX).await.expect("pending");
    assert!(!rest.is_empty() && rest.iter().all(|r| r.change.value.is_none() && r.change.source_offset == -1));
    fold(&rest, &mut folded);
    let want = records_of(db, &[&log.collection, &counter.output_collection, &map.output_collection]).await;
    assert_eq!(folded, want, "after the detach, the folded feed is the records without the dropped output");
    // The input collection's changes: one per applied record, in offset order per record.
    let mut last: BTreeMap<&str, i64> = BTreeMap::new();
    for r in rows.iter().filter(|r| r.change.collection_id == log.collection) {
        let prev = last.insert(&r.change.record_id, r.change.source_offset);
        assert!(
            prev.is_none_or(|o| o < r.change.source_offset),
            "changes of {} out of offset order",
            r.change.record_id
        );
    }
}

async fn snapshot_to_the_end(db: &Sysdb, p: i32, max_records: usize) -> Vec<SnapshotStep> {
    let mut steps = Vec::new();
    loop {
        let step = db.changelog_snapshot_step(p, max_records, usize::MAX).await.expect("snapshot step");
        let done = matches!(step, SnapshotStep::Appended { finished: true, .. } | SnapshotStep::Idle);
        steps.push(step);
        if done {
            return steps;
        }
        assert!(steps.len() < 1_000, "a snapshot never ends: {steps:?}");
    }
}

/// Records written while the feed was off get a snapshot once the feed starts for their
/// partition: walked in (collection, id) chunks, each message the record's state as the
/// step read it (operation `snapshot`, source offset the record's own), with live changes
/// between chunks; the last message of every record is its current state. A partition
/// without records gets none; `changelog_request_snapshot` asks again.
pub async fn a_snapshot_publishes_the_records_that_predate_the_feed(db: &Sysdb) {
    let p = fresh_partition();
    let mut a = Log::new(db, p).await;
    let mut b = Log::new(db, p).await;
    a.commit(db, &[put("a1", "red"), put("a2", "blue"), put("a3", "red"), put("a4", "green")], &[]).await;
    b.commit(db, &[put("b1", "red"), put("b2", "blue"), put("b3", "blue")], &[]).await;
    assert!(pending(db, p).await.is_empty(), "the feed was off: nothing in the outbox");
    assert_eq!(db.changelog_snapshot_step(p, 10, usize::MAX).await.expect("step"), SnapshotStep::Idle, "none asked");

    let empty = fresh_partition();
    assert_eq!(db.changelog_begin(&[p, empty]).await.expect("begin"), [p], "only a partition with records");
    assert_eq!(db.changelog_begin(&[p, empty]).await.expect("begin"), Vec::<i32>::new(), "once per partition");
    assert!(db.changelog_snapshot_pending(p).await.expect("pending"));
    assert!(!db.changelog_snapshot_pending(empty).await.expect("pending"));

    // The first chunk, then live changes: one the snapshot passed, one ahead of its cursor.
    let first = db.changelog_snapshot_step(p, 3, usize::MAX).await.expect("step");
    let (lo, hi) = if a.collection < b.collection {
        (a.collection.clone(), b.collection.clone())
    } else {
        (b.collection.clone(), a.collection.clone())
    };
    let SnapshotStep::Appended { records: 3, finished: false, total: 3, cursor: Some((c, _)), .. } = &first else {
        panic!("a first chunk of 3 records: {first:?}")
    };
    assert_eq!(c, &lo, "the walk starts at the lowest collection id");
    a.changelog = true;
    b.changelog = true;
    let (passed, ahead) = (if lo == a.collection { "a1" } else { "b1" }, "zz");
    if lo == a.collection {
        a.commit(db, &[put(passed, "black"), put(ahead, "white")], &[]).await;
        b.commit(db, &[del("b3")], &[]).await;
    } else {
        b.commit(db, &[put(passed, "black"), put(ahead, "white")], &[]).await;
        a.commit(db, &[del("a4")], &[]).await;
    }
    let steps = snapshot_to_the_end(db, p, 2).await;
    assert!(!db.changelog_snapshot_pending(p).await.expect("pending"), "finished: {steps:?}");
    let rows = pending(db, p).await;
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), (0..rows.len() as i64).collect::<Vec<_>>());
    for r in rows.iter().filter(|r| r.change.op == ChangeOp::Snapshot) {
        let (_, record) = decode_change(r.change.value.as_ref().expect("a snapshot has a value")).expect("decodes");
        assert_eq!(r.change.source_offset, record.offset, "a snapshot message's source offset is the record's own");
    }
    let snapshotted: Vec<(String, String)> = rows
        .iter()
        .filter(|r| r.change.op == ChangeOp::Snapshot)
        .map(|r| (r.change.collection_id.clone(), r.change.record_id.clone()))
        .collect();
    let mut sorted = snapshotted.clone();
    sorted.sort();
    assert_eq!(snapshotted, sorted, "the walk goes in (collection, id) order");
    assert!(snapshotted.contains(&(lo.clone(), ahead.to_string())), "a record inserted ahead of the cursor");
    assert_eq!(snapshotted.len(), 4 + 3 + 1 - 1, "every record once (one deleted ahead of the walk, one inserted)");
    let mut folded = BTreeMap::new();
    fold_lenient(&rows, &mut folded);
    assert_eq!(folded, records_of(db, &[&lo, &hi]).await, "the last message is the state");
    let pos = db.changelog_positions().await.expect("positions").into_iter().find(|x| x.partition == p).expect("row");
    assert!(!pos.snapshot.pending() && pos.snapshot.finished_at_ms.is_some(), "{pos:?}");
    assert_eq!(pos.snapshot.records, snapshotted.len() as i64);
    assert_eq!(db.changelog_snapshot_step(p, 10, usize::MAX).await.expect("step"), SnapshotStep::Idle);

    // Asked again: every record once more, after everything before.
    let before = rows.len() as i64;
    db.changelog_request_snapshot(&[p]).await.expect("request");
    let pos = db.changelog_positions().await.expect("positions").into_iter().find(|x| x.partition == p).expect("row");
    assert!(pos.snapshot.pending() && pos.snapshot.records == 0, "{pos:?}");
    snapshot_to_the_end(db, p, 1_000).await;
    let again = db.changelog_pending(p, before - 1, usize::MAX, usize::MAX).await.expect("pending");
    assert!(again.iter().all(|r| r.change.op == ChangeOp::Snapshot));
    let mut refolded = BTreeMap::new();
    fold_lenient(&again, &mut refolded);
    assert_eq!(refolded, records_of(db, &[&lo, &hi]).await, "a snapshot alone is the state");
    // A bound in bytes below one record still moves: one record per step.
    db.changelog_request_snapshot(&[p]).await.expect("request");
    let one = db.changelog_snapshot_step(p, 100, 1).await.expect("step");
    assert!(matches!(one, SnapshotStep::Appended { records: 1, finished: false, .. }), "{one:?}");
    snapshot_to_the_end(db, p, 1_000).await;
}

/// Batches that update records while snapshot steps of their partition run at the same
/// time (on PostgreSQL really concurrently, on separate connections): whatever the
/// interleaving, the last message of each record is its current state.
pub async fn a_snapshot_step_and_batches_racing_keep_the_last_message_current(db: &Sysdb) {
    let p = fresh_partition();
    let mut log = Log::new(db, p).await;
    let ids: Vec<String> = (0..40).map(|i| format!("r{i:02}")).collect();
    let ops: Vec<_> = ids.iter().map(|id| put(id, "red")).collect();
    log.commit(db, &ops, &[]).await;
    assert_eq!(db.changelog_begin(&[p]).await.expect("begin"), [p]);
    log.changelog = true;
    let colors = ["blue", "green", "black"];
    let mut finished = false;
    for round in 0.. {
        let ops =
            [put(&ids[(round * 7) % 40], colors[round % 3]), put(&ids[(round * 3 + 1) % 40], colors[(round + 1) % 3])];
        let (_, step) = tokio::join!(log.commit(db, &ops, &[]), db.changelog_snapshot_step(p, 2, usize::MAX));
        if matches!(step.expect("snapshot step"), SnapshotStep::Appended { finished: true, .. }) {
            finished = true;
        }
        if finished && round >= 20 {
            break;
        }
        assert!(round < 200, "the snapshot never finished");
    }
    let rows = pending(db, p).await;
    assert_eq!(rows.iter().map(|r| r.seq).collect::<Vec<_>>(), (0..rows.len() as i64).collect::<Vec<_>>());
    let mut folded = BTreeMap::new();
    fold_lenient(&rows, &mut folded);
    assert_eq!(folded, records_of(db, &[&log.collection]).await, "the last message of every record is its state");
}
