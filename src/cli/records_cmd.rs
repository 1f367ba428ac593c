//! `sluice records` (a collection's records in id order) and `sluice checksum` (the
//! canonical checksum of the materialized state).

use anyhow::{bail, Result};
use serde_json::json;

use super::context::{open_sysdb_read, wait_for_read};
use super::jsonl;
use super::output::{self, Format, Out};
use crate::config::Config;

/// The partition of `collection` (its key's murmur2 hash over the log topic's partition
/// count, as the sysdb recorded it); `None` when the sysdb does not know the count.
async fn partition_of(config: &Config, sysdb: &crate::sysdb::Sysdb, collection: &str) -> Result<Option<Vec<i32>>> {
    let count = sysdb.topic_partitions(&config.kafka.log_topic()).await?;
    Ok(count.map(|n| vec![crate::record::partitioner::partition_for(collection.as_bytes(), n as u32) as i32]))
}

/// Records stream page by page in json (one array) and jsonl; the table is built whole.
/// With a read token (or `--read-level latest`) the read first waits until the sysdb
/// covers it.
pub async fn records(config: &Config, collection: &str, read: &super::ReadArgs, format: Format) -> Result<()> {
    let sysdb = open_sysdb_read(config).await?;
    if !read.wish().is_plain() {
        let partitions = partition_of(config, &sysdb, collection).await?;
        wait_for_read(config, &sysdb, read, partitions).await?;
    }
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

pub async fn checksum(config: &Config, read: &super::ReadArgs, format: Format) -> Result<()> {
    use sha2::{Digest, Sha256};
    let sysdb = open_sysdb_read(config).await?;
    wait_for_read(config, &sysdb, read, None).await?;
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
}
