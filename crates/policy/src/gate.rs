//! The deploy gate: which caller may ask for what over the HTTP API, as one table.
//!
//! Calling a function somebody declared is one thing; declaring a sandbox (an image, mounts,
//! limits) is running code as the user Zygo runs as. So every API request is looked up in
//! [`RULES`]: who may ask for it at all ([`Who`]), and whether it needs deploy rights. An
//! operator token minted with `zygo token mint` always has deploy rights; the bootstrap
//! token (`ZYGO_API_TOKEN`) only when `zygo api` was started with `--allow-deploy`; a
//! tenant token never. A refusal says what to do instead.
//!
//! Beside the table: what no caller may get over HTTP whatever the body says
//! (`network = "host"`, unlimited limits — refused where layers are parsed with
//! `Source::Http`), and the private-address rule for `allow` ([`private_target`]).

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::file::AllowRule;

/// The requests the API may carry, one per kind of `proto::front::Request` it admits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /healthz`.
    Health,
    /// `GET /version`.
    Version,
    /// `GET /fn`, `GET /runtimes`.
    List,
    /// `PUT /fn/{name}`, `POST /runtimes`.
    ServeLayer,
    /// `DELETE /fn/{name}`, `DELETE /runtimes/{name}`.
    Stop,
    /// `POST /fn/{name}`, `POST /fn/{name}/batch`, `POST /runtimes/{name}/call`.
    Exec,
    /// `GET /fn/{name}/logs`.
    Logs,
    /// `GET /fn/{name}/stats`.
    Stats,
    /// `POST /fn/{name}/warm`.
    Warm,
    /// `POST /run`.
    Run,
    /// `PUT /scripts`.
    PutScript,
    /// `GET /scripts/{digest}`.
    ScriptInfo,
    /// `DELETE /scripts/{digest}`.
    DeleteScript,
    /// `PUT /blobs`.
    PutBlob,
    /// `DELETE /blobs/{digest}`.
    DeleteBlob,
    /// `POST /deps`.
    PutDeps,
    /// `GET /deps`.
    ListDeps,
    /// `GET /deps/{id}`.
    DepsInfo,
    /// `DELETE /deps/{id}`.
    DeleteDeps,
    /// `DELETE /requests/{key}`.
    Cancel,
    /// `POST /tenants`.
    CreateTenant,
    /// `GET /tenants`.
    ListTenants,
    /// `GET /tenants/{id}`.
    GetTenant,
    /// `DELETE /tenants/{id}`.
    DeleteTenant,
    /// `PATCH /tenants/{id}/limits`.
    SetLimits,
    /// `POST /tokens`, `POST /tenants/{id}/tokens`.
    MintToken,
    /// `GET /tokens`.
    ListTokens,
    /// `DELETE /tokens/{id}`.
    RevokeToken,
    /// `POST /drain`.
    Drain,
    /// `PUT /tenants/{id}/secrets/{name}`.
    PutSecret,
    /// `DELETE /tenants/{id}/secrets/{name}`.
    DeleteSecret,
    /// `GET /tenants/{id}/secrets` (names only).
    ListSecrets,
    /// `GET /metrics`.
    Metrics,
}

/// Who may ask for a route at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// Anybody, without a token (`/healthz`).
    Anyone,
    /// Any valid token.
    Any,
    /// The operator (bootstrap or minted operator token), or the tenant the request names
    /// (the monitor checks the name).
    OpOrTenant,
    /// The operator only.
    Op,
}

/// One row of the gate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub route: Route,
    pub who: Who,
    /// Whether it needs deploy rights.
    pub deploy: bool,
}

const fn rule(route: Route, who: Who, deploy: bool) -> Rule {
    Rule { route, who, deploy }
}

