//! `sluice workload`: a deterministic synthetic workload as JSON lines.

use anyhow::Result;

use super::jsonl;
use super::output::Out;

pub fn run(spec: &crate::workload::WorkloadSpec) -> Result<()> {
    let mut out = Out::new();
    for r in crate::workload::generate(spec) {
        out.json_line(&jsonl::log_record_to_json(&r))?;
    }
    out.flush()?;
    Ok(())
}
