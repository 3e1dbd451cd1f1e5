//! What each request does: decode its fields, call the module that does the
//! work, and send the reply. The transport (framing, threads, errors for
//! malformed frames) is [`crate::serve`]'s.
//!
//! | request         | reply                    | module                 |
//! |-----------------|--------------------------|------------------------|
//! | `ping`          | `pong`                   | here, [`crate::probe`] |
//! | `exec`          | `output`* then `exited`  | [`crate::exec`]        |
//! | `exec` (detach) | `started`                | [`crate::start`]       |
//! | `write_file`    | `file_written`           | [`crate::files`]       |
//! | `read_file`     | `file_data`              | [`crate::files`]       |
//! | `put_archive`   | `archive_written`        | [`crate::archive`]     |
//! | `identity`      | `identity_ack`           | [`crate::identity`]    |
//! | `set_clock`     | `clock_set`              | [`crate::sys`]         |
//! | `net_probe`     | `net_ready`              | [`crate::probe`]       |
//! | `port_probe`    | `port_open`              | [`crate::probe`]       |
//! | `resize_rootfs` | `rootfs_resized`         | [`crate::rootfs`]      |
//! | `sync`          | `synced`                 | here                   |
//! | `shutdown`      | `shutdown_ack`, power off| main.rs                |
//!
//! Any of them may instead be answered by `error`.

use std::path::Path;
use std::sync::PoisonError;
use std::time::Instant;

use forkvm_agent_protocol::{
    Frame, GuestMsg, HostMsg, DEFAULT_LOG_DIR, ERR_INVALID, ERR_IO, PROTOCOL_VERSION,
};

use crate::archive;
use crate::command::ETC;
use crate::exec::{self, ExecRequest};
use crate::files;
use crate::identity::Identity;
use crate::probe;
use crate::rootfs;
use crate::serve::{Agent, ReqError};
use crate::start::{self, StartRequest};

