//! Backend-independent conformance suite for [`Sysdb`]: every backend must pass it.
//!
//! Run for SQLite by the unit tests in `sqlite/tests.rs` and for PostgreSQL by
//! `integration-tests/tests/it/sysdb_postgres.rs`. Every check uses its own random topic and
//! collection names, so the suite can run against a shared database, concurrently with
//! other runs, and never needs a clean one. Checks panic with a message naming the
//! behaviour that broke.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use super::stored_fields::metadata_bit_eq;
use super::{
    BatchCommit, CollectionRow, CollectionUpdate, CommitReport, ErrorClass, PartitionState, Sysdb, SysdbError,
};
use crate::positions::{IncompatibleDelta, PositionDelta};
use crate::record::{Embedding, MetaValue, Metadata, Record};

pub mod changelog;
pub mod functions;

/// A name no other run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{}", uuid::Uuid::new_v4().simple())
}

fn record(id: &str, offset: i64, embedding: Option<Vec<f32>>) -> Record {
    let mut metadata = Metadata::new();
    metadata.insert("offset".into(), MetaValue::Long(offset));
    Record {
        id: id.into(),
        embedding: embedding.map(Embedding::from),
        metadata,
        document: Some(format!("doc {id} at {offset}")),
        offset,
    }
}

fn upsert(r: Record) -> (String, Option<Record>) {
    (r.id.clone(), Some(r))
}

fn delete(id: &str) -> (String, Option<Record>) {
    (id.to_string(), None)
}

fn batch(topic: &str, partition: i32, from: i64, to: i64, collections: Vec<CollectionUpdate>) -> BatchCommit {
    BatchCommit {
        topic: topic.into(),
        delta: PositionDelta::new(partition, from, to).expect("valid delta"),
        collections,
        functions: Vec::new(),
        changelog: false,
        changes: Vec::new(),
    }
}

fn update(
    id: &str,
    partition: i32,
    dimension: Option<u32>,
    log_position: i64,
    delta: i64,
    writes: Vec<(String, Option<Record>)>,
) -> CollectionUpdate {
    CollectionUpdate { id: id.into(), partition, dimension, log_position, record_count_delta: delta, writes }
}

async fn all_records(db: &Sysdb, collection: &str) -> Vec<Record> {
    db.list_records(collection, None, usize::MAX).await.expect("list_records")
}

fn assert_records_bit_eq(got: &Record, want: &Record, what: &str) {
    assert_eq!(got.id, want.id, "{what}: id");
    assert_eq!(got.document, want.document, "{what}: document");
    assert_eq!(got.offset, want.offset, "{what}: offset");
    assert!(
        metadata_bit_eq(&got.metadata, &want.metadata),
        "{what}: metadata\n got  {:?}\n want {:?}",
        got.metadata,
        want.metadata
    );
    let bits = |e: &Option<Embedding>| e.as_ref().map(|v| v.iter().map(f32::to_bits).collect::<Vec<_>>());
    assert_eq!(bits(&got.embedding), bits(&want.embedding), "{what}: embedding bits");
}

fn expect_conflict<T>(result: Result<T, SysdbError>, want: IncompatibleDelta, what: &str) {
    match result {
        Err(SysdbError::Conflict(got)) => assert_eq!(got, want, "{what}"),
        Err(e) => panic!("{what}: expected Conflict({want:?}), got error {e}"),
        Ok(_) => panic!("{what}: expected Conflict({want:?}), but the commit succeeded"),
    }
}

/// Every check below, in sequence.
pub async fn run_all(db: &Sysdb) {
    schema_is_migrated(db).await;
    topic_partitions_round_trip(db).await;
    init_position_returns_the_existing_value(db).await;
    commit_batch_applies_records_collections_and_position(db).await;
    cas_conflict_leaves_everything_untouched(db).await;
    commit_without_a_position_row_is_refused(db).await;
    concurrent_commits_with_the_same_from(db).await;
    gaps_move_the_position_and_are_listed(db).await;
    reset_is_audited_and_returns_the_previous_value(db).await;
    dlq_replays_are_recorded_once(db).await;
    halts_are_stored_listed_and_cleared_by_a_reset(db).await;
    refused_values_are_record_errors_that_leave_the_position(db).await;
    a_stale_batch_with_a_refused_value_is_a_conflict(db).await;
    list_records_pages_in_id_order(db).await;
    get_records_returns_only_present_ids(db).await;
    get_records_many_reads_several_collections_at_once(db).await;
    collections_named_reads_only_the_named_ones(db).await;
    metadata_round_trips_exactly(db).await;
    embeddings_round_trip_bit_exact(db).await;
    a_batch_of_many_megabytes_is_written_whole(db).await;
    functions::run_all(db).await;
    changelog::run_all(db).await;
}

pub async fn schema_is_migrated(db: &Sysdb) {
    assert!(db.schema_version().await.expect("schema_version") >= 1, "no migration applied");
}

/// Opening the same database again applies nothing and sees the same data.
pub async fn reopen_is_idempotent(db: &Sysdb, url: &str) {
    let topic = unique("reopen");
    db.init_position(&topic, 0, 42).await.expect("init");
    let version = db.schema_version().await.expect("schema_version");
    let again = Sysdb::open(url).await.expect("second open of a migrated database");
    assert_eq!(again.schema_version().await.expect("schema_version"), version, "reopen changed the schema version");
    assert_eq!(again.positions(&topic).await.expect("positions"), HashMap::from([(0, 42)]), "reopen lost data");
    let third = Sysdb::open(url).await.expect("third open");
    assert_eq!(third.schema_version().await.expect("schema_version"), version);
}

