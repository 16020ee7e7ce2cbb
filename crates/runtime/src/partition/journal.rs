//! Journaling what an attempt sends: commands and custom entries in order, the notifications
//! the runtime answers with (run, state, call-id completions), signals, and what a running bidi
//! attempt is told once the batch commits (notifications, CommandAck, ProposeRunCompletionAck).

use bytes::{Bytes, BytesMut};
use prost::Message as _;

use super::live::Live;
use super::model::effect::Effect;
use super::model::{calls, signals};
use crate::registry::Registry;
use sluice_core::errors::CodedError;
use sluice_protocol::message::Kind;
use sluice_protocol::proto::{self, notification_template, propose_run_completion_message};
use sluice_protocol::{Frame, Message, MessageType};
use sluice_store::invocation::store::{self, Timer};
use sluice_store::invocation::{InvocationRecord, state};
use sluice_store::storage::Store;
use sluice_store::storage::writer::WriteSet;

pub(super) fn append(live: &mut Live, writes: &mut WriteSet, frame: Frame) {
    if !live.unsaved {
        let index = u32::try_from(live.journal.len())
            .expect("journals are shorter than 2^32")
            .saturating_add(live.rested);
        store::put_entry(writes, live.record().id, index, &frame);
    }
    live.journal.push(frame);
}

/// Writes the record of `live`, and, if it was never stored, its whole journal with it: from
/// here on it is durable like any other invocation and every entry is written as it comes.
pub(super) fn save(live: &mut Live, writes: &mut WriteSet) -> Result<(), CodedError> {
    store::put_record(writes, live.record())?;
    save_journal(live, writes);
    Ok(())
}

/// Writes the whole journal of `live` if it was never stored; its record must follow in the
/// same write set.
pub(super) fn save_journal(live: &mut Live, writes: &mut WriteSet) {
    if std::mem::take(&mut live.unsaved) {
        store::put_journal(writes, live.record().id, &live.journal);
    }
}

/// Whether journaling `message` (acked or not) needs an unsaved invocation stored first: only
/// an Output nobody is told about may wait for the outcome's commit. Everything else is
/// acknowledged to the SDK, seen by others (state, calls, signals) or waited on (timers).
pub(super) fn needs_saved(message: &Message, ack: bool) -> bool {
    ack || !matches!(message, Message::Output(_))
}

pub(super) fn encoded(frame: &Frame) -> Bytes {
    let mut out = BytesMut::new();
    frame.encode(&mut out);
    out.freeze()
}

/// Journals a completion; a running bidi attempt receives it once it is durable.
pub(super) fn notify(
    live: &mut Live,
    writes: &mut WriteSet,
    frame: Frame,
    completion: u32,
    effects: &mut Vec<Effect>,
) {
    if let Some(running) = live.attempt_mut() {
        running.fresh.push(completion);
        if running.outbound.is_some() {
            effects.push(Effect::Deliver(
                live.record().id,
                live.attempt,
                encoded(&frame),
            ));
        }
    }
    append(live, writes, frame);
}

/// Journals a signal; a running attempt receives it (bidi) or is attempted again when it
/// suspends.
pub(super) fn append_signal(
    live: &mut Live,
    writes: &mut WriteSet,
    frame: Frame,
    effects: &mut Vec<Effect>,
) {
    if let Some(running) = live.attempt_mut() {
        running.signalled = true;
        if running.outbound.is_some() {
            effects.push(Effect::Deliver(
                live.record().id,
                live.attempt,
                encoded(&frame),
            ));
        }
    }
    append(live, writes, frame);
}

/// Sends a control message to a running bidi attempt after the batch commits.
fn reply(live: &mut Live, message: &Message, effects: &mut Vec<Effect>) {
    if live
        .attempt_mut()
        .is_some_and(|running| running.outbound.is_some())
    {
        effects.push(Effect::Deliver(
            live.record().id,
            live.attempt,
            encoded(&message.to_frame(false)),
        ));
    }
}

/// The object a keyed target addresses.
pub(super) fn object(record: &InvocationRecord) -> Option<state::Object<'_>> {
    record.target.key.as_deref().map(|key| state::Object {
        scope: record.scope.as_ref().map_or("", |s| s.as_str()),
        service: &record.target.service,
        key,
    })
}

/// What a journaled message may read besides its invocation: committed state (lazy reads), the
/// registry (for the calls it makes), and the time it arrived.
pub(super) struct Reads<'a> {
    pub store: &'a Store,
    pub registry: &'a Registry,
    /// `flow.inherit-scope`: calls that name no scope run under their caller's.
    pub inherit_scope: bool,
    pub now: u64,
}

