//! `PATCH /tenants/{id}/limits`.

use policy::limits::Source;
use proto::api::LimitsPatch;
use proto::front::ErrorCode;
use serde_json::Value;

use crate::http::HttpError;

/// The keys the body takes.
pub const KEYS: &[&str] = &[
    "mem", "cpu", "pids", "timeout", "scratch", "network", "allow",
];

/// The largest limits body read.
pub const MAX_BODY: usize = 64 * 1024;

/// The most rules an `allow` list may have.
pub const MAX_ALLOW: usize = 256;

fn spec(e: policy::PolicyError) -> HttpError {
    HttpError::from_code(ErrorCode::BadSpec, e.to_string(), None)
}

fn bad(m: impl Into<String>) -> HttpError {
    HttpError::bad_request(m)
}

/// Parse a limits body strictly: a JSON object of the seven keys, at least one, `null`
/// clearing one. `unlimited` and `network: "host"` are refused (never over HTTP).
pub fn parse(text: &[u8]) -> Result<LimitsPatch, HttpError> {
    if text.len() > MAX_BODY {
        return Err(HttpError::from_code(
            ErrorCode::TooLarge,
            "the limits body is over 64 KiB".into(),
            None,
        ));
    }
    let v: Value = proto::json::from_slice_strict(text)
        .map_err(|e| bad(format!("the limits are not JSON: {e}")))?;
    let Value::Object(map) = v else {
        return Err(bad(format!(
            "the limits are a JSON object with any of {}",
            KEYS.join(", ")
        )));
    };
    if let Some(k) = map.keys().find(|k| !KEYS.contains(&k.as_str())) {
        return Err(bad(format!(
            "unknown limit {}; the limits are {}",
            policy::Shown::new(k),
            KEYS.join(", ")
        )));
    }
    if map.is_empty() {
        return Err(bad(format!("name at least one limit: {}", KEYS.join(", "))));
    }
    let mut p = LimitsPatch::default();
    for (key, v) in &map {
        let clear = v.is_null();
        let set = |f: &dyn Fn() -> Result<u64, HttpError>| -> Result<Option<u64>, HttpError> {
            if clear {
                Ok(None)
            } else {
                f().map(Some)
            }
        };
        match key.as_str() {
            "mem" => p.mem_bytes = Some(set(&|| size("mem", v))?),
            "scratch" => {
                p.scratch_bytes = Some(set(&|| {
                    let b = size("scratch", v)?;
                    policy::limits::parse_size("scratch", &b.to_string()).map_err(spec)?;
                    Ok(b)
                })?)
            }
            "cpu" => {
                p.cpu_millis = Some(set(&|| {
                    let text = match v {
                        Value::Number(n) => n.to_string(),
                        Value::String(s) => s.clone(),
                        _ => return Err(bad("cpu must be a number such as 0.5")),
                    };
                    Ok(u64::from(
                        policy::limits::Cpus::parse("cpu", &text)
                            .map_err(spec)?
                            .millis(),
                    ))
                })?)
            }
            "pids" => {
                p.pids = Some(set(&|| {
                    let Some(n) = v.as_u64() else {
                        return Err(bad("pids must be a whole number such as 64"));
                    };
                    Ok(u64::from(
                        policy::limits::parse_pids("pids", &n.to_string()).map_err(spec)?,
                    ))
                })?)
            }
            "timeout" => p.timeout_ms = Some(set(&|| timeout(v))?),
            "network" => {
                p.network = Some(if clear {
                    None
                } else {
                    match v.as_str() {
                        Some(n @ ("none" | "egress")) => Some(n.to_string()),
                        Some("host") => {
                            return Err(HttpError::from_code(
                                ErrorCode::BadSpec,
                                "network: host is never accepted over HTTP; it can only be \
                                 declared in sandbox.toml"
                                    .into(),
                                None,
                            ))
                        }
                        _ => return Err(bad("network must be \"none\" or \"egress\"")),
                    }
                })
            }
            "allow" => {
                p.allow = Some(if clear {
                    None
                } else {
                    let Some(items) = v.as_array() else {
                        return Err(bad("allow must be a list of \"host:port\" strings"));
                    };
                    if items.len() > MAX_ALLOW {
                        return Err(bad(format!("allow: at most {MAX_ALLOW} rules")));
                    }
                    let mut rules = Vec::with_capacity(items.len());
                    for it in items {
                        let Some(s) = it.as_str() else {
                            return Err(bad("allow must be a list of \"host:port\" strings"));
                        };
                        let rule = policy::file::AllowRule::parse("allow", s).map_err(spec)?;
                        rules.push(rule.to_string());
                    }
                    Some(rules)
                })
            }
            // Every key was checked above.
            _ => {}
        }
    }
    Ok(p)
}

