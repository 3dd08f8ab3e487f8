//! The monitor: the privileged side of Zygo and the only process that decides.
//!
//! It owns the cgroup tree, every sandbox's lifecycle and deadline, and the identity a
//! sandbox runs as. It trusts the `policy` crate's verdicts and nothing it reads from a
//! launcher or a front: every message is checked against what the monitor itself granted.
//! One-shot commands (`zygo run`) embed it; the supervisor runs it as a daemon.

pub mod cgroup;
pub mod client;
pub mod deps;
pub mod etc_cache;
pub mod identity;
pub mod kernel;
pub mod mcp;
pub mod mounts;
pub mod notify;
pub mod oneshot;
pub mod paths;
pub mod shape;
pub mod spawn;
pub mod supervisor;
pub mod tree;
