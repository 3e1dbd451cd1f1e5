//! Bodies of the process operations: background processes and PTYs
//! (`/v1/sandboxes/{id}/processes`).
//!
//! A process started here belongs to the sandbox's guest agent, not to the
//! request: it keeps running when the client goes away, its last 1 MiB of
//! output is kept, and every attach replays that before following it live.
//! A branch's children inherit the running processes with their buffered
//! output. A process is named in paths by its pid or by the tag it was
//! started with ([`ProcessRef`]).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::ErrorDetail;

/// A terminal size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PtySize {
    /// Columns (1-1000).
    pub cols: u16,
    /// Rows (1-1000).
    pub rows: u16,
}

/// The largest terminal side accepted.
pub const MAX_PTY_SIDE: u16 = 1000;

/// `POST /v1/sandboxes/{id}/processes`: start a background process.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct StartProcess {
    /// Program and arguments; `argv[0]` is looked up on the guest's PATH.
    /// Empty: the image's default command (its `Entrypoint` and `Cmd`).
    #[serde(default)]
    pub argv: Vec<String>,
    /// Extra environment variables, on top of the image's `Env`, the
    /// sandbox's `env` and the agent's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// Working directory (default: the image's `WorkingDir`, else `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Run as this user: `name`, `uid`, `name:group` or `uid:gid`
    /// (default: the image's `User`, else root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// A name to address the process by instead of its pid, unique among
    /// running processes: 1-64 letters, digits, `.`, `_` or `-`, not all
    /// digits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// Run it on a new PTY of this size: its stdin, stdout and stderr are
    /// the terminal, output arrives as `pty` events, and
    /// `POST .../stdin` types into it. TERM is `xterm-256color`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
    /// Give it a stdin pipe to write with `POST .../stdin` (and close with
    /// `DELETE .../stdin`); otherwise its stdin is `/dev/null`. A PTY
    /// always has one.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stdin: bool,
    /// Stream the process's events as NDJSON ([`ProcessEvent`]) until it
    /// ends, instead of answering at once with its pid. A client that
    /// disconnects stops the stream, not the process.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stream: bool,
}

/// A started process (`POST /v1/sandboxes/{id}/processes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ProcessStarted {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// A running background process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Process {
    pub pid: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The program and its arguments.
    pub argv: Vec<String>,
    /// The environment it was given (on top of the agent's).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    /// Its PTY's size, if it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pty: Option<PtySize>,
}

/// `GET /v1/sandboxes/{id}/processes`: the running processes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<Process>,
}

/// One line of a process stream (newline-delimited JSON): the stream of a
/// `POST .../processes` with `stream: true`, or an attach
/// (`GET .../processes/{process}/output`), which first replays the output
/// the sandbox kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ProcessEvent {
    /// The first line: the stream follows process `pid`.
    Start { pid: u32 },
    /// Standard output, base64. `lost` bytes were dropped just before this
    /// chunk (older than the kept 1 MiB, or produced faster than read).
    Stdout {
        data: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        lost: u64,
    },
    /// Standard error, base64.
    Stderr {
        data: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        lost: u64,
    },
    /// The terminal's output, base64 (a process with a PTY).
    Pty {
        data: String,
        #[serde(default, skip_serializing_if = "is_zero")]
        lost: u64,
    },
    /// Nothing happened for a while; the stream is alive.
    Keepalive,
    /// The process ended: the last line of a stream that followed it to
    /// its end.
    End {
        /// The exit code, or -1 when a signal killed it.
        exit_code: i32,
        /// It exited by itself (false: killed by a signal).
        exited: bool,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// `exit status 3`, `signal: killed`, ...
        status: String,
        /// Why the sandbox lost track of it, if it did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    /// The stream failed (the guest went away, the sandbox stopped...); the
    /// last line. The process may still be running.
    Error { error: ErrorDetail },
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// `POST /v1/sandboxes/{id}/processes/{process}/signal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalProcess {
    /// The signal number (1-64), e.g. 15 for SIGTERM, 2 for SIGINT, 9 for
    /// SIGKILL. It goes to the process's whole group.
    pub signal: i32,
}

