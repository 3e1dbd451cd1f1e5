//! `images/<name>/image.json`: what forkvm knows about an installed image.
//!
//! ```json
//! {
//!   "name": "py",
//!   "format": "ext4",
//!   "size_bytes": 1073741824,
//!   "created_at": "2026-11-25T10:00:00Z",
//!   "source": {"kind": "registry", "reference": "127.0.0.1:5000/team/py:3.12"},
//!   "digest": "sha256:…",             // manifest digest, when there is one
//!   "layers": ["sha256:…", …],         // layer blobs, bottom first
//!   "config": {"env": ["PATH=…"], "working_dir": "/app", "user": "app",
//!              "entrypoint": [...], "cmd": [...], "exposed_ports": ["8080/tcp"],
//!              "labels": {…}},
//!   "start": {"command": [...], "ready": {"port": 8080} | {"command": [...]}}
//! }
//! ```
//!
//! The default image's file is written by `scripts/build-guest.sh` and has
//! only the first fields (plus `description` and `packages`); every field
//! after `created_at` is optional so that file still reads.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The run-time defaults an image carries (OCI image config, `config`
/// object), in forkvm's names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ImageConfig {
    /// `KEY=value` strings, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    /// `name`, `uid`, `name:group` or `uid:gid`, as in OCI.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entrypoint: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cmd: Vec<String>,
    /// `8080/tcp` style, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exposed_ports: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl ImageConfig {
    /// What `forkvm run --image X` runs with no command: entrypoint + cmd.
    pub fn default_argv(&self) -> Vec<String> {
        self.entrypoint.iter().chain(&self.cmd).cloned().collect()
    }

    /// What `docker run [--entrypoint E] IMAGE [ARGS…]` runs: the
    /// entrypoint (`entrypoint`, else the image's) followed by `cmd` when it
    /// has arguments, else by the image's `Cmd`, which an overridden
    /// entrypoint drops (Docker: "passing --entrypoint clears out any
    /// default command").
    pub fn docker_argv(&self, entrypoint: Option<&[String]>, cmd: &[String]) -> Vec<String> {
        let ep = entrypoint.unwrap_or(&self.entrypoint);
        let args: &[String] = if !cmd.is_empty() {
            cmd
        } else if entrypoint.is_some() {
            &[]
        } else {
            &self.cmd
        };
        ep.iter().chain(args).cloned().collect()
    }

    /// The environment as a map (a later duplicate wins, as in Docker).
    pub fn env_map(&self) -> BTreeMap<String, String> {
        self.env
            .iter()
            .filter_map(|kv| kv.split_once('=').or(Some((kv.as_str(), ""))))
            .filter(|(k, _)| !k.is_empty())
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }
}

/// How a start command is judged ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReadyCheck {
    /// A TCP port in the guest accepts a connection.
    Port { port: u16 },
    /// A command exits 0.
    Command { command: Vec<String> },
}

/// A process the image's boot template starts, and when it is ready.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StartSpec {
    pub command: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<ReadyCheck>,
    /// How long the check may take before the template fails.
    #[serde(default = "default_ready_timeout")]
    pub ready_timeout_secs: u64,
}

fn default_ready_timeout() -> u64 {
    60
}

/// Where an image came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ImageSource {
    /// Built into forkvm by `scripts/build-guest.sh`.
    Builtin,
    /// Pulled from a registry.
    Registry { reference: String },
    /// Imported from an archive or layout.
    Import { format: String, file: String },
    /// Built from a Dockerfile.
    Build {
        base: String,
        dockerfile_digest: String,
    },
}

/// `image.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImageMeta {
    pub name: String,
    #[serde(default = "default_format")]
    pub format: String,
    /// The root disk's size (the filesystem's size).
    pub size_bytes: u64,
    pub created_at: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ImageSource>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    #[serde(default)]
    pub config: ImageConfig,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start: Option<StartSpec>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

fn default_format() -> String {
    "ext4".into()
}

