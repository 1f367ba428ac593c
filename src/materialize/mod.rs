//! The materializer: a pure fold of one batch of one collection's log records
//! into record changes (docs/design.md section 5).
//!
//! [`fold_batch`] takes the collection's state before the batch (a [`RecordView`]),
//! the collection's embedding dimension (if fixed yet) and the batch's log records
//! in offset order, and returns a [`BatchOutcome`]: the applied [`Change`]s, the
//! ignored and rejected records, the control records, and the dimension after the
//! batch. It does no I/O and reads no clock: the same input always yields the same
//! outcome, so a batch whose sysdb commit failed can simply be folded again.
//!
//! # Semantics
//!
//! Per record, in offset order, against the state left by the records before it
//! (the view for the first touch of an id, the batch's own earlier changes after):
//!
//! | operation   | id currently live         | id absent (never, or deleted) |
//! | ----------- | ------------------------- | ----------------------------- |
//! | ADD         | ignored (`add_existing`)  | insert                        |
//! | UPDATE      | merge                     | ignored (`update_missing`)    |
//! | UPSERT      | merge                     | insert                        |
//! | DELETE      | remove                    | ignored (`delete_missing`)    |
//! | BACKFILL_FN | control record, skipped   | control record, skipped       |
//!
//! - **Insert**: the record is built from the log record alone; metadata keys whose
//!   value is `Null` are dropped (materialized records never hold `Null`). A DELETE
//!   then ADD of one id is therefore a fresh record with no trace of the old one.
//! - **Merge**: metadata is merged key by key and a key whose new value is `Null` is
//!   removed; the document and the embedding are replaced when the log record carries
//!   them (`Some`) and kept when it does not (`None`).
//! - Every applied record (insert, merge, remove) yields one [`Change`] and sets the
//!   record's `offset` to its own offset, even a merge that changes nothing else.
//!   Ignored and rejected records change nothing, offsets included.
//! - **Dimension**: a collection's embedding dimension is fixed by its first
//!   *applied* insert or merge that carries an embedding (an ignored record, or a
//!   DELETE, whose embedding is never stored, does not fix it). Once fixed — before
//!   the batch or earlier in it — any data record carrying an embedding of another
//!   length is [`Rejected`] (DLQ reason `dimension_mismatch`), whatever its operation
//!   and whether or not it would have been ignored. A rejected record has no effect.
//! - **BACKFILL_FN** is never materialized: the processor diverts it (docs/design.md
//!   section 7). The fold only reports its offset in [`BatchOutcome::controls`]; its
//!   payload, embedding included, is not looked at.
//!
//! The materializer does not validate records beyond this (empty ids, empty
//! embeddings, NaNs are the decoder's and validator's business, in `record/`): an
//! embedding's length is taken as it is, zero included.
//!
//! # Cost
//!
//! The view is asked at most once per distinct id per batch; after that the id's
//! state lives in a local overlay keyed by the borrowed id. Per record the work is a
//! hash lookup plus the merge itself. Embeddings are cloned only into the `Change`s
//! (the `after` of an insert or merge, and the `before` of an id changed twice or
//! more in the batch; the first `before` is moved out of the view's answer).
//!
//! [`fold_final`] is the same fold for a collection without attached functions, which
//! needs only each id's state at the end of the batch: it takes the log records and
//! the stored records by value and moves their fields (an insert moves the log
//! record's, a merge updates the stored record in place), so nothing is copied. The
//! property tests hold it to [`fold_batch`]'s final states and accounting.
//!
//! The reference model in [`model`] is the independent oracle the property tests
//! (and end-to-end tests) compare this fold against.

#[cfg(any(test, feature = "testkit"))]
pub mod model;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::hash::BuildHasher;

use crate::record::{LogRecord, MetaValue, Metadata, Operation, Record};

/// Read access to a collection's records as they are before a batch.
///
/// Implemented for `HashMap<String, Record>`, `BTreeMap<String, Record>` and any
/// `Fn(&str) -> Option<Record>`, so the processor can hand over whatever it preloaded
/// from the sysdb.
pub trait RecordView {
    /// The record `id` before the batch, `None` if it was never written or is deleted.
    fn get(&self, id: &str) -> Option<Record>;
}

