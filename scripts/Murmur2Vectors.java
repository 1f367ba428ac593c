// Test vectors for Sluice's murmur2 partitioner, computed by the real Apache Kafka Java
// client (org.apache.kafka.common.utils.Utils.murmur2 / Utils.toPositive).
//
// Built and run by scripts/gen-murmur2-vectors.sh against the cached kafka-clients jar;
// the output is testdata/murmur2_vectors.tsv. Deterministic: fixed keys and fixed
// java.util.Random seeds, so regenerating gives the same file for the same Kafka version.
//
// Columns (tab-separated, one header line):
//   key_hex  the key bytes as lowercase hex (empty for the empty key)
//   murmur2  Utils.murmur2(key) as a signed 32-bit decimal
//   p1 p3 p8 p64 p100
//            the partition among 1, 3, 8, 64, 100 partitions, exactly as the Java
//            producer's default partitioner computes it for a keyed record:
//            Utils.toPositive(Utils.murmur2(keyBytes)) % numPartitions
//            (toPositive(x) = x & 0x7fffffff)

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.UUID;

import org.apache.kafka.common.utils.Utils;

public final class Murmur2Vectors {
    private static final int[] PARTITIONS = {1, 3, 8, 64, 100};

    // Prefixes of every length 0..=24 exercise each tail length (0-3 leftover bytes)
    // after 0..6 full 4-byte blocks.
    private static final String PATTERN = "abcdefghijklmnopqrstuvwxyz";
    private static final int MAX_PATTERN_LEN = 24;

    private static final long UUID_SEED = 20240601L;
    private static final int UUID_COUNT = 40;
    private static final long BYTES_SEED = 0x5EED_0002L;
    private static final int RANDOM_BYTES_COUNT = 50;

    // Multi-byte UTF-8, written as \\u escapes so the bytes never depend on the source
    // encoding (the comments show the text).
    private static final String[] UTF8_KEYS = {
        "caf\u00e9",                       // café: 2-byte sequence at the end
        "na\u00efve",                      // naïve
        "\u00df",                          // ß: a lone 2-byte character
        "\u03a9mega",                      // Ωmega
        "\u20ac",                          // €: 3-byte sequence
        "a\u20acb",                        // a€b
        "\u65e5\u672c\u8a9e",              // 日本語: 9 bytes
        "collection-\u65e5\u672c",         // collection-日本
        "\u4e2d\u6587\u952e",              // 中文键
        "\ud83d\ude00",                    // 😀: 4-byte sequence
        "\ud83d\udc4d\ud83c\udffd emoji",  // 👍🏽 emoji: emoji + skin-tone modifier
        "\ud83c\uddeb\ud83c\uddf7",        // 🇫🇷: regional indicators
        "\u00e9\u00e8\u00ea\u00eb",        // éèêë: 8 bytes, all >= 0x80
        "a\u0000b",                        // embedded NUL
        "\u0645\u0631\u062d\u0628\u0627",  // مرحبا: right-to-left script
    };

    // Strings from Kafka's own UtilsTest.testMurmur2, plus typical collection ids.
    private static final String[] EXTRA_STRING_KEYS = {
        "21",
        "foobar",
        "a-little-bit-long-string",
        "a-little-bit-longer-string",
        "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8",
        "abc",
        "collection-1",
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
    };

    public static void main(String[] args) {
        Map<String, byte[]> keys = new LinkedHashMap<>(); // hex -> bytes, first wins

        for (int len = 0; len <= MAX_PATTERN_LEN; len++) {
            add(keys, PATTERN.substring(0, len).getBytes(StandardCharsets.US_ASCII));
        }

        Random uuidRandom = new Random(UUID_SEED);
        for (int i = 0; i < UUID_COUNT; i++) {
            add(keys, utf8(randomV4Uuid(uuidRandom).toString()));
        }

        for (String s : UTF8_KEYS) {
            add(keys, utf8(s));
        }
        for (String s : EXTRA_STRING_KEYS) {
            add(keys, utf8(s));
        }

        // Bytes >= 0x80 are negative Java bytes: the tail of murmur2 masks them with
        // 0xff, a port that sign-extends gets these wrong.
        int[][] edges = {
            {0x00}, {0x7f}, {0x80}, {0xff},
            {0xff, 0xff}, {0x80, 0x80}, {0xff, 0xff, 0xff}, {0x80, 0x00, 0x80},
            {0x00, 0x00, 0x00, 0x00}, {0xff, 0xff, 0xff, 0xff}, {0x80, 0x80, 0x80, 0x80},
            {0xff, 0xff, 0xff, 0xff, 0xff}, {0x7f, 0x80, 0xfe, 0xff, 0x01, 0x81, 0xc3},
        };
        for (int[] edge : edges) {
            byte[] b = new byte[edge.length];
            for (int i = 0; i < edge.length; i++) {
                b[i] = (byte) edge[i];
            }
            add(keys, b);
        }

        Random bytesRandom = new Random(BYTES_SEED);
        for (int i = 0; i < RANDOM_BYTES_COUNT; i++) {
            byte[] b = new byte[1 + bytesRandom.nextInt(48)];
            bytesRandom.nextBytes(b);
            add(keys, b);
        }

        byte[] longKey = new byte[300];
        for (int i = 0; i < longKey.length; i++) {
            longKey[i] = (byte) (i * 7 + 3);
        }
        add(keys, longKey);

        StringBuilder out = new StringBuilder();
        out.append("key_hex\tmurmur2");
        for (int n : PARTITIONS) {
            out.append("\tp").append(n);
        }
        out.append('\n');
        for (Map.Entry<String, byte[]> e : keys.entrySet()) {
            byte[] keyBytes = e.getValue();
            int hash = Utils.murmur2(keyBytes);
            out.append(e.getKey()).append('\t').append(hash);
            for (int n : PARTITIONS) {
                // The default partitioner's keyed path (BuiltInPartitioner.partitionForKey).
                int partition = Utils.toPositive(Utils.murmur2(keyBytes)) % n;
                if (partition != (hash & 0x7fffffff) % n) {
                    throw new IllegalStateException("toPositive is not x & 0x7fffffff");
                }
                out.append('\t').append(partition);
            }
            out.append('\n');
        }
        System.out.print(out);
        System.out.flush();
        System.err.println("Murmur2Vectors: " + keys.size() + " keys");
    }

    private static void add(Map<String, byte[]> keys, byte[] bytes) {
        keys.putIfAbsent(hex(bytes), bytes);
    }

    private static byte[] utf8(String s) {
        return s.getBytes(StandardCharsets.UTF_8);
    }

    // A version-4 UUID (as UUID.randomUUID() builds it) from a seeded Random.
    private static UUID randomV4Uuid(Random random) {
        byte[] b = new byte[16];
        random.nextBytes(b);
        b[6] = (byte) ((b[6] & 0x0f) | 0x40);
        b[8] = (byte) ((b[8] & 0x3f) | 0x80);
        long msb = 0;
        long lsb = 0;
        for (int i = 0; i < 8; i++) {
            msb = (msb << 8) | (b[i] & 0xff);
        }
        for (int i = 8; i < 16; i++) {
            lsb = (lsb << 8) | (b[i] & 0xff);
        }
        return new UUID(msb, lsb);
    }

    private static String hex(byte[] bytes) {
        StringBuilder sb = new StringBuilder(bytes.length * 2);
        for (byte x : bytes) {
            sb.append(Character.forDigit((x >> 4) & 0xf, 16));
            sb.append(Character.forDigit(x & 0xf, 16));
        }
        return sb.toString();
    }

    private Murmur2Vectors() {}
}
