//! Signals: awakeables completed over the ingress or by another handler (CompleteAwakeable),
//! and SendSignal between invocations. A signal is a notification appended to the target's
//! journal; a waiting target is attempted again to see it.

use super::{Effect, Partition};
use crate::errors::{Code, CodedError};
use crate::ids::{AwakeableId, InvocationId};
use crate::invocation::Status;
use crate::protocol::Message;
use crate::protocol::proto::{
    self, complete_awakeable_command_message, notification_template, send_signal_command_message,
};
use crate::storage::writer::WriteSet;

/// A signal for an invocation.
#[derive(Debug, Clone)]
pub struct Signal {
    /// The invocation it is for.
    pub target: InvocationId,
    /// Which signal.
    pub id: notification_template::Id,
    /// Its payload.
    pub result: notification_template::Result,
}

impl Signal {
    /// The signal an awakeable's completion is.
    pub fn awakeable(id: AwakeableId, result: notification_template::Result) -> Self {
        Self {
            target: id.invocation,
            id: notification_template::Id::SignalId(id.index),
            result,
        }
    }
}

/// The signal a SendSignal or CompleteAwakeable command sends; `None` for other messages.
pub fn sent_by(message: &Message) -> Option<Result<Signal, CodedError>> {
    let bad = |what: String| CodedError::new(Code::RT0017, what);
    match message {
        Message::CompleteAwakeable(c) => {
            let result = match &c.result {
                Some(complete_awakeable_command_message::Result::Value(v)) => {
                    notification_template::Result::Value(v.clone())
                }
                Some(complete_awakeable_command_message::Result::Failure(f)) => {
                    notification_template::Result::Failure(f.clone())
                }
                None => notification_template::Result::Void(proto::Void {}),
            };
            Some(
                c.awakeable_id
                    .parse::<AwakeableId>()
                    .map(|id| Signal::awakeable(id, result))
                    .map_err(bad),
            )
        }
        Message::SendSignal(s) => {
            let target = match s.target_invocation_id.parse::<InvocationId>() {
                Ok(target) => target,
                Err(e) => return Some(Err(bad(format!("SendSignal to a bad invocation id: {e}")))),
            };
            let id = match &s.signal_id {
                Some(send_signal_command_message::SignalId::Idx(i)) => {
                    notification_template::Id::SignalId(*i)
                }
                Some(send_signal_command_message::SignalId::Name(n)) => {
                    notification_template::Id::SignalName(n.clone())
                }
                None => return Some(Err(bad("SendSignal without a signal id".into()))),
            };
            let result = match &s.result {
                Some(send_signal_command_message::Result::Value(v)) => {
                    notification_template::Result::Value(v.clone())
                }
                Some(send_signal_command_message::Result::Failure(f)) => {
                    notification_template::Result::Failure(f.clone())
                }
                _ => notification_template::Result::Void(proto::Void {}),
            };
            Some(Ok(Signal { target, id, result }))
        }
        _ => None,
    }
}

/// The first signal index a handler's awakeable can have; lower ones are the runtime's own
/// (1 is cancellation).
pub const FIRST_AWAKEABLE_INDEX: u32 = 17;

/// What became of a signal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// Journaled for its invocation.
    Delivered,
    /// No such invocation.
    NoInvocation,
    /// Not journaled, for the reason given (RT0026).
    Refused(String),
}

/// The awakeable indexes already completed in `journal`, each with its notification's size.
fn completed_awakeables(
    journal: &[crate::protocol::Frame],
) -> impl Iterator<Item = (u32, usize)> + '_ {
    use prost::Message as _;
    journal
        .iter()
        .filter(|f| f.ty == SIGNAL_FRAME)
        .filter_map(|f| {
            let n = proto::NotificationTemplate::decode(f.payload.clone()).ok()?;
            Some((n, f.payload.len()))
        })
        .filter_map(|(n, len)| match n.id {
            Some(notification_template::Id::SignalId(i)) if i >= FIRST_AWAKEABLE_INDEX => {
                Some((i, len))
            }
            _ => None,
        })
}

/// About the size of `signal`'s notification as journaled: its payload, and room for the rest.
fn signal_len(signal: &Signal) -> usize {
    let payload = match &signal.result {
        notification_template::Result::Value(v) => v.content.len(),
        notification_template::Result::Failure(f) => f.message.len(),
        _ => 0,
    };
    payload.saturating_add(32)
}

/// The frame type of a signal notification.
const SIGNAL_FRAME: u16 = 0xFBFF;

impl Partition {
    /// Delivers `signal` to its invocation's journal. An awakeable completes once, and an
    /// invocation takes at most `ingress.max-awakeable-completions` of them: a client that
    /// forges awakeable ids cannot grow a journal without bound.
    pub(super) fn signal(
        &mut self,
        signal: Signal,
        writes: &mut WriteSet,
        effects: &mut Vec<Effect>,
    ) -> Delivery {
        let cap = self.config.ingress.max_awakeable_completions;
        let Some(live) = self.live.get_mut(&signal.target) else {
            // A completed invocation left memory but exists; it no longer listens.
            return match self.stored(signal.target).ok().flatten() {
                Some(_) => Delivery::Refused(format!(
                    "invocation {} has completed: its awakeables can no longer be completed",
                    signal.target
                )),
                None => Delivery::NoInvocation,
            };
        };
        if live.record.status == Status::Completed {
            return Delivery::Refused(format!(
                "invocation {} has completed: its awakeables can no longer be completed",
                signal.target
            ));
        }
        if let notification_template::Id::SignalId(index) = signal.id
            && index >= FIRST_AWAKEABLE_INDEX
        {
            let mut count = 0u32;
            let mut bytes = signal_len(&signal);
            for (done, len) in completed_awakeables(&live.journal) {
                bytes = bytes.saturating_add(len);
                if done == index {
                    return Delivery::Refused(format!(
                        "awakeable {index} of invocation {} was already completed: an awakeable completes once",
                        signal.target
                    ));
                }
                count = count.saturating_add(1);
            }
            if count >= cap {
                return Delivery::Refused(format!(
                    "invocation {} has taken {count} awakeable completions, the most it accepts (ingress.max-awakeable-completions)",
                    signal.target
                ));
            }
            let max_bytes = self
                .config
                .ingress
                .max_awakeable_completion_bytes
                .as_usize();
            if bytes > max_bytes {
                return Delivery::Refused(format!(
                    "invocation {} would hold {bytes} bytes of awakeable completions, more than it accepts ({max_bytes}, ingress.max-awakeable-completion-bytes)",
                    signal.target
                ));
            }
        }
        let signal_id = signal.id.clone();
        let frame = Message::Signal(proto::NotificationTemplate {
            id: Some(signal.id),
            result: Some(signal.result),
        })
        .to_frame(false);
        super::journal::append_signal(live, writes, frame, effects);
        // A suspension that does not wait on it stays suspended: forged completions of
        // awakeables nobody awaits cannot make it replay its journal again and again.
        let awaited = live
            .awaiting
            .as_ref()
            .is_none_or(|waits| waits.wants(&signal_id));
        if !live.running && live.record.status != Status::Paused && awaited {
            effects.push(Effect::Attempt(signal.target));
        }
        Delivery::Delivered
    }
}
