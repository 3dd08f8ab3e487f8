//! MCP protocol revisions, and how one is chosen.
//!
//! Two eras:
//! - **handshake** (2024-11-05, 2025-03-26, 2025-06-18, 2025-11-25): the client opens with
//!   `initialize`; the revision it names is answered as is when this server speaks it, else
//!   with the preferred one (2025-06-18), whatever was asked (older, newer, between two of
//!   ours, or not a date): the MCP spec's rule, under which the client, not the server,
//!   decides whether it can speak the answer; every later request without a revision of
//!   its own is served under that answer.
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

/// The revision to answer an `initialize` that asked for `requested`: that one when this
/// server speaks it through a handshake, else the preferred one. The MCP spec: "If the
/// server supports the requested protocol version, it MUST respond with the same version.
/// Otherwise, the server MUST respond with another protocol version it supports. This
/// SHOULD be the latest version supported by the server" — here the preferred, which every
/// client SDK of its time speaks; a client that cannot speak it disconnects.
pub fn negotiate(requested: &str) -> Rev {
    HANDSHAKE
        .iter()
        .copied()
        .find(|r| r.as_str() == requested)
        .unwrap_or(PREFERRED)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation() {
        for r in HANDSHAKE {
            assert_eq!(negotiate(r.as_str()), r);
        }
        // Anything else, older, newer, between two of ours, the stateless revision through
        // a handshake, or not a date at all: the preferred one.
        for asked in [
            "2026-07-28",
            "2099-01-01",
            "draft",
            "",
            "2025-05-01",
            "2025-09-09",
            "2025-01-01",
            "2024-10-07",
            "1999-01-01",
        ] {
            assert_eq!(negotiate(asked), PREFERRED, "asked {asked:?}");
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
