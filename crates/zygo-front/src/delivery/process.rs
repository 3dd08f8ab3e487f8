//! `zygo-delivery`: the process `zygo api` forks (before it confines itself) to deliver
//! usage events and OTLP metrics. See the module above for what it does; here is how.

use std::collections::VecDeque;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use plumbing::allow;
use plumbing::seccomp::{self as bpf, Allowed, Table, When};

use super::otlp::Numbers;
use super::post::post_json;
use super::{Endpoint, BATCH, MAX_BACKOFF, MAX_LINE, MAX_QUEUE, OTLP_EVERY};
use crate::confine::{self, FrontRole};

/// How long, once the front is gone, the webhook still gets to take what is queued.
const LAST_FLUSH: Duration = Duration::from_secs(10);

/// ioctl's request number for FIONBIO (its C type differs between architectures).
#[allow(clippy::unnecessary_cast)]
const FIONBIO_REQUEST: u64 = libc::FIONBIO as u64;

/// The delivery process's seccomp table: the MCP front's (its own descriptors, memory,
/// threads, time) plus making TCP connections (the Landlock domain limits them to the
/// endpoints' ports where the kernel has it).
#[rustfmt::skip]
pub fn allowlist(pid: u32) -> Vec<Allowed> {
    use libc::*;
    let mut v = confine::allowlist(FrontRole::Mcp, pid);
    v.extend([
        allow!(SYS_socket, When::OneOf { arg: 0, values: &[AF_INET as u32, AF_INET6 as u32] },
               "a TCP socket for each delivery (IPv4 or IPv6; never a unix or raw socket)"),
        allow!(SYS_connect, "connecting to the webhook or the OTLP endpoint"),
        allow!(SYS_getsockopt, When::Equals { arg: 1, value: SOL_SOCKET as u64 },
               "SO_ERROR, how a connect with a timeout learns it finished"),
        allow!(SYS_setsockopt, When::Equals { arg: 1, value: SOL_SOCKET as u64 },
               "read and write timeouts on a delivery's connection"),
        allow!(SYS_ioctl, When::Equals { arg: 1, value: FIONBIO_REQUEST },
               "non-blocking mode for a connect with a timeout, and back; nothing else ioctl does"),
    ]);
    v
}

struct State {
    queue: VecDeque<String>,
    dropped: u64,
    numbers: Numbers,
    /// The front closed its end: no more events will come.
    ended: bool,
}

struct Shared {
    state: Mutex<State>,
    more: Condvar,
}

fn lock(s: &Shared) -> MutexGuard<'_, State> {
    s.state.lock().unwrap_or_else(PoisonError::into_inner)
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Drop the oldest events past [`MAX_QUEUE`], counting them.
fn bound(st: &mut State) {
    while st.queue.len() > MAX_QUEUE {
        st.queue.pop_front();
        st.dropped += 1;
        if st.dropped == 1 || st.dropped.is_power_of_two() || st.dropped.is_multiple_of(10_000) {
            log::error!(
                "usage webhook: the queue is full ({MAX_QUEUE} events); {} of the oldest dropped so far (they are in the supervisor's usage.log)",
                st.dropped
            );
        }
    }
}

/// Confine this process: no capabilities, Landlock (no filesystem; TCP connect only to
/// `ports`, where the ABI has it), its own seccomp table.
fn confine_self(ports: &[u16]) -> Result<(), String> {
    use landlock::{
        Access, AccessFs, AccessNet, CompatLevel, Compatible, NetPort, Ruleset, RulesetAttr,
        RulesetCreatedAttr, Scope, ABI,
    };
    let prog = {
        let allowed = allowlist(std::process::id());
        let table = Table {
            allowed: &allowed,
            enosys: confine::enosys_list(FrontRole::Mcp),
            reviewed_up_to: None,
        };
        bpf::build(&table)
            .map_err(|e| format!("build its seccomp filter: {e}"))?
            .as_slice()
            .to_vec()
    };
    confine::drop_capabilities().map_err(|e| e.to_string())?;
    let abi = ABI::V6;
    let io = |e: landlock::RulesetError| format!("put it in a Landlock domain: {e}");
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::BestEffort)
        .handle_access(AccessFs::from_all(abi))
        .map_err(io)?
        .handle_access(AccessNet::from_all(abi))
        .map_err(io)?
        .scope(Scope::from_all(abi))
        .map_err(io)?
        .create()
        .map_err(io)?;
    for &p in ports {
        rs = rs
            .add_rule(NetPort::new(p, AccessNet::ConnectTcp))
            .map_err(io)?;
    }
    rs.restrict_self().map_err(io)?;
    confine::apply(&prog).map_err(|e| e.to_string())
}

