//! The operator's tools on positions, against the real broker and the real binary, on
//! SQLite and PostgreSQL:
//!
//! * `offsets wait` exits 0 once no partition lags, and 1 at its timeout naming the
//!   partitions that do.
//! * `offsets reset` refuses while the group has an active member (naming it) unless
//!   forced (a forced reset moves the sysdb position and says whether the group offset
//!   was committed); a dry run (the default) changes neither the sysdb nor the group offset; a
//!   missing partition or topic and a target outside the log are refused, naming them;
//!   `--to-datetime` picks the first offset produced at or after the time; `--execute`
//!   moves the sysdb position and the group offset together and audits it.
//! * `offsets history` lists the reset (who, why, from, to) and a recorded gap.
//! * The admin API gives the same plan and refusal (`POST /api/v1/offsets/reset`) and the
//!   same history (`GET /api/v1/offsets/history`).
//! * After the reset the replica reprocesses from the new positions and the records equal
//!   the reference model.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;
use sluice::record::LogRecord;
use sluice_integration_tests::http;
use sluice_integration_tests::{both_backends, consume_all, jsonl_lines, small_workload, Env};

const PARTITIONS: i32 = 2;

/// Wait until the replica's HTTP server answers.
fn wait_http(port: u16) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sluice_integration_tests::http_get(port, "/healthz").is_none() {
        assert!(std::time::Instant::now() < deadline, "the replica's HTTP server never answered");
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn sluice(env: &Env, args: &[&str]) -> Out {
    let o = env.cmd().args(args).output().expect("spawn sluice");
    Out {
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Per partition: (sysdb next offset, group offset, high watermark).
fn positions(env: &Env) -> BTreeMap<i64, (Option<i64>, Option<i64>, i64)> {
    env.offsets()
        .iter()
        .map(|r| {
            (
                r["partition"].as_i64().unwrap(),
                (r["sysdb_next_offset"].as_i64(), r["group_offset"].as_i64(), r["high_watermark"].as_i64().unwrap()),
            )
        })
        .collect()
}

fn history(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "history", "--format", "json"]))
        .unwrap()
        .as_array()
        .unwrap()
        .clone()
}

fn now_rfc3339() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
    sluice::offsets::format_rfc3339_ms(ms)
}

/// Record a data-loss gap in the sysdb (as the processor does under `on_data_loss = "skip"`).
fn record_gap(env: &Env, partition: i32, from: i64, to: i64) {
    // A thread of its own: the PostgreSQL variant runs inside a runtime already.
    std::thread::scope(|s| {
        s.spawn(|| {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async {
                let db = sluice::sysdb::Sysdb::open(&env.sysdb).await.expect("open sysdb");
                db.record_gap(&env.log_topic(), partition, from, to).await.expect("record gap");
            })
        })
        .join()
        .unwrap()
    });
}

/// The records equal the reference model of the log as it was processed: every record
/// once in offset order, then (after the reset) the records from `from[p]` on again. The
/// model takes strictly increasing offsets per collection, so the second pass is fed at
/// its offsets plus a constant; records are compared without their offsets.
fn assert_reprocessed_state(env: &Env, from: &BTreeMap<i64, i64>) {
    const SECOND_PASS: i64 = 1 << 40;
    let mut msgs = consume_all(&env.log_topic(), PARTITIONS, Duration::from_secs(60));
    msgs.sort_by_key(|m| (m.partition, m.offset));
    let decoded: Vec<(i32, i64, LogRecord)> = msgs
        .iter()
        .map(|m| (m.partition, m.offset, sluice::record::codec::decode(&m.payload).expect("a valid record")))
        .collect();
    let mut log: Vec<(i64, LogRecord)> = decoded.iter().map(|(_, o, r)| (*o, r.clone())).collect();
    let again: Vec<(i64, LogRecord)> = decoded
        .iter()
        .filter(|(p, o, _)| *o >= from[&i64::from(*p)])
        .map(|(_, o, r)| (o + SECOND_PASS, r.clone()))
        .collect();
    assert!(!again.is_empty(), "the reset reprocesses something");
    log.extend(again);
    let model = sluice::materialize::model::reference(&log);
    for (cid, cm) in &model.collections {
        let expected: Vec<Value> = cm.records.values().map(sluice::cli::jsonl::record_to_json).collect();
        let actual: Vec<Value> =
            env.run(&["records", cid, "--format", "jsonl"]).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(actual, expected, "records of {cid} after reprocessing");
    }
}

