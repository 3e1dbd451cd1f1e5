//! Turning an `exec` request into a [`Command`]: validation of argv, env and
//! cwd, and the user to run as. Shared by attached runs ([`crate::exec`])
//! and detached ones ([`crate::start`]), which add their own stdio.
//!
//! The user's credentials are applied in the child between fork and exec
//! (`pre_exec`), in the order that works for root dropping privileges:
//! setgroups, setgid, setuid. std's own `uid`/`gid` are not used because
//! std calls the `pre_exec` hooks after them, too late for setgroups.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

use forkvm_agent_protocol::{ERR_INVALID, ERR_NOT_FOUND, ERR_SPAWN};

use crate::serve::ReqError;
use crate::users::{self, Credentials};

/// Where the guest's passwd and group files are.
pub const ETC: &str = "/etc";

pub(crate) fn err(code: &'static str, message: impl Into<String>) -> ReqError {
    ReqError {
        code,
        message: message.into(),
    }
}

/// The protocol error for a failed spawn of `program`.
pub fn spawn_error(program: &str, e: &io::Error) -> ReqError {
    match e.kind() {
        io::ErrorKind::NotFound => err(ERR_NOT_FOUND, format!("executable not found: {program}")),
        io::ErrorKind::PermissionDenied => err(
            ERR_SPAWN,
            format!("cannot execute {program}: permission denied"),
        ),
        _ => err(ERR_SPAWN, format!("cannot start {program}: {e}")),
    }
}

fn check_cwd(cwd: &str) -> Result<(), ReqError> {
    match std::fs::metadata(cwd) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(err(
            ERR_SPAWN,
            format!("working directory {cwd} is not a directory"),
        )),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(err(
            ERR_SPAWN,
            format!("working directory {cwd} does not exist in the image"),
        )),
        Err(e) => Err(err(ERR_SPAWN, format!("working directory {cwd}: {e}"))),
    }
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ReqError> {
    for (k, v) in env {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(err(
                ERR_INVALID,
                format!("invalid environment variable name or value: {k:?}"),
            ));
        }
    }
    Ok(())
}

/// What to run, as decoded from the request.
pub struct Program<'a> {
    pub argv: &'a [String],
    pub env: &'a BTreeMap<String, String>,
    pub cwd: Option<&'a str>,
    pub user: Option<&'a str>,
}

/// A validated command, ready for its stdio.
#[derive(Debug)]
pub struct Prepared {
    pub cmd: Command,
    /// `argv[0]`, for error messages.
    pub program: String,
    /// Who it runs as (None: as the agent, root).
    pub creds: Option<Credentials>,
}

/// Validate `p` and build its command: program and arguments, environment
/// (the agent's own plus `env`; HOME defaults to the user's home when a user
/// is given and `env` has none), working directory (`/` by default), and the
/// user's credentials, resolved against `etc`. With `new_session` the child
/// also calls setsid() first.
pub fn prepare(p: &Program<'_>, etc: &Path, new_session: bool) -> Result<Prepared, ReqError> {
    let Some(program) = p.argv.first() else {
        return Err(err(ERR_INVALID, "argv is empty"));
    };
    if program.is_empty() || p.argv.iter().any(|a| a.contains('\0')) {
        return Err(err(
            ERR_INVALID,
            "argv[0] is empty or an argument contains a NUL byte",
        ));
    }
    check_env(p.env)?;
    let cwd = p.cwd.filter(|c| !c.is_empty()).unwrap_or("/");
    check_cwd(cwd)?;
    let creds = p.user.map(|u| users::resolve(u, etc)).transpose()?;

    let mut cmd = Command::new(program);
    cmd.args(&p.argv[1..]).envs(p.env).current_dir(cwd);
    if let Some(c) = &creds {
        if !p.env.contains_key("HOME") {
            cmd.env("HOME", &c.home);
        }
    }
    pre_exec(&mut cmd, creds.clone(), new_session);
    Ok(Prepared {
        cmd,
        program: program.clone(),
        creds,
    })
}

