//! Deployment routes: register (with discovery), list, describe, update in place, remove.

use std::sync::Arc;

use super::extract::{Path, Query};
use axum::extract::State;
use axum::response::IntoResponse as _;
use http::{StatusCode, header};

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use super::shapes::{deployment_response, service_metadata};
pub use sluice_api::deployments::{
    DeleteParams, DeploymentResponse, ListDeploymentsResponse, RegisterDeploymentRequest,
    RegisterDeploymentResponse, ServiceNameRevision, UpdateDeploymentRequest,
};
use sluice_api::services::ServiceMetadata;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::DeploymentId;
use sluice_runtime::discovery::DiscoveryRequest;
use sluice_runtime::registry::{
    Address, Deployment, InPlaceUpdate, Outcome, Registered, Registration,
};

fn parse_id(text: &str) -> Result<DeploymentId, AdminError> {
    text.parse().map_err(|e| {
        AdminError::coded(
            Code::ADM0002,
            format!("The request field 'deployment' is invalid. Reason: {e}"),
        )
    })
}

fn parse_uri(text: &str) -> Result<url::Url, AdminError> {
    url::Url::parse(text).map_err(|e| {
        AdminError::coded(
            Code::ADM0002,
            format!("The provided uri '{text}' is not absolute ({e}): only absolute URIs like http://host:9080/ can be used"),
        )
    })
}

fn detailed(state: &AdminState, d: &Deployment) -> DeploymentResponse<ServiceMetadata> {
    let services = state
        .registry
        .services()
        .into_iter()
        .filter(|(s, _)| s.deployment_id == d.id)
        .map(|(s, dep)| service_metadata(&s, &dep, &state.config))
        .collect();
    deployment_response(d, services)
}

fn listed(d: &Deployment) -> DeploymentResponse<ServiceNameRevision> {
    let services = d
        .revisions
        .iter()
        .map(|(name, revision)| ServiceNameRevision {
            name: name.clone(),
            revision: *revision,
        })
        .collect();
    deployment_response(d, services)
}

/// Discovers the endpoint and registers its services.
#[utoipa::path(post, path = "/deployments", tag = "deployment", operation_id = "create_deployment",
    request_body = RegisterDeploymentRequest,
    responses(
        (status = 201, description = "Registered.", body = RegisterDeploymentResponse),
        (status = 200, description = "Already registered unchanged, replaced with force, or a dry run.", body = RegisterDeploymentResponse),
        (status = 409, description = "META0004, META0006 or META0017."),
        (status = 500, description = "Discovery failed: META0003, META0012–META0015.")))]
pub async fn create(
    State(state): State<Arc<AdminState>>,
    Json(req): Json<RegisterDeploymentRequest>,
) -> Result<
    (
        StatusCode,
        [(header::HeaderName, String); 1],
        Json<RegisterDeploymentResponse>,
    ),
    AdminError,
> {
    let uri = match (&req.uri, &req.arn) {
        (Some(uri), None) => parse_uri(uri)?,
        (None, Some(arn)) => {
            return Err(AdminError::coded(
                Code::META0003,
                format!(
                    "cannot discover Lambda deployment '{arn}': invoking AWS Lambda needs AWS network access and credentials, which this Sluice does not have; register an HTTP endpoint (uri) instead"
                ),
            ));
        }
        _ => {
            return Err(AdminError::coded(
                Code::ADM0001,
                "the body must have exactly one of 'uri' (HTTP endpoint) or 'arn' (Lambda function)",
            ));
        }
    };
    sluice_runtime::discovery::address::check(&uri, state.config.admin.deployment_address_policy)
        .await?;
    let headers = req.additional_headers.clone().unwrap_or_default();
    let found = state
        .discovery
        .discover(&DiscoveryRequest {
            uri: uri.clone(),
            additional_headers: headers.clone(),
            use_http_11: req.use_http_11,
        })
        .await
        .map_err(AdminError::from)?;
    let registration = Registration {
        uri: uri.to_string(),
        additional_headers: headers,
        metadata: req.metadata.clone().unwrap_or_default(),
        use_http_11: req.use_http_11,
        force: req.force.unwrap_or(false),
        allow_type_change: req.breaking,
        dry_run: req.dry_run,
    };
    let registered = state
        .registry
        .register(found, registration, sluice_core::clock::now_ms())?;
    // As the reference answers: 201 for a deployment that is new, a dry run included (its
    // CLI reads a 200 to a dry run as "already exists" and registers nothing).
    let status = match registered.outcome {
        Outcome::Created => StatusCode::CREATED,
        _ => StatusCode::OK,
    };
    let location = format!("deployments/{}", registered.deployment.id);
    Ok((
        status,
        [(header::LOCATION, location)],
        Json(response(&state, &registered)),
    ))
}

