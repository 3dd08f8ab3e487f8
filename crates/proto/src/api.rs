//! The API role's vocabulary: who is calling, and the records the HTTP routes answer with.
//!
//! `zygo api` (the front) never decides who a caller is or what it may do. It forwards the
//! token the caller presented and the `X-Zygo-Tenant` header it sent, as [`Credentials`],
//! around every request ([`crate::front::Request::Api`]); the monitor hashes the token,
//! finds whose it is, applies the tenant header and the deploy gate, and scopes the answer.
//! Nothing in this module is trusted when it arrives at the monitor.

use serde::{Deserialize, Serialize};

/// The API surface version (`x-zygo-api` in the OpenAPI document, `api` in `GET /version`).
/// It moves only when a route is removed or renamed.
pub const API_VERSION: u32 = 1;

/// The longest bearer token the front forwards (a minted one is 69 bytes); longer is 401
/// without asking the monitor.
pub const MAX_TOKEN_LEN: usize = 256;

/// Tenant ids: 1–63 bytes of `[a-z0-9_-]`, starting with a letter or digit.
pub const MAX_TENANT_LEN: usize = 63;

/// What the caller presented. `token` is the bearer token as sent (`None`: no
/// `Authorization` header, which only a `--no-auth` front may forward); `tenant` is the
/// `X-Zygo-Tenant` header as sent.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Credentials {
    pub token: Option<String>,
    pub tenant: Option<String>,
}

impl std::fmt::Debug for Credentials {
    // A token never reaches a log through `{:?}`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("tenant", &self.tenant)
            .finish()
    }
}

/// How `zygo api` was started: sent once in its hello, before it reads any request.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FrontFlags {
    /// `--allow-deploy`: the bootstrap token (`ZYGO_API_TOKEN`) has deploy rights.
    pub allow_deploy: bool,
    /// `--allow-private-net` (only with `--allow-deploy`): deploy callers may name private
    /// and link-local addresses in `allow`.
    pub allow_private_net: bool,
    /// `--no-auth` (unix socket or loopback only): a request without a token acts as the
    /// bootstrap operator.
    pub no_auth: bool,
}

/// Which kind of thing a name serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ServeKind {
    /// A warm function (`PUT /fn/{name}`).
    Function,
    /// A runtime pool (`POST /runtimes`).
    Pool,
}

/// A tenant's limits. Each narrows what the function or pool was declared with (the
/// minimum of the two applies); `None` leaves that key to the declaration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    pub mem_bytes: Option<u64>,
    /// CPUs × 1000.
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub scratch_bytes: Option<u64>,
    /// "none" or "egress".
    pub network: Option<String>,
    pub allow: Option<Vec<String>>,
}

/// `PATCH /tenants/{id}/limits`, parsed by the front: each key absent (`None`), cleared
/// (`Some(None)`) or set, in the units of [`TenantLimits`]. The supervisor checks every
/// value again (it never trusts a front) and judges what needs the caller's rights
/// (private addresses in `allow`) and the ceilings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsPatch {
    pub mem_bytes: Option<Option<u64>>,
    pub cpu_millis: Option<Option<u64>>,
    pub pids: Option<Option<u64>>,
    pub timeout_ms: Option<Option<u64>>,
    pub scratch_bytes: Option<Option<u64>>,
    /// "none" or "egress".
    pub network: Option<Option<String>>,
    /// Each rule as `policy` writes it (`host:port`, `addr/len:port`, ...).
    pub allow: Option<Option<Vec<String>>>,
}

impl LimitsPatch {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        *self == LimitsPatch::default()
    }
}

/// `POST /run`, parsed by the front: the fields a run takes, each as `zygo run`'s flag of
/// the same name takes it (a size `"256M"`, a duration `"30s"`, `cpu` `"0.5"`). The
/// supervisor checks every value again, and what needs the caller's rights (private
/// addresses, a tenant's limits), before it plans the sandbox.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunBody {
    /// The program and its arguments (not empty).
    pub cmd: Vec<String>,
    pub image: Option<String>,
    pub mem: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<String>,
    pub timeout: Option<String>,
    pub scratch: Option<String>,
    pub network: Option<String>,
    pub allow: Vec<String>,
    /// `NAME=VALUE`-free: each name and its value.
    pub env: Vec<(String, String)>,
    /// `None`: the program reads end of file.
    pub stdin: Option<crate::bytes::Bytes>,
    /// The key a cancel names.
    pub key: Option<String>,
}

