//! `/runtimes…`: runtime pools (a pool runs the script a call brings).

use proto::api::ServeKind;
use proto::front::{ExecRequest, Reply, Request, ScriptRef};
use serde::Deserialize;
use serde_json::{json, Value};

use super::functions::{exec, serve_layer, stop_named, ServeBody};
use super::{ask, check_name, digest, function_info, name, unexpected};
use crate::http::{body, ok, Call, Front, HttpError, Out};

pub fn list(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    match ask(front, call, Request::List) {
        Ok(Reply::Functions(fs)) => ok(json!({
            "runtimes": fs.iter().filter(|f| f.kind == "pool").map(function_info).collect::<Vec<_>>()
        })),
        Ok(r) => unexpected(&r).into(),
        Err(e) => e.into(),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    name: String,
    layer: serde_json::Map<String, Value>,
    #[serde(default)]
    base_dir: Option<String>,
}

pub fn create(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        call.only_query(&[])?;
        let b: CreateBody = body::json(&call.body()?)?;
        check_name(&b.name)?;
        Ok::<_, HttpError>(b)
    })();
    match parsed {
        Ok(b) => {
            let sb = ServeBody {
                layer: b.layer,
                base_dir: b.base_dir,
            };
            serve_layer(front, call, b.name, ServeKind::Pool, sb.layer, sb.base_dir)
        }
        Err(e) => e.into(),
    }
}

pub fn stop(front: &Front, call: &mut Call) -> Out {
    stop_named(front, call)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CallBody {
    #[serde(default)]
    script: Option<String>,
    #[serde(default)]
    source: Option<String>,
    #[serde(default)]
    event: Option<Value>,
    #[serde(default)]
    workspace: Option<WorkspaceBody>,
    #[serde(default)]
    out: bool,
}

/// A pool call's workspace: a tar inline (standard base64) or a stored blob's digest.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "lowercase")]
enum WorkspaceBody {
    Inline(String),
    Blob(String),
}

pub fn call(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| {
        let stream = super::functions::call_query(call)?;
        let name = name(call, 0)?;
        let b: CallBody = body::json(&call.body()?)?;
        let (workspace, workspace_blob) = match b.workspace {
            None => (None, None),
            Some(WorkspaceBody::Inline(text)) => {
                let tar = crate::http::base64::decode(&text).map_err(|e| {
                    HttpError::bad_request(format!("workspace.inline is not standard base64: {e}"))
                })?;
                (Some(tar.into()), None)
            }
            Some(WorkspaceBody::Blob(d)) => (None, Some(digest(&d)?)),
        };
        let script =
            match (b.script, b.source) {
                (Some(d), None) => ScriptRef::Digest(digest(&d)?),
                (None, Some(s)) => ScriptRef::Source(s.into_bytes()),
                (Some(_), Some(_)) => {
                    return Err(HttpError::bad_request(
                        "give script (a digest) or source (the text), not both",
                    ))
                }
                (None, None) => return Err(HttpError::bad_request(
                    "a pool call needs script (a digest from PUT /scripts) or source (the text)",
                )),
            };
        let event = b.event.unwrap_or(Value::Null).to_string();
        Ok((
            stream,
            name,
            script,
            event,
            workspace,
            workspace_blob,
            b.out,
        ))
    })();
    let (stream, name, script, event, workspace, workspace_blob, out) = match parsed {
        Ok(x) => x,
        Err(e) => return e.into(),
    };
    let req = ExecRequest {
        workspace,
        workspace_blob,
        out,
        name,
        event,
        key: call.key.clone(),
        timeout_ms: Some(call.timeout_ms),
        stream,
        script: Some(script),
    };
    exec(front, call, req)
}
