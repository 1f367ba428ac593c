package sluice.example;

import java.io.ByteArrayOutputStream;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * Produces Sluice log records framed for a schema registry with plain Apache Avro.
 *
 * <p>Usage: {@code RegistryProducer BROKERS TOPIC REGISTRY_URL SUBJECT SCHEMA.avsc RECORDS.tsv}.
 * The schema is registered under SUBJECT (the registry answers with its id, the same id
 * again for a schema it has). Each line of RECORDS.tsv is one record: collection, id,
 * operation (ADD, UPDATE, UPSERT, DELETE), embedding (comma-separated floats or -),
 * document (or -), metadata (k=v;k=v string values, or -), separated by tabs. A schema
 * with a {@code trace_id} field (log_record.v2.avsc) gets "java" there. Prints
 * {@code partition offset schema_id} per record, in order.
 */
public final class RegistryProducer {
    private static final String CONTENT_TYPE = "application/vnd.schemaregistry.v1+json";

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: RegistryProducer BROKERS TOPIC REGISTRY_URL SUBJECT SCHEMA.avsc RECORDS.tsv");
            System.exit(2);
        }
        String brokers = args[0], topic = args[1], registry = args[2], subject = args[3];
        String schemaText = Files.readString(Path.of(args[4]));
        Schema schema = new Schema.Parser().parse(schemaText);
        int schemaId = register(registry, subject, schemaText);

        Properties props = new Properties();
        props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, brokers);
        props.put(ProducerConfig.ACKS_CONFIG, "all");
        props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
        props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        // The Java client's default partitioner hashes the key with murmur2: the collection
        // id lands on the partition Sluice expects.
        GenericDatumWriter<GenericRecord> writer = new GenericDatumWriter<>(schema);
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            List<String> lines = Files.readAllLines(Path.of(args[5]));
            for (String line : lines) {
                if (line.isBlank()) {
                    continue;
                }
                GenericRecord rec = toRecord(schema, line.split("\t", -1));
                byte[] value = frame(schemaId, writer, rec);
                byte[] key = rec.get("collection_id").toString().getBytes(StandardCharsets.UTF_8);
                // One at a time: records keep their order in the partition.
                RecordMetadata md = producer.send(new ProducerRecord<>(topic, key, value)).get();
                System.out.println(md.partition() + " " + md.offset() + " " + schemaId);
            }
        }
    }

    /** Confluent framing: magic byte 0, the schema id (4 bytes big-endian), the datum. */
    static byte[] frame(int schemaId, GenericDatumWriter<GenericRecord> writer, GenericRecord rec) throws Exception {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        out.write(0);
        out.write(ByteBuffer.allocate(4).order(ByteOrder.BIG_ENDIAN).putInt(schemaId).array());
        BinaryEncoder enc = EncoderFactory.get().binaryEncoder(out, null);
        writer.write(rec, enc);
        enc.flush();
        return out.toByteArray();
    }

    static GenericRecord toRecord(Schema schema, String[] f) {
        GenericData.Record r = new GenericData.Record(schema);
        r.put("collection_id", f[0]);
        r.put("id", f[1]);
        r.put("operation", new GenericData.EnumSymbol(schema.getField("operation").schema(), f[2]));
        if (!f[3].equals("-")) {
            String[] parts = f[3].split(",");
            ByteBuffer b = ByteBuffer.allocate(4 * parts.length).order(ByteOrder.LITTLE_ENDIAN);
            for (String p : parts) {
                b.putFloat(Float.parseFloat(p));
            }
            b.flip();
            r.put("embedding", b);
        }
        r.put("encoding", new GenericData.EnumSymbol(schema.getField("encoding").schema(), "FLOAT32"));
        r.put("document", f[4].equals("-") ? null : f[4]);
        if (!f[5].equals("-")) {
            Map<String, Object> m = new HashMap<>();
            for (String kv : f[5].split(";")) {
                String[] p = kv.split("=", 2);
                m.put(p[0], p[1]);
            }
            r.put("metadata", m);
        }
        if (schema.getField("trace_id") != null) {
            r.put("trace_id", "java");
        }
        return r;
    }

    /** POST /subjects/{subject}/versions; returns the schema id. */
    static int register(String registry, String subject, String schemaText) throws Exception {
        String body = "{\"schema\":" + jsonString(schemaText) + "}";
        HttpRequest req = HttpRequest.newBuilder(URI.create(registry + "/subjects/" + subject + "/versions"))
                .timeout(Duration.ofSeconds(10))
                .header("Content-Type", CONTENT_TYPE)
                .POST(HttpRequest.BodyPublishers.ofString(body))
                .build();
        HttpResponse<String> resp = HttpClient.newHttpClient().send(req, HttpResponse.BodyHandlers.ofString());
        Matcher m = Pattern.compile("\"id\"\\s*:\\s*(\\d+)").matcher(resp.body());
        if (resp.statusCode() / 100 != 2 || !m.find()) {
            throw new IllegalStateException("registering under " + subject + ": HTTP " + resp.statusCode() + " " + resp.body());
        }
        return Integer.parseInt(m.group(1));
    }

    static String jsonString(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                case '\r' -> b.append("\\r");
                case '\t' -> b.append("\\t");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }
}
