//! MCP protocol revisions, and how one is chosen.
//!
//! Two eras:
//! - **handshake** (2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25): the client opens with
//!   `initialize`; the revision it names is answered as is when this server speaks it, else
//!   with the preferred one (2025-06-18), never with one newer than the client asked for;
//!   every later request without a revision of its own is served under that answer.
//! - **stateless** (2026-07-28): no handshake; every request names its revision and the
//!   client's capabilities in `params._meta`, and `server/discover` describes the server.
//!
//! A request carrying the stateless claim (`io.modelcontextprotocol/protocolVersion` in its
//! `_meta`) is served statelessly whatever came before it on the connection; the spec lets a
//! dual-era server serve both eras on one connection.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rev {
    V2024_11_05,
    V2025_03_26,
    V2025_06_18,
    V2025_11_25,
    V2026_07_28,
}

/// The revision answered to an `initialize` naming one this server does not speak.
pub const PREFERRED: Rev = Rev::V2025_06_18;

/// Revisions reached through `initialize`, oldest first.
pub const HANDSHAKE: [Rev; 4] = [
    Rev::V2024_11_05,
    Rev::V2025_03_26,
    Rev::V2025_06_18,
    Rev::V2025_11_25,
];

/// Revisions spoken without a handshake.
pub const STATELESS: [Rev; 1] = [Rev::V2026_07_28];

impl Rev {
    pub fn as_str(self) -> &'static str {
        match self {
            Rev::V2024_11_05 => "2024-11-05",
            Rev::V2025_03_26 => "2025-03-26",
            Rev::V2025_06_18 => "2025-06-18",
            Rev::V2025_11_25 => "2025-11-25",
            Rev::V2026_07_28 => "2026-07-28",
        }
    }

    pub fn parse(s: &str) -> Option<Rev> {
        HANDSHAKE
            .iter()
            .chain(STATELESS.iter())
            .copied()
            .find(|r| r.as_str() == s)
    }

    /// Stateless: per-request `_meta`, `resultType`, cache hints, `server/discover`.
    pub fn is_stateless(self) -> bool {
        self >= Rev::V2026_07_28
    }

    /// Tool annotations (`readOnlyHint`, ...).
    pub fn has_annotations(self) -> bool {
        self >= Rev::V2025_03_26
    }

    /// `outputSchema`, `structuredContent`, and `title` on tools and the server's identity.
    pub fn has_structured_output(self) -> bool {
        self >= Rev::V2025_06_18
    }

    /// Only 2025-03-26 has JSON-RPC batches; 2025-06-18 removed them again.
    pub fn allows_batches(self) -> bool {
        self == Rev::V2025_03_26
    }

    /// From 2025-11-25 on, arguments that do not fit a tool's input schema are a tool error
    /// (`isError`, so the model can correct itself), not a protocol error (SEP-1303).
    pub fn argument_errors_are_tool_errors(self) -> bool {
        self >= Rev::V2025_11_25
    }

    /// `ping` was removed in 2026-07-28.
    pub fn has_ping(self) -> bool {
        !self.is_stateless()
    }
}

impl fmt::Display for Rev {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `YYYY-MM-DD`, the shape every revision so far has had (compared as text).
fn is_date(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 10
        && b.iter().enumerate().all(|(i, c)| match i {
            4 | 7 => *c == b'-',
            _ => c.is_ascii_digit(),
        })
}

/// The revision to answer an `initialize` that asked for `requested`, or None when every
/// revision this server speaks is newer than the one asked for.
///
/// - a handshake revision this server speaks: that one;
/// - a later one (or one not shaped like a date): the preferred 2025-06-18, which is older
///   than what was asked;
/// - one between two of ours: the newest of ours that is not newer than it;
/// - one older than all of ours: none (the caller refuses with the list).
pub fn negotiate(requested: &str) -> Option<Rev> {
    if let Some(r) = HANDSHAKE.iter().copied().find(|r| r.as_str() == requested) {
        return Some(r);
    }
    if !is_date(requested) || requested > PREFERRED.as_str() {
        return Some(PREFERRED);
    }
    HANDSHAKE
        .iter()
        .rev()
        .copied()
        .find(|r| r.as_str() <= requested)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        for r in HANDSHAKE {
            assert_eq!(negotiate(r.as_str()), Some(r));
        }
        // Newer than ours, or the stateless revision through a handshake: the preferred one.
        assert_eq!(negotiate("2026-07-28"), Some(Rev::V2025_06_18));
        assert_eq!(negotiate("2099-01-01"), Some(Rev::V2025_06_18));
        assert_eq!(negotiate("draft"), Some(Rev::V2025_06_18));
        // Between two of ours: never answer newer than asked.
        assert_eq!(negotiate("2025-05-01"), Some(Rev::V2025_03_26));
        assert_eq!(negotiate("2025-01-01"), Some(Rev::V2024_11_05));
        // Older than all of ours.
        assert_eq!(negotiate("2024-10-07"), None);
        for asked in [
            "2024-11-05",
            "2025-05-01",
            "2025-09-09",
            "2026-07-28",
            "2030-01-01",
        ] {
            let got = negotiate(asked).map(Rev::as_str).unwrap_or("");
            assert!(got <= asked, "answered {got} to {asked}");
        }
    }

    #[test]
    fn features() {
        assert!(Rev::V2025_03_26.allows_batches());
        for r in [
            Rev::V2024_11_05,
            Rev::V2025_06_18,
            Rev::V2025_11_25,
            Rev::V2026_07_28,
        ] {
            assert!(!r.allows_batches(), "{r}");
        }
        assert!(!Rev::V2025_03_26.has_structured_output());
        assert!(Rev::V2025_06_18.has_structured_output());
        assert!(Rev::V2026_07_28.is_stateless());
        assert!(!Rev::V2026_07_28.has_ping());
        assert_eq!(Rev::parse("2025-11-25"), Some(Rev::V2025_11_25));
        assert_eq!(Rev::parse("2025-11-26"), None);
    }
}
