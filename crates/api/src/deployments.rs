//! Deployments: register, update, list, describe.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::services::ServiceMetadata;

/// `POST /deployments`: an HTTP `uri` or a Lambda `arn`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegisterDeploymentRequest {
    /// Absolute `http://` URI of the SDK endpoint.
    #[serde(default)]
    pub uri: Option<String>,
    /// Lambda function ARN (stored shape only: Lambda is out of reach from here).
    #[serde(default)]
    pub arn: Option<String>,
    /// Headers sent with discovery and every invocation.
    #[serde(default)]
    pub additional_headers: Option<BTreeMap<String, String>>,
    /// Operator metadata.
    #[serde(default)]
    pub metadata: Option<BTreeMap<String, String>>,
    /// Use HTTP/1.1 instead of HTTP/2.
    #[serde(default)]
    pub use_http_11: bool,
    /// Accept a service type change.
    #[serde(default)]
    pub breaking: bool,
    /// Replace a deployment at the same URI; accept a service type change.
    #[serde(default)]
    pub force: Option<bool>,
    /// Discover and check, store nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// What a registration answers.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct RegisterDeploymentResponse {
    /// `dp_…`
    pub id: String,
    /// The services at their new revisions.
    pub services: Vec<ServiceMetadata>,
    /// Lowest protocol version.
    pub min_protocol_version: i32,
    /// Highest protocol version.
    pub max_protocol_version: i32,
    /// SDK name and version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sdk_version: Option<String>,
}

/// `PATCH`/`PUT /deployments/{id}`: a new endpoint for the same deployment.
#[derive(Debug, Default, Serialize, Deserialize, ToSchema)]
pub struct UpdateDeploymentRequest {
    /// New URI (default: the current one).
    #[serde(default)]
    pub uri: Option<String>,
    /// Replaces all additional headers.
    #[serde(default)]
    pub additional_headers: Option<BTreeMap<String, String>>,
    /// Use HTTP/1.1 instead of HTTP/2.
    #[serde(default)]
    pub use_http_11: Option<bool>,
    /// Skip the in-place compatibility checks.
    #[serde(default)]
    pub overwrite: bool,
    /// Discover and check, store nothing.
    #[serde(default)]
    pub dry_run: bool,
}

/// `DELETE /deployments/{id}` query.
#[derive(Debug, Serialize, Deserialize, utoipa::IntoParams)]
pub struct DeleteParams {
    /// Remove even with invocations pinned to it.
    #[serde(default)]
    pub force: bool,
}

/// `GET /deployments`.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ListDeploymentsResponse {
    /// Every deployment.
    pub deployments: Vec<DeploymentResponse<ServiceNameRevision>>,
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
    /// `http` or `lambda` (the reference's 1.8 field).
    #[serde(rename = "type", default)]
    pub ty: String,
    /// `active` (a service's current deployment, or unfinished invocations are pinned to it)
    /// or `drained`; only with `?include=status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
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
