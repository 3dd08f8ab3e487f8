//! A layer (`PUT /fn/{name}`, `POST /runtimes`): a JSON object of the fields a `[fn.NAME]`
//! table of sandbox.toml takes, into a [`LayerBody`]. Each key's type is checked here (an
//! unknown key, `null` or a wrong type is refused, naming the key); each value is the
//! supervisor's to judge with sandbox.toml's own rules.

use proto::api::{LayerBody, MountBody, MAX_LAYER};
use serde_json::{Map, Value};

/// The keys a layer takes.
pub const KNOWN: &str = "image, mem, cpu, pids, timeout, scratch, io_bps, io_iops, network, \
    allow, idle_timeout, min_warm, max_warm, agent, entry, cmd, requirements, deps, mounts, \
    inotify, secrets, env";

/// The most items of a list (`allow`, `cmd`, `mounts`, `secrets`) or variables of `env`.
pub const MAX_ITEMS: usize = 4096;

/// Parse a layer's text.
pub fn parse(text: &[u8]) -> Result<LayerBody, String> {
    if text.len() > MAX_LAYER {
        return Err("the layer is over 1 MiB".into());
    }
    let v: Value =
        proto::json::from_slice_strict(text).map_err(|e| format!("the layer is not JSON: {e}"))?;
    let Value::Object(map) = v else {
        return Err("the layer is a JSON object of the fields a [fn.NAME] table takes".into());
    };
    from_map(&map)
}

/// A layer from its JSON object.
pub fn from_map(map: &Map<String, Value>) -> Result<LayerBody, String> {
    let mut b = LayerBody::default();
    for (k, v) in map {
        if v.is_null() {
            return Err(format!(
                "{k}: null is not a value in a layer; leave the key out"
            ));
        }
        match k.as_str() {
            "image" => b.image = Some(string(k, v, "a string such as \"host\"")?),
            "mem" => b.mem = Some(string(k, v, SIZE)?),
            "timeout" => b.timeout = Some(string(k, v, DURATION)?),
            "scratch" => b.scratch = Some(string(k, v, SIZE)?),
            "io_bps" => b.io_bps = Some(string(k, v, SIZE)?),
            "idle_timeout" => b.idle_timeout = Some(string(k, v, DURATION)?),
            "cpu" => {
                b.cpu = Some(match v {
                    Value::Number(n) => n.to_string(),
                    Value::String(s) => s.clone(),
                    _ => return Err(wrong_type(k, "a number such as 1 or 0.5", v)),
                })
            }
            "pids" => b.pids = Some(integer(k, v, "a whole number such as 64")?),
            "io_iops" => b.io_iops = Some(integer(k, v, "a whole number such as 4000")?),
            "min_warm" => b.min_warm = Some(integer(k, v, "a whole number")?),
            "max_warm" => b.max_warm = Some(integer(k, v, "a whole number")?),
            "network" => {
                b.network = Some(string(k, v, "a string: \"none\", \"egress\" or \"host\"")?)
            }
            "allow" => b.allow = Some(strings(k, v, "an array of \"host:port\" strings")?),
            "agent" => b.agent = Some(string(k, v, "a string: \"python\" or \"node\"")?),
            "entry" => b.entry = Some(string(k, v, "a string such as \"handler.py:main\"")?),
            "cmd" => {
                b.cmd = Some(strings(
                    k,
                    v,
                    "an array of strings such as [\"./server\", \"--fast\"]",
                )?)
            }
            "requirements" => b.requirements = Some(string(k, v, "a string (a path)")?),
            "deps" => {
                b.deps = Some(string(
                    k,
                    v,
                    "a dependency set's id (deps_ and 64 hex digits)",
                )?)
            }
            "inotify" => {
                let Value::Bool(x) = v else {
                    return Err(wrong_type(k, "true or false", v));
                };
                b.inotify = Some(*x);
            }
            "secrets" => b.secrets = Some(strings(k, v, "an array of secret names")?),
            "env" => {
                let Value::Object(vars) = v else {
                    return Err(wrong_type(
                        k,
                        "an object such as {\"LOG_LEVEL\": \"info\"}",
                        v,
                    ));
                };
                if vars.len() > MAX_ITEMS {
                    return Err(format!(
                        "env has {} variables, over {MAX_ITEMS}",
                        vars.len()
                    ));
                }
                let mut env = Vec::with_capacity(vars.len());
                for (name, val) in vars {
                    let Value::String(val) = val else {
                        return Err(wrong_type(&format!("env.{name}"), "a string", val));
                    };
                    env.push((name.clone(), val.clone()));
                }
                b.env = Some(env);
            }
            "mounts" => b.mounts = Some(mounts(v)?),
            other => {
                return Err(format!(
                    "unknown key {} in the layer; the keys are {KNOWN}",
                    policy::Shown::new(other)
                ))
            }
        }
    }
    Ok(b)
}

