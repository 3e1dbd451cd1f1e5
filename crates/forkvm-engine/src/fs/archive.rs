//! Normalising an archive a guest sends before a client sees it.
//!
//! `get_archive` is answered by the agent, which runs in the guest: a
//! hostile guest can send any tar at all. A client that extracts it (GNU
//! tar, Python's `tarfile`, our own CLI) must never be made to write
//! outside its target directory. So the daemon does not pass the guest's
//! bytes through: it reads every member with the shared tar reader
//! ([`forkvm_agent_protocol::tar::entries`], which applies PAX `path` /
//! `linkpath` records and GNU `L`/`K` long names, the places a naive check
//! misses a `..`) and writes a new archive with its own writer, member by
//! member. Only names that passed the rules below are ever written, and
//! every header of the output is one this module made.
//!
//! # The rules
//!
//! * **Names are relative and clean.** Leading `/` are stripped (the agent
//!   names members by their absolute guest path without it); empty and `.`
//!   components are dropped. A name with a `..` component or a NUL byte,
//!   or nothing left after cleaning, drops the member.
//! * **Nothing below a symlink.** Once a member is a symlink, a later member
//!   with the same name or below it is dropped: extracting `a -> /etc` and
//!   then `a/passwd` (or a file `a`, which Python's `tarfile` opens through
//!   the link) would write through the link.
//! * **Kinds.** Regular files, directories and symlinks pass. The agent
//!   never sends hard links, devices or FIFOs, so these are dropped (a hard
//!   link's target names a path on the client's side; a device node made
//!   by a root client is a way into its machine).
//! * **Symlink targets pass unchanged** (without NUL, not empty): they are
//!   the guest's content (`/etc/localtime -> /usr/share/zoneinfo/UTC`), and
//!   a link alone writes nothing; the rule above keeps this archive from
//!   writing through one.
//! * **Modes lose set-user-ID and set-group-ID**, so a client extracting as
//!   root with permissions preserved makes no set-id program of the
//!   guest's.
//!
//! Dropped members are counted and reported to the caller, which logs them.

use forkvm_agent_protocol::tar::{entries, Kind, Meta, TarError, Writer};

/// An archive after [`normalise`].
#[derive(Debug)]
pub struct Normalised {
    pub tar: Vec<u8>,
    /// The members left out: (name as sent, lossy; why).
    pub dropped: Vec<(String, &'static str)>,
}

/// The clean, relative form of a member name, or `None` when it has none.
pub fn clean_name(raw: &[u8]) -> Option<Vec<u8>> {
    if raw.contains(&0) {
        return None;
    }
    let mut out = Vec::with_capacity(raw.len());
    for c in raw.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return None,
            _ => {
                if !out.is_empty() {
                    out.push(b'/');
                }
                out.extend_from_slice(c);
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Whether `name` is `link` or lies below it.
fn at_or_below(name: &[u8], link: &[u8]) -> bool {
    name.strip_prefix(link)
        .is_some_and(|rest| rest.is_empty() || rest[0] == b'/')
}

/// Rewrites `tar` by the rules of the module doc. Fails only when the
/// archive cannot be read at all.
pub fn normalise(tar: &[u8]) -> Result<Normalised, TarError> {
    let mut w = Writer::new();
    let mut dropped = Vec::new();
    let mut links: Vec<Vec<u8>> = Vec::new();
    for e in entries(tar) {
        let e = e?;
        let shown = || String::from_utf8_lossy(&e.path).into_owned();
        let why = match e.kind {
            Kind::File | Kind::Dir | Kind::Symlink => None,
            Kind::HardLink => Some("a hard link"),
            Kind::CharDev | Kind::BlockDev => Some("a device"),
            Kind::Fifo => Some("a FIFO"),
        };
        if let Some(why) = why {
            dropped.push((shown(), why));
            continue;
        }
        let Some(name) = clean_name(&e.path) else {
            dropped.push((shown(), "a name with `..` or NUL, or no name"));
            continue;
        };
        if links.iter().any(|l| at_or_below(&name, l)) {
            dropped.push((shown(), "at or below a symlink of the archive"));
            continue;
        }
        if e.kind == Kind::Symlink {
            if e.link.is_empty() || e.link.contains(&0) {
                dropped.push((shown(), "a symlink with an empty or NUL target"));
                continue;
            }
            links.push(name.clone());
        }
        let meta = Meta {
            mode: e.mode & 0o7777 & !0o6000,
            uid: e.uid,
            gid: e.gid,
            mtime: e.mtime,
            dev: (0, 0),
        };
        let link: &[u8] = if e.kind == Kind::Symlink {
            &e.link
        } else {
            b""
        };
        w.entry(e.kind, &name, link, &meta, e.data(tar));
    }
    Ok(Normalised {
        tar: w.finish(),
        dropped,
    })
}

#[cfg(test)]
#[path = "archive_tests.rs"]
mod tests;
