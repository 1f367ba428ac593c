//! The processor's side of attached functions: which functions a batch touches, their
//! deltas for the batch's changes, and the backfill tasks its markers ask for.
//!
//! The cache of attached functions only decides what work to *prepare*; what applies is
//! decided by the sysdb inside the batch transaction from the stored status (docs/design.md
//! section 7.5).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::functions::{build, ChangeRef, Function, FunctionStatus};
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
}

/// Per worker: the functions attached to the collections it has seen.
#[derive(Default)]
pub struct FunctionCache {
    /// Every live function, by input collection, as read at the instant: one read serves
    /// all collections (a partition may hold thousands) until it is stale.
    snapshot: Option<(Instant, HashMap<String, Vec<Attached>>)>,
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
            for row in rows.into_iter().filter(|r| r.status != FunctionStatus::Detached) {
                match build(&row.function, &row.params) {
                    Ok(f) => by.entry(row.collection_id.clone()).or_default().push(Attached { f: Arc::from(f), row }),
                    Err(e) => tracing::error!(function = %row.id, %e, "attached function cannot be built; skipping it"),
                }
            }
            self.snapshot = Some((Instant::now(), by));
        }
        Ok(self.snapshot.as_ref().and_then(|(_, by)| by.get(collection)).map(Vec::as_slice).unwrap_or_default())
    }

    /// Forget everything (after a conflict or a reassignment).
    pub fn clear(&mut self) {
        self.snapshot = None;
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
        FunctionStatus::Detached => None,
    }
}

/// Each attached function's work for this batch of one collection.
pub fn function_batches(
    attached: &[Attached],
    outcome: &BatchOutcome,
    markers: &[(i64, &BackfillRef)],
) -> Vec<FunctionBatch> {
    let mut out = Vec::new();
    for a in attached {
        let own_markers: Vec<(i64, String)> = markers
            .iter()
            .filter(|(_, b)| b.function_id == a.row.id)
            .map(|(o, b)| (*o, b.request_id.clone()))
            .collect();
        let mut changes = Vec::new();
        if let Some(after) = applies_after(a, markers) {
            for c in outcome.changes.iter().filter(|c| after.is_none_or(|m| c.offset > m)) {
                let mut deltas = Vec::new();
                a.f.deltas(
                    &ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset },
                    &mut deltas,
                );
                changes.push(FunctionChange { offset: c.offset, id: c.id.clone(), before: c.before.clone(), deltas });
            }
        }
        if !own_markers.is_empty() || !changes.is_empty() {
            out.push(FunctionBatch { function_id: a.row.id.clone(), markers: own_markers, changes });
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
