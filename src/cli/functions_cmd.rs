//! `sluice functions attach | detach | list | show | test`.

use std::collections::BTreeMap;

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::context::{open_sysdb, open_sysdb_read};
use super::output::{self, Format, Out};
use crate::config::Config;
use crate::functions::{wasm, ChangeRef, Function, OutputDelta};
use crate::kafka::producer::Producer;
use crate::record::jsonl::{meta_to_json, parse_line, record_to_json};
use crate::record::{LogRecord, MetaValue, Record};
use crate::sysdb::Sysdb;

fn functions_table(views: &[crate::backfill::attach::FunctionView]) -> comfy_table::Table {
    let failed = views.iter().any(|v| v.failed_reason.is_some());
    let mut header = vec!["ID", "COLLECTION", "FUNCTION", "OUTPUT", "STATUS", "MARKER", "BACKFILL"];
    if failed {
        header.push("FAILED");
    }
    let mut t = output::table(&header);
    for v in views {
        let mut row = vec![
            v.id.clone(),
            v.collection.clone(),
            v.function.clone(),
            v.output.clone(),
            v.status.clone(),
            v.marker_offset.map(|o| o.to_string()).unwrap_or_else(|| "-".into()),
            format!("{}/{}", v.backfill_done, v.backfill_total.map(|t| t.to_string()).unwrap_or_else(|| "?".into())),
        ];
        if failed {
            row.push(v.failed_reason.clone().unwrap_or_default());
        }
        t.add_row(row);
    }
    t
}

/// The process's WebAssembly host with the `[wasm]` settings; `local`: a command
/// without a sysdb keeps compiled components in the temporary directory unless
/// `wasm.cache_dir` says otherwise.
fn configure_host(config: &Config, local: bool) -> Result<()> {
    let (limits, mut dir) = config.wasm_host();
    if local && config.wasm.cache_dir.is_empty() {
        dir = wasm::default_cache_dir(None);
    }
    wasm::Host::configure(limits, Some(dir)).context("cannot start the WebAssembly host")?;
    Ok(())
}

/// `--params`: JSON text, `{}` when missing.
fn init_params(params: Option<String>) -> Result<String> {
    let text = params.unwrap_or_else(|| "{}".into());
    serde_json::from_str::<serde_json::Value>(&text).with_context(|| format!("--params {text:?} is not JSON"))?;
    Ok(text)
}

/// An output collection as `functions test` folds the deltas into it: counters and
/// records, the last write winning (the live path of a `ready` function).
#[derive(Default)]
struct TestOutput {
    counters: BTreeMap<String, i64>,
    records: BTreeMap<String, Record>,
}

impl TestOutput {
    fn apply(&mut self, deltas: &[OutputDelta]) {
        for d in deltas {
            match d {
                OutputDelta::Count { output_id, fields, count_field, delta, remove_at_zero } => {
                    let count = self.counters.get(output_id).copied().unwrap_or(0) + delta;
                    if count == 0 && *remove_at_zero {
                        self.counters.remove(output_id);
                        self.records.remove(output_id);
                    } else {
                        self.counters.insert(output_id.clone(), count);
                        let mut metadata = fields.clone();
                        metadata.insert(count_field.to_string(), MetaValue::Long(count));
                        let record =
                            Record { id: output_id.clone(), embedding: None, metadata, document: None, offset: -1 };
                        self.records.insert(output_id.clone(), record);
                    }
                }
                OutputDelta::Put { record } => {
                    self.records.insert(record.id.clone(), record.clone());
                }
                OutputDelta::Remove { id, .. } => {
                    self.records.remove(id);
                }
            }
        }
    }
}

fn delta_json(d: &OutputDelta) -> serde_json::Value {
    match d {
        OutputDelta::Count { output_id, fields, count_field, delta, remove_at_zero } => json!({
            "count": {
                "output_id": output_id,
                "fields": fields.iter().map(|(k, v)| (k.clone(), meta_to_json(v))).collect::<serde_json::Map<_, _>>(),
                "count_field": count_field,
                "delta": delta,
                "remove_at_zero": remove_at_zero,
            }
        }),
        OutputDelta::Put { record } => json!({"put": record_to_json(record)}),
        OutputDelta::Remove { id, offset } => json!({"remove": {"id": id, "offset": offset}}),
    }
}

