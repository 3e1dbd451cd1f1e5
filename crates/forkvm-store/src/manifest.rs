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
//! versions it knows (today: 1 and 2) and refuses a newer one with a message
//! to upgrade forkvm; it never guesses. An older version is upgraded once,
//! at load, in memory (the file and its digest stay as they are). New
//! optional body fields may be added without a bump (unknown body fields
//! are ignored on read).
//!
//! Versions:
//! - 1: `machine` held the machine's facts loosely: the kernel command line
//!   (whose `forkvm.ip=` said whether there was a NIC), the `-M` options
//!   (absent before they were recorded) and a `volume_port` flag.
//! - 2: `machine` is the typed [`MachineConfig`] of `forkvm-qemu`, the
//!   same value the daemon renders QEMU's arguments from ([`upgrade_v1`]
//!   derives it from a version 1 body).

use forkvm_qemu::spec::LEGACY_MACHINE;
pub use forkvm_qemu::MachineConfig;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// File magic.
pub const MAGIC: [u8; 8] = *b"FORKVMSN";
/// The manifest format this build writes and reads.
pub const FORMAT_VERSION: u32 = 2;
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
    /// The machine a snapshot can be restored into. A restore must recreate
    /// it exactly (QEMU's migration stream requires the same devices and
    /// RAM size).
    pub machine: MachineConfig,
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
    /// The digests this snapshot's manifest had before it was rewritten
    /// when its parent was spliced out of its chain (crate::splice): a
    /// child that recorded one of them still finds its parent unchanged in
    /// content. Absent: never rewritten.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub supersedes: Vec<String>,
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
    #[error("snapshot format version {0} is not supported by this forkvm (it reads versions 1 to {FORMAT_VERSION}); upgrade forkvm or re-create the snapshot")]
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
        match version {
            1 => upgrade_v1(&bytes[16..end]),
            FORMAT_VERSION => serde_json::from_slice(&bytes[16..end])
                .map_err(|e| ManifestError::Body(e.to_string())),
            v => Err(ManifestError::Version(v)),
        }
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

/// The `machine` of a version 1 body.
#[derive(Deserialize)]
struct MachineV1 {
    memory_mib: u32,
    cpus: u32,
    accel: String,
    kernel: String,
    initrd: String,
    cmdline: String,
    /// Absent in snapshots made before the options were recorded: those
    /// were all [`LEGACY_MACHINE`] (with the PIC and the PIT).
    #[serde(default)]
    machine: Option<String>,
    /// Absent in snapshots made before volumes existed.
    #[serde(default)]
    volume_port: bool,
}

