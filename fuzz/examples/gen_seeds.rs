//! Writes the seed corpus under `fuzz/seeds/<target>/` from valid encodings:
//! hand-picked edge records (every operation, every metadata type, empty and NaN values,
//! a backfill marker, map blocks with a byte size) plus a few generated workload records,
//! as Avro datums, produce lines and HTTP bodies.
//!
//!     cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds --target-dir target
//!
//! (run from the repository root; `--target-dir target` reuses the root build.) With a
//! directory as its argument it writes there instead: `scripts/fuzz.sh` checks that the
//! checked-in seeds are what this writes.

use std::path::{Path, PathBuf};

use sluice_record::jsonl::log_record_to_json;
use sluice_record::codec::encode;
use sluice_record::{BackfillRef, LogRecord, MetaValue, Metadata, Operation};
use sluice_record::workload::{generate, WorkloadSpec};

fn edge_records() -> Vec<LogRecord> {
    let mut out = Vec::new();
    for op in [Operation::Add, Operation::Update, Operation::Upsert, Operation::Delete] {
        out.push(LogRecord::data("c", "id-1", op));
    }
    let mut full = LogRecord::data("coll-ü", "id-é", Operation::Upsert);
    full.embedding = Some(vec![0.25, -1.0, 3.5, f32::MIN_POSITIVE].into());
    full.metadata = Some(Metadata::from_iter([
        ("s".to_string(), MetaValue::String("v".into())),
        ("n".to_string(), MetaValue::Null),
        ("l".to_string(), MetaValue::Long(i64::MIN)),
        ("d".to_string(), MetaValue::Double(1.5)),
        ("b".to_string(), MetaValue::Bool(true)),
    ]));
    full.document = Some("a document\nwith two lines".into());
    out.push(full.clone());
    let mut nan = full.clone();
    nan.embedding = Some(vec![f32::NAN, f32::INFINITY].into());
    nan.metadata = Some(Metadata::from_iter([("x".to_string(), MetaValue::Double(f64::NAN))]));
    out.push(nan);
    let mut empty = LogRecord::data("", "", Operation::Add);
    empty.embedding = Some(Default::default());
    empty.metadata = Some(Metadata::new());
    empty.document = Some(String::new());
    out.push(empty);
    let mut marker = LogRecord::data("c", "", Operation::BackfillFn);
    marker.backfill = Some(BackfillRef { request_id: "req".into(), function_id: "fn".into() });
    out.push(marker);
    let mut long = LogRecord::data("c", "i".repeat(200), Operation::Add);
    long.metadata = Some((0..20).map(|i| (format!("k{i}"), MetaValue::Long(i * 1_000_003))).collect());
    out.push(long);
    out.extend(generate(&WorkloadSpec {
        records: 6,
        collections: 2,
        dim: 4,
        ids_per_collection: 3,
        mix: [40, 20, 20, 20],
        seed: 7,
        collection_prefix: "seed".into(),
    }));
    out
}

/// The Avro encoding with the metadata map written as one negative-count block with its
/// byte size (legal Avro the canonical encoder never writes), to seed that branch.
fn with_sized_block(r: &LogRecord) -> Option<Vec<u8>> {
    let m = r.metadata.as_ref().filter(|m| !m.is_empty())?;
    let mut prefix = r.clone();
    prefix.metadata = None;
    prefix.document = None;
    prefix.backfill = None;
    let head = encode(&prefix);
    // `head` ends with the metadata, document and backfill null branches (3 zero bytes).
    let mut out = head[..head.len() - 3].to_vec();
    let mut entries = Vec::new();
    let mut one = LogRecord::data("", "", Operation::Add);
    one.metadata = Some(m.clone());
    let enc = encode(&one);
    // collection "", id "", op, embedding null, encoding: 5 bytes; metadata branch 1; count.
    let mut p = 6;
    while enc[p] & 0x80 != 0 {
        p += 1;
    }
    p += 1;
    entries.extend_from_slice(&enc[p..enc.len() - 3]); // up to the terminating 0 of the map
    put_long(&mut out, 1);
    put_long(&mut out, -(m.len() as i64));
    put_long(&mut out, entries.len() as i64);
    out.extend_from_slice(&entries);
    put_long(&mut out, 0);
    let mut tail = LogRecord::data("", "", Operation::Add);
    tail.document = r.document.clone();
    tail.backfill = r.backfill.clone();
    let t = encode(&tail);
    out.extend_from_slice(&t[6..]); // skip "", "", op, emb null, encoding, metadata null
    Some(out)
}

fn put_long(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

fn write(dir: &Path, name: String, bytes: &[u8]) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join(name), bytes).unwrap();
}

fn main() {
    let root = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("seeds"));
    let records = edge_records();
    let avro = root.join("decode_log_record");
    let jsonl = root.join("jsonl_line");
    let http = root.join("http_records_body");
    for (i, r) in records.iter().enumerate() {
        let bytes = encode(r);
        sluice_record::codec::decode(&bytes).expect("seed decodes");
        write(&avro, format!("record-{i:02}.avro"), &bytes);
        if let Some(b) = with_sized_block(r) {
            let back = sluice_record::codec::decode(&b).expect("sized-block seed decodes");
            assert_eq!(encode(&back), bytes);
            write(&avro, format!("record-{i:02}-sized-block.avro"), &b);
        }
        if r.operation != Operation::BackfillFn {
            let line = log_record_to_json(r).to_string();
            write(&jsonl, format!("line-{i:02}.jsonl"), line.as_bytes());
            let mut item = log_record_to_json(r);
            item.as_object_mut().unwrap().remove("collection");
            write(&http, format!("object-{i:02}.json"), item.to_string().as_bytes());
        }
    }
    let items: Vec<serde_json::Value> = records
        .iter()
        .filter(|r| r.operation != Operation::BackfillFn)
        .map(|r| {
            let mut v = log_record_to_json(r);
            v.as_object_mut().unwrap().remove("collection");
            v
        })
        .collect();
    write(&http, "array.json".into(), serde_json::Value::Array(items).to_string().as_bytes());
    write(&http, "dims.json".into(), br#"[{"id":"a","operation":"add","embedding":[1,2]},{"id":"b","operation":"upsert","embedding":[1e39,-0.0],"collection":"fuzz-collection"}]"#);
    println!("seeds written under {}", root.display());
}
