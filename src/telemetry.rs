//! Optional trace export over OTLP (HTTP/protobuf): one trace per batch of `sluice
//! process`. The processor opens a `batch` root span per batch (topic, partition, from,
//! to, records, outcome) with the children `fetch_wait`, `decode`, `fold`, `dlq`, `commit`
//! and `group_commit_request`; the children are debug-level spans, so with the export off
//! (no endpoint: the default) they are disabled at their call sites and the subscriber is
//! the plain log subscriber. With the export on, a `tracing-opentelemetry` layer turns
//! the processor's spans (and warnings inside them, as span events) into OpenTelemetry
//! spans; the SDK's batch processor exports them from its own thread, and
//! [`Telemetry::shutdown`] flushes what is pending when the replica stops.

use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing::Metadata;
use tracing_subscriber::filter::FilterFn;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

use crate::config::TelemetryConfig;

/// The standard variable naming the OTLP collector (base URL), honoured when
/// `telemetry.otlp_endpoint` is unset.
pub const OTEL_ENDPOINT_VAR: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";

/// The OTLP/HTTP path of traces under a collector's base URL.
const TRACES_PATH: &str = "/v1/traces";

/// How long the final flush may take when the replica stops.
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Where traces go: `telemetry.otlp_endpoint`, else the standard variable's value
/// (`otel_env`), else nowhere (`None`: no export). Empty values count as unset.
pub fn endpoint(config: &TelemetryConfig, otel_env: Option<String>) -> Option<String> {
    config
        .otlp_endpoint
        .clone()
        .filter(|e| !e.trim().is_empty())
        .or_else(|| otel_env.filter(|e| !e.trim().is_empty()))
        .map(|e| e.trim().to_string())
}

/// The traces URL for a collector base URL: `<base>/v1/traces`, unless it already ends so.
pub fn traces_url(base: &str) -> String {
    let base = base.trim_end_matches('/');
    if base.ends_with(TRACES_PATH) {
        base.to_string()
    } else {
        format!("{base}{TRACES_PATH}")
    }
}

/// What the export layer sees: the processor's spans (the batch and its children) and
/// warnings and errors of Sluice inside them (attached to the span as events). Nothing of
/// the exporter itself, which would feed on its own output.
fn exported(meta: &Metadata<'_>) -> bool {
    if meta.is_span() {
        meta.target().starts_with("sluice::processor")
    } else {
        meta.target().starts_with("sluice") && *meta.level() <= tracing::Level::WARN
    }
}

/// A running trace export; [`Telemetry::shutdown`] flushes it.
pub struct Telemetry {
    provider: SdkTracerProvider,
    url: String,
}

impl Telemetry {
    /// Build the exporter and the layer that feeds it, for traces sent to `endpoint` (a
    /// collector base URL). Must run outside the async runtime (the HTTP client of the
    /// exporter runs its own).
    pub fn start<S>(config: &TelemetryConfig, endpoint: &str) -> anyhow::Result<(Telemetry, impl Layer<S>)>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        let url = traces_url(endpoint);
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .build()
            .with_context(|| format!("cannot build the OTLP exporter for {}", crate::redact::redact_url(&url)))?;
        let resource =
            opentelemetry_sdk::Resource::builder_empty().with_service_name(config.service_name.clone()).build();
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(config.sample_ratio))))
            .with_resource(resource)
            .build();
        let tracer = provider.tracer("sluice");
        let layer = tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_tracked_inactivity(false)
            .with_filter(FilterFn::new(exported));
        Ok((Telemetry { provider, url }, layer))
    }

    /// Where traces go (credentials redacted), for the start-up log line.
    pub fn url(&self) -> String {
        crate::redact::redact_url(&self.url)
    }

    /// Export what is pending and stop the exporter (bounded). Call outside the runtime.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT) {
            tracing::warn!(error = %e, "cannot flush the pending traces");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoint_prefers_the_setting_then_the_standard_variable() {
        let mut c = TelemetryConfig::default();
        assert_eq!(endpoint(&c, None), None, "off by default");
        assert_eq!(endpoint(&c, Some(" ".into())), None);
        assert_eq!(endpoint(&c, Some("http://otel:4318".into())).as_deref(), Some("http://otel:4318"));
        c.otlp_endpoint = Some("http://mine:4318".into());
        assert_eq!(endpoint(&c, Some("http://otel:4318".into())).as_deref(), Some("http://mine:4318"));
        c.otlp_endpoint = Some(String::new());
        assert_eq!(endpoint(&c, None), None);
    }

    #[test]
    fn traces_url_appends_the_signal_path_once() {
        assert_eq!(traces_url("http://h:4318"), "http://h:4318/v1/traces");
        assert_eq!(traces_url("http://h:4318/"), "http://h:4318/v1/traces");
        assert_eq!(traces_url("http://h:4318/v1/traces"), "http://h:4318/v1/traces");
        assert_eq!(traces_url("http://h/otlp"), "http://h/otlp/v1/traces");
    }

    #[test]
    fn only_processor_spans_and_sluice_warnings_are_exported() {
        use tracing::callsite::Identifier;
        use tracing::metadata::Kind;
        struct Cs;
        impl tracing::Callsite for Cs {
            fn set_interest(&self, _: tracing::subscriber::Interest) {}
            fn metadata(&self) -> &Metadata<'_> {
                unreachable!()
            }
        }
        static CS: Cs = Cs;
        let meta = |target: &'static str, level, kind| {
            Metadata::new(
                "x",
                target,
                level,
                None,
                None,
                None,
                tracing::field::FieldSet::new(&[], Identifier(&CS)),
                kind,
            )
        };
        use tracing::Level;
        assert!(exported(&meta("sluice::processor::partition", Level::INFO, Kind::SPAN)));
        assert!(exported(&meta("sluice::processor::partition::commit", Level::DEBUG, Kind::SPAN)));
        assert!(!exported(&meta("sluice::backfill", Level::INFO, Kind::SPAN)));
        assert!(exported(&meta("sluice::processor::partition::commit", Level::WARN, Kind::EVENT)));
        assert!(!exported(&meta("sluice::processor::partition::commit", Level::INFO, Kind::EVENT)));
        assert!(!exported(&meta("opentelemetry_sdk", Level::WARN, Kind::EVENT)));
    }
}
