//! Attached functions inside the sysdb, the part both backends share (docs/design.md section
//! 7): what a [`FunctionBatch`] does given the function's stored status ([`decide`]), and
//! a function's output deltas folded into one write per output record ([`OutputPlan`]),
//! which each backend then applies in SQL.
//!
//! **Folding.** A plan holds, per output id, the net effect of a sequence of deltas, equal
//! to applying them one by one with [`crate::functions::apply::apply_deltas`] (the
//! property test below checks it against that reference):
//! * `Count`s add up (increments commute); the record takes the fields, count field and
//!   `remove_at_zero` of the last delta and `last_offset` = the greatest change offset.
//!   Only the final count matters: a record that hit 0 and came back ends as the sum.
//! * Versioned `Put`/`Remove` (while a backfill runs) form a last-writer-wins register
//!   on the version: the write with the highest version (the first of equal ones) is the
//!   only one that can apply, and it applies iff it is newer than the stored record and
//!   the id's tombstone.
//! * Unversioned (`ready`, one writer in offset order): the last write wins, blindly.
//!
//! One write per id also lets PostgreSQL apply a whole plan with a few `UNNEST`
//! statements (`ON CONFLICT DO UPDATE` may not touch a row twice in one statement).
//! A function emits either counts or map writes; an id that received both in one plan
//! would see the map write applied after the count.

use std::collections::HashMap;

use super::error::SysdbError;
use super::stored_fields::decode_params;
use super::types::{ChunkLimit, CommitReport, FunctionBatch, FunctionChange, FunctionRow};
use crate::functions::{ChangeRef, Function, FunctionFailure, FunctionStatus, OutputDelta, Reads};
use crate::record::{MetaValue, Metadata, Record};

/// The stored state of a function that decides what a batch does, read inside the batch
/// transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FunctionState {
    /// [`FunctionStatus::Failed`] when a failed reason is stored (the status column keeps
    /// where the protocol was).
    pub status: FunctionStatus,
    pub request_id: String,
    pub marker_offset: Option<i64>,
    pub output_collection: String,
}

/// Columns of a `functions` row, in [`RawFunction`] order.
pub(crate) const FUNCTION_COLUMNS: &str =
    "id, collection_id, function, output_collection, params, status, request_id, \
     marker_offset, backfill_cursor, backfill_done, backfill_total, created_at_ms, updated_at_ms, failed_reason";

/// A `functions` row as read, before decoding.
pub(crate) struct RawFunction {
    pub id: String,
    pub collection_id: String,
    pub function: String,
    pub output_collection: String,
    pub params: String,
    pub status: String,
    pub request_id: String,
    pub marker_offset: Option<i64>,
    pub backfill_cursor: Option<String>,
    pub backfill_done: i64,
    pub backfill_total: Option<i64>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
    pub failed_reason: Option<String>,
}

/// The status a function has: the stored status, unless it is live and a failed reason
/// is stored (step 14 of the migrations keeps the reason beside the status column).
pub(crate) fn effective_status(status: FunctionStatus, failed_reason: Option<&str>) -> FunctionStatus {
    match (status, failed_reason) {
        (FunctionStatus::Detached, _) | (_, None) => status,
        (_, Some(_)) => FunctionStatus::Failed,
    }
}

impl RawFunction {
    pub(super) fn decode(self, backend: &'static str) -> Result<FunctionRow, SysdbError> {
        let bad =
            |message: String| SysdbError::Database { backend, message: format!("function {:?}: {message}", self.id) };
        let status =
            FunctionStatus::parse(&self.status).ok_or_else(|| bad(format!("unknown status {:?}", self.status)))?;
        let params = decode_params(&self.params).map_err(bad)?;
        let status = effective_status(status, self.failed_reason.as_deref());
        Ok(FunctionRow {
            id: self.id,
            collection_id: self.collection_id,
            function: self.function,
            output_collection: self.output_collection,
            params,
            status,
            request_id: self.request_id,
            marker_offset: self.marker_offset,
            backfill_cursor: self.backfill_cursor,
            backfill_done: self.backfill_done,
            backfill_total: self.backfill_total,
            created_at_ms: self.created_at_ms,
            updated_at_ms: self.updated_at_ms,
            failed_reason: self.failed_reason,
        })
    }
}

