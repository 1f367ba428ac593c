//! SQL-only benchmark of SQLite storage layouts for the `records` table.
//!
//! Generates a W1-shaped log deterministically (the same splitmix64 stream and record shape
//! as Sluice's `record/src/workload.rs`: 64 collections x 1,000 ids, 384-dim f32 embeddings,
//! 70% upsert / 20% update / 10% delete), folds each transaction's records into their
//! final state per id the way Sluice's materializer does (update and delete of an absent id
//! are ignored, metadata merges key by key), and writes them with the pragmas of Sluice's
//! SQLite backend: one write transaction per `--tx` log records, each with the position
//! compare-and-set read, a `collections` upsert per touched collection and a position
//! upsert at the end. No Kafka, no decoding.
//!
//! Every run starts from a fresh database file. At the end the live rows are digested and
//! compared with the in-memory model; the program exits non-zero if any layout differs.

use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

// ---------------------------------------------------------------------------------------
// Sluice's SQLite settings (src/sysdb/sqlite/).

const CACHE_SIZE_KIB: i64 = 64 * 1024;
const CHECKPOINTER_CACHE_KIB: i64 = 2 * 1024;
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(200);
const WAL_AUTOCHECKPOINT_PAGES: i64 = 40_000;
const WAL_RESTART_PAGES: i64 = 16_384;
const WAL_RESTART_BUSY: Duration = Duration::from_millis(200);
const WAL_SIZE_LIMIT: i64 = 320 << 20;
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const TOPIC: &str = "bench.log";
const COLLECTIONS: usize = 64;
const DIM: usize = 384;

fn configure(conn: &Connection, page_size: i64) -> rusqlite::Result<()> {
    conn.busy_timeout(BUSY_TIMEOUT)?;
    conn.pragma_update(None, "page_size", page_size)?;
    let mode: String = conn.pragma_update_and_check(None, "journal_mode", "WAL", |r| r.get(0))?;
    assert!(mode.eq_ignore_ascii_case("wal"), "journal_mode {mode}");
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "cache_size", -CACHE_SIZE_KIB)?;
    conn.pragma_update(None, "wal_autocheckpoint", WAL_AUTOCHECKPOINT_PAGES)?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    Ok(())
}

/// The background checkpointer of Sluice: PASSIVE every 200 ms, RESTART past 16,384 WAL
/// pages. Returns the thread's CPU time when stopped.
fn spawn_checkpointer(path: &Path, page_size: i64, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Duration> {
    let conn = Connection::open(path).expect("open checkpointer connection");
    configure(&conn, page_size).expect("configure checkpointer");
    conn.pragma_update(None, "cache_size", -CHECKPOINTER_CACHE_KIB).unwrap();
    conn.busy_timeout(WAL_RESTART_BUSY).unwrap();
    std::thread::Builder::new()
        .name("sqlite-checkpoint".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(CHECKPOINT_INTERVAL);
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let checkpoint = |mode: &str| {
                    conn.query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |r| {
                        Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?))
                    })
                };
                let outcome = checkpoint("PASSIVE");
                if matches!(outcome, Ok((_, frames, _)) if frames > WAL_RESTART_PAGES) {
                    let _ = checkpoint("RESTART");
                }
            }
            thread_cpu()
        })
        .expect("spawn checkpointer")
}

// ---------------------------------------------------------------------------------------
// Process accounting without extra crates.

#[repr(C)]
struct Timeval {
    sec: i64,
    usec: i64,
}

#[repr(C)]
struct Rusage {
    utime: Timeval,
    stime: Timeval,
    rest: [i64; 14],
}

extern "C" {
    fn getrusage(who: i32, usage: *mut Rusage) -> i32;
}

fn rusage(who: i32) -> Duration {
    let mut u = Rusage { utime: Timeval { sec: 0, usec: 0 }, stime: Timeval { sec: 0, usec: 0 }, rest: [0; 14] };
    // SAFETY: `u` is a valid, writable struct of the layout the x86_64/aarch64 Linux ABI uses.
    let rc = unsafe { getrusage(who, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    let us = (u.utime.sec + u.stime.sec) * 1_000_000 + u.utime.usec + u.stime.usec;
    Duration::from_micros(us as u64)
}

/// CPU time (user + system) of the calling thread.
fn thread_cpu() -> Duration {
    rusage(1) // RUSAGE_THREAD
}

/// (wchar, write_bytes) of this process from /proc/self/io.
fn proc_io() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find_map(|l| {
                l.strip_prefix(name).and_then(|v| v.trim().strip_prefix(':')).map(|v| v.trim().parse().unwrap_or(0))
            })
            .unwrap_or(0)
    };
    (field("wchar"), field("write_bytes"))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------------------------------
// Workload: the generator of record/src/workload.rs, and the materializer's fold.

struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    fn unit_f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Upsert,
    Update,
    Delete,
}

/// Stored metadata of a live record (the workload's three keys).
#[derive(Clone, Copy)]
struct Meta {
    color: u8,
    rank: u16,
    score: Option<f32>,
}

impl Meta {
    fn json(&self) -> String {
        let color = ["red", "green", "blue"][self.color as usize];
        let mut s = format!("{{\"color\":\"{color}\",\"rank\":{}", self.rank);
        if let Some(score) = self.score {
            let _ = write!(s, ",\"score\":{}", f64::from(score));
        }
        s.push('}');
        s
    }
}

/// A row to store: the final state of one id at the end of a transaction.
struct Row {
    embedding: Vec<u8>,
    metadata: String,
    document: String,
    offset: i64,
}

/// Writes of one transaction: per key (collection index, id index) its final state
/// (`None` = delete), and the sequence of its last change (for log order).
struct TxWrites {
    writes: Vec<((u8, u16), Option<Row>, u64)>,
    /// Net change of live records per collection.
    count_delta: BTreeMap<u8, i64>,
    /// Highest offset per touched collection (the collection's log_position).
    log_position: BTreeMap<u8, i64>,
    records: usize,
}

struct Workload {
    rng: Rng,
    ids_per_collection: usize,
    next_offset: i64,
    /// Live ids and the hash of their stored row.
    live: HashMap<(u8, u16), u64>,
}

fn collection_name(c: u8) -> String {
    format!("collection-{c}")
}

fn id_name(id: u16) -> String {
    format!("id-{id:06}")
}

