//! Frames: an 8-byte big-endian header (u16 type, the requested-ack flag, u32 payload length)
//! followed by the protobuf payload. The decoder is incremental over a byte stream and checks a
//! frame's length against the size limit as soon as its header is in, so a hostile length
//! costs nothing: bytes are only buffered as they arrive.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use sluice_core::errors::{Code, CodedError};

/// Bytes in a frame header.
pub const HEADER_LEN: usize = 8;
/// The requested-ack flag (bit 47).
const ACK_FLAG: u64 = 1 << 47;

/// A decoded frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    /// Message type id.
    pub ty: u16,
    /// The sender asks for an acknowledgement.
    pub ack: bool,
    /// Payload length in bytes.
    pub len: u32,
}

impl FrameHeader {
    /// The header as sent on the wire.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut word = (u64::from(self.ty) << 48) | u64::from(self.len);
        if self.ack {
            word |= ACK_FLAG;
        }
        word.to_be_bytes()
    }

    /// Reads a header; reserved bits are ignored.
    pub fn from_bytes(bytes: [u8; HEADER_LEN]) -> Self {
        let word = u64::from_be_bytes(bytes);
        Self {
            ty: (word >> 48) as u16,
            ack: word & ACK_FLAG != 0,
            len: word as u32,
        }
    }
}

/// One message on the wire.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Message type id.
    pub ty: u16,
    /// The requested-ack flag.
    pub ack: bool,
    /// The protobuf payload.
    pub payload: Bytes,
}

impl Frame {
    /// Its encoded header and its payload, sharing the payload's bytes: together, what
    /// [`Self::encode`] writes.
    pub fn pieces(&self) -> (Bytes, Bytes) {
        let len = u32::try_from(self.payload.len()).expect("payloads are below 4 GiB");
        let header = FrameHeader {
            ty: self.ty,
            ack: self.ack,
            len,
        };
        (
            Bytes::copy_from_slice(&header.to_bytes()),
            Bytes::clone(&self.payload),
        )
    }

    /// Appends the frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        let len = u32::try_from(self.payload.len()).expect("payloads are below 4 GiB");
        let header = FrameHeader {
            ty: self.ty,
            ack: self.ack,
            len,
        };
        out.reserve(HEADER_LEN + self.payload.len());
        out.put_slice(&header.to_bytes());
        out.put_slice(&self.payload);
    }
}

/// Splits a byte stream into frames.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    limit: usize,
}

impl FrameDecoder {
    /// A decoder rejecting payloads over `limit` bytes (`message-size-limit`).
    pub fn new(limit: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            limit,
        }
    }

    /// Adds received bytes.
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// Bytes received but not yet returned as frames.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame; `Ok(None)` until enough bytes have arrived.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, CodedError> {
        let Some(head) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let header = FrameHeader::from_bytes(head.try_into().expect("8 bytes"));
        let len = header.len as usize;
        if len > self.limit {
            return Err(CodedError::new(
                Code::RT0003,
                format!(
                    "message of type {:#06x} is {len} bytes, over the message-size-limit of {} bytes",
                    header.ty, self.limit
                ),
            ));
        }
        if self.buf.len() < HEADER_LEN + len {
            return Ok(None);
        }
        self.buf.advance(HEADER_LEN);
        let payload = self.buf.split_to(len).freeze();
        Ok(Some(Frame {
            ty: header.ty,
            ack: header.ack,
            payload,
        }))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn header_layout_is_big_endian_type_flag_length() {
        let header = FrameHeader {
            ty: 0x0401,
            ack: true,
            len: 0x0102_0304,
        };
        assert_eq!(
            header.to_bytes(),
            [0x04, 0x01, 0x80, 0x00, 0x01, 0x02, 0x03, 0x04]
        );
        assert_eq!(FrameHeader::from_bytes(header.to_bytes()), header);
        // Reserved bits (e.g. the V1–V3 COMPLETED bit 32) are ignored.
        let legacy = FrameHeader::from_bytes([0, 3, 0, 1, 0, 0, 0, 0]);
        assert_eq!((legacy.ty, legacy.ack, legacy.len), (3, false, 0));
    }

    #[test]
    fn frames_arrive_in_pieces() {
        let mut wire = BytesMut::new();
        let a = Frame {
            ty: 0x0000,
            ack: false,
            payload: Bytes::from_static(b"start"),
        };
        let b = Frame {
            ty: 0x0403,
            ack: true,
            payload: Bytes::new(),
        };
        a.encode(&mut wire);
        b.encode(&mut wire);
        let mut decoder = FrameDecoder::new(1024);
        let mut got = Vec::new();
        for byte in wire.iter() {
            decoder.push(&[*byte]);
            while let Some(frame) = decoder.next_frame().unwrap() {
                got.push(frame);
            }
        }
        assert_eq!(got, vec![a, b]);
        assert_eq!(decoder.buffered(), 0);
    }

    #[test]
    fn a_hostile_length_is_rt0003_before_any_payload() {
        let mut decoder = FrameDecoder::new(32 * 1024 * 1024);
        decoder.push(&[0x04, 0x01, 0, 0, 0xFF, 0xFF, 0xFF, 0xFF]);
        let err = decoder.next_frame().unwrap_err();
        assert_eq!(err.code, Some(Code::RT0003));
        assert!(err.message.contains("4294967295 bytes"), "{err}");
        assert!(decoder.buffered() <= HEADER_LEN);
    }

    proptest! {
        #[test]
        fn any_split_of_a_stream_yields_the_same_frames(
            frames in prop::collection::vec((any::<u16>(), any::<bool>(), prop::collection::vec(any::<u8>(), 0..64)), 0..8),
            cuts in prop::collection::vec(1usize..16, 0..64),
        ) {
            let frames: Vec<Frame> = frames
                .into_iter()
                .map(|(ty, ack, payload)| Frame { ty, ack, payload: payload.into() })
                .collect();
            let mut wire = BytesMut::new();
            for f in &frames {
                f.encode(&mut wire);
            }
            let mut decoder = FrameDecoder::new(64);
            let mut got = Vec::new();
            let mut rest = &wire[..];
            let mut cuts = cuts.into_iter();
            while !rest.is_empty() {
                let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
                decoder.push(&rest[..n]);
                rest = &rest[n..];
                while let Some(frame) = decoder.next_frame().unwrap() {
                    got.push(frame);
                }
            }
            prop_assert_eq!(got, frames);
        }
    }
}