/// `functions test`: the component over the records of `input`.
fn test_component(
    file: &std::path::Path,
    input: &std::path::Path,
    params: String,
    only: Option<&str>,
    format: Format,
) -> Result<()> {
    use std::io::BufRead;

    let host = wasm::Host::global().context("cannot start the WebAssembly host")?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let inspected = host.inspect(&bytes).with_context(|| format!("{} is refused", file.display()))?;
    let f = host
        .instantiate(&inspected.sha256, &inspected.component, &params)
        .with_context(|| format!("{} cannot run", file.display()))?;
    let reader: Box<dyn BufRead> = if input.as_os_str() == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(
            std::fs::File::open(input).with_context(|| format!("cannot open {}", input.display()))?,
        ))
    };
    let mut by_collection: BTreeMap<String, Vec<(i64, LogRecord)>> = BTreeMap::new();
    for (n, line) in reader.lines().enumerate() {
        let line = line.with_context(|| format!("cannot read {}", input.display()))?;
        if line.trim().is_empty() {
            continue;
        }
        let record = parse_line(&line).map_err(|e| anyhow::anyhow!("{} line {}: {e}", input.display(), n + 1))?;
        if only.is_some_and(|c| c != record.collection_id) {
            continue;
        }
        by_collection.entry(record.collection_id.clone()).or_default().push((n as i64, record));
    }
    let mut deltas_out = Vec::new();
    let mut outputs = BTreeMap::new();
    let mut failure = None;
    'collections: for (collection, records) in &by_collection {
        let folded = crate::materialize::fold_batch(
            &BTreeMap::<String, Record>::new(),
            None,
            records.iter().map(|(o, r)| (*o, r)),
        )
        .map_err(|e| anyhow::anyhow!("collection {collection:?}: {e}"))?;
        let mut out = TestOutput::default();
        for c in &folded.changes {
            let mut deltas = Vec::new();
            let change = ChangeRef { id: &c.id, before: c.before.as_ref(), after: c.after.as_ref(), offset: c.offset };
            if let Err(e) = f.try_deltas(&change, &mut deltas) {
                failure = Some(
                    json!({"collection": collection, "offset": c.offset, "id": c.id, "kind": e.kind.as_str(), "reason": e.reason}),
                );
                outputs.insert(collection.clone(), out);
                break 'collections;
            }
            out.apply(&deltas);
            for d in &deltas {
                deltas_out.push((collection.clone(), c.offset, c.id.clone(), d.clone()));
            }
        }
        outputs.insert(collection.clone(), out);
    }
    let deltas_json: Vec<serde_json::Value> = deltas_out
        .iter()
        .map(|(c, o, id, d)| json!({"collection": c, "offset": o, "id": id, "delta": delta_json(d)}))
        .collect();
    let outputs_json: Vec<serde_json::Value> = outputs
        .iter()
        .flat_map(|(c, out)| {
            out.records.values().map(move |r| {
                let mut v = record_to_json(r);
                v["input_collection"] = json!(c);
                v
            })
        })
        .collect();
    let mut o = Out::new();
    match format {
        Format::Json => o.json_doc(&json!({
            "component": inspected.sha256,
            "deltas": deltas_json,
            "outputs": outputs_json,
            "failure": failure,
        }))?,
        Format::Jsonl => {
            for d in &deltas_json {
                o.json_line(&json!({"delta": d}))?;
            }
            for r in &outputs_json {
                o.json_line(&json!({"output": r}))?;
            }
            if let Some(f) = &failure {
                o.json_line(&json!({"failure": f}))?;
            }
        }
        Format::Table => {
            o.line(format_args!("component {}: {} deltas", inspected.sha256, deltas_json.len()))?;
            let mut t = output::table(&["COLLECTION", "OFFSET", "ID", "DELTA"]);
            for (c, offset, id, d) in &deltas_out {
                t.add_row(vec![c.clone(), offset.to_string(), id.clone(), delta_json(d).to_string()]);
            }
            o.line(t.trim_fmt())?;
            o.line("output records:")?;
            let mut t = output::table(&["INPUT", "ID", "METADATA", "DOCUMENT", "EMBEDDING"]);
            for (c, out) in &outputs {
                for r in out.records.values() {
                    let v = record_to_json(r);
                    t.add_row(vec![
                        c.clone(),
                        r.id.clone(),
                        v["metadata"].to_string(),
                        r.document.clone().unwrap_or_default(),
                        r.embedding.as_ref().map_or_else(String::new, |e| format!("{} dims", e.len())),
                    ]);
                }
            }
            o.line(t.trim_fmt())?;
        }
    }
    o.flush()?;
    if let Some(f) = failure {
        bail!(
            "the function failed on record {} (offset {}): {}",
            f["id"].as_str().unwrap_or_default(),
            f["offset"],
            f["reason"].as_str().unwrap_or_default()
        );
    }
    Ok(())
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

