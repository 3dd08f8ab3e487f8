//! Dependency sets (`zygo deps build IMAGE FILE...`): a requirements.txt installed once
//! into a venv at `/venv`, by a build sandbox that reaches only the package registries.
//!
//! No packet leaves this machine: the "registry" is a test host in a network namespace
//! the test creates (a veth pair with private addresses of its own), serving a PyPI
//! "simple" index with a small pure-Python wheel the test makes, on [`INDEX`]; the same
//! host serves another wheel on [`OTHER`], which no rule names. The build is pointed at
//! the index the way an operator points it at a mirror: `ZYGO_DEPS_PIP_INDEX_URL`, and
//! `ZYGO_DEPS_REGISTRIES` naming only that address and port.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;
use zygo_tests::netns::{Layout, TestHost};
use zygo_tests::*;

const INDEX: u16 = 8080;
const OTHER: u16 = 8081;

/// Makes the wheels and the index in `sys.argv[1]`: `zygodemo` (a module and a console
/// script) under `simple/` and `packages/`, and `zygoother` at the top (served on the
/// other port).
const MAKE_INDEX: &str = r#"
import base64, hashlib, os, sys, zipfile
root = sys.argv[1]
def wheel(name, files, where):
    info = f"{name}-1.0.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    files[f"{info}/WHEEL"] = "Wheel-Version: 1.0\nGenerator: zygo-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = "\n".join(record) + "\n"
    os.makedirs(where, exist_ok=True)
    fname = f"{name}-1.0-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(where, fname), "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return fname
demo = wheel("zygodemo", {
    "zygodemo/__init__.py": "VALUE = 'zygodemo 1.0'\ndef main():\n    print('console ' + VALUE)\n",
    "zygodemo-1.0.dist-info/entry_points.txt": "[console_scripts]\nzygodemo = zygodemo:main\n",
}, os.path.join(root, "index", "packages"))
os.makedirs(os.path.join(root, "index", "simple", "zygodemo"))
with open(os.path.join(root, "index", "simple", "zygodemo", "index.html"), "w") as f:
    f.write(f'<html><body><a href="../../packages/{demo}">{demo}</a></body></html>\n')
with open(os.path.join(root, "index", "simple", "index.html"), "w") as f:
    f.write('<html><body><a href="zygodemo/">zygodemo</a></body></html>\n')
wheel("zygoother", {"zygoother/__init__.py": "VALUE = 1\n"}, os.path.join(root, "other"))
import io, json, tarfile
def npm_package(name, files, where):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        files = dict(files)
        files["package.json"] = json.dumps({"name": name, "version": "1.0.0", "main": "index.js"})
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo("package/" + path)
            info.size, info.mode = len(data), 0o644
            t.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    fname = f"{name}-1.0.0.tgz"
    with open(os.path.join(where, fname), "wb") as f:
        f.write(data)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
    return fname, integrity
def app(dirname, name, port, fname, integrity):
    d = os.path.join(root, dirname)
    os.makedirs(d)
    with open(os.path.join(d, "package.json"), "w") as f:
        json.dump({"name": "app", "version": "1.0.0", "dependencies": {name: "1.0.0"}}, f)
    lock = {"name": "app", "version": "1.0.0", "lockfileVersion": 3, "requires": True,
            "packages": {"": {"name": "app", "version": "1.0.0", "dependencies": {name: "1.0.0"}},
                         "node_modules/" + name: {"version": "1.0.0",
                            "resolved": f"http://HOST:{port}/{fname}", "integrity": integrity}}}
    with open(os.path.join(d, "package-lock.json"), "w") as f:
        json.dump(lock, f)
# zygoevil: an sdist whose setup.py (run by pip as it installs) tries the other port.
setup_py = f"""import socket, sys
from setuptools import setup
s = socket.socket()
s.settimeout(5)
try:
    s.connect(({sys.argv[2]!r}, 8081))
    s.sendall(b"GET /evil HTTP/1.0\\r\\n\\r\\n")
    s.recv(100)
    print("zygoevil reached the other port")
except OSError as e:
    sys.exit("zygoevil could not reach the other port: %s" % e)
setup(name="zygoevil", version="1.0", py_modules=[])
"""
pkg_info = "Metadata-Version: 2.1\nName: zygoevil\nVersion: 1.0\n"
buf = io.BytesIO()
with tarfile.open(fileobj=buf, mode="w:gz") as t:
    for path, text in (("setup.py", setup_py), ("PKG-INFO", pkg_info)):
        data = text.encode()
        info = tarfile.TarInfo("zygoevil-1.0/" + path)
        info.size, info.mode = len(data), 0o644
        t.addfile(info, io.BytesIO(data))
with open(os.path.join(root, "index", "packages", "zygoevil-1.0.tar.gz"), "wb") as f:
    f.write(buf.getvalue())
os.makedirs(os.path.join(root, "index", "simple", "zygoevil"))
with open(os.path.join(root, "index", "simple", "zygoevil", "index.html"), "w") as f:
    f.write('<html><body><a href="../../packages/zygoevil-1.0.tar.gz">zygoevil-1.0.tar.gz</a></body></html>\n')
# Hostile sdists: each setup.py (run by pip in the build) leaves something in /venv.
def hostile(name, body):
    setup = body + f"\nfrom setuptools import setup\nsetup(name={name!r}, version='1.0', py_modules=[])\n"
    info = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for path, text in (("setup.py", setup), ("PKG-INFO", info)):
            data = text.encode()
            ti = tarfile.TarInfo(f"{name}-1.0/" + path)
            ti.size, ti.mode = len(data), 0o644
            t.addfile(ti, io.BytesIO(data))
    with open(os.path.join(root, "index", "packages", f"{name}-1.0.tar.gz"), "wb") as f:
        f.write(buf.getvalue())
    os.makedirs(os.path.join(root, "index", "simple", name))
    with open(os.path.join(root, "index", "simple", name, "index.html"), "w") as f:
        f.write(f'<html><body><a href="../../packages/{name}-1.0.tar.gz">{name}-1.0.tar.gz</a></body></html>\n')
# A folder chain 19,000 deep (deeper than any stack walks by recursion).
# (pip runs a setup.py twice: for its metadata, then to install.)
hostile("zygodeep", "import os\nif not os.path.exists('/venv/d'):\n    os.chdir('/venv')\n    for _ in range(19000):\n        os.mkdir('d')\n        os.chdir('d')\n    os.chdir('/')\n")
# A setup.py that takes a minute.
hostile("zygoslow", "import time\ntime.sleep(60)\n")
# 64 MiB in /venv, in 1 MiB writes.
hostile("zygobig", "with open('/venv/big', 'wb') as f:\n    for _ in range(64):\n        f.write(b'x' * (1 << 20))\n")
fname, integrity = npm_package("zygonode", {"index.js": "module.exports = { value: 'zygonode 1.0' };\n"},
                               os.path.join(root, "index"))
app("node-app", "zygonode", 8080, fname, integrity)
fname, integrity = npm_package("zygoevil", {"index.js": "module.exports = 1;\n"}, os.path.join(root, "other"))
app("node-evil", "zygoevil", 8081, fname, integrity)
"#;

