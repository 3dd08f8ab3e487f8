//! `sandbox.toml`: `[defaults]` and `[fn.NAME]` tables, parsed strictly, merged, and
//! resolved into one complete [`FnSpec`] per function.
//!
//! A [`Layer`] is one table's worth of settings, every field optional. The same type
//! carries an HTTP layer later (`Layer::from_toml` with `Source::Http`), merged over
//! `[defaults]` with [`Layer::merge_over`].

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toml::{Spanned, Value};

use crate::error::{line_of, Shown};
use crate::limits::{
    parse_duration, parse_io_bps, parse_iops, parse_pids, parse_size, Cpus, Limits, Mem,
    ResolvedLimits, Source,
};
use crate::plan::{
    build_env, check_env, check_unique_dsts, is_identifier, plain_path, Image, MountSpec, Network,
};
use crate::PolicyError;

/// Largest sandbox.toml accepted, checked before parsing.
pub const MAX_FILE_BYTES: usize = 1 << 20;
/// Most `[fn.NAME]` tables in one file.
pub const MAX_FUNCTIONS: usize = 256;
/// Longest string value (and key) accepted.
pub const MAX_STRING: usize = 4096;
/// Largest `min_warm` / `max_warm`.
pub const MAX_WARM: u32 = 1024;
pub const DEFAULT_MIN_WARM: u32 = 1;
pub const DEFAULT_MAX_WARM: u32 = 4;
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

const KNOWN_KEYS: &str =
    "image, mem, cpu, pids, timeout, scratch, io_bps, io_iops, network, allow, \
    idle_timeout, min_warm, max_warm, agent, entry, cmd, requirements, deps, mounts, secrets, \
    env, inotify";

/// Whether `s` has the form of a dependency set's id: `deps_` and 64 lowercase hex digits.
pub fn is_deps_id(s: &str) -> bool {
    s.strip_prefix("deps_").is_some_and(|h| {
        h.len() == 64
            && h.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    })
}

/// The interpreter a zygote runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    Python,
    Node,
}

/// The handler an agent imports: `path.py:func`, `path.mjs` or `path.mjs:handler`.
/// `file` is already joined onto the sandbox.toml's folder.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub file: PathBuf,
    pub func: Option<String>,
}

/// One egress rule, `host:port`. `host` is lower-cased; IPv6 is stored without brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    pub host: String,
    pub port: u16,
}

/// What a function runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FnKind {
    /// A warm agent; with no entry it is a runtime pool that runs scripts sent with calls.
    Agent { agent: Agent, entry: Option<Entry> },
    /// Warm-exec: the sandbox is held and this command started per request.
    Cmd(Vec<String>),
}

/// One table of settings, every field optional.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layer {
    pub image: Option<Image>,
    pub limits: Limits,
    pub network: Option<Network>,
    pub allow: Option<Vec<AllowRule>>,
    pub idle_timeout: Option<Duration>,
    pub min_warm: Option<u32>,
    pub max_warm: Option<u32>,
    pub agent: Option<Agent>,
    pub entry: Option<Entry>,
    pub cmd: Option<Vec<String>>,
    pub requirements: Option<PathBuf>,
    /// A dependency set by id (`deps_` and 64 hex digits), mounted read-only at /venv.
    pub deps: Option<String>,
    pub mounts: Option<Vec<MountSpec>>,
    pub secrets: Option<Vec<String>>,
    /// Variables set by this layer (the base environment is added by [`Layer::resolve`]).
    pub env: Option<BTreeMap<String, String>>,
    /// Whether programs may use inotify (see [`FnSpec::inotify`]).
    pub inotify: Option<bool>,
}

/// A function with every field decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSpec {
    pub name: String,
    pub kind: FnKind,
    pub image: Image,
    pub limits: ResolvedLimits,
    pub network: Network,
    pub allow: Vec<AllowRule>,
    pub idle_timeout: Duration,
    pub min_warm: u32,
    pub max_warm: u32,
    pub requirements: Option<PathBuf>,
    /// A dependency set by id; never together with `requirements`.
    pub deps: Option<String>,
    pub mounts: Vec<MountSpec>,
    pub secrets: Vec<String>,
    /// The full environment: the base variables, overridden and extended by `env`.
    pub env: Vec<(String, String)>,
    /// Whether programs may use inotify: off unless the file says `inotify = true`, since a
    /// watch on a file of the shared read-only image sees when anyone opens it.
    pub inotify: bool,
    /// Whether `allow` may open private and other special addresses (see
    /// `crate::egress::PrivateNet`): true for sandbox.toml, the operator's; whoever serves a
    /// spec from elsewhere (an HTTP layer) sets it to what that caller may do.
    pub private_net: bool,
}

/// A parsed sandbox.toml.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxFile {
    /// The file's folder; relative paths in the file were joined onto it.
    pub base_dir: PathBuf,
    /// `[defaults]` as written (paths joined), for HTTP layers to merge over.
    pub defaults: Layer,
    pub functions: BTreeMap<String, FnSpec>,
    /// `[api]`: how `zygo api` listens; the other commands ignore it.
    pub api: ApiSettings,
}

/// The `[api]` table of a sandbox.toml, read by `zygo api` (its flags win over it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ApiSettings {
    /// `listen`: an `IP:PORT` or `unix:///path`, checked by `zygo api` as `--listen` is.
    pub listen: Option<String>,
    /// `auth = "none"` (as `--no-auth`); `"token"`, the default, is `false`.
    pub no_auth: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApi {
    listen: Option<String>,
    auth: Option<String>,
}

type RawTable = BTreeMap<Spanned<String>, Value>;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    defaults: Option<RawTable>,
    #[serde(default, rename = "fn")]
    functions: BTreeMap<Spanned<String>, RawTable>,
    #[serde(default)]
    api: Option<RawApi>,
}

/// Parse sandbox.toml text. `path` is used only for error messages and as the base for
/// relative paths (its parent folder; pass an absolute path to get absolute paths back).
/// Nothing is read from disk.
pub fn parse_sandbox_toml(text: &str, path: &Path) -> Result<SandboxFile, PolicyError> {
    parse(text, path).map_err(|error| PolicyError::InFile {
        path: path.to_owned(),
        error: Box::new(error),
    })
}

