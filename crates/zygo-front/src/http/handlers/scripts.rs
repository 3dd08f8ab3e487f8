//! `/scripts…`: the content-addressed script store (never its bytes back).

use proto::front::{Reply, Request};
use serde_json::json;

use super::{ask, digest, sha, unexpected};
use crate::http::{ok, Call, Front, Out};

pub fn put(front: &Front, call: &mut Call) -> Out {
    let source = match call.only_query(&[]).and_then(|()| call.body()) {
        Ok(b) => b,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::PutScript { source }) {
        Ok(Reply::ScriptStored {
            digest,
            size,
            existed,
        }) => ok(json!({ "sha256": sha(&digest), "size": size, "existed": existed })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn info(front: &Front, call: &mut Call) -> Out {
    let d = match call.only_query(&[]).and_then(|()| digest(call.param(0))) {
        Ok(d) => d,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::ScriptInfo { digest: d }) {
        Ok(Reply::ScriptHeld { digest, size }) => {
            ok(json!({ "sha256": sha(&digest), "size": size, "held": true }))
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn delete(front: &Front, call: &mut Call) -> Out {
    let d = match call.only_query(&[]).and_then(|()| digest(call.param(0))) {
        Ok(d) => d,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DeleteScript { digest: d }) {
        Ok(Reply::ScriptDeleted { digest }) => ok(json!({ "deleted": sha(&digest) })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}
