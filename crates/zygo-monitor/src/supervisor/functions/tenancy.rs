//! The API's requests that touch functions, scripts and tenants, scoped to the caller.
//!
//! A tenant's functions and pools (served for it by an operator naming it in
//! `X-Zygo-Tenant`) are kept under the key `<tenant>/<name>`, which no host function and no
//! other tenant's can have (names have no `/`), and their cgroups under
//! `tenants/<tenant>/<name>/`. A caller always sees plain names: a tenant sees its own and
//! the host's, never another tenant's — not listed, not callable, not stoppable, `not_found`
//! exactly like a name nobody served. The same holds for scripts: a digest the tenant did not
//! register is answered exactly like one the store never held.

use std::time::Duration;

use mio::Token;
use policy::file::Layer;
use policy::limits::Source;
use proto::api::{ServeKind, TenantDeleted, TenantInfo, TenantLimits, VersionInfo};
use proto::front::{ErrorCode, ExecRequest, Health, Outcome, Reply, ScriptRef};

use super::checking::Event;
use super::registry::{is_pool, FnState};
use super::requests::script_in_flight;
use super::zygotes::ZState;
use super::{fail, Ctx, Functions};
use crate::supervisor::api::{apply_limits, check_limits, no, Acting, Refusal, Who};

/// One key of a limits patch against the largest ceiling the tenant can reach: (key,
/// what the patch does to it, the ceiling, how a value is written).
type CeilingCheck = (
    &'static str,
    Option<Option<u64>>,
    Option<u64>,
    fn(u64) -> String,
);

impl Functions {
    /// The key a caller's name resolves to: over the API the acting tenant's own function
    /// of that name, else the host's; `not_found` when neither is served. The host's CLI
    /// names keys directly.
    pub(super) fn key_for(&self, who: &Acting, name: &str) -> Result<String, Refusal> {
        let missing = || {
            no(
                ErrorCode::NotFound,
                format!("no function named {name:?} is served"),
            )
        };
        if !who.api() {
            return Ok(name.to_string());
        }
        if policy::check_fn_name(name, None).is_err() {
            return Err(no(
                ErrorCode::BadRequest,
                "a function name is 1 to 63 characters of a-z, 0-9, _ and -, starting with a letter or digit",
            ));
        }
        if let Some(t) = &who.tenant {
            let own = format!("{t}/{name}");
            if self.fns.contains_key(&own) {
                return Ok(own);
            }
        }
        if self.fns.contains_key(name) {
            Ok(name.to_string())
        } else {
            Err(missing())
        }
    }

    /// The name a caller sees a function by, or `None` when it is not theirs to see: the
    /// host's CLI sees every key; over the API a tenant sees its own functions (without
    /// the prefix) and the host's; an operator acting for no tenant sees the host's.
    pub(super) fn shown(&self, who: &Acting, key: &str) -> Option<String> {
        if !who.api() {
            return Some(key.to_string());
        }
        match (key.split_once('/'), &who.tenant) {
            (None, _) => Some(key.to_string()),
            (Some((t, n)), Some(mine)) if t == mine => Some(n.to_string()),
            _ => None,
        }
    }

    /// A call made by `who`: its name resolved, a pool's script checked against what the
    /// tenant registered (and one sent with the call registered for it). A large event
    /// is first checked off the loop (see `checking`): the call comes back here with it,
    /// `event`, once it is.
    pub(super) fn exec_as(
        &mut self,
        client: Token,
        mut e: ExecRequest,
        who: &Acting,
        cx: &mut Ctx,
        event: Option<Event>,
    ) -> Option<Reply> {
        let key = match self.key_for(who, &e.name) {
            Ok(k) => k,
            Err(r) => return Some(r.into()),
        };
        if event.is_none() && Functions::checked_away(&e) {
            return self.check_away(client, e, who);
        }
        e.name = key;
        if let Err(r) = self.fill_workspace(&mut e, who) {
            return Some(r.into());
        }
        let mut sent: Option<(String, bool)> = None;
        match &e.script {
            Some(ScriptRef::Digest(d)) if who.api() => {
                if !crate::supervisor::scripts::valid_digest(d) {
                    return Some(fail(
                        ErrorCode::BadRequest,
                        "a script digest is 64 lowercase hex digits (SHA-256)",
                    ));
                }
                if !self.api.script_visible(d, who.tenant.as_deref()) {
                    let (code, message) = crate::supervisor::scripts::unknown(d);
                    return Some(fail(code, message));
                }
            }
            Some(ScriptRef::Source(source)) => {
                let d = crate::supervisor::event_check::digest(source);
                let existed = self.scripts.knows(&d);
                sent = Some((d, existed));
            }
            _ => {}
        }
        let reply = self.exec(client, e, who, cx, event);
        if let Some((d, existed)) = sent {
            // Held, or being written (a write that fails leaves a record of a digest
            // the store does not hold: `not_found`, as for an evicted one).
            if self.scripts.knows(&d) {
                if let Err(r) = self
                    .api
                    .script_registered(&d, who.tenant.as_deref(), existed)
                {
                    log::error!("register a script sent with a call: {r:?}");
                }
                self.prune_script_owners(super::SCRIPT_OWNERS_SLACK);
            }
        }
        reply
    }

