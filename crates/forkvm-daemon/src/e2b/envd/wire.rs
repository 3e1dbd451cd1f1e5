//! The messages of envd's `process.Process` and `filesystem.Filesystem`
//! services in proto3's JSON mapping, which is what the SDKs send
//! (protobuf-es with `useBinaryFormat: false`, and the Python SDK's JSON
//! codec):
//!
//! * field names are lowerCamelCase on output; parsers accept the
//!   proto's snake_case names too, so both are accepted here;
//! * `bytes` are standard base64, `int64` a decimal string, enums their
//!   value names (numbers are accepted on input);
//! * a `oneof` is whichever one of its fields is present
//!   (`{"event": {"data": {"stdout": "aGk="}}}`);
//! * a `google.protobuf.Timestamp` is an RFC 3339 string.
//!
//! Unknown fields are ignored rather than refused, as proto3 JSON parsers
//! do by default: a newer SDK may send fields this envd does not know, and
//! the version it reports ([`super::ENVD_VERSION`]) is what keeps it from
//! relying on them.

use std::collections::BTreeMap;

use base64::Engine;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// `bytes` fields: base64 both ways.
mod b64 {
    use super::*;

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<u8>>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| {
            // Proto JSON accepts URL-safe base64 and missing padding too.
            let t = s.trim_end_matches('=').replace('-', "+").replace('_', "/");
            base64::engine::general_purpose::STANDARD_NO_PAD
                .decode(t)
                .map_err(serde::de::Error::custom)
        })
        .transpose()
    }
}

// ---- process.Process ---------------------------------------------------

