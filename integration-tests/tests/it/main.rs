//! The integration tests: one test binary, a module per area (a file of this folder),
//! so that the `sluice` crate and librdkafka are linked once, not once per area.
//! Shared helpers are in the library `sluice_integration_tests` (`../../src/`).
//!
//! Run one area, or one test, by a name filter:
//!
//! ```text
//! cargo test -p sluice-integration-tests --test it -- processor_faults::
//! cargo test -p sluice-integration-tests --test it -- chaos::chaos_on_postgres --exact --nocapture
//! ```
//!
//! The areas' tests run in one process, in parallel with each other (libtest's threads):
//! a test that stops a service or takes a fixed port must keep that to itself (as
//! `sysdb_outage` and `broker_failover` do with a private server and cluster).

mod admin_api;
mod attach_rules;
mod auth_broker;
mod broker_failover;
mod changelog_feed;
mod chaos;
mod cli_contract;
mod consumer_queues;
mod dlq_redrive;
mod fault_points;
mod functions_backfill;
mod hostile_input;
mod http_roles;
mod metrics_http;
mod operator_offsets;
mod partitioner_interop;
mod processor_e2e;
mod processor_faults;
mod prometheus_dashboard;
mod python_interop;
mod read_tokens;
mod real_world_inputs;
mod refused_records;
mod schema_registry;
mod smoke;
mod soak;
mod sql_views;
mod sqlite_bounds;
mod sysdb_outage;
mod sysdb_postgres;
mod traces;
mod unclean_faults;
mod wasm_functions;
