//! What every command needs first: the sysdb (opened to write, or only to read) and a
//! preflight of the broker connection.

use anyhow::{Context, Result};

use crate::config::Config;
use crate::sysdb::{redact_url, Sysdb};

/// Open the sysdb for a command that writes (init, attach, detach, reset): creates and
/// migrates it as needed.
pub(super) async fn open_sysdb(config: &Config) -> Result<Sysdb> {
    Sysdb::open_with(&config.sysdb.url, &config.sqlite)
        .await
        .with_context(|| format!("cannot open the sysdb at {}", redact_url(&config.sysdb.url)))
}

/// Open the sysdb for a command that only reads: never creates or migrates it. A missing
/// or older sysdb is an error that says to run `sluice init`.
pub(super) async fn open_sysdb_read(config: &Config) -> Result<Sysdb> {
    Sysdb::open_existing(&config.sysdb.url)
        .await
        .with_context(|| format!("cannot open the sysdb at {}", redact_url(&config.sysdb.url)))
}

/// Fail fast (wrong credentials, untrusted certificate, broker down) before a command
/// starts clients that would otherwise retry silently. See `kafka::preflight`.
pub(super) async fn preflight(config: &Config) -> Result<()> {
    let settings = config.client_settings();
    let timeout = settings.timeout().max(std::time::Duration::from_secs(1));
    tokio::task::spawn_blocking(move || crate::kafka::preflight::check_connection(&settings, timeout)).await??;
    Ok(())
}

/// Wait, before a read, until the sysdb covers what `read` asks for (nothing to wait for
/// without `--at-least` or `--read-level latest`). `partitions`: the partitions the read
/// touches, for `latest` (`None` = all).
pub(super) async fn wait_for_read(
    config: &Config,
    sysdb: &Sysdb,
    read: &super::ReadArgs,
    partitions: Option<Vec<i32>>,
) -> Result<crate::reading::Covered> {
    let wish = read.wish();
    if wish.is_plain() {
        return Ok(crate::reading::Covered { waited: std::time::Duration::ZERO, token: None });
    }
    let tokens = crate::reading::TokenSource::new(config.client_settings(), config.kafka.log_topic());
    Ok(crate::reading::wait_for(sysdb, &tokens, &wish, partitions, None).await?)
}
