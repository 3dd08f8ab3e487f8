//! The unpacker against well-formed and hostile archives, and the packer against a folder
//! that holds links, fifos and sockets, on a real file system.

use super::*;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// A folder of a test's own under the system's temporary folder, removed at the end.
struct Tmp(PathBuf);

impl Tmp {
    fn new() -> Tmp {
        use std::sync::atomic::{AtomicU32, Ordering};
        static N: AtomicU32 = AtomicU32::new(0);
        let p = std::env::temp_dir().join(format!(
            "zygo-ws-test-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir(&p).expect("make a temporary folder");
        Tmp(p)
    }

    fn fd(&self) -> OwnedFd {
        std::fs::File::open(&self.0)
            .expect("open the folder")
            .into()
    }

    fn dev(&self) -> u64 {
        std::fs::metadata(&self.0).expect("stat").dev()
    }
}

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const LIM: Limits = Limits {
    max_bytes: 1 << 20,
    max_entries: 100,
    max_depth: MAX_DEPTH,
};

/// One raw ustar entry: any name bytes, any type, `data`, and the size its header claims.
fn raw(name: &[u8], kind: u8, data: &[u8], claimed: u64) -> Vec<u8> {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name);
    octal(&mut h[100..108], 0o644);
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], claimed);
    octal(&mut h[136..148], 0);
    h[156] = kind;
    if kind == b'2' || kind == b'1' {
        h[157..157 + 11].copy_from_slice(b"/etc/passwd");
    }
    if kind == b'S' {
        // GNU's magic: a sparse entry is GNU's.
        h[257..265].copy_from_slice(b"ustar  \0");
        octal(&mut h[483..495], 0); // realsize
    } else {
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
    }
    resum(&mut h);
    let mut v = h.to_vec();
    v.extend_from_slice(data);
    v.resize(padded(v.len()), 0);
    v
}

/// Recompute a header's checksum after changing it.
fn resum(h: &mut [u8]) {
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h[..512].iter().map(|&b| b as u32).sum();
    octal(&mut h[148..155], sum as u64);
    h[155] = b' ';
}

fn file(name: &str, data: &[u8]) -> Vec<u8> {
    raw(name.as_bytes(), b'0', data, data.len() as u64)
}

fn dir(name: &str) -> Vec<u8> {
    raw(name.as_bytes(), b'5', b"", 0)
}

fn archive(entries: &[Vec<u8>]) -> Vec<u8> {
    let mut v: Vec<u8> = entries.concat();
    v.resize(v.len() + 1024, 0);
    v
}

fn unpack_into(t: &Tmp, tar: &[u8], lim: &Limits) -> Result<Unpacked, Refusal> {
    unpack(t.fd().as_fd(), tar, lim)
}

/// Everything under `root`, as (relative path, what it is, mode, contents).
fn tree(root: &Path) -> Vec<(String, char, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let e = e.expect("entry");
            let m = std::fs::symlink_metadata(e.path()).expect("lstat");
            let rel = e
                .path()
                .strip_prefix(root)
                .expect("below")
                .display()
                .to_string();
            let mode = m.permissions().mode() & 0o7777;
            if m.is_dir() {
                out.push((rel, 'd', mode, Vec::new()));
                todo.push(e.path());
            } else if m.is_file() {
                out.push((rel, 'f', mode, std::fs::read(e.path()).expect("read")));
            } else {
                out.push((rel, '?', mode, Vec::new()));
            }
        }
    }
    out.sort();
    out
}

fn refused(t: &Tmp, tar: &[u8], lim: &Limits, want: &str) -> Refusal {
    let r = match unpack_into(t, tar, lim) {
        Ok(u) => panic!("unpacked ({u:?}); wanted a refusal saying {want:?}"),
        Err(r) => r,
    };
    assert!(
        r.message.contains(want),
        "{:?} does not say {want:?}",
        r.message
    );
    r
}

