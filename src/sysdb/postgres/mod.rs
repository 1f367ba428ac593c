//! PostgreSQL backend: replicas on several machines share one database.
//!
//! A small `deadpool-postgres` pool (no TLS: connect over a trusted network or a local
//! proxy). Statements are prepared once per connection (`prepare_cached`).
//!
//! **Compare-and-set.** [`commit_batch`](PostgresSysdb::commit_batch) runs in
//! `READ COMMITTED` and starts with `SELECT next_offset … FOR UPDATE` on the partition
//! row. The row lock serializes every writer of that partition: a concurrent replica
//! committing the same `from` blocks on the lock until the first transaction ends, and
//! then PostgreSQL re-reads the *latest committed* row for it (READ COMMITTED's
//! `FOR UPDATE` re-check), so it sees the moved `next_offset`, fails the CAS and rolls
//! back without having written anything. Two replicas can therefore never both commit
//! the same `from`. We chose this over `REPEATABLE READ`: there the loser would get a
//! serialization failure (40001) instead of a clean `Conflict`, and every commit would
//! pay for conflict detection on all the rows it touches; the row lock gives the same
//! guarantee precisely where it is needed. Deadlocks (40P01, only possible if two
//! partitions ever touched the same records) and serialization failures are retried
//! once, then reported as `Unavailable`.
//!
//! **Batching.** Records are written with one `INSERT … SELECT … FROM UNNEST(arrays) ON
//! CONFLICT DO UPDATE` per chunk of about [`UPSERT_CHUNK_BYTES`] and one `DELETE …
//! USING UNNEST(arrays)`, collections with one `UNNEST` upsert. A batch without
//! attached functions sends its position check and all of these at once, pipelined
//! ([`write_pipelined`]): `BEGIN`, one flight of statements, `COMMIT` (measured on W1
//! drains, 10 interleaved pairs: records/s 51,750 -> 56,700 at the median, better in 8
//! pairs; the server's CPU 13.8 against 14.2 s at the median). Binary `COPY` into a
//! per-session temporary staging table followed by one `INSERT … SELECT … ON CONFLICT`
//! was measured against this (W1 drain of 300k records, 5 interleaved rounds each):
//! client + server CPU-s per 1M records 38.7-45.7 with `UNNEST`, 39.5-47.2 with `COPY`
//! (server alone 19-22 for both), records/s no better; only the client's peak RSS was
//! lower (~350 MB against ~490). The server spends the same whichever way the rows
//! arrive, so its cost is in executing the upsert, and the simpler path stayed.
//!
//! **Ambiguous commits.** If the connection drops while `COMMIT` is in flight, the
//! outcome is unknown and the call returns `Unavailable`; a retry then fails the CAS
//! with `PositionMoved { stored == delta.to }` when the first attempt had landed.

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime};
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;

use super::error::{Result, SysdbError};
use super::migrations;
use super::types::now_ms;
use crate::redact::redact_url;

mod attached;
mod audit;
mod changelog;
mod commit;
mod positions;
mod records;

const BACKEND: &str = "postgres";

/// Connections per process: the processor commits one batch at a time per partition
/// worker; admin reads and the backfill worker use the rest.
const POOL_SIZE: usize = 8;
/// Server-side limit on a transaction left idle by its client (see `open`). Batch and
/// backfill transactions never wait on the client for long: they are a few statements.
const IDLE_IN_TRANSACTION_OPTION: &str = "-c idle_in_transaction_session_timeout=10000";
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a caller waits for a free pooled connection before `Unavailable`.
const POOL_WAIT_TIMEOUT: Duration = Duration::from_secs(30);
/// Key of the advisory lock that serializes concurrent migrations (any value, fixed).
const MIGRATION_LOCK_KEY: i64 = 0x51_1ce0_0001_i64;

/// The PostgreSQL sysdb. Cheap to clone (the pool is shared).
#[derive(Clone)]
pub struct PostgresSysdb {
    pool: Pool,
}

/// Error messages with their cause chain (tokio-postgres' `Display` omits the cause).
fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut message = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    message
}

/// Whether `code` is transient: the server is going away, overloaded, read-only after a
/// failover, or a concurrent transaction got in the way.
fn is_transient_state(code: &SqlState) -> bool {
    let code = code.code();
    code.starts_with("08") // connection exception
        || code.starts_with("53") // insufficient resources (too many connections, disk full)
        || matches!(code, "57P01" | "57P02" | "57P03") // admin / crash shutdown, cannot connect now
        || matches!(code, "40001" | "40P01") // serialization failure, deadlock
        || code == "55P03" // lock not available (lock_timeout)
        || code == "25P03" // idle-in-transaction session timeout: the session was ended
        || code == "25006" // read-only transaction: a standby after failover
}

