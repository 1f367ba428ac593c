//! The SQL read interface (docs/reading.md, "Reading with SQL") end to end, on SQLite and
//! on PostgreSQL. After a workload with attached functions (one detached again), read
//! from a connection of the test's own while the replica runs:
//!
//! - `sluice_records` holds exactly the reference model's records (ids, the embeddings'
//!   bytes, metadata value by value and double by double, documents, offsets), decoded
//!   as docs/reading.md describes the columns, and for every collection, function outputs
//!   included, exactly what `sluice records` prints;
//! - `sluice_collections`, `sluice_positions` and `sluice_functions` equal `collections
//!   list`, `offsets show` and `functions list`; `sluice_views_version` answers 2;
//! - every view has the columns, column order and types of docs/reading.md's tables (on
//!   SQLite, the storage class of every value);
//! - the SQL of every panel of the Grafana dashboard over the views
//!   (deploy/grafana/dashboards/sluice-sysdb.json) answers what Sluice's own reads say.
//!
//! On SQLite the views are read, in one read transaction on a read-only connection, while
//! the records delta holds unmerged rows (some keys changed twice there), after merges and
//! after compactions moved values in the value log: the state `sluice records` folds
//! together at read time.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::{json, Value};
use sluice::record::{LogRecord, MetaValue, Metadata, Operation, Record};
use sluice_integration_tests::{
    assert_records_match_model, both_backends, model_log, small_workload, Env, LogProducer,
};

const WAIT: Duration = Duration::from_secs(180);
const PARTITIONS: u32 = 2;

/// One value of a view's column, as either backend returns it.
#[derive(Debug, Clone, PartialEq)]
enum Cell {
    Null,
    Int(i64),
    Bool(bool),
    Text(String),
    Bytes(Vec<u8>),
}

impl Cell {
    fn int(&self) -> Option<i64> {
        match self {
            Cell::Int(i) => Some(*i),
            Cell::Null => None,
            other => panic!("not an integer: {other:?}"),
        }
    }
    fn text(&self) -> Option<&str> {
        match self {
            Cell::Text(s) => Some(s),
            Cell::Null => None,
            other => panic!("not text: {other:?}"),
        }
    }
    fn bytes(&self) -> Option<&[u8]> {
        match self {
            Cell::Bytes(b) => Some(b),
            Cell::Null => None,
            other => panic!("not bytes: {other:?}"),
        }
    }
    /// A boolean column: `boolean` on PostgreSQL, `1` or `0` on SQLite.
    fn flag(&self) -> bool {
        match self {
            Cell::Bool(b) => *b,
            Cell::Int(0) => false,
            Cell::Int(1) => true,
            other => panic!("not a boolean: {other:?}"),
        }
    }
    /// The SQLite storage class of the value (`typeof()`), None for NULL.
    fn sqlite_class(&self) -> Option<&'static str> {
        match self {
            Cell::Null => None,
            Cell::Int(_) => Some("INTEGER"),
            Cell::Text(_) => Some("TEXT"),
            Cell::Bytes(_) => Some("BLOB"),
            Cell::Bool(_) => panic!("SQLite has no boolean values"),
        }
    }
}

/// A result: its column names and rows.
#[derive(Debug)]
struct Rows {
    columns: Vec<String>,
    rows: Vec<Vec<Cell>>,
}

impl Rows {
    /// The rows by column name.
    fn maps(&self) -> Vec<BTreeMap<String, Cell>> {
        self.rows.iter().map(|r| self.columns.iter().cloned().zip(r.iter().cloned()).collect()).collect()
    }
}

/// A connection of the test's own to the sysdb: what `sqlite3` or `psql` would open.
enum Db {
    Sqlite(rusqlite::Connection),
    Postgres { rt: tokio::runtime::Runtime, client: tokio_postgres::Client },
}

