//! The Dockerfile's lexical layer: parser directives, comments, line
//! continuations, instructions, flags, and JSON (exec) versus shell form.
//!
//! * Parser directives (`# escape=\``, `# syntax=…`, `# check=…`) are
//!   recognised only in the comment lines at the very top, before any blank
//!   line, other comment or instruction; a repeated directive is an error.
//!   `escape` may be `\` (default) or `` ` ``; `syntax` and `check` are
//!   ignored with a warning (there is no BuildKit frontend here).
//! * A line whose first non-blank character is `#` is a comment, also in
//!   the middle of a continued instruction (it is dropped, as are blank
//!   lines there). Comments of the form `# forkvm:NAME ARGS` are forkvm's
//!   directives, kept with their line number (see [`crate::plan`](mod@crate::plan)).
//! * A line ending in the escape character (trailing blanks allowed)
//!   continues on the next line; the pieces are joined without the escape
//!   character and newline, as Docker does.
//! * An instruction is `KEYWORD args`; the keyword is case-insensitive.
//!   `\r\n` line ends and a leading byte-order mark are accepted.
//! * Heredocs (BuildKit's Dockerfile 1.4 syntax) in `RUN`, `COPY` and
//!   `ADD`: each `<<WORD` (or `<<-WORD`, which strips leading tabs, or
//!   `<<"WORD"`/`<<'WORD'`, whose body is not substituted) takes the lines
//!   after the instruction up to a line that is `WORD`, in the order the
//!   markers appear; see [`Heredoc`].

use crate::BuildError;

/// One instruction with its continuation lines joined.
#[derive(Debug, Clone, PartialEq)]
pub struct Instruction {
    /// 1-based line the instruction starts on.
    pub line: usize,
    /// Upper-case keyword.
    pub keyword: String,
    /// Everything after the keyword, trimmed (heredoc markers included,
    /// their bodies not).
    pub args: String,
    /// The heredocs of a `RUN`, `COPY` or `ADD`, in marker order.
    pub heredocs: Vec<Heredoc>,
}

/// A heredoc: `<<NAME` in an instruction, and the lines up to `NAME`.
#[derive(Debug, Clone, PartialEq)]
pub struct Heredoc {
    pub name: String,
    /// The lines, each ending in `\n` (tabs stripped for `<<-`).
    pub body: String,
    /// Unquoted marker: `COPY` substitutes variables in the body.
    pub expand: bool,
}

/// The heredoc markers in an instruction's arguments: (name, strip tabs,
/// expand). As in BuildKit, a marker is a word of its own (`<<EOF`,
/// `<<-EOF`, `<<"EOF"`, `2<<EOF`), outside quotes: `"a<<b"`, `$((1<<3))`
/// and `<<<word` are not markers.
pub fn heredoc_markers(args: &str) -> Vec<(String, bool, bool)> {
    let mut out = Vec::new();
    let b = args.as_bytes();
    let word_end =
        |c: Option<&u8>| c.is_none_or(|c| c.is_ascii_whitespace() || b">|;&)".contains(c));
    let mut quote: Option<u8> = None;
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        match quote {
            Some(q) if c == q => quote = None,
            Some(b'"') if c == b'\\' => i += 1,
            Some(_) => {}
            None if c == b'\\' => i += 1,
            None if c == b'"' || c == b'\'' => quote = Some(c),
            None if b[i..].starts_with(b"<<") => {
                // Word start: nothing before but fd digits.
                let mut k = i;
                while k > 0 && b[k - 1].is_ascii_digit() {
                    k -= 1;
                }
                let at_start = k == 0 || b[k - 1].is_ascii_whitespace();
                if let Some((m, next)) = marker_at(args, i + 2).filter(|(_, n)| word_end(b.get(*n)))
                {
                    if at_start {
                        out.push(m);
                        i = next;
                        continue;
                    }
                }
                i += 2;
                continue;
            }
            None => {}
        }
        i += 1;
    }
    out
}

/// The marker after a `<<` at `j`, and where it ends.
fn marker_at(args: &str, mut j: usize) -> Option<((String, bool, bool), usize)> {
    let b = args.as_bytes();
    let strip = b.get(j) == Some(&b'-');
    if strip {
        j += 1;
    }
    let quote = match b.get(j) {
        Some(&q) if q == b'"' || q == b'\'' => {
            j += 1;
            Some(q)
        }
        _ => None,
    };
    let start = j;
    while b
        .get(j)
        .is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'))
    {
        j += 1;
    }
    if j == start {
        return None;
    }
    let name = args[start..j].to_string();
    if let Some(q) = quote {
        if b.get(j) != Some(&q) {
            return None;
        }
        j += 1;
    }
    Some(((name, strip, quote.is_none()), j))
}

