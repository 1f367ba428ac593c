//! Bearer tokens and what each one may do: [`Access`] decides, for a route's [`Role`] and
//! the token a request shows, whether the request goes on, or its 401 or 403.
//!
//! Two tokens: `http.read_token` (`SLUICE_READ_TOKEN`) reads, `http.admin_token`
//! (`SLUICE_ADMIN_TOKEN`) reads and changes. With neither set every request is served
//! (the loopback development mode; `sluice process` refuses it on an address other
//! machines reach unless `http.allow_unauthenticated`). With either set:
//!
//! | role of the route | no or wrong token | read token | admin token |
//! | --- | --- | --- | --- |
//! | open (`/metrics`, `/healthz`, `/readyz`) | served | served | served |
//! | read | 401 | served | served |
//! | admin, admin token set | 401 | 403 | served |
//! | admin, no admin token set | 403 | 403 | — |
//!
//! A replica with only a read token takes no change over HTTP: no credential could
//! allow one, so the answer is 403 naming `http.admin_token`, not a 401 that invites a
//! retry. The routes' roles are in `roles.rs`; the check runs before the body is read, so
//! an unauthenticated request learns nothing about its body.
//!
//! The comparison is constant-time: the presented token is hashed with SHA-256 once and
//! its digest compared with both configured digests with `subtle::ConstantTimeEq`, so
//! neither where the first differing byte is, nor the token's length, nor which token
//! matched shows in the response time. Only the digests of the configured tokens are
//! kept in memory by the server.

use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::error::{ErrorCode, HttpError};

/// What a route needs (`x-sluice-role` in `docs/openapi.yaml`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// Served to anyone: scrapes and probes.
    Open,
    /// Data and state reads: the read token or the admin token.
    Read,
    /// Changes: the admin token only.
    Admin,
}

impl Role {
    /// The name of `x-sluice-role` in `docs/openapi.yaml`, which the tests compare.
    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Open => "open",
            Role::Read => "read",
            Role::Admin => "admin",
        }
    }
}

/// One configured token, as its SHA-256 digest; `None` when it is not configured.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
struct Token(Option<[u8; 32]>);

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

impl Token {
    /// `None` or an empty token: not configured.
    fn new(token: Option<&str>) -> Token {
        Token(token.filter(|t| !t.is_empty()).map(|t| digest(t.as_bytes())))
    }

    fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Whether `presented` (a digest) is this token; `false` when none is configured.
    fn matches(&self, presented: &[u8; 32]) -> bool {
        // Compared even when not configured (against zeros), so that the time does not
        // say which tokens exist.
        let expected = self.0.unwrap_or([0; 32]);
        constant_time_eq(&expected, presented) && self.is_set()
    }
}

/// Equality of two digests without an early exit.
fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    bool::from(a.ct_eq(b))
}

/// The tokens of a server and the decision they make.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    read: Token,
    admin: Token,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let set = |t: Token| if t.is_set() { "set" } else { "none" };
        write!(f, "Access(read: {}, admin: {})", set(self.read), set(self.admin))
    }
}

/// Who a request showed itself to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Credential {
    None,
    Wrong,
    Read,
    Admin,
}

impl Access {
    /// Empty tokens count as unset.
    pub(crate) fn new(read_token: Option<&str>, admin_token: Option<&str>) -> Access {
        Access { read: Token::new(read_token), admin: Token::new(admin_token) }
    }

    /// No token configured: every request is served.
    pub(crate) fn is_open(&self) -> bool {
        !self.read.is_set() && !self.admin.is_set()
    }

    /// One line for the start-up log: what reads and changes need.
    pub(crate) fn describe(&self) -> &'static str {
        match (self.read.is_set(), self.admin.is_set()) {
            (false, false) => {
                "NO token required for reads or changes (neither http.read_token nor http.admin_token is set)"
            }
            (true, true) => "reads need the read or the admin token, changes the admin token",
            (false, true) => "reads and changes need the admin token (http.read_token unset)",
            (true, false) => "reads need the read token; changes are refused (http.admin_token unset)",
        }
    }

    fn credential(&self, presented: Option<&str>) -> Credential {
        let Some(presented) = presented else { return Credential::None };
        let d = digest(presented.as_bytes());
        // Both comparisons always run.
        let (admin, read) = (self.admin.matches(&d), self.read.matches(&d));
        if admin {
            Credential::Admin
        } else if read {
            Credential::Read
        } else {
            Credential::Wrong
        }
    }

    /// The tokens that may do what `role` needs, named for a message.
    fn accepted(&self, role: Role) -> &'static str {
        match (role, self.read.is_set(), self.admin.is_set()) {
            (Role::Read, true, true) => "http.read_token or http.admin_token",
            (Role::Read, true, false) => "http.read_token",
            _ => "http.admin_token",
        }
    }

    /// Whether a request for a route of `role` showing `presented` (the bearer token, if
    /// any) goes on; else the error response.
    pub(crate) fn check(&self, role: Role, presented: Option<&str>) -> Result<(), HttpError> {
        if role == Role::Open || self.is_open() {
            return Ok(());
        }
        let credential = self.credential(presented);
        let accepted = self.accepted(role);
        let unauthorized = |credential| {
            let message = if credential == Credential::None {
                format!("this request needs an `Authorization: Bearer <token>` header with {accepted}")
            } else {
                format!("the bearer token is not {accepted}")
            };
            HttpError::new(ErrorCode::Unauthorized, message)
        };
        match (role, credential) {
            (Role::Read, Credential::Read | Credential::Admin) => Ok(()),
            (Role::Read, c) => Err(unauthorized(c)),
            (Role::Admin, _) if !self.admin.is_set() => Err(HttpError::new(
                ErrorCode::Forbidden,
                "this replica takes no changes over HTTP: http.admin_token (SLUICE_ADMIN_TOKEN) is not set, so no \
                 token may change state; set it to allow changes",
            )),
            (Role::Admin, Credential::Admin) => Ok(()),
            (Role::Admin, Credential::Read) => Err(HttpError::new(
                ErrorCode::Forbidden,
                "the read token may not change state: this request needs http.admin_token",
            )),
            (Role::Admin, c) => Err(unauthorized(c)),
            (Role::Open, _) => Ok(()),
        }
    }
}