impl Db {
    fn open(env: &Env) -> Db {
        match env.sysdb.strip_prefix("sqlite://") {
            // Read-only, as docs/reading.md tells a reader to open it.
            Some(path) => Db::Sqlite(
                rusqlite::Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)
                    .expect("open the SQLite sysdb read-only"),
            ),
            None => {
                let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
                let (client, conn) =
                    rt.block_on(tokio_postgres::connect(&env.sysdb, tokio_postgres::NoTls)).expect("connect");
                rt.spawn(conn);
                Db::Postgres { rt, client }
            }
        }
    }

    fn is_sqlite(&self) -> bool {
        matches!(self, Db::Sqlite(_))
    }

    fn execute(&self, sql: &str) {
        match self {
            Db::Sqlite(c) => c.execute_batch(sql).unwrap_or_else(|e| panic!("{sql}: {e}")),
            Db::Postgres { rt, client } => {
                rt.block_on(client.batch_execute(sql)).unwrap_or_else(|e| panic!("{sql}: {e}"))
            }
        }
    }

    fn query(&self, sql: &str) -> Rows {
        match self {
            Db::Sqlite(c) => {
                use rusqlite::types::ValueRef;
                let mut stmt = c.prepare(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                let columns: Vec<String> = stmt.column_names().iter().map(|s| s.to_string()).collect();
                let n = columns.len();
                let rows = stmt
                    .query_map([], |r| {
                        (0..n)
                            .map(|i| {
                                Ok(match r.get_ref(i)? {
                                    ValueRef::Null => Cell::Null,
                                    ValueRef::Integer(v) => Cell::Int(v),
                                    ValueRef::Real(v) => {
                                        panic!("{sql}: column {i} holds a REAL ({v}), no view has one")
                                    }
                                    ValueRef::Text(t) => Cell::Text(String::from_utf8(t.to_vec()).expect("UTF-8 text")),
                                    ValueRef::Blob(b) => Cell::Bytes(b.to_vec()),
                                })
                            })
                            .collect::<rusqlite::Result<Vec<Cell>>>()
                    })
                    .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
                    .unwrap_or_else(|e| panic!("{sql}: {e}"));
                Rows { columns, rows }
            }
            Db::Postgres { rt, client } => {
                use tokio_postgres::types::Type;
                let stmt = rt.block_on(client.prepare(sql)).unwrap_or_else(|e| panic!("{sql}: {e}"));
                let columns: Vec<String> = stmt.columns().iter().map(|c| c.name().to_string()).collect();
                let rows = rt.block_on(client.query(&stmt, &[])).unwrap_or_else(|e| panic!("{sql}: {e}"));
                let cell = |row: &tokio_postgres::Row, i: usize| -> Cell {
                    let t = row.columns()[i].type_();
                    let cell = match *t {
                        Type::TEXT | Type::VARCHAR | Type::NAME => row.get::<_, Option<String>>(i).map(Cell::Text),
                        Type::INT4 => row.get::<_, Option<i32>>(i).map(|v| Cell::Int(v.into())),
                        Type::INT8 => row.get::<_, Option<i64>>(i).map(Cell::Int),
                        Type::BOOL => row.get::<_, Option<bool>>(i).map(Cell::Bool),
                        Type::BYTEA => row.get::<_, Option<Vec<u8>>>(i).map(Cell::Bytes),
                        _ => panic!("{sql}: column {i} has the type {t}, which no view has"),
                    };
                    cell.unwrap_or(Cell::Null)
                };
                let rows = rows.iter().map(|r| (0..columns.len()).map(|i| cell(r, i)).collect()).collect();
                Rows { columns, rows }
            }
        }
    }

    /// `(column, type)` of a view as the database declares it: the PostgreSQL type name
    /// (`information_schema`), or on SQLite the column names only (views declare no type).
    fn declared_columns(&self, view: &str) -> Vec<(String, String)> {
        let sql = match self {
            Db::Sqlite(_) => format!("SELECT name, '' FROM pragma_table_info('{view}') ORDER BY cid"),
            Db::Postgres { .. } => format!(
                "SELECT column_name::text, data_type::text FROM information_schema.columns
                 WHERE table_schema = current_schema() AND table_name = '{view}' ORDER BY ordinal_position"
            ),
        };
        self.query(&sql)
            .rows
            .into_iter()
            .map(|r| (r[0].text().unwrap().to_string(), r[1].text().unwrap().to_string()))
            .collect()
    }
}

