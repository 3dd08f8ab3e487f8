//! A sandbox's egress filter: the one way out of a sandbox with `network = "egress"`.
//!
//! # How a sandbox's connections reach it
//!
//! A sandbox with egress has its own network namespace with only `lo`, where every IPv4
//! address is local (`local 0.0.0.0/0 dev lo` in the `local` table, added by the sandbox's
//! init while it still has `CAP_NET_ADMIN` over its namespace). Before anything of the
//! program runs, init listens there on each rule's address and port (or on the rule's port
//! for every address, for a block) and hands those listening sockets out to its launcher,
//! which starts this process outside the sandbox with them. Then:
//!
//! - a TCP connection to an address and port a rule names reaches one of those sockets,
//!   and the local address of the accepted connection *is* the address the program asked
//!   for: the filter asks `policy::egress::decide` and, if the rule allows it, connects
//!   there itself, from the host's network namespace, and relays the bytes both ways;
//! - a TCP connection to anything else finds no listener and is refused at once
//!   (`ECONNREFUSED`), inside the sandbox, without a packet leaving it;
//! - UDP (DNS included) goes nowhere: every address is local, nothing listens, and the
//!   sender gets `ECONNREFUSED`; raw and ICMP sockets need privileges the program does not
//!   have; there is no IPv6 route, so IPv6 fails with `ENETUNREACH`;
//! - the sandbox cannot change any of this: its program has no capabilities.
//!
//! No `/dev/net/tun`, user-mode network stack or packet filter is involved, so the same
//! design runs as root and rootless. What the filter refuses (a rule that covers the
//! address only through a wide block while the address is private, say) is refused by a
//! reset right after the connection was accepted, and logged with the sandbox's label.
//!
//! # How the filter confines itself
//!
//! Before it accepts anything it reads which ranges the host's routing delivers to the host
//! itself ([`host`]), drops to the sandbox owner's host ids (when started as root), becomes
//! non-dumpable, sets `no_new_privs`, restricts itself with Landlock (no filesystem access
//! at all; TCP `connect` only to the rules' ports, no `bind`), and installs its own seccomp
//! table ([`confine`]): it can accept on the descriptors it holds, open IPv4 TCP sockets
//! and connect them, move bytes, and run threads. No `open`, no `exec`, no other socket
//! family.
//!
//! # What it holds for the sandbox
//!
//! Its buffers are not in the sandbox's memory cgroup, so they are kept within a share of
//! the sandbox's memory limit by the filter itself ([`budget`]): every socket's buffers are
//! set explicitly, and a connection is relayed only while the sum of what the relays can
//! hold stays within that share.

pub mod budget;
pub mod confine;
pub mod dns;
pub mod guard;
pub mod host;
pub mod sniff;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use plumbing::Role;
use std::collections::HashMap;
use std::sync::Mutex;

use policy::egress::{decide, decide_name, NameRule, Rule};

/// The largest start message the launcher may send.
pub const MAX_START: usize = proto::launch::MAX_EGRESS_START;
/// The most listening sockets one filter serves (one per rule at most).
pub const MAX_LISTENERS: usize = 65;
/// The most addresses remembered for one name (what the resolver gave the sandbox).
const MAX_ADDRS_PER_NAME: usize = 64;
/// How long the filter waits for a connection's first bytes when a name rule needs them.
const SNIFF_WAIT: Duration = Duration::from_secs(5);
/// How long a connection accepted while every place is taken waits for one that was
/// ended to make room (see [`Shared::evict_half_closed`]) to give its buffers back.
const GRANT_WAIT: Duration = Duration::from_secs(5);
/// How long a new connection that finds every place taken, and no relay to end for it,
/// waits (holding up the accepting of others, which would find the same) for a place to
/// be given back or a relay to finish sending: a program that opens its connections and
/// half-closes them quickly may be a step ahead of the relays that see it.
const ROOM_WAIT: Duration = Duration::from_millis(500);
/// How long an upstream answer is reused before the host's DNS servers are asked again, so
/// that a sandbox repeating a query does not repeat it upstream.
const DNS_REUSE: Duration = Duration::from_secs(10);
/// How long the filter waits for the destination to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a relayed connection may sit with nothing moving in a direction before that
/// direction is ended: a connection nobody uses does not hold one of the filter's places
/// ([`budget::Pool::places`]) for ever.
const RELAY_IDLE: Duration = Duration::from_secs(600);
/// Once one direction has ended, how long the other may sit idle.
const HALF_CLOSED_IDLE: Duration = Duration::from_secs(60);
/// The pipe a relay splices through, the most one splice moves, and the buffer of a relay
/// that copies instead: within [`budget::HOLD`].
const PIPE_SIZE: usize = 64 * 1024;
/// The buffer a cleartext HTTP connection's requests are read into; with what it passes on
/// and the head the guard holds back (at most [`sniff::MAX_PEEK`]), within
/// [`budget::HOLD`].
const CHECKED_BUF: usize = 32 * 1024;

/// What the launcher tells the filter at start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Start {
    /// Host ids to switch to when started as root.
    pub ids: Option<(u32, u32)>,
    /// How log lines name the sandbox.
    pub label: String,
    /// The sandbox's memory limit in bytes (`None`: unlimited), of which the filter's
    /// buffers take at most a share ([`budget`]).
    pub mem: Option<u64>,
    pub rules: Vec<Rule>,
    pub names: Vec<NameRule>,
    pub resolvers: Vec<Ipv4Addr>,
}

