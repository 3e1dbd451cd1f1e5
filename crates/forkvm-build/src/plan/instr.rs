//! The argument grammar of single instructions (`ENV`/`LABEL` pairs,
//! `EXPOSE` ports, command forms, `COPY`/`ADD` flags and destinations),
//! the forkvm comment directives, and the canonical form of a step that
//! goes into its cache key. The rules themselves are documented in
//! [`crate::plan`](mod@crate::plan).

use forkvm_image::meta::{ImageConfig, ReadyCheck, StartSpec};

use super::{KeyHasher, Planner, StepKind};
use crate::archive::{detect_archive, ArchiveEntry, ArchiveSpec, EntryKind};
use crate::context::{hash_file, Context};
use crate::parse::{self, ForkvmDirective, Instruction};
use crate::BuildError;

/// `KEY=value …` (or the legacy `KEY value with spaces`) of `ENV` and
/// `LABEL`, every value expanded with the variables in effect *before*
/// the instruction, as Docker does.
pub(super) fn pairs(p: &Planner, ins: &Instruction) -> Result<Vec<(String, String)>, BuildError> {
    let line = ins.line;
    let words =
        crate::words::split_words(&ins.args, p.escape).map_err(|e| BuildError::at(line, e))?;
    let Some(first) = words.first() else {
        return Err(BuildError::at(
            line,
            format!("{} needs KEY=value", ins.keyword),
        ));
    };
    let mut out = Vec::new();
    if !first.contains('=') {
        // Legacy form: the first word is the key, the rest the value.
        let rest = ins.args.trim_start()[first.len()..].trim();
        if rest.is_empty() {
            return Err(BuildError::at(
                line,
                format!("{} {first} has no value: write {first}=value", ins.keyword),
            ));
        }
        out.push((p.expand(line, first)?, p.expand(line, rest)?));
    } else {
        for w in &words {
            let Some((k, v)) = w.split_once('=') else {
                return Err(BuildError::at(
                    line,
                    format!("{} expects KEY=value pairs, found {w:?}", ins.keyword),
                ));
            };
            out.push((p.expand(line, k)?, p.expand(line, v)?));
        }
    }
    if let Some((k, _)) = out.iter().find(|(k, _)| k.is_empty()) {
        return Err(BuildError::at(
            line,
            format!("{} has an empty key {k:?}", ins.keyword),
        ));
    }
    Ok(out)
}

/// Set `key` in a `K=V` list, in place when it is there.
pub(super) fn set_env(env: &mut Vec<String>, key: &str, value: &str) {
    let kv = format!("{key}={value}");
    let same = |e: &String| e.split_once('=').map(|(k, _)| k).unwrap_or(e) == key;
    match env.iter_mut().find(|e| same(e)) {
        Some(e) => *e = kv,
        None => env.push(kv),
    }
}

/// `EXPOSE 80 443/tcp 53/udp 8000-8002`: merged into `ports` as
/// `port/proto`, ranges spelled out, sorted by number.
pub(super) fn expose(
    line: usize,
    words: &[String],
    ports: &mut Vec<String>,
) -> Result<(), BuildError> {
    if words.is_empty() {
        return Err(BuildError::at(line, "EXPOSE needs a port"));
    }
    for w in words {
        let (num, proto) = match w.split_once('/') {
            Some((n, p)) => (n, p.to_ascii_lowercase()),
            None => (w.as_str(), "tcp".to_string()),
        };
        if !matches!(proto.as_str(), "tcp" | "udp" | "sctp") {
            return Err(BuildError::at(
                line,
                format!("EXPOSE {w}: protocol must be tcp, udp or sctp"),
            ));
        }
        let port = |s: &str| {
            s.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                BuildError::at(
                    line,
                    format!("EXPOSE {w}: {s:?} is not a port number (1-65535)"),
                )
            })
        };
        let (lo, hi) = match num.split_once('-') {
            Some((a, b)) => (port(a)?, port(b)?),
            None => (port(num)?, port(num)?),
        };
        if hi < lo || hi - lo >= 1024 {
            return Err(BuildError::at(
                line,
                format!("EXPOSE {w}: a range must go upwards and span at most 1024 ports"),
            ));
        }
        ports.extend((lo..=hi).map(|n| format!("{n}/{proto}")));
    }
    ports.sort_by_key(|s| {
        let n = s.split('/').next().and_then(|n| n.parse::<u32>().ok());
        (n.unwrap_or(u32::MAX), s.clone())
    });
    ports.dedup();
    Ok(())
}

