//! The sandbox's filesystem, built inside its own mount namespace.
//!
//! The way in (the same as bubblewrap's): a staging tmpfs is mounted on `/tmp` and made the
//! root with `pivot_root`, so the host's root stays reachable at `/oldroot` while the new
//! root is assembled at `/newroot` from binds of `/oldroot/...`. `/newroot` is a directory
//! of the same tmpfs, bound onto itself to be a mount point; the tmpfs also holds the empty
//! file and directory that mask `/proc` entries. Once the new root is bound, the staging
//! root's own mount is made read-only, nosuid, nodev and noexec, and every mask bound from
//! it takes those flags with it. Then `/newroot` becomes the root with
//! `pivot_root(".", ".")`, one lazy detach removes the staging root and the host's root
//! under it, and the new root itself is remounted read-only: only its own directory of the
//! tmpfs is reachable.
//!
//! Every mount is `nosuid` and `nodev` except the few device nodes bound into `/dev`.
//! Nothing of the host is visible except what this module binds, read-only unless the plan
//! asked for a writable mount.

use std::fs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use proto::launch::{Image, LaunchPlan, PreparedEtc, ETC_COPY_MAX, HOST_ETC, HOST_ETC_GENERATED};

use crate::sys::{self, fail, step, Result};

const MS_NOSUID: libc::c_ulong = libc::MS_NOSUID;
const MS_NODEV: libc::c_ulong = libc::MS_NODEV;
const MS_NOEXEC: libc::c_ulong = libc::MS_NOEXEC;

/// Top-level host entries that make up the `host` image (each a directory bound read-only,
/// or a symlink recreated as it is, e.g. `/bin -> usr/bin` on merged-/usr systems).
const HOST_TOP: &[&str] = &["usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"];

/// Paths in `/proc` replaced by an empty read-only file: they leak kernel memory, keys,
/// timers, the host's boot command line, or let a process poke the kernel (sysrq).
const PROC_MASK_FILES: &[&str] = &[
    "cmdline",
    "kcore",
    "kmsg",
    "keys",
    "key-users",
    "timer_list",
    "timer_stats",
    "sched_debug",
    "latency_stats",
    "sysrq-trigger",
    "kallsyms",
    "config.gz",
    "vmallocinfo",
    "pagetypeinfo",
];

/// Directories in `/proc` hidden behind an empty read-only tmpfs.
const PROC_MASK_DIRS: &[&str] = &["acpi", "scsi", "asound", "driver", "tty"];

/// Directories in `/proc` kept visible but read-only.
const PROC_READONLY: &[&str] = &["sys", "irq", "bus", "fs", "sysvipc"];

/// Device nodes bound from the host. No tty, no block device, nothing else.
const DEVICES: &[&str] = &["null", "zero", "full", "random", "urandom"];

/// Names the sandbox owns at its root; an image's entries with these names are skipped.
const RESERVED: &[&str] = &[
    "proc", "dev", "sys", "tmp", "work", "run", "oldroot", "newroot",
];

fn mkdir(p: &Path, mode: u32) -> Result<()> {
    step(
        fs::DirBuilder::new().mode(mode).recursive(true).create(p),
        || format!("create directory {}", p.display()),
    )
}

/// Create an empty regular file to mount a file onto.
fn touch(p: &Path) -> Result<()> {
    step(sys::mknod_file(p, 0o644), || {
        format!("create mount point {}", p.display())
    })
}

fn tmpfs(dst: &Path, opts: &str, flags: libc::c_ulong) -> Result<()> {
    step(
        sys::mount(
            Some(Path::new("tmpfs")),
            dst,
            Some("tmpfs"),
            flags,
            Some(opts),
        ),
        || format!("mount tmpfs ({opts}) on {}", dst.display()),
    )
}

