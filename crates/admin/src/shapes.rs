//! How the registry's deployments and services are shown: the bodies of the deployment and
//! service routes (`sluice_api`), in the Restate admin API's shapes.

use sluice_api::deployments::DeploymentResponse;
use sluice_api::services::{HandlerMetadata, RetryPolicy, ServiceInfo, ServiceMetadata};
use sluice_config::{Config, FriendlyDuration, OnMaxAttempts};
use sluice_core::errors::Code;
use sluice_runtime::discovery::manifest::{HandlerManifest, Options, ServiceManifest};
use sluice_runtime::discovery::{HandlerType, ProtocolMode, ServiceType};
use sluice_runtime::registry::{Address, Deployment, Service};

fn ms(v: Option<u64>) -> Option<String> {
    v.map(|ms| FriendlyDuration::from_millis(ms).to_string())
}

fn service_type_name(ty: ServiceType) -> &'static str {
    match ty {
        ServiceType::Service => "Service",
        ServiceType::VirtualObject => "VirtualObject",
        ServiceType::Workflow => "Workflow",
    }
}

fn handler_type_name(ty: HandlerType) -> &'static str {
    match ty {
        HandlerType::Exclusive => "Exclusive",
        HandlerType::Shared => "Shared",
        HandlerType::Workflow => "Workflow",
    }
}

fn retry_overrides(o: &Options) -> RetryPolicy {
    RetryPolicy {
        initial_interval: ms(o.retry_policy_initial_interval),
        exponentiation_factor: o.retry_policy_exponentiation_factor,
        max_attempts: o.retry_policy_max_attempts,
        max_interval: ms(o.retry_policy_max_interval),
        on_max_attempts: o.retry_policy_on_max_attempts.as_deref().map(|v| match v {
            "KILL" => "Kill".to_owned(),
            _ => "Pause".to_owned(),
        }),
    }
}

/// The shape of one handler of `service`.
pub fn handler_metadata(
    service: &ServiceManifest,
    handler: &HandlerManifest,
    service_public: bool,
) -> HandlerMetadata {
    let input_description = match &handler.input {
        Some(input)
            if input.content_type.is_none()
                && input.required.is_none()
                && input.json_schema.is_none() =>
        {
            "none".to_owned()
        }
        Some(input) => input
            .content_type
            .clone()
            .unwrap_or_else(|| "*/*".to_owned()),
        None => "*/*".to_owned(),
    };
    let output_description = handler
        .output
        .as_ref()
        .and_then(|o| o.content_type.clone())
        .unwrap_or_else(|| "application/json".to_owned());
    HandlerMetadata {
        name: handler.name.clone(),
        ty: handler
            .effective_type(service.ty)
            .map(|t| handler_type_name(t).to_owned()),
        documentation: handler.options.documentation.clone(),
        metadata: handler.options.metadata.clone(),
        public: service_public && !handler.options.ingress_private.unwrap_or(false),
        input_description,
        output_description,
        input_json_schema: handler.input.as_ref().and_then(|i| i.json_schema.clone()),
        output_json_schema: handler.output.as_ref().and_then(|o| o.json_schema.clone()),
        retry_policy: retry_overrides(&handler.options),
    }
}

/// The shape of a service at its latest revision, defaults from `config`.
pub fn service_metadata(
    service: &Service,
    deployment: &Deployment,
    config: &Config,
) -> ServiceMetadata {
    let empty = ServiceManifest {
        name: service.name.clone(),
        ty: service.ty,
        handlers: Vec::new(),
        limits: None,
        options: Options::default(),
    };
    let manifest = deployment.service(&service.name).unwrap_or(&empty);
    let o = &manifest.options;
    let invoker = &config.worker.invoker;
    let public = service
        .overrides
        .public
        .unwrap_or(!o.ingress_private.unwrap_or(false));
    let pick =
        |over: Option<FriendlyDuration>, from_manifest: Option<u64>, default: FriendlyDuration| {
            over.or(from_manifest.map(FriendlyDuration::from_millis))
                .unwrap_or(default)
                .to_string()
        };
    let day = FriendlyDuration::from_secs(86_400);
    let request_response = deployment.protocol_mode == ProtocolMode::RequestResponse;
    let inactivity_default = if request_response {
        FriendlyDuration::from_secs(0)
    } else {
        invoker.inactivity_timeout
    };
    let (journal_retention, info) = journal_retention(service, o, config);
    ServiceMetadata {
        name: service.name.clone(),
        ty: service_type_name(service.ty).to_owned(),
        handlers: manifest
            .handlers
            .iter()
            .map(|h| handler_metadata(manifest, h, public))
            .collect(),
        documentation: o.documentation.clone(),
        metadata: o.metadata.clone(),
        deployment_id: service.deployment_id.to_string(),
        revision: service.revision,
        public,
        idempotency_retention: pick(
            service.overrides.idempotency_retention,
            o.idempotency_retention,
            day,
        ),
        workflow_completion_retention: (service.ty == ServiceType::Workflow).then(|| {
            pick(
                service.overrides.workflow_completion_retention,
                o.workflow_completion_retention,
                day,
            )
        }),
        journal_retention: journal_retention.to_string(),
        inactivity_timeout: pick(
            service.overrides.inactivity_timeout,
            o.inactivity_timeout,
            inactivity_default,
        ),
        abort_timeout: pick(
            service.overrides.abort_timeout,
            o.abort_timeout,
            invoker.abort_timeout,
        ),
        enable_lazy_state: o.enable_lazy_state.unwrap_or(false),
        retry_policy: retry_policy(o, &invoker.retry_policy),
        info,
    }
}

