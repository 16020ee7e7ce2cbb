//! Service and handler routes.

use std::sync::Arc;

use super::extract::Path;
use axum::extract::State;
use bytes::Bytes;
use http::StatusCode;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use super::shapes::service_metadata;
pub use sluice_api::services::{
    HandlerMetadata, ListHandlersResponse, ListServicesResponse, ModifyServiceRequest,
    ModifyServiceStateRequest, RetryPolicy, ServiceInfo, ServiceMetadata,
};
use sluice_core::errors::Code;
use sluice_runtime::discovery::ServiceType;

fn metadata(state: &AdminState, name: &str) -> Result<ServiceMetadata, AdminError> {
    let (service, deployment) = state.registry.service(name)?;
    Ok(service_metadata(&service, &deployment, &state.config))
}

/// Every service.
#[utoipa::path(get, path = "/services", tag = "service", operation_id = "list_services",
    responses((status = 200, body = ListServicesResponse)))]
pub async fn list(State(state): State<Arc<AdminState>>) -> Json<ListServicesResponse> {
    let services = state
        .registry
        .services()
        .iter()
        .map(|(s, d)| service_metadata(s, d, &state.config))
        .collect();
    Json(ListServicesResponse { services })
}

/// One service.
#[utoipa::path(get, path = "/services/{service}", tag = "service", operation_id = "get_service",
    params(("service" = String, Path)),
    responses((status = 200, body = ServiceMetadata), (status = 404, description = "No such service.")))]
pub async fn get(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Json<ServiceMetadata>, AdminError> {
    metadata(&state, &name).map(Json)
}

/// Replaces the state of one virtual object or workflow key.
#[utoipa::path(post, path = "/services/{service}/state", tag = "service", operation_id = "modify_service_state",
    params(("service" = String, Path)),
    request_body = ModifyServiceStateRequest,
    responses((status = 202, description = "Replaced."), (status = 400, description = "Not a keyed service, or a scope."),
        (status = 404, description = "No such service.")))]
pub async fn modify_state(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Json(req): Json<ModifyServiceStateRequest>,
) -> Result<StatusCode, AdminError> {
    let (service, _) = state.registry.service(&name)?;
    if service.ty == ServiceType::Service {
        return Err(AdminError::coded(
            Code::ADM0002,
            format!("Cannot modify state for service type Service ('{name}' is stateless)"),
        ));
    }
    if req.scope.as_deref().is_some_and(|s| !s.is_empty()) {
        return Err(AdminError::coded(
            Code::ADM0002,
            "scoped objects exist only with flow control enabled; leave 'scope' out",
        ));
    }
    let entries = req
        .new_state
        .into_iter()
        .map(|(k, v)| (Bytes::from(k), Bytes::from(v)))
        .collect();
    state
        .runtime
        .set_object_state(&name, &req.object_key, entries)
        .await?;
    Ok(StatusCode::ACCEPTED)
}

/// Changes operator settings of a service.
#[utoipa::path(patch, path = "/services/{service}", tag = "service", operation_id = "modify_service",
    params(("service" = String, Path)),
    request_body = ModifyServiceRequest,
    responses((status = 200, body = ServiceMetadata), (status = 404, description = "No such service.")))]
pub async fn modify(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
    Json(req): Json<ModifyServiceRequest>,
) -> Result<Json<ServiceMetadata>, AdminError> {
    state.registry.modify_service(&name, |o| {
        o.public = req.public.or(o.public);
        o.idempotency_retention = req.idempotency_retention.or(o.idempotency_retention);
        o.workflow_completion_retention = req
            .workflow_completion_retention
            .or(o.workflow_completion_retention);
        o.journal_retention = req.journal_retention.or(o.journal_retention);
        o.inactivity_timeout = req.inactivity_timeout.or(o.inactivity_timeout);
        o.abort_timeout = req.abort_timeout.or(o.abort_timeout);
    })?;
    metadata(&state, &name).map(Json)
}

/// The handlers of a service.
#[utoipa::path(get, path = "/services/{service}/handlers", tag = "service_handler", operation_id = "list_service_handlers",
    params(("service" = String, Path)),
    responses((status = 200, body = ListHandlersResponse), (status = 404, description = "No such service.")))]
pub async fn handlers(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Json<ListHandlersResponse>, AdminError> {
    let handlers = metadata(&state, &name)?.handlers;
    Ok(Json(ListHandlersResponse { handlers }))
}

/// One handler of a service.
#[utoipa::path(get, path = "/services/{service}/handlers/{handler}", tag = "service_handler", operation_id = "get_service_handler",
    params(("service" = String, Path), ("handler" = String, Path)),
    responses((status = 200, body = HandlerMetadata), (status = 404, description = "No such service or handler.")))]
pub async fn handler(
    State(state): State<Arc<AdminState>>,
    Path((name, handler)): Path<(String, String)>,
) -> Result<Json<HandlerMetadata>, AdminError> {
    metadata(&state, &name)?
        .handlers
        .into_iter()
        .find(|h| h.name == handler)
        .map(Json)
        .ok_or_else(|| {
            AdminError::coded(
                Code::ADM0003,
                format!("The requested handler '{handler}' on service '{name}' does not exist"),
            )
        })
}

/// OpenAPI 3.1 of the service's ingress routes.
#[utoipa::path(get, path = "/services/{service}/openapi", tag = "service", operation_id = "get_service_openapi",
    params(("service" = String, Path)),
    responses((status = 200, description = "OpenAPI 3.1 JSON."), (status = 404, description = "No such service.")))]
pub async fn openapi(
    State(state): State<Arc<AdminState>>,
    Path(name): Path<String>,
) -> Result<Json<serde_json::Value>, AdminError> {
    let (service, _) = state.registry.service(&name)?;
    let meta = metadata(&state, &name)?;
    let keyed = service.ty != ServiceType::Service;
    let mut paths = serde_json::Map::new();
    for h in meta.handlers.iter().filter(|h| h.public) {
        let key = if keyed { "/{key}" } else { "" };
        let request = h
            .input_json_schema
            .clone()
            .unwrap_or_else(|| serde_json::json!({}));
        let response = h
            .output_json_schema
            .clone()
            .unwrap_or_else(|| serde_json::json!({}));
        let key_param = keyed.then(|| {
            serde_json::json!([{"name": "key", "in": "path", "required": true, "schema": {"type": "string"}}])
        });
        paths.insert(
            format!("/service/call/{name}{key}/{}", h.name),
            serde_json::json!({"post": {
                "operationId": format!("call_{}", h.name),
                "description": h.documentation,
                "parameters": key_param.clone().unwrap_or_else(|| serde_json::json!([])),
                "requestBody": {"content": {h.input_description.clone(): {"schema": request}}},
                "responses": {"200": {"description": "The handler's output.",
                    "content": {h.output_description.clone(): {"schema": response}}}}
            }}),
        );
        paths.insert(
            format!("/service/send/{name}{key}/{}", h.name),
            serde_json::json!({"post": {
                "operationId": format!("send_{}", h.name),
                "parameters": key_param.unwrap_or_else(|| serde_json::json!([])),
                "requestBody": {"content": {h.input_description.clone(): {"schema": request}}},
                "responses": {"202": {"description": "Accepted."}}
            }}),
        );
    }
    Ok(Json(serde_json::json!({
        "openapi": "3.1.0",
        "info": {"title": name, "version": meta.revision.to_string()},
        "paths": paths,
    })))
}
