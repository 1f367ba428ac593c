//! Bytes -> the parsing of `POST /api/v1/collections/{id}/records` without the network:
//! `record::items::parse_body` (JSON, one object or a non-empty array) then
//! `record::items::parse_items` (each item as a produce line, validated against the limits
//! and the collection's dimension). It must never panic; either every item becomes a
//! valid record or every error names an item; accepted records must encode and decode.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_record::items::{parse_body, parse_items};
use sluice_record::codec::{decode, encode};
use sluice_record::validate::{validate, Limits};

const COLLECTION: &str = "fuzz-collection";

fuzz_target!(|data: &[u8]| {
    let Ok(items) = parse_body(data) else { return };
    assert!(!items.is_empty());
    for dimension in [None, Some(2)] {
        match parse_items(&items, COLLECTION, &Limits::DEFAULT, dimension) {
            Ok(records) => {
                assert_eq!(records.len(), items.len());
                let mut dim = dimension;
                for r in &records {
                    assert_eq!(r.collection_id, COLLECTION);
                    assert_eq!(validate(r, &Limits::DEFAULT), Ok(()));
                    if let Some(e) = &r.embedding {
                        assert_eq!(*dim.get_or_insert(e.len()), e.len(), "mixed dimensions accepted");
                    }
                    let bytes = encode(r);
                    let back = decode(&bytes).expect("accepted record must decode");
                    assert_eq!(encode(&back), bytes);
                }
            }
            Err(errors) => {
                assert!(!errors.is_empty());
                assert!(errors.windows(2).all(|w| w[0].index < w[1].index), "errors out of item order");
                assert!(errors.iter().all(|e| e.index < items.len() && !e.error.is_empty()));
            }
        }
    }
});
