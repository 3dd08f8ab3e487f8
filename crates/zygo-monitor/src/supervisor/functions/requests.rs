//! A call's lifecycle, from its admission to its answer, in the order it happens:
//!
//! 1. admitted ([`Functions::exec`]): the event, key and script checked, the call
//!    recorded ([`InFlight`]);
//! 2. placed ([`Functions::try_dispatch`]): given a parked child of a ready zygote; where
//!    none is free, it waits for one if a zygote has room, or another zygote is started
//!    for it, or it is refused as busy at once ([`admit`]);
//! 3. running: its output, progress and heartbeats relayed as they come;
//! 4. answered ([`Functions::answer_now`]): its handler's terminal line answers the caller
//!    at once; the child exits and its cgroup goes off the request path;
//! 5. or ended from outside ([`Functions::force`]): its deadline, its heartbeat, a cancel,
//!    its caller leaving: its cgroup is killed, and it is answered when its child's channel
//!    closes ([`Functions::child_gone`]) or its zygote dies ([`Functions::zygote_gone`]);
//! 6. finished ([`Functions::finish`]): its outcome decided by [`decide`] from what
//!    happened, its caller answered, the call logged and counted.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use mio::Token;
use proto::front::{ErrorCode, ExecAnswer, ExecEvent, ExecRequest, Metrics, Outcome, Reply};
use proto::launch::{Script, SecretFile, Stream, ToLauncher};

use super::checking::Event;
use super::registry::{is_pool, FnState};
use super::timers::stuck_after;
use super::zygotes::{thaw, ZState};
use super::{fail, Ctx, Functions, MAX_EVENT, SLOTS};
use crate::cgroup::{Limits, Usage, Weight};
use crate::keeper::LocalKeeper;
use crate::supervisor::api::Acting;
use crate::supervisor::event_check;
use plumbing::random_hex;
use proto::keeper::{FromKeeper, SlotId, ToKeeper, UsageMsg};

/// Output kept per stream per request.
const OUTPUT_CAP: usize = 1024 * 1024;

/// A handler's answer: the last line its child sends for a request.
pub(super) enum Terminal {
    Returned(String),
    /// `exit_code`: the handler's process ended by exiting with it.
    Raised {
        message: String,
        traceback: String,
        exit_code: Option<i32>,
    },
}

/// What a zygote's death tells the calls it was serving.
pub(super) fn zygote_died() -> Terminal {
    Terminal::Raised {
        message: "the zygote serving this request died".into(),
        traceback: String::new(),
        exit_code: None,
    }
}

/// A request's output on one stream, kept up to [`OUTPUT_CAP`].
pub(super) struct Capped {
    pub(super) text: String,
    truncated: bool,
}

impl Capped {
    fn new() -> Capped {
        Capped {
            text: String::new(),
            truncated: false,
        }
    }
    /// Keep `s`, or as much of it as fits (cut at a character's start). Once anything was
    /// cut, nothing more is kept: what is kept is always a prefix of what was written.
    fn push(&mut self, s: &str) {
        if self.truncated {
            return;
        }
        let room = OUTPUT_CAP.saturating_sub(self.text.len());
        if s.len() <= room {
            self.text.push_str(s);
        } else {
            let mut cut = room;
            while cut > 0 && !s.is_char_boundary(cut) {
                cut -= 1;
            }
            self.text.push_str(&s[..cut]);
            self.truncated = true;
        }
    }
}

/// A call, from its admission until it is answered.
pub(super) struct InFlight {
    /// The front's connection that waits for its answer.
    client: Token,
    pub(super) func: String,
    /// Set once the call has a child: (zygote, slot).
    at: Option<(Token, String)>,
    /// Its event, until it is sent to its child.
    event: String,
    key: Option<String>,
    /// Whether its caller wants output and progress as they come.
    stream: bool,
    /// Its caller's front fell behind reading its events: no more are made for it, and
    /// its answer says the stream was cut.
    stream_cut: bool,
    pub(super) received: Instant,
    /// When it was given a child.
    pub(super) started: Option<Instant>,
    pub(super) timeout: Duration,
    /// When its child last showed it is alive (output, progress, a heartbeat).
    pub(super) last_beat: Instant,
    pub(super) stdout: Capped,
    pub(super) stderr: Capped,
    /// Its handler's answer, once it came.
    terminal: Option<Terminal>,
    /// Why it is being ended from outside, once it is: `timeout` or `stuck` (its timers),
    /// `cancelled` (a cancel, its caller gone, its function stopped, the drain's end), or
    /// `error` (its zygote died). It stands over the handler's answer.
    pub(super) forced: Option<Outcome>,
    /// A pool's script, handed to the launcher with the call.
    script: Option<Script>,
    /// Its digest, for the usage log.
    pub(super) script_digest: Option<String>,
    /// Its workspace (a tar), until it is handed to the launcher with the call.
    workspace: Option<proto::bytes::Bytes>,
    /// The stored blob its workspace was read from: never evicted while the call runs.
    pub(super) blob_digest: Option<String>,
    /// Whether its caller wants the request's directory back.
    out: bool,
    /// The directory, packed after its handler answered, and whether caps left
    /// entries out of it.
    workspace_out: Option<proto::bytes::Bytes>,
    workspace_out_truncated: bool,
    /// The tenant it was made for (`None`: the host's).
    pub(super) tenant: Option<String>,
    /// Narrower cgroup limits than its function's (its tenant's), written on its child's
    /// cgroup before the child is let go.
    pub(super) narrow: Option<Limits>,
    /// A smaller `/tmp` and `/work` than its function's (its tenant's scratch limit).
    pub(super) scratch: Option<u64>,
    /// Its secrets, until they are sent with it to its child (`/run/secrets/`).
    secrets: Vec<SecretFile>,
    /// A pool's call carrying its tenant's secrets: it has its zygote to itself (no other
    /// call is given a child of that zygote while it runs).
    pub(super) exclusive: bool,
    /// The store write of the script it carried (a ticket), if one was needed: its answer
    /// waits for it, so that once answered the script is held for later calls.
    pub(super) script_write: Option<u64>,
}

impl InFlight {
    pub(super) fn new(
        client: Token,
        e: &mut ExecRequest,
        event: String,
        timeout: Duration,
        script: Option<Script>,
        now: Instant,
    ) -> InFlight {
        InFlight {
            client,
            func: e.name.clone(),
            at: None,
            event,
            key: e.key.clone(),
            stream: e.stream,
            stream_cut: false,
            received: now,
            started: None,
            timeout,
            last_beat: now,
            stdout: Capped::new(),
            stderr: Capped::new(),
            terminal: None,
            forced: None,
            script_digest: script.as_ref().map(|s| s.digest.clone()),
            script,
            workspace: e.workspace.take(),
            blob_digest: e.workspace_blob.take(),
            out: e.out,
            workspace_out: None,
            workspace_out_truncated: false,
            tenant: None,
            narrow: None,
            scratch: None,
            secrets: Vec::new(),
            exclusive: false,
            script_write: None,
        }
    }
}

/// Where a call that found no parked child goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Admission {
    /// A zygote has room for it: it waits for a child to be parked.
    Wait,
    /// Another zygote is started, and it waits for that one's child.
    Grow,
    /// Every zygote is at its limit and there are `max_warm` of them: refused at once.
    Busy,
}

