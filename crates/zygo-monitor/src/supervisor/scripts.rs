//! The content-addressed script store: `<state>/scripts/<sha256 hex>`, one file per distinct
//! script, whoever sent it.
//!
//! The store has a size cap (`ZYGO_SCRIPT_STORE`, default [`DEFAULT_CAP`]). Storing a script
//! that would pass it first evicts the scripts used least recently (by a call, or by
//! `scripts put`) that no call in flight names; a script that cannot fit even then is
//! refused, naming the cap. A digest that was evicted is unknown until its script is sent
//! again (`--script`, or `scripts put`). Every write is crash-safe (temporary file, fsync,
//! rename, fsync of the folder) and done off the event loop (`super::store_writer`): the
//! entry's room is reserved when it is put, and it is held once its bytes are durable.
//! Temporary files a crash left are removed at start.
//!
//! The blob store (`<state>/blobs/`, workspace tars that calls name by digest) is the same
//! store with its own cap (`ZYGO_BLOB_STORE`, default 1 GiB) and words: see [`Flavor`].
//!
//! Each entry knows who holds it: the host, and the tenants that stored it over the API.
//! A tenant may hold at most its share of a store (`ZYGO_TENANT_STORE_SHARE`, a
//! percentage of the cap, default [`DEFAULT_SHARE_PERCENT`]); an entry counts in full for
//! every tenant holding it. A tenant's store past its share first evicts the least
//! recently used entries it alone holds, never another's, and is refused (`too_large`,
//! naming the share) when those do not make room. So a tenant uploading without end only
//! churns its own share. When the whole store is full (many tenants at their shares, or
//! the host's own entries), the least recently used idle entry of whoever holds the most
//! goes first, and only an entry whose every holder would still hold more than the putter
//! after the put (or the putter's own): nobody evicts what a holder holding less was told
//! is stored; when nothing may go, the put is refused (`too_large`, naming the store).

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::time::SystemTime;

use proto::front::{ErrorCode, ScriptRef};
use proto::launch::Script;

use super::store_writer::{Which, Write};

/// The largest script.
pub const MAX_SCRIPT: usize = super::functions::MAX_EVENT;
/// The store's cap unless `ZYGO_SCRIPT_STORE` says otherwise.
pub const DEFAULT_CAP: u64 = 1 << 30;
/// What a stored file takes besides its bytes (a page, rounding up), for the cap's sums.
const OVERHEAD: u64 = 4096;
/// A tenant's share of each store, in percent of its cap, unless
/// `ZYGO_TENANT_STORE_SHARE` says otherwise.
pub const DEFAULT_SHARE_PERCENT: u64 = 25;
/// The variable that sets a tenant's share.
pub const SHARE_ENV: &str = "ZYGO_TENANT_STORE_SHARE";

/// Why a store operation was refused: an error code and a message for the caller.
pub type Refusal = (ErrorCode, String);

/// What a store holds, for its limits and messages.
pub struct Flavor {
    /// "script" or "blob".
    pub noun: &'static str,
    /// Which store, for its writes.
    pub which: Which,
    /// The variable that sets the cap.
    pub env: &'static str,
    /// The largest item.
    pub max: usize,
}

/// The script store.
pub const SCRIPTS: Flavor = Flavor {
    noun: "script",
    which: Which::Scripts,
    env: "ZYGO_SCRIPT_STORE",
    max: MAX_SCRIPT,
};

/// The blob store: workspace tars (a blob arrives in one HTTP body of at most 16 MiB).
pub const BLOBS: Flavor = Flavor {
    noun: "blob",
    which: Which::Blobs,
    env: "ZYGO_BLOB_STORE",
    max: MAX_BLOB,
};

/// The largest blob.
pub const MAX_BLOB: usize = 16 * 1024 * 1024;

/// Who holds an entry: `None` is the host, `Some(t)` a tenant.
pub type Holder = Option<String>;

struct Entry {
    bytes: u64,
    last_used: SystemTime,
    holders: BTreeSet<Holder>,
    /// Its bytes are being written: its room is counted, it is not held yet, and it is
    /// never evicted.
    pending: bool,
}

