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

#[cfg(test)]
mod tests {
    use super::super::store;
    use super::*;

    #[test]
    fn a_tenants_blobs_are_its_own_survive_a_restart_and_go_with_it() {
        let d = std::env::temp_dir().join(format!(
            "zygo-api-blobs-{}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ));
        let open = || {
            let files = store::Files::open(d.clone()).expect("open");
            Api::open(Box::new(files)).expect("load")
        };
        let mut api = open();
        api.create_tenant("acme").expect("acme");
        api.create_tenant("zeta").expect("zeta");
        let (a, shared) = ("a".repeat(64), "b".repeat(64));
        api.blob_registered(&a, Some("acme"), false).expect("a");
        api.blob_registered(&shared, Some("acme"), false)
            .expect("shared");
        api.blob_registered(&shared, Some("zeta"), true)
            .expect("shared");
        assert!(api.blob_visible(&a, Some("acme")) && !api.blob_visible(&a, Some("zeta")));
        assert!(api.blob_visible(&a, None));
        // Scripts and blobs are apart: a blob's digest is not a script of the tenant's.
        assert!(!api.script_visible(&a, Some("acme")));
        let mut api = open();
        assert_eq!(api.blobs_of("acme"), vec![a.clone(), shared.clone()]);
        assert_eq!(api.release_blobs("acme"), Ok(vec![a.clone()]));
        assert!(
            api.blob_visible(&shared, Some("zeta")) && !api.blob_visible(&shared, Some("acme"))
        );
        let _ = std::fs::remove_dir_all(&d);
    }
}
