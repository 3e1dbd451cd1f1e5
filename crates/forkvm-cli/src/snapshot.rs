//! `forkvm snapshot` and its subcommands.

use std::process::ExitCode;

use anyhow::{anyhow, Result};
use forkvm_api::Client;

use crate::args::*;
use crate::gc;
use crate::print_json;

pub(crate) async fn snapshot_cmd(
    c: &Client,
    cmd: Option<SnapCmd>,
    id: Option<String>,
    tag: Option<String>,
    json: bool,
) -> Result<ExitCode> {
    let show = |s: &forkvm_api::Snapshot| {
        println!(
            "{:<16} {:<14} {:<7} {:<16} {:>6}M {:>4} {:>9} {:<24} {}",
            s.id,
            s.tag.clone().unwrap_or_else(|| if s.template {
                "(template)".into()
            } else if s.pinned {
                "(pinned)".into()
            } else {
                "-".into()
            }),
            s.kind,
            s.parent.clone().unwrap_or_else(|| "-".into()),
            s.memory_mib,
            s.cpus,
            // What its directory really holds (caches and disk layer
            // included); a daemon before `on_disk_bytes` gives 0, so its
            // memory and state sizes then.
            format!(
                "{}M",
                if s.sizes.on_disk_bytes > 0 {
                    s.sizes.on_disk_bytes
                } else {
                    s.sizes.memory_allocated_bytes
                        + s.sizes.memory_diff_bytes
                        + s.sizes.device_state_bytes
                } >> 20
            ),
            s.created_at,
            s.sandboxes.len()
        );
    };
    match cmd {
        None => {
            let id = id.ok_or_else(|| {
                anyhow!("name the sandbox to snapshot: forkvm snapshot ID [--tag T]")
            })?;
            let s = c.snapshot(&id, &forkvm_api::CreateSnapshot { tag }).await?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}", s.id);
                if let Some(t) = &s.timings {
                    eprintln!(
                        "forkvm: snapshot of {id}: source paused {:.1} ms, total {:.0} ms",
                        t.pause_ms, t.total_ms
                    );
                }
            }
        }
        Some(SnapCmd::Ls) => {
            let l = c.list_snapshots().await?;
            if json {
                print_json(&l)?;
            } else {
                println!(
                    "{:<16} {:<14} {:<7} {:<16} {:>7} {:>4} {:>9} {:<24} SANDBOXES",
                    "ID", "TAG", "KIND", "PARENT", "MEM", "CPUS", "ON DISK", "CREATED"
                );
                for s in &l.snapshots {
                    show(s);
                }
            }
        }
        Some(SnapCmd::Inspect { id }) => print_json(&c.get_snapshot(&id).await?)?,
        Some(SnapCmd::Rm { ids, force }) => {
            let mut failed = false;
            for id in ids {
                match c.delete_snapshot(&id, force).await {
                    Ok(()) => {
                        if !json {
                            println!("{id}");
                        }
                    }
                    Err(e) => {
                        eprintln!("forkvm: cannot remove snapshot {id}: {e}");
                        failed = true;
                    }
                }
            }
            if failed {
                return Ok(ExitCode::from(1));
            }
        }
        Some(SnapCmd::Flatten { id, tag }) => {
            let s = c.flatten(&id, &forkvm_api::FlattenRequest { tag }).await?;
            if json {
                print_json(&s)?;
            } else {
                println!("{}", s.id);
            }
        }
        Some(SnapCmd::Push {
            id,
            reference,
            auth,
        }) => crate::transfer::push(c, &id, reference, auth, json).await?,
        Some(SnapCmd::Pull {
            reference,
            tag,
            auth,
        }) => crate::transfer::pull(c, reference, tag, auth, json).await?,
        Some(SnapCmd::Pin { id }) => gc::pin(c, &id, true, json).await?,
        Some(SnapCmd::Unpin { id }) => gc::pin(c, &id, false, json).await?,
        Some(SnapCmd::Prune { all, dry_run }) => return gc::prune(c, all, dry_run, json).await,
        Some(SnapCmd::Pool { id, size }) => {
            let s = c.set_pool(&id, size.0).await?;
            if json {
                print_json(&s)?;
            } else if s.pool_default {
                println!(
                    "{}: warm pool of {} (the daemon's default)",
                    s.id, s.pool_size
                );
            } else {
                println!("{}: warm pool of {}", s.id, s.pool_size);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
