//! Embedded, numbered migrations for both backends.
//!
//! Each backend has its own list of steps (the SQL dialects differ) with the **same
//! version numbers and meaning**. Opening a sysdb applies the missing steps in order,
//! inside one transaction, and records each in `schema_migrations(version)`; opening
//! again applies nothing (idempotent). A database whose highest version is newer than
//! the last step this binary knows is refused with [`SysdbError::Config`]: an older
//! binary must not write into a schema it does not understand.
//!
//! Adding a table: append a step with the next version to **both** lists (never edit a
//! released step), and extend the conformance suite (`conformance.rs`).
//!
//! Tables (both backends):
//! * `meta(key, value)` — small settings, e.g. `topic_partitions:<topic>` → count.
//! * `partitions(topic, partition, next_offset, updated_at_ms)` — the authoritative
//!   positions; `next_offset` = next Kafka offset to read.
//! * `collections(id, partition, dimension, log_position, record_count, created_at_ms)`.
//! * `records(collection_id, id, embedding, metadata, document, last_offset)` — the
//!   materialized records; `embedding` is little-endian packed f32, `metadata` JSON text
//!   (see `stored_fields.rs`). On SQLite, step 6 moves `embedding` and `document` into a value
//!   log (below).
//! * `gaps(...)` — data-loss gaps skipped under `on_data_loss = "skip"`.
//! * `offset_resets(...)` — the audit trail of operator overrides.
//!
//! Step 2, attached functions (docs/design.md section 7):
//! * `functions(id, collection_id, function, output_collection, params, status,
//!   request_id, marker_offset, backfill_cursor, backfill_done, backfill_total, ...)` —
//!   `params` is a JSON object of strings; a partial unique index allows at most one
//!   non-`detached` function per (collection, output collection). `created_at_ms` is
//!   the creation order: an attach stamps `max(now, latest + 1)`, so it never ties
//!   with (or goes before) an earlier attach (only two attaches racing on PostgreSQL
//!   can tie; listings break ties by id).
//! * `outbox(id, function_id, collection_id, partition, request_id, created_at_ms,
//!   sent_at_ms)` — BACKFILL_FN markers to publish; `sent_at_ms` NULL = pending.
//! * `preimages(function_id, record_id, embedding, metadata, document, last_offset)` —
//!   a backfilling function's copy of a record as of its marker, saved by the first
//!   change after the marker (same encoding as `records`).
//! * `function_counters(function_id, output_id, count)` — the counters behind
//!   aggregate outputs (`OutputDelta::Count`).
//! * `tombstones(collection_id, id, last_offset)` — versioned removals of map outputs
//!   while a backfill runs (dropped when it finishes).
//!
//! Step 3, visible halts: `partitions.halted_reason` (text, NULL = running) and
//! `partitions.halted_at_ms` (when the current halt began), so an operator sees from
//! the sysdb alone which partition stopped and why.
//!
//! Step 4, attach rules and lost markers:
//! * `outbox.published_offset` — the log offset where the marker was last published
//!   (NULL while pending, and for rows sent before this step); the outbox relay compares
//!   it with the partition's `next_offset` to find markers that were passed without
//!   effect.
//! * a partial unique index: at most one non-`detached` function writes an output
//!   collection, whatever its input.
//! * a partial index on `functions` of those still `awaiting_marker` (the relay's gauge
//!   and lost-marker scan read only those).
//!
//! Step 5, DLQ redrive: `dlq_replays(topic, dlq_partition, dlq_offset, replayed_at,
//! log_partition, log_offset)` — a DLQ entry (`topic` is the DLQ topic) that `sluice dlq
//! replay` re-produced into the log, and where it landed; written after the broker
//! acknowledged the produce, read to skip entries already replayed.
//!
//! Step 6, the SQLite value log (`sqlite/values.rs`): a record's embedding and document
//! move out of `records` into `record_values(seq, collection_id, id, embedding,
//! document)`, appended at its end and pointed at by the new `records.value`;
//! `value_log(records)` counts the records, for the log's compaction bound. Existing
//! values are moved in the migration's transaction. PostgreSQL's step 6 changes
//! nothing: its records keep their values in the row.
//!
//! Step 8, the SQLite records delta (`sqlite/values.rs`): `record_delta(seq,
//! collection_id, id, metadata, last_offset, value)`, an append-only table without a key:
//! a small transaction appends its row changes there (a delete as a NULL `last_offset`)
//! instead of rewriting `records`, and the newest row of a key overrides `records`. A
//! transaction that brings it to its merge size folds it into `records` in key order and
//! empties it; `value_log.delta_merges` counts those merges. The migration only creates
//! both (the delta starts empty).
//!
//! Step 9, PostgreSQL's `records` fill factor: pages are filled to 70% on insert, so an
//! upsert's new row version usually fits on the row's own page (measured in
//! `docs/bench/history.md`, "PostgreSQL's buffer cache and fill factor": a W1 drain's server CPU fell by a tenth). SQLite's step 9 changes
//! nothing.
//!
//! Step 11, the SQL read interface (`docs/reading.md`): the views `sluice_records`,
//! `sluice_collections`, `sluice_positions`, `sluice_functions` and `sluice_views_version`,
//! which read the current state wherever the layout keeps it (on SQLite, `sluice_records`
//! folds the unmerged `record_delta` in and joins the value log, in plain SQL that needs
//! no function of Sluice's, so a `sqlite3` shell or a Grafana data source can read it).
//!
//! **The views are a contract, version 1.** Their names, columns, column order and types
//! outlive the tables under them: a later step that changes the layout must keep every
//! view's columns, and ends by defining the views again over the new layout (on
//! PostgreSQL `CREATE OR REPLACE VIEW`, which refuses to drop, rename or retype a column
//! anyway; on SQLite `DROP VIEW` first, before a table a view reads is dropped or renamed,
//! since SQLite checks every view when a table is renamed, then `CREATE VIEW`). Adding a
//! column at the end of a view is allowed and raises the version (`VIEWS_VERSION` in the
//! tests below, and what the `sluice_views_version` view returns); removing, renaming or
//! retyping one is not. The columns are listed in `docs/reading.md`, which the views'
//! tests read.
//!
//! Step 12, the change feed (`docs/changes.md`): `changelog_partitions(partition,
//! next_seq, published_seq, published_at_ms, outbox_bytes)` — per log partition, the next
//! outbox sequence number (taken by each transaction that writes changes, so on PostgreSQL
//! the row lock orders those transactions, and sequence order is commit order), the last
//! one the relay reported committed to Kafka, and the bytes (keys and values) of the
//! changes after it, which bound the outbox; `changelog_outbox(partition, seq,
//! collection_id, record_id, operation, source_offset, value, created_at_ms)` — the
//! changes not yet deleted, written in the transaction that made them (`value` a
//! `ChangeRecord` datum, NULL for a delete).
//!
//! Step 13, the change feed's snapshot (`docs/changes.md` section 2):
//! `changelog_partitions.snapshot_requested_at_ms` (NULL: no snapshot pending),
//! `snapshot_collection` and `snapshot_id` (the cursor: the last record the pending
//! snapshot appended, NULL before the first), `snapshot_records` (records appended by the
//! pending snapshot, or by the last one) and `snapshot_finished_at_ms`; the outbox's
//! `operation` also takes `snapshot` (SQLite cannot change a CHECK constraint, so its
//! outbox is copied into a new table: it holds only the changes not yet deleted).
//!
//! Step 14, functions as WebAssembly components (`src/functions/wasm/`):
//! `function_components(sha256, bytes, size, world_version, created_at_ms)` — a
//! component's bytes, named by their SHA-256 (lowercase hex), stored once however many
//! functions run it: every replica and the backfill worker load them by hash, never a
//! file; `world_version` is the `sluice:function/guest` version it exports. And
//! `functions.failed_reason` / `functions.failed_at_ms`: a function that failed (a trap,
//! a limit, an error it returned) keeps its status column as it was in the protocol and
//! is `failed` while a reason is stored (a detach wins); the transaction that found the
//! failure writes them. `sluice_functions` is defined again: its `status` says `failed`,
//! and `failed_reason` is added at the end (the views' contract, version 2).

