//! The spec of a one-shot run sent to the supervisor (`Request::Run`, `POST /run`): a
//! [`RunBody`] the front parsed from the caller's JSON (`zygo_front::http::bodies::run`),
//! checked again here as if the front were hostile, then planned with the same code that
//! plans `zygo run` from its flags.
//!
//! Trust: none. The body comes from any HTTP caller through `zygo api`.
//!
//! Each limit means what the flag of the same name means to `zygo run` and is parsed by
//! the same code. Unset limits take `zygo run`'s defaults. What only the host's operator
//! may ask for — `"unlimited"` for any limit, `network = "host"` — is refused. `"egress"`
//! opens exactly the `allow` rules, as `zygo run --net egress --allow` does; a rule naming
//! a private, loopback or link-local address is refused unless the caller may name one (a
//! deploy caller of an API started with `--allow-deploy --allow-private-net`). There are no
//! mounts.
//!
//! The caller's tenant limits, if any, then narrow what was asked: each limit is the
//! smaller of the two. A tenant held to `network = "none"` may not ask for egress, and one
//! with an `allow` list may name only what that list covers (narrowing never adds a rule;
//! the comparison is `policy::gate::tenant_may_call_egress`, as for a function's call).

use std::time::Duration;

use policy::egress::PrivateNet;
use policy::file::AllowRule;
use policy::{Bytes, Cpus, Mem, Network, OneShotArgs, OneShotPlan, Shown, Source};
use proto::api::run_caps::{MAX_ARG, MAX_ARGS, MAX_ARGV_ENV_BYTES, MAX_ENV, MAX_KEY, MAX_STDIN};
use proto::api::{RunBody, TenantLimits};

/// A run, checked and complete.
#[derive(Debug)]
pub struct RunSpec {
    pub plan: OneShotPlan,
    /// `None`: the program reads end of file.
    pub stdin: Option<Vec<u8>>,
    pub key: Option<String>,
}

/// Check `body` and narrow its limits by `tenant`'s; `private_ok`: whether the caller may
/// name private addresses in `allow`. The error is a message for the caller (`bad_spec`),
/// naming the key at fault.
pub fn plan(
    body: &RunBody,
    tenant: Option<&TenantLimits>,
    private_ok: bool,
) -> Result<RunSpec, String> {
    if body.cmd.is_empty() || body.cmd[0].is_empty() {
        return Err("cmd is empty; give the program to run and its arguments".into());
    }
    if body.cmd.len() > MAX_ARGS {
        return Err(format!(
            "cmd has {} arguments, over the limit of {MAX_ARGS}",
            body.cmd.len()
        ));
    }
    if body.env.len() > MAX_ENV {
        return Err(format!(
            "env has {} variables, over the limit of {MAX_ENV}",
            body.env.len()
        ));
    }
    if body.allow.len() > proto::launch::MAX_EGRESS_RULES {
        return Err(format!(
            "allow has {} rules, over the limit of {}",
            body.allow.len(),
            proto::launch::MAX_EGRESS_RULES
        ));
    }
    let mut argv_env_bytes = 0usize;
    for (i, arg) in body.cmd.iter().enumerate() {
        check_string(&format!("cmd[{i}]"), arg)?;
        argv_env_bytes += arg.len() + 1;
    }
    let mut env = Vec::with_capacity(body.env.len());
    for (name, val) in &body.env {
        // A name with `=` would be split at it: refused before the `K=V` form is made.
        if name.is_empty() || name.contains('=') {
            return Err(format!(
                "env: {} is not a variable name; use letters, digits and _, not starting \
                 with a digit",
                Shown::new(name)
            ));
        }
        check_string(&format!("env.{name}"), val)?;
        argv_env_bytes += name.len() + val.len() + 2;
        env.push(format!("{name}={val}"));
    }
    if argv_env_bytes > MAX_ARGV_ENV_BYTES {
        return Err(format!(
            "cmd and env together are {argv_env_bytes} bytes, over the limit of {} MiB",
            MAX_ARGV_ENV_BYTES >> 20
        ));
    }
    for (i, rule) in body.allow.iter().enumerate() {
        check_string(&format!("allow[{i}]"), rule)?;
    }
    if let Some(s) = &body.stdin {
        if s.0.len() > MAX_STDIN {
            return Err(format!(
                "stdin is {} bytes, over the limit of {} MiB",
                s.0.len(),
                MAX_STDIN >> 20
            ));
        }
    }
    if let Some(k) = &body.key {
        if k.is_empty() || k.len() > MAX_KEY || k.chars().any(char::is_control) {
            return Err(format!(
                "key must be 1 to {MAX_KEY} bytes without control characters"
            ));
        }
    }
    let mut args = OneShotArgs {
        argv: body.cmd.clone(),
        image: body.image.clone(),
        mem: body.mem.clone(),
        cpu: body.cpu.clone(),
        pids: body.pids.clone(),
        timeout: body.timeout.clone(),
        scratch: body.scratch.clone(),
        net: body.network.clone(),
        allow: body.allow.clone(),
        env,
        ..OneShotArgs::default()
    };
    check_limits(&args)?;
    // "none" and "egress" pass; "host" is refused with the reason that applies to a caller
    // here.
    match args.net.as_deref() {
        None | Some("none") | Some("egress") => {}
        Some("host") => {
            return Err("network: \"host\" is accepted only in sandbox.toml; use \"none\"".into())
        }
        Some(other) => {
            Network::parse("network", other, Source::Http).map_err(|e| e.to_string())?;
        }
    }
    check_allow(&args, tenant, private_ok)?;
    args.refuse_private = !private_ok;
    let mut plan = policy::one_shot(&args).map_err(|e| e.to_string())?;
    if let Some(t) = tenant {
        plan.limits = narrow(plan.limits, t);
    }
    Ok(RunSpec {
        plan,
        stdin: body.stdin.as_ref().map(|s| s.0.clone()),
        key: body.key.clone(),
    })
}