fn parse(text: &str, path: &Path) -> Result<SandboxFile, PolicyError> {
    if text.len() > MAX_FILE_BYTES {
        return Err(PolicyError::TooLarge {
            what: format!("the file ({} bytes)", text.len()),
            limit: "1 MiB".into(),
        });
    }
    let raw: RawFile = toml::from_str(text).map_err(|e| explain(text, &e))?;
    if raw.functions.len() > MAX_FUNCTIONS {
        return Err(PolicyError::TooLarge {
            what: format!("the number of functions ({})", raw.functions.len()),
            limit: format!("{MAX_FUNCTIONS}"),
        });
    }
    let base_dir = path.parent().unwrap_or(Path::new("")).to_path_buf();
    let cx = |table: String| Ctx {
        table,
        base_dir: &base_dir,
        source: Source::File,
    };
    let lines = |t: &RawTable| -> Vec<(String, Option<usize>, Value)> {
        let mut entries: Vec<_> = t
            .iter()
            .map(|(k, v)| {
                (
                    k.get_ref().clone(),
                    Some(line_of(text, k.span().start)),
                    v.clone(),
                )
            })
            .collect();
        entries.sort_by_key(|e| e.1);
        entries
    };
    let defaults = match &raw.defaults {
        Some(t) => Layer::parse_entries(&cx("defaults".into()), &lines(t))?,
        None => Layer::default(),
    };
    let mut fns: Vec<_> = raw.functions.iter().collect();
    fns.sort_by_key(|(name, _)| name.span().start);
    let mut functions = BTreeMap::new();
    for (name, table) in fns {
        let line = line_of(text, name.span().start);
        check_fn_name(name.get_ref(), Some(line))?;
        let layer = Layer::parse_entries(&cx(format!("fn.{}", name.get_ref())), &lines(table))?;
        let spec = layer.merge_over(&defaults).resolve(name.get_ref())?;
        functions.insert(name.get_ref().clone(), spec);
    }
    let api = match raw.api {
        Some(a) => ApiSettings {
            no_auth: match a.auth.as_deref() {
                None | Some("token") => false,
                Some("none") => true,
                Some(other) => {
                    return Err(PolicyError::invalid(
                        "[api] auth",
                        other,
                        "is not \"token\" (every caller needs a bearer token, the default) or \"none\" (as --no-auth)",
                    ))
                }
            },
            listen: a.listen,
        },
        None => ApiSettings::default(),
    };
    Ok(SandboxFile {
        base_dir,
        defaults,
        functions,
        api,
    })
}

/// Turn a TOML/serde error into one that names the key and line where possible.
fn explain(text: &str, e: &toml::de::Error) -> PolicyError {
    let line = e.span().map(|s| line_of(text, s.start));
    // Valid TOML with the wrong shape: say which top-level piece is wrong. The line is
    // the parser's, so attach it only when there is a single problem it can belong to.
    if let Ok(table) = toml::from_str::<toml::Table>(text) {
        let mut problems = shape_problems(&table, line);
        if problems.len() > 1 {
            problems = shape_problems(&table, None);
        }
        if let Some(first) = problems.into_iter().next() {
            return first;
        }
    }
    PolicyError::Syntax {
        line,
        message: e.message().trim().to_owned(),
    }
}

fn shape_problems(top: &toml::Table, line: Option<usize>) -> Vec<PolicyError> {
    let at = line.map(|n| format!(" (line {n})")).unwrap_or_default();
    let wrong = |what: String, expected, v: &Value| PolicyError::WrongType {
        field: format!("{what}{at}"),
        expected,
        found: type_name(v),
    };
    let mut out = Vec::new();
    for (key, v) in top {
        match (key.as_str(), v) {
            ("defaults", Value::Table(_)) => {}
            ("defaults", v) => out.push(wrong("[defaults]".into(), "a table", v)),
            ("fn", Value::Table(fns)) => {
                for (name, f) in fns.iter().filter(|(_, f)| !f.is_table()) {
                    out.push(wrong(
                        format!("[fn.{}]", Shown::new(name).bare()),
                        "a table",
                        f,
                    ));
                }
            }
            ("fn", v) => out.push(wrong("fn".into(), "a table of [fn.NAME] tables", v)),
            ("api", Value::Table(t)) => {
                for (k, v) in t {
                    match (k.as_str(), v) {
                        ("listen" | "auth", Value::String(_)) => {}
                        ("listen" | "auth", v) => {
                            out.push(wrong(format!("[api] {k}"), "a string", v));
                        }
                        (other, _) => out.push(PolicyError::UnknownKey {
                            key: Shown::new(other),
                            table: "[api]".into(),
                            line,
                            known: "listen, auth",
                        }),
                    }
                }
            }
            ("api", v) => out.push(wrong("[api]".into(), "a table", v)),
            (other, _) => out.push(PolicyError::UnknownKey {
                key: Shown::new(other),
                table: "the top level".into(),
                line,
                known: "[defaults], [fn.NAME], [api]",
            }),
        }
    }
    out
}

/// Function names are `[a-z0-9][a-z0-9_-]{0,62}`.
pub fn check_fn_name(name: &str, line: Option<usize>) -> Result<(), PolicyError> {
    let b = name.as_bytes();
    let ok = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let good = (1..=63).contains(&b.len())
        && b.first().is_some_and(ok)
        && b.iter().all(|c| ok(c) || *c == b'_' || *c == b'-');
    if good {
        return Ok(());
    }
    Err(PolicyError::invalid(
        &match line {
            Some(n) => format!("function name (line {n})"),
            None => "function name".to_owned(),
        },
        name,
        "is not a valid name; use 1 to 63 characters of a-z, 0-9, _ and -, starting with a letter or digit",
    ))
}

/// Where the keys being parsed live, for error messages and relative paths.
struct Ctx<'a> {
    table: String,
    base_dir: &'a Path,
    source: Source,
}

impl Ctx<'_> {
    fn field(&self, key: &str, line: Option<usize>) -> String {
        match line {
            Some(n) => format!("{key} in [{}] (line {n})", self.table),
            None => format!("{key} in [{}]", self.table),
        }
    }

    /// A relative path joined onto the file's folder (pure join, nothing on disk).
    fn path(&self, field: &str, s: &str) -> Result<PathBuf, PolicyError> {
        Ok(self.base_dir.join(plain_path(field, s)?))
    }
}

impl Layer {
    /// Parse one table of settings without line numbers, e.g. an HTTP layer converted to
    /// TOML. `label` names the table in errors; relative paths are joined onto `base_dir`.
    pub fn from_toml(
        label: &str,
        table: &toml::Table,
        base_dir: &Path,
        source: Source,
    ) -> Result<Layer, PolicyError> {
        let cx = Ctx {
            table: label.to_owned(),
            base_dir,
            source,
        };
        let entries: Vec<_> = table
            .iter()
            .map(|(k, v)| (k.clone(), None, v.clone()))
            .collect();
        Layer::parse_entries(&cx, &entries)
    }

    /// This layer over `base`: every field this layer sets wins, field by field
    /// (limits too: a set limit replaces the base's, it is not combined).
    pub fn merge_over(&self, base: &Layer) -> Layer {
        fn or<T: Clone>(a: &Option<T>, b: &Option<T>) -> Option<T> {
            a.as_ref().or(b.as_ref()).cloned()
        }
        Layer {
            image: or(&self.image, &base.image),
            limits: self.limits.or(&base.limits),
            network: or(&self.network, &base.network),
            allow: or(&self.allow, &base.allow),
            idle_timeout: or(&self.idle_timeout, &base.idle_timeout),
            min_warm: or(&self.min_warm, &base.min_warm),
            max_warm: or(&self.max_warm, &base.max_warm),
            agent: or(&self.agent, &base.agent),
            entry: or(&self.entry, &base.entry),
            cmd: or(&self.cmd, &base.cmd),
            requirements: or(&self.requirements, &base.requirements),
            deps: or(&self.deps, &base.deps),
            mounts: or(&self.mounts, &base.mounts),
            secrets: or(&self.secrets, &base.secrets),
            env: or(&self.env, &base.env),
            inotify: or(&self.inotify, &base.inotify),
        }
    }

