//! Who is calling over the HTTP API, decided here and nowhere else.
//!
//! `zygo api` forwards the bearer token it was sent and the `X-Zygo-Tenant` header as they
//! came ([`Credentials`]). The supervisor hashes the token and looks the hash up: the
//! bootstrap token (`ZYGO_API_TOKEN` in the supervisor's environment when it started, kept
//! only as a hash and removed from the environment, so nothing it starts ever sees it), or
//! a minted one (`zygo_` + 64 hex from the kernel's random source; only its SHA-256 is
//! stored). A revoked token is refused from the next request on; its record stays. The
//! caller is then one of [`Who`]: the bootstrap operator, an operator token, or a tenant
//! token; an operator may act for a tenant that exists by naming it in the header, a tenant
//! token may name only itself. What the caller may ask is the gate's
//! (`policy::gate`); what it then sees is scoped by [`Acting::tenant`].
//!
//! The records (tokens, tenants with their limits, who registered which script) are kept
//! through [`store::Store`] and survive a restart.

mod blobs;
pub mod secrets;
pub mod store;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proto::api::{
    is_tenant_id, Credentials, FrontFlags, LimitsPatch, TenantLimits, TokenInfo, TokenMinted,
    MAX_TOKEN_LEN,
};
use proto::front::{ErrorCode, Reply};

use sha2::{Digest, Sha256};

use super::functions::now_ms;
use super::SupervisorError;
use plumbing::random_hex;
use store::{
    secret_id, Kind, LimitsRecord, Record, ScriptRecord, SecretRecord, Store, TenantRecord,
    TokenRecord,
};

/// The environment variable that holds the bootstrap operator token.
pub const TOKEN_ENV: &str = "ZYGO_API_TOKEN";

/// Who a request comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Who {
    /// The host's own CLI, on the control socket.
    Host,
    /// The bootstrap token, or no token on a `--no-auth` API.
    Bootstrap,
    /// A minted operator token (its id).
    Operator(String),
    /// A tenant token (its tenant).
    Tenant(String),
}

/// The caller a request acts as, handed to every handler: who it is, which tenant it acts
/// for (a tenant token's own, or the one an operator named), that tenant's limits, and how
/// the API front was started.
#[derive(Debug, Clone)]
pub struct Acting {
    pub who: Who,
    /// The tenant whose things the request sees and makes; `None`: the host's.
    pub tenant: Option<String>,
    /// The acting tenant's limits (all `None` for the host).
    pub limits: TenantLimits,
    pub flags: FrontFlags,
    /// Acting for no tenant, whether it reads every caller's entries of a function's log
    /// (the host's CLI and operators) or only the host's own (`zygo mcp`, whose reader is
    /// a model, not the operator).
    pub all_logs: bool,
}

impl Acting {
    /// The host's CLI: every function by its internal name, no tenant.
    pub fn host() -> Acting {
        Acting {
            who: Who::Host,
            tenant: None,
            limits: TenantLimits::default(),
            flags: FrontFlags::default(),
            all_logs: true,
        }
    }

    /// `zygo mcp`: the host's, but it reads only the host's own calls in a log.
    pub fn mcp() -> Acting {
        Acting {
            all_logs: false,
            ..Acting::host()
        }
    }

    /// Whether the request came over the HTTP API.
    pub fn api(&self) -> bool {
        self.who != Who::Host
    }

    /// Whether a tenant token is calling (it reads no host details: paths, import errors).
    pub fn is_tenant(&self) -> bool {
        matches!(self.who, Who::Tenant(_))
    }

    /// The gate's view of the caller.
    pub fn gate_caller(&self) -> policy::gate::Caller {
        match self.who {
            Who::Host | Who::Operator(_) => policy::gate::Caller::Operator,
            Who::Bootstrap => policy::gate::Caller::Bootstrap {
                allow_deploy: self.flags.allow_deploy,
            },
            Who::Tenant(_) => policy::gate::Caller::Tenant,
        }
    }

    /// Whether the caller may name private addresses in `allow`.
    pub fn private_net(&self) -> bool {
        match self.who {
            Who::Host => true,
            _ => {
                self.gate_caller().has_deploy_rights()
                    && self.flags.allow_deploy
                    && self.flags.allow_private_net
            }
        }
    }
}

