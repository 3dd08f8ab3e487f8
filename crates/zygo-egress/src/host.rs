//! Which destinations are the host's own: a connection the filter makes to one reaches the
//! host itself over its loopback, past a firewall that trusts local traffic, so only a rule
//! naming the address exactly opens one.
//!
//! Three sources, any of which says yes:
//!
//! - all of `127.0.0.0/8`, and `0.0.0.0` (which the kernel connects to the host itself);
//! - the ranges the kernel's `local` routing table delivers to the host, read when the
//!   filter starts ([`LocalRanges::read`]). Besides every interface address, that table
//!   holds a whole range for an address given to `lo` with a prefix (`10.9.0.1/24` on `lo`
//!   makes all of `10.9.0.0/24` the host's own), which no address of an interface names;
//! - at the moment of connecting, an address of one of the host's interfaces: a UDP socket
//!   connected to one (which sends nothing) is given it as its own source address, so
//!   addresses added after the filter started count too.
//!
//! The filter relays IPv4 only (its seccomp table opens no other family), so `::1` and the
//! host's IPv6 addresses never arise.

use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// The most ranges kept; a table with more keeps the first (the probe still answers for
/// interface addresses).
const MAX_RANGES: usize = 4096;

/// The IPv4 ranges of the `local` routing table when the filter started: the host's own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LocalRanges(Vec<(Ipv4Addr, u8)>);

impl LocalRanges {
    /// Read them from the kernel (rtnetlink, a route dump). Done before the filter confines
    /// itself: its seccomp table opens no netlink socket.
    pub fn read() -> std::io::Result<LocalRanges> {
        // SAFETY: plain socket creation.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: the socket was just created by this process.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        // Strict checking makes the kernel dump the `local` table only, not every route (a
        // router's full table, say); a kernel without it dumps them all, and `parse` keeps
        // the local table's.
        let one: libc::c_int = 1;
        // SAFETY: setsockopt with a valid int of the size passed.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_NETLINK,
                NETLINK_GET_STRICT_CHK,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        let req = dump_request();
        // SAFETY: req is valid for its length; the kernel is the default destination.
        let sent = unsafe { libc::send(sock.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
        if sent < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let mut ranges = LocalRanges::default();
        let mut buf = vec![0u8; 32 * 1024];
        loop {
            // SAFETY: buf is valid for its length.
            let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            let n = usize::try_from(n).unwrap_or(0);
            if n == 0 {
                return Err(std::io::Error::other("the route dump ended early"));
            }
            if parse(&buf[..n], &mut ranges)? {
                return Ok(ranges);
            }
        }
    }

    /// Whether `ip` lies in one of the ranges.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        self.0.iter().any(|(net, prefix)| {
            let mask = u32::MAX.checked_shl(32 - u32::from(*prefix)).unwrap_or(0);
            u32::from(ip) & mask == u32::from(*net) & mask
        })
    }

    /// How many ranges there are.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// Whether `ip` is the host's own (see the module's documentation).
pub fn is_host_address(ip: Ipv4Addr, local: &LocalRanges) -> bool {
    ip.is_loopback() || ip.is_unspecified() || local.contains(ip) || is_own_source(ip)
}

/// Whether a UDP socket connected to `ip` (which sends nothing) is given `ip` as its own
/// source address: then `ip` is an address of one of the host's interfaces. No socket: yes
/// (the careful side). No route to it: no (the relay's own connect fails there too).
fn is_own_source(ip: Ipv4Addr) -> bool {
    // SAFETY: plain socket creation.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return true;
    }
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 9u16.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(ip).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            sock.as_raw_fd(),
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return false;
    }
    crate::local_v4(sock.as_raw_fd()).is_none_or(|own| *own.ip() == ip)
}

// rtnetlink's numbers (linux/netlink.h, linux/rtnetlink.h).
const NLMSG_HDRLEN: usize = 16;
const RTMSG_LEN: usize = 12;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const RTM_NEWROUTE: u16 = 24;
const RTM_GETROUTE: u16 = 26;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_DUMP: u16 = 0x300;
const RT_TABLE_LOCAL: u32 = 255;
const RTN_LOCAL: u8 = 2;
const RTA_DST: u16 = 1;
const RTA_TABLE: u16 = 15;
const NETLINK_GET_STRICT_CHK: libc::c_int = 12;