/// A view's documented columns: `(column, SQLite class, PostgreSQL type)`.
type Documented = Vec<(String, String, String)>;

/// The tables of docs/reading.md, "Reading with SQL": per `### `view`` heading, its rows.
fn documented_views() -> BTreeMap<String, Documented> {
    let path = sluice_integration_tests::repo_root().join("docs/reading.md");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let mut views: BTreeMap<String, Documented> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if line.starts_with('#') {
            current = line.strip_prefix("### `").and_then(|l| l.strip_suffix('`')).map(str::to_string);
            if let Some(v) = &current {
                views.insert(v.clone(), Vec::new());
            }
        } else if let (Some(v), true) = (&current, line.starts_with("| `")) {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            assert!(cells.len() >= 5, "docs/reading.md, {v}: a column row needs 4 cells: {line}");
            let column = cells[1].trim_matches('`').to_string();
            views.get_mut(v).expect("view").push((column, cells[2].to_string(), cells[3].to_string()));
        }
    }
    assert!(views.len() >= 5, "docs/reading.md documents the views: {views:?}");
    views
}

/// A stored metadata text decoded as docs/reading.md describes it: a JSON object whose
/// integers are longs, whose numbers with a fraction or an exponent are doubles and
/// whose `{"f64": ...}` objects are the doubles JSON cannot write.
fn decode_metadata(text: Option<&str>) -> Metadata {
    let mut metadata = Metadata::new();
    let Some(text) = text else { return metadata };
    let v: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("metadata {text:?} is not JSON: {e}"));
    let object = v.as_object().unwrap_or_else(|| panic!("metadata {text:?} is not an object"));
    assert!(!object.is_empty(), "metadata without keys is NULL, not {text:?}");
    for (k, v) in object {
        let value = match v {
            Value::String(s) => MetaValue::String(s.clone()),
            Value::Bool(b) => MetaValue::Bool(*b),
            Value::Number(n) if n.is_i64() => MetaValue::Long(n.as_i64().unwrap()),
            Value::Number(n) if n.is_f64() => MetaValue::Double(n.as_f64().unwrap()),
            Value::Object(o) if o.len() == 1 => MetaValue::Double(match o.get("f64").and_then(Value::as_str) {
                Some("NaN") => f64::NAN,
                Some("Infinity") => f64::INFINITY,
                Some("-Infinity") => f64::NEG_INFINITY,
                _ => panic!("metadata {text:?}: {k} is an unknown object"),
            }),
            other => panic!("metadata {text:?}: {k} is {other}, not a documented value"),
        };
        metadata.insert(k.clone(), value);
    }
    metadata
}

/// A row of `sluice_records` as a record: `(collection, record)`.
fn view_record(row: &BTreeMap<String, Cell>) -> (String, Record) {
    let embedding = row["embedding"].bytes().map(|b| {
        assert_eq!(b.len() % 4, 0, "an embedding is packed f32: {} bytes", b.len());
        b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
    });
    let record = Record {
        id: row["id"].text().expect("id").to_string(),
        embedding,
        metadata: decode_metadata(row["metadata"].text()),
        document: row["document"].text().map(str::to_string),
        offset: row["last_offset"].int().expect("last_offset"),
    };
    let dimension = record.embedding.as_ref().map(|e| e.len() as i64);
    assert_eq!(row["dimension"].int(), dimension, "dimension of {}", record.id);
    (row["collection"].text().expect("collection").to_string(), record)
}

/// Everything of a record, doubles by their bits, embeddings by their bytes.
fn exact(r: &Record) -> String {
    let embedding = r.embedding.as_ref().map(|e| format!("{:02x?}", e.as_le_bytes()));
    let metadata: Vec<String> = r
        .metadata
        .iter()
        .map(|(k, v)| match v {
            MetaValue::Double(d) => format!("{k}=d:{:016x}", d.to_bits()),
            other => format!("{k}={other:?}"),
        })
        .collect();
    format!("{} {embedding:?} {metadata:?} {:?} @{}", r.id, r.document, r.offset)
}

