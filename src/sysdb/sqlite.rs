//! SQLite backend: one file in WAL mode (the embedded default), or `:memory:` for tests.
//!
//! rusqlite is blocking, so every call runs on `tokio::task::spawn_blocking` with the
//! connection behind a `std::sync::Mutex`: one writer connection per process, plus one
//! reader connection for a file database (WAL readers never block the writer and vice
//! versa, so admin reads do not queue behind a batch commit). Several processes may share
//! the file: writes take the database lock up front (`BEGIN IMMEDIATE`) and wait for it
//! up to `busy_timeout`; a writer that still cannot get it gets `Unavailable` (retry).
//! What one file supports and what `synchronous = NORMAL` can cost: `docs/sqlite.md`.
//!
//! The compare-and-set of [`commit_batch`](SqliteSysdb::commit_batch) reads the
//! partition's `next_offset` *inside* the `BEGIN IMMEDIATE` transaction, i.e. while
//! holding the only write lock of the database: no other connection, in this process or
//! another, can move the position between the read and the commit.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OptionalExtension, TransactionBehavior};

use super::codec::{decode_record, encode_embedding, encode_metadata};
use super::schema;
use super::{
    now_ms, BatchCommit, CollectionRow, CommitReport, DlqReplayRow, GapRow, PartitionState, ResetRow, Result,
    SysdbError,
};
use crate::config::SqliteConfig;
use crate::positions::PositionDelta;
use crate::record::Record;
use values::{RECORDS_WITH_VALUES, RECORD_COLUMNS};

mod functions;
mod reads;
mod stats;
mod values;

pub use stats::SqliteStats;

const BACKEND: &str = "sqlite";

/// How long a statement waits for another connection's lock before `SQLITE_BUSY`.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page size of a new database file.
const PAGE_SIZE: i64 = 16 * 1024;

/// Page cache of the writer connection (negative = KiB): a batch of a few thousand
/// records touches several MiB of b-tree pages, and the 2 MiB default thrashes. Pages
/// it does not hold are read from the memory map below, not copied, so a larger cache
/// buys little: measured on W1 drains (600k records), 16 MiB against 64 MiB cost the
/// same CPU (median ratio 0.99 over 4 pairs) and lowered the peak RSS by about 56 MB.
pub(crate) const CACHE_SIZE_KIB: i64 = 16 * 1024;

/// Reads go through a memory map of the database file of up to this many bytes (2 GiB,
/// the most SQLite's default build maps): a page read is a memory access instead of a
/// 16 KiB copy out of the OS page cache. It matters where reads are scattered over a
/// file larger than the page cache above: a `record_counter` backfill of 482k records
/// (a ~1 GB database) took 2.3 s instead of 4.8 s. Writes still go through the WAL.
/// The mapped pages are the OS page cache (shared, reclaimable), but they count in the
/// process's RSS. An I/O error on a mapped read kills the process (SIGBUS) instead of
/// failing one statement; the sysdb is authoritative and a restarted replica resumes
/// from it, so that is a crash like any other.
const MMAP_SIZE: i64 = 2 * 1024 * 1024 * 1024;

/// Each reader connection (admin API, CLI, backfill scans) gets a smaller cache: the
/// processor reads through the writer.
pub(crate) const READER_CACHE_SIZE_KIB: i64 = 8 * 1024;

/// The checkpoint thread copies pages, it does not need to keep them.
pub(crate) const CHECKPOINTER_CACHE_KIB: i64 = 2 * 1024;

/// How often the checkpoint thread checkpoints the WAL.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);

/// WAL pages after which the committing connection checkpoints by itself (SQLite's
/// default is 1,000): a safety net behind the checkpoint thread, 640 MiB at 16 KiB
/// pages.
const WAL_AUTOCHECKPOINT_PAGES: i64 = 40_000;

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

/// Bytes the WAL file is cut back to when it starts over: above what it reaches between
/// RESTART checkpoints, so that steady load reuses the file's blocks instead of
/// truncating and growing it again (truncating 560 MiB took 200+ ms).
const WAL_SIZE_LIMIT: i64 = 320 << 20;

impl From<rusqlite::Error> for SysdbError {
    fn from(e: rusqlite::Error) -> Self {
        let retryable = matches!(
            e.sqlite_error_code(),
            Some(
                ErrorCode::DatabaseBusy
                    | ErrorCode::DatabaseLocked
                    | ErrorCode::ReadOnly
                    | ErrorCode::SystemIoFailure
                    | ErrorCode::CannotOpen
                    | ErrorCode::DiskFull
            )
        );
        // A value the database refuses (a string or blob over SQLite's length limit, a
        // constraint a value breaks, a type mismatch): another batch can succeed.
        let rejected = matches!(
            e.sqlite_error_code(),
            Some(ErrorCode::TooBig | ErrorCode::ConstraintViolation | ErrorCode::TypeMismatch)
        );
        if e.sqlite_error_code() == Some(ErrorCode::DiskFull) {
            SysdbError::Unavailable {
                backend: BACKEND,
                message: format!(
                    "disk full: {e}; free space on the file system that holds the sysdb (and its -wal file): \
                     nothing was written, the commit is retried"
                ),
            }
        } else if retryable {
            SysdbError::Unavailable { backend: BACKEND, message: e.to_string() }
        } else if rejected {
            SysdbError::Rejected { backend: BACKEND, message: e.to_string() }
        } else {
            SysdbError::Database { backend: BACKEND, message: e.to_string() }
        }
    }
}

struct Inner {
    /// `None` for a sysdb opened read-only (`open_existing`): every write is refused.
    writer: Option<Mutex<Connection>>,
    /// Batches waiting for the next group commit (taken by whoever holds `writer`).
    pending: Mutex<Vec<PendingCommit>>,
    /// Connections that only read (`query_only`), each used by one read at a time. Empty
    /// for `:memory:` (a second connection would open another, empty database): reads go
    /// to the writer there.
    readers: Vec<Mutex<Connection>>,
    /// Round robin over `readers`.
    next_reader: std::sync::atomic::AtomicUsize,
    /// The unmerged records delta, for the processor's reads (locked after `writer`).
    delta: Mutex<values::DeltaCache>,
    tuning: SqliteConfig,
    stats: Arc<SqliteStats>,
}

impl Inner {
    fn writer(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        let writer = self.writer.as_ref().ok_or_else(|| {
            SysdbError::Config(
                "this command opened the SQLite sysdb read-only and cannot change it (a bug: report it)".into(),
            )
        })?;
        // A panic while holding the lock poisons it; the connection itself is still
        // consistent (an open transaction was rolled back when it was dropped).
        Ok(writer.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

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
/// interleaved runs (`BENCHMARKS.md`).
fn spawn_checkpointer(path: &str, inner: std::sync::Weak<Inner>) -> Result<()> {
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

/// The SQLite sysdb. Cheap to clone (the connections are shared).
#[derive(Clone)]
pub struct SqliteSysdb {
    inner: Arc<Inner>,
}

fn is_memory(path: &str) -> bool {
    path.is_empty() || path == ":memory:"
}

fn configure(conn: &Connection, path: &str) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Takes effect only on a new, empty database (before WAL mode is set), else a no-op.
    // 16 KiB pages keep a record with an embedding of up to ~4,000 dims in its table page
    // instead of an overflow chain; see the measurements in `schema.rs`.
    conn.pragma_update(None, "page_size", PAGE_SIZE)?;
    if !is_memory(path) {
        let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            tracing::warn!(path, journal_mode = %mode, "SQLite refused WAL mode (network file system?); concurrent readers will block the writer");
        }
    }
    // synchronous=NORMAL in WAL mode: a commit is durable against a *process* crash (the
    // WAL is written before COMMIT returns) but not against power loss / an OS crash,
    // which may lose the last few commits (the WAL is fsynced only at checkpoints). That
    // is tolerable here because the sysdb is authoritative and the Kafka group offset is
    // committed only after the sysdb commit: after a power loss the sysdb is simply back
    // at an older, consistent position (records, log_positions and next_offset together)
    // and the replica re-reads the log from there. The database is never corrupted.
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "cache_size", -CACHE_SIZE_KIB)?;
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    // Checkpoints run on their own thread (`spawn_checkpointer`); the committing
    // connection checkpoints only past WAL_AUTOCHECKPOINT_PAGES instead of SQLite's 1000
    // (a batch of a few thousand records rewrites about as many 16 KiB pages, so the
    // default checkpointed after nearly every commit, inside the batch's time). The file
    // is cut back to WAL_SIZE_LIMIT when it starts over.
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    Ok(())
}

/// Settings of a reader connection: `query_only` (it cannot write, so it never takes the
/// write lock), its own smaller page cache, the same memory map and busy timeout.
fn configure_reader(conn: &Connection) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "cache_size", -READER_CACHE_SIZE_KIB)?;
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(())
}