use super::error::SysdbError;

/// The views whose SQL is the same on both backends (step 11: the read interface, whose
/// columns are a contract; `sluice_records` differs, since SQLite's records may sit in the
/// delta and the value log).
macro_rules! common_views {
    () => {
        r#"CREATE VIEW sluice_collections AS
SELECT id, partition, dimension, record_count, log_position, created_at_ms FROM collections;

CREATE VIEW sluice_positions AS
SELECT topic, partition, next_offset, halted_reason IS NOT NULL AS halted, halted_reason, halted_at_ms, updated_at_ms
FROM partitions;

CREATE VIEW sluice_functions AS
SELECT id, collection_id AS collection, function, output_collection, params, status, marker_offset,
       backfill_done, backfill_total, created_at_ms, updated_at_ms
FROM functions;
"#
    };
}

/// The body of `sluice_functions` from step 14 on (the same on both backends): `status`
/// says `failed` while a reason is stored, and `failed_reason` is its last column.
macro_rules! functions_view_v2 {
    () => {
        r#"SELECT id, collection_id AS collection, function, output_collection, params,
       CASE WHEN failed_reason IS NOT NULL AND status <> 'detached' THEN 'failed' ELSE status END AS status,
       marker_offset, backfill_done, backfill_total, created_at_ms, updated_at_ms, failed_reason
FROM functions;
"#
    };
}

/// One migration step.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Migration {
    pub version: i64,
    pub description: &'static str,
    pub sql: &'static str,
}