/// Where a call that found no parked child goes: `room` is what the function's live
/// zygotes can still take, `waiting` the calls already waiting for a child, `zygotes` how
/// many it has. Calls never wait where no room is: there is no hidden queue.
fn admit(room: usize, waiting: usize, zygotes: usize, max_warm: usize) -> Admission {
    if room > waiting {
        Admission::Wait
    } else if zygotes < max_warm {
        Admission::Grow
    } else {
        Admission::Busy
    }
}

/// How many of a host function's (or pool's) zygotes one tenant's calls may hold at once:
/// half of its `max_warm`, at least one. Tenants never share a zygote, so without a share
/// one tenant's calls could hold every zygote (4 calls with secrets, 13 without, at the
/// default `max_warm` of 4) and every other tenant was busy; with it, at least as many
/// zygotes as one tenant may hold are always left to the others. (Two tenants at their
/// shares can still fill a pool: a limit of this version. The host's own callers have no
/// share: they are the operator's.)
pub(super) fn tenant_share(max_warm: usize) -> usize {
    (max_warm / 2).max(1)
}

/// Whether a call of a tenant that holds `own` zygotes of a function, with `own_room` room
/// for another call in them (for a call with secrets, `exclusive`: those of them where
/// only answered calls are left, on their way out) and `waiting` calls of the tenant
/// already waiting for a child, must be refused as busy for its share: placing it and
/// those waiting would take more zygotes than `share` (a call with secrets takes a zygote
/// to itself).
fn over_share(own: usize, own_room: usize, waiting: usize, exclusive: bool, share: usize) -> bool {
    let per = if exclusive { 1 } else { SLOTS };
    let more = (waiting + 1).saturating_sub(own_room).div_ceil(per);
    own + more > share
}

/// What happened to a call, as far as its outcome goes.
pub(super) struct Ending {
    /// Why it was ended from outside, if it was (see [`InFlight::forced`]).
    forced: Option<Outcome>,
    /// Its handler's answer, if one came (or, if its zygote died, the error saying so).
    terminal: Option<Terminal>,
    /// What its cgroup counted, where it could be read.
    usage: Option<Usage>,
    /// How its child broke the agent protocol, if it did.
    violation: Option<String>,
}

/// How a call ended, as its caller is told.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Verdict {
    outcome: Outcome,
    result: Option<String>,
    error: Option<String>,
    traceback: Option<String>,
    /// Its cgroup counted an OOM kill (whatever the outcome: a handler whose helper
    /// process was killed may still have answered).
    oom_killed: bool,
    /// The code the handler's process exited with, when an error was its exiting.
    exit_code: Option<i32>,
}

/// A call's outcome word and message, from what happened to it. A reason from outside
/// stands over the handler's answer; the answer over the cgroup's readings; with neither,
/// an OOM kill counted by its cgroup, else a broken protocol, else a child that ended
/// without answering. `timeout`, `stuck` and `mem` are the limits it ran under, for the
/// messages.
fn decide(e: Ending, timeout: Duration, stuck: Duration, mem: &str) -> Verdict {
    let oom_killed = e.usage.is_some_and(|u| u.oom_kills > 0);
    let exit_code = match (&e.forced, &e.terminal) {
        (None, Some(Terminal::Raised { exit_code, .. })) => *exit_code,
        _ => None,
    };
    let (outcome, result, error, traceback) = match (e.forced, e.terminal) {
        (Some(Outcome::Timeout), _) => (
            Outcome::Timeout,
            None,
            Some(format!(
                "exceeded its {} time limit",
                policy::limits::Dur(timeout)
            )),
            None,
        ),
        (Some(Outcome::Stuck), _) => (
            Outcome::Stuck,
            None,
            Some(format!(
                "sent no heartbeat for {} and was killed as stuck",
                policy::limits::Dur(stuck)
            )),
            None,
        ),
        (Some(Outcome::Cancelled), _) => (
            Outcome::Cancelled,
            None,
            Some("cancelled".to_string()),
            None,
        ),
        (_, Some(Terminal::Returned(v))) => (Outcome::Ok, Some(v), None, None),
        (
            _,
            Some(Terminal::Raised {
                message, traceback, ..
            }),
        ) => (
            Outcome::Error,
            None,
            Some(message),
            (!traceback.is_empty()).then_some(traceback),
        ),
        (_, None) if oom_killed => (
            Outcome::Error,
            None,
            Some(format!("ran out of memory (limit {mem})")),
            None,
        ),
        (_, None) => (
            Outcome::Error,
            None,
            Some(match e.violation {
                Some(v) => format!("the handler's process broke the agent protocol: {v}"),
                None => "the handler's process ended without answering".to_string(),
            }),
            None,
        ),
    };
    Verdict {
        outcome,
        result,
        error,
        traceback,
        oom_killed,
        exit_code,
    }
}

/// A call's metrics: its wall time, and what its cgroup counted (zeros where it was not
/// read).
fn metrics(wall: Duration, usage: Option<Usage>) -> Metrics {
    Metrics {
        wall_us: wall.as_micros().min(u64::MAX as u128) as u64,
        cpu_us: usage.map_or(0, |u| u.cpu_usec),
        peak_rss_kb: usage.map_or(0, |u| u.peak_bytes / 1024),
    }
}

/// What a request's cgroup counted, read when its child went without an answer: whatever
/// is left in it is killed first (by the keeper), so the counters no longer move.
pub(super) fn last_reading(keeper: &mut LocalKeeper, slot: SlotId) -> Option<Usage> {
    kill_slot(keeper, slot)
}

/// Kill what runs in a slot's cgroup (the keeper does); what it counted after.
pub(super) fn kill_slot(keeper: &mut LocalKeeper, slot: SlotId) -> Option<Usage> {
    match keeper.call(ToKeeper::KillSlot { slot }).reply {
        FromKeeper::Killed { usage } => usage.map(usage_of),
        other => {
            log::error!("kill a request's cgroup: {other:?}");
            None
        }
    }
}

/// What a cgroup counted, as the keeper said it.
pub(super) fn usage_of(u: UsageMsg) -> Usage {
    Usage {
        oom_kills: u.oom_kills,
        peak_bytes: u.peak_bytes,
        cpu_usec: u.cpu_usec,
    }
}

/// Whether a tenant with these limits may call a function (or make a run) with egress
/// rules `allow` (see [`policy::gate::tenant_may_call_egress`]).
pub(super) fn tenant_egress(
    allow: &[policy::file::AllowRule],
    t: &proto::api::TenantLimits,
) -> Result<(), String> {
    use policy::gate::TenantNetwork;
    let parsed: Vec<policy::file::AllowRule>;
    let net = match (t.network.as_deref(), &t.allow) {
        (Some("none"), _) => TenantNetwork::None,
        (_, Some(a)) => {
            parsed = a
                .iter()
                .map(|r| policy::file::AllowRule::parse("allow", r))
                .collect::<Result<_, _>>()
                .map_err(|e| format!("the tenant's allow list: {e}"))?;
            TenantNetwork::Egress(Some(&parsed))
        }
        (Some(_), None) => TenantNetwork::Egress(None),
        (None, None) => TenantNetwork::Unset,
    };
    policy::gate::tenant_may_call_egress(allow, net)
}

/// A function's name as a caller knows it (a tenant's own without its tenant).
fn shown_name(key: &str) -> &str {
    key.rsplit('/').next().unwrap_or(key)
}