/// The argv of `RUN`/`CMD`/`ENTRYPOINT`: the JSON form as is, the shell
/// form after `SHELL`. `allow_empty` lets `CMD []` clear the command.
pub(super) fn command(
    p: &Planner,
    ins: &Instruction,
    allow_empty: bool,
) -> Result<Vec<String>, BuildError> {
    if !ins.heredocs.is_empty() {
        return heredoc_command(p, ins);
    }
    match parse::json_form(&ins.args) {
        Some(v) if v.is_empty() && !allow_empty => Err(BuildError::at(
            ins.line,
            format!("{} [] has no command to run", ins.keyword),
        )),
        Some(v) => Ok(v),
        None if ins.args.trim().is_empty() => Err(BuildError::at(
            ins.line,
            format!("{} needs a command", ins.keyword),
        )),
        None => Ok(shell_form(&p.shell, &ins.args)),
    }
}

/// `RUN` with heredocs, as BuildKit runs it: a lone `<<EOF` runs its body
/// as a shell script; a command with heredocs goes to the shell whole,
/// bodies and end lines included, so the shell feeds them to it.
fn heredoc_command(p: &Planner, ins: &Instruction) -> Result<Vec<String>, BuildError> {
    if parse::json_form(&ins.args).is_some() {
        return Err(BuildError::at(
            ins.line,
            "a heredoc needs the shell form of RUN, not a JSON array",
        ));
    }
    let lone = parse::heredoc_markers(&ins.args).len() == 1
        && ins.args.trim().starts_with("<<")
        && !ins.args.trim().contains(char::is_whitespace);
    if lone {
        let body = &ins.heredocs[0].body;
        if body.starts_with("#!") {
            return Err(BuildError::unsupported(
                ins.line,
                "a RUN heredoc with a #! line",
                "forkvm runs a heredoc's body with the shell; name the interpreter instead, \
                 e.g. RUN python3 <<EOF",
            ));
        }
        return Ok(shell_form(&p.shell, body));
    }
    let mut script = format!("{}\n", ins.args.trim());
    for h in &ins.heredocs {
        script.push_str(&h.body);
        script.push_str(&h.name);
        script.push('\n');
    }
    Ok(shell_form(&p.shell, &script))
}

fn shell_form(shell: &[String], cmd: &str) -> Vec<String> {
    let mut v = shell.to_vec();
    v.push(cmd.trim().to_string());
    v
}

/// `path` made absolute against `cwd` and cleaned lexically.
pub(super) fn absolute(cwd: &str, path: &str) -> String {
    let full = if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{cwd}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for s in full.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            s => parts.push(s),
        }
    }
    format!("/{}", parts.join("/"))
}

/// The parent of a clean absolute path (`/` for `/`).
pub(super) fn parent(path: &str) -> String {
    match path.rsplit_once('/') {
        Some(("", _)) | None => "/".into(),
        Some((p, _)) => p.into(),
    }
}

/// What a `COPY`/`ADD` does.
pub(super) struct CopyPlan {
    pub dest: String,
    pub owner: Option<String>,
    pub archive: ArchiveSpec,
}

