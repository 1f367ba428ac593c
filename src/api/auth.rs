//! Bearer-token check of the admin API's mutating requests.
//!
//! When `http.admin_token` (`SLUICE_ADMIN_TOKEN`) is set, every request under `/api/v1`
//! whose method is not `GET` or `HEAD` needs `Authorization: Bearer <token>`; reads stay
//! open. The check runs before the body is read, so an unauthenticated request learns
//! nothing about its body.
//!
//! The comparison is constant-time: both tokens are hashed with SHA-256 and the two
//! 32-byte digests are compared with `subtle::ConstantTimeEq`, so neither where the first
//! differing byte is nor the token's length shows in the response time. Only the digest
//! of the configured token is kept in memory by the server.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::{ErrorCode, HttpError};

/// The configured token, as its SHA-256 digest; `None` when no token is required.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct AdminToken(Option<[u8; 32]>);

impl std::fmt::Debug for AdminToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "AdminToken(set)" } else { "AdminToken(none)" })
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl AdminToken {
    /// `None` or an empty token: no token required.
    pub(crate) fn new(token: Option<&str>) -> AdminToken {
        AdminToken(token.filter(|t| !t.is_empty()).map(|t| digest(t.as_bytes())))
    }

    pub(crate) fn is_required(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `presented` is the configured token, in time independent of both values.
    /// Always `true` when no token is configured.
    pub(crate) fn accepts(&self, presented: &str) -> bool {
        match &self.0 {
            None => true,
            Some(expected) => constant_time_eq(expected, &digest(presented.as_bytes())),
        }
    }
}

/// Equality of two digests without an early exit.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a.ct_eq(b))
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive);
/// `None` if the header is missing or is not a bearer credential.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Middleware: let reads through; make writes show the token when one is configured.
pub(crate) async fn require_token(State(token): State<AdminToken>, request: Request, next: Next) -> Response {
    if !token.is_required() || matches!(*request.method(), Method::GET | Method::HEAD) {
        return next.run(request).await;
    }
    match bearer(request.headers()) {
        None => HttpError::new(
            ErrorCode::Unauthorized,
            "this request changes state and needs an `Authorization: Bearer <token>` header (http.admin_token)",
        )
        .into_response(),
        Some(presented) if token.accepts(presented) => next.run(request).await,
        Some(_) => HttpError::new(ErrorCode::Unauthorized, "the bearer token is not the configured http.admin_token")
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_are_compared_by_digest_in_constant_time() {
        let t = AdminToken::new(Some("s3cret-token"));
        assert!(t.is_required());
        assert!(t.accepts("s3cret-token"));
        assert!(!t.accepts("s3cret-tokeN"), "same length, last byte differs");
        assert!(!t.accepts("s3cret"), "a prefix is not the token");
        assert!(!t.accepts("s3cret-token-and-more"), "an extension is not the token");
        assert!(!t.accepts(""));
        assert!(!format!("{t:?}").contains("s3cret"));
        // The comparison itself: equal-length digests, no early exit.
        let a = digest(b"x");
        let mut b = a;
        assert!(constant_time_eq(&a, &b));
        b[0] ^= 1;
        assert!(!constant_time_eq(&a, &b));
        b[0] ^= 1;
        b[31] ^= 0x80;
        assert!(!constant_time_eq(&a, &b));
    }

    #[test]
    fn no_or_empty_token_requires_nothing() {
        for t in [AdminToken::new(None), AdminToken::new(Some(""))] {
            assert!(!t.is_required());
            assert!(t.accepts("anything"));
        }
    }

    #[test]
    fn bearer_scheme_is_case_insensitive_and_other_schemes_are_ignored() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer abc"));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("bearer  abc "));
        assert_eq!(bearer(&h), Some("abc"));
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic YWJjOmRlZg=="));
        assert_eq!(bearer(&h), None);
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer"));
        assert_eq!(bearer(&h), None);
    }
}
