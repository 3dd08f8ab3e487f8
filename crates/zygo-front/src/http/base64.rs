//! Standard base64 (RFC 4648 §4, `+` and `/`, padded), for workspace tars in JSON bodies
//! and answers. Decoding is strict: no whitespace, no other alphabet, padding exactly where
//! it belongs, and the unused bits of the last group zero, so one tar has one spelling.
//! A dozen lines do not earn a dependency.

const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

pub fn encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn value(c: u8) -> Option<u32> {
    Some(u32::from(match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => return None,
    }))
}

/// The bytes `text` spells, or why it is not standard padded base64.
pub fn decode(text: &str) -> Result<Vec<u8>, String> {
    let t = text.as_bytes();
    if !t.len().is_multiple_of(4) {
        return Err(format!(
            "its length ({}) is not a multiple of 4 (standard base64, padded with =)",
            t.len()
        ));
    }
    let mut out = Vec::with_capacity(t.len() / 4 * 3);
    let groups = t.len() / 4;
    for (g, quad) in t.chunks(4).enumerate() {
        let last = g + 1 == groups;
        let pad = quad.iter().rev().take_while(|&&c| c == b'=').count();
        if pad > 2 || (pad > 0 && !last) {
            return Err(format!("padding (=) inside the text, at byte {}", g * 4));
        }
        let mut n = 0u32;
        for (i, &c) in quad[..4 - pad].iter().enumerate() {
            let v =
                value(c).ok_or_else(|| format!("byte {} is not a base64 character", g * 4 + i))?;
            n |= v << (18 - 6 * i);
        }
        let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let keep = 3 - pad;
        if b[keep..].iter().any(|&x| x != 0) {
            return Err("the last group has bits set past the end of the data".into());
        }
        out.extend_from_slice(&b[..keep]);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_known_spellings() {
        for (raw, text) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"\xff\xfe\xfd", "//79"),
        ] {
            assert_eq!(encode(raw), text);
            assert_eq!(decode(text).as_deref(), Ok(raw));
        }
        let all: Vec<u8> = (0..=255).collect();
        assert_eq!(decode(&encode(&all)), Ok(all));
    }

    #[test]
    fn refuses_anything_not_strict() {
        for bad in [
            "Zg", "Zg=", "Z===", "Zg==Zg==", "Zm9v\n", " Zm9v", "Zm-v", "Zm_v", "Zh==", "Zm9=",
            "====", "Zg=a",
        ] {
            assert!(decode(bad).is_err(), "{bad:?}");
        }
    }
}