/// Serves `<root>/index` on INDEX and `<root>/other` on OTHER at `sys.argv[1]`, printing
/// `PORT PATH` for every request.
const SERVER: &str = r#"
import functools, http.server, sys, threading
host, root = sys.argv[1], sys.argv[2]
class H(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def do_GET(self):
        print(self.server.server_address[1], self.path, flush=True)
        super().do_GET()
def serve(port, d):
    s = http.server.ThreadingHTTPServer((host, port), functools.partial(H, directory=d))
    s.serve_forever()
threading.Thread(target=serve, args=(8080, root + "/index"), daemon=True).start()
threading.Thread(target=serve, args=(8081, root + "/other"), daemon=True).start()
print("ready", flush=True)
sys.stdin.read()
"#;

/// A test host serving the index at `host`: `zygo-dp-…`, in 10.214.0.0/16. Removed, with
/// its server and files, when dropped.
struct IndexHost {
    net: TestHost,
    host: String,
    files: TempDir,
}

const LAYOUT: Layout = Layout {
    tag: "dp",
    subnet: 214,
};

impl IndexHost {
    fn new() -> IndexHost {
        let files = TempDir::new(0o755);
        // The index names the host's address, so it is made once that is known (the
        // server reads its files per request).
        let net = TestHost::start(&LAYOUT, SERVER, &[files.str()]);
        let made = Command::new("python3")
            .args(["-c", MAKE_INDEX, files.str(), &net.host])
            .output()
            .expect("run python3");
        assert!(
            made.status.success(),
            "make the index: {}",
            String::from_utf8_lossy(&made.stderr)
        );
        IndexHost {
            host: net.host.clone(),
            net,
            files,
        }
    }

    /// Every request the server has logged since the last call.
    fn requests(&self) -> Vec<String> {
        self.net.events()
    }
}

/// A state directory of the test's own and the files it builds from.
struct Env {
    dir: TempDir,
    state: PathBuf,
    who: Who,
}

impl Env {
    fn new() -> Env {
        Env::as_who(Who::Root)
    }

    /// A state directory `who` owns.
    fn as_who(who: Who) -> Env {
        let dir = TempDir::new(0o755);
        let state = dir.path.join("state");
        if who == Who::Rootless {
            let r = rootless_setup();
            std::fs::create_dir(&state).expect("mkdir state");
            std::os::unix::fs::chown(&state, Some(r.uid), Some(r.gid)).expect("chown");
        }
        Env { dir, state, who }
    }

    /// `zygo deps ARGS --json` with the registries and index pointed at `h`.
    fn deps(&self, h: &IndexHost, args: &[&str]) -> (Value, Finished) {
        self.deps_with(h, &[], args)
    }

    /// [`Env::deps`] with `env` set on top.
    fn deps_with(&self, h: &IndexHost, env: &[(&str, &str)], args: &[&str]) -> (Value, Finished) {
        let mut c = zygo(self.who);
        c.env("ZYGO_STATE_DIR", &self.state)
            .env("ZYGO_DEPS_REGISTRIES", format!("{}:{INDEX}", h.host))
            .env(
                "ZYGO_DEPS_PIP_INDEX_URL",
                format!("http://{}:{INDEX}/simple/", h.host),
            )
            .env(
                "ZYGO_DEPS_NPM_REGISTRY",
                format!("http://{}:{INDEX}/", h.host),
            )
            .envs(env.iter().copied())
            .arg("deps")
            .args(args)
            .arg("--json");
        let f = finish(c);
        (f.last_json(), f)
    }

    /// The Node app `dir` of the index (`node-app` or `node-evil`) with `h`'s address in
    /// its lock file: the paths of its package.json and package-lock.json.
    fn node_app(&self, h: &IndexHost, dir: &str) -> [String; 2] {
        let d = self.dir.path.join(dir);
        std::fs::create_dir_all(&d).expect("mkdir");
        ["package.json", "package-lock.json"].map(|name| {
            let text = std::fs::read_to_string(h.files.path.join(dir).join(name))
                .expect("read the app's file");
            let p = d.join(name);
            std::fs::write(&p, text.replace("HOST", &h.host)).expect("write");
            p.to_str().expect("UTF-8").to_string()
        })
    }

    fn requirements(&self, name: &str, text: &str) -> String {
        let d = self.dir.path.join(name);
        std::fs::create_dir_all(&d).expect("mkdir");
        let p = d.join("requirements.txt");
        std::fs::write(&p, text).expect("write requirements.txt");
        p.to_str().expect("UTF-8").to_string()
    }

    fn tree(&self, id: &str) -> PathBuf {
        self.state.join("deps").join(id).join("tree")
    }
}

fn mode_of(p: &Path) -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::symlink_metadata(p).expect("stat").mode() & 0o7777
}

/// Every path under `p` (not following symlinks) that anyone may write to, or that does
/// not belong to `uid`:`gid`.
fn writable_or_foreign(p: &Path, out: &mut Vec<String>) {
    not_sealed(p, (0, 0), out)
}

fn not_sealed(p: &Path, owner: (u32, u32), out: &mut Vec<String>) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(p).expect("stat");
    if (m.uid(), m.gid()) != owner {
        out.push(format!("{} owned by {}:{}", p.display(), m.uid(), m.gid()));
    }
    if !m.file_type().is_symlink() && m.mode() & 0o222 != 0 {
        out.push(format!("{} mode {:o}", p.display(), m.mode() & 0o7777));
    }
    if m.is_dir() {
        for e in std::fs::read_dir(p).expect("read_dir") {
            not_sealed(&e.expect("entry").path(), owner, out);
        }
    }
}

root_and_rootless!(a_python_set_builds_once_and_a_sandbox_imports_it);

/// A requirements.txt naming the index's package builds into a venv at /venv: ready, its
/// id a hash, the tree read-only (and root's, as root); a sandbox given the tree at /venv
/// imports the package and runs its console script. The same file again is the same set,
/// not a second build.
fn a_python_set_builds_once_and_a_sandbox_imports_it(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::as_who(who);
    let req = env.requirements("a", "zygodemo==1.0\n");
    let (v, f) = env.deps(&h, &["build", "host", &req]);
    assert_eq!(f.code, 0, "{v} {}", f.stderr_text());
    assert_eq!(s(&v, "state"), "ready", "{v}");
    assert_eq!(s(&v, "kind"), "python", "{v}");
    let id = s(&v, "id").to_string();
    assert!(
        id.starts_with("deps_") && is_hex(&id[5..], 64),
        "{id:?} is not deps_ and a SHA-256"
    );
    let got = h.requests();
    assert!(
        got.iter()
            .any(|r| r.contains("zygodemo-1.0-py3-none-any.whl")),
        "the build fetched the wheel from the index: {got:?}"
    );
    let tree = env.tree(&id);
    assert_eq!(mode_of(&tree), 0o555);
    let owner = match who {
        Who::Root => (0, 0),
        Who::Rootless => {
            let r = rootless_setup();
            (r.uid, r.gid)
        }
    };
    let mut bad = Vec::new();
    not_sealed(&tree, owner, &mut bad);
    assert!(bad.is_empty(), "the installed tree is not sealed: {bad:?}");

    // A sandbox with the tree at /venv imports the package and runs its console script.
    let mount = format!("{}:/venv", tree.display());
    let (out, code) = run_json(
        who,
        &["--mount", &mount],
        &[
            "/bin/sh",
            "-c",
            "/venv/bin/python -c 'import zygodemo; print(zygodemo.VALUE)' && /venv/bin/zygodemo",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        s(&out, "stdout"),
        "zygodemo 1.0\nconsole zygodemo 1.0\n",
        "{out}"
    );

    // The same inputs: the same id, ready at once, nothing fetched.
    let (again, f) = env.deps(&h, &["build", "host", &req]);
    assert_eq!(f.code, 0, "{again}");
    assert_eq!(s(&again, "id"), id);
    assert_eq!(s(&again, "state"), "ready");
    assert_eq!(h.requests(), Vec::<String>::new(), "a second build ran");
    // show and ls see it.
    let (shown, f) = env.deps(&h, &["show", &id]);
    assert_eq!(f.code, 0, "{shown}");
    assert_eq!(s(&shown, "state"), "ready");
    let (listed, _) = env.deps(&h, &["ls"]);
    let ids: Vec<&str> = listed["deps"]
        .as_array()
        .expect("deps")
        .iter()
        .map(|d| s(d, "id"))
        .collect();
    assert_eq!(ids, vec![id.as_str()]);
}

/// A requirement the index does not have fails the build, and the set's log has pip's own
/// words for it; the tree is gone.
#[test]
fn a_build_that_fails_keeps_the_resolvers_log() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let req = env.requirements("b", "zygo-not-on-the-index==3.0\n");
    let (v, f) = env.deps(&h, &["build", "host", &req]);
    assert_eq!(f.code, 1, "{v}");
    assert_eq!(s(&v, "state"), "failed", "{v}");
    let log = s(&v, "log");
    assert!(
        log.contains("No matching distribution found for zygo-not-on-the-index==3.0"),
        "{log}"
    );
    assert!(s(&v, "error").contains("exited with status 1"), "{v}");
    let id = s(&v, "id");
    assert!(!env.tree(id).exists(), "a failed build left its tree");
    let (shown, f) = env.deps(&h, &["show", id]);
    assert_eq!(f.code, 1);
    assert_eq!(s(&shown, "state"), "failed");
    assert!(
        s(&shown, "log").contains("No matching distribution"),
        "{shown}"
    );
}

