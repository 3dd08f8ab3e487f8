//! front ⇄ monitor: the hello every front sends first. Its role, fixed for the life of the
//! channel, selects the one dispatch table the monitor will use for everything after it.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Protocol revision spoken on front channels. A hello with another revision ends the
/// channel: fronts and monitor come from the same binary.
pub const FRONT_PROTOCOL: u32 = 1;

/// Cap for frames on a front channel: a 16 MiB event and a workspace plus their envelope.
pub const MAX_FRONT_FRAME: usize = crate::frame::MAX_FRAME;

/// The largest workspace a call may carry: a tar of at most 64 MiB.
pub const MAX_WORKSPACE: usize = 64 * 1024 * 1024;

/// The most a call's answer carries back of its directory (`out`): 8 MiB of tar, headers
/// included. What would go past it is left out, and the answer says so.
pub const MAX_WORKSPACE_OUT: usize = 8 * 1024 * 1024;

/// Longest duration accepted anywhere (timeouts, idle_timeout).
pub const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Which kind of front is asking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    Cli,
    Api,
    Mcp,
}

/// The first frame on every front channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hello {
    pub protocol: u32,
    pub role: Role,
    /// How the front was started (only the API role sets any).
    pub flags: crate::api::FrontFlags,
}

/// The monitor's answer to a hello.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HelloReply {
    Welcome { version: String },
    Refused { reason: String },
}

/// What a front may ask. Which of these a role may send is the monitor's dispatch table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    /// Serve every `[fn.*]` of this sandbox.toml (absolute path, read by the monitor).
    ServeAll {
        file: String,
    },
    /// Serve one function of this sandbox.toml, with values for its secrets given at the
    /// shell (`--secret NAME=VALUE`; they win over stored ones).
    Serve {
        name: String,
        file: String,
        secrets: Vec<(String, crate::api::SecretValue)>,
    },
    /// Stop a function: its zygotes end, in-flight requests are cancelled.
    Stop {
        name: String,
    },
    /// Call a function with a JSON event (text; the monitor parses it).
    Exec(ExecRequest),
    /// Functions and pools with their state.
    List,
    /// The last `n` finished requests of a function.
    Logs {
        name: String,
        n: u32,
    },
    /// Counters and latency percentiles; all functions when `name` is None.
    Stats {
        name: Option<String>,
    },
    /// Keep at least `n` zygotes of a function ready.
    Warm {
        name: String,
        n: u32,
    },
    /// Cancel every in-flight request under this key.
    Cancel {
        key: String,
    },
    /// Stop taking requests; let running ones finish within `grace_ms`; then exit.
    Drain {
        grace_ms: u64,
    },
    /// Register a script in the content-addressed store (idempotent).
    PutScript {
        source: Vec<u8>,
    },
    /// The supervisor's own condition (`zygo ls` and `zygo stats` show it).
    Health,

    // --- The API role's requests (the CLI may send the host-side ones too). ---
    /// One request from `zygo api`, with who sent it. The monitor decides who that is and
    /// whether `request` (never itself an `Api`) is theirs to make.
    Api {
        who: crate::api::Credentials,
        /// Decoded at most one level deep: an `Api` inside it decodes (and the monitor
        /// refuses it), one inside that ends the frame's decoding, so a hostile front
        /// cannot make the decoder recurse without bound.
        #[serde(deserialize_with = "api_inner")]
        request: Box<Request>,
    },
    /// Serve one function or pool from a layer: the fields a `[fn.NAME]` table takes,
    /// every one optional, merged over the defaults. `base_dir` is the host folder its
    /// relative paths are relative to.
    ServeLayer {
        name: String,
        kind: crate::api::ServeKind,
        layer: Box<crate::api::LayerBody>,
        base_dir: Option<String>,
    },
    /// A one-shot run (`POST /run`).
    Run {
        spec: crate::api::RunBody,
    },
    /// Whether the store holds a script (lowercase hex), and its size. Never its bytes.
    ScriptInfo {
        digest: String,
    },
    /// Forget a script.
    DeleteScript {
        digest: String,
    },
    /// Create a tenant (idempotent).
    CreateTenant {
        id: String,
    },
    ListTenants,
    GetTenant {
        id: String,
    },
    /// Delete a tenant: stop its functions and pools, remove the scripts nothing else
    /// refers to, revoke its tokens.
    DeleteTenant {
        id: String,
    },
    /// Set some of a tenant's limits (`null` in the body clears one).
    SetLimits {
        id: String,
        limits: crate::api::LimitsPatch,
    },
    /// Mint a token: an operator token, or one tenant's.
    MintToken {
        tenant: Option<String>,
    },
    ListTokens,
    RevokeToken {
        id: String,
    },
    /// `GET /version`.
    Version,
    /// Seal and store a tenant's secret (replacing one of that name).
    PutSecret {
        tenant: String,
        name: String,
        value: crate::api::SecretValue,
    },
    /// Forget a tenant's secret.
    DeleteSecret {
        tenant: String,
        name: String,
    },
    /// The names of a tenant's secrets (never a value: there is no request that reads one).
    ListSecrets {
        tenant: String,
    },
    /// `GET /metrics`: the per-function numbers of every function the caller can see.
    Metrics,
    /// A finished request that ran outside the supervisor (`zygo mcp`'s `run_code`), for
    /// the usage log. Only the MCP server's monitor side sends it; the supervisor checks
    /// its shape.
    RecordUsage(crate::api::UsageRecord),
    /// Store a blob (a workspace tar calls name by digest) in the content-addressed blob
    /// store, owned by the acting tenant (idempotent).
    PutBlob {
        bytes: crate::bytes::Bytes,
    },
    /// Forget a blob (lowercase hex).
    DeleteBlob {
        digest: String,
    },
    /// Build a dependency set from these files on this image, unless it is built or
    /// building (`POST /deps`); answered at once.
    PutDeps {
        image: String,
        /// (file name, text): `requirements.txt`, or `package.json` and
        /// `package-lock.json`.
        files: Vec<(String, String)>,
    },
    /// The dependency sets the caller may see.
    ListDeps,
    /// One dependency set, with its log when its build failed.
    DepsInfo {
        id: String,
    },
    /// Forget a dependency set no function or pool is served on.
    DeleteDeps {
        id: String,
    },
}