pub async fn run(config: &Config, cmd: super::FunctionsCmd) -> Result<()> {
    use super::FunctionsCmd;
    match cmd {
        FunctionsCmd::Attach { collection, function, wasm, output: out_collection, param, params: init, format } => {
            let sysdb = open_sysdb(config).await?;
            let mut params = std::collections::BTreeMap::new();
            for p in param {
                let (k, v) = p.split_once('=').with_context(|| format!("--param {p:?} must be KEY=VALUE"))?;
                params.insert(k.to_string(), v.to_string());
            }
            let function = match (function, wasm) {
                (Some(f), None) => f,
                (None, Some(file)) => {
                    configure_host(config, false)?;
                    let init = init_params(init)?;
                    let bytes = std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
                    let stored = crate::backfill::components::store_component(&sysdb, bytes)
                        .await
                        .with_context(|| format!("{} cannot be attached", file.display()))?;
                    eprintln!(
                        "component {} ({} bytes, sluice:function/guest@{}) {} the sysdb",
                        stored.sha256,
                        stored.size,
                        stored.world_version,
                        if stored.new { "stored in" } else { "already in" }
                    );
                    params.insert(wasm::PARAM_SHA256.to_string(), stored.sha256);
                    params.insert(wasm::PARAM_PARAMS.to_string(), init);
                    wasm::NAME.to_string()
                }
                _ => bail!("give either --function NAME or --wasm FILE.wasm"),
            };
            // Publishing fails fast when the broker is down (the relay retries later).
            let producer = Producer::new(&config.client_settings(), &[("message.timeout.ms", "10000")])?;
            let attached = crate::backfill::attach::attach(
                config,
                &sysdb,
                &producer,
                crate::backfill::attach::AttachSpec {
                    collection: &collection,
                    function: &function,
                    output: &out_collection,
                    params,
                },
                &crate::reading::TokenSource::new(config.client_settings(), config.kafka.log_topic()),
            )
            .await?;
            output::one(format.format, &attached, || {
                let token = attached.token.as_deref().map(|t| format!("\ntoken: {t}")).unwrap_or_default();
                format!(
                    "attached function {} ({function} on {collection} -> {out_collection}): status {}, marker {}{token}",
                    attached.function_id, attached.status, attached.marker
                )
            })?;
        }
        FunctionsCmd::Show { function_id, format } => {
            let sysdb = open_sysdb_read(config).await?;
            let Some(row) = sysdb.function(&function_id).await? else {
                bail!("no function with id {function_id:?} (see `sluice functions list`)")
            };
            let mut v = json!(crate::backfill::attach::FunctionView::from(&row));
            v["params"] = json!(row.params);
            v["created_at_ms"] = json!(row.created_at_ms);
            v["updated_at_ms"] = json!(row.updated_at_ms);
            output::one(format.format, &v, || {
                let mut text = format!(
                    "function {} ({} on {} -> {})\nstatus: {}",
                    row.id,
                    row.function,
                    row.collection_id,
                    row.output_collection,
                    row.status.as_str()
                );
                if let Some(reason) = &row.failed_reason {
                    text.push_str(&format!("\nfailed: {reason}"));
                }
                text.push_str(&format!(
                    "\nmarker offset: {}\nbackfill: {}/{}\nparams: {}",
                    row.marker_offset.map_or_else(|| "-".into(), |o| o.to_string()),
                    row.backfill_done,
                    row.backfill_total.map_or_else(|| "?".into(), |t| t.to_string()),
                    json!(row.params)
                ));
                text
            })?;
        }
        FunctionsCmd::Test { file, input, params, collection, format } => {
            configure_host(config, true)?;
            test_component(&file, &input, init_params(params)?, collection.as_deref(), format.format)?;
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
            let detached = crate::sysdb::retry_unavailable(crate::sysdb::OPERATOR_WRITE_BUDGET, "detach", || {
                sysdb.detach_function_feeding(&function_id, drop_output, config.changelog.enabled)
            })
            .await?;
            match detached {
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
