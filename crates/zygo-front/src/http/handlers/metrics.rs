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
    // Counted above already: written as any answer, at the pace the client must keep.
    let ctype = "text/plain; version=0.0.4; charset=utf-8";
    let extra = [("Cache-Control", "no-store")];
    let page = vec![page.into_bytes()];
    let pace = crate::http::answer::Pace::Answer;
    crate::http::write_answer(rq, 200, ctype, page, &call.id, None, &extra, false, pace);
    Out::Done
}