fn response(state: &AdminState, registered: &Registered) -> RegisterDeploymentResponse {
    let d = &registered.deployment;
    RegisterDeploymentResponse {
        id: d.id.to_string(),
        services: registered
            .services
            .iter()
            .map(|s| service_metadata(s, d, &state.config))
            .collect(),
        min_protocol_version: d.min_protocol_version,
        max_protocol_version: d.max_protocol_version,
        sdk_version: d.sdk_version.clone(),
    }
}

/// `?include=status` (and `refresh`, accepted: the status is computed on every request).
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct IncludeParams {
    /// `status`: add each deployment's `status` (`active` or `drained`).
    #[serde(default)]
    include: Option<String>,
    /// Accepted for the reference's clients; every status is computed fresh.
    #[serde(default)]
    refresh: Option<bool>,
}

impl IncludeParams {
    fn status(&self) -> Result<bool, AdminError> {
        let _ = self.refresh;
        match self.include.as_deref() {
            None | Some("") => Ok(false),
            Some(list) if list.split(',').all(|part| part.trim() == "status") => Ok(true),
            Some(other) => Err(AdminError::coded(
                Code::ADM0002,
                format!("include={other} is not known: include takes `status`"),
            )),
        }
    }
}

/// Deployments that are `active`: the current deployment of a service, or pinned by an
/// unfinished invocation. The rest are `drained`: removing them strands nothing.
async fn active_deployments(
    state: &AdminState,
) -> Result<std::collections::HashSet<sluice_core::ids::DeploymentId>, AdminError> {
    let mut active: std::collections::HashSet<_> = state
        .registry
        .services()
        .into_iter()
        .map(|(s, _)| s.deployment_id)
        .collect();
    let pinned = super::invocations::read(state, |db| {
        sluice_store::invocation::store::pinned_deployments_in_flight(db)
    })
    .await?;
    active.extend(pinned);
    Ok(active)
}

fn status_of(
    active: &std::collections::HashSet<sluice_core::ids::DeploymentId>,
    d: &Deployment,
) -> String {
    if active.contains(&d.id) {
        "active"
    } else {
        "drained"
    }
    .to_owned()
}

/// The headers of an answer that carries statuses: computed now, never to be cached.
fn fresh() -> [(http::HeaderName, &'static str); 2] {
    [
        (http::header::AGE, "0"),
        (http::header::CACHE_CONTROL, "no-store"),
    ]
}

/// Every deployment.
#[utoipa::path(get, path = "/deployments", tag = "deployment", operation_id = "list_deployments",
    params(IncludeParams),
    responses((status = 200, body = ListDeploymentsResponse)))]
pub async fn list(
    State(state): State<Arc<AdminState>>,
    Query(params): Query<IncludeParams>,
) -> Result<axum::response::Response, AdminError> {
    // One read of the registry: each status goes with the deployment it was computed for.
    let registered = state.registry.deployments();
    let mut deployments: Vec<_> = registered.iter().map(|d| listed(d)).collect();
    if !params.status()? {
        return Ok(Json(ListDeploymentsResponse { deployments }).into_response());
    }
    let active = active_deployments(&state).await?;
    for (shown, d) in deployments.iter_mut().zip(registered.iter()) {
        shown.status = Some(status_of(&active, d));
    }
    Ok((fresh(), Json(ListDeploymentsResponse { deployments })).into_response())
}

/// One deployment with its services in full.
#[utoipa::path(get, path = "/deployments/{deployment}", tag = "deployment", operation_id = "get_deployment",
    params(("deployment" = String, Path, description = "dp_…"), IncludeParams),
    responses((status = 200, body = DeploymentResponse<ServiceMetadata>), (status = 404, description = "No such deployment.")))]
pub async fn get(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Query(params): Query<IncludeParams>,
) -> Result<axum::response::Response, AdminError> {
    let d = state.registry.deployment(parse_id(&id)?)?;
    let mut shown = detailed(&state, &d);
    if !params.status()? {
        return Ok(Json(shown).into_response());
    }
    shown.status = Some(status_of(&active_deployments(&state).await?, &d));
    Ok((fresh(), Json(shown)).into_response())
}

