package sluice.peer;

import java.lang.management.ManagementFactory;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ListOffsetsOptions;
import org.apache.kafka.clients.admin.ListOffsetsResult.ListOffsetsResultInfo;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RemoveMembersFromConsumerGroupOptions;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.IsolationLevel;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StoreQueryParameters;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.Topology;
import org.apache.kafka.streams.errors.InvalidStateStoreException;
import org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.state.KeyValueIterator;
import org.apache.kafka.streams.state.QueryableStoreTypes;
import org.apache.kafka.streams.state.ReadOnlyKeyValueStore;
import org.apache.kafka.streams.state.Stores;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Kafka Streams peer: materialize the log topic, stop at the end offsets that existed
 * at start-up, print {@code records=<N> sha256=<hex>} on stdout (timings on stderr).
 */
public final class Main {
    private static final Logger LOG = LoggerFactory.getLogger(Main.class);

    private static final String USAGE = String.join("\n",
            "usage: java -jar kafka-streams-peer.jar --topic T --app-id ID [options]",
            "  --bootstrap HOST:PORT      default 127.0.0.1:9092",
            "  --topic T                  the log topic (e.g. <prefix>.log)",
            "  --app-id ID                application.id (consumer group, internal topic prefix)",
            "  --state-dir DIR            state.dir (default: a fresh temp dir)",
            "  --threads N                num.stream.threads (default: min(cores, partitions))",
            "  --poll-ms MS               how often committed offsets are checked (default 100)",
            "  --timeout-s S              give up after S seconds of processing (default 0: never)",
            "  --prop KEY=VALUE           any StreamsConfig / client property (repeatable)",
            "  --cleanup                  at the end, delete the app's local state, changelog topics and group",
            "  --stop-file PATH           follow mode: keep processing new records until PATH exists, then",
            "                             stop at the end offsets read at that moment (instead of start-up)",
            "Stops when the group's committed offsets reach the end offsets read (read_committed)",
            "at start-up, computes the canonical checksum of the stores, closes, and prints",
            "  records=<N> sha256=<hex>",
            "and, on stderr when caught up, one line for benchmark scripts:",
            "  peer-caught-up: records=N jvm_start_to_caught_up_s=S start_to_caught_up_s=S",
            "  first_record_to_caught_up_s=S to_running_s=S cpu_s=S rss_hwm_kb=K",
            "(cpu_s: the JVM's process CPU time, rss_hwm_kb: VmHWM of /proc/self/status, both at that moment).");

    public static void main(String[] argv) throws Exception {
        long jvmStartMs = ManagementFactory.getRuntimeMXBean().getStartTime();
        Map<String, String> props = new HashMap<>();
        String bootstrap = "127.0.0.1:9092", topic = null, appId = null, stateDir = null;
        int threads = 0;
        long pollMs = 100, timeoutS = 0;
        boolean cleanup = false;
        String stopFile = null;
        for (int i = 0; i < argv.length; i++) {
            String a = argv[i];
            switch (a) {
                case "--bootstrap" -> bootstrap = arg(argv, ++i, a);
                case "--topic" -> topic = arg(argv, ++i, a);
                case "--app-id" -> appId = arg(argv, ++i, a);
                case "--state-dir" -> stateDir = arg(argv, ++i, a);
                case "--threads" -> threads = Integer.parseInt(arg(argv, ++i, a));
                case "--poll-ms" -> pollMs = Long.parseLong(arg(argv, ++i, a));
                case "--timeout-s" -> timeoutS = Long.parseLong(arg(argv, ++i, a));
                case "--cleanup" -> cleanup = true;
                case "--stop-file" -> stopFile = arg(argv, ++i, a);
                case "--prop" -> {
                    String kv = arg(argv, ++i, a);
                    int eq = kv.indexOf('=');
                    if (eq <= 0) {
                        usage("--prop wants KEY=VALUE, got " + kv);
                    }
                    props.put(kv.substring(0, eq), kv.substring(eq + 1));
                }
                case "-h", "--help" -> {
                    System.err.println(USAGE);
                    System.exit(0);
                }
                default -> usage("unknown argument " + a);
            }
        }
        if (topic == null || appId == null) {
            usage("--topic and --app-id are required");
        }
        if (stateDir == null) {
            stateDir = Files.createTempDirectory("kafka-streams-peer-").toString();
        }
        System.exit(run(jvmStartMs, bootstrap, topic, appId, stateDir, threads, pollMs, timeoutS, cleanup, stopFile,
                props));
    }

