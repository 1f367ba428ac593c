//! Tests of the borrowed decoder: it must agree with the owned decoder (`codec::decode`) on
//! every input, valid or not, and its view must read back the record that was encoded.

use super::*;
use crate::codec::tests::{
    bitwise_eq, encoding_pool, fuzz_seed, log_record, long, mutated_encoding, next_input, prefix, sample, string, Rng,
};
use crate::codec::{decode, encode};
use crate::{LogRecord, MetaValue, Metadata};
use proptest::prelude::*;

/// Both decoders on `bytes`: the same record (bit for bit) or the very same error.
/// Returns the outcome's label.
fn agree(bytes: &[u8]) -> Result<&'static str, String> {
    match (decode(bytes), decode_ref(bytes)) {
        (Ok(a), Ok(b)) => {
            let b = b.to_owned();
            if bitwise_eq(&a, &b) {
                Ok("ok")
            } else {
                Err(format!("decoded differently: {a:?} != {b:?}"))
            }
        }
        (Err(a), Err(b)) if a == b => Ok(a.kind()),
        (a, b) => Err(format!("decode {a:?} / decode_ref {:?}", b.map(|r| r.to_owned()))),
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A map of `n` keys `k0..k{n-1}` (Long values) in one positive-count block, with `dup`
/// replacing key `dup.0` by key `dup.1`.
fn many_keys(n: usize, dup: Option<(usize, usize)>) -> Vec<u8> {
    let mut entries = Vec::new();
    for i in 0..n {
        let k = match dup {
            Some((at, same_as)) if at == i => same_as,
            _ => i,
        };
        entries.extend([string(&format!("k{k}")), long(2), long(i as i64)].concat());
    }
    [prefix(), long(1), long(n as i64), entries, long(0), long(0), long(0)].concat()
}

// ---------------------------------------------------------------------------------------
// Examples
// ---------------------------------------------------------------------------------------

#[test]
fn view_reads_every_field_in_place() {
    let r = sample();
    let bytes = encode(&r);
    let v = decode_ref(&bytes).expect("decode_ref");
    assert_eq!(v.collection_id, "coll-1");
    assert_eq!(v.id, "rec-1");
    assert_eq!(v.operation, Operation::Upsert);
    // Borrowed: the id points into the input.
    let range = bytes.as_ptr_range();
    assert!(range.contains(&v.id.as_ptr()));
    assert!(range.contains(&v.document.expect("document").as_ptr()));
    let e = v.embedding.expect("embedding");
    assert_eq!(e.len(), 3);
    assert!(!e.is_empty());
    assert_eq!(e.as_bytes().len(), 12);
    assert!(range.contains(&e.as_bytes().as_ptr()));
    let bits: Vec<u32> = e.iter().map(f32::to_bits).collect();
    assert_eq!(bits, [0.5f32.to_bits(), (-1.0f32).to_bits(), f32::NAN.to_bits()]);
    assert_eq!(e.get(1), Some(-1.0));
    assert_eq!(e.get(3), None);
    assert_eq!(e.get(usize::MAX), None);
    assert_eq!(e.to_vec().len(), 3);
    let m = v.metadata.expect("metadata");
    assert_eq!(m.len(), 3);
    assert_eq!(m.iter().len(), 3);
    assert_eq!(m.get("k1"), Some(MetaValueRef::String("v")));
    assert_eq!(m.get("k2"), Some(MetaValueRef::Double(2.5)));
    assert_eq!(m.get("k3"), Some(MetaValueRef::Bool(true)));
    assert_eq!(m.get("k4"), None);
    assert!(bitwise_eq(&v.to_owned(), &r));
    assert!(!format!("{v:?}").is_empty());
}

#[test]
fn metadata_in_several_blocks_iterates_in_datum_order() {
    // Block 1: count -2 with a byte size; block 2: count 1; then the end block.
    let entries_a = [string("z"), long(2), long(7), string("b"), long(0)].concat();
    let entries_b = [string("a"), long(4), vec![1]].concat();
    let bytes = [
        prefix(),
        long(1),
        long(-2),
        long(entries_a.len() as i64),
        entries_a,
        long(1),
        entries_b,
        long(0),
        long(0),
        long(0),
    ]
    .concat();
    let v = decode_ref(&bytes).expect("decode_ref");
    let m = v.metadata.expect("metadata");
    let entries: Vec<_> = m.iter().collect();
    assert_eq!(entries, [("z", MetaValueRef::Long(7)), ("b", MetaValueRef::Null), ("a", MetaValueRef::Bool(true))]);
    assert_eq!(agree(&bytes), Ok("ok"));
    // An empty map: present, no entries.
    let empty = [prefix(), long(1), long(0), long(0), long(0)].concat();
    let m = decode_ref(&empty).expect("decode_ref").metadata.expect("metadata");
    assert!(m.is_empty());
    assert_eq!(m.iter().next(), None);
}

#[test]
fn duplicate_keys_are_refused_past_the_inline_key_set_too() {
    // Within the inline set, at its edge, and after the spill to a hash set (of a key
    // seen before the spill, and of one seen after).
    for (n, dup) in
        [(3, (2, 0)), (INLINE_KEYS, (INLINE_KEYS - 1, 3)), (40, (INLINE_KEYS, 0)), (40, (30, 2)), (40, (39, 25))]
    {
        let bytes = many_keys(n, Some(dup));
        let e = decode_ref(&bytes).expect_err("duplicate key");
        assert_eq!(e.kind(), "duplicate_map_key", "{n} keys, {dup:?}");
        assert_eq!(agree(&bytes), Ok("duplicate_map_key"));
    }
    for n in [INLINE_KEYS, INLINE_KEYS + 1, 40] {
        let bytes = many_keys(n, None);
        let v = decode_ref(&bytes).expect("distinct keys");
        assert_eq!(v.metadata.expect("metadata").len(), n);
        assert_eq!(agree(&bytes), Ok("ok"));
    }
}

#[test]
fn malformed_inputs_get_the_same_error_from_both_decoders() {
    let cases: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff; 11],
        [string("c"), long(1), vec![0xff]].concat(),
        [string("c"), string("i"), long(5)].concat(),
        [string("c"), string("i"), long(0), long(2)].concat(),
        [string("c"), string("i"), long(0), long(1), long(5), vec![0; 5]].concat(),
        [string("c"), string("i"), long(0), long(0), long(1)].concat(),
        [prefix(), long(1), long(1), string("k"), long(5)].concat(),
        [prefix(), long(1), long(1), string("k"), long(4), vec![2]].concat(),
        [prefix(), long(1), long(1), string("k"), long(3), vec![0; 7]].concat(),
        [prefix(), long(1), long(1), string("k"), long(1), long(1), vec![0xc0]].concat(),
        [prefix(), long(1), long(-1), long(5), string("k"), long(0), long(0), long(0), long(0), long(0)].concat(),
        [prefix(), long(1), long(-1), long(-3)].concat(),
        [prefix(), long(1), long(1 << 62)].concat(),
        [prefix(), long(1), long(i64::MIN), long(0)].concat(),
        [prefix(), long(1), long(-1), long(i64::MAX), string("a"), long(0), long(0)].concat(),
        // A duplicate key whose value is malformed: the value's error comes first.
        [prefix(), long(1), long(2), string("k"), long(0), string("k"), long(9), long(0)].concat(),
        [prefix(), long(0), long(0), long(0), vec![9, 9]].concat(),
        [prefix(), long(0), long(0), long(1), string("r"), long(1), vec![0xff]].concat(),
    ];
    for bytes in cases {
        let outcome = agree(&bytes).unwrap_or_else(|d| panic!("input {}: {d}", hex(&bytes)));
        assert_ne!(outcome, "ok", "input {}", hex(&bytes));
    }
}