/// The gate, exactly as the API's documentation lists it.
pub const RULES: &[Rule] = &[
    rule(Route::Health, Who::Anyone, false),
    rule(Route::Version, Who::Any, false),
    rule(Route::List, Who::Any, false),
    rule(Route::ServeLayer, Who::Op, true),
    rule(Route::Stop, Who::Op, true),
    rule(Route::Exec, Who::Any, false),
    rule(Route::Logs, Who::Any, false),
    rule(Route::Stats, Who::Any, false),
    rule(Route::Warm, Who::Any, false),
    rule(Route::Run, Who::Op, true),
    rule(Route::PutScript, Who::Any, false),
    rule(Route::ScriptInfo, Who::Any, false),
    rule(Route::DeleteScript, Who::Op, true),
    rule(Route::PutBlob, Who::Any, false),
    rule(Route::DeleteBlob, Who::Op, true),
    rule(Route::PutDeps, Who::Any, false),
    rule(Route::ListDeps, Who::Any, false),
    rule(Route::DepsInfo, Who::Any, false),
    rule(Route::DeleteDeps, Who::Op, true),
    rule(Route::Cancel, Who::Any, false),
    rule(Route::CreateTenant, Who::Op, false),
    rule(Route::ListTenants, Who::Op, false),
    rule(Route::GetTenant, Who::OpOrTenant, false),
    rule(Route::DeleteTenant, Who::Op, true),
    rule(Route::SetLimits, Who::Op, true),
    rule(Route::MintToken, Who::Op, true),
    rule(Route::ListTokens, Who::Op, true),
    rule(Route::RevokeToken, Who::Op, true),
    rule(Route::Drain, Who::Op, true),
    // A tenant cannot set its own secrets: the operator holds that relationship.
    rule(Route::PutSecret, Who::Op, true),
    rule(Route::DeleteSecret, Who::Op, true),
    rule(Route::ListSecrets, Who::Op, false),
    rule(Route::Metrics, Who::Any, false),
];

/// The row of a route.
pub fn rule_of(route: Route) -> Rule {
    RULES
        .iter()
        .copied()
        .find(|r| r.route == route)
        // Every route has a row (a unit test walks them all); a missing one is the
        // strictest.
        .unwrap_or(Rule {
            route,
            who: Who::Op,
            deploy: true,
        })
}

/// Who is calling, as far as the gate cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// `ZYGO_API_TOKEN` (or no token on a `--no-auth` API): deploy rights only with
    /// `--allow-deploy`.
    Bootstrap { allow_deploy: bool },
    /// An operator token minted with `zygo token mint`: always deploy rights.
    Operator,
    /// A tenant token: never deploy rights.
    Tenant,
}

impl Caller {
    pub fn has_deploy_rights(self) -> bool {
        match self {
            Caller::Bootstrap { allow_deploy } => allow_deploy,
            Caller::Operator => true,
            Caller::Tenant => false,
        }
    }

    pub fn is_operator(self) -> bool {
        !matches!(self, Caller::Tenant)
    }
}

/// The gate's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Allow,
    /// Refused (HTTP 403), with what to do instead.
    Refuse(String),
}

/// What a tenant token is for, for refusals.
const TENANT_TOKEN_IS_FOR: &str = "a tenant token is for calling the functions and pools the \
    operator declared, registering its own scripts, and reading its own record";

/// May `caller` ask for `route`?
pub fn decide(route: Route, caller: Caller) -> Decision {
    let r = rule_of(route);
    let what = describe(route);
    match (r.who, caller) {
        (Who::Anyone | Who::Any | Who::OpOrTenant, _) => {}
        (Who::Op, Caller::Tenant) => {
            return Decision::Refuse(format!(
                "{what} is for the operator only; {TENANT_TOKEN_IS_FOR}"
            ))
        }
        (Who::Op, _) => {}
    }
    if !r.deploy || caller.has_deploy_rights() {
        return Decision::Allow;
    }
    Decision::Refuse(match caller {
        Caller::Tenant => format!(
            "{what} needs deploy rights, which a tenant token never has; {TENANT_TOKEN_IS_FOR}"
        ),
        _ => format!(
            "{what} needs deploy rights: the bootstrap token (ZYGO_API_TOKEN) has them only when \
             zygo api is started with --allow-deploy; restart it with --allow-deploy, or use an \
             operator token from `zygo token mint`"
        ),
    })
}