pub(super) fn copy_plan(
    p: &mut Planner,
    ins: &Instruction,
    ctx: &Context,
) -> Result<CopyPlan, BuildError> {
    let line = ins.line;
    let kw = ins.keyword.as_str();
    let add = kw == "ADD";
    let (flags, rest) = parse::take_flags(&ins.args);
    let mut owner = None;
    let mut chmod = None;
    for f in flags {
        let value = || {
            f.value
                .clone()
                .filter(|v| !v.is_empty())
                .ok_or_else(|| BuildError::at(line, format!("{kw} --{} needs a value", f.name)))
        };
        match f.name.as_str() {
            "chown" => owner = Some(p.expand(line, &value()?)?),
            "chmod" => chmod = Some(mode(line, &p.expand(line, &value()?)?)?),
            // Layering does not exist here: every step is a snapshot.
            "link" => {}
            "from" => {
                return Err(BuildError::unsupported(
                    line,
                    format!("{kw} --from"),
                    "copying from other stages or images is not supported yet; copy from the build context",
                ))
            }
            other => {
                return Err(BuildError::unsupported(
                    line,
                    format!("{kw} --{other}"),
                    "the supported flags are --chown, --chmod and --link",
                ))
            }
        }
    }
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
            format!("{kw} needs at least one source and a destination"),
        ));
    };
    if dest_raw.is_empty() {
        return Err(BuildError::at(
            line,
            format!("{kw} has an empty destination"),
        ));
    }
    for s in srcs {
        if add && (s.contains("://") || s.starts_with("git@")) {
            return Err(BuildError::unsupported(
                line,
                format!("ADD of the URL {s:?}"),
                "download it in a RUN step (curl, wget) or put the file into the build context",
            ));
        }
    }
    let dir_hint = dest_raw.ends_with('/')
        || dest_raw.ends_with("/.")
        || dest_raw.ends_with("/..")
        || dest_raw == "."
        || dest_raw == "..";
    let dest = absolute(&p.cwd(), dest_raw);
    let mut sources = Vec::new();
    let mut inline = Vec::new();
    for s in srcs {
        match heredoc_source(p, ins, s)? {
            Some(h) => inline.push(h),
            None => sources.extend(ctx.sources(s, line)?),
        }
    }
    let multiple = sources.len() + inline.len() > 1;
    if multiple && !dir_hint {
        return Err(BuildError::at(
            line,
            format!(
                "{kw} copies {} sources (after expanding wildcards) so the destination must be a directory ending in '/': write {dest_raw}/",
                sources.len() + inline.len()
            ),
        ));
    }
    let into_dir = dir_hint || multiple || p.known_dirs.contains(&dest);
    let mut step_dest = dest.clone();
    let mut entries = Vec::new();
    for s in &sources {
        if add && !s.is_dir {
            if let Some(compression) = detect_archive(&s.host)? {
                let (_, sha256) = hash_file(&s.host)?;
                entries.push(ArchiveEntry {
                    path: String::new(),
                    kind: EntryKind::Extract {
                        host: s.host.clone(),
                        compression,
                        sha256,
                    },
                    mtime: None,
                });
                continue;
            }
        }
        let name = if s.is_dir {
            String::new()
        } else if into_dir {
            s.name().to_string()
        } else {
            // One file to a file path: extract its parent, name the entry.
            step_dest = parent(&dest);
            dest.rsplit('/').next().unwrap_or_default().to_string()
        };
        ctx.collect(s, &name, chmod, line, &mut entries, &mut p.warnings)?;
    }
    for (name, data) in inline {
        let path = if into_dir {
            name
        } else {
            step_dest = parent(&dest);
            dest.rsplit('/').next().unwrap_or_default().to_string()
        };
        entries.push(ArchiveEntry {
            path,
            kind: EntryKind::Inline {
                mode: chmod.unwrap_or(0o644),
                data: data.into_bytes(),
            },
            mtime: None,
        });
    }
    Ok(CopyPlan {
        dest: step_dest,
        owner,
        archive: ArchiveSpec { entries },
    })
}

