//! How a Kafka message value wraps the Avro datum.
//!
//! The framing is configured per topic, never guessed from the bytes: a plain datum can
//! start with 0x00 (an empty `collection_id`), so sniffing would misread records.
//!
//! - `plain`: the message value is the datum.
//! - `confluent`: the Confluent Schema Registry wire format — magic byte `0x00`, the
//!   writer schema id as 4 bytes big-endian, then the datum.

use serde::Deserialize;

/// The Confluent wire format's magic byte.
pub const CONFLUENT_MAGIC: u8 = 0x00;
/// Magic byte + 4-byte schema id.
pub const CONFLUENT_HEADER_LEN: usize = 5;

/// Message framing, as configured (`framing = "plain"` or `"confluent"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Framing {
    /// The message value is the bare Avro datum.
    Plain,
    /// Confluent Schema Registry framing: `0x00`, schema id (u32 big-endian), datum.
    Confluent,
}

/// A message value that does not carry the configured framing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FramingError {
    #[error("message of {len} bytes is shorter than the 5-byte Confluent header")]
    TooShort { len: usize },
    #[error("first byte is {found:#04x}, not the Confluent magic byte 0x00")]
    MissingMagicByte { found: u8 },
}

impl FramingError {
    /// Stable snake_case label, used as the DLQ reason.
    pub fn kind(&self) -> &'static str {
        match self {
            FramingError::TooShort { .. } => "framing_too_short",
            FramingError::MissingMagicByte { .. } => "framing_missing_magic_byte",
        }
    }
}

/// Splits a message value into the writer schema id (Confluent only) and the datum.
pub fn unframe(framing: Framing, message: &[u8]) -> Result<(Option<u32>, &[u8]), FramingError> {
    match framing {
        Framing::Plain => Ok((None, message)),
        Framing::Confluent => {
            let Some((header, datum)) = message.split_first_chunk::<CONFLUENT_HEADER_LEN>() else {
                return Err(FramingError::TooShort { len: message.len() });
            };
            let [magic, id @ ..] = *header;
            if magic != CONFLUENT_MAGIC {
                return Err(FramingError::MissingMagicByte { found: magic });
            }
            Ok((Some(u32::from_be_bytes(id)), datum))
        }
    }
}

/// Wraps a datum in the configured framing. `schema_id` is ignored for `Plain`.
/// The log message value of a record: the Avro datum, framed as configured. Every path
/// that writes log records (`sluice produce`, the HTTP ingest, attach markers) uses this.
pub fn encode_framed(framing: Framing, schema_id: u32, record: &super::LogRecord) -> Vec<u8> {
    let datum = super::codec::encode(record);
    match framing {
        Framing::Plain => datum,
        f => frame(f, schema_id, &datum),
    }
}

pub fn frame(framing: Framing, schema_id: u32, datum: &[u8]) -> Vec<u8> {
    match framing {
        Framing::Plain => datum.to_vec(),
        Framing::Confluent => {
            let mut out = Vec::with_capacity(CONFLUENT_HEADER_LEN + datum.len());
            out.push(CONFLUENT_MAGIC);
            out.extend_from_slice(&schema_id.to_be_bytes());
            out.extend_from_slice(datum);
            out
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn encode_framed_is_the_datum_framed_as_configured() {
        let r = crate::LogRecord::data("c", "id", crate::Operation::Add);
        let datum = crate::codec::encode(&r);
        assert_eq!(encode_framed(Framing::Plain, 9, &r), datum);
        assert_eq!(encode_framed(Framing::Confluent, 9, &r), frame(Framing::Confluent, 9, &datum));
        let framed = encode_framed(Framing::Confluent, 9, &r);
        let (id, back) = unframe(Framing::Confluent, &framed).unwrap();
        assert_eq!((id, back), (Some(9), datum.as_slice()));
    }

    #[derive(Debug, Deserialize)]
    struct Cfg {
        framing: Framing,
    }

    #[test]
    fn deserializes_lowercase_names_only() {
        let plain: Cfg = toml::from_str(r#"framing = "plain""#).expect("plain");
        assert_eq!(plain.framing, Framing::Plain);
        let confluent: Cfg = toml::from_str(r#"framing = "confluent""#).expect("confluent");
        assert_eq!(confluent.framing, Framing::Confluent);
        assert!(toml::from_str::<Cfg>(r#"framing = "Confluent""#).is_err());
        assert!(toml::from_str::<Cfg>(r#"framing = "auto""#).is_err());
    }

    #[test]
    fn confluent_header_is_magic_then_big_endian_schema_id() {
        let framed = frame(Framing::Confluent, 0x0102_0304, b"datum");
        assert_eq!(framed, b"\x00\x01\x02\x03\x04datum");
        assert_eq!(unframe(Framing::Confluent, &framed), Ok((Some(0x0102_0304), &b"datum"[..])));
    }

    #[test]
    fn plain_passes_bytes_through_even_when_they_look_framed() {
        let bytes = b"\x00\x00\x00\x00\x01xyz";
        assert_eq!(frame(Framing::Plain, 7, bytes), bytes.to_vec());
        assert_eq!(unframe(Framing::Plain, bytes), Ok((None, &bytes[..])));
        assert_eq!(unframe(Framing::Plain, b""), Ok((None, &b""[..])));
    }

    #[test]
    fn short_or_unmagic_confluent_messages_are_typed_errors() {
        for len in 0..CONFLUENT_HEADER_LEN {
            let bytes = vec![0u8; len];
            assert_eq!(unframe(Framing::Confluent, &bytes), Err(FramingError::TooShort { len }));
        }
        assert_eq!(unframe(Framing::Confluent, &[0, 0, 0, 0, 9]), Ok((Some(9), &[][..])));
        let e = unframe(Framing::Confluent, &[1, 0, 0, 0, 9, 42]).expect_err("bad magic");
        assert_eq!(e, FramingError::MissingMagicByte { found: 1 });
        assert_eq!(e.kind(), "framing_missing_magic_byte");
        assert_eq!(FramingError::TooShort { len: 0 }.kind(), "framing_too_short");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn frame_then_unframe_is_identity(id in any::<u32>(), datum in prop::collection::vec(any::<u8>(), 0..64)) {
            for framing in [Framing::Plain, Framing::Confluent] {
                let framed = frame(framing, id, &datum);
                let (got_id, got) = unframe(framing, &framed).expect("unframe");
                prop_assert_eq!(got, &datum[..]);
                prop_assert_eq!(got_id, (framing == Framing::Confluent).then_some(id));
            }
        }

        #[test]
        fn unframe_never_panics(bytes in prop::collection::vec(any::<u8>(), 0..16)) {
            let _ = unframe(Framing::Confluent, &bytes);
        }
    }
}