/// Whether `code` says the database refused a *value* it was given: class 22 (data
/// exception: invalid text such as U+0000 or bad UTF-8 (22021), a string too long for its
/// column (22001), a number out of range) and 54000 (program limit exceeded: an index
/// entry larger than a B-tree page allows). The same statement with other values can
/// succeed; retrying it with these cannot.
fn is_record_state(code: &SqlState) -> bool {
    let code = code.code();
    code.starts_with("22") || code == "54000"
}

/// Retried once inside the call before being reported.
fn is_retry_once(e: &tokio_postgres::Error) -> bool {
    matches!(e.code(), Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED)
}

impl From<tokio_postgres::Error> for SysdbError {
    fn from(e: tokio_postgres::Error) -> Self {
        let message = describe(&e);
        if let Some(code) = e.code() {
            if is_transient_state(code) {
                return SysdbError::Unavailable { backend: BACKEND, message };
            }
            if is_record_state(code) {
                return SysdbError::Rejected { backend: BACKEND, message };
            }
            // Wrong credentials or database: the URL is at fault.
            if code.code().starts_with("28") || *code == SqlState::INVALID_CATALOG_NAME {
                return SysdbError::Config(message);
            }
            return SysdbError::Database { backend: BACKEND, message };
        }
        let io = std::error::Error::source(&e).is_some_and(|s| s.is::<std::io::Error>());
        let display = e.to_string();
        if e.is_closed() || io || display.starts_with("timeout") || display.starts_with("error connecting") {
            SysdbError::Unavailable { backend: BACKEND, message }
        } else {
            SysdbError::Database { backend: BACKEND, message }
        }
    }
}

impl From<PoolError> for SysdbError {
    fn from(e: PoolError) -> Self {
        match e {
            PoolError::Backend(e) => e.into(),
            PoolError::Timeout(_) | PoolError::Closed => {
                SysdbError::Unavailable { backend: BACKEND, message: describe(&e) }
            }
            PoolError::NoRuntimeSpecified | PoolError::PostCreateHook(_) => {
                SysdbError::Database { backend: BACKEND, message: describe(&e) }
            }
        }
    }
}

/// An error inside a transaction: the database's (kept whole, so that the caller can tell
/// a deadlock or serialization failure and retry) or ours.
#[derive(Debug)]
pub(super) enum TxError {
    Pg(tokio_postgres::Error),
    Sysdb(SysdbError),
}

impl From<tokio_postgres::Error> for TxError {
    fn from(e: tokio_postgres::Error) -> Self {
        TxError::Pg(e)
    }
}

impl From<SysdbError> for TxError {
    fn from(e: SysdbError) -> Self {
        TxError::Sysdb(e)
    }
}

impl From<TxError> for SysdbError {
    fn from(e: TxError) -> Self {
        match e {
            TxError::Pg(e) => e.into(),
            TxError::Sysdb(e) => e,
        }
    }
}

fn invalid(message: String) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message }
}

impl PostgresSysdb {
    /// Connect (lazily, through the pool) and migrate. The password never appears in
    /// errors: they name the target with [`redact_url`].
    pub async fn open(url: &str) -> Result<PostgresSysdb> {
        Self::open_with(url, true).await
    }

    /// Connect without creating or migrating anything: a database without Sluice's schema
    /// or at an older version is a `Config` error naming `sluice init`.
    pub async fn open_existing(url: &str) -> Result<PostgresSysdb> {
        Self::open_with(url, false).await
    }

