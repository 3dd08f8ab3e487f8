//! What the API's decisions rest on and must survive a restart: tokens (their hashes),
//! tenants and their limits, and which tenants registered which script.
//!
//! [`Store`] is deliberately narrow — load everything, write one record, remove one — so a
//! shared database can take the file backend's place for a fleet of hosts. The file backend
//! ([`Files`]) keeps one JSON file per record under
//! `<state>/api/{tokens,tenants,scripts,secrets,blobs}/`.
//! Every write goes to a temporary file that is fsynced, renamed over the record and the
//! folder fsynced, so a record is either the old one or the new one, whatever is killed
//! when. At start-up a temporary file (never acknowledged) is removed; anything else that
//! is not a whole record of its folder's kind — torn, foreign, misnamed — refuses the
//! start with its path named: a record silently dropped could be a revoked token coming
//! back or a tenant's limits gone.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use proto::api::TenantLimits;
use serde::{Deserialize, Serialize};

/// A minted token: only the SHA-256 of its secret is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenRecord {
    /// `tok_` + 16 hex.
    pub id: String,
    /// SHA-256 of the secret, lowercase hex.
    pub sha256: String,
    /// `None`: an operator token.
    pub tenant: Option<String>,
    pub created_ms: u64,
    /// When it was revoked; the record stays, so an id in a log still names something.
    pub revoked_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantRecord {
    pub id: String,
    pub created_ms: u64,
    pub limits: LimitsRecord,
}

/// A tenant's limits as stored (the same fields as [`TenantLimits`], strictly).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsRecord {
    pub mem_bytes: Option<u64>,
    pub cpu_millis: Option<u64>,
    pub pids: Option<u64>,
    pub timeout_ms: Option<u64>,
    pub scratch_bytes: Option<u64>,
    pub network: Option<String>,
    pub allow: Option<Vec<String>>,
}

impl From<&LimitsRecord> for TenantLimits {
    fn from(l: &LimitsRecord) -> TenantLimits {
        TenantLimits {
            mem_bytes: l.mem_bytes,
            cpu_millis: l.cpu_millis,
            pids: l.pids,
            timeout_ms: l.timeout_ms,
            scratch_bytes: l.scratch_bytes,
            network: l.network.clone(),
            allow: l.allow.clone(),
        }
    }
}

/// Who registered a script: the tenants, and whether the host (an operator acting for no
/// tenant, or bytes the store held before any tenant sent them) has it too. A script is
/// removed with a tenant only when nobody else is left.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptRecord {
    /// Lowercase hex SHA-256.
    pub digest: String,
    pub tenants: BTreeSet<String>,
    pub host: bool,
}

/// One tenant's secret, sealed (ChaCha20-Poly1305 under the supervisor's key, its tenant
/// and name bound as associated data: see `super::secrets`). Its id is `<tenant>.<name>`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretRecord {
    pub tenant: String,
    pub name: String,
    /// The nonce, 12 random bytes in lowercase hex (a fresh one for every value).
    pub nonce: String,
    /// The sealed value with its tag, lowercase hex.
    pub sealed: String,
    pub created_ms: u64,
}

impl SecretRecord {
    pub fn id(&self) -> String {
        secret_id(&self.tenant, &self.name)
    }
}

/// A secret's record id.
pub fn secret_id(tenant: &str, name: &str) -> String {
    format!("{tenant}.{name}")
}

/// Whether `id` is `<tenant id>.<secret name>`.
fn is_secret_id(id: &str) -> bool {
    id.split_once('.')
        .is_some_and(|(t, n)| proto::api::is_tenant_id(t) && proto::api::is_secret_name(n))
}

/// One record of any kind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    Token(TokenRecord),
    Tenant(TenantRecord),
    Script(ScriptRecord),
    Secret(SecretRecord),
    /// Who stored a blob: the same shape as a script's owners.
    Blob(ScriptRecord),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Token,
    Tenant,
    Script,
    Secret,
    Blob,
}

impl Kind {
    const ALL: [Kind; 5] = [
        Kind::Token,
        Kind::Tenant,
        Kind::Script,
        Kind::Secret,
        Kind::Blob,
    ];

    fn folder(self) -> &'static str {
        match self {
            Kind::Token => "tokens",
            Kind::Tenant => "tenants",
            Kind::Script => "scripts",
            Kind::Secret => "secrets",
            Kind::Blob => "blobs",
        }
    }

    /// Whether `id` is a well-formed id of this kind (it becomes a file name).
    fn valid_id(self, id: &str) -> bool {
        match self {
            Kind::Token => is_token_id(id),
            Kind::Tenant => proto::api::is_tenant_id(id),
            Kind::Script | Kind::Blob => proto::api::is_hex_digest(id),
            Kind::Secret => is_secret_id(id),
        }
    }
}

