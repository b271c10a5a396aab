//! A parsed Dockerfile evaluated into the steps a build runs, before anything runs.
//!
//! ENV, ARG, WORKDIR, USER, SHELL, LABEL, EXPOSE, CMD, ENTRYPOINT and READY change only
//! the build's configuration; RUN, COPY and ADD change the disk and become steps. Each
//! step carries everything it depends on, resolved (its argv, environment, directory,
//! user; for a copy the digest of what it carries), and its digest is the hash of that:
//! a step's cache key is its parent's key and its digest, so changing one input reruns
//! that step and those after it, and nothing before.
//!
//! A Dockerfile of several stages is planned stage by stage: a stage starts from an image
//! or from an earlier stage (whose configuration it inherits, its ARGs not), and `COPY
//! --from=STAGE` takes paths from an earlier stage's result. The build needs the last
//! stage and what it reaches through those two references ([`Plan::needed`]); the
//! others are checked but not run, as BuildKit does.

use super::context::{self, Context, CopySet};
use super::ignore::IgnoreRules;
use super::parse::{CommandForm, DockerfileError, Instruction, Kind, Parsed, ParsedStage};
use super::words;
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;

/// What a step does in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Run `argv` with `env` over the image's, in `cwd` (made first), as `user`.
    Run { argv: Vec<String>, env: Vec<(String, String)>, cwd: Option<String>, user: Option<String> },
    /// Put `set` at `dest` (a directory when it ends in `/`), owned by `chown`, with
    /// `chmod` over the files' own modes; `cwd` is made first.
    Copy { set: CopySet, dest: String, chown: Option<String>, chmod: Option<u32>, cwd: Option<String> },
    /// Put `paths` of stage `stage`'s result at `dest` (a directory when it ends in `/`,
    /// or when a path is one), owned by `chown`, with `chmod` over every copied file's
    /// and directory's own mode; `cwd` is made first. The step's cache key covers that
    /// stage's key, so a changed stage reruns the copy.
    CopyFrom {
        stage: usize,
        paths: Vec<String>,
        dest: String,
        chown: Option<String>,
        chmod: Option<u32>,
        cwd: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    pub line: usize,
    pub text: String,
    pub action: Action,
    /// Hex SHA-256 of the action, resolved.
    pub digest: String,
}

/// The image configuration the build ends with: it becomes the template's exec
/// defaults, its start command and its ready check.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct FinalConfig {
    /// Variables the Dockerfile set, in order (over the base image's own).
    pub env: Vec<(String, String)>,
    pub workdir: Option<String>,
    pub user: Option<String>,
    pub entrypoint: Option<CommandForm>,
    pub cmd: Option<CommandForm>,
    pub expose: Vec<String>,
    pub labels: Vec<(String, String)>,
    pub ready: Option<CommandForm>,
    /// The shell for shell-form commands.
    pub shell: Vec<String>,
}

impl FinalConfig {
    /// Entrypoint and Cmd as one argv, as a container would run them.
    pub fn command(&self) -> Option<Vec<String>> {
        let argv = |c: &CommandForm| match c {
            CommandForm::Exec(a) => a.clone(),
            CommandForm::Shell(s) => self.shell.iter().cloned().chain([s.clone()]).collect(),
        };
        let mut out = self.entrypoint.as_ref().map(argv).unwrap_or_default();
        // A shell-form ENTRYPOINT ignores CMD.
        if !matches!(self.entrypoint, Some(CommandForm::Shell(_))) {
            out.extend(self.cmd.as_ref().map(argv).unwrap_or_default());
        }
        (!out.is_empty()).then_some(out)
    }

    /// `argv` of a RUN or READY command under this configuration's shell.
    pub fn argv(&self, c: &CommandForm) -> Vec<String> {
        match c {
            CommandForm::Exec(a) => a.clone(),
            CommandForm::Shell(s) => self.shell.iter().cloned().chain([s.clone()]).collect(),
        }
    }
}

