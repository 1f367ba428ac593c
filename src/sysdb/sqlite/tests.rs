//! Tests of the SQLite backend's own mechanics (the conformance suite runs both backends).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::{params, Connection};

use super::checkpoint::CHECKPOINTER_CACHE_KIB;
use super::commit::{commit_all_or_none, commit_group};
use super::positions::{read_next_offset, write_next_offset};
use super::readers;
use super::rows::decode_raw;
use super::stats::SqliteStats;
use super::store::{
    configure, migrate, open_connection, PendingCommit, SqliteSysdb, Writing, BUSY_TIMEOUT, CACHE_SIZE_KIB, MMAP_SIZE,
    PAGE_SIZE, READER_CACHE_SIZE_KIB,
};
use super::values::{self, RECORD_COLUMNS};
use crate::config::SqliteConfig;
use crate::positions::PositionDelta;
use crate::record::Record;
use crate::sysdb::migrations;
use crate::sysdb::types::{BatchCommit, CollectionUpdate};
use crate::sysdb::{conformance, Sysdb, SysdbError};

fn group_batch(partition: i32, from: i64, to: i64, ids: &[&str]) -> Arc<BatchCommit> {
    let writes = ids
        .iter()
        .map(|id| {
            let record = Record {
                id: (*id).into(),
                embedding: Some(vec![0.5, -1.0].into()),
                metadata: Default::default(),
                document: Some(format!("{id} of partition {partition}")),
                offset: from,
            };
            ((*id).to_string(), Some(record))
        })
        .collect();
    Arc::new(BatchCommit {
        topic: "group".into(),
        delta: PositionDelta::new(partition, from, to).unwrap(),
        collections: vec![CollectionUpdate {
            id: format!("coll-{partition}"),
            partition,
            dimension: Some(2),
            log_position: to - 1,
            record_count_delta: ids.len() as i64,
            writes,
        }],
        functions: Vec::new(),
        changelog: false,
        changes: Vec::new(),
    })
}

/// Small bounds, so that a test of a few thousand records merges and compacts often.
const TIGHT: SqliteConfig = SqliteConfig {
    delta_max_rows: 150,
    delta_max_bytes: 12 * 1024,
    delta_cache_bytes: 2 * 1024,
    dead_value_ratio: 1.0,
    dead_value_slack_bytes: 4 * 1024,
    compaction_step_bytes: 1 << 20,
    reader_connections: 1,
};

fn writing(tuning: &SqliteConfig) -> (SqliteConfig, SqliteStats) {
    (tuning.clone(), SqliteStats::default())
}

/// Commit one batch alone through the group-commit path, as the processor does.
fn commit_one(conn: &mut Connection, w: Writing<'_>, batch: BatchCommit) {
    let (reply, mut rx) = tokio::sync::oneshot::channel();
    commit_group(conn, w, vec![PendingCommit { batch: Arc::new(batch), reply }]);
    rx.try_recv().expect("answered").expect("committed");
}

/// Every record read back whole (through the value log), by (collection, id).
fn stored_records(conn: &Connection) -> std::collections::BTreeMap<(String, String), Record> {
    conn.prepare(&format!(
        "SELECT r.collection_id, {RECORD_COLUMNS} FROM {} r LEFT JOIN record_values v ON v.seq = r.value",
        values::CURRENT_RECORDS
    ))
    .unwrap()
    .query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))))
    .unwrap()
    .map(|row| {
        let (c, raw) = row.unwrap();
        let record = decode_raw(raw).unwrap();
        ((c, record.id.clone()), record)
    })
    .collect()
}

/// Every record as the `sluice_records` view (schema step 11) returns it, in plain SQL
/// with the delta and the value log folded in by the view itself; its `dimension` must
/// agree with the embedding's length.
fn view_records(conn: &Connection) -> std::collections::BTreeMap<(String, String), Record> {
    conn.prepare("SELECT collection, id, embedding, metadata, document, last_offset, dimension FROM sluice_records")
        .unwrap()
        .query_map([], |r| {
            let dimension: Option<i64> = r.get(6)?;
            Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?), dimension))
        })
        .unwrap()
        .map(|row| {
            let (c, raw, dimension) = row.unwrap();
            let record = decode_raw(raw).unwrap();
            assert_eq!(
                dimension,
                record.embedding.as_ref().map(|e| e.len() as i64),
                "sluice_records.dimension of {c}/{}",
                record.id
            );
            ((c, record.id.clone()), record)
        })
        .collect()
}