impl Start {
    /// Read the launcher's start message ([`proto::launch::EgressStart`]) and check every
    /// rule again; the reason for anything else.
    pub fn decode(bytes: &[u8]) -> Result<Start, String> {
        let wire: proto::launch::EgressStart =
            proto::codec::decode(bytes).map_err(|e| e.to_string())?;
        let e = wire.egress;
        if e.rules.len() + e.names.len() > policy::egress::MAX_RULES {
            return Err(format!(
                "{} rules, over the {} a sandbox may have",
                e.rules.len() + e.names.len(),
                policy::egress::MAX_RULES
            ));
        }
        if e.resolvers.len() > 3 {
            return Err(format!("{} resolvers, over 3", e.resolvers.len()));
        }
        let rules = e
            .rules
            .iter()
            .map(|r| {
                Rule::checked(Ipv4Addr::from(r.addr), r.prefix, r.port).ok_or_else(|| {
                    let [a, b, c, d] = r.addr;
                    format!(
                        "the rule {a}.{b}.{c}.{d}/{}:{} is not one",
                        r.prefix, r.port
                    )
                })
            })
            .collect::<Result<_, _>>()?;
        let names = e
            .names
            .iter()
            .map(|n| {
                NameRule::checked(&n.name, n.port, n.private_ok)
                    .ok_or_else(|| format!("the name rule {:?} port {} is not one", n.name, n.port))
            })
            .collect::<Result<_, _>>()?;
        let label = wire
            .label
            .chars()
            .filter(|c| !c.is_control())
            .take(128)
            .collect();
        Ok(Start {
            ids: wire.ids,
            label,
            mem: e.mem_bytes,
            rules,
            names,
            resolvers: e.resolvers.into_iter().map(Ipv4Addr::from).collect(),
        })
    }
}

/// The role's entry point (`zygo __egress-filter`); the exit code.
pub fn main() -> i32 {
    match run() {
        Ok(()) => 0,
        Err(e) => {
            log::error!("egress filter: {e}");
            1
        }
    }
}

fn run() -> Result<(), String> {
    let chan = Role::EgressFilter
        .take_channel()
        .map_err(|e| format!("take the channel: {e}"))?;
    let mut buf = vec![0u8; MAX_START];
    let (n, fds) = plumbing::fds::recv_with_fds(chan.as_raw_fd(), &mut buf, MAX_LISTENERS)
        .map_err(|e| format!("read the start message: {e}"))?;
    let start =
        Start::decode(&buf[..n]).map_err(|e| format!("the launcher's start message: {e}"))?;
    if fds.is_empty() {
        return Err("no listening sockets were handed over".into());
    }
    if fds.len() > MAX_LISTENERS {
        return Err("more listening sockets than rules".into());
    }
    // The TCP listeners are accepted from until they run dry; the DNS socket is read
    // blocking by a thread of its own.
    let (udp, tcp): (Vec<OwnedFd>, Vec<OwnedFd>) =
        fds.into_iter().partition(|fd| is_datagram(fd.as_raw_fd()));
    for fd in &tcp {
        set_nonblocking(fd.as_raw_fd(), true)
            .map_err(|e| format!("make a listener non-blocking: {e}"))?;
        // Connections accepted from it inherit these, from their first packet on.
        set_buffers(fd.as_raw_fd(), budget::INSIDE_BUF)
            .map_err(|e| format!("size a listener's buffers: {e}"))?;
    }
    // The host's own ranges, while a netlink socket may still be opened.
    let local = host::LocalRanges::read().unwrap_or_else(|e| {
        log::warn!(
            "egress[{}]: read the host's local routes: {e}; its own addresses are known by \
             loopback and its interfaces' addresses only",
            start.label
        );
        host::LocalRanges::default()
    });
    confine::drop_ids(start.ids).map_err(|e| format!("drop to the sandbox owner's ids: {e}"))?;
    let ports: Vec<u16> = start
        .rules
        .iter()
        .map(|r| r.port)
        .chain(start.names.iter().map(|n| n.port))
        .collect();
    confine::landlock(&ports).map_err(|e| format!("Landlock: {e}"))?;
    confine::confine().map_err(|e| e.to_string())?;
    // The launcher gives up root only once the filter has: until then it is the one that
    // may signal the filter (its parent-death signal included).
    // SAFETY: a one-byte write from a valid buffer to the channel we hold.
    if unsafe { libc::write(chan.as_raw_fd(), b"c".as_ptr().cast(), 1) } != 1 {
        return Err(format!(
            "tell the launcher it is confined: {}",
            std::io::Error::last_os_error()
        ));
    }
    drop(chan);
    let pool = budget::Pool::new(start.mem);
    log::info!(
        "egress[{}]: buffers for {} connections at once, within {} KiB",
        start.label,
        pool.places(),
        pool.total() / 1024
    );
    let shared = Arc::new(Shared {
        local,
        pool,
        start,
        resolved: Mutex::new(HashMap::new()),
        recent: Mutex::new(HashMap::new()),
        log: Mutex::new(LogBudget {
            window: std::time::Instant::now(),
            used: 0,
            dropped: 0,
        }),
        half_closed: Mutex::new(std::collections::VecDeque::new()),
    });
    for sock in udp {
        let sh = Arc::clone(&shared);
        std::thread::Builder::new()
            .stack_size(256 * 1024)
            .spawn(move || serve_dns(&sh, &sock))
            .map_err(|e| format!("start the resolver: {e}"))?;
    }
    serve(shared, tcp)
}

/// What every thread of the filter shares.
/// What [`Shared::make_room`] found for a new connection.
enum Room {
    /// A place, free now.
    Now(budget::Grant),
    /// A half-closed relay was ended: its place is this connection's once given back.
    Made,
    /// Neither, within the wait.
    None,
}

