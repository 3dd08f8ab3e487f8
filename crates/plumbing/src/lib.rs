//! Process plumbing every Zygo role shares, written once: what the monitor, the launcher
//! and the fronts need to start one another and to talk over the descriptors they hand
//! each other. `proto` holds the messages; this crate holds the pipes they travel in.
//!
//! Imports nothing of Zygo's but `proto`.

pub mod seccomp;
