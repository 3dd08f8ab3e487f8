//! The monitor opens every host path a sandbox mounts, with its own rights, and hands it
//! over as a detached mount: a project in a folder only root can enter is served, `--mount`
//! works behind a 0700 parent, and a path swapped for a symlink after the monitor opened it
//! changes nothing of what is mounted. (Rootless, the sandbox's root is the user itself and
//! the paths are bound with the user's rights: nothing to hand over.)

use std::fs;
use std::os::unix::fs::PermissionsExt;

use serde_json::json;
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "hand-",
    handlers: "import os\n\
               def look(event):\n    \
                   return {\"data\": sorted(os.listdir(\"/data\")),\n            \
                           \"secret\": open(\"/data/secret.txt\").read() if os.path.exists(\"/data/secret.txt\") else None}\n\
               def write(event):\n    \
                   p = \"/data/\" + event[\"name\"]\n    \
                   open(p, \"w\").write(\"from a request\\n\")\n    \
                   open(\"/data/old.txt\", \"a\").write(\"more\\n\")\n    \
                   os.mkdir(p + \".d\")\n    \
                   return {\"old_owner\": os.stat(\"/data/old.txt\").st_uid}\n",
    defaults: "timeout = \"10s\"\nmem = \"128M\"\n",
    agents: false,
};

/// A readable folder `name` (0755, holding a 0644 file) behind a folder only root can
/// enter (0700); its path.
fn private_folder(dir: &TempDir, name: &str, secret: &str) -> std::path::PathBuf {
    let parent = dir.path.join(format!("{name}-private"));
    fs::create_dir(&parent).expect("create a private folder");
    fs::set_permissions(&parent, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    let p = parent.join(name);
    fs::create_dir(&p).expect("create a folder");
    fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).expect("chmod 0755");
    fs::write(p.join("secret.txt"), secret).expect("write the secret");
    fs::set_permissions(p.join("secret.txt"), fs::Permissions::from_mode(0o644))
        .expect("chmod 0644");
    p
}

/// `zygo run --mount` of a folder and of a file whose parent only root can enter.
#[test]
fn mounts_behind_a_folder_only_root_can_enter_are_handed_over() {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o700);
    let folder = private_folder(&dir, "data", "folder secret");
    let flag = format!("{}:/d", folder.display());
    let (v, code) = run_json(Who::Root, &["--mount", &flag], &["cat", "/d/secret.txt"]);
    assert_ok(Who::Root, &v, code);
    assert_eq!(s(&v, "stdout"), "folder secret", "{v}");
    let file = format!("{}:/f.txt", folder.join("secret.txt").display());
    let (v, code) = run_json(
        Who::Root,
        &["--mount", &file],
        &["sh", "-c", "cat /f.txt; echo x > /f.txt"],
    );
    assert_eq!(s(&v, "stdout"), "folder secret", "{v}");
    assert!(s(&v, "stderr").contains("Read-only file system"), "{v}");
    assert_ne!(code, 0);
    // Writable on request.
    // Writable on request (the folder writable by the sandbox's root, which is not the
    // host's).
    let rw = format!("{}:/d:rw", folder.display());
    fs::set_permissions(&folder, fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    let (v, code) = run_json(
        Who::Root,
        &["--mount", &rw],
        &["sh", "-c", "echo written > /d/new.txt"],
    );
    assert_ok(Who::Root, &v, code);
    assert_eq!(
        fs::read_to_string(folder.join("new.txt")).expect("read"),
        "written\n"
    );
}

