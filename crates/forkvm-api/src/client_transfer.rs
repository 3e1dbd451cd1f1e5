//! The client's snapshot transfer operations: push and pull, read as NDJSON
//! progress streams.

use bytes::Bytes;
use hyper::Method;

use crate::client::{enc, read_ndjson, Client, ClientError};
use crate::transfer::*;

impl Client {
    /// Push a snapshot; `on_event` sees every progress event.
    pub async fn push_snapshot(
        &self,
        id: &str,
        req: &PushSnapshot,
        on_event: impl FnMut(&TransferEvent),
    ) -> Result<PushResult, ClientError> {
        let mut req = req.clone();
        req.stream = true;
        let ev = self
            .transfer(&format!("/v1/snapshots/{}/push", enc(id)), &req, on_event)
            .await?;
        match ev {
            TransferEvent::Pushed { result } => Ok(result),
            other => Err(ClientError::Decode(format!(
                "unexpected last event {other:?}"
            ))),
        }
    }

    /// Pull a snapshot; `on_event` sees every progress event.
    pub async fn pull_snapshot(
        &self,
        req: &PullSnapshot,
        on_event: impl FnMut(&TransferEvent),
    ) -> Result<PullResult, ClientError> {
        let mut req = req.clone();
        req.stream = true;
        match self.transfer("/v1/snapshots/pull", &req, on_event).await? {
            TransferEvent::Pulled { result } => Ok(*result),
            other => Err(ClientError::Decode(format!(
                "unexpected last event {other:?}"
            ))),
        }
    }

    async fn transfer<T: serde::Serialize>(
        &self,
        path: &str,
        req: &T,
        mut on_event: impl FnMut(&TransferEvent),
    ) -> Result<TransferEvent, ClientError> {
        let body =
            Bytes::from(serde_json::to_vec(req).map_err(|e| ClientError::Decode(e.to_string()))?);
        let resp = self
            .open(Method::POST, path, Some((body, "application/json")))
            .await?;
        read_ndjson(resp, "progress", |ev: TransferEvent| {
            on_event(&ev);
            match ev {
                TransferEvent::Error { error } => Some(Err(ClientError::from_detail(error))),
                done @ (TransferEvent::Pushed { .. } | TransferEvent::Pulled { .. }) => {
                    Some(Ok(done))
                }
                _ => None,
            }
        })
        .await
    }
}
