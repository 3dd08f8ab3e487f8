//! How a one-shot sandbox and a zygote differ in the tree the launcher builds: decided
//! here, for both kinds of plan, and sent as fields of the `LaunchPlan` (the launcher
//! derives nothing from the plan's mode). Which uids a zygote's requests run as is the
//! other such decision, made in [`crate::identity`].

/// The per-mode parts of a sandbox's tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// `/proc` mounted `hidepid=invisible`.
    pub hide_pids: bool,
    /// Mode of the sandbox's own `/work` tmpfs.
    pub work_mode: u32,
}

impl Shape {
    /// `zygo run` and MCP `run_code`: one program, whose home `/work` is.
    pub const ONE_SHOT: Shape = Shape {
        hide_pids: false,
        work_mode: 0o755,
    };

    /// A warm function or pool. Each request sees only its own processes (the others have
    /// another uid or another Landlock domain, so ptrace rules hide them), and gets a fresh
    /// `/work` and `/tmp` of its own; the zygote's own `/work` is the agent's, and nothing
    /// may list it.
    pub const ZYGOTE: Shape = Shape {
        hide_pids: true,
        work_mode: 0o311,
    };
}
