//! The JSON admin API under `/api/v1`, mirroring the CLI: collections (list, show, read
//! records with paging), records in (`POST .../records`, see [`super::ingest`]),
//! functions (attach, list, show, detach), `offsets show`, `offsets history`, `offsets
//! reset` (a dry run unless `execute`), and the DLQ (`dlq list`, `dlq replay`). `docs/openapi.yaml` is its
//! reference.
//!
//! Every route has a role (`roles.rs`): reads need the read or the admin token and
//! changes the admin token, once a token is configured ([`super::auth`]). Errors are
//! `{"error": CODE, "message": TEXT}` ([`super::error`]).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::MAX_BODY_BYTES;
use super::error::{ErrorCode, HttpError};
use super::ingest;
use super::reads::{self, wait_read, ReadParams};
use super::roles;
pub(crate) use super::state::{Admin, DEFAULT_PAGE, MAX_PAGE};
use crate::backfill::attach::{attach, AttachError, AttachSpec, FunctionView};
use crate::offsets::OffsetsError;
use crate::record::jsonl::RecordJson;
use crate::sysdb::{CollectionRow, FunctionRow};

/// The `/api/v1` router (to be nested there).
pub(crate) fn routes(admin: Arc<Admin>) -> Router {
    let access = admin.access;
    let router = Router::new()
        .route("/collections", get(list_collections))
        .route("/collections/{id}", get(show_collection))
        .route("/collections/{id}/freshness", get(reads::collection_freshness))
        .route("/collections/{id}/records", get(list_records).post(ingest::post_records))
        .route("/functions", get(list_functions).post(attach_function))
        .route("/functions/{id}", get(show_function).delete(detach_function))
        .route("/components", post(store_component).layer(DefaultBodyLimit::max(MAX_COMPONENT_BYTES)))
        .route("/offsets", get(offsets))
        .route("/offsets/history", get(offsets_history))
        .route("/offsets/reset", post(offsets_reset))
        .route("/dlq", get(dlq_list))
        .route("/dlq/replay", post(dlq_replay))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    roles::guarded(router, access).layer(DefaultBodyLimit::max(MAX_BODY_BYTES)).with_state(admin)
}

async fn not_found() -> HttpError {
    HttpError::new(ErrorCode::NotFound, "no such endpoint (see docs/openapi.yaml)")
}

async fn method_not_allowed() -> HttpError {
    HttpError::new(ErrorCode::MethodNotAllowed, "this endpoint does not take this method (see docs/openapi.yaml)")
}

fn collection_json(r: &CollectionRow) -> Value {
    json!({"id": r.id, "partition": r.partition, "log_position": r.log_position, "records": r.record_count, "dimension": r.dimension})
}

/// A function in full: the `functions list` view plus its parameters and times.
fn function_json(r: &FunctionRow) -> Value {
    let mut v = json!(FunctionView::from(r));
    v["params"] = json!(r.params);
    v["created_at_ms"] = json!(r.created_at_ms);
    v["updated_at_ms"] = json!(r.updated_at_ms);
    v
}

async fn list_collections(
    State(admin): State<Arc<Admin>>,
    query: Result<Query<ReadParams>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(read) = query?;
    wait_read(&admin, &read, None).await?;
    let rows = admin.sysdb.collections().await?;
    Ok(Json(json!({"collections": rows.iter().map(collection_json).collect::<Vec<_>>()})))
}

