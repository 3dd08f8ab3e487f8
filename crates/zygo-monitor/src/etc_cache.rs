//! The host image's `/etc`, prepared once and bound into each sandbox.
//!
//! Assembling `/etc` inside every sandbox (a copy per file, the generated account files)
//! took about a third of a millisecond of each sandbox's start. Its contents only change
//! when the host's `/etc` does, so the monitor keeps it ready in a directory,
//! `etc-<key>`, and the launcher binds that read-only as the sandbox's `/etc`. The key
//! hashes what `lstat` says of every [`HOST_ETC`] entry (inode, size, times, mode), so an
//! edited, replaced, added or removed host file gives a new key and a new directory; each
//! check costs one `lstat` per entry.
//!
//! Where: `/run/zygo-etc` when Zygo runs as root (owned by root, mode 0755: the sandbox's
//! init runs as a subordinate uid and reaches it through the host's root), otherwise
//! `<runtime dir>/etc` (the user's own, and the sandbox's init is the same user). The files
//! are copies of world-readable host files. A directory is built under a temporary name and
//! renamed into place, so concurrent monitors never see half of one. When a new one is made,
//! those made more than ten minutes before are removed (a sandbox that bound one keeps it;
//! one about to bind it finds it gone and assembles `/etc` itself). If anything here fails,
//! the plan carries no prepared `/etc` and the launcher assembles it as before.

use std::collections::hash_map::DefaultHasher;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::os::unix::fs::{symlink, DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use proto::launch::{PreparedEtc, ETC_COPY_MAX, HOST_ETC, HOST_ETC_GENERATED};

/// Changes whenever the layout this module writes changes (the generated files and the copy
/// limit are part of the key already).
const FORMAT: u32 = 1;

/// When a new directory is made, older ones made at least this long before are removed.
const STALE_AFTER: Duration = Duration::from_secs(600);

/// How one host `/etc` entry goes into the image.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Missing,
    Copy,
    Symlink,
    Bind,
}

fn classify(meta: Option<&fs::Metadata>) -> Entry {
    match meta {
        None => Entry::Missing,
        Some(m) if m.file_type().is_symlink() => Entry::Symlink,
        Some(m) if m.is_file() && m.len() <= ETC_COPY_MAX && m.mode() & 0o004 != 0 => Entry::Copy,
        Some(_) => Entry::Bind,
    }
}

/// The prepared `/etc` for this host, made now if it is not there yet; `None` (logged) if
/// it cannot be, and the launcher then assembles `/etc` itself.
pub fn prepare() -> Option<PreparedEtc> {
    // SAFETY: geteuid cannot fail.
    let root = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/zygo-etc")
    } else {
        plumbing::paths::runtime_dir().join("etc")
    };
    match prepare_in(Path::new("/etc"), &root) {
        Ok(p) => Some(p),
        Err(e) => {
            // Once per process: a supervisor starting zygotes would otherwise say it each time.
            static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
            if !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
                log::warn!(
                    "prepare the host image's /etc in {}: {e}; sandboxes assemble it themselves",
                    root.display()
                );
            }
            None
        }
    }
}

/// [`prepare`] from `host_etc` into `root`.
pub fn prepare_in(host_etc: &Path, root: &Path) -> io::Result<PreparedEtc> {
    let mut key = DefaultHasher::new();
    (FORMAT, ETC_COPY_MAX, HOST_ETC_GENERATED).hash(&mut key);
    let mut entries = Vec::with_capacity(HOST_ETC.len());
    for name in HOST_ETC {
        let meta = match fs::symlink_metadata(host_etc.join(name)) {
            Ok(m) => Some(m),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e),
        };
        let kind = classify(meta.as_ref());
        name.hash(&mut key);
        if let Some(m) = &meta {
            (m.dev(), m.ino(), m.mode(), m.size()).hash(&mut key);
            (m.mtime(), m.mtime_nsec(), m.ctime(), m.ctime_nsec()).hash(&mut key);
        }
        entries.push((*name, kind));
    }
    let dir = root.join(format!("etc-{:016x}", key.finish()));
    let binds: Vec<String> = entries
        .iter()
        .filter(|(_, k)| *k == Entry::Bind)
        .map(|(n, _)| n.to_string())
        .collect();
    let prepared = |dir: &Path| -> io::Result<PreparedEtc> {
        Ok(PreparedEtc {
            dir: dir
                .to_str()
                .ok_or_else(|| io::Error::other("the cache path is not UTF-8"))?
                .to_string(),
            binds: binds.clone(),
        })
    };
    own_root(root)?;
    if dir.is_dir() {
        return prepared(&dir);
    }
    let tmp = root.join(format!(
        ".build-{}-{:x}",
        std::process::id(),
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    ));
    let built = build(host_etc, &tmp, &entries).and_then(|()| {
        match fs::rename(&tmp, &dir) {
            Ok(()) => Ok(()),
            // Another monitor made the same one meanwhile: use theirs.
            Err(_) if dir.is_dir() => fs::remove_dir_all(&tmp),
            Err(e) => Err(e),
        }
    });
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&tmp);
        return Err(e);
    }
    remove_stale(root, &dir);
    prepared(&dir)
}

