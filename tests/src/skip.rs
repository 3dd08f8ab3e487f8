//! Skipped tests, counted as skipped.
//!
//! libtest knows only `#[ignore]`, decided at compile time; a test that finds at run time
//! that it cannot run here (not root, a missing program or SDK) can only return, and would
//! then count as passed. Every such test calls [`skip`] instead, then returns:
//!
//! - the reason goes to stderr;
//! - when `$ZYGO_TEST_SKIPS` names a file (`scripts/test` sets it), one line
//!   `<test binary> <test name>: <reason>` is appended to it, and `scripts/test` counts
//!   the test as skipped rather than passed, and lists it;
//! - with `ZYGO_TEST_NO_SKIPS=1` (`.ci/run` sets it: CI runs as root with every program
//!   the suite needs, so nothing may be left out there) the test fails with the reason.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The file `scripts/test` reads the skipped tests from.
pub const SKIPS_ENV: &str = "ZYGO_TEST_SKIPS";
/// Set to `1`, a skip fails the test.
pub const NO_SKIPS_ENV: &str = "ZYGO_TEST_NO_SKIPS";

/// Skip the running test because of `reason` (see the module's text). The test must
/// return right after: `scripts/test` takes a recorded test off the passed ones.
#[track_caller]
pub fn skip(reason: &str) {
    let record = std::env::var_os(SKIPS_ENV)
        .filter(|p| !p.is_empty())
        .map(PathBuf::from);
    let no_skips = std::env::var_os(NO_SKIPS_ENV).is_some_and(|v| v == "1");
    skip_to(record.as_deref(), no_skips, &test_id(), reason);
}

/// [`skip`] with its settings spelled out: fail the test when `no_skips`, else say why and
/// append a line for `test` to `record` (when given).
#[track_caller]
pub fn skip_to(record: Option<&Path>, no_skips: bool, test: &str, reason: &str) {
    let reason = one_line(reason);
    if no_skips {
        panic!("{test} cannot run here ({reason}), and {NO_SKIPS_ENV}=1 allows no skipped test");
    }
    eprintln!("skipped: {reason}");
    let Some(path) = record else {
        return;
    };
    // One write of one line, with O_APPEND: the tests of a binary run on many threads.
    let line = format!("{test}: {reason}\n");
    OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
        .and_then(|mut f| f.write_all(line.as_bytes()))
        .unwrap_or_else(|e| {
            panic!(
                "{test}: cannot record the skip in {} ({e}); it would count as passed",
                path.display()
            )
        });
}

/// `<test binary> <test name>` of the running test: the binary's name without cargo's hash
/// (`functions`, `zygo_tests`), and the name libtest gives the test's thread
/// (`node_pool::rootless`).
pub fn test_id() -> String {
    let binary = std::env::current_exe()
        .ok()
        .and_then(|p| Some(p.file_name()?.to_str()?.to_string()))
        .map_or_else(|| "unknown".to_string(), |n| without_hash(&n).to_string());
    let thread = std::thread::current();
    let test = match thread.name() {
        Some(n) if n != "main" => n.to_string(),
        _ => "unknown".to_string(),
    };
    format!("{binary} {test}")
}

/// `functions-0123456789abcdef` → `functions`: the name cargo gives a test binary, without
/// the hash it adds.
pub fn without_hash(name: &str) -> &str {
    match name.rsplit_once('-') {
        Some((stem, hash)) if hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) => {
            stem
        }
        _ => name,
    }
}

/// The reason on one line, so that the record stays one line per test.
fn one_line(reason: &str) -> String {
    reason.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::TempDir;

    #[test]
    fn a_skip_is_recorded_as_one_line_per_call() {
        let dir = TempDir::new(0o700);
        let file = dir.path.join("skips");
        skip_to(
            Some(&file),
            false,
            "pools node_pool::root",
            "no /usr/bin/node",
        );
        skip_to(Some(&file), false, "functions stuck", "needs\nroot");
        let text = std::fs::read_to_string(&file).expect("read the record");
        assert_eq!(
            text,
            "pools node_pool::root: no /usr/bin/node\nfunctions stuck: needs root\n"
        );
    }

    #[test]
    fn without_a_record_a_skip_only_says_why() {
        skip_to(None, false, "functions stuck", "needs root");
    }

    #[test]
    fn a_skip_fails_the_test_when_no_skips_are_allowed() {
        let dir = TempDir::new(0o700);
        let file = dir.path.join("skips");
        let r = std::panic::catch_unwind(|| {
            skip_to(Some(&file), true, "functions stuck", "needs root");
        });
        let msg = r.expect_err("the skip must fail the test");
        let msg = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(
            msg.contains("functions stuck cannot run here (needs root)")
                && msg.contains("ZYGO_TEST_NO_SKIPS=1"),
            "{msg}"
        );
        assert!(!file.exists(), "a failed skip is not recorded as a skip");
    }

    #[test]
    fn a_record_that_cannot_be_written_fails_the_test() {
        let dir = TempDir::new(0o700);
        let file = dir.path.join("no-such-folder").join("skips");
        let r = std::panic::catch_unwind(|| {
            skip_to(Some(&file), false, "functions stuck", "needs root");
        });
        assert!(r.is_err(), "an unrecorded skip would count as passed");
    }

    #[test]
    fn the_test_id_names_the_binary_and_the_test() {
        assert_eq!(
            test_id(),
            "zygo_tests skip::tests::the_test_id_names_the_binary_and_the_test"
        );
    }

    #[test]
    fn cargo_s_hash_is_taken_off_a_binary_name() {
        assert_eq!(without_hash("functions-0123456789abcdef"), "functions");
        assert_eq!(without_hash("bad_input-fedcba9876543210"), "bad_input");
        assert_eq!(without_hash("zygo-tests"), "zygo-tests");
        assert_eq!(without_hash("functions-0123"), "functions-0123");
    }
}
