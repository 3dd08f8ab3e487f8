//! The one error type of this crate. Every message names the field and the bad value,
//! and says what would be accepted, so a user can fix it without reading the source.

use std::fmt;
use std::path::PathBuf;

/// Everything `policy` can refuse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A value that does not parse, or is out of range.
    #[error("{field}: {value} {reason}")]
    Invalid {
        field: String,
        value: Shown,
        reason: String,
    },
    /// A well-formed value that is not allowed from where it came (e.g. `unlimited` from the CLI).
    #[error("{field}: {value} {reason}")]
    NotAllowed {
        field: String,
        value: Shown,
        reason: String,
    },
    /// A request for more than a ceiling allows. Limits only narrow.
    #[error("{key} = {value} is above the ceiling of {ceiling}; ask for {ceiling} or less")]
    AboveCeiling {
        key: &'static str,
        value: String,
        ceiling: String,
    },
    /// A key sandbox.toml (or a layer) does not know.
    #[error("unknown key {key} in {table}{}; known keys: {known}", at_line(*.line))]
    UnknownKey {
        key: Shown,
        table: String,
        line: Option<usize>,
        known: &'static str,
    },
    /// A key whose value has the wrong TOML type. `field` names the key, table and line.
    #[error("{field} must be {expected}, not {found}")]
    WrongType {
        field: String,
        expected: &'static str,
        found: &'static str,
    },
    /// The TOML itself does not parse.
    #[error("TOML syntax error{}: {message}", at_line(*.line))]
    Syntax {
        line: Option<usize>,
        message: String,
    },
    /// A whole-spec rule a function breaks (agent and cmd both set, min_warm > max_warm, ...).
    #[error("[{table}]: {reason}")]
    Spec { table: String, reason: String },
    /// Input over one of the size caps.
    #[error("{what} is too large: the limit is {limit}")]
    TooLarge { what: String, limit: String },
    /// `zygo run` with nothing after `--`.
    #[error("no command given: zygo run [OPTIONS] -- CMD ARG...")]
    NoCommand,
    /// Any error found while reading a sandbox.toml, with the file's path in front.
    #[error("{}: {error}", .path.display())]
    InFile {
        path: PathBuf,
        error: Box<PolicyError>,
    },
}

impl PolicyError {
    /// The HTTP error code this maps to (`above_ceiling` or `bad_spec`).
    pub fn code(&self) -> &'static str {
        match self {
            PolicyError::AboveCeiling { .. } => "above_ceiling",
            PolicyError::InFile { error, .. } => error.code(),
            _ => "bad_spec",
        }
    }

    /// The error without any `InFile` wrapper.
    pub fn innermost(&self) -> &PolicyError {
        match self {
            PolicyError::InFile { error, .. } => error.innermost(),
            other => other,
        }
    }

    pub(crate) fn invalid(field: &str, value: &str, reason: impl Into<String>) -> Self {
        PolicyError::Invalid {
            field: field.to_owned(),
            value: Shown::new(value),
            reason: reason.into(),
        }
    }

    pub(crate) fn not_allowed(field: &str, value: &str, reason: impl Into<String>) -> Self {
        PolicyError::NotAllowed {
            field: field.to_owned(),
            value: Shown::new(value),
            reason: reason.into(),
        }
    }
}

/// A user-supplied string as it appears in an error: quoted, control characters escaped,
/// cut to 80 characters so hostile input cannot make the message huge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(String);

impl Shown {
    const MAX_CHARS: usize = 80;

    pub fn new(s: &str) -> Self {
        let mut out: String = s.chars().take(Self::MAX_CHARS).collect();
        if s.chars().nth(Self::MAX_CHARS).is_some() {
            out.push('…');
        }
        Shown(out)
    }

    /// The (possibly cut) text, escaped but unquoted, for use inside a field name.
    pub fn bare(&self) -> String {
        self.0.escape_debug().to_string()
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "\"{}\"", self.0.escape_debug())
    }
}

fn at_line(line: Option<usize>) -> String {
    match line {
        Some(n) => format!(" (line {n})"),
        None => String::new(),
    }
}

/// 1-based line number of a byte offset into `text`.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let upto = text.as_bytes().get(..offset).unwrap_or(text.as_bytes());
    upto.iter().filter(|&&b| b == b'\n').count() + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shown_quotes_escapes_and_cuts() {
        assert_eq!(Shown::new("a\nb").to_string(), "\"a\\nb\"");
        let long = "x".repeat(10_000);
        let shown = Shown::new(&long).to_string();
        assert!(shown.len() < 100, "{shown}");
        assert!(shown.ends_with("…\""));
        assert_eq!(Shown::new("\u{1b}[31m").bare(), "\\u{1b}[31m");
    }

    #[test]
    fn line_numbers() {
        let t = "a\nb\nc";
        assert_eq!(line_of(t, 0), 1);
        assert_eq!(line_of(t, 2), 2);
        assert_eq!(line_of(t, 4), 3);
        assert_eq!(line_of(t, 999), 3);
    }

    #[test]
    fn codes() {
        let e = PolicyError::AboveCeiling {
            key: "mem",
            value: "1G".into(),
            ceiling: "256M".into(),
        };
        assert_eq!(e.code(), "above_ceiling");
        let wrapped = PolicyError::InFile {
            path: "x.toml".into(),
            error: Box::new(e),
        };
        assert_eq!(wrapped.code(), "above_ceiling");
        assert_eq!(PolicyError::NoCommand.code(), "bad_spec");
    }
}