impl Workload {
    fn new(seed: u64, ids_per_collection: usize) -> Self {
        Workload { rng: Rng(seed), ids_per_collection, next_offset: 0, live: HashMap::new() }
    }

    /// The next `n` log records folded into their final states.
    fn next_tx(&mut self, n: usize) -> TxWrites {
        let mut finals: HashMap<(u8, u16), (Option<Row>, u64)> = HashMap::new();
        let mut count_delta = BTreeMap::new();
        let mut log_position = BTreeMap::new();
        for seq in 0..n as u64 {
            let offset = self.next_offset;
            self.next_offset += 1;
            let rng = &mut self.rng;
            let c = rng.below(COLLECTIONS) as u8;
            let id = rng.below(self.ids_per_collection) as u16;
            let roll = rng.below(100);
            let op = if roll < 70 {
                Op::Upsert
            } else if roll < 90 {
                Op::Update
            } else {
                Op::Delete
            };
            let key = (c, id);
            let live = self.live.get(&key).copied();
            if op == Op::Delete {
                if live.is_some() {
                    self.live.remove(&key);
                    *count_delta.entry(c).or_insert(0) -= 1;
                    finals.insert(key, (None, seq));
                    log_position.insert(c, offset);
                }
                continue;
            }
            let mut embedding = Vec::with_capacity(DIM * 4);
            for _ in 0..DIM {
                embedding.extend_from_slice(&(rng.unit_f32() * 2.0 - 1.0).to_le_bytes());
            }
            let color = rng.below(3) as u8;
            let rank = rng.below(1000) as u16;
            let score = if rng.below(10) == 0 { None } else { Some(rng.unit_f32()) };
            if op == Op::Update && live.is_none() {
                continue; // an update of an absent id is ignored
            }
            // Upsert of a live id and update merge key by key (a null score removes the
            // key), a fresh record drops null keys: every record carries all three keys, so
            // both give the record's own metadata.
            let meta = Meta { color, rank, score };
            let document = format!("document {id} of collection {c}");
            let metadata = meta.json();
            let h = row_hash(&collection_name(c), &id_name(id), Some(&embedding), Some(&metadata), Some(&document));
            if live.is_none() {
                *count_delta.entry(c).or_insert(0) += 1;
            }
            self.live.insert(key, h);
            finals.insert(key, (Some(Row { embedding, metadata, document, offset }), seq));
            log_position.insert(c, offset);
        }
        let writes = finals.into_iter().map(|(k, (row, seq))| (k, row, seq)).collect();
        TxWrites { writes, count_delta, log_position, records: n }
    }

    fn digest(&self) -> (u64, u64) {
        let sum = self.live.values().fold(0u64, |acc, h| acc.wrapping_add(*h));
        (self.live.len() as u64, sum)
    }
}

// ---------------------------------------------------------------------------------------
// Digest of a row (order-independent sum over rows).

fn fnv(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x100_0000_01b3);
    }
    h
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn row_hash(c: &str, id: &str, emb: Option<&[u8]>, md: Option<&str>, doc: Option<&str>) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    for field in [Some(c.as_bytes()), Some(id.as_bytes()), emb, md.map(str::as_bytes), doc.map(str::as_bytes)] {
        match field {
            None => h = fnv(h, &[0xff]),
            Some(b) => {
                h = fnv(h, &(b.len() as u64).to_le_bytes());
                h = fnv(h, b);
            }
        }
    }
    mix(h)
}

/// The 63-bit integer key of layout L3.
fn int_key(c: &str, id: &str) -> i64 {
    let h = fnv(fnv(0xcbf2_9ce4_8422_2325, c.as_bytes()), &[0]);
    (mix(fnv(h, id.as_bytes())) >> 1) as i64
}

// ---------------------------------------------------------------------------------------
// Layouts.

#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    /// rowid table + PRIMARY KEY (collection_id, id) index (today's).
    RowidUnique,
    /// records small (WITHOUT ROWID) + append-only `blobs` for embedding and document.
    Split,
    /// rowid = 63-bit hash of (collection_id, id): one b-tree.
    IntKey,
    /// WITHOUT ROWID clustered on (collection_id, id).
    Clustered,
    /// Like `Split`, but replaced blobs are never looked up or deleted one by one: every
    /// `gc_every` transactions, once the blob table spans more than twice the live records,
    /// the live blobs of its oldest rowids are copied to its end and that rowid range is
    /// deleted at once (a log-structured blob store).
    BlobLog,
    /// Sluice's layout since its value log (`src/sysdb/sqlite/values.rs`): small rows
    /// clustered on (collection_id, id) pointing at `record_values`, an append-only log of
    /// (collection_id, id, embedding, document); at the end of every transaction that
    /// appended values, the oldest values are examined (at least 1,024, twice what it
    /// appended) once the log spans more than 3x the live records + 4,096: the live ones,
    /// found by a key lookup, are copied to the end and re-pointed, the range deleted.
    Values,
    /// `Values` whose small rows are not rewritten in place by every transaction: each
    /// transaction appends its row changes (upserts and deletes) to `record_delta`, a rowid
    /// table with no index, so a small transaction writes the delta's last page or two
    /// instead of one `records` page per row. Once the delta holds `delta_rows` rows, the
    /// transaction that crosses it merges the delta into `records` (the newest change per
    /// key, in key order, so the pages of many transactions' rows are rewritten once),
    /// empties it, and compacts the value log (whose liveness lookup reads `records`,
    /// complete only right after a merge). A reader of a key would look in the delta first
    /// (in Sluice, an in-memory map of the unmerged changes); nothing reads here, as in the
    /// other layouts.
    ValuesDelta,
    /// `Values` with a keyed delta: `record_delta` is clustered on (collection_id, id) like
    /// `records` and holds the newest change of each key since the last merge (a delete
    /// as a NULL `last_offset`), written by upsert. It stays small (at most `delta_rows`
    /// keys), so a small transaction rewrites a few of its pages instead of one `records`
    /// page per row, and a reader finds a key's state in SQL (the delta, else `records`),
    /// with no in-memory overlay. The transaction that finds `delta_rows` or more keys in it
    /// merges it into `records` in key order, empties it and compacts the value log.
    ValuesKeyedDelta,
    /// Not a materialized table: every write appended to a rowid log (a delete as a row of
    /// NULLs). The floor of any layout that writes each record's bytes once, in order.
    AppendOnly,
}

