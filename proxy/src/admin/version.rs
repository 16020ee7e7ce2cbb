//! `GET /version`: build version, admin API range, feature flags, ingress address.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use super::AdminState;
use super::json::Json;

/// Oldest admin API version served (`/v2/…`).
pub const MIN_ADMIN_API_VERSION: u16 = 2;
/// Newest admin API version served (`/v4/…`).
pub const MAX_ADMIN_API_VERSION: u16 = 4;

/// What `GET /version` answers.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct VersionInformation {
    /// The Sluice version.
    pub version: String,
    /// Oldest admin API version served.
    pub min_admin_api_version: u16,
    /// Newest admin API version served.
    pub max_admin_api_version: u16,
    /// Experimental switches and derived features, each on or off.
    pub features: BTreeMap<String, bool>,
    /// Where clients reach the ingress: `http://host:port/`, `https://host/` or `unix:<path>`.
    pub ingress_endpoint: Option<String>,
}

impl VersionInformation {
    /// The answer for a running server.
    pub fn of(state: &AdminState) -> Self {
        let config = &state.config;
        let features = BTreeMap::from([
            (
                "protocol_v7".to_owned(),
                config.experimental_enable_protocol_v7,
            ),
            ("vqueues".to_owned(), config.experimental_enable_vqueues),
            (
                "scoped_virtual_objects".to_owned(),
                config.experimental_enable_scoped_virtual_objects,
            ),
            ("flow_control".to_owned(), config.flow_control_enabled()),
        ]);
        Self {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            min_admin_api_version: MIN_ADMIN_API_VERSION,
            max_admin_api_version: MAX_ADMIN_API_VERSION,
            features,
            ingress_endpoint: Some(state.ingress_endpoint.clone()),
        }
    }
}

/// Version and capabilities of this server.
#[utoipa::path(get, path = "/version", tag = "version", operation_id = "version",
    responses((status = 200, body = VersionInformation)))]
pub async fn version(State(state): State<Arc<AdminState>>) -> Json<VersionInformation> {
    Json(VersionInformation::of(&state))
}
