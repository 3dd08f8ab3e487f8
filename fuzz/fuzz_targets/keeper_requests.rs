//! Arbitrary bytes on the keeper's channel (`proto::keeper`): what the runtime asks
//! (`ToKeeper`) and what it is answered (`FromKeeper`) decode or fail cleanly, as whole
//! payloads and as frames capped at `MAX_KEEPER_FRAME`, read by an event loop's `FrameBuf`
//! (the bytes split anywhere) and by the blocking `read_frame`. A message that decodes
//! encodes again no longer than its input and decodes to itself; a frame decodes to what its
//! payload decodes to alone; the channel ends at the first frame over the cap or that does
//! not decode. Every request that decodes is then checked as the keeper takes it:
//! - its kind (the key of the keeper's table) is the variant it is;
//! - `is_slot_name` takes exactly 1 to 32 ASCII letters and digits, so a slot name taken
//!   has no '/', '.', NUL or whitespace;
//! - `keeper::table::admit` takes every kind while serving; while draining, never what
//!   starts new work (`ServeFunction`, `MakeRun`), and always what finishes or clears away
//!   what runs (stopping, killing, releasing, ending, removing, forgetting) and what a call
//!   in flight may need (a zygote made, a child placed or prepared);
//! - a keeper with no cgroup tree (`LocalKeeper::without_tree`, the `fuzzing` feature of
//!   zygo-monitor), serving and draining, refuses it with no descriptor beside the refusal,
//!   for the first reason the request gives: over a keeper frame, the phase, a name that is
//!   not one (a function or tenant name a folder could not be made of, a slot name), a
//!   function not served, an id it never issued, and only then the tree it does not have.
//!   A name it lets past its checks is one level of a path, and a function's folder is
//!   exactly `tenants/<owner>/<function>`. A request added to the protocol after these is
//!   checked as far as the table, and must be refused.
#![no_main]

use std::fmt::Debug;

use libfuzzer_sys::fuzz_target;
use proto::frame::PREFIX;
use proto::keeper::{
    is_slot_name, FnKey, FromKeeper, KeeperKind, ToKeeper, MAX_KEEPER_FRAME, MAX_SLOT_NAME,
};
use proto::{FrameBuf, ProtoError};
use serde::de::DeserializeOwned;
use serde::Serialize;
use zygo_monitor::keeper::table::{self, Phase, Violation};
use zygo_monitor::keeper::{cg_folder, LocalKeeper};

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

/// The frames of `T` in `data` as an event loop reads them: through a `FrameBuf` capped at
/// `MAX_KEEPER_FRAME`, the bytes arriving in two parts split at `split`. Each message taken
/// is the one its payload (at the offset the frames so far add up to) decodes to alone,
/// and is passed to `take`.
fn buffered_frames<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    data: &[u8],
    split: usize,
    mut take: impl FnMut(&T),
) {
    let mut fb = FrameBuf::new(MAX_KEEPER_FRAME);
    // Where the next frame starts in `data`.
    let mut at = 0;
    for (part, end) in [(&data[..split], split), (&data[split..], data.len())] {
        if let Err(e) = fb.push(part) {
            // Only a length over the cap is refused as it arrives.
            let len = declared(&data[at..]).expect("a refused frame has its prefix");
            assert!(
                matches!(e, ProtoError::TooLarge { len: l, max: MAX_KEEPER_FRAME } if l == len),
                "{e:?}"
            );
            assert!(len > MAX_KEEPER_FRAME);
            return;
        }
        loop {
            assert_eq!(fb.buffered(), end - at);
            let len = match fb.next_len() {
                Ok(Some(len)) => len,
                Ok(None) => break,
                // The frame after one taken declares a length over the cap: the channel ends.
                Err(_) => {
                    assert!(declared(&data[at..]).is_some_and(|l| l > MAX_KEEPER_FRAME));
                    return;
                }
            };
            assert_eq!(declared(&data[at..]), Some(len));
            if fb.buffered() < PREFIX + len {
                assert!(fb.partial());
                break;
            }
            let payload = &data[at + PREFIX..at + PREFIX + len];
            at += PREFIX + len;
            match fb.next_frame::<T>() {
                Ok(Some(msg)) => {
                    assert_eq!(round_trip::<T>(payload).as_ref(), Some(&msg));
                    take(&msg);
                }
                Ok(None) => panic!("a whole frame of {len} bytes was not taken"),
                Err(_) => {
                    assert!(proto::codec::decode::<T>(payload).is_err());
                    return;
                }
            }
        }
    }
}

