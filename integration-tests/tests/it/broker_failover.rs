//! Broker failover on the three-broker local cluster (replication factor 3,
//! `min.insync.replicas=2`, idempotent producers with `acks=all`): under continuous load,
//! stop the leader of the busiest partition and later the group coordinator, restart
//! each; nothing is lost or duplicated (reference model), processing resumes by itself,
//! and the longest time without progress is reported.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::ClientConfig;
use serde_json::Value;
use sluice::cli::jsonl::log_record_to_json;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{assert_records_match_model, repo_root, Env};

const PORTS: [u16; 3] = [29092, 29093, 29094];
const WAIT: Duration = Duration::from_secs(240);

fn bootstrap() -> String {
    PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
}

fn cluster(cmd: &str) {
    let out = Command::new(repo_root().join("deploy/local/kafka.sh"))
        .args([cmd, "--brokers", "3"])
        .env("SLUICE_KAFKA_PORT", PORTS[0].to_string())
        .env("SLUICE_KAFKA_CONTROLLER_PORT", sluice_integration_tests::faults::CLUSTER3_CONTROLLER_PORT.to_string())
        .output()
        .unwrap();
    assert!(out.status.success(), "kafka.sh {cmd} --brokers 3: {}", String::from_utf8_lossy(&out.stderr));
}

/// The three-broker cluster of this test, and what the test made on it: the topics are
/// deleted and the cluster stopped when dropped, also when the test fails; the test's
/// temporary directory is removed after a pass (kept, and named, after a failure).
/// Holds a lock file so that two runs on one machine take turns on the fixed ports.
struct ClusterGuard {
    lock: std::path::PathBuf,
    topics: Vec<String>,
    dir: Option<std::path::PathBuf>,
}

impl ClusterGuard {
    fn start() -> ClusterGuard {
        let lock = std::env::temp_dir().join("sluice-it-brokers-3.lock");
        let deadline = Instant::now() + Duration::from_secs(900);
        loop {
            match std::fs::OpenOptions::new().write(true).create_new(true).open(&lock) {
                Ok(mut f) => {
                    use std::io::Write as _;
                    write!(f, "{}", std::process::id()).unwrap();
                    break;
                }
                Err(_) => {
                    // A lock whose process is gone is stale.
                    let holder = std::fs::read_to_string(&lock).unwrap_or_default();
                    let pid = holder.trim();
                    if !pid.is_empty() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                        let _ = std::fs::remove_file(&lock);
                        continue;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "{} is held by process {pid:?} (another failover run)",
                        lock.display()
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
            }
        }
        let guard = ClusterGuard { lock, topics: Vec::new(), dir: None };
        cluster("start");
        guard
    }
}

impl Drop for ClusterGuard {
    fn drop(&mut self) {
        if !self.topics.is_empty() {
            let topics = std::mem::take(&mut self.topics);
            let _ = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
                let refs: Vec<&str> = topics.iter().map(String::as_str).collect();
                let settings = sluice::kafka::ClientSettings::new(bootstrap());
                rt.block_on(sluice::kafka::cluster::delete_topics(&settings, &refs)).ok()
            })
            .join();
        }
        let stopped = Command::new(repo_root().join("deploy/local/kafka.sh"))
            .args(["stop", "--brokers", "3"])
            .env("SLUICE_KAFKA_PORT", PORTS[0].to_string())
            .env("SLUICE_KAFKA_CONTROLLER_PORT", sluice_integration_tests::faults::CLUSTER3_CONTROLLER_PORT.to_string())
            .env("SLUICE_KAFKA_CONTROLLER_PORT", sluice_integration_tests::faults::CLUSTER3_CONTROLLER_PORT.to_string())
            .status();
        if !stopped.as_ref().is_ok_and(|s| s.success()) {
            eprintln!("kafka.sh stop --brokers 3 failed: {stopped:?}");
        }
        if let Some(dir) = &self.dir {
            if std::thread::panicking() {
                eprintln!("failover test files kept in {}", dir.display());
            } else {
                let _ = std::fs::remove_dir_all(dir);
            }
        }
        let _ = std::fs::remove_file(&self.lock);
    }
}