/// A project whose folder only root can enter is served (its entry folder and a mount of
/// its own), and once served, swapping a mounted path for a symlink changes nothing of
/// what a new zygote mounts.
#[test]
fn a_project_in_a_private_folder_is_served_and_a_later_symlink_changes_nothing() {
    let Some(mut s) = SUITE.root("private") else {
        return;
    };
    let data = private_folder(&s.dir, "data", "the real data");
    let decoy = private_folder(&s.dir, "decoy", "the decoy");
    // The whole project behind a 0700 folder.
    fs::set_permissions(&s.dir.path, fs::Permissions::from_mode(0o700)).expect("chmod");
    let n = s.up(&[(
        "look",
        "look",
        &*format!(
            "max_warm = 3\nmounts = [{{src = \"{}\", dst = \"/data\"}}]",
            data.display()
        ),
    )]);
    let f = &n[0];
    assert_eq!(
        s.call_ok(f, "{}"),
        json!({"data": ["secret.txt"], "secret": "the real data"})
    );
    // The path now names something else.
    fs::rename(&data, data.with_file_name("data.old")).expect("move the data away");
    std::os::unix::fs::symlink(&decoy, &data).expect("plant a symlink");
    // New zygotes mount what the monitor opened when it served the function: end the
    // ones there are (the monitor replaces them), and call the new ones.
    let before = agent_pids(f);
    assert!(!before.is_empty(), "no agent of {f}");
    let inits: Vec<i32> = before.iter().filter_map(|p| ppid(*p)).collect();
    for pid in &before {
        // SAFETY: killing an agent of this test's own supervisor.
        unsafe { libc::kill(*pid, libc::SIGKILL) };
    }
    // A killed agent's parked children outlive it for a moment and look like agents of
    // their own, until its sandbox's init (which exits with the agent) is gone: only then
    // is an agent found the replacement's, started once the supervisor knew.
    let ok = wait_for_quietly(std::time::Duration::from_secs(20), || {
        let now = agent_pids(f);
        inits.iter().all(|p| !alive(*p))
            && !now.is_empty()
            && now.iter().all(|p| !before.contains(p))
            && s.info(f)["zygotes"]["ready"].as_u64() >= Some(1)
    });
    assert!(
        ok,
        "no new zygote: before {before:?} (inits {inits:?}), now {:?}, info {}\n{}",
        agent_pids(f),
        s.info(f),
        s.log()
    );
    for _ in 0..4 {
        let r = s.call_ok(f, "{}");
        assert_eq!(r["secret"], "the real data", "{r}");
    }
    s.shutdown();
}

/// A `dir:` image in a folder only root can enter is handed over too.
#[test]
fn an_image_behind_a_folder_only_root_can_enter_is_handed_over() {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let parent = dir.path.join("private");
    let image = parent.join("image");
    fs::create_dir_all(image.join("usr")).expect("create the image");
    fs::set_permissions(&parent, fs::Permissions::from_mode(0o700)).expect("chmod 0700");
    fs::set_permissions(&image, fs::Permissions::from_mode(0o755)).expect("chmod 0755");
    for (link, to) in [
        ("bin", "usr/bin"),
        ("lib", "usr/lib"),
        ("lib64", "usr/lib64"),
        ("sbin", "usr/sbin"),
    ] {
        std::os::unix::fs::symlink(to, image.join(link)).expect("symlink");
    }
    // The host's /usr, bound into the image for this test alone.
    struct Unbind(std::path::PathBuf);
    impl Drop for Unbind {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount")
                .arg("-l")
                .arg(&self.0)
                .status();
        }
    }
    let usr = image.join("usr");
    let bound = std::process::Command::new("mount")
        .args(["--bind", "-o", "ro", "/usr"])
        .arg(&usr)
        .status()
        .expect("run mount");
    assert!(bound.success(), "bind /usr into the image");
    let _unbind = Unbind(usr);
    let flag = format!("dir:{}", image.display());
    let (v, code) = run_json(
        Who::Root,
        &["--image", &flag],
        &["/bin/sh", "-c", "echo from the image"],
    );
    assert_ok(Who::Root, &v, code);
    assert_eq!(s(&v, "stdout"), "from the image\n", "{v}");
}

