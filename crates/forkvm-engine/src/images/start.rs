//! What a cold boot does for its image once the agent answers, before the
//! sandbox is handed out or captured as the image's boot template:
//!
//! 1. **Disk size.** A sandbox (or template) asked for a disk larger than
//!    the image gets a qcow2 overlay of that virtual size; the agent then
//!    grows the mounted root ext4 online (`EXT4_IOC_RESIZE_FS`), so no tool
//!    from the image is needed.
//! 2. **Start command.** An image with a start command has it started
//!    detached (its own session, output to a log file in the guest), then
//!    the readiness check polled: a TCP port that accepts, or a command
//!    that exits 0. Only then does the boot count as done, so the template
//!    snapshot holds the process running and every clone resumes it with
//!    the same pid — a Jupyter kernel or a dev server is up the instant a
//!    spawn returns, without being started again.
//!
//! A failed check fails the boot with the check's reason and the tail of
//! the process's log; nothing is captured and the sandbox is removed.

use std::time::{Duration, Instant};

use forkvm_image::meta::{ReadyCheck, StartSpec};

use crate::agent::{AgentConn, ExecSpec};
use crate::error::{EngineError, ErrorKind};
use crate::manager::Manager;

/// What a boot from an image asks for (validated).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BootReq {
    pub image: String,
    pub memory_mib: u32,
    pub cpus: u32,
    /// The root disk's virtual size when larger than the image's.
    pub disk_size: Option<u64>,
}

/// The most a sandbox's disk may be (a qcow2 overlay is sparse, but a
/// typo of a few zeros should not hand a guest a petabyte).
const MAX_DISK_BYTES: u64 = 2 << 40;

/// How often a readiness check is tried.
const READY_POLL: Duration = Duration::from_millis(200);

/// Where the start command's output goes in the guest.
pub const START_LOG: &str = "/run/forkvm/start.log";

fn guest_err(id: &str, what: &str, e: impl std::fmt::Display) -> EngineError {
    EngineError::new(ErrorKind::Guest, format!("sandbox {id}: {what}: {e}"))
}

impl Manager {
    /// `disk_size` of a spawn request: at least the image's size, at most
    /// [`MAX_DISK_BYTES`]; the image's own size is `None` (no growth).
    pub fn check_disk_size(
        &self,
        image: &str,
        disk_size: Option<u64>,
    ) -> Result<Option<u64>, EngineError> {
        let Some(want) = disk_size else {
            return Ok(None);
        };
        let have = std::fs::metadata(self.cfg.image_rootfs(image))
            .map(|m| m.len())
            .unwrap_or(0);
        if want < have {
            return Err(EngineError::invalid(format!(
                "disk_size {want} is smaller than image {image:?}'s root disk ({have} bytes); \
                 ask for at least that, or omit it"
            )));
        }
        if want > MAX_DISK_BYTES {
            return Err(EngineError::invalid(format!(
                "disk_size {want} is over the limit of {MAX_DISK_BYTES} bytes"
            )));
        }
        // The resize works in filesystem blocks; round to MiB so the qcow2
        // and the filesystem agree on the end.
        let want = want.div_ceil(1 << 20) << 20;
        Ok((want > have).then_some(want))
    }

    /// The image's part of a cold boot (see the module doc).
    pub async fn after_boot(&self, id: &str, boot: &BootReq) -> Result<(), EngineError> {
        let meta = self.image_meta(&boot.image).ok();
        let start = meta.and_then(|m| m.start);
        if boot.disk_size.is_none() && start.is_none() {
            return Ok(());
        }
        let live = self
            .live(id)
            .ok_or_else(|| EngineError::conflict(format!("sandbox {id} is not running")))?;
        let conn = live
            .agent()
            .await
            .map_err(|e| guest_err(id, "the agent", e))?;
        if boot.disk_size.is_some() {
            let r = conn
                .resize_rootfs(Duration::from_secs(60))
                .await
                .map_err(|e| guest_err(id, "growing the root filesystem", e))?;
            tracing::info!(
                "sandbox {id}: root filesystem grown from {} to {} bytes",
                r.old_bytes,
                r.new_bytes
            );
        }
        if let Some(s) = start {
            self.start_command(id, &conn, &boot.image, &s).await?;
        }
        Ok(())
    }

    async fn start_command(
        &self,
        id: &str,
        conn: &AgentConn,
        image: &str,
        s: &StartSpec,
    ) -> Result<(), EngineError> {
        let defaults = self.exec_defaults(image);
        let spec = crate::agent::StartSpec {
            argv: s.command.clone(),
            env: defaults.env_map(),
            cwd: defaults.working_dir.clone(),
            user: defaults.user.clone(),
            log_path: Some(START_LOG.to_string()),
        };
        let t = Instant::now();
        let pid = conn
            .start_detached(spec, Duration::from_secs(30))
            .await
            .map_err(|e| guest_err(id, &format!("starting {:?}", s.command), e))?
            .pid;
        tracing::info!("sandbox {id}: start command {:?} is pid {pid}", s.command);
        let Some(ready) = &s.ready else {
            return Ok(());
        };
        let limit = Duration::from_secs(s.ready_timeout_secs);
        loop {
            let ok = match ready {
                ReadyCheck::Port { port } => conn
                    .port_open(*port, Duration::from_secs(2))
                    .await
                    .map_err(|e| guest_err(id, "the readiness check", e))?,
                ReadyCheck::Command { command } => {
                    let spec = ExecSpec {
                        argv: command.clone(),
                        env: defaults.env_map(),
                        cwd: defaults.working_dir.clone(),
                        user: defaults.user.clone(),
                        timeout_ms: Some(10_000),
                        max_output: 4096,
                        ..Default::default()
                    };
                    conn.exec(spec, Duration::from_secs(15))
                        .await
                        .map(|o| o.exit_code == Some(0))
                        .unwrap_or(false)
                }
            };
            if ok {
                tracing::info!(
                    "sandbox {id}: start command ready after {} ms",
                    t.elapsed().as_millis()
                );
                return Ok(());
            }
            if t.elapsed() >= limit {
                let log = conn
                    .read_file(START_LOG, 4096, Duration::from_secs(5))
                    .await
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                return Err(EngineError::new(
                    ErrorKind::GuestTimeout,
                    format!(
                        "sandbox {id}: the start command {:?} of image {image} was not ready \
                         within {} s ({}); fix the command or the check, or raise \
                         ready_timeout_secs. Its output ({START_LOG}):\n{}",
                        s.command,
                        s.ready_timeout_secs,
                        match ready {
                            ReadyCheck::Port { port } => format!("port {port} never accepted"),
                            ReadyCheck::Command { command } => {
                                format!("{command:?} never exited 0")
                            }
                        },
                        log.trim_end()
                    ),
                ));
            }
            tokio::time::sleep(READY_POLL).await;
        }
    }
}
