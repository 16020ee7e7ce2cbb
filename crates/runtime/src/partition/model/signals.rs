//! Signals: awakeables completed over the ingress or by another handler (CompleteAwakeable),
//! and SendSignal between invocations. A signal is a notification appended to the target's
//! journal; a waiting target is attempted again to see it.

use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::{AwakeableId, InvocationId};
use sluice_protocol::Message;
use sluice_protocol::proto::{
    self, complete_awakeable_command_message, notification_template, send_signal_command_message,
};

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
    /// Not journaled, for the reason given (AWK0001).
    Refused(String),
}

/// The awakeable indexes already completed in `journal`, each with its notification's size.
pub(in crate::partition) fn completed_awakeables(
    journal: &[sluice_protocol::Frame],
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
pub(in crate::partition) fn signal_len(signal: &Signal) -> usize {
    let payload = match &signal.result {
        notification_template::Result::Value(v) => v.content.len(),
        notification_template::Result::Failure(f) => f.message.len(),
        _ => 0,
    };
    payload.saturating_add(32)
}

/// The frame type of a signal notification.
const SIGNAL_FRAME: u16 = 0xFBFF;
