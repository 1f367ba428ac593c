//! Conformance checks of attached functions (docs/design.md section 7, invariants 7-9):
//! attach and the outbox, markers and status transitions inside the batch transaction,
//! preimages, versioned map outputs and tombstones, counters, the chunked backfill with
//! its cursor CAS, detach — and, whatever the interleaving of live batches and backfill
//! steps, outputs equal to the function over the whole history.
//!
//! The functions under test are small ones defined here ([`TestCounter`], [`TestMap`]),
//! plus the registry's own in [`registry_functions_end_at_the_whole_history`]. Expected
//! outputs come from [`crate::functions::apply::apply_deltas`] (the in-memory reference of
//! how deltas apply).

use std::collections::{BTreeMap, BTreeSet};

use super::unique;
use crate::functions::apply::{apply_deltas, OutputStore};
use crate::functions::model::ModelOutput;
use crate::functions::{ChangeRef, Function, FunctionStatus, OutputDelta};
use crate::positions::PositionDelta;
use crate::record::{MetaValue, Metadata, Record};
use crate::sysdb::{
    AttachConflict, AttachOutcome, BatchCommit, CollectionUpdate, CommitReport, FunctionBatch, FunctionChange,
    FunctionRow, NewFunction, OutboxRow, StepResult, Sysdb,
};

/// Every check below, in sequence.
pub async fn run_all(db: &Sysdb) {
    attach_is_idempotent_and_fills_the_outbox(db).await;
    attach_rules_refuse_taken_outputs_and_chains(db).await;
    lost_markers_are_found_by_their_published_offset(db).await;
    markers_move_the_status_and_gate_the_changes(db).await;
    backfill_walks_in_chunks_with_a_cursor_cas(db).await;
    versioned_map_writes_never_go_back(db).await;
    counts_vanish_at_zero_only_when_asked(db).await;
    detach_stops_everything_and_can_drop_the_output(db).await;
    outputs_match_the_reference_for_random_deltas(db).await;
    random_interleavings_end_at_the_whole_history(db).await;
    registry_functions_end_at_the_whole_history(db).await;
}

// ---- test functions ----

fn count(output_id: &str, fields: Metadata, delta: i64, remove_at_zero: bool) -> OutputDelta {
    OutputDelta::Count { output_id: output_id.into(), fields, count_field: "count".into(), delta, remove_at_zero }
}

/// Counts live records (`total`, kept at 0) and live records per `color` (`color=<c>`,
/// removed at 0): an aggregate.
pub struct TestCounter;

impl Function for TestCounter {
    fn name(&self) -> &'static str {
        "test_counter"
    }

    fn deltas(&self, c: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        let d = i64::from(c.after.is_some()) - i64::from(c.before.is_some());
        if d != 0 {
            out.push(count("total", Metadata::new(), d, false));
        }
        for (r, sign) in [(c.before, -1), (c.after, 1)] {
            if let Some(MetaValue::String(color)) = r.and_then(|r| r.metadata.get("color")) {
                let fields = Metadata::from_iter([("color".to_string(), MetaValue::String(color.clone()))]);
                out.push(count(&format!("color={color}"), fields, sign, true));
            }
        }
    }
}

/// Copies each record with its document upper-cased: a map, versioned by the source
/// offset.
pub struct TestMap;

impl Function for TestMap {
    fn name(&self) -> &'static str {
        "test_map"
    }

    fn deltas(&self, c: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        out.push(match c.after {
            Some(a) => OutputDelta::Put {
                record: Record {
                    id: c.id.to_string(),
                    embedding: a.embedding.clone(),
                    metadata: a.metadata.clone(),
                    document: a.document.as_ref().map(|d| d.to_uppercase()),
                    offset: c.offset,
                },
            },
            None => OutputDelta::Remove { id: c.id.to_string(), offset: c.offset },
        });
    }
}

// ---- a tiny log + materializer driving commit_batch ----

/// One log operation.
#[derive(Debug, Clone)]
pub enum Op {
    Put(String, &'static str),
    Del(String),
    /// `(function id, request id)`.
    Marker(String, String),
}

pub(crate) fn put(id: &str, color: &'static str) -> Op {
    Op::Put(id.to_string(), color)
}

pub(crate) fn del(id: &str) -> Op {
    Op::Del(id.to_string())
}

pub(crate) fn marker(row: &FunctionRow) -> Op {
    Op::Marker(row.id.clone(), row.request_id.clone())
}

#[derive(Debug, Clone)]
struct Change {
    offset: i64,
    id: String,
    before: Option<Record>,
    after: Option<Record>,
}

/// One collection on its own topic: folds operations into records, builds each batch
/// (record writes + every function's changes and deltas, unfiltered: the sysdb decides
/// what applies) and remembers the whole history for the expected outputs.
pub struct Log {
    topic: String,
    partition: i32,
    pub collection: String,
    next: i64,
    current: BTreeMap<String, Record>,
    history: Vec<Change>,
    /// Whether batches carry their changes to the change feed's outbox.
    pub changelog: bool,
}

impl Log {
    pub async fn new(db: &Sysdb, partition: i32) -> Log {
        let topic = unique("fn-topic");
        db.init_position(&topic, partition, 0).await.expect("init");
        Log {
            topic,
            partition,
            collection: unique("fn-coll"),
            next: 0,
            current: BTreeMap::new(),
            history: Vec::new(),
            changelog: false,
        }
    }

    pub fn partition(&self) -> i32 {
        self.partition
    }

