//! A zygote's lifecycle: its launcher started with its cgroup and plan, the messages on its
//! channel, its children parked and placed in cgroups of their own (by the cgroup worker),
//! frozen when idle and thawed, replaced when spent or dead, and killed.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream as StdUnixStream;
use std::path::Path;
use std::time::Instant;

use mio::{Interest, Token};
use proto::launch::{FromLauncher, Image, LaunchPlan, ToLauncher, MAX_LAUNCH_FRAME};

use super::registry::FnState;
use super::requests::{last_reading, usage_of, Terminal};
use super::{Ctx, Functions, SLOTS, SPARES};
use crate::cgroup::{CgroupView, Weight};
use plumbing::conn::Conn;
use plumbing::random_hex;
use proto::keeper::{FromKeeper, SlotId, ToKeeper, ZygoteId};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ZState {
    /// Its sandbox is being built, or its agent is importing.
    Starting,
    /// Its agent said it is ready: it parks children and serves calls.
    Ready,
    /// It ended, or could not start: what is left of it goes when its channel closes.
    Dead,
}

/// One child of a zygote, in a cgroup of its own: parked, or serving one request.
pub(super) struct Slot {
    /// Its cgroup, as the keeper named it; what the keeper does to it needs only this.
    pub(super) id: SlotId,
    /// Its cgroup's view: how it is frozen, thawed, weighed and read.
    pub(super) view: Box<dyn CgroupView>,
    /// The call it serves; `None` while it is parked.
    pub(super) request: Option<String>,
    /// When its request was answered: the child should exit at once; past a grace it
    /// is killed with its cgroup.
    pub(super) answered: Option<Instant>,
    /// The tenant of the call it was given (`None`: the host's), and whether that call
    /// has the zygote to itself (it carries a tenant's secrets). Both hold from the call's
    /// dispatch until the slot closes, answered or not: what the call left running is
    /// still beside whatever runs in the zygote until then.
    pub(super) tenant: Option<String>,
    pub(super) exclusive: bool,
    /// Answered, and its cgroup killed before [`LINGER`](super::timers) ran out because a
    /// call of another tenant (or one needing the zygote to itself) waits for it to go.
    pub(super) hurried: bool,
}

impl Slot {
    /// A parked child in the keeper's slot `id`.
    pub(super) fn parked(id: SlotId, view: Box<dyn CgroupView>) -> Slot {
        Slot {
            id,
            view,
            request: None,
            answered: None,
            tenant: None,
            exclusive: false,
            hurried: false,
        }
    }

    /// Whether a call waiting for a child, of `tenant` and needing a zygote to itself or
    /// not, may not run in this slot's zygote while this slot is open.
    pub(super) fn keeps_out(&self, tenant: Option<&str>, exclusive: bool) -> bool {
        self.request.is_some() && (self.exclusive || exclusive || self.tenant.as_deref() != tenant)
    }
}

/// A zygote's children, by what they are doing.
pub(super) struct Children {
    /// Parked or busy children, by slot name.
    pub(super) slots: HashMap<String, Slot>,
    /// Slots asked to park that have not registered yet, or whose cgroup is being made.
    pub(super) parking: Vec<String>,
    /// Slots registered, their cgroup being made by the worker.
    pub(super) placing: Vec<String>,
    /// Children it may still park, where each request takes a uid that is never given
    /// twice (see `identity`): at 0 the zygote is spent, serves the children it has, and is
    /// replaced. `None`: no limit (every request runs as the sandbox's one uid).
    pub(super) parks_left: Option<u32>,
}

