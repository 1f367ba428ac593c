//! `sluice produce`: JSON lines to Avro log records, each to its collection's partition.

use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::json;

use super::context::preflight;
use super::jsonl;
use super::output::{self, Format};
use crate::config::Config;
use crate::kafka::cluster::MetadataClient;
use crate::kafka::producer::{Outgoing, Producer};
use crate::record::framing::encode_framed;
use crate::record::partitioner::partition_for;
use crate::record::validate::validate;

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
    /// The read token of the delivered records (`sluice records --at-least`); absent on a
    /// dry run.
    #[serde(skip_serializing_if = "Option::is_none")]
    token: Option<String>,
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
        let settings = config.client_settings();
        let t = topic.clone();
        let s = settings.clone();
        tokio::task::spawn_blocking(move || log_topic_partitions(&s, &t))
            .await?
            .with_context(|| format!("the log topic {topic} is not usable (create it with `sluice init`)"))?;
        Some(Producer::new(&settings, &[])?)
    };
    let tokens = crate::reading::TokenSource::new(config.client_settings(), topic.clone());
    let mut acked: std::collections::HashMap<i32, i64> = std::collections::HashMap::new();
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
            let (bad, ok) = deliver(p, &topic, std::mem::take(&mut pending), &mut acked).await;
            undelivered.extend(bad);
            report.delivered += ok;
        }
        progress.update(bytes, &report);
    }
    if let Some(p) = &producer {
        let (bad, ok) = deliver(p, &topic, pending, &mut acked).await;
        undelivered.extend(bad);
        report.delivered += ok;
        report.token = Some(tokens.token_of(acked).await?.to_string());
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
            format!(
                "delivered {} records to {topic}{rejected}\ntoken: {}",
                report.delivered,
                report.token.as_deref().unwrap_or_default()
            )
        }
    })
}

/// Produce `(line number, key, payload)` items; returns the failed lines and the count
/// delivered, and raises `acked` (partition -> highest offset acknowledged).
async fn deliver(
    producer: &Producer,
    topic: &str,
    pending: Vec<(usize, String, Vec<u8>)>,
    acked: &mut std::collections::HashMap<i32, i64>,
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
            Ok(d) => {
                ok += 1;
                let e = acked.entry(d.partition).or_insert(d.offset);
                *e = (*e).max(d.offset);
            }
            Err(e) => bad.push((*line, e.to_string())),
        }
    }
    (bad, ok)
}

/// Keep `partition_for` reachable from the CLI for scripts (`sluice` prints nothing here).
pub fn partition_of(collection: &str, partitions: u32) -> u32 {
    partition_for(collection.as_bytes(), partitions)
}
