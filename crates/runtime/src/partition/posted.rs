//! The events one partition posts to another (a child invocation, a call's result, a signal, a
//! forwarded control), as bytes: in cluster mode they travel through the inbox topic, because
//! the partition they are for may be led by another node (`docs/cluster.md`). Every one of them
//! may be delivered again after a failover, and each is harmless twice: a child has a derived
//! id, callers ignore a repeated result, a signal or control is answered from the state it
//! finds.

use prost::Message as _;
use serde::{Deserialize, Serialize};
use tokio::sync::oneshot;

use super::model::events::Event;
use super::model::operator::Control;
use super::model::signals::Signal;
use sluice_core::errors::{Code, CodedError};
use sluice_core::ids::InvocationId;
use sluice_protocol::Frame;
use sluice_protocol::proto::NotificationTemplate;
use sluice_store::invocation::{InvocationRecord, Outcome};

#[derive(Serialize, Deserialize)]
enum Posted {
    Submit {
        record: Box<InvocationRecord>,
        ty: u16,
        #[serde(with = "serde_bytes")]
        payload: Vec<u8>,
    },
    Signal {
        target: InvocationId,
        /// A `NotificationTemplate` with the signal's id and result.
        #[serde(with = "serde_bytes")]
        template: Vec<u8>,
    },
    Control {
        id: InvocationId,
        op: String,
    },
    CallResult {
        id: InvocationId,
        completion: u32,
        outcome: Outcome,
    },
}

fn control_name(op: Control) -> &'static str {
    match op {
        Control::Cancel => "cancel",
        Control::Kill => "kill",
        Control::Purge => "purge",
        Control::PurgeJournal => "purge-journal",
        Control::Pause => "pause",
        Control::Resume => "resume",
    }
}

/// The bytes of `event`; `None` for an event partitions do not post to each other.
pub fn encode(event: &Event) -> Option<Vec<u8>> {
    let posted = match event {
        Event::Submit {
            record,
            input,
            reply: None,
            call: None,
        } => Posted::Submit {
            record: record.clone(),
            ty: input.ty,
            payload: input.payload.to_vec(),
        },
        Event::Signal {
            signal,
            reply: None,
        } => Posted::Signal {
            target: signal.target,
            template: NotificationTemplate {
                id: Some(signal.id.clone()),
                result: Some(signal.result.clone()),
            }
            .encode_to_vec(),
        },
        Event::Control { id, op, .. } => Posted::Control {
            id: *id,
            op: control_name(*op).to_owned(),
        },
        Event::CallResult {
            id,
            completion,
            outcome,
        } => Posted::CallResult {
            id: *id,
            completion: *completion,
            outcome: outcome.clone(),
        },
        _ => return None,
    };
    // Bytes travel as bytes, not as lists of numbers.
    sluice_store::encoding::encode(&posted).ok()
}

fn bad(why: impl std::fmt::Display) -> CodedError {
    CodedError::new(
        Code::CLU0003,
        format!("an inbox record cannot be read: {why}"),
    )
}

/// The event `bytes` hold (at most `max` of them).
pub fn decode(bytes: &[u8], max: usize) -> Result<Event, CodedError> {
    if bytes.len() > max {
        return Err(bad(format!("{} bytes, more than {max}", bytes.len())));
    }
    // Events posted by an earlier version are JSON; they still read.
    let posted: Posted = sluice_store::encoding::decode(bytes).map_err(bad)?;
    Ok(match posted {
        Posted::Submit {
            record,
            ty,
            payload,
        } => Event::Submit {
            record,
            input: Frame {
                ty,
                ack: false,
                payload: payload.into(),
            },
            reply: None,
            call: None,
        },
        Posted::Signal { target, template } => {
            let template = NotificationTemplate::decode(template.as_slice()).map_err(bad)?;
            let (Some(id), Some(result)) = (template.id, template.result) else {
                return Err(bad("a signal without its id or result"));
            };
            Event::Signal {
                signal: Signal { target, id, result },
                reply: None,
            }
        }
        Posted::Control { id, op } => {
            let op = [
                Control::Cancel,
                Control::Kill,
                Control::Purge,
                Control::PurgeJournal,
                Control::Pause,
                Control::Resume,
            ]
            .into_iter()
            .find(|c| control_name(*c) == op)
            .ok_or_else(|| bad(format!("unknown control {op}")))?;
            // Nobody waits for a forwarded control's answer.
            let (reply, _) = oneshot::channel();
            Event::Control { id, op, reply }
        }
        Posted::CallResult {
            id,
            completion,
            outcome,
        } => Event::CallResult {
            id,
            completion,
            outcome,
        },
    })
}

