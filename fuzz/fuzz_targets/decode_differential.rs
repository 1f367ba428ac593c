//! Differential: the same bytes through the hand-written decoder (`codec::decode`) and
//! through apache-avro's generic decoder with `schemas/log_record.avsc`
//! (`avro::decode_generic`). Both must decode to the same record (compared by canonical
//! encoding, so NaN payloads count bit for bit) or both must refuse the input. A
//! disagreement panics with the input in hex and both outcomes.
//!
//! Two disagreements are apache-avro 0.21's own leniencies, where the hand-written decoder
//! follows the Avro spec (and the Java implementation) and refuses; they are counted,
//! not failures, and only in this exact shape (hand-written refuses, apache-avro accepts):
//! - a string or bytes value cut short by the end of the input reads as null (apache-avro
//!   maps `UnexpectedEof` to `Value::Null`): the hand-written error is `Truncated` or
//!   `LengthOverflow`;
//! - a 10-byte varint whose last byte carries bits beyond 64 wraps: the hand-written
//!   error is `VarintOverflow`.
//!
//! Two more are Sluice's own strictness (the Java reader accepts them too): a repeated
//! metadata key (`DuplicateMapKey`: which value wins would depend on the reader) and a
//! block whose declared byte size disagrees with its items (`BadBlockSize`: a broken
//! encoder). Such records go to the DLQ under their own kind instead of being applied
//! with a value Sluice picked.
#![no_main]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Once;

use libfuzzer_sys::fuzz_target;
use sluice_record::avro::decode_generic;
use sluice_record::codec::{decode, encode, DecodeError};

fn hex(data: &[u8]) -> String {
    data.iter().map(|b| format!("{b:02x}")).collect()
}

static LENIENT: AtomicU64 = AtomicU64::new(0);

fn apache_avro_leniency(e: &DecodeError) -> bool {
    matches!(
        e,
        DecodeError::Truncated { .. }
            | DecodeError::LengthOverflow { .. }
            | DecodeError::VarintOverflow { .. }
            | DecodeError::DuplicateMapKey { .. }
            | DecodeError::BadBlockSize { .. }
            // A negative block byte size: apache-avro ignores the size, the hand-written
            // decoder refuses it like any other lying block size.
            | DecodeError::NegativeLength { .. }
    )
}

fuzz_target!(|data: &[u8]| {
    // apache-avro reserves a map's declared entry count (and allocates a declared length)
    // before reading, checked only against its allocation limit (512 MB by default, set
    // once per process): a mutated count asks for tens of GB. 64 KiB is far above anything
    // an input of at most 16 KiB (fuzz.sh's -max_len) can satisfy, so a larger length or
    // count must be refused by both decoders anyway.
    static LIMIT: Once = Once::new();
    LIMIT.call_once(|| {
        let limit = apache_avro::util::max_allocation_bytes(64 << 10);
        assert_eq!(limit, 64 << 10, "apache-avro's allocation limit was set before");
    });
    let fast = decode(data);
    let generic = decode_generic(data);
    match (&fast, &generic) {
        (Ok(a), Ok(b)) => {
            assert!(encode(a) == encode(b), "decoders disagree on the record\ninput: {}\nhand-written: {a:?}\napache-avro:  {b:?}", hex(data));
        }
        (Err(_), Err(_)) => {}
        (Err(e), Ok(_)) if apache_avro_leniency(e) => {
            let n = LENIENT.fetch_add(1, Ordering::Relaxed) + 1;
            if n.is_power_of_two() {
                eprintln!("decode_differential: {n} inputs refused here and accepted by apache-avro's leniency; latest: {} ({e})", hex(data));
            }
        }
        _ => panic!("one decoder accepts, the other refuses\ninput: {}\nhand-written: {fast:?}\napache-avro:  {generic:?}", hex(data)),
    }
});
