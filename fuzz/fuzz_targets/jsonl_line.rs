//! Bytes -> UTF-8 -> `cli::jsonl::parse_line` (the input of `sluice produce`). It must
//! never panic; a parsed record must encode to Avro that decodes back to it, and its JSON
//! form (`log_record_to_json`) must parse back to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_record::jsonl::{log_record_to_json, parse_line};
use sluice_record::codec::{decode, encode};
use sluice_record::validate::{validate, Limits};

fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else { return };
    let Ok(record) = parse_line(line) else { return };
    let _ = validate(&record, &Limits::DEFAULT);
    let bytes = encode(&record);
    let decoded = decode(&bytes).expect("an encoded parsed line must decode");
    assert_eq!(encode(&decoded), bytes);
    // JSON round trip: only for finite values (JSON has no NaN; f64 -> f32 can overflow to
    // infinity, which `log_record_to_json` writes as null).
    let finite = record.embedding.as_ref().map_or(true, |e| e.iter().all(|v| v.is_finite()));
    if finite {
        let text = log_record_to_json(&record).to_string();
        let back = parse_line(&text).unwrap_or_else(|e| panic!("{text:?} does not parse back: {e}"));
        assert_eq!(encode(&back), bytes, "JSON round trip changed the record: {text}");
    }
});
