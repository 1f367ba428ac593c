//! A queue in front of SQLite's write lock, shared by every Sluice process that writes
//! one database file.
//!
//! SQLite's write lock has no queue: a connection that finds it taken sleeps (1, 2, 5 …
//! 100 ms) and tries again, and a replica that commits back to back releases it for a few
//! microseconds at a time. A short-lived writer — an operator's `functions attach`, a
//! `sluice offsets reset`, a second replica starting — can miss every gap for minutes
//! (a 1,000-cycle chaos run saw attaches fail with `database is locked` after a minute of
//! retries while two replicas committed). Every Sluice writer of a file therefore takes
//! its turn here first, around each write transaction:
//!
//! - `<db>-write.lock` (the *turn*): held with `flock(LOCK_EX)` for the whole write
//!   transaction;
//! - `<db>-queue.lock` (the *gate*): a writer checks the gate (shared) before it tries
//!   the turn; one that finds the turn taken holds the gate exclusively until it gets the
//!   turn, so no newcomer passes it. A waiter therefore waits for at most the transaction
//!   in progress (plus one that had passed the gate just before), not for a stream of
//!   them.
//!
//! `flock` locks belong to the open file description and go away with the process (a
//! kill -9 releases them); they are never taken on the database file itself, whose POSIX
//! locks SQLite owns (closing any descriptor of it would drop them). Processes that are
//! not Sluice (an `sqlite3` shell) do not queue here and still meet SQLite's own busy
//! timeout, as before.
//!
//! A waiter stopped (SIGSTOP) while it holds the gate would close it for everyone. A live
//! gate holder takes a free turn within a poll, and opens the gate as soon as it has it;
//! so a gate that stays closed while the turn is seen *free* for [`GATE_PATIENCE`] has a
//! holder that is not there, and the others pass it by until it opens again. A gate that
//! stays closed because the turn is held (its holder waits, rightly, behind a long or
//! stopped transaction) is never passed by: that was how a 1,000-cycle chaos run still
//! starved operators behind a replica frozen mid-commit, when the gate was passed by
//! after a second closed whatever the turn did.

use std::fs::{File, OpenOptions, TryLockError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::rows::BACKEND;
use crate::sysdb::error::{Result, SysdbError};

/// How often a waiter looks at the turn again. A wait is a poll, not a blocking `flock`,
/// so that it has a deadline; at this interval it costs nothing measurable and adds at
/// most this much to a turn handed over.
const POLL: Duration = Duration::from_micros(500);

/// How long the gate may stay closed before a writer stops honouring it (see the module
/// comment): longer than any turn a live waiter waits for at the default batch sizes.
pub(super) const GATE_PATIENCE: Duration = Duration::from_secs(1);

/// The two lock files of one database file, opened once per writer connection.
pub(super) struct WriteQueue {
    turn: File,
    gate: File,
    /// Since when the turn has been seen free while the gate stayed closed, without the
    /// gate being seen open since (reset when it opens).
    free_behind_closed_gate: Mutex<Option<Instant>>,
}

/// This process's turn at the write lock; released when dropped.
pub(super) struct Turn<'a> {
    queue: &'a WriteQueue,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        // Closing the file would release it too; an unlock that fails leaves the lock to
        // the descriptor's close at exit, which other writers outwait (their deadline).
        let _ = self.queue.turn.unlock();
    }
}

impl WriteQueue {
    /// Open (creating if needed) the lock files beside the database at `db_path`.
    pub(super) fn open(db_path: &str) -> Result<WriteQueue> {
        Ok(WriteQueue {
            turn: open_lock_file(&format!("{db_path}-write.lock"))?,
            gate: open_lock_file(&format!("{db_path}-queue.lock"))?,
            free_behind_closed_gate: Mutex::new(None),
        })
    }

    /// Wait for this writer's turn, at most `timeout`; `Unavailable` after it (the caller
    /// retries like any busy database).
    pub(super) fn turn(&self, timeout: Duration) -> Result<Turn<'_>> {
        let started = Instant::now();
        let mut holding_gate = false;
        loop {
            if holding_gate {
                if self.try_turn()? {
                    let _ = self.gate.unlock();
                    return Ok(self.taken(started));
                }
            } else if self.gate_open()? {
                let got = self.try_turn();
                let _ = self.gate.unlock();
                if got? {
                    return Ok(self.taken(started));
                }
                // The turn is taken: close the gate behind the writer that holds it, unless
                // another waiter already did (then wait behind that one).
                holding_gate = try_flock(&self.gate, false, "queue")?;
            } else if self.try_turn()? {
                // The turn is free while a waiter holds the gate: that waiter takes it
                // within a poll, unless it is stopped.
                if self.gate_abandoned() {
                    return Ok(self.taken(started));
                }
                let _ = self.turn.unlock();
            }
            if started.elapsed() >= timeout {
                if holding_gate {
                    let _ = self.gate.unlock();
                }
                return Err(SysdbError::Unavailable {
                    backend: BACKEND,
                    message: format!(
                        "another writer of this SQLite file held the write lock for {timeout:?} \
                         (a replica busy or stopped mid-commit); the write is retried"
                    ),
                });
            }
            std::thread::sleep(POLL);
        }
    }

    fn taken(&self, started: Instant) -> Turn<'_> {
        let waited = started.elapsed();
        if waited >= Duration::from_millis(100) {
            tracing::debug!(waited_ms = waited.as_millis() as u64, "sqlite write lock: turn taken after waiting");
        }
        Turn { queue: self }
    }

    fn try_turn(&self) -> Result<bool> {
        try_flock(&self.turn, false, "write")
    }

    /// Take the gate shared (the caller releases it) if no waiter holds it closed.
    fn gate_open(&self) -> Result<bool> {
        let open = try_flock(&self.gate, true, "queue")?;
        if open {
            *self.free_behind_closed_gate.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        Ok(open)
    }

    /// The turn was just found free behind the closed gate: whether it has been found so
    /// for [`GATE_PATIENCE`] (the gate's holder is not taking it).
    fn gate_abandoned(&self) -> bool {
        let mut since = self.free_behind_closed_gate.lock().unwrap_or_else(|p| p.into_inner());
        since.get_or_insert_with(Instant::now).elapsed() >= GATE_PATIENCE
    }
}

fn open_lock_file(path: &str) -> Result<File> {
    // `flock` needs no write permission: a file another user created is locked read-only.
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .or_else(|_| File::open(path))
        .map_err(|e| SysdbError::Unavailable {
            backend: BACKEND,
            message: format!(
                "opening the write queue's lock file {path:?}: {e}; the directory of the sysdb must be writable \
                 by every process that writes it (SQLite's -wal and -shm files live there too)"
            ),
        })
}

/// `flock` without blocking: `Ok(false)` when another open file holds it.
fn try_flock(file: &File, shared: bool, which: &str) -> Result<bool> {
    let tried = if shared { file.try_lock_shared() } else { file.try_lock() };
    match tried {
        Ok(()) => Ok(true),
        Err(TryLockError::WouldBlock) => Ok(false),
        Err(TryLockError::Error(e)) => Err(SysdbError::Unavailable {
            backend: BACKEND,
            message: format!("locking the sysdb's {which} lock file: {e}"),
        }),
    }
}
