//! SQLite backend: one file in WAL mode (the embedded default), or `:memory:` for tests.
//! This file opens it and holds its connections; each concern has a file of its own
//! (positions, records, the group commit, attached functions and their outbox, the audit
//! trail, the checkpoint thread; the value log and the delta in `values.rs`).
//!
//! rusqlite is blocking, so every call runs on `tokio::task::spawn_blocking`
//! (`store::off_runtime`; inline under the deterministic simulation) with the
//! connection behind a `std::sync::Mutex`: one writer connection per process, plus one
//! reader connection for a file database (WAL readers never block the writer and vice
//! versa, so admin reads do not queue behind a batch commit). Several processes may share
//! the file: a write first takes its turn in a queue of the file's Sluice writers
//! (`write_queue.rs`: SQLite's own lock has none, and a short-lived writer could starve
//! behind a busy replica), then the database lock (`BEGIN IMMEDIATE`); a writer that
//! cannot get either within the busy timeout gets `Unavailable` (retry).
//! What one file supports and what `synchronous = NORMAL` can cost: `docs/sqlite.md`.
//!
//! The compare-and-set of [`commit_batch`](SqliteSysdb::commit_batch) reads the
//! partition's `next_offset` *inside* the `BEGIN IMMEDIATE` transaction, i.e. while
//! holding the only write lock of the database: no other connection, in this process or
//! another, can move the position between the read and the commit.

use std::sync::{Arc, Mutex};

use super::error::{Result, SysdbError};
use super::migrations;
use crate::config::SqliteConfig;

mod attached;
mod audit;
mod changelog;
mod checkpoint;
mod commit;
mod positions;
mod readers;
mod records;
mod rows;
mod stats;
mod store;
#[cfg(test)]
mod tests;
mod values;
mod write_queue;

pub use stats::SqliteStats;
#[cfg(test)]
pub(crate) use store::inline;
pub use store::SqliteSysdb;

use checkpoint::spawn_checkpointer;
use store::{configure, is_memory, migrate, off_runtime, open_connection, open_reader, Inner, BACKEND};

impl SqliteSysdb {
    /// Open (creating if needed) and migrate the database at `path` (`:memory:` for a
    /// private in-memory database), with the default tuning.
    pub async fn open(path: &str) -> Result<SqliteSysdb> {
        Self::open_tuned(path, &SqliteConfig::DEFAULT).await
    }

    /// [`SqliteSysdb::open`] with the `[sqlite]` settings.
    pub async fn open_tuned(path: &str, tuning: &SqliteConfig) -> Result<SqliteSysdb> {
        let (path, tuning) = (path.to_string(), tuning.clone());
        let inner = off_runtime(move || -> Result<Arc<Inner>> {
            let mut writer = open_connection(&path)?;
            configure(&writer, &path)?;
            let queue = if is_memory(&path) { None } else { Some(write_queue::WriteQueue::open(&path)?) };
            migrate(&mut writer, queue.as_ref())?;
            let readers = if is_memory(&path) {
                Vec::new()
            } else {
                (0..tuning.reader_connections.max(1))
                    .map(|_| open_reader(&path, false).map(Mutex::new))
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
                queue,
            });
            if !is_memory(&path) {
                spawn_checkpointer(&path, Arc::downgrade(&inner))?;
            }
            Ok(inner)
        })
        .await??;
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
        let inner = off_runtime(move || -> Result<Arc<Inner>> {
            if !std::path::Path::new(&path).is_file() {
                return Err(SysdbError::Config(format!(
                    "no sysdb at {path:?} (the file does not exist): run `sluice init` to create it"
                )));
            }
            let first = open_reader(&path, true)?;
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
            migrations::require_current(migrations::SQLITE, current, BACKEND)?;
            let tuning = SqliteConfig { reader_connections: 1, ..SqliteConfig::DEFAULT };
            Ok(Arc::new(Inner {
                writer: None,
                pending: Mutex::new(Vec::new()),
                readers: vec![Mutex::new(first)],
                next_reader: Default::default(),
                delta: Mutex::new(values::DeltaCache::new(0)),
                tuning,
                stats: Arc::default(),
                queue: None,
            }))
        })
        .await??;
        Ok(SqliteSysdb { inner })
    }
}