/// The cgroup limits of a call: the function's, narrowed by its tenant's where those are
/// lower; `None` when they narrow nothing.
pub(super) fn narrowed(f: &Limits, t: &proto::api::TenantLimits) -> Option<Limits> {
    let cap = |v: u32, t: Option<u64>| {
        t.map_or(v, |t| v.min(u32::try_from(t).unwrap_or(u32::MAX)).max(1))
    };
    let l = Limits {
        mem_bytes: match (f.mem_bytes, t.mem_bytes) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        cpu_millis: cap(f.cpu_millis, t.cpu_millis),
        pids: cap(f.pids, t.pids),
        // A tenant has no I/O limits of its own over the API: the function's stand.
        ..*f
    };
    (l != *f).then_some(l)
}

/// Whether a call in flight names a script (see `Store::put`: such a script is never
/// evicted).
pub(super) fn script_in_flight(calls: &HashMap<String, InFlight>) -> impl Fn(&str) -> bool + '_ {
    move |d| {
        calls
            .values()
            .any(|c| c.script_digest.as_deref() == Some(d))
    }
}

impl Functions {
    /// `exec`: admit a call and place it. `None`: it was placed or waits for a child, and
    /// is answered later (through the outbox).
    pub(super) fn exec(
        &mut self,
        client: Token,
        mut e: ExecRequest,
        who: &Acting,
        cx: &mut Ctx,
        checked: Option<Event>,
    ) -> Option<Reply> {
        // Checked in one pass that builds nothing (a tree of a large event would cost many
        // times its size), and made one line for the agent's protocol: a small event here,
        // a large one already, off the loop (see `checking`).
        let (event, cancelled) = match checked {
            Some(ev) => (ev.text, ev.cancelled),
            None => {
                if e.event.len() > MAX_EVENT {
                    return Some(fail(
                        ErrorCode::TooLarge,
                        format!("the event is over {} MiB", MAX_EVENT >> 20),
                    ));
                }
                match event_check::check(std::mem::take(&mut e.event)) {
                    Ok(text) => (text, false),
                    Err(message) => return Some(fail(ErrorCode::BadRequest, message)),
                }
            }
        };
        if let Some(w) = &e.workspace {
            if w.len() > proto::front::MAX_WORKSPACE {
                return Some(fail(
                    ErrorCode::TooLarge,
                    format!(
                        "the workspace is {} bytes; at most {} MiB may be sent",
                        w.len(),
                        proto::front::MAX_WORKSPACE >> 20
                    ),
                ));
            }
        }
        if e.key
            .as_ref()
            .is_some_and(|k| k.is_empty() || k.len() > 256)
        {
            return Some(fail(
                ErrorCode::BadRequest,
                "a request key must be 1 to 256 bytes",
            ));
        }
        let Some(f) = self.fns.get(&e.name) else {
            return Some(fail(
                ErrorCode::NotFound,
                format!("no function named {:?} is served; see `zygo ls`", e.name),
            ));
        };
        // A function's egress filter is shared by every caller: a tenant whose limits do
        // not cover it is refused, naming the limit.
        if who.tenant.is_some() && f.spec.network == policy::plan::Network::Egress {
            if let Err(why) = tenant_egress(&f.spec.allow, &who.limits) {
                return Some(fail(
                    ErrorCode::Forbidden,
                    format!(
                        "{} may not be called by this tenant: {why}",
                        shown_name(&e.name)
                    ),
                ));
            }
        }
        if let FnState::Failed(why) = &f.state {
            // The import error can name the host's paths: a tenant token reads a fixed
            // phrase (the supervisor's log has the detail).
            let why = if who.is_tenant() {
                super::stats::HOST_FAILURE
            } else {
                why.as_str()
            };
            return Some(fail(
                ErrorCode::Unavailable,
                format!("{} failed to serve: {why}", e.name),
            ));
        }
        // A pool runs the script named with the call; a function runs its own handler.
        let pool = is_pool(&f.spec);
        // Warm-exec has no agent in the request's process to start it in its directory.
        if (e.workspace.is_some() || e.out) && matches!(f.spec.kind, policy::file::FnKind::Cmd(_)) {
            return Some(fail(
                ErrorCode::BadRequest,
                format!(
                    "{} is a warm-exec pool (a command, no agent): it takes no workspace and sends none back",
                    e.name
                ),
            ));
        }
        // A pool's scripts live in a tmpfs of its scratch size (`/run/script`): one that
        // cannot fit there is refused, naming the limit; a script sent with the call before
        // it is stored (storing may evict other scripts), one named by digest once read.
        let space = f.plan.scratch_bytes;
        let too_large = |len: usize| {
            (len as u64 + 8192 > space).then(|| {
                fail(
                    ErrorCode::TooLarge,
                    format!(
                        "a script of {len} bytes does not fit {}'s script space of {} (its scratch size; raise scratch in sandbox.toml)",
                        e.name,
                        policy::limits::Bytes(space)
                    ),
                )
            })
        };
        if let (true, Some(proto::front::ScriptRef::Source(source))) = (pool, &e.script) {
            if let Some(refused) = too_large(source.len()) {
                return Some(refused);
            }
        }
        let mut script_write = None;
        let script = match (pool, e.script.take()) {
            (true, None) => {
                return Some(fail(
                    ErrorCode::BadRequest,
                    format!(
                    "{} is a runtime pool: a call to it names the script to run (zygo exec --script FILE or --digest SHA256; POST /runtimes/NAME/call with script or source; MCP call_function with code)",
                    e.name
                ),
                ))
            }
            (false, Some(_)) => {
                return Some(fail(
                    ErrorCode::BadRequest,
                    format!(
                        "{} is a function with its own handler; scripts are run by runtime pools",
                        e.name
                    ),
                ))
            }
            (false, None) => None,
            // A script sent with the call is stored for later calls off the event loop;
            // this call runs the bytes it carries meanwhile.
            (true, Some(r)) => {
                // What waits for the store writer is bounded: a caller past its bound
                // retries shortly.
                if let proto::front::ScriptRef::Source(src) = &r {
                    if let Err(m) = self.queued.room(who.tenant.as_deref(), src.len() as u64) {
                        return Some(Reply::Error {
                            code: ErrorCode::Busy,
                            message: m,
                            retry_after: Some(1),
                        });
                    }
                }
                let resolved =
                    self.scripts
                        .resolve(r, who.tenant.as_deref(), &script_in_flight(&self.calls));
                match resolved {
                    Ok((s, write)) => {
                        if let Some(w) = write {
                            script_write = Some(self.write_store(w, who.tenant.as_deref()));
                        }
                        Some(s)
                    }
                    Err((code, message)) => return Some(fail(code, message)),
                }
            }
        };
        let Some(f) = self.fns.get(&e.name) else {
            return Some(fail(
                ErrorCode::NotFound,
                format!("no function named {:?} is served", e.name),
            ));
        };
        if let Some(refused) = script.as_ref().and_then(|s| too_large(s.source.len())) {
            return Some(refused);
        }
        let mut timeout = f.spec.limits.timeout;
        if let Some(ms) = e.timeout_ms {
            timeout = timeout.min(Duration::from_millis(ms.max(1)));
        }
        // A tenant's limits narrow the function's: its timeout on the deadline here, the
        // rest on the child's cgroup when it is let go.
        if let Some(ms) = who.limits.timeout_ms {
            timeout = timeout.min(Duration::from_millis(ms.max(1)));
        }
        let narrow = narrowed(&f.limits, &who.limits);
        // Its secrets, before anything runs: a name without a value refuses the call
        // (`missing_secret`, naming it).
        // A shared sandbox (a pool, or a host function) given a tenant's stored values:
        // the call has its zygote to itself.
        let exclusive =
            !f.spec.secrets.is_empty() && (pool || (!e.name.contains('/') && who.tenant.is_some()));
        let secrets = match self.call_secrets(&e.name, who) {
            Ok(s) => s,
            Err(r) => return Some(r.into()),
        };
        let Some(f) = self.fns.get(&e.name) else {
            return Some(fail(ErrorCode::NotFound, "the function is gone"));
        };
        let id = match random_hex(16) {
            Ok(id) => id,
            Err(e) => return Some(fail(ErrorCode::Internal, format!("name the request: {e}"))),
        };
        let mut call = InFlight::new(client, &mut e, event, timeout, script, Instant::now());
        call.tenant = who.tenant.clone();
        call.narrow = narrow;
        call.scratch = who
            .limits
            .scratch_bytes
            .filter(|b| *b < f.plan.scratch_bytes);
        call.secrets = secrets;
        call.exclusive = exclusive;
        call.script_write = script_write;
        if cancelled {
            // Cancelled while its event was being checked: answered as a call cancelled
            // before it got a child.
            call.forced = Some(Outcome::Cancelled);
            self.calls.insert(id.clone(), call);
            self.finish(&id, None, None);
            return None;
        }
        self.calls.insert(id.clone(), call);
        if self.try_dispatch(&id) {
            return None;
        }
        // No parked child right now. Wait for one only where a zygote has room for it.
        let name = e.name;
        let f = self.fns.get(&name)?;
        // A zygote whose launcher has exited (its channel not yet closed) has no room and
        // holds nothing: it does not count against max_warm.
        let live: Vec<&super::Zygote> = f
            .zygotes
            .iter()
            .filter_map(|t| self.zygotes.get(t))
            .filter(|z| z.state != ZState::Dead)
            .collect();
        // A pool's call with secrets needs a zygote with nothing else running in it; no
        // call gets a child of a zygote such a call holds.
        // Nor does a call get a child of a zygote where another tenant's calls run.
        let tenant = who.tenant.as_deref();
        // A child whose call was answered does not count here: it is on its way out (and
        // hurried out once this call waits for it).
        let fits = |z: &super::Zygote| !z.children.keep_out(tenant, exclusive, false);
        let room_of = |z: &super::Zygote| if exclusive { 1 } else { z.children.room() };
        let mut room: usize = live.iter().filter(|z| fits(z)).map(|z| room_of(z)).sum();
        let mut waiting = f.pending.len();
        let max_warm = (f.spec.max_warm as usize).max(1);
        // A tenant's calls of a host function hold at most its share of the zygotes: past
        // it the call is busy for this tenant (others still have room), and at it the call
        // may wait only in the zygotes the tenant holds.
        if let Some(share) = self.share_of(&name, tenant) {
            let own: Vec<&super::Zygote> = live
                .iter()
                .copied()
                .filter(|z| z.children.held_by(tenant))
                .collect();
            let own_room: usize = own.iter().filter(|z| fits(z)).map(|z| room_of(z)).sum();
            let mine_waiting = f
                .pending
                .iter()
                .filter(|id| {
                    self.calls
                        .get(*id)
                        .is_some_and(|c| c.tenant.as_deref() == tenant)
                })
                .count();
            if over_share(own.len(), own_room, mine_waiting, exclusive, share) {
                self.calls.remove(&id);
                return Some(Reply::Error {
                    code: ErrorCode::Busy,
                    message: format!(
                        "{} is busy for this tenant: its calls hold {} of its {max_warm} zygote(s), a tenant's share (half of max_warm){}; retry shortly",
                        shown_name(&name),
                        own.len(),
                        if exclusive {
                            ", and a call with secrets has a zygote to itself"
                        } else {
                            ""
                        }
                    ),
                    retry_after: Some(1),
                });
            }
            if own.len() >= share {
                room = own_room;
                waiting = mine_waiting;
            }
        }
        match admit(room, waiting, live.len(), max_warm) {
            Admission::Wait => {}
            Admission::Grow => {
                if let Err(err) = self.spawn_zygote(&name, cx) {
                    self.calls.remove(&id);
                    return Some(fail(
                        ErrorCode::Unavailable,
                        format!("start another zygote of {name}: {err}"),
                    ));
                }
            }
            Admission::Busy => {
                self.calls.remove(&id);
                return Some(Reply::Error {
                    code: ErrorCode::Busy,
                    message: format!(
                        "{name} is busy: all {max_warm} zygote(s) are in use (each serves up to {SLOTS} calls of one tenant at a time{}); retry shortly",
                        if exclusive {
                            ", and a call with secrets has one to itself"
                        } else {
                            ""
                        }
                    ),
                    retry_after: Some(1),
                });
            }
        }
        if let Some(f) = self.fns.get_mut(&name) {
            f.pending.push_back(id);
        }
        self.hurry(&name);
        None
    }

