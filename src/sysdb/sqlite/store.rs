//! The SQLite backend's shared state: its connections (one writer, `query_only` readers),
//! how they are opened and configured, the batches waiting for a group commit, and the
//! helpers every concern uses to run on the writer or a reader.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::{params, Connection, ErrorCode, OpenFlags, TransactionBehavior};

pub(super) use super::rows::BACKEND;
use super::stats::SqliteStats;
use super::values;
use super::write_queue::{Turn, WriteQueue};
use crate::config::SqliteConfig;
use crate::sysdb::error::{Result, SysdbError};
use crate::sysdb::migrations;
use crate::sysdb::types::{now_ms, BatchCommit, CommitReport};

/// How long a statement waits for another connection's lock before `SQLITE_BUSY`.
pub(super) const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// Page size of a new database file.
pub(super) const PAGE_SIZE: i64 = 16 * 1024;

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
pub(super) const MMAP_SIZE: i64 = 2 * 1024 * 1024 * 1024;

/// Each reader connection (admin API, CLI, backfill scans) gets a smaller cache: the
/// processor reads through the writer.
pub(crate) const READER_CACHE_SIZE_KIB: i64 = 8 * 1024;

/// WAL pages after which the committing connection checkpoints by itself (SQLite's
/// default is 1,000): a safety net behind the checkpoint thread, 640 MiB at 16 KiB
/// pages.
const WAL_AUTOCHECKPOINT_PAGES: i64 = 40_000;

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

pub(super) struct Inner {
    /// `None` for a sysdb opened read-only (`open_existing`): every write is refused.
    pub(super) writer: Option<Mutex<Connection>>,
    /// Batches waiting for the next group commit (taken by whoever holds `writer`).
    pub(super) pending: Mutex<Vec<PendingCommit>>,
    /// Connections that only read (`query_only`), each used by one read at a time. Empty
    /// for `:memory:` (a second connection would open another, empty database): reads go
    /// to the writer there.
    pub(super) readers: Vec<Mutex<Connection>>,
    /// Round robin over `readers`.
    pub(super) next_reader: std::sync::atomic::AtomicUsize,
    /// The unmerged records delta, for the processor's reads (locked after `writer`).
    pub(super) delta: Mutex<values::DeltaCache>,
    pub(super) tuning: SqliteConfig,
    pub(super) stats: Arc<SqliteStats>,
    /// The queue in front of the file's write lock (`write_queue.rs`); `None` for
    /// `:memory:` and for read-only opens.
    pub(super) queue: Option<WriteQueue>,
}

impl Inner {
    pub(super) fn writer(&self) -> Result<std::sync::MutexGuard<'_, Connection>> {
        let writer = self.writer.as_ref().ok_or_else(|| {
            SysdbError::Config(
                "this command opened the SQLite sysdb read-only and cannot change it (a bug: report it)".into(),
            )
        })?;
        // A panic while holding the lock poisons it; the connection itself is still
        // consistent (an open transaction was rolled back when it was dropped).
        Ok(writer.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// This process's turn at the file's write lock, for one write transaction (taken
    /// while holding [`Inner::writer`]); `None` where there is no file to share.
    pub(super) fn turn(&self) -> Result<Option<Turn<'_>>> {
        self.queue.as_ref().map(|q| q.turn(BUSY_TIMEOUT)).transpose()
    }
}

/// The SQLite sysdb. Cheap to clone (the connections are shared).
#[derive(Clone)]
pub struct SqliteSysdb {
    pub(super) inner: Arc<Inner>,
}

pub(super) fn is_memory(path: &str) -> bool {
    path.is_empty() || path == ":memory:"
}

pub(super) fn configure(conn: &Connection, path: &str) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    // Takes effect only on a new, empty database (before WAL mode is set), else a no-op.
    // 16 KiB pages keep a record with an embedding of up to ~4,000 dims in its table page
    // instead of an overflow chain; see the measurements in `sysdb/migrations.rs`.
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
pub(super) fn configure_reader(conn: &Connection) -> Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "cache_size", -READER_CACHE_SIZE_KIB)?;
    conn.pragma_update(None, "mmap_size", MMAP_SIZE)?;
    conn.pragma_update(None, "query_only", true)?;
    Ok(())
}

