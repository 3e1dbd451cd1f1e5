//! `.dockerignore` and the glob patterns shared with `COPY` sources.
//!
//! `.dockerignore` format (as Docker reads it): one pattern a line; blank
//! lines and lines starting with `#` are skipped; surrounding blanks are
//! trimmed; a leading `!` makes the line an exception (re-includes what
//! earlier lines excluded); a leading `/` is dropped: every pattern is
//! relative to the context root (`*.log` matches only at the root, use
//! `**/*.log` for every directory). Patterns are cleaned like paths
//! (`./a//b/` is `a/b`). The last line that matches a path decides, and
//! a pattern that matches a directory also matches everything under it.
//!
//! Pattern syntax, per `/`-separated segment: `*` matches any run of
//! characters except `/`, `?` any one character except `/`, `[abc]`,
//! `[a-z]` and `[^a-z]` (or `[!a-z]`) a character class, the escape `\`
//! makes the next character literal. A whole segment `**` matches any
//! number of directories, including none; `**` inside a segment acts as
//! `*`.

use crate::BuildError;

/// A compiled glob: its segments.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    segments: Vec<String>,
}

impl Pattern {
    /// Compile a pattern, checking its character classes.
    pub fn new(pattern: &str) -> Result<Pattern, String> {
        let segments = clean(pattern);
        for s in &segments {
            if s != "**" {
                check_segment(s)?;
            }
        }
        Ok(Pattern { segments })
    }

    /// Whether the pattern matches this `/`-separated context path.
    pub fn matches(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        match_segments(&self.segments, &parts)
    }

    /// Whether the pattern matches the path or one of its parents.
    pub fn matches_or_parent(&self, path: &str) -> bool {
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        (1..=parts.len()).any(|n| match_segments(&self.segments, &parts[..n]))
    }
}

/// Whether a source string has glob characters.
pub fn has_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Path cleaning: drop `.` and empty segments, resolve `..` lexically
/// (never above the root), no leading or trailing `/`.
fn clean(p: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for s in p.split('/') {
        match s {
            "" | "." => {}
            ".." => {
                out.pop();
            }
            s => out.push(s.to_string()),
        }
    }
    out
}

fn match_segments(pat: &[String], path: &[&str]) -> bool {
    match pat.split_first() {
        None => path.is_empty(),
        Some((p, rest)) if p == "**" => (0..=path.len()).any(|n| match_segments(rest, &path[n..])),
        Some((p, rest)) => match path.split_first() {
            Some((first, tail)) => {
                let pc: Vec<char> = p.chars().collect();
                let nc: Vec<char> = first.chars().collect();
                match_segment(&pc, &nc) && match_segments(rest, tail)
            }
            None => false,
        },
    }
}

/// One segment against one name (no `/` in either).
pub fn segment_matches(pattern: &str, name: &str) -> bool {
    let pc: Vec<char> = pattern.chars().collect();
    let nc: Vec<char> = name.chars().collect();
    match_segment(&pc, &nc)
}

fn match_segment(p: &[char], n: &[char]) -> bool {
    match p.first() {
        None => n.is_empty(),
        Some('*') => {
            let rest = &p[1..];
            (0..=n.len()).any(|k| match_segment(rest, &n[k..]))
        }
        Some('?') => !n.is_empty() && match_segment(&p[1..], &n[1..]),
        Some('[') => match (n.first(), class(&p[1..])) {
            (Some(&c), Some((set, len))) => {
                set.contains(c) && match_segment(&p[1 + len..], &n[1..])
            }
            _ => false,
        },
        Some('\\') if p.len() > 1 => n.first() == Some(&p[1]) && match_segment(&p[2..], &n[1..]),
        Some(&c) => n.first() == Some(&c) && match_segment(&p[1..], &n[1..]),
    }
}

struct Class {
    negated: bool,
    ranges: Vec<(char, char)>,
}

impl Class {
    fn contains(&self, c: char) -> bool {
        self.ranges.iter().any(|&(lo, hi)| lo <= c && c <= hi) != self.negated
    }
}

/// Parse a class after its `[`: the class and how many chars it used,
/// including the closing `]`.
fn class(p: &[char]) -> Option<(Class, usize)> {
    let mut i = 0;
    let negated = matches!(p.first(), Some('^' | '!'));
    if negated {
        i += 1;
    }
    let mut ranges = Vec::new();
    let mut first = true;
    loop {
        let mut lo = *p.get(i)?;
        if lo == ']' && !first {
            return Some((Class { negated, ranges }, i + 1));
        }
        first = false;
        if lo == '\\' {
            i += 1;
            lo = *p.get(i)?;
        }
        i += 1;
        let mut hi = lo;
        if p.get(i) == Some(&'-') && p.get(i + 1).is_some_and(|&c| c != ']') {
            hi = *p.get(i + 1)?;
            i += 2;
            if hi == '\\' {
                hi = *p.get(i)?;
                i += 1;
            }
            if hi < lo {
                return None;
            }
        }
        ranges.push((lo, hi));
    }
}

