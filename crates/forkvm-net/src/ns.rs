//! Creating and removing sandbox namespaces and their links.
//!
//! Links and addresses are made with `ip -batch` (iproute2) and rules with
//! `nft -f` (nftables), each a single process per step, so a spawn pays a
//! few process starts, not one per setting. Both tools come from Debian and
//! are installed by `scripts/setup.sh`. Commands that must run inside a
//! namespace enter it with `setns(2)` between fork and exec, which is
//! cheaper than `ip netns exec` (no mount namespace is made).

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use crate::pool::Slot;
use crate::{NetError, GATEWAY_ADDR, GUEST_PREFIX, NS_PREFIX, TAP_MAC, TAP_NAME, UPLINK_NAME};

/// Where `ip netns` keeps its namespace mounts.
pub const NETNS_DIR: &str = "/run/netns";

/// The mount of a named namespace.
pub fn ns_path(name: &str) -> PathBuf {
    Path::new(NETNS_DIR).join(name)
}

/// Run a program, optionally inside a namespace, with `input` on stdin.
pub async fn run(
    ns: Option<&str>,
    program: &str,
    args: &[&str],
    input: Option<&str>,
) -> Result<String, NetError> {
    let what = format!("{program} {}", args.join(" "));
    let mut cmd = tokio::process::Command::new(program);
    cmd.args(args)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    // Held open until the child has started.
    let ns_file = match ns {
        Some(n) => Some(
            std::fs::File::open(ns_path(n)).map_err(|e| NetError::Command {
                what: what.clone(),
                detail: format!("cannot open namespace {n}: {e}"),
            })?,
        ),
        None => None,
    };
    if let Some(f) = &ns_file {
        let fd = f.as_raw_fd();
        // SAFETY: setns is async-signal-safe, touches only the calling
        // (child) process, and the fd stays open until spawn returns.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setns(fd, libc::CLONE_NEWNET) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().map_err(|e| NetError::Command {
        what: what.clone(),
        detail: format!("{e}; install iproute2 and nftables (scripts/setup.sh)"),
    })?;
    drop(ns_file);
    if let (Some(text), Some(mut stdin)) = (input, child.stdin.take()) {
        let _ = stdin.write_all(text.as_bytes()).await;
    }
    let out = child
        .wait_with_output()
        .await
        .map_err(|e| NetError::Command {
            what: what.clone(),
            detail: e.to_string(),
        })?;
    if !out.status.success() {
        let mut detail = String::from_utf8_lossy(&out.stderr).trim().to_string();
        if let Some(i) = input {
            detail.push_str(&format!("\n-- input --\n{i}"));
        }
        return Err(NetError::Command { what, detail });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Create a sandbox namespace holding only `lo` and the tap QEMU attaches
/// to, with forwarding on. Removes a half-made namespace on failure.
pub async fn create(name: &str) -> Result<(), NetError> {
    run(None, "ip", &["netns", "add", name], None).await?;
    let batch = format!(
        "link set lo up\n\
         tuntap add dev {TAP_NAME} mode tap\n\
         link set {TAP_NAME} address {TAP_MAC}\n\
         addr add {GATEWAY_ADDR}/{GUEST_PREFIX} dev {TAP_NAME}\n\
         link set {TAP_NAME} up\n"
    );
    let r = async {
        run(None, "ip", &["-n", name, "-batch", "-"], Some(&batch)).await?;
        set_forwarding(name).await
    }
    .await;
    if r.is_err() {
        let _ = delete(name).await;
    }
    r
}

/// `net.ipv4.ip_forward=1` inside a namespace: sysctl files under
/// `/proc/sys/net` belong to the netns of the thread that opens them.
///
/// The `setns` happens on a thread made for it and joined, never on a
/// thread of tokio's blocking pool: setns changes the calling thread for
/// good, and tokio keeps pool threads for later blocking work and even turns
/// them into async workers (`block_in_place`). A pool thread left in a
/// sandbox's namespace once made the daemon's later sockets open there, so
/// a registry on 127.0.0.1 answered "connection refused".
async fn set_forwarding(name: &str) -> Result<(), NetError> {
    let path = ns_path(name);
    let r = tokio::task::spawn_blocking(move || {
        std::thread::Builder::new()
            .name("forkvm-setns".into())
            .spawn(move || -> std::io::Result<()> {
                let f = std::fs::File::open(&path)?;
                // SAFETY: setns affects only this thread, which ends when
                // the closure returns.
                if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                std::fs::write("/proc/sys/net/ipv4/ip_forward", "1")
            })?
            .join()
            .unwrap_or_else(|_| Err(std::io::Error::other("the setns thread panicked")))
    })
    .await
    .map_err(|e| NetError::Io(e.to_string()))?;
    r.map_err(|e| NetError::Io(format!("cannot enable forwarding in {name}: {e}")))
}

/// Connect a namespace to the host: a veth pair with the slot's addresses
/// and a default route out through it.
pub async fn add_uplink(name: &str, host_if: &str, slot: Slot) -> Result<(), NetError> {
    let host = format!(
        "link add {host_if} type veth peer name {UPLINK_NAME} netns {name}\n\
         addr add {}/30 dev {host_if}\n\
         link set {host_if} up\n",
        slot.host
    );
    run(None, "ip", &["-batch", "-"], Some(&host)).await?;
    let inner = format!(
        "addr add {}/30 dev {UPLINK_NAME}\n\
         link set {UPLINK_NAME} up\n\
         route add default via {}\n",
        slot.ns, slot.host
    );
    if let Err(e) = run(None, "ip", &["-n", name, "-batch", "-"], Some(&inner)).await {
        let _ = run(None, "ip", &["link", "del", host_if], None).await;
        return Err(e);
    }
    Ok(())
}

/// Load a ruleset (an `nft -f` script) in a namespace, or on the host.
pub async fn nft(ns: Option<&str>, script: &str) -> Result<(), NetError> {
    run(ns, "nft", &["-f", "-"], Some(script)).await.map(|_| ())
}

/// Delete a namespace. Its links go with it once no process holds it (the
/// caller kills the sandbox's QEMU first). Deleting a missing one is fine.
pub async fn delete(name: &str) -> Result<(), NetError> {
    if !ns_path(name).exists() {
        return Ok(());
    }
    run(None, "ip", &["netns", "del", name], None)
        .await
        .map(|_| ())
}

/// Names of all forkvm namespaces on the host.
pub fn list() -> Vec<String> {
    std::fs::read_dir(NETNS_DIR)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(NS_PREFIX))
                .collect()
        })
        .unwrap_or_default()
}

