//! Blobs: workspace tars stored once (`PUT /blobs`) and named by digest on any number of
//! calls. The store is content-addressed like the script store; who stored what is the
//! API's (`api::blobs`): a tenant may name only its own blobs.

use proto::front::{ErrorCode, ExecRequest, Reply};

use super::requests::InFlight;
use super::{fail, Functions};
use crate::supervisor::api::{no, Acting, Refusal};
use crate::supervisor::scripts::{unknown_in, valid_digest, BLOBS};

/// How many more blob-owner records than blobs are kept before the records of evicted
/// blobs are forgotten.
pub(super) const BLOB_OWNERS_SLACK: usize = 1024;

/// Whether a call in flight names a blob (such a blob is never evicted).
pub(super) fn blob_in_flight(
    calls: &std::collections::HashMap<String, InFlight>,
) -> impl Fn(&str) -> bool + '_ {
    move |d| calls.values().any(|c| c.blob_digest.as_deref() == Some(d))
}

const BAD_DIGEST: &str = "a blob digest is 64 lowercase hex digits (SHA-256)";

impl Functions {
    /// `DELETE /blobs/{digest}`: forgotten for everybody (a call in flight that was given
    /// it holds it: `conflict`).
    pub(super) fn delete_blob(&mut self, digest: &str) -> Reply {
        if !valid_digest(digest) {
            return fail(ErrorCode::BadRequest, BAD_DIGEST);
        }
        if self.blobs.held(digest).is_none() {
            let (code, message) = unknown_in(&BLOBS, digest);
            return fail(code, message);
        }
        if blob_in_flight(&self.calls)(digest) {
            return fail(
                ErrorCode::Conflict,
                "a call in flight was given this blob; delete it once the call has ended",
            );
        }
        if let Err((code, message)) = self.blobs.remove(digest) {
            return fail(code, message);
        }
        if let Err(r) = self.api.forget_blob(digest) {
            return r.into();
        }
        log::info!("blob {digest} deleted");
        Reply::BlobDeleted {
            digest: digest.to_string(),
        }
    }

    /// A call naming a blob as its workspace: the blob is read for the caller (a tenant
    /// only its own; any other digest is `not_found`, like one not held) into the call's
    /// workspace. The digest stays on the call, so the blob is not evicted while it runs.
    pub(super) fn fill_workspace(
        &mut self,
        e: &mut ExecRequest,
        who: &Acting,
    ) -> Result<(), Refusal> {
        let Some(d) = &e.workspace_blob else {
            return Ok(());
        };
        if e.workspace.is_some() {
            return Err(no(
                ErrorCode::BadRequest,
                "a call carries one workspace: an inline tar or a blob digest, not both",
            ));
        }
        if !valid_digest(d) {
            return Err(no(ErrorCode::BadRequest, BAD_DIGEST));
        }
        if !self.api.blob_visible(d, who.tenant.as_deref()) {
            let (code, message) = unknown_in(&BLOBS, d);
            return Err(no(code, message));
        }
        let bytes = self.blobs.get(d).map_err(|(code, m)| no(code, m))?;
        e.workspace = Some(bytes.into());
        Ok(())
    }

    /// A tenant is deleted: the blobs nobody else stored go with it.
    pub(super) fn release_blobs_of(&mut self, tenant: &str) {
        self.blobs.let_go(tenant);
        let orphans = match self.api.release_blobs(tenant) {
            Ok(o) => o,
            Err(r) => {
                log::warn!("release the blobs of tenant {tenant}: {}", r.message);
                return;
            }
        };
        for d in orphans {
            match self.blobs.remove(&d) {
                Ok(true) => log::info!("blob {d} removed with tenant {tenant}"),
                Ok(false) => {}
                Err((_, m)) => log::warn!("remove blob {d} of tenant {tenant}: {m}"),
            }
        }
    }
}
