//! The command-line contract other tools depend on, against the real broker and sysdb.

use std::time::Duration;

use serde_json::Value;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{assert_records_match_model, brokers, jsonl_lines, repo_root, require_kafka, Env};

fn workload(n: usize, seed: u64, prefix: &str) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records: n,
        collections: 5,
        dim: 3,
        ids_per_collection: 25,
        seed,
        collection_prefix: format!("{prefix}-c"),
        ..Default::default()
    })
    .collect()
}

fn offsets(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "show", "--format", "json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn high_watermarks(env: &Env) -> i64 {
    offsets(env).iter().map(|o| o["high_watermark"].as_i64().unwrap()).sum()
}

/// Good lines 1, 3, 6; invalid lines 2 (not JSON), 4 (empty id), 5 (unknown operation),
/// 7 (not UTF-8).
fn mixed_input(env: &Env) -> std::path::PathBuf {
    let good = jsonl_lines(&workload(3, 1, &env.prefix));
    let input = [
        good[0].clone(),
        "{not json".to_string(),
        good[1].clone(),
        r#"{"collection":"c","id":"","operation":"add"}"#.to_string(),
        r#"{"collection":"c","id":"x","operation":"merge"}"#.to_string(),
        good[2].clone(),
    ];
    let path = env.dir.join("bad.jsonl");
    let mut bytes = input.join("\n").into_bytes();
    // Line 7: not UTF-8 (also set aside, not the end of the run).
    bytes.extend_from_slice(b"\n\xff\xfe{}\n");
    std::fs::write(&path, bytes).unwrap();
    path
}

