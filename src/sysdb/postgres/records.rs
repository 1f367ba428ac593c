//! Collections and records: the processor's lookups and pages in id order.

use std::collections::HashMap;

use super::{invalid, PostgresSysdb, BACKEND};
use crate::record::Record;
use crate::sysdb::error::Result;
use crate::sysdb::stored_fields::decode_record;
use crate::sysdb::types::CollectionRow;

const COLLECTION_COLUMNS: &str = "id, partition, dimension, log_position, record_count";
/// The columns of a whole record, in the order [`decode_row`] reads them.
pub(super) const RECORD_COLUMNS: &str = "id, embedding, metadata, document, last_offset";

fn decode_collection(r: &tokio_postgres::Row) -> Result<CollectionRow> {
    let id: String = r.get(0);
    let dimension: Option<i32> = r.get(2);
    let dimension = dimension
        .map(|d| u32::try_from(d).map_err(|_| invalid(format!("collection {id:?}: stored dimension {d} out of range"))))
        .transpose()?;
    Ok(CollectionRow { id, partition: r.get(1), dimension, log_position: r.get(3), record_count: r.get(4) })
}

pub(super) fn decode_row(r: &tokio_postgres::Row) -> Result<Record> {
    decode_row_at(r, 0)
}

/// A record from the `RECORD_COLUMNS` starting at column `at`.
pub(super) fn decode_row_at(r: &tokio_postgres::Row, at: usize) -> Result<Record> {
    decode_record(BACKEND, r.get(at), r.get(at + 1), r.get(at + 2), r.get(at + 3), r.get(at + 4))
}

impl PostgresSysdb {
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
}
