//! Where record pages are read and built: a small pool of threads at a lower CPU priority
//! (`http.render_nice`), so that on a replica whose cores are busy the processor's batches
//! and commits go first and readers take the CPU that is left.
//!
//! A client paging records in a tight loop beside a loaded replica pinned to one core
//! (`scripts/bench-read-ab.sh`) costs the replica about 19 CPU-us per record served, most
//! of it the JSON of the page (the formatting of the embeddings' floats), and on the
//! writer's core that time came out of the commit path. The body is built here; so is the
//! read itself on SQLite (a reader connection's snapshot with the delta folded in: plain
//! blocking calls). A PostgreSQL read stays on the server's threads: a pooled
//! connection's I/O runs on the runtime that opened it, and the processor's commits must
//! never wait on a connection opened from a thread of low priority.

use std::collections::BTreeMap;
use std::sync::Mutex;

use tokio::runtime::Runtime;

use super::error::{ErrorCode, HttpError};

/// One pool per priority asked for (a replica asks for one; tests for several). Never
/// dropped: a runtime must not be dropped inside another.
static POOLS: Mutex<BTreeMap<i32, Option<&'static Runtime>>> = Mutex::new(BTreeMap::new());

fn pool(nice: i32) -> Option<&'static Runtime> {
    let mut pools = POOLS.lock().unwrap_or_else(|e| e.into_inner());
    *pools.entry(nice).or_insert_with(|| {
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        // From the priority of the thread that starts the pool (the server's), not of the
        // thread a pool thread is started from: the runtime starts its blocking threads
        // from its own (already lowered) threads, which they inherit, and adding `nice`
        // again put them at 19.
        let target = target_priority(nice);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .max_blocking_threads(threads)
            .thread_name("sluice-render")
            .enable_all()
            .on_thread_start(move || set_priority(target))
            .build()
            .inspect_err(|e| {
                tracing::warn!(error = %e, "cannot start the threads that build record pages; building them on the HTTP server's threads");
            })
            .ok()
            .map(|rt| &*Box::leak(Box::new(rt)))
    })
}

/// The calling thread's nice value plus `nice`, as `nice -n` does (at most 19).
fn target_priority(nice: i32) -> i32 {
    #[cfg(target_os = "linux")]
    return (current_nice() + nice).min(19);
    #[cfg(not(target_os = "linux"))]
    nice
}

/// Set the calling thread's nice value (Linux: per thread). A failure only leaves the
/// thread at the priority it inherited.
fn set_priority(target: i32) {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: a plain system call on the calling thread's own id; no pointers.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, target) };
        if rc != 0 {
            tracing::debug!(error = %std::io::Error::last_os_error(), target, "cannot lower a render thread's priority");
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = target;
}

/// The calling thread's nice value (Linux).
#[cfg(target_os = "linux")]
fn current_nice() -> i32 {
    // SAFETY: a plain system call on the calling thread's own id; no pointers.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

/// The pool of priority `nice`, if pages go to one (`nice` above 0, and the pool started).
fn low_priority_pool(nice: i32) -> Option<&'static Runtime> {
    (nice > 0).then(|| pool(nice)).flatten()
}

fn task_failed(what: &str, e: tokio::task::JoinError) -> HttpError {
    HttpError::new(ErrorCode::Internal, format!("{what} failed: {e}"))
}

/// Run `build` (the body of a response) on the pool of priority `nice`; with `nice` 0, or
/// without the pool, right here.
pub(crate) async fn at_low_priority<T: Send + 'static>(
    nice: i32,
    build: impl FnOnce() -> T + Send + 'static,
) -> Result<T, HttpError> {
    match low_priority_pool(nice) {
        Some(rt) => rt.spawn_blocking(build).await.map_err(|e| task_failed("building the response", e)),
        None => Ok(build()),
    }
}

/// Run `work` (a read that holds no connection of its own across calls: SQLite's) on the
/// pool of priority `nice`, its blocking calls on the pool's blocking threads; with `nice`
/// 0, or without the pool, right here.
pub(crate) async fn read_at_low_priority<T: Send + 'static>(
    nice: i32,
    work: impl std::future::Future<Output = T> + Send + 'static,
) -> Result<T, HttpError> {
    match low_priority_pool(nice) {
        Some(rt) => rt.spawn(work).await.map_err(|e| task_failed("reading the page", e)),
        None => Ok(work.await),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn bodies_are_built_at_the_lower_priority_and_the_server_keeps_its_own() {
        let own = current_nice();
        assert_eq!(at_low_priority(7, current_nice).await.unwrap(), (own + 7).min(19));
        assert_eq!(current_nice(), own, "the server's thread keeps its priority");
        // 0: built on the calling thread.
        assert_eq!(at_low_priority(0, current_nice).await.unwrap(), own);
        // A read's blocking calls run on the pool's blocking threads, at its priority, also
        // those the pool starts from its own threads (several at once, so that new ones
        // are started while others are busy).
        for _ in 0..3 {
            let read = read_at_low_priority(7, async {
                let calls: Vec<_> = (0..4)
                    .map(|_| {
                        tokio::task::spawn_blocking(|| {
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            current_nice()
                        })
                    })
                    .collect();
                let mut seen = Vec::new();
                for c in calls {
                    seen.push(c.await.unwrap());
                }
                seen
            });
            assert_eq!(read.await.unwrap(), vec![(own + 7).min(19); 4]);
        }
    }
}
