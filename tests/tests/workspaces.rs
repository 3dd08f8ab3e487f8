//! Workspaces end to end, on the real kernel: `zygo exec NAME --workspace IN.tar --out
//! OUT.tar` against Python and Node functions and pools of a supervisor of the test's own.
//!
//! The launcher unpacks the tar into the request's own `/work/<32 hex>` (its cwd, named in
//! `ZYGO_WORKSPACE`) before the handler has its request, and with `--out` packs that
//! directory after the handler answered. Hostile archives (links, devices, fifos, `..`,
//! absolute paths, too many entries, lying headers, bombs) are refused before anything
//! runs, naming the entry and the rule; a handler racing links and fifos into its
//! directory while it is packed gets nothing from outside packed and never makes the
//! packer wait.

use std::fs;
use std::io::Read;
use std::path::PathBuf;

use serde_json::Value;
use zygo_tests::*;

static SUITE: Suite = Suite {
    prefix: "ws-",
    handlers: HANDLERS,
    defaults: "timeout = \"20s\"\nmem = \"128M\"\nidle_timeout = \"30s\"\n",
    agents: false,
};

const HANDLERS: &str = r#"import os, stat, subprocess, sys, time

def tree():
    out = {}
    for d, dirs, files in os.walk("."):
        for n in dirs + files:
            p = os.path.join(d, n)[2:]
            st = os.lstat(p)
            out[p] = [oct(stat.S_IMODE(st.st_mode)), "d" if stat.S_ISDIR(st.st_mode) else "f", st.st_uid == os.getuid()]
    return out

def convert(event):
    found = tree()
    data = open("in.txt").read() if os.path.exists("in.txt") else ""
    os.makedirs("result/deep", exist_ok=True)
    with open("result/deep/out.txt", "w") as f:
        f.write(data.upper() + event.get("extra", ""))
    return {"cwd": os.getcwd(), "env": os.environ.get("ZYGO_WORKSPACE"), "tree": found}

def marker(event):
    # Leaves a trace where the test can see whether it ran.
    print("the handler ran")
    return {"ran": True, "tree": tree()}

RACER = '''
import os, sys, time
secret, outside = sys.argv[1], sys.argv[2]
end = time.time() + 3
i = 0
while time.time() < end:
    i += 1
    for name, make in (
        ("l%d" % (i % 50), lambda p: os.symlink(secret, p)),
        ("d%d" % (i % 50), lambda p: os.symlink(outside, p)),
        ("p%d" % (i % 50), lambda p: os.mkfifo(p)),
    ):
        try:
            make(name)
        except OSError:
            pass
    # A file, and a folder, that keep being swapped for links to the host's secret.
    for real, mk in (("swap", lambda: open("swap", "w").write("inside\n")),
                     ("swapdir", lambda: os.makedirs("swapdir/x", exist_ok=True))):
        try:
            mk()
            os.symlink(secret if real == "swap" else outside, real + ".new")
            os.rename(real + ".new", real) if real == "swap" else None
            if real == "swapdir":
                os.rename("swapdir", "swapdir.old")
                os.rename(real + ".new", "swapdir")
                os.rename("swapdir", "swapdir.lnk")
                os.rename("swapdir.old", "swapdir")
                os.unlink("swapdir.lnk")
        except OSError:
            pass
        try:
            if os.path.islink("swap"):
                os.unlink("swap")
        except OSError:
            pass
'''

