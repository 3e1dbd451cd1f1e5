//! The protocol-3 requests (see `forkvm_agent_protocol::caps`): background
//! processes, PTYs, filesystem operations and watches.

use forkvm_agent_protocol::{HostMsg, ERR_UNSUPPORTED};

use crate::serve::{Agent, ReqError};

/// Handle one protocol-3 request and send its reply or stream.
pub fn handle(msg: HostMsg, _payload: Vec<u8>, agent: &Agent) {
    let id = msg.id();
    let e = ReqError {
        code: ERR_UNSUPPORTED,
        message: "not implemented yet".into(),
    };
    agent.reply(&e.into_msg(id), &[]);
}
