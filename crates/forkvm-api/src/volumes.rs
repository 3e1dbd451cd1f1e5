//! Volumes: host directories and named volumes mounted into sandboxes
//! (docs/volumes.md).
//!
//! A [`VolumeMount`] in `CreateSandbox.volumes` names a source (an absolute
//! host directory, or the name of a volume made with `POST /v1/volumes`), the
//! guest path it appears at, whether it is read-only, and what a branch or a
//! snapshot does with it ([`VolumeMode`]). The CLI's `--volume` string form
//! is parsed by [`VolumeMount::parse`], so every front-end reads it alike.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// What children of a branch (and sandboxes spawned from a snapshot) see.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum VolumeMode {
    /// Every child serves the same host directory: a write by one is seen
    /// by all, and by the host.
    #[default]
    Shared,
    /// Each child gets its own copy-on-write copy of the directory as it was
    /// at the branch instant (a reflink where the filesystem can, a copy
    /// otherwise); the source keeps the original.
    Copy,
}

/// One volume of a sandbox, as asked for at spawn.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VolumeMount {
    /// An absolute host directory, or the name of a named volume.
    pub source: String,
    /// Where it appears in the guest (absolute; not `/`).
    pub path: String,
    /// Refuse every write (`EROFS` in the guest).
    #[serde(default)]
    pub read_only: bool,
    /// What a branch or snapshot does with it (default `shared`).
    #[serde(default)]
    pub mode: VolumeMode,
    /// The uid every entry shows in the guest (default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// The gid every entry shows in the guest (default: `uid`'s value, or 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A volume as `GET /v1/sandboxes/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct MountedVolume {
    #[serde(flatten)]
    pub mount: VolumeMount,
    /// The host directory this sandbox's guest reads and writes: the source
    /// itself, or, for a `copy` volume of a branch child, its own copy.
    pub host_path: String,
}

/// `POST /v1/volumes`: create a named volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateVolume {
    /// Letters, digits, `.`, `_` and `-`; up to 64 bytes; not starting with
    /// `.` or `-`.
    pub name: String,
}

/// A named volume: a directory under the daemon's home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct Volume {
    pub name: String,
    /// Its host directory.
    pub path: String,
    /// RFC 3339 creation time.
    pub created_at: String,
    /// Running or paused sandboxes that mount it.
    #[serde(default)]
    pub used_by: Vec<String>,
}

/// `GET /v1/volumes`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
}

impl VolumeMount {
    /// Parse `SOURCE:GUEST_PATH[:OPTIONS]`, the CLI's `--volume` form.
    /// OPTIONS is a comma-separated list of `ro`, `rw`, `shared`, `copy`,
    /// `uid=N` and `gid=N`.
    pub fn parse(s: &str) -> Result<VolumeMount, String> {
        let usage = "use SOURCE:GUEST_PATH[:OPTIONS], for example /home/me/repo:/work:ro or \
                     data:/data:copy (OPTIONS: ro, rw, shared, copy, uid=N, gid=N)";
        let mut parts = s.splitn(3, ':');
        let source = parts.next().unwrap_or_default();
        let path = parts.next().unwrap_or_default();
        if source.is_empty() || path.is_empty() {
            return Err(format!("bad volume {s:?}: {usage}"));
        }
        let mut m = VolumeMount {
            source: source.to_string(),
            path: path.to_string(),
            read_only: false,
            mode: VolumeMode::Shared,
            uid: None,
            gid: None,
        };
        for opt in parts.next().unwrap_or_default().split(',') {
            let num = |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| format!("bad volume option {opt:?} in {s:?}: {usage}"))
            };
            match opt {
                "" => {}
                "ro" => m.read_only = true,
                "rw" => m.read_only = false,
                "shared" => m.mode = VolumeMode::Shared,
                "copy" => m.mode = VolumeMode::Copy,
                o if o.starts_with("uid=") => m.uid = Some(num(&o[4..])?),
                o if o.starts_with("gid=") => m.gid = Some(num(&o[4..])?),
                _ => return Err(format!("unknown volume option {opt:?} in {s:?}: {usage}")),
            }
        }
        Ok(m)
    }

    /// Is `source` a host path (rather than a named volume)?
    pub fn is_host_path(&self) -> bool {
        self.source.starts_with('/')
    }
}

/// Check a named volume's name.
pub fn check_volume_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "bad volume name {name:?}: use 1 to 64 letters, digits, '.', '_' or '-', not \
             starting with '.' or '-'"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_cli_form() {
        let m = VolumeMount::parse("/srv/repo:/work").unwrap();
        assert_eq!((m.source.as_str(), m.path.as_str()), ("/srv/repo", "/work"));
        assert!(!m.read_only);
        assert_eq!(m.mode, VolumeMode::Shared);
        let m = VolumeMount::parse("data:/data:ro,copy,uid=1000,gid=100").unwrap();
        assert!(m.read_only && !m.is_host_path());
        assert_eq!(
            (m.mode, m.uid, m.gid),
            (VolumeMode::Copy, Some(1000), Some(100))
        );
    }

    #[test]
    fn refuses_bad_forms() {
        for bad in ["", "/a", ":/b", "/a:", "/a:/b:rx", "/a:/b:uid=x"] {
            assert!(VolumeMount::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn checks_names() {
        assert!(check_volume_name("data-1.v_2").is_ok());
        for bad in ["", ".x", "-x", "a/b", "a b", &"x".repeat(65)] {
            assert!(check_volume_name(bad).is_err(), "{bad}");
        }
    }
}
