//! [`Embedding`]: a vector of f32 kept as its wire and storage bytes (packed little-endian
//! f32), so a decoded record can share the consumed payload instead of copying it.
//!
//! The processor decodes a batch's records out of the buffers the consumer filled
//! ([`super::codec::decode_shared`]): each embedding is a slice of its message's payload,
//! not a `Vec<f32>` copy beside it. The sysdb stores these bytes as they are, so a record
//! crosses from the broker to the database without its embedding being copied or
//! converted. Floats are read on demand ([`Embedding::iter`], [`Embedding::to_vec`]) by
//! the few that compute with them (validation, functions, JSON output).
//!
//! Equality compares the floats (as `Vec<f32>` did): `0.0 == -0.0`, and `NaN` is equal to
//! nothing. Validation refuses non-finite values, so stored embeddings never hold `NaN`.

use bytes::Bytes;

use super::borrowed::EmbeddingRef;

/// Packed little-endian f32 values, a whole number of them. Cloning shares the bytes.
#[derive(Clone, Default)]
pub struct Embedding {
    bytes: Bytes,
}

impl Embedding {
    /// `None` when the length is not a multiple of 4. Shares `bytes` (no copy).
    pub fn from_le_bytes(bytes: Bytes) -> Option<Self> {
        (bytes.len() % 4 == 0).then_some(Embedding { bytes })
    }

    /// Packs the floats (one copy).
    pub fn from_f32s(values: &[f32]) -> Self {
        Embedding { bytes: Bytes::from(super::codec::f32s_to_le_bytes(values)) }
    }

    /// The borrowed view, which reads the values.
    pub fn view(&self) -> EmbeddingRef<'_> {
        EmbeddingRef::whole(&self.bytes)
    }

    /// Number of values (the dimension).
    pub fn len(&self) -> usize {
        self.view().len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The packed bytes: the wire format and the sysdb's storage format.
    pub fn as_le_bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The value at `index`, if there is one.
    pub fn get(&self, index: usize) -> Option<f32> {
        self.view().get(index)
    }

    /// The values in order.
    pub fn iter(&self) -> impl ExactSizeIterator<Item = f32> + '_ {
        self.view().iter()
    }

    /// The values as floats (one copy).
    pub fn to_vec(&self) -> Vec<f32> {
        self.view().to_vec()
    }
}

/// A copy of the borrowed decoder's view (already a whole number of values).
impl From<EmbeddingRef<'_>> for Embedding {
    fn from(view: EmbeddingRef<'_>) -> Self {
        Embedding { bytes: Bytes::copy_from_slice(view.as_bytes()) }
    }
}

impl From<Vec<f32>> for Embedding {
    fn from(values: Vec<f32>) -> Self {
        Embedding::from_f32s(&values)
    }
}

impl From<&[f32]> for Embedding {
    fn from(values: &[f32]) -> Self {
        Embedding::from_f32s(values)
    }
}

impl<const N: usize> From<[f32; N]> for Embedding {
    fn from(values: [f32; N]) -> Self {
        Embedding::from_f32s(&values)
    }
}

impl FromIterator<f32> for Embedding {
    fn from_iter<I: IntoIterator<Item = f32>>(values: I) -> Self {
        let values = values.into_iter();
        let mut bytes = Vec::with_capacity(values.size_hint().0.saturating_mul(4));
        for v in values {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        Embedding { bytes: Bytes::from(bytes) }
    }
}

impl PartialEq for Embedding {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl PartialEq<[f32]> for Embedding {
    fn eq(&self, other: &[f32]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter().copied())
    }
}

impl PartialEq<Vec<f32>> for Embedding {
    fn eq(&self, other: &Vec<f32>) -> bool {
        *self == other[..]
    }
}

impl std::fmt::Debug for Embedding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As a sequence of numbers, like `Vec<f32>`.
impl serde::Serialize for Embedding {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter())
    }
}

impl<'de> serde::Deserialize<'de> for Embedding {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<f32>::deserialize(deserializer).map(Embedding::from)
    }
}

#[cfg(test)]
mod tests {
    use super::Embedding;
    use bytes::Bytes;

    #[test]
    fn shares_the_bytes_it_is_made_from() {
        let payload = Bytes::from(vec![0u8, 0, 128, 63, 0, 0, 0, 64, 9]);
        let e = Embedding::from_le_bytes(payload.slice(0..8)).expect("two floats");
        assert_eq!(e.as_le_bytes().as_ptr(), payload.as_ptr(), "a slice of the payload, not a copy");
        assert_eq!(e.to_vec(), vec![1.0, 2.0]);
        assert_eq!((e.len(), e.get(1), e.get(2)), (2, Some(2.0), None));
        assert!(Embedding::from_le_bytes(payload.slice(0..7)).is_none(), "not a whole number of floats");
    }

    #[test]
    fn equality_and_json_are_those_of_the_floats() {
        assert_eq!(Embedding::from(vec![0.0]), Embedding::from(vec![-0.0]));
        assert_ne!(Embedding::from(vec![f32::NAN]), Embedding::from(vec![f32::NAN]));
        assert_ne!(Embedding::from(vec![1.0]), Embedding::from(vec![1.0, 0.0]));
        let e = Embedding::from(vec![1.5, -2.0]);
        assert_eq!(e, vec![1.5, -2.0]);
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(json, "[1.5,-2.0]");
        assert_eq!(serde_json::from_str::<Embedding>(&json).unwrap(), e);
        assert_eq!(format!("{e:?}"), "[1.5, -2.0]");
    }
}
