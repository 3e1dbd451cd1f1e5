//! The client's time-travel operations: checkpoints, timelines, retention
//! and rewind.

use hyper::Method;

use crate::client::{enc, Client, ClientError};
use crate::{Checkpoint, CheckpointRequest, Retention, RewindRequest, Rewound, Timeline};

impl Client {
    pub async fn checkpoint(
        &self,
        id: &str,
        req: &CheckpointRequest,
    ) -> Result<Checkpoint, ClientError> {
        let path = format!("/v1/sandboxes/{}/checkpoints", enc(id));
        self.json(Method::POST, &path, Some(req)).await
    }

    pub async fn timeline(&self, id: &str) -> Result<Timeline, ClientError> {
        let path = format!("/v1/sandboxes/{}/timeline", enc(id));
        self.json(Method::GET, &path, None::<&()>).await
    }

    pub async fn set_retention(&self, id: &str, r: &Retention) -> Result<Timeline, ClientError> {
        let path = format!("/v1/sandboxes/{}/timeline/retention", enc(id));
        self.json(Method::PUT, &path, Some(r)).await
    }

    pub async fn rewind(&self, id: &str, req: &RewindRequest) -> Result<Rewound, ClientError> {
        let path = format!("/v1/sandboxes/{}/rewind", enc(id));
        self.json(Method::POST, &path, Some(req)).await
    }
}

impl Client {
    pub async fn diff(
        &self,
        a: &str,
        req: &crate::DiffRequest,
    ) -> Result<crate::Diff, ClientError> {
        let path = format!("/v1/diff/{}", enc(a));
        self.json(Method::POST, &path, Some(req)).await
    }

    pub async fn merge(
        &self,
        child: &str,
        req: &crate::MergeRequest,
    ) -> Result<crate::Merged, ClientError> {
        let path = format!("/v1/sandboxes/{}/merge", enc(child));
        self.json(Method::POST, &path, Some(req)).await
    }
}