pub fn fail(code: ErrorCode, message: impl Into<String>) -> Reply {
    Reply::Error {
        code,
        message: message.into(),
        retry_after: None,
    }
}

/// Why a request is refused, before it becomes a [`Reply::Error`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: ErrorCode,
    pub message: String,
}

impl From<Refusal> for Reply {
    fn from(r: Refusal) -> Reply {
        fail(r.code, r.message)
    }
}

pub fn no(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// What a caller reads when a change could not be written (the detail is in the log).
const NOT_STORED: &str =
    "the change could not be stored; the supervisor's log says why (the state directory)";

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The API's state: tokens, tenants, script owners, and where they are kept.
pub struct Api {
    store: Box<dyn Store>,
    /// SHA-256 of the bootstrap token, if one was given.
    bootstrap: Option<String>,
    tokens: BTreeMap<String, TokenRecord>,
    /// Token id by the SHA-256 of its secret.
    by_hash: HashMap<String, String>,
    pub(super) tenants: BTreeMap<String, TenantRecord>,
    scripts: HashMap<String, ScriptRecord>,
    /// The secrets store's key (`ZYGO_SECRETS_KEY`), in memory only.
    key: Option<secrets::SealKey>,
    /// Sealed secrets by `<tenant>.<name>`.
    secrets: BTreeMap<String, SecretRecord>,
    /// Who stored which blob (see `blobs`).
    blobs: HashMap<String, ScriptRecord>,
}

impl Api {
    /// Load the records, and take the bootstrap token out of the environment (call before
    /// any thread is started).
    pub fn open(mut store: Box<dyn Store>) -> Result<Api, SupervisorError> {
        let snap = store
            .load()
            .map_err(|e| SupervisorError(format!("the API's records: {e}")))?;
        let bootstrap = std::env::var_os(TOKEN_ENV).and_then(|v| {
            let bytes = v.as_encoded_bytes().to_vec();
            if bytes.len() > MAX_TOKEN_LEN {
                log::warn!(
                    "{TOKEN_ENV} is longer than {MAX_TOKEN_LEN} bytes, which the API refuses as a token: the bootstrap token is not set"
                );
                return None;
            }
            (!bytes.is_empty()).then(|| sha256_hex(&bytes))
        });
        // Nothing the supervisor starts (launchers, sandboxes) inherits it.
        std::env::remove_var(TOKEN_ENV);
        // Nor the secrets key; one that is not a key refuses the start, saying why.
        let key = secrets::key_from_env().map_err(SupervisorError)?;
        let mut api = Api {
            store,
            bootstrap,
            tokens: BTreeMap::new(),
            by_hash: HashMap::new(),
            tenants: BTreeMap::new(),
            scripts: HashMap::new(),
            key,
            secrets: BTreeMap::new(),
            blobs: snap
                .blobs
                .into_iter()
                .map(|b| (b.digest.clone(), b))
                .collect(),
        };
        for t in snap.tokens {
            api.by_hash.insert(t.sha256.clone(), t.id.clone());
            api.tokens.insert(t.id.clone(), t);
        }
        for t in snap.tenants {
            api.tenants.insert(t.id.clone(), t);
        }
        for s in snap.scripts {
            api.scripts.insert(s.digest.clone(), s);
        }
        for s in snap.secrets {
            api.secrets.insert(s.id(), s);
        }
        match &api.key {
            Some(k) => {
                for s in api.secrets.values() {
                    if let Err(e) = secrets::open(k, &s.tenant, &s.name, &s.nonce, &s.sealed) {
                        log::warn!("{e}");
                    }
                }
            }
            None if !api.secrets.is_empty() => log::warn!(
                "{} stored secret(s) cannot be opened: the supervisor was started without {}; \
                 calls that need them are refused until it is restarted with the key",
                api.secrets.len(),
                secrets::KEY_ENV
            ),
            None => {}
        }
        log::info!(
            "API: {} token(s), {} tenant(s), {} secret(s) (store key {}); bootstrap token {}",
            api.tokens.len(),
            api.tenants.len(),
            api.secrets.len(),
            if api.key.is_some() { "set" } else { "not set" },
            if api.bootstrap.is_some() {
                "set"
            } else {
                "not set (ZYGO_API_TOKEN was empty or unset)"
            }
        );
        Ok(api)
    }

    /// Write a record. A failure's detail (the file's path, the error) goes to the log;
    /// the caller, who may be a tenant, reads a fixed phrase.
    fn put(&mut self, r: Record) -> Result<(), Refusal> {
        self.store.put(&r).map_err(|e| {
            log::error!("API store: {e}");
            no(ErrorCode::Internal, NOT_STORED)
        })
    }

    fn remove(&mut self, kind: Kind, id: &str) -> Result<(), Refusal> {
        self.store.remove(kind, id).map_err(|e| {
            log::error!("API store: {e}");
            no(ErrorCode::Internal, NOT_STORED)
        })
    }

    /// Who is calling, from what the front forwarded and how the front was started.
    pub fn resolve(&self, c: &Credentials, flags: FrontFlags) -> Result<Acting, Refusal> {
        let unauthorized = |m: &str| no(ErrorCode::Unauthorized, m);
        let who = match &c.token {
            None if flags.no_auth => Who::Bootstrap,
            None => {
                return Err(unauthorized(
                    "no token: send Authorization: Bearer <token> (ZYGO_API_TOKEN, or one from `zygo token mint`)",
                ))
            }
            Some(t) if t.is_empty() || t.len() > MAX_TOKEN_LEN => {
                return Err(unauthorized("the token is not valid"))
            }
            Some(t) => {
                let hash = sha256_hex(t.as_bytes());
                if self.bootstrap.as_deref() == Some(hash.as_str()) {
                    Who::Bootstrap
                } else {
                    let rec = self.by_hash.get(&hash).and_then(|id| self.tokens.get(id));
                    match rec {
                        Some(r) if r.revoked_ms.is_some() => {
                            return Err(unauthorized(&format!(
                                "token {} was revoked; mint another",
                                r.id
                            )))
                        }
                        Some(r) => match &r.tenant {
                            Some(t) => Who::Tenant(t.clone()),
                            None => Who::Operator(r.id.clone()),
                        },
                        None => return Err(unauthorized("the token is not valid")),
                    }
                }
            }
        };
        if let Some(h) = &c.tenant {
            if !is_tenant_id(h) {
                return Err(no(
                    ErrorCode::BadRequest,
                    "X-Zygo-Tenant is not a tenant id (1 to 63 characters of a-z, 0-9, _ and -)",
                ));
            }
        }
        let tenant = match (&who, &c.tenant) {
            (Who::Tenant(t), Some(h)) if h != t => {
                return Err(no(
                    ErrorCode::Forbidden,
                    "X-Zygo-Tenant names another tenant than this tenant token's; a tenant token acts only for its own tenant (leave the header out)",
                ))
            }
            (Who::Tenant(t), _) => {
                if !self.tenants.contains_key(t) {
                    // Its tenant was deleted: its tokens went with it.
                    return Err(unauthorized("the token is not valid"));
                }
                Some(t.clone())
            }
            (_, Some(h)) => {
                if !self.tenants.contains_key(h) {
                    return Err(no(
                        ErrorCode::NotFound,
                        format!("no tenant {h:?}; create it first (POST /tenants)"),
                    ));
                }
                Some(h.clone())
            }
            (_, None) => None,
        };
        let limits = tenant
            .as_ref()
            .and_then(|t| self.tenants.get(t))
            .map(|r| TenantLimits::from(&r.limits))
            .unwrap_or_default();
        Ok(Acting {
            who,
            tenant,
            limits,
            flags,
            all_logs: true,
        })
    }

    // --- Tokens ---------------------------------------------------------------------------

    /// Mint a token: an operator's, or a tenant's (which must exist).
    pub fn mint(&mut self, tenant: Option<String>) -> Reply {
        if let Some(t) = &tenant {
            if !is_tenant_id(t) {
                return fail(ErrorCode::BadRequest, "not a tenant id");
            }
            if !self.tenants.contains_key(t) {
                return fail(
                    ErrorCode::NotFound,
                    format!("no tenant {t:?}; create it first"),
                );
            }
        }
        let fresh = |n| {
            random_hex(n).map_err(|e| no(ErrorCode::Internal, format!("read random bytes: {e}")))
        };
        let secret = match fresh(32) {
            Ok(h) => format!("zygo_{h}"),
            Err(r) => return r.into(),
        };
        let mut id = String::new();
        while id.is_empty() || self.tokens.contains_key(&id) {
            id = match fresh(8) {
                Ok(h) => format!("tok_{h}"),
                Err(r) => return r.into(),
            };
        }
        let rec = TokenRecord {
            id: id.clone(),
            sha256: sha256_hex(secret.as_bytes()),
            tenant: tenant.clone(),
            created_ms: now_ms(),
            revoked_ms: None,
        };
        if let Err(r) = self.put(Record::Token(rec.clone())) {
            return r.into();
        }
        log::info!(
            "minted token {id} ({})",
            tenant
                .as_deref()
                .map_or("operator".to_string(), |t| format!("tenant {t}"))
        );
        self.by_hash.insert(rec.sha256.clone(), id.clone());
        self.tokens.insert(id.clone(), rec);
        let created_ms = self.tokens.get(&id).map_or(0, |r| r.created_ms);
        Reply::TokenMinted(TokenMinted {
            id,
            secret,
            tenant,
            created_ms,
        })
    }

    pub fn list_tokens(&self) -> Reply {
        Reply::Tokens(
            self.tokens
                .values()
                .map(|t| TokenInfo {
                    id: t.id.clone(),
                    tenant: t.tenant.clone(),
                    created_ms: t.created_ms,
                    revoked_ms: t.revoked_ms,
                })
                .collect(),
        )
    }

    pub fn revoke(&mut self, id: &str) -> Reply {
        let Some(rec) = self.tokens.get(id) else {
            return fail(
                ErrorCode::NotFound,
                format!("no token with id {id:?} (ids look like tok_0123456789abcdef)"),
            );
        };
        if rec.revoked_ms.is_none() {
            let mut rec = rec.clone();
            rec.revoked_ms = Some(now_ms());
            if let Err(r) = self.put(Record::Token(rec.clone())) {
                return r.into();
            }
            log::info!("revoked token {id}");
            self.tokens.insert(id.to_string(), rec);
        }
        Reply::TokenRevoked { id: id.to_string() }
    }

    /// Revoke every token of a tenant; how many were live.
    pub fn revoke_tenant_tokens(&mut self, tenant: &str) -> Result<u32, Refusal> {
        let ids: Vec<String> = self
            .tokens
            .values()
            .filter(|t| t.tenant.as_deref() == Some(tenant) && t.revoked_ms.is_none())
            .map(|t| t.id.clone())
            .collect();
        for id in &ids {
            if let Reply::Error { .. } = self.revoke(id) {
                return Err(no(ErrorCode::Internal, format!("revoke {id}")));
            }
        }
        Ok(ids.len() as u32)
    }

    /// Live tokens of a tenant.
    pub fn token_count(&self, tenant: &str) -> u32 {
        self.tokens
            .values()
            .filter(|t| t.tenant.as_deref() == Some(tenant) && t.revoked_ms.is_none())
            .count() as u32
    }

    // --- Tenants --------------------------------------------------------------------------

    /// Create a tenant if it does not exist: whether it was created.
    pub fn create_tenant(&mut self, id: &str) -> Result<bool, Refusal> {
        if !is_tenant_id(id) {
            return Err(no(
                ErrorCode::BadRequest,
                "a tenant id is 1 to 63 characters of a-z, 0-9, _ and -, starting with a letter or digit",
            ));
        }
        if id == "_host" || self.tenants.contains_key(id) {
            return Ok(false);
        }
        let rec = TenantRecord {
            id: id.to_string(),
            created_ms: now_ms(),
            limits: LimitsRecord::default(),
        };
        self.put(Record::Tenant(rec.clone()))?;
        log::info!("created tenant {id}");
        self.tenants.insert(id.to_string(), rec);
        Ok(true)
    }

    pub fn set_limits(&mut self, id: &str, limits: LimitsRecord) -> Result<(), Refusal> {
        let Some(rec) = self.tenants.get(id) else {
            return Err(no(ErrorCode::NotFound, format!("no tenant {id:?}")));
        };
        let mut rec = rec.clone();
        rec.limits = limits;
        self.put(Record::Tenant(rec.clone()))?;
        log::info!("set the limits of tenant {id}");
        self.tenants.insert(id.to_string(), rec);
        Ok(())
    }

    pub fn remove_tenant(&mut self, id: &str) -> Result<(), Refusal> {
        let theirs: Vec<String> = self
            .secrets
            .values()
            .filter(|s| s.tenant == id)
            .map(SecretRecord::id)
            .collect();
        for sid in theirs {
            self.remove(Kind::Secret, &sid)?;
            self.secrets.remove(&sid);
        }
        self.remove(Kind::Tenant, id)?;
        self.tenants.remove(id);
        log::info!("deleted tenant {id}");
        Ok(())
    }

    // --- Secrets --------------------------------------------------------------------------

    /// Whether the supervisor holds a key for the secrets store.
    pub fn has_secrets_key(&self) -> bool {
        self.key.is_some()
    }

    /// The tenant and name of a secrets request, checked; the tenant must exist.
    fn secret_target(&self, tenant: &str, name: Option<&str>) -> Result<(), Refusal> {
        if !is_tenant_id(tenant) {
            return Err(no(
                ErrorCode::BadRequest,
                "a tenant id is 1 to 63 characters of a-z, 0-9, _ and -, starting with a letter or digit",
            ));
        }
        if let Some(n) = name {
            if !proto::api::is_secret_name(n) {
                return Err(no(
                    ErrorCode::BadRequest,
                    "a secret name is 1 to 64 letters, digits and _, not starting with a digit",
                ));
            }
        }
        if !self.tenants.contains_key(tenant) {
            return Err(no(
                ErrorCode::NotFound,
                format!("no tenant {tenant:?}; create it first"),
            ));
        }
        Ok(())
    }

    /// Seal and store a tenant's secret.
    pub fn put_secret(&mut self, tenant: &str, name: &str, value: &[u8]) -> Reply {
        if let Err(r) = self.secret_target(tenant, Some(name)) {
            return r.into();
        }
        if value.len() > proto::api::MAX_SECRET_VALUE {
            return fail(
                ErrorCode::TooLarge,
                format!(
                    "a secret's value is at most {} bytes",
                    proto::api::MAX_SECRET_VALUE
                ),
            );
        }
        let Some(key) = &self.key else {
            return fail(
                ErrorCode::Unavailable,
                format!(
                    "this supervisor has no key for the secrets store: stop it, then start it with \
                     {} set (`export {}=$(zygo secrets keygen)`)",
                    secrets::KEY_ENV,
                    secrets::KEY_ENV
                ),
            );
        };
        let (nonce, sealed) = match secrets::seal(key, tenant, name, value) {
            Ok(x) => x,
            Err(e) => return fail(ErrorCode::Internal, e),
        };
        let rec = SecretRecord {
            tenant: tenant.to_string(),
            name: name.to_string(),
            nonce,
            sealed,
            created_ms: now_ms(),
        };
        if let Err(r) = self.put(Record::Secret(rec.clone())) {
            return r.into();
        }
        let replaced = self.secrets.insert(rec.id(), rec).is_some();
        log::info!(
            "{} secret {name} of tenant {tenant}",
            if replaced { "replaced" } else { "stored" }
        );
        Reply::SecretStored {
            tenant: tenant.to_string(),
            name: name.to_string(),
            replaced,
        }
    }

    pub fn delete_secret(&mut self, tenant: &str, name: &str) -> Reply {
        if let Err(r) = self.secret_target(tenant, Some(name)) {
            return r.into();
        }
        let id = secret_id(tenant, name);
        if !self.secrets.contains_key(&id) {
            return fail(
                ErrorCode::NotFound,
                format!("tenant {tenant} has no secret {name}"),
            );
        }
        if let Err(r) = self.remove(Kind::Secret, &id) {
            return r.into();
        }
        self.secrets.remove(&id);
        log::info!("deleted secret {name} of tenant {tenant}");
        Reply::SecretDeleted {
            tenant: tenant.to_string(),
            name: name.to_string(),
        }
    }

    pub fn list_secrets(&self, tenant: &str) -> Reply {
        if let Err(r) = self.secret_target(tenant, None) {
            return r.into();
        }
        Reply::Secrets {
            tenant: tenant.to_string(),
            names: self.secret_names(tenant),
        }
    }

    /// The names of a tenant's stored secrets.
    pub fn secret_names(&self, tenant: &str) -> Vec<String> {
        self.secrets
            .values()
            .filter(|s| s.tenant == tenant)
            .map(|s| s.name.clone())
            .collect()
    }

    /// The opened values of `names` for `tenant`, in order. Refused with `missing_secret`
    /// naming the first one the tenant has not stored; `unavailable` without a key or when
    /// one does not open.
    pub fn secret_values(
        &self,
        tenant: &str,
        names: &[String],
    ) -> Result<Vec<(String, secrets::Opened)>, Refusal> {
        let mut out = Vec::with_capacity(names.len());
        for name in names {
            let Some(rec) = self.secrets.get(&secret_id(tenant, name)) else {
                return Err(no(
                    ErrorCode::MissingSecret,
                    format!(
                        "tenant {tenant} has no secret {name}, which this needs; the operator sets it \
                         (PUT /tenants/{tenant}/secrets/{name}, or `zygo secrets set {tenant} {name}`)"
                    ),
                ));
            };
            let Some(key) = &self.key else {
                return Err(no(
                    ErrorCode::Unavailable,
                    format!(
                        "secret {name} of tenant {tenant} cannot be opened: the supervisor was started without {}",
                        secrets::KEY_ENV
                    ),
                ));
            };
            let v = secrets::open(key, tenant, name, &rec.nonce, &rec.sealed)
                .map_err(|e| no(ErrorCode::Unavailable, e))?;
            out.push((name.clone(), v));
        }
        Ok(out)
    }

    // --- Scripts --------------------------------------------------------------------------

    /// Whether the acting caller may name a script: the host sees every one, a tenant only
    /// those it registered.
    pub fn script_visible(&self, digest: &str, tenant: Option<&str>) -> bool {
        match tenant {
            None => true,
            Some(t) => self
                .scripts
                .get(digest)
                .is_some_and(|s| s.tenants.contains(t)),
        }
    }

    /// A script was stored (or found stored: `existed`) for `tenant` (`None`: the host).
    pub fn script_registered(
        &mut self,
        digest: &str,
        tenant: Option<&str>,
        existed: bool,
    ) -> Result<(), Refusal> {
        let old = self.scripts.get(digest).cloned();
        let rec = match (tenant, old) {
            (None, None) => return Ok(()), // the host's, as every unrecorded script is
            (None, Some(mut r)) => {
                if r.host {
                    return Ok(());
                }
                r.host = true;
                r
            }
            (Some(t), Some(mut r)) => {
                if r.tenants.contains(t) {
                    return Ok(());
                }
                r.tenants.insert(t.to_string());
                r
            }
            (Some(t), None) => ScriptRecord {
                digest: digest.to_string(),
                tenants: [t.to_string()].into(),
                // Bytes the store held before any tenant sent them are somebody else's too.
                host: existed,
            },
        };
        self.put(Record::Script(rec.clone()))?;
        self.scripts.insert(digest.to_string(), rec);
        Ok(())
    }

    /// Who holds each recorded script: (digest, tenants, whether the host does).
    pub fn script_owners(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>, bool)> {
        self.scripts
            .values()
            .map(|r| (r.digest.as_str(), &r.tenants, r.host))
    }

    /// Who holds each recorded blob, as [`Api::script_owners`].
    pub fn blob_owners(&self) -> impl Iterator<Item = (&str, &BTreeSet<String>, bool)> {
        self.blobs
            .values()
            .map(|r| (r.digest.as_str(), &r.tenants, r.host))
    }

    /// The scripts `tenant` registered, sorted.
    pub fn scripts_of(&self, tenant: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .scripts
            .values()
            .filter(|s| s.tenants.contains(tenant))
            .map(|s| s.digest.clone())
            .collect();
        v.sort();
        v
    }

    /// `tenant` lets go of its scripts: the digests nobody else refers to (to be removed
    /// from the store).
    pub fn release_scripts(&mut self, tenant: &str) -> Result<Vec<String>, Refusal> {
        let mut orphans = Vec::new();
        for d in self.scripts_of(tenant) {
            let Some(mut r) = self.scripts.get(&d).cloned() else {
                continue;
            };
            r.tenants.remove(tenant);
            if r.tenants.is_empty() && !r.host {
                self.remove(Kind::Script, &d)?;
                self.scripts.remove(&d);
                orphans.push(d);
            } else {
                self.put(Record::Script(r.clone()))?;
                self.scripts.insert(d, r);
            }
        }
        Ok(orphans)
    }

    /// Forget who registered the scripts the store no longer holds (it evicts the least
    /// recently used when full): run when the records outnumber the scripts by `slack`, so
    /// what a tenant registering ever more scripts leaves behind stays bounded.
    pub fn prune_scripts(&mut self, held: &dyn Fn(&str) -> bool, scripts: usize, slack: usize) {
        if self.scripts.len() <= scripts + slack {
            return;
        }
        let gone: Vec<String> = self.scripts.keys().filter(|d| !held(d)).cloned().collect();
        for d in gone {
            if let Err(e) = self.remove(Kind::Script, &d) {
                log::warn!("forget the owners of script {d}: {}", e.message);
                return;
            }
            self.scripts.remove(&d);
        }
    }

    /// A script was deleted from the store: nobody holds it any more.
    pub fn forget_script(&mut self, digest: &str) -> Result<(), Refusal> {
        if self.scripts.contains_key(digest) {
            self.remove(Kind::Script, digest)?;
            self.scripts.remove(digest);
        }
        Ok(())
    }
}

/// Check a `PATCH /tenants/{id}/limits` the front parsed, as if the front were hostile:
/// every number in range, `network` only `none` or `egress`, every `allow` rule one that
/// `policy` reads, and no private address unless `private_ok` (the caller's rights, which
/// only the supervisor knows).
pub fn check_limits(p: &LimitsPatch, private_ok: bool) -> Result<(), Refusal> {
    let spec = |m: String| no(ErrorCode::BadSpec, m);
    let positive = |key: &str, v: &Option<Option<u64>>| match v {
        Some(Some(0)) => Err(spec(format!("{key}: must be above 0"))),
        _ => Ok(()),
    };
    positive("mem", &p.mem_bytes)?;
    positive("cpu", &p.cpu_millis)?;
    positive("pids", &p.pids)?;
    positive("timeout", &p.timeout_ms)?;
    positive("scratch", &p.scratch_bytes)?;
    if let Some(Some(ms)) = p.timeout_ms {
        if u128::from(ms) > proto::front::MAX_DURATION.as_millis() {
            return Err(spec("timeout: at most 24h".into()));
        }
    }
    if let Some(Some(m)) = p.cpu_millis {
        policy::limits::Cpus::parse("cpu", &format!("{}.{:03}", m / 1000, m % 1000))
            .map_err(|e| spec(e.to_string()))?;
    }
    if let Some(Some(n)) = p.pids {
        policy::limits::parse_pids("pids", &n.to_string()).map_err(|e| spec(e.to_string()))?;
    }
    if let Some(Some(n)) = &p.network {
        if n != "none" && n != "egress" {
            return Err(spec(
                "network: only \"none\" or \"egress\"; host is never accepted over HTTP".into(),
            ));
        }
    }
    if let Some(Some(items)) = &p.allow {
        if items.len() > 256 {
            return Err(no(ErrorCode::BadRequest, "allow: at most 256 rules"));
        }
        let rules = items
            .iter()
            .map(|s| policy::file::AllowRule::parse("allow", s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| spec(e.to_string()))?;
        if let Some(r) = policy::gate::private_target(&rules, private_ok) {
            return Err(spec(policy::gate::private_target_refusal(r)));
        }
    }
    Ok(())
}

/// A patch's changes over `old`.
pub fn apply_limits(p: &LimitsPatch, old: &LimitsRecord) -> LimitsRecord {
    fn pick<T: Clone>(p: &Option<Option<T>>, o: &Option<T>) -> Option<T> {
        match p {
            Some(v) => v.clone(),
            None => o.clone(),
        }
    }
    LimitsRecord {
        mem_bytes: pick(&p.mem_bytes, &old.mem_bytes),
        cpu_millis: pick(&p.cpu_millis, &old.cpu_millis),
        pids: pick(&p.pids, &old.pids),
        timeout_ms: pick(&p.timeout_ms, &old.timeout_ms),
        scratch_bytes: pick(&p.scratch_bytes, &old.scratch_bytes),
        network: pick(&p.network, &old.network),
        allow: pick(&p.allow, &old.allow),
    }
}

/// The landlock ABI this kernel offers (0: none).
pub fn landlock_abi() -> u32 {
    // SAFETY: landlock_create_ruleset(NULL, 0, LANDLOCK_CREATE_RULESET_VERSION) only
    // returns the ABI version.
    let v = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            1u32,
        )
    };
    if v < 0 {
        0
    } else {
        v as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_in_temp() -> (Api, std::path::PathBuf) {
        let d = std::env::temp_dir().join(format!(
            "zygo-api-{}-{}",
            std::process::id(),
            random_hex(4).expect("random")
        ));
        let store = store::Files::open(d.clone()).expect("open");
        (Api::open(Box::new(store)).expect("load"), d)
    }

    #[test]
    fn a_tenants_scripts_are_its_own_and_owners_of_evicted_ones_are_forgotten() {
        let (mut api, dir) = api_in_temp();
        assert_eq!(api.create_tenant("acme"), Ok(true));
        assert_eq!(api.create_tenant("acme"), Ok(false));
        let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
        api.script_registered(&a, Some("acme"), false).expect("a");
        api.script_registered(&b, Some("acme"), false).expect("b");
        // Bytes the store held before the tenant sent them are the host's too.
        api.script_registered(&c, Some("acme"), true).expect("c");
        assert!(api.script_visible(&a, Some("acme")) && !api.script_visible(&a, Some("other")));
        assert!(api.script_visible(&a, None));
        // Only `a` is still held: the others' owners go (once past the slack).
        api.prune_scripts(&|d| d == a, 1, 5);
        assert_eq!(api.scripts_of("acme").len(), 3);
        api.prune_scripts(&|d| d == a, 1, 0);
        assert_eq!(api.scripts_of("acme"), vec![a.clone()]);
        // Deleting the tenant releases `a`, which nobody else registered.
        assert_eq!(api.release_scripts("acme"), Ok(vec![a.clone()]));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_limits_patch_is_checked_again() {
        let ok = LimitsPatch {
            mem_bytes: Some(Some(64 << 20)),
            cpu_millis: Some(Some(500)),
            allow: Some(Some(vec!["api.example.com:443".into()])),
            network: Some(None),
            ..LimitsPatch::default()
        };
        assert_eq!(check_limits(&ok, false), Ok(()));
        let code =
            |p: LimitsPatch, private_ok: bool| check_limits(&p, private_ok).err().map(|r| r.code);
        let private = LimitsPatch {
            allow: Some(Some(vec!["10.0.0.5:4010".into()])),
            ..LimitsPatch::default()
        };
        assert_eq!(code(private.clone(), false), Some(ErrorCode::BadSpec));
        assert_eq!(code(private, true), None);
        for bad in [
            LimitsPatch {
                mem_bytes: Some(Some(0)),
                ..LimitsPatch::default()
            },
            LimitsPatch {
                network: Some(Some("host".into())),
                ..LimitsPatch::default()
            },
            LimitsPatch {
                timeout_ms: Some(Some(u64::MAX)),
                ..LimitsPatch::default()
            },
            LimitsPatch {
                allow: Some(Some(vec!["no port".into()])),
                ..LimitsPatch::default()
            },
            LimitsPatch {
                cpu_millis: Some(Some(u64::MAX)),
                ..LimitsPatch::default()
            },
        ] {
            assert_eq!(code(bad.clone(), true), Some(ErrorCode::BadSpec), "{bad:?}");
        }
    }
}
