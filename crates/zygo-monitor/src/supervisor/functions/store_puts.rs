//! `PUT /scripts` (`scripts put`) and `PUT /blobs`: bytes stored for the acting tenant (if
//! any). Bytes past `event_check::ON_LOOP` are named (SHA-256) by the checker thread, in
//! their holder's turn, rather than on the event loop. The store reserves a new entry's room at once (within the tenant's share); its
//! bytes are written and synced by the store writer, off the event loop, and the caller is
//! answered once they are durable. Bytes the store holds already are answered at once to
//! a caller that held them already (or the host); a tenant taking on bytes others hold, or
//! are writing, is answered after an echo of the write (see `store_writer`), so the time
//! an answer takes says nothing about other tenants. What waits for the writer is bounded
//! per holder and in all: past that a put is refused `busy`.

use mio::Token;
use proto::front::{ErrorCode, Reply};

use super::blobs::{blob_in_flight, BLOB_OWNERS_SLACK};
use super::{fail, script_in_flight, Functions, SCRIPT_OWNERS_SLACK};
use crate::supervisor::api::Acting;
use crate::supervisor::event_check::{self, Job, ON_LOOP};
use crate::supervisor::scripts::Put;
use crate::supervisor::store_writer::{Which, Write, Written};

/// A put waiting for the checker to name its bytes.
pub(super) struct Naming {
    which: Which,
    client: Token,
    who: Acting,
}

/// A caller waiting for a store write to end.
pub(super) struct StoreWait {
    client: Token,
    tenant: Option<String>,
    /// When its tenant was made: a tenant deleted and made again under the same id while
    /// the bytes were written is somebody else, and nothing is registered for it.
    created_ms: Option<u64>,
    size: u64,
}

/// A caller waiting for the echo of a put of bytes the store held (or was writing) for
/// others.
pub(super) struct EchoWait {
    which: Which,
    digest: String,
    wait: StoreWait,
    /// The store held the bytes when they were put (not only being written).
    in_store: bool,
}

impl Functions {
    /// `scripts put`: store a script for calls to name by its digest, registered against
    /// the acting tenant (if any). `None`: answered once its bytes are written.
    pub(super) fn put_script(
        &mut self,
        client: Token,
        source: Vec<u8>,
        who: &Acting,
    ) -> Option<Reply> {
        self.put_bytes(Which::Scripts, client, source, who)
    }

    /// `PUT /blobs`: store the bytes, owned by the acting tenant (if any). `None`:
    /// answered once they are written.
    pub(super) fn put_blob(
        &mut self,
        client: Token,
        bytes: Vec<u8>,
        who: &Acting,
    ) -> Option<Reply> {
        self.put_bytes(Which::Blobs, client, bytes, who)
    }

    /// A put: bytes of up to [`ON_LOOP`] are named (SHA-256) here and stored at once;
    /// larger ones are named by the checker, off the loop, in their holder's turn, and the
    /// put goes on in [`Functions::put_named`] when they come back.
    fn put_bytes(
        &mut self,
        which: Which,
        client: Token,
        bytes: Vec<u8>,
        who: &Acting,
    ) -> Option<Reply> {
        if let Err((code, message)) = self.store_of(which).fits(bytes.len()) {
            return Some(fail(code, message));
        }
        if let Err(m) = self.queued.room(who.tenant.as_deref(), bytes.len() as u64) {
            return Some(busy(m));
        }
        if bytes.len() <= ON_LOOP {
            let digest = event_check::digest(&bytes);
            return self.put_named(which, client, digest, &bytes, who);
        }
        match self.checker.send(who.tenant.clone(), Job::Digest(bytes)) {
            Ok(ticket) => {
                self.naming.insert(
                    ticket,
                    Naming {
                        which,
                        client,
                        who: who.clone(),
                    },
                );
                None
            }
            Err(m) => Some(busy(m)),
        }
    }

    /// A put whose bytes are named: stored (their room reserved, their write handed to
    /// the writer), or refused. `None`: answered once they are written.
    pub(super) fn put_named(
        &mut self,
        which: Which,
        client: Token,
        digest: String,
        bytes: &[u8],
        who: &Acting,
    ) -> Option<Reply> {
        let tenant = who.tenant.as_deref();
        // Checked again: the writer's line may have grown while the bytes were named.
        if let Err(m) = self.queued.room(tenant, bytes.len() as u64) {
            return Some(busy(m));
        }
        let put = match which {
            Which::Scripts => {
                let in_use = script_in_flight(&self.calls);
                self.scripts.put_named(digest, bytes, tenant, &in_use)
            }
            Which::Blobs => {
                let in_use = blob_in_flight(&self.calls);
                self.blobs.put_named(digest, bytes, tenant, &in_use)
            }
        };
        self.after_put(which, client, put, tenant, bytes)
    }

    fn store_of(&self, which: Which) -> &crate::supervisor::scripts::Store {
        match which {
            Which::Scripts => &self.scripts,
            Which::Blobs => &self.blobs,
        }
    }