/// The token of an `Authorization: Bearer <token>` header (scheme case-insensitive);
/// `None` if the header is missing or is not a bearer credential.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn tokens_are_compared_by_digest_in_constant_time() {
        let t = Token::new(Some("s3cret-token"));
        assert!(t.is_set());
        assert!(t.matches(&digest(b"s3cret-token")));
        assert!(!t.matches(&digest(b"s3cret-tokeN")), "same length, last byte differs");
        assert!(!t.matches(&digest(b"s3cret")), "a prefix is not the token");
        assert!(!t.matches(&digest(b"s3cret-token-and-more")), "an extension is not the token");
        assert!(!t.matches(&digest(b"")));
        let access = Access::new(Some("s3cret-read"), Some("s3cret-token"));
        assert!(!format!("{access:?}").contains("s3cret"), "{access:?}");
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
    fn an_unset_token_matches_nothing_not_even_zeros() {
        let none = Token::new(None);
        assert!(!none.is_set() && !Token::new(Some("")).is_set());
        assert!(!none.matches(&[0; 32]), "the stand-in digest of an unset token is no token");
        assert!(!none.matches(&digest(b"")));
    }

    /// The table of the module's documentation, cell by cell.
    #[test]
    fn each_role_takes_the_tokens_the_table_says() {
        use ErrorCode::{Forbidden, Unauthorized};
        let status = |a: &Access, role, presented| a.check(role, presented).err().map(|e| e.code);
        // The answers to [none, wrong, read, admin]: None = served, else the refusal.
        type Answers = [Option<ErrorCode>; 4];
        let cases: [(Access, Answers, Answers); 4] = [
            // (configured, read route for [none, wrong, read, admin], admin route for the same)
            (Access::new(None, None), [None; 4], [None; 4]),
            (
                Access::new(Some("r"), Some("a")),
                [Some(Unauthorized), Some(Unauthorized), None, None],
                [Some(Unauthorized), Some(Unauthorized), Some(Forbidden), None],
            ),
            (
                Access::new(None, Some("a")),
                [Some(Unauthorized), Some(Unauthorized), Some(Unauthorized), None],
                [Some(Unauthorized), Some(Unauthorized), Some(Unauthorized), None],
            ),
            (
                Access::new(Some("r"), None),
                [Some(Unauthorized), Some(Unauthorized), None, Some(Unauthorized)],
                [Some(Forbidden); 4],
            ),
        ];
        for (access, read, admin) in cases {
            for (i, presented) in [None, Some("wrong"), Some("r"), Some("a")].into_iter().enumerate() {
                assert_eq!(status(&access, Role::Open, presented), None, "{access:?} open {presented:?}");
                assert_eq!(status(&access, Role::Read, presented), read[i], "{access:?} read {presented:?}");
                assert_eq!(status(&access, Role::Admin, presented), admin[i], "{access:?} admin {presented:?}");
            }
        }
    }

    #[test]
    fn refusals_name_the_token_that_would_do() {
        let message = |a: Access, role, presented| a.check(role, presented).unwrap_err().message;
        let both = Access::new(Some("r"), Some("a"));
        assert!(message(both, Role::Read, None)
            .contains("Authorization: Bearer <token>` header with http.read_token or http.admin_token"));
        assert!(message(both, Role::Read, Some("x")).contains("not http.read_token or http.admin_token"));
        assert!(message(both, Role::Admin, Some("r")).contains("needs http.admin_token"));
        assert!(message(Access::new(None, Some("a")), Role::Read, None).ends_with("with http.admin_token"));
        assert!(message(Access::new(Some("r"), None), Role::Read, Some("x")).ends_with("not http.read_token"));
        let no_admin = message(Access::new(Some("r"), None), Role::Admin, Some("r"));
        assert!(no_admin.contains("http.admin_token (SLUICE_ADMIN_TOKEN) is not set"), "{no_admin}");
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
