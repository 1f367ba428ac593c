//! The reference model: a plain function from a whole log to what Sluice must end
//! up with (docs/design.md section 5).
//!
//! It is the oracle for the materializer's property tests and for every end-to-end
//! test, so it is written to be obviously correct rather than fast: one loop over
//! the log, one `BTreeMap` of records per collection, the table of section 4 spelled
//! out case by case. It shares no code with the materializer (`super`), only the
//! record types, so a mistake in one is not silently repeated in the other.

use std::collections::BTreeMap;

use crate::record::{LogRecord, MetaValue, Metadata, Operation, Record};

/// Expected end state of every collection that appears in the log.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelState {
    /// Per collection id.
    pub collections: BTreeMap<String, CollectionModel>,
}

/// Expected end state of one collection.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CollectionModel {
    /// Live records by id, each with the offset of the log record that last changed it.
    pub records: BTreeMap<String, Record>,
    /// Embedding dimension, fixed by the first applied insert or merge carrying one.
    pub dimension: Option<usize>,
    /// Ignored data records counted by reason, keyed by the metric label value
    /// (`add_existing`, `update_missing`, `delete_missing`); absent key = zero.
    pub ignored: BTreeMap<&'static str, u64>,
    /// Offsets of the records rejected for a dimension mismatch (DLQ `dimension_mismatch`).
    pub rejected: Vec<i64>,
    /// Offsets of the BACKFILL_FN control records.
    pub controls: Vec<i64>,
    // Function outputs: see [`reference_outputs`].
}

/// The expected end state after the whole `log`.
///
/// `log` holds `(offset, record)` pairs of any collections; within each collection
/// the offsets must be strictly increasing (the order records are folded in).
///
/// # Panics
///
/// If a collection's offsets are not strictly increasing: the test feeding the
/// model is wrong.
pub fn reference(log: &[(i64, LogRecord)]) -> ModelState {
    let mut state = ModelState::default();
    let mut last_offsets: BTreeMap<&str, i64> = BTreeMap::new();

    for (offset, record) in log {
        let offset = *offset;
        if let Some(last) = last_offsets.insert(&record.collection_id, offset) {
            assert!(
                offset > last,
                "model log of collection {:?}: offset {offset} after {last}",
                record.collection_id
            );
        }
        let collection = state
            .collections
            .entry(record.collection_id.clone())
            .or_default();
        apply(collection, offset, record);
    }

    // Function outputs are computed from the final records by `reference_outputs`.

    state
}

/// One output record of an attached function as the model expects it: the record
/// without its version (output versions are source offsets, an implementation detail of
/// how live writes and the backfill are ordered, not part of the function's value).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelOutput {
    pub embedding: Option<Vec<f32>>,
    pub metadata: Metadata,
    pub document: Option<String>,
}

/// The expected output collection of `function` (a registry name) attached to
/// `collection`, after the whole `log`: the function applied to the collection's final
/// records, computed directly from them (docs/design.md invariant 8: a function's output is
/// the function over the whole history, whatever the interleaving of live processing
/// and backfill). It shares no code with the delta functions in `crate::functions`
/// beyond the statistics id encoding and the normalization arithmetic, which are
/// naming and numerics, not incremental logic.
///
/// - `record_counter`: one record `function_output` with `total_count` = the number of
///   final records. It is present even at 0; a store in which the counter was never
///   written (no delta ever reached it) reads as `total_count = 0`.
/// - `statistics`: per distinct metadata `(key, value)` pair of the final records (doubles
///   distinguished bitwise), one record with `key`, `value` and `count` = the number of
///   final records holding it. Pairs held by no record are absent.
/// - `normalize`: per final record, the same id, metadata and document, the embedding
///   L2-normalized.
///
/// # Panics
///
/// On an unknown function name, or a log out of offset order (see [`reference`]).
pub fn reference_outputs(log: &[(i64, LogRecord)], collection: &str, function: &str) -> BTreeMap<String, ModelOutput> {
    use crate::functions::{normalize, statistics};

    let state = reference(log);
    let no_records = BTreeMap::new();
    let records = state
        .collections
        .get(collection)
        .map_or(&no_records, |c| &c.records);
    let mut outputs = BTreeMap::new();
    match function {
        "record_counter" => {
            let total = i64::try_from(records.len()).expect("fits");
            let counter = ModelOutput {
                metadata: Metadata::from([("total_count".to_string(), MetaValue::Long(total))]),
                ..ModelOutput::default()
            };
            outputs.insert("function_output".to_string(), counter);
        }
        "statistics" => {
            for record in records.values() {
                for (key, value) in &record.metadata {
                    let output = outputs
                        .entry(statistics::output_id(key, value))
                        .or_insert_with(|| ModelOutput {
                            metadata: Metadata::from([
                                ("key".to_string(), MetaValue::String(key.clone())),
                                ("value".to_string(), value.clone()),
                                ("count".to_string(), MetaValue::Long(0)),
                            ]),
                            ..ModelOutput::default()
                        });
                    if let Some(MetaValue::Long(count)) = output.metadata.get_mut("count") {
                        *count += 1;
                    }
                }
            }
        }
        "normalize" => {
            for (id, record) in records {
                let output = ModelOutput {
                    embedding: record.embedding.as_deref().map(normalize::l2_normalize),
                    metadata: record.metadata.clone(),
                    document: record.document.clone(),
                };
                outputs.insert(id.clone(), output);
            }
        }
        other => panic!("reference_outputs: unknown function {other:?}"),
    }
    outputs
}

