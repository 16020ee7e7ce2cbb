//! `GET /version`: build version, admin API range, feature flags, ingress address.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::State;

use super::AdminState;
use super::json::Json;
pub use sluice_api::version::VersionInformation;

/// Oldest admin API version served (`/v2/…`).
pub const MIN_ADMIN_API_VERSION: u16 = 2;
/// Newest admin API version served (`/v4/…`).
pub const MAX_ADMIN_API_VERSION: u16 = 4;

/// The answer for a running server.
pub fn version_information(state: &AdminState) -> VersionInformation {
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
    VersionInformation {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        min_admin_api_version: MIN_ADMIN_API_VERSION,
        max_admin_api_version: MAX_ADMIN_API_VERSION,
        features,
        ingress_endpoint: Some(state.ingress_endpoint.clone()),
    }
}

/// Version and capabilities of this server.
#[utoipa::path(get, path = "/version", tag = "version", operation_id = "version",
    responses((status = 200, body = VersionInformation)))]
pub async fn version(State(state): State<Arc<AdminState>>) -> Json<VersionInformation> {
    Json(version_information(&state))
}
