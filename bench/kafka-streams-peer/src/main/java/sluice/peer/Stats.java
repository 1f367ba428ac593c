package sluice.peer;

import java.util.Map;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.atomic.LongAdder;

/**
 * Counters shared by all stream threads (the labels mirror Sluice's metrics). A task
 * that is retried after an aborted transaction may count some records twice; these are
 * for the log, the checksum is the result.
 */
final class Stats {
    final LongAdder processed = new LongAdder();
    /** Wall-clock ms of the first processed record, 0 until then. */
    final AtomicLong firstRecordMs = new AtomicLong();
    private final Map<String, LongAdder> counters = new ConcurrentHashMap<>();

    void count(String name) {
        counters.computeIfAbsent(name, k -> new LongAdder()).increment();
    }

    LongAdder counter(String name) {
        return counters.computeIfAbsent(name, k -> new LongAdder());
    }

    void recordSeen() {
        processed.increment();
        if (firstRecordMs.get() == 0) {
            firstRecordMs.compareAndSet(0, System.currentTimeMillis());
        }
    }

    String summary() {
        StringBuilder sb = new StringBuilder();
        for (Map.Entry<String, LongAdder> e : new TreeMap<>(counters).entrySet()) {
            if (sb.length() > 0) {
                sb.append(' ');
            }
            sb.append(e.getKey()).append('=').append(e.getValue().sum());
        }
        return sb.toString();
    }
}