/// A `COPY`/`ADD` source that is a heredoc marker: the file's name and
/// content (variables substituted unless the marker was quoted).
fn heredoc_source(
    p: &Planner,
    ins: &Instruction,
    src: &str,
) -> Result<Option<(String, String)>, BuildError> {
    if !src.starts_with("<<") {
        return Ok(None);
    }
    let Some((name, _, _)) = parse::heredoc_markers(src).into_iter().next() else {
        return Ok(None);
    };
    let Some(h) = ins.heredocs.iter().find(|h| h.name == name) else {
        return Ok(None);
    };
    let body = if h.expand {
        // Line by line: the substitution works on words of one line.
        let mut out = String::new();
        for l in h.body.split_inclusive('\n') {
            let (text, nl) = l.strip_suffix('\n').map_or((l, ""), |t| (t, "\n"));
            out.push_str(&p.expand(ins.line, text)?);
            out.push_str(nl);
        }
        out
    } else {
        h.body.clone()
    };
    Ok(Some((h.name.clone(), body)))
}

/// `--chmod=755`: octal only.
fn mode(line: usize, s: &str) -> Result<u32, BuildError> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777 && !s.is_empty())
        .ok_or_else(|| {
            BuildError::at(
                line,
                format!("--chmod={s}: give an octal mode such as 755 or 0644"),
            )
        })
}

fn put_opt(k: &mut KeyHasher, v: &Option<String>) {
    match v {
        Some(s) => {
            k.put("some");
            k.put(s);
        }
        None => k.put("none"),
    }
}

/// Feed what a step does (never host paths) into its cache key.
pub(super) fn canonical(kind: &StepKind, k: &mut KeyHasher) {
    match kind {
        StepKind::Run {
            argv,
            env,
            cwd,
            user,
        } => {
            k.put("run");
            k.put(&argv.len().to_string());
            argv.iter().for_each(|a| k.put(a));
            k.put(&env.len().to_string());
            for (n, v) in env {
                k.put(n);
                k.put(v);
            }
            k.put(cwd);
            put_opt(k, user);
        }
        StepKind::Copy {
            dest,
            owner,
            archive,
        } => {
            k.put("copy");
            k.put(dest);
            put_opt(k, owner);
            k.put(&archive.entries.len().to_string());
            for e in &archive.entries {
                k.put(&e.path);
                match &e.kind {
                    EntryKind::Dir { mode } => {
                        k.put("dir");
                        k.put(&mode.to_string());
                    }
                    EntryKind::File {
                        mode, size, sha256, ..
                    } => {
                        k.put("file");
                        k.put(&mode.to_string());
                        k.put(&size.to_string());
                        k.put(sha256);
                    }
                    EntryKind::Symlink { target } => {
                        k.put("symlink");
                        k.put(target);
                    }
                    EntryKind::Inline { mode, data } => {
                        k.put("inline");
                        k.put(&mode.to_string());
                        k.put(&crate::hex(&<sha2::Sha256 as sha2::Digest>::digest(data)));
                    }
                    EntryKind::Extract {
                        compression,
                        sha256,
                        ..
                    } => {
                        k.put("extract");
                        k.put(compression.name());
                        k.put(sha256);
                    }
                }
            }
        }
        StepKind::Mkdir { path, owner } => {
            k.put("mkdir");
            k.put(path);
            put_opt(k, owner);
        }
        StepKind::CopyFrom {
            source,
            source_key,
            srcs,
            dest,
            into_dir,
            owner,
            chmod,
        } => {
            k.put("copy-from");
            match source {
                super::CopySource::Stage(i) => k.put(&format!("stage {i}")),
                super::CopySource::Image(r) => k.put(&format!("image {r}")),
            }
            k.put(source_key);
            k.put(&srcs.len().to_string());
            srcs.iter().for_each(|s| k.put(s));
            k.put(dest);
            k.put(if *into_dir { "into" } else { "as" });
            put_opt(k, owner);
            put_opt(k, &chmod.map(|m| format!("{m:o}")));
        }
    }
}

/// How long a ready check may take unless `timeout=` says otherwise.
pub const DEFAULT_READY_TIMEOUT_SECS: u64 = 60;

