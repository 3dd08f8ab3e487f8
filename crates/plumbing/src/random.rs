//! Random names: ids for requests, zygotes and scratch folders, from the kernel's random
//! source. There is no fallback: a name that could be guessed or repeated is worse than an
//! error the caller reports.

use std::io;

/// `bytes` random bytes from the kernel (`getrandom`), in lowercase hex. An error when the
/// kernel cannot give them.
pub fn random_hex(bytes: usize) -> io::Result<String> {
    let mut b = vec![0u8; bytes];
    let mut got = 0;
    while got < b.len() {
        // SAFETY: filling our own buffer, within its bounds, from the kernel's random source.
        let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
        if n > 0 {
            got += n as usize;
            continue;
        }
        let e = io::Error::last_os_error();
        if n < 0 && e.kind() == io::ErrorKind::Interrupted {
            continue;
        }
        return Err(io::Error::new(
            e.kind(),
            format!("read random bytes from the kernel (getrandom): {e}"),
        ));
    }
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_of_the_asked_length_and_not_repeated() {
        let a = random_hex(16).expect("random");
        let b = random_hex(16).expect("random");
        assert_eq!(a.len(), 32);
        assert!(a
            .bytes()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        assert_ne!(a, b);
        assert_eq!(random_hex(0).expect("random"), "");
    }
}
