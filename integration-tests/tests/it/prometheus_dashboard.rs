//! The Grafana dashboard and the alert rules in `deploy/` against a real Prometheus
//! (`deploy/local/prometheus.sh`) scraping two real `sluice process` replicas under load
//! (docs/metrics.md: "every panel's query is checked against a real Prometheus
//! scraping a real replica").
//!
//! The run creates every condition a panel shows: live load (throughput, latencies,
//! ignored records), poison records (DLQ series), a retention gap on one partition (gaps,
//! a halted partition: SluicePartitionHalted and SluiceDataLossGap become active), an
//! attached function (backfill tasks, records backfilled, backfill duration), and at the
//! end one replica killed (SluiceReplicaDown's expression returns it). Every dashboard
//! expression must then return at least one sample with a finite value for these two
//! replicas; every alert expression must be accepted by the query API.
//!
//! `deploy/validate.sh` (promtool, compose/Kubernetes schemas, hadolint, cross-file
//! consistency) runs as its own test here too.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use serde_json::Value;
use sluice::cli::jsonl::log_record_to_json;
use sluice::record::codec::encode;
use sluice::record::partitioner::partition_for;
use sluice::record::LogRecord;
use sluice::workload::{generate, WorkloadSpec};
use sluice_integration_tests::{brokers, free_port, in_ci, repo_root, require_kafka, sluice_bin, suffix, Env};

const PARTITIONS: i32 = 4;
const WAIT: Duration = Duration::from_secs(60);
/// The local Prometheus scrapes (and evaluates rules) every 2 s (prometheus.local.yml).
const SCRAPE: Duration = Duration::from_secs(2);
const RULES: &str = "deploy/prometheus/rules/sluice.rules.yml";
const RULE_TESTS: &str = "deploy/prometheus/tests/sluice.rules.test.yml";
const DASHBOARD: &str = "deploy/grafana/dashboards/sluice.json";

/// Dashboard expressions allowed to return no finite sample in this run, with the reason.
/// Empty: the run creates every condition a panel shows.
const NO_DATA_ALLOWED: &[(&str, &str)] = &[];

// ---------------------------------------------------------------------------- helpers

/// Same policy as the shared `require_*` helpers: fail with the fix, or (outside CI, with
/// SLUICE_SKIP_INTEGRATION=1) skip.
fn may_skip(what: &str, fix: &str, why: &str) -> bool {
    if !in_ci() && std::env::var("SLUICE_SKIP_INTEGRATION").as_deref() == Ok("1") {
        eprintln!("SKIPPING: {what} is unavailable ({why}) and SLUICE_SKIP_INTEGRATION=1");
        return true;
    }
    panic!(
        "{what} is unavailable ({why}). Start it with `{fix}` (or set SLUICE_SKIP_INTEGRATION=1 outside CI to skip)"
    );
}