/// Apply the missing migration steps in one write transaction (see `schema.rs`).
fn migrate(conn: &mut Connection) -> Result<()> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(schema::CREATE_SCHEMA_MIGRATIONS)?;
    let current: i64 = tx.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?;
    for step in schema::pending(schema::SQLITE, current, BACKEND)? {
        tx.execute_batch(step.sql)?;
        tx.execute(
            "INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES (?1, ?2, ?3)",
            params![step.version, step.description, now_ms()],
        )?;
        tracing::info!(version = step.version, description = step.description, "sqlite sysdb migrated");
    }
    tx.commit()?;
    Ok(())
}

fn open_connection(path: &str) -> Result<Connection> {
    Connection::open(path).map_err(|e| match SysdbError::from(e) {
        SysdbError::Unavailable { backend, message } => {
            SysdbError::Unavailable { backend, message: format!("opening {path:?}: {message}") }
        }
        SysdbError::Database { backend, message } => {
            SysdbError::Database { backend, message: format!("opening {path:?}: {message}") }
        }
        other => other,
    })
}

fn read_next_offset(conn: &Connection, topic: &str, partition: i32) -> Result<Option<i64>> {
    Ok(conn
        .prepare_cached("SELECT next_offset FROM partitions WHERE topic = ?1 AND partition = ?2")?
        .query_row(params![topic, partition], |r| r.get(0))
        .optional()?)
}

fn write_next_offset(conn: &Connection, topic: &str, partition: i32, next_offset: i64, now: i64) -> Result<()> {
    conn.prepare_cached(
        "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
         ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at_ms = excluded.updated_at_ms",
    )?
    .execute(params![topic, partition, next_offset, now])?;
    Ok(())
}

/// Sets or clears a halt (?3 = reason or NULL, ?4 = now); a halt that goes on keeps its
/// start time.
const HALT_SQL: &str = "UPDATE partitions SET
        halted_at_ms = CASE WHEN ?3 IS NULL THEN NULL WHEN halted_reason IS NULL THEN ?4 ELSE halted_at_ms END,
        halted_reason = ?3
     WHERE topic = ?1 AND partition = ?2";

fn invalid(message: String) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message }
}

fn validate_delta(delta: &PositionDelta) -> Result<()> {
    PositionDelta::new(delta.partition, delta.from, delta.to).map(|_| ()).map_err(|e| invalid(e.to_string()))
}

/// One batch waiting for a group commit, and where its outcome goes.
struct PendingCommit {
    batch: Arc<BatchCommit>,
    reply: tokio::sync::oneshot::Sender<Result<CommitReport>>,
}

/// What a write transaction needs besides its connection: the `[sqlite]` bounds and the
/// writer's counters.
#[derive(Clone, Copy)]
struct Writing<'a> {
    pub tuning: &'a SqliteConfig,
    pub stats: &'a SqliteStats,
}

impl<'a> Writing<'a> {
    fn of(inner: &'a Inner) -> Writing<'a> {
        Writing { tuning: &inner.tuning, stats: &inner.stats }
    }

    /// Merge the records delta (`force`, or once it passed a bound), counting the merge.
    pub fn merge(self, tx: &Connection, force: bool, acct: &mut values::Account) -> Result<bool> {
        let reason = values::merge_delta(tx, force, self.tuning, acct)?;
        if let Some(r) = reason {
            self.stats.merged(r);
        }
        Ok(reason.is_some())
    }

    /// Write the transaction's counts and compact the value log if its dead bytes passed
    /// the bound (`records` must be complete: the delta merged in this transaction).
    pub fn flush_and_compact(self, tx: &Connection, acct: &mut values::Account) -> Result<()> {
        acct.flush(tx)?;
        if let Some(c) = values::compact(tx, self.tuning, acct.appended_bytes)? {
            self.stats.compacted(c);
        }
        Ok(())
    }
}

/// Commit every waiting batch in ONE transaction (group commit; see
/// [`SqliteSysdb::commit_batch`]). Each batch keeps its own outcome: its compare-and-set
/// and its writes either all stay or are rolled back alone, so one batch's conflict or
/// refused value never touches another's. If the transaction itself cannot begin or
/// commit, every batch gets that error and nothing of any of them is stored.
fn commit_group(conn: &mut Connection, w: Writing<'_>, group: Vec<PendingCommit>) {
    let outcomes = match commit_group_sync(conn, w, &group) {
        Ok(outcomes) => outcomes,
        Err(e) => group.iter().map(|_| Err(e.clone())).collect(),
    };
    for (pending, outcome) in group.into_iter().zip(outcomes) {
        // The caller may have stopped waiting (its worker was cancelled): nothing to tell.
        let _ = pending.reply.send(outcome);
    }
}

/// The group's batches first go in together, without savepoints: inside a savepoint,
/// SQLite copies every page before its first change to a sub-journal (a temporary file
/// beyond 64 KiB), a cost per batch that only a failing batch needs. If one of them
/// fails, nothing of that attempt stays and the group runs again, each batch in its own
/// savepoint ([`commit_each`]).
fn commit_group_sync(
    conn: &mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<Vec<Result<CommitReport>>> {
    if group.len() > 1 {
        if let Some(reports) = commit_all_or_none(conn, w, group)? {
            return Ok(reports.into_iter().map(Ok).collect());
        }
    }
    commit_each(conn, w, group)
}

/// A group's open write transaction: where its records go and what it changed.
struct GroupTx<'c> {
    tx: rusqlite::Transaction<'c>,
    target: values::Target,
    acct: values::Account,
}

/// Begin a group's write transaction and choose where its records go. Dropping the
/// transaction without commit rolls back, so an early return stores nothing.
fn begin_group<'c>(conn: &'c mut Connection, w: Writing<'_>, group: &[PendingCommit]) -> Result<GroupTx<'c>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let mut acct = values::Account::default();
    let writes = group.iter().flat_map(|p| &p.batch.collections).flat_map(|c| &c.writes);
    let (count, row_bytes) = writes.fold((0usize, 0usize), |(n, b), (id, r)| {
        let value = r.as_ref().map_or(0, |r| {
            values::metadata_size(&r.metadata)
                + r.document.as_ref().map_or(0, String::len)
                + r.embedding.as_ref().map_or(0, |e| 4 * e.len())
        });
        (n + 1, b + id.len() + value)
    });
    // Large transactions, those whose rows would fill the delta at once, and those with
    // function outputs (whose writes read the output records first, in SQL) merge the
    // delta and write `records` directly.
    let target = if count >= values::DIRECT_WRITES
        || row_bytes as u64 >= w.tuning.delta_max_bytes
        || group.iter().any(|p| !p.batch.functions.is_empty())
    {
        w.merge(&tx, true, &mut acct)?;
        values::Target::Records
    } else {
        values::Target::Delta
    };
    Ok(GroupTx { tx, target, acct })
}

/// Merge the delta if it passed a bound, compact if `records` changed, and commit.
fn finish_group(mut g: GroupTx<'_>, w: Writing<'_>) -> Result<()> {
    let records_changed = match g.target {
        values::Target::Records => true,
        // The values appended through the delta are compacted after its merge.
        values::Target::Delta => w.merge(&g.tx, false, &mut g.acct)?,
    };
    if records_changed {
        w.flush_and_compact(&g.tx, &mut g.acct)?;
    } else {
        g.acct.flush(&g.tx)?;
    }
    g.tx.commit()?;
    Ok(())
}

/// Every batch of the group in one transaction, or none: `None` when a batch failed
/// (the transaction is rolled back and nothing of the group is stored).
fn commit_all_or_none(
    conn: &mut Connection,
    w: Writing<'_>,
    group: &[PendingCommit],
) -> Result<Option<Vec<CommitReport>>> {
    let mut g = begin_group(conn, w, group)?;
    let now = now_ms();
    let mut reports = Vec::with_capacity(group.len());
    for pending in group {
        match apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target) {
            Ok(report) => reports.push(report),
            Err(_) => return Ok(None),
        }
    }
    finish_group(g, w)?;
    Ok(Some(reports))
}

