//! The one-shot sandbox plan (`zygo run`), and the pieces sandbox.toml shares with it:
//! images, networks, mounts, environment variables.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use crate::limits::{
    parse_duration, parse_io_bps, parse_iops, parse_pids, parse_size, Cpus, Limits, Mem,
    ResolvedLimits, Source,
};
use crate::PolicyError;

/// The root filesystem of a sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Image {
    /// The host's /usr, /bin, /lib*, /etc subset, read-only.
    Host,
    /// A root filesystem in a directory (absolute, no `..`).
    Dir(PathBuf),
}

/// What the sandbox may reach over the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    None,
    Egress,
    /// The host's network namespace; only from sandbox.toml.
    Host,
}

/// A bind mount from the host into the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountSpec {
    pub src: PathBuf,
    pub dst: PathBuf,
    pub rw: bool,
}

/// `zygo run`'s options, as raw strings from the command line.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OneShotArgs {
    pub mem: Option<String>,
    pub cpu: Option<String>,
    pub pids: Option<String>,
    pub timeout: Option<String>,
    pub scratch: Option<String>,
    /// `--io-bps`, `--io-iops`: the sandbox's reads and writes on the host's disks.
    pub io_bps: Option<String>,
    pub io_iops: Option<String>,
    pub net: Option<String>,
    /// `--allow HOST:PORT`, each an egress rule (needs `--net egress`).
    pub allow: Vec<String>,
    pub image: Option<String>,
    pub mounts: Vec<String>,
    pub env: Vec<String>,
    pub argv: Vec<String>,
    /// `--inotify`: let the program use inotify (off by default; see [`OneShotPlan::inotify`]).
    pub inotify: bool,
    /// The rules come from a caller who may not open the host's own networks (an HTTP
    /// caller of an API started without `--allow-private-net`): no rule may name a private
    /// or special range, and no allowed name resolves to one. Off for the command line,
    /// whose rules are the operator's own.
    pub refuse_private: bool,
}

/// A checked, complete plan for one one-shot sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OneShotPlan {
    pub image: Image,
    pub mounts: Vec<MountSpec>,
    pub env: Vec<(String, String)>,
    pub limits: ResolvedLimits,
    /// Whether the program may use inotify: a watch on a file of the read-only image, which
    /// the host and other sandboxes share, sees when anyone opens it.
    pub inotify: bool,
    pub network: Network,
    /// With `Network::Egress`: the connections the sandbox may make (see [`crate::egress`]).
    pub allow: crate::egress::Rules,
    pub argv: Vec<String>,
}

/// The environment every sandbox starts with; `--env` / `env` may override any of it.
pub const BASE_ENV: [(&str, &str); 4] = [
    ("PATH", "/usr/local/bin:/usr/bin:/bin"),
    ("HOME", "/work"),
    ("LANG", "C.UTF-8"),
    ("TMPDIR", "/tmp"),
];

/// Mount destinations Zygo builds itself; nothing may be mounted on or under them.
pub const RESERVED_DSTS: [&str; 5] = ["/proc", "/dev", "/tmp", "/work", "/run"];

/// Longest path accepted.
pub(crate) const MAX_PATH: usize = 4096;

impl Image {
    /// `host` or `dir:/abs/path`.
    pub fn parse(field: &str, s: &str) -> Result<Image, PolicyError> {
        if s == "host" {
            return Ok(Image::Host);
        }
        if let Some(dir) = s.strip_prefix("dir:") {
            return absolute_path(field, dir).map(Image::Dir);
        }
        Err(PolicyError::invalid(
            field,
            s,
            "is not an image; use \"host\" or \"dir:/absolute/path/to/rootfs\"",
        ))
    }
}

impl Network {
    /// `none`, `egress`, or `host` (the last only with `Source::File`).
    pub fn parse(field: &str, s: &str, source: Source) -> Result<Network, PolicyError> {
        match s {
            "none" => Ok(Network::None),
            "egress" => Ok(Network::Egress),
            "host" if source == Source::File => Ok(Network::Host),
            "host" => Err(PolicyError::not_allowed(
                field,
                s,
                "is accepted only in sandbox.toml; use \"none\" or \"egress\"",
            )),
            _ => Err(PolicyError::invalid(
                field,
                s,
                "is not a network mode; use \"none\", \"egress\" or \"host\" (host only in sandbox.toml)",
            )),
        }
    }
}

