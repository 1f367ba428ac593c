//! The reference model of attached functions: what each function's output collection
//! must hold after a whole log, computed from the final records of the record model
//! ([`crate::materialize::model::reference`]) rather than from changes. The oracle of the
//! function property tests, the backfill simulation and every end-to-end test.

use std::collections::BTreeMap;

use crate::materialize::model::reference;
use crate::record::{Embedding, LogRecord, MetaValue, Metadata};

/// One output record of an attached function as the model expects it: the record
/// without its version (output versions are source offsets, an implementation detail of
/// how live writes and the backfill are ordered, not part of the function's value).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ModelOutput {
    pub embedding: Option<Embedding>,
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
    use super::{normalize, statistics};

    let state = reference(log);
    let no_records = BTreeMap::new();
    let records = state.collections.get(collection).map_or(&no_records, |c| &c.records);
    let mut outputs = BTreeMap::new();
    match function {
        "record_counter" => {
            let total = i64::try_from(records.len()).expect("fits");
            let counter = ModelOutput {
                metadata: Metadata::from_iter([("total_count".to_string(), MetaValue::Long(total))]),
                ..ModelOutput::default()
            };
            outputs.insert("function_output".to_string(), counter);
        }
        "statistics" => {
            for record in records.values() {
                for (key, value) in &record.metadata {
                    let output = outputs.entry(statistics::output_id(key, value)).or_insert_with(|| ModelOutput {
                        metadata: Metadata::from_iter([
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
                    embedding: record.embedding.as_ref().map(normalize::l2_normalize),
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

/// The expected output of the WebAssembly test fixture (`testdata/wasm/fixture.py`) in
/// mode `count_by` with `key`, computed from the final records: per string value `v` of
/// metadata `key`, one record `key=v` with `key` = `v` and `count` = the number of final
/// records holding it. Other values, and values held by no record, have no output.
pub fn reference_count_by(log: &[(i64, LogRecord)], collection: &str, key: &str) -> BTreeMap<String, ModelOutput> {
    let state = reference(log);
    let mut outputs = BTreeMap::new();
    let Some(c) = state.collections.get(collection) else { return outputs };
    for record in c.records.values() {
        if let Some(MetaValue::String(v)) = record.metadata.get(key) {
            let output = outputs.entry(format!("{key}={v}")).or_insert_with(|| ModelOutput {
                metadata: Metadata::from_iter([
                    ("count".to_string(), MetaValue::Long(0)),
                    (key.to_string(), MetaValue::String(v.clone())),
                ]),
                ..ModelOutput::default()
            });
            if let Some(MetaValue::Long(n)) = output.metadata.get_mut("count") {
                *n += 1;
            }
        }
    }
    outputs
}

/// The expected output of the fixture in mode `project` with `keep`: per final record,
/// the same id with only the metadata keys in `keep`, its document, no embedding.
pub fn reference_project(log: &[(i64, LogRecord)], collection: &str, keep: &[&str]) -> BTreeMap<String, ModelOutput> {
    let state = reference(log);
    let Some(c) = state.collections.get(collection) else { return BTreeMap::new() };
    c.records
        .iter()
        .map(|(id, r)| {
            let metadata =
                r.metadata.iter().filter(|(k, _)| keep.contains(&k.as_str())).map(|(k, v)| (k.clone(), v.clone()));
            (id.clone(), ModelOutput { embedding: None, metadata: metadata.collect(), document: r.document.clone() })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Operation;

    fn log_record(collection: &str, id: &str, operation: Operation) -> LogRecord {
        LogRecord::data(collection, id, operation)
    }

    fn with_metadata(mut record: LogRecord, pairs: &[(&str, MetaValue)]) -> LogRecord {
        record.metadata = Some(pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect());
        record
    }

    #[test]
    fn reference_outputs_are_the_functions_of_the_final_records() {
        let mut a = with_metadata(log_record("c", "a", Operation::Add), &[("k", MetaValue::Long(1))]);
        a.embedding = Some(vec![3.0, 4.0].into());
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
        assert_eq!(counter["function_output"].metadata.get("total_count"), Some(&MetaValue::Long(2)));
        let empty = reference_outputs(&log, "nothing", "record_counter");
        assert_eq!(empty["function_output"].metadata.get("total_count"), Some(&MetaValue::Long(0)));

        let stats = reference_outputs(&log, "c", "statistics");
        assert_eq!(stats.keys().collect::<Vec<_>>(), vec!["k=d:-0.0", "k=l:1"]);
        assert_eq!(stats["k=l:1"].metadata.get("count"), Some(&MetaValue::Long(1)));
        assert_eq!(stats["k=l:1"].metadata.get("key"), Some(&MetaValue::String("k".into())));
        assert_eq!(stats["k=d:-0.0"].metadata.get("value"), Some(&MetaValue::Double(-0.0)));

        let normalized = reference_outputs(&log, "c", "normalize");
        assert_eq!(normalized.keys().collect::<Vec<_>>(), vec!["a", "b"]);
        assert_eq!(normalized["a"].embedding, Some(vec![0.6, 0.8].into()));
        assert_eq!(normalized["b"].embedding, None);
        assert_eq!(normalized["b"].metadata.get("k"), Some(&MetaValue::Double(-0.0)));
    }
}