/// As root each sandbox is a host uid of its own, and a writable folder is mounted
/// idmapped so that what it writes there has one owner on disk. A writable folder on a
/// filesystem that cannot be idmapped (sysfs here) is refused before anything runs; read-only,
/// the same folder is mounted as it is. A writable folder that can be idmapped keeps the
/// same owner on disk whichever sandbox wrote to it.
#[test]
fn a_writable_folder_that_cannot_be_idmapped_is_refused() {
    if !root_only() {
        return;
    }
    let f = finish({
        let mut c = zygo(Who::Root);
        c.args(["run", "--mount", "/sys/kernel/mm:/m:rw", "--", "true"]);
        c
    });
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("cannot be mounted idmapped"),
        "{}",
        f.stderr_text()
    );
    let f = finish({
        let mut c = zygo(Who::Root);
        c.args(["run", "--mount", "/sys/kernel/mm:/m", "--", "ls", "/m"]);
        c
    });
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    // Two sandboxes write into one writable folder: one owner on disk.
    let dir = TempDir::new(0o777);
    let spec = format!("{}:/out:rw", dir.path.display());
    for name in ["a", "b"] {
        let f = finish({
            let mut c = zygo(Who::Root);
            c.args(["run", "--mount", &spec, "--", "touch"])
                .arg(format!("/out/{name}"));
            c
        });
        assert_eq!(f.code, 0, "{}", f.stderr_text());
    }
    use std::os::unix::fs::MetadataExt;
    let a = fs::metadata(dir.path.join("a")).expect("a").uid();
    let b = fs::metadata(dir.path.join("b")).expect("b").uid();
    assert_eq!(a, b, "two sandboxes' files have different owners on disk");
}

root_and_rootless!(a_link_left_in_a_writable_folder_redirects_no_later_mount);

/// A sandbox given a folder writable leaves a link in it, pointing at a host folder it
/// was never given; a later `--mount` of a path through that link is refused, naming the
/// link, and the host folder is never mounted. (Zygo used to open mount sources following
/// links, with root's rights as root.) The same holds for a function's `mounts` entry.
fn a_link_left_in_a_writable_folder_redirects_no_later_mount(who: Who) {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let shared = dir.path.join("shared");
    fs::create_dir(&shared).expect("mkdir");
    fs::set_permissions(&shared, fs::Permissions::from_mode(0o777)).expect("chmod 0777");
    // A folder of the runner's that no sandbox was given (readable, so that a mount of it
    // would show).
    let secret = dir.path.join("secret");
    fs::create_dir(&secret).expect("mkdir");
    fs::write(secret.join("key.txt"), "host secret").expect("write");
    if who == Who::Rootless {
        let r = rootless_setup();
        for p in [&secret, &secret.join("key.txt")] {
            std::os::unix::fs::chown(p, Some(r.uid), Some(r.gid)).expect("chown");
        }
    }
    let rw = format!("{}:/shared:rw", shared.display());
    // Relative, so that it names the host folder wherever it is resolved.
    let plant = "ln -s ../secret /shared/sub";
    let (v, code) = run_json(who, &["--mount", &rw], &["sh", "-c", plant]);
    assert_ok(who, &v, code);
    assert!(fs::symlink_metadata(shared.join("sub"))
        .expect("the planted link")
        .file_type()
        .is_symlink());
    let later = format!("{}:/data", shared.join("sub").display());
    let (v, code) = run_json(who, &["--mount", &later], &["cat", "/data/key.txt"]);
    assert_ne!(
        s(&v, "stdout"),
        "host secret",
        "a planted link was followed: {v}"
    );
    assert_ne!(code, 0, "{v}");
    let err = s(&v, "error");
    assert!(
        err.contains(&format!(
            "{} is a symbolic link",
            shared.join("sub").display()
        )),
        "{v}"
    );
    // A path below the link, too.
    let deeper = format!("{}:/data", shared.join("sub/key.txt").display());
    let (v, _) = run_json(who, &["--mount", &deeper], &["cat", "/data"]);
    assert_ne!(
        s(&v, "stdout"),
        "host secret",
        "a planted link was followed: {v}"
    );
    assert!(s(&v, "error").contains("is a symbolic link"), "{v}");
}

