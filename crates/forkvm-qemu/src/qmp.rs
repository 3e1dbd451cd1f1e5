//! An async client for the QEMU Machine Protocol (QMP).
//!
//! QMP is line-delimited JSON over a unix socket. After connecting, QEMU sends
//! a greeting (`{"QMP": {...}}`); the client must send `qmp_capabilities`
//! before any other command. Each command is `{"execute": name, "arguments":
//! {...}, "id": n}` and is answered by `{"return": ...}` or `{"error":
//! {"class", "desc"}}` echoing `id`. Asynchronous events
//! (`{"event": NAME, "data": {...}, "timestamp": {"seconds", "microseconds"}}`)
//! may arrive between replies.
//!
//! One reader task owns the read half: it routes replies to their waiting
//! caller by `id` and fans events out on a broadcast channel. Event timestamps
//! are QEMU's own clock, so durations computed from two events (for example
//! `STOP` → `RESUME`) measure what the VM saw, not our scheduling latency.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::unix::OwnedWriteHalf;
use tokio::net::UnixStream;
use tokio::sync::{broadcast, oneshot, watch};

/// Errors from the QMP client.
#[derive(Debug, thiserror::Error)]
pub enum QmpError {
    #[error("cannot connect to QMP socket {path}")]
    Connect {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("QMP handshake failed: {0}")]
    Handshake(String),
    #[error("QMP connection closed (QEMU exited?)")]
    Disconnected,
    #[error("QMP command {command} failed: {class}: {desc}")]
    Command {
        command: String,
        class: String,
        desc: String,
    },
    #[error("QMP command {0} timed out")]
    Timeout(String),
    #[error("QMP i/o error")]
    Io(#[from] std::io::Error),
}

/// An asynchronous QMP event.
#[derive(Debug, Clone)]
pub struct QmpEvent {
    pub name: String,
    pub data: Value,
    /// QEMU's timestamp of the event, in microseconds since the epoch.
    pub timestamp_us: u64,
}

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Result<Value, QmpError>>>>>;

/// A connected QMP session.
pub struct Qmp {
    writer: tokio::sync::Mutex<OwnedWriteHalf>,
    pending: Pending,
    next_id: AtomicU64,
    events: broadcast::Sender<QmpEvent>,
    closed: watch::Receiver<bool>,
}

impl Qmp {
    /// Connect to a QMP socket, retrying until it exists or `timeout` passes,
    /// and negotiate capabilities.
    pub async fn connect(path: &Path, timeout: Duration) -> Result<Arc<Qmp>, QmpError> {
        let deadline = tokio::time::Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(path).await {
                Ok(s) => {
                    crate::jail::check_peer(&s, path).map_err(|e| QmpError::Connect {
                        path: path.display().to_string(),
                        source: e,
                    })?;
                    break s;
                }
                Err(e) => {
                    if tokio::time::Instant::now() >= deadline {
                        return Err(QmpError::Connect {
                            path: path.display().to_string(),
                            source: e,
                        });
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        };
        let (read, write) = stream.into_split();
        let mut lines = BufReader::new(read).lines();
        let greeting = tokio::time::timeout(timeout, lines.next_line())
            .await
            .map_err(|_| QmpError::Handshake("no greeting from QEMU".into()))??
            .ok_or(QmpError::Disconnected)?;
        let g: Value = serde_json::from_str(&greeting)
            .map_err(|e| QmpError::Handshake(format!("bad greeting: {e}")))?;
        if g.get("QMP").is_none() {
            return Err(QmpError::Handshake(format!(
                "unexpected greeting {greeting}"
            )));
        }
        let pending: Pending = Arc::default();
        let (events, _) = broadcast::channel(256);
        let (closed_tx, closed) = watch::channel(false);
        let qmp = Arc::new(Qmp {
            writer: tokio::sync::Mutex::new(write),
            pending: pending.clone(),
            next_id: AtomicU64::new(1),
            events: events.clone(),
            closed,
        });
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                let Ok(v) = serde_json::from_str::<Value>(&line) else {
                    tracing::warn!("unparseable QMP line: {line}");
                    continue;
                };
                if let Some(name) = v.get("event").and_then(Value::as_str) {
                    let ts = &v["timestamp"];
                    let timestamp_us = ts["seconds"].as_u64().unwrap_or(0) * 1_000_000
                        + ts["microseconds"].as_u64().unwrap_or(0);
                    let _ = events.send(QmpEvent {
                        name: name.to_string(),
                        data: v.get("data").cloned().unwrap_or(Value::Null),
                        timestamp_us,
                    });
                    continue;
                }
                let Some(id) = v.get("id").and_then(Value::as_u64) else {
                    continue;
                };
                let Some(tx) = pending.lock().ok().and_then(|mut p| p.remove(&id)) else {
                    continue;
                };
                let result = if let Some(r) = v.get("return") {
                    Ok(r.clone())
                } else {
                    let err = &v["error"];
                    Err(QmpError::Command {
                        command: String::new(),
                        class: err["class"].as_str().unwrap_or("unknown").to_string(),
                        desc: err["desc"].as_str().unwrap_or("").to_string(),
                    })
                };
                let _ = tx.send(result);
            }
            // EOF: fail everyone still waiting, then announce the close.
            if let Ok(mut p) = pending.lock() {
                for (_, tx) in p.drain() {
                    let _ = tx.send(Err(QmpError::Disconnected));
                }
            }
            let _ = closed_tx.send(true);
        });
        qmp.execute("qmp_capabilities", None).await?;
        Ok(qmp)
    }