/// Host interfaces whose names start with `prefix`.
pub fn host_links(prefix: &str) -> Vec<String> {
    std::fs::read_dir("/sys/class/net")
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default()
}

/// Turn on IPv4 forwarding on the host (NAT needs it). Returns whether it
/// had to change.
pub fn enable_host_forwarding() -> Result<bool, NetError> {
    let p = "/proc/sys/net/ipv4/ip_forward";
    let cur = std::fs::read_to_string(p).unwrap_or_default();
    if cur.trim() == "1" {
        return Ok(false);
    }
    std::fs::write(p, "1")
        .map(|_| true)
        .map_err(|e| NetError::Io(format!("cannot enable IPv4 forwarding ({p}): {e}")))
}

#[cfg(test)]
mod tests {
    /// Needs root and iproute2, like the daemon (make test runs it).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    #[ignore = "needs root and iproute2: make test"]
    async fn creating_a_namespace_leaves_no_thread_in_it() {
        let host = std::fs::read_link("/proc/self/ns/net").unwrap();
        let name = format!("fvt-leak-{}", std::process::id());
        super::create(&name).await.expect("ip netns add (root?)");
        // Every thread the runtime has, pool threads included, is still in
        // the host's namespace.
        let mut seen = Vec::new();
        for _ in 0..64 {
            seen.push(
                tokio::task::spawn_blocking(|| std::fs::read_link("/proc/thread-self/ns/net"))
                    .await
                    .unwrap()
                    .unwrap(),
            );
        }
        seen.push(tokio::task::block_in_place(|| {
            std::fs::read_link("/proc/thread-self/ns/net").unwrap()
        }));
        super::delete(&name).await.unwrap();
        assert!(seen.iter().all(|n| *n == host), "{seen:?} vs {host:?}");
    }
}