/// The [`StartSpec`] from `# forkvm:start` / `# forkvm:ready`.
pub(super) fn start_spec(
    directives: &[ForkvmDirective],
    config: &ImageConfig,
    shell: &[String],
) -> Result<Option<StartSpec>, BuildError> {
    let mut start: Option<(usize, Vec<String>)> = None;
    let mut ready: Option<(usize, ReadyCheck, Option<u64>)> = None;
    for d in directives {
        let line = d.line;
        let twice = || BuildError::at(line, format!("# forkvm:{} is given twice", d.name));
        match d.name.as_str() {
            "start" => {
                if start.is_some() {
                    return Err(twice());
                }
                let cmd = match parse::json_form(&d.args) {
                    Some(v) if v.is_empty() => {
                        return Err(BuildError::at(line, "# forkvm:start [] has no command"))
                    }
                    Some(v) => v,
                    None if d.args.is_empty() => Vec::new(),
                    None => shell_form(shell, &d.args),
                };
                start = Some((line, cmd));
            }
            "ready" => {
                if ready.is_some() {
                    return Err(twice());
                }
                let (check, timeout) = ready_check(line, &d.args, shell)?;
                ready = Some((line, check, timeout));
            }
            other => {
                return Err(BuildError::at(
                    line,
                    format!(
                        "unknown directive `# forkvm:{other}`: forkvm knows `# forkvm:start` and `# forkvm:ready`"
                    ),
                ))
            }
        }
    }
    let line = match (&start, &ready) {
        (None, None) => return Ok(None),
        (Some((l, _)), _) | (None, Some((l, _, _))) => *l,
    };
    let mut command = start.map(|(_, c)| c).unwrap_or_default();
    if command.is_empty() {
        command = config.default_argv();
    }
    if command.is_empty() {
        return Err(BuildError::at(
            line,
            "nothing to start: give # forkvm:start a command, or set ENTRYPOINT or CMD",
        ));
    }
    let (ready, timeout) = match ready {
        Some((_, c, t)) => (Some(c), t),
        None => (None, None),
    };
    Ok(Some(StartSpec {
        command,
        ready,
        ready_timeout_secs: timeout.unwrap_or(DEFAULT_READY_TIMEOUT_SECS),
    }))
}

/// `[timeout=SECS] port=N` or `[timeout=SECS] command`.
fn ready_check(
    line: usize,
    args: &str,
    shell: &[String],
) -> Result<(ReadyCheck, Option<u64>), BuildError> {
    let mut rest = args.trim();
    let mut port = None;
    let mut timeout = None;
    loop {
        let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
        let word = &rest[..end];
        if let Some(v) = word.strip_prefix("port=") {
            let p = v.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                BuildError::at(
                    line,
                    format!("# forkvm:ready port={v}: not a port number (1-65535)"),
                )
            })?;
            port = Some(p);
        } else if let Some(v) = word.strip_prefix("timeout=") {
            let t = v.parse::<u64>().ok().filter(|t| *t > 0).ok_or_else(|| {
                BuildError::at(
                    line,
                    format!("# forkvm:ready timeout={v}: give whole seconds, more than 0"),
                )
            })?;
            timeout = Some(t);
        } else {
            break;
        }
        rest = rest[end..].trim_start();
    }
    let check = match (port, rest.is_empty()) {
        (Some(port), true) => ReadyCheck::Port { port },
        (None, false) => ReadyCheck::Command {
            command: match parse::json_form(rest) {
                Some(v) if !v.is_empty() => v,
                Some(_) => return Err(BuildError::at(line, "# forkvm:ready [] has no command")),
                None => shell_form(shell, rest),
            },
        },
        (Some(_), false) => {
            return Err(BuildError::at(
                line,
                format!(
                    "# forkvm:ready: give either port=N or a command, not both (found {rest:?})"
                ),
            ))
        }
        (None, true) => {
            return Err(BuildError::at(
                line,
                "# forkvm:ready needs port=N or a command such as [\"pg_isready\"]",
            ))
        }
    };
    Ok((check, timeout))
}
