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
//!
//! Any of them may instead be answered by `error`.

use std::path::Path;

use forkvm_agent_protocol::{GuestMsg, HostMsg, ERR_UNSUPPORTED};

use crate::command::ETC;
use crate::procs;
use crate::serve::{Agent, ReqError};

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
        _ => Err(ReqError {
            code: ERR_UNSUPPORTED,
            message: "not implemented yet".into(),
        }),
    };
    match result {
        Ok(Some(reply)) => agent.reply(&reply, &[]),
        Ok(None) => {}
        Err(e) => agent.reply(&e.into_msg(id), &[]),
    }
}
