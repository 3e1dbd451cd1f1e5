//! `forkvm checkpoint`, `forkvm timeline` and `forkvm rewind`: a sandbox's
//! time travel (docs/timetravel.md).

use std::process::ExitCode;

use clap::Subcommand;
use forkvm_api::{
    ChangeKind, Checkpoint, CheckpointRequest, Client, Diff, DiffRequest, MergeRequest,
    MergeStrategy, Retention, RewindRequest, Timeline,
};

/// The time-travel commands.
#[derive(Subcommand)]
pub enum TimeCmd {
    /// Checkpoint a running sandbox: a live save storing only what changed
    /// since its previous checkpoint. `--keep-last`/`--keep-every` set its
    /// retention policy (applied after every checkpoint).
    Checkpoint {
        id: String,
        /// A unique name for the checkpoint; tagged checkpoints are kept.
        #[arg(long)]
        tag: Option<String>,
        /// Keep only the last N checkpoints (plus tagged and every Kth).
        #[arg(long, value_name = "N")]
        keep_last: Option<u32>,
        /// Also keep every Kth checkpoint by step number.
        #[arg(long, value_name = "K")]
        keep_every: Option<u32>,
        /// Only set the retention policy; take no checkpoint.
        #[arg(long, requires = "keep_last")]
        policy_only: bool,
    },
    /// List a sandbox's checkpoints: step, id, time, tag, size and pause.
    Timeline { id: String },
    /// Bring a running sandbox back to one of its checkpoints or snapshots,
    /// as the same sandbox (same id, network and ports).
    Rewind {
        id: String,
        /// The checkpoint or snapshot (id or tag).
        to: String,
        /// Checkpoint the present first, so the rewind can be undone.
        #[arg(long)]
        checkpoint_first: bool,
    },
    /// List the filesystem differences between two sandboxes, snapshots or
    /// checkpoints: `A` added, deleted, modified (`docker diff` letters).
    Diff {
        a: String,
        b: String,
        /// Only under this absolute directory.
        #[arg(long, value_name = "PREFIX")]
        path: Option<String>,
        /// Also print a unified diff of text files.
        #[arg(long)]
        text: bool,
    },
    /// Apply CHILD's filesystem changes since its branch point to TARGET
    /// (a running sandbox), three-way; conflicts refuse it unless a
    /// strategy settles them. Memory is not merged.
    Merge {
        child: String,
        #[arg(long, value_name = "TARGET")]
        into: String,
        #[arg(long, value_name = "PREFIX")]
        path: Option<String>,
        /// Conflicts keep the target's version.
        #[arg(long, conflicts_with_all = ["theirs", "text"])]
        ours: bool,
        /// Conflicts take the child's version.
        #[arg(long, conflicts_with = "text")]
        theirs: bool,
        /// Conflicting text files are merged line by line.
        #[arg(long)]
        text: bool,
        /// Plan and list, change nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn letter(k: ChangeKind) -> char {
    match k {
        ChangeKind::Added => 'A',
        ChangeKind::Deleted => 'D',
        ChangeKind::Modified => 'C',
        ChangeKind::Mode => 'M',
        ChangeKind::Type => 'T',
    }
}

fn print_diff(d: &Diff) {
    for c in &d.changes {
        let side = c.b.as_ref().or(c.a.as_ref());
        let (size, mode) = side.map_or((0, 0), |s| (s.size, s.mode));
        println!("{} {:>10} {:04o}  {}", letter(c.change), size, mode, c.path);
        if let Some(p) = &c.patch {
            print!("{p}");
        }
    }
    println!(
        "{} added, {} deleted, {} modified, {} other; {} entries compared, {} files read, {:.0} ms",
        d.stats.added,
        d.stats.deleted,
        d.stats.modified,
        d.stats.other,
        d.entries,
        d.contents_read,
        d.diff_ms
    );
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
}

fn line(c: &Checkpoint) -> String {
    format!(
        "{:>4}  {}  {}  {:<14} {:>10}  pause {:>6}{}",
        c.seq,
        c.id,
        c.created_at,
        c.tag.as_deref().unwrap_or("-"),
        mib(c.bytes),
        c.pause_ms.map_or("-".into(), |p| format!("{p:.1} ms")),
        if c.head { "  (head)" } else { "" }
    )
}

fn print_timeline(t: &Timeline) {
    let r = &t.retention;
    println!(
        "sandbox {}: {} checkpoint(s), {} stored; keep last {}, every {}",
        t.sandbox,
        t.checkpoints.len(),
        mib(t.bytes),
        r.keep_last.map_or("all".into(), |n| n.to_string()),
        r.keep_every.map_or("-".into(), |n| n.to_string()),
    );
    println!("step  id               created                   tag                  size  pause");
    for c in &t.checkpoints {
        println!("{}", line(c));
    }
}

pub async fn run(c: &Client, cmd: TimeCmd, json: bool) -> anyhow::Result<ExitCode> {
    let out = |v: &dyn erased::Json| -> anyhow::Result<()> {
        println!("{}", v.pretty()?);
        Ok(())
    };
    match cmd {
        TimeCmd::Checkpoint {
            id,
            tag,
            keep_last,
            keep_every,
            policy_only,
        } => {
            if keep_last.is_some() || keep_every.is_some() {
                let t = c
                    .set_retention(
                        &id,
                        &Retention {
                            keep_last,
                            keep_every,
                        },
                    )
                    .await?;
                if policy_only {
                    if json {
                        out(&t)?;
                    } else {
                        print_timeline(&t);
                    }
                    return Ok(ExitCode::SUCCESS);
                }
            }
            let cp = c.checkpoint(&id, &CheckpointRequest { tag }).await?;
            if json {
                out(&cp)?;
            } else {
                println!("{}", line(&cp));
            }
        }
        TimeCmd::Diff { a, b, path, text } => {
            let d = c.diff(&a, &DiffRequest { b, path, text }).await?;
            if json {
                out(&d)?;
            } else {
                print_diff(&d);
            }
        }
        TimeCmd::Merge {
            child,
            into,
            path,
            ours,
            theirs,
            text,
            dry_run,
        } => {
            let strategy = match (ours, theirs, text) {
                (true, _, _) => Some(MergeStrategy::Ours),
                (_, true, _) => Some(MergeStrategy::Theirs),
                (_, _, true) => Some(MergeStrategy::Text),
                _ => None,
            };
            let req = MergeRequest {
                into,
                path,
                strategy,
                dry_run,
            };
            let m = c.merge(&child, &req).await?;
            if json {
                out(&m)?;
            } else {
                for p in &m.applied {
                    println!("{} {}", letter(p.change), p.path);
                }
                for k in &m.settled {
                    println!("settled {}: {}", k.path, k.reason);
                }
                for k in &m.conflicts {
                    println!("CONFLICT {}: {}", k.path, k.reason);
                }
                println!(
                    "{} {} path(s) of {} into {} (branch point {}) in {:.0} ms",
                    if m.dry_run { "would merge" } else { "merged" },
                    m.applied.len(),
                    m.child,
                    m.into,
                    m.base,
                    m.merge_ms
                );
            }
        }
        TimeCmd::Timeline { id } => {
            let t = c.timeline(&id).await?;
            if json {
                out(&t)?;
            } else {
                print_timeline(&t);
            }
        }
        TimeCmd::Rewind {
            id,
            to,
            checkpoint_first,
        } => {
            let r = c
                .rewind(
                    &id,
                    &RewindRequest {
                        to,
                        checkpoint_first,
                    },
                )
                .await?;
            if json {
                out(&r)?;
            } else {
                println!(
                    "sandbox {} rewound to {} in {:.0} ms{}",
                    r.sandbox.id,
                    r.to,
                    r.rewind_ms,
                    r.undo
                        .map(|u| format!("; undo with: forkvm rewind {} {}", r.sandbox.id, u.id))
                        .unwrap_or_default()
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Pretty JSON of any of the bodies above.
mod erased {
    pub trait Json {
        fn pretty(&self) -> serde_json::Result<String>;
    }
    impl<T: serde::Serialize> Json for T {
        fn pretty(&self) -> serde_json::Result<String> {
            serde_json::to_string_pretty(self)
        }
    }
}