/// The build reaches the registries and nothing else: a requirement whose wheel lies on
/// the same host's other port fails, refused at once, and that port never sees a request.
#[test]
fn a_build_reaches_only_the_registries() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let url = format!(
        "zygoother @ http://{}:{OTHER}/zygoother-1.0-py3-none-any.whl\n",
        h.host
    );
    let req = env.requirements("c", &url);
    let (v, f) = env.deps(&h, &["build", "host", &req]);
    assert_eq!(f.code, 1, "{v}");
    assert_eq!(s(&v, "state"), "failed", "{v}");
    let log = s(&v, "log");
    assert!(log.contains("Connection refused"), "{log}");
    let got = h.requests();
    assert!(
        !got.iter().any(|r| r.starts_with(&format!("{OTHER} "))),
        "the other port was reached: {got:?}"
    );
}

root_and_rootless!(a_host_that_cannot_give_egress_refuses_the_build);

/// A host that cannot give the build sandbox its egress refuses the build rather than run
/// it on the host's network: with the registry named by host name and a resolver file
/// with no IPv4 nameserver (so no name could be resolved for the sandbox), the build ends
/// failed before anything runs, its log naming the cause and the fix, and nothing reaches
/// the index, though the host's own network reaches it at the address pip is given.
fn a_host_that_cannot_give_egress_refuses_the_build(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::as_who(who);
    let conf = env
        .dir
        .file("resolv.conf", b"nameserver ::1\nsearch zygo.test\n");
    let conf = conf.to_str().expect("UTF-8");
    let registry = format!("index.zygo.test:{INDEX}");
    let req = env.requirements("n", "zygodemo==1.0\n");
    let (v, f) = env.deps_with(
        &h,
        &[
            ("ZYGO_DEPS_REGISTRIES", registry.as_str()),
            ("ZYGO_RESOLV_CONF", conf),
        ],
        &["build", "host", &req],
    );
    assert_eq!(f.code, 1, "[{}] {v} {}", who.name(), f.stderr_text());
    assert_eq!(s(&v, "state"), "failed", "{v}");
    let log = s(&v, "log");
    for want in [
        "[zygo] the build failed: its sandbox was refused before anything ran",
        &format!("{conf} names no IPv4 nameserver"),
        "ZYGO_RESOLV_CONF",
        "name the destinations by IPv4 address",
    ] {
        assert!(
            log.contains(want),
            "[{}] {want:?} is not in the log: {log}",
            who.name()
        );
    }
    assert!(
        s(&v, "error").contains("names no IPv4 nameserver"),
        "[{}] {v}",
        who.name()
    );
    assert!(
        !env.tree(s(&v, "id")).exists(),
        "a refused build left its tree"
    );
    assert_eq!(
        h.requests(),
        Vec::<String>::new(),
        "[{}] the build reached the index",
        who.name()
    );
    // The same set, shown later: failed, with the same log.
    let (shown, _) = env.deps(&h, &["show", s(&v, "id")]);
    assert_eq!(s(&shown, "state"), "failed", "{shown}");
    assert_eq!(s(&shown, "log"), log, "{shown}");
}

/// Hostile or wrong inputs are refused before anything runs: unknown file names, a mix of
/// kinds, an image that is neither host nor a directory, an id that is not one.
#[test]
fn wrong_inputs_are_refused_naming_the_problem() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let setup = env.dir.file("setup.py", b"print(1)\n");
    let setup = setup.to_str().expect("UTF-8");
    let req = env.requirements("d", "zygodemo\n");
    for (args, want) in [
        (vec!["build", "host", setup], "requirements.txt"),
        (vec!["build", "host"], "no files"),
        (vec!["build", "python:3.12", req.as_str()], "not an image"),
        (vec!["show", "deps_../../etc"], "not a dependency set"),
    ] {
        let (v, f) = env.deps(&h, &args);
        assert_eq!(f.code, 2, "{args:?}: {v}");
        assert_eq!(s(&v, "code"), "bad_request", "{args:?}: {v}");
        assert!(s(&v, "error").contains(want), "{args:?}: {v}");
    }
    assert!(!env.state.join("deps").exists() || zygo_deps_empty(&env.state));
}

fn zygo_deps_empty(state: &Path) -> bool {
    std::fs::read_dir(state.join("deps")).map_or(true, |mut d| d.next().is_none())
}

/// A package.json with its lock file builds with `npm ci --ignore-scripts` into
/// node_modules; a sandbox given the set (at /venv, and its node_modules at /node_modules)
/// loads the package with require() through NODE_PATH, and with an ES module's import.
#[test]
fn a_node_set_builds_and_both_require_and_import_find_it() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let [manifest, lock] = env.node_app(&h, "node-app");
    let (v, f) = env.deps(&h, &["build", "host", &manifest, &lock]);
    assert_eq!(f.code, 0, "{v} {}", f.stderr_text());
    assert_eq!(s(&v, "state"), "ready", "{v}");
    assert_eq!(s(&v, "kind"), "node", "{v}");
    let id = s(&v, "id").to_string();
    let got = h.requests();
    assert!(
        got.iter().any(|r| r.contains("zygonode-1.0.0.tgz")),
        "the build fetched the package: {got:?}"
    );
    let tree = env.tree(&id);
    let mut bad = Vec::new();
    writable_or_foreign(&tree, &mut bad);
    assert!(bad.is_empty(), "the installed tree is not sealed: {bad:?}");
    let venv = format!("{}:/venv", tree.display());
    let modules = format!("{}:/node_modules", tree.join("node_modules").display());
    let (out, code) = run_json(
        Who::Root,
        &[
            "--mount",
            &venv,
            "--mount",
            &modules,
            "--env",
            "NODE_PATH=/venv/node_modules",
        ],
        &[
            "/bin/sh",
            "-c",
            "cd /tmp && node -e \"console.log(require('zygonode').value)\" && \
             echo \"import m from 'zygonode'; console.log('esm ' + m.value);\" > /tmp/t.mjs && \
             node /tmp/t.mjs",
        ],
    );
    assert_eq!(code, 0, "{out}");
    assert_eq!(
        s(&out, "stdout"),
        "zygonode 1.0\nesm zygonode 1.0\n",
        "{out}"
    );
}

