//! The attach rules (docs/design.md section 7.2), decided once for both backends: each
//! reads the facts in its attach transaction ([`AttachFacts`]), [`decide`] says what to do,
//! and [`refusal`] says why in words that name what is in the way and the fix.
//!
//! An output collection is written by one live function only, is never a collection of
//! data records, never a live function's input, and a function never reads another
//! function's output (outputs are written in the sysdb, not through the log, so it would
//! never see their live changes). An output that a detached function left empty is reused.

use super::types::{FunctionRow, NewFunction, OutboxRow};

/// Result of attaching.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachOutcome {
    /// New function row and its outbox row, committed together.
    Created(FunctionRow, OutboxRow),
    /// The same function (name and parameters) is already attached, not detached, to the
    /// same (collection, output): nothing was written.
    Existing(FunctionRow),
    /// The attach breaks a rule: nothing was written.
    Refused(AttachConflict),
}

/// Why an attach was refused. Each names the function (or collection) in the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AttachConflict {
    /// The output name is a collection of data records that no function writes.
    OutputIsData { output: String },
    /// A non-detached function already writes the output: a different input, or the same
    /// input with another function or other parameters.
    OutputWrittenBy(FunctionRow),
    /// The output still holds records that this detached function wrote (detached
    /// without dropping its output).
    OutputLeftBy(FunctionRow),
    /// The input collection is the output of this non-detached function.
    InputIsOutputOf(FunctionRow),
    /// The output collection is the input of this non-detached function.
    OutputIsInputOf(FunctionRow),
}

/// What the attach transaction read about the new function's input and output.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AttachFacts {
    /// The live (not detached) function that writes the output collection, if any.
    pub output_writer: Option<FunctionRow>,
    /// The live function whose output is the input collection, if any.
    pub input_written_by: Option<FunctionRow>,
    /// The live function that reads the output collection as its input, if any.
    pub output_read_by: Option<FunctionRow>,
    /// The output collection has a row in `collections`.
    pub output_exists: bool,
    /// The latest function of any status that wrote the output collection.
    pub output_last_writer: Option<FunctionRow>,
    /// The output collection holds records.
    pub output_has_records: bool,
}

/// What the attach transaction does.
// Made once per attach and matched at once: its size does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Insert the function and its outbox row; `reuse_output`: the output collection was
    /// left empty by a detached function, whose stale tombstones must be deleted first.
    Insert { reuse_output: bool },
    /// Write nothing and answer this.
    Answer(AttachOutcome),
}

/// The rules, in order.
pub fn decide(new: &NewFunction, facts: AttachFacts) -> Decision {
    use AttachConflict::*;
    let refuse = |c| Decision::Answer(AttachOutcome::Refused(c));
    if let Some(writer) = facts.output_writer {
        let same =
            writer.collection_id == new.collection_id && writer.function == new.function && writer.params == new.params;
        return if same { Decision::Answer(AttachOutcome::Existing(writer)) } else { refuse(OutputWrittenBy(writer)) };
    }
    if let Some(f) = facts.input_written_by {
        return refuse(InputIsOutputOf(f));
    }
    if let Some(f) = facts.output_read_by {
        return refuse(OutputIsInputOf(f));
    }
    if !facts.output_exists {
        return Decision::Insert { reuse_output: false };
    }
    match facts.output_last_writer {
        None => refuse(OutputIsData { output: new.output_collection.clone() }),
        Some(f) if facts.output_has_records => refuse(OutputLeftBy(f)),
        Some(_) => Decision::Insert { reuse_output: true },
    }
}

fn describe(f: &FunctionRow) -> String {
    format!(
        "function {} ({} on {:?} -> {:?}, {})",
        f.id,
        f.function,
        f.collection_id,
        f.output_collection,
        f.status.as_str()
    )
}

