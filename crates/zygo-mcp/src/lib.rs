//! The MCP front: JSON-RPC 2.0 on stdio for agent hosts, confined, able only to ask the
//! monitor for the four requests its role allows.
//!
//! `zygo mcp` is two processes. The one the host starts is the monitor side (in
//! `zygo-monitor`): it holds the ceiling (image, limits, network, workspace) from its own
//! command line and runs the sandboxes. It starts this front as `zygo __mcp-front` with the
//! host's stdin and stdout and one end of a socketpair on fd 3. The front:
//!
//! 1. takes fd 3 and closes every other descriptor above stderr;
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

pub mod jsonrpc;
pub mod link;
pub mod revision;
pub mod server;
pub mod tools;

#[cfg(test)]
mod tests;

use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;

use proto::front::{Hello, HelloReply, Role, FRONT_PROTOCOL, MAX_FRONT_FRAME};
use proto::{read_frame, write_frame};

/// The descriptor the monitor side hands the front its channel on.
pub const CHANNEL_FD: RawFd = 3;

/// Take fd 3 as the channel, if it is an open socket.
fn channel() -> Result<UnixStream, String> {
    // SAFETY: fstat on a descriptor number with a valid out-pointer.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::fstat(CHANNEL_FD, &mut st) } != 0 {
        return Err(format!(
            "fd {CHANNEL_FD} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(format!("fd {CHANNEL_FD} is not a socket"));
    }
    // SAFETY: setting close-on-exec on the descriptor checked above.
    unsafe { libc::fcntl(CHANNEL_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: fd 3 is an open socket handed to this process for exactly this use; nothing
    // else in the process owns it.
    Ok(unsafe { UnixStream::from_raw_fd(CHANNEL_FD) })
}

/// Close every descriptor above the channel: the front keeps stdin, stdout, stderr and its
/// channel, nothing else.
fn close_other_fds() {
    // SAFETY: close_range with plain integers; closes only descriptors we do not use.
    let r = unsafe { libc::syscall(libc::SYS_close_range, CHANNEL_FD + 1, u32::MAX, 0) };
    if r != 0 {
        log::warn!(
            "close_range: {}; other descriptors stay open",
            std::io::Error::last_os_error()
        );
    }
}

fn hello(chan: &mut UnixStream) -> Result<(), String> {
    write_frame(
        chan,
        &Hello {
            protocol: FRONT_PROTOCOL,
            role: Role::Mcp,
            flags: Default::default(),
        },
    )
    .map_err(|e| format!("say hello to the sandbox side: {e}"))?;
    match read_frame::<_, HelloReply>(chan, MAX_FRONT_FRAME) {
        Ok(HelloReply::Welcome { .. }) => Ok(()),
        Ok(HelloReply::Refused { reason }) => Err(format!("the sandbox side refused: {reason}")),
        Err(e) => Err(format!("read the sandbox side's welcome: {e}")),
    }
}

/// `zygo __mcp-front`: the confined JSON-RPC front. Returns the process's exit code.
pub fn front_main() -> i32 {
    let mut chan = match channel() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("zygo __mcp-front: {e}; this role is started by `zygo mcp`, not by hand");
            return 2;
        }
    };
    close_other_fds();
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
