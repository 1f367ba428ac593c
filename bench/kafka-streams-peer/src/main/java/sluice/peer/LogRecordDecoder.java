package sluice.peer;

import java.io.IOException;
import java.io.InputStream;
import java.nio.ByteBuffer;
import java.util.HashMap;
import java.util.Map;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.avro.util.Utf8;

/**
 * Decodes the value of a log message — a plain Avro binary datum of
 * {@code schemas/log_record.avsc} (no Confluent framing) — with one
 * {@link GenericDatumReader} and a reused {@link BinaryDecoder} and datum, then applies
 * the same checks as Sluice's decoder and validator (src/record/codec.rs,
 * src/record/validate.rs with the default limits), so that the two count the same
 * records as bad. One instance per processor (not thread-safe).
 */
final class LogRecordDecoder {
    /** Operation ordinals, in the schema's symbol order. */
    static final int ADD = 0, UPDATE = 1, UPSERT = 2, DELETE = 3, BACKFILL_FN = 4;

    // Sluice's default [limits] (src/record/validate.rs).
    static final int MAX_ID_BYTES = 1024;
    static final int MAX_METADATA_KEYS = 64;
    static final int MAX_METADATA_VALUE_BYTES = 65536;
    static final int MAX_DOCUMENT_BYTES = 1_048_576;
    static final int MAX_EMBEDDING_DIM = 65536;

    static final Schema SCHEMA = loadSchema();

    private static Schema loadSchema() {
        try (InputStream in = LogRecordDecoder.class.getResourceAsStream("/log_record.avsc")) {
            if (in == null) {
                throw new IllegalStateException("log_record.avsc is not on the classpath");
            }
            return new Schema.Parser().parse(in);
        } catch (IOException e) {
            throw new IllegalStateException("cannot read log_record.avsc", e);
        }
    }

    /** A record that is not materialized, with a Sluice-compatible reason label. */
    static final class BadRecord extends Exception {
        private static final long serialVersionUID = 1L;
        final String kind;

        BadRecord(String kind, String message) {
            super(message, null, false, false);
            this.kind = kind;
        }
    }

    /** The decoded log record; fresh objects, nothing shared with the reader's reuse. */
    static final class Decoded {
        String collectionId;
        String id;
        int operation;
        /** Packed LE f32 bytes, or null. */
        byte[] embedding;
        /** Null when the record carries no metadata; values may be null (= remove key). */
        Map<String, Object> metadata;
        String document;
    }

    private final GenericDatumReader<GenericRecord> reader = new GenericDatumReader<>(SCHEMA);
    private final int fCollection = SCHEMA.getField("collection_id").pos();
    private final int fId = SCHEMA.getField("id").pos();
    private final int fOperation = SCHEMA.getField("operation").pos();
    private final int fEmbedding = SCHEMA.getField("embedding").pos();
    private final int fMetadata = SCHEMA.getField("metadata").pos();
    private final int fDocument = SCHEMA.getField("document").pos();
    private final int fBackfill = SCHEMA.getField("backfill").pos();
    private final Schema operationSchema = SCHEMA.getField("operation").schema();
    private BinaryDecoder decoder;
    private GenericRecord reuse;