/// What [`Store::put`] found, or has to be done.
pub enum Put {
    /// The store held these bytes already; `had`: the putter held them too.
    Held { had: bool },
    /// New: their room is reserved; the write goes to the store writer, and its end to
    /// [`Store::written`].
    Write(Write),
    /// The same bytes are being written for an earlier put: wait for [`Store::written`].
    /// `had`: that put was the putter's own.
    Pending { had: bool },
}

pub struct Store {
    flavor: &'static Flavor,
    dir: PathBuf,
    cap: u64,
    /// The most one tenant may hold.
    share: u64,
    entries: HashMap<String, Entry>,
    /// What the entries take, as counted against the cap.
    total: u64,
    /// What each holder's entries take (an entry in full for each of its holders).
    held_by: HashMap<Holder, u64>,
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

/// A tenant's share of a store of `cap` bytes, from `ZYGO_TENANT_STORE_SHARE` (a whole
/// percentage, 1 to 100), else [`DEFAULT_SHARE_PERCENT`].
pub fn share_from_env(cap: u64) -> Result<u64, String> {
    let percent = match std::env::var(SHARE_ENV) {
        Ok(v) if !v.trim().is_empty() => match v.trim().parse::<u64>() {
            Ok(p) if (1..=100).contains(&p) => p,
            _ => {
                return Err(format!(
                    "{SHARE_ENV}={v:?}: a whole percentage of each store's cap, 1 to 100"
                ))
            }
        },
        _ => DEFAULT_SHARE_PERCENT,
    };
    Ok(share_of(cap, percent))
}

/// `percent` of `cap`, without overflow.
fn share_of(cap: u64, percent: u64) -> u64 {
    cap / 100 * percent + cap % 100 * percent / 100
}

impl Store {
    /// The store in `dir` (which exists), with what it holds already (every entry the
    /// host's until [`Store::adopt`] says who else holds it); temporary files an
    /// interrupted write left are removed. A tenant may hold at most `share` bytes.
    pub fn open(
        flavor: &'static Flavor,
        dir: PathBuf,
        cap: u64,
        share: u64,
    ) -> std::io::Result<Store> {
        let mut s = Store {
            flavor,
            dir,
            cap,
            share,
            entries: HashMap::new(),
            total: 0,
            held_by: HashMap::new(),
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
            *s.held_by.entry(None).or_default() += cost(bytes);
            s.entries.insert(
                name,
                Entry {
                    bytes,
                    last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
                    holders: [None].into(),
                    pending: false,
                },
            );
        }
        Ok(s)
    }

    /// At start: who holds an entry, from the owner records (`host`: whether the host
    /// does too). An entry the store does not hold is skipped.
    pub fn adopt(&mut self, digest: &str, tenants: &BTreeSet<String>, host: bool) {
        let Some(e) = self.entries.get_mut(digest) else {
            return;
        };
        let c = cost(e.bytes);
        if !host && e.holders.remove(&None) {
            sub(&mut self.held_by, &None, c);
        }
        for t in tenants {
            if e.holders.insert(Some(t.clone())) {
                *self.held_by.entry(Some(t.clone())).or_default() += c;
            }
        }
    }

    /// A tenant is deleted: it holds nothing any more (the entries nobody else holds are
    /// removed by the caller, who knows them from the owner records).
    pub fn let_go(&mut self, tenant: &str) {
        let who: Holder = Some(tenant.to_string());
        for e in self.entries.values_mut() {
            e.holders.remove(&who);
        }
        self.held_by.remove(&who);
    }

    /// Bytes a holder's entries take.
    pub fn held_by(&self, who: &Holder) -> u64 {
        self.held_by.get(who).copied().unwrap_or(0)
    }

    fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(digest)
    }

    /// Bytes stored, and the cap.
    #[cfg(test)]
    pub fn usage(&self) -> (u64, u64) {
        (self.total, self.cap)
    }