/// A request for the IPv4 routes of the `local` table (of every table, where the kernel
/// does not filter dumps).
fn dump_request() -> Vec<u8> {
    let len = (NLMSG_HDRLEN + RTMSG_LEN) as u32;
    let mut m = Vec::with_capacity(len as usize);
    m.extend_from_slice(&len.to_ne_bytes());
    m.extend_from_slice(&RTM_GETROUTE.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_DUMP).to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // sequence
    m.extend_from_slice(&0u32.to_ne_bytes()); // port: the kernel fills it in
                                              // rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags.
    m.extend_from_slice(&[libc::AF_INET as u8, 0, 0, 0, RT_TABLE_LOCAL as u8, 0, 0, 0]);
    m.extend_from_slice(&0u32.to_ne_bytes());
    m
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

fn align4(n: usize) -> usize {
    n.saturating_add(3) & !3
}

/// Add the `local` table's IPv4 local routes in `b` (one read of the dump) to `out`;
/// whether the dump has ended. A message that does not parse is an error: a partial table
/// would leave ranges out silently.
fn parse(mut b: &[u8], out: &mut LocalRanges) -> std::io::Result<bool> {
    let bad = || std::io::Error::other("the kernel's route dump does not parse");
    while !b.is_empty() {
        let len = u32_at(b, 0).ok_or_else(bad)? as usize;
        let kind = u16_at(b, 4).ok_or_else(bad)?;
        if len < NLMSG_HDRLEN || len > b.len() {
            return Err(bad());
        }
        let msg = &b[NLMSG_HDRLEN..len];
        match kind {
            NLMSG_DONE => return Ok(true),
            NLMSG_ERROR => {
                let errno = u32_at(msg, 0).map_or(0, |e| (e as i32).wrapping_neg());
                return Err(std::io::Error::from_raw_os_error(errno));
            }
            RTM_NEWROUTE => {
                if let Some(range) = local_route(msg) {
                    if out.0.len() < MAX_RANGES && !out.0.contains(&range) {
                        out.0.push(range);
                    }
                }
            }
            _ => {}
        }
        b = b.get(align4(len)..).unwrap_or(&[]);
    }
    Ok(false)
}

/// The range of one route message, if it is an IPv4 route of type `local` in the `local`
/// table.
fn local_route(m: &[u8]) -> Option<(Ipv4Addr, u8)> {
    let (family, dst_len, table, kind) = (*m.first()?, *m.get(1)?, *m.get(4)?, *m.get(7)?);
    if i32::from(family) != libc::AF_INET || kind != RTN_LOCAL || dst_len > 32 {
        return None;
    }
    let mut table = u32::from(table);
    let mut dst = Ipv4Addr::UNSPECIFIED;
    let mut a = m.get(RTMSG_LEN..)?;
    while a.len() >= 4 {
        let len = usize::from(u16_at(a, 0)?);
        let kind = u16_at(a, 2)?;
        if len < 4 || len > a.len() {
            return None;
        }
        let data = &a[4..len];
        match kind {
            RTA_DST => dst = Ipv4Addr::from(<[u8; 4]>::try_from(data).ok()?),
            RTA_TABLE => table = u32_at(data, 0)?,
            _ => {}
        }
        a = a.get(align4(len)..).unwrap_or(&[]);
    }
    (table == RT_TABLE_LOCAL).then_some((dst, dst_len))
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    /// One route message as the kernel writes it.
    fn route(kind: u8, table: u32, dst: [u8; 4], dst_len: u8) -> Vec<u8> {
        let mut m = vec![libc::AF_INET as u8, dst_len, 0, 0, 0, 0, 0xfe, kind];
        m.extend_from_slice(&0u32.to_ne_bytes());
        for (t, data) in [(RTA_TABLE, table.to_ne_bytes()), (RTA_DST, dst)] {
            m.extend_from_slice(&8u16.to_ne_bytes());
            m.extend_from_slice(&t.to_ne_bytes());
            m.extend_from_slice(&data);
        }
        message(RTM_NEWROUTE, &m)
    }

    fn message(kind: u16, body: &[u8]) -> Vec<u8> {
        let mut m = Vec::new();
        m.extend_from_slice(&((NLMSG_HDRLEN + body.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0; 10]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn only_the_local_tables_local_routes_are_kept() {
        let mut dump = route(RTN_LOCAL, RT_TABLE_LOCAL, [10, 9, 0, 0], 24);
        dump.extend(route(RTN_LOCAL, RT_TABLE_LOCAL, [10, 9, 0, 1], 32));
        // A broadcast route, a main-table route, and a local default in another table
        // (transparent proxying): none is the host's own for an ordinary connection.
        dump.extend(route(3, RT_TABLE_LOCAL, [10, 9, 0, 255], 32));
        dump.extend(route(1, 254, [192, 0, 2, 0], 24));
        dump.extend(route(RTN_LOCAL, 100, [0, 0, 0, 0], 0));
        let mut r = LocalRanges::default();
        assert!(!parse(&dump, &mut r).unwrap());
        assert!(parse(&message(NLMSG_DONE, &[0; 4]), &mut r).unwrap());
        assert_eq!(r.len(), 2);
        assert!(r.contains(Ipv4Addr::new(10, 9, 0, 5)));
        assert!(!r.contains(Ipv4Addr::new(10, 9, 1, 5)));
        assert!(!r.contains(Ipv4Addr::new(192, 0, 2, 1)));
        assert!(!r.contains(Ipv4Addr::new(1, 1, 1, 1)));
    }

    #[test]
    fn a_broken_dump_is_an_error_not_a_shorter_table() {
        let mut r = LocalRanges::default();
        let mut m = route(RTN_LOCAL, RT_TABLE_LOCAL, [10, 9, 0, 0], 24);
        m.truncate(m.len() - 2);
        assert!(parse(&m, &mut r).is_err());
        let errno = (-libc::EPERM).to_ne_bytes();
        let e = parse(&message(NLMSG_ERROR, &errno), &mut r).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EPERM));
    }

    #[test]
    fn this_hosts_table_is_read_and_loopback_is_its_own() {
        let local = LocalRanges::read().unwrap();
        assert!(local.contains(Ipv4Addr::new(127, 0, 0, 2)));
        for ip in [
            "127.0.0.1",
            "127.0.0.2",
            "127.1.2.3",
            "127.255.255.254",
            "0.0.0.0",
        ] {
            assert!(is_host_address(ip.parse().unwrap(), &local), "{ip}");
            assert!(
                is_host_address(ip.parse().unwrap(), &LocalRanges::default()),
                "{ip}"
            );
        }
        // Never routed: not this host's (a UDP connect sends nothing).
        assert!(!is_host_address(Ipv4Addr::new(192, 0, 2, 1), &local));
    }
}
