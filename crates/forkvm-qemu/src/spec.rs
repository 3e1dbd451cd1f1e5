//! The microvm machine spec and its QEMU command line.
//!
//! Every forkvm sandbox is the same shape of machine:
//!
//! * `microvm` with ACPI, so virtio-mmio devices are discovered as ACPI
//!   `LNRO0005` devices (the kernel has no cmdline virtio-mmio devices), and
//!   without the legacy 8259 PIC and 8254 PIT (see [`MACHINE`]);
//! * guest RAM from a `memory-backend-file`, so the RAM is a file that
//!   snapshots can copy and clones can map copy-on-write;
//! * the kernel booted directly by PVH from an ELF vmlinux (no firmware, no
//!   decompressor);
//! * one virtio-blk root disk: a qcow2 overlay over a read-only image;
//! * one virtio-serial port for the guest agent on a unix-socket chardev that
//!   QEMU listens on (the daemon connects, and may reconnect after a restart);
//! * a second port for volumes (FUSE requests relayed to the daemon,
//!   docs/volumes.md), on every machine booted since volumes exist: a port
//!   cannot be added to a restored guest whose driver sized itself for fewer;
//! * the serial console written to a log file;
//! * QMP on a unix socket.

use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The accelerator QEMU uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Accel {
    Kvm,
    Tcg,
}

impl fmt::Display for Accel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

impl std::str::FromStr for Accel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "kvm" => Ok(Accel::Kvm),
            "tcg" => Ok(Accel::Tcg),
            other => Err(format!("unknown accelerator {other:?}: use kvm or tcg")),
        }
    }
}

/// Where guest RAM lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryBackend {
    /// The file backing guest RAM (on a RAM-backed filesystem for speed).
    pub path: PathBuf,
    /// `share=on`: guest writes go to the file (a template's own RAM).
    /// `share=off`: writes are private copy-on-write (a clone).
    pub share: bool,
    /// Open the file read-only (clones of an immutable snapshot). Always paired
    /// with `rom=off`, because a read-only backend otherwise becomes ROM and the
    /// guest hangs silently.
    pub readonly: bool,
}

/// The `-M` machine options of every new boot (the memory backend is added
/// by [`MachineSpec::to_args`]).
///
/// `pic=off,pit=off` fix an early-boot crash. `microvm,acpi=on` gives the
/// guest a hardware-reduced ACPI platform, so Linux assumes there is no 8259
/// PIC and no PIT (`acpi_generic_reduced_hw_init`: it installs the null
/// legacy PIC and skips the PIT timer) and never programs them. QEMU still
/// creates both by default, resets the boot CPU's LAPIC LINT0 to ExtINT
/// (unmasked), and with no firmware the PIC's vector base stays 0. The PIT
/// counts from reset and raises IRQ0, so the first `sti` in `start_kernel`
/// takes vector 0 and the guest dies with "Oops: divide error" whenever the
/// PIT fired before the kernel set up its LAPIC: under TCG that depended on
/// timing, one cold boot in a few. Without the two devices the guest is
/// exactly what Linux assumed: the LAPIC timer gives clock events, the TSC
/// is the clocksource (as before). docs/boot.md has the evidence.
pub const MACHINE: &str = "microvm,acpi=on,pic=off,pit=off";

/// The initrd's size must be a whole number of 4 KiB pages.
///
/// [`MACHINE`] has ACPI tables, which the firmware puts in the last few
/// hundred bytes of guest RAM below 4 GiB; QEMU's microvm then loads the
/// initrd so that it ends as close to that top as page alignment of its
/// start allows, without leaving room for the tables. An initrd whose size
/// is not page-aligned therefore ends inside the tables, its tail replaces
/// the DSDT, and the kernel hangs right after "ACPI: Core revision"
/// checksumming a table whose length is whatever bytes landed there (or
/// boots without its virtio devices, when they are zeros). A page-aligned
/// one ends a full page lower. `scripts/build-guest.sh` pads with zeros,
/// which the kernel skips. docs/boot.md has the evidence.
pub fn check_initrd_size(size: u64) -> Result<(), String> {
    if size % 4096 == 0 {
        return Ok(());
    }
    Err(format!(
        "the guest initramfs is {size} bytes, not a multiple of 4096: QEMU's microvm would load \
         its tail over the ACPI tables at the top of guest RAM and the guest would hang in early \
         boot. Rebuild it with scripts/setup.sh (which pads it), or pad it with zeros to a \
         multiple of 4096"
    ))
}