/// One log record applied to its collection, exactly as the table in section 4 reads.
fn apply(collection: &mut CollectionModel, offset: i64, record: &LogRecord) {
    // Control records are never materialized.
    if record.operation == Operation::BackfillFn {
        collection.controls.push(offset);
        return;
    }

    // Once the dimension is fixed, any data record with another one is rejected,
    // whatever its operation.
    if let (Some(dimension), Some(embedding)) = (collection.dimension, &record.embedding) {
        if embedding.len() != dimension {
            collection.rejected.push(offset);
            return;
        }
    }

    let is_live = collection.records.contains_key(&record.id);
    match (record.operation, is_live) {
        (Operation::Add, true) => count(collection, "add_existing"),
        (Operation::Add, false) => insert_new(collection, offset, record),
        (Operation::Update, true) => merge_into(collection, offset, record),
        (Operation::Update, false) => count(collection, "update_missing"),
        (Operation::Upsert, true) => merge_into(collection, offset, record),
        (Operation::Upsert, false) => insert_new(collection, offset, record),
        (Operation::Delete, true) => {
            collection.records.remove(&record.id);
        }
        (Operation::Delete, false) => count(collection, "delete_missing"),
        (Operation::BackfillFn, _) => unreachable!("control records returned above"),
    }
}

fn count(collection: &mut CollectionModel, reason: &'static str) {
    *collection.ignored.entry(reason).or_insert(0) += 1;
}

/// The first stored embedding fixes the collection's dimension.
fn note_dimension(collection: &mut CollectionModel, record: &LogRecord) {
    if collection.dimension.is_none() {
        if let Some(embedding) = &record.embedding {
            collection.dimension = Some(embedding.len());
        }
    }
}

/// A brand-new record from the log record alone, without its null metadata values.
fn insert_new(collection: &mut CollectionModel, offset: i64, record: &LogRecord) {
    let mut metadata = Metadata::new();
    if let Some(new_metadata) = &record.metadata {
        for (key, value) in new_metadata {
            if *value != MetaValue::Null {
                metadata.insert(key.clone(), value.clone());
            }
        }
    }
    let new_record = Record {
        id: record.id.clone(),
        embedding: record.embedding.clone(),
        metadata,
        document: record.document.clone(),
        offset,
    };
    collection.records.insert(record.id.clone(), new_record);
    note_dimension(collection, record);
}

/// Merge into the live record: metadata key by key (null removes the key), document
/// and embedding replaced only when the log record has them.
fn merge_into(collection: &mut CollectionModel, offset: i64, record: &LogRecord) {
    let Some(existing) = collection.records.get_mut(&record.id) else {
        unreachable!("merge_into is only called for a live id");
    };
    if let Some(new_metadata) = &record.metadata {
        for (key, value) in new_metadata {
            if *value == MetaValue::Null {
                existing.metadata.remove(key);
            } else {
                existing.metadata.insert(key.clone(), value.clone());
            }
        }
    }
    if let Some(document) = &record.document {
        existing.document = Some(document.clone());
    }
    if let Some(embedding) = &record.embedding {
        existing.embedding = Some(embedding.clone());
    }
    existing.offset = offset;
    note_dimension(collection, record);
}

#[cfg(test)]
mod tests {
    //! The model's own spot checks; the materializer's unit tests pin the same
    //! semantics on the fold, and the property tests pin the two to each other.

    use super::*;

    fn log_record(collection: &str, id: &str, operation: Operation) -> LogRecord {
        LogRecord::data(collection, id, operation)
    }