    fn build(&self, ops: &[Op], fns: &[(&str, &dyn Function)]) -> (BatchCommit, BTreeMap<String, Record>, Vec<Change>) {
        let mut working = self.current.clone();
        let mut changes = Vec::new();
        let mut markers = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            let offset = self.next + i as i64;
            match op {
                Op::Put(id, color) => {
                    let after = Record {
                        id: id.clone(),
                        embedding: Some(vec![offset as f32, 3.0 - (offset % 7) as f32].into()),
                        metadata: Metadata::from_iter([("color".to_string(), MetaValue::String(color.to_string()))]),
                        document: Some(format!("{id} at {offset}")),
                        offset,
                    };
                    let before = working.insert(id.clone(), after.clone());
                    changes.push(Change { offset, id: id.clone(), before, after: Some(after) });
                }
                Op::Del(id) => {
                    if let Some(before) = working.remove(id) {
                        changes.push(Change { offset, id: id.clone(), before: Some(before), after: None });
                    }
                }
                Op::Marker(f, request) => markers.push((offset, f.clone(), request.clone())),
            }
        }
        let to = self.next + ops.len() as i64;
        let touched: BTreeSet<&String> = changes.iter().map(|c| &c.id).collect();
        let writes = touched.into_iter().map(|id| (id.clone(), working.get(id).cloned())).collect();
        let update = CollectionUpdate {
            id: self.collection.clone(),
            partition: self.partition,
            dimension: Some(2),
            log_position: to - 1,
            record_count_delta: working.len() as i64 - self.current.len() as i64,
            writes,
        };
        let functions = fns
            .iter()
            .map(|(fid, f)| FunctionBatch {
                failure: None,
                function_id: fid.to_string(),
                markers: markers.iter().filter(|(_, m, _)| m == fid).map(|(o, _, r)| (*o, r.clone())).collect(),
                changes: changes
                    .iter()
                    .map(|c| {
                        let mut deltas = Vec::new();
                        f.deltas(
                            &ChangeRef {
                                id: &c.id,
                                before: c.before.as_ref(),
                                after: c.after.as_ref(),
                                offset: c.offset,
                            },
                            &mut deltas,
                        );
                        FunctionChange { offset: c.offset, id: c.id.clone(), before: c.before.clone(), deltas }
                    })
                    .collect(),
            })
            .collect();
        let delta = PositionDelta::new(self.partition, self.next, to).expect("delta");
        let outbox = if self.changelog {
            changes
                .iter()
                .map(|c| crate::sysdb::OutboxChange {
                    collection_id: self.collection.clone(),
                    record_id: c.id.clone(),
                    op: match (&c.before, &c.after) {
                        (None, _) => crate::sysdb::ChangeOp::Insert,
                        (Some(_), Some(_)) => crate::sysdb::ChangeOp::Update,
                        (Some(_), None) => crate::sysdb::ChangeOp::Delete,
                    },
                    source_offset: c.offset,
                    value: c.after.as_ref().map(|r| crate::record::change::encode_change(&self.collection, r)),
                })
                .collect()
        } else {
            Vec::new()
        };
        (
            BatchCommit {
                topic: self.topic.clone(),
                delta,
                collections: vec![update],
                functions,
                changelog: self.changelog,
                changes: outbox,
            },
            working,
            changes,
        )
    }

    /// Commit `ops` (at least one) as one batch for the functions `fns`.
    pub async fn commit(&mut self, db: &Sysdb, ops: &[Op], fns: &[(&str, &dyn Function)]) -> CommitReport {
        assert!(!ops.is_empty());
        let (batch, working, changes) = self.build(ops, fns);
        let report = db.commit_batch(batch.clone()).await.expect("commit_batch with functions");
        self.current = working;
        self.history.extend(changes);
        self.next = batch.delta.to;
        report
    }

    /// Commit a batch without record writes whose function `fid` gets one change per
    /// element of `deltas`, carrying exactly those deltas (offsets are consecutive).
    pub async fn commit_deltas(&mut self, db: &Sysdb, fid: &str, deltas: Vec<Vec<OutputDelta>>) -> CommitReport {
        let to = self.next + deltas.len() as i64;
        let changes = deltas
            .into_iter()
            .enumerate()
            .map(|(i, deltas)| FunctionChange {
                offset: self.next + i as i64,
                id: format!("src-{i}"),
                before: None,
                deltas,
            })
            .collect();
        let batch = BatchCommit {
            topic: self.topic.clone(),
            delta: PositionDelta::new(self.partition, self.next, to).expect("delta"),
            collections: Vec::new(),
            functions: vec![FunctionBatch {
                function_id: fid.to_string(),
                markers: Vec::new(),
                changes,
                failure: None,
            }],
            changelog: false,
            changes: Vec::new(),
        };
        let report = db.commit_batch(batch).await.expect("commit_batch with crafted deltas");
        self.next = to;
        report
    }

    /// The output of `f` over the whole history (docs/design.md invariant 8), optionally only
    /// of the changes after `after`.
    fn expected_after(&self, f: &dyn Function, after: Option<i64>) -> BTreeMap<String, ModelOutput> {
        let mut store = OutputStore::default();
        for c in self.history.iter().filter(|c| after.is_none_or(|o| c.offset > o)) {
            let mut out = Vec::new();
            f.deltas(
                &ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset },
                &mut out,
            );
            apply_deltas(&mut store, &out, false);
        }
        store.contents()
    }

    pub fn expected(&self, f: &dyn Function) -> BTreeMap<String, ModelOutput> {
        self.expected_after(f, None)
    }
}

pub async fn attach(db: &Sysdb, log: &Log, function: &str, output: &str) -> FunctionRow {
    let new = NewFunction {
        id: unique("fn"),
        collection_id: log.collection.clone(),
        partition: log.partition,
        function: function.into(),
        output_collection: output.into(),
        params: BTreeMap::new(),
        request_id: unique("req"),
    };
    match db.attach_function(&new).await.expect("attach_function") {
        AttachOutcome::Created(row, outbox) => {
            // Keep the shared outbox small: these markers are "published" by the test.
            db.mark_outbox_sent(outbox.id, None).await.expect("mark_outbox_sent");
            row
        }
        other => panic!("fresh attach of {function} -> {output}: {other:?}"),
    }
}

async fn function(db: &Sysdb, id: &str) -> FunctionRow {
    db.function(id).await.expect("function").expect("function exists")
}

async fn output(db: &Sysdb, collection: &str) -> BTreeMap<String, ModelOutput> {
    let records = db.list_records(collection, None, usize::MAX).await.expect("list_records");
    if let Some(row) = db.collection(collection).await.expect("collection") {
        assert_eq!(
            row.record_count,
            records.len() as i64,
            "record_count of output {collection} does not match its records"
        );
    }
    records
        .into_iter()
        .map(|r| (r.id.clone(), ModelOutput { embedding: r.embedding, metadata: r.metadata, document: r.document }))
        .collect()
}

async fn assert_output(db: &Sysdb, row: &FunctionRow, want: &BTreeMap<String, ModelOutput>, what: &str) {
    let got = output(db, &row.output_collection).await;
    if &got != want {
        let ids: BTreeSet<&String> = got.keys().chain(want.keys()).collect();
        let diff: Vec<String> = ids
            .into_iter()
            .filter(|id| got.get(*id) != want.get(*id))
            .take(8)
            .map(|id| format!("  {id}:\n    got  {:?}\n    want {:?}", got.get(id), want.get(id)))
            .collect();
        panic!(
            "{what}: output of {} ({}) differs ({} vs {} records), first differences:\n{}",
            row.function,
            row.id,
            got.len(),
            want.len(),
            diff.join("\n")
        );
    }
}

/// Run the backfill of `id` to the end in chunks of `chunk`; returns the number of steps.
async fn backfill_all(db: &Sysdb, id: &str, f: &dyn Function, chunk: usize) -> usize {
    let mut cursor = function(db, id).await.backfill_cursor;
    let mut steps = 0;
    loop {
        steps += 1;
        match db.backfill_step(id, cursor.as_deref(), chunk, f).await.expect("backfill_step") {
            StepResult::Applied { processed, cursor: c, finished, .. } => {
                assert!(processed <= chunk, "a chunk larger than the limit");
                cursor = c;
                if finished {
                    return steps;
                }
            }
            other => panic!("backfill of {id}: unexpected {other:?}"),
        }
    }
}

