//! The API's error responses: `{"error": CODE, "message": TEXT}` (plus `items` for
//! per-record problems), with a status code that fits. `CODE` is stable and documented in
//! `docs/openapi.yaml` (clients branch on it); `TEXT` is for humans and may change.

use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;
use tracing::{debug, warn};

use crate::kafka::KafkaError;
use crate::sysdb::SysdbError;

/// Largest request body (413 `payload_too_large` above).
pub(crate) const MAX_BODY_BYTES: usize = 16 << 20;

/// The stable `error` codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ErrorCode {
    /// 404: no such collection.
    UnknownCollection,
    /// 404: no such function.
    UnknownFunction,
    /// 400: the body is not JSON (or not the JSON kind the endpoint takes).
    BadJson,
    /// 400: one or more records of a `POST .../records` are invalid (see `items`).
    InvalidRecord,
    /// 401: a request without a bearer token its route's role accepts (none, or a wrong one).
    Unauthorized,
    /// 403: a bearer token that may not do this (`http.read_token` on a change), or a
    /// change on a replica without an admin token.
    Forbidden,
    /// 400: well-formed JSON or query with wrong fields or values.
    BadRequest,
    /// 404: no such endpoint.
    NotFound,
    /// 405: the endpoint exists but not with this method.
    MethodNotAllowed,
    /// 413: the body is larger than the limit.
    PayloadTooLarge,
    /// 503: the sysdb or the broker cannot be reached right now; retry later.
    Unavailable,
    /// 400: a read token that is malformed, of an unknown version, or of another topic
    /// or cluster.
    BadToken,
    /// 504: the sysdb did not reach the read token within the wait.
    TokenNotReached,
    /// 503: a partition the read waits for is halted (the message has the reason).
    PartitionHalted,
    /// 500: a bug or an unexpected database answer (the replica's log has details).
    Internal,
}

impl ErrorCode {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ErrorCode::UnknownCollection => "unknown_collection",
            ErrorCode::UnknownFunction => "unknown_function",
            ErrorCode::BadJson => "bad_json",
            ErrorCode::InvalidRecord => "invalid_record",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::NotFound => "not_found",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::PayloadTooLarge => "payload_too_large",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::BadToken => "bad_token",
            ErrorCode::TokenNotReached => "token_not_reached",
            ErrorCode::PartitionHalted => "partition_halted",
            ErrorCode::Internal => "internal",
        }
    }

    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorCode::UnknownCollection | ErrorCode::UnknownFunction | ErrorCode::NotFound => StatusCode::NOT_FOUND,
            ErrorCode::BadJson | ErrorCode::InvalidRecord | ErrorCode::BadRequest | ErrorCode::BadToken => {
                StatusCode::BAD_REQUEST
            }
            ErrorCode::TokenNotReached => StatusCode::GATEWAY_TIMEOUT,
            ErrorCode::PartitionHalted => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unauthorized => StatusCode::UNAUTHORIZED,
            ErrorCode::Forbidden => StatusCode::FORBIDDEN,
            ErrorCode::MethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            ErrorCode::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

pub(crate) use crate::record::items::ItemError;

/// An error response of the admin API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HttpError {
    pub code: ErrorCode,
    pub message: String,
    /// Per-item details (at most [`MAX_ITEMS`] are sent).
    pub items: Vec<ItemError>,
    /// Total number of failed items when `items` is non-empty (may exceed `items.len()`).
    pub failed: usize,
}

/// How many item errors one response lists.
pub(crate) const MAX_ITEMS: usize = 100;

impl HttpError {
    pub(crate) fn new(code: ErrorCode, message: impl Into<String>) -> HttpError {
        HttpError { code, message: message.into(), items: Vec::new(), failed: 0 }
    }

    pub(crate) fn with_items(mut self, mut items: Vec<ItemError>) -> HttpError {
        self.failed = items.len();
        items.truncate(MAX_ITEMS);
        self.items = items;
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> HttpError {
        HttpError::new(ErrorCode::BadRequest, message)
    }

    pub(crate) fn unknown_collection(id: &str) -> HttpError {
        HttpError::new(ErrorCode::UnknownCollection, format!("collection {id:?} is not known to the sysdb"))
    }

    pub(crate) fn unknown_function(id: &str) -> HttpError {
        HttpError::new(ErrorCode::UnknownFunction, format!("no function with id {id:?}"))
    }

    /// A JSON body that does not parse (`bad_json`) or parses into the wrong shape
    /// (`bad_request`: a missing field, a wrong type, an unknown field).
    pub(crate) fn from_json(e: &serde_json::Error) -> HttpError {
        match e.classify() {
            serde_json::error::Category::Data => HttpError::bad_request(format!("unexpected JSON content: {e}")),
            _ => HttpError::new(ErrorCode::BadJson, format!("the body is not valid JSON: {e}")),
        }
    }

    /// A broker error: unreachable or refusing (`unavailable`), or misconfigured.
    pub(crate) fn from_kafka(e: &KafkaError) -> HttpError {
        match e {
            KafkaError::Config(_) => HttpError::new(ErrorCode::Internal, e.to_string()),
            KafkaError::Broker { .. } | KafkaError::Delivery { .. } => {
                HttpError::new(ErrorCode::Unavailable, e.to_string())
            }
            KafkaError::TooLarge { .. } => HttpError::new(ErrorCode::InvalidRecord, e.to_string()),
        }
    }
}

impl From<SysdbError> for HttpError {
    fn from(e: SysdbError) -> Self {
        match e {
            SysdbError::Unavailable { .. } => HttpError::new(ErrorCode::Unavailable, e.to_string()),
            _ => HttpError::new(ErrorCode::Internal, e.to_string()),
        }
    }
}

impl From<PathRejection> for HttpError {
    fn from(e: PathRejection) -> Self {
        HttpError::bad_request(e.body_text())
    }
}

impl From<QueryRejection> for HttpError {
    fn from(e: QueryRejection) -> Self {
        HttpError::bad_request(e.body_text())
    }
}

impl From<BytesRejection> for HttpError {
    fn from(e: BytesRejection) -> Self {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            HttpError::new(ErrorCode::PayloadTooLarge, format!("the body is larger than {} bytes", MAX_BODY_BYTES))
        } else {
            HttpError::bad_request(e.body_text())
        }
    }
}

