//! Response bodies of the deployment and service routes, in the Restate admin API's shapes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::config::{Config, FriendlyDuration, OnMaxAttempts};
use crate::discovery::manifest::{HandlerManifest, Options, ServiceManifest};
use crate::discovery::{HandlerType, ProtocolMode, ServiceType};
use crate::errors::Code;
use crate::registry::{Address, Deployment, Service};

fn ms(v: Option<u64>) -> Option<String> {
    v.map(|ms| FriendlyDuration::from_millis(ms).to_string())
}

/// Retry settings of a service (all set) or handler (only overrides set).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RetryPolicy {
    /// Delay before the first retry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_interval: Option<String>,
    /// Growth per attempt.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exponentiation_factor: Option<f64>,
    /// Attempts before `on_max_attempts`.
    pub max_attempts: Option<u64>,
    /// Longest delay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_interval: Option<String>,
    /// `Pause` or `Kill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub on_max_attempts: Option<String>,
}

/// A handler, as `GET /services/{s}/handlers/{h}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HandlerMetadata {
    /// Its name.
    pub name: String,
    /// `Exclusive`, `Shared` or `Workflow`; absent for plain services.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ty: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation: Option<String>,
    /// Free key/values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Callable through the ingress.
    pub public: bool,
    /// What input it takes.
    pub input_description: String,
    /// What output it gives.
    pub output_description: String,
    /// JSON schema of the input.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub input_json_schema: Option<serde_json::Value>,
    /// JSON schema of the output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub output_json_schema: Option<serde_json::Value>,
    /// Handler-level retry overrides.
    pub retry_policy: RetryPolicy,
}

/// A service, as `GET /services/{s}` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceMetadata {
    /// Its name.
    pub name: String,
    /// `Service`, `VirtualObject` or `Workflow`.
    pub ty: String,
    /// Its handlers.
    pub handlers: Vec<HandlerMetadata>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub documentation: Option<String>,
    /// Free key/values.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Deployment of the latest revision.
    pub deployment_id: String,
    /// Latest revision.
    pub revision: u32,
    /// Callable through the ingress.
    pub public: bool,
    /// How long idempotency keys are kept.
    pub idempotency_retention: String,
    /// How long a finished workflow is kept (workflows only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workflow_completion_retention: Option<String>,
    /// How long journals are kept.
    pub journal_retention: String,
    /// Idle bidi attempts suspend after this.
    pub inactivity_timeout: String,
    /// Silent attempts abort after this.
    pub abort_timeout: String,
    /// State is fetched lazily.
    pub enable_lazy_state: bool,
    /// Retries.
    pub retry_policy: RetryPolicy,
    /// Warnings about the service's settings (RT0022: its journal retention was lowered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub info: Vec<ServiceInfo>,
}

/// A warning about a service's settings.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceInfo {
    /// Its catalogue code.
    pub code: String,
    /// What was changed and why.
    pub message: String,
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

impl HandlerMetadata {
    /// The shape of one handler of `service`.
    pub fn of(service: &ServiceManifest, handler: &HandlerManifest, service_public: bool) -> Self {
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
        Self {
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
}

impl ServiceMetadata {
    /// The shape of a service at its latest revision, defaults from `config`.
    pub fn of(service: &Service, deployment: &Deployment, config: &Config) -> Self {
        let empty = ServiceManifest {
            name: service.name.clone(),
            ty: service.ty,
            handlers: Vec::new(),
            options: Options::default(),
        };
        let manifest = deployment.service(&service.name).unwrap_or(&empty);
        let o = &manifest.options;
        let invoker = &config.worker.invoker;
        let public = service
            .overrides
            .public
            .unwrap_or(!o.ingress_private.unwrap_or(false));
        let pick = |over: Option<FriendlyDuration>,
                    from_manifest: Option<u64>,
                    default: FriendlyDuration| {
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
        let asked = service
            .overrides
            .journal_retention
            .or(o.journal_retention.map(FriendlyDuration::from_millis))
            .unwrap_or(day);
        let max = config.worker.max_journal_retention;
        let journal_retention = if asked.0 > max.0 { max } else { asked };
        let info = (asked.0 > max.0)
            .then(|| ServiceInfo {
                code: Code::RT0022.to_string(),
                message: format!(
                    "journal_retention {asked} is longer than worker.max-journal-retention and was lowered to {max}"
                ),
            })
            .into_iter()
            .collect();
        let defaults = &invoker.retry_policy;
        let overrides = retry_overrides(o);
        Self {
            name: service.name.clone(),
            ty: service_type_name(service.ty).to_owned(),
            handlers: manifest
                .handlers
                .iter()
                .map(|h| HandlerMetadata::of(manifest, h, public))
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
            retry_policy: RetryPolicy {
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
            },
            info,
        }
    }
}

/// A service name and revision, as deployment listings show them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ServiceNameRevision {
    /// The service.
    pub name: String,
    /// Its revision on this deployment.
    pub revision: u32,
}

/// A deployment; `S` is [`ServiceNameRevision`] in lists and [`ServiceMetadata`] in details.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct DeploymentResponse<S> {
    /// `dp_…`
    pub id: String,
    /// HTTP deployments: the URI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
    /// Lambda deployments: the ARN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arn: Option<String>,
    /// `BidiStream` or `RequestResponse`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol_type: Option<String>,
    /// `HTTP/2.0` or `HTTP/1.1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_version: Option<String>,
    /// Header names sent to the deployment; values are redacted because they may hold credentials.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub additional_headers: BTreeMap<String, String>,
    /// Operator metadata.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metadata: BTreeMap<String, String>,
    /// RFC 3339.
    pub created_at: String,
    /// Lowest protocol version.
    pub min_protocol_version: i32,
    /// Highest protocol version.
    pub max_protocol_version: i32,
    /// SDK name and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdk_version: Option<String>,
    /// Its services.
    pub services: Vec<S>,
}

impl<S> DeploymentResponse<S> {
    /// The shape of `d` with `services` already shaped.
    pub fn of(d: &Deployment, services: Vec<S>) -> Self {
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
        let created_at = crate::clock::rfc3339(d.created_at_ms).unwrap_or_default();
        Self {
            id: d.id.to_string(),
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
}