/// The frames of `T` in `data` as a blocking reader reads them (`read_frame`, capped at
/// `MAX_KEEPER_FRAME`), until the first that fails; each message taken is the one its
/// payload decodes to alone, and is passed to `take`.
fn read_frames<T: Serialize + DeserializeOwned + PartialEq + Debug>(
    data: &[u8],
    mut take: impl FnMut(&T),
) {
    let mut r = data;
    loop {
        let at = data.len() - r.len();
        let got = proto::read_frame::<_, T>(&mut r, MAX_KEEPER_FRAME);
        let len = declared(&data[at..]);
        match got {
            Ok(msg) => {
                let len = len.expect("a frame read has its prefix");
                assert_eq!(data.len() - r.len(), at + PREFIX + len);
                let payload = &data[at + PREFIX..at + PREFIX + len];
                assert_eq!(round_trip::<T>(payload).as_ref(), Some(&msg));
                take(&msg);
            }
            Err(ProtoError::Closed) => {
                assert_eq!(at, data.len());
                return;
            }
            Err(ProtoError::Truncated { got, want }) => {
                assert!(r.is_empty() && got < want, "{got} of {want}");
                assert!(len.is_none_or(|l| l <= MAX_KEEPER_FRAME));
                return;
            }
            Err(ProtoError::TooLarge { len: l, max }) => {
                assert_eq!(max, MAX_KEEPER_FRAME);
                assert_eq!(Some(l), len);
                assert!(l > MAX_KEEPER_FRAME);
                return;
            }
            Err(e @ (ProtoError::Decode(_) | ProtoError::TrailingBytes { .. })) => {
                let len = len.expect("a frame read has its prefix");
                let payload = &data[at + PREFIX..at + PREFIX + len];
                assert!(proto::codec::decode::<T>(payload).is_err(), "{e}");
                return;
            }
            Err(e) => panic!("reading from memory: {e}"),
        }
    }
}

/// The payload length a frame at the start of `bytes` declares, once its prefix is there.
fn declared(bytes: &[u8]) -> Option<usize> {
    let prefix: [u8; PREFIX] = bytes.get(..PREFIX)?.try_into().ok()?;
    Some(u32::from_le_bytes(prefix) as usize)
}

/// Whether a request's kind is the variant it is: its name is the variant's.
fn kind_is_variant(req: &ToKeeper) -> bool {
    let (kind, shown) = (format!("{:?}", req.kind()), format!("{req:?}"));
    shown
        .strip_prefix(&kind)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(" {"))
}

/// The kinds the keeper refuses while draining: new work.
fn refused_while_draining(kind: KeeperKind) -> bool {
    matches!(kind, KeeperKind::ServeFunction | KeeperKind::MakeRun)
}

/// The kinds the keeper must take while draining: what finishes or clears away what runs,
/// and what a call in flight may need (a zygote replaced, a child parked or prepared).
fn taken_while_draining(kind: KeeperKind) -> bool {
    matches!(
        kind,
        KeeperKind::StopFunction
            | KeeperKind::MakeZygote
            | KeeperKind::PlaceInit
            | KeeperKind::PlaceSpare
            | KeeperKind::PrepareSlot
            | KeeperKind::KillSlot
            | KeeperKind::ReleaseSlot
            | KeeperKind::RemoveZygote
            | KeeperKind::ForgetTenant
            | KeeperKind::PlaceRunInit
            | KeeperKind::KillRun
            | KeeperKind::EndRun
    )
}

/// A slot name as `is_slot_name` must take it, written apart from it.
fn plain_slot_name(name: &str) -> bool {
    (1..=MAX_SLOT_NAME).contains(&name.chars().count())
        && name.chars().all(|c| c.is_ascii_alphanumeric())
}

fn check_slot_name(name: &str) {
    let taken = is_slot_name(name);
    assert_eq!(taken, plain_slot_name(name), "{name:?}");
    if taken {
        assert!(
            !name
                .chars()
                .any(|c| matches!(c, '/' | '.' | '\0') || c.is_whitespace()),
            "{name:?}"
        );
    }
}

/// A name the keeper may make one level of a path of: not empty, no separator, not `.` or
/// `..`, no NUL, whitespace or control character.
fn one_level(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name
            .chars()
            .any(|c| c == '/' || c.is_whitespace() || c.is_control())
}

