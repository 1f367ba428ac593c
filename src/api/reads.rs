//! Reads that include a write, over HTTP: the `at_least`, `wait_ms` and `read_level`
//! query parameters of the data reads, and `GET /collections/{id}/freshness`
//! (`crate::reading` does the waiting; docs/reading.md is the contract).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;

use super::error::{ErrorCode, HttpError};
use super::state::Admin;
use crate::reading::freshness::{freshness, Freshness, FreshnessError};
use crate::reading::{wait_for, ReadError, ReadLevel, ReadWish, MAX_WAIT};

/// The read parameters a data read takes (flattened by hand into each query type: serde
/// cannot flatten into a struct that denies unknown fields).
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ReadParams {
    /// Comma-separated read tokens.
    pub at_least: Option<String>,
    /// How long to wait for them (default 10 s, at most 300 s; 0 = fail at once).
    pub wait_ms: Option<u64>,
    pub read_level: Option<ReadLevel>,
}

impl ReadParams {
    fn wish(&self) -> Result<ReadWish, HttpError> {
        let wait = self.wait_ms.map(Duration::from_millis);
        if wait.is_some_and(|w| w > MAX_WAIT) {
            return Err(HttpError::bad_request(format!("wait_ms must be at most {}", MAX_WAIT.as_millis())));
        }
        Ok(ReadWish {
            at_least: self.at_least.iter().cloned().collect(),
            level: self.read_level.unwrap_or_default(),
            wait,
        })
    }
}

impl From<ReadError> for HttpError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Token(_) => HttpError::new(ErrorCode::BadToken, e.to_string()),
            ReadError::Behind { .. } => HttpError::new(ErrorCode::TokenNotReached, e.to_string()),
            ReadError::Halted { .. } => HttpError::new(ErrorCode::PartitionHalted, e.to_string()),
            ReadError::Sysdb(e) => e.into(),
            ReadError::Broker(e) => HttpError::from_kafka(&e),
        }
    }
}

/// Wait until the sysdb covers what `params` ask for (at once for a plain read), on the
/// replica's board. `partitions`: what the read touches, for `latest` (`None` = all).
pub(crate) async fn wait_read(
    admin: &Admin,
    params: &ReadParams,
    partitions: Option<Vec<i32>>,
) -> Result<(), HttpError> {
    let wish = params.wish()?;
    if wish.is_plain() {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let result = wait_for(&admin.sysdb, &admin.tokens, &wish, partitions, admin.board.as_deref()).await;
    if let Some(m) = &admin.metrics {
        let outcome = match &result {
            Ok(_) => Some("covered"),
            Err(ReadError::Behind { .. }) => Some("behind"),
            Err(ReadError::Halted { .. }) => Some("halted"),
            Err(_) => None,
        };
        if let Some(o) = outcome {
            m.observe_read_wait(o, started.elapsed());
        }
    }
    result.map(|_| ()).map_err(Into::into)
}

/// The partition of a collection the sysdb knows, else of its key (for `latest`).
pub(crate) async fn partition_of(admin: &Admin, collection: &str) -> Result<Option<Vec<i32>>, HttpError> {
    if let Some(row) = admin.sysdb.collection(collection).await? {
        return Ok(Some(vec![row.partition]));
    }
    let count = admin.sysdb.topic_partitions(&admin.config.kafka.log_topic()).await?;
    Ok(count.map(|n| vec![crate::record::partitioner::partition_for(collection.as_bytes(), n as u32) as i32]))
}

/// `GET /collections/{id}/freshness`.
pub(crate) async fn collection_freshness(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Freshness>, HttpError> {
    let Path(id) = path?;
    let f = freshness(&admin.sysdb, &admin.config.client_settings(), &admin.config.kafka.log_topic(), &id)
        .await
        .map_err(|e| match e {
            FreshnessError::UnknownCollection(id) => HttpError::unknown_collection(&id),
            FreshnessError::Sysdb(e) => e.into(),
            FreshnessError::Broker(e) => HttpError::from_kafka(&e),
        })?;
    Ok(Json(f))
}