/// The machine options of snapshots made before [`MACHINE`]: a restore must
/// recreate the devices its migration stream holds (the PIC and the PIT), so
/// such snapshots keep restoring into this machine. Their guests are past
/// early boot, where the stray interrupt could hurt.
pub const LEGACY_MACHINE: &str = "microvm,acpi=on";

/// What a machine is: everything that must be the same for a snapshot of
/// it to restore, and everything the daemon needs to know about a running
/// one (whether it has a NIC, the volume port, its kernel command line).
///
/// It is the one record of a machine's shape. It is written once, when the
/// machine is first booted, and copied from there: into the sandbox's db
/// row and its live record, into a snapshot's manifest, and from a manifest
/// into every restore. [`MachineSpec::args`] renders it into QEMU's
/// arguments, and nothing reads those arguments back: a running QEMU's
/// command line is never parsed (docs/architecture.md, "The machine
/// config").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineConfig {
    /// The `-M` options without the memory backend: [`MACHINE`] for a boot,
    /// [`LEGACY_MACHINE`] for machines from before it (a restore must create
    /// the devices its migration stream holds).
    pub machine: String,
    /// The accelerator it was started with (a restore uses the host's own).
    pub accel: Accel,
    pub memory_mib: u32,
    pub cpus: u32,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The guest kernel command line ([`kernel_cmdline`]).
    pub cmdline: String,
    /// The volume port (docs/volumes.md). A port cannot be added to a
    /// restored guest whose driver sized itself for fewer, so a machine
    /// without it (from before volumes) is restored without it.
    #[serde(default)]
    pub volume_port: bool,
    /// A virtio-net NIC on a tap device in the sandbox's network namespace.
    #[serde(default)]
    pub nic: Option<Nic>,
}

/// The full description of one microVM: its [`MachineConfig`] and where this
/// instance's files are.
#[derive(Debug, Clone)]
pub struct MachineSpec {
    /// A short name for `ps` and QEMU's `-name`.
    pub name: String,
    pub config: MachineConfig,
    pub memory: MemoryBackend,
    /// The root disk: a qcow2 file (usually an overlay over a read-only base).
    pub root_disk: PathBuf,
    pub agent_socket: PathBuf,
    /// The volume port's socket (used when the config has the port).
    pub volume_socket: PathBuf,
    pub qmp_socket: PathBuf,
    pub console_log: PathBuf,
    /// `Some("defer")` starts QEMU waiting for `migrate-incoming`.
    pub incoming: Option<String>,
    /// The incoming state holds devices only (`xen-save-devices-state`):
    /// such a stream records the guest as running, so QEMU starts paused
    /// (`-S`) or it would resume the guest on its own.
    pub device_state_only: bool,
    /// The incoming stream has no configuration section (a raw
    /// `xen-save-devices-state` file), so the check for one is turned off.
    /// Avoid it where possible: QEMU 10.0 then aborts on the next outgoing
    /// migration of this VM (its vmdesc JSON writer closes an object it never
    /// opened), which is why the daemon adds the section to the file instead.
    pub no_configuration_section: bool,
    /// Not a QEMU argument: the network namespace (a path such as
    /// `/run/netns/fvm-<id>`) QEMU is started in, where its tap lives.
    pub netns: Option<PathBuf>,
    /// Not a QEMU argument: files the daemon hands QEMU later over QMP
    /// (a snapshot's device state), which a jail shows it read-only.
    pub later_reads: Vec<PathBuf>,
}

/// A NIC backed by an existing tap device (QEMU opens it by name in its own
/// network namespace and runs no scripts).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nic {
    pub tap: String,
    pub mac: String,
}

impl Nic {
    /// The one NIC forkvm gives a guest, in every version so far: `tap0`
    /// with the guest MAC `02:fc:00:00:00:02` (`forkvm_net::TAP_NAME` and
    /// `GUEST_MAC`, kept equal by a daemon test). Records from before the
    /// NIC was stored get it when their kernel command line shows one.
    pub fn standard() -> Nic {
        Nic {
            tap: "tap0".into(),
            mac: "02:fc:00:00:00:02".into(),
        }
    }
}

impl MachineConfig {
    /// The NIC of a machine recorded before the config was typed, read
    /// from its kernel command line: the daemon gives the guest its address
    /// there (`forkvm.ip=`) exactly when it has a NIC. Used only by the
    /// upgrades of such records (the manifest's, and a db row's at
    /// adoption), once each.
    pub fn legacy_nic(kernel_cmdline: &str) -> Option<Nic> {
        kernel_cmdline
            .split_whitespace()
            .any(|t| t.starts_with("forkvm.ip="))
            .then(Nic::standard)
    }
}

