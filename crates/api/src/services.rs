//! Services and handlers, in the Restate admin API's shapes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use sluice_core::units::FriendlyDuration;

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

/// `GET /services`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListServicesResponse {
    /// Every service at its latest revision.
    pub services: Vec<ServiceMetadata>,
}

/// `GET /services/{s}/handlers`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListHandlersResponse {
    /// The handlers.
    pub handlers: Vec<HandlerMetadata>,
}

/// `PATCH /services/{s}`: operator settings; durations friendly (`2h`) or ISO-8601 (`PT2H`).
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ModifyServiceRequest {
    /// Callable through the ingress.
    #[serde(default)]
    pub public: Option<bool>,
    /// How long idempotency keys are kept.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub idempotency_retention: Option<FriendlyDuration>,
    /// How long a finished workflow is kept.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub workflow_completion_retention: Option<FriendlyDuration>,
    /// How long journals are kept.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub journal_retention: Option<FriendlyDuration>,
    /// Idle bidi attempts suspend after this.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub inactivity_timeout: Option<FriendlyDuration>,
    /// Silent attempts abort after this.
    #[serde(default)]
    #[schema(value_type = Option<String>)]
    pub abort_timeout: Option<FriendlyDuration>,
}

/// `POST /services/{service}/state`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModifyServiceStateRequest {
    /// Service revision the edit was made against (accepted, not checked).
    pub version: Option<String>,
    /// The object (or workflow) key.
    pub object_key: String,
    /// Flow-control scope of the object.
    pub scope: Option<String>,
    /// The new state, replacing all of it: key → value bytes.
    pub new_state: std::collections::BTreeMap<String, Vec<u8>>,
}
