//! The command-line contract other tools depend on, against the real broker and sysdb.

use std::time::Duration;

use serde_json::Value;
use sluice::materialize::model::reference;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{jsonl_lines, brokers, repo_root, require_kafka, Env};

fn workload(n: usize, seed: u64, prefix: &str) -> Vec<LogRecord> {
    generate(&WorkloadSpec { records: n, collections: 5, dim: 3, ids_per_collection: 25, seed, collection_prefix: format!("{prefix}-c"), ..Default::default() })
        .collect()
}


fn offsets(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "show", "--format", "json"])).unwrap().as_array().unwrap().clone()
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
        .args(["consumer-groups", "--bootstrap-server", &brokers(), "--group", &env.group, "--reset-offsets", "--to-earliest", "--topic", &env.log_topic(), "--execute"])
        .output()
        .unwrap();
    assert!(st.status.success());
    assert!(offsets(&env).iter().all(|o| o["group_offset"].as_i64() == Some(0)));
    env.run(&["offsets", "reconcile"]);
    assert!(offsets(&env).iter().all(|o| o["group_offset"] == o["sysdb_next_offset"]), "{:?}", offsets(&env));

    // Reset partition 1 to 5: the sysdb moves, the audit row says who, from, to, why.
    let before = offsets(&env)[1]["sysdb_next_offset"].as_i64().unwrap();
    let out = env.run(&["offsets", "reset", "--partition", "1", "--to", "5", "--reason", "replay test"]);
    assert!(out.contains(&format!("{before} -> 5")), "{out}");
    assert_eq!(offsets(&env)[1]["sysdb_next_offset"].as_i64(), Some(5));
    let rt = tokio::runtime::Runtime::new().unwrap();
    let resets = rt.block_on(async { sluice::sysdb::Sysdb::open(&env.sysdb).await.unwrap().resets(&env.log_topic()).await.unwrap() });
    assert_eq!(resets.len(), 1);
    assert_eq!((resets[0].partition, resets[0].from_offset, resets[0].to_offset, resets[0].reason.as_str()), (1, Some(before), 5, "replay test"));
    assert!(env.cmd().args(["offsets", "reset", "--partition", "1", "--to", "-3"]).output().unwrap().status.code() != Some(0));
}

#[test]
fn config_show_redacts_secrets_and_unknown_keys_are_rejected() {
    let env = Env::sqlite("config");
    let cfg = env.dir.join("secret.toml");
    std::fs::write(&cfg, "[librdkafka]\n\"sasl.password\" = \"hunter2\"\n\"sasl.username\" = \"bob\"\n").unwrap();
    let out = env.cmd().args(["--config", cfg.to_str().unwrap(), "config", "show"]).env("SLUICE_SYSDB", "postgres://u:pw123@127.0.0.1:1/db").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!text.contains("hunter2") && !text.contains("pw123"), "{text}");
    assert!(text.contains("bob") && text.contains("***"), "{text}");
    std::fs::write(&cfg, "[processor]\nbatch_max_record = 5\n").unwrap();
    let out = env.cmd().args(["--config", cfg.to_str().unwrap(), "config", "show"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("batch_max_record"));
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
    let _r1 = env.spawn_replica("r1", &[]);
    let mut r2 = env.spawn_replica("r2", &[]);
    env.produce(&jsonl_lines(&a));
    // Kill r2 only once it has taken part in the group (it got partitions).
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !r2.log_text().contains("assigned") {
        assert!(std::time::Instant::now() < deadline, "r2 never joined the group:\n{}", r2.log_text());
        std::thread::sleep(Duration::from_millis(100));
    }
    r2.kill9();
    env.produce(&jsonl_lines(&b));
    env.wait_caught_up(Duration::from_secs(120));
    let all: Vec<(i64, LogRecord)> = a.iter().chain(&b).cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let model = reference(&all);
    for (cid, cm) in &model.collections {
        let got = env.run(&["records", cid]).lines().count();
        assert_eq!(got, cm.records.len(), "records of {cid}");
    }
    assert!(r2.log_text().contains("assigned"), "r2 took part in the group before it was killed");
}