/// The value log under a long run of overwrites and deletes, with tight byte bounds:
/// after every commit the records read back are exactly the model's, every record
/// points at a value of its key and size, and the log's byte counts (all values, live
/// values, delta rows) are exact. Pages read on a reader with the delta folded in at
/// read time equal the model too, and so does the `sluice_records` view. The dead bytes
/// stay within the bound (plus what the transactions since the last compaction added),
/// and records written once at the start and never again survive the compactions that
/// copied their values forward.
#[test]
fn the_value_log_keeps_every_record_exact_and_stays_bounded_in_bytes() {
    use crate::record::{MetaValue, Metadata};
    let mut conn = open_connection(":memory:").unwrap();
    configure(&conn, ":memory:").unwrap();
    migrate(&mut conn, None).unwrap();
    write_next_offset(&conn, "values", 0, 0, 0).unwrap();
    let mut model = std::collections::BTreeMap::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n
    };
    let record = |id: &str, kind: u64, offset: i64| {
        let mut metadata = Metadata::new();
        metadata.insert("n".into(), MetaValue::Long(offset));
        // Some stretches of the log carry larger metadata: the delta fills by bytes there.
        if (offset / 400) % 3 == 0 {
            metadata.insert("pad".into(), MetaValue::String("p".repeat(120)));
        }
        Record {
            id: id.into(),
            // Some records have no value at all, some only a document (of varied sizes).
            embedding: kind.is_multiple_of(3).then(|| [offset as f32, 1.5, -2.0].into()),
            metadata,
            document: (kind % 3 != 2).then(|| format!("{id} at {offset}").repeat(1 + (offset % 7) as usize)),
            offset,
        }
    };
    let mut offset = 0i64;
    let mut first_values_end = 0i64;
    // Checks of the view while the delta held rows, and while it held several of one key.
    let (mut viewed_with_delta, mut viewed_with_overridden_delta_rows) = (0, 0);
    let (tuning, stats) = writing(&TIGHT);
    let w = Writing { tuning: &tuning, stats: &stats };
    for tx in 0..300 {
        let mut per_collection: std::collections::BTreeMap<String, std::collections::BTreeMap<String, Option<Record>>> =
            Default::default();
        // Every tenth transaction is large enough to merge the delta and write `records`
        // directly; the others go through the delta.
        let writes = if tx == 0 {
            250
        } else if tx % 10 == 5 {
            2 * values::DIRECT_WRITES as i64 + 200
        } else {
            40
        };
        for wi in 0..writes {
            // The first transaction also writes 50 ids of a collection never written again.
            let (c, id) = if tx == 0 && wi < 50 {
                ("static".to_string(), format!("s{wi}"))
            } else {
                (format!("c{}", next(3)), format!("id{}", next(500)))
            };
            let write = if next(10) < 7 { Some(record(&id, next(3), offset)) } else { None };
            offset += 1;
            per_collection.entry(c).or_default().insert(id, write);
        }
        if tx % 10 == 5 {
            let distinct: usize = per_collection.values().map(|w| w.len()).sum();
            assert!(distinct >= values::DIRECT_WRITES, "transaction {tx} writes only {distinct} ids");
        }
        let collections = per_collection
            .into_iter()
            .map(|(c, writes)| {
                let mut record_count_delta = 0;
                for (id, w) in &writes {
                    let before = match w {
                        Some(r) => model.insert((c.clone(), id.clone()), r.clone()),
                        None => model.remove(&(c.clone(), id.clone())),
                    };
                    record_count_delta += i64::from(w.is_some()) - i64::from(before.is_some());
                }
                CollectionUpdate {
                    id: c,
                    partition: 0,
                    dimension: Some(3),
                    log_position: offset - 1,
                    record_count_delta,
                    writes: writes.into_iter().collect(),
                }
            })
            .collect();
        let from = offset - writes;
        commit_one(
            &mut conn,
            w,
            BatchCommit {
                topic: "values".into(),
                delta: PositionDelta::new(0, from, offset).unwrap(),
                collections,
                functions: Vec::new(),
                changelog: false,
                changes: Vec::new(),
            },
        );
        if tx == 0 {
            first_values_end = conn.query_row("SELECT max(seq) FROM record_values", [], |r| r.get(0)).unwrap();
        }
        // Forced merges now and then, between the ones the delta's bounds bring.
        if tx % 37 == 36 {
            let t = conn.transaction().unwrap();
            let mut acct = values::Account::default();
            w.merge(&t, true, &mut acct).unwrap();
            w.flush_and_compact(&t, &mut acct).unwrap();
            t.commit().unwrap();
            let left: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
            assert_eq!(left, 0, "a merge empties the delta");
        }
        values::check_layout(&conn).unwrap_or_else(|e| panic!("after transaction {tx}: {e}"));
        let stored = stored_records(&conn);
        assert!(stored == model, "after transaction {tx}: the records read back differ from the model");
        let viewed = view_records(&conn);
        assert!(viewed == model, "after transaction {tx}: the sluice_records view differs from the model");
        let (keys, rows): (i64, i64) = conn
            .query_row("SELECT count(DISTINCT collection_id || '/' || id), count(*) FROM record_delta", [], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })
            .unwrap();
        viewed_with_delta += i64::from(keys > 0);
        viewed_with_overridden_delta_rows += i64::from(rows > keys);
        if tx % 25 == 24 {
            for c in ["c0", "c1", "c2", "static"] {
                let mut page_model: Vec<Record> =
                    model.iter().filter(|((mc, _), _)| mc == c).map(|(_, r)| r.clone()).collect();
                page_model.sort_by(|a, b| a.id.cmp(&b.id));
                let mut read = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let page: Vec<Record> = readers::list_page(&conn, c, after.as_deref(), 37)
                        .unwrap()
                        .into_iter()
                        .map(|raw| decode_raw(raw).unwrap())
                        .collect();
                    after = page.last().map(|r| r.id.clone());
                    let done = page.len() < 37;
                    read.extend(page);
                    if done {
                        break;
                    }
                }
                assert!(read == page_model, "after transaction {tx}: pages of {c} read with the delta folded in");
            }
        }
    }
    let s = stats.snapshot();
    assert!(s.compactions > 10, "compactions: {s:?}");
    assert!(
        viewed_with_delta > 0 && viewed_with_overridden_delta_rows > 0,
        "the view was read over an unmerged delta ({viewed_with_delta} times), with keys changed twice there \
         ({viewed_with_overridden_delta_rows} times)"
    );
    assert!(s.merges.iter().find(|(r, _)| *r == "rows").unwrap().1 > 0, "merges by rows: {s:?}");
    assert!(s.merges.iter().find(|(r, _)| *r == "bytes").unwrap().1 > 0, "merges by bytes: {s:?}");
    // Once merged and compacted until it stops, the dead bytes are within the bound.
    loop {
        let t = conn.transaction().unwrap();
        let mut acct = values::Account::default();
        w.merge(&t, true, &mut acct).unwrap();
        acct.flush(&t).unwrap();
        let done = values::compact(&t, &tuning, 0).unwrap().is_none();
        t.commit().unwrap();
        if done {
            break;
        }
    }
    let (log, live) = values::log_bytes(&conn);
    assert!(live > 0);
    let allowed = (tuning.dead_value_ratio * live as f64) as i64 + tuning.dead_value_slack_bytes as i64;
    assert!(log - live <= allowed, "{} dead bytes for {live} live ones (allowed {allowed})", log - live);
    let moved: i64 = conn
        .query_row(
            &format!("SELECT count(*) FROM {} WHERE collection_id = 'static' AND value > ?1", values::CURRENT_RECORDS),
            [first_values_end],
            |r| r.get(0),
        )
        .unwrap();
    let with_value =
        model.iter().filter(|((c, _), r)| c == "static" && (r.embedding.is_some() || r.document.is_some())).count();
    assert!(with_value > 0);
    assert_eq!(moved as usize, with_value, "every static value was copied forward by compaction");
    values::check_layout(&conn).unwrap();
}