#[derive(Clone, Copy, PartialEq, Debug)]
enum Order {
    /// Order of each id's last change in the log.
    Log,
    /// Sorted by the table's key.
    Key,
}

#[derive(Clone, Debug)]
struct Layout {
    name: String,
    kind: Kind,
    order: Order,
    page_size: i64,
    /// Split: delete replaced blobs every this many transactions.
    gc_every: u64,
    /// ValuesDelta: merge the delta into `records` once it holds this many rows.
    delta_rows: u64,
    /// BlobLog: an index on `records(blob)`, so compaction finds the live blobs of the
    /// oldest range without scanning `records`.
    blob_index: bool,
}

fn parse_layout(spec: &str) -> Result<Layout, String> {
    let (base, page_size) = match spec.split_once('-') {
        Some((b, "4k")) => (b, 4096),
        Some((b, "8k")) => (b, 8192),
        Some((b, "16k")) => (b, 16384),
        Some((b, "32k")) => (b, 32768),
        Some(_) => return Err(format!("unknown page size in {spec:?} (-4k -8k -16k -32k)")),
        None => (spec, 16384),
    };
    let (kind, order, gc_every) = match base {
        "L0" => (Kind::RowidUnique, Order::Log, 1),
        "L1" => (Kind::RowidUnique, Order::Key, 1),
        "L2" => (Kind::Split, Order::Key, 1),
        "L3" => (Kind::IntKey, Order::Key, 1),
        "L4" => (Kind::Clustered, Order::Key, 1),
        "V" => (Kind::Values, Order::Key, 1),
        "A0" => (Kind::AppendOnly, Order::Log, 1),
        _ => match base.strip_prefix("L2g").and_then(|n| n.parse::<u64>().ok()) {
            Some(n) if n > 0 => (Kind::Split, Order::Key, n),
            _ => match base.strip_prefix("L2c").or(base.strip_prefix("L2x")).and_then(|n| n.parse::<u64>().ok()) {
                Some(n) if n > 0 => (Kind::BlobLog, Order::Key, n),
                _ => match base.strip_prefix("Vd").and_then(|n| n.parse::<u64>().ok()) {
                    Some(n) if n > 0 => (Kind::ValuesDelta, Order::Key, n),
                    _ if base.starts_with("Vk") => match base["Vk".len()..].parse::<u64>() {
                        Ok(n) if n > 0 => (Kind::ValuesKeyedDelta, Order::Key, n),
                        _ => return Err(format!("unknown layout {spec:?}")),
                    },
                    _ => return Err(format!("unknown layout {spec:?} (L0 L1 L2 L2g<N> L2c<N> L2x<N> L3 L4 V Vd<N> Vk<N> A0, optional page size suffix -4k -8k -16k -32k; 16k is Sluice's)")),
                },
                },
            },
    };
    let blob_index = base.starts_with("L2x");
    let (gc_every, delta_rows) =
        if matches!(kind, Kind::ValuesDelta | Kind::ValuesKeyedDelta) { (1, gc_every) } else { (gc_every, 0) };
    Ok(Layout { name: spec.to_string(), kind, order, page_size, gc_every, delta_rows, blob_index })
}

const COMMON_SCHEMA: &str = "
CREATE TABLE partitions (
    topic         TEXT    NOT NULL,
    partition     INTEGER NOT NULL,
    next_offset   INTEGER NOT NULL CHECK (next_offset >= 0),
    updated_at_ms INTEGER NOT NULL,
    PRIMARY KEY (topic, partition)
) WITHOUT ROWID;
CREATE TABLE collections (
    id            TEXT    NOT NULL PRIMARY KEY,
    partition     INTEGER NOT NULL,
    dimension     INTEGER NULL,
    log_position  INTEGER NOT NULL DEFAULT -1,
    record_count  INTEGER NOT NULL DEFAULT 0,
    created_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

fn schema(kind: Kind) -> &'static str {
    match kind {
        Kind::RowidUnique => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, embedding BLOB NULL, metadata TEXT NULL,
                document TEXT NULL, last_offset INTEGER NOT NULL, PRIMARY KEY (collection_id, id));"
        }
        Kind::Clustered => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, embedding BLOB NULL, metadata TEXT NULL,
                document TEXT NULL, last_offset INTEGER NOT NULL, PRIMARY KEY (collection_id, id)) WITHOUT ROWID;"
        }
        Kind::IntKey => {
            "CREATE TABLE records (
                k INTEGER PRIMARY KEY, collection_id TEXT NOT NULL, id TEXT NOT NULL, embedding BLOB NULL,
                metadata TEXT NULL, document TEXT NULL, last_offset INTEGER NOT NULL);"
        }
        Kind::AppendOnly => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, embedding BLOB NULL, metadata TEXT NULL,
                document TEXT NULL, last_offset INTEGER NOT NULL);"
        }
        Kind::Split | Kind::BlobLog => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NULL, last_offset INTEGER NOT NULL,
                blob INTEGER NOT NULL, PRIMARY KEY (collection_id, id)) WITHOUT ROWID;
             CREATE TABLE blobs (rowid INTEGER PRIMARY KEY, embedding BLOB NULL, document TEXT NULL);"
        }
        Kind::Values => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NULL, last_offset INTEGER NOT NULL,
                value INTEGER NULL, PRIMARY KEY (collection_id, id)) WITHOUT ROWID;
             CREATE TABLE record_values (seq INTEGER PRIMARY KEY, collection_id TEXT NOT NULL, id TEXT NOT NULL,
                embedding BLOB NULL, document TEXT NULL);"
        }
        Kind::ValuesKeyedDelta => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NULL, last_offset INTEGER NOT NULL,
                value INTEGER NULL, PRIMARY KEY (collection_id, id)) WITHOUT ROWID;
             CREATE TABLE record_values (seq INTEGER PRIMARY KEY, collection_id TEXT NOT NULL, id TEXT NOT NULL,
                embedding BLOB NULL, document TEXT NULL);
             CREATE TABLE record_delta (collection_id TEXT NOT NULL, id TEXT NOT NULL,
                metadata TEXT NULL, last_offset INTEGER NULL, value INTEGER NULL,
                PRIMARY KEY (collection_id, id)) WITHOUT ROWID;"
        }
        Kind::ValuesDelta => {
            "CREATE TABLE records (
                collection_id TEXT NOT NULL, id TEXT NOT NULL, metadata TEXT NULL, last_offset INTEGER NOT NULL,
                value INTEGER NULL, PRIMARY KEY (collection_id, id)) WITHOUT ROWID;
             CREATE TABLE record_values (seq INTEGER PRIMARY KEY, collection_id TEXT NOT NULL, id TEXT NOT NULL,
                embedding BLOB NULL, document TEXT NULL);
             CREATE TABLE record_delta (seq INTEGER PRIMARY KEY, collection_id TEXT NOT NULL, id TEXT NOT NULL,
                metadata TEXT NULL, last_offset INTEGER NULL, value INTEGER NULL);"
        }
    }
}