impl Children {
    fn new(parks_left: Option<u32>) -> Children {
        Children {
            slots: HashMap::new(),
            parking: Vec::new(),
            placing: Vec::new(),
            parks_left,
        }
    }
    /// Whether it may park no more children.
    fn spent(&self) -> bool {
        self.parks_left == Some(0)
    }
    /// How many more requests it can take: a spent zygote only those its children can.
    pub(super) fn room(&self) -> usize {
        if self.spent() {
            self.parked() + self.parking.len() + self.placing.len()
        } else {
            SLOTS - self.busy().min(SLOTS)
        }
    }
    /// Children serving a request that has not been answered yet. (An answered child is
    /// on its way out: it no longer counts against the zygote's slots.)
    pub(super) fn busy(&self) -> usize {
        self.slots
            .values()
            .filter(|s| s.request.is_some() && s.answered.is_none())
            .count()
    }
    fn parked(&self) -> usize {
        self.slots.values().filter(|s| s.request.is_none()).count()
    }
    /// Whether a call of `tenant` (needing the zygote to itself or not) may not be given
    /// a child of this zygote now: a call of another tenant was given one, or a call that
    /// needs the zygote to itself, or this call needs it and any call was given one. A
    /// child whose call was answered counts until its slot closes (what it left running
    /// is there until then); with `answered_too` false it does not (it is on its way out).
    pub(super) fn keep_out(
        &self,
        tenant: Option<&str>,
        exclusive: bool,
        answered_too: bool,
    ) -> bool {
        self.slots
            .values()
            .filter(|s| answered_too || s.answered.is_none())
            .any(|s| s.keeps_out(tenant, exclusive))
    }
    /// Whether a call of `tenant` was given one of its children and that child's slot is
    /// still open (answered or not): until then the zygote is that tenant's, and counts
    /// against its share (see `requests::tenant_share`).
    pub(super) fn held_by(&self, tenant: Option<&str>) -> bool {
        self.slots
            .values()
            .any(|s| s.request.is_some() && s.tenant.as_deref() == tenant)
    }
    pub(super) fn free_slot(&self) -> Option<String> {
        self.slots
            .iter()
            .find(|(_, s)| s.request.is_none())
            .map(|(k, _)| k.clone())
    }
    /// How many more children to ask to park: up to [`SPARES`] parked or on their way,
    /// within [`SLOTS`] children in all and the parks it has left.
    fn to_park(&self) -> usize {
        let coming = self.parked() + self.parking.len() + self.placing.len();
        let room = SLOTS.saturating_sub(self.busy() + coming);
        SPARES
            .saturating_sub(coming)
            .min(room)
            .min(self.parks_left.map_or(usize::MAX, |n| n as usize))
    }
    /// Whether it has no child at all, parked, serving or on its way.
    fn none(&self) -> bool {
        self.slots.is_empty() && self.parking.is_empty() && self.placing.is_empty()
    }
    /// The call a slot's child serves.
    fn request(&self, slot: &str) -> Option<String> {
        self.slots.get(slot).and_then(|s| s.request.clone())
    }
}

pub(super) struct Zygote {
    /// The function it serves.
    pub(super) func: String,
    /// Its launcher's channel.
    pub(super) conn: Conn,
    child: crate::spawn::Launcher,
    /// Its cgroup, as the keeper named it.
    pub(super) id: ZygoteId,
    /// Its cgroup's view: how it is frozen and thawed.
    view: Box<dyn CgroupView>,
    pub(super) state: ZState,
    pub(super) children: Children,
    pub(super) last_used: Instant,
    /// When its agent last said it is alive.
    pub(super) last_beat: Instant,
    pub(super) frozen: bool,
    /// A spent zygote whose replacement has been started.
    replaced: bool,
}

