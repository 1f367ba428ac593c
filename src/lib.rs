//! Sluice: a Kafka-backed stream processor for collection logs.
//!
//! See `ARCHITECTURE.md` for the code map and the invariants each module keeps.

pub mod alloc;
pub(crate) mod api;
pub mod backfill;
pub mod changelog;
pub mod cli;
pub mod config;
pub(crate) mod dead_letters;
pub(crate) mod events;
pub mod functions;
pub(crate) mod health;
pub mod materialize;
pub(crate) mod metrics;
pub mod offsets;
pub mod processor;
pub mod reading;
/// The log record contract lives in its own crate (`record/`), without I/O.
pub use sluice_record as record;
pub mod replica;
pub mod schema_registry;
pub mod sysdb;
pub mod telemetry;
/// The foundations and the Kafka clients are crates of their own (`base/`, `kafka/`).
pub use sluice_base::{failpoint, positions, ratelimit, redact, retry, token};
pub use sluice_kafka as kafka;
pub use sluice_record::workload;