impl IntoResponse for HttpError {
    fn into_response(self) -> Response {
        let status = self.code.status();
        if status.is_server_error() {
            warn!(error = self.code.as_str(), message = %self.message, "admin API request failed");
        } else {
            debug!(error = self.code.as_str(), message = %self.message, "admin API request refused");
        }
        let mut body = json!({"error": self.code.as_str(), "message": self.message});
        if !self.items.is_empty() {
            body["items"] = json!(self.items);
            body["failed"] = json!(self.failed);
        }
        let mut response = (status, Json(body)).into_response();
        if self.code == ErrorCode::Unauthorized {
            response.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_code_and_only_those_is_in_the_openapi_error_enum() {
        let all = [
            ErrorCode::UnknownCollection,
            ErrorCode::UnknownFunction,
            ErrorCode::BadJson,
            ErrorCode::InvalidRecord,
            ErrorCode::Unauthorized,
            ErrorCode::Forbidden,
            ErrorCode::BadRequest,
            ErrorCode::NotFound,
            ErrorCode::MethodNotAllowed,
            ErrorCode::PayloadTooLarge,
            ErrorCode::Unavailable,
            ErrorCode::BadToken,
            ErrorCode::TokenNotReached,
            ErrorCode::PartitionHalted,
            ErrorCode::Internal,
        ];
        // A new code fails to compile here until it is added to `all` above.
        for code in all {
            match code {
                ErrorCode::UnknownCollection
                | ErrorCode::UnknownFunction
                | ErrorCode::BadJson
                | ErrorCode::InvalidRecord
                | ErrorCode::Unauthorized
                | ErrorCode::Forbidden
                | ErrorCode::BadRequest
                | ErrorCode::NotFound
                | ErrorCode::MethodNotAllowed
                | ErrorCode::PayloadTooLarge
                | ErrorCode::Unavailable
                | ErrorCode::BadToken
                | ErrorCode::TokenNotReached
                | ErrorCode::PartitionHalted
                | ErrorCode::Internal => {}
            }
        }
        let doc: serde_yaml::Value = serde_yaml::from_str(include_str!("../../docs/openapi.yaml")).unwrap();
        let documented: Vec<&str> = doc["components"]["schemas"]["Error"]["properties"]["error"]["enum"]
            .as_sequence()
            .expect("the Error schema's error enum")
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        let codes: Vec<&str> = all.iter().map(|c| c.as_str()).collect();
        for code in &codes {
            assert!(documented.contains(code), "{code} is missing from the Error enum of docs/openapi.yaml");
        }
        for code in &documented {
            assert!(codes.contains(code), "docs/openapi.yaml documents {code}, which the API never answers");
        }
    }

    #[test]
    fn a_sysdb_outage_is_unavailable_and_other_sysdb_errors_are_internal() {
        let down =
            HttpError::from(SysdbError::Unavailable { backend: "postgres", message: "connection refused".into() });
        assert_eq!((down.code, down.code.status()), (ErrorCode::Unavailable, StatusCode::SERVICE_UNAVAILABLE));
        let broken = HttpError::from(SysdbError::Database { backend: "sqlite", message: "disk I/O error".into() });
        assert_eq!(broken.code.status(), StatusCode::INTERNAL_SERVER_ERROR);
    }

    #[test]
    fn syntax_errors_are_bad_json_and_shape_errors_bad_request() {
        let syntax = serde_json::from_str::<serde_json::Value>("{").unwrap_err();
        assert_eq!(HttpError::from_json(&syntax).code, ErrorCode::BadJson);
        let shape = serde_json::from_str::<Vec<u8>>("{}").unwrap_err();
        assert_eq!(HttpError::from_json(&shape).code, ErrorCode::BadRequest);
    }

    #[test]
    fn item_lists_are_capped_but_the_total_is_kept() {
        let items = (0..MAX_ITEMS + 5)
            .map(|i| ItemError { index: i, error: "empty_id".into(), message: "id is empty".into() })
            .collect();
        let e = HttpError::new(ErrorCode::InvalidRecord, "x").with_items(items);
        assert_eq!((e.items.len(), e.failed), (MAX_ITEMS, MAX_ITEMS + 5));
    }
}