/// How a path names a process: digits are a pid, anything else a tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessRef {
    Pid(u32),
    Tag(String),
}

impl ProcessRef {
    /// Parse a path segment.
    pub fn parse(s: &str) -> Result<ProcessRef, String> {
        if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
            return match s.parse::<u32>() {
                Ok(p) if p > 0 => Ok(ProcessRef::Pid(p)),
                _ => Err(format!("{s:?} is not a pid (1 to {})", u32::MAX)),
            };
        }
        check_tag(s)?;
        Ok(ProcessRef::Tag(s.to_string()))
    }
}

impl std::fmt::Display for ProcessRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProcessRef::Pid(p) => write!(f, "{p}"),
            ProcessRef::Tag(t) => write!(f, "{t}"),
        }
    }
}

/// Whether `tag` may name a process: 1-64 letters, digits, `.`, `_` or
/// `-`, and not all digits (that would read as a pid).
pub fn check_tag(tag: &str) -> Result<(), String> {
    if tag.is_empty() || tag.len() > 64 {
        return Err(format!(
            "a process tag has 1 to 64 characters (got {})",
            tag.len()
        ));
    }
    if !tag
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "process tag {tag:?} may hold only letters, digits, `.`, `_` and `-`"
        ));
    }
    if tag.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "process tag {tag:?} is all digits, which names a pid; add a letter"
        ));
    }
    Ok(())
}

/// A signal's number from its name (`TERM`, `SIGTERM`, `term`) or number.
pub fn signal_number(s: &str) -> Option<i32> {
    if let Ok(n) = s.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let up = s.to_ascii_uppercase();
    let name = up.strip_prefix("SIG").unwrap_or(&up);
    Some(match name {
        "HUP" => 1,
        "INT" => 2,
        "QUIT" => 3,
        "ILL" => 4,
        "TRAP" => 5,
        "ABRT" => 6,
        "BUS" => 7,
        "FPE" => 8,
        "KILL" => 9,
        "USR1" => 10,
        "SEGV" => 11,
        "USR2" => 12,
        "PIPE" => 13,
        "ALRM" => 14,
        "TERM" => 15,
        "CHLD" => 17,
        "CONT" => 18,
        "STOP" => 19,
        "TSTP" => 20,
        "TTIN" => 21,
        "TTOU" => 22,
        "WINCH" => 28,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_refs_and_tags() {
        assert_eq!(ProcessRef::parse("42"), Ok(ProcessRef::Pid(42)));
        assert_eq!(
            ProcessRef::parse("web-1"),
            Ok(ProcessRef::Tag("web-1".into()))
        );
        assert!(ProcessRef::parse("0").is_err());
        assert!(ProcessRef::parse("99999999999").is_err());
        assert!(ProcessRef::parse("").is_err());
        assert!(ProcessRef::parse("a b").is_err());
        assert!(check_tag(&"x".repeat(65)).is_err());
        assert!(check_tag("123").is_err());
        assert_eq!(signal_number("TERM"), Some(15));
        assert_eq!(signal_number("sigkill"), Some(9));
        assert_eq!(signal_number("2"), Some(2));
        assert_eq!(signal_number("0"), None);
        assert_eq!(signal_number("NOPE"), None);
    }

    #[test]
    fn events_are_tagged_and_requests_strict() {
        let e = ProcessEvent::Stdout {
            data: "aGk=".into(),
            lost: 0,
        };
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"type":"stdout","data":"aGk="}"#
        );
        assert!(serde_json::from_str::<StartProcess>(r#"{"argv":["x"],"tty":true}"#).is_err());
        assert!(serde_json::from_str::<PtySize>(r#"{"cols":1,"rows":2,"x":0}"#).is_err());
    }
}
