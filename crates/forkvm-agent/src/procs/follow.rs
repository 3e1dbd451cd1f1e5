//! A process stream: `proc_started`, the ring from its oldest byte, then
//! live output, `keepalive` when idle, and `proc_end`.

use std::sync::PoisonError;
use std::time::{Duration, Instant};

use forkvm_agent_protocol::caps::KEEPALIVE_SECS;

/// How long a stream may be silent before it sends `keepalive`.
pub const KEEPALIVE: Duration = Duration::from_secs(KEEPALIVE_SECS);
use forkvm_agent_protocol::{GuestMsg, ProcEnd, OUTPUT_CHUNK};

use super::ring::Chunk;
use super::{lock, End, Proc};
use crate::serve::Agent;
use crate::streams::StreamHandle;

enum Step {
    Data(Chunk),
    End(End),
    Keepalive,
}

/// Stream `proc`'s events as the replies to request `id` until it ends or
/// `handle` says stop.
/// `keepalive` comes from the agent ([`KEEPALIVE`] outside tests).
pub fn follow(agent: &Agent, proc: &Proc, id: u64, handle: &StreamHandle) {
    let keepalive = agent.keepalive;
    agent.reply(&GuestMsg::ProcStarted { id, pid: proc.pid }, &[]);
    let mut cursor = 0u64;
    let mut last_sent = Instant::now();
    loop {
        let step = {
            let mut st = lock(&proc.state);
            loop {
                if !handle.live() {
                    return;
                }
                if let Some(c) = st.ring.read(cursor, OUTPUT_CHUNK) {
                    break Step::Data(c);
                }
                if let Some(end) = &st.end {
                    break Step::End(end.clone());
                }
                let left = keepalive.saturating_sub(last_sent.elapsed());
                if left.is_zero() {
                    break Step::Keepalive;
                }
                st = proc
                    .cond
                    .wait_timeout(st, left)
                    .unwrap_or_else(PoisonError::into_inner)
                    .0;
            }
        };
        // Sent without the lock: the host may be slow or absent.
        match step {
            Step::Data(c) => {
                cursor = c.next;
                let msg = GuestMsg::ProcData {
                    id,
                    stream: c.stream,
                    lost: c.lost,
                };
                agent.reply(&msg, &c.data);
            }
            Step::Keepalive => agent.reply(&GuestMsg::Keepalive { id }, &[]),
            Step::End(e) => {
                let msg = GuestMsg::ProcEnd(ProcEnd {
                    id,
                    pid: proc.pid,
                    exit_code: e.exit_code,
                    exited: e.exited,
                    signal: e.signal,
                    status: e.status,
                    error: e.error,
                });
                agent.reply(&msg, &[]);
                return;
            }
        }
        last_sent = Instant::now();
    }
}