pub async fn topic_partitions_round_trip(db: &Sysdb) {
    let topic = unique("meta");
    assert_eq!(db.topic_partitions(&topic).await.expect("read"), None);
    db.set_topic_partitions(&topic, 12).await.expect("set");
    assert_eq!(db.topic_partitions(&topic).await.expect("read"), Some(12));
    db.set_topic_partitions(&topic, 24).await.expect("overwrite");
    assert_eq!(db.topic_partitions(&topic).await.expect("read"), Some(24));
}

pub async fn init_position_returns_the_existing_value(db: &Sysdb) {
    let topic = unique("init");
    assert!(db.positions(&topic).await.expect("positions").is_empty());
    assert_eq!(db.init_position(&topic, 0, 5).await.expect("init"), 5);
    assert_eq!(db.init_position(&topic, 0, 9).await.expect("init again"), 5, "init_position overwrote an existing row");
    assert_eq!(db.init_position(&topic, 1, 0).await.expect("init p1"), 0);
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 5), (1, 0)]));
    assert!(db.init_position(&topic, 2, -1).await.is_err(), "negative next_offset accepted");
}

pub async fn commit_batch_applies_records_collections_and_position(db: &Sysdb) {
    let topic = unique("happy");
    let (c1, c2) = (unique("coll"), unique("coll"));
    db.init_position(&topic, 3, 0).await.expect("init");

    let a = record("a", 0, Some(vec![1.0, 2.0, 3.0]));
    let b = record("b", 1, Some(vec![4.0, 5.0, 6.0]));
    let c = record("c", 2, None);
    let x = record("x", 3, None);
    db.commit_batch(batch(
        &topic,
        3,
        0,
        4,
        vec![
            update(&c1, 3, Some(3), 2, 3, vec![upsert(a.clone()), upsert(b.clone()), upsert(c.clone())]),
            update(&c2, 3, None, 3, 1, vec![upsert(x.clone())]),
        ],
    ))
    .await
    .expect("first commit");

    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(3, 4)]), "next_offset not moved");
    assert_eq!(
        db.collection(&c1).await.expect("collection"),
        Some(CollectionRow { id: c1.clone(), partition: 3, dimension: Some(3), log_position: 2, record_count: 3 })
    );
    assert_eq!(
        db.collection(&c2).await.expect("collection"),
        Some(CollectionRow { id: c2.clone(), partition: 3, dimension: None, log_position: 3, record_count: 1 })
    );
    let got = all_records(db, &c1).await;
    assert_eq!(got.len(), 3);
    for (g, w) in got.iter().zip([&a, &b, &c]) {
        assert_records_bit_eq(g, w, "first commit");
    }

    // Second batch: delete a, replace b, insert d; c2 gets its dimension; c1's dimension
    // is already set and must not change; a listed partition never moves an existing row.
    let b2 = Record {
        metadata: Metadata::from_iter([("k".to_string(), MetaValue::Bool(true))]),
        ..record("b", 5, Some(vec![7.0, 8.0, 9.0]))
    };
    let d = record("d", 6, Some(vec![0.5, 0.25, 0.125]));
    let y = record("y", 7, Some(vec![1.0, 1.0]));
    db.commit_batch(batch(
        &topic,
        3,
        4,
        9,
        vec![
            update(&c1, 9, Some(99), 6, 0, vec![delete("a"), upsert(b2.clone()), upsert(d.clone())]),
            update(&c2, 3, Some(2), 7, 1, vec![upsert(y.clone())]),
        ],
    ))
    .await
    .expect("second commit");

    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(3, 9)]));
    let row1 = db.collection(&c1).await.expect("collection").expect("c1 exists");
    assert_eq!(row1.dimension, Some(3), "dimension changed once set");
    assert_eq!(row1.partition, 3, "partition of an existing collection changed");
    assert_eq!((row1.log_position, row1.record_count), (6, 3));
    let row2 = db.collection(&c2).await.expect("collection").expect("c2 exists");
    assert_eq!(
        (row2.dimension, row2.log_position, row2.record_count),
        (Some(2), 7, 2),
        "dimension not set on first embedding"
    );

    let got = all_records(db, &c1).await;
    assert_eq!(got.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["b", "c", "d"], "delete/upsert");
    assert_records_bit_eq(&got[0], &b2, "replaced record");
    assert_records_bit_eq(&got[2], &d, "inserted record");

    // An empty delta still passes the CAS; deleting an absent id is a no-op.
    db.commit_batch(batch(&topic, 3, 9, 9, vec![update(&c1, 3, None, 6, 0, vec![delete("never")])]))
        .await
        .expect("empty delta");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(3, 9)]));

    let listed: Vec<_> =
        db.collections().await.expect("collections").into_iter().filter(|c| c.id == c1 || c.id == c2).collect();
    assert_eq!(listed.len(), 2, "collections() lists both");
    assert!(listed.windows(2).all(|w| w[0].id < w[1].id), "collections() in id order");
}