    /// The bytes the checker named since the last wake-up: each put goes on. A put whose
    /// caller left, or whose tenant was deleted meanwhile, is gone from [`Naming`] already.
    pub(super) fn named(&mut self, ticket: u64, digest: String, bytes: Vec<u8>) {
        let Some(n) = self.naming.remove(&ticket) else {
            return;
        };
        if let Some(r) = self.put_named(n.which, n.client, digest, &bytes, &n.who) {
            self.outbox.push((n.client, r, true));
        }
    }

    /// The front `t` left: its put being named (at most one) is dropped.
    pub(super) fn naming_client_gone(&mut self, t: Token) {
        let gone: Vec<u64> = self
            .naming
            .iter()
            .filter(|(_, n)| n.client == t)
            .map(|(k, _)| *k)
            .collect();
        for ticket in gone {
            if let Some(n) = self.naming.remove(&ticket) {
                self.checker.withdraw(&n.who.tenant, ticket);
            }
        }
    }

    /// `tenant` was deleted: its puts being named are answered now, as those being written
    /// are ([`Functions::drop_store_waits`]).
    fn naming_tenant_deleted(&mut self, tenant: &str) -> Vec<Token> {
        let gone: Vec<u64> = self
            .naming
            .iter()
            .filter(|(_, n)| n.who.tenant.as_deref() == Some(tenant))
            .map(|(k, _)| *k)
            .collect();
        let mut clients = Vec::new();
        for ticket in gone {
            if let Some(n) = self.naming.remove(&ticket) {
                self.checker.withdraw(&n.who.tenant, ticket);
                clients.push(n.client);
            }
        }
        clients
    }

    /// The supervisor stops (the checker has stopped): puts still being named are
    /// answered.
    pub(super) fn naming_shutdown(&mut self) {
        for (_, n) in self.naming.drain() {
            self.outbox.push((
                n.client,
                fail(
                    ErrorCode::Unavailable,
                    "the supervisor stopped before these bytes were stored; put them again once it is back",
                ),
                true,
            ));
        }
    }

    fn after_put(
        &mut self,
        which: Which,
        client: Token,
        put: Result<(String, Put), (ErrorCode, String)>,
        tenant: Option<&str>,
        bytes: &[u8],
    ) -> Option<Reply> {
        let size = bytes.len() as u64;
        let (digest, put) = match put {
            Ok(p) => p,
            Err((code, message)) => return Some(fail(code, message)),
        };
        let wait = StoreWait {
            client,
            tenant: tenant.map(str::to_string),
            created_ms: tenant
                .and_then(|t| self.api.tenants.get(t))
                .map(|r| r.created_ms),
            size,
        };
        match put {
            // The caller held them already, or it is the host: nothing to hide.
            Put::Held { had } if had || tenant.is_none() => {
                Some(self.stored(which, &digest, tenant, size, true))
            }
            // A tenant taking on bytes others hold or are writing: answered after an echo
            // of the write (queued behind the write of those bytes, if any).
            Put::Held { .. } | Put::Pending { had: false } if tenant.is_some() => {
                let store = match which {
                    Which::Scripts => &self.scripts,
                    Which::Blobs => &self.blobs,
                };
                let echo = store.echo(&digest, bytes);
                let in_store = matches!(put, Put::Held { .. });
                let ticket = self.write_store(echo, tenant);
                self.echo_waits.insert(
                    ticket,
                    EchoWait {
                        which,
                        digest,
                        wait,
                        in_store,
                    },
                );
                None
            }
            Put::Write(w) => {
                self.store_waits
                    .entry((which, digest))
                    .or_default()
                    .push(wait);
                self.write_store(w, tenant);
                None
            }
            Put::Held { .. } | Put::Pending { .. } => {
                self.store_waits
                    .entry((which, digest))
                    .or_default()
                    .push(wait);
                None
            }
        }
    }

    /// Hand a store write of `who`'s to the writer (done here only if the writer is
    /// gone): its ticket.
    pub(super) fn write_store(&mut self, mut w: Write, who: Option<&str>) -> u64 {
        self.write_tickets += 1;
        let ticket = self.write_tickets;
        w.ticket = ticket;
        self.queued.add(ticket, who, w.bytes.len() as u64);
        if let Some(done) = self.writer.send(w, who.map(str::to_string)) {
            self.on_written(done);
        }
        ticket
    }

    /// Whether a waiting caller's tenant was deleted (or deleted and made again) since it
    /// put its bytes.
    fn tenant_gone(&self, wait: &StoreWait) -> bool {
        wait.tenant
            .as_ref()
            .is_some_and(|t| self.api.tenants.get(t).map(|r| r.created_ms) != wait.created_ms)
    }

    /// A tenant is deleted: its callers waiting for store writes are answered now
    /// (`not_found`), and nothing is registered for it when the writes end.
    pub(super) fn drop_store_waits(&mut self, tenant: &str) {
        let mut gone = self.naming_tenant_deleted(tenant);
        let mine = |w: &StoreWait| w.tenant.as_deref() == Some(tenant);
        for waits in self.store_waits.values_mut() {
            gone.extend(waits.extract_if(.., |w| mine(w)).map(|w| w.client));
        }
        self.store_waits.retain(|_, w| !w.is_empty());
        let echoes: Vec<u64> = self
            .echo_waits
            .iter()
            .filter(|(_, e)| mine(&e.wait))
            .map(|(t, _)| *t)
            .collect();
        for t in echoes {
            if let Some(e) = self.echo_waits.remove(&t) {
                gone.push(e.wait.client);
            }
        }
        for client in gone {
            self.outbox.push((
                client,
                fail(
                    ErrorCode::NotFound,
                    "the tenant was deleted while its bytes were stored",
                ),
                true,
            ));
        }
    }

