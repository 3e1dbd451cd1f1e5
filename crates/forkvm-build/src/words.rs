//! Word splitting and variable substitution, as Docker applies them to
//! `FROM`, `COPY`/`ADD`, `ENV`, `ARG`, `LABEL`, `EXPOSE`, `USER` and
//! `WORKDIR` arguments (never to `RUN`, `CMD` or `ENTRYPOINT`: the shell
//! in the guest expands those).
//!
//! Rules (the escape character is `\` unless `# escape=` changed it):
//!
//! * `$NAME` and `${NAME}` are replaced by the variable's value, or by
//!   nothing when it is not set. `NAME` is `[A-Za-z_][A-Za-z0-9_]*`; a `$`
//!   not followed by a name or `{` stays a literal `$`.
//! * `${NAME:-word}` gives `word` when NAME is unset or empty, `${NAME-word}`
//!   only when unset; `${NAME:+word}` gives `word` when NAME is set and not
//!   empty (else nothing), `${NAME+word}` when set; `${NAME:?msg}` and
//!   `${NAME?msg}` are errors when NAME is unset (or empty, with `:`).
//!   `word` is itself expanded.
//! * `'…'` is literal (quotes removed), `"…"` expands variables inside
//!   (quotes removed; the escape character escapes only `"`, `$` and
//!   itself there). Outside quotes the escape character makes the next
//!   character literal (`\$HOME` is `$HOME`, `a\ b` is `a b`).

/// What a variable currently holds; `None` is unset.
pub trait Lookup {
    fn get(&self, name: &str) -> Option<String>;
}

impl<F: Fn(&str) -> Option<String>> Lookup for F {
    fn get(&self, name: &str) -> Option<String> {
        self(name)
    }
}

/// Split on unquoted whitespace, keeping quotes and escapes in the words
/// so that [`expand`] can process them afterwards.
pub fn split_words(s: &str, escape: char) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut quote: Option<char> = None;
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                cur.push(c);
                if c == q {
                    quote = None;
                } else if c == escape && q == '"' {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
            }
            None if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            None => {
                in_word = true;
                cur.push(c);
                if c == '"' || c == '\'' {
                    quote = Some(c);
                } else if c == escape {
                    if let Some(n) = chars.next() {
                        cur.push(n);
                    }
                }
            }
        }
    }
    if let Some(q) = quote {
        return Err(format!("unterminated {q} quote in {s:?}"));
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// Expand variables in one word and remove its quotes and escapes.
pub fn expand(word: &str, escape: char, vars: &dyn Lookup) -> Result<String, String> {
    let chars: Vec<char> = word.chars().collect();
    let mut x = Expander {
        chars: &chars,
        pos: 0,
        escape,
        vars,
    };
    x.until(None)
}

struct Expander<'a> {
    chars: &'a [char],
    pos: usize,
    escape: char,
    vars: &'a dyn Lookup,
}