#[test]
fn files_and_folders_are_unpacked_with_zygos_modes() {
    let t = Tmp::new();
    let long = format!("{}/{}", "d".repeat(120), "f".repeat(120));
    let mut tar = tar::Builder::new(Vec::new());
    let mut add = |path: &str, data: &[u8], mode: u32| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, path, data).expect("append");
    };
    add("./in.txt", b"hello", 0o4777);
    add("sub/deeper/data.bin", &[0, 1, 2, 255], 0o755);
    add(&long, b"long name", 0o644);
    add("empty", b"", 0o644);
    let mut dh = tar::Header::new_gnu();
    dh.set_entry_type(tar::EntryType::Directory);
    dh.set_mode(0o777);
    dh.set_size(0);
    tar.append_data(&mut dh, "sub/", &b""[..]).expect("dir");
    tar.append_data(&mut dh.clone(), "lonely/", &b""[..])
        .expect("dir");
    let bytes = tar.into_inner().expect("finish");
    let u = unpack_into(&t, &bytes, &LIM).expect("unpack");
    assert_eq!(u.files, 4);
    assert_eq!(u.bytes, 5 + 4 + 9);
    let got = tree(&t.0);
    let want = vec![
        ("d".repeat(120), 'd', 0o700, vec![]),
        (long.clone(), 'f', 0o600, b"long name".to_vec()),
        ("empty".into(), 'f', 0o600, vec![]),
        ("in.txt".into(), 'f', 0o600, b"hello".to_vec()),
        ("lonely".into(), 'd', 0o700, vec![]),
        ("sub".into(), 'd', 0o700, vec![]),
        ("sub/deeper".into(), 'd', 0o700, vec![]),
        ("sub/deeper/data.bin".into(), 'f', 0o600, vec![0, 1, 2, 255]),
    ];
    assert_eq!(got, want);
}

#[test]
fn a_packed_folder_unpacks_to_the_same_tree() {
    let src = Tmp::new();
    let long = format!("{}/{}/{}", "a".repeat(90), "b".repeat(90), "c".repeat(90));
    std::fs::create_dir_all(src.0.join(Path::new(&long).parent().expect("parent"))).expect("mkdir");
    std::fs::write(src.0.join(&long), b"deep and long").expect("write");
    std::fs::write(src.0.join("out.png"), vec![7u8; 70_000]).expect("write");
    std::fs::create_dir(src.0.join("empty-dir")).expect("mkdir");
    std::fs::write(src.0.join("\u{e9}t\u{e9} \"q\".txt"), b"unicode").expect("write");
    let parent = Tmp::new();
    std::fs::rename(&src.0, parent.0.join("w")).expect("move");
    std::fs::create_dir(&src.0).expect("recreate for Drop");
    let p = pack(
        parent.fd().as_fd(),
        b"w",
        parent.dev(),
        &PackLimits {
            max_bytes: 1 << 20,
            max_entries: 100,
            max_depth: MAX_DEPTH,
        },
    );
    assert!(!p.truncated);
    let bytes = p.tar.expect("packed");
    // Any tar reader reads it: the tar crate, and here Zygo's own unpacker.
    let names: Vec<String> = tar::Archive::new(&bytes[..])
        .entries()
        .expect("entries")
        .map(|e| String::from_utf8_lossy(&e.expect("entry").path_bytes()).into_owned())
        .collect();
    assert!(names.contains(&long), "{names:?}");
    let dst = Tmp::new();
    unpack_into(&dst, &bytes, &LIM).expect("unpack what was packed");
    let mut got = tree(&dst.0);
    let mut want = tree(&parent.0.join("w"));
    for t in [&mut got, &mut want] {
        for e in t.iter_mut() {
            e.2 = 0; // modes are Zygo's on both sides
        }
    }
    assert_eq!(got, want);
}

#[test]
fn links_devices_fifos_and_sparse_files_are_refused() {
    for (kind, why) in [
        (b'2', "is a symbolic link"),
        (b'1', "is a hard link"),
        (b'3', "is a character device"),
        (b'4', "is a block device"),
        (b'6', "is a fifo"),
        (b'S', "is a sparse file"),
        (b'V', "a type Zygo does not unpack"),
    ] {
        let t = Tmp::new();
        let tar = archive(&[file("before.txt", b"x"), raw(b"evil", kind, b"", 0)]);
        let r = refused(&t, &tar, &LIM, why);
        assert!(!r.too_large);
        assert!(
            r.message.contains("\"evil\""),
            "names the entry: {}",
            r.message
        );
        assert!(!t.0.join("evil").exists());
    }
}

