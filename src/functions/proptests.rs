//! Property tests: the live path alone. Random logs are folded through
//! [`fold_batch`] in random batch splits, every [`Change`](crate::materialize::Change)
//! goes to each function, the deltas are applied with [`apply_deltas`], and the output
//! equals [`reference_outputs`] — the function computed from the final records.

use std::collections::BTreeMap;

use proptest::collection::vec;
use proptest::prelude::*;

use super::apply::{apply_deltas, OutputStore};
use super::registry::{self, NAMES};
use super::{record_counter, ChangeRef, Function, Reads};
use crate::functions::model::{reference_outputs, ModelOutput};
use crate::materialize::fold_batch;
use crate::record::{Embedding, LogRecord, MetaValue, Metadata, Operation, Record};

/// The output as a reader sees it: an absent `record_counter` counter reads as 0
/// (see [`reference_outputs`]).
pub(super) fn observed(store: &OutputStore, function: &str) -> BTreeMap<String, ModelOutput> {
    let mut contents = store.contents();
    if function == record_counter::NAME {
        contents.entry(record_counter::OUTPUT_ID.to_string()).or_insert_with(|| ModelOutput {
            metadata: Metadata::from_iter([(record_counter::COUNT_FIELD.to_string(), MetaValue::Long(0))]),
            ..ModelOutput::default()
        });
    }
    contents
}

/// Metadata keys, two of which need escaping in statistics ids.
pub(super) const KEYS: [&str; 4] = ["k", "a=b", "50%", "c"];

/// A small value set so that pairs recur: `Null` (removes the key on merge), strings
/// (one with the id separator in it), longs, `0.0` and `-0.0` (distinct pairs), bools.
pub(super) fn meta_value(n: u8) -> MetaValue {
    match n % 10 {
        0 | 1 => MetaValue::Null,
        2 => MetaValue::String("x".into()),
        3 => MetaValue::String("y=s:z".into()),
        4 => MetaValue::Long(1),
        5 => MetaValue::Long(2),
        6 => MetaValue::Double(0.0),
        7 => MetaValue::Double(-0.0),
        8 => MetaValue::Double(0.5),
        _ => MetaValue::Bool(true),
    }
}

/// Mostly dimension 2 with small components (the zero vector among them), rarely
/// dimension 3 (rejected once the dimension is fixed), often none.
pub(super) fn embedding(kind: u8, a: i8, b: i8) -> Option<Embedding> {
    match kind % 8 {
        0..=2 => None,
        3..=6 => Some([f32::from(a), f32::from(b)].into()),
        _ => Some([f32::from(a), f32::from(b), 1.0].into()),
    }
}

#[derive(Debug, Clone)]
struct Entry {
    record: LogRecord,
    gap: i64,
    cut: bool,
}

fn arb_entry() -> impl Strategy<Value = Entry> {
    ((0..5u8, 0..5u8, 0..10u8), (0..8u8, -1..2i8, 0..2i8), vec((0..4usize, any::<u8>()), 0..3), 0..4u8, 1..3i64, 0..3u8)
        .prop_map(|((collection, id, op), (kind, a, b), pairs, document, gap, cut)| {
            let operation = match op {
                0..=2 => Operation::Add,
                3..=4 => Operation::Update,
                5..=6 => Operation::Upsert,
                _ => Operation::Delete,
            };
            // c0 mostly; c1 shares the offsets, as collections share a partition.
            let collection = if collection == 0 { "c1" } else { "c0" };
            let mut record = LogRecord::data(collection, format!("id{id}"), operation);
            record.embedding = embedding(kind, a, b);
            record.metadata = (!pairs.is_empty())
                .then(|| pairs.into_iter().map(|(k, v)| (KEYS[k].to_string(), meta_value(v))).collect());
            record.document = match document {
                0 | 1 => None,
                2 => Some("d".into()),
                _ => Some("e".into()),
            };
            Entry { record, gap, cut: cut == 0 }
        })
}

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