/// Handle one request and send its reply (or replies).
pub fn handle(frame: Frame<HostMsg>, agent: &Agent) {
    let Frame { msg, payload } = frame;
    let reply = |msg: GuestMsg| agent.reply(&msg, &[]);
    let error = |id: u64, e: ReqError| reply(e.into_msg(id));
    match msg {
        HostMsg::Ping { id } => reply(GuestMsg::Pong {
            id,
            agent_version: env!("CARGO_PKG_VERSION").to_string(),
            protocol: PROTOCOL_VERSION,
            uptime_ms: probe::uptime_ms(),
        }),
        HostMsg::Exec {
            id,
            argv,
            env,
            cwd,
            timeout_ms,
            user,
            detach: true,
            log_path,
        } => {
            if !payload.is_empty() || timeout_ms.is_some() {
                return error(
                    id,
                    ReqError {
                        code: ERR_INVALID,
                        message: "a detached exec takes no stdin and no timeout_ms".into(),
                    },
                );
            }
            let req = StartRequest {
                id,
                argv,
                env,
                cwd,
                user,
                log_path,
            };
            match start::start(req, Path::new(ETC), Path::new(DEFAULT_LOG_DIR)) {
                Ok(s) => reply(GuestMsg::Started {
                    id,
                    pid: s.pid,
                    log_path: s.log_path,
                }),
                Err(e) => error(id, e),
            }
        }
        HostMsg::Exec {
            id,
            argv,
            env,
            cwd,
            timeout_ms,
            user,
            detach: false,
            log_path: _,
        } => {
            let req = ExecRequest {
                id,
                argv,
                env,
                cwd,
                timeout_ms,
                stdin: payload,
                user,
            };
            match exec::run(req, &agent.outbox) {
                Ok(r) => reply(GuestMsg::Exited {
                    id,
                    exit_code: r.exit_code,
                    signal: r.signal,
                    timed_out: r.timed_out,
                    duration_ms: r.duration_ms,
                }),
                Err(e) => error(id, e),
            }
        }
        HostMsg::WriteFile {
            id,
            path,
            mode,
            create_dirs,
        } => match files::write_file(&path, mode, create_dirs, &payload) {
            Ok(size) => reply(GuestMsg::FileWritten { id, size }),
            Err(e) => error(id, e),
        },
        HostMsg::ReadFile {
            id,
            path,
            max_bytes,
        } => match files::read_file(&path, max_bytes) {
            Ok(f) => agent.reply(
                &GuestMsg::FileData {
                    id,
                    size: f.data.len() as u64,
                    mode: f.mode,
                },
                &f.data,
            ),
            Err(e) => error(id, e),
        },
        HostMsg::PutArchive {
            id,
            dest,
            owner,
            append_at,
        } => {
            let req = archive::Request {
                dest: &dest,
                owner: owner.as_deref(),
                append_at,
                archive: &payload,
            };
            match archive::put_archive(&req, Path::new(ETC)) {
                Ok(s) => reply(GuestMsg::ArchiveWritten {
                    id,
                    entries: s.entries,
                    bytes: s.bytes,
                }),
                Err(e) => error(id, e),
            }
        }
        HostMsg::Shutdown { id } => {
            reply(GuestMsg::ShutdownAck { id });
            agent.shutdown();
        }
        HostMsg::Identity {
            id,
            hostname,
            unix_time_ns,
            machine_id,
            instance_id,
        } => {
            // A restored clone's first request: its streams are its
            // parent's, for a host that is not there.
            agent.new_connection();
            let start = Instant::now();
            let req = Identity {
                hostname: &hostname,
                unix_time_ns,
                machine_id: &machine_id,
                instance_id: &instance_id,
                entropy: &payload,
            };
            let result = agent
                .identity
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .apply(&req);
            let took_us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            match result {
                Ok(()) => reply(GuestMsg::IdentityAck { id, took_us }),
                Err(e) => {
                    crate::log(&format!("identity failed: {}", e.message));
                    error(id, e)
                }
            }
        }
        HostMsg::NetProbe {
            id,
            addr,
            port,
            timeout_ms,
        } => match probe::net_probe(&addr, port, timeout_ms) {
            Ok(took_us) => reply(GuestMsg::NetReady { id, took_us }),
            Err(message) => error(
                id,
                ReqError {
                    code: ERR_IO,
                    message,
                },
            ),
        },
        HostMsg::PortProbe {
            id,
            port,
            timeout_ms,
        } => match probe::port_open(port, timeout_ms) {
            Ok(open) => reply(GuestMsg::PortOpen { id, open }),
            Err(e) => error(id, e),
        },
        HostMsg::SetClock { id, unix_time_ns } => match crate::sys::set_realtime_ns(unix_time_ns) {
            Ok(()) => reply(GuestMsg::ClockSet { id }),
            Err(e) => error(
                id,
                ReqError {
                    code: ERR_IO,
                    message: format!("cannot set the clock: {e}"),
                },
            ),
        },
        HostMsg::ResizeRootfs { id } => match rootfs::resize_rootfs() {
            Ok((old_bytes, new_bytes)) => {
                if new_bytes != old_bytes {
                    crate::log(&format!(
                        "grew the root filesystem from {old_bytes} to {new_bytes} bytes"
                    ));
                }
                reply(GuestMsg::RootfsResized {
                    id,
                    old_bytes,
                    new_bytes,
                })
            }
            Err(e) => error(id, e),
        },
        HostMsg::Sync { id } => {
            crate::sys::sync();
            reply(GuestMsg::Synced { id });
        }
        HostMsg::MountVolumes { id, volumes } => match crate::volumes::mount(&volumes) {
            Ok(()) => reply(GuestMsg::Ack { id }),
            Err(e) => error(id, e),
        },
        other => crate::handlers_v3::handle(other, payload, agent),
    }
}