/// Who a sandbox of `who` writes as on disk in a folder of its caller's: root, or the
/// rootless user.
fn callers_ids(who: Who) -> (u32, u32) {
    match who {
        Who::Root => (0, 0),
        Who::Rootless => {
            let r = rootless_setup();
            (r.uid, r.gid)
        }
    }
}

/// A folder `name` in `dir` owned by `uid`:`gid` with `mode`, holding `old.txt` ("old\n",
/// 0644, the same owner); its path.
fn owned_folder(
    dir: &std::path::Path,
    name: &str,
    uid: u32,
    gid: u32,
    mode: u32,
) -> std::path::PathBuf {
    let p = dir.join(name);
    fs::create_dir(&p).expect("create a folder");
    fs::write(p.join("old.txt"), "old\n").expect("write old.txt");
    fs::set_permissions(p.join("old.txt"), fs::Permissions::from_mode(0o644)).expect("chmod");
    for f in [p.join("old.txt"), p.clone()] {
        std::os::unix::fs::chown(&f, Some(uid), Some(gid)).expect("chown");
    }
    fs::set_permissions(&p, fs::Permissions::from_mode(mode)).expect("chmod the folder");
    p
}

/// The owner (uid, gid) of a file on disk.
fn owner_on_disk(p: &std::path::Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = fs::symlink_metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    (m.uid(), m.gid())
}

root_and_rootless!(a_writable_folder_keeps_its_owner_on_disk);

/// `zygo run --mount SRC:DST:rw` of an existing folder of the caller's (as root, a folder
/// owned by root, 0755): the sandbox writes there as the folder's owner. Its new files and
/// folders are the owner's on disk (never a subordinate uid of Zygo's), and the owner's
/// existing files are the sandbox's root's inside, and writable. A folder the sandbox
/// could not write is refused before anything runs, naming it.
fn a_writable_folder_keeps_its_owner_on_disk(who: Who) {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let (uid, gid) = callers_ids(who);
    let folder = owned_folder(&dir.path, "data", uid, gid, 0o755);
    let rw = format!("{}:/d:rw", folder.display());
    let write = "echo new > /d/new.txt && echo more >> /d/old.txt && mkdir /d/sub && \
                 echo deep > /d/sub/f && stat -c %u:%g /d /d/old.txt";
    let (v, code) = run_json(who, &["--mount", &rw], &["sh", "-c", write]);
    assert_ok(who, &v, code);
    assert_eq!(s(&v, "stdout"), "0:0\n0:0\n", "{v}");
    for p in ["new.txt", "sub", "sub/f", "old.txt"] {
        assert_eq!(owner_on_disk(&folder.join(p)), (uid, gid), "{p}");
    }
    assert_eq!(
        fs::read_to_string(folder.join("old.txt")).expect("read"),
        "old\nmore\n"
    );
    // A folder the sandbox cannot write: rootless, one of root's; as root, one whose
    // owner has no write permission on it.
    let (theirs, mode) = match who {
        Who::Root => (owned_folder(&dir.path, "closed", 0, 0, 0o555), 0o555),
        Who::Rootless => (owned_folder(&dir.path, "roots", 0, 0, 0o755), 0o755),
    };
    let spec = format!("{}:/d:rw", theirs.display());
    let (v, code) = run_json(who, &["--mount", &spec], &["touch", "/d/x"]);
    assert_eq!(code, 1, "{v}");
    assert_eq!(v["started"], false, "{v}");
    assert_eq!(v["phase"], "plan", "{v}");
    let err = s(&v, "error");
    assert!(
        err.contains(&theirs.display().to_string()) && err.contains("read-only"),
        "[{}] the refusal names neither the folder nor the way out (mode {mode:o}): {v}",
        who.name()
    );
    assert!(!theirs.join("x").exists());
    // Read-only, the same folder is mounted.
    let ro = format!("{}:/d", theirs.display());
    let (v, code) = run_json(who, &["--mount", &ro], &["cat", "/d/old.txt"]);
    assert_ok(who, &v, code);
}