    pub(super) fn stop_as(&mut self, name: &str, who: &Acting, cx: &Ctx) -> Reply {
        let key = match self.key_for(who, name) {
            Ok(k) => k,
            Err(r) => return r.into(),
        };
        match self.stop(&key, cx) {
            Reply::Stopped { .. } => Reply::Stopped {
                name: self.shown(who, &key).unwrap_or_else(|| name.to_string()),
            },
            other => other,
        }
    }

    pub(super) fn warm_as(&mut self, name: &str, n: usize, who: &Acting, cx: &mut Ctx) -> Reply {
        let key = match self.key_for(who, name) {
            Ok(k) => k,
            Err(r) => return r.into(),
        };
        // How warm a host function is kept is the operator's setting, shared by every
        // tenant: acting as a tenant, only its own functions.
        if let Some(t) = &who.tenant {
            if !key.starts_with(&format!("{t}/")) {
                return fail(
                    ErrorCode::Forbidden,
                    format!(
                        "{name} is the host's: a tenant token is for calling it, and how many of its \
                         sandboxes are kept warm is the operator's to set"
                    ),
                );
            }
        }
        if who.is_tenant()
            && self
                .fns
                .get(&key)
                .is_some_and(|f| matches!(f.state, super::registry::FnState::Failed(_)))
        {
            return fail(
                ErrorCode::Unavailable,
                format!("{name} failed to serve: {}", super::stats::HOST_FAILURE),
            );
        }
        match self.warm(&key, n, cx) {
            Reply::Warmed { ready, .. } => Reply::Warmed {
                name: name.to_string(),
                ready,
            },
            other => other,
        }
    }

    /// The supervisor's condition. Over the API (`/healthz`, which needs no token) no
    /// function is named: only how many are below `min_warm`. The host's CLI gets names.
    pub(super) fn health(&self, who: &Acting) -> Health {
        let mut below = Vec::new();
        let mut hidden = 0;
        for (key, f) in &self.fns {
            if f.state != FnState::Serving {
                continue;
            }
            let ready = f
                .zygotes
                .iter()
                .filter_map(|t| self.zygotes.get(t))
                .filter(|z| z.state == ZState::Ready)
                .count();
            if ready >= f.min_warm {
                continue;
            }
            if who.api() {
                hidden += 1;
            } else {
                below.push(key.clone());
            }
        }
        if hidden > 0 {
            below.push(format!("{hidden} function(s) or pool(s)"));
        }
        Health {
            usage_log: self.usage.health(),
            stopping: self.draining,
            below_min_warm: below,
        }
    }

    pub(super) fn version(&self, who: &Acting) -> Reply {
        let deploy = who.gate_caller().has_deploy_rights();
        Reply::Version(VersionInfo {
            version: env!("CARGO_PKG_VERSION").into(),
            api: proto::api::API_VERSION,
            backend: "ns".into(),
            cgroup: self.keeper.backend_name().into(),
            landlock_abi: crate::supervisor::api::landlock_abi(),
            private_net: deploy.then_some(who.flags.allow_deploy && who.flags.allow_private_net),
            tenant: who.tenant.clone(),
        })
    }