#[test]
fn paths_that_leave_the_folder_are_refused() {
    let outside = Tmp::new();
    for (name, why) in [
        (&b"../escape.txt"[..], "'..'"),
        (b"a/../../escape.txt", "'..'"),
        (b"./..", "'..'"),
        (b"/tmp/escape.txt", "absolute path"),
        (b"//escape.txt", "absolute path"),
    ] {
        let t = Tmp::new();
        std::fs::create_dir(t.0.join("a")).expect("mkdir");
        refused(&t, &archive(&[raw(name, b'0', b"x", 1)]), &LIM, why);
    }
    assert!(std::fs::read_dir(&outside.0)
        .expect("read")
        .next()
        .is_none());
    // A NUL in a pax path (ustar's fields cannot hold one).
    let t = Tmp::new();
    let rec = pax_record("path", b"a\0b");
    let tar = archive(&[raw(b"pax", b'x', &rec, rec.len() as u64), file("x", b"1")]);
    refused(&t, &tar, &LIM, "NUL");
}

#[test]
fn too_deep_too_many_and_too_big_are_refused_as_too_large_or_bad() {
    // 65 levels.
    let t = Tmp::new();
    let deep = vec!["d"; MAX_DEPTH + 1].join("/");
    let rec = pax_record("path", deep.as_bytes());
    let tar = archive(&[raw(b"pax", b'x', &rec, rec.len() as u64), file("x", b"1")]);
    refused(&t, &tar, &LIM, "levels deep");

    // More entries than the cap: counted as they come, folders made on the way included.
    let t = Tmp::new();
    let many: Vec<Vec<u8>> = (0..=LIM.max_entries)
        .map(|i| file(&format!("f{i}"), b""))
        .collect();
    let r = refused(&t, &archive(&many), &LIM, "more than 100 entries");
    assert!(r.too_large);
    assert_eq!(
        std::fs::read_dir(&t.0).expect("read").count(),
        LIM.max_entries
    );
    let t = Tmp::new();
    let nested: Vec<Vec<u8>> = (0..40).map(|i| file(&format!("a{i}/b/c"), b"")).collect();
    assert!(refused(&t, &archive(&nested), &LIM, "more than 100 entries").too_large);

    // A member past the byte cap: refused on its header's claim...
    let t = Tmp::new();
    let big = vec![b'z'; 2 << 20];
    let r = refused(&t, &archive(&[file("big", &big)]), &LIM, "past its cap");
    assert!(r.too_large);
    // ...and, under a claim that fits, on the bytes written.
    let t = Tmp::new();
    let half = vec![b'z'; 600 * 1024];
    let r = refused(
        &t,
        &archive(&[file("a", &half), file("b", &half)]),
        &LIM,
        "past its cap",
    );
    assert!(r.too_large);
    let written = std::fs::metadata(t.0.join("b")).map_or(0, |m| m.len());
    assert!(
        600 * 1024 + written <= LIM.max_bytes + 64 * 1024,
        "stopped at the cap"
    );
}

#[test]
fn archives_that_lie_or_are_cut_are_refused() {
    // The header claims more than the archive holds.
    let t = Tmp::new();
    let mut tar = raw(b"liar", b'0', b"short", 1000);
    tar.truncate(512 + 5);
    refused(&t, &tar, &LIM, "the archive ends inside entry \"liar\"");
    // The header claims less: the rest of the data is read as a header, and fails.
    let t = Tmp::new();
    let mut liar = raw(b"liar", b'0', &[b'A'; 2048], 2048);
    octal(&mut liar[124..136], 10);
    resum(&mut liar);
    refused(&t, &archive(&[liar]), &LIM, "not a well-formed tar archive");
    // Not a tar at all.
    let t = Tmp::new();
    refused(&t, &[b'x'; 700], &LIM, "not a well-formed tar archive");
    // A sparse bomb: a GNU sparse header claiming terabytes.
    let t = Tmp::new();
    let mut s = raw(b"bomb", b'S', b"", 0);
    octal(&mut s[483..495], 1 << 40); // realsize
    resum(&mut s);
    refused(&t, &archive(&[s]), &LIM, "sparse");
}

