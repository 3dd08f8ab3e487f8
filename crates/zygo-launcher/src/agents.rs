//! The agents a zygote runs, carried in the binary (their sources are `agents/` beside
//! this crate's `src/`); the plan names which are written into the sandbox.

use proto::launch::AgentFile;

/// The file's contents.
pub fn contents(f: AgentFile) -> &'static [u8] {
    match f {
        AgentFile::PythonAgent => include_bytes!("../agents/python_agent.py"),
        AgentFile::PythonBoot => include_bytes!("../agents/python_boot.py"),
        AgentFile::NodeSpare => include_bytes!("../agents/node_agent.mjs"),
    }
}