    /// `PUT /fn/{name}` and `POST /runtimes`: a layer parsed strictly into the same
    /// settings a `[fn.NAME]` table gives, merged over the defaults, served for the acting
    /// tenant (or the host). Answered once it is ready, or failed (`bad_spec`, why).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn serve_layer(
        &mut self,
        client: Token,
        name: &str,
        kind: ServeKind,
        layer: &proto::api::LayerBody,
        base_dir: Option<&str>,
        who: &Acting,
        cx: &mut Ctx,
    ) -> Option<Reply> {
        let spec = match parse_layer(
            name,
            kind,
            layer,
            base_dir,
            &self.defaults,
            who.private_net(),
        ) {
            Ok(s) => s,
            Err(r) => return Some(r.into()),
        };
        let key = match &who.tenant {
            Some(t) => format!("{t}/{name}"),
            None => name.to_string(),
        };
        if let Some(f) = self.fns.get(&key) {
            let pool = is_pool(&f.spec);
            if pool != (kind == ServeKind::Pool) {
                return Some(fail(
                    ErrorCode::Conflict,
                    format!(
                        "{name} is served already as a {}; stop it first",
                        if pool { "runtime pool" } else { "function" }
                    ),
                ));
            }
            let failed = matches!(f.state, FnState::Failed(_));
            if f.spec == spec && !failed {
                if f.state == FnState::Starting {
                    self.pending_layers
                        .push((client, key, name.to_string(), kind));
                    return None;
                }
                return Some(Reply::ServedOne {
                    name: name.to_string(),
                    kind,
                });
            }
            if !failed {
                // A new layer replaces the old one: its calls are cancelled.
                self.stop(&key, cx);
            }
        }
        // A dependency set still building (or failed, or unknown) is refused with its own
        // code, before anything is started. A tenant names only sets it sent.
        if let Some(id) = &spec.deps {
            if !super::deps::visible(&self.state_dir, id, who) {
                return Some(fail(
                    ErrorCode::NotFound,
                    format!("deps: no dependency set {id} (POST /deps makes one)"),
                ));
            }
        }
        if let Err(r) = self.deps_for(&spec) {
            return Some(r.into());
        }
        if let Err(e) = self.serve_one(key.clone(), spec, Vec::new(), cx) {
            return Some(fail(ErrorCode::BadSpec, e));
        }
        match self.fns.get(&key).map(|f| f.state.clone()) {
            Some(FnState::Starting) => {
                self.pending_layers
                    .push((client, key, name.to_string(), kind));
                None
            }
            Some(FnState::Failed(why)) => Some(fail(ErrorCode::BadSpec, why)),
            _ => Some(Reply::ServedOne {
                name: name.to_string(),
                kind,
            }),
        }
    }

    /// `GET /scripts/{digest}`: held and the caller's (for a tenant: registered by it), with
    /// its size; otherwise `not_found`, the same answer either way.
    pub(super) fn script_info(&self, digest: &str, who: &Acting) -> Reply {
        if !crate::supervisor::scripts::valid_digest(digest) {
            return fail(
                ErrorCode::BadRequest,
                "a script digest is 64 lowercase hex digits (SHA-256)",
            );
        }
        match self.scripts.held(digest) {
            Some(size) if self.api.script_visible(digest, who.tenant.as_deref()) => {
                Reply::ScriptHeld {
                    digest: digest.to_string(),
                    size,
                }
            }
            _ => {
                let (code, message) = crate::supervisor::scripts::unknown(digest);
                fail(code, message)
            }
        }
    }

    /// `DELETE /scripts/{digest}`: forgotten for everybody (a call in flight that runs it
    /// holds it: `conflict`).
    pub(super) fn delete_script(&mut self, digest: &str) -> Reply {
        if !crate::supervisor::scripts::valid_digest(digest) {
            return fail(
                ErrorCode::BadRequest,
                "a script digest is 64 lowercase hex digits (SHA-256)",
            );
        }
        if self.scripts.held(digest).is_none() {
            let (code, message) = crate::supervisor::scripts::unknown(digest);
            return fail(code, message);
        }
        if script_in_flight(&self.calls)(digest) {
            return fail(
                ErrorCode::Conflict,
                "a call in flight runs this script; delete it once the call has ended",
            );
        }
        if let Err((code, message)) = self.scripts.remove(digest) {
            return fail(code, message);
        }
        if let Err(r) = self.api.forget_script(digest) {
            return r.into();
        }
        log::info!("deleted script {digest}");
        Reply::ScriptDeleted {
            digest: digest.to_string(),
        }
    }

    pub(super) fn create_tenant(&mut self, id: &str) -> Reply {
        match self.api.create_tenant(id) {
            Ok(created) => Reply::Tenant {
                tenant: self.tenant_info(id),
                created,
            },
            Err(r) => r.into(),
        }
    }

    /// A tenant's record: its limits, functions (plain names), scripts and live tokens.
    pub(super) fn tenant_info(&self, id: &str) -> TenantInfo {
        let rec = self.api.tenants.get(id);
        let prefix = format!("{id}/");
        TenantInfo {
            id: id.to_string(),
            created_ms: rec.map_or(0, |r| r.created_ms),
            limits: rec
                .map(|r| TenantLimits::from(&r.limits))
                .unwrap_or_default(),
            functions: self
                .fns
                .keys()
                .filter_map(|k| k.strip_prefix(&prefix).map(str::to_string))
                .collect(),
            scripts: self.api.scripts_of(id),
            tokens: self.api.token_count(id),
        }
    }

    /// `GET /tenants/{id}`: the operator reads any; a tenant only its own (another's is
    /// `not_found`, as if it did not exist).
    pub(super) fn get_tenant(&self, id: &str, who: &Acting) -> Reply {
        let missing = || fail(ErrorCode::NotFound, format!("no tenant {id:?}"));
        if let Who::Tenant(t) = &who.who {
            if t != id {
                return missing();
            }
        }
        if !self.api.tenants.contains_key(id) {
            return missing();
        }
        Reply::Tenant {
            tenant: self.tenant_info(id),
            created: false,
        }
    }

    /// `DELETE /tenants/{id}`: its functions and pools stopped, its calls elsewhere and
    /// its one-shot runs cancelled, its tokens revoked, the scripts nobody else registered removed, and its
    /// record gone.
    pub(super) fn delete_tenant(&mut self, id: &str, cx: &Ctx) -> Reply {
        if !self.api.tenants.contains_key(id) {
            return fail(ErrorCode::NotFound, format!("no tenant {id:?}"));
        }
        let prefix = format!("{id}/");
        let keys: Vec<String> = self
            .fns
            .keys()
            .filter(|k| k.starts_with(&prefix))
            .cloned()
            .collect();
        let mut stopped = Vec::new();
        for k in keys {
            self.stop(&k, cx);
            stopped.push(k[prefix.len()..].to_string());
        }
        self.checking_tenant_deleted(id);
        let theirs: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.tenant.as_deref() == Some(id))
            .map(|(rid, _)| rid.clone())
            .collect();
        for rid in theirs {
            self.force(&rid, Outcome::Cancelled);
        }
        self.cancel_tenant_runs(id);
        // What its calls left on the host's functions (their log entries and its counters)
        // goes too: an id made again later is somebody else, who must not read them.
        for f in self.fns.values_mut() {
            f.logs.forget(id);
            f.tenant_stats.remove(id);
        }
        let tokens_revoked = match self.api.revoke_tenant_tokens(id) {
            Ok(n) => n,
            Err(r) => return r.into(),
        };
        let orphans = match self.api.release_scripts(id) {
            Ok(o) => o,
            Err(r) => return r.into(),
        };
        self.release_blobs_of(id);
        // The dependency sets it sent stay (others may use them), no longer its.
        for set in crate::deps::list(&self.state_dir) {
            if let Err(e) = crate::deps::remove_owner(&self.state_dir, &set, id) {
                log::warn!("dependency set {set}: {e}");
            }
        }
        self.deps_builds.forget_owners();
        self.scripts.let_go(id);
        // Its puts still being written are answered now, and registered to nobody.
        self.drop_store_waits(id);
        let mut scripts_removed = Vec::new();
        for d in orphans {
            match self.scripts.remove(&d) {
                Ok(true) => scripts_removed.push(d),
                Ok(false) => {}
                Err((_, m)) => log::warn!("remove script {d} of tenant {id}: {m}"),
            }
        }
        if let Err(r) = self.api.remove_tenant(id) {
            return r.into();
        }
        // The cgroups kept for its calls of the host's functions go, then its folders.
        let forget = proto::keeper::ToKeeper::ForgetTenant {
            tenant: id.to_string(),
        };
        if let proto::keeper::FromKeeper::Refused { why } = self.keeper.call(forget).reply {
            log::warn!("remove the cgroups of tenant {id}: {why}");
        }
        Reply::TenantDeleted(TenantDeleted {
            id: id.to_string(),
            stopped,
            scripts_removed,
            tokens_revoked,
        })
    }

    /// `PATCH /tenants/{id}/limits` (parsed by the front, checked again here): refused
    /// (`above_ceiling`, naming the key) where a value is above every ceiling the tenant can reach, stored.
    pub(super) fn set_limits(
        &mut self,
        id: &str,
        patch: &proto::api::LimitsPatch,
        who: &Acting,
    ) -> Reply {
        let Some(rec) = self.api.tenants.get(id) else {
            return fail(ErrorCode::NotFound, format!("no tenant {id:?}"));
        };
        if let Err(r) = check_limits(patch, who.private_net()) {
            return r.into();
        }
        let new = apply_limits(patch, &rec.limits);
        // The largest ceiling of each key among the functions and pools the tenant can
        // reach: its own, and every host one. `None`: unlimited somewhere (or nothing
        // served yet), so no value is above all of them.
        let prefix = format!("{id}/");
        let reach: Vec<&super::registry::Function> = self
            .fns
            .iter()
            .filter(|(k, _)| !k.contains('/') || k.starts_with(&prefix))
            .map(|(_, f)| f)
            .collect();
        let max_of = |get: &dyn Fn(&super::registry::Function) -> Option<u64>| -> Option<u64> {
            if reach.is_empty() {
                return None;
            }
            let mut m = 0;
            for f in &reach {
                m = m.max(get(f)?);
            }
            Some(m)
        };
        let checks: [CeilingCheck; 5] = [
            (
                "mem",
                patch.mem_bytes,
                max_of(&|f| f.limits.mem_bytes),
                |v| policy::limits::Bytes(v).to_string(),
            ),
            (
                "cpu",
                patch.cpu_millis,
                max_of(&|f| Some(u64::from(f.limits.cpu_millis))),
                |v| format!("{}", v as f64 / 1000.0),
            ),
            (
                "pids",
                patch.pids,
                max_of(&|f| Some(u64::from(f.limits.pids))),
                |v| v.to_string(),
            ),
            (
                "timeout",
                patch.timeout_ms,
                max_of(&|f| Some(f.spec.limits.timeout.as_millis() as u64)),
                |v| policy::limits::Dur(Duration::from_millis(v)).to_string(),
            ),
            (
                "scratch",
                patch.scratch_bytes,
                max_of(&|f| Some(f.spec.limits.scratch.0)),
                |v| policy::limits::Bytes(v).to_string(),
            ),
        ];
        for (key, set, ceiling, show) in checks {
            if let (Some(Some(v)), Some(c)) = (set, ceiling) {
                if v > c {
                    return fail(
                        ErrorCode::AboveCeiling,
                        format!(
                            "{key} = {} is above every ceiling tenant {id} can reach (the largest is {}); it could never take effect",
                            show(v),
                            show(c)
                        ),
                    );
                }
            }
        }
        if let Err(r) = self.api.set_limits(id, new) {
            return r.into();
        }
        Reply::Tenant {
            tenant: self.tenant_info(id),
            created: false,
        }
    }
}