impl Record {
    fn kind(&self) -> Kind {
        match self {
            Record::Token(_) => Kind::Token,
            Record::Tenant(_) => Kind::Tenant,
            Record::Script(_) => Kind::Script,
            Record::Secret(_) => Kind::Secret,
            Record::Blob(_) => Kind::Blob,
        }
    }

    fn id(&self) -> String {
        match self {
            Record::Token(t) => t.id.clone(),
            Record::Tenant(t) => t.id.clone(),
            Record::Script(s) | Record::Blob(s) => s.digest.clone(),
            Record::Secret(s) => s.id(),
        }
    }
}

/// `tok_` + 16 lowercase hex.
pub fn is_token_id(id: &str) -> bool {
    id.strip_prefix("tok_").is_some_and(|h| {
        h.len() == 16
            && h.bytes()
                .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
    })
}

/// Everything stored.
#[derive(Debug, Default)]
pub struct Snapshot {
    pub tokens: Vec<TokenRecord>,
    pub tenants: Vec<TenantRecord>,
    pub scripts: Vec<ScriptRecord>,
    pub secrets: Vec<SecretRecord>,
    pub blobs: Vec<ScriptRecord>,
}

#[derive(Debug)]
pub struct StoreError(pub String);

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Where the API's records live.
pub trait Store {
    /// Every record. An unreadable one is an error naming it, never skipped.
    fn load(&mut self) -> Result<Snapshot, StoreError>;
    /// Write one record (replacing the one with its id), durably, before returning.
    fn put(&mut self, r: &Record) -> Result<(), StoreError>;
    /// Remove one record, durably; removing one that is not there is not an error.
    fn remove(&mut self, kind: Kind, id: &str) -> Result<(), StoreError>;
}

/// The file backend: `<dir>/{tokens,tenants,scripts,secrets,blobs}/<id>.json`.
pub struct Files {
    dir: PathBuf,
}

/// The largest record file read (a tenant's allow list is the largest thing in one).
const MAX_RECORD: u64 = 1 << 20;

impl Files {
    /// The store in `dir` (`<state>/api`), its folders made (0700) if missing.
    pub fn open(dir: PathBuf) -> Result<Files, StoreError> {
        for k in Kind::ALL {
            let d = dir.join(k.folder());
            plumbing::paths::make_private_dir(&d)
                .map_err(|e| StoreError(format!("create {}: {e}", d.display())))?;
        }
        Ok(Files { dir })
    }

    fn path(&self, kind: Kind, id: &str) -> PathBuf {
        self.dir.join(kind.folder()).join(format!("{id}.json"))
    }

    fn load_kind(&self, kind: Kind, snap: &mut Snapshot) -> Result<(), StoreError> {
        let folder = self.dir.join(kind.folder());
        let entries = std::fs::read_dir(&folder)
            .map_err(|e| StoreError(format!("read {}: {e}", folder.display())))?;
        let mut paths: Vec<PathBuf> = Vec::new();
        for e in entries {
            let e = e.map_err(|e| StoreError(format!("read {}: {e}", folder.display())))?;
            paths.push(e.path());
        }
        paths.sort();
        for path in paths {
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let meta = std::fs::symlink_metadata(&path)
                .map_err(|e| StoreError(format!("{}: {e}", path.display())))?;
            if name.starts_with('.') && name.ends_with(".tmp") && meta.is_file() {
                // A write that never finished: it was never acknowledged.
                log::info!(
                    "removing {}, a record write that did not finish",
                    path.display()
                );
                std::fs::remove_file(&path)
                    .map_err(|e| StoreError(format!("remove {}: {e}", path.display())))?;
                continue;
            }
            let refuse = |why: &str| {
                StoreError(format!(
                    "{}: {why}; the supervisor will not start without knowing what it held \
                     (move it out of the way only if you know it is not needed)",
                    path.display()
                ))
            };
            let Some(id) = name.strip_suffix(".json") else {
                return Err(refuse("not a record of the API's store"));
            };
            if !kind.valid_id(id) || !meta.is_file() {
                return Err(refuse("not a record of the API's store"));
            }
            let bytes = read_capped(&path).map_err(|e| refuse(&e))?;
            let bad = |e: proto::json::Error| {
                refuse(&format!("not a whole {} record ({e})", kind.folder()))
            };
            let got = match kind {
                Kind::Token => {
                    let t: TokenRecord = proto::json::from_slice_strict(&bytes).map_err(bad)?;
                    let id_ok = t.id == id;
                    snap.tokens.push(t);
                    id_ok
                }
                Kind::Tenant => {
                    let t: TenantRecord = proto::json::from_slice_strict(&bytes).map_err(bad)?;
                    let id_ok = t.id == id;
                    snap.tenants.push(t);
                    id_ok
                }
                Kind::Script | Kind::Blob => {
                    let s: ScriptRecord = proto::json::from_slice_strict(&bytes).map_err(bad)?;
                    let id_ok = s.digest == id;
                    match kind {
                        Kind::Blob => snap.blobs.push(s),
                        _ => snap.scripts.push(s),
                    }
                    id_ok
                }
                Kind::Secret => {
                    let s: SecretRecord = proto::json::from_slice_strict(&bytes).map_err(bad)?;
                    let id_ok = s.id() == id;
                    snap.secrets.push(s);
                    id_ok
                }
            };
            if !got {
                return Err(refuse("the record inside names another id than its file"));
            }
        }
        Ok(())
    }
}

fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let f = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    f.take(MAX_RECORD + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_RECORD {
        return Err(format!("larger than {MAX_RECORD} bytes"));
    }
    Ok(bytes)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

impl Store for Files {
    fn load(&mut self) -> Result<Snapshot, StoreError> {
        let mut snap = Snapshot::default();
        for k in Kind::ALL {
            self.load_kind(k, &mut snap)?;
        }
        Ok(snap)
    }

    fn put(&mut self, r: &Record) -> Result<(), StoreError> {
        let kind = r.kind();
        let id = r.id();
        let id = id.as_str();
        if !kind.valid_id(id) {
            return Err(StoreError(format!(
                "not a valid {} id: {id:?}",
                kind.folder()
            )));
        }
        let bytes = match r {
            Record::Token(t) => serde_json::to_vec_pretty(t),
            Record::Tenant(t) => serde_json::to_vec_pretty(t),
            Record::Script(s) | Record::Blob(s) => serde_json::to_vec_pretty(s),
            Record::Secret(s) => serde_json::to_vec_pretty(s),
        }
        .map_err(|e| StoreError(format!("encode a record: {e}")))?;
        let folder = self.dir.join(kind.folder());
        let path = self.path(kind, id);
        let suffix =
            plumbing::random_hex(6).map_err(|e| StoreError(format!("read random bytes: {e}")))?;
        let tmp = folder.join(format!(".{id}.{suffix}.tmp"));
        let written = (|| -> std::io::Result<()> {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            f.write_all(b"\n")?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            sync_dir(&folder)
        })();
        written.map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            StoreError(format!("write {}: {e}", path.display()))
        })
    }

    fn remove(&mut self, kind: Kind, id: &str) -> Result<(), StoreError> {
        if !kind.valid_id(id) {
            return Ok(());
        }
        let path = self.path(kind, id);
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(StoreError(format!("remove {}: {e}", path.display()))),
        }
        sync_dir(&self.dir.join(kind.folder()))
            .map_err(|e| StoreError(format!("sync {}: {e}", self.dir.display())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "zygo-api-store-{}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ));
        std::fs::create_dir(&d).expect("mkdir");
        d
    }

    fn tenant(id: &str) -> Record {
        Record::Tenant(TenantRecord {
            id: id.into(),
            created_ms: 1,
            limits: LimitsRecord {
                mem_bytes: Some(64 << 20),
                ..Default::default()
            },
        })
    }

    #[test]
    fn records_come_back_after_a_reopen_and_removed_ones_do_not() {
        let d = dir();
        let mut s = Files::open(d.clone()).expect("open");
        s.put(&tenant("acme")).expect("put");
        s.put(&tenant("globex")).expect("put");
        let tok = TokenRecord {
            id: "tok_0123456789abcdef".into(),
            sha256: "a".repeat(64),
            tenant: Some("acme".into()),
            created_ms: 2,
            revoked_ms: Some(3),
        };
        s.put(&Record::Token(tok.clone())).expect("put");
        s.remove(Kind::Tenant, "globex").expect("remove");
        let snap = Files::open(d.clone())
            .expect("reopen")
            .load()
            .expect("load");
        assert_eq!(snap.tenants.len(), 1);
        assert_eq!(snap.tenants[0].id, "acme");
        assert_eq!(snap.tokens, vec![tok]);
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn a_torn_or_foreign_file_refuses_the_load_naming_it_and_a_temporary_one_goes() {
        let d = dir();
        let mut s = Files::open(d.clone()).expect("open");
        s.put(&tenant("acme")).expect("put");
        let tmp = d.join("tenants/.acme.abcdef.tmp");
        std::fs::write(&tmp, b"{\"id\":").expect("write");
        assert!(s.load().is_ok());
        assert!(!tmp.exists(), "a temporary file is removed");
        let path = d.join("tenants/acme.json");
        let whole = std::fs::read(&path).expect("read");
        std::fs::write(&path, &whole[..whole.len() / 2]).expect("tear");
        let e = s.load().expect_err("a torn record");
        assert!(e.0.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, &whole).expect("mend");
        for (name, text) in [
            ("tenants/other.json", &whole[..]),
            ("tenants/README", b"hello"),
            ("tokens/tok_0123456789abcdef.json", &whole[..]),
        ] {
            let p = d.join(name);
            std::fs::write(&p, text).expect("write");
            let e = s.load().expect_err(name);
            assert!(e.0.contains(&p.display().to_string()), "{e}");
            std::fs::remove_file(&p).expect("rm");
        }
        assert!(s.load().is_ok());
        let _ = std::fs::remove_dir_all(&d);
    }
}
