//! `forkvm volume create|ls|rm`: named volumes.

use std::process::ExitCode;

use anyhow::Result;
use clap::Subcommand;
use forkvm_api::Client;

use crate::print_json;

#[derive(Subcommand)]
pub enum VolumeCmd {
    /// Create a named volume (an empty directory under the daemon's home).
    Create { name: String },
    /// List named volumes and the sandboxes that mount them.
    Ls,
    /// Remove named volumes and their files (refused while mounted).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

pub async fn run(c: &Client, cmd: VolumeCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        VolumeCmd::Create { name } => {
            let v = c.create_volume(&name).await?;
            if json {
                print_json(&v)?;
            } else {
                println!("{}", v.name);
            }
        }
        VolumeCmd::Ls => {
            let l = c.list_volumes().await?;
            if json {
                print_json(&l)?;
            } else {
                println!("{:<24} {:<26} {:<40} USED BY", "NAME", "CREATED", "PATH");
                for v in &l.volumes {
                    println!(
                        "{:<24} {:<26} {:<40} {}",
                        v.name,
                        v.created_at,
                        v.path,
                        v.used_by.join(",")
                    );
                }
            }
        }
        VolumeCmd::Rm { names } => {
            return Ok(
                crate::remove_each(names, |n| async move { c.delete_volume(&n).await }).await,
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
