//! `GET /metrics`: see [`crate::http::metrics`].

use proto::front::{Reply, Request};

use super::{ask, unexpected};
use crate::http::{metrics, Call, Front, Out};

pub fn metrics(front: &Front, call: &mut Call) -> Out {
    if let Err(e) = call.only_query(&[]) {
        return e.into();
    }
    let (fns, process_counts) = match ask(front, call, Request::Metrics) {
        Ok(Reply::Metrics {
            functions,
            process_counts,
        }) => (functions, process_counts),
        Ok(r) => return unexpected(&r).into(),
        Err(e) => return e.into(),
    };
    // This answer counts itself, before the page is made, so the page includes it.
    metrics::count(200);
    // The process's counts are every caller's traffic: only for deploy rights.
    let counts = process_counts.then(metrics::api_counts);
    let page = metrics::render(counts, &fns);
    let Some(rq) = call.rq.take() else {
        return Out::Done;
    };
    let mut r = tiny_http::Response::from_data(page.into_bytes()).with_status_code(200);
    for (k, v) in [
        ("Content-Type", "text/plain; version=0.0.4; charset=utf-8"),
        ("X-Zygo-Request-Id", call.id.as_str()),
        ("Cache-Control", "no-store"),
    ] {
        if let Ok(h) = tiny_http::Header::from_bytes(k.as_bytes(), v.as_bytes()) {
            r.add_header(h);
        }
    }
    if let Err(e) = rq.respond(r) {
        log::debug!("write /metrics: {e}");
    }
    Out::Done
}