/// What a tenant's limits say of the network (`PATCH /tenants/{id}/limits`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TenantNetwork<'a> {
    /// No network limit: the function's own rules stand.
    Unset,
    /// `network = "none"`: no call of the tenant's may reach the network.
    None,
    /// `network = "egress"`, or no network limit, with an `allow` list (`None`: no list).
    Egress(Option<&'a [AllowRule]>),
}

/// May a tenant whose limits say `tenant` call a function with egress rules `function`
/// (its `allow`)? A function's filter is shared by every caller and cannot be narrowed
/// per call, so the call is refused (with a message naming the limit) unless the tenant's
/// limits cover all of it.
pub fn tenant_may_call_egress(function: &[AllowRule], tenant: TenantNetwork) -> Result<(), String> {
    let theirs = match tenant {
        TenantNetwork::Unset | TenantNetwork::Egress(None) => return Ok(()),
        TenantNetwork::None => {
            return Err(
                "the tenant's limits say network \"none\", and this reaches the network \
                 (network = \"egress\")"
                    .into(),
            )
        }
        TenantNetwork::Egress(Some(a)) => a,
    };
    // Both lists were checked when they were stored: the operator's sandbox.toml or layer,
    // and the tenant's limits through the gate. Here they are only compared.
    let compile = |what: &str, rules: &[AllowRule]| {
        crate::egress::compile(what, rules, crate::egress::PrivateNet::Allowed)
            .map_err(|e| e.to_string())
    };
    let f = compile("the function's allow", function)?;
    let t = compile("the tenant's allow", theirs)?;
    match f.not_within(&t) {
        None => Ok(()),
        Some(rule) => Err(format!(
            "the tenant's limits allow {}, which does not cover the egress rule {rule}",
            if theirs.is_empty() {
                "no destination".to_string()
            } else {
                theirs
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        )),
    }
}

/// A route in words, for messages.
pub fn describe(route: Route) -> &'static str {
    match route {
        Route::Health => "GET /healthz",
        Route::Version => "GET /version",
        Route::List => "listing functions",
        Route::ServeLayer => "serving a function or runtime pool",
        Route::Stop => "stopping a function or runtime pool",
        Route::Exec => "calling a function",
        Route::Logs => "reading logs",
        Route::Stats => "reading stats",
        Route::Metrics => "GET /metrics",
        Route::Warm => "warming a function",
        Route::Run => "a one-shot run",
        Route::PutScript => "registering a script",
        Route::ScriptInfo => "looking up a script",
        Route::DeleteScript => "deleting a script",
        Route::PutBlob => "storing a blob",
        Route::DeleteBlob => "deleting a blob",
        Route::PutDeps => "building a dependency set",
        Route::ListDeps => "listing dependency sets",
        Route::DepsInfo => "looking up a dependency set",
        Route::DeleteDeps => "deleting a dependency set",
        Route::Cancel => "cancelling requests",
        Route::CreateTenant => "creating tenants",
        Route::ListTenants => "listing tenants",
        Route::GetTenant => "reading a tenant",
        Route::DeleteTenant => "deleting a tenant",
        Route::SetLimits => "setting a tenant's limits",
        Route::MintToken => "minting tokens",
        Route::ListTokens => "listing tokens",
        Route::RevokeToken => "revoking tokens",
        Route::Drain => "draining",
        Route::PutSecret => "setting a tenant's secret",
        Route::DeleteSecret => "deleting a tenant's secret",
        Route::ListSecrets => "listing a tenant's secrets",
    }
}