    /// Calls waiting for a child of `name` that a child answered but not gone keeps out
    /// of its zygote (another tenant's, or one of them needs the zygote to itself): that
    /// child's cgroup is killed now rather than when [`LINGER`](super::timers) runs out,
    /// so the call waits a moment, not seconds. Its answer is out already; whatever it
    /// left running goes with it.
    pub(super) fn hurry(&mut self, name: &str) {
        let Some(f) = self.fns.get(name) else {
            return;
        };
        let waiting: Vec<(Option<&str>, bool)> = f
            .pending
            .iter()
            .filter_map(|id| self.calls.get(id))
            .map(|c| (c.tenant.as_deref(), c.exclusive))
            .collect();
        if waiting.is_empty() {
            return;
        }
        let mut slots = Vec::new();
        for t in &f.zygotes {
            let Some(z) = self.zygotes.get(t) else {
                continue;
            };
            for (k, s) in &z.children.slots {
                if s.answered.is_some()
                    && !s.hurried
                    && waiting.iter().any(|(t, x)| s.keeps_out(*t, *x))
                {
                    slots.push((*t, k.clone()));
                }
            }
        }
        for (t, k) in slots {
            if let Some(s) = self
                .zygotes
                .get_mut(&t)
                .and_then(|z| z.children.slots.get_mut(&k))
            {
                log::debug!("a call of {name} waits for an answered child of another tenant's to go: its cgroup is killed");
                s.hurried = true;
                kill_slot(&mut self.keeper, s.id);
            }
        }
    }

