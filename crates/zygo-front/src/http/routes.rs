//! Every route `zygo api` serves, in one table: method, path template, who may call it (as
//! the supervisor will decide; recorded here for the OpenAPI document and the tests), whether
//! it needs deploy rights, and its handler. A `{param}` matches one path segment,
//! percent-decoded. The OpenAPI document (`openapi.rs`) is checked against this table's
//! source by tests: a route missing from the document, a documented route that is gone, or
//! a route answered without a token but not marked so fails the suite.

use super::handlers::{
    blobs, deps, functions, mcp, metrics, misc, pools, run, scripts, secrets, tenants, tokens,
};
use super::{Call, Front, HttpError, Out};

/// Who may call a route (the supervisor decides; this records it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    /// No token needed.
    None,
    /// Any valid token.
    Any,
    /// An operator token.
    Op,
    /// An operator, or the tenant the path names.
    OpOrTenant,
}

impl Who {
    pub fn as_str(self) -> &'static str {
        match self {
            Who::None => "none",
            Who::Any => "any",
            Who::Op => "op",
            Who::OpOrTenant => "op-or-tenant",
        }
    }
}

pub type Handler = fn(&Front, &mut Call) -> Out;

pub struct Route {
    pub method: &'static str,
    pub path: &'static str,
    pub who: Who,
    pub deploy: bool,
    pub handler: Handler,
}

macro_rules! route {
    ($m:literal, $p:literal, $who:ident, $deploy:literal, $h:path) => {
        Route {
            method: $m,
            path: $p,
            who: Who::$who,
            deploy: $deploy,
            handler: $h,
        }
    };
}

#[rustfmt::skip]
pub static ROUTES: &[Route] = &[
    route!("GET",    "/healthz",                 None,       false, misc::healthz),
    route!("GET",    "/version",                 Any,        false, misc::version),
    route!("GET",    "/fn",                      Any,        false, functions::list),
    route!("PUT",    "/fn/{name}",               Op,         true,  functions::serve),
    route!("DELETE", "/fn/{name}",               Op,         true,  functions::stop),
    route!("POST",   "/fn/{name}",               Any,        false, functions::call),
    route!("POST",   "/fn/{name}/batch",         Any,        false, functions::batch),
    route!("GET",    "/fn/{name}/logs",          Any,        false, functions::logs),
    route!("GET",    "/fn/{name}/stats",         Any,        false, functions::stats),
    route!("POST",   "/fn/{name}/warm",          Any,        false, functions::warm),
    route!("POST",   "/run",                     Op,         true,  run::run),
    route!("GET",    "/runtimes",                Any,        false, pools::list),
    route!("POST",   "/runtimes",                Op,         true,  pools::create),
    route!("DELETE", "/runtimes/{name}",         Op,         true,  pools::stop),
    route!("POST",   "/runtimes/{name}/call",    Any,        false, pools::call),
    route!("PUT",    "/scripts",                 Any,        false, scripts::put),
    route!("GET",    "/scripts/{digest}",        Any,        false, scripts::info),
    route!("DELETE", "/scripts/{digest}",        Op,         true,  scripts::delete),
    route!("PUT",    "/blobs",                   Any,        false, blobs::put),
    route!("DELETE", "/blobs/{digest}",          Op,         true,  blobs::delete),
    route!("POST",   "/deps",                    Any,        false, deps::put),
    route!("GET",    "/deps",                    Any,        false, deps::list),
    route!("GET",    "/deps/{id}",               Any,        false, deps::info),
    route!("DELETE", "/deps/{id}",               Op,         true,  deps::delete),
    route!("DELETE", "/requests/{key}",          Any,        false, misc::cancel),
    route!("POST",   "/tenants",                 Op,         false, tenants::create),
    route!("GET",    "/tenants",                 Op,         false, tenants::list),
    route!("GET",    "/tenants/{id}",            OpOrTenant, false, tenants::get),
    route!("DELETE", "/tenants/{id}",            Op,         true,  tenants::delete),
    route!("PATCH",  "/tenants/{id}/limits",     Op,         true,  tenants::limits),
    route!("POST",   "/tenants/{id}/tokens",     Op,         true,  tokens::mint_tenant),
    route!("GET",    "/tenants/{id}/secrets",    Op,         false, secrets::list),
    route!("PUT",    "/tenants/{id}/secrets/{name}", Op,     true,  secrets::put),
    route!("DELETE", "/tenants/{id}/secrets/{name}", Op,     true,  secrets::delete),
    route!("POST",   "/tokens",                  Op,         true,  tokens::mint),
    route!("GET",    "/tokens",                  Op,         true,  tokens::list),
    route!("DELETE", "/tokens/{id}",             Op,         true,  tokens::revoke),
    route!("POST",   "/drain",                   Op,         true,  misc::drain),
    route!("GET",    "/metrics",                 Any,        false, metrics::metrics),
    route!("POST",   "/mcp",                     Any,        false, mcp::post),
];

