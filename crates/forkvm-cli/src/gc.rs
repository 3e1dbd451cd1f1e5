//! `forkvm snapshot pin|unpin|prune`: garbage collection of branch points
//! (the daemon decides; see docs/gc.md).

use std::process::ExitCode;

use anyhow::Result;
use forkvm_api::{Client, GcInfo, PruneRequest};

use crate::print_json;

/// Bytes for people: `517.2 MiB`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The `gc:` line of `forkvm info`.
pub fn info_line(g: &GcInfo) -> String {
    if g.enabled {
        format!(
            "gc:          every {} s, branch points older than {} s",
            g.interval_secs, g.grace_secs
        )
    } else {
        format!(
            "gc:          off in the background (prune still applies a grace of {} s)",
            g.grace_secs
        )
    }
}

/// `forkvm snapshot pin|unpin REF`.
pub async fn pin(c: &Client, id: &str, pinned: bool, json: bool) -> Result<()> {
    let s = if pinned {
        c.pin_snapshot(id).await?
    } else {
        c.unpin_snapshot(id).await?
    };
    if json {
        print_json(&s)?;
    } else {
        println!("{}: {}", s.id, if s.pinned { "pinned" } else { "unpinned" });
    }
    Ok(())
}

/// `forkvm snapshot prune [--all] [--dry-run]`: one line per snapshot, then
/// the total; exit 1 when some could not be removed.
pub async fn prune(c: &Client, all: bool, dry_run: bool, json: bool) -> Result<ExitCode> {
    let r = c
        .prune_snapshots(&PruneRequest {
            all: all.then_some(true),
            dry_run: dry_run.then_some(true),
        })
        .await?;
    if json {
        print_json(&r)?;
    } else {
        for s in &r.snapshots {
            println!("{:<16} {:<7} {:>10}", s.id, s.kind, human_bytes(s.bytes));
        }
        let n = r.snapshots.len();
        let grace = if all {
            String::new()
        } else {
            format!(" older than {} s (--all ignores that)", r.grace_secs)
        };
        if n == 0 {
            println!("nothing to collect: no unneeded branch point{grace}");
        } else if r.dry_run {
            println!(
                "would remove {n} snapshot(s) and free at least {} (dry run: nothing removed)",
                human_bytes(r.freed_bytes)
            );
        } else {
            println!(
                "removed {n} snapshot(s), freed {}",
                human_bytes(r.freed_bytes)
            );
        }
    }
    for f in &r.failed {
        eprintln!("forkvm: could not remove snapshot {}: {}", f.id, f.message);
    }
    Ok(if r.failed.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_read_well() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(542 << 20), "542.0 MiB");
        assert_eq!(human_bytes(3 << 30), "3.0 GiB");
    }
}