const UPSERT_RECORD: &str = "INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         embedding = excluded.embedding, metadata = excluded.metadata,
         document = excluded.document, last_offset = excluded.last_offset";
const APPEND_RECORD: &str = "INSERT INTO records (collection_id, id, embedding, metadata, document, last_offset)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const DELETE_RECORD: &str = "DELETE FROM records WHERE collection_id = ?1 AND id = ?2";
// A different (collection_id, id) under the same key updates nothing: changes() = 0.
const UPSERT_INT: &str = "INSERT INTO records (k, collection_id, id, embedding, metadata, document, last_offset)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
     ON CONFLICT (k) DO UPDATE SET
         embedding = excluded.embedding, metadata = excluded.metadata,
         document = excluded.document, last_offset = excluded.last_offset
     WHERE records.collection_id = excluded.collection_id AND records.id = excluded.id";
const DELETE_INT: &str = "DELETE FROM records WHERE k = ?1 AND collection_id = ?2 AND id = ?3";
const SELECT_BLOB: &str = "SELECT blob FROM records WHERE collection_id = ?1 AND id = ?2";
const INSERT_BLOB: &str = "INSERT INTO blobs (embedding, document) VALUES (?1, ?2)";
const UPSERT_SPLIT: &str = "INSERT INTO records (collection_id, id, metadata, last_offset, blob)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         metadata = excluded.metadata, last_offset = excluded.last_offset, blob = excluded.blob";
const DELETE_SPLIT: &str = "DELETE FROM records WHERE collection_id = ?1 AND id = ?2 RETURNING blob";
const DELETE_BLOB: &str = "DELETE FROM blobs WHERE rowid = ?1";
// A delete is a delta row with a NULL blob.
const APPEND_DELTA: &str =
    "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value) VALUES (?1, ?2, ?3, ?4, ?5)";
const UPSERT_KEYED_DELTA: &str = "INSERT INTO record_delta (collection_id, id, metadata, last_offset, value)
     VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         metadata = excluded.metadata, last_offset = excluded.last_offset, value = excluded.value";
const APPEND_VALUE: &str = "INSERT INTO record_values (collection_id, id, embedding, document) VALUES (?1, ?2, ?3, ?4)";
const UPSERT_VALUES: &str =
    "INSERT INTO records (collection_id, id, metadata, last_offset, value) VALUES (?1, ?2, ?3, ?4, ?5)
     ON CONFLICT (collection_id, id) DO UPDATE SET
         metadata = excluded.metadata, last_offset = excluded.last_offset, value = excluded.value";
// The newest change per key (SQLite takes the bare columns from the max() row), in key order.
const READ_DELTA: &str = "SELECT collection_id, id, metadata, last_offset, value, max(seq) FROM record_delta
     GROUP BY collection_id, id ORDER BY collection_id, id";
const UPSERT_COLLECTION: &str =
    "INSERT INTO collections (id, partition, dimension, log_position, record_count, created_at_ms)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
     ON CONFLICT (id) DO UPDATE SET
         dimension = COALESCE(collections.dimension, excluded.dimension),
         log_position = excluded.log_position,
         record_count = collections.record_count + excluded.record_count";
const READ_POSITION: &str = "SELECT next_offset FROM partitions WHERE topic = ?1 AND partition = ?2";
const WRITE_POSITION: &str = "INSERT INTO partitions (topic, partition, next_offset, updated_at_ms) VALUES (?1, ?2, ?3, ?4)
     ON CONFLICT (topic, partition) DO UPDATE SET next_offset = excluded.next_offset, updated_at_ms = excluded.updated_at_ms";