fn script(name: &str) -> PathBuf {
    repo_root().join("deploy/local").join(name)
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The local Prometheus, started (idempotently) by `deploy/local/prometheus.sh start` and
/// reloaded so that it evaluates the rules as they are in this tree.
struct Prometheus {
    port: u16,
    /// `SLUICE_PROM_PORT` for the script, when the default port could not be used.
    port_env: Option<String>,
}

impl Prometheus {
    fn script(&self, args: &[&str]) -> String {
        let mut c = Command::new(script("prometheus.sh"));
        c.args(args);
        if let Some(p) = &self.port_env {
            c.env("SLUICE_PROM_PORT", p);
        }
        run_ok(&mut c)
    }
}

fn require_prometheus() -> Option<Prometheus> {
    let fix = "deploy/local/prometheus.sh start";
    let start = |port: Option<&str>| {
        let mut c = Command::new(script("prometheus.sh"));
        c.arg("start");
        if let Some(p) = port {
            c.env("SLUICE_PROM_PORT", p);
        }
        c.output()
    };
    // An instance already running (possibly on another port than the default: see below)
    // is used as it is; the script recognises it by its data directory, not its port.
    let mut port_env = std::env::var_os("SLUICE_PROM_PORT").is_none().then(running_port).flatten();
    let mut out = start(port_env.as_deref());
    // The default port (19090) used to lie in the ephemeral range (59090): a Kafka client's
    // connection in TIME_WAIT on it makes the bind fail (or another checkout's Prometheus
    // listens there). Unless the port was chosen explicitly, retry once on a port that is
    // free right now.
    if let Ok(o) = &out {
        if !o.status.success()
            && std::env::var_os("SLUICE_PROM_PORT").is_none()
            && String::from_utf8_lossy(&o.stderr).contains("already in use")
        {
            let p = free_port().to_string();
            eprintln!("Prometheus could not bind its default port; retrying with SLUICE_PROM_PORT={p}");
            out = start(Some(&p));
            port_env = Some(p);
        }
    }
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => {
            let why = format!("`{fix}` exited with {}: {}", o.status, String::from_utf8_lossy(&o.stderr).trim());
            return if may_skip("Prometheus", fix, &why) { None } else { unreachable!() };
        }
        Err(e) => return if may_skip("Prometheus", fix, &e.to_string()) { None } else { unreachable!() },
    }
    let mut prom = Prometheus { port: 0, port_env };
    prom.script(&["reload"]);
    let url = prom.script(&["url"]);
    prom.port = url
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("prometheus.sh url: {url:?}"));
    Some(prom)
}

/// The port of the local Prometheus if it is running: the `--web.listen-address` of the
/// process in `.local/prometheus/prometheus.pid` that uses our data directory (the same
/// test as `prometheus.sh`'s own).
fn running_port() -> Option<String> {
    let base = repo_root().join(".local/prometheus");
    let pid = std::fs::read_to_string(base.join("prometheus.pid")).ok()?;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).ok()?;
    let args: Vec<String> = cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
    let data = format!("--storage.tsdb.path={}", base.join("data").display());
    if !args.contains(&data) {
        return None;
    }
    args.iter()
        .find_map(|a| a.strip_prefix("--web.listen-address="))
        .and_then(|a| a.rsplit(':').next())
        .map(str::to_string)
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl Prometheus {
    /// `GET path` (HTTP/1.0: no chunked encoding to undo) → parsed JSON body.
    fn get(&self, path: &str) -> Value {
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to Prometheus");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        write!(s, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
        let mut raw = Vec::new();
        s.read_to_end(&mut raw).expect("read Prometheus response");
        let text = String::from_utf8(raw).expect("utf-8 response");
        let (head, body) = text.split_once("\r\n\r\n").expect("HTTP head");
        serde_json::from_str(body).unwrap_or_else(|e| panic!("GET {path}: {e}: {head}\n{body}"))
    }

    /// An API call that must succeed; returns `data`.
    fn api(&self, path: &str) -> Value {
        let v = self.get(path);
        assert_eq!(v["status"], "success", "GET {path}: {v}");
        v["data"].clone()
    }

    /// `/api/v1/query`: the full answer (status, data or error).
    fn query(&self, expr: &str) -> Value {
        self.get(&format!("/api/v1/query?query={}", percent_encode(expr)))
    }
}

/// `deploy/local/prometheus.sh targets --name NAME` for this test; the file goes away on drop.
struct Targets {
    name: String,
}

impl Targets {
    fn register(targets: &[&str]) -> Targets {
        let name = format!("it-prom-dash-{}", suffix());
        run_ok(Command::new(script("prometheus.sh")).arg("targets").arg("--name").arg(&name).args(targets));
        Targets { name }
    }
}

impl Drop for Targets {
    fn drop(&mut self) {
        let _ = Command::new(script("prometheus.sh")).args(["targets", "--name", &self.name]).output();
        let _ = std::fs::remove_file(repo_root().join(".local/prometheus/targets").join(format!("{}.json", self.name)));
    }
}

fn raw_producer() -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("partitioner", "murmur2_random")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

