//! `forkvm image pull|import|build|ls|inspect|rm`: bring your own
//! environment (see docs/images.md). The daemon does the work; this module
//! packs what it needs (an archive, a build context) into a temporary tar,
//! streams it, and renders the progress events: a redrawn status line on a
//! terminal, plain lines otherwise, the raw events with `--json`.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Subcommand;
use forkvm_api::{BuildQuery, Client, Image, ImageEvent, ImportQuery, PullImage, StartCommand};

use crate::gc::human_bytes;
use crate::print_json;

use forkvm_api::DOCKERFILE_IN_CONTEXT;

#[derive(clap::Args, Clone, Default)]
pub struct StartArgs {
    /// A command the image's boot template starts (and every spawn resumes
    /// running), e.g. --start "python3 -m http.server 8000" (split on
    /// spaces; use --start-json for arguments with spaces).
    #[arg(long, value_name = "CMD")]
    start: Option<String>,
    /// The start command as a JSON array.
    #[arg(long, value_name = "JSON", conflicts_with = "start")]
    start_json: Option<String>,
    /// The start command is ready when this guest TCP port accepts.
    #[arg(long, value_name = "PORT")]
    ready_port: Option<u16>,
    /// The start command is ready when this command exits 0.
    #[arg(long, value_name = "CMD", conflicts_with = "ready_port")]
    ready_cmd: Option<String>,
    /// How long the readiness check may take, in seconds.
    #[arg(long, value_name = "SECS")]
    ready_timeout: Option<u64>,
}

impl StartArgs {
    fn to_api(&self) -> Result<Option<StartCommand>> {
        let command = match (&self.start, &self.start_json) {
            (Some(s), _) => s.split_whitespace().map(str::to_string).collect(),
            (None, Some(j)) => serde_json::from_str::<Vec<String>>(j)
                .context("--start-json must be a JSON array of strings")?,
            (None, None) => {
                if self.ready_port.is_some() || self.ready_cmd.is_some() {
                    bail!("--ready-port/--ready-cmd need --start");
                }
                return Ok(None);
            }
        };
        Ok(Some(StartCommand {
            command,
            ready_port: self.ready_port,
            ready_command: self
                .ready_cmd
                .as_ref()
                .map(|c| c.split_whitespace().map(str::to_string).collect()),
            ready_timeout_secs: self.ready_timeout,
        }))
    }
}

#[derive(Subcommand)]
pub enum ImageCmd {
    /// Pull an image from an OCI registry (e.g. 127.0.0.1:5000/team/py:3.12).
    Pull {
        reference: String,
        /// Local name (default: repository and tag, e.g. py-3.12).
        #[arg(long)]
        name: Option<String>,
        /// Registry user (default: ~/.docker/config.json, else anonymous).
        #[arg(long, requires = "password")]
        username: Option<String>,
        /// Registry password (`-` reads it from stdin).
        #[arg(long, requires = "username")]
        password: Option<String>,
        /// Speak plain HTTP to the registry (loopback registries always may).
        #[arg(long)]
        insecure: bool,
        /// Root disk size, e.g. 4G (default: content plus room).
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        disk_size: Option<u64>,
        /// Replace an image of the same name.
        #[arg(long)]
        replace: bool,
        #[command(flatten)]
        start: StartArgs,
    },
    /// Import a `docker save` tar, an OCI layout (directory or tar), or a
    /// root filesystem tarball.
    Import {
        path: PathBuf,
        /// The image's name.
        #[arg(long)]
        name: String,
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        disk_size: Option<u64>,
        #[arg(long)]
        replace: bool,
    },
    /// Build an image from a Dockerfile; the steps run in a sandbox.
    Build {
        /// The build context directory.
        context: PathBuf,
        /// The Dockerfile (default: CONTEXT/Dockerfile).
        #[arg(short = 'f', long = "file")]
        file: Option<PathBuf>,
        /// The image's name.
        #[arg(short = 't', long)]
        tag: String,
        /// A build argument (repeatable).
        #[arg(long = "build-arg", value_name = "KEY=VALUE")]
        build_args: Vec<String>,
        /// Run every step, ignoring the cache.
        #[arg(long)]
        no_cache: bool,
        /// Build this stage (`FROM … AS NAME`) instead of the last.
        #[arg(long, value_name = "NAME")]
        target: Option<String>,
        #[arg(long, value_name = "SIZE", value_parser = parse_size)]
        disk_size: Option<u64>,
        /// Guest RAM of the build sandbox in MiB.
        #[arg(long, value_name = "MiB")]
        memory: Option<u32>,
    },
    /// List images.
    Ls,
    /// Show an image's config, layers and users.
    Inspect { name: String },
    /// Remove images (refused while sandboxes or snapshots use them).
    Rm {
        #[arg(required = true)]
        names: Vec<String>,
    },
}