/// Every batch of the group in its own savepoint, with its own outcome.
fn commit_each(conn: &mut Connection, w: Writing<'_>, group: &[PendingCommit]) -> Result<Vec<Result<CommitReport>>> {
    let mut g = begin_group(conn, w, group)?;
    let now = now_ms();
    let mut outcomes = Vec::with_capacity(group.len());
    for pending in group {
        if group.len() == 1 {
            outcomes.push(apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target));
            continue;
        }
        g.tx.execute_batch("SAVEPOINT batch")?;
        // A batch rolled back to its savepoint takes its counts with it.
        let before = g.acct;
        let outcome = apply_batch(&g.tx, &pending.batch, now, &mut g.acct, g.target);
        if let Err(e) = &outcome {
            g.acct = before;
            // Some errors (disk full, I/O) end the whole transaction in SQLite: then the
            // savepoint is gone and nothing of the group is stored; every batch gets the
            // error that ended it.
            if g.tx.execute_batch("ROLLBACK TO batch").is_err() || g.tx.is_autocommit() {
                return Err(e.clone());
            }
        }
        g.tx.execute_batch("RELEASE batch")?;
        outcomes.push(outcome);
    }
    if outcomes.iter().any(Result::is_ok) {
        finish_group(g, w)?;
    }
    Ok(outcomes)
}

/// One batch's writes inside an open write transaction: the compare-and-set first (the
/// database's only write lock is held, so nothing can move the position in between).
/// What it changes in the value log's counts goes into `acct` (`sqlite/values.rs`).
fn apply_batch(
    tx: &Connection,
    batch: &BatchCommit,
    now: i64,
    acct: &mut values::Account,
    target: values::Target,
) -> Result<CommitReport> {
    validate_delta(&batch.delta)?;
    let stored = read_next_offset(tx, &batch.topic, batch.delta.partition)?;
    batch.delta.check(stored)?;
    {
        let mut upsert_collection = tx.prepare_cached(
            "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)
             ON CONFLICT (id) DO UPDATE SET
                 dimension = COALESCE(collections.dimension, excluded.dimension),
                 log_position = excluded.log_position,
                 record_count = collections.record_count + excluded.record_count",
        )?;
        let mut records = values::RecordWriter::with_target(tx, target)?;
        for c in &batch.collections {
            upsert_collection.execute(params![
                c.id,
                c.partition,
                c.dimension,
                c.log_position,
                c.record_count_delta,
                now
            ])?;
            for (id, write) in &c.writes {
                match write {
                    Some(r) => records.put_parts(
                        &c.id,
                        id,
                        r.embedding.as_ref().map(encode_embedding),
                        encode_metadata(&r.metadata),
                        r.document.as_deref(),
                        r.offset,
                        acct,
                    )?,
                    None => records.delete(&c.id, id, acct)?,
                }
            }
        }
    }
    // Attached functions: their status is read here, inside the write transaction.
    let report = functions::commit_functions(tx, batch, now, acct)?;
    write_next_offset(tx, &batch.topic, batch.delta.partition, batch.delta.to, now)?;
    Ok(report)
}

type RawRecord = (String, Option<Vec<u8>>, Option<String>, Option<String>, i64);

fn raw_record(r: &rusqlite::Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn decode_raw((id, emb, md, doc, off): RawRecord) -> Result<Record> {
    decode_record(BACKEND, id, emb, md, doc, off)
}

fn collection_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, i32, Option<i64>, i64, i64)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn decode_collection(
    (id, partition, dimension, log_position, record_count): (String, i32, Option<i64>, i64, i64),
) -> Result<CollectionRow> {
    let dimension = dimension
        .map(|d| u32::try_from(d).map_err(|_| invalid(format!("collection {id:?}: stored dimension {d} out of range"))))
        .transpose()?;
    Ok(CollectionRow { id, partition, dimension, log_position, record_count })
}

const COLLECTION_COLUMNS: &str = "id, partition, dimension, log_position, record_count";

impl SqliteSysdb {
    /// Open (creating if needed) and migrate the database at `path` (`:memory:` for a
    /// private in-memory database), with the default tuning.
    pub async fn open(path: &str) -> Result<SqliteSysdb> {
        Self::open_tuned(path, &SqliteConfig::DEFAULT).await
    }

    /// [`SqliteSysdb::open`] with the `[sqlite]` settings.
    pub async fn open_tuned(path: &str, tuning: &SqliteConfig) -> Result<SqliteSysdb> {
        let (path, tuning) = (path.to_string(), tuning.clone());
        let inner = tokio::task::spawn_blocking(move || -> Result<Arc<Inner>> {
            let mut writer = open_connection(&path)?;
            configure(&writer, &path)?;
            migrate(&mut writer)?;
            let readers = if is_memory(&path) {
                Vec::new()
            } else {
                (0..tuning.reader_connections.max(1))
                    .map(|_| reads::open_reader(&path, false).map(Mutex::new))
                    .collect::<Result<Vec<_>>>()?
            };
            let inner = Arc::new(Inner {
                writer: Some(Mutex::new(writer)),
                pending: Mutex::new(Vec::new()),
                readers,
                next_reader: Default::default(),
                delta: Mutex::new(values::DeltaCache::new(tuning.delta_cache_bytes as usize)),
                tuning,
                stats: Arc::default(),
            });
            if !is_memory(&path) {
                spawn_checkpointer(&path, Arc::downgrade(&inner))?;
            }
            Ok(inner)
        })
        .await
        .map_err(join_error)??;
        Ok(SqliteSysdb { inner })
    }

    /// Open the database `sluice init` created at `path` for commands that only read:
    /// read-only connections (`SQLITE_OPEN_READONLY`), no writer, no checkpoint thread;
    /// nothing is created, migrated, merged or written, so a file (and directory) the user
    /// may only read works (`docs/sqlite.md` says which WAL files must exist then). A
    /// missing file, a file without Sluice's schema or one at another schema version is a
    /// `Config` error naming `sluice init`.
    pub async fn open_existing(path: &str) -> Result<SqliteSysdb> {
        if is_memory(path) {
            return Self::open(path).await;
        }
        let path = path.to_string();
        let inner = tokio::task::spawn_blocking(move || -> Result<Arc<Inner>> {
            if !std::path::Path::new(&path).is_file() {
                return Err(SysdbError::Config(format!(
                    "no sysdb at {path:?} (the file does not exist): run `sluice init` to create it"
                )));
            }
            let first = reads::open_reader(&path, true)?;
            let has_table: bool = first.query_row(
                "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations')",
                [],
                |r| r.get(0),
            )?;
            let current = if has_table {
                Some(first.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?)
            } else {
                None
            };
            schema::require_current(schema::SQLITE, current, BACKEND)?;
            let tuning = SqliteConfig { reader_connections: 1, ..SqliteConfig::DEFAULT };
            Ok(Arc::new(Inner {
                writer: None,
                pending: Mutex::new(Vec::new()),
                readers: vec![Mutex::new(first)],
                next_reader: Default::default(),
                delta: Mutex::new(values::DeltaCache::new(0)),
                tuning,
                stats: Arc::default(),
            }))
        })
        .await
        .map_err(join_error)??;
        Ok(SqliteSysdb { inner })
    }

    /// Counters of the writer's work (merges, compactions, write transactions), for the
    /// metrics and for tests.
    pub fn stats(&self) -> Arc<SqliteStats> {
        Arc::clone(&self.inner.stats)
    }

