//! `normalize`: a per-record map function. Each live input record has one output record
//! with the same id, metadata and document and its embedding scaled to unit L2 norm.
//!
//! A change whose `after` is `Some` emits a versioned [`OutputDelta::Put`] whose
//! `record.offset` is the change's offset (the version); a removal emits a versioned
//! [`OutputDelta::Remove`] at the change's offset. A record without an embedding keeps
//! none.
//!
//! **Zero vector**: it has no direction, so it is kept as it is (all zeros, signs of
//! zero included), as scikit-learn's `normalize` does. Dividing by a zero norm would
//! produce NaNs, which the output collection must not hold (validation rejects
//! non-finite embeddings), and dropping the record would make the output's ids differ
//! from the input's.
//!
//! The norm is computed in `f64` (no overflow or underflow for any finite `f32` input)
//! and each component is divided in `f64` and rounded to `f32` once.

use std::collections::BTreeMap;

use super::no_params;
use super::{ChangeRef, Function, FunctionError, OutputDelta};
use crate::record::{Embedding, Record};

/// Registry name.
pub const NAME: &str = "normalize";

/// L2-normalizes embeddings, record by record.
#[derive(Debug, Clone, Copy, Default)]
pub struct Normalize;

/// Registry entry: `normalize` takes no parameters.
pub fn build(params: &BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError> {
    no_params(NAME, params)?;
    Ok(Box::new(Normalize))
}

impl Function for Normalize {
    fn name(&self) -> &'static str {
        NAME
    }

    fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        out.push(match change.after {
            Some(after) => OutputDelta::Put {
                record: Record {
                    id: change.id.to_string(),
                    embedding: after.embedding.as_ref().map(l2_normalize),
                    metadata: after.metadata.clone(),
                    document: after.document.clone(),
                    offset: change.offset,
                },
            },
            None => OutputDelta::Remove { id: change.id.to_string(), offset: change.offset },
        });
    }
}

/// `v / ‖v‖₂`; the zero vector (and the empty one) is returned unchanged.
pub fn l2_normalize(v: &Embedding) -> Embedding {
    let norm = v.iter().map(|x| f64::from(x) * f64::from(x)).sum::<f64>().sqrt();
    if norm == 0.0 {
        return v.clone();
    }
    v.iter().map(|x| (f64::from(x) / norm) as f32).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MetaValue, Metadata};

    fn record(embedding: Option<Vec<f32>>, offset: i64) -> Record {
        Record {
            id: "a".into(),
            embedding: embedding.map(Embedding::from),
            metadata: Metadata::from_iter([("k".to_string(), MetaValue::String("v".into()))]),
            document: Some("doc".into()),
            offset,
        }
    }

    fn deltas(before: Option<&Record>, after: Option<&Record>, offset: i64) -> Vec<OutputDelta> {
        let mut out = Vec::new();
        Normalize.deltas(&ChangeRef { id: "a", before, after, offset }, &mut out);
        out
    }

    #[test]
    fn normalize_puts_the_unit_vector_with_metadata_document_and_source_offset() {
        let after = record(Some(vec![3.0, 4.0]), 7);
        let expected = Record { embedding: Some(vec![0.6, 0.8].into()), ..after.clone() };
        assert_eq!(deltas(None, Some(&after), 7), vec![OutputDelta::Put { record: expected.clone() }]);
        // A merge is a new version of the same output record.
        assert_eq!(
            deltas(Some(&record(Some(vec![1.0, 0.0]), 2)), Some(&after), 7),
            vec![OutputDelta::Put { record: expected }]
        );
    }

    #[test]
    fn normalize_removes_at_the_source_offset() {
        assert_eq!(deltas(Some(&record(None, 2)), None, 11), vec![OutputDelta::Remove { id: "a".into(), offset: 11 }]);
    }

    #[test]
    fn normalize_keeps_a_missing_embedding_missing_and_a_zero_vector_zero() {
        let Some(OutputDelta::Put { record: out }) = deltas(None, Some(&record(None, 1)), 1).pop() else {
            panic!("put expected");
        };
        assert_eq!(out.embedding, None);
        let zero = l2_normalize(&[0.0, -0.0].into());
        assert_eq!(zero.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), vec![0.0f32.to_bits(), (-0.0f32).to_bits()]);
        assert!(l2_normalize(&Embedding::default()).is_empty());
    }

    #[test]
    fn l2_normalize_yields_unit_norm_without_overflow_or_underflow() {
        for v in [vec![1e-30f32, 1e-30], vec![3e38, 3e38], vec![-2.0, 0.0, 1.0], vec![f32::MIN_POSITIVE / 8.0]] {
            let n = l2_normalize(&v.as_slice().into()).to_vec();
            let norm: f64 = n.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
            assert!((norm - 1.0).abs() < 1e-6, "{v:?} → {n:?} has norm {norm}");
            assert!(n.iter().zip(&v).all(|(a, b)| a.signum() == b.signum()));
        }
    }
}