/// SQLite steps. Ids compare with SQLite's default BINARY collation (byte order), the
/// same order as Rust's `str` — `list_records` pages rely on it.
///
/// `partitions`, `collections`, `meta` are `WITHOUT ROWID`: the primary key *is* the
/// table's b-tree, so a lookup is one b-tree search and no separate index is maintained.
/// `records` was created as a rowid table with a unique index on (collection_id, id): a
/// `WITHOUT ROWID` row is stored in an index b-tree, whose cells hold at most ~1/4 of a
/// page, so every row with an embedding of 384 dims (1.5 KiB) or more spilled into an
/// overflow page (measured, 5,000-record upsert batch: 384 dims took 137-154 ms as
/// `WITHOUT ROWID` on 4 KiB pages against 33-50 ms as a rowid table on 16 KiB pages).
/// Step 6 moved embedding and document into the append-only value log `record_values`,
/// and step 7 then clusters the small rows that remain (`WITHOUT ROWID`, about 100 bytes
/// each in W1): a rowid table kept them in insertion order, so a batch of one
/// partition's collections rewrote random pages of the whole table, two b-trees per
/// record. Clustered, it rewrites only the pages of its own collections, in one b-tree.
/// Measured at 30,000 records/s (4 interleaved pairs, batches of ~170-280 records): p50
/// 44-76 ms against 133-289 ms, 5% less CPU.
pub(crate) const SQLITE: &[Migration] = &[
    Migration {
        version: 1,
        description: "positions, collections, records, gaps, offset resets",
        sql: r#"
CREATE TABLE meta (
    key   TEXT NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;

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

CREATE TABLE records (
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    embedding     BLOB    NULL,
    metadata      TEXT    NULL,
    document      TEXT    NULL,
    last_offset   INTEGER NOT NULL,
    PRIMARY KEY (collection_id, id)
);

CREATE TABLE gaps (
    id             INTEGER PRIMARY KEY AUTOINCREMENT,
    topic          TEXT    NOT NULL,
    partition      INTEGER NOT NULL,
    from_offset    INTEGER NOT NULL,
    to_offset      INTEGER NOT NULL,
    recorded_at_ms INTEGER NOT NULL
);
CREATE INDEX gaps_by_topic ON gaps (topic, id);

CREATE TABLE offset_resets (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    topic       TEXT    NOT NULL,
    partition   INTEGER NOT NULL,
    from_offset INTEGER NULL,
    to_offset   INTEGER NOT NULL,
    actor       TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    at_ms       INTEGER NOT NULL
);
CREATE INDEX offset_resets_by_topic ON offset_resets (topic, id);
"#,
    },
    Migration {
        version: 2,
        description: "attached functions: functions, outbox, preimages, counters, tombstones",
        sql: r#"
CREATE TABLE functions (
    id                TEXT    NOT NULL PRIMARY KEY,
    collection_id     TEXT    NOT NULL,
    function          TEXT    NOT NULL,
    output_collection TEXT    NOT NULL,
    params            TEXT    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN ('awaiting_marker', 'backfilling', 'ready', 'detached')),
    request_id        TEXT    NOT NULL,
    marker_offset     INTEGER NULL,
    backfill_cursor   TEXT    NULL,
    backfill_done     INTEGER NOT NULL DEFAULT 0,
    backfill_total    INTEGER NULL,
    created_at_ms     INTEGER NOT NULL,
    updated_at_ms     INTEGER NOT NULL
) WITHOUT ROWID;
CREATE UNIQUE INDEX functions_one_live_per_output ON functions (collection_id, output_collection) WHERE status <> 'detached';
CREATE INDEX functions_by_collection ON functions (collection_id, created_at_ms);

CREATE TABLE outbox (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    function_id   TEXT    NOT NULL,
    collection_id TEXT    NOT NULL,
    partition     INTEGER NOT NULL,
    request_id    TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL,
    sent_at_ms    INTEGER NULL
);
CREATE INDEX outbox_pending ON outbox (id) WHERE sent_at_ms IS NULL;

CREATE TABLE preimages (
    function_id TEXT    NOT NULL,
    record_id   TEXT    NOT NULL,
    embedding   BLOB    NULL,
    metadata    TEXT    NULL,
    document    TEXT    NULL,
    last_offset INTEGER NOT NULL,
    PRIMARY KEY (function_id, record_id)
) WITHOUT ROWID;

CREATE TABLE function_counters (
    function_id TEXT    NOT NULL,
    output_id   TEXT    NOT NULL,
    count       INTEGER NOT NULL,
    PRIMARY KEY (function_id, output_id)
) WITHOUT ROWID;

CREATE TABLE tombstones (
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    last_offset   INTEGER NOT NULL,
    PRIMARY KEY (collection_id, id)
) WITHOUT ROWID;
"#,
    },
    Migration {
        version: 3,
        description: "partition halts: halted_reason, halted_at_ms",
        sql: r#"
ALTER TABLE partitions ADD COLUMN halted_reason TEXT NULL;
ALTER TABLE partitions ADD COLUMN halted_at_ms INTEGER NULL;
"#,
    },
    Migration {
        version: 4,
        description: "outbox/functions: published marker offsets, one live writer per output",
        sql: r#"
ALTER TABLE outbox ADD COLUMN published_offset INTEGER NULL;
CREATE UNIQUE INDEX functions_one_live_writer_per_output ON functions (output_collection) WHERE status <> 'detached';
CREATE INDEX functions_awaiting_marker ON functions (created_at_ms) WHERE status = 'awaiting_marker';
"#,
    },
    Migration {
        version: 5,
        description: "dlq_replays: DLQ entries replayed into the log",
        sql: r#"
CREATE TABLE dlq_replays (
    topic         TEXT    NOT NULL,
    dlq_partition INTEGER NOT NULL,
    dlq_offset    INTEGER NOT NULL,
    replayed_at   INTEGER NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset    INTEGER NOT NULL,
    PRIMARY KEY (topic, dlq_partition, dlq_offset)
) WITHOUT ROWID;
"#,
    },
    Migration {
        version: 6,
        description: "records: embedding and document in an append-only value log (SQLite)",
        sql: r#"
CREATE TABLE record_values (
    seq           INTEGER PRIMARY KEY,
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    embedding     BLOB    NULL,
    document      TEXT    NULL
);

CREATE TABLE records_v6 (
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    metadata      TEXT    NULL,
    last_offset   INTEGER NOT NULL,
    value         INTEGER NULL,
    PRIMARY KEY (collection_id, id)
);

INSERT INTO record_values (seq, collection_id, id, embedding, document)
    SELECT rowid, collection_id, id, embedding, document FROM records
    WHERE embedding IS NOT NULL OR document IS NOT NULL ORDER BY rowid;
INSERT INTO records_v6 (rowid, collection_id, id, metadata, last_offset, value)
    SELECT rowid, collection_id, id, metadata, last_offset,
           CASE WHEN embedding IS NULL AND document IS NULL THEN NULL ELSE rowid END
    FROM records ORDER BY rowid;
DROP TABLE records;
ALTER TABLE records_v6 RENAME TO records;

CREATE TABLE value_log (
    one     INTEGER NOT NULL PRIMARY KEY CHECK (one = 1),
    records INTEGER NOT NULL
) WITHOUT ROWID;
INSERT INTO value_log (one, records) SELECT 1, count(*) FROM records;
"#,
    },
    Migration {
        version: 7,
        description: "records: clustered on (collection_id, id) now that its rows are small (SQLite)",
        sql: r#"
CREATE TABLE records_v7 (
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    metadata      TEXT    NULL,
    last_offset   INTEGER NOT NULL,
    value         INTEGER NULL,
    PRIMARY KEY (collection_id, id)
) WITHOUT ROWID;
INSERT INTO records_v7 (collection_id, id, metadata, last_offset, value)
    SELECT collection_id, id, metadata, last_offset, value FROM records ORDER BY collection_id, id;
DROP TABLE records;
ALTER TABLE records_v7 RENAME TO records;
"#,
    },
    Migration {
        version: 8,
        description: "records: row changes appended to a delta, merged into records in large runs (SQLite)",
        sql: r#"
CREATE TABLE record_delta (
    seq           INTEGER PRIMARY KEY,
    collection_id TEXT    NOT NULL,
    id            TEXT    NOT NULL,
    metadata      TEXT    NULL,
    last_offset   INTEGER NULL,
    value         INTEGER NULL
);
ALTER TABLE value_log ADD COLUMN delta_merges INTEGER NOT NULL DEFAULT 0;
"#,
    },
    Migration {
        version: 9,
        description: "records: pages filled to 70%, room for a row's next version on its own page (PostgreSQL)",
        // SQLite has no fill factor: its upserts rewrite the row in place.
        sql: "SELECT 1;",
    },
    Migration {
        version: 10,
        description: "records: the value log and the delta bounded in bytes (SQLite)",
        // `value_bytes`: the bytes of a row's value (embedding + document), so that
        // overwriting or merging a record knows what it frees without reading the value;
        // NULL for rows written before this step (read from the value then). `log_bytes`
        // and `live_bytes`: every value's bytes and the bytes of the values `records`
        // points at (the delta's rows count once merged); `delta_bytes`: keys, metadata
        // and values of the unmerged delta rows. The count of records is no longer needed.
        // Reads every value's header once (lengths only): the time of a scan of the file.
        sql: r#"
ALTER TABLE records ADD COLUMN value_bytes INTEGER NULL;
ALTER TABLE record_delta ADD COLUMN value_bytes INTEGER NULL;
ALTER TABLE value_log ADD COLUMN log_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE value_log ADD COLUMN live_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE value_log ADD COLUMN delta_bytes INTEGER NOT NULL DEFAULT 0;
ALTER TABLE value_log DROP COLUMN records;
UPDATE value_log SET
    log_bytes = (SELECT COALESCE(sum(COALESCE(length(embedding), 0) + COALESCE(octet_length(document), 0)), 0)
                 FROM record_values),
    live_bytes = (SELECT COALESCE(sum(COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0)), 0)
                  FROM records r JOIN record_values v ON v.seq = r.value),
    delta_bytes = 0;
UPDATE record_delta SET value_bytes = (SELECT COALESCE(length(v.embedding), 0) + COALESCE(octet_length(v.document), 0)
                                       FROM record_values v WHERE v.seq = record_delta.value)
    WHERE value IS NOT NULL;
UPDATE value_log SET
    delta_bytes = (SELECT COALESCE(sum(octet_length(collection_id) + octet_length(id) + COALESCE(octet_length(metadata), 0)
                                       + COALESCE(value_bytes, 0)), 0)
                   FROM record_delta);
"#,
    },
    Migration {
        version: 11,
        description: "sluice_* views: the SQL read interface, version 1",
        // Plain SQL only (no function Sluice registers, no window function; common table
        // expressions need SQLite 3.8.3), so that any SQLite reads them.
        // `sluice_records`: the newest delta row of a key (the greatest `seq`) overrides
        // `records`, a delete there (NULL `last_offset`) hides it; the records without a
        // delta row are an anti-join, which SQLite answers with an automatic index on the
        // delta's keys (the delta is bounded by `sqlite.delta_max_rows`). One statement is
        // one read transaction: the delta, `records` and the value log are read in one
        // snapshot, so a merge or a compaction committing meanwhile is seen whole or not at
        // all. The value's columns are scalar subqueries, not a join: a query that does
        // not name them never reads the value log (SQLite does not drop an unused join out
        // of this compound subquery). Measured with a sqlite3 3.40 shell on 200,000
        // records with 1.5 KiB values (16 KiB pages, 4,096 delta rows, file cached):
        // `count(*)` 0.25 s against 1.4 s with a join, a count grouped by a metadata key
        // 0.20 s against 0.73 s; reading every value costs more, 0.88 s against 0.70 s
        // (three lookups of each value instead of one). `length(embedding) / 4` is the
        // dimension (4 bytes per f32; SQLite takes a blob's length from its header).
        sql: concat!(
            r#"
CREATE VIEW sluice_views_version AS SELECT 1 AS version;

CREATE VIEW sluice_records AS
WITH newest AS (
    SELECT d.collection_id, d.id, d.metadata, d.last_offset, d.value
    FROM record_delta d
    JOIN (SELECT max(seq) AS seq FROM record_delta GROUP BY collection_id, id) m ON m.seq = d.seq
),
current AS (
    SELECT collection_id, id, metadata, last_offset, value FROM newest WHERE last_offset IS NOT NULL
    UNION ALL
    SELECT r.collection_id, r.id, r.metadata, r.last_offset, r.value
    FROM records r LEFT JOIN newest k ON k.collection_id = r.collection_id AND k.id = r.id
    WHERE k.id IS NULL
)
SELECT c.collection_id AS collection, c.id AS id,
       (SELECT v.embedding FROM record_values v WHERE v.seq = c.value) AS embedding,
       (SELECT length(v.embedding) / 4 FROM record_values v WHERE v.seq = c.value) AS dimension,
       c.metadata AS metadata,
       (SELECT v.document FROM record_values v WHERE v.seq = c.value) AS document,
       c.last_offset AS last_offset
FROM current c;

"#,
            common_views!()
        ),
    },
    Migration {
        version: 12,
        description: "changelog: the per-partition outbox of the change feed and its sequence",
        sql: r#"
CREATE TABLE changelog_partitions (
    partition       INTEGER NOT NULL PRIMARY KEY,
    next_seq        INTEGER NOT NULL,
    published_seq   INTEGER NOT NULL DEFAULT -1,
    published_at_ms INTEGER NULL,
    outbox_bytes    INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

CREATE TABLE changelog_outbox (
    partition     INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    collection_id TEXT    NOT NULL,
    record_id     TEXT    NOT NULL,
    operation     TEXT    NOT NULL CHECK (operation IN ('insert', 'update', 'delete')),
    source_offset INTEGER NOT NULL,
    value         BLOB    NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (partition, seq)
);
"#,
    },
    Migration {
        version: 13,
        description: "changelog: the snapshot of a partition's records and its cursor",
        sql: r#"
ALTER TABLE changelog_partitions ADD COLUMN snapshot_requested_at_ms INTEGER NULL;
ALTER TABLE changelog_partitions ADD COLUMN snapshot_collection TEXT NULL;
ALTER TABLE changelog_partitions ADD COLUMN snapshot_id TEXT NULL;
ALTER TABLE changelog_partitions ADD COLUMN snapshot_records INTEGER NOT NULL DEFAULT 0;
ALTER TABLE changelog_partitions ADD COLUMN snapshot_finished_at_ms INTEGER NULL;

CREATE TABLE changelog_outbox_13 (
    partition     INTEGER NOT NULL,
    seq           INTEGER NOT NULL,
    collection_id TEXT    NOT NULL,
    record_id     TEXT    NOT NULL,
    operation     TEXT    NOT NULL CHECK (operation IN ('insert', 'update', 'delete', 'snapshot')),
    source_offset INTEGER NOT NULL,
    value         BLOB    NULL,
    created_at_ms INTEGER NOT NULL,
    PRIMARY KEY (partition, seq)
);
INSERT INTO changelog_outbox_13 (partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms)
SELECT partition, seq, collection_id, record_id, operation, source_offset, value, created_at_ms FROM changelog_outbox;
DROP TABLE changelog_outbox;
ALTER TABLE changelog_outbox_13 RENAME TO changelog_outbox;
"#,
    },
    Migration {
        version: 14,
        description: "functions as WebAssembly components: stored components, failed functions",
        sql: concat!(
            r#"
CREATE TABLE function_components (
    sha256        TEXT    NOT NULL PRIMARY KEY,
    bytes         BLOB    NOT NULL,
    size          INTEGER NOT NULL,
    world_version TEXT    NOT NULL,
    created_at_ms INTEGER NOT NULL
);
ALTER TABLE functions ADD COLUMN failed_reason TEXT NULL;
ALTER TABLE functions ADD COLUMN failed_at_ms INTEGER NULL;
DROP VIEW sluice_functions;
CREATE VIEW sluice_functions AS
"#,
            functions_view_v2!(),
            r#"DROP VIEW sluice_views_version;
CREATE VIEW sluice_views_version AS SELECT 2 AS version;
"#
        ),
    },
];

