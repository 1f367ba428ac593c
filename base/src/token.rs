//! Read tokens: what a writer hands to a reader so that the read includes the write.
//!
//! A token lists, per partition written, the offset after the last record acknowledged
//! (the next offset, as the sysdb's `next_offset`), and a fingerprint of the cluster and
//! the log topic. Since a collection's records and its partition's position commit in one
//! transaction, a state whose `next_offset[p] >= token[p]` for every partition of the
//! token holds every acknowledged record of the token: no other bookkeeping.
//!
//! The text form is versioned and URL-safe: `1.<fingerprint>.<p>-<next>_<p>-<next>...`,
//! partitions ascending, e.g. `1.9f3c2a1b4d5e6f70.0-1200_3-55`. Readers treat it as
//! opaque; a producer in another language may build one from its own delivery reports
//! (the fingerprint is [`fingerprint`]: FNV-1a 64 of `cluster id`, a zero byte, `topic`,
//! as 16 lower-case hex digits).

use std::collections::BTreeMap;
use std::fmt;

/// The token version this code writes and reads.
const VERSION: &str = "1";

/// A read token: partition -> the offset after the last acknowledged record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadToken {
    fingerprint: u64,
    next: BTreeMap<i32, i64>,
}

/// Why a token's text or a merge was refused. Each message says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    #[error("not a read token ({0}); pass the token a write printed (`sluice produce`, the HTTP API) unchanged")]
    Malformed(String),
    #[error(
        "read token version {0} is not known to this version of sluice (it reads version {VERSION}); upgrade sluice"
    )]
    Version(String),
    #[error(
        "the read token is for another topic or cluster (its fingerprint {token:016x}, this sysdb's log topic {topic} on this cluster: {here:016x}); use a token of a write to {topic}"
    )]
    OtherTopic { token: u64, here: u64, topic: String },
    #[error("read tokens of different topics or clusters cannot be merged ({0:016x} and {1:016x})")]
    Mixed(u64, u64),
}

