//! `PUT /scripts` (`scripts put`) and `PUT /blobs`: bytes stored for the acting tenant (if
//! any). The store reserves a new entry's room at once (within the tenant's share); its
//! bytes are written and synced by the store writer, off the event loop, and the caller is
//! answered once they are durable. Bytes the store holds already are answered at once.

use mio::Token;
use proto::front::{ErrorCode, Reply};

use super::blobs::{blob_in_flight, BLOB_OWNERS_SLACK};
use super::{fail, script_in_flight, Functions, SCRIPT_OWNERS_SLACK};
use crate::supervisor::api::Acting;
use crate::supervisor::scripts::Put;
use crate::supervisor::store_writer::{Which, Write, Written};

/// A caller waiting for a store write to end.
pub(super) struct StoreWait {
    client: Token,
    tenant: Option<String>,
    size: u64,
}

impl Functions {
    /// `scripts put`: store a script for calls to name by its digest, registered against
    /// the acting tenant (if any). `None`: answered once its bytes are written.
    pub(super) fn put_script(
        &mut self,
        client: Token,
        source: &[u8],
        who: &Acting,
    ) -> Option<Reply> {
        let tenant = who.tenant.as_deref();
        let put = self
            .scripts
            .put(source, tenant, &script_in_flight(&self.calls));
        self.after_put(Which::Scripts, client, put, tenant, source.len() as u64)
    }

    /// `PUT /blobs`: store the bytes, owned by the acting tenant (if any). `None`:
    /// answered once they are written.
    pub(super) fn put_blob(&mut self, client: Token, bytes: &[u8], who: &Acting) -> Option<Reply> {
        let tenant = who.tenant.as_deref();
        let put = self.blobs.put(bytes, tenant, &blob_in_flight(&self.calls));
        self.after_put(Which::Blobs, client, put, tenant, bytes.len() as u64)
    }

    fn after_put(
        &mut self,
        which: Which,
        client: Token,
        put: Result<(String, Put), (ErrorCode, String)>,
        tenant: Option<&str>,
        size: u64,
    ) -> Option<Reply> {
        let (digest, put) = match put {
            Ok(p) => p,
            Err((code, message)) => return Some(fail(code, message)),
        };
        let wait = StoreWait {
            client,
            tenant: tenant.map(str::to_string),
            size,
        };
        match put {
            Put::Held => Some(self.stored(which, &digest, wait.tenant.as_deref(), size, true)),
            Put::Write(w) => {
                self.store_waits
                    .entry((which, digest))
                    .or_default()
                    .push(wait);
                self.write_store(w);
                None
            }
            Put::Pending => {
                self.store_waits
                    .entry((which, digest))
                    .or_default()
                    .push(wait);
                None
            }
        }
    }

    /// Hand a store write to the writer (done here only if the writer is gone).
    pub(super) fn write_store(&mut self, w: Write) {
        if let Some(done) = self.writer.send(w) {
            self.on_written(done);
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
            // Its tenant was deleted while the bytes were written: nothing is registered
            // for it (the entry, held by nobody, is the first to go when room is needed).
            let gone = wait
                .tenant
                .as_ref()
                .is_some_and(|t| !self.api.tenants.contains_key(t));
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
