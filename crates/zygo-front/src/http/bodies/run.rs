//! `POST /run`: the body's JSON, strictly, into a [`RunBody`].
//!
//! ```text
//! {"cmd": ["python3", "-c", "print(1)"],   required: a non-empty array of strings
//!  "image": "host" | "dir:/abs/rootfs",
//!  "mem": "256M", "cpu": 0.5, "pids": 64, "timeout": "30s", "scratch": "64M",
//!  "network": "none" | "egress",
//!  "allow": ["host:port", "ip:port", "cidr:port"],   with "egress" only
//!  "env": {"NAME": "value"},
//!  "stdin": "text",                        at most MAX_STDIN bytes
//!  "key": "..."}                           the request key a cancel names (1–256 bytes)
//! ```
//!
//! Each limit is kept as the text `zygo run`'s flag of the same name takes (a number of
//! bytes, or `cpu` and `pids` given as numbers, become that text); the supervisor parses
//! it. `null` for an optional key is the same as leaving it out. Any other key is refused,
//! naming it; a duplicate key anywhere is refused. The error is a message for the caller
//! naming the key at fault.

use proto::api::run_caps::{
    MAX_ARG, MAX_ARGS, MAX_ARGV_ENV_BYTES, MAX_ENV, MAX_KEY, MAX_SPEC, MAX_STDIN,
};
use proto::api::RunBody;
use serde_json::Value;

const KNOWN: &str = "cmd, image, mem, cpu, pids, timeout, scratch, network, allow, env, stdin, key";

