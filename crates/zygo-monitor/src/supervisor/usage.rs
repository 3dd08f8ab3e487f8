//! The usage log: `usage.log` in the state directory, one JSON line per finished request
//! (what an operator bills from).
//!
//! Nothing answered is lost to a full or failing disk, and no line is ever torn:
//! - a record that cannot be written is held in memory and written, whole and in order,
//!   once the disk takes it again (retried at most once a second); what is held is bounded
//!   ([`MAX_HELD_BYTES`]), the oldest records going first, counted;
//! - a write that fails part-way is cut back to where it started, so the file only ever
//!   holds whole lines; a line torn by a crash (the host's, mid-write) is cut off when the
//!   log is opened;
//! - the condition is shown where an operator looks (`zygo ls`, `zygo stats`, through
//!   [`proto::front::Health`]), and logged when it starts and when it ends.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use proto::front::UsageLogHealth;

/// The most held in memory while the log cannot be written.
pub const MAX_HELD_BYTES: usize = 64 << 20;
/// How often a failing log is tried again.
const RETRY: Duration = Duration::from_secs(1);

pub struct UsageLog {
    path: PathBuf,
    file: Option<File>,
    /// Whole lines (each ending in a newline) not written yet, oldest first.
    held: VecDeque<String>,
    held_bytes: usize,
    /// Records dropped (oldest first) because too much was held.
    dropped: u64,
    /// Why the last write failed, while it does.
    error: Option<String>,
    next_try: Instant,
}

/// Cut a line left half-written (by a crash mid-write) off the end of the log.
fn cut_torn_tail(f: &mut File) -> std::io::Result<u64> {
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(0);
    }
    let tail_len = len.min(1 << 20);
    f.seek(SeekFrom::Start(len - tail_len))?;
    let mut tail = Vec::with_capacity(tail_len as usize);
    Read::by_ref(f).take(tail_len).read_to_end(&mut tail)?;
    if tail.last() == Some(&b'\n') {
        return Ok(0);
    }
    let keep = match tail.iter().rposition(|&b| b == b'\n') {
        Some(i) => len - tail_len + i as u64 + 1,
        None if tail_len == len => 0,
        // A line longer than a megabyte with no end: cut just that megabyte.
        None => len - tail_len,
    };
    f.set_len(keep)?;
    Ok(len - keep)
}

fn open(path: &Path) -> std::io::Result<File> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(path)?;
    let cut = cut_torn_tail(&mut f)?;
    if cut > 0 {
        log::warn!(
            "the usage log {} ended in a torn line ({cut} bytes, written when the host stopped mid-write); removed it",
            path.display()
        );
    }
    Ok(f)
}

impl UsageLog {
    pub fn open(path: PathBuf) -> std::io::Result<UsageLog> {
        let file = open(&path)?;
        Ok(UsageLog {
            path,
            file: Some(file),
            held: VecDeque::new(),
            held_bytes: 0,
            dropped: 0,
            error: None,
            next_try: Instant::now(),
        })
    }

    /// A finished request's record (one JSON object, without its newline).
    pub fn push(&mut self, mut line: String) {
        line.push('\n');
        self.held_bytes += line.len();
        self.held.push_back(line);
        while self.held_bytes > MAX_HELD_BYTES {
            let Some(old) = self.held.pop_front() else {
                break;
            };
            self.held_bytes -= old.len();
            self.dropped += 1;
            if self.dropped == 1 || self.dropped.is_power_of_two() {
                log::error!(
                    "the usage log cannot be written and {} MiB of records are held: {} records dropped, oldest first",
                    MAX_HELD_BYTES >> 20,
                    self.dropped
                );
            }
        }
    }

    /// Write what is held, whole lines or nothing (see the module's notes).
    pub fn flush(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let now = Instant::now();
        if self.error.is_some() && now < self.next_try {
            return;
        }
        let result = self.write_held();
        match result {
            Ok(()) => {
                if let Some(why) = self.error.take() {
                    log::info!(
                        "the usage log {} is writable again (it failed: {why}); the records held meanwhile are written{}",
                        self.path.display(),
                        if self.dropped > 0 {
                            format!(", but {} were dropped", self.dropped)
                        } else {
                            String::new()
                        }
                    );
                }
            }
            Err(e) => {
                let why = e.to_string();
                if self.error.as_deref() != Some(why.as_str()) {
                    log::error!(
                        "cannot write the usage log {}: {why}; {} records are held in memory and will be written when it can be",
                        self.path.display(),
                        self.held.len()
                    );
                }
                self.error = Some(why);
                self.next_try = now + RETRY;
            }
        }
    }

    fn write_held(&mut self) -> std::io::Result<()> {
        if self.file.is_none() {
            self.file = Some(open(&self.path)?);
        }
        let Some(f) = self.file.as_mut() else {
            return Err(std::io::Error::other("the usage log is not open"));
        };
        let start = f.metadata()?.len();
        let mut buf = String::with_capacity(self.held_bytes);
        for line in &self.held {
            buf.push_str(line);
        }
        if let Err(e) = f.write_all(buf.as_bytes()) {
            // Back to whole lines: nothing of this write stays.
            if let Err(cut) = f.set_len(start) {
                log::error!(
                    "cut a failed write off the usage log {}: {cut}; reopening it",
                    self.path.display()
                );
                self.file = None;
            }
            return Err(e);
        }
        self.held.clear();
        self.held_bytes = 0;
        Ok(())
    }

    /// What `zygo ls` and `zygo stats` show of it.
    pub fn health(&self) -> UsageLogHealth {
        UsageLogHealth {
            error: self.error.clone(),
            held: self.held.len() as u64,
            dropped: self.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!(
            "zygo-tests-usage-{}-{name}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ))
    }

    #[test]
    fn a_torn_last_line_is_cut_when_the_log_is_opened() {
        let p = temp("torn");
        std::fs::write(&p, "{\"a\":1}\n{\"b\":2}\n{\"c\":").expect("write");
        let mut log = UsageLog::open(p.clone()).expect("open");
        log.push("{\"d\":4}".into());
        log.flush();
        assert_eq!(
            std::fs::read_to_string(&p).expect("read"),
            "{\"a\":1}\n{\"b\":2}\n{\"d\":4}\n"
        );
        let _ = std::fs::remove_file(&p);
    }

    #[test]
    fn records_held_past_the_bound_drop_oldest_first_and_are_counted() {
        let p = temp("bound");
        let mut log = UsageLog::open(p.clone()).expect("open");
        let line = "x".repeat(1 << 20);
        for _ in 0..(MAX_HELD_BYTES >> 20) + 3 {
            log.push(line.clone());
        }
        assert!(log.held_bytes <= MAX_HELD_BYTES);
        assert_eq!(log.dropped, 4);
        let _ = std::fs::remove_file(&p);
    }
}