std::thread_local! {
    /// How many `Api` envelopes the decoder is inside of, on this thread.
    static API_DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `Request::Api`'s inner request: refused at decode time past one nested envelope.
fn api_inner<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Box<Request>, D::Error> {
    struct Leave;
    impl Drop for Leave {
        fn drop(&mut self) {
            API_DEPTH.with(|c| c.set(c.get().saturating_sub(1)));
        }
    }
    let depth = API_DEPTH.with(|c| {
        let d = c.get();
        c.set(d + 1);
        d
    });
    let _leave = Leave;
    if depth >= 2 {
        return Err(serde::de::Error::custom(
            "an Api request nested inside another Api request",
        ));
    }
    Request::deserialize(d).map(Box::new)
}

/// What the supervisor says of its own condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    pub usage_log: UsageLogHealth,
    /// A drain has begun: the supervisor takes no new calls (`/healthz` says `stopping`).
    pub stopping: bool,
    /// Functions and pools with fewer ready zygotes than their `min_warm`.
    pub below_min_warm: Vec<String>,
}

impl Health {
    /// Whether anything is wrong.
    pub fn degraded(&self) -> bool {
        !self.reasons().is_empty()
    }

    /// What is wrong, one phrase each (`/healthz`'s `reason`, `zygo ls`'s warning).
    pub fn reasons(&self) -> Vec<String> {
        let mut r = Vec::new();
        if let Some(e) = &self.usage_log.error {
            r.push(format!("the usage log cannot be written: {e}"));
        }
        if self.usage_log.dropped > 0 {
            r.push(format!(
                "{} usage records were dropped while the log could not be written",
                self.usage_log.dropped
            ));
        }
        if !self.below_min_warm.is_empty() {
            r.push(format!(
                "below min_warm: {}",
                self.below_min_warm.join(", ")
            ));
        }
        r
    }
}

