//! Fail points for crash tests: `SLUICE_FAILPOINT=NAME:N` aborts the process (no cleanup,
//! like `kill -9`) the N-th time the named point is reached. Unset in production; the
//! check is one relaxed atomic load after the first call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static SPEC: OnceLock<Option<(String, u64)>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

fn spec() -> &'static Option<(String, u64)> {
    SPEC.get_or_init(|| {
        let v = std::env::var("SLUICE_FAILPOINT").ok()?;
        let (name, n) = v.split_once(':').unwrap_or((v.as_str(), "1"));
        Some((name.to_string(), n.parse().unwrap_or(1)))
    })
}

/// Abort if `name` is the configured fail point and this is its N-th hit.
pub fn hit(name: &str) {
    if let Some((n, at)) = spec() {
        if n == name && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *at {
            eprintln!("sluice: fail point {name} reached (hit {at}): aborting");
            std::process::abort();
        }
    }
}
