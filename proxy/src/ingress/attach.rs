//! `GET /service/attach/{id}` (wait for the result) and `/service/output/{id}` (the result if
//! there is one, else 470), with the `/restate/…` and `/restate/invocation/{id}/…` aliases.

use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::api_keys::Binding;
use super::error::IngressError;
use super::invoke::{answer, with_ids};
use super::path::TargetAction;
use super::reply;
use crate::discovery::manifest::OutputRules;
use crate::errors::Code;
use crate::ids::InvocationId;
use crate::invocation::Target;
use crate::invocation::identity::{idempotent_id, in_scope, partition_key};
use crate::registry::Registry;

pub(super) fn unavailable(e: crate::errors::CodedError) -> IngressError {
    IngressError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: e.code,
        message: e.message,
        retry_after_s: None,
    }
}

/// The output rules of the handler `target` runs, from its latest registration.
fn output_rules(registry: &Registry, target: &Target) -> Option<OutputRules> {
    let (_, deployment) = registry.service(&target.service).ok()?;
    deployment
        .handler(&target.service, &target.handler)?
        .output
        .clone()
}

/// Answers with the result of invocation `id`, waiting for it when `wait`; a caller bound to a
/// scope by its API key reaches only that scope's invocations.
pub async fn by_id(
    state: &IngressState,
    session: &mut ServerSession,
    id: &str,
    wait: bool,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let id: InvocationId = id
        .parse()
        .map_err(|e| IngressError::bad_request(format!("bad invocation id '{id}': {e}")))?;
    result(state, session, id, wait, caller).await
}

/// The id of the run of workflow `name` for `key`: unscoped, or in the scope of the caller's
/// API key (a key's holder names its workflows without their scope, as it calls them).
pub fn workflow_run(name: &str, key: &str, caller: Option<&Binding>) -> InvocationId {
    let scope = caller.map(|b| b.scope.as_str());
    in_scope(
        InvocationId::workflow_run(partition_key(&[name, key]), scope, name, key),
        scope,
    )
}

/// Answers with the result of the run of workflow `name` for `key`.
pub async fn by_workflow(
    state: &IngressState,
    session: &mut ServerSession,
    name: &str,
    key: &str,
    wait: bool,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    result(
        state,
        session,
        workflow_run(name, key, caller),
        wait,
        caller,
    )
    .await
}

/// What the runtime knows of `id`, refused to a caller whose API key binds another scope.
pub(super) async fn peek_for(
    state: &IngressState,
    id: InvocationId,
    caller: Option<&Binding>,
) -> Result<Option<crate::partition::Peek>, IngressError> {
    let peek = state.runtime.peek(id).await.map_err(unavailable)?;
    held_to(caller, id, peek)
}

/// Like [`peek_for`], without a completed value's bytes: what a status answers.
pub(super) async fn peek_status_for(
    state: &IngressState,
    id: InvocationId,
    caller: Option<&Binding>,
) -> Result<Option<crate::partition::Peek>, IngressError> {
    let peek = state.runtime.peek_status(id).await.map_err(unavailable)?;
    held_to(caller, id, peek)
}

/// `peek`, unless `caller`'s API key binds another scope than the invocation's.
fn held_to(
    caller: Option<&Binding>,
    id: InvocationId,
    peek: Option<crate::partition::Peek>,
) -> Result<Option<crate::partition::Peek>, IngressError> {
    if let (Some(caller), Some(peek)) = (caller, &peek) {
        caller.may_reach(id, peek.scope.as_deref())?;
    }
    Ok(peek)
}

fn not_ready(id: InvocationId, waited: bool) -> IngressError {
    let message = if waited {
        format!(
            "invocation {id} did not complete within ingress.attach-max-wait; attach again to go on waiting"
        )
    } else {
        format!("invocation {id} is not completed yet; attach to wait for it")
    };
    IngressError::coded(Code::ING0003, message)
}

async fn result(
    state: &IngressState,
    session: &mut ServerSession,
    id: InvocationId,
    wait: bool,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let Some(crate::partition::Peek {
        target, outcome, ..
    }) = peek_for(state, id, caller).await?
    else {
        return Err(IngressError::not_found(format!(
            "invocation {id} not found (never existed, or purged)"
        )));
    };
    let outcome = match outcome {
        Some(outcome) => outcome,
        None if wait => {
            // The client may wait as long as it stays, up to the attach bound; then it is
            // answered as `/output` answers an invocation that has not completed.
            let max = state.config.ingress.attach_max_wait.0;
            let waited =
                super::wait::while_connected(session, Some(max), state.runtime.outcome(id)).await;
            match waited {
                // A refused wait (SEC0008) answers with its code's status, anything else 503.
                Ok(outcome) => outcome.map_err(IngressError::from)?,
                Err(super::wait::Ended::ClientGone) => return Err(super::wait::gone()),
                Err(super::wait::Ended::TimedOut) => return Err(not_ready(id, true)),
            }
        }
        None => return Err(not_ready(id, false)),
    };
    let rules = output_rules(&state.registry, &target);
    Ok(with_ids(answer(rules.as_ref(), outcome), id))
}