pub async fn cas_conflict_leaves_everything_untouched(db: &Sysdb) {
    let topic = unique("cas");
    let (coll, fresh) = (unique("coll"), unique("coll"));
    db.init_position(&topic, 0, 0).await.expect("init");
    db.commit_batch(batch(
        &topic,
        0,
        0,
        5,
        vec![update(&coll, 0, None, 4, 2, vec![upsert(record("a", 3, None)), upsert(record("b", 4, None))])],
    ))
    .await
    .expect("setup commit");
    let records_before = all_records(db, &coll).await;
    let row_before = db.collection(&coll).await.expect("collection");

    let stale = |from: i64| {
        batch(
            &topic,
            0,
            from,
            from + 10,
            vec![
                update(
                    &coll,
                    0,
                    Some(8),
                    99,
                    5,
                    vec![delete("a"), upsert(record("b", 99, Some(vec![0.0; 8]))), upsert(record("z", 99, None))],
                ),
                update(&fresh, 0, Some(8), 99, 1, vec![upsert(record("q", 99, None))]),
            ],
        )
    };
    expect_conflict(
        db.commit_batch(stale(3)).await,
        IncompatibleDelta::PositionMoved { partition: 0, expected: 3, stored: 5 },
        "batch behind the stored position",
    );
    expect_conflict(
        db.commit_batch(stale(6)).await,
        IncompatibleDelta::PositionMoved { partition: 0, expected: 6, stored: 5 },
        "batch ahead of the stored position",
    );

    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 5)]), "conflict moved the position");
    assert_eq!(db.collection(&coll).await.expect("collection"), row_before, "conflict changed the collection row");
    assert_eq!(db.collection(&fresh).await.expect("collection"), None, "conflict created a collection");
    assert!(all_records(db, &fresh).await.is_empty(), "conflict wrote records of a new collection");
    let after = all_records(db, &coll).await;
    assert_eq!(after.len(), records_before.len(), "conflict changed the records");
    for (g, w) in after.iter().zip(&records_before) {
        assert_records_bit_eq(g, w, "records after a conflict");
    }
}

pub async fn commit_without_a_position_row_is_refused(db: &Sysdb) {
    let topic = unique("missing");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init another partition");
    expect_conflict(
        db.commit_batch(batch(&topic, 7, 0, 3, vec![update(&coll, 7, None, 2, 1, vec![upsert(record("a", 2, None))])]))
            .await,
        IncompatibleDelta::Missing { partition: 7, expected: 0 },
        "commit on a partition without a row",
    );
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 0)]), "a row was created");
    assert_eq!(db.collection(&coll).await.expect("collection"), None);
    assert!(all_records(db, &coll).await.is_empty());
}

/// Two commits with the same `from`, issued at the same time (on one handle): in every
/// round exactly one wins, and only the winner's writes are visible.
pub async fn concurrent_commits_with_the_same_from(db: &Sysdb) {
    concurrent_commits(db, db).await;
}

/// The same race between two handles on one database (two processes sharing a SQLite
/// file, two replicas' pools on one PostgreSQL).
pub async fn concurrent_commits_from_two_handles(a: &Sysdb, b: &Sysdb) {
    concurrent_commits(a, b).await;
}

async fn concurrent_commits(a: &Sysdb, b: &Sysdb) {
    const ROUNDS: i64 = 8;
    let topic = unique("race");
    let coll = unique("coll");
    a.init_position(&topic, 0, 0).await.expect("init");
    let mut wins = [0, 0];
    let mut expected_ids = Vec::new();
    for round in 0..ROUNDS {
        let (from, to) = (round * 10, round * 10 + 10);
        let side = |name: &str| {
            let records: Vec<_> = (0..50)
                .map(|i| upsert(record(&format!("{name}-{round:02}-{i:02}"), to - 1, Some(vec![round as f32; 4]))))
                .collect();
            batch(&topic, 0, from, to, vec![update(&coll, 0, Some(4), to - 1, 50, records)])
        };
        let (ba, bb) = (side("a"), side("b"));
        let (ra, rb) = tokio::join!(a.commit_batch(ba.clone()), b.commit_batch(bb.clone()));
        let conflict = IncompatibleDelta::PositionMoved { partition: 0, expected: from, stored: to };
        let winner = match (ra, rb) {
            (Ok(_), Err(e)) => {
                expect_conflict::<CommitReport>(Err(e), conflict, "loser of the race");
                "a"
            }
            (Err(e), Ok(_)) => {
                expect_conflict::<CommitReport>(Err(e), conflict, "loser of the race");
                "b"
            }
            (Ok(_), Ok(_)) => panic!("round {round}: both commits with from={from} succeeded"),
            (Err(x), Err(y)) => panic!("round {round}: both commits failed: {x} / {y}"),
        };
        wins[usize::from(winner == "b")] += 1;
        expected_ids.extend((0..50).map(|i| format!("{winner}-{round:02}-{i:02}")));
    }
    expected_ids.sort();
    let got: Vec<String> = all_records(a, &coll).await.into_iter().map(|r| r.id).collect();
    assert_eq!(got, expected_ids, "records other than the winners' were written");
    assert_eq!(a.positions(&topic).await.expect("positions"), HashMap::from([(0, ROUNDS * 10)]));
    let row = a.collection(&coll).await.expect("collection").expect("exists");
    assert_eq!(row.record_count, ROUNDS * 50, "a loser's count delta was applied");
    tracing::debug!(?wins, "race winners (a, b)");
}

