//! The agent's own diagnostics: its stdout and stderr are a pipe whose read end only the
//! launcher holds, never a host file (a process running tenant code must not hold one: a
//! log file could be grown, truncated, forged or read through it). The launcher reads that
//! pipe whole and logs it line by line, each line marked as the sandbox's, its control
//! characters escaped and its length capped, within a byte budget per minute: a zygote
//! cannot flood, forge or cut the host's log. What is over the budget is dropped and
//! counted: moved into `/dev/null` with splice, one chunk at a time at a bounded pace
//! (16 MB a second), so an agent that writes without end (a tenant's module code can)
//! waits on its full pipe rather than keeping the launcher, outside the sandbox's
//! cgroups, busy reading it.

use std::time::{Duration, Instant};

/// The longest line logged; the rest of it is dropped (and counted).
pub const MAX_LINE: usize = 2000;
/// What a zygote may log in [`WINDOW`].
pub const BUDGET: usize = 64 * 1024;
pub const WINDOW: Duration = Duration::from_secs(60);
/// The most read from the pipe at once.
const CHUNK: usize = 64 * 1024;

/// Lines read from the agent's pipe, and the budget they are logged within.
pub struct AgentLog {
    /// Whose diagnostics (for the log line's prefix).
    who: String,
    partial: Vec<u8>,
    window_start: Instant,
    spent: usize,
    dropped: usize,
    /// Over the budget: the pipe is not read again before this.
    resume_at: Option<Instant>,
}

