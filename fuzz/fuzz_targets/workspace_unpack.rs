//! Arbitrary bytes as a workspace tar, unpacked into a fresh folder: refused or unpacked,
//! never a panic, and whatever was written keeps the unpacker's rules: only regular files
//! (0600) and folders (0700) below the folder, no link, within the caps, nothing beside it.
#![no_main]

use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use libfuzzer_sys::fuzz_target;
use zygo_launcher::workspace::{unpack, Limits};

const LIMITS: Limits = Limits {
    max_bytes: 1 << 20,
    max_entries: 256,
    max_depth: 64,
};

/// Every file and folder below `dir`, checked against the rules: (entries, file bytes).
fn check(dir: &Path) -> (usize, u64) {
    let (mut entries, mut bytes) = (0, 0);
    for e in std::fs::read_dir(dir).expect("read a folder the unpacker made") {
        let e = e.expect("an entry");
        let m = std::fs::symlink_metadata(e.path()).expect("lstat");
        let mode = m.permissions().mode() & 0o7777;
        entries += 1;
        if m.is_dir() {
            assert_eq!(mode, 0o700, "{}", e.path().display());
            let (n, b) = check(&e.path());
            entries += n;
            bytes += b;
        } else {
            assert!(
                m.is_file(),
                "not a file or a folder: {}",
                e.path().display()
            );
            assert_eq!(mode, 0o600, "{}", e.path().display());
            bytes += m.len();
        }
    }
    (entries, bytes)
}

fuzz_target!(|data: &[u8]| {
    // A tmpfs where there is one (as a request's /work is), else the temporary folder.
    let base = if Path::new("/dev/shm").is_dir() {
        std::path::PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let root = base.join(format!("zygo-fuzz-ws-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let into = root.join("w");
    let beside = root.join("beside");
    std::fs::create_dir_all(&into).expect("make the folder");
    std::fs::create_dir_all(&beside).expect("make its neighbour");
    let dir = std::fs::File::open(&into).expect("open the folder");
    let _ = unpack(dir.as_fd(), data, &LIMITS);
    let (entries, bytes) = check(&into);
    assert!(entries <= LIMITS.max_entries, "{entries} entries");
    assert!(bytes <= LIMITS.max_bytes, "{bytes} bytes");
    assert_eq!(
        std::fs::read_dir(&beside).expect("read").count(),
        0,
        "written beside"
    );
    assert_eq!(
        std::fs::read_dir(&root).expect("read").count(),
        2,
        "written beside"
    );
    std::fs::remove_dir_all(&root).expect("clean up");
});
