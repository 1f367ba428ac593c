//! Tests of the schemas and the generic path: docs and field order, fingerprints,
//! schema evolution (resolution and compatibility), BackfillTask roundtrip.

use super::*;

/// `LogRecord` as it was before the `backfill` field existed.
const LOG_RECORD_V0: &str = r#"{
  "type": "record", "name": "LogRecord", "namespace": "sluice.v1",
  "fields": [
    {"name": "collection_id", "type": "string"},
    {"name": "id", "type": "string"},
    {"name": "operation", "type": {"type": "enum", "name": "Operation",
      "symbols": ["ADD", "UPDATE", "UPSERT", "DELETE", "BACKFILL_FN"]}},
    {"name": "embedding", "type": ["null", "bytes"], "default": null},
    {"name": "encoding", "type": {"type": "enum", "name": "EmbeddingEncoding",
      "symbols": ["FLOAT32"]}, "default": "FLOAT32"},
    {"name": "metadata", "type": ["null", {"type": "map",
      "values": ["null", "string", "long", "double", "boolean"]}], "default": null},
    {"name": "document", "type": ["null", "string"], "default": null}
  ]
}"#;

fn sample() -> LogRecord {
    let mut r = LogRecord::data("c-1", "r-1", Operation::Upsert);
    r.embedding = Some(vec![1.0, -2.5, f32::MIN_POSITIVE].into());
    r.metadata =
        Some(Metadata::from_iter([("a".to_string(), MetaValue::Long(-7)), ("b".to_string(), MetaValue::Null)]));
    r.document = Some("héllo".into());
    r
}

/// The JSON of every record type in a schema, walked recursively.
fn records(v: &serde_json::Value, out: &mut Vec<serde_json::Value>) {
    match v {
        serde_json::Value::Object(o) => {
            if o.get("type").and_then(|t| t.as_str()) == Some("record") {
                out.push(v.clone());
            }
            o.values().for_each(|x| records(x, out));
        }
        serde_json::Value::Array(a) => a.iter().for_each(|x| records(x, out)),
        _ => {}
    }
}

#[test]
fn embedded_schemas_parse_in_namespace_with_a_doc_on_every_field() {
    assert_eq!(log_record_schema().name().map(|n| n.fullname(None)), Some("sluice.v1.LogRecord".into()));
    assert_eq!(backfill_task_schema().name().map(|n| n.fullname(None)), Some("sluice.v1.BackfillTask".into()));
    for json in [LOG_RECORD_SCHEMA_JSON, BACKFILL_TASK_SCHEMA_JSON] {
        let parsed: serde_json::Value = serde_json::from_str(json).expect("valid JSON");
        let mut recs = Vec::new();
        records(&parsed, &mut recs);
        assert!(!recs.is_empty());
        for rec in recs {
            for field in rec["fields"].as_array().expect("fields") {
                let doc = field["doc"].as_str().unwrap_or("");
                assert!(!doc.trim().is_empty(), "field {} has no doc", field["name"]);
            }
        }
    }
}

#[test]
fn log_record_fields_are_in_the_order_the_codec_reads_them() {
    let parsed: serde_json::Value = serde_json::from_str(LOG_RECORD_SCHEMA_JSON).expect("valid JSON");
    let names: Vec<&str> =
        parsed["fields"].as_array().expect("fields").iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(
        names,
        ["collection_id", "id", "operation", "embedding", "encoding", "metadata", "document", "backfill"]
    );
}

/// CRC-64-AVRO written out from the specification, independently of apache-avro.
fn spec_rabin(data: &[u8]) -> u64 {
    const EMPTY: u64 = 0xc15d_213a_a4d7_a795;
    let mut table = [0u64; 256];
    for (i, slot) in table.iter_mut().enumerate() {
        let mut fp = i as u64;
        for _ in 0..8 {
            fp = (fp >> 1) ^ (EMPTY & (fp & 1).wrapping_neg());
        }
        *slot = fp;
    }
    let mut fp = EMPTY;
    for &b in data {
        fp = (fp >> 8) ^ table[((fp ^ u64::from(b)) & 0xff) as usize];
    }
    fp
}