def race(event):
    # A racer left running after the handler answers, swapping links and fifos into the
    # directory while it is packed.
    with open("racer.py", "w") as f:
        f.write(RACER)
    with open("plain.txt", "w") as f:
        f.write("plain\n")
    import socket
    s = socket.socket(socket.AF_UNIX)
    s.bind("sock")
    subprocess.Popen([sys.executable, "racer.py", event["secret"], event["outside"]],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    time.sleep(0.3)
    return {"racing": True}

def swap(event):
    # The request's folder itself replaced by a link to a folder of the host's.
    here = os.getcwd()
    with open("x.txt", "w") as f:
        f.write("x")
    os.chdir("/")
    os.rename(here, here + ".away")
    os.symlink(event["outside"], here)
    return {"swapped": here}
"#;

/// A Node function reading its workspace.
const NODE_CONVERT: &str = r#"import fs from "node:fs";
export default async function (event) {
  const data = fs.readFileSync("in.txt", "utf8");
  fs.mkdirSync("result", { recursive: true });
  fs.writeFileSync("result/node.txt", data.toUpperCase());
  return { cwd: process.cwd(), env: process.env.ZYGO_WORKSPACE, listing: fs.readdirSync(".").sort() };
}
"#;

// ---------------------------------------------------------------------------------------
// Tars.

fn octal(field: &mut [u8], v: u64) {
    let digits = field.len() - 1;
    let text = format!("{v:0digits$o}");
    field[..digits].copy_from_slice(&text.as_bytes()[text.len() - digits..]);
    field[digits] = 0;
}

fn resum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| b as u32).sum();
    octal(&mut h[148..155], sum as u64);
    h[155] = b' ';
}

/// One raw ustar entry: any name, any type, `data`, and the size its header claims.
fn raw(name: &[u8], kind: u8, data: &[u8], claimed: u64) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], 0o777);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], claimed);
    octal(&mut h[136..148], 0);
    h[156] = kind;
    if matches!(kind, b'1' | b'2') {
        h[157..168].copy_from_slice(b"/etc/passwd");
    }
    if kind == b'S' {
        h[257..265].copy_from_slice(b"ustar  \0");
        octal(&mut h[483..495], 1 << 40); // real size: a terabyte of holes
    } else {
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
    }
    resum(&mut h);
    let mut v = h.to_vec();
    v.extend_from_slice(data);
    v.resize(v.len().div_ceil(512) * 512, 0);
    v
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    raw(name.as_bytes(), b'0', data, data.len() as u64)
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = entries.concat();
    v.resize(v.len() + 1024, 0);
    v
}

/// A tar as `tar` itself would write one: files and a folder, from the tar crate.
fn good_tar() -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (path, data) in [
        ("in.txt", &b"hello workspace\n"[..]),
        ("sub/data.bin", &[0u8, 1, 2, 254, 255][..]),
    ] {
        let mut h = tar::Header::new_ustar();
        h.set_size(data.len() as u64);
        h.set_mode(0o4755); // setuid and world-writable bits are not kept
        h.set_entry_type(tar::EntryType::Regular);
        h.set_cksum();
        b.append_data(&mut h, path, data).expect("append");
    }
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o777);
    h.set_size(0);
    h.set_cksum();
    b.append_data(&mut h, "empty/", &b""[..]).expect("append");
    b.into_inner().expect("finish")
}

/// (path, contents) of every regular file of a tar, and the folders (ending in '/'),
/// checking that nothing else is in it.
fn read_tar(bytes: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    for e in tar::Archive::new(bytes).entries().expect("a tar") {
        let mut e = e.expect("an entry");
        let kind = e.header().entry_type();
        assert!(
            matches!(kind, tar::EntryType::Regular | tar::EntryType::Directory),
            "only files and folders come back, not {kind:?}"
        );
        let path = String::from_utf8_lossy(&e.path_bytes()).into_owned();
        let mut data = Vec::new();
        e.read_to_end(&mut data).expect("read an entry");
        out.push((path, data));
    }
    out
}

/// A path in the supervisor's state folder, which whoever runs zygo may write.
fn out_path(s: &Sup, name: &str) -> PathBuf {
    s.st.join(name)
}

fn exec_ws(
    s: &Sup,
    name: &str,
    event: &str,
    tar: Option<&str>,
    out: Option<&PathBuf>,
) -> (Value, Finished) {
    let mut flags: Vec<&str> = Vec::new();
    if let Some(t) = tar {
        flags.extend(["--workspace", t]);
    }
    let out_s;
    if let Some(o) = out {
        out_s = o.to_str().expect("UTF-8").to_string();
        flags.extend(["--out", &out_s]);
    }
    s.exec(name, Some(event), &flags)
}