impl Instruction {
    /// `KEYWORD args` with whitespace runs collapsed, for display.
    pub fn display(&self) -> String {
        let args: Vec<&str> = self.args.split_whitespace().collect();
        if args.is_empty() {
            self.keyword.clone()
        } else {
            format!("{} {}", self.keyword, args.join(" "))
        }
    }
}

/// A `# forkvm:NAME ARGS` comment.
#[derive(Debug, Clone, PartialEq)]
pub struct ForkvmDirective {
    pub line: usize,
    pub name: String,
    pub args: String,
}

/// A lexed Dockerfile.
#[derive(Debug, Clone, PartialEq)]
pub struct Dockerfile {
    /// The escape character: `\` or `` ` ``.
    pub escape: char,
    pub instructions: Vec<Instruction>,
    pub forkvm: Vec<ForkvmDirective>,
    /// Harmless things that were ignored, with their line.
    pub warnings: Vec<String>,
}

/// Lex a Dockerfile.
pub fn parse(text: &str) -> Result<Dockerfile, BuildError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let mut df = Dockerfile {
        escape: '\\',
        instructions: Vec::new(),
        forkvm: Vec::new(),
        warnings: Vec::new(),
    };

    // Parser directives: leading `# key=value` comments.
    let mut i = 0;
    let mut seen: Vec<String> = Vec::new();
    while let Some((key, value)) = lines.get(i).and_then(|l| directive(l)) {
        let line = i + 1;
        if seen.contains(&key) {
            return Err(BuildError::at(
                line,
                format!("parser directive {key:?} is given twice"),
            ));
        }
        match key.as_str() {
            "escape" => {
                df.escape = match value.as_str() {
                    "\\" => '\\',
                    "`" => '`',
                    _ => {
                        return Err(BuildError::at(
                            line,
                            format!("invalid escape character {value:?}: use \\ or `"),
                        ))
                    }
                }
            }
            "syntax" | "check" => df.warnings.push(format!(
                "line {line}: parser directive {key:?} ignored (forkvm parses the Dockerfile itself)"
            )),
            // Unknown directives are plain comments in Docker too.
            _ => {}
        }
        seen.push(key);
        i += 1;
    }

    let mut pending: Option<(usize, String)> = None;
    while i < lines.len() {
        let raw = lines[i];
        let line = i + 1;
        i += 1;
        let trimmed = raw.trim_start();
        if let Some(comment) = trimmed.strip_prefix('#') {
            if let Some(d) = forkvm_directive(line, comment) {
                df.forkvm.push(d);
            }
            continue;
        }
        if trimmed.trim_end().is_empty() {
            continue;
        }
        let (piece, continues) = match continuation(raw, df.escape) {
            Some(head) => (head, true),
            None => (raw, false),
        };
        let (start, mut body) = pending.take().unwrap_or((line, String::new()));
        body.push_str(piece);
        if continues {
            pending = Some((start, body));
        } else {
            let mut ins = instruction(start, &body)?;
            if matches!(ins.keyword.as_str(), "RUN" | "COPY" | "ADD") {
                for (name, strip, expand) in heredoc_markers(&ins.args) {
                    let mut text = String::new();
                    loop {
                        let Some(l) = lines.get(i) else {
                            return Err(BuildError::at(
                                start,
                                format!("the heredoc <<{name} has no line {name} to end it"),
                            ));
                        };
                        i += 1;
                        let l = if strip { l.trim_start_matches('\t') } else { l };
                        if l == name {
                            break;
                        }
                        text.push_str(l);
                        text.push('\n');
                    }
                    ins.heredocs.push(Heredoc {
                        name,
                        body: text,
                        expand,
                    });
                }
            }
            df.instructions.push(ins);
        }
    }
    // A continuation at the end of the file just ends the instruction.
    if let Some((start, body)) = pending {
        if !body.trim().is_empty() {
            df.instructions.push(instruction(start, &body)?);
        }
    }
    Ok(df)
}

