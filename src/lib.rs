//! Sluice: a Kafka-backed stream processor for collection logs.
//!
//! See `ARCHITECTURE.md` for the code map and the invariants each module keeps.

pub mod materialize;
pub mod record;
pub mod positions;
pub mod sysdb;
pub mod config;
pub mod kafka;
pub mod failpoint;
pub mod functions;
pub mod processor;
pub mod health;
pub mod offsets;
pub mod ratelimit;
pub mod replica;
pub mod retry;
pub mod metrics;
pub mod api;
pub mod backfill;
pub mod cli;
pub mod workload;