fn is_workdir(p: &str) -> bool {
    p.strip_prefix("/work/").is_some_and(|n| is_hex(n, 32))
}

// ---------------------------------------------------------------------------------------
// Round trips.

root_and_rootless!(python_round_trip, node_round_trip, pool_round_trips);

/// A Python function: the tar's files are in the handler's cwd (named in ZYGO_WORKSPACE,
/// `/work/<32 hex>`) with Zygo's modes and the request's own, and what it wrote comes back
/// with `--out`; `--out` alone packs what the handler wrote; without either, nothing.
fn python_round_trip(who: Who) {
    let mut s = SUITE.sup(who, "py");
    let n = s.up(&[("conv", "convert", "")]);
    let f = &n[0];
    let tar = s.file("in.tar", &good_tar());
    let out = out_path(&s, "out.tar");
    let (v, fin) = exec_ws(&s, f, r#"{"extra": "!"}"#, Some(&tar), Some(&out));
    s.assert_ok(&v, &fin, "convert with a workspace");
    let r = &v["result"];
    assert!(is_workdir(text(r, "cwd")), "{v}");
    assert_eq!(r["env"], r["cwd"], "ZYGO_WORKSPACE names the cwd: {v}");
    let t = &r["tree"];
    assert_eq!(t["in.txt"], serde_json::json!(["0o600", "f", true]), "{v}");
    assert_eq!(
        t["sub/data.bin"],
        serde_json::json!(["0o600", "f", true]),
        "{v}"
    );
    assert_eq!(t["sub"], serde_json::json!(["0o700", "d", true]), "{v}");
    assert_eq!(t["empty"], serde_json::json!(["0o700", "d", true]), "{v}");
    assert_eq!(t.as_object().map(|o| o.len()), Some(4), "{v}");
    let wo = &v["workspace_out"];
    assert_eq!(wo["truncated"], false, "{v}");
    let bytes = fs::read(&out).expect("the --out file");
    assert_eq!(wo["bytes"].as_u64(), Some(bytes.len() as u64), "{v}");
    let got = read_tar(&bytes);
    let find = |p: &str| got.iter().find(|(n, _)| n == p).map(|(_, d)| d.clone());
    assert_eq!(
        find("in.txt").as_deref(),
        Some(&b"hello workspace\n"[..]),
        "{got:?}"
    );
    assert_eq!(
        find("sub/data.bin").as_deref(),
        Some(&[0u8, 1, 2, 254, 255][..])
    );
    assert_eq!(
        find("result/deep/out.txt").as_deref(),
        Some(&b"HELLO WORKSPACE\n!"[..]),
        "{got:?}"
    );
    assert!(find("empty/").is_some(), "{got:?}");

    // --out alone: what the handler wrote.
    fs::remove_file(&out).expect("rm");
    let (v, fin) = exec_ws(&s, f, "{}", None, Some(&out));
    s.assert_ok(&v, &fin, "convert without a workspace");
    let got = read_tar(&fs::read(&out).expect("the --out file"));
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        ["result/", "result/deep/", "result/deep/out.txt"],
        "{v}"
    );

    // Neither: no workspace_out in the answer, an empty directory.
    let (v, fin) = exec_ws(&s, f, "{}", None, None);
    s.assert_ok(&v, &fin, "convert alone");
    assert!(v.get("workspace_out").is_none(), "{v}");
    assert_eq!(v["result"]["tree"], serde_json::json!({}), "{v}");
    s.shutdown();
}