fn watermarks(topic: &str) -> Vec<(i64, i64)> {
    let c: BaseConsumer = ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    (0..PARTITIONS).map(|p| c.fetch_watermarks(topic, p, Duration::from_secs(10)).unwrap()).collect()
}

fn workload(records: usize, seed: u64, env: &Env) -> Vec<LogRecord> {
    generate(&WorkloadSpec {
        records,
        collections: 8,
        dim: 4,
        ids_per_collection: 40,
        mix: [45, 20, 15, 20],
        seed,
        collection_prefix: format!("{}-c", env.prefix),
    })
    .collect()
}

fn wait_until<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Instances (`host:port`) in a query result.
fn instances(result: &Value) -> BTreeSet<String> {
    result
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["metric"]["instance"].as_str().map(str::to_string))
        .collect()
}

fn finite_samples(result: &Value) -> usize {
    result
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["value"][1].as_str().and_then(|v| v.parse::<f64>().ok()).is_some_and(f64::is_finite))
        .count()
}

/// Every `targets[].expr` of the dashboard, with its panel title.
fn dashboard_exprs() -> Vec<(String, String)> {
    let d: Value =
        serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).expect("dashboard JSON");
    let mut out = Vec::new();
    let mut stack: Vec<&Value> = d["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = stack.pop() {
        stack.extend(p["panels"].as_array().into_iter().flatten()); // collapsed rows
        for t in p["targets"].as_array().into_iter().flatten() {
            out.push((
                p["title"].as_str().unwrap_or("?").to_string(),
                t["expr"].as_str().expect("target expr").to_string(),
            ));
        }
    }
    out.reverse();
    out
}

