//! The Restate service protocol between Sluice and deployments: versions, message types, the
//! frame codec and the decoded messages.

pub mod codec;
pub mod message;
pub mod version;

/// Types generated from `proto/protocol.proto` (package `dev.restate.service.protocol`).
#[allow(missing_docs, clippy::all, clippy::pedantic)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/dev.restate.service.protocol.rs"));
}

pub use codec::{Frame, FrameDecoder, FrameHeader, HEADER_LEN};
pub use message::{Message, MessageType};
pub use version::ProtocolVersion;
