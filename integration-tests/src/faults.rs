//! Helpers of the fault tests (`tests/it/fault_points.rs`, `tests/it/unclean_faults.rs`): log
//! waits, functions and their outputs against the reference model, the group-offset
//! invariant, the three-broker cluster with a guard that stops it, and a test's own
//! single broker that it may stop (`PrivateKafka`).

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;
use sluice::cli::jsonl::record_to_json;
use sluice::functions::model::reference_outputs;
use sluice::record::{LogRecord, Record};
use sluice::workload::{generate, WorkloadSpec};

use crate::{repo_root, Env, Replica};

/// A deterministic workload of `records` over `collections` collections of `ids` ids each.
pub fn workload(records: usize, seed: u64, prefix: &str, collections: usize, ids: usize) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records,
        collections,
        dim: 4,
        ids_per_collection: ids,
        mix: [45, 20, 15, 20],
        seed,
        collection_prefix: format!("{prefix}-c"),
    })
    .collect()
}

/// Wait until `needle` is in the replica's log; panics with the log after `timeout`.
pub fn wait_log(r: &Replica, needle: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while !r.log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "{needle:?} never appeared in {}:\n{}",
            r.log.display(),
            tail(&r.log_text())
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The last 60 lines of a log, for failure messages.
pub fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(60)..].join("\n")
}

/// A replica that must abort at fail point `name`: waits for its exit (not a success) and
/// for the fail point's line in its log.
pub fn expect_abort_at(r: &mut Replica, name: &str, timeout: Duration) {
    let status = r
        .wait_exit(timeout)
        .unwrap_or_else(|| panic!("never reached fail point {name} within {timeout:?}:\n{}", tail(&r.log_text())));
    assert!(!status.success(), "aborted at {name}, exit {status}");
    let log = r.log_text();
    assert!(
        log.contains(&format!("sluice: fail point {name} reached")),
        "the fail point's line is in the log:\n{}",
        tail(&log)
    );
}

/// `sluice functions attach` (JSON answer).
pub fn attach(env: &Env, collection: &str, function: &str, output: &str) -> Value {
    serde_json::from_str(
        env.run(&["functions", "attach", collection, "--function", function, "--output", output, "--format", "json"])
            .trim(),
    )
    .expect("attach JSON")
}

/// One function as `sluice functions list` shows it.
pub fn function(env: &Env, id: &str) -> Value {
    let all: Value =
        serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).expect("functions JSON");
    all.as_array()
        .expect("array")
        .iter()
        .find(|f| f["id"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("function {id} not listed"))
}

/// Wait until the function has `status`; returns it.
pub fn wait_status(env: &Env, id: &str, status: &str, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let f = function(env, id);
        if f["status"] == status {
            return f;
        }
        assert!(Instant::now() < deadline, "function {id} never became {status}: {f}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What `function`'s output collection must hold after the whole `log` of `collection`,
/// as `sluice records` prints it (a counter never written reads as 0 and is absent).
pub fn expected_outputs(log: &[LogRecord], collection: &str, function: &str) -> Vec<Value> {
    let indexed: Vec<(i64, LogRecord)> = log.iter().cloned().enumerate().map(|(i, r)| (i as i64, r)).collect();
    let unwritten_counter = |id: &str, total: Option<&sluice::record::MetaValue>| {
        function == "record_counter" && id == "function_output" && total == Some(&sluice::record::MetaValue::Long(0))
    };
    reference_outputs(&indexed, collection, function)
        .iter()
        .filter(|(id, m)| !unwritten_counter(id, m.metadata.get("total_count")))
        .map(|(id, m)| {
            record_to_json(&Record {
                id: id.clone(),
                embedding: m.embedding.clone(),
                metadata: m.metadata.clone(),
                document: m.document.clone(),
                offset: 0,
            })
        })
        .collect()
}

/// The output collection equals the function over the whole `log` of `collection`.
pub fn assert_outputs(env: &Env, log: &[LogRecord], collection: &str, function: &str, output: &str) {
    let expected = expected_outputs(log, collection, function);
    let out = env.cmd().args(["records", output, "--format", "jsonl"]).output().expect("sluice records");
    let actual: Vec<Value> = if out.status.success() {
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).expect("record JSON")).collect()
    } else {
        Vec::new()
    };
    let actual: Vec<Value> =
        actual.into_iter().filter(|v| !(function == "record_counter" && v["metadata"]["total_count"] == 0)).collect();
    assert!(!expected.is_empty(), "the model has outputs for {function} of {collection}");
    assert_eq!(actual, expected, "{function} output {output}");
}

