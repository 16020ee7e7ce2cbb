//! `/limits/weights`: weight overrides. An operator sets the weight of chosen counters (a key
//! that pays more, a noisy one held back) without writing a rule for each; an override beats
//! the weight the counter's rule gives it and reaches every partition (and, in cluster mode,
//! every node) as the rule book does.

use std::num::NonZeroU32;
use std::sync::Arc;

use axum::extract::State;

use super::AdminState;
use super::error::AdminError;
use super::json::Json;
use super::limits::{refused, valid_weight};
pub use sluice_api::limits::{ListWeightsResponse, SetWeightRequest, WeightOverride};
use sluice_core::errors::Code;
use sluice_flow::limiter::MAX_WEIGHT;
use sluice_flow::{RulePattern, WeightChange};

fn listed(overrides: &std::collections::BTreeMap<String, NonZeroU32>) -> ListWeightsResponse {
    ListWeightsResponse {
        overrides: overrides
            .iter()
            .map(|(counter, weight)| WeightOverride {
                counter: counter.clone(),
                weight: weight.get(),
            })
            .collect(),
    }
}

/// Every weight override.
#[utoipa::path(get, path = "/limits/weights", tag = "limits", operation_id = "list_weight_overrides",
    responses((status = 200, body = ListWeightsResponse)))]
pub async fn list(State(state): State<Arc<AdminState>>) -> Json<ListWeightsResponse> {
    Json(listed(state.rules.book().weight_overrides()))
}

/// Sets or removes weight overrides, all or none; answers every override after.
#[utoipa::path(put, path = "/limits/weights", tag = "limits", operation_id = "set_weight_overrides",
    request_body = Vec<SetWeightRequest>,
    responses((status = 200, body = ListWeightsResponse),
        (status = 422, description = "A counter that is not one, a weight out of range, or too many overrides; nothing changed.")))]
pub async fn set(
    State(state): State<Arc<AdminState>>,
    Json(requests): Json<Vec<SetWeightRequest>>,
) -> Result<Json<ListWeightsResponse>, AdminError> {
    let changes = requests
        .iter()
        .map(change_of)
        .collect::<Result<Vec<_>, _>>()?;
    let overrides = state.rules.set_weights(&changes).map_err(refused)?;
    Ok(Json(listed(&overrides)))
}

fn change_of(request: &SetWeightRequest) -> Result<WeightChange, AdminError> {
    let counter = RulePattern::parse(&request.counter)
        .map_err(|e| AdminError::coded(Code::RUL0001, e.to_string()))?;
    let weight = match request.weight {
        None => None,
        Some(n) => Some(
            valid_weight(n)
                .ok_or_else(|| {
                    AdminError::coded(
                        Code::RUL0001,
                        format!(
                            "counter '{}': weight must be 1-{MAX_WEIGHT}, not {n}; null removes the override",
                            request.counter
                        ),
                    )
                })?,
        ),
    };
    Ok(WeightChange { counter, weight })
}