impl<S: BuildHasher> RecordView for HashMap<String, Record, S> {
    fn get(&self, id: &str) -> Option<Record> {
        HashMap::get(self, id).cloned()
    }
}

impl RecordView for BTreeMap<String, Record> {
    fn get(&self, id: &str) -> Option<Record> {
        BTreeMap::get(self, id).cloned()
    }
}

impl<F: Fn(&str) -> Option<Record>> RecordView for F {
    fn get(&self, id: &str) -> Option<Record> {
        self(id)
    }
}

/// One applied log record: the state of `id` just before and just after it.
///
/// `before == None` is an insert, `after == None` a removal, both `Some` a merge.
/// Attached functions consume these (docs/design.md section 7).
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The record's id.
    pub id: String,
    /// State just before this log record (`None`: absent).
    pub before: Option<Record>,
    /// State just after this log record (`None`: deleted). Its `offset` is `offset`.
    pub after: Option<Record>,
    /// Offset of the log record that made the change.
    pub offset: i64,
}

/// Why a data record was ignored (table in the module doc). Counted, not an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IgnoreReason {
    /// ADD of an id that is live.
    AddExisting,
    /// UPDATE of an id that is absent.
    UpdateMissing,
    /// DELETE of an id that is absent.
    DeleteMissing,
}

impl IgnoreReason {
    /// Every reason, for pre-registering metric label values.
    pub const ALL: [IgnoreReason; 3] =
        [IgnoreReason::AddExisting, IgnoreReason::UpdateMissing, IgnoreReason::DeleteMissing];

    /// The metric label value (`sluice_..._ignored_total{reason=...}`).
    pub fn label(self) -> &'static str {
        match self {
            IgnoreReason::AddExisting => "add_existing",
            IgnoreReason::UpdateMissing => "update_missing",
            IgnoreReason::DeleteMissing => "delete_missing",
        }
    }
}

/// A data record whose embedding length differs from the collection's dimension.
/// It had no effect; the processor sends it to the DLQ.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Offset of the rejected log record.
    pub offset: i64,
    /// Its record id.
    pub id: String,
    /// The collection's dimension at that point.
    pub expected: usize,
    /// The length of the record's embedding.
    pub actual: usize,
}

impl Rejected {
    /// DLQ error kind and metric label value for a rejected record.
    pub const REASON: &'static str = "dimension_mismatch";
}

/// What folding one batch produced. Every record of the batch appears in exactly one
/// of `changes`, `ignored`, `rejected`, `controls`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchOutcome {
    /// One per applied record, in offset order; an id may appear several times.
    pub changes: Vec<Change>,
    /// Ignored data records: `(offset, reason)`, in offset order.
    pub ignored: Vec<(i64, IgnoreReason)>,
    /// Records rejected for a dimension mismatch, in offset order.
    pub rejected: Vec<Rejected>,
    /// Offsets of the BACKFILL_FN control records, in offset order.
    pub controls: Vec<i64>,
    /// The collection's embedding dimension after the batch.
    pub dimension: Option<usize>,
}

impl BatchOutcome {
    /// Per id changed in the batch, its state at the end of the batch (`None`:
    /// deleted), in id order — what the store writes. Ids only ignored or rejected
    /// are absent. Derived from `changes` (the last change of each id).
    pub fn final_states(&self) -> BTreeMap<&str, Option<&Record>> {
        self.changes.iter().map(|c| (c.id.as_str(), c.after.as_ref())).collect()
    }
}

/// A batch that breaks [`fold_batch`]'s preconditions. Both are bugs in the caller
/// (internal, not retryable): the whole batch is refused and nothing is produced.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FoldError {
    /// Offsets must be strictly increasing within a batch.
    #[error("log records out of order: offset {offset} after offset {previous}")]
    OffsetNotIncreasing {
        /// The offset of the record before.
        previous: i64,
        /// The offending offset.
        offset: i64,
    },
    /// A batch must hold records of one collection only.
    #[error("batch of collection {expected:?} holds a record of {found:?} at offset {offset}")]
    MixedCollections {
        /// The collection of the batch's first record.
        expected: String,
        /// The collection of the offending record.
        found: String,
        /// The offending record's offset.
        offset: i64,
    },
}

