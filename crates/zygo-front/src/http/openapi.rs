//! The OpenAPI 3.1 document of this build (`zygo api --openapi`, committed as
//! `spec/openapi.json`). Written by hand, one entry per operation; tests hold it to the
//! route table's source (`routes.rs`): every route documented, nothing documented that is
//! not routed, and exactly the routes that need no token marked so.

use serde_json::{json, Map, Value};

/// One documented operation.
struct Op {
    method: &'static str,
    path: &'static str,
    /// `any`, `op`, `op-or-tenant` or `none`.
    who: &'static str,
    deploy: bool,
    summary: &'static str,
    body: Body,
    /// The 200 answer's schema.
    ok: fn() -> Value,
    /// Error statuses beyond the ones every authenticated route can answer.
    more: &'static [u16],
    /// `?stream=1` is understood.
    stream: bool,
    /// Other query parameters: (name, schema, description).
    query: &'static [(&'static str, &'static str, &'static str)],
    /// The 200 answer is Prometheus text (`/metrics`), not JSON.
    text: bool,
    /// The route also answers 202 (accepted, still working) with the same schema.
    accepted: bool,
    /// The route is MCP's Streamable HTTP transport: JSON-RPC in and out, 202 with no body
    /// for a notification, and the transport's own statuses.
    mcp: bool,
}

enum Body {
    None,
    /// A JSON object of this schema.
    Json(fn() -> Value),
    /// A JSON object of this schema, or nothing.
    OptionalJson(fn() -> Value),
    /// Any JSON value (an event); empty is null.
    AnyJson,
    /// Raw bytes.
    Raw,
}