/// Read a version 1 body: its `machine` becomes the typed
/// [`MachineConfig`], once, here. The NIC is the one fact that was only in
/// the kernel command line ([`MachineConfig::legacy_nic`]); a missing or
/// garbled field is an error that names it.
fn upgrade_v1(body: &[u8]) -> Result<Manifest, ManifestError> {
    let bad = |what: String| ManifestError::Body(format!("(format version 1) {what}"));
    let mut v: serde_json::Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
    let obj = v
        .as_object_mut()
        .ok_or_else(|| bad("the body is not a JSON object".into()))?;
    let old = obj
        .remove("machine")
        .ok_or_else(|| bad("missing field `machine`".into()))?;
    let old: MachineV1 = serde_json::from_value(old).map_err(|e| bad(format!("machine: {e}")))?;
    let accel = old
        .accel
        .parse()
        .map_err(|e: String| bad(format!("machine.accel: {e}")))?;
    let config = MachineConfig {
        machine: old.machine.unwrap_or_else(|| LEGACY_MACHINE.to_string()),
        accel,
        memory_mib: old.memory_mib,
        cpus: old.cpus,
        kernel: old.kernel.into(),
        initrd: old.initrd.into(),
        nic: MachineConfig::legacy_nic(&old.cmdline),
        cmdline: old.cmdline,
        volume_port: old.volume_port,
    };
    obj.insert(
        "machine".into(),
        serde_json::to_value(config).map_err(|e| bad(e.to_string()))?,
    );
    serde_json::from_value(v).map_err(|e| bad(e.to_string()))
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
            machine: MachineConfig {
                memory_mib: 512,
                cpus: 1,
                accel: forkvm_qemu::Accel::Tcg,
                kernel: "/k".into(),
                initrd: "/i".into(),
                cmdline: "console=ttyS0".into(),
                machine: "microvm,acpi=on,pic=off,pit=off".into(),
                volume_port: false,
                nic: None,
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
            supersedes: Vec::new(),
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

    /// A manifest file of `version` with `body`, sealed as a writer would.
    fn seal(version: u32, body: &str) -> Vec<u8> {
        let mut b = MAGIC.to_vec();
        b.extend(version.to_le_bytes());
        b.extend((body.len() as u32).to_le_bytes());
        b.extend(body.as_bytes());
        let sum = Sha256::digest(&b);
        b.extend(sum);
        b
    }

    /// A version 1 body as forkvm wrote them, with `machine` replaced.
    fn v1(machine: &str) -> Vec<u8> {
        seal(
            1,
            &format!(
                r#"{{"id": "sn-1", "tag": null, "parent": null,
                    "created_at": "2026-01-01T00:00:00Z", "source": "sb-1",
                    "image": "default", "qemu_version": "10.0.2",
                    "machine": {machine},
                    "base_image": "/b", "artefacts": []}}"#
            ),
        )
    }

    const V1_NIC: &str = r#"{"memory_mib": 512, "cpus": 2, "accel": "tcg",
        "kernel": "/k", "initrd": "/i",
        "cmdline": "console=ttyS0 forkvm.hostname=sb-1 forkvm.ip=172.16.0.2/30 forkvm.gw=172.16.0.1",
        "machine": "microvm,acpi=on,pic=off,pit=off", "volume_port": true}"#;

    /// Version 1 manifests load, their machine derived once from the old
    /// fields: the NIC from the kernel command line, the legacy machine
    /// when no options were recorded, no port when none was.
    #[test]
    fn a_version_1_manifest_is_upgraded_at_load() {
        let m = Manifest::decode(&v1(V1_NIC)).unwrap();
        assert_eq!(
            m.machine,
            MachineConfig {
                machine: "microvm,acpi=on,pic=off,pit=off".into(),
                accel: forkvm_qemu::Accel::Tcg,
                memory_mib: 512,
                cpus: 2,
                kernel: "/k".into(),
                initrd: "/i".into(),
                cmdline: "console=ttyS0 forkvm.hostname=sb-1 forkvm.ip=172.16.0.2/30 \
                          forkvm.gw=172.16.0.1"
                    .into(),
                volume_port: true,
                nic: Some(forkvm_qemu::Nic::standard()),
            }
        );
        assert_eq!(m.id, "sn-1");
        // The oldest shape: no options, no port, no network.
        let m = Manifest::decode(&v1(
            r#"{"memory_mib": 256, "cpus": 1, "accel": "kvm", "kernel": "/k",
                "initrd": "/i", "cmdline": "console=ttyS0 panic=1"}"#,
        ))
        .unwrap();
        assert_eq!(m.machine.machine, LEGACY_MACHINE);
        assert_eq!(m.machine.accel, forkvm_qemu::Accel::Kvm);
        assert!(!m.machine.volume_port && m.machine.nic.is_none());
        // Odd command lines: a lookalike parameter is no NIC; an empty one
        // is fine.
        for (cmdline, nic) in [
            ("xforkvm.ip=1 forkvm.ipx", false),
            ("", false),
            ("\tforkvm.ip=10.0.0.2/30\n", true),
        ] {
            let m = Manifest::decode(&v1(&format!(
                r#"{{"memory_mib": 1, "cpus": 1, "accel": "tcg", "kernel": "",
                    "initrd": "", "cmdline": {}}}"#,
                serde_json::Value::from(cmdline)
            )))
            .unwrap();
            assert_eq!(m.machine.nic.is_some(), nic, "{cmdline:?}");
        }
        // Written back, it is a version 2 file that reads the same.
        let m = Manifest::decode(&v1(V1_NIC)).unwrap();
        let b = m.encode();
        assert_eq!(b[8..12], 2u32.to_le_bytes());
        assert_eq!(Manifest::decode(&b).unwrap(), m);
    }

    /// A version 1 body with a missing or garbled machine is refused with an
    /// error naming what is wrong, never a panic or a guess.
    #[test]
    fn a_garbled_version_1_machine_is_a_clear_error() {
        let err = |machine: &str| match Manifest::decode(&v1(machine)) {
            Err(ManifestError::Body(e)) => e,
            other => panic!("{machine}: {other:?}"),
        };
        let e = err(
            r#"{"memory_mib": 1, "cpus": 1, "accel": "xen", "kernel": "",
                        "initrd": "", "cmdline": ""}"#,
        );
        assert!(e.contains("machine.accel") && e.contains("xen"), "{e}");
        let e = err(r#"{"memory_mib": 1, "cpus": 1, "accel": "tcg", "kernel": "", "initrd": ""}"#);
        assert!(e.contains("cmdline"), "{e}");
        let e = err(
            r#"{"memory_mib": "lots", "cpus": 1, "accel": "tcg", "kernel": "",
                        "initrd": "", "cmdline": ""}"#,
        );
        assert!(e.contains("machine:") && e.contains("lots"), "{e}");
        let e = err(r#""microvm""#);
        assert!(e.contains("machine"), "{e}");
        let e = err("null");
        assert!(e.contains("machine"), "{e}");
        for body in ["[]", "{}", "not json", ""] {
            assert!(
                matches!(
                    Manifest::decode(&seal(1, body)),
                    Err(ManifestError::Body(_))
                ),
                "{body}"
            );
        }
    }

    /// A version 2 machine with a field missing or garbled is refused too.
    #[test]
    fn a_garbled_version_2_machine_is_a_clear_error() {
        let m = sample().encode();
        let body = std::str::from_utf8(&m[16..m.len() - 32]).unwrap();
        for (from, to, says) in [
            ("\"cpus\": 1,", "", "cpus"),
            ("\"accel\": \"tcg\"", "\"accel\": \"arm\"", "arm"),
            ("\"nic\": null", "\"nic\": {\"tap\": \"tap0\"}", "mac"),
            (
                "\"nic\": null",
                "\"nic\": {\"tap\": 7, \"mac\": \"m\"}",
                "integer `7`",
            ),
        ] {
            assert!(body.contains(from), "{body}");
            match Manifest::decode(&seal(2, &body.replacen(from, to, 1))) {
                Err(ManifestError::Body(e)) => assert!(e.contains(says), "{e}"),
                other => panic!("{from}: {other:?}"),
            }
        }
    }

    /// Volumes and the volume port round-trip; a manifest without volumes
    /// writes none.
    #[test]
    fn volumes_round_trip() {
        let old = sample().encode();
        let body = std::str::from_utf8(&old[16..old.len() - 32]).unwrap();
        assert!(!body.contains("\"volumes\""), "{body}");
        let m = Manifest::decode(&old).unwrap();
        assert!(!m.machine.volume_port && m.volumes.is_none());
        let mut m = sample();
        m.machine.volume_port = true;
        m.machine.nic = Some(forkvm_qemu::Nic::standard());
        m.volumes = Some(vec![SnapVolume {
            index: 0,
            source: "data".into(),
            path: "/data".into(),
            read_only: false,
            mode: "copy".into(),
            host_path: "/var/lib/forkvm/volumes/data".into(),
            uid: 1000,
            gid: 1000,
        }]);
        assert_eq!(Manifest::decode(&m.encode()).unwrap(), m);
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
        b[8..12].copy_from_slice(&3u32.to_le_bytes());
        let sum = Sha256::digest(&b[..end]);
        b[end..].copy_from_slice(&sum);
        let e = Manifest::decode(&b).unwrap_err();
        assert_eq!(e, ManifestError::Version(3));
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
        let b = seal(FORMAT_VERSION, r#"{"id": 5}"#);
        assert!(matches!(Manifest::decode(&b), Err(ManifestError::Body(_))));
        let b = seal(0, r#"{"id": 5}"#);
        assert_eq!(Manifest::decode(&b), Err(ManifestError::Version(0)));
    }
}
