//! Turning one partition's batch of messages into a [`BatchCommit`] plus DLQ entries.
//! Pure: the worker loads what it needs from the sysdb and hands it in.

use std::collections::{BTreeMap, HashMap};

use crate::config::UnknownCollections;
use crate::kafka::Msg;
use crate::materialize::{fold_batch, fold_final, BatchOutcome, FoldError, IgnoreReason, Rejected};
use crate::positions::{IncompatibleDelta, PositionDelta};
use crate::record::avro::WriterSchemas;
use crate::record::framing::{unframe, Framing};
use crate::record::partitioner::partition_for;
use crate::record::validate::{validate, Limits};
use crate::record::{codec, LogRecord, Operation, Record};
use crate::sysdb::{
    BatchCommit, ChangeOp, CollectionRow, CollectionUpdate, ErrorClass, FunctionBatch, OutboxChange, SysdbError,
};

/// A record that goes to the dead-letter topic, with why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DlqEntry {
    pub offset: i64,
    /// Stable snake_case reason (metric label and `sluice.error.kind` header).
    pub kind: &'static str,
    pub message: String,
}

/// DLQ kinds the processor itself assigns (decode and validation errors carry their own).
pub mod kinds {
    pub const EMPTY_PAYLOAD: &str = "empty_payload";
    pub const MISROUTED: &str = "misrouted";
    pub const KEY_MISMATCH: &str = "key_mismatch";
    pub const UNKNOWN_COLLECTION: &str = "unknown_collection";
    pub const DIMENSION_MISMATCH: &str = "dimension_mismatch";
    /// The sysdb refused to store the record (found by splitting the batch).
    pub const SYSDB_REJECTED: &str = "sysdb_rejected";
    /// The writer schema cannot be resolved to the current schema (its id is in the
    /// `sluice.schema.id` header).
    pub const INCOMPATIBLE_SCHEMA: &str = crate::record::avro::INCOMPATIBLE_SCHEMA;
    /// Never sent to the DLQ: the plan turns it into a batch error (see `decode_all`).
    pub const SCHEMA_NOT_FETCHED: &str = "schema_not_fetched";
}

/// Why a batch did not commit, classified by what the worker does about it.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// Another writer moved the partition (CAS): adopt the stored position.
    #[error(transparent)]
    Conflict(#[from] IncompatibleDelta),
    /// The sysdb is unreachable, busy or restarting: retry with backoff, indefinitely.
    #[error("{0}")]
    Transient(SysdbError),
    /// The sysdb refused a value of this batch: find the record and send it to the DLQ.
    #[error("{0}")]
    Record(SysdbError),
    /// Any other database failure: retried a bounded number of times, then the partition
    /// halts.
    #[error("{0}")]
    Fatal(SysdbError),
    /// The partition was given up (revoke or shutdown timed out) while the batch was in
    /// flight: it must not commit.
    #[error("the partition was given up while the batch was in flight")]
    Fenced,
    /// The schema registry is unreachable or does not know a writer schema id of the
    /// batch (yet): the batch waits, nothing of it goes to the DLQ or is skipped; retried
    /// with backoff, indefinitely.
    #[error("writer schema unavailable: {0}")]
    SchemaUnavailable(String),
    /// A bug in the processor (e.g. a fold over records in the wrong order): retrying
    /// cannot help; the partition halts at once.
    #[error("{0}")]
    Bug(String),
}

impl From<SysdbError> for BatchError {
    fn from(e: SysdbError) -> Self {
        match e.class() {
            ErrorClass::Conflict => match e {
                SysdbError::Conflict(c) => BatchError::Conflict(c),
                other => BatchError::Fatal(other),
            },
            ErrorClass::Transient => BatchError::Transient(e),
            ErrorClass::Record => BatchError::Record(e),
            ErrorClass::Fatal => BatchError::Fatal(e),
        }
    }
}

/// Decode and validate every message; bad ones become DLQ entries. With a schema
/// registry, `schemas` holds the writer schema of every id the batch names (fetched
/// before); without one (`None`) the header's id is ignored and the hand-written codec
/// reads every datum.
pub fn decode_all(
    msgs: &[Msg],
    framing: Framing,
    limits: &Limits,
    schemas: Option<&WriterSchemas>,
) -> Vec<(i64, Result<LogRecord, DlqEntry>)> {
    msgs.iter().map(|m| (m.offset, decode_one(m, framing, limits, schemas))).collect()
}

