//! Implementations of the subcommands.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use serde_json::json;
use tracing::info;

use super::jsonl;
use super::{CollectionsCmd, Format, OffsetsCmd};
use crate::config::{redacted_librdkafka, Config};
use crate::kafka::admin::{ensure_topic, MetadataClient, TopicOutcome};
use crate::kafka::producer::{Outgoing, Producer};
use crate::record::framing::encode_framed;
use crate::record::partitioner::partition_for;
use crate::record::validate::validate;
use crate::sysdb::{redact_url, Sysdb};

pub async fn open_sysdb(config: &Config) -> Result<Sysdb> {
    Sysdb::open(&config.sysdb.url)
        .await
        .with_context(|| format!("cannot open the sysdb at {}", redact_url(&config.sysdb.url)))
}

/// Fail fast (wrong credentials, untrusted certificate, broker down) before a command
/// starts clients that would otherwise retry silently. See `kafka::preflight`.
pub async fn preflight(config: &Config) -> Result<()> {
    let settings = crate::kafka::ClientSettings::from_config(config);
    let timeout = settings.timeout().max(std::time::Duration::from_secs(1));
    tokio::task::spawn_blocking(move || crate::kafka::preflight::check_connection(&settings, timeout)).await??;
    Ok(())
}

pub async fn init(config: &Config, partitions: Option<i32>, rf: Option<i32>) -> Result<()> {
    preflight(config).await?;
    let settings = crate::kafka::ClientSettings::from_config(config);
    let partitions = partitions.unwrap_or(config.kafka.partitions);
    let rf = rf.unwrap_or(config.kafka.replication_factor);
    let log = config.kafka.log_topic();
    let sysdb = open_sysdb(config).await?;
    let mut actual = partitions;
    for (topic, n) in
        [(log.clone(), partitions), (config.kafka.backfill_topic(), partitions), (config.kafka.dlq_topic(), partitions)]
    {
        match ensure_topic(&settings, &topic, n, rf, &[]).await? {
            TopicOutcome::Created => println!("created topic {topic} ({n} partitions, replication factor {rf})"),
            TopicOutcome::AlreadyExists { partitions: have } => {
                println!("topic {topic} exists ({have} partitions)");
                if topic == log {
                    actual = have;
                }
            }
        }
    }
    if let Some(known) = sysdb.topic_partitions(&log).await? {
        if known != actual {
            bail!("the sysdb records {known} partitions for {log} but the topic has {actual}: collections would move partitions; refusing (partition counts are fixed)");
        }
    }
    sysdb.set_topic_partitions(&log, actual).await?;
    println!("sysdb {} migrated; {log} has {actual} partitions", sysdb.backend());
    Ok(())
}

pub async fn produce(config: &Config, input: &str) -> Result<()> {
    preflight(config).await?;
    let settings = crate::kafka::ClientSettings::from_config(config);
    let producer = Producer::new(&settings, &[])?;
    let topic = config.kafka.log_topic();
    let reader: Box<dyn BufRead> = if input == "-" {
        Box::new(std::io::BufReader::new(std::io::stdin()))
    } else {
        Box::new(std::io::BufReader::new(std::fs::File::open(input).with_context(|| format!("cannot open {input}"))?))
    };
    let mut invalid: Vec<(usize, String)> = Vec::new();
    let mut undelivered: Vec<(usize, String)> = Vec::new();
    let mut delivered = 0usize;
    let mut pending: Vec<(usize, String, Vec<u8>)> = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("cannot read line {n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let rec = match jsonl::parse_line(&line)
            .and_then(|r| validate(&r, &config.limits).map(|_| r).map_err(|e| e.to_string()))
        {
            Ok(r) => r,
            Err(e) => {
                invalid.push((n, e));
                continue;
            }
        };
        let payload = encode_framed(config.kafka.framing, config.writer_schema_id(), &rec);
        pending.push((n, rec.collection_id, payload));
        if pending.len() >= 20_000 {
            let (bad, ok) = deliver(&producer, &topic, std::mem::take(&mut pending)).await;
            undelivered.extend(bad);
            delivered += ok;
        }
    }
    let (bad, ok) = deliver(&producer, &topic, pending).await;
    undelivered.extend(bad);
    delivered += ok;
    eprintln!("delivered {delivered} records to {topic}");
    for (n, e) in invalid.iter().take(20) {
        eprintln!("line {n}: invalid: {e}");
    }
    for (n, e) in undelivered.iter().take(20) {
        eprintln!("line {n}: not delivered: {e}");
    }
    if !invalid.is_empty() || !undelivered.is_empty() {
        let lines: Vec<String> = invalid.iter().chain(&undelivered).map(|(n, _)| n.to_string()).take(100).collect();
        bail!(
            "{} invalid and {} undelivered lines (line numbers: {}{})",
            invalid.len(),
            undelivered.len(),
            lines.join(","),
            if invalid.len() + undelivered.len() > 100 { ",..." } else { "" }
        );
    }
    Ok(())
}

