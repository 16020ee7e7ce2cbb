//! `…/status`: where an invocation is, answered at once (attach and output wait or need the
//! outcome). One coarse stage, as the reference server answers it since 1.8: `created`
//! (accepted, not started: queued, held by flow control, or a delayed send), `started`
//! (running, suspended, backing off or paused) or `completed`, with the failure when it failed.
//! `POST /service/status` takes one target body (the reference's form) or a list of targets
//! and ids, up to `ingress.max-status-targets`.

use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use serde::{Deserialize, Serialize};

use super::IngressState;
use super::attach::{TARGET_FORMS, TargetBody, target_id, unavailable};
use super::error::IngressError;
use super::invoke::with_ids;
use super::path::StatusQuery;
use super::reply;
use crate::ids::InvocationId;
use crate::invocation::{Outcome, Status};
use crate::partition::Peek;
use crate::partition::placement::Route;

/// The lifecycle stage a status answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// Accepted, not started yet.
    Created,
    /// Started and not finished.
    Started,
    /// Finished: succeeded, failed or killed.
    Completed,
}

impl Stage {
    /// The stage of an invocation in `status`.
    pub fn of(status: Status) -> Self {
        match status {
            Status::Pending | Status::Scheduled => Self::Created,
            Status::Running | Status::Suspended | Status::BackingOff | Status::Paused => {
                Self::Started
            }
            Status::Completed => Self::Completed,
        }
    }
}

/// A failed invocation's terminal error.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusError {
    /// Its code (the handler's, or 409 when it was killed or canceled).
    pub code: u16,
    /// Its message.
    pub message: String,
}

/// What `GET …/status` answers (and, in cluster mode, what another node's answer is read as).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusBody {
    /// Where the invocation is.
    pub stage: Stage,
    /// The terminal error, only when it completed with a failure.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<StatusError>,
}

impl StatusBody {
    /// The status of what a peek saw.
    pub fn of(peek: &Peek) -> Self {
        let error = match &peek.outcome {
            Some(Outcome::Failure(failure)) if peek.status == Status::Completed => {
                Some(StatusError {
                    code: failure.code,
                    message: failure.message.clone(),
                })
            }
            _ => None,
        };
        Self {
            stage: Stage::of(peek.status),
            error,
        }
    }
}

fn not_found(id: InvocationId) -> IngressError {
    IngressError {
        status: StatusCode::NOT_FOUND,
        code: None,
        message: format!("invocation {id} not found (never existed, or purged)"),
        retry_after_s: None,
    }
}

fn parse_id(text: &str) -> Result<InvocationId, IngressError> {
    text.parse()
        .map_err(|e| IngressError::bad_request(format!("bad invocation id '{text}': {e}")))
}

/// The invocation a status path names.
pub fn query_id(query: &StatusQuery) -> Result<InvocationId, IngressError> {
    let target = match query {
        StatusQuery::Id(id) => return parse_id(id),
        StatusQuery::Workflow { scope, name, key } => TargetBody::Workflow {
            workflow_name: name.clone(),
            workflow_key: key.clone(),
            scope: scope.clone(),
        },
        StatusQuery::Idempotent {
            scope,
            service,
            key,
            handler,
            idempotency_key,
        } => TargetBody::IdempotentInvocation {
            service: service.clone(),
            key: key.clone(),
            handler: handler.clone(),
            idempotency_key: idempotency_key.clone(),
            scope: scope.clone(),
        },
    };
    check_scope(&target)?;
    target_id(&target)
}

/// A scope in a status query is checked like a call's: an invalid one names no invocation.
fn check_scope(target: &TargetBody) -> Result<(), IngressError> {
    let scope = match target {
        TargetBody::Workflow { scope, .. } | TargetBody::IdempotentInvocation { scope, .. } => {
            scope.as_deref()
        }
        TargetBody::Invocation { .. } => None,
    };
    if let Some(scope) = scope {
        crate::flow::Scope::parse(scope).map_err(IngressError::from)?;
    }
    Ok(())
}

/// `GET …/status` of the invocation `id` (run here).
pub async fn of_id(
    state: &IngressState,
    id: InvocationId,
) -> Result<Response<Vec<u8>>, IngressError> {
    let peek = state
        .runtime
        .peek(id)
        .await
        .map_err(unavailable)?
        .ok_or_else(|| not_found(id))?;
    Ok(with_ids(
        reply::json(StatusCode::OK, &StatusBody::of(&peek)),
        id,
    ))
}

/// One entry of a `POST /service/status` list: a target body or an invocation id.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum Entry {
    Id(String),
    Target(TargetBody),
}

/// One answer of a `POST /service/status` list, in the order asked.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct ListedStatus {
    invocation_id: String,
    found: bool,
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    status: Option<StatusBody>,
}

/// The single invocation a `POST /service/status` body names, when it names one (the
/// reference's form); `None` for a list.
pub fn single_target(body: &[u8]) -> Result<Option<InvocationId>, IngressError> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| IngressError::bad_request(format!("bad status body: {e}; {LIST_FORMS}")))?;
    if value.is_array() {
        return Ok(None);
    }
    let target: TargetBody = serde_json::from_value(value)
        .map_err(|e| IngressError::bad_request(format!("bad target body: {e}; {TARGET_FORMS}")))?;
    check_scope(&target)?;
    target_id(&target).map(Some)
}

const LIST_FORMS: &str =
    "send one target body, or a list of target bodies and invocation ids (\"inv_…\")";

