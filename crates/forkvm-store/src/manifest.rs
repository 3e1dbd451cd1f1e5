//! The snapshot manifest file format (`manifest.fvs`).
//!
//! ```text
//!  0          8          12         16                16+N          16+N+32
//!  +----------+----------+----------+-----------------+-------------+
//!  | magic    | version  | body len | body: JSON      | SHA-256 of  |
//!  | FORKVMSN | u32 LE   | u32 LE   | (N bytes)       | bytes 0..N+16|
//!  +----------+----------+----------+-----------------+-------------+
//! ```
//!
//! * The magic identifies the file; a wrong magic is "not a forkvm snapshot".
//! * The checksum covers the header and the body, so any flipped bit, a
//!   truncated write or an edited body is detected before the JSON is parsed.
//! * The body lists every artefact of the snapshot with its size and SHA-256,
//!   and the parent snapshot by id and manifest digest, which makes a chain
//!   tamper-evident link by link.
//!
//! Compatibility rule: [`FORMAT_VERSION`] is bumped when a field changes
//! meaning or a required field is added. A reader accepts exactly the
//! versions it knows (today: 1) and refuses a newer one with a message to
//! upgrade forkvm; it never guesses. New optional body fields may be added
//! without a bump (unknown body fields are ignored on read).

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// File magic.
pub const MAGIC: [u8; 8] = *b"FORKVMSN";
/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Largest manifest body accepted.
pub const MAX_BODY: u32 = 1 << 20;

/// One file of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Artefact {
    /// `memory`, `device_state` or `disk`.
    pub kind: String,
    /// File name inside the snapshot directory.
    pub file: String,
    pub size: u64,
    /// Bytes allocated on disk (memory images are sparse).
    pub allocated: u64,
    /// Hex SHA-256 of the file's contents.
    pub sha256: String,
}

/// The parent of a layered snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ParentRef {
    pub id: String,
    /// The parent's manifest digest ([`Manifest::digest`] of its file).
    pub manifest_sha256: String,
}

/// The machine a snapshot can be restored into. A restore must recreate it
/// exactly (QEMU's migration stream requires the same devices and RAM size).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub memory_mib: u32,
    pub cpus: u32,
    /// `kvm` or `tcg`.
    pub accel: String,
    pub kernel: String,
    pub initrd: String,
    pub cmdline: String,
    /// QEMU's `-M` options (without the memory backend), for example
    /// `microvm,acpi=on,pic=off,pit=off`. The migration stream holds a
    /// section per device, so a restore must create the same devices.
    /// Absent in snapshots made before the option was recorded: those were
    /// all `microvm,acpi=on` (with the PIC and the PIT).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<String>,
    /// The machine has the volume port (docs/volumes.md); its restores must
    /// have it too. Absent in snapshots made before volumes existed.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub volume_port: bool,
}

/// The manifest body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub id: String,
    #[serde(default)]
    pub tag: Option<String>,
    #[serde(default)]
    pub parent: Option<ParentRef>,
    pub created_at: String,
    /// The sandbox that was snapshotted.
    pub source: String,
    pub image: String,
    pub qemu_version: String,
    pub machine: MachineInfo,
    /// The base image the disk layer chain ends in.
    pub base_image: String,
    pub artefacts: Vec<Artefact>,
    /// How RAM is stored when there is no `memory` artefact: `stream` (inside
    /// the migration stream) or `mapped-ram` (QEMU's mapped-ram file layout,
    /// written live). Optional: older manifests without it mean `stream`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ram_format: Option<String>,
    /// `devices-only` when `device.state` was written by
    /// `xen-save-devices-state` (diff snapshots and their flattenings): such
    /// a stream has no configuration section and is loaded accordingly.
    /// Absent means a whole migration stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_format: Option<String>,
    /// The volumes the guest had mounted (docs/volumes.md). Their node
    /// journals are `volumes/<index>.journal` in the snapshot directory, and
    /// a `copy` volume's tree as of the snapshot is `volumes/<index>/`.
    /// Absent: none (and the machine has no volume port).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volumes: Option<Vec<SnapVolume>>,
}

/// One volume of a snapshot's guest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapVolume {
    /// Its index on the volume port (the guest's mount is keyed by it).
    pub index: u8,
    /// What the spawn asked for: a host path or a named volume.
    pub source: String,
    /// The guest path.
    pub path: String,
    pub read_only: bool,
    /// `shared` or `copy`.
    pub mode: String,
    /// The host directory a `shared` volume's clones serve.
    pub host_path: String,
    pub uid: u32,
    pub gid: u32,
}

/// The directory of a snapshot's volume files, relative to the snapshot.
pub const VOLUMES_DIR: &str = "volumes";

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ManifestError {
    #[error("not a forkvm snapshot manifest (bad magic)")]
    BadMagic,
    #[error("snapshot manifest is truncated ({0} bytes)")]
    Truncated(usize),
    #[error("snapshot format version {0} is not supported by this forkvm (it reads version {FORMAT_VERSION}); upgrade forkvm or re-create the snapshot")]
    Version(u32),
    #[error("snapshot manifest body of {0} bytes is over the limit")]
    TooLarge(u32),
    #[error("snapshot manifest checksum mismatch: the file is corrupted")]
    Checksum,
    #[error("snapshot manifest body is invalid: {0}")]
    Body(String),
}

impl Manifest {
    /// Encode to the file format.
    pub fn encode(&self) -> Vec<u8> {
        let body = serde_json::to_vec_pretty(self).unwrap_or_default();
        let mut out = Vec::with_capacity(16 + body.len() + 32);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        out.extend_from_slice(&(body.len() as u32).to_le_bytes());
        out.extend_from_slice(&body);
        let sum = Sha256::digest(&out);
        out.extend_from_slice(&sum);
        out
    }

