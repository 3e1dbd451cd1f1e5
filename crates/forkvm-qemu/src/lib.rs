//! The QEMU driver: everything forkvm knows about running QEMU.
//!
//! * [`qmp`]: an async QMP client with events;
//! * [`spec`]: the typed machine config and the `microvm` command line it renders;
//! * [`legacy`]: machines recorded before the typed machine config, asked over QMP once;
//! * [`jail`]: confining a QEMU (mount namespace, uid, cgroup, no privileges);
//! * [`process`]: launching QEMU detached from the daemon and re-finding it;
//! * [`accel`]: choosing KVM or TCG, with the reason;
//! * [`features`]: the QEMU version and the features forkvm relies on;
//! * [`disk`]: copy-on-write root disks;
//! * [`qcow2`]: the backing file named by a qcow2 header;
//! * [`blockjob`]: the block graph of a running QEMU and streaming its layers together;
//! * [`migrate`]: saving and loading device state, freezing disks;
//! * [`mapped_ram`]: the RAM layout of a mapped-ram migration file;
//! * [`ram`]: a clone's written pages, read and written from outside QEMU;
//! * [`tsc`]: the host TSC rate for TCG guests.

pub mod accel;
pub mod blockjob;
pub mod disk;
pub mod fds;
pub mod features;
pub mod incremental;
pub mod jail;
pub mod legacy;
pub mod mapped_ram;
pub mod migrate;
pub mod process;
pub mod qcow2;
pub mod qmp;
pub mod ram;
pub mod spec;
pub mod tsc;

pub use accel::{AccelChoice, HostVirt};
pub use qmp::{Qmp, QmpError, QmpEvent};
pub use spec::{Accel, MachineConfig, MachineSpec, MemoryBackend, Nic};