/// PostgreSQL steps.
///
/// * Every text key is `COLLATE "C"` (byte order): paging by `id > $after ORDER BY id`
///   must agree with Rust's `str` order and with SQLite, whatever the database's
///   default collation is (en_US.UTF-8 would sort `"B" < "a"` differently).
/// * `metadata` is `TEXT`, not `JSONB`: JSONB stores numbers as `numeric`, which has no
///   negative zero (-0.0 would read back as 0.0) — and we never query inside it.
/// * `embedding` uses `STORAGE EXTERNAL`: packed floats do not compress, so large
///   embeddings are moved out of line without first trying pglz on them.
pub(crate) const POSTGRES: &[Migration] = &[
    Migration {
        version: 1,
        description: "positions, collections, records, gaps, offset resets",
        sql: r#"
CREATE TABLE meta (
    key   TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE partitions (
    topic         TEXT COLLATE "C" NOT NULL,
    partition     INTEGER NOT NULL,
    next_offset   BIGINT  NOT NULL CHECK (next_offset >= 0),
    updated_at_ms BIGINT  NOT NULL,
    PRIMARY KEY (topic, partition)
);

CREATE TABLE collections (
    id            TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    partition     INTEGER NOT NULL,
    dimension     INTEGER NULL,
    log_position  BIGINT  NOT NULL DEFAULT -1,
    record_count  BIGINT  NOT NULL DEFAULT 0,
    created_at_ms BIGINT  NOT NULL
);

CREATE TABLE records (
    collection_id TEXT COLLATE "C" NOT NULL,
    id            TEXT COLLATE "C" NOT NULL,
    embedding     BYTEA  NULL,
    metadata      TEXT   NULL,
    document      TEXT   NULL,
    last_offset   BIGINT NOT NULL,
    PRIMARY KEY (collection_id, id)
);
ALTER TABLE records ALTER COLUMN embedding SET STORAGE EXTERNAL;

CREATE TABLE gaps (
    id             BIGSERIAL PRIMARY KEY,
    topic          TEXT COLLATE "C" NOT NULL,
    partition      INTEGER NOT NULL,
    from_offset    BIGINT  NOT NULL,
    to_offset      BIGINT  NOT NULL,
    recorded_at_ms BIGINT  NOT NULL
);
CREATE INDEX gaps_by_topic ON gaps (topic, id);

CREATE TABLE offset_resets (
    id          BIGSERIAL PRIMARY KEY,
    topic       TEXT COLLATE "C" NOT NULL,
    partition   INTEGER NOT NULL,
    from_offset BIGINT  NULL,
    to_offset   BIGINT  NOT NULL,
    actor       TEXT    NOT NULL,
    reason      TEXT    NOT NULL,
    at_ms       BIGINT  NOT NULL
);
CREATE INDEX offset_resets_by_topic ON offset_resets (topic, id);
"#,
    },
    Migration {
        version: 2,
        description: "attached functions: functions, outbox, preimages, counters, tombstones",
        sql: r#"
CREATE TABLE functions (
    id                TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    collection_id     TEXT COLLATE "C" NOT NULL,
    function          TEXT    NOT NULL,
    output_collection TEXT COLLATE "C" NOT NULL,
    params            TEXT    NOT NULL,
    status            TEXT    NOT NULL CHECK (status IN ('awaiting_marker', 'backfilling', 'ready', 'detached')),
    request_id        TEXT    NOT NULL,
    marker_offset     BIGINT  NULL,
    backfill_cursor   TEXT COLLATE "C" NULL,
    backfill_done     BIGINT  NOT NULL DEFAULT 0,
    backfill_total    BIGINT  NULL,
    created_at_ms     BIGINT  NOT NULL,
    updated_at_ms     BIGINT  NOT NULL
);
CREATE UNIQUE INDEX functions_one_live_per_output ON functions (collection_id, output_collection) WHERE status <> 'detached';
CREATE INDEX functions_by_collection ON functions (collection_id, created_at_ms);

CREATE TABLE outbox (
    id            BIGSERIAL PRIMARY KEY,
    function_id   TEXT COLLATE "C" NOT NULL,
    collection_id TEXT COLLATE "C" NOT NULL,
    partition     INTEGER NOT NULL,
    request_id    TEXT    NOT NULL,
    created_at_ms BIGINT  NOT NULL,
    sent_at_ms    BIGINT  NULL
);
CREATE INDEX outbox_pending ON outbox (id) WHERE sent_at_ms IS NULL;

CREATE TABLE preimages (
    function_id TEXT COLLATE "C" NOT NULL,
    record_id   TEXT COLLATE "C" NOT NULL,
    embedding   BYTEA  NULL,
    metadata    TEXT   NULL,
    document    TEXT   NULL,
    last_offset BIGINT NOT NULL,
    PRIMARY KEY (function_id, record_id)
);
ALTER TABLE preimages ALTER COLUMN embedding SET STORAGE EXTERNAL;

CREATE TABLE function_counters (
    function_id TEXT COLLATE "C" NOT NULL,
    output_id   TEXT COLLATE "C" NOT NULL,
    count       BIGINT NOT NULL,
    PRIMARY KEY (function_id, output_id)
);

CREATE TABLE tombstones (
    collection_id TEXT COLLATE "C" NOT NULL,
    id            TEXT COLLATE "C" NOT NULL,
    last_offset   BIGINT NOT NULL,
    PRIMARY KEY (collection_id, id)
);
"#,
    },
    Migration {
        version: 3,
        description: "partition halts: halted_reason, halted_at_ms",
        sql: r#"
ALTER TABLE partitions ADD COLUMN halted_reason TEXT NULL, ADD COLUMN halted_at_ms BIGINT NULL;
"#,
    },
    Migration {
        version: 4,
        description: "outbox/functions: published marker offsets, one live writer per output",
        sql: r#"
ALTER TABLE outbox ADD COLUMN published_offset BIGINT NULL;
CREATE UNIQUE INDEX functions_one_live_writer_per_output ON functions (output_collection) WHERE status <> 'detached';
CREATE INDEX functions_awaiting_marker ON functions (created_at_ms) WHERE status = 'awaiting_marker';
"#,
    },
    Migration {
        version: 5,
        description: "dlq_replays: DLQ entries replayed into the log",
        sql: r#"
CREATE TABLE dlq_replays (
    topic         TEXT COLLATE "C" NOT NULL,
    dlq_partition INTEGER NOT NULL,
    dlq_offset    BIGINT  NOT NULL,
    replayed_at   BIGINT  NOT NULL,
    log_partition INTEGER NOT NULL,
    log_offset    BIGINT  NOT NULL,
    PRIMARY KEY (topic, dlq_partition, dlq_offset)
);
"#,
    },
    Migration {
        version: 6,
        description: "records: embedding and document in an append-only value log (SQLite)",
        // PostgreSQL keeps them in the row: an update writes a new row version anyway
        // (MVCC appends), and large values already live out of line (TOAST).
        sql: "SELECT 1;",
    },
    Migration {
        version: 7,
        description: "records: clustered on (collection_id, id) now that its rows are small (SQLite)",
        // PostgreSQL's heap is not clustered by any key; its primary key index is the
        // lookup path already.
        sql: "SELECT 1;",
    },
    Migration {
        version: 8,
        description: "records: row changes appended to a delta, merged into records in large runs (SQLite)",
        // PostgreSQL writes a row's new version and a WAL record of it, not whole pages
        // per commit (after a page's first change since a checkpoint).
        sql: "SELECT 1;",
    },
    Migration {
        version: 9,
        description: "records: pages filled to 70%, room for a row's next version on its own page (PostgreSQL)",
        // An upsert writes the row's new version; with room on the row's page it stays
        // there (a HOT update: no new entry in the primary key index, and the page's dead
        // versions are pruned in place). Full pages send it to another page and add an
        // index entry. Applies to pages written from now on.
        sql: "ALTER TABLE records SET (fillfactor = 70);",
    },
    Migration {
        version: 10,
        description: "records: the value log and the delta bounded in bytes (SQLite)",
        // PostgreSQL's dead row versions are vacuumed by the server (autovacuum).
        sql: "SELECT 1;",
    },
    Migration {
        version: 11,
        description: "sluice_* views: the SQL read interface, version 1",
        // The records keep their values in the row: the views rename and derive, nothing
        // more. A statement reads one snapshot. Casts fix each column's type, so that
        // `CREATE OR REPLACE VIEW` in a later step keeps them.
        sql: concat!(
            r#"
CREATE VIEW sluice_views_version AS SELECT 1::integer AS version;

CREATE VIEW sluice_records AS
SELECT collection_id AS collection, id, embedding, (octet_length(embedding) / 4)::integer AS dimension,
       metadata, document, last_offset
FROM records;

"#,
            common_views!()
        ),
    },
    Migration {
        version: 12,
        description: "changelog: the per-partition outbox of the change feed and its sequence",
        sql: r#"
CREATE TABLE changelog_partitions (
    partition       INTEGER NOT NULL PRIMARY KEY,
    next_seq        BIGINT  NOT NULL,
    published_seq   BIGINT  NOT NULL DEFAULT -1,
    published_at_ms BIGINT  NULL,
    outbox_bytes    BIGINT  NOT NULL DEFAULT 0
);

CREATE TABLE changelog_outbox (
    partition     INTEGER NOT NULL,
    seq           BIGINT  NOT NULL,
    collection_id TEXT COLLATE "C" NOT NULL,
    record_id     TEXT COLLATE "C" NOT NULL,
    operation     TEXT    NOT NULL CHECK (operation IN ('insert', 'update', 'delete')),
    source_offset BIGINT  NOT NULL,
    value         BYTEA   NULL,
    created_at_ms BIGINT  NOT NULL,
    PRIMARY KEY (partition, seq)
);
ALTER TABLE changelog_outbox ALTER COLUMN value SET STORAGE EXTERNAL;
"#,
    },
    Migration {
        version: 13,
        description: "changelog: the snapshot of a partition's records and its cursor",
        sql: r#"
ALTER TABLE changelog_partitions
    ADD COLUMN snapshot_requested_at_ms BIGINT NULL,
    ADD COLUMN snapshot_collection      TEXT COLLATE "C" NULL,
    ADD COLUMN snapshot_id              TEXT COLLATE "C" NULL,
    ADD COLUMN snapshot_records         BIGINT NOT NULL DEFAULT 0,
    ADD COLUMN snapshot_finished_at_ms  BIGINT NULL;
ALTER TABLE changelog_outbox
    DROP CONSTRAINT changelog_outbox_operation_check,
    ADD CONSTRAINT changelog_outbox_operation_check
        CHECK (operation IN ('insert', 'update', 'delete', 'snapshot'));
"#,
    },
    Migration {
        version: 14,
        description: "functions as WebAssembly components: stored components, failed functions",
        sql: concat!(
            r#"
CREATE TABLE function_components (
    sha256        TEXT COLLATE "C" NOT NULL PRIMARY KEY,
    bytes         BYTEA   NOT NULL,
    size          BIGINT  NOT NULL,
    world_version TEXT    NOT NULL,
    created_at_ms BIGINT  NOT NULL
);
ALTER TABLE functions ADD COLUMN failed_reason TEXT NULL;
ALTER TABLE functions ADD COLUMN failed_at_ms BIGINT NULL;
CREATE OR REPLACE VIEW sluice_functions AS
"#,
            functions_view_v2!(),
            r#"CREATE OR REPLACE VIEW sluice_views_version AS SELECT 2::integer AS version;
"#
        ),
    },
];

/// `CREATE TABLE` of the bookkeeping table, valid in both dialects.
pub(crate) const CREATE_SCHEMA_MIGRATIONS: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       BIGINT NOT NULL PRIMARY KEY,
    description   TEXT   NOT NULL,
    applied_at_ms BIGINT NOT NULL
)";

