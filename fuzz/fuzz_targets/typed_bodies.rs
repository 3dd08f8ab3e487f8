//! Arbitrary bytes as the HTTP API's typed bodies (`POST /run`, a layer for `PUT /fn/{name}`
//! and `POST /runtimes`, `PATCH /tenants/{id}/limits`), parsed as the front parses them.
//!
//! Each parser refuses or returns a body, never panics, and what it returns keeps its caps:
//! - only strict JSON objects are taken (a body is taken only if
//!   `proto::json::from_slice_strict` reads the same bytes as an object), and every key of
//!   the object is one the body has (a layer or limits patch sets exactly one field per key);
//! - a run has a non-empty `cmd` whose program is not empty, counts within
//!   `proto::api::run_caps` (arguments, variables, bytes of argv and env, one argument,
//!   stdin, the key) and `MAX_EGRESS_RULES`, no NUL in an argument or a value;
//! - a layer's lists and `env` within `MAX_ITEMS`; a limits patch names at least one
//!   limit, never `unlimited` or `network: "host"`, sizes above 0, a timeout within 24h,
//!   `allow` within `MAX_ALLOW`; its refusals are one of the three codes it may give;
//! - each body reaches the supervisor intact: inside the `Api` envelope (`Run`,
//!   `ServeLayer`, `SetLimits`), encoded and decoded, it is the same request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use proto::api::run_caps::{
    MAX_ARG, MAX_ARGS, MAX_ARGV_ENV_BYTES, MAX_ENV, MAX_KEY, MAX_SPEC, MAX_STDIN,
};
use proto::api::{Credentials, ServeKind, MAX_LAYER};
use proto::front::Request;
use serde_json::{Map, Value};
use zygo_front::http::bodies::{layer, limits, run};

/// The request as the API front sends it, encoded and decoded: unchanged.
fn travels(request: Request) {
    let api = Request::Api {
        who: Credentials {
            token: Some("tok".into()),
            tenant: Some("t1".into()),
        },
        request: Box::new(request),
    };
    let bytes = proto::codec::encode(&api).expect("a parsed body encodes");
    let back: Request = proto::codec::decode(&bytes).expect("an encoded body decodes");
    assert_eq!(back, api);
}

fn check_run(data: &[u8], object: Option<&Map<String, Value>>) {
    let body = match run::parse(data) {
        Ok(b) => b,
        Err(e) => {
            assert!(!e.is_empty());
            return;
        }
    };
    let map = object.expect("a run was taken from text that is not a strict JSON object");
    assert!(data.len() <= MAX_SPEC);
    assert!(map.contains_key("cmd"));
    assert!(!body.cmd.is_empty() && !body.cmd[0].is_empty(), "{body:?}");
    assert!(body.cmd.len() <= MAX_ARGS);
    assert!(body.env.len() <= MAX_ENV);
    assert!(body.allow.len() <= proto::launch::MAX_EGRESS_RULES);
    let mut argv_env = 0;
    for a in &body.cmd {
        assert!(a.len() <= MAX_ARG && !a.contains('\0'), "{a:?}");
        argv_env += a.len() + 1;
    }
    for (name, value) in &body.env {
        assert!(value.len() <= MAX_ARG && !value.contains('\0'), "{value:?}");
        argv_env += name.len() + value.len() + 2;
    }
    assert!(argv_env <= MAX_ARGV_ENV_BYTES);
    for rule in &body.allow {
        assert!(rule.len() <= MAX_ARG && !rule.contains('\0'), "{rule:?}");
    }
    if let Some(stdin) = &body.stdin {
        assert!(stdin.0.len() <= MAX_STDIN);
    }
    if let Some(key) = &body.key {
        assert!(!key.is_empty() && key.len() <= MAX_KEY);
        assert!(!key.chars().any(char::is_control), "{key:?}");
    }
    // Every key but a null optional one set what it names.
    for (k, v) in map {
        let set = match k.as_str() {
            "cmd" => true,
            "image" => body.image.is_some(),
            "mem" => body.mem.is_some(),
            "cpu" => body.cpu.is_some(),
            "pids" => body.pids.is_some(),
            "timeout" => body.timeout.is_some(),
            "scratch" => body.scratch.is_some(),
            "network" => body.network.is_some(),
            "allow" => v.as_array().map_or(0, Vec::len) == body.allow.len(),
            "env" => v.as_object().map_or(0, Map::len) == body.env.len(),
            "stdin" => body.stdin.is_some(),
            "key" => body.key.is_some(),
            other => panic!("a run with the key {other:?} was taken"),
        };
        assert!(set || v.is_null(), "{k}: {v} was dropped: {body:?}");
    }
    travels(Request::Run { spec: body });
}