/// `sluice offsets show` rows.
pub fn offsets(env: &Env) -> Vec<Value> {
    serde_json::from_str::<Value>(&env.run(&["offsets", "show", "--format", "json"]))
        .expect("offsets JSON")
        .as_array()
        .expect("array")
        .clone()
}

/// No partition's group offset is ahead of its sysdb position; returns how many
/// partitions have a group offset at all.
pub fn assert_group_never_ahead(env: &Env) -> usize {
    let rows = offsets(env);
    let mut committed = 0;
    for r in &rows {
        if let (Some(g), Some(s)) = (r["group_offset"].as_i64(), r["sysdb_next_offset"].as_i64()) {
            assert!(g <= s, "group offset ahead of the sysdb: {r}");
            committed += 1;
        }
    }
    committed
}

/// The three-broker local cluster (`deploy/local/kafka.sh --brokers 3`, client ports
/// 29092-29094). Started by `start`; stopped when dropped, also when the test panics.
pub struct Cluster3;

/// Client ports of the three brokers (node-1..node-3).
pub const CLUSTER3_PORTS: [u16; 3] = [29092, 29093, 29094];
/// The cluster's controller port: below the kernel's ephemeral range (32768-60999 here),
/// where an outgoing connection's local port could take it (the default, client + 10000
/// = 39092, is inside it and collided once in CI).
pub const CLUSTER3_CONTROLLER_PORT: u16 = 29095;

impl Cluster3 {
    pub fn start() -> Cluster3 {
        cluster3("start");
        Cluster3
    }

    pub fn bootstrap() -> String {
        CLUSTER3_PORTS.iter().map(|p| format!("127.0.0.1:{p}")).collect::<Vec<_>>().join(",")
    }

    /// Start whatever node is down again (idempotent).
    pub fn restart_missing(&self) {
        cluster3("start");
    }

    /// Pid of broker `id` (node-`id`), if running.
    pub fn pid(id: i32) -> Option<String> {
        let p = repo_root().join(format!(".local/kafka/run/brokers-3/node-{id}/pid"));
        let pid = std::fs::read_to_string(p).ok()?.trim().to_string();
        std::path::Path::new(&format!("/proc/{pid}")).exists().then_some(pid)
    }

    /// SIGKILL broker `id` (no controlled shutdown) and wait until it is gone.
    pub fn kill9(&self, id: i32) {
        let pid = Cluster3::pid(id).unwrap_or_else(|| panic!("broker {id} is not running"));
        Command::new("kill").args(["-KILL", &pid]).status().expect("kill");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{pid}")).exists() {
            assert!(Instant::now() < deadline, "broker {id} did not die");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Cluster3 {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("deploy/local/kafka.sh"))
            .args(["stop", "--brokers", "3"])
            .env("SLUICE_KAFKA_PORT", CLUSTER3_PORTS[0].to_string())
            .env("SLUICE_KAFKA_CONTROLLER_PORT", CLUSTER3_CONTROLLER_PORT.to_string())
            .status();
    }
}

