//! `sluice schema check FILE.avsc` and `sluice schema show`: the log record schema's
//! versions in the schema registry, and whether a new version may be registered.

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::output;
use super::SchemaCmd;
use crate::config::Config;
use crate::record::avro::WriterDecoder;
use crate::schema_registry::{log_subject, retrying, SchemaRegistry};

fn registry(config: &Config) -> Result<SchemaRegistry> {
    SchemaRegistry::from_config(&config.schema_registry)?
        .context("no schema registry configured: set [schema_registry] url or SLUICE_SCHEMA_REGISTRY_URL")
}

pub async fn run(config: &Config, cmd: SchemaCmd) -> Result<()> {
    let registry = registry(config)?;
    let subject = log_subject(config);
    match cmd {
        SchemaCmd::Check { file, latest, format } => {
            let text = std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?;
            let schema = apache_avro::Schema::parse_str(&text)
                .with_context(|| format!("{} is not a valid Avro schema", file.display()))?;
            let c = retrying(3, || registry.check_compatibility(&subject, &text, !latest)).await?;
            let against = if latest { "the latest version" } else { "every version" };
            // The registry's rule (BACKWARD: the new schema reads the old data) does not
            // say that Sluice, reading with `log_record.avsc`, can read data written with
            // the new schema (a removed `operation` passes BACKWARD): check that here.
            let sluice_reads = match WriterDecoder::for_writer(schema) {
                WriterDecoder::Incompatible(why) => Err(why),
                _ => Ok(()),
            };
            let v = json!({
                "file": file.display().to_string(),
                "subject": subject,
                "against": against,
                "compatible": c.is_compatible,
                "messages": c.messages,
                "sluice_reads": sluice_reads.is_ok(),
                "sluice_reads_error": sluice_reads.as_ref().err(),
            });
            output::one(format.format, &v, || {
                let mut s = format!(
                    "{}: {} with {against} of {subject}",
                    file.display(),
                    if c.is_compatible { "compatible" } else { "NOT compatible" }
                );
                for m in &c.messages {
                    s.push_str(&format!("\n  {m}"));
                }
                match &sluice_reads {
                    Ok(()) => s.push_str(&format!(
                        "\n{}: Sluice reads data written with it as sluice.v1.LogRecord",
                        file.display()
                    )),
                    Err(why) => {
                        s.push_str(&format!("\n{}: Sluice CANNOT read data written with it: {why}", file.display()))
                    }
                }
                s
            })?;
            if !c.is_compatible {
                bail!("{} would be refused by the registry's compatibility rule for {subject}", file.display())
            }
            if sluice_reads.is_err() {
                bail!("records written with {} would go to the DLQ (incompatible_schema)", file.display())
            }
            Ok(())
        }
        SchemaCmd::Show { format } => {
            let versions = retrying(3, || registry.versions(&subject)).await?;
            let mut rows = Vec::with_capacity(versions.len());
            for v in versions {
                let r = retrying(3, || registry.version(&subject, v)).await?;
                let fp = apache_avro::Schema::parse_str(&r.schema)
                    .map(|s| format!("{:016x}", crate::record::avro::rabin_fingerprint(&s)))
                    .unwrap_or_else(|_| "unparsable".into());
                rows.push(json!({"subject": subject, "version": r.version, "id": r.id, "fingerprint": fp, "schema": r.schema}));
            }
            let url = registry.url().to_string();
            output::listing(format.format, &rows, |rows| {
                let mut s = format!("subject {subject} at {url}\n");
                if rows.is_empty() {
                    s.push_str("  no versions\n");
                }
                for r in rows {
                    s.push_str(&format!(
                        "  version {:>3}  id {:>5}  fingerprint {}\n",
                        r["version"],
                        r["id"],
                        r["fingerprint"].as_str().unwrap_or("")
                    ));
                }
                s
            })
        }
    }
}