fn doc_of(out: &BTreeMap<String, ModelOutput>, id: &str) -> Option<String> {
    out.get(id).and_then(|o| o.document.clone())
}

fn count_of(out: &BTreeMap<String, ModelOutput>, id: &str) -> Option<i64> {
    match out.get(id).and_then(|o| o.metadata.get("count")) {
        Some(MetaValue::Long(n)) => Some(*n),
        other => other.map(|v| panic!("count of {id} is {v:?}")),
    }
}

// ---- the checks ----

pub async fn attach_is_idempotent_and_fills_the_outbox(db: &Sysdb) {
    let log = Log::new(db, 2).await;
    let (out1, out2) = (unique("out"), unique("out"));
    let new = |output: &str| NewFunction {
        id: unique("fn"),
        collection_id: log.collection.clone(),
        partition: 2,
        function: "test_counter".into(),
        output_collection: output.into(),
        params: BTreeMap::from([("p".to_string(), "v \"q\"".to_string())]),
        request_id: unique("req"),
    };
    let first = new(&out1);
    let (row, outbox) = match db.attach_function(&first).await.expect("attach") {
        AttachOutcome::Created(row, outbox) => (row, outbox),
        other => panic!("first attach: {other:?}"),
    };
    assert_eq!(
        (row.id.as_str(), row.status, row.request_id.as_str()),
        (first.id.as_str(), FunctionStatus::AwaitingMarker, first.request_id.as_str())
    );
    assert_eq!(
        (row.collection_id.as_str(), row.output_collection.as_str(), &row.params),
        (log.collection.as_str(), out1.as_str(), &first.params)
    );
    assert_eq!(
        (row.marker_offset, row.backfill_cursor.as_deref(), row.backfill_done, row.backfill_total),
        (None, None, 0, None)
    );
    assert_eq!(
        (outbox.function_id.as_str(), outbox.partition, outbox.request_id.as_str()),
        (row.id.as_str(), 2, row.request_id.as_str())
    );
    let out_row = db.collection(&out1).await.expect("collection").expect("output collection registered by attach");
    assert_eq!((out_row.partition, out_row.record_count, out_row.log_position), (2, 0, -1));

    // The same (collection, output) again: the existing function, no second marker.
    match db.attach_function(&new(&out1)).await.expect("attach again") {
        AttachOutcome::Existing(existing) => assert_eq!(existing, row),
        other => panic!("second attach: {other:?}"),
    }
    let second = attach(db, &log, "test_map", &out2).await;
    let pending = |rows: Vec<crate::sysdb::OutboxRow>| -> Vec<i64> {
        rows.into_iter().filter(|o| o.function_id == row.id || o.function_id == second.id).map(|o| o.id).collect()
    };
    assert_eq!(
        pending(db.outbox_pending(usize::MAX).await.expect("outbox")),
        [outbox.id],
        "one pending marker for the first function"
    );
    let all = db.outbox_pending(usize::MAX).await.expect("outbox");
    assert!(all.windows(2).all(|w| w[0].id < w[1].id), "outbox_pending not oldest first");
    db.mark_outbox_sent(outbox.id, None).await.expect("mark sent");
    db.mark_outbox_sent(outbox.id, None).await.expect("mark sent twice is harmless");
    assert!(pending(db.outbox_pending(usize::MAX).await.expect("outbox")).is_empty(), "a sent marker is still pending");

    let listed = db.functions(Some(&log.collection)).await.expect("functions");
    assert_eq!(
        listed.iter().map(|f| f.id.as_str()).collect::<Vec<_>>(),
        [row.id.as_str(), second.id.as_str()],
        "functions() in creation order"
    );
    assert!(db.functions(None).await.expect("all functions").iter().any(|f| f.id == second.id));
    assert_eq!(db.function(&row.id).await.expect("function"), Some(row.clone()));
    assert_eq!(db.function("no-such-function").await.expect("function"), None);

    // Detached while its output is still empty: the output name is free again (the new
    // function starts from the empty output).
    let before = db.detach_function(&row.id, false).await.expect("detach").expect("known");
    assert_eq!(before.status, FunctionStatus::AwaitingMarker, "detach returns the row as it was");
    assert_eq!(function(db, &row.id).await.status, FunctionStatus::Detached);
    let again = attach(db, &log, "test_counter", &out1).await;
    assert_ne!(again.id, row.id);
}

fn new_function(collection: &str, partition: i32, function: &str, output: &str) -> NewFunction {
    NewFunction {
        id: unique("fn"),
        collection_id: collection.into(),
        partition,
        function: function.into(),
        output_collection: output.into(),
        params: BTreeMap::new(),
        request_id: unique("req"),
    }
}

fn created(outcome: AttachOutcome) -> (FunctionRow, OutboxRow) {
    match outcome {
        AttachOutcome::Created(row, outbox) => (row, outbox),
        other => panic!("expected a new function, got {other:?}"),
    }
}

/// The conflict of a refused attach; nothing of it may be stored.
async fn refused(db: &Sysdb, new: &NewFunction, what: &str) -> AttachConflict {
    // Only this collection's markers: other tests may share the database and attach
    // functions of their own meanwhile.
    let pending_here = || async {
        db.outbox_pending(usize::MAX)
            .await
            .expect("outbox")
            .into_iter()
            .filter(|o| o.collection_id == new.collection_id)
            .count()
    };
    let pending_before = pending_here().await;
    let conflict = match db.attach_function(new).await.expect("attach_function") {
        AttachOutcome::Refused(c) => c,
        other => panic!("{what}: expected a refusal, got {other:?}"),
    };
    assert_eq!(db.function(&new.id).await.expect("function"), None, "{what}: a refused attach stored its function");
    assert_eq!(pending_here().await, pending_before, "{what}: a refused attach queued a marker");
    conflict
}