fn r(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn obj(props: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": props, "required": required, "additionalProperties": false })
}

fn open_obj(props: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": props, "required": required })
}

fn nullable(t: &str) -> Value {
    json!({ "type": [t, "null"] })
}

fn s_health() -> Value {
    open_obj(
        json!({"status": {"type": "string", "enum": ["ok", "degraded", "stopping"]}, "reason": {"type": "string"}}),
        &["status"],
    )
}
fn s_version() -> Value {
    open_obj(
        json!({
            "version": {"type": "string"}, "api": {"type": "integer"}, "backend": {"type": "string"},
            "cgroup": {"type": "string"}, "landlock_abi": {"type": "integer"},
            "private_net": {"type": "boolean", "description": "Only for a caller with deploy rights."}
        }),
        &["version", "api", "backend", "cgroup", "landlock_abi"],
    )
}
fn s_metrics() -> Value {
    json!({"type": "string", "description": "The Prometheus text format, version 0.0.4."})
}
fn s_functions() -> Value {
    open_obj(
        json!({"functions": {"type": "array", "items": r("FunctionInfo")}}),
        &["functions"],
    )
}
fn s_runtimes() -> Value {
    open_obj(
        json!({"runtimes": {"type": "array", "items": r("FunctionInfo")}}),
        &["runtimes"],
    )
}
fn s_served() -> Value {
    open_obj(
        json!({"name": {"type": "string"}, "kind": {"type": "string", "enum": ["function", "pool"]}, "state": {"type": "string"}}),
        &["name", "kind", "state"],
    )
}
fn s_stopped() -> Value {
    open_obj(json!({"stopped": {"type": "string"}}), &["stopped"])
}
fn s_answer() -> Value {
    r("CallAnswer")
}
fn s_batch() -> Value {
    open_obj(
        json!({"results": {"type": "array", "items": {"type": "object", "required": ["status"], "properties": {"status": {"type": "integer"}}}}}),
        &["results"],
    )
}
fn s_logs() -> Value {
    open_obj(
        json!({"logs": {"type": "array", "items": open_obj(json!({
            "request_id": {"type": "string"}, "finished_ms": {"type": "integer"}, "outcome": {"type": "string"},
            "wall_ms": {"type": "number"}, "error": nullable("string"), "stdout": {"type": "string"}, "stderr": {"type": "string"}
        }), &["request_id", "outcome"])},
        "truncated": {"type": "boolean"}, "left_out": {"type": "integer"}}),
        &["logs", "truncated", "left_out"],
    )
}
fn s_stats() -> Value {
    open_obj(
        json!({
            "name": {"type": "string"}, "requests": {"type": "integer"}, "ok": {"type": "integer"},
            "error": {"type": "integer"}, "timeout": {"type": "integer"}, "cancelled": {"type": "integer"},
            "stuck": {"type": "integer"}, "p50_wall_us": {"type": "integer"}, "p99_wall_us": {"type": "integer"},
            "peak_rss_kb": {"type": "integer"}
        }),
        &["name", "requests"],
    )
}
fn s_warmed() -> Value {
    open_obj(
        json!({"name": {"type": "string"}, "ready": {"type": "integer"}}),
        &["name", "ready"],
    )
}
fn s_run_answer() -> Value {
    r("RunAnswer")
}
fn s_script() -> Value {
    open_obj(
        json!({"sha256": {"type": "string"}, "size": {"type": "integer"}, "existed": {"type": "boolean"}, "held": {"type": "boolean"}}),
        &["sha256", "size"],
    )
}
fn s_deleted() -> Value {
    open_obj(json!({"deleted": {"type": "string"}}), &["deleted"])
}
fn s_deps() -> Value {
    open_obj(
        json!({"id": {"type": "string", "pattern": "^deps_[0-9a-f]{64}$"}, "image": {"type": "string"},
               "kind": {"type": "string", "enum": ["python", "node"]},
               "state": {"type": "string", "enum": ["building", "ready", "failed"]},
               "building": {"type": "boolean"},
               "error": {"type": "string", "description": "Why a failed build failed."},
               "log": {"type": "string", "description": "A failed build's log: the resolver's own words (GET /deps/{id} only)."}}),
        &["id", "image", "kind", "state", "building"],
    )
}
fn s_deps_list() -> Value {
    open_obj(
        json!({"deps": {"type": "array", "items": s_deps()}}),
        &["deps"],
    )
}
fn b_deps() -> Value {
    obj(
        json!({"image": {"type": "string", "minLength": 1, "maxLength": 4096, "description": "\"host\" or \"dir:/path/to/rootfs\"."},
               "files": {"type": "object", "minProperties": 1, "maxProperties": 2,
                         "description": "{\"requirements.txt\": TEXT} (Python), or {\"package.json\": TEXT, \"package-lock.json\": TEXT} (Node); each at most 1 MiB.",
                         "properties": {"requirements.txt": {"type": "string", "maxLength": 1_048_576},
                                        "package.json": {"type": "string", "maxLength": 1_048_576},
                                        "package-lock.json": {"type": "string", "maxLength": 1_048_576}},
                         "additionalProperties": false}}),
        &["image", "files"],
    )
}
fn s_cancelled() -> Value {
    open_obj(json!({"cancelled": {"type": "integer"}}), &["cancelled"])
}
fn s_tenant_created() -> Value {
    open_obj(
        json!({"tenant": r("TenantInfo"), "created": {"type": "boolean"}}),
        &["tenant", "created"],
    )
}
fn s_tenants() -> Value {
    open_obj(
        json!({"tenants": {"type": "array", "items": r("TenantInfo")}}),
        &["tenants"],
    )
}
fn s_tenant() -> Value {
    r("TenantInfo")
}
fn s_tenant_deleted() -> Value {
    open_obj(
        json!({"id": {"type": "string"}, "stopped": {"type": "array", "items": {"type": "string"}},
               "scripts_removed": {"type": "array", "items": {"type": "string"}}, "tokens_revoked": {"type": "integer"}}),
        &["id", "stopped", "scripts_removed", "tokens_revoked"],
    )
}
fn s_minted() -> Value {
    open_obj(
        json!({"id": {"type": "string"}, "secret": {"type": "string"}, "tenant": nullable("string"), "created_ms": {"type": "integer"}}),
        &["id", "secret", "tenant", "created_ms"],
    )
}
fn s_tokens() -> Value {
    open_obj(
        json!({"tokens": {"type": "array", "items": open_obj(json!({
            "id": {"type": "string"}, "tenant": nullable("string"), "created_ms": {"type": "integer"}, "revoked_ms": nullable("integer")
        }), &["id", "tenant", "created_ms", "revoked_ms"])}}),
        &["tokens"],
    )
}
fn s_secret_stored() -> Value {
    open_obj(
        json!({"tenant": {"type": "string"}, "name": {"type": "string"}, "replaced": {"type": "boolean"}}),
        &["tenant", "name", "replaced"],
    )
}
fn s_secret_deleted() -> Value {
    open_obj(
        json!({"tenant": {"type": "string"}, "name": {"type": "string"}, "deleted": {"type": "boolean"}}),
        &["tenant", "name", "deleted"],
    )
}
fn s_secrets() -> Value {
    open_obj(
        json!({"tenant": {"type": "string"}, "secrets": {"type": "array", "items": {"type": "string"}}}),
        &["tenant", "secrets"],
    )
}
fn s_revoked() -> Value {
    open_obj(
        json!({"id": {"type": "string"}, "revoked": {"type": "boolean"}}),
        &["id", "revoked"],
    )
}
fn s_drained() -> Value {
    open_obj(
        json!({"drained": {"type": "boolean"}, "in_flight": {"type": "integer"}}),
        &["drained", "in_flight"],
    )
}

fn b_layer() -> Value {
    obj(
        json!({"layer": {"type": "object", "description": "The fields of a [fn.NAME] table of sandbox.toml, every one optional."},
               "base_dir": {"type": "string", "description": "Absolute folder the layer's relative paths are relative to."}}),
        &["layer"],
    )
}
fn b_pool() -> Value {
    obj(
        json!({"name": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"},
               "layer": {"type": "object"}, "base_dir": {"type": "string"}}),
        &["name", "layer"],
    )
}
fn b_batch() -> Value {
    obj(
        json!({"events": {"type": "array", "maxItems": 1000, "items": {}}}),
        &["events"],
    )
}
fn b_warm() -> Value {
    obj(json!({"n": {"type": "integer", "minimum": 1}}), &[])
}
fn b_run() -> Value {
    obj(
        json!({
            "cmd": {"type": "array", "minItems": 1, "items": {"type": "string"}},
            "image": {"type": "string"}, "mem": {"type": ["string", "integer"]}, "cpu": {"type": "number"},
            "pids": {"type": "integer"}, "timeout": {"type": ["string", "integer"]}, "scratch": {"type": ["string", "integer"]},
            "network": {"type": "string", "enum": ["none", "egress"]},
            "allow": {"type": "array", "maxItems": 64, "items": {"type": "string"}},
            "env": {"type": "object", "additionalProperties": {"type": "string"}}, "stdin": {"type": "string"}
        }),
        &["cmd"],
    )
}
fn b_pool_call() -> Value {
    obj(
        json!({"script": {"type": "string", "description": "sha256:<hex> from PUT /scripts"},
               "source": {"type": "string", "description": "The script's text, for this call"},
               "event": {},
               "workspace": {"description": "A tar unpacked into the call's own directory: inline (standard base64) or a blob from PUT /blobs.",
                             "oneOf": [obj(json!({"inline": {"type": "string", "contentEncoding": "base64"}}), &["inline"]),
                                       obj(json!({"blob": {"type": "string", "description": "sha256:<hex> from PUT /blobs"}}), &["blob"])]},
               "out": {"type": "boolean", "description": "Send the call's directory back as a tar (workspace in the answer)."}}),
        &[],
    )
}
fn b_mcp() -> Value {
    open_obj(
        json!({"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer"]},
               "method": {"type": "string"}, "params": {"type": "object"}}),
        &["jsonrpc"],
    )
}
fn s_mcp() -> Value {
    open_obj(
        json!({"jsonrpc": {"const": "2.0"}, "id": {"type": ["string", "integer", "null"]},
               "result": {"type": "object"},
               "error": open_obj(json!({"code": {"type": "integer"}, "message": {"type": "string"}, "data": {}}), &["code", "message"])}),
        &["jsonrpc", "id"],
    )
}
fn b_tenant() -> Value {
    obj(
        json!({"id": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"}}),
        &["id"],
    )
}
fn b_limits() -> Value {
    json!({
        "type": "object", "additionalProperties": false, "minProperties": 1,
        "properties": {
            "mem": {"type": ["string", "integer", "null"]}, "cpu": {"type": ["number", "null"]},
            "pids": {"type": ["integer", "null"]}, "timeout": {"type": ["string", "integer", "null"]},
            "scratch": {"type": ["string", "integer", "null"]}, "network": {"type": ["string", "null"], "enum": ["none", "egress", null]},
            "allow": {"type": ["array", "null"], "items": {"type": "string"}}
        }
    })
}
fn b_secret() -> Value {
    obj(
        json!({"value": {"type": "string", "maxLength": 65536}}),
        &["value"],
    )
}
fn b_empty() -> Value {
    obj(json!({}), &[])
}
fn b_drain() -> Value {
    obj(
        json!({"grace": {"type": "integer", "minimum": 0, "maximum": 3600}}),
        &[],
    )
}

const CALL_ERRORS: &[u16] = &[499, 500, 504];

/// A function call's query besides `stream`.
const FN_CALL_QUERY: &[(&str, &str, &str)] = &[
    ("workspace", "string", "A blob digest (sha256:<hex> from PUT /blobs) unpacked into the call's own directory; a blob only, never an inline tar."),
    ("out", "integer", "1: send the call's directory back as a tar (workspace in the answer)."),
];

#[rustfmt::skip]
fn ops() -> Vec<Op> {
    use Body::*;
    let op = |method, path, who, deploy, summary, body, ok: fn() -> Value, more| Op {
        method, path, who, deploy, summary, body, ok, more, stream: false, query: &[], text: false, accepted: false, mcp: false,
    };
    vec![
        op("GET", "/healthz", "none", false, "The supervisor's condition: ok, degraded (with a reason) or stopping (503).", None, s_health, &[]),
        op("GET", "/version", "any", false, "This build and what the host supports.", None, s_version, &[]),
        op("GET", "/fn", "any", false, "Functions and pools the caller can see.", None, s_functions, &[]),
        op("PUT", "/fn/{name}", "op", true, "Serve a function from a layer.", Json(b_layer), s_served, &[409]),
        op("DELETE", "/fn/{name}", "op", true, "Stop a function.", None, s_stopped, &[]),
        Op { stream: true, query: FN_CALL_QUERY, ..op("POST", "/fn/{name}", "any", false, "Call a function with the body as its event (empty: null).", AnyJson, s_answer, CALL_ERRORS) },
        op("POST", "/fn/{name}/batch", "any", false, "Call a function once per event, at most the caller's share of the channels (a quarter) at a time; one result per event, in order. The answer holds at most 64 MiB of JSON (16 KiB of it set aside per event, so each element's status and a small result always fit): past it an element's stdout and stderr are cut (stdout_truncated, stderr_truncated), and a result that does not fit makes that element 413 too_large.", Json(b_batch), s_batch, &[]),
        Op { query: &[("limit", "integer", "How many, 1 to 1000 (default 100).")], ..op("GET", "/fn/{name}/logs", "any", false, "A function's last finished requests that are the caller's, the newest that fit 4 MiB (`left_out` counts the older ones left out); an error is kept to its first 16 KiB, stdout and stderr to their last 4 KiB.", None, s_logs, &[]) },
        op("GET", "/fn/{name}/stats", "any", false, "A function's counters and latency percentiles.", None, s_stats, &[]),
        op("POST", "/fn/{name}/warm", "any", false, "Keep at least n zygotes ready.", OptionalJson(b_warm), s_warmed, &[]),
        op("POST", "/run", "op", true, "A one-shot sandbox; 200 whenever it was attempted, 408 when X-Zygo-Timeout-Ms fired first.", Json(b_run), s_run_answer, &[408]),
        op("GET", "/runtimes", "any", false, "Runtime pools the caller can see.", None, s_runtimes, &[]),
        op("POST", "/runtimes", "op", true, "Create a runtime pool from a layer.", Json(b_pool), s_served, &[409]),
        op("DELETE", "/runtimes/{name}", "op", true, "Stop a runtime pool.", None, s_stopped, &[]),
        Op { stream: true, ..op("POST", "/runtimes/{name}/call", "any", false, "Run a script (a registered digest, or its source) in a pool.", Json(b_pool_call), s_answer, CALL_ERRORS) },
        op("PUT", "/scripts", "any", false, "Register a script (raw body); its digest.", Raw, s_script, &[]),
        op("GET", "/scripts/{digest}", "any", false, "Whether a script is held, and its size (never its bytes).", None, s_script, &[]),
        op("DELETE", "/scripts/{digest}", "op", true, "Forget a script.", None, s_deleted, &[]),
        op("PUT", "/blobs", "any", false, "Store a blob (raw body, a workspace tar) for calls to name by digest; owned by the caller's tenant.", Raw, s_script, &[]),
        op("DELETE", "/blobs/{digest}", "op", true, "Forget a blob.", None, s_deleted, &[]),
        Op { accepted: true, ..op("POST", "/deps", "any", false, "Build a dependency set (a venv, or node_modules) from a lock file on an image, once per id (a hash of the image and files); 202 while it builds, 200 when it was built already. The build reaches only the package registries.", Json(b_deps), s_deps, &[]) },
        op("GET", "/deps", "any", false, "The dependency sets the caller sent (every set, for the host's callers).", None, s_deps_list, &[]),
        op("GET", "/deps/{id}", "any", false, "A dependency set's state: building, ready or failed (with the build's log).", None, s_deps, &[]),
        op("DELETE", "/deps/{id}", "op", true, "Forget a dependency set; refused (409) while a function or pool is served on it, or while it builds.", None, s_deleted, &[409]),
        op("DELETE", "/requests/{key}", "any", false, "Cancel every request of the caller under this key.", None, s_cancelled, &[]),
        op("POST", "/tenants", "op", false, "Create a tenant (idempotent).", Json(b_tenant), s_tenant_created, &[]),
        op("GET", "/tenants", "op", false, "Every tenant.", None, s_tenants, &[]),
        op("GET", "/tenants/{id}", "op-or-tenant", false, "A tenant's record.", None, s_tenant, &[]),
        op("DELETE", "/tenants/{id}", "op", true, "Delete a tenant: its functions and pools stop, its scripts nothing else uses go, its tokens are revoked.", None, s_tenant_deleted, &[]),
        op("PATCH", "/tenants/{id}/limits", "op", true, "Set some of a tenant's limits (null clears one).", Json(b_limits), s_tenant, &[422]),
        op("POST", "/tenants/{id}/tokens", "op", true, "Mint a token for a tenant.", OptionalJson(b_empty), s_minted, &[]),
        op("GET", "/tenants/{id}/secrets", "op", false, "The names of a tenant's secrets (never a value: no route answers with one).", None, s_secrets, &[]),
        op("PUT", "/tenants/{id}/secrets/{name}", "op", true, "Store a tenant's secret, sealed (replacing one of that name); delivered as /run/secrets/<name>.", Json(b_secret), s_secret_stored, &[413, 503]),
        op("DELETE", "/tenants/{id}/secrets/{name}", "op", true, "Forget a tenant's secret.", None, s_secret_deleted, &[]),
        op("POST", "/tokens", "op", true, "Mint an operator token.", OptionalJson(b_empty), s_minted, &[]),
        op("GET", "/tokens", "op", true, "Every token (never a secret).", None, s_tokens, &[]),
        op("DELETE", "/tokens/{id}", "op", true, "Revoke a token (the record stays).", None, s_revoked, &[]),
        op("POST", "/drain", "op", true, "Stop taking calls, let running ones finish within grace seconds, stop the supervisor.", OptionalJson(b_drain), s_drained, &[]),
        Op { text: true, ..op("GET", "/metrics", "any", false, "Prometheus series: this API's requests and errors, and the numbers of each function the caller can see.", None, s_metrics, &[]) },
        Op { mcp: true, ..op("POST", "/mcp", "any", false, "MCP's Streamable HTTP transport (revisions 2024-11-05 to 2025-11-25, no sessions): one JSON-RPC message per POST, answered as application/json; the tools of `zygo mcp`, carried out as the caller with the routes' own rights (run_code is a POST /run and needs deploy rights). A notification is 202 with no body; a batch is 400; an Origin other than this server's own is 403; GET is 405 (no server stream).", Json(b_mcp), s_mcp, &[406, 415]) },
    ]
}

fn error_text(status: u16) -> &'static str {
    match status {
        400 => "Bad request: malformed JSON, an unknown field, a bad header, name or digest (bad_request, bad_spec), or a call needing a secret the calling tenant has not stored (missing_secret, naming it).",
        401 => "No token, an unknown or a revoked one (unauthorized); a body is not read before the caller is known.",
        403 => "Not the caller's to ask: the deploy gate, operator-only, another tenant (forbidden).",
        404 => "Not found, or not the caller's (not_found).",
        406 => "Not Acceptable (POST /mcp): the Accept header does not take application/json.",
        408 => "The request's head or body did not arrive in time (the body within 60 s, and at 64 KiB/s or more after its first second), or (POST /run) X-Zygo-Timeout-Ms fired first (api_timeout).",
        409 => "The name is taken by the other kind, or (DELETE /deps/{id}) the set is in use or building (conflict).",
        413 => "The body is over 16 MiB (too_large).",
        415 => "Unsupported Media Type (POST /mcp): the body is not sent as application/json.",
        422 => "A limit above every ceiling the tenant can reach (above_ceiling).",
        429 => "Refused before anything ran (busy): every channel to the supervisor stayed in use for 2 s; the caller holds its share of them (a quarter) and none came free while the request waited its turn (until its deadline, at most 30 s); the caller or its address has its share of the front's workers (a quarter: 16 requests being served); or the supervisor is at a limit of its own (a function's zygotes, a tenant's share of them, runs, dependency builds, the store). Safe to send again after Retry-After seconds.",
        431 => "A header line over 8 KiB, or more than 100 headers.",
        499 => "Cancelled (cancelled).",
        500 => "The handler failed (handler), or Zygo did (internal).",
        503 => "Unavailable: starting, draining, stopping, the front serving its most requests at once (three quarters of its workers), or a dependency set the layer names is still building; retry after Retry-After seconds (unavailable).",
        504 => "Past its deadline (timeout) or no heartbeat (stuck).",
        _ => "Error.",
    }
}

fn operation(o: &Op) -> Value {
    let mut params: Vec<Value> = o
        .path
        .split('/')
        .filter_map(|s| s.strip_prefix('{').and_then(|s| s.strip_suffix('}')))
        .map(|p| {
            let schema = match (p, o.path) {
                ("digest", _) => json!({"type": "string", "pattern": "^(sha256:)?[0-9a-f]{64}$"}),
                ("key", _) => json!({"type": "string", "minLength": 1, "maxLength": 128, "pattern": "^[ -~]+$"}),
                ("id", path) if path.starts_with("/tokens") => json!({"type": "string", "pattern": "^tok_[0-9a-f]{1,64}$"}),
                ("id", path) if path.starts_with("/deps") => json!({"type": "string", "pattern": "^deps_[0-9a-f]{64}$"}),
                ("name", path) if path.contains("/secrets/") => json!({"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,63}$"}),
                _ => json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"}),
            };
            json!({"name": p, "in": "path", "required": true, "schema": schema})
        })
        .collect();
    if o.stream {
        params.push(json!({"name": "stream", "in": "query", "required": false,
            "description": "1: answer application/x-ndjson, one line per output event, the last line the answer with its status.",
            "schema": {"type": "string", "enum": ["0", "1"]}}));
    }
    for (name, ty, desc) in o.query {
        params.push(json!({"name": name, "in": "query", "required": false, "description": desc, "schema": {"type": ty}}));
    }
    if o.who != "none" {
        for p in ["Tenant", "RequestKey", "TimeoutMs"] {
            params.push(json!({"$ref": format!("#/components/parameters/{p}")}));
        }
    }
    let mut responses = Map::new();
    let mut ok_content = Map::new();
    if o.text {
        ok_content.insert("text/plain".into(), json!({"schema": (o.ok)()}));
    } else {
        ok_content.insert("application/json".into(), json!({"schema": (o.ok)()}));
    }
    if o.stream {
        ok_content.insert(
            "application/x-ndjson".into(),
            json!({"schema": {"type": "string"}}),
        );
    }
    responses.insert(
        "200".into(),
        json!({
            "description": "OK",
            "headers": {"X-Zygo-Request-Id": {"$ref": "#/components/headers/RequestId"}},
            "content": ok_content,
        }),
    );
    if o.mcp {
        responses.insert(
            "202".into(),
            json!({
                "description": "Accepted: the message was a notification or a response; no body.",
                "headers": {"X-Zygo-Request-Id": {"$ref": "#/components/headers/RequestId"}},
            }),
        );
    }
    if o.accepted {
        responses.insert(
            "202".into(),
            json!({
                "description": "Accepted: still working (poll the resource)",
                "headers": {"X-Zygo-Request-Id": {"$ref": "#/components/headers/RequestId"}},
                "content": ok_content,
            }),
        );
    }
    let mut errors: Vec<u16> = if o.who == "none" {
        vec![503]
    } else {
        vec![400, 401, 403, 404, 429, 503]
    };
    if !matches!(o.body, Body::None) {
        errors.extend([408, 413]);
    }
    errors.extend(o.more);
    errors.sort_unstable();
    errors.dedup();
    for s in errors {
        let mut resp = json!({
            "description": error_text(s),
            "headers": {"X-Zygo-Request-Id": {"$ref": "#/components/headers/RequestId"}},
            "content": {"application/json": {"schema": if o.who == "none" { s_health() } else { r("Error") }}},
        });
        // What /mcp itself refuses is a JSON-RPC error; what the API refuses before it (a
        // token, a place, the body's size) is the API's error shape.
        if o.mcp && matches!(s, 400 | 403 | 406 | 415) {
            resp["content"]["application/json"]["schema"] = json!({"oneOf": [s_mcp(), r("Error")]});
        }
        if s == 429 || s == 503 {
            resp["headers"]["Retry-After"] = json!({"$ref": "#/components/headers/RetryAfter"});
        }
        if s == 500 || s == 504 || s == 499 {
            resp["content"]["application/json"]["schema"] = r("CallError");
        }
        responses.insert(s.to_string(), resp);
    }
    let mut v = json!({
        "summary": o.summary,
        "operationId": op_id(o),
        "parameters": params,
        "responses": responses,
        "x-zygo-who": o.who,
        "x-zygo-deploy": o.deploy,
    });
    if o.who == "none" {
        v["security"] = json!([]);
    }
    match o.body {
        Body::None => {}
        Body::Json(s) => {
            v["requestBody"] =
                json!({"required": true, "content": {"application/json": {"schema": s()}}});
        }
        Body::OptionalJson(s) => {
            v["requestBody"] =
                json!({"required": false, "content": {"application/json": {"schema": s()}}});
        }
        Body::AnyJson => {
            v["requestBody"] =
                json!({"required": false, "content": {"application/json": {"schema": {}}}});
        }
        Body::Raw => {
            v["requestBody"] = json!({"required": true, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary", "maxLength": 16_777_216}}}});
        }
    }
    v
}

fn op_id(o: &Op) -> String {
    let mut id = o.method.to_ascii_lowercase();
    for seg in o.path.split('/').filter(|s| !s.is_empty()) {
        id.push('_');
        id.push_str(seg.trim_matches(['{', '}']));
    }
    id
}

fn components() -> Value {
    json!({
        "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
            "description": "ZYGO_API_TOKEN (the bootstrap operator token) or a token from `zygo token mint`."}},
        "parameters": {
            "Tenant": {"name": "X-Zygo-Tenant", "in": "header", "required": false, "description": "An operator acting for this tenant; a tenant token naming another tenant is 403.", "schema": {"type": "string", "pattern": "^[a-z0-9][a-z0-9_-]{0,62}$"}},
            "RequestKey": {"name": "X-Zygo-Request-Key", "in": "header", "required": false, "description": "The caller's name for the request, for DELETE /requests/{key}.", "schema": {"type": "string", "minLength": 1, "maxLength": 128}},
            "TimeoutMs": {"name": "X-Zygo-Timeout-Ms", "in": "header", "required": false, "description": "How long the caller waits, in ms (default 60000, at most 24 h).", "schema": {"type": "integer", "minimum": 1, "maximum": 86_400_000}}
        },
        "headers": {
            "RequestId": {"description": "The call's request id, or an id the front made for this request.", "schema": {"type": "string"}},
            "RetryAfter": {"description": "Seconds to wait before retrying.", "schema": {"type": "integer"}}
        },
        "schemas": {
            "Error": open_obj(json!({"error": {"type": "string"}, "code": {"type": "string", "enum": [
                "bad_request", "bad_spec", "missing_secret", "unauthorized", "forbidden", "not_found", "api_timeout",
                "conflict", "too_large", "above_ceiling", "busy", "cancelled", "handler", "internal", "unavailable", "timeout", "stuck"
            ]}}), &["error", "code"]),
            "Metrics": open_obj(json!({"wall_ms": {"type": "number"}, "cpu_ms": {"type": "number"}, "peak_rss_kb": {"type": "integer"}}), &["wall_ms", "cpu_ms", "peak_rss_kb"]),
            "CallAnswer": open_obj(json!({
                "result": {}, "request_id": {"type": "string"}, "stdout": {"type": "string"}, "stderr": {"type": "string"},
                "stdout_truncated": {"type": "boolean"}, "stderr_truncated": {"type": "boolean"}, "started": {"type": "boolean"},
                "metrics": r("Metrics"),
                "workspace": {"type": "string", "contentEncoding": "base64", "description": "With out: the call's directory, a tar."},
                "workspace_truncated": {"type": "boolean", "description": "With out: entries were left out at a cap."},
                "stream_truncated": {"type": "boolean", "description": "Streamed calls only, and only when true: the client read too slowly, so output and progress events were dropped from some point on (stdout and stderr here are still whole up to their caps)."}
            }), &["result", "request_id", "stdout", "stderr", "metrics"]),
            "CallError": open_obj(json!({
                "error": {"type": "string"}, "code": {"type": "string"}, "request_id": {"type": "string"},
                "stdout": {"type": "string"}, "stderr": {"type": "string"}, "traceback": nullable("string"),
                "exit_code": nullable("integer"), "oom_killed": {"type": "boolean"}, "started": {"type": "boolean"}, "metrics": r("Metrics")
            }), &["error", "code"]),
            "FunctionInfo": open_obj(json!({
                "name": {"type": "string"}, "tenant": {"type": ["string", "null"], "description": "The tenant it is served for; null: the host's."},
                "kind": {"type": "string", "enum": ["function", "pool"]}, "state": {"type": "string"},
                "error": nullable("string"),
                "zygotes": open_obj(json!({"ready": {"type": "integer"}, "busy": {"type": "integer"}, "frozen": {"type": "integer"}, "starting": {"type": "integer"}}), &["ready", "busy", "frozen", "starting"]),
                "in_flight": {"type": "integer"}, "min_warm": {"type": "integer"}, "max_warm": {"type": "integer"}
            }), &["name", "kind", "state"]),
            "Limits": open_obj(json!({
                "mem": nullable("string"), "cpu": nullable("number"), "pids": nullable("integer"), "timeout": nullable("string"),
                "scratch": nullable("string"), "network": nullable("string"), "allow": {"type": ["array", "null"], "items": {"type": "string"}}
            }), &[]),
            "TenantInfo": open_obj(json!({
                "id": {"type": "string"}, "created_ms": {"type": "integer"}, "limits": r("Limits"),
                "functions": {"type": "array", "items": {"type": "string"}}, "scripts": {"type": "array", "items": {"type": "string"}},
                "tokens": {"type": "integer"}
            }), &["id", "created_ms", "limits", "functions", "scripts", "tokens"]),
            "RunAnswer": open_obj(json!({
                "request_id": {"type": "string"}, "exit_code": nullable("integer"), "signal": nullable("integer"),
                "timed_out": {"type": "boolean"}, "oom_killed": {"type": "boolean"}, "peak_rss_kb": {"type": "integer"},
                "wall_ms": {"type": "number"}, "cpu_ms": {"type": "number"}, "stdout": {"type": "string"}, "stderr": {"type": "string"},
                "stdout_truncated": {"type": "boolean"}, "stderr_truncated": {"type": "boolean"}, "started": {"type": "boolean"},
                "phase": {"type": "string", "enum": ["plan", "start", "run"]}, "error": nullable("string")
            }), &["exit_code", "timed_out", "oom_killed", "started", "phase"])
        }
    })
}

/// The document.
pub fn document() -> Value {
    let mut paths = Map::new();
    for o in ops() {
        let entry = paths.entry(o.path.to_string()).or_insert_with(|| json!({}));
        entry[o.method.to_ascii_lowercase()] = operation(&o);
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Zygo HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "zygo api: call warm functions, run one-shot sandboxes and scripts in runtime pools, manage tenants and tokens. Errors are {\"error\", \"code\"}; every response carries X-Zygo-Request-Id.",
        },
        "x-zygo-api": proto::api::API_VERSION,
        "servers": [{"url": "http://127.0.0.1:7700"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": components(),
    })
}

/// The document as `zygo api --openapi` prints it (and `spec/openapi.json` holds it).
pub fn document_text() -> String {
    let mut s = serde_json::to_string_pretty(&document()).unwrap_or_default();
    s.push('\n');
    s
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    /// (method, path, who, deploy) of every route, read from the router's own source.
    fn routed() -> Vec<(String, String, String, bool)> {
        let src = include_str!("routes.rs");
        let mut out = Vec::new();
        for line in src.lines() {
            let l = line.trim();
            let Some(rest) = l.strip_prefix("route!(") else {
                continue;
            };
            let parts: Vec<&str> = rest.split(',').map(str::trim).collect();
            if parts.len() < 5 || !parts[0].starts_with('"') {
                continue;
            }
            let unq = |s: &str| s.trim_matches('"').to_string();
            let who = match parts[2] {
                "None" => "none",
                "Any" => "any",
                "Op" => "op",
                "OpOrTenant" => "op-or-tenant",
                other => panic!("unknown Who {other}"),
            };
            out.push((
                unq(parts[0]),
                unq(parts[1]),
                who.to_string(),
                parts[3] == "true",
            ));
        }
        assert!(out.len() > 20, "the route table was not read: {out:?}");
        out
    }

    fn documented() -> Vec<(String, String, Value)> {
        let doc = document();
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().unwrap() {
            for (m, op) in item.as_object().unwrap() {
                out.push((m.to_ascii_uppercase(), path.clone(), op.clone()));
            }
        }
        out
    }

    #[test]
    fn every_route_is_documented() {
        let docs = documented();
        for (m, p, who, deploy) in routed() {
            let Some((_, _, op)) = docs.iter().find(|(dm, dp, _)| *dm == m && *dp == p) else {
                panic!("{m} {p} is routed but missing from the OpenAPI document");
            };
            assert_eq!(op["x-zygo-who"], json!(who), "{m} {p}: x-zygo-who");
            assert_eq!(op["x-zygo-deploy"], json!(deploy), "{m} {p}: x-zygo-deploy");
        }
    }

    #[test]
    fn every_documented_route_is_routed() {
        let routed = routed();
        for (m, p, _) in documented() {
            assert!(
                routed.iter().any(|(rm, rp, _, _)| *rm == m && *rp == p),
                "{m} {p} is documented but not routed"
            );
        }
    }

    #[test]
    fn routes_answered_without_a_token_are_marked_so() {
        let docs = documented();
        for (m, p, who, _) in routed() {
            let op = &docs
                .iter()
                .find(|(dm, dp, _)| *dm == m && *dp == p)
                .unwrap()
                .2;
            let open = op.get("security") == Some(&json!([]));
            assert_eq!(
                who == "none",
                open,
                "{m} {p}: routed as who={who}, but the document {} a token",
                if open { "does not ask" } else { "asks" }
            );
        }
        // And the table the router runs agrees with its source.
        for r in crate::http::routes::ROUTES {
            let src = routed();
            assert!(src.iter().any(|(m, p, w, d)| m == r.method
                && p == r.path
                && w == r.who.as_str()
                && *d == r.deploy));
        }
    }

    #[test]
    fn the_committed_document_is_this_builds() {
        let committed = include_str!("../../../../spec/openapi.json");
        assert!(
            committed == document_text(),
            "spec/openapi.json differs from `zygo api --openapi`; regenerate it with `zygo api --openapi > spec/openapi.json`"
        );
    }
}