pub async fn gaps_move_the_position_and_are_listed(db: &Sysdb) {
    let topic = unique("gap");
    db.init_position(&topic, 1, 10).await.expect("init");
    db.record_gap(&topic, 1, 10, 50).await.expect("record gap");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(1, 50)]));
    let gaps = db.gaps(&topic).await.expect("gaps");
    assert_eq!(gaps.len(), 1);
    let g = &gaps[0];
    assert_eq!((g.topic.as_str(), g.partition, g.from_offset, g.to_offset), (topic.as_str(), 1, 10, 50));
    assert!(g.recorded_at_ms > 0, "gap time not recorded");

    expect_conflict(
        db.record_gap(&topic, 1, 10, 60).await,
        IncompatibleDelta::PositionMoved { partition: 1, expected: 10, stored: 50 },
        "stale gap",
    );
    expect_conflict(
        db.record_gap(&topic, 2, 0, 5).await,
        IncompatibleDelta::Missing { partition: 2, expected: 0 },
        "gap without a row",
    );
    assert!(db.record_gap(&topic, 1, 50, 40).await.is_err(), "backwards gap accepted");
    assert_eq!(db.gaps(&topic).await.expect("gaps").len(), 1, "a refused gap was recorded");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(1, 50)]));
    assert!(db.gaps(&unique("gap")).await.expect("gaps").is_empty(), "gaps of another topic listed");
}

/// A DLQ replay is recorded once per (topic, DLQ partition, offset): a second record of
/// the same entry changes nothing and says so; other topics are not listed.
pub async fn dlq_replays_are_recorded_once(db: &Sysdb) {
    use crate::sysdb::DlqReplayRow;
    let topic = unique("dlq");
    let row = |p: i32, o: i64, lp: i32, lo: i64, at: i64| DlqReplayRow {
        topic: topic.clone(),
        dlq_partition: p,
        dlq_offset: o,
        replayed_at_ms: at,
        log_partition: lp,
        log_offset: lo,
    };
    assert!(db.dlq_replays(&topic).await.expect("replays").is_empty());
    assert!(db.record_dlq_replay(&row(1, 7, 0, 100, 5)).await.expect("record"));
    assert!(db.record_dlq_replay(&row(0, 9, 1, 200, 6)).await.expect("record"));
    assert!(!db.record_dlq_replay(&row(1, 7, 1, 300, 7)).await.expect("record again"), "a second record was accepted");
    assert_eq!(db.dlq_replays(&topic).await.expect("replays"), vec![row(0, 9, 1, 200, 6), row(1, 7, 0, 100, 5)]);
    assert!(db.dlq_replays(&unique("dlq")).await.expect("replays").is_empty(), "replays of another topic listed");
}

pub async fn reset_is_audited_and_returns_the_previous_value(db: &Sysdb) {
    let topic = unique("reset");
    assert_eq!(db.reset_position(&topic, 2, 100, "alice", "first start").await.expect("reset"), None);
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(2, 100)]));
    assert_eq!(db.reset_position(&topic, 2, 40, "bob", "replay").await.expect("reset back"), Some(100));
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(2, 40)]));

    let resets = db.resets(&topic).await.expect("resets");
    let summary: Vec<_> =
        resets.iter().map(|r| (r.partition, r.from_offset, r.to_offset, r.actor.as_str(), r.reason.as_str())).collect();
    assert_eq!(summary, [(2, None, 100, "alice", "first start"), (2, Some(100), 40, "bob", "replay")]);
    assert!(resets.iter().all(|r| r.topic == topic && r.at_ms > 0));

    // A batch started before the reset is now a zombie; one from the reset position wins.
    expect_conflict(
        db.commit_batch(batch(&topic, 2, 100, 110, vec![])).await,
        IncompatibleDelta::PositionMoved { partition: 2, expected: 100, stored: 40 },
        "batch from before the reset",
    );
    db.commit_batch(batch(&topic, 2, 40, 45, vec![])).await.expect("batch from the reset position");
    assert!(db.reset_position(&topic, 2, -1, "x", "y").await.is_err(), "negative reset accepted");
    assert_eq!(db.resets(&topic).await.expect("resets").len(), 2, "a refused reset was audited");
}