#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize, PartialEq)]
pub struct PtySize {
    #[serde(default)]
    pub cols: u32,
    #[serde(default)]
    pub rows: u32,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct Pty {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<PtySize>,
}

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
pub struct ProcessConfig {
    #[serde(default)]
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `oneof selector { uint32 pid; string tag; }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ProcessSelector {
    #[serde(default)]
    pub pid: Option<u32>,
    #[serde(default)]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StartRequest {
    #[serde(default)]
    pub process: Option<ProcessConfig>,
    #[serde(default)]
    pub pty: Option<Pty>,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub stdin: Option<bool>,
}

/// `ConnectRequest`, `CloseStdinRequest`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct SelectRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
}

/// `oneof input { bytes stdin; bytes pty; }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ProcessInput {
    #[serde(default, with = "b64")]
    pub stdin: Option<Vec<u8>>,
    #[serde(default, with = "b64")]
    pub pty: Option<Vec<u8>>,
}

impl ProcessInput {
    /// The bytes, whichever field carried them.
    pub fn bytes(self) -> Vec<u8> {
        self.stdin.or(self.pty).unwrap_or_default()
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct SendInputRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub input: Option<ProcessInput>,
}

/// `enum Signal`: by name or number.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum SignalValue {
    Name(String),
    Number(i32),
}

impl SignalValue {
    /// The signal number, for the two the enum names.
    pub fn number(&self) -> Option<i32> {
        match self {
            SignalValue::Name(n) => match n.as_str() {
                "SIGNAL_SIGTERM" => Some(15),
                "SIGNAL_SIGKILL" => Some(9),
                _ => None,
            },
            SignalValue::Number(n) if *n == 9 || *n == 15 => Some(*n),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct SendSignalRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub signal: Option<SignalValue>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct UpdateRequest {
    #[serde(default)]
    pub process: Option<ProcessSelector>,
    #[serde(default)]
    pub pty: Option<Pty>,
}

/// `StreamInputRequest`: `oneof event { start; data; keepalive; }`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StreamInputRequest {
    #[serde(default)]
    pub start: Option<SelectRequest>,
    #[serde(default)]
    pub data: Option<StreamInputData>,
    #[serde(default)]
    pub keepalive: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StreamInputData {
    #[serde(default)]
    pub input: Option<ProcessInput>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ProcessInfo {
    pub config: ProcessConfig,
    pub pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ListResponse {
    pub processes: Vec<ProcessInfo>,
}

/// An empty response message (`SendInputResponse`, `UpdateResponse`...).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Empty {}

/// `DataEvent`: `oneof output { bytes stdout; bytes stderr; bytes pty; }`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum Output {
    Stdout(#[serde(serialize_with = "b64::serialize")] Vec<u8>),
    Stderr(#[serde(serialize_with = "b64::serialize")] Vec<u8>),
    Pty(#[serde(serialize_with = "b64::serialize")] Vec<u8>),
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EndEvent {
    pub exit_code: i32,
    pub exited: bool,
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct StartEvent {
    pub pid: u32,
}

/// `ProcessEvent`: `oneof event { start; data; end; keepalive; }`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum ProcessEvent {
    Start(StartEvent),
    Data(Output),
    End(EndEvent),
    Keepalive(Empty),
}

/// `StartResponse` and `ConnectResponse`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EventResponse {
    pub event: ProcessEvent,
}

// ---- filesystem.Filesystem ---------------------------------------------

/// `StatRequest`, `MakeDirRequest`, `RemoveRequest`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct PathRequest {
    #[serde(default)]
    pub path: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct MoveRequest {
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub destination: String,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct ListDirRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub depth: u32,
}

/// `WatchDirRequest` and `CreateWatcherRequest`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct WatchRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
    #[serde(default, alias = "include_entry", rename = "includeEntry")]
    pub include_entry: bool,
    #[serde(default, alias = "allow_network_mounts", rename = "allowNetworkMounts")]
    pub allow_network_mounts: bool,
}

/// `GetWatcherEventsRequest`, `RemoveWatcherRequest`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct WatcherRequest {
    #[serde(default, alias = "watcher_id", rename = "watcherId")]
    pub watcher_id: String,
}

/// `int64` in proto JSON is a string.
fn int64<S: Serializer>(v: &u64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    pub name: String,
    /// `FILE_TYPE_FILE`, `FILE_TYPE_DIRECTORY`, `FILE_TYPE_SYMLINK`, or
    /// `FILE_TYPE_UNSPECIFIED` for anything else (the SDKs skip those in a
    /// listing).
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub path: String,
    #[serde(serialize_with = "int64")]
    pub size: u64,
    pub mode: u32,
    pub permissions: String,
    pub owner: String,
    pub group: String,
    pub modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
}

impl From<forkvm_api::EntryInfo> for EntryInfo {
    fn from(e: forkvm_api::EntryInfo) -> Self {
        use forkvm_api::FileKind as K;
        let t =
            std::time::UNIX_EPOCH + std::time::Duration::from_nanos(e.modified_ns.max(0) as u64);
        EntryInfo {
            name: e.name,
            kind: match e.kind {
                K::File => "FILE_TYPE_FILE",
                K::Dir => "FILE_TYPE_DIRECTORY",
                K::Symlink => "FILE_TYPE_SYMLINK",
                K::Other => "FILE_TYPE_UNSPECIFIED",
            },
            path: e.path,
            size: e.size,
            mode: e.mode,
            permissions: e.permissions,
            owner: e.owner,
            group: e.group,
            modified_time: crate::actions::rfc3339(t),
            symlink_target: e.symlink_target,
        }
    }
}

/// `StatResponse`, `MakeDirResponse`, `MoveResponse`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct EntryResponse {
    pub entry: EntryInfo,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ListDirResponse {
    pub entries: Vec<EntryInfo>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct FilesystemEvent {
    pub name: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
}

impl From<forkvm_api::FsEvent> for FilesystemEvent {
    fn from(e: forkvm_api::FsEvent) -> Self {
        use forkvm_api::FsOp as O;
        FilesystemEvent {
            name: e.name,
            kind: match e.op {
                O::Create => "EVENT_TYPE_CREATE",
                O::Write => "EVENT_TYPE_WRITE",
                O::Remove => "EVENT_TYPE_REMOVE",
                O::Rename => "EVENT_TYPE_RENAME",
                O::Chmod => "EVENT_TYPE_CHMOD",
            },
        }
    }
}

/// `WatchDirResponse`: `oneof event { start; filesystem; keepalive; }`.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "lowercase")]
pub enum WatchDirResponse {
    Start(Empty),
    Filesystem(FilesystemEvent),
    Keepalive(Empty),
}

#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CreateWatcherResponse {
    pub watcher_id: String,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GetWatcherEventsResponse {
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn start_request_as_the_sdk_sends_it() {
        let r: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"],
                        "envs": {"A": "1"}, "cwd": "/tmp"},
            "pty": {"size": {"cols": 80, "rows": 24}},
            "stdin": false,
            "somethingNew": 1
        }))
        .unwrap();
        let p = r.process.unwrap();
        assert_eq!(p.cmd, "/bin/bash");
        assert_eq!(p.args, ["-l", "-c", "echo hi"]);
        assert_eq!(p.envs["A"], "1");
        assert_eq!(p.cwd.as_deref(), Some("/tmp"));
        assert_eq!(r.pty.unwrap().size.unwrap(), PtySize { cols: 80, rows: 24 });
        assert_eq!(r.stdin, Some(false));
    }

    #[test]
    fn selectors_inputs_and_signals() {
        let r: SendInputRequest = serde_json::from_value(json!({
            "process": {"pid": 42}, "input": {"stdin": "aGk="}
        }))
        .unwrap();
        assert_eq!(r.process.unwrap().pid, Some(42));
        assert_eq!(r.input.unwrap().bytes(), b"hi");
        let r: SendInputRequest = serde_json::from_value(json!({
            "process": {"tag": "web"}, "input": {"pty": "aGk"}
        }))
        .unwrap();
        assert_eq!(r.process.unwrap().tag.as_deref(), Some("web"));
        assert_eq!(r.input.unwrap().bytes(), b"hi");
        let s: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 1}, "signal": "SIGNAL_SIGKILL"}))
                .unwrap();
        assert_eq!(s.signal.unwrap().number(), Some(9));
        let s: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 1}, "signal": 15})).unwrap();
        assert_eq!(s.signal.unwrap().number(), Some(15));
        let s: SendSignalRequest = serde_json::from_value(json!({"process": {"pid": 1}})).unwrap();
        assert_eq!(s.signal, None);
    }

    #[test]
    fn stream_input_events() {
        let s: StreamInputRequest =
            serde_json::from_value(json!({"start": {"process": {"pid": 3}}})).unwrap();
        assert_eq!(s.start.unwrap().process.unwrap().pid, Some(3));
        let d: StreamInputRequest =
            serde_json::from_value(json!({"data": {"input": {"stdin": "eA=="}}})).unwrap();
        assert_eq!(d.data.unwrap().input.unwrap().bytes(), b"x");
        let k: StreamInputRequest = serde_json::from_value(json!({"keepalive": {}})).unwrap();
        assert!(k.keepalive.is_some());
    }

    #[test]
    fn process_events_are_oneofs() {
        let e = |ev| serde_json::to_value(EventResponse { event: ev }).unwrap();
        assert_eq!(
            e(ProcessEvent::Start(StartEvent { pid: 7 })),
            json!({"event": {"start": {"pid": 7}}})
        );
        assert_eq!(
            e(ProcessEvent::Data(Output::Stdout(b"hi".to_vec()))),
            json!({"event": {"data": {"stdout": "aGk="}}})
        );
        assert_eq!(
            e(ProcessEvent::Data(Output::Pty(b"x".to_vec()))),
            json!({"event": {"data": {"pty": "eA=="}}})
        );
        assert_eq!(
            e(ProcessEvent::End(EndEvent {
                exit_code: 2,
                exited: true,
                status: "exit status 2".into(),
                error: None
            })),
            json!({"event": {"end": {"exitCode": 2, "exited": true, "status": "exit status 2"}}})
        );
        assert_eq!(
            e(ProcessEvent::Keepalive(Empty {})),
            json!({"event": {"keepalive": {}}})
        );
    }

    #[test]
    fn entries_and_watch_events() {
        let e = EntryInfo::from(forkvm_api::EntryInfo {
            name: "a".into(),
            kind: forkvm_api::FileKind::Dir,
            path: "/a".into(),
            size: 4096,
            mode: 0o755 | 0o040000,
            permissions: "drwxr-xr-x".into(),
            owner: "root".into(),
            group: "root".into(),
            modified_ns: 1_000_000_000,
            symlink_target: None,
        });
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(v["size"], "4096");
        assert_eq!(v["modifiedTime"], "1970-01-01T00:00:01.000Z");
        assert!(v.get("symlinkTarget").is_none());
        let w: WatchRequest =
            serde_json::from_value(json!({"path": "/a", "recursive": true, "include_entry": true}))
                .unwrap();
        assert!(w.recursive && w.include_entry);
        let w: WatcherRequest = serde_json::from_value(json!({"watcherId": "w1"})).unwrap();
        assert_eq!(w.watcher_id, "w1");
        let ev = WatchDirResponse::Filesystem(FilesystemEvent::from(forkvm_api::FsEvent {
            name: "f".into(),
            op: forkvm_api::FsOp::Create,
        }));
        assert_eq!(
            serde_json::to_value(ev).unwrap(),
            json!({"filesystem": {"name": "f", "type": "EVENT_TYPE_CREATE"}})
        );
        assert_eq!(
            serde_json::to_value(WatchDirResponse::Start(Empty {})).unwrap(),
            json!({"start": {}})
        );
    }
}
