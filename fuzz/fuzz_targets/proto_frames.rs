//! Arbitrary bytes on a proto channel: every message type must decode or fail cleanly,
//! whole frames or split at any point, and never allocate past the frame cap. A message
//! that decodes is one the encoder writes: encoded again it is no longer than the input
//! (the encoding is the shortest), and decodes to the same message. `Request` covers the
//! supervisor's whole decoder of what fronts send: the `Api` envelope (at most one nested inside another: a third
//! ends the decoding) and the typed bodies inside it (`Run`, `ServeLayer`, `SetLimits`).
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use proto::front::{Hello, HelloReply, Reply, Request};
use proto::launch::{FromLauncher, ToLauncher};
use proto::mcp::{McpReply, McpRequest};
use proto::FrameBuf;
use serde::de::DeserializeOwned;
use serde::Serialize;

fn round_trip<T: Serialize + DeserializeOwned + PartialEq + Debug>(data: &[u8]) -> Option<T> {
    let msg = proto::codec::decode::<T>(data).ok()?;
    let again = proto::codec::encode(&msg).expect("a decoded message encodes");
    assert!(
        again.len() <= data.len(),
        "{msg:?}: {} bytes from {}",
        again.len(),
        data.len()
    );
    let back = proto::codec::decode::<T>(&again).expect("an encoded message decodes");
    assert_eq!(back, msg);
    Some(msg)
}

/// How many `Api` envelopes are nested in a request.
fn envelopes(r: &Request) -> usize {
    match r {
        Request::Api { request, .. } => 1 + envelopes(request),
        _ => 0,
    }
}

fuzz_target!(|data: &[u8]| {
    round_trip::<ToLauncher>(data);
    round_trip::<FromLauncher>(data);
    round_trip::<Hello>(data);
    round_trip::<HelloReply>(data);
    if let Some(r) = round_trip::<Request>(data) {
        assert!(envelopes(&r) <= 2, "{r:?}");
    }
    round_trip::<Reply>(data);
    round_trip::<McpRequest>(data);
    round_trip::<McpReply>(data);
    let split = data.first().map_or(0, |b| *b as usize) % (data.len() + 1);
    let mut fb = FrameBuf::new(proto::launch::MAX_LAUNCH_FRAME);
    for part in [&data[..split], &data[split..]] {
        if fb.push(part).is_err() {
            return;
        }
        while let Ok(Some(_)) = fb.next_frame::<FromLauncher>() {}
    }
});