struct Shared {
    start: Start,
    /// The buffers the sandbox's connections may hold.
    pool: Arc<budget::Pool>,
    /// The host's own ranges when the filter started ([`host`]).
    local: host::LocalRanges,
    /// name → the addresses the resolver gave the sandbox for it.
    resolved: Mutex<HashMap<String, Vec<Ipv4Addr>>>,
    /// name → the last upstream answer and when it came.
    recent: Mutex<HashMap<String, Upstream>>,
    /// What is left of this window's refusal lines.
    log: Mutex<LogBudget>,
    /// Relays whose program side has ended its sending, oldest first: when every place is
    /// taken, the oldest of these is ended to make room (see [`Shared::evict_half_closed`]).
    half_closed: Mutex<std::collections::VecDeque<HalfClosed>>,
}

/// A relay whose program side has finished sending: its two sockets, not kept alive by
/// this list.
struct HalfClosed {
    inside: std::sync::Weak<TcpStream>,
    outside: std::sync::Weak<TcpStream>,
}

/// How many refusals one filter logs per [`LOG_WINDOW`]. Past that they are counted, and
/// the count is logged with the first refusal of a later window: a sandbox that makes
/// refusals in a loop cannot flood the log it shares with the host and other sandboxes.
const LOG_BUDGET: u32 = 20;
const LOG_WINDOW: Duration = Duration::from_secs(10);

struct LogBudget {
    window: std::time::Instant,
    used: u32,
    dropped: u64,
}

impl Shared {
    /// End the oldest relay still running whose program side has finished sending (it is
    /// only waiting for the destination to answer or close), so that a new connection may
    /// take its place. Whether there was one. Without this, connections a program — in a
    /// zygote, an earlier request, perhaps another tenant's — half-closed towards a server
    /// that never answers would hold the filter's places for [`HALF_CLOSED_IDLE`].
    fn evict_half_closed(&self) -> bool {
        let Ok(mut list) = self.half_closed.lock() else {
            return false;
        };
        while let Some(h) = list.pop_front() {
            if let (Some(i), Some(o)) = (h.inside.upgrade(), h.outside.upgrade()) {
                let _ = i.shutdown(std::net::Shutdown::Both);
                let _ = o.shutdown(std::net::Shutdown::Both);
                return true;
            }
        }
        false
    }