/// Recursive bind of `src`, a path under the host's root at `/oldroot`, onto `dst`. Every
/// mount there is read-only, nosuid and nodev already (see `assemble`), and a bind takes its
/// flags from its source: a read-only bind needs nothing more, a writable one has read-only
/// cleared on it and every mount under it.
fn bind(src: &Path, dst: &Path, rw: bool) -> Result<()> {
    step(
        sys::mount(Some(src), dst, None, libc::MS_BIND | libc::MS_REC, None),
        || format!("bind {} onto {}", src.display(), dst.display()),
    )?;
    if !rw {
        return Ok(());
    }
    step(
        sys::mount_setattr_recursive(
            dst,
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            sys::MOUNT_ATTR_RDONLY,
        ),
        || format!("make {} writable, nosuid, nodev", dst.display()),
    )
}

/// [`bind`] of a host path the monitor did not open (rootless: the launcher has exactly the
/// user's rights), resolved under the host's root `old` without following a symbolic link
/// in any component: a folder a sandbox was given writable may hold one, left to redirect
/// a later mount of a path under it (see `plumbing::resolve`).
fn bind_no_links(old: &Path, src: &str, dst: &Path, rw: bool) -> Result<()> {
    let rel: PathBuf = Path::new(src)
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    let base = step(sys::open_path_dir(old), || {
        "open the host's root".to_string()
    })?;
    let held = step(
        plumbing::resolve::open_path_no_links(base.as_raw_fd(), &rel),
        || format!("open the mount source {src} (no symbolic link is followed)"),
    )?;
    let tree = step(sys::open_tree_clone_recursive(&held), || {
        format!("copy the mount of {src}")
    })?;
    step(sys::move_mount_here(&tree, dst), || {
        format!("bind {src} onto {}", dst.display())
    })?;
    if !rw {
        return Ok(());
    }
    step(
        sys::mount_setattr_recursive(
            dst,
            sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
            sys::MOUNT_ATTR_RDONLY,
        ),
        || format!("make {} writable, nosuid, nodev", dst.display()),
    )
}

/// The flags of a device bind: read-only (the device itself stays writable), nosuid,
/// noexec, and not nodev.
const DEVICE_SET: u64 = sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NOEXEC;
const DEVICE_CLEAR: u64 = sys::MOUNT_ATTR_NODEV;

/// Bind a host device node. With `inherited`, its source mount has the device flags
/// already (see `dev_fs`) and the bind takes them; otherwise they are set on the bind.
fn bind_device(src: &Path, dst: &Path, inherited: bool) -> Result<()> {
    touch(dst)?;
    step(
        sys::mount(Some(src), dst, None, libc::MS_BIND, None),
        || format!("bind device {} onto {}", src.display(), dst.display()),
    )?;
    if inherited {
        return Ok(());
    }
    step(
        sys::mount_setattr_recursive(dst, DEVICE_SET, DEVICE_CLEAR),
        || format!("make {} read-only, nosuid, noexec", dst.display()),
    )
}

/// Remount an existing mount point read-only, keeping nosuid/nodev/noexec.
fn remount_ro(dst: &Path, extra: libc::c_ulong) -> Result<()> {
    step(
        sys::mount(
            None,
            dst,
            None,
            libc::MS_REMOUNT | libc::MS_BIND | libc::MS_RDONLY | MS_NOSUID | MS_NODEV | extra,
            None,
        ),
        || format!("remount {} read-only", dst.display()),
    )
}

/// `/newroot` + an absolute path inside the sandbox.
fn under(root: &Path, inside: &str) -> PathBuf {
    let rel: PathBuf = Path::new(inside)
        .components()
        .filter(|c| matches!(c, Component::Normal(_)))
        .collect();
    root.join(rel)
}

