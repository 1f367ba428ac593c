//! The processor's side of attached functions: which functions a batch touches, their
//! deltas for the batch's changes, and the backfill tasks its markers ask for.
//!
//! The cache of attached functions only decides what work to *prepare*; what applies is
//! decided by the sysdb inside the batch transaction from the stored status (docs/design.md
//! section 7.5).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backfill::components::{build_function, BuildError};
use crate::functions::{ChangeRef, Function, FunctionStatus};
use crate::materialize::BatchOutcome;
use crate::record::{BackfillRef, BackfillTask, LogRecord, Operation};
use crate::sysdb::{FunctionBatch, FunctionChange, FunctionRow, Sysdb, SysdbError};

/// How long a collection's list of functions is trusted before it is re-read.
const TTL: Duration = Duration::from_secs(5);

/// An attached function and its implementation.
#[derive(Clone)]
pub struct Attached {
    pub row: FunctionRow,
    pub f: Arc<dyn Function>,
    /// Set once this worker reported the function's failure (an instance fails once).
    reported: Arc<AtomicBool>,
}

impl Attached {
    /// `row` run by `f`.
    pub fn new(row: FunctionRow, f: Arc<dyn Function>) -> Attached {
        Attached { row, f, reported: Arc::default() }
    }

    /// Whether `row` runs the same code with the same parameters as this one, so that
    /// its instance can be kept (a WebAssembly instance is expensive to create).
    fn runs_as(&self, row: &FunctionRow) -> bool {
        self.row.id == row.id && self.row.function == row.function && self.row.params == row.params
    }
}

/// A failure first seen by this worker (`function_batches` reports each once).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewFailure {
    pub function_id: String,
    pub kind: &'static str,
    pub reason: String,
}

/// Per worker: the functions attached to the collections it has seen.
#[derive(Default)]
pub struct FunctionCache {
    /// Every live function, by input collection, as read at the instant: one read serves
    /// all collections (a partition may hold thousands) until it is stale.
    snapshot: Option<(Instant, HashMap<String, Vec<Attached>>)>,
    /// The functions built so far, by id, kept across snapshots while their row runs the
    /// same code: a WebAssembly function keeps its instance instead of a new one per read.
    built: HashMap<String, Attached>,
    /// Functions whose component could not be built here (deterministic failures), to
    /// be marked failed by the caller.
    unbuildable: Vec<NewFailure>,
}

impl FunctionCache {
    /// The functions attached to `collection`, from a snapshot of all attached functions
    /// that is re-read when stale or when a marker names a function it does not hold.
    pub async fn get(&mut self, sysdb: &Sysdb, collection: &str, named: &[&str]) -> Result<&[Attached], SysdbError> {
        let fresh = match &self.snapshot {
            Some((at, by)) => {
                let list = by.get(collection).map(Vec::as_slice).unwrap_or_default();
                at.elapsed() < TTL && named.iter().all(|id| list.iter().any(|a| a.row.id == *id))
            }
            None => false,
        };
        if !fresh {
            let rows = sysdb.functions(None).await?;
            let mut by: HashMap<String, Vec<Attached>> = HashMap::new();
            let mut built = HashMap::new();
            let live = |r: &FunctionRow| !matches!(r.status, FunctionStatus::Detached | FunctionStatus::Failed);
            for row in rows.into_iter().filter(live) {
                let kept = self.built.remove(&row.id).filter(|a| a.runs_as(&row));
                let attached = match kept {
                    Some(a) => Attached { row, ..a },
                    None => match build_function(sysdb, &row).await {
                        Ok(f) => Attached::new(row, f),
                        Err(BuildError::Sysdb(e)) => return Err(e),
                        Err(BuildError::Component(reason)) => {
                            self.unbuildable.push(NewFailure { function_id: row.id.clone(), kind: "load", reason });
                            continue;
                        }
                        Err(e @ BuildError::Function(_)) => {
                            tracing::error!(function = %row.id, %e, "attached function cannot be built; skipping it");
                            continue;
                        }
                    },
                };
                built.insert(attached.row.id.clone(), attached.clone());
                by.entry(attached.row.collection_id.clone()).or_default().push(attached);
            }
            self.built = built;
            self.snapshot = Some((Instant::now(), by));
        }
        Ok(self.snapshot.as_ref().and_then(|(_, by)| by.get(collection)).map(Vec::as_slice).unwrap_or_default())
    }