/// The usage log: whether it can be written, and what is held or was lost meanwhile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageLogHealth {
    /// Why the last write failed, while writes fail.
    pub error: Option<String>,
    /// Records held in memory, to be written when the log can be.
    pub held: u64,
    /// Records dropped because too many were held (oldest first).
    pub dropped: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecRequest {
    pub name: String,
    pub event: String,
    pub key: Option<String>,
    /// Narrows the function's timeout; never widens it.
    pub timeout_ms: Option<u64>,
    /// Send output and progress as they happen, before the answer.
    pub stream: bool,
    /// For a runtime pool: the script to run (a pool has no handler of its own).
    pub script: Option<ScriptRef>,
    /// A tar (at most [`MAX_WORKSPACE`] bytes) unpacked into the request's own directory
    /// before its handler is given the request.
    pub workspace: Option<crate::bytes::Bytes>,
    /// A stored blob (lowercase hex SHA-256) to use as the workspace instead: the monitor
    /// reads it for the caller, who must own it. At most one of `workspace` and this.
    pub workspace_blob: Option<String>,
    /// Pack the request's directory after its handler answered, and send it back with the
    /// answer (`ExecAnswer::workspace_out`).
    pub out: bool,
}

/// Which script a pool runs for a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ScriptRef {
    /// One registered before (lowercase hex SHA-256 of its bytes).
    Digest(String),
    /// These bytes, for this call (stored like any script: the same bytes are one file).
    Source(Vec<u8>),
}

/// Why a request was refused or failed, as a word the fronts map to statuses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorCode {
    BadRequest,
    BadSpec,
    NotFound,
    Forbidden,
    Conflict,
    TooLarge,
    Busy,
    Unavailable,
    Internal,
    /// No token, an unknown one, or a revoked one (HTTP 401).
    Unauthorized,
    /// A limit above every ceiling the tenant can reach (HTTP 422; the message names the
    /// key).
    AboveCeiling,
    /// A call needs a secret the calling tenant has not stored (HTTP 400; the message names
    /// it).
    MissingSecret,
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::BadSpec => "bad_spec",
            ErrorCode::NotFound => "not_found",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::Conflict => "conflict",
            ErrorCode::TooLarge => "too_large",
            ErrorCode::Busy => "busy",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::AboveCeiling => "above_ceiling",
            ErrorCode::MissingSecret => "missing_secret",
        }
    }
}

/// How a request ended. Exactly one word per finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Ok,
    Error,
    Timeout,
    Cancelled,
    Stuck,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Error => "error",
            Outcome::Timeout => "timeout",
            Outcome::Cancelled => "cancelled",
            Outcome::Stuck => "stuck",
        }
    }
}

/// A call's numbers. Times are kept in microseconds and shown as fractional milliseconds
/// (`wall_ms: 0.412`): a fast call is not 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metrics {
    pub wall_us: u64,
    pub cpu_us: u64,
    pub peak_rss_kb: u64,
}

/// Microseconds as the fractional milliseconds every answer shows (`412` → `0.412`).
pub fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

