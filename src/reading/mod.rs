//! Reads that include a write (docs/reading.md). A write hands back a read token (the
//! offsets after the records it had acknowledged, `crate::token`); a read "at least" a
//! token first waits until the sysdb's position of every partition of the token covers
//! it, then reads. Since records and their partition's position commit in one transaction
//! (docs/design.md invariant 2), a covered position means the records are there.
//!
//! Waiting is bounded (`--wait`, `wait_ms`) and never answers stale: it ends in
//! [`Covered`], or in [`ReadError::Behind`] naming the partition, its position, the
//! token's offset and the gap, or at once in [`ReadError::Halted`] when a partition it
//! waits for is halted. Inside a replica, waiters watch the [`board::Board`] (woken by
//! the replica's own commits, and by one shared poll of the sysdb for the partitions
//! other replicas own); the CLI polls the position rows itself.
//!
//! - `freshness.rs`: how fresh one collection is.

pub mod board;
pub mod freshness;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kafka::cluster::MetadataClient;
use crate::kafka::{ClientSettings, KafkaError};
use crate::sysdb::{Sysdb, SysdbError};
use crate::token::{fingerprint, ReadToken, TokenError};
use board::{Board, Seen};

/// How long a read waits for its token when the caller does not say.
pub const DEFAULT_WAIT: Duration = Duration::from_secs(10);
/// The longest wait a caller may ask for.
pub const MAX_WAIT: Duration = Duration::from_secs(300);
/// How often a waiter without a board (the CLI) reads the position rows.
const CLI_POLL: Duration = Duration::from_millis(100);

/// What a read must include.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReadLevel {
    /// What the sysdb has committed now (and what any `--at-least` token asks for).
    #[default]
    Committed,
    /// Everything in the log when the read starts: waits until the sysdb reaches the high
    /// watermarks read first (real-time recency).
    Latest,
}

/// A read's wish: at least these tokens (merged), at this level, waiting at most `wait`.
#[derive(Debug, Clone, Default)]
pub struct ReadWish {
    pub at_least: Vec<String>,
    pub level: ReadLevel,
    pub wait: Option<Duration>,
}

impl ReadWish {
    /// Whether the read may start at once, without reading any position first.
    pub fn is_plain(&self) -> bool {
        self.at_least.is_empty() && self.level == ReadLevel::Committed
    }

    pub fn wait(&self) -> Duration {
        self.wait.unwrap_or(DEFAULT_WAIT).min(MAX_WAIT)
    }
}

/// Why a read did not start. The messages say what to do.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The token is malformed, of an unknown version or of another topic or cluster:
    /// the caller's mistake (HTTP 400, exit 2).
    #[error(transparent)]
    Token(#[from] TokenError),
    /// The wait ended before the sysdb covered the token (HTTP 504, exit 1).
    #[error(
        "partition {partition} of {topic} has not reached the read token after waiting {waited_ms} ms: its sysdb position is {position}, the token asks for {wanted} ({gap} records to go); retry, wait longer (--wait, wait_ms), or see `sluice offsets show`"
    )]
    Behind { topic: String, partition: i32, position: i64, wanted: i64, gap: i64, waited_ms: u64 },
    /// A partition the read waits for is halted: it will not move until an operator acts
    /// (HTTP 503, exit 1).
    #[error(
        "partition {partition} of {topic} is halted and will not reach the read token (position {position}, the token asks for {wanted}): {reason}; see `sluice offsets show`"
    )]
    Halted { topic: String, partition: i32, position: i64, wanted: i64, reason: String },
    #[error(transparent)]
    Sysdb(#[from] SysdbError),
    /// The broker could not be asked (the cluster id of a token, the high watermarks of
    /// `latest`).
    #[error(transparent)]
    Broker(#[from] KafkaError),
}

/// A read's wait is over and its state covers what it asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Covered {
    /// How long the read waited.
    pub waited: Duration,
    /// What it waited for (empty for a plain read).
    pub token: Option<ReadToken>,
}

