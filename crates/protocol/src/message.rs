//! Message types of protocol V5–V7 and their decoding from frames. Types in the custom range
//! (`0xFC00..=0xFFFF`) are kept opaque; any other unknown type, a bad payload, or an ack flag
//! on a type that does not allow one is a protocol violation (RT0012).

use bytes::Bytes;
use prost::Message as _;

use super::codec::Frame;
use super::proto;
use super::version::ProtocolVersion;
use sluice_core::errors::{Code, CodedError};

/// First type id of the custom-entry range.
pub const CUSTOM_START: u16 = 0xFC00;

/// What part of the protocol a type belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Start, suspension, error, end, acks, run proposals.
    Control,
    /// Journal commands, written by the deployment (Input by the runtime).
    Command,
    /// Completions and signals, written by the runtime.
    Notification,
}

/// Who sends a message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// Sluice (the runtime).
    Runtime,
    /// The SDK in the deployment.
    Deployment,
}

macro_rules! messages {
    ($( $code:literal => $variant:ident($proto:ident), $kind:ident, $sender:ident, ack: $ack:literal; )*) => {
        /// A known message type.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum MessageType { $( #[doc = stringify!($proto)] $variant, )* }

        impl MessageType {
            /// The type of a wire id; `None` for unknown and custom ids.
            pub fn from_id(id: u16) -> Option<Self> {
                match id {
                    $( $code => Some(Self::$variant), )*
                    _ => None,
                }
            }

            /// The wire id.
            pub fn id(self) -> u16 {
                match self { $( Self::$variant => $code, )* }
            }

            /// The protobuf message name.
            pub fn name(self) -> &'static str {
                match self { $( Self::$variant => stringify!($proto), )* }
            }

            /// Control, command or notification.
            pub fn kind(self) -> Kind {
                match self { $( Self::$variant => Kind::$kind, )* }
            }

            /// Who sends it.
            pub fn sender(self) -> Sender {
                match self { $( Self::$variant => Sender::$sender, )* }
            }

            /// Whether the requested-ack flag may be set on it.
            pub fn allows_ack(self) -> bool {
                match self { $( Self::$variant => $ack, )* }
            }
        }

        /// A decoded message.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Message {
            $( #[doc = stringify!($proto)] $variant(proto::$proto), )*
            /// Type 0x0001 under V5/V6 (V7 uses [`Message::Suspension`]).
            SuspensionV6(proto::SuspensionMessageV6),
            /// A custom entry, kept as it came.
            Custom {
                /// Its type id (`0xFC00..=0xFFFF`).
                ty: u16,
                /// Its payload.
                payload: Bytes,
            },
        }

        impl Message {
            fn decode_known(ty: MessageType, payload: Bytes, version: ProtocolVersion) -> Result<Self, prost::DecodeError> {
                if ty == MessageType::Suspension && version < ProtocolVersion::V7 {
                    return proto::SuspensionMessageV6::decode(payload).map(Self::SuspensionV6);
                }
                match ty {
                    $( MessageType::$variant => proto::$proto::decode(payload).map(Self::$variant), )*
                }
            }

            /// The wire id of this message.
            pub fn type_id(&self) -> u16 {
                match self {
                    $( Self::$variant(_) => $code, )*
                    Self::SuspensionV6(_) => MessageType::Suspension.id(),
                    Self::Custom { ty, .. } => *ty,
                }
            }

            /// The bytes of its payload, without encoding it.
            pub fn encoded_len(&self) -> usize {
                match self {
                    $( Self::$variant(m) => m.encoded_len(), )*
                    Self::SuspensionV6(m) => m.encoded_len(),
                    Self::Custom { payload, .. } => payload.len(),
                }
            }

            fn payload(&self) -> Bytes {
                match self {
                    $( Self::$variant(m) => m.encode_to_vec().into(), )*
                    Self::SuspensionV6(m) => m.encode_to_vec().into(),
                    Self::Custom { payload, .. } => payload.clone(),
                }
            }
        }
    };
}