/// `POST /service/status` with a list: each entry's status, in order; an unknown one is
/// `"found": false`. A node in cluster mode asks the node leading an entry's partition.
pub async fn of_list(state: &IngressState, body: &[u8]) -> Result<Response<Vec<u8>>, IngressError> {
    let entries: Vec<serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| IngressError::bad_request(format!("bad status body: {e}; {LIST_FORMS}")))?;
    let max = state.config.ingress.max_status_targets;
    if entries.len() > max {
        return Err(IngressError::bad_request(format!(
            "{} targets asked at once; ingress.max-status-targets allows {max}: split the list",
            entries.len()
        )));
    }
    let mut ids = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let entry: Entry = serde_json::from_value(entry).map_err(|e| {
            IngressError::bad_request(format!("bad status entry {i}: {e}; {TARGET_FORMS}"))
        })?;
        let id = match entry {
            Entry::Id(text) => parse_id(&text),
            Entry::Target(target) => check_scope(&target).and_then(|()| target_id(&target)),
        }
        .map_err(|e| IngressError::bad_request(format!("bad status entry {i}: {}", e.message)))?;
        ids.push(id);
    }
    let mut answers = Vec::with_capacity(ids.len());
    for id in ids {
        let status = match state.runtime.route(id) {
            Route::Here => state
                .runtime
                .peek(id)
                .await
                .map_err(unavailable)?
                .map(|peek| StatusBody::of(&peek)),
            route => elsewhere(state, id, route).await?,
        };
        answers.push(ListedStatus {
            invocation_id: id.to_string(),
            found: status.is_some(),
            status,
        });
    }
    Ok(reply::json(StatusCode::OK, &answers))
}

/// The status of `id` from the node leading its partition.
async fn elsewhere(
    state: &IngressState,
    id: InvocationId,
    route: Route,
) -> Result<Option<StatusBody>, IngressError> {
    let not_here = |why: String| {
        IngressError::coded(
            crate::errors::Code::CLU0001,
            format!("the status of {id} is kept by another node: {why}; retry"),
        )
    };
    let Route::Elsewhere { ingress, .. } = route else {
        return Err(not_here("no node leads its partition right now".into()));
    };
    let answer = crate::cluster::relay::relay(
        &state.forwarder,
        &ingress,
        Method::GET,
        &format!("/restate/status/{id}"),
        &HeaderMap::new(),
        Bytes::new(),
    )
    .await
    .map_err(not_here)?;
    match answer.status {
        StatusCode::OK => {
            let body: StatusBody = serde_json::from_slice(&answer.body)
                .map_err(|e| not_here(format!("it answered an unreadable status ({e})")))?;
            Ok(Some(body))
        }
        StatusCode::NOT_FOUND => Ok(None),
        other => Err(not_here(format!("it answered {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invocation::{Failure, Target};

    fn peek(status: Status, outcome: Option<Outcome>) -> Peek {
        Peek {
            target: Target {
                service: "S".into(),
                handler: "h".into(),
                key: None,
            },
            status,
            outcome,
        }
    }

    #[test]
    fn every_status_has_its_stage() {
        let json = |p: &Peek| serde_json::to_value(StatusBody::of(p)).unwrap();
        for (status, stage) in [
            (Status::Pending, "created"),
            (Status::Scheduled, "created"),
            (Status::Running, "started"),
            (Status::Suspended, "started"),
            (Status::BackingOff, "started"),
            (Status::Paused, "started"),
        ] {
            assert_eq!(
                json(&peek(status, None)),
                serde_json::json!({"stage": stage})
            );
        }
        assert_eq!(
            json(&peek(
                Status::Completed,
                Some(Outcome::Value(b"1".to_vec()))
            )),
            serde_json::json!({"stage": "completed"})
        );
        let failed = peek(
            Status::Completed,
            Some(Outcome::Failure(Failure {
                code: 409,
                message: "killed".into(),
            })),
        );
        assert_eq!(
            json(&failed),
            serde_json::json!({"stage": "completed", "error": {"code": 409, "message": "killed"}})
        );
        // Another node's answer reads back as it was written.
        for p in [&failed, &peek(Status::Pending, None)] {
            let read: StatusBody = serde_json::from_value(json(p)).unwrap();
            assert_eq!(read, StatusBody::of(p));
        }
    }

    #[test]
    fn bodies_name_one_target_or_a_list() {
        let id = "inv_1aA6MMRWDzRL5BYD303UK7dAgFVoIHpF1T";
        let one = format!(r#"{{"target":"invocation","invocationId":"{id}"}}"#);
        assert_eq!(
            single_target(one.as_bytes()).unwrap().unwrap().to_string(),
            id
        );
        assert_eq!(single_target(b"[]").unwrap(), None);
        for bad in [
            &b"{"[..],
            br#"{"target":"nope"}"#,
            br#"{"target":"workflow","workflowName":"W","workflowKey":"k","scope":"bad scope!"}"#,
        ] {
            let err = single_target(bad).unwrap_err();
            assert_eq!(err.status, StatusCode::BAD_REQUEST);
        }
        let same = |scope: Option<&str>| {
            query_id(&StatusQuery::Workflow {
                scope: scope.map(str::to_owned),
                name: "W".into(),
                key: "k".into(),
            })
            .unwrap()
        };
        assert_ne!(same(None), same(Some("acme")), "a scope is part of the id");
    }
}