/// Outputs have one live writer and are never data collections nor function inputs; a
/// function never reads another's output; an output left with records by a detached
/// function is refused until dropped, and reused once dropped.
pub async fn attach_rules_refuse_taken_outputs_and_chains(db: &Sysdb) {
    let mut log = Log::new(db, 1).await;
    log.commit(db, &[put("a", "red"), put("b", "blue")], &[]).await;
    let mut other = Log::new(db, 1).await;
    other.commit(db, &[put("x", "red")], &[]).await;
    let out = unique("out");
    let f = attach(db, &log, "test_counter", &out).await;

    // The same (collection, function, parameters, output): the existing function.
    match db.attach_function(&new_function(&log.collection, 1, "test_counter", &out)).await.expect("attach again") {
        AttachOutcome::Existing(e) => assert_eq!(e.id, f.id),
        o => panic!("same attach again: {o:?}"),
    }
    // Another function, other parameters, another input: the output is taken.
    for (new, what) in [
        (new_function(&log.collection, 1, "test_map", &out), "another function on the same output"),
        (
            NewFunction {
                params: BTreeMap::from([("k".to_string(), "v".to_string())]),
                ..new_function(&log.collection, 1, "test_counter", &out)
            },
            "other parameters",
        ),
        (new_function(&other.collection, 1, "test_counter", &out), "another input writing the same output"),
    ] {
        assert_eq!(refused(db, &new, what).await, AttachConflict::OutputWrittenBy(function(db, &f.id).await), "{what}");
    }
    // A data collection as output.
    let c =
        refused(db, &new_function(&log.collection, 1, "test_counter", &other.collection), "data collection as output")
            .await;
    assert_eq!(c, AttachConflict::OutputIsData { output: other.collection.clone() });
    assert_eq!(db.collection(&other.collection).await.expect("collection").expect("still there").record_count, 1);
    // A function's output as input.
    let c = refused(db, &new_function(&out, 1, "test_counter", &unique("out")), "a function's output as input").await;
    assert_eq!(c, AttachConflict::InputIsOutputOf(function(db, &f.id).await));
    // A function's input (not yet a registered collection) as output.
    let unregistered = unique("fn-coll");
    let (h, _) = created(
        db.attach_function(&new_function(&unregistered, 1, "test_counter", &unique("out"))).await.expect("attach"),
    );
    let c =
        refused(db, &new_function(&log.collection, 1, "test_counter", &unregistered), "a function's input as output")
            .await;
    assert_eq!(c, AttachConflict::OutputIsInputOf(function(db, &h.id).await));
    db.detach_function(&h.id, true).await.expect("detach").expect("known");

    // f writes records, then is detached without dropping them: refused, naming f.
    log.commit(db, &[marker(&f), put("c", "green")], &[(&f.id, &TestCounter)]).await;
    backfill_all(db, &f.id, &TestCounter, 10).await;
    assert!(!output(db, &out).await.is_empty());
    db.detach_function(&f.id, false).await.expect("detach").expect("known");
    let c =
        refused(db, &new_function(&log.collection, 1, "test_counter", &out), "an output left by a detached function")
            .await;
    assert_eq!(c, AttachConflict::OutputLeftBy(function(db, &f.id).await));
    // Dropped: the name is free, the new function starts from nothing.
    db.detach_function(&f.id, true).await.expect("detach").expect("known");
    let again = attach(db, &log, "test_counter", &out).await;
    assert!(output(db, &out).await.is_empty());
    log.commit(db, &[marker(&again), put("d", "red")], &[(&again.id, &TestCounter)]).await;
    backfill_all(db, &again.id, &TestCounter, 10).await;
    assert_output(db, &again, &log.expected(&TestCounter), "re-attached after --drop-output").await;
}

/// A sent marker is lost when its function still awaits it and the partition's
/// `next_offset` is past the offset it was published at; accepted, pending, detached and
/// not-yet-reached markers are not.
pub async fn lost_markers_are_found_by_their_published_offset(db: &Sysdb) {
    let mut log = Log::new(db, 3).await;
    log.commit(db, &[put("a", "red"), put("b", "blue")], &[]).await; // next_offset 2
    let topic = log.topic.clone();
    let lost = || async {
        let rows = db.lost_markers(&topic, usize::MAX).await.expect("lost_markers");
        rows.into_iter().map(|o| (o.function_id, o.published_offset)).collect::<Vec<_>>()
    };
    let (f, fo) = created(
        db.attach_function(&new_function(&log.collection, 3, "test_counter", &unique("out"))).await.expect("attach"),
    );
    let (g, go) = created(
        db.attach_function(&new_function(&log.collection, 3, "test_counter", &unique("out"))).await.expect("attach"),
    );
    let (h, ho) = created(
        db.attach_function(&new_function(&log.collection, 3, "test_counter", &unique("out"))).await.expect("attach"),
    );
    assert_eq!(fo.published_offset, None);
    let oldest = db.oldest_awaiting_marker_ms().await.expect("oldest").expect("functions are awaiting");
    assert!(oldest <= f.created_at_ms, "oldest awaiting {oldest} is younger than {}", f.created_at_ms);
    assert!(lost().await.is_empty(), "pending markers are not lost");
    db.mark_outbox_sent(fo.id, Some(2)).await.expect("sent");
    db.mark_outbox_sent(fo.id, Some(99)).await.expect("sent twice keeps the first offset");
    db.mark_outbox_sent(go.id, Some(3)).await.expect("sent");
    db.mark_outbox_sent(ho.id, Some(2)).await.expect("sent");
    db.detach_function(&h.id, false).await.expect("detach").expect("known");
    assert!(lost().await.is_empty(), "no marker passed yet");

    // The batch [2, 3) passes f's marker without it (dead-lettered): f's marker is lost.
    log.commit(db, &[put("c", "red")], &[]).await;
    assert_eq!(lost().await, [(f.id.clone(), Some(2))]);
    assert!(db.lost_markers(&unique("fn-topic"), usize::MAX).await.expect("lost").is_empty(), "another topic");
    assert_eq!(db.lost_markers(&log.topic, 0).await.expect("lost").len(), 0, "the limit");

    // Published again at 5: not lost until the partition passes 5; accepted then.
    db.mark_marker_republished(fo.id, 5).await.expect("republished");
    assert!(lost().await.is_empty(), "a republished marker not yet reached");
    let fns: &[(&str, &dyn Function)] = &[(&f.id, &TestCounter), (&g.id, &TestCounter)];
    let report = log.commit(db, &[marker(&g), put("d", "red"), marker(&f)], fns).await;
    let accepted: BTreeSet<(String, i64)> = report.markers_accepted.into_iter().collect();
    assert_eq!(accepted, BTreeSet::from([(g.id.clone(), 3), (f.id.clone(), 5)]));
    assert!(lost().await.is_empty(), "accepted markers are not lost");

    // An operator reset past a marker.
    let (k, ko) = created(
        db.attach_function(&new_function(&log.collection, 3, "test_counter", &unique("out"))).await.expect("attach"),
    );
    db.mark_outbox_sent(ko.id, Some(6)).await.expect("sent");
    assert!(lost().await.is_empty(), "next_offset 6 has not passed the marker at 6");
    db.reset_position(&log.topic, 3, 50, "conformance", "skip ahead").await.expect("reset");
    assert_eq!(lost().await, [(k.id.clone(), Some(6))]);
    db.detach_function(&k.id, false).await.expect("detach").expect("known");
    assert!(lost().await.is_empty(), "a detached function's marker is not lost");
}