fn decode_one(
    m: &Msg,
    framing: Framing,
    limits: &Limits,
    schemas: Option<&WriterSchemas>,
) -> Result<LogRecord, DlqEntry> {
    let bad = |kind: &'static str, message: String| DlqEntry { offset: m.offset, kind, message };
    let payload = match &m.payload {
        Some(p) if !p.is_empty() => p,
        _ => return Err(bad(kinds::EMPTY_PAYLOAD, "message has no value".into())),
    };
    let (schema_id, datum) = unframe(framing, payload).map_err(|e| bad(e.kind(), e.to_string()))?;
    // The record's embedding is a slice of the payload (no copy): the payload is alive
    // for the batch anyway, to be sent to the DLQ whole if the record is refused.
    let datum = payload.slice_ref(datum);
    let rec = match (schemas, schema_id) {
        (Some(schemas), Some(id)) => match schemas.get(&id) {
            Some(writer) => writer.decode_shared(&datum).map_err(|e| bad(e.kind(), format!("schema id {id}: {e}")))?,
            // The plan fetches every id first; a missing one here is a bug, and a DLQ
            // entry would lose a record the registry may know: fail the batch instead.
            None => return Err(bad(kinds::SCHEMA_NOT_FETCHED, format!("writer schema id {id} was not fetched"))),
        },
        _ => codec::decode_shared(&datum).map_err(|e| bad(e.kind(), e.to_string()))?,
    };
    validate(&rec, limits).map_err(|e| bad(e.kind(), e.to_string()))?;
    if let Some(key) = &m.key {
        if key[..] != *rec.collection_id.as_bytes() {
            return Err(bad(
                kinds::KEY_MISMATCH,
                format!(
                    "message key {:?} is not the record's collection id {:?}; producers must key by collection id",
                    String::from_utf8_lossy(key),
                    rec.collection_id
                ),
            ));
        }
    }
    Ok(rec)
}

/// Everything the batch needs to know about a collection before folding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Known {
    Registered(CollectionRow),
    Unknown,
}

/// A collection's row (if registered) and its records of the batch, in offset order.
pub type CollectionBatch = (Option<CollectionRow>, Vec<(i64, LogRecord)>);

/// Collections of one batch, split for folding, plus what went to the DLQ on the way.
#[derive(Debug, Default)]
pub struct Routed {
    /// Per collection (id order): its row if registered, and its records in offset order.
    pub collections: BTreeMap<String, CollectionBatch>,
    pub dlq: Vec<DlqEntry>,
}

/// Check each record's collection against the partition it arrived on.
pub fn route(
    decoded: Vec<(i64, Result<LogRecord, DlqEntry>)>,
    partition: i32,
    topic_partitions: i32,
    known: &HashMap<String, Known>,
    policy: UnknownCollections,
) -> Routed {
    let mut out = Routed::default();
    for (offset, r) in decoded {
        let rec = match r {
            Ok(rec) => rec,
            Err(e) => {
                out.dlq.push(e);
                continue;
            }
        };
        // A collection that already has records in the batch passed the checks below,
        // which depend on the collection alone.
        if let Some((_, records)) = out.collections.get_mut(rec.collection_id.as_str()) {
            records.push((offset, rec));
            continue;
        }
        let row = match known.get(&rec.collection_id) {
            Some(Known::Registered(row)) => {
                if row.partition != partition {
                    out.dlq.push(DlqEntry {
                        offset,
                        kind: kinds::MISROUTED,
                        message: format!(
                            "collection {:?} is registered on partition {} but this record arrived on partition {partition}",
                            rec.collection_id, row.partition
                        ),
                    });
                    continue;
                }
                Some(row.clone())
            }
            _ => {
                if policy == UnknownCollections::Reject {
                    out.dlq.push(DlqEntry {
                        offset,
                        kind: kinds::UNKNOWN_COLLECTION,
                        message: format!(
                            "collection {:?} is not registered and processor.unknown_collections = \"reject\"",
                            rec.collection_id
                        ),
                    });
                    continue;
                }
                let home = partition_for(rec.collection_id.as_bytes(), topic_partitions as u32) as i32;
                if home != partition {
                    out.dlq.push(DlqEntry {
                        offset,
                        kind: kinds::MISROUTED,
                        message: format!(
                            "collection {:?} belongs on partition {home} (murmur2 of its id over {topic_partitions}) but arrived on partition {partition}; set partitioner=murmur2_random",
                            rec.collection_id
                        ),
                    });
                    continue;
                }
                None
            }
        };
        out.collections.insert(rec.collection_id.clone(), (row, vec![(offset, rec)]));
    }
    out
}