/// The answer to one call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecAnswer {
    pub request_id: String,
    pub outcome: Outcome,
    /// JSON text of the handler's value when `outcome` is Ok.
    pub result: Option<String>,
    /// What went wrong, in words a caller (or a model) can act on.
    pub error: Option<String>,
    pub traceback: Option<String>,
    /// The code the handler's process exited with, when the error was its exiting
    /// (`sys.exit(3)`, `process.exit(3)`, a warm-exec command's status); None when it
    /// raised, returned, or was killed.
    pub exit_code: Option<i32>,
    /// False when the request was refused or cancelled before its child was let go.
    pub started: bool,
    pub oom_killed: bool,
    pub stdout: String,
    pub stdout_truncated: bool,
    pub stderr: String,
    pub stderr_truncated: bool,
    pub metrics: Metrics,
    /// The call's usage record (for the front's usage delivery): every answered call has
    /// one.
    pub usage: Option<Box<crate::api::UsageRecord>>,
    /// With `out`: the request's directory as a tar, packed once its handler answered
    /// (returned or raised). None when `out` was not asked for, when the handler never
    /// answered, or when the directory was no longer a directory.
    pub workspace_out: Option<crate::bytes::Bytes>,
    /// Entries were left out of `workspace_out` because a cap was reached
    /// ([`MAX_WORKSPACE_OUT`] bytes, or the entry and depth caps).
    pub workspace_out_truncated: bool,
    /// A streamed call only: some of its output or progress was not sent as events
    /// because its front had not read what it was already sent (the events sent are a
    /// prefix; `stdout` and `stderr` above are still kept whole up to their caps).
    pub stream_truncated: bool,
}

