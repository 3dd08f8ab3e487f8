//! The numbers pushed over OTLP/HTTP (JSON encoding of `ExportMetricsServiceRequest`):
//! the `/metrics` series this process can count (its own requests and errors; per
//! function: requests, failures, the highest peak memory of a call) plus per tenant:
//! requests, outcomes, CPU and wall time. Every sum is cumulative and monotonic from this
//! process's start, so a push that is lost costs nothing: the next one carries it.

use std::collections::BTreeMap;

use proto::api::UsageRecord;
use serde_json::{json, Value};

#[derive(Default, Clone)]
struct Fn {
    requests: u64,
    failures: u64,
    peak_rss_kb: u64,
}

#[derive(Default, Clone)]
struct Tenant {
    requests: u64,
    outcomes: BTreeMap<String, u64>,
    /// Microseconds; pushed as fractional milliseconds.
    cpu_us: u64,
    wall_us: u64,
}

/// What this process has counted since it started.
#[derive(Default)]
pub struct Numbers {
    pub api_requests: u64,
    pub api_errors: u64,
    fns: BTreeMap<String, Fn>,
    tenants: BTreeMap<String, Tenant>,
    /// When counting began (ms since the epoch).
    pub start_ms: u64,
}

impl Numbers {
    pub fn starting(start_ms: u64) -> Numbers {
        Numbers {
            start_ms,
            ..Numbers::default()
        }
    }

    pub fn add(&mut self, r: &UsageRecord) {
        let f = self.fns.entry(r.function.clone()).or_default();
        f.requests += 1;
        if r.outcome != "ok" {
            f.failures += 1;
        }
        f.peak_rss_kb = f.peak_rss_kb.max(r.peak_rss_kb);
        let t = self.tenants.entry(r.tenant.clone()).or_default();
        t.requests += 1;
        *t.outcomes.entry(r.outcome.clone()).or_default() += 1;
        t.cpu_us = t.cpu_us.saturating_add(r.cpu_us);
        t.wall_us = t.wall_us.saturating_add(r.wall_us);
    }

    /// The OTLP/HTTP JSON body for now (`now_ms`).
    pub fn export(&self, now_ms: u64) -> Value {
        let start = (self.start_ms * 1_000_000).to_string();
        let now = (now_ms * 1_000_000).to_string();
        let attrs = |kv: &[(&str, &str)]| -> Value {
            kv.iter()
                .map(|(k, v)| json!({"key": k, "value": {"stringValue": v}}))
                .collect()
        };
        let point = |a: Value, v: u64| json!({"attributes": a, "startTimeUnixNano": start, "timeUnixNano": now, "asInt": v.to_string()});
        let sum = |name: &str, unit: &str, desc: &str, points: Vec<Value>| {
            json!({"name": name, "unit": unit, "description": desc,
                   "sum": {"dataPoints": points, "aggregationTemporality": 2, "isMonotonic": true}})
        };
        let gauge = |name: &str, unit: &str, desc: &str, points: Vec<Value>| json!({"name": name, "unit": unit, "description": desc, "gauge": {"dataPoints": points}});
        let by_fn = |f: fn(&Fn) -> u64| -> Vec<Value> {
            self.fns
                .iter()
                .map(|(n, x)| point(attrs(&[("function", n)]), f(x)))
                .collect()
        };
        let by_tenant = |f: fn(&Tenant) -> u64| -> Vec<Value> {
            self.tenants
                .iter()
                .map(|(n, x)| point(attrs(&[("tenant", n)]), f(x)))
                .collect()
        };
        // Times: microseconds counted, fractional milliseconds pushed (as every answer
        // shows them).
        let ms_by_tenant = |f: fn(&Tenant) -> u64| -> Vec<Value> {
            self.tenants
                .iter()
                .map(|(n, x)| {
                    json!({"attributes": attrs(&[("tenant", n)]), "startTimeUnixNano": start,
                           "timeUnixNano": now, "asDouble": proto::front::ms(f(x))})
                })
                .collect()
        };
        let outcomes: Vec<Value> = self
            .tenants
            .iter()
            .flat_map(|(n, t)| {
                t.outcomes
                    .iter()
                    .map(|(o, c)| point(attrs(&[("tenant", n), ("outcome", o)]), *c))
                    .collect::<Vec<_>>()
            })
            .collect();
        let metrics = vec![
            sum(
                "zygo_api_requests_total",
                "1",
                "Requests answered by this zygo api process.",
                vec![point(json!([]), self.api_requests)],
            ),
            sum(
                "zygo_api_errors_total",
                "1",
                "Requests answered with a status of 400 or more.",
                vec![point(json!([]), self.api_errors)],
            ),
            sum(
                "zygo_function_requests_total",
                "1",
                "Finished calls, by function.",
                by_fn(|f| f.requests),
            ),
            sum(
                "zygo_function_failures_total",
                "1",
                "Finished calls that did not end ok, by function.",
                by_fn(|f| f.failures),
            ),
            gauge(
                "zygo_function_rss_bytes",
                "By",
                "The highest peak memory of one call, by function.",
                by_fn(|f| f.peak_rss_kb.saturating_mul(1024)),
            ),
            sum(
                "zygo_tenant_requests_total",
                "1",
                "Finished calls, by tenant.",
                by_tenant(|t| t.requests),
            ),
            sum(
                "zygo_tenant_outcomes_total",
                "1",
                "Finished calls, by tenant and outcome.",
                outcomes,
            ),
            sum(
                "zygo_tenant_cpu_ms_total",
                "ms",
                "CPU time of finished calls, by tenant.",
                ms_by_tenant(|t| t.cpu_us),
            ),
            sum(
                "zygo_tenant_wall_ms_total",
                "ms",
                "Wall time of finished calls, by tenant.",
                ms_by_tenant(|t| t.wall_us),
            ),
        ];
        json!({"resourceMetrics": [{
            "resource": {"attributes": attrs(&[("service.name", "zygo-api")])},
            "scopeMetrics": [{"scope": {"name": "zygo", "version": env!("CARGO_PKG_VERSION")}, "metrics": metrics}],
        }]})
    }
}

#[allow(clippy::unwrap_used)]
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_tenant_numbers_add_up() {
        let mut n = Numbers::default();
        for (t, o) in [("a", "ok"), ("a", "error"), ("b", "ok")] {
            n.add(&UsageRecord {
                tenant: t.into(),
                function: "f".into(),
                script: None,
                request_id: "r".into(),
                wall_us: 10_000,
                cpu_us: 3_250,
                peak_rss_kb: 5,
                outcome: o.into(),
                finished_ms: 1,
            });
        }
        let v = n.export(2);
        let ms = &v["resourceMetrics"][0]["scopeMetrics"][0]["metrics"];
        let find = |name: &str| {
            ms.as_array()
                .unwrap()
                .iter()
                .find(|m| m["name"] == name)
                .unwrap()
                .clone()
        };
        assert_eq!(
            find("zygo_function_failures_total")["sum"]["dataPoints"][0]["asInt"],
            "1"
        );
        assert_eq!(
            find("zygo_tenant_cpu_ms_total")["sum"]["dataPoints"][0]["asDouble"],
            6.5
        );
        assert_eq!(
            find("zygo_tenant_outcomes_total")["sum"]["dataPoints"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
    }
}
