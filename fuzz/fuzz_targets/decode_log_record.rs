//! Bytes -> `codec::decode` and the borrowed `borrowed::decode_ref`. Neither may panic nor
//! allocate beyond O(input) (libFuzzer's `-rss_limit_mb`/`-malloc_limit_mb` catch the
//! latter), and both must give the same answer: the same error, or records equal after
//! `to_owned` (compared by their canonical encoding, so NaN payloads count as equal bit for
//! bit), with `validate_ref` answering as `validate`. When the bytes decode, the record must
//! re-encode to bytes that decode to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_record::borrowed::{decode_ref, validate_ref};
use sluice_record::codec::{decode, encode};
use sluice_record::validate::{validate, Limits};

const TIGHT: Limits =
    Limits { max_id_bytes: 4, max_metadata_keys: 2, max_metadata_value_bytes: 3, max_document_bytes: 5, max_embedding_dim: 3 };

fuzz_target!(|data: &[u8]| {
    let borrowed = decode_ref(data);
    let record = match decode(data) {
        Ok(record) => record,
        Err(e) => {
            // Errors carry a stable kind and a position inside the input.
            assert!(!e.kind().is_empty());
            assert!(e.pos() <= data.len(), "error position {} past the input ({} bytes)", e.pos(), data.len());
            assert_eq!(borrowed.err(), Some(e), "the borrowed decoder answers differently");
            return;
        }
    };
    let borrowed = borrowed.expect("the borrowed decoder refuses what decode accepts");
    let bytes = encode(&record);
    assert_eq!(encode(&borrowed.to_owned()), bytes, "decode_ref(..).to_owned() != decode(..)");
    let again = decode(&bytes).expect("re-encoded record must decode");
    assert_eq!(encode(&again), bytes, "decode(encode(r)) != r");
    for limits in [Limits::DEFAULT, TIGHT] {
        assert_eq!(validate_ref(&borrowed, &limits), validate(&record, &limits), "validate_ref != validate");
    }
});