    /// A place for a new connection: one free now, or room made by ending a half-closed
    /// relay (the place it gives back is then waited for), looking again for either until
    /// `wait` has passed.
    fn make_room(&self, wait: Duration) -> Room {
        let until = std::time::Instant::now() + wait;
        loop {
            if let Some(g) = self.pool.grant_now() {
                return Room::Now(g);
            }
            if self.evict_half_closed() {
                return Room::Made;
            }
            if std::time::Instant::now() >= until {
                return Room::None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Log one refusal (a warning), within the filter's budget.
    fn refusal(&self, line: std::fmt::Arguments<'_>) {
        let Ok(mut b) = self.log.lock() else { return };
        let now = std::time::Instant::now();
        if now.duration_since(b.window) >= LOG_WINDOW {
            if b.dropped > 0 {
                log::warn!(
                    "egress[{}]: {} more refusals were not logged (at most {LOG_BUDGET} are \
                     logged every {} s)",
                    self.start.label,
                    b.dropped,
                    LOG_WINDOW.as_secs()
                );
            }
            *b = LogBudget {
                window: now,
                used: 0,
                dropped: 0,
            };
        }
        if b.used < LOG_BUDGET {
            b.used += 1;
            log::warn!("{line}");
        } else {
            b.dropped += 1;
        }
    }
}

/// An upstream answer: when it came, and its addresses with their TTLs.
type Upstream = (std::time::Instant, Vec<(Ipv4Addr, u32)>);

fn is_datagram(fd: RawFd) -> bool {
    let mut kind: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: kind and len are valid for getsockopt to fill in.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            (&mut kind as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    r == 0 && kind == libc::SOCK_DGRAM
}

/// Answer the sandbox's DNS queries, one at a time, until the filter ends.
fn serve_dns(sh: &Shared, sock: &OwnedFd) {
    let fd = sock.as_raw_fd();
    let mut buf = [0u8; dns::MAX_MSG];
    loop {
        // SAFETY: sockaddr_in is plain data.
        let mut peer: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        let mut plen = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        // SAFETY: buf, peer and plen are valid for recvfrom to fill in.
        let n = unsafe {
            libc::recvfrom(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut peer as *mut libc::sockaddr_in).cast(),
                &mut plen,
            )
        };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let msg = &buf[..n as usize];
        let Some(q) = dns::parse_query(msg) else {
            continue; // not a query we answer: no answer at all
        };
        let reply = answer_query(sh, msg, &q);
        // SAFETY: reply and peer are valid for their lengths.
        unsafe {
            libc::sendto(
                fd,
                reply.as_ptr().cast(),
                reply.len(),
                0,
                (&peer as *const libc::sockaddr_in).cast(),
                plen,
            )
        };
    }
}

fn answer_query(sh: &Shared, msg: &[u8], q: &dns::Query) -> Vec<u8> {
    let label = &sh.start.label;
    let Some(rule) = policy::egress::answers_for(&sh.start.names, &q.name) else {
        sh.refusal(format_args!(
            "egress[{label}]: refused a DNS query for {}: no allow rule names it",
            policy::Shown::new(&q.name)
        ));
        return dns::answer(msg, q, dns::RCODE_REFUSED, &[]);
    };
    if q.qtype != dns::TYPE_A {
        // AAAA and the rest: the name exists, with no address of that type to give.
        return dns::answer(msg, q, dns::RCODE_OK, &[]);
    }
    let reused = sh.recent.lock().ok().and_then(|m| {
        m.get(&rule.name)
            .filter(|(at, _)| at.elapsed() < DNS_REUSE)
            .map(|(_, a)| a.clone())
    });
    let result = match reused {
        Some(a) => Ok(a),
        None => dns::resolve(&sh.start.resolvers, &rule.name).inspect(|a| {
            if let Ok(mut m) = sh.recent.lock() {
                m.insert(rule.name.clone(), (std::time::Instant::now(), a.clone()));
            }
        }),
    };
    match result {
        Ok(addrs) => {
            let (kept, dropped): (Vec<_>, Vec<_>) = addrs
                .into_iter()
                .partition(|(a, _)| policy::egress::resolved_ok(rule, *a));
            if !dropped.is_empty() {
                log::warn!(
                    "egress[{label}]: {} resolves to private or special addresses, left out: {:?}",
                    rule.name,
                    dropped.iter().map(|(a, _)| a).collect::<Vec<_>>()
                );
            }
            if let Ok(mut map) = sh.resolved.lock() {
                let known = map.entry(rule.name.clone()).or_default();
                for (a, _) in &kept {
                    if !known.contains(a) {
                        if known.len() >= MAX_ADDRS_PER_NAME {
                            known.remove(0);
                        }
                        known.push(*a);
                    }
                }
            }
            let rcode = if kept.is_empty() {
                dns::RCODE_NXDOMAIN
            } else {
                dns::RCODE_OK
            };
            dns::answer(msg, q, rcode, &kept)
        }
        Err(e) => {
            log::warn!("egress[{label}]: resolve {}: {e}", rule.name);
            dns::answer(msg, q, dns::RCODE_SERVFAIL, &[])
        }
    }
}

fn set_nonblocking(fd: RawFd, on: bool) -> std::io::Result<()> {
    // SAFETY: F_GETFL on a descriptor this process holds.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let flags = if on {
        flags | libc::O_NONBLOCK
    } else {
        flags & !libc::O_NONBLOCK
    };
    // SAFETY: F_SETFL with integer flags.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Accept on every listener until the sandbox is gone (the launcher's end kills this
/// process), one thread per connection.
fn serve(start: Arc<Shared>, listeners: Vec<OwnedFd>) -> Result<(), String> {
    let mut polls: Vec<libc::pollfd> = listeners
        .iter()
        .map(|l| libc::pollfd {
            fd: l.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    loop {
        // SAFETY: polls is a valid array of pollfd for its length.
        let n = unsafe { libc::poll(polls.as_mut_ptr(), polls.len() as libc::nfds_t, -1) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(format!("poll: {e}"));
        }
        for p in polls.iter_mut() {
            if p.revents == 0 {
                continue;
            }
            p.revents = 0;
            loop {
                // SAFETY: accept4 on a listening socket this process holds; no address wanted.
                let c = unsafe {
                    libc::accept4(
                        p.fd,
                        std::ptr::null_mut(),
                        std::ptr::null_mut(),
                        libc::SOCK_CLOEXEC,
                    )
                };
                if c < 0 {
                    break; // EAGAIN: nothing more to accept now
                }
                // SAFETY: accept4 just returned this descriptor to us.
                let conn = unsafe { OwnedFd::from_raw_fd(c) };
                // Refused by address alone: answered here, without a thread of its own.
                if let Some(dst) = local_v4(conn.as_raw_fd()) {
                    let names_port = start.start.names.iter().any(|n| n.port == dst.port());
                    if let (Err(why), false) = (decide(&start.start.rules, dst), names_port) {
                        start.refusal(format_args!(
                            "egress[{}]: refused {dst}: {why}",
                            start.start.label
                        ));
                        reset(conn);
                        continue;
                    }
                }
                // A place and its buffers now, or, once a relay was ended to make room,
                // when that relay has given them back (the place is kept for this
                // connection). Only a connection that made room waits, so the threads stay
                // bounded by the places.
                let grant = match start.make_room(ROOM_WAIT) {
                    Room::Now(g) => Ok(g),
                    Room::Made => Err(start.pool.queue()),
                    Room::None => {
                        start.refusal(format_args!(
                            "egress[{}]: refused a connection: all {} places are taken (the \
                             filter keeps the buffers of this sandbox's connections within a \
                             quarter of its memory limit; a larger --mem gives more places)",
                            start.start.label,
                            start.pool.places()
                        ));
                        reset(conn);
                        continue;
                    }
                };
                let st = Arc::clone(&start);
                let spawned = std::thread::Builder::new()
                    .stack_size(256 * 1024)
                    .spawn(move || {
                        let grant = match grant.map_or_else(|t| t.wait(GRANT_WAIT), Some) {
                            Some(g) => g,
                            None => {
                                st.refusal(format_args!(
                                    "egress[{}]: refused a connection: the connection ended \
                                     to make room did not give its place back within {} s",
                                    st.start.label,
                                    GRANT_WAIT.as_secs()
                                ));
                                return reset(conn);
                            }
                        };
                        handle(&st, conn, grant);
                    });
                if let Err(e) = spawned {
                    start.refusal(format_args!(
                        "egress[{}]: refused a connection: start a relay: {e}",
                        start.start.label
                    ));
                }
            }
        }
    }
}

/// The address a connection was made to: the accepted socket's own local address.
fn local_v4(fd: RawFd) -> Option<SocketAddrV4> {
    // SAFETY: sockaddr_in is plain data.
    let mut sa: libc::sockaddr_in = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: sa and len are valid for getsockname to fill in.
    let r = unsafe { libc::getsockname(fd, (&mut sa as *mut libc::sockaddr_in).cast(), &mut len) };
    if r != 0 || i32::from(sa.sin_family) != libc::AF_INET {
        return None;
    }
    Some(SocketAddrV4::new(
        Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)),
        u16::from_be(sa.sin_port),
    ))
}

/// Read ahead, without consuming, until the first bytes say which host the connection is
/// for, or cannot, or [`SNIFF_WAIT`] has passed.
fn peek_host(fd: RawFd) -> sniff::Sniff {
    let deadline = std::time::Instant::now() + SNIFF_WAIT;
    let mut buf = vec![0u8; sniff::MAX_PEEK];
    let mut seen = 0;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return sniff::Sniff::NoHost;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, left.as_millis() as libc::c_int + 1) } <= 0 {
            continue;
        }
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return sniff::Sniff::NoHost; // closed, or an error
        }
        let n = n as usize;
        match sniff::sniff(&buf[..n]) {
            sniff::Sniff::NeedMore if n < buf.len() => {
                if n == seen {
                    // Nothing new yet: wait a little rather than spin on the same bytes.
                    std::thread::sleep(Duration::from_millis(5));
                }
                seen = n;
            }
            sniff::Sniff::NeedMore => return sniff::Sniff::NoHost,
            other => return other,
        }
    }
}

