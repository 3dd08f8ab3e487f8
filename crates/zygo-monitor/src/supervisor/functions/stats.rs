//! What an operator reads about the functions: `zygo ls` (each function and its zygotes),
//! `zygo stats` (counts by outcome, wall-time percentiles, peak memory), `zygo logs` (the
//! last calls of a function); and what each finished call adds to them and to the usage log.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use proto::front::{
    ErrorCode, FunctionInfo, FunctionMetrics, FunctionStats, LogEntry, Metrics, Outcome, Reply,
    ZygoteCounts,
};

use proto::api::{UsageRecord, MCP_RUN_CODE};

use super::registry::{is_pool, FnState};
use super::requests::InFlight;
use super::zygotes::ZState;
use super::{fail, now_ms, Functions};
use crate::supervisor::api::Acting;

/// What a tenant reads when a host function failed to serve (the import error, which may
/// name the host's paths, is in the supervisor's log).
pub(super) const HOST_FAILURE: &str =
    "the function failed to start; the operator can read why in the supervisor's log";

/// Finished requests a function's log keeps for each of its callers (a tenant, or the
/// host's callers together), at most: `zygo logs` and `GET /fn/{name}/logs` show them.
const LOG_KEEP: usize = 1000;

/// Bytes a function's log keeps for each of its callers, at most: past them the caller's
/// own oldest entries go. An entry counts its texts and [`ENTRY_OVERHEAD`].
pub(super) const LOG_CALLER_BYTES: usize = 2 << 20;

/// Bytes a function's log keeps for all its callers together, at most: past them the
/// caller holding the most gives up its oldest entry, so no caller can push out the
/// entries of one that holds less than it.
pub(super) const LOG_FN_BYTES: usize = 8 << 20;

/// The most of a call's error message its log entry keeps (the first bytes, saying how
/// many more were cut); the call's own answer has it as the launcher passed it on.
pub(super) const LOG_ERROR_KEEP: usize = 16 << 10;

/// The last bytes of a call's stdout and of its stderr its log entry keeps.
const LOG_OUTPUT_KEEP: usize = 4096;

/// What an entry costs beyond its texts (its numbers, and what holds them).
const ENTRY_OVERHEAD: usize = 64;

/// The most of its entries' bytes (counted as the log counts them) one logs answer holds:
/// the newest entries asked for that fit, the rest (the oldest) left out and counted.
pub const LOGS_REPLY_BUDGET: usize = 4 << 20;

/// The bytes an entry counts for, in a log and in an answer.
fn entry_size(e: &LogEntry) -> usize {
    e.request_id.len()
        + e.error.as_ref().map_or(0, String::len)
        + e.stdout.len()
        + e.stderr.len()
        + ENTRY_OVERHEAD
}

/// One caller's entries of a function's log, oldest first, each with its place in the
/// function's order and its size.
#[derive(Default)]
struct CallerLog {
    entries: VecDeque<(u64, usize, LogEntry)>,
    bytes: usize,
}

/// A function's log: each caller's entries kept apart (a tenant, or the host's callers
/// under `None`), so that one caller's calls, however many, never push out another's
/// beyond the function's byte budget, where the caller holding the most gives way first.
#[derive(Default)]
pub(super) struct FnLog {
    callers: HashMap<Option<String>, CallerLog>,
    bytes: usize,
    /// The last entry's place in the function's order.
    last: u64,
}

impl FnLog {
    /// A finished call of `caller`.
    fn push(&mut self, caller: Option<String>, e: LogEntry) {
        let size = entry_size(&e);
        self.last += 1;
        let own = self.callers.entry(caller).or_default();
        own.entries.push_back((self.last, size, e));
        own.bytes += size;
        self.bytes += size;
        // The caller's own bounds: its oldest go (never its newest entry, which fits).
        while own.entries.len() > LOG_KEEP
            || (own.bytes > LOG_CALLER_BYTES && own.entries.len() > 1)
        {
            let Some((_, gone, _)) = own.entries.pop_front() else {
                break;
            };
            own.bytes -= gone;
            self.bytes -= gone;
        }
        // The function's: whoever holds the most gives up its oldest.
        while self.bytes > LOG_FN_BYTES {
            let Some(most) = self.callers.values_mut().max_by_key(|c| c.bytes) else {
                break;
            };
            let Some((_, gone, _)) = most.entries.pop_front() else {
                break;
            };
            most.bytes -= gone;
            self.bytes -= gone;
        }
        self.callers.retain(|_, c| !c.entries.is_empty());
    }

