//! The protocol-2 operations of [`AgentConn`]: start commands (detached
//! exec), port probes, copying archives into the guest, growing the root
//! filesystem and sync. Each maps an agent too old for it to
//! [`AgentError::Unsupported`].

use std::collections::BTreeMap;
use std::time::Duration;

use forkvm_agent_protocol::{self as proto, tar, GuestMsg, HostMsg};

use super::{AgentConn, AgentError};

/// A process to start in the background (see [`AgentConn::start_detached`]).
#[derive(Debug, Clone, Default)]
pub struct StartSpec {
    pub argv: Vec<String>,
    /// Added to the agent's environment (PATH, HOME=/root).
    pub env: BTreeMap<String, String>,
    /// Default `/`; one that does not exist is an error.
    pub cwd: Option<String>,
    /// OCI user form (`name`, `uid`, `name:group`, `uid:gid`); None: root.
    pub user: Option<String>,
    /// Where stdout and stderr are appended (its directory must exist);
    /// None: `/run/forkvm/start-<pid>.log`.
    pub log_path: Option<String>,
}

/// A started background process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartedProcess {
    pub pid: u32,
    pub log_path: String,
}

/// What [`AgentConn::put_archive`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ArchiveSummary {
    /// Archive entries written (a file sent in pieces counts once).
    pub entries: u64,
    /// Bytes of file data written.
    pub bytes: u64,
    /// `put_archive` requests it took.
    pub requests: u64,
}

/// The root filesystem's size before and after [`AgentConn::resize_rootfs`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RootfsSize {
    pub old_bytes: u64,
    pub new_bytes: u64,
}

fn unexpected(what: &str, other: &GuestMsg) -> AgentError {
    AgentError::Protocol(format!("expected {what}, got {other:?}"))
}

impl AgentConn {
    /// Start a process that keeps running after this call (an image's start
    /// command): its own session, stdin from /dev/null, output appended to
    /// a log, reaped by the agent when it exits. Returns once it has been
    /// started, with its pid. Needs a protocol-2 agent (checked first: an
    /// older one would run the command in the foreground).
    pub async fn start_detached(
        &self,
        spec: StartSpec,
        timeout: Duration,
    ) -> Result<StartedProcess, AgentError> {
        let what = "start background processes (start commands)";
        self.require_protocol(proto::PROTOCOL_V2, what).await?;
        let StartSpec {
            argv,
            env,
            cwd,
            user,
            log_path,
        } = spec;
        let f = self
            .one_reply(
                |id| HostMsg::Exec {
                    id,
                    argv,
                    env,
                    cwd,
                    timeout_ms: None,
                    user,
                    detach: true,
                    log_path,
                },
                b"",
                timeout,
                what,
            )
            .await?;
        match f.msg {
            GuestMsg::Started { pid, log_path, .. } => Ok(StartedProcess { pid, log_path }),
            other => Err(unexpected("started", &other)),
        }
    }

    /// Whether a server in the guest accepts TCP connections on `port` of
    /// 127.0.0.1 (or ::1) right now; each connect attempt is bounded by
    /// `probe_timeout`. A readiness check for start commands: poll it.
    pub async fn port_open(&self, port: u16, probe_timeout: Duration) -> Result<bool, AgentError> {
        let timeout_ms = probe_timeout.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        let f = self
            .one_reply(
                |id| HostMsg::PortProbe {
                    id,
                    port,
                    timeout_ms,
                },
                b"",
                probe_timeout * 2 + Duration::from_secs(10),
                "probe ports",
            )
            .await?;
        match f.msg {
            GuestMsg::PortOpen { open, .. } => Ok(open),
            other => Err(unexpected("port_open", &other)),
        }
    }

    /// Extract an uncompressed tar stream under the guest directory `dest`
    /// (created if missing), owned by `owner` (OCI user form, resolved in
    /// the guest) or else by each header's uid and gid. An archive bigger
    /// than one frame is sent as several requests, cut between entries; a
    /// single file bigger than a frame is sent in pieces (see
    /// `forkvm_agent_protocol::tar::split`). `timeout` bounds each request.
    /// An empty archive still creates `dest`.
    pub async fn put_archive(
        &self,
        dest: &str,
        owner: Option<&str>,
        tar: &[u8],
        timeout: Duration,
    ) -> Result<ArchiveSummary, AgentError> {
        self.put_archive_in_parts(dest, owner, tar, proto::MAX_PAYLOAD as usize, timeout)
            .await
    }

    /// [`AgentConn::put_archive`] with requests of at most `limit` bytes.
    pub async fn put_archive_in_parts(
        &self,
        dest: &str,
        owner: Option<&str>,
        archive: &[u8],
        limit: usize,
        timeout: Duration,
    ) -> Result<ArchiveSummary, AgentError> {
        let mut parts =
            tar::split(archive, limit).map_err(|e| AgentError::InvalidArchive(e.to_string()))?;
        if parts.is_empty() {
            parts.push(tar::Part {
                head: Vec::new(),
                body: 0..0,
                pad: 0,
                append_at: None,
            });
        }
        let mut sum = ArchiveSummary::default();
        for part in &parts {
            let payload = part.payload(archive);
            let f = self
                .one_reply(
                    |id| HostMsg::PutArchive {
                        id,
                        dest: dest.to_string(),
                        owner: owner.map(str::to_string),
                        append_at: part.append_at,
                    },
                    &payload,
                    timeout,
                    "copy archives into the sandbox",
                )
                .await?;
            match f.msg {
                GuestMsg::ArchiveWritten { entries, bytes, .. } => {
                    // A later piece of a split file is the same entry.
                    if part.append_at.is_none() {
                        sum.entries += entries;
                    }
                    sum.bytes += bytes;
                    sum.requests += 1;
                }
                other => return Err(unexpected("archive_written", &other)),
            }
        }
        Ok(sum)
    }

    /// Grow the guest's root ext4 filesystem to the size of its disk (after
    /// a cold boot on a bigger overlay, or a QMP `block_resize`); a no-op
    /// when it already fills it.
    pub async fn resize_rootfs(&self, timeout: Duration) -> Result<RootfsSize, AgentError> {
        let f = self
            .one_reply(
                |id| HostMsg::ResizeRootfs { id },
                b"",
                timeout,
                "grow the root filesystem",
            )
            .await?;
        match f.msg {
            GuestMsg::RootfsResized {
                old_bytes,
                new_bytes,
                ..
            } => Ok(RootfsSize {
                old_bytes,
                new_bytes,
            }),
            other => Err(unexpected("rootfs_resized", &other)),
        }
    }

    /// Flush the guest's filesystems (sync(2)).
    pub async fn sync(&self, timeout: Duration) -> Result<(), AgentError> {
        let f = self
            .one_reply(|id| HostMsg::Sync { id }, b"", timeout, "sync its disks")
            .await?;
        match f.msg {
            GuestMsg::Synced { .. } => Ok(()),
            other => Err(unexpected("synced", &other)),
        }
    }

    /// Mount volumes in the guest (FUSE relayed over the volume port).
    pub async fn mount_volumes(
        &self,
        volumes: Vec<forkvm_agent_protocol::VolumeMountSpec>,
        timeout: Duration,
    ) -> Result<(), AgentError> {
        let f = self
            .one_reply(
                move |id| HostMsg::MountVolumes { id, volumes },
                b"",
                timeout,
                "mount its volumes",
            )
            .await?;
        match f.msg {
            GuestMsg::Ack { .. } => Ok(()),
            other => Err(unexpected("ack", &other)),
        }
    }
}