    /// Run `f` on the writer connection, off the async runtime. Counts a write
    /// transaction: every caller writes.
    async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, Writing<'_>) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.writer()?;
            inner.stats.write_transaction();
            f(&mut conn, Writing::of(&inner))
        })
        .await
        .map_err(join_error)?
    }

    /// Run `f` on a reader connection (the writer for `:memory:`). Readers are
    /// `query_only`: a read that tried to write would fail, and none waits for the
    /// writer's lock.
    async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            if inner.readers.is_empty() {
                let conn = inner.writer()?;
                return f(&conn);
            }
            let n = inner.readers.len();
            let first = inner.next_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % n;
            // A free reader if there is one, else wait for the next in turn.
            for i in 0..n {
                if let Ok(conn) = inner.readers[(first + i) % n].try_lock() {
                    return f(&conn);
                }
            }
            let conn = inner.readers[first].lock().unwrap_or_else(|p| p.into_inner());
            f(&conn)
        })
        .await
        .map_err(join_error)?
    }

    /// Run `f` on the writer connection without counting a write transaction: the
    /// processor's lookups of the records its next commit rewrites (their pages land in
    /// the writer's cache, where that commit needs them).
    async fn on_writer<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut conn = inner.writer()?;
            f(&mut conn)
        })
        .await
        .map_err(join_error)?
    }

    pub async fn schema_version(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?))
            .await
    }

    pub async fn set_topic_partitions(&self, topic: &str, partitions: i32) -> Result<()> {
        let key = super::topic_partitions_key(topic);
        self.write(move |c, _w| {
            c.execute(
                "INSERT INTO meta (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                params![key, partitions.to_string()],
            )?;
            Ok(())
        })
        .await
    }

    pub async fn topic_partitions(&self, topic: &str) -> Result<Option<i32>> {
        let key = super::topic_partitions_key(topic);
        self.read(move |c| {
            let value: Option<String> =
                c.query_row("SELECT value FROM meta WHERE key = ?1", [&key], |r| r.get(0)).optional()?;
            value
                .map(|v| v.parse::<i32>().map_err(|_| invalid(format!("meta {key:?} is not a partition count: {v:?}"))))
                .transpose()
        })
        .await
    }

    pub async fn positions(&self, topic: &str) -> Result<HashMap<i32, i64>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached("SELECT partition, next_offset FROM partitions WHERE topic = ?1")?;
            let rows = stmt.query_map([&topic], |r| Ok((r.get(0)?, r.get(1)?)))?;
            Ok(rows.collect::<rusqlite::Result<HashMap<i32, i64>>>()?)
        })
        .await
    }

    pub async fn partition_states(&self, topic: &str) -> Result<Vec<PartitionState>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT partition, next_offset, halted_reason, halted_at_ms FROM partitions WHERE topic = ?1 ORDER BY partition",
            )?;
            let rows = stmt.query_map([&topic], |r| {
                Ok(PartitionState { partition: r.get(0)?, next_offset: r.get(1)?, halted_reason: r.get(2)?, halted_at_ms: r.get(3)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub async fn set_partition_halted(&self, topic: &str, partition: i32, reason: Option<&str>) -> Result<()> {
        let (topic, reason) = (topic.to_string(), reason.map(str::to_string));
        self.write(move |c, _w| {
            let changed = c.prepare_cached(HALT_SQL)?.execute(params![topic, partition, reason, now_ms()])?;
            if changed == 0 && reason.is_some() {
                return Err(invalid(format!("cannot halt partition {partition} of {topic:?}: it has no position row")));
            }
            Ok(())
        })
        .await
    }

    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        if next_offset < 0 {
            return Err(invalid(format!("partition {partition}: next_offset {next_offset} is negative")));
        }
        let topic = topic.to_string();
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute(
                "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (topic, partition) DO NOTHING",
                params![topic, partition, next_offset, now_ms()],
            )?;
            let stored = read_next_offset(&tx, &topic, partition)?
                .ok_or_else(|| invalid(format!("partition {partition}: row vanished after insert")))?;
            tx.commit()?;
            Ok(stored)
        })
        .await
    }

    pub async fn collections(&self) -> Result<Vec<CollectionRow>> {
        self.read(|c| {
            let mut stmt = c.prepare_cached(&format!("SELECT {COLLECTION_COLUMNS} FROM collections ORDER BY id"))?;
            let rows = stmt.query_map([], collection_row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            rows.into_iter().map(decode_collection).collect()
        })
        .await
    }

    pub async fn collections_named(&self, ids: Vec<String>) -> Result<HashMap<String, CollectionRow>> {
        self.read(move |c| {
            let mut stmt = c.prepare_cached(&format!("SELECT {COLLECTION_COLUMNS} FROM collections WHERE id = ?1"))?;
            let mut out = HashMap::with_capacity(ids.len());
            for id in &ids {
                if let Some(row) = stmt.query_row([id], collection_row).optional()? {
                    let row = decode_collection(row)?;
                    out.insert(row.id.clone(), row);
                }
            }
            Ok(out)
        })
        .await
    }

    pub async fn collection(&self, id: &str) -> Result<Option<CollectionRow>> {
        let id = id.to_string();
        self.read(move |c| {
            let row = c
                .prepare_cached(&format!("SELECT {COLLECTION_COLUMNS} FROM collections WHERE id = ?1"))?
                .query_row([&id], collection_row)
                .optional()?;
            row.map(decode_collection).transpose()
        })
        .await
    }

    pub async fn get_records(&self, collection: &str, ids: &[String]) -> Result<HashMap<String, Record>> {
        // The processor's lookup: it sees the unmerged records delta (on the writer
        // connection, one indexed point lookup per id).
        let wanted = vec![(collection.to_string(), ids.iter().map(|id| (id.clone(), true)).collect())];
        Ok(self.get_records_many(wanted).await?.remove(collection).unwrap_or_default())
    }

    pub async fn get_records_many(
        &self,
        wanted: Vec<(String, Vec<(String, bool)>)>,
    ) -> Result<HashMap<String, HashMap<String, Record>>> {
        // On the writer connection: these are the rows the next commit rewrites, so the
        // b-tree pages they load are the ones the commit needs, in the same page cache
        // (measured: ~10% of the processor's CPU was copying pages into a second cache).
        // A key's newest row in the records delta overrides `records` (`sqlite/values.rs`).
        let inner = Arc::clone(&self.inner);
        self.on_writer(move |c| {
            let mut full = c.prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM {RECORDS_WITH_VALUES} WHERE r.collection_id = ?1 AND r.id = ?2"
            ))?;
            // Existence and metadata only: the embedding is most of a row.
            let mut light = c.prepare_cached(
                "SELECT id, NULL, metadata, NULL, last_offset FROM records WHERE collection_id = ?1 AND id = ?2",
            )?;
            let mut out = HashMap::with_capacity(wanted.len());
            // One snapshot for the delta and `records` (dropped unfinished: it only read).
            let _snapshot = c.unchecked_transaction()?;
            let mut cache = inner.delta.lock().unwrap_or_else(|p| p.into_inner());
            cache.sync(c)?;
            for (collection, ids) in &wanted {
                let mut found = HashMap::new();
                for (id, whole) in ids {
                    if found.contains_key(id) {
                        continue;
                    }
                    match cache.get(c, collection, id, *whole)? {
                        Some(Some(raw)) => {
                            let record = decode_raw(raw)?;
                            found.insert(record.id.clone(), record);
                            continue;
                        }
                        Some(None) => continue,
                        None => {}
                    }
                    let stmt = if *whole { &mut full } else { &mut light };
                    if let Some(raw) = stmt.query_row(params![collection, id], raw_record).optional()? {
                        let record = decode_raw(raw)?;
                        found.insert(record.id.clone(), record);
                    }
                }
                if !found.is_empty() {
                    out.insert(collection.clone(), found);
                }
            }
            Ok(out)
        })
        .await
    }

    pub async fn list_records(&self, collection: &str, after_id: Option<&str>, limit: usize) -> Result<Vec<Record>> {
        let collection = collection.to_string();
        let after_id = after_id.map(str::to_string);
        // On a reader, in one snapshot; unmerged delta rows are folded in at read time.
        self.read(move |c| {
            reads::list_page(c, &collection, after_id.as_deref(), limit)?.into_iter().map(decode_raw).collect()
        })
        .await
    }

    /// Commit a batch with its position (compare-and-set), grouped with whatever other
    /// batches wait at the same time: SQLite has one writer, so while one transaction
    /// commits, the batches of other partitions queue here, and the next transaction takes
    /// them all. Fewer, larger transactions write each rewritten page once for several
    /// partitions' records. Each batch keeps its own outcome (savepoints), so the crash
    /// and zombie guarantees are those of one transaction per batch.
    pub async fn commit_batch(&self, batch: Arc<BatchCommit>) -> Result<super::CommitReport> {
        let (reply, outcome) = tokio::sync::oneshot::channel();
        self.inner.pending.lock().unwrap_or_else(|p| p.into_inner()).push(PendingCommit { batch, reply });
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let mut conn = match inner.writer() {
                Ok(conn) => conn,
                Err(e) => {
                    for pending in std::mem::take(&mut *inner.pending.lock().unwrap_or_else(|p| p.into_inner())) {
                        let _ = pending.reply.send(Err(e.clone()));
                    }
                    return;
                }
            };
            // Whoever holds the writer takes every waiting batch; ours may already have
            // been taken by the previous holder, which then answers it.
            let group = std::mem::take(&mut *inner.pending.lock().unwrap_or_else(|p| p.into_inner()));
            if !group.is_empty() {
                tracing::debug!(batches = group.len(), "sqlite group commit");
                inner.stats.write_transaction();
                commit_group(&mut conn, Writing::of(&inner), group);
            }
        })
        .await
        .map_err(join_error)?;
        outcome.await.map_err(|_| SysdbError::Database {
            backend: BACKEND,
            message: "the group commit holding this batch ended without an outcome (a panic on the writer thread)"
                .into(),
        })?
    }

    pub async fn record_gap(&self, topic: &str, partition: i32, from: i64, to: i64) -> Result<()> {
        let delta = PositionDelta::new(partition, from, to).map_err(|e| invalid(format!("gap: {e}")))?;
        let topic = topic.to_string();
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            delta.check(read_next_offset(&tx, &topic, partition)?)?;
            let now = now_ms();
            tx.execute(
                "INSERT INTO gaps (topic, partition, from_offset, to_offset, recorded_at_ms) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![topic, partition, from, to, now],
            )?;
            write_next_offset(&tx, &topic, partition, to, now)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    pub async fn gaps(&self, topic: &str) -> Result<Vec<GapRow>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT topic, partition, from_offset, to_offset, recorded_at_ms FROM gaps WHERE topic = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([&topic], |r| {
                Ok(GapRow { topic: r.get(0)?, partition: r.get(1)?, from_offset: r.get(2)?, to_offset: r.get(3)?, recorded_at_ms: r.get(4)? })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub async fn reset_position(
        &self,
        topic: &str,
        partition: i32,
        to: i64,
        actor: &str,
        reason: &str,
    ) -> Result<Option<i64>> {
        if to < 0 {
            return Err(invalid(format!("partition {partition}: cannot reset to negative offset {to}")));
        }
        let (topic, actor, reason) = (topic.to_string(), actor.to_string(), reason.to_string());
        self.write(move |c, _w| {
            let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
            let previous = read_next_offset(&tx, &topic, partition)?;
            let now = now_ms();
            write_next_offset(&tx, &topic, partition, to, now)?;
            tx.execute(
                "UPDATE partitions SET halted_reason = NULL, halted_at_ms = NULL WHERE topic = ?1 AND partition = ?2",
                params![topic, partition],
            )?;
            tx.execute(
                "INSERT INTO offset_resets (topic, partition, from_offset, to_offset, actor, reason, at_ms)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![topic, partition, previous, to, actor, reason, now],
            )?;
            tx.commit()?;
            Ok(previous)
        })
        .await
    }

    pub async fn resets(&self, topic: &str) -> Result<Vec<ResetRow>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT topic, partition, from_offset, to_offset, actor, reason, at_ms FROM offset_resets WHERE topic = ?1 ORDER BY id",
            )?;
            let rows = stmt.query_map([&topic], |r| {
                Ok(ResetRow {
                    topic: r.get(0)?,
                    partition: r.get(1)?,
                    from_offset: r.get(2)?,
                    to_offset: r.get(3)?,
                    actor: r.get(4)?,
                    reason: r.get(5)?,
                    at_ms: r.get(6)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }

    pub async fn record_dlq_replay(&self, r: &DlqReplayRow) -> Result<bool> {
        let r = r.clone();
        self.write(move |c, _w| {
            let n = c.execute(
                "INSERT INTO dlq_replays (topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6) ON CONFLICT (topic, dlq_partition, dlq_offset) DO NOTHING",
                params![r.topic, r.dlq_partition, r.dlq_offset, r.replayed_at_ms, r.log_partition, r.log_offset],
            )?;
            Ok(n == 1)
        })
        .await
    }

    pub async fn dlq_replays(&self, topic: &str) -> Result<Vec<DlqReplayRow>> {
        let topic = topic.to_string();
        self.read(move |c| {
            let mut stmt = c.prepare_cached(
                "SELECT topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset FROM dlq_replays
                 WHERE topic = ?1 ORDER BY dlq_partition, dlq_offset",
            )?;
            let rows = stmt.query_map([&topic], |r| {
                Ok(DlqReplayRow {
                    topic: r.get(0)?,
                    dlq_partition: r.get(1)?,
                    dlq_offset: r.get(2)?,
                    replayed_at_ms: r.get(3)?,
                    log_partition: r.get(4)?,
                    log_offset: r.get(5)?,
                })
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<_>>>()?)
        })
        .await
    }
}

fn join_error(e: tokio::task::JoinError) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message: format!("sqlite worker task failed: {e}") }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sysdb::{conformance, Sysdb};

    fn group_batch(partition: i32, from: i64, to: i64, ids: &[&str]) -> Arc<BatchCommit> {
        let writes = ids
            .iter()
            .map(|id| {
                let record = Record {
                    id: (*id).into(),
                    embedding: Some(vec![0.5, -1.0].into()),
                    metadata: Default::default(),
                    document: Some(format!("{id} of partition {partition}")),
                    offset: from,
                };
                ((*id).to_string(), Some(record))
            })
            .collect();
        Arc::new(BatchCommit {
            topic: "group".into(),
            delta: PositionDelta::new(partition, from, to).unwrap(),
            collections: vec![super::super::CollectionUpdate {
                id: format!("coll-{partition}"),
                partition,
                dimension: Some(2),
                log_position: to - 1,
                record_count_delta: ids.len() as i64,
                writes,
            }],
            functions: Vec::new(),
        })
    }

    /// Small bounds, so that a test of a few thousand records merges and compacts often.
    const TIGHT: SqliteConfig = SqliteConfig {
        delta_max_rows: 150,
        delta_max_bytes: 12 * 1024,
        delta_cache_bytes: 2 * 1024,
        dead_value_ratio: 1.0,
        dead_value_slack_bytes: 4 * 1024,
        compaction_step_bytes: 1 << 20,
        reader_connections: 1,
    };

    fn writing(tuning: &SqliteConfig) -> (SqliteConfig, SqliteStats) {
        (tuning.clone(), SqliteStats::default())
    }

    /// Commit one batch alone through the group-commit path, as the processor does.
    fn commit_one(conn: &mut Connection, w: Writing<'_>, batch: BatchCommit) {
        let (reply, mut rx) = tokio::sync::oneshot::channel();
        commit_group(conn, w, vec![PendingCommit { batch: Arc::new(batch), reply }]);
        rx.try_recv().expect("answered").expect("committed");
    }

    /// Every record read back whole (through the value log), by (collection, id).
    fn stored_records(conn: &Connection) -> std::collections::BTreeMap<(String, String), Record> {
        conn.prepare(&format!(
            "SELECT r.collection_id, {RECORD_COLUMNS} FROM {} r LEFT JOIN record_values v ON v.seq = r.value",
            values::CURRENT_RECORDS
        ))
        .unwrap()
        .query_map([], |r| Ok((r.get::<_, String>(0)?, (r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))))
        .unwrap()
        .map(|row| {
            let (c, raw) = row.unwrap();
            let record = decode_raw(raw).unwrap();
            ((c, record.id.clone()), record)
        })
        .collect()
    }

    /// The value log under a long run of overwrites and deletes, with tight byte bounds:
    /// after every commit the records read back are exactly the model's, every record
    /// points at a value of its key and size, and the log's byte counts (all values, live
    /// values, delta rows) are exact. Pages read on a reader with the delta folded in at
    /// read time equal the model too. The dead bytes stay within the bound (plus what the
    /// transactions since the last compaction added), and records written once at the
    /// start and never again survive the compactions that copied their values forward.
    #[test]
    fn the_value_log_keeps_every_record_exact_and_stays_bounded_in_bytes() {
        use crate::record::{MetaValue, Metadata};
        let mut conn = open_connection(":memory:").unwrap();
        configure(&conn, ":memory:").unwrap();
        migrate(&mut conn).unwrap();
        write_next_offset(&conn, "values", 0, 0, 0).unwrap();
        let mut model = std::collections::BTreeMap::new();
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        let record = |id: &str, kind: u64, offset: i64| {
            let mut metadata = Metadata::new();
            metadata.insert("n".into(), MetaValue::Long(offset));
            // Some stretches of the log carry larger metadata: the delta fills by bytes there.
            if (offset / 400) % 3 == 0 {
                metadata.insert("pad".into(), MetaValue::String("p".repeat(120)));
            }
            Record {
                id: id.into(),
                // Some records have no value at all, some only a document (of varied sizes).
                embedding: (kind % 3 == 0).then(|| [offset as f32, 1.5, -2.0].into()),
                metadata,
                document: (kind % 3 != 2).then(|| format!("{id} at {offset}").repeat(1 + (offset % 7) as usize)),
                offset,
            }
        };
        let mut offset = 0i64;
        let mut first_values_end = 0i64;
        let (tuning, stats) = writing(&TIGHT);
        let w = Writing { tuning: &tuning, stats: &stats };
        for tx in 0..300 {
            let mut per_collection: std::collections::BTreeMap<
                String,
                std::collections::BTreeMap<String, Option<Record>>,
            > = Default::default();
            // Every tenth transaction is large enough to merge the delta and write `records`
            // directly; the others go through the delta.
            let writes = if tx == 0 {
                250
            } else if tx % 10 == 5 {
                2 * values::DIRECT_WRITES as i64 + 200
            } else {
                40
            };
            for wi in 0..writes {
                // The first transaction also writes 50 ids of a collection never written again.
                let (c, id) = if tx == 0 && wi < 50 {
                    ("static".to_string(), format!("s{wi}"))
                } else {
                    (format!("c{}", next(3)), format!("id{}", next(500)))
                };
                let write = if next(10) < 7 { Some(record(&id, next(3), offset)) } else { None };
                offset += 1;
                per_collection.entry(c).or_default().insert(id, write);
            }
            if tx % 10 == 5 {
                let distinct: usize = per_collection.values().map(|w| w.len()).sum();
                assert!(distinct >= values::DIRECT_WRITES, "transaction {tx} writes only {distinct} ids");
            }
            let collections = per_collection
                .into_iter()
                .map(|(c, writes)| {
                    let mut record_count_delta = 0;
                    for (id, w) in &writes {
                        let before = match w {
                            Some(r) => model.insert((c.clone(), id.clone()), r.clone()),
                            None => model.remove(&(c.clone(), id.clone())),
                        };
                        record_count_delta += i64::from(w.is_some()) - i64::from(before.is_some());
                    }
                    super::super::CollectionUpdate {
                        id: c,
                        partition: 0,
                        dimension: Some(3),
                        log_position: offset - 1,
                        record_count_delta,
                        writes: writes.into_iter().collect(),
                    }
                })
                .collect();
            let from = offset - writes;
            commit_one(
                &mut conn,
                w,
                BatchCommit {
                    topic: "values".into(),
                    delta: PositionDelta::new(0, from, offset).unwrap(),
                    collections,
                    functions: Vec::new(),
                },
            );
            if tx == 0 {
                first_values_end = conn.query_row("SELECT max(seq) FROM record_values", [], |r| r.get(0)).unwrap();
            }
            // Forced merges now and then, between the ones the delta's bounds bring.
            if tx % 37 == 36 {
                let t = conn.transaction().unwrap();
                let mut acct = values::Account::default();
                w.merge(&t, true, &mut acct).unwrap();
                w.flush_and_compact(&t, &mut acct).unwrap();
                t.commit().unwrap();
                let left: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
                assert_eq!(left, 0, "a merge empties the delta");
            }
            values::check_layout(&conn).unwrap_or_else(|e| panic!("after transaction {tx}: {e}"));
            let stored = stored_records(&conn);
            assert!(stored == model, "after transaction {tx}: the records read back differ from the model");
            if tx % 25 == 24 {
                for c in ["c0", "c1", "c2", "static"] {
                    let mut page_model: Vec<Record> =
                        model.iter().filter(|((mc, _), _)| mc == c).map(|(_, r)| r.clone()).collect();
                    page_model.sort_by(|a, b| a.id.cmp(&b.id));
                    let mut read = Vec::new();
                    let mut after: Option<String> = None;
                    loop {
                        let page: Vec<Record> = reads::list_page(&conn, c, after.as_deref(), 37)
                            .unwrap()
                            .into_iter()
                            .map(|raw| decode_raw(raw).unwrap())
                            .collect();
                        after = page.last().map(|r| r.id.clone());
                        let done = page.len() < 37;
                        read.extend(page);
                        if done {
                            break;
                        }
                    }
                    assert!(read == page_model, "after transaction {tx}: pages of {c} read with the delta folded in");
                }
            }
        }
        let s = stats.snapshot();
        assert!(s.compactions > 10, "compactions: {s:?}");
        assert!(s.merges.iter().find(|(r, _)| *r == "rows").unwrap().1 > 0, "merges by rows: {s:?}");
        assert!(s.merges.iter().find(|(r, _)| *r == "bytes").unwrap().1 > 0, "merges by bytes: {s:?}");
        // Once merged and compacted until it stops, the dead bytes are within the bound.
        loop {
            let t = conn.transaction().unwrap();
            let mut acct = values::Account::default();
            w.merge(&t, true, &mut acct).unwrap();
            acct.flush(&t).unwrap();
            let done = values::compact(&t, &tuning, 0).unwrap().is_none();
            t.commit().unwrap();
            if done {
                break;
            }
        }
        let (log, live) = values::log_bytes(&conn);
        assert!(live > 0);
        let allowed = (tuning.dead_value_ratio * live as f64) as i64 + tuning.dead_value_slack_bytes as i64;
        assert!(log - live <= allowed, "{} dead bytes for {live} live ones (allowed {allowed})", log - live);
        let moved: i64 = conn
            .query_row(
                &format!(
                    "SELECT count(*) FROM {} WHERE collection_id = 'static' AND value > ?1",
                    values::CURRENT_RECORDS
                ),
                [first_values_end],
                |r| r.get(0),
            )
            .unwrap();
        let with_value =
            model.iter().filter(|((c, _), r)| c == "static" && (r.embedding.is_some() || r.document.is_some())).count();
        assert!(with_value > 0);
        assert_eq!(moved as usize, with_value, "every static value was copied forward by compaction");
        values::check_layout(&conn).unwrap();
    }

    /// A database written by the previous layout (values inside `records`, schema
    /// version 5) migrates to the value log with every record unchanged.
    #[test]
    fn step_6_moves_stored_values_into_the_value_log() {
        let mut conn = open_connection(":memory:").unwrap();
        conn.execute_batch(schema::CREATE_SCHEMA_MIGRATIONS).unwrap();
        for m in &schema::SQLITE[..5] {
            conn.execute_batch(m.sql).unwrap();
            conn.execute("INSERT INTO schema_migrations VALUES (?1, ?2, 0)", params![m.version, m.description])
                .unwrap();
        }
        let old = [
            (
                "a",
                "x",
                Some(crate::record::codec::f32s_to_le_bytes(&[1.0, 2.0])),
                Some(r#"{"k":"v"}"#),
                Some("doc x"),
                3,
            ),
            ("a", "y", None, Some(r#"{"k":"w"}"#), None, 4),
            ("b", "x", None, None, Some("only a document"), 5),
        ];
        for (c, id, emb, md, doc, off) in &old {
            conn.execute(
                "INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![c, id, emb, md, doc, off],
            )
            .unwrap();
        }
        migrate(&mut conn).unwrap();
        values::check_layout(&conn).unwrap();
        let stored = stored_records(&conn);
        assert_eq!(stored.len(), 3);
        for (c, id, emb, md, doc, off) in old {
            let expected = decode_raw((id.into(), emb, md.map(str::to_string), doc.map(str::to_string), off)).unwrap();
            assert_eq!(stored[&(c.to_string(), id.to_string())], expected);
        }
        let values: i64 = conn.query_row("SELECT count(*) FROM record_values", [], |r| r.get(0)).unwrap();
        assert_eq!(values, 2, "two records had a value, one had none");
        // Step 7: the small rows are clustered on their key (one b-tree, no rowid), so a
        // batch of one partition's collections rewrites only that partition's pages.
        let err = conn.query_row("SELECT rowid FROM records", [], |r| r.get::<_, i64>(0)).unwrap_err();
        assert!(err.to_string().contains("no such column: rowid"), "{err}");
    }

    /// A migrated in-memory database with partitions 0-3 of topic `group` at offset 0.
    fn group_connection() -> Connection {
        let mut conn = open_connection(":memory:").unwrap();
        configure(&conn, ":memory:").unwrap();
        migrate(&mut conn).unwrap();
        for p in 0..4 {
            write_next_offset(&conn, "group", p, 0, 0).unwrap();
        }
        conn
    }

    /// One group transaction, four batches: each keeps its own outcome. A conflicting
    /// batch and one whose value the database refuses leave nothing behind (not even
    /// their collection rows), and the others commit.
    #[test]
    fn a_group_commit_keeps_each_batch_outcome_apart() {
        let mut conn = group_connection();
        // A value SQLite refuses, as a constraint would: class Record.
        conn.execute_batch(
            "CREATE TRIGGER refuse_poison BEFORE INSERT ON record_delta WHEN NEW.id = 'poison'
             BEGIN SELECT RAISE(ABORT, 'poison refused'); END;",
        )
        .unwrap();
        let batches = [
            group_batch(0, 0, 5, &["a", "b"]),
            group_batch(1, 3, 5, &["c"]), // stored position is 0: conflict
            group_batch(2, 0, 5, &["good", "poison"]),
            group_batch(3, 0, 5, &["d"]),
        ];
        let mut outcomes = Vec::new();
        let group = batches
            .iter()
            .map(|b| {
                let (reply, rx) = tokio::sync::oneshot::channel();
                outcomes.push(rx);
                PendingCommit { batch: Arc::clone(b), reply }
            })
            .collect();
        let (tuning, stats) = writing(&SqliteConfig::DEFAULT);
        commit_group(&mut conn, Writing { tuning: &tuning, stats: &stats }, group);
        let outcomes: Vec<_> = outcomes.into_iter().map(|mut rx| rx.try_recv().expect("answered")).collect();
        assert!(outcomes[0].is_ok(), "{:?}", outcomes[0]);
        assert!(matches!(outcomes[1], Err(SysdbError::Conflict(_))), "{:?}", outcomes[1]);
        assert!(matches!(outcomes[2], Err(SysdbError::Rejected { .. })), "{:?}", outcomes[2]);
        assert!(outcomes[3].is_ok(), "{:?}", outcomes[3]);
        let positions: Vec<i64> = (0..4).map(|p| read_next_offset(&conn, "group", p).unwrap().unwrap()).collect();
        assert_eq!(positions, vec![5, 0, 0, 5]);
        let mut stored: Vec<String> = conn
            .prepare(&format!("SELECT collection_id || '/' || id FROM {} ORDER BY 1", values::CURRENT_RECORDS))
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        stored.sort();
        assert_eq!(stored, vec!["coll-0/a", "coll-0/b", "coll-3/d"]);
        let collections: Vec<String> = conn
            .prepare("SELECT id FROM collections ORDER BY id")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        assert_eq!(collections, vec!["coll-0", "coll-3"]);
    }

    /// The group's first attempt: every batch or none. Three good batches all commit; with
    /// a conflicting one among them nothing is stored, and the group is left to the
    /// savepoint path.
    #[test]
    fn a_group_goes_in_whole_or_not_at_all_before_savepoints() {
        let mut conn = group_connection();
        let pending = |batches: &[Arc<BatchCommit>]| -> Vec<PendingCommit> {
            batches
                .iter()
                .map(|b| PendingCommit { batch: Arc::clone(b), reply: tokio::sync::oneshot::channel().0 })
                .collect()
        };
        let positions = |conn: &Connection| -> Vec<i64> {
            (0..4).map(|p| read_next_offset(conn, "group", p).unwrap().unwrap()).collect()
        };
        let mixed = [group_batch(0, 0, 5, &["a"]), group_batch(1, 3, 5, &["b"]), group_batch(2, 0, 5, &["c"])];
        let (tuning, stats) = writing(&SqliteConfig::DEFAULT);
        let w = Writing { tuning: &tuning, stats: &stats };
        assert!(commit_all_or_none(&mut conn, w, &pending(&mixed)).unwrap().is_none(), "a conflict fails the attempt");
        assert_eq!(positions(&conn), vec![0, 0, 0, 0], "nothing of the failed attempt is stored");
        let count = |conn: &Connection| -> i64 {
            conn.query_row(&format!("SELECT count(*) FROM {}", values::CURRENT_RECORDS), [], |r| r.get(0)).unwrap()
        };
        assert_eq!(count(&conn), 0);

        let good = [group_batch(0, 0, 5, &["a"]), group_batch(1, 0, 5, &["b", "b2"]), group_batch(2, 0, 5, &["c"])];
        let reports = commit_all_or_none(&mut conn, w, &pending(&good)).unwrap().expect("every batch commits");
        assert_eq!(reports.len(), 3);
        assert_eq!(positions(&conn), vec![5, 5, 5, 0]);
        assert_eq!(count(&conn), 4);
    }

    /// Many partitions committing at once through the public API (grouped or not, as the
    /// writer's timing decides): every batch lands once, with its own position.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_partitions_all_commit_through_group_commits() {
        let dir = tempfile::tempdir().unwrap();
        let db = SqliteSysdb::open(&dir.path().join("g.db").to_string_lossy()).await.unwrap();
        for p in 0..16 {
            db.init_position("group", p, 0).await.unwrap();
        }
        let mut tasks = Vec::new();
        for p in 0..16 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                for round in 0..10 {
                    let id = format!("r{round}");
                    db.commit_batch(group_batch(p, round * 5, round * 5 + 5, &[&id])).await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let positions = db.positions("group").await.unwrap();
        assert_eq!(positions, (0..16).map(|p| (p, 50)).collect());
        assert_eq!(db.collections().await.unwrap().iter().map(|c| c.record_count).sum::<i64>(), 160);
    }

    async fn open_file(dir: &tempfile::TempDir) -> (Sysdb, String) {
        let url = format!("sqlite://{}", dir.path().join("sysdb.sqlite").display());
        (Sysdb::open(&url).await.unwrap(), url)
    }

    /// (id, document) of the ids of `coll-0` that `db` finds, through the processor's lookup.
    async fn read(db: &Sysdb, ids: &[&str]) -> Vec<(String, Option<String>)> {
        let ids: Vec<(String, bool)> = ids.iter().map(|i| (i.to_string(), true)).collect();
        let mut found = db.get_records_many(vec![("coll-0".into(), ids)]).await.unwrap();
        let mut docs: Vec<(String, Option<String>)> =
            found.remove("coll-0").unwrap_or_default().into_values().map(|r| (r.id, r.document)).collect();
        docs.sort();
        docs
    }

    /// Two handles on one file (as two replicas on one machine): each reads the other's
    /// unmerged delta rows, a merge by one (here a large transaction, which merges first)
    /// is seen by the other's in-memory copy of the delta, and pages in id order merge the
    /// delta first. Every read agrees with what was written, in order.
    #[tokio::test]
    async fn two_handles_read_each_others_delta_across_merges() {
        let dir = tempfile::tempdir().unwrap();
        let (a, url) = open_file(&dir).await;
        let b = Sysdb::open(&url).await.unwrap();
        a.init_position("group", 0, 0).await.unwrap();
        a.init_position("group", 1, 0).await.unwrap();
        // A writes a small batch: it waits in the delta, and B reads it there.
        a.commit_batch(group_batch(0, 0, 2, &["x", "y"])).await.unwrap();
        let delta: i64 = {
            let conn = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
            conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap()
        };
        assert_eq!(delta, 2, "a small batch goes to the delta");
        let doc = |id: &str| (id.to_string(), Some(format!("{id} of partition 0")));
        assert_eq!(read(&b, &["x", "y", "z"]).await, vec![doc("x"), doc("y")]);
        // B deletes y through the delta; A sees the delete over its own earlier row.
        let mut delete = (*group_batch(0, 2, 3, &["y"])).clone();
        delete.collections[0].writes[0].1 = None;
        delete.collections[0].record_count_delta = -1;
        b.commit_batch(delete).await.unwrap();
        assert_eq!(read(&a, &["x", "y"]).await, vec![doc("x")]);
        // A large batch on another partition merges the delta first (rowids start over),
        // then B writes z into the new delta: A's copy starts over and still sees x, not y.
        let many: Vec<String> = (0..values::DIRECT_WRITES).map(|i| format!("m{i:05}")).collect();
        let many: Vec<&str> = many.iter().map(String::as_str).collect();
        a.commit_batch(group_batch(1, 0, 1, &many)).await.unwrap();
        b.commit_batch(group_batch(0, 3, 4, &["z"])).await.unwrap();
        assert_eq!(read(&a, &["x", "y", "z"]).await, vec![doc("x"), doc("z")]);
        assert_eq!(read(&b, &["x", "y", "z"]).await, vec![doc("x"), doc("z")]);
        // A page in id order (on a reader) sees the same, and merges nothing: the delta
        // still holds z, and no write transaction began.
        let Sysdb::Sqlite(sa) = &a else { unreachable!() };
        let writes_before = sa.stats().snapshot().write_transactions;
        let page: Vec<String> = a.list_records("coll-0", None, 10).await.unwrap().into_iter().map(|r| r.id).collect();
        assert_eq!(page, vec!["x", "z"]);
        assert_eq!(sa.stats().snapshot().write_transactions, writes_before, "a read began a write transaction");
        let conn = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
        let left: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
        assert_eq!(left, 1, "a read merged the delta");
        values::check_layout(&conn).unwrap();
    }

    /// The processor's copy of the delta holds at most `delta_cache_bytes` of metadata:
    /// with a budget of three rows' metadata out of twenty, it keeps every key and reads
    /// the other rows' metadata from the delta table by rowid; the records are the same.
    #[tokio::test]
    async fn the_delta_cache_stays_within_its_budget_and_reads_the_rest() {
        use crate::record::MetaValue;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("budget.db");
        let tuning = SqliteConfig { delta_cache_bytes: 2_500, ..SqliteConfig::DEFAULT };
        let db = SqliteSysdb::open_tuned(&path.to_string_lossy(), &tuning).await.unwrap();
        db.init_position("group", 0, 0).await.unwrap();
        let ids: Vec<String> = (0..20).map(|i| format!("r{i:02}")).collect();
        let refs: Vec<&str> = ids.iter().map(String::as_str).collect();
        let mut batch = (*group_batch(0, 0, 1, &refs)).clone();
        for (i, (_, w)) in batch.collections[0].writes.iter_mut().enumerate() {
            let r = w.as_mut().unwrap();
            r.metadata.insert("big".into(), MetaValue::String(format!("{i}").repeat(700)));
        }
        db.commit_batch(Arc::new(batch.clone())).await.unwrap();
        let wanted = vec![("coll-0".to_string(), ids.iter().map(|i| (i.clone(), true)).collect())];
        let found = db.get_records_many(wanted).await.unwrap().remove("coll-0").unwrap();
        assert_eq!(found.len(), 20);
        for (id, w) in &batch.collections[0].writes {
            assert_eq!(&found[id], w.as_ref().unwrap(), "{id}");
        }
        let held = db.inner.delta.lock().unwrap().metadata_bytes();
        assert!(held <= 2_500, "the delta cache holds {held} bytes of metadata, over its budget of 2500");
        assert!(held >= 1_400, "the delta cache holds {held} bytes of metadata: it should hold what fits");
        let conn = Connection::open(&path).unwrap();
        let in_delta: i64 = conn.query_row("SELECT count(*) FROM record_delta", [], |r| r.get(0)).unwrap();
        assert_eq!(in_delta, 20, "the rows are still in the delta (read from there, not from a merge)");
    }

    #[tokio::test]
    async fn conformance_on_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let (db, url) = open_file(&dir).await;
        conformance::run_all(&db).await;
        conformance::reopen_is_idempotent(&db, &url).await;
        let other = Sysdb::open(&url).await.unwrap();
        conformance::concurrent_commits_from_two_handles(&db, &other).await;
        conformance::functions::concurrent_attaches_create_one_function(&db, &other).await;
    }

    #[tokio::test]
    async fn conformance_in_memory() {
        let db = Sysdb::open("sqlite::memory:").await.unwrap();
        conformance::run_all(&db).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn conformance_on_a_multi_threaded_runtime() {
        let dir = tempfile::tempdir().unwrap();
        let (db, _) = open_file(&dir).await;
        conformance::concurrent_commits_with_the_same_from(&db).await;
        conformance::functions::backfill_races_live_commits(&db).await;
    }

    #[tokio::test]
    async fn a_database_newer_than_the_binary_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (db, url) = open_file(&dir).await;
        drop(db);
        let path = dir.path().join("sysdb.sqlite");
        let conn = Connection::open(&path).unwrap();
        conn.execute(
            "INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES (?1, 'from the future', 0)",
            [schema::latest(schema::SQLITE) + 1],
        )
        .unwrap();
        drop(conn);
        match Sysdb::open(&url).await {
            Err(SysdbError::Config(m)) => assert!(m.contains("schema version"), "{m}"),
            Err(e) => panic!("expected a Config error, got {e}"),
            Ok(_) => panic!("a newer schema was accepted"),
        }
    }

    #[tokio::test]
    async fn settings_are_applied_to_file_databases() {
        let dir = tempfile::tempdir().unwrap();
        let (db, _) = open_file(&dir).await;
        let Sysdb::Sqlite(s) = &db else { unreachable!() };
        let reader_query_only: bool =
            s.read(|c| Ok(c.query_row("PRAGMA query_only", [], |r| r.get(0))?)).await.unwrap();
        assert!(reader_query_only, "reads run on query_only connections");
        let (mode, sync, busy, page, mmap) = s
            .on_writer(|c| {
                let mode: String = c.query_row("PRAGMA journal_mode", [], |r| r.get(0))?;
                let sync: i64 = c.query_row("PRAGMA synchronous", [], |r| r.get(0))?;
                let busy: i64 = c.query_row("PRAGMA busy_timeout", [], |r| r.get(0))?;
                let page: i64 = c.query_row("PRAGMA page_size", [], |r| r.get(0))?;
                let mmap: i64 = c.query_row("PRAGMA mmap_size", [], |r| r.get(0))?;
                Ok((mode, sync, busy, page, mmap))
            })
            .await
            .unwrap();
        assert_eq!(page, PAGE_SIZE);
        // SQLite caps it at its build's maximum; memory-mapped reads must be on.
        assert!(mmap > 0 && mmap <= MMAP_SIZE, "mmap_size {mmap}");
        assert_eq!(mode, "wal");
        assert_eq!(sync, 1, "synchronous=NORMAL");
        assert_eq!(busy, 5000);
    }

    /// Another connection (here a raw one; in practice another process on the same file)
    /// holds the write lock: a commit waits at most the busy timeout, then reports
    /// `Unavailable` (transient) with nothing written, and succeeds once the lock is gone.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_lock_held_elsewhere_is_unavailable_after_the_busy_timeout() {
        use crate::sysdb::{CollectionUpdate, ErrorClass};
        let dir = tempfile::tempdir().unwrap();
        let (db, _) = open_file(&dir).await;
        db.init_position("t", 0, 0).await.unwrap();
        let batch = BatchCommit {
            topic: "t".into(),
            delta: PositionDelta::new(0, 0, 3).unwrap(),
            collections: vec![CollectionUpdate {
                id: "c".into(),
                partition: 0,
                dimension: None,
                log_position: 2,
                record_count_delta: 1,
                writes: vec![(
                    "a".into(),
                    Some(Record {
                        id: "a".into(),
                        embedding: None,
                        metadata: Default::default(),
                        document: None,
                        offset: 2,
                    }),
                )],
            }],
            functions: Vec::new(),
        };

        let holder = Connection::open(dir.path().join("sysdb.sqlite")).unwrap();
        holder.execute_batch("BEGIN IMMEDIATE").unwrap();
        let started = std::time::Instant::now();
        let outcome = tokio::time::timeout(BUSY_TIMEOUT * 3, db.commit_batch(batch.clone()))
            .await
            .expect("the commit blocked past the busy timeout");
        let waited = started.elapsed();
        let err = outcome.expect_err("committed while another connection held the write lock");
        assert_eq!(err.class(), ErrorClass::Transient, "{err}");
        assert!(matches!(err, SysdbError::Unavailable { .. }), "{err:?}");
        assert!(
            waited >= BUSY_TIMEOUT - Duration::from_millis(500),
            "gave up after {waited:?}, before the busy timeout"
        );
        assert_eq!(db.positions("t").await.unwrap(), HashMap::from([(0, 0)]), "position moved");
        assert_eq!(db.collection("c").await.unwrap(), None, "collection written");

        holder.execute_batch("ROLLBACK").unwrap();
        db.commit_batch(batch).await.expect("commit after the lock is released");
        assert_eq!(db.positions("t").await.unwrap(), HashMap::from([(0, 3)]));
    }

    #[tokio::test]
    async fn an_unopenable_path_is_unavailable_not_a_panic() {
        match SqliteSysdb::open("/nonexistent-dir-for-sluice-tests/sub/sysdb.sqlite").await {
            Err(e) => assert!(e.is_retryable(), "{e}"),
            Ok(_) => panic!("opened a file in a missing directory"),
        }
    }

    /// The memory formula (`config/memory.rs`) counts these caches.
    #[test]
    fn the_memory_formula_counts_these_caches() {
        use crate::config::memory;
        assert_eq!(CACHE_SIZE_KIB as u64 * 1024, memory::SQLITE_WRITER_CACHE);
        assert_eq!(READER_CACHE_SIZE_KIB as u64 * 1024, memory::SQLITE_READER_CACHE);
        assert_eq!(CHECKPOINTER_CACHE_KIB as u64 * 1024, memory::SQLITE_CHECKPOINTER_CACHE);
    }

    #[test]
    fn busy_and_io_errors_are_retryable() {
        use crate::sysdb::ErrorClass;
        let class =
            |code| SysdbError::from(rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(code), None)).class();
        for code in [
            rusqlite::ffi::SQLITE_BUSY,
            rusqlite::ffi::SQLITE_LOCKED,
            rusqlite::ffi::SQLITE_READONLY,
            rusqlite::ffi::SQLITE_FULL,
            rusqlite::ffi::SQLITE_IOERR,
        ] {
            assert_eq!(class(code), ErrorClass::Transient, "{code}");
        }
        for code in [rusqlite::ffi::SQLITE_TOOBIG, rusqlite::ffi::SQLITE_CONSTRAINT, rusqlite::ffi::SQLITE_MISMATCH] {
            assert_eq!(class(code), ErrorClass::Record, "{code}");
        }
        for code in [rusqlite::ffi::SQLITE_CORRUPT, rusqlite::ffi::SQLITE_ERROR] {
            assert_eq!(class(code), ErrorClass::Fatal, "{code}");
        }
        let busy = rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_BUSY), None);
        assert!(SysdbError::from(busy).is_retryable());
        let constraint =
            rusqlite::Error::SqliteFailure(rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT), None);
        assert!(!SysdbError::from(constraint).is_retryable());
    }

    /// `cargo test --release -p sluice --lib sysdb::sqlite::tests::commit_throughput -- --ignored --nocapture`
    #[tokio::test]
    #[ignore = "measurement, prints records/s"]
    async fn commit_throughput() {
        let dir = tempfile::tempdir().unwrap();
        let (db, _) = open_file(&dir).await;
        conformance::measure_commit_throughput(&db, 5_000, 384, 5).await;
        conformance::measure_commit_throughput(&db, 5_000, 1536, 3).await;
    }
}
