//! The replica's HTTP server (axum): `/metrics`, `/healthz`, `/readyz`, and the JSON
//! admin API under `/api/v1` (`docs/openapi.yaml`).
//!
//! `sluice process` starts it on `http.listen` (`SLUICE_HTTP`; empty disables it) before
//! the processor joins the group, and stops it after the processor has stopped, so the
//! last metrics of a draining replica stay scrapeable. The router is assembled from
//! per-area routers: [`ops_routes`] (state: [`AppState`]) and [`routes::routes`] (state:
//! [`routes::Admin`]: config, sysdb, producer, tokens) nested under `/api/v1`. Each
//! router's routes are guarded by their role (`roles.rs`: open, read or admin).
//!
//! - `health.rs`: readiness as the processor reports it.
//! - `routes.rs`: the admin endpoints; `ingest.rs`: `POST .../records` (parse, validate,
//!   produce).
//! - `roles.rs`: every route's role and the guard that applies it; `auth.rs`: the read and
//!   admin tokens and what each role takes (constant-time check).
//! - `error.rs`: JSON errors with stable codes.
//! - `render.rs`: record pages are read (on SQLite) and built on threads of a lower CPU
//!   priority (`http.render_nice`), so a busy replica's commits go first.

pub(crate) mod auth;
pub(crate) mod error;
pub(crate) mod ingest;
pub(crate) mod reads;
pub(crate) mod render;
pub(crate) mod roles;
pub(crate) mod routes;
pub(crate) mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde_json::json;
use thiserror::Error;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::{info, warn};

pub(crate) use crate::health::Health;
pub(crate) use routes::Admin;

use crate::metrics::{self, Metrics};

/// How long a graceful stop waits for open connections.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// What the operations handlers can reach, and the admin API's state if it is served.
#[derive(Debug, Clone)]
pub(crate) struct AppState {
    pub metrics: Arc<Metrics>,
    pub health: Arc<Health>,
    /// `None`: no `/api/v1` routes (tests of the operations endpoints).
    pub admin: Option<Arc<Admin>>,
}

#[derive(Debug, Error)]
pub(crate) enum ApiError {
    /// A user error (address taken or malformed): not retryable by waiting.
    #[error("cannot listen on {addr:?} (http.listen / SLUICE_HTTP; empty disables the server): {source}")]
    Bind { addr: String, source: std::io::Error },
}

/// The whole router.
pub(crate) fn router(state: AppState) -> Router {
    let admin = state.admin.clone();
    let access = admin.as_ref().map(|a| a.access()).unwrap_or_default();
    let router = Router::new().merge(ops_routes(access)).with_state(state);
    match admin {
        Some(admin) => router.nest("/api/v1", routes::routes(admin)),
        None => router,
    }
}

/// Operations endpoints: scrape, liveness, readiness (open: `roles::ROUTES`).
pub(crate) fn ops_routes(access: roles::Access) -> Router<AppState> {
    let router = Router::new()
        .route("/metrics", get(metrics_text))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz));
    roles::guarded(router, access)
}

async fn metrics_text(State(s): State<AppState>) -> Response {
    ([(header::CONTENT_TYPE, metrics::CONTENT_TYPE)], s.metrics.encode()).into_response()
}

async fn healthz() -> Response {
    (StatusCode::OK, Json(json!({"alive": true}))).into_response()
}

async fn readyz(State(s): State<AppState>) -> Response {
    match s.health.readiness() {
        Ok(()) => (StatusCode::OK, Json(json!({"ready": true}))).into_response(),
        Err(reason) => {
            (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"ready": false, "reason": reason}))).into_response()
        }
    }
}

/// A running server; [`Server::shutdown`] stops it.
pub(crate) struct Server {
    /// The bound address (tests bind port 0).
    #[cfg_attr(not(test), allow(dead_code))]
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl Server {
    /// Bind `listen` (`host:port`) and serve in the background.
    pub(crate) async fn start(listen: &str, state: AppState) -> Result<Server, ApiError> {
        let bind_err = |source| ApiError::Bind { addr: listen.to_string(), source };
        let listener = tokio::net::TcpListener::bind(listen).await.map_err(bind_err)?;
        let addr = listener.local_addr().map_err(bind_err)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let api = match &state.admin {
            Some(a) => format!("; API at /api/v1: {}", a.access().describe()),
            None => String::new(),
        };
        let app = router(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        info!(%addr, "HTTP server listening (/metrics, /healthz, /readyz{api})");
        Ok(Server { addr, stop, task })
    }

    /// The bound address (useful with port 0).
    #[cfg(test)]
    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stop accepting, let open requests finish (bounded), and return.
    pub(crate) async fn shutdown(self) {
        let _ = self.stop.send(());
        let mut task = self.task;
        match tokio::time::timeout(SHUTDOWN_GRACE, &mut task).await {
            Ok(Ok(Ok(()))) => info!("HTTP server stopped"),
            Ok(Ok(Err(e))) => warn!(%e, "HTTP server failed"),
            Ok(Err(e)) => warn!(%e, "HTTP server task failed"),
            Err(_) => {
                warn!("HTTP server connections still open after {SHUTDOWN_GRACE:?}; closing them");
                task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes()).await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        let status = head.split(' ').nth(1).unwrap().parse().unwrap();
        (status, head.to_string(), body.to_string())
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let health = Health::new();
        let state = AppState { metrics: Metrics::new(), health: health.clone(), admin: None };
        let server = Server::start("127.0.0.1:0", state).await.unwrap();
        let addr = server.local_addr();

        let (status, head, body) = get(addr, "/metrics").await;
        assert_eq!(status, 200);
        assert!(
            head.to_ascii_lowercase().contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{head}"
        );
        assert!(body.contains("sluice_build_info{"), "{body}");
        assert_eq!(get(addr, "/healthz").await.0, 200);

        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["ready"], false);
        assert!(v["reason"].as_str().unwrap().starts_with("starting"), "{v}");

        health.consumer_started();
        health.assignment_completed();
        assert_eq!(get(addr, "/readyz").await.0, 200);
        health.set_halted(0, Some("the sysdb refused batch [5, 9)".into()));
        let (status, _, body) = get(addr, "/readyz").await;
        assert_eq!(status, 503);
        assert!(body.contains("partition 0 halted: the sysdb refused batch [5, 9)"), "{body}");
        assert_eq!(get(addr, "/nope").await.0, 404);

        server.shutdown().await;
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "stopped server still accepts");
    }

    #[tokio::test]
    async fn a_taken_address_is_a_bind_error() {
        let taken = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = taken.local_addr().unwrap().to_string();
        let state = AppState { metrics: Metrics::new(), health: Health::new(), admin: None };
        let err = Server::start(&addr, state).await.err().expect("bind fails");
        assert!(err.to_string().contains("SLUICE_HTTP"), "{err}");
    }
}
