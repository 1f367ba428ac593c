//! Deterministic synthetic workloads (demo, benchmarks, tests): log records over many
//! collections with a fixed operation mix. Same seed, same records.

use crate::{LogRecord, MetaValue, Metadata, Operation};

/// Workload shape.
#[derive(Debug, Clone)]
pub struct WorkloadSpec {
    pub records: usize,
    pub collections: usize,
    /// Embedding dimension (0: no embedding).
    pub dim: usize,
    /// Distinct ids per collection (ids are reused: updates and deletes hit live ids).
    pub ids_per_collection: usize,
    /// Percentages of upsert, update, delete, add (must sum to 100).
    pub mix: [u8; 4],
    pub seed: u64,
    /// Collection ids are `{prefix}{n}`.
    pub collection_prefix: String,
}

impl Default for WorkloadSpec {
    fn default() -> Self {
        WorkloadSpec {
            records: 10_000,
            collections: 64,
            dim: 384,
            ids_per_collection: 1_000,
            mix: [70, 20, 10, 0],
            seed: 42,
            collection_prefix: "collection-".into(),
        }
    }
}

/// splitmix64: tiny, fast, good enough for synthetic data.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

/// Generate the workload's records, in produce order.
pub fn generate(spec: &WorkloadSpec) -> impl Iterator<Item = LogRecord> + '_ {
    let mut rng = Rng::new(spec.seed);
    (0..spec.records).map(move |_| {
        let c = rng.below(spec.collections);
        let id = rng.below(spec.ids_per_collection);
        let roll = rng.below(100) as u8;
        let [up, upd, del, _] = spec.mix;
        let operation = if roll < up {
            Operation::Upsert
        } else if roll < up + upd {
            Operation::Update
        } else if roll < up + upd + del {
            Operation::Delete
        } else {
            Operation::Add
        };
        let mut r = LogRecord::data(format!("{}{c}", spec.collection_prefix), format!("id-{id:06}"), operation);
        if operation != Operation::Delete {
            if spec.dim > 0 {
                r.embedding = Some((0..spec.dim).map(|_| rng.unit_f32() * 2.0 - 1.0).collect());
            }
            let mut m = Metadata::new();
            m.insert("color".into(), MetaValue::String(["red", "green", "blue"][rng.below(3)].into()));
            m.insert("rank".into(), MetaValue::Long(rng.below(1000) as i64));
            if rng.below(10) == 0 {
                m.insert("score".into(), MetaValue::Null);
            } else {
                m.insert("score".into(), MetaValue::Double(f64::from(rng.unit_f32())));
            }
            r.metadata = Some(m);
            r.document = Some(format!("document {id} of collection {c}"));
        }
        r
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_follows_the_mix() {
        let spec = WorkloadSpec { records: 5_000, dim: 4, ..Default::default() };
        let a: Vec<LogRecord> = generate(&spec).collect();
        let b: Vec<LogRecord> = generate(&spec).collect();
        assert_eq!(a, b);
        let upserts = a.iter().filter(|r| r.operation == Operation::Upsert).count();
        assert!((3_200..3_800).contains(&upserts), "{upserts}");
        assert!(a
            .iter()
            .filter(|r| r.operation != Operation::Delete)
            .all(|r| r.embedding.as_ref().unwrap().len() == 4));
    }
}
