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

use std::collections::HashMap;
use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime, Transaction};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::NoTls;

use super::codec::{decode_record, encode_embedding, encode_metadata};
use super::schema;
use super::{
    now_ms, redact_url, BatchCommit, CollectionRow, CommitReport, DlqReplayRow, GapRow, PartitionState, ResetRow,
    Result, SysdbError,
};
use crate::positions::{IncompatibleDelta, PositionDelta};
use crate::record::Record;

mod functions;

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
/// An `INSERT … UNNEST` statement carries records until their values reach this many
/// bytes (or [`UPSERT_CHUNK_RECORDS`] records). Each connection keeps a buffer as large as
/// the largest message it sent, and each statement's parameters are encoded whole before
/// it is sent: with 8 partitions committing at once, 5,000-record statements held about
/// 200 MB of buffers on a W1 drain. Measured on W1 drains on PostgreSQL (600k records,
/// 3 interleaved pairs per step): 5,000 to 1,000 records per statement lowered the
/// replica's peak RSS by 113 MB and its CPU by 5%, 1,000 to 400 by 35 MB and 2.7%.
const UPSERT_CHUNK_BYTES: usize = 768 << 10;
/// At most this many records per statement, however small they are.
const UPSERT_CHUNK_RECORDS: usize = 5_000;
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

fn invalid(message: String) -> SysdbError {
    SysdbError::Database { backend: BACKEND, message }
}

/// A batch as column arrays for the `UNNEST` statements, with duplicates folded the way
/// applying the collection updates one after the other would: for a collection listed
/// twice the first partition and first dimension stick, the last `log_position` wins and
/// the count deltas add up; for an id written twice the last write wins.
/// (`ON CONFLICT DO UPDATE` refuses to touch one row twice in a statement.)
#[derive(Default)]
struct BatchRows<'a> {
    coll_ids: Vec<&'a str>,
    coll_partitions: Vec<i32>,
    coll_dimensions: Vec<Option<i32>>,
    coll_positions: Vec<i64>,
    coll_deltas: Vec<i64>,
    up_collections: Vec<&'a str>,
    up_ids: Vec<&'a str>,
    up_embeddings: Vec<Option<&'a [u8]>>,
    up_metadata: Vec<Option<String>>,
    up_documents: Vec<Option<&'a str>>,
    up_offsets: Vec<i64>,
    del_collections: Vec<&'a str>,
    del_ids: Vec<&'a str>,
}

impl<'a> BatchRows<'a> {
    fn new(batch: &'a BatchCommit) -> Result<Self> {
        let mut rows = BatchRows::default();
        let mut coll_index: HashMap<&str, usize> = HashMap::new();
        let mut writes: Vec<(&str, &str, Option<&Record>)> = Vec::new();
        let mut write_index: HashMap<(&str, &str), usize> = HashMap::new();
        for c in &batch.collections {
            let dimension = c
                .dimension
                .map(|d| {
                    i32::try_from(d).map_err(|_| invalid(format!("collection {:?}: dimension {d} too large", c.id)))
                })
                .transpose()?;
            match coll_index.get(c.id.as_str()) {
                Some(&i) => {
                    rows.coll_dimensions[i] = rows.coll_dimensions[i].or(dimension);
                    rows.coll_positions[i] = c.log_position;
                    rows.coll_deltas[i] += c.record_count_delta;
                }
                None => {
                    coll_index.insert(&c.id, rows.coll_ids.len());
                    rows.coll_ids.push(&c.id);
                    rows.coll_partitions.push(c.partition);
                    rows.coll_dimensions.push(dimension);
                    rows.coll_positions.push(c.log_position);
                    rows.coll_deltas.push(c.record_count_delta);
                }
            }
            for (id, write) in &c.writes {
                let key = (c.id.as_str(), id.as_str());
                match write_index.get(&key) {
                    Some(&i) => writes[i].2 = write.as_ref(),
                    None => {
                        write_index.insert(key, writes.len());
                        writes.push((key.0, key.1, write.as_ref()));
                    }
                }
            }
        }
        for (collection, id, write) in writes {
            match write {
                Some(r) => {
                    rows.up_collections.push(collection);
                    rows.up_ids.push(id);
                    rows.up_embeddings.push(r.embedding.as_ref().map(encode_embedding));
                    rows.up_metadata.push(encode_metadata(&r.metadata));
                    rows.up_documents.push(r.document.as_deref());
                    rows.up_offsets.push(r.offset);
                }
                None => {
                    rows.del_collections.push(collection);
                    rows.del_ids.push(id);
                }
            }
        }
        Ok(rows)
    }

