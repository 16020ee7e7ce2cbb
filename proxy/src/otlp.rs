//! Span export over OTLP/HTTP (`tracing.endpoint`): a batch processor on its own thread sends
//! what `sluice_runtime::spans` and the ingress emit, so a slow or absent collector never
//! holds up a request. Spans beyond `tracing.max-queue-size` waiting are dropped.

use std::time::Duration;

use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};

use sluice_config::{TracingConfig, TracingProtocol};
use sluice_core::errors::{Code, CodedError};

/// How long one export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Installs the exporter when `config` names an endpoint; the provider, to flush at shutdown.
pub fn install(config: &TracingConfig) -> Result<Option<SdkTracerProvider>, CodedError> {
    let Some(endpoint) = &config.endpoint else {
        return Ok(None);
    };
    // The exporter's HTTP client is built without TLS: an https endpoint would export
    // nothing, silently.
    if endpoint
        .trim_start()
        .to_ascii_lowercase()
        .starts_with("https:")
    {
        return Err(CodedError::new(
            Code::RT0002,
            format!(
                "invalid configuration: tracing.endpoint {endpoint}: this build exports spans over plain HTTP only; point it at a collector (or an agent beside Sluice) over http://"
            ),
        ));
    }
    let protocol = match config.protocol {
        TracingProtocol::HttpProtobuf => Protocol::HttpBinary,
        TracingProtocol::HttpJson => Protocol::HttpJson,
    };
    let exporter = SpanExporter::builder()
        .with_http()
        .with_endpoint(endpoint)
        .with_protocol(protocol)
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .map_err(|e| {
            CodedError::new(
                Code::RT0002,
                format!("tracing.endpoint: cannot build the OTLP exporter: {e}"),
            )
        })?;
    let batch = BatchSpanProcessor::builder(exporter)
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_scheduled_delay(config.export_interval.0)
                .with_max_queue_size(config.max_queue_size.get())
                .build(),
        )
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(batch)
        .with_resource(
            Resource::builder()
                .with_service_name(config.service_name.clone())
                .build(),
        )
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    sluice_runtime::spans::enable();
    tracing::info!(endpoint = %endpoint, "exporting spans over OTLP/HTTP");
    Ok(Some(provider))
}

/// Sends what is still waiting, at shutdown.
pub fn flush(provider: &SdkTracerProvider) {
    if let Err(e) = provider.shutdown() {
        tracing::warn!(error = %e, "could not send the last spans");
    }
}
