//! Tenants' secrets, sealed at rest.
//!
//! The key is `ZYGO_SECRETS_KEY` in the supervisor's environment when it starts: exactly 32
//! bytes written as 64 hex digits (`zygo secrets keygen` makes one). Anything else is
//! refused at start rather than stretched into a key: a passphrase turned into a key by a
//! weak function would be worse than no store. The key is taken out of the environment
//! before any thread or process is started, so no launcher or sandbox ever sees it, and it
//! is never written anywhere by Zygo: it lives in the supervisor's memory only.
//!
//! Each value is sealed with ChaCha20-Poly1305 under a fresh random 96-bit nonce, with its
//! tenant and name as associated data: a sealed record copied or renamed to another tenant
//! or name does not open. Values leave this module only towards a sandbox's
//! `/run/secrets/`; nothing here formats one, and [`Opened`] prints as `<redacted>`.

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Key, Nonce};

/// The environment variable that holds the store's key.
pub const KEY_ENV: &str = "ZYGO_SECRETS_KEY";

/// What to say about a key that is not one (never echoing what was given).
fn bad_key(why: &str) -> String {
    format!(
        "{KEY_ENV} is not a key: {why}. It must be exactly 32 random bytes written as 64 hex \
         digits; make one with `export {KEY_ENV}=$(zygo secrets keygen)` before the supervisor \
         starts. A passphrase is refused rather than stretched into a key: a weak passphrase \
         made into a key would protect the stored secrets less than it seems to"
    )
}

/// The store's key (a cipher ready to use). Its `Debug` shows nothing of it.
pub struct SealKey(ChaCha20Poly1305);

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(<redacted>)")
    }
}

/// The key from the environment's bytes: 64 hex digits (upper or lower case), nothing else.
pub fn parse_key(text: &[u8]) -> Result<SealKey, String> {
    if text.len() != 64 {
        return Err(bad_key(&format!(
            "it is {} bytes long, not 64 hex digits",
            text.len()
        )));
    }
    let bytes = from_hex(text).ok_or_else(|| bad_key("it is not all hex digits"))?;
    Ok(SealKey(ChaCha20Poly1305::new(Key::from_slice(&bytes))))
}

/// Take the key out of the environment: `Ok(None)` when it is not set (or empty), an error
/// saying why (never what) when it is not a key. The variable is removed either way.
pub fn key_from_env() -> Result<Option<SealKey>, String> {
    let v = std::env::var_os(KEY_ENV);
    scrub_env(KEY_ENV);
    std::env::remove_var(KEY_ENV);
    match v {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => parse_key(v.as_encoded_bytes()).map(Some),
    }
}

/// Overwrite the variable's value where the environment holds it (the block the process
/// started with is what `/proc/<pid>/environ` shows, and removing the variable leaves its
/// bytes there). Call before any thread is started.
fn scrub_env(name: &str) {
    let Ok(c) = std::ffi::CString::new(name) else {
        return;
    };
    // SAFETY: single-threaded (at start-up); getenv's pointer is to a NUL-terminated value
    // in this process's writable environment, overwritten within its length.
    unsafe {
        let p = libc::getenv(c.as_ptr());
        if !p.is_null() {
            let n = libc::strlen(p);
            for i in 0..n {
                std::ptr::write_volatile(p.add(i), b'0' as libc::c_char);
            }
        }
    }
}

fn from_hex(text: &[u8]) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    text.chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// What a value is bound to: its tenant and name.
fn associated(tenant: &str, name: &str) -> Vec<u8> {
    let mut ad = b"zygo-secret-v1\0".to_vec();
    ad.extend_from_slice(tenant.as_bytes());
    ad.push(0);
    ad.extend_from_slice(name.as_bytes());
    ad
}