/// The JSON body of `POST /service/attach|output|lookup|status`.
#[derive(Debug, serde::Deserialize)]
#[serde(
    tag = "target",
    rename_all = "camelCase",
    rename_all_fields = "camelCase"
)]
pub(super) enum TargetBody {
    Invocation {
        invocation_id: String,
    },
    Workflow {
        workflow_name: String,
        workflow_key: String,
        scope: Option<String>,
    },
    IdempotentInvocation {
        service: String,
        key: Option<String>,
        handler: String,
        idempotency_key: String,
        scope: Option<String>,
    },
}

/// `POST /service/attach|output|lookup` with a target body.
pub async fn by_target(
    state: &IngressState,
    session: &mut ServerSession,
    body: &[u8],
    action: TargetAction,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let target: TargetBody = serde_json::from_slice(body)
        .map_err(|e| IngressError::bad_request(format!("bad target body: {e}; {TARGET_FORMS}")))?;
    // A bad scope names no invocation: 400 RT0024, as a status by target answers.
    let id = super::status::checked_id(target, caller)?;
    match action {
        TargetAction::Attach => result(state, session, id, true, caller).await,
        TargetAction::Output => result(state, session, id, false, caller).await,
        TargetAction::Lookup => {
            if peek_for(state, id, caller).await?.is_none() {
                return Err(IngressError::not_found(format!(
                    "no invocation matches this target (it would be {id})"
                )));
            }
            Ok(with_ids(
                reply::json(
                    StatusCode::OK,
                    &serde_json::json!({"invocationId": id.to_string()}),
                ),
                id,
            ))
        }
    }
}

impl TargetBody {
    /// The target as a caller bound by its API key may name it: in the key's scope (named, or
    /// left out and taken from the key); another scope is refused (SEC0010) before anything is
    /// looked up. An invocation named by id is checked once its record is read.
    pub(super) fn bound(self, caller: Option<&Binding>) -> Result<Self, IngressError> {
        let Some(caller) = caller else {
            return Ok(self);
        };
        Ok(match self {
            Self::Invocation { .. } => self,
            Self::Workflow {
                workflow_name,
                workflow_key,
                scope,
            } => Self::Workflow {
                workflow_name,
                workflow_key,
                scope: Some(caller.scope_for(scope.as_deref())?),
            },
            Self::IdempotentInvocation {
                service,
                key,
                handler,
                idempotency_key,
                scope,
            } => Self::IdempotentInvocation {
                service,
                key,
                handler,
                idempotency_key,
                scope: Some(caller.scope_for(scope.as_deref())?),
            },
        })
    }
}

/// The forms a target body takes, as a bad one is told.
pub(super) const TARGET_FORMS: &str = "send {\"target\":\"invocation\",\"invocationId\":…}, {\"target\":\"workflow\",\"workflowName\":…,\"workflowKey\":…,\"scope\"?:…} or {\"target\":\"idempotentInvocation\",\"service\":…,\"key\"?:…,\"handler\":…,\"idempotencyKey\":…,\"scope\"?:…}";

/// The invocation a target body names.
pub(super) fn target_id(target: &TargetBody) -> Result<InvocationId, IngressError> {
    Ok(match target {
        TargetBody::Invocation { invocation_id } => invocation_id.parse().map_err(|e| {
            IngressError::bad_request(format!("bad invocation id '{invocation_id}': {e}"))
        })?,
        TargetBody::Workflow {
            workflow_name,
            workflow_key,
            scope,
        } => in_scope(
            InvocationId::workflow_run(
                partition_key(&[workflow_name, workflow_key]),
                scope.as_deref(),
                workflow_name,
                workflow_key,
            ),
            scope.as_deref(),
        ),
        TargetBody::IdempotentInvocation {
            service,
            key,
            handler,
            idempotency_key,
            scope,
        } => in_scope(
            idempotent_id(
                scope.as_deref(),
                service,
                key.as_deref(),
                handler,
                idempotency_key,
            ),
            scope.as_deref(),
        ),
    })
}
