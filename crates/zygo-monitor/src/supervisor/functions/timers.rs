//! Timers, on the loop's clock: a call's deadline and its handler's heartbeat, children
//! that linger after their answer, a zygote's agent that went silent, idle zygotes frozen,
//! and the `serve` answers waiting for zygotes.

use std::time::{Duration, Instant};

use proto::front::Outcome;

use super::requests::InFlight;
use super::zygotes::{freeze, Slot, ZState};
use super::{Ctx, Functions};
use crate::keeper::LocalKeeper;

/// A request with no heartbeat for this long is killed as stuck
/// (`$ZYGO_STUCK_AFTER_MS` overrides it, for tests).
pub(super) fn stuck_after() -> Duration {
    std::env::var("ZYGO_STUCK_AFTER_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(Duration::from_secs(60), Duration::from_millis)
}

/// How long a child may linger after its answer before its cgroup is killed.
const LINGER: Duration = Duration::from_secs(2);

/// What a call's clock says, when it says anything.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Its handler has run for the call's whole time limit: it is killed, `timeout`.
    Timeout,
    /// Its handler sent no heartbeat for [`stuck_after`]: it is killed, `stuck`.
    Stuck,
    /// It waited for a parked child for its whole time limit: it ends, `timeout`, without
    /// having run.
    Expired,
}

/// Whether a call is due to be ended, `now`. One already being ended from outside is not:
/// that reason stands.
fn due(c: &InFlight, now: Instant, stuck: Duration) -> Option<Due> {
    if c.forced.is_some() {
        return None;
    }
    match c.started {
        Some(s) if now.duration_since(s) >= c.timeout => Some(Due::Timeout),
        Some(_) if now.duration_since(c.last_beat) >= stuck => Some(Due::Stuck),
        None if now.duration_since(c.received) >= c.timeout => Some(Due::Expired),
        _ => None,
    }
}

/// A child answered [`LINGER`] ago or more that has not exited goes with its cgroup (the
/// launcher then reports its channel closed).
fn end_if_lingering(keeper: &mut LocalKeeper, s: &Slot, now: Instant) {
    if s.answered.is_some_and(|t| now.duration_since(t) >= LINGER) {
        super::requests::kill_slot(keeper, s.id);
    }
}

impl Functions {
    /// Timers: deadlines, heartbeats, lingering children, silent and idle zygotes, answers
    /// to `serve`.
    pub fn tick(&mut self, now: Instant, cx: &mut Ctx, draining: bool) {
        let stuck = stuck_after();
        self.runs_tick(now, cx);
        // Calls: past their deadline, or silent.
        let ended: Vec<(String, Outcome)> = self
            .calls
            .iter()
            .filter_map(|(id, c)| {
                let outcome = match due(c, now, stuck)? {
                    Due::Timeout | Due::Expired => Outcome::Timeout,
                    Due::Stuck => Outcome::Stuck,
                };
                Some((id.clone(), outcome))
            })
            .collect();
        for (id, outcome) in ended {
            self.force(&id, outcome);
        }
        // Children answered a while ago.
        for z in self.zygotes.values() {
            for s in z.children.slots.values() {
                end_if_lingering(&mut self.keeper, s, now);
            }
        }
        // Zygotes: a silent agent is replaced; an idle one is frozen.
        let mut dead = Vec::new();
        for (t, z) in self.zygotes.iter_mut() {
            if z.state != ZState::Ready || z.frozen {
                continue;
            }
            if now.duration_since(z.last_beat) >= stuck {
                dead.push(*t);
                continue;
            }
            let idle = self
                .fns
                .get(&z.func)
                .map_or(Duration::MAX, |f| f.spec.idle_timeout);
            if !draining
                && z.children.busy() == 0
                && z.children.parking.is_empty()
                && now.duration_since(z.last_used) >= idle
            {
                log::info!("freezing an idle zygote of {}", z.func);
                freeze(z);
            }
        }
        for t in dead {
            self.zygote_died(t, "its agent stopped sending heartbeats", cx);
        }
        self.answer_serves();
    }