/// Folds each collection's records in batches cut at the marked entries and feeds
/// every change to every function. Returns the output stores per (collection, function).
fn run_live(entries: &[Entry], versioned: bool) -> BTreeMap<(String, &'static str), OutputStore> {
    let log = with_offsets(entries);
    let functions: Vec<_> = NAMES.iter().map(|name| registry::build(name, &BTreeMap::new()).expect("builds")).collect();
    let mut outputs = BTreeMap::new();
    for collection in ["c0", "c1"] {
        let mut store: BTreeMap<String, Record> = BTreeMap::new();
        let mut dimension = None;
        let mut batch: Vec<(i64, &LogRecord)> = Vec::new();
        let of_collection = log.iter().zip(entries).filter(|((_, r), _)| r.collection_id == collection);
        let mut stores: Vec<OutputStore> = vec![OutputStore::default(); functions.len()];
        let count = of_collection.clone().count();
        for (i, ((offset, record), entry)) in of_collection.enumerate() {
            batch.push((*offset, record));
            if !entry.cut && i + 1 < count {
                continue;
            }
            let out = fold_batch(&store, dimension, batch.drain(..)).expect("ordered");
            for change in &out.changes {
                let change = ChangeRef {
                    id: &change.id,
                    before: change.before.as_ref(),
                    after: change.after.as_ref(),
                    offset: change.offset,
                };
                for (f, output) in functions.iter().zip(&mut stores) {
                    let mut deltas = Vec::new();
                    f.deltas(&change, &mut deltas);
                    apply_deltas(output, &deltas, versioned);
                }
            }
            for (id, after) in out.final_states() {
                match after {
                    Some(record) => store.insert(id.to_string(), record.clone()),
                    None => store.remove(id),
                };
            }
            dimension = out.dimension;
        }
        for (f, output) in functions.iter().zip(stores) {
            outputs.insert((collection.to_string(), f.name()), output);
        }
    }
    outputs
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn live_deltas_in_any_batch_split_equal_the_functions_of_the_final_records(
        entries in vec(arb_entry(), 0..60),
        versioned in any::<bool>(),
    ) {
        let log = with_offsets(&entries);
        for ((collection, function), store) in run_live(&entries, versioned) {
            let expected = reference_outputs(&log, &collection, function);
            prop_assert_eq!(observed(&store, function), expected, "{} of {}", function, collection);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// A backfill reads only what [`super::Function::reads`] names: every function's
    /// deltas of a change equal its deltas of the change with both records projected to
    /// those fields. A function that reads a field it leaves out fails here. And a
    /// function that reads neither embedding nor document gives the same deltas when the
    /// record before the change comes from a light read (no embedding, no document), as
    /// the processor reads it for such functions (`batch::ids_to_read`).
    #[test]
    fn each_function_reads_no_field_it_leaves_out(entries in vec(arb_entry(), 0..60)) {
        let log = with_offsets(&entries);
        let records: Vec<_> = log.iter().filter(|(_, r)| r.collection_id == "c0").map(|(o, r)| (*o, r)).collect();
        let out = fold_batch(&BTreeMap::<String, Record>::new(), None, records).expect("ordered");
        for name in NAMES {
            let f = registry::build(name, &BTreeMap::new()).expect("builds");
            let reads = f.reads();
            for c in &out.changes {
                let (before, after) = (c.before.as_ref().map(|r| reads.project(r)), c.after.as_ref().map(|r| reads.project(r)));
                let (mut full, mut projected) = (Vec::new(), Vec::new());
                f.deltas(&ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset }, &mut full);
                f.deltas(&ChangeRef { id: &c.id, before: before.as_ref(), after: after.as_ref(), offset: c.offset }, &mut projected);
                prop_assert_eq!(&full, &projected, "{} of change {:?}", name, c);
                if !reads.values() {
                    let light = Reads { metadata: true, ..Reads::NOTHING };
                    let before = c.before.as_ref().map(|r| light.project(r));
                    let mut lighter = Vec::new();
                    f.deltas(&ChangeRef { id: &c.id, before: before.as_ref(), after: c.after.as_ref(), offset: c.offset }, &mut lighter);
                    prop_assert_eq!(&full, &lighter, "{} of change {:?}, read light", name, c);
                }
            }
        }
    }
}

/// Guards the generator: the cases the property must cover occur often enough.
#[test]
fn generated_logs_exercise_the_function_cases() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    let mut runner = TestRunner::deterministic();
    let strategy = vec(arb_entry(), 0..60);
    let mut seen: BTreeMap<&str, u32> = BTreeMap::new();
    for _ in 0..200 {
        let entries = strategy.new_tree(&mut runner).expect("generate").current();
        let log = with_offsets(&entries);
        let records: Vec<_> = log.iter().filter(|(_, r)| r.collection_id == "c0").map(|(o, r)| (*o, r)).collect();
        let out = fold_batch(&BTreeMap::<String, Record>::new(), None, records).expect("ordered");
        let mut hit = |case, yes: bool| {
            if yes {
                *seen.entry(case).or_default() += 1;
            }
        };
        hit("several batches", entries.iter().filter(|e| e.cut).count() >= 2);
        hit("re-add after delete", out.changes.windows(2).any(|w| w[0].id == w[1].id && w[0].after.is_none()));
        hit(
            "pair value changed",
            out.changes.iter().any(|c| match (&c.before, &c.after) {
                (Some(b), Some(a)) => b.metadata.iter().any(|(k, v)| a.metadata.get(k).is_some_and(|w| w != v)),
                _ => false,
            }),
        );
        hit(
            "zero and minus zero",
            out.changes.iter().filter_map(|c| c.after.as_ref()).any(|r| {
                r.metadata.values().any(|v| matches!(v, MetaValue::Double(d) if d.to_bits() == (-0.0f64).to_bits()))
            }),
        );
        hit(
            "zero vector",
            out.changes
                .iter()
                .filter_map(|c| c.after.as_ref())
                .any(|r| r.embedding.as_ref().is_some_and(|e| e.iter().all(|x| x == 0.0))),
        );
        let stats = reference_outputs(&log, "c0", "statistics");
        hit("escaped key", stats.keys().any(|k| k.starts_with("a%3Db=") || k.starts_with("50%25=")));
        hit(
            "count above one",
            stats.values().any(|o| matches!(o.metadata.get("count"), Some(MetaValue::Long(n)) if *n > 1)),
        );
    }
    for case in [
        "several batches",
        "re-add after delete",
        "pair value changed",
        "zero and minus zero",
        "zero vector",
        "escaped key",
        "count above one",
    ] {
        assert!(seen.get(case).copied().unwrap_or(0) >= 20, "case {case:?} too rare: {seen:?}");
    }
}

