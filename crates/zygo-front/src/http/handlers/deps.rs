//! `/deps…`: dependency sets (a lock file installed once, mounted read-only at /venv in
//! the functions and pools that name it).

use std::collections::BTreeMap;

use proto::api::DepsInfo;
use proto::front::{Reply, Request};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{ask, unexpected};
use crate::http::{body, ok, Call, Front, HttpError, Out};

/// The file names a set takes.
const FILES: [&str; 3] = ["requirements.txt", "package.json", "package-lock.json"];
/// The most bytes of one file (the monitor checks it again).
const MAX_FILE: usize = 1 << 20;
/// The longest image text.
const MAX_IMAGE: usize = 4096;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PutBody {
    image: String,
    files: BTreeMap<String, String>,
}

fn shape(d: &DepsInfo) -> Value {
    let mut v = json!({
        "id": d.id,
        "image": d.image,
        "kind": d.kind,
        "state": d.state,
        "building": d.state == "building",
    });
    if let Some(e) = &d.error {
        v["error"] = json!(e);
    }
    if let Some(l) = &d.log {
        v["log"] = json!(l);
    }
    v
}

fn id_param(call: &Call) -> Result<String, HttpError> {
    let id = call.param(0);
    let hex = id.strip_prefix("deps_").unwrap_or("");
    let well_formed = hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !well_formed {
        return Err(HttpError::bad_request(
            "a dependency set's id is deps_ and 64 lowercase hex digits",
        ));
    }
    Ok(id.to_string())
}

/// `POST /deps` `{"image", "files": {NAME: TEXT}}` → 202 `{"id", "state", ...}` at once.
pub fn put(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let b: PutBody = body::json(&call.body()?)?;
        if b.image.is_empty() || b.image.len() > MAX_IMAGE {
            return Err(HttpError::bad_request(format!(
                "image must be 1 to {MAX_IMAGE} bytes"
            )));
        }
        if b.files.is_empty() {
            return Err(HttpError::bad_request(
                "files is empty: send {\"requirements.txt\": TEXT} or {\"package.json\": TEXT, \"package-lock.json\": TEXT}",
            ));
        }
        for (name, text) in &b.files {
            if !FILES.contains(&name.as_str()) {
                return Err(HttpError::bad_request(format!(
                    "files: {:?} is not a file a dependency set takes (requirements.txt, package.json, package-lock.json)",
                    name.chars().take(80).collect::<String>()
                )));
            }
            if text.len() > MAX_FILE {
                return Err(HttpError::new(
                    413,
                    "too_large",
                    format!("files: {name} is larger than {MAX_FILE} bytes"),
                ));
            }
        }
        Ok::<_, HttpError>(b)
    })();
    let b = match parsed {
        Ok(b) => b,
        Err(e) => return e.into(),
    };
    let req = Request::PutDeps {
        image: b.image,
        files: b.files.into_iter().collect(),
    };
    match ask(front, call, req) {
        Ok(Reply::Deps(d)) => {
            let status = if d.state == "building" { 202 } else { 200 };
            Out::Json(status, shape(&d), None)
        }
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// `GET /deps`: the sets the caller may see.
pub fn list(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::ListDeps) {
        Ok(Reply::DepsList(ds)) => ok(json!({ "deps": ds.iter().map(shape).collect::<Vec<_>>() })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// `GET /deps/{id}`: its state, and the build's log when it failed.
pub fn info(front: &Front, call: &mut Call) -> Out {
    let id = match call.only_query(&[]).and_then(|()| id_param(call)) {
        Ok(i) => i,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DepsInfo { id }) {
        Ok(Reply::Deps(d)) => ok(shape(&d)),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

/// `DELETE /deps/{id}`: refused (409) while a function or pool is served on it.
pub fn delete(front: &Front, call: &mut Call) -> Out {
    let id = match call.only_query(&[]).and_then(|()| id_param(call)) {
        Ok(i) => i,
        Err(e) => return e.into(),
    };
    match ask(front, call, Request::DeleteDeps { id }) {
        Ok(Reply::DepsDeleted { id }) => ok(json!({ "deleted": id })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}