/// Control characters (C0, DEL, C1) as `\xNN`, or `\u{NN}`; everything else as it is.
pub fn escape_controls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => out.push(c),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if (0x80..0xa0).contains(&(c as u32)) => {
                out.push_str(&format!("\\u{{{:x}}}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

impl AgentLog {
    pub fn new(who: String) -> AgentLog {
        AgentLog {
            who,
            partial: Vec::new(),
            window_start: Instant::now(),
            spent: 0,
            dropped: 0,
            resume_at: None,
        }
    }

    /// The descriptor to poll: `fd`, or none while a drain waits for its next turn.
    pub fn poll_fd(&self, fd: std::os::fd::RawFd) -> std::os::fd::RawFd {
        match self.resume_at {
            Some(t) if t > Instant::now() => -1,
            _ => fd,
        }
    }

    /// How long until a waiting drain is due, in milliseconds (rounded up).
    pub fn due_ms(&self) -> Option<libc::c_int> {
        let t = self.resume_at?;
        Some(
            t.saturating_duration_since(Instant::now())
                .as_micros()
                .div_ceil(1000) as libc::c_int,
        )
    }

    /// Whether what comes now is over the budget (its window not over yet).
    fn over_budget(&self, now: Instant) -> bool {
        self.spent >= BUDGET && now.duration_since(self.window_start) < WINDOW
    }

    /// Over the budget: one chunk into `/dev/null` (counted), then nothing until
    /// `DRAIN_TICK` has passed. `None` where splice cannot be used (then it is read).
    fn drop_spliced(&mut self, fd: std::os::fd::RawFd, now: Instant) -> Option<bool> {
        use std::os::fd::AsRawFd;
        let null = plumbing::pipes::dev_null()?;
        // SAFETY: splice(2) between two descriptors we hold, no offsets.
        let n = unsafe {
            libc::splice(
                fd,
                std::ptr::null_mut(),
                null.as_raw_fd(),
                std::ptr::null_mut(),
                CHUNK,
                libc::SPLICE_F_MOVE | libc::SPLICE_F_NONBLOCK,
            )
        };
        match n {
            0 => {
                self.finish();
                Some(false)
            }
            n if n > 0 => {
                self.dropped += n as usize;
                // The line it was in is not whole any more.
                self.partial.clear();
                self.resume_at = Some(now + crate::zygote::DRAIN_TICK);
                Some(true)
            }
            _ => match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EAGAIN) | Some(libc::EINTR) => Some(true),
                Some(libc::EINVAL) => None,
                _ => {
                    self.finish();
                    Some(false)
                }
            },
        }
    }

    /// Read what the pipe holds now. `false` at its end (the agent and everything that held
    /// the pipe are gone).
    pub fn pump(&mut self, fd: std::os::fd::RawFd) -> bool {
        let now = Instant::now();
        self.resume_at = None;
        if self.over_budget(now) {
            if let Some(open) = self.drop_spliced(fd, now) {
                return open;
            }
        }
        let mut buf = [0u8; CHUNK];
        // One read: poll says when there is more.
        let n = match crate::sys::read_fd(fd, &mut buf) {
            Ok(0) => {
                self.finish();
                return false;
            }
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return true,
            Err(_) => {
                self.finish();
                return false;
            }
        };
        self.push(&buf[..n], &mut |line| log::warn!("{line}"));
        true
    }

    /// Take `bytes`, logging each whole line through `emit`.
    pub fn push(&mut self, bytes: &[u8], emit: &mut dyn FnMut(String)) {
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (line, after) = rest.split_at(nl);
            self.take(line);
            let whole = std::mem::take(&mut self.partial);
            self.line(&whole, emit);
            rest = &after[1..];
        }
        self.take(rest);
    }

    /// The end of the pipe: the last, unterminated line, if any.
    fn finish(&mut self) {
        if !self.partial.is_empty() {
            let whole = std::mem::take(&mut self.partial);
            self.line(&whole, &mut |line| log::warn!("{line}"));
        }
    }

    /// Keep up to MAX_LINE bytes of the line being read; count the rest as dropped.
    fn take(&mut self, bytes: &[u8]) {
        let room = MAX_LINE.saturating_sub(self.partial.len());
        let kept = bytes.len().min(room);
        self.partial.extend_from_slice(&bytes[..kept]);
        self.dropped += bytes.len() - kept;
    }

    fn line(&mut self, line: &[u8], emit: &mut dyn FnMut(String)) {
        let now = Instant::now();
        if now.duration_since(self.window_start) >= WINDOW {
            if self.dropped > 0 {
                emit(format!(
                    "{}: {} bytes of its diagnostics were dropped (over {} KiB a minute, or lines over {MAX_LINE} bytes)",
                    self.who,
                    self.dropped,
                    BUDGET / 1024
                ));
            }
            self.window_start = now;
            self.spent = 0;
            self.dropped = 0;
        }
        if self.spent + line.len() > BUDGET {
            self.dropped += line.len() + 1;
            return;
        }
        self.spent += line.len() + 1;
        let text = String::from_utf8_lossy(line);
        emit(format!("{}: {}", self.who, escape_controls(&text)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logged(log: &mut AgentLog, bytes: &[u8]) -> Vec<String> {
        let mut out = Vec::new();
        log.push(bytes, &mut |l| out.push(l));
        out
    }

    #[test]
    fn each_line_is_marked_as_the_sandboxs_and_cannot_forge_another() {
        let mut log = AgentLog::new("sandbox 7".into());
        let lines = logged(
            &mut log,
            b"hello\nforged\r[INFO zygo] supervisor listening\x1b[2J\nhalf",
        );
        assert_eq!(
            lines,
            vec![
                "sandbox 7: hello".to_string(),
                "sandbox 7: forged\\x0d[INFO zygo] supervisor listening\\x1b[2J".to_string(),
            ]
        );
        assert_eq!(logged(&mut log, b" done\n"), vec!["sandbox 7: half done"]);
    }

    #[test]
    fn a_long_line_is_cut_and_a_flood_stops_at_the_budget() {
        let mut log = AgentLog::new("z".into());
        let long = vec![b'x'; MAX_LINE * 3];
        let lines = logged(&mut log, &[long.as_slice(), b"\n"].concat());
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].len(), "z: ".len() + MAX_LINE);
        let flood = [b"y".repeat(1000), b"\n".to_vec()].concat();
        let mut n = 0;
        for _ in 0..1000 {
            n += logged(&mut log, &flood).len();
        }
        assert!(n * 1001 <= BUDGET, "{n} lines logged");
        assert!(log.dropped > 900 * 1001);
    }

    #[test]
    fn past_the_budget_the_pipe_is_drained_at_a_bounded_pace() {
        use std::io::Write;
        use std::os::fd::AsRawFd;
        let (r, w) = std::io::pipe().expect("a pipe");
        // SAFETY: fcntl on descriptors we own: O_NONBLOCK added, the pipe made larger
        // than a chunk.
        unsafe {
            let flags = libc::fcntl(r.as_raw_fd(), libc::F_GETFL);
            libc::fcntl(r.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK);
            assert!(libc::fcntl(w.as_raw_fd(), libc::F_SETPIPE_SZ, 256 * 1024) > 0);
        }
        let mut w = w;
        let mut log = AgentLog::new("z".into());
        // The budget spent: what comes next is drained, a chunk per turn.
        log.spent = BUDGET;
        let line = [b"y".repeat(99), b"\n".to_vec()].concat();
        for _ in 0..1000 {
            w.write_all(&line).expect("write");
        }
        assert_eq!(log.poll_fd(r.as_raw_fd()), r.as_raw_fd());
        assert!(log.pump(r.as_raw_fd()));
        assert_eq!(log.dropped, CHUNK, "one chunk in the first turn");
        // Not read again before its turn.
        assert_eq!(log.poll_fd(r.as_raw_fd()), -1);
        assert!(log.due_ms().is_some_and(|ms| (0..=4).contains(&ms)));
        std::thread::sleep(crate::zygote::DRAIN_TICK);
        assert_eq!(log.poll_fd(r.as_raw_fd()), r.as_raw_fd());
        assert!(log.pump(r.as_raw_fd()));
        assert_eq!(log.dropped, 100_000, "the rest in the second");
        // At its end the pipe says so.
        drop(w);
        std::thread::sleep(crate::zygote::DRAIN_TICK);
        assert!(!log.pump(r.as_raw_fd()));
    }

    #[test]
    fn c1_controls_and_del_are_escaped_too() {
        assert_eq!(escape_controls("a\u{9b}b\u{7f}c\td"), "a\\u{9b}b\\x7fc\td");
    }
}