impl Functions {
    /// Start a zygote of a function: its cgroup made with the function's limits, its
    /// launcher started with the function's plan.
    pub(super) fn spawn_zygote(&mut self, name: &str, cx: &mut Ctx) -> Result<(), String> {
        let f = self.fns.get(name).ok_or("no such function")?;
        let made = self.keeper.call(ToKeeper::MakeZygote {
            function: crate::keeper::fn_key(name),
        });
        let (id, view) = match (made.reply, made.view) {
            (FromKeeper::Zygote { zygote }, Some(view)) => (zygote, view),
            (FromKeeper::Refused { why }, _) => return Err(why),
            (other, _) => return Err(format!("the keeper made no zygote: {other:?}")),
        };
        let attach = made.files;
        let mut plan = f.plan.clone();
        if plan.image == Image::Host {
            plan.etc = crate::etc_cache::prepare();
        }
        let launcher = self.launcher.clone();
        let handed = f
            .handed
            .iter()
            .map(crate::mounts::copy)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("copy the function's mounts: {e}"));
        let started =
            handed.and_then(|handed| start_launcher(&launcher, attach, plan, &handed, cx));
        let (child, conn, t) = match started {
            Ok(s) => s,
            Err(e) => {
                // Its cgroup goes with it.
                self.keeper.call(ToKeeper::RemoveZygote { zygote: id });
                return Err(e);
            }
        };
        let now = Instant::now();
        self.zygotes.insert(
            t,
            Zygote {
                func: name.to_string(),
                conn,
                child,
                id,
                view,
                state: ZState::Starting,
                children: Children::new(f.plan.request_ids.map(|r| r.count)),
                last_used: now,
                last_beat: now,
                frozen: false,
                replaced: false,
            },
        );
        if let Some(f) = self.fns.get_mut(name) {
            f.zygotes.push(t);
        }
        Ok(())
    }

    /// Ask a ready zygote to park children until it has [`SPARES`] (see
    /// [`Children::to_park`]).
    pub(super) fn park(&mut self, zt: Token) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        if z.state != ZState::Ready {
            return;
        }
        let want = z.children.to_park();
        for _ in 0..want {
            self.counter += 1;
            let slot = match random_hex(3) {
                Ok(r) => format!("s{}{r}", self.counter),
                Err(e) => {
                    log::error!("name a child to park: {e}; parking none now");
                    return;
                }
            };
            if let Some(z) = self.zygotes.get_mut(&zt) {
                z.children.parking.push(slot.clone());
                if let Some(n) = z.children.parks_left.as_mut() {
                    *n -= 1;
                }
                z.conn.send(&ToLauncher::Park { slot });
            }
        }
    }

    /// A spent zygote (see `Children::parks_left`) gets a replacement as soon as it is spent,
    /// and is ended once its last child is gone: no request id is ever given twice.
    pub(super) fn retire_if_spent(&mut self, zt: Token, cx: &mut Ctx) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        if !z.children.spent() || z.state != ZState::Ready {
            return;
        }
        let name = z.func.clone();
        if !z.replaced {
            z.replaced = true;
            log::info!("a zygote of {name} has given every request id it had; replacing it");
            if let Err(e) = self.spawn_zygote(&name, cx) {
                log::error!("replace a spent zygote of {name}: {e}");
            }
        }
        let Some(z) = self.zygotes.get(&zt) else {
            return;
        };
        if z.children.none() {
            self.kill_zygote(zt, cx);
        }
    }

    /// Kill a zygote: its launcher, every cgroup it had, and end its calls.
    pub(super) fn kill_zygote(&mut self, zt: Token, cx: &Ctx) {
        let Some(mut z) = self.zygotes.remove(&zt) else {
            return;
        };
        z.conn.send(&ToLauncher::Kill);
        let _ = cx.reg.deregister(&mut z.conn.stream);
        let _ = z.child.kill();
        let _ = z.child.wait();
        // The keeper removes its cgroup and its slots', and says what each counted.
        let counted = match self
            .keeper
            .call(ToKeeper::RemoveZygote { zygote: z.id })
            .reply
        {
            FromKeeper::Removed { slots } => slots.into_iter().collect(),
            other => {
                log::warn!("remove a zygote's cgroups: {other:?}");
                HashMap::new()
            }
        };
        for (_, s) in z.children.slots.drain() {
            if let Some(id) = s.request {
                let usage = counted.get(&s.id).copied().flatten().map(usage_of);
                self.zygote_gone(&id, usage);
            }
        }
        if let Some(f) = self.fns.get_mut(&z.func) {
            f.zygotes.retain(|t| *t != zt);
        }
    }

    /// Something happened on a launcher's channel.
    pub fn zygote_event(&mut self, zt: Token, cx: &mut Ctx) {
        if self.run_event(zt, cx) {
            return;
        }
        let Some(z) = self.zygotes.get_mut(&zt) else {
            return;
        };
        z.conn.flush();
        let (msgs, end) = match z.conn.receive::<FromLauncher>() {
            Ok((m, eof)) => (
                m,
                if eof {
                    Some("its launcher closed the channel".to_string())
                } else {
                    None
                },
            ),
            Err(e) => (Vec::new(), Some(format!("launcher channel: {e}"))),
        };
        for m in msgs {
            if let Err(why) = self.launcher_msg(zt, m, cx) {
                log::error!("zygote protocol: {why}; replacing the zygote");
                self.zygote_died(zt, &why, cx);
                return;
            }
        }
        if let Some(why) = end {
            self.zygote_died(zt, &why, cx);
        }
    }

    /// A zygote ended (its channel closed, it broke the protocol, its agent went silent):
    /// it is killed with its calls, and replaced unless its function never served.
    pub(super) fn zygote_died(&mut self, zt: Token, why: &str, cx: &mut Ctx) {
        let Some(z) = self.zygotes.get(&zt) else {
            return;
        };
        let name = z.func.clone();
        let was_ready = z.state == ZState::Ready;
        if z.state != ZState::Dead {
            log::warn!("a zygote of {name} ended: {why}");
        }
        self.kill_zygote(zt, cx);
        let Some(f) = self.fns.get_mut(&name) else {
            return;
        };
        if f.state == FnState::Starting && !was_ready && f.zygotes.is_empty() {
            f.state = FnState::Failed(why.to_string());
            self.fail_pending(&name);
            return;
        }
        if matches!(f.state, FnState::Failed(_)) {
            return;
        }
        // Replace it, so the function keeps min_warm zygotes.
        if f.zygotes.len() < f.min_warm {
            if let Err(e) = self.spawn_zygote(&name, cx) {
                log::error!("replace a zygote of {name}: {e}");
            }
        }
    }

    /// One message from a zygote's launcher: what each may say, and in which state.
    /// An error ends the zygote.
    fn launcher_msg(&mut self, zt: Token, m: FromLauncher, cx: &mut Ctx) -> Result<(), String> {
        let z = self.zygotes.get_mut(&zt).ok_or("no such zygote")?;
        match m {
            FromLauncher::Cloned { pid } if z.state == ZState::Starting => {
                let placed = self.keeper.call(ToKeeper::PlaceInit { zygote: z.id, pid });
                let reply = match placed.reply {
                    FromKeeper::Done => ToLauncher::Proceed,
                    other => {
                        log::error!("place a zygote in its cgroup: {other:?}");
                        ToLauncher::Kill
                    }
                };
                z.conn.send(&reply);
            }
            FromLauncher::Started if z.state == ZState::Starting => {}
            FromLauncher::Ready if z.state == ZState::Starting => {
                z.state = ZState::Ready;
                z.last_beat = Instant::now();
                let name = z.func.clone();
                if let Some(f) = self.fns.get_mut(&name) {
                    if f.state == FnState::Starting {
                        log::info!("{name} is serving");
                    }
                    f.state = FnState::Serving;
                }
                self.park(zt);
            }
            FromLauncher::ImportError { message, traceback } if z.state == ZState::Starting => {
                let name = z.func.clone();
                z.state = ZState::Dead;
                let text = if traceback.is_empty() {
                    message
                } else {
                    format!("{message}\n{traceback}")
                };
                log::error!("{name} failed to serve: {text}");
                if let Some(f) = self.fns.get_mut(&name) {
                    f.state = FnState::Failed(text);
                }
                self.fail_pending(&name);
            }
            FromLauncher::Failed { phase, reason } => {
                let name = z.func.clone();
                z.state = ZState::Dead;
                let text = format!(
                    "the sandbox could not be built ({}): {reason}",
                    phase.as_str()
                );
                if let Some(f) = self.fns.get_mut(&name) {
                    if f.state == FnState::Starting {
                        f.state = FnState::Failed(text.clone());
                    }
                }
                self.fail_pending(&name);
                return Err(text);
            }
            FromLauncher::Heartbeat if z.state == ZState::Ready => z.last_beat = Instant::now(),
            FromLauncher::Parked { slot, pid } => {
                let pos = z
                    .children
                    .parking
                    .iter()
                    .position(|s| *s == slot)
                    .ok_or("a slot nobody asked to park")?;
                z.children.parking.remove(pos);
                // The keeper checks that the child is the zygote's and gives it a cgroup
                // of its own: one kept from an earlier request here and now, usually, else
                // a new one off its loop (an event says how that went).
                let asked = ToKeeper::PlaceSpare {
                    zygote: z.id,
                    slot: slot.clone(),
                    pid,
                };
                let placed = self.keeper.call(asked);
                match (placed.reply, placed.view) {
                    (FromKeeper::Slot { id, .. }, Some(view)) => {
                        self.slot_placed(zt, slot, id, view);
                    }
                    (FromKeeper::Placing, _) => z.children.placing.push(slot),
                    (other, _) => {
                        log::warn!("a zygote of {} parked a child ({pid}) that was not placed: {other:?}; dropping the slot", z.func);
                        z.conn.send(&ToLauncher::Reap { slot });
                        self.parks.push_back(zt);
                    }
                }
            }
            FromLauncher::ScriptRefused {
                slot,
                too_large,
                message,
            } => {
                if let Some(id) = z.children.request(&slot) {
                    self.script_refused(&id, too_large, message);
                }
            }
            FromLauncher::WorkspaceRefused {
                slot,
                too_large,
                message,
            } => {
                if let Some(id) = z.children.request(&slot) {
                    self.workspace_refused(&id, too_large, message);
                }
            }
            FromLauncher::WorkspaceOut {
                slot,
                tar,
                truncated,
            } => {
                if let Some(id) = z.children.request(&slot) {
                    self.workspace_out(&id, tar, truncated);
                }
            }
            FromLauncher::ParkFailed { slot, message } => {
                z.children.parking.retain(|s| *s != slot);
                log::warn!("a zygote of {} could not park a child: {message}", z.func);
                self.retire_if_spent(zt, cx);
            }
            FromLauncher::Output { slot, stream, data } => {
                if let Some(id) = z.children.request(&slot) {
                    self.output(&id, stream, data);
                }
            }
            FromLauncher::Progress { slot, text } => {
                if let Some(id) = z.children.request(&slot) {
                    self.progress(&id, text);
                }
            }
            FromLauncher::ChildHeartbeat { slot } => {
                if let Some(id) = z.children.request(&slot) {
                    self.child_beat(&id);
                }
            }
            // The terminal line: every output line came before it on the same channel, so
            // the caller is answered now; the child's exit and its cgroup's removal follow
            // off the request path.
            FromLauncher::Returned { slot, value } => {
                self.answer_now(zt, &slot, Terminal::Returned(value));
            }
            FromLauncher::Raised {
                slot,
                message,
                traceback,
                exit_code,
            } => {
                self.answer_now(
                    zt,
                    &slot,
                    Terminal::Raised {
                        message,
                        traceback,
                        exit_code,
                    },
                );
            }
            FromLauncher::SlotClosed { slot, violation } => {
                let zygote_dead = z.state == ZState::Dead;
                let Some(s) = z.children.slots.remove(&slot) else {
                    z.children.parking.retain(|p| *p != slot);
                    z.children.placing.retain(|p| *p != slot);
                    return Ok(());
                };
                // The launcher has dropped the child already; the agent cleans up after it
                // when it exits.
                // A call still waiting for its answer (killed, died, out of memory) reads
                // what its cgroup counted now, after what is left in it is killed.
                let unanswered = s
                    .request
                    .as_ref()
                    .is_some_and(|id| self.calls.contains_key(id));
                let usage = if unanswered {
                    last_reading(&mut self.keeper, s.id)
                } else {
                    None
                };
                // The keeper kills what the child left running (before another call can be
                // given a child of this zygote: that call may be another tenant's), then
                // keeps the cgroup for the next request it can serve as it is, or removes
                // it.
                if let FromKeeper::Refused { why } =
                    self.keeper.call(ToKeeper::ReleaseSlot { slot: s.id }).reply
                {
                    log::warn!("release a request's cgroup: {why}");
                }
                self.parks.push_back(zt);
                if let Some(id) = s.request {
                    self.child_gone(&id, usage, violation, zygote_dead);
                }
                if let Some(z) = self.zygotes.get(&zt) {
                    let func = z.func.clone();
                    self.dispatch_pending(&func);
                }
                self.retire_if_spent(zt, cx);
            }
            FromLauncher::Exited { .. } => {
                z.state = ZState::Dead;
            }
            other => return Err(format!("unexpected {other:?}")),
        }
        Ok(())
    }

    /// A thread off the loop woke it: the keeper placed parked children (their slots are
    /// ready), the store writer wrote, the checker checked events.
    pub fn worker_done(&mut self, cx: &mut Ctx) {
        for a in self.keeper.events() {
            self.keeper_event(a);
        }
        self.store_written();
        self.events_checked(cx);
    }

    /// A placement the keeper finished off its loop: the slot is ready (or, if placing it
    /// failed, the launcher lets the child go).
    fn keeper_event(&mut self, a: crate::keeper::Answer) {
        let (zygote, slot, placed) = match a.reply {
            FromKeeper::Slot { zygote, slot, id } => (zygote, slot, a.view.map(|v| (id, v))),
            FromKeeper::PlaceFailed { zygote, slot, why } => {
                log::error!("give a parked child its cgroup: {why}");
                (zygote, slot, None)
            }
            other => {
                log::error!("an event from the keeper that is not one: {other:?}");
                return;
            }
        };
        let zt = self
            .zygotes
            .iter()
            .find(|(_, z)| z.id == zygote && z.state != ZState::Dead)
            .map(|(t, _)| *t);
        let waiting = zt.and_then(|t| {
            let z = self.zygotes.get_mut(&t)?;
            let i = z.children.placing.iter().position(|s| *s == slot)?;
            z.children.placing.remove(i);
            Some(t)
        });
        match (waiting, placed) {
            (Some(zt), Some((id, view))) => self.slot_placed(zt, slot, id, view),
            (Some(zt), None) => {
                // The launcher lets go of the child's channel, and a parked child whose
                // channel closes before a request exits (it is still in the zygote's
                // cgroup meanwhile). No kill by pid: that pid may be someone else's by now.
                if let Some(z) = self.zygotes.get_mut(&zt) {
                    z.conn.send(&ToLauncher::Reap { slot });
                    let func = z.func.clone();
                    self.dispatch_pending(&func);
                }
            }
            (None, Some((id, _))) => {
                // Its zygote or the child went away meanwhile.
                self.keeper.call(ToKeeper::ReleaseSlot { slot: id });
            }
            (None, None) => {}
        }
    }

    /// A parked child has its cgroup: its slot is ready.
    fn slot_placed(&mut self, zt: Token, slot: String, id: SlotId, view: Box<dyn CgroupView>) {
        let Some(z) = self.zygotes.get_mut(&zt) else {
            self.keeper.call(ToKeeper::ReleaseSlot { slot: id });
            return;
        };
        if z.frozen {
            let _ = view.freeze();
        }
        z.children.slots.insert(slot, Slot::parked(id, view));
        let func = z.func.clone();
        self.dispatch_pending(&func);
    }

    /// Whether background work is waiting (the loop then polls without sleeping).
    pub fn has_background(&self) -> bool {
        !self.parks.is_empty() || !self.settling.is_empty()
    }

    /// Lower the weight of what was answered, or replace one spare.
    pub fn background_step(&mut self) {
        if !self.settling.is_empty() {
            for (zt, slot) in std::mem::take(&mut self.settling) {
                let Some(s) = self
                    .zygotes
                    .get(&zt)
                    .and_then(|z| z.children.slots.get(&slot))
                else {
                    continue;
                };
                if let Err(e) = s.view.set_weight(Weight::Background) {
                    log::debug!("lower an answered request's CPU weight: {e}");
                }
            }
        } else if let Some(zt) = self.parks.pop_front() {
            self.park(zt);
        }
    }

    /// SIGCHLD: a zygote whose launcher exited is dead (its channel's close follows).
    pub fn reap_launchers(&mut self) {
        for z in self.zygotes.values_mut() {
            if let Ok(Some(_)) = z.child.try_wait() {
                z.state = ZState::Dead;
            }
        }
    }
}

