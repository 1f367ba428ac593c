package sluice.peer;

import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.kafka.common.serialization.Deserializer;
import org.apache.kafka.common.serialization.Serde;
import org.apache.kafka.common.serialization.Serializer;

/**
 * A materialized record, the value of the {@code records} store (key: collection id
 * UTF-8, 0x00, record id UTF-8). Metadata values are String, Long, Double or Boolean;
 * a materialized record never holds a null value (DESIGN.md section 4).
 */
final class StoredRecord {
    /** Packed little-endian f32 bytes exactly as received, or null. */
    byte[] embedding;
    /** Never null; may be empty. */
    Map<String, Object> metadata;
    /** Or null. */
    String document;

    StoredRecord(byte[] embedding, Map<String, Object> metadata, String document) {
        this.embedding = embedding;
        this.metadata = metadata;
        this.document = document;
    }

    static final byte T_STRING = 's';
    static final byte T_LONG = 'l';
    static final byte T_DOUBLE = 'd';
    static final byte T_BOOL = 'b';

    /**
     * Compact binary value format:
     * {@code blob(embedding) blob(document utf8) int(n) n * (blob(key utf8) tag value)},
     * blob = int length (-1: null) + bytes, ints/longs big-endian; value by tag:
     * s = blob, l = long, d = raw double bits (long), b = one byte.
     */
    static final class SerdeImpl implements Serde<StoredRecord>, Serializer<StoredRecord>, Deserializer<StoredRecord> {
        // One stream thread calls serialize at a time per store, but the serde instance is
        // shared by all tasks of all threads: keep the scratch buffer per thread.
        private final ThreadLocal<ByteSink> scratch = ThreadLocal.withInitial(() -> new ByteSink(1024));

        @Override
        public byte[] serialize(String topic, StoredRecord r) {
            if (r == null) {
                return null;
            }
            ByteSink out = scratch.get();
            out.reset();
            out.putBlob(r.embedding);
            out.putBlob(r.document == null ? null : r.document.getBytes(StandardCharsets.UTF_8));
            out.putInt(r.metadata.size());
            for (Map.Entry<String, Object> e : r.metadata.entrySet()) {
                out.putBlob(e.getKey().getBytes(StandardCharsets.UTF_8));
                Object v = e.getValue();
                if (v instanceof String s) {
                    out.put(T_STRING);
                    out.putBlob(s.getBytes(StandardCharsets.UTF_8));
                } else if (v instanceof Long l) {
                    out.put(T_LONG);
                    out.putLong(l);
                } else if (v instanceof Double d) {
                    out.put(T_DOUBLE);
                    out.putLong(Double.doubleToRawLongBits(d));
                } else if (v instanceof Boolean b) {
                    out.put(T_BOOL);
                    out.put((byte) (b ? 1 : 0));
                } else {
                    throw new IllegalStateException("metadata value of type " + (v == null ? "null" : v.getClass()));
                }
            }
            return out.toArray();
        }

        @Override
        public StoredRecord deserialize(String topic, byte[] data) {
            if (data == null) {
                return null;
            }
            ByteBuffer in = ByteBuffer.wrap(data);
            byte[] embedding = blob(in);
            byte[] doc = blob(in);
            int n = in.getInt();
            Map<String, Object> metadata = new HashMap<>(Math.max(4, n * 2));
            for (int i = 0; i < n; i++) {
                String key = new String(blob(in), StandardCharsets.UTF_8);
                byte tag = in.get();
                Object v = switch (tag) {
                    case T_STRING -> new String(blob(in), StandardCharsets.UTF_8);
                    case T_LONG -> in.getLong();
                    case T_DOUBLE -> Double.longBitsToDouble(in.getLong());
                    case T_BOOL -> in.get() != 0;
                    default -> throw new IllegalStateException("bad metadata tag " + tag);
                };
                metadata.put(key, v);
            }
            return new StoredRecord(embedding, metadata, doc == null ? null : new String(doc, StandardCharsets.UTF_8));
        }

        private static byte[] blob(ByteBuffer in) {
            int n = in.getInt();
            if (n < 0) {
                return null;
            }
            byte[] b = new byte[n];
            in.get(b);
            return b;
        }

        @Override
        public Serializer<StoredRecord> serializer() {
            return this;
        }

        @Override
        public Deserializer<StoredRecord> deserializer() {
            return this;
        }

        @Override
        public void close() {
        }

        @Override
        public void configure(Map<String, ?> configs, boolean isKey) {
        }
    }
}