/// What a stage starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StageBase {
    /// A template name, a tag, or an OCI image path, variables expanded.
    Image(String),
    /// An earlier stage's result (its index).
    Stage(usize),
}

/// One evaluated stage.
#[derive(Debug, Clone)]
pub struct Stage {
    /// Its name (`FROM ... AS name`), lower case.
    pub name: Option<String>,
    pub base: StageBase,
    pub from_line: usize,
    pub steps: Vec<Step>,
    /// The configuration it ends with (a stage based on it starts with this).
    pub config: FinalConfig,
    /// Made for a `COPY --from=IMAGE` (an image, template or tag, not a stage): no steps,
    /// no name, and no index of its own for `--from=N`.
    pub implicit: bool,
}

/// The evaluated build.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Every stage, in order; the last is what the build makes.
    pub stages: Vec<Stage>,
    /// The stages the last one needs (through FROM and COPY --from), in order, the last
    /// one last.
    pub needed: Vec<usize>,
    /// `--build-arg`s no ARG declared (Docker warns about these too).
    pub unused_build_args: Vec<String>,
}

impl Plan {
    /// The stage the build makes.
    pub fn result(&self) -> &Stage {
        self.stages.last().expect("a plan has a stage")
    }

    /// The image stage `index` starts from, through the stages it is based on.
    pub fn root_image(&self, index: usize) -> (&str, usize) {
        let mut at = index;
        loop {
            match &self.stages[at].base {
                StageBase::Image(image) => return (image, self.stages[at].from_line),
                StageBase::Stage(earlier) => at = *earlier,
            }
        }
    }
}

/// Evaluates `parsed` with `build_args`, reading COPY and ADD sources from the context
/// at `context` (with `ignore` applied).
pub fn plan(
    parsed: &Parsed,
    build_args: &BTreeMap<String, String>,
    context: &Context,
    ignore: &IgnoreRules,
) -> Result<Plan, DockerfileError> {
    let mut used = std::collections::BTreeSet::new();
    // Global ARGs are visible to FROM only.
    let mut global: BTreeMap<String, Option<String>> = BTreeMap::new();
    for ins in &parsed.global_args {
        let Kind::Arg(text) = &ins.kind else { continue };
        let seen = global.clone();
        declare_args(ins, text, build_args, &mut global, &mut used, &|n| global_value(&seen, n))?;
    }
    // Every stage name, so a COPY --from naming a later stage is refused, not taken for an image.
    let names: std::collections::BTreeSet<String> = parsed
        .stages
        .iter()
        .filter_map(|s| match &s.from.kind {
            Kind::From { name, .. } => name.clone(),
            _ => None,
        })
        .collect();
    let mut stages: Vec<Stage> = Vec::new();
    for parsed_stage in &parsed.stages {
        let (stage, implicit) =
            plan_stage(parsed_stage, &stages, &names, build_args, &global, &mut used, context, ignore)?;
        stages.extend(implicit);
        stages.push(stage);
    }
    let needed = needed(&stages);
    let unused_build_args = build_args.keys().filter(|k| !used.contains(*k)).cloned().collect();
    Ok(Plan { stages, needed, unused_build_args })
}

/// The index of the earlier stage `name` names: its name, or its index as a number
/// (counting the stages the Dockerfile declares, not the implicit ones).
fn stage_named(stages: &[Stage], name: &str) -> Option<usize> {
    let lower = name.to_ascii_lowercase();
    let by_name = stages.iter().position(|s| s.name.as_deref() == Some(lower.as_str()));
    by_name.or_else(|| {
        let n = name.parse::<usize>().ok()?;
        stages.iter().enumerate().filter(|(_, s)| !s.implicit).nth(n).map(|(i, _)| i)
    })
}