/// Caps of a [`RunBody`], checked by the front that parses it and again by the supervisor.
pub mod run_caps {
    /// The largest body text taken (a 1 MiB stdin written with `\u` escapes, and the rest).
    pub const MAX_SPEC: usize = 8 * 1024 * 1024;
    /// The most bytes of stdin.
    pub const MAX_STDIN: usize = 1024 * 1024;
    /// The most arguments in `cmd`, and variables in `env`.
    pub const MAX_ARGS: usize = 1024;
    pub const MAX_ENV: usize = 1024;
    /// The most bytes of `cmd` and `env` together (keys, values and arguments).
    pub const MAX_ARGV_ENV_BYTES: usize = 1024 * 1024;
    /// The longest single argument or variable (the kernel's `MAX_ARG_STRLEN`, less its NUL).
    pub const MAX_ARG: usize = 128 * 1024 - 1;
    /// The longest request key.
    pub const MAX_KEY: usize = 256;
}

/// A layer (`PUT /fn/{name}`, `POST /runtimes`), parsed by the front: the fields a
/// `[fn.NAME]` table of sandbox.toml takes, each optional, in the form sandbox.toml writes
/// it (a size `"256M"`, a duration `"30s"`, `cpu` `"0.5"`). The supervisor checks every
/// value with the same rules as sandbox.toml's (for a caller over HTTP), merges it over
/// the defaults, and judges what needs the caller's rights.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerBody {
    pub image: Option<String>,
    pub mem: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<i64>,
    pub timeout: Option<String>,
    pub scratch: Option<String>,
    pub io_bps: Option<String>,
    pub io_iops: Option<i64>,
    pub network: Option<String>,
    pub allow: Option<Vec<String>>,
    pub idle_timeout: Option<String>,
    pub min_warm: Option<i64>,
    pub max_warm: Option<i64>,
    pub agent: Option<String>,
    pub entry: Option<String>,
    pub cmd: Option<Vec<String>>,
    pub requirements: Option<String>,
    pub deps: Option<String>,
    pub mounts: Option<Vec<MountBody>>,
    pub inotify: Option<bool>,
    pub secrets: Option<Vec<String>>,
    pub env: Option<Vec<(String, String)>>,
}

/// One of a layer's `mounts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountBody {
    pub src: String,
    pub dst: String,
    pub rw: bool,
}

/// The largest layer body the front reads.
pub const MAX_LAYER: usize = 1024 * 1024;

/// A tenant's record (`GET /tenants/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantInfo {
    pub id: String,
    pub created_ms: u64,
    pub limits: TenantLimits,
    /// Functions and pools it owns (served for it by an operator).
    pub functions: Vec<String>,
    /// Digests (lowercase hex) of the scripts registered against it.
    pub scripts: Vec<String>,
    /// Tokens minted for it that are not revoked.
    pub tokens: u32,
}

/// A token's record (`GET /tokens`): never its secret.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenInfo {
    /// `tok_` + 16 hex: how a token is named in logs and revoked.
    pub id: String,
    /// `None`: an operator token.
    pub tenant: Option<String>,
    pub created_ms: u64,
    /// When it was revoked, if it was. The record stays.
    pub revoked_ms: Option<u64>,
}

/// A token just minted: the only time its secret exists outside the caller.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenMinted {
    pub id: String,
    /// `zygo_` + 64 lowercase hex.
    pub secret: String,
    pub tenant: Option<String>,
    pub created_ms: u64,
}

impl std::fmt::Debug for TokenMinted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMinted")
            .field("id", &self.id)
            .field("secret", &"<redacted>")
            .field("tenant", &self.tenant)
            .field("created_ms", &self.created_ms)
            .finish()
    }
}

/// What deleting a tenant took with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantDeleted {
    pub id: String,
    /// Functions and pools stopped.
    pub stopped: Vec<String>,
    /// Scripts removed from the store (nothing else referred to them), lowercase hex.
    pub scripts_removed: Vec<String>,
    /// Tokens revoked.
    pub tokens_revoked: u32,
}

/// A dependency set (`POST /deps`, `GET /deps`, `GET /deps/{id}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DepsInfo {
    /// `deps_` and 64 hex digits.
    pub id: String,
    pub image: String,
    /// `python` or `node`.
    pub kind: String,
    /// `building`, `ready` or `failed`.
    pub state: String,
    /// Why a failed build failed, in one line.
    pub error: Option<String>,
    /// A failed build's log (the resolver's own words; its last [`MAX_DEPS_LOG`] bytes).
    pub log: Option<String>,
}