    Decoded decode(byte[] value) throws BadRecord {
        if (value == null || value.length == 0) {
            throw new BadRecord("empty_payload", "message has no value");
        }
        GenericRecord r;
        try {
            decoder = DecoderFactory.get().binaryDecoder(value, decoder);
            r = reader.read(reuse, decoder);
            if (!decoder.isEnd()) {
                throw new BadRecord("trailing_bytes", "trailing bytes after the record");
            }
        } catch (IOException | RuntimeException e) {
            // EOFException (truncated), AvroRuntimeException (bad union/enum index,
            // negative length), ...: the reused datum may be half-filled, drop it.
            reuse = null;
            throw new BadRecord("undecodable", String.valueOf(e));
        }
        reuse = r;

        Decoded d = new Decoded();
        Utf8 cid = (Utf8) r.get(fCollection);
        Utf8 id = (Utf8) r.get(fId);
        d.operation = operationSchema.getEnumOrdinal(r.get(fOperation).toString());
        ByteBuffer emb = (ByteBuffer) r.get(fEmbedding);
        if (emb != null) {
            int n = emb.remaining();
            if ((n & 3) != 0) {
                throw new BadRecord("embedding_not_multiple_of_4", "embedding of " + n + " bytes");
            }
            byte[] e = new byte[n];
            emb.duplicate().get(e);
            d.embedding = e;
        }

        // validate(), in Sluice's order
        if (cid.getByteLength() == 0) {
            throw new BadRecord("empty_collection_id", "empty collection id");
        }
        if (cid.getByteLength() > MAX_ID_BYTES) {
            throw new BadRecord("collection_id_too_long", "collection id too long");
        }
        if (id.getByteLength() > MAX_ID_BYTES) {
            throw new BadRecord("id_too_long", "id too long");
        }
        GenericRecord backfill = (GenericRecord) r.get(fBackfill);
        if (d.operation == BACKFILL_FN) {
            if (backfill == null) {
                throw new BadRecord("backfill_without_payload", "BACKFILL_FN without payload");
            }
            if (((Utf8) backfill.get("request_id")).getByteLength() == 0
                    || ((Utf8) backfill.get("function_id")).getByteLength() == 0) {
                throw new BadRecord("empty_backfill_ref", "empty backfill ref");
            }
        } else if (backfill != null) {
            throw new BadRecord("payload_on_data_operation", "backfill payload on a data operation");
        } else if (id.getByteLength() == 0) {
            throw new BadRecord("empty_id", "empty id");
        }
        if (d.embedding != null) {
            byte[] e = d.embedding;
            if (e.length == 0) {
                throw new BadRecord("empty_embedding", "empty embedding");
            }
            if (e.length / 4 > MAX_EMBEDDING_DIM) {
                throw new BadRecord("embedding_too_large", "embedding too large");
            }
            for (int i = 0; i < e.length; i += 4) {
                // little-endian f32: the exponent is in bytes i+3 (7 bits) and i+2 (1 bit)
                if ((e[i + 3] & 0x7f) == 0x7f && (e[i + 2] & 0x80) != 0) {
                    throw new BadRecord("non_finite_embedding", "non-finite embedding value at " + (i / 4));
                }
            }
        }
        @SuppressWarnings("unchecked")
        Map<Utf8, Object> meta = (Map<Utf8, Object>) r.get(fMetadata);
        if (meta != null) {
            if (meta.size() > MAX_METADATA_KEYS) {
                throw new BadRecord("too_many_metadata_keys", "too many metadata keys");
            }
            Map<String, Object> m = new HashMap<>(Math.max(4, meta.size() * 2));
            for (Map.Entry<Utf8, Object> e : meta.entrySet()) {
                Utf8 k = e.getKey();
                if (k.getByteLength() == 0) {
                    throw new BadRecord("metadata_key_empty", "empty metadata key");
                }
                if (k.getByteLength() > MAX_ID_BYTES) {
                    throw new BadRecord("metadata_key_too_long", "metadata key too long");
                }
                Object v = e.getValue();
                if (v instanceof Utf8 s) {
                    if (s.getByteLength() > MAX_METADATA_VALUE_BYTES) {
                        throw new BadRecord("metadata_value_too_large", "metadata value too large");
                    }
                    v = s.toString();
                } else if (v instanceof Double x && !Double.isFinite(x)) {
                    throw new BadRecord("non_finite_metadata_double", "non-finite metadata double");
                }
                m.put(k.toString(), v);
            }
            d.metadata = m;
        }
        Utf8 doc = (Utf8) r.get(fDocument);
        if (doc != null) {
            if (doc.getByteLength() > MAX_DOCUMENT_BYTES) {
                throw new BadRecord("document_too_large", "document too large");
            }
            d.document = doc.toString();
        }
        d.collectionId = cid.toString();
        d.id = id.toString();
        return d;
    }

    /** The record's collection id, as raw UTF-8, for comparing with the message key. */
    static boolean sameBytes(byte[] key, String collectionId) {
        return java.util.Arrays.equals(key, collectionId.getBytes(java.nio.charset.StandardCharsets.UTF_8));
    }

    static {
        // The processor switches on ordinals: fail fast if the contract's symbol order moved.
        Schema op = SCHEMA.getField("operation").schema();
        if (op.getEnumOrdinal("ADD") != ADD || op.getEnumOrdinal("UPDATE") != UPDATE
                || op.getEnumOrdinal("UPSERT") != UPSERT || op.getEnumOrdinal("DELETE") != DELETE
                || op.getEnumOrdinal("BACKFILL_FN") != BACKFILL_FN) {
            throw new IllegalStateException("Operation symbols are not in the expected order");
        }
    }
}