messages! {
    0x0000 => Start(StartMessage), Control, Runtime, ack: false;
    0x0001 => Suspension(SuspensionMessage), Control, Deployment, ack: false;
    0x0002 => Error(ErrorMessage), Control, Deployment, ack: false;
    0x0003 => End(EndMessage), Control, Deployment, ack: false;
    0x0004 => CommandAck(CommandAckMessage), Control, Runtime, ack: false;
    0x0005 => ProposeRunCompletion(ProposeRunCompletionMessage), Control, Deployment, ack: true;
    0x0006 => AwaitingOn(AwaitingOnMessage), Control, Deployment, ack: false;
    0x0007 => ProposeRunCompletionAck(ProposeRunCompletionAckMessage), Control, Runtime, ack: false;
    0x0400 => Input(InputCommandMessage), Command, Runtime, ack: true;
    0x0401 => Output(OutputCommandMessage), Command, Deployment, ack: true;
    0x0402 => GetLazyState(GetLazyStateCommandMessage), Command, Deployment, ack: true;
    0x0403 => SetState(SetStateCommandMessage), Command, Deployment, ack: true;
    0x0404 => ClearState(ClearStateCommandMessage), Command, Deployment, ack: true;
    0x0405 => ClearAllState(ClearAllStateCommandMessage), Command, Deployment, ack: true;
    0x0406 => GetLazyStateKeys(GetLazyStateKeysCommandMessage), Command, Deployment, ack: true;
    0x0407 => GetEagerState(GetEagerStateCommandMessage), Command, Deployment, ack: true;
    0x0408 => GetEagerStateKeys(GetEagerStateKeysCommandMessage), Command, Deployment, ack: true;
    0x0409 => GetPromise(GetPromiseCommandMessage), Command, Deployment, ack: true;
    0x040A => PeekPromise(PeekPromiseCommandMessage), Command, Deployment, ack: true;
    0x040B => CompletePromise(CompletePromiseCommandMessage), Command, Deployment, ack: true;
    0x040C => Sleep(SleepCommandMessage), Command, Deployment, ack: true;
    0x040D => Call(CallCommandMessage), Command, Deployment, ack: true;
    0x040E => OneWayCall(OneWayCallCommandMessage), Command, Deployment, ack: true;
    0x0410 => SendSignal(SendSignalCommandMessage), Command, Deployment, ack: true;
    0x0411 => Run(RunCommandMessage), Command, Deployment, ack: true;
    0x0412 => AttachInvocation(AttachInvocationCommandMessage), Command, Deployment, ack: true;
    0x0413 => GetInvocationOutput(GetInvocationOutputCommandMessage), Command, Deployment, ack: true;
    0x0414 => CompleteAwakeable(CompleteAwakeableCommandMessage), Command, Deployment, ack: true;
    0x8002 => GetLazyStateCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x8006 => GetLazyStateKeysCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x8009 => GetPromiseCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x800A => PeekPromiseCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x800B => CompletePromiseCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x800C => SleepCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x800D => CallCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x800E => CallInvocationIdCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x8011 => RunCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x8012 => AttachInvocationCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0x8013 => GetInvocationOutputCompletion(NotificationTemplate), Notification, Runtime, ack: false;
    0xFBFF => Signal(NotificationTemplate), Notification, Runtime, ack: false;
}

fn violation(message: String) -> CodedError {
    CodedError::new(Code::RT0012, message)
}

impl Message {
    /// The completion ids a command waits on: its result, and a call's invocation id. Empty
    /// for commands that complete at once and for everything else.
    pub fn awaited_completions(&self) -> Vec<u32> {
        match self {
            Self::GetLazyState(m) => vec![m.result_completion_id],
            Self::GetLazyStateKeys(m) => vec![m.result_completion_id],
            Self::GetPromise(m) => vec![m.result_completion_id],
            Self::PeekPromise(m) => vec![m.result_completion_id],
            Self::CompletePromise(m) => vec![m.result_completion_id],
            Self::Sleep(m) => vec![m.result_completion_id],
            Self::Call(m) => vec![m.invocation_id_notification_idx, m.result_completion_id],
            Self::OneWayCall(m) => vec![m.invocation_id_notification_idx],
            Self::Run(m) => vec![m.result_completion_id],
            Self::AttachInvocation(m) => vec![m.result_completion_id],
            Self::GetInvocationOutput(m) => vec![m.result_completion_id],
            _ => Vec::new(),
        }
    }

    /// Decodes a frame under the negotiated `version`.
    pub fn decode(frame: &Frame, version: ProtocolVersion) -> Result<Self, CodedError> {
        if frame.ty >= CUSTOM_START && MessageType::from_id(frame.ty).is_none() {
            if frame.ack {
                return Err(violation(format!(
                    "custom entry {:#06x} must not request an ack",
                    frame.ty
                )));
            }
            return Ok(Self::Custom {
                ty: frame.ty,
                payload: frame.payload.clone(),
            });
        }
        let Some(ty) = MessageType::from_id(frame.ty) else {
            return Err(violation(format!("unknown message type {:#06x}", frame.ty)));
        };
        if frame.ack && !ty.allows_ack() {
            return Err(violation(format!(
                "{} ({:#06x}) does not allow the ack flag",
                ty.name(),
                frame.ty
            )));
        }
        Self::decode_known(ty, frame.payload.clone(), version).map_err(|e| {
            violation(format!(
                "cannot decode {} ({:#06x}): {e}",
                ty.name(),
                frame.ty
            ))
        })
    }