/// Records no workload generates: no value at all, only a document, only an embedding
/// with a negative zero and a subnormal, metadata of every kind (integral and negative
/// zero doubles, the largest long, text that needs JSON escapes); a key changed twice and
/// one deleted and added again (read from the delta on SQLite).
fn odd_records(prefix: &str) -> Vec<LogRecord> {
    let c = format!("{prefix}-odd");
    let record = |id: &str, op| LogRecord::data(c.clone(), id, op);
    let mut bare = record("bare", Operation::Upsert);
    bare.metadata = None;
    let mut document = record("document-only", Operation::Upsert);
    document.document = Some("a document, and nothing else: ü \"quoted\"\n".into());
    let mut embedding = record("embedding-only", Operation::Upsert);
    embedding.embedding = Some(vec![0.5, -0.0, 1e-40, -3.25].into_iter().collect());
    let mut metadata = record("metadata", Operation::Upsert);
    let mut m = Metadata::new();
    m.insert("integral".into(), MetaValue::Double(1.0));
    m.insert("negative zero".into(), MetaValue::Double(-0.0));
    m.insert("tiny".into(), MetaValue::Double(5e-324));
    m.insert("long".into(), MetaValue::Long(i64::MAX));
    m.insert("yes".into(), MetaValue::Bool(true));
    m.insert("text".into(), MetaValue::String("tab\there, \"quotes\", \\ and ü".into()));
    metadata.metadata = Some(m);
    let mut twice = record("twice", Operation::Upsert);
    twice.document = Some("first".into());
    let mut again = record("twice", Operation::Upsert);
    again.document = Some("second".into());
    again.embedding = Some(vec![1.0, 2.0, 3.0, 4.0].into_iter().collect());
    let gone = record("document-only", Operation::Delete);
    let mut back = record("document-only", Operation::Add);
    back.document = Some("added again".into());
    vec![bare, document, embedding, metadata, twice, again, gone, back]
}

/// A cell as JSON, a boolean column (`halted`) as a boolean on both backends.
fn cell_json(column: &str, cell: &Cell) -> Value {
    match cell {
        _ if column == "halted" => json!(cell.flag()),
        Cell::Null => Value::Null,
        Cell::Int(i) => json!(i),
        Cell::Bool(b) => json!(b),
        Cell::Text(t) => json!(t),
        Cell::Bytes(b) => panic!("{column}: {} bytes where a panel shows a value", b.len()),
    }
}

/// `(title, SQL)` of every panel of the Grafana dashboard over the views.
fn dashboard_sql() -> Vec<(String, String)> {
    let path = sluice_integration_tests::repo_root().join("deploy/grafana/dashboards/sluice-sysdb.json");
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("the dashboard")).unwrap();
    let mut panels = Vec::new();
    for p in dashboard["panels"].as_array().expect("panels") {
        for t in p["targets"].as_array().expect("targets") {
            let title = p["title"].as_str().expect("title").to_string();
            panels.push((title, t["rawSql"].as_str().expect("rawSql").to_string()));
        }
    }
    panels
}

fn produce(env: &Env, records: &[LogRecord]) {
    let producer = LogProducer::new(env, PARTITIONS, 1 << 20);
    for r in records {
        producer.send(r);
    }
    producer.flush();
}

fn json_rows(out: &str) -> Vec<Value> {
    serde_json::from_str::<Value>(out).expect("JSON").as_array().expect("a JSON array").clone()
}