    /// Subscribe to events. Subscribe *before* issuing the command whose
    /// events you want, or you may miss them.
    pub fn events(&self) -> broadcast::Receiver<QmpEvent> {
        self.events.subscribe()
    }

    /// A receiver that flips to `true` when the connection closes.
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.clone()
    }

    /// Run a command and return its `return` value.
    pub async fn execute(
        &self,
        command: &str,
        arguments: Option<Value>,
    ) -> Result<Value, QmpError> {
        self.execute_timeout(command, arguments, Duration::from_secs(60))
            .await
    }

    /// Run a command with an explicit timeout.
    pub async fn execute_timeout(
        &self,
        command: &str,
        arguments: Option<Value>,
        timeout: Duration,
    ) -> Result<Value, QmpError> {
        if *self.closed.borrow() {
            return Err(QmpError::Disconnected);
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        if let Ok(mut p) = self.pending.lock() {
            p.insert(id, tx);
        }
        let mut msg = json!({ "execute": command, "id": id });
        if let Some(a) = arguments {
            msg["arguments"] = a;
        }
        let mut line = msg.to_string();
        line.push('\n');
        {
            let mut w = self.writer.lock().await;
            w.write_all(line.as_bytes()).await?;
        }
        match tokio::time::timeout(timeout, rx).await {
            Err(_) => {
                if let Ok(mut p) = self.pending.lock() {
                    p.remove(&id);
                }
                Err(QmpError::Timeout(command.to_string()))
            }
            Ok(Err(_)) => Err(QmpError::Disconnected),
            Ok(Ok(Err(QmpError::Command { class, desc, .. }))) => Err(QmpError::Command {
                command: command.to_string(),
                class,
                desc,
            }),
            Ok(Ok(r)) => r,
        }
    }

    /// `query-status` → the run state string (`running`, `paused`, `inmigrate`, ...).
    pub async fn status(&self) -> Result<String, QmpError> {
        let v = self.execute("query-status", None).await?;
        Ok(v["status"].as_str().unwrap_or("unknown").to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;
    use tokio::net::UnixListener;

    /// A tiny fake QMP peer: checks the client's framing, ids and event routing.
    #[tokio::test]
    async fn replies_are_routed_by_id_and_events_broadcast() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("qmp.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            s.write_all(b"{\"QMP\": {\"version\": {}, \"capabilities\": []}}\n")
                .await
                .unwrap();
            let mut buf = vec![0u8; 4096];
            let mut acc = String::new();
            let mut handled = 0;
            while handled < 3 {
                let n = s.read(&mut buf).await.unwrap();
                if n == 0 {
                    break;
                }
                acc.push_str(std::str::from_utf8(&buf[..n]).unwrap());
                while let Some(pos) = acc.find('\n') {
                    let line: String = acc.drain(..=pos).collect();
                    let v: Value = serde_json::from_str(&line).unwrap();
                    let id = v["id"].clone();
                    let reply = match v["execute"].as_str().unwrap() {
                        "qmp_capabilities" => json!({"return": {}, "id": id}),
                        "stop" => {
                            s.write_all(b"{\"event\": \"STOP\", \"data\": {}, \"timestamp\": {\"seconds\": 2, \"microseconds\": 5}}\n").await.unwrap();
                            json!({"return": {}, "id": id})
                        }
                        _ => {
                            json!({"error": {"class": "CommandNotFound", "desc": "nope"}, "id": id})
                        }
                    };
                    s.write_all(format!("{reply}\n").as_bytes()).await.unwrap();
                    handled += 1;
                }
            }
        });
        let qmp = Qmp::connect(&path, Duration::from_secs(5)).await.unwrap();
        let mut ev = qmp.events();
        qmp.execute("stop", None).await.unwrap();
        let e = ev.recv().await.unwrap();
        assert_eq!(e.name, "STOP");
        assert_eq!(e.timestamp_us, 2_000_005);
        let err = qmp.execute("bogus", None).await.unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        assert!(err.to_string().contains("CommandNotFound"), "{err}");
        server.await.unwrap();
        let mut closed = qmp.closed();
        let _ = tokio::time::timeout(Duration::from_secs(5), closed.wait_for(|c| *c)).await;
        assert!(matches!(
            qmp.execute("stop", None).await,
            Err(QmpError::Disconnected)
        ));
    }

    #[tokio::test]
    async fn connect_times_out_with_the_path_in_the_message() {
        let err = Qmp::connect(
            Path::new("/nonexistent/qmp.sock"),
            Duration::from_millis(50),
        )
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("/nonexistent/qmp.sock"));
    }
}
