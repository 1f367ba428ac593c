//! What the admin API's handlers share: the [`Admin`] state (configuration, sysdb,
//! producer, the bearer tokens' [`Access`], read tokens) and the API's limits.

use std::sync::Arc;

use super::auth::Access;
use crate::config::Config;
use crate::kafka::producer::Producer;
use crate::kafka::KafkaError;
use crate::sysdb::Sysdb;

/// Page size of `GET .../records` without `limit`.
pub(crate) const DEFAULT_PAGE: usize = 100;
/// Largest `limit` of `GET .../records`.
pub(crate) const MAX_PAGE: usize = 1000;
/// How long a produce (records, an attach's marker) may wait for the broker before the
/// request fails with 503 (an attach's marker is then republished by the outbox relay).
const DELIVERY_TIMEOUT_MS: &str = "15000";

/// What the admin handlers share.
pub(crate) struct Admin {
    pub(super) config: Config,
    pub(super) sysdb: Arc<Sysdb>,
    pub(super) producer: Producer,
    pub(super) access: Access,
    /// Where readers waiting for a read token watch the positions (`None`: they poll).
    pub(super) board: Option<Arc<crate::reading::board::Board>>,
    /// The replica's metrics (how long token reads waited); `None` in unit tests.
    pub(super) metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The log topic's fingerprint for read tokens, asked of the broker once.
    pub(super) tokens: Arc<crate::reading::TokenSource>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin")
            .field("sysdb", &self.sysdb.backend())
            .field("access", &self.access)
            .finish_non_exhaustive()
    }
}

impl Admin {
    /// The bearer tokens are `config.http.read_token` and `admin_token` (already
    /// overridden by `SLUICE_READ_TOKEN` and `SLUICE_ADMIN_TOKEN`).
    /// Creating the producer does not contact the broker.
    pub(crate) fn new(config: Config, sysdb: Arc<Sysdb>) -> Result<Admin, KafkaError> {
        let producer = Producer::new(&config.client_settings(), &[("message.timeout.ms", DELIVERY_TIMEOUT_MS)])?;
        let access = Access::new(config.http.read_token(), config.http.admin_token());
        let tokens = crate::reading::TokenSource::new(config.client_settings(), config.kafka.log_topic());
        Ok(Admin { config, sysdb, producer, access, board: None, metrics: None, tokens })
    }

    /// Readers wait on `board` (the replica's) instead of polling the sysdb each, and
    /// their waits are counted in `metrics`.
    pub(crate) fn with_reads(
        mut self,
        board: Arc<crate::reading::board::Board>,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Admin {
        self.board = Some(board);
        self.metrics = Some(metrics);
        self
    }

    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    pub(crate) fn sysdb(&self) -> &Sysdb {
        &self.sysdb
    }

    pub(crate) fn producer(&self) -> &Producer {
        &self.producer
    }

    /// The bearer tokens, and what each may do.
    pub(crate) fn access(&self) -> Access {
        self.access
    }
}
