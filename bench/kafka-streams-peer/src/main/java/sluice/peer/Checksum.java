package sluice.peer;

import java.nio.charset.StandardCharsets;
import java.security.MessageDigest;
import java.security.NoSuchAlgorithmException;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.PriorityQueue;

import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KeyValue;
import org.apache.kafka.streams.state.KeyValueIterator;

/**
 * The canonical checksum of a materialized state (Sluice computes the same):
 * all live records sorted by (collection_id, id) in UTF-8 byte order, one line each,
 * {@code collection_id \t id \t E \t M \t D \n}:
 * <ul>
 * <li>E: lowercase hex of the embedding's little-endian f32 bytes as received, or {@code -};</li>
 * <li>M: metadata entries sorted by key bytes, joined by {@code ,}, each {@code key=T:V} with
 *     T = s (string), l (long, decimal), d (double, 16 lowercase hex digits of the raw
 *     IEEE-754 bits), b (true|false); {@code -} if no keys;</li>
 * <li>D: the document, or {@code -}.</li>
 * </ul>
 * SHA-256 over the UTF-8 bytes of all lines concatenated.
 */
final class Checksum {
    long records;
    private final MessageDigest sha;
    private final ByteSink line = new ByteSink(4096);

    Checksum() {
        try {
            sha = MessageDigest.getInstance("SHA-256");
        } catch (NoSuchAlgorithmException e) {
            throw new IllegalStateException(e);
        }
    }

    String hex() {
        return HexFormat.of().formatHex(sha.digest());
    }

    /** Adds one record; store keys must arrive in ascending byte order. */
    void add(Bytes storeKey, StoredRecord r) {
        byte[] k = storeKey.get();
        int sep = indexOfZero(k);
        line.reset();
        line.put(k, 0, sep); // collection id
        line.put((byte) '\t');
        line.put(k, sep + 1, k.length - sep - 1); // id
        line.put((byte) '\t');
        if (r.embedding == null) {
            line.put((byte) '-');
        } else {
            line.putHex(r.embedding);
        }
        line.put((byte) '\t');
        if (r.metadata.isEmpty()) {
            line.put((byte) '-');
        } else {
            List<Map.Entry<byte[], Object>> entries = new ArrayList<>(r.metadata.size());
            for (Map.Entry<String, Object> e : r.metadata.entrySet()) {
                entries.add(Map.entry(e.getKey().getBytes(StandardCharsets.UTF_8), e.getValue()));
            }
            entries.sort((a, b) -> Arrays.compareUnsigned(a.getKey(), b.getKey()));
            boolean first = true;
            for (Map.Entry<byte[], Object> e : entries) {
                if (!first) {
                    line.put((byte) ',');
                }
                first = false;
                line.put(e.getKey());
                line.put((byte) '=');
                Object v = e.getValue();
                if (v instanceof String s) {
                    line.putAscii("s:");
                    line.putUtf8(s);
                } else if (v instanceof Long l) {
                    line.putAscii("l:");
                    line.putAscii(Long.toString(l));
                } else if (v instanceof Double d) {
                    line.putAscii("d:");
                    line.putHex16(Double.doubleToRawLongBits(d));
                } else if (v instanceof Boolean b) {
                    line.putAscii(b ? "b:true" : "b:false");
                } else {
                    throw new IllegalStateException("metadata value " + v);
                }
            }
        }
        line.put((byte) '\t');
        if (r.document == null) {
            line.put((byte) '-');
        } else {
            line.putUtf8(r.document);
        }
        line.put((byte) '\n');
        sha.update(line.buf, 0, line.len);
        records++;
    }

    private static int indexOfZero(byte[] k) {
        for (int i = 0; i < k.length; i++) {
            if (k[i] == 0) {
                return i;
            }
        }
        throw new IllegalStateException("store key without separator");
    }

    /**
     * Merges sorted iterators (one per partition's store) into one sorted stream and adds
     * every record. A collection lives on one partition, but collections of different
     * partitions interleave in (collection_id, id) order, hence the k-way merge.
     */
    void addMerged(List<KeyValueIterator<Bytes, StoredRecord>> iterators) {
        record Head(KeyValue<Bytes, StoredRecord> kv, KeyValueIterator<Bytes, StoredRecord> it) {
        }
        PriorityQueue<Head> heads = new PriorityQueue<>((a, b) -> a.kv().key.compareTo(b.kv().key));
        for (KeyValueIterator<Bytes, StoredRecord> it : iterators) {
            if (it.hasNext()) {
                heads.add(new Head(it.next(), it));
            }
        }
        Bytes previous = null;
        while (!heads.isEmpty()) {
            Head h = heads.poll();
            if (previous != null && previous.compareTo(h.kv().key) >= 0) {
                throw new IllegalStateException("store keys out of order or duplicated across partitions");
            }
            previous = h.kv().key;
            add(h.kv().key, h.kv().value);
            if (h.it().hasNext()) {
                heads.add(new Head(h.it().next(), h.it()));
            }
        }
    }
}
