//! The content-addressed script store: `<state>/scripts/<sha256 hex>`, one file per distinct
//! script, whoever sent it.
//!
//! The store has a size cap (`ZYGO_SCRIPT_STORE`, default [`DEFAULT_CAP`]). Storing a script
//! that would pass it first evicts the scripts used least recently (by a call, or by
//! `scripts put`) that no call in flight names; a script that cannot fit even then is
//! refused, naming the cap. A digest that was evicted is unknown until its script is sent
//! again (`--script`, or `scripts put`). Every write is crash-safe (temporary file, fsync,
//! rename, fsync of the folder); temporary files a crash left are removed at start.
//!
//! The blob store (`<state>/blobs/`, workspace tars that calls name by digest) is the same
//! store with its own cap (`ZYGO_BLOB_STORE`, default 1 GiB) and words: see [`Flavor`].

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::time::SystemTime;

use proto::front::{ErrorCode, ScriptRef};
use proto::launch::Script;

/// The largest script.
pub const MAX_SCRIPT: usize = super::functions::MAX_EVENT;
/// The store's cap unless `ZYGO_SCRIPT_STORE` says otherwise.
pub const DEFAULT_CAP: u64 = 1 << 30;
/// What a stored file takes besides its bytes (a page, rounding up), for the cap's sums.
const OVERHEAD: u64 = 4096;

/// Why a store operation was refused: an error code and a message for the caller.
pub type Refusal = (ErrorCode, String);

/// What a store holds, for its limits and messages.
pub struct Flavor {
    /// "script" or "blob".
    pub noun: &'static str,
    /// The variable that sets the cap.
    pub env: &'static str,
    /// The largest item.
    pub max: usize,
}

/// The script store.
pub const SCRIPTS: Flavor = Flavor {
    noun: "script",
    env: "ZYGO_SCRIPT_STORE",
    max: MAX_SCRIPT,
};

/// The blob store: workspace tars (a blob arrives in one HTTP body of at most 16 MiB).
pub const BLOBS: Flavor = Flavor {
    noun: "blob",
    env: "ZYGO_BLOB_STORE",
    max: MAX_BLOB,
};

/// The largest blob.
pub const MAX_BLOB: usize = 16 * 1024 * 1024;

struct Entry {
    bytes: u64,
    last_used: SystemTime,
}

pub struct Store {
    flavor: &'static Flavor,
    dir: PathBuf,
    cap: u64,
    entries: HashMap<String, Entry>,
    /// What the entries take, as counted against the cap.
    total: u64,
}

fn cost(bytes: u64) -> u64 {
    bytes.div_ceil(OVERHEAD) * OVERHEAD + OVERHEAD
}