/// The log topic's cluster fingerprint for tokens: asked of the broker once per process.
#[derive(Debug)]
pub struct TokenSource {
    settings: ClientSettings,
    topic: String,
    fingerprint: tokio::sync::OnceCell<u64>,
}

impl TokenSource {
    pub fn new(settings: ClientSettings, topic: String) -> Arc<TokenSource> {
        Arc::new(TokenSource { settings, topic, fingerprint: tokio::sync::OnceCell::new() })
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The fingerprint of the log topic on this cluster (one broker request, then cached).
    pub async fn fingerprint(&self) -> Result<u64, KafkaError> {
        self.fingerprint
            .get_or_try_init(|| async {
                let settings = self.settings.clone();
                let cluster = tokio::task::spawn_blocking(move || MetadataClient::new(&settings, None)?.cluster_id())
                    .await
                    .map_err(|e| KafkaError::Broker { what: "cluster id".into(), message: e.to_string() })??;
                Ok(fingerprint(&cluster, &self.topic))
            })
            .await
            .copied()
    }

    /// The token of records delivered at `(partition, offset)`.
    pub async fn token_of(&self, delivered: impl IntoIterator<Item = (i32, i64)>) -> Result<ReadToken, KafkaError> {
        Ok(ReadToken::of_deliveries(self.fingerprint().await?, delivered))
    }

    /// Parse and merge the tokens the caller gave, refusing any of another topic.
    pub async fn parse(&self, texts: &[String]) -> Result<Option<ReadToken>, ReadError> {
        let mut merged: Option<ReadToken> = None;
        for t in texts.iter().flat_map(|t| t.split(',')).filter(|t| !t.trim().is_empty()) {
            let t = ReadToken::parse(t)?;
            merged = Some(match merged {
                None => t,
                Some(m) => m.merge(&t)?,
            });
        }
        if let Some(t) = &merged {
            t.check_fingerprint(self.fingerprint().await?, &self.topic)?;
        }
        Ok(merged)
    }

    /// `latest`: the high watermarks of `partitions` (all of the log topic's when `None`)
    /// as a token.
    pub async fn latest(&self, partitions: Option<Vec<i32>>) -> Result<ReadToken, KafkaError> {
        let fp = self.fingerprint().await?;
        let settings = self.settings.clone();
        let topic = self.topic.clone();
        let highs = tokio::task::spawn_blocking(move || -> Result<Vec<(i32, i64)>, KafkaError> {
            let md = MetadataClient::new(&settings, None)?;
            let partitions = match partitions {
                Some(p) => p,
                None => (0..md.partition_count(&topic)?).collect(),
            };
            partitions.into_iter().map(|p| Ok((p, md.watermarks(&topic, p)?.1))).collect()
        })
        .await
        .map_err(|e| KafkaError::Broker { what: "high watermarks".into(), message: e.to_string() })??;
        Ok(ReadToken::new(fp, highs))
    }
}

/// Wait until the sysdb covers what `wish` asks for. `partitions`: the partitions the
/// read touches (for `latest`; `None` = all). `board`: the replica's board when the read
/// is served by a replica, `None` in the CLI.
pub async fn wait_for(
    sysdb: &Sysdb,
    tokens: &TokenSource,
    wish: &ReadWish,
    partitions: Option<Vec<i32>>,
    board: Option<&Board>,
) -> Result<Covered, ReadError> {
    let start = Instant::now();
    if wish.is_plain() {
        return Ok(Covered { waited: Duration::ZERO, token: None });
    }
    let mut token = tokens.parse(&wish.at_least).await?;
    if wish.level == ReadLevel::Latest {
        let latest = tokens.latest(partitions).await?;
        token = Some(match token {
            None => latest,
            Some(t) => t.merge(&latest)?,
        });
    }
    let Some(token) = token else {
        return Ok(Covered { waited: Duration::ZERO, token: None });
    };
    let deadline = start + wish.wait();
    // The first look reads the sysdb itself: most reads are covered already.
    let mut seen = read_seen(sysdb, tokens.topic()).await?;
    let mut rx = board.map(Board::subscribe);
    loop {
        match judge(&token, &seen, tokens.topic(), start) {
            Judged::Covered => return Ok(Covered { waited: start.elapsed(), token: Some(token) }),
            Judged::Halted(e) => return Err(e),
            Judged::Behind(e) if Instant::now() >= deadline => return Err(e),
            Judged::Behind(_) => {}
        }
        let until = tokio::time::Instant::from_std(deadline);
        seen = match (board, rx.as_mut()) {
            (Some(b), Some(rx)) => {
                b.want_poll();
                tokio::select! {
                    r = rx.changed() => match r {
                        Ok(()) => rx.borrow_and_update().clone(),
                        // The replica is stopping: a last look of our own.
                        Err(_) => read_seen(sysdb, tokens.topic()).await?,
                    },
                    _ = tokio::time::sleep_until(until) => read_seen(sysdb, tokens.topic()).await?,
                }
            }
            _ => {
                tokio::time::sleep_until(until.min(tokio::time::Instant::now() + CLI_POLL)).await;
                read_seen(sysdb, tokens.topic()).await?
            }
        };
    }
}

async fn read_seen(sysdb: &Sysdb, topic: &str) -> Result<Seen, SysdbError> {
    let states = sysdb.partition_states(topic).await?;
    let positions: HashMap<i32, i64> = states.iter().map(|s| (s.partition, s.next_offset)).collect();
    let halted = states.into_iter().filter_map(|s| s.halted_reason.map(|r| (s.partition, r))).collect();
    Ok(Seen { positions, halted })
}

enum Judged {
    Covered,
    Behind(ReadError),
    Halted(ReadError),
}

/// Covered, or the first partition behind (a halted one first: it will not move).
fn judge(token: &ReadToken, seen: &Seen, topic: &str, start: Instant) -> Judged {
    let behind = token.behind(&|p| seen.positions.get(&p).copied());
    if let Some(&(partition, position, wanted)) = behind.iter().find(|(p, _, _)| seen.halted.contains_key(p)) {
        return Judged::Halted(ReadError::Halted {
            topic: topic.to_string(),
            partition,
            position: position.unwrap_or(0),
            wanted,
            reason: seen.halted[&partition].clone(),
        });
    }
    match behind.first() {
        None => Judged::Covered,
        Some(&(partition, position, wanted)) => {
            let position = position.unwrap_or(0);
            Judged::Behind(ReadError::Behind {
                topic: topic.to_string(),
                partition,
                position,
                wanted,
                gap: wanted - position,
                waited_ms: start.elapsed().as_millis() as u64,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seen(pos: &[(i32, i64)], halted: &[(i32, &str)]) -> Seen {
        Seen {
            positions: pos.iter().copied().collect(),
            halted: halted.iter().map(|(p, r)| (*p, r.to_string())).collect(),
        }
    }

    #[test]
    fn a_token_is_covered_only_when_every_partition_reached_it() {
        let t = ReadToken::new(1, [(0, 10), (2, 5)]);
        let now = Instant::now();
        assert!(matches!(judge(&t, &seen(&[(0, 10), (2, 7)], &[]), "l", now), Judged::Covered));
        match judge(&t, &seen(&[(0, 10), (2, 4)], &[]), "l", now) {
            Judged::Behind(ReadError::Behind { partition: 2, position: 4, wanted: 5, gap: 1, .. }) => {}
            _ => panic!("partition 2 is one record behind"),
        }
        match judge(&t, &seen(&[(0, 3)], &[(2, "gap")]), "l", now) {
            Judged::Halted(ReadError::Halted { partition: 2, position: 0, wanted: 5, .. }) => {}
            _ => panic!("a halted partition answers at once, before the others"),
        }
        assert!(
            matches!(judge(&t, &seen(&[(0, 10), (2, 5)], &[(2, "gap")]), "l", now), Judged::Covered),
            "a halted partition that already covers the token does not stop the read"
        );
    }
}