/// Plans one stage, and the implicit stages its `COPY --from=IMAGE` steps need (to be
/// put before it, in order: their indices follow `earlier`'s).
#[allow(clippy::too_many_arguments)]
fn plan_stage(
    parsed: &ParsedStage,
    earlier: &[Stage],
    names: &std::collections::BTreeSet<String>,
    build_args: &BTreeMap<String, String>,
    global: &BTreeMap<String, Option<String>>,
    used: &mut std::collections::BTreeSet<String>,
    context: &Context,
    ignore: &IgnoreRules,
) -> Result<(Stage, Vec<Stage>), DockerfileError> {
    let line = parsed.from.line;
    let Kind::From { image, name } = &parsed.from.kind else { unreachable!("parse puts FROM there") };
    if let Some(n) = name {
        if earlier.iter().any(|s| s.name.as_deref() == Some(n.as_str())) {
            return Err(DockerfileError::at(line, format!("a second stage named {n:?}")));
        }
    }
    let from = words::word(image, &|n| global_value(global, n)).map_err(|e| DockerfileError::at(line, e))?;
    if from.trim().is_empty() {
        return Err(DockerfileError::at(line, "FROM names nothing"));
    }
    // An earlier stage's name wins over a template or tag of that name, as in Docker.
    let lower = from.to_ascii_lowercase();
    let base = match earlier.iter().position(|s| s.name.as_deref() == Some(lower.as_str())) {
        Some(i) => StageBase::Stage(i),
        None => StageBase::Image(from),
    };
    let config = match &base {
        StageBase::Stage(i) => earlier[*i].config.clone(),
        StageBase::Image(_) => FinalConfig { shell: vec!["/bin/sh".into(), "-c".into()], ..Default::default() },
    };
    let mut s = State { config, args: BTreeMap::new(), steps: Vec::new(), earlier, names, implicit: Vec::new() };
    for ins in &parsed.body {
        s.apply(ins, build_args, global, used, context, ignore)?;
    }
    let stage = Stage { name: name.clone(), base, from_line: line, steps: s.steps, config: s.config, implicit: false };
    Ok((stage, s.implicit))
}

/// The stages the last one reaches through its base and its COPY --from steps, in order.
fn needed(stages: &[Stage]) -> Vec<usize> {
    let mut keep = vec![false; stages.len()];
    let mut todo = vec![stages.len() - 1];
    while let Some(i) = todo.pop() {
        if std::mem::replace(&mut keep[i], true) {
            continue;
        }
        if let StageBase::Stage(b) = stages[i].base {
            todo.push(b);
        }
        for step in &stages[i].steps {
            if let Action::CopyFrom { stage, .. } = step.action {
                todo.push(stage);
            }
        }
    }
    (0..stages.len()).filter(|i| keep[*i]).collect()
}

fn global_value(global: &BTreeMap<String, Option<String>>, name: &str) -> Option<String> {
    global.get(name).cloned().flatten()
}

fn declare_args(
    ins: &Instruction,
    text: &str,
    build_args: &BTreeMap<String, String>,
    into: &mut BTreeMap<String, Option<String>>,
    used: &mut std::collections::BTreeSet<String>,
    lookup: words::Lookup<'_>,
) -> Result<(), DockerfileError> {
    let at = |e: String| DockerfileError::at(ins.line, format!("ARG: {e}"));
    for w in words::words(text, lookup).map_err(at)? {
        let (name, default) = match w.split_once('=') {
            Some((n, d)) => (n.to_string(), Some(d.to_string())),
            None => (w, None),
        };
        words::check_name(&name).map_err(at)?;
        let value = match build_args.get(&name) {
            Some(v) => {
                used.insert(name.clone());
                Some(v.clone())
            }
            None => default,
        };
        into.insert(name, value);
    }
    Ok(())
}