/// The net counter increment of one output record.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct CountWrite {
    pub output_id: String,
    pub delta: i64,
    pub fields: Metadata,
    pub count_field: std::borrow::Cow<'static, str>,
    pub remove_at_zero: bool,
    /// Greatest change offset among the folded deltas: the output record's `last_offset`
    /// (kept as the max with the stored one).
    pub offset: i64,
}

impl CountWrite {
    /// The output record's metadata for counter value `count`.
    pub(super) fn metadata(&self, count: i64) -> Metadata {
        let mut m = self.fields.clone();
        m.insert(self.count_field.to_string(), MetaValue::Long(count));
        m
    }

    /// Whether the record goes away at `count`.
    pub(super) fn removes_at(&self, count: i64) -> bool {
        count == 0 && self.remove_at_zero
    }
}

/// The one write of a map output id.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum MapWrite {
    Put(Record),
    Remove { id: String, offset: i64 },
}

impl MapWrite {
    pub(super) fn id(&self) -> &str {
        match self {
            MapWrite::Put(r) => &r.id,
            MapWrite::Remove { id, .. } => id,
        }
    }

    pub(super) fn version(&self) -> i64 {
        match self {
            MapWrite::Put(r) => r.offset,
            MapWrite::Remove { offset, .. } => *offset,
        }
    }
}

/// A function's output deltas folded to one write per output id (module doc).
#[derive(Debug, Clone, Default)]
pub(crate) struct OutputPlan {
    /// Apply map writes only if newer than what the output holds, leave tombstones.
    pub versioned: bool,
    /// In order of first appearance.
    pub counts: Vec<CountWrite>,
    /// In order of first appearance.
    pub maps: Vec<MapWrite>,
    count_index: HashMap<String, usize>,
    map_index: HashMap<String, usize>,
}

impl OutputPlan {
    pub(super) fn new(versioned: bool) -> OutputPlan {
        OutputPlan { versioned, ..OutputPlan::default() }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.counts.is_empty() && self.maps.is_empty()
    }

    /// Fold `delta`, emitted for a change at `offset`.
    pub(super) fn add(&mut self, offset: i64, delta: &OutputDelta) {
        match delta {
            OutputDelta::Count { output_id, fields, count_field, delta, remove_at_zero } => {
                match self.count_index.get(output_id) {
                    Some(&i) => {
                        let c = &mut self.counts[i];
                        c.delta += delta;
                        c.fields.clone_from(fields);
                        c.count_field.clone_from(count_field);
                        c.remove_at_zero = *remove_at_zero;
                        c.offset = c.offset.max(offset);
                    }
                    None => {
                        self.count_index.insert(output_id.clone(), self.counts.len());
                        self.counts.push(CountWrite {
                            output_id: output_id.clone(),
                            delta: *delta,
                            fields: fields.clone(),
                            count_field: count_field.clone(),
                            remove_at_zero: *remove_at_zero,
                            offset,
                        });
                    }
                }
            }
            OutputDelta::Put { record } => self.add_map(MapWrite::Put(record.clone())),
            OutputDelta::Remove { id, offset } => self.add_map(MapWrite::Remove { id: id.clone(), offset: *offset }),
        }
    }

    fn add_map(&mut self, write: MapWrite) {
        match self.map_index.get(write.id()) {
            Some(&i) => {
                if !self.versioned || write.version() > self.maps[i].version() {
                    self.maps[i] = write;
                }
            }
            None => {
                self.map_index.insert(write.id().to_string(), self.maps.len());
                self.maps.push(write);
            }
        }
    }
}

/// What one [`FunctionBatch`] does, decided from the function's stored state.
#[derive(Debug, Clone)]
pub(crate) struct Decision<'a> {
    pub function_id: &'a str,
    pub output_collection: String,
    /// A marker that moves the function from `awaiting_marker` to `backfilling` here.
    pub accepted_marker: Option<i64>,
    pub ignored_markers: usize,
    /// `(record id, record as of the marker)` to save unless a preimage exists.
    pub preimages: Vec<(&'a str, &'a Record)>,
    pub plan: OutputPlan,
    /// The function failed in this batch: mark it failed with this reason (and apply
    /// nothing of it). Only for a live function (not detached, not failed already).
    pub fail: Option<&'a str>,
}

