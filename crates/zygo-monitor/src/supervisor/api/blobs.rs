//! Who stored which blob. Blobs are owned per tenant exactly as scripts are: a tenant may
//! name only the blobs it stored (any other digest is `not_found`, the same answer as one
//! the store does not hold); the host sees every one; deleting a tenant removes the blobs
//! nobody else stored.

use super::store::{Kind, Record, ScriptRecord};
use super::{Api, Refusal};

impl Api {
    /// Whether the acting caller may name a blob.
    pub fn blob_visible(&self, digest: &str, tenant: Option<&str>) -> bool {
        match tenant {
            None => true,
            Some(t) => self
                .blobs
                .get(digest)
                .is_some_and(|b| b.tenants.contains(t)),
        }
    }

    /// A blob was stored (or found stored: `existed`) for `tenant` (`None`: the host).
    pub fn blob_registered(
        &mut self,
        digest: &str,
        tenant: Option<&str>,
        existed: bool,
    ) -> Result<(), Refusal> {
        let rec = match (tenant, self.blobs.get(digest).cloned()) {
            (None, None) => return Ok(()), // the host's, as every unrecorded blob is
            (None, Some(r)) if r.host => return Ok(()),
            (None, Some(mut r)) => {
                r.host = true;
                r
            }
            (Some(t), Some(r)) if r.tenants.contains(t) => return Ok(()),
            (Some(t), Some(mut r)) => {
                r.tenants.insert(t.to_string());
                r
            }
            (Some(t), None) => ScriptRecord {
                digest: digest.to_string(),
                tenants: [t.to_string()].into(),
                // Bytes the store held before any tenant sent them are somebody else's too.
                host: existed,
            },
        };
        self.put(Record::Blob(rec.clone()))?;
        self.blobs.insert(digest.to_string(), rec);
        Ok(())
    }

    /// The blobs `tenant` stored, sorted.
    pub fn blobs_of(&self, tenant: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .blobs
            .values()
            .filter(|b| b.tenants.contains(tenant))
            .map(|b| b.digest.clone())
            .collect();
        v.sort();
        v
    }

    /// `tenant` lets go of its blobs: the digests nobody else stored (to be removed from
    /// the store).
    pub fn release_blobs(&mut self, tenant: &str) -> Result<Vec<String>, Refusal> {
        let mut orphans = Vec::new();
        for d in self.blobs_of(tenant) {
            let Some(mut r) = self.blobs.get(&d).cloned() else {
                continue;
            };
            r.tenants.remove(tenant);
            if r.tenants.is_empty() && !r.host {
                self.remove(Kind::Blob, &d)?;
                self.blobs.remove(&d);
                orphans.push(d);
            } else {
                self.put(Record::Blob(r.clone()))?;
                self.blobs.insert(d, r);
            }
        }
        Ok(orphans)
    }

    /// Forget who stored the blobs the store no longer holds, once the records outnumber
    /// the blobs by `slack`.
    pub fn prune_blobs(&mut self, held: &dyn Fn(&str) -> bool, blobs: usize, slack: usize) {
        if self.blobs.len() <= blobs + slack {
            return;
        }
        let gone: Vec<String> = self.blobs.keys().filter(|d| !held(d)).cloned().collect();
        for d in gone {
            if let Err(e) = self.remove(Kind::Blob, &d) {
                log::warn!("forget the owners of blob {d}: {}", e.message);
                return;
            }
            self.blobs.remove(&d);
        }
    }

    /// A blob was deleted from the store: nobody holds it any more.
    pub fn forget_blob(&mut self, digest: &str) -> Result<(), Refusal> {
        if self.blobs.contains_key(digest) {
            self.remove(Kind::Blob, digest)?;
            self.blobs.remove(digest);
        }
        Ok(())
    }
}
