//! Log records: the data contract producers write (see `schemas/log_record.avsc`), its
//! codec (hand-written, and apache-avro's generic path for writer schemas), framing,
//! validation, JSON lines, the items of the HTTP records endpoint, the Java-compatible
//! partitioner and the deterministic benchmark workloads.
//!
//! Nothing here does I/O and nothing depends on Kafka or a database: the processor
//! (`sluice`) re-exports this crate as `sluice::record`, and the fuzz targets build it
//! alone. Everything is unit- and property-tested without a broker.

pub mod avro;
pub mod borrowed;
pub mod change;
pub mod codec;
pub mod embedding;
pub mod framing;
pub mod items;
pub mod jsonl;
pub mod partitioner;
pub mod validate;
pub mod workload;

pub use embedding::Embedding;

/// What a log record does to its collection (docs/design.md section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Operation {
    Add,
    Update,
    Upsert,
    Delete,
    /// Control record: asks for a backfill of an attached function. Never materialized.
    BackfillFn,
}

impl Operation {
    pub const ALL: [Operation; 5] =
        [Operation::Add, Operation::Update, Operation::Upsert, Operation::Delete, Operation::BackfillFn];

    /// Position of the symbol in the Avro enum (the wire value).
    pub fn avro_index(self) -> u32 {
        match self {
            Operation::Add => 0,
            Operation::Update => 1,
            Operation::Upsert => 2,
            Operation::Delete => 3,
            Operation::BackfillFn => 4,
        }
    }

    pub fn from_avro_index(i: u32) -> Option<Operation> {
        Operation::ALL.get(i as usize).copied()
    }

    /// The Avro symbol, also used as a metric label value.
    pub fn symbol(self) -> &'static str {
        match self {
            Operation::Add => "ADD",
            Operation::Update => "UPDATE",
            Operation::Upsert => "UPSERT",
            Operation::Delete => "DELETE",
            Operation::BackfillFn => "BACKFILL_FN",
        }
    }

    pub fn is_data(self) -> bool {
        !matches!(self, Operation::BackfillFn)
    }
}

/// How the `embedding` bytes are encoded. Only little-endian packed f32 for now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Encoding {
    #[default]
    Float32,
}

/// A metadata value. `Null` appears only in log records, where it means
/// "remove this key" on merge; materialized records never hold it.
#[derive(Debug, Clone, PartialEq)]
pub enum MetaValue {
    Null,
    String(String),
    Long(i64),
    Double(f64),
    Bool(bool),
}

/// Metadata keyed by name, ordered so that encodings and comparisons are stable. A map
/// kept as one sorted vector: a record's few keys take one allocation and are looked up
/// by binary search, where a B-tree spends a node of 11 slots on them.
pub type Metadata = litemap::LiteMap<String, MetaValue>;

/// Payload of a `BACKFILL_FN` control record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillRef {
    pub request_id: String,
    pub function_id: String,
}

/// One decoded log record (the Avro record `LogRecord`).
#[derive(Debug, Clone, PartialEq)]
pub struct LogRecord {
    pub collection_id: String,
    pub id: String,
    pub operation: Operation,
    /// The `embedding` bytes (packed little-endian f32); decoded by the processor as a
    /// slice of the consumed payload.
    pub embedding: Option<Embedding>,
    pub encoding: Encoding,
    pub metadata: Option<Metadata>,
    pub document: Option<String>,
    pub backfill: Option<BackfillRef>,
}

impl LogRecord {
    /// A data record with no payload, handy for tests and builders.
    pub fn data(collection_id: impl Into<String>, id: impl Into<String>, operation: Operation) -> Self {
        LogRecord {
            collection_id: collection_id.into(),
            id: id.into(),
            operation,
            embedding: None,
            encoding: Encoding::Float32,
            metadata: None,
            document: None,
            backfill: None,
        }
    }
}

/// The backfill task the processor produces to the backfill topic for a marker
/// (the Avro record `BackfillTask`, `schemas/backfill_task.avsc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackfillTask {
    pub request_id: String,
    pub function_id: String,
    pub collection_id: String,
    pub topic: String,
    pub partition: i32,
    pub marker_offset: i64,
    /// Milliseconds since the Unix epoch when the task was produced.
    pub produced_at_ms: i64,
}

/// A materialized record: the current state of one id in a collection.
#[derive(Debug, Clone, PartialEq)]
pub struct Record {
    pub id: String,
    pub embedding: Option<Embedding>,
    /// Never holds `MetaValue::Null`.
    pub metadata: Metadata,
    pub document: Option<String>,
    /// Kafka offset of the log record that last changed this record.
    pub offset: i64,
}
