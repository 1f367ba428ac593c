//! Implementations of the subcommands. Everything printed goes through [`super::output`]
//! (the `--format` contract; a closed pipe is an error `main` ends quietly on).

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use super::jsonl;
use super::output::{self, Format, Out};
use super::{CollectionsCmd, OffsetsCmd};
use crate::config::Config;
use crate::kafka::admin::{ensure_topic, MetadataClient, TopicOutcome};
use crate::kafka::producer::{Outgoing, Producer};
use crate::record::framing::encode_framed;
use crate::record::partitioner::partition_for;
use crate::record::validate::validate;
use crate::sysdb::{redact_url, Sysdb};

/// Open the sysdb for a command that writes (init, attach, detach, reset): creates and
/// migrates it as needed.
pub async fn open_sysdb(config: &Config) -> Result<Sysdb> {
    Sysdb::open_with(&config.sysdb.url, &config.sqlite)
        .await
        .with_context(|| format!("cannot open the sysdb at {}", redact_url(&config.sysdb.url)))
}

/// Open the sysdb for a command that only reads: never creates or migrates it. A missing
/// or older sysdb is an error that says to run `sluice init`.
pub async fn open_sysdb_read(config: &Config) -> Result<Sysdb> {
    Sysdb::open_existing(&config.sysdb.url)
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

#[derive(Serialize)]
struct InitTopic {
    topic: String,
    created: bool,
    partitions: i32,
}

#[derive(Serialize)]
struct InitReport {
    topics: Vec<InitTopic>,
    sysdb: &'static str,
    log_partitions: i32,
}

pub async fn init(config: &Config, partitions: Option<i32>, rf: Option<i32>, format: Format) -> Result<()> {
    preflight(config).await?;
    let settings = crate::kafka::ClientSettings::from_config(config);
    let partitions = partitions.unwrap_or(config.kafka.partitions);
    let rf = rf.unwrap_or(config.kafka.replication_factor);
    let log = config.kafka.log_topic();
    let sysdb = open_sysdb(config).await?;
    let mut actual = partitions;
    let mut topics = Vec::new();
    for (topic, n) in
        [(log.clone(), partitions), (config.kafka.backfill_topic(), partitions), (config.kafka.dlq_topic(), partitions)]
    {
        match ensure_topic(&settings, &topic, n, rf, &[]).await? {
            TopicOutcome::Created => topics.push(InitTopic { topic, created: true, partitions: n }),
            TopicOutcome::AlreadyExists { partitions: have } => {
                if topic == log {
                    actual = have;
                }
                topics.push(InitTopic { topic, created: false, partitions: have });
            }
        }
    }
    if let Some(known) = sysdb.topic_partitions(&log).await? {
        if known != actual {
            bail!("the sysdb records {known} partitions for {log} but the topic has {actual}: collections would move partitions; refusing (partition counts are fixed)");
        }
    }
    sysdb.set_topic_partitions(&log, actual).await?;
    let report = InitReport { topics, sysdb: sysdb.backend(), log_partitions: actual };
    output::one(format, &report, || {
        let mut lines: Vec<String> = report
            .topics
            .iter()
            .map(|t| {
                if t.created {
                    format!("created topic {} ({} partitions, replication factor {rf})", t.topic, t.partitions)
                } else {
                    format!("topic {} exists ({} partitions)", t.topic, t.partitions)
                }
            })
            .collect();
        lines.push(format!("sysdb {} migrated; {log} has {actual} partitions", report.sysdb));
        lines.join("\n")
    })
}

/// How often `produce` reports progress on stderr when stderr is not a terminal.
const PROGRESS_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// Records handed to the producer at once.
const PRODUCE_CHUNK: usize = 20_000;

#[derive(Serialize, Default)]
struct ProduceReport {
    topic: String,
    dry_run: bool,
    /// Non-empty lines read.
    lines: usize,
    /// Valid records (produced unless a dry run).
    valid: usize,
    delivered: usize,
    rejected: usize,
}

/// Progress on stderr: a bar on a terminal, a plain line every few seconds otherwise.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    last: std::time::Instant,
}

impl Progress {
    fn new(total_bytes: Option<u64>) -> Progress {
        let bar = std::io::IsTerminal::is_terminal(&std::io::stderr()).then(|| {
            let bar = match total_bytes {
                Some(n) => indicatif::ProgressBar::new(n).with_style(
                    indicatif::ProgressStyle::with_template("{bar:30} {bytes}/{total_bytes} {msg} ({eta})")
                        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                ),
                None => indicatif::ProgressBar::new_spinner(),
            };
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
            bar
        });
        Progress { bar, last: std::time::Instant::now() }
    }

