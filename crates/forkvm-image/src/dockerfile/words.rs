//! The words of a Dockerfile instruction's arguments, as Docker's shell lexer reads them
//! for the instructions it expands (ENV, ARG, LABEL, WORKDIR, USER, EXPOSE, COPY/ADD,
//! FROM): quotes, backslash escapes, and `$NAME`, `${NAME}`, `${NAME:-word}`,
//! `${NAME-word}`, `${NAME:+word}`, `${NAME+word}`. RUN, CMD, ENTRYPOINT and READY are
//! not expanded here: their shell does it in the guest, with the build's variables in
//! its environment.
//!
//! The parser crate hands these arguments over as written; this is the part of the
//! Dockerfile language it leaves to the builder.

/// Variables by name; `None` when unset.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Splits `text` into words on unquoted whitespace, removing quotes and escapes and
/// expanding variables.
pub fn words(text: &str, vars: Lookup<'_>) -> Result<Vec<String>, String> {
    Lexer { chars: text.chars().collect(), i: 0, vars }.run(true)
}

/// `text` as one word: quotes and escapes removed, variables expanded, whitespace kept.
pub fn word(text: &str, vars: Lookup<'_>) -> Result<String, String> {
    let mut w = Lexer { chars: text.chars().collect(), i: 0, vars }.run(false)?;
    Ok(w.pop().unwrap_or_default())
}

/// `KEY=VALUE` pairs (ENV, ARG defaults, LABEL), or the old `KEY VALUE` form of ENV and
/// LABEL when `legacy` is allowed and the first word has no `=`.
pub fn pairs(text: &str, vars: Lookup<'_>, legacy: bool) -> Result<Vec<(String, String)>, String> {
    let text = text.trim();
    let first = text.split_whitespace().next().unwrap_or_default();
    if legacy && !first.contains('=') {
        let rest = text[first.len()..].trim_start();
        if rest.is_empty() {
            return Err(format!("{first:?} has no value (write {first}=VALUE)"));
        }
        return Ok(vec![(word(first, vars)?, word(rest, vars)?)]);
    }
    let mut out = Vec::new();
    for w in words(text, vars)? {
        let (k, v) = w.split_once('=').ok_or_else(|| format!("{w:?} is not NAME=VALUE"))?;
        check_name(k)?;
        out.push((k.to_string(), v.to_string()));
    }
    if out.is_empty() {
        return Err("nothing to set".into());
    }
    Ok(out)
}

/// A variable name: letters, digits and `_`, not starting with a digit.
pub fn check_name(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let ok = matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
    if ok {
        Ok(())
    } else {
        Err(format!("{name:?} is not a variable name"))
    }
}

