//! Process plumbing every Zygo role shares, written once: what the monitor, the launcher
//! and the fronts need to start one another and to talk over the descriptors they hand
//! each other. `proto` holds the messages; this crate holds the pipes they travel in.
//! It also holds what the supervisor shares with its clients that needs no privilege
//! ([`paths`], [`client`], [`conn`], [`kernel`]), so that the monitor's crate keeps only
//! what runs as root.
//!
//! - [`role`]: each internal role's argv name and descriptor layout, and the one spawn
//!   that starts any of them ([`vfork`] underneath, placed by [`cpu`]);
//! - [`hello`]: the first exchange on every front channel, both sides;
//! - [`fds`]: descriptors passed with a message (`SCM_RIGHTS`), both ways, capped;
//! - [`pipes`]: pipes, socket pairs, close-on-exec, `/dev/null`;
//! - [`pump`]: a program's output kept, passed through or drained, its stdin fed, without
//!   blocking on a reader and with `splice` where it can;
//! - [`resolve`]: host paths opened without following a link in any component;
//! - [`signals`], [`random`]: blocking the signals a process reads itself; random names;
//! - [`seccomp`]: the one table type for every seccomp filter Zygo installs;
//! - [`sys`]: pidfds, `open_tree` and `mount_setattr`, each wrapped once;
//! - [`paths`]: where the supervisor keeps its socket and its state; private directories;
//! - [`client`]: the supervisor's client as the CLI and `zygo mcp` use it (connect, hello,
//!   how long to wait for an answer);
//! - [`kernel`]: the running kernel's Landlock ABI, and what stands in for each protection
//!   an older ABI lacks;
//! - [`conn`]: the supervisor's non-blocking framed connection (to a front or a launcher),
//!   and the limits on what fronts can make it hold.
//!
//! Imports nothing of Zygo's but `proto`.

pub mod client;
pub mod conn;
pub mod cpu;
pub mod fds;
pub mod hello;
pub mod kernel;
pub mod paths;
pub mod pipes;
pub mod pump;
pub mod random;
pub mod resolve;
pub mod role;
pub mod seccomp;
pub mod signals;
pub mod sys;
pub mod vfork;

pub use random::random_hex;
pub use role::Role;