#[test]
fn fingerprints_are_the_spec_rabin_of_the_canonical_form() {
    let lr = log_record_schema();
    assert_eq!(log_record_fingerprint(), spec_rabin(lr.canonical_form().as_bytes()));
    let bt = backfill_task_schema();
    assert_eq!(backfill_task_fingerprint(), spec_rabin(bt.canonical_form().as_bytes()));
    assert_ne!(log_record_fingerprint(), backfill_task_fingerprint());
    // Spec test vector: the fingerprint of the schema `"int"`.
    let int = Schema::parse_str(r#""int""#).expect("int schema");
    assert_eq!(rabin_fingerprint(&int), spec_rabin(b"\"int\""));
}

#[test]
fn record_written_with_schema_without_backfill_is_read_with_current_schema() {
    let old = Schema::parse_str(LOG_RECORD_V0).expect("v0 schema parses");
    let mut old_value = log_record_to_value(&sample());
    if let Value::Record(fields) = &mut old_value {
        fields.retain(|(name, _)| name != "backfill");
    }
    let bytes = apache_avro::to_avro_datum(&old, old_value).expect("encode with v0");

    let decoder = GenericDecoder::for_log_records(old).expect("v0 readable as current");
    assert_eq!(decoder.decode(&bytes).expect("resolved decode"), sample());
    // Without resolution the hand-written decoder sees a truncated datum. (apache-avro
    // 0.21 reads end-of-input at a union index as branch 0, so its plain decode of
    // these bytes "works" by accident; the codec is deliberately stricter.)
    assert_eq!(crate::codec::decode(&bytes).map_err(|e| e.kind()), Err("truncated"));
    assert_eq!(decode_generic(&bytes).expect("apache-avro EOF-as-null quirk"), sample());
}

#[test]
fn schema_compatibility_new_reader_reads_old_writer_and_back() {
    let old = Schema::parse_str(LOG_RECORD_V0).expect("v0 schema parses");
    SchemaCompatibility::can_read(&old, log_record_schema()).expect("reader new, writer old");
    SchemaCompatibility::can_read(log_record_schema(), &old).expect("reader old, writer new");
}

#[test]
fn incompatible_writer_schema_is_refused_at_construction() {
    let writer = Schema::parse_str(
        r#"{"type":"record","name":"LogRecord","namespace":"sluice.v1",
            "fields":[{"name":"collection_id","type":"long"}]}"#,
    )
    .expect("parses");
    assert!(matches!(GenericDecoder::for_log_records(writer), Err(GenericError::Incompatible(_))));
}

#[test]
fn generic_roundtrip_and_trailing_bytes() {
    let mut r = sample();
    r.operation = Operation::BackfillFn;
    r.backfill = Some(BackfillRef { request_id: "req".into(), function_id: "fn".into() });
    let mut bytes = encode_generic(&r).expect("encode");
    assert_eq!(decode_generic(&bytes).expect("decode"), r);
    bytes.push(0);
    assert!(matches!(decode_generic(&bytes), Err(GenericError::TrailingBytes { count: 1 })));
}

#[test]
fn backfill_task_roundtrips_through_its_schema() {
    let task = BackfillTask {
        request_id: "7f1c".into(),
        function_id: "f-9".into(),
        collection_id: "c-1".into(),
        topic: "sluice-log".into(),
        partition: 3,
        marker_offset: 1 << 40,
        produced_at_ms: 1_760_000_000_123,
    };
    let mut bytes = encode_backfill_task(&task).expect("encode");
    assert_eq!(decode_backfill_task(&bytes).expect("decode"), task);
    bytes.push(0);
    assert!(matches!(decode_backfill_task(&bytes), Err(GenericError::TrailingBytes { count: 1 })));
    assert!(decode_backfill_task(&bytes[..bytes.len() - 4]).is_err());
}

#[test]
fn value_of_wrong_shape_is_a_typed_error() {
    assert!(matches!(log_record_from_value(Value::Null), Err(ValueError::NotARecord { .. })));
    let mut v = log_record_to_value(&sample());
    if let Value::Record(fields) = &mut v {
        fields.retain(|(name, _)| name != "id");
    }
    assert_eq!(log_record_from_value(v), Err(ValueError::MissingField { field: "id" }));
}

// ---------------------------------------------------------------------------------------
// Writer schemas from a registry: the fast path, resolution, incompatible writers
// ---------------------------------------------------------------------------------------

