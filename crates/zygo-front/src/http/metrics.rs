//! `GET /metrics`: the front's own counts and the supervisor's per-function numbers, in
//! the Prometheus text format (version 0.0.4).
//!
//! The front counts every answer it writes ([`count`]): `zygo_api_requests_total`, and
//! `zygo_api_errors_total` for those with a status of 400 or more (a streamed call by the
//! status its last line carries). The per-function series come from the supervisor, scoped
//! to the caller as `GET /fn` is.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use proto::front::FunctionMetrics;

static REQUESTS: AtomicU64 = AtomicU64::new(0);
static ERRORS: AtomicU64 = AtomicU64::new(0);

/// Count one answer with this status.
pub fn count(status: u16) {
    REQUESTS.fetch_add(1, Ordering::Relaxed);
    if status >= 400 {
        ERRORS.fetch_add(1, Ordering::Relaxed);
    }
}

/// (requests, errors) answered so far by this process.
pub fn api_counts() -> (u64, u64) {
    (
        REQUESTS.load(Ordering::Relaxed),
        ERRORS.load(Ordering::Relaxed),
    )
}

/// The states a function can be in; `zygo_function_state` has one series per state, 1
/// for the one it is in.
pub const STATES: &[&str] = &["starting", "serving", "failed"];

/// A label value, escaped as the text format wants: `\`, `"` and newlines.
pub fn escape_label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

/// The whole page: the API's own two series (when the caller may read them: `counts`),
/// then the functions'.
pub fn render(counts: Option<(u64, u64)>, fns: &[FunctionMetrics]) -> String {
    let mut out = String::new();
    if let Some((requests, errors)) = counts {
        family(
            &mut out,
            "zygo_api_requests_total",
            "counter",
            "Requests answered by this zygo api process.",
        );
        let _ = writeln!(out, "zygo_api_requests_total {requests}");
        family(
            &mut out,
            "zygo_api_errors_total",
            "counter",
            "Requests answered by this zygo api process with a status of 400 or more.",
        );
        let _ = writeln!(out, "zygo_api_errors_total {errors}");
    }
    let labels = |f: &FunctionMetrics| {
        format!(
            "function=\"{}\",kind=\"{}\"",
            escape_label(&f.name),
            escape_label(&f.kind)
        )
    };
    type Value = fn(&FunctionMetrics) -> u64;
    let series: [(&str, &str, &str, Value); 3] = [
        (
            "zygo_function_requests_total",
            "counter",
            "Finished calls of the function (a tenant's token: its own calls).",
            |f| f.requests,
        ),
        (
            "zygo_function_failures_total",
            "counter",
            "Finished calls of the function that did not end ok (error, timeout, cancelled, stuck).",
            |f| f.failures,
        ),
        (
            "zygo_function_rss_bytes",
            "gauge",
            "The highest peak resident memory of one call of the function, in bytes.",
            |f| f.rss_bytes,
        ),
    ];
    for (name, kind, help, value) in series {
        family(&mut out, name, kind, help);
        for f in fns {
            let _ = writeln!(out, "{name}{{{}}} {}", labels(f), value(f));
        }
    }
    family(
        &mut out,
        "zygo_function_state",
        "gauge",
        "The function's state: 1 on the series of the state it is in, 0 on the others.",
    );
    for f in fns {
        for s in STATES {
            let _ = writeln!(
                out,
                "zygo_function_state{{{},state=\"{s}\"}} {}",
                labels(f),
                u8::from(f.state == *s)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_are_escaped() {
        assert_eq!(escape_label(r#"a"b\c"#), r#"a\"b\\c"#);
        assert_eq!(escape_label("x\ny"), "x\\ny");
    }

    #[test]
    fn every_family_has_help_and_type_and_one_state_is_set() {
        let f = FunctionMetrics {
            name: "echo".into(),
            kind: "function".into(),
            requests: 3,
            failures: 1,
            rss_bytes: 4096,
            state: "serving".into(),
        };
        let without = render(None, std::slice::from_ref(&f));
        assert!(!without.contains("zygo_api_"), "{without}");
        let page = render(Some((7, 2)), &[f]);
        for name in [
            "zygo_api_requests_total",
            "zygo_api_errors_total",
            "zygo_function_requests_total",
            "zygo_function_failures_total",
            "zygo_function_rss_bytes",
            "zygo_function_state",
        ] {
            assert!(page.contains(&format!("# HELP {name} ")), "{name}");
            assert!(page.contains(&format!("# TYPE {name} ")), "{name}");
        }
        assert!(page.contains("zygo_api_requests_total 7\n"));
        assert!(
            page.contains("zygo_function_failures_total{function=\"echo\",kind=\"function\"} 1\n")
        );
        assert!(page.contains("state=\"serving\"} 1\n"));
        assert!(page.contains("state=\"failed\"} 0\n"));
    }
}
