//! forkvm volumes: host directories served to guests over FUSE.
//!
//! # Design
//!
//! The guest mounts each volume with FUSE (`fuse.forkvm`). A relay in the
//! guest agent ([`forkvm_agent_protocol::volume`]) forwards the kernel's raw
//! FUSE requests over a virtio-serial port; this crate is the host end: it
//! decodes each request (a hand-written subset of the FUSE ABI, see `abi`),
//! performs it against the host directory and sends the raw reply back.
//!
//! ```text
//!  guest: app ─► kernel FUSE ─► /dev/fuse ─► relay ─┐
//!                                                   │ volume port (frames)
//!  host:  QEMU unix socket ─► serve(): reader ─► workers ─► host directory
//! ```
//!
//! # Surviving snapshot, fork and daemon restart
//!
//! A snapshot copies the guest's memory: its FUSE state (nodeids, open file
//! handles) and the relay's queues. The host server's memory is not
//! copied, so a new server instance (a fork child's, a restarted daemon's)
//! must understand nodeids and handles it never handed out:
//!
//! * The node table (nodeid → parent, name) is journaled on every change
//!   (`journal`, `table`); a new server replays it. The negotiated INIT
//!   parameters are journaled too, since a restored guest never sends INIT
//!   again.
//! * File handles are self-describing (`nodeid << 8 | open flags`, see
//!   `security`), so a new server reopens a file lazily by its path on the
//!   first READ/WRITE. A file deleted while open has no path any more: the
//!   new server answers ESTALE (and logs it).
//! * Directory offsets are the host's `d_off` cookies, valid for a freshly
//!   opened directory fd.
//! * Before a snapshot the daemon calls [`ServerHandle::quiesce`]: the relay
//!   stops forwarding and answers once nothing is in flight, then
//!   [`ServerHandle::save_journals`] writes a compacted journal next to the
//!   snapshot. A new server starts with that journal and sends
//!   RESUME(resend=1); the relay re-sends anything still unanswered.
//! * A `copy` fork gives the child [`copy_tree`] of the volume (reflinked
//!   where possible) and the saved journal: the child's open handles then
//!   refer to the copy, because paths, not inodes, are what is journaled.
//!
//! # Using it (the daemon's side)
//!
//! ```text
//!  boot / restore:  h = serve(port_stream, vec![VolumeConfig{..}], sandbox_id)
//!  snapshot:        h.quiesce(t)?; h.save_journals(snapdir)?; <snapshot VM>; h.resume()
//!  fork child:      copy the saved <i>.journal to the child's journal path
//!                   (`copy` fork: copy_tree(root, child_root) taken while the
//!                   source was quiesced), then serve() on the child's port
//!  daemon restart:  serve() again with the same journal paths
//! ```
//!
//! `VolumeConfig::journal` is the live journal: it is read at start and
//! then appended to in place (and compacted in place past 16 MiB), so each
//! server instance needs its own copy. [`compact_journal`] rewrites one
//! offline. A FUSE_INIT (the guest mounted anew) resets it.
//!
//! # Limits
//!
//! * A file unlinked while open cannot be reopened by a new server: ESTALE.
//! * RENAME_EXCHANGE/WHITEOUT, xattrs, POSIX locks, ioctl, copy_file_range
//!   and READDIRPLUS are not offered (EINVAL/ENOSYS); the kernel falls
//!   back where it can (locks stay local to the guest).
//! * A cached O_PATH fd follows its inode: if the host itself moves a
//!   directory the guest has looked up, this server instance keeps serving
//!   it at its new place until the guest forgets it.
//! * Host inode numbers are shown in the guest; after a `copy` fork they
//!   change once the guest refreshes its attributes.
//!
//! # Security
//!
//! The guest is untrusted. Every host path is resolved below an fd of the
//! volume root with `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
//! RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV)`; single names use `*at` calls
//! with `AT_SYMLINK_NOFOLLOW`. Names from the guest must be one plain
//! component. Guest symlinks must not be absolute and may climb (`..`,
//! only at the start) no higher than the volume root, checked again when a
//! rename makes a link shallower (see `links`); hard links are refused,
//! and so is opening a file with more than one link (its other name may be
//! outside). Only regular files
//! and directories are opened; MKNOD only makes regular files; set-id bits
//! are stripped. A read-only volume answers EROFS to every change. Every
//! refusal is logged with the sandbox id.
//!
//! Ownership: entries show `guest_owner` in the guest; what the guest
//! creates is chowned to `host_owner` on the host; a guest chown succeeds
//! and changes nothing (so `tar x` as root works).
//!
//! Caching: FUSE_AUTO_INVAL_DATA, 1 s entry/attribute timeouts,
//! FOPEN_KEEP_CACHE, max_write 1 MiB, no writeback cache.

use std::path::PathBuf;
use std::time::Duration;

mod abi;
mod copy;
mod fs;
mod journal;
mod links;
mod ops;
mod security;
mod server;
mod table;

pub use server::{serve, ServerHandle};

/// One volume served on a port.
#[derive(Debug, Clone)]
pub struct VolumeConfig {
    /// The index the guest's relay uses for this mount.
    pub index: u8,
    /// Host directory, canonical, trusted.
    pub root: PathBuf,
    pub read_only: bool,
    /// Node table journal of this (sandbox, volume): created if missing,
    /// loaded if present.
    pub journal: PathBuf,
    /// uid, gid given on the host to everything the guest creates.
    pub host_owner: (u32, u32),
    /// uid, gid every entry shows in the guest.
    pub guest_owner: (u32, u32),
}

/// What [`copy_tree`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    /// Regular files copied.
    pub files: u64,
    /// Their total size.
    pub bytes: u64,
    /// Every regular file was reflinked (false when none were copied).
    pub reflinked: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("volume journal {path}: {why}; delete it only if the guest has remounted the volume")]
    Journal { path: PathBuf, why: String },
    #[error("volume directory {path}: {why}")]
    BadRoot { path: PathBuf, why: String },
    #[error("the guest did not answer QUIESCE within {0:?}; is the forkvm agent running its volume relay?")]
    QuiesceTimeout(Duration),
    #[error("the volume port is closed (the guest or QEMU went away)")]
    Closed,
    #[error("copy destination {0} already exists; choose a new directory")]
    DestExists(PathBuf),
    /// A bounded copy ([`copy_tree_within`]) would write past its budget.
    #[error(
        "no space left for the volume copy: {path} needs {needed} bytes and {left} remain above \
         the free-space reserve"
    )]
    NoSpace {
        path: PathBuf,
        needed: u64,
        left: u64,
    },
}

pub use copy::{copy_tree, copy_tree_within};

/// Rewrites the journal at `src` as a compacted one at `dst` (atomically):
/// only the live nodes, with their lookup counts, and the INIT parameters.
pub fn compact_journal(src: &std::path::Path, dst: &std::path::Path) -> Result<(), VolumeError> {
    let buf = std::fs::read(src).map_err(|e| VolumeError::Io {
        what: format!("reading journal {}", src.display()),
        source: e,
    })?;
    let (recs, _) = journal::decode(&buf, src)?;
    journal::write_all(dst, &table::Table::replay(&recs).snapshot())
}