/// As root, a writable folder of another user's is written as that user: the folder's
/// owner, not the caller.
#[test]
fn a_writable_folder_of_another_user_is_written_as_that_user() {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let folder = owned_folder(&dir.path, "theirs", 4321, 4322, 0o700);
    let rw = format!("{}:/d:rw", folder.display());
    let (v, code) = run_json(
        Who::Root,
        &["--mount", &rw],
        &[
            "sh",
            "-c",
            "echo x > /d/made && mkdir /d/dir && echo y >> /d/old.txt",
        ],
    );
    assert_ok(Who::Root, &v, code);
    for p in ["made", "dir", "old.txt"] {
        assert_eq!(owner_on_disk(&folder.join(p)), (4321, 4322), "{p}");
    }
}

root_and_rootless!(no_set_id_file_is_made_in_a_writable_folder);

/// A sandbox writes a writable folder as its owner (root's, as root), so a set-user-id or
/// set-group-id file it made there would run as that owner on the host: every way of
/// making one is refused (creating with the bits, chmod, fchmod, mknod; openat2, whose mode
/// seccomp cannot read, is ENOSYS), and nothing set-id is left on disk. An ordinary chmod
/// still works. (The folder is open to all, so that whoever the sandbox is on disk, it can
/// write there.)
fn no_set_id_file_is_made_in_a_writable_folder(who: Who) {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let (uid, gid) = callers_ids(who);
    let folder = owned_folder(&dir.path, "data", uid, gid, 0o777);
    let rw = format!("{}:/d:rw", folder.display());
    let code = r#"
import ctypes, errno, os, struct
out = []
def attempt(name, f):
    try:
        f()
        out.append(name + " ok")
    except OSError as e:
        out.append(name + " " + errno.errorcode[e.errno])
attempt("create", lambda: os.close(os.open("/d/a", os.O_CREAT | os.O_WRONLY, 0o4755)))
open("/d/b", "w").close()
attempt("chmod-u", lambda: os.chmod("/d/b", 0o4755))
attempt("chmod-g", lambda: os.chmod("/d/b", 0o2755))
fd = os.open("/d/b", os.O_RDONLY)
attempt("fchmod", lambda: os.fchmod(fd, 0o6755))
attempt("mknod", lambda: os.mknod("/d/c", 0o104755))
libc = ctypes.CDLL(None, use_errno=True)
how = struct.pack("QQQ", os.O_CREAT | os.O_WRONLY, 0o4755, 0)
r = libc.syscall(437, -100, b"/d/e", how, 24)
out.append("openat2 " + ("ok" if r >= 0 else errno.errorcode[ctypes.get_errno()]))
attempt("chmod", lambda: os.chmod("/d/b", 0o750))
print(" ".join(out))
"#;
    let (v, code) = py(who, &["--mount", &rw], code);
    assert_ok(who, &v, code);
    assert_eq!(
        s(&v, "stdout"),
        "create EPERM chmod-u EPERM chmod-g EPERM fchmod EPERM mknod EPERM openat2 ENOSYS chmod ok\n",
        "[{}] {v}",
        who.name()
    );
    use std::os::unix::fs::PermissionsExt as _;
    for e in fs::read_dir(&folder).expect("list the folder").flatten() {
        let mode = e.metadata().expect("stat").permissions().mode();
        assert_eq!(mode & 0o6000, 0, "{} is set-id on disk", e.path().display());
    }
}