/// The most of a failed build's log an answer carries.
pub const MAX_DEPS_LOG: usize = 256 * 1024;

/// `GET /version`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    pub version: String,
    pub api: u32,
    /// "ns": namespaces, the only backend.
    pub backend: String,
    /// "v1" or "v2".
    pub cgroup: String,
    pub landlock_abi: u32,
    /// Whether deploy callers may name private addresses; `None` for a caller without
    /// deploy rights (it is not theirs to know).
    pub private_net: Option<bool>,
    /// The tenant the caller acts for (its tenant token's, or the one an operator names);
    /// `None` for the host's callers. The HTTP front counts a caller's share of its
    /// channels by it.
    pub tenant: Option<String>,
}

/// The answer of a one-shot run (`POST /run`): the seed's shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunAnswer {
    pub request_id: String,
    /// Whether the program ran at all; `false` with `phase` "plan" or "start" is Zygo
    /// failing to build the sandbox, and `error` says why.
    pub started: bool,
    /// "plan", "start" or "run".
    pub phase: String,
    pub error: Option<String>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub wall_us: u64,
    pub cpu_us: u64,
    pub peak_rss_kb: u64,
    pub stdout: String,
    pub stdout_truncated: bool,
    pub stderr: String,
    pub stderr_truncated: bool,
    /// The run's usage record (for the front's usage delivery); `None` only from a
    /// supervisor that did not make one.
    pub usage: Option<Box<UsageRecord>>,
}

/// The function name of an MCP `run_code`'s usage record.
pub const MCP_RUN_CODE: &str = "mcp:run_code";

/// One finished request. The supervisor makes it when the request ends, whoever asked
/// (the API, the CLI, an MCP tool); a call's answer carries its record back to the front.
/// The usage log (`usage.log`, one JSON object a line) and the usage webhook carry it as a
/// [`UsageEvent`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRecord {
    /// The tenant it ran for; `_host` for the host's own callers.
    pub tenant: String,
    /// The function or pool (`api:run` for `POST /run`, `mcp:run_code` for the MCP tool).
    pub function: String,
    /// The script a pool ran (lowercase hex SHA-256), if any.
    pub script: Option<String>,
    pub request_id: String,
    pub wall_us: u64,
    pub cpu_us: u64,
    pub peak_rss_kb: u64,
    /// `ok`, `error`, `timeout`, `cancelled` or `stuck`.
    pub outcome: String,
    /// When it finished, milliseconds since the Unix epoch.
    pub finished_ms: u64,
}

/// A usage record in its JSON shape (the usage log's lines, the webhook's events): times
/// in fractional milliseconds, the script as `sha256:<hex>`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UsageEvent {
    pub tenant: String,
    pub function: String,
    pub script: Option<String>,
    pub request_id: String,
    pub wall_ms: f64,
    pub cpu_ms: f64,
    pub peak_rss_kb: u64,
    pub outcome: String,
    pub finished_ms: u64,
}

/// Fractional milliseconds back to whole microseconds (negative, not finite or too large:
/// 0, or the most a u64 holds).
fn us_of_ms(ms: f64) -> u64 {
    if ms.is_finite() && ms > 0.0 {
        // `as` saturates at u64::MAX.
        (ms * 1000.0).round() as u64
    } else {
        0
    }
}

impl UsageEvent {
    /// The record this event says (its script's `sha256:` taken off; one without it, kept).
    pub fn record(self) -> UsageRecord {
        UsageRecord {
            tenant: self.tenant,
            function: self.function,
            script: self
                .script
                .map(|s| s.strip_prefix("sha256:").map(str::to_string).unwrap_or(s)),
            request_id: self.request_id,
            wall_us: us_of_ms(self.wall_ms),
            cpu_us: us_of_ms(self.cpu_ms),
            peak_rss_kb: self.peak_rss_kb,
            outcome: self.outcome,
            finished_ms: self.finished_ms,
        }
    }
}

impl UsageRecord {
    /// The tenant name of a record made for the host's own callers.
    pub const HOST: &'static str = "_host";

    /// Its JSON shape.
    pub fn event(&self) -> UsageEvent {
        UsageEvent {
            tenant: self.tenant.clone(),
            function: self.function.clone(),
            script: self.script.as_ref().map(|s| format!("sha256:{s}")),
            request_id: self.request_id.clone(),
            wall_ms: crate::front::ms(self.wall_us),
            cpu_ms: crate::front::ms(self.cpu_us),
            peak_rss_kb: self.peak_rss_kb,
            outcome: self.outcome.clone(),
            finished_ms: self.finished_ms,
        }
    }

