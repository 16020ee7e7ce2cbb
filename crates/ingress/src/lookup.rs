//! Naming an invocation from outside the way attach, output, lookup and status do: a target
//! body (an id, a workflow run, an idempotent call), the id it names held to the caller's API
//! key, and the reads of that invocation that answer only a caller the key lets reach it.

use http::StatusCode;

use super::IngressState;
use super::api_keys::Binding;
use super::error::IngressError;
use sluice_core::ids::InvocationId;
use sluice_store::invocation::identity::{idempotent_id, in_scope, partition_key};

/// A partition that could not be asked: 503 with its code.
fn unavailable(e: sluice_core::errors::CodedError) -> IngressError {
    IngressError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        code: e.code,
        message: e.message,
        retry_after_s: None,
    }
}

/// What the partition knows of `id`, held to `caller`'s API key.
pub(super) async fn peek_for(
    state: &IngressState,
    id: InvocationId,
    caller: Option<&Binding>,
) -> Result<Option<sluice_runtime::partition::Peek>, IngressError> {
    let peek = state.runtime.peek(id).await.map_err(unavailable)?;
    held_to(caller, id, peek)
}

/// Like [`peek_for`], without a completed value's bytes: what a status answers.
pub(super) async fn peek_status_for(
    state: &IngressState,
    id: InvocationId,
    caller: Option<&Binding>,
) -> Result<Option<sluice_runtime::partition::Peek>, IngressError> {
    let peek = state.runtime.peek_status(id).await.map_err(unavailable)?;
    held_to(caller, id, peek)
}

/// `peek`, unless `caller`'s API key binds another scope than the invocation's.
fn held_to(
    caller: Option<&Binding>,
    id: InvocationId,
    peek: Option<sluice_runtime::partition::Peek>,
) -> Result<Option<sluice_runtime::partition::Peek>, IngressError> {
    if let (Some(caller), Some(peek)) = (caller, &peek) {
        caller.may_reach(id, peek.scope.as_deref())?;
    }
    Ok(peek)
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

/// The invocation a target names, its scope checked like a call's (an invalid one names no
/// invocation) and held to the caller's API key.
pub(super) fn checked_id(
    target: TargetBody,
    caller: Option<&Binding>,
) -> Result<InvocationId, IngressError> {
    let scope = match &target {
        TargetBody::Workflow { scope, .. } | TargetBody::IdempotentInvocation { scope, .. } => {
            scope.as_deref()
        }
        TargetBody::Invocation { .. } => None,
    };
    if let Some(scope) = scope {
        sluice_flow::Scope::parse(scope).map_err(IngressError::from)?;
    }
    target_id(&target.bound(caller)?)
}