/// What a host entry is (without following a symlink); `None` when it does not exist.
fn inspect(src: &Path) -> Result<Option<fs::Metadata>> {
    match fs::symlink_metadata(src) {
        Ok(m) => Ok(Some(m)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(fail(format!("inspect {}", src.display()), e)),
    }
}

/// Replicate a host top-level entry: a symlink is recreated, a directory is bound.
fn host_entry(old: &Path, new: &Path, name: &str) -> Result<()> {
    let src = old.join(name);
    match inspect(&src)? {
        Some(meta) => replicate(&src, &new.join(name), &meta),
        None => Ok(()),
    }
}

/// Replicate `src` (described by `meta`) at `dst`: a symlink is recreated, anything else
/// bound read-only.
fn replicate(src: &Path, dst: &Path, meta: &fs::Metadata) -> Result<()> {
    if meta.file_type().is_symlink() {
        let target = step(fs::read_link(src), || {
            format!("read link {}", src.display())
        })?;
        step(symlink(&target, dst), || {
            format!("create link {}", dst.display())
        })
    } else if meta.is_dir() {
        mkdir(dst, 0o755)?;
        bind(src, dst, false)
    } else {
        touch(dst)?;
        bind(src, dst, false)
    }
}

/// An `/etc` entry: small world-readable files are copied into the new root's tmpfs (a
/// mount costs more than a copy, and the sandbox sees the same bytes); directories are
/// bound read-only; symlinks are recreated. A file that is not world-readable is bound,
/// never copied, so the sandbox can read exactly what it could read through a bind.
fn etc_entry(old_etc: &Path, etc: &Path, name: &str) -> Result<()> {
    use std::os::unix::fs::MetadataExt;
    let src = old_etc.join(name);
    let Some(meta) = inspect(&src)? else {
        return Ok(());
    };
    let dst = etc.join(name);
    if meta.is_file() && meta.len() <= ETC_COPY_MAX && meta.mode() & 0o004 != 0 {
        return step(sys::copy_file(&src, &dst, meta.len(), 0o444), || {
            format!("copy {}", src.display())
        });
    }
    replicate(&src, &dst, &meta)
}

fn host_image(old: &Path, new: &Path, prepared: Option<&PreparedEtc>) -> Result<()> {
    for name in HOST_TOP {
        host_entry(old, new, name)?;
    }
    let etc = new.join("etc");
    mkdir(&etc, 0o755)?;
    let old_etc = old.join("etc");
    if let Some(p) = prepared {
        if prepared_etc(old, &old_etc, &etc, p)? {
            return Ok(());
        }
    }
    for name in HOST_ETC {
        etc_entry(&old_etc, &etc, name)?;
    }
    for (name, text) in HOST_ETC_GENERATED {
        let p = etc.join(name);
        step(fs::write(&p, text), || format!("write {}", p.display()))?;
    }
    Ok(())
}

/// Bind the `/etc` the monitor prepared (see [`PreparedEtc`]) read-only onto `etc`, then
/// the host entries it leaves to bind over their mount points in it. `Ok(false)` if the
/// prepared directory cannot be bound (the caller assembles `/etc` instead); an entry that
/// has left the host's `/etc` meanwhile stays an empty mount point.
fn prepared_etc(old: &Path, old_etc: &Path, etc: &Path, p: &PreparedEtc) -> Result<bool> {
    let known = |name: &String| HOST_ETC.contains(&name.as_str());
    if !p.dir.starts_with('/') || !p.binds.iter().all(known) {
        return Err(fail(
            format!("the plan's prepared /etc ({}) is malformed", p.dir),
            std::io::Error::from_raw_os_error(libc::EINVAL),
        ));
    }
    // Read-only, nosuid and nodev from its source, like every bind from /oldroot. If it
    // is gone (removed as stale, or the host's /run replaced) or out of this init's reach,
    // nothing was mounted, and the caller assembles /etc instead.
    if sys::mount(Some(&under(old, &p.dir)), etc, None, libc::MS_BIND, None).is_err() {
        return Ok(false);
    }
    for name in &p.binds {
        let src = old_etc.join(name);
        if inspect(&src)?.is_some() {
            bind(&src, &etc.join(name), false)?;
        }
    }
    Ok(true)
}

/// Bind every top-level entry of the image folder, found at `src_root` (`dir` is its host
/// path, for messages).
fn dir_image(src_root: &Path, new: &Path, dir: &str) -> Result<()> {
    let entries = step(fs::read_dir(src_root), || {
        format!("read image directory {dir}")
    })?;
    for entry in entries {
        let entry = step(entry, || format!("read image directory {dir}"))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if RESERVED.contains(&name) {
            continue;
        }
        host_entry(src_root, new, name)?;
    }
    Ok(())
}

/// Bind the empty mask file or directory over `dst`; a `dst` that does not exist (this
/// kernel has no such entry) needs no mask. The bind takes its flags from the staging
/// root's mount the masks live on, which is read-only, nosuid, nodev and noexec by then
/// (see `assemble`).
fn mask(src: &Path, dst: &Path, what: &str) -> Result<()> {
    match sys::mount(Some(src), dst, None, libc::MS_BIND, None) {
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
        r => step(r, || format!("mask {what}")),
    }
}

/// Mount the sandbox's `/proc`, its masks and read-only parts; returns a descriptor of its
/// `sys` directory taken before that was made read-only (see [`build`]).
fn proc_fs(new: &Path, masks: &Masks, plan: &LaunchPlan) -> Result<OwnedFd> {
    let proc_ = new.join("proc");
    mkdir(&proc_, 0o555)?;
    step(
        sys::mount(
            Some(Path::new("proc")),
            &proc_,
            Some("proc"),
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
            plan.hide_pids.then_some("hidepid=invisible"),
        ),
        || "mount a new /proc".to_string(),
    )?;
    for name in PROC_MASK_FILES {
        mask(masks.file, &proc_.join(name), &format!("/proc/{name}"))?;
    }
    for name in PROC_MASK_DIRS {
        mask(masks.dir, &proc_.join(name), &format!("/proc/{name}"))?;
    }
    let sysctl_dir = step(sys::open_path_dir(&proc_.join("sys")), || {
        "open the new /proc/sys".to_string()
    })?;
    for name in PROC_READONLY {
        let p = proc_.join(name);
        match sys::mount(Some(&p), &p, None, libc::MS_BIND | libc::MS_REC, None) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
            r => step(r, || format!("bind /proc/{name} onto itself"))?,
        }
        step(
            sys::mount_setattr_recursive(
                &p,
                sys::MOUNT_ATTR_RDONLY
                    | sys::MOUNT_ATTR_NOSUID
                    | sys::MOUNT_ATTR_NODEV
                    | sys::MOUNT_ATTR_NOEXEC,
                0,
            ),
            || format!("make /proc/{name} read-only"),
        )?;
    }
    Ok(sysctl_dir)
}

