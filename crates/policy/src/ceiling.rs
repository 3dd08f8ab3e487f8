//! The ceiling of `zygo mcp`: what every `run_code` sandbox may use, composed from the
//! command line and, with `-f`, a sandbox.toml's `[defaults]`. The file is the ceiling
//! and the flags may only narrow it; without a file, the flags over the built-in
//! defaults. Pure: the caller reads and parses the file.

use crate::file::{AllowRule, Layer};
use crate::limits::{narrow_to_ceiling, ResolvedLimits, Source};
use crate::plan::{Image, Network, OneShotArgs, OneShotPlan, BASE_ENV};

/// Why there is no ceiling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CeilingError {
    /// A flag that does not parse or does not fit the file: a usage error (exit code 2).
    Usage(String),
    /// Well-formed, but not something this version can do (exit code 1).
    Refused(String),
}

/// The plan every `run_code` sandbox starts from, and notes for the operator about
/// settings of the file that do not apply to `run_code`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpCeiling {
    pub plan: OneShotPlan,
    pub notes: Vec<String>,
}

/// Compose the ceiling from `flags` (`--mem`, `--image`, `--net`, ...; `mounts`, `env`
/// and `argv` are not `zygo mcp` flags and are ignored), the `--allow` rules and the
/// `-f` file's `[defaults]`, if any.
pub fn mcp_ceiling(
    flags: &OneShotArgs,
    allow: &[String],
    file: Option<&Layer>,
) -> Result<McpCeiling, CeilingError> {
    let usage = |e: String| CeilingError::Usage(e);
    let asked = flags.limits().map_err(|e| usage(e.to_string()))?;
    let empty = Layer::default();
    let defaults = file.unwrap_or(&empty);
    let limits = if file.is_some() {
        narrow_to_ceiling(&asked, &defaults.limits)
            .map_err(|e| usage(format!("{e} (the -f file's [defaults] is the ceiling)")))?
    } else {
        asked
    }
    .resolve(&ResolvedLimits::DEFAULT);
    let flag_image = flags
        .image
        .as_deref()
        .map(|s| Image::parse("--image", s))
        .transpose()
        .map_err(|e| usage(e.to_string()))?;
    let image = match (flag_image, &defaults.image) {
        (Some(f), Some(d)) if &f != d => {
            return Err(usage(format!(
                "--image {f} differs from image = \"{d}\" in the -f file's [defaults], which \
                 is the ceiling; drop one of them"
            )))
        }
        (Some(f), _) => f,
        (None, Some(d)) => d.clone(),
        (None, None) => Image::Host,
    };
    let network = match &flags.net {
        Some(s) => Network::parse("--net", s, Source::Cli).map_err(|e| usage(e.to_string()))?,
        None => defaults.network.unwrap_or(Network::None),
    };
    let mut rules = Vec::new();
    for a in allow {
        rules.push(AllowRule::parse("--allow", a).map_err(|e| usage(e.to_string()))?);
    }
    // The file's rules are the ceiling: flags may pick among them, never add one.
    if let Some(ceiling) = &defaults.allow {
        if let Some(extra) = rules.iter().find(|r| !ceiling.contains(r)) {
            return Err(usage(format!(
                "--allow {extra} is not among the -f file's [defaults] allow rules, which \
                 are the ceiling; drop it or add it to the file"
            )));
        }
        if rules.is_empty() {
            rules.clone_from(ceiling);
        }
    }
    if network == Network::Host {
        return Err(CeilingError::Refused(
            "network host is refused for run_code sandboxes; use --net none or --net egress".into(),
        ));
    }
    if !rules.is_empty() && network != Network::Egress {
        let shown: Vec<String> = rules.iter().map(ToString::to_string).collect();
        return Err(CeilingError::Refused(format!(
            "--allow {} needs --net egress (or network = \"egress\" in the -f file's \
             [defaults])",
            shown.join(", ")
        )));
    }
    // The rules are the operator's own (flags and the -f file): they may name private
    // addresses.
    let allow = crate::egress::compile("--allow", &rules, crate::egress::PrivateNet::Allowed)
        .map_err(|e| usage(e.to_string()))?;
    let mut ignored = Vec::new();
    if defaults.mounts.as_ref().is_some_and(|m| !m.is_empty()) {
        ignored.push("mounts");
    }
    if defaults.env.as_ref().is_some_and(|e| !e.is_empty()) {
        ignored.push("env");
    }
    if defaults.secrets.as_ref().is_some_and(|s| !s.is_empty()) {
        ignored.push("secrets");
    }
    let notes = if ignored.is_empty() {
        Vec::new()
    } else {
        vec![format!(
            "[defaults] {} apply to warm functions, not to run_code; ignored here",
            ignored.join(", ")
        )]
    };
    let plan = OneShotPlan {
        image,
        mounts: Vec::new(),
        env: BASE_ENV
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect(),
        limits,
        inotify: false,
        network,
        allow,
        argv: vec!["/bin/sh".into()],
    };
    Ok(McpCeiling { plan, notes })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Bytes, Mem};
    use std::path::Path;

    fn args(pairs: &[(&str, &str)]) -> OneShotArgs {
        let mut a = OneShotArgs::default();
        for (k, v) in pairs {
            let v = Some((*v).to_string());
            match *k {
                "mem" => a.mem = v,
                "cpu" => a.cpu = v,
                "pids" => a.pids = v,
                "timeout" => a.timeout = v,
                "scratch" => a.scratch = v,
                "net" => a.net = v,
                "image" => a.image = v,
                _ => panic!("no flag {k}"),
            }
        }
        a
    }

    fn defaults(toml: &str) -> Layer {
        crate::parse_sandbox_toml(toml, Path::new("/srv/app/sandbox.toml"))
            .expect("a valid file")
            .defaults
    }

    #[test]
    fn without_a_file_the_flags_apply_over_the_built_in_defaults() {
        let c = mcp_ceiling(&args(&[("mem", "256M")]), &[], None).expect("a ceiling");
        assert_eq!(c.plan.limits.mem, Mem::Limited(Bytes(256 << 20)));
        assert_eq!(c.plan.limits.pids, ResolvedLimits::DEFAULT.pids);
        assert_eq!(c.plan.image, Image::Host);
        assert_eq!(c.plan.network, Network::None);
        assert_eq!(c.plan.argv, vec!["/bin/sh".to_string()]);
        assert!(c.notes.is_empty());
    }

    #[test]
    fn the_file_is_the_ceiling_and_flags_only_narrow() {
        let file = defaults("[defaults]\nmem = \"512M\"\npids = 20\n");
        let c = mcp_ceiling(&args(&[]), &[], Some(&file)).expect("a ceiling");
        assert_eq!(c.plan.limits.mem, Mem::Limited(Bytes(512 << 20)));
        assert_eq!(c.plan.limits.pids, 20);
        let c = mcp_ceiling(&args(&[("mem", "128M")]), &[], Some(&file)).expect("narrower");
        assert_eq!(c.plan.limits.mem, Mem::Limited(Bytes(128 << 20)));
        match mcp_ceiling(&args(&[("mem", "1G")]), &[], Some(&file)) {
            Err(CeilingError::Usage(e)) => {
                assert!(
                    e.contains("above the ceiling") && e.contains("-f file"),
                    "{e}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_image_flag_must_agree_with_the_file() {
        let file = defaults("[defaults]\nimage = \"dir:/srv/rootfs\"\n");
        let c = mcp_ceiling(&args(&[]), &[], Some(&file)).expect("the file's image");
        assert_eq!(c.plan.image, Image::Dir("/srv/rootfs".into()));
        match mcp_ceiling(&args(&[("image", "host")]), &[], Some(&file)) {
            Err(CeilingError::Usage(e)) => assert!(e.contains("differs"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn networking_and_allow_rules_are_checked_not_ignored() {
        let c = mcp_ceiling(&args(&[("net", "egress")]), &["10.0.0.2:80".into()], None)
            .expect("an egress ceiling");
        assert_eq!(c.plan.network, Network::Egress);
        assert_eq!(c.plan.allow.len(), 1);
        match mcp_ceiling(&args(&[]), &["1.2.3.4:443".to_string()], None) {
            Err(CeilingError::Refused(e)) => assert!(e.contains("needs --net egress"), "{e}"),
            other => panic!("{other:?}"),
        }
        match mcp_ceiling(&args(&[("net", "egress")]), &["[::1]:443".into()], None) {
            Err(CeilingError::Usage(e)) => assert!(e.contains("IPv4 only"), "{e}"),
            other => panic!("{other:?}"),
        }
        let file = defaults("[defaults]\nnetwork = \"egress\"\nallow = [\"1.2.3.4:443\"]\n");
        let c = mcp_ceiling(&args(&[]), &[], Some(&file)).expect("the file's rules");
        assert_eq!(c.plan.allow.len(), 1);
        match mcp_ceiling(&args(&[]), &["1.2.3.5:443".into()], Some(&file)) {
            Err(CeilingError::Usage(e)) => assert!(e.contains("ceiling"), "{e}"),
            other => panic!("{other:?}"),
        }
        match mcp_ceiling(&args(&[("net", "host")]), &[], None) {
            Err(CeilingError::Usage(e)) => assert!(e.contains("only in sandbox.toml"), "{e}"),
            other => panic!("{other:?}"),
        }
        match mcp_ceiling(&args(&[("mem", "lots")]), &[], None) {
            Err(CeilingError::Usage(e)) => assert!(e.contains("--mem"), "{e}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn settings_that_do_not_apply_to_run_code_are_named() {
        let file = defaults("[defaults]\nenv = { A = \"1\" }\n");
        let c = mcp_ceiling(&args(&[]), &[], Some(&file)).expect("a ceiling");
        assert_eq!(
            c.notes,
            vec!["[defaults] env apply to warm functions, not to run_code; ignored here"]
        );
    }
}