/// Apply the missing migration steps in one write transaction (see `sysdb/migrations.rs`).
///
/// A file already at the current schema is left alone without taking the write lock: a
/// read (which in WAL mode never waits for the writer) finds nothing to do. Otherwise a
/// replica opening the file of another, busy replica queued for the lock just to learn
/// that, and could miss it for over a minute while the other committed back to back
/// (the chaos run saw one exit so, `database is locked`, after 60 s of retries).
pub(super) fn migrate(conn: &mut Connection, queue: Option<&WriteQueue>) -> Result<()> {
    if schema_is_current(conn)? {
        return Ok(());
    }
    let _turn = queue.map(|q| q.turn(BUSY_TIMEOUT)).transpose()?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(migrations::CREATE_SCHEMA_MIGRATIONS)?;
    let current: i64 = tx.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?;
    for step in migrations::pending(migrations::SQLITE, current, BACKEND)? {
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

/// Whether the database has Sluice's schema at the current version (one read).
fn schema_is_current(conn: &Connection) -> Result<bool> {
    let has_table: bool = conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations')",
        [],
        |r| r.get(0),
    )?;
    if !has_table {
        return Ok(false);
    }
    let current: i64 = conn.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?;
    Ok(migrations::pending(migrations::SQLITE, current, BACKEND)?.is_empty())
}

pub(super) fn open_connection(path: &str) -> Result<Connection> {
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

pub(super) fn invalid(message: String) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message }
}

/// One batch waiting for a group commit, and where its outcome goes.
pub(super) struct PendingCommit {
    pub(super) batch: Arc<BatchCommit>,
    pub(super) reply: tokio::sync::oneshot::Sender<Result<CommitReport>>,
}

/// What a write transaction needs besides its connection: the `[sqlite]` bounds and the
/// writer's counters.
#[derive(Clone, Copy)]
pub(super) struct Writing<'a> {
    pub(super) tuning: &'a SqliteConfig,
    pub(super) stats: &'a SqliteStats,
}

impl<'a> Writing<'a> {
    pub(super) fn of(inner: &'a Inner) -> Writing<'a> {
        Writing { tuning: &inner.tuning, stats: &inner.stats }
    }

    /// Merge the records delta (`force`, or once it passed a bound), counting the merge.
    pub(super) fn merge(self, tx: &Connection, force: bool, acct: &mut values::Account) -> Result<bool> {
        let reason = values::merge_delta(tx, force, self.tuning, acct)?;
        if let Some(r) = reason {
            self.stats.merged(r);
        }
        Ok(reason.is_some())
    }

    /// Write the transaction's counts and compact the value log if its dead bytes passed
    /// the bound (`records` must be complete: the delta merged in this transaction).
    pub(super) fn flush_and_compact(self, tx: &Connection, acct: &mut values::Account) -> Result<()> {
        acct.flush(tx)?;
        if let Some(c) = values::compact(tx, self.tuning, acct.appended_bytes)? {
            self.stats.compacted(c);
        }
        Ok(())
    }
}

/// Open a reader connection on `path`. `read_only`: opened with `SQLITE_OPEN_READONLY`
/// for a command that only reads, which works on a file and directory the user may only
/// read when the database's `-wal` and `-shm` files exist; when neither exists (a copied
/// or cleanly closed database), it is opened as immutable (no WAL to read).
pub(super) fn open_reader(path: &str, read_only: bool) -> Result<Connection> {
    let conn = if read_only { open_read_only(path)? } else { open_connection(path)? };
    configure_reader(&conn)?;
    Ok(conn)
}

fn open_read_only(path: &str) -> Result<Connection> {
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX | OpenFlags::SQLITE_OPEN_URI;
    let cannot = |e: rusqlite::Error| SysdbError::Unavailable {
        backend: BACKEND,
        message: format!("opening {path:?} to read: {e}"),
    };
    // A first statement shows whether the WAL can be read (it needs the -shm file).
    let probe = |conn: &Connection| conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0));
    let plain = Connection::open_with_flags(path, flags).map_err(cannot)?;
    match probe(&plain) {
        Ok(_) => Ok(plain),
        Err(first) => {
            let wal = std::path::PathBuf::from(format!("{path}-wal"));
            let shm = std::path::PathBuf::from(format!("{path}-shm"));
            if wal.exists() || shm.exists() {
                return Err(SysdbError::Unavailable {
                    backend: BACKEND,
                    message: format!(
                        "cannot read {path:?} ({first}): a WAL database needs its -wal and -shm files to be readable \
                         (both must exist, and the directory must be writable if they do not); copy all three files \
                         together, or run any sluice command that writes once to recreate them"
                    ),
                });
            }
            // No WAL at all: the database file is the whole state, read it as immutable.
            let uri = format!("file:{}?immutable=1", encode_uri_path(path));
            let conn = Connection::open_with_flags(&uri, flags).map_err(cannot)?;
            probe(&conn).map_err(cannot)?;
            tracing::debug!(path, "sysdb opened as immutable (no -wal or -shm file, directory not writable)");
            Ok(conn)
        }
    }
}