fn check_segment(s: &str) -> Result<(), String> {
    let c: Vec<char> = s.chars().collect();
    let mut i = 0;
    while i < c.len() {
        match c[i] {
            '[' => match class(&c[i + 1..]) {
                Some((_, len)) => i += 1 + len,
                None => return Err(format!("bad character class in pattern segment {s:?}")),
            },
            '\\' => i += 2,
            _ => i += 1,
        }
    }
    Ok(())
}

/// The rules of a `.dockerignore` file.
#[derive(Debug, Clone, Default)]
pub struct Ignore {
    rules: Vec<(Pattern, bool)>,
}

impl Ignore {
    /// Parse `.dockerignore` text.
    pub fn parse(text: &str) -> Result<Ignore, BuildError> {
        let mut rules = Vec::new();
        for (n, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (negated, pat) = match line.strip_prefix('!') {
                Some(p) => (true, p.trim()),
                None => (false, line),
            };
            let pattern = Pattern::new(pat).map_err(|message| BuildError::Ignore {
                line: n + 1,
                message,
            })?;
            if pattern.segments.is_empty() {
                // `.` or `/`: Docker ignores such a line too.
                continue;
            }
            rules.push((pattern, negated));
        }
        Ok(Ignore { rules })
    }

    /// Whether a context-relative path is excluded.
    pub fn excluded(&self, path: &str) -> bool {
        let mut out = false;
        for (p, negated) in &self.rules {
            if p.matches_or_parent(path) {
                out = !negated;
            }
        }
        out
    }

    /// Whether any exception could re-include something under an
    /// excluded directory (then the directory must still be walked).
    pub fn has_exceptions(&self) -> bool {
        self.rules.iter().any(|(_, n)| *n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(p: &str, path: &str) -> bool {
        Pattern::new(p).unwrap().matches(path)
    }

    #[test]
    fn segments() {
        assert!(m("*.py", "a.py"));
        assert!(!m("*.py", "d/a.py"));
        assert!(m("d/*.py", "d/a.py"));
        assert!(m("a?c", "abc"));
        assert!(!m("a?c", "a/c"));
        assert!(m("[a-c]x", "bx"));
        assert!(!m("[^a-c]x", "bx"));
        assert!(m("[!a-c]x", "dx"));
        assert!(m("[]]", "]"));
        assert!(m(r"\*", "*"));
        assert!(!m(r"\*", "a"));
        assert!(m("*", ".hidden"));
        assert!(m("/a/./b//", "a/b"));
        assert!(m("a/../b", "b"));
        assert!(m("a*b*c", "aXbYc"));
        assert!(!m("a*b*c", "aXbY"));
    }

    #[test]
    fn double_star() {
        assert!(m("**/*.log", "x.log"));
        assert!(m("**/*.log", "a/b/x.log"));
        assert!(m("a/**/z", "a/z"));
        assert!(m("a/**/z", "a/b/c/z"));
        assert!(!m("a/**/z", "b/z"));
        assert!(m("**", "anything/at/all"));
        assert!(m("a/**", "a/b"));
        assert!(m("x**y", "xAy"));
    }

    #[test]
    fn bad_patterns() {
        assert!(Pattern::new("[a-").is_err());
        assert!(Pattern::new("[z-a]").is_err());
        assert!(Pattern::new("[").is_err());
        let e = Ignore::parse("ok\n\n[bad").unwrap_err().to_string();
        assert!(e.contains(".dockerignore line 3"), "{e}");
    }

    #[test]
    fn dockerignore_rules() {
        let ig = Ignore::parse(
            "# comment\n\n  node_modules  \n*.md\n!README.md\n/build\n**/*.pyc\n!keep/**/*.pyc\n.\n",
        )
        .unwrap();
        assert!(ig.excluded("node_modules"));
        assert!(ig.excluded("node_modules/a/b.js"));
        assert!(!ig.excluded("sub/node_modules"));
        assert!(ig.excluded("x.md"));
        assert!(!ig.excluded("README.md"));
        assert!(!ig.excluded("docs/x.md"));
        assert!(ig.excluded("build/out"));
        assert!(ig.excluded("a/b/c.pyc"));
        assert!(!ig.excluded("keep/a/c.pyc"));
        assert!(!ig.excluded("src/main.py"));
        assert!(ig.has_exceptions());
        assert!(!Ignore::parse("x").unwrap().has_exceptions());
        // Last match wins.
        let ig = Ignore::parse("!a\na").unwrap();
        assert!(ig.excluded("a"));
    }
}