/// A layer's JSON, strictly parsed into a function's settings: the same keys, types and
/// rules as a `[fn.NAME]` table of sandbox.toml (what only sandbox.toml may say refused),
/// merged over the defaults, relative paths joined onto `base_dir`. Private addresses in
/// `allow` are refused unless `private_ok`; the kind of the layer (a handler: a function;
/// none: a pool) must be the kind asked for.
fn parse_layer(
    name: &str,
    kind: ServeKind,
    body: &proto::api::LayerBody,
    base_dir: Option<&str>,
    defaults: &Layer,
    private_ok: bool,
) -> Result<policy::FnSpec, Refusal> {
    let spec_err = |m: String| no(ErrorCode::BadSpec, m);
    if policy::check_fn_name(name, None).is_err() {
        return Err(no(
            ErrorCode::BadRequest,
            "a name is 1 to 63 characters of a-z, 0-9, _ and -, starting with a letter or digit",
        ));
    }
    let table = layer_table(body);
    let base = match base_dir {
        Some(b) => {
            let p = std::path::Path::new(b);
            if !p.is_absolute()
                || p.components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
            {
                return Err(no(
                    ErrorCode::BadRequest,
                    "base_dir must be an absolute path without ..",
                ));
            }
            p.to_path_buf()
        }
        None => std::path::PathBuf::new(),
    };
    let label = format!("fn.{name}");
    let layer = Layer::from_toml(&label, &table, &base, Source::Http)
        .map_err(|e| spec_err(e.to_string()))?;
    if base_dir.is_none() {
        let relative = layer.entry.as_ref().is_some_and(|e| e.file.is_relative())
            || layer.requirements.as_ref().is_some_and(|r| r.is_relative())
            || layer.mounts.iter().flatten().any(|m| m.src.is_relative());
        if relative {
            return Err(spec_err(
                "the layer names a relative path; send base_dir, the folder on the server it is relative to".into(),
            ));
        }
    }
    let mut spec = layer
        .merge_over(defaults)
        .resolve(name)
        .map_err(|e| spec_err(e.to_string()))?;
    // What this caller's allow rules may open: also what their names may resolve to.
    spec.private_net = private_ok;
    // What only sandbox.toml may say, a layer served over HTTP may not get from the
    // defaults either; and the kind asked for must be the layer's.
    policy::gate::http_layer_refusal(&spec, kind == ServeKind::Pool, private_ok)
        .map_err(spec_err)?;
    Ok(spec)
}