/// Folds one batch of one collection's log records (module doc for the semantics).
///
/// - `view`: the collection's records before the batch.
/// - `dimension`: the collection's embedding dimension before the batch, if fixed.
/// - `records`: `(offset, log record)` pairs of a single collection, offsets strictly
///   increasing (gaps allowed: other collections share the partition).
///
/// # Errors
///
/// A record out of offset order (or repeated) or of another collection refuses the
/// whole batch with a [`FoldError`]; nothing partial is returned. The check is two
/// comparisons per record, cheap next to the fold, and a silent misorder would
/// corrupt the authoritative store.
pub fn fold_batch<'a, V>(
    view: &V,
    dimension: Option<usize>,
    records: impl IntoIterator<Item = (i64, &'a LogRecord)>,
) -> Result<BatchOutcome, FoldError>
where
    V: RecordView + ?Sized,
{
    let mut out = BatchOutcome { dimension, ..BatchOutcome::default() };
    let mut overlay: HashMap<&'a str, Slot> = HashMap::new();
    let mut order = Order::default();

    for (offset, rec) in records {
        order.check(rec, offset)?;
        let Some(op) = DataOp::of(rec.operation) else {
            out.controls.push(offset);
            continue;
        };
        if let Some(rejected) = rejection(out.dimension, offset, rec) {
            out.rejected.push(rejected);
            continue;
        }

        let slot = overlay.entry(rec.id.as_str()).or_insert_with(|| Slot::Base(view.get(&rec.id)));
        let current = match slot {
            Slot::Base(base) => base.as_ref(),
            Slot::Changed(i) => out.changes[*i].after.as_ref(),
        };
        let step = match Step::of(op, current.is_some()) {
            Ok(step) => step,
            Err(reason) => {
                out.ignored.push((offset, reason));
                continue;
            }
        };
        step.fix_dimension(&mut out.dimension, rec);
        let after = match (step, current) {
            (Step::Insert, _) => Some(insert(offset, rec)),
            (Step::Merge, Some(live)) => Some(merge(live, offset, rec)),
            (Step::Merge, None) => unreachable!("Step::of merges only a live id"),
            (Step::Remove, _) => None,
        };

        let before = match slot {
            Slot::Base(base) => base.take(),
            Slot::Changed(i) => out.changes[*i].after.clone(),
        };
        *slot = Slot::Changed(out.changes.len());
        out.changes.push(Change { id: rec.id.clone(), before, after, offset });
    }
    Ok(out)
}

/// The state of one id inside a batch.
enum Slot {
    /// As the view gave it; not changed yet in this batch (`None`: absent).
    Base(Option<Record>),
    /// Changed in this batch; the current state is `changes[i].after`.
    Changed(usize),
}

/// What [`fold_final`] produced: the state each changed id ends the batch in, with the
/// same accounting as [`BatchOutcome`] but without the per-record changes. Every record
/// of the batch is in exactly one of: some id's state, `ignored`, `rejected`, `controls`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct FinalOutcome {
    /// Per id changed in the batch, in id order.
    pub states: Vec<FinalState>,
    /// Ignored data records: `(offset, reason)`, in offset order.
    pub ignored: Vec<(i64, IgnoreReason)>,
    /// Records rejected for a dimension mismatch, in offset order.
    pub rejected: Vec<Rejected>,
    /// Offsets of the BACKFILL_FN control records, in offset order.
    pub controls: Vec<i64>,
    /// The collection's embedding dimension after the batch.
    pub dimension: Option<usize>,
}

/// One id changed by a batch, as [`fold_final`] leaves it.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalState {
    /// The record's id.
    pub id: String,
    /// Whether the id was live before the batch (the view had it).
    pub was_live: bool,
    /// Its state at the end of the batch (`None`: deleted).
    pub after: Option<Record>,
}

