//! `POST /run`: a one-shot sandbox. 200 whenever the sandbox was attempted, whatever ended
//! it; 408 `api_timeout` only when the caller's deadline (`X-Zygo-Timeout-Ms`) fires
//! first, and then the run is cancelled (its channel is closed, which the supervisor takes
//! as the end of everything the channel started).

use std::time::{Duration, Instant};

use proto::front::{ErrorCode, Reply, Request};
use serde_json::json;

use super::unexpected;
use crate::http::channel::ChanError;
use crate::http::{ok, Call, Front, HttpError, Out};

pub fn run(front: &Front, call: &mut Call) -> Out {
    let parsed = (|| -> Result<_, HttpError> {
        call.only_query(&[])?;
        let mut spec = crate::http::bodies::run::parse(&call.body()?)
            .map_err(|m| HttpError::from_code(ErrorCode::BadSpec, m, None))?;
        if spec.key.is_some() {
            return Err(HttpError::bad_request(
                "key is not a field of the body: send X-Zygo-Request-Key",
            ));
        }
        // A key the run can be cancelled by when the caller's deadline passes: the
        // caller's own, or one made for it.
        let key = match &call.key {
            Some(k) => k.clone(),
            None => format!("zygo-api-{}", crate::http::new_request_id()),
        };
        spec.key = Some(key.clone());
        Ok((spec, key))
    })();
    let (spec, key) = match parsed {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    let req = call.api(Request::Run { spec });
    let Some(mut lease) = front.chans.acquire(call.deadline) else {
        return HttpError::new(
            408,
            "api_timeout",
            "the deadline passed before the run could be sent",
        )
        .into();
    };
    match lease.call(&req, call.deadline, |_| {}) {
        Ok(Reply::RunAnswer(a)) => ok({
            crate::delivery::usage(&a.usage);
            json!({
            "request_id": a.request_id,
            "exit_code": a.exit_code,
            "signal": a.signal,
            "timed_out": a.timed_out,
            "oom_killed": a.oom_killed,
            "peak_rss_kb": a.peak_rss_kb,
            "wall_ms": proto::front::ms(a.wall_us),
            "cpu_ms": proto::front::ms(a.cpu_us),
            "stdout": a.stdout,
            "stderr": a.stderr,
            "stdout_truncated": a.stdout_truncated,
            "stderr_truncated": a.stderr_truncated,
            "started": a.started,
            "phase": a.phase,
            "error": a.error,
            })
        }),
        Ok(Reply::Error {
            code,
            message,
            retry_after,
        }) => HttpError::from_code(code, message, retry_after).into(),
        Ok(r) => unexpected(&r).into(),
        Err(ChanError::Timeout) => {
            // Answer first; then cancel the run by its key (the supervisor answers the
            // run itself on its channel, which is read in the background and lent again).
            let e = HttpError::new(
                408,
                "api_timeout",
                format!(
                    "X-Zygo-Timeout-Ms ({} ms) passed before the run ended; it is being cancelled and what it would have answered is unknown",
                    call.timeout_ms
                ),
            );
            if let Some(rq) = call.rq.take() {
                crate::http::respond_json(rq, 408, &e.body(), &call.id, None, &[], false);
            }
            drop(lease);
            let cancel = call.api(Request::Cancel { key });
            let until = Instant::now() + Duration::from_secs(10);
            match front.chans.acquire(until) {
                Some(mut l) => {
                    if let Err(e) = l.call(&cancel, until, |_| {}) {
                        log::warn!("cancel a run past its caller's deadline: {e:?}");
                    }
                }
                None => log::warn!("cancel a run past its caller's deadline: no channel free"),
            }
            Out::Done
        }
        Err(ChanError::Broken(e)) => {
            HttpError::unavailable(format!("lost the supervisor's answer: {e}")).into()
        }
    }
}