/// The delivery process: read events from `feed` (fd of the pipe's read end) until the
/// front closes it, deliver them, and return the exit code.
///
/// # Safety
/// `feed` must be an open descriptor this process owns and nothing else uses.
pub unsafe fn run(feed: i32, webhook: Option<Endpoint>, otlp: Option<Endpoint>) -> i32 {
    // SAFETY: the caller hands the descriptor over.
    let feed = unsafe { OwnedFd::from_raw_fd(feed) };
    let ports: Vec<u16> = webhook
        .iter()
        .chain(otlp.iter())
        .map(|e| e.addr.port())
        .collect();
    if let Err(e) = confine_self(&ports) {
        log::error!("zygo-delivery cannot confine itself, so it delivers nothing: {e}");
        return 1;
    }
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            queue: VecDeque::new(),
            dropped: 0,
            numbers: Numbers::starting(now_ms()),
            ended: false,
        }),
        more: Condvar::new(),
    });
    let mut threads = Vec::new();
    if let Some(to) = webhook.clone() {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || deliver_usage(&sh, &to)));
    }
    if let Some(to) = otlp.clone() {
        let sh = shared.clone();
        threads.push(std::thread::spawn(move || push_otlp(&sh, &to)));
    }
    read_feed(feed, &shared, webhook.is_some());
    lock(&shared).ended = true;
    shared.more.notify_all();
    for t in threads {
        let _ = t.join();
    }
    0
}

/// Read lines from the front until it closes the pipe.
fn read_feed(feed: OwnedFd, sh: &Shared, queue: bool) {
    let mut f = std::fs::File::from(feed);
    let mut buf = vec![0u8; 64 * 1024];
    let mut partial: Vec<u8> = Vec::new();
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                log::error!("zygo-delivery: read the front's pipe: {e}");
                return;
            }
        };
        partial.extend_from_slice(&buf[..n]);
        let mut st = lock(sh);
        while let Some(i) = partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = partial.drain(..=i).collect();
            take_line(&mut st, &line[..line.len() - 1], queue);
        }
        if partial.len() > MAX_LINE {
            log::warn!("zygo-delivery: a line over {MAX_LINE} bytes from the front; dropped");
            partial.clear();
        }
        drop(st);
        sh.more.notify_all();
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    usage: Option<proto::api::UsageEvent>,
    api: Option<(u64, u64)>,
}

fn take_line(st: &mut State, line: &[u8], queue: bool) {
    let parsed: Line = match proto::json::from_slice_strict(line) {
        Ok(l) => l,
        Err(e) => {
            log::warn!("zygo-delivery: a line from the front that does not parse ({e}); dropped");
            return;
        }
    };
    if let Some((r, e)) = parsed.api {
        st.numbers.api_requests = st.numbers.api_requests.max(r);
        st.numbers.api_errors = st.numbers.api_errors.max(e);
    }
    if let Some(rec) = parsed.usage.map(proto::api::UsageEvent::record) {
        st.numbers.add(&rec);
        if queue {
            st.queue.push_back(rec.json_line());
            bound(st);
        }
    }
}