impl MachineSpec {
    /// The QEMU argument vector (without the binary).
    pub fn to_args(&self) -> Vec<String> {
        self.args(false, None)
    }

    /// The argument vector of a jailed QEMU (`jailed`: with the seccomp
    /// filter), whose tap, if it has one, is already open as `tap_fd`.
    pub fn args(&self, jailed: bool, tap_fd: Option<i32>) -> Vec<String> {
        let c = &self.config;
        let mem = format!("{}M", c.memory_mib);
        let mut backend = format!(
            "memory-backend-file,id=mem,size={mem},mem-path={},share={}",
            self.memory.path.display(),
            on_off(self.memory.share)
        );
        if self.memory.readonly {
            backend.push_str(",readonly=on,rom=off");
        }
        let (accel, cpu) = match c.accel {
            Accel::Kvm => ("kvm", "host"),
            // thread=multi runs each vCPU on its own host thread under TCG;
            // tb-size: see TCG_TB_SIZE_MIB.
            Accel::Tcg => (TCG_ACCEL, "max"),
        };
        let mut a: Vec<String> = vec![
            "-name".into(),
            format!("forkvm-{},process=forkvm-{}", self.name, self.name),
            "-M".into(),
            format!("{},memory-backend=mem", c.machine),
            "-accel".into(),
            accel.into(),
            "-cpu".into(),
            cpu.into(),
            "-smp".into(),
            c.cpus.to_string(),
            "-m".into(),
            mem,
            "-object".into(),
            backend,
            "-kernel".into(),
            c.kernel.display().to_string(),
            "-initrd".into(),
            c.initrd.display().to_string(),
            "-append".into(),
            c.cmdline.clone(),
            "-nodefaults".into(),
            "-no-user-config".into(),
            "-display".into(),
            "none".into(),
            // A guest reboot (panic=1 or `reboot`) ends QEMU, so the daemon sees it.
            "-no-reboot".into(),
            "-chardev".into(),
            format!("file,id=console,path={}", self.console_log.display()),
            "-serial".into(),
            "chardev:console".into(),
            // `discard=unmap` on both nodes, so a guest's TRIM reaches the
            // host: the qcow2 node frees the clusters (a layer with a backing
            // file marks them zero, so the backing data stays hidden) and
            // passes the discard down, where the file node punches a hole.
            // `detect-zeroes=unmap` does the same for zeroes the guest
            // writes. Overlays added later over QMP get the same options
            // (`migrate::add_overlay`).
            "-blockdev".into(),
            format!(
                "driver=file,filename={},node-name=root-file,discard=unmap",
                self.root_disk.display()
            ),
            "-blockdev".into(),
            "driver=qcow2,file=root-file,node-name=root,discard=unmap,detect-zeroes=unmap".into(),
            "-device".into(),
            "virtio-blk-device,drive=root".into(),
            "-device".into(),
            format!(
                "virtio-serial-device,max_ports={}",
                if c.volume_port { 3 } else { 2 }
            ),
            "-chardev".into(),
            format!(
                "socket,id=agent,path={},server=on,wait=off",
                self.agent_socket.display()
            ),
            "-device".into(),
            format!(
                "virtserialport,chardev=agent,name={}",
                forkvm_agent_port_name()
            ),
            "-qmp".into(),
            format!("unix:{},server=on,wait=off", self.qmp_socket.display()),
        ];
        if c.volume_port {
            a.push("-chardev".into());
            a.push(format!(
                "socket,id=volumes,path={},server=on,wait=off",
                self.volume_socket.display()
            ));
            a.push("-device".into());
            a.push(format!(
                "virtserialport,chardev=volumes,name={VOLUME_PORT_NAME},nr=2"
            ));
        }
        if let Some(n) = &c.nic {
            a.push("-netdev".into());
            a.push(match tap_fd {
                Some(fd) => format!("tap,id=net0,fd={fd}"),
                None => format!("tap,id=net0,ifname={},script=no,downscript=no", n.tap),
            });
            a.push("-device".into());
            a.push(format!("virtio-net-device,netdev=net0,mac={}", n.mac));
        }
        if let Some(inc) = &self.incoming {
            a.push("-incoming".into());
            a.push(inc.clone());
        }
        if self.device_state_only {
            a.push("-S".into());
        }
        if self.no_configuration_section {
            a.extend(["-global".into(), "migration.send-configuration=off".into()]);
        }
        if jailed {
            a.extend(["-sandbox".into(), SECCOMP.into()]);
        }
        a
    }
}