/// `4G`, `512M`, `100k` or bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let unit = t[i..].to_ascii_lowercase();
            let m: u64 = match unit.trim_end_matches("ib").trim_end_matches('b') {
                "" => 1,
                "k" => 1 << 10,
                "m" => 1 << 20,
                "g" => 1 << 30,
                "t" => 1 << 40,
                _ => return Err(format!("{s:?}: unknown unit (use K, M, G or T)")),
            };
            (&t[..i], m)
        }
        None => (t, 1),
    };
    let n: f64 = num
        .trim()
        .parse()
        .map_err(|_| format!("{s:?} is not a size, e.g. 4G or 512M"))?;
    if !(n > 0.0 && n.is_finite()) {
        return Err(format!("{s:?} must be positive"));
    }
    Ok((n * mult as f64).ceil() as u64)
}

pub async fn run(c: &Client, cmd: ImageCmd, json: bool) -> Result<ExitCode> {
    match cmd {
        ImageCmd::Ls => {
            let l = c.list_images().await?;
            if json {
                print_json(&l)?;
            } else {
                println!(
                    "{:<24} {:<9} {:>10}  {:<20}  REFERENCE",
                    "NAME", "SOURCE", "SIZE", "CREATED"
                );
                for i in &l.images {
                    println!(
                        "{:<24} {:<9} {:>10}  {:<20}  {}",
                        i.name,
                        i.source,
                        human_bytes(i.size_bytes),
                        i.created_at,
                        i.reference.as_deref().unwrap_or("")
                    );
                }
            }
        }
        ImageCmd::Inspect { name } => print_json(&c.get_image(&name).await?)?,
        ImageCmd::Rm { names } => {
            return Ok(
                crate::remove_each(names, |n| async move { c.delete_image(&n).await }).await,
            );
        }
        ImageCmd::Pull {
            reference,
            name,
            username,
            password,
            insecure,
            disk_size,
            replace,
            start,
        } => {
            let password = read_password(password)?;
            let req = PullImage {
                reference,
                name,
                username,
                password,
                insecure,
                disk_size,
                replace,
                start: start.to_api()?,
                stream: true,
            };
            let mut r = Renderer::new(json);
            let img = c.pull_image(&req, |e| r.event(e)).await;
            r.finish();
            done(img?, json)?;
        }
        ImageCmd::Import {
            path,
            name,
            disk_size,
            replace,
        } => {
            let (file, _tmp) = if path.is_dir() {
                let t = tar_dir(&path, None)?;
                (t.path().to_path_buf(), Some(t))
            } else if path.is_file() {
                (path.clone(), None)
            } else {
                bail!("{} does not exist", path.display());
            };
            let q = ImportQuery {
                name,
                file: path.file_name().map(|f| f.to_string_lossy().into_owned()),
                disk_size,
                replace: replace.then_some(true),
            };
            let mut r = Renderer::new(json);
            let img = c.import_image(&file, &q, |e| r.event(e)).await;
            r.finish();
            done(img?, json)?;
        }
        ImageCmd::Build {
            context,
            file,
            tag,
            build_args,
            no_cache,
            target,
            disk_size,
            memory,
        } => {
            if !context.is_dir() {
                bail!("the build context {} is not a directory", context.display());
            }
            let dockerfile = file.unwrap_or_else(|| context.join("Dockerfile"));
            let text = std::fs::read(&dockerfile)
                .with_context(|| format!("reading {}", dockerfile.display()))?;
            let mut args = serde_json::Map::new();
            for kv in &build_args {
                let (k, v) = kv
                    .split_once('=')
                    .ok_or_else(|| anyhow!("--build-arg {kv:?} must look like KEY=VALUE"))?;
                args.insert(k.to_string(), serde_json::Value::String(v.to_string()));
            }
            let tar = tar_dir(&context, Some(&text))?;
            let q = BuildQuery {
                tag,
                dockerfile: Some(DOCKERFILE_IN_CONTEXT.into()),
                build_args: (!args.is_empty()).then(|| serde_json::Value::Object(args).to_string()),
                no_cache: no_cache.then_some(true),
                target,
                disk_size,
                memory_mib: memory,
            };
            let mut r = Renderer::new(json);
            let img = c.build_image(tar.path(), &q, |e| r.event(e)).await;
            r.finish();
            done(img?, json)?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn done(img: Image, json: bool) -> Result<()> {
    if json {
        return print_json(&img);
    }
    println!(
        "image {} ready: {} root disk, {} layer(s){}",
        img.name,
        human_bytes(img.size_bytes),
        img.layers.len(),
        img.digest
            .as_deref()
            .map(|d| format!(", {d}"))
            .unwrap_or_default()
    );
    println!("run it: forkvm run --image {} -- CMD", img.name);
    Ok(())
}

/// Pack a directory into a temporary tar (symlinks kept as links), with the
/// Dockerfile's text added under [`DOCKERFILE_IN_CONTEXT`] for a build.
fn tar_dir(dir: &Path, dockerfile: Option<&[u8]>) -> Result<tempfile::NamedTempFile> {
    let tmp = tempfile::Builder::new()
        .prefix("forkvm-upload-")
        .suffix(".tar")
        .tempfile()
        .context("creating a temporary file")?;
    let mut b = tar::Builder::new(std::io::BufWriter::new(tmp.reopen()?));
    b.follow_symlinks(false);
    b.append_dir_all(".", dir)
        .with_context(|| format!("packing {}", dir.display()))?;
    if let Some(text) = dockerfile {
        let mut h = tar::Header::new_gnu();
        h.set_size(text.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, DOCKERFILE_IN_CONTEXT, text)?;
    }
    b.into_inner()?.flush()?;
    Ok(tmp)
}

/// `--password -` reads the password from stdin.
pub(crate) fn read_password(password: Option<String>) -> Result<Option<String>> {
    Ok(match password.as_deref() {
        Some("-") => {
            let mut p = String::new();
            std::io::stdin()
                .read_line(&mut p)
                .context("reading the password")?;
            Some(p.trim_end_matches(['\n', '\r']).to_string())
        }
        _ => password,
    })
}

/// Renders progress events.
pub(crate) struct Renderer {
    json: bool,
    tty: bool,
    /// A status line is on screen (to be overwritten or ended).
    open_line: bool,
    started: Instant,
}

impl Renderer {
    pub(crate) fn new(json: bool) -> Self {
        Renderer {
            json,
            tty: std::io::stderr().is_terminal(),
            open_line: false,
            started: Instant::now(),
        }
    }

    fn line(&mut self, s: &str) {
        let mut e = std::io::stderr();
        if self.open_line {
            let _ = write!(e, "\r\x1b[2K");
            self.open_line = false;
        }
        let _ = writeln!(e, "{s}");
    }

    pub(crate) fn event(&mut self, ev: &ImageEvent) {
        if self.json {
            if let Ok(s) = serde_json::to_string(ev) {
                println!("{s}");
            }
            return;
        }
        let t = self.started.elapsed().as_secs_f64();
        match ev {
            ImageEvent::Phase { phase } => self.line(&format!("[{t:6.1}s] {phase}")),
            ImageEvent::Cached { item } => self.line(&format!("[{t:6.1}s]   {item}: cached")),
            ImageEvent::Step {
                index,
                total,
                text,
                cached,
            } => self.line(&format!(
                "[{t:6.1}s] step {index}/{total}: {text}{}",
                if *cached { "  (cached)" } else { "" }
            )),
            ImageEvent::Log { line } => self.line(&format!("         {line}")),
            ImageEvent::Progress { item, done, total } => {
                let short = item
                    .strip_prefix("sha256:")
                    .map_or(item.as_str(), |h| &h[..h.len().min(12)]);
                let s = match total {
                    Some(n) if *n > 0 => format!(
                        "  {short}: {} / {} ({:.0}%)",
                        human_bytes(*done),
                        human_bytes(*n),
                        *done as f64 * 100.0 / *n as f64
                    ),
                    _ => format!("  {short}: {}", human_bytes(*done)),
                };
                if self.tty {
                    let _ = write!(std::io::stderr(), "\r\x1b[2K{s}");
                    self.open_line = total != &Some(*done);
                    if !self.open_line {
                        let _ = writeln!(std::io::stderr());
                    }
                } else if total == &Some(*done) {
                    self.line(&s);
                }
            }
            ImageEvent::Done { .. } | ImageEvent::Error { .. } => {}
        }
    }

    pub(crate) fn finish(&mut self) {
        if self.open_line {
            let _ = writeln!(std::io::stderr());
            self.open_line = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1.5g").unwrap(), 3 << 29);
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert!(parse_size("4Q").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("G").is_err());
    }

    #[test]
    fn start_args() {
        let a = StartArgs {
            start: Some("python3 -m http.server 8000".into()),
            ready_port: Some(8000),
            ..Default::default()
        };
        let s = a.to_api().unwrap().unwrap();
        assert_eq!(s.command, ["python3", "-m", "http.server", "8000"]);
        assert_eq!(s.ready_port, Some(8000));
        let b = StartArgs {
            ready_port: Some(1),
            ..Default::default()
        };
        assert!(b.to_api().is_err());
    }
}