/// Keep the blob table within twice the live records: copy the live blobs of the oldest
/// rowids to the end, then delete that whole range (its pages are freed, not rewritten).
fn compact_blobs(t: &Connection) -> rusqlite::Result<()> {
    let live: i64 = t.query_row("SELECT COALESCE(SUM(record_count), 0) FROM collections", [], |r| r.get(0))?;
    // Two queries: SQLite answers a lone min() or max() from the b-tree's edge, but both in
    // one query scan the whole table.
    let lo: Option<i64> = t.query_row("SELECT min(rowid) FROM blobs", [], |r| r.get(0))?;
    let hi: Option<i64> = t.query_row("SELECT max(rowid) FROM blobs", [], |r| r.get(0))?;
    let (Some(lo), Some(hi)) = (lo, hi) else { return Ok(()) };
    let span = hi - lo + 1;
    if span <= 2 * live {
        return Ok(());
    }
    let cut = lo + (span - 2 * live);
    let moving: Vec<(String, String, i64)> = t
        .prepare_cached("SELECT collection_id, id, blob FROM records WHERE blob < ?1")?
        .query_map(params![cut], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut copy = t.prepare_cached(
        "INSERT INTO blobs (embedding, document) SELECT embedding, document FROM blobs WHERE rowid = ?1",
    )?;
    let mut repoint = t.prepare_cached("UPDATE records SET blob = ?1 WHERE collection_id = ?2 AND id = ?3")?;
    let mut moving = moving;
    moving.sort_unstable_by_key(|m| m.2);
    for (c, id, blob) in &moving {
        copy.execute(params![blob])?;
        repoint.execute(params![t.last_insert_rowid(), c, id])?;
    }
    t.prepare_cached("DELETE FROM blobs WHERE rowid < ?1")?.execute(params![cut])?;
    Ok(())
}

/// Sluice's compaction of the value log (`values::compact`), after a transaction that
/// appended `appended` values.
fn compact_values(t: &Connection, appended: usize) -> rusqlite::Result<()> {
    if appended == 0 {
        return Ok(());
    }
    let live: i64 = t.query_row("SELECT COALESCE(SUM(record_count), 0) FROM collections", [], |r| r.get(0))?;
    let lo: Option<i64> = t.prepare_cached("SELECT min(seq) FROM record_values")?.query_row([], |r| r.get(0))?;
    let hi: Option<i64> = t.prepare_cached("SELECT max(seq) FROM record_values")?.query_row([], |r| r.get(0))?;
    let (Some(lo), Some(hi)) = (lo, hi) else { return Ok(()) };
    let excess = (hi - lo + 1) - 3 * live - 4096;
    if excess <= 0 {
        return Ok(());
    }
    let cut = lo + excess.min((appended as i64 * 2).max(1024));
    let live_values: Vec<(i64, String, String)> = t
        .prepare_cached(
            "SELECT v.seq, v.collection_id, v.id FROM record_values v
             JOIN records r ON r.collection_id = v.collection_id AND r.id = v.id AND r.value = v.seq
             WHERE v.seq < ?1 ORDER BY v.seq",
        )?
        .query_map(params![cut], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?
        .collect::<rusqlite::Result<_>>()?;
    let mut copy = t.prepare_cached(
        "INSERT INTO record_values (collection_id, id, embedding, document)
         SELECT collection_id, id, embedding, document FROM record_values WHERE seq = ?1",
    )?;
    let mut repoint = t.prepare_cached("UPDATE records SET value = ?1 WHERE collection_id = ?2 AND id = ?3")?;
    for (seq, c, id) in &live_values {
        let moved = copy.insert(params![seq])?;
        repoint.execute(params![moved, c, id])?;
    }
    t.prepare_cached("DELETE FROM record_values WHERE seq < ?1")?.execute(params![cut])?;
    Ok(())
}

/// Fold `record_delta` into `records` (the newest change per key, in key order) and empty it.
fn merge_delta(t: &Connection) -> rusqlite::Result<()> {
    let mut read = t.prepare_cached(READ_DELTA)?;
    let mut upsert = t.prepare_cached(UPSERT_VALUES)?;
    let mut delete = t.prepare_cached(DELETE_RECORD)?;
    let mut rows = read.query([])?;
    while let Some(r) = rows.next()? {
        let (c, id): (String, String) = (r.get(0)?, r.get(1)?);
        match r.get::<_, Option<i64>>(4)? {
            Some(blob) => upsert.execute(params![c, id, r.get::<_, Option<String>>(2)?, r.get::<_, i64>(3)?, blob])?,
            None => delete.execute(params![c, id])?,
        };
    }
    drop(rows);
    t.prepare_cached("DELETE FROM record_delta")?.execute([])?;
    Ok(())
}

fn now_ms() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

struct Writer {
    conn: Connection,
    layout: Layout,
    /// Split: blob rowids replaced or deleted and not yet removed.
    garbage: Vec<i64>,
    txs: u64,
    /// ValuesDelta: rows in `record_delta`.
    delta: u64,
    /// ValuesDelta: transactions that merged the delta.
    merges: u64,
    /// ValuesDelta: values appended since the last merge (what its compaction is told).
    appended: usize,
    /// `--reads`: look every written key up first, as Sluice's processor does before it
    /// folds a batch.
    reads: bool,
    /// ValuesDelta with `--reads`: the keys in the unmerged delta, the in-memory copy a
    /// reader would consult first (a hash lookup instead of SQL).
    unmerged: std::collections::HashSet<(String, String)>,
}

/// One write as issued: names resolved, the sort key computed.
struct Issued<'a> {
    c: String,
    id: String,
    k: i64,
    row: Option<&'a Row>,
}

impl Writer {
    /// One transaction: the position compare-and-set, the collections, the writes, the
    /// new position.
    fn commit(&mut self, tx: &TxWrites, from: i64, flush: bool) -> rusqlite::Result<()> {
        let layout = self.layout.clone();
        let mut issued: Vec<(u64, Issued)> = tx
            .writes
            .iter()
            .map(|((c, id), row, seq)| {
                let (c, id) = (collection_name(*c), id_name(*id));
                let k = if layout.kind == Kind::IntKey { int_key(&c, &id) } else { 0 };
                (*seq, Issued { c, id, k, row: row.as_ref() })
            })
            .collect();
        match (layout.order, layout.kind) {
            (Order::Log, _) => issued.sort_by_key(|(seq, _)| *seq),
            (Order::Key, Kind::IntKey) => issued.sort_by_key(|(_, w)| w.k),
            (Order::Key, _) => issued.sort_by(|(_, a), (_, b)| (&a.c, &a.id).cmp(&(&b.c, &b.id))),
        }
        if self.reads {
            self.read_keys(&issued)?;
        }
        let now = now_ms();
        let t = self.conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
        let stored: Option<i64> =
            t.prepare_cached(READ_POSITION)?.query_row(params![TOPIC, 0], |r| r.get(0)).optional()?;
        assert_eq!(stored.unwrap_or(0), from, "position compare-and-set");
        {
            let mut upsert_collection = t.prepare_cached(UPSERT_COLLECTION)?;
            for (c, pos) in &tx.log_position {
                let delta = tx.count_delta.get(c).copied().unwrap_or(0);
                upsert_collection.execute(params![collection_name(*c), 0, DIM as i64, pos, delta, now])?;
            }
        }
        match layout.kind {
            Kind::AppendOnly => {
                let mut append = t.prepare_cached(APPEND_RECORD)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => append.execute(params![w.c, w.id, r.embedding, r.metadata, r.document, r.offset])?,
                        None => {
                            append.execute(params![w.c, w.id, None::<Vec<u8>>, None::<String>, None::<String>, -1])?
                        }
                    };
                }
            }
            Kind::RowidUnique | Kind::Clustered => {
                let mut upsert = t.prepare_cached(UPSERT_RECORD)?;
                let mut delete = t.prepare_cached(DELETE_RECORD)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => upsert.execute(params![w.c, w.id, r.embedding, r.metadata, r.document, r.offset])?,
                        None => delete.execute(params![w.c, w.id])?,
                    };
                }
            }
            Kind::IntKey => {
                let mut upsert = t.prepare_cached(UPSERT_INT)?;
                let mut delete = t.prepare_cached(DELETE_INT)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let changed = upsert.execute(params![
                                w.k,
                                w.c,
                                w.id,
                                r.embedding,
                                r.metadata,
                                r.document,
                                r.offset
                            ])?;
                            // A hash collision (another id under the same key) is detected, not handled.
                            assert_eq!(changed, 1, "63-bit key collision for {}/{}", w.c, w.id);
                        }
                        // 0 rows when the id was inserted and deleted within this transaction.
                        None => {
                            delete.execute(params![w.k, w.c, w.id])?;
                        }
                    }
                }
            }
            Kind::Split => {
                let mut select_blob = t.prepare_cached(SELECT_BLOB)?;
                let mut insert_blob = t.prepare_cached(INSERT_BLOB)?;
                let mut upsert = t.prepare_cached(UPSERT_SPLIT)?;
                let mut delete = t.prepare_cached(DELETE_SPLIT)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let old: Option<i64> =
                                select_blob.query_row(params![w.c, w.id], |row| row.get(0)).optional()?;
                            let blob = insert_blob.insert(params![r.embedding, r.document])?;
                            upsert.execute(params![w.c, w.id, r.metadata, r.offset, blob])?;
                            self.garbage.extend(old);
                        }
                        None => {
                            let old: Option<i64> = delete.query_row(params![w.c, w.id], |row| row.get(0)).optional()?;
                            self.garbage.extend(old);
                        }
                    }
                }
                self.txs += 1;
                if flush || self.txs.is_multiple_of(layout.gc_every) {
                    self.garbage.sort_unstable();
                    let mut delete_blob = t.prepare_cached(DELETE_BLOB)?;
                    for rowid in self.garbage.drain(..) {
                        delete_blob.execute(params![rowid])?;
                    }
                }
            }
            Kind::BlobLog => {
                let mut insert_blob = t.prepare_cached(INSERT_BLOB)?;
                let mut upsert = t.prepare_cached(UPSERT_SPLIT)?;
                let mut delete = t.prepare_cached(DELETE_RECORD)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let blob = insert_blob.insert(params![r.embedding, r.document])?;
                            upsert.execute(params![w.c, w.id, r.metadata, r.offset, blob])?;
                        }
                        None => {
                            delete.execute(params![w.c, w.id])?;
                        }
                    }
                }
                self.txs += 1;
                if self.txs.is_multiple_of(layout.gc_every) {
                    compact_blobs(&t)?;
                }
            }
            Kind::Values => {
                let mut append_value = t.prepare_cached(APPEND_VALUE)?;
                let mut upsert = t.prepare_cached(UPSERT_VALUES)?;
                let mut delete = t.prepare_cached(DELETE_RECORD)?;
                let mut appended = 0;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let value = append_value.insert(params![w.c, w.id, r.embedding, r.document])?;
                            appended += 1;
                            upsert.execute(params![w.c, w.id, r.metadata, r.offset, value])?;
                        }
                        None => {
                            delete.execute(params![w.c, w.id])?;
                        }
                    }
                }
                compact_values(&t, appended)?;
            }
            Kind::ValuesKeyedDelta => {
                let mut append_value = t.prepare_cached(APPEND_VALUE)?;
                let mut upsert = t.prepare_cached(UPSERT_KEYED_DELTA)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let value = append_value.insert(params![w.c, w.id, r.embedding, r.document])?;
                            self.appended += 1;
                            upsert.execute(params![w.c, w.id, r.metadata, r.offset, value])?;
                        }
                        None => {
                            upsert.execute(params![w.c, w.id, None::<String>, None::<i64>, None::<i64>])?;
                        }
                    }
                }
                let keys: i64 = t.prepare_cached("SELECT count(*) FROM record_delta")?.query_row([], |r| r.get(0))?;
                if flush || keys as u64 >= layout.delta_rows {
                    t.prepare_cached(
                        "INSERT INTO records (collection_id, id, metadata, last_offset, value)
                         SELECT collection_id, id, metadata, last_offset, value FROM record_delta
                         WHERE last_offset IS NOT NULL
                         ON CONFLICT (collection_id, id) DO UPDATE SET
                             metadata = excluded.metadata, last_offset = excluded.last_offset, value = excluded.value",
                    )?
                    .execute([])?;
                    t.prepare_cached(
                        "DELETE FROM records WHERE (collection_id, id) IN
                         (SELECT collection_id, id FROM record_delta WHERE last_offset IS NULL)",
                    )?
                    .execute([])?;
                    t.prepare_cached("DELETE FROM record_delta")?.execute([])?;
                    compact_values(&t, self.appended)?;
                    self.appended = 0;
                    self.merges += 1;
                }
            }
            Kind::ValuesDelta => {
                let mut append_value = t.prepare_cached(APPEND_VALUE)?;
                let mut append = t.prepare_cached(APPEND_DELTA)?;
                for (_, w) in &issued {
                    match w.row {
                        Some(r) => {
                            let value = append_value.insert(params![w.c, w.id, r.embedding, r.document])?;
                            self.appended += 1;
                            append.execute(params![w.c, w.id, r.metadata, r.offset, value])?;
                        }
                        None => {
                            append.execute(params![w.c, w.id, None::<String>, None::<i64>, None::<i64>])?;
                        }
                    }
                }
                self.delta += issued.len() as u64;
                if self.reads {
                    self.unmerged.extend(issued.iter().map(|(_, w)| (w.c.clone(), w.id.clone())));
                }
                if flush || self.delta >= layout.delta_rows {
                    merge_delta(&t)?;
                    self.unmerged.clear();
                    compact_values(&t, self.appended)?;
                    self.delta = 0;
                    self.appended = 0;
                    self.merges += 1;
                }
            }
        }
        t.prepare_cached(WRITE_POSITION)?.execute(params![TOPIC, 0, from + tx.records as i64, now])?;
        t.commit()
    }

    /// Look up each key's stored offset and metadata before the transaction, the way the
    /// layout's reader would: `records` (the delta first, in SQL, for Vk; in memory for Vd).
    fn read_keys(&mut self, issued: &[(u64, Issued)]) -> rusqlite::Result<()> {
        const FROM_RECORDS: &str = "SELECT metadata, last_offset FROM records WHERE collection_id = ?1 AND id = ?2";
        let kind = self.layout.kind;
        if matches!(kind, Kind::IntKey | Kind::AppendOnly) {
            return Ok(()); // no key to look up by
        }
        let mut records = self.conn.prepare_cached(FROM_RECORDS)?;
        let mut delta = self
            .conn
            .prepare_cached("SELECT metadata, last_offset FROM record_delta WHERE collection_id = ?1 AND id = ?2")
            .ok()
            .filter(|_| kind == Kind::ValuesKeyedDelta);
        let read = |stmt: &mut rusqlite::CachedStatement, c: &str, id: &str| {
            stmt.query_row(params![c, id], |r| Ok((r.get::<_, Option<String>>(0)?, r.get::<_, Option<i64>>(1)?)))
                .optional()
        };
        for (_, w) in issued {
            if kind == Kind::ValuesDelta && self.unmerged.contains(&(w.c.clone(), w.id.clone())) {
                continue;
            }
            if let Some(d) = delta.as_mut() {
                if std::hint::black_box(read(d, &w.c, &w.id)?).is_some() {
                    continue;
                }
            }
            std::hint::black_box(read(&mut records, &w.c, &w.id)?);
        }
        Ok(())
    }

    /// (live rows, sum of row hashes) read back from the database.
    fn digest(&self) -> rusqlite::Result<(u64, u64)> {
        let sql = match self.layout.kind {
            Kind::Values | Kind::ValuesDelta | Kind::ValuesKeyedDelta => {
                "SELECT r.collection_id, r.id, v.embedding, r.metadata, v.document
                 FROM records r JOIN record_values v ON v.seq = r.value"
            }
            Kind::Split | Kind::BlobLog => {
                "SELECT r.collection_id, r.id, b.embedding, r.metadata, b.document
                 FROM records r JOIN blobs b ON b.rowid = r.blob"
            }
            // The newest row per id (SQLite takes the bare columns from the max() row).
            Kind::AppendOnly => {
                "SELECT collection_id, id, embedding, metadata, document FROM (
                     SELECT collection_id, id, embedding, metadata, document, max(rowid)
                     FROM records GROUP BY collection_id, id)
                 WHERE metadata IS NOT NULL"
            }
            _ => "SELECT collection_id, id, embedding, metadata, document FROM records",
        };
        let mut stmt = self.conn.prepare(sql)?;
        let mut rows = stmt.query([])?;
        let (mut n, mut sum) = (0u64, 0u64);
        while let Some(r) = rows.next()? {
            let c: String = r.get(0)?;
            let id: String = r.get(1)?;
            let emb: Option<Vec<u8>> = r.get(2)?;
            let md: Option<String> = r.get(3)?;
            let doc: Option<String> = r.get(4)?;
            n += 1;
            sum = sum.wrapping_add(row_hash(&c, &id, emb.as_deref(), md.as_deref(), doc.as_deref()));
        }
        Ok((n, sum))
    }
}

