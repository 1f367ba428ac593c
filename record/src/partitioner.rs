//! The partition of a collection: the Java client's default partitioner for keyed
//! records, `(murmur2(key) & 0x7fffffff) % partitions`.
//!
//! librdkafka's default partitioner is `consistent_random` (CRC32), so every Sluice
//! producer sets `partitioner=murmur2_random` ([`RDKAFKA_PARTITIONER`]); producers in other
//! languages must do the same (the Java client does it by default). The function is
//! checked against vectors produced by the real Java `Utils.murmur2`
//! (`scripts/gen-murmur2-vectors.sh` → `testdata/murmur2_vectors.tsv`), and against
//! where rdkafka and the Python client actually put records (integration tests).

/// The librdkafka `partitioner` value that agrees with [`partition_for`].
pub const RDKAFKA_PARTITIONER: &str = "murmur2_random";

/// Kafka's murmur2 (the Java client's `Utils.murmur2`), as a signed 32-bit value.
pub fn murmur2(data: &[u8]) -> i32 {
    const SEED: u32 = 0x9747_b28c;
    const M: u32 = 0x5bd1_e995;
    const R: u32 = 24;

    let len = data.len();
    let mut h: u32 = SEED ^ (len as u32);
    let mut chunks = data.chunks_exact(4);
    for c in &mut chunks {
        let mut k = u32::from_le_bytes([c[0], c[1], c[2], c[3]]);
        k = k.wrapping_mul(M);
        k ^= k >> R;
        k = k.wrapping_mul(M);
        h = h.wrapping_mul(M);
        h ^= k;
    }
    let tail = chunks.remainder();
    if !tail.is_empty() {
        if tail.len() >= 3 {
            h ^= u32::from(tail[2]) << 16;
        }
        if tail.len() >= 2 {
            h ^= u32::from(tail[1]) << 8;
        }
        h ^= u32::from(tail[0]);
        h = h.wrapping_mul(M);
    }
    h ^= h >> 13;
    h = h.wrapping_mul(M);
    h ^= h >> 15;
    h as i32
}

/// The partition Kafka's Java producer (and librdkafka with `murmur2_random`) picks for
/// a non-empty key. Panics if `partitions` is 0 (a topic always has one).
pub fn partition_for(key: &[u8], partitions: u32) -> u32 {
    assert!(partitions > 0, "a topic has at least one partition");
    ((murmur2(key) as u32) & 0x7fff_ffff) % partitions
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unhex(s: &str) -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex")).collect()
    }

    /// Vectors computed by the real Java `Utils.murmur2` and default partitioner.
    #[test]
    fn murmur2_matches_java_client_vectors() {
        let text = include_str!("../../testdata/murmur2_vectors.tsv");
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().expect("header").split('\t').collect();
        let partition_counts: Vec<u32> = header[2..]
            .iter()
            .map(|h| {
                let digits: String = h.chars().filter(|c| c.is_ascii_digit()).collect();
                digits.parse().expect("partition-count column header holds a number")
            })
            .collect();
        let mut checked = 0;
        for line in lines.filter(|l| !l.trim().is_empty()) {
            let cols: Vec<&str> = line.split('\t').collect();
            let key = unhex(cols[0]);
            let expected: i32 = cols[1].parse().unwrap();
            assert_eq!(murmur2(&key), expected, "murmur2 of key {}", cols[0]);
            for (n, col) in partition_counts.iter().zip(&cols[2..]) {
                assert_eq!(partition_for(&key, *n), col.parse::<u32>().unwrap(), "key {} over {n}", cols[0]);
            }
            checked += 1;
        }
        assert!(checked >= 100, "expected at least 100 vectors, got {checked}");
    }

    #[test]
    fn partition_is_within_range_and_stable() {
        for n in 1..20u32 {
            for k in ["a", "collection-1", "日本語"] {
                let p = partition_for(k.as_bytes(), n);
                assert!(p < n);
                assert_eq!(p, partition_for(k.as_bytes(), n));
            }
        }
    }
}
