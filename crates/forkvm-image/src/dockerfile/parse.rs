//! A Dockerfile read into the instructions forkvm builds, each with its line number.
//!
//! The syntax (continuations, the `escape` directive, JSON and shell forms, here-docs,
//! flags) is `parse-dockerfile`'s. On top of it: our `READY` instruction (a command whose
//! success marks the template warm), which that parser does not know, so its lines are
//! handed to it as `HEALTHCHECK CMD` and told apart again by line number; and the
//! refusals, each naming its line: `RUN --mount`, ADD of a URL, `ADD --from`,
//! HEALTHCHECK, ONBUILD, VOLUME, STOPSIGNAL. A Dockerfile may have several stages (`FROM
//! ... AS name`); which of them a build needs is the plan's business.

use parse_dockerfile as pd;
use std::collections::BTreeSet;

/// What went wrong, and on which line when one is to blame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Dockerfile{}: {message}", line.map(|l| format!(" line {l}")).unwrap_or_default())]
pub struct DockerfileError {
    pub line: Option<usize>,
    pub message: String,
}

impl DockerfileError {
    pub fn at(line: usize, message: impl Into<String>) -> Self {
        DockerfileError { line: Some(line), message: message.into() }
    }
}

/// A command in shell form (`sh -c`) or exec form (argv).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CommandForm {
    Shell(String),
    Exec(Vec<String>),
}

/// One instruction, its arguments as written (expanded later, in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// `FROM image [AS name]`.
    From {
        image: String,
        name: Option<String>,
    },
    Run(CommandForm),
    /// COPY or ADD; `from`: `COPY --from=STAGE` (a stage's name or index).
    Copy {
        add: bool,
        sources: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<String>,
        from: Option<String>,
    },
    Env(String),
    Arg(String),
    Label(String),
    Workdir(String),
    User(String),
    Expose(Vec<String>),
    Cmd(CommandForm),
    Entrypoint(CommandForm),
    Shell(Vec<String>),
    Ready(CommandForm),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub line: usize,
    /// The instruction's first line as written, for reports.
    pub text: String,
    pub kind: Kind,
}

/// A Dockerfile: the ARGs before the first FROM, then its stages in order (the last is
/// what the build makes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    pub global_args: Vec<Instruction>,
    pub stages: Vec<ParsedStage>,
}

/// One stage: its FROM and what follows it up to the next FROM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedStage {
    pub from: Instruction,
    pub body: Vec<Instruction>,
}

/// The most stages a Dockerfile may have.
pub const MAX_STAGES: usize = 32;

const READY: &str = "READY";

/// Parses a Dockerfile.
pub fn parse(text: &str) -> Result<Parsed, DockerfileError> {
    let (rewritten, ready_lines) = ready_as_healthcheck(text);
    let file = pd::parse(&rewritten).map_err(|e| {
        let message = e.to_string();
        let line = message.split(" at line ").nth(1).and_then(|r| r.split_whitespace().next()?.parse().ok());
        DockerfileError { line, message: message.replace("HEALTHCHECK CMD", READY) }
    })?;
    let escape = file.parser_directives.escape.as_ref().map_or('\\', |d| d.value.value);
    let lines: Vec<&str> = text.lines().collect();
    let line_of = |pos: usize| rewritten[..pos].matches('\n').count() + 1;
    let mut global_args = Vec::new();
    let mut stages: Vec<ParsedStage> = Vec::new();
    for ins in &file.instructions {
        let start = span_start(ins);
        let line = line_of(start);
        let text = lines.get(line - 1).map_or(String::new(), |l| shorten(l.trim()));
        let kind = convert(ins, line, &rewritten, escape, ready_lines.contains(&line))?;
        let ins = Instruction { line, text, kind };
        let full = stages.len() == MAX_STAGES;
        match (&ins.kind, stages.last_mut()) {
            (Kind::From { .. }, _) if full => {
                return Err(DockerfileError::at(line, format!("more than {MAX_STAGES} stages")))
            }
            (Kind::From { .. }, _) => stages.push(ParsedStage { from: ins, body: Vec::new() }),
            (Kind::Arg(_), None) => global_args.push(ins),
            (_, None) => return Err(DockerfileError::at(line, "only ARG may come before FROM")),
            (_, Some(stage)) => stage.body.push(ins),
        }
    }
    if stages.is_empty() {
        return Err(DockerfileError { line: None, message: "no FROM instruction".into() });
    }
    Ok(Parsed { global_args, stages })
}