/// Whether an address is one an HTTP caller may not name in `allow` without
/// `--allow-deploy --allow-private-net`: private, loopback, link-local, unspecified,
/// shared (CGNAT), or an IPv6 unique-local, link-local, loopback or IPv4-mapped such
/// address. `localhost` counts as loopback.
pub fn is_private_host(host: &str) -> bool {
    if host.eq_ignore_ascii_case("localhost") || host.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    if let Ok(v4) = host.parse::<Ipv4Addr>() {
        return private_v4(v4);
    }
    if let Ok(v6) = host.parse::<Ipv6Addr>() {
        if let Some(v4) = v6.to_ipv4_mapped() {
            return private_v4(v4);
        }
        let s = v6.segments();
        return v6.is_loopback()
            || v6.is_unspecified()
            || (s[0] & 0xfe00) == 0xfc00
            || (s[0] & 0xffc0) == 0xfe80;
    }
    false
}

fn private_v4(a: Ipv4Addr) -> bool {
    let o = a.octets();
    a.is_private()
        || a.is_loopback()
        || a.is_link_local()
        || a.is_unspecified()
        || o[0] == 0
        || (o[0] == 100 && (o[1] & 0xc0) == 64)
}

/// The first rule of `allow` that names a private address, unless private targets are
/// allowed (`--allow-deploy --allow-private-net`, for a caller with deploy rights).
pub fn private_target(allow: &[AllowRule], private_allowed: bool) -> Option<&AllowRule> {
    if private_allowed {
        return None;
    }
    allow.iter().find(|r| is_private_host(&r.host))
}

/// The refusal a private target in `allow` gets (see [`private_target`]).
pub fn private_target_refusal(rule: &AllowRule) -> String {
    format!(
        "allow: {rule} targets a private, loopback or link-local address; only a deploy caller \
         of an API started with --allow-deploy --allow-private-net may name one"
    )
}

/// Whether a function or pool of this spec is a runtime pool: an agent with no handler,
/// or a command.
pub fn is_pool(spec: &crate::FnSpec) -> bool {
    matches!(
        spec.kind,
        crate::FnKind::Agent { entry: None, .. } | crate::FnKind::Cmd(_)
    )
}

