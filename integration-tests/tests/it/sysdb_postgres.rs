//! The sysdb conformance suite (`sluice::sysdb::conformance`) against a real PostgreSQL.
//!
//! Start the local server with `deploy/local/postgres.sh start`; the URL is
//! `SLUICE_TEST_POSTGRES_URL`, default `postgres://sluice:sluice@127.0.0.1:55432/sluice_test`.
//! The suite uses random topic and collection names, so it shares the database with
//! other runs; the schema tests work in a throwaway PostgreSQL schema of their own.
//!
//! An unreachable server fails the tests — unless `SLUICE_SKIP_INTEGRATION=1` is set and
//! `CI` is not, in which case they print that they skip and pass.

use sluice::sysdb::{conformance, Sysdb, SysdbError};
use tokio_postgres::NoTls;

const DEFAULT_URL: &str = "postgres://sluice:sluice@127.0.0.1:55432/sluice_test";

fn url() -> String {
    std::env::var("SLUICE_TEST_POSTGRES_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

fn skip_allowed() -> bool {
    std::env::var("SLUICE_SKIP_INTEGRATION").is_ok_and(|v| v == "1") && std::env::var_os("CI").is_none()
}

/// Open the sysdb at `url`, or `None` when PostgreSQL is down and skipping is allowed.
async fn open(url: &str) -> Option<Sysdb> {
    match Sysdb::open(url).await {
        Ok(db) => Some(db),
        Err(e @ SysdbError::Unavailable { .. }) if skip_allowed() => {
            eprintln!("SKIPPING: PostgreSQL unreachable ({e}); SLUICE_SKIP_INTEGRATION=1 is set");
            None
        }
        Err(e @ SysdbError::Unavailable { .. }) => panic!(
            "PostgreSQL is unreachable at {}: {e}\n\
             Start it with `deploy/local/postgres.sh start` (or set SLUICE_TEST_POSTGRES_URL; \
             SLUICE_SKIP_INTEGRATION=1 skips outside CI)",
            sluice::sysdb::redact_url(url)
        ),
        Err(e) => panic!("opening the PostgreSQL sysdb failed: {e}"),
    }
}

/// `url` with `search_path` set to `schema`, so the sysdb's tables live there.
fn url_in_schema(url: &str, schema: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}options=-csearch_path%3D{schema}")
}

/// A plain tokio-postgres client, for what the sysdb API does not expose.
async fn raw_client(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.expect("raw connection");
    tokio::spawn(connection);
    client
}

#[tokio::test]
async fn postgres_sysdb_passes_the_conformance_suite() {
    let url = url();
    let Some(db) = open(&url).await else { return };
    conformance::run_all(&db).await;
    conformance::reopen_is_idempotent(&db, &url).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replica_pools_racing_on_one_partition_commit_exactly_once_per_offset() {
    let url = url();
    let Some(a) = open(&url).await else { return };
    let Some(b) = open(&url).await else { return };
    conformance::concurrent_commits_from_two_handles(&a, &b).await;
    conformance::concurrent_commits_with_the_same_from(&a).await;
}

/// A backfill and live batches of one collection at the same time, on separate pooled
/// connections: the function row lock orders them (FOR UPDATE / FOR SHARE), neither
/// fails, and the outputs equal the functions over the whole history.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_backfill_racing_live_commits_ends_exact() {
    let url = url();
    let Some(db) = open(&url).await else { return };
    for _ in 0..3 {
        conformance::functions::backfill_races_live_commits(&db).await;
    }
}

/// The function checks on two handles (two replicas): attach races on one output name
/// yield one function.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_attaches_of_one_output_create_one_function() {
    let url = url();
    let Some(a) = open(&url).await else { return };
    let Some(b) = open(&url).await else { return };
    conformance::functions::concurrent_attaches_create_one_function(&a, &b).await;
}

