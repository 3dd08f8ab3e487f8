//! `scripts/test` itself: its cargo run goes on past a failing test binary, and its tally
//! counts what ran, and only that.
//!
//! A scratch workspace with three test binaries, run through the script's own
//! `cargo_tests` and `tally`: one has a failing test whose output looks like a tally line,
//! one aborts half-way (no result line of its own), one passes. Every binary runs, and the
//! total counts each test once.

// A test that fails on an unexpected error says where; that is all an unwrap does here.
#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

use zygo_tests::*;

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn every_test_binary_runs_and_the_tally_counts_each_test_once() {
    let cargo = std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from);
    if Command::new(&cargo).arg("--version").output().is_err() {
        skip("no cargo to run a scratch workspace's tests with");
        return;
    }
    let dir = TempDir::new(0o700);
    let w = &dir.path;
    std::fs::create_dir_all(w.join("src")).unwrap();
    std::fs::create_dir_all(w.join("tests")).unwrap();
    std::fs::write(
        w.join("Cargo.toml"),
        "[package]\nname = \"scratch\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[workspace]\n",
    )
    .unwrap();
    std::fs::write(w.join("src/lib.rs"), "").unwrap();
    // Sorted by name, the first to fail: without --no-fail-fast, cargo stops here.
    std::fs::write(
        w.join("tests/a.rs"),
        "#[test] fn a_fine() {}\n\
         #[test] fn b_fails() { println!(\"test result: ok. 7 passed; 0 failed; 0 ignored\");\n\
         println!(\"x: 5 passed; 0 failed; 0 ignored\"); println!(\"Ran 9 tests\"); panic!(\"no\") }\n",
    )
    .unwrap();
    // Aborts in its second test: cargo prints no result line for it.
    std::fs::write(
        w.join("tests/b.rs"),
        "#[test] fn a_fine() {}\n#[test] fn b_aborts() { std::process::abort() }\n\
         #[test] fn c_never_runs() {}\n",
    )
    .unwrap();
    std::fs::write(
        w.join("tests/c.rs"),
        "#[test] fn fine() {}\n#[test] #[ignore] fn later() {}\n",
    )
    .unwrap();
    let script = repo_root().join("scripts/test");
    let cargo_dir = cargo.parent().map(PathBuf::from).unwrap_or_default();
    let path = format!(
        "{}:{}",
        cargo_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(
            r#". "$1" && cd "$2" && { cargo_tests -- --test-threads=1 >log 2>&1; echo "status $?"; tally log /dev/null; }"#,
        )
        .arg("bash")
        .arg(&script)
        .arg(w)
        .env("PATH", path)
        .env("CARGO_TARGET_DIR", w.join("target"))
        .env("CARGO_NET_OFFLINE", "true")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_BUILD_TARGET")
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    let log = std::fs::read_to_string(w.join("log")).unwrap_or_default();
    assert!(said.contains("status 101"), "cargo's status: {said}\n{log}");
    // a: 1 passed, 1 failed; b: 1 passed, 2 failed (the abort and the test it left unrun);
    // c: 1 passed, 1 ignored; the library's unit tests and doc-tests: none.
    assert!(
        said.contains("total: 3 passed, 3 failed, 1 skipped"),
        "the tally: {said}\nthe log:\n{log}"
    );
    assert!(log.contains("Running tests/c.rs"), "c did not run:\n{log}");
}
