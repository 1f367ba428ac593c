//! Sluice against an authenticated broker: SASL/SCRAM-SHA-512 over TLS, started by
//! `deploy/local/kafka-auth.sh` (its own port, 29192 by default; the plain test broker on
//! 9092 is not touched).
//!
//! - right credentials (password from `SLUICE_SASL_PASSWORD`, TLS settings from the
//!   config's `[librdkafka]` table) + the script's CA: `sluice init`, `sluice produce`,
//!   `sluice process` materializes the records; neither the replica's log nor
//!   `sluice config show` contains the password;
//! - a wrong password: `sluice process` exits non-zero within seconds, naming
//!   authentication (no silent retry loop);
//! - a CA that did not sign the broker's certificate: exits non-zero within seconds,
//!   naming the certificate.
//!
//! The broker: if it was not running, the test starts it and stops it at the end; if it
//! was (scripts/test.sh starts it, .ci/run stops it), it is left running. A broker that
//! cannot start FAILS the test (CI cannot opt out); outside CI `SLUICE_SKIP_INTEGRATION=1`
//! turns that into an announced skip.

use std::process::Command;
use std::time::{Duration, Instant};

use sluice_integration_tests::{in_ci, repo_root, suffix, Env};

const PASSWORD: &str = "sluice-secret";

fn script() -> std::path::PathBuf {
    repo_root().join("deploy/local/kafka-auth.sh")
}