    /// Its JSON object ([`UsageEvent`]), on one line (no newline).
    pub fn json_line(&self) -> String {
        serde_json::json!({
            "tenant": self.tenant,
            "function": self.function,
            "script": self.script.as_ref().map(|s| format!("sha256:{s}")),
            "request_id": self.request_id,
            "wall_ms": crate::front::ms(self.wall_us),
            "cpu_ms": crate::front::ms(self.cpu_us),
            "peak_rss_kb": self.peak_rss_kb,
            "outcome": self.outcome,
            "finished_ms": self.finished_ms,
        })
        .to_string()
    }
}

/// The longest secret name.
pub const MAX_SECRET_NAME: usize = 64;

/// The largest secret value (a key, a certificate, a small credentials file).
pub const MAX_SECRET_VALUE: usize = 64 * 1024;

/// A secret's value on its way to be sealed. It prints as `<redacted>`, so no `{:?}` of a
/// request carrying one can put it in a log.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecretValue(pub Vec<u8>);

impl std::fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Whether `name` has the shape of a secret name: `[A-Za-z_][A-Za-z0-9_]{0,63}` (it becomes
/// a file name under `/run/secrets/` and in the store).
pub fn is_secret_name(name: &str) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_SECRET_NAME
        && (b[0].is_ascii_alphabetic() || b[0] == b'_')
        && b.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'_')
}

/// Whether `id` has the shape of a tenant id.
pub fn is_tenant_id(id: &str) -> bool {
    let b = id.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_TENANT_LEN
        && b[0].is_ascii_alphanumeric()
        && b.iter()
            .all(|&c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
}

/// Whether `d` is a digest as the store names things: 64 lowercase hex.
pub fn is_hex_digest(d: &str) -> bool {
    d.len() == 64
        && d.bytes()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

/// The HTTP form of a digest (`sha256:<hex>`) to the store's (`<hex>`). Bare hex is
/// accepted too. `None` when it is neither.
pub fn parse_digest(d: &str) -> Option<&str> {
    let hex = d.strip_prefix("sha256:").unwrap_or(d);
    is_hex_digest(hex).then_some(hex)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_ids() {
        for ok in ["acme", "a", "a-b_c9", "0x"] {
            assert!(is_tenant_id(ok), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "-a",
            "_a",
            "Acme",
            "a/b",
            "a.b",
            "..",
            "a b",
            "é",
            long.as_str(),
        ] {
            assert!(!is_tenant_id(bad), "{bad}");
        }
    }

    #[test]
    fn digests() {
        let hex = "a".repeat(64);
        assert_eq!(parse_digest(&hex), Some(hex.as_str()));
        assert_eq!(parse_digest(&format!("sha256:{hex}")), Some(hex.as_str()));
        assert_eq!(parse_digest(&"A".repeat(64)), None);
        assert_eq!(parse_digest(&"a".repeat(63)), None);
        assert_eq!(parse_digest("sha256:../../etc"), None);
        assert_eq!(parse_digest(&format!("sha1:{hex}")), None);
    }

    #[test]
    fn secrets_do_not_print() {
        let c = Credentials {
            token: Some("zygo_secret".into()),
            tenant: None,
        };
        assert!(!format!("{c:?}").contains("zygo_secret"));
        let m = TokenMinted {
            id: "tok_1".into(),
            secret: "zygo_secret".into(),
            tenant: None,
            created_ms: 0,
        };
        assert!(!format!("{m:?}").contains("zygo_secret"));
        let r = crate::front::Request::PutSecret {
            tenant: "acme".into(),
            name: "K".into(),
            value: SecretValue(b"hunter2".to_vec()),
        };
        assert!(!format!("{r:?}").contains("hunter2"));
    }

    #[test]
    fn secret_names() {
        for ok in ["A", "_", "STRIPE_KEY", "a1_b", &"a".repeat(64)] {
            assert!(is_secret_name(ok), "{ok}");
        }
        for bad in [
            "",
            "1A",
            "A-B",
            "a.b",
            "../x",
            "a/b",
            "é",
            " A",
            &"a".repeat(65),
        ] {
            assert!(!is_secret_name(bad), "{bad}");
        }
    }
}