// ---------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Shape {
    /// Look every written key up before each transaction (`--reads`).
    reads: bool,
    records: usize,
    tx_size: usize,
    ids_per_collection: usize,
    seed: u64,
}

struct Outcome {
    layout: String,
    rep: usize,
    records: usize,
    writes: usize,
    tx_time: Duration,
    /// CPU of the writing thread inside the transactions.
    cpu: Duration,
    /// CPU of the checkpoint thread.
    ckpt_cpu: Duration,
    max_tx: Duration,
    /// Median and 99th percentile of the transactions' durations.
    p50_tx: Duration,
    p99_tx: Duration,
    /// ValuesDelta: how many transactions merged the delta, their median and longest.
    merges: usize,
    merge_p50: Duration,
    merge_max: Duration,
    wchar: u64,
    write_bytes: u64,
    db_size: u64,
    wal_peak: u64,
    load_before: String,
    load_after: String,
    digest_ok: bool,
}

fn run(layout: &Layout, rep: usize, shape: &Shape, dir: &Path) -> Outcome {
    let Shape { records, tx_size, ids_per_collection, seed, .. } = *shape;
    let path = dir.join(format!("{}-{rep}.db", layout.name));
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    let load_before = loadavg();
    let conn = Connection::open(&path).expect("open database");
    configure(&conn, layout.page_size).expect("configure");
    conn.execute_batch(COMMON_SCHEMA).expect("schema");
    conn.execute_batch(schema(layout.kind)).expect("schema");
    if layout.blob_index {
        conn.execute_batch("CREATE INDEX records_by_blob ON records (blob);").expect("schema");
    }
    let stop = Arc::new(AtomicBool::new(false));
    let checkpointer = spawn_checkpointer(&path, layout.page_size, stop.clone());
    conn.set_prepared_statement_cache_capacity(32);
    let mut writer = Writer {
        conn,
        layout: layout.clone(),
        garbage: Vec::new(),
        txs: 0,
        delta: 0,
        merges: 0,
        appended: 0,
        reads: shape.reads,
        unmerged: Default::default(),
    };
    let mut workload = Workload::new(seed, ids_per_collection);
    let wal_path = PathBuf::from(format!("{}-wal", path.display()));

    let io0 = proc_io();
    let (mut tx_time, mut cpu, mut writes, mut done, mut wal_peak) = (Duration::ZERO, Duration::ZERO, 0, 0, 0);
    let mut max_tx = Duration::ZERO;
    let mut durations = Vec::with_capacity(records / tx_size + 1);
    // ValuesDelta: the transactions that merged the delta, apart.
    let mut merge_durations = Vec::new();
    while done < records {
        let n = tx_size.min(records - done);
        let tx = workload.next_tx(n);
        writes += tx.writes.len();
        let last = done + n >= records;
        let merges_before = writer.merges;
        let (t0, c0) = (Instant::now(), thread_cpu());
        writer.commit(&tx, done as i64, last).expect("commit");
        let elapsed = t0.elapsed();
        tx_time += elapsed;
        max_tx = max_tx.max(elapsed);
        if writer.merges > merges_before {
            merge_durations.push(elapsed);
        } else {
            durations.push(elapsed);
        }
        cpu += thread_cpu() - c0;
        done += n;
        wal_peak = wal_peak.max(std::fs::metadata(&wal_path).map(|m| m.len()).unwrap_or(0));
    }
    durations.sort_unstable();
    let pct =
        |p: f64| durations.get(((durations.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or_default();
    let (p50_tx, p99_tx) = (pct(0.50), pct(0.99));
    merge_durations.sort_unstable();
    let merges = merge_durations.len();
    let merge_p50 = merge_durations.get(merges / 2).copied().unwrap_or_default();
    let merge_max = merge_durations.last().copied().unwrap_or_default();
    stop.store(true, Ordering::Relaxed);
    let ckpt_cpu = checkpointer.join().expect("checkpointer");
    // Everything in the WAL has to reach the database file some time: count that too.
    writer.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())).expect("final checkpoint");
    let io1 = proc_io();
    let db_size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);

    let got = writer.digest().expect("digest");
    let want = workload.digest();
    let counted: i64 =
        writer.conn.query_row("SELECT COALESCE(SUM(record_count), 0) FROM collections", [], |r| r.get(0)).unwrap();
    let digest_ok = got == want && counted as u64 == want.0;
    if !digest_ok {
        eprintln!(
            "DIGEST MISMATCH {}: database {} rows {:016x}, model {} rows {:016x}, record_count sum {}",
            layout.name, got.0, got.1, want.0, want.1, counted
        );
    }
    drop(writer);
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    Outcome {
        layout: layout.name.clone(),
        rep,
        records,
        writes,
        tx_time,
        cpu,
        ckpt_cpu,
        max_tx,
        p50_tx,
        p99_tx,
        merges,
        merge_p50,
        merge_max,
        wchar: io1.0 - io0.0,
        write_bytes: io1.1 - io0.1,
        db_size,
        wal_peak,
        load_before,
        load_after: loadavg(),
        digest_ok,
    }
}