/// A Node function: the same directory, the same files, the same way back.
fn node_round_trip(who: Who) {
    if !std::path::Path::new("/usr/bin/node").exists() {
        zygo_tests::skip("no /usr/bin/node on this machine");
        return;
    }
    let mut s = SUITE.sup(who, "node");
    s.fn_file("convert.mjs", NODE_CONVERT);
    let n = s.up(&[("nc", "", "agent = \"node\"\nentry = \"fn/convert.mjs\"")]);
    let tar = s.file("in.tar", &good_tar());
    let out = out_path(&s, "out.tar");
    let (v, fin) = exec_ws(&s, &n[0], "{}", Some(&tar), Some(&out));
    s.assert_ok(&v, &fin, "node convert");
    let r = &v["result"];
    assert!(is_workdir(text(r, "cwd")), "{v}");
    assert_eq!(r["env"], r["cwd"], "{v}");
    assert_eq!(
        r["listing"],
        serde_json::json!(["empty", "in.txt", "result", "sub"]),
        "{v}"
    );
    let got = read_tar(&fs::read(&out).expect("the --out file"));
    assert!(
        got.contains(&("result/node.txt".into(), b"HELLO WORKSPACE\n".to_vec())),
        "{got:?}"
    );
    s.shutdown();
}

/// Runtime pools, Python and Node: a script run with a workspace finds it in its cwd, and
/// its output comes back; a warm-exec pool (a command) takes no workspace.
fn pool_round_trips(who: Who) {
    let mut s = SUITE.sup(who, "pool");
    let node = std::path::Path::new("/usr/bin/node").exists();
    let mut fns = vec![("py", "agent = \"python\""), ("sh", "cmd = [\"/bin/sh\"]")];
    if node {
        fns.push(("js", "agent = \"node\""));
    }
    let n = s.up(&fns);
    let tar = s.file("in.tar", &good_tar());
    let out = out_path(&s, "out.tar");

    let py = s.put_script(
        "conv.py",
        "import os\ndef handler(event):\n    data = open('in.txt').read()\n    \
         open('pool.txt', 'w').write(data[::-1])\n    \
         return {'cwd': os.getcwd(), 'env': os.environ['ZYGO_WORKSPACE'], 'n': len(os.listdir('.'))}\n",
    );
    let (v, fin) = s.exec(
        &n[0],
        None,
        &[
            "--digest",
            &py,
            "--workspace",
            &tar,
            "--out",
            out.to_str().expect("UTF-8"),
        ],
    );
    s.assert_ok(&v, &fin, "python pool");
    assert!(is_workdir(text(&v["result"], "cwd")), "{v}");
    assert_eq!(v["result"]["env"], v["result"]["cwd"], "{v}");
    assert_eq!(v["result"]["n"], 4, "in.txt, sub, empty and pool.txt: {v}");
    let got = read_tar(&fs::read(&out).expect("the --out file"));
    assert!(
        got.contains(&("pool.txt".into(), b"\necapskrow olleh".to_vec())),
        "{got:?}"
    );

    // Warm-exec: refused before anything runs, saying why.
    let sh = s.put_script("x.sh", "echo hi\n");
    let (v, fin) = s.exec(&n[1], None, &["--digest", &sh, "--workspace", &tar]);
    let e = s.assert_refused(&v, &fin, "bad_request");
    assert!(e.contains("warm-exec"), "{e}");

    if node {
        let js = s.put_script(
            "conv.mjs",
            "import fs from 'node:fs';\nexport default async function () {\n  \
             fs.writeFileSync('js.txt', fs.readFileSync('in.txt', 'utf8').trim());\n  \
             return { cwd: process.cwd(), env: process.env.ZYGO_WORKSPACE };\n}\n",
        );
        fs::remove_file(&out).expect("rm");
        let (v, fin) = s.exec(
            &n[2],
            None,
            &[
                "--digest",
                &js,
                "--workspace",
                &tar,
                "--out",
                out.to_str().expect("UTF-8"),
            ],
        );
        s.assert_ok(&v, &fin, "node pool");
        assert!(is_workdir(text(&v["result"], "cwd")), "{v}");
        assert_eq!(v["result"]["env"], v["result"]["cwd"], "{v}");
        let got = read_tar(&fs::read(&out).expect("the --out file"));
        assert!(
            got.contains(&("js.txt".into(), b"hello workspace".to_vec())),
            "{got:?}"
        );
    } else {
        zygo_tests::skip("no /usr/bin/node on this machine (the Node pool's part)");
    }
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Hostile archives.

root_and_rootless!(hostile_archives_are_refused_before_the_handler_runs);

/// Each archive is refused with a clear error naming the rule (and the entry), as a
/// refusal (nothing ran: no outcome, no output), and the function keeps serving.
fn hostile_archives_are_refused_before_the_handler_runs(who: Who) {
    let mut s = SUITE.sup(who, "hostile");
    let n = s.up(&[("m", "marker", "scratch = \"8M\"")]);
    let f = &n[0];
    let ok = file("ok.txt", b"fine");
    let mut cut = raw(b"liar", b'0', b"only this", 1 << 20);
    cut.truncate(512 + 9);
    let mut shrunk = raw(b"liar", b'0', &[b'A'; 4096], 4096);
    octal(&mut shrunk[124..136], 10); // claims 10 bytes: the rest is read as headers
    resum(&mut shrunk);
    // A header claiming a terabyte (GNU's base-256 size), with nothing behind it.
    let mut huge = raw(b"huge", b'0', b"", 0);
    huge[124..136].fill(0);
    huge[124] = 0x80;
    huge[128..136].copy_from_slice(&(1u64 << 40).to_be_bytes());
    resum(&mut huge);
    let many: Vec<Vec<u8>> = (0..100_000).map(|i| file(&format!("e{i}"), b"")).collect();
    let cases: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        (
            "symlink",
            archive(&[ok.clone(), raw(b"evil", b'2', b"", 0)]),
            "bad_request",
            "is a symbolic link",
        ),
        (
            "hardlink",
            archive(&[ok.clone(), raw(b"evil", b'1', b"", 0)]),
            "bad_request",
            "is a hard link",
        ),
        (
            "dotdot",
            archive(&[file("../../../../tmp/zygo-ws-escape", b"x")]),
            "bad_request",
            "'..'",
        ),
        (
            "absolute",
            archive(&[file("/tmp/zygo-ws-escape", b"x")]),
            "bad_request",
            "absolute path",
        ),
        (
            "chardev",
            archive(&[raw(b"null", b'3', b"", 0)]),
            "bad_request",
            "is a character device",
        ),
        (
            "blockdev",
            archive(&[raw(b"sda", b'4', b"", 0)]),
            "bad_request",
            "is a block device",
        ),
        (
            "fifo",
            archive(&[raw(b"pipe", b'6', b"", 0)]),
            "bad_request",
            "is a fifo",
        ),
        (
            "many",
            archive(&many),
            "too_large",
            "more than 10000 entries",
        ),
        (
            "cut",
            archive(&[cut]),
            "bad_request",
            "the archive ends inside entry \"liar\"",
        ),
        (
            "lying-size",
            archive(&[shrunk]),
            "bad_request",
            "not a well-formed tar archive",
        ),
        (
            "sparse-bomb",
            archive(&[raw(b"bomb", b'S', b"", 0)]),
            "bad_request",
            "sparse",
        ),
        (
            "past-the-cap",
            archive(&[file("big.bin", &vec![7u8; 9 << 20])]),
            "too_large",
            "past its cap",
        ),
        (
            "claims-a-terabyte",
            archive(&[huge]),
            "too_large",
            "past its cap",
        ),
        (
            "not-a-tar",
            vec![b'x'; 4096],
            "bad_request",
            "not a well-formed tar archive",
        ),
    ];
    for (what, bytes, code, says) in cases {
        let tar = s.file(&format!("{what}.tar"), &bytes);
        let (v, fin) = exec_ws(&s, f, "{}", Some(&tar), None);
        let e = s.assert_refused(&v, &fin, code);
        assert!(e.contains(says), "[{what}] {e:?} does not say {says:?}");
        assert!(e.starts_with("the workspace was refused"), "[{what}] {e}");
        assert!(
            !fin.stdout_text().contains("the handler ran"),
            "[{what}] {v}"
        );
    }
    assert!(!std::path::Path::new("/tmp/zygo-ws-escape").exists());
    // Still serving, and a good archive is fine.
    let tar = s.file("good.tar", &good_tar());
    let (v, fin) = exec_ws(&s, f, "{}", Some(&tar), None);
    s.assert_ok(&v, &fin, "a good archive after the hostile ones");
    assert_eq!(v["result"]["ran"], true, "{v}");
    s.shutdown();
}

