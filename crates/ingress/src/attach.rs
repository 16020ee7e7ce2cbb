//! `GET /service/attach/{id}` (wait for the result) and `/service/output/{id}` (the result if
//! there is one, else 470), with the `/restate/…` and `/restate/invocation/{id}/…` aliases.

use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::api_keys::Binding;
use super::error::IngressError;
use super::invoke::{answer, with_ids};
use super::lookup::{TARGET_FORMS, TargetBody, checked_id, peek_for};
use super::path::TargetAction;
use super::reply;
use sluice_core::errors::Code;
use sluice_core::ids::InvocationId;
use sluice_runtime::discovery::manifest::OutputRules;
use sluice_runtime::registry::Registry;
use sluice_store::invocation::Target;
use sluice_store::invocation::identity::{in_scope, partition_key};

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
    // A stored answer is read in its connection's turn (HTTP/2: one stream at a time, none
    // past the connection's unsent bytes).
    super::connections::turn_to_read_answer().await?;
    let Some(sluice_runtime::partition::Peek {
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
            super::connections::end_turn();
            let waited =
                super::wait::while_connected(session, Some(max), state.runtime.outcome(id)).await;
            match waited {
                // A refused wait (SEC0008) answers with its code's status, anything else 503.
                Ok(outcome) => {
                    let outcome = outcome.map_err(IngressError::from)?;
                    super::connections::turn_to_read_answer().await?;
                    outcome
                }
                Err(super::wait::Ended::ClientGone) => return Err(super::wait::gone()),
                Err(super::wait::Ended::TimedOut) => return Err(not_ready(id, true)),
            }
        }
        None => return Err(not_ready(id, false)),
    };
    let rules = output_rules(&state.registry, &target);
    Ok(with_ids(answer(rules.as_ref(), outcome), id))
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
    let id = checked_id(target, caller)?;
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