    /// Decide every field of function `name` (built-in defaults for what no layer set)
    /// and check the rules that span fields.
    pub fn resolve(&self, name: &str) -> Result<FnSpec, PolicyError> {
        check_fn_name(name, None)?;
        let table = format!("fn.{name}");
        let fail = |reason: String| PolicyError::Spec {
            table: table.clone(),
            reason,
        };
        let kind = match (self.agent, &self.cmd) {
            (Some(_), Some(_)) => {
                return Err(fail(
                    "sets both agent and cmd (one may come from [defaults]); a function runs \
                     either an agent or a command"
                        .into(),
                ))
            }
            (None, None) => {
                return Err(fail(
                    "needs agent = \"python\" or \"node\", or cmd = [\"program\", ...]".into(),
                ))
            }
            (None, Some(_)) if self.entry.is_some() => {
                return Err(fail(
                    "entry names an agent's handler; a cmd function has none".into(),
                ))
            }
            (None, Some(cmd)) => FnKind::Cmd(cmd.clone()),
            (Some(agent), None) => {
                if let Some(entry) = &self.entry {
                    check_entry_fits(agent, entry).map_err(fail)?;
                }
                FnKind::Agent {
                    agent,
                    entry: self.entry.clone(),
                }
            }
        };
        let min_warm = self.min_warm.unwrap_or(DEFAULT_MIN_WARM);
        let max_warm = self.max_warm.unwrap_or(DEFAULT_MAX_WARM);
        if min_warm > max_warm {
            return Err(fail(format!(
                "min_warm ({min_warm}) is above max_warm ({max_warm}){}",
                if self.max_warm.is_none() {
                    " (the default)"
                } else {
                    ""
                }
            )));
        }
        let network = self.network.unwrap_or(Network::None);
        let allow = self.allow.clone().unwrap_or_default();
        if !allow.is_empty() && network != Network::Egress {
            return Err(fail(format!(
                "allow rules need network = \"egress\" (network is \"{network}\")"
            )));
        }
        if let (Some(r), Some(d)) = (&self.requirements, &self.deps) {
            return Err(fail(format!(
                "sets both requirements ({}) and deps ({d}) (one may come from [defaults]); \
                 name the dependencies one way",
                r.display()
            )));
        }
        let env = self
            .env
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone()));
        Ok(FnSpec {
            name: name.to_owned(),
            kind,
            image: self.image.clone().unwrap_or(Image::Host),
            limits: self.limits.resolve(&ResolvedLimits::DEFAULT),
            network,
            allow,
            idle_timeout: self.idle_timeout.unwrap_or(DEFAULT_IDLE_TIMEOUT),
            min_warm,
            max_warm,
            requirements: self.requirements.clone(),
            deps: self.deps.clone(),
            mounts: self.mounts.clone().unwrap_or_default(),
            secrets: self.secrets.clone().unwrap_or_default(),
            env: build_env(env),
            inotify: self.inotify.unwrap_or(false),
            private_net: true,
        })
    }

    fn parse_entries(
        cx: &Ctx<'_>,
        entries: &[(String, Option<usize>, Value)],
    ) -> Result<Layer, PolicyError> {
        let mut layer = Layer::default();
        for (key, line, value) in entries {
            layer.set(cx, key, *line, value)?;
        }
        Ok(layer)
    }

    fn set(
        &mut self,
        cx: &Ctx<'_>,
        key: &str,
        line: Option<usize>,
        v: &Value,
    ) -> Result<(), PolicyError> {
        let f = &cx.field(key, line);
        const SIZE: &str = "a string such as \"256M\"";
        const DURATION: &str = "a string such as \"30s\"";
        match key {
            "image" => {
                self.image = Some(Image::parse(f, string(f, v, "a string such as \"host\"")?)?)
            }
            "mem" => self.limits.mem = Some(Mem::parse(f, string(f, v, SIZE)?, cx.source)?),
            "cpu" => {
                let text = match v {
                    Value::Integer(i) => i.to_string(),
                    Value::Float(x) => x.to_string(),
                    Value::String(s) => s.clone(),
                    _ => return Err(wrong_type(f, "a number such as 1 or 0.5", v)),
                };
                self.limits.cpu = Some(Cpus::parse(f, &text)?);
            }
            "pids" => {
                let Value::Integer(i) = v else {
                    return Err(wrong_type(f, "a whole number such as 64", v));
                };
                self.limits.pids = Some(parse_pids(f, &i.to_string())?);
            }
            "timeout" => self.limits.timeout = Some(parse_duration(f, string(f, v, DURATION)?)?),
            "scratch" => self.limits.scratch = Some(parse_size(f, string(f, v, SIZE)?)?),
            "io_bps" => self.limits.io_bps = Some(parse_io_bps(f, string(f, v, SIZE)?)?),
            "io_iops" => {
                let Value::Integer(i) = v else {
                    return Err(wrong_type(f, "a whole number such as 4000", v));
                };
                self.limits.io_iops = Some(parse_iops(f, &i.to_string())?);
            }
            "network" => {
                let s = string(f, v, "a string: \"none\", \"egress\" or \"host\"")?;
                self.network = Some(Network::parse(f, s, cx.source)?);
            }
            "allow" => {
                let rules = strings(f, v, "an array of \"host:port\" strings")?;
                self.allow = Some(
                    rules
                        .iter()
                        .map(|r| AllowRule::parse(f, r))
                        .collect::<Result<_, _>>()?,
                );
            }
            "idle_timeout" => self.idle_timeout = Some(parse_duration(f, string(f, v, DURATION)?)?),
            "min_warm" => self.min_warm = Some(warm(f, v, 0)?),
            "max_warm" => self.max_warm = Some(warm(f, v, 1)?),
            "agent" => {
                self.agent = Some(match string(f, v, "a string: \"python\" or \"node\"")? {
                    "python" => Agent::Python,
                    "node" => Agent::Node,
                    other => {
                        return Err(PolicyError::invalid(
                            f,
                            other,
                            "is not an agent; use \"python\" or \"node\"",
                        ))
                    }
                })
            }
            "entry" => {
                self.entry = Some(Entry::parse(
                    cx,
                    f,
                    string(f, v, "a string such as \"handler.py:main\"")?,
                )?)
            }
            "cmd" => {
                let cmd = strings(
                    f,
                    v,
                    "an array of strings such as [\"./server\", \"--fast\"]",
                )?;
                match cmd.first() {
                    None => {
                        return Err(PolicyError::invalid(
                            f,
                            "[]",
                            "is empty; give the program to run",
                        ))
                    }
                    Some(c) if c.is_empty() => {
                        return Err(PolicyError::invalid(f, c, "names no program"))
                    }
                    _ => {}
                }
                if let Some(a) = cmd.iter().find(|a| a.contains('\0')) {
                    return Err(PolicyError::invalid(f, a, "contains a NUL byte"));
                }
                self.cmd = Some(cmd.into_iter().map(str::to_owned).collect());
            }
            "requirements" => {
                self.requirements = Some(cx.path(f, string(f, v, "a string (a path)")?)?)
            }
            "deps" => {
                let id = string(f, v, "a dependency set's id (deps_ and 64 hex digits)")?;
                if !is_deps_id(id) {
                    return Err(PolicyError::invalid(
                        f,
                        id,
                        "is not a dependency set's id: deps_ and 64 lowercase hex digits, as POST /deps or `zygo deps build` gives",
                    ));
                }
                self.deps = Some(id.to_owned());
            }
            "mounts" => self.mounts = Some(mounts(cx, key, line, v)?),
            "inotify" => {
                let Value::Boolean(b) = v else {
                    return Err(wrong_type(f, "true or false", v));
                };
                if *b && cx.source != Source::File {
                    return Err(PolicyError::not_allowed(
                        f,
                        "true",
                        "can be set only in sandbox.toml: inotify on the shared image is a side channel the host's operator must choose",
                    ));
                }
                self.inotify = Some(*b);
            }
            "secrets" => {
                let names = strings(f, v, "an array of secret names")?;
                for (i, name) in names.iter().enumerate() {
                    if !is_identifier(name) || name.len() > 64 {
                        return Err(PolicyError::invalid(
                            f,
                            name,
                            "is not a secret name; use 1 to 64 letters, digits and _, not starting with a digit",
                        ));
                    }
                    if names[..i].contains(name) {
                        return Err(PolicyError::invalid(f, name, "is listed twice"));
                    }
                }
                self.secrets = Some(names.into_iter().map(str::to_owned).collect());
            }
            "env" => {
                let Value::Table(t) = v else {
                    return Err(wrong_type(f, "a table such as { LOG_LEVEL = \"info\" }", v));
                };
                let mut env = BTreeMap::new();
                for (k, val) in t {
                    let kf = &cx.field(&format!("env.{}", Shown::new(k).bare()), line);
                    check_len(kf, k)?;
                    let val = string(kf, val, "a string")?;
                    check_env(kf, k, val)?;
                    env.insert(k.clone(), val.to_owned());
                }
                self.env = Some(env);
            }
            other => {
                return Err(PolicyError::UnknownKey {
                    key: Shown::new(other),
                    table: format!("[{}]", cx.table),
                    line,
                    known: KNOWN_KEYS,
                })
            }
        }
        Ok(())
    }
}