// ---------------------------------------------------------------------------------------
// Packing what a hostile handler leaves.

root_and_rootless!(
    a_racing_handler_gets_nothing_from_outside_packed,
    a_swapped_folder_is_not_packed
);

/// A racer keeps swapping links (to a host file and a host folder) and fifos into the
/// directory while it is packed: the answer comes (the packer never waits on a fifo), the
/// tar holds only files and folders, and nothing of the host's.
fn a_racing_handler_gets_nothing_from_outside_packed(who: Who) {
    let mut s = SUITE.sup(who, "race");
    let n = s.up(&[("r", "race", "")]);
    let marker = format!("host-secret-{}", unique());
    let secret = s.file("secret.txt", marker.as_bytes());
    let outside = s.dir.path.join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("inner.txt"), &marker).expect("write");
    let event = serde_json::json!({"secret": secret, "outside": outside}).to_string();
    for i in 0..3 {
        let out = out_path(&s, &format!("race{i}.tar"));
        let (v, fin) = exec_ws(&s, &n[0], &event, None, Some(&out));
        s.assert_ok(&v, &fin, "race");
        let bytes = fs::read(&out).expect("the --out file");
        assert!(
            !contains(&bytes, marker.as_bytes()),
            "a host file was packed"
        );
        let got = read_tar(&bytes);
        assert!(
            got.contains(&("plain.txt".into(), b"plain\n".to_vec())),
            "{got:?}"
        );
        for (name, data) in &got {
            let racer_made = name.len() > 1
                && matches!(name.as_bytes()[0], b'l' | b'd' | b'p')
                && name[1..].bytes().all(|b| b.is_ascii_digit());
            assert!(!racer_made, "a link or fifo was packed: {name}");
            if name == "swap" {
                assert_eq!(data, b"inside\n");
            }
        }
        assert!(!got.iter().any(|(n, _)| n == "sock"), "a socket was packed");
    }
    s.shutdown();
}