fn cluster3(cmd: &str) {
    let out = Command::new(repo_root().join("deploy/local/kafka.sh"))
        .args([cmd, "--brokers", "3"])
        .env("SLUICE_KAFKA_PORT", CLUSTER3_PORTS[0].to_string())
        .env("SLUICE_KAFKA_CONTROLLER_PORT", CLUSTER3_CONTROLLER_PORT.to_string())
        .output()
        .expect("kafka.sh");
    assert!(out.status.success(), "kafka.sh {cmd} --brokers 3: {}", String::from_utf8_lossy(&out.stderr));
}

/// Client port of a test's own single broker ([`PrivateKafka`]); its controller port is
/// the next one. Below the kernel's ephemeral range, like the three-broker cluster's.
pub const PRIVATE_KAFKA_PORT: u16 = 29392;

/// A single broker of the test's own (`deploy/local/kafka.sh --brokers 1` with a state
/// folder in the test's directory and ports of its own), for tests that stop Kafka: the
/// shared broker on 127.0.0.1:9092 serves other tests and is never stopped. It uses the
/// jars of the shared cache (`kafka.sh fetch`). Stopped when dropped, also when the test
/// panics. One test at a time may run one (a lock file, as the three-broker cluster's).
pub struct PrivateKafka {
    home: std::path::PathBuf,
    lock: std::path::PathBuf,
}

impl PrivateKafka {
    /// Start a broker whose state lives under `dir`; waits until it answers.
    pub fn start(dir: &std::path::Path) -> PrivateKafka {
        let lock = std::env::temp_dir().join("sluice-it-private-kafka.lock");
        let deadline = Instant::now() + Duration::from_secs(900);
        while std::fs::OpenOptions::new().write(true).create_new(true).open(&lock).is_err() {
            assert!(Instant::now() < deadline, "{} held for 15 minutes: remove it if no test runs", lock.display());
            std::thread::sleep(Duration::from_millis(500));
        }
        let fetched =
            Command::new(repo_root().join("deploy/local/kafka.sh")).arg("fetch").output().expect("kafka.sh fetch");
        assert!(fetched.status.success(), "kafka.sh fetch: {}", String::from_utf8_lossy(&fetched.stderr));
        let libs = String::from_utf8_lossy(&fetched.stdout).lines().last().unwrap_or_default().trim().to_string();
        let version = std::path::Path::new(&libs).parent().expect("the jars' version folder").to_path_buf();
        let home = dir.join("kafka-home");
        std::fs::create_dir_all(&home).expect("kafka home");
        let link = home.join(version.file_name().expect("version"));
        if !link.exists() {
            std::os::unix::fs::symlink(&version, &link).expect("link the jars");
        }
        let k = PrivateKafka { home, lock };
        k.run("start");
        k
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{PRIVATE_KAFKA_PORT}")
    }

    /// `kafka.sh stop` (SIGTERM, a controlled shutdown; SIGKILL after its timeout).
    pub fn stop(&self) {
        self.run("stop");
    }

    /// `kafka.sh start` again (the same data): waits until it answers.
    pub fn restart(&self) {
        self.run("start");
    }

    fn command(&self, cmd: &str) -> Command {
        let mut c = Command::new(repo_root().join("deploy/local/kafka.sh"));
        c.args([cmd, "--brokers", "1"])
            .env("SLUICE_KAFKA_HOME", &self.home)
            .env("SLUICE_KAFKA_PORT", PRIVATE_KAFKA_PORT.to_string())
            .env("SLUICE_KAFKA_CONTROLLER_PORT", (PRIVATE_KAFKA_PORT + 1).to_string())
            .env("SLUICE_KAFKA_HEAP", "512m");
        c
    }

    fn run(&self, cmd: &str) {
        let out = self.command(cmd).output().expect("kafka.sh");
        assert!(
            out.status.success(),
            "kafka.sh {cmd} (private broker): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for PrivateKafka {
    fn drop(&mut self) {
        let _ = self.command("stop").output();
        let _ = std::fs::remove_file(&self.lock);
    }
}
