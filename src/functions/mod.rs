//! Attached functions: derived collections computed from an input collection's
//! **changes** `(id, before, after, offset)` (docs/design.md section 7).
//!
//! A function is pure: it turns one change into output deltas. Aggregates
//! (`record_counter`, `statistics`) emit counter increments, which commute, so the order
//! in which live processing and a backfill apply them does not matter. Map functions
//! (`normalize`) emit versioned puts and removes carrying the source offset; the sysdb
//! applies a put only if it is newer than what the output holds (including a tombstone).
//!
//! Adding a function = one new module with a [`Function`] impl and a `build(params)` +
//! one line in [`registry::FUNCTIONS`].
//!
//! - [`record_counter`], [`statistics`], [`normalize`]: the built-in functions.
//! - [`wasm`]: a user's function as a WebAssembly component (`schemas/function.wit`),
//!   run by wasmtime with fuel, memory and deadline limits; its failures are
//!   [`FunctionFailure`]s, which mark it [`FunctionStatus::Failed`].
//! - [`registry`]: name → function.
//! - [`apply`]: how deltas change an output collection (the semantics the sysdb
//!   implements), pure; the property tests and the protocol simulation use it.
//! - `proptests` (tests): live deltas over random logs and batch splits equal the
//!   reference model's outputs.
//! - `simulation` (tests): the backfill protocol of docs/design.md section 7 — processor and
//!   backfill worker interleaved at random — ends at the reference outputs, and each
//!   known mistake of the protocol makes it fail.

use std::borrow::Cow;
use std::collections::BTreeMap;

use thiserror::Error;

use crate::record::{Metadata, Record};

/// Lifecycle of an attached function.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FunctionStatus {
    /// Attached; its BACKFILL_FN marker has not been processed yet.
    AwaitingMarker,
    /// The marker was processed at `marker_offset`: live changes after it are applied
    /// incrementally while the backfill worker covers the collection as of the marker.
    Backfilling,
    /// Backfill done: only live changes.
    Ready,
    /// Stopped; nothing is applied any more.
    Detached,
    /// Stopped by a failure of the function itself (a WebAssembly trap, fuel or memory
    /// exhausted, the wall-clock deadline, or an error it returned): nothing is applied
    /// any more, the reason is stored beside the status. The collection and the other
    /// functions go on; detach it and attach a fixed version.
    Failed,
}

impl FunctionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            FunctionStatus::AwaitingMarker => "awaiting_marker",
            FunctionStatus::Backfilling => "backfilling",
            FunctionStatus::Ready => "ready",
            FunctionStatus::Detached => "detached",
            FunctionStatus::Failed => "failed",
        }
    }

    pub fn parse(s: &str) -> Option<FunctionStatus> {
        Some(match s {
            "awaiting_marker" => FunctionStatus::AwaitingMarker,
            "backfilling" => FunctionStatus::Backfilling,
            "ready" => FunctionStatus::Ready,
            "detached" => FunctionStatus::Detached,
            "failed" => FunctionStatus::Failed,
            _ => return None,
        })
    }
}

/// One change of the input collection, borrowed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChangeRef<'a> {
    pub id: &'a str,
    pub before: Option<&'a Record>,
    pub after: Option<&'a Record>,
    /// Offset of the log record that made the change.
    pub offset: i64,
}