/// `set_partition_halted` stores and clears a halt, keeps the start time of a halt that
/// goes on, never touches `next_offset`, and `reset_position` clears it.
pub async fn halts_are_stored_listed_and_cleared_by_a_reset(db: &Sysdb) {
    let topic = unique("halt");
    let state = |partition: i32, next_offset: i64, reason: Option<&str>, at: Option<i64>| PartitionState {
        partition,
        next_offset,
        halted_reason: reason.map(str::to_string),
        halted_at_ms: at,
    };
    assert!(db.partition_states(&topic).await.expect("states").is_empty());
    db.init_position(&topic, 1, 7).await.expect("init p1");
    db.init_position(&topic, 0, 3).await.expect("init p0");
    assert_eq!(
        db.partition_states(&topic).await.expect("states"),
        [state(0, 3, None, None), state(1, 7, None, None)],
        "new rows run"
    );

    db.set_partition_halted(&topic, 1, Some("record refused: id holds U+0000")).await.expect("halt");
    let states = db.partition_states(&topic).await.expect("states");
    let at = states[1].halted_at_ms.expect("a halt has a time");
    assert!(at > 0);
    assert_eq!(states, [state(0, 3, None, None), state(1, 7, Some("record refused: id holds U+0000"), Some(at))]);

    // A halt that goes on keeps its start; a batch still commits past it if asked to.
    tokio::time::sleep(Duration::from_millis(5)).await;
    db.set_partition_halted(&topic, 1, Some("still refused")).await.expect("halt again");
    assert_eq!(db.partition_states(&topic).await.expect("states")[1], state(1, 7, Some("still refused"), Some(at)));
    db.commit_batch(batch(&topic, 1, 7, 9, vec![])).await.expect("commit on a halted partition");
    assert_eq!(
        db.partition_states(&topic).await.expect("states")[1],
        state(1, 9, Some("still refused"), Some(at)),
        "a commit changed the halt"
    );

    db.set_partition_halted(&topic, 1, None).await.expect("clear");
    assert_eq!(db.partition_states(&topic).await.expect("states")[1], state(1, 9, None, None));
    db.set_partition_halted(&topic, 1, None).await.expect("clearing twice is fine");

    db.set_partition_halted(&topic, 0, Some("operator look")).await.expect("halt p0");
    assert_eq!(db.reset_position(&topic, 0, 2, "ops", "skip back").await.expect("reset"), Some(3));
    assert_eq!(
        db.partition_states(&topic).await.expect("states"),
        [state(0, 2, None, None), state(1, 9, None, None)],
        "reset kept the halt"
    );

    assert!(db.set_partition_halted(&topic, 5, Some("x")).await.is_err(), "halted a partition without a row");
    db.set_partition_halted(&topic, 5, None).await.expect("clearing a missing row is a no-op");
    assert_eq!(db.partition_states(&topic).await.expect("states").len(), 2, "a halt created a row");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 2), (1, 9)]));
}

/// Incompressible text of `len` ASCII bytes (hex of a SHA-256 chain): a database cannot
/// shrink it below the index entry limit.
fn incompressible(len: usize) -> String {
    use sha2::{Digest, Sha256};
    let mut out = String::with_capacity(len + 64);
    let mut block = Sha256::digest(unique("seed").as_bytes());
    while out.len() < len {
        for b in block.iter() {
            out.push_str(&format!("{b:02x}"));
        }
        block = Sha256::digest(block);
    }
    out.truncate(len);
    out
}

/// Values the database itself refuses: on PostgreSQL an id with U+0000 (text cannot
/// hold it) and an id too large for the primary key's B-tree entry. The error is of class
/// `Record`, nothing of the batch is written and the position stays; a batch from the
/// same offset without the record then commits. SQLite stores both, which is why
/// validation refuses U+0000 before any backend sees it.
pub async fn refused_values_are_record_errors_that_leave_the_position(db: &Sysdb) {
    let topic = unique("refused");
    let coll = unique("coll");
    db.init_position(&topic, 0, 10).await.expect("init");
    let bad_ids = [format!("nul\0{}", unique("id")), incompressible(4000)];
    for bad in &bad_ids {
        let commit = db
            .commit_batch(batch(
                &topic,
                0,
                10,
                12,
                vec![update(
                    &coll,
                    0,
                    None,
                    11,
                    2,
                    vec![upsert(record("good", 10, None)), upsert(record(bad, 11, None))],
                )],
            ))
            .await;
        match db.backend() {
            "postgres" => {
                let err = commit.err().unwrap_or_else(|| panic!("postgres stored the id {:?}", &bad[..8]));
                assert_eq!(err.class(), ErrorClass::Record, "{err}");
                assert!(matches!(err, SysdbError::Rejected { .. }), "{err:?}");
                assert!(!err.is_retryable());
                assert_eq!(
                    db.positions(&topic).await.expect("positions"),
                    HashMap::from([(0, 10)]),
                    "a refused batch moved the position"
                );
                assert_eq!(
                    db.collection(&coll).await.expect("collection"),
                    None,
                    "a refused batch created its collection"
                );
            }
            _ => {
                commit.expect("sqlite stores any text");
                db.reset_position(&topic, 0, 10, "conformance", "again").await.expect("reset");
            }
        }
    }
    db.commit_batch(batch(
        &topic,
        0,
        10,
        12,
        vec![update(&coll, 0, None, 11, 1, vec![upsert(record("good", 10, None))])],
    ))
    .await
    .expect("the batch without the refused record commits");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 12)]));
    assert!(all_records(db, &coll).await.iter().any(|r| r.id == "good"));
}

/// A batch whose position has moved is a conflict even when it also holds a value the
/// database refuses: a zombie replica's stale batch must stop it, not send a record to
/// the DLQ. (PostgreSQL sends the position's check and the writes of a batch together,
/// so both fail there.)
pub async fn a_stale_batch_with_a_refused_value_is_a_conflict(db: &Sysdb) {
    let topic = unique("stale-refused");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    db.commit_batch(batch(&topic, 0, 0, 5, vec![update(&coll, 0, None, 4, 1, vec![upsert(record("a", 4, None))])]))
        .await
        .expect("setup commit");
    let bad = format!("nul\0{}", unique("id"));
    let stale = batch(
        &topic,
        0,
        0,
        5,
        vec![update(&coll, 0, None, 4, 2, vec![upsert(record("b", 3, None)), upsert(record(&bad, 4, None))])],
    );
    expect_conflict(
        db.commit_batch(stale).await,
        IncompatibleDelta::PositionMoved { partition: 0, expected: 0, stored: 5 },
        "a stale batch holding a refused value",
    );
    let ids: Vec<String> = all_records(db, &coll).await.into_iter().map(|r| r.id).collect();
    assert_eq!(ids, ["a"], "the stale batch wrote records");
    assert_eq!(db.positions(&topic).await.expect("positions"), HashMap::from([(0, 5)]));
}