/// [`fold_batch`] for a caller that needs only where each id ends, not the changes on
/// the way (a collection without attached functions): the same semantics and errors,
/// and the same final states as [`BatchOutcome::final_states`], without copying.
///
/// - `take`: hands over the record `id` as it is before the batch (`None`: absent). It
///   is called at most once per id, so a caller can move records out of what it
///   preloaded.
/// - `records`: as for [`fold_batch`], but owned: an insert moves the log record's
///   fields into the new record, a merge moves them into the live one in place.
///
/// # Errors
///
/// As [`fold_batch`]: a record out of offset order or of another collection refuses
/// the whole batch.
pub fn fold_final(
    mut take: impl FnMut(&str) -> Option<Record>,
    dimension: Option<usize>,
    records: impl IntoIterator<Item = (i64, LogRecord)>,
) -> Result<FinalOutcome, FoldError> {
    let mut out = FinalOutcome { dimension, ..FinalOutcome::default() };
    let mut slots: HashMap<String, FinalSlot> = HashMap::new();
    let mut order = Order::default();

    for (offset, rec) in records {
        order.check(&rec, offset)?;
        let Some(op) = DataOp::of(rec.operation) else {
            out.controls.push(offset);
            continue;
        };
        if let Some(rejected) = rejection(out.dimension, offset, &rec) {
            out.rejected.push(rejected);
            continue;
        }

        let slot = match slots.get_mut(rec.id.as_str()) {
            Some(slot) => slot,
            None => {
                let base = take(&rec.id);
                slots.entry(rec.id.clone()).or_insert(FinalSlot {
                    was_live: base.is_some(),
                    state: base,
                    changed: false,
                })
            }
        };
        let step = match Step::of(op, slot.state.is_some()) {
            Ok(step) => step,
            Err(reason) => {
                out.ignored.push((offset, reason));
                continue;
            }
        };
        step.fix_dimension(&mut out.dimension, &rec);
        slot.changed = true;
        match (step, slot.state.as_mut()) {
            (Step::Insert, _) => slot.state = Some(insert_owned(offset, rec)),
            (Step::Merge, Some(live)) => merge_into(live, offset, rec),
            (Step::Merge, None) => unreachable!("Step::of merges only a live id"),
            (Step::Remove, _) => slot.state = None,
        }
    }

    out.states = slots
        .into_iter()
        .filter(|(_, slot)| slot.changed)
        .map(|(id, slot)| FinalState { id, was_live: slot.was_live, after: slot.state })
        .collect();
    out.states.sort_unstable_by(|a, b| a.id.cmp(&b.id));
    Ok(out)
}

/// The state of one id inside [`fold_final`].
struct FinalSlot {
    /// Whether the view had the id.
    was_live: bool,
    /// Its current state (`None`: absent).
    state: Option<Record>,
    /// Whether a record of the batch was applied to it.
    changed: bool,
}

/// The batch's ordering rules: one collection, offsets strictly increasing.
#[derive(Default)]
struct Order {
    /// The collection of the first record and the offset of the last one.
    last: Option<(String, i64)>,
}

impl Order {
    fn check(&mut self, rec: &LogRecord, offset: i64) -> Result<(), FoldError> {
        match &mut self.last {
            None => self.last = Some((rec.collection_id.clone(), offset)),
            Some((collection, previous)) => {
                if rec.collection_id != *collection {
                    return Err(FoldError::MixedCollections {
                        expected: collection.clone(),
                        found: rec.collection_id.clone(),
                        offset,
                    });
                }
                if offset <= *previous {
                    return Err(FoldError::OffsetNotIncreasing { previous: *previous, offset });
                }
                *previous = offset;
            }
        }
        Ok(())
    }
}

/// A data record carrying an embedding of another length than the collection's fixed
/// dimension: rejected whatever its operation (module doc).
fn rejection(dimension: Option<usize>, offset: i64, rec: &LogRecord) -> Option<Rejected> {
    match (dimension, rec.embedding.as_ref()) {
        (Some(expected), Some(embedding)) if embedding.len() != expected => {
            Some(Rejected { offset, id: rec.id.clone(), expected, actual: embedding.len() })
        }
        _ => None,
    }
}