impl Expander<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn next(&mut self) -> Option<char> {
        let c = self.peek();
        if c.is_some() {
            self.pos += 1;
        }
        c
    }

    /// Process up to `stop` (consumed) or the end.
    fn until(&mut self, stop: Option<char>) -> Result<String, String> {
        let mut out = String::new();
        loop {
            let Some(c) = self.next() else {
                return match stop {
                    Some(s) => Err(format!("missing '{s}' in variable substitution")),
                    None => Ok(out),
                };
            };
            if Some(c) == stop {
                return Ok(out);
            }
            if c == '\'' {
                loop {
                    match self.next() {
                        Some('\'') => break,
                        Some(ch) => out.push(ch),
                        None => return Err("unterminated ' quote".into()),
                    }
                }
            } else if c == '"' {
                loop {
                    match self.next() {
                        Some('"') => break,
                        Some('$') => out.push_str(&self.variable()?),
                        Some(ch) if ch == self.escape => match self.peek() {
                            Some(n) if n == '"' || n == '$' || n == self.escape => {
                                self.pos += 1;
                                out.push(n);
                            }
                            _ => out.push(ch),
                        },
                        Some(ch) => out.push(ch),
                        None => return Err("unterminated \" quote".into()),
                    }
                }
            } else if c == '$' {
                out.push_str(&self.variable()?);
            } else if c == self.escape {
                if let Some(n) = self.next() {
                    out.push(n);
                }
            } else {
                out.push(c);
            }
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek() {
            if c.is_ascii_alphanumeric() || c == '_' {
                name.push(c);
                self.pos += 1;
            } else {
                break;
            }
        }
        name
    }

    /// After a `$`.
    fn variable(&mut self) -> Result<String, String> {
        match self.peek() {
            Some('{') => {
                self.pos += 1;
                self.braced()
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.name();
                Ok(self.vars.get(&name).unwrap_or_default())
            }
            _ => Ok("$".into()),
        }
    }

    /// After `${`.
    fn braced(&mut self) -> Result<String, String> {
        let name = self.name();
        if name.is_empty() || name.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!(
                "bad substitution: '${{' must be followed by a variable name, found {name:?}"
            ));
        }
        let value = self.vars.get(&name);
        let op = match self.next() {
            Some('}') => return Ok(value.unwrap_or_default()),
            Some(':') => match self.next() {
                Some(o @ ('-' | '+' | '?')) => (true, o),
                other => {
                    return Err(format!(
                        "bad substitution in ${{{name}:…}}: expected '-', '+' or '?' after ':', found {}",
                        other.map(String::from).unwrap_or_else(|| "the end".into())
                    ))
                }
            },
            Some(o @ ('-' | '+' | '?')) => (false, o),
            other => {
                return Err(format!(
                    "bad substitution in ${{{name}…}}: unexpected {}",
                    other.map(|c| format!("{c:?}")).unwrap_or_else(|| "end".into())
                ))
            }
        };
        let word = self.until(Some('}'))?;
        let (colon, op) = op;
        // With ':', an empty value counts as unset.
        let set = match &value {
            Some(v) => !(colon && v.is_empty()),
            None => false,
        };
        Ok(match op {
            '-' if set => value.unwrap_or_default(),
            '-' => word,
            '+' if set => word,
            '+' => String::new(),
            _ if set => value.unwrap_or_default(),
            _ => {
                let msg = if word.is_empty() {
                    "is not set".to_string()
                } else {
                    word
                };
                return Err(format!("{name}: {msg}"));
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn vars() -> BTreeMap<String, String> {
        BTreeMap::from([
            ("A".to_string(), "alpha".to_string()),
            ("EMPTY".to_string(), String::new()),
            ("SP".to_string(), "a b".to_string()),
        ])
    }

    fn ex(s: &str) -> Result<String, String> {
        let v = vars();
        expand(s, '\\', &|n: &str| v.get(n).cloned())
    }

    #[test]
    fn plain_and_braced() {
        assert_eq!(ex("$A").unwrap(), "alpha");
        assert_eq!(ex("${A}x").unwrap(), "alphax");
        assert_eq!(ex("$Ax").unwrap(), "");
        assert_eq!(ex("x$NOPE/y").unwrap(), "x/y");
        assert_eq!(ex("/usr/${A}/$A.d").unwrap(), "/usr/alpha/alpha.d");
        assert_eq!(ex("$ $1 $").unwrap(), "$ $1 $");
        assert_eq!(ex("${SP}").unwrap(), "a b");
    }

    #[test]
    fn modifiers() {
        assert_eq!(ex("${NOPE:-d}").unwrap(), "d");
        assert_eq!(ex("${EMPTY:-d}").unwrap(), "d");
        assert_eq!(ex("${EMPTY-d}").unwrap(), "");
        assert_eq!(ex("${NOPE-d}").unwrap(), "d");
        assert_eq!(ex("${A:-d}").unwrap(), "alpha");
        assert_eq!(ex("${A:+alt}").unwrap(), "alt");
        assert_eq!(ex("${EMPTY:+alt}").unwrap(), "");
        assert_eq!(ex("${EMPTY+alt}").unwrap(), "alt");
        assert_eq!(ex("${NOPE:+alt}").unwrap(), "");
        assert_eq!(ex("${NOPE:-$A/x}").unwrap(), "alpha/x");
        assert_eq!(ex("${NOPE:-${A:+z}}").unwrap(), "z");
        assert_eq!(ex("${A:?boom}").unwrap(), "alpha");
        assert_eq!(ex("${NOPE:?need it}").unwrap_err(), "NOPE: need it");
        assert_eq!(ex("${EMPTY?x}").unwrap(), "");
        assert!(ex("${EMPTY:?}").unwrap_err().contains("not set"));
    }

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(ex("'$A'").unwrap(), "$A");
        assert_eq!(ex("\"$A b\"").unwrap(), "alpha b");
        assert_eq!(ex(r#""a\"b\$A\\c\d""#).unwrap(), r#"a"b$A\c\d"#);
        assert_eq!(ex(r"\$A").unwrap(), "$A");
        assert_eq!(ex(r"a\ b").unwrap(), "a b");
        assert_eq!(ex(r"a\").unwrap(), "a");
        assert_eq!(ex("x'y'\"z\"").unwrap(), "xyz");
        let v = vars();
        let tick = expand("`$A$A", '`', &|n: &str| v.get(n).cloned()).unwrap();
        assert_eq!(tick, "$Aalpha");
        // With ` as the escape character, \ is an ordinary character.
        let win = expand(r"C:\dir\$A", '`', &|n: &str| v.get(n).cloned()).unwrap();
        assert_eq!(win, r"C:\dir\alpha");
    }

    #[test]
    fn bad_input() {
        assert!(ex("'abc").is_err());
        assert!(ex("\"abc").is_err());
        assert!(ex("${A").is_err());
        assert!(ex("${A:-x").is_err());
        assert!(ex("${}").is_err());
        assert!(ex("${1}").is_err());
        assert!(ex("${A:x}").is_err());
        assert!(ex("${A/x}").is_err());
        assert!(ex("${A:").is_err());
    }

    #[test]
    fn splitting_keeps_quotes() {
        let w = split_words(r#"  a "b c"  'd e' f\ g "h\"i" "#, '\\').unwrap();
        assert_eq!(w, ["a", "\"b c\"", "'d e'", r"f\ g", r#""h\"i""#]);
        assert!(split_words("\"open", '\\').is_err());
        assert!(split_words("'open", '\\').is_err());
        assert_eq!(split_words("", '\\').unwrap(), Vec::<String>::new());
        assert_eq!(
            split_words("K=\"x y\" L=z", '\\').unwrap(),
            ["K=\"x y\"", "L=z"]
        );
    }
}
