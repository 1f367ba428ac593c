//! The checkpoint thread: the WAL copied into the database file off the writer's path.

use std::sync::Mutex;
use std::time::Duration;

use rusqlite::Connection;

use super::store::{configure, open_connection, Inner, BACKEND};
use crate::sysdb::error::{Result, SysdbError};

/// The checkpoint thread copies pages, it does not need to keep them.
pub(crate) const CHECKPOINTER_CACHE_KIB: i64 = 2 * 1024;

/// How often the checkpoint thread checkpoints the WAL.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL pages (256 MiB at 16 KiB pages) past which the checkpoint thread follows its
/// passive checkpoint with a RESTART one, so that the next writer starts the WAL over.
///
/// Passive checkpoints alone never let the WAL start over under steady load: a writer
/// restarts it only if every frame was checkpointed when its transaction began, and a
/// commit lands during nearly every checkpoint. The WAL then grew to
/// `WAL_AUTOCHECKPOINT_PAGES` and the writer's own checkpoint and the truncation that
/// followed stalled every partition for 200-300 ms, a few seconds apart (the p99
/// end-to-end latency). A RESTART checkpoint right after a passive one has only the last
/// few frames to copy; the checkpoint thread runs it holding this process's writer
/// connection ([`spawn_checkpointer`]).
const WAL_RESTART_PAGES: i64 = 16_384;

/// How long the RESTART checkpoint waits for the write lock and for readers to leave the
/// WAL before giving up until the next interval (a long read elsewhere must not hold the
/// writers up).
const WAL_RESTART_BUSY: Duration = Duration::from_millis(200);

/// Checkpoint the WAL from a connection of its own, off the writer's path. A checkpoint
/// run by the committing connection (SQLite's automatic one) copies the WAL into the
/// database file and fsyncs it while every batch waits for the writer: with a 10,000-page
/// WAL that stalled all partitions for up to a second (the p99 of the latency benchmark).
/// PASSIVE never blocks the writer or readers; the writer's automatic checkpoint stays on
/// at a high mark as a safety net should this thread fall behind.
///
/// Past [`WAL_RESTART_PAGES`] the thread runs a RESTART checkpoint while it holds the
/// process's writer connection (`inner`), between two group commits, so that it has
/// SQLite's write lock at once and finds only what the last commit added; and it fsyncs
/// the database file itself first, so that the RESTART's fsync finds little to write
/// ([`Checkpointer::restart`]). Measured at 70,000 records/s (W1 records, one core), the
/// RESTART held every partition up for 60-120 ms about once a second before: it took
/// the lock through SQLite's busy handler (which sleeps 1, 2, 5, 10... ms between tries,
/// on both sides), and its fsync wrote back all that the passive checkpoints had copied
/// since the last one (a passive checkpoint that does not reach the WAL's end does not
/// sync the database file): 68 ms for one second's pages. Now 0-36 ms; paced at 60,000
/// records/s, the p99 from the broker's append fell from 138-603 to 54-70 ms in
/// interleaved runs (`docs/bench/history.md`, "The RESTART checkpoint and the delta's
/// merges held every partition up").
pub(super) fn spawn_checkpointer(path: &str, inner: std::sync::Weak<Inner>) -> Result<()> {
    let conn = open_connection(path)?;
    configure(&conn, path)?;
    conn.pragma_update(None, "cache_size", -CHECKPOINTER_CACHE_KIB)?;
    conn.busy_timeout(WAL_RESTART_BUSY)?;
    let checkpointer = Checkpointer { conn };
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            let mut warned = false;
            loop {
                std::thread::sleep(CHECKPOINT_INTERVAL);
                // The sysdb was dropped: nothing left to checkpoint.
                let Some(strong) = inner.upgrade() else { break };
                let mut outcome = checkpointer.checkpoint("PASSIVE");
                if matches!(outcome, Ok((_, frames, _)) if frames > WAL_RESTART_PAGES) {
                    if let Some(writer) = strong.writer.as_ref() {
                        outcome = checkpointer.restart(writer);
                    }
                }
                drop(strong);
                match outcome {
                    Ok(_) => warned = false,
                    Err(e) if !warned => {
                        tracing::warn!(error = %e, "background WAL checkpoint failed; retrying (the writer's automatic checkpoint remains)");
                        warned = true;
                    }
                    Err(_) => {}
                }
            }
        })
        .map(|_| ())
        .map_err(|e| SysdbError::Unavailable { backend: BACKEND, message: format!("cannot start the checkpoint thread: {e}") })
}

