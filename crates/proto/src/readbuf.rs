//! Reading from a descriptor straight into a growing buffer.
//!
//! The event loops read pipes and sockets in chunks of up to 64 KiB. A chunk-sized array on
//! the stack is zeroed on every call (and its pages faulted in on the first), although the
//! kernel writes only the bytes it returns; reading into a vector's spare capacity does
//! neither, and the vector keeps its capacity from one read to the next.

use std::io;
use std::os::fd::RawFd;

/// One `read(2)` of up to `max` bytes from `fd`, appended to `buf`, which grows as needed.
/// Returns the count, 0 at end of file. Retries when interrupted; a non-blocking descriptor
/// with nothing to read gives `ErrorKind::WouldBlock`.
pub fn read_append(fd: RawFd, buf: &mut Vec<u8>, max: usize) -> io::Result<usize> {
    buf.reserve(max);
    let spare = buf.spare_capacity_mut();
    let want = spare.len().min(max);
    let at = spare.as_mut_ptr();
    loop {
        // SAFETY: `at` and `want` describe reserved, unused capacity of `buf`, which read(2)
        // may write; nothing else refers to it meanwhile.
        let n = unsafe { libc::read(fd, at.cast(), want) };
        if n >= 0 {
            let n = n as usize;
            // SAFETY: read(2) initialised exactly the first `n` bytes after the old length,
            // and `n <= want`, which fits in the capacity.
            unsafe { buf.set_len(buf.len() + n) };
            return Ok(n);
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::read_append;
    use std::io::Write;
    use std::os::fd::AsRawFd;

    #[test]
    fn appends_what_was_read_and_keeps_what_was_there() {
        let (r, w) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        (&w).write_all(b"hello").expect("write");
        let mut buf = b"> ".to_vec();
        assert_eq!(read_append(r.as_raw_fd(), &mut buf, 64).expect("read"), 5);
        assert_eq!(buf, b"> hello");
        (&w).write_all(b"0123456789").expect("write");
        assert_eq!(read_append(r.as_raw_fd(), &mut buf, 4).expect("read"), 4);
        assert_eq!(buf, b"> hello0123");
        drop(w);
        let mut rest = Vec::new();
        assert_eq!(read_append(r.as_raw_fd(), &mut rest, 64).expect("read"), 6);
        assert_eq!(read_append(r.as_raw_fd(), &mut rest, 64).expect("read"), 0);
        assert_eq!(rest, b"456789");
    }

    #[test]
    fn nothing_to_read_on_a_non_blocking_descriptor_is_would_block() {
        let (r, _w) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        r.set_nonblocking(true).expect("nonblocking");
        let mut buf = Vec::new();
        let e = read_append(r.as_raw_fd(), &mut buf, 64).expect_err("nothing there");
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
        assert!(buf.is_empty());
    }
}