/// What `kafka-auth.sh env` prints, as pairs.
fn auth_env() -> Vec<(String, String)> {
    let out = Command::new(script()).arg("env").output().expect("run kafka-auth.sh env");
    assert!(out.status.success(), "kafka-auth.sh env failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('=').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// Stops the broker on drop when this test started it.
struct BrokerGuard {
    started_here: bool,
}

impl Drop for BrokerGuard {
    fn drop(&mut self) {
        if self.started_here {
            let _ = Command::new(script()).arg("stop").status();
        }
    }
}

/// Start the authenticated broker unless it runs; `None` means skip (only when allowed).
fn require_auth_broker() -> Option<BrokerGuard> {
    let running = Command::new(script()).arg("status").output().map(|o| o.status.success()).unwrap_or(false);
    if running {
        return Some(BrokerGuard { started_here: false });
    }
    let out = Command::new(script()).arg("start").output().expect("run deploy/local/kafka-auth.sh start");
    if out.status.success() {
        return Some(BrokerGuard { started_here: true });
    }
    let why = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !in_ci() && std::env::var("SLUICE_SKIP_INTEGRATION").as_deref() == Ok("1") {
        eprintln!("SKIPPING: the authenticated Kafka broker cannot start and SLUICE_SKIP_INTEGRATION=1: {why}");
        return None;
    }
    panic!("deploy/local/kafka-auth.sh start failed (set SLUICE_SKIP_INTEGRATION=1 outside CI to skip):\n{why}");
}

fn record(collection: &str, id: usize) -> String {
    format!(
        r#"{{"collection": "{collection}", "id": "r{id}", "operation": "add", "embedding": [{id}.0, 1.5], "metadata": {{"n": {id}}}, "document": "doc {id}"}}"#
    )
}

#[test]
fn scram_over_tls_works_and_bad_credentials_or_ca_fail_fast() {
    let Some(_broker) = require_auth_broker() else { return };
    let vars = auth_env();
    let get = |k: &str| {
        vars.iter()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{k} missing from kafka-auth.sh env"))
    };
    let (brokers, user, ca) = (get("SLUICE_BROKERS"), get("SLUICE_SASL_USERNAME"), get("SLUICE_KAFKA_AUTH_CA"));
    assert_eq!(get("SLUICE_SASL_PASSWORD"), PASSWORD);
    assert!(std::path::Path::new(&get("SLUICE_KAFKA_AUTH_CLIENT_TOML")).exists());

    // TLS and mechanism from the config file; the credentials from the environment.
    let tls = |ca: &str| {
        format!(
            "[librdkafka]\n\"security.protocol\" = \"SASL_SSL\"\n\"sasl.mechanisms\" = \"SCRAM-SHA-512\"\n\"ssl.ca.location\" = \"{ca}\"\n"
        )
    };
    let mut env = Env::sqlite("auth").with_sections(&tls(&ca));
    env.extra = vec![
        ("SLUICE_BROKERS".into(), brokers.clone()),
        ("SLUICE_SASL_USERNAME".into(), user.clone()),
        ("SLUICE_SASL_PASSWORD".into(), PASSWORD.into()),
    ];

    // --- right credentials and CA: init, produce, process materializes.
    env.run(&["init", "--partitions", "2"]);
    let collection = format!("auth-{}", suffix());
    let lines: Vec<String> = (0..5).map(|i| record(&collection, i)).collect();
    env.produce(&lines);
    let mut replica = env.spawn_replica("good", &[]);
    env.wait_caught_up(Duration::from_secs(60));
    let records = env.run(&["records", &collection, "--format", "jsonl"]);
    assert_eq!(records.lines().count(), 5, "materialized records: {records}");
    assert_eq!(replica.terminate(Duration::from_secs(30)), Some(0), "replica log:\n{}", replica.log_text());
    let log = replica.log_text();
    assert!(!log.contains(PASSWORD), "the replica's log contains the password:\n{log}");
    let shown = env.run(&["config", "show", "--format", "json"]);
    assert!(!shown.contains(PASSWORD), "config show prints the password:\n{shown}");
    let v: serde_json::Value = serde_json::from_str(&shown).expect("config show json");
    assert_eq!(v["librdkafka"]["sasl.password"], "***", "{shown}");
    assert_eq!(v["librdkafka"]["sasl.username"], user.as_str(), "{shown}");

    // --- wrong password: fails fast, naming authentication.
    let t0 = Instant::now();
    let mut bad = env.spawn_replica("bad-password", &[("SLUICE_SASL_PASSWORD", "not-the-password")]);
    let status = bad.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| {
        panic!("sluice process with a wrong password still runs after 15s; log:\n{}", bad.log_text())
    });
    let log = bad.log_text();
    assert!(!status.success(), "a wrong password must fail; log:\n{log}");
    assert!(log.to_lowercase().contains("authentication failed"), "the error must name authentication:\n{log}");
    assert!(!log.contains("not-the-password") && !log.contains(PASSWORD), "the password leaks:\n{log}");
    eprintln!("wrong password: exit {status} after {:?}", t0.elapsed());

    // --- a CA that did not sign the broker's certificate: fails fast, naming the certificate.
    let other_ca = env.dir.join("other-ca.pem");
    let key = env.dir.join("other-ca.key");
    let gen = Command::new("openssl")
        .args(["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=Not the Sluice test CA"])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&other_ca)
        .output()
        .expect("run openssl");
    assert!(gen.status.success(), "openssl: {}", String::from_utf8_lossy(&gen.stderr));
    let mut wrong_ca_env = env.with_sections(&tls(other_ca.to_str().expect("utf8 path")));
    wrong_ca_env.extra = env.extra.clone();
    let t0 = Instant::now();
    let mut untrusted = wrong_ca_env.spawn_replica("wrong-ca", &[]);
    let status = untrusted.wait_exit(Duration::from_secs(15)).unwrap_or_else(|| {
        panic!("sluice process with an untrusted CA still runs after 15s; log:\n{}", untrusted.log_text())
    });
    let log = untrusted.log_text();
    assert!(!status.success(), "an untrusted certificate must fail; log:\n{log}");
    assert!(log.contains("certificate"), "the error must name the certificate:\n{log}");
    assert!(log.contains("ssl.ca.location"), "the error must name the fix:\n{log}");
    eprintln!("untrusted CA: exit {status} after {:?}", t0.elapsed());

    // init and produce fail fast the same way.
    let out = wrong_ca_env.cmd().args(["init"]).output().expect("sluice init");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("certificate"), "{}", String::from_utf8_lossy(&out.stderr));
}
