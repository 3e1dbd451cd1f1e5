//! Actions on images (pull, import, build, remove) and named volumes.

use forkvm_api::{BuildQuery, Image, ImageEvent, ImportQuery, PullImage, Volume};
use tokio::sync::mpsc;

use super::{Engine, PullPlan, Upload};
use crate::error::EngineError;

impl Engine {
    /// Every installed image.
    pub fn list_images(&self) -> Vec<Image> {
        self.m.list_images()
    }

    /// One installed image by name.
    pub fn get_image(&self, name: &str) -> Result<Image, EngineError> {
        self.m.get_image(name)
    }

    /// Whether an image of that name is installed (its root disk is there).
    pub fn image_exists(&self, name: &str) -> bool {
        self.m.cfg.image_rootfs(name).exists()
    }

    /// The size in bytes of an image's root disk (0 when it has none).
    pub fn image_disk_bytes(&self, image: &str) -> u64 {
        std::fs::metadata(self.m.cfg.image_rootfs(image))
            .map(|md| md.len())
            .unwrap_or(0)
    }

    /// Remove an installed image and its boot templates; refused while
    /// sandboxes or snapshots use it.
    pub async fn remove_image(&self, name: &str) -> Result<(), EngineError> {
        self.m.remove_image(name).await
    }

    /// Check that a new image may take this name (`replace` lets it take an
    /// existing image's).
    pub fn check_new_image_name(&self, name: &str, replace: bool) -> Result<(), EngineError> {
        self.m.check_new_image_name(name, replace)
    }

    /// Refuse work that writes to the home (`what` names it) while the
    /// home is under its free-space reserve.
    pub fn check_disk(&self, what: &str) -> Result<(), EngineError> {
        self.m.check_disk(what)
    }

    /// Check an image pull before it starts, and plan it.
    pub fn check_pull(&self, req: &PullImage) -> Result<PullPlan, EngineError> {
        self.m.check_pull(req)
    }

    /// Pull an image from an OCI registry and install it, sending progress
    /// on `tx`.
    pub async fn pull_image(
        &self,
        plan: PullPlan,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        self.m.pull_image(plan, tx).await
    }

    /// Install an image from an uploaded archive, sending progress on `tx`.
    pub async fn import_image(
        &self,
        q: ImportQuery,
        upload: Upload,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        self.m.import_image(q, upload, tx).await
    }

    /// Build an image from an uploaded context with a Dockerfile, sending
    /// progress on `tx`.
    pub async fn build_image(
        &self,
        q: BuildQuery,
        upload: Upload,
        tx: mpsc::UnboundedSender<ImageEvent>,
    ) -> Result<Image, EngineError> {
        self.m.build_image(q, upload, tx).await
    }

    /// Receive an upload's bytes into a file of the daemon, for an import
    /// or build to read.
    pub async fn receive_upload<S, E>(&self, body: S, what: &str) -> Result<Upload, EngineError>
    where
        S: tokio_stream::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
        E: std::fmt::Display,
    {
        self.m.receive_upload(body, what).await
    }

    /// Read and drop what is left of a refused upload (for a while), so that
    /// its client reads the refusal rather than a reset connection.
    pub async fn discard_upload<S, E>(body: S)
    where
        S: tokio_stream::Stream<Item = Result<bytes::Bytes, E>> + Unpin,
    {
        crate::images::install::drain(body).await
    }

    /// Every named volume.
    pub fn list_volumes(&self) -> Vec<Volume> {
        self.m.list_volumes()
    }

    /// Create a named volume.
    pub fn create_volume(&self, name: &str) -> Result<Volume, EngineError> {
        self.m.create_volume(name)
    }

    /// Remove a named volume and its files; refused while a sandbox uses it.
    pub async fn remove_volume(&self, name: &str) -> Result<(), EngineError> {
        self.m.remove_volume(name).await
    }
}