/// Start a zygote's launcher with its cgroup's attach files (`attach`, from the keeper)
/// and its plan: the launcher
/// process, its connection (registered with the loop) and the connection's token. Whatever
/// was started is stopped again if a later step fails.
fn start_launcher(
    launcher: &Path,
    attach: Vec<OwnedFd>,
    plan: LaunchPlan,
    handed: &[OwnedFd],
    cx: &mut Ctx,
) -> Result<(crate::spawn::Launcher, Conn, Token), String> {
    let (mon, launcher_end) = StdUnixStream::pair().map_err(|e| format!("socketpair: {e}"))?;
    let launcher_end = OwnedFd::from(launcher_end);
    // The agent's own stdout and stderr (not the requests') go to the supervisor's log.
    let log_out = std::io::stderr()
        .as_fd_dup()
        .map_err(|e| format!("dup stderr: {e}"))?;
    let log_err = std::io::stderr()
        .as_fd_dup()
        .map_err(|e| format!("dup stderr: {e}"))?;
    let fds = crate::spawn::LauncherFds {
        stdin: None,
        stdout: &log_out,
        channel: &launcher_end,
        program_stderr: &log_err,
    };
    let mut child = crate::spawn::spawn_launcher(launcher, fds)
        .map_err(|e| format!("start the launcher: {e}"))?;
    drop((log_out, launcher_end, log_err));
    let mut stop = |why: String| {
        let _ = child.kill();
        let _ = child.wait();
        why
    };
    // The launcher's first frame, on a fresh socket: it cannot block.
    if let Err(e) = crate::oneshot::send_cgroup_files(&mon, &attach) {
        return Err(stop(format!(
            "send the zygote's cgroup to the launcher: {e}"
        )));
    }
    drop(attach);
    if let Err(e) = crate::mounts::send(&mon, handed) {
        return Err(stop(format!("send the mounts to the launcher: {e}")));
    }
    if let Err(e) = mon.set_nonblocking(true) {
        return Err(stop(e.to_string()));
    }
    let mut stream = mio::net::UnixStream::from_std(mon);
    let t = cx.token();
    if let Err(e) = cx
        .reg
        .register(&mut stream, t, Interest::READABLE | Interest::WRITABLE)
    {
        return Err(stop(format!("register the launcher: {e}")));
    }
    let mut conn = Conn::new(stream, MAX_LAUNCH_FRAME);
    conn.send(&ToLauncher::Start(Box::new(plan)));
    Ok((child, conn, t))
}