/// A path as a `file:` URI path (percent-encoding what a URI reserves).
fn encode_uri_path(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'?' | b'#' | b'%' => out.push_str(&format!("%{b:02X}")),
            _ => out.push(b as char),
        }
    }
    out
}

impl SqliteSysdb {
    /// Counters of the writer's work (merges, compactions, write transactions), for the
    /// metrics and for tests.
    pub fn stats(&self) -> Arc<SqliteStats> {
        Arc::clone(&self.inner.stats)
    }

    /// Run `f` on the writer connection, off the async runtime. Counts a write
    /// transaction: every caller writes.
    pub(super) async fn write<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection, Writing<'_>) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        off_runtime(move || {
            let mut conn = inner.writer()?;
            let _turn = inner.turn()?;
            inner.stats.write_transaction();
            f(&mut conn, Writing::of(&inner))
        })
        .await?
    }

    /// Run `f` on a reader connection (the writer for `:memory:`). Readers are
    /// `query_only`: a read that tried to write would fail, and none waits for the
    /// writer's lock.
    pub(super) async fn read<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        off_runtime(move || {
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
        .await?
    }

    /// Run `f` on the writer connection without counting a write transaction: the
    /// processor's lookups of the records its next commit rewrites (their pages land in
    /// the writer's cache, where that commit needs them).
    pub(super) async fn on_writer<T, F>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T> + Send + 'static,
    {
        let inner = Arc::clone(&self.inner);
        off_runtime(move || {
            let mut conn = inner.writer()?;
            f(&mut conn)
        })
        .await?
    }

    pub async fn schema_version(&self) -> Result<i64> {
        self.read(|c| Ok(c.query_row("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", [], |r| r.get(0))?))
            .await
    }
}

/// Run `f` off the async runtime, on tokio's blocking pool (rusqlite blocks). Under the
/// position protocol's deterministic simulation (tests only, [`inline`]) the call runs on
/// the runtime's one thread instead, after one yield: the calls that other tasks make in
/// the same turn queue behind it (so a group commit still takes several batches), and then
/// it finishes before any other task runs, so which calls overlap and in what order they
/// finish is decided by the simulation, not by the thread pool.
pub(super) async fn off_runtime<T, F>(f: F) -> Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    #[cfg(test)]
    if inline::ON.with(std::cell::Cell::get) {
        tokio::task::yield_now().await;
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await.map_err(join_error)
}

pub(super) fn join_error(e: tokio::task::JoinError) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message: format!("sqlite worker task failed: {e}") }
}

/// The switch of [`off_runtime`]'s inline mode, per thread (the simulation's runtime
/// thread sets it).
#[cfg(test)]
pub(crate) mod inline {
    thread_local! {
        pub(crate) static ON: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
}