    private static int run(long jvmStartMs, String bootstrap, String topic, String appId, String stateDir,
            int threads, long pollMs, long timeoutS, boolean cleanup, String stopFile, Map<String, String> extra)
            throws Exception {
        Properties adminProps = new Properties();
        adminProps.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        try (Admin admin = Admin.create(adminProps)) {
            // 1. The end offsets that exist now are where the run stops (follow mode: the
            //    ones that exist when the stop file appears).
            TopicDescription desc = admin.describeTopics(List.of(topic)).allTopicNames().get(30, TimeUnit.SECONDS)
                    .get(topic);
            int partitions = desc.partitions().size();
            Map<TopicPartition, Long> end = new HashMap<>();
            Map<TopicPartition, Long> target = new HashMap<>();
            long total = targets(admin, topic, desc, end, target);
            if (threads <= 0) {
                threads = Math.max(1, Math.min(Runtime.getRuntime().availableProcessors(), partitions));
            }
            LOG.info("topic {}: {} partitions, {} records to consume (end offsets {}), app-id {}, {} stream thread(s), state dir {}",
                    topic, partitions, total, end.entrySet().stream()
                            .sorted(Map.Entry.comparingByKey((x, y) -> Integer.compare(x.partition(), y.partition())))
                            .map(x -> x.getKey().partition() + ":" + x.getValue()).toList(),
                    appId, threads, stateDir);
            if (stopFile != null) {
                LOG.info("follow mode: processing until {} exists", stopFile);
            }

            // 2. The topology: source -> materializing processor with two RocksDB stores.
            Stats stats = new Stats();
            StreamsBuilder builder = new StreamsBuilder();
            builder.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore(MaterializeProcessor.RECORDS_STORE), Serdes.Bytes(),
                    new StoredRecord.SerdeImpl()));
            builder.addStateStore(Stores.keyValueStoreBuilder(
                    Stores.persistentKeyValueStore(MaterializeProcessor.DIMENSIONS_STORE), Serdes.String(),
                    Serdes.Integer()));
            final int topicPartitions = partitions;
            builder.stream(topic, Consumed.with(Serdes.ByteArray(), Serdes.ByteArray()).withName("log"))
                    .process(() -> new MaterializeProcessor(stats, topicPartitions),
                            MaterializeProcessor.RECORDS_STORE, MaterializeProcessor.DIMENSIONS_STORE);