/// The webhook's loop: batches in order; a failed one back on the front of the queue.
fn deliver_usage(sh: &Shared, to: &Endpoint) {
    let mut backoff = Duration::from_millis(500);
    let mut last_chance: Option<Instant> = None;
    loop {
        let batch: Vec<String> = {
            let mut st = lock(sh);
            while st.queue.is_empty() && !st.ended {
                st = sh.more.wait(st).unwrap_or_else(PoisonError::into_inner);
            }
            if st.queue.is_empty() {
                return;
            }
            if st.ended {
                let by = *last_chance.get_or_insert_with(|| Instant::now() + LAST_FLUSH);
                if Instant::now() >= by {
                    log::error!(
                        "usage webhook: zygo api stopped with {} events not delivered to {} (they are in the supervisor's usage.log)",
                        st.queue.len(),
                        to.url
                    );
                    return;
                }
            }
            let n = st.queue.len().min(BATCH);
            st.queue.drain(..n).collect()
        };
        let body = format!("[{}]", batch.join(","));
        match post_json(to, body.as_bytes()) {
            Ok(()) => backoff = Duration::from_millis(500),
            Err(e) => {
                log::warn!(
                    "usage webhook: a batch of {} events was not delivered ({e}); it goes back on the front of the queue, tried again in {} ms",
                    batch.len(),
                    backoff.as_millis()
                );
                {
                    let mut st = lock(sh);
                    for line in batch.into_iter().rev() {
                        st.queue.push_front(line);
                    }
                    bound(&mut st);
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// The OTLP loop: every [`OTLP_EVERY`], and once more when the front is gone.
fn push_otlp(sh: &Shared, to: &Endpoint) {
    loop {
        let (body, ended) = {
            let st = lock(sh);
            let (st, _) = sh
                .more
                .wait_timeout_while(st, OTLP_EVERY, |s| !s.ended)
                .unwrap_or_else(PoisonError::into_inner);
            (st.numbers.export(now_ms()).to_string(), st.ended)
        };
        if let Err(e) = post_json(to, body.as_bytes()) {
            log::warn!("OTLP push: {e}; the next push carries these numbers too");
        }
        if ended {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_queue_drops_the_oldest_and_counts_them() {
        let mut st = State {
            queue: (0..MAX_QUEUE + 5).map(|i| i.to_string()).collect(),
            dropped: 0,
            numbers: Numbers::starting(0),
            ended: false,
        };
        bound(&mut st);
        assert_eq!(st.queue.len(), MAX_QUEUE);
        assert_eq!(st.dropped, 5);
        assert_eq!(st.queue.front().map(String::as_str), Some("5"));
    }

    #[test]
    fn lines_from_the_front_are_parsed_strictly() {
        let mut st = State {
            queue: VecDeque::new(),
            dropped: 0,
            numbers: Numbers::starting(0),
            ended: false,
        };
        let rec = r#"{"tenant":"a","function":"f","script":"sha256:ab","request_id":"r1","wall_ms":0.412,"cpu_ms":1.5,"peak_rss_kb":1,"outcome":"ok","finished_ms":1}"#;
        take_line(&mut st, format!("{{\"usage\":{rec}}}").as_bytes(), true);
        take_line(&mut st, b"{\"api\":[7,2]}", true);
        // Hostile or broken lines are dropped, never queued.
        take_line(&mut st, b"{\"usage\":{}}", true);
        take_line(&mut st, b"{\"api\":[1,1],\"api\":[9,9]}", true);
        take_line(&mut st, b"{\"other\":1}", true);
        take_line(&mut st, b"not json", true);
        assert_eq!(st.queue.len(), 1);
        // Queued as it came: fractional milliseconds, the script's prefix.
        let queued: serde_json::Value =
            serde_json::from_str(&st.queue[0]).expect("a queued line is JSON");
        let sent: serde_json::Value = serde_json::from_str(rec).expect("the test line is JSON");
        assert_eq!(queued, sent);
        assert_eq!((st.numbers.api_requests, st.numbers.api_errors), (7, 2));
    }

    /// Nothing that reaches the filesystem, starts a program or a process, or listens may
    /// be in zygo-delivery's allowlist.
    #[test]
    fn the_allowlist_has_no_filesystem_exec_fork_or_listen() {
        let list = allowlist(1);
        use libc::*;
        for nr in [
            SYS_openat,
            SYS_openat2,
            SYS_open,
            SYS_execve,
            SYS_execveat,
            SYS_fork,
            SYS_vfork,
            SYS_bind,
            SYS_listen,
            SYS_accept,
            SYS_accept4,
            SYS_ptrace,
            SYS_kill,
            SYS_prctl,
            SYS_seccomp,
            SYS_unlink,
            SYS_unlinkat,
            SYS_mount,
        ] {
            assert!(!list.iter().any(|e| e.nr == nr), "syscall {nr} is allowed");
        }
        assert!(list.iter().any(|e| e.nr == SYS_connect));
    }
}