const SIZE: &str = "a string such as \"256M\"";
const DURATION: &str = "a string such as \"30s\"";

fn mounts(v: &Value) -> Result<Vec<MountBody>, String> {
    const EXPECTED: &str =
        "an array of objects such as [{\"src\": \"models\", \"dst\": \"/models\"}]";
    let Value::Array(items) = v else {
        return Err(wrong_type("mounts", EXPECTED, v));
    };
    if items.len() > MAX_ITEMS {
        return Err(format!(
            "mounts has {} entries, over {MAX_ITEMS}",
            items.len()
        ));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let here = format!("mounts[{i}]");
        let Value::Object(t) = item else {
            return Err(wrong_type(&here, EXPECTED, item));
        };
        let (mut src, mut dst, mut rw) = (None, None, false);
        for (k, val) in t {
            let kf = format!("{here}.{k}");
            match k.as_str() {
                "src" => src = Some(string(&kf, val, "a string (a host path)")?),
                "dst" => {
                    dst = Some(string(
                        &kf,
                        val,
                        "a string (an absolute path in the sandbox)",
                    )?)
                }
                "rw" => {
                    let Value::Bool(b) = val else {
                        return Err(wrong_type(&kf, "true or false", val));
                    };
                    rw = *b;
                }
                other => {
                    return Err(format!(
                        "unknown key {} in {here}; the keys are src, dst, rw",
                        policy::Shown::new(other)
                    ))
                }
            }
        }
        let (Some(src), Some(dst)) = (src, dst) else {
            return Err(format!("{here} needs both src and dst"));
        };
        out.push(MountBody { src, dst, rw });
    }
    Ok(out)
}

fn string(key: &str, v: &Value, expected: &str) -> Result<String, String> {
    match v {
        Value::String(s) => Ok(s.clone()),
        _ => Err(wrong_type(key, expected, v)),
    }
}

fn integer(key: &str, v: &Value, expected: &str) -> Result<i64, String> {
    v.as_i64().ok_or_else(|| wrong_type(key, expected, v))
}

fn strings(key: &str, v: &Value, expected: &str) -> Result<Vec<String>, String> {
    let Value::Array(items) = v else {
        return Err(wrong_type(key, expected, v));
    };
    if items.len() > MAX_ITEMS {
        return Err(format!("{key} has {} items, over {MAX_ITEMS}", items.len()));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, it)| string(&format!("{key}[{i}]"), it, "a string"))
        .collect()
}

fn wrong_type(key: &str, expected: &str, v: &Value) -> String {
    let got = match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "a whole number",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    };
    format!("{key} must be {expected}, not {got}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_is_typed_key_by_key() {
        let b = parse(
            br#"{"agent":"python","entry":"h.py:handler","mem":"64M","cpu":0.5,"pids":32,
                "env":{"A":"1"},"mounts":[{"src":"/srv/m","dst":"/m","rw":true}],
                "allow":["api.example.com:443"],"network":"egress","max_warm":3}"#,
        )
        .expect("a layer");
        assert_eq!(b.agent.as_deref(), Some("python"));
        assert_eq!(b.cpu.as_deref(), Some("0.5"));
        assert_eq!(b.pids, Some(32));
        assert_eq!(b.env, Some(vec![("A".into(), "1".into())]));
        assert_eq!(
            b.mounts,
            Some(vec![MountBody {
                src: "/srv/m".into(),
                dst: "/m".into(),
                rw: true
            }])
        );
        for (bad, says) in [
            (r#"{"bogus":1}"#, "unknown key \"bogus\""),
            (r#"{"mem":null}"#, "mem: null"),
            (r#"{"pids":"64"}"#, "pids must be a whole number"),
            (r#"{"pids":1.5}"#, "pids must be a whole number"),
            (r#"{"env":{"A":1}}"#, "env.A must be a string"),
            (r#"{"mounts":[{"src":"a"}]}"#, "needs both src and dst"),
            (
                r#"{"mounts":[{"src":"a","dst":"/b","x":1}]}"#,
                "unknown key \"x\" in mounts[0]",
            ),
            (r#"{"mem":"1M","mem":"2M"}"#, "not JSON"),
            (r#"[]"#, "a JSON object"),
        ] {
            let e = parse(bad.as_bytes()).expect_err(bad);
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