            Properties p = new Properties();
            p.put(StreamsConfig.APPLICATION_ID_CONFIG, appId);
            p.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            p.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, StreamsConfig.EXACTLY_ONCE_V2);
            p.put(StreamsConfig.STATE_DIR_CONFIG, stateDir);
            p.put(StreamsConfig.NUM_STREAM_THREADS_CONFIG, threads);
            p.put(StreamsConfig.DEFAULT_KEY_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
            p.put(StreamsConfig.DEFAULT_VALUE_SERDE_CLASS_CONFIG, Serdes.ByteArraySerde.class);
            p.putAll(extra);
            Topology topology = builder.build(p);
            LOG.debug("topology:\n{}", topology.describe());

            KafkaStreams streams = new KafkaStreams(topology, p);
            Thread hook = new Thread(() -> streams.close(Duration.ofSeconds(30)), "peer-shutdown");
            Runtime.getRuntime().addShutdownHook(hook);
            streams.setUncaughtExceptionHandler(e -> {
                LOG.error("stream thread failed", e);
                return StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse.SHUTDOWN_CLIENT;
            });
            long[] runningAt = {0};
            streams.setStateListener((now, before) -> {
                if (now == KafkaStreams.State.RUNNING && runningAt[0] == 0) {
                    runningAt[0] = System.currentTimeMillis();
                }
                LOG.info("state {} -> {}", before, now);
            });

            // 3. Run until the committed offsets reach the targets.
            long startMs = System.currentTimeMillis();
            streams.start();
            long lastLog = startMs;
            boolean following = stopFile != null;
            while (true) {
                KafkaStreams.State s = streams.state();
                if (s == KafkaStreams.State.ERROR || s == KafkaStreams.State.PENDING_ERROR
                        || s == KafkaStreams.State.NOT_RUNNING || s == KafkaStreams.State.PENDING_SHUTDOWN) {
                    LOG.error("Kafka Streams stopped early (state {})", s);
                    return 1;
                }
                if (following && Files.exists(Path.of(stopFile))) {
                    following = false;
                    total = targets(admin, topic, desc, end, target);
                    LOG.info("stop file seen: stopping at the end offsets {} ({} records)", end, total);
                }
                if (!following && caughtUp(admin, appId, target)) {
                    break;
                }
                long now = System.currentTimeMillis();
                if (timeoutS > 0 && now - startMs > timeoutS * 1000) {
                    LOG.error("not caught up after {} s ({} of {} records processed)", timeoutS,
                            stats.processed.sum(), total);
                    streams.close(Duration.ofSeconds(30));
                    return 1;
                }
                if (now - lastLog >= 10_000) {
                    lastLog = now;
                    LOG.info("progress: {} of {} records processed", stats.processed.sum(), total);
                }
                Thread.sleep(pollMs);
            }
            long doneMs = System.currentTimeMillis();
            long cpuNs = processCpuNs();
            long hwmKb = vmHwmKb();
            {
                long first = stats.firstRecordMs.get();
                LOG.info(String.format(Locale.ROOT,
                        "peer-caught-up: records=%d jvm_start_to_caught_up_s=%.3f start_to_caught_up_s=%.3f "
                                + "first_record_to_caught_up_s=%.3f to_running_s=%.3f cpu_s=%.3f rss_hwm_kb=%d",
                        total, (doneMs - jvmStartMs) / 1000.0, (doneMs - startMs) / 1000.0,
                        first == 0 ? 0 : (doneMs - first) / 1000.0,
                        runningAt[0] == 0 ? 0 : (runningAt[0] - startMs) / 1000.0, cpuNs / 1e9, hwmKb));
            }

            // 4. The canonical checksum over every partition's store (interactive queries).
            Checksum checksum = new Checksum();
            List<KeyValueIterator<Bytes, StoredRecord>> iterators = new ArrayList<>();
            try {
                for (int part = 0; part < partitions; part++) {
                    iterators.add(recordsStore(streams, part).all());
                }
                checksum.addMerged(iterators);
            } finally {
                iterators.forEach(KeyValueIterator::close);
            }
            long checksumMs = System.currentTimeMillis();

            // 5. Close cleanly.
            boolean closed = streams.close(Duration.ofSeconds(60));
            Runtime.getRuntime().removeShutdownHook(hook);
            long closedMs = System.currentTimeMillis();
            if (!closed) {
                LOG.error("Kafka Streams did not close within 60 s");
            }
            if (cleanup) {
                deleteRecursively(Path.of(stateDir, appId));
                deleteInternalTopics(admin, appId);
            }

            System.out.println("records=" + checksum.records + " sha256=" + checksum.hex());
            System.out.flush();

            double procS = (doneMs - startMs) / 1000.0;
            long first = stats.firstRecordMs.get();
            double steadyS = first == 0 ? 0 : (doneMs - first) / 1000.0;
            LOG.info(String.format(Locale.ROOT,
                    "throughput: %d records in %.3f s = %.0f records/s (streams.start -> caught up); "
                            + "steady %.0f records/s (first record -> caught up, %.3f s); "
                            + "to RUNNING %.3f s, checksum %.3f s, close %.3f s, JVM start -> caught up %.3f s, total %.3f s",
                    total, procS, procS > 0 ? total / procS : 0, steadyS > 0 ? total / steadyS : 0, steadyS,
                    runningAt[0] == 0 ? 0 : (runningAt[0] - startMs) / 1000.0, (checksumMs - doneMs) / 1000.0,
                    (closedMs - checksumMs) / 1000.0, (doneMs - jvmStartMs) / 1000.0,
                    (closedMs - jvmStartMs) / 1000.0));
            LOG.info("processed {} messages (retries may count twice); {}", stats.processed.sum(), stats.summary());
            return closed ? 0 : 1;
        }
    }

    /**
     * Reads the topic's earliest and latest offsets (read_committed) into {@code end} and
     * {@code target} (only non-empty partitions); returns the number of records between.
     */
    private static long targets(Admin admin, String topic, TopicDescription desc, Map<TopicPartition, Long> end,
            Map<TopicPartition, Long> target) throws Exception {
        Map<TopicPartition, OffsetSpec> earliest = new HashMap<>(), latest = new HashMap<>();
        for (var p : desc.partitions()) {
            TopicPartition tp = new TopicPartition(topic, p.partition());
            earliest.put(tp, OffsetSpec.earliest());
            latest.put(tp, OffsetSpec.latest());
        }
        ListOffsetsOptions rc = new ListOffsetsOptions(IsolationLevel.READ_COMMITTED);
        Map<TopicPartition, ListOffsetsResultInfo> b = admin.listOffsets(earliest, rc).all().get(30, TimeUnit.SECONDS);
        Map<TopicPartition, ListOffsetsResultInfo> e = admin.listOffsets(latest, rc).all().get(30, TimeUnit.SECONDS);
        end.clear();
        target.clear();
        long total = 0;
        for (TopicPartition tp : e.keySet()) {
            long lo = b.get(tp).offset(), hi = e.get(tp).offset();
            end.put(tp, hi);
            total += Math.max(0, hi - lo);
            if (hi > lo) {
                target.put(tp, hi);
            }
        }
        return total;
    }

    /** CPU time of this JVM process (all threads), ns; -1 if the platform bean cannot tell. */
    private static long processCpuNs() {
        if (ManagementFactory.getOperatingSystemMXBean() instanceof com.sun.management.OperatingSystemMXBean os) {
            return os.getProcessCpuTime();
        }
        return -1;
    }

    /** Peak resident set size (VmHWM) of this process in kB, from /proc/self/status; -1 elsewhere. */
    private static long vmHwmKb() {
        try {
            for (String line : Files.readAllLines(Path.of("/proc/self/status"))) {
                if (line.startsWith("VmHWM:")) {
                    return Long.parseLong(line.replaceAll("[^0-9]", ""));
                }
            }
        } catch (Exception e) {
            LOG.debug("cannot read VmHWM: {}", e.toString());
        }
        return -1;
    }

    /** True when, for every partition with records, the group's committed offset >= the target. */
    private static boolean caughtUp(Admin admin, String group, Map<TopicPartition, Long> target) throws Exception {
        if (target.isEmpty()) {
            return true;
        }
        Map<TopicPartition, OffsetAndMetadata> committed = admin.listConsumerGroupOffsets(group)
                .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
        for (Map.Entry<TopicPartition, Long> t : target.entrySet()) {
            OffsetAndMetadata c = committed.get(t.getKey());
            if (c == null || c.offset() < t.getValue()) {
                return false;
            }
        }
        return true;
    }

    private static ReadOnlyKeyValueStore<Bytes, StoredRecord> recordsStore(KafkaStreams streams, int partition)
            throws InterruptedException {
        StoreQueryParameters<ReadOnlyKeyValueStore<Bytes, StoredRecord>> q = StoreQueryParameters
                .fromNameAndType(MaterializeProcessor.RECORDS_STORE, QueryableStoreTypes.<Bytes, StoredRecord>keyValueStore())
                .withPartition(partition);
        for (int attempt = 0;; attempt++) {
            try {
                return streams.store(q);
            } catch (InvalidStateStoreException e) {
                if (attempt >= 100) {
                    throw e;
                }
                Thread.sleep(100);
            }
        }
    }

    private static void deleteInternalTopics(Admin admin, String appId) {
        try {
            List<String> internal = admin.listTopics().names().get(30, TimeUnit.SECONDS).stream()
                    .filter(t -> t.startsWith(appId + "-") && t.endsWith("-changelog")).toList();
            admin.deleteTopics(internal).all().get(60, TimeUnit.SECONDS);
            // Stream threads do not send LeaveGroup on close (dynamic members only expire
            // after the session timeout): remove them so that the group can be deleted now.
            admin.removeMembersFromConsumerGroup(appId, new RemoveMembersFromConsumerGroupOptions())
                    .all().get(60, TimeUnit.SECONDS);
            admin.deleteConsumerGroups(List.of(appId)).all().get(60, TimeUnit.SECONDS);
            LOG.info("deleted internal topics {} and group {}", internal, appId);
        } catch (Exception e) {
            LOG.warn("cleanup of internal topics / group {} failed: {}", appId, e.toString());
        }
    }

    private static void deleteRecursively(Path dir) {
        if (!Files.exists(dir)) {
            return;
        }
        try (var paths = Files.walk(dir)) {
            for (Path x : paths.sorted(java.util.Comparator.reverseOrder()).toList()) {
                Files.delete(x);
            }
        } catch (java.io.IOException e) {
            LOG.warn("cannot delete the state dir {}: {}", dir, e.toString());
        }
    }

    private static String arg(String[] argv, int i, String name) {
        if (i >= argv.length) {
            usage(name + " needs a value");
        }
        return argv[i];
    }

    private static void usage(String why) {
        System.err.println("error: " + why);
        System.err.println(USAGE);
        System.exit(2);
    }
}