/// Parse a run's body.
pub fn parse(text: &[u8]) -> Result<RunBody, String> {
    if text.len() > MAX_SPEC {
        return Err(format!(
            "the run's spec is {} bytes, over the limit of {} MiB",
            text.len(),
            MAX_SPEC >> 20
        ));
    }
    let value: Value = proto::json::from_slice_strict(text)
        .map_err(|e| format!("the run's spec is not valid JSON: {e}"))?;
    let Value::Object(map) = value else {
        return Err(format!(
            "the run's spec must be a JSON object with at least \"cmd\", not {}",
            type_name(&value)
        ));
    };
    let mut b = RunBody::default();
    let mut argv_env_bytes = 0usize;
    let mut have_cmd = false;
    for (k, v) in &map {
        if v.is_null() && k != "cmd" && KNOWN.split(", ").any(|known| known == k) {
            continue;
        }
        match k.as_str() {
            "cmd" => {
                let Value::Array(items) = v else {
                    return Err(wrong_type(k, "a non-empty array of strings", v));
                };
                if items.is_empty() {
                    return Err("cmd is empty; give the program to run and its arguments".into());
                }
                if items.len() > MAX_ARGS {
                    return Err(format!(
                        "cmd has {} arguments, over the limit of {MAX_ARGS}",
                        items.len()
                    ));
                }
                for (i, item) in items.iter().enumerate() {
                    let Value::String(s) = item else {
                        return Err(wrong_type(&format!("cmd[{i}]"), "a string", item));
                    };
                    check_string(&format!("cmd[{i}]"), s)?;
                    argv_env_bytes += s.len() + 1;
                    b.cmd.push(s.clone());
                }
                if b.cmd[0].is_empty() {
                    return Err("cmd[0] is empty; give the program to run".into());
                }
                have_cmd = true;
            }
            "image" => b.image = Some(string(k, v, "a string: \"host\" or \"dir:/abs/path\"")?),
            "mem" => b.mem = Some(size_text(k, v)?),
            "scratch" => b.scratch = Some(size_text(k, v)?),
            "cpu" => {
                b.cpu = Some(match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => return Err(wrong_type(k, "a number such as 1 or 0.5", v)),
                })
            }
            "pids" => {
                b.pids = Some(match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => return Err(wrong_type(k, "a whole number such as 64", v)),
                })
            }
            "timeout" => b.timeout = Some(string(k, v, "a string such as \"30s\"")?),
            "network" => b.network = Some(string(k, v, "the string \"none\" or \"egress\"")?),
            "allow" => {
                let Value::Array(items) = v else {
                    return Err(wrong_type(k, "an array of \"host:port\" strings", v));
                };
                if items.len() > proto::launch::MAX_EGRESS_RULES {
                    return Err(format!(
                        "allow has {} rules, over the limit of {}",
                        items.len(),
                        proto::launch::MAX_EGRESS_RULES
                    ));
                }
                for (i, item) in items.iter().enumerate() {
                    let Value::String(rule) = item else {
                        return Err(wrong_type(&format!("allow[{i}]"), "a string", item));
                    };
                    check_string(&format!("allow[{i}]"), rule)?;
                    b.allow.push(rule.clone());
                }
            }
            "env" => {
                let Value::Object(vars) = v else {
                    return Err(wrong_type(k, "an object of string values", v));
                };
                if vars.len() > MAX_ENV {
                    return Err(format!(
                        "env has {} variables, over the limit of {MAX_ENV}",
                        vars.len()
                    ));
                }
                for (name, val) in vars {
                    let Value::String(val) = val else {
                        return Err(wrong_type(&format!("env.{name}"), "a string", val));
                    };
                    check_string(&format!("env.{name}"), val)?;
                    argv_env_bytes += name.len() + val.len() + 2;
                    b.env.push((name.clone(), val.clone()));
                }
            }
            "stdin" => {
                let s = string(k, v, "a string")?;
                if s.len() > MAX_STDIN {
                    return Err(format!(
                        "stdin is {} bytes, over the limit of {} MiB",
                        s.len(),
                        MAX_STDIN >> 20
                    ));
                }
                b.stdin = Some(proto::bytes::Bytes(s.into_bytes()));
            }
            "key" => {
                let s = string(k, v, "a string")?;
                if s.is_empty() || s.len() > MAX_KEY || s.chars().any(char::is_control) {
                    return Err(format!(
                        "key must be 1 to {MAX_KEY} bytes without control characters"
                    ));
                }
                b.key = Some(s);
            }
            "mount" | "mounts" => {
                return Err(format!(
                    "{k}: mounts are not accepted for a run in this version; a run sees only \
                     its image, its /work and its /tmp"
                ))
            }
            _ => {
                return Err(format!(
                    "unknown key {} in the run's spec; known keys: {KNOWN}",
                    policy::Shown::new(k)
                ))
            }
        }
    }
    if !have_cmd {
        return Err("the run's spec has no cmd: give the program to run and its arguments, e.g. \"cmd\": [\"python3\", \"-c\", \"print(1)\"]".into());
    }
    if argv_env_bytes > MAX_ARGV_ENV_BYTES {
        return Err(format!(
            "cmd and env together are {argv_env_bytes} bytes, over the limit of {} MiB",
            MAX_ARGV_ENV_BYTES >> 20
        ));
    }
    Ok(b)
}

/// A size: a string as the flag takes it, or a whole number of bytes.
fn size_text(key: &str, v: &Value) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Number(n) if n.is_u64() => Ok(n.to_string()),
        _ => Err(wrong_type(
            key,
            "a string such as \"256M\" or a whole number of bytes",
            v,
        )),
    }
}

fn string(key: &str, v: &Value, expected: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(wrong_type(key, expected, v)),
    }
}

/// An argument or variable: no NUL (the kernel would cut it there), not over the kernel's
/// length for one.
fn check_string(what: &str, s: &str) -> Result<(), String> {
    if s.contains('\0') {
        return Err(format!("{what} contains a NUL byte"));
    }
    if s.len() > MAX_ARG {
        return Err(format!(
            "{what} is {} bytes, over the limit of {MAX_ARG}",
            s.len()
        ));
    }
    Ok(())
}

fn wrong_type(key: &str, expected: &str, v: &Value) -> String {
    format!("{key} must be {expected}, not {}", type_name(v))
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
