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
//!   (see `codec.rs`).
//! * `gaps(...)` — data-loss gaps skipped under `on_data_loss = "skip"`.
//! * `offset_resets(...)` — the audit trail of operator overrides.

use super::SysdbError;

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
/// `records`, `partitions`, `collections`, `meta` are `WITHOUT ROWID`: the primary key
/// *is* the table's b-tree, so a lookup by (collection_id, id) is one b-tree search and
/// no separate index has to be maintained on every upsert.
pub(crate) const SQLITE: &[Migration] = &[Migration {
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
) WITHOUT ROWID;

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
}];

/// PostgreSQL steps.
///
/// * Every text key is `COLLATE "C"` (byte order): paging by `id > $after ORDER BY id`
///   must agree with Rust's `str` order and with SQLite, whatever the database's
///   default collation is (en_US.UTF-8 would sort `"B" < "a"` differently).
/// * `metadata` is `TEXT`, not `JSONB`: JSONB stores numbers as `numeric`, which has no
///   negative zero (-0.0 would read back as 0.0) — and we never query inside it.
/// * `embedding` uses `STORAGE EXTERNAL`: packed floats do not compress, so large
///   embeddings are moved out of line without first trying pglz on them.
pub(crate) const POSTGRES: &[Migration] = &[Migration {
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
}];

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
pub(crate) fn pending(steps: &'static [Migration], current: i64, backend: &str) -> Result<&'static [Migration], SysdbError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(err, SysdbError::Config(ref m) if m.contains("newer") || m.contains("knows versions")), "{err}");
    }

    #[test]
    fn sqlite_steps_apply_on_a_fresh_database() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        conn.execute_batch(CREATE_SCHEMA_MIGRATIONS).unwrap();
        for m in SQLITE {
            conn.execute_batch(m.sql).unwrap();
        }
    }
}