/// What a function emits for a change.
#[derive(Debug, Clone, PartialEq)]
pub enum OutputDelta {
    /// Add `delta` to the counter behind output record `output_id`. The output record's
    /// metadata is `fields` plus `count_field` = the new count. When the count reaches 0
    /// the output record is removed if `remove_at_zero`, else kept with count 0.
    /// `count_field` is borrowed for the built-in functions, owned for a WebAssembly one.
    Count { output_id: String, fields: Metadata, count_field: Cow<'static, str>, delta: i64, remove_at_zero: bool },
    /// Versioned upsert: `record.offset` is the source offset (the version).
    Put { record: Record },
    /// Versioned removal at source offset `offset` (leaves a tombstone while a backfill
    /// runs, so an older backfilled put cannot resurrect it).
    Remove { id: String, offset: i64 },
}

/// A function over changes.
pub trait Function: Send + Sync {
    /// The registry name (`record_counter`, `statistics`, `normalize`, `wasm`).
    fn name(&self) -> &'static str;
    /// Append the output deltas of one change to `out`.
    fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>);
    /// [`Function::deltas`] for a function that can fail (a WebAssembly component: a
    /// trap, fuel or memory exhausted, the deadline, an error it returns). On `Err` the
    /// function is marked [`FunctionStatus::Failed`] with the reason and `out` is
    /// discarded. The built-in functions cannot fail: the default calls `deltas`.
    fn try_deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) -> Result<(), FunctionFailure> {
        self.deltas(change, out);
        Ok(())
    }
    /// Which stored fields of a record [`Function::deltas`] reads, besides its id, its
    /// offset and whether it exists. A backfill reads only these from the sysdb (the
    /// others arrive empty), so a function must not depend on a field it leaves out:
    /// `deltas` of a change and of its [`Reads::project`]ion are equal (a property test
    /// holds every function to it). The default reads everything.
    fn reads(&self) -> Reads {
        Reads::ALL
    }
}

/// Why a function failed on a change (see [`Function::try_deltas`]).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{reason}")]
pub struct FunctionFailure {
    pub kind: FailureKind,
    /// What happened and what to do, stored as the function's failed reason.
    pub reason: String,
}

/// The kinds of [`FunctionFailure`] (the `kind` label of `sluice_function_failures_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The change used up its fuel (`wasm.fuel_per_change`): deterministic.
    Fuel,
    /// The instance grew its memory past `wasm.max_memory_bytes`: deterministic.
    Memory,
    /// The wall-clock backstop (`wasm.epoch_deadline_ms`): the one kind that
    /// depends on the machine, not only on the change.
    Deadline,
    /// Any other trap (`unreachable`, an out-of-bounds access, a stack overflow).
    Trap,
    /// The function returned an error, or output the host refuses.
    Error,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Fuel => "fuel",
            FailureKind::Memory => "memory",
            FailureKind::Deadline => "deadline",
            FailureKind::Trap => "trap",
            FailureKind::Error => "error",
        }
    }
}

/// The stored fields of a record a function reads (see [`Function::reads`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Reads {
    pub embedding: bool,
    pub metadata: bool,
    pub document: bool,
}

impl Reads {
    pub const ALL: Reads = Reads { embedding: true, metadata: true, document: true };
    /// Only the id, the offset and the record's existence.
    pub const NOTHING: Reads = Reads { embedding: false, metadata: false, document: false };

    /// Whether the embedding or the document is read: the fields kept in the value log,
    /// outside a record's light read (existence and metadata).
    pub fn values(self) -> bool {
        self.embedding || self.document
    }

    /// `record` as a backfill with these reads sees it: the fields left out are empty.
    pub fn project(self, record: &Record) -> Record {
        Record {
            id: record.id.clone(),
            embedding: if self.embedding { record.embedding.clone() } else { None },
            metadata: if self.metadata { record.metadata.clone() } else { Metadata::new() },
            document: if self.document { record.document.clone() } else { None },
            offset: record.offset,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FunctionError {
    #[error(
        "unknown function {0:?}: available functions are record_counter, statistics, normalize, and a WebAssembly \
         component attached with --wasm FILE"
    )]
    Unknown(String),
    #[error("function {function}: invalid parameter {param:?}: {message}")]
    BadParam { function: String, param: String, message: String },
}

/// Build a function from its registry name and parameters.
pub use registry::build;

#[cfg(any(test, feature = "testkit"))]
pub mod apply;
#[cfg(any(test, feature = "testkit"))]
pub mod model;
pub mod normalize;
pub mod record_counter;
pub mod registry;
pub mod statistics;
pub mod wasm;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod simulation;

/// For functions without parameters: any parameter is an error naming it.
pub fn no_params(function: &str, params: &BTreeMap<String, String>) -> Result<(), FunctionError> {
    match params.keys().next() {
        None => Ok(()),
        Some(param) => Err(FunctionError::BadParam {
            function: function.to_string(),
            param: param.clone(),
            message: format!("{function} takes no parameters"),
        }),
    }
}