    /// A tenant deleted: its entries go.
    pub(super) fn forget(&mut self, tenant: &str) {
        if let Some(c) = self.callers.remove(&Some(tenant.to_string())) {
            self.bytes -= c.bytes;
        }
    }

    /// The last `n` entries of `caller` (`None`: of every caller, in the order they
    /// finished), as many of the newest as fit `budget` bytes: (those, oldest first; how
    /// many of the `n` were left out).
    fn last(
        &self,
        caller: Option<&Option<String>>,
        n: usize,
        budget: usize,
    ) -> (Vec<LogEntry>, u32) {
        let mut all: Vec<&(u64, usize, LogEntry)> = match caller {
            Some(c) => self
                .callers
                .get(c)
                .map(|c| c.entries.iter().collect())
                .unwrap_or_default(),
            None => {
                let mut v: Vec<_> = self
                    .callers
                    .values()
                    .flat_map(|c| c.entries.iter())
                    .collect();
                v.sort_unstable_by_key(|(at, _, _)| *at);
                v
            }
        };
        let asked = all.split_off(all.len().saturating_sub(n));
        let mut used = 0;
        let mut fits = 0;
        for (_, size, _) in asked.iter().rev() {
            if used + size > budget {
                break;
            }
            used += size;
            fits += 1;
        }
        let left_out = asked.len() - fits;
        let entries = asked[left_out..]
            .iter()
            .map(|(_, _, e)| e.clone())
            .collect();
        (entries, left_out as u32)
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

/// Wall-time samples kept per function for percentiles.
const SAMPLES: usize = 10_000;

/// A function's counters since it was served.
#[derive(Default)]
pub(super) struct Stats {
    requests: u64,
    /// By [`Outcome`], as its number.
    by_outcome: [u64; 5],
    /// The last [`SAMPLES`] calls' wall times.
    pub(super) walls_us: VecDeque<u64>,
    peak_rss_kb: u64,
}

impl Stats {
    /// Count a finished call.
    fn add(&mut self, outcome: Outcome, wall: Duration, peak_rss_kb: u64) {
        self.requests += 1;
        self.by_outcome[outcome as usize] += 1;
        self.walls_us.push_back(wall.as_micros() as u64);
        if self.walls_us.len() > SAMPLES {
            self.walls_us.pop_front();
        }
        self.peak_rss_kb = self.peak_rss_kb.max(peak_rss_kb);
    }
}

impl Functions {
    /// A finished call, in its function's log and counters and in the usage log (written
    /// by [`Functions::write_usage`], after the answer has gone out).
    pub(super) fn record(
        &mut self,
        id: &str,
        c: &InFlight,
        outcome: Outcome,
        error: Option<String>,
        wall: Duration,
        metrics: Metrics,
    ) -> UsageRecord {
        let finished_ms = now_ms();
        // A call of a tenant deleted while it ran (cancelled then) leaves nothing in the
        // function's log or its per-tenant counters: the id may be somebody else's later.
        let tenant_gone = c
            .tenant
            .as_ref()
            .is_some_and(|t| !self.api.tenants.contains_key(t));
        if let Some(f) = self.fns.get_mut(&c.func) {
            let entry = LogEntry {
                request_id: id.to_string(),
                finished_ms,
                outcome,
                wall_us: metrics.wall_us,
                error: error.map(|e| head(e, LOG_ERROR_KEEP)),
                stdout: tail(&c.stdout.text, LOG_OUTPUT_KEEP),
                stderr: tail(&c.stderr.text, LOG_OUTPUT_KEEP),
            };
            if !tenant_gone {
                f.logs.push(c.tenant.clone(), entry);
            }
            f.stats.add(outcome, wall, metrics.peak_rss_kb);
            if let Some(t) = c.tenant.as_ref().filter(|_| !tenant_gone) {
                f.tenant_stats.entry(t.clone()).or_default().add(
                    outcome,
                    wall,
                    metrics.peak_rss_kb,
                );
            }
        }
        let rec = UsageRecord {
            tenant: c.tenant.as_deref().unwrap_or(UsageRecord::HOST).to_string(),
            function: c.func.clone(),
            script: c.script_digest.clone(),
            request_id: id.to_string(),
            wall_us: metrics.wall_us,
            cpu_us: metrics.cpu_us,
            peak_rss_kb: metrics.peak_rss_kb,
            outcome: outcome.as_str().to_string(),
            finished_ms,
        };
        self.usage.push(rec.json_line());
        rec
    }

    /// A request that ran outside the supervisor (`zygo mcp`'s `run_code`): its record,
    /// checked for shape, goes in the usage log like any other. Only the host's own
    /// callers may send one (the dispatch table lets only the MCP role ask).
    pub(super) fn record_outside(&mut self, rec: UsageRecord, who: &Acting) -> Reply {
        if who.api() {
            return fail(ErrorCode::Forbidden, "only the host records usage");
        }
        let printable = |s: &str, max: usize| {
            !s.is_empty() && s.len() <= max && s.bytes().all(|b| b.is_ascii_graphic())
        };
        let outcome_ok =
            ["ok", "error", "timeout", "cancelled", "stuck"].contains(&rec.outcome.as_str());
        if rec.function != MCP_RUN_CODE
            || rec.tenant != UsageRecord::HOST
            || rec.script.is_some()
            || !printable(&rec.request_id, 64)
            || !outcome_ok
        {
            return fail(
                ErrorCode::BadRequest,
                format!(
                    "a usage record from outside is the host's {MCP_RUN_CODE} with a printable request id of at most 64 bytes and one of the five outcomes"
                ),
            );
        }
        self.usage.push(rec.json_line());
        Reply::UsageRecorded
    }

    /// Append the usage lines of the requests answered since the last call to the usage
    /// log: whole lines in one write, so a line is never split by a crash or a reader.
    pub fn write_usage(&mut self) {
        self.usage.flush();
    }

    /// `ls`: every function the caller can see, its state and its zygotes. The host's
    /// CLI and an operator acting for nobody see every function on the host, each naming
    /// its tenant; a tenant (or an operator acting for one) sees what
    /// [`Functions::shown`] lets it. On a host function a tenant's numbers are its own:
    /// a zygote is busy only for its own calls (one busy with another tenant's counts as
    /// ready), and `in_flight` counts its own calls.
    pub(super) fn list(&self, who: &Acting) -> Vec<FunctionInfo> {
        let everything = !who.api() || who.tenant.is_none();
        self.fns
            .iter()
            .filter_map(|(key, f)| {
                let shown = match key.split_once('/') {
                    Some((_, plain)) if everything && who.api() => plain.to_string(),
                    _ => self.shown(who, key)?,
                };
                Some((key, shown, f))
            })
            .map(|(key, shown, f)| {
                let owner = key.split_once('/').map(|(t, _)| t.to_string());
                // Another tenant's calls on a host function are not this tenant's to see.
                let mine_only = who.api() && who.tenant.is_some() && owner.is_none();
                let counts_for = |c: &InFlight| !mine_only || c.tenant == who.tenant;
                let mut counts = ZygoteCounts {
                    ready: 0,
                    busy: 0,
                    frozen: 0,
                    starting: 0,
                };
                for z in f.zygotes.iter().filter_map(|t| self.zygotes.get(t)) {
                    let busy = z
                        .children
                        .slots
                        .values()
                        .filter_map(|s| s.request.as_ref().and_then(|r| self.calls.get(r)))
                        .filter(|c| counts_for(c))
                        .count();
                    let busy = if mine_only { busy } else { z.children.busy() };
                    match (z.state, z.frozen, busy) {
                        (ZState::Starting, _, _) => counts.starting += 1,
                        (ZState::Ready, true, _) => counts.frozen += 1,
                        (ZState::Ready, false, 0) => counts.ready += 1,
                        (ZState::Ready, false, _) => counts.busy += 1,
                        (ZState::Dead, _, _) => {}
                    }
                }
                let (state, error) = match &f.state {
                    FnState::Starting => ("starting", None),
                    FnState::Serving => ("serving", None),
                    FnState::Failed(w) => ("failed", Some(w.clone())),
                };
                // Why a function failed to serve can name the host's paths: a tenant
                // token reads a fixed phrase, the detail is in the supervisor's log.
                let error = match (error, who.is_tenant()) {
                    (Some(_), true) => Some(HOST_FAILURE.to_string()),
                    (e, _) => e,
                };
                FunctionInfo {
                    name: shown,
                    tenant: owner,
                    kind: if is_pool(&f.spec) { "pool" } else { "function" }.into(),
                    state: state.into(),
                    error,
                    zygotes: counts,
                    in_flight: self
                        .calls
                        .values()
                        .filter(|c| c.func == *key)
                        .filter(|c| !who.api() || who.tenant.is_none() || c.tenant == who.tenant)
                        .count() as u32,
                    min_warm: f.min_warm as u32,
                    max_warm: f.spec.max_warm,
                }
            })
            .collect()
    }

    /// `stats`: one function's counters, or those of every function the caller can see.
    /// A tenant's are counted from its own calls only.
    pub(super) fn stats(&self, name: Option<&str>, who: &Acting) -> Reply {
        let only = match name {
            Some(n) => match self.key_for(who, n) {
                Ok(k) if self.fns.contains_key(&k) => Some(k),
                Ok(_) => {
                    return fail(
                        ErrorCode::NotFound,
                        format!("no function named {n:?} is served"),
                    )
                }
                Err(r) => return r.into(),
            },
            None => None,
        };
        let out = self
            .fns
            .iter()
            .filter(|(k, _)| only.as_deref().is_none_or(|x| x == k.as_str()))
            .filter_map(|(k, f)| Some((self.shown(who, k)?, f)))
            .map(|(shown, f)| {
                let empty = Stats::default();
                let st = match (&who.tenant, who.api()) {
                    (Some(t), true) => f.tenant_stats.get(t).unwrap_or(&empty),
                    _ => &f.stats,
                };
                let mut w: Vec<u64> = st.walls_us.iter().copied().collect();
                w.sort_unstable();
                let o = &st.by_outcome;
                FunctionStats {
                    name: shown,
                    requests: st.requests,
                    ok: o[Outcome::Ok as usize],
                    error: o[Outcome::Error as usize],
                    timeout: o[Outcome::Timeout as usize],
                    cancelled: o[Outcome::Cancelled as usize],
                    stuck: o[Outcome::Stuck as usize],
                    p50_wall_us: percentile(&w, 0.5),
                    p99_wall_us: percentile(&w, 0.99),
                    peak_rss_kb: st.peak_rss_kb,
                }
            })
            .collect();
        Reply::Stats(out)
    }

    /// `GET /metrics`: a tenant (or an operator acting for one) sees what `list` shows it,
    /// counted from its own calls only, as `stats` does; the host's operator sees every
    /// function on the host, a tenant's by its internal name (`tenant/name`).
    pub(super) fn metrics(&self, who: &Acting) -> Vec<FunctionMetrics> {
        self.fns
            .iter()
            .filter_map(|(k, f)| {
                let shown = match &who.tenant {
                    None => k.clone(),
                    Some(_) => self.shown(who, k)?,
                };
                Some((shown, f))
            })
            .map(|(shown, f)| {
                let empty = Stats::default();
                let st = match (&who.tenant, who.api()) {
                    (Some(t), true) => f.tenant_stats.get(t).unwrap_or(&empty),
                    _ => &f.stats,
                };
                let state = match &f.state {
                    FnState::Starting => "starting",
                    FnState::Serving => "serving",
                    FnState::Failed(_) => "failed",
                };
                FunctionMetrics {
                    name: shown,
                    kind: if is_pool(&f.spec) { "pool" } else { "function" }.into(),
                    requests: st.requests,
                    failures: st.requests - st.by_outcome[Outcome::Ok as usize],
                    rss_bytes: st.peak_rss_kb.saturating_mul(1024),
                    state: state.into(),
                }
            })
            .collect()
    }

    /// `logs`: the last `n` (1 to [`LOG_KEEP`]) finished calls of a function that are the
    /// caller's, as many of the newest as fit [`LOGS_REPLY_BUDGET`]: a tenant (or an
    /// operator acting for one) reads only that tenant's calls; `zygo mcp` only the host's
    /// own; the host's CLI and an operator acting for nobody every caller's.
    pub(super) fn logs_as(&self, name: &str, n: u32, who: &Acting) -> Reply {
        let key = match self.key_for(who, name) {
            Ok(k) => k,
            Err(r) => return r.into(),
        };
        match self.fns.get(&key) {
            Some(f) => {
                let n = (n as usize).clamp(1, LOG_KEEP);
                let whose = match &who.tenant {
                    None if who.all_logs => None,
                    t => Some(t),
                };
                let (entries, left_out) = f.logs.last(whose, n, LOGS_REPLY_BUDGET);
                Reply::Logs { entries, left_out }
            }
            None => fail(
                ErrorCode::NotFound,
                format!("no function named {name:?} is served"),
            ),
        }
    }
}

/// The first `n` bytes of `s` at most, cut at a character's start, saying how many more
/// were cut (as the launcher says it).
fn head(mut s: String, n: usize) -> String {
    if s.len() <= n {
        return s;
    }
    let mut end = n;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    let cut = s.len() - end;
    s.truncate(end);
    s.push_str(&format!("… ({cut} more bytes cut)"));
    s
}

/// The last `n` bytes of `s` at most, cut at a character's start.
fn tail(s: &str, n: usize) -> String {
    if s.len() <= n {
        return s.to_string();
    }
    let mut start = s.len() - n;
    while !s.is_char_boundary(start) {
        start += 1;
    }
    s[start..].to_string()
}

/// The `p` percentile (0 to 1) of sorted samples, the nearest one; 0 with none.
fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_keep_the_last_samples_and_the_highest_peak() {
        let mut st = Stats::default();
        for i in 0..SAMPLES as u64 + 5 {
            st.add(Outcome::Ok, Duration::from_micros(i), i % 7);
        }
        st.add(Outcome::Stuck, Duration::from_micros(1), 3);
        assert_eq!(st.requests, SAMPLES as u64 + 6);
        assert_eq!(st.by_outcome[Outcome::Ok as usize], SAMPLES as u64 + 5);
        assert_eq!(st.by_outcome[Outcome::Stuck as usize], 1);
        assert_eq!(st.walls_us.len(), SAMPLES);
        assert_eq!(st.walls_us.front(), Some(&6));
        assert_eq!(st.peak_rss_kb, 6);
    }

    #[test]
    fn percentiles_are_the_nearest_sample() {
        assert_eq!(percentile(&[], 0.5), 0);
        assert_eq!(percentile(&[7], 0.99), 7);
        let w: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&w, 0.5), 51);
        assert_eq!(percentile(&w, 0.99), 99);
    }

    fn entry(id: &str, error_len: usize) -> LogEntry {
        LogEntry {
            request_id: id.to_string(),
            finished_ms: 0,
            outcome: Outcome::Error,
            wall_us: 1,
            error: Some("e".repeat(error_len)),
            stdout: String::new(),
            stderr: String::new(),
        }
    }

    fn ids(v: &[LogEntry]) -> Vec<String> {
        v.iter().map(|e| e.request_id.clone()).collect()
    }

    #[test]
    fn one_callers_calls_never_push_out_anothers() {
        let mut log = FnLog::default();
        let (a, b) = (Some("a".to_string()), Some("b".to_string()));
        for i in 0..5 {
            log.push(b.clone(), entry(&format!("b{i}"), 10));
        }
        for i in 0..LOG_KEEP + 500 {
            log.push(a.clone(), entry(&format!("a{i}"), 10));
        }
        let (mine, left_out) = log.last(Some(&b), LOG_KEEP, LOGS_REPLY_BUDGET);
        assert_eq!(
            (ids(&mine), left_out),
            ((0..5).map(|i| format!("b{i}")).collect(), 0)
        );
        // a keeps its own last LOG_KEEP, the oldest first.
        let (theirs, _) = log.last(Some(&a), LOG_KEEP, LOGS_REPLY_BUDGET);
        assert_eq!(theirs.len(), LOG_KEEP);
        assert_eq!(theirs[0].request_id, "a500");
        // The host's CLI reads both, in the order they finished; zygo mcp (the host's own)
        // neither.
        let (all, _) = log.last(None, 3, LOGS_REPLY_BUDGET);
        assert_eq!(ids(&all), ["a1497", "a1498", "a1499"]);
        assert!(log.last(Some(&None), 10, LOGS_REPLY_BUDGET).0.is_empty());
        log.forget("a");
        assert_eq!(log.last(None, LOG_KEEP, LOGS_REPLY_BUDGET).0.len(), 5);
    }

    #[test]
    fn a_log_keeps_to_its_byte_budgets_and_the_largest_caller_gives_way() {
        let mut log = FnLog::default();
        let big = LOG_ERROR_KEEP;
        // One caller alone: its own budget.
        for i in 0..1000 {
            log.push(Some("a".into()), entry(&format!("a{i}"), big));
        }
        assert!(log.bytes() <= LOG_CALLER_BYTES, "{}", log.bytes());
        // Many callers: the function's budget, and a small caller keeps all it had.
        log.push(Some("small".into()), entry("s0", 10));
        for t in 0..10 {
            for i in 0..200 {
                log.push(Some(format!("t{t}")), entry(&format!("t{t}-{i}"), big));
            }
        }
        assert!(log.bytes() <= LOG_FN_BYTES, "{}", log.bytes());
        assert_eq!(
            ids(&log
                .last(Some(&Some("small".into())), 10, LOGS_REPLY_BUDGET)
                .0),
            ["s0"]
        );
        // Each of the ten holds about the same share; none was pushed out whole.
        for t in 0..10 {
            let (mine, _) = log.last(Some(&Some(format!("t{t}"))), LOG_KEEP, LOGS_REPLY_BUDGET);
            assert!(mine.len() > 10, "t{t} has {}", mine.len());
        }
    }

    #[test]
    fn an_answer_holds_the_newest_that_fit_its_budget_and_counts_the_rest() {
        let mut log = FnLog::default();
        for t in 0..4 {
            for i in 0..100 {
                log.push(
                    Some(format!("t{t}")),
                    entry(&format!("{t}-{i}"), LOG_ERROR_KEEP),
                );
            }
        }
        let (all, left_out) = log.last(None, LOG_KEEP, LOGS_REPLY_BUDGET);
        let size: usize = all.iter().map(entry_size).sum();
        assert!(
            size <= LOGS_REPLY_BUDGET && left_out > 0,
            "{size} {left_out}"
        );
        assert_eq!(all.len() + left_out as usize, 400);
        assert_eq!(all.last().map(|e| e.request_id.as_str()), Some("3-99"));
        // Fewer asked for than fit: none left out.
        let (few, left_out) = log.last(None, 5, LOGS_REPLY_BUDGET);
        assert_eq!((few.len(), left_out), (5, 0));
    }

    #[test]
    fn a_long_error_is_kept_to_its_head_and_says_so() {
        assert_eq!(head("short".into(), 16), "short");
        let cut = head(format!("{}é", "a".repeat(15)), 16);
        assert_eq!(cut, format!("{}… (2 more bytes cut)", "a".repeat(15)));
    }

    #[test]
    fn a_tail_never_cuts_a_character() {
        assert_eq!(tail("short", 4096), "short");
        assert_eq!(tail("abcdef", 3), "def");
        // "é" is two bytes: a cut through it moves past it.
        assert_eq!(tail("aéb", 2), "b");
    }
}
