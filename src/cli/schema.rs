//! `sluice schema check FILE.avsc` and `sluice schema show`: the log record schema's
//! versions in the schema registry, and whether a new version may be registered.

use anyhow::{bail, Context, Result};
use serde_json::json;

use super::{Format, SchemaCmd};
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
        SchemaCmd::Check { file, latest } => {
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
            if c.is_compatible {
                println!("{}: compatible with {against} of {subject}", file.display());
                for m in &c.messages {
                    println!("  {m}");
                }
            } else {
                eprintln!("{}: NOT compatible with {against} of {subject}", file.display());
                for m in &c.messages {
                    eprintln!("  {m}");
                }
            }
            match &sluice_reads {
                Ok(()) => println!("{}: Sluice reads data written with it as sluice.v1.LogRecord", file.display()),
                Err(why) => eprintln!("{}: Sluice CANNOT read data written with it: {why}", file.display()),
            }
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
                rows.push(retrying(3, || registry.version(&subject, v)).await?);
            }
            match format {
                Format::Human => {
                    println!("subject {subject} at {}", registry.url());
                    if rows.is_empty() {
                        println!("  no versions");
                    }
                    for r in &rows {
                        let fp = apache_avro::Schema::parse_str(&r.schema)
                            .map(|s| format!("{:016x}", crate::record::avro::rabin_fingerprint(&s)))
                            .unwrap_or_else(|_| "unparsable".into());
                        println!("  version {:>3}  id {:>5}  fingerprint {fp}", r.version, r.id);
                    }
                }
                Format::Json | Format::Jsonl => {
                    let list: Vec<_> =
                        rows.iter().map(|r| json!({"version": r.version, "id": r.id, "schema": r.schema})).collect();
                    println!("{}", serde_json::to_string(&json!({"subject": subject, "versions": list}))?);
                }
            }
            Ok(())
        }
    }
}