struct State<'a> {
    config: FinalConfig,
    /// ARGs declared in the stage, with their values.
    args: BTreeMap<String, Option<String>>,
    steps: Vec<Step>,
    /// The stages before this one (what COPY --from may name).
    earlier: &'a [Stage],
    /// Every stage name of the Dockerfile.
    names: &'a std::collections::BTreeSet<String>,
    /// Implicit stages this one's `COPY --from=IMAGE` steps made (indices after `earlier`).
    implicit: Vec<Stage>,
}

impl State<'_> {
    fn lookup(&self, name: &str) -> Option<String> {
        self.config
            .env
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .or_else(|| self.args.get(name).cloned().flatten())
    }

    /// The environment a RUN gets: the stage's ARGs, then the ENV (which wins).
    fn run_env(&self) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> =
            self.args.iter().filter_map(|(k, v)| Some((k.clone(), v.clone()?))).collect();
        env.retain(|(k, _)| !self.config.env.iter().any(|(e, _)| e == k));
        env.extend(self.config.env.iter().cloned());
        env
    }

    fn expand(&self, line: usize, text: &str) -> Result<String, DockerfileError> {
        words::word(text, &|n| self.lookup(n)).map_err(|e| DockerfileError::at(line, e))
    }

    fn apply(
        &mut self,
        ins: &Instruction,
        build_args: &BTreeMap<String, String>,
        global: &BTreeMap<String, Option<String>>,
        used: &mut std::collections::BTreeSet<String>,
        context: &Context,
        ignore: &IgnoreRules,
    ) -> Result<(), DockerfileError> {
        let line = ins.line;
        let at = |e: String| DockerfileError::at(line, e);
        match &ins.kind {
            Kind::From { .. } => unreachable!("a FROM starts a stage"),
            Kind::Arg(text) => {
                let mut declared = BTreeMap::new();
                declare_args(ins, text, build_args, &mut declared, used, &|n| self.lookup(n))?;
                for (name, value) in declared {
                    // `ARG NAME` after FROM takes the global ARG's value.
                    let value = value.or_else(|| global_value(global, &name));
                    self.args.insert(name, value);
                }
            }
            Kind::Env(text) => {
                for (k, v) in words::pairs(text, &|n| self.lookup(n), true).map_err(|e| at(format!("ENV: {e}")))? {
                    self.config.env.retain(|(e, _)| *e != k);
                    self.config.env.push((k, v));
                }
            }
            Kind::Label(text) => {
                let pairs = words::pairs(text, &|n| self.lookup(n), true).map_err(|e| at(format!("LABEL: {e}")))?;
                self.config.labels.extend(pairs);
            }
            Kind::Workdir(text) => {
                let dir = self.expand(line, text)?;
                let base = self.config.workdir.clone().unwrap_or_else(|| "/".into());
                self.config.workdir = Some(absolute(&base, &dir).ok_or_else(|| at("WORKDIR is empty".into()))?);
            }
            Kind::User(text) => {
                let user = self.expand(line, text)?;
                if user.trim().is_empty() {
                    return Err(at("USER is empty".into()));
                }
                self.config.user = Some(user.trim().to_string());
            }
            Kind::Expose(ports) => {
                for p in ports {
                    let p = self.expand(line, p)?;
                    check_port(&p).map_err(at)?;
                    if !self.config.expose.contains(&p) {
                        self.config.expose.push(p);
                    }
                }
            }
            Kind::Shell(argv) => {
                if argv.is_empty() {
                    return Err(at("SHELL needs at least a program".into()));
                }
                self.config.shell = argv.clone();
            }
            Kind::Cmd(c) => self.config.cmd = Some(c.clone()),
            Kind::Entrypoint(c) => self.config.entrypoint = Some(c.clone()),
            Kind::Ready(c) => self.config.ready = Some(c.clone()),
            Kind::Run(c) => {
                let action = Action::Run {
                    argv: self.config.argv(c),
                    env: self.run_env(),
                    cwd: self.config.workdir.clone(),
                    user: self.config.user.clone(),
                };
                self.push(ins, action);
            }
            Kind::Copy { from: Some(from), sources, dest, chown, chmod, .. } => {
                let stage = match stage_named(self.earlier, from) {
                    Some(i) => i,
                    None if from.parse::<usize>().is_ok() => {
                        return Err(at(format!("COPY --from={from}: no earlier stage of that index")))
                    }
                    None if self.names.contains(&from.to_ascii_lowercase()) => {
                        return Err(at(format!("COPY --from={from}: that stage is this one or comes after it")))
                    }
                    None => self.implicit_stage(line, from)?,
                };
                let chmod = octal_mode(chmod.as_deref()).map_err(at)?;
                let mut paths = Vec::new();
                for s in sources {
                    let s = self.expand(line, s)?;
                    if s.contains(['*', '?', '[']) {
                        return Err(at(format!("COPY --from: {s:?}: wildcards are not supported here")));
                    }
                    paths.push(absolute("/", &s).ok_or_else(|| at("COPY --from: an empty source".into()))?);
                }
                let dest_text = self.expand(line, dest)?;
                let base = self.config.workdir.clone().unwrap_or_else(|| "/".into());
                let mut dest = absolute(&base, &dest_text).ok_or_else(|| at("COPY has no destination".into()))?;
                let names_dir = dest_text.ends_with('/') || dest_text == "." || dest_text.ends_with("/.");
                if paths.len() > 1 && !names_dir {
                    return Err(at("COPY with several sources needs a destination ending in /".into()));
                }
                if names_dir && !dest.ends_with('/') {
                    dest.push('/');
                }
                let chown = chown.as_ref().map(|c| self.expand(line, c)).transpose()?;
                let action = Action::CopyFrom { stage, paths, dest, chown, chmod, cwd: self.config.workdir.clone() };
                self.push(ins, action);
            }
            Kind::Copy { add, sources, dest, chown, chmod, from: None } => {
                let name = if *add { "ADD" } else { "COPY" };
                let sources: Vec<String> = sources.iter().map(|s| self.expand(line, s)).collect::<Result<_, _>>()?;
                let dest_text = self.expand(line, dest)?;
                let base = self.config.workdir.clone().unwrap_or_else(|| "/".into());
                let mut dest = absolute(&base, &dest_text).ok_or_else(|| at(format!("{name} has no destination")))?;
                let set = context::select(context, ignore, &sources, *add).map_err(|e| at(format!("{name} {e}")))?;
                let names_dir = dest_text.ends_with('/') || dest_text == "." || dest_text.ends_with("/.");
                if names_dir || !set.single_file {
                    if !set.single_file && sources.len() > 1 && !names_dir {
                        return Err(at(format!("{name} with several sources needs a destination ending in /")));
                    }
                    if !dest.ends_with('/') {
                        dest.push('/');
                    }
                }
                let chown = chown.as_ref().map(|c| self.expand(line, c)).transpose()?;
                let chmod = octal_mode(chmod.as_deref()).map_err(at)?;
                let action = Action::Copy { set, dest, chown, chmod, cwd: self.config.workdir.clone() };
                self.push(ins, action);
            }
        }
        Ok(())
    }

    /// The index of an implicit stage of `image` (a template, tag or OCI image, variables
    /// expanded): an earlier one of the same image, else a new one.
    fn implicit_stage(&mut self, line: usize, image: &str) -> Result<usize, DockerfileError> {
        let image = self.expand(line, image)?;
        let same = |s: &Stage| s.implicit && s.base == StageBase::Image(image.clone());
        if let Some(i) = self.earlier.iter().position(same) {
            return Ok(i);
        }
        if let Some(j) = self.implicit.iter().position(same) {
            return Ok(self.earlier.len() + j);
        }
        self.implicit.push(Stage {
            name: None,
            base: StageBase::Image(image),
            from_line: line,
            steps: Vec::new(),
            config: FinalConfig::default(),
            implicit: true,
        });
        Ok(self.earlier.len() + self.implicit.len() - 1)
    }

    fn push(&mut self, ins: &Instruction, action: Action) {
        let digest = digest(&action);
        self.steps.push(Step { line: ins.line, text: ins.text.clone(), action, digest });
    }
}

