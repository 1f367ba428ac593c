//! A page of records as the HTTP API writes it (`GET /api/v1/collections/{id}/records`):
//! 1,000 W1-shaped records (384 dimensions, 3 metadata keys, a ~500-byte document), two
//! ways, to the same bytes:
//! - tree: `jsonl::record_to_json` per record (a `serde_json::Value` of the record, its
//!   embedding as 384 `Value::Number`s), then the page's tree written out;
//! - direct: `jsonl::RecordJson`, serialized straight from the records.
//!
//! `cargo bench -p sluice-record --bench page_json` prints microseconds per page and per
//! record for each, alternated over rounds in the same run, and their ratio. The bytes of
//! both are compared first (the bench refuses to time two different outputs).

use std::hint::black_box;
use std::time::Instant;

use serde_json::{json, Value};
use sluice_record::jsonl::{record_to_json, RecordJson};
use sluice_record::{MetaValue, Metadata, Record};

fn page() -> Vec<Record> {
    let sentence = "The quick brown fox jumps over the lazy dog while the log keeps growing. ";
    (0..1000)
        .map(|n| Record {
            id: format!("id-{n:06}"),
            embedding: Some((0..384).map(|i| (((i + n) as f32) * 0.731).sin()).collect()),
            metadata: Metadata::from_iter([
                ("source".to_string(), MetaValue::String("crawler-eu-west".into())),
                ("page".to_string(), MetaValue::Long(n as i64)),
                ("score".to_string(), MetaValue::Double(0.875)),
            ]),
            document: Some(sentence.repeat(7)[..500].to_string()),
            offset: n as i64,
        })
        .collect()
}

fn tree(records: &[Record]) -> Vec<u8> {
    let records: Vec<Value> = records
        .iter()
        .map(|r| {
            let mut v = record_to_json(r);
            v["offset"] = json!(r.offset);
            v
        })
        .collect();
    serde_json::to_vec(&json!({"collection": "c", "records": records, "next": "id-000999"})).expect("page")
}

fn direct(records: &[Record]) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Page<'a> {
        collection: &'a str,
        next: Option<&'a str>,
        records: Vec<RecordJson<'a>>,
    }
    let records = records.iter().map(|record| RecordJson { record, with_offset: true }).collect();
    serde_json::to_vec(&Page { collection: "c", next: Some("id-000999"), records }).expect("page")
}

fn main() {
    let records = page();
    assert_eq!(tree(&records), direct(&records), "the two ways must write the same bytes");
    let (rounds, per_round) = (7, 20);
    let (mut t, mut d) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        for (f, out) in [(tree as fn(&[Record]) -> Vec<u8>, &mut t), (direct, &mut d)] {
            let start = Instant::now();
            for _ in 0..per_round {
                black_box(f(black_box(&records)));
            }
            out.push(start.elapsed().as_secs_f64() * 1e6 / per_round as f64);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mt, md) = (median(&mut t), median(&mut d));
    let bytes = direct(&records).len();
    println!("page of 1,000 W1 records, {bytes} bytes of JSON; median of {rounds} rounds x {per_round} pages");
    println!("  tree    {mt:>9.0} us/page  {:>6.2} us/record", mt / 1000.0);
    println!("  direct  {md:>9.0} us/page  {:>6.2} us/record", md / 1000.0);
    println!("  direct / tree = {:.3}", md / mt);
}