/// `label_values(SELECTOR, LABEL)` of the dashboard's query variables.
fn dashboard_variable_queries() -> Vec<(String, String, String)> {
    let d: Value = serde_json::from_str(&std::fs::read_to_string(repo_root().join(DASHBOARD)).unwrap()).unwrap();
    d["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["type"] == "query")
        .map(|v| {
            let q = v["definition"].as_str().expect("variable definition");
            let inner =
                q.strip_prefix("label_values(").and_then(|s| s.strip_suffix(')')).unwrap_or_else(|| panic!("{q}"));
            let (sel, label) = inner.rsplit_once(',').unwrap_or_else(|| panic!("{q}"));
            (v["name"].as_str().unwrap().to_string(), sel.trim().to_string(), label.trim().to_string())
        })
        .collect()
}

/// Alert names as written in the rules file (`- alert: Name`).
fn alert_names_in_file() -> BTreeSet<String> {
    std::fs::read_to_string(repo_root().join(RULES))
        .unwrap()
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- alert:").map(|n| n.trim().to_string()))
        .collect()
}

// ---------------------------------------------------------------------------- tests

#[test]
fn deploy_files_validate_offline() {
    // promtool, compose-spec and Kubernetes schemas, hadolint, `sluice config show` of the
    // shipped configuration, cross-file consistency (see the script's header).
    let out = Command::new(repo_root().join("deploy/validate.sh"))
        .env("SLUICE_BIN", sluice_bin())
        .output()
        .expect("run deploy/validate.sh");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert!(out.status.success(), "deploy/validate.sh failed:\n{stderr}");
}

#[test]
fn every_dashboard_and_alert_expression_works_against_two_real_replicas() {
    if !require_kafka() {
        return;
    }
    let Some(prom) = require_prometheus() else { return };
    let started = Instant::now();

    // The rules as files: syntax and unit tests.
    let promtool = |args: &[&str]| run_ok(Command::new("promtool").args(args).current_dir(repo_root()));
    promtool(&["check", "rules", RULES]);
    promtool(&["test", "rules", RULE_TESTS]);

    // ------------------------------------------------------------------ the scenario
    // The change feed on, so that its panels and alert have series.
    let env =
        Env::sqlite("prom-dash").with_sections("[backfill]\nscan_interval_ms = 500\n[changelog]\nenabled = true\n");
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let topic = env.log_topic();
    let initial = workload(1_500, 7, &env);
    let lines: Vec<String> = initial.iter().map(|r| log_record_to_json(r).to_string()).collect();
    env.produce(&lines);

    // Which collection lives where: the function goes on `fn_collection`, the gap on
    // another partition, poison records on a third collection's (consumed) partition.
    let home = |c: &str| partition_for(c.as_bytes(), PARTITIONS as u32) as i32;
    let collections: BTreeSet<String> = initial.iter().map(|r| r.collection_id.clone()).collect();
    let fn_collection = collections.iter().next().unwrap().clone();
    let highs = watermarks(&topic);
    let gap_partition = (0..PARTITIONS)
        .filter(|p| *p != home(&fn_collection) && highs[*p as usize].1 > 10)
        .max_by_key(|p| highs[*p as usize].1)
        .expect("a partition with records besides the function's");
    let poison_collection =
        collections.iter().find(|c| home(c) != gap_partition).cloned().expect("a collection outside the gap partition");

    // A data-loss gap: the sysdb says partition G starts at 0, but its records are deleted
    // (what retention does), so the replica that gets G halts and counts a gap.
    env.run(&[
        "offsets",
        "reset",
        "--partition",
        &gap_partition.to_string(),
        "--to",
        "0",
        "--reason",
        "prometheus_dashboard test: gap",
        "--execute",
    ]);
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers()).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&topic, gap_partition, Offset::Offset(highs[gap_partition as usize].1)).unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let deleted = rt
        .block_on(admin.delete_records(&tpl, &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)))))
        .expect("delete records");
    for e in deleted.elements() {
        assert!(e.error().is_ok(), "delete records of partition {}: {:?}", e.partition(), e.error());
    }
    assert!(watermarks(&topic)[gap_partition as usize].0 > 0, "the log start of partition {gap_partition} moved");

    // Poison records before the replicas start: the DLQ series exist from the first batches.
    let producer = raw_producer();
    let send = |key: &str, payload: &[u8]| {
        producer.send(BaseRecord::to(&topic).key(key).payload(payload)).map_err(|(e, _)| e).expect("produce");
    };
    let mut wrong_dim =
        initial.iter().find(|r| r.collection_id == poison_collection && r.embedding.is_some()).unwrap().clone();
    wrong_dim.embedding = Some(vec![0.5; 5].into());
    send(&poison_collection, b"\xff\xfe definitely not avro");
    send(&poison_collection, &encode(&wrong_dim));
    producer.flush(Duration::from_secs(10)).unwrap();

    // Two replicas, scraped by Prometheus.
    let (p1, p2) = (free_port(), free_port());
    let (t1, t2) = (format!("127.0.0.1:{p1}"), format!("127.0.0.1:{p2}"));
    let mut r1 = env.spawn_replica("r1", &[("SLUICE_HTTP", t1.as_str())]);
    let mut r2 = env.spawn_replica("r2", &[("SLUICE_HTTP", t2.as_str())]);
    let _targets = Targets::register(&[&t1, &t2]);
    let ours: BTreeSet<String> = [t1.clone(), t2.clone()].into();

    // Live load until the end: good records on every collection, and a poison record now
    // and then (so DLQ rates are not zero).
    let stop = Arc::new(AtomicBool::new(false));
    let produced = Arc::new(AtomicU64::new(0));
    let load = {
        let (stop, produced, topic) = (stop.clone(), produced.clone(), topic.clone());
        let records = workload(100_000, 8, &env);
        let poison_collection = poison_collection.clone();
        std::thread::spawn(move || {
            let producer = raw_producer();
            let mut i = 0usize;
            while !stop.load(Ordering::Relaxed) {
                for r in &records[i % records.len()..(i % records.len() + 50).min(records.len())] {
                    let payload = encode(r);
                    producer
                        .send(BaseRecord::to(&topic).key(&r.collection_id).payload(&payload))
                        .map_err(|(e, _)| e)
                        .expect("produce");
                    produced.fetch_add(1, Ordering::Relaxed);
                }
                if i % 500 == 0 {
                    let payload = b"\x02\x00 truncated";
                    producer
                        .send(BaseRecord::to(&topic).key(&poison_collection).payload(&payload[..]))
                        .map_err(|(e, _)| e)
                        .expect("produce");
                }
                i += 50;
                producer.poll(Duration::ZERO);
                std::thread::sleep(Duration::from_millis(100));
            }
            producer.flush(Duration::from_secs(10)).unwrap();
        })
    };

    // Prometheus scrapes both.
    wait_until("Prometheus to scrape both replicas (up)", WAIT, || {
        let targets = prom.api("/api/v1/targets?state=active");
        let up: BTreeSet<String> = targets["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|t| t["health"] == "up")
            .filter_map(|t| t["labels"]["instance"].as_str().map(str::to_string))
            .collect();
        ours.is_subset(&up).then_some(())
    });
    eprintln!("[{:?}] both replicas scraped", started.elapsed());

    // A backfill: attach a function to a collection with records (it is registered once
    // the replicas applied its first batch).
    let attached: Value = wait_until("the function to attach", WAIT, || {
        let out = env
            .cmd()
            .args([
                "functions",
                "attach",
                &fn_collection,
                "--function",
                "record_counter",
                "--output",
                &format!("{fn_collection}-count"),
                "--format",
                "json",
            ])
            .output()
            .unwrap();
        out.status.success().then(|| serde_json::from_slice(&out.stdout).expect("attach JSON"))
    });
    let function_id = attached["function_id"].as_str().expect("function_id").to_string();
    wait_until("the backfill to finish", WAIT, || {
        let v: Value = serde_json::from_str(&env.run(&["functions", "list", "--format", "json"])).unwrap();
        v.as_array().unwrap().iter().any(|f| f["id"] == function_id.as_str() && f["status"] == "ready").then_some(())
    });
    eprintln!("[{:?}] backfill finished", started.elapsed());
    // Reads with a token (the read-your-writes panels), until the end, so that rate() of
    // the wait histogram has an increase between scrapes: a token of everything written so
    // far on the function's partition, read through one replica.
    let collections: Value = serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).unwrap();
    let fn_partition = collections
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == fn_collection.as_str())
        .and_then(|c| c["partition"].as_i64())
        .expect("the function's collection is listed");
    let token_reads = {
        let (stop, env, fn_collection) = (stop.clone(), env.clone(), fn_collection.clone());
        std::thread::spawn(move || {
            let mut reads = 0;
            while !stop.load(Ordering::Relaxed) {
                let token = env.run(&["token", "latest", "--partition", &fn_partition.to_string()]).trim().to_string();
                let path = format!("/api/v1/collections/{fn_collection}?at_least={token}&wait_ms=60000");
                let (status, body) = sluice_integration_tests::http(p1, "GET", &path, None);
                assert_eq!(status, 200, "a read with a token of the live partition: {body}");
                reads += 1;
                std::thread::sleep(Duration::from_millis(300));
            }
            reads
        })
    };
    // rate() needs two samples after the events: a few scrapes of the replicas' state.
    std::thread::sleep(SCRAPE * 4);

    // ------------------------------------------------------------------ dashboard
    let instance_re = format!("{t1}|{t2}");
    let substitute = |expr: &str| {
        let e = expr.replace("$__rate_interval", "1m").replace("$job", "sluice").replace("$instance", &instance_re);
        assert!(!e.contains('$'), "unsubstituted variable in {expr}");
        e
    };
    for (name, selector, label) in dashboard_variable_queries() {
        let sel = format!("{}{{job=\"sluice\", instance=~\"{instance_re}\"}}", selector.split('{').next().unwrap());
        let values = prom.api(&format!("/api/v1/label/{label}/values?match[]={}", percent_encode(&sel)));
        let values: BTreeSet<String> =
            values.as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
        let want: BTreeSet<String> = if label == "instance" { ours.clone() } else { ["sluice".to_string()].into() };
        assert!(
            want.is_subset(&values),
            "variable ${name} = label_values({selector}, {label}) gives {values:?}, want {want:?}"
        );
    }

    let exprs = dashboard_exprs();
    assert!(exprs.len() >= 30, "the dashboard has {} expressions", exprs.len());
    let mut failures = Vec::new();
    let mut panel_max: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut expr_values: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for (title, expr) in &exprs {
        let q = substitute(expr);
        let allowed = NO_DATA_ALLOWED.iter().find(|(e, _)| *e == expr.as_str());
        let answer = loop {
            let v = prom.query(&q);
            assert_eq!(v["status"], "success", "panel {title:?}: {q}\n{v}");
            let ok = finite_samples(&v["data"]["result"]) > 0;
            if ok || allowed.is_some() || Instant::now() > deadline {
                break v;
            }
            std::thread::sleep(SCRAPE);
        };
        let result = &answer["data"]["result"];
        let n = result.as_array().map_or(0, Vec::len);
        let finite = finite_samples(result);
        eprintln!("  {:<48} {n:>2} series ({finite} finite)  {q}", format!("{title:?}"));
        if finite == 0 && allowed.is_none() {
            failures.push(format!("panel {title:?}: no finite sample for {q}: {answer}"));
        }
        if let Some((_, why)) = allowed {
            eprintln!("    (allowed to be empty: {why})");
        }
        let values =
            result.as_array().into_iter().flatten().filter_map(|s| s["value"][1].as_str()?.parse::<f64>().ok());
        let values: Vec<f64> = values.collect();
        expr_values.entry(expr.clone()).or_default().extend(values.iter().copied());
        panel_max.entry(title.clone()).or_default().extend(values);
    }
    assert!(failures.is_empty(), "dashboard expressions without data:\n{}", failures.join("\n"));
    // And the panels that show what this run did show it.
    let max = |title: &str| panel_max[title].iter().copied().fold(f64::NAN, f64::max);
    assert_eq!(max("Replicas up"), 2.0, "both replicas up");
    // ...and compared with the expected count of the recording rule (3): two thirds.
    let share = exprs
        .iter()
        .find(|(t, e)| t == "Replicas up" && e.contains("sluice:expected_replicas"))
        .map(|(_, e)| expr_values[e].clone())
        .expect("Replicas up compares with sluice:expected_replicas");
    assert_eq!(share.len(), 1, "one share: {share:?}");
    assert!((share[0] - 2.0 / 3.0).abs() < 1e-9, "2 of 3 expected replicas up, got {share:?}");
    assert_eq!(max("Backfill progress"), 1.0, "the finished backfill covered its whole collection");
    // The function's status series says ready (sysdb-wide: every replica's relay reads it).
    let status = prom.query(&format!(
        "max by (function, status) (sluice_function_status{{instance=~\"{instance_re}\", function=\"{function_id}\"}})"
    ));
    let statuses: Vec<&str> =
        status["data"]["result"].as_array().unwrap().iter().filter_map(|s| s["metric"]["status"].as_str()).collect();
    assert_eq!(statuses, ["ready"], "status series of function {function_id}: {status}");
    assert!(max("Memory by replica") > 1e6, "RSS in bytes: {:?}", panel_max["Memory by replica"]);
    assert!(max("Open file descriptors by replica") > 0.0, "open fds");
    assert!(max("Time lag per partition") >= 0.0, "time lag: {:?}", panel_max["Time lag per partition"]);
    assert_eq!(max("Halted partitions"), 1.0, "the gap partition is halted");
    for title in [
        "Records applied / s",
        "DLQ records / s",
        "Lag per partition",
        "Data-loss gaps found",
        "Records backfilled / s",
    ] {
        assert!(max(title) > 0.0, "panel {title:?} shows nothing of this run: {:?}", panel_max[title]);
    }
    eprintln!("[{:?}] {} dashboard expressions have data", started.elapsed(), exprs.len());

    // The halted partition is visible as such.
    let halted = prom.query(&format!("sluice_partition_halted{{instance=~\"{instance_re}\"}} == 1"));
    let halted_partitions: BTreeSet<String> = halted["data"]["result"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["metric"]["partition"].as_str().map(str::to_string))
        .collect();
    assert_eq!(halted_partitions, [gap_partition.to_string()].into(), "halted partitions: {halted}");

    // ------------------------------------------------------------------ alert rules
    // Loaded by the real Prometheus (from this tree, after the reload above), healthy, and
    // every expression accepted by the query API.
    let rules = wait_until("the sluice rules to be loaded and evaluated", Duration::from_secs(20), || {
        let groups = prom.api("/api/v1/rules?type=alert");
        let group = groups["groups"]
            .as_array()
            .unwrap()
            .iter()
            .find(|g| g["name"] == "sluice" && g["file"].as_str().is_some_and(|f| f.ends_with(RULES)))?
            .clone();
        let rules = group["rules"].as_array().unwrap().clone();
        rules.iter().all(|r| r["health"] == "ok").then_some(rules)
    });
    let loaded: BTreeSet<String> = rules.iter().map(|r| r["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(loaded, alert_names_in_file(), "the alerts Prometheus loaded are those of {RULES}");
    for r in &rules {
        let (name, expr) = (r["name"].as_str().unwrap(), r["query"].as_str().unwrap());
        let runbook = r["annotations"]["runbook_url"].as_str().unwrap_or_default();
        assert!(
            runbook.starts_with("http") && runbook.ends_with(&format!("/metrics.md#{}", name.to_lowercase())),
            "alert {name}: runbook_url {runbook:?} is not an absolute link to its runbook"
        );
        let v = prom.query(expr);
        assert_eq!(v["status"], "success", "alert {name}: {expr}\n{v}");
        let mine = instances(&v["data"]["result"]).intersection(&ours).count();
        eprintln!(
            "  alert {name:<26} {} series now ({mine} from this test's replicas)",
            v["data"]["result"].as_array().unwrap().len()
        );
    }
    // The gap and the halted partition are alerts in the making, for this test's replicas.
    wait_until(
        "SluicePartitionHalted and SluiceDataLossGap to be active for this test's replicas",
        Duration::from_secs(20),
        || {
            let alerts = prom.api("/api/v1/alerts");
            let active = |name: &str| {
                alerts["alerts"].as_array().unwrap().iter().any(|a| {
                    a["labels"]["alertname"] == name
                        && a["labels"]["instance"].as_str().is_some_and(|i| ours.contains(i))
                        && (a["state"] == "pending" || a["state"] == "firing")
                })
            };
            (active("SluicePartitionHalted") && active("SluiceDataLossGap")).then_some(())
        },
    );

    // A replica dies: SluiceReplicaDown's expression returns it at the next scrape.
    r2.kill9();
    let down_expr = rules.iter().find(|r| r["name"] == "SluiceReplicaDown").expect("SluiceReplicaDown")["query"]
        .as_str()
        .unwrap()
        .to_string();
    wait_until("SluiceReplicaDown's expression to return the killed replica", Duration::from_secs(20), || {
        instances(&prom.query(&down_expr)["data"]["result"]).contains(&t2).then_some(())
    });
    eprintln!("[{:?}] killed replica {t2} reported down", started.elapsed());

    stop.store(true, Ordering::Relaxed);
    load.join().expect("load thread");
    let reads = token_reads.join().expect("token reads");
    assert!(reads >= 3, "{reads} token reads");
    eprintln!("produced {} live records; done in {:?}", produced.load(Ordering::Relaxed), started.elapsed());
    assert!(r1.child.try_wait().unwrap().is_none(), "replica r1 died:\n{}", r1.log_text());
}