/// Journals one message of an attempt and answers what it asks for.
pub(super) fn journal_message(
    reads: &Reads<'_>,
    live: &mut Live,
    writes: &mut WriteSet,
    message: Message,
    ack: bool,
    effects: &mut Vec<Effect>,
) -> Result<(), CodedError> {
    let Reads {
        store,
        registry,
        inherit_scope,
        now,
    } = *reads;
    let kind = MessageType::from_id(message.type_id()).map(MessageType::kind);
    // Reads see committed state: an object runs one exclusive handler at a time, and the SDK
    // answers reads of keys it wrote itself from its own cache.
    let answer = match object(live.record()) {
        Some(object) => object_state(store, object, writes, &message)?,
        None => None,
    };
    match &message {
        Message::ProposeRunCompletion(proposal) => {
            run_completion(live, writes, proposal, ack, effects);
            return Ok(());
        }
        Message::Sleep(sleep) => {
            let timer = Timer {
                at_ms: sleep.wake_up_time,
                invocation: live.record().id,
                completion: sleep.result_completion_id,
            };
            store::put_timer(writes, timer);
            effects.push(Effect::WakeAt(timer.invocation, timer.at_ms, Some(timer)));
        }
        _ => {}
    }
    if kind == Some(Kind::Command) {
        let index = live.commands;
        let signal = match signals::sent_by(&message) {
            Some(Ok(signal)) => Some(signal),
            Some(Err(e)) => {
                live.violate(e);
                return Ok(());
            }
            None => None,
        };
        let child =
            match calls::child_of(registry, inherit_scope, live.record(), index, &message, now) {
                Some(Ok(child)) => Some(child),
                Some(Err(e)) => {
                    // Nothing of the attempt from here on is kept; it is retried.
                    live.violate(e);
                    return Ok(());
                }
                None => None,
            };
        live.commands += 1;
        append(live, writes, message.to_frame(false));
        effects.extend(signal.map(Effect::Signal));
        if let Some((child, notification)) = child {
            let id = calls::id_notification(notification, child.record.id);
            notify(live, writes, id.to_frame(false), notification, effects);
            effects.push(Effect::Child(Box::new(child)));
        }
        if ack {
            let acked = Message::CommandAck(proto::CommandAckMessage {
                command_index: index,
            });
            reply(live, &acked, effects);
        }
    } else if matches!(message, Message::Custom { .. }) {
        append(live, writes, message.to_frame(false));
    }
    // A lazy read's completion follows its command in the journal.
    if let Some((completion, done)) = answer {
        notify(live, writes, done.to_frame(false), completion, effects);
    }
    Ok(())
}

/// Applies a state message of an object's attempt (set, clear, clear all) to `writes`, or
/// reads what a lazy one asks from the committed state: the completion that answers it.
fn object_state(
    store: &Store,
    object: state::Object<'_>,
    writes: &mut WriteSet,
    message: &Message,
) -> Result<Option<(u32, Message)>, CodedError> {
    Ok(match message {
        Message::SetState(set) => {
            let value = set
                .value
                .as_ref()
                .map(|v| v.content.as_ref())
                .unwrap_or_default();
            state::set(writes, object, &set.key, value);
            None
        }
        Message::ClearState(clear) => {
            state::clear(writes, object, &clear.key);
            None
        }
        Message::ClearAllState(_) => {
            state::clear_all(writes, object);
            None
        }
        Message::GetLazyState(get) => {
            let value = store.with_db(|db| state::get(db, object, &get.key))??;
            let result = match value {
                Some(content) => notification_template::Result::Value(proto::Value { content }),
                None => notification_template::Result::Void(proto::Void {}),
            };
            let done = Message::GetLazyStateCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(
                    get.result_completion_id,
                )),
                result: Some(result),
            });
            Some((get.result_completion_id, done))
        }
        Message::GetLazyStateKeys(get) => {
            let keys = store.with_db(|db| state::keys(db, object))??;
            let done = Message::GetLazyStateKeysCompletion(proto::NotificationTemplate {
                id: Some(notification_template::Id::CompletionId(
                    get.result_completion_id,
                )),
                result: Some(notification_template::Result::StateKeys(proto::StateKeys {
                    keys,
                })),
            });
            Some((get.result_completion_id, done))
        }
        _ => None,
    })
}

/// Completes a `run` the SDK proposes: the completion journaled, and either acknowledged (the
/// SDK asked for an ack) or sent back as the notification.
fn run_completion(
    live: &mut Live,
    writes: &mut WriteSet,
    proposal: &proto::ProposeRunCompletionMessage,
    ack: bool,
    effects: &mut Vec<Effect>,
) {
    let result = match &proposal.result {
        Some(propose_run_completion_message::Result::Value(v)) => {
            notification_template::Result::Value(proto::Value { content: v.clone() })
        }
        Some(propose_run_completion_message::Result::Failure(f)) => {
            notification_template::Result::Failure(f.clone())
        }
        None => notification_template::Result::Void(proto::Void {}),
    };
    let completion = proposal.result_completion_id;
    let done = Message::RunCompletion(proto::NotificationTemplate {
        id: Some(notification_template::Id::CompletionId(completion)),
        result: Some(result),
    });
    if ack {
        // The SDK asked for an ack instead of the notification itself.
        append(live, writes, done.to_frame(false));
        if let Some(running) = live.attempt_mut() {
            running.fresh.push(completion);
        }
        let acked = Message::ProposeRunCompletionAck(proto::ProposeRunCompletionAckMessage {
            completion_id: completion,
        });
        reply(live, &acked, effects);
    } else {
        notify(live, writes, done.to_frame(false), completion, effects);
    }
}

/// Whether the journal holds a notification for `completion` already.
pub(super) fn has_completion(journal: &[Frame], completion: u32) -> bool {
    journal.iter().any(|frame| {
        MessageType::from_id(frame.ty).map(MessageType::kind) == Some(Kind::Notification)
            && proto::NotificationTemplate::decode(Bytes::clone(&frame.payload))
                .is_ok_and(|n| n.id == Some(notification_template::Id::CompletionId(completion)))
    })
}