/// `/dev`: a directory of the (later read-only) root holding the five devices and the
/// standard links.
fn dev_fs(old: &Path, new: &Path) -> Result<()> {
    let dev = new.join("dev");
    mkdir(&dev, 0o755)?;
    // The host's /dev mount, as this namespace has it (detached with the rest of /oldroot
    // before anything of the sandbox runs), takes the device flags once, and each device
    // bind copies them. Where /dev is not a mount of its own, each bind gets them instead.
    let host_dev = old.join("dev");
    let inherited = sys::mount_setattr(&host_dev, DEVICE_SET, DEVICE_CLEAR).is_ok();
    for name in DEVICES {
        bind_device(&host_dev.join(name), &dev.join(name), inherited)?;
    }
    for (link, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        let p = dev.join(link);
        step(symlink(target, &p), || {
            format!("create link {}", p.display())
        })?;
    }
    Ok(())
}

/// An empty file and an empty directory that hide `/proc` entries.
struct Masks<'a> {
    file: &'a Path,
    dir: &'a Path,
}

/// Assemble the sandbox's root and pivot into it. On return the staging root (and the
/// host's root under it) is still stacked over the new root: [`detach_host`] must follow
/// before anything else resolves a path.
///
/// Returns a descriptor (`O_PATH`, close-on-exec) of the new `/proc`'s `sys` directory
/// from before it was made read-only, through which the sandbox's own network sysctls are
/// written once init is in its network namespace (see `sys::small_tcp_buffers`). It must
/// not outlive the build.
pub fn build(plan: &LaunchPlan, handed: &[std::os::fd::OwnedFd]) -> Result<OwnedFd> {
    // Every mount of this namespace (its private copies of the host's) becomes private,
    // so nothing mounted here propagates back to the host and nothing the host mounts later
    // appears here, and read-only, nosuid and nodev, so each bind taken from the host's
    // tree below (under /oldroot) starts with those flags. One call for the whole tree;
    // the host's own mounts are not touched.
    step(
        sys::mount_setattr_recursive_private(
            Path::new("/"),
            sys::MOUNT_ATTR_RDONLY | sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV,
        ),
        || "make every mount private, read-only, nosuid, nodev".to_string(),
    )?;

    // Exact modes for everything made here; the program gets the umask we were given.
    // SAFETY: umask cannot fail.
    let umask = unsafe { libc::umask(0o022) };
    let built = assemble(plan, handed);
    // SAFETY: as above.
    unsafe { libc::umask(umask) };
    built
}