/// `path` made absolute against `base` and normalized lexically; a trailing `/` kept.
fn absolute(base: &str, path: &str) -> Option<String> {
    if path.is_empty() {
        return None;
    }
    let joined = if path.starts_with('/') { path.to_string() } else { format!("{base}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for p in joined.split('/') {
        match p {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let mut out = format!("/{}", parts.join("/"));
    if path.ends_with('/') && out != "/" {
        out.push('/');
    }
    Some(out)
}

fn check_port(p: &str) -> Result<(), String> {
    let (port, proto) = p.split_once('/').unwrap_or((p, "tcp"));
    let ok_port = port.parse::<u16>().is_ok_and(|n| n > 0);
    if ok_port && matches!(proto, "tcp" | "udp") {
        Ok(())
    } else {
        Err(format!("EXPOSE {p}: not PORT or PORT/tcp|udp"))
    }
}

fn digest(a: &Action) -> String {
    #[derive(Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Canon<'a> {
        Run {
            argv: &'a [String],
            env: &'a [(String, String)],
            cwd: &'a Option<String>,
            user: &'a Option<String>,
        },
        Copy {
            content: &'a str,
            dest: &'a str,
            chown: &'a Option<String>,
            chmod: Option<u32>,
            cwd: &'a Option<String>,
        },
        CopyFrom {
            stage: usize,
            paths: &'a [String],
            dest: &'a str,
            chown: &'a Option<String>,
            // Absent from the key when not given, so earlier steps keep their keys.
            #[serde(skip_serializing_if = "Option::is_none")]
            chmod: Option<u32>,
            cwd: &'a Option<String>,
        },
    }
    let canon = match a {
        Action::Run { argv, env, cwd, user } => Canon::Run { argv, env, cwd, user },
        Action::Copy { set, dest, chown, chmod, cwd } => {
            Canon::Copy { content: &set.digest, dest, chown, chmod: *chmod, cwd }
        }
        Action::CopyFrom { stage, paths, dest, chown, chmod, cwd } => {
            Canon::CopyFrom { stage: *stage, paths, dest, chown, chmod: *chmod, cwd }
        }
    };
    let json = serde_json::to_vec(&canon).expect("plain data serializes");
    context::hex(&Sha256::new_with_prefix(b"forkvm-build-step-v1\0").chain_update(json).finalize())
}

/// `--chmod`'s value: an octal mode up to 7777.
fn octal_mode(text: Option<&str>) -> Result<Option<u32>, String> {
    text.map(|m| {
        u32::from_str_radix(m, 8)
            .ok()
            .filter(|m| *m <= 0o7777)
            .ok_or_else(|| format!("--chmod={m} is not an octal mode"))
    })
    .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dockerfile::parse::parse;

    fn plan_of(text: &str, args: &[(&str, &str)], ctx: &std::path::Path) -> Result<Plan, DockerfileError> {
        let args = args.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        plan(&parse(text).unwrap(), &args, &Context::Dir(ctx.into()), &IgnoreRules::default())
    }

    #[test]
    fn configuration_folds_into_the_steps_that_follow_it() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("app.py"), "x").unwrap();
        let text = "ARG BASE=tiny\nFROM $BASE\nARG V=1\nENV A=$V B=\"b c\"\nWORKDIR /srv\nWORKDIR app\nUSER app\nRUN echo $A\nCOPY --chmod=755 app.py .\nCOPY app.py ./renamed.py\nEXPOSE 8080 53/udp\nCMD [\"python3\", \"app.py\"]\nREADY test -f app.py\n";
        let plan = plan_of(text, &[("V", "2"), ("UNUSED", "x")], d.path()).unwrap();
        let p = plan.result();
        assert_eq!(p.base, StageBase::Image("tiny".into()));
        assert_eq!(plan.needed, [0]);
        assert_eq!(plan.unused_build_args, ["UNUSED"]);
        assert_eq!(p.steps.len(), 3);
        let Action::Run { argv, env, cwd, user } = &p.steps[0].action else { panic!() };
        assert_eq!(argv, &["/bin/sh", "-c", "echo $A"]);
        assert_eq!(env, &[("V".into(), "2".into()), ("A".into(), "2".into()), ("B".into(), "b c".into())]);
        assert_eq!((cwd.as_deref(), user.as_deref()), (Some("/srv/app"), Some("app")));
        let Action::Copy { dest, chmod, .. } = &p.steps[1].action else { panic!() };
        assert_eq!((dest.as_str(), *chmod), ("/srv/app/", Some(0o755)));
        let Action::Copy { dest, .. } = &p.steps[2].action else { panic!() };
        assert_eq!(dest, "/srv/app/renamed.py");
        assert_eq!(p.config.expose, ["8080", "53/udp"]);
        assert_eq!(p.config.command().unwrap(), ["python3", "app.py"]);
        assert_eq!(p.config.workdir.as_deref(), Some("/srv/app"));

        // A different build arg changes the RUN's digest; the same one does not.
        let again = plan_of(text, &[("V", "2")], d.path()).unwrap();
        assert_eq!(again.result().steps[0].digest, p.steps[0].digest);
        let other = plan_of(text, &[("V", "3")], d.path()).unwrap();
        assert_ne!(other.result().steps[0].digest, p.steps[0].digest);
        assert_eq!(other.result().steps[1].digest, p.steps[1].digest, "the copy does not depend on V");
    }

    #[test]
    fn stages_inherit_their_base_and_copy_from_what_came_before() {
        let d = tempfile::tempdir().unwrap();
        let text = "ARG BASE=tiny\nFROM $BASE AS build\nARG V=1\nENV OUT=/out\nWORKDIR /src\nRUN make $V\nFROM build AS unused\nRUN echo never\nFROM build AS test\nRUN echo $OUT\nFROM $BASE\nWORKDIR /app\nCOPY --from=BUILD --chown=app /out/bin out/ ./\nCOPY --from=2 etc/x /x\n";
        let p = plan_of(text, &[("V", "2")], d.path()).unwrap();
        assert_eq!(p.stages.len(), 4);
        assert_eq!(p.needed, [0, 2, 3], "the unused stage is planned, not needed");
        assert_eq!(p.stages[2].base, StageBase::Stage(0));
        assert_eq!(p.root_image(2), ("tiny", 2));
        // A stage on an earlier one starts with its ENV and WORKDIR, not its ARGs.
        let Action::Run { env, cwd, .. } = &p.stages[2].steps[0].action else { panic!() };
        assert_eq!((env.as_slice(), cwd.as_deref()), (&[("OUT".to_string(), "/out".to_string())][..], Some("/src")));
        let last = p.result();
        assert_eq!(last.base, StageBase::Image("tiny".into()));
        assert_eq!(last.config.env, [], "a stage on an image starts clean");
        let Action::CopyFrom { stage, paths, dest, chown, .. } = &last.steps[0].action else { panic!() };
        assert_eq!(
            (*stage, paths.as_slice(), dest.as_str()),
            (0, &["/out/bin".to_string(), "/out/".to_string()][..], "/app/")
        );
        assert_eq!(chown.as_deref(), Some("app"));
        let Action::CopyFrom { stage, paths, dest, .. } = &last.steps[1].action else { panic!() };
        assert_eq!((*stage, paths.as_slice(), dest.as_str()), (2, &["/etc/x".to_string()][..], "/x"));
        // The step's digest names the stage and the paths.
        let other = plan_of(&text.replace("--from=2", "--from=0"), &[("V", "2")], d.path()).unwrap();
        assert_ne!(other.result().steps[1].digest, last.steps[1].digest);
    }

    #[test]
    fn copy_from_an_image_is_an_implicit_stage_that_declared_indices_skip() {
        let d = tempfile::tempdir().unwrap();
        let text = "FROM t AS a\nCOPY --from=img /x /x\nFROM t\nCOPY --from=IMG /y /y\nCOPY --from=0 /z /z\nCOPY --from=img /w /w\n";
        let p = plan_of(text, &[], d.path()).unwrap();
        // Each implicit stage goes just before the stage that made it.
        let kinds: Vec<(Option<&str>, bool)> = p.stages.iter().map(|s| (s.name.as_deref(), s.implicit)).collect();
        assert_eq!(kinds, [(None, true), (Some("a"), false), (None, true), (None, false)]);
        assert_eq!(p.stages[0].base, StageBase::Image("img".into()));
        assert_eq!(p.stages[2].base, StageBase::Image("IMG".into()), "image names keep their case");
        let from = |stage: usize, step: usize| match &p.stages[stage].steps[step].action {
            Action::CopyFrom { stage, .. } => *stage,
            other => panic!("{other:?}"),
        };
        assert_eq!(from(1, 0), 0);
        assert_eq!(from(3, 0), 2);
        assert_eq!(from(3, 1), 1, "--from=0 is the first declared stage, not an implicit one");
        assert_eq!(from(3, 2), 0, "the same image again is the same implicit stage");
        assert_eq!(p.needed, [0, 1, 2, 3]);
    }

    #[test]
    fn copy_from_takes_a_chmod_into_its_action_and_key() {
        let d = tempfile::tempdir().unwrap();
        let text = "FROM t AS a\nFROM t\nCOPY --from=a --chmod=750 /out/ /app/\n";
        let p = plan_of(text, &[], d.path()).unwrap();
        let Action::CopyFrom { chmod, .. } = &p.result().steps[0].action else { panic!() };
        assert_eq!(*chmod, Some(0o750));
        let plain = plan_of(&text.replace("--chmod=750 ", ""), &[], d.path()).unwrap();
        let other = plan_of(&text.replace("750", "755"), &[], d.path()).unwrap();
        let keys = [&p, &plain, &other].map(|p| p.result().steps[0].digest.clone());
        assert!(keys[0] != keys[1] && keys[0] != keys[2] && keys[1] != keys[2], "{keys:?}");
    }

    #[test]
    fn bad_values_name_their_line() {
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("a"), "x").unwrap();
        std::fs::write(d.path().join("b"), "x").unwrap();
        for (text, line, needle) in [
            ("FROM t\nEXPOSE http\n", 2, "EXPOSE http"),
            ("FROM t\nCOPY a b /x\n", 2, "ending in /"),
            ("FROM t\n\nCOPY --chmod=9z a /x\n", 3, "octal"),
            ("FROM t\nENV 1=2\n", 2, "variable name"),
            ("FROM t\nCOPY missing /x\n", 2, "not found"),
            ("FROM t\nWORKDIR ${X\n", 2, "expected }"),
            ("FROM t AS a\nFROM t\nCOPY --from=a /x* /b/\n", 3, "wildcards"),
            ("FROM t AS a\nFROM t\nCOPY --from=a --chmod=8 /x /b\n", 3, "--chmod=8 is not an octal mode"),
            ("FROM t AS a\nFROM t\nCOPY --from=a /x /y /b\n", 3, "ending in /"),
            ("FROM t AS a\nFROM t\nCOPY --from=1 /x /b\n", 3, "no earlier stage of that index"),
            ("FROM t\nCOPY --from=later /a /b\nFROM t AS later\n", 2, "comes after it"),
            ("FROM t AS me\nCOPY --from=me /a /b\n", 2, "comes after it"),
            ("FROM t AS a\nFROM t AS A\n", 2, "a second stage"),
        ] {
            let e = plan_of(text, &[], d.path()).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
    }
}
