//! The batch commit: the partition row locked, the compare-and-set, and the batch's
//! writes as column arrays (`UNNEST`), pipelined when no function is attached.

use std::collections::HashMap;

use deadpool_postgres::{Object, Transaction};
use tokio_postgres::types::ToSql;

use super::positions::SELECT_FOR_UPDATE;
use super::{attached, changelog, describe, invalid, is_retry_once, PostgresSysdb, TxError};
use crate::positions::IncompatibleDelta;
use crate::record::Record;
use crate::sysdb::error::Result;
use crate::sysdb::error::SysdbError;
use crate::sysdb::stored_fields::{encode_embedding, encode_metadata};
use crate::sysdb::types::{now_ms, AppendedChanges, BatchCommit, CommitReport};

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

const UPDATE_POSITION: &str =
    "UPDATE partitions SET next_offset = $3, updated_at_ms = $4 WHERE topic = $1 AND partition = $2";
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
) -> std::result::Result<std::result::Result<CommitReport, IncompatibleDelta>, TxError> {
    let (topic, partition) = (&batch.topic, &batch.delta.partition);
    let tx = client.transaction().await?;
    if batch.functions.is_empty() {
        return match write_pipelined(&tx, batch, rows).await? {
            Ok(first) => {
                tx.commit().await?;
                let appended = first.map(|first_seq| AppendedChanges { first_seq, outputs: Vec::new() });
                Ok(Ok(CommitReport { appended, ..CommitReport::default() }))
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
    // (lock order: partition, functions, collections; see `postgres/attached.rs`).
    let states = attached::lock_functions(&tx, batch).await?;
    let now = now_ms();
    let prepared = WriteStatements::prepare(&tx).await?;
    let chunks = rows.chunks();
    for (stmt, params) in prepared.writes(rows, &chunks, &now) {
        tx.execute(stmt, &params).await?;
    }
    let report = if batch.changelog {
        // The change feed: the batch's record changes, then its outputs' changes.
        let mut outputs = Vec::new();
        let mut report = attached::commit_functions(&tx, batch, states, now, Some(&mut outputs)).await?;
        let first = changelog::append(&tx, batch.delta.partition, batch.changes.iter().chain(&outputs)).await?;
        report.appended = first.map(|first_seq| AppendedChanges { first_seq, outputs });
        report
    } else {
        attached::commit_functions(&tx, batch, states, now, None).await?
    };
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
/// back whatever the writes did. `Ok(Some(first))`: the change feed's rows took the
/// sequence numbers from `first` on.
async fn write_pipelined(
    tx: &Transaction<'_>,
    batch: &BatchCommit,
    rows: &BatchRows<'_>,
) -> std::result::Result<std::result::Result<Option<i64>, IncompatibleDelta>, TxError> {
    let (topic, partition) = (&batch.topic, &batch.delta.partition);
    let select = tx.prepare_cached(SELECT_FOR_UPDATE).await?;
    let prepared = WriteStatements::prepare(tx).await?;
    let update_position = tx.prepare_cached(UPDATE_POSITION).await?;
    let now = now_ms();
    let chunks = rows.chunks();
    let mut statements = prepared.writes(rows, &chunks, &now);
    // The change feed's rows, in the same flight (the batch has no function outputs).
    let changes = changelog::ChangeRows::new(batch.delta.partition, batch.changes.iter());
    let append =
        if batch.changelog && !changes.is_empty() { Some(tx.prepare_cached(changelog::APPEND).await?) } else { None };
    let to = batch.delta.to;
    statements.push((&update_position, vec![topic, partition, &to, &now]));
    let key: [&(dyn ToSql + Sync); 2] = [topic, partition];
    let read = tx.query_opt(&select, &key);
    let writes = futures_util::future::try_join_all(statements.iter().map(|(stmt, params)| tx.execute(*stmt, params)));
    let change_params = changes.params();
    let appended = async {
        match &append {
            Some(stmt) => tx.query_one(stmt, &change_params).await.map(|r| Some(r.get::<_, i64>(0))),
            None => Ok(None),
        }
    };
    let (stored, written, first) = futures_util::future::join3(read, writes, appended).await;
    // A moved position is the answer even if a write failed too (a zombie's batch is a
    // conflict, not a bad record); otherwise the first failed write is.
    if let Err(conflict) = batch.delta.check(stored?.map(|r| r.get(0))) {
        return Ok(Err(conflict));
    }
    written?;
    Ok(Ok(first?))
}

impl PostgresSysdb {
    pub async fn commit_batch(&self, batch: &BatchCommit) -> Result<CommitReport> {
        let rows = BatchRows::new(batch)?;
        let mut client = self.client().await?;
        let mut attempt = 1;
        loop {
            match commit_once(&mut client, batch, &rows).await {
                Ok(outcome) => return outcome.map_err(SysdbError::from),
                Err(TxError::Pg(e)) if attempt == 1 && is_retry_once(&e) => {
                    tracing::debug!(error = %describe(&e), partition = batch.delta.partition, "sysdb commit retried once");
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::positions::PositionDelta;
    use crate::record::{Metadata, Record};
    use crate::sysdb::types::CollectionUpdate;

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
            changelog: false,
            changes: Vec::new(),
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
}