    /// The secrets a call of `name` gets, as files for its `/run/secrets/`. A function's:
    /// each value given at the shell when it was served, else its tenant's stored one. A
    /// pool's: the calling tenant's stored values, for this call only. A name without a
    /// value refuses the call with `missing_secret`, naming it.
    fn call_secrets(
        &self,
        name: &str,
        who: &Acting,
    ) -> Result<Vec<SecretFile>, crate::supervisor::api::Refusal> {
        use crate::supervisor::api::no;
        let Some(f) = self.fns.get(name) else {
            return Ok(Vec::new());
        };
        if f.spec.secrets.is_empty() {
            return Ok(Vec::new());
        }
        let shown = name.rsplit('/').next().unwrap_or(name);
        let mut out = Vec::with_capacity(f.spec.secrets.len());
        if is_pool(&f.spec) {
            let Some(tenant) = who.tenant.as_deref() else {
                return Err(no(
                    ErrorCode::MissingSecret,
                    format!(
                        "runtime pool {shown} gives each call the calling tenant's secrets ({}); \
                         a call made for no tenant has none: call it as a tenant (X-Zygo-Tenant)",
                        f.spec.secrets.join(", ")
                    ),
                ));
            };
            for (n, v) in self.api.secret_values(tenant, &f.spec.secrets)? {
                out.push(SecretFile {
                    name: n,
                    value: v.0,
                });
            }
        } else {
            // A tenant's function: its tenant's; a host function: the calling tenant's.
            let owner = name
                .split_once('/')
                .map(|(t, _)| t)
                .or(who.tenant.as_deref());
            for n in &f.spec.secrets {
                if let Some((_, v)) = f.shell_secrets.iter().find(|(k, _)| k == n) {
                    out.push(SecretFile {
                        name: n.clone(),
                        value: v.0.clone(),
                    });
                    continue;
                }
                let Some(t) = owner else {
                    return Err(no(
                        ErrorCode::MissingSecret,
                        format!(
                            "{shown} has no value for its secret {n}: serve it again with \
                             `zygo serve {shown} --secret {n}=VALUE`, or call it as a tenant \
                             that stored {n}"
                        ),
                    ));
                };
                for (k, v) in self.api.secret_values(t, std::slice::from_ref(n))? {
                    out.push(SecretFile {
                        name: k,
                        value: v.0,
                    });
                }
            }
        }
        let total: usize = out.iter().map(|s| s.value.len()).sum();
        if total > proto::launch::MAX_REQUEST_SECRET_BYTES {
            return Err(no(
                ErrorCode::TooLarge,
                format!(
                    "{shown}'s secrets are {total} bytes together; a request takes at most {}",
                    proto::launch::MAX_REQUEST_SECRET_BYTES
                ),
            ));
        }
        Ok(out)
    }

    /// The share of a host function's zygotes a call of `tenant` is held to (see
    /// [`tenant_share`]); `None` for the host's calls and a tenant's own functions.
    fn share_of(&self, name: &str, tenant: Option<&str>) -> Option<usize> {
        let f = self.fns.get(name)?;
        (tenant.is_some() && !name.contains('/'))
            .then(|| tenant_share((f.spec.max_warm as usize).max(1)))
    }

    /// How many live zygotes of `name` hold a call of `tenant`.
    fn held(&self, name: &str, tenant: Option<&str>) -> usize {
        self.fns.get(name).map_or(0, |f| {
            f.zygotes
                .iter()
                .filter_map(|t| self.zygotes.get(t))
                .filter(|z| z.state != ZState::Dead && z.children.held_by(tenant))
                .count()
        })
    }

