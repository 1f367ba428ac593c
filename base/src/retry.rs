//! The one retry policy of the replica: exponential backoff with jitter, from a minimum
//! delay doubling up to a maximum, never giving up by itself. Every loop that waits on
//! Kafka or the sysdb takes its delays from here and bounds itself (by attempts, by time
//! or by a cancellation token) where giving up is right.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Delays from `min`, doubling, jittered, capped at `max`; endless.
pub fn backoff(min: Duration, max: Duration) -> impl Iterator<Item = Duration> + Send {
    ExponentialBuilder::new().with_jitter().with_min_delay(min).with_max_delay(max).without_max_times().build()
}

/// The usual delays: 100 ms up to 5 s.
pub fn default_backoff() -> impl Iterator<Item = Duration> + Send {
    backoff(Duration::from_millis(100), Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_to_the_cap_and_never_end() {
        let delays: Vec<Duration> = backoff(Duration::from_millis(100), Duration::from_secs(1)).take(50).collect();
        assert_eq!(delays.len(), 50, "the policy never gives up by itself");
        // Jitter adds at most the delay itself on top.
        assert!(delays.iter().all(|d| *d >= Duration::from_millis(100) && *d <= Duration::from_secs(2)), "{delays:?}");
        assert!(delays[10..].iter().all(|d| *d >= Duration::from_secs(1)), "capped delays reached: {delays:?}");
    }
}