/// What a layer served over HTTP may not be, once merged over the defaults: what only
/// sandbox.toml may say (host networking, unlimited memory, which the defaults may give),
/// a private target unless `private_ok`, and a pool asked for as a function or the other
/// way round (`want_pool`).
pub fn http_layer_refusal(
    spec: &crate::FnSpec,
    want_pool: bool,
    private_ok: bool,
) -> Result<(), String> {
    let name = &spec.name;
    if spec.network == crate::Network::Host {
        return Err(
            "the defaults give network = \"host\", which a sandbox served over HTTP never has; \
             set network in the layer"
                .into(),
        );
    }
    if spec.limits.mem == crate::Mem::Unlimited {
        return Err(
            "the defaults give mem = \"unlimited\", which a sandbox served over HTTP never has; \
             set mem in the layer"
                .into(),
        );
    }
    if let Some(r) = private_target(&spec.allow, private_ok) {
        return Err(private_target_refusal(r));
    }
    match (want_pool, is_pool(spec)) {
        (false, true) => Err(format!(
            "{name}: a function's layer names its handler (agent and entry); one without is a \
             runtime pool, served with POST /runtimes"
        )),
        (true, false) => Err(format!(
            "{name}: a runtime pool's layer names an agent and no entry (or a cmd); one with an \
             entry is a function, served with PUT /fn/{name}"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod http_layer_tests {
    use super::*;
    use crate::file::Layer;

    fn spec(toml_text: &str) -> crate::FnSpec {
        let table: toml::Table = toml::from_str(toml_text).expect("toml");
        Layer::from_toml(
            "fn.x",
            &table,
            std::path::Path::new("/srv"),
            crate::Source::File,
        )
        .expect("a layer")
        .resolve("x")
        .expect("a spec")
    }

    #[test]
    fn what_only_sandbox_toml_may_say_is_refused_over_http() {
        let pool = spec("agent = \"python\"");
        let function = spec("agent = \"python\"\nentry = \"h.py:f\"");
        assert_eq!(http_layer_refusal(&pool, true, false), Ok(()));
        assert_eq!(http_layer_refusal(&function, false, false), Ok(()));
        assert!(http_layer_refusal(&pool, false, false)
            .expect_err("a pool as a function")
            .contains("POST /runtimes"));
        assert!(http_layer_refusal(&function, true, false)
            .expect_err("a function as a pool")
            .contains("PUT /fn/x"));
        let host = spec("agent = \"python\"\nnetwork = \"host\"");
        assert!(http_layer_refusal(&host, true, true)
            .expect_err("host networking")
            .contains("network = \"host\""));
        let unlimited = spec("agent = \"python\"\nmem = \"unlimited\"");
        assert!(http_layer_refusal(&unlimited, true, true)
            .expect_err("unlimited")
            .contains("unlimited"));
        let private = spec("agent = \"python\"\nnetwork = \"egress\"\nallow = [\"10.0.0.5:80\"]");
        assert!(http_layer_refusal(&private, true, false)
            .expect_err("a private target")
            .contains("--allow-private-net"));
        assert_eq!(http_layer_refusal(&private, true, true), Ok(()));
    }
}

#[cfg(test)]
mod egress_limit_tests {
    use super::*;

    fn rules(v: &[&str]) -> Vec<AllowRule> {
        v.iter()
            .map(|s| AllowRule::parse("allow", s).expect("a rule"))
            .collect()
    }

    #[test]
    fn a_tenants_network_limit_must_cover_the_functions_rules() {
        let f = rules(&["10.1.2.3:8080", "api.example.com:443", "8.8.8.0/24:53"]);
        assert_eq!(tenant_may_call_egress(&f, TenantNetwork::Unset), Ok(()));
        assert_eq!(
            tenant_may_call_egress(&f, TenantNetwork::Egress(None)),
            Ok(())
        );
        let e = tenant_may_call_egress(&f, TenantNetwork::None).expect_err("none");
        assert!(e.contains("network \"none\""), "{e}");
        // Covered: the same rules, or wider blocks (a special one only by a special one).
        let t = rules(&["10.0.0.0/8:8080", "api.example.com:443", "8.8.0.0/16:53"]);
        assert_eq!(
            tenant_may_call_egress(&f, TenantNetwork::Egress(Some(&t))),
            Ok(())
        );
        // A wider public block does not open a private address (as the relay decides).
        let t = rules(&["0.0.0.0/0:8080", "api.example.com:443", "8.8.8.0/24:53"]);
        let e = tenant_may_call_egress(&f, TenantNetwork::Egress(Some(&t))).expect_err("private");
        assert!(e.contains("10.1.2.3/32:8080"), "{e}");
        // Another port, another name, a narrower block: not covered, named.
        for (t, missing) in [
            (
                rules(&["10.1.2.3:80", "api.example.com:443", "8.8.8.0/24:53"]),
                "10.1.2.3/32:8080",
            ),
            (
                rules(&["10.1.2.3:8080", "example.com:443", "8.8.8.0/24:53"]),
                "api.example.com:443",
            ),
            (
                rules(&["10.1.2.3:8080", "api.example.com:443", "8.8.8.8:53"]),
                "8.8.8.0/24:53",
            ),
        ] {
            let e = tenant_may_call_egress(&f, TenantNetwork::Egress(Some(&t))).expect_err(missing);
            assert!(e.contains(missing), "{e}");
        }
        let e = tenant_may_call_egress(&f, TenantNetwork::Egress(Some(&[]))).expect_err("empty");
        assert!(e.contains("no destination"), "{e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BOOT_NO: Caller = Caller::Bootstrap {
        allow_deploy: false,
    };
    const BOOT_YES: Caller = Caller::Bootstrap { allow_deploy: true };

    fn allowed(route: Route, c: Caller) -> bool {
        decide(route, c) == Decision::Allow
    }

    /// Every row, for the four callers: (route, operator, bootstrap with --allow-deploy,
    /// bootstrap without, tenant).
    #[test]
    fn every_row_for_every_caller() {
        use Route::*;
        let rows: &[(Route, bool, bool, bool, bool)] = &[
            (Health, true, true, true, true),
            (Version, true, true, true, true),
            (List, true, true, true, true),
            (Exec, true, true, true, true),
            (Logs, true, true, true, true),
            (Stats, true, true, true, true),
            (Metrics, true, true, true, true),
            (Warm, true, true, true, true),
            (PutScript, true, true, true, true),
            (ScriptInfo, true, true, true, true),
            (PutBlob, true, true, true, true),
            (PutDeps, true, true, true, true),
            (ListDeps, true, true, true, true),
            (DepsInfo, true, true, true, true),
            (Cancel, true, true, true, true),
            (GetTenant, true, true, true, true),
            // Operator only, not gated.
            (CreateTenant, true, true, true, false),
            (ListTenants, true, true, true, false),
            (ListSecrets, true, true, true, false),
            // Gated.
            (ServeLayer, true, true, false, false),
            (Stop, true, true, false, false),
            (Run, true, true, false, false),
            (DeleteScript, true, true, false, false),
            (DeleteBlob, true, true, false, false),
            (DeleteDeps, true, true, false, false),
            (DeleteTenant, true, true, false, false),
            (SetLimits, true, true, false, false),
            (MintToken, true, true, false, false),
            (ListTokens, true, true, false, false),
            (RevokeToken, true, true, false, false),
            (Drain, true, true, false, false),
            (PutSecret, true, true, false, false),
            (DeleteSecret, true, true, false, false),
        ];
        assert_eq!(rows.len(), RULES.len(), "a row of the gate is not tested");
        for &(route, op, boot_yes, boot_no, tenant) in rows {
            assert_eq!(allowed(route, Caller::Operator), op, "{route:?} operator");
            assert_eq!(
                allowed(route, BOOT_YES),
                boot_yes,
                "{route:?} bootstrap +deploy"
            );
            assert_eq!(allowed(route, BOOT_NO), boot_no, "{route:?} bootstrap");
            assert_eq!(allowed(route, Caller::Tenant), tenant, "{route:?} tenant");
        }
    }

    #[test]
    fn every_route_has_exactly_one_row() {
        for r in RULES {
            assert_eq!(
                RULES.iter().filter(|x| x.route == r.route).count(),
                1,
                "{:?}",
                r.route
            );
        }
    }

    #[test]
    fn refusals_say_what_to_do() {
        let Decision::Refuse(m) = decide(Route::ServeLayer, BOOT_NO) else {
            panic!("allowed")
        };
        assert!(
            m.contains("--allow-deploy") && m.contains("zygo token mint"),
            "{m}"
        );
        let Decision::Refuse(m) = decide(Route::ServeLayer, Caller::Tenant) else {
            panic!("allowed")
        };
        assert!(m.contains("tenant token is for calling"), "{m}");
        let Decision::Refuse(m) = decide(Route::ListTenants, Caller::Tenant) else {
            panic!("allowed")
        };
        assert!(m.contains("operator only"), "{m}");
    }

    #[test]
    fn private_targets() {
        for p in [
            "10.0.0.5",
            "172.16.1.1",
            "172.31.255.255",
            "192.168.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "100.64.0.1",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "localhost",
            "a.localhost",
        ] {
            assert!(is_private_host(p), "{p}");
        }
        for p in ["8.8.8.8", "172.32.0.1", "api.example.com", "2001:db8::1"] {
            assert!(!is_private_host(p), "{p}");
        }
        let rules = vec![
            AllowRule::parse("allow", "api.example.com:443").expect("rule"),
            AllowRule::parse("allow", "10.0.0.5:4010").expect("rule"),
        ];
        assert_eq!(
            private_target(&rules, false).map(|r| r.host.as_str()),
            Some("10.0.0.5")
        );
        assert_eq!(private_target(&rules, true), None);
    }
}
