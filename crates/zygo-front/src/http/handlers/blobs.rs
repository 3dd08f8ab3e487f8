//! `/blobs…`: the content-addressed blob store (workspace tars calls name by digest).

use proto::front::{Reply, Request};
use serde_json::json;

use super::{ask, digest, sha, unexpected};
use crate::http::{ok, Call, Front, Out};

pub fn put(front: &Front, call: &mut Call) -> Out {
    let bytes = match call.only_query(&[]).and_then(|()| call.body()) {
        Ok(b) => b,
        Err(e) => return e.into(),
    };
    match ask(
        front,
        call,
        Request::PutBlob {
            bytes: bytes.into(),
        },
    ) {
        Ok(Reply::BlobStored {
            digest,
            size,
            existed,
        }) => ok(json!({ "sha256": sha(&digest), "size": size, "existed": existed })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

pub fn delete(front: &Front, call: &mut Call) -> Out {
    let d = match call.only_query(&[]).and_then(|()| digest(call.param(0))) {
        Ok(d) => d,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DeleteBlob { digest: d }) {
        Ok(Reply::BlobDeleted { digest }) => ok(json!({ "deleted": sha(&digest) })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}