#[test]
fn validate_ref_refuses_each_fault_like_validate() {
    use crate::BackfillRef;
    let ok = || {
        let mut r = sample();
        r.embedding = Some(vec![0.5, -1.0, 2.0].into());
        r
    };
    let with_meta = |k: &str, v: MetaValue| {
        let mut r = ok();
        r.metadata.get_or_insert_with(Metadata::new).insert(k.to_string(), v);
        r
    };
    let marker = |request_id: &str, function_id: &str| {
        let mut r = LogRecord::data("coll", "", Operation::BackfillFn);
        r.backfill = Some(BackfillRef { request_id: request_id.into(), function_id: function_id.into() });
        r
    };
    let mut faults: Vec<(&str, LogRecord)> = vec![
        ("empty_collection_id", LogRecord { collection_id: String::new(), ..ok() }),
        ("collection_id_too_long", LogRecord { collection_id: "c".repeat(1025), ..ok() }),
        ("id_too_long", LogRecord { id: "i".repeat(1025), ..ok() }),
        ("empty_id", LogRecord { id: String::new(), ..ok() }),
        ("backfill_without_payload", LogRecord::data("coll", "", Operation::BackfillFn)),
        ("empty_backfill_ref", marker("", "f")),
        ("empty_backfill_ref", marker("r", "")),
        ("payload_on_data_operation", LogRecord { backfill: marker("r", "f").backfill, ..ok() }),
        ("empty_embedding", LogRecord { embedding: Some(vec![].into()), ..ok() }),
        ("embedding_too_large", LogRecord { embedding: Some(vec![0.0; 65537].into()), ..ok() }),
        ("non_finite_embedding", LogRecord { embedding: Some(vec![0.0, f32::NAN].into()), ..ok() }),
        ("non_finite_embedding", LogRecord { embedding: Some(vec![f32::NEG_INFINITY].into()), ..ok() }),
        ("metadata_key_empty", with_meta("", MetaValue::Null)),
        ("metadata_key_too_long", with_meta(&"k".repeat(1025), MetaValue::Null)),
        ("metadata_value_too_large", with_meta("big", MetaValue::String("v".repeat(65537)))),
        ("non_finite_metadata_double", with_meta("d", MetaValue::Double(f64::NAN))),
        ("non_finite_metadata_double", with_meta("d", MetaValue::Double(f64::INFINITY))),
        ("document_too_large", LogRecord { document: Some("d".repeat((1 << 20) + 1)), ..ok() }),
        ("nul_character", LogRecord { collection_id: "c\0".into(), ..ok() }),
        ("nul_character", LogRecord { id: "\0".into(), ..ok() }),
        ("nul_character", marker("r\0", "f")),
        ("nul_character", marker("r", "\0f")),
        ("nul_character", with_meta("k\0", MetaValue::Null)),
        ("nul_character", with_meta("k", MetaValue::String("\0".into()))),
        ("nul_character", LogRecord { document: Some("a\0b".into()), ..ok() }),
    ];
    let many: Metadata = (0..65).map(|i| (format!("k{i}"), MetaValue::Long(i))).collect();
    faults.push(("too_many_metadata_keys", LogRecord { metadata: Some(many), ..ok() }));
    for r in [ok(), marker("r", "f")] {
        let bytes = encode(&r);
        assert_eq!(validate_ref(&decode_ref(&bytes).expect("decode_ref"), &Limits::DEFAULT), Ok(()));
    }
    for (kind, r) in faults {
        let bytes = encode(&r);
        let v = decode_ref(&bytes).expect("decode_ref");
        let expected = validate(&r, &Limits::DEFAULT);
        assert_eq!(expected.as_ref().map_err(ValidationError::kind), Err(kind));
        assert_eq!(validate_ref(&v, &Limits::DEFAULT), expected, "{kind}");
    }
}