/// The fingerprint of a cluster and a topic: FNV-1a 64 over `cluster_id`, a zero byte and
/// `topic`. Not a secret and not collision-proof; it only tells tokens of other topics or
/// clusters apart.
pub fn fingerprint(cluster_id: &str, topic: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in cluster_id.as_bytes().iter().chain([0u8].iter()).chain(topic.as_bytes()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

impl ReadToken {
    /// A token of the given positions (partition, next offset); the highest per partition
    /// wins. Negative partitions or offsets are not positions and are left out.
    pub fn new(fingerprint: u64, positions: impl IntoIterator<Item = (i32, i64)>) -> ReadToken {
        let mut t = ReadToken { fingerprint, next: BTreeMap::new() };
        for (p, o) in positions {
            t.raise(p, o);
        }
        t
    }

    /// The token of delivered records: each `(partition, offset)` is a record's own
    /// offset, so the token asks for the offset after it.
    pub fn of_deliveries(fingerprint: u64, delivered: impl IntoIterator<Item = (i32, i64)>) -> ReadToken {
        ReadToken::new(fingerprint, delivered.into_iter().map(|(p, o)| (p, o + 1)))
    }

    fn raise(&mut self, partition: i32, next: i64) {
        if partition < 0 || next < 0 {
            return;
        }
        let e = self.next.entry(partition).or_insert(next);
        *e = (*e).max(next);
    }

    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Partition -> the next offset the state must have reached.
    pub fn positions(&self) -> &BTreeMap<i32, i64> {
        &self.next
    }

    pub fn is_empty(&self) -> bool {
        self.next.is_empty()
    }

    /// One token covering both: the later offset of each partition.
    pub fn merge(&self, other: &ReadToken) -> Result<ReadToken, TokenError> {
        if self.fingerprint != other.fingerprint {
            return Err(TokenError::Mixed(self.fingerprint, other.fingerprint));
        }
        let mut t = self.clone();
        for (&p, &o) in &other.next {
            t.raise(p, o);
        }
        Ok(t)
    }

    /// Refuse a token of another topic or cluster.
    pub fn check_fingerprint(&self, here: u64, topic: &str) -> Result<(), TokenError> {
        if self.fingerprint == here {
            Ok(())
        } else {
            Err(TokenError::OtherTopic { token: self.fingerprint, here, topic: topic.to_string() })
        }
    }

    /// The partitions whose `positions` (partition -> next offset; absent = nothing
    /// applied) are behind the token: `(partition, position, token's offset)`.
    pub fn behind(&self, positions: &dyn Fn(i32) -> Option<i64>) -> Vec<(i32, Option<i64>, i64)> {
        self.next
            .iter()
            .filter_map(|(&p, &want)| {
                let have = positions(p);
                (have.unwrap_or(0) < want).then_some((p, have, want))
            })
            .collect()
    }

    /// Parse the text form.
    pub fn parse(text: &str) -> Result<ReadToken, TokenError> {
        let text = text.trim();
        let mut parts = text.splitn(3, '.');
        let version = parts.next().unwrap_or_default();
        if version.is_empty() {
            return Err(TokenError::Malformed("empty".into()));
        }
        if version != VERSION {
            if version.bytes().all(|b| b.is_ascii_digit()) {
                return Err(TokenError::Version(version.to_string()));
            }
            return Err(TokenError::Malformed(format!("{text:?} does not start with a version")));
        }
        let fp = parts.next().ok_or_else(|| TokenError::Malformed(format!("{text:?} has no fingerprint")))?;
        if fp.len() != 16 {
            return Err(TokenError::Malformed(format!("{text:?}: the fingerprint is not 16 hex digits")));
        }
        let fingerprint = u64::from_str_radix(fp, 16)
            .map_err(|_| TokenError::Malformed(format!("{text:?}: the fingerprint is not 16 hex digits")))?;
        let body = parts.next().unwrap_or_default();
        let mut t = ReadToken { fingerprint, next: BTreeMap::new() };
        if body.is_empty() {
            return Ok(t);
        }
        for pair in body.split('_') {
            let (p, o) = pair
                .split_once('-')
                .ok_or_else(|| TokenError::Malformed(format!("{text:?}: {pair:?} is not PARTITION-OFFSET")))?;
            let p: i32 = p.parse().map_err(|_| TokenError::Malformed(format!("{text:?}: bad partition {p:?}")))?;
            let o: i64 = o.parse().map_err(|_| TokenError::Malformed(format!("{text:?}: bad offset {o:?}")))?;
            if p < 0 || o < 0 {
                return Err(TokenError::Malformed(format!("{text:?}: negative partition or offset")));
            }
            t.raise(p, o);
        }
        Ok(t)
    }
}

impl fmt::Display for ReadToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{VERSION}.{:016x}.", self.fingerprint)?;
        for (i, (p, o)) in self.next.iter().enumerate() {
            if i > 0 {
                f.write_str("_")?;
            }
            write!(f, "{p}-{o}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for ReadToken {
    type Err = TokenError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ReadToken::parse(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_text_form_is_versioned_url_safe_and_sorted() {
        let t = ReadToken::of_deliveries(0x9f3c_2a1b_4d5e_6f70, [(3, 54), (0, 1199), (3, 10)]);
        assert_eq!(t.to_string(), "1.9f3c2a1b4d5e6f70.0-1200_3-55");
        assert_eq!(ReadToken::parse("1.9f3c2a1b4d5e6f70.0-1200_3-55").unwrap(), t);
        let empty = ReadToken::new(7, []);
        assert_eq!(empty.to_string(), "1.0000000000000007.");
        assert_eq!(ReadToken::parse(&empty.to_string()).unwrap(), empty);
    }

    #[test]
    fn bad_text_is_refused_with_the_reason() {
        for bad in ["", "x", "1", "1.zz", "1.0000000000000007.3", "1.0000000000000007.a-1", "1.0000000000000007.1--2"] {
            assert!(matches!(ReadToken::parse(bad), Err(TokenError::Malformed(_))), "{bad:?} accepted");
        }
        assert_eq!(ReadToken::parse("2.0000000000000007.0-1"), Err(TokenError::Version("2".into())));
    }

    #[test]
    fn merging_takes_the_later_offset_and_refuses_other_topics() {
        let a = ReadToken::new(1, [(0, 5), (1, 9)]);
        let b = ReadToken::new(1, [(1, 3), (2, 4)]);
        assert_eq!(a.merge(&b).unwrap(), ReadToken::new(1, [(0, 5), (1, 9), (2, 4)]));
        assert_eq!(a.merge(&ReadToken::new(2, [])), Err(TokenError::Mixed(1, 2)));
    }

    #[test]
    fn behind_names_each_partition_not_yet_covered() {
        let t = ReadToken::new(1, [(0, 5), (1, 9), (2, 1)]);
        let pos = |p: i32| match p {
            0 => Some(5),
            1 => Some(8),
            _ => None,
        };
        assert_eq!(t.behind(&pos), vec![(1, Some(8), 9), (2, None, 1)]);
        assert!(ReadToken::new(1, [(0, 0)]).behind(&|_| None).is_empty(), "offset 0 needs nothing");
    }

    #[test]
    fn the_fingerprint_tells_topics_and_clusters_apart() {
        let here = fingerprint("cluster-a", "p.log");
        assert_ne!(here, fingerprint("cluster-a", "q.log"));
        assert_ne!(here, fingerprint("cluster-b", "p.log"));
        assert_ne!(fingerprint("ab", "c"), fingerprint("a", "bc"), "the separator matters");
        let t = ReadToken::new(here, [(0, 1)]);
        assert!(t.check_fingerprint(here, "p.log").is_ok());
        assert!(matches!(t.check_fingerprint(1, "q.log"), Err(TokenError::OtherTopic { .. })));
    }

    proptest! {
        #[test]
        fn text_round_trips(fp in any::<u64>(), pos in proptest::collection::vec((0i32..1000, 0i64..i64::MAX), 0..20)) {
            let t = ReadToken::new(fp, pos);
            prop_assert_eq!(ReadToken::parse(&t.to_string()).unwrap(), t);
        }
    }
}
