//! `zygo mcp`: read the ceiling from the flags (or `[defaults]` of a sandbox.toml), prepare
//! the workspace, and hand over to the monitor side ([`zygo_monitor::mcp`]), which starts
//! the confined front (`zygo __mcp-front`, [`zygo_mcp::front_main`]).

use std::ffi::OsString;
use std::path::PathBuf;

use policy::limits::{Dur, Mem};
use policy::plan::OneShotArgs;
use policy::{mcp_ceiling, CeilingError, Layer, McpCeiling};
use zygo_monitor::cgroup::Backend;
use zygo_monitor::mcp::{Ceiling, Options, Workspace};

use crate::flags::{self, text};
use crate::{usage, usage_error};

struct Opts {
    limits: OneShotArgs,
    workspace: Option<PathBuf>,
    allow: Vec<String>,
    file: Option<PathBuf>,
}

fn parse(raw: Vec<OsString>) -> Result<Option<Opts>, String> {
    use lexopt::prelude::*;
    let mut o = Opts {
        limits: OneShotArgs::default(),
        workspace: None,
        allow: Vec::new(),
        file: None,
    };
    let mut p = lexopt::Parser::from_args(raw);
    while let Some(arg) = p.next().map_err(|e| e.to_string())? {
        match arg {
            Long("help") | Short('h') => return Ok(None),
            Long(
                flag @ ("mem" | "cpu" | "pids" | "timeout" | "scratch" | "io-bps" | "io-iops"
                | "net" | "image"),
            ) => {
                let flag = flag.to_string();
                let v = text(p.value().map_err(|e| e.to_string())?, &flag)?;
                flags::set(&mut o.limits, &flag, v)?;
            }
            Long("allow") => o
                .allow
                .push(text(p.value().map_err(|e| e.to_string())?, "allow")?),
            Long("workspace") => {
                if o.workspace.is_some() {
                    return Err("--workspace given twice".into());
                }
                o.workspace = Some(PathBuf::from(p.value().map_err(|e| e.to_string())?));
            }
            Short('f') | Long("file") => {
                if o.file.is_some() {
                    return Err("-f given twice".into());
                }
                o.file = Some(PathBuf::from(p.value().map_err(|e| e.to_string())?));
            }
            other => return Err(other.unexpected().to_string()),
        }
    }
    Ok(Some(o))
}

/// A refusal: one line, exit code 1.
fn refuse(msg: impl std::fmt::Display) -> i32 {
    eprintln!("zygo mcp: {}", crate::output::clean(&msg.to_string()));
    1
}

/// `[defaults]` of the `-f` sandbox.toml, if one was given.
fn file_defaults(file: Option<&PathBuf>) -> Result<Option<Layer>, String> {
    let Some(f) = file else {
        return Ok(None);
    };
    let (_, parsed) = crate::sandbox_file::read(f).map_err(|e| format!("-f {e}"))?;
    Ok(Some(parsed.defaults))
}

/// `zygo mcp`: the monitor side of the MCP server.
pub fn main(raw: Vec<OsString>) -> i32 {
    let opts = match parse(raw) {
        Ok(Some(o)) => o,
        Ok(None) => {
            say_raw!("{}", usage::MCP);
            return 0;
        }
        Err(e) => return usage_error("mcp", e),
    };
    let file = match file_defaults(opts.file.as_ref()) {
        Ok(f) => f,
        Err(e) => return usage_error("mcp", e),
    };
    let McpCeiling { plan, notes } = match mcp_ceiling(&opts.limits, &opts.allow, file.as_ref()) {
        Ok(c) => c,
        Err(CeilingError::Usage(e)) => return usage_error("mcp", e),
        Err(CeilingError::Refused(e)) => return refuse(e),
    };
    for n in notes {
        eprintln!("zygo mcp: {n}");
    }
    let mem_text = match plan.limits.mem {
        Mem::Limited(b) => b.to_string(),
        Mem::Unlimited => "unlimited".into(),
    };
    let timeout_text = Dur(plan.limits.timeout).to_string();
    let (launch, limits) = match zygo_monitor::oneshot::launch_plan(&plan) {
        Ok(x) => x,
        Err(e) => return refuse(e),
    };
    let backend = match Backend::detect() {
        Ok(b) => b,
        Err(e) => return refuse(e),
    };
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return refuse(format!("find the zygo binary: {e}")),
    };
    let workspace = match &opts.workspace {
        Some(dir) => Workspace::given(dir),
        None => Workspace::scratch(&launch.ids),
    };
    let workspace = match workspace {
        Ok(w) => w,
        Err(e) => return refuse(e),
    };
    eprintln!(
        "zygo mcp: workspace {} ({}); run_code limits: mem {mem_text}, cpu {}, pids {}, \
         timeout {timeout_text}, scratch {}; image {}; network none",
        workspace.path.display(),
        if workspace.scratch {
            "scratch, removed when the server exits"
        } else {
            "kept"
        },
        plan.limits.cpu,
        plan.limits.pids,
        plan.limits.scratch,
        plan.image,
    );
    zygo_monitor::mcp::serve(Options {
        ceiling: Ceiling {
            plan: launch,
            limits,
            mem_text,
            timeout_text,
            timeout: plan.limits.timeout,
        },
        workspace,
        exe,
        backend,
    })
}

/// `zygo __mcp-front`: the confined JSON-RPC front, started only by `zygo mcp`.
pub fn front(raw: Vec<OsString>) -> i32 {
    if !raw.is_empty() {
        eprintln!(
            "zygo {}: takes no arguments; it is started by `zygo mcp`",
            plumbing::Role::McpFront.arg()
        );
        return 2;
    }
    zygo_mcp::front_main()
}
