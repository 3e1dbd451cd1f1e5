//! Users and groups of the guest image, for `exec.user` and
//! `put_archive.owner`.
//!
//! The agent is linked statically and must not use NSS (see [`crate::sys`]),
//! and images can be anything — glibc, musl, busybox, distroless with no
//! /etc/passwd at all — so the two files are read here:
//!
//! * `/etc/passwd`: `name:password:uid:gid:gecos:home:shell`;
//! * `/etc/group`: `name:password:gid:member,member,...`.
//!
//! Blank lines, `#` comments, NIS `+`/`-` lines and corrupt lines (too few
//! fields, an empty name, an id that is not a number below 2^32-1) are
//! skipped, as libc does. The first entry with a matching name or id wins.
//!
//! A user is named in the OCI forms `name`, `uid`, `name:group`, `uid:gid`,
//! `uid:group` and `name:gid`. An all-digit user or group is an id, used even
//! without an entry. Without a group, the user's primary group from
//! /etc/passwd (0 for a uid without an entry) and every group that lists the
//! user as a member are used, as initgroups(3) does; with a group, that group
//! alone (as runc does). The home directory is the passwd entry's, or `/`.

use std::io::{self, Read};
use std::path::Path;

use forkvm_agent_protocol::{ERR_INVALID, ERR_IO};

use crate::serve::ReqError;

/// Never read more of /etc/passwd or /etc/group than this.
const MAX_FILE: u64 = 16 << 20;

/// One /etc/passwd line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passwd {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// One /etc/group line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// Who a process runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    /// Supplementary groups (the primary group included).
    pub groups: Vec<u32>,
    pub home: String,
}

fn invalid(message: String) -> ReqError {
    ReqError {
        code: ERR_INVALID,
        message,
    }
}

/// An id field: decimal, below 2^32-1 ((uid_t)-1 means "no change" to the
/// set*id calls).
fn id(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse::<u32>().ok().filter(|&v| v != u32::MAX)
}