pub async fn markers_move_the_status_and_gate_the_changes(db: &Sysdb) {
    let mut log = Log::new(db, 0).await;
    let f = attach(db, &log, "test_counter", &unique("out")).await;
    let fns: &[(&str, &dyn Function)] = &[(&f.id, &TestCounter)];

    // Awaiting its marker: nothing applies.
    let report = log.commit(db, &[put("a", "red"), put("b", "blue")], fns).await;
    assert_eq!(report, CommitReport::default());
    assert!(output(db, &f.output_collection).await.is_empty(), "changes applied before the marker");

    // A wrong request id is ignored, the right one starts the backfill at its offset, a
    // second copy in the same batch is ignored; only changes after the marker apply.
    let m = log.next + 2;
    let report = log
        .commit(
            db,
            &[
                put("c", "red"),
                Op::Marker(f.id.clone(), "stale-request".into()),
                marker(&f),
                put("d", "blue"),
                del("a"),
                marker(&f),
            ],
            fns,
        )
        .await;
    assert_eq!(report.markers_accepted, [(f.id.clone(), m)]);
    assert_eq!(report.markers_ignored, 2);
    let row = function(db, &f.id).await;
    assert_eq!((row.status, row.marker_offset), (FunctionStatus::Backfilling, Some(m)));
    assert_eq!(
        db.preimage_count(&f.id).await.expect("preimages"),
        1,
        "the delete of a (written before the marker) saves its preimage"
    );
    assert_output(db, &f, &log.expected_after(&TestCounter, Some(m)), "live deltas after the marker only").await;
    let live = output(db, &f.output_collection).await;
    assert_eq!(
        (count_of(&live, "total"), count_of(&live, "color=blue"), count_of(&live, "color=red")),
        (Some(0), Some(1), Some(-1))
    );

    // Re-adding a (no before), updating b twice: one more preimage (b's first change).
    log.commit(db, &[put("a", "green"), put("b", "green"), put("b", "red")], fns).await;
    assert_eq!(
        db.preimage_count(&f.id).await.expect("preimages"),
        2,
        "exactly one preimage per record changed after the marker"
    );

    // A duplicate marker later (the outbox relay republished it): ignored.
    let report = log.commit(db, &[marker(&f)], fns).await;
    assert_eq!((report.markers_accepted.len(), report.markers_ignored), (0, 1));
    assert_eq!(function(db, &f.id).await.marker_offset, Some(m), "a duplicate marker moved the marker offset");

    // The backfill covers the collection as of the marker: a, b, c.
    let steps = backfill_all(db, &f.id, &TestCounter, 2).await;
    assert_eq!(steps, 2);
    let row = function(db, &f.id).await;
    assert_eq!((row.status, row.backfill_done, row.backfill_total), (FunctionStatus::Ready, 3, Some(3)));
    assert_eq!(db.preimage_count(&f.id).await.expect("preimages"), 0, "preimages kept after the backfill");
    assert_output(db, &f, &log.expected(&TestCounter), "after the backfill").await;

    // Ready: every change applies.
    log.commit(db, &[put("e", "red"), del("c"), put("a", "blue")], fns).await;
    assert_output(db, &f, &log.expected(&TestCounter), "ready").await;
    assert_eq!(db.preimage_count(&f.id).await.expect("preimages"), 0, "a ready function saved a preimage");
}

pub async fn backfill_walks_in_chunks_with_a_cursor_cas(db: &Sysdb) {
    let mut log = Log::new(db, 1).await;
    let colors = ["red", "blue", "green"];
    let initial: Vec<Op> = (0..7).map(|i| put(&format!("r{i}"), colors[i % 3])).collect();
    log.commit(db, &initial, &[]).await;
    let fm = attach(db, &log, "test_map", &unique("out")).await;
    let fc = attach(db, &log, "test_counter", &unique("out")).await;
    let fns: &[(&str, &dyn Function)] = &[(&fm.id, &TestMap), (&fc.id, &TestCounter)];
    let report = log.commit(db, &[marker(&fm), marker(&fc), put("r2", "blue"), del("r4"), put("r9", "red")], fns).await;
    assert_eq!(report.markers_accepted.len(), 2);
    assert_eq!(db.preimage_count(&fm.id).await.expect("preimages"), 2);

    // First chunk: r0, r1 (current rows) and r2 (its preimage).
    let step = db.backfill_step(&fm.id, None, 3, &TestMap).await.expect("step");
    assert_eq!(applied(step), Some((3, Some("r2".into()), false)));
    let out = output(db, &fm.output_collection).await;
    assert_eq!(out.keys().map(String::as_str).collect::<Vec<_>>(), ["r0", "r1", "r2", "r9"]);
    assert_eq!(
        doc_of(&out, "r2"),
        Some(format!("R2 AT {}", log.next - 3)),
        "the backfilled (older) r2 overwrote the live one"
    );
    let row = function(db, &fm.id).await;
    assert_eq!((row.backfill_done, row.backfill_total, row.backfill_cursor.as_deref()), (3, Some(7), Some("r2")));

    // A stale cursor (a duplicate worker): refused, nothing applied.
    let step = db.backfill_step(&fm.id, None, 3, &TestMap).await.expect("stale step");
    assert_eq!(step, StepResult::CursorMoved { cursor: Some("r2".into()) });
    let step = db.backfill_step(&fm.id, Some("r1"), 3, &TestMap).await.expect("stale step");
    assert_eq!(step, StepResult::CursorMoved { cursor: Some("r2".into()) });
    assert_eq!(output(db, &fm.output_collection).await, out, "a refused step wrote outputs");
    assert_eq!(function(db, &fm.id).await.backfill_done, 3, "a refused step advanced backfill_done");

    // Live changes between chunks: r5 gets a preimage, r0 (already covered) too.
    log.commit(db, &[put("r5", "green"), del("r0"), put("r10", "blue")], fns).await;
    let step = db.backfill_step(&fm.id, Some("r2"), 3, &TestMap).await.expect("step");
    assert_eq!(applied(step), Some((3, Some("r5".into()), false)));
    let out = output(db, &fm.output_collection).await;
    assert!(!out.contains_key("r4"), "the backfill resurrected r4, deleted after the marker (tombstone ignored)");
    assert!(
        doc_of(&out, "r5").is_some_and(|d| d.ends_with(&format!("{}", log.next - 3))),
        "backfilled r5 overwrote the live one"
    );

    let step = db.backfill_step(&fm.id, Some("r5"), 3, &TestMap).await.expect("last step");
    assert_eq!(applied(step), Some((1, Some("r6".into()), true)));
    let row = function(db, &fm.id).await;
    assert_eq!((row.status, row.backfill_done, row.backfill_total), (FunctionStatus::Ready, 7, Some(7)));
    assert_eq!(db.preimage_count(&fm.id).await.expect("preimages"), 0);
    assert!(db.preimage_count(&fc.id).await.expect("preimages") > 0, "another function's preimages were deleted");
    assert_output(db, &fm, &log.expected(&TestMap), "map after its backfill").await;
    assert_eq!(db.backfill_step(&fm.id, Some("r6"), 3, &TestMap).await.expect("step"), StepResult::NotBackfilling);
    assert_eq!(
        db.backfill_step("no-such-function", None, 3, &TestMap).await.expect("step"),
        StepResult::NotBackfilling
    );

    // The counter, walked one record at a time while live batches go on.
    log.commit(db, &[put("r1", "red"), put("r11", "green")], fns).await;
    let mut cursor = None;
    loop {
        match db.backfill_step(&fc.id, cursor.as_deref(), 1, &TestCounter).await.expect("step") {
            StepResult::Applied { cursor: c, finished, .. } => {
                cursor = c;
                if finished {
                    break;
                }
            }
            other => panic!("{other:?}"),
        }
        log.commit(db, &[put("r3", "red")], fns).await;
    }
    assert_output(db, &fc, &log.expected(&TestCounter), "counter after its backfill").await;
    assert_output(db, &fm, &log.expected(&TestMap), "map, ready, after more live batches").await;
}