/// A database written by the previous layout (values inside `records`, schema
/// version 5) migrates to the value log with every record unchanged.
#[test]
fn step_6_moves_stored_values_into_the_value_log() {
    let mut conn = open_connection(":memory:").unwrap();
    conn.execute_batch(migrations::CREATE_SCHEMA_MIGRATIONS).unwrap();
    for m in &migrations::SQLITE[..5] {
        conn.execute_batch(m.sql).unwrap();
        conn.execute("INSERT INTO schema_migrations VALUES (?1, ?2, 0)", params![m.version, m.description]).unwrap();
    }
    let old = [
        ("a", "x", Some(crate::record::codec::f32s_to_le_bytes(&[1.0, 2.0])), Some(r#"{"k":"v"}"#), Some("doc x"), 3),
        ("a", "y", None, Some(r#"{"k":"w"}"#), None, 4),
        ("b", "x", None, None, Some("only a document"), 5),
    ];
    for (c, id, emb, md, doc, off) in &old {
        conn.execute(
            "INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![c, id, emb, md, doc, off],
        )
        .unwrap();
    }
    migrate(&mut conn, None).unwrap();
    values::check_layout(&conn).unwrap();
    let stored = stored_records(&conn);
    assert_eq!(stored.len(), 3);
    for (c, id, emb, md, doc, off) in old {
        let expected = decode_raw((id.into(), emb, md.map(str::to_string), doc.map(str::to_string), off)).unwrap();
        assert_eq!(stored[&(c.to_string(), id.to_string())], expected);
    }
    let values: i64 = conn.query_row("SELECT count(*) FROM record_values", [], |r| r.get(0)).unwrap();
    assert_eq!(values, 2, "two records had a value, one had none");
    // Step 7: the small rows are clustered on their key (one b-tree, no rowid), so a
    // batch of one partition's collections rewrites only that partition's pages.
    let err = conn.query_row("SELECT rowid FROM records", [], |r| r.get::<_, i64>(0)).unwrap_err();
    assert!(err.to_string().contains("no such column: rowid"), "{err}");
}

/// A migrated in-memory database with partitions 0-3 of topic `group` at offset 0.
fn group_connection() -> Connection {
    let mut conn = open_connection(":memory:").unwrap();
    configure(&conn, ":memory:").unwrap();
    migrate(&mut conn, None).unwrap();
    for p in 0..4 {
        write_next_offset(&conn, "group", p, 0, 0).unwrap();
    }
    conn
}

/// One group transaction, four batches: each keeps its own outcome. A conflicting
/// batch and one whose value the database refuses leave nothing behind (not even
/// their collection rows), and the others commit.
#[test]
fn a_group_commit_keeps_each_batch_outcome_apart() {
    let mut conn = group_connection();
    // A value SQLite refuses, as a constraint would: class Record.
    conn.execute_batch(
        "CREATE TRIGGER refuse_poison BEFORE INSERT ON record_delta WHEN NEW.id = 'poison'
         BEGIN SELECT RAISE(ABORT, 'poison refused'); END;",
    )
    .unwrap();
    let batches = [
        group_batch(0, 0, 5, &["a", "b"]),
        group_batch(1, 3, 5, &["c"]), // stored position is 0: conflict
        group_batch(2, 0, 5, &["good", "poison"]),
        group_batch(3, 0, 5, &["d"]),
    ];
    let mut outcomes = Vec::new();
    let group = batches
        .iter()
        .map(|b| {
            let (reply, rx) = tokio::sync::oneshot::channel();
            outcomes.push(rx);
            PendingCommit { batch: Arc::clone(b), reply }
        })
        .collect();
    let (tuning, stats) = writing(&SqliteConfig::DEFAULT);
    commit_group(&mut conn, Writing { tuning: &tuning, stats: &stats }, group);
    let outcomes: Vec<_> = outcomes.into_iter().map(|mut rx| rx.try_recv().expect("answered")).collect();
    assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
    assert!(matches!(outcomes[1], Err(SysdbError::Conflict(_))), "{:?}", outcomes[1]);
    assert!(matches!(outcomes[2], Err(SysdbError::Rejected { .. })), "{:?}", outcomes[2]);
    assert!(outcomes[3].is_ok(), "{:?}", outcomes[3]);
    let positions: Vec<i64> = (0..4).map(|p| read_next_offset(&conn, "group", p).unwrap().unwrap()).collect();
    assert_eq!(positions, vec![5, 0, 0, 5]);
    let mut stored: Vec<String> = conn
        .prepare(&format!("SELECT collection_id || '/' || id FROM {} ORDER BY 1", values::CURRENT_RECORDS))
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    stored.sort();
    assert_eq!(stored, vec!["coll-0/a", "coll-0/b", "coll-3/d"]);
    let collections: Vec<String> = conn
        .prepare("SELECT id FROM collections ORDER BY id")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    assert_eq!(collections, vec!["coll-0", "coll-3"]);
}

/// The group's first attempt: every batch or none. Three good batches all commit; with
/// a conflicting one among them nothing is stored, and the group is left to the
/// savepoint path.
#[test]
fn a_group_goes_in_whole_or_not_at_all_before_savepoints() {
    let mut conn = group_connection();
    let pending = |batches: &[Arc<BatchCommit>]| -> Vec<PendingCommit> {
        batches
            .iter()
            .map(|b| PendingCommit { batch: Arc::clone(b), reply: tokio::sync::oneshot::channel().0 })
            .collect()
    };
    let positions = |conn: &Connection| -> Vec<i64> {
        (0..4).map(|p| read_next_offset(conn, "group", p).unwrap().unwrap()).collect()
    };
    let mixed = [group_batch(0, 0, 5, &["a"]), group_batch(1, 3, 5, &["b"]), group_batch(2, 0, 5, &["c"])];
    let (tuning, stats) = writing(&SqliteConfig::DEFAULT);
    let w = Writing { tuning: &tuning, stats: &stats };
    assert!(commit_all_or_none(&mut conn, w, &pending(&mixed)).unwrap().is_none(), "a conflict fails the attempt");
    assert_eq!(positions(&conn), vec![0, 0, 0, 0], "nothing of the failed attempt is stored");
    let count = |conn: &Connection| -> i64 {
        conn.query_row(&format!("SELECT count(*) FROM {}", values::CURRENT_RECORDS), [], |r| r.get(0)).unwrap()
    };
    assert_eq!(count(&conn), 0);

    let good = [group_batch(0, 0, 5, &["a"]), group_batch(1, 0, 5, &["b", "b2"]), group_batch(2, 0, 5, &["c"])];
    let reports = commit_all_or_none(&mut conn, w, &pending(&good)).unwrap().expect("every batch commits");
    assert_eq!(reports.len(), 3);
    assert_eq!(positions(&conn), vec![5, 5, 5, 0]);
    assert_eq!(count(&conn), 4);
}

/// Many partitions committing at once through the public API (grouped or not, as the
/// writer's timing decides): every batch lands once, with its own position.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_partitions_all_commit_through_group_commits() {
    let dir = tempfile::tempdir().unwrap();
    let db = SqliteSysdb::open(&dir.path().join("g.db").to_string_lossy()).await.unwrap();
    for p in 0..16 {
        db.init_position("group", p, 0).await.unwrap();
    }
    let mut tasks = Vec::new();
    for p in 0..16 {
        let db = db.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..10 {
                let id = format!("r{round}");
                db.commit_batch(group_batch(p, round * 5, round * 5 + 5, &[&id])).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let positions = db.positions("group").await.unwrap();
    assert_eq!(positions, (0..16).map(|p| (p, 50)).collect());
    assert_eq!(db.collections().await.unwrap().iter().map(|c| c.record_count).sum::<i64>(), 160);
}

async fn open_file(dir: &tempfile::TempDir) -> (Sysdb, String) {
    let url = format!("sqlite://{}", dir.path().join("sysdb.sqlite").display());
    (Sysdb::open(&url).await.unwrap(), url)
}

/// (id, document) of the ids of `coll-0` that `db` finds, through the processor's lookup.
async fn read(db: &Sysdb, ids: &[&str]) -> Vec<(String, Option<String>)> {
    let ids: Vec<(String, bool)> = ids.iter().map(|i| (i.to_string(), true)).collect();
    let mut found = db.get_records_many(vec![("coll-0".into(), ids)]).await.unwrap();
    let mut docs: Vec<(String, Option<String>)> =
        found.remove("coll-0").unwrap_or_default().into_values().map(|r| (r.id, r.document)).collect();
    docs.sort();
    docs
}

/// Two handles on one file (as two replicas on one machine): each reads the other's
/// unmerged delta rows, a merge by one (here a large transaction, which merges first)
/// is seen by the other's in-memory copy of the delta, and pages in id order merge the
/// delta first. Every read agrees with what was written, in order.
#[tokio::test]
async fn two_handles_read_each_others_delta_across_merges() {
    let dir = tempfile::tempdir().unwrap();
    let (a, url) = open_file(&dir).await;
    let b = Sysdb::open(&url).await.unwrap();
    a.init_position("group", 0, 0).await.unwrap();
    a.init_position("group", 1, 0).await.unwrap();
    // A writes a small batch: it waits in the delta, and B reads it there.
    a.commit_batch(group_batch(0, 0, 2, &["x", "y"])).await.unwrap();
    let delta: i64 = {
        let conn = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
        conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap()
    };
    assert_eq!(delta, 2, "a small batch goes to the delta");
    let doc = |id: &str| (id.to_string(), Some(format!("{id} of partition 0")));
    assert_eq!(read(&b, &["x", "y", "z"]).await, vec![doc("x"), doc("y")]);
    // B deletes y through the delta; A sees the delete over its own earlier row.
    let mut delete = (*group_batch(0, 2, 3, &["y"])).clone();
    delete.collections[0].writes[0].1 = None;
    delete.collections[0].record_count_delta = -1;
    b.commit_batch(delete).await.unwrap();
    assert_eq!(read(&a, &["x", "y"]).await, vec![doc("x")]);
    // A large batch on another partition merges the delta first (rowids start over),
    // then B writes z into the new delta: A's copy starts over and still sees x, not y.
    let many: Vec<String> = (0..values::DIRECT_WRITES).map(|i| format!("m{i:05}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    a.commit_batch(group_batch(1, 0, 1, &many)).await.unwrap();
    b.commit_batch(group_batch(0, 3, 4, &["z"])).await.unwrap();
    assert_eq!(read(&a, &["x", "y", "z"]).await, vec![doc("x"), doc("z")]);
    assert_eq!(read(&b, &["x", "y", "z"]).await, vec![doc("x"), doc("z")]);
    // A page in id order (on a reader) sees the same, and merges nothing: the delta
    // still holds z, and no write transaction began.
    let Sysdb::Sqlite(sa) = &a else { unreachable!() };
    let writes_before = sa.stats().snapshot().write_transactions;
    let page: Vec<String> = a.list_records("coll-0", None, 10).await.unwrap().into_iter().map(|r| r.id).collect();
    assert_eq!(page, vec!["x", "z"]);
    assert_eq!(sa.stats().snapshot().write_transactions, writes_before, "a read began a write transaction");
    let conn = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
    let left: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
    assert_eq!(left, 1, "a read merged the delta");
    values::check_layout(&conn).unwrap();
}

/// The processor's copy of the delta holds at most `delta_cache_bytes` of metadata:
/// with a budget of three rows' metadata out of twenty, it keeps every key and reads
/// the other rows' metadata from the delta table by rowid; the records are the same.
#[tokio::test]
async fn the_delta_cache_stays_within_its_budget_and_reads_the_rest() {
    use crate::record::MetaValue;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("budget.db");
    let tuning = SqliteConfig { delta_cache_bytes: 2_500, ..SqliteConfig::DEFAULT };
    let db = SqliteSysdb::open_tuned(&path.to_string_lossy(), &tuning).await.unwrap();
    db.init_position("group", 0, 0).await.unwrap();
    let ids: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
    let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
    let mut batch = (*group_batch(0, 0, 1, &refs)).clone();
    for (i, (_, w)) in batch.collections[0].writes.iter_mut().enumerate() {
        let r = w.as_mut().unwrap();
        r.metadata.insert("big".into(), MetaValue::String(format!("{i}").repeat(700)));
    }
    db.commit_batch(Arc::new(batch.clone())).await.unwrap();
    let wanted = vec![("coll-0".to_string(), ids.iter().map(|i| (i.clone(), true)).collect())];
    let found = db.get_records_many(wanted).await.unwrap().remove("coll-0").unwrap();
    assert_eq!(found.len(), 20);
    for (id, w) in &batch.collections[0].writes {
        assert_eq!(&found[id], w.as_ref().unwrap(), "{id}");
    }
    let held = db.inner.delta.lock().unwrap().metadata_bytes();
    assert!(held <= 2_500, "the delta cache holds {held} bytes of metadata, over its budget of 2500");
    assert!(held >= 1_400, "the delta cache holds {held} bytes of metadata: it should hold what fits");
    let conn = Connection::open(&path).unwrap();
    let in_delta: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
    assert_eq!(in_delta, 20, "the rows are still in the delta (read from there, not from a merge)");
}

#[tokio::test]
async fn conformance_on_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let (db, url) = open_file(&dir).await;
    conformance::run_all(&db).await;
    conformance::reopen_is_idempotent(&db, &url).await;
    let other = Sysdb::open(&url).await.unwrap();
    conformance::concurrent_commits_from_two_handles(&db, &other).await;
    conformance::functions::concurrent_attaches_create_one_function(&db, &other).await;
}

#[tokio::test]
async fn conformance_in_memory() {
    let db = Sysdb::open("sqlite::memory:").await.unwrap();
    conformance::run_all(&db).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_on_a_multi_threaded_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = open_file(&dir).await;
    conformance::concurrent_commits_with_the_same_from(&db).await;
    conformance::functions::backfill_races_live_commits(&db).await;
}

#[tokio::test]
async fn a_database_newer_than_the_binary_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db, url) = open_file(&dir).await;
    drop(db);
    let path = dir.path().join("sysdb.sqlite");
    let conn = Connection::open(&path).unwrap();
    conn.execute(
        "INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES (?1, 'from the future', 0)",
        [migrations::latest(migrations::SQLITE) + 1],
    )
    .unwrap();
    drop(conn);
    match Sysdb::open(&url).await {
        Err(SysdbError::Config(m)) => assert!(m.contains("schema version"), "{m}"),
        Err(e) => panic!("expected a Config error, got {e}"),
        Ok(_) => panic!("a newer schema was accepted"),
    }
}

#[tokio::test]
async fn settings_are_applied_to_file_databases() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = open_file(&dir).await;
    let Sysdb::Sqlite(s) = &db else { unreachable!() };
    let reader_query_only: bool = s.read(|c| Ok(c.query_row("PRAGMA query_only", [], |r| r.get(0))?)).await.unwrap();
    assert!(reader_query_only, "reads run on query_only connections");
    let (mode, sync, busy, page, mmap) = s
        .on_writer(|c| {
            let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
            let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
            let busy: i64 = c.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?;
            let page: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0))?;
            let mmap: i64 = c.query_row("PRAGMA mmap_size", [], |r| r.get(0))?;
            Ok((mode, sync, busy, page, mmap))
        })
        .await
        .unwrap();
    assert_eq!(page, PAGE_SIZE);
    // SQLite caps it at its build's maximum; memory-mapped reads must be on.
    assert!(mmap > 0 && mmap <= MMAP_SIZE, "mmap_size {mmap}");
    assert_eq!(mode, "wal");
    assert_eq!(sync, 1, "synchronous=NORMAL");
    assert_eq!(busy, 5000);
}

/// Another connection (here a raw one; in practice another process on the same file)
/// holds the write lock: a commit waits at most the busy timeout, then reports
/// `Unavailable` (transient) with nothing written, and succeeds once the lock is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_lock_held_elsewhere_is_unavailable_after_the_busy_timeout() {
    use crate::sysdb::{CollectionUpdate, ErrorClass};
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = open_file(&dir).await;
    db.init_position("t", 0, 0).await.unwrap();
    let batch = BatchCommit {
        topic: "t".into(),
        delta: PositionDelta::new(0, 0, 3).unwrap(),
        collections: vec![CollectionUpdate {
            id: "c".into(),
            partition: 0,
            dimension: None,
            log_position: 2,
            record_count_delta: 1,
            writes: vec![(
                "a".into(),
                Some(Record {
                    id: "a".into(),
                    embedding: None,
                    metadata: Default::default(),
                    document: None,
                    offset: 2,
                }),
            )],
        }],
        functions: Vec::new(),
        changelog: false,
        changes: Vec::new(),
    };

    let holder = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let outcome = tokio::time::timeout(BUSY_TIMEOUT * 3, db.commit_batch(batch.clone()))
        .await
        .expect("the commit blocked past the busy timeout");
    let waited = started.elapsed();
    let err = outcome.expect_err("committed while another connection held the write lock");
    assert_eq!(err.class(), ErrorClass::Transient, "{err}");
    assert!(matches!(err, SysdbError::Unavailable { .. }), "{err:?}");
    assert!(waited >= BUSY_TIMEOUT - Duration::from_millis(500), "gave up after {waited:?}, before the busy timeout");
    assert_eq!(db.positions("t").await.unwrap(), HashMap::from([(0, 0)]), "position moved");
    assert_eq!(db.collection("c").await.unwrap(), None, "collection written");

    holder.execute_batch("ROLLBACK").unwrap();
    db.commit_batch(batch).await.expect("commit after the lock is released");
    assert_eq!(db.positions("t").await.unwrap(), HashMap::from([(0, 3)]));
}

