//! Connect deadlines: a client names how long it will wait for a call in
//! `Connect-Timeout-Ms` (at most 10 digits, per the Connect protocol), and
//! the server ends the call with `deadline_exceeded` once that time is up.
//!
//! The SDKs send it on every envd call: a unary call gets its request
//! timeout, a `commands.run(…, timeout=N)` its `N` seconds (60 by default)
//! on the `Start` stream. As envd does, 0 means no deadline, and at the
//! deadline of a `Start` stream the process itself is killed
//! (`process::render`), while the deadline of a `Connect` or `WatchDir`
//! stream ends only the stream.

use std::future::Future;
use std::time::Duration;

use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;

use super::connect::{self, Code, ConnectError};

const HEADER: &str = "connect-timeout-ms";

/// The deadline a request names, from now.
pub(crate) fn of(h: &HeaderMap) -> Result<Option<Instant>, ConnectError> {
    let Some(v) = h.get(HEADER) else {
        return Ok(None);
    };
    let ms = v
        .to_str()
        .ok()
        .filter(|s| !s.is_empty() && s.len() <= 10 && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(|| {
            ConnectError::invalid(format!(
                "Connect-Timeout-Ms must be a whole number of milliseconds (1 to 10 digits), \
                 not {:?}",
                String::from_utf8_lossy(v.as_bytes())
            ))
        })?;
    Ok((ms > 0).then(|| Instant::now() + Duration::from_millis(ms)))
}

/// The error of a call whose deadline passed.
pub(crate) fn exceeded() -> ConnectError {
    ConnectError::new(
        Code::DeadlineExceeded,
        "the deadline the client set (Connect-Timeout-Ms) was exceeded",
    )
}

/// Wait until the deadline; forever when there is none (for `select!`).
pub(crate) async fn reached(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// Run a call's handler within its deadline; past it, answer
/// `deadline_exceeded` (in a stream's framing when `stream`). The handler's
/// future is dropped there, which abandons the agent request it waits on.
pub(crate) async fn unary(
    deadline: Option<Instant>,
    answer: impl Future<Output = Response>,
    stream: bool,
) -> Response {
    let Some(d) = deadline else {
        return answer.await;
    };
    match tokio::time::timeout_at(d, answer).await {
        Ok(r) => r,
        Err(_) if stream => connect::stream_error(exceeded()),
        Err(_) => exceeded().into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(HEADER, v.parse().unwrap());
        h
    }

    #[tokio::test]
    async fn header_values() {
        assert_eq!(of(&HeaderMap::new()).unwrap(), None);
        assert_eq!(of(&h("0")).unwrap(), None);
        let d = of(&h("2000")).unwrap().unwrap();
        let left = d - Instant::now();
        assert!(left <= Duration::from_secs(2) && left > Duration::from_millis(1900));
        for bad in ["", "-1", "1.5", "12345678901", "soon"] {
            let e = of(&h(bad)).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{bad:?}");
        }
    }

    #[tokio::test]
    async fn a_late_call_is_deadline_exceeded() {
        let d = Some(Instant::now() + Duration::from_millis(50));
        let slow = async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            axum::http::StatusCode::OK.into_response()
        };
        let r = unary(d, slow, false).await;
        assert_eq!(r.status(), Code::DeadlineExceeded.http_status());
    }
}