/// Points a deployment at a new endpoint in place (same services, handlers, types and protocol
/// range, else META0016 unless `overwrite`).
#[utoipa::path(patch, path = "/deployments/{deployment}", tag = "deployment", operation_id = "update_deployment",
    params(("deployment" = String, Path, description = "dp_…")),
    request_body = UpdateDeploymentRequest,
    responses((status = 200, body = DeploymentResponse<ServiceMetadata>), (status = 400, description = "META0016.")))]
pub async fn update(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Json(req): Json<UpdateDeploymentRequest>,
) -> Result<Json<DeploymentResponse<ServiceMetadata>>, AdminError> {
    let id = parse_id(&id)?;
    let current = state.registry.deployment(id)?;
    let Address::Http {
        uri, use_http_11, ..
    } = &current.address
    else {
        return Err(AdminError::coded(
            Code::ADM0002,
            "Lambda deployments cannot be updated here: Lambda is out of reach",
        ));
    };
    let uri = parse_uri(req.uri.as_deref().unwrap_or(uri))?;
    sluice_runtime::discovery::address::check(&uri, state.config.admin.deployment_address_policy)
        .await?;
    let use_http_11 = req.use_http_11.unwrap_or(*use_http_11);
    let headers = req
        .additional_headers
        .clone()
        .unwrap_or_else(|| current.additional_headers.clone());
    let found = state
        .discovery
        .discover(&DiscoveryRequest {
            uri: uri.clone(),
            additional_headers: headers.clone(),
            use_http_11,
        })
        .await
        .map_err(AdminError::from)?;
    let change = InPlaceUpdate {
        uri: uri.to_string(),
        additional_headers: headers,
        use_http_11,
        overwrite: req.overwrite,
        dry_run: req.dry_run,
    };
    let updated = state.registry.update(id, found, change)?;
    // A dry run stored nothing: show the would-be services, not the registry's.
    let shown = if req.dry_run {
        deployment_response(&updated.deployment, response(&state, &updated).services)
    } else {
        detailed(&state, &updated.deployment)
    };
    Ok(Json(shown))
}

/// `PUT` spelling of [`update`]: the same in-place update.
#[utoipa::path(put, path = "/deployments/{deployment}", tag = "deployment", operation_id = "replace_deployment",
    params(("deployment" = String, Path, description = "dp_…")),
    request_body = UpdateDeploymentRequest,
    responses((status = 200, body = DeploymentResponse<ServiceMetadata>), (status = 400, description = "META0016.")))]
pub async fn replace(
    state: State<Arc<AdminState>>,
    id: Path<String>,
    body: Json<UpdateDeploymentRequest>,
) -> Result<Json<DeploymentResponse<ServiceMetadata>>, AdminError> {
    update(state, id, body).await
}

/// Removes a deployment (202). Without `force`, refused (409) while unfinished invocations are
/// pinned to it: they would have nowhere to run their next attempt.
#[utoipa::path(delete, path = "/deployments/{deployment}", tag = "deployment", operation_id = "delete_deployment",
    params(("deployment" = String, Path, description = "dp_…"), DeleteParams),
    responses((status = 202, description = "Removed."), (status = 404, description = "No such deployment."),
        (status = 409, description = "Unfinished invocations are pinned to it; names them.")))]
pub async fn delete(
    State(state): State<Arc<AdminState>>,
    Path(id): Path<String>,
    Query(params): Query<DeleteParams>,
) -> Result<StatusCode, AdminError> {
    let id = parse_id(&id)?;
    state.registry.deployment(id)?;
    if !params.force {
        let pinned = super::invocations::read(&state, move |db| {
            sluice_store::invocation::store::pinned_in_flight(db, id)
        })
        .await?;
        if !pinned.is_empty() {
            const SHOWN: usize = 10;
            let mut names: Vec<String> =
                pinned.iter().take(SHOWN).map(ToString::to_string).collect();
            if pinned.len() > SHOWN {
                names.push(format!("and {} more", pinned.len() - SHOWN));
            }
            return Err(AdminError::coded(
                Code::ADM0004,
                format!(
                    "deployment {id} has {} unfinished invocation(s) pinned to it: {}; wait for them to complete (or kill them), or delete with ?force=true to strand them",
                    pinned.len(),
                    names.join(", ")
                ),
            ));
        }
    }
    state.registry.remove(id)?;
    tracing::info!(deployment = %id, force = params.force, "deployment removed");
    Ok(StatusCode::ACCEPTED)
}

impl From<CodedError> for AdminError {
    fn from(error: CodedError) -> Self {
        let status = error
            .code
            .map_or(StatusCode::INTERNAL_SERVER_ERROR, Code::http_status);
        Self { status, error }
    }
}
