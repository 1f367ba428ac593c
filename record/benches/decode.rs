//! Decoding a `LogRecord` datum three ways, for 384- and 1536-dimension embeddings, 3
//! metadata keys and a ~500-byte document:
//! - borrowed: `sluice_record::borrowed::decode_ref`, a `LogRecordRef` pointing into the
//!   datum (every check of the owned decoder, no copy of the strings, embedding or map);
//! - owned: the hand-written codec (`sluice_record::codec::decode`), an owned `LogRecord`;
//! - generic: apache-avro's generic path (`GenericDecoder`: datum -> `Value` -> `LogRecord`).
//!
//! `cargo bench -p sluice-record --bench decode` prints criterion's report, then a plain
//! table (records/s, MB/s of datum bytes, ratio against the generic path), measured
//! single-threaded in the same run. Goal: the borrowed decoder >= 10x the generic path on
//! 1536 dimensions, and > 1 GB/s.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};
use sluice_record::avro::{decode_generic, GenericDecoder};
use sluice_record::borrowed::decode_ref;
use sluice_record::codec::{decode, encode};
use sluice_record::{LogRecord, MetaValue, Metadata, Operation};

const DIMS: [usize; 2] = [384, 1536];

fn record(dim: usize) -> LogRecord {
    let mut r = LogRecord::data(
        "5f0c6a3e-8a4b-4c1e-9d2f-0b7e1c3a9d41",
        "2b9e7c1d-4f3a-4e8b-a6d0-9c5f1e7b3a20",
        Operation::Upsert,
    );
    r.embedding = Some((0..dim).map(|i| ((i as f32) * 0.731).sin()).collect());
    r.metadata = Some(Metadata::from_iter([
        ("source".to_string(), MetaValue::String("crawler-eu-west".into())),
        ("page".to_string(), MetaValue::Long(1234)),
        ("score".to_string(), MetaValue::Double(0.875)),
    ]));
    let sentence = "The quick brown fox jumps over the lazy dog while the log keeps growing. ";
    r.document = Some(sentence.repeat(7)[..500].to_string());
    r
}

fn criterion_benches(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    for dim in DIMS {
        let bytes = encode(&record(dim));
        // Every path must decode the same record, or the comparison means nothing.
        assert_eq!(decode(&bytes).ok(), decode_generic(&bytes).ok());
        assert_eq!(decode_ref(&bytes).ok().map(|r| r.to_owned()), decode(&bytes).ok());
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("borrowed", dim), &bytes, |b, bytes| {
            b.iter(|| decode_ref(black_box(bytes)))
        });
        group.bench_with_input(BenchmarkId::new("owned", dim), &bytes, |b, bytes| b.iter(|| decode(black_box(bytes))));
        group.bench_with_input(BenchmarkId::new("generic", dim), &bytes, |b, bytes| {
            b.iter(|| decode_generic(black_box(bytes)))
        });
    }
    group.finish();
}

/// Runs `f` repeatedly for about `budget` and returns the mean time per call.
fn time_per_call<T>(budget: Duration, mut f: impl FnMut() -> T) -> Duration {
    // Warm up, then size batches so the clock is read rarely.
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < budget / 10 {
        black_box(f());
        calls += 1;
    }
    let batch = (calls / 10).max(1);
    let start = Instant::now();
    let mut total = 0u64;
    while start.elapsed() < budget {
        for _ in 0..batch {
            black_box(f());
        }
        total += batch;
    }
    start.elapsed() / u32::try_from(total).unwrap_or(u32::MAX)
}

fn summary_table() {
    let budget = Duration::from_secs(2);
    println!();
    println!(
        "decode summary (single thread, {budget:?} per cell; MB = 10^6 bytes of datum; ratio = generic time / time)"
    );
    println!(
        "{:>5} {:>6} | {:>10} {:>8} {:>6} | {:>10} {:>8} {:>6} | {:>10} {:>8}",
        "dim", "bytes", "borrowed/s", "MB/s", "ratio", "owned/s", "MB/s", "ratio", "generic/s", "MB/s"
    );
    for dim in DIMS {
        let bytes = encode(&record(dim));
        let decoder = GenericDecoder::current();
        // Interleaved rounds, so a burst of load on the shared machine hits every path.
        let (mut borrowed, mut owned, mut generic) = (Duration::ZERO, Duration::ZERO, Duration::ZERO);
        for _ in 0..2 {
            borrowed += time_per_call(budget / 2, || decode_ref(black_box(&bytes)));
            owned += time_per_call(budget / 2, || decode(black_box(&bytes)));
            generic += time_per_call(budget / 2, || decoder.decode(black_box(&bytes)));
        }
        let rate = |t: Duration| 2.0 / t.as_secs_f64();
        let mbps = |t: Duration| 2.0 * bytes.len() as f64 / t.as_secs_f64() / 1e6;
        let ratio = |t: Duration| generic.as_secs_f64() / t.as_secs_f64();
        println!(
            "{:>5} {:>6} | {:>10.0} {:>8.0} {:>5.1}x | {:>10.0} {:>8.0} {:>5.1}x | {:>10.0} {:>8.0}",
            dim,
            bytes.len(),
            rate(borrowed),
            mbps(borrowed),
            ratio(borrowed),
            rate(owned),
            mbps(owned),
            ratio(owned),
            rate(generic),
            mbps(generic),
        );
    }
}

/// Why the borrowed metadata is the raw checked encoding rather than a `Vec` of pairs:
/// the decode alone, the decode plus one walk over the entries (what a consumer of every
/// key pays with the lazy form), and the decode plus collecting the pairs into a `Vec` (an
/// upper bound of what a decoder that builds the `Vec` would cost).
fn metadata_table() {
    let budget = Duration::from_secs(1);
    let bytes = encode(&record(1536));
    let lazy = time_per_call(budget, || decode_ref(black_box(&bytes)));
    let walked = time_per_call(budget, || {
        decode_ref(black_box(&bytes)).map(|r| r.metadata.map_or(0, |m| m.iter().map(|(k, _)| k.len()).sum::<usize>()))
    });
    let collected = time_per_call(budget, || {
        decode_ref(black_box(&bytes)).map(|r| r.metadata.map(|m| m.iter().collect::<Vec<_>>()))
    });
    println!();
    println!("borrowed metadata (1536 dims, 3 keys): ns per record");
    println!("{:>12} {:>16} {:>18}", "decode_ref", "+ walk entries", "+ collect a Vec");
    println!(
        "{:>12.0} {:>16.0} {:>18.0}",
        lazy.as_secs_f64() * 1e9,
        walked.as_secs_f64() * 1e9,
        collected.as_secs_f64() * 1e9
    );
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    criterion_benches(&mut c);
    c.final_summary();
    // SLUICE_BENCH_SUMMARY=0 skips the table (e.g. when profiling one criterion bench).
    if std::env::var("SLUICE_BENCH_SUMMARY").as_deref() != Ok("0") {
        summary_table();
        metadata_table();
    }
}