/// What an applied data record does to its id (the module doc's table).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Insert,
    Merge,
    Remove,
}

impl Step {
    /// The table: the step for `op` on an id that is `live` or absent, or why the
    /// record is ignored.
    fn of(op: DataOp, live: bool) -> Result<Step, IgnoreReason> {
        match (op, live) {
            (DataOp::Add, true) => Err(IgnoreReason::AddExisting),
            (DataOp::Update, false) => Err(IgnoreReason::UpdateMissing),
            (DataOp::Delete, false) => Err(IgnoreReason::DeleteMissing),
            (DataOp::Add | DataOp::Upsert, false) => Ok(Step::Insert),
            (DataOp::Update | DataOp::Upsert, true) => Ok(Step::Merge),
            (DataOp::Delete, true) => Ok(Step::Remove),
        }
    }

    /// An applied insert or merge stores the embedding it carries and so fixes a
    /// dimension not fixed yet; a DELETE's embedding is never stored and fixes nothing.
    fn fix_dimension(self, dimension: &mut Option<usize>, rec: &LogRecord) {
        if let (None, Some(embedding), false) = (*dimension, &rec.embedding, self == Step::Remove) {
            *dimension = Some(embedding.len());
        }
    }
}

/// The data operations, so the fold's table match is exhaustive without a
/// BACKFILL_FN arm.
#[derive(Clone, Copy)]
enum DataOp {
    Add,
    Update,
    Upsert,
    Delete,
}

impl DataOp {
    fn of(op: Operation) -> Option<DataOp> {
        match op {
            Operation::Add => Some(DataOp::Add),
            Operation::Update => Some(DataOp::Update),
            Operation::Upsert => Some(DataOp::Upsert),
            Operation::Delete => Some(DataOp::Delete),
            Operation::BackfillFn => None,
        }
    }
}

/// A fresh record from `rec` alone; `Null` metadata values are dropped.
fn insert(offset: i64, rec: &LogRecord) -> Record {
    let mut metadata = Metadata::new();
    apply_metadata(&mut metadata, rec.metadata.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    Record { id: rec.id.clone(), embedding: rec.embedding.clone(), metadata, document: rec.document.clone(), offset }
}

/// [`insert`], moving `rec`'s fields instead of cloning them.
fn insert_owned(offset: i64, rec: LogRecord) -> Record {
    // Onto nothing, the updates are the map itself less its removals (`Null`).
    let mut metadata = rec.metadata.unwrap_or_default();
    metadata.retain(|_, v| !matches!(v, MetaValue::Null));
    Record { id: rec.id, embedding: rec.embedding, metadata, document: rec.document, offset }
}

/// `live` merged with `rec`: metadata key by key (`Null` removes the key), document
/// and embedding replaced when `rec` carries them. Clones each field once.
fn merge(live: &Record, offset: i64, rec: &LogRecord) -> Record {
    let mut metadata = live.metadata.clone();
    apply_metadata(&mut metadata, rec.metadata.iter().flatten().map(|(k, v)| (k.clone(), v.clone())));
    Record {
        id: live.id.clone(),
        embedding: rec.embedding.as_ref().or(live.embedding.as_ref()).cloned(),
        metadata,
        document: rec.document.as_ref().or(live.document.as_ref()).cloned(),
        offset,
    }
}

/// [`merge`] in place, moving `rec`'s fields into `live`.
fn merge_into(live: &mut Record, offset: i64, rec: LogRecord) {
    apply_metadata(&mut live.metadata, rec.metadata.into_iter().flatten());
    if let Some(embedding) = rec.embedding {
        live.embedding = Some(embedding);
    }
    if let Some(document) = rec.document {
        live.document = Some(document);
    }
    live.offset = offset;
}

/// Metadata updates applied key by key: a `Null` value removes its key, any other
/// value sets it.
fn apply_metadata(metadata: &mut Metadata, updates: impl IntoIterator<Item = (String, MetaValue)>) {
    for (key, value) in updates {
        match value {
            MetaValue::Null => {
                metadata.remove(&key);
            }
            value => {
                metadata.insert(key, value);
            }
        }
    }
}
