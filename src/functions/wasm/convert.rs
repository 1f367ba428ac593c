//! Between Sluice's records and deltas and the types of the `sluice:function` world
//! (`schemas/function.wit`): a change goes in, output deltas come out, checked before
//! they reach the sysdb.

use std::borrow::Cow;

use wasmtime::component::{ComponentType, Lower};

use super::world::sluice::function::types as wit;
use crate::functions::{ChangeRef, OutputDelta, Reads};
use crate::record::validate::{validate, Limits};
use crate::record::{Embedding, LogRecord, MetaValue, Metadata, Operation, Record};

// The change going in, borrowed from the stored records: lowered into the component's
// memory straight from them (wasmtime lowers references, strings and slices), where the
// world's generated types would first copy every string into an owned one. The names are
// the world's (`types` interface); the call checks these types against the component's
// once, when it is instantiated.

/// `meta-value`, borrowed.
#[derive(ComponentType, Lower, Debug)]
#[component(variant)]
pub(super) enum MetaValueArg<'a> {
    #[component(name = "str")]
    Str(&'a str),
    #[component(name = "long")]
    Long(i64),
    #[component(name = "double")]
    Double(f64),
    #[component(name = "boolean")]
    Boolean(bool),
}

/// `meta-entry`, borrowed.
#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(super) struct MetaEntryArg<'a> {
    pub key: &'a str,
    pub value: MetaValueArg<'a>,
}

/// `stored-record`, borrowed (the embedding is copied out of its little-endian bytes).
#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(super) struct StoredRecordArg<'a> {
    pub id: &'a str,
    pub embedding: Option<Vec<f32>>,
    pub metadata: Vec<MetaEntryArg<'a>>,
    pub document: Option<&'a str>,
    pub offset: i64,
}

/// `change`, borrowed.
#[derive(ComponentType, Lower, Debug)]
#[component(record)]
pub(super) struct ChangeArg<'a> {
    pub id: &'a str,
    pub before: Option<StoredRecordArg<'a>>,
    pub after: Option<StoredRecordArg<'a>>,
    pub offset: i64,
}

fn meta_value(v: &MetaValue) -> Option<MetaValueArg<'_>> {
    Some(match v {
        MetaValue::String(s) => MetaValueArg::Str(s),
        MetaValue::Long(n) => MetaValueArg::Long(*n),
        MetaValue::Double(d) => MetaValueArg::Double(*d),
        MetaValue::Bool(b) => MetaValueArg::Boolean(*b),
        // A stored record never holds a null (validation drops them).
        MetaValue::Null => return None,
    })
}

fn stored_record(r: &Record, reads: Reads) -> StoredRecordArg<'_> {
    StoredRecordArg {
        id: &r.id,
        embedding: if reads.embedding { r.embedding.as_ref().map(Embedding::to_vec) } else { None },
        metadata: if reads.metadata {
            r.metadata.iter().filter_map(|(k, v)| Some(MetaEntryArg { key: k, value: meta_value(v)? })).collect()
        } else {
            Vec::new()
        },
        document: if reads.document { r.document.as_deref() } else { None },
        offset: r.offset,
    }
}

/// A change as the component sees it: only the fields it reads (`reads()`), live as in
/// a backfill, so that a function cannot depend on a field it left out, and nothing it
/// does not read is copied into its memory.
pub(super) fn change<'a>(c: &ChangeRef<'a>, reads: Reads) -> ChangeArg<'a> {
    ChangeArg {
        id: c.id,
        before: c.before.map(|r| stored_record(r, reads)),
        after: c.after.map(|r| stored_record(r, reads)),
        offset: c.offset,
    }
}

