//! The protocol-3 requests (see `forkvm_agent_protocol::caps`).
//!
//! | request            | reply                                         | module               |
//! |--------------------|-----------------------------------------------|----------------------|
//! | `proc_start`       | `proc_started`, `proc_data`*, `proc_end`      | [`crate::procs`]     |
//! | `proc_connect`     | the same, replaying the buffered output       | [`crate::procs`]     |
//! | `proc_list`        | `processes`                                   | [`crate::procs`]     |
//! | `proc_input`       | `ack`                                         | [`crate::procs`]     |
//! | `proc_close_stdin` | `ack`                                         | [`crate::procs`]     |
//! | `proc_signal`      | `ack`                                         | [`crate::procs`]     |
//! | `proc_resize`      | `ack`                                         | [`crate::procs`]     |
//! | `stream_cancel`    | `ack`                                         | [`crate::streams`]   |
//! | `fs_stat`          | `fs_entry`                                    | [`crate::fsops`]     |
//! | `fs_exists`        | `exists`                                      | [`crate::fsops`]     |
//! | `fs_list`          | `fs_entries` (entries in the payload)         | [`crate::fsops`]     |
//! | `fs_mkdir`         | `dir_made`                                    | [`crate::fsops`]     |
//! | `fs_move`          | `fs_entry`                                    | [`crate::fsops`]     |
//! | `fs_remove`        | `ack`                                         | [`crate::fsops`]     |
//! | `fs_watch`         | `watch_started`, `fs_events`*, `keepalive`*   | [`crate::watch`]     |
//! | `watcher_create`   | `watcher`                                     | [`crate::watch`]     |
//! | `watcher_poll`     | `fs_events`                                   | [`crate::watch`]     |
//! | `watcher_remove`   | `ack`                                         | [`crate::watch`]     |
//! | `get_archive`      | `archive_data` (a tar in the payload)         | [`crate::download`]  |
//!
//! Any of them may instead be answered by `error`.

use std::path::Path;

use forkvm_agent_protocol::{GuestMsg, HostMsg, ERR_IO, ERR_UNSUPPORTED};

use crate::command::ETC;
use crate::serve::{Agent, ReqError};
use crate::{download, fsops, procs, watch};

/// Handle one protocol-3 request and send its reply or stream.
pub fn handle(msg: HostMsg, payload: Vec<u8>, agent: &Agent) {
    let id = msg.id();
    let result = match msg {
        HostMsg::ProcStart(req) => {
            // Registered before the process starts, so a cancel or a new
            // connection that comes right after is not missed.
            let handle = agent.streams.open(id);
            agent.procs.start(&req, Path::new(ETC)).map(|p| {
                procs::follow(agent, &p, id, &handle);
                None
            })
        }
        HostMsg::ProcConnect(r) => {
            let handle = agent.streams.open(id);
            agent.procs.find(r.pid, r.tag.as_deref()).map(|p| {
                procs::follow(agent, &p, id, &handle);
                None
            })
        }
        HostMsg::ProcList { id } => Ok(Some(GuestMsg::Processes {
            id,
            processes: agent.procs.list(),
        })),
        HostMsg::ProcInput(r) => agent
            .procs
            .find(r.pid, r.tag.as_deref())
            .and_then(|p| p.write_input(payload))
            .map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::ProcCloseStdin(r) => agent
            .procs
            .find(r.pid, r.tag.as_deref())
            .and_then(|p| p.close_stdin())
            .map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::ProcSignal(r) => agent
            .procs
            .find(r.pid, r.tag.as_deref())
            .and_then(|p| p.signal(r.signal))
            .map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::ProcResize(r) => agent
            .procs
            .find(r.pid, r.tag.as_deref())
            .and_then(|p| p.resize(r.size))
            .map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::StreamCancel { id, stream } => {
            if agent.streams.cancel(stream) {
                agent.procs.wake_all();
            }
            Ok(Some(GuestMsg::Ack { id }))
        }
        HostMsg::FsStat { id, path } => {
            fsops::stat(&path, Path::new(ETC)).map(|entry| Some(GuestMsg::FsEntry { id, entry }))
        }
        HostMsg::FsExists { id, path } => {
            fsops::exists(&path).map(|exists| Some(GuestMsg::Exists { id, exists }))
        }
        HostMsg::FsList { id, path, depth } => {
            let listed = fsops::list(&path, depth, Path::new(ETC)).and_then(|entries| {
                let json = serde_json::to_vec(&entries).map_err(|e| ReqError {
                    code: ERR_IO,
                    message: format!("cannot encode the listing: {e}"),
                })?;
                Ok((entries.len() as u64, json))
            });
            listed.map(|(count, json)| {
                agent.reply(&GuestMsg::FsEntries { id, count }, &json);
                None
            })
        }
        HostMsg::FsMkdir { id, path } => fsops::mkdir(&path, Path::new(ETC))
            .map(|(entry, existed)| Some(GuestMsg::DirMade { id, entry, existed })),
        HostMsg::FsMove {
            id,
            source,
            destination,
        } => fsops::rename(&source, &destination, Path::new(ETC))
            .map(|entry| Some(GuestMsg::FsEntry { id, entry })),
        HostMsg::FsRemove { id, path } => fsops::remove(&path).map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::FsWatch {
            id,
            path,
            recursive,
        } => {
            let handle = agent.streams.open(id);
            watch::stream(agent, id, &path, recursive, &handle);
            Ok(None)
        }
        HostMsg::WatcherCreate {
            id,
            path,
            recursive,
        } => agent
            .watchers
            .create(&path, recursive)
            .map(|watcher_id| Some(GuestMsg::Watcher { id, watcher_id })),
        HostMsg::WatcherPoll { id, watcher_id } => {
            agent.watchers.poll(&watcher_id).map(|(events, dropped)| {
                Some(GuestMsg::FsEvents {
                    id,
                    events,
                    dropped,
                })
            })
        }
        HostMsg::WatcherRemove { id, watcher_id } => agent
            .watchers
            .remove(&watcher_id)
            .map(|()| Some(GuestMsg::Ack { id })),
        HostMsg::GetArchive {
            id,
            paths,
            max_bytes,
        } => download::get_archive(&paths, max_bytes).map(|a| {
            let msg = GuestMsg::ArchiveData {
                id,
                entries: a.entries,
                bytes: a.bytes,
            };
            agent.reply(&msg, &a.tar);
            None
        }),
        _ => Err(ReqError {
            code: ERR_UNSUPPORTED,
            message: "agent bug: not a protocol-3 request".into(),
        }),
    };
    match result {
        Ok(Some(reply)) => agent.reply(&reply, &[]),
        Ok(None) => {}
        Err(e) => agent.reply(&e.into_msg(id), &[]),
    }
}
