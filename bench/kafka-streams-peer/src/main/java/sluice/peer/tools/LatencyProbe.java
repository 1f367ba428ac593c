package sluice.peer.tools;

import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Locale;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

/**
 * Produce-to-materialized latency of the Kafka Streams peer, measured from outside: a
 * read_committed consumer of the peer's {@code <app-id>-records-changelog} topic. Under
 * exactly_once_v2 a store write becomes visible there exactly when the transaction that
 * also commits the input offsets commits, and Kafka Streams writes changelog records
 * with the timestamp of the input record that caused them, so
 * {@code receive wall clock - record timestamp} is input CreateTime -> committed state
 * (plus this consumer's fetch delay, at most fetch.max.wait.ms; the broker answers a
 * waiting fetch as soon as the commit marker moves the last stable offset).
 *
 * <pre>
 * java -cp kafka-streams-peer.jar sluice.peer.tools.LatencyProbe --bootstrap B --topic T
 *     --stop-file PATH [--idle-ms 2000] [--fetch-wait-ms 20] [--warmup-ms 0]
 * </pre>
 * Waits for the topic to exist, reads it from the beginning until PATH exists and no
 * record arrived for idle-ms. stdout: {@code latency: n=N p50_ms=.. p90_ms=.. p99_ms=..
 * p999_ms=.. max_ms=.. mean_ms=.. warmup_ms=W all_n=.. all_p50_ms=.. all_p99_ms=..}: the
 * figures leave out the records stamped in the first W ms (from the earliest timestamp),
 * the paced producer's own warm-up, as scripts/bench/latency.py does for Sluice; the
 * {@code all_} ones count every record.
 */
public final class LatencyProbe {
    public static void main(String[] argv) throws Exception {
        String bootstrap = "127.0.0.1:9092", topic = null, stopFile = null;
        long idleMs = 2000;
        String fetchWait = "20";
        long warmupMs = 0;
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--bootstrap" -> bootstrap = argv[++i];
                case "--topic" -> topic = argv[++i];
                case "--stop-file" -> stopFile = argv[++i];
                case "--idle-ms" -> idleMs = Long.parseLong(argv[++i]);
                case "--fetch-wait-ms" -> fetchWait = argv[++i];
                case "--warmup-ms" -> warmupMs = Long.parseLong(argv[++i]);
                default -> {
                    System.err.println("unknown argument " + argv[i]);
                    System.exit(2);
                }
            }
        }
        if (topic == null || stopFile == null) {
            System.err.println("usage: LatencyProbe --topic T --stop-file PATH [--bootstrap B]");
            System.exit(2);
        }
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.ISOLATION_LEVEL_CONFIG, "read_committed");
        cp.put(ConsumerConfig.FETCH_MAX_WAIT_MS_CONFIG, fetchWait);
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        long[] lat = new long[1 << 16];
        long[] stamp = new long[1 << 16];
        int n = 0;
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> parts = new ArrayList<>();
            while (parts.isEmpty()) {
                // the changelog topic appears when the peer's tasks are created
                var infos = consumer.listTopics(Duration.ofSeconds(10)).get(topic);
                if (infos != null) {
                    for (PartitionInfo p : infos) {
                        parts.add(new TopicPartition(topic, p.partition()));
                    }
                } else if (Files.exists(Path.of(stopFile))) {
                    System.err.println("latency probe: topic " + topic + " never appeared");
                    System.exit(1);
                } else {
                    Thread.sleep(100);
                }
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            long lastRecord = System.currentTimeMillis();
            while (true) {
                var batch = consumer.poll(Duration.ofMillis(100));
                long now = System.currentTimeMillis();
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    if (n == lat.length) {
                        lat = Arrays.copyOf(lat, n * 2);
                        stamp = Arrays.copyOf(stamp, n * 2);
                    }
                    stamp[n] = r.timestamp();
                    lat[n++] = now - r.timestamp();
                }
                if (!batch.isEmpty()) {
                    lastRecord = now;
                } else if (Files.exists(Path.of(stopFile)) && now - lastRecord >= idleMs) {
                    break;
                }
            }
        }
        if (n == 0) {
            System.out.println("latency: n=0");
            System.exit(1);
        }
        long first = Long.MAX_VALUE;
        for (int i = 0; i < n; i++) {
            first = Math.min(first, stamp[i]);
        }
        long[] steady = new long[n];
        int m = 0;
        for (int i = 0; i < n; i++) {
            if (stamp[i] >= first + warmupMs) {
                steady[m++] = lat[i];
            }
        }
        long[] s = Arrays.copyOf(steady, m);
        long[] all = Arrays.copyOf(lat, n);
        Arrays.sort(s);
        Arrays.sort(all);
        if (m == 0) {
            System.out.println("latency: n=0");
            System.exit(1);
        }
        double sum = 0;
        for (long x : s) {
            sum += x;
        }
        System.out.println(String.format(Locale.ROOT,
                "latency: n=%d p50_ms=%d p90_ms=%d p99_ms=%d p999_ms=%d max_ms=%d mean_ms=%.1f warmup_ms=%d all_n=%d all_p50_ms=%d all_p99_ms=%d",
                m, q(s, 0.50), q(s, 0.90), q(s, 0.99), q(s, 0.999), s[m - 1], sum / m, warmupMs, n, q(all, 0.50),
                q(all, 0.99)));
    }

    /** Nearest-rank quantile. */
    private static long q(long[] sorted, double p) {
        int i = (int) Math.ceil(p * sorted.length) - 1;
        return sorted[Math.max(0, Math.min(sorted.length - 1, i))];
    }
}
