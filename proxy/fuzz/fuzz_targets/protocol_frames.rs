//! The frame decoder and message decoding never panic on hostile bytes, and a frame's length
//! is checked against the limit before its payload is buffered.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_protocol::{FrameDecoder, HEADER_LEN, Message, ProtocolVersion};

const LIMIT: usize = 1024;

fuzz_target!(|data: &[u8]| {
    // The first byte picks how the stream is cut into reads.
    let Some((&chunk, stream)) = data.split_first() else {
        return;
    };
    let chunk = usize::from(chunk).max(1);
    let mut decoder = FrameDecoder::new(LIMIT);
    for piece in stream.chunks(chunk) {
        decoder.push(piece);
        loop {
            match decoder.next_frame() {
                Ok(Some(frame)) => {
                    assert!(frame.payload.len() <= LIMIT);
                    for version in [ProtocolVersion::V5, ProtocolVersion::V6, ProtocolVersion::V7] {
                        if let Ok(message) = Message::decode(&frame, version) {
                            let _ = message.to_frame(frame.ack);
                        }
                    }
                }
                Ok(None) => break,
                // A rejected length ends the stream, as it ends the attempt.
                Err(_) => return,
            }
        }
        assert!(decoder.buffered() < LIMIT + HEADER_LEN + chunk);
    }
});