/// Per-batch counts for metrics and logs.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BatchCounts {
    pub by_operation: BTreeMap<&'static str, u64>,
    pub ignored: BTreeMap<&'static str, u64>,
    pub controls: u64,
}

/// What folding one collection's records gives the rest of the batch.
#[derive(Debug)]
pub struct Folded {
    /// The collection's update; `None` if nothing of the collection was applied.
    pub update: Option<CollectionUpdate>,
    /// Data records applied (neither rejected nor control records; ignored ones count:
    /// they were applied as no-ops).
    pub applied: u64,
}

/// Fold one collection's records over its current records and produce its update, for
/// a collection without attached functions: the records and the current state are
/// moved into the update, nothing is copied ([`fold_final`]).
pub fn fold_collection(
    id: &str,
    row: Option<&CollectionRow>,
    partition: i32,
    records: Vec<(i64, LogRecord)>,
    mut current: HashMap<String, Record>,
    counts: &mut BatchCounts,
    dlq: &mut Vec<DlqEntry>,
) -> Result<Folded, FoldError> {
    let dimension = row.and_then(|r| r.dimension).map(|d| d as usize);
    let ops: Vec<(i64, Operation)> = records.iter().map(|(o, r)| (*o, r.operation)).collect();
    let outcome = fold_final(|rid| current.remove(rid), dimension, records)?;
    let Some(log_position) =
        account(id, &ops, &outcome.rejected, &outcome.ignored, outcome.controls.len(), counts, dlq)
    else {
        return Ok(Folded { update: None, applied: 0 });
    };
    let mut record_count_delta = 0i64;
    let writes: Vec<(String, Option<Record>)> = outcome
        .states
        .into_iter()
        .map(|s| {
            record_count_delta += i64::from(s.after.is_some()) - i64::from(s.was_live);
            (s.id, s.after)
        })
        .collect();
    let applied = applied_count(&ops, outcome.rejected.len());
    let update = collection_update(id, row, partition, outcome.dimension, log_position, record_count_delta, writes);
    Ok(Folded { update: Some(update), applied })
}

/// [`fold_collection`] for a collection with attached functions: their deltas need
/// every change of the batch, so this keeps the [`BatchOutcome`] (and copies what it
/// writes out of it).
pub fn fold_collection_with_changes(
    id: &str,
    row: Option<&CollectionRow>,
    partition: i32,
    records: &[(i64, LogRecord)],
    current: &HashMap<String, Record>,
    counts: &mut BatchCounts,
    dlq: &mut Vec<DlqEntry>,
) -> Result<(Folded, BatchOutcome), FoldError> {
    let dimension = row.and_then(|r| r.dimension).map(|d| d as usize);
    let outcome = fold_batch(current, dimension, records.iter().map(|(o, r)| (*o, r)))?;
    let ops: Vec<(i64, Operation)> = records.iter().map(|(o, r)| (*o, r.operation)).collect();
    let Some(log_position) =
        account(id, &ops, &outcome.rejected, &outcome.ignored, outcome.controls.len(), counts, dlq)
    else {
        return Ok((Folded { update: None, applied: 0 }, outcome));
    };
    let mut record_count_delta = 0i64;
    let writes: Vec<(String, Option<Record>)> = outcome
        .final_states()
        .into_iter()
        .map(|(rid, state)| {
            let was = current.contains_key(rid);
            record_count_delta += i64::from(state.is_some()) - i64::from(was);
            (rid.to_string(), state.cloned())
        })
        .collect();
    let applied = applied_count(&ops, outcome.rejected.len());
    let update = collection_update(id, row, partition, outcome.dimension, log_position, record_count_delta, writes);
    Ok((Folded { update: Some(update), applied }, outcome))
}