/// How long a service's journals are kept: what it asks (its override, its manifest, else a
/// day), no longer than `worker.max-journal-retention`; when lowered, the info that says so.
fn journal_retention(
    service: &Service,
    o: &Options,
    config: &Config,
) -> (FriendlyDuration, Vec<ServiceInfo>) {
    let asked = service
        .overrides
        .journal_retention
        .or(o.journal_retention.map(FriendlyDuration::from_millis))
        .unwrap_or(FriendlyDuration::from_secs(86_400));
    let max = config.worker.max_journal_retention;
    if asked.0 <= max.0 {
        return (asked, Vec::new());
    }
    let info = ServiceInfo {
        code: Code::RT0022.to_string(),
        message: format!(
            "journal_retention {asked} is longer than worker.max-journal-retention and was lowered to {max}"
        ),
    };
    (max, vec![info])
}

/// A service's retry policy: what its manifest sets, the invoker's `defaults` for the rest.
fn retry_policy(o: &Options, defaults: &sluice_config::RetryPolicy) -> RetryPolicy {
    let overrides = retry_overrides(o);
    RetryPolicy {
        initial_interval: overrides
            .initial_interval
            .or(Some(defaults.initial_interval.to_string())),
        exponentiation_factor: overrides
            .exponentiation_factor
            .or(Some(defaults.exponentiation_factor)),
        max_attempts: overrides
            .max_attempts
            .or(Some(u64::from(defaults.max_attempts.get()))),
        max_interval: overrides
            .max_interval
            .or(Some(defaults.max_interval.to_string())),
        on_max_attempts: overrides.on_max_attempts.or(Some(
            match defaults.on_max_attempts {
                OnMaxAttempts::Pause => "Pause",
                OnMaxAttempts::Kill => "Kill",
            }
            .to_owned(),
        )),
    }
}

/// The shape of `d` with `services` already shaped.
pub fn deployment_response<S>(d: &Deployment, services: Vec<S>) -> DeploymentResponse<S> {
    let (uri, arn, protocol_type, http_version) = match &d.address {
        Address::Http {
            uri, http_version, ..
        } => (
            Some(uri.clone()),
            None,
            Some(
                match d.protocol_mode {
                    ProtocolMode::BidiStream => "BidiStream",
                    ProtocolMode::RequestResponse => "RequestResponse",
                }
                .to_owned(),
            ),
            Some(http_version.as_str().to_owned()),
        ),
        Address::Lambda { arn, .. } => (None, Some(arn.clone()), None, None),
    };
    let created_at = sluice_core::clock::rfc3339(d.created_at_ms).unwrap_or_default();
    DeploymentResponse {
        id: d.id.to_string(),
        ty: match d.address {
            Address::Http { .. } => "http",
            Address::Lambda { .. } => "lambda",
        }
        .to_owned(),
        status: None,
        uri,
        arn,
        protocol_type,
        http_version,
        additional_headers: d
            .additional_headers
            .keys()
            .map(|k| (k.clone(), "<redacted>".to_owned()))
            .collect(),
        metadata: d.metadata.clone(),
        created_at,
        min_protocol_version: d.min_protocol_version,
        max_protocol_version: d.max_protocol_version,
        sdk_version: d.sdk_version.clone(),
        services,
    }
}