/// One read of several collections by name: the known ones with their stored rows (as
/// `collection` returns them), the unknown ones missing, nothing else.
pub async fn collections_named_reads_only_the_named_ones(db: &Sysdb) {
    let topic = unique("named");
    let (a, b, other) = (unique("coll"), unique("coll"), unique("coll"));
    db.init_position(&topic, 2, 0).await.expect("init");
    db.commit_batch(batch(
        &topic,
        2,
        0,
        3,
        vec![
            update(&a, 2, Some(3), 0, 1, vec![upsert(record("r", 0, Some(vec![1.0, 2.0, 3.0])))]),
            update(&b, 2, None, 1, 1, vec![upsert(record("s", 1, None))]),
            update(&other, 2, None, 2, 1, vec![upsert(record("t", 2, None))]),
        ],
    ))
    .await
    .expect("commit");
    let missing = unique("missing");
    let got = db.collections_named(vec![a.clone(), b.clone(), missing.clone()]).await.expect("collections_named");
    assert_eq!(got.len(), 2, "{got:?}");
    for id in [&a, &b] {
        assert_eq!(got.get(id), db.collection(id).await.expect("collection").as_ref(), "{id}");
    }
    assert!(!got.contains_key(&missing) && !got.contains_key(&other));
    assert!(db.collections_named(Vec::new()).await.expect("empty").is_empty());
}

pub async fn list_records_pages_in_id_order(db: &Sysdb) {
    let topic = unique("page");
    let coll = unique("coll");
    let other = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    // Ids whose order differs between byte order and a locale collation.
    let mut ids: Vec<String> = ["B", "a", "a0", "a-", "Z9", "é", "e", "ü", "10", "9", "_x", "A b", "~", "中"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    ids.extend((0..23).map(|i| format!("n{:03}", (i * 37) % 101)));
    let writes: Vec<_> = ids.iter().map(|id| upsert(record(id, 1, None))).collect();
    db.commit_batch(batch(
        &topic,
        0,
        0,
        2,
        vec![
            update(&coll, 0, None, 1, ids.len() as i64, writes),
            update(&other, 0, None, 1, 1, vec![upsert(record("a1", 1, None))]),
        ],
    ))
    .await
    .expect("commit");

    let mut want = ids.clone();
    want.sort();
    let mut got = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = db.list_records(&coll, after.as_deref(), 7).await.expect("page");
        assert!(page.len() <= 7, "page larger than the limit");
        let Some(last) = page.last() else { break };
        after = Some(last.id.clone());
        got.extend(page.into_iter().map(|r| r.id));
    }
    assert_eq!(got, want, "pages not in byte order of ids, or records missed / repeated");
    assert!(db.list_records(&coll, None, 0).await.expect("limit 0").is_empty());
    let last = want.last().map(String::as_str);
    assert!(db.list_records(&coll, last, 10).await.expect("after the last").is_empty());
    let from_a = db.list_records(&coll, Some("a"), 2).await.expect("after a");
    assert_eq!(from_a.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["a-", "a0"]);
}

pub async fn get_records_returns_only_present_ids(db: &Sysdb) {
    let topic = unique("get");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    let (a, b) = (record("a", 0, Some(vec![1.5])), record("b", 1, None));
    db.commit_batch(batch(
        &topic,
        0,
        0,
        2,
        vec![update(&coll, 0, Some(1), 1, 2, vec![upsert(a.clone()), upsert(b.clone())])],
    ))
    .await
    .expect("commit");
    let got = db
        .get_records(&coll, &["b".to_string(), "nope".to_string(), "a".to_string(), "b".to_string()])
        .await
        .expect("get_records");
    assert_eq!(got.len(), 2, "absent ids returned: {:?}", got.keys().collect::<Vec<_>>());
    assert_records_bit_eq(&got["a"], &a, "get a");
    assert_records_bit_eq(&got["b"], &b, "get b");
    assert!(db.get_records(&coll, &[]).await.expect("no ids").is_empty());
    assert!(db.get_records(&unique("coll"), &["a".to_string()]).await.expect("other collection").is_empty());
}