    /// Where the upsert statement that starts at record `start` ends (exclusive): at
    /// least one record, then up to [`UPSERT_CHUNK_BYTES`] of values or
    /// [`UPSERT_CHUNK_RECORDS`] records.
    fn chunk_end(&self, start: usize) -> usize {
        let mut bytes = 0;
        let mut end = start;
        while end < self.up_ids.len()
            && end - start < UPSERT_CHUNK_RECORDS
            && (end == start || bytes < UPSERT_CHUNK_BYTES)
        {
            bytes += self.up_ids[end].len()
                + self.up_embeddings[end].as_ref().map_or(0, |e| e.len())
                + self.up_metadata[end].as_ref().map_or(0, String::len)
                + self.up_documents[end].map_or(0, str::len);
            end += 1;
        }
        end
    }
}

const SELECT_FOR_UPDATE: &str = "SELECT next_offset FROM partitions WHERE topic = $1 AND partition = $2 FOR UPDATE";
const UPDATE_POSITION: &str =
    "UPDATE partitions SET next_offset = $3, updated_at_ms = $4 WHERE topic = $1 AND partition = $2";
const UPSERT_POSITION: &str = "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES ($1, $2, $3, $4)
     ON CONFLICT (topic, partition) DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at_ms = EXCLUDED.updated_at_ms";
const UPSERT_COLLECTIONS: &str = "INSERT INTO collections AS c (id, partition, dimension, log_position, record_count, created_at_ms)
     SELECT u.id, u.partition, u.dimension, u.log_position, u.delta, $6
     FROM UNNEST($1::text[], $2::int4[], $3::int4[], $4::int8[], $5::int8[]) AS u(id, partition, dimension, log_position, delta)
     ON CONFLICT (id) DO UPDATE SET
         dimension = COALESCE(c.dimension, EXCLUDED.dimension),
         log_position = EXCLUDED.log_position,
         record_count = c.record_count + EXCLUDED.record_count";
const UPSERT_RECORDS: &str = "INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset)
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::bytea[], $4::text[], $5::text[], $6::int8[])
     ON CONFLICT (collection_id, id) DO UPDATE SET
         embedding = EXCLUDED.embedding, metadata = EXCLUDED.metadata,
         document = EXCLUDED.document, last_offset = EXCLUDED.last_offset";
const DELETE_RECORDS: &str = "DELETE FROM records r USING UNNEST($1::text[], $2::text[]) AS d(collection_id, id)
     WHERE r.collection_id = d.collection_id AND r.id = d.id";
const COLLECTION_COLUMNS: &str = "id, partition, dimension, log_position, record_count";
const RECORD_COLUMNS: &str = "id, embedding, metadata, document, last_offset";

type Params<'p> = Vec<&'p (dyn ToSql + Sync)>;

/// One records upsert's parameters: a chunk of the batch's upserts ([`BatchRows::chunk_end`]).
type Chunk<'s, 'a> =
    (&'s [&'a str], &'s [&'a str], &'s [Option<&'a [u8]>], &'s [Option<String>], &'s [Option<&'a str>], &'s [i64]);

impl<'a> BatchRows<'a> {
    /// The records upserts' parameters, chunk by chunk.
    fn chunks(&self) -> Vec<Chunk<'_, 'a>> {
        let mut chunks = Vec::new();
        let mut start = 0;
        while start < self.up_ids.len() {
            let end = self.chunk_end(start);
            let r = start..end;
            chunks.push((
                &self.up_collections[r.clone()],
                &self.up_ids[r.clone()],
                &self.up_embeddings[r.clone()],
                &self.up_metadata[r.clone()],
                &self.up_documents[r.clone()],
                &self.up_offsets[r],
            ));
            start = end;
        }
        chunks
    }
}

/// The statements that write a batch's collections and records.
struct WriteStatements {
    upsert_collections: tokio_postgres::Statement,
    upsert_records: tokio_postgres::Statement,
    delete_records: tokio_postgres::Statement,
}