fn mounts(
    cx: &Ctx<'_>,
    key: &str,
    line: Option<usize>,
    v: &Value,
) -> Result<Vec<MountSpec>, PolicyError> {
    const EXPECTED: &str = "an array of tables such as [{ src = \"models\", dst = \"/models\" }]";
    let f = &cx.field(key, line);
    let Value::Array(items) = v else {
        return Err(wrong_type(f, EXPECTED, v));
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let here = format!("{key}[{i}]");
        let Value::Table(t) = item else {
            return Err(wrong_type(&cx.field(&here, line), EXPECTED, item));
        };
        let (mut src, mut dst, mut rw) = (None, None, false);
        for (k, val) in t {
            let kf = &cx.field(&format!("{here}.{}", Shown::new(k).bare()), line);
            match k.as_str() {
                "src" => src = Some(cx.path(kf, string(kf, val, "a string (a host path)")?)?),
                "dst" => {
                    dst = Some(string(
                        kf,
                        val,
                        "a string (an absolute path in the sandbox)",
                    )?)
                }
                "rw" => {
                    let Value::Boolean(b) = val else {
                        return Err(wrong_type(kf, "true or false", val));
                    };
                    rw = *b;
                }
                other => {
                    return Err(PolicyError::UnknownKey {
                        key: Shown::new(other),
                        table: format!("{here} in [{}]", cx.table),
                        line,
                        known: "src, dst, rw",
                    })
                }
            }
        }
        let (Some(src), Some(dst)) = (src, dst) else {
            return Err(PolicyError::Spec {
                table: cx.table.clone(),
                reason: format!(
                    "{here}{} needs both src and dst",
                    line.map(|n| format!(" (line {n})")).unwrap_or_default()
                ),
            });
        };
        out.push(MountSpec::new(&cx.field(&here, line), src, dst, rw)?);
    }
    check_unique_dsts(f, &out)?;
    Ok(out)
}

fn warm(f: &str, v: &Value, min: u32) -> Result<u32, PolicyError> {
    let Value::Integer(i) = v else {
        return Err(wrong_type(f, "a whole number", v));
    };
    match u32::try_from(*i) {
        Ok(n) if (min..=MAX_WARM).contains(&n) => Ok(n),
        _ => Err(PolicyError::invalid(
            f,
            &i.to_string(),
            format!("is out of range; use {min} to {MAX_WARM}"),
        )),
    }
}

fn check_entry_fits(agent: Agent, entry: &Entry) -> Result<(), String> {
    let ext = entry
        .file
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("");
    match agent {
        Agent::Python if ext == "py" && entry.func.is_some() => Ok(()),
        Agent::Python => Err(format!(
            "a python entry is FILE.py:FUNCTION, got {}",
            Shown::new(&entry.to_string())
        )),
        Agent::Node if ext == "mjs" => Ok(()),
        Agent::Node => Err(format!(
            "a node entry is FILE.mjs or FILE.mjs:HANDLER, got {}",
            Shown::new(&entry.to_string())
        )),
    }
}

impl Entry {
    fn parse(cx: &Ctx<'_>, f: &str, s: &str) -> Result<Entry, PolicyError> {
        let (file, func) = match s.rsplit_once(':') {
            Some((file, func)) => (file, Some(func)),
            None => (s, None),
        };
        let file = cx.path(f, file)?;
        let ext = file.extension().and_then(|e| e.to_str());
        if !matches!(ext, Some("py" | "mjs")) {
            return Err(PolicyError::invalid(
                f,
                s,
                "must name a .py or .mjs file, e.g. \"handlers/resize.py:handler\" or \"index.mjs\"",
            ));
        }
        if let Some(func) = func {
            // JavaScript names may also use `$`.
            let js_ok = ext == Some("mjs") && is_identifier(&func.replace('$', "_"));
            if !(is_identifier(func) || js_ok) {
                return Err(PolicyError::invalid(
                    f,
                    s,
                    "names a handler that is not an identifier",
                ));
            }
        }
        Ok(Entry {
            file,
            func: func.map(str::to_owned),
        })
    }
}

