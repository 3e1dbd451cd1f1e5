//! `COPY --from=SOURCE src… dest`: files from an earlier stage or an image.
//!
//! Sources are paths in the source's root filesystem (relative ones are
//! taken from `/`, whatever the `WORKDIR`, as Docker does); wildcards are
//! refused. The daemon fetches each source as a tar from a sandbox of the
//! source (its last cached step, or the image) and [`reshape_from`] turns
//! it into the tar put at the destination, by Docker's rules: a
//! directory's contents go into `dest`, a file goes into `dest` when that
//! is a directory (ends in `/`, several sources, or a directory known to
//! exist), else becomes the file `dest`. Entries are owned by root (or
//! `--chown`), keep their modes (or `--chmod`) and mtimes.

use std::io::Read;

use tar::{Builder, EntryType, Header};

use super::instr::{absolute, parent};
use super::{CopySource, Planner, StepKind};
use crate::parse::{self, Instruction};
use crate::BuildError;

/// The raw `--from` value of a `COPY`, if it has one.
pub(crate) fn from_flag(ins: &Instruction) -> Option<String> {
    if ins.keyword != "COPY" {
        return None;
    }
    parse::take_flags(&ins.args)
        .0
        .into_iter()
        .find(|f| f.name == "from")
        .map(|f| f.value.unwrap_or_default())
}

/// Plan a `COPY --from`.
pub(crate) fn plan(p: &mut Planner, ins: &Instruction) -> Result<StepKind, BuildError> {
    let line = ins.line;
    let (flags, rest) = parse::take_flags(&ins.args);
    let (mut from, mut owner, mut chmod) = (String::new(), None, None);
    for f in flags {
        let value = || {
            f.value
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| BuildError::at(line, format!("COPY --{} needs a value", f.name)))
        };
        match f.name.as_str() {
            "from" => from = p.expand(line, &value()?)?,
            "chown" => owner = Some(p.expand(line, &value()?)?),
            "chmod" => {
                let v = p.expand(line, &value()?)?;
                chmod = Some(
                    u32::from_str_radix(&v, 8)
                        .ok()
                        .filter(|m| *m <= 0o7777)
                        .ok_or_else(|| {
                            BuildError::at(
                                line,
                                format!("--chmod={v}: give an octal mode such as 755 or 0644"),
                            )
                        })?,
                );
            }
            "link" => {}
            other => {
                return Err(BuildError::unsupported(
                    line,
                    format!("COPY --{other}"),
                    "the supported flags are --from, --chown, --chmod and --link",
                ))
            }
        }
    }
    let (source, source_key) = match p.sources.stage(&from) {
        Some(i) => {
            let d = p.sources.stages[i].as_ref().ok_or_else(|| {
                BuildError::at(
                    line,
                    format!("COPY --from={from}: stage {i} was not planned"),
                )
            })?;
            (CopySource::Stage(i), d.final_key.clone())
        }
        None => match p.sources.images.get(&from) {
            Some(b) => (CopySource::Image(from.clone()), b.digest.clone()),
            None => {
                return Err(BuildError::at(
                    line,
                    format!(
                        "COPY --from={from:?} names no earlier stage and no image the build \
                         resolved (a stage can only copy from stages above it)"
                    ),
                ))
            }
        },
    };
    let words = match parse::json_form(rest) {
        Some(v) => v
            .iter()
            .map(|w| p.expand(line, w))
            .collect::<Result<Vec<_>, _>>()?,
        None => p.expand_words(line, rest)?,
    };
    let Some((dest_raw, srcs)) = words.split_last().filter(|(_, s)| !s.is_empty()) else {
        return Err(BuildError::at(
            line,
            "COPY needs at least one source and a destination",
        ));
    };
    if dest_raw.is_empty() {
        return Err(BuildError::at(line, "COPY has an empty destination"));
    }
    let mut abs_srcs = Vec::new();
    for s in srcs {
        if s.contains(['*', '?', '[']) {
            return Err(BuildError::unsupported(
                line,
                format!("COPY --from with the wildcard {s:?}"),
                "name the files or their directory",
            ));
        }
        abs_srcs.push(absolute("/", s));
    }
    let dir_hint = dest_raw.ends_with('/')
        || dest_raw.ends_with("/.")
        || dest_raw.ends_with("/..")
        || dest_raw == "."
        || dest_raw == "..";
    let multiple = abs_srcs.len() > 1;
    if multiple && !dir_hint {
        return Err(BuildError::at(
            line,
            format!(
                "COPY copies {} sources so the destination must be a directory ending in '/': write {dest_raw}/",
                abs_srcs.len()
            ),
        ));
    }
    let dest = absolute(&p.cwd(), dest_raw);
    let into_dir = dir_hint || multiple || p.known_dirs.contains(&dest);
    p.know_dir(if into_dir { &dest } else { parent_of(&dest) });
    Ok(StepKind::CopyFrom {
        source,
        source_key,
        srcs: abs_srcs,
        dest,
        into_dir,
        owner,
        chmod,
    })
}