impl WriteStatements {
    async fn prepare(tx: &Transaction<'_>) -> std::result::Result<Self, tokio_postgres::Error> {
        Ok(WriteStatements {
            upsert_collections: tx.prepare_cached(UPSERT_COLLECTIONS).await?,
            upsert_records: tx.prepare_cached(UPSERT_RECORDS).await?,
            delete_records: tx.prepare_cached(DELETE_RECORDS).await?,
        })
    }

    /// A batch's writes with their parameters, in the order they run: the collections
    /// upsert, one records upsert per chunk, the deletes (each only if it has rows).
    fn writes<'s>(
        &'s self,
        rows: &'s BatchRows<'_>,
        chunks: &'s [Chunk<'s, '_>],
        now: &'s i64,
    ) -> Vec<(&'s tokio_postgres::Statement, Params<'s>)> {
        let mut writes: Vec<(&tokio_postgres::Statement, Params<'s>)> = Vec::with_capacity(chunks.len() + 3);
        if !rows.coll_ids.is_empty() {
            writes.push((
                &self.upsert_collections,
                vec![
                    &rows.coll_ids,
                    &rows.coll_partitions,
                    &rows.coll_dimensions,
                    &rows.coll_positions,
                    &rows.coll_deltas,
                    now,
                ],
            ));
        }
        for c in chunks {
            writes.push((&self.upsert_records, vec![&c.0, &c.1, &c.2, &c.3, &c.4, &c.5]));
        }
        if !rows.del_ids.is_empty() {
            writes.push((&self.delete_records, vec![&rows.del_collections, &rows.del_ids]));
        }
        writes
    }
}

/// One attempt of a batch commit. The outer `Result` is the database's, the inner one the
/// CAS outcome (rolled back, nothing written).
async fn commit_once(
    client: &mut Object,
    batch: &BatchCommit,
    rows: &BatchRows<'_>,
) -> std::result::Result<std::result::Result<CommitReport, IncompatibleDelta>, functions::TxError> {
    let (topic, partition) = (&batch.topic, &batch.delta.partition);
    let tx = client.transaction().await?;
    if batch.functions.is_empty() {
        return match write_pipelined(&tx, batch, rows).await? {
            Ok(()) => {
                tx.commit().await?;
                Ok(Ok(CommitReport::default()))
            }
            Err(conflict) => {
                tx.rollback().await?;
                Ok(Err(conflict))
            }
        };
    }
    let stored: Option<i64> =
        tx.query_opt(&tx.prepare_cached(SELECT_FOR_UPDATE).await?, &[topic, partition]).await?.map(|r| r.get(0));
    if let Err(conflict) = batch.delta.check(stored) {
        tx.rollback().await?;
        return Ok(Err(conflict));
    }
    // The batch's attached functions, locked FOR SHARE before anything else is written
    // (lock order: partition, functions, collections; see `postgres/functions.rs`).
    let states = functions::lock_functions(&tx, batch).await?;
    let now = now_ms();
    let prepared = WriteStatements::prepare(&tx).await?;
    let chunks = rows.chunks();
    for (stmt, params) in prepared.writes(rows, &chunks, &now) {
        tx.execute(stmt, &params).await?;
    }
    let report = functions::commit_functions(&tx, batch, states, now).await?;
    let stmt = tx.prepare_cached(UPDATE_POSITION).await?;
    tx.execute(&stmt, &[topic, partition, &batch.delta.to, &now]).await?;
    tx.commit().await?;
    Ok(Ok(report))
}

/// A batch without attached functions: the position's compare-and-set read and every
/// write of the batch go out back to back, pipelined, instead of one round trip each.
/// tokio-postgres sends a statement when its future is first polled, and these are
/// polled in order, so the server runs them in this order: the partition row lock first
/// (a second writer of the partition waits there, with all its writes behind it), then
/// collections, records, deletes and the position, as in the sequential path. If the
/// read shows that the position moved, the answer is `Err(conflict)` (as
/// [`PositionDelta::check`] says), even if a write failed as well, and the caller rolls
/// back whatever the writes did.
async fn write_pipelined(
    tx: &Transaction<'_>,
    batch: &BatchCommit,
    rows: &BatchRows<'_>,
) -> std::result::Result<std::result::Result<(), IncompatibleDelta>, functions::TxError> {
    let (topic, partition) = (&batch.topic, &batch.delta.partition);
    let select = tx.prepare_cached(SELECT_FOR_UPDATE).await?;
    let prepared = WriteStatements::prepare(tx).await?;
    let update_position = tx.prepare_cached(UPDATE_POSITION).await?;
    let now = now_ms();
    let chunks = rows.chunks();
    let mut statements = prepared.writes(rows, &chunks, &now);
    let to = batch.delta.to;
    statements.push((&update_position, vec![topic, partition, &to, &now]));
    let key: [&(dyn ToSql + Sync); 2] = [topic, partition];
    let read = tx.query_opt(&select, &key);
    let writes = futures_util::future::try_join_all(statements.iter().map(|(stmt, params)| tx.execute(*stmt, params)));
    let (stored, written) = futures_util::future::join(read, writes).await;
    // A moved position is the answer even if a write failed too (a zombie's batch is a
    // conflict, not a bad record); otherwise the first failed write is.
    if let Err(conflict) = batch.delta.check(stored?.map(|r| r.get(0))) {
        return Ok(Err(conflict));
    }
    written?;
    Ok(Ok(()))
}