async fn show_collection(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<ReadParams>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Path(id) = path?;
    let Query(read) = query?;
    wait_read(&admin, &read, reads::partition_of(&admin, &id).await?).await?;
    let row = admin.sysdb.collection(&id).await?.ok_or_else(|| HttpError::unknown_collection(&id))?;
    let functions = admin.sysdb.functions(Some(&id)).await?;
    let mut v = collection_json(&row);
    v["functions"] = json!(functions.iter().map(function_json).collect::<Vec<_>>());
    Ok(Json(v))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RecordsQuery {
    /// Exclusive cursor: the `next` of the previous page.
    after: Option<String>,
    limit: Option<usize>,
    at_least: Option<String>,
    wait_ms: Option<u64>,
    read_level: Option<crate::reading::ReadLevel>,
}

async fn list_records(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<RecordsQuery>, QueryRejection>,
) -> Result<Response, HttpError> {
    let Path(id) = path?;
    let Query(q) = query?;
    let limit = q.limit.unwrap_or(DEFAULT_PAGE);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(HttpError::bad_request(format!("limit must be between 1 and {MAX_PAGE}")));
    }
    let read = ReadParams { at_least: q.at_least, wait_ms: q.wait_ms, read_level: q.read_level };
    wait_read(&admin, &read, reads::partition_of(&admin, &id).await?).await?;
    if admin.sysdb.collection(&id).await?.is_none() {
        return Err(HttpError::unknown_collection(&id));
    }
    // One more than asked says whether another page exists. On SQLite the read runs at
    // the lower priority too (render.rs says why not on PostgreSQL).
    let nice = admin.config.http.render_nice;
    let mut page = if matches!(*admin.sysdb, crate::sysdb::Sysdb::Sqlite(_)) {
        let (reader, collection, after) = (admin.clone(), id.clone(), q.after.clone());
        super::render::read_at_low_priority(nice, async move {
            reader.sysdb.list_records(&collection, after.as_deref(), limit + 1).await
        })
        .await??
    } else {
        admin.sysdb.list_records(&id, q.after.as_deref(), limit + 1).await?
    };
    let next = if page.len() > limit {
        page.truncate(limit);
        page.last().map(|r| r.id.clone())
    } else {
        None
    };
    // Written straight from the records: no JSON tree of the page (docs/reading.md), on
    // threads of a lower CPU priority (render.rs).
    #[derive(serde::Serialize)]
    struct Page<'a> {
        collection: &'a str,
        next: Option<String>,
        records: Vec<RecordJson<'a>>,
    }
    let body = super::render::at_low_priority(nice, move || {
        let records = page.iter().map(|record| RecordJson { record, with_offset: true }).collect();
        serde_json::to_vec(&Page { collection: &id, next, records })
    })
    .await?
    .map_err(|e| HttpError::new(super::error::ErrorCode::Internal, format!("cannot write the page as JSON: {e}")))?;
    Ok(([(header::CONTENT_TYPE, "application/json")], body).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionsQuery {
    collection: Option<String>,
}

async fn list_functions(
    State(admin): State<Arc<Admin>>,
    query: Result<Query<FunctionsQuery>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(q) = query?;
    let rows = admin.sysdb.functions(q.collection.as_deref()).await?;
    Ok(Json(json!({"functions": rows.iter().map(function_json).collect::<Vec<_>>()})))
}

async fn show_function(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, HttpError> {
    let Path(id) = path?;
    let row = admin.sysdb.function(&id).await?.ok_or_else(|| HttpError::unknown_function(&id))?;
    Ok(Json(function_json(&row)))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AttachRequest {
    collection: String,
    function: String,
    output: String,
    /// Values may be strings, numbers or booleans (passed to the function as text).
    #[serde(default)]
    params: BTreeMap<String, Value>,
}

fn param_text(key: &str, v: Value) -> Result<String, HttpError> {
    match v {
        Value::String(s) => Ok(s),
        Value::Number(n) => Ok(n.to_string()),
        Value::Bool(b) => Ok(b.to_string()),
        _ => Err(HttpError::bad_request(format!("params.{key} must be a string, a number or a boolean"))),
    }
}

impl From<AttachError> for HttpError {
    fn from(e: AttachError) -> Self {
        match e {
            AttachError::Sysdb(e) => e.into(),
            AttachError::Function(_) | AttachError::Invalid(_) | AttachError::Refused(_) => {
                HttpError::bad_request(e.to_string())
            }
            AttachError::NotInitialised(_) => HttpError::new(ErrorCode::Unavailable, e.to_string()),
        }
    }
}

/// The largest component `POST /components` takes (a Python component is about 20 MB).
const MAX_COMPONENT_BYTES: usize = 64 << 20;

/// 201 with the stored component (200 when its bytes were stored already).
async fn store_component(
    State(admin): State<Arc<Admin>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let body = body?;
    let stored =
        crate::backfill::components::store_component(&admin.sysdb, body.to_vec()).await.map_err(|e| match e {
            crate::backfill::components::StoreError::Sysdb(e) => HttpError::from(e),
            e => HttpError::bad_request(e.to_string()),
        })?;
    let status = if stored.new { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(json!(stored))).into_response())
}

/// 201 with the new function (its marker `published`, or `pending` for the outbox relay),
/// or 200 when the same (collection, output) is attached already (`existing`).
async fn attach_function(
    State(admin): State<Arc<Admin>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, HttpError> {
    let body = body?;
    let req: AttachRequest = serde_json::from_slice(&body).map_err(|e| HttpError::from_json(&e))?;
    let params = req
        .params
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), param_text(&k, v)?)))
        .collect::<Result<BTreeMap<_, _>, HttpError>>()?;
    let attached = attach(
        &admin.config,
        &admin.sysdb,
        &admin.producer,
        AttachSpec { collection: &req.collection, function: &req.function, output: &req.output, params },
        &admin.tokens,
    )
    .await?;
    let status = if attached.marker == "existing" { StatusCode::OK } else { StatusCode::CREATED };
    let location = format!("/api/v1/functions/{}", attached.function_id);
    Ok((status, [(header::LOCATION, location)], Json(json!(attached))).into_response())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetachQuery {
    #[serde(default)]
    drop_output: bool,
}