/// The request's folder renamed away and a link to a host folder put in its place: not
/// packed at all; the CLI says so and writes nothing.
fn a_swapped_folder_is_not_packed(who: Who) {
    let mut s = SUITE.sup(who, "swap");
    let n = s.up(&[("s", "swap", "")]);
    let outside = s.dir.path.join("outside");
    fs::create_dir(&outside).expect("mkdir");
    fs::write(outside.join("host.txt"), b"host").expect("write");
    let out = out_path(&s, "swap.tar");
    let event = serde_json::json!({"outside": outside}).to_string();
    let (v, fin) = exec_ws(&s, &n[0], &event, None, Some(&out));
    s.assert_ok(&v, &fin, "swap");
    assert_eq!(v["workspace_out"], Value::Null, "{v}");
    assert!(!out.exists(), "nothing is written");
    // In words, on stderr.
    let f = s.run(&["exec", &n[0], &event, "--out", out.to_str().expect("UTF-8")]);
    assert_eq!(f.code, 0, "{}", f.stderr_text());
    assert!(
        f.stderr_text().contains("did not come back"),
        "{}",
        f.stderr_text()
    );
    assert!(!out.exists(), "nothing is written");
    s.shutdown();
}

/// `--workspace` with a file over 64 MiB is refused by the CLI before it is sent.
#[test]
fn a_workspace_over_64_mib_is_refused_before_it_is_sent() {
    let Some(mut s) = SUITE.root("big") else {
        return;
    };
    let n = s.up(&[("m", "marker", "")]);
    let big = s.dir.path.join("big.tar");
    let f = fs::File::create(&big).expect("create");
    f.set_len(64 * 1024 * 1024 + 1).expect("grow");
    let (v, fin) = s.exec(&n[0], None, &["--workspace", big.to_str().expect("UTF-8")]);
    assert_eq!(fin.code, 2, "{v}");
    assert!(text(&v, "error").contains("over 64 MiB"), "{v}");
    s.shutdown();
}
