//! forkvm-agent: init process and request server of every forkvm microVM.
//!
//! The host boots Debian's generic kernel (PVH, QEMU `microvm`) with an
//! initramfs whose `/init` is this binary. The same process then lives on as
//! pid 1 of the sandbox and serves the host over virtio-serial. It works in
//! two stages.
//!
//! **Stage 1 — initramfs** (pid 1 and `/etc/forkvm/modules.list` exists):
//!
//! 1. mount proc, sysfs and devtmpfs;
//! 2. load every `.ko` named in `/etc/forkvm/modules.list` (one file name per
//!    line, dependencies first, from `/lib/modules/`) with `finit_module`,
//!    passing any `module.param=value` from the kernel command line. EEXIST is
//!    fine; other failures are reported and skipped;
//! 3. with `forkvm.probe=1` on the command line: print `FORKVM_PROBE_OK` and
//!    power off (the host uses this to check that an accelerator works);
//! 4. wait up to 10 s for `forkvm.root=` (default `/dev/vda`) and mount it as
//!    ext4 on `/newroot`;
//! 5. move /dev, /proc and /sys into it, make it `/` (MS_MOVE + chroot) and
//!    carry on in the same process: the root image does not contain the agent.
//!
//! A fatal stage-1 error prints `forkvm-agent: FATAL: <what> — <hint>` and
//! powers off, so the host sees QEMU exit with the reason in the console log.
//!
//! **Stage 2 — real root** (also runs when not pid 1, for local testing):
//!
//! 1. as pid 1: mount devpts, /dev/shm, /run and /tmp, set the hostname from
//!    `forkvm.hostname=`, bring `lo` up, and set PATH and HOME (only) for the
//!    commands it will run;
//! 2. find the virtio-serial port named `org.forkvm.agent.0` through
//!    `/sys/class/virtio-ports/*/name` (or use `$FORKVM_AGENT_PORT`, a unix
//!    socket or file, for local testing);
//! 3. print `forkvm-agent: ready` to the console;
//! 4. serve requests (see [`serve`]) until told to shut down.
//!
//! **Clones.** A VM restored from a snapshot resumes inside stage 2 with the
//! snapshot's memory, and QEMU's `microvm` has no VMGenID device to tell the
//! kernel it was cloned. So the host's first request to every clone is
//! `identity` (see [`identity`]): the agent mixes fresh host entropy into the
//! kernel RNG and reseeds it, sets the wall clock and hostname, and writes a
//! new machine id and instance id, all before any user code runs.
//!
//! A virtio-serial port reads EOF while no host is connected and blocks
//! writes until one is, so the host daemon can restart at will: the agent just
//! keeps reading. As pid 1 the agent also reaps orphaned processes; see
//! [`reaper`] for how that coexists with exec's need for exit statuses.

mod archive;
mod at;
mod boot;
mod boot_id;
mod cmdline;
mod command;
mod download;
mod exec;
mod files;
mod fsops;
mod handlers;
mod handlers_v3;
mod identity;
mod port;
mod probe;
mod procs;
mod pty;
mod reaper;
mod rootfs;
mod serve;
mod start;
mod streams;
mod sys;
mod users;
mod volumes;
mod watch;

use std::io::{self, Write};
use std::panic;
use std::path::Path;
use std::process;
use std::thread;
use std::time::Duration;

use boot::Fatal;
use port::{Conn, PortSpec};
use serve::Agent;

/// How long to wait for the agent port to appear or reopen.
const PORT_WAIT: Duration = Duration::from_secs(10);

/// A line on the console (stderr, which is the console as pid 1).
pub(crate) fn log(msg: &str) {
    eprintln!("forkvm-agent: {msg}");
}

fn main() {
    let pid1 = process::id() == 1;
    // As pid 1, unwinding out of main would panic the kernel (and, with
    // panic=1, reboot instead of stopping): turn a panic into a clean fatal.
    let fatal = match panic::catch_unwind(|| run(pid1)) {
        Ok(Ok(())) => process::exit(0),
        Ok(Err(f)) => f,
        Err(_) => Fatal::new(
            "the agent panicked",
            "this is a bug in forkvm-agent; the panic message is above",
        ),
    };
    eprintln!("{fatal}");
    if pid1 {
        sys::power_off();
    }
    process::exit(1);
}

fn run(pid1: bool) -> Result<(), Fatal> {
    if pid1 && Path::new(boot::MODULES_LIST).exists() {
        boot::stage1()?;
    }
    if pid1 {
        // Before any thread starts: this sets environment variables.
        boot::stage2_setup();
    }
    reaper::global()
        .map_err(|e| Fatal::new(e.to_string(), "the guest is out of memory or threads"))?;

    let spec = port::locate(PORT_WAIT).map_err(|e| {
        Fatal::new(
            format!("cannot find the agent port: {e}"),
            "the VM needs a virtserialport named org.forkvm.agent.0, and virtio_console in modules.list",
        )
    })?;
    let conn = port::open_retrying(&spec, PORT_WAIT).map_err(|e| {
        Fatal::new(
            format!("cannot open the agent port {spec:?}: {e}"),
            "is another process using it?",
        )
    })?;
    println!("forkvm-agent: ready");
    let _ = io::stdout().flush();
    serve_forever(&spec, conn, pid1)
}

/// A writer for the moment between two connections.
struct Disconnected;

impl Write for Disconnected {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::ErrorKind::NotConnected.into())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn serve_forever(spec: &PortSpec, conn: Conn, pid1: bool) -> Result<(), Fatal> {
    let Conn {
        mut reader,
        writer,
        mut eof,
    } = conn;
    // Opens what a clone's `identity` request will write to, now, in the
    // booted VM: see the identity module for why.
    // As pid 1 the boot id is mounted over the kernel's (identity module).
    let paths = if pid1 {
        identity::IdentityPaths::guest()
    } else {
        identity::IdentityPaths::default()
    };
    let agent = Agent::new(writer, move || shutdown(pid1), &paths);
    loop {
        match serve::serve_conn(&mut *reader, &agent, eof) {
            Ok(()) => log("the host closed the connection; reconnecting"),
            Err(e) => log(&format!("reading the agent port failed: {e}; reopening")),
        }
        // Close both handles first: a virtio port can only be open once.
        agent.outbox.replace(Box::new(Disconnected));
        drop(reader);
        match port::open_retrying(spec, PORT_WAIT) {
            Ok(c) => {
                reader = c.reader;
                eof = c.eof;
                agent.outbox.replace(c.writer);
                agent.new_connection();
            }
            // A local test host that went away for good: just stop.
            Err(e) if !pid1 && matches!(spec, PortSpec::Path(_)) => {
                log(&format!("cannot reconnect ({e}); exiting"));
                return Ok(());
            }
            Err(e) => {
                return Err(Fatal::new(
                    format!("cannot reopen the agent port {spec:?}: {e}"),
                    "the virtio-serial port disappeared",
                ))
            }
        }
    }
}

/// After `ShutdownAck` has been written: stop everything and power off (pid
/// 1) or exit (local testing).
fn shutdown(pid1: bool) {
    sys::sync();
    if !pid1 {
        process::exit(0);
    }
    // Ask everything else to stop. The pause also lets QEMU take the
    // ShutdownAck off the virtqueue before the machine disappears.
    sys::kill_all(libc::SIGTERM);
    thread::sleep(Duration::from_millis(200));
    sys::kill_all(libc::SIGKILL);
    thread::sleep(Duration::from_millis(50));
    sys::sync();
    // Best effort: a clean ext4 is nicer than a journal replay next boot.
    let _ = sys::remount_root_readonly();
    sys::power_off();
}