/// What a path and method found.
pub enum Found {
    Route(&'static Route, Vec<String>),
    /// A path segment that does not decode (a bad escape, not UTF-8, control characters).
    Bad(HttpError),
    NotFound(String),
    /// The path is served, not with this method: the methods it takes (`Allow`).
    WrongMethod(String),
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_start_matches('/').split('/').collect()
}

/// Match `path` (decoded segments) against a template; the parameters on a match.
fn matches(template: &str, segs: &[String]) -> Option<Vec<String>> {
    let t = segments(template);
    if t.len() != segs.len() {
        return None;
    }
    let mut params = Vec::new();
    for (t, s) in t.iter().zip(segs) {
        if t.starts_with('{') {
            if s.is_empty() {
                return None;
            }
            params.push(s.clone());
        } else if t != s {
            return None;
        }
    }
    Some(params)
}

pub fn find(method: &str, path: &str) -> Found {
    let segs: Vec<String> = match segments(path)
        .into_iter()
        .map(percent_decode)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(s) => s,
        Err(e) => return Found::Bad(e),
    };
    let mut allow: Vec<&str> = Vec::new();
    for r in ROUTES {
        if let Some(params) = matches(r.path, &segs) {
            if r.method == method {
                return Found::Route(r, params);
            }
            if !allow.contains(&r.method) {
                allow.push(r.method);
            }
        }
    }
    if !allow.is_empty() {
        return Found::WrongMethod(allow.join(", "));
    }
    Found::NotFound(format!(
        "no route {path}; GET /healthz answers without a token, and `zygo api --openapi` lists every route"
    ))
}

/// Decode `%XX` escapes; the result must be UTF-8 without control characters.
pub fn percent_decode(s: &str) -> Result<String, HttpError> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b
                .get(i + 1..i + 3)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or_else(|| HttpError::bad_request("a % escape in the URL is malformed"))?;
            out.push(hex);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    let text = String::from_utf8(out)
        .map_err(|_| HttpError::bad_request("the URL does not decode to UTF-8"))?;
    if text.chars().any(char::is_control) {
        return Err(HttpError::bad_request(
            "the URL decodes to control characters",
        ));
    }
    Ok(text)
}

/// The path (still encoded) and the decoded query of a request target.
pub fn split_url(url: &str) -> Result<(String, Vec<(String, String)>), HttpError> {
    if !url.starts_with('/') {
        return Err(HttpError::bad_request(
            "the request target must be a path starting with /",
        ));
    }
    let (path, query) = url.split_once('?').unwrap_or((url, ""));
    let mut q = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let k = percent_decode(&k.replace('+', " "))?;
        let v = percent_decode(&v.replace('+', " "))?;
        if q.iter().any(|(qk, _): &(String, String)| *qk == k) {
            return Err(HttpError::bad_request(format!(
                "query parameter {k:?} is given more than once"
            )));
        }
        q.push((k, v));
    }
    let path = if path.len() > 1 {
        path.trim_end_matches('/')
    } else {
        path
    };
    Ok((path.to_string(), q))
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_match_one_segment_each() {
        let segs = |p: &str| {
            segments(p)
                .into_iter()
                .map(|s| percent_decode(s).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            matches("/fn/{name}", &segs("/fn/a")),
            Some(vec!["a".into()])
        );
        assert_eq!(matches("/fn/{name}", &segs("/fn/a/b")), None);
        assert_eq!(matches("/fn/{name}", &segs("/fn/")), None);
        assert_eq!(
            matches("/fn/{name}", &segs("/fn/..%2F..")),
            Some(vec!["../..".into()])
        );
        assert!(matches!(find("GET", "/fn/x"), Found::WrongMethod(_)));
        assert!(matches!(find("GET", "/deps"), Found::Route(r, _) if r.path == "/deps"));
        assert!(
            matches!(find("DELETE", "/deps/deps_a"), Found::Route(r, p) if r.path == "/deps/{id}" && p == ["deps_a"])
        );
        assert!(
            matches!(find("PUT", "/tenants/a/secrets/K"), Found::Route(r, p) if r.path == "/tenants/{id}/secrets/{name}" && p == ["a", "K"])
        );
        assert!(matches!(
            find("POST", "/tenants/a/secrets"),
            Found::WrongMethod(_)
        ));
        assert!(matches!(find("GET", "/metrics"), Found::Route(r, _) if r.path == "/metrics"));
        assert!(
            matches!(find("POST", "/fn/x/batch"), Found::Route(r, _) if r.path == "/fn/{name}/batch")
        );
    }

    #[test]
    fn no_two_routes_share_a_method_and_template() {
        for (i, a) in ROUTES.iter().enumerate() {
            for b in &ROUTES[i + 1..] {
                assert!(
                    !(a.method == b.method && a.path == b.path),
                    "{} {}",
                    a.method,
                    a.path
                );
            }
        }
    }

    #[test]
    fn urls_split_and_decode() {
        let (p, q) = split_url("/fn/a?stream=1&x=%41").unwrap();
        assert_eq!(p, "/fn/a");
        assert_eq!(
            q,
            vec![("stream".into(), "1".into()), ("x".into(), "A".into())]
        );
        assert!(split_url("/a?x=1&x=2").is_err());
        assert!(split_url("http://h/a").is_err());
        assert!(percent_decode("%zz").is_err());
        assert!(percent_decode("%ff").is_err());
        assert!(percent_decode("%0a").is_err());
    }
}
