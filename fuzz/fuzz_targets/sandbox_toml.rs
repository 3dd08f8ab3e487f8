//! Arbitrary text as a sandbox.toml: parse or fail with an error, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = policy::file::parse_sandbox_toml(text, std::path::Path::new("/fuzz/sandbox.toml"));
    }
});