/// Where posted events go in cluster mode: the inbox of their partition.
pub trait Outbox: Send + Sync + std::fmt::Debug {
    /// Sends `event` (encoded) to partition `partition`'s inbox; retries on its own.
    fn post(&self, partition: u32, event: Vec<u8>);

    /// [`Outbox::post`], answering `done` with `Ok(true)` once the inbox has the event, or
    /// with the error that kept it out.
    fn post_then(
        &self,
        partition: u32,
        event: Vec<u8>,
        done: tokio::sync::oneshot::Sender<Result<bool, CodedError>>,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_protocol::proto::notification_template;
    use sluice_store::invocation::Target;

    #[test]
    fn posted_events_round_trip() {
        let id = InvocationId::generate(7);
        let record = InvocationRecord::new(
            id,
            Target {
                service: "S".into(),
                handler: "h".into(),
                key: None,
            },
            1,
        );
        let events = [
            Event::Submit {
                record: Box::new(record),
                input: Frame {
                    ty: 0x0400,
                    ack: false,
                    payload: bytes::Bytes::from_static(b"in"),
                },
                reply: None,
                call: None,
            },
            Event::Signal {
                signal: Signal {
                    target: id,
                    id: notification_template::Id::SignalId(17),
                    result: notification_template::Result::Void(Default::default()),
                },
                reply: None,
            },
            Event::Control {
                id,
                op: Control::Kill,
                reply: oneshot::channel().0,
            },
            Event::CallResult {
                id,
                completion: 3,
                outcome: Outcome::Value(b"out".to_vec()),
            },
        ];
        for event in events {
            let bytes = encode(&event).expect("a posted event");
            let back = decode(&bytes, usize::MAX).unwrap();
            assert_eq!(encode(&back).unwrap(), bytes);
        }
        assert!(decode(b"{}", 10).is_err());
    }

    /// Bytes travel as bytes: a posted input or result costs its own size (plus a little), not
    /// four bytes a byte as a JSON list of numbers did.
    #[test]
    fn posted_bytes_are_bytes_not_lists_of_numbers() {
        let id = InvocationId::generate(7);
        let big: Vec<u8> = (0..1_000_000u32).map(|i| (i % 251) as u8).collect();
        let result = Event::CallResult {
            id,
            completion: 3,
            outcome: Outcome::Value(big.clone()),
        };
        let encoded = encode(&result).unwrap();
        assert!(encoded.len() < big.len() + 256, "{} bytes", encoded.len());
        assert!(encoded.windows(big.len()).any(|w| w == big.as_slice()));
        let mut submit = InvocationRecord::new(
            id,
            Target {
                service: "S".into(),
                handler: "h".into(),
                key: None,
            },
            1,
        );
        submit.outcome = Some(Outcome::Value(big.clone()));
        let encoded = encode(&Event::Submit {
            record: Box::new(submit),
            input: Frame {
                ty: 0x0400,
                ack: false,
                payload: bytes::Bytes::from(big.clone()),
            },
            reply: None,
            call: None,
        })
        .unwrap();
        assert!(
            encoded.len() < 2 * big.len() + 512,
            "{} bytes",
            encoded.len()
        );
    }

    /// An inbox written by the version before holds JSON events; they still read.
    #[test]
    fn json_events_from_before_still_read() {
        let id = InvocationId::generate(7);
        let json = format!(
            r#"{{"CallResult":{{"id":"{id}","completion":3,"outcome":{{"Value":[111,117,116]}}}}}}"#
        );
        match decode(json.as_bytes(), usize::MAX).unwrap() {
            Event::CallResult {
                completion,
                outcome,
                ..
            } => {
                assert_eq!(completion, 3);
                assert_eq!(outcome, Outcome::Value(b"out".to_vec()));
            }
            _ => panic!("a call result"),
        }
        assert!(decode(b"nonsense", 100).is_err());
    }
}
