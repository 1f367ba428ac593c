//! Errors of the sysdb, classified once: what a caller can do about each.

use thiserror::Error;

use crate::positions::IncompatibleDelta;

/// What a caller can do about a [`SysdbError`] (see [`SysdbError::class`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorClass {
    /// The compare-and-set failed: another replica or an operator moved the partition.
    /// Nothing was written; the batch must be dropped, not retried.
    Conflict,
    /// The database cannot be reached, is overloaded, locked or read-only right now:
    /// retry the same batch with backoff.
    Transient,
    /// The database refused a value of this batch (bad text, an index entry too large):
    /// retrying the same batch cannot help, a batch without the offending record can
    /// succeed.
    Record,
    /// Configuration or an unexpected database error: retrying will not help and the
    /// fault is not in one record.
    Fatal,
}

/// Errors of the sysdb, classified by [`SysdbError::class`]: a CAS conflict is an
/// expected outcome (another replica or an operator moved the partition); `Unavailable`
/// is retryable; `Rejected` points at the batch's data; the rest are not retryable.
/// `Clone`: one failed group commit (SQLite) answers every batch of the group.
#[derive(Debug, Clone, Error)]
pub enum SysdbError {
    #[error(transparent)]
    Conflict(#[from] IncompatibleDelta),
    /// The database cannot be reached or is read-only right now; retry with backoff.
    #[error("sysdb unavailable ({backend}): {message}")]
    Unavailable { backend: &'static str, message: String },
    /// The database refused a value of this batch; retrying cannot help, another batch
    /// without the offending record can succeed.
    #[error("sysdb rejected a value ({backend}): {message}")]
    Rejected { backend: &'static str, message: String },
    /// The sysdb URL or its contents are not usable (bad URL, schema from a newer version).
    #[error("sysdb configuration: {0}")]
    Config(String),
    /// Anything else the database reported.
    #[error("sysdb error ({backend}): {message}")]
    Database { backend: &'static str, message: String },
}

impl SysdbError {
    pub fn class(&self) -> ErrorClass {
        match self {
            SysdbError::Conflict(_) => ErrorClass::Conflict,
            SysdbError::Unavailable { .. } => ErrorClass::Transient,
            SysdbError::Rejected { .. } => ErrorClass::Record,
            SysdbError::Config(_) | SysdbError::Database { .. } => ErrorClass::Fatal,
        }
    }

    /// `class() == ErrorClass::Transient`.
    pub fn is_retryable(&self) -> bool {
        self.class() == ErrorClass::Transient
    }
}

pub type Result<T, E = SysdbError> = std::result::Result<T, E>;

/// How long an operator's write (attach, detach) tries again while the sysdb is
/// unavailable: longer than a replica frozen past its session timeout holds SQLite's
/// write lock before it is woken or killed.
pub const OPERATOR_WRITE_BUDGET: std::time::Duration = std::time::Duration::from_secs(30);

/// An operator's write that met the sysdb unavailable — on SQLite, the write lock held
/// past the busy timeout by a replica (a frozen one holds it until it is woken or
/// killed) — tried again with the replica's backoff until `budget` has passed since the
/// first try; then the last error. A try that failed so wrote nothing (the transaction
/// never began or was rolled back), so trying again cannot write twice.
pub async fn retry_unavailable<T, F, Fut>(budget: std::time::Duration, what: &str, mut op: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let started = std::time::Instant::now();
    let mut delays = crate::retry::default_backoff();
    loop {
        match op().await {
            Err(e @ SysdbError::Unavailable { .. }) if started.elapsed() < budget => {
                let delay = delays.next().unwrap_or(std::time::Duration::from_secs(1));
                tracing::warn!(what, error = %e, waited_ms = started.elapsed().as_millis() as u64, "sysdb unavailable; trying again");
                tokio::time::sleep(delay).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_has_one_class_and_only_transient_is_retryable() {
        let cases = [
            (SysdbError::Conflict(IncompatibleDelta::Missing { partition: 0, expected: 1 }), ErrorClass::Conflict),
            (SysdbError::Unavailable { backend: "x", message: String::new() }, ErrorClass::Transient),
            (SysdbError::Rejected { backend: "x", message: String::new() }, ErrorClass::Record),
            (SysdbError::Config(String::new()), ErrorClass::Fatal),
            (SysdbError::Database { backend: "x", message: String::new() }, ErrorClass::Fatal),
        ];
        for (e, class) in cases {
            assert_eq!(e.class(), class, "{e:?}");
            assert_eq!(e.is_retryable(), class == ErrorClass::Transient, "{e:?}");
        }
    }
}