/// `zygo mcp --workspace DIR` with these lines of JSON-RPC after `initialize`, stdin then
/// closed: the answers (one per line of stdout), stderr and the exit code.
fn mcp(who: Who, args: &[&str], calls: &[serde_json::Value]) -> (Vec<serde_json::Value>, Finished) {
    let (rt, st) = (TempDir::new(0o700), TempDir::new(0o700));
    if who == Who::Rootless {
        let r = rootless_setup();
        for d in [&rt, &st] {
            std::os::unix::fs::chown(&d.path, Some(r.uid), Some(r.gid)).expect("chown");
        }
    }
    let mut input = String::from(
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18"}}"#,
    );
    for c in calls {
        input.push('\n');
        input.push_str(&c.to_string());
    }
    input.push('\n');
    let stdin = dir_file(&st, "input", &input, who);
    let mut c = zygo(who);
    c.env("ZYGO_RUNTIME_DIR", &rt.path)
        .env("ZYGO_STATE_DIR", &st.path)
        .arg("mcp")
        .args(args)
        .stdin(fs::File::open(&stdin).expect("open the input"));
    let f = finish(c);
    let answers = f
        .stdout_text()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    (answers, f)
}

/// A file in `dir` holding `text`, readable by `who`.
fn dir_file(dir: &TempDir, name: &str, text: &str, who: Who) -> std::path::PathBuf {
    let p = dir.file(name, text.as_bytes());
    if who == Who::Rootless {
        let r = rootless_setup();
        std::os::unix::fs::chown(&p, Some(r.uid), Some(r.gid)).expect("chown");
    }
    p
}

fn run_code(id: i64, code: &str) -> serde_json::Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": "run_code", "arguments": {"language": "python", "code": code}}})
}

root_and_rootless!(an_mcp_workspace_keeps_its_owner_on_disk);

/// `zygo mcp --workspace DIR` on an existing folder of the caller's (as root, root's):
/// `run_code` writes there as the folder's owner, new files are the owner's on disk, the
/// owner's files are writable; a workspace `zygo mcp` makes is the caller's. A workspace
/// the sandbox could not write is refused when the server starts, naming it.
fn an_mcp_workspace_keeps_its_owner_on_disk(who: Who) {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let (uid, gid) = callers_ids(who);
    let ws = owned_folder(&dir.path, "ws", uid, gid, 0o755);
    let code = "import os\n\
                open('/work/new.txt', 'w').write('new')\n\
                open('/work/old.txt', 'a').write('more\\n')\n\
                os.mkdir('/work/sub')\n\
                print(os.stat('/work/old.txt').st_uid, os.stat('/work').st_uid)\n";
    let ws_s = ws.to_str().expect("UTF-8").to_string();
    let (answers, f) = mcp(who, &["--workspace", &ws_s], &[run_code(1, code)]);
    let r = answers.iter().find(|a| a["id"] == 1).unwrap_or_else(|| {
        panic!(
            "[{}] no answer to run_code: {}",
            who.name(),
            f.stderr_text()
        )
    });
    assert_eq!(r["result"]["isError"], false, "{r}\n{}", f.stderr_text());
    assert_eq!(r["result"]["structuredContent"]["stdout"], "0 0\n", "{r}");
    for p in ["new.txt", "sub", "old.txt"] {
        assert_eq!(owner_on_disk(&ws.join(p)), (uid, gid), "{p}");
    }
    assert_eq!(
        fs::read_to_string(ws.join("old.txt")).expect("read"),
        "old\nmore\n"
    );
    // A workspace zygo mcp makes is the caller's, and so is what is written there.
    let made = dir.path.join("made");
    if who == Who::Rootless {
        fs::set_permissions(&dir.path, fs::Permissions::from_mode(0o777)).expect("chmod");
    }
    let made_s = made.to_str().expect("UTF-8").to_string();
    let (answers, f) = mcp(
        who,
        &["--workspace", &made_s],
        &[run_code(2, "open('/work/f', 'w').write('x')")],
    );
    let r = answers.iter().find(|a| a["id"] == 2);
    assert!(
        r.is_some_and(|r| r["result"]["isError"] == false),
        "{r:?}\n{}",
        f.stderr_text()
    );
    assert_eq!(owner_on_disk(&made), (uid, gid));
    assert_eq!(owner_on_disk(&made.join("f")), (uid, gid));
    // A workspace the sandbox cannot write.
    let theirs = match who {
        Who::Root => owned_folder(&dir.path, "closed", 0, 0, 0o555),
        Who::Rootless => owned_folder(&dir.path, "roots", 0, 0, 0o755),
    };
    let theirs_s = theirs.to_str().expect("UTF-8").to_string();
    let (_, f) = mcp(who, &["--workspace", &theirs_s], &[run_code(3, "print(1)")]);
    assert_eq!(f.code, 1, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains(&theirs_s) && f.stderr_text().contains("another --workspace"),
        "[{}] {}",
        who.name(),
        f.stderr_text()
    );
}