/// An operator's write (here an attach) while another connection holds the write lock
/// longer than the busy timeout: alone it fails `Unavailable`; through
/// `retry_unavailable` it waits and succeeds once the lock is released, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_write_waits_out_a_write_lock_held_past_the_busy_timeout() {
    use crate::sysdb::{retry_unavailable, AttachOutcome, NewFunction};
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = open_file(&dir).await;
    let new = |id: &str| NewFunction {
        id: id.into(),
        collection_id: "c".into(),
        partition: 0,
        function: "record_counter".into(),
        output_collection: format!("{id}-out"),
        params: Default::default(),
        request_id: format!("{id}-req"),
    };
    let holder = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let err = db.attach_function(&new("f1")).await.expect_err("attached while the lock was held");
    assert!(matches!(err, SysdbError::Unavailable { .. }), "{err:?}");

    let release = std::thread::spawn(move || {
        std::thread::sleep(BUSY_TIMEOUT + Duration::from_secs(2));
        holder.execute_batch("ROLLBACK").unwrap();
    });
    let started = std::time::Instant::now();
    let f2 = new("f2");
    let outcome = retry_unavailable(BUSY_TIMEOUT * 4, "attach", || db.attach_function(&f2))
        .await
        .expect("attached once the lock was released");
    assert!(started.elapsed() > BUSY_TIMEOUT, "the lock was held past the busy timeout");
    assert!(matches!(outcome, AttachOutcome::Created(..)), "{outcome:?}");
    release.join().unwrap();
    let ids: Vec<String> = db.functions(None).await.unwrap().into_iter().map(|f| f.id).collect();
    assert_eq!(ids, vec!["f2".to_string()], "the failed try wrote nothing, the retried one wrote once");
}