/// A lock file whose package lies outside the registries fails the build, with npm's own
/// words in the log, and that host's port never sees a request.
#[test]
fn a_node_lock_naming_another_host_fails_the_build() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let [manifest, lock] = env.node_app(&h, "node-evil");
    let (v, f) = env.deps(&h, &["build", "host", &manifest, &lock]);
    assert_eq!(f.code, 1, "{v}");
    assert_eq!(s(&v, "state"), "failed", "{v}");
    let log = s(&v, "log");
    assert!(log.contains("ECONNREFUSED"), "{log}");
    assert!(log.contains(&format!("{}:{OTHER}", h.host)), "{log}");
    let got = h.requests();
    assert!(
        !got.iter().any(|r| r.starts_with(&format!("{OTHER} "))),
        "the other port was reached: {got:?}"
    );
}

/// The supervisor's suite: a handler that imports the index's package.
static SUITE: Suite = Suite {
    prefix: "deps-",
    handlers: "import shutil\ndef value(event):\n    import zygodemo\n    return {\"value\": zygodemo.VALUE, \"script\": shutil.which(\"zygodemo\")}\ndef echo(event):\n    return event\n",
    defaults: "timeout = \"20s\"\nmem = \"128M\"\nidle_timeout = \"30s\"\n",
    agents: false,
};

/// What a pool's script returns: the package's value and where its console script is.
const POOL_PY: &str = "import shutil, sys\nimport zygodemo\ndef handler(event):\n    return {\"value\": zygodemo.VALUE, \"script\": shutil.which(\"zygodemo\"), \"prefix\": sys.prefix}\n";

/// A supervisor of the test's own, pointed at `h` as its registry.
fn sup_for(h: &IndexHost, test: &str) -> Option<Sup> {
    if !root_only() {
        return None;
    }
    Some(sup_as(Who::Root, h, test))
}

/// The same, run by `who`.
fn sup_as(who: Who, h: &IndexHost, test: &str) -> Sup {
    let mut s = SUITE.sup(who, test);
    s.env("ZYGO_DEPS_REGISTRIES", &format!("{}:{INDEX}", h.host))
        .env(
            "ZYGO_DEPS_PIP_INDEX_URL",
            &format!("http://{}:{INDEX}/simple/", h.host),
        )
        .env(
            "ZYGO_DEPS_NPM_REGISTRY",
            &format!("http://{}:{INDEX}/", h.host),
        );
    s
}

root_and_rootless!(functions_and_pools_named_against_a_set_import_it);

/// A function and a pool with `deps = "<id>"` import the set's package (the venv's
/// interpreter runs the agent; its console script is first on PATH), and nothing of
/// the set can be changed from inside.
fn functions_and_pools_named_against_a_set_import_it(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let mut sup = sup_as(who, &h, "use");
    let req = sup.file("requirements.txt", b"zygodemo==1.0\n");
    let f = sup.run(&["deps", "build", "host", &req, "--json"]);
    let v = f.last_json();
    assert_eq!(f.code, 0, "{v} {}", f.stderr_text());
    let id = s(&v, "id").to_string();
    let deps = format!("deps = \"{id}\"");
    let names = sup.up(&[
        (
            "fn",
            format!("agent = \"python\"\nentry = \"fn/handlers.py:value\"\n{deps}"),
        ),
        ("pool", format!("agent = \"python\"\n{deps}")),
    ]);
    let got = sup.call_ok(&names[0], "{}");
    assert_eq!(got["value"], "zygodemo 1.0", "{got}");
    assert_eq!(got["script"], "/venv/bin/zygodemo", "{got}");
    let digest = sup.put_script("pool.py", POOL_PY);
    let out = sup.run_ok(&names[1], "{}", &digest);
    assert_eq!(out["result"]["value"], "zygodemo 1.0", "{out}");
    assert_eq!(out["result"]["prefix"], "/venv", "{out}");
    // Read-only inside, whoever asks.
    let probe = sup.put_script(
        "probe.py",
        "import os\ndef handler(event):\n    try:\n        open('/venv/pyvenv.cfg', 'a').close()\n        return 'WRITABLE'\n    except OSError as e:\n        return type(e).__name__\n",
    );
    let out = sup.run_ok(&names[1], "{}", &probe);
    assert_ne!(out["result"], "WRITABLE", "{out}");
}