/// A sealed value: (nonce, ciphertext with tag), both lowercase hex.
pub fn seal(
    key: &SealKey,
    tenant: &str,
    name: &str,
    value: &[u8],
) -> Result<(String, String), String> {
    let nonce_hex = plumbing::random_hex(12).map_err(|e| e.to_string())?;
    let nonce_bytes = from_hex(nonce_hex.as_bytes()).ok_or("a nonce that is not hex")?;
    let ad = associated(tenant, name);
    let sealed = key
        .0
        .encrypt(
            Nonce::from_slice(&nonce_bytes),
            Payload {
                msg: value,
                aad: &ad,
            },
        )
        .map_err(|_| "the value could not be sealed".to_string())?;
    Ok((nonce_hex, to_hex(&sealed)))
}

/// A value just opened, on its way to a sandbox. Prints as `<redacted>`.
#[derive(Clone, PartialEq, Eq)]
pub struct Opened(pub Vec<u8>);

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// Open a sealed value stored as `tenant`'s `name`. An error (which never carries any of
/// the value) when the key is another, the record was altered, or it was sealed for
/// another tenant or name.
pub fn open(
    key: &SealKey,
    tenant: &str,
    name: &str,
    nonce: &str,
    sealed: &str,
) -> Result<Opened, String> {
    let cannot = || {
        format!(
            "secret {name} of tenant {tenant} cannot be opened: it was sealed under another \
             key, altered, or moved from another tenant or name; set it again"
        )
    };
    let nonce = from_hex(nonce.as_bytes())
        .filter(|n| n.len() == 12)
        .ok_or_else(cannot)?;
    let sealed = from_hex(sealed.as_bytes()).ok_or_else(cannot)?;
    let ad = associated(tenant, name);
    key.0
        .decrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &sealed,
                aad: &ad,
            },
        )
        .map(Opened)
        .map_err(|_| cannot())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SealKey {
        parse_key(plumbing::random_hex(32).expect("random").as_bytes()).expect("key")
    }

    #[test]
    fn a_value_opens_only_as_its_own_tenant_and_name_under_its_own_key() {
        let k = key();
        let (n, s) = seal(&k, "acme", "STRIPE_KEY", b"sk_live_1").expect("seal");
        assert!(!s.contains(&to_hex(b"sk_live_1")));
        assert_eq!(
            open(&k, "acme", "STRIPE_KEY", &n, &s).expect("open").0,
            b"sk_live_1"
        );
        assert!(open(&k, "globex", "STRIPE_KEY", &n, &s).is_err());
        assert!(open(&k, "acme", "OTHER", &n, &s).is_err());
        assert!(open(&key(), "acme", "STRIPE_KEY", &n, &s).is_err());
        // A fresh nonce each time: the same value seals differently.
        let (n2, s2) = seal(&k, "acme", "STRIPE_KEY", b"sk_live_1").expect("seal");
        assert!(n != n2 && s != s2);
        let mut bad = s.clone().into_bytes();
        bad[0] = if bad[0] == b'0' { b'1' } else { b'0' };
        let bad = String::from_utf8(bad).expect("hex");
        assert!(open(&k, "acme", "STRIPE_KEY", &n, &bad).is_err());
    }

    #[test]
    fn only_64_hex_digits_are_a_key_and_the_refusal_never_echoes_it() {
        assert!(parse_key(&[b'A'; 64]).is_ok());
        for bad in [
            &b"hunter2"[..],
            &b"correct horse battery staple correct horse battery staple 123456"[..],
            &[b'a'; 63][..],
            &[b'a'; 65][..],
            &[b'g'; 64][..],
        ] {
            let e = parse_key(bad).expect_err("not a key");
            assert!(
                e.contains("zygo secrets keygen") && e.contains("passphrase"),
                "{e}"
            );
            assert!(!e.contains("hunter2") && !e.contains("horse"), "{e}");
        }
        assert_eq!(format!("{:?}", key()), "SealKey(<redacted>)");
        assert_eq!(format!("{:?}", Opened(b"x".to_vec())), "<redacted>");
    }
}