/// The layer's fields as the table `policy` reads a `[fn.NAME]` from: typed values the
/// front parsed, put where sandbox.toml's would be (no text is parsed here), so that every
/// value is checked by sandbox.toml's own rules.
fn layer_table(b: &proto::api::LayerBody) -> toml::Table {
    use toml::Value as V;
    let mut t = toml::Table::new();
    let mut put = |k: &str, v: Option<V>| {
        if let Some(v) = v {
            t.insert(k.to_string(), v);
        }
    };
    let text = |s: &Option<String>| s.clone().map(V::String);
    let int = |i: &Option<i64>| i.map(V::Integer);
    let list = |l: &Option<Vec<String>>| {
        l.as_ref()
            .map(|l| V::Array(l.iter().cloned().map(V::String).collect()))
    };
    put("image", text(&b.image));
    put("mem", text(&b.mem));
    put("cpu", text(&b.cpu));
    put("pids", int(&b.pids));
    put("timeout", text(&b.timeout));
    put("scratch", text(&b.scratch));
    put("io_bps", text(&b.io_bps));
    put("io_iops", int(&b.io_iops));
    put("network", text(&b.network));
    put("allow", list(&b.allow));
    put("idle_timeout", text(&b.idle_timeout));
    put("min_warm", int(&b.min_warm));
    put("max_warm", int(&b.max_warm));
    put("agent", text(&b.agent));
    put("entry", text(&b.entry));
    put("cmd", list(&b.cmd));
    put("requirements", text(&b.requirements));
    put("deps", text(&b.deps));
    put(
        "mounts",
        b.mounts.as_ref().map(|ms| {
            V::Array(
                ms.iter()
                    .map(|m| {
                        let mut mt = toml::Table::new();
                        mt.insert("src".into(), V::String(m.src.clone()));
                        mt.insert("dst".into(), V::String(m.dst.clone()));
                        mt.insert("rw".into(), V::Boolean(m.rw));
                        V::Table(mt)
                    })
                    .collect(),
            )
        }),
    );
    put("inotify", b.inotify.map(V::Boolean));
    put("secrets", list(&b.secrets));
    put(
        "env",
        b.env.as_ref().map(|vars| {
            V::Table(
                vars.iter()
                    .map(|(k, v)| (k.clone(), V::String(v.clone())))
                    .collect(),
            )
        }),
    );
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A layer's JSON as the HTTP front parses it, then parsed here; the front's refusal
    /// is a `bad_spec` as the front sends it.
    fn parse_layer(
        name: &str,
        kind: ServeKind,
        text: &str,
        base_dir: Option<&str>,
        defaults: &Layer,
        private_ok: bool,
    ) -> Result<policy::FnSpec, Refusal> {
        let body = zygo_front::http::bodies::layer::parse(text.as_bytes()).map_err(|m| {
            // Text that is no JSON object is the body's fault, not the layer's.
            let code = if m.starts_with("the layer is") {
                ErrorCode::BadRequest
            } else {
                ErrorCode::BadSpec
            };
            no(code, m)
        })?;
        super::parse_layer(name, kind, &body, base_dir, defaults, private_ok)
    }

    fn code(r: Result<policy::FnSpec, Refusal>) -> Option<ErrorCode> {
        match r {
            Err(Refusal { code, .. }) => Some(code),
            _ => None,
        }
    }

    #[test]
    fn a_layer_is_a_fn_table_in_json() {
        let d = Layer::default();
        let s = parse_layer(
            "resize",
            ServeKind::Function,
            r#"{"agent":"python","entry":"h.py:handler","mem":"64M","cpu":0.5,"env":{"A":"1"}}"#,
            Some("/srv/app"),
            &Layer::default(),
            false,
        )
        .expect("a function");
        assert_eq!(s.name, "resize");
        assert_eq!(s.limits.mem, policy::Mem::Limited(policy::Bytes(64 << 20)));
        let pool = parse_layer(
            "py",
            ServeKind::Pool,
            r#"{"agent":"python"}"#,
            None,
            &d,
            false,
        );
        assert!(pool.is_ok());
        let f = ServeKind::Function;
        let bad = |t: &str| code(parse_layer("x", f, t, Some("/srv"), &d, false));
        assert_eq!(
            bad(r#"{"agent":"python","entry":"h.py:f","mem":"unlimited"}"#),
            Some(ErrorCode::BadSpec)
        );
        assert_eq!(
            bad(r#"{"agent":"python","entry":"h.py:f","network":"host"}"#),
            Some(ErrorCode::BadSpec)
        );
        assert_eq!(
            bad(r#"{"agent":"python","entry":"h.py:f","bogus":1}"#),
            Some(ErrorCode::BadSpec)
        );
        assert_eq!(
            bad(r#"{"agent":"python","entry":"h.py:f","mem":null}"#),
            Some(ErrorCode::BadSpec)
        );
        assert_eq!(
            bad(r#"{"agent":"python","agent":"node"}"#),
            Some(ErrorCode::BadRequest)
        );
        assert_eq!(
            bad(r#"{"agent":"python"}"#),
            Some(ErrorCode::BadSpec),
            "a pool's layer at PUT /fn"
        );
        assert_eq!(
            bad(
                r#"{"agent":"python","entry":"h.py:f","network":"egress","allow":["10.0.0.5:4010"]}"#
            ),
            Some(ErrorCode::BadSpec)
        );
        assert_eq!(
            code(parse_layer(
                "x",
                f,
                r#"{"agent":"python","entry":"h.py:f"}"#,
                None,
                &d,
                false
            )),
            Some(ErrorCode::BadSpec),
            "a relative entry needs base_dir"
        );
        assert_eq!(
            code(parse_layer(
                "x",
                f,
                r#"{"agent":"python","entry":"h.py:f"}"#,
                Some("rel/dir"),
                &d,
                false
            )),
            Some(ErrorCode::BadRequest)
        );
        assert_eq!(
            code(parse_layer("../x", f, "{}", None, &d, false)),
            Some(ErrorCode::BadRequest)
        );
        assert!(parse_layer(
            "x",
            f,
            r#"{"agent":"python","entry":"h.py:f","network":"egress","allow":["10.0.0.5:4010"]}"#,
            Some("/srv"),
            &d,
            true
        )
        .is_ok());
        // What the defaults of a sandbox.toml say only sandbox.toml may say is refused too.
        let text = "[defaults]\nmem = \"unlimited\"\n";
        let file = policy::parse_sandbox_toml(text, std::path::Path::new("/srv/sandbox.toml"))
            .expect("a file");
        let r = parse_layer(
            "x",
            ServeKind::Pool,
            r#"{"agent":"python"}"#,
            None,
            &file.defaults,
            true,
        );
        assert_eq!(code(r), Some(ErrorCode::BadSpec));
        let r = parse_layer(
            "x",
            ServeKind::Pool,
            r#"{"agent":"python","mem":"64M"}"#,
            None,
            &file.defaults,
            true,
        );
        assert!(r.is_ok());
    }
}