/// A set that does not exist, or that failed, is refused by name before anything starts;
/// `requirements = "file"` builds the set in the supervisor (refused while it builds,
/// not queued) and, once it is ready, serves on it.
#[test]
fn requirements_build_in_the_supervisor_and_unready_sets_are_refused() {
    let h = IndexHost::new();
    let Some(mut sup) = sup_for(&h, "req") else {
        return;
    };
    let missing = format!("deps_{}", "0".repeat(64));
    let (file, _) = sup.write_toml(&[("nope", "value", &format!("deps = \"{missing}\"") as &str)]);
    let f = sup.run(&["up", "-f", file.to_str().expect("UTF-8"), "--json"]);
    assert_ne!(f.code, 0);
    let text = format!("{} {}", f.stdout_text(), f.stderr_text());
    assert!(text.contains("no dependency set"), "{text}");

    std::fs::create_dir_all(sup.dir.path.join("req")).expect("mkdir");
    std::fs::create_dir_all(sup.dir.path.join("req2")).expect("mkdir");
    sup.file("req/requirements.txt", b"zygodemo==1.0\n");
    let (file, names) =
        sup.write_toml(&[("req", "value", "requirements = \"req/requirements.txt\"")]);
    let file = file.to_str().expect("UTF-8").to_string();
    // With --no-wait, zygo up returns at once and says the set is still building.
    let f = sup.run(&["up", "-f", &file, "--no-wait", "--json"]);
    let text = format!("{} {}", f.stdout_text(), f.stderr_text());
    assert_ne!(f.code, 0, "served before its set was built: {text}");
    assert!(text.contains("is still building"), "{text}");
    let id = text
        .split("dependency set ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .expect("the set's id in the refusal")
        .to_string();
    // Without it, zygo up waits for the set (saying so while it does) and serves it.
    let f = sup.run(&["up", "-f", &file]);
    assert_eq!(f.code, 0, "{} {}", f.stderr_text(), sup.log());
    let v = sup.run(&["deps", "show", &id, "--json"]).last_json();
    assert_eq!(s(&v, "state"), "ready", "{v}");
    let got = sup.call_ok(&names[0], "{}");
    assert_eq!(got["value"], "zygodemo 1.0", "{got}");
    // A new set in a file: zygo up waits for its build, then serves it.
    sup.file("req2/requirements.txt", b"zygodemo==1.0\n# a second set\n");
    let (file2, names2) =
        sup.write_toml(&[("req2", "value", "requirements = \"req2/requirements.txt\"")]);
    let f = sup.run(&["up", "-f", file2.to_str().expect("UTF-8")]);
    assert_eq!(f.code, 0, "{} {}", f.stderr_text(), sup.log());
    assert!(
        f.stderr_text()
            .contains("waiting for its dependency set to build"),
        "{}",
        f.stderr_text()
    );
    let got = sup.call_ok(&names2[0], "{}");
    assert_eq!(got["value"], "zygodemo 1.0", "{got}");

    // A failed set is refused with the build's reason.
    sup.file("req/requirements.txt", b"zygo-not-on-the-index==3.0\n");
    let f = sup.run(&[
        "deps",
        "build",
        "host",
        &sup.dir.path.join("req/requirements.txt").to_string_lossy(),
        "--json",
    ]);
    let failed = f.last_json();
    assert_eq!(s(&failed, "state"), "failed", "{failed}");
    let (file, _) = sup.write_toml(&[(
        "bad",
        "value",
        &format!("deps = \"{}\"", s(&failed, "id")) as &str,
    )]);
    let f = sup.run(&["up", "-f", file.to_str().expect("UTF-8"), "--json"]);
    let text = format!("{} {}", f.stdout_text(), f.stderr_text());
    assert_ne!(f.code, 0);
    assert!(text.contains("failed to build"), "{text}");
}

/// A Node pool on a Node set: an ES module's import and a CommonJS script's require()
/// both find the set's package.
#[test]
fn a_node_pool_imports_and_requires_its_set() {
    let h = IndexHost::new();
    let Some(mut sup) = sup_for(&h, "node") else {
        return;
    };
    let env = Env {
        dir: TempDir::new(0o755),
        state: sup.st.clone(),
        who: Who::Root,
    };
    let [manifest, lock] = env.node_app(&h, "node-app");
    let f = sup.run(&["deps", "build", "host", &manifest, &lock, "--json"]);
    let v = f.last_json();
    assert_eq!(f.code, 0, "{v} {}", f.stderr_text());
    let id = s(&v, "id").to_string();
    let names = sup.up(&[("js", format!("agent = \"node\"\ndeps = \"{id}\""))]);
    let esm = sup.put_script(
        "esm.mjs",
        "import m from 'zygonode';\nexport default async function () { return { esm: m.value }; }\n",
    );
    let out = sup.run_ok(&names[0], "{}", &esm);
    assert_eq!(out["result"]["esm"], "zygonode 1.0", "{out}");
    let cjs = sup.put_script(
        "cjs.js",
        "module.exports.handler = async () => ({ cjs: require('zygonode').value, path: process.env.NODE_PATH });\n",
    );
    let out = sup.run_ok(&names[0], "{}", &cjs);
    assert_eq!(out["result"]["cjs"], "zygonode 1.0", "{out}");
    assert_eq!(out["result"]["path"], "/venv/node_modules", "{out}");
}

const BOOT: &str = "bootstrap-secret-for-deps-tests";

fn start_api(s: &Sup) -> zygo_tests::api::HttpFront {
    zygo_tests::api::start_http_front(s, &["--allow-deploy"])
}

/// One HTTP request (its connection closed after): status, Retry-After, JSON body.
fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, Option<String>, Value) {
    http_as(addr, method, path, token, None, body)
}

/// [`http`], for an operator acting for `tenant` (`X-Zygo-Tenant`).
fn http_as(
    addr: &str,
    method: &str,
    path: &str,
    token: &str,
    tenant: Option<&str>,
    body: &str,
) -> (u16, Option<String>, Value) {
    let extra: Vec<(&str, &str)> = tenant.map(|t| ("X-Zygo-Tenant", t)).into_iter().collect();
    let r = zygo_tests::http::req_within(addr, method, path, Some(token), &extra, body, 60);
    let retry = r.header("retry-after").map(str::to_string);
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, retry, v)
}