trait DupFd {
    fn as_fd_dup(&self) -> std::io::Result<OwnedFd>;
}

impl DupFd for std::io::Stderr {
    fn as_fd_dup(&self) -> std::io::Result<OwnedFd> {
        use std::os::fd::AsFd;
        self.as_fd().try_clone_to_owned()
    }
}

/// Thaw a frozen zygote and its children.
pub(super) fn thaw(z: &mut Zygote) {
    let _ = z.view.thaw();
    for s in z.children.slots.values() {
        let _ = s.view.thaw();
    }
    z.frozen = false;
    z.last_beat = Instant::now();
}

/// Freeze an idle zygote and its children.
pub(super) fn freeze(z: &mut Zygote) {
    let _ = z.view.freeze();
    for s in z.children.slots.values() {
        let _ = s.view.freeze();
    }
    z.frozen = true;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::fake::Fake;

    /// A child in a cgroup of its own: parked (`None`), or serving a call.
    fn child(request: Option<&str>) -> Slot {
        Slot {
            request: request.map(str::to_string),
            ..Slot::parked(SlotId(0), Box::new(Fake::new()))
        }
    }

    fn children(parks_left: Option<u32>, slots: Vec<Slot>) -> Children {
        let mut c = Children::new(parks_left);
        for (i, s) in slots.into_iter().enumerate() {
            c.slots.insert(format!("s{i}"), s);
        }
        c
    }

    fn serving(n: usize) -> Vec<Slot> {
        (0..n).map(|i| child(Some(&format!("r{i}")))).collect()
    }

    #[test]
    fn a_zygote_with_every_slot_serving_has_no_room() {
        let c = children(None, serving(SLOTS));
        assert_eq!((c.busy(), c.room(), c.to_park()), (SLOTS, 0, 0));
        assert_eq!(c.free_slot(), None);
    }

    #[test]
    fn an_answered_child_no_longer_counts_against_the_slots() {
        let mut slots = serving(SLOTS);
        slots[0].answered = Some(Instant::now());
        let c = children(None, slots);
        assert_eq!((c.busy(), c.room()), (SLOTS - 1, 1));
        // Its slot is not free (it still serves its call), but a spare may be parked.
        assert_eq!(c.free_slot(), None);
        assert_eq!(c.to_park(), 1);
    }

    /// A slot given to tenant `t`'s call (exclusive or not), answered or not.
    fn given(t: Option<&str>, exclusive: bool, answered: bool) -> Slot {
        Slot {
            tenant: t.map(str::to_string),
            exclusive,
            answered: answered.then(Instant::now),
            ..child(Some("r"))
        }
    }

    #[test]
    fn an_answered_child_keeps_other_tenants_out_until_its_slot_closes() {
        // Tenant a's call was answered; its child has not gone yet.
        let c = children(None, vec![given(Some("a"), false, true), child(None)]);
        // a's next call may go beside it; b's, the host's and one needing the zygote to
        // itself may not, until the slot closes.
        assert!(!c.keep_out(Some("a"), false, true));
        assert!(c.keep_out(Some("b"), false, true));
        assert!(c.keep_out(None, false, true));
        assert!(c.keep_out(Some("a"), true, true));
        // Counting room, it is on its way out (it is hurried out once a call waits).
        assert!(!c.keep_out(Some("b"), false, false));
        assert!(!c.keep_out(Some("a"), true, false));
        // One that has not answered keeps them out either way.
        let c = children(None, vec![given(Some("a"), false, false), child(None)]);
        assert!(c.keep_out(Some("b"), false, false));
        // A call with secrets, answered: nobody else, not even its own tenant, until its
        // slot closes.
        let c = children(None, vec![given(Some("a"), true, true), child(None)]);
        assert!(c.keep_out(Some("a"), false, true));
        assert!(!c.keep_out(Some("a"), false, false));
        // Parked children alone keep nobody out.
        let c = children(None, vec![child(None), child(None)]);
        assert!(!c.keep_out(Some("b"), true, true));
    }

    #[test]
    fn a_zygote_keeps_its_spares_parked_within_its_slots() {
        assert_eq!(children(None, Vec::new()).to_park(), SPARES);
        assert_eq!(children(None, serving(1)).to_park(), SPARES.min(SLOTS - 1));
        assert_eq!(children(None, serving(2)).to_park(), SLOTS - 2);
        // Spares on their way count: one parked, one registering, one being placed.
        let mut c = children(None, vec![child(None)]);
        c.parking.push("p".into());
        c.placing.push("q".into());
        assert_eq!(c.to_park(), SPARES - 3);
        assert_eq!(c.free_slot(), Some("s0".to_string()));
    }

    #[test]
    fn a_spent_zygote_parks_no_more_and_takes_only_what_its_children_can() {
        let mut c = children(Some(0), vec![child(None), child(Some("r"))]);
        c.parking.push("p".into());
        assert!(c.spent());
        assert_eq!(c.to_park(), 0);
        // The parked child and the one registering; not the slots left.
        assert_eq!(c.room(), 2);
        assert!(!c.none());
        assert!(children(Some(0), Vec::new()).none());
        assert_eq!(children(Some(0), Vec::new()).room(), 0);
        // One uid left: one more child, whatever the spares want.
        assert_eq!(children(Some(1), Vec::new()).to_park(), 1);
    }
}