fn operator_offsets(env: Env) {
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    // Two loads a few seconds apart; T lies between them.
    // Collections on both partitions (their names decide where they go).
    let prefix = (0..)
        .map(|k| format!("{}-{k}", env.prefix))
        .find(|p| {
            let homes: std::collections::BTreeSet<u32> = small_workload(150, 11, p, 4)
                .iter()
                .map(|r| sluice::record::partitioner::partition_for(r.collection_id.as_bytes(), PARTITIONS as u32))
                .collect();
            homes.len() == PARTITIONS as usize
        })
        .unwrap();
    let first: Vec<LogRecord> = small_workload(150, 11, &prefix, 4);
    env.produce(&jsonl_lines(&first));
    std::thread::sleep(Duration::from_millis(1500));
    let t = now_rfc3339();
    std::thread::sleep(Duration::from_millis(1500));
    let highs_first: BTreeMap<i64, i64> = positions(&env).into_iter().map(|(p, (_, _, h))| (p, h)).collect();
    let second: Vec<LogRecord> = small_workload(150, 12, &prefix, 4);
    env.produce(&jsonl_lines(&second));
    let highs: BTreeMap<i64, i64> = positions(&env).into_iter().map(|(p, (_, _, h))| (p, h)).collect();
    assert!(
        highs.iter().all(|(p, h)| *h > highs_first[p]),
        "both loads reach every partition: {highs_first:?} {highs:?}"
    );

    // Nothing processed yet: `offsets wait` times out naming the lagging partitions.
    let w = sluice(&env, &["offsets", "wait", "--timeout", "2s"]);
    assert_eq!(w.code, Some(1), "wait with lag: {} {}", w.stdout, w.stderr);
    assert!(w.stdout.contains("partition 0: lag") && w.stdout.contains("partition 1: lag"), "{}", w.stdout);
    assert!(w.stderr.contains("still lag"), "{}", w.stderr);

    let port = sluice_integration_tests::free_port();
    let mut r1 = env.spawn_replica("r1", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    let w = sluice(&env, &["offsets", "wait", "--timeout", "120s"]);
    assert_eq!(w.code, Some(0), "wait until caught up: {} {}\n{}", w.stdout, w.stderr, r1.log_text());
    assert!(positions(&env).values().all(|(s, _, h)| *s == Some(*h)), "caught up when wait returned");

    // An active member blocks an executed reset (naming it) unless forced.
    let plan: Value =
        serde_json::from_str(&env.run(&["offsets", "reset", "--all-partitions", "--to-earliest", "--format", "json"]))
            .unwrap();
    let members = plan["active_members"].as_array().unwrap().clone();
    assert_eq!(members.len(), 1, "the replica is a member: {plan:#}");
    let member_id = members[0]["id"].as_str().unwrap().to_string();
    let before = positions(&env);
    let o = sluice(&env, &["offsets", "reset", "--all-partitions", "--to-earliest", "--execute", "--reason", "x"]);
    assert_eq!(o.code, Some(1), "refused while a member is active: {}", o.stdout);
    assert!(o.stderr.contains("active member") && o.stderr.contains(&member_id), "{}", o.stderr);
    assert!(o.stderr.contains("--force"), "{}", o.stderr);
    assert_eq!(positions(&env), before, "the refused reset changed positions");
    // The admin API: the same plan, the same refusal.
    wait_http(port);
    let (status, api_plan) =
        http(port, "POST", "/api/v1/offsets/reset", Some(r#"{"all_partitions":true,"to_earliest":true}"#));
    assert_eq!(status, 200, "{api_plan}");
    assert_eq!((api_plan["executed"].clone(), api_plan["rows"].clone()), (Value::Bool(false), plan["rows"].clone()));
    assert_eq!(api_plan["active_members"][0]["id"], member_id.as_str());
    let (status, refused) = http(
        port,
        "POST",
        "/api/v1/offsets/reset",
        Some(r#"{"all_partitions":true,"to_earliest":true,"execute":true,"reason":"x"}"#),
    );
    assert_eq!((status, refused["error"].as_str()), (400, Some("bad_request")), "{refused}");
    assert!(refused["message"].as_str().unwrap().contains(&member_id), "{refused}");
    assert_eq!(positions(&env), before, "the refused reset changed positions");
    assert_eq!(r1.terminate(Duration::from_secs(30)), Some(0), "graceful stop");
    env.run(&["offsets", "reconcile"]);
    let before = positions(&env);
    assert!(before.values().all(|(s, g, h)| *s == Some(*h) && g == s), "{before:?}");

    // A dry run (the default) prints the plan and changes nothing.
    let plan: Value = serde_json::from_str(&env.run(&[
        "offsets",
        "reset",
        "--all-partitions",
        "--to-datetime",
        &t,
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(plan["executed"], false);
    let targets: BTreeMap<i64, i64> = plan["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["partition"].as_i64().unwrap(), r["target"].as_i64().unwrap()))
        .collect();
    assert_eq!(targets, highs_first, "--to-datetime: the first offset of the second load");
    let table = env.run(&["offsets", "reset", "--partition", "1", "--to-datetime", &t]);
    assert!(table.contains("dry run") && table.contains("nothing changed"), "{table}");
    assert_eq!(positions(&env), before, "a dry run changed the sysdb or the group offset");
    assert!(history(&env).is_empty(), "a dry run was audited");

    // Refusals name what is wrong and change nothing.
    let o = sluice(&env, &["offsets", "reset", "--partition", "99", "--to", "1000000", "--execute", "--reason", "x"]);
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains("partition 99 does not exist") && o.stderr.contains(&env.log_topic()), "{}", o.stderr);
    let missing = Env { prefix: format!("{}-missing", env.prefix), ..env.clone() };
    let o = sluice(&missing, &["offsets", "reset", "--partition", "0", "--to", "0", "--execute", "--reason", "x"]);
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains(&format!("topic {} does not exist", missing.log_topic())), "{}", o.stderr);
    let o = sluice(&env, &["offsets", "reset", "--partition", "0", "--to", "1000000", "--execute", "--reason", "x"]);
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains("outside [log start 0, high watermark") && o.stderr.contains("--clamp"), "{}", o.stderr);
    let o = sluice(&env, &["offsets", "reset", "--partition", "0", "--to-earliest", "--execute"]);
    assert_eq!(o.code, Some(1));
    assert!(o.stderr.contains("--reason"), "{}", o.stderr);
    let clamped: Value = serde_json::from_str(&env.run(&[
        "offsets",
        "reset",
        "--partition",
        "0",
        "--to",
        "1000000",
        "--clamp",
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(clamped["rows"][0]["target"].as_i64(), Some(highs[&0]), "clamped to the high watermark");
    assert_eq!(clamped["rows"][0]["clamped"], true);
    assert_eq!(positions(&env), before, "a refusal changed positions");
    assert!(history(&env).is_empty(), "a refusal was audited");

    // Executed: the sysdb position and the group offset move together, audited.
    let done: Value = serde_json::from_str(&env.run(&[
        "offsets",
        "reset",
        "--all-partitions",
        "--to-datetime",
        &t,
        "--execute",
        "--reason",
        "reprocess the second load",
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(done["executed"], true);
    assert_eq!(done["group_committed"], true, "{done:#}");
    let after = positions(&env);
    for (p, (s, g, _)) in &after {
        assert_eq!((*s, *g), (Some(highs_first[p]), Some(highs_first[p])), "partition {p}: sysdb and group moved");
    }
    let h = history(&env);
    assert_eq!(h.len(), PARTITIONS as usize, "{h:#?}");
    for e in &h {
        let p = e["partition"].as_i64().unwrap();
        assert_eq!(e["kind"], "reset");
        assert_eq!(e["reason"], "reprocess the second load");
        assert_eq!(e["from_offset"].as_i64(), Some(highs[&p]));
        assert_eq!(e["to_offset"].as_i64(), Some(highs_first[&p]));
        assert!(e["actor"].as_str().is_some_and(|a| !a.is_empty()));
    }

    // A replica reprocesses from there; the records equal the reference model.
    let port = sluice_integration_tests::free_port();
    let mut r2 = env.spawn_replica("r2", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    let w = sluice(&env, &["offsets", "wait", "--timeout", "120s"]);
    assert_eq!(w.code, Some(0), "{} {}\n{}", w.stdout, w.stderr, r2.log_text());
    wait_http(port);
    let (status, api_history) = http(port, "GET", "/api/v1/offsets/history", None);
    assert_eq!(status, 200, "{api_history}");
    assert_eq!(api_history["entries"].as_array().unwrap(), &history(&env), "the API's history is the CLI's");
    assert_reprocessed_state(&env, &highs_first);

    // `--force` resets while a member is active: the sysdb moves (audited); the group
    // offset cannot follow, and the report says so.
    let forced: Value = serde_json::from_str(&env.run(&[
        "offsets",
        "reset",
        "--partition",
        "1",
        "--to-earliest",
        "--execute",
        "--force",
        "--reason",
        "forced while running",
        "--format",
        "json",
    ]))
    .unwrap();
    assert_eq!(
        (forced["executed"].as_bool(), forced["active_members"].as_array().map(Vec::len)),
        (Some(true), Some(1))
    );
    // The broker refuses a commit from outside a group that has members.
    assert_eq!(forced["group_committed"], false, "{forced:#}");
    assert!(forced["group_error"].as_str().is_some_and(|e| e.contains("commit group offsets")), "{forced:#}");
    assert_eq!(positions(&env)[&1].0, Some(0), "the forced reset moved the sysdb position");
    assert_eq!(r2.terminate(Duration::from_secs(30)), Some(0));

    // A recorded data-loss gap shows in the history after the resets.
    let high0 = highs[&0];
    record_gap(&env, 0, high0, high0 + 5);
    let h = history(&env);
    assert_eq!(h.len(), PARTITIONS as usize + 2, "{h:#?}");
    let f = &h[PARTITIONS as usize];
    assert_eq!(
        (f["kind"].as_str(), f["partition"].as_i64(), f["reason"].as_str()),
        (Some("reset"), Some(1), Some("forced while running"))
    );
    assert_eq!((f["from_offset"].as_i64(), f["to_offset"].as_i64()), (Some(highs[&1]), Some(0)));
    let gap = h.last().unwrap();
    assert_eq!((gap["kind"].as_str(), gap["partition"].as_i64()), (Some("gap"), Some(0)), "{gap}");
    assert_eq!((gap["from_offset"].as_i64(), gap["to_offset"].as_i64()), (Some(high0), Some(high0 + 5)));
    let table = env.run(&["offsets", "history"]);
    assert!(table.contains("reprocess the second load") && table.contains(" gap "), "{table}");
}

both_backends!(operator_offsets_end_to_end, operator_offsets);
