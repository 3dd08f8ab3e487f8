//! Writes the binary seeds under `seeds/` (the text ones are written by hand):
//! `cargo run --example make_seeds` in this folder. Each is a valid input of its target,
//! for libFuzzer to start from: proto payloads (the `Api` envelope around each typed
//! body, a hello, launcher frames), keeper requests and answers, DNS queries and a TLS
//! ClientHello.

use std::path::Path;

use proto::api::{Credentials, ServeKind};
use proto::front::{Hello, Request, Role, FRONT_PROTOCOL};
use proto::keeper::{FnKey, FromKeeper, LimitsMsg, RunId, SlotId, ToKeeper, UsageMsg, ZygoteId};
use proto::launch::FromLauncher;
use zygo_front::http::bodies::{layer, limits, run};

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    std::fs::create_dir_all(&dir).expect("make the seeds folder");
    std::fs::write(dir.join(name), bytes).expect("write a seed");
}

fn api(request: Request) -> Vec<u8> {
    let who = Credentials {
        token: Some("zygo_tok_0123456789abcdef".into()),
        tenant: Some("acme".into()),
    };
    proto::codec::encode(&Request::Api {
        who,
        request: Box::new(request),
    })
    .expect("encode")
}

/// A minimal ClientHello record naming `host` (as zygo-egress's sniff tests build it).
fn client_hello(host: &str) -> Vec<u8> {
    let name = host.as_bytes();
    let mut sni = Vec::new();
    sni.extend_from_slice(&((name.len() + 3) as u16).to_be_bytes());
    sni.push(0);
    sni.extend_from_slice(&(name.len() as u16).to_be_bytes());
    sni.extend_from_slice(name);
    let mut ext = Vec::new();
    ext.extend_from_slice(&0u16.to_be_bytes());
    ext.extend_from_slice(&(sni.len() as u16).to_be_bytes());
    ext.extend_from_slice(&sni);
    let mut body = vec![3, 3];
    body.extend_from_slice(&[7u8; 32]);
    body.push(0);
    body.extend_from_slice(&[0, 2, 0x13, 0x01]);
    body.extend_from_slice(&[1, 0]);
    body.extend_from_slice(&(ext.len() as u16).to_be_bytes());
    body.extend_from_slice(&ext);
    let mut hs = vec![1];
    hs.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend_from_slice(&(hs.len() as u16).to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

fn main() {
    let text = |name: &str| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("seeds/typed_bodies")
            .join(name);
        std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    let spec = run::parse(&text("run.json")).expect("the run seed parses");
    write("proto_frames", "api-run", &api(Request::Run { spec }));
    let layer = layer::parse(&text("layer.json")).expect("the layer seed parses");
    write(
        "proto_frames",
        "api-serve-layer",
        &api(Request::ServeLayer {
            name: "hello".into(),
            kind: ServeKind::Function,
            layer: Box::new(layer),
            base_dir: Some("/srv/app".into()),
        }),
    );
    let limits = limits::parse(&text("limits.json")).expect("the limits seed parses");
    write(
        "proto_frames",
        "api-set-limits",
        &api(Request::SetLimits {
            id: "acme".into(),
            limits,
        }),
    );
    write(
        "proto_frames",
        "api-put-deps",
        &api(Request::PutDeps {
            image: "host".into(),
            files: vec![("requirements.txt".into(), "six==1.16.0\n".into())],
        }),
    );
    write("proto_frames", "api-list", &api(Request::List));
    let hello = Hello {
        protocol: FRONT_PROTOCOL,
        role: Role::Api,
        flags: Default::default(),
    };
    write(
        "proto_frames",
        "hello",
        &proto::codec::encode(&hello).expect("encode"),
    );
    let frames = [
        FromLauncher::Ready,
        FromLauncher::Progress {
            slot: "s1".into(),
            text: "half way".into(),
        },
    ];
    let mut framed = Vec::new();
    for f in &frames {
        framed.extend(proto::encode_frame(f).expect("frame"));
    }
    write("proto_frames", "launcher-frames", &framed);

    keeper_seeds();

    let query = zygo_egress::dns::query_a("pypi.org", 0x1234).expect("a query");
    write("egress_sniff", "dns-query-a", &query);
    let mut aaaa = query.clone();
    let n = aaaa.len();
    aaaa[n - 3] = zygo_egress::dns::TYPE_AAAA as u8;
    write("egress_sniff", "dns-query-aaaa", &aaaa);
    write(
        "egress_sniff",
        "client-hello",
        &client_hello("files.pythonhosted.org"),
    );
}

/// The keeper's requests one by one, every kind of them as frames in one channel, and its
/// answers as frames.
fn keeper_seeds() {
    let limits = LimitsMsg {
        mem_bytes: Some(256 << 20),
        cpu_millis: 1000,
        pids: 64,
        io_bps: 1 << 20,
        io_iops: 100,
    };
    let host = FnKey {
        tenant: None,
        name: "hello".into(),
    };
    let tenants = FnKey {
        tenant: Some("acme".into()),
        name: "resize".into(),
    };
    let requests = [
        (
            "serve-function",
            ToKeeper::ServeFunction {
                function: tenants.clone(),
                limits,
                ceiling: Some(1 << 30),
            },
        ),
        (
            "make-zygote",
            ToKeeper::MakeZygote {
                function: host.clone(),
            },
        ),
        (
            "place-init",
            ToKeeper::PlaceInit {
                zygote: ZygoteId(1),
                pid: 4242,
            },
        ),
        (
            "place-spare",
            ToKeeper::PlaceSpare {
                zygote: ZygoteId(1),
                slot: "s12abc".into(),
                pid: 4243,
            },
        ),
        (
            "prepare-slot",
            ToKeeper::PrepareSlot {
                slot: SlotId(2),
                tenant: Some("acme".into()),
                limits: Some(LimitsMsg {
                    cpu_millis: 500,
                    ..limits
                }),
            },
        ),
        ("kill-slot", ToKeeper::KillSlot { slot: SlotId(2) }),
        ("release-slot", ToKeeper::ReleaseSlot { slot: SlotId(2) }),
        (
            "remove-zygote",
            ToKeeper::RemoveZygote {
                zygote: ZygoteId(1),
            },
        ),
        ("stop-function", ToKeeper::StopFunction { function: host }),
        (
            "forget-tenant",
            ToKeeper::ForgetTenant {
                tenant: "acme".into(),
            },
        ),
        (
            "make-run",
            ToKeeper::MakeRun {
                tenant: Some("acme".into()),
                limits,
            },
        ),
        (
            "place-run-init",
            ToKeeper::PlaceRunInit {
                run: RunId(3),
                pid: 4244,
            },
        ),
        ("kill-run", ToKeeper::KillRun { run: RunId(3) }),
        (
            "end-run",
            ToKeeper::EndRun {
                run: RunId(3),
                kill: true,
            },
        ),
    ];
    let mut framed = Vec::new();
    for (name, r) in &requests {
        write(
            "keeper_requests",
            name,
            &proto::codec::encode(r).expect("encode"),
        );
        framed.extend(proto::encode_frame(r).expect("frame"));
    }
    write("keeper_requests", "request-frames", &framed);
    let answers = [
        FromKeeper::Zygote {
            zygote: ZygoteId(1),
        },
        FromKeeper::Placing,
        FromKeeper::Run { run: RunId(3) },
        FromKeeper::Gone,
        FromKeeper::Slot {
            zygote: ZygoteId(1),
            slot: "s12abc".into(),
            id: SlotId(2),
        },
        FromKeeper::Killed {
            usage: Some(UsageMsg {
                oom_kills: 0,
                peak_bytes: 1 << 20,
                cpu_usec: 1500,
            }),
        },
        FromKeeper::Removed {
            slots: vec![(SlotId(2), None)],
        },
        FromKeeper::Refused {
            why: "no slot 9".into(),
        },
    ];
    let mut framed = Vec::new();
    for a in &answers {
        framed.extend(proto::encode_frame(a).expect("frame"));
    }
    write("keeper_requests", "answer-frames", &framed);
}