impl Parsed {
    /// The stage the build makes (the last).
    pub fn last(&self) -> &ParsedStage {
        self.stages.last().expect("parse refuses a Dockerfile without FROM")
    }
}

/// The text with each `READY` instruction's keyword replaced by `HEALTHCHECK CMD`, and
/// the lines where that was done. Instructions start on lines that are not comments,
/// not blank and not continued from the line before.
fn ready_as_healthcheck(text: &str) -> (String, BTreeSet<usize>) {
    let mut out = String::with_capacity(text.len() + 64);
    let mut lines = BTreeSet::new();
    let mut continued = false;
    for (n, line) in text.split_inclusive('\n').enumerate() {
        let trimmed = line.trim_start();
        let is_comment = trimmed.starts_with('#');
        let word = trimmed.split_whitespace().next().unwrap_or_default();
        if !continued && !is_comment && word.eq_ignore_ascii_case(READY) {
            let indent = &line[..line.len() - trimmed.len()];
            out.push_str(indent);
            out.push_str("HEALTHCHECK CMD");
            out.push_str(&trimmed[word.len()..]);
            lines.insert(n + 1);
        } else {
            out.push_str(line);
        }
        if !is_comment && !trimmed.trim().is_empty() {
            let body = line.trim_end();
            continued = body.ends_with('\\') || body.ends_with('`');
        }
    }
    (out, lines)
}

fn convert(
    ins: &pd::Instruction<'_>,
    line: usize,
    text: &str,
    escape: char,
    ready: bool,
) -> Result<Kind, DockerfileError> {
    let refuse = |what: &str| Err(DockerfileError::at(line, format!("{what} is not supported")));
    Ok(match ins {
        pd::Instruction::From(f) => {
            if let Some(flag) = f.options.iter().find(|o| o.name.value != "platform") {
                return refuse(&format!("FROM --{}", flag.name.value));
            }
            // Stage names are case-insensitive, as in Docker.
            let name = f.as_.as_ref().map(|(_, n)| n.value.to_ascii_lowercase());
            if let Some(n) = &name {
                check_stage_name(n).map_err(|e| DockerfileError::at(line, e))?;
            }
            Kind::From { image: f.image.value.to_string(), name }
        }
        pd::Instruction::Run(r) => {
            if let Some(flag) = r.options.first() {
                return refuse(&format!("RUN --{}", flag.name.value));
            }
            if r.here_docs.is_empty() {
                Kind::Run(command(&r.arguments, escape))
            } else {
                Kind::Run(here_doc_script(r, text))
            }
        }
        pd::Instruction::Copy(c) => copy(line, false, &c.options, &c.src, &c.dest)?,
        pd::Instruction::Add(a) => copy(line, true, &a.options, &a.src, &a.dest)?,
        pd::Instruction::Env(e) => Kind::Env(e.arguments.value.to_string()),
        pd::Instruction::Arg(a) => Kind::Arg(a.arguments.value.to_string()),
        pd::Instruction::Label(l) => Kind::Label(l.arguments.value.to_string()),
        pd::Instruction::Maintainer(m) => Kind::Label(format!("maintainer=\"{}\"", m.name.value.replace('"', "\\\""))),
        pd::Instruction::Workdir(w) => Kind::Workdir(w.arguments.value.to_string()),
        pd::Instruction::User(u) => Kind::User(u.arguments.value.to_string()),
        pd::Instruction::Expose(e) => Kind::Expose(e.arguments.iter().map(|a| a.value.to_string()).collect()),
        pd::Instruction::Cmd(c) => Kind::Cmd(command(&c.arguments, escape)),
        pd::Instruction::Entrypoint(e) => Kind::Entrypoint(command(&e.arguments, escape)),
        pd::Instruction::Shell(s) => Kind::Shell(s.arguments.iter().map(|a| a.value.to_string()).collect()),
        pd::Instruction::Healthcheck(h) if ready => match (&h.arguments, h.options.is_empty()) {
            (pd::HealthcheckArguments::Cmd { arguments, .. }, true) => Kind::Ready(command(arguments, escape)),
            _ => return Err(DockerfileError::at(line, "READY takes a command and no flags")),
        },
        pd::Instruction::Healthcheck(_) => return refuse("HEALTHCHECK (use READY for a warm-up check)"),
        pd::Instruction::Onbuild(_) => return refuse("ONBUILD"),
        pd::Instruction::Volume(_) => return refuse("VOLUME (attach a forkvm volume at spawn instead)"),
        pd::Instruction::Stopsignal(_) => return refuse("STOPSIGNAL"),
        _ => return refuse("this instruction"),
    })
}