root_and_rootless!(a_functions_writable_mount_keeps_its_owner_on_disk);

/// A function's `mounts` entry with `rw = true` on an existing folder of the caller's (as
/// root, root's): its requests write there as the folder's owner, new files are the
/// owner's on disk, the owner's files writable. A folder the sandbox could not write is
/// refused when the function is served, naming it.
fn a_functions_writable_mount_keeps_its_owner_on_disk(who: Who) {
    if !root_only() {
        return;
    }
    let mut s = SUITE.sup(who, "owner");
    let (uid, gid) = callers_ids(who);
    let data = owned_folder(&s.dir.path, "data", uid, gid, 0o755);
    let table = |p: &std::path::Path| {
        format!(
            "mounts = [{{src = \"{}\", dst = \"/data\", rw = true}}]",
            p.display()
        )
    };
    let n = s.up(&[("w", "write", &*table(&data))]);
    for name in ["one", "two"] {
        let r = s.call_ok(&n[0], &format!("{{\"name\": \"{name}\"}}"));
        assert_eq!(r["old_owner"], 0, "{r}");
        for p in [name.to_string(), format!("{name}.d")] {
            assert_eq!(owner_on_disk(&data.join(&p)), (uid, gid), "{p}");
        }
    }
    assert_eq!(
        fs::read_to_string(data.join("old.txt")).expect("read"),
        "old\nmore\nmore\n"
    );
    s.shutdown();
    // A folder the sandbox cannot write.
    let mut s = SUITE.sup(who, "closed");
    let theirs = match who {
        Who::Root => owned_folder(&s.dir.path, "closed", 0, 0, 0o555),
        Who::Rootless => owned_folder(&s.dir.path, "roots", 0, 0, 0o755),
    };
    let (file, _) = s.write_toml(&[("w", "write", &*table(&theirs))]);
    let f = s.run(&["up", "-f", file.to_str().expect("UTF-8")]);
    s.find_supervisor();
    assert_ne!(f.code, 0, "{}", f.stdout_text());
    let said = format!("{}{}", f.stdout_text(), f.stderr_text());
    assert!(
        said.contains(&theirs.display().to_string()) && said.contains("read-only"),
        "[{}] {said}",
        who.name()
    );
    s.shutdown();
}

/// A read-only mount inside a folder handed writable stays read-only in the sandbox, as it
/// is for the host: only the folder's own mount is made writable. (The read-only bind is
/// made in a mount namespace of the test's own, which `zygo run` starts in.)
#[test]
fn a_read_only_mount_inside_a_writable_folder_stays_read_only() {
    if !root_only() {
        return;
    }
    let dir = TempDir::new(0o755);
    let rw = dir.path.join("rw");
    let victim = dir.path.join("victim");
    fs::create_dir_all(rw.join("sub")).expect("mkdir");
    fs::create_dir(&victim).expect("mkdir");
    fs::write(victim.join("file"), "original\n").expect("write");
    let script = format!(
        "set -e; mount --bind {v} {rw}/sub; mount -o remount,bind,ro {rw}/sub; \
         exec {z} run --json --mount {rw}:/d:rw -- sh -c \
         'echo new > /d/top.txt; echo changed > /d/sub/file; echo made > /d/sub/new'",
        v = victim.display(),
        rw = rw.display(),
        z = zygo_bin().display()
    );
    let out = std::process::Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_ne!(v["exit_code"], 0, "the read-only mount was written: {v}");
    assert!(s(&v, "stderr").contains("Read-only file system"), "{v}");
    assert_eq!(
        fs::read_to_string(victim.join("file")).expect("read"),
        "original\n"
    );
    assert!(
        !victim.join("new").exists(),
        "a file was made in the read-only mount"
    );
    // The folder's own mount is writable.
    assert_eq!(
        fs::read_to_string(rw.join("top.txt")).expect("top.txt"),
        "new\n"
    );
}