    /// The frame carrying this message.
    pub fn to_frame(&self, ack: bool) -> Frame {
        Frame {
            ty: self.type_id(),
            ack,
            payload: self.payload(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(ty: u16, ack: bool, payload: Vec<u8>) -> Frame {
        Frame {
            ty,
            ack,
            payload: payload.into(),
        }
    }

    #[test]
    fn messages_round_trip_through_frames() {
        let start = Message::Start(proto::StartMessage {
            id: vec![7; 24].into(),
            debug_id: "inv_1".into(),
            known_entries: 1,
            key: "k".into(),
            random_seed: 42,
            scope: Some("acme".into()),
            ..Default::default()
        });
        let call = Message::Call(proto::CallCommandMessage {
            service_name: "Greeter".into(),
            handler_name: "greet".into(),
            parameter: Bytes::from_static(b"\"x\""),
            result_completion_id: 2,
            invocation_id_notification_idx: 1,
            ..Default::default()
        });
        for (msg, ack) in [(start, false), (call, true)] {
            let f = msg.to_frame(ack);
            assert_eq!(Message::decode(&f, ProtocolVersion::V7).unwrap(), msg);
        }
    }

    #[test]
    fn suspension_shape_depends_on_the_version() {
        let v6 = proto::SuspensionMessageV6 {
            waiting_completions: vec![1, 2],
            ..Default::default()
        };
        let f = frame(0x0001, false, v6.encode_to_vec());
        assert_eq!(
            Message::decode(&f, ProtocolVersion::V6).unwrap(),
            Message::SuspensionV6(v6)
        );
        let v7 = proto::SuspensionMessage {
            awaiting_on: Some(proto::Future {
                waiting_completions: vec![3],
                combinator_type: proto::CombinatorType::AllCompleted as i32,
                ..Default::default()
            }),
        };
        let f = frame(0x0001, false, v7.encode_to_vec());
        assert_eq!(
            Message::decode(&f, ProtocolVersion::V7).unwrap(),
            Message::Suspension(v7)
        );
    }

    #[test]
    fn custom_entries_stay_opaque() {
        let f = frame(0xFC01, false, vec![1, 2, 3]);
        let m = Message::decode(&f, ProtocolVersion::V6).unwrap();
        assert_eq!(m.to_frame(false), f);
        let err = Message::decode(&frame(0xFC01, true, vec![]), ProtocolVersion::V6).unwrap_err();
        assert_eq!(err.code, Some(Code::RT0012));
    }

    #[test]
    fn violations_are_rt0012() {
        let unknown =
            Message::decode(&frame(0x0999, false, vec![]), ProtocolVersion::V6).unwrap_err();
        assert_eq!(unknown.code, Some(Code::RT0012));
        assert!(
            unknown.message.contains("unknown message type 0x0999"),
            "{unknown}"
        );
        let bad_ack =
            Message::decode(&frame(0x0003, true, vec![]), ProtocolVersion::V6).unwrap_err();
        assert_eq!(bad_ack.code, Some(Code::RT0012));
        assert!(bad_ack.message.contains("EndMessage"), "{bad_ack}");
        let garbage = Message::decode(
            &frame(0x0401, false, vec![0xFF, 0xFF, 0xFF]),
            ProtocolVersion::V6,
        )
        .unwrap_err();
        assert_eq!(garbage.code, Some(Code::RT0012));
        assert!(
            garbage.message.contains("OutputCommandMessage"),
            "{garbage}"
        );
    }

    #[test]
    fn the_type_table_is_consistent() {
        for id in 0..=u16::MAX {
            if let Some(ty) = MessageType::from_id(id) {
                assert_eq!(ty.id(), id);
                let in_range = match ty.kind() {
                    Kind::Control => id < 0x0400,
                    Kind::Command => (0x0400..0x8000).contains(&id),
                    Kind::Notification => (0x8000..CUSTOM_START).contains(&id),
                };
                assert!(in_range, "{} at {id:#06x}", ty.name());
                if ty.kind() == Kind::Notification {
                    assert_eq!(ty.sender(), Sender::Runtime);
                }
            }
        }
    }
}