/// A busy writer for the write-queue tests: until `stop`, write transactions that each
/// hold the write lock for `hold`, back to back, counting those that committed (one that
/// finds the lock held past the busy timeout tries again).
fn busy_writer(
    db: SqliteSysdb,
    hold: Duration,
    stop: Arc<std::sync::atomic::AtomicBool>,
    written: Arc<std::sync::atomic::AtomicU64>,
) -> tokio::task::JoinHandle<()> {
    use std::sync::atomic::Ordering;
    tokio::spawn(async move {
        while !stop.load(Ordering::Relaxed) {
            let wrote = db
                .write(move |c, _| {
                    let tx = c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                    tx.execute("INSERT INTO busy_writes (n) VALUES (1)", [])?;
                    std::thread::sleep(hold);
                    Ok(tx.commit()?)
                })
                .await;
            if wrote.is_ok() {
                written.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// Two writers of one file (two replicas) write back to back, each holding the write lock
/// 20 ms at a time with no pause between: an operator's write through a third handle (as
/// another process would be) still gets its turn within a few of their transactions.
/// Without the write queue, SQLite's busy handler (sleeping 1, 2, 5 … 100 ms between
/// tries) missed every gap of a few microseconds and failed after the busy timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_write_gets_its_turn_between_busy_writers() {
    use crate::sysdb::{AttachOutcome, NewFunction};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sysdb.sqlite");
    let path = path.to_str().unwrap();
    let operator = SqliteSysdb::open(path).await.unwrap();
    operator.write(|c, _| Ok(c.execute_batch("CREATE TABLE busy_writes (n INTEGER)")?)).await.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let mut busy = Vec::new();
    for _ in 0..2 {
        let replica = SqliteSysdb::open(path).await.unwrap();
        busy.push(busy_writer(replica, Duration::from_millis(20), Arc::clone(&stop), Arc::clone(&written)));
    }
    // Let both busy writers settle into back-to-back transactions.
    while written.load(Ordering::Relaxed) < 10 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut waits = Vec::new();
    for i in 0..5 {
        let new = NewFunction {
            id: format!("f{i}"),
            collection_id: "c".into(),
            partition: 0,
            function: "record_counter".into(),
            output_collection: format!("f{i}-out"),
            params: Default::default(),
            request_id: format!("f{i}-req"),
        };
        // The busy writers are at it when the operator comes.
        let seen = written.load(Ordering::Relaxed);
        while written.load(Ordering::Relaxed) == seen {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let (before, started) = (written.load(Ordering::Relaxed), std::time::Instant::now());
        let outcome = operator.attach_function(&new).await.expect("the operator's write starved behind busy writers");
        assert!(matches!(outcome, AttachOutcome::Created(..)), "{outcome:?}");
        waits.push((started.elapsed(), written.load(Ordering::Relaxed) - before));
    }
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.await.unwrap();
    }
    for (waited, passed) in &waits {
        // The transaction in progress, one that passed the gate before it closed, and
        // the waiters behind the gate are not served in a strict order among themselves
        // (whoever polls first when it opens): a few transactions, never a stream.
        assert!(*passed <= 10, "{passed} busy transactions went first ({waits:?})");
        assert!(*waited < Duration::from_secs(1), "waited {waited:?} ({waits:?})");
    }
}

/// A writer stopped while it held the queue's gate (SIGSTOP while it waited its turn)
/// closes the gate for everyone; the others pass it by after `GATE_PATIENCE` instead of
/// waiting until it wakes. A writer stopped while it held the turn itself holds up the
/// others up to the busy timeout, then they report `Unavailable`, as with SQLite's lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_waiter_does_not_close_the_queue_for_good() {
    use super::write_queue::GATE_PATIENCE;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sysdb.sqlite");
    let db = SqliteSysdb::open(path.to_str().unwrap()).await.unwrap();
    let lock_file = |suffix: &str| std::fs::File::open(format!("{}-{suffix}.lock", path.display())).unwrap();

    let gate = lock_file("queue");
    gate.lock().unwrap();
    let started = std::time::Instant::now();
    db.init_position("t", 0, 0).await.expect("a write behind a stuck gate");
    let waited = started.elapsed();
    assert!(waited >= GATE_PATIENCE && waited < BUSY_TIMEOUT, "waited {waited:?} behind the stuck gate");
    db.init_position("t", 1, 0).await.expect("a second write behind the same stuck gate");
    gate.unlock().unwrap();

    let turn = lock_file("write");
    turn.lock().unwrap();
    let err = db.init_position("t", 2, 0).await.expect_err("wrote while another writer held the turn");
    assert!(matches!(err, SysdbError::Unavailable { .. }), "{err:?}");
    turn.unlock().unwrap();
    db.init_position("t", 2, 0).await.expect("a write once the turn is free");
    assert_eq!(db.positions("t").await.unwrap(), HashMap::from([(0, 0), (1, 0), (2, 0)]));
}

/// An operator waits at the gate behind a writer that holds the turn for longer than
/// `GATE_PATIENCE` (a replica stopped mid-commit), while a busy replica keeps writing
/// from three partitions: when the turn comes free, the operator gets it, not the busy
/// replica (whose next commit asks for the turn the moment the previous one leaves it).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_behind_a_long_turn_is_served_before_busy_writers() {
    use crate::sysdb::{AttachOutcome, NewFunction};
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sysdb.sqlite");
    let path = path.to_str().unwrap();
    let operator = SqliteSysdb::open(path).await.unwrap();
    operator.write(|c, _| Ok(c.execute_batch("CREATE TABLE busy_writes (n INTEGER)")?)).await.unwrap();
    let replica = SqliteSysdb::open(path).await.unwrap();
    let (stop, written) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    // Three partitions' commits of one replica: while one holds the writer, the next
    // waits for it in the process and asks for the turn the moment it is released.
    let busy: Vec<_> = (0..3)
        .map(|_| busy_writer(replica.clone(), Duration::from_millis(10), Arc::clone(&stop), Arc::clone(&written)))
        .collect();
    while written.load(Ordering::Relaxed) < 5 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The stopped replica: the turn held from outside for 3 s.
    let turn = std::fs::File::open(format!("{path}-write.lock")).unwrap();
    let held = loop {
        if turn.try_lock().is_ok() {
            break std::time::Instant::now();
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    let release = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_secs(3));
        let before = written.load(Ordering::Relaxed);
        turn.unlock().unwrap();
        (before, written)
    });
    let new = NewFunction {
        id: "f".into(),
        collection_id: "c".into(),
        partition: 0,
        function: "record_counter".into(),
        output_collection: "f-out".into(),
        params: Default::default(),
        request_id: "f-req".into(),
    };
    let outcome = operator.attach_function(&new).await.expect("the operator's write after the long turn");
    let passed_after_release = {
        let (before, written) = release.join().unwrap();
        written.load(Ordering::Relaxed) - before
    };
    assert!(matches!(outcome, AttachOutcome::Created(..)), "{outcome:?}");
    assert!(held.elapsed() >= Duration::from_secs(3), "the attach went through a held turn");
    stop.store(true, Ordering::Relaxed);
    for b in busy {
        b.await.unwrap();
    }
    assert!(passed_after_release <= 2, "{passed_after_release} busy transactions went before the waiting operator");
}

/// A second replica opens a file at the current schema while another connection holds
/// the write lock (a busy or frozen replica): opening needs no write, so it does not wait.
#[tokio::test]
async fn opening_a_current_file_does_not_wait_for_the_write_lock() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sysdb.sqlite");
    let path = path.to_str().unwrap();
    drop(SqliteSysdb::open(path).await.unwrap());
    let holder = Connection::open(path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    let started = std::time::Instant::now();
    let second = SqliteSysdb::open(path).await.expect("opened while another connection held the write lock");
    assert!(started.elapsed() < BUSY_TIMEOUT / 2, "opening waited {:?} for the write lock", started.elapsed());
    holder.execute_batch("ROLLBACK").unwrap();
    drop(second);
}

#[tokio::test]
async fn an_unopenable_path_is_unavailable_not_a_panic() {
    match SqliteSysdb::open("/nonexistent-dir-for-sluice-tests/sub/sysdb.sqlite").await {
        Err(e) => assert!(e.is_retryable(), "{e}"),
        Ok(_) => panic!("opened a file in a missing directory"),
    }
}

/// The memory formula (`config/memory.rs`) counts these caches.
#[test]
fn the_memory_formula_counts_these_caches() {
    use crate::config::memory;
    assert_eq!(CACHE_SIZE_KIB as u64 * 1024, memory::SQLITE_WRITER_CACHE);
    assert_eq!(READER_CACHE_SIZE_KIB as u64 * 1024, memory::SQLITE_READER_CACHE);
    assert_eq!(CHECKPOINTER_CACHE_KIB as u64 * 1024, memory::SQLITE_CHECKPOINTER_CACHE);
}

#[test]
fn busy_and_io_errors_are_retryable() {
    use crate::sysdb::ErrorClass;
    let class = |code| SysdbError::from(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)).class();
    for code in [
        rusqlite::ffi::SQLITE_BUSY,
        rusqlite::ffi::SQLITE_LOCKED,
        rusqlite::ffi::SQLITE_READONLY,
        rusqlite::ffi::SQLITE_FULL,
        rusqlite::ffi::SQLITE_IOERR,
    ] {
        assert_eq!(class(code), ErrorClass::Transient, "{code}");
    }
    for code in [rusqlite::ffi::SQLITE_TOOBIG, rusqlite::ffi::SQLITE_CONSTRAINT, rusqlite::ffi::SQLITE_MISMATCH] {
        assert_eq!(class(code), ErrorClass::Record, "{code}");
    }
    for code in [rusqlite::ffi::SQLITE_CORRUPT, rusqlite::ffi::SQLITE_ERROR] {
        assert_eq!(class(code), ErrorClass::Fatal, "{code}");
    }
    let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
    assert!(SysdbError::from(busy).is_retryable());
    let constraint = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT), None);
    assert!(!SysdbError::from(constraint).is_retryable());
}

/// `cargo test --release -p sluice --lib sysdb::sqlite::tests::commit_throughput -- --ignored --nocapture`
#[tokio::test]
#[ignore = "measurement, prints records/s"]
async fn commit_throughput() {
    let dir = tempfile::tempdir().unwrap();
    let (db, _) = open_file(&dir).await;
    conformance::measure_commit_throughput(&db, 5_000, 384, 5).await;
    conformance::measure_commit_throughput(&db, 5_000, 1536, 3).await;
}