/// Why a keeper with no cgroup tree refuses a request.
#[derive(Debug, PartialEq)]
enum Why {
    /// Over a keeper frame, encoded.
    Wire,
    Phase(Violation),
    BadName(&'static str, String),
    /// A function key (`name` or `tenant/name`) the keeper does not serve.
    NotServed(String),
    NoZygote(u64),
    NoSlot(u64),
    NoRun(u64),
    /// Everything checked: what it asks needs the tree this keeper does not have.
    NoTree,
}

/// The function key's first bad name, if any (as the keeper checks it: the name, then the
/// tenant).
fn bad_fn_key(f: &FnKey) -> Option<Why> {
    if policy::file::check_fn_name(&f.name, None).is_err() {
        return Some(Why::BadName("function name", f.name.clone()));
    }
    match &f.tenant {
        Some(t) if !proto::api::is_tenant_id(t) => Some(Why::BadName("tenant id", t.clone())),
        _ => None,
    }
}

/// The function a request names, if it names one.
fn function_of(req: &ToKeeper) -> Option<&FnKey> {
    match req {
        ToKeeper::ServeFunction { function, .. }
        | ToKeeper::StopFunction { function }
        | ToKeeper::MakeZygote { function, .. } => Some(function),
        _ => None,
    }
}

/// The key a function is served under: `name`, or `tenant/name` for a tenant's.
fn key_of(f: &FnKey) -> String {
    match &f.tenant {
        Some(t) => format!("{t}/{}", f.name),
        None => f.name.clone(),
    }
}

/// Why a keeper with no tree in `phase`, which serves nothing and issued no id, refuses
/// `req`, when this target knows (`None`: a kind added after it).
fn expected(req: &ToKeeper, phase: Phase) -> Option<Why> {
    let encoded = proto::codec::encode(req).expect("a decoded request encodes");
    if encoded.len() > MAX_KEEPER_FRAME {
        return Some(Why::Wire);
    }
    if let Err(v) = table::admit(phase, req.kind()) {
        return Some(Why::Phase(v));
    }
    if let Some(f) = function_of(req) {
        if let Some(bad) = bad_fn_key(f) {
            return Some(bad);
        }
        return Some(match req {
            ToKeeper::MakeZygote { .. } => Why::NotServed(key_of(f)),
            _ => Why::NoTree,
        });
    }
    match req {
        ToKeeper::PlaceSpare { slot, .. } if !is_slot_name(slot) => {
            Some(Why::BadName("slot name", slot.clone()))
        }
        ToKeeper::PlaceInit { zygote, .. }
        | ToKeeper::PlaceSpare { zygote, .. }
        | ToKeeper::RemoveZygote { zygote } => Some(Why::NoZygote(zygote.0)),
        ToKeeper::PrepareSlot { slot, .. }
        | ToKeeper::KillSlot { slot }
        | ToKeeper::ReleaseSlot { slot } => Some(Why::NoSlot(slot.0)),
        ToKeeper::ForgetTenant { tenant } if !proto::api::is_tenant_id(tenant) => {
            Some(Why::BadName("tenant id", tenant.clone()))
        }
        ToKeeper::ForgetTenant { .. } => Some(Why::NoTree),
        ToKeeper::MakeRun {
            tenant: Some(t), ..
        } if !proto::api::is_tenant_id(t) => Some(Why::BadName("tenant id", t.clone())),
        ToKeeper::MakeRun { .. } => Some(Why::NoTree),
        ToKeeper::PlaceRunInit { run, .. }
        | ToKeeper::KillRun { run }
        | ToKeeper::EndRun { run, .. } => Some(Why::NoRun(run.0)),
        _ => None,
    }
}

/// Whether `why` (a refusal's text) says `want`.
fn says(why: &str, want: &Why) -> bool {
    match want {
        Why::Wire => why.starts_with("the request does not cross the wire: "),
        Why::Phase(v) => why == v.to_string(),
        Why::BadName(what, name) => why == format!("{name:?} is not a {what}"),
        Why::NotServed(key) => why == format!("{key} is not served"),
        Why::NoZygote(id) => why == format!("no zygote {id}"),
        Why::NoSlot(id) => why == format!("no slot {id}"),
        Why::NoRun(id) => why == format!("no run {id}"),
        Why::NoTree => why.starts_with("reach the cgroup tree: "),
    }
}

/// The two keepers with no cgroup tree, one serving and one draining, that every request
/// decoded is sent to.
struct Keepers {
    serving: LocalKeeper,
    draining: LocalKeeper,
}

impl Keepers {
    fn new() -> Keepers {
        let mut draining = LocalKeeper::without_tree();
        draining.begin_drain();
        Keepers {
            serving: LocalKeeper::without_tree(),
            draining,
        }
    }

