//! `POST /service/awakeables/{id}/resolve|reject`: completes an awakeable. Resolve carries the
//! body as the value; reject carries it as the failure message (code 500). Answered 202 once
//! the signal is durable in the waiting invocation's journal.

use http::{Response, StatusCode};
use pingora::protocols::http::ServerSession;

use super::IngressState;
use super::api_keys::Binding;
use super::body::read_body_up_to;
use super::error::IngressError;
use super::lookup::peek_status_for;
use sluice_core::errors::Code;
use sluice_core::ids::AwakeableId;
use sluice_protocol::proto::{self, notification_template};
use sluice_runtime::partition::model::signals::{Delivery, FIRST_AWAKEABLE_INDEX, Signal};

/// Completes the awakeable `id`.
pub async fn complete(
    state: &IngressState,
    session: &mut ServerSession,
    id: &str,
    resolve: bool,
    caller: Option<&Binding>,
) -> Result<Response<Vec<u8>>, IngressError> {
    let id: AwakeableId = id.parse().map_err(IngressError::bad_request)?;
    if id.index < FIRST_AWAKEABLE_INDEX {
        return Err(IngressError::coded(
            Code::AWK0001,
            format!(
                "awakeable index {} is not one a handler creates (they start at {FIRST_AWAKEABLE_INDEX}): check the id",
                id.index
            ),
        ));
    }
    // A caller bound by its API key completes only its own scope's awakeables: the invocation
    // that waits is looked up first (its scope never changes), by its status alone (a
    // completed invocation's output is never read for it).
    if caller.is_some()
        && peek_status_for(state, id.invocation, caller)
            .await?
            .is_none()
    {
        return Err(no_invocation(&id));
    }
    let limit = state.config.ingress.awakeable_payload_limit;
    let body =
        read_body_up_to(session, limit.as_usize(), "ingress.awakeable-payload-limit").await?;
    let result = if resolve {
        notification_template::Result::Value(proto::Value { content: body })
    } else {
        notification_template::Result::Failure(proto::Failure {
            code: 500,
            message: String::from_utf8_lossy(&body).into_owned(),
            metadata: Vec::new(),
        })
    };
    let delivery = state
        .runtime
        .signal(Signal::awakeable(id, result))
        .await
        .map_err(|e| IngressError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            code: e.code,
            message: format!("{}; the awakeable was not completed, retry", e.message),
            retry_after_s: None,
        })?;
    match delivery {
        Delivery::Delivered => {}
        Delivery::NoInvocation => return Err(no_invocation(&id)),
        Delivery::Refused(why) => return Err(IngressError::coded(Code::AWK0001, why)),
    }
    Ok(Response::builder()
        .status(StatusCode::ACCEPTED)
        // Keeps the connection reusable (pingora needs the length).
        .header(http::header::CONTENT_LENGTH, 0)
        .body(Vec::new())
        .expect("a valid response"))
}

fn no_invocation(id: &AwakeableId) -> IngressError {
    IngressError::not_found(format!(
        "awakeable {id} belongs to invocation {}, which does not exist",
        id.invocation
    ))
}