#[test]
fn an_entry_named_twice_or_a_file_used_as_a_folder_is_refused() {
    let t = Tmp::new();
    refused(
        &t,
        &archive(&[file("a", b"1"), file("a", b"2")]),
        &LIM,
        "appears twice",
    );
    assert_eq!(std::fs::read(t.0.join("a")).expect("first stays"), b"1");
    let t = Tmp::new();
    refused(
        &t,
        &archive(&[file("a", b"1"), file("a/b", b"2")]),
        &LIM,
        "made a file",
    );
    let t = Tmp::new();
    refused(
        &t,
        &archive(&[file("a", b"1"), dir("a/")]),
        &LIM,
        "made it a file",
    );
    // A folder named twice, or after a file inside it, is fine.
    let t = Tmp::new();
    unpack_into(
        &t,
        &archive(&[file("d/x", b"1"), dir("d/"), dir("d")]),
        &LIM,
    )
    .expect("fine");
}

#[test]
fn a_symlink_already_in_the_folder_is_never_followed() {
    // What a hostile agent could leave before the unpack: links where the archive's
    // folders and files go.
    let t = Tmp::new();
    let outside = Tmp::new();
    std::os::unix::fs::symlink(&outside.0, t.0.join("sub")).expect("symlink");
    std::os::unix::fs::symlink(outside.0.join("f"), t.0.join("f")).expect("symlink");
    refused(&t, &archive(&[file("sub/x", b"1")]), &LIM, "made a file");
    refused(&t, &archive(&[file("f", b"1")]), &LIM, "appears twice");
    refused(&t, &archive(&[dir("sub/")]), &LIM, "made it a file");
    assert!(std::fs::read_dir(&outside.0)
        .expect("read")
        .next()
        .is_none());
}

fn pack_w(parent: &Tmp, lim: &PackLimits) -> Packed {
    pack(parent.fd().as_fd(), b"w", parent.dev(), lim)
}

fn names(tar: &[u8]) -> Vec<String> {
    tar::Archive::new(tar)
        .entries()
        .expect("entries")
        .map(|e| {
            let e = e.expect("entry");
            assert!(
                matches!(
                    e.header().entry_type(),
                    tar::EntryType::Regular | tar::EntryType::Directory
                ),
                "only files and folders are packed"
            );
            String::from_utf8_lossy(&e.path_bytes()).into_owned()
        })
        .collect()
}

const PLIM: PackLimits = PackLimits {
    max_bytes: 1 << 20,
    max_entries: 100,
    max_depth: MAX_DEPTH,
};

