//! Frames of the volume port: FUSE requests and replies between the guest's
//! `/dev/fuse` and the host's volume server.
//!
//! Host directories are mounted in the guest with FUSE. The guest kernel's
//! requests are not interpreted in the guest: a relay (see [`relay`], feature
//! `relay`) reads them from `/dev/fuse` and sends them raw over a dedicated
//! virtio-serial port; the host server answers with raw replies that the relay
//! writes back to `/dev/fuse`. The port is a byte stream, so every message is
//! a frame:
//!
//! ```text
//!  0         4      5        6          8
//!  +---------+------+--------+----------+---------------------------+
//!  | len     | kind | volume | flags    | payload                   |
//!  | u32 LE  | u8   | u8     | u16 LE=0 | (len - 4 bytes)           |
//!  +---------+------+--------+----------+---------------------------+
//! ```
//!
//! `len` counts everything after itself (at least 4, at most [`MAX_FRAME`]).
//! `volume` is the index of the mount the frame is about (0 for control
//! frames). `flags` must be 0: a non-zero value means a newer peer or a
//! desynchronised stream, and is rejected rather than guessed at.
//!
//! | kind | name     | direction  | payload                                   |
//! |------|----------|------------|-------------------------------------------|
//! | 1    | REQUEST  | guest→host | one FUSE request as read from /dev/fuse   |
//! | 2    | REPLY    | host→guest | one FUSE reply (fuse_out_header + body)   |
//! | 3    | QUIESCE  | host→guest | empty                                     |
//! | 4    | QUIESCED | guest→host | empty                                     |
//! | 5    | RESUME   | host→guest | 1 byte: `resend` (0 or 1)                 |
//!
//! Why QUIESCE exists: forkvm snapshots a running guest, and the host server's
//! in-memory state is not part of the snapshot. Before a snapshot the host
//! sends QUIESCE; the relay stops forwarding new requests (it keeps them in
//! guest memory) and answers QUIESCED once every forwarded request has its
//! reply, so no request is "in flight on the host" inside the snapshot.
//!
//! Why RESUME carries `resend`: a server instance that just connected (a fork
//! child's, or a restarted daemon's) has never seen the requests that the
//! relay forwarded to its predecessor and that are still unanswered. It sends
//! RESUME(resend=1) as its very first frame; the relay re-sends every
//! unanswered request in the order they were first sent, then the held ones.
//! A reply for a request that is no longer outstanding (a duplicate after a
//! resend) is dropped by the relay. The server that sent QUIESCE continues
//! with RESUME(resend=0).

use std::io::{self, Read, Write};

/// Largest `len` accepted: a 1 MiB FUSE write plus headers fits many times
/// over; anything bigger is corruption and must not become an allocation.
pub const MAX_FRAME: u32 = 4 * 1024 * 1024 + 64;

/// Bytes of `len`.
const LEN_BYTES: usize = 4;
/// Bytes of kind + volume + flags.
const HEAD_BYTES: usize = 4;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameKind {
    /// A raw FUSE request, guest → host.
    Request = 1,
    /// A raw FUSE reply, host → guest.
    Reply = 2,
    /// Stop forwarding new requests; answer QUIESCED when drained.
    Quiesce = 3,
    /// Every forwarded request has been answered.
    Quiesced = 4,
    /// Forward again; payload byte 0 is `resend`.
    Resume = 5,
}