    /// How long the loop may sleep: not long while calls run or `serve` answers wait.
    pub fn next_wake(&self, _now: Instant) -> Option<Duration> {
        if self.calls.is_empty()
            && self.pending_serves.is_empty()
            && self.pending_layers.is_empty()
            && self.runs.idle()
        {
            Some(Duration::from_secs(1))
        } else {
            Some(Duration::from_millis(20))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::{Fake, Op};
    use crate::cgroup::Limits;

    const LIMITS: Limits = LocalKeeper::TEST_LIMITS;
    use proto::front::ExecRequest;

    const TIMEOUT: Duration = Duration::from_secs(30);
    const STUCK: Duration = Duration::from_secs(60);

    /// A call received at `t0` with a 30 s time limit.
    fn call(t0: Instant) -> InFlight {
        let mut e = ExecRequest {
            name: "f".into(),
            event: "{}".into(),
            key: None,
            timeout_ms: None,
            stream: false,
            script: None,
            workspace: None,
            workspace_blob: None,
            out: false,
        };
        InFlight::new(mio::Token(99), &mut e, "{}".into(), TIMEOUT, None, t0)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn a_running_call_is_due_at_its_time_limit_or_when_its_heartbeat_stops() {
        let t0 = Instant::now();
        let mut c = call(t0);
        c.started = Some(t0 + secs(1));
        c.last_beat = t0 + secs(1);
        assert_eq!(due(&c, t0 + secs(30), STUCK), None);
        assert_eq!(due(&c, t0 + secs(31), STUCK), Some(Due::Timeout));
        // With a limit longer than the heartbeat's, silence ends it first; a beat resets it.
        let mut c = call(t0);
        c.timeout = secs(600);
        c.started = Some(t0);
        c.last_beat = t0;
        assert_eq!(due(&c, t0 + secs(59), STUCK), None);
        assert_eq!(due(&c, t0 + secs(60), STUCK), Some(Due::Stuck));
        c.last_beat = t0 + secs(50);
        assert_eq!(due(&c, t0 + secs(60), STUCK), None);
        // Both at once: the time limit is the reason.
        assert_eq!(due(&c, t0 + secs(600), Duration::ZERO), Some(Due::Timeout));
    }

    #[test]
    fn a_call_waiting_for_a_child_expires_at_its_time_limit_without_running() {
        let t0 = Instant::now();
        let c = call(t0);
        assert_eq!(due(&c, t0 + secs(29), STUCK), None);
        // Never started, so never stuck, however long it has been silent.
        assert_eq!(due(&c, t0 + secs(30), Duration::ZERO), Some(Due::Expired));
    }

    #[test]
    fn a_call_already_being_ended_is_never_due_again() {
        let t0 = Instant::now();
        for forced in [Outcome::Cancelled, Outcome::Timeout, Outcome::Error] {
            let mut c = call(t0);
            c.started = Some(t0);
            c.forced = Some(forced);
            assert_eq!(due(&c, t0 + secs(3600), STUCK), None);
        }
    }

    #[test]
    fn a_child_lingering_after_its_answer_is_killed_with_its_cgroup() {
        let mut keeper = LocalKeeper::detached();
        let z = keeper.adopt_zygote("hello", LIMITS, &Fake::new());
        let cg = Fake::new().holding(4242);
        let t0 = Instant::now();
        let s = Slot {
            request: Some("r".into()),
            answered: Some(t0),
            ..Slot::parked(keeper.adopt_slot(z, &cg), Box::new(cg.clone()))
        };
        end_if_lingering(&mut keeper, &s, t0 + LINGER - Duration::from_millis(1));
        assert!(cg.ops().is_empty());
        end_if_lingering(&mut keeper, &s, t0 + LINGER);
        assert_eq!(cg.ops(), [Op::Thaw, Op::KillAll, Op::Usage]);
        assert!(cg.pids().is_empty());
        // One not answered yet is left alone, however long it runs.
        let running = Fake::new();
        let s = Slot {
            request: Some("r".into()),
            ..Slot::parked(keeper.adopt_slot(z, &running), Box::new(running.clone()))
        };
        end_if_lingering(&mut keeper, &s, t0 + secs(3600));
        assert!(running.ops().is_empty());
    }
}
