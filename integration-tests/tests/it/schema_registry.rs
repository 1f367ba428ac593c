//! Schema evolution through a schema registry, against the real broker and a real
//! registry (Apicurio, Confluent API; `deploy/local/schema-registry.sh`), on both sysdbs.
//!
//! - `evolution`: v1 and v2 (`schemas/log_record.v2.avsc`, one optional field more)
//!   records interleaved in one partition, written by Python (confluent-kafka's
//!   AvroSerializer, and fastavro with the framing by hand), by `sluice produce` (which
//!   registers v1 at start) and through the HTTP ingest:
//!   the sysdb equals the reference model of all of them, nothing in the DLQ, and the
//!   replica read v2 through schema resolution and v1 through the hand-written codec.
//! - `incompatible`: records whose writer schema the current schema cannot read (registered
//!   under another subject) go to the DLQ with kind `incompatible_schema` and the schema id
//!   in a header; the records around them apply and the partition catches up.
//! - `outage`: a private registry instance is stopped for 10 s while records with a writer
//!   schema id the replica has not cached arrive: nothing goes to the DLQ, nothing is
//!   skipped (the position waits below them), and after the restart everything applies.
//! - `schema_cli`: `sluice schema show` and `sluice schema check` (exit 1 when refused).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sluice::record::LogRecord;
use sluice_integration_tests::{
    both_backends, brokers, consume_all, free_port, registry_port_and_path, repo_root, require_kafka,
    require_schema_registry, schema_registry_url, small_workload, suffix, Env,
};
use sluice_integration_tests::{http, http_get, venv_python};

const V1: &str = "schemas/log_record.avsc";
const V2: &str = "schemas/log_record.v2.avsc";

/// A schema Sluice cannot read: `id` is a long and there is no `operation`.
const BAD: &str = r#"{"type": "record", "name": "LogRecord", "namespace": "sluice.v1",
  "fields": [{"name": "collection_id", "type": "string"}, {"name": "id", "type": "long"}]}"#;

/// The test environment: Confluent framing, the registry at `url`, one partition. The
/// configured schema id is one the registry never gives, so a writer that did not ask the
/// registry is caught.
fn registry_env(env: Env, url: &str) -> Env {
    let env = env
        .with_kafka("framing = \"confluent\"\nconfluent_schema_id = 999999\n")
        .with_sections(&format!("[schema_registry]\nurl = \"{url}\"\n"));
    env.run(&["init", "--partitions", "1"]);
    env
}

/// The Avro record (as fastavro takes it) of a log record; v2 adds `trace_id`.
fn avro_dict(r: &LogRecord, trace_id: Option<Option<&str>>) -> Value {
    let metadata = r.metadata.as_ref().map(|m| {
        m.iter()
            .map(|(k, v)| {
                let v = match v {
                    sluice::record::MetaValue::Null => Value::Null,
                    sluice::record::MetaValue::String(s) => json!(s),
                    sluice::record::MetaValue::Long(l) => json!(l),
                    sluice::record::MetaValue::Bool(b) => json!(b),
                    sluice::record::MetaValue::Double(d) => json!(d),
                };
                (k.clone(), v)
            })
            .collect::<serde_json::Map<_, _>>()
    });
    let mut d = json!({
        "collection_id": r.collection_id, "id": r.id, "operation": r.operation.symbol(),
        "embedding": r.embedding, "encoding": "FLOAT32", "metadata": metadata,
        "document": r.document, "backfill": null,
    });
    if let Some(t) = trace_id {
        d["trace_id"] = json!(t);
    }
    d
}

/// Pinned like `deploy/local/python-env.sh` pins the client, plus its Avro extra
/// (SchemaRegistryClient and AvroSerializer need httpx, authlib, attrs, cachetools, ...).
const SERIALIZER_REQUIREMENT: &str = "confluent-kafka[avro]==2.16.1";