fn decode_collection(r: &tokio_postgres::Row) -> Result<CollectionRow> {
    let id: String = r.get(0);
    let dimension: Option<i32> = r.get(2);
    let dimension = dimension
        .map(|d| u32::try_from(d).map_err(|_| invalid(format!("collection {id:?}: stored dimension {d} out of range"))))
        .transpose()?;
    Ok(CollectionRow { id, partition: r.get(1), dimension, log_position: r.get(3), record_count: r.get(4) })
}

fn decode_row(r: &tokio_postgres::Row) -> Result<Record> {
    decode_row_at(r, 0)
}

/// A record from the `RECORD_COLUMNS` starting at column `at`.
fn decode_row_at(r: &tokio_postgres::Row, at: usize) -> Result<Record> {
    decode_record(BACKEND, r.get(at), r.get(at + 1), r.get(at + 2), r.get(at + 3), r.get(at + 4))
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
        schema::require_current(schema::POSTGRES, current, BACKEND)
    }

    /// Apply the missing migration steps in one transaction. Replicas starting together
    /// serialize on an advisory lock, so each step runs once.
    async fn migrate(&self) -> Result<()> {
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK_KEY]).await?;
        tx.batch_execute(schema::CREATE_SCHEMA_MIGRATIONS).await?;
        let current: i64 =
            tx.query_one("SELECT COALESCE(MAX(version), 0)::int8 FROM schema_migrations", &[]).await?.get(0);
        for step in schema::pending(schema::POSTGRES, current, BACKEND)? {
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

    pub async fn set_topic_partitions(&self, topic: &str, partitions: i32) -> Result<()> {
        let client = self.client().await?;
        client
            .execute(
                "INSERT INTO meta (key, value) VALUES ($1, $2) ON CONFLICT (key) DO UPDATE SET value = EXCLUDED.value",
                &[&super::topic_partitions_key(topic), &partitions.to_string()],
            )
            .await?;
        Ok(())
    }

    pub async fn topic_partitions(&self, topic: &str) -> Result<Option<i32>> {
        let client = self.client().await?;
        let key = super::topic_partitions_key(topic);
        let row = client.query_opt("SELECT value FROM meta WHERE key = $1", &[&key]).await?;
        row.map(|r| {
            let v: String = r.get(0);
            v.parse::<i32>().map_err(|_| invalid(format!("meta {key:?} is not a partition count: {v:?}")))
        })
        .transpose()
    }

    pub async fn positions(&self, topic: &str) -> Result<HashMap<i32, i64>> {
        let client = self.client().await?;
        let stmt = client.prepare_cached("SELECT partition, next_offset FROM partitions WHERE topic = $1").await?;
        Ok(client.query(&stmt, &[&topic]).await?.iter().map(|r| (r.get(0), r.get(1))).collect())
    }

    pub async fn partition_states(&self, topic: &str) -> Result<Vec<PartitionState>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT partition, next_offset, halted_reason, halted_at_ms FROM partitions WHERE topic = $1 ORDER BY partition",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| PartitionState {
                partition: r.get(0),
                next_offset: r.get(1),
                halted_reason: r.get(2),
                halted_at_ms: r.get(3),
            })
            .collect())
    }

    pub async fn set_partition_halted(&self, topic: &str, partition: i32, reason: Option<&str>) -> Result<()> {
        let client = self.client().await?;
        // A halt that goes on keeps its start time; clearing resets both columns.
        let changed = client
            .execute(
                "UPDATE partitions SET
                     halted_at_ms = CASE WHEN $3::text IS NULL THEN NULL WHEN halted_reason IS NULL THEN $4 ELSE halted_at_ms END,
                     halted_reason = $3::text
                 WHERE topic = $1 AND partition = $2",
                &[&topic, &partition, &reason, &now_ms()],
            )
            .await?;
        if changed == 0 && reason.is_some() {
            return Err(invalid(format!("cannot halt partition {partition} of {topic:?}: it has no position row")));
        }
        Ok(())
    }

    pub async fn init_position(&self, topic: &str, partition: i32, next_offset: i64) -> Result<i64> {
        if next_offset < 0 {
            return Err(invalid(format!("partition {partition}: next_offset {next_offset} is negative")));
        }
        let client = self.client().await?;
        // Rows are never deleted, so insert-if-absent then read is race-free.
        client
            .execute(
                "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES ($1, $2, $3, $4)
                 ON CONFLICT (topic, partition) DO NOTHING",
                &[&topic, &partition, &next_offset, &now_ms()],
            )
            .await?;
        Ok(client
            .query_one("SELECT next_offset FROM partitions WHERE topic = $1 AND partition = $2", &[&topic, &partition])
            .await?
            .get(0))
    }

    pub async fn collections(&self) -> Result<Vec<CollectionRow>> {
        let client = self.client().await?;
        let rows = client.query(&format!("SELECT {COLLECTION_COLUMNS} FROM collections ORDER BY id"), &[]).await?;
        rows.iter().map(decode_collection).collect()
    }

    pub async fn collections_named(&self, ids: Vec<String>) -> Result<HashMap<String, CollectionRow>> {
        let client = self.client().await?;
        let stmt =
            client.prepare_cached(&format!("SELECT {COLLECTION_COLUMNS} FROM collections WHERE id = ANY($1)")).await?;
        let rows = client.query(&stmt, &[&ids]).await?;
        rows.iter().map(|r| decode_collection(r).map(|c| (c.id.clone(), c))).collect()
    }

    pub async fn collection(&self, id: &str) -> Result<Option<CollectionRow>> {
        let client = self.client().await?;
        let stmt =
            client.prepare_cached(&format!("SELECT {COLLECTION_COLUMNS} FROM collections WHERE id = $1")).await?;
        client.query_opt(&stmt, &[&id]).await?.as_ref().map(decode_collection).transpose()
    }

    pub async fn get_records(&self, collection: &str, ids: &[String]) -> Result<HashMap<String, Record>> {
        if ids.is_empty() {
            return Ok(HashMap::new());
        }
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT {RECORD_COLUMNS} FROM records WHERE collection_id = $1 AND id = ANY($2::text[])"
            ))
            .await?;
        let rows = client.query(&stmt, &[&collection, &ids]).await?;
        rows.iter().map(|r| decode_row(r).map(|rec| (rec.id.clone(), rec))).collect()
    }

    /// Always whole records (the `full` flag is a permission to leave fields out, which
    /// this backend does not use).
    pub async fn get_records_many(
        &self,
        wanted: Vec<(String, Vec<(String, bool)>)>,
    ) -> Result<HashMap<String, HashMap<String, Record>>> {
        let (mut collections, mut ids): (Vec<&str>, Vec<&str>) = (Vec::new(), Vec::new());
        for (c, wanted_ids) in &wanted {
            for (id, _) in wanted_ids {
                collections.push(c.as_str());
                ids.push(id.as_str());
            }
        }
        let mut out: HashMap<String, HashMap<String, Record>> = HashMap::new();
        if ids.is_empty() {
            return Ok(out);
        }
        let client = self.client().await?;
        let stmt = client
            .prepare_cached(&format!(
                "SELECT collection_id, {RECORD_COLUMNS} FROM records
                 WHERE (collection_id, id) IN (SELECT c, i FROM unnest($1::text[], $2::text[]) AS w(c, i))"
            ))
            .await?;
        let rows = client.query(&stmt, &[&collections, &ids]).await?;
        for row in &rows {
            let collection: String = row.try_get(0)?;
            let record = decode_row_at(row, 1)?;
            out.entry(collection).or_default().insert(record.id.clone(), record);
        }
        Ok(out)
    }

    pub async fn list_records(&self, collection: &str, after_id: Option<&str>, limit: usize) -> Result<Vec<Record>> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let client = self.client().await?;
        let rows = match after_id {
            Some(after) => {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {RECORD_COLUMNS} FROM records WHERE collection_id = $1 AND id > $2 ORDER BY id LIMIT $3"
                    ))
                    .await?;
                client.query(&stmt, &[&collection, &after, &limit]).await?
            }
            None => {
                let stmt = client
                    .prepare_cached(&format!(
                        "SELECT {RECORD_COLUMNS} FROM records WHERE collection_id = $1 ORDER BY id LIMIT $2"
                    ))
                    .await?;
                client.query(&stmt, &[&collection, &limit]).await?
            }
        };
        rows.iter().map(decode_row).collect()
    }

    pub async fn commit_batch(&self, batch: &BatchCommit) -> Result<CommitReport> {
        PositionDelta::new(batch.delta.partition, batch.delta.from, batch.delta.to)
            .map_err(|e| invalid(e.to_string()))?;
        let rows = BatchRows::new(batch)?;
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match commit_once(&mut client, batch, &rows).await {
                Ok(outcome) => return outcome.map_err(SysdbError::from),
                Err(functions::TxError::Pg(e)) if attempt == 1 && is_retry_once(&e) => {
                    tracing::debug!(error = %describe(&e), partition = batch.delta.partition, "sysdb commit retried once");
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    pub async fn record_gap(&self, topic: &str, partition: i32, from: i64, to: i64) -> Result<()> {
        let delta = PositionDelta::new(partition, from, to).map_err(|e| invalid(format!("gap: {e}")))?;
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        let stored: Option<i64> = tx.query_opt(SELECT_FOR_UPDATE, &[&topic, &partition]).await?.map(|r| r.get(0));
        if let Err(conflict) = delta.check(stored) {
            tx.rollback().await?;
            return Err(conflict.into());
        }
        let now = now_ms();
        tx.execute(
            "INSERT INTO gaps (topic, partition, from_offset, to_offset, recorded_at_ms) VALUES ($1, $2, $3, $4, $5)",
            &[&topic, &partition, &from, &to, &now],
        )
        .await?;
        tx.execute(UPDATE_POSITION, &[&topic, &partition, &to, &now]).await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn gaps(&self, topic: &str) -> Result<Vec<GapRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, partition, from_offset, to_offset, recorded_at_ms FROM gaps WHERE topic = $1 ORDER BY id",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| GapRow {
                topic: r.get(0),
                partition: r.get(1),
                from_offset: r.get(2),
                to_offset: r.get(3),
                recorded_at_ms: r.get(4),
            })
            .collect())
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
        let mut client = self.client().await?;
        let tx = client.transaction().await?;
        // Lock the row (if any) so that the audited `from_offset` is the value replaced.
        let previous: Option<i64> = tx.query_opt(SELECT_FOR_UPDATE, &[&topic, &partition]).await?.map(|r| r.get(0));
        let now = now_ms();
        tx.execute(UPSERT_POSITION, &[&topic, &partition, &to, &now]).await?;
        tx.execute(
            "UPDATE partitions SET halted_reason = NULL, halted_at_ms = NULL WHERE topic = $1 AND partition = $2",
            &[&topic, &partition],
        )
        .await?;
        tx.execute(
            "INSERT INTO offset_resets (topic, partition, from_offset, to_offset, actor, reason, at_ms)
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
            &[&topic, &partition, &previous, &to, &actor, &reason, &now],
        )
        .await?;
        tx.commit().await?;
        Ok(previous)
    }

    pub async fn resets(&self, topic: &str) -> Result<Vec<ResetRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, partition, from_offset, to_offset, actor, reason, at_ms FROM offset_resets WHERE topic = $1 ORDER BY id",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| ResetRow {
                topic: r.get(0),
                partition: r.get(1),
                from_offset: r.get(2),
                to_offset: r.get(3),
                actor: r.get(4),
                reason: r.get(5),
                at_ms: r.get(6),
            })
            .collect())
    }

    pub async fn record_dlq_replay(&self, r: &DlqReplayRow) -> Result<bool> {
        let client = self.client().await?;
        let n = client
            .execute(
                "INSERT INTO dlq_replays (topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT (topic, dlq_partition, dlq_offset) DO NOTHING",
                &[&r.topic, &r.dlq_partition, &r.dlq_offset, &r.replayed_at_ms, &r.log_partition, &r.log_offset],
            )
            .await?;
        Ok(n == 1)
    }

    pub async fn dlq_replays(&self, topic: &str) -> Result<Vec<DlqReplayRow>> {
        let client = self.client().await?;
        let rows = client
            .query(
                "SELECT topic, dlq_partition, dlq_offset, replayed_at, log_partition, log_offset FROM dlq_replays
                 WHERE topic = $1 ORDER BY dlq_partition, dlq_offset",
                &[&topic],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| DlqReplayRow {
                topic: r.get(0),
                dlq_partition: r.get(1),
                dlq_offset: r.get(2),
                replayed_at_ms: r.get(3),
                log_partition: r.get(4),
                log_offset: r.get(5),
            })
            .collect())
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
    use crate::record::{Metadata, Record};
    use crate::sysdb::CollectionUpdate;

    fn rec(id: &str, offset: i64) -> Record {
        Record {
            id: id.into(),
            embedding: None,
            metadata: Metadata::new(),
            document: Some(format!("{id}@{offset}")),
            offset,
        }
    }

    #[test]
    fn batch_rows_fold_duplicates_like_sequential_application() {
        let update = |dim: Option<u32>, pos: i64, delta: i64, writes: Vec<(String, Option<Record>)>| CollectionUpdate {
            id: "c".into(),
            partition: 1,
            dimension: dim,
            log_position: pos,
            record_count_delta: delta,
            writes,
        };
        let batch = BatchCommit {
            topic: "t".into(),
            delta: PositionDelta::new(1, 0, 10).unwrap(),
            collections: vec![
                update(None, 3, 2, vec![("a".into(), Some(rec("a", 1))), ("b".into(), Some(rec("b", 2)))]),
                update(Some(4), 9, -1, vec![("a".into(), None), ("b".into(), Some(rec("b", 8)))]),
            ],
            functions: Vec::new(),
        };
        let rows = BatchRows::new(&batch).unwrap();
        assert_eq!(rows.coll_ids, ["c"]);
        assert_eq!(rows.coll_dimensions, [Some(4)]);
        assert_eq!(rows.coll_positions, [9]);
        assert_eq!(rows.coll_deltas, [1]);
        assert_eq!(rows.up_ids, ["b"]);
        assert_eq!(rows.up_offsets, [8]);
        assert_eq!(rows.del_ids, ["a"]);
    }

    /// Upsert statements split by bytes: every record in exactly one chunk, in order; a
    /// chunk closes with the record that reaches the byte bound, however large, and small
    /// records stop at the record bound.
    #[test]
    fn upserts_are_chunked_by_bytes_and_records() {
        let chunks = |rows: &BatchRows<'_>| {
            let mut out = Vec::new();
            let mut start = 0;
            while start < rows.up_ids.len() {
                let end = rows.chunk_end(start);
                assert!(end > start, "a chunk takes at least one record");
                out.push(end - start);
                start = end;
            }
            out
        };
        let zeros = vec![0u8; 3 << 20];
        let emb = |bytes: usize| Some(&zeros[..bytes]);
        let mut rows = BatchRows::default();
        // 300 KiB each, the id's byte included: the third reaches 768 KiB and closes the chunk.
        for (i, size) in [300 << 10, 300 << 10, 300 << 10, 300 << 10, 2 << 20, 10].into_iter().enumerate() {
            rows.up_ids.push(["a", "b", "c", "d", "e", "f"][i]);
            rows.up_embeddings.push(emb(size - 1));
            rows.up_metadata.push(None);
            rows.up_documents.push(None);
        }
        assert_eq!(chunks(&rows), [3, 2, 1]);
        let mut small = BatchRows::default();
        for _ in 0..(UPSERT_CHUNK_RECORDS * 2 + 7) {
            small.up_ids.push("x");
            small.up_embeddings.push(None);
            small.up_metadata.push(Some("{}".into()));
            small.up_documents.push(Some("d"));
        }
        assert_eq!(chunks(&small), [UPSERT_CHUNK_RECORDS, UPSERT_CHUNK_RECORDS, 7]);
        assert_eq!(chunks(&BatchRows::default()), Vec::<usize>::new());
    }

    #[test]
    fn sqlstates_are_classified() {
        use crate::sysdb::ErrorClass;
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