#[tokio::test]
async fn concurrent_first_opens_migrate_once_and_a_newer_schema_is_refused() {
    let url = url();
    let Some(_probe) = open(&url).await else { return };
    let schema = format!("sluice_test_{}", uuid::Uuid::new_v4().simple());
    let admin = raw_client(&url).await;
    admin.batch_execute(&format!("CREATE SCHEMA {schema}")).await.expect("create schema");
    let scoped = url_in_schema(&url, &schema);

    // The checks run in their own task so that the schema is dropped even when one fails.
    let (task_url, task_schema, scoped) = (url.clone(), schema.clone(), scoped.clone());
    let result = async move {
        let schema = task_schema;
        let admin = raw_client(&task_url).await;
        // Two replicas starting at once on an empty schema: the advisory lock makes one
        // migrate and the other find the work done.
        let (a, b) = tokio::join!(Sysdb::open(&scoped), Sysdb::open(&scoped));
        let (a, b) = (a.expect("first concurrent open"), b.expect("second concurrent open"));
        let version = a.schema_version().await.expect("version");
        assert!(version >= 1);
        assert_eq!(b.schema_version().await.expect("version"), version);
        let rows: i64 = admin
            .query_one(&format!("SELECT count(*) FROM {schema}.schema_migrations"), &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(rows, version, "a migration step was recorded twice");
        // Step 9: `records` pages keep room for a row's next version (HOT updates).
        let options: Option<Vec<String>> = admin
            .query_one(
                "SELECT c.reloptions FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                 WHERE n.nspname = $1 AND c.relname = 'records'",
                &[&schema],
            )
            .await
            .expect("records' storage options")
            .get(0);
        assert_eq!(options, Some(vec!["fillfactor=70".to_string()]), "records' fill factor");
        conformance::init_position_returns_the_existing_value(&a).await;

        admin
            .execute(
                &format!("INSERT INTO {schema}.schema_migrations (version, description, applied_at_ms) VALUES ($1, 'from the future', 0)"),
                &[&(version + 1)],
            )
            .await
            .expect("insert future version");
        match Sysdb::open(&scoped).await {
            Err(SysdbError::Config(m)) => assert!(m.contains("schema version"), "{m}"),
            Err(e) => panic!("expected a Config error, got {e}"),
            Ok(_) => panic!("a schema newer than the binary was accepted"),
        }
    };
    // Drop the schema whatever happened, then report.
    let outcome = tokio::spawn(result).await;
    admin.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop schema");
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic.into_panic());
    }
}

#[tokio::test]
async fn wrong_password_is_refused_without_echoing_it() {
    let url = url();
    let Some(_probe) = open(&url).await else { return };
    // The local cluster asks TCP clients for their password (`deploy/local/postgres.sh`
    // configures scram-sha-256 and upgrades older trusting clusters on `start`).
    let bad = url.replacen("sluice:sluice@", "sluice:not-the-password-42@", 1);
    assert_ne!(bad, url, "the test URL carries the password sluice:sluice");
    let e = match Sysdb::open(&bad).await {
        Ok(_) => panic!(
            "PostgreSQL at {} accepted a wrong password: it trusts TCP connections. Run `deploy/local/postgres.sh start` to switch the local cluster to password authentication",
            sluice::sysdb::redact_url(&url)
        ),
        Err(e) => e,
    };
    let text = format!("{e} {e:?}");
    assert!(text.contains("password authentication failed"), "the error names the refused password: {text}");
    assert!(!text.contains("not-the-password-42"), "{text}");
}

/// `cargo test --release -p sluice-integration-tests --test it -- --ignored sysdb_postgres::commit_throughput --nocapture`
#[tokio::test]
#[ignore = "measurement, prints records/s"]
async fn commit_throughput() {
    let url = url();
    let Some(db) = open(&url).await else { return };
    conformance::measure_commit_throughput(&db, 5_000, 384, 5).await;
}
