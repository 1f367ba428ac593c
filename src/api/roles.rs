//! Every route of the HTTP server and its [`Role`], in one table ([`ROUTES`]), and the
//! guard that applies it ([`guard`], a `route_layer` of each router).
//!
//! The guard looks the request's method and routed path up in the table and lets
//! [`Access::check`] decide. A route that is served but not in the table is refused
//! with `500 internal` naming it, whatever the tokens: a new route does nothing until it
//! is given a role here. `docs/openapi.yaml` states the same role for each operation
//! (`x-sluice-role`) and `roles_tests.rs` holds the two to each other, and walks every
//! documented route with every kind of token against the router.
//!
//! The guard runs only for routed paths (`route_layer`): an unknown path stays a 404,
//! with or without a token. A path of the table with a method the table does not give
//! it is answered `405 method_not_allowed` by the guard itself, with or without a token:
//! axum hands such requests to the guard too, and the guard cannot tell a method the
//! router does not serve from one served without a role, so neither reaches a handler.

use axum::extract::{MatchedPath, Request, State};
use axum::http::Method;
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;

use super::auth::bearer;
pub(crate) use super::auth::{Access, Role};
use super::error::{ErrorCode, HttpError};

/// `(method, path as routed, role)` of every route; `GET` covers `HEAD`.
pub(crate) const ROUTES: &[(&str, &str, Role)] = &[
    ("GET", "/metrics", Role::Open),
    ("GET", "/healthz", Role::Open),
    ("GET", "/readyz", Role::Open),
    ("GET", "/api/v1/collections", Role::Read),
    ("GET", "/api/v1/collections/{id}", Role::Read),
    ("GET", "/api/v1/collections/{id}/freshness", Role::Read),
    ("GET", "/api/v1/collections/{id}/records", Role::Read),
    ("POST", "/api/v1/collections/{id}/records", Role::Admin),
    ("GET", "/api/v1/functions", Role::Read),
    ("POST", "/api/v1/functions", Role::Admin),
    ("GET", "/api/v1/functions/{id}", Role::Read),
    ("DELETE", "/api/v1/functions/{id}", Role::Admin),
    ("POST", "/api/v1/components", Role::Admin),
    ("GET", "/api/v1/offsets", Role::Read),
    ("GET", "/api/v1/offsets/history", Role::Read),
    ("POST", "/api/v1/offsets/reset", Role::Admin),
    ("GET", "/api/v1/dlq", Role::Read),
    ("POST", "/api/v1/dlq/replay", Role::Admin),
];

/// The role of a routed request, `None` when the table has no such route.
pub(crate) fn role_of(method: &Method, path: &str) -> Option<Role> {
    let method = if method == Method::HEAD { "GET" } else { method.as_str() };
    ROUTES.iter().find(|(m, p, _)| *m == method && *p == path).map(|(_, _, role)| *role)
}

/// `router` with every route it has so far guarded by its role (call it after the
/// routes and fallbacks are added).
pub(crate) fn guarded<S: Clone + Send + Sync + 'static>(router: Router<S>, access: Access) -> Router<S> {
    router.route_layer(middleware::from_fn_with_state(access, guard))
}

/// Middleware: the request goes on if its route's role allows the token it shows.
async fn guard(State(access): State<Access>, request: Request, next: Next) -> Response {
    let path = request.extensions().get::<MatchedPath>().map(|p| p.as_str().to_string());
    let Some(role) = path.as_deref().and_then(|p| role_of(request.method(), p)) else {
        let route = path.as_deref().unwrap_or(request.uri().path());
        if ROUTES.iter().any(|(_, p, _)| *p == route) {
            return HttpError::new(
                ErrorCode::MethodNotAllowed,
                "this endpoint does not take this method (see docs/openapi.yaml; a method it should take needs a role in src/api/roles.rs)",
            )
            .into_response();
        }
        return HttpError::new(
            ErrorCode::Internal,
            format!(
                "{} {route} has no role in src/api/roles.rs (ROUTES), so it is refused until it is given one",
                request.method()
            ),
        )
        .into_response();
    };
    match access.check(role, bearer(request.headers())) {
        Ok(()) => next.run(request).await,
        Err(refused) => refused.into_response(),
    }
}

#[cfg(test)]
#[path = "roles_tests.rs"]
mod tests;