/// Metadata from the component: keys unique (the last of a repeated key wins, as in a
/// log record's map), never empty. `what` names the delta in an error (only then built).
fn metadata_back(entries: Vec<wit::MetaEntry>, what: impl Fn() -> String) -> Result<Metadata, String> {
    let mut m = Metadata::new();
    for e in entries {
        if e.key.is_empty() {
            return Err(format!("{}: a metadata key is empty", what()));
        }
        let v = match e.value {
            wit::MetaValue::Str(s) => MetaValue::String(s),
            wit::MetaValue::Long(n) => MetaValue::Long(n),
            wit::MetaValue::Double(d) if d.is_finite() => MetaValue::Double(d),
            wit::MetaValue::Double(d) => {
                return Err(format!("{}: metadata {:?} is {d}, not a finite number", what(), e.key))
            }
            wit::MetaValue::Boolean(b) => MetaValue::Bool(b),
        };
        m.insert(e.key, v);
    }
    Ok(m)
}

/// A record the component puts, checked with the limits of a log record (an output
/// record is stored like any other). Its fields move through the check, not copied: this
/// runs once per put of every change a function sees.
fn record_back(r: wit::StoredRecord) -> Result<Record, String> {
    let what = |id: &str| format!("put of output record {id:?}");
    if r.id.is_empty() {
        return Err("a put has an empty record id".into());
    }
    if let Some(e) = &r.embedding {
        if let Some(bad) = e.iter().find(|x| !x.is_finite()) {
            return Err(format!("{}: the embedding holds {bad}, not a finite number", what(&r.id)));
        }
    }
    let metadata = metadata_back(r.metadata, || what(&r.id))?;
    let mut log = LogRecord::data("output", r.id, Operation::Upsert);
    log.embedding = r.embedding.as_deref().map(Embedding::from_f32s);
    log.metadata = Some(metadata);
    log.document = r.document;
    validate(&log, &Limits::DEFAULT).map_err(|e| format!("{}: {e}", what(&log.id)))?;
    Ok(Record {
        id: log.id,
        embedding: log.embedding,
        metadata: log.metadata.unwrap_or_default(),
        document: log.document,
        offset: r.offset,
    })
}

/// The deltas the component returned for the change at `offset`, checked: a put or a
/// removal carries the change's own offset as its version (a component cannot write
/// into another change's version), ids are not empty, values within the log's limits.
pub(super) fn deltas_back(
    deltas: Vec<wit::OutputDelta>,
    offset: i64,
    out: &mut Vec<OutputDelta>,
) -> Result<(), String> {
    for d in deltas {
        out.push(match d {
            wit::OutputDelta::Count(c) => {
                if c.output_id.is_empty() || c.count_field.is_empty() {
                    return Err("a count has an empty output id or count field".into());
                }
                let fields = metadata_back(c.fields, || format!("count of output record {:?}", c.output_id))?;
                OutputDelta::Count {
                    output_id: c.output_id,
                    fields,
                    count_field: Cow::Owned(c.count_field),
                    delta: c.delta,
                    remove_at_zero: c.remove_at_zero,
                }
            }
            wit::OutputDelta::Put(r) => {
                if r.offset != offset {
                    return Err(format!(
                        "put of output record {:?} has version {} but the change is at offset {offset}: a put's \
                         offset must be the change's",
                        r.id, r.offset
                    ));
                }
                OutputDelta::Put { record: record_back(r)? }
            }
            wit::OutputDelta::Remove(r) => {
                if r.id.is_empty() {
                    return Err("a remove has an empty record id".into());
                }
                if r.offset != offset {
                    return Err(format!(
                        "remove of output record {:?} has version {} but the change is at offset {offset}: a \
                         removal's offset must be the change's",
                        r.id, r.offset
                    ));
                }
                OutputDelta::Remove { id: r.id, offset: r.offset }
            }
        });
    }
    Ok(())
}