    /// Decode and verify a manifest file's bytes.
    pub fn decode(bytes: &[u8]) -> Result<Manifest, ManifestError> {
        if bytes.len() < 8 || bytes[..8] != MAGIC {
            return Err(ManifestError::BadMagic);
        }
        if bytes.len() < 16 + 32 {
            return Err(ManifestError::Truncated(bytes.len()));
        }
        let version = u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]);
        let len = u32::from_le_bytes([bytes[12], bytes[13], bytes[14], bytes[15]]);
        if len > MAX_BODY {
            return Err(ManifestError::TooLarge(len));
        }
        let end = 16 + len as usize;
        if bytes.len() != end + 32 {
            return Err(ManifestError::Truncated(bytes.len()));
        }
        if Sha256::digest(&bytes[..end]).as_slice() != &bytes[end..] {
            return Err(ManifestError::Checksum);
        }
        // The version is checked after the checksum, so a corrupted version
        // field reads as corruption, not as "from the future".
        if version != FORMAT_VERSION {
            return Err(ManifestError::Version(version));
        }
        serde_json::from_slice(&bytes[16..end]).map_err(|e| ManifestError::Body(e.to_string()))
    }

    /// The digest that identifies a manifest file (children record it).
    pub fn digest(bytes: &[u8]) -> String {
        hex(&Sha256::digest(bytes))
    }

    /// The artefact of a kind.
    pub fn artefact(&self, kind: &str) -> Option<&Artefact> {
        self.artefacts.iter().find(|a| a.kind == kind)
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A sample manifest for tests in this crate.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::*;

    pub(crate) fn sample() -> Manifest {
        Manifest {
            id: "sn-1".into(),
            tag: Some("t".into()),
            parent: None,
            created_at: "2026-01-01T00:00:00Z".into(),
            source: "sb-1".into(),
            image: "default".into(),
            qemu_version: "10.0.2".into(),
            machine: MachineInfo {
                memory_mib: 512,
                cpus: 1,
                accel: "tcg".into(),
                kernel: "/k".into(),
                initrd: "/i".into(),
                cmdline: "console=ttyS0".into(),
                machine: Some("microvm,acpi=on,pic=off,pit=off".into()),
                volume_port: false,
            },
            base_image: "/images/default/rootfs.ext4".into(),
            artefacts: vec![Artefact {
                kind: "memory".into(),
                file: "memory.img".into(),
                size: 10,
                allocated: 4096,
                sha256: "00".into(),
            }],
            ram_format: None,
            state_format: None,
            volumes: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::sample;
    use super::*;

    #[test]
    fn roundtrip() {
        let m = sample();
        let b = m.encode();
        assert_eq!(Manifest::decode(&b).unwrap(), m);
        assert_eq!(Manifest::digest(&b).len(), 64);
        assert!(m.artefact("memory").is_some() && m.artefact("disk").is_none());
    }

    /// Manifests written before the machine options were recorded still
    /// read, with `machine: None` (restored into the legacy machine).
    #[test]
    fn a_manifest_without_machine_options_still_reads() {
        let mut m = sample();
        m.machine.machine = None;
        let b = m.encode();
        let body = std::str::from_utf8(&b[16..b.len() - 32]).unwrap();
        assert!(!body.contains("\"machine\": \"microvm"), "{body}");
        assert_eq!(Manifest::decode(&b).unwrap().machine.machine, None);
    }

    #[test]
    fn every_single_bit_flip_is_detected() {
        let b = sample().encode();
        for i in 0..b.len() {
            for bit in [0x01u8, 0x80] {
                let mut c = b.clone();
                c[i] ^= bit;
                assert!(
                    Manifest::decode(&c).is_err(),
                    "flip at byte {i} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn corruption_cases_give_specific_errors() {
        let b = sample().encode();
        let mut bad = b.clone();
        bad[0] = b'X';
        assert_eq!(Manifest::decode(&bad), Err(ManifestError::BadMagic));
        assert_eq!(
            Manifest::decode(&b[..20]),
            Err(ManifestError::Truncated(20))
        );
        assert_eq!(
            Manifest::decode(&b[..b.len() - 1]),
            Err(ManifestError::Truncated(b.len() - 1))
        );
        let mut body = b.clone();
        body[20] ^= 1;
        assert_eq!(Manifest::decode(&body), Err(ManifestError::Checksum));
        assert_eq!(Manifest::decode(b""), Err(ManifestError::BadMagic));
    }

    #[test]
    fn a_newer_version_is_refused_with_advice() {
        let mut b = sample().encode();
        let end = b.len() - 32;
        b[8..12].copy_from_slice(&2u32.to_le_bytes());
        let sum = Sha256::digest(&b[..end]);
        b[end..].copy_from_slice(&sum);
        let e = Manifest::decode(&b).unwrap_err();
        assert_eq!(e, ManifestError::Version(2));
        assert!(e.to_string().contains("upgrade forkvm"));
    }

    #[test]
    fn oversized_body_length_is_refused() {
        let mut b = sample().encode();
        b[12..16].copy_from_slice(&(MAX_BODY + 1).to_le_bytes());
        assert_eq!(
            Manifest::decode(&b),
            Err(ManifestError::TooLarge(MAX_BODY + 1))
        );
    }

    #[test]
    fn body_that_is_not_a_manifest_is_refused() {
        let body = br#"{"id": 5}"#;
        let mut b = MAGIC.to_vec();
        b.extend(FORMAT_VERSION.to_le_bytes());
        b.extend((body.len() as u32).to_le_bytes());
        b.extend(body);
        let sum = Sha256::digest(&b);
        b.extend(sum);
        assert!(matches!(Manifest::decode(&b), Err(ManifestError::Body(_))));
    }
}
