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
    // Always on; still named, for clients that look for them.
    let features = [
        "protocol_v7",
        "vqueues",
        "scoped_virtual_objects",
        "flow_control",
    ]
    .into_iter()
    .map(|name| (name.to_owned(), true))
    .collect::<BTreeMap<_, _>>();
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