/// The fields a component reads.
pub(super) fn reads(f: wit::StoredFields) -> crate::functions::Reads {
    crate::functions::Reads {
        embedding: f.contains(wit::StoredFields::EMBEDDING),
        metadata: f.contains(wit::StoredFields::METADATA),
        document: f.contains(wit::StoredFields::DOCUMENT),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(id: &str, offset: i64) -> wit::StoredRecord {
        wit::StoredRecord {
            id: id.into(),
            embedding: Some(vec![1.0, 2.0]),
            metadata: vec![wit::MetaEntry { key: "k".into(), value: wit::MetaValue::Long(3) }],
            document: Some("d".into()),
            offset,
        }
    }

    #[test]
    fn a_record_goes_through_and_back_unchanged() {
        let r = Record {
            id: "a".into(),
            embedding: Some(Embedding::from_f32s(&[1.0, 2.0])),
            metadata: Metadata::from_iter([
                ("b".to_string(), MetaValue::Bool(true)),
                ("d".to_string(), MetaValue::Double(-0.0)),
                ("k".to_string(), MetaValue::Long(3)),
                ("s".to_string(), MetaValue::String("x".into())),
            ]),
            document: Some("doc".into()),
            offset: 7,
        };
        let mut out = Vec::new();
        let put = wit::StoredRecord {
            id: r.id.clone(),
            embedding: r.embedding.as_ref().map(Embedding::to_vec),
            metadata: vec![
                wit::MetaEntry { key: "b".into(), value: wit::MetaValue::Boolean(true) },
                wit::MetaEntry { key: "d".into(), value: wit::MetaValue::Double(-0.0) },
                wit::MetaEntry { key: "k".into(), value: wit::MetaValue::Long(3) },
                wit::MetaEntry { key: "s".into(), value: wit::MetaValue::Str("x".into()) },
            ],
            document: r.document.clone(),
            offset: r.offset,
        };
        deltas_back(vec![wit::OutputDelta::Put(put)], 7, &mut out).unwrap();
        assert_eq!(out, vec![OutputDelta::Put { record: r }]);
    }

    #[test]
    fn a_change_carries_only_the_fields_the_function_reads() {
        let r = Record {
            id: "a".into(),
            embedding: Some(Embedding::from_f32s(&[1.0, 2.0])),
            metadata: Metadata::from_iter([("k".to_string(), MetaValue::Long(3))]),
            document: Some("doc".into()),
            offset: 7,
        };
        let c = ChangeRef { id: "a", before: Some(&r), after: Some(&r), offset: 8 };
        for reads in [
            Reads::NOTHING,
            Reads { metadata: true, ..Reads::NOTHING },
            Reads { embedding: true, ..Reads::NOTHING },
            Reads { document: true, ..Reads::NOTHING },
            Reads::ALL,
        ] {
            let seen = change(&c, reads);
            for side in [seen.before.unwrap(), seen.after.unwrap()] {
                assert_eq!(side.embedding.is_some(), reads.embedding, "{reads:?}");
                assert_eq!(!side.metadata.is_empty(), reads.metadata, "{reads:?}");
                assert_eq!(side.document.is_some(), reads.document, "{reads:?}");
                assert_eq!((side.id, side.offset), ("a", 7));
            }
            assert_eq!((seen.id, seen.offset), ("a", 8));
        }
    }

    #[test]
    fn output_the_host_refuses_is_an_error_naming_it() {
        let mut out = Vec::new();
        let err = deltas_back(vec![wit::OutputDelta::Put(rec("a", 3))], 4, &mut out).unwrap_err();
        assert!(err.contains("version 3") && err.contains("offset 4"), "{err}");
        let err = deltas_back(vec![wit::OutputDelta::Put(rec("", 4))], 4, &mut out).unwrap_err();
        assert!(err.contains("empty record id"), "{err}");
        let mut nan = rec("a", 4);
        nan.embedding = Some(vec![f32::NAN]);
        let err = deltas_back(vec![wit::OutputDelta::Put(nan)], 4, &mut out).unwrap_err();
        assert!(err.contains("not a finite number"), "{err}");
        let long = rec(&"x".repeat(5000), 4);
        assert!(deltas_back(vec![wit::OutputDelta::Put(long)], 4, &mut out).is_err());
        let count = wit::Counter {
            output_id: "o".into(),
            fields: vec![],
            count_field: String::new(),
            delta: 1,
            remove_at_zero: false,
        };
        assert!(deltas_back(vec![wit::OutputDelta::Count(count)], 4, &mut out).is_err());
    }
}
