//! The MCP front: JSON-RPC 2.0 on stdio for agent hosts, confined, able only to ask the
//! monitor for the four requests its role allows.
//!
//! `zygo mcp` is two processes. The one the host starts is the monitor side (in
//! `zygo-monitor`): it holds the ceiling (image, limits, network, workspace) from its own
//! command line and runs the sandboxes. It starts this front as `zygo __mcp-front` with the
//! host's stdin and stdout and one end of a socketpair on fd 3. The front:
//!
//! 1. takes fd 3 and closes every other descriptor above stderr ([`plumbing::role`]);
//! 2. says hello (`Hello { role: Mcp }`) and waits for the welcome. On this private
//!    socketpair the hello is kept, though the monitor side already knows who is at the
//!    other end: it costs one round trip before any input is read, checks that both sides
//!    speak the same front protocol, and keeps every front channel the same shape;
//! 3. confines itself ([`zygo_front::confine`]): no_new_privs and a seccomp allowlist with
//!    no open, no exec, no socket — before it reads one byte of stdin;
//! 4. serves JSON-RPC ([`server`]) until stdin ends, each line parsed by [`proto::json`]
//!    (a key named twice is a parse error), asking the monitor side for work with
//!    [`proto::mcp::McpRequest`], which has no field for an image, a mount, a network, a
//!    limit or a path.

pub mod link;
pub mod server;

/// Shared with `zygo api`'s `/mcp`: one reader, one revision table, one set of tools.
pub use zygo_front::mcp::{jsonrpc, revision, tools};

#[cfg(test)]
mod tests;

use plumbing::hello::HelloError;
use plumbing::Role;

/// Say hello as the role's front and wait for the welcome.
fn hello(chan: &mut std::os::unix::net::UnixStream) -> Result<(), String> {
    match plumbing::hello::say(chan, proto::front::Role::Mcp, Default::default()) {
        Ok(()) => Ok(()),
        Err(HelloError::Refused(reason)) => Err(format!("the sandbox side refused: {reason}")),
        Err(HelloError::Proto(e)) => Err(format!("hello to the sandbox side: {e}")),
    }
}

/// `zygo __mcp-front`: the confined JSON-RPC front. Returns the process's exit code.
pub fn front_main() -> i32 {
    // Only stdin, stdout, stderr and the channel stay open.
    let mut chan = match Role::McpFront.take_channel() {
        Ok(c) => c,
        Err(e) => {
            eprintln!(
                "zygo {}: {e}; this role is started by `zygo mcp`, not by hand",
                Role::McpFront.arg()
            );
            return 2;
        }
    };
    if let Err(e) = hello(&mut chan) {
        eprintln!("zygo mcp: {e}");
        return 1;
    }
    let rx = match chan.try_clone() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("zygo mcp: duplicate the channel: {e}");
            return 1;
        }
    };
    if let Err(e) = zygo_front::confine::confine(zygo_front::confine::FrontRole::Mcp) {
        eprintln!("zygo mcp: {e}; refusing to read input unconfined");
        return 1;
    }
    let link = link::Link::start(chan, rx);
    let server = server::Server::new(Box::new(std::io::stdout()), link, server::Config::default());
    server.serve(std::io::stdin().lock());
    0
}
