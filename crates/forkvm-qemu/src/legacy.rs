//! Machines recorded before the [`MachineConfig`] was: what a daemon learns
//! of them, once, when it re-attaches to one.
//!
//! A sandbox row written by an older daemon has a pid but no machine and
//! no start time. Its QEMU is asked over QMP, never read from `/proc`:
//! the process serving the sandbox's QMP socket is its QEMU (the socket's
//! peer pid, [`crate::process::qmp_peer_pid`]), and QEMU reports its own
//! machine's properties (`qom-get` on `/machine`) and character devices
//! (`query-chardev`). The daemon stores the result, so this runs once per
//! such sandbox. (A snapshot manifest of the older format is upgraded by the
//! store, from the fields it has.)

use std::path::PathBuf;

use serde_json::{json, Value};

use crate::qmp::{Qmp, QmpError};
use crate::spec::{Accel, MachineConfig, LEGACY_MACHINE, MACHINE};

/// What the older row knows itself.
#[derive(Debug, Clone)]
pub struct RowFacts {
    pub memory_mib: u32,
    pub cpus: u32,
    pub accel: Accel,
}

/// Ask a running QEMU for the machine it runs (the error says which
/// question failed).
pub async fn ask_machine(qmp: &Qmp, row: &RowFacts) -> Result<MachineConfig, String> {
    let failed = |what: &str, e: QmpError| format!("QEMU did not tell its {what}: {e}");
    let mut props = Vec::new();
    for p in ["append", "kernel", "initrd", "pit"] {
        let v = qmp
            .execute("qom-get", Some(json!({"path": "/machine", "property": p})))
            .await
            .map_err(|e| failed(p, e))?;
        props.push(v);
    }
    let chardevs = qmp
        .execute("query-chardev", None)
        .await
        .map_err(|e| failed("character devices", e))?;
    machine_from_answers(row, &props[0], &props[1], &props[2], &props[3], &chardevs)
}

/// The machine from QEMU's answers: the kernel command line (`append`),
/// the kernel and initrd paths, the PIT option (`off` on every machine
/// booted with [`MACHINE`]; the older machine kept QEMU's default) and the
/// character devices (the volume port's is labelled `volumes`). The NIC
/// follows from the kernel command line as for old manifests
/// ([`MachineConfig::legacy_nic`]). An answer of the wrong shape is an
/// error naming it.
pub fn machine_from_answers(
    row: &RowFacts,
    append: &Value,
    kernel: &Value,
    initrd: &Value,
    pit: &Value,
    chardevs: &Value,
) -> Result<MachineConfig, String> {
    let text = |what: &str, v: &Value| {
        v.as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("QEMU's {what} is not a string: {v}"))
    };
    let cmdline = text("kernel command line", append)?;
    let pit = text("pit option", pit)?;
    let labels = chardevs
        .as_array()
        .ok_or_else(|| format!("QEMU's character devices are not a list: {chardevs}"))?;
    let volume_port = labels
        .iter()
        .any(|c| c.get("label").and_then(Value::as_str) == Some("volumes"));
    Ok(MachineConfig {
        machine: if pit == "off" {
            MACHINE
        } else {
            LEGACY_MACHINE
        }
        .to_string(),
        accel: row.accel,
        memory_mib: row.memory_mib,
        cpus: row.cpus,
        kernel: PathBuf::from(text("kernel", kernel)?),
        initrd: PathBuf::from(text("initrd", initrd)?),
        nic: MachineConfig::legacy_nic(&cmdline),
        cmdline,
        volume_port,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> RowFacts {
        RowFacts {
            memory_mib: 512,
            cpus: 2,
            accel: Accel::Tcg,
        }
    }

    #[test]
    fn answers_of_a_current_machine() {
        let m = machine_from_answers(
            &row(),
            &json!("console=ttyS0 forkvm.ip=172.16.0.2/30"),
            &json!("/k"),
            &json!("/i"),
            &json!("off"),
            &json!([{"label": "console"}, {"label": "agent"}, {"label": "volumes"}]),
        )
        .unwrap();
        assert_eq!(
            m,
            MachineConfig {
                machine: MACHINE.into(),
                accel: Accel::Tcg,
                memory_mib: 512,
                cpus: 2,
                kernel: "/k".into(),
                initrd: "/i".into(),
                cmdline: "console=ttyS0 forkvm.ip=172.16.0.2/30".into(),
                volume_port: true,
                nic: Some(crate::spec::Nic::standard()),
            }
        );
    }

    #[test]
    fn answers_of_an_old_machine_and_odd_answers() {
        let m = machine_from_answers(
            &row(),
            &json!(""),
            &json!("/k"),
            &json!("/i"),
            &json!("auto"),
            &json!([{"label": "agent"}, {"no-label": 1}, 7]),
        )
        .unwrap();
        assert_eq!(m.machine, LEGACY_MACHINE);
        assert!(!m.volume_port && m.nic.is_none());
        let e = machine_from_answers(
            &row(),
            &json!(5),
            &json!("/k"),
            &json!("/i"),
            &json!("off"),
            &json!([]),
        )
        .unwrap_err();
        assert!(e.contains("kernel command line"), "{e}");
        let e = machine_from_answers(
            &row(),
            &json!(""),
            &json!("/k"),
            &json!("/i"),
            &json!("off"),
            &json!({}),
        )
        .unwrap_err();
        assert!(e.contains("not a list"), "{e}");
        let e = machine_from_answers(
            &row(),
            &json!(""),
            &Value::Null,
            &json!("/i"),
            &json!("off"),
            &json!([]),
        )
        .unwrap_err();
        assert!(e.contains("kernel is not"), "{e}");
    }
}
