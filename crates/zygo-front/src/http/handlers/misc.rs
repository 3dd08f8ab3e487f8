//! `/healthz`, `/version`, `DELETE /requests/{key}`, `POST /drain`.

use std::time::{Duration, Instant};

use proto::api::Credentials;
use proto::front::{Reply, Request};
use serde::Deserialize;
use serde_json::json;

use super::{ask, ask_with, share_wait, unexpected, ShareWait};
use crate::http::{body, check_key, ok, Call, Front, HttpError, Out};

/// `GET /healthz`: no token; the front asks the supervisor for its condition.
pub fn healthz(front: &Front, call: &mut Call) -> Out {
    call.who = Credentials {
        token: None,
        tenant: None,
    };
    let deadline = Instant::now() + Duration::from_secs(10).min(call.left());
    // Never waits for a share: a health check says how things are now.
    match ask_with(
        front,
        &call.who,
        Request::Health,
        deadline,
        ShareWait::NOT,
        |_| {},
    ) {
        Ok(Reply::Health(h)) => {
            if h.stopping {
                Out::Json(503, json!({"status": "stopping"}), Some(5))
            } else if h.degraded() {
                ok(json!({"status": "degraded", "reason": h.reasons().join("; ")}))
            } else {
                ok(json!({"status": "ok"}))
            }
        }
        Ok(r) => unexpected(&r).into(),
        // Every channel busy with long calls: the supervisor is up, the front is full.
        Err(e) if e.status == 429 => ok(json!({
            "status": "degraded",
            "reason": match front.chans.recovering() {
                0 => "every channel to the supervisor is busy with calls".to_string(),
                n => format!(
                    "every channel to the supervisor is busy with calls ({n} reading answers their callers stopped waiting for)"
                ),
            },
        })),
        Err(e) if e.status == 503 => Out::Json(
            503,
            json!({"status": "stopping", "error": e.message, "code": e.code}),
            Some(5),
        ),
        Err(e) => e.into(),
    }
}

pub fn version(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::Version) {
        Ok(Reply::Version(v)) => {
            let mut body = json!({
                "version": v.version,
                "api": v.api,
                "backend": v.backend,
                "cgroup": v.cgroup,
                "landlock_abi": v.landlock_abi,
            });
            if let Some(p) = v.private_net {
                body["private_net"] = json!(p);
            }
            ok(body)
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn cancel(front: &Front, call: &mut Call) -> Out {
    let key = call.param(0).to_string();
    if let Err(e) = call.only_query(&[]).and_then(|()| check_key(&key)) {
        return e.into();
    }
    match ask(front, call, Request::Cancel { key: key.clone() }) {
        Ok(Reply::Cancelled { count: 0 }) => HttpError::not_found(format!(
            "no request of yours is running under the key {key:?}"
        ))
        .into(),
        Ok(Reply::Cancelled { count }) => ok(json!({ "cancelled": count })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct DrainBody {
    #[serde(default)]
    grace: Option<u64>,
}

pub fn drain(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let b: DrainBody = body::json_or_default(&call.body()?)?;
        let grace = b.grace.unwrap_or(30);
        if grace > 3600 {
            return Err(HttpError::bad_request("grace is at most 3600 seconds"));
        }
        Ok(grace)
    })();
    let grace = match parsed {
        Ok(g) => g,
        Err(e) => return e.into(),
    };
    // The drain answers when it is over: wait at least the grace and a margin.
    let deadline = Instant::now() + Duration::from_secs(grace + 30).max(call.left());
    let req = Request::Drain {
        grace_ms: grace * 1000,
    };
    let wait = share_wait(call);
    match ask_with(front, &call.who, req, deadline, wait, |_| {}) {
        Ok(Reply::Drained { cut_off, .. }) => ok(json!({ "drained": true, "in_flight": cut_off })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}
