package sluice.peer.tools;

import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.locks.LockSupport;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Benchmark load generator: copies already-encoded log records (key and value bytes)
 * from one topic to another at a fixed rate, for the latency and recovery phases of
 * scripts/bench-suite.sh. The records get fresh CreateTime timestamps (set by the
 * producer at send), so "record timestamp -> materialized" is the end-to-end latency.
 * Keys go through the Java client's default partitioner (murmur2 of the key bytes), the
 * contract's partitioner, so every collection keeps its home partition; records of one
 * source partition are sent in order, so each collection's order is kept.
 *
 * <pre>
 * java -cp kafka-streams-peer.jar sluice.peer.tools.Replay --bootstrap B --from T1 --to T2
 *     --rate RECORDS_PER_S --seconds S [--records N] [--linger-ms MS (5)] [--batch-bytes B (1 MiB)]
 * </pre>
 * The linger is the Java client's default since Kafka 4.0 (KIP-1030) and librdkafka's: a
 * producer as users run it. A shorter one costs this process and the broker a third more
 * CPU on the core they share, and their stalls then reach the records' CreateTime.
 * First reads min(N, rate * S) records of the source into memory (so that, while pacing,
 * neither this process nor the broker spends CPU on reading the source), then sends them
 * paced: the n-th record leaves no earlier than t0 + n / rate (checked in ticks of 1 ms). Stops after S seconds or
 * when the preloaded records are sent. stdout:
 * {@code replay: sent=N acked=N seconds=S rate=R preload_s=P pacing_cpu_s=C} (C: this
 * process's CPU time while pacing); stderr: {@code replay: pacing starts} when it starts.
 */
public final class Replay {
    private static long cpuNs() {
        if (java.lang.management.ManagementFactory.getOperatingSystemMXBean()
                instanceof com.sun.management.OperatingSystemMXBean os) {
            return os.getProcessCpuTime();
        }
        return 0;
    }

    public static void main(String[] argv) throws Exception {
        String bootstrap = "127.0.0.1:9092", from = null, to = null;
        double rate = 0, seconds = 0;
        long max = Long.MAX_VALUE;
        String linger = "5";
        String batchBytes = String.valueOf(1 << 20);
        for (int i = 0; i < argv.length; i++) {
            switch (argv[i]) {
                case "--bootstrap" -> bootstrap = argv[++i];
                case "--from" -> from = argv[++i];
                case "--to" -> to = argv[++i];
                case "--rate" -> rate = Double.parseDouble(argv[++i]);
                case "--seconds" -> seconds = Double.parseDouble(argv[++i]);
                case "--records" -> max = Long.parseLong(argv[++i]);
                case "--linger-ms" -> linger = argv[++i];
                case "--batch-bytes" -> batchBytes = argv[++i];
                default -> {
                    System.err.println("unknown argument " + argv[i]);
                    System.exit(2);
                }
            }
        }
        if (from == null || to == null || rate <= 0 || seconds <= 0) {
            System.err.println("usage: Replay --from T1 --to T2 --rate R --seconds S [--records N] [--bootstrap B]");
            System.exit(2);
        }
        long want = Math.min(max, (long) Math.ceil(rate * seconds));

        // 1. Preload.
        long p0 = System.nanoTime();
        List<byte[]> keys = new ArrayList<>(), values = new ArrayList<>();
        Properties cp = new Properties();
        cp.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        cp.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class.getName());
        cp.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        cp.put(ConsumerConfig.MAX_POLL_RECORDS_CONFIG, "5000");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(cp)) {
            List<TopicPartition> parts = new ArrayList<>();
            for (PartitionInfo p : consumer.partitionsFor(from, Duration.ofSeconds(30))) {
                parts.add(new TopicPartition(from, p.partition()));
            }
            consumer.assign(parts);
            consumer.seekToBeginning(parts);
            int emptyPolls = 0;
            while (keys.size() < want && emptyPolls < 10) {
                var batch = consumer.poll(Duration.ofMillis(200));
                emptyPolls = batch.isEmpty() ? emptyPolls + 1 : 0;
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    if (keys.size() >= want) {
                        break;
                    }
                    keys.add(r.key());
                    values.add(r.value());
                }
            }
        }
        // The preloaded records (up to ~1 GB) are still young: without this, the first
        // young collections while pacing copy all of them, and that pause -- hundreds of
        // milliseconds on a shared core -- holds records that already got their CreateTime,
        // so it would be counted as the contender's latency. A full collection now moves
        // them to the old generation before the clock starts.
        System.gc();
        double preloadS = (System.nanoTime() - p0) / 1e9;
        if (keys.size() < want) {
            System.err.printf(Locale.ROOT, "replay: the source holds only %d of the %d records wanted%n", keys.size(), want);
        }

        // 2. Paced sends.
        Properties pp = new Properties();
        pp.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        pp.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        pp.put(ProducerConfig.LINGER_MS_CONFIG, linger);
        pp.put(ProducerConfig.BATCH_SIZE_CONFIG, batchBytes);
        pp.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, String.valueOf(16 << 20));
        AtomicLong acked = new AtomicLong();
        AtomicReference<Exception> failure = new AtomicReference<>();
        long sent = 0;
        long t0;
        long cpu0;
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(pp)) {
            producer.partitionsFor(to); // metadata before the clock starts
            double nsPerRecord = 1e9 / rate;
            System.err.println("replay: pacing starts");
            System.err.flush();
            cpu0 = cpuNs();
            t0 = System.nanoTime();
            long deadline = t0 + (long) (seconds * 1e9);
            int n = keys.size();
            for (int i = 0; i < n && failure.get() == null; i++) {
                long due = t0 + (long) (i * nsPerRecord);
                long now = System.nanoTime();
                if (now < due) {
                    // ticks of >= 1 ms: the records due in the meantime leave together
                    // (each still gets its own CreateTime at send)
                    LockSupport.parkNanos(Math.max(due - now, 1_000_000));
                    now = System.nanoTime();
                }
                if (now >= deadline) {
                    break;
                }
                producer.send(new ProducerRecord<>(to, null, keys.get(i), values.get(i)), (md, e) -> {
                    if (e != null) {
                        failure.compareAndSet(null, e);
                    } else {
                        acked.incrementAndGet();
                    }
                });
                keys.set(i, null);
                values.set(i, null);
                sent++;
            }
            producer.flush();
        }
        double s = (System.nanoTime() - t0) / 1e9;
        double cpuS = (cpuNs() - cpu0) / 1e9;
        if (failure.get() != null) {
            System.err.println("replay: produce failed: " + failure.get());
            System.exit(1);
        }
        System.out.println(String.format(Locale.ROOT,
                "replay: sent=%d acked=%d seconds=%.3f rate=%.1f preload_s=%.3f pacing_cpu_s=%.3f",
                sent, acked.get(), s, s > 0 ? sent / s : 0, preloadS, cpuS));
        if (acked.get() != sent) {
            System.exit(1);
        }
    }
}