    /// Store `source` for `who`: its digest, and whether the store holds these bytes
    /// already, is writing them, or they are to be written (their room reserved here, in
    /// `who`'s share). `in_use` says whether a call in flight names a digest (such an
    /// entry is never evicted).
    pub fn put(
        &mut self,
        source: &[u8],
        who: Option<&str>,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(String, Put), Refusal> {
        self.fits(source.len())?;
        let digest = crate::supervisor::event_check::digest(source);
        self.put_named(digest, source, who, in_use)
    }

    /// Whether `len` bytes may be one entry: `Err` is the refusal.
    pub fn fits(&self, len: usize) -> Result<(), Refusal> {
        if len > self.flavor.max {
            return Err((
                ErrorCode::TooLarge,
                format!(
                    "a {} may be at most {} MiB",
                    self.flavor.noun,
                    self.flavor.max >> 20
                ),
            ));
        }
        Ok(())
    }

    /// [`Store::put`] of bytes already named: `digest` is their SHA-256 (computed off the
    /// loop for large puts).
    pub fn put_named(
        &mut self,
        digest: String,
        source: &[u8],
        who: Option<&str>,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(String, Put), Refusal> {
        let (noun, env) = (self.flavor.noun, self.flavor.env);
        self.fits(source.len())?;
        let holder: Holder = who.map(str::to_string);
        let need = cost(source.len() as u64);
        let pending = self.entries.get(&digest).is_some_and(|e| e.pending);
        let held = pending || (self.entries.contains_key(&digest) && self.path(&digest).is_file());
        if !held {
            // Its file went (removed by hand): what it counted goes too.
            self.forget(&digest);
        }
        let holds_it = held
            && self
                .entries
                .get(&digest)
                .is_some_and(|e| e.holders.contains(&holder));
        // A tenant taking on bytes it does not hold yet stays within its share.
        if who.is_some() && !holds_it {
            self.within_share(&holder, &digest, need, in_use)?;
        }
        if held {
            if !pending {
                self.touch(&digest);
            }
            if let Some(e) = self.entries.get_mut(&digest) {
                if e.holders.insert(holder.clone()) {
                    *self.held_by.entry(holder).or_default() += need;
                }
            }
            let had = holds_it;
            return Ok((
                digest,
                if pending {
                    Put::Pending { had }
                } else {
                    Put::Held { had }
                },
            ));
        }
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
        self.make_room(&holder, need, in_use)?;
        self.total += need;
        *self.held_by.entry(holder.clone()).or_default() += need;
        self.entries.insert(
            digest.clone(),
            Entry {
                bytes: source.len() as u64,
                last_used: SystemTime::now(),
                holders: [holder].into(),
                pending: true,
            },
        );
        let write = Write {
            which: self.flavor.which,
            dir: self.dir.clone(),
            digest: digest.clone(),
            bytes: source.to_vec(),
            ticket: 0,
            echo: false,
        };
        Ok((digest, Put::Write(write)))
    }

    /// An echo of the write of `bytes` (held, or being written, as `digest`): the same
    /// work on a temporary file (see `store_writer`).
    pub fn echo(&self, digest: &str, bytes: &[u8]) -> Write {
        Write {
            which: self.flavor.which,
            dir: self.dir.clone(),
            digest: digest.to_string(),
            bytes: bytes.to_vec(),
            ticket: 0,
            echo: true,
        }
    }

    /// A write [`Store::put`] asked for is done: the entry is held, or (it failed) gone.
    /// Bytes of an entry deleted while they were written are removed.
    pub fn written(&mut self, digest: &str, result: &Result<(), String>) {
        let noun = self.flavor.noun;
        let pending = self.entries.get(digest).is_some_and(|e| e.pending);
        match result {
            Ok(()) if pending => {
                if let Some(e) = self.entries.get_mut(digest) {
                    e.pending = false;
                }
            }
            Ok(()) => {
                if !self.entries.contains_key(digest) {
                    let _ = std::fs::remove_file(self.path(digest));
                }
            }
            Err(e) => {
                log::error!("{noun} store: write {}: {e}", self.path(digest).display());
                if pending {
                    self.forget(digest);
                }
            }
        }
    }

    /// Make room in a tenant's share for `need` more bytes (an entry `digest` it is about
    /// to hold): the least recently used idle entries it alone holds are evicted; refused
    /// when that is not enough.
    fn within_share(
        &mut self,
        holder: &Holder,
        digest: &str,
        need: u64,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(), Refusal> {
        let (noun, share) = (self.flavor.noun, self.share);
        if need > share {
            return Err((
                ErrorCode::TooLarge,
                format!(
                    "a {noun} of {need} bytes (as stored) is larger than a tenant's share of the {noun} store, {share} bytes ({SHARE_ENV} percent of {})",
                    self.flavor.env
                ),
            ));
        }
        if self.held_by(holder) + need <= share {
            return Ok(());
        }
        let mut own: Vec<(SystemTime, String)> = self
            .entries
            .iter()
            .filter(|(d, e)| {
                d.as_str() != digest
                    && !e.pending
                    && e.holders.len() == 1
                    && e.holders.contains(holder)
                    && !in_use(d)
            })
            .map(|(d, e)| (e.last_used, d.clone()))
            .collect();
        own.sort();
        for (_, d) in own {
            if self.held_by(holder) + need <= share {
                break;
            }
            self.evict(&d, "its tenant's share is full");
        }
        if self.held_by(holder) + need <= share {
            return Ok(());
        }
        Err((
            ErrorCode::TooLarge,
            format!(
                "this tenant's share of the {noun} store ({share} bytes) is full of {noun}s that calls in flight use or that others hold too; retry when calls end"
            ),
        ))
    }

    /// Evict idle entries until `need` more bytes fit under the cap, for `putter`: entries
    /// nobody holds first, then the least recently used of whoever holds the most. Only
    /// entries of the putter's own, or of holders that would still hold more than the
    /// putter does after this put, may go: a tenant never evicts what a tenant holding
    /// less was told is stored (nor what it holds together with one). When nothing may
    /// go, the put is refused (`too_large`, naming the store), or `busy` when what is in
    /// the way is only entries in use or being written.
    fn make_room(
        &mut self,
        putter: &Holder,
        need: u64,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(), Refusal> {
        let (noun, env) = (self.flavor.noun, self.flavor.env);
        while self.total + need > self.cap {
            let mut largest: Vec<(u64, Holder)> =
                self.held_by.iter().map(|(h, b)| (*b, h.clone())).collect();
            largest.sort_by(|a, b| b.cmp(a));
            let level = self.held_by(putter) + need;
            let may_go = |e: &Entry| {
                e.holders
                    .iter()
                    .all(|h| h == putter || self.held_by(h) > level)
            };
            let lru_of = |held: &dyn Fn(&Entry) -> bool| {
                self.entries
                    .iter()
                    .filter(|(d, e)| held(e) && !e.pending && !in_use(d))
                    .min_by_key(|(_, e)| e.last_used)
                    .map(|(d, _)| d.clone())
            };
            // Entries nobody holds any more go first.
            let victim = lru_of(&|e| e.holders.is_empty()).or_else(|| {
                largest
                    .iter()
                    .find_map(|(_, h)| lru_of(&|e| e.holders.contains(h) && may_go(e)))
            });
            let Some(victim) = victim else {
                if lru_of(&|_| true).is_some() {
                    return Err((
                        ErrorCode::TooLarge,
                        format!(
                            "the {noun} store is full ({} of its {} bytes) of {noun}s that others hold, and no more of this caller's own can go; retry later, or ask the operator to raise {env}",
                            self.total, self.cap
                        ),
                    ));
                }
                return Err((
                    ErrorCode::Busy,
                    format!(
                        "the {noun} store is full ({} of its {} bytes) with {noun}s of calls in flight; retry when they end, or raise {env}",
                        self.total, self.cap
                    ),
                ));
            };
            self.evict(&victim, "the store is full");
        }
        Ok(())
    }

    /// Forget an entry (its bytes no longer count for anyone).
    fn forget(&mut self, digest: &str) -> Option<Entry> {
        let e = self.entries.remove(digest)?;
        let c = cost(e.bytes);
        self.total = self.total.saturating_sub(c);
        for h in &e.holders {
            sub(&mut self.held_by, h, c);
        }
        Some(e)
    }

    fn evict(&mut self, digest: &str, why: &str) {
        if let Some(e) = self.forget(digest) {
            match std::fs::remove_file(self.path(digest)) {
                Ok(()) => log::info!(
                    "{} store: evicted {digest} ({} bytes, least recently used): {why}",
                    self.flavor.noun,
                    e.bytes,
                ),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                Err(err) => log::warn!("{} store: remove {digest}: {err}", self.flavor.noun),
            }
        }
    }

    /// The script a call names: a source sent with the call is stored first (`in_use` as
    /// for [`Store::put`]; the write it needs, if any, is returned: the call goes on with
    /// the bytes it carries meanwhile); a digest is read from the store.
    pub fn resolve(
        &mut self,
        r: ScriptRef,
        who: Option<&str>,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(Script, Option<Write>), Refusal> {
        match r {
            ScriptRef::Source(source) => {
                let (digest, put) = self.put(&source, who, in_use)?;
                let write = match put {
                    Put::Write(w) => Some(w),
                    Put::Held { .. } | Put::Pending { .. } => None,
                };
                Ok((Script { digest, source }, write))
            }
            ScriptRef::Digest(digest) => {
                let source = self.get(&digest)?;
                Ok((Script { digest, source }, None))
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
        if self.entries.get(digest).is_some_and(|e| e.pending) {
            return Err(unknown_in(self.flavor, digest));
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
                self.forget(digest);
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

    /// The size of the script with this digest, if the store holds it (written).
    pub fn held(&self, digest: &str) -> Option<u64> {
        let e = self.entries.get(digest).filter(|e| !e.pending)?;
        self.path(digest).is_file().then_some(e.bytes)
    }

    /// Whether the store holds this digest or is writing it.
    pub fn knows(&self, digest: &str) -> bool {
        self.entries
            .get(digest)
            .is_some_and(|e| e.pending || self.path(digest).is_file())
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
        if self.forget(digest).is_none() {
            return Ok(false);
        }
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

/// Take `c` off a holder's count (gone at zero).
fn sub(held_by: &mut HashMap<Holder, u64>, who: &Holder, c: u64) {
    if let Some(b) = held_by.get_mut(who) {
        *b = b.saturating_sub(c);
        if *b == 0 {
            held_by.remove(who);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`Store::put`] and its write, done here: the digest, and whether it was held.
    fn put_now(
        s: &mut Store,
        bytes: &[u8],
        who: Option<&str>,
        in_use: &dyn Fn(&str) -> bool,
    ) -> Result<(String, bool), Refusal> {
        let (d, p) = s.put(bytes, who, in_use)?;
        match p {
            Put::Held { .. } | Put::Pending { .. } => Ok((d, true)),
            Put::Write(w) => {
                let r = super::super::store_writer::write_file(&w.dir, &w.digest, &w.bytes)
                    .map_err(|e| e.to_string());
                s.written(&d, &r);
                Ok((d, false))
            }
        }
    }

    fn store(cap: u64) -> (Store, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "zygo-tests-store-{}-{}",
            std::process::id(),
            plumbing::random_hex(4).expect("random")
        ));
        std::fs::create_dir(&dir).expect("create a test store");
        (
            Store::open(&SCRIPTS, dir.clone(), cap, cap).expect("open"),
            dir,
        )
    }

    #[test]
    fn the_least_recently_used_idle_script_goes_first_and_one_in_use_never() {
        let (mut s, dir) = store(3 * cost(10_000));
        let none = |_: &str| false;
        let (a, _) = put_now(&mut s, &[b'a'; 10_000], None, &none).expect("a");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (b, _) = put_now(&mut s, &[b'b'; 10_000], None, &none).expect("b");
        std::thread::sleep(std::time::Duration::from_millis(5));
        let (c, _) = put_now(&mut s, &[b'c'; 10_000], None, &none).expect("c");
        std::thread::sleep(std::time::Duration::from_millis(5));
        s.get(&a).expect("a is used again");
        // Full: d evicts b, the least recently used (a was used after it).
        let (d, _) = put_now(&mut s, &[b'd'; 10_000], None, &none).expect("d");
        assert!(!s.contains(&b) && s.contains(&a) && s.contains(&c) && s.contains(&d));
        assert_eq!(s.get(&b).map_err(|e| e.0), Err(ErrorCode::NotFound));
        // With every script in flight, nothing can be evicted: refused as busy.
        let all = |_: &str| true;
        let e = put_now(&mut s, &[b'e'; 10_000], None, &all).expect_err("full");
        assert_eq!(e.0, ErrorCode::Busy);
        assert!(e.1.contains("ZYGO_SCRIPT_STORE"), "{}", e.1);
        // Larger than the whole cap: too large, naming it.
        let e = put_now(&mut s, &[b'f'; 60_000], None, &none).expect_err("too large");
        assert_eq!(e.0, ErrorCode::TooLarge);
        // What the store says it holds is what is on disk, and a reopened store agrees.
        let on_disk = std::fs::read_dir(&dir).expect("list").count();
        assert_eq!(on_disk, 3);
        let again = Store::open(&SCRIPTS, dir.clone(), s.cap, s.cap).expect("reopen");
        assert_eq!(again.usage(), s.usage());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_script_sent_with_a_call_is_stored_and_its_digest_names_it() {
        let (mut s, dir) = store(DEFAULT_CAP);
        let none = |_: &str| false;
        let (sent, write) = s
            .resolve(ScriptRef::Source(b"print(1)".to_vec()), None, &none)
            .expect("stored");
        assert!(valid_digest(&sent.digest) && s.contains(&sent.digest));
        // Until its bytes are written, the digest names nothing.
        let named = s.resolve(ScriptRef::Digest(sent.digest.clone()), None, &none);
        assert_eq!(named.map_err(|e| e.0).err(), Some(ErrorCode::NotFound));
        assert!(s.knows(&sent.digest) && s.held(&sent.digest).is_none());
        let w = write.expect("a write");
        let r = super::super::store_writer::write_file(&w.dir, &w.digest, &w.bytes)
            .map_err(|e| e.to_string());
        s.written(&sent.digest, &r);
        let (named, again) = s
            .resolve(ScriptRef::Digest(sent.digest.clone()), None, &none)
            .expect("found");
        assert!(again.is_none());
        assert_eq!(named.source, b"print(1)");
        let unknown = s.resolve(ScriptRef::Digest("0".repeat(64)), None, &none);
        assert_eq!(unknown.map_err(|e| e.0).err(), Some(ErrorCode::NotFound));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_blob_store_speaks_of_blobs_and_its_own_cap() {
        let (_, dir) = store(DEFAULT_CAP);
        let mut s = Store::open(&BLOBS, dir.clone(), 2 * cost(10), 2 * cost(10)).expect("open");
        let none = |_: &str| false;
        let e = put_now(&mut s, &vec![0u8; MAX_BLOB + 1], None, &none)
            .expect_err("over the largest blob");
        assert!(
            e.0 == ErrorCode::TooLarge && e.1.contains("blob"),
            "{}",
            e.1
        );
        let e = put_now(&mut s, &[1u8; 20_000], None, &none).expect_err("over the cap");
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
    fn a_tenant_past_its_share_evicts_only_its_own_entries() {
        let (mut s, dir) = store(8 * cost(10_000));
        s.share = 2 * cost(10_000);
        let none = |_: &str| false;
        let (host, _) = put_now(&mut s, &[b'h'; 10_000], None, &none).expect("host");
        let (a, _) = put_now(&mut s, &[b'a'; 10_000], Some("a"), &none).expect("a");
        // b stores the same bytes as a: they count for both, and b cannot evict them.
        let (shared, existed) = put_now(&mut s, &[b'a'; 10_000], Some("b"), &none).expect("shared");
        assert!(existed && shared == a);
        let mut b_own = Vec::new();
        for i in 0..20u8 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            let (d, _) =
                put_now(&mut s, &[i; 10_000], Some("b"), &none).expect("b's own, within its share");
            b_own.push(d);
        }
        // b holds its share: the shared entry and its newest own one.
        assert_eq!(s.held_by(&Some("b".into())), 2 * cost(10_000));
        assert!(s.contains(&host) && s.contains(&a) && s.contains(&b_own[19]));
        assert!(!s.contains(&b_own[0]) && !s.contains(&b_own[18]));
        // More than a whole share: too large, naming the share's variable.
        let e = put_now(&mut s, &[b'z'; 30_000], Some("b"), &none).expect_err("over the share");
        assert!(
            e.0 == ErrorCode::TooLarge && e.1.contains(SHARE_ENV),
            "{}",
            e.1
        );
        // Its own entry in flight and the shared one: nothing of its own to evict.
        let busy = |d: &str| d == b_own[19];
        let e = put_now(&mut s, &[b'y'; 10_000], Some("b"), &busy).expect_err("full share");
        assert_eq!(e.0, ErrorCode::TooLarge, "{}", e.1);
        // The host has no share: it stores up to the cap.
        for i in 0..5u8 {
            put_now(&mut s, &[200 + i; 10_000], None, &none).expect("host");
        }
        // Once the store is full, the largest holder's least recently used goes first:
        // the host's (6 entries) before a's or b's.
        put_now(&mut s, &[b'x'; 10_000], None, &none).expect("host");
        assert!(!s.contains(&host), "the host's oldest went");
        assert!(s.contains(&a) && s.contains(&b_own[19]));
        // A tenant deleted holds nothing.
        s.let_go("b");
        assert_eq!(s.held_by(&Some("b".into())), 0);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_full_store_never_evicts_for_a_putter_what_a_smaller_holder_holds() {
        let unit = cost(10_000);
        let (mut s, dir) = store(6 * unit);
        s.share = 6 * unit;
        let none = |_: &str| false;
        let put = |s: &mut Store, b: u8, who: &str| {
            std::thread::sleep(std::time::Duration::from_millis(2));
            put_now(s, &[b; 10_000], Some(who), &none)
        };
        let a = put(&mut s, 1, "a").expect("a").0;
        let c: Vec<String> = (10..14u8)
            .map(|i| put(&mut s, i, "c").expect("c").0)
            .collect();
        // b: one fits; the next evicts c's oldest (c holds 4, more than b's 2 after it).
        let b1 = put(&mut s, 20, "b").expect("b1").0;
        let b2 = put(&mut s, 21, "b").expect("b2").0;
        assert!(!s.contains(&c[0]) && s.contains(&c[1]) && s.contains(&a));
        // c holds 3 now, b would hold 3: only b's own oldest may go.
        let b3 = put(&mut s, 22, "b").expect("b3").0;
        assert!(!s.contains(&b1) && s.contains(&b2) && s.contains(&b3));
        assert!(s.contains(&c[1]) && s.contains(&a));
        // a (1) may evict c's (3 > 2).
        put(&mut s, 2, "a").expect("a2");
        assert!(!s.contains(&c[1]) && s.contains(&a));

        // An entry co-held with a small holder is safe even though its other holder is
        // large: b (1 after its put) evicts c's own entry, not the one a holds with c.
        let (mut s, dir2) = store(2 * unit);
        s.share = 2 * unit;
        let shared = put(&mut s, 2, "c").expect("c").0;
        put(&mut s, 2, "a").expect("a co-holds c's");
        let c2 = put(&mut s, 3, "c").expect("c2").0;
        put(&mut s, 4, "b").expect("b evicts c's own");
        assert!(s.contains(&shared) && !s.contains(&c2));
        // A store full of two small holders' entries: a third tenant is refused, naming
        // the store, and nothing is evicted.
        let (mut s, dir3) = store(2 * unit);
        s.share = 2 * unit;
        let a = put(&mut s, 1, "a").expect("a").0;
        let c1 = put(&mut s, 3, "c").expect("c").0;
        let e = put(&mut s, 4, "b").expect_err("nothing b may evict");
        assert!(
            e.0 == ErrorCode::TooLarge && e.1.contains("ZYGO_SCRIPT_STORE"),
            "{}",
            e.1
        );
        assert!(s.contains(&a) && s.contains(&c1));
        let _ = std::fs::remove_dir_all(&dir3);
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(&dir2);
    }

    #[test]
    fn a_share_is_a_percentage_of_the_cap() {
        assert_eq!(share_of(1000, DEFAULT_SHARE_PERCENT), 250);
        assert_eq!(share_of(1 << 30, 25), (1 << 30) / 4);
        assert_eq!(share_of(u64::MAX, 100), u64::MAX);
        assert_eq!(share_of(199, 50), 99);
    }

    #[test]
    fn leftovers_of_an_interrupted_write_are_removed_at_start() {
        let (s, dir) = store(DEFAULT_CAP);
        std::fs::write(dir.join(".abc.123456"), b"half").expect("write");
        drop(s);
        let s = Store::open(&SCRIPTS, dir.clone(), DEFAULT_CAP, DEFAULT_CAP).expect("reopen");
        assert_eq!(s.usage().0, 0);
        assert!(!dir.join(".abc.123456").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
