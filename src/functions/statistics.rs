//! `statistics`: one output record per metadata `(key, value)` pair present in the live
//! input records, with metadata [`KEY_FIELD`] (the key, a string), [`VALUE_FIELD`] (the
//! value itself, typed) and [`COUNT_FIELD`] (how many live records hold that pair).
//!
//! A change emits −1 for each pair of `before` and +1 for each pair of `after`, netted:
//! a pair present in both with the same value emits nothing. Values are compared by
//! type and, for doubles, **bitwise** (`0.0` and `-0.0` are two values, as their output
//! ids are two ids). A counter that reaches 0 removes its output record
//! (`remove_at_zero: true`).
//!
//! # Output ids
//!
//! [`output_id`] encodes a pair as `<key>=<tag>:<value>`, readable and injective
//! ([`parse_output_id`] inverts it):
//!
//! | value               | encoding                  | example              |
//! | ------------------- | ------------------------- | -------------------- |
//! | string              | `s:` + the string as is   | `color=s:red`        |
//! | long                | `l:` + decimal            | `rank=l:-42`         |
//! | double              | `d:` + Rust's shortest round-trip form (`{:?}`) | `score=d:0.5`, `z=d:-0.0`, `big=d:1e300` |
//! | double NaN          | `d:NaN:` + the 16 hex digits of its bits | `x=d:NaN:7ff8000000000000` |
//! | bool                | `b:true` / `b:false`      | `flag=b:true`        |
//!
//! In the key, `%` is written `%25` and `=` is written `%3D`, so the first `=` of an
//! id always ends the key (`a=b` → `a%3Db=...`). The value is last, so it needs no
//! escaping. The double form parses back to the same bits for every non-NaN value
//! (`-0.0` included); NaN (which validation rejects anyway) keeps its payload. Records
//! never hold `Null` values; were one to appear, its pair is skipped, not counted.
//!
//! ## Long pairs
//!
//! An output id is a key of the output collection's records, and database indexes have
//! an entry size limit (PostgreSQL refuses B-tree entries above about 2.7 KB). When the
//! encoding above is longer than [`MAX_OUTPUT_ID_BYTES`], the id is instead
//! `<key, cut>=h:<tag>:<value, cut>~<sha256 of the full encoding, 64 hex digits>`: at
//! most [`HASHED_KEY_BYTES`] bytes of the escaped key and as much of the encoded value
//! as fits in the bound. The tag `h` never appears in a full encoding, so a hashed id
//! never equals a full one, and two hashed ids are equal only if their full encodings
//! are. [`parse_output_id`] returns `None` for hashed ids; the output record still holds
//! the full key and value in its `key` and `value` fields.

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use super::no_params;
use super::{ChangeRef, Function, FunctionError, OutputDelta, Reads};
use crate::record::{MetaValue, Metadata};

/// Registry name.
pub const NAME: &str = "statistics";
/// Metadata key of the pair's key in an output record.
pub const KEY_FIELD: &str = "key";
/// Metadata key of the pair's value in an output record.
pub const VALUE_FIELD: &str = "value";
/// Metadata key of the count in an output record.
pub const COUNT_FIELD: &str = "count";

/// Counts live records per metadata `(key, value)` pair.
#[derive(Debug, Clone, Copy, Default)]
pub struct Statistics;

/// Registry entry: `statistics` takes no parameters.
pub fn build(params: &BTreeMap<String, String>) -> Result<Box<dyn Function>, FunctionError> {
    no_params(NAME, params)?;
    Ok(Box::new(Statistics))
}

impl Function for Statistics {
    fn name(&self) -> &'static str {
        NAME
    }

    /// Pairs come from the metadata alone.
    fn reads(&self) -> Reads {
        Reads { metadata: true, ..Reads::NOTHING }
    }

    fn deltas(&self, change: &ChangeRef<'_>, out: &mut Vec<OutputDelta>) {
        let before = change.before.map(|r| &r.metadata);
        let after = change.after.map(|r| &r.metadata);
        push_unmatched(before, after, -1, out);
        push_unmatched(after, before, 1, out);
    }
}

/// `delta` for each pair of `from` that `other` does not hold with the same value.
fn push_unmatched(from: Option<&Metadata>, other: Option<&Metadata>, delta: i64, out: &mut Vec<OutputDelta>) {
    for (key, value) in from.into_iter().flatten() {
        if matches!(value, MetaValue::Null) {
            continue;
        }
        if other.and_then(|m| m.get(key)).is_some_and(|v| same_value(v, value)) {
            continue;
        }
        out.push(count_delta(key, value, delta));
    }
}