fn print_row(o: &Outcome) {
    let per_m = 1_000_000.0 / o.records as f64;
    println!(
        "| {:<9} | {} | {:>7.0} | {:>5.2} | {:>5.2} | {:>4.0} | {:>6.2} / {:>6.2} | {} | {:>6.0} | {:>6.0} | {:>6.1} | {:>6.1} | {} / {} | {} | {} |",
        o.layout,
        o.rep + 1,
        o.records as f64 / o.tx_time.as_secs_f64(),
        o.cpu.as_secs_f64() * per_m,
        o.ckpt_cpu.as_secs_f64() * per_m,
        o.max_tx.as_secs_f64() * 1000.0,
        o.p50_tx.as_secs_f64() * 1000.0,
        o.p99_tx.as_secs_f64() * 1000.0,
        if o.merges == 0 {
            "-".to_string()
        } else {
            format!("{} / {:.1} / {:.1}", o.merges, o.merge_p50.as_secs_f64() * 1000.0, o.merge_max.as_secs_f64() * 1000.0)
        },
        o.wchar as f64 / o.records as f64,
        o.write_bytes as f64 / o.records as f64,
        o.db_size as f64 / (1 << 20) as f64,
        o.wal_peak as f64 / (1 << 20) as f64,
        o.load_before,
        o.load_after,
        o.writes,
        if o.digest_ok { "ok" } else { "MISMATCH" },
    );
}