/// The egress rules asked for, checked against who asks: each parses; a private target
/// needs `private_ok`; a tenant's limits may forbid egress or list the only rules it may
/// name. (Whether `allow` goes with `network = "egress"` is the plan's check.)
fn check_allow(
    args: &OneShotArgs,
    tenant: Option<&TenantLimits>,
    private_ok: bool,
) -> Result<(), String> {
    let rules = args
        .allow
        .iter()
        .map(|r| AllowRule::parse("allow", r).map_err(|e| e.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some(r) = policy::gate::private_target(&rules, private_ok) {
        return Err(policy::gate::private_target_refusal(r));
    }
    // The other special ranges (documentation, multicast, reserved, ...), by the same rule.
    let private = if private_ok {
        PrivateNet::Allowed
    } else {
        PrivateNet::Refused
    };
    policy::egress::compile("allow", &rules, private).map_err(|e| e.to_string())?;
    if args.net.as_deref() != Some("egress") {
        return Ok(());
    }
    match tenant {
        Some(t) => super::requests::tenant_egress(&rules, t).map_err(|e| format!("network: {e}")),
        None => Ok(()),
    }
}

/// Check each limit as the caller's (`Source::Http`), naming it as the spec does: the plan
/// below parses them again as `zygo run`'s flags, which they now are known to pass.
fn check_limits(args: &OneShotArgs) -> Result<(), String> {
    let e = |err: policy::PolicyError| err.to_string();
    if let Some(s) = &args.mem {
        Mem::parse("mem", s, Source::Http).map_err(e)?;
    }
    if let Some(s) = &args.scratch {
        refuse_unlimited("scratch", s)?;
        policy::parse_size("scratch", s).map_err(e)?;
    }
    if let Some(s) = &args.cpu {
        refuse_unlimited("cpu", s)?;
        Cpus::parse("cpu", s).map_err(e)?;
    }
    if let Some(s) = &args.pids {
        refuse_unlimited("pids", s)?;
        policy::parse_pids("pids", s).map_err(e)?;
    }
    if let Some(s) = &args.timeout {
        refuse_unlimited("timeout", s)?;
        policy::parse_duration("timeout", s).map_err(e)?;
    }
    if let Some(s) = &args.image {
        policy::Image::parse("image", s).map_err(e)?;
    }
    for v in &args.env {
        policy::parse_env("env", v).map_err(e)?;
    }
    Ok(())
}

/// "unlimited" names the same refusal for every limit, not a parse error of each.
fn refuse_unlimited(key: &str, s: &str) -> Result<(), String> {
    if s.eq_ignore_ascii_case("unlimited") {
        return Err(format!(
            "{key}: \"unlimited\" is accepted only in sandbox.toml; give a value"
        ));
    }
    Ok(())
}

/// Each limit the smaller of what was asked and the tenant's.
pub fn narrow(mut l: policy::ResolvedLimits, t: &TenantLimits) -> policy::ResolvedLimits {
    if let Some(b) = t.mem_bytes {
        l.mem = l.mem.min(Mem::Limited(Bytes(b.max(1))));
    }
    if let Some(m) = t.cpu_millis {
        // Below the smallest share a cgroup takes, the smallest; above the largest, no
        // narrowing (nothing asked can be above it).
        let m = m.max(10);
        if let Ok(c) = Cpus::parse("cpu", &format!("{}.{:03}", m / 1000, m % 1000)) {
            l.cpu = l.cpu.min(c);
        }
    }
    if let Some(p) = t.pids {
        l.pids = l.pids.min(u32::try_from(p.max(1)).unwrap_or(u32::MAX));
    }
    if let Some(ms) = t.timeout_ms {
        l.timeout = l.timeout.min(Duration::from_millis(ms.max(1)));
    }
    if let Some(b) = t.scratch_bytes {
        l.scratch = l.scratch.min(Bytes(b.max(1)));
    }
    l
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The body as the HTTP front parses it, then planned here.
    fn parse(
        text: &str,
        tenant: Option<&TenantLimits>,
        private_ok: bool,
    ) -> Result<RunSpec, String> {
        let body = zygo_front::http::bodies::run::parse(text.as_bytes())?;
        plan(&body, tenant, private_ok)
    }

    fn ok(text: &str) -> RunSpec {
        parse(text, None, false).unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    #[track_caller]
    fn refused(text: &str, needle: &str) {
        match parse(text, None, false) {
            Ok(s) => panic!("{text}: accepted as {s:?}"),
            Err(e) => assert!(e.contains(needle), "{text}: {e:?} does not say {needle:?}"),
        }
    }

    #[test]
    fn a_bare_cmd_takes_zygo_runs_defaults() {
        let s = ok(r#"{"cmd": ["echo", "hi"]}"#);
        assert_eq!(s.plan.argv, ["echo", "hi"]);
        assert_eq!(s.plan.limits, policy::ResolvedLimits::DEFAULT);
        assert_eq!(s.plan.image, policy::Image::Host);
        assert_eq!(s.plan.network, Network::None);
        assert!(s.plan.mounts.is_empty());
        assert!(!s.plan.inotify);
        assert_eq!((s.stdin, s.key), (None, None));
        // The base environment, as for `zygo run`.
        assert!(s.plan.env.iter().any(|(k, v)| k == "HOME" && v == "/work"));
    }

    #[test]
    fn every_key_means_what_the_flag_means() {
        let s = ok(
            r#"{"cmd": ["x"], "image": "dir:/srv/root", "mem": "64M", "cpu": 0.5,
                       "pids": 8, "timeout": "1.5s", "scratch": 1048576, "network": "none",
                       "env": {"A": "1", "HOME": "/tmp"}, "stdin": "in", "key": "k-1"}"#,
        );
        let l = s.plan.limits;
        assert_eq!(l.mem, Mem::Limited(Bytes(64 << 20)));
        assert_eq!(l.cpu.millis(), 500);
        assert_eq!(l.pids, 8);
        assert_eq!(l.timeout, Duration::from_millis(1500));
        assert_eq!(l.scratch, Bytes(1 << 20));
        assert_eq!(s.plan.image, policy::Image::Dir("/srv/root".into()));
        assert!(s.plan.env.contains(&("A".into(), "1".into())));
        assert!(s.plan.env.contains(&("HOME".into(), "/tmp".into())));
        assert_eq!(s.stdin.as_deref(), Some(&b"in"[..]));
        assert_eq!(s.key.as_deref(), Some("k-1"));
        // cpu and pids as strings, a null left out.
        let s = ok(r#"{"cmd": ["x"], "cpu": "0.25", "pids": "3", "mem": null, "env": null}"#);
        assert_eq!((s.plan.limits.cpu.millis(), s.plan.limits.pids), (250, 3));
        assert_eq!(s.plan.limits.mem, policy::ResolvedLimits::DEFAULT.mem);
    }

    #[test]
    fn what_only_the_operator_may_ask_for_is_refused() {
        refused(
            r#"{"cmd": ["x"], "mem": "unlimited"}"#,
            "only in sandbox.toml",
        );
        refused(
            r#"{"cmd": ["x"], "mem": "UNLIMITED"}"#,
            "only in sandbox.toml",
        );
        for key in ["cpu", "pids", "timeout", "scratch"] {
            refused(
                &format!(r#"{{"cmd": ["x"], "{key}": "unlimited"}}"#),
                &format!("{key}: \"unlimited\" is accepted only in sandbox.toml"),
            );
        }
        refused(
            r#"{"cmd": ["x"], "network": "host"}"#,
            "only in sandbox.toml",
        );
        refused(
            r#"{"cmd": ["x"], "network": "bridge"}"#,
            "is not a network mode",
        );
        refused(
            r#"{"cmd": ["x"], "mounts": [{"src": "/", "dst": "/h"}]}"#,
            "mounts are not accepted",
        );
        refused(
            r#"{"cmd": ["x"], "mount": "/:/h"}"#,
            "mounts are not accepted",
        );
    }

    #[test]
    fn egress_opens_the_rules_asked_for_as_the_caller_may() {
        let s = ok(
            r#"{"cmd": ["x"], "network": "egress", "allow": ["pypi.org:443", "93.184.216.34:80"]}"#,
        );
        assert_eq!(s.plan.allow.len(), 2, "{:?}", s.plan.allow);
        // A caller who may not open private ranges: its names never resolve to one.
        assert!(!s.plan.allow.names[0].private_ok, "{:?}", s.plan.allow);
        let text = r#"{"cmd": ["x"], "network": "egress", "allow": ["pypi.org:443"]}"#;
        let operator = parse(text, None, true).expect("parse");
        assert!(operator.plan.allow.names[0].private_ok);
        refused(
            r#"{"cmd": ["x"], "allow": ["pypi.org:443"]}"#,
            "--net egress",
        );
        refused(
            r#"{"cmd": ["x"], "network": "egress", "allow": "pypi.org:443"}"#,
            "allow must be an array",
        );
        refused(
            r#"{"cmd": ["x"], "network": "egress", "allow": [443]}"#,
            "allow[0] must be a string",
        );
        refused(
            r#"{"cmd": ["x"], "network": "egress", "allow": ["pypi.org"]}"#,
            "allow",
        );
        // Private, loopback and link-local targets: only for a caller who may name them.
        refused(
            r#"{"cmd": ["x"], "network": "egress", "allow": ["[::1]:80"]}"#,
            "private, loopback or link-local",
        );
        for target in [
            "10.0.0.5:80",
            "127.0.0.1:22",
            "169.254.169.254:80",
            "localhost:80",
        ] {
            let text = format!(r#"{{"cmd": ["x"], "network": "egress", "allow": ["{target}"]}}"#);
            refused(&text, "private, loopback or link-local");
            assert!(parse(&text, None, true).is_ok(), "{target} with private_ok");
        }
        // The other special ranges too (documentation, multicast, reserved).
        for target in ["203.0.113.7:80", "224.0.0.1:80", "240.0.0.1:80"] {
            let text = format!(r#"{{"cmd": ["x"], "network": "egress", "allow": ["{target}"]}}"#);
            refused(&text, "which only the operator may open");
            assert!(parse(&text, None, true).is_ok(), "{target} with private_ok");
        }
        let many: Vec<String> = (0..=proto::launch::MAX_EGRESS_RULES)
            .map(|i| format!("\"h{i}.example:443\""))
            .collect();
        refused(
            &format!(
                r#"{{"cmd": ["x"], "network": "egress", "allow": [{}]}}"#,
                many.join(",")
            ),
            "over the limit",
        );
    }

    #[test]
    fn a_tenants_network_limits_narrow_egress_and_never_widen_it() {
        let spec = r#"{"cmd": ["x"], "network": "egress", "allow": ["api.example.com:443"]}"#;
        let none = TenantLimits {
            network: Some("none".into()),
            ..TenantLimits::default()
        };
        let e = parse(spec, Some(&none), true).expect_err("network none");
        assert!(e.contains("limits say network \"none\""), "{e}");
        // A run without egress is fine for it.
        assert!(parse(r#"{"cmd": ["x"]}"#, Some(&none), false).is_ok());
        let listed = TenantLimits {
            network: Some("egress".into()),
            allow: Some(vec![
                "API.example.com:443".into(),
                "93.184.216.34:80".into(),
            ]),
            ..TenantLimits::default()
        };
        assert!(parse(spec, Some(&listed), false).is_ok());
        let other = r#"{"cmd": ["x"], "network": "egress", "allow": ["evil.example:443"]}"#;
        let e = parse(other, Some(&listed), false).expect_err("not listed");
        assert!(
            e.contains("does not cover the egress rule evil.example:443"),
            "{e}"
        );
        // A block in the tenant's list covers an address rule inside it.
        let block = TenantLimits {
            network: Some("egress".into()),
            allow: Some(vec!["93.184.0.0/16:80".into()]),
            ..TenantLimits::default()
        };
        let inside = r#"{"cmd": ["x"], "network": "egress", "allow": ["93.184.216.34:80"]}"#;
        assert!(parse(inside, Some(&block), false).is_ok());
        // No list: no narrowing of the rules.
        let open = TenantLimits {
            network: Some("egress".into()),
            ..TenantLimits::default()
        };
        assert!(parse(other, Some(&open), false).is_ok());
    }

    #[test]
    fn unknown_and_duplicate_keys_are_refused_naming_them() {
        refused(
            r#"{"cmd": ["x"], "inotify": true}"#,
            "unknown key \"inotify\"",
        );
        refused(r#"{"cmd": ["x"], "Cmd": ["y"]}"#, "unknown key \"Cmd\"");
        refused(
            r#"{"cmd": ["x"], "zz\u001b[31m": null}"#,
            "unknown key \"zz\\u{1b}[31m\"",
        );
        refused(r#"{"cmd": ["x"], "cmd": ["y"]}"#, "duplicate key \"cmd\"");
        refused(
            r#"{"cmd": ["x"], "env": {"A": "1", "A": "2"}}"#,
            "duplicate key \"A\"",
        );
        refused(
            r#"{"cmd": ["x"], "env": {"A": "1", "\u0041": "2"}}"#,
            "duplicate key",
        );
    }

    #[test]
    fn a_missing_or_empty_command_is_refused() {
        refused(r#"{}"#, "has no cmd");
        refused(r#"{"cmd": null}"#, "cmd must be a non-empty array");
        refused(r#"{"cmd": []}"#, "cmd is empty");
        refused(r#"{"cmd": [""]}"#, "cmd[0] is empty");
        refused(
            r#"{"cmd": "echo hi"}"#,
            "cmd must be a non-empty array of strings, not a string",
        );
        refused(
            r#"{"cmd": ["echo", 1]}"#,
            "cmd[1] must be a string, not a number",
        );
        refused(r#"{"cmd": ["a\u0000b"]}"#, "cmd[0] contains a NUL byte");
    }

    #[test]
    fn hostile_text_is_refused_without_harm() {
        for text in [
            "",
            "null",
            "[]",
            "\"cmd\"",
            "{\"cmd\": [\"x\"]",
            "{\"cmd\": [\"x\"]} {}",
            "{\"cmd\": [\"x\"]} trailing",
            "\u{feff}{\"cmd\": [\"x\"]}",
            "{\"cmd\": [\"\\ud800\"]}",
            "{'cmd': ['x']}",
        ] {
            assert!(parse(text, None, false).is_err(), "{text:?} was accepted");
        }
        // Nesting past serde_json's limit is an error, not a stack overflow.
        let deep = format!(
            "{{\"cmd\": {}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert!(parse(&deep, None, false).is_err());
        let deep = format!(
            "{{\"cmd\": [\"x\"], \"env\": {}}}",
            "{\"a\":".repeat(10_000) + "1" + &"}".repeat(10_000)
        );
        assert!(parse(&deep, None, false).is_err());
        // Oversize input is refused before it is parsed.
        let big = format!(
            "{{\"cmd\": [\"{}\"]}}",
            "a".repeat(proto::api::run_caps::MAX_SPEC)
        );
        refused(&big, "over the limit of 8 MiB");
    }

    #[test]
    fn sizes_and_counts_are_capped() {
        let stdin = "a".repeat(MAX_STDIN + 1);
        refused(
            &format!(r#"{{"cmd": ["x"], "stdin": "{stdin}"}}"#),
            "stdin is 1048577 bytes",
        );
        let s = ok(&format!(
            r#"{{"cmd": ["x"], "stdin": "{}"}}"#,
            "a".repeat(MAX_STDIN)
        ));
        assert_eq!(s.stdin.map(|b| b.len()), Some(MAX_STDIN));
        let many: Vec<String> = (0..=MAX_ARGS).map(|i| format!("\"{i}\"")).collect();
        refused(
            &format!(r#"{{"cmd": [{}]}}"#, many.join(",")),
            "1025 arguments",
        );
        let vars: Vec<String> = (0..=MAX_ENV).map(|i| format!("\"V{i}\": \"\"")).collect();
        refused(
            &format!(r#"{{"cmd": ["x"], "env": {{{}}}}}"#, vars.join(",")),
            "1025 variables",
        );
        let long = "a".repeat(MAX_ARG + 1);
        refused(
            &format!(r#"{{"cmd": ["{long}"]}}"#),
            "cmd[0] is 131072 bytes",
        );
        let args: Vec<String> = (0..10)
            .map(|_| format!("\"{}\"", "a".repeat(120_000)))
            .collect();
        refused(
            &format!(r#"{{"cmd": [{}]}}"#, args.join(",")),
            "cmd and env together",
        );
        refused(
            &format!(r#"{{"cmd": ["x"], "key": "{}"}}"#, "k".repeat(MAX_KEY + 1)),
            "key must be",
        );
        refused(r#"{"cmd": ["x"], "key": ""}"#, "key must be");
        refused(r#"{"cmd": ["x"], "key": "a\nb"}"#, "key must be");
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        refused(r#"{"cmd": ["x"], "mem": "lots"}"#, "mem: \"lots\"");
        refused(r#"{"cmd": ["x"], "mem": -1}"#, "mem must be a string");
        refused(r#"{"cmd": ["x"], "mem": 1.5}"#, "mem must be a string");
        refused(r#"{"cmd": ["x"], "mem": "0"}"#, "must be greater than zero");
        refused(r#"{"cmd": ["x"], "cpu": "NaN"}"#, "cpu: \"NaN\"");
        refused(r#"{"cmd": ["x"], "cpu": 1e300}"#, "cpu:");
        refused(r#"{"cmd": ["x"], "cpu": 0.001}"#, "cpu:");
        refused(r#"{"cmd": ["x"], "cpu": true}"#, "cpu must be a number");
        refused(r#"{"cmd": ["x"], "pids": 0}"#, "pids: \"0\"");
        refused(r#"{"cmd": ["x"], "pids": 1.5}"#, "pids: \"1.5\"");
        refused(
            r#"{"cmd": ["x"], "pids": 99999999999999999999999}"#,
            "pids:",
        );
        refused(
            r#"{"cmd": ["x"], "timeout": 30}"#,
            "timeout must be a string",
        );
        refused(
            r#"{"cmd": ["x"], "timeout": "30"}"#,
            "timeout: \"30\" needs a unit",
        );
        refused(
            r#"{"cmd": ["x"], "timeout": "25h"}"#,
            "longer than the maximum",
        );
        refused(
            r#"{"cmd": ["x"], "image": "ubuntu"}"#,
            "image: \"ubuntu\" is not an image",
        );
        refused(
            r#"{"cmd": ["x"], "image": "dir:rel"}"#,
            "must be an absolute path",
        );
        refused(r#"{"cmd": ["x"], "image": "dir:/a/../b"}"#, "image:");
        refused(r#"{"cmd": ["x"], "env": ["A=1"]}"#, "env must be an object");
        refused(
            r#"{"cmd": ["x"], "env": {"A": 1}}"#,
            "env.A must be a string",
        );
        refused(
            r#"{"cmd": ["x"], "env": {"1A": "x"}}"#,
            "is not a variable name",
        );
        refused(
            r#"{"cmd": ["x"], "env": {"A=B": "x"}}"#,
            "\"A=B\" is not a variable name",
        );
        refused(
            r#"{"cmd": ["x"], "env": {"": "x"}}"#,
            "is not a variable name",
        );
        refused(
            r#"{"cmd": ["x"], "env": {"A": "a\u0000"}}"#,
            "env.A contains a NUL byte",
        );
        refused(
            r#"{"cmd": ["x"], "stdin": ["a"]}"#,
            "stdin must be a string",
        );
    }

    #[test]
    fn a_tenants_limits_narrow_each_limit_and_never_widen_one() {
        let t = TenantLimits {
            mem_bytes: Some(32 << 20),
            cpu_millis: Some(250),
            pids: Some(16),
            timeout_ms: Some(2000),
            scratch_bytes: Some(8 << 20),
            network: Some("none".into()),
            allow: None,
        };
        let s = parse(r#"{"cmd": ["x"]}"#, Some(&t), false).expect("parse");
        let l = s.plan.limits;
        assert_eq!(l.mem, Mem::Limited(Bytes(32 << 20)));
        assert_eq!(l.cpu.millis(), 250);
        assert_eq!(l.pids, 16);
        assert_eq!(l.timeout, Duration::from_secs(2));
        assert_eq!(l.scratch, Bytes(8 << 20));
        // A spec below the tenant's limits keeps its own.
        let s = parse(
            r#"{"cmd": ["x"], "mem": "16M", "cpu": 0.1, "pids": 4, "timeout": "1s", "scratch": "1M"}"#,
            Some(&t),
            false,
        )
        .expect("parse");
        let l = s.plan.limits;
        assert_eq!(l.mem, Mem::Limited(Bytes(16 << 20)));
        assert_eq!((l.cpu.millis(), l.pids), (100, 4));
        assert_eq!(
            (l.timeout, l.scratch),
            (Duration::from_secs(1), Bytes(1 << 20))
        );
        // Huge or tiny tenant values neither widen nor break anything.
        let wide = TenantLimits {
            mem_bytes: Some(u64::MAX),
            cpu_millis: Some(u64::MAX),
            pids: Some(u64::MAX),
            timeout_ms: Some(u64::MAX),
            scratch_bytes: Some(u64::MAX),
            ..TenantLimits::default()
        };
        assert_eq!(
            parse(r#"{"cmd": ["x"]}"#, Some(&wide), false)
                .expect("parse")
                .plan
                .limits,
            policy::ResolvedLimits::DEFAULT
        );
        let tiny = TenantLimits {
            mem_bytes: Some(0),
            cpu_millis: Some(0),
            pids: Some(0),
            timeout_ms: Some(0),
            scratch_bytes: Some(0),
            ..TenantLimits::default()
        };
        let l = parse(r#"{"cmd": ["x"]}"#, Some(&tiny), false)
            .expect("parse")
            .plan
            .limits;
        assert_eq!((l.cpu.millis(), l.pids), (10, 1));
        assert_eq!(l.timeout, Duration::from_millis(1));
    }
}