#[test]
fn packing_skips_links_fifos_and_sockets_and_never_waits() {
    let parent = Tmp::new();
    let outside = Tmp::new();
    std::fs::write(outside.0.join("secret"), b"outside").expect("write");
    let w = parent.0.join("w");
    std::fs::create_dir_all(w.join("sub")).expect("mkdir");
    std::fs::write(w.join("ok.txt"), b"ok").expect("write");
    std::os::unix::fs::symlink(outside.0.join("secret"), w.join("link")).expect("symlink");
    std::os::unix::fs::symlink(&outside.0, w.join("dirlink")).expect("symlink");
    std::os::unix::fs::symlink(&outside.0, w.join("sub/up")).expect("symlink");
    let fifo = CString::new(w.join("fifo").as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: mkfifo with a C string path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let _sock = std::os::unix::net::UnixListener::bind(w.join("sock")).expect("bind");
    assert!(std::fs::symlink_metadata(w.join("fifo"))
        .expect("lstat")
        .file_type()
        .is_fifo());
    let p = pack_w(&parent, &PLIM);
    let got = names(&p.tar.expect("packed"));
    assert_eq!(got, ["ok.txt", "sub/"]);
    assert!(!p.truncated);
}

#[test]
fn a_folder_swapped_for_a_link_is_not_packed() {
    let parent = Tmp::new();
    let outside = Tmp::new();
    std::fs::write(outside.0.join("secret"), b"outside").expect("write");
    std::os::unix::fs::symlink(&outside.0, parent.0.join("w")).expect("symlink");
    let p = pack_w(&parent, &PLIM);
    assert!(p.tar.is_none());
    assert!(p.note.is_some());
    // Nor a folder on another file system (dev differs).
    std::fs::remove_file(parent.0.join("w")).expect("rm");
    std::fs::create_dir(parent.0.join("w")).expect("mkdir");
    let p = pack(parent.fd().as_fd(), b"w", parent.dev() + 1, &PLIM);
    assert!(p.tar.is_none());
}

#[test]
fn packing_stops_at_its_caps_and_says_so() {
    let parent = Tmp::new();
    let w = parent.0.join("w");
    std::fs::create_dir(&w).expect("mkdir");
    std::fs::write(w.join("a-small"), b"small").expect("write");
    std::fs::write(w.join("b-big"), vec![1u8; 200_000]).expect("write");
    std::fs::write(w.join("c-small"), b"small too").expect("write");
    let p = pack_w(
        &parent,
        &PackLimits {
            max_bytes: 100_000,
            ..PLIM
        },
    );
    assert!(p.truncated);
    let tar = p.tar.expect("packed");
    assert!(tar.len() <= 100_000);
    assert_eq!(names(&tar), ["a-small", "c-small"]);
    // Entries.
    for i in 0..20 {
        std::fs::write(w.join(format!("n{i:02}")), b"").expect("write");
    }
    let p = pack_w(
        &parent,
        &PackLimits {
            max_entries: 10,
            ..PLIM
        },
    );
    assert!(p.truncated);
    assert!(names(&p.tar.expect("packed")).len() <= 10);
    // Depth.
    let deep = w.join("x/y/z");
    std::fs::create_dir_all(&deep).expect("mkdir");
    std::fs::write(deep.join("f"), b"deep").expect("write");
    let p = pack_w(
        &parent,
        &PackLimits {
            max_depth: 2,
            ..PLIM
        },
    );
    assert!(p.truncated);
    let got = names(&p.tar.expect("packed"));
    assert!(got.contains(&"x/y/".to_string()), "{got:?}");
    assert!(!got.iter().any(|n| n.starts_with("x/y/z")), "{got:?}");
}

#[test]
fn the_writer_makes_headers_any_reader_accepts() {
    let mut w = TarWriter::new(1 << 20);
    let long: Vec<u8> = [&b"p/"[..], &[b'q'; 300][..]].concat();
    assert!(w.file(b"short", b"1", 0));
    assert!(w.file(&long, b"2", 1_700_000_000));
    assert!(w.dir(b"folder", 0));
    let tar = w.finish();
    assert_eq!(tar.len() % 512, 0);
    let mut a = tar::Archive::new(&tar[..]);
    let mut got = Vec::new();
    for e in a.entries().expect("entries") {
        let mut e = e.expect("entry");
        let mut data = Vec::new();
        e.read_to_end(&mut data).expect("read");
        got.push((e.path_bytes().into_owned(), data));
    }
    assert_eq!(
        got,
        vec![
            (b"short".to_vec(), b"1".to_vec()),
            (long, b"2".to_vec()),
            (b"folder/".to_vec(), vec![]),
        ]
    );
    // The system's tar agrees, where there is one.
    let t = Tmp::new();
    std::fs::write(t.0.join("x.tar"), &tar).expect("write");
    if let Ok(out) = std::process::Command::new("tar")
        .arg("-tvf")
        .arg(t.0.join("x.tar"))
        .output()
    {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

#[test]
fn pax_records_count_their_own_length() {
    for v in [0usize, 1, 5, 90, 91, 92, 95, 96, 990, 995, 1000] {
        let r = pax_record("path", &vec![b'a'; v]);
        let (len, _) = r.split_at(r.iter().position(|&b| b == b' ').expect("space"));
        let len: usize = std::str::from_utf8(len)
            .expect("digits")
            .parse()
            .expect("number");
        assert_eq!(len, r.len(), "value of {v}");
    }
}