/// Native Rust code of the same logic as the WebAssembly fixture's two modes
/// (`testdata/wasm/fixture.py`): the reference its deltas are held to.
mod native {
    use super::super::{ChangeRef, Function, OutputDelta, Reads};
    use crate::record::{MetaValue, Metadata, Record};

    pub(super) struct CountBy(pub &'static str);

    impl Function for CountBy {
        fn name(&self) -> &'static str {
            "native_count_by"
        }
        fn reads(&self) -> Reads {
            Reads { metadata: true, ..Reads::NOTHING }
        }
        fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
            for (record, delta) in [(change.before, -1), (change.after, 1)] {
                if let Some(MetaValue::String(v)) = record.and_then(|r| r.metadata.get(self.0)) {
                    out.push(OutputDelta::Count {
                        output_id: format!("{}={v}", self.0),
                        fields: Metadata::from_iter([(self.0.to_string(), MetaValue::String(v.clone()))]),
                        count_field: "count".into(),
                        delta,
                        remove_at_zero: true,
                    });
                }
            }
        }
    }

    pub(super) struct Project(pub &'static [&'static str]);

    impl Function for Project {
        fn name(&self) -> &'static str {
            "native_project"
        }
        fn reads(&self) -> Reads {
            Reads { metadata: true, document: true, embedding: false }
        }
        fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
            out.push(match change.after {
                None => OutputDelta::Remove { id: change.id.to_string(), offset: change.offset },
                Some(a) => OutputDelta::Put {
                    record: Record {
                        id: a.id.clone(),
                        embedding: None,
                        metadata: a
                            .metadata
                            .iter()
                            .filter(|(k, _)| self.0.contains(&k.as_str()))
                            .map(|(k, v)| (k.clone(), v.clone()))
                            .collect(),
                        document: a.document.clone(),
                        offset: change.offset,
                    },
                },
            });
        }
    }
}