impl MountSpec {
    /// Parse `--mount SRC:DST[:rw|:ro]`; both paths absolute. Read-only unless `:rw`.
    pub fn parse_cli(field: &str, s: &str) -> Result<MountSpec, PolicyError> {
        let parts: Vec<&str> = s.split(':').collect();
        let (src, dst, rw) = match parts.as_slice() {
            [src, dst] => (*src, *dst, false),
            [src, dst, "ro"] => (*src, *dst, false),
            [src, dst, "rw"] => (*src, *dst, true),
            _ => return Err(PolicyError::invalid(
                field,
                s,
                "is not a mount; use SRC:DST, SRC:DST:ro or SRC:DST:rw (paths cannot contain ':')",
            )),
        };
        let src = absolute_path(&format!("{field} source"), src)?;
        MountSpec::new(field, src, dst, rw)
    }

    /// A mount with an already-checked `src`; checks `dst`.
    pub(crate) fn new(
        field: &str,
        src: PathBuf,
        dst: &str,
        rw: bool,
    ) -> Result<MountSpec, PolicyError> {
        let dst_field = format!("{field} destination");
        let dst_path = absolute_path(&dst_field, dst)?;
        if dst_path == Path::new("/") {
            return Err(PolicyError::invalid(
                &dst_field,
                dst,
                "cannot be /: the root is Zygo's",
            ));
        }
        if let Some(r) = RESERVED_DSTS.iter().find(|r| dst_path.starts_with(r)) {
            return Err(PolicyError::invalid(
                &dst_field,
                dst,
                format!("is reserved: {r} and everything under it are built by Zygo"),
            ));
        }
        Ok(MountSpec {
            src,
            dst: dst_path,
            rw,
        })
    }
}

/// Parse `--env K=V`.
pub fn parse_env(field: &str, s: &str) -> Result<(String, String), PolicyError> {
    let Some((key, value)) = s.split_once('=') else {
        return Err(PolicyError::invalid(field, s, "is not K=V"));
    };
    check_env(field, key, value)?;
    Ok((key.to_owned(), value.to_owned()))
}

/// An environment variable name is `[A-Za-z_][A-Za-z0-9_]*`; its value has no NUL.
pub(crate) fn check_env(field: &str, key: &str, value: &str) -> Result<(), PolicyError> {
    if !is_identifier(key) {
        return Err(PolicyError::invalid(
            field,
            key,
            "is not a variable name; use letters, digits and _, not starting with a digit",
        ));
    }
    if value.contains('\0') {
        return Err(PolicyError::invalid(field, value, "contains a NUL byte"));
    }
    Ok(())
}

/// Apply overrides to [`BASE_ENV`]: an override replaces a variable in place; new ones
/// follow in the order given. A later duplicate wins.
pub(crate) fn build_env(
    overrides: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = BASE_ENV
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    for (k, v) in overrides {
        match env.iter_mut().find(|(have, _)| *have == k) {
            Some(slot) => slot.1 = v,
            None => env.push((k, v)),
        }
    }
    env
}

impl OneShotArgs {
    /// The limits these flags set (unset flags stay `None`).
    pub fn limits(&self) -> Result<Limits, PolicyError> {
        Ok(Limits {
            mem: self
                .mem
                .as_deref()
                .map(|s| Mem::parse("--mem", s, Source::Cli))
                .transpose()?,
            cpu: self
                .cpu
                .as_deref()
                .map(|s| Cpus::parse("--cpu", s))
                .transpose()?,
            pids: self
                .pids
                .as_deref()
                .map(|s| parse_pids("--pids", s))
                .transpose()?,
            timeout: self
                .timeout
                .as_deref()
                .map(|s| parse_duration("--timeout", s))
                .transpose()?,
            scratch: self
                .scratch
                .as_deref()
                .map(|s| parse_size("--scratch", s))
                .transpose()?,
            io_bps: self
                .io_bps
                .as_deref()
                .map(|s| parse_io_bps("--io-bps", s))
                .transpose()?,
            io_iops: self
                .io_iops
                .as_deref()
                .map(|s| parse_iops("--io-iops", s))
                .transpose()?,
        })
    }
}