/// `# key=value` → (lower-case key, value).
fn directive(line: &str) -> Option<(String, String)> {
    let rest = line.trim().strip_prefix('#')?;
    let (key, value) = rest.split_once('=')?;
    let key = key.trim();
    if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric()) {
        return None;
    }
    Some((key.to_ascii_lowercase(), value.trim().to_string()))
}

fn forkvm_directive(line: usize, comment: &str) -> Option<ForkvmDirective> {
    let rest = comment.trim_start().strip_prefix("forkvm:")?;
    let name_end = rest.find(char::is_whitespace).unwrap_or(rest.len());
    Some(ForkvmDirective {
        line,
        name: rest[..name_end].to_string(),
        args: rest[name_end..].trim().to_string(),
    })
}

/// The line without its trailing escape character, when it continues.
fn continuation(line: &str, escape: char) -> Option<&str> {
    let t = line.trim_end_matches([' ', '\t']);
    t.strip_suffix(escape)
}

fn instruction(line: usize, body: &str) -> Result<Instruction, BuildError> {
    let body = body.trim();
    let end = body.find(char::is_whitespace).unwrap_or(body.len());
    let keyword = &body[..end];
    if !keyword.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(BuildError::at(
            line,
            format!("expected an instruction such as RUN or COPY, found {keyword:?}"),
        ));
    }
    let keyword = keyword.to_ascii_uppercase();
    let args = body[end..].trim().to_string();
    Ok(Instruction {
        line,
        keyword,
        args,
        heredocs: Vec::new(),
    })
}

/// A `--name=value` (or bare `--name`) flag before an instruction's
/// arguments.
#[derive(Debug, Clone, PartialEq)]
pub struct Flag {
    pub name: String,
    pub value: Option<String>,
}

/// Split leading `--flags` off an instruction's arguments.
pub fn take_flags(args: &str) -> (Vec<Flag>, &str) {
    let mut flags = Vec::new();
    let mut rest = args.trim_start();
    while let Some(f) = rest.strip_prefix("--") {
        let end = f.find(char::is_whitespace).unwrap_or(f.len());
        let word = &f[..end];
        let (name, value) = match word.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (word, None),
        };
        flags.push(Flag {
            name: name.to_ascii_lowercase(),
            value,
        });
        rest = f[end..].trim_start();
    }
    (flags, rest)
}