/// Create `root` if needed and check that only we can change it or the directory it is in:
/// each owned by our euid, not a symlink, not writable by group or others (whoever can
/// rename entries in the parent could swap the cache for their own).
fn own_root(root: &Path) -> io::Result<()> {
    let parent = root
        .parent()
        .ok_or_else(|| io::Error::other("the cache has no parent directory"))?;
    if !parent.exists() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    only_ours(parent)?;
    match fs::DirBuilder::new().mode(0o755).create(root) {
        Ok(()) => fs::set_permissions(root, fs::Permissions::from_mode(0o755))?,
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    only_ours(root)
}

fn only_ours(dir: &Path) -> io::Result<()> {
    let m = fs::symlink_metadata(dir)?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    // A directory in the path may be root's (/run); it must not be writable by others.
    let owner_ok = m.uid() == me || m.uid() == 0;
    if !m.is_dir() || !owner_ok || m.mode() & 0o022 != 0 {
        return Err(io::Error::other(format!(
            "{} is not a directory only uid {me} can change",
            dir.display()
        )));
    }
    Ok(())
}

fn build(host_etc: &Path, tmp: &Path, entries: &[(&str, Entry)]) -> io::Result<()> {
    fs::DirBuilder::new().mode(0o755).create(tmp)?;
    for (name, kind) in entries {
        let src = host_etc.join(name);
        let dst = tmp.join(name);
        match kind {
            Entry::Missing => {}
            Entry::Copy => write_file(&dst, &read_copyable(&src)?)?,
            Entry::Symlink => symlink(fs::read_link(&src)?, &dst)?,
            Entry::Bind if src.is_dir() => fs::DirBuilder::new().mode(0o755).create(&dst)?,
            Entry::Bind => write_file(&dst, b"")?,
        }
    }
    for (name, text) in HOST_ETC_GENERATED {
        write_file(&tmp.join(name), text.as_bytes())?;
    }
    // The build directory was made 0755 whatever the umask, like everything in it.
    fs::set_permissions(tmp, fs::Permissions::from_mode(0o755))
}

/// The bytes of a host file that may be copied: still a regular file, world-readable and
/// at most [`ETC_COPY_MAX`] bytes once opened (it may have changed since it was looked at,
/// and this process may be root, which can read anything).
fn read_copyable(src: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let f = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(src)?;
    let m = f.metadata()?;
    if !m.is_file() || m.mode() & 0o004 == 0 || m.len() > ETC_COPY_MAX {
        return Err(io::Error::other(format!(
            "{} changed while the image's /etc was being made",
            src.display()
        )));
    }
    let mut bytes = Vec::with_capacity(m.len() as usize);
    f.take(ETC_COPY_MAX + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > ETC_COPY_MAX {
        return Err(io::Error::other(format!(
            "{} grew past the copy limit",
            src.display()
        )));
    }
    Ok(bytes)
}

fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(path)?;
    f.write_all(bytes)?;
    f.set_permissions(fs::Permissions::from_mode(0o444))
}

/// Remove prepared directories other than `keep` (and abandoned builds) that are older
/// than [`STALE_AFTER`]. Best effort: a sandbox that bound one keeps it regardless.
fn remove_stale(root: &Path, keep: &Path) {
    let Ok(list) = fs::read_dir(root) else {
        return;
    };
    for entry in list.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path == keep || !(name.starts_with("etc-") || name.starts_with(".build-")) {
            continue;
        }
        let old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > STALE_AFTER);
        if old {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Tmp(PathBuf);
    impl Tmp {
        fn new(tag: &str) -> Tmp {
            let p = std::env::temp_dir().join(format!(
                "zygo-etc-test-{tag}-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = fs::remove_dir_all(&p);
            fs::create_dir_all(&p).expect("make a temporary directory");
            Tmp(p)
        }
    }
    impl Drop for Tmp {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn host() -> Tmp {
        let h = Tmp::new("host");
        fs::write(h.0.join("services"), "ssh 22/tcp\n").expect("write");
        fs::write(h.0.join("ld.so.cache"), vec![7u8; 1000]).expect("write");
        fs::write(h.0.join("timezone"), "Etc/UTC\n").expect("write");
        fs::set_permissions(h.0.join("timezone"), fs::Permissions::from_mode(0o600))
            .expect("chmod");
        fs::create_dir(h.0.join("ssl")).expect("mkdir");
        symlink("/usr/share/zoneinfo/Etc/UTC", h.0.join("localtime")).expect("symlink");
        h
    }

    /// A fake host /etc, a temporary folder, and the cache root to use in it.
    fn fixture(tag: &str) -> (Tmp, Tmp, PathBuf) {
        let cache = Tmp::new(tag);
        let root = cache.0.join("etc");
        (host(), cache, root)
    }

    #[test]
    fn builds_the_image_and_names_what_to_bind() {
        let (h, _cache, root) = fixture("cache");
        let p = prepare_in(&h.0, &root).expect("prepare");
        let dir = PathBuf::from(&p.dir);
        assert!(dir.starts_with(&root), "{p:?}");
        assert_eq!(
            fs::read_to_string(dir.join("services")).expect("read"),
            "ssh 22/tcp\n"
        );
        assert_eq!(
            fs::read(dir.join("ld.so.cache")).expect("read"),
            vec![7u8; 1000]
        );
        assert_eq!(
            fs::read_link(dir.join("localtime")).expect("readlink"),
            PathBuf::from("/usr/share/zoneinfo/Etc/UTC")
        );
        assert!(fs::read_to_string(dir.join("passwd"))
            .expect("read")
            .starts_with("root:x:0:0:"));
        assert_eq!(
            fs::read_to_string(dir.join("hostname")).expect("read"),
            "zygo\n"
        );
        // Not world-readable: not copied, an empty mount point to bind over instead.
        assert_eq!(fs::read(dir.join("timezone")).expect("read"), b"");
        assert!(dir.join("ssl").is_dir());
        assert_eq!(p.binds, vec!["timezone".to_string(), "ssl".to_string()]);
        assert!(!dir.join("shadow").exists() && !dir.join("nsswitch.conf").exists());
        for e in fs::read_dir(&dir).expect("list").flatten() {
            let m = e.metadata().expect("stat");
            if m.is_file() {
                assert_eq!(m.mode() & 0o777, 0o444, "{:?}", e.path());
            }
        }
        assert_eq!(fs::metadata(&dir).expect("stat").mode() & 0o777, 0o755);
        assert_eq!(fs::metadata(&root).expect("stat").mode() & 0o777, 0o755);
    }

    #[test]
    fn reuses_it_until_the_host_changes() {
        let (h, _cache, root) = fixture("reuse");
        let first = prepare_in(&h.0, &root).expect("prepare");
        let again = prepare_in(&h.0, &root).expect("prepare");
        assert_eq!(first, again);
        // Same length, new contents: the times and the key change.
        std::thread::sleep(Duration::from_millis(20));
        fs::write(h.0.join("services"), "ftp 21/tcp\n").expect("write");
        let changed = prepare_in(&h.0, &root).expect("prepare");
        assert_ne!(changed.dir, first.dir);
        let services = PathBuf::from(&changed.dir).join("services");
        assert_eq!(fs::read_to_string(services).expect("read"), "ftp 21/tcp\n");
        // A new entry appears in the image too.
        fs::write(h.0.join("protocols"), "tcp 6 TCP\n").expect("write");
        let added = prepare_in(&h.0, &root).expect("prepare");
        assert!(PathBuf::from(&added.dir).join("protocols").is_file());
        // The older directories are recent, so they stay (sandboxes may be binding them).
        assert!(Path::new(&first.dir).is_dir());
        let builds = fs::read_dir(&root)
            .expect("list")
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with(".build-"))
            .count();
        assert_eq!(builds, 0, "a build directory was left behind");
    }

    #[test]
    fn copies_only_what_is_still_copyable_when_read() {
        let h = host();
        assert_eq!(
            read_copyable(&h.0.join("services")).expect("copy"),
            b"ssh 22/tcp\n"
        );
        // Readable by its owner only (and by root, which this may be): never copied.
        assert!(read_copyable(&h.0.join("timezone")).is_err());
        assert!(
            read_copyable(&h.0.join("localtime")).is_err(),
            "a symlink is followed"
        );
        fs::write(h.0.join("big"), vec![b'x'; ETC_COPY_MAX as usize + 1]).expect("write");
        assert!(read_copyable(&h.0.join("big")).is_err());
    }

    #[test]
    fn refuses_a_cache_root_others_can_change() {
        let (h, cache, root) = fixture("perm");
        fs::create_dir(&root).expect("mkdir");
        fs::set_permissions(&root, fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = prepare_in(&h.0, &root).expect_err("a world-writable cache root");
        assert!(e.to_string().contains("only uid"), "{e}");
        let link = cache.0.join("link");
        symlink(&h.0, &link).expect("symlink");
        assert!(prepare_in(&h.0, &link).is_err(), "a symlinked cache root");
        // A parent others can write to: they could rename the cache away and put theirs.
        let open = cache.0.join("open");
        fs::create_dir(&open).expect("mkdir");
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = prepare_in(&h.0, &open.join("etc")).expect_err("a world-writable parent");
        assert!(e.to_string().contains("only uid"), "{e}");
        assert!(
            !open.join("etc").exists(),
            "made a cache in a directory others can change"
        );
    }
}