fn assemble(plan: &LaunchPlan, handed: &[std::os::fd::OwnedFd]) -> Result<OwnedFd> {
    // One tmpfs holds the staging root, the masks for /proc, and the new root (a directory
    // bound onto itself to be a mount point).
    let staging = Path::new("/tmp");
    tmpfs(staging, "mode=0755,size=1m", MS_NOSUID | MS_NODEV)?;
    mkdir(&staging.join("oldroot"), 0o755)?;
    mkdir(&staging.join("newroot"), 0o755)?;
    mkdir(&staging.join("image"), 0o755)?;
    mkdir(&staging.join("mask.d"), 0o555)?;
    step(sys::create_file(&staging.join("mask"), b"", 0o444), || {
        "create the mask file".to_string()
    })?;
    step(sys::chdir(staging), || "enter the staging root".to_string())?;
    step(sys::pivot_root(staging, &staging.join("oldroot")), || {
        "pivot into the staging root".to_string()
    })?;
    step(sys::chdir(Path::new("/")), || "enter /".to_string())?;

    let old = Path::new("/oldroot");
    let new = Path::new("/newroot");
    let masks = Masks {
        file: Path::new("/mask"),
        dir: Path::new("/mask.d"),
    };
    step(
        sys::mount(Some(new), new, None, libc::MS_BIND, None),
        || "make the new root a mount point".to_string(),
    )?;
    // The staging root (not the new root, a mount of its own now) is done with: read-only,
    // and noexec, so the masks bound from it carry those flags without a call each.
    remount_ro(Path::new("/"), MS_NOEXEC)?;

    // The monitor's handed-over trees: a `dir:` image's first, then the mounts'.
    let (image_tree, handed) = match (plan.image_handed, handed.split_first()) {
        (true, Some((first, rest))) => (Some(first), rest),
        (true, None) => {
            return Err(fail(
                "no handed-over image",
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ))
        }
        (false, _) => (None, handed),
    };
    // And the workspace's last.
    let (work_tree, handed) = match (plan.work_handed, handed.split_last()) {
        (true, Some((last, rest))) => (Some(last), rest),
        (true, None) => {
            return Err(fail(
                "no handed-over workspace",
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ))
        }
        (false, _) => (None, handed),
    };
    match (&plan.image, image_tree) {
        (Image::Host, _) => host_image(old, new, plan.etc.as_ref())?,
        (Image::Dir(dir), None) => dir_image(&under(old, dir), new, dir)?,
        // Placed on the staging root, which the final pivot detaches with everything on it;
        // the binds of its entries stay.
        (Image::Dir(dir), Some(tree)) => {
            let at = Path::new("/image");
            step(sys::move_mount_here(tree, at), || {
                format!("place the image directory {dir}")
            })?;
            dir_image(at, new, dir)?
        }
    }

    // /proc must be mounted while the host's /proc is still visible: the kernel refuses a
    // new proc mount in a user namespace that could not already see a full one.
    let sysctl_dir = proc_fs(new, &masks, plan)?;
    dev_fs(old, new)?;
    mkdir(&new.join("sys"), 0o555)?;
    mkdir(&new.join("run"), 0o755)?;

    let scratch = format!("size={}", plan.scratch_bytes.max(4096));
    let tmp = new.join("tmp");
    mkdir(&tmp, 0o1777)?;
    tmpfs(&tmp, &format!("mode=1777,{scratch}"), MS_NOSUID | MS_NODEV)?;
    // POSIX shared memory (multiprocessing, joblib): a tmpfs like /tmp, no executables;
    // its pages are charged to the sandbox's memory as any tmpfs page is.
    let shm = new.join("dev/shm");
    mkdir(&shm, 0o1777)?;
    tmpfs(
        &shm,
        &format!("mode=1777,{scratch}"),
        MS_NOSUID | MS_NODEV | libc::MS_NOEXEC,
    )?;
    // No set-id bits, whatever the plan says.
    let work_mode = plan.work_mode & 0o1777;
    let work = new.join("work");
    mkdir(&work, 0o755)?;
    match (&plan.work, work_tree) {
        (Some(dir), Some(tree)) => step(sys::move_mount_here(tree, &work), || {
            format!("place the workspace {dir} at /work")
        })?,
        (Some(dir), None) => bind(&under(old, dir), &work, true)?,
        (None, _) => tmpfs(
            &work,
            &format!("mode={work_mode:04o},{scratch}"),
            MS_NOSUID | MS_NODEV,
        )?,
    }

    // Files written from outside (the agent, scripts, code) on read-only tmpfs mounts of
    // their own: one for /run, one for /zygo.
    let files: Vec<(&str, &[u8])> = plan
        .agents
        .iter()
        .map(|a| (a.path(), crate::agents::contents(*a)))
        .chain(
            plan.files
                .iter()
                .map(|f| (f.path.as_str(), &f.contents[..])),
        )
        .collect();
    for (path, _) in &files {
        let p = under(new, path);
        if !p.starts_with(new.join("run")) && !p.starts_with(new.join("zygo")) {
            return Err(fail(
                format!("injected file {path} is not under /run or /zygo"),
                std::io::Error::from_raw_os_error(libc::EINVAL),
            ));
        }
    }
    for top in ["run", "zygo"] {
        let dir = new.join(top);
        let mine: Vec<_> = files
            .iter()
            .filter(|(path, _)| under(new, path).starts_with(&dir))
            .collect();
        if mine.is_empty() {
            continue;
        }
        let total: usize = mine.iter().map(|(_, c)| c.len() + 4096).sum();
        mkdir(&dir, 0o755)?;
        tmpfs(
            &dir,
            &format!("mode=0755,size={}", total + 65536),
            MS_NOSUID | MS_NODEV,
        )?;
        for (path, contents) in mine {
            let p = under(new, path);
            if let Some(parent) = p.parent() {
                mkdir(parent, 0o755)?;
            }
            step(fs::write(&p, contents), || format!("write {path}"))?;
            step(
                fs::set_permissions(&p, fs::Permissions::from_mode(0o444)),
                || format!("chmod {path}"),
            )?;
        }
        if top == "run" && plan.scripts {
            mkdir(&dir.join("script"), 0o755)?;
        }
        if top == "run" && plan.secrets {
            // Where a request's secrets are mounted (a tmpfs of the request's own).
            mkdir(&dir.join("secrets"), 0o755)?;
        }
        remount_ro(&dir, MS_NOEXEC)?;
    }
    // A runtime pool's scripts: a tmpfs the launcher writes into from outside, mode 0311 so
    // it cannot be listed; owned (as root) by an id the sandbox's processes are not. init
    // hands the launcher a writable mount of it and makes this one read-only
    // (`hand_over_script_dir`), so nothing inside can write there or change its mode.
    if plan.scripts {
        let dir = new.join("run/script");
        mkdir(&dir, 0o755)?;
        let owner = match plan.ids {
            proto::launch::IdMap::Range { count, .. } if count > 65534 => ",uid=65534,gid=65534",
            _ => "",
        };
        tmpfs(
            &dir,
            &format!("mode=0311,{scratch}{owner}"),
            MS_NOSUID | MS_NODEV | MS_NOEXEC,
        )?;
    }

    // The monitor's handed-over mounts, one per handed entry in the plan's order.
    let mut trees = handed.iter();
    for m in &plan.mounts {
        let src = under(old, &m.src);
        let dst = under(new, &m.dst);
        let tree = if m.handed {
            let Some(t) = trees.next() else {
                return Err(fail(
                    format!("no handed-over mount for {}", m.dst),
                    std::io::Error::from_raw_os_error(libc::EINVAL),
                ));
            };
            Some(t)
        } else {
            None
        };
        let is_dir = match tree {
            // The tree as the monitor opened it: its root's type, never the path's now.
            Some(t) => step(
                fs::File::from(step(t.try_clone(), || "copy a descriptor".into())?).metadata(),
                || format!("mount source {}", m.src),
            )?
            .is_dir(),
            None => step(fs::metadata(&src), || format!("mount source {}", m.src))?.is_dir(),
        };
        if !dst.exists() {
            let made = if is_dir {
                mkdir(&dst, 0o755)
            } else {
                dst.parent()
                    .map_or(Ok(()), |p| mkdir(p, 0o755))
                    .and_then(|_| touch(&dst))
            };
            made.map_err(|e| {
                fail(
                    format!(
                        "mount point {} does not exist in the image and cannot be made there",
                        m.dst
                    ),
                    e.source,
                )
            })?;
        }
        match tree {
            // Already read-only unless rw, nosuid and nodev: only placed.
            Some(t) => step(sys::move_mount_here(t, &dst), || {
                format!("place the mount of {} at {}", m.src, m.dst)
            })?,
            None => bind_no_links(old, &m.src, &dst, m.rw)?,
        }
    }

    step(sys::chdir(new), || "enter the new root".to_string())?;
    step(sys::pivot_root(Path::new("."), Path::new(".")), || {
        "pivot into the new root".to_string()
    })?;
    Ok(sysctl_dir)
}

/// The end of the way in, after [`build`]: the staging root, with the host's root still
/// mounted on its `/oldroot`, is stacked over the new root at "/". One lazy detach takes
/// both (a detach is recursive), then the new root is remounted read-only and the plan's
/// working directory entered. Until this runs, paths resolve in the staging root.
///
/// The detach waits for an RCU grace period, which on a kernel without preemption lasts
/// until every other CPU has passed a scheduling point. Init calls this once the network
/// namespace's thread has finished, not while that thread is in the middle of creating
/// the namespace (a long stretch of kernel work) on the other CPU.
pub fn detach_host(plan: &LaunchPlan) -> Result<()> {
    step(sys::umount_detach(Path::new(".")), || {
        "detach the staging root and the host's root".to_string()
    })?;
    step(sys::chdir(Path::new("/")), || "enter /".to_string())?;
    remount_ro(Path::new("/"), 0)?;
    step(sys::chdir(Path::new(&plan.cwd)), || {
        format!("enter working directory {}", plan.cwd)
    })?;
    Ok(())
}