/// The fields of a line worth parsing, or None for comments and the like.
fn fields(line: &str) -> Option<Vec<&str>> {
    let line = line.trim_end_matches('\r');
    if line.trim().is_empty() || line.starts_with(['#', '+', '-']) {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f[0].is_empty() {
        return None;
    }
    Some(f)
}

/// Parse /etc/passwd, skipping what cannot be used.
pub fn parse_passwd(text: &str) -> Vec<Passwd> {
    text.lines()
        .filter_map(fields)
        .filter(|f| f.len() >= 7)
        .filter_map(|f| {
            Some(Passwd {
                name: f[0].to_string(),
                uid: id(f[2])?,
                gid: id(f[3])?,
                home: f[5].to_string(),
            })
        })
        .collect()
}

/// Parse /etc/group, skipping what cannot be used.
pub fn parse_group(text: &str) -> Vec<Group> {
    text.lines()
        .filter_map(fields)
        .filter(|f| f.len() >= 4)
        .filter_map(|f| {
            Some(Group {
                name: f[0].to_string(),
                gid: id(f[2])?,
                members: f[3]
                    .split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// The text of `etc/<name>`; None if it does not exist.
pub(crate) fn read_etc(etc: &Path, name: &str) -> Result<Option<String>, ReqError> {
    let path = etc.join(name);
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => {
            return Err(ReqError {
                code: ERR_IO,
                message: format!("cannot read {}: {e}", path.display()),
            })
        }
    };
    let mut bytes = Vec::new();
    f.by_ref()
        .take(MAX_FILE)
        .read_to_end(&mut bytes)
        .map_err(|e| ReqError {
            code: ERR_IO,
            message: format!("cannot read {}: {e}", path.display()),
        })?;
    Ok(Some(String::from_utf8_lossy(&bytes).into_owned()))
}

/// Resolve an OCI user spec against the passwd and group files in `etc`
/// (the guest's `/etc`).
pub fn resolve(spec: &str, etc: &Path) -> Result<Credentials, ReqError> {
    let (user, group) = match spec.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (spec, None),
    };
    if user.is_empty() || group.is_some_and(|g| g.is_empty() || g.contains(':')) {
        return Err(invalid(format!(
            "invalid user {spec:?}: expected name, uid, name:group or uid:gid"
        )));
    }
    let numeric = |s: &str, what: &str| -> Result<Option<u32>, ReqError> {
        if !s.bytes().all(|b| b.is_ascii_digit()) {
            return Ok(None);
        }
        id(s)
            .map(Some)
            .ok_or_else(|| invalid(format!("invalid user {spec:?}: {what} {s} is out of range")))
    };
    let uid_arg = numeric(user, "uid")?;
    let passwd_text = read_etc(etc, "passwd")?;
    let users = passwd_text.as_deref().map(parse_passwd).unwrap_or_default();
    let entry = match uid_arg {
        Some(uid) => users.iter().find(|p| p.uid == uid),
        None => Some(users.iter().find(|p| p.name == user).ok_or_else(|| {
            invalid(match passwd_text {
                Some(_) => format!("user {user:?} does not exist in the image's /etc/passwd"),
                None => format!(
                    "user {user:?} cannot be resolved: the image has no /etc/passwd (use a numeric uid)"
                ),
            })
        })?),
    };
    let uid = uid_arg.or(entry.map(|e| e.uid)).unwrap_or(0);
    let home = match entry {
        Some(e) if !e.home.is_empty() => e.home.clone(),
        _ => "/".to_string(),
    };
    let groups_of = || -> Result<Vec<Group>, ReqError> {
        Ok(read_etc(etc, "group")?
            .as_deref()
            .map(parse_group)
            .unwrap_or_default())
    };
    let (gid, groups) = match group {
        Some(g) => {
            let gid = match numeric(g, "gid")? {
                Some(gid) => gid,
                None => {
                    groups_of()?
                        .iter()
                        .find(|gr| gr.name == g)
                        .ok_or_else(|| {
                            invalid(format!(
                                "group {g:?} does not exist in the image's /etc/group"
                            ))
                        })?
                        .gid
                }
            };
            (gid, vec![gid])
        }
        None => {
            let gid = entry.map_or(0, |e| e.gid);
            let mut groups = vec![gid];
            if let Some(e) = entry {
                for gr in groups_of()? {
                    if gr.members.contains(&e.name) && !groups.contains(&gr.gid) {
                        groups.push(gr.gid);
                    }
                }
            }
            (gid, groups)
        }
    };
    Ok(Credentials {
        uid,
        gid,
        groups,
        home,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;

    const PASSWD: &str = "\
# comment line
root:x:0:0:root:/root:/bin/bash

+nisuser::::::
-excluded:x:7:7::/:
broken line without colons
short:x:1:1
nonnum:x:abc:1::/home/nonnum:/bin/sh
toobig:x:4294967295:1::/home/toobig:/bin/sh
:x:5:5::/nameless:/bin/sh
node:x:1000:1000:Node,,,:/home/node:/bin/sh\r
nohome:x:1001:1001:::/bin/sh
node:x:1002:1002::/home/dup:/bin/sh
";
    const GROUP: &str = "\
root:x:0:
# staff
users:x:100:node, app
node:x:1000:
docker:x:999:node
dup:x:1000:node
bad:x:notanumber:node
short:x
audio:x:29:other
";

    fn etc(passwd: Option<&str>, group: Option<&str>) -> std::path::PathBuf {
        let d = temp_dir("users");
        if let Some(p) = passwd {
            std::fs::write(d.join("passwd"), p).unwrap();
        }
        if let Some(g) = group {
            std::fs::write(d.join("group"), g).unwrap();
        }
        d
    }

    fn creds(uid: u32, gid: u32, groups: &[u32], home: &str) -> Credentials {
        Credentials {
            uid,
            gid,
            groups: groups.to_vec(),
            home: home.into(),
        }
    }

    #[test]
    fn parsing_skips_comments_and_corrupt_lines() {
        let users = parse_passwd(PASSWD);
        let names: Vec<_> = users.iter().map(|u| (u.name.as_str(), u.uid)).collect();
        assert_eq!(
            names,
            [
                ("root", 0),
                ("node", 1000),
                ("nohome", 1001),
                ("node", 1002)
            ]
        );
        assert_eq!(users[1].home, "/home/node");
        let groups = parse_group(GROUP);
        let names: Vec<_> = groups.iter().map(|g| (g.name.as_str(), g.gid)).collect();
        assert_eq!(
            names,
            [
                ("root", 0),
                ("users", 100),
                ("node", 1000),
                ("docker", 999),
                ("dup", 1000),
                ("audio", 29)
            ]
        );
        assert_eq!(groups[1].members, ["node", "app"]);
        assert!(groups[0].members.is_empty());
        assert!(parse_passwd("").is_empty());
        assert!(parse_group("\n\n#\n").is_empty());
    }

    #[test]
    fn every_oci_form_resolves() {
        let d = etc(Some(PASSWD), Some(GROUP));
        let r = |s: &str| resolve(s, &d);
        // By name: primary group, then memberships in file order, no dups.
        assert_eq!(
            r("node").unwrap(),
            creds(1000, 1000, &[1000, 100, 999], "/home/node")
        );
        // By uid with an entry: the same.
        assert_eq!(
            r("1000").unwrap(),
            creds(1000, 1000, &[1000, 100, 999], "/home/node")
        );
        // By uid without an entry: gid 0, home /.
        assert_eq!(r("4242").unwrap(), creds(4242, 0, &[0], "/"));
        // Explicit groups replace the memberships.
        assert_eq!(
            r("node:users").unwrap(),
            creds(1000, 100, &[100], "/home/node")
        );
        assert_eq!(r("node:55").unwrap(), creds(1000, 55, &[55], "/home/node"));
        assert_eq!(r("4242:4343").unwrap(), creds(4242, 4343, &[4343], "/"));
        assert_eq!(r("4242:docker").unwrap(), creds(4242, 999, &[999], "/"));
        // An empty home field falls back to /.
        assert_eq!(r("nohome").unwrap(), creds(1001, 1001, &[1001], "/"));
        assert_eq!(r("root").unwrap(), creds(0, 0, &[0], "/root"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn unknown_names_and_bad_specs_are_clear_errors() {
        let d = etc(Some(PASSWD), Some(GROUP));
        let msg = |s: &str| {
            let e = resolve(s, &d).unwrap_err();
            assert_eq!(e.code, ERR_INVALID, "{s}");
            e.message
        };
        assert_eq!(
            msg("nobody"),
            "user \"nobody\" does not exist in the image's /etc/passwd"
        );
        assert_eq!(
            msg("node:wheel"),
            "group \"wheel\" does not exist in the image's /etc/group"
        );
        for bad in ["", ":", ":100", "node:", "a:b:c"] {
            assert!(msg(bad).starts_with("invalid user"), "{bad}");
        }
        assert!(msg("4294967295").contains("out of range"));
        assert!(msg("1:99999999999").contains("gid 99999999999 is out of range"));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn missing_files_are_fine_for_numeric_ids() {
        let d = etc(None, None);
        assert_eq!(resolve("1000", &d).unwrap(), creds(1000, 0, &[0], "/"));
        assert_eq!(
            resolve("1000:1000", &d).unwrap(),
            creds(1000, 1000, &[1000], "/")
        );
        let e = resolve("app", &d).unwrap_err();
        assert!(e.message.contains("has no /etc/passwd"), "{}", e.message);
        let e = resolve("1000:app", &d).unwrap_err();
        assert!(e.message.contains("/etc/group"), "{}", e.message);
        // Passwd without a group file: the name resolves, no memberships.
        std::fs::write(d.join("passwd"), PASSWD).unwrap();
        assert_eq!(
            resolve("node", &d).unwrap(),
            creds(1000, 1000, &[1000], "/home/node")
        );
        // An unreadable file (here a directory) is an I/O error, not "no such user".
        std::fs::create_dir(d.join("group")).unwrap();
        assert_eq!(resolve("node", &d).unwrap_err().code, ERR_IO);
        std::fs::remove_dir_all(&d).unwrap();
    }
}
