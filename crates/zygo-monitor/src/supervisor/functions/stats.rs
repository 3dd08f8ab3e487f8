//! What an operator reads about the functions: `zygo ls` (each function and its zygotes),
//! `zygo stats` (counts by outcome, wall-time percentiles, peak memory), `zygo logs` (the
//! last calls of a function); and what each finished call adds to them and to the usage log.

use std::collections::VecDeque;
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

/// Finished requests remembered per function for `zygo logs`.
const LOG_KEEP: usize = 1000;

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
                error,
                stdout: tail(&c.stdout.text, 4096),
                stderr: tail(&c.stderr.text, 4096),
            };
            if !tenant_gone {
                f.logs.push_back((c.tenant.clone(), entry));
                if f.logs.len() > LOG_KEEP {
                    f.logs.pop_front();
                }
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
    /// caller's: a tenant reads only its own calls.
    pub(super) fn logs_as(&self, name: &str, n: u32, who: &Acting) -> Reply {
        let key = match self.key_for(who, name) {
            Ok(k) => k,
            Err(r) => return r.into(),
        };
        match self.fns.get(&key) {
            Some(f) => {
                let n = (n as usize).clamp(1, LOG_KEEP);
                let mine: Vec<&LogEntry> = f
                    .logs
                    .iter()
                    .filter(|(t, _)| !who.api() || who.tenant.is_none() || *t == who.tenant)
                    .map(|(_, e)| e)
                    .collect();
                let skip = mine.len().saturating_sub(n);
                Reply::Logs(mine.into_iter().skip(skip).cloned().collect())
            }
            None => fail(
                ErrorCode::NotFound,
                format!("no function named {name:?} is served"),
            ),
        }
    }
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

    #[test]
    fn a_tail_never_cuts_a_character() {
        assert_eq!(tail("short", 4096), "short");
        assert_eq!(tail("abcdef", 3), "def");
        // "é" is two bytes: a cut through it moves past it.
        assert_eq!(tail("aéb", 2), "b");
    }
}