impl AllowRule {
    /// Parse `host:port`: a DNS name, an IPv4 address or block (`10.0.0.0/8`) or `[IPv6]`,
    /// and a port 1–65535. Which of these a sandbox may have is `crate::egress::compile`'s
    /// to say.
    pub fn parse(field: &str, s: &str) -> Result<AllowRule, PolicyError> {
        let bad = |reason: &str| PolicyError::invalid(field, s, reason);
        let Some((host, port)) = s.rsplit_once(':') else {
            return Err(bad("is not host:port, e.g. \"api.example.com:443\""));
        };
        let port = match port.parse::<u16>() {
            Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => p,
            _ => return Err(bad("has a bad port; use 1 to 65535")),
        };
        let host = if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
            v6.parse::<Ipv6Addr>()
                .map_err(|_| bad("has a bad IPv6 address"))?
                .to_string()
        } else if host.contains(':') {
            return Err(bad(
                "has an IPv6 address without brackets; write [2001:db8::1]:443",
            ));
        } else if host.parse::<Ipv4Addr>().is_ok() || is_dns_name(host) || is_v4_block(host) {
            host.to_ascii_lowercase()
        } else {
            return Err(bad("has a bad host; use a DNS name or an IP address"));
        };
        Ok(AllowRule { host, port })
    }
}

/// `a.b.c.d/n` with a prefix of one or two digits (its range is checked by `egress`).
fn is_v4_block(h: &str) -> bool {
    h.split_once('/').is_some_and(|(net, prefix)| {
        net.parse::<Ipv4Addr>().is_ok()
            && (1..=2).contains(&prefix.len())
            && prefix.bytes().all(|b| b.is_ascii_digit())
    })
}

pub(crate) fn is_dns_name(h: &str) -> bool {
    (1..=253).contains(&h.len())
        && h.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::String(_) => "a string",
        Value::Integer(_) => "an integer",
        Value::Float(_) => "a float",
        Value::Boolean(_) => "a boolean",
        Value::Datetime(_) => "a date-time",
        Value::Array(_) => "an array",
        Value::Table(_) => "a table",
    }
}

fn wrong_type(field: &str, expected: &'static str, v: &Value) -> PolicyError {
    PolicyError::WrongType {
        field: field.to_owned(),
        expected,
        found: type_name(v),
    }
}

fn check_len(field: &str, s: &str) -> Result<(), PolicyError> {
    if s.len() > MAX_STRING {
        return Err(PolicyError::TooLarge {
            what: format!("{field} ({} bytes)", s.len()),
            limit: format!("{MAX_STRING} bytes"),
        });
    }
    Ok(())
}

fn string<'v>(field: &str, v: &'v Value, expected: &'static str) -> Result<&'v str, PolicyError> {
    let Value::String(s) = v else {
        return Err(wrong_type(field, expected, v));
    };
    check_len(field, s)?;
    Ok(s)
}

fn strings<'v>(
    field: &str,
    v: &'v Value,
    expected: &'static str,
) -> Result<Vec<&'v str>, PolicyError> {
    let Value::Array(items) = v else {
        return Err(wrong_type(field, expected, v));
    };
    items
        .iter()
        .map(|item| string(field, item, expected))
        .collect()
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        match &self.func {
            Some(func) => write!(f, ":{func}"),
            None => Ok(()),
        }
    }
}

impl fmt::Display for AllowRule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for Agent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Agent::Python => "python",
            Agent::Node => "node",
        })
    }
}

