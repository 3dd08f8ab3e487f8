//! Hostile-frame tests: every malformed input ends the channel with a named error.

use std::io::Cursor;

use crate::frame::{read_frame, write_frame, FrameBuf, ProtoError};
use crate::launch::{FromLauncher, Phase, ToLauncher, MAX_LAUNCH_FRAME};

fn framed(payload: &[u8]) -> Vec<u8> {
    let mut v = (payload.len() as u32).to_le_bytes().to_vec();
    v.extend_from_slice(payload);
    v
}

#[test]
fn round_trip() {
    let msg = FromLauncher::Failed {
        phase: Phase::Start,
        reason: "no such command".into(),
    };
    let mut buf = Vec::new();
    write_frame(&mut buf, &msg).expect("encode");
    let back: FromLauncher = read_frame(&mut Cursor::new(buf), MAX_LAUNCH_FRAME).expect("decode");
    assert_eq!(back, msg);
}

#[test]
fn clean_eof_is_closed() {
    let r: Result<ToLauncher, _> = read_frame(&mut Cursor::new(Vec::new()), MAX_LAUNCH_FRAME);
    assert!(matches!(r, Err(ProtoError::Closed)), "{r:?}");
}

#[test]
fn truncated_length_and_payload() {
    let r: Result<ToLauncher, _> = read_frame(&mut Cursor::new(vec![5, 0]), MAX_LAUNCH_FRAME);
    assert!(
        matches!(r, Err(ProtoError::Truncated { got: 2, want: 4 })),
        "{r:?}"
    );
    let mut whole = Vec::new();
    write_frame(&mut whole, &ToLauncher::Kill).expect("encode");
    let mut cut = framed(&[1, 2, 3, 4, 5, 6, 7]);
    cut.truncate(6);
    let r: Result<ToLauncher, _> = read_frame(&mut Cursor::new(cut), MAX_LAUNCH_FRAME);
    assert!(
        matches!(r, Err(ProtoError::Truncated { got: 2, want: 7 })),
        "{r:?}"
    );
}

#[test]
fn oversize_length_is_refused_before_allocation() {
    // 4 GiB - 1 announced; nothing behind it. Must fail on the length alone.
    let r: Result<ToLauncher, _> = read_frame(
        &mut Cursor::new(vec![0xff, 0xff, 0xff, 0xff]),
        MAX_LAUNCH_FRAME,
    );
    assert!(matches!(r, Err(ProtoError::TooLarge { .. })), "{r:?}");
    let mut fb = FrameBuf::new(MAX_LAUNCH_FRAME);
    let r = fb.push(&[0xff, 0xff, 0xff, 0x7f]);
    assert!(matches!(r, Err(ProtoError::TooLarge { .. })), "{r:?}");
}

#[test]
fn garbage_and_unknown_variant() {
    // Variant index 200 does not exist.
    let r: Result<ToLauncher, _> = read_frame(&mut Cursor::new(framed(&[200])), MAX_LAUNCH_FRAME);
    assert!(matches!(r, Err(ProtoError::Decode(_))), "{r:?}");
    let r: Result<FromLauncher, _> = read_frame(
        &mut Cursor::new(framed(&[3, 0xff, 0xff, 0xff, 0xff, 0xff])),
        MAX_LAUNCH_FRAME,
    );
    assert!(matches!(r, Err(ProtoError::Decode(_))), "{r:?}");
    // A string claiming a huge length inside a small frame.
    let r: Result<FromLauncher, _> = read_frame(
        &mut Cursor::new(framed(&[
            3, 1, 0xfd, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
        ])),
        MAX_LAUNCH_FRAME,
    );
    assert!(matches!(r, Err(ProtoError::Decode(_))), "{r:?}");
}

#[test]
fn trailing_bytes_are_refused() {
    // Variant 2 (Proceed, which carries nothing) followed by one extra byte.
    let r: Result<ToLauncher, _> = read_frame(&mut Cursor::new(framed(&[2, 0])), MAX_LAUNCH_FRAME);
    assert!(
        matches!(r, Err(ProtoError::TrailingBytes { extra: 1 })),
        "{r:?}"
    );
}

#[test]
fn framebuf_reassembles_split_frames() {
    let mut bytes = Vec::new();
    write_frame(&mut bytes, &FromLauncher::Started).expect("encode");
    write_frame(&mut bytes, &FromLauncher::Cloned { pid: 42 }).expect("encode");
    let mut fb = FrameBuf::new(MAX_LAUNCH_FRAME);
    let mut got = Vec::new();
    for b in &bytes {
        fb.push(std::slice::from_ref(b)).expect("push");
        while let Some(m) = fb.next_frame::<FromLauncher>().expect("next") {
            got.push(m);
        }
    }
    assert_eq!(
        got,
        vec![FromLauncher::Started, FromLauncher::Cloned { pid: 42 }]
    );
    assert!(matches!(fb.finish(), Err(ProtoError::Closed)));
    fb.push(&[9, 0]).expect("push");
    assert!(matches!(fb.finish(), Err(ProtoError::Truncated { .. })));
}

#[test]
fn random_bytes_never_panic() {
    // A small deterministic fuzz: arbitrary payloads must decode or fail, never panic.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 40) as usize;
        let payload: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
        let _: Result<ToLauncher, _> = crate::codec::decode(&payload);
        let _: Result<FromLauncher, _> = crate::codec::decode(&payload);
        let _: Result<crate::front::Hello, _> = crate::codec::decode(&payload);
    }
}

#[test]
fn a_small_frame_cannot_make_the_decoder_reserve_much() {
    // Ten bytes that declare an 80 MiB string: refused at the declaration.
    let mut payload = vec![252u8];
    payload.extend_from_slice(&(80u32 << 20).to_le_bytes());
    let err = crate::codec::decode::<String>(&payload).expect_err("a declared string");
    assert!(err.to_string().contains("Limit"), "{err}");
    // A message the encoder wrote decodes at any size, however its values grow in memory.
    let many: Vec<u64> = (0..50_000).map(|i| i % 100).collect();
    let bytes = crate::codec::encode(&many).expect("encode");
    assert_eq!(crate::codec::decode::<Vec<u64>>(&bytes).ok(), Some(many));
    let text = "x".repeat(3 << 20);
    let bytes = crate::codec::encode(&text).expect("encode");
    assert_eq!(crate::codec::decode::<String>(&bytes).ok(), Some(text));
}
