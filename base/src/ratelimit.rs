//! Rate limiting for log lines that can repeat once per record (a flood of bad input
//! must not flood the logs): at most `burst` lines per window per key; the first line
//! after a window with suppressed lines says how many were suppressed.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub struct RateLimiter {
    window: Duration,
    burst: u32,
    state: Mutex<BTreeMap<&'static str, (Instant, u32, u64)>>,
}

/// Whether to log now, and how many lines of this key were suppressed before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Log { suppressed: u64 },
    Suppress,
}

impl RateLimiter {
    pub const fn new(window: Duration, burst: u32) -> Self {
        RateLimiter { window, burst, state: Mutex::new(BTreeMap::new()) }
    }

    pub fn check(&self, key: &'static str) -> Verdict {
        self.check_at(key, Instant::now())
    }

    fn check_at(&self, key: &'static str, now: Instant) -> Verdict {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let e = st.entry(key).or_insert((now, 0, 0));
        if now.duration_since(e.0) >= self.window {
            let suppressed = e.2;
            *e = (now, 1, 0);
            return Verdict::Log { suppressed };
        }
        if e.1 < self.burst {
            e.1 += 1;
            Verdict::Log { suppressed: 0 }
        } else {
            e.2 += 1;
            Verdict::Suppress
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_suppresses_then_reports() {
        let l = RateLimiter::new(Duration::from_secs(1), 3);
        let t = Instant::now();
        for _ in 0..3 {
            assert_eq!(l.check_at("k", t), Verdict::Log { suppressed: 0 });
        }
        assert_eq!(l.check_at("k", t), Verdict::Suppress);
        assert_eq!(l.check_at("k", t), Verdict::Suppress);
        assert_eq!(l.check_at("other", t), Verdict::Log { suppressed: 0 });
        assert_eq!(l.check_at("k", t + Duration::from_secs(2)), Verdict::Log { suppressed: 2 });
    }
}