fn count_delta(key: &str, value: &MetaValue, delta: i64) -> OutputDelta {
    OutputDelta::Count {
        output_id: output_id(key, value),
        fields: pair_fields(key, value),
        count_field: COUNT_FIELD.into(),
        delta,
        remove_at_zero: true,
    }
}

/// The output record's metadata besides the count: `key` and `value`.
pub fn pair_fields(key: &str, value: &MetaValue) -> Metadata {
    Metadata::from_iter([
        (KEY_FIELD.to_string(), MetaValue::String(key.to_string())),
        (VALUE_FIELD.to_string(), value.clone()),
    ])
}

/// Same type and value; doubles bitwise.
pub fn same_value(a: &MetaValue, b: &MetaValue) -> bool {
    match (a, b) {
        (MetaValue::Double(x), MetaValue::Double(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// Longest output id in bytes; a pair whose full encoding is longer gets a hashed id.
pub const MAX_OUTPUT_ID_BYTES: usize = 256;
/// Bytes of the escaped key kept in a hashed id.
pub const HASHED_KEY_BYTES: usize = 64;
/// `~` and 64 hex digits.
const HASH_SUFFIX_BYTES: usize = 1 + 64;

/// The output id of a `(key, value)` pair (module doc for the encoding), at most
/// [`MAX_OUTPUT_ID_BYTES`] long.
pub fn output_id(key: &str, value: &MetaValue) -> String {
    let full = full_output_id(key, value);
    if full.len() <= MAX_OUTPUT_ID_BYTES {
        return full;
    }
    hashed_output_id(&full)
}

/// The largest prefix of `s` of at most `max` bytes that ends on a char boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `full` is an encoding longer than the bound: readable prefix, tag `h`, hash.
fn hashed_output_id(full: &str) -> String {
    let (escaped_key, value) = full.split_once('=').expect("every encoding has a '='");
    let mut key = cut(escaped_key, HASHED_KEY_BYTES);
    // Do not leave half of a `%25` / `%3D` escape at the end.
    if let Some(i) = key.rfind('%') {
        if key.len() - i < 3 {
            key = &key[..i];
        }
    }
    let room = MAX_OUTPUT_ID_BYTES - key.len() - "=h:".len() - HASH_SUFFIX_BYTES;
    let value = cut(value, room);
    let digest = Sha256::digest(full.as_bytes());
    let mut id = String::with_capacity(MAX_OUTPUT_ID_BYTES);
    id.push_str(key);
    id.push_str("=h:");
    id.push_str(value);
    id.push('~');
    for b in digest.iter() {
        id.push_str(&format!("{b:02x}"));
    }
    debug_assert!(id.len() <= MAX_OUTPUT_ID_BYTES);
    id
}

/// The unbounded encoding `<escaped key>=<tag>:<value>`.
fn full_output_id(key: &str, value: &MetaValue) -> String {
    let mut id = String::with_capacity(key.len() + 8);
    for c in key.chars() {
        match c {
            '%' => id.push_str("%25"),
            '=' => id.push_str("%3D"),
            c => id.push(c),
        }
    }
    id.push('=');
    match value {
        MetaValue::String(s) => {
            id.push_str("s:");
            id.push_str(s);
        }
        MetaValue::Long(n) => id.push_str(&format!("l:{n}")),
        MetaValue::Double(d) if d.is_nan() => id.push_str(&format!("d:NaN:{:016x}", d.to_bits())),
        MetaValue::Double(d) => id.push_str(&format!("d:{d:?}")),
        MetaValue::Bool(b) => id.push_str(&format!("b:{b}")),
        MetaValue::Null => id.push_str("n:"),
    }
    id
}

/// The pair an output id encodes, `None` if `id` is not one [`output_id`] produces.
pub fn parse_output_id(id: &str) -> Option<(String, MetaValue)> {
    let (escaped, value) = id.split_once('=')?;
    let mut key = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(i) = rest.find('%') {
        key.push_str(&rest[..i]);
        let code = rest.get(i..i + 3)?;
        key.push(match code {
            "%25" => '%',
            "%3D" => '=',
            _ => return None,
        });
        rest = &rest[i + 3..];
    }
    key.push_str(rest);
    let (tag, text) = value.split_once(':')?;
    let value = match tag {
        "s" => MetaValue::String(text.to_string()),
        "l" => MetaValue::Long(text.parse().ok()?),
        "d" => match text.strip_prefix("NaN:") {
            Some(bits) if bits.len() == 16 => MetaValue::Double(f64::from_bits(u64::from_str_radix(bits, 16).ok()?)),
            Some(_) => return None,
            None => MetaValue::Double(text.parse().ok().filter(|d: &f64| !d.is_nan())?),
        },
        "b" => MetaValue::Bool(text.parse().ok()?),
        "n" if text.is_empty() => MetaValue::Null,
        _ => return None,
    };
    Some((key, value))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::record::Record;

    fn record(pairs: &[(&str, MetaValue)]) -> Record {
        Record {
            id: "r".into(),
            embedding: None,
            metadata: pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
            document: None,
            offset: 1,
        }
    }

    fn deltas(before: Option<&Record>, after: Option<&Record>) -> Vec<(String, i64)> {
        let mut out = Vec::new();
        Statistics.deltas(&ChangeRef { id: "r", before, after, offset: 2 }, &mut out);
        out.into_iter()
            .map(|d| match d {
                OutputDelta::Count { output_id, fields, count_field, delta, remove_at_zero } => {
                    assert_eq!(count_field, "count");
                    assert!(remove_at_zero);
                    let (key, value) = parse_output_id(&output_id).expect("parses");
                    assert_eq!(fields, pair_fields(&key, &value));
                    (output_id, delta)
                }
                other => panic!("statistics emitted {other:?}"),
            })
            .collect()
    }

    #[test]
    fn statistics_counts_every_pair_of_an_insert_and_a_removal() {
        let r = record(&[("color", MetaValue::String("red".into())), ("rank", MetaValue::Long(42))]);
        assert_eq!(deltas(None, Some(&r)), vec![("color=s:red".into(), 1), ("rank=l:42".into(), 1)]);
        assert_eq!(deltas(Some(&r), None), vec![("color=s:red".into(), -1), ("rank=l:42".into(), -1)]);
    }

    #[test]
    fn statistics_nets_a_merge_to_the_pairs_that_changed() {
        let before = record(&[
            ("color", MetaValue::String("red".into())),
            ("rank", MetaValue::Long(42)),
            ("gone", MetaValue::Bool(true)),
        ]);
        let after = record(&[
            ("color", MetaValue::String("red".into())),
            ("rank", MetaValue::Double(42.0)),
            ("new", MetaValue::Bool(false)),
        ]);
        assert_eq!(
            deltas(Some(&before), Some(&after)),
            vec![
                ("gone=b:true".into(), -1),
                ("rank=l:42".into(), -1),
                ("new=b:false".into(), 1),
                ("rank=d:42.0".into(), 1),
            ]
        );
        assert!(deltas(Some(&before), Some(&before)).is_empty());
    }

    #[test]
    fn statistics_compares_doubles_bitwise() {
        let plus = record(&[("z", MetaValue::Double(0.0))]);
        let minus = record(&[("z", MetaValue::Double(-0.0))]);
        assert_eq!(deltas(Some(&plus), Some(&minus)), vec![("z=d:0.0".into(), -1), ("z=d:-0.0".into(), 1)]);
        assert!(deltas(Some(&minus), Some(&minus)).is_empty());
    }

    #[test]
    fn output_ids_are_readable_and_escape_the_separator_in_keys() {
        assert_eq!(output_id("color", &MetaValue::String("red".into())), "color=s:red");
        assert_eq!(output_id("flag", &MetaValue::Bool(true)), "flag=b:true");
        assert_eq!(output_id("score", &MetaValue::Double(0.1)), "score=d:0.1");
        assert_eq!(output_id("big", &MetaValue::Double(1e300)), "big=d:1e300");
        assert_eq!(output_id("a=b", &MetaValue::String("c".into())), "a%3Db=s:c");
        assert_eq!(output_id("a", &MetaValue::String("b=s:c".into())), "a=s:b=s:c");
        assert_ne!(
            output_id("a=b", &MetaValue::String("c".into())),
            output_id("a", &MetaValue::String("b=s:c".into()))
        );
        assert_eq!(output_id("100%", &MetaValue::Long(1)), "100%25=l:1");
        assert_eq!(output_id("x", &MetaValue::Double(f64::NAN)), "x=d:NaN:7ff8000000000000");
    }

    #[test]
    fn parse_output_id_refuses_what_output_id_never_produces() {
        for bad in ["novalue", "k=x:1", "k=l:1.5", "k%=l:1", "k%41=l:1", "k=d:NaN", "k=d:NaN:1", "k=b:yes"] {
            assert_eq!(parse_output_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn long_pairs_get_a_readable_prefix_and_a_hash() {
        let fits = "v".repeat(MAX_OUTPUT_ID_BYTES - "k=s:".len());
        assert_eq!(output_id("k", &MetaValue::String(fits.clone())), format!("k=s:{fits}"), "at the bound: full id");
        let over = format!("{fits}w");
        let id = output_id("k", &MetaValue::String(over.clone()));
        assert_eq!(id.len(), MAX_OUTPUT_ID_BYTES);
        assert!(id.starts_with("k=h:s:vvvv"), "{id}");
        let digest = Sha256::digest(format!("k=s:{over}").as_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert!(id.ends_with(&format!("~{hex}")), "{id}");
        assert_eq!(parse_output_id(&id), None);

        // ~3 KB values that share their first kilobyte still get distinct ids.
        let common = "x".repeat(1024);
        let a = output_id("meta", &MetaValue::String(format!("{common}{}", "a".repeat(2000))));
        let b = output_id("meta", &MetaValue::String(format!("{common}{}", "b".repeat(2000))));
        assert_ne!(a, b);
        assert!(a.len() <= MAX_OUTPUT_ID_BYTES && b.len() <= MAX_OUTPUT_ID_BYTES);

        // A long key of escaped characters is cut before the hash, never mid-escape.
        let id = output_id(&"=".repeat(1024), &MetaValue::Long(1));
        assert!(id.len() <= MAX_OUTPUT_ID_BYTES);
        let (key, _) = id.split_once("=h:").expect("hashed form");
        assert!(key.len() <= HASHED_KEY_BYTES && key.len() % 3 == 0 && key.chars().all(|c| "%3D".contains(c)), "{key}");
        // Multi-byte characters are cut on a boundary.
        let id = output_id("k", &MetaValue::String("é".repeat(300)));
        assert!(id.len() <= MAX_OUTPUT_ID_BYTES && id.contains("=h:s:é"));

        // The delta carries the bounded id and the full pair in its fields.
        let r = record(&[("meta", MetaValue::String("y".repeat(3000)))]);
        let mut out = Vec::new();
        Statistics.deltas(&ChangeRef { id: "r", before: None, after: Some(&r), offset: 2 }, &mut out);
        match &out[..] {
            [OutputDelta::Count { output_id: id, fields, delta: 1, .. }] => {
                assert!(id.len() <= MAX_OUTPUT_ID_BYTES && id.starts_with("meta=h:s:y"), "{id}");
                assert_eq!(fields, &pair_fields("meta", &MetaValue::String("y".repeat(3000))));
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn arb_value() -> impl Strategy<Value = MetaValue> {
        prop_oneof![
            any::<String>().prop_map(MetaValue::String),
            "[=%:a-c0-9]{0,6}".prop_map(MetaValue::String),
            any::<i64>().prop_map(MetaValue::Long),
            any::<u64>().prop_map(|bits| MetaValue::Double(f64::from_bits(bits))),
            prop_oneof![Just(0.0), Just(-0.0), Just(0.1), Just(1e-300), Just(f64::INFINITY)]
                .prop_map(MetaValue::Double),
            any::<bool>().prop_map(MetaValue::Bool),
        ]
    }

    fn bits_eq(a: &(String, MetaValue), b: &(String, MetaValue)) -> bool {
        a.0 == b.0 && same_value(&a.1, &b.1)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Decodable, hence injective: two pairs with one id are the same pair.
        #[test]
        fn output_id_round_trips_bitwise(key in prop_oneof![any::<String>(), "[=%:a-c]{0,6}"], value in arb_value()) {
            let id = output_id(&key, &value);
            prop_assume!(full_output_id(&key, &value).len() <= MAX_OUTPUT_ID_BYTES);
            let parsed = parse_output_id(&id).expect("own ids parse");
            prop_assert!(bits_eq(&parsed, &(key, value)), "{id:?} parsed to {parsed:?}");
        }

        /// Long pairs: bounded, never equal to a short pair's id, distinct for distinct pairs.
        #[test]
        fn long_pairs_get_bounded_distinct_ids(
            key in prop_oneof!["[=%a-cé]{0,8}", "[=%a]{60,400}"],
            a in "[ab~=é]{0,300}",
            b in "[ab~=é]{0,300}",
            n in any::<i64>(),
        ) {
            let ia = output_id(&key, &MetaValue::String(a.clone()));
            let ib = output_id(&key, &MetaValue::String(b.clone()));
            let il = output_id(&key, &MetaValue::Long(n));
            for id in [&ia, &ib, &il] {
                prop_assert!(id.len() <= MAX_OUTPUT_ID_BYTES, "{} bytes", id.len());
            }
            prop_assert_eq!(a == b, ia == ib);
            prop_assert_ne!(&ia, &il);
            prop_assert_eq!(output_id(&key, &MetaValue::String(a.clone())), ia.clone(), "deterministic");
            let long = full_output_id(&key, &MetaValue::String(a.clone())).len() > MAX_OUTPUT_ID_BYTES;
            prop_assert_eq!(parse_output_id(&ia).is_none(), long);
        }
    }
}
