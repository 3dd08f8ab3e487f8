//! `zygo mcp`: its confined front (JSON-RPC on stdio) ⇄ its monitor side.
//!
//! The front can ask for exactly four tools' worth of work, plus cancelling one of its own
//! calls. No message has a field for an image, a mount, a network mode, a limit or a path:
//! the ceiling is the monitor side's, fixed by `zygo mcp`'s own flags. Calls are numbered by
//! the front so several can be in flight; every request gets exactly one reply with its
//! number.

use serde::{Deserialize, Serialize};

use crate::front::{ExecAnswer, FunctionInfo, LogEntry};

/// Cap for frames on the MCP channel: code or an event up to 16 MiB plus the envelope.
pub const MAX_MCP_FRAME: usize = crate::frame::MAX_FRAME;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Language {
    Python,
    Javascript,
    Sh,
}

/// front → monitor side.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum McpRequest {
    /// Run code in a fresh one-shot sandbox; `/work` persists across calls.
    RunCode {
        call: u64,
        language: Language,
        code: String,
        stdin: Option<String>,
    },
    /// The warm functions of the running supervisor.
    ListFunctions { call: u64 },
    /// Call a warm function with a JSON event (text); a runtime pool with the script it
    /// runs for this call (`code`).
    CallFunction {
        call: u64,
        name: String,
        event: String,
        code: Option<String>,
    },
    /// A function's last finished requests (limit 1..=200; the monitor side clamps).
    FunctionLogs { call: u64, name: String, limit: u32 },
    /// Stop one of this front's calls (its sandbox is killed); no reply of its own.
    Cancel { call: u64 },
}

impl McpRequest {
    pub fn call(&self) -> u64 {
        match self {
            McpRequest::RunCode { call, .. }
            | McpRequest::ListFunctions { call }
            | McpRequest::CallFunction { call, .. }
            | McpRequest::FunctionLogs { call, .. }
            | McpRequest::Cancel { call } => *call,
        }
    }
}

/// What a `run_code` sandbox did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunCodeResult {
    pub exit_code: Option<i32>,
    pub timed_out: bool,
    pub oom_killed: bool,
    pub cancelled: bool,
    pub stdout: String,
    pub stdout_truncated: bool,
    pub stderr: String,
    pub stderr_truncated: bool,
    pub wall_us: u64,
    /// Why it failed, in words a model can act on ("ran out of memory (limit 512M)",
    /// "exceeded its 60s time limit", "the sandbox could not start: ..."); None when the
    /// program ran and exited by itself.
    pub error: Option<String>,
}

/// monitor side → front.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum McpReply {
    RunCode {
        call: u64,
        result: RunCodeResult,
    },
    Functions {
        call: u64,
        functions: Vec<FunctionInfo>,
    },
    Called {
        call: u64,
        answer: ExecAnswer,
    },
    Logs {
        call: u64,
        entries: Vec<LogEntry>,
    },
    /// The tool could not do its work; `message` says why in words a model can act on
    /// (e.g. "no supervisor is running").
    ToolError {
        call: u64,
        message: String,
    },
}
