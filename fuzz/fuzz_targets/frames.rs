//! The `tcp` backend's frames: what an authenticated peer sends after the
//! handshake, split and decoded the way its reader does
//! (`ringraft_transport::fuzzing::read_frame_stream`: u32 LE length, at
//! most ~1 GiB, then a bincode `Frame` with no trailing bytes).
//!
//! Must hold: no panic; every frame read encodes back to a body that
//! decodes to the same frame, and re-framed, the frames read back alike
//! up to the end of the stream.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringraft_transport::fuzzing::{WireFrame, read_frame_stream};

fuzz_target!(|input: &[u8]| {
    let (frames, reason) = read_frame_stream(input);
    assert!(!reason.is_empty());
    let mut framed = Vec::new();
    for frame in &frames {
        let body = frame.encode();
        assert_eq!(
            WireFrame::decode(&body).as_ref(),
            Ok(frame),
            "a frame read back differs"
        );
        frame.encode_framed(&mut framed);
    }
    let (again, why) = read_frame_stream(&framed);
    assert_eq!(again, frames);
    assert_eq!(why, "end of stream");
});