/// Close a connection with a reset, so the program sees it refused rather than ended.
fn reset(conn: OwnedFd) {
    close_with_reset(conn.as_raw_fd());
    drop(conn);
}

/// Set a socket's `SO_RCVBUF` and `SO_SNDBUF` to `size` each (the kernel doubles it, and
/// turns autotuning off for the socket). Set on a listener, they are the sizes of the
/// connections accepted from it.
fn set_buffers(fd: RawFd, size: u64) -> std::io::Result<()> {
    let v = libc::c_int::try_from(size).unwrap_or(libc::c_int::MAX);
    for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
        // SAFETY: setsockopt with a valid int of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&v as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A socket's receive and send buffer sizes as the kernel holds them (twice what was set).
fn buffer_sizes(fd: RawFd) -> std::io::Result<(u64, u64)> {
    let get = |opt: libc::c_int| {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: v and len are valid for getsockopt to fill in.
        let r = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                opt,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(u64::try_from(v).unwrap_or(0))
    };
    Ok((get(libc::SO_RCVBUF)?, get(libc::SO_SNDBUF)?))
}

/// Make the socket's close a reset (`SO_LINGER` 0) rather than an orderly end.
fn close_with_reset(fd: RawFd) {
    let lin = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: setsockopt with a valid linger struct of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&lin as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
}

/// Decide on one accepted connection and relay it. `grant` (its place and buffers) goes
/// back to the pool when this returns, after both sockets are closed.
fn handle(sh: &Arc<Shared>, conn: OwnedFd, mut grant: budget::Grant) {
    let start = &sh.start;
    // Accepted connections have the listener's sizes already; one made before the filter
    // sized its listener is held to them from here on.
    if let Err(e) = set_buffers(conn.as_raw_fd(), budget::INSIDE_BUF) {
        sh.refusal(format_args!(
            "egress[{}]: refused a connection: size its buffers: {e}",
            start.label
        ));
        return reset(conn);
    }
    let mut upstream = ToServer::Plain;
    let Some(dst) = local_v4(conn.as_raw_fd()) else {
        sh.refusal(format_args!(
            "egress[{}]: refused a connection whose destination is not IPv4",
            start.label
        ));
        return reset(conn);
    };
    if let Err(why) = decide(&start.rules, dst) {
        if !start.names.iter().any(|n| n.port == dst.port()) {
            sh.refusal(format_args!(
                "egress[{}]: refused {dst}: {why}",
                start.label
            ));
            return reset(conn);
        }
        // A name rule for this port: the connection must say which host it is for.
        let host = match peek_host(conn.as_raw_fd()) {
            sniff::Sniff::Host(h) => Some(h),
            _ => None,
        };
        match (first_byte(conn.as_raw_fd()), host.as_deref()) {
            // TLS: the ClientHello, then nothing until the server answers as TLS does.
            (Some(0x16), Some(_)) => match tls_record_len(conn.as_raw_fd()) {
                Some(len) => upstream = ToServer::AfterHello(len),
                None => {
                    sh.refusal(format_args!(
                        "egress[{}]: refused {dst}: its ClientHello could not be read again",
                        start.label
                    ));
                    return reset(conn);
                }
            },
            // Cleartext HTTP: every later request on the connection must name the same host.
            (Some(_), Some(h)) => upstream = ToServer::Checked(guard::Requests::new(h)),
            _ => {}
        }
        let resolved = |name: &str| {
            sh.resolved
                .lock()
                .map(|m| m.get(name).is_some_and(|a| a.contains(dst.ip())))
                .unwrap_or(false)
        };
        if let Err(why) = decide_name(&start.names, host.as_deref(), dst, resolved) {
            sh.refusal(format_args!(
                "egress[{}]: refused {dst}: {why}",
                start.label
            ));
            return reset(conn);
        }
    }
    // The host's own addresses (a public address on one of its interfaces, say) are
    // reached over its loopback, past its firewall: only a rule naming the address opens
    // one.
    if host::is_host_address(*dst.ip(), &sh.local)
        && !policy::egress::named_exactly(&start.rules, dst)
    {
        sh.refusal(format_args!(
            "egress[{}]: refused {dst}: an address of this host; only a rule naming it \
             exactly opens it",
            start.label
        ));
        return reset(conn);
    }
    let out = match connect(dst, &mut grant) {
        Ok(s) => s,
        Err(e) => {
            sh.refusal(format_args!("egress[{}]: {dst}: {e}", start.label));
            return reset(conn);
        }
    };
    log::info!("egress[{}]: relaying to {dst}", start.label);
    let inside = TcpStream::from(conn);
    for s in [&inside, &out] {
        let _ = s.set_read_timeout(Some(RELAY_IDLE));
        let _ = s.set_write_timeout(Some(RELAY_IDLE));
    }
    let inside = Arc::new(inside);
    let outside = Arc::new(out);
    let (i2, o2) = (Arc::clone(&inside), Arc::clone(&outside));
    let sh2 = Arc::clone(sh);
    let gate = matches!(upstream, ToServer::AfterHello(_)).then(|| Arc::new(Gate::default()));
    let gate2 = gate.clone();
    let up = std::thread::Builder::new()
        .stack_size(256 * 1024)
        .spawn(move || {
            match (upstream, gate2) {
                (ToServer::Checked(g), _) => copy_checked(&i2, &o2, g, &sh2),
                (ToServer::AfterHello(len), Some(gate)) => copy_after_hello(&i2, &o2, len, &gate),
                _ => copy(&i2, &o2),
            }
            // The program has sent all it will: this relay may make room for a new one.
            if let Ok(mut list) = sh2.half_closed.lock() {
                list.retain(|h| h.inside.strong_count() > 0);
                list.push_back(HalfClosed {
                    inside: Arc::downgrade(&i2),
                    outside: Arc::downgrade(&o2),
                });
            }
        });
    // A connection opened by a ClientHello goes on only once the server has answered it
    // as a TLS server does: a server that read it as a cleartext request it could not read
    // (and might go on reading) is never sent the program's next bytes.
    let answered = gate.as_ref().is_none_or(|g| {
        // Without the thread that sends the hello there is nothing to wait for.
        let tls = up.is_ok() && server_answers_tls(outside.as_raw_fd());
        g.set(tls);
        tls
    });
    if answered {
        copy(&outside, &inside);
    } else {
        sh.refusal(format_args!(
            "egress[{}]: ended the connection to {dst}: the server did not answer its TLS \
             ClientHello as a TLS server does, so nothing more of it is sent there",
            start.label
        ));
        close_with_reset(inside.as_raw_fd());
        let _ = inside.shutdown(std::net::Shutdown::Both);
        let _ = outside.shutdown(std::net::Shutdown::Both);
    }
    match up {
        Ok(t) => {
            let _ = t.join();
        }
        Err(e) => sh.refusal(format_args!(
            "egress[{}]: {dst}: start a relay: {e}",
            start.label
        )),
    }
}

/// How a relay passes the program's bytes on to the server.
enum ToServer {
    /// As they come.
    Plain,
    /// Read as they pass: a cleartext HTTP connection opened by a name rule
    /// ([`copy_checked`]).
    Checked(guard::Requests),
    /// A connection a name rule opened by the server name of its TLS ClientHello: that
    /// first record (this many bytes), then nothing until the server has answered as a TLS
    /// server does ([`copy_after_hello`]).
    AfterHello(usize),
}

/// Whether the server answered a ClientHello as a TLS server: set once by the relay's
/// server side, waited for by the program side.
#[derive(Default)]
struct Gate {
    answer: Mutex<Option<bool>>,
    set: std::sync::Condvar,
}

impl Gate {
    fn set(&self, tls: bool) {
        if let Ok(mut a) = self.answer.lock() {
            *a = Some(tls);
        }
        self.set.notify_all();
    }

    /// The answer, once there is one; `false` if none came within `limit`.
    fn wait(&self, limit: Duration) -> bool {
        let deadline = std::time::Instant::now() + limit;
        let Ok(mut a) = self.answer.lock() else {
            return false;
        };
        loop {
            if let Some(tls) = *a {
                return tls;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            a = match self.set.wait_timeout(a, left) {
                Ok((a, _)) => a,
                Err(_) => return false,
            };
        }
    }
}

/// The length, header included, of the TLS record waiting first on a connection (the
/// ClientHello [`sniff`] read the server name from), without taking it.
fn tls_record_len(fd: RawFd) -> Option<usize> {
    let mut h = [0u8; 5];
    // SAFETY: a five-byte buffer we own.
    let n = unsafe {
        libc::recv(
            fd,
            h.as_mut_ptr().cast(),
            h.len(),
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    (n == 5 && h[0] == 0x16).then(|| 5 + usize::from(u16::from_be_bytes([h[3], h[4]])))
}

/// What a server's first bytes say about whether it answered a ClientHello as a TLS server
/// does: a handshake record whose first message is a ServerHello (a HelloRetryRequest is
/// one too), or an alert. `None`: not enough bytes yet.
fn tls_answer(b: &[u8]) -> Option<bool> {
    match b {
        [] | [0x15] | [0x16] => None,
        [0x15, major, ..] => Some(*major == 3),
        [0x16, major, ..] if *major != 3 => Some(false),
        [0x16, _, _, _, _, kind, ..] => Some(*kind == 2),
        [0x16, ..] => None,
        _ => Some(false),
    }
}

/// Wait (up to [`RELAY_IDLE`]) for the server's first bytes, without taking them, and say
/// whether they answer a ClientHello as a TLS server does ([`tls_answer`]). The server
/// ending the connection, or saying nothing in time: no.
fn server_answers_tls(fd: RawFd) -> bool {
    let deadline = std::time::Instant::now() + RELAY_IDLE;
    let mut buf = [0u8; 6];
    let mut seen = 0;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = libc::c_int::try_from(left.as_millis()).unwrap_or(libc::c_int::MAX);
        // SAFETY: one valid pollfd.
        if unsafe { libc::poll(&mut p, 1, ms) } <= 0 {
            continue;
        }
        // SAFETY: buf is valid for its length.
        let n = unsafe {
            libc::recv(
                fd,
                buf.as_mut_ptr().cast(),
                buf.len(),
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            return false; // ended, or an error
        }
        let n = n as usize;
        match tls_answer(&buf[..n]) {
            Some(tls) => return tls,
            None => {
                if n == seen {
                    // Nothing new yet: wait a little rather than spin on the same bytes.
                    std::thread::sleep(Duration::from_millis(5));
                }
                seen = n;
            }
        }
    }
}

/// Pass the program's ClientHello (`hello` bytes, already read ahead) to the server, wait
/// until the server's answer has been judged ([`Gate`]), then, if it answered as a TLS
/// server does, relay the rest as [`copy`] does. Otherwise the server side ends both
/// sockets, and nothing past the ClientHello was sent.
fn copy_after_hello(from: &TcpStream, to: &TcpStream, hello: usize, gate: &Gate) {
    let mut buf = vec![0u8; hello];
    let mut r = from;
    let mut w = to;
    if r.read_exact(&mut buf).is_err() || w.write_all(&buf).is_err() {
        let _ = to.shutdown(std::net::Shutdown::Write);
        return;
    }
    drop(buf);
    if gate.wait(RELAY_IDLE) {
        copy(from, to);
    }
}

/// The first byte waiting on a connection, without taking it.
fn first_byte(fd: RawFd) -> Option<u8> {
    let mut b = [0u8; 1];
    // SAFETY: a one-byte buffer we own.
    let n = unsafe {
        libc::recv(
            fd,
            b.as_mut_ptr().cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    (n == 1).then_some(b[0])
}

/// Copy the client's requests to the server as [`copy`] does, reading them (`guard`) as
/// they pass: when a request is one the filter may not relay (another host, framing it
/// cannot follow), the connection ends with a reset both ways and the refusal is logged.
fn copy_checked(from: &TcpStream, to: &TcpStream, mut guard: guard::Requests, sh: &Shared) {
    let mut buf = vec![0u8; CHECKED_BUF];
    let mut pass = Vec::with_capacity(buf.len());
    let mut r = from;
    let mut w = to;
    loop {
        match r.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                pass.clear();
                if let Err(why) = guard.feed(&buf[..n], &mut pass) {
                    sh.refusal(format_args!(
                        "egress[{}]: ended a connection: {why}",
                        sh.start.label
                    ));
                    // The close will be a reset; shutting both sockets down ends the
                    // other direction's relay too.
                    close_with_reset(from.as_raw_fd());
                    let _ = from.shutdown(std::net::Shutdown::Both);
                    let _ = to.shutdown(std::net::Shutdown::Both);
                    return;
                }
                if w.write_all(&pass).is_err() {
                    let _ = from.shutdown(std::net::Shutdown::Read);
                    break;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
    // The other direction reads `to`: with this one ended, it may wait less.
    let _ = to.set_read_timeout(Some(HALF_CLOSED_IDLE));
}

/// Copy `from` to `to` until `from` ends, then end `to`'s writing side: through a pipe with
/// `splice`, so the bytes are never copied into this process; with `read`/`write` if a pipe
/// cannot be had.
fn copy(from: &TcpStream, to: &TcpStream) {
    if let Ok((r, w)) = plumbing::pipes::pipe() {
        // The pipe holds at most what one splice moves; its size is set so that the
        // kernel's default cannot make it larger.
        // SAFETY: F_SETPIPE_SZ on a pipe this thread holds.
        unsafe { libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, PIPE_SIZE as libc::c_int) };
        splice_all(from, to, r.as_raw_fd(), w.as_raw_fd());
    } else {
        let mut buf = vec![0u8; PIPE_SIZE];
        let mut r = from;
        let mut w = to;
        loop {
            match r.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    if w.write_all(&buf[..n]).is_err() {
                        let _ = from.shutdown(std::net::Shutdown::Read);
                        break;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Write);
    // The other direction reads `to`: with this one ended, it may wait less.
    let _ = to.set_read_timeout(Some(HALF_CLOSED_IDLE));
}

fn splice_all(from: &TcpStream, to: &TcpStream, pipe_r: RawFd, pipe_w: RawFd) {
    let flags = libc::SPLICE_F_MOVE;
    loop {
        // SAFETY: splice between descriptors this thread holds; no user memory involved.
        let n = unsafe {
            libc::splice(
                from.as_raw_fd(),
                std::ptr::null_mut(),
                pipe_w,
                std::ptr::null_mut(),
                PIPE_SIZE,
                flags,
            )
        };
        if n == 0 {
            return;
        }
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return;
        }
        let mut left = n as usize;
        while left > 0 {
            // SAFETY: as above.
            let m = unsafe {
                libc::splice(
                    pipe_r,
                    std::ptr::null_mut(),
                    to.as_raw_fd(),
                    std::ptr::null_mut(),
                    left,
                    flags,
                )
            };
            if m <= 0 {
                if m < 0
                    && std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted
                {
                    continue;
                }
                let _ = from.shutdown(std::net::Shutdown::Read);
                return;
            }
            left -= m as usize;
        }
    }
}

/// Connect to `dst` from the host's network namespace, within [`CONNECT_TIMEOUT`], with
/// the buffers `grant` gives (set before the connection opens, so that its window never
/// offers more), and settle the grant for what the kernel gave.
fn connect(dst: SocketAddrV4, grant: &mut budget::Grant) -> Result<TcpStream, String> {
    // SAFETY: plain socket creation.
    let fd = unsafe {
        libc::socket(
            libc::AF_INET,
            libc::SOCK_STREAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
            0,
        )
    };
    if fd < 0 {
        return Err(format!(
            "open a socket: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the socket was just created by this process.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    set_buffers(fd, grant.buf()).map_err(|e| format!("size the socket's buffers: {e}"))?;
    if let Ok((rcv, snd)) = buffer_sizes(fd) {
        grant.settle(rcv, snd);
    }
    let sa = libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: dst.port().to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from(*dst.ip()).to_be(),
        },
        sin_zero: [0; 8],
    };
    // SAFETY: sa is a valid sockaddr_in of the size passed.
    let r = unsafe {
        libc::connect(
            fd,
            (&sa as *const libc::sockaddr_in).cast(),
            std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
        )
    };
    if r != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINPROGRESS) {
            return Err(format!("connect: {e}"));
        }
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        let ms = CONNECT_TIMEOUT.as_millis() as libc::c_int;
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, ms) };
        if n == 0 {
            return Err(format!(
                "connect: no answer within {}s",
                CONNECT_TIMEOUT.as_secs()
            ));
        }
        let mut err: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: err and len are valid for getsockopt to fill in.
        unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_ERROR,
                (&mut err as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        if n < 0 || err != 0 {
            return Err(format!(
                "connect: {}",
                std::io::Error::from_raw_os_error(if n < 0 { libc::EIO } else { err })
            ));
        }
    }
    set_nonblocking(fd, false).map_err(|e| format!("make the connection blocking: {e}"))?;
    let one: libc::c_int = 1;
    // SAFETY: setsockopt with a valid int of the size passed.
    unsafe {
        libc::setsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_NODELAY,
            (&one as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    Ok(TcpStream::from(sock))
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use proto::launch::{Egress, EgressName, EgressRule, EgressStart};

    fn wire(rules: Vec<EgressRule>, names: Vec<EgressName>) -> EgressStart {
        EgressStart {
            ids: Some((100000, 100000)),
            label: "sandbox 42\nfake".into(),
            egress: Egress {
                rules,
                names,
                resolvers: vec![[10, 0, 0, 53]],
                mem_bytes: Some(64 << 20),
            },
        }
    }

    fn decode(w: &EgressStart) -> Result<Start, String> {
        Start::decode(&proto::codec::encode(w).unwrap())
    }

    #[test]
    fn the_start_message_is_read_and_every_rule_checked_again() {
        let rule = |addr, prefix, port| EgressRule { addr, prefix, port };
        let name = |name: &str, port| EgressName {
            name: name.into(),
            port,
            private_ok: false,
        };
        let good = wire(
            vec![rule([10, 0, 0, 0], 8, 80)],
            vec![name("pypi.org", 443)],
        );
        let d = decode(&good).unwrap();
        assert_eq!(
            d.rules,
            vec![Rule::checked(Ipv4Addr::new(10, 0, 0, 0), 8, 80).unwrap()]
        );
        assert_eq!(d.names[0].name, "pypi.org");
        assert_eq!(d.resolvers, vec![Ipv4Addr::new(10, 0, 0, 53)]);
        assert_eq!(d.ids, Some((100000, 100000)));
        assert_eq!(d.label, "sandbox 42fake");
        assert_eq!(d.mem, Some(64 << 20));
        let mut unlimited = good.clone();
        unlimited.egress.mem_bytes = None;
        assert_eq!(decode(&unlimited).unwrap().mem, None);
        // Host bits, a port 0, a name not in normal form: refused, naming the rule.
        for bad in [
            wire(vec![rule([10, 0, 0, 1], 8, 80)], vec![]),
            wire(vec![rule([10, 0, 0, 0], 8, 0)], vec![]),
            wire(vec![rule([10, 0, 0, 0], 33, 80)], vec![]),
            wire(vec![], vec![name("PyPI.org", 443)]),
            wire(vec![], vec![name("pypi.org 443 1", 443)]),
        ] {
            let e = decode(&bad).unwrap_err();
            assert!(e.contains("is not one"), "{e}");
        }
        let many = wire(
            (1..=policy::egress::MAX_RULES as u16 + 1)
                .map(|p| rule([1, 1, 1, 1], 32, p))
                .collect(),
            vec![],
        );
        assert!(decode(&many).unwrap_err().contains("rules"));
        let mut resolvers = good.clone();
        resolvers.egress.resolvers = vec![[1, 1, 1, 1]; 4];
        assert!(decode(&resolvers).unwrap_err().contains("resolvers"));
        // Bytes that are not the message, or are more than it.
        assert!(Start::decode(b"zygo-egress 2\nids -\n").is_err());
        let mut trailing = proto::codec::encode(&good).unwrap();
        trailing.push(0);
        assert!(Start::decode(&trailing).is_err());
    }

    #[test]
    fn only_a_tls_servers_answer_to_a_client_hello_opens_the_rest() {
        // A ServerHello (or HelloRetryRequest) record, or an alert.
        assert_eq!(tls_answer(b"\x16\x03\x03\x00\x7a\x02\x00"), Some(true));
        assert_eq!(tls_answer(b"\x15\x03\x03\x00\x02\x02\x28"), Some(true));
        // Not yet enough to tell.
        for partial in [&b""[..], b"\x16", b"\x16\x03\x03\x00", b"\x15"] {
            assert_eq!(tls_answer(partial), None, "{partial:?}");
        }
        // A cleartext answer, the ClientHello echoed back, another record version.
        assert_eq!(tls_answer(b"HTTP/1.1 400 Bad Request\r\n"), Some(false));
        assert_eq!(tls_answer(b"\x16\x03\x01\x02\x00\x01\x00"), Some(false));
        assert_eq!(tls_answer(b"\x16\x02"), Some(false));
        assert_eq!(tls_answer(b"\x17\x03\x03\x00\x10"), Some(false));
    }
}
