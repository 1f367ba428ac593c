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
    BatchCommit, ChangeOp, ChangelogEntry, CollectionUpdate, OutboxChange, StepResult, Sysdb, SysdbError,
};

/// Every check below, in sequence.
pub async fn run_all(db: &Sysdb) {
    changes_commit_with_their_batch_in_sequence(db).await;
    function_outputs_join_the_feed_and_the_feed_rebuilds_the_records(db).await;
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
    for r in rows {
        let key = (r.change.collection_id.clone(), r.change.record_id.clone());
        match &r.change.value {
            Some(v) => {
                let (c, record) = decode_change(v).expect("a change value decodes");
                assert_eq!((&c, &record.id), (&key.0, &key.1), "value and key name the same record");
                into.insert(key, record);
            }
            None => {
                assert!(into.remove(&key).is_some(), "seq {}: a delete of {key:?}, which the feed never showed", r.seq);
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
