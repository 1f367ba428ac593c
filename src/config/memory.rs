//! The replica's worst-case memory, as a formula of its configuration.
//!
//! Every store a replica keeps in memory is bounded in bytes; this adds up the bounds, so
//! that `docs/configuration.md` states the formula (rendered from [`terms`]) and a test
//! holds a replica under hostile record sizes to the same number. It counts the process's
//! anonymous memory (heap, stacks, the databases' caches); pages of the SQLite file mapped
//! for reads (`mmap`, up to 2 GiB) are the operating system's page cache, shared and
//! reclaimable, and are left out.

use super::Config;

const MIB: u64 = 1 << 20;

/// librdkafka's prefetch bound per partition (`queued.max.messages.kbytes`) that the
/// consumer sets unless `[librdkafka]` does.
pub const DEFAULT_PREFETCH_KBYTES: u64 = crate::kafka::consumer::PREFETCH_KBYTES;

/// Messages per chunk and bytes per chunk, the consumer's unit of hand-over (a larger
/// message is a chunk of its own).
pub const CHUNK_BYTES: u64 = MIB;

/// Chunks in flight between the consumer thread and the workers.
pub const CHANNEL_CHUNKS: u64 = 32;

/// Chunks a worker holds beside its batch: 2 in its inbox, 2 more before the consumer
/// stops reading its partition.
pub const WORKER_CHUNKS: u64 = 4;

/// SQLite's page caches: the writer's (its sorter spills past the same size), each
/// reader's, the checkpoint thread's. Kept equal to the constants of `sysdb/sqlite/`
/// (a unit test there checks).
pub const SQLITE_WRITER_CACHE: u64 = 16 * MIB;
pub const SQLITE_READER_CACHE: u64 = 8 * MIB;
pub const SQLITE_CHECKPOINTER_CACHE: u64 = 2 * MIB;

/// PostgreSQL: message buffers per pooled connection, and the pool's size.
pub const POSTGRES_CONNECTION_BUFFER: u64 = MIB;
pub const POSTGRES_POOL: u64 = 8;

/// The rest: the async runtime and its threads, librdkafka's own state, the HTTP server,
/// TLS, the allocator's metadata. Measured: an idle replica with 8 partitions holds
/// 40-60 MB.
pub const BASE: u64 = 100 * MIB;

/// The WebAssembly functions a replica runs, which the configuration does not bound: how
/// many are attached to collections in its partitions (`W`), and the sum of their
/// components' compiled sizes (`K`: the `.cwasm` files of the compile cache).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WasmLoad {
    pub functions: u64,
    pub compiled_bytes: u64,
}

/// One term of the bound: what it is, its formula, and its value for a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub what: &'static str,
    pub formula: &'static str,
    pub bytes: u64,
}

/// The terms of the worst case of a replica that owns `partitions` partitions, where the
/// largest message the broker accepts is `max_message_bytes` (the topic's
/// `max.message.bytes`, by default the broker's `message.max.bytes`, 1 MiB), running the
/// WebAssembly functions of `wasm`.
pub fn terms(config: &Config, partitions: u64, max_message_bytes: u64, wasm: WasmLoad) -> Vec<Term> {
    let m = max_message_bytes;
    let chunk = CHUNK_BYTES + m;
    let batch = config.processor.batch_max_bytes as u64 + chunk;
    let prefetch = config
        .librdkafka
        .get("queued.max.messages.kbytes")
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(DEFAULT_PREFETCH_KBYTES)
        * 1024;
    let per_partition = 3 * batch + WORKER_CHUNKS * chunk + prefetch + m;
    let backfill = config.backfill.concurrency as u64 * (config.backfill.chunk_max_bytes as u64 + m);
    let mut out = vec![
        Term {
            what: "per owned partition: the batch being committed (its payload, its decoded records, the stored records they replace), the chunks waiting for its worker, librdkafka's prefetch",
            formula: "P x (3 x B + 4 x C + Q + M)",
            bytes: partitions * per_partition,
        },
        Term {
            what: "chunks on their way from the consumer thread to the workers",
            formula: "32 x C",
            bytes: CHANNEL_CHUNKS * chunk,
        },
        Term {
            what: "backfill chunks being computed (the fields the function reads; a chunk closes past its byte bound)",
            formula: "backfill.concurrency x (backfill.chunk_max_bytes + M)",
            bytes: backfill,
        },
    ];
    // A WebAssembly function's instance lives in the worker of its collection's partition
    // (one per function), and one more in each backfill task that computes it.
    let instances = wasm.functions + wasm.functions.min(config.backfill.concurrency as u64);
    out.push(Term {
        what: "WebAssembly functions: the linear memory of each instance (one per attached function whose collection is in an owned partition, one per backfill task running one), and the components' compiled code",
        formula: "(W + min(W, backfill.concurrency)) x wasm.max_memory_bytes + K",
        bytes: instances * config.wasm.max_memory_bytes as u64 + wasm.compiled_bytes,
    });
    if config.changelog.enabled {
        let run = config.changelog.max_bytes_per_transaction as u64 + m;
        out.push(Term {
            what: "with [changelog] enabled, per owned partition: the encoded changes of the batch being committed, the committed changes handed to the relay in memory, and the relay's run in flight (read from the outbox, framed, in librdkafka's queue)",
            formula: "P x (B + changelog.handoff_max_bytes + 3 x (changelog.max_bytes_per_transaction + M))",
            bytes: partitions * (batch + config.changelog.handoff_max_bytes + 3 * run),
        });
    }
    if config.sysdb.url.starts_with("sqlite") {
        let q = &config.sqlite;
        let caches =
            2 * SQLITE_WRITER_CACHE + u64::from(q.reader_connections) * SQLITE_READER_CACHE + SQLITE_CHECKPOINTER_CACHE;
        out.push(Term {
            what: "SQLite: the writer's page cache and sorter, each reader's cache, the checkpoint thread's",
            formula: "2 x 16 MiB + sqlite.reader_connections x 8 MiB + 2 MiB",
            bytes: caches,
        });
        out.push(Term {
            what: "SQLite: the processor's index of the records delta (keys, and metadata up to its budget), a row or value being written, merged or compacted, and SQLite's copy of it",
            formula: "sqlite.delta_cache_bytes + sqlite.delta_max_bytes + 4 x M",
            bytes: q.delta_cache_bytes + q.delta_max_bytes + 4 * m,
        });
    } else {
        out.push(Term {
            what: "PostgreSQL: message buffers of the pooled connections",
            formula: "8 x 1 MiB",
            bytes: POSTGRES_POOL * POSTGRES_CONNECTION_BUFFER,
        });
    }
    out.push(Term {
        what: "the rest (runtime, threads, librdkafka, HTTP, allocator metadata)",
        formula: "100 MiB",
        bytes: BASE,
    });
    out
}