root_and_rootless!(a_writable_folder_holding_a_set_id_program_is_refused);

/// A folder handed writable is written as its owner, and a write through a shared mapping
/// changes a set-user-id program without clearing the bit: so a writable folder that holds
/// one (set-uid or set-gid, at any depth) is refused before anything runs, naming the
/// file, on `zygo run --mount` and for a function's mount. Read-only, it is mounted; with
/// the bits taken off, writable too.
fn a_writable_folder_holding_a_set_id_program_is_refused(who: Who) {
    if !root_only() {
        return;
    }
    use std::os::unix::fs::PermissionsExt as _;
    let dir = TempDir::new(0o755);
    let (uid, gid) = callers_ids(who);
    let folder = owned_folder(&dir.path, "data", uid, gid, 0o755);
    let deep = folder.join("a/b");
    fs::create_dir_all(&deep).expect("mkdir");
    for d in [folder.join("a"), deep.clone()] {
        std::os::unix::fs::chown(&d, Some(uid), Some(gid)).expect("chown");
    }
    let prog = deep.join("prog");
    fs::write(&prog, "#!/bin/sh\nid\n").expect("write");
    std::os::unix::fs::chown(&prog, Some(uid), Some(gid)).expect("chown");
    for mode in [0o4755, 0o2755, 0o2644] {
        fs::set_permissions(&prog, fs::Permissions::from_mode(mode)).expect("chmod");
        let rw = format!("{}:/d:rw", folder.display());
        let (v, code) = run_json(who, &["--mount", &rw], &["true"]);
        assert_eq!(code, 1, "[{}] mode {mode:o}: {v}", who.name());
        assert_eq!(v["started"], false, "{v}");
        let err = s(&v, "error");
        assert!(
            err.contains(&prog.display().to_string()) && err.contains("set-user-id"),
            "[{}] {v}",
            who.name()
        );
        let ro = format!("{}:/d", folder.display());
        let (v, code) = run_json(who, &["--mount", &ro], &["cat", "/d/a/b/prog"]);
        assert_ok(who, &v, code);
    }
    // A function's writable mount is checked when it is served.
    let mut sup = SUITE.sup(who, "setid");
    let table = format!(
        "mounts = [{{src = \"{}\", dst = \"/data\", rw = true}}]",
        folder.display()
    );
    let (file, _) = sup.write_toml(&[("w", "write", &*table)]);
    let f = sup.run(&["up", "-f", file.to_str().expect("UTF-8")]);
    sup.find_supervisor();
    assert_ne!(f.code, 0, "{}", f.stdout_text());
    let said = format!("{}{}", f.stdout_text(), f.stderr_text());
    assert!(
        said.contains(&prog.display().to_string()),
        "[{}] {said}",
        who.name()
    );
    sup.shutdown();
    // Without the bits, the folder is handed writable.
    fs::set_permissions(&prog, fs::Permissions::from_mode(0o755)).expect("chmod");
    let rw = format!("{}:/d:rw", folder.display());
    let (v, code) = run_json(
        who,
        &["--mount", &rw],
        &["sh", "-c", "echo ok > /d/a/b/new"],
    );
    assert_ok(who, &v, code);
}