    /// The store writes done since the last wake-up: their entries held, their callers
    /// answered.
    pub fn store_written(&mut self) {
        for w in self.writer.done() {
            self.on_written(w);
        }
    }

    fn on_written(&mut self, w: Written) {
        self.queued.done(w.ticket);
        // Calls that ran the script this wrote, answered once it is held (or, if it could
        // not be written, now: their scripts ran either way).
        if let Some(answers) = self.after_write.remove(&w.ticket) {
            self.outbox.extend(answers);
        }
        if w.echo {
            self.echo_written(w);
            return;
        }
        let store = match w.which {
            Which::Scripts => &mut self.scripts,
            Which::Blobs => &mut self.blobs,
        };
        store.written(&w.digest, &w.result);
        let noun = match w.which {
            Which::Scripts => "script",
            Which::Blobs => "blob",
        };
        let waits = self
            .store_waits
            .remove(&(w.which, w.digest.clone()))
            .unwrap_or_default();
        for wait in waits {
            // Its tenant was deleted while the bytes were written (and perhaps made again:
            // that is somebody else): nothing is registered for it (the entry, held by
            // nobody, is the first to go when room is needed).
            let gone = self.tenant_gone(&wait);
            let reply = match &w.result {
                Ok(()) if gone => fail(
                    ErrorCode::NotFound,
                    format!("the {noun}'s tenant was deleted while it was stored"),
                ),
                Ok(()) => self.stored(w.which, &w.digest, wait.tenant.as_deref(), wait.size, false),
                // The detail (a path, the error) is in the log, written by the store.
                Err(_) => fail(
                    ErrorCode::Internal,
                    format!("the {noun} could not be stored; the supervisor's log says why"),
                ),
            };
            self.outbox.push((wait.client, reply, true));
        }
    }

    /// The echo of a put of bytes others held is done: the caller is answered as if its
    /// bytes had been written now.
    fn echo_written(&mut self, w: Written) {
        if let Err(e) = &w.result {
            log::debug!("store: an echo of {}: {e}", w.digest);
        }
        let Some(e) = self.echo_waits.remove(&w.ticket) else {
            return;
        };
        let (store, noun) = match e.which {
            Which::Scripts => (&self.scripts, "script"),
            Which::Blobs => (&self.blobs, "blob"),
        };
        let reply = if self.tenant_gone(&e.wait) {
            fail(
                ErrorCode::NotFound,
                format!("the {noun}'s tenant was deleted while it was stored"),
            )
        } else if store.held(&e.digest).is_some() {
            self.stored(
                e.which,
                &e.digest,
                e.wait.tenant.as_deref(),
                e.wait.size,
                e.in_store,
            )
        } else {
            // The write this put waited behind failed (the log says why).
            fail(
                ErrorCode::Internal,
                format!("the {noun} could not be stored; the supervisor's log says why"),
            )
        };
        self.outbox.push((e.wait.client, reply, true));
    }

    /// The answer to a put whose bytes the store holds: registered for the caller.
    /// `in_store`: the store held them before this put.
    fn stored(
        &mut self,
        which: Which,
        digest: &str,
        tenant: Option<&str>,
        size: u64,
        in_store: bool,
    ) -> Reply {
        // Whether this caller held these bytes already: that somebody else did is another
        // tenant's fact.
        let (existed, registered) = match which {
            Which::Scripts => (
                in_store && self.api.script_visible(digest, tenant),
                self.api.script_registered(digest, tenant, in_store),
            ),
            Which::Blobs => (
                in_store && self.api.blob_visible(digest, tenant),
                self.api.blob_registered(digest, tenant, in_store),
            ),
        };
        if let Err(r) = registered {
            return r.into();
        }
        let digest = digest.to_string();
        match which {
            Which::Scripts => {
                self.prune_script_owners(SCRIPT_OWNERS_SLACK);
                Reply::ScriptStored {
                    digest,
                    size,
                    existed,
                }
            }
            Which::Blobs => {
                let store = &self.blobs;
                self.api.prune_blobs(
                    &|d| store.held(d).is_some(),
                    store.count(),
                    BLOB_OWNERS_SLACK,
                );
                log::info!(
                    "blob {digest} stored ({size} bytes{}) for {}",
                    if existed { ", held already" } else { "" },
                    tenant.unwrap_or("the host")
                );
                Reply::BlobStored {
                    digest,
                    size,
                    existed,
                }
            }
        }
    }
}

/// A put refused while too much waits for the store writer.
fn busy(message: String) -> Reply {
    Reply::Error {
        code: ErrorCode::Busy,
        message,
        retry_after: Some(1),
    }
}
