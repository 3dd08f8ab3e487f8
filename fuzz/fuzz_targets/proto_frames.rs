//! Arbitrary bytes on a proto channel: every message type must decode or fail cleanly,
//! whole frames or split at any point, and never allocate past the frame cap.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::front::{Hello, Reply, Request};
use proto::launch::{FromLauncher, ToLauncher};
use proto::mcp::{McpReply, McpRequest};
use proto::FrameBuf;

fuzz_target!(|data: &[u8]| {
    let _ = proto::codec::decode::<ToLauncher>(data);
    let _ = proto::codec::decode::<FromLauncher>(data);
    let _ = proto::codec::decode::<Hello>(data);
    let _ = proto::codec::decode::<Request>(data);
    let _ = proto::codec::decode::<Reply>(data);
    let _ = proto::codec::decode::<McpRequest>(data);
    let _ = proto::codec::decode::<McpReply>(data);
    let split = data.first().map_or(0, |b| *b as usize) % (data.len() + 1);
    let mut fb = FrameBuf::new(proto::launch::MAX_LAUNCH_FRAME);
    for part in [&data[..split], &data[split..]] {
        if fb.push(part).is_err() {
            return;
        }
        loop {
            match fb.next_frame::<FromLauncher>() {
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
    }
});
