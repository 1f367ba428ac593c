//! Applying output deltas to an output collection: the semantics the sysdb backends
//! implement in SQL, as a pure function over an in-memory [`OutputStore`], used by the
//! property tests and the backfill protocol simulation.
//!
//! - [`OutputDelta::Count`] adds `delta` to the counter kept in the output record's
//!   `count_field`; the record's metadata becomes `fields` plus the new count. At 0 the
//!   record is removed if `remove_at_zero`. Counts may go transiently negative while a
//!   backfill runs (a live −1 for a pair the backfill has not counted yet); increments
//!   commute, so the end result does not depend on the order.
//! - [`OutputDelta::Put`] / [`OutputDelta::Remove`] are map outputs whose version is
//!   the source offset (`record.offset`, `offset`). **Versioned** (while a backfill
//!   runs): a put applies only if its version is newer than the stored record's and
//!   than the id's tombstone; a remove deletes a stored record older than it and leaves
//!   a tombstone at its version, so an older backfilled put cannot resurrect the id.
//!   **Unversioned** (once the function is `ready`: one writer, in offset order): a put
//!   overwrites, a remove deletes, no tombstones. When a backfill finishes,
//!   [`OutputStore::finish_backfill`] drops the tombstones.

use std::collections::BTreeMap;

use super::OutputDelta;
use crate::functions::model::ModelOutput;
use crate::record::{MetaValue, Record};

/// Version stored in counter records (counters are not versioned).
pub const COUNTER_VERSION: i64 = -1;

/// An output collection: records and, while a backfill runs, tombstones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputStore {
    /// Output records by id. `offset` is the version: the source offset for map
    /// outputs, [`COUNTER_VERSION`] for counters.
    pub records: BTreeMap<String, Record>,
    /// Removed map outputs: id → version of the removal.
    pub tombstones: BTreeMap<String, i64>,
}

/// What [`apply_deltas`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Applied {
    /// Deltas that changed the store (or would have, for a remove of an absent id).
    pub applied: usize,
    /// Versioned puts and removes refused because the store holds something newer.
    pub stale: usize,
}

impl OutputStore {
    /// The backfill is done: tombstones are no longer needed.
    pub fn finish_backfill(&mut self) {
        self.tombstones.clear();
    }

    /// The records without their versions, in the reference model's shape.
    pub fn contents(&self) -> BTreeMap<String, ModelOutput> {
        self.records
            .iter()
            .map(|(id, r)| {
                let out = ModelOutput {
                    embedding: r.embedding.clone(),
                    metadata: r.metadata.clone(),
                    document: r.document.clone(),
                };
                (id.clone(), out)
            })
            .collect()
    }
}

/// Apply `deltas` in order (module doc for the semantics).
pub fn apply_deltas(store: &mut OutputStore, deltas: &[OutputDelta], versioned: bool) -> Applied {
    let mut done = Applied::default();
    for delta in deltas {
        let applied = match delta {
            OutputDelta::Count { output_id, fields, count_field, delta, remove_at_zero } => {
                let current = match store.records.get(output_id).and_then(|r| r.metadata.get(count_field.as_ref())) {
                    Some(MetaValue::Long(n)) => *n,
                    _ => 0,
                };
                let count = current + delta;
                if count == 0 && *remove_at_zero {
                    store.records.remove(output_id);
                } else {
                    let mut metadata = fields.clone();
                    metadata.insert(count_field.to_string(), MetaValue::Long(count));
                    let record = Record {
                        id: output_id.clone(),
                        embedding: None,
                        metadata,
                        document: None,
                        offset: COUNTER_VERSION,
                    };
                    store.records.insert(output_id.clone(), record);
                }
                true
            }
            OutputDelta::Put { record } if versioned => {
                let newest = newest_version(store, &record.id);
                let newer = newest.is_none_or(|v| record.offset > v);
                if newer {
                    store.tombstones.remove(&record.id);
                    store.records.insert(record.id.clone(), record.clone());
                }
                newer
            }
            OutputDelta::Put { record } => {
                store.records.insert(record.id.clone(), record.clone());
                true
            }
            OutputDelta::Remove { id, offset } if versioned => {
                let newer = newest_version(store, id).is_none_or(|v| *offset > v);
                if newer {
                    store.records.remove(id);
                    store.tombstones.insert(id.clone(), *offset);
                }
                newer
            }
            OutputDelta::Remove { id, .. } => {
                store.records.remove(id);
                true
            }
        };
        if applied {
            done.applied += 1;
        } else {
            done.stale += 1;
        }
    }
    done
}