/// The TCG translation buffer in MiB (`-accel tcg,tb-size=`), TCG only.
///
/// QEMU's default is 1 GiB per process: an anonymous mapping that fills
/// with translated code and is never given back (every page the code
/// generator once wrote stays resident until QEMU exits; a flush of a full
/// buffer starts again at its start, over the same pages). A clone starts
/// with an empty buffer (translated code is not part of a snapshot), so the
/// buffer holds what the clone itself has run, and with the default it
/// keeps growing with every new piece of guest code, up to the 1 GiB.
/// Measured on our guest (QEMU's `info jit`, 512 MiB, 1 vCPU): a cold boot
/// translates 57 MiB of code, an idle clone has ~10 MiB resident 30 s after
/// its spawn, and a spawn plus `find /` and `ls -lR /usr` ~29 MiB.
/// 64 MiB keeps a cold boot and those commands free of flushes (32 MiB
/// flushed twice during a cold boot and was nearly full after the
/// commands; 8 MiB cut an idle clone by ~3 MiB but made repeated commands
/// re-translate) while bounding what one busy clone can pin at 64 MiB
/// instead of 1 GiB. An idle clone never reaches the cap, so its PSS is
/// unchanged by it: the idle figures are in docs/benchmarks.md ("Clone
/// density"). KVM has no translation buffer and is unaffected.
pub const TCG_TB_SIZE_MIB: u32 = 64;

/// The `-accel` option of a TCG machine (see [`TCG_TB_SIZE_MIB`]).
const TCG_ACCEL: &str = "tcg,thread=multi,tb-size=64";

/// QEMU's own seccomp filter for a jailed QEMU: no obsolete syscalls, no
/// set*id, no fork/exec, no scheduler or affinity changes.
pub const SECCOMP: &str = "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny";

/// The volume port's name (kept in sync with
/// `forkvm_agent_protocol::volume::PORT_NAME` by the same daemon test).
pub const VOLUME_PORT_NAME: &str = "org.forkvm.volumes.0";

/// Kept in sync with `forkvm_agent_protocol::PORT_NAME` (checked by a test in
/// the daemon, which depends on both crates).
pub fn forkvm_agent_port_name() -> &'static str {
    "org.forkvm.agent.0"
}

fn on_off(b: bool) -> &'static str {
    if b {
        "on"
    } else {
        "off"
    }
}