struct Lexer<'a> {
    chars: Vec<char>,
    i: usize,
    vars: Lookup<'a>,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<char> {
        self.chars.get(self.i).copied()
    }

    fn run(&mut self, split: bool) -> Result<Vec<String>, String> {
        let mut words = Vec::new();
        let mut cur = String::new();
        let mut started = false;
        while let Some(c) = self.peek() {
            if split && c.is_whitespace() {
                if started {
                    words.push(std::mem::take(&mut cur));
                    started = false;
                }
                self.i += 1;
                continue;
            }
            started = true;
            self.i += 1;
            match c {
                '\\' => match self.peek() {
                    Some(n) => {
                        cur.push(n);
                        self.i += 1;
                    }
                    None => cur.push('\\'),
                },
                '\'' => loop {
                    match self.peek() {
                        Some('\'') => {
                            self.i += 1;
                            break;
                        }
                        Some(n) => {
                            cur.push(n);
                            self.i += 1;
                        }
                        None => return Err("a ' quote is not closed".into()),
                    }
                },
                '"' => loop {
                    match self.peek() {
                        Some('"') => {
                            self.i += 1;
                            break;
                        }
                        Some('\\') => {
                            self.i += 1;
                            match self.peek() {
                                Some(n @ ('"' | '\\' | '$')) => {
                                    cur.push(n);
                                    self.i += 1;
                                }
                                _ => cur.push('\\'),
                            }
                        }
                        Some('$') => {
                            self.i += 1;
                            cur.push_str(&self.dollar()?);
                        }
                        Some(n) => {
                            cur.push(n);
                            self.i += 1;
                        }
                        None => return Err("a \" quote is not closed".into()),
                    }
                },
                '$' => cur.push_str(&self.dollar()?),
                c => cur.push(c),
            }
        }
        if started || !split {
            words.push(cur);
        }
        Ok(words)
    }

    /// After a `$`: the expansion, or `$` itself when no name follows.
    fn dollar(&mut self) -> Result<String, String> {
        match self.peek() {
            Some('{') => {
                self.i += 1;
                self.braced()
            }
            Some(c) if c.is_ascii_alphabetic() || c == '_' => {
                let name = self.name();
                Ok((self.vars)(&name).unwrap_or_default())
            }
            _ => Ok("$".into()),
        }
    }

    fn name(&mut self) -> String {
        let mut name = String::new();
        while let Some(c) = self.peek().filter(|c| c.is_ascii_alphanumeric() || *c == '_') {
            name.push(c);
            self.i += 1;
        }
        name
    }

    /// After `${`: `NAME}` or `NAME<op>word}`.
    fn braced(&mut self) -> Result<String, String> {
        let name = self.name();
        if name.is_empty() {
            return Err("${} has no variable name".into());
        }
        let value = (self.vars)(&name);
        let mut op = String::new();
        while let Some(c) = self.peek().filter(|c| matches!(c, ':' | '-' | '+')) {
            op.push(c);
            self.i += 1;
            if c != ':' {
                break;
            }
        }
        if op.is_empty() {
            return match self.peek() {
                Some('}') => {
                    self.i += 1;
                    Ok(value.unwrap_or_default())
                }
                _ => Err(format!("${{{name}...}}: expected }} or one of :- - :+ +")),
            };
        }
        // The word runs to the matching brace and is itself expanded.
        let start = self.i;
        let mut depth = 1;
        while let Some(c) = self.peek() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                }
                '\\' => self.i += 1,
                _ => {}
            }
            self.i += 1;
        }
        if self.peek() != Some('}') {
            return Err(format!("${{{name}{op}...: the brace is not closed"));
        }
        let inner: String = self.chars[start..self.i].iter().collect();
        self.i += 1;
        let word = || word(&inner, self.vars);
        let set = value.is_some();
        let nonempty = value.as_deref().is_some_and(|v| !v.is_empty());
        match op.as_str() {
            ":-" => {
                if nonempty {
                    Ok(value.unwrap_or_default())
                } else {
                    word()
                }
            }
            "-" => {
                if set {
                    Ok(value.unwrap_or_default())
                } else {
                    word()
                }
            }
            ":+" => {
                if nonempty {
                    word()
                } else {
                    Ok(String::new())
                }
            }
            "+" => {
                if set {
                    word()
                } else {
                    Ok(String::new())
                }
            }
            _ => Err(format!("${{{name}{op}...}}: {op:?} is not one of :- - :+ +")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(name: &str) -> Option<String> {
        match name {
            "A" => Some("one".into()),
            "EMPTY" => Some(String::new()),
            "SP" => Some("a b".into()),
            _ => None,
        }
    }

    #[test]
    fn quotes_escapes_and_expansions_are_read_as_docker_reads_them() {
        let w = |s| words(s, &vars).unwrap();
        assert_eq!(w("a \"b c\" 'd $A' $A ${A}x"), ["a", "b c", "d $A", "one", "onex"]);
        assert_eq!(w(r#"a\ b "q\"x" \$A"#), ["a b", "q\"x", "$A"]);
        assert_eq!(
            w("${NOPE:-def} ${EMPTY:-e} ${EMPTY-e}x ${A:+set} ${NOPE:+set}y ${NOPE+s}z"),
            ["def", "e", "x", "set", "y", "z"]
        );
        assert_eq!(w("${NOPE:-${A}} $ x$"), ["one", "$", "x$"]);
        assert_eq!(w("$SP"), ["a b"], "an expansion is not split again");
        assert_eq!(word("  /a b/$A ", &vars).unwrap(), "  /a b/one ");
        for bad in ["'open", "\"open", "${", "${A", "${A:-x", "${A?x}", "${}"] {
            assert!(words(bad, &vars).is_err(), "{bad}");
        }
    }

    #[test]
    fn env_pairs_in_both_forms() {
        let p = |s, legacy| pairs(s, &vars, legacy);
        assert_eq!(
            p("X=1 Y=\"two words\" Z=$A", true).unwrap(),
            [("X".into(), "1".into()), ("Y".into(), "two words".into()), ("Z".into(), "one".into())]
        );
        assert_eq!(p("X 3 4", true).unwrap(), [("X".to_string(), "3 4".to_string())]);
        assert!(p("X 3", false).is_err());
        assert!(p("X", true).unwrap_err().contains("no value"));
        assert!(p("1X=2", true).unwrap_err().contains("not a variable name"));
    }
}