/// The sum of [`terms`].
pub fn worst_case(config: &Config, partitions: u64, max_message_bytes: u64, wasm: WasmLoad) -> u64 {
    terms(config, partitions, max_message_bytes, wasm).iter().map(|t| t.bytes).sum()
}

/// The Markdown section of `docs/configuration.md`.
pub fn render() -> String {
    let example = Config::default();
    let (p, m) = (8, 1_048_588);
    let mut md = String::from(
        "## Memory: the worst case\n\n\
         Every store a replica keeps in memory is bounded in bytes. With `P` the partitions the\n\
         replica owns, `M` the largest message the broker accepts (the topic's\n\
         `max.message.bytes`, by default the broker's `message.max.bytes`: 1 MiB), a chunk\n\
         `C = 1 MiB + M`, a batch `B = processor.batch_max_bytes + C` and librdkafka's prefetch\n\
         per partition `Q` (`queued.max.messages.kbytes`, 2 MiB unless set under\n\
         `[librdkafka]`), `W` the WebAssembly functions attached to collections in those\n\
         partitions and `K` the sum of their components' compiled sizes (their `.cwasm` files\n\
         in `wasm.cache_dir`: under 100 KB for the C example, about 40 MB for a component built with\n\
         componentize-py or componentize-js), a replica's anonymous memory stays below the sum\n\
         of:\n\n\
         | term | formula |\n| --- | --- |\n",
    );
    let mut sqlite = example.clone();
    sqlite.sysdb.url = "sqlite://x".into();
    let mut postgres = example;
    postgres.sysdb.url = "postgres://x".into();
    let mut changelog = sqlite.clone();
    changelog.changelog.enabled = true;
    let mut seen = std::collections::BTreeSet::new();
    let none = WasmLoad::default();
    for t in
        terms(&sqlite, p, m, none).into_iter().chain(terms(&postgres, p, m, none)).chain(terms(&changelog, p, m, none))
    {
        if seen.insert(t.formula) {
            md.push_str(&format!("| {} | `{}` |\n", t.what, t.formula));
        }
    }
    md.push_str(&format!(
        "\nWith the defaults, 8 partitions, 1 MiB messages and no WebAssembly function: {} MiB on\n\
         SQLite, {} MiB on PostgreSQL; each WebAssembly function adds up to twice\n\
         `wasm.max_memory_bytes` (256 MiB) and its compiled code. It is an upper bound, not a typical figure: a replica catching up on\n\
         records at the validation limits (2 partitions, 3 MiB messages: a bound of about 530\n\
         MiB) peaked at 270-290 MiB, the allocator's retention of freed memory included. Pages\n\
         of the SQLite file mapped for reads (up to 2 GiB) are the operating system's page\n\
         cache, shared and reclaimable, and count in RSS but not here. A test\n\
         (`hostile_sizes_stay_under_the_memory_formula`) holds a replica to this bound with\n\
         records at the validation limits, before and after a kill -9.\n",
        worst_case(&sqlite, p, m, none) / MIB,
        worst_case(&postgres, p, m, none) / MIB
    ));
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bound_grows_with_what_the_configuration_allows() {
        let c = Config::default();
        let none = WasmLoad::default();
        let base = worst_case(&c, 8, MIB, none);
        assert!(worst_case(&c, 16, MIB, none) > base, "more partitions");
        assert!(worst_case(&c, 8, 8 * MIB, none) > base, "larger messages");
        let mut bigger = c.clone();
        bigger.processor.batch_max_bytes *= 2;
        assert_eq!(worst_case(&bigger, 8, MIB, none) - base, 8 * 3 * c.processor.batch_max_bytes as u64);
        let mut cache = c.clone();
        cache.sqlite.delta_cache_bytes += MIB;
        assert_eq!(worst_case(&cache, 8, MIB, none) - base, MIB);
        let mut feed = c.clone();
        feed.changelog.enabled = true;
        let with_feed = worst_case(&feed, 8, MIB, none);
        feed.changelog.max_bytes_per_transaction += 1024;
        assert_eq!(worst_case(&feed, 8, MIB, none) - with_feed, 8 * 3 * 1024, "the relay's run, three times");
        // Two WebAssembly functions: their instances live and in as many backfill tasks
        // (the default concurrency allows two), and their compiled code.
        let wasm = WasmLoad { functions: 2, compiled_bytes: 80 * MIB };
        let instances = 2 + 2.min(c.backfill.concurrency as u64);
        assert_eq!(worst_case(&c, 8, MIB, wasm) - base, instances * c.wasm.max_memory_bytes as u64 + 80 * MIB);
    }
}
