//! `sluice functions attach | detach | list | show`.

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::context::{open_sysdb, open_sysdb_read};
use super::output::{self, Format, Out};
use crate::config::Config;
use crate::kafka::producer::Producer;
use crate::sysdb::Sysdb;

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

pub async fn run(config: &Config, cmd: super::FunctionsCmd) -> Result<()> {
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