#[cfg(test)]
mod doc_tests {
    /// docs/sandbox-toml.md names every key a `[fn.NAME]` table takes, each in a row of
    /// its own, and no key the parser does not take.
    #[test]
    fn the_reference_page_names_every_key() {
        let page = include_str!("../../../docs/sandbox-toml.md");
        let documented: Vec<&str> = page
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .collect();
        let known: Vec<&str> = super::KNOWN_KEYS.split(", ").map(str::trim).collect();
        for k in &known {
            assert!(
                documented.contains(k),
                "docs/sandbox-toml.md has no row for `{k}`"
            );
        }
        for d in &documented {
            assert!(
                known.contains(d),
                "docs/sandbox-toml.md documents `{d}`, which the parser does not take"
            );
        }
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::Bytes;

    #[test]
    fn the_api_table_is_read_strictly() {
        let p = Path::new("/app/sandbox.toml");
        let f = parse_sandbox_toml(
            "[api]\nlisten = \"unix:///run/a.sock\"\nauth = \"none\"\n",
            p,
        )
        .unwrap();
        assert_eq!(f.api.listen.as_deref(), Some("unix:///run/a.sock"));
        assert!(f.api.no_auth);
        let f = parse_sandbox_toml("[api]\nauth = \"token\"\n", p).unwrap();
        assert_eq!(f.api, ApiSettings::default());
        assert_eq!(
            parse_sandbox_toml("", p).unwrap().api,
            ApiSettings::default()
        );
        for (bad, says) in [
            ("[api]\nauth = \"off\"\n", "[api] auth"),
            ("[api]\nport = 1\n", "port"),
            ("[api]\nlisten = 7700\n", "[api] listen"),
            ("api = 1\n", "[api]"),
        ] {
            let e = parse_sandbox_toml(bad, p).unwrap_err().to_string();
            assert!(e.contains(says), "{bad:?}: {e}");
        }
    }

    const EXAMPLE: &str = r#"
[defaults]                 # every [fn.NAME] is merged over this
image = "host"
mem = "256M"
cpu = 1.0
pids = 64
timeout = "30s"
scratch = "64M"
network = "none"
allow = []
idle_timeout = "5m"
min_warm = 1
max_warm = 4

[fn.resize]
agent = "python"
entry = "handlers/resize.py:handler"
requirements = "requirements.txt"
mounts = [{ src = "models", dst = "/models" }]
secrets = ["STRIPE_KEY"]
env = { LOG_LEVEL = "info" }
"#;

    fn parse(text: &str) -> Result<SandboxFile, PolicyError> {
        parse_sandbox_toml(text, Path::new("/srv/app/sandbox.toml"))
    }

    /// The error message without the file's path in front.
    fn err(text: &str) -> String {
        parse(text).unwrap_err().innermost().to_string()
    }

    const PY: &str = "agent = \"python\"\n";

    #[test]
    fn the_spec_example() {
        let file = parse(EXAMPLE).unwrap();
        assert_eq!(file.base_dir, PathBuf::from("/srv/app"));
        let f = &file.functions["resize"];
        assert_eq!(
            f.kind,
            FnKind::Agent {
                agent: Agent::Python,
                entry: Some(Entry {
                    file: "/srv/app/handlers/resize.py".into(),
                    func: Some("handler".into()),
                }),
            }
        );
        assert_eq!(f.limits, ResolvedLimits::DEFAULT);
        assert_eq!(
            f.requirements,
            Some(PathBuf::from("/srv/app/requirements.txt"))
        );
        assert_eq!(
            f.mounts,
            [MountSpec {
                src: "/srv/app/models".into(),
                dst: "/models".into(),
                rw: false
            }]
        );
        assert_eq!(f.secrets, ["STRIPE_KEY"]);
        assert!(f.env.contains(&("LOG_LEVEL".into(), "info".into())));
        assert!(f.env.contains(&("HOME".into(), "/work".into())));
        assert_eq!((f.min_warm, f.max_warm), (1, 4));
        assert_eq!(f.idle_timeout, Duration::from_secs(300));
        assert_eq!(file.defaults.limits.pids, Some(64));
    }

    #[test]
    fn fn_values_override_defaults() {
        let file = parse(
            r#"
[defaults]
mem = "1G"
cpu = 2
timeout = "1m"
env = { A = "1" }
network = "egress"
allow = ["api.example.com:443"]

[fn.a]
cmd = ["/bin/cat", "-"]
mem = "unlimited"
cpu = "0.5"
env = { B = "2" }

[fn.b]
agent = "node"
entry = "index.mjs"
network = "host"
allow = []
"#,
        )
        .unwrap();
        let a = &file.functions["a"];
        assert_eq!(a.kind, FnKind::Cmd(vec!["/bin/cat".into(), "-".into()]));
        assert_eq!(a.limits.mem, Mem::Unlimited);
        assert_eq!(a.limits.cpu.millis(), 500);
        assert_eq!(a.limits.timeout, Duration::from_secs(60));
        assert_eq!(a.limits.pids, 64);
        assert!(a.env.contains(&("B".into(), "2".into())));
        assert!(!a.env.iter().any(|(k, _)| k == "A"));
        assert_eq!(
            a.allow,
            [AllowRule {
                host: "api.example.com".into(),
                port: 443
            }]
        );
        let b = &file.functions["b"];
        assert_eq!(b.network, Network::Host);
        assert_eq!(b.limits.mem, Mem::Limited(Bytes(1 << 30)));
        assert!(
            matches!(&b.kind, FnKind::Agent { agent: Agent::Node, entry: Some(e) } if e.func.is_none())
        );
    }

    #[test]
    fn runtime_pool_and_empty_file() {
        let file = parse("[fn.py]\nagent = \"python\"\n").unwrap();
        assert_eq!(
            file.functions["py"].kind,
            FnKind::Agent {
                agent: Agent::Python,
                entry: None
            }
        );
        assert!(parse("").unwrap().functions.is_empty());
        // Implicit tables and dotted keys are plain TOML and work.
        let file = parse("[fn.x.env]\nA = \"1\"\n[defaults]\nagent = \"python\"\n").unwrap();
        assert!(file.functions["x"].env.contains(&("A".into(), "1".into())));
        assert!(parse("fn.y.agent = \"node\"\nfn.y.env.A = \"1\"\n").is_ok());
    }

    #[test]
    fn unknown_keys_name_key_table_and_line() {
        let e =
            parse("[defaults]\nmem = \"1G\"\n\n[fn.a]\nagent = \"python\"\ncolour = \"blue\"\n")
                .unwrap_err();
        assert_eq!(
            e.innermost(),
            &PolicyError::UnknownKey {
                key: Shown::new("colour"),
                table: "[fn.a]".into(),
                line: Some(6),
                known: KNOWN_KEYS,
            }
        );
        let msg = e.to_string();
        assert!(
            msg.starts_with("/srv/app/sandbox.toml: unknown key \"colour\" in [fn.a] (line 6)"),
            "{msg}"
        );

        let msg = err("[defaults]\nmem = \"1G\"\n\n[default]\nmem = \"1G\"\n");
        assert!(
            msg.contains("unknown key \"default\" in the top level (line 4)"),
            "{msg}"
        );
        let msg = err("title = \"x\"\n");
        assert!(
            msg.contains("unknown key \"title\" in the top level (line 1)"),
            "{msg}"
        );
        let msg = err("[fn.a]\nagent = \"python\"\nmounts = [{ src = \"/a\", dst = \"/b\", mode = \"rw\" }]\n");
        assert!(
            msg.contains("unknown key \"mode\" in mounts[0] in [fn.a] (line 3)"),
            "{msg}"
        );
        // Two bad top-level keys: no line that could belong to the other one.
        let msg = err("a = 1\nb = 2\n");
        assert!(
            msg.starts_with("unknown key \"a\" in the top level;"),
            "{msg}"
        );
    }

    #[test]
    fn wrong_types_name_key_table_and_line() {
        for (text, want) in [
            (
                "[fn.a]\nagent = 1\n",
                "agent in [fn.a] (line 2) must be a string: \"python\" or \"node\", not an integer",
            ),
            (
                "[defaults]\nmem = 256\n",
                "mem in [defaults] (line 2) must be a string such as \"256M\", not an integer",
            ),
            (
                "[defaults]\ncpu = true\n",
                "cpu in [defaults] (line 2) must be a number",
            ),
            (
                "[defaults]\npids = \"64\"\n",
                "pids in [defaults] (line 2) must be a whole number such as 64, not a string",
            ),
            (
                "[defaults]\ntimeout = 30\n",
                "timeout in [defaults] (line 2) must be a string such as \"30s\"",
            ),
            (
                "[defaults]\nallow = \"a:1\"\n",
                "allow in [defaults] (line 2) must be an array",
            ),
            (
                "[defaults]\nallow = [1]\n",
                "allow in [defaults] (line 2) must be an array",
            ),
            (
                "[defaults]\nenv = [\"A=1\"]\n",
                "env in [defaults] (line 2) must be a table",
            ),
            (
                "[defaults]\nenv = { A = 1 }\n",
                "env.A in [defaults] (line 2) must be a string, not an integer",
            ),
            (
                "[defaults]\nmounts = \"/a:/b\"\n",
                "mounts in [defaults] (line 2) must be an array of tables",
            ),
            (
                "[defaults]\nmounts = [\"/a:/b\"]\n",
                "mounts[0] in [defaults] (line 2) must be an array of tables",
            ),
            (
                "[defaults]\nmounts = [{ src = \"/a\", dst = \"/b\", rw = \"yes\" }]\n",
                "mounts[0].rw in [defaults] (line 2) must be true or false, not a string",
            ),
            (
                "[defaults]\nmin_warm = 1.5\n",
                "min_warm in [defaults] (line 2) must be a whole number, not a float",
            ),
            ("[defaults]\nimage = 1979-05-27\n", "not a date-time"),
            ("[defaults]\nnetwork = { mode = \"none\" }\n", "not a table"),
            (
                "defaults = 3\n",
                "[defaults] (line 1) must be a table, not an integer",
            ),
            (
                "fn = \"x\"\n",
                "fn (line 1) must be a table of [fn.NAME] tables, not a string",
            ),
            (
                "[fn]\na = 3\n",
                "[fn.a] (line 2) must be a table, not an integer",
            ),
        ] {
            let msg = err(text);
            assert!(
                msg.contains(want),
                "{text:?}\n  got:  {msg}\n  want: {want}"
            );
        }
    }

    #[test]
    fn bad_values_name_key_table_and_line() {
        for (text, want) in [
            ("[defaults]\nmem = \"12X\"\n", "mem in [defaults] (line 2): \"12X\" has an unknown unit"),
            ("[defaults]\nmem = \"-1M\"\n", "must not be negative"),
            ("[defaults]\nmem = \"1.5.5G\"\n", "is not a size"),
            ("[defaults]\nmem = \"0\"\n", "greater than zero"),
            ("[defaults]\nscratch = \"99999999999T\"\n", "scratch in [defaults] (line 2): \"99999999999T\" is too large"),
            ("[defaults]\ntimeout = \"25h\"\n", "timeout in [defaults] (line 2): \"25h\" is longer than the maximum of 24h"),
            ("[defaults]\nidle_timeout = \"0s\"\n", "greater than zero"),
            ("[defaults]\ncpu = 0.001\n", "cpu in [defaults] (line 2): \"0.001\" is out of range"),
            ("[defaults]\ncpu = nan\n", "\"NaN\" is not a number"),
            ("[defaults]\ncpu = -inf\n", "must not be negative"),
            ("[defaults]\ncpu = 1e300\n", "too many digits"),
            ("[defaults]\npids = 0\n", "pids in [defaults] (line 2): \"0\" must be a whole number from 1 to 65536"),
            ("[defaults]\npids = 9223372036854775807\n", "from 1 to 65536"),
            ("[defaults]\nio_bps = \"512K\"\n", "io_bps in [defaults] (line 2): \"512K\" is below the least allowed"),
            ("[defaults]\nio_bps = 64\n", "io_bps in [defaults] (line 2)"),
            ("[defaults]\nio_iops = 5\n", "io_iops in [defaults] (line 2): \"5\" must be a whole number from 10 to 10000000"),
            ("[defaults]\nio_iops = \"100\"\n", "io_iops in [defaults] (line 2)"),
            ("[defaults]\nio_iops = 9223372036854775807\n", "from 10 to 10000000"),
            ("[defaults]\nmax_warm = 0\n", "max_warm in [defaults] (line 2): \"0\" is out of range; use 1 to 1024"),
            ("[defaults]\nmin_warm = -1\n", "is out of range; use 0 to 1024"),
            ("[defaults]\nnetwork = \"wifi\"\n", "is not a network mode"),
            ("[defaults]\nimage = \"ubuntu:22.04\"\n", "is not an image"),
            ("[defaults]\nimage = \"dir:rootfs\"\n", "must be an absolute path"),
            ("[defaults]\nagent = \"ruby\"\n", "is not an agent"),
            ("[defaults]\nentry = \"main.rb:run\"\n", "must name a .py or .mjs file"),
            ("[defaults]\nentry = \"main.py:not-a-name\"\n", "not an identifier"),
            ("[defaults]\nentry = \"../main.py:f\"\n", "must not contain `..`"),
            ("[defaults]\nrequirements = \"\"\n", "is empty"),
            ("[defaults]\ndeps = \"deps_abc\"\n", "is not a dependency set's id"),
            ("[defaults]\ndeps = \"../../etc\"\n", "is not a dependency set's id"),
            ("[defaults]\ndeps = 1\n", "deps in [defaults]"),
            ("[defaults]\ncmd = []\n", "cmd in [defaults] (line 2): \"[]\" is empty"),
            ("[defaults]\ncmd = [\"\"]\n", "names no program"),
            ("[defaults]\ncmd = [\"a\\u0000b\"]\n", "NUL"),
            ("[defaults]\nsecrets = [\"../x\"]\n", "is not a secret name"),
            ("[defaults]\nsecrets = [\"A\", \"A\"]\n", "is listed twice"),
            ("[defaults]\nenv = { \"1A\" = \"x\" }\n", "is not a variable name"),
            ("[defaults]\nenv = { A = \"x\\u0000\" }\n", "NUL"),
            ("[defaults]\nallow = [\"example.com\"]\n", "is not host:port"),
            ("[defaults]\nallow = [\"example.com:0\"]\n", "bad port"),
            ("[defaults]\nallow = [\"example.com:99999\"]\n", "bad port"),
            ("[defaults]\nallow = [\"::1:80\"]\n", "without brackets"),
            ("[defaults]\nallow = [\"-bad-.com:80\"]\n", "bad host"),
            ("[defaults]\nmounts = [{ src = \"m\", dst = \"/proc/x\" }]\n", "mounts[0] in [defaults] (line 2) destination: \"/proc/x\" is reserved"),
            ("[defaults]\nmounts = [{ src = \"m\", dst = \"/\" }]\n", "cannot be /"),
            ("[defaults]\nmounts = [{ src = \"../m\", dst = \"/m\" }]\n", "mounts[0].src in [defaults] (line 2): \"../m\" must not contain `..`"),
            ("[defaults]\nmounts = [{ dst = \"/m\" }]\n", "mounts[0] (line 2) needs both src and dst"),
            ("[defaults]\nmounts = [{ src = \"a\", dst = \"/m\" }, { src = \"b\", dst = \"/m\" }]\n", "mounted twice"),
        ] {
            let msg = err(text);
            assert!(msg.contains(want), "{text:?}\n  got:  {msg}\n  want: {want}");
        }
    }

    #[test]
    fn http_layers_refuse_what_only_the_file_may_ask() {
        let base = Path::new("/srv");
        for text in ["mem = \"unlimited\"", "network = \"host\""] {
            let t: toml::Table = toml::from_str(text).unwrap();
            let e = Layer::from_toml("fn.x", &t, base, Source::Http).unwrap_err();
            assert!(matches!(e, PolicyError::NotAllowed { .. }), "{e}");
            assert!(e.to_string().contains("in [fn.x]: "), "{e}");
            assert!(Layer::from_toml("fn.x", &t, base, Source::File).is_ok());
        }
        let t: toml::Table = toml::from_str("mem = \"128M\"\nbogus = 1").unwrap();
        let e = Layer::from_toml("fn.x", &t, base, Source::Http).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("unknown key \"bogus\" in [fn.x];"),
            "{e}"
        );

        // I/O limits from [defaults], narrowed per function like the others.
        let file = parse(
            "[defaults]\nio_bps = \"32M\"\nio_iops = 800\n\n[fn.a]\nagent = \"python\"\nio_iops = 200\n",
        )
        .unwrap();
        assert_eq!(file.functions["a"].limits.io_bps, Bytes(32 << 20));
        assert_eq!(file.functions["a"].limits.io_iops, 200);

        // An HTTP layer merged over the file's defaults.
        let file = parse("[defaults]\nmem = \"1G\"\nagent = \"python\"\n").unwrap();
        let t: toml::Table = toml::from_str("mem = \"128M\"\nentry = \"h.py:f\"").unwrap();
        let layer = Layer::from_toml("fn.x", &t, Path::new("/up"), Source::Http).unwrap();
        let spec = layer.merge_over(&file.defaults).resolve("x").unwrap();
        assert_eq!(spec.limits.mem, Mem::Limited(Bytes(128 << 20)));
        assert!(
            matches!(&spec.kind, FnKind::Agent { entry: Some(e), .. } if e.file == Path::new("/up/h.py"))
        );
        let e = layer
            .merge_over(&file.defaults)
            .resolve("Bad/Name")
            .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("function name: \"Bad/Name\" is not a valid name"),
            "{e}"
        );
    }

    #[test]
    fn whole_function_rules() {
        for (text, want) in [
            (
                "[fn.a]\nmem = \"1G\"\n",
                "[fn.a]: needs agent = \"python\" or \"node\", or cmd",
            ),
            (
                "[fn.a]\nagent = \"python\"\ncmd = [\"x\"]\n",
                "sets both agent and cmd",
            ),
            (
                "[defaults]\nagent = \"python\"\n[fn.a]\ncmd = [\"x\"]\n",
                "sets both agent and cmd",
            ),
            (
                "[fn.a]\ncmd = [\"x\"]\nentry = \"a.py:f\"\n",
                "a cmd function has none",
            ),
            (
                "[defaults]\nrequirements = \"r.txt\"\n[fn.a]\nagent = \"python\"\ndeps = \"deps_0000000000000000000000000000000000000000000000000000000000000000\"\n",
                "sets both requirements",
            ),
            (
                "[fn.a]\nagent = \"python\"\nentry = \"a.py\"\n",
                "a python entry is FILE.py:FUNCTION",
            ),
            (
                "[fn.a]\nagent = \"python\"\nentry = \"a.mjs\"\n",
                "a python entry is FILE.py:FUNCTION",
            ),
            (
                "[fn.a]\nagent = \"node\"\nentry = \"a.py:f\"\n",
                "a node entry is FILE.mjs",
            ),
            (
                "[fn.a]\n{PY}min_warm = 5\nmax_warm = 2\n",
                "min_warm (5) is above max_warm (2)",
            ),
            (
                "[fn.a]\n{PY}min_warm = 5\n",
                "min_warm (5) is above max_warm (4) (the default)",
            ),
            (
                "[fn.a]\n{PY}allow = [\"a.com:443\"]\n",
                "allow rules need network = \"egress\"",
            ),
        ] {
            let text = text.replace("{PY}", PY);
            let msg = err(&text);
            assert!(
                msg.contains(want),
                "{text:?}\n  got:  {msg}\n  want: {want}"
            );
        }
        let f =
            parse("[fn.a]\nagent = \"node\"\nentry = \"x/i.mjs:$h\"\nmin_warm = 0\nmax_warm = 1\n")
                .unwrap();
        assert_eq!(
            (f.functions["a"].min_warm, f.functions["a"].max_warm),
            (0, 1)
        );
    }

    #[test]
    fn function_names() {
        for good in ["a", "0", "resize", "my-fn_2", &"a".repeat(63)] {
            assert!(parse(&format!("[fn.\"{good}\"]\n{PY}")).is_ok(), "{good}");
        }
        for bad in [
            "A",
            "-a",
            "_a",
            "a.b",
            "a b",
            "",
            "é",
            &"a".repeat(64),
            "a/b",
            "..",
            "a\\u0000",
        ] {
            let msg = err(&format!("[fn.\"{bad}\"]\n{PY}"));
            assert!(
                msg.contains("function name (line 1)") && msg.contains("is not a valid name"),
                "{bad}: {msg}"
            );
        }
    }

    #[test]
    fn hostile_input() {
        // Too big, refused before parsing.
        let big = format!("[defaults]\nmem = \"1G\"\n# {}\n", "x".repeat(2 << 20));
        let msg = err(&big);
        assert!(msg.contains("too large") && msg.contains("1 MiB"), "{msg}");

        // Too many functions.
        let many: String = (0..=MAX_FUNCTIONS)
            .map(|i| format!("[fn.f{i}]\n{PY}"))
            .collect();
        assert!(err(&many).contains("the number of functions (257) is too large"));
        let enough: String = (0..MAX_FUNCTIONS)
            .map(|i| format!("[fn.f{i}]\n{PY}"))
            .collect();
        assert_eq!(parse(&enough).unwrap().functions.len(), MAX_FUNCTIONS);

        // Long strings, and a long unknown key quoted only in part.
        let long = "a".repeat(MAX_STRING + 1);
        assert!(
            err(&format!("[fn.a]\n{PY}cmd = [\"{long}\"]\n")).contains("the limit is 4096 bytes")
        );
        assert!(err(&format!("[defaults]\nenv = {{ A = \"{long}\" }}\n"))
            .contains("the limit is 4096 bytes"));
        assert!(err(&format!("[defaults]\nenv = {{ {long} = \"x\" }}\n"))
            .contains("the limit is 4096 bytes"));
        let msg = err(&format!("[defaults]\n{long} = 1\n"));
        assert!(msg.len() < 400 && msg.contains("(line 2)"), "{msg}");

        // Deep nesting: the TOML parser stops at depth 80 with an error, not a crash.
        // Run on the standard 2 MiB thread stack (debug builds need about 1.75 MiB).
        let deep_array = format!(
            "[defaults]\nx = {}{}\n",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        let deep_inline = format!(
            "[defaults]\nx = {}1{}\n",
            "{a=".repeat(50_000),
            "}".repeat(50_000)
        );
        let deep_header = format!("[fn.a{}]\nx = 1\n", ".b".repeat(100_000));
        let deep_dotted = format!("[fn.a]\nx{} = 1\n", ".b".repeat(100_000));
        let nested = "[fn.a]\nagent = \"python\"\n[fn.a.b.c.d]\nx = 1\n".to_string();
        let handle = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                [deep_array, deep_inline, deep_header, deep_dotted, nested]
                    .iter()
                    .map(|t| parse(t).is_err())
                    .collect::<Vec<_>>()
            })
            .unwrap();
        assert_eq!(handle.join().unwrap(), [true; 5]);
        assert!(err("[fn.a]\nagent = \"python\"\n[fn.a.b.c.d]\nx = 1\n")
            .contains("unknown key \"b\" in [fn.a] (line 3)"));

        // Syntax errors carry a line.
        let msg = err("[defaults]\nmem = \n");
        assert!(msg.starts_with("TOML syntax error (line 2):"), "{msg}");
        assert!(
            err("[defaults]\nmem = \"1G\"\nmem = \"2G\"\n").contains("TOML syntax error (line 3)")
        );
        // Control characters in keys are escaped in messages.
        assert!(err("[defaults]\n\"a\\u001b[31m\" = 1\n").contains("\\u{1b}"));
    }

    #[test]
    fn allow_rules() {
        let r = |s| AllowRule::parse("allow", s).unwrap();
        assert_eq!(
            r("API.Example.com:443"),
            AllowRule {
                host: "api.example.com".into(),
                port: 443
            }
        );
        assert_eq!(r("10.0.0.1:80").to_string(), "10.0.0.1:80");
        assert_eq!(r("[2001:DB8::1]:443").to_string(), "[2001:db8::1]:443");
        assert!(AllowRule::parse("allow", "a.com:+80").is_err());
        assert!(AllowRule::parse("allow", "[zz]:80").is_err());
        assert!(AllowRule::parse("allow", ":80").is_err());
    }

    #[test]
    fn relative_file_path_keeps_paths_relative() {
        let f = parse_sandbox_toml(
            "[fn.a]\nagent = \"python\"\nentry = \"h.py:f\"\n",
            Path::new("sandbox.toml"),
        )
        .unwrap();
        assert_eq!(f.base_dir, PathBuf::new());
        assert!(
            matches!(&f.functions["a"].kind, FnKind::Agent { entry: Some(e), .. } if e.file == Path::new("h.py"))
        );
    }
}
