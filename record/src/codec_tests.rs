//! Tests of the hand-written codec: examples for each error, property tests against the
//! apache-avro generic path, and robustness against arbitrary and mutated input.

use super::*;
use crate::avro::{decode_generic, encode_generic};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

/// Equality that compares floats by bit pattern, so NaN payloads must survive too.
pub(crate) fn bitwise_eq(a: &LogRecord, b: &LogRecord) -> bool {
    fn f32s(x: &Option<Embedding>) -> Option<Vec<u32>> {
        x.as_ref().map(|v| v.iter().map(f32::to_bits).collect())
    }
    fn meta(x: &Option<Metadata>) -> Option<Vec<(String, String)>> {
        x.as_ref().map(|m| {
            m.iter()
                .map(|(k, v)| {
                    let v = match v {
                        MetaValue::Double(d) => format!("Double(bits {:#018x})", d.to_bits()),
                        other => format!("{other:?}"),
                    };
                    (k.clone(), v)
                })
                .collect()
        })
    }
    a.collection_id == b.collection_id
        && a.id == b.id
        && a.operation == b.operation
        && f32s(&a.embedding) == f32s(&b.embedding)
        && a.encoding == b.encoding
        && meta(&a.metadata) == meta(&b.metadata)
        && a.document == b.document
        && a.backfill == b.backfill
}

pub(crate) fn long(v: i64) -> Vec<u8> {
    let mut out = Vec::new();
    put_long(&mut out, v);
    out
}

pub(crate) fn string(s: &str) -> Vec<u8> {
    let mut out = Vec::new();
    put_str(&mut out, s);
    out
}

/// `collection_id`, `id`, `operation = ADD`, `embedding = null`, `encoding = FLOAT32`:
/// the prefix of a record, to which a test appends the metadata onward.
pub(crate) fn prefix() -> Vec<u8> {
    [string("c"), string("i"), long(0), long(0), long(0)].concat()
}

pub(crate) fn sample() -> LogRecord {
    let mut r = LogRecord::data("coll-1", "rec-1", Operation::Upsert);
    r.embedding = Some(vec![0.5, -1.0, f32::NAN].into());
    r.metadata = Some(Metadata::from_iter([
        ("k1".to_string(), MetaValue::String("v".into())),
        ("k2".to_string(), MetaValue::Double(2.5)),
        ("k3".to_string(), MetaValue::Bool(true)),
    ]));
    r.document = Some("a document".into());
    r
}

// ---------------------------------------------------------------------------------------
// Examples
// ---------------------------------------------------------------------------------------

#[test]
fn metadata_keys_out_of_order_are_sorted_and_a_repeat_is_refused() {
    // Writers with hash maps send keys in any order; the map keeps them sorted.
    let entry = |k: &str| [string(k), long(0)].concat();
    let body = |keys: &[&str]| {
        let entries: Vec<u8> = keys.iter().flat_map(|k| entry(k)).collect();
        [prefix(), long(1), long(keys.len() as i64), entries, long(0), long(0), long(0)].concat()
    };
    let r = decode(&body(&["b", "c", "a"])).expect("distinct keys");
    let keys: Vec<&str> = r.metadata.as_ref().expect("metadata").keys().map(String::as_str).collect();
    assert_eq!(keys, ["a", "b", "c"]);
    assert!(bitwise_eq(&r, &decode_generic(&body(&["b", "c", "a"])).expect("generic")));
    let p = prefix().len() + 2 + 2 * 3; // union branch, count, two entries of 3 bytes
    assert_eq!(
        decode(&body(&["b", "c", "b"])).expect_err("repeat"),
        DecodeError::DuplicateMapKey { field: "metadata", pos: p }
    );
    assert_eq!(decode(&body(&["b", "a", "a"])).expect_err("repeat").kind(), "duplicate_map_key");
}

