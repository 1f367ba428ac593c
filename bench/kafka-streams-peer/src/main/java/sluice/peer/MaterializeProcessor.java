package sluice.peer;

import static sluice.peer.LogRecordDecoder.ADD;
import static sluice.peer.LogRecordDecoder.BACKFILL_FN;
import static sluice.peer.LogRecordDecoder.DELETE;
import static sluice.peer.LogRecordDecoder.UPDATE;
import static sluice.peer.LogRecordDecoder.UPSERT;

import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.Map;

import org.apache.kafka.common.utils.Utils;
import org.apache.kafka.common.utils.Bytes;
import org.apache.kafka.streams.processor.api.Processor;
import org.apache.kafka.streams.processor.api.ProcessorContext;
import org.apache.kafka.streams.processor.api.Record;
import org.apache.kafka.streams.state.KeyValueStore;

import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * Folds the log records of one partition (one task) into the {@code records} store,
 * DESIGN.md section 4:
 *
 * <pre>
 * operation   | id live             | id absent
 * ADD         | ignored add_existing | insert
 * UPDATE      | merge                | ignored update_missing
 * UPSERT      | merge                | insert
 * DELETE      | remove               | ignored delete_missing
 * BACKFILL_FN | no-op (counted)      | no-op
 * </pre>
 *
 * Insert drops null metadata values; merge applies metadata key by key (null removes
 * the key) and replaces document/embedding when the record carries them. A collection's
 * dimension (store {@code dimensions}) is fixed by its first applied insert/merge that
 * carries an embedding; afterwards any data record with an embedding of another length
 * is rejected (counted {@code dimension_mismatch}; Sluice sends it to its DLQ),
 * whatever its operation. Bad records (undecodable, invalid, key mismatch, misrouted)
 * are counted and skipped, as Sluice does (it sends them to its DLQ).
 */
final class MaterializeProcessor implements Processor<byte[], byte[], Void, Void> {
    static final String RECORDS_STORE = "records";
    static final String DIMENSIONS_STORE = "dimensions";
    private static final Logger LOG = LoggerFactory.getLogger(MaterializeProcessor.class);
    /** Cached "dimension not fixed yet". */
    private static final Integer NO_DIMENSION = -1;

    private final Stats stats;
    private final int topicPartitions;
    private final LogRecordDecoder decoder = new LogRecordDecoder();
    /** Per collection of this task: its dimension in bytes (-1: none yet). A read-through
     *  cache of the dimensions store, rebuilt whenever the task is (re)initialized. */
    private final Map<String, Integer> dimensions = new HashMap<>();
    private final Map<String, Boolean> homePartition = new HashMap<>();
    private KeyValueStore<Bytes, StoredRecord> records;
    private KeyValueStore<String, Integer> dimensionStore;
    private int partition;

    MaterializeProcessor(Stats stats, int topicPartitions) {
        this.stats = stats;
        this.topicPartitions = topicPartitions;
    }

    @Override
    public void init(ProcessorContext<Void, Void> context) {
        records = context.getStateStore(RECORDS_STORE);
        dimensionStore = context.getStateStore(DIMENSIONS_STORE);
        partition = context.taskId().partition();
        dimensions.clear();
        homePartition.clear();
    }

    @Override
    public void process(Record<byte[], byte[]> message) {
        stats.recordSeen();
        LogRecordDecoder.Decoded rec;
        try {
            rec = decoder.decode(message.value());
        } catch (LogRecordDecoder.BadRecord e) {
            stats.count("bad." + e.kind);
            return;
        }
        byte[] key = message.key();
        if (key != null && !LogRecordDecoder.sameBytes(key, rec.collectionId)) {
            stats.count("bad.key_mismatch");
            return;
        }
        // Sluice registers a collection on its murmur2 partition and refuses it elsewhere;
        // the peer's state is per partition too, so it refuses the same records.
        Boolean home = homePartition.get(rec.collectionId);
        if (home == null) {
            byte[] cid = key != null ? key : rec.collectionId.getBytes(StandardCharsets.UTF_8);
            home = Utils.toPositive(Utils.murmur2(cid)) % topicPartitions == partition;
            homePartition.put(rec.collectionId, home);
        }
        if (!home) {
            stats.count("bad.misrouted");
            return;
        }
        if (rec.operation == BACKFILL_FN) {
            stats.count("control.backfill_fn");
            return;
        }

        Integer dimension = dimensions.get(rec.collectionId);
        if (dimension == null) {
            dimension = dimensionStore.get(rec.collectionId);
            if (dimension == null) {
                dimension = NO_DIMENSION;
            }
            dimensions.put(rec.collectionId, dimension);
        }
        if (rec.embedding != null && dimension >= 0 && rec.embedding.length != dimension) {
            stats.count("rejected.dimension_mismatch");
            return;
        }

        Bytes storeKey = storeKey(rec.collectionId, rec.id);
        StoredRecord live = records.get(storeKey);
        StoredRecord after;
        switch (rec.operation) {
            case ADD -> {
                if (live != null) {
                    stats.count("ignored.add_existing");
                    return;
                }
                after = insert(rec);
                stats.count("applied.insert");
            }
            case UPDATE -> {
                if (live == null) {
                    stats.count("ignored.update_missing");
                    return;
                }
                after = merge(live, rec);
                stats.count("applied.merge");
            }
            case UPSERT -> {
                if (live == null) {
                    after = insert(rec);
                    stats.count("applied.insert");
                } else {
                    after = merge(live, rec);
                    stats.count("applied.merge");
                }
            }
            case DELETE -> {
                if (live == null) {
                    stats.count("ignored.delete_missing");
                    return;
                }
                records.delete(storeKey);
                stats.count("applied.remove");
                return;
            }
            default -> throw new IllegalStateException("operation " + rec.operation);
        }
        records.put(storeKey, after);
        if (dimension < 0 && rec.embedding != null) {
            dimensionStore.put(rec.collectionId, rec.embedding.length);
            dimensions.put(rec.collectionId, rec.embedding.length);
        }
    }

    /** collection id UTF-8, 0x00, record id UTF-8: byte order = (collection_id, id) order. */
    static Bytes storeKey(String collectionId, String id) {
        byte[] c = collectionId.getBytes(StandardCharsets.UTF_8);
        byte[] i = id.getBytes(StandardCharsets.UTF_8);
        byte[] k = new byte[c.length + 1 + i.length];
        System.arraycopy(c, 0, k, 0, c.length);
        System.arraycopy(i, 0, k, c.length + 1, i.length);
        return Bytes.wrap(k);
    }

    private static StoredRecord insert(LogRecordDecoder.Decoded rec) {
        Map<String, Object> metadata;
        if (rec.metadata == null) {
            metadata = new HashMap<>();
        } else {
            metadata = rec.metadata; // fresh map owned by this record
            metadata.values().removeIf(v -> v == null);
        }
        return new StoredRecord(rec.embedding, metadata, rec.document);
    }

    private static StoredRecord merge(StoredRecord live, LogRecordDecoder.Decoded rec) {
        if (rec.metadata != null) {
            for (Map.Entry<String, Object> e : rec.metadata.entrySet()) {
                if (e.getValue() == null) {
                    live.metadata.remove(e.getKey());
                } else {
                    live.metadata.put(e.getKey(), e.getValue());
                }
            }
        }
        if (rec.embedding != null) {
            live.embedding = rec.embedding;
        }
        if (rec.document != null) {
            live.document = rec.document;
        }
        return live;
    }

    @Override
    public void close() {
        LOG.debug("task partition {} closed", partition);
    }
}