/// Something that happened during a streamed call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExecEvent {
    Stdout(String),
    Stderr(String),
    Progress(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ZygoteCounts {
    pub ready: u32,
    pub busy: u32,
    pub frozen: u32,
    pub starting: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionInfo {
    /// As the caller knows it (a tenant's own functions by their plain name).
    pub name: String,
    /// The tenant it is served for; `None`: the host's, which every tenant may call.
    pub tenant: Option<String>,
    /// "function" or "pool".
    pub kind: String,
    /// "serving", "starting", "failed", "stopping".
    pub state: String,
    /// Why it failed to serve (the import error), when it did.
    pub error: Option<String>,
    pub zygotes: ZygoteCounts,
    pub in_flight: u32,
    pub min_warm: u32,
    pub max_warm: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogEntry {
    pub request_id: String,
    pub finished_ms: u64,
    pub outcome: Outcome,
    pub wall_us: u64,
    pub error: Option<String>,
    pub stdout: String,
    pub stderr: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionStats {
    pub name: String,
    pub requests: u64,
    pub ok: u64,
    pub error: u64,
    pub timeout: u64,
    pub cancelled: u64,
    pub stuck: u64,
    pub p50_wall_us: u64,
    pub p99_wall_us: u64,
    pub peak_rss_kb: u64,
}

/// The monitor's answers. Every request gets exactly one final reply; a streamed Exec
/// gets any number of `Event`s before it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Error {
        code: ErrorCode,
        message: String,
        /// Seconds to wait before retrying (busy, unavailable).
        retry_after: Option<u32>,
    },
    Served {
        served: Vec<String>,
        failed: Vec<(String, String)>,
    },
    Stopped {
        name: String,
    },
    Event(ExecEvent),
    Answer(ExecAnswer),
    Functions(Vec<FunctionInfo>),
    /// A function's last finished requests, oldest first, within the answer's byte budget:
    /// `left_out` of the newest asked for did not fit it (the oldest of them are the ones
    /// left out).
    Logs {
        entries: Vec<LogEntry>,
        left_out: u32,
    },
    Stats(Vec<FunctionStats>),
    Warmed {
        name: String,
        ready: u32,
    },
    Cancelled {
        count: u32,
    },
    /// The drain asked for is over (the supervisor exits next): how many of the calls in
    /// flight when it began finished, and how many the grace cut off.
    Drained {
        finished: u32,
        cut_off: u32,
    },
    /// The script's digest (lowercase hex SHA-256 of its bytes).
    ScriptStored {
        digest: String,
        size: u64,
        /// The store already held exactly these bytes.
        existed: bool,
    },
    Health(Health),
    /// A function or pool served from a layer.
    ServedOne {
        name: String,
        kind: crate::api::ServeKind,
    },
    /// A one-shot run ended (or could not start).
    RunAnswer(crate::api::RunAnswer),
    /// The store holds this script (`ScriptInfo`).
    ScriptHeld {
        digest: String,
        size: u64,
    },
    ScriptDeleted {
        digest: String,
    },
    /// A blob's digest (lowercase hex SHA-256 of its bytes).
    BlobStored {
        digest: String,
        size: u64,
        /// The store already held exactly these bytes.
        existed: bool,
    },
    BlobDeleted {
        digest: String,
    },
    /// A dependency set as it stands (`PutDeps`, `DepsInfo`).
    Deps(crate::api::DepsInfo),
    DepsList(Vec<crate::api::DepsInfo>),
    DepsDeleted {
        id: String,
    },
    /// `created`: false when it existed already.
    Tenant {
        tenant: crate::api::TenantInfo,
        created: bool,
    },
    Tenants(Vec<crate::api::TenantInfo>),
    TenantDeleted(crate::api::TenantDeleted),
    TokenMinted(crate::api::TokenMinted),
    Tokens(Vec<crate::api::TokenInfo>),
    TokenRevoked {
        id: String,
    },
    Version(crate::api::VersionInfo),
    /// A secret was sealed and stored; `replaced`: one of that name existed.
    SecretStored {
        tenant: String,
        name: String,
        replaced: bool,
    },
    SecretDeleted {
        tenant: String,
        name: String,
    },
    /// A tenant's secrets, by name.
    Secrets {
        tenant: String,
        names: Vec<String>,
    },
    /// `Metrics`: one entry per function or pool the caller can see, and whether the
    /// caller may read the API process's own counts (those of every caller; the monitor
    /// decides, today for every caller, as the API's specification has it).
    Metrics {
        functions: Vec<FunctionMetrics>,
        process_counts: bool,
    },
    /// `RecordUsage`: the record is in the usage log's queue.
    UsageRecorded,
}

/// One function's numbers for `GET /metrics`: counted from every call (an operator's
/// view) or from the caller's own (a tenant's), as `Stats` is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionMetrics {
    /// As the caller knows it (a tenant's own functions by their plain name).
    pub name: String,
    /// `function` or `pool`.
    pub kind: String,
    pub requests: u64,
    /// Calls that did not end `ok`.
    pub failures: u64,
    /// The memory its sandboxes hold now (zygotes and children), in bytes.
    pub rss_bytes: u64,
    /// `starting`, `serving` or `failed`.
    pub state: String,
}

#[cfg(test)]
mod nesting_tests {
    use super::*;
    use crate::api::Credentials;

    fn wrap(r: Request) -> Request {
        Request::Api {
            who: Credentials {
                token: None,
                tenant: None,
            },
            request: Box::new(r),
        }
    }

    #[test]
    fn one_nested_api_decodes_and_deeper_ones_do_not() {
        let once = wrap(wrap(Request::List));
        let bytes = crate::codec::encode(&once).expect("encode");
        assert_eq!(crate::codec::decode::<Request>(&bytes).ok(), Some(once));
        // 100 000 envelopes, written by hand (encoding them would recurse as deep): each
        // is the bytes `wrap` puts before its inner request.
        let list = crate::codec::encode(&Request::List).expect("encode");
        let one = crate::codec::encode(&wrap(Request::List)).expect("encode");
        let prefix = &one[..one.len() - list.len()];
        let mut bytes = prefix.repeat(100_000);
        bytes.extend_from_slice(&list);
        assert!(crate::codec::decode::<Request>(&bytes).is_err());
        // The depth counter is back at zero: a plain one still decodes.
        let plain = wrap(Request::Version);
        let bytes = crate::codec::encode(&plain).expect("encode");
        assert_eq!(crate::codec::decode::<Request>(&bytes).ok(), Some(plain));
    }
}