#[test]
fn encodes_the_avro_spec_zigzag_varints() {
    for (v, bytes) in [
        (0i64, vec![0x00]),
        (-1, vec![0x01]),
        (1, vec![0x02]),
        (-64, vec![0x7f]),
        (64, vec![0x80, 0x01]),
        (i64::MAX, vec![0xfe, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        (i64::MIN, vec![0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
    ] {
        assert_eq!(long(v), bytes, "encoding {v}");
        let mut r = Reader { buf: &bytes, pos: 0 };
        assert_eq!(r.long("x"), Ok(v));
        assert_eq!(r.pos, bytes.len());
    }
}

#[test]
fn minimal_record_roundtrips_and_matches_generic_bytes() {
    let r = LogRecord::data("c", "i", Operation::Add);
    let bytes = encode(&r);
    assert_eq!(bytes, [prefix(), long(0), long(0), long(0)].concat());
    assert_eq!(bytes, encode_generic(&r).expect("generic encode"));
    assert_eq!(decode(&bytes), Ok(r));
}

#[test]
fn nan_embedding_and_metadata_roundtrip_bit_for_bit() {
    let mut r = sample();
    r.embedding = Some(vec![f32::from_bits(0x7fc0_1234), f32::from_bits(0xffff_ffff), -0.0].into());
    r.metadata =
        Some(Metadata::from_iter([("n".to_string(), MetaValue::Double(f64::from_bits(0xfff0_0000_0000_0001)))]));
    let decoded = decode(&encode(&r)).expect("decode");
    assert!(bitwise_eq(&decoded, &r), "{decoded:?} != {r:?}");
}

#[test]
fn map_in_several_blocks_with_negative_counts_decodes_like_apache_avro() {
    // Block 1: count -2 with a byte size; block 2: count 1; then the end block.
    let entries_a = [string("a"), long(2), long(7), string("b"), long(0)].concat();
    let entries_b = [string("c"), long(4), vec![1]].concat();
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
    let mut expected = LogRecord::data("c", "i", Operation::Add);
    expected.metadata = Some(Metadata::from_iter([
        ("a".to_string(), MetaValue::Long(7)),
        ("b".to_string(), MetaValue::Null),
        ("c".to_string(), MetaValue::Bool(true)),
    ]));
    assert_eq!(decode(&bytes), Ok(expected.clone()));
    assert_eq!(decode_generic(&bytes).expect("apache-avro agrees"), expected);
}

fn err(bytes: &[u8]) -> DecodeError {
    match decode(bytes) {
        Ok(r) => panic!("decoded {r:?}"),
        Err(e) => e,
    }
}

#[test]
fn truncated_input_names_the_field_and_its_start() {
    let bytes = encode(&sample());
    assert_eq!(err(&[]), DecodeError::Truncated { field: "collection_id", pos: 0 });
    // Cut inside the document string: the length says more than what remains.
    let doc_start = bytes.len() - 1 - "a document".len() - 1;
    let e = err(&bytes[..bytes.len() - 3]);
    assert_eq!(e.kind(), "length_overflow");
    assert_eq!(e, DecodeError::LengthOverflow { field: "document", len: 10, max: 8, pos: doc_start });
    // Cut before the last union index.
    assert_eq!(err(&bytes[..bytes.len() - 1]), DecodeError::Truncated { field: "backfill", pos: bytes.len() - 1 });
}

#[test]
fn lying_lengths_are_rejected_before_allocating() {
    // i64::MAX-long collection id in a 10-byte input.
    let e = err(&long(i64::MAX));
    assert_eq!(e, DecodeError::LengthOverflow { field: "collection_id", len: i64::MAX as u64, max: 0, pos: 0 });
    assert_eq!(err(&long(-5)), DecodeError::NegativeLength { field: "collection_id", len: -5, pos: 0 });
    // 2^62 map entries.
    let e = err(&[prefix(), long(1), long(1 << 62)].concat());
    assert_eq!(e.kind(), "length_overflow");
    // i64::MIN entries (negation overflows in naive code).
    let e = err(&[prefix(), long(1), long(i64::MIN), long(0)].concat());
    assert_eq!(e.kind(), "length_overflow");
    // Huge declared block size.
    let e = err(&[prefix(), long(1), long(-1), long(i64::MAX), string("a"), long(0), long(0)].concat());
    assert_eq!(e.kind(), "length_overflow");
    // Huge embedding.
    let e = err(&[string("c"), string("i"), long(0), long(1), long(i64::MAX)].concat());
    assert!(matches!(e, DecodeError::LengthOverflow { field: "embedding", .. }));
}

#[test]
fn each_malformed_item_gets_its_kind_and_position() {
    let p = prefix().len();
    let cases: Vec<(Vec<u8>, DecodeError)> = vec![
        (vec![0xff; 11], DecodeError::VarintOverflow { field: "collection_id", pos: 0 }),
        ([vec![0xff; 9], vec![0x02]].concat(), DecodeError::VarintOverflow { field: "collection_id", pos: 0 }),
        ([string("c"), long(1), vec![0xff]].concat(), DecodeError::InvalidUtf8 { field: "id", pos: 3 }),
        (
            [string("c"), string("i"), long(5)].concat(),
            DecodeError::BadEnumIndex { field: "operation", index: 5, symbols: 5, pos: 4 },
        ),
        (
            [string("c"), string("i"), long(-1)].concat(),
            DecodeError::BadEnumIndex { field: "operation", index: -1, symbols: 5, pos: 4 },
        ),
        (
            [string("c"), string("i"), long(0), long(2)].concat(),
            DecodeError::BadUnionIndex { field: "embedding", index: 2, branches: 2, pos: 5 },
        ),
        (
            [string("c"), string("i"), long(0), long(1), long(5), vec![0; 5]].concat(),
            DecodeError::EmbeddingNotMultipleOf4 { len: 5, pos: 7 },
        ),
        (
            [string("c"), string("i"), long(0), long(0), long(1)].concat(),
            DecodeError::BadEnumIndex { field: "encoding", index: 1, symbols: 1, pos: 6 },
        ),
        (
            [prefix(), long(1), long(1), string("k"), long(5)].concat(),
            DecodeError::BadUnionIndex { field: "metadata.value", index: 5, branches: 5, pos: p + 4 },
        ),
        (
            [prefix(), long(1), long(1), string("k"), long(4), vec![2]].concat(),
            DecodeError::BadBool { field: "metadata.value", byte: 2, pos: p + 5 },
        ),
        (
            [prefix(), long(1), long(1), string("k"), long(3), vec![0; 7]].concat(),
            DecodeError::Truncated { field: "metadata.value", pos: p + 5 },
        ),
        (
            [prefix(), long(1), long(2), string("k"), long(0), string("k"), long(0), long(0)].concat(),
            DecodeError::DuplicateMapKey { field: "metadata", pos: p + 5 },
        ),
        (
            [prefix(), long(1), long(-1), long(5), string("k"), long(0), long(0), long(0), long(0), long(0)].concat(),
            DecodeError::BadBlockSize { field: "metadata", declared: 5, actual: 3, pos: p + 1 },
        ),
        (
            [prefix(), long(1), long(-1), long(-3)].concat(),
            DecodeError::NegativeLength { field: "metadata", len: -3, pos: p + 2 },
        ),
        (
            [prefix(), long(0), long(0), long(0), vec![9, 9]].concat(),
            DecodeError::TrailingBytes { count: 2, pos: p + 3 },
        ),
    ];
    for (bytes, expected) in cases {
        let got = err(&bytes);
        assert_eq!(got, expected, "input {bytes:02x?}");
        assert_eq!(got.pos(), expected.pos());
        assert!(!got.to_string().is_empty());
    }
}

#[test]
fn error_kinds_are_distinct_snake_case_labels() {
    let kinds = [
        DecodeError::Truncated { field: "f", pos: 0 }.kind(),
        DecodeError::VarintOverflow { field: "f", pos: 0 }.kind(),
        DecodeError::NegativeLength { field: "f", len: -1, pos: 0 }.kind(),
        DecodeError::LengthOverflow { field: "f", len: 1, max: 0, pos: 0 }.kind(),
        DecodeError::BadUnionIndex { field: "f", index: 9, branches: 2, pos: 0 }.kind(),
        DecodeError::BadEnumIndex { field: "f", index: 9, symbols: 2, pos: 0 }.kind(),
        DecodeError::InvalidUtf8 { field: "f", pos: 0 }.kind(),
        DecodeError::BadBool { field: "f", byte: 2, pos: 0 }.kind(),
        DecodeError::BadBlockSize { field: "f", declared: 1, actual: 2, pos: 0 }.kind(),
        DecodeError::DuplicateMapKey { field: "f", pos: 0 }.kind(),
        DecodeError::EmbeddingNotMultipleOf4 { len: 3, pos: 0 }.kind(),
        DecodeError::TrailingBytes { count: 1, pos: 0 }.kind(),
    ];
    let unique: std::collections::BTreeSet<_> = kinds.iter().collect();
    assert_eq!(unique.len(), kinds.len());
    for k in kinds {
        assert!(k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'), "{k}");
    }
}

// ---------------------------------------------------------------------------------------
// Property tests
// ---------------------------------------------------------------------------------------

/// Strings drawn from all of Unicode (`any::<char>()` favours unusual planes and edges).
fn unicode(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(any::<char>(), 0..max).prop_map(|cs| cs.into_iter().collect())
}

fn meta_value() -> impl Strategy<Value = MetaValue> {
    prop_oneof![
        Just(MetaValue::Null),
        unicode(24).prop_map(MetaValue::String),
        any::<i64>().prop_map(MetaValue::Long),
        // Every f64 bit pattern, NaNs with payloads and infinities included.
        any::<u64>().prop_map(|b| MetaValue::Double(f64::from_bits(b))),
        any::<bool>().prop_map(MetaValue::Bool),
    ]
}

pub(crate) fn log_record() -> impl Strategy<Value = LogRecord> {
    let embedding = prop::option::of(prop::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..48));
    let metadata = prop::option::of(prop::collection::btree_map(unicode(12), meta_value(), 0..6));
    let backfill = prop::option::of(
        (unicode(16), unicode(16)).prop_map(|(request_id, function_id)| BackfillRef { request_id, function_id }),
    );
    (
        unicode(16),
        unicode(40),
        prop::sample::select(Operation::ALL.to_vec()),
        embedding,
        metadata,
        prop::option::of(unicode(64)),
        backfill,
    )
        .prop_map(|(collection_id, id, operation, embedding, metadata, document, backfill)| LogRecord {
            collection_id,
            id,
            operation,
            embedding: embedding.map(Embedding::from),
            encoding: Encoding::Float32,
            metadata: metadata.map(|m| m.into_iter().collect()),
            document,
            backfill,
        })
}

/// A valid encoding damaged by a few edits: byte overwrites, truncation, insertion, and
/// splicing in a maximal varint (the edits most likely to reach deep decoder states).
pub(crate) fn mutated_encoding() -> impl Strategy<Value = Vec<u8>> {
    let edit = (0u8..4, any::<prop::sample::Index>(), any::<u8>());
    (log_record(), prop::collection::vec(edit, 1..4)).prop_map(|(r, edits)| {
        let mut bytes = encode(&r);
        for (op, at, byte) in edits {
            let i = at.index(bytes.len() + 1);
            match op {
                0 if i < bytes.len() => bytes[i] = byte,
                1 => bytes.truncate(i),
                2 => bytes.insert(i, byte),
                _ => {
                    let v = if byte % 2 == 0 { i64::MAX } else { i64::MIN + i64::from(byte) };
                    let tail = bytes.split_off(i.min(bytes.len()));
                    bytes.extend(long(v));
                    bytes.extend(tail);
                }
            }
        }
        bytes
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn fast_and_generic_paths_agree(r in log_record()) {
        let generic = encode_generic(&r).expect("generic encode");
        let fast = encode(&r);

        let from_generic = decode(&generic).expect("fast decodes generic bytes");
        prop_assert!(bitwise_eq(&from_generic, &r), "{from_generic:?} != {r:?}");
        let from_fast = decode_generic(&fast).expect("generic decodes fast bytes");
        prop_assert!(bitwise_eq(&from_fast, &r), "{from_fast:?} != {r:?}");

        // apache-avro writes a HashMap's entries in arbitrary order, so the bytes can only
        // be identical when that order is unique; otherwise they are a permutation of map
        // entries (same length, and decoding to the same record was checked above).
        if r.metadata.as_ref().map_or(0, |m| m.len()) <= 1 {
            prop_assert_eq!(&fast, &generic);
        } else {
            prop_assert_eq!(fast.len(), generic.len());
        }
    }

    #[test]
    fn decode_never_panics_on_arbitrary_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode(&bytes);
    }

    #[test]
    fn decode_never_panics_on_mutated_encodings(bytes in mutated_encoding()) {
        if let Ok(r) = decode(&bytes) {
            // Whatever decodes is a whole record: it survives a canonical roundtrip.
            let again = decode(&encode(&r)).expect("re-encoding decodes");
            prop_assert!(bitwise_eq(&again, &r), "{again:?} != {r:?}");
        }
    }

    #[test]
    fn every_strict_prefix_of_an_encoding_is_an_error(r in log_record()) {
        let bytes = encode(&r);
        for cut in 0..bytes.len() {
            prop_assert!(decode(&bytes[..cut]).is_err(), "prefix of {} bytes decoded", cut);
        }
    }
}

// ---------------------------------------------------------------------------------------
// One million inputs (run with `scripts/fuzz-decoder-1m.sh`)
// ---------------------------------------------------------------------------------------

/// xorshift64*: deterministic, dependency-free and fast enough for a million inputs.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub(crate) fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

#[test]
#[ignore = "one million inputs (~2 s in a dev build): run scripts/fuzz-decoder-1m.sh"]
fn decoder_survives_one_million_arbitrary_inputs() {
    decoder_survives_arbitrary_inputs(1_000_000);
}

/// The same inputs in every test run, bounded: `SLUICE_DECODER_INPUTS` (default 100,000,
/// a fraction of a second in a debug build).
#[test]
fn decoder_survives_a_bounded_number_of_arbitrary_inputs() {
    let n = match std::env::var("SLUICE_DECODER_INPUTS") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("SLUICE_DECODER_INPUTS={v:?} is not a count")),
        Err(_) => 100_000,
    };
    decoder_survives_arbitrary_inputs(n);
}

/// A pool of valid encodings from the property-test strategy, to mutate.
pub(crate) fn encoding_pool() -> Vec<Vec<u8>> {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::{Config, TestRunner};

    let mut runner = TestRunner::new_with_rng(
        Config::default(),
        proptest::test_runner::TestRng::deterministic_rng(proptest::test_runner::RngAlgorithm::ChaCha),
    );
    let strategy = log_record();
    let mut pool: Vec<Vec<u8>> = Vec::new();
    for _ in 0..512 {
        let r = strategy.new_tree(&mut runner).expect("strategy").current();
        pool.push(encode(&r));
    }
    pool.push(encode(&sample()));
    pool
}

pub(crate) fn fuzz_seed() -> u64 {
    std::env::var("SLUICE_FUZZ_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_u64)
}

/// The `n`-th input: arbitrary bytes, a valid encoding with 1-4 random edits, or a
/// truncated valid encoding.
pub(crate) fn next_input(n: usize, rng: &mut Rng, pool: &[Vec<u8>], input: &mut Vec<u8>) {
    input.clear();
    match n % 4 {
        // Arbitrary bytes.
        0 => {
            let len = rng.below(256);
            input.extend((0..len).map(|_| rng.next() as u8));
        }
        // A valid encoding with 1-4 random byte edits.
        1 | 2 => {
            input.extend_from_slice(&pool[rng.below(pool.len())]);
            for _ in 0..1 + rng.below(4) {
                let i = rng.below(input.len());
                match rng.below(3) {
                    0 if !input.is_empty() => input[i] = rng.next() as u8,
                    1 => input.insert(i, rng.next() as u8),
                    _ => {
                        let tail = input.split_off(i);
                        input.extend(long(rng.next() as i64));
                        input.extend(tail);
                    }
                }
            }
        }
        // A truncated valid encoding.
        _ => {
            let valid = &pool[rng.below(pool.len())];
            input.extend_from_slice(&valid[..rng.below(valid.len())]);
        }
    }
}

/// `inputs` arbitrary, mutated and truncated inputs through `decode`: none may panic.
fn decoder_survives_arbitrary_inputs(inputs: usize) {
    let seed = fuzz_seed();
    let mut rng = Rng(seed | 1);
    let pool = encoding_pool();

    let started = std::time::Instant::now();
    let mut kinds: std::collections::BTreeMap<&'static str, usize> = Default::default();
    let mut input = Vec::new();
    for n in 0..inputs {
        next_input(n, &mut rng, &pool, &mut input);
        let kind = match decode(&input) {
            Ok(_) => "ok",
            Err(e) => e.kind(),
        };
        *kinds.entry(kind).or_default() += 1;
    }
    let elapsed = started.elapsed();
    let total: usize = kinds.values().sum();
    println!("decoded {total} inputs without panic in {elapsed:.2?} (seed {seed:#x})");
    for (kind, count) in &kinds {
        println!("  {kind:<28} {count}");
    }
    assert_eq!(total, inputs);
}

/// Inputs the hand-written decoder refuses with `e` and apache-avro 0.21 accepts because of
/// its own leniency, not a decoder bug (the hand-written decoder follows the Avro spec and
/// the Java implementation here):
/// - a string or bytes value cut short by the end of the input reads as null (its decoder
///   maps `UnexpectedEof` to `Value::Null`), so a truncated datum decodes;
/// - a 10-byte varint whose last byte carries bits beyond 64 wraps instead of failing.
fn apache_avro_leniency(e: &DecodeError) -> Option<&'static str> {
    match e {
        DecodeError::Truncated { .. } | DecodeError::LengthOverflow { .. } => {
            Some("it reads a string or bytes value cut short by the end of the input as null")
        }
        DecodeError::VarintOverflow { .. } => Some("it wraps a 10-byte varint that overflows 64 bits"),
        // Stricter by design, not leniencies of apache-avro's alone (the Java reader
        // accepts both too): metadata whose key repeats is ambiguous (which value wins
        // depends on the reader), and a block whose declared byte size disagrees with its
        // items comes from a broken encoder. Both go to the DLQ with their own kind rather
        // than have Sluice pick a value silently.
        DecodeError::DuplicateMapKey { .. } => {
            Some("it keeps the last value of a repeated map key (refused here: duplicate_map_key)")
        }
        DecodeError::BadBlockSize { .. } => {
            Some("it ignores a block byte size that disagrees with the block's items (refused here: bad_block_size)")
        }
        DecodeError::NegativeLength { .. } => Some("it ignores a negative block byte size (refused here)"),
        _ => None,
    }
}

/// The hand-written decoder against apache-avro's generic decoder on the same arbitrary,
/// mutated and truncated inputs (`SLUICE_DECODER_DIFF_INPUTS`, default 20,000): both decode
/// to the same record (compared by canonical encoding) or both refuse. Prints every
/// disagreement's input in hex before failing.
///
/// apache-avro 0.21 reserves a map block's declared entry count up front, checked only
/// against its byte limit (512 MB by default), so a mutated count aborts the process
/// asking for tens of GB. The limit is process-wide and set once, by the first decode, so
/// the comparison runs in a child process that sets it to 64 KiB first: every input here
/// is far shorter, so no length or count above it can be satisfied and both decoders
/// must refuse such inputs anyway.
#[test]
fn decoder_agrees_with_apache_avro_on_arbitrary_inputs() {
    const NAME: &str = "codec::tests::decoder_agrees_with_apache_avro_on_arbitrary_inputs";
    if std::env::var_os("SLUICE_DECODER_DIFF_CHILD").is_none() {
        let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
            .args([NAME, "--exact", "--nocapture", "--test-threads=1"])
            .env("SLUICE_DECODER_DIFF_CHILD", "1")
            .output()
            .expect("spawn the test binary");
        let stdout = String::from_utf8_lossy(&out.stdout);
        println!("{stdout}");
        assert!(out.status.success(), "child failed: {}\n{}", out.status, String::from_utf8_lossy(&out.stderr));
        assert!(
            stdout.contains("disagreements") && stdout.contains("1 passed"),
            "the child ran the comparison:\n{stdout}"
        );
        return;
    }
    let cap = apache_avro::util::max_allocation_bytes(64 << 10);
    assert_eq!(cap, 64 << 10, "the allocation limit was set before this test");
    let inputs: usize = match std::env::var("SLUICE_DECODER_DIFF_INPUTS") {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("SLUICE_DECODER_DIFF_INPUTS={v:?} is not a count")),
        Err(_) => 20_000,
    };
    let seed = fuzz_seed();
    let mut rng = Rng(seed ^ 0xd1ff | 1);
    let pool = encoding_pool();
    let mut input = Vec::new();
    let (mut both_ok, mut both_err) = (0usize, 0usize);
    let mut lenient: std::collections::BTreeMap<&str, (usize, String)> = Default::default();
    let mut disagreements = Vec::new();
    for n in 0..inputs {
        next_input(n, &mut rng, &pool, &mut input);
        match (decode(&input), decode_generic(&input)) {
            (Ok(a), Ok(b)) if encode(&a) == encode(&b) => both_ok += 1,
            (Err(_), Err(_)) => both_err += 1,
            (Err(e), Ok(_)) if apache_avro_leniency(&e).is_some() => {
                let hex = input.iter().map(|b| format!("{b:02x}")).collect::<String>();
                lenient.entry(apache_avro_leniency(&e).unwrap_or_default()).or_insert((0, format!("{hex} ({e})"))).0 +=
                    1;
            }
            (fast, generic) => {
                let class = format!(
                    "hand-written {} / apache-avro {}",
                    fast.as_ref().map_or_else(|e| e.kind(), |_| "ok"),
                    generic.as_ref().map_or_else(
                        |e| format!("{e}").split(':').take(2).collect::<Vec<_>>().join(":"),
                        |_| "ok".into()
                    )
                );
                disagreements.push((
                    class,
                    format!(
                        "input {}\n  hand-written: {fast:?}\n  apache-avro:  {generic:?}",
                        input.iter().map(|b| format!("{b:02x}")).collect::<String>()
                    ),
                ));
            }
        }
    }
    println!(
        "{inputs} inputs (seed {seed:#x}): {both_ok} decoded alike, {both_err} refused by both, {} disagreements",
        disagreements.len()
    );
    for (why, (count, first)) in &lenient {
        println!("{count:>6} x refused here, accepted by apache-avro because {why}; first: {first}");
    }
    let mut classes: std::collections::BTreeMap<&str, (usize, &str)> = Default::default();
    for (class, d) in &disagreements {
        classes.entry(class).or_insert((0, d)).0 += 1;
    }
    for (class, (count, first)) in &classes {
        println!("{count:>6} x {class}\n  first: {first}");
    }
    let disagreements: Vec<&String> = disagreements.iter().map(|(_, d)| d).collect();
    assert!(disagreements.is_empty(), "{} disagreements, first: {}", disagreements.len(), disagreements[0]);
    assert!(
        both_ok > inputs / 100 && both_err > inputs / 100,
        "the inputs reach both outcomes: {both_ok} ok, {both_err} errors"
    );
}