fn node_pid(id: i32) -> Option<String> {
    let p = repo_root().join(format!(".local/kafka/run/brokers-3/node-{id}/pid"));
    std::fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// Stop broker `id` cleanly (SIGTERM) and wait until it is gone.
fn stop_broker(id: i32) {
    let pid = node_pid(id).expect("pid of the broker");
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while std::path::Path::new(&format!("/proc/{pid}")).exists() {
        assert!(Instant::now() < deadline, "broker {id} did not stop");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn leader_of_busiest_partition(topic: &str) -> (i32, i32) {
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", bootstrap()).create().unwrap();
    let md = c.fetch_metadata(Some(topic), Duration::from_secs(10)).unwrap();
    let t = &md.topics()[0];
    t.partitions()
        .iter()
        .map(|p| {
            let (_, high) = c.fetch_watermarks(topic, p.id(), Duration::from_secs(10)).unwrap();
            (high, p.id(), p.leader())
        })
        .max()
        .map(|(_, p, leader)| (p, leader))
        .unwrap()
}

fn coordinator(group: &str) -> i32 {
    let out = Command::new(repo_root().join("deploy/local/kafka-tool.sh"))
        .args(["consumer-groups", "--bootstrap-server", &bootstrap(), "--describe", "--group", group, "--state"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // "GROUP  COORDINATOR (ID)  ASSIGNMENT-STRATEGY  STATE  #MEMBERS" then one row with
    // the coordinator as host:port  (id).
    let row = text
        .lines()
        .find(|l| l.contains(group) && l.contains('('))
        .unwrap_or_else(|| panic!("no coordinator row in {text}"));
    let id = row.split('(').nth(1).and_then(|s| s.split(')').next()).unwrap();
    id.trim().parse().unwrap()
}

fn total_sysdb(env: &Env) -> Option<i64> {
    let out = env.cmd().args(["offsets", "show", "--format", "json"]).output().ok()?;
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v.as_array()?.iter().map(|r| r["sysdb_next_offset"].as_i64().unwrap_or(0)).sum())
}

#[test]
fn leader_and_coordinator_failover_loses_nothing() {
    if std::env::var("SLUICE_SKIP_INTEGRATION").as_deref() == Ok("1") && std::env::var("CI").is_err() {
        eprintln!("SKIPPING: SLUICE_SKIP_INTEGRATION=1");
        return;
    }
    let mut guard = ClusterGuard::start();
    let mut env = Env::sqlite("failover");
    guard.dir = Some(env.dir.clone());
    env.extra.push(("SLUICE_BROKERS".into(), bootstrap()));
    guard.topics = vec![env.log_topic(), env.dlq_topic(), format!("{}.backfill", env.prefix)];
    env.run(&["init", "--partitions", "3", "--replication-factor", "3"]);
    let topic = env.log_topic();

    let chunks: Vec<Vec<LogRecord>> = (0..40)
        .map(|i| {
            generate(&WorkloadSpec {
                records: 250,
                collections: 6,
                dim: 4,
                ids_per_collection: 200,
                seed: 500 + i,
                collection_prefix: format!("{}-c", env.prefix),
                ..Default::default()
            })
            .collect()
        })
        .collect();
    let all: Vec<LogRecord> = chunks.iter().flatten().cloned().collect();
    let _r1 = env.spawn_replica("r1", &[]);
    let _r2 = env.spawn_replica("r2", &[]);

    // Progress monitor: the longest time the sysdb positions did not move while records
    // were waiting.
    let done = Arc::new(AtomicBool::new(false));
    let stall = Arc::new(Mutex::new(Duration::ZERO));
    let monitor = {
        let (env, done, stall) = (env.clone(), done.clone(), stall.clone());
        std::thread::spawn(move || {
            let mut last = (total_sysdb(&env).unwrap_or(0), Instant::now());
            while !done.load(Ordering::Relaxed) {
                if let Some(t) = total_sysdb(&env) {
                    if t > last.0 {
                        let mut s = stall.lock().unwrap();
                        *s = (*s).max(last.1.elapsed());
                        last = (t, Instant::now());
                    }
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let producer = {
        let env = env.clone();
        std::thread::spawn(move || {
            for c in &chunks {
                env.produce(&c.iter().map(|r| log_record_to_json(r).to_string()).collect::<Vec<_>>());
                std::thread::sleep(Duration::from_millis(250));
            }
        })
    };

    std::thread::sleep(Duration::from_secs(4));
    let (p, leader) = leader_of_busiest_partition(&topic);
    eprintln!("stopping broker {leader}, leader of the busiest partition {p}");
    stop_broker(leader);
    std::thread::sleep(Duration::from_secs(6));
    cluster("start");
    std::thread::sleep(Duration::from_secs(3));
    let coord = coordinator(&env.group);
    eprintln!("stopping broker {coord}, the group coordinator");
    stop_broker(coord);
    std::thread::sleep(Duration::from_secs(6));
    cluster("start");

    producer.join().unwrap();
    env.wait_caught_up(WAIT);
    done.store(true, Ordering::Relaxed);
    monitor.join().unwrap();
    let stall = *stall.lock().unwrap();
    eprintln!("longest time without progress: {:.1} s", stall.as_secs_f64());

    let total: i64 = total_sysdb(&env).unwrap();
    assert_eq!(total, all.len() as i64, "every produced record is in the log exactly once (idempotent producer)");
    assert_records_match_model(&env, &all);
    assert!(stall < Duration::from_secs(60), "processing resumed by itself (longest stall {stall:?})");
    drop(guard);
}