/// A script digest: 64 lowercase hex digits.
pub fn valid_digest(d: &str) -> bool {
    d.len() == 64 && d.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The answer for a digest the caller cannot name: one the store does not hold, or (to a
/// tenant) one it did not register — the same words, on purpose.
pub fn unknown(digest: &str) -> Refusal {
    unknown_in(&SCRIPTS, digest)
}

/// [`unknown`] for a store of any flavor.
pub fn unknown_in(flavor: &Flavor, digest: &str) -> Refusal {
    let noun = flavor.noun;
    (
        ErrorCode::NotFound,
        format!(
            "no {noun} with digest {digest} is stored ({noun}s unused for longest are evicted when the store is full: send it again)"
        ),
    )
}

/// The store's cap from its variable (`ZYGO_SCRIPT_STORE`, `ZYGO_BLOB_STORE`: a size such
/// as `512M`), else [`DEFAULT_CAP`].
pub fn cap_from_env(flavor: &Flavor) -> Result<u64, String> {
    match std::env::var(flavor.env) {
        Ok(v) if !v.trim().is_empty() => policy::limits::parse_size(flavor.env, v.trim())
            .map(|b| b.0)
            .map_err(|e| e.to_string()),
        _ => Ok(DEFAULT_CAP),
    }
}

impl Store {
    /// The store in `dir` (which exists), with what it holds already; temporary files an
    /// interrupted write left are removed.
    pub fn open(flavor: &'static Flavor, dir: PathBuf, cap: u64) -> std::io::Result<Store> {
        let mut s = Store {
            flavor,
            dir,
            cap,
            entries: HashMap::new(),
            total: 0,
        };
        for e in std::fs::read_dir(&s.dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            let meta = e.metadata()?;
            if name.starts_with('.') && meta.is_file() {
                let _ = std::fs::remove_file(e.path());
                continue;
            }
            if !valid_digest(&name) || !meta.is_file() {
                continue;
            }
            let bytes = meta.len();
            s.total += cost(bytes);
            s.entries.insert(
                name,
                Entry {
                    bytes,
                    last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                },
            );
        }
        Ok(s)
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(digest)
    }

    /// Bytes stored, and the cap.
    #[cfg(test)]
    pub fn usage(&self) -> (u64, u64) {
        (self.total, self.cap)
    }

    /// Store `source`; its digest, and whether the store held these bytes already.
    /// `in_use` says whether a call in flight names a digest (such a script is never
    /// evicted).
    pub fn put(
        &mut self,
        source: &[u8],
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(String, bool), Refusal> {
        use sha2::{Digest, Sha256};
        let (noun, env) = (self.flavor.noun, self.flavor.env);
        if source.len() > self.flavor.max {
            return Err((
                ErrorCode::TooLarge,
                format!("a {noun} may be at most {} MiB", self.flavor.max >> 20),
            ));
        }
        let digest: String = Sha256::digest(source)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if self.entries.contains_key(&digest) && self.path(&digest).is_file() {
            self.touch(&digest);
            return Ok((digest, true));
        }
        let need = cost(source.len() as u64);
        if need > self.cap {
            return Err((
                ErrorCode::TooLarge,
                format!(
                    "a {noun} of {} bytes does not fit the {noun} store's cap of {} bytes ({env})",
                    source.len(),
                    self.cap
                ),
            ));
        }
        self.make_room(need, in_use)?;
        let path = self.path(&digest);
        let suffix = plumbing::random_hex(6).map_err(|e| {
            (
                ErrorCode::Internal,
                format!("name the {noun}'s temporary file: {e}"),
            )
        })?;
        let tmp = self.dir.join(format!(".{digest}.{suffix}"));
        let written = (|| -> std::io::Result<()> {
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&tmp)?;
            f.write_all(source)?;
            f.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(&self.dir)?.sync_all()
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err((ErrorCode::Internal, format!("store the {noun}: {e}")));
        }
        self.total += need;
        self.entries.insert(
            digest.clone(),
            Entry {
                bytes: source.len() as u64,
                last_used: SystemTime::now(),
            },
        );
        Ok((digest, false))
    }

    /// Evict the least recently used scripts nothing in flight names until `need` more
    /// bytes fit under the cap.
    fn make_room(&mut self, need: u64, in_use: &dyn Fn(&str) -> bool) -> Result<(), Refusal> {
        if self.total + need <= self.cap {
            return Ok(());
        }
        let mut idle: Vec<(SystemTime, String)> = self
            .entries
            .iter()
            .filter(|(d, _)| !in_use(d))
            .map(|(d, e)| (e.last_used, d.clone()))
            .collect();
        idle.sort();
        for (_, d) in idle {
            if self.total + need <= self.cap {
                break;
            }
            self.evict(&d);
        }
        if self.total + need <= self.cap {
            return Ok(());
        }
        Err((
            ErrorCode::Busy,
            format!(
                "the {noun} store is full ({} of its {} bytes) with {noun}s of calls in flight; retry when they end, or raise {env}",
                self.total,
                self.cap,
                noun = self.flavor.noun,
                env = self.flavor.env
            ),
        ))
    }

    fn evict(&mut self, digest: &str) {
        if let Some(e) = self.entries.remove(digest) {
            self.total = self.total.saturating_sub(cost(e.bytes));
            match std::fs::remove_file(self.path(digest)) {
                Ok(()) => log::info!(
                    "{} store: evicted {digest} ({} bytes, least recently used) to stay under its cap of {} bytes",
                    self.flavor.noun,
                    e.bytes,
                    self.cap
                ),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => log::warn!("{} store: remove {digest}: {err}", self.flavor.noun),
            }
        }
    }

    /// The script a call names: a source sent with the call is stored first (`in_use` as
    /// for [`Store::put`]); a digest is read from the store.
    pub fn resolve(
        &mut self,
        r: ScriptRef,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<Script, Refusal> {
        match r {
            ScriptRef::Source(source) => {
                let (digest, _) = self.put(&source, in_use)?;
                Ok(Script { digest, source })
            }
            ScriptRef::Digest(digest) => {
                let source = self.get(&digest)?;
                Ok(Script { digest, source })
            }
        }
    }

    /// The script with this digest; it counts as used now.
    pub fn get(&mut self, digest: &str) -> Result<Vec<u8>, Refusal> {
        let noun = self.flavor.noun;
        if !valid_digest(digest) {
            return Err((
                ErrorCode::BadRequest,
                format!("a {noun} digest is 64 lowercase hex digits (SHA-256)"),
            ));
        }
        let read = std::fs::File::open(self.path(digest)).and_then(|f| {
            use std::io::Read;
            let mut bytes = Vec::new();
            f.take(self.flavor.max as u64 + 1).read_to_end(&mut bytes)?;
            Ok(bytes)
        });
        match read {
            Ok(source) => {
                self.touch(digest);
                Ok(source)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(e) = self.entries.remove(digest) {
                    self.total = self.total.saturating_sub(cost(e.bytes));
                }
                Err(unknown_in(self.flavor, digest))
            }
            Err(e) => Err((
                ErrorCode::Internal,
                format!("read the {noun} {digest}: {e}"),
            )),
        }
    }

    /// Mark a script used now; its file's time too (at most once a minute), so the order
    /// survives a restart.
    fn touch(&mut self, digest: &str) {
        let now = SystemTime::now();
        let Some(e) = self.entries.get_mut(digest) else {
            return;
        };
        let stale = now
            .duration_since(e.last_used)
            .is_ok_and(|d| d.as_secs() >= 60);
        e.last_used = now;
        if stale {
            let path = self.dir.join(digest);
            let _ = std::fs::File::options()
                .write(true)
                .open(&path)
                .and_then(|f| f.set_modified(now));
        }
    }

    /// The size of the script with this digest, if the store holds it.
    pub fn held(&self, digest: &str) -> Option<u64> {
        let e = self.entries.get(digest)?;
        self.path(digest).is_file().then_some(e.bytes)
    }

    /// How many scripts the store holds.
    pub fn count(&self) -> usize {
        self.entries.len()
    }

    /// Forget a script: whether the store held it.
    pub fn remove(&mut self, digest: &str) -> Result<bool, Refusal> {
        if !valid_digest(digest) {
            return Ok(false);
        }
        let Some(e) = self.entries.remove(digest) else {
            return Ok(false);
        };
        self.total = self.total.saturating_sub(cost(e.bytes));
        match std::fs::remove_file(self.path(digest)) {
            Ok(()) => {}
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(err) => {
                return Err((
                    ErrorCode::Internal,
                    format!("remove the {} {digest}: {err}", self.flavor.noun),
                ))
            }
        }
        let _ = std::fs::File::open(&self.dir).and_then(|d| d.sync_all());
        Ok(true)
    }

    /// Whether the store holds this digest.
    #[cfg(test)]
    pub fn contains(&self, digest: &str) -> bool {
        self.entries.contains_key(digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(cap: u64) -> (Store, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "zygo-tests-store-{}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ));
        std::fs::create_dir(&dir).expect("create a test store");
        (Store::open(&SCRIPTS, dir.clone(), cap).expect("open"), dir)
    }

    #[test]
    fn the_least_recently_used_idle_script_goes_first_and_one_in_use_never() {
        let (mut s, dir) = store(3 * cost(10_000));
        let none = |_: &str| false;
        let (a, _) = s.put(&[b'a'; 10_000], &none).expect("a");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (b, _) = s.put(&[b'b'; 10_000], &none).expect("b");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (c, _) = s.put(&[b'c'; 10_000], &none).expect("c");
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.get(&a).expect("a is used again");
        // Full: d evicts b, the least recently used (a was used after it).
        let (d, _) = s.put(&[b'd'; 10_000], &none).expect("d");
        assert!(!s.contains(&b) && s.contains(&a) && s.contains(&c) && s.contains(&d));
        assert_eq!(s.get(&b).map_err(|e| e.0), Err(ErrorCode::NotFound));
        // With every script in flight, nothing can be evicted: refused as busy.
        let all = |_: &str| true;
        let e = s.put(&[b'e'; 10_000], &all).expect_err("full");
        assert_eq!(e.0, ErrorCode::Busy);
        assert!(e.1.contains("ZYGO_SCRIPT_STORE"), "{}", e.1);
        // Larger than the whole cap: too large, naming it.
        let e = s.put(&[b'f'; 60_000], &none).expect_err("too large");
        assert_eq!(e.0, ErrorCode::TooLarge);
        // What the store says it holds is what is on disk, and a reopened store agrees.
        let on_disk = std::fs::read_dir(&dir).expect("list").count();
        assert_eq!(on_disk, 3);
        let again = Store::open(&SCRIPTS, dir.clone(), s.cap).expect("reopen");
        assert_eq!(again.usage(), s.usage());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_script_sent_with_a_call_is_stored_and_its_digest_names_it() {
        let (mut s, dir) = store(DEFAULT_CAP);
        let none = |_: &str| false;
        let sent = s
            .resolve(ScriptRef::Source(b"print(1)".to_vec()), &none)
            .expect("stored");
        assert!(valid_digest(&sent.digest) && s.contains(&sent.digest));
        let named = s
            .resolve(ScriptRef::Digest(sent.digest.clone()), &none)
            .expect("found");
        assert_eq!(named.source, b"print(1)");
        let unknown = s.resolve(ScriptRef::Digest("0".repeat(64)), &none);
        assert_eq!(unknown.map_err(|e| e.0).err(), Some(ErrorCode::NotFound));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_blob_store_speaks_of_blobs_and_its_own_cap() {
        let (_, dir) = store(DEFAULT_CAP);
        let mut s = Store::open(&BLOBS, dir.clone(), 2 * cost(10)).expect("open");
        let none = |_: &str| false;
        let e = s
            .put(&vec![0u8; MAX_BLOB + 1], &none)
            .expect_err("over the largest blob");
        assert!(
            e.0 == ErrorCode::TooLarge && e.1.contains("blob"),
            "{}",
            e.1
        );
        let e = s.put(&[1u8; 20_000], &none).expect_err("over the cap");
        assert!(e.1.contains("ZYGO_BLOB_STORE"), "{}", e.1);
        let e = s.get(&"0".repeat(64)).expect_err("unknown");
        assert!(
            e.0 == ErrorCode::NotFound && e.1.starts_with("no blob"),
            "{}",
            e.1
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn leftovers_of_an_interrupted_write_are_removed_at_start() {
        let (s, dir) = store(DEFAULT_CAP);
        std::fs::write(dir.join(".abc.123456"), b"half").expect("write");
        drop(s);
        let s = Store::open(&SCRIPTS, dir.clone(), DEFAULT_CAP).expect("reopen");
        assert_eq!(s.usage().0, 0);
        assert!(!dir.join(".abc.123456").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