    async fn open_with(url: &str, migrate_schema: bool) -> Result<PostgresSysdb> {
        let target = redact_url(url);
        let mut config: tokio_postgres::Config = url.parse().map_err(|e: tokio_postgres::Error| {
            SysdbError::Config(format!("invalid PostgreSQL URL {target}: {}", describe(&e)))
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("sluice");
        }
        if config.get_options().is_none() {
            // A replica frozen (SIGSTOP, a long GC-like pause, a partition of the network)
            // in the middle of a batch transaction holds its partition row lock; the server
            // ends such an idle transaction so that the new owner of the partition is not
            // blocked behind it. The zombie's COMMIT then fails, and its retry is refused
            // by the compare-and-set.
            config.options(IDLE_IN_TRANSACTION_OPTION);
        }
        let manager = Manager::from_config(config, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(POOL_WAIT_TIMEOUT))
            .create_timeout(Some(CONNECT_TIMEOUT))
            .build()
            .map_err(|e| SysdbError::Config(format!("PostgreSQL pool for {target}: {e}")))?;
        let db = PostgresSysdb { pool };
        let prepared = if migrate_schema { db.migrate().await } else { db.check_current().await };
        prepared.map_err(|e| match e {
            SysdbError::Unavailable { backend, message } => {
                SysdbError::Unavailable { backend, message: format!("{target}: {message}") }
            }
            SysdbError::Database { backend, message } => {
                SysdbError::Database { backend, message: format!("{target}: {message}") }
            }
            SysdbError::Config(message) => SysdbError::Config(format!("{target}: {message}")),
            other => other,
        })?;
        Ok(db)
    }

    async fn client(&self) -> Result<Object> {
        Ok(self.pool.get().await?)
    }

    /// The read-only counterpart of `migrate`: the schema must be there and current.
    async fn check_current(&self) -> Result<()> {
        let client = self.client().await?;
        let has_table: bool =
            client.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[]).await?.get(0);
        let current = if has_table {
            Some(client.query_one("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[]).await?.get(0))
        } else {
            None
        };
        migrations::require_current(migrations::POSTGRES, current, BACKEND)
    }

    /// Apply the missing migration steps in one transaction. Replicas starting together
    /// serialize on an advisory lock, so each step runs once.
    async fn migrate(&self) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
        tx.batch_execute(migrations::CREATE_SCHEMA_MIGRATIONS).await?;
        let current: i64 =
            tx.query_one("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[]).await?.get(0);
        for step in migrations::pending(migrations::POSTGRES, current, BACKEND)? {
            tx.batch_execute(step.sql).await?;
            tx.execute(
                "INSERT INTO schema_migrations (version, description, applied_at_ms) VALUES ($1, $2, $3)",
                &[&step.version, &step.description, &now_ms()],
            )
            .await?;
            tracing::info!(version = step.version, description = step.description, "postgres sysdb migrated");
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn schema_version(&self) -> Result<i64> {
        let client = self.client().await?;
        Ok(client.query_one("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[]).await?.get(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The memory formula (`config/memory.rs`) counts this pool.
    #[test]
    fn the_memory_formula_counts_this_pool() {
        assert_eq!(POOL_SIZE as u64, crate::config::memory::POSTGRES_POOL);
    }

    #[test]
    fn sqlstates_are_classified() {
        use crate::sysdb::error::ErrorClass;
        let class = |code: &str| {
            let state = SqlState::from_code(code);
            if is_transient_state(&state) {
                ErrorClass::Transient
            } else if is_record_state(&state) {
                ErrorClass::Record
            } else {
                ErrorClass::Fatal
            }
        };
        for code in
            ["08006", "08001", "40001", "40P01", "55P03", "57P01", "57P02", "57P03", "53300", "53100", "25P03", "25006"]
        {
            assert_eq!(class(code), ErrorClass::Transient, "{code}");
        }
        for code in ["22021", "22001", "22003", "22P02", "54000"] {
            assert_eq!(class(code), ErrorClass::Record, "{code}");
        }
        for code in ["42P01", "23505", "XX000", "42703", "54001"] {
            assert_eq!(class(code), ErrorClass::Fatal, "{code}");
        }
    }

    #[tokio::test]
    async fn connection_refused_is_unavailable_and_hides_the_password() {
        // Port 1 on loopback: nothing listens there.
        let err = match PostgresSysdb::open("postgres://u:hunter2@127.0.0.1:1/db?connect_timeout=2").await {
            Err(e) => e,
            Ok(_) => panic!("connected to port 1"),
        };
        assert!(err.is_retryable(), "{err}");
        let text = format!("{err} {err:?}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("127.0.0.1:1"), "{text}");
    }

    #[tokio::test]
    async fn a_malformed_url_is_a_config_error_without_the_password() {
        match PostgresSysdb::open("postgres://u:hunter2@127.0.0.1:notaport/db").await {
            Err(SysdbError::Config(m)) => assert!(!m.contains("hunter2"), "{m}"),
            Err(e) => panic!("expected Config, got {e}"),
            Ok(_) => panic!("parsed a malformed URL"),
        }
    }
}