    /// Give a call a parked child, if one is free. True when it was sent.
    fn try_dispatch(&mut self, id: &str) -> bool {
        let Some(c) = self.calls.get(id) else {
            return false;
        };
        let Some(f) = self.fns.get(&c.func) else {
            return false;
        };
        // A tenant at its share of a host function's zygotes gets a child only of one it
        // holds already.
        let at_share = self
            .share_of(&c.func, c.tenant.as_deref())
            .is_some_and(|share| self.held(&c.func, c.tenant.as_deref()) >= share);
        // (zygote, slot, frozen, idle)
        let mut best: Option<(Token, String, bool, bool)> = None;
        for t in &f.zygotes {
            let Some(z) = self.zygotes.get(t) else {
                continue;
            };
            if z.state != ZState::Ready || z.children.busy() >= SLOTS {
                continue;
            }
            if at_share && !z.children.held_by(c.tenant.as_deref()) {
                continue;
            }
            // Another tenant's calls run there, or ran and their children have not gone
            // yet, or a call that has the zygote to itself, or this call needs it to
            // itself: never beside them. Tenants never share a zygote at the same time:
            // its children share a loopback network, a pid namespace and a script space.
            if z.children.keep_out(c.tenant.as_deref(), c.exclusive, true) {
                continue;
            }
            if let Some(slot) = z.children.free_slot() {
                // Prefer a zygote that is not frozen, then one already serving this
                // tenant (an idle one is left for whoever comes next).
                let idle = z.children.busy() == 0;
                let better = |b: &(Token, String, bool, bool)| (z.frozen, idle) < (b.2, b.3);
                if best.as_ref().is_none_or(better) {
                    best = Some((*t, slot, z.frozen, idle));
                }
            }
        }
        let Some((zt, slot, frozen, _)) = best else {
            return false;
        };
        // A tenant's call of a host function runs in a cgroup of that tenant's
        // (`tenants/<tenant>/@<function>/…`): everything one tenant runs is in one place.
        let moved_for = c.tenant.clone().filter(|_| !c.func.contains('/'));
        let now = Instant::now();
        let Some(c) = self.calls.get_mut(id) else {
            return false;
        };
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return false;
        };
        if frozen {
            thaw(z);
        }
        if let Some(s) = z.children.slots.get_mut(&slot) {
            // The tenant's limits go on the child's own cgroup before it is let go: moved
            // into a cgroup of the tenant's (one kept from its last request of the
            // function, else a new one), or narrowed where it is (then it is not kept for
            // another request afterwards). The keeper does it, and hands back the view of
            // the cgroup the child is in now.
            let applied = match (&moved_for, c.narrow) {
                (None, None) => Ok(()),
                (tenant, narrow) => {
                    let asked = ToKeeper::PrepareSlot {
                        slot: s.id,
                        tenant: tenant.clone(),
                        limits: narrow.as_ref().map(crate::keeper::limits_msg),
                    };
                    let prepared = self.keeper.call(asked);
                    match (prepared.reply, prepared.view) {
                        (FromKeeper::Slot { .. }, Some(view)) => {
                            s.view = view;
                            Ok(())
                        }
                        (other, _) => Err(format!("{other:?}")),
                    }
                }
            };
            if let Err(e) = applied {
                log::error!("give a tenant's request its cgroup and limits: {e}");
                // That child is not used: it is let go of, and its cgroup released.
                if let Some(s) = z.children.slots.remove(&slot) {
                    z.conn.send(&ToLauncher::Reap { slot: slot.clone() });
                    self.keeper.call(ToKeeper::ReleaseSlot { slot: s.id });
                }
                self.parks.push_back(zt);
                if let Some(c) = self.calls.remove(id) {
                    self.outbox.push((
                        c.client,
                        fail(
                            ErrorCode::Internal,
                            format!("the tenant's cgroup and limits could not be applied: {e}"),
                        ),
                        true,
                    ));
                }
                return true;
            }
        }
        if let Some(s) = z.children.slots.get_mut(&slot) {
            s.request = Some(id.to_string());
            s.tenant = c.tenant.clone();
            s.exclusive = c.exclusive;
            // From now on this child is what a caller waits for.
            if let Err(e) = s.view.set_weight(Weight::Foreground) {
                log::warn!("raise a request's CPU weight: {e}");
            }
        }
        c.at = Some((zt, slot.clone()));
        c.started = Some(now);
        c.last_beat = now;
        z.last_used = now;
        let event = std::mem::take(&mut c.event);
        let script = c.script.take();
        let scratch_bytes = c.scratch;
        let secrets = std::mem::take(&mut c.secrets);
        z.conn.send(&ToLauncher::Call {
            slot,
            request_id: id.to_string(),
            event,
            script,
            workspace: c.workspace.take(),
            out: c.out,
            progress: c.stream,
            scratch_bytes,
            secrets,
        });
        // The spare this call used is replaced now, so the next call finds one: the new
        // child works at the background weight, so it does not slow this request down.
        self.park(zt);
        true
    }

    /// Give the calls waiting for a child of a function the children free now, in the
    /// order they came. A call that cannot have one of them (they are in a zygote where
    /// another tenant's calls run, or its secrets need a zygote to itself) keeps its
    /// place, and the calls behind it are tried.
    pub(super) fn dispatch_pending(&mut self, name: &str) {
        let waiting: Vec<String> = match self.fns.get(name) {
            Some(f) => f.pending.iter().cloned().collect(),
            None => return,
        };
        for id in waiting {
            if self.try_dispatch(&id) {
                if let Some(f) = self.fns.get_mut(name) {
                    f.pending.retain(|p| *p != id);
                }
            }
        }
        self.hurry(name);
    }

    /// The function cannot serve: every call waiting for it is refused.
    pub(super) fn fail_pending(&mut self, name: &str) {
        let Some(f) = self.fns.get_mut(name) else {
            return;
        };
        let why = match &f.state {
            FnState::Failed(w) => w.clone(),
            _ => "its zygote ended".into(),
        };
        let ids: Vec<String> = f.pending.drain(..).collect();
        for id in ids {
            if let Some(c) = self.calls.remove(&id) {
                // A tenant's call reads a fixed phrase, as in `exec`.
                let why = if c.tenant.is_some() {
                    super::stats::HOST_FAILURE
                } else {
                    why.as_str()
                };
                self.outbox.push((
                    c.client,
                    fail(
                        ErrorCode::Unavailable,
                        format!("{name} failed to serve: {why}"),
                    ),
                    true,
                ));
            }
        }
    }

    /// Output from a call's child: kept (up to [`OUTPUT_CAP`]), and sent on at once to a
    /// caller who streams.
    pub(super) fn output(&mut self, id: &str, stream: Stream, data: String) {
        if let Some(c) = self.calls.get_mut(id) {
            c.last_beat = Instant::now();
            if c.stream && !c.stream_cut {
                let ev = match stream {
                    Stream::Stdout => ExecEvent::Stdout(data.clone()),
                    Stream::Stderr => ExecEvent::Stderr(data.clone()),
                };
                self.outbox.push((c.client, Reply::Event(ev), false));
            }
            match stream {
                Stream::Stdout => c.stdout.push(&data),
                Stream::Stderr => c.stderr.push(&data),
            }
        }
    }

    /// Progress from a call's handler: sent on to a caller who streams.
    pub(super) fn progress(&mut self, id: &str, text: String) {
        if let Some(c) = self.calls.get_mut(id) {
            c.last_beat = Instant::now();
            if c.stream && !c.stream_cut {
                self.outbox
                    .push((c.client, Reply::Event(ExecEvent::Progress(text)), false));
            }
        }
    }

    /// A heartbeat from a call's child: it is not stuck.
    pub(super) fn child_beat(&mut self, id: &str) {
        if let Some(c) = self.calls.get_mut(id) {
            c.last_beat = Instant::now();
        }
    }

    /// The launcher could not hand a call's script to its child: nothing ran, and the
    /// call is refused as if before dispatch.
    pub(super) fn script_refused(&mut self, id: &str, too_large: bool, message: String) {
        if let Some(c) = self.calls.remove(id) {
            let reply = if too_large {
                fail(ErrorCode::TooLarge, message)
            } else {
                Reply::Error {
                    code: ErrorCode::Busy,
                    message,
                    retry_after: Some(1),
                }
            };
            self.outbox.push((c.client, reply, true));
        }
    }

    /// The launcher could not unpack a call's workspace: nothing ran, and the call is
    /// refused, naming the entry and the rule.
    pub(super) fn workspace_refused(&mut self, id: &str, too_large: bool, message: String) {
        if let Some(c) = self.calls.remove(id) {
            let code = if too_large {
                ErrorCode::TooLarge
            } else {
                ErrorCode::BadRequest
            };
            self.outbox.push((c.client, fail(code, message), true));
        }
    }

    /// A call's directory, packed after its handler answered: kept for its answer.
    pub(super) fn workspace_out(
        &mut self,
        id: &str,
        tar: Option<proto::bytes::Bytes>,
        truncated: bool,
    ) {
        if let Some(c) = self.calls.get_mut(id) {
            if c.out {
                c.workspace_out = tar;
                c.workspace_out_truncated = truncated;
            }
        }
    }

    /// A request's handler returned or raised: answer its caller at once.
    pub(super) fn answer_now(&mut self, zt: Token, slot: &str, t: Terminal) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        let Some(s) = z.children.slots.get_mut(slot) else {
            return;
        };
        let Some(id) = s.request.clone() else { return };
        if s.answered.is_some() {
            return;
        }
        s.answered = Some(Instant::now());
        let usage = s.view.usage().ok();
        let func = z.func.clone();
        self.settling.push((zt, slot.to_string()));
        match self.calls.get_mut(&id) {
            Some(c) if c.forced.is_none() => {
                c.terminal.get_or_insert(t);
            }
            // Already being killed (timeout, cancel): that outcome stands, answered when
            // the channel closes.
            _ => return,
        }
        self.finish(&id, usage, None);
        self.hurry(&func);
    }

    /// End a call from outside, and record why. A call with a child has its cgroup killed,
    /// and is answered when the launcher reports the child's channel closed; one still
    /// waiting for a child is answered now.
    pub(super) fn force(&mut self, id: &str, outcome: Outcome) {
        let Some(c) = self.calls.get_mut(id) else {
            return;
        };
        if c.forced.is_some() {
            return;
        }
        c.forced = Some(outcome);
        match c.at.clone() {
            Some((zt, slot)) => {
                if let Some(s) = self
                    .zygotes
                    .get(&zt)
                    .and_then(|z| z.children.slots.get(&slot))
                {
                    kill_slot(&mut self.keeper, s.id);
                }
            }
            None => {
                for f in self.fns.values_mut() {
                    f.pending.retain(|p| p != id);
                }
                self.finish(id, None, None);
            }
        }
    }

    /// `cancel`: end every call with this key that is the caller's: over the API, those
    /// made for the same tenant (or for the host, by an operator acting for nobody); from
    /// the host's CLI, every one. Over the API, none is `not_found`, the same answer
    /// whether the key is unknown, finished, or another tenant's.
    pub(super) fn cancel(&mut self, key: &str, who: &Acting) -> Reply {
        let ids: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.key.as_deref() == Some(key))
            .filter(|(_, c)| !who.api() || c.tenant == who.tenant)
            .map(|(id, _)| id.clone())
            .collect();
        // One-shot runs too: a tenant's own (an operator acting for nobody, like the
        // host's CLI, names every run under the key).
        let runs = self.cancel_runs(key, who.tenant.as_deref());
        let checking = self.cancel_checking(key, who);
        if ids.is_empty() && runs == 0 && checking == 0 && who.api() {
            return fail(
                ErrorCode::NotFound,
                format!("no request of yours is running under the key {key:?}"),
            );
        }
        for id in &ids {
            self.force(id, Outcome::Cancelled);
        }
        Reply::Cancelled {
            count: ids.len() as u32 + runs + checking,
        }
    }

    /// A front's connection closed: nobody waits for its calls any more.
    /// The front `t` is behind reading what it was sent: its streamed call makes no more
    /// events (its output is still kept, up to the cap), and its answer says so. A front's
    /// connection carries one call at a time, so this is at most one call.
    pub fn stream_behind(&mut self, t: Token) {
        for c in self.calls.values_mut() {
            if c.client == t && c.stream && !c.stream_cut {
                c.stream_cut = true;
                log::info!(
                    "a streamed call of {} makes no more events: its front has not read what it was sent",
                    c.func
                );
            }
        }
    }

    pub fn client_gone(&mut self, t: Token) {
        let ids: Vec<String> = self
            .calls
            .iter()
            .filter(|(_, c)| c.client == t)
            .map(|(id, _)| id.clone())
            .collect();
        for id in ids {
            self.force(&id, Outcome::Cancelled);
        }
        self.checking_client_gone(t);
        self.naming_client_gone(t);
        self.pending_serves.retain(|(c, _, _)| *c != t);
        self.pending_layers.retain(|(c, _, _, _)| *c != t);
        self.runs_client_gone(t);
    }

    /// A call's child is gone (the launcher reports its channel closed): a call still
    /// waiting for its answer ends now, with what its cgroup counted and how the child
    /// broke the protocol, if it did. If its zygote died meanwhile, the answer says so.
    pub(super) fn child_gone(
        &mut self,
        id: &str,
        usage: Option<Usage>,
        violation: Option<String>,
        zygote_dead: bool,
    ) {
        if zygote_dead {
            if let Some(c) = self.calls.get_mut(id) {
                c.terminal.get_or_insert(zygote_died());
            }
        }
        self.finish(id, usage, violation);
    }

    /// The zygote serving a call was killed: the call ends now, as an error saying so,
    /// unless it was already being ended from outside.
    pub(super) fn zygote_gone(&mut self, id: &str, usage: Option<Usage>) {
        if let Some(c) = self.calls.get_mut(id) {
            c.forced.get_or_insert(Outcome::Error);
            c.terminal.get_or_insert(zygote_died());
        }
        self.finish(id, usage, None);
    }

    /// A call is over: its outcome decided, its caller answered, the call logged and
    /// counted.
    pub(super) fn finish(&mut self, id: &str, usage: Option<Usage>, violation: Option<String>) {
        let Some(mut c) = self.calls.remove(id) else {
            return;
        };
        // The limit that applied: the caller's tenant's, where it narrowed the function's.
        let mem = match c.narrow.and_then(|l| l.mem_bytes) {
            Some(b) => policy::Bytes(b).to_string(),
            None => self
                .fns
                .get(&c.func)
                .map_or(String::new(), |f| f.mem_text.clone()),
        };
        let ending = Ending {
            forced: c.forced,
            terminal: c.terminal.take(),
            usage,
            violation,
        };
        let v = decide(ending, c.timeout, stuck_after(), &mem);
        let wall = c.started.map_or(Duration::ZERO, |s| s.elapsed());
        let metrics = metrics(wall, usage);
        let usage = self.record(id, &c, v.outcome, v.error.clone(), wall, metrics);
        let answer = ExecAnswer {
            request_id: id.to_string(),
            outcome: v.outcome,
            result: v.result,
            error: v.error,
            traceback: v.traceback,
            exit_code: v.exit_code,
            started: c.started.is_some(),
            oom_killed: v.oom_killed,
            stdout: c.stdout.text.clone(),
            stdout_truncated: c.stdout.truncated,
            stderr: c.stderr.text.clone(),
            stderr_truncated: c.stderr.truncated,
            metrics,
            usage: Some(Box::new(usage)),
            // The directory as the handler left it goes only with the handler's own answer
            // (not past a timeout or a cancel, which stand over it).
            workspace_out: if c.forced.is_none() {
                c.workspace_out.take()
            } else {
                None
            },
            workspace_out_truncated: c.workspace_out_truncated,
            stream_truncated: c.stream_cut,
        };
        let reply = (c.client, Reply::Answer(answer), true);
        // The script it carried is still being stored: the answer goes once it is.
        match c.script_write.filter(|t| self.queued.waiting(*t)) {
            Some(t) => self.after_write.entry(t).or_default().push(reply),
            None => self.outbox.push(reply),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::{Fake, Op};

    const TIMEOUT: Duration = Duration::from_secs(30);
    const STUCK: Duration = Duration::from_secs(60);

    /// What a call's caller is told, from what happened to it; `cg` is its cgroup, read
    /// as the supervisor reads it when the call ends.
    fn told(
        forced: Option<Outcome>,
        terminal: Option<Terminal>,
        cg: &Fake,
        violation: Option<&str>,
    ) -> Verdict {
        let ending = Ending {
            forced,
            terminal,
            usage: cg.boxed().usage().ok(),
            violation: violation.map(str::to_string),
        };
        decide(ending, TIMEOUT, STUCK, "64M")
    }

    fn returned(v: &str) -> Option<Terminal> {
        Some(Terminal::Returned(v.into()))
    }

    fn raised(message: &str, traceback: &str) -> Option<Terminal> {
        Some(Terminal::Raised {
            message: message.into(),
            traceback: traceback.into(),
            exit_code: None,
        })
    }

    #[test]
    fn a_handler_that_returns_is_ok_with_its_value() {
        let v = told(None, returned("{\"a\":1}"), &Fake::new(), None);
        assert_eq!(
            v,
            Verdict {
                outcome: Outcome::Ok,
                result: Some("{\"a\":1}".into()),
                error: None,
                traceback: None,
                oom_killed: false,
                exit_code: None,
            }
        );
    }

    #[test]
    fn a_handler_that_exited_has_its_exit_code_and_nothing_forced_does() {
        let exited = || {
            Some(Terminal::Raised {
                message: "SystemExit: 3".into(),
                traceback: String::new(),
                exit_code: Some(3),
            })
        };
        let v = told(None, exited(), &Fake::new(), None);
        assert_eq!((v.outcome, v.exit_code), (Outcome::Error, Some(3)));
        assert_eq!(v.error.as_deref(), Some("SystemExit: 3"));
        // Raised without exiting: none.
        let v = told(None, raised("ValueError: x", ""), &Fake::new(), None);
        assert_eq!(v.exit_code, None);
        // A reason from outside stands over it: the code is not the call's answer.
        let v = told(Some(Outcome::Timeout), exited(), &Fake::new(), None);
        assert_eq!((v.outcome, v.exit_code), (Outcome::Timeout, None));
    }

    #[test]
    fn a_handler_that_raises_is_an_error_with_its_message_and_traceback() {
        let v = told(None, raised("boom", "Traceback ..."), &Fake::new(), None);
        assert_eq!(v.outcome, Outcome::Error);
        assert_eq!(v.error.as_deref(), Some("boom"));
        assert_eq!(v.traceback.as_deref(), Some("Traceback ..."));
        // An empty traceback is no traceback.
        let v = told(None, raised("boom", ""), &Fake::new(), None);
        assert_eq!(v.traceback, None);
    }

    #[test]
    fn a_reason_from_outside_stands_over_the_handlers_answer() {
        let cases = [
            (Outcome::Timeout, "exceeded its 30s time limit"),
            (
                Outcome::Stuck,
                "sent no heartbeat for 1m and was killed as stuck",
            ),
            (Outcome::Cancelled, "cancelled"),
        ];
        for (forced, message) in cases {
            for terminal in [None, returned("1"), raised("boom", "tb")] {
                let v = told(Some(forced), terminal, &Fake::new(), None);
                assert_eq!(v.outcome, forced);
                assert_eq!(v.error.as_deref(), Some(message));
                assert_eq!((v.result, v.traceback), (None, None));
            }
        }
    }

    #[test]
    fn a_call_whose_zygote_died_is_an_error_saying_so() {
        let v = told(
            Some(Outcome::Error),
            Some(zygote_died()),
            &Fake::new(),
            None,
        );
        assert_eq!(v.outcome, Outcome::Error);
        assert_eq!(
            v.error.as_deref(),
            Some("the zygote serving this request died")
        );
        assert_eq!(v.traceback, None);
    }

    #[test]
    fn a_child_killed_by_the_oom_killer_is_an_error_naming_the_limit() {
        let cg = Fake::new().oom_killed(1);
        let v = told(None, None, &cg, None);
        assert_eq!(v.outcome, Outcome::Error);
        assert_eq!(v.error.as_deref(), Some("ran out of memory (limit 64M)"));
        assert!(v.oom_killed);
        // Even with a broken protocol: the OOM kill is why.
        let v = told(None, None, &Fake::new().oom_killed(2), Some("bad line"));
        assert_eq!(v.error.as_deref(), Some("ran out of memory (limit 64M)"));
    }

    #[test]
    fn an_oom_kill_is_reported_beside_an_answer_but_does_not_change_it() {
        let v = told(None, returned("1"), &Fake::new().oom_killed(1), None);
        assert_eq!((v.outcome, v.oom_killed), (Outcome::Ok, true));
        let v = told(
            Some(Outcome::Timeout),
            None,
            &Fake::new().oom_killed(1),
            None,
        );
        assert_eq!((v.outcome, v.oom_killed), (Outcome::Timeout, true));
    }

    #[test]
    fn a_child_that_ends_without_answering_is_an_error_saying_how() {
        let v = told(None, None, &Fake::new(), None);
        assert_eq!(v.outcome, Outcome::Error);
        assert_eq!(
            v.error.as_deref(),
            Some("the handler's process ended without answering")
        );
        let v = told(None, None, &Fake::new(), Some("a line that is not JSON"));
        assert_eq!(
            v.error.as_deref(),
            Some("the handler's process broke the agent protocol: a line that is not JSON")
        );
        // A cgroup that cannot be read counts no OOM kill.
        let v = told(None, None, &Fake::new().oom_killed(1).unreadable(), None);
        assert!(!v.oom_killed);
        assert_eq!(
            v.error.as_deref(),
            Some("the handler's process ended without answering")
        );
    }

    #[test]
    fn a_child_gone_without_an_answer_has_its_cgroup_killed_before_it_is_read() {
        let cg = Fake::new().holding(4242).reads(Usage {
            oom_kills: 1,
            peak_bytes: 64 << 20,
            cpu_usec: 2_500_000,
        });
        let mut keeper = LocalKeeper::detached();
        let z = keeper.adopt_zygote("hello", LocalKeeper::TEST_LIMITS, &Fake::new());
        let slot = keeper.adopt_slot(z, &cg);
        let usage = last_reading(&mut keeper, slot);
        assert_eq!(cg.ops(), [Op::Thaw, Op::KillAll, Op::Usage]);
        assert!(cg.pids().is_empty());
        assert_eq!(usage.map(|u| u.oom_kills), Some(1));
        let unreadable = keeper.adopt_slot(z, &Fake::new().unreadable());
        assert_eq!(last_reading(&mut keeper, unreadable), None);
    }

    #[test]
    fn metrics_are_the_wall_time_and_the_cgroups_readings() {
        let cg = Fake::new().reads(Usage {
            oom_kills: 0,
            peak_bytes: 10 << 20,
            cpu_usec: 12_345,
        });
        let m = metrics(Duration::from_micros(1_500_700), cg.boxed().usage().ok());
        assert_eq!(
            m,
            Metrics {
                wall_us: 1_500_700,
                cpu_us: 12_345,
                peak_rss_kb: 10 * 1024,
            }
        );
        // Fractional milliseconds where they are shown: a fast call is not 0.
        assert_eq!(proto::front::ms(m.wall_us), 1500.7);
        assert_eq!(proto::front::ms(m.cpu_us), 12.345);
        let unread = metrics(Duration::from_millis(3), None);
        assert_eq!((unread.cpu_us, unread.peak_rss_kb), (0, 0));
    }

    #[test]
    fn a_call_waits_only_where_a_zygote_has_room_else_grows_else_is_busy() {
        // room, waiting, zygotes, max_warm
        assert_eq!(admit(1, 0, 1, 1), Admission::Wait);
        assert_eq!(admit(4, 3, 1, 1), Admission::Wait);
        // As many waiting as there is room: another zygote, while there may be more.
        assert_eq!(admit(4, 4, 1, 2), Admission::Grow);
        assert_eq!(admit(0, 0, 0, 1), Admission::Grow);
        // No room and max_warm zygotes: refused at once, never queued.
        assert_eq!(admit(4, 4, 2, 2), Admission::Busy);
        assert_eq!(admit(0, 0, 1, 1), Admission::Busy);
    }

    #[test]
    fn a_tenant_holds_at_most_half_of_a_pools_zygotes() {
        assert_eq!([1, 2, 3, 4, 5, 8].map(tenant_share), [1, 1, 1, 2, 2, 4]);
        // own zygotes, room in them, calls of the tenant waiting, exclusive, share
        // Room in a zygote it holds: never over.
        assert!(!over_share(2, 1, 0, false, 2));
        // One more zygote needed, within the share.
        assert!(!over_share(1, 0, 0, false, 2));
        assert!(!over_share(1, 1, 4, false, 2));
        // At its share with no room left there: busy, for this tenant.
        assert!(over_share(2, 0, 0, false, 2));
        assert!(over_share(1, 1, 5, false, 2));
        // A call with secrets needs a zygote to itself: each one a zygote, unless one the
        // tenant holds has only answered calls left, on their way out.
        assert!(!over_share(1, 0, 0, true, 2));
        assert!(over_share(2, 0, 0, true, 2));
        assert!(over_share(1, 0, 1, true, 2));
        assert!(!over_share(1, 1, 0, true, 1));
        assert!(over_share(1, 1, 1, true, 1));
    }

    #[test]
    fn output_past_the_cap_is_cut_at_a_character_and_marked() {
        let mut c = Capped::new();
        c.push(&"a".repeat(OUTPUT_CAP - 1));
        assert!(!c.truncated);
        c.push("é");
        assert!(c.truncated);
        assert_eq!(c.text.len(), OUTPUT_CAP - 1);
        // A later chunk that would fit the room left is not kept after the cut.
        c.push("b");
        assert_eq!(c.text.len(), OUTPUT_CAP - 1);
        assert!(c.text.bytes().all(|b| b == b'a'));
    }
}