/// Count a folded collection's records (`ops`: each record's offset and operation, in
/// offset order) and send its rejected ones to the DLQ; `rejected`, `ignored` and
/// `controls` come from either fold's outcome. Returns the offset of its last applied
/// record (`None`: none was applied).
fn account(
    id: &str,
    ops: &[(i64, Operation)],
    rejected: &[Rejected],
    ignored: &[(i64, IgnoreReason)],
    controls: usize,
    counts: &mut BatchCounts,
    dlq: &mut Vec<DlqEntry>,
) -> Option<i64> {
    for rj in rejected {
        dlq.push(DlqEntry {
            offset: rj.offset,
            kind: kinds::DIMENSION_MISMATCH,
            message: format!(
                "record {:?}: embedding has {} dimensions but collection {id:?} has {}",
                rj.id, rj.actual, rj.expected
            ),
        });
    }
    for (_, reason) in ignored {
        *counts.ignored.entry(IgnoreReason::label(*reason)).or_default() += 1;
    }
    counts.controls += controls as u64;
    // Both lists are in offset order: walk them together.
    let mut rejected = rejected.iter().map(|r| r.offset).peekable();
    let mut last_applied = None;
    for (o, op) in ops {
        if rejected.next_if_eq(o).is_some() {
            continue;
        }
        last_applied = Some(*o);
        if *op != Operation::BackfillFn {
            *counts.by_operation.entry(op.symbol()).or_default() += 1;
        }
    }
    last_applied
}

/// Data records applied: all data records but the rejected ones.
fn applied_count(ops: &[(i64, Operation)], rejected: usize) -> u64 {
    (ops.iter().filter(|(_, op)| op.is_data()).count() - rejected) as u64
}

fn collection_update(
    id: &str,
    row: Option<&CollectionRow>,
    partition: i32,
    dimension: Option<usize>,
    log_position: i64,
    record_count_delta: i64,
    writes: Vec<(String, Option<Record>)>,
) -> CollectionUpdate {
    CollectionUpdate {
        id: id.to_string(),
        partition: row.map(|r| r.partition).unwrap_or(partition),
        dimension: dimension.map(|d| d as u32),
        log_position: log_position.max(row.map(|r| r.log_position).unwrap_or(-1)),
        record_count_delta,
        writes,
    }
}

/// The ids a batch of one collection must read, each with whether the fold may need the
/// whole stored record (`true`) or only its existence and metadata (`false`).
///
/// Only the batch's FIRST data record of an id ever sees the stored state (later ones see
/// the batch's own changes), so the stored embedding and document can matter only when
/// that first record does not replace them for sure: an UPSERT or UPDATE carrying both an
/// embedding of the collection's dimension (so it cannot be rejected) and a document
/// replaces them; a DELETE without an embedding never reads them. Anything else (ADD,
/// which leaves an existing record as it is; a record without embedding or document; a
/// collection whose dimension is not fixed yet), and every id of a collection with a
/// function attached that reads the embedding or the document (its deltas and its
/// preimages carry the stored state: `functions_read_values`), reads the whole record.
/// Functions that read at most the metadata need no more than a light read.
pub fn ids_to_read(
    records: &[(i64, LogRecord)],
    dimension: Option<u32>,
    functions_read_values: bool,
) -> Vec<(String, bool)> {
    let replaces = |r: &LogRecord| match r.operation {
        Operation::Upsert | Operation::Update => {
            r.document.is_some() && matches!((&r.embedding, dimension), (Some(e), Some(d)) if e.len() == d as usize)
        }
        Operation::Delete => r.embedding.is_none(),
        Operation::Add | Operation::BackfillFn => false,
    };
    let mut first: HashMap<&str, bool> = HashMap::new();
    for (_, r) in records.iter().filter(|(_, r)| r.operation.is_data()) {
        first.entry(r.id.as_str()).or_insert_with(|| functions_read_values || !replaces(r));
    }
    let mut ids: Vec<(String, bool)> = first.into_iter().map(|(id, full)| (id.to_string(), full)).collect();
    ids.sort_unstable();
    ids
}

/// Assemble the commit.
pub fn commit(
    topic: &str,
    delta: PositionDelta,
    collections: Vec<CollectionUpdate>,
    functions: Vec<FunctionBatch>,
    changes: Option<Vec<OutboxChange>>,
) -> BatchCommit {
    BatchCommit {
        topic: topic.to_string(),
        delta,
        collections,
        functions,
        changelog: changes.is_some(),
        changes: changes.unwrap_or_default(),
    }
}