/// The exec (JSON array of strings) form of the arguments, if they are
/// one. Like Docker, anything that does not parse as such an array is the
/// shell form, even when it starts with `[`.
pub fn json_form(args: &str) -> Option<Vec<String>> {
    let t = args.trim();
    if !t.starts_with('[') {
        return None;
    }
    serde_json::from_str::<Vec<String>>(t).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kw(df: &Dockerfile) -> Vec<(usize, &str, &str)> {
        df.instructions
            .iter()
            .map(|i| (i.line, i.keyword.as_str(), i.args.as_str()))
            .collect()
    }

    #[test]
    fn instructions_comments_and_continuations() {
        let df = parse(
            "# comment\nfrom debian AS base\n\n  run apt-get update && \\\n    # inside\n\n    apt-get install -y x   \\  \n  && true\nCMD [\"a\"]\r\nENV A=1 \\",
        )
        .unwrap();
        assert_eq!(
            kw(&df),
            [
                (2, "FROM", "debian AS base"),
                (
                    4,
                    "RUN",
                    "apt-get update &&     apt-get install -y x     && true"
                ),
                (9, "CMD", "[\"a\"]"),
                (10, "ENV", "A=1"),
            ]
        );
        assert_eq!(df.escape, '\\');
        assert_eq!(
            df.instructions[1].display(),
            "RUN apt-get update && apt-get install -y x && true"
        );
    }

    #[test]
    fn escape_directive() {
        let df = parse("# escape=`\n\nFROM x\nRUN dir C:\\ `\n  && echo\n").unwrap();
        assert_eq!(df.escape, '`');
        assert_eq!(df.instructions[1].args, "dir C:\\   && echo");
        let df = parse("#ESCAPE = \\\nFROM x\n").unwrap();
        assert_eq!(df.escape, '\\');
        // Not at the top: just a comment.
        let df = parse("FROM x\n# escape=`\nRUN a \\\n b\n").unwrap();
        assert_eq!(df.escape, '\\');
        assert_eq!(df.instructions[1].args, "a  b");
        // After a blank line: a comment too.
        assert_eq!(parse("\n# escape=`\nFROM x").unwrap().escape, '\\');
        let e = parse("# escape=x\nFROM a").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("escape"), "{e}");
        let e = parse("# escape=`\n# escape=\\\nFROM a")
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && e.contains("twice"), "{e}");
        let df = parse("# syntax=docker/dockerfile:1\n# unknown=1\nFROM a").unwrap();
        assert_eq!(df.warnings.len(), 1);
        assert!(df.warnings[0].contains("syntax"));
    }

    #[test]
    fn forkvm_comments() {
        let df = parse("\u{feff}FROM a\n#forkvm:start [\"srv\"]\n  # forkvm:ready   port=80\n# forkvm:\n# other").unwrap();
        assert_eq!(
            df.forkvm,
            [
                ForkvmDirective {
                    line: 2,
                    name: "start".into(),
                    args: "[\"srv\"]".into()
                },
                ForkvmDirective {
                    line: 3,
                    name: "ready".into(),
                    args: "port=80".into()
                },
                ForkvmDirective {
                    line: 4,
                    name: "".into(),
                    args: "".into()
                },
            ]
        );
    }

    #[test]
    fn bad_keyword() {
        let e = parse("FROM a\n--x y\n").unwrap_err();
        assert_eq!(e.line(), Some(2));
        assert!(parse("FROM a\nRUN2 x").is_err());
        assert!(parse("").unwrap().instructions.is_empty());
        assert!(parse("\\\n").unwrap().instructions.is_empty());
        let e = parse("FROM a\nRUN cat <<EOF\nno end\n").unwrap_err();
        assert!(
            e.to_string().contains("line 2") && e.to_string().contains("<<EOF"),
            "{e}"
        );
    }

    #[test]
    fn heredocs() {
        let df = parse(
            "FROM a\nRUN <<EOF\napt-get update\n  echo $HOME\nEOF\nCOPY --chmod=755 <<-\"X\" <<Y /d/\n\tx1\n\tX\ny1\nY\nRUN cat <<<word && echo done\n",
        )
        .unwrap();
        let i = &df.instructions;
        assert_eq!(i.len(), 4);
        assert_eq!(
            (i[1].keyword.as_str(), i[1].args.as_str()),
            ("RUN", "<<EOF")
        );
        assert_eq!(
            i[1].heredocs,
            [Heredoc {
                name: "EOF".into(),
                body: "apt-get update\n  echo $HOME\n".into(),
                expand: true
            }]
        );
        assert_eq!(i[2].line, 6);
        assert_eq!(
            i[2].heredocs,
            [
                Heredoc {
                    name: "X".into(),
                    body: "x1\n".into(),
                    expand: false
                },
                Heredoc {
                    name: "Y".into(),
                    body: "y1\n".into(),
                    expand: true
                }
            ]
        );
        assert!(i[3].heredocs.is_empty(), "{:?}", i[3]);
        for not in [
            "python3 -c \"print(1<<3)\"",
            "echo $((1<<3))",
            "echo 'a <<b'",
            "cat <<<word",
            "echo a\\<<b",
        ] {
            assert!(heredoc_markers(not).is_empty(), "{not}");
        }
        let m = |s: &str| {
            heredoc_markers(s)
                .into_iter()
                .map(|m| m.0)
                .collect::<Vec<_>>()
        };
        assert_eq!(m("cat 3<<A >out && cat <<-'B';"), ["A", "B"]);
        assert_eq!(i[3].line, 11);
    }

    #[test]
    fn flags() {
        let (f, rest) = take_flags("--chown=a:b  --LINK --chmod=755 src dst");
        assert_eq!(
            f,
            [
                Flag {
                    name: "chown".into(),
                    value: Some("a:b".into())
                },
                Flag {
                    name: "link".into(),
                    value: None
                },
                Flag {
                    name: "chmod".into(),
                    value: Some("755".into())
                },
            ]
        );
        assert_eq!(rest, "src dst");
        assert_eq!(take_flags("a --b").1, "a --b");
    }

    #[test]
    fn json_or_shell() {
        assert_eq!(json_form(r#" ["a", "b c"] "#).unwrap(), ["a", "b c"]);
        assert_eq!(json_form(r#"["a\"q"]"#).unwrap(), ["a\"q"]);
        assert!(json_form("[ -f x ] && y").is_none());
        assert!(json_form(r#"["a", 1]"#).is_none());
        assert!(json_form(r#"['a']"#).is_none());
        assert!(json_form("echo").is_none());
        assert_eq!(json_form("[]").unwrap(), Vec::<String>::new());
    }
}
