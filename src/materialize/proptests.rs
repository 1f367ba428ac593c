//! Property tests: the fold, run batch by batch over arbitrary batch boundaries,
//! ends where the reference model says, and its changes replay consistently.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::option;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::TestRunner;

use super::model::{reference, CollectionModel};
use super::*;
use crate::record::{Embedding, LogRecord, MetaValue, Metadata, Operation, Record};

/// One generated log entry: the record, the offset gap before it (other partitions'
/// collections are interleaved, so offsets of one collection have gaps), and whether
/// its collection's current batch ends after it.
#[derive(Debug, Clone)]
struct Entry {
    record: LogRecord,
    gap: i64,
    cut: bool,
}

// Generation dominates the run time in debug builds, so each field comes from one
// small integer strategy, decoded by hand (still shrinks towards simpler values).

fn arb_operation() -> impl Strategy<Value = Operation> {
    // Weights: ADD 3, UPDATE 2, UPSERT 2, DELETE 3, BACKFILL_FN 1.
    (0..11u8).prop_map(|n| match n {
        0..=2 => Operation::Add,
        3..=4 => Operation::Update,
        5..=6 => Operation::Upsert,
        7..=9 => Operation::Delete,
        _ => Operation::BackfillFn,
    })
}

/// Values compare with `==` in the assertions, so doubles stay finite.
fn meta_value(n: u8) -> MetaValue {
    match n {
        0..=2 => MetaValue::Null,
        3..=5 => MetaValue::Long(i64::from(n) - 3),
        6 => MetaValue::String("a".into()),
        7 => MetaValue::String("b".into()),
        8 => MetaValue::Bool(true),
        9 => MetaValue::Bool(false),
        _ => MetaValue::Double(f64::from(n) + 0.5),
    }
}

/// `None` 40% of the time, else up to 3 entries over keys `k0`..`k3`, Nulls frequent.
fn arb_metadata() -> impl Strategy<Value = Option<Metadata>> {
    option::weighted(0.6, vec((0..4u8, 0..12u8), 0..4))
        .prop_map(|pairs| pairs.map(|pairs| pairs.into_iter().map(|(k, v)| (format!("k{k}"), meta_value(v))).collect()))
}

/// Mostly dimension 3, occasionally 2 or 4, often none.
fn arb_embedding() -> impl Strategy<Value = Option<Vec<f32>>> {
    (0..12u8, -2i8..3).prop_map(|(kind, v)| {
        let len = match kind {
            0..=3 => return None,
            4..=9 => 3,
            10 => 2,
            _ => 4,
        };
        Some((0..len).map(|i| f32::from(v) + i as f32).collect())
    })
}

fn arb_document() -> impl Strategy<Value = Option<String>> {
    (0..8u8).prop_map(|n| match n {
        0..=4 => None,
        5 => Some(String::new()),
        6 => Some("x".into()),
        _ => Some("y".into()),
    })
}

fn arb_entry() -> impl Strategy<Value = Entry> {
    (0..3u8, 0..8u8, arb_operation(), arb_embedding(), arb_metadata(), arb_document(), 1..3i64, 0..10u8).prop_map(
        |(collection, id, operation, embedding, metadata, document, gap, cut)| {
            let mut record = LogRecord::data(format!("c{collection}"), format!("id{id}"), operation);
            record.embedding = embedding.map(Embedding::from);
            record.metadata = metadata;
            record.document = document;
            Entry { record, gap, cut: cut < 3 }
        },
    )
}

fn arb_log() -> impl Strategy<Value = Vec<Entry>> {
    vec(arb_entry(), 0..80)
}

/// Offsets from the gaps, starting at 0.
fn with_offsets(entries: &[Entry]) -> Vec<(i64, LogRecord)> {
    let mut offset = -1;
    entries
        .iter()
        .map(|e| {
            offset += e.gap;
            (offset, e.record.clone())
        })
        .collect()
}

/// What folding one collection's batches produced, accumulated over the batches.
#[derive(Default)]
struct Folded {
    store: BTreeMap<String, Record>,
    dimension: Option<usize>,
    ignored: BTreeMap<&'static str, u64>,
    rejected: Vec<i64>,
    controls: Vec<i64>,
}

