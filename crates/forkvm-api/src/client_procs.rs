//! The client's process operations: start, list, attach (an NDJSON
//! stream), stdin, signals, kill and PTY resize.

use bytes::Bytes;
use hyper::Method;

use crate::client::{enc, read_ndjson, Client, ClientError};
use crate::processes::*;

fn stream_error(e: &crate::ErrorDetail) -> ClientError {
    ClientError::from_detail(e.clone())
}

impl Client {
    fn proc_path(id: &str, process: &str, rest: &str) -> String {
        format!("/v1/sandboxes/{}/processes/{}{rest}", enc(id), enc(process))
    }

    /// Start a background process; returns at once with its pid.
    pub async fn start_process(
        &self,
        id: &str,
        req: &StartProcess,
    ) -> Result<ProcessStarted, ClientError> {
        let mut req = req.clone();
        req.stream = false;
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/processes", enc(id)),
            Some(&req),
        )
        .await
    }

    /// Start a process and follow its events (`stream: true`); see
    /// [`Client::attach_process`] for `on_event`.
    pub async fn start_process_stream(
        &self,
        id: &str,
        req: &StartProcess,
        on_event: impl FnMut(&ProcessEvent) -> bool,
    ) -> Result<Option<ProcessEvent>, ClientError> {
        let mut req = req.clone();
        req.stream = true;
        let body =
            Bytes::from(serde_json::to_vec(&req).map_err(|e| ClientError::Decode(e.to_string()))?);
        let path = format!("/v1/sandboxes/{}/processes", enc(id));
        let resp = self
            .open_timed(Method::POST, &path, Some((body, "application/json")))
            .await?;
        follow(resp, on_event).await
    }

    /// The running background processes.
    pub async fn list_processes(&self, id: &str) -> Result<ProcessList, ClientError> {
        self.json(
            Method::GET,
            &format!("/v1/sandboxes/{}/processes", enc(id)),
            None::<&()>,
        )
        .await
    }

    /// Attach to a process (`process`: pid or tag): `on_event` sees the
    /// kept output, then live events, and returns false to stop following.
    /// Returns the `end` event when the process ended, `None` when
    /// `on_event` stopped first. An `error` line is [`ClientError::Api`].
    pub async fn attach_process(
        &self,
        id: &str,
        process: &str,
        on_event: impl FnMut(&ProcessEvent) -> bool,
    ) -> Result<Option<ProcessEvent>, ClientError> {
        let resp = self
            .open_timed(Method::GET, &Self::proc_path(id, process, "/output"), None)
            .await?;
        follow(resp, on_event).await
    }

    /// Write bytes to a process's stdin (or its PTY).
    pub async fn write_stdin(
        &self,
        id: &str,
        process: &str,
        data: Bytes,
    ) -> Result<(), ClientError> {
        self.call(
            Method::POST,
            &Self::proc_path(id, process, "/stdin"),
            Some((data, "application/octet-stream")),
        )
        .await
        .map(drop)
    }

    /// Close a process's stdin.
    pub async fn close_stdin(&self, id: &str, process: &str) -> Result<(), ClientError> {
        self.call(
            Method::DELETE,
            &Self::proc_path(id, process, "/stdin"),
            None,
        )
        .await
        .map(drop)
    }

    /// Send signal number `signal` to a process's group.
    pub async fn signal_process(
        &self,
        id: &str,
        process: &str,
        signal: i32,
    ) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&SignalProcess { signal })
            .map_err(|e| ClientError::Decode(e.to_string()))?;
        self.call(
            Method::POST,
            &Self::proc_path(id, process, "/signal"),
            Some((Bytes::from(body), "application/json")),
        )
        .await
        .map(drop)
    }

    /// Kill a process (SIGKILL to its group).
    pub async fn kill_process(&self, id: &str, process: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &Self::proc_path(id, process, ""), None)
            .await
            .map(drop)
    }

    /// Resize a process's PTY.
    pub async fn resize_pty(
        &self,
        id: &str,
        process: &str,
        size: PtySize,
    ) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&size).map_err(|e| ClientError::Decode(e.to_string()))?;
        self.call(
            Method::PUT,
            &Self::proc_path(id, process, "/pty"),
            Some((Bytes::from(body), "application/json")),
        )
        .await
        .map(drop)
    }
}

/// Read a process stream until its `end`, an `error`, or `on_event` says
/// stop.
async fn follow(
    resp: hyper::Response<hyper::body::Incoming>,
    mut on_event: impl FnMut(&ProcessEvent) -> bool,
) -> Result<Option<ProcessEvent>, ClientError> {
    read_ndjson(resp, "process", |ev: ProcessEvent| {
        let go_on = on_event(&ev);
        match ev {
            ProcessEvent::End { .. } => Some(Ok(Some(ev))),
            ProcessEvent::Error { error } => Some(Err(stream_error(&error))),
            _ if !go_on => Some(Ok(None)),
            _ => None,
        }
    })
    .await
}