    fn update(&mut self, bytes: u64, r: &ProduceReport) {
        let msg = format!("{} lines, {} delivered, {} rejected", r.lines, r.delivered, r.rejected);
        match &self.bar {
            Some(bar) => {
                bar.set_position(bytes);
                bar.set_message(msg);
            }
            None if self.last.elapsed() >= PROGRESS_EVERY => {
                self.last = std::time::Instant::now();
                eprintln!("produce: {msg}");
            }
            None => {}
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// How long `sluice produce` retries the log topic's metadata while no broker answers (a
/// broker restarting, a leader election); a topic the brokers say does not exist fails at
/// once.
const PRODUCE_METADATA_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// The log topic's partition count, retried with the retry policy while the request fails
/// (for at most [`PRODUCE_METADATA_PATIENCE`]).
fn log_topic_partitions(settings: &crate::kafka::ClientSettings, topic: &str) -> Result<i32> {
    let deadline = std::time::Instant::now() + PRODUCE_METADATA_PATIENCE;
    let mut delays = crate::retry::default_backoff();
    loop {
        match MetadataClient::new(settings, None).and_then(|m| m.topic_partitions(topic)) {
            Ok(Some(n)) => return Ok(n),
            Ok(None) => bail!("the topic {topic} does not exist"),
            Err(e) if std::time::Instant::now() < deadline => {
                let wait = delays.next().unwrap_or(std::time::Duration::from_secs(5));
                tracing::warn!(%e, retry_in = ?wait, "cannot read the log topic's metadata; retrying");
                std::thread::sleep(wait);
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// `sluice produce`: the input is opened and checked before any broker contact; then the
/// broker and the log topic; then each line is validated (stop at the first invalid line,
/// or write it to `rejects` and go on) and produced in chunks.
pub async fn produce(
    config: &Config,
    input: &str,
    dry_run: bool,
    rejects: Option<&std::path::Path>,
    format: Format,
) -> Result<()> {
    let (reader, total_bytes): (Box<dyn BufRead>, Option<u64>) = if input == "-" {
        (Box::new(std::io::BufReader::new(std::io::stdin())), None)
    } else {
        let file = std::fs::File::open(input).with_context(|| format!("cannot open the input file {input}"))?;
        let meta = file.metadata().with_context(|| format!("cannot read the input file {input}"))?;
        if meta.is_dir() {
            bail!("the input {input} is a directory, not a file of JSON lines");
        }
        (Box::new(std::io::BufReader::new(file)), Some(meta.len()))
    };
    let mut rejects_out = match rejects {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create the rejects file {}", p.display()))?,
        )),
        None => None,
    };
    let topic = config.kafka.log_topic();
    let producer = if dry_run {
        None
    } else {
        preflight(config).await?;
        let settings = crate::kafka::ClientSettings::from_config(config);
        let t = topic.clone();
        let s = settings.clone();
        tokio::task::spawn_blocking(move || log_topic_partitions(&s, &t))
            .await?
            .with_context(|| format!("the log topic {topic} is not usable (create it with `sluice init`)"))?;
        Some(Producer::new(&settings, &[])?)
    };
    let mut report = ProduceReport { topic: topic.clone(), dry_run, ..ProduceReport::default() };
    let mut progress = Progress::new(total_bytes);
    let mut bytes = 0u64;
    let mut pending: Vec<(usize, String, Vec<u8>)> = Vec::new();
    let mut undelivered: Vec<(usize, String)> = Vec::new();
    let mut first_invalid: Option<(usize, String)> = None;
    for (i, raw) in reader.split(b'\n').enumerate() {
        let n = i + 1;
        let mut raw = raw.with_context(|| format!("cannot read line {n} of {input}"))?;
        bytes += raw.len() as u64 + 1;
        if raw.last() == Some(&b'\r') {
            raw.pop();
        }
        // A line that is not UTF-8 is an invalid line like any other (set aside with --rejects).
        let (line, utf8) = match String::from_utf8(raw) {
            Ok(l) => (l, true),
            Err(e) => (String::from_utf8_lossy(e.as_bytes()).into_owned(), false),
        };
        if line.trim().is_empty() {
            continue;
        }
        report.lines += 1;
        let parsed = if utf8 { jsonl::parse_line(&line) } else { Err("the line is not valid UTF-8".to_string()) };
        let rec = match parsed.and_then(|r| validate(&r, &config.limits).map(|_| r).map_err(|e| e.to_string())) {
            Ok(r) => r,
            Err(reason) => {
                report.rejected += 1;
                match rejects_out.as_mut() {
                    Some(w) => {
                        serde_json::to_writer(&mut *w, &json!({"line": n, "reason": reason, "text": line}))?;
                        w.write_all(b"\n").context("cannot write the rejects file")?;
                        continue;
                    }
                    None => {
                        first_invalid = Some((n, reason));
                        break;
                    }
                }
            }
        };
        report.valid += 1;
        if producer.is_some() {
            let payload = encode_framed(config.kafka.framing, config.writer_schema_id(), &rec);
            pending.push((n, rec.collection_id, payload));
        }
        if let (Some(p), true) = (&producer, pending.len() >= PRODUCE_CHUNK) {
            let (bad, ok) = deliver(p, &topic, std::mem::take(&mut pending)).await;
            undelivered.extend(bad);
            report.delivered += ok;
        }
        progress.update(bytes, &report);
    }
    if let Some(p) = &producer {
        let (bad, ok) = deliver(p, &topic, pending).await;
        undelivered.extend(bad);
        report.delivered += ok;
    }
    progress.finish();
    if let Some(mut w) = rejects_out {
        w.flush().context("cannot write the rejects file")?;
    }
    for (n, e) in undelivered.iter().take(20) {
        eprintln!("line {n}: not delivered: {e}");
    }
    if let Some((n, reason)) = first_invalid {
        bail!(
            "line {n} of {input} is invalid: {reason}; stopped there ({} records before it delivered; \
             use --rejects FILE to set invalid lines aside and go on)",
            report.delivered
        );
    }
    if !undelivered.is_empty() {
        let lines: Vec<String> = undelivered.iter().map(|(n, _)| n.to_string()).take(100).collect();
        bail!(
            "{} lines not delivered to {topic} (line numbers: {}{})",
            undelivered.len(),
            lines.join(","),
            if undelivered.len() > 100 { ",..." } else { "" }
        );
    }
    output::one(format, &report, || {
        let rejected = match rejects {
            Some(p) if report.rejected > 0 => format!("; {} invalid lines written to {}", report.rejected, p.display()),
            _ => String::new(),
        };
        if dry_run {
            format!("dry run: {} valid records of {} lines, nothing produced{rejected}", report.valid, report.lines)
        } else {
            format!("delivered {} records to {topic}{rejected}", report.delivered)
        }
    })
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

/// Records stream page by page in json (one array) and jsonl; the table is built whole.
pub async fn records(config: &Config, collection: &str, format: Format) -> Result<()> {
    let sysdb = open_sysdb_read(config).await?;
    if sysdb.collection(collection).await?.is_none() {
        bail!("collection {collection:?} is not known to the sysdb (see `sluice collections list`)");
    }
    let mut out = Out::new();
    let mut table = output::table(&["ID", "EMBEDDING", "METADATA", "DOCUMENT"]);
    let mut after: Option<String> = None;
    let mut first = true;
    if format == Format::Json {
        out.line("[")?;
    }
    loop {
        let page = sysdb.list_records(collection, after.as_deref(), 1000).await?;
        for r in &page {
            let v = jsonl::record_to_json(r);
            match format {
                Format::Jsonl => out.json_line(&v)?,
                Format::Json => {
                    if !first {
                        out.line(",")?;
                    }
                    serde_json::to_writer(out.writer(), &v)?;
                }
                Format::Table => {
                    let emb =
                        r.embedding.as_ref().map(|e| format!("[{} floats]", e.len())).unwrap_or_else(|| "-".into());
                    let md = if r.metadata.is_empty() { "-".to_string() } else { v["metadata"].to_string() };
                    let doc = r.document.clone().unwrap_or_else(|| "-".into()).replace(['\n', '\r', '\t'], " ");
                    table.add_row(vec![r.id.clone(), emb, md, doc]);
                }
            }
            first = false;
        }
        match page.last() {
            Some(l) if page.len() == 1000 => after = Some(l.id.clone()),
            _ => break,
        }
    }
    match format {
        Format::Json => out.line(if first { "]" } else { "\n]" })?,
        Format::Table => out.line(table.trim_fmt())?,
        Format::Jsonl => {}
    }
    out.flush()?;
    Ok(())
}

#[derive(Serialize)]
struct CollectionView<'a> {
    id: &'a str,
    partition: i32,
    log_position: i64,
    records: i64,
    dimension: Option<u32>,
}

pub async fn collections(config: &Config, cmd: CollectionsCmd) -> Result<()> {
    let CollectionsCmd::List { format } = cmd;
    let sysdb = open_sysdb_read(config).await?;
    let rows = sysdb.collections().await?;
    let views: Vec<CollectionView<'_>> = rows
        .iter()
        .map(|r| CollectionView {
            id: &r.id,
            partition: r.partition,
            log_position: r.log_position,
            records: r.record_count,
            dimension: r.dimension,
        })
        .collect();
    output::rows(format.format, &views, |views| {
        let mut t = output::table(&["COLLECTION", "PARTITION", "LOG_POSITION", "RECORDS", "DIMENSION"]);
        for v in views {
            t.add_row(vec![
                v.id.to_string(),
                v.partition.to_string(),
                v.log_position.to_string(),
                v.records.to_string(),
                v.dimension.map(|d| d.to_string()).unwrap_or_else(|| "-".into()),
            ]);
        }
        t
    })
}

pub use crate::offsets::{offset_rows, partition_status, OffsetRow};

pub async fn offsets(config: &Config, cmd: OffsetsCmd) -> Result<()> {
    let topic = config.kafka.log_topic();
    match cmd {
        OffsetsCmd::Show { format } => {
            let sysdb = open_sysdb_read(config).await?;
            let rows = offset_rows(config, &sysdb).await?;
            output::rows(format.format, &rows, |rows| {
                let mut t =
                    output::table(&["TOPIC", "PARTITION", "SYSDB_NEXT", "GROUP", "HIGH_WATERMARK", "LAG", "STATUS"]);
                let o = |v: Option<i64>| v.map(|v| v.to_string()).unwrap_or_else(|| "-".into());
                for r in rows {
                    // A reason is one line in the table (the JSON keeps it whole).
                    t.add_row(vec![
                        r.topic.clone(),
                        r.partition.to_string(),
                        o(r.sysdb_next_offset),
                        o(r.group_offset),
                        r.high_watermark.to_string(),
                        r.lag.to_string(),
                        r.status.replace(['\n', '\r'], " "),
                    ]);
                }
                t
            })?;
        }
        OffsetsCmd::Reconcile { format } => {
            let sysdb = open_sysdb_read(config).await?;
            let positions: Vec<(i32, i64)> = sysdb.positions(&topic).await?.into_iter().collect();
            let settings = crate::kafka::ClientSettings::from_config(config);
            let group = config.kafka.group.clone();
            let t = topic.clone();
            let n = positions.len();
            let pushed = positions.clone();
            tokio::task::spawn_blocking(move || {
                MetadataClient::new(&settings, Some(&group))?.commit_group_offsets(&t, &positions)
            })
            .await??;
            let v = json!({
                "group": config.kafka.group,
                "topic": topic,
                "positions": pushed.iter().map(|(p, o)| json!({"partition": p, "next_offset": o})).collect::<Vec<_>>(),
            });
            output::one(format.format, &v, || format!("pushed {n} sysdb positions into group {}", config.kafka.group))?;
        }
        other => {
            // A reset writes (and may migrate); history and wait only read.
            let sysdb = match &other {
                OffsetsCmd::Reset(_) => open_sysdb(config).await?,
                _ => open_sysdb_read(config).await?,
            };
            return super::offsets_cmd::run(config, &sysdb, other).await;
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
            for b in e.as_le_bytes() {
                let _ = write!(line, "{b:02x}");
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

pub async fn checksum(config: &Config, format: Format) -> Result<()> {
    use sha2::{Digest, Sha256};
    let sysdb = open_sysdb_read(config).await?;
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
    // The table form is the fixed line scripts compare.
    output::one(format, &json!({"records": n, "sha256": hex}), || format!("records={n} sha256={hex}"))
}

/// `sluice config show`: every key of the effective configuration, from the config types
/// themselves (secrets print as `***`, URLs with their password redacted).
pub fn config_show(config: &Config, format: super::ConfigFormat) -> Result<()> {
    let mut out = Out::new();
    match format {
        super::ConfigFormat::Toml => out.line(config.to_toml_redacted()?.trim_end())?,
        super::ConfigFormat::Json => out.json_doc(&config.redacted())?,
    }
    out.flush()?;
    Ok(())
}

/// `sluice config docs`: the configuration reference (docs/configuration.md).
pub fn config_docs() -> Result<()> {
    let mut out = Out::new();
    write!(out.writer(), "{}", crate::config::docs::render())?;
    out.flush()?;
    Ok(())
}

pub fn workload(spec: &crate::workload::WorkloadSpec) -> Result<()> {
    let mut out = Out::new();
    for r in crate::workload::generate(spec) {
        out.json_line(&jsonl::log_record_to_json(&r))?;
    }
    out.flush()?;
    Ok(())
}

fn functions_table(views: &[crate::backfill::attach::FunctionView]) -> comfy_table::Table {
    let mut t = output::table(&["ID", "COLLECTION", "FUNCTION", "OUTPUT", "STATUS", "MARKER", "BACKFILL"]);
    for v in views {
        t.add_row(vec![
            v.id.clone(),
            v.collection.clone(),
            v.function.clone(),
            v.output.clone(),
            v.status.clone(),
            v.marker_offset.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
            format!("{}/{}", v.backfill_done, v.backfill_total.map(|t| t.to_string()).unwrap_or_else(|| "?".into())),
        ]);
    }
    t
}

/// `functions list --watch`: read the functions and redraw their table every second until
/// Ctrl-C (exit 0). On a terminal the screen is cleared before each table; otherwise the
/// tables follow one another, each after a `refreshed at` line.
async fn watch_functions(sysdb: &Sysdb, collection: Option<&str>) -> Result<()> {
    use std::io::IsTerminal;
    let stop = tokio::signal::ctrl_c();
    tokio::pin!(stop);
    let clear = std::io::stdout().is_terminal();
    loop {
        let rows = tokio::select! {
            rows = sysdb.functions(collection) => rows?,
            _ = &mut stop => return Ok(()),
        };
        let views: Vec<crate::backfill::attach::FunctionView> = rows.iter().map(Into::into).collect();
        let mut out = Out::new();
        if clear {
            out.line("\x1b[2J\x1b[H")?;
        }
        let secs = crate::sysdb::now_ms() / 1000;
        out.line(format_args!(
            "refreshed at {:02}:{:02}:{:02} UTC, every 1 s (Ctrl-C to stop)",
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60
        ))?;
        out.line(functions_table(&views).trim_fmt())?;
        out.flush()?;
        tokio::select! {
            _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
            _ = &mut stop => return Ok(()),
        }
    }
}

pub async fn functions(config: &Config, cmd: super::FunctionsCmd) -> Result<()> {
    use super::FunctionsCmd;
    match cmd {
        FunctionsCmd::Attach { collection, function, output: out_collection, param, format } => {
            let sysdb = open_sysdb(config).await?;
            let mut params = std::collections::BTreeMap::new();
            for p in param {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p:?} must be KEY=VALUE"))?;
                params.insert(k.to_string(), v.to_string());
            }
            // Publishing fails fast when the broker is down (the relay retries later).
            let producer =
                Producer::new(&crate::kafka::ClientSettings::from_config(config), &[("message.timeout.ms", "10000")])?;
            let attached = crate::backfill::attach::attach(
                config,
                &sysdb,
                &producer,
                &collection,
                &function,
                &out_collection,
                params,
            )
            .await?;
            output::one(format.format, &attached, || {
                format!(
                    "attached function {} ({function} on {collection} -> {out_collection}): status {}, marker {}",
                    attached.function_id, attached.status, attached.marker
                )
            })?;
        }
        FunctionsCmd::List { collection, watch, format } => {
            let sysdb = open_sysdb_read(config).await?;
            if watch {
                if format.format != Format::Table {
                    bail!("--watch redraws a table: it cannot be combined with --format json or jsonl");
                }
                return watch_functions(&sysdb, collection.as_deref()).await;
            }
            let rows = sysdb.functions(collection.as_deref()).await?;
            let views: Vec<crate::backfill::attach::FunctionView> = rows.iter().map(Into::into).collect();
            output::rows(format.format, &views, functions_table)?;
        }
        FunctionsCmd::Detach { function_id, drop_output, format } => {
            let sysdb = open_sysdb(config).await?;
            match sysdb.detach_function(&function_id, drop_output).await? {
                Some(row) => {
                    let v = json!({
                        "function_id": row.id,
                        "function": row.function,
                        "collection": row.collection_id,
                        "output": row.output_collection,
                        "output_dropped": drop_output,
                    });
                    output::one(format.format, &v, || {
                        format!(
                            "detached function {} ({} on {} -> {}){}",
                            row.id,
                            row.function,
                            row.collection_id,
                            row.output_collection,
                            if drop_output { "; output collection dropped" } else { "" }
                        )
                    })?;
                }
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
            embedding: Some(vec![1.0, -0.5].into()),
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
