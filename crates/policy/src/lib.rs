//! Policy: limit parsing and narrowing, the one-shot sandbox plan, and `sandbox.toml`.
//!
//! **Pure.** No I/O: the crate parses the text it is handed and nothing else. Paths are
//! joined, never looked up (no canonicalize), so what a path means on disk is decided
//! later by the code that opens it.
//!
//! **What it trusts.** Only the [`Source`] its caller names: values tagged
//! `Source::File` come from a sandbox.toml the host's operator wrote, and only those
//! may ask for `mem = "unlimited"` or `network = "host"`.
//!
//! **What it defends against.** Every input string may be hostile: CLI flags, a
//! sandbox.toml, an HTTP layer. Numbers are parsed as exact decimals with checked
//! arithmetic (no `NaN`, no overflow, no silent wrap); sizes and counts are capped
//! (a 1 MiB file, 256 functions, 4096-byte strings; TOML nesting stops at depth 80 in
//! the parser, which needs about 2 MiB of stack in debug builds, far less in release);
//! unknown keys and wrong types are errors, never ignored; paths must be free of `..`
//! and mounts may not cover Zygo's own `/proc`, `/dev`, `/tmp`, `/work` and `/run`.
//! Limits only narrow: [`narrow_to_ceiling`] refuses a request above a ceiling.
//! Errors quote at most 80 characters of the offending value, escaped.

pub mod ceiling;
pub mod deps;
pub mod egress;
mod error;
pub mod file;
pub mod gate;
pub mod limits;
pub mod plan;

pub use ceiling::{mcp_ceiling, CeilingError, McpCeiling};
pub use error::{PolicyError, Shown};
pub use file::{
    check_fn_name, parse_sandbox_toml, Agent, AllowRule, Entry, FnKind, FnSpec, Layer, SandboxFile,
};
pub use limits::{
    narrow_to_ceiling, parse_duration, parse_io_bps, parse_iops, parse_pids, parse_size, Bytes,
    Cpus, Dur, Limits, Mem, ResolvedLimits, Source,
};
pub use plan::{one_shot, parse_env, Image, MountSpec, Network, OneShotArgs, OneShotPlan};
