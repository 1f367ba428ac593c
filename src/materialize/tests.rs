//! Unit tests of the fold: one test per cell of the section 4 table, then merge,
//! dimension, control records, preconditions and the outcome's accessors.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};

use super::*;
use crate::record::{LogRecord, MetaValue, Operation, Record};

const C: &str = "coll";

/// A log record of collection `C`; chain the helpers below to add a payload.
fn log(op: Operation, id: &str) -> LogRecord {
    LogRecord::data(C, id, op)
}

fn with_meta(mut rec: LogRecord, pairs: &[(&str, MetaValue)]) -> LogRecord {
    rec.metadata = Some(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
    rec
}

fn with_doc(mut rec: LogRecord, doc: &str) -> LogRecord {
    rec.document = Some(doc.to_string());
    rec
}

fn with_emb(mut rec: LogRecord, emb: &[f32]) -> LogRecord {
    rec.embedding = Some(emb.into());
    rec
}

fn record(id: &str, offset: i64) -> Record {
    Record { id: id.to_string(), embedding: None, metadata: Metadata::new(), document: None, offset }
}

fn store(records: &[Record]) -> BTreeMap<String, Record> {
    records.iter().map(|r| (r.id.clone(), r.clone())).collect()
}

/// Folds `records` (offsets 10, 11, ...) over `view` with `dimension`.
fn fold(view: &BTreeMap<String, Record>, dimension: Option<usize>, records: &[LogRecord]) -> BatchOutcome {
    fold_batch(view, dimension, records.iter().enumerate().map(|(i, r)| (10 + i as i64, r))).expect("well-formed batch")
}

fn long(v: i64) -> MetaValue {
    MetaValue::Long(v)
}

fn string(v: &str) -> MetaValue {
    MetaValue::String(v.to_string())
}

// ---- the table -------------------------------------------------------------

#[test]
fn add_of_absent_id_inserts_it() {
    let rec = with_doc(with_meta(log(Operation::Add, "a"), &[("k", long(1))]), "doc");
    let out = fold(&store(&[]), None, &[rec]);
    let mut expected = record("a", 10);
    expected.metadata.insert("k".into(), long(1));
    expected.document = Some("doc".into());
    assert_eq!(out.changes, vec![Change { id: "a".into(), before: None, after: Some(expected), offset: 10 }]);
    assert!(out.ignored.is_empty());
}

#[test]
fn add_of_live_id_is_ignored_as_add_existing() {
    let view = store(&[record("a", 3)]);
    let out = fold(&view, None, &[with_doc(log(Operation::Add, "a"), "new")]);
    assert!(out.changes.is_empty());
    assert_eq!(out.ignored, vec![(10, IgnoreReason::AddExisting)]);
    assert!(out.final_states().is_empty());
}

#[test]
fn update_of_live_id_merges_into_it() {
    let mut live = record("a", 3);
    live.metadata.insert("keep".into(), long(1));
    let out = fold(&store(&[live.clone()]), None, &[with_meta(log(Operation::Update, "a"), &[("new", long(2))])]);
    let mut after = live.clone();
    after.metadata.insert("new".into(), long(2));
    after.offset = 10;
    assert_eq!(out.changes, vec![Change { id: "a".into(), before: Some(live), after: Some(after), offset: 10 }]);
}

#[test]
fn update_of_absent_id_is_ignored_as_update_missing() {
    let out = fold(&store(&[]), None, &[with_doc(log(Operation::Update, "a"), "x")]);
    assert!(out.changes.is_empty());
    assert_eq!(out.ignored, vec![(10, IgnoreReason::UpdateMissing)]);
}

#[test]
fn update_of_id_deleted_earlier_in_the_batch_is_ignored() {
    let view = store(&[record("a", 3)]);
    let out = fold(&view, None, &[log(Operation::Delete, "a"), log(Operation::Update, "a")]);
    assert_eq!(out.changes.len(), 1);
    assert_eq!(out.ignored, vec![(11, IgnoreReason::UpdateMissing)]);
    assert_eq!(out.final_states(), BTreeMap::from([("a", None)]));
}

#[test]
fn upsert_of_live_id_merges_into_it() {
    let mut live = record("a", 3);
    live.document = Some("old".into());
    live.metadata.insert("k".into(), long(1));
    let out = fold(&store(&[live.clone()]), None, &[with_meta(log(Operation::Upsert, "a"), &[("k", long(2))])]);
    let mut after = live.clone();
    after.metadata.insert("k".into(), long(2));
    after.offset = 10;
    assert_eq!(out.changes[0].before, Some(live));
    assert_eq!(out.changes[0].after, Some(after));
    assert!(out.ignored.is_empty());
}

#[test]
fn upsert_of_absent_id_inserts_it() {
    let out = fold(&store(&[]), None, &[with_doc(log(Operation::Upsert, "a"), "d")]);
    let mut expected = record("a", 10);
    expected.document = Some("d".into());
    assert_eq!(out.changes[0].before, None);
    assert_eq!(out.changes[0].after, Some(expected));
}

#[test]
fn delete_of_live_id_removes_it() {
    let live = record("a", 3);
    let out = fold(&store(std::slice::from_ref(&live)), None, &[log(Operation::Delete, "a")]);
    assert_eq!(out.changes, vec![Change { id: "a".into(), before: Some(live), after: None, offset: 10 }]);
    assert_eq!(out.final_states(), BTreeMap::from([("a", None)]));
}

#[test]
fn delete_of_absent_id_is_ignored_as_delete_missing() {
    let out = fold(&store(&[]), None, &[log(Operation::Delete, "a")]);
    assert!(out.changes.is_empty());
    assert_eq!(out.ignored, vec![(10, IgnoreReason::DeleteMissing)]);
}

#[test]
fn backfill_fn_is_reported_as_control_and_changes_nothing() {
    let view = store(&[record("a", 3)]);
    // Even an embedding of the wrong length on a control record is not looked at.
    let marker = with_emb(log(Operation::BackfillFn, "a"), &[1.0]);
    let out = fold(&view, Some(3), &[marker, log(Operation::BackfillFn, "b")]);
    assert_eq!(out.controls, vec![10, 11]);
    assert!(out.changes.is_empty());
    assert!(out.ignored.is_empty());
    assert!(out.rejected.is_empty());
    assert_eq!(out.dimension, Some(3));
}

#[test]
fn ignored_records_leave_the_record_offset_alone() {
    let view = store(&[record("a", 3)]);
    let out = fold(&view, None, &[log(Operation::Upsert, "a"), log(Operation::Add, "a")]);
    assert_eq!(out.final_states()["a"].map(|r| r.offset), Some(10));
}

// ---- merge -------------------------------------------------------------------

#[test]
fn merge_removes_keys_set_to_null_and_overwrites_the_others() {
    let mut live = record("a", 3);
    live.metadata.insert("gone".into(), long(1));
    live.metadata.insert("changed".into(), long(1));
    live.metadata.insert("kept".into(), long(1));
    let update = with_meta(
        log(Operation::Update, "a"),
        &[
            ("gone", MetaValue::Null),
            ("changed", string("two")),
            ("added", MetaValue::Bool(true)),
            ("never", MetaValue::Null),
        ],
    );
    let out = fold(&store(&[live]), None, &[update]);
    let after = out.changes[0].after.as_ref().expect("merged");
    let expected: Metadata = [
        ("added".to_string(), MetaValue::Bool(true)),
        ("changed".to_string(), string("two")),
        ("kept".to_string(), long(1)),
    ]
    .into_iter()
    .collect();
    assert_eq!(after.metadata, expected);
}

#[test]
fn merge_keeps_document_embedding_and_metadata_the_record_does_not_carry() {
    let mut live = record("a", 3);
    live.document = Some("doc".into());
    live.embedding = Some(vec![1.0, 2.0].into());
    live.metadata.insert("k".into(), long(1));
    let out = fold(&store(&[live.clone()]), Some(2), &[log(Operation::Update, "a")]);
    let mut expected = live;
    expected.offset = 10;
    assert_eq!(out.changes[0].after, Some(expected));
}

#[test]
fn merge_replaces_document_and_embedding_the_record_carries() {
    let mut live = record("a", 3);
    live.document = Some("old".into());
    live.embedding = Some(vec![1.0, 2.0].into());
    let out = fold(&store(&[live]), Some(2), &[with_emb(with_doc(log(Operation::Upsert, "a"), "new"), &[3.0, 4.0])]);
    let after = out.changes[0].after.as_ref().expect("merged");
    assert_eq!(after.document.as_deref(), Some("new"));
    assert_eq!(after.embedding, Some(vec![3.0, 4.0].into()));
}

#[test]
fn insert_drops_null_metadata_values() {
    let add = with_meta(log(Operation::Add, "a"), &[("null", MetaValue::Null), ("k", long(1))]);
    let out = fold(&store(&[]), None, &[add]);
    let after = out.changes[0].after.as_ref().expect("inserted");
    assert_eq!(after.metadata, Metadata::from_iter([("k".to_string(), long(1))]));
}

#[test]
fn delete_then_add_in_one_batch_is_a_fresh_insert() {
    let mut live = record("a", 3);
    live.document = Some("old".into());
    live.embedding = Some(vec![1.0, 2.0].into());
    live.metadata.insert("old".into(), long(1));
    let add = with_meta(log(Operation::Add, "a"), &[("new", long(2))]);
    let out = fold(&store(&[live.clone()]), Some(2), &[log(Operation::Delete, "a"), add]);
    let mut fresh = record("a", 11);
    fresh.metadata.insert("new".into(), long(2));
    assert_eq!(
        out.changes,
        vec![
            Change { id: "a".into(), before: Some(live), after: None, offset: 10 },
            Change { id: "a".into(), before: None, after: Some(fresh.clone()), offset: 11 },
        ]
    );
    assert_eq!(out.final_states(), BTreeMap::from([("a", Some(&fresh))]));
}

#[test]
fn later_records_of_the_batch_see_the_earlier_ones() {
    let out = fold(
        &store(&[]),
        None,
        &[
            with_meta(log(Operation::Add, "a"), &[("x", long(1))]),
            with_meta(log(Operation::Update, "a"), &[("y", long(2))]),
            with_meta(log(Operation::Upsert, "a"), &[("x", MetaValue::Null)]),
        ],
    );
    assert_eq!(out.changes.len(), 3);
    assert_eq!(out.changes[1].before, out.changes[0].after);
    assert_eq!(out.changes[2].before, out.changes[1].after);
    let last = out.final_states()["a"].expect("live").clone();
    assert_eq!(last.metadata, Metadata::from_iter([("y".to_string(), long(2))]));
    assert_eq!(last.offset, 12);
}

// ---- dimension -----------------------------------------------------------------

#[test]
fn first_applied_embedding_fixes_the_dimension_within_the_batch() {
    let out = fold(
        &store(&[]),
        None,
        &[
            log(Operation::Add, "a"),
            with_emb(log(Operation::Upsert, "b"), &[1.0, 2.0, 3.0]),
            with_emb(log(Operation::Add, "c"), &[1.0, 2.0]),
            with_emb(log(Operation::Add, "d"), &[4.0, 5.0, 6.0]),
        ],
    );
    assert_eq!(out.dimension, Some(3));
    assert_eq!(out.rejected, vec![Rejected { offset: 12, id: "c".into(), expected: 3, actual: 2 }]);
    assert_eq!(out.final_states().keys().copied().collect::<Vec<_>>(), vec!["a", "b", "d"]);
}

#[test]
fn dimension_passed_in_rejects_other_lengths() {
    let out = fold(&store(&[]), Some(2), &[with_emb(log(Operation::Add, "a"), &[1.0, 2.0, 3.0])]);
    assert_eq!(out.rejected, vec![Rejected { offset: 10, id: "a".into(), expected: 2, actual: 3 }]);
    assert!(out.changes.is_empty());
    assert_eq!(out.dimension, Some(2));
}

#[test]
fn mismatch_is_rejected_even_for_records_that_would_be_ignored() {
    let view = store(&[record("live", 3)]);
    let wrong = |op, id| with_emb(log(op, id), &[1.0]);
    let out = fold(
        &view,
        Some(2),
        &[
            wrong(Operation::Add, "live"),      // would be add_existing
            wrong(Operation::Update, "absent"), // would be update_missing
            wrong(Operation::Delete, "absent"), // would be delete_missing
            wrong(Operation::Delete, "live"),   // would remove
        ],
    );
    assert_eq!(out.rejected.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![10, 11, 12, 13]);
    assert!(out.rejected.iter().all(|r| r.expected == 2 && r.actual == 1));
    assert!(out.ignored.is_empty());
    assert!(out.changes.is_empty());
}

#[test]
fn rejected_record_has_no_effect_at_all() {
    let mut live = record("a", 3);
    live.embedding = Some(vec![1.0, 2.0].into());
    live.metadata.insert("k".into(), long(1));
    let upsert = with_doc(with_meta(with_emb(log(Operation::Upsert, "a"), &[9.0]), &[("k", MetaValue::Null)]), "new");
    let out = fold(&store(&[live]), Some(2), &[upsert, log(Operation::Add, "a")]);
    assert!(out.changes.is_empty());
    // The ADD after it still sees the untouched live record.
    assert_eq!(out.ignored, vec![(11, IgnoreReason::AddExisting)]);
}

#[test]
fn ignored_records_do_not_fix_the_dimension() {
    let view = store(&[record("live", 3)]);
    let out = fold(
        &view,
        None,
        &[
            with_emb(log(Operation::Add, "live"), &[1.0]),           // add_existing
            with_emb(log(Operation::Update, "absent"), &[1.0, 2.0]), // update_missing
            with_emb(log(Operation::Delete, "absent"), &[1.0]),      // delete_missing
            with_emb(log(Operation::Add, "new"), &[1.0, 2.0, 3.0]),
        ],
    );
    assert!(out.rejected.is_empty());
    assert_eq!(out.ignored.len(), 3);
    assert_eq!(out.dimension, Some(3));
}

#[test]
fn applied_delete_with_an_embedding_does_not_fix_the_dimension() {
    let view = store(&[record("a", 3)]);
    let out = fold(
        &view,
        None,
        &[with_emb(log(Operation::Delete, "a"), &[1.0]), with_emb(log(Operation::Add, "b"), &[1.0, 2.0])],
    );
    assert!(out.rejected.is_empty());
    assert_eq!(out.changes.len(), 2);
    assert_eq!(out.dimension, Some(2));
}

#[test]
fn records_without_an_embedding_pass_whatever_the_dimension() {
    let out = fold(&store(&[]), Some(4), &[log(Operation::Add, "a"), log(Operation::Update, "a")]);
    assert!(out.rejected.is_empty());
    assert_eq!(out.changes.len(), 2);
    assert_eq!(out.dimension, Some(4));
}

#[test]
fn empty_batch_keeps_the_dimension() {
    let out = fold(&store(&[]), Some(7), &[]);
    assert_eq!(out, BatchOutcome { dimension: Some(7), ..BatchOutcome::default() });
}

// ---- preconditions -------------------------------------------------------------------

#[test]
fn offsets_out_of_order_refuse_the_batch() {
    let (a, b) = (log(Operation::Add, "a"), log(Operation::Add, "b"));
    let err = fold_batch(&store(&[]), None, [(5, &a), (4, &b)]).unwrap_err();
    assert_eq!(err, FoldError::OffsetNotIncreasing { previous: 5, offset: 4 });
}

#[test]
fn repeated_offset_refuses_the_batch() {
    let (a, b) = (log(Operation::Add, "a"), log(Operation::BackfillFn, "b"));
    let err = fold_batch(&store(&[]), None, [(5, &a), (5, &b)]).unwrap_err();
    assert_eq!(err, FoldError::OffsetNotIncreasing { previous: 5, offset: 5 });
}

#[test]
fn records_of_two_collections_refuse_the_batch() {
    let a = log(Operation::Add, "a");
    let other = LogRecord::data("other", "a", Operation::Add);
    let err = fold_batch(&store(&[]), None, [(1, &a), (2, &other)]).unwrap_err();
    assert_eq!(err, FoldError::MixedCollections { expected: C.into(), found: "other".into(), offset: 2 });
}

#[test]
fn fold_final_refuses_what_fold_batch_refuses() {
    let (a, b) = (log(Operation::Add, "a"), log(Operation::BackfillFn, "b"));
    let other = LogRecord::data("other", "a", Operation::Add);
    let refused = |records: Vec<(i64, LogRecord)>| fold_final(|_| None, None, records).unwrap_err();
    assert_eq!(
        refused(vec![(5, a.clone()), (4, b.clone())]),
        FoldError::OffsetNotIncreasing { previous: 5, offset: 4 }
    );
    assert_eq!(refused(vec![(5, a.clone()), (5, b)]), FoldError::OffsetNotIncreasing { previous: 5, offset: 5 });
    assert_eq!(
        refused(vec![(1, a), (2, other)]),
        FoldError::MixedCollections { expected: C.into(), found: "other".into(), offset: 2 }
    );
}

// ---- outcome and view ----------------------------------------------------------------

#[test]
fn final_states_hold_each_changed_id_once_in_id_order() {
    let view = store(&[record("b", 1), record("z", 2)]);
    let out = fold(
        &view,
        None,
        &[
            log(Operation::Upsert, "m"),
            log(Operation::Delete, "b"),
            log(Operation::Add, "z"), // ignored: not in final_states
            log(Operation::Update, "m"),
            log(Operation::Add, "a"),
        ],
    );
    let finals = out.final_states();
    assert_eq!(finals.keys().copied().collect::<Vec<_>>(), vec!["a", "b", "m"]);
    assert_eq!(finals["b"], None);
    assert_eq!(finals["m"].map(|r| r.offset), Some(13));
    assert_eq!(finals["a"].map(|r| r.offset), Some(14));
}

#[test]
fn view_is_asked_once_per_id_and_accepts_closures_and_hash_maps() {
    let calls = Cell::new(0);
    let view = |id: &str| {
        calls.set(calls.get() + 1);
        (id == "a").then(|| record("a", 1))
    };
    let records =
        [log(Operation::Update, "a"), log(Operation::Update, "a"), log(Operation::Add, "b"), log(Operation::Add, "b")];
    let out = fold_batch(&view, None, records.iter().enumerate().map(|(i, r)| (i as i64 + 2, r))).expect("ordered");
    assert_eq!(calls.get(), 2);
    assert_eq!(out.changes.len(), 3);

    let hash_view: HashMap<String, Record> = HashMap::from([("a".to_string(), record("a", 1))]);
    let from_hash =
        fold_batch(&hash_view, None, records.iter().enumerate().map(|(i, r)| (i as i64 + 2, r))).expect("ordered");
    assert_eq!(from_hash, out);
}

#[test]
fn ignore_reasons_have_their_metric_labels() {
    let labels: Vec<_> = IgnoreReason::ALL.iter().map(|r| r.label()).collect();
    assert_eq!(labels, vec!["add_existing", "update_missing", "delete_missing"]);
    assert_eq!(Rejected::REASON, "dimension_mismatch");
}