    #[test]
    fn model_applies_each_cell_of_the_table() {
        let log = vec![
            (0, log_record("c", "a", Operation::Update)), // update_missing
            (1, log_record("c", "a", Operation::Delete)), // delete_missing
            (2, log_record("c", "a", Operation::Add)),    // insert
            (3, log_record("c", "a", Operation::Add)),    // add_existing
            (4, log_record("c", "a", Operation::Update)), // merge
            (5, log_record("c", "b", Operation::Upsert)), // insert
            (6, log_record("c", "b", Operation::Upsert)), // merge
            (7, log_record("c", "b", Operation::Delete)), // remove
            (8, log_record("c", "b", Operation::BackfillFn)),
        ];
        let state = reference(&log);
        let c = &state.collections["c"];
        assert_eq!(c.records.keys().collect::<Vec<_>>(), vec!["a"]);
        assert_eq!(c.records["a"].offset, 4);
        let expected: BTreeMap<&str, u64> = [
            ("add_existing", 1),
            ("update_missing", 1),
            ("delete_missing", 1),
        ]
        .into();
        assert_eq!(c.ignored, expected);
        assert_eq!(c.controls, vec![8]);
        assert!(c.rejected.is_empty());
    }

    #[test]
    fn model_keeps_collections_apart() {
        let mut with_embedding = log_record("x", "a", Operation::Add);
        with_embedding.embedding = Some(vec![1.0, 2.0]);
        let mut other_dimension = log_record("y", "a", Operation::Add);
        other_dimension.embedding = Some(vec![1.0, 2.0, 3.0]);
        let state = reference(&[(0, with_embedding), (1, other_dimension)]);
        assert_eq!(state.collections["x"].dimension, Some(2));
        assert_eq!(state.collections["y"].dimension, Some(3));
        assert!(state.collections["y"].rejected.is_empty());
    }

    #[test]
    fn model_rejects_mismatched_dimension_even_when_it_would_ignore() {
        let mut first = log_record("c", "a", Operation::Add);
        first.embedding = Some(vec![1.0, 2.0]);
        let mut wrong = log_record("c", "a", Operation::Add);
        wrong.embedding = Some(vec![1.0]);
        let state = reference(&[(0, first), (1, wrong)]);
        let c = &state.collections["c"];
        assert_eq!(c.rejected, vec![1]);
        assert!(c.ignored.is_empty());
    }

    fn with_metadata(mut record: LogRecord, pairs: &[(&str, MetaValue)]) -> LogRecord {
        record.metadata = Some(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
        record
    }

    #[test]
    fn reference_outputs_are_the_functions_of_the_final_records() {
        let mut a = with_metadata(log_record("c", "a", Operation::Add), &[("k", MetaValue::Long(1))]);
        a.embedding = Some(vec![3.0, 4.0]);
        let b = with_metadata(log_record("c", "b", Operation::Add), &[("k", MetaValue::Long(1))]);
        let gone = with_metadata(log_record("c", "g", Operation::Add), &[("k", MetaValue::Long(9))]);
        let b_changed = with_metadata(log_record("c", "b", Operation::Update), &[("k", MetaValue::Double(-0.0))]);
        let log = vec![
            (0, a),
            (1, b),
            (2, gone),
            (3, log_record("c", "g", Operation::Delete)),
            (4, b_changed),
            (5, log_record("other", "x", Operation::Add)),
        ];

        let counter = reference_outputs(&log, "c", "record_counter");
        assert_eq!(counter.len(), 1);
        assert_eq!(counter["function_output"].metadata["total_count"], MetaValue::Long(2));
        let empty = reference_outputs(&log, "nothing", "record_counter");
        assert_eq!(empty["function_output"].metadata["total_count"], MetaValue::Long(0));

        let stats = reference_outputs(&log, "c", "statistics");
        assert_eq!(stats.keys().collect::<Vec<_>>(), vec!["k=d:-0.0", "k=l:1"]);
        assert_eq!(stats["k=l:1"].metadata["count"], MetaValue::Long(1));
        assert_eq!(stats["k=l:1"].metadata["key"], MetaValue::String("k".into()));
        assert_eq!(stats["k=d:-0.0"].metadata["value"], MetaValue::Double(-0.0));

        let normalized = reference_outputs(&log, "c", "normalize");
        assert_eq!(normalized.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(normalized["a"].embedding, Some(vec![0.6, 0.8]));
        assert_eq!(normalized["b"].embedding, None);
        assert_eq!(normalized["b"].metadata["k"], MetaValue::Double(-0.0));
    }

    #[test]
    #[should_panic(expected = "offset 3 after 5")]
    fn model_refuses_a_log_out_of_offset_order() {
        reference(&[
            (5, log_record("c", "a", Operation::Add)),
            (3, log_record("c", "b", Operation::Add)),
        ]);
    }
}
