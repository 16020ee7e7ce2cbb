//! Set object state: an operator replaces the whole state of one virtual object or
//! workflow key. Touches nothing but the write set: acknowledged once stored.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::super::model::effect::Effect;
use sluice_core::errors::CodedError;
use sluice_store::invocation::state;
use sluice_store::storage::writer::WriteSet;

/// The writes that replace the state of `service`/`key` with `state`, and the answer.
pub(in super::super) fn set_object_state(
    service: &str,
    key: &str,
    new_state: &[(Bytes, Bytes)],
    reply: oneshot::Sender<Result<bool, CodedError>>,
    writes: &mut WriteSet,
) -> Effect {
    let object = state::Object {
        scope: "",
        service,
        key,
    };
    state::clear_all(writes, object);
    for (name, value) in new_state {
        state::set(writes, object, name, value);
    }
    Effect::Ack(reply, true)
}