/// Produce `(line number, key, payload)` items; returns the failed lines and the count delivered.
async fn deliver(
    producer: &Producer,
    topic: &str,
    pending: Vec<(usize, String, Vec<u8>)>,
) -> (Vec<(usize, String)>, usize) {
    let items: Vec<Outgoing<'_>> = pending
        .iter()
        .map(|(_, key, payload)| Outgoing { topic, partition: None, key: Some(key.as_bytes()), payload, headers: &[] })
        .collect();
    let results = producer.send_all(&items).await;
    let mut bad = Vec::new();
    let mut ok = 0;
    for ((line, _, _), r) in pending.iter().zip(results) {
        match r {
            Ok(_) => ok += 1,
            Err(e) => bad.push((*line, e.to_string())),
        }
    }
    (bad, ok)
}

pub async fn records(config: &Config, collection: &str, format: Format) -> Result<()> {
    let sysdb = open_sysdb(config).await?;
    if sysdb.collection(collection).await?.is_none() {
        bail!("collection {collection:?} is not known to the sysdb (see `sluice collections list`)");
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut after: Option<String> = None;
    loop {
        let page = sysdb.list_records(collection, after.as_deref(), 1000).await?;
        for r in &page {
            match format {
                Format::Human => writeln!(out, "{}\t{}", r.id, jsonl::record_to_json(r))?,
                _ => writeln!(out, "{}", jsonl::record_to_json(r))?,
            }
        }
        match page.last() {
            Some(l) if page.len() == 1000 => after = Some(l.id.clone()),
            _ => break,
        }
    }
    Ok(())
}

pub async fn collections(config: &Config, cmd: CollectionsCmd) -> Result<()> {
    let CollectionsCmd::List { format } = cmd;
    let sysdb = open_sysdb(config).await?;
    let rows = sysdb.collections().await?;
    if format == Format::Human {
        println!("{:<40} {:>9} {:>12} {:>9} {:>9}", "COLLECTION", "PARTITION", "LOG_POSITION", "RECORDS", "DIMENSION");
        for r in &rows {
            println!(
                "{:<40} {:>9} {:>12} {:>9} {:>9}",
                r.id,
                r.partition,
                r.log_position,
                r.record_count,
                r.dimension.map(|d| d.to_string()).unwrap_or_else(|| "-".into())
            );
        }
    } else {
        let v: Vec<_> = rows
            .iter()
            .map(|r| json!({"id": r.id, "partition": r.partition, "log_position": r.log_position, "records": r.record_count, "dimension": r.dimension}))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
    }
    Ok(())
}

pub use crate::offsets::{offset_rows, partition_status, OffsetRow};

pub async fn offsets(config: &Config, cmd: OffsetsCmd) -> Result<()> {
    let sysdb = open_sysdb(config).await?;
    let topic = config.kafka.log_topic();
    match cmd {
        OffsetsCmd::Show { format } => {
            let rows = offset_rows(config, &sysdb).await?;
            if format == Format::Human {
                println!(
                    "{:<24} {:>9} {:>12} {:>12} {:>14} {:>8}  STATUS",
                    "TOPIC", "PARTITION", "SYSDB_NEXT", "GROUP", "HIGH_WATERMARK", "LAG"
                );
                let o = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
                for r in &rows {
                    // A reason is one line in the table (the JSON keeps it whole).
                    let status = r.status.replace(['\n', '\r'], " ");
                    println!(
                        "{:<24} {:>9} {:>12} {:>12} {:>14} {:>8}  {}",
                        r.topic,
                        r.partition,
                        o(r.sysdb_next_offset),
                        o(r.group_offset),
                        r.high_watermark,
                        r.lag,
                        status
                    );
                }
            } else {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            }
        }
        OffsetsCmd::Reconcile => {
            let positions: Vec<(i32, i64)> = sysdb.positions(&topic).await?.into_iter().collect();
            let settings = crate::kafka::ClientSettings::from_config(config);
            let group = config.kafka.group.clone();
            let t = topic.clone();
            let n = positions.len();
            tokio::task::spawn_blocking(move || {
                MetadataClient::new(&settings, Some(&group))?.commit_group_offsets(&t, &positions)
            })
            .await??;
            println!("pushed {n} sysdb positions into group {}", config.kafka.group);
        }
        OffsetsCmd::Reset { partition, to, reason } => {
            if to < 0 {
                bail!("--to must be >= 0 (a Kafka offset: the next record to read)");
            }
            let actor = std::env::var("USER").unwrap_or_else(|_| "unknown".into());
            let prev = sysdb.reset_position(&topic, partition, to, &actor, &reason).await?;
            info!(partition, to, ?prev, "sysdb position reset");
            println!(
                "partition {partition}: sysdb next_offset {} -> {to} (audited; restart the replicas that own it)",
                prev.map(|p| p.to_string()).unwrap_or_else(|| "none".into())
            );
        }
    }
    Ok(())
}

/// One record's line of the canonical checksum:
/// `collection \t id \t E \t M \t D \n`, E = hex of the little-endian f32 bytes or `-`,
/// M = `key=T:V` sorted by key and joined by `,` (T: `s` string, `l` long, `d` double as
/// 16 hex digits of its bits, `b` boolean) or `-`, D = the document or `-`.
pub fn canonical_line(collection: &str, r: &crate::record::Record) -> String {
    use crate::record::MetaValue;
    use std::fmt::Write as _;
    let mut line = String::new();
    let _ = write!(line, "{collection}\t{}\t", r.id);
    match &r.embedding {
        Some(e) => {
            for x in e {
                for b in x.to_le_bytes() {
                    let _ = write!(line, "{b:02x}");
                }
            }
        }
        None => line.push('-'),
    }
    line.push('\t');
    if r.metadata.is_empty() {
        line.push('-');
    }
    for (i, (k, v)) in r.metadata.iter().enumerate() {
        if i > 0 {
            line.push(',');
        }
        let _ = match v {
            MetaValue::String(s) => write!(line, "{k}=s:{s}"),
            MetaValue::Long(n) => write!(line, "{k}=l:{n}"),
            MetaValue::Double(d) => write!(line, "{k}=d:{:016x}", d.to_bits()),
            MetaValue::Bool(b) => write!(line, "{k}=b:{b}"),
            MetaValue::Null => write!(line, "{k}=n:"),
        };
    }
    line.push('\t');
    line.push_str(r.document.as_deref().unwrap_or("-"));
    line.push('\n');
    line
}

pub async fn checksum(config: &Config) -> Result<()> {
    use sha2::{Digest, Sha256};
    let sysdb = open_sysdb(config).await?;
    let outputs: std::collections::HashSet<String> =
        sysdb.functions(None).await?.into_iter().map(|f| f.output_collection).collect();
    let mut ids: Vec<String> =
        sysdb.collections().await?.into_iter().map(|c| c.id).filter(|c| !outputs.contains(c)).collect();
    ids.sort_unstable();
    let mut hasher = Sha256::new();
    let mut n = 0u64;
    for c in &ids {
        let mut after: Option<String> = None;
        loop {
            let page = sysdb.list_records(c, after.as_deref(), 5000).await?;
            for r in &page {
                hasher.update(canonical_line(c, r).as_bytes());
                n += 1;
            }
            match page.last() {
                Some(l) if page.len() == 5000 => after = Some(l.id.clone()),
                _ => break,
            }
        }
    }
    let digest = hasher.finalize();
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    println!("records={n} sha256={hex}");
    Ok(())
}

pub fn config_show(config: &Config) -> Result<()> {
    let c = config;
    let v = json!({
        "kafka": {
            "brokers": c.kafka.brokers, "group": c.kafka.group, "topic_prefix": c.kafka.topic_prefix,
            "framing": format!("{:?}", c.kafka.framing).to_lowercase(), "partitions": c.kafka.partitions,
            "replication_factor": c.kafka.replication_factor,
            "rebalance_protocol": format!("{:?}", c.kafka.rebalance_protocol).to_lowercase(),
            "auto_offset_reset": format!("{:?}", c.kafka.auto_offset_reset).to_lowercase(),
        },
        "sysdb": { "url": redact_url(&c.sysdb.url) },
        "processor": {
            "batch_max_records": c.processor.batch_max_records, "batch_max_bytes": c.processor.batch_max_bytes,
            "batch_linger_ms": c.processor.batch_linger_ms,
            "unknown_collections": format!("{:?}", c.processor.unknown_collections).to_lowercase(),
            "on_data_loss": format!("{:?}", c.processor.on_data_loss).to_lowercase(),
        },
        "backfill": {
            "chunk_size": c.backfill.chunk_size, "concurrency": c.backfill.concurrency, "pause_ms": c.backfill.pause_ms,
            "scan_interval_ms": c.backfill.scan_interval_ms, "relay_interval_ms": c.backfill.relay_interval_ms,
        },
        "metrics": { "per_collection": c.metrics.per_collection },
        "http": { "listen": c.http.listen, "admin_token": c.http.admin_token().map(|_| "***") },
        "schema_registry": c.schema_registry.redacted(),
        "librdkafka": redacted_librdkafka(&c.librdkafka),
    });
    println!("{}", serde_json::to_string_pretty(&v)?);
    Ok(())
}

pub fn workload(spec: &crate::workload::WorkloadSpec) -> Result<()> {
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for r in crate::workload::generate(spec) {
        writeln!(out, "{}", jsonl::log_record_to_json(&r))?;
    }
    Ok(())
}

pub async fn functions(config: &Config, cmd: super::FunctionsCmd) -> Result<()> {
    use super::FunctionsCmd;
    let sysdb = open_sysdb(config).await?;
    match cmd {
        FunctionsCmd::Attach { collection, function, output, param } => {
            let mut params = std::collections::BTreeMap::new();
            for p in param {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p:?} must be KEY=VALUE"))?;
                params.insert(k.to_string(), v.to_string());
            }
            // Publishing fails fast when the broker is down (the relay retries later).
            let producer =
                Producer::new(&crate::kafka::ClientSettings::from_config(config), &[("message.timeout.ms", "10000")])?;
            let attached =
                crate::backfill::attach::attach(config, &sysdb, &producer, &collection, &function, &output, params)
                    .await?;
            println!("{}", serde_json::to_string(&attached)?);
        }
        FunctionsCmd::List { collection, format } => {
            let rows = sysdb.functions(collection.as_deref()).await?;
            let views: Vec<crate::backfill::attach::FunctionView> = rows.iter().map(Into::into).collect();
            if format == Format::Human {
                println!(
                    "{:<36} {:<24} {:<14} {:<24} {:<16} {:>8} {:>15}",
                    "ID", "COLLECTION", "FUNCTION", "OUTPUT", "STATUS", "MARKER", "BACKFILL"
                );
                for v in &views {
                    println!(
                        "{:<36} {:<24} {:<14} {:<24} {:<16} {:>8} {:>15}",
                        v.id,
                        v.collection,
                        v.function,
                        v.output,
                        v.status,
                        v.marker_offset.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
                        format!(
                            "{}/{}",
                            v.backfill_done,
                            v.backfill_total.map(|t| t.to_string()).unwrap_or_else(|| "?".into())
                        )
                    );
                }
            } else {
                println!("{}", serde_json::to_string_pretty(&views)?);
            }
        }
        FunctionsCmd::Detach { function_id, drop_output } => {
            match sysdb.detach_function(&function_id, drop_output).await? {
                Some(row) => println!(
                    "detached function {} ({} on {} -> {}){}",
                    row.id,
                    row.function,
                    row.collection_id,
                    row.output_collection,
                    if drop_output { "; output collection dropped" } else { "" }
                ),
                None => bail!("no function with id {function_id:?} (see `sluice functions list`)"),
            }
        }
    }
    Ok(())
}

