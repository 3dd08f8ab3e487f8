//! Descriptors passed along with a message (`SCM_RIGHTS`), both ways, for the channels whose
//! messages carry files: the monitor hands the launcher a sandbox's cgroup files and mount
//! trees, the launcher hands the sandbox's init its cgroup files, init hands back
//! `/run/script`, a zygote's children register with their channels.
//!
//! Receiving is capped: each call names the most descriptors it accepts, and more than
//! that, a control message the kernel had to cut, or a message longer than the buffer is
//! an error (every descriptor that did arrive is closed).

use std::io;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};

/// One `sendmsg` of `data` with `fds` attached; the bytes sent. On a datagram or seqpacket
/// socket a message goes whole or not at all; on a stream socket the descriptors go with
/// the first byte and the caller writes whatever a short send left.
pub fn send_with_fds(fd: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let fd_bytes = std::mem::size_of_val(fds) as u32;
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: CMSG_SPACE of a small size.
    let space = unsafe { libc::CMSG_SPACE(fd_bytes) } as usize;
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain old data; zeroed is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = space;
        // SAFETY: filling in the one control message the buffer was sized for.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(fd_bytes) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c).cast::<RawFd>(),
                fds.len(),
            );
        }
    }
    loop {
        // SAFETY: msg points at buffers that live for the call.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

/// What one [`recv`] took.
#[derive(Debug)]
pub struct Received {
    /// Bytes read into the buffer (0: the peer closed a stream, or sent an empty datagram).
    pub len: usize,
    /// The descriptors that came with them, close-on-exec, owned here.
    pub fds: Vec<OwnedFd>,
    /// The sender's pid as the kernel vouches for it (`SCM_CREDENTIALS`), when the socket
    /// has `SO_PASSCRED` set.
    pub sender: Option<libc::pid_t>,
    /// The sender's (uid, gid), from the same credentials.
    pub sender_ids: Option<(libc::uid_t, libc::gid_t)>,
}

/// One `recvmsg` into `buf` with `flags` (`MSG_CMSG_CLOEXEC` is always added), collecting
/// at most `max_fds` descriptors passed with the bytes and the sender's credentials if the
/// kernel attached them. More descriptors than `max_fds`, a truncated control message or a
/// message longer than `buf` is an error (the descriptors that came are closed).
pub fn recv(fd: RawFd, buf: &mut [u8], max_fds: usize, flags: libc::c_int) -> io::Result<Received> {
    // Room for credentials and more descriptors than anyone may send, so that an excess is
    // seen, not cut.
    let mut control = [0u64; 64];
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: msghdr is plain old data; zeroed is a valid starting value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control);
    let len = loop {
        // SAFETY: msg points at buffers that live for the call.
        let n = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n as usize;
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    };
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut sender = None;
    let mut sender_ids = None;
    // SAFETY: walking the control messages the kernel filled in, within msg_controllen;
    // each descriptor in an SCM_RIGHTS message is new in this process and owned here.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            let h = &*c;
            if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_RIGHTS {
                let len = h.cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                let base: *const RawFd = libc::CMSG_DATA(c).cast();
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(base.add(i))));
                }
            } else if h.cmsg_level == libc::SOL_SOCKET && h.cmsg_type == libc::SCM_CREDENTIALS {
                let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                sender = Some(cred.pid);
                sender_ids = Some((cred.uid, cred.gid));
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "more descriptors than the control buffer holds",
        ));
    }
    if msg.msg_flags & libc::MSG_TRUNC != 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message longer than the buffer",
        ));
    }
    if fds.len() > max_fds {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} descriptors (at most {max_fds} expected)", fds.len()),
        ));
    }
    Ok(Received {
        len,
        fds,
        sender,
        sender_ids,
    })
}

/// One blocking [`recv`] without credentials: the bytes read and the descriptors.
pub fn recv_with_fds(
    fd: RawFd,
    buf: &mut [u8],
    max_fds: usize,
) -> io::Result<(usize, Vec<OwnedFd>)> {
    recv(fd, buf, max_fds, 0).map(|r| (r.len, r.fds))
}

/// Read exactly `buf.len()` bytes from a stream socket, collecting at most `max_fds`
/// descriptors passed with them (see [`recv`]).
pub fn recv_exact_with_fds(fd: RawFd, buf: &mut [u8], max_fds: usize) -> io::Result<Vec<OwnedFd>> {
    let mut fds: Vec<OwnedFd> = Vec::new();
    let mut got = 0;
    while got < buf.len() {
        let (n, more) = recv_with_fds(fd, &mut buf[got..], max_fds - fds.len())?;
        fds.extend(more);
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the channel closed",
            ));
        }
        got += n;
    }
    Ok(fds)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipes::{pipe, socketpair};
    use std::os::fd::AsRawFd;

    #[test]
    fn descriptors_go_both_ways_and_an_excess_is_refused() {
        let (a, b) = socketpair(libc::SOCK_SEQPACKET).expect("socketpair");
        let (r, w) = pipe().expect("pipe");
        let sent = send_with_fds(a.as_raw_fd(), b"x", &[r.as_raw_fd(), w.as_raw_fd()]);
        assert_eq!(sent.expect("send"), 1);
        let mut buf = [0u8; 4];
        let (n, fds) = recv_with_fds(b.as_raw_fd(), &mut buf, 2).expect("recv");
        assert_eq!((n, fds.len()), (1, 2));

        send_with_fds(a.as_raw_fd(), b"y", &[r.as_raw_fd(), w.as_raw_fd()]).expect("send");
        let e = recv_with_fds(b.as_raw_fd(), &mut buf, 1).expect_err("two past a cap of one");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn a_message_longer_than_the_buffer_is_an_error() {
        let (a, b) = socketpair(libc::SOCK_SEQPACKET).expect("socketpair");
        send_with_fds(a.as_raw_fd(), b"too long", &[]).expect("send");
        let mut buf = [0u8; 3];
        let e = recv_with_fds(b.as_raw_fd(), &mut buf, 0).expect_err("truncated");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }
}