/// Install the child-side setup: setsid (optionally), then the credentials.
fn pre_exec(cmd: &mut Command, creds: Option<Credentials>, new_session: bool) {
    if creds.is_none() && !new_session {
        return;
    }
    // Built now: the hook must not allocate.
    let ids = creds.map(|c| {
        let groups: Vec<libc::gid_t> = c.groups;
        (groups, c.gid, c.uid)
    });
    let hook = move || -> io::Result<()> {
        if new_session {
            // SAFETY: setsid(2) takes no arguments.
            if unsafe { libc::setsid() } == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        if let Some((groups, gid, uid)) = &ids {
            // Raw system calls: in the forked child there is one thread, so
            // glibc's cross-thread set*id machinery is not wanted.
            // SAFETY: `groups` is a live Vec of gid_t; the kernel reads
            // `len` entries from its pointer.
            if unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) } == -1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: setgid(2)/setuid(2) take plain integers.
            if unsafe { libc::syscall(libc::SYS_setgid, *gid) } == -1 {
                return Err(io::Error::last_os_error());
            }
            // SAFETY: as above.
            if unsafe { libc::syscall(libc::SYS_setuid, *uid) } == -1 {
                return Err(io::Error::last_os_error());
            }
        }
        Ok(())
    };
    // SAFETY: the hook runs in the child between fork and exec; it only
    // makes system calls and builds io::Errors from errno (no allocation,
    // no locks), which is async-signal-safe.
    unsafe { cmd.pre_exec(hook) };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::tests::temp_dir;

    fn program<'a>(argv: &'a [String], env: &'a BTreeMap<String, String>) -> Program<'a> {
        Program {
            argv,
            env,
            cwd: None,
            user: None,
        }
    }

    #[test]
    fn validation_errors() {
        let env = BTreeMap::new();
        let none: Vec<String> = vec![];
        let e = prepare(&program(&none, &env), Path::new(ETC), false).unwrap_err();
        assert_eq!((e.code, e.message.as_str()), (ERR_INVALID, "argv is empty"));
        let argv = vec!["a\0b".to_string()];
        assert_eq!(
            prepare(&program(&argv, &env), Path::new(ETC), false)
                .unwrap_err()
                .code,
            ERR_INVALID
        );
        let argv = vec!["true".to_string()];
        let bad_env = BTreeMap::from([("A=B".to_string(), "x".to_string())]);
        assert_eq!(
            prepare(&program(&argv, &bad_env), Path::new(ETC), false)
                .unwrap_err()
                .code,
            ERR_INVALID
        );
        let mut p = program(&argv, &env);
        p.cwd = Some("/app/forkvm-no-such-dir");
        let e = prepare(&p, Path::new(ETC), false).unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                ERR_SPAWN,
                "working directory /app/forkvm-no-such-dir does not exist in the image"
            )
        );
        p.cwd = Some("/proc/self/status");
        let e = prepare(&p, Path::new(ETC), false).unwrap_err();
        assert_eq!(
            e.message,
            "working directory /proc/self/status is not a directory"
        );
    }

    #[test]
    fn unknown_user_is_an_error_before_anything_runs() {
        let d = temp_dir("cmd-user");
        std::fs::write(d.join("passwd"), "root:x:0:0::/root:/bin/sh\n").unwrap();
        let argv = vec!["true".to_string()];
        let env = BTreeMap::new();
        let mut p = program(&argv, &env);
        p.user = Some("ghost");
        let e = prepare(&p, &d, false).unwrap_err();
        assert_eq!(e.code, ERR_INVALID);
        assert!(
            e.message.contains("\"ghost\" does not exist"),
            "{}",
            e.message
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Run through the reaper (which would steal the status from std's
    /// own wait) and return stdout.
    fn output(mut cmd: Command) -> String {
        use std::io::Read;
        cmd.stdout(std::process::Stdio::piped());
        let (child, rx) = crate::reaper::global().unwrap().spawn(&mut cmd).unwrap();
        let mut out = String::new();
        child.stdout.unwrap().read_to_string(&mut out).unwrap();
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        out
    }

    #[test]
    fn runs_as_the_user_with_its_groups_and_home() {
        if !crate::identity::is_root() {
            eprintln!("skipped: needs root to change uid");
            return;
        }
        let d = temp_dir("cmd-creds");
        std::fs::write(d.join("passwd"), "app:x:4321:4322::/home/app:/bin/sh\n").unwrap();
        std::fs::write(d.join("group"), "extra:x:4323:app\nother:x:4324:bob\n").unwrap();
        let argv: Vec<String> = ["sh", "-c", "echo $(id -u) $(id -g) $(id -G) $HOME"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let env = BTreeMap::new();
        let mut p = program(&argv, &env);
        p.user = Some("app");
        let out = output(prepare(&p, &d, false).unwrap().cmd);
        assert_eq!(out, "4321 4322 4322 4323 /home/app\n");
        // An explicit HOME wins; an explicit group replaces the memberships.
        let env = BTreeMap::from([("HOME".to_string(), "/elsewhere".to_string())]);
        let mut p = program(&argv, &env);
        p.user = Some("4321:4324");
        let out = output(prepare(&p, &d, false).unwrap().cmd);
        assert_eq!(out, "4321 4324 4324 /elsewhere\n");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