/// Check `zygo run`'s arguments and build its plan, with built-in default limits.
pub fn one_shot(args: &OneShotArgs) -> Result<OneShotPlan, PolicyError> {
    let Some(cmd) = args.argv.first() else {
        return Err(PolicyError::NoCommand);
    };
    if cmd.is_empty() {
        return Err(PolicyError::invalid("command", cmd, "is empty"));
    }
    if let Some(arg) = args.argv.iter().find(|a| a.contains('\0')) {
        return Err(PolicyError::invalid("command", arg, "contains a NUL byte"));
    }
    let limits = args.limits()?.resolve(&ResolvedLimits::DEFAULT);
    let image = match &args.image {
        Some(s) => Image::parse("--image", s)?,
        None => Image::Host,
    };
    let network = match &args.net {
        Some(s) => Network::parse("--net", s, Source::Cli)?,
        None => Network::None,
    };
    if network == Network::Host {
        return Err(PolicyError::not_allowed(
            "--net",
            "host",
            "is accepted only in sandbox.toml; use \"none\" or \"egress\"",
        ));
    }
    let allow = args
        .allow
        .iter()
        .map(|a| crate::file::AllowRule::parse("--allow", a))
        .collect::<Result<Vec<_>, _>>()?;
    if !allow.is_empty() && network != Network::Egress {
        return Err(PolicyError::invalid(
            "--allow",
            &allow[0].to_string(),
            "needs --net egress",
        ));
    }
    // The command line is the operator's own: its rules may name private addresses.
    let private = if args.refuse_private {
        crate::egress::PrivateNet::Refused
    } else {
        crate::egress::PrivateNet::Allowed
    };
    let allow = crate::egress::compile("--allow", &allow, private)?;
    let mounts = args
        .mounts
        .iter()
        .map(|m| MountSpec::parse_cli("--mount", m))
        .collect::<Result<Vec<_>, _>>()?;
    check_unique_dsts("--mount", &mounts)?;
    let overrides = args
        .env
        .iter()
        .map(|e| parse_env("--env", e))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(OneShotPlan {
        image,
        mounts,
        env: build_env(overrides),
        limits,
        inotify: args.inotify,
        network,
        allow,
        argv: args.argv.clone(),
    })
}

pub(crate) fn check_unique_dsts(field: &str, mounts: &[MountSpec]) -> Result<(), PolicyError> {
    for (i, m) in mounts.iter().enumerate() {
        if mounts[..i].iter().any(|earlier| earlier.dst == m.dst) {
            return Err(PolicyError::invalid(
                field,
                &m.dst.to_string_lossy(),
                "is mounted twice; each destination may appear once",
            ));
        }
    }
    Ok(())
}

/// `[A-Za-z_][A-Za-z0-9_]*`
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A path that must be absolute and free of `..`.
pub(crate) fn absolute_path(field: &str, s: &str) -> Result<PathBuf, PolicyError> {
    let p = plain_path(field, s)?;
    if !p.is_absolute() {
        return Err(PolicyError::invalid(
            field,
            s,
            "must be an absolute path (starting with /)",
        ));
    }
    Ok(p)
}

/// A path that is non-empty, short, NUL-free and has no `..` component. Paths are never
/// looked up on disk, so `..` (which could walk through a symlink) is refused outright.
pub(crate) fn plain_path(field: &str, s: &str) -> Result<PathBuf, PolicyError> {
    if s.is_empty() {
        return Err(PolicyError::invalid(field, s, "is empty; give a path"));
    }
    if s.len() > MAX_PATH {
        return Err(PolicyError::invalid(
            field,
            s,
            format!("is longer than {MAX_PATH} bytes"),
        ));
    }
    if s.contains('\0') {
        return Err(PolicyError::invalid(field, s, "contains a NUL byte"));
    }
    let p = PathBuf::from(s);
    if p.components().any(|c| c == Component::ParentDir) {
        return Err(PolicyError::invalid(field, s, "must not contain `..`"));
    }
    Ok(p)
}

