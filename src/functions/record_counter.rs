//! `record_counter`: one output record, [`OUTPUT_ID`], whose metadata [`COUNT_FIELD`] is
//! the number of live input records.
//!
//! An insert (`before = None`, `after = Some`) counts +1, a removal −1; a merge changes
//! nothing and emits nothing. The counter is created by its first delta and never
//! removed at zero (`remove_at_zero: false`), so a collection emptied after it had
//! records reads `total_count = 0`. An output that has never received a delta (nothing
//! inserted since the marker and an empty collection as of the marker) is absent: a
//! reader must treat an absent `function_output` as `total_count = 0`, which is what the
//! reference model ([`crate::functions::model::reference_outputs`]) states.

use std::collections::BTreeMap;

use super::no_params;
use super::{ChangeRef, Function, FunctionError, OutputDelta, Reads};
use crate::record::Metadata;

/// Registry name.
pub const NAME: &str = "record_counter";
/// Id of the single output record.
pub const OUTPUT_ID: &str = "function_output";
/// Metadata key of the count in the output record.
pub const COUNT_FIELD: &str = "total_count";

/// Counts live input records.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordCounter;

/// Registry entry: `record_counter` takes no parameters.
pub fn build(params: &BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError> {
    no_params(NAME, params)?;
    Ok(Box::new(RecordCounter))
}

impl Function for RecordCounter {
    fn name(&self) -> &'static str {
        NAME
    }

    /// A count needs only whether the record exists.
    fn reads(&self) -> Reads {
        Reads::NOTHING
    }

    fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        let delta = match (change.before.is_some(), change.after.is_some()) {
            (false, true) => 1,
            (true, false) => -1,
            // A merge keeps the record live; (None, None) is not a change.
            _ => return,
        };
        out.push(OutputDelta::Count {
            output_id: OUTPUT_ID.to_string(),
            fields: Metadata::new(),
            count_field: COUNT_FIELD.into(),
            delta,
            remove_at_zero: false,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MetaValue, Record};

    fn record(offset: i64) -> Record {
        Record {
            id: "a".into(),
            embedding: None,
            metadata: Metadata::from_iter([("k".to_string(), MetaValue::Long(1))]),
            document: None,
            offset,
        }
    }

    fn deltas(before: Option<&Record>, after: Option<&Record>) -> Vec<OutputDelta> {
        let mut out = Vec::new();
        RecordCounter.deltas(&ChangeRef { id: "a", before, after, offset: 9 }, &mut out);
        out
    }

    fn count(delta: i64) -> OutputDelta {
        OutputDelta::Count {
            output_id: "function_output".into(),
            fields: Metadata::new(),
            count_field: "total_count".into(),
            delta,
            remove_at_zero: false,
        }
    }

    #[test]
    fn record_counter_counts_inserts_up_and_removals_down() {
        assert_eq!(deltas(None, Some(&record(9))), vec![count(1)]);
        assert_eq!(deltas(Some(&record(3)), None), vec![count(-1)]);
    }

    #[test]
    fn record_counter_emits_nothing_for_a_merge() {
        assert!(deltas(Some(&record(3)), Some(&record(9))).is_empty());
    }
}