fn copy(
    line: usize,
    add: bool,
    options: &[pd::Flag<'_>],
    src: &[pd::Source<'_>],
    dest: &pd::UnescapedString<'_>,
) -> Result<Kind, DockerfileError> {
    let name = if add { "ADD" } else { "COPY" };
    let (mut chown, mut chmod, mut from) = (None, None, None);
    for flag in options {
        let value = flag.value.as_ref().map(|v| v.value.to_string());
        match (&*flag.name.value, value) {
            ("chown", Some(v)) => chown = Some(v),
            ("chmod", Some(v)) => chmod = Some(v),
            // As written: a stage name matches in any case, an image keeps its own.
            ("from", Some(v)) if !add => from = Some(v),
            ("from", _) if add => {
                return Err(DockerfileError::at(line, "ADD --from is not supported (use COPY --from)"))
            }
            (other, _) => return Err(DockerfileError::at(line, format!("{name} --{other} is not supported"))),
        }
    }
    let mut sources = Vec::new();
    for s in src {
        match s {
            pd::Source::Path(p) => sources.push(p.value.to_string()),
            _ => return Err(DockerfileError::at(line, format!("{name} from a here-document is not supported"))),
        }
    }
    Ok(Kind::Copy { add, sources, dest: dest.value.to_string(), chown, chmod, from })
}

/// A stage name: Docker's rule (a letter, then letters, digits, `_`, `.`, `-`), lower
/// case, at most 64 bytes.
pub fn check_stage_name(name: &str) -> Result<(), String> {
    let ok = name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "stage name {name:?}: a lowercase letter, then lowercase letters, digits, '_', '.' or '-' (at most 64)"
        ))
    }
}

fn command(c: &pd::Command<'_>, escape: char) -> CommandForm {
    match c {
        pd::Command::Exec(argv) => CommandForm::Exec(argv.value.iter().map(|a| a.value.to_string()).collect()),
        pd::Command::Shell(s) => CommandForm::Shell(join_continued(s.value, escape)),
        _ => CommandForm::Shell(String::new()),
    }
}