    fn check(&mut self, req: &ToKeeper) {
        let kind = req.kind();
        assert!(kind_is_variant(req), "{kind:?}: {req:?}");

        if let Some(function) = function_of(req) {
            check_slot_name(&function.name);
            if let Some(t) = &function.tenant {
                check_slot_name(t);
            }
        }
        match req {
            ToKeeper::PlaceSpare { slot, .. } => check_slot_name(slot),
            ToKeeper::PrepareSlot {
                tenant: Some(t), ..
            }
            | ToKeeper::MakeRun {
                tenant: Some(t), ..
            }
            | ToKeeper::ForgetTenant { tenant: t } => check_slot_name(t),
            _ => {}
        }

        assert_eq!(table::admit(Phase::Serving, kind), Ok(()));
        let draining = table::admit(Phase::Draining, kind);
        if refused_while_draining(kind) {
            assert_eq!(draining, Err(Violation::WrongPhase(kind, Phase::Draining)));
        } else if taken_while_draining(kind) {
            assert_eq!(draining, Ok(()), "{kind:?}");
        } else if let Err(v) = draining {
            assert_eq!(v, Violation::WrongPhase(kind, Phase::Draining));
        }

        for (keeper, phase) in [
            (&mut self.serving, Phase::Serving),
            (&mut self.draining, Phase::Draining),
        ] {
            let want = expected(req, phase);
            if matches!(want, Some(Why::NotServed(_) | Why::NoTree)) {
                names_are_one_level(req);
            }
            let answer = keeper.call(req.clone());
            assert!(answer.view.is_none() && answer.files.is_empty(), "{req:?}");
            match (&answer.reply, &want) {
                (FromKeeper::Refused { why }, Some(want)) => {
                    assert!(says(why, want), "{phase:?} {req:?}: {why:?}, not {want:?}")
                }
                (FromKeeper::Refused { .. }, None) => {}
                (other, _) => panic!("{phase:?} {req:?}: {other:?} from a keeper with no tree"),
            }
            assert!(keeper.events().is_empty());
        }
    }
}

/// A request the keeper lets past its name checks names one folder level per name, and a
/// function's folder is `tenants/<owner>/<function>`.
fn names_are_one_level(req: &ToKeeper) {
    match req {
        ToKeeper::ServeFunction { function, .. }
        | ToKeeper::StopFunction { function }
        | ToKeeper::MakeZygote { function, .. } => {
            assert!(one_level(&function.name), "{function:?}");
            if let Some(t) = &function.tenant {
                assert!(one_level(t) && t != "_host", "{function:?}");
            }
            let folder = cg_folder(&key_of(function));
            let levels: Vec<&str> = folder.split('/').collect();
            let owner = function.tenant.as_deref().unwrap_or("_host");
            assert_eq!(levels, ["tenants", owner, &function.name], "{function:?}");
        }
        ToKeeper::ForgetTenant { tenant }
        | ToKeeper::MakeRun {
            tenant: Some(tenant),
            ..
        } => assert!(one_level(tenant) && tenant != "_host", "{tenant:?}"),
        _ => {}
    }
}

fn check_answer(a: &FromKeeper) {
    match a {
        FromKeeper::Slot { slot, .. } | FromKeeper::PlaceFailed { slot, .. } => {
            check_slot_name(slot)
        }
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let mut keepers = Keepers::new();
    if let Some(req) = round_trip::<ToKeeper>(data) {
        keepers.check(&req);
    }
    if let Some(a) = round_trip::<FromKeeper>(data) {
        check_answer(&a);
    }
    let split = data.first().map_or(0, |b| *b as usize) % (data.len() + 1);
    buffered_frames::<ToKeeper>(data, split, |r| keepers.check(r));
    buffered_frames::<FromKeeper>(data, split, check_answer);
    read_frames::<ToKeeper>(data, |r| keepers.check(r));
    read_frames::<FromKeeper>(data, check_answer);
});