/// Keep `partition_for` reachable from the CLI for scripts (`sluice` prints nothing here).
pub fn partition_of(collection: &str, partitions: u32) -> u32 {
    partition_for(collection.as_bytes(), partitions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::{MetaValue, Record};

    #[test]
    fn canonical_line_is_exact() {
        let mut r = Record {
            id: "a".into(),
            embedding: Some(vec![1.0, -0.5]),
            metadata: Default::default(),
            document: None,
            offset: 9,
        };
        r.metadata.insert("z".into(), MetaValue::Double(0.5));
        r.metadata.insert("b".into(), MetaValue::Bool(true));
        r.metadata.insert("n".into(), MetaValue::Long(-3));
        r.metadata.insert("s".into(), MetaValue::String("x y".into()));
        assert_eq!(
            canonical_line("c", &r),
            "c\ta\t0000803f000000bf\tb=b:true,n=l:-3,s=s:x y,z=d:3fe0000000000000\t-\n"
        );
        let bare = Record {
            id: "b".into(),
            embedding: None,
            metadata: Default::default(),
            document: Some("d".into()),
            offset: 0,
        };
        assert_eq!(canonical_line("c", &bare), "c\tb\t-\t-\td\n");
    }

    #[test]
    fn partition_status_names_the_halt_reason() {
        assert_eq!(partition_status(None), "running");
        assert_eq!(partition_status(Some("record refused at offset 7")), "halted: record refused at offset 7");
    }
}