/// A size: "256M" or a number of bytes.
fn size(key: &str, v: &Value) -> Result<u64, HttpError> {
    match v {
        Value::String(s) => match policy::limits::Mem::parse(key, s, Source::Http) {
            Ok(policy::limits::Mem::Limited(b)) => Ok(b.0),
            Ok(policy::limits::Mem::Unlimited) => Err(HttpError::from_code(
                ErrorCode::BadSpec,
                format!("{key}: unlimited is never accepted over HTTP"),
                None,
            )),
            Err(e) => Err(spec(e)),
        },
        Value::Number(n) => match n.as_u64() {
            Some(b) if b > 0 => Ok(b),
            _ => Err(bad(format!(
                "{key}: a number of bytes must be a whole number above 0"
            ))),
        },
        _ => Err(bad(format!(
            "{key} must be a size such as \"256M\", or a number of bytes"
        ))),
    }
}

/// A duration: "30s" or a number of milliseconds, at most 24h.
fn timeout(v: &Value) -> Result<u64, HttpError> {
    let d = match v {
        Value::String(s) => policy::limits::parse_duration("timeout", s).map_err(spec)?,
        Value::Number(n) => match n.as_u64() {
            Some(ms) if ms > 0 => std::time::Duration::from_millis(ms),
            _ => {
                return Err(bad(
                    "timeout: a number of milliseconds must be a whole number above 0",
                ))
            }
        },
        _ => {
            return Err(bad(
                "timeout must be a duration such as \"30s\", or milliseconds",
            ))
        }
    };
    if d > proto::front::MAX_DURATION {
        return Err(HttpError::from_code(
            ErrorCode::BadSpec,
            "timeout: at most 24h".into(),
            None,
        ));
    }
    Ok(d.as_millis().min(u128::from(u64::MAX)) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_strictly_and_null_clears() {
        let p = parse(
            br#"{"mem":"64M","cpu":0.5,"pids":32,"timeout":"30s","scratch":1048576,"network":"egress","allow":["api.example.com:443"]}"#,
        )
        .expect("parse");
        assert_eq!(p.mem_bytes, Some(Some(64 << 20)));
        assert_eq!(p.cpu_millis, Some(Some(500)));
        assert_eq!(p.pids, Some(Some(32)));
        assert_eq!(p.timeout_ms, Some(Some(30_000)));
        assert_eq!(p.scratch_bytes, Some(Some(1 << 20)));
        assert_eq!(p.network, Some(Some("egress".into())));
        assert_eq!(p.allow, Some(Some(vec!["api.example.com:443".into()])));
        let p = parse(br#"{"mem":null}"#).expect("parse");
        assert_eq!(p.mem_bytes, Some(None));
        assert_eq!(p.cpu_millis, None);
        let code = |text: &str| parse(text.as_bytes()).err().map(|e| e.code);
        assert_eq!(code(r#"{"mem":"unlimited"}"#), Some("bad_spec"));
        assert_eq!(code(r#"{"network":"host"}"#), Some("bad_spec"));
        assert_eq!(code(r#"{"bogus":1}"#), Some("bad_request"));
        assert_eq!(code(r#"{}"#), Some("bad_request"));
        assert_eq!(code(r#"{"mem":"1M","mem":"2M"}"#), Some("bad_request"));
        assert_eq!(code(r#"[1]"#), Some("bad_request"));
        assert_eq!(code(r#"{"pids":-1}"#), Some("bad_request"));
        assert_eq!(code(r#"{"cpu":"NaN"}"#), Some("bad_spec"));
        assert_eq!(code(r#"{"allow":["no port"]}"#), Some("bad_spec"));
        assert_eq!(code(&"x".repeat(MAX_BODY + 1)), Some("too_large"));
        // A private address parses; whether the caller may name one is the supervisor's.
        assert!(parse(br#"{"allow":["10.0.0.5:4010"]}"#).is_ok());
    }
}