/// Highest version in `steps`.
pub(crate) fn latest(steps: &[Migration]) -> i64 {
    steps.last().map(|m| m.version).unwrap_or(0)
}

/// The steps still to apply on a database at `current` (0 = empty), or a `Config`
/// error when the database is newer than this binary.
pub(crate) fn pending(
    steps: &'static [Migration],
    current: i64,
    backend: &str,
) -> Result<&'static [Migration], SysdbError> {
    let known = latest(steps);
    if current > known {
        return Err(SysdbError::Config(format!(
            "the {backend} sysdb has schema version {current} but this sluice binary knows versions up to {known}; \
             run a sluice release at least as new as the one that migrated it"
        )));
    }
    let first = steps.partition_point(|m| m.version <= current);
    Ok(&steps[first..])
}

/// For commands that only read: the database must be at exactly this binary's latest
/// version. `current` is `None` when it has no `schema_migrations` table at all.
pub(crate) fn require_current(
    steps: &'static [Migration],
    current: Option<i64>,
    backend: &str,
) -> Result<(), SysdbError> {
    let known = latest(steps);
    match current {
        None | Some(0) => {
            Err(SysdbError::Config(format!("the {backend} sysdb has no Sluice schema: run `sluice init` to create it")))
        }
        Some(v) if v < known => Err(SysdbError::Config(format!(
            "the {backend} sysdb is at schema version {v}, older than this binary's {known}: \
             `sluice init` migrates it (read commands never do)"
        ))),
        Some(v) => pending(steps, v, backend).map(|_| ()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The version of the views' contract (step 11 and the module docs): what
    /// `sluice_views_version` returns.
    const VIEWS_VERSION: i64 = 2;

    #[test]
    fn versions_are_contiguous_from_one_and_the_same_on_both_backends() {
        for steps in [SQLITE, POSTGRES] {
            for (i, m) in steps.iter().enumerate() {
                assert_eq!(m.version, i as i64 + 1, "{}", m.description);
            }
        }
        let s: Vec<_> = SQLITE.iter().map(|m| (m.version, m.description)).collect();
        let p: Vec<_> = POSTGRES.iter().map(|m| (m.version, m.description)).collect();
        assert_eq!(s, p, "both backends must have the same steps");
    }

    #[test]
    fn pending_skips_applied_steps_and_refuses_newer_databases() {
        assert_eq!(pending(SQLITE, 0, "sqlite").unwrap().len(), SQLITE.len());
        assert!(pending(SQLITE, latest(SQLITE), "sqlite").unwrap().is_empty());
        let err = pending(SQLITE, latest(SQLITE) + 1, "sqlite").unwrap_err();
        assert!(
            matches!(err, SysdbError::Config(ref m) if m.contains("newer") || m.contains("knows versions")),
            "{err}"
        );
    }

    #[test]
    fn sqlite_steps_apply_on_a_fresh_database() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_SCHEMA_MIGRATIONS).unwrap();
        for m in SQLITE {
            conn.execute_batch(m.sql).unwrap();
        }
    }

    /// The views' columns as `docs/reading.md` lists them: per `### `view`` heading, the
    /// first cell of each row of its table (up to the next heading).
    fn documented_views() -> Vec<(String, Vec<String>)> {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reading.md");
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
        let mut views: Vec<(String, Vec<String>)> = Vec::new();
        let mut in_view = false;
        for line in text.lines() {
            if line.starts_with('#') {
                let name = line.strip_prefix("### `").and_then(|l| l.strip_suffix('`'));
                in_view = name.is_some();
                views.extend(name.map(|n| (n.to_string(), Vec::new())));
            } else if let (true, Some((_, columns)), Some(cell)) = (in_view, views.last_mut(), line.strip_prefix("| `"))
            {
                columns.push(cell.split('`').next().unwrap_or_default().to_string());
            }
        }
        views
    }

    /// Every view on SQLite has exactly the columns `docs/reading.md` documents, in that
    /// order, and no other `sluice_*` view exists: a later step that drops, renames or
    /// reorders a column, or forgets to define a view again, fails here (the PostgreSQL
    /// side and the column types are checked against a real server by the integration
    /// test `integration-tests/tests/it/sql_views.rs`).
    #[test]
    fn the_sqlite_views_have_the_documented_columns_and_version() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_SCHEMA_MIGRATIONS).unwrap();
        for m in SQLITE {
            conn.execute_batch(m.sql).unwrap();
        }
        let documented = documented_views();
        assert!(documented.len() >= 5, "docs/reading.md documents {documented:?}");
        let mut in_database: Vec<String> = conn
            .prepare(
                "SELECT name FROM sqlite_schema WHERE type = 'view' AND name LIKE 'sluice!_%' ESCAPE '!' ORDER BY name",
            )
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        let mut names: Vec<String> = documented.iter().map(|(n, _)| n.clone()).collect();
        names.sort();
        in_database.sort();
        assert_eq!(in_database, names, "the sluice_* views of the schema against those docs/reading.md documents");
        for (view, columns) in &documented {
            let actual: Vec<String> = conn
                .prepare(&format!("SELECT name FROM pragma_table_info('{view}') ORDER BY cid"))
                .unwrap()
                .query_map([], |r| r.get(0))
                .unwrap()
                .collect::<rusqlite::Result<_>>()
                .unwrap();
            assert_eq!(&actual, columns, "the columns of {view} (docs/reading.md lists the contract)");
        }
        let version: i64 = conn.query_row("SELECT version FROM sluice_views_version", [], |r| r.get(0)).unwrap();
        assert_eq!(version, VIEWS_VERSION, "sluice_views_version");
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reading.md")).unwrap();
        let promised = format!("`SELECT version FROM sluice_views_version` answers `{VIEWS_VERSION}`");
        assert!(doc.contains(&promised), "docs/reading.md says {promised:?}");
        for steps in [SQLITE, POSTGRES] {
            let defined = steps.iter().rfind(|m| m.sql.contains("VIEW sluice_views_version AS"));
            let sql = defined.expect("a step defines sluice_views_version").sql;
            assert!(
                sql.contains(&format!("SELECT {VIEWS_VERSION} AS"))
                    || sql.contains(&format!("SELECT {VIEWS_VERSION}::integer AS")),
                "the last definition of sluice_views_version returns VIEWS_VERSION ({VIEWS_VERSION}): {sql}"
            );
        }
    }
}