/// A Python with confluent-kafka's AvroSerializer: a venv of its own,
/// `.local/venv-avro-serializer` (created once, from PyPI; the test helpers' venv stays as
/// `deploy/local/python-env.sh` makes it).
fn serializer_python() -> String {
    static PY: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PY.get_or_init(|| {
        let venv = repo_root().join(".local/venv-avro-serializer");
        let py = venv.join("bin/python");
        let stamp = venv.join(".sluice-requirements");
        if std::fs::read_to_string(&stamp).ok().as_deref() == Some(SERIALIZER_REQUIREMENT) && py.exists() {
            return py.display().to_string();
        }
        let _ = std::fs::remove_dir_all(&venv);
        let python = std::env::var("SLUICE_PYTHON").unwrap_or_else(|_| "python3".into());
        let ok = Command::new(&python).args(["-m", "venv"]).arg(&venv).status().expect("python3 -m venv");
        assert!(ok.success(), "{python} -m venv {} failed", venv.display());
        let out = Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", SERIALIZER_REQUIREMENT])
            .output()
            .expect("pip install");
        assert!(
            out.status.success(),
            "pip install {SERIALIZER_REQUIREMENT} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, SERIALIZER_REQUIREMENT).expect("stamp");
        py.display().to_string()
    })
    .clone()
}

/// How the Python producer frames: by hand with fastavro, or with confluent-kafka's
/// AvroSerializer.
#[derive(Clone, Copy, PartialEq)]
enum Serializer {
    Fastavro,
    Confluent,
}

/// Produce `lines` (`{"schema", "key", "record"}`) with the Python producer; returns the
/// schema id of each record.
fn python_produce(
    env: &Env,
    registry: &str,
    schemas: &[(&str, String, PathBuf)],
    lines: &[Value],
    serializer: Serializer,
) -> Vec<u32> {
    let input = env.dir.join(format!("py-{}.jsonl", suffix()));
    std::fs::write(&input, lines.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")).expect("input");
    let python = match serializer {
        Serializer::Fastavro => venv_python(),
        Serializer::Confluent => serializer_python(),
    };
    let mut c = Command::new(python);
    c.arg(repo_root().join("integration-tests/python/produce_with_registry.py"));
    if serializer == Serializer::Confluent {
        c.args(["--serializer", "confluent"]);
    }
    c.args(["--brokers", &brokers(), "--topic", &env.log_topic(), "--registry", registry])
        .args(["--input", input.to_str().expect("utf8")]);
    for (name, subject, path) in schemas {
        c.arg("--schema").arg(format!("{name}={subject}={}", path.display()));
    }
    let out = c.output().expect("run produce_with_registry.py");
    assert!(
        out.status.success(),
        "produce_with_registry.py failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ids: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(' ').nth(2).expect("id column").parse().expect("id"))
        .collect();
    assert_eq!(ids.len(), lines.len());
    ids
}

fn path(rel: &str) -> PathBuf {
    repo_root().join(rel)
}

fn bad_schema_file(env: &Env) -> PathBuf {
    let p = env.dir.join("bad.avsc");
    std::fs::write(&p, BAD).expect("bad schema");
    p
}

/// The log topic's messages (one partition) in offset order.
fn log_offsets(env: &Env) -> Vec<i64> {
    let mut m = consume_all(&env.log_topic(), 1, Duration::from_secs(60));
    m.sort_by_key(|m| m.offset);
    m.iter().map(|m| m.offset).collect()
}

/// The DLQ's entries: (kind, schema id header, source offset).
fn dlq_entries(env: &Env) -> Vec<(String, Option<String>, i64)> {
    consume_all(&env.dlq_topic(), 1, Duration::from_secs(60))
        .into_iter()
        .map(|m| {
            (
                m.headers.get("sluice.error.kind").cloned().unwrap_or_default(),
                m.headers.get("sluice.schema.id").cloned(),
                m.headers.get("sluice.source.offset").and_then(|o| o.parse().ok()).unwrap_or(-1),
            )
        })
        .collect()
}

/// The sysdb holds exactly the reference model of `log` (offset, record): every
/// collection's records as `sluice records` prints them, its count and log position.
fn assert_state_is_model(env: &Env, log: &[(i64, LogRecord)]) {
    use sluice::cli::jsonl::record_to_json;
    let model = sluice::materialize::model::reference(log);
    let listed: Value =
        serde_json::from_str(&env.run(&["collections", "list", "--format", "json"])).expect("collections json");
    let in_sysdb: BTreeMap<String, (i64, i64)> = listed
        .as_array()
        .expect("array")
        .iter()
        .map(|c| {
            let id = c["id"].as_str().expect("id").to_string();
            (id, (c["log_position"].as_i64().expect("log_position"), c["records"].as_i64().expect("records")))
        })
        .collect();
    let mut positions: BTreeMap<&str, i64> = BTreeMap::new();
    for (o, r) in log {
        if !model.collections[&r.collection_id].rejected.contains(o) {
            let p = positions.entry(r.collection_id.as_str()).or_insert(-1);
            *p = (*p).max(*o);
        }
    }
    assert_eq!(
        in_sysdb.keys().map(String::as_str).collect::<BTreeSet<_>>(),
        positions.keys().copied().collect::<BTreeSet<_>>(),
        "collections in the sysdb"
    );
    for (cid, cm) in &model.collections {
        let expected: Vec<Value> = cm.records.values().map(record_to_json).collect();
        let actual: Vec<Value> = env
            .run(&["records", cid, "--format", "jsonl"])
            .lines()
            .map(|l| serde_json::from_str(l).expect("record JSON"))
            .collect();
        assert_eq!(actual, expected, "records of {cid}");
        let (position, count) = in_sysdb[cid];
        assert_eq!(count, cm.records.len() as i64, "record count of {cid}");
        assert_eq!(position, positions[cid.as_str()], "log_position of {cid}");
    }
}

fn workload(env: &Env, n: usize, seed: u64) -> Vec<LogRecord> {
    small_workload(n, seed, &format!("{}-c", env.prefix), 3)
}

// ------------------------------------------------------------------------- evolution ----

fn evolution(env: Env) {
    if !require_schema_registry() {
        return;
    }
    let url = schema_registry_url();
    let env = registry_env(env, &url);
    let subject = format!("{}-value", env.log_topic());
    let records = workload(&env, 90, 11);
    let (a, rest) = records.split_at(30);
    let (b, c) = rest.split_at(30);
    let schemas = [("v1", subject.clone(), path(V1)), ("v2", subject.clone(), path(V2))];
    // Python: v1 and v2 alternating; v2 with and without its new field set.
    let lines = |rs: &[LogRecord], first_v2: bool| -> Vec<Value> {
        rs.iter()
            .enumerate()
            .map(|(i, r)| {
                let v2 = (i % 2 == 0) == first_v2;
                let trace = if i % 4 < 2 { Some("trace-1") } else { None };
                json!({"schema": if v2 { "v2" } else { "v1" }, "key": r.collection_id,
                       "record": avro_dict(r, v2.then_some(trace))})
            })
            .collect()
    };
    // The first block through confluent-kafka's AvroSerializer, the last by hand.
    let ids_a = python_produce(&env, &url, &schemas, &lines(a, false), Serializer::Confluent);
    // `sluice produce` registers v1 (the same schema: the same id) and frames with it.
    env.produce(&sluice_integration_tests::jsonl_lines(b));
    let ids_c = python_produce(&env, &url, &schemas, &lines(c, true), Serializer::Fastavro);
    let v1_id = ids_a[0];
    let v2_id = ids_a[1];
    assert_ne!(v1_id, v2_id);
    assert_eq!(ids_c[0], v2_id);

    let offsets = log_offsets(&env);
    assert_eq!(offsets.len(), records.len(), "every record is in the one partition");
    // `sluice produce` framed its records with the registry's id for v1.
    let framed = consume_all(&env.log_topic(), 1, Duration::from_secs(60));
    let produced_ids: BTreeSet<u32> =
        framed[30..60].iter().map(|m| u32::from_be_bytes(m.payload[1..5].try_into().expect("4 bytes"))).collect();
    assert_eq!(produced_ids, BTreeSet::from([v1_id]), "sluice produce writes the registered v1 id");

    let port = free_port();
    let mut replica = env.spawn_replica("r1", &[("SLUICE_HTTP", &format!("127.0.0.1:{port}"))]);
    env.wait_caught_up(Duration::from_secs(120));
    // The HTTP ingest frames with the registered v1 id too.
    let ingested = workload(&env, 12, 14);
    let body = Value::Array(
        sluice_integration_tests::jsonl_lines(&ingested).iter().map(|l| serde_json::from_str(l).unwrap()).collect(),
    )
    .to_string();
    // One collection per request (the endpoint's path names it).
    let mut all = records.clone();
    for cid in ingested.iter().map(|r| r.collection_id.clone()).collect::<BTreeSet<_>>() {
        let mine: Vec<Value> = serde_json::from_str::<Vec<Value>>(&body)
            .unwrap()
            .into_iter()
            .filter(|v| v["collection"] == json!(cid))
            .collect();
        let (status, answer) =
            http_post(port, &format!("/api/v1/collections/{cid}/records"), &Value::Array(mine).to_string());
        assert_eq!(status, 202, "{answer}");
        all.extend(ingested.iter().filter(|r| r.collection_id == cid).cloned());
    }
    env.wait_caught_up(Duration::from_secs(120));
    let framed = consume_all(&env.log_topic(), 1, Duration::from_secs(60));
    assert_eq!(framed.len(), all.len());
    let ingest_ids: BTreeSet<u32> = framed[records.len()..]
        .iter()
        .map(|m| u32::from_be_bytes(m.payload[1..5].try_into().expect("4 bytes")))
        .collect();
    assert_eq!(ingest_ids, BTreeSet::from([v1_id]), "the HTTP ingest writes the registered v1 id");
    let log: Vec<(i64, LogRecord)> = framed.iter().map(|m| m.offset).zip(all).collect();
    let text = replica.log_text();
    let fetched = |id: u32, decoder: &str| {
        text.lines().any(|l| {
            l.contains("writer schema fetched") && l.contains(&format!("schema_id={id} ")) && l.contains(decoder)
        })
    };
    assert!(fetched(v2_id, "resolution"), "v2 was read through schema resolution:\n{text}");
    assert!(fetched(v1_id, "codec"), "v1 was read with the hand-written codec:\n{text}");
    replica.terminate(Duration::from_secs(30));
    assert_eq!(dlq_entries(&env), vec![], "nothing in the DLQ");
    assert_state_is_model(&env, &log);
}

both_backends!(evolution_v1_v2_interleaved, evolution);

// ---------------------------------------------------------------------- incompatible ----

fn incompatible(env: Env) {
    if !require_schema_registry() {
        return;
    }
    let url = schema_registry_url();
    let env = registry_env(env, &url);
    let subject = format!("{}-value", env.log_topic());
    let bad_path = bad_schema_file(&env);
    // The main subject refuses the bad schema (BACKWARD), so a producer that registers it
    // under another subject can still write it.
    let schemas = [
        ("v1", subject.clone(), path(V1)),
        ("v2", subject.clone(), path(V2)),
        ("bad", format!("{}-other-value", env.prefix), bad_path),
    ];
    let records = workload(&env, 40, 12);
    let mut lines = Vec::new();
    let mut good: Vec<LogRecord> = Vec::new();
    for (i, r) in records.iter().enumerate() {
        if i % 5 == 2 {
            lines.push(json!({"schema": "bad", "key": r.collection_id,
                              "record": {"collection_id": r.collection_id, "id": i as i64}}));
        } else {
            let v2 = i % 2 == 0;
            lines.push(json!({"schema": if v2 { "v2" } else { "v1" }, "key": r.collection_id,
                              "record": avro_dict(r, v2.then_some(None))}));
            good.push(r.clone());
        }
    }
    let ids = python_produce(&env, &url, &schemas, &lines, Serializer::Confluent);
    let bad_id = ids[2];
    let offsets = log_offsets(&env);
    assert_eq!(offsets.len(), lines.len());
    let bad_offsets: Vec<i64> = (0..lines.len()).filter(|i| i % 5 == 2).map(|i| offsets[i]).collect();
    let log: Vec<(i64, LogRecord)> =
        (0..lines.len()).filter(|i| i % 5 != 2).map(|i| offsets[i]).zip(good.iter().cloned()).collect();

    let mut replica = env.spawn_replica("r1", &[]);
    env.wait_caught_up(Duration::from_secs(120));
    replica.terminate(Duration::from_secs(30));
    let dlq = dlq_entries(&env);
    let expected: Vec<(String, Option<String>, i64)> =
        bad_offsets.iter().map(|o| ("incompatible_schema".to_string(), Some(bad_id.to_string()), *o)).collect();
    assert_eq!(dlq, expected, "each record of the incompatible writer schema in the DLQ with its id");
    assert_state_is_model(&env, &log);
}

both_backends!(incompatible_writer_schema_to_dlq, incompatible);

// ---------------------------------------------------------------------------- outage ----

/// A private registry instance on free ports (in-memory: empty at each start), stopped
/// when dropped. The shared instance is never touched.
struct PrivateRegistry {
    port: u16,
    management: u16,
    home: PathBuf,
}

impl PrivateRegistry {
    fn script(&self, cmd: &str) -> std::process::Output {
        Command::new(repo_root().join("deploy/local/schema-registry.sh"))
            .arg(cmd)
            .env("SLUICE_REGISTRY_PORT", self.port.to_string())
            .env("SLUICE_REGISTRY_MANAGEMENT_PORT", self.management.to_string())
            .env("SLUICE_REGISTRY_HOME", &self.home)
            .stdin(Stdio::null())
            .output()
            .expect("run schema-registry.sh")
    }

    fn start(&self) {
        let out = self.script("start");
        assert!(
            out.status.success(),
            "private registry start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn stop(&self) {
        let out = self.script("stop");
        assert!(out.status.success(), "stop: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/apis/ccompat/v7", self.port)
    }
}

impl Drop for PrivateRegistry {
    fn drop(&mut self) {
        let _ = self.script("stop");
    }
}

/// The shared distribution cache (so the private instance needs no download); each port
/// has a run directory of its own.
fn private_registry_home() -> PathBuf {
    std::env::var("SLUICE_REGISTRY_HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo_root().join(".local/schema-registry"))
}

/// `POST path` with a JSON body on 127.0.0.1:port: (status, JSON answer).
fn http_post(port: u16, path: &str, body: &str) -> (u16, Value) {
    http(port, "POST", path, Some(body))
}

fn register(url: &str, subject: &str, schema_file: &Path) -> u32 {
    // A registry that just started may accept a connection and never answer it (seen
    // under load): each attempt has a deadline, and registering the same schema again
    // gives the same id, so a retry is safe.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match try_register(url, subject, schema_file) {
            Ok(id) => return id,
            Err(e) if Instant::now() < deadline => {
                eprintln!("registering {} under {subject}: {e}; trying again", schema_file.display());
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("registering {} under {subject}: {e}", schema_file.display()),
        }
    }
}

fn try_register(url: &str, subject: &str, schema_file: &Path) -> Result<u32, String> {
    let (port, base) = registry_port_and_path(url);
    let body = json!({"schema": std::fs::read_to_string(schema_file).expect("schema")}).to_string();
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).map_err(|e| format!("connect: {e}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    write!(
        s,
        "POST {base}/subjects/{subject}/versions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .map_err(|e| format!("write: {e}"))?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).map_err(|e| format!("no answer within 10 s ({e})"))?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
    let v: Value = serde_json::from_str(body).map_err(|e| format!("register answer {raw:?}: {e}"))?;
    v["id"].as_u64().map(|id| id as u32).ok_or_else(|| format!("no id in {v}"))
}

fn outage(env: Env) {
    if !require_schema_registry() {
        return;
    }
    let registry = PrivateRegistry { port: free_port(), management: free_port(), home: private_registry_home() };
    registry.start();
    let url = registry.url();
    let env = registry_env(env, &url);
    let subject = format!("{}-value", env.log_topic());
    let records = workload(&env, 60, 13);
    let (before, during) = records.split_at(20);

    let http_port = free_port();
    let listen = format!("127.0.0.1:{http_port}");
    let mut replica = env.spawn_replica("r1", &[("SLUICE_HTTP", listen.as_str())]);
    // The replica registered v1 at start (id 1 on the fresh instance).
    env.produce(&sluice_integration_tests::jsonl_lines(before));
    env.wait_caught_up(Duration::from_secs(120));
    let v1_id = register(&url, &subject, &path(V1));
    let v2_id = register(&url, &subject, &path(V2));
    assert_ne!(v1_id, v2_id);

    // The registry goes away; records written with v2 (never seen by the replica) arrive.
    registry.stop();
    let stopped = Instant::now();
    let lines: Vec<Value> = during
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let v2 = i % 3 != 1;
            json!({"schema": if v2 { "v2" } else { "v1" }, "key": r.collection_id,
                   "record": avro_dict(r, v2.then_some(Some("t")))})
        })
        .collect();
    let schemas = [("v1", v1_id.to_string(), path(V1)), ("v2", v2_id.to_string(), path(V2))];
    python_produce(&env, "", &schemas, &lines, Serializer::Fastavro);
    let offsets = log_offsets(&env);
    assert_eq!(offsets.len(), records.len());
    let first_v2 = offsets[before.len()];
    replica.wait_for_log("writer schema unavailable", Duration::from_secs(30));
    // Keep it away for 10 s; the partition waits below the first record it cannot read.
    std::thread::sleep(Duration::from_secs(10).saturating_sub(stopped.elapsed()));
    let rows = env.offsets();
    assert_eq!(rows[0]["sysdb_next_offset"].as_i64(), Some(first_v2), "the partition waits, nothing skipped: {rows:?}");
    // The replica is not ready, and says which partition waits for what.
    let (status, _, body) = http_get(http_port, "/readyz").expect("/readyz answers");
    assert_eq!(status, 503, "/readyz while a partition waits for the registry: {body}");
    assert!(
        body.contains(&format!("partition 0 waits for the schema registry: batch [{first_v2}, ")),
        "/readyz names the waiting partition and its batch: {body}"
    );

    // Back (empty, in memory): the same registrations in the same order get the same ids.
    registry.start();
    assert_eq!(register(&url, &subject, &path(V1)), v1_id);
    assert_eq!(register(&url, &subject, &path(V2)), v2_id);
    env.wait_caught_up(Duration::from_secs(120));
    let (status, _, body) = http_get(http_port, "/readyz").expect("/readyz answers");
    assert_eq!(status, 200, "ready again once the registry answers: {body}");
    replica.terminate(Duration::from_secs(30));
    assert_eq!(dlq_entries(&env), vec![], "nothing in the DLQ while the registry was away");
    let log: Vec<(i64, LogRecord)> = offsets.into_iter().zip(records.iter().cloned()).collect();
    assert_state_is_model(&env, &log);
}

both_backends!(registry_outage_waits, outage);

// ------------------------------------------------------------------------------- CLI ----

#[test]
fn schema_cli_show_and_check() {
    if !require_kafka() || !require_schema_registry() {
        return;
    }
    let url = schema_registry_url();
    let env = Env::sqlite("schema-cli")
        .with_kafka("framing = \"confluent\"\n")
        .with_sections(&format!("[schema_registry]\nurl = \"{url}\"\npassword = \"hunter2\"\n"));
    let show =
        |env: &Env| -> Value { serde_json::from_str(&env.run(&["schema", "show", "--format", "json"])).unwrap() };
    assert_eq!(show(&env), json!([]), "a fresh subject has no versions");
    let check = |file: &Path| env.cmd().args(["schema", "check"]).arg(file).output().expect("schema check");
    let ok = check(&path(V2));
    assert!(ok.status.success(), "{}", String::from_utf8_lossy(&ok.stderr));
    // Register v1 (as every writer does at start), then check v2 (compatible) and BAD.
    let v1_id = register(&url, &format!("{}-value", env.log_topic()), &path(V1));
    let ok = check(&path(V2));
    assert!(ok.status.success(), "v2 is BACKWARD-compatible with v1: {}", String::from_utf8_lossy(&ok.stderr));
    let refused = check(&bad_schema_file(&env));
    assert_eq!(refused.status.code(), Some(1), "{}", String::from_utf8_lossy(&refused.stderr));
    assert!(String::from_utf8_lossy(&refused.stdout).contains("NOT compatible"));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("would be refused by the registry"));
    // Without `operation`: the registry's BACKWARD rule accepts it (the new schema reads
    // old data), but Sluice could not read data written with it.
    let v1_text = std::fs::read_to_string(path(V1)).unwrap();
    let mut no_op: Value = serde_json::from_str(&v1_text).unwrap();
    no_op["fields"].as_array_mut().unwrap().retain(|f| f["name"] != "operation");
    let no_op_file = env.dir.join("no-operation.avsc");
    std::fs::write(&no_op_file, no_op.to_string()).unwrap();
    let refused = check(&no_op_file);
    let (stdout, stderr) = (String::from_utf8_lossy(&refused.stdout), String::from_utf8_lossy(&refused.stderr));
    assert_eq!(refused.status.code(), Some(1), "{stdout}{stderr}");
    assert!(stdout.contains("compatible with every version"), "the registry accepts it: {stdout}");
    assert!(stdout.contains("Sluice CANNOT read"), "{stdout}");
    assert!(stderr.contains("would go to the DLQ"), "{stderr}");
    let v = show(&env);
    assert_eq!(v[0]["id"], json!(v1_id), "{v}");
    assert_eq!(v[0]["version"], json!(1), "{v}");
    // The password never shows.
    let shown = env.run(&["config", "show"]);
    assert!(shown.contains("\"***\"") && !shown.contains("hunter2"), "{shown}");
    // A registry with plain framing is refused at load.
    let plain = Env::sqlite("schema-cli-plain").with_sections(&format!("[schema_registry]\nurl = \"{url}\"\n"));
    let out = plain.cmd().args(["config", "show"]).output().expect("config show");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("framing"));
}

// ------------------------------------------------------------------------------ Java ----

/// `java -cp <classpath> RegistryProducer.java ...` (docs/producing.md's Java example):
/// the classpath from `mvn dependency:build-classpath` of its pom.
fn java_produce(env: &Env, url: &str, schema: &str, records: &[LogRecord]) -> Vec<u32> {
    let project = repo_root().join("integration-tests/java/registry-producer");
    let cp_file = env.dir.join("java-classpath.txt");
    if !cp_file.exists() {
        let out = Command::new("mvn")
            .args(["-B", "-q", "dependency:build-classpath"])
            .arg(format!("-Dmdep.outputFile={}", cp_file.display()))
            .current_dir(&project)
            .output()
            .expect("run mvn (apt-get install -y maven)");
        assert!(
            out.status.success(),
            "mvn dependency:build-classpath failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
    }
    let cp = std::fs::read_to_string(&cp_file).expect("classpath");
    let tsv: Vec<String> = records
        .iter()
        .map(|r| {
            let emb = r
                .embedding
                .as_ref()
                .map_or("-".to_string(), |e| e.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(","));
            let md = r.metadata.as_ref().map_or("-".to_string(), |m| {
                m.iter()
                    .map(|(k, v)| match v {
                        sluice::record::MetaValue::String(s) => format!("{k}={s}"),
                        other => panic!("the Java example writes string metadata only, not {other:?}"),
                    })
                    .collect::<Vec<_>>()
                    .join(";")
            });
            let doc = r.document.clone().unwrap_or_else(|| "-".into());
            format!("{}\t{}\t{}\t{emb}\t{doc}\t{md}", r.collection_id, r.id, r.operation.symbol())
        })
        .collect();
    let input = env.dir.join(format!("java-{}.tsv", suffix()));
    std::fs::write(&input, tsv.join("\n")).expect("tsv");
    let out = Command::new("java")
        .arg("-cp")
        .arg(cp.trim())
        .arg(project.join("src/main/java/sluice/example/RegistryProducer.java"))
        .args([brokers(), env.log_topic(), url.to_string(), format!("{}-value", env.log_topic())])
        .arg(path(schema))
        .arg(&input)
        .output()
        .expect("run java");
    assert!(
        out.status.success(),
        "RegistryProducer failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| l.split(' ').nth(2).expect("id column").parse().expect("id"))
        .collect()
}

#[test]
fn java_producer_v1_and_v2() {
    if !require_kafka() || !require_schema_registry() {
        return;
    }
    let url = schema_registry_url();
    let env = registry_env(Env::sqlite("schema-java"), &url);
    let ops = [sluice::record::Operation::Add, sluice::record::Operation::Upsert, sluice::record::Operation::Update];
    let records: Vec<LogRecord> = (0..24)
        .map(|i| {
            let mut r = LogRecord::data(format!("{}-c{}", env.prefix, i % 2), format!("r{}", i % 5), ops[i % 3]);
            if i % 7 == 6 {
                r.operation = sluice::record::Operation::Delete;
                return r;
            }
            r.embedding = Some(vec![i as f32, -(i as f32), 0.5, 1e-3].into());
            r.document = (i % 2 == 0).then(|| format!("doc {i}"));
            r.metadata =
                Some([("k".to_string(), sluice::record::MetaValue::String(format!("v{i}")))].into_iter().collect());
            r
        })
        .collect();
    let mut ids = java_produce(&env, &url, V1, &records[..8]);
    ids.extend(java_produce(&env, &url, V2, &records[8..16]));
    ids.extend(java_produce(&env, &url, V1, &records[16..]));
    assert_ne!(ids[0], ids[8], "v1 and v2 have their own ids");
    let offsets = log_offsets(&env);
    assert_eq!(offsets.len(), records.len());
    let mut replica = env.spawn_replica("r1", &[]);
    env.wait_caught_up(Duration::from_secs(120));
    replica.terminate(Duration::from_secs(30));
    assert_eq!(dlq_entries(&env), vec![], "nothing in the DLQ");
    let log: Vec<(i64, LogRecord)> = offsets.into_iter().zip(records).collect();
    assert_state_is_model(&env, &log);
}