async fn detach_function(
    State(admin): State<Arc<Admin>>,
    path: Result<Path<String>, PathRejection>,
    query: Result<Query<DetachQuery>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Path(id) = path?;
    let Query(q) = query?;
    let before = admin
        .sysdb
        .detach_function_feeding(&id, q.drop_output, admin.config.changelog.enabled)
        .await?
        .ok_or_else(|| HttpError::unknown_function(&id))?;
    Ok(Json(json!({"detached": function_json(&before), "output_dropped": q.drop_output})))
}

impl From<OffsetsError> for HttpError {
    fn from(e: OffsetsError) -> Self {
        match e {
            OffsetsError::Kafka(e) => HttpError::from_kafka(&e),
            OffsetsError::Sysdb(e) => HttpError::from(e),
            OffsetsError::Refused(_) | OffsetsError::Invalid(_) => HttpError::bad_request(e.to_string()),
        }
    }
}

/// `offsets show`: sysdb position, group offset and high watermark per partition.
async fn offsets(State(admin): State<Arc<Admin>>) -> Result<Json<Value>, HttpError> {
    let rows = crate::offsets::offset_rows(&admin.config, &admin.sysdb).await?;
    Ok(Json(json!({"topic": admin.config.kafka.log_topic(), "partitions": rows})))
}