/// `schemas/log_record.v2.avsc`: v1 plus an optional `trace_id` at the end.
const LOG_RECORD_V2: &str = include_str!("../../schemas/log_record.v2.avsc");

/// A datum written with v2 (the record plus a trace id).
fn encode_v2(r: &LogRecord, trace_id: Option<&str>) -> Vec<u8> {
    let v2 = Schema::parse_str(LOG_RECORD_V2).expect("v2 parses");
    let Value::Record(mut fields) = log_record_to_value(r) else { unreachable!() };
    fields.push((
        "trace_id".into(),
        match trace_id {
            None => Value::Union(0, Box::new(Value::Null)),
            Some(t) => Value::Union(1, Box::new(Value::String(t.into()))),
        },
    ));
    apache_avro::to_avro_datum(&v2, Value::Record(fields)).expect("v2 encodes")
}

#[test]
fn writer_decoder_takes_the_codec_exactly_when_the_fingerprint_is_the_current_schema() {
    assert!(matches!(WriterDecoder::from_json(LOG_RECORD_SCHEMA_JSON), WriterDecoder::Fast));
    // Docs, whitespace and key order are not part of the Parsing Canonical Form.
    let canonical = log_record_schema().canonical_form();
    assert!(matches!(WriterDecoder::from_json(&canonical), WriterDecoder::Fast));
    assert!(matches!(WriterDecoder::from_json(LOG_RECORD_V2), WriterDecoder::Resolve(_)));
    assert!(matches!(WriterDecoder::from_json(LOG_RECORD_V0), WriterDecoder::Resolve(_)));
    assert_ne!(rabin_fingerprint(&Schema::parse_str(LOG_RECORD_V2).unwrap()), log_record_fingerprint());
}

#[test]
fn v2_writer_resolves_to_the_v1_reader_and_materializes_like_v1() {
    let r = sample();
    let v2 = WriterDecoder::from_json(LOG_RECORD_V2);
    for trace in [None, Some("trace-42")] {
        let datum = encode_v2(&r, trace);
        assert_eq!(v2.decode(&datum).expect("resolves"), r, "trace {trace:?}");
        // The hand-written codec cannot read v2 data: the extra field is trailing bytes.
        if trace.is_some() {
            assert_eq!(super::super::codec::decode(&datum).unwrap_err().kind(), "trailing_bytes");
        }
    }
    let v1 = WriterDecoder::from_json(LOG_RECORD_SCHEMA_JSON);
    assert_eq!(v1.decode(&super::super::codec::encode(&r)).unwrap(), r);
    // A v2 datum cut short anywhere is refused (apache-avro alone accepts some of these),
    // and so are trailing bytes.
    let datum = encode_v2(&r, Some("t"));
    for cut in 1..datum.len() {
        let e = v2.decode(&datum[..datum.len() - cut]).expect_err("a cut datum is refused");
        assert_ne!(e.kind(), INCOMPATIBLE_SCHEMA, "cut {cut}: {e}");
    }
    let mut longer = datum.clone();
    longer.push(0);
    assert_eq!(v2.decode(&longer).unwrap_err().kind(), "trailing_bytes");
}

#[test]
fn a_writer_schema_the_reader_cannot_resolve_is_incompatible_for_every_datum() {
    // `id` as an int: not promotable to string.
    let int_id = LOG_RECORD_V0.replace(r#"{"name": "id", "type": "string"}"#, r#"{"name": "id", "type": "int"}"#);
    assert_ne!(int_id, LOG_RECORD_V0);
    // No `collection_id`, which the reader needs and has no default for.
    let no_collection = LOG_RECORD_V0.replace(r#"{"name": "collection_id", "type": "string"},"#, "");
    for (what, json) in
        [("int id", int_id.as_str()), ("no collection_id", no_collection.as_str()), ("not avro", "{\"nope\": 1}")]
    {
        let d = WriterDecoder::from_json(json);
        assert!(matches!(d, WriterDecoder::Incompatible(_)), "{what}: {d:?}");
        let e = d.decode(b"\x02a").unwrap_err();
        assert_eq!(e.kind(), INCOMPATIBLE_SCHEMA, "{what}");
    }
}
