//! The client's named-volume operations (plain JSON calls).

use hyper::Method;

use crate::client::{enc, Client, ClientError};
use crate::volumes::*;

impl Client {
    pub async fn list_volumes(&self) -> Result<VolumeList, ClientError> {
        let b = self.call(Method::GET, "/v1/volumes", None).await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn create_volume(&self, name: &str) -> Result<Volume, ClientError> {
        let body = serde_json::to_vec(&CreateVolume {
            name: name.to_string(),
        })
        .map_err(|e| ClientError::Decode(e.to_string()))?;
        let b = self
            .call(
                Method::POST,
                "/v1/volumes",
                Some((body.into(), "application/json")),
            )
            .await?;
        serde_json::from_slice(&b).map_err(|e| ClientError::Decode(e.to_string()))
    }

    pub async fn delete_volume(&self, name: &str) -> Result<(), ClientError> {
        self.call(Method::DELETE, &format!("/v1/volumes/{}", enc(name)), None)
            .await
            .map(|_| ())
    }
}