both_backends!(views_equal_what_sluice_reads, views_equal_what_sluice_reads);
fn views_equal_what_sluice_reads(env: Env) {
    // Small merges and eager compaction (SQLite only): the views read a records table
    // that merges rewrote and values that compactions copied forward.
    let env =
        env.with_sections("[sqlite]\ndelta_max_rows = 300\ndead_value_ratio = 0.25\ndead_value_slack_bytes = 0\n");
    env.run(&["init", "--partitions", &PARTITIONS.to_string()]);
    let _replica = env.spawn_replica("r1", &[]);
    let mut log = small_workload(3_000, 44, &env.prefix, 3);
    produce(&env, &log);
    env.wait_caught_up(WAIT);
    let c0 = format!("{}-c0", env.prefix);
    let c1 = format!("{}-c1", env.prefix);
    let attach = |collection: &str, function: &str, output: &str| -> String {
        let out = env.run(&[
            "functions",
            "attach",
            collection,
            "--function",
            function,
            "--output",
            output,
            "--format",
            "json",
        ]);
        let v: Value = serde_json::from_str(out.trim()).expect("attach JSON");
        v["function_id"].as_str().expect("function_id").to_string()
    };
    let counter = attach(&c0, "record_counter", &format!("{c0}-count"));
    let stats = attach(&c1, "statistics", &format!("{c1}-stats"));
    let normalized = attach(&c1, "normalize", &format!("{c1}-normalized"));
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let functions = json_rows(&env.run(&["functions", "list", "--format", "json"]));
        if functions.iter().all(|f| f["status"] == "ready") {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the functions never became ready: {functions:?}");
        std::thread::sleep(Duration::from_millis(200));
    }
    env.run(&["functions", "detach", &normalized]);
    // Live changes after the backfills, then the odd records last.
    let more = small_workload(600, 45, &env.prefix, 3);
    produce(&env, &more);
    log.extend(more);
    let odd = odd_records(&env.prefix);
    produce(&env, &odd);
    log.extend(odd);
    env.wait_caught_up(WAIT);

    let db = Db::open(&env);
    if db.is_sqlite() {
        // The last transactions went to the delta; if a merge took them, change one key
        // twice more (a merge only comes after `delta_max_rows` rows).
        for round in 0..3 {
            let rows = db.query("SELECT count(DISTINCT collection_id || '/' || id), count(*) FROM record_delta");
            let (keys, rows) = (rows.rows[0][0].int().unwrap(), rows.rows[0][1].int().unwrap());
            if keys > 0 && rows > keys {
                break;
            }
            assert!(round < 2, "the delta never held a key changed twice ({keys} keys, {rows} rows)");
            let mut again: Vec<LogRecord> = odd_records(&env.prefix).into_iter().skip(4).take(2).collect();
            again[1].document = Some(format!("second, round {round}"));
            produce(&env, &again);
            log.extend(again);
            env.wait_caught_up(WAIT);
        }
    }
    // Sluice's own reads equal the model (the CLI's records, counts and positions).
    assert_records_match_model(&env, &log);

    // The views, in one snapshot.
    db.execute(if db.is_sqlite() { "BEGIN" } else { "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" });
    let records = db.query(
        "SELECT collection, id, embedding, dimension, metadata, document, last_offset FROM sluice_records
         ORDER BY collection, id",
    );
    let collections = db.query("SELECT * FROM sluice_collections ORDER BY id");
    let positions = db.query("SELECT * FROM sluice_positions ORDER BY topic, partition");
    let functions = db.query("SELECT * FROM sluice_functions ORDER BY created_at_ms, id");
    let version = db.query("SELECT * FROM sluice_views_version");
    let everything: BTreeMap<String, Rows> =
        documented_views().keys().map(|v| (v.clone(), db.query(&format!("SELECT * FROM {v}")))).collect();
    let panels: Vec<(String, Rows)> = dashboard_sql().into_iter().map(|(title, sql)| (title, db.query(&sql))).collect();
    if db.is_sqlite() {
        let delta = db.query("SELECT count(*) FROM record_delta").rows[0][0].int().unwrap();
        let merges = db.query("SELECT delta_merges FROM value_log").rows[0][0].int().unwrap();
        let oldest = db.query("SELECT min(seq) FROM record_values").rows[0][0].int().unwrap();
        eprintln!("read over {delta} unmerged delta rows, after {merges} merges; the oldest value is number {oldest}");
        assert!(delta > 0 && merges > 0, "the views were read over merged records and an unmerged delta");
        assert!(oldest > 1, "compaction freed the oldest values of the value log (the oldest left is {oldest})");
    }
    db.execute("COMMIT");

    // sluice_records: the model's records exactly, in (collection, id) byte order.
    let viewed: Vec<(String, Record)> = records.maps().iter().map(view_record).collect();
    let keys: Vec<(&str, &str)> = viewed.iter().map(|(c, r)| (c.as_str(), r.id.as_str())).collect();
    let mut sorted = keys.clone();
    sorted.sort();
    assert_eq!(keys, sorted, "ORDER BY collection, id is byte order");
    let mut by_collection: BTreeMap<&str, Vec<&Record>> = BTreeMap::new();
    for (c, r) in &viewed {
        by_collection.entry(c.as_str()).or_default().push(r);
    }
    let matched = model_log(&env, &log);
    let model = sluice::materialize::model::reference(&matched.log);
    for (c, cm) in &model.collections {
        let expected: Vec<String> = cm.records.values().map(exact).collect();
        let actual: Vec<String> = by_collection.get(c.as_str()).into_iter().flatten().map(|r| exact(r)).collect();
        assert_eq!(actual, expected, "sluice_records of {c} against the reference model");
    }

    // sluice_collections: `collections list`, and each count is its rows in sluice_records.
    let listed_collections = json_rows(&env.run(&["collections", "list", "--format", "json"]));
    let from_view: Vec<Value> = collections
        .maps()
        .iter()
        .map(|c| {
            let id = c["id"].text().unwrap();
            assert!(c["created_at_ms"].int().unwrap() > 0, "created_at_ms of {id}");
            let rows = by_collection.get(id).map_or(0, Vec::len) as i64;
            assert_eq!(c["record_count"].int(), Some(rows), "record_count of {id} against its sluice_records rows");
            json!({
                "id": id,
                "partition": c["partition"].int(),
                "log_position": c["log_position"].int(),
                "records": c["record_count"].int(),
                "dimension": c["dimension"].int(),
            })
        })
        .collect();
    assert_eq!(from_view, listed_collections, "sluice_collections against `sluice collections list`");
    assert!(
        listed_collections.len() >= 5,
        "three workload collections, the odd one and function outputs: {listed_collections:?}"
    );

    // sluice_records of every collection, outputs included: what `sluice records` prints.
    for c in &listed_collections {
        let c = c["id"].as_str().unwrap();
        let printed: Vec<Value> = env
            .run(&["records", c, "--format", "jsonl"])
            .lines()
            .map(|l| serde_json::from_str(l).expect("record JSON"))
            .collect();
        let from_view: Vec<Value> =
            by_collection.get(c).into_iter().flatten().map(|r| sluice::cli::jsonl::record_to_json(r)).collect();
        assert_eq!(from_view, printed, "sluice_records of {c} against `sluice records {c}`");
    }
    for output in [format!("{c0}-count"), format!("{c1}-stats")] {
        assert!(by_collection.get(output.as_str()).is_some_and(|r| !r.is_empty()), "{output} has records");
    }

    // sluice_positions: the sysdb's side of `offsets show`.
    let shown = env.offsets();
    let from_view: Vec<Value> = positions
        .maps()
        .iter()
        .map(|p| {
            assert!(!p["halted"].flag(), "halted");
            assert_eq!(p["halted_reason"], Cell::Null);
            assert!(p["updated_at_ms"].int().unwrap() > 0);
            json!({"topic": p["topic"].text(), "partition": p["partition"].int(), "next_offset": p["next_offset"].int(),
                   "halted_at_ms": p["halted_at_ms"].int()})
        })
        .collect();
    let expected: Vec<Value> = shown
        .iter()
        .map(|o| {
            assert_eq!(o["status"], "running");
            json!({"topic": o["topic"], "partition": o["partition"], "next_offset": o["sysdb_next_offset"],
                   "halted_at_ms": o["halted_at_ms"]})
        })
        .collect();
    assert_eq!(from_view, expected, "sluice_positions against `sluice offsets show`");
    assert_eq!(from_view.len(), PARTITIONS as usize);

    // sluice_functions: `functions list`, detached ones included.
    let listed_functions = json_rows(&env.run(&["functions", "list", "--format", "json"]));
    let from_view: Vec<Value> = functions
        .maps()
        .iter()
        .map(|f| {
            let params: Value = serde_json::from_str(f["params"].text().unwrap()).expect("params JSON");
            assert!(params.as_object().is_some_and(|p| p.values().all(Value::is_string)), "params: {params}");
            assert!(f["updated_at_ms"].int().unwrap() >= f["created_at_ms"].int().unwrap());
            json!({
                "id": f["id"].text(), "collection": f["collection"].text(), "function": f["function"].text(),
                "output": f["output_collection"].text(), "status": f["status"].text(),
                "marker_offset": f["marker_offset"].int(), "backfill_done": f["backfill_done"].int(),
                "backfill_total": f["backfill_total"].int(), "failed_reason": f["failed_reason"].text(),
            })
        })
        .collect();
    assert_eq!(from_view, listed_functions, "sluice_functions against `sluice functions list`");
    let status: BTreeMap<String, String> = listed_functions
        .iter()
        .map(|f| (f["id"].as_str().unwrap().into(), f["status"].as_str().unwrap().into()))
        .collect();
    assert_eq!(status[&counter], "ready");
    assert_eq!(status[&stats], "ready");
    assert_eq!(status[&normalized], "detached");

    assert_eq!(version.rows, vec![vec![Cell::Int(2)]], "sluice_views_version");

    // The Grafana dashboard's panels: their SQL, read from the dashboard, gives Sluice's
    // own answers.
    let mut largest: Vec<&Value> = listed_collections.iter().collect();
    largest.sort_by_key(|c| (-c["records"].as_i64().unwrap(), c["id"].as_str().unwrap().to_string()));
    assert!(!panels.is_empty(), "the dashboard has panels");
    for (title, rows) in &panels {
        let (columns, expected): (&[&str], Vec<Vec<Value>>) = match title.as_str() {
            "Collections and records" => (
                &["collections", "records"],
                vec![vec![
                    json!(listed_collections.len()),
                    json!(listed_collections.iter().map(|c| c["records"].as_i64().unwrap()).sum::<i64>()),
                ]],
            ),
            "Partitions" => (
                &["partition", "next_offset", "halted", "halted_reason", "updated_at_ms"],
                positions
                    .maps()
                    .iter()
                    .map(|p| {
                        ["partition", "next_offset", "halted", "halted_reason", "updated_at_ms"]
                            .iter()
                            .map(|c| cell_json(c, &p[*c]))
                            .collect()
                    })
                    .collect(),
            ),
            "Records per collection" => (
                &["collection", "records"],
                largest.iter().take(20).map(|c| vec![c["id"].clone(), c["records"].clone()]).collect(),
            ),
            "Attached functions" => (
                &["function", "collection", "output_collection", "status", "backfill_done", "backfill_total"],
                listed_functions
                    .iter()
                    .filter(|f| f["status"] != "detached")
                    .map(|f| {
                        ["function", "collection", "output", "status", "backfill_done", "backfill_total"]
                            .iter()
                            .map(|k| f[*k].clone())
                            .collect()
                    })
                    .collect(),
            ),
            other => panic!("panel {other:?} of the dashboard: this test does not know what it must show"),
        };
        assert_eq!(rows.columns, columns, "the columns of panel {title:?}");
        let actual: Vec<Vec<Value>> =
            rows.rows.iter().map(|r| r.iter().zip(columns).map(|(cell, c)| cell_json(c, cell)).collect()).collect();
        assert_eq!(actual, expected, "panel {title:?} of the dashboard");
    }

    // Columns, their order and their types: docs/reading.md's tables.
    for (view, documented) in documented_views() {
        let names: Vec<&str> = documented.iter().map(|(c, _, _)| c.as_str()).collect();
        let declared = db.declared_columns(&view);
        let declared_names: Vec<&str> = declared.iter().map(|(c, _)| c.as_str()).collect();
        assert_eq!(declared_names, names, "the columns of {view}");
        let rows = &everything[&view];
        assert_eq!(rows.columns, names, "SELECT * FROM {view}");
        assert!(!rows.rows.is_empty(), "{view} has rows to check the types of");
        for (i, (column, sqlite, postgres)) in documented.iter().enumerate() {
            if db.is_sqlite() {
                for row in &rows.rows {
                    if let Some(class) = row[i].sqlite_class() {
                        assert_eq!(class, sqlite, "{view}.{column}: a value of storage class {class}");
                    }
                }
            } else {
                assert_eq!(&declared[i].1, postgres, "the type of {view}.{column}");
            }
        }
    }
}