/// `PRAGMA wal_checkpoint`'s answer: (busy, frames in the WAL, frames checkpointed).
type CheckpointOutcome = (i64, i64, i64);

/// The checkpoint thread's connection. It syncs the database file through this
/// connection's own file handle, never through a descriptor of its own: on Linux,
/// closing any descriptor of a file drops every POSIX lock the process holds on it,
/// including SQLite's (SQLite's "How To Corrupt An SQLite Database File", 2.2).
struct Checkpointer {
    conn: Connection,
}

impl Checkpointer {
    fn checkpoint(&self, mode: &str) -> Result<CheckpointOutcome> {
        Ok(self
            .conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?)
    }

    /// Once the WAL is long: another passive checkpoint (it copies what was committed
    /// during the last one), a sync of the database file (else the RESTART would write
    /// back every page the passive checkpoints copied, holding the write lock), then the
    /// RESTART checkpoint, holding this process's `writer` connection.
    fn restart(&self, writer: &Mutex<Connection>) -> Result<CheckpointOutcome> {
        let began = std::time::Instant::now();
        self.checkpoint("PASSIVE")?;
        sync_database_file(&self.conn)?;
        let before = began.elapsed();
        let writer = writer.lock().unwrap_or_else(|p| p.into_inner());
        let locked = began.elapsed();
        let outcome = self.checkpoint("RESTART");
        drop(writer);
        tracing::debug!(
            before_ms = before.as_millis() as u64,
            writer_wait_ms = (locked - before).as_millis() as u64,
            restart_ms = (began.elapsed() - locked).as_millis() as u64,
            outcome = ?outcome.as_ref().ok(),
            "WAL restart checkpoint"
        );
        outcome
    }
}

/// Sync the main database file of `conn` through SQLite's own handle of it
/// (`SQLITE_FCNTL_FILE_POINTER`, then the VFS's `xSync`), so that no second descriptor of
/// the file is ever opened or closed by this process.
fn sync_database_file(conn: &Connection) -> Result<()> {
    use rusqlite::ffi;
    let failed = |what: &str, rc: i32| SysdbError::Unavailable {
        backend: BACKEND,
        message: format!("syncing the database file before a checkpoint: {what} returned SQLite code {rc}"),
    };
    let mut file: *mut ffi::sqlite3_file = std::ptr::null_mut();
    // SAFETY: `conn` is borrowed for this call, so its handle is live; the file control
    // writes the connection's `sqlite3_file*` of the main database (or null) into `file`.
    let rc = unsafe {
        ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            ffi::SQLITE_FCNTL_FILE_POINTER,
            (&mut file as *mut *mut ffi::sqlite3_file).cast(),
        )
    };
    if rc != ffi::SQLITE_OK {
        return Err(failed("SQLITE_FCNTL_FILE_POINTER", rc));
    }
    // SAFETY: a non-null `file` is the connection's open database file, owned by SQLite
    // and kept open while the connection is (it is, borrowed here); its methods are
    // called from the thread that owns the connection, as SQLite itself would.
    let rc = unsafe {
        match file.as_ref().and_then(|f| f.pMethods.as_ref()).and_then(|m| m.xSync) {
            Some(x_sync) => x_sync(file, ffi::SQLITE_SYNC_NORMAL),
            None => ffi::SQLITE_OK,
        }
    };
    if rc != ffi::SQLITE_OK {
        return Err(failed("xSync", rc));
    }
    Ok(())
}