fn check_layer(data: &[u8], object: Option<&Map<String, Value>>) {
    let body = match layer::parse(data) {
        Ok(b) => b,
        Err(e) => {
            assert!(!e.is_empty());
            return;
        }
    };
    let map = object.expect("a layer was taken from text that is not a strict JSON object");
    assert!(data.len() <= MAX_LAYER);
    let lists = [&body.allow, &body.cmd, &body.secrets];
    for list in lists.into_iter().flatten() {
        assert!(list.len() <= layer::MAX_ITEMS);
    }
    assert!(body.mounts.as_ref().map_or(0, Vec::len) <= layer::MAX_ITEMS);
    assert!(body.env.as_ref().map_or(0, Vec::len) <= layer::MAX_ITEMS);
    // One field per key: no key is dropped, none is null.
    let set = [
        body.image.is_some(),
        body.mem.is_some(),
        body.cpu.is_some(),
        body.pids.is_some(),
        body.timeout.is_some(),
        body.scratch.is_some(),
        body.io_bps.is_some(),
        body.io_iops.is_some(),
        body.network.is_some(),
        body.allow.is_some(),
        body.idle_timeout.is_some(),
        body.min_warm.is_some(),
        body.max_warm.is_some(),
        body.agent.is_some(),
        body.entry.is_some(),
        body.cmd.is_some(),
        body.requirements.is_some(),
        body.deps.is_some(),
        body.mounts.is_some(),
        body.inotify.is_some(),
        body.secrets.is_some(),
        body.env.is_some(),
    ];
    assert_eq!(set.iter().filter(|s| **s).count(), map.len(), "{body:?}");
    assert!(map.values().all(|v| !v.is_null()));
    for kind in [ServeKind::Function, ServeKind::Pool] {
        travels(Request::ServeLayer {
            name: "f".into(),
            kind,
            layer: Box::new(body.clone()),
            base_dir: None,
        });
    }
}

fn check_limits(data: &[u8], object: Option<&Map<String, Value>>) {
    let patch = match limits::parse(data) {
        Ok(p) => p,
        Err(e) => {
            assert!(
                matches!(e.code, "bad_request" | "bad_spec" | "too_large"),
                "{}: {}",
                e.code,
                e.message
            );
            return;
        }
    };
    let map = object.expect("limits were taken from text that is not a strict JSON object");
    assert!(data.len() <= limits::MAX_BODY);
    assert!(!patch.is_empty());
    let fields = [
        patch.mem_bytes.is_some(),
        patch.cpu_millis.is_some(),
        patch.pids.is_some(),
        patch.timeout_ms.is_some(),
        patch.scratch_bytes.is_some(),
        patch.network.is_some(),
        patch.allow.is_some(),
    ];
    assert_eq!(
        fields.iter().filter(|s| **s).count(),
        map.len(),
        "{patch:?}"
    );
    for size in [patch.mem_bytes, patch.scratch_bytes]
        .into_iter()
        .flatten()
        .flatten()
    {
        assert!(size > 0);
    }
    if let Some(Some(ms)) = patch.timeout_ms {
        assert!(ms > 0 && ms <= 24 * 3600 * 1000, "{ms}");
    }
    if let Some(Some(n)) = &patch.network {
        assert!(n == "none" || n == "egress", "{n}");
    }
    if let Some(Some(rules)) = &patch.allow {
        assert!(rules.len() <= limits::MAX_ALLOW);
    }
    for (k, v) in map {
        // `null` clears: the patch says so.
        if v.is_null() {
            let cleared = match k.as_str() {
                "mem" => patch.mem_bytes == Some(None),
                "cpu" => patch.cpu_millis == Some(None),
                "pids" => patch.pids == Some(None),
                "timeout" => patch.timeout_ms == Some(None),
                "scratch" => patch.scratch_bytes == Some(None),
                "network" => patch.network == Some(None),
                "allow" => patch.allow == Some(None),
                other => panic!("limits with the key {other:?} were taken"),
            };
            assert!(cleared, "{k}: null did not clear it: {patch:?}");
        }
    }
    travels(Request::SetLimits {
        id: "t1".into(),
        limits: patch,
    });
}

fuzz_target!(|data: &[u8]| {
    let strict = proto::json::from_slice_strict::<Value>(data).ok();
    let object = match &strict {
        Some(Value::Object(m)) => Some(m),
        _ => None,
    };
    check_run(data, object);
    check_layer(data, object);
    check_limits(data, object);
});