fn parent_of(p: &str) -> &str {
    match p.rsplit_once('/') {
        Some(("", _)) | None => "/",
        Some((d, _)) => d,
    }
}

fn bad(src: &str, m: impl std::fmt::Display) -> BuildError {
    BuildError::Archive {
        path: src.into(),
        message: m.to_string(),
    }
}

/// Turn the tar the guest gave for `src` (entries named by their absolute
/// path without the leading `/`) into the tar to put, and the directory
/// to put it at: see the module doc.
pub fn reshape_from(
    tar: &[u8],
    src: &str,
    dest: &str,
    into_dir: bool,
    chmod: Option<u32>,
) -> Result<(String, Vec<u8>), BuildError> {
    let prefix = src.trim_matches('/').to_string();
    let base = |p: &str| p.rsplit('/').next().unwrap_or_default().to_string();
    let mut out = Builder::new(Vec::new());
    let mut put_at = dest.to_string();
    // What the source's own entry becomes: "" for a directory's contents.
    let mut root_name: Option<String> = None;
    let mut ar = tar::Archive::new(tar);
    let entries = ar.entries().map_err(|e| bad(src, e))?;
    for e in entries {
        let mut e = e.map_err(|e| bad(src, e))?;
        let name = e
            .path()
            .map_err(|e| bad(src, e))?
            .to_string_lossy()
            .trim_matches('/')
            .to_string();
        let etype = e.header().entry_type();
        let rel = if name == prefix {
            if etype.is_dir() {
                root_name = Some(String::new());
                continue;
            }
            let n = if into_dir { base(&prefix) } else { base(dest) };
            if !into_dir {
                put_at = parent(dest);
            }
            root_name = Some(n.clone());
            n
        } else if prefix.is_empty() {
            root_name.get_or_insert_with(String::new);
            name.clone()
        } else if let Some(r) = name.strip_prefix(&format!("{prefix}/")) {
            r.to_string()
        } else {
            return Err(bad(src, format!("the guest sent {name:?}, outside it")));
        };
        let mut h = Header::new_gnu();
        h.set_entry_type(etype);
        let mode = e.header().mode().map_err(|e| bad(src, e))?;
        h.set_mode(match chmod {
            Some(m) if etype != EntryType::Symlink => m,
            _ => mode,
        });
        h.set_mtime(e.header().mtime().unwrap_or(crate::ARCHIVE_MTIME));
        h.set_uid(0);
        h.set_gid(0);
        match etype {
            EntryType::Symlink | EntryType::Link => {
                let target = e
                    .link_name()
                    .map_err(|e| bad(src, e))?
                    .map(|l| l.to_string_lossy().into_owned())
                    .unwrap_or_default();
                let target = if etype == EntryType::Link {
                    // A hardlink names an entry of the same archive.
                    let t = target.trim_matches('/');
                    match t.strip_prefix(&format!("{prefix}/")) {
                        Some(r) if !prefix.is_empty() => r.to_string(),
                        _ if prefix.is_empty() => t.to_string(),
                        _ => return Err(bad(src, format!("a hardlink to {t:?}, outside it"))),
                    }
                } else {
                    target
                };
                h.set_size(0);
                out.append_link(&mut h, &rel, &target)
                    .map_err(|e| bad(src, e))?;
            }
            EntryType::Directory | EntryType::Regular | EntryType::Continuous => {
                let mut data = Vec::new();
                e.read_to_end(&mut data).map_err(|e| bad(src, e))?;
                h.set_size(data.len() as u64);
                out.append_data(&mut h, &rel, &data[..])
                    .map_err(|e| bad(src, e))?;
            }
            // Devices, fifos: not what a COPY carries.
            _ => {}
        }
    }
    if root_name.is_none() {
        return Err(bad(src, "it is not in the source stage or image"));
    }
    let tar = out.into_inner().map_err(|e| bad(src, e))?;
    Ok((put_at, tar))
}
