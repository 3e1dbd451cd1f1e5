//! `forkvm fs`: filesystem operations in a sandbox, watches and archives.

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use clap::Subcommand;
use forkvm_api::{Client, EntryInfo, FileKind, FsOp, WatchEvent};

#[derive(Subcommand)]
pub enum FsCmd {
    /// Describe a guest path (as `lstat` sees it).
    Stat { id: String, path: String },
    /// Exit 0 if a guest path exists, 1 if not.
    Exists { id: String, path: String },
    /// List a directory.
    Ls {
        id: String,
        path: String,
        /// Levels to descend (1: its own entries).
        #[arg(long, default_value_t = 1)]
        depth: u32,
    },
    /// Make a directory and its missing parents.
    Mkdir { id: String, path: String },
    /// Move (rename) a file or directory.
    Mv {
        id: String,
        source: String,
        destination: String,
    },
    /// Remove a file, or a directory with all it holds.
    Rm { id: String, path: String },
    /// Print changes in a directory as they happen, one `OP NAME` per line,
    /// until interrupted.
    Watch {
        id: String,
        path: String,
        /// Watch its subdirectories too.
        #[arg(short = 'r', long)]
        recursive: bool,
    },
    /// Download guest paths (directories with all they hold) as one tar,
    /// each entry named by its absolute path without the leading `/`.
    Download {
        id: String,
        #[arg(required = true)]
        paths: Vec<String>,
        /// Write the tar here (default: stdout).
        #[arg(short = 'o', long, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Unpack a tar (FILE, or `-` for stdin) under a guest directory.
    Upload {
        id: String,
        /// The guest directory (created if missing).
        dest: String,
        #[arg(value_name = "FILE")]
        tar: PathBuf,
    },
}

fn kind(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "file",
        FileKind::Dir => "dir",
        FileKind::Symlink => "symlink",
        FileKind::Other => "other",
    }
}

fn line(e: &EntryInfo) -> String {
    let mut s = format!(
        "{} {:<8} {:<8} {:>10} {}",
        e.permissions, e.owner, e.group, e.size, e.path
    );
    if let Some(t) = &e.symlink_target {
        s.push_str(&format!(" -> {t}"));
    }
    s
}

pub async fn run(c: &Client, cmd: FsCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        FsCmd::Stat { id, path } => {
            let e = c.stat_file(&id, &path).await?;
            if json {
                crate::print_json(&e)?;
            } else {
                println!("{}", line(&e));
                println!("type: {}, mode: {:o}", kind(e.kind), e.mode);
            }
        }
        FsCmd::Exists { id, path } => {
            let exists = c.file_exists(&id, &path).await?;
            if json {
                crate::print_json(&serde_json::json!({ "exists": exists }))?;
            } else {
                println!("{exists}");
            }
            if !exists {
                return Ok(ExitCode::from(1));
            }
        }
        FsCmd::Ls { id, path, depth } => {
            let l = c.list_dir(&id, &path, depth).await?;
            if json {
                crate::print_json(&l)?;
            } else {
                for e in &l.entries {
                    println!("{}", line(e));
                }
            }
        }
        FsCmd::Mkdir { id, path } => {
            let d = c.make_dir(&id, &path).await?;
            if json {
                crate::print_json(&d)?;
            } else if d.existed {
                eprintln!("forkvm: {path} was a directory already");
            }
        }
        FsCmd::Mv {
            id,
            source,
            destination,
        } => {
            let e = c.move_file(&id, &source, &destination).await?;
            if json {
                crate::print_json(&e)?;
            }
        }
        FsCmd::Rm { id, path } => {
            c.remove_file(&id, &path).await?;
            if json {
                crate::print_json(&serde_json::json!({ "removed": path }))?;
            }
        }
        FsCmd::Watch {
            id,
            path,
            recursive,
        } => {
            let mut out_err = None;
            c.watch_dir(&id, &path, recursive, |ev| {
                let r = if json {
                    writeln!(
                        std::io::stdout(),
                        "{}",
                        serde_json::to_string(ev).unwrap_or_default()
                    )
                } else {
                    match ev {
                        WatchEvent::Start => {
                            eprintln!("forkvm: watching {path}");
                            Ok(())
                        }
                        WatchEvent::Events { events, dropped } => {
                            if *dropped > 0 {
                                eprintln!("forkvm: {dropped} changes were lost here");
                            }
                            let mut o = std::io::stdout().lock();
                            events.iter().try_for_each(|e| {
                                let op = match e.op {
                                    FsOp::Create => "create",
                                    FsOp::Write => "write",
                                    FsOp::Remove => "remove",
                                    FsOp::Rename => "rename",
                                    FsOp::Chmod => "chmod",
                                };
                                writeln!(o, "{op} {}", e.name)
                            })
                        }
                        _ => Ok(()),
                    }
                };
                let _ = std::io::stdout().flush();
                match r {
                    Ok(()) => true,
                    Err(e) => {
                        out_err = Some(e);
                        false
                    }
                }
            })
            .await?;
            if let Some(e) = out_err {
                return Err(e).context("writing the events");
            }
        }
        FsCmd::Download { id, paths, output } => {
            let refs: Vec<&str> = paths.iter().map(String::as_str).collect();
            let tar = c.download_archive(&id, &refs).await?;
            match output {
                Some(f) => {
                    std::fs::write(&f, &tar).with_context(|| format!("writing {}", f.display()))?
                }
                None => std::io::stdout().write_all(&tar)?,
            }
        }
        FsCmd::Upload { id, dest, tar } => {
            let data = if tar.as_os_str() == "-" {
                let mut b = Vec::new();
                std::io::stdin()
                    .read_to_end(&mut b)
                    .context("reading stdin")?;
                b
            } else {
                std::fs::read(&tar).with_context(|| format!("reading {}", tar.display()))?
            };
            let w = c.upload_archive(&id, &dest, data.into()).await?;
            if json {
                crate::print_json(&w)?;
            } else {
                eprintln!(
                    "forkvm: wrote {} entries ({} bytes) under {dest}",
                    w.entries, w.bytes
                );
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