pub async fn versioned_map_writes_never_go_back(db: &Sysdb) {
    let mut log = Log::new(db, 0).await;
    let f = attach(db, &log, "test_map", &unique("out")).await;
    log.commit(db, &[marker(&f)], &[(&f.id, &TestMap)]).await;
    let put_at = |id: &str, v: i64, doc: &str| OutputDelta::Put {
        record: Record {
            id: id.into(),
            embedding: Some(vec![v as f32; 3].into()),
            metadata: Metadata::new(),
            document: Some(doc.into()),
            offset: v,
        },
    };
    let remove_at = |id: &str, v: i64| OutputDelta::Remove { id: id.into(), offset: v };

    // Backfilling: versioned.
    log.commit_deltas(
        db,
        &f.id,
        vec![vec![put_at("x", 10, "new")], vec![put_at("x", 5, "old")], vec![remove_at("y", 12)]],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert_eq!((doc_of(&out, "x").as_deref(), out.contains_key("y")), (Some("new"), false));
    assert_eq!(
        db.collection(&f.output_collection).await.expect("collection").expect("row").dimension,
        Some(3),
        "output dimension not set"
    );
    log.commit_deltas(
        db,
        &f.id,
        vec![
            vec![put_at("y", 11, "resurrected")],
            vec![remove_at("x", 9)],
            vec![put_at("z", 3, "z")],
            vec![put_at("x", 10, "same version")],
        ],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert!(!out.contains_key("y"), "a put older than the tombstone resurrected y");
    assert_eq!(doc_of(&out, "x").as_deref(), Some("new"), "an older remove or an equal-version put changed x");
    assert_eq!(doc_of(&out, "z").as_deref(), Some("z"));
    log.commit_deltas(
        db,
        &f.id,
        vec![vec![put_at("y", 13, "back")], vec![remove_at("z", 4), put_at("z", 4, "tie loses")]],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert_eq!(
        (doc_of(&out, "y").as_deref(), out.contains_key("z")),
        (Some("back"), false),
        "a newer put after a tombstone / a remove"
    );

    // Finish the backfill (nothing as of the marker): ready, unversioned, tombstones gone.
    assert_eq!(backfill_all(db, &f.id, &TestMap, 10).await, 1);
    log.commit_deltas(
        db,
        &f.id,
        vec![vec![put_at("x", 1, "blind")], vec![put_at("z", 2, "z again")], vec![remove_at("y", 0)]],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert_eq!(out.keys().map(String::as_str).collect::<Vec<_>>(), ["x", "z"]);
    assert_eq!(
        (doc_of(&out, "x").as_deref(), doc_of(&out, "z").as_deref()),
        (Some("blind"), Some("z again")),
        "ready writes are in offset order, unversioned"
    );
}

pub async fn counts_vanish_at_zero_only_when_asked(db: &Sysdb) {
    let mut log = Log::new(db, 0).await;
    let f = attach(db, &log, "test_counter", &unique("out")).await;
    log.commit(db, &[marker(&f)], &[(&f.id, &TestCounter)]).await;
    let c = |id: &str, d: i64, rz: bool, tag: &str| {
        count(id, Metadata::from_iter([("tag".to_string(), MetaValue::String(tag.into()))]), d, rz)
    };

    log.commit_deltas(db, &f.id, vec![vec![c("p", 1, true, "a")], vec![c("q", 1, false, "a")]]).await;
    let out = output(db, &f.output_collection).await;
    assert_eq!((count_of(&out, "p"), count_of(&out, "q")), (Some(1), Some(1)));
    assert_eq!(out["p"].metadata.get("tag"), Some(&MetaValue::String("a".into())));
    log.commit_deltas(
        db,
        &f.id,
        vec![vec![c("p", -1, true, "a"), c("q", -1, false, "a")], vec![c("n", -1, true, "a")]],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert_eq!(
        (count_of(&out, "p"), count_of(&out, "q"), count_of(&out, "n")),
        (None, Some(0), Some(-1)),
        "remove_at_zero / keep at zero / negative"
    );
    // Through zero and back inside one batch; the last fields win.
    log.commit_deltas(
        db,
        &f.id,
        vec![
            vec![c("p", 1, true, "a")],
            vec![c("p", -1, true, "a")],
            vec![c("p", 2, true, "b")],
            vec![c("n", 1, true, "a")],
        ],
    )
    .await;
    let out = output(db, &f.output_collection).await;
    assert_eq!((count_of(&out, "p"), count_of(&out, "n")), (Some(2), None));
    assert_eq!(out["p"].metadata.get("tag"), Some(&MetaValue::String("b".into())));
    assert!(out.values().all(|o| o.embedding.is_none() && o.document.is_none()));
}

pub async fn detach_stops_everything_and_can_drop_the_output(db: &Sysdb) {
    let mut log = Log::new(db, 0).await;
    log.commit(db, &[put("a", "red"), put("b", "blue")], &[]).await;
    let f = attach(db, &log, "test_counter", &unique("out")).await;
    let g = attach(db, &log, "test_map", &unique("out")).await;
    let fns: &[(&str, &dyn Function)] = &[(&f.id, &TestCounter), (&g.id, &TestMap)];
    log.commit(db, &[marker(&f), marker(&g), put("a", "green"), put("c", "red")], fns).await;
    assert!(db.preimage_count(&f.id).await.expect("preimages") > 0);
    let live = output(db, &f.output_collection).await;

    let before = db.detach_function(&f.id, false).await.expect("detach").expect("known function");
    assert_eq!(before.status, FunctionStatus::Backfilling);
    assert_eq!(function(db, &f.id).await.status, FunctionStatus::Detached);
    assert_eq!(db.preimage_count(&f.id).await.expect("preimages"), 0, "detach kept the preimages");
    let report = log.commit(db, &[put("d", "red"), del("b"), marker(&f)], fns).await;
    assert_eq!((report.markers_accepted.len(), report.markers_ignored), (0, 1), "a marker of a detached function");
    assert_eq!(output(db, &f.output_collection).await, live, "a detached function's output changed");
    assert_eq!(db.backfill_step(&f.id, None, 10, &TestCounter).await.expect("step"), StepResult::NotBackfilling);

    // g keeps working; then dropped with its output.
    backfill_all(db, &g.id, &TestMap, 2).await;
    assert_output(db, &g, &log.expected(&TestMap), "the other function").await;
    db.detach_function(&g.id, true).await.expect("detach").expect("known function");
    assert_eq!(
        db.collection(&g.output_collection).await.expect("collection"),
        None,
        "drop_output kept the output collection"
    );
    assert!(output(db, &g.output_collection).await.is_empty(), "drop_output kept output records");
    assert!(
        db.collection(&f.output_collection).await.expect("collection").is_some(),
        "detach without drop_output dropped the output"
    );
    assert_eq!(db.detach_function("no-such-function", true).await.expect("detach"), None);
    // f's output still holds its records: attaching there again is refused, naming f.
    let c =
        refused(db, &new_function(&log.collection, 0, "test_counter", &f.output_collection), "output kept by a detach")
            .await;
    assert_eq!(c, AttachConflict::OutputLeftBy(function(db, &f.id).await));
    // An output left empty is written again by a new function: detaching the old one
    // once more with drop_output must not delete it.
    let e = attach(db, &log, "test_counter", &unique("out")).await;
    db.detach_function(&e.id, false).await.expect("detach").expect("known function");
    let e2 = attach(db, &log, "test_counter", &e.output_collection).await;
    db.detach_function(&e.id, true).await.expect("detach again").expect("known function");
    assert!(
        db.collection(&e2.output_collection).await.expect("collection").is_some(),
        "dropped the output of a live function"
    );
    db.detach_function(&e2.id, true).await.expect("detach").expect("known function");
    assert_eq!(db.collection(&e2.output_collection).await.expect("collection"), None);
    // A batch still naming the detached functions changes nothing.
    log.commit(db, &[put("e", "blue")], fns).await;
    assert!(output(db, &g.output_collection).await.is_empty());
}

/// Tiny deterministic PRNG (xorshift64*), so the suite needs no dev-dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

pub async fn outputs_match_the_reference_for_random_deltas(db: &Sysdb) {
    let mut log = Log::new(db, 0).await;
    let f = attach(db, &log, "test_map", &unique("out")).await;
    log.commit(db, &[marker(&f)], &[(&f.id, &TestMap)]).await;
    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let mut want = OutputStore::default();
    let mut versioned = true;
    for round in 0..40 {
        if round == 20 {
            backfill_all(db, &f.id, &TestMap, 5).await;
            want.finish_backfill();
            versioned = false;
        }
        let mut changes = Vec::new();
        for _ in 0..=rng.below(4) {
            let mut deltas = Vec::new();
            for _ in 0..rng.below(4) {
                let id = format!("m{}", rng.below(4));
                let v = rng.below(40) as i64;
                deltas.push(match rng.below(3) {
                    0 => {
                        let tag = MetaValue::Long(rng.below(3) as i64);
                        count(
                            &format!("c{}", rng.below(3)),
                            Metadata::from_iter([("tag".to_string(), tag)]),
                            rng.below(5) as i64 - 2,
                            rng.chance(50),
                        )
                    }
                    1 => OutputDelta::Put {
                        record: Record {
                            id,
                            embedding: None,
                            metadata: Metadata::new(),
                            document: Some(format!("v{v} r{round}")),
                            offset: v,
                        },
                    },
                    _ => OutputDelta::Remove { id, offset: v },
                });
            }
            apply_deltas(&mut want, &deltas, versioned);
            changes.push(deltas);
        }
        log.commit_deltas(db, &f.id, changes).await;
        assert_output(db, &f, &want.contents(), &format!("random deltas, round {round} (versioned: {versioned})"))
            .await;
    }
}

/// Random operations on a small id space.
fn random_ops(rng: &mut Rng, n: u64, ids: u64) -> Vec<Op> {
    const COLORS: [&str; 3] = ["red", "blue", "green"];
    (0..n)
        .map(|_| {
            let id = format!("k{:03}", rng.below(ids));
            if rng.chance(25) {
                del(&id)
            } else {
                put(&id, COLORS[rng.below(3) as usize])
            }
        })
        .collect()
}

/// Functions attached to a collection with history, markers in a batch with changes
/// around them, then live batches and backfill steps in a random order: every output
/// ends equal to the function over the whole history.
async fn random_interleaving(db: &Sysdb, functions: &[(&str, &dyn Function)], seed: u64) {
    let mut rng = Rng(seed);
    let mut log = Log::new(db, 0).await;
    for _ in 0..3 {
        let ops = {
            let n = 1 + rng.below(12);
            random_ops(&mut rng, n, 30)
        };
        log.commit(db, &ops, &[]).await;
    }
    let mut rows = Vec::new();
    for (name, _) in functions {
        rows.push(attach(db, &log, name, &unique("out")).await);
    }
    let fns: Vec<(&str, &dyn Function)> = rows.iter().zip(functions).map(|(r, (_, f))| (r.id.as_str(), *f)).collect();
    let mut ops = random_ops(&mut rng, 4, 30);
    for r in &rows {
        ops.insert(rng.below(ops.len() as u64 + 1) as usize, marker(r));
    }
    ops.extend(random_ops(&mut rng, 4, 30));
    log.commit(db, &ops, &fns).await;
    let mut cursors: Vec<Option<Option<String>>> = rows.iter().map(|_| Some(None)).collect();
    let mut batches = 0;
    while batches < 12 || cursors.iter().any(Option::is_some) {
        let i = rng.below(rows.len() as u64) as usize;
        if batches < 12 && (rng.chance(50) || cursors[i].is_none()) {
            let ops = {
                let n = 1 + rng.below(6);
                random_ops(&mut rng, n, 30)
            };
            log.commit(db, &ops, &fns).await;
            batches += 1;
        } else if let Some(cursor) = cursors[i].clone() {
            // Chunks bounded by a count, and half of them by a few bytes as well: a chunk
            // cut by its bytes is never the last one, whatever its length.
            let chunk = crate::sysdb::ChunkLimit {
                records: 1 + rng.below(6) as usize,
                bytes: if rng.chance(50) { 1 + rng.below(120) as usize } else { usize::MAX },
                changelog: false,
            };
            match db.backfill_step(&rows[i].id, cursor.as_deref(), chunk, functions[i].1).await.expect("backfill_step")
            {
                StepResult::Applied { cursor, finished, processed, .. } => {
                    assert!(processed <= chunk.records, "a chunk of {processed} records, over {chunk:?}");
                    cursors[i] = if finished { None } else { Some(cursor) }
                }
                other => panic!("{other:?}"),
            }
        }
    }
    for (row, (_, f)) in rows.iter().zip(functions) {
        let now = function(db, &row.id).await;
        assert_eq!(now.status, FunctionStatus::Ready);
        assert_eq!(Some(now.backfill_done), now.backfill_total, "backfill_done ends at the as-of-marker size");
        assert_output(db, row, &log.expected(*f), &format!("seed {seed:#x}")).await;
    }
}

pub async fn random_interleavings_end_at_the_whole_history(db: &Sysdb) {
    for seed in 1..=4u64 {
        random_interleaving(
            db,
            &[("test_counter", &TestCounter), ("test_map", &TestMap)],
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15),
        )
        .await;
    }
}

/// The registry's functions (`record_counter`, `statistics`, `normalize`) through the
/// same random interleavings.
pub async fn registry_functions_end_at_the_whole_history(db: &Sysdb) {
    let built: Vec<(&str, Box<dyn Function>)> = ["record_counter", "statistics", "normalize"]
        .into_iter()
        .map(|name| (name, crate::functions::build(name, &BTreeMap::new()).expect("registry function")))
        .collect();
    let fns: Vec<(&str, &dyn Function)> = built.iter().map(|(n, f)| (*n, f.as_ref())).collect();
    for seed in 1..=2u64 {
        random_interleaving(db, &fns, seed.wrapping_mul(0x2545_f491_4f6c_dd1d)).await;
    }
}

/// A backfill and live batches of the same collection **at the same time** (two
/// connections on PostgreSQL; the writer lock on SQLite): both make progress without
/// errors, and the outputs are exact.
pub async fn backfill_races_live_commits(db: &Sysdb) {
    let mut rng = Rng(0xface_b00c);
    let mut log = Log::new(db, 0).await;
    let initial: Vec<Op> = (0..300).map(|i| put(&format!("k{i:03}"), ["red", "blue"][i % 2])).collect();
    log.commit(db, &initial, &[]).await;
    let fc = attach(db, &log, "test_counter", &unique("out")).await;
    let fm = attach(db, &log, "test_map", &unique("out")).await;
    let fns: Vec<(&str, &dyn Function)> = vec![(&fc.id, &TestCounter), (&fm.id, &TestMap)];
    log.commit(db, &[marker(&fc), marker(&fm)], &fns).await;

    // Live commits done so far, as each backfill step sees it: proof that they interleave.
    let commits = std::cell::Cell::new(0u32);
    let seen = std::cell::RefCell::new(BTreeSet::new());
    let (seen_ref, commits_ref) = (&seen, &commits);
    let backfills = async {
        let run = |id: String, f: &'static dyn Function| async move {
            let (seen, commits) = (seen_ref, commits_ref);
            let mut cursor: Option<String> = None;
            let mut steps = 0;
            loop {
                steps += 1;
                seen.borrow_mut().insert(commits.get());
                match db.backfill_step(&id, cursor.as_deref(), 7, f).await.expect("backfill_step racing live commits") {
                    StepResult::Applied { cursor: c, finished, .. } => {
                        cursor = c;
                        if finished {
                            return steps;
                        }
                    }
                    other => panic!("{other:?}"),
                }
                tokio::task::yield_now().await;
            }
        };
        tokio::join!(run(fc.id.clone(), &TestCounter), run(fm.id.clone(), &TestMap))
    };
    let live = async {
        for _ in 0..40 {
            let ops = {
                let n = 1 + rng.below(10);
                random_ops(&mut rng, n, 330)
            };
            log.commit(db, &ops, &fns).await;
            commits.set(commits.get() + 1);
            tokio::task::yield_now().await;
        }
    };
    let ((steps_c, steps_m), ()) = tokio::join!(backfills, live);
    assert!(steps_c > 1 && steps_m > 1);
    assert!(seen.borrow().len() > 2, "the backfill steps and the live commits did not interleave: {:?}", seen.borrow());
    for (row, f) in [(&fc, &TestCounter as &dyn Function), (&fm, &TestMap)] {
        let now = function(db, &row.id).await;
        assert_eq!((now.status, now.backfill_done, now.backfill_total), (FunctionStatus::Ready, 300, Some(300)));
        assert_output(db, row, &log.expected(f), "backfill racing live commits").await;
    }
    assert_eq!(db.preimage_count(&fm.id).await.expect("preimages"), 0);
}

/// Two replicas attaching the same (collection, output) at the same time: one function,
/// one marker; the loser gets the winner's row.
pub async fn concurrent_attaches_create_one_function(a: &Sysdb, b: &Sysdb) {
    for _ in 0..10 {
        let collection = unique("fn-coll");
        let output = unique("out");
        let new = || NewFunction {
            id: unique("fn"),
            collection_id: collection.clone(),
            partition: 0,
            function: "test_counter".into(),
            output_collection: output.clone(),
            params: BTreeMap::new(),
            request_id: unique("req"),
        };
        let (na, nb) = (new(), new());
        let (ra, rb) = tokio::join!(a.attach_function(&na), b.attach_function(&nb));
        let (created, existing) = match (ra.expect("attach a"), rb.expect("attach b")) {
            (AttachOutcome::Created(row, outbox), AttachOutcome::Existing(e))
            | (AttachOutcome::Existing(e), AttachOutcome::Created(row, outbox)) => ((row, outbox), e),
            other => panic!("racing attaches: {other:?}"),
        };
        assert_eq!(existing, created.0, "the loser must see the winner's function");
        let pending: Vec<_> = a
            .outbox_pending(usize::MAX)
            .await
            .expect("outbox")
            .into_iter()
            .filter(|o| o.collection_id == collection)
            .collect();
        assert_eq!(pending, std::slice::from_ref(&created.1), "one marker per attached function");
        a.mark_outbox_sent(created.1.id, None).await.expect("mark sent");
        assert_eq!(a.functions(Some(&collection)).await.expect("functions").len(), 1);
    }
}

/// An applied step as `(processed, cursor, finished)`, without its timing.
fn applied(step: StepResult) -> Option<(usize, Option<String>, bool)> {
    match step {
        StepResult::Applied { processed, cursor, finished, .. } => Some((processed, cursor, finished)),
        _ => None,
    }
}