pub async fn get_records_many_reads_several_collections_at_once(db: &Sysdb) {
    let topic = unique("many");
    let (c1, c2, empty) = (unique("coll"), unique("coll"), unique("coll"));
    db.init_position(&topic, 0, 0).await.expect("init");
    let (a, b, x) = (record("a", 0, Some(vec![1.5, -0.0])), record("b", 1, None), record("a", 2, Some(vec![7.0])));
    db.commit_batch(batch(
        &topic,
        0,
        0,
        3,
        vec![
            update(&c1, 0, Some(2), 1, 2, vec![upsert(a.clone()), upsert(b.clone())]),
            update(&c2, 0, Some(1), 2, 1, vec![upsert(x.clone())]),
        ],
    ))
    .await
    .expect("commit");
    let ids = |v: &[&str]| v.iter().map(|s| (s.to_string(), true)).collect::<Vec<_>>();
    let got = db
        .get_records_many(vec![
            (c1.clone(), ids(&["b", "nope", "a", "b"])),
            (c2.clone(), ids(&["a", "b"])),
            (empty.clone(), ids(&["a"])),
            (unique("coll"), vec![]),
        ])
        .await
        .expect("get_records_many");
    assert_eq!(got.len(), 2, "only collections with records: {:?}", got.keys().collect::<Vec<_>>());
    assert_eq!(got[&c1].len(), 2, "absent ids returned: {:?}", got[&c1].keys().collect::<Vec<_>>());
    assert_records_bit_eq(&got[&c1]["a"], &a, "c1 a");
    assert_records_bit_eq(&got[&c1]["b"], &b, "c1 b");
    assert_eq!(got[&c2].len(), 1, "c2 holds only a");
    assert_records_bit_eq(&got[&c2]["a"], &x, "c2 a is not c1 a");
    assert!(db.get_records_many(vec![]).await.expect("nothing asked").is_empty());
    // Not whole: existence, metadata and offset are always there; a backend may leave
    // out the embedding and the document.
    let light = db
        .get_records_many(vec![(c1.clone(), vec![("a".to_string(), false), ("nope".to_string(), false)])])
        .await
        .expect("light");
    let got = &light[&c1]["a"];
    assert_eq!(light[&c1].len(), 1, "absent ids returned");
    assert!(metadata_bit_eq(&got.metadata, &a.metadata), "light metadata");
    assert_eq!((got.id.as_str(), got.offset), (a.id.as_str(), a.offset), "light id and offset");
    assert!(got.embedding.is_none() || got.embedding == a.embedding, "light embedding is absent or exact");
    assert!(got.document.is_none() || got.document == a.document, "light document is absent or exact");
}

pub async fn metadata_round_trips_exactly(db: &Sysdb) {
    let topic = unique("meta");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    let doubles = [
        1.0,
        -0.0,
        0.0,
        1e300,
        -1e300,
        1e-300,
        5e-324,
        f64::MAX,
        f64::MIN,
        f64::MIN_POSITIVE,
        0.1,
        1.0 / 3.0,
        9007199254740993.0,
        1e16,
        -2.5,
    ];
    let mut metadata = Metadata::new();
    for (i, d) in doubles.iter().enumerate() {
        metadata.insert(format!("d{i:02}"), MetaValue::Double(*d));
    }
    for (i, l) in [i64::MIN, i64::MAX, 0, -1, 1 << 53, (1 << 53) + 1].iter().enumerate() {
        metadata.insert(format!("l{i}"), MetaValue::Long(*l));
    }
    for d in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        metadata.insert(format!("nf{d}"), MetaValue::Double(d));
    }
    metadata.insert("s-empty".into(), MetaValue::String(String::new()));
    metadata.insert("s-json".into(), MetaValue::String("{\"f64\":\"NaN\"} \\ \u{0} \n ☃ 1.0".into()));
    metadata.insert("s-number".into(), MetaValue::String("1".into()));
    metadata.insert("b-true".into(), MetaValue::Bool(true));
    metadata.insert("b-false".into(), MetaValue::Bool(false));
    metadata.insert("key with \"quotes\" and ünïcode".into(), MetaValue::Long(7));

    let rich = Record { id: "rich".into(), embedding: None, metadata, document: Some(String::new()), offset: 0 };
    let bare = Record { id: "bare".into(), embedding: None, metadata: Metadata::new(), document: None, offset: 1 };
    db.commit_batch(batch(
        &topic,
        0,
        0,
        2,
        vec![update(&coll, 0, None, 1, 2, vec![upsert(rich.clone()), upsert(bare.clone())])],
    ))
    .await
    .expect("commit");
    let got = db.get_records(&coll, &["rich".to_string(), "bare".to_string()]).await.expect("get");
    assert_records_bit_eq(&got["rich"], &rich, "metadata of every type");
    assert_records_bit_eq(&got["bare"], &bare, "no metadata, no document");
    let kinds: BTreeMap<_, _> =
        got["rich"].metadata.iter().map(|(k, v)| (k.clone(), std::mem::discriminant(v))).collect();
    assert_eq!(kinds[&"d00".to_string()], std::mem::discriminant(&MetaValue::Double(0.0)), "1.0 read back as a Long");
    assert_eq!(kinds[&"l1".to_string()], std::mem::discriminant(&MetaValue::Long(0)), "i64::MAX read back as a Double");
}

pub async fn embeddings_round_trip_bit_exact(db: &Sysdb) {
    let topic = unique("emb");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    let odd = vec![
        f32::from_bits(0x7fc0_1234), // NaN with a payload
        f32::from_bits(0xffa0_0001), // signalling NaN, negative
        -0.0,
        0.0,
        f32::MIN_POSITIVE / 3.0, // subnormal
        f32::MAX,
        f32::MIN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.1,
        -1.0 / 3.0,
    ];
    let wide: Vec<f32> = (0..1536).map(|i| (i as f32).sin() * 1e-3).collect();
    let records = [
        Record { id: "odd".into(), embedding: Some(odd.into()), metadata: Metadata::new(), document: None, offset: 0 },
        Record {
            id: "wide".into(),
            embedding: Some(wide.into()),
            metadata: Metadata::new(),
            document: None,
            offset: 1,
        },
        Record {
            id: "empty".into(),
            embedding: Some(Embedding::default()),
            metadata: Metadata::new(),
            document: None,
            offset: 2,
        },
        Record { id: "none".into(), embedding: None, metadata: Metadata::new(), document: None, offset: 3 },
    ];
    let writes = records.iter().cloned().map(upsert).collect();
    db.commit_batch(batch(&topic, 0, 0, 4, vec![update(&coll, 0, None, 3, 4, writes)])).await.expect("commit");
    let got = db.get_records(&coll, &records.iter().map(|r| r.id.clone()).collect::<Vec<_>>()).await.expect("get");
    for r in &records {
        assert_records_bit_eq(&got[&r.id], r, &format!("embedding {:?}", r.id));
    }
}