/// The version of what the store holds for `id`: its record's or its tombstone's.
fn newest_version(store: &OutputStore, id: &str) -> Option<i64> {
    let record = store.records.get(id).map(|r| r.offset);
    let tombstone = store.tombstones.get(id).copied();
    record.max(tombstone)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::Metadata;

    fn put(id: &str, offset: i64, doc: &str) -> OutputDelta {
        OutputDelta::Put {
            record: Record {
                id: id.into(),
                embedding: None,
                metadata: Metadata::new(),
                document: Some(doc.into()),
                offset,
            },
        }
    }

    fn remove(id: &str, offset: i64) -> OutputDelta {
        OutputDelta::Remove { id: id.into(), offset }
    }

    fn count(id: &str, delta: i64, remove_at_zero: bool) -> OutputDelta {
        OutputDelta::Count {
            output_id: id.into(),
            fields: Metadata::from_iter([("key".to_string(), MetaValue::String("k".into()))]),
            count_field: "count".into(),
            delta,
            remove_at_zero,
        }
    }

    fn doc(store: &OutputStore, id: &str) -> Option<String> {
        store.records.get(id).and_then(|r| r.document.clone())
    }

    #[test]
    fn versioned_put_never_overwrites_a_newer_record() {
        let mut store = OutputStore::default();
        let done = apply_deltas(&mut store, &[put("a", 20, "live"), put("a", 5, "backfill")], true);
        assert_eq!(done, Applied { applied: 1, stale: 1 });
        assert_eq!(doc(&store, "a").as_deref(), Some("live"));
        apply_deltas(&mut store, &[put("a", 21, "newer")], true);
        assert_eq!(doc(&store, "a").as_deref(), Some("newer"));
    }

    #[test]
    fn versioned_remove_leaves_a_tombstone_that_stops_older_puts() {
        let mut store = OutputStore::default();
        // The live delete arrives before the backfill wrote anything for the id.
        apply_deltas(&mut store, &[remove("a", 20), put("a", 5, "backfill")], true);
        assert_eq!(doc(&store, "a"), None);
        assert_eq!(store.tombstones.get("a"), Some(&20));
        // A re-insert after the delete is newer and clears the tombstone.
        apply_deltas(&mut store, &[put("a", 30, "again")], true);
        assert_eq!(doc(&store, "a").as_deref(), Some("again"));
        assert!(store.tombstones.is_empty());
        // A remove older than the stored record is refused.
        assert_eq!(apply_deltas(&mut store, &[remove("a", 25)], true).stale, 1);
        assert_eq!(doc(&store, "a").as_deref(), Some("again"));
    }

    #[test]
    fn unversioned_writes_are_blind_and_leave_no_tombstones() {
        let mut store = OutputStore::default();
        apply_deltas(&mut store, &[put("a", 20, "live"), put("a", 5, "old")], false);
        assert_eq!(doc(&store, "a").as_deref(), Some("old"));
        apply_deltas(&mut store, &[remove("a", 1)], false);
        assert!(store.records.is_empty() && store.tombstones.is_empty());
    }

    #[test]
    fn counts_add_up_go_negative_and_vanish_at_zero_only_when_asked() {
        let mut store = OutputStore::default();
        apply_deltas(&mut store, &[count("p", -1, true)], false);
        assert_eq!(store.records["p"].metadata.get("count"), Some(&MetaValue::Long(-1)));
        assert_eq!(store.records["p"].metadata.get("key"), Some(&MetaValue::String("k".into())));
        apply_deltas(&mut store, &[count("p", 1, true)], true);
        assert!(store.records.is_empty());
        apply_deltas(&mut store, &[count("q", 1, false), count("q", -1, false)], false);
        assert_eq!(store.records["q"].metadata.get("count"), Some(&MetaValue::Long(0)));
    }

    #[test]
    fn finishing_the_backfill_drops_tombstones_only() {
        let mut store = OutputStore::default();
        apply_deltas(&mut store, &[put("a", 3, "x"), remove("b", 4)], true);
        store.finish_backfill();
        assert!(store.tombstones.is_empty());
        assert_eq!(store.contents().len(), 1);
    }
}