/// The fixture's functions beside their native references, built once per process
/// (`None`: componentize-py is missing outside CI).
#[allow(clippy::type_complexity)]
fn wasm_pairs() -> Option<&'static [(super::wasm::WasmFunction, Box<dyn super::Function>, &'static str); 2]> {
    use std::sync::OnceLock;
    static PAIRS: OnceLock<Option<[(super::wasm::WasmFunction, Box<dyn super::Function>, &'static str); 2]>> =
        OnceLock::new();
    PAIRS
        .get_or_init(|| {
            let fx = super::wasm::tests::fixtures()?;
            Some([
                (
                    fx.function(r#"{"mode": "count_by", "key": "k"}"#).expect("count_by"),
                    Box::new(native::CountBy("k")) as Box<dyn super::Function>,
                    "count_by",
                ),
                (
                    fx.function(r#"{"mode": "project", "keep": ["k", "a=b"]}"#).expect("project"),
                    Box::new(native::Project(&["k", "a=b"])) as Box<dyn super::Function>,
                    "project",
                ),
            ])
        })
        .as_ref()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A WebAssembly function (the fixture component) gives, change by change, the deltas
    /// of native Rust code of the same logic, reads no field it leaves out, and its
    /// output over random logs in random batch splits equals the reference model's.
    #[test]
    fn wasm_function_deltas_equal_the_native_reference_and_the_model(
        entries in vec(arb_entry(), 0..60),
        versioned in any::<bool>(),
    ) {
        let Some(pairs) = wasm_pairs() else { return Ok(()) };
        let log = with_offsets(&entries);
        let records: Vec<_> = log.iter().filter(|(_, r)| r.collection_id == "c0").map(|(o, r)| (*o, r)).collect();
        let mut store: BTreeMap<String, Record> = BTreeMap::new();
        let mut dimension = None;
        let mut outputs = vec![OutputStore::default(); pairs.len()];
        let cuts: Vec<bool> = entries.iter().filter(|e| e.record.collection_id == "c0").map(|e| e.cut).collect();
        let mut batch = Vec::new();
        for (i, (offset, record)) in records.iter().enumerate() {
            batch.push((*offset, *record));
            if !cuts[i] && i + 1 < records.len() {
                continue;
            }
            let out = fold_batch(&store, dimension, batch.drain(..)).expect("ordered");
            for c in &out.changes {
                let change = ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset };
                for ((wasm, native, mode), output) in pairs.iter().zip(&mut outputs) {
                    let (mut got, mut want) = (Vec::new(), Vec::new());
                    wasm.try_deltas(&change, &mut got).expect("the fixture does not fail");
                    native.deltas(&change, &mut want);
                    prop_assert_eq!(&got, &want, "{} on {:?}", mode, c);
                    let reads = wasm.reads();
                    prop_assert_eq!(reads, native.reads());
                    let (b, a) = (c.before.as_ref().map(|r| reads.project(r)), c.after.as_ref().map(|r| reads.project(r)));
                    let mut projected = Vec::new();
                    wasm.try_deltas(&ChangeRef { before: b.as_ref(), after: a.as_ref(), ..change }, &mut projected).expect("no failure");
                    prop_assert_eq!(&got, &projected, "{} reads a field it leaves out", mode);
                    apply_deltas(output, &got, versioned);
                }
            }
            for (id, after) in out.final_states() {
                match after {
                    Some(record) => store.insert(id.to_string(), record.clone()),
                    None => store.remove(id),
                };
            }
            dimension = out.dimension;
        }
        let expected = [
            crate::functions::model::reference_count_by(&log, "c0", "k"),
            crate::functions::model::reference_project(&log, "c0", &["k", "a=b"]),
        ];
        for (((_, _, mode), output), want) in pairs.iter().zip(&outputs).zip(expected) {
            prop_assert_eq!(output.contents(), want, "{}", mode);
        }
    }
}