/// The message of a refused attach of `function` on `collection` writing `output`.
pub fn refusal(conflict: &AttachConflict, collection: &str, function: &str, output: &str) -> String {
    match conflict {
        AttachConflict::OutputIsData { output } => format!(
            "output collection {output:?} already exists and holds data from the log (no function writes it); \
             a function only writes a new collection of its own: choose another --output name"
        ),
        AttachConflict::OutputWrittenBy(f) if f.collection_id == collection && f.function != function => format!(
            "output collection {output:?} is already written by {}; to replace it, run `sluice functions detach {} --drop-output` \
             and attach again, or choose another --output name",
            describe(f),
            f.id
        ),
        AttachConflict::OutputWrittenBy(f) if f.collection_id == collection => format!(
            "output collection {output:?} is already written by {} with other parameters ({:?}); to change them, run \
             `sluice functions detach {} --drop-output` and attach again, or choose another --output name",
            describe(f),
            f.params,
            f.id
        ),
        AttachConflict::OutputWrittenBy(f) => format!(
            "output collection {output:?} is already written by {}; each output has one writer: choose another --output name \
             (or detach that function first: `sluice functions detach {} --drop-output`)",
            describe(f),
            f.id
        ),
        AttachConflict::OutputLeftBy(f) => format!(
            "output collection {output:?} still holds the records of {}, detached without --drop-output; \
             run `sluice functions detach {} --drop-output` to drop them, then attach again, or choose another --output name",
            describe(f),
            f.id
        ),
        AttachConflict::InputIsOutputOf(f) => format!(
            "collection {collection:?} is the output of {}; a function cannot take another function's output as its input \
             (outputs are written in the sysdb, not through the log, so it would never see their live changes): \
             attach {function} to {:?} instead",
            describe(f),
            f.collection_id
        ),
        AttachConflict::OutputIsInputOf(f) => format!(
            "output collection {output:?} is the input of {}; a function's output cannot be another function's input: \
             choose another --output name",
            describe(f)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::functions::FunctionStatus;

    fn new() -> NewFunction {
        NewFunction {
            id: "f-new".into(),
            collection_id: "in".into(),
            partition: 0,
            function: "record_counter".into(),
            output_collection: "out".into(),
            params: Default::default(),
            request_id: "r".into(),
        }
    }

    fn row(collection: &str, function: &str, output: &str, status: FunctionStatus) -> FunctionRow {
        FunctionRow {
            id: format!("f-{collection}-{output}"),
            collection_id: collection.into(),
            function: function.into(),
            output_collection: output.into(),
            params: Default::default(),
            status,
            request_id: "r0".into(),
            marker_offset: None,
            backfill_cursor: None,
            backfill_done: 0,
            backfill_total: None,
            created_at_ms: 0,
            updated_at_ms: 0,
            failed_reason: None,
        }
    }

    fn answer(d: Decision) -> AttachOutcome {
        match d {
            Decision::Answer(a) => a,
            other => panic!("expected an answer, got {other:?}"),
        }
    }

    /// Each rule, in order, with the fact that triggers it and nothing else.
    #[test]
    fn each_rule_refuses_or_returns_what_is_in_the_way() {
        let n = new();
        let ready = FunctionStatus::Ready;
        assert_eq!(decide(&n, AttachFacts::default()), Decision::Insert { reuse_output: false });
        let same = row("in", "record_counter", "out", ready);
        let facts = AttachFacts { output_writer: Some(same.clone()), ..Default::default() };
        assert_eq!(answer(decide(&n, facts)), AttachOutcome::Existing(same));
        let other = row("in", "statistics", "out", ready);
        let facts = AttachFacts { output_writer: Some(other.clone()), ..Default::default() };
        assert_eq!(answer(decide(&n, facts)), AttachOutcome::Refused(AttachConflict::OutputWrittenBy(other)));
        let upstream = row("src", "normalize", "in", ready);
        let facts = AttachFacts { input_written_by: Some(upstream.clone()), ..Default::default() };
        assert_eq!(answer(decide(&n, facts)), AttachOutcome::Refused(AttachConflict::InputIsOutputOf(upstream)));
        let downstream = row("out", "statistics", "x", ready);
        let facts = AttachFacts { output_read_by: Some(downstream.clone()), ..Default::default() };
        assert_eq!(answer(decide(&n, facts)), AttachOutcome::Refused(AttachConflict::OutputIsInputOf(downstream)));
        let facts = AttachFacts { output_exists: true, ..Default::default() };
        assert_eq!(
            answer(decide(&n, facts)),
            AttachOutcome::Refused(AttachConflict::OutputIsData { output: "out".into() })
        );
        let left = row("in", "statistics", "out", FunctionStatus::Detached);
        let facts = AttachFacts {
            output_exists: true,
            output_last_writer: Some(left.clone()),
            output_has_records: true,
            ..Default::default()
        };
        assert_eq!(answer(decide(&n, facts)), AttachOutcome::Refused(AttachConflict::OutputLeftBy(left.clone())));
        let facts = AttachFacts { output_exists: true, output_last_writer: Some(left), ..Default::default() };
        assert_eq!(decide(&n, facts), Decision::Insert { reuse_output: true });
    }

    /// The writer of the output comes first: the same attach again is an answer even when
    /// other rules would refuse it.
    #[test]
    fn the_same_attach_again_answers_existing_before_any_other_rule() {
        let same = row("in", "record_counter", "out", FunctionStatus::Backfilling);
        let facts = AttachFacts {
            output_writer: Some(same.clone()),
            input_written_by: Some(row("a", "b", "in", FunctionStatus::Ready)),
            output_exists: true,
            output_has_records: true,
            ..Default::default()
        };
        assert_eq!(answer(decide(&new(), facts)), AttachOutcome::Existing(same));
    }
}
