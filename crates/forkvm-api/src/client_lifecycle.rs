//! The client's lifetime operations: metadata-filtered listing, timeouts,
//! pause and resume.

use std::collections::BTreeMap;

use hyper::Method;

use crate::client::{enc, Client, ClientError};
use crate::types::{NetworkInfo, Sandbox, SandboxList, SetNetwork};
use crate::{PauseRequest, ResumeRequest, SetTimeout, METADATA_QUERY_PREFIX};

impl Client {
    /// Sandboxes with every given metadata pair.
    pub async fn list_sandboxes_by(
        &self,
        metadata: &BTreeMap<String, String>,
    ) -> Result<SandboxList, ClientError> {
        let q: Vec<String> = metadata
            .iter()
            .map(|(k, v)| format!("{METADATA_QUERY_PREFIX}{}={}", enc(k), enc(v)))
            .collect();
        let path = if q.is_empty() {
            "/v1/sandboxes".to_string()
        } else {
            format!("/v1/sandboxes?{}", q.join("&"))
        };
        self.json(Method::GET, &path, None::<&()>).await
    }

    pub async fn set_timeout(&self, id: &str, req: &SetTimeout) -> Result<Sandbox, ClientError> {
        self.json(
            Method::PUT,
            &format!("/v1/sandboxes/{}/timeout", enc(id)),
            Some(req),
        )
        .await
    }

    /// Replace a running sandbox's egress allow-list.
    pub async fn set_network(
        &self,
        id: &str,
        req: &SetNetwork,
    ) -> Result<NetworkInfo, ClientError> {
        self.json(
            Method::PUT,
            &format!("/v1/sandboxes/{}/network", enc(id)),
            Some(req),
        )
        .await
    }

    pub async fn pause(&self, id: &str, req: &PauseRequest) -> Result<Sandbox, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/pause", enc(id)),
            Some(req),
        )
        .await
    }

    pub async fn resume(&self, id: &str, req: &ResumeRequest) -> Result<Sandbox, ClientError> {
        self.json(
            Method::POST,
            &format!("/v1/sandboxes/{}/resume", enc(id)),
            Some(req),
        )
        .await
    }
}
