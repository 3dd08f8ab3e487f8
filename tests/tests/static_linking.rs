//! `zygo` and the test binaries are linked statically (`.cargo/config.toml`). Static glibc
//! cannot load NSS modules: a lookup that goes past `files` (a user absent from
//! `/etc/passwd`, a host name) crashes the process or quietly fails. So no code of ours may
//! call glibc's NSS: ids are read from `/etc/passwd`-style files directly, and addresses are
//! given as numbers.

use std::fs;
use std::path::{Path, PathBuf};

/// The calls (and the Rust APIs that wrap them) that reach glibc's NSS.
const NSS_CALLS: &[&str] = &[
    "getpwnam",
    "getpwuid",
    "getpwent",
    "getgrnam",
    "getgrgid",
    "getgrent",
    "getgrouplist",
    "getspnam",
    "initgroups",
    "getaddrinfo",
    "getnameinfo",
    "gethostbyname",
    "gethostbyaddr",
    "getservbyname",
    "User::from_name",
    "User::from_uid",
    "Group::from_name",
    "Group::from_gid",
    "to_socket_addrs",
    "lookup_host",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

fn rust_sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        if name == "target" || name == ".git" || name == "node_modules" {
            continue;
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            rust_sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A call in code, not a mention in a comment or a string.
fn calls(line: &str, name: &str) -> bool {
    let code = line.split("//").next().unwrap_or("");
    let mut rest = code;
    while let Some(i) = rest.find(name) {
        let before = rest[..i].chars().last();
        let after = &rest[i + name.len()..];
        let word_start = !before.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let quoted = rest[..i].matches('"').count() % 2 == 1;
        if word_start && !quoted && after.trim_start().starts_with('(') {
            return true;
        }
        rest = after;
    }
    false
}

#[test]
fn no_code_of_ours_calls_glibc_nss() {
    let root = workspace();
    let mut files = Vec::new();
    for d in ["crates", "tests", "fuzz", "vendor"] {
        rust_sources(&root.join(d), &mut files);
    }
    assert!(
        files.len() > 20,
        "found only {} sources under {}",
        files.len(),
        root.display()
    );
    let me = Path::new(file!()).file_name().expect("a file name");
    let mut found = Vec::new();
    for f in &files {
        if f.file_name() == Some(me) {
            continue;
        }
        let text = fs::read_to_string(f).expect("read a source file");
        for (n, line) in text.lines().enumerate() {
            for name in NSS_CALLS {
                if calls(line, name) {
                    found.push(format!("{}:{}: {name}", f.display(), n + 1));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "calls into glibc's NSS, which crash or fail in a static binary:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_scan_sees_a_call_and_not_a_mention() {
    assert!(calls("let pw = libc::getpwnam(c.as_ptr());", "getpwnam"));
    assert!(calls("addr.to_socket_addrs ()", "to_socket_addrs"));
    assert!(!calls("// never getpwnam(name) here", "getpwnam"));
    assert!(!calls("let s = \"getpwnam(\";", "getpwnam"));
    assert!(!calls("fn my_getpwnam_free()", "getpwnam"));
}

#[test]
fn passwd_lines_give_their_ids() {
    let text = "root:x:0:0:root:/root:/bin/bash\nzygo-rootless:x:998:996::/:/usr/sbin/nologin\n";
    assert_eq!(
        zygo_tests::passwd_ids(text, "zygo-rootless"),
        Some((998, 996))
    );
    assert_eq!(zygo_tests::passwd_ids(text, "zygo"), None);
    assert_eq!(zygo_tests::passwd_ids("broken:x\n", "broken"), None);
}