/// Apply the rules of [`FunctionBatch`] to the function's stored `state` (`None`: gone).
pub(crate) fn decide<'a>(state: Option<&FunctionState>, fb: &'a FunctionBatch) -> Decision<'a> {
    let mut d = Decision {
        function_id: &fb.function_id,
        output_collection: state.map(|s| s.output_collection.clone()).unwrap_or_default(),
        accepted_marker: None,
        ignored_markers: fb.markers.len(),
        preimages: Vec::new(),
        plan: OutputPlan::new(false),
        fail: None,
    };
    let Some(state) = state else { return d };
    if let Some(reason) = fb.failure.as_deref() {
        // A failed function applies nothing of the batch; its markers are ignored.
        if !matches!(state.status, FunctionStatus::Detached | FunctionStatus::Failed) {
            d.fail = Some(reason);
        }
        return d;
    }
    // `Some(None)`: every change, unversioned; `Some(Some(o))`: changes after `o`,
    // versioned, with preimages.
    let applies: Option<Option<i64>> = match state.status {
        FunctionStatus::Detached | FunctionStatus::Failed => None,
        FunctionStatus::Ready => Some(None),
        FunctionStatus::Backfilling => match state.marker_offset {
            Some(o) => Some(Some(o)),
            None => {
                tracing::error!(function = %fb.function_id, "backfilling function without a marker offset: nothing applied");
                None
            }
        },
        FunctionStatus::AwaitingMarker => {
            let accepted = fb.markers.iter().filter(|(_, request)| *request == state.request_id).map(|(o, _)| *o).min();
            if let Some(o) = accepted {
                d.accepted_marker = Some(o);
                d.ignored_markers -= 1;
            }
            accepted.map(Some)
        }
    };
    let Some(after) = applies else { return d };
    d.plan = OutputPlan::new(after.is_some());
    let mut preimaged = std::collections::HashSet::new();
    for FunctionChange { offset, id, before, deltas } in &fb.changes {
        if after.is_some_and(|o| *offset <= o) {
            continue;
        }
        if let (Some(o), Some(b)) = (after, before) {
            if b.offset < o && preimaged.insert(id.as_str()) {
                d.preimages.push((id.as_str(), b));
            }
        }
        for delta in deltas {
            d.plan.add(*offset, delta);
        }
    }
    d
}

/// Decide every function batch of a commit in order, from the states read in the
/// transaction (`None`: no such function); a marker accepted by one batch is seen by a
/// later batch of the same function.
pub(crate) fn decide_all<'a>(
    states: &mut HashMap<String, Option<FunctionState>>,
    batches: &'a [FunctionBatch],
) -> Vec<Decision<'a>> {
    let mut out = Vec::with_capacity(batches.len());
    for fb in batches {
        let mut state = states.get_mut(&fb.function_id).and_then(Option::as_mut);
        let d = decide(state.as_deref(), fb);
        if let (Some(state), Some(o)) = (state.as_deref_mut(), d.accepted_marker) {
            state.status = FunctionStatus::Backfilling;
            state.marker_offset = Some(o);
        }
        if let (Some(state), Some(_)) = (state, d.fail) {
            state.status = FunctionStatus::Failed;
        }
        out.push(d);
    }
    out
}

