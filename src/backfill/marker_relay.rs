//! The marker relay, a role of `sluice process`: it publishes the BACKFILL_FN markers the
//! outbox still holds (an attach whose publish failed) until they are acknowledged.
//!
//! Lost markers: a marker the processor passed without starting its function (dead-
//! lettered, skipped in a data-loss gap, passed by `offsets reset`) leaves the function
//! `awaiting_marker` forever. The relay finds those by the offset where each marker was
//! published and publishes them again ([`relay_once`]); it also exports the age of the
//! oldest function still awaiting its marker.

use std::time::Duration;

use tracing::{info, warn};

use super::attach::publish_marker;
use crate::config::{Config, UnknownCollections};
use crate::kafka::producer::Producer;
use crate::sysdb::{Sysdb, SysdbError};

/// How many outbox rows (pending, then lost) one relay pass handles at most.
const RELAY_BATCH: usize = 100;

/// One pass of the outbox relay: publish every pending marker and mark the acknowledged
/// ones sent (with the offset they were written at); then publish again every lost
/// marker (see [`Sysdb::lost_markers`]); then refresh the awaiting-marker gauge. Returns
/// how many markers were published.
pub(crate) async fn relay_once(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<usize, SysdbError> {
    let mut n = 0;
    let mut broker_ok = true;
    for row in sysdb.outbox_pending(RELAY_BATCH).await? {
        match publish_marker(config, producer, &row).await {
            Ok(offset) => {
                // Published but not yet marked sent: a crash here republishes the marker
                // (the processor ignores a duplicate).
                crate::failpoint::hit("after_relay_publish");
                sysdb.mark_outbox_sent(row.id, Some(offset)).await?;
                info!(function = %row.function_id, partition = row.partition, offset, "outbox relay published a pending marker");
                n += 1;
                if let Some(m) = metrics {
                    m.marker_published(true);
                }
            }
            Err(e) => {
                warn!(%e, function = %row.function_id, "outbox relay could not publish a marker; will retry");
                if let Some(m) = metrics {
                    m.marker_published(false);
                }
                broker_ok = false;
                break;
            }
        }
    }
    if broker_ok {
        n += republish_lost(config, sysdb, producer, metrics).await?;
    }
    if let Some(m) = metrics {
        let oldest = sysdb.oldest_awaiting_marker_ms().await?;
        m.set_awaiting_marker_oldest(oldest.map_or(0.0, |t| (crate::sysdb::now_ms() - t).max(0) as f64 / 1000.0));
        // Backfill progress and status per function, from the same sysdb-wide source on
        // every replica (dashboards take the max over replicas).
        let functions = sysdb
            .functions(None)
            .await?
            .into_iter()
            .filter(|f| f.status != crate::functions::FunctionStatus::Detached)
            .map(|f| crate::metrics::FunctionGauge {
                id: f.id,
                collection: f.collection_id,
                status: f.status.as_str(),
                backfill_done: f.backfill_done,
                backfill_total: f.backfill_total,
            })
            .collect();
        m.set_functions(functions);
    }
    Ok(n)
}

/// The relay checks every `relay_interval_ms`: say it once a minute, not every pass.
static NOT_REPUBLISHED_LOG: crate::ratelimit::RateLimiter =
    crate::ratelimit::RateLimiter::new(Duration::from_secs(60), 1);

/// Publish again the markers the processor passed without starting their function.
async fn republish_lost(
    config: &Config,
    sysdb: &Sysdb,
    producer: &Producer,
    metrics: Option<&crate::metrics::Metrics>,
) -> Result<usize, SysdbError> {
    let mut n = 0;
    for row in sysdb.lost_markers(&config.kafka.log_topic(), RELAY_BATCH).await? {
        // Under "reject" a marker of an unregistered collection is dead-lettered again:
        // republishing it would loop. Leave it (the awaiting-marker alert shows it).
        if config.processor.unknown_collections == UnknownCollections::Reject
            && sysdb.collection(&row.collection_id).await?.is_none()
        {
            if let crate::ratelimit::Verdict::Log { suppressed } = NOT_REPUBLISHED_LOG.check("unregistered") {
                warn!(function = %row.function_id, collection = %row.collection_id, suppressed,
                    "lost marker not republished: the collection is not registered and processor.unknown_collections = \"reject\"; detach the function or register the collection");
            }
            continue;
        }
        match publish_marker(config, producer, &row).await {
            Ok(offset) => {
                sysdb.mark_marker_republished(row.id, offset).await?;
                warn!(
                    function = %row.function_id, partition = row.partition, lost_at = ?row.published_offset, offset,
                    "outbox relay republished a lost marker (the partition moved past it while the function was awaiting it)"
                );
                n += 1;
                if let Some(m) = metrics {
                    m.marker_published(true);
                    m.marker_republished();
                }
            }
            Err(e) => {
                warn!(%e, function = %row.function_id, "outbox relay could not republish a lost marker; will retry");
                if let Some(m) = metrics {
                    m.marker_published(false);
                }
                break;
            }
        }
    }
    Ok(n)
}

/// The relay loop (a role of `sluice process`).
pub(crate) async fn relay(
    config: Config,
    sysdb: std::sync::Arc<Sysdb>,
    producer: Producer,
    metrics: std::sync::Arc<crate::metrics::Metrics>,
    stop: tokio_util::sync::CancellationToken,
) {
    let every = Duration::from_millis(config.backfill.relay_interval_ms);
    loop {
        if let Err(e) = relay_once(&config, &sysdb, &producer, Some(&metrics)).await {
            warn!(%e, "outbox relay: sysdb error; will retry");
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.cancelled() => return,
        }
    }
}