#[test]
fn produce_stops_at_the_first_invalid_line_or_sets_them_aside_with_rejects() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("produce-bad");
    env.run(&["init", "--partitions", "2"]);
    let path = mixed_input(&env);
    // Default: the first invalid line (2) stops the run; line 1 was delivered.
    let out = env.cmd().args(["produce", path.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("line 2 of") && err.contains("--rejects"), "{err}");
    assert_eq!(high_watermarks(&env), 1, "only the line before the invalid one was delivered");

    // --rejects: every invalid line lands in the file (number, reason, text), the rest is produced.
    let rejects = env.dir.join("rejects.jsonl");
    let out = env
        .cmd()
        .args(["produce", path.to_str().unwrap(), "--rejects", rejects.to_str().unwrap(), "--format", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((report["delivered"].as_u64(), report["rejected"].as_u64()), (Some(3), Some(4)), "{report}");
    let rejected: Vec<Value> =
        std::fs::read_to_string(&rejects).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let lines: Vec<i64> = rejected.iter().map(|r| r["line"].as_i64().unwrap()).collect();
    assert_eq!(lines, vec![2, 4, 5, 7]);
    assert!(rejected.iter().all(|r| !r["reason"].as_str().unwrap().is_empty()), "{rejected:?}");
    assert_eq!(rejected[0]["text"], "{not json");
    assert_eq!(high_watermarks(&env), 1 + 3, "the three valid lines were delivered");

    // --dry-run validates and counts, produces nothing.
    let out = env
        .cmd()
        .args([
            "produce",
            path.to_str().unwrap(),
            "--dry-run",
            "--rejects",
            rejects.to_str().unwrap(),
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (report["valid"].as_u64(), report["delivered"].as_u64(), report["dry_run"].as_bool()),
        (Some(3), Some(0), Some(true))
    );
    assert_eq!(high_watermarks(&env), 4, "a dry run produced nothing");
}

#[test]
fn produce_fails_fast_on_a_missing_input_and_names_init_for_a_missing_topic() {
    let env = Env::sqlite("produce-fast");
    // No broker at all: the missing file is reported before any connection attempt.
    let started = std::time::Instant::now();
    let missing = env.dir.join("no-such-input.jsonl");
    let out =
        env.cmd().args(["produce", missing.to_str().unwrap()]).env("SLUICE_BROKERS", "127.0.0.1:1").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no-such-input.jsonl"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2), "took {:?}: {err}", started.elapsed());

    if !require_kafka() {
        return;
    }
    // A broker but no log topic (no `sluice init`): an error naming it, within seconds.
    let input = env.dir.join("ok.jsonl");
    std::fs::write(&input, jsonl_lines(&workload(2, 9, &env.prefix)).join("\n")).unwrap();
    let started = std::time::Instant::now();
    let out = env.cmd().args(["produce", input.to_str().unwrap()]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("sluice init") && err.contains(&env.log_topic()), "{err}");
    assert!(started.elapsed() < Duration::from_secs(15), "took {:?}: {err}", started.elapsed());
}

#[test]
fn offsets_reset_is_audited_and_reconcile_pushes_sysdb_positions_into_the_group() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("offsets-cli");
    env.run(&["init", "--partitions", "2"]);
    env.produce(&jsonl_lines(&workload(300, 2, &env.prefix)));
    let mut r = env.spawn_replica("r1", &[]);
    env.wait_caught_up(Duration::from_secs(120));
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));

    // Group moved back by Kafka's tool; reconcile restores the sysdb positions.
    let tool = repo_root().join("deploy/local/kafka-tool.sh");
    let st = std::process::Command::new(&tool)
        .args([
            "consumer-groups",
            "--bootstrap-server",
            &brokers(),
            "--group",
            &env.group,
            "--reset-offsets",
            "--to-earliest",
            "--topic",
            &env.log_topic(),
            "--execute",
        ])
        .output()
        .unwrap();
    assert!(st.status.success());
    assert!(offsets(&env).iter().all(|o| o["group_offset"].as_i64() == Some(0)));
    env.run(&["offsets", "reconcile"]);
    assert!(offsets(&env).iter().all(|o| o["group_offset"] == o["sysdb_next_offset"]), "{:?}", offsets(&env));

    // Reset a partition to 5: the sysdb moves, the audit row says who, from, to, why. The
    // partition is the one with the most records: which partition a collection's hash picks
    // depends on the random prefix, and all five land on one partition in about 1 run in 16.
    let p = (0..2).max_by_key(|&i| offsets(&env)[i]["high_watermark"].as_i64().unwrap()).unwrap();
    let before = offsets(&env)[p]["sysdb_next_offset"].as_i64().unwrap();
    assert!(before > 5, "the partition holds more than 5 records: {:?}", offsets(&env));
    let part = p.to_string();
    let out = env.run(&["offsets", "reset", "--partition", &part, "--to", "5", "--reason", "replay test", "--execute"]);
    assert!(out.contains(&format!("{before} -> 5")), "{out}");
    assert_eq!(offsets(&env)[p]["sysdb_next_offset"].as_i64(), Some(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let resets = rt.block_on(async {
        sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().resets(&env.log_topic()).await.unwrap()
    });
    assert_eq!(resets.len(), 1);
    assert_eq!(
        (resets[0].partition, resets[0].from_offset, resets[0].to_offset, resets[0].reason.as_str()),
        (p as i32, Some(before), 5, "replay test")
    );

    // A negative offset reaches the product's own check (`--to=-3`: clap would take a
    // separate `-3` for a flag and reject it itself, exit 2) and changes nothing.
    let out =
        env.cmd().args(["offsets", "reset", "--partition", &part, "--to=-3", "--reason", "negative"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused by the reset command, not the argument parser: {err}");
    assert!(err.contains("--to must be >= 0"), "{err}");
    assert_eq!(offsets(&env)[p]["sysdb_next_offset"].as_i64(), Some(5), "the refused reset left the position alone");
    let resets = rt.block_on(async {
        sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().resets(&env.log_topic()).await.unwrap()
    });
    assert_eq!(resets.len(), 1, "no audit row for the refused reset: {resets:?}");
}

#[test]
fn config_show_redacts_secrets_and_unknown_keys_are_rejected() {
    let env = Env::sqlite("config");
    let cfg = env.dir.join("secret.toml");
    std::fs::write(&cfg, "[librdkafka]\n\"sasl.password\" = \"hunter2\"\n\"sasl.username\" = \"bob\"\n").unwrap();
    for sysdb in ["postgres://u:pw123@127.0.0.1:1/db", "postgres://u@127.0.0.1:1/db?password=pw123&sslmode=disable"] {
        for format in ["toml", "json"] {
            let out = env
                .cmd()
                .args(["--config", cfg.to_str().unwrap(), "config", "show", "--format", format])
                .env("SLUICE_SYSDB", sysdb)
                .env("SLUICE_ADMIN_TOKEN", "tok-s3cret")
                .env("SLUICE_READ_TOKEN", "rtok-s3cret")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
            for secret in ["hunter2", "pw123", "tok-s3cret", "rtok-s3cret"] {
                assert!(!text.contains(secret), "{secret} in {text}");
            }
            assert!(text.contains("bob") && text.contains("***"), "{text}");
            assert_eq!(text.contains("sslmode=disable"), sysdb.contains("sslmode"), "other parameters stay: {text}");
            // Every key, including those the hand-built output used to miss.
            for key in [
                "session_timeout_ms",
                "instance_id",
                "max_poll_interval_ms",
                "request_timeout_ms",
                "confluent_schema_id",
                "shutdown_timeout_ms",
                "max_document_bytes",
                "admin_token",
                "read_token",
                "allow_unauthenticated",
            ] {
                assert!(text.contains(key), "{key} missing from {text}");
            }
            if format == "json" {
                let v: Value = serde_json::from_str(&text).unwrap();
                assert_eq!(v["http"]["admin_token"], "***");
                assert_eq!(v["http"]["read_token"], "***");
                assert_eq!(v["http"]["allow_unauthenticated"], false);
                assert_eq!(v["librdkafka"]["sasl.password"], "***");
            } else {
                assert!(text.contains("[limits]") && text.contains("[kafka]"), "{text}");
            }
        }
    }
    // A mistyped librdkafka key: refused (usage, exit 2) naming the key, never the value.
    std::fs::write(&cfg, "[librdkafka]\n\"sasl.pasword\" = \"hunter2\"\n").unwrap();
    let out = env.cmd().args(["--config", cfg.to_str().unwrap(), "config", "show"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("invalid [librdkafka] key \"sasl.pasword\"") && !err.contains("hunter2"), "{err}");
    std::fs::write(&cfg, "[processor]\nbatch_max_record = 5\n").unwrap();
    let out = env.cmd().args(["--config", cfg.to_str().unwrap(), "config", "show"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("batch_max_record"));
    // Every key through SLUICE_SECTION__KEY.
    let out = env
        .cmd()
        .args(["config", "show", "--format", "json"])
        .env("SLUICE_PROCESSOR__BATCH_MAX_RECORDS", "77")
        .env("SLUICE_LIMITS__MAX_EMBEDDING_DIM", "9")
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["processor"]["batch_max_records"].as_u64(), v["limits"]["max_embedding_dim"].as_u64()),
        (Some(77), Some(9))
    );
}

#[test]
fn the_connect_error_never_prints_the_sysdb_password() {
    let env = Env::sqlite("connect-secret");
    let base = sluice_integration_tests::postgres_url();
    let rest = base.split_once('@').unwrap().1;
    for url in
        [format!("postgres://sluice:wrong-s3cret@{rest}"), format!("postgres://sluice@{rest}?password=wrong-s3cret")]
    {
        let out = env.cmd().args(["collections", "list"]).env("SLUICE_SYSDB", &url).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(err.contains("cannot open the sysdb") && !err.contains("wrong-s3cret"), "{err}");
        assert!(err.contains("***"), "the URL is named, redacted: {err}");
    }
}

#[test]
fn read_commands_never_create_or_migrate_a_sysdb() {
    let env = Env::sqlite("read-only");
    let db = env.dir.join("sysdb.db");
    let reads: &[&[&str]] = &[
        &["collections", "list"],
        &["functions", "list"],
        &["offsets", "show"],
        &["records", "c"],
        &["checksum"],
        &["offsets", "reconcile"],
    ];
    for args in reads {
        let out = env.cmd().args(*args).env("SLUICE_BROKERS", "127.0.0.1:1").output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("sluice init"), "{args:?}: {err}");
        assert!(!db.exists(), "{args:?} created {}", db.display());
    }
    // An existing file without Sluice's schema stays untouched.
    std::fs::write(&db, b"").unwrap();
    let out = env.cmd().args(["collections", "list"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no Sluice schema") && err.contains("sluice init"), "{err}");
    assert_eq!(std::fs::metadata(&db).unwrap().len(), 0, "the empty file was not migrated");
    // A sysdb at an older schema version: read commands say `sluice init` migrates it.
    std::fs::remove_file(&db).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let latest = rt.block_on(async {
        let s = sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap();
        s.schema_version().await.unwrap()
    });
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute("DELETE FROM schema_migrations WHERE version = ?1", [latest]).unwrap();
    drop(conn);
    let out = env.cmd().args(["collections", "list"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("older") && err.contains("`sluice init` migrates it"), "{err}");
    let conn = rusqlite::Connection::open(&db).unwrap();
    let now: i64 = conn.query_row("SELECT MAX(version) FROM schema_migrations", [], |r| r.get(0)).unwrap();
    assert_eq!(now, latest - 1, "the read command did not migrate");
}

#[tokio::test]
async fn read_commands_refuse_a_postgres_database_without_the_schema() {
    if !sluice_integration_tests::require_postgres().await {
        return;
    }
    let env = Env::postgres("read-only-pg").await;
    let e = env.clone();
    let out = tokio::task::spawn_blocking(move || e.cmd().args(["functions", "list"]).output().unwrap()).await.unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no Sluice schema") && err.contains("sluice init"), "{err}");
    let (client, conn) = tokio_postgres::connect(&env.sysdb, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    let created: bool =
        client.query_one("SELECT to_regclass('schema_migrations') IS NOT NULL", &[]).await.unwrap().get(0);
    assert!(!created, "the read command created the schema");
}

/// Run `sluice ARGS` with its stdout closed early: read at most one line, then close.
fn with_closed_pipe(env: &Env, args: &[&str]) -> std::process::Output {
    use std::io::BufRead;
    let mut child =
        env.cmd().args(args).stdout(std::process::Stdio::piped()).stderr(std::process::Stdio::piped()).spawn().unwrap();
    {
        // Close at once (before a short output is written) or after one line.
        let stdout = child.stdout.take().unwrap();
        if args.contains(&"workload") {
            let mut first = String::new();
            std::io::BufReader::new(stdout).read_line(&mut first).unwrap();
        }
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_closed_pipe_ends_quietly_with_exit_zero() {
    let env = Env::sqlite("pipe");
    let mut cases: Vec<Vec<&str>> = vec![
        vec!["config", "show"],
        vec!["config", "show", "--format", "json"],
        vec!["config", "docs"],
        vec!["workload", "--records", "200000", "--dim", "8"],
    ];
    let kafka = require_kafka();
    if kafka {
        env.run(&["init", "--partitions", "2"]);
        cases.push(vec!["offsets", "show"]);
        cases.push(vec!["offsets", "show", "--format", "jsonl"]);
        cases.push(vec!["collections", "list"]);
    }
    for args in &cases {
        let out = with_closed_pipe(&env, args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
}

fn assert_format(what: &str, format: &str, stdout: &[u8]) {
    let text = String::from_utf8_lossy(stdout);
    match format {
        "json" => {
            serde_json::from_str::<Value>(&text)
                .unwrap_or_else(|e| panic!("{what}: not one JSON document ({e}): {text}"));
        }
        "jsonl" => {
            let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
            for l in &lines {
                let v: Value =
                    serde_json::from_str(l).unwrap_or_else(|e| panic!("{what}: line {l:?} is not JSON ({e})"));
                assert!(v.is_object(), "{what}: jsonl line is not an object: {l}");
            }
            assert!(
                lines.len() < 2 || serde_json::from_str::<Value>(&text).is_err(),
                "{what}: jsonl printed one document over several lines: {text}"
            );
        }
        _ => {
            assert!(!text.trim().is_empty(), "{what}: empty table");
            assert!(serde_json::from_str::<Value>(&text).is_err(), "{what}: the table is JSON: {text}");
        }
    }
}

#[test]
fn every_printing_command_honours_each_format() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("formats");
    let data = workload(200, 5, &env.prefix);
    let collection = data[0].collection_id.clone();
    let input = env.dir.join("formats.jsonl");
    std::fs::write(&input, jsonl_lines(&data).join("\n")).unwrap();
    for format in ["table", "json", "jsonl"] {
        let out = env.run(&["init", "--partitions", "2", "--format", format]);
        assert_format("init", format, out.as_bytes());
    }
    let out = env.run(&["produce", input.to_str().unwrap(), "--format", "json"]);
    assert_format("produce", "json", out.as_bytes());
    let mut r = env.spawn_replica("r1", &[]);
    env.wait_caught_up(Duration::from_secs(120));
    let mut attached = None;
    for format in ["table", "json", "jsonl"] {
        let out = env.run(&[
            "functions",
            "attach",
            &collection,
            "--function",
            "record_counter",
            "--output",
            &format!("count-{format}"),
            "--format",
            format,
        ]);
        assert_format("functions attach", format, out.as_bytes());
        if format == "json" {
            attached = Some(serde_json::from_str::<Value>(&out).unwrap()["function_id"].as_str().unwrap().to_string());
        }
    }
    let reads: &[&[&str]] = &[
        &["collections", "list"],
        &["offsets", "show"],
        &["functions", "list"],
        &["records", &collection],
        &["checksum"],
        &["produce", input.to_str().unwrap(), "--dry-run"],
    ];
    for format in ["table", "json", "jsonl"] {
        for args in reads {
            let mut all = args.to_vec();
            all.extend(["--format", format]);
            let out = env.cmd().args(&all).output().unwrap();
            assert!(out.status.success(), "{all:?}: {}", String::from_utf8_lossy(&out.stderr));
            assert_format(&format!("{all:?}"), format, &out.stdout);
        }
    }
    // The list commands' JSON is one array with a row per item, jsonl one line per item.
    let json: Value = serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).unwrap();
    let jsonl = env.run(&["collections", "list", "--format", "jsonl"]);
    assert_eq!(json.as_array().unwrap().len(), jsonl.lines().count());
    let records: Value = serde_json::from_str(&env.run(&["records", &collection, "--format", "json"])).unwrap();
    assert_eq!(
        records.as_array().unwrap().len(),
        env.run(&["records", &collection, "--format", "jsonl"]).lines().count()
    );
    assert!(!records.as_array().unwrap().is_empty());
    assert_eq!(r.terminate(Duration::from_secs(30)), Some(0));
    for format in ["table", "json", "jsonl"] {
        let out = env.run(&["offsets", "reconcile", "--format", format]);
        assert_format("offsets reconcile", format, out.as_bytes());
    }
    let out = env.run(&["offsets", "reset", "--partition", "0", "--to", "0", "--format", "json"]);
    assert_format("offsets reset", "json", out.as_bytes());
    let out = env.run(&["functions", "detach", &attached.unwrap(), "--format", "jsonl"]);
    assert_format("functions detach", "jsonl", out.as_bytes());
    // config show has its own formats: toml (a config file) and json.
    let out = env.run(&["config", "show", "--format", "json"]);
    assert_format("config show", "json", out.as_bytes());
}

/// The partition sets a replica's consumer logged for `event` (`assigned` or `revoked`),
/// in order: the lines `... sluice::kafka::consumer: assigned partitions=[0, 2]`.
fn rebalances(log: &str, event: &str) -> Vec<Vec<i32>> {
    log.lines()
        .filter(|l| l.contains(&format!("consumer: {event} partitions=[")))
        .map(|l| {
            let list = l.split_once("partitions=[").unwrap().1.split_once(']').unwrap().0;
            let mut ps: Vec<i32> =
                list.split(',').filter(|p| !p.trim().is_empty()).map(|p| p.trim().parse().unwrap()).collect();
            ps.sort_unstable();
            ps
        })
        .collect()
}

fn wait_until(what: &str, timeout: Duration, mut done: impl FnMut() -> bool, log: impl Fn() -> String) {
    let deadline = std::time::Instant::now() + timeout;
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what} within {timeout:?}:\n{}", log());
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn eager_rebalance_protocol_two_replicas_one_killed() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("eager").with_kafka("rebalance_protocol = \"eager\"");
    env.run(&["init", "--partitions", "4"]);
    let a = workload(800, 3, &env.prefix);
    let b = workload(800, 4, &env.prefix);
    let r1 = env.spawn_replica("r1", &[]);
    let mut r2 = env.spawn_replica("r2", &[]);
    env.produce(&jsonl_lines(&a));
    // Kill r2 only once the two split the partitions: their last assignments are both
    // non-empty and together the four partitions, each once (one generation's split; a
    // replica that joined alone first holds all four for a while).
    let last = |log: &str| rebalances(log, "assigned").last().cloned().unwrap_or_default();
    wait_until(
        "r1 and r2 never split the partitions",
        Duration::from_secs(60),
        || {
            let (p1, p2) = (last(&r1.log_text()), last(&r2.log_text()));
            let mut both: Vec<i32> = p1.iter().chain(&p2).copied().collect();
            both.sort_unstable();
            !p1.is_empty() && !p2.is_empty() && both == vec![0, 1, 2, 3]
        },
        || format!("r1:\n{}\nr2:\n{}", r1.log_text(), r2.log_text()),
    );
    let r2_held = last(&r2.log_text());
    let r1_before = rebalances(&r1.log_text(), "revoked").len();
    r2.kill9();
    env.produce(&jsonl_lines(&b));
    // Eager: once the group notices, r1 revokes everything it held and is assigned all four.
    wait_until(
        "r1 never took over r2's partitions",
        Duration::from_secs(60),
        || {
            let log = r1.log_text();
            rebalances(&log, "revoked")[r1_before..].iter().any(|p| !p.is_empty())
                && rebalances(&log, "assigned").last().is_some_and(|p| *p == vec![0, 1, 2, 3])
        },
        || r1.log_text(),
    );
    assert!(!r2_held.is_empty() && r2_held.len() < 4, "r2 held part of the partitions: {r2_held:?}");
    env.wait_caught_up(Duration::from_secs(120));
    let all: Vec<LogRecord> = a.iter().chain(&b).cloned().collect();
    assert_records_match_model(&env, &all);
}

#[test]
fn produce_reports_progress_on_stderr_while_it_runs() {
    use std::io::Write;
    let env = Env::sqlite("produce-progress");
    let lines = jsonl_lines(&workload(70, 11, &env.prefix));
    // stdin, not a terminal: plain progress lines every few seconds (no broker: a dry run).
    let mut child = env
        .cmd()
        .args(["produce", "-", "--dry-run", "--format", "json"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for l in &lines {
        writeln!(stdin, "{l}").unwrap();
        stdin.flush().unwrap();
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let progress: Vec<&str> = err.lines().filter(|l| l.starts_with("produce: ") && l.contains(" lines")).collect();
    assert!(!progress.is_empty(), "no progress line in 7 s: {err}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["valid"].as_u64(), Some(70), "{report}");
}
