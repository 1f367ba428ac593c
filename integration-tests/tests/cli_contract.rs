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

#[test]
fn produce_names_the_invalid_lines_and_delivers_the_rest() {
    if !require_kafka() {
        return;
    }
    let env = Env::sqlite("produce-bad");
    env.run(&["init", "--partitions", "2"]);
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
    std::fs::write(&path, input.join("\n")).unwrap();
    let out = env.cmd().args(["produce", path.to_str().unwrap()]).output().unwrap();
    assert!(!out.status.success(), "invalid lines make produce fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("line numbers: 2,4,5"), "{err}");
    assert!(err.contains("delivered 3 records"), "{err}");
    let total: i64 = offsets(&env).iter().map(|o| o["high_watermark"].as_i64().unwrap()).sum();
    assert_eq!(total, 3, "the valid lines were delivered");
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

    // Reset partition 1 to 5: the sysdb moves, the audit row says who, from, to, why.
    let before = offsets(&env)[1]["sysdb_next_offset"].as_i64().unwrap();
    let out = env.run(&["offsets", "reset", "--partition", "1", "--to", "5", "--reason", "replay test", "--execute"]);
    assert!(out.contains(&format!("{before} -> 5")), "{out}");
    assert_eq!(offsets(&env)[1]["sysdb_next_offset"].as_i64(), Some(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let resets = rt.block_on(async {
        sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().resets(&env.log_topic()).await.unwrap()
    });
    assert_eq!(resets.len(), 1);
    assert_eq!(
        (resets[0].partition, resets[0].from_offset, resets[0].to_offset, resets[0].reason.as_str()),
        (1, Some(before), 5, "replay test")
    );

    // A negative offset reaches the product's own check (`--to=-3`: clap would take a
    // separate `-3` for a flag and reject it itself, exit 2) and changes nothing.
    let out =
        env.cmd().args(["offsets", "reset", "--partition", "1", "--to=-3", "--reason", "negative"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "refused by the reset command, not the argument parser: {err}");
    assert!(err.contains("--to must be >= 0"), "{err}");
    assert_eq!(offsets(&env)[1]["sysdb_next_offset"].as_i64(), Some(5), "the refused reset left the position alone");
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
    let out = env
        .cmd()
        .args(["--config", cfg.to_str().unwrap(), "config", "show"])
        .env("SLUICE_SYSDB", "postgres://u:pw123@127.0.0.1:1/db")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("hunter2") && !text.contains("pw123"), "{text}");
    assert!(text.contains("bob") && text.contains("***"), "{text}");
    std::fs::write(&cfg, "[processor]\nbatch_max_record = 5\n").unwrap();
    let out = env.cmd().args(["--config", cfg.to_str().unwrap(), "config", "show"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("batch_max_record"));
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
    // Kill r2 only once it holds partitions (a non-empty assignment), and r1 the rest.
    let non_empty = |log: &str| rebalances(log, "assigned").last().is_some_and(|p| !p.is_empty());
    wait_until("r2 never held partitions", Duration::from_secs(60), || non_empty(&r2.log_text()), || r2.log_text());
    wait_until("r1 never held partitions", Duration::from_secs(60), || non_empty(&r1.log_text()), || r1.log_text());
    let r2_held = rebalances(&r2.log_text(), "assigned").last().unwrap().clone();
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
