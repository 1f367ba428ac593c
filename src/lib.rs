//! Sluice: a Kafka-backed stream processor for collection logs.
//!
//! See `ARCHITECTURE.md` for the code map and the invariants each module keeps.

pub mod alloc;
pub mod api;
pub mod backfill;
pub mod cli;
pub mod config;
pub mod dlq;
pub mod failpoint;
pub mod functions;
pub mod health;
pub mod kafka;
pub mod materialize;
pub mod metrics;
pub mod offsets;
pub mod positions;
pub mod processor;
pub mod ratelimit;
/// The log record contract lives in its own crate (`record/`), without I/O.
pub use sluice_record as record;
pub mod redact;
pub mod replica;
pub mod retry;
pub mod schema_registry;
pub mod sysdb;
pub mod telemetry;
pub use sluice_record::workload;