    /// Forget the snapshot (after a conflict or a reassignment); built functions are
    /// kept for the next read to reuse.
    pub fn clear(&mut self) {
        self.snapshot = None;
    }

    /// Functions found unbuildable since the last call (each to be marked failed).
    pub fn take_unbuildable(&mut self) -> Vec<NewFailure> {
        std::mem::take(&mut self.unbuildable)
    }

    /// Forget what is known of `collection` (after a marker changed a function's status):
    /// the next lookup reads every function again.
    pub fn invalidate(&mut self, _collection: &str) {
        self.snapshot = None;
    }
}

/// The BACKFILL_FN markers among a collection's records: `(offset, payload)`.
pub fn markers(records: &[(i64, LogRecord)]) -> Vec<(i64, &BackfillRef)> {
    records
        .iter()
        .filter(|(_, r)| r.operation == Operation::BackfillFn)
        .filter_map(|(o, r)| r.backfill.as_ref().map(|b| (*o, b)))
        .collect()
}

/// The offset from which a function's deltas can apply in this batch, by the cached
/// status: `Some(None)` = every change, `Some(Some(m))` = changes after `m`, `None` =
/// nothing (the sysdb re-checks all of this in the transaction).
fn applies_after(a: &Attached, markers: &[(i64, &BackfillRef)]) -> Option<Option<i64>> {
    match a.row.status {
        FunctionStatus::Ready => Some(None),
        FunctionStatus::Backfilling => Some(a.row.marker_offset),
        FunctionStatus::AwaitingMarker => markers
            .iter()
            .find(|(_, b)| b.function_id == a.row.id && b.request_id == a.row.request_id)
            .map(|(o, _)| Some(*o)),
        FunctionStatus::Detached | FunctionStatus::Failed => None,
    }
}

/// Each attached function's work for this batch of one collection. A function that
/// fails on one of the changes ([`Function::try_deltas`]) contributes no change: its batch
/// carries the failure, which the batch transaction stores (the function becomes
/// `failed`); a failure this worker sees for the first time is added to `failures`.
pub fn function_batches(
    attached: &[Attached],
    outcome: &BatchOutcome,
    markers: &[(i64, &BackfillRef)],
    failures: &mut Vec<NewFailure>,
) -> Vec<FunctionBatch> {
    let mut out = Vec::new();
    for a in attached {
        let own_markers: Vec<(i64, String)> = markers
            .iter()
            .filter(|(_, b)| b.function_id == a.row.id)
            .map(|(o, b)| (*o, b.request_id.clone()))
            .collect();
        let mut changes = Vec::new();
        let mut failure = None;
        if let Some(after) = applies_after(a, markers) {
            for c in outcome.changes.iter().filter(|c| after.is_none_or(|m| c.offset > m)) {
                let mut deltas = Vec::new();
                let change =
                    ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset };
                if let Err(f) = a.f.try_deltas(&change, &mut deltas) {
                    if !a.reported.swap(true, Ordering::Relaxed) {
                        failures.push(NewFailure {
                            function_id: a.row.id.clone(),
                            kind: f.kind.as_str(),
                            reason: f.reason.clone(),
                        });
                    }
                    failure = Some(f.reason);
                    changes.clear();
                    break;
                }
                changes.push(FunctionChange { offset: c.offset, id: c.id.clone(), before: c.before.clone(), deltas });
            }
        }
        if !own_markers.is_empty() || !changes.is_empty() || failure.is_some() {
            out.push(FunctionBatch { function_id: a.row.id.clone(), markers: own_markers, changes, failure });
        }
    }
    out
}

/// Backfill tasks for the markers that will start a backfill (the function awaits a
/// marker with that request id). Produced and acknowledged before the batch commits
/// (design.md invariant 7); a duplicate is harmless.
pub fn tasks(
    attached: &[Attached],
    markers: &[(i64, &BackfillRef)],
    topic: &str,
    partition: i32,
    now_ms: i64,
) -> Vec<BackfillTask> {
    let mut out = Vec::new();
    for a in attached.iter().filter(|a| a.row.status == FunctionStatus::AwaitingMarker) {
        if let Some((o, b)) =
            markers.iter().find(|(_, b)| b.function_id == a.row.id && b.request_id == a.row.request_id)
        {
            out.push(BackfillTask {
                request_id: b.request_id.clone(),
                function_id: a.row.id.clone(),
                collection_id: a.row.collection_id.clone(),
                topic: topic.to_string(),
                partition,
                marker_offset: *o,
                produced_at_ms: now_ms,
            });
        }
    }
    out
}