/// The change feed's entries of one folded collection: one per applied record, in offset
/// order, with the record as it is after it (`docs/changes.md`).
pub fn outbox_changes(collection: &str, outcome: &BatchOutcome, out: &mut Vec<OutboxChange>) {
    for c in &outcome.changes {
        let op = match (&c.before, &c.after) {
            (None, _) => ChangeOp::Insert,
            (Some(_), Some(_)) => ChangeOp::Update,
            (Some(_), None) => ChangeOp::Delete,
        };
        out.push(OutboxChange {
            collection_id: collection.to_string(),
            record_id: c.id.clone(),
            op,
            source_offset: c.offset,
            value: c.after.as_ref().map(|r| crate::record::change::encode_change(collection, r)),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{codec::encode, MetaValue};

    fn msg(offset: i64, key: Option<&str>, payload: Vec<u8>) -> Msg {
        Msg {
            partition: 0,
            offset,
            generation: 1,
            key: key.map(|k| bytes::Bytes::copy_from_slice(k.as_bytes())),
            payload: Some(payload.into()),
            timestamp_ms: None,
        }
    }

    fn rec(c: &str, id: &str, op: Operation) -> LogRecord {
        let mut r = LogRecord::data(c, id, op);
        r.metadata = Some([("k".to_string(), MetaValue::Long(1))].into_iter().collect());
        r
    }

    #[test]
    fn with_a_registry_each_record_is_read_with_the_writer_schema_its_header_names() {
        use crate::record::avro::{WriterDecoder, WriterSchemas, LOG_RECORD_SCHEMA_JSON};
        use crate::record::framing::frame;
        use std::sync::Arc;
        let v2_json = include_str!("../../schemas/log_record.v2.avsc");
        let v2 = apache_avro::Schema::parse_str(v2_json).unwrap();
        let r = rec("c", "a", Operation::Upsert);
        let apache_avro::types::Value::Record(mut fields) = crate::record::avro::log_record_to_value(&r) else {
            unreachable!()
        };
        fields.push(("trace_id".into(), apache_avro::types::Value::Union(1, Box::new("t".to_string().into()))));
        let v2_datum = apache_avro::to_avro_datum(&v2, apache_avro::types::Value::Record(fields)).unwrap();
        let v1_datum = encode(&r);
        let schemas: WriterSchemas = [
            (1, Arc::new(WriterDecoder::from_json(LOG_RECORD_SCHEMA_JSON))),
            (2, Arc::new(WriterDecoder::from_json(v2_json))),
            (
                3,
                Arc::new(WriterDecoder::from_json(
                    r#"{"type":"record","name":"X","fields":[{"name":"n","type":"int"}]}"#,
                )),
            ),
        ]
        .into_iter()
        .collect();
        let msgs = vec![
            msg(0, Some("c"), frame(Framing::Confluent, 1, &v1_datum)),
            msg(1, Some("c"), frame(Framing::Confluent, 2, &v2_datum)),
            msg(2, Some("c"), frame(Framing::Confluent, 3, &v1_datum)),
            msg(3, Some("c"), frame(Framing::Confluent, 9, &v1_datum)),
            // v2 data labelled with the v1 id: the codec finds the extra field.
            msg(4, Some("c"), frame(Framing::Confluent, 1, &v2_datum)),
        ];
        let d = decode_all(&msgs, Framing::Confluent, &Limits::default(), Some(&schemas));
        assert_eq!(d[0].1.as_ref().unwrap(), &r);
        assert_eq!(d[1].1.as_ref().unwrap(), &r, "v2 resolves to the same record");
        let e = d[2].1.as_ref().unwrap_err();
        assert_eq!((e.kind, e.message.contains("schema id 3")), (kinds::INCOMPATIBLE_SCHEMA, true), "{e:?}");
        assert_eq!(d[3].1.as_ref().unwrap_err().kind, kinds::SCHEMA_NOT_FETCHED);
        assert_eq!(d[4].1.as_ref().unwrap_err().kind, "trailing_bytes");
        // Without a registry the id is ignored: v2 data is trailing bytes for the codec.
        let d = decode_all(&msgs[..2], Framing::Confluent, &Limits::default(), None);
        assert!(d[0].1.is_ok());
        assert_eq!(d[1].1.as_ref().unwrap_err().kind, "trailing_bytes");
    }

    #[test]
    fn a_decoded_embedding_is_a_slice_of_the_message_payload() {
        use crate::record::avro::{WriterDecoder, WriterSchemas, LOG_RECORD_SCHEMA_JSON};
        use crate::record::framing::frame;
        let mut r = rec("c", "a", Operation::Upsert);
        r.embedding = Some(vec![0.5, -1.0, 2.0].into());
        let within = |m: &Msg, d: &(i64, Result<LogRecord, DlqEntry>)| {
            let payload = m.payload.as_ref().unwrap().as_ptr_range();
            let e = d.1.as_ref().unwrap().embedding.as_ref().unwrap();
            assert_eq!(e, &vec![0.5, -1.0, 2.0]);
            payload.contains(&e.as_le_bytes().as_ptr())
        };
        let plain = [msg(0, Some("c"), encode(&r))];
        let d = decode_all(&plain, Framing::Plain, &Limits::default(), None);
        assert!(within(&plain[0], &d[0]), "the plain codec copied the embedding");
        let schemas: WriterSchemas =
            [(1, std::sync::Arc::new(WriterDecoder::from_json(LOG_RECORD_SCHEMA_JSON)))].into();
        let framed = [msg(0, Some("c"), frame(Framing::Confluent, 1, &encode(&r)))];
        let d = decode_all(&framed, Framing::Confluent, &Limits::default(), Some(&schemas));
        assert!(within(&framed[0], &d[0]), "the writer schema's codec copied the embedding");
    }

    #[test]
    fn bad_input_becomes_dlq_entries_with_kinds() {
        let good = encode(&rec("c", "a", Operation::Add));
        let msgs = vec![
            msg(0, Some("c"), good.clone()),
            msg(1, Some("c"), vec![0xff, 0xff, 0xff]),
            msg(2, Some("c"), good[..good.len() - 3].to_vec()),
            msg(3, Some("other"), good.clone()),
            msg(4, Some("c"), Vec::new()),
        ];
        let d = decode_all(&msgs, Framing::Plain, &Limits::default(), None);
        assert!(d[0].1.is_ok());
        let kinds: Vec<&str> = d[1..].iter().map(|(_, r)| r.as_ref().unwrap_err().kind).collect();
        assert_eq!(kinds[2], kinds::KEY_MISMATCH);
        assert_eq!(kinds[3], kinds::EMPTY_PAYLOAD);
        assert!(kinds[..2].iter().all(|k| !k.is_empty()));
    }

    #[test]
    fn misrouted_and_unknown_collections() {
        // Find a collection id whose home partition (of 4) is 1.
        let home1 = (0..).map(|i| format!("c{i}")).find(|c| partition_for(c.as_bytes(), 4) == 1).unwrap();
        let other = (0..).map(|i| format!("c{i}")).find(|c| partition_for(c.as_bytes(), 4) == 2).unwrap();
        let decoded = vec![
            (10, Ok(rec(&home1, "a", Operation::Add))),
            (11, Ok(rec(&other, "a", Operation::Add))),
            (12, Ok(rec(&home1, "b", Operation::Add))),
            (13, Ok(rec(&other, "b", Operation::Add))),
        ];
        let r = route(decoded.clone(), 1, 4, &HashMap::new(), UnknownCollections::Register);
        assert_eq!(r.collections.len(), 1);
        let offsets: Vec<i64> = r.collections[&home1].1.iter().map(|(o, _)| *o).collect();
        assert_eq!(offsets, vec![10, 12], "a collection's records, in offset order");
        let dlq: Vec<(i64, &str)> = r.dlq.iter().map(|d| (d.offset, d.kind)).collect();
        assert_eq!(dlq, vec![(11, kinds::MISROUTED), (13, kinds::MISROUTED)], "every record of it, not only the first");

        let rejected = route(decoded.clone(), 1, 4, &HashMap::new(), UnknownCollections::Reject);
        assert_eq!(rejected.dlq.iter().map(|d| d.kind).collect::<Vec<_>>(), vec![kinds::UNKNOWN_COLLECTION; 4]);

        // A registered collection on another partition is misrouted whatever its hash.
        let mut known = HashMap::new();
        known.insert(
            home1.clone(),
            Known::Registered(CollectionRow {
                id: home1.clone(),
                partition: 3,
                dimension: None,
                log_position: -1,
                record_count: 0,
            }),
        );
        let r = route(decoded, 1, 4, &known, UnknownCollections::Register);
        assert_eq!(r.dlq.iter().map(|d| d.offset).collect::<Vec<_>>(), vec![10, 11, 12, 13]);
    }

    #[test]
    fn fold_counts_and_positions() {
        let records = vec![
            (5, rec("c", "a", Operation::Add)),
            (7, rec("c", "a", Operation::Add)),
            (8, rec("c", "b", Operation::Delete)),
            (9, rec("c", "b", Operation::Upsert)),
        ];
        let mut counts = BatchCounts::default();
        let mut dlq = Vec::new();
        let u = fold_collection("c", None, 0, records, HashMap::new(), &mut counts, &mut dlq).unwrap().update.unwrap();
        assert_eq!((u.log_position, u.record_count_delta, u.writes.len()), (9, 2, 2));
        assert_eq!(counts.ignored.get("add_existing"), Some(&1));
        assert_eq!(counts.ignored.get("delete_missing"), Some(&1));
        assert!(dlq.is_empty());
    }

    mod light_reads {
        use super::*;
        use proptest::prelude::*;

        fn record(op: u8, id: u8, emb: u8, doc: bool, meta: u8) -> LogRecord {
            let operation = [Operation::Add, Operation::Upsert, Operation::Update, Operation::Delete][op as usize % 4];
            let mut r = LogRecord::data("c", format!("id{}", id % 5), operation);
            // 0: none, 1: dimension 2 (the collection's), 2: dimension 3 (rejected)
            r.embedding = match emb % 3 {
                0 => None,
                1 => Some(vec![f32::from(id), 1.0].into()),
                _ => Some(vec![0.5, 0.5, 0.5].into()),
            };
            r.document = doc.then(|| format!("doc{id}"));
            r.metadata = Some([(format!("k{}", meta % 3), MetaValue::Long(i64::from(meta)))].into_iter().collect());
            r
        }

        fn stored(id: u8, meta: u8, emb: bool, doc: bool) -> Record {
            Record {
                id: format!("id{}", id % 5),
                embedding: emb.then(|| [9.0, f32::from(meta)].into()),
                metadata: [("k1".to_string(), MetaValue::Long(i64::from(meta)))].into_iter().collect(),
                document: doc.then(|| "stored".to_string()),
                offset: 0,
            }
        }

        proptest! {
            /// Folding over records read "light" where `ids_to_read` allows it gives
            /// exactly what folding over whole records gives.
            #[test]
            fn light_reads_never_change_the_fold(
                log in proptest::collection::vec((0u8..4, 0u8..5, 0u8..3, any::<bool>(), 0u8..6), 1..12),
                state in proptest::collection::vec((0u8..5, 0u8..6, any::<bool>(), any::<bool>()), 0..5),
                functions_read_values in any::<bool>(),
                dimension_known in any::<bool>(),
            ) {
                let records: Vec<(i64, LogRecord)> =
                    log.into_iter().enumerate().map(|(i, (o, id, e, d, m))| (i as i64 + 1, record(o, id, e, d, m))).collect();
                let whole: HashMap<String, Record> = state.into_iter().map(|(id, m, e, d)| { let r = stored(id, m, e, d); (r.id.clone(), r) }).collect();
                let dimension = dimension_known.then_some(2u32);
                let wanted = ids_to_read(&records, dimension, functions_read_values);
                let light: HashMap<String, Record> = wanted
                    .iter()
                    .filter_map(|(id, full)| {
                        whole.get(id).map(|r| {
                            let mut r = r.clone();
                            if !full {
                                r.embedding = None;
                                r.document = None;
                            }
                            (id.clone(), r)
                        })
                    })
                    .collect();
                if functions_read_values {
                    prop_assert!(wanted.iter().all(|(_, full)| *full));
                }
                let dim = dimension.map(|d| d as usize);
                let a = fold_batch(&whole, dim, records.iter().map(|(o, r)| (*o, r))).unwrap();
                let b = fold_batch(&light, dim, records.iter().map(|(o, r)| (*o, r))).unwrap();
                prop_assert_eq!(a.final_states(), b.final_states());
                prop_assert_eq!(&a.ignored, &b.ignored);
                prop_assert_eq!(a.rejected.len(), b.rejected.len());
                prop_assert_eq!(a.dimension, b.dimension);
            }
        }
    }
}
