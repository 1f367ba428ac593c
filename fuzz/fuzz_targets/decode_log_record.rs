//! Bytes -> `codec::decode`. It must never panic nor allocate beyond O(input) (libFuzzer's
//! `-rss_limit_mb`/`-malloc_limit_mb` catch the latter). When the bytes decode, the record
//! must re-encode to bytes that decode to the same record (compared by its canonical
//! encoding, so NaN payloads count as equal bit for bit), and `validate` must not panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_record::codec::{decode, encode};
use sluice_record::validate::{validate, Limits};

fuzz_target!(|data: &[u8]| {
    let record = match decode(data) {
        Ok(record) => record,
        Err(e) => {
            // Errors carry a stable kind and a position inside the input.
            assert!(!e.kind().is_empty());
            assert!(e.pos() <= data.len(), "error position {} past the input ({} bytes)", e.pos(), data.len());
            return;
        }
    };
    let bytes = encode(&record);
    let again = decode(&bytes).expect("re-encoded record must decode");
    assert_eq!(encode(&again), bytes, "decode(encode(r)) != r");
    let _ = validate(&record, &Limits::DEFAULT);
    let _ = validate(&record, &Limits { max_id_bytes: 4, max_metadata_keys: 2, max_metadata_value_bytes: 3, max_document_bytes: 5, max_embedding_dim: 3 });
});