impl fmt::Display for Image {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Image::Host => f.write_str("host"),
            Image::Dir(p) => write!(f, "dir:{}", p.display()),
        }
    }
}

impl fmt::Display for Network {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Network::None => "none",
            Network::Egress => "egress",
            Network::Host => "host",
        })
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{Bytes, Mem};
    use std::time::Duration;

    fn args(argv: &[&str]) -> OneShotArgs {
        OneShotArgs {
            argv: argv.iter().map(|s| s.to_string()).collect(),
            ..OneShotArgs::default()
        }
    }

    fn err(a: &OneShotArgs) -> String {
        one_shot(a).unwrap_err().to_string()
    }

    #[test]
    fn defaults() {
        let plan = one_shot(&args(&["echo", "hi"])).unwrap();
        assert_eq!(plan.image, Image::Host);
        assert_eq!(plan.network, Network::None);
        assert_eq!(plan.limits, ResolvedLimits::DEFAULT);
        assert_eq!(plan.argv, ["echo", "hi"]);
        assert!(plan.mounts.is_empty());
        let env: Vec<(&str, &str)> = plan
            .env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(env, BASE_ENV);
    }

    #[test]
    fn everything_set() {
        let a = OneShotArgs {
            mem: Some("1G".into()),
            cpu: Some("0.5".into()),
            pids: Some("10".into()),
            timeout: Some("5m".into()),
            scratch: Some("1M".into()),
            io_bps: Some("16M".into()),
            io_iops: Some("500".into()),
            net: Some("none".into()),
            allow: Vec::new(),
            inotify: true,
            refuse_private: false,
            image: Some("dir:/srv/rootfs".into()),
            mounts: vec![
                "/data:/data".into(),
                "/out:/mnt/out:rw".into(),
                "/x:/y:ro".into(),
            ],
            env: vec![
                "HOME=/elsewhere".into(),
                "A=b=c".into(),
                "EMPTY=".into(),
                "A=last".into(),
            ],
            argv: vec!["python3".into(), "-c".into(), "print(1)".into()],
        };
        let plan = one_shot(&a).unwrap();
        assert_eq!(plan.limits.mem, Mem::Limited(Bytes(1 << 30)));
        assert_eq!(plan.limits.cpu.millis(), 500);
        assert_eq!(plan.limits.pids, 10);
        assert_eq!(plan.limits.timeout, Duration::from_secs(300));
        assert_eq!(plan.limits.scratch, Bytes(1 << 20));
        assert_eq!(plan.limits.io_bps, Bytes(16 << 20));
        assert_eq!(plan.limits.io_iops, 500);
        assert_eq!(plan.image, Image::Dir("/srv/rootfs".into()));
        assert_eq!(
            plan.mounts,
            [
                MountSpec {
                    src: "/data".into(),
                    dst: "/data".into(),
                    rw: false
                },
                MountSpec {
                    src: "/out".into(),
                    dst: "/mnt/out".into(),
                    rw: true
                },
                MountSpec {
                    src: "/x".into(),
                    dst: "/y".into(),
                    rw: false
                },
            ]
        );
        let get = |k: &str| {
            plan.env
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.as_str())
        };
        assert_eq!(get("HOME"), Some("/elsewhere"));
        assert_eq!(get("A"), Some("last"));
        assert_eq!(get("EMPTY"), Some(""));
        assert_eq!(get("PATH"), Some("/usr/local/bin:/usr/bin:/bin"));
        assert_eq!(plan.env.len(), 6);
    }

    #[test]
    fn no_command() {
        assert_eq!(one_shot(&args(&[])), Err(PolicyError::NoCommand));
        assert_eq!(
            err(&args(&[])),
            "no command given: zygo run [OPTIONS] -- CMD ARG..."
        );
        assert!(err(&args(&[""])).contains("is empty"));
        assert!(err(&args(&["echo", "a\0b"])).contains("NUL"));
    }

    #[test]
    fn bad_limits_name_the_flag() {
        for (set, flag) in [
            (
                (|a: &mut OneShotArgs| a.mem = Some("12X".into())) as fn(&mut OneShotArgs),
                "--mem",
            ),
            (|a| a.mem = Some("unlimited".into()), "--mem"),
            (|a| a.cpu = Some("2000".into()), "--cpu"),
            (|a| a.pids = Some("0".into()), "--pids"),
            (|a| a.timeout = Some("25h".into()), "--timeout"),
            (|a| a.scratch = Some("-1M".into()), "--scratch"),
            (|a| a.image = Some("ubuntu".into()), "--image"),
            (|a| a.net = Some("wifi".into()), "--net"),
        ] {
            let mut a = args(&["true"]);
            set(&mut a);
            let e = err(&a);
            assert!(e.starts_with(&format!("{flag}: ")), "{e}");
        }
    }

    #[test]
    fn network() {
        let mut a = args(&["true"]);
        a.allow = vec!["10.0.0.2:80".into()];
        assert!(err(&a).contains("needs --net egress"));
        a.net = Some("egress".into());
        let plan = one_shot(&a).unwrap();
        assert_eq!(plan.network, Network::Egress);
        assert_eq!(plan.allow.len(), 1);
        a.allow = vec!["[2001:db8::1]:443".into()];
        assert!(err(&a).contains("IPv4 only"));
        a.allow.clear();
        a.net = Some("host".into());
        assert!(err(&a).contains("only in sandbox.toml"));
        assert_eq!(
            Network::parse("network", "host", Source::File),
            Ok(Network::Host)
        );
        assert!(Network::parse("network", "host", Source::Http).is_err());
    }

    #[test]
    fn images() {
        assert_eq!(Image::parse("i", "host"), Ok(Image::Host));
        assert_eq!(Image::parse("i", "dir:/r"), Ok(Image::Dir("/r".into())));
        for (bad, why) in [
            ("dir:rel/path", "absolute"),
            ("dir:/a/../b", "`..`"),
            ("dir:", "is empty"),
            ("Host", "use \"host\""),
            ("docker.io/ubuntu", "use \"host\""),
        ] {
            let e = Image::parse("--image", bad).unwrap_err().to_string();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn mounts() {
        let m = |s: &str| MountSpec::parse_cli("--mount", s).map_err(|e| e.to_string());
        assert!(m("/a:/b").is_ok());
        assert_eq!(m("/a:/b/").unwrap().dst, PathBuf::from("/b/"));
        for (bad, why) in [
            ("/a", "is not a mount"),
            ("/a:/b:rx", "is not a mount"),
            ("/a:/b:rw:x", "is not a mount"),
            ("a:/b", "source: \"a\" must be an absolute path"),
            ("/a:b", "destination: \"b\" must be an absolute path"),
            ("/a/../etc:/b", "`..`"),
            ("/a:/b/../proc", "`..`"),
            ("/a:/", "cannot be /"),
            ("/a://", "cannot be /"),
            ("/a:/proc", "/proc and everything under it"),
            ("/a:/proc/sys", "/proc and everything under it"),
            ("/a://dev/", "/dev and everything under it"),
            ("/a:/tmp/x", "/tmp"),
            ("/a:/work", "/work"),
            ("/a:/run/secrets", "/run"),
            (":/b", "is empty"),
        ] {
            let e = m(bad).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
        // Component-wise: /procfs is not under /proc.
        assert!(m("/a:/procfs").is_ok());
        let mut a = args(&["true"]);
        a.mounts = vec!["/a:/x".into(), "/b:/x/".into()];
        assert!(err(&a).contains("mounted twice"));
    }

    #[test]
    fn env() {
        assert_eq!(parse_env("--env", "A=1"), Ok(("A".into(), "1".into())));
        assert_eq!(
            parse_env("--env", "_x9=a=b"),
            Ok(("_x9".into(), "a=b".into()))
        );
        for (bad, why) in [
            ("A", "is not K=V"),
            ("=1", "not a variable name"),
            ("1A=1", "not a variable name"),
            ("A-B=1", "not a variable name"),
            ("Ä=1", "not a variable name"),
            ("A=x\0y", "NUL"),
        ] {
            let e = parse_env("--env", bad).unwrap_err().to_string();
            assert!(e.starts_with("--env: "), "{e}");
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