/// Over HTTP: POST /deps answers 202 building at once; a pool named against the set while
/// it builds is refused 503 with Retry-After; once ready (GET /deps/{id}) the pool imports
/// it; the same files again are the same set (200 ready); DELETE is refused 409 while the
/// pool is served on it, and works once the pool is stopped. A failed build's log is on
/// GET /deps/{id}; hostile bodies are refused; a tenant sees only the sets it sent.
#[test]
fn deps_over_http() {
    let h = IndexHost::new();
    let Some(mut sup) = sup_for(&h, "http") else {
        return;
    };
    sup.env("ZYGO_API_TOKEN", BOOT);
    sup.up(&[("echo", "echo", "")]);
    let api = start_api(&sup);
    let a = api.addr.as_str();
    let body =
        serde_json::json!({"image": "host", "files": {"requirements.txt": "zygodemo==1.0\n"}})
            .to_string();
    let (st, _, v) = http(a, "POST", "/deps", BOOT, &body);
    assert_eq!(st, 202, "{v}");
    assert_eq!(s(&v, "state"), "building", "{v}");
    assert_eq!(v["building"], true, "{v}");
    let id = s(&v, "id").to_string();
    let pool = sup.name("py");
    let create =
        serde_json::json!({"name": pool, "layer": {"agent": "python", "deps": id}}).to_string();
    let (st, retry, v) = http(a, "POST", "/runtimes", BOOT, &create);
    assert_eq!(st, 503, "a pool was served on a set still building: {v}");
    assert_eq!(s(&v, "code"), "unavailable", "{v}");
    assert!(s(&v, "error").contains("still building"), "{v}");
    assert!(retry.is_some(), "no Retry-After on the 503");
    wait_for(Duration::from_secs(120), "the set is built", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{id}"), BOOT, "");
        s(&v, "state") != "building"
    });
    let (st, _, v) = http(a, "GET", &format!("/deps/{id}"), BOOT, "");
    assert_eq!((st, s(&v, "state")), (200, "ready"), "{v}");
    let (st, _, v) = http(a, "POST", "/runtimes", BOOT, &create);
    assert_eq!(st, 200, "{v}\n{}", sup.log());
    let call = serde_json::json!({"source": "import zygodemo\ndef handler(event):\n    return zygodemo.VALUE\n", "event": null}).to_string();
    let (st, _, v) = http(a, "POST", &format!("/runtimes/{pool}/call"), BOOT, &call);
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["result"], "zygodemo 1.0", "{v}");
    // The same files: the same set, ready.
    let (st, _, v) = http(a, "POST", "/deps", BOOT, &body);
    assert_eq!(
        (st, s(&v, "state"), s(&v, "id")),
        (200, "ready", id.as_str()),
        "{v}"
    );
    let (_, _, v) = http(a, "GET", "/deps", BOOT, "");
    assert!(
        v["deps"]
            .as_array()
            .expect("deps")
            .iter()
            .any(|d| d["id"] == id.as_str()),
        "{v}"
    );
    // In use: 409; after the pool stops, deleted.
    let (st, _, v) = http(a, "DELETE", &format!("/deps/{id}"), BOOT, "");
    assert_eq!(st, 409, "{v}");
    assert_eq!(s(&v, "code"), "conflict", "{v}");
    assert!(s(&v, "error").contains(&pool), "{v}");
    let (st, _, v) = http(a, "DELETE", &format!("/runtimes/{pool}"), BOOT, "");
    assert_eq!(st, 200, "{v}");
    let (st, _, v) = http(a, "DELETE", &format!("/deps/{id}"), BOOT, "");
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["deleted"], id.as_str());
    let (st, _, _) = http(a, "GET", &format!("/deps/{id}"), BOOT, "");
    assert_eq!(st, 404);
    assert!(!sup.st.join("deps").join(&id).exists());

    // A failed build: its log, in pip's own words.
    let bad = serde_json::json!({"image": "host", "files": {"requirements.txt": "zygo-not-on-the-index==3.0\n"}}).to_string();
    let (st, _, v) = http(a, "POST", "/deps", BOOT, &bad);
    assert_eq!(st, 202, "{v}");
    let bad_id = s(&v, "id").to_string();
    wait_for(Duration::from_secs(120), "the bad set fails", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{bad_id}"), BOOT, "");
        s(&v, "state") == "failed"
    });
    let (_, _, v) = http(a, "GET", &format!("/deps/{bad_id}"), BOOT, "");
    assert!(
        s(&v, "log").contains("No matching distribution found"),
        "{v}"
    );
    let layer =
        serde_json::json!({"name": sup.name("bad"), "layer": {"agent": "python", "deps": bad_id}})
            .to_string();
    let (st, _, v) = http(a, "POST", "/runtimes", BOOT, &layer);
    assert_eq!(st, 400, "{v}");
    assert!(s(&v, "error").contains("failed to build"), "{v}");

    // Hostile or wrong bodies.
    let big = "x".repeat((1 << 20) + 1);
    for (body, want) in [
        (
            r#"{"image": "host", "files": {"setup.py": "x"}}"#.to_string(),
            400,
        ),
        (
            r#"{"image": "host", "files": {"requirements.txt": "a", "requirements.txt": "b"}}"#
                .to_string(),
            400,
        ),
        (r#"{"image": "host", "files": {}}"#.to_string(), 400),
        (
            r#"{"image": "host", "files": {"requirements.txt": "a", "package.json": "{}"}}"#
                .to_string(),
            400,
        ),
        (
            r#"{"image": "ubuntu:22.04", "files": {"requirements.txt": "a"}}"#.to_string(),
            400,
        ),
        (
            r#"{"image": "host", "files": {"requirements.txt": "a"}, "extra": 1}"#.to_string(),
            400,
        ),
        (
            format!(r#"{{"image": "host", "files": {{"requirements.txt": "{big}"}}}}"#),
            413,
        ),
    ] {
        let (st, _, v) = http(a, "POST", "/deps", BOOT, &body);
        assert_eq!(st, want, "{}: {v}", truncate(&body, 100));
    }
    let (st, _, _) = http(a, "GET", "/deps/deps_..", BOOT, "");
    assert_eq!(st, 400);

    // A tenant sees only what it sent.
    let tenant = format!("dt{:x}", unique() & 0xff_ffff);
    let (st, _, v) = http(
        a,
        "POST",
        "/tenants",
        BOOT,
        &format!("{{\"id\": \"{tenant}\"}}"),
    );
    assert_eq!(st, 200, "{v}");
    let f = sup.run(&["token", "mint", "--tenant", &tenant, "--json"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    let tok = text(&f.last_json(), "secret").to_string();
    let (_, _, v) = http(a, "GET", "/deps", &tok, "");
    assert_eq!(v["deps"], serde_json::json!([]), "{v}");
    let (st, _, _) = http(a, "GET", &format!("/deps/{bad_id}"), &tok, "");
    assert_eq!(st, 404);
    // Nor may a layer served for the tenant name a set it did not send.
    let layer = serde_json::json!({"name": "tpool", "layer": {"agent": "python", "deps": bad_id}})
        .to_string();
    let (st, _, v) = http_as(a, "POST", "/runtimes", BOOT, Some(&tenant), &layer);
    assert_eq!(st, 404, "{v}");
    assert_eq!(s(&v, "code"), "not_found", "{v}");
    // The same files from a tenant are a set of its own: nothing tells it the operator's
    // set exists (its id differs, and it builds like any new set).
    let (st, _, v) = http(a, "POST", "/deps", &tok, &bad);
    assert_eq!((st, s(&v, "state")), (202, "building"), "{v}");
    let own_id = s(&v, "id").to_string();
    assert_ne!(own_id, bad_id, "{v}");
    let (st, _, _) = http(a, "GET", &format!("/deps/{own_id}"), &tok, "");
    assert_eq!(st, 200);
    let (st, _, _) = http(a, "GET", &format!("/deps/{bad_id}"), &tok, "");
    assert_eq!(st, 404);
    // Deleting is the operator's, behind the deploy gate.
    let (st, _, _) = http(a, "DELETE", &format!("/deps/{own_id}"), &tok, "");
    assert_eq!(st, 403);
    // A tenant has at most two builds running: a third is busy, with a retry hint.
    wait_for(Duration::from_secs(120), "the tenant's build ends", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{own_id}"), &tok, "");
        s(&v, "state") != "building"
    });
    let mut statuses = Vec::new();
    for n in 0..3 {
        let b = serde_json::json!({"image": "host", "files": {"requirements.txt": format!("# {tenant} {n}\n")}}).to_string();
        let (st, retry, v) = http(a, "POST", "/deps", &tok, &b);
        statuses.push((st, retry.is_some(), s(&v, "code").to_string()));
    }
    assert_eq!(
        statuses,
        vec![
            (202, false, String::new()),
            (202, false, String::new()),
            (429, true, "busy".to_string())
        ]
    );
    // A tenant deleted and made again is somebody else: the set is no longer its.
    let (st, _, v) = http(a, "DELETE", &format!("/tenants/{tenant}"), BOOT, "");
    assert_eq!(st, 200, "{v}");
    let (st, _, v) = http(
        a,
        "POST",
        "/tenants",
        BOOT,
        &format!("{{\"id\": \"{tenant}\"}}"),
    );
    assert_eq!(st, 200, "{v}");
    let f = sup.run(&["token", "mint", "--tenant", &tenant, "--json"]);
    let tok = text(&f.last_json(), "secret").to_string();
    let (st, _, _) = http(a, "GET", &format!("/deps/{own_id}"), &tok, "");
    assert_eq!(st, 404);

    // A supervisor that stops stops its builds: the set fails, saying so, and nothing of
    // its build is left running.
    let slow = serde_json::json!({"image": "host", "files": {"requirements.txt": "zygodemo==1.0\n# stopped\n"}}).to_string();
    let (st, _, v) = http(a, "POST", "/deps", BOOT, &slow);
    assert_eq!(st, 202, "{v}");
    let slow_id = s(&v, "id").to_string();
    let state = sup.st.clone();
    let env = Env {
        dir: TempDir::new(0o755),
        state,
        who: Who::Root,
    };
    drop(api);
    let sup_pid = sup.supervisor.expect("the supervisor's pid");
    let f = sup.run(&["drain", "--grace", "1s"]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    wait_for(Duration::from_secs(30), "the supervisor exits", || {
        !sup.rt.join("zygo.sock").exists()
    });
    let (v, _) = env.deps(&h, &["show", &slow_id]);
    assert_eq!(s(&v, "state"), "failed", "{v}\n{}", sup.log());
    assert!(s(&v, "error").contains("stopped"), "{v}");
    // The build's sandbox had a cgroup of the supervisor's (`run-<pid>-…`): removed, so
    // nothing of it runs on.
    let prefix = format!("run-{sup_pid}-");
    let left: Vec<PathBuf> = zygo_cgroup_roots()
        .iter()
        .filter_map(|r| std::fs::read_dir(r).ok())
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "a build outlived its supervisor: {left:?}");
}

/// A package whose install runs code (an sdist's setup.py) that tries a host outside the
/// registries: refused, so the build fails with that code's own words in the log, and the
/// other port never sees a connection.
#[test]
fn an_install_script_cannot_reach_beyond_the_registries() {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::new();
    let req = env.requirements("e", "zygoevil==1.0\n");
    let (v, f) = env.deps(&h, &["build", "host", &req]);
    assert_eq!(f.code, 1, "{v}");
    assert_eq!(s(&v, "state"), "failed", "{v}");
    let log = s(&v, "log");
    assert!(
        log.contains("zygoevil could not reach the other port: [Errno 111] Connection refused"),
        "{log}"
    );
    let got = h.requests();
    assert!(
        got.iter().any(|r| r.contains("zygoevil-1.0.tar.gz")),
        "the sdist was fetched: {got:?}"
    );
    assert!(
        !got.iter().any(|r| r.starts_with(&format!("{OTHER} "))),
        "the other port was reached: {got:?}"
    );
}

/// A `dir:` image of busybox with a fake `npm` that leaves `/venv/node_modules` as a link
/// to `target` (a host path), for a Node build.
fn linking_npm_image(target: &Path) -> Option<TempDir> {
    let busybox = Path::new("/bin/busybox");
    if !busybox.exists() {
        skip("busybox-static is not installed (.ci/run installs it)");
        return None;
    }
    let img = TempDir::new(0o755);
    for d in ["bin", "usr/bin"] {
        std::fs::create_dir_all(img.path.join(d)).expect("mkdir");
    }
    let bb = img.path.join("bin/busybox");
    std::fs::copy(busybox, &bb).expect("copy busybox");
    for tool in ["sh", "cp", "ln", "rm", "mkdir"] {
        std::os::unix::fs::symlink("busybox", img.path.join("bin").join(tool)).expect("symlink");
    }
    let npm = img.path.join("usr/bin/npm");
    std::fs::write(
        &npm,
        format!(
            "#!/bin/sh\nrm -rf /venv/node_modules\nln -s {} /venv/node_modules\necho installed\n",
            target.display()
        ),
    )
    .expect("write npm");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&npm, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    Some(img)
}

root_and_rootless!(a_build_never_makes_zygo_follow_its_links);

/// What a build's code leaves in its tree decides nothing Zygo does with its own rights: a
/// Node build whose `npm` (here a fake one, in a `dir:` image) leaves `/venv/node_modules`
/// as a link to a host folder of the runner's (0700) fails, naming the link, and the
/// folder keeps its mode. (Zygo used to make the set's `node_modules` 0755 through the
/// link, as root, and mount it into every Node sandbox on the set.)
fn a_build_never_makes_zygo_follow_its_links(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::as_who(who);
    let secret = TempDir::new(0o755);
    let target = secret.path.join("private");
    std::fs::create_dir(&target).expect("mkdir");
    std::fs::write(target.join("key"), b"host secret").expect("write");
    if who == Who::Rootless {
        let r = rootless_setup();
        std::os::unix::fs::chown(&target, Some(r.uid), Some(r.gid)).expect("chown");
    }
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let Some(img) = linking_npm_image(&target) else {
        return;
    };
    let [manifest, lock] = env.node_app(&h, "node-app");
    let image = format!("dir:{}", img.str());
    let (v, f) = env.deps(&h, &["build", &image, &manifest, &lock]);
    assert_eq!(
        mode_of(&target),
        0o700,
        "the build changed a host folder through its link: {v}"
    );
    assert_eq!(s(&v, "state"), "failed", "{v} {}", f.stderr_text());
    assert!(
        s(&v, "error").contains("node_modules as something other than a folder"),
        "{v}"
    );
    let id = s(&v, "id").to_string();
    assert!(!env.tree(&id).exists(), "a failed set left its tree");
    let (shown, _) = env.deps(&h, &["show", &id]);
    assert!(
        s(&shown, "log").contains("installed"),
        "the log has what the build said: {shown}"
    );
}

root_and_rootless!(a_set_past_its_size_limit_fails_and_leaves_nothing);

/// A build's tree lives on a tmpfs capped at the set's size limit: a package whose
/// setup.py writes 64 MiB into /venv, under `ZYGO_DEPS_MAX_SIZE=16M`, fails the set with
/// that reason, and nothing of it is left on the host's disk.
fn a_set_past_its_size_limit_fails_and_leaves_nothing(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let env = Env::as_who(who);
    let req = env.requirements("big", "zygobig==1.0\n");
    let (v, f) = env.deps_with(
        &h,
        &[("ZYGO_DEPS_MAX_SIZE", "16M")],
        &["build", "host", &req],
    );
    assert_eq!(s(&v, "state"), "failed", "{v} {}", f.stderr_text());
    assert!(
        s(&v, "error").contains("filled its limit of 16777216 bytes"),
        "{v}"
    );
    let id = s(&v, "id").to_string();
    let d = env.state.join("deps").join(&id);
    for sub in ["tree", "tree.new"] {
        assert!(!d.join(sub).exists(), "{sub} is left");
    }
    // A wrong limit is refused, naming the variable.
    let (v, f) = env.deps_with(
        &h,
        &[("ZYGO_DEPS_MAX_SIZE", "lots")],
        &["build", "host", &req],
    );
    assert_ne!(f.code, 0, "{v}");
    assert!(
        f.stdout_text().contains("ZYGO_DEPS_MAX_SIZE")
            || f.stderr_text().contains("ZYGO_DEPS_MAX_SIZE"),
        "{v} {}",
        f.stderr_text()
    );
}

root_and_rootless!(a_deep_tree_fails_the_set_and_the_supervisor_lives);

/// A package whose setup.py leaves a folder chain 19,000 deep in /venv, posted with a
/// tenant's token: the set fails, saying how deep is too deep, and the supervisor serves
/// on; posted again, it is built again and fails again, and the supervisor still serves.
/// (Zygo's tree walks used to recurse, and such a tree overflowed the build thread's stack
/// and took the supervisor down, again after every restart.)
fn a_deep_tree_fails_the_set_and_the_supervisor_lives(who: Who) {
    if !root_only() {
        return;
    }
    let h = IndexHost::new();
    let mut sup = sup_as(who, &h, "deep");
    sup.env("ZYGO_API_TOKEN", BOOT);
    let names = sup.up(&[("echo", "echo", "")]);
    let api = start_api(&sup);
    let a = api.addr.as_str();
    let tenant = zygo_tests::api::tenant_id("deep");
    let (st, _, v) = http(
        a,
        "POST",
        "/tenants",
        BOOT,
        &format!("{{\"id\": \"{tenant}\"}}"),
    );
    assert_eq!(st, 200, "{v}");
    let (_, tok) = zygo_tests::api::mint(&sup, Some(&tenant));
    let body =
        serde_json::json!({"image": "host", "files": {"requirements.txt": "zygodeep==1.0\n"}})
            .to_string();
    let pid = sup.supervisor.expect("the supervisor's pid");
    for round in 0..2 {
        let (st, _, v) = http(a, "POST", "/deps", &tok, &body);
        assert_eq!(st, 202, "round {round}: {v}\n{}", sup.log());
        let id = s(&v, "id").to_string();
        wait_for(Duration::from_secs(180), "the deep set ends", || {
            let (_, _, v) = http(a, "GET", &format!("/deps/{id}"), &tok, "");
            s(&v, "state") != "building"
        });
        let (st, _, v) = http(a, "GET", &format!("/deps/{id}"), &tok, "");
        assert_eq!((st, s(&v, "state")), (200, "failed"), "round {round}: {v}");
        assert!(
            s(&v, "error").contains("nested more than 100 deep"),
            "round {round}: {v}"
        );
        assert!(
            alive(pid),
            "round {round}: the supervisor died\n{}",
            sup.log()
        );
        assert!(!sup.st.join("deps").join(&id).join("tree").exists());
    }
    let (st, _, v) = http(a, "GET", &format!("/fn/{}/stats", names[0]), BOOT, "");
    assert_eq!(st, 200, "the supervisor still serves: {v}");
}

/// The folders of a state directory's sets.
fn set_folders(state: &Path) -> usize {
    std::fs::read_dir(state.join("deps")).map_or(0, |d| {
        d.filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.file_name().to_string_lossy().starts_with("deps_"))
        })
        .count()
    })
}

