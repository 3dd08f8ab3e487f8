//! Calls whose event is being checked off the loop (see `event_check`): each waits here,
//! with its request and its caller, until the checker hands its event back; then it goes
//! on through [`Functions::exec_as`] exactly as a call with a small event does at once.
//!
//! While it waits, a call is its caller's like any other: a cancel of its key ends it
//! (answered `cancelled` once its event is back, as a call cancelled before it got a
//! child), its caller leaving drops it (its event taken back from the checker if not yet
//! begun), its tenant's deletion answers it at once, and a drain refuses it as a call that
//! came during the drain.

use mio::Token;
use proto::front::{ErrorCode, ExecRequest, Reply};

use super::{fail, Ctx, Functions};
use crate::supervisor::api::Acting;
use crate::supervisor::event_check::{Checked, Done, Job, ON_LOOP};

/// A call waiting for its event's check.
pub(super) struct Waiting {
    client: Token,
    /// Its request, the event taken out (it is with the checker).
    e: ExecRequest,
    who: Acting,
    /// A cancel named its key meanwhile.
    cancelled: bool,
}

/// A call's event, checked and made one line, and whether the call was cancelled while
/// the event was being checked.
pub(super) struct Event {
    pub(super) text: String,
    pub(super) cancelled: bool,
}

impl Functions {
    /// Whether a call's event is checked off the loop: larger than [`ON_LOOP`], and not
    /// refused for its size (that refusal is the loop's, at once).
    pub(super) fn checked_away(e: &ExecRequest) -> bool {
        e.event.len() > ON_LOOP && e.event.len() <= super::MAX_EVENT
    }

    /// Hand a call's event to the checker; the call waits (`None`), or is refused `busy`
    /// when its caller (or everyone) has too much waiting already.
    pub(super) fn check_away(
        &mut self,
        client: Token,
        mut e: ExecRequest,
        who: &Acting,
    ) -> Option<Reply> {
        let event = std::mem::take(&mut e.event);
        match self.checker.send(who.tenant.clone(), Job::Event(event)) {
            Ok(ticket) => {
                self.checking.insert(
                    ticket,
                    Waiting {
                        client,
                        e,
                        who: who.clone(),
                        cancelled: false,
                    },
                );
                None
            }
            Err(message) => Some(Reply::Error {
                code: ErrorCode::Busy,
                message,
                retry_after: Some(1),
            }),
        }
    }

    /// The events the checker handed back: each call goes on (or is refused: a bad event,
    /// as it would have been on the loop; a drain begun meanwhile, as a call that came
    /// during it). A call whose caller left is dropped.
    pub(super) fn events_checked(&mut self, cx: &mut Ctx) {
        for Checked { ticket, done } in self.checker.done() {
            let result = match done {
                Done::Event(result) => result,
                Done::Digest { bytes, digest } => {
                    self.named(ticket, digest, bytes);
                    continue;
                }
            };
            let Some(w) = self.checking.remove(&ticket) else {
                continue;
            };
            let reply = if self.draining {
                Some(crate::supervisor::draining_refusal())
            } else {
                match result {
                    Err(message) => Some(fail(ErrorCode::BadRequest, message)),
                    Ok(text) => {
                        let event = Event {
                            text,
                            cancelled: w.cancelled,
                        };
                        self.exec_as(w.client, w.e, &w.who, cx, Some(event))
                    }
                }
            };
            if let Some(r) = reply {
                self.outbox.push((w.client, r, true));
            }
        }
    }

    /// A cancel of `key` by `who` (see `cancel`): the calls waiting for their event's check
    /// that it names are marked, and counted.
    pub(super) fn cancel_checking(&mut self, key: &str, who: &Acting) -> u32 {
        let mut n = 0;
        for w in self.checking.values_mut() {
            if w.e.key.as_deref() == Some(key) && (!who.api() || w.who.tenant == who.tenant) {
                w.cancelled = true;
                n += 1;
            }
        }
        n
    }

    /// The front `t` left: its call waiting for a check (at most one) is dropped.
    pub(super) fn checking_client_gone(&mut self, t: Token) {
        let gone: Vec<u64> = self
            .checking
            .iter()
            .filter(|(_, w)| w.client == t)
            .map(|(k, _)| *k)
            .collect();
        for ticket in gone {
            if let Some(w) = self.checking.remove(&ticket) {
                self.checker.withdraw(&w.who.tenant, ticket);
            }
        }
    }

    /// `tenant` was deleted: its calls waiting for a check are answered now.
    pub(super) fn checking_tenant_deleted(&mut self, tenant: &str) {
        let gone: Vec<u64> = self
            .checking
            .iter()
            .filter(|(_, w)| w.who.tenant.as_deref() == Some(tenant))
            .map(|(k, _)| *k)
            .collect();
        for ticket in gone {
            if let Some(w) = self.checking.remove(&ticket) {
                self.checker.withdraw(&w.who.tenant, ticket);
                self.outbox.push((
                    w.client,
                    fail(
                        ErrorCode::Unauthorized,
                        format!("tenant {tenant} was deleted before its call could start"),
                    ),
                    true,
                ));
            }
        }
    }

    /// The end of a drain: the checker stops, and the calls still waiting for it are
    /// refused as calls that came during the drain.
    pub(super) fn checking_shutdown(&mut self) {
        self.checker.finish();
        for (_, w) in self.checking.drain() {
            self.outbox
                .push((w.client, crate::supervisor::draining_refusal(), true));
        }
    }
}
