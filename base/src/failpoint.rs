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

/// An error-injection point: true (once) when the configured fail point is `fail_<name>`
/// and this is its N-th hit; the caller then acts as if the operation had failed.
pub fn fail(name: &str) -> bool {
    if let Some((n, at)) = spec() {
        if n.strip_prefix("fail_") == Some(name) && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *at {
            eprintln!("sluice: fail point fail_{name} reached (hit {at}): failing the operation");
            return true;
        }
    }
    false
}

/// Abort if `name` is the configured fail point and this is its N-th hit.
///
/// A configured name of the form `sleep_<name>` instead sleeps for
/// `SLUICE_FAILPOINT_SLEEP_MS` (default 5000) at that hit: the calling task stalls (a
/// stalled worker for zombie tests). On the multi-threaded runtime the sleep runs in
/// `block_in_place`, so the runtime first hands this thread's other tasks (the HTTP
/// server, the router) to another thread: only the caller stalls, as a wedged worker
/// would.
pub fn hit(name: &str) {
    if let Some((n, at)) = spec() {
        let sleeping = n.strip_prefix("sleep_") == Some(name);
        if (n == name || sleeping) && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *at {
            if sleeping {
                let ms = std::env::var("SLUICE_FAILPOINT_SLEEP_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
                eprintln!("sluice: fail point sleep_{name} reached (hit {at}): sleeping {ms} ms");
                let sleep = || std::thread::sleep(std::time::Duration::from_millis(ms));
                match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
                    Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(sleep),
                    _ => sleep(),
                }
                eprintln!("sluice: fail point sleep_{name}: awake");
                return;
            }
            eprintln!("sluice: fail point {name} reached (hit {at}): aborting");
            std::process::abort();
        }
    }
}