fn usage() -> ! {
    eprintln!(
        "usage: sqlite-layout-bench [--records N] [--tx N] [--ids N] [--reps N] [--seed N] [--dir PATH] [--reads]\n\
         \x20                          [--layouts L0,L1,L2,L2g16,L3,L4,V,Vd4000,Vk4000,L1-4k,...]\n\
         Runs each layout from a fresh database, repetitions interleaved; exits 1 if the\n\
         stored rows of any run differ from the model. Defaults: 1,000,000 records, 3,000 per\n\
         transaction, 1,000 ids per collection; up to 10,000 records (a smoke test) 100 per\n\
         transaction over 10 ids per collection."
    );
    std::process::exit(2)
}

fn main() {
    let mut records = 1_000_000usize;
    let mut tx_size = None;
    let mut ids_per_collection = None;
    let mut reps = 2usize;
    let mut seed = 42u64;
    let mut dir = PathBuf::from("db");
    let mut layouts = "L0,L1,L1-4k,L2,L2g16,L2g64,L2c8,L2x1,L3,L4,A0".to_string();
    let mut reads = false;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| usage());
        match a.as_str() {
            "--records" => records = value().parse().unwrap_or_else(|_| usage()),
            "--tx" => tx_size = Some(value().parse().unwrap_or_else(|_| usage())),
            "--ids" => ids_per_collection = Some(value().parse().unwrap_or_else(|_| usage())),
            "--reps" => reps = value().parse().unwrap_or_else(|_| usage()),
            "--seed" => seed = value().parse().unwrap_or_else(|_| usage()),
            "--dir" => dir = PathBuf::from(value()),
            "--layouts" => layouts = value(),
            "--reads" => reads = true,
            _ => usage(),
        }
    }
    let layouts: Vec<Layout> =
        layouts.split(',').map(|s| parse_layout(s.trim())).collect::<Result<_, _>>().unwrap_or_else(|e| {
            eprintln!("{e}");
            usage()
        });
    // Small runs are smoke tests of the layouts' logic: small transactions over few ids, so
    // that overwrites, deletes and replaced blobs across transactions are frequent.
    let smoke = records <= 10_000;
    let shape = Shape {
        reads,
        records,
        tx_size: tx_size.unwrap_or(if smoke { 100 } else { 3_000 }).max(1),
        ids_per_collection: ids_per_collection.unwrap_or(if smoke { 10 } else { 1_000 }).clamp(1, 65_536),
        seed,
    };
    let tx_size = shape.tx_size;
    let ids = shape.ids_per_collection;
    std::fs::create_dir_all(&dir).expect("create --dir");
    println!(
        "W1 SQL-only: {records} records, {tx_size} per transaction{}, {COLLECTIONS} collections x {ids} ids, seed {seed}, \
         {reps} rep(s), \
         SQLite {}, {} CPUs, dir {}",
        if shape.reads { ", every written key read first" } else { "" },
        rusqlite::version(),
        std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        dir.display()
    );
    println!(
        "| layout | rep | records/s | writer CPU-s/1M | ckpt CPU-s/1M | max tx ms | tx p50 / p99 ms (merges apart) | merges: n / p50 / max ms | wchar B/rec | disk B/rec | DB MiB | WAL peak MiB | load 1/5/15 before / after | row writes | digest |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut outcomes = Vec::new();
    for rep in 0..reps {
        for layout in &layouts {
            let o = run(layout, rep, &shape, &dir);
            print_row(&o);
            outcomes.push(o);
        }
    }
    let digests: Vec<bool> = outcomes.iter().map(|o| o.digest_ok).collect();
    if digests.iter().all(|ok| *ok) {
        println!("digest: all {} runs match the model (same live rows in every layout)", outcomes.len());
    } else {
        println!("digest: MISMATCH");
        std::process::exit(1);
    }
}
