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
            assert!(offset > last, "model log of collection {:?}: offset {offset} after {last}", record.collection_id);
        }
        let collection = state.collections.entry(record.collection_id.clone()).or_default();
        apply(collection, offset, record);
    }

    // Function outputs are computed from the final records by `reference_outputs`.

    state
}

/// One log record applied to its collection, exactly as the table in docs/design.md
/// section 5 reads.
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
        let expected: BTreeMap<&str, u64> = [("add_existing", 1), ("update_missing", 1), ("delete_missing", 1)].into();
        assert_eq!(c.ignored, expected);
        assert_eq!(c.controls, vec![8]);
        assert!(c.rejected.is_empty());
    }

    #[test]
    fn model_keeps_collections_apart() {
        let mut with_embedding = log_record("x", "a", Operation::Add);
        with_embedding.embedding = Some(vec![1.0, 2.0].into());
        let mut other_dimension = log_record("y", "a", Operation::Add);
        other_dimension.embedding = Some(vec![1.0, 2.0, 3.0].into());
        let state = reference(&[(0, with_embedding), (1, other_dimension)]);
        assert_eq!(state.collections["x"].dimension, Some(2));
        assert_eq!(state.collections["y"].dimension, Some(3));
        assert!(state.collections["y"].rejected.is_empty());
    }

    #[test]
    fn model_rejects_mismatched_dimension_even_when_it_would_ignore() {
        let mut first = log_record("c", "a", Operation::Add);
        first.embedding = Some(vec![1.0, 2.0].into());
        let mut wrong = log_record("c", "a", Operation::Add);
        wrong.embedding = Some(vec![1.0].into());
        let state = reference(&[(0, first), (1, wrong)]);
        let c = &state.collections["c"];
        assert_eq!(c.rejected, vec![1]);
        assert!(c.ignored.is_empty());
    }

    #[test]
    #[should_panic(expected = "offset 3 after 5")]
    fn model_refuses_a_log_out_of_offset_order() {
        reference(&[(5, log_record("c", "a", Operation::Add)), (3, log_record("c", "b", Operation::Add))]);
    }
}
