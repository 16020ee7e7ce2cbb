//! What the registry stores: deployments with their discovered manifests, and services pointing
//! at the deployment of their latest revision.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::discovery::manifest::{HandlerManifest, ServiceManifest};
use crate::discovery::{HttpVersion, Manifest, ProtocolMode, ServiceType};
use sluice_config::FriendlyDuration;
use sluice_core::ids::DeploymentId;

/// Where a deployment is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Address {
    /// An HTTP endpoint.
    Http {
        /// Base URI.
        uri: String,
        /// Speak HTTP/1.1 instead of HTTP/2.
        use_http_11: bool,
        /// HTTP version discovery used.
        http_version: StoredHttpVersion,
    },
    /// An AWS Lambda function (stored and listed; not invocable from here).
    Lambda {
        /// Function ARN.
        arn: String,
        /// Role to assume.
        assume_role_arn: Option<String>,
    },
}

/// Serializable twin of [`HttpVersion`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoredHttpVersion {
    /// HTTP/2.
    Http2,
    /// HTTP/1.1.
    Http11,
}

impl From<HttpVersion> for StoredHttpVersion {
    fn from(v: HttpVersion) -> Self {
        match v {
            HttpVersion::Http2 => Self::Http2,
            HttpVersion::Http11 => Self::Http11,
        }
    }
}

impl StoredHttpVersion {
    /// `HTTP/2.0` or `HTTP/1.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Http2 => "HTTP/2.0",
            Self::Http11 => "HTTP/1.1",
        }
    }
}

/// A registered deployment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Deployment {
    /// Its id.
    pub id: DeploymentId,
    /// Where it is.
    pub address: Address,
    /// Sent with discovery and every invocation (may hold credentials: never logged).
    pub additional_headers: BTreeMap<String, String>,
    /// Operator metadata.
    pub metadata: BTreeMap<String, String>,
    /// Bidi or request/response.
    pub protocol_mode: ProtocolMode,
    /// Lowest protocol version.
    pub min_protocol_version: i32,
    /// Highest protocol version.
    pub max_protocol_version: i32,
    /// `x-restate-server` from discovery.
    pub sdk_version: Option<String>,
    /// Milliseconds since the epoch.
    pub created_at_ms: u64,
    /// The services as discovered.
    pub manifest: Manifest,
    /// Service name → the revision this deployment provides.
    pub revisions: BTreeMap<String, u32>,
}

impl Deployment {
    /// The URI, for HTTP deployments.
    pub fn uri(&self) -> Option<&str> {
        match &self.address {
            Address::Http { uri, .. } => Some(uri),
            Address::Lambda { .. } => None,
        }
    }

    /// The manifest entry of a service.
    pub fn service(&self, name: &str) -> Option<&ServiceManifest> {
        self.manifest.services.iter().find(|s| s.name == name)
    }

    /// The manifest entry of a handler.
    pub fn handler(&self, service: &str, handler: &str) -> Option<&HandlerManifest> {
        self.service(service)?
            .handlers
            .iter()
            .find(|h| h.name == handler)
    }
}

/// Settings an operator changed with `PATCH /services/{s}`; unset ones come from the manifest
/// or the server defaults.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceOverrides {
    /// Callable through the ingress.
    pub public: Option<bool>,
    /// How long idempotency keys are kept.
    pub idempotency_retention: Option<FriendlyDuration>,
    /// How long a finished workflow is kept.
    pub workflow_completion_retention: Option<FriendlyDuration>,
    /// How long journals are kept after completion.
    pub journal_retention: Option<FriendlyDuration>,
    /// Idle bidi attempts are suspended after this.
    pub inactivity_timeout: Option<FriendlyDuration>,
    /// Silent attempts are aborted after this.
    pub abort_timeout: Option<FriendlyDuration>,
}

/// A service: its latest revision and where that runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Service {
    /// Its name.
    pub name: String,
    /// Its type.
    pub ty: ServiceType,
    /// Bumps with every deployment that provides it anew.
    pub revision: u32,
    /// The deployment of the latest revision.
    pub deployment_id: DeploymentId,
    /// Operator changes.
    pub overrides: ServiceOverrides,
}

impl Service {
    /// Virtual objects and workflows are addressed with a key.
    pub fn service_type_is_keyed(&self) -> bool {
        self.ty != ServiceType::Service
    }
}