/// `offsets history`: operator resets and recorded data-loss gaps, oldest first.
async fn offsets_history(State(admin): State<Arc<Admin>>) -> Result<Json<Value>, HttpError> {
    let entries = crate::offsets::history(&admin.config, &admin.sysdb).await?;
    Ok(Json(json!({"topic": admin.config.kafka.log_topic(), "entries": entries})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResetBody {
    /// Explicit partitions; or `all_partitions: true`.
    #[serde(default)]
    partitions: Vec<i32>,
    #[serde(default)]
    all_partitions: bool,
    to: Option<i64>,
    #[serde(default)]
    to_earliest: bool,
    #[serde(default)]
    to_latest: bool,
    /// RFC 3339.
    to_datetime: Option<String>,
    shift_by: Option<i64>,
    #[serde(default)]
    clamp: bool,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    execute: bool,
    reason: Option<String>,
    /// Recorded in the audit row (default `admin-api`).
    actor: Option<String>,
}

fn reset_request(b: ResetBody) -> Result<crate::offsets::ResetRequest, HttpError> {
    use crate::offsets::{parse_rfc3339_ms, PartitionSelection, ResetRequest, ResetTarget};
    let targets = usize::from(b.to.is_some())
        + usize::from(b.to_earliest)
        + usize::from(b.to_latest)
        + usize::from(b.to_datetime.is_some())
        + usize::from(b.shift_by.is_some());
    if targets != 1 {
        return Err(HttpError::bad_request(
            "give exactly one target: to, to_earliest, to_latest, to_datetime or shift_by",
        ));
    }
    let target = if let Some(n) = b.to {
        ResetTarget::To(n)
    } else if b.to_earliest {
        ResetTarget::Earliest
    } else if b.to_latest {
        ResetTarget::Latest
    } else if let Some(t) = &b.to_datetime {
        ResetTarget::Datetime(parse_rfc3339_ms(t).map_err(HttpError::bad_request)?)
    } else {
        ResetTarget::ShiftBy(b.shift_by.unwrap_or_default())
    };
    let partitions = match (b.all_partitions, b.partitions.is_empty()) {
        (true, true) => PartitionSelection::All,
        (false, false) => PartitionSelection::List(b.partitions),
        _ => return Err(HttpError::bad_request("give either partitions or all_partitions: true")),
    };
    let execute = if b.execute {
        match b.reason.as_deref().map(str::trim) {
            Some(r) if !r.is_empty() => Some((b.actor.unwrap_or_else(|| "admin-api".into()), r.to_string())),
            _ => return Err(HttpError::bad_request("execute needs a reason (it is audited with the reset)")),
        }
    } else {
        None
    };
    Ok(ResetRequest { partitions, target, clamp: b.clamp, force: b.force, execute })
}

/// `offsets reset`: the plan (a dry run) unless `execute`, with the CLI's validation.
async fn offsets_reset(
    State(admin): State<Arc<Admin>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, HttpError> {
    let body = body?;
    let b: ResetBody = serde_json::from_slice(&body).map_err(|e| HttpError::from_json(&e))?;
    let report = crate::offsets::reset(&admin.config, &admin.sysdb, &reset_request(b)?).await?;
    Ok(Json(json!(report)))
}

impl From<crate::dead_letters::DlqError> for HttpError {
    fn from(e: crate::dead_letters::DlqError) -> Self {
        use crate::dead_letters::DlqError;
        match e {
            DlqError::Kafka(e) => HttpError::from_kafka(&e),
            DlqError::Sysdb(e) => HttpError::from(e),
            DlqError::Unrecorded { .. } => HttpError::new(ErrorCode::Unavailable, e.to_string()),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DlqQuery {
    kind: Option<String>,
    collection: Option<String>,
    /// RFC 3339.
    since: Option<String>,
    limit: Option<usize>,
}

fn dlq_filter(q: DlqQuery) -> Result<crate::dead_letters::DlqFilter, HttpError> {
    Ok(crate::dead_letters::DlqFilter {
        kind: q.kind,
        collection: q.collection,
        since_ms: q
            .since
            .as_deref()
            .map(crate::offsets::parse_rfc3339_ms)
            .transpose()
            .map_err(HttpError::bad_request)?,
        limit: q.limit,
    })
}

/// `dlq list`: the DLQ entries that pass the filters.
async fn dlq_list(
    State(admin): State<Arc<Admin>>,
    query: Result<Query<DlqQuery>, QueryRejection>,
) -> Result<Json<Value>, HttpError> {
    let Query(q) = query?;
    let entries = crate::dead_letters::list(&admin.config, &admin.sysdb, &dlq_filter(q)?).await?;
    Ok(Json(json!({"topic": admin.config.kafka.dlq_topic(), "entries": entries})))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    kind: Option<String>,
    collection: Option<String>,
    since: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    execute: bool,
}

/// `dlq replay`: a dry run unless `execute`.
async fn dlq_replay(
    State(admin): State<Arc<Admin>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Value>, HttpError> {
    let body = body?;
    let b: ReplayBody = serde_json::from_slice(&body).map_err(|e| HttpError::from_json(&e))?;
    let filter = dlq_filter(DlqQuery { kind: b.kind, collection: b.collection, since: b.since, limit: b.limit })?;
    let report = crate::dead_letters::replay(&admin.config, &admin.sysdb, &admin.producer, &filter, b.execute).await?;
    Ok(Json(json!(report)))
}

#[cfg(test)]
#[path = "routes_tests.rs"]
mod tests;