/// A shell-form command as the shell gets it: each escaped line end removed, and the
/// comment lines inside the continuation dropped.
fn join_continued(raw: &str, escape: char) -> String {
    let mut out = String::with_capacity(raw.len());
    for (i, line) in raw.split('\n').enumerate() {
        if i > 0 && line.trim_start().starts_with('#') {
            continue;
        }
        let body = line.trim_end();
        match body.strip_suffix(escape) {
            Some(joined) => out.push_str(joined),
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out.trim().to_string()
}

/// `RUN <<EOF ... EOF` runs the document as a script; `RUN cmd <<EOF ...` runs the
/// whole thing, documents included, as a shell script.
fn here_doc_script(r: &pd::RunInstruction<'_>, text: &str) -> CommandForm {
    let head = match &r.arguments {
        pd::Command::Shell(s) => s.value.trim(),
        _ => "",
    };
    if head.is_empty() || head.starts_with("<<") {
        return CommandForm::Shell(r.here_docs.iter().map(|d| d.value.to_string()).collect::<Vec<_>>().join("\n"));
    }
    let start = match &r.arguments {
        pd::Command::Shell(s) => s.span.start,
        pd::Command::Exec(e) => e.span.start,
        _ => 0,
    };
    let end = r.here_docs.last().map_or(start, |d| d.span.end);
    CommandForm::Shell(text[start..end.min(text.len())].to_string())
}

fn span_start(ins: &pd::Instruction<'_>) -> usize {
    match ins {
        pd::Instruction::Add(i) => i.add.span.start,
        pd::Instruction::Arg(i) => i.arg.span.start,
        pd::Instruction::Cmd(i) => i.cmd.span.start,
        pd::Instruction::Copy(i) => i.copy.span.start,
        pd::Instruction::Entrypoint(i) => i.entrypoint.span.start,
        pd::Instruction::Env(i) => i.env.span.start,
        pd::Instruction::Expose(i) => i.expose.span.start,
        pd::Instruction::From(i) => i.from.span.start,
        pd::Instruction::Healthcheck(i) => i.healthcheck.span.start,
        pd::Instruction::Label(i) => i.label.span.start,
        pd::Instruction::Maintainer(i) => i.maintainer.span.start,
        pd::Instruction::Onbuild(i) => i.onbuild.span.start,
        pd::Instruction::Run(i) => i.run.span.start,
        pd::Instruction::Shell(i) => i.shell.span.start,
        pd::Instruction::Stopsignal(i) => i.stopsignal.span.start,
        pd::Instruction::User(i) => i.user.span.start,
        pd::Instruction::Volume(i) => i.volume.span.start,
        pd::Instruction::Workdir(i) => i.workdir.span.start,
        _ => 0,
    }
}

fn shorten(s: &str) -> String {
    const MAX: usize = 120;
    if s.len() <= MAX {
        return s.to_string();
    }
    format!("{}...", &s[..s.floor_char_boundary(MAX)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_keep_their_lines_and_ready_is_ours() {
        let p = parse(
            "# syntax=docker/dockerfile:1\nARG BASE=tiny\nFROM ${BASE}\n\nRUN echo a && \\\n  # note\n  echo b\nready test -f /x\nCOPY --chown=app a b /dst/\nRUN [\"/bin/echo\", \"hi\"]\nRUN <<EOF\necho here\nEOF\n",
        )
        .unwrap();
        assert_eq!(p.global_args.len(), 1);
        assert_eq!(p.stages.len(), 1);
        let p = p.last();
        assert_eq!((p.from.line, &p.from.kind), (3, &Kind::From { image: "${BASE}".into(), name: None }));
        let lines: Vec<usize> = p.body.iter().map(|i| i.line).collect();
        assert_eq!(lines, [5, 8, 9, 10, 11]);
        assert_eq!(p.body[0].kind, Kind::Run(CommandForm::Shell("echo a &&   echo b".into())));
        assert_eq!(p.body[0].text, "RUN echo a && \\");
        assert_eq!(p.body[1].kind, Kind::Ready(CommandForm::Shell("test -f /x".into())));
        assert_eq!(
            p.body[2].kind,
            Kind::Copy {
                add: false,
                sources: vec!["a".into(), "b".into()],
                dest: "/dst/".into(),
                chown: Some("app".into()),
                chmod: None,
                from: None,
            }
        );
        assert_eq!(p.body[3].kind, Kind::Run(CommandForm::Exec(vec!["/bin/echo".into(), "hi".into()])));
        assert_eq!(p.body[4].kind, Kind::Run(CommandForm::Shell("echo here\n".into())));
    }

    #[test]
    fn what_forkvm_does_not_build_is_refused_by_line() {
        let cases = [
            ("FROM a AS 1x\n", 1, "stage name"),
            ("FROM t AS a\nFROM t AS a\n", 2, "duplicate stage"),
            ("FROM a\n\nADD --from=x a /b\n", 3, "ADD --from"),
            ("FROM a\nRUN --mount=type=cache,target=/x true\n", 2, "RUN --mount"),
            ("FROM a\nHEALTHCHECK CMD true\n", 2, "HEALTHCHECK"),
            ("FROM a\nVOLUME /x\n", 2, "VOLUME"),
            ("FROM a\nONBUILD RUN x\n", 2, "ONBUILD"),
            ("RUN x\nFROM a\n", 1, "FROM"),
            ("FROM a\nFROBNICATE x\n", 2, "FROBNICATE"),
        ];
        for (text, line, needle) in cases {
            let e = parse(text).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
        assert!(parse("# nothing\n").unwrap_err().to_string().contains("FROM"));
        let many: String = (0..=MAX_STAGES).map(|i| format!("FROM a AS s{i}\n")).collect();
        assert_eq!(parse(&many).unwrap_err().line, Some(MAX_STAGES + 1));
    }

    #[test]
    fn stages_and_copy_from() {
        let p = parse("ARG V=1\nFROM tiny AS Build\nRUN make\nFROM build AS test\nFROM tiny\nCOPY --from=build --chown=app /out/ /app/\n").unwrap();
        assert_eq!(p.stages.len(), 3);
        assert_eq!(p.stages[0].from.kind, Kind::From { image: "tiny".into(), name: Some("build".into()) });
        assert_eq!(p.stages[1].from.kind, Kind::From { image: "build".into(), name: Some("test".into()) });
        assert!(p.stages[1].body.is_empty());
        assert_eq!(
            p.last().body[0].kind,
            Kind::Copy {
                add: false,
                sources: vec!["/out/".into()],
                dest: "/app/".into(),
                chown: Some("app".into()),
                chmod: None,
                from: Some("build".into()),
            }
        );
    }
}