/// The kernel command line every sandbox boots with.
pub fn kernel_cmdline(hostname: &str, accel: Accel, extra: &str) -> String {
    // panic=1 with -no-reboot turns a guest panic into a QEMU exit.
    // 8250.nr_uarts=1 and the quiet flags shave boot time under TCG.
    // earlyprintk=serial: ttyS0 only becomes the console in console_init(),
    // after start_kernel first enables interrupts; without an early console
    // an Oops or panic before that point reaches no log at all. With
    // loglevel=4 only warnings and worse are printed, so a good boot writes
    // (almost) nothing early and pays nothing for it.
    let mut s = format!(
        "console=ttyS0 earlyprintk=serial panic=1 quiet loglevel=4 8250.nr_uarts=1 \
         random.trust_cpu=on forkvm.root=/dev/vda forkvm.hostname={hostname}"
    );
    if accel == Accel::Tcg {
        // See tsc.rs: skip the PIT calibration that hangs TCG boots.
        if let Some(khz) = crate::tsc::host_tsc_khz() {
            s.push_str(&format!(" tsc_early_khz={khz}"));
        }
        // Under TCG the guest TSC is the host's, so it is reliable; but the
        // kernel's clocksource watchdog compares it with jiffies, which lag
        // when the host is busy, marks the TSC unstable and falls back to
        // jiffies, and then the guest's clock runs slow (we saw 1.7 s behind
        // within seconds with 8 clones on 2 cores).
        s.push_str(" tsc=reliable");
    }
    if !extra.is_empty() {
        s.push(' ');
        s.push_str(extra);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> MachineConfig {
        MachineConfig {
            machine: MACHINE.into(),
            accel: Accel::Tcg,
            memory_mib: 512,
            cpus: 2,
            kernel: "/k".into(),
            initrd: "/i".into(),
            cmdline: kernel_cmdline("sb1", Accel::Tcg, ""),
            volume_port: false,
            nic: None,
        }
    }

    fn spec() -> MachineSpec {
        MachineSpec {
            name: "sb1".into(),
            config: config(),
            memory: MemoryBackend {
                path: "/dev/shm/x".into(),
                share: true,
                readonly: false,
            },
            root_disk: "/d.qcow2".into(),
            agent_socket: "/a.sock".into(),
            volume_socket: "/v.sock".into(),
            qmp_socket: "/q.sock".into(),
            console_log: "/c.log".into(),
            incoming: None,
            device_state_only: false,
            no_configuration_section: false,
            netns: None,
            later_reads: vec![],
        }
    }

    /// Every argument that depends on the config, rendered from it: the
    /// flag and its value next to each other, so a reader needs no parse.
    #[test]
    fn the_config_renders_every_argument_it_decides() {
        let mut s = spec();
        s.config.volume_port = true;
        s.config.nic = Some(Nic::standard());
        s.config.cpus = 3;
        let a = s.to_args();
        let val = |flag: &str| {
            let i = a.iter().position(|x| x == flag).unwrap();
            a[i + 1].clone()
        };
        assert_eq!(val("-smp"), "3");
        assert_eq!(val("-m"), "512M");
        assert_eq!(val("-kernel"), "/k");
        assert_eq!(val("-initrd"), "/i");
        assert_eq!(val("-append"), s.config.cmdline);
        let j = a.join(" ");
        assert!(j.contains("virtio-serial-device,max_ports=3"), "{j}");
        assert!(j.contains("socket,id=volumes,path=/v.sock,server=on,wait=off"));
        assert!(j.contains("virtserialport,chardev=volumes,name=org.forkvm.volumes.0,nr=2"));
        assert!(j.contains("virtio-net-device,netdev=net0,mac=02:fc:00:00:00:02"));
        assert!(j.contains("-netdev tap,id=net0,ifname=tap0,script=no,downscript=no"));
        // Without the port and the NIC, neither device exists.
        let j = spec().to_args().join(" ");
        assert!(j.contains("max_ports=2") && !j.contains("volumes") && !j.contains("-netdev"));
    }

    #[test]
    fn the_config_round_trips_through_json() {
        let mut c = config();
        c.nic = Some(Nic::standard());
        c.volume_port = true;
        let j = serde_json::to_string(&c).unwrap();
        assert!(j.contains("\"accel\":\"tcg\""), "{j}");
        assert_eq!(serde_json::from_str::<MachineConfig>(&j).unwrap(), c);
        // Optional parts may be left out: no port, no NIC.
        let mut v: serde_json::Value = serde_json::to_value(config()).unwrap();
        v.as_object_mut().unwrap().remove("volume_port");
        v.as_object_mut().unwrap().remove("nic");
        assert_eq!(
            serde_json::from_value::<MachineConfig>(v).unwrap(),
            config()
        );
    }

    /// A garbled or incomplete config is an error naming the field, never a
    /// panic or a silent default.
    #[test]
    fn a_garbled_config_is_an_error_that_names_the_field() {
        let mut v: serde_json::Value = serde_json::to_value(config()).unwrap();
        v.as_object_mut().unwrap().remove("memory_mib");
        let e = serde_json::from_value::<MachineConfig>(v).unwrap_err();
        assert!(e.to_string().contains("memory_mib"), "{e}");
        let mut v: serde_json::Value = serde_json::to_value(config()).unwrap();
        v["accel"] = "xen".into();
        let e = serde_json::from_value::<MachineConfig>(v).unwrap_err();
        assert!(e.to_string().contains("xen"), "{e}");
        let mut v: serde_json::Value = serde_json::to_value(config()).unwrap();
        v["nic"] = serde_json::json!({"tap": "tap0"});
        let e = serde_json::from_value::<MachineConfig>(v).unwrap_err();
        assert!(e.to_string().contains("mac"), "{e}");
        assert!(serde_json::from_str::<MachineConfig>("").is_err());
        assert!(serde_json::from_str::<MachineConfig>("[1,2]").is_err());
    }

    #[test]
    fn a_legacy_nic_is_read_from_whole_kernel_parameters() {
        let with = |s: &str| MachineConfig::legacy_nic(s).is_some();
        assert!(with(
            "console=ttyS0 forkvm.ip=172.16.0.2/30 forkvm.gw=172.16.0.1"
        ));
        assert!(with("forkvm.ip=172.16.0.2/30"));
        assert!(with("  a\tforkvm.ip=x  "));
        assert_eq!(
            MachineConfig::legacy_nic("forkvm.ip=1"),
            Some(Nic::standard())
        );
        // Not a parameter of its own, or no address at all.
        assert!(!with("console=ttyS0 xforkvm.ip=172.16.0.2/30"));
        assert!(!with("forkvm.ipv6=1 forkvm.gw=1.2.3.4"));
        assert!(!with("forkvm.ip"));
        assert!(!with(""));
        assert!(!with("\u{fffd}\u{0}"));
    }

    #[test]
    fn args_describe_a_microvm_with_file_backed_ram() {
        let a = spec().to_args().join(" ");
        assert!(a.contains("-M microvm,acpi=on,pic=off,pit=off,memory-backend=mem"));
        assert!(a.contains("memory-backend-file,id=mem,size=512M,mem-path=/dev/shm/x,share=on"));
        assert!(!a.contains("rom=off"));
        assert!(a.contains("-accel tcg,thread=multi,tb-size=64 -cpu max"));
        assert!(a.contains("name=org.forkvm.agent.0"));
        assert!(!a.contains("-incoming"));
        assert!(!a.contains("-netdev"));
        // The guest's TRIM reaches the host file through both nodes.
        assert!(a.contains("driver=file,filename=/d.qcow2,node-name=root-file,discard=unmap"));
        assert!(a.contains(
            "driver=qcow2,file=root-file,node-name=root,discard=unmap,detect-zeroes=unmap"
        ));
        assert!(
            a.contains("tsc_early_khz="),
            "TCG boots must not calibrate the TSC: {a}"
        );
        assert!(!kernel_cmdline("x", Accel::Kvm, "").contains("tsc_early_khz"));
        assert!(
            a.contains("earlyprintk=serial"),
            "early boot failures must reach the console log: {a}"
        );
    }

    #[test]
    fn tcg_caps_its_translation_buffer_and_kvm_has_none() {
        assert_eq!(
            TCG_ACCEL,
            format!("tcg,thread=multi,tb-size={TCG_TB_SIZE_MIB}")
        );
        let a = spec().to_args();
        let i = a.iter().position(|x| x == "-accel").unwrap();
        assert_eq!(a[i + 1], TCG_ACCEL);
        let mut k = spec();
        k.config.accel = Accel::Kvm;
        let a = k.to_args();
        let i = a.iter().position(|x| x == "-accel").unwrap();
        assert_eq!(a[i + 1], "kvm");
        assert!(!a.join(" ").contains("tb-size"));
    }

    #[test]
    fn readonly_clone_memory_always_sets_rom_off() {
        let mut s = spec();
        s.memory.readonly = true;
        s.memory.share = false;
        s.incoming = Some("defer".into());
        s.config.accel = Accel::Kvm;
        let a = s.to_args().join(" ");
        assert!(a.contains("share=off,readonly=on,rom=off"));
        assert!(a.contains("-incoming defer"));
        assert!(a.contains("-accel kvm -cpu host"));
        s.config.machine = LEGACY_MACHINE.into();
        assert!(s
            .to_args()
            .join(" ")
            .contains("-M microvm,acpi=on,memory-backend=mem"));
        s.config.nic = Some(Nic::standard());
        let a = s.to_args().join(" ");
        assert!(a.contains("-netdev tap,id=net0,ifname=tap0,script=no,downscript=no"));
        assert!(a.contains("-device virtio-net-device,netdev=net0,mac=02:fc:00:00:00:02"));
        assert!(!a.contains("-sandbox"));
        let j = s.args(true, Some(7)).join(" ");
        assert!(j.contains("-netdev tap,id=net0,fd=7 "), "{j}");
        assert!(j.ends_with(
            "-sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
        ));
    }

    #[test]
    fn accel_parses_and_rejects() {
        assert_eq!("kvm".parse::<Accel>().unwrap(), Accel::Kvm);
        assert!("xen".parse::<Accel>().unwrap_err().contains("kvm or tcg"));
    }
}

#[cfg(test)]
mod initrd_tests {
    use super::check_initrd_size;

    #[test]
    fn initrd_sizes() {
        assert!(check_initrd_size(0).is_ok());
        assert!(check_initrd_size(1_773_568).is_ok());
        let e = check_initrd_size(1_773_116).unwrap_err();
        assert!(
            e.contains("1773116") && e.contains("scripts/setup.sh"),
            "{e}"
        );
        assert!(check_initrd_size(4097).is_err());
    }
}