impl ImageMeta {
    /// Parse `image.json`.
    pub fn parse(bytes: &[u8]) -> Result<Self, serde_json::Error> {
        serde_json::from_slice(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_image_json_reads() {
        let m = ImageMeta::parse(
            br#"{"name":"default","format":"ext4","size_bytes":2147483648,"created_at":"2026-01-01T00:00:00Z","description":"Debian bookworm with python3","packages":["python3"]}"#,
        )
        .unwrap();
        assert_eq!(m.name, "default");
        assert_eq!(m.config, ImageConfig::default());
        assert!(m.start.is_none());
    }

    #[test]
    fn full_meta_round_trips() {
        let m = ImageMeta {
            name: "py".into(),
            format: "ext4".into(),
            size_bytes: 1 << 30,
            created_at: "2026-11-25T10:00:00Z".into(),
            source: Some(ImageSource::Registry {
                reference: "127.0.0.1:5000/py:1".into(),
            }),
            digest: Some(format!("sha256:{}", "a".repeat(64))),
            layers: vec![format!("sha256:{}", "b".repeat(64))],
            config: ImageConfig {
                env: vec!["A=1".into(), "B=x=y".into()],
                working_dir: Some("/app".into()),
                user: Some("app".into()),
                entrypoint: vec!["/bin/sh".into()],
                cmd: vec!["-c".into(), "echo hi".into()],
                exposed_ports: vec!["8080/tcp".into()],
                labels: BTreeMap::from([("k".into(), "v".into())]),
            },
            start: Some(StartSpec {
                command: vec!["srv".into()],
                ready: Some(ReadyCheck::Port { port: 8080 }),
                ready_timeout_secs: 60,
            }),
            description: None,
        };
        let j = serde_json::to_vec(&m).unwrap();
        assert_eq!(ImageMeta::parse(&j).unwrap(), m);
        assert_eq!(m.config.default_argv(), ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(m.config.env_map()["B"], "x=y");
    }

    #[test]
    fn docker_run_rules() {
        let v = |s: &[&str]| s.iter().map(|s| s.to_string()).collect::<Vec<String>>();
        let c = ImageConfig {
            entrypoint: v(&["tool"]),
            cmd: v(&["--help"]),
            ..Default::default()
        };
        // docker run IMAGE / docker run IMAGE ARGS
        assert_eq!(c.docker_argv(None, &[]), v(&["tool", "--help"]));
        assert_eq!(c.docker_argv(None, &v(&["a", "b"])), v(&["tool", "a", "b"]));
        // --entrypoint drops the image's Cmd; ARGS still follow it.
        assert_eq!(c.docker_argv(Some(&v(&["sh"])), &[]), v(&["sh"]));
        assert_eq!(
            c.docker_argv(Some(&v(&["sh"])), &v(&["-c", "x"])),
            v(&["sh", "-c", "x"])
        );
        // --entrypoint '' runs ARGS alone.
        assert_eq!(c.docker_argv(Some(&[]), &v(&["ls"])), v(&["ls"]));
        assert!(c.docker_argv(Some(&[]), &[]).is_empty());
        // No Entrypoint: ARGS replace Cmd.
        let plain = ImageConfig {
            cmd: v(&["bash"]),
            ..Default::default()
        };
        assert_eq!(plain.docker_argv(None, &v(&["ls", "/"])), v(&["ls", "/"]));
        assert_eq!(plain.docker_argv(None, &[]), v(&["bash"]));
    }

    #[test]
    fn ready_check_forms() {
        let p: ReadyCheck = serde_json::from_str(r#"{"port":80}"#).unwrap();
        assert_eq!(p, ReadyCheck::Port { port: 80 });
        let c: ReadyCheck = serde_json::from_str(r#"{"command":["true"]}"#).unwrap();
        assert_eq!(
            c,
            ReadyCheck::Command {
                command: vec!["true".into()]
            }
        );
        assert!(serde_json::from_str::<ImageMeta>("[1]").is_err());
        assert!(serde_json::from_str::<ImageMeta>(r#"{"name":"x"}"#).is_err());
    }
}