/// Splits each collection's records at the entries marked `cut`, folds the batches
/// through `fold_batch` carrying the store and dimension between them, and checks
/// each batch's changes replay from the store it started from.
fn fold_in_batches(entries: &[Entry]) -> Result<BTreeMap<String, Folded>, TestCaseError> {
    let log = with_offsets(entries);
    let mut batches: BTreeMap<&str, Vec<Vec<(i64, &LogRecord)>>> = BTreeMap::new();
    let mut open: BTreeMap<&str, bool> = BTreeMap::new();
    for ((offset, record), entry) in log.iter().zip(entries) {
        let collection = record.collection_id.as_str();
        let per = batches.entry(collection).or_default();
        if !open.get(collection).copied().unwrap_or(false) {
            per.push(Vec::new());
        }
        per.last_mut().expect("pushed above").push((*offset, record));
        open.insert(collection, !entry.cut);
    }

    let mut folded: BTreeMap<String, Folded> = BTreeMap::new();
    for (collection, batches) in batches {
        let state = folded.entry(collection.to_string()).or_default();
        for batch in batches {
            let out = fold_batch(&state.store, state.dimension, batch.iter().copied())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
            check_batch_outcome(&state.store, &batch, &out)?;
            check_fold_final(&state.store, state.dimension, &batch, &out)?;

            for (id, after) in out.final_states() {
                match after {
                    Some(record) => state.store.insert(id.to_string(), record.clone()),
                    None => state.store.remove(id),
                };
            }
            state.dimension = out.dimension;
            for (_, reason) in &out.ignored {
                *state.ignored.entry(reason.label()).or_insert(0) += 1;
            }
            for rejected in &out.rejected {
                prop_assert_eq!(Some(rejected.expected), out.dimension);
                prop_assert_ne!(rejected.expected, rejected.actual);
            }
            state.rejected.extend(out.rejected.iter().map(|r| r.offset));
            state.controls.extend(&out.controls);
        }
    }
    Ok(folded)
}

/// Every record lands in exactly one list; replaying the changes from the store the
/// batch started from sees each change's `before` and ends at `final_states`.
fn check_batch_outcome(
    start: &BTreeMap<String, Record>,
    batch: &[(i64, &LogRecord)],
    out: &BatchOutcome,
) -> Result<(), TestCaseError> {
    let mut accounted: Vec<i64> = out.changes.iter().map(|c| c.offset).collect();
    accounted.extend(out.ignored.iter().map(|(o, _)| *o));
    accounted.extend(out.rejected.iter().map(|r| r.offset));
    accounted.extend(&out.controls);
    accounted.sort_unstable();
    let offsets: Vec<i64> = batch.iter().map(|(o, _)| *o).collect();
    prop_assert_eq!(accounted, offsets);

    let mut replay = start.clone();
    let mut previous = i64::MIN;
    for change in &out.changes {
        prop_assert!(change.offset > previous, "changes out of offset order");
        previous = change.offset;
        prop_assert_eq!(replay.get(&change.id), change.before.as_ref(), "before of change at {}", change.offset);
        match &change.after {
            Some(after) => {
                prop_assert_eq!(after.offset, change.offset);
                prop_assert_eq!(&after.id, &change.id);
                prop_assert!(after.metadata.values().all(|v| *v != MetaValue::Null));
                replay.insert(change.id.clone(), after.clone());
            }
            None => {
                replay.remove(&change.id);
            }
        }
    }
    let mut applied = start.clone();
    for (id, after) in out.final_states() {
        match after {
            Some(record) => applied.insert(id.to_string(), record.clone()),
            None => applied.remove(id),
        };
    }
    prop_assert_eq!(replay, applied);
    Ok(())
}