impl FrameKind {
    fn from_u8(b: u8) -> Option<FrameKind> {
        Some(match b {
            1 => FrameKind::Request,
            2 => FrameKind::Reply,
            3 => FrameKind::Quiesce,
            4 => FrameKind::Quiesced,
            5 => FrameKind::Resume,
            _ => return None,
        })
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolFrame {
    /// The frame kind.
    pub kind: FrameKind,
    /// The volume (mount) index.
    pub volume: u8,
    /// The payload (raw FUSE bytes for REQUEST/REPLY).
    pub payload: Vec<u8>,
}

impl VolFrame {
    /// The `resend` flag of a RESUME frame (validated on decode).
    pub fn resend(&self) -> bool {
        self.kind == FrameKind::Resume && self.payload.first() == Some(&1)
    }
}

/// A frame that cannot be decoded; the stream is unusable after it.
#[derive(Debug, thiserror::Error)]
pub enum VolFrameError {
    /// `len` is below the 4 bytes of kind/volume/flags.
    #[error("volume frame too short: length {0} (at least 4)")]
    Short(u32),
    /// `len` is over [`MAX_FRAME`].
    #[error("volume frame too long: length {0} (at most {MAX_FRAME})")]
    TooLong(u32),
    /// The kind byte is not 1..=5.
    #[error("unknown volume frame kind {0}")]
    UnknownKind(u8),
    /// The flags field is not 0.
    #[error("volume frame flags {0:#x} are not 0")]
    BadFlags(u16),
    /// A control frame has the wrong payload (QUIESCE/QUIESCED take none,
    /// RESUME exactly one byte 0 or 1).
    #[error("volume frame kind {0:?} has a bad payload of {1} bytes")]
    BadPayload(FrameKind, usize),
    /// The stream ended inside a frame.
    #[error("volume port closed in the middle of a frame")]
    Truncated,
    /// Reading or writing the port failed.
    #[error("volume port I/O")]
    Io(#[source] io::Error),
}

/// Encodes one frame.
pub fn encode(kind: FrameKind, volume: u8, payload: &[u8]) -> Vec<u8> {
    let len = (HEAD_BYTES + payload.len()) as u32;
    let mut out = Vec::with_capacity(LEN_BYTES + len as usize);
    out.extend_from_slice(&len.to_le_bytes());
    out.push(kind as u8);
    out.push(volume);
    out.extend_from_slice(&0u16.to_le_bytes());
    out.extend_from_slice(payload);
    out
}

/// Checks `len` and the 4 head bytes, giving (kind, volume).
fn check_head(len: u32, head: [u8; 4]) -> Result<(FrameKind, u8), VolFrameError> {
    if len < HEAD_BYTES as u32 {
        return Err(VolFrameError::Short(len));
    }
    if len > MAX_FRAME {
        return Err(VolFrameError::TooLong(len));
    }
    let kind = FrameKind::from_u8(head[0]).ok_or(VolFrameError::UnknownKind(head[0]))?;
    let flags = u16::from_le_bytes([head[2], head[3]]);
    if flags != 0 {
        return Err(VolFrameError::BadFlags(flags));
    }
    Ok((kind, head[1]))
}

fn check_payload(kind: FrameKind, payload: &[u8]) -> Result<(), VolFrameError> {
    let ok = match kind {
        FrameKind::Quiesce | FrameKind::Quiesced => payload.is_empty(),
        FrameKind::Resume => payload.len() == 1 && payload[0] <= 1,
        FrameKind::Request | FrameKind::Reply => true,
    };
    if ok {
        Ok(())
    } else {
        Err(VolFrameError::BadPayload(kind, payload.len()))
    }
}

/// Decodes the first frame of `buf`: `Ok(None)` when more bytes are needed,
/// else the frame and how many bytes it used.
pub fn decode(buf: &[u8]) -> Result<Option<(VolFrame, usize)>, VolFrameError> {
    if buf.len() < LEN_BYTES + HEAD_BYTES {
        // A short length can be rejected before the head arrives.
        if buf.len() >= LEN_BYTES {
            let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
            if len < HEAD_BYTES as u32 {
                return Err(VolFrameError::Short(len));
            }
        }
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]);
    let (kind, volume) = check_head(len, [buf[4], buf[5], buf[6], buf[7]])?;
    let total = LEN_BYTES + len as usize;
    if buf.len() < total {
        return Ok(None);
    }
    let payload = buf[LEN_BYTES + HEAD_BYTES..total].to_vec();
    check_payload(kind, &payload)?;
    Ok(Some((
        VolFrame {
            kind,
            volume,
            payload,
        },
        total,
    )))
}

/// Reads one frame. `Ok(None)` is a clean end of stream (0 bytes read at a
/// frame boundary: on a virtio-serial port, the host side closed).
pub fn read_frame(r: &mut impl Read) -> Result<Option<VolFrame>, VolFrameError> {
    let mut first = [0u8; LEN_BYTES + HEAD_BYTES];
    let mut got = 0;
    while got < first.len() {
        match r.read(&mut first[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(VolFrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(VolFrameError::Io(e)),
        }
    }
    let len = u32::from_le_bytes([first[0], first[1], first[2], first[3]]);
    let (kind, volume) = check_head(len, [first[4], first[5], first[6], first[7]])?;
    let mut payload = vec![0u8; len as usize - HEAD_BYTES];
    r.read_exact(&mut payload).map_err(|e| {
        if e.kind() == io::ErrorKind::UnexpectedEof {
            VolFrameError::Truncated
        } else {
            VolFrameError::Io(e)
        }
    })?;
    check_payload(kind, &payload)?;
    Ok(Some(VolFrame {
        kind,
        volume,
        payload,
    }))
}

/// Writes one frame with a single `write_all`, so that writers sharing a
/// port under a mutex never interleave partial frames.
pub fn write_frame(
    w: &mut impl Write,
    kind: FrameKind,
    volume: u8,
    payload: &[u8],
) -> io::Result<()> {
    w.write_all(&encode(kind, volume, payload))
}

#[cfg(feature = "relay")]
#[path = "volume_relay.rs"]
pub mod relay;

#[cfg(feature = "relay")]
pub use relay::{mount_fuse, Relay};

#[cfg(test)]
#[path = "volume_tests.rs"]
mod tests;