/// A batch far larger than one statement of a backend's write (PostgreSQL splits its
/// upserts by bytes) lands whole: every record, in one commit, with its position; a
/// second batch overwrites half of them and deletes a few, across the same splits.
pub async fn a_batch_of_many_megabytes_is_written_whole(db: &Sysdb) {
    let topic = unique("big");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    let record = |i: usize, offset: i64| Record {
        id: format!("r{i:05}"),
        embedding: Some((0..1536).map(|j| ((i * 1536 + j) as f32 * 1e-4).cos() + offset as f32).collect()),
        metadata: Metadata::from_iter([("i".to_string(), MetaValue::Long(i as i64))]),
        document: i.is_multiple_of(3).then(|| format!("document {i} at {offset}")),
        offset,
    };
    // 1,500 records of ~6 KiB: about 9 MiB in one batch.
    let first: Vec<Record> = (0..1500).map(|i| record(i, i as i64)).collect();
    let writes = first.iter().cloned().map(upsert).collect();
    db.commit_batch(batch(&topic, 0, 0, 1500, vec![update(&coll, 0, None, 1499, 1500, writes)]))
        .await
        .expect("commit the large batch");
    // Then every other record rewritten, and every 100th of the rest deleted.
    let mut want: std::collections::BTreeMap<String, Record> = first.into_iter().map(|r| (r.id.clone(), r)).collect();
    let mut writes = Vec::new();
    let mut count_delta = 0;
    for i in 0..1500 {
        let offset = 1500 + i as i64;
        if i % 2 == 0 {
            let r = record(i, offset);
            want.insert(r.id.clone(), r.clone());
            writes.push(upsert(r));
        } else if i % 100 == 1 {
            want.remove(&format!("r{i:05}"));
            writes.push(delete(&format!("r{i:05}")));
            count_delta -= 1;
        }
    }
    db.commit_batch(batch(&topic, 0, 1500, 3000, vec![update(&coll, 0, None, 2999, count_delta, writes)]))
        .await
        .expect("commit the second large batch");
    let got = all_records(db, &coll).await;
    assert_eq!(got.len(), want.len(), "records after two large batches");
    for (g, w) in got.iter().zip(want.values()) {
        assert_records_bit_eq(g, w, &format!("record {:?}", w.id));
    }
    assert_eq!(db.positions(&topic).await.expect("positions").get(&0), Some(&3000), "position after the batches");
    let row = db.collection(&coll).await.expect("collection").expect("collection row");
    assert_eq!(row.record_count, want.len() as i64, "record count");
}

/// Commit `rounds` batches of `n` new records (`dim`-dimensional embeddings, 3 metadata
/// keys) and then one batch updating the same `n` ids; prints records/s and returns the
/// per-batch durations (inserts, then the update).
pub async fn measure_commit_throughput(db: &Sysdb, n: usize, dim: usize, rounds: usize) -> Vec<Duration> {
    let topic = unique("bench");
    let coll = unique("coll");
    db.init_position(&topic, 0, 0).await.expect("init");
    let make = |round: usize, id_round: usize| -> Vec<(String, Option<Record>)> {
        (0..n)
            .map(|i| {
                let offset = (round * n + i) as i64;
                let mut metadata = Metadata::new();
                metadata.insert("source".into(), MetaValue::String(format!("doc-{}", i % 97)));
                metadata.insert("page".into(), MetaValue::Long(i as i64));
                metadata.insert("score".into(), MetaValue::Double(i as f64 * 0.37));
                let embedding = (0..dim).map(|j| ((i * dim + j) as f32 * 0.001).sin()).collect();
                upsert(Record {
                    id: format!("{id_round:03}-{i:08}"),
                    embedding: Some(embedding),
                    metadata,
                    document: None,
                    offset,
                })
            })
            .collect()
    };
    let mut durations = Vec::new();
    let mut position = 0i64;
    for round in 0..=rounds {
        // The last round rewrites the ids of round 0: the update path of the upsert.
        let id_round = if round == rounds { 0 } else { round };
        let writes = make(round, id_round);
        let next = position + n as i64;
        let delta = if round == rounds { 0 } else { n as i64 };
        let b = batch(&topic, 0, position, next, vec![update(&coll, 0, Some(dim as u32), next - 1, delta, writes)]);
        let start = Instant::now();
        db.commit_batch(b).await.expect("bench commit");
        let took = start.elapsed();
        let kind = if round == rounds { "update" } else { "insert" };
        println!(
            "{} commit_batch of {n} {kind}s (dim {dim}, 3 metadata keys): {:>8.1} ms = {:>9.0} records/s",
            db.backend(),
            took.as_secs_f64() * 1e3,
            n as f64 / took.as_secs_f64()
        );
        durations.push(took);
        position = next;
    }
    let row = db.collection(&coll).await.expect("collection").expect("exists");
    assert_eq!(row.record_count, (rounds * n) as i64);
    durations
}