/// What the commit reports about markers.
pub(crate) fn report(decisions: &[Decision<'_>]) -> CommitReport {
    CommitReport {
        markers_accepted: decisions
            .iter()
            .filter_map(|d| d.accepted_marker.map(|o| (d.function_id.to_string(), o)))
            .collect(),
        markers_ignored: decisions.iter().map(|d| d.ignored_markers).sum(),
        appended: None,
    }
}

/// The stored-field columns of a backfill chunk's select: `embedding, metadata,
/// document`, each one the function does not read replaced by the backend's NULL of that
/// column's type (`nulls`, in the same order). `aliases` names the table each column is
/// read from, in the same order (SQLite keeps embedding and document apart from the row).
pub(crate) fn chunk_columns(reads: Reads, aliases: [&str; 3], nulls: [&str; 3]) -> String {
    let col = |read: bool, alias: &str, name: &str, null: &str| {
        if read {
            format!("{alias}.{name}")
        } else {
            null.to_string()
        }
    };
    format!(
        "{}, {}, {}",
        col(reads.embedding, aliases[0], "embedding", nulls[0]),
        col(reads.metadata, aliases[1], "metadata", nulls[1]),
        col(reads.document, aliases[2], "document", nulls[2])
    )
}

/// The plan of one backfill chunk: each as-of-marker record as an insert at its own
/// offset, versioned. `Err`: the function failed on one of them (the chunk then applies
/// nothing and the function is marked failed with the reason).
pub(crate) fn backfill_plan(records: &[Record], f: &dyn Function) -> Result<OutputPlan, FunctionFailure> {
    let mut plan = OutputPlan::new(true);
    let mut out = Vec::new();
    for r in records {
        out.clear();
        f.try_deltas(&ChangeRef { id: &r.id, before: None, after: Some(r), offset: r.offset }, &mut out)?;
        for d in &out {
            plan.add(r.offset, d);
        }
    }
    Ok(plan)
}

/// The bytes a backfill chunk counts for a record toward [`ChunkLimit`]:
/// the fields read (those the function does not read are absent), at about their stored
/// size.
pub(crate) fn chunk_bytes(r: &Record) -> usize {
    let metadata: usize = r
        .metadata
        .iter()
        .map(|(k, v)| {
            k.len()
                + match v {
                    crate::record::MetaValue::String(s) => s.len(),
                    _ => 8,
                }
        })
        .sum();
    r.id.len() + metadata + r.document.as_ref().map_or(0, String::len) + r.embedding.as_ref().map_or(0, |e| 4 * e.len())
}

/// Read a chunk's rows until `limit`: `Ok((records, cut))`, `cut` when the byte bound
/// stopped the read before the rows ran out (the chunk is then not the last).
pub(crate) fn read_chunk<E>(
    rows: impl Iterator<Item = std::result::Result<Record, E>>,
    limit: ChunkLimit,
) -> std::result::Result<(Vec<Record>, bool), E> {
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for row in rows {
        if out.len() >= limit.records {
            break;
        }
        if bytes >= limit.bytes {
            return Ok((out, true));
        }
        let r = row?;
        bytes = bytes.saturating_add(chunk_bytes(&r));
        out.push(r);
    }
    Ok((out, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::apply::{apply_deltas, OutputStore};
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The plan applied to an in-memory store the way the SQL does it.
    fn apply_plan(store: &mut OutputStore, counters: &mut BTreeMap<String, i64>, plan: &OutputPlan) {
        for c in &plan.counts {
            let count = counters.get(&c.output_id).copied().unwrap_or(0) + c.delta;
            if c.removes_at(count) {
                counters.remove(&c.output_id);
                store.records.remove(&c.output_id);
            } else {
                counters.insert(c.output_id.clone(), count);
                let r = Record {
                    id: c.output_id.clone(),
                    embedding: None,
                    metadata: c.metadata(count),
                    document: None,
                    offset: -1,
                };
                store.records.insert(c.output_id.clone(), r);
            }
        }
        for w in &plan.maps {
            let newest = store.records.get(w.id()).map(|r| r.offset).max(store.tombstones.get(w.id()).copied());
            if plan.versioned && newest.is_some_and(|v| w.version() <= v) {
                continue;
            }
            match w {
                MapWrite::Put(r) => {
                    if plan.versioned {
                        store.tombstones.remove(&r.id);
                    }
                    store.records.insert(r.id.clone(), r.clone());
                }
                MapWrite::Remove { id, offset } => {
                    store.records.remove(id);
                    if plan.versioned {
                        store.tombstones.insert(id.clone(), *offset);
                    }
                }
            }
        }
    }

    fn delta_strategy() -> impl Strategy<Value = OutputDelta> {
        let ids = prop::sample::select(vec!["a", "b", "c"]);
        prop_oneof![
            (ids.clone(), -2i64..3, any::<bool>(), 0u8..2).prop_map(|(id, delta, rz, f)| OutputDelta::Count {
                output_id: format!("n{id}"),
                fields: Metadata::from_iter([("f".to_string(), MetaValue::Long(i64::from(f)))]),
                count_field: "count".into(),
                delta,
                remove_at_zero: rz,
            }),
            (ids.clone(), 0i64..8, 0u8..3).prop_map(|(id, offset, doc)| OutputDelta::Put {
                record: Record {
                    id: id.into(),
                    embedding: None,
                    metadata: Metadata::new(),
                    document: Some(format!("{doc}")),
                    offset
                },
            }),
            (ids, 0i64..8).prop_map(|(id, offset)| OutputDelta::Remove { id: id.into(), offset }),
        ]
    }

    proptest! {
        #[test]
        fn a_folded_plan_ends_where_the_deltas_one_by_one_end(
            setup in prop::collection::vec(delta_strategy(), 0..6),
            deltas in prop::collection::vec(delta_strategy(), 0..12),
            versioned in any::<bool>(),
        ) {
            // Map-only and count-only ids are disjoint (names differ), as with real functions.
            let mut want = OutputStore::default();
            apply_deltas(&mut want, &setup, true);
            let mut counters: BTreeMap<String, i64> = want
                .records
                .iter()
                .filter_map(|(id, r)| match r.metadata.get("count") { Some(MetaValue::Long(n)) => Some((id.clone(), *n)), _ => None })
                .collect();
            let mut got = want.clone();
            apply_deltas(&mut want, &deltas, versioned);
            let mut plan = OutputPlan::new(versioned);
            for d in &deltas {
                plan.add(7, d);
            }
            apply_plan(&mut got, &mut counters, &plan);
            prop_assert_eq!(got.contents(), want.contents());
            if versioned {
                prop_assert_eq!(got.tombstones, want.tombstones);
            }
        }
    }

    fn rec(id: &str, offset: i64) -> Record {
        Record { id: id.into(), embedding: None, metadata: Metadata::new(), document: None, offset }
    }

    fn state(status: FunctionStatus, marker: Option<i64>) -> FunctionState {
        FunctionState { status, request_id: "req".into(), marker_offset: marker, output_collection: "out".into() }
    }

    fn change(offset: i64, id: &str, before: Option<i64>) -> FunctionChange {
        FunctionChange {
            offset,
            id: id.into(),
            before: before.map(|o| rec(id, o)),
            deltas: vec![OutputDelta::Put { record: rec(id, offset) }],
        }
    }

    #[test]
    fn decisions_follow_the_status() {
        let fb = FunctionBatch {
            function_id: "f".into(),
            markers: vec![(5, "other".into()), (6, "req".into()), (8, "req".into())],
            failure: None,
            changes: vec![
                change(4, "a", Some(1)),
                change(7, "a", Some(4)),
                change(9, "a", Some(7)),
                change(10, "b", None),
            ],
        };
        let d = decide(Some(&state(FunctionStatus::AwaitingMarker, None)), &fb);
        assert_eq!((d.accepted_marker, d.ignored_markers), (Some(6), 2));
        assert_eq!(d.preimages.iter().map(|(id, r)| (*id, r.offset)).collect::<Vec<_>>(), [("a", 4)]);
        assert_eq!(d.plan.maps.iter().map(|w| (w.id(), w.version())).collect::<Vec<_>>(), [("a", 9), ("b", 10)]);
        assert!(d.plan.versioned);

        let d = decide(Some(&state(FunctionStatus::Backfilling, Some(8))), &fb);
        assert_eq!((d.accepted_marker, d.ignored_markers), (None, 3));
        // Only changes after 8 count; the one at 9 changes a record last written at 7.
        assert_eq!(d.preimages.iter().map(|(id, r)| (*id, r.offset)).collect::<Vec<_>>(), [("a", 7)]);
        assert_eq!(d.plan.maps.iter().map(|w| (w.id(), w.version())).collect::<Vec<_>>(), [("a", 9), ("b", 10)]);
        let d = decide(Some(&state(FunctionStatus::Ready, Some(8))), &fb);
        assert!(!d.plan.versioned && d.preimages.is_empty() && d.ignored_markers == 3);
        assert_eq!(d.plan.maps.len(), 2);
        for gone in [None, Some(&state(FunctionStatus::Detached, Some(1)))] {
            let d = decide(gone, &fb);
            assert!(
                d.plan.is_empty() && d.preimages.is_empty() && d.accepted_marker.is_none() && d.ignored_markers == 3
            );
        }
        let unmarked = FunctionBatch { markers: vec![], ..fb.clone() };
        let d = decide(Some(&state(FunctionStatus::AwaitingMarker, None)), &unmarked);
        assert!(d.plan.is_empty() && d.accepted_marker.is_none());
    }
}