/// `fold_final` over the same batch, from the same store, ends where `fold_batch` does
/// (state, and whether each id was live before), with the same accounting, and takes
/// each id from the store at most once.
fn check_fold_final(
    start: &BTreeMap<String, Record>,
    dimension: Option<usize>,
    batch: &[(i64, &LogRecord)],
    out: &BatchOutcome,
) -> Result<(), TestCaseError> {
    let mut store = start.clone();
    let mut asked: Vec<String> = Vec::new();
    let fin = fold_final(
        |id| {
            asked.push(id.to_string());
            store.remove(id)
        },
        dimension,
        batch.iter().map(|(o, r)| (*o, (*r).clone())),
    )
    .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let distinct: std::collections::BTreeSet<&String> = asked.iter().collect();
    prop_assert_eq!(distinct.len(), asked.len(), "an id was taken twice: {:?}", asked);
    let expected: Vec<(String, bool, Option<Record>)> = out
        .final_states()
        .into_iter()
        .map(|(id, after)| (id.to_string(), start.contains_key(id), after.cloned()))
        .collect();
    let got: Vec<(String, bool, Option<Record>)> =
        fin.states.into_iter().map(|s| (s.id, s.was_live, s.after)).collect();
    prop_assert_eq!(got, expected);
    prop_assert_eq!(&fin.ignored, &out.ignored);
    prop_assert_eq!(&fin.rejected, &out.rejected);
    prop_assert_eq!(&fin.controls, &out.controls);
    prop_assert_eq!(fin.dimension, out.dimension);
    Ok(())
}

fn assert_matches_model(folded: &Folded, model: &CollectionModel) -> Result<(), TestCaseError> {
    prop_assert_eq!(&folded.store, &model.records);
    prop_assert_eq!(folded.dimension, model.dimension);
    prop_assert_eq!(&folded.ignored, &model.ignored);
    prop_assert_eq!(&folded.rejected, &model.rejected);
    prop_assert_eq!(&folded.controls, &model.controls);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn batched_fold_matches_reference_model(entries in arb_log()) {
        let model = reference(&with_offsets(&entries));
        let folded = fold_in_batches(&entries)?;
        prop_assert_eq!(
            folded.keys().collect::<Vec<_>>(),
            model.collections.keys().collect::<Vec<_>>()
        );
        for (collection, state) in &folded {
            assert_matches_model(state, &model.collections[collection])?;
        }
    }
}

/// Guards the generator: over a fixed sample of logs, every case the property is
/// meant to cover actually occurs, so the property does not pass vacuously.
#[test]
fn generated_logs_exercise_every_case() {
    let mut runner = TestRunner::deterministic();
    let strategy = arb_log();
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for _ in 0..300 {
        let entries = strategy.new_tree(&mut runner).expect("generate").current();
        let log = with_offsets(&entries);
        let mut by_collection: BTreeMap<&str, Vec<(i64, &LogRecord)>> = BTreeMap::new();
        for (offset, record) in &log {
            by_collection.entry(&record.collection_id).or_default().push((*offset, record));
        }
        if entries.iter().filter(|e| e.cut).count() >= 2 {
            *seen.entry("several batches").or_default() += 1;
        }
        for records in by_collection.values() {
            let out = fold_batch(&BTreeMap::new(), None, records.iter().copied()).expect("ordered");
            for reason in IgnoreReason::ALL {
                if out.ignored.iter().any(|(_, r)| *r == reason) {
                    *seen.entry(reason.label()).or_default() += 1;
                }
            }
            let fresh_after_delete =
                out.changes.windows(2).any(|w| w[0].id == w[1].id && w[0].after.is_none() && w[1].before.is_none());
            let null_removed = out.changes.iter().any(|c| match (&c.before, &c.after) {
                (Some(b), Some(a)) => b.metadata.keys().any(|k| !a.metadata.contains_key(k)),
                _ => false,
            });
            let kept_embedding = out.changes.iter().any(|c| match (&c.before, &c.after) {
                (Some(b), Some(_)) => b.embedding.is_some(),
                _ => false,
            });
            for (case, hit) in [
                ("dimension_mismatch", !out.rejected.is_empty()),
                ("control", !out.controls.is_empty()),
                ("delete then insert", fresh_after_delete),
                ("null removes key", null_removed),
                ("merge over embedding", kept_embedding),
                ("merge", out.changes.iter().any(|c| c.before.is_some() && c.after.is_some())),
                ("remove", out.changes.iter().any(|c| c.after.is_none())),
            ] {
                if hit {
                    *seen.entry(case).or_default() += 1;
                }
            }
        }
    }
    for case in [
        "several batches",
        "add_existing",
        "update_missing",
        "delete_missing",
        "dimension_mismatch",
        "control",
        "delete then insert",
        "null removes key",
        "merge over embedding",
        "merge",
        "remove",
    ] {
        assert!(seen.get(case).copied().unwrap_or(0) >= 20, "case {case:?} too rare: {seen:?}");
    }
}
