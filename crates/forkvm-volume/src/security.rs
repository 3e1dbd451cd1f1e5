//! The checks that keep a guest inside its volume, and the file handle
//! encoding. Each check is a pure function so that it is unit-tested here;
//! the server calls them before touching the host.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// A single path component from the guest: not empty, not `.`/`..`, no `/`
/// or NUL. The kernel already refuses most of these; a hostile guest kernel
/// need not.
pub fn valid_name(name: &OsStr) -> bool {
    let b = name.as_bytes();
    !b.is_empty()
        && b != b"."
        && b != b".."
        && !b.contains(&b'/')
        && !b.contains(&0)
        && b.len() <= 255
}

/// How many directories a symlink target climbs, when it has the one shape
/// a guest may create: a relative path whose `..` components all come
/// first, followed by plain names (`../../lib/x.so`, `sub/file`, `..`).
/// `None` for every other target: absolute, empty, with NUL, or with a `..`
/// after a name.
///
/// Why `..` only at the start: after a name, `..` climbs from wherever that
/// name resolved to, and a name may itself be a symlink. With `x -> .`,
/// the target `x/..` looks like it stays in its own directory, yet it
/// resolves to the directory's parent; chained (`y -> x/..`,
/// `z -> y/..`), such links reach `/`. Leading `..` only climb real
/// directories, the link's own ancestors, so how far a link reaches is
/// known from the link alone.
pub fn symlink_climb(target: &OsStr) -> Option<usize> {
    let b = target.as_bytes();
    if b.is_empty() || b[0] == b'/' || b.contains(&0) {
        return None;
    }
    let (mut climb, mut named) = (0usize, false);
    for c in b.split(|&x| x == b'/') {
        match c {
            b"" | b"." => {}
            b".." if named => return None,
            b".." => climb += 1,
            _ => named = true,
        }
    }
    Some(climb)
}

/// Whether a symlink with `target`, in a directory `depth` levels below the
/// volume root, resolves inside the volume (see [`symlink_climb`]). The
/// answer depends on where the link is, so it is asked again whenever a
/// link's depth can shrink: at creation, when a link is renamed, when a
/// directory carrying links moves up, and for every link a `copy` tree
/// takes. Absolute targets are refused outright: inside the guest they
/// would name the guest's own files, but a host process (a backup, an
/// editor) following the link would leave the volume.
pub fn symlink_target_ok(depth: usize, target: &OsStr) -> bool {
    symlink_climb(target).is_some_and(|k| k <= depth)
}

/// Drops set-user-ID and set-group-ID from a mode the guest asks for: a
/// guest-made setuid binary on the host would be a privilege escalation
/// for anyone on the host who runs it.
pub fn strip_mode(mode: u32) -> u32 {
    mode & !(libc::S_ISUID | libc::S_ISGID)
}

/// File handles are self-describing, so that a new server instance can
/// reopen a file lazily from nothing but the node table:
///
/// ```text
///  63                                8 7 6 5 4 3 2 1 0
///  +----------------------------------+-+-+-+-+-+-+---+
///  | nodeid (56 bits)                 |D|0|Y|S|I|A|acc|
///  +----------------------------------+-+-+-+-+-+-+---+
///  acc = O_ACCMODE (0 rdonly, 1 wronly, 2 rdwr), A = O_APPEND,
///  I = O_DIRECT, S = O_SYNC, Y = O_DSYNC, D = directory handle
/// ```
pub const FH_DIR: u64 = 0x80;

pub fn fh_encode(node: u64, open_flags: i32) -> u64 {
    let mut f = (open_flags & libc::O_ACCMODE) as u64 & 3;
    if open_flags & libc::O_APPEND != 0 {
        f |= 4;
    }
    if open_flags & libc::O_DIRECT != 0 {
        f |= 8;
    }
    // O_SYNC includes the O_DSYNC bit on Linux; test it first.
    if open_flags & libc::O_SYNC == libc::O_SYNC {
        f |= 16;
    } else if open_flags & libc::O_DSYNC != 0 {
        f |= 32;
    }
    node << 8 | f
}

/// (nodeid, open flags to reopen with, is a directory handle).
pub fn fh_decode(fh: u64) -> (u64, i32, bool) {
    let f = fh & 0xff;
    let mut flags = (f & 3) as i32;
    if f & 4 != 0 {
        flags |= libc::O_APPEND;
    }
    if f & 8 != 0 {
        flags |= libc::O_DIRECT;
    }
    if f & 16 != 0 {
        flags |= libc::O_SYNC;
    }
    if f & 32 != 0 {
        flags |= libc::O_DSYNC;
    }
    (fh >> 8, flags, f & FH_DIR != 0)
}

/// Whether open flags ask for writing.
pub fn wants_write(flags: i32) -> bool {
    flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        for ok in ["a", "a b", "...", ".x", "ünï"] {
            assert!(valid_name(OsStr::new(ok)), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "/", "a\0b"] {
            assert!(!valid_name(OsStr::new(bad)), "{bad:?}");
        }
        assert!(!valid_name(OsStr::new(&"x".repeat(256))));
    }

    #[test]
    fn symlink_targets() {
        let ok = |d, t: &str| symlink_target_ok(d, OsStr::new(t));
        assert!(ok(0, "x"));
        assert!(ok(0, "./x/y"));
        assert!(ok(0, "."));
        assert!(ok(2, "../../x"));
        assert!(ok(2, "./../..//x/"));
        assert!(ok(1, ".."));
        assert!(!ok(2, "../../../x"));
        assert!(!ok(0, "../x"));
        assert!(!ok(0, "x/../../y"));
        assert!(!ok(5, "/etc"));
        assert!(!ok(5, ""));
        assert!(!ok(5, "a\0b"));
        // `..` after a name is refused at any depth: with `x -> .` next to
        // it, `x/..` is the parent of the link's directory.
        assert!(!ok(0, "x/.."));
        assert!(!ok(9, "x/../y"));
        assert!(!ok(9, "../a/../b"));
        assert_eq!(symlink_climb(OsStr::new("../../a/b")), Some(2));
        assert_eq!(symlink_climb(OsStr::new("a/b")), Some(0));
        assert_eq!(symlink_climb(OsStr::new("a/../b")), None);
    }

    #[test]
    fn modes() {
        assert_eq!(strip_mode(0o106755), 0o100755);
        assert_eq!(strip_mode(0o2775), 0o775);
        assert_eq!(strip_mode(0o1777), 0o1777);
    }

    #[test]
    fn file_handles() {
        for flags in [
            libc::O_RDONLY,
            libc::O_WRONLY | libc::O_APPEND,
            libc::O_RDWR | libc::O_SYNC,
            libc::O_RDWR | libc::O_DSYNC | libc::O_DIRECT,
        ] {
            let fh = fh_encode(0x00ab_cdef_0123_4567, flags);
            let (node, back, dir) = fh_decode(fh);
            assert_eq!(node, 0x00ab_cdef_0123_4567);
            assert_eq!(back, flags, "{flags:#o}");
            assert!(!dir);
        }
        // Creation-time flags are not part of a handle.
        let (_, back, _) = fh_decode(fh_encode(2, libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC));
        assert_eq!(back, libc::O_WRONLY);
        assert!(fh_decode(5 << 8 | FH_DIR).2);
        assert!(wants_write(libc::O_RDONLY | libc::O_TRUNC));
        assert!(!wants_write(libc::O_RDONLY));
    }
}