// ---------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------

fn limits() -> impl Strategy<Value = Limits> {
    (0usize..24, 0usize..8, 0usize..24, 0usize..80, 0usize..64).prop_map(
        |(max_id_bytes, max_metadata_keys, max_metadata_value_bytes, max_document_bytes, max_embedding_dim)| Limits {
            max_id_bytes,
            max_metadata_keys,
            max_metadata_value_bytes,
            max_document_bytes,
            max_embedding_dim,
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn borrowed_view_of_an_encoding_is_the_record(r in log_record()) {
        let bytes = encode(&r);
        let v = decode_ref(&bytes).expect("decode_ref");
        let owned = v.to_owned();
        prop_assert!(bitwise_eq(&owned, &r), "{owned:?} != {r:?}");
        // The accessors read the same values as the owned copy.
        if let (Some(e), Some(values)) = (v.embedding, &r.embedding) {
            prop_assert_eq!(e.len(), values.len());
            let bits: Vec<u32> = e.iter().map(f32::to_bits).collect();
            prop_assert_eq!(bits, values.iter().map(|f| f.to_bits()).collect::<Vec<_>>());
        }
        if let (Some(m), Some(map)) = (v.metadata, &r.metadata) {
            prop_assert_eq!(m.len(), map.len());
            for (k, value) in map {
                let got = m.get(k).map(|g| g.to_owned());
                prop_assert_eq!(format!("{got:?}"), format!("{:?}", Some(value)));
            }
        }
    }

    #[test]
    fn decoders_agree_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(d) = agree(&bytes) {
            prop_assert!(false, "input {}: {}", hex(&bytes), d);
        }
    }

    #[test]
    fn decoders_agree_on_mutated_encodings(bytes in mutated_encoding()) {
        if let Err(d) = agree(&bytes) {
            prop_assert!(false, "input {}: {}", hex(&bytes), d);
        }
    }

    #[test]
    fn decoders_agree_on_every_prefix(r in log_record()) {
        let bytes = encode(&r);
        for cut in 0..bytes.len() {
            let outcome = agree(&bytes[..cut]).map_err(|d| TestCaseError::fail(format!("cut {cut}: {d}")))?;
            prop_assert_ne!(outcome, "ok");
        }
    }

    #[test]
    fn validate_ref_returns_what_validate_returns(r in log_record(), limits in limits()) {
        let bytes = encode(&r);
        let v = decode_ref(&bytes).expect("decode_ref");
        prop_assert_eq!(validate_ref(&v, &limits), validate(&r, &limits));
        prop_assert_eq!(validate_ref(&v, &Limits::DEFAULT), validate(&r, &Limits::DEFAULT));
    }
}

/// The arbitrary, mutated and truncated inputs of the owned decoder's robustness test
/// (`SLUICE_DECODER_INPUTS`, default 100,000) through both decoders: they must agree on
/// each, and the inputs must reach both outcomes and many error kinds.
#[test]
fn decoders_agree_on_a_bounded_number_of_arbitrary_inputs() {
    let n = match std::env::var("SLUICE_DECODER_INPUTS") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("SLUICE_DECODER_INPUTS={v:?} is not a count")),
        Err(_) => 100_000,
    };
    let seed = fuzz_seed();
    let mut rng = Rng(seed ^ 0xb0 | 1);
    let pool = encoding_pool();
    let mut input = Vec::new();
    let mut kinds: std::collections::BTreeMap<&'static str, usize> = Default::default();
    for i in 0..n {
        next_input(i, &mut rng, &pool, &mut input);
        match agree(&input) {
            Ok(kind) => *kinds.entry(kind).or_default() += 1,
            Err(d) => panic!("input {} (seed {seed:#x}): {d}", hex(&input)),
        }
    }
    println!("{n} inputs (seed {seed:#x}): {kinds:?}");
    let ok = kinds.get("ok").copied().unwrap_or(0);
    assert!(ok > n / 100 && n - ok > n / 100, "the inputs reach both outcomes: {kinds:?}");
    assert!(kinds.len() >= 8, "the inputs reach many error kinds: {kinds:?}");
}
