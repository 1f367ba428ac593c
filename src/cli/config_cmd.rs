//! `sluice config show | docs`.

use std::io::Write;

use anyhow::Result;

use super::output::Out;
use crate::config::Config;

/// `sluice config show`: every key of the effective configuration, from the config types
/// themselves (secrets print as `***`, URLs with their password redacted).
pub fn show(config: &Config, format: super::ConfigFormat) -> Result<()> {
    let mut out = Out::new();
    match format {
        super::ConfigFormat::Toml => out.line(config.to_toml_redacted()?.trim_end())?,
        super::ConfigFormat::Json => out.json_doc(&config.redacted())?,
    }
    out.flush()?;
    Ok(())
}

/// `sluice config docs`: the configuration reference (docs/configuration.md).
pub fn docs() -> Result<()> {
    let mut out = Out::new();
    write!(out.writer(), "{}", crate::config::docs::render())?;
    out.flush()?;
    Ok(())
}
