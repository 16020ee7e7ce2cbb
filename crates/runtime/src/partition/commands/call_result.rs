//! Call result: a callee finished. Its outcome joins the caller's journal once (a repeat after
//! a failover finds it there) and a caller that waits is attempted again. Touches only the
//! caller.

use super::super::journal::{has_completion, notify};
use super::super::live::Live;
use super::super::model::effect::Effect;
use sluice_protocol::Message;
use sluice_protocol::proto::{self, notification_template};
use sluice_store::invocation::{Outcome, Status};
use sluice_store::storage::writer::WriteSet;

/// Journals `outcome` as the completion `completion` of `live`'s call.
pub(in super::super) fn call_result(
    live: &mut Live,
    completion: u32,
    outcome: Outcome,
    writes: &mut WriteSet,
    effects: &mut Vec<Effect>,
) {
    if live.record().status == Status::Completed || has_completion(&live.journal, completion) {
        return;
    }
    let result = match outcome {
        Outcome::Value(content) => notification_template::Result::Value(proto::Value {
            content: content.into(),
        }),
        Outcome::Failure(f) => notification_template::Result::Failure(proto::Failure {
            code: u32::from(f.code),
            message: f.message,
            metadata: Vec::new(),
        }),
    };
    let done = Message::CallCompletion(proto::NotificationTemplate {
        id: Some(notification_template::Id::CompletionId(completion)),
        result: Some(result),
    });
    notify(live, writes, done.to_frame(false), completion, effects);
    if !live.running() && live.record().status != Status::Paused {
        effects.push(Effect::Attempt(live.record().id));
    }
}