/// A tenant's dependency build never touches the host and is held to what the operator
/// gave the tenant: a folder image (`dir:/`, the host's own files) is refused, as are
/// inputs that make a resolver read a file (`-r /etc/passwd`, a lock's `file:`
/// dependency); a tenant whose network is `none`, or whose allow list does not cover the
/// registries, cannot build; a build runs within the tenant's time limit; a tenant holds
/// at most `ZYGO_DEPS_TENANT_SETS` sets (its oldest failed one makes room); and a refused
/// request leaves nothing on disk. (A tenant used to read any world-readable host file
/// in its build's log, and to build with 2G, 2 CPUs, 15 minutes and the registries
/// whatever its own limits said.)
#[test]
fn a_tenants_build_never_reads_the_host_and_keeps_to_its_limits() {
    let h = IndexHost::new();
    let Some(mut sup) = sup_for(&h, "tenantbuild") else {
        return;
    };
    sup.env("ZYGO_API_TOKEN", BOOT)
        .env("ZYGO_DEPS_TENANT_SETS", "2");
    sup.up(&[("echo", "echo", "")]);
    // The registry is on a private address: the operator's front may name it in limits.
    let api = zygo_tests::api::start_http_front(&sup, &["--allow-deploy", "--allow-private-net"]);
    let a = api.addr.as_str();
    let tenant = zygo_tests::api::tenant_id("tb");
    let (st, _, v) = http(
        a,
        "POST",
        "/tenants",
        BOOT,
        &format!("{{\"id\": \"{tenant}\"}}"),
    );
    assert_eq!(st, 200, "{v}");
    let (_, tok) = zygo_tests::api::mint(&sup, Some(&tenant));
    let post = |image: &str, files: Value| {
        let body = serde_json::json!({"image": image, "files": files}).to_string();
        http(a, "POST", "/deps", &tok, &body)
    };
    let req = |text: &str| serde_json::json!({"requirements.txt": text});
    let before = set_folders(&sup.st);

    // The host's files, by image or by input: refused, naming why, and nothing made.
    let (st, _, v) = post("dir:/", req("-r /etc/passwd\n"));
    assert_eq!(st, 403, "{v}");
    assert!(s(&v, "error").contains("needs deploy rights"), "{v}");
    for text in [
        "-r /etc/passwd\n",
        "six\n--index-url file:///etc/\n",
        "x @ file:///etc/passwd\n",
    ] {
        let (st, _, v) = post("host", req(text));
        assert_eq!(st, 400, "{text:?}: {v}");
        assert!(s(&v, "error").starts_with("requirements.txt line "), "{v}");
        assert!(!v.to_string().contains("root:x:0:0"), "{v}");
    }
    let lock = r#"{"lockfileVersion":3,"packages":{"":{},"node_modules/x":{"version":"1.0.0","resolved":"file:/etc/passwd"}}}"#;
    let (st, _, v) = post(
        "host",
        serde_json::json!({"package.json": r#"{"dependencies":{"x":"1.0.0"}}"#, "package-lock.json": lock}),
    );
    assert_eq!(st, 400, "{v}");
    assert!(s(&v, "error").contains("package-lock.json"), "{v}");

    // Its network: none, then an allow list without the registry.
    let limits = |body: &str| {
        let (st, _, v) = http(a, "PATCH", &format!("/tenants/{tenant}/limits"), BOOT, body);
        assert_eq!(st, 200, "{body}: {v}");
    };
    limits(r#"{"network": "none"}"#);
    let (st, _, v) = post("host", req("zygodemo==1.0\n"));
    assert_eq!(st, 403, "{v}");
    assert!(
        s(&v, "error").contains("reaches the package registries"),
        "{v}"
    );
    limits(r#"{"network": "egress", "allow": ["203.0.113.5:443"]}"#);
    let (st, _, v) = post("host", req("zygodemo==1.0\n"));
    assert_eq!(st, 403, "{v}");
    assert_eq!(
        set_folders(&sup.st),
        before,
        "a refused request left a folder"
    );

    // Within its limits: a build that would take a minute ends at the tenant's 20 s.
    limits(&format!(
        r#"{{"network": "egress", "allow": ["{}:{INDEX}"], "timeout": "20s", "mem": "128M"}}"#,
        h.host
    ));
    let (st, _, v) = post("host", req("zygoslow==1.0\n"));
    assert_eq!(st, 202, "{v}");
    let slow = s(&v, "id").to_string();
    // While it builds, its log grows: the resolver's words so far are in the answer.
    let mut seen_live = false;
    wait_for(Duration::from_secs(120), "the slow set ends", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{slow}"), &tok, "");
        if s(&v, "state") == "building" && text(&v, "log").contains("zygoslow") {
            seen_live = true;
        }
        s(&v, "state") != "building"
    });
    assert!(seen_live, "no log while the set was building");
    let (_, _, v) = http(a, "GET", &format!("/deps/{slow}"), &tok, "");
    assert_eq!(s(&v, "state"), "failed", "{v}");
    assert!(s(&v, "error").contains("time limit (20s)"), "{v}");
    // (No time limit for the builds that follow, which must not race a loaded machine.)
    limits(r#"{"timeout": null}"#);

    // Its quota (2 here): a ready set and the failed one; a third set removes the failed
    // one to make room; with two ready sets a fourth is refused, and nothing is made.
    let (st, _, v) = post("host", req("zygodemo==1.0\n"));
    assert_eq!(st, 202, "{v}");
    let demo = s(&v, "id").to_string();
    wait_for(Duration::from_secs(120), "the demo set is ready", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{demo}"), &tok, "");
        s(&v, "state") == "ready"
    });
    let (st, _, v) = post("host", req("zygodemo==1.0\n# again\n"));
    assert_eq!(st, 202, "{v}");
    let again = s(&v, "id").to_string();
    let (st, _, _) = http(a, "GET", &format!("/deps/{slow}"), &tok, "");
    assert_eq!(st, 404, "the failed set made room");
    wait_for(Duration::from_secs(120), "the second set is ready", || {
        let (_, _, v) = http(a, "GET", &format!("/deps/{again}"), &tok, "");
        s(&v, "state") == "ready"
    });
    let folders = set_folders(&sup.st);
    let (st, _, v) = post("host", req("zygodemo==1.0\n# a third\n"));
    assert_eq!(st, 403, "{v}");
    assert!(s(&v, "error").contains("ZYGO_DEPS_TENANT_SETS"), "{v}");
    assert_eq!(
        set_folders(&sup.st),
        folders,
        "a refused request left a folder"
    );
    let (_, _, v) = http(a, "GET", "/deps", &tok, "");
    let mut listed: Vec<&str> = v["deps"]
        .as_array()
        .expect("deps")
        .iter()
        .map(|d| s(d, "id"))
        .collect();
    listed.sort_unstable();
    let mut want = vec![demo.as_str(), again.as_str()];
    want.sort_unstable();
    assert_eq!(listed, want, "{v}");
}
