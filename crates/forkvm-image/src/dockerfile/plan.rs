//! A parsed Dockerfile evaluated into the steps a build runs, before anything runs.
//!
//! ENV, ARG, WORKDIR, USER, SHELL, LABEL, EXPOSE, CMD, ENTRYPOINT and READY change only
//! the build's configuration; RUN, COPY and ADD change the disk and become steps. Each
//! step carries everything it depends on, resolved (its argv, environment, directory,
//! user; for a copy the digest of what it carries), and its digest is the hash of that:
//! a step's cache key is its parent's key and its digest, so changing one input reruns
//! that step and those after it, and nothing before.

use super::context::{self, Context, CopySet};
use super::ignore::IgnoreRules;
use super::parse::{CommandForm, DockerfileError, Instruction, Kind, Parsed};
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

/// The evaluated build.
#[derive(Debug, Clone)]
pub struct Plan {
    /// FROM's image, variables expanded: a template name, a tag, or an OCI image path.
    pub from: String,
    pub from_line: usize,
    pub steps: Vec<Step>,
    pub config: FinalConfig,
    /// `--build-arg`s no ARG declared (Docker warns about these too).
    pub unused_build_args: Vec<String>,
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
    let lookup = |n: &str| global_value(&global, n);
    let from = words::word(
        match &parsed.from.kind {
            Kind::From { image } => image,
            _ => unreachable!("parse puts FROM there"),
        },
        &lookup,
    )
    .map_err(|e| DockerfileError::at(parsed.from.line, e))?;
    if from.trim().is_empty() {
        return Err(DockerfileError::at(parsed.from.line, "FROM names nothing"));
    }
    let mut s = State {
        config: FinalConfig { shell: vec!["/bin/sh".into(), "-c".into()], ..Default::default() },
        args: BTreeMap::new(),
        steps: Vec::new(),
    };
    for ins in &parsed.body {
        s.apply(ins, build_args, &global, &mut used, context, ignore)?;
    }
    let unused_build_args = build_args.keys().filter(|k| !used.contains(*k)).cloned().collect();
    Ok(Plan { from, from_line: parsed.from.line, steps: s.steps, config: s.config, unused_build_args })
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

struct State {
    config: FinalConfig,
    /// ARGs declared in the stage, with their values.
    args: BTreeMap<String, Option<String>>,
    steps: Vec<Step>,
}

impl State {
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
            Kind::From { .. } => unreachable!("one FROM per build"),
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
            Kind::Copy { add, sources, dest, chown, chmod } => {
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
                let chmod = chmod
                    .as_ref()
                    .map(|m| {
                        u32::from_str_radix(m, 8)
                            .ok()
                            .filter(|m| *m <= 0o7777)
                            .ok_or_else(|| at(format!("--chmod={m} is not an octal mode")))
                    })
                    .transpose()?;
                let action = Action::Copy { set, dest, chown, chmod, cwd: self.config.workdir.clone() };
                self.push(ins, action);
            }
        }
        Ok(())
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
        Run { argv: &'a [String], env: &'a [(String, String)], cwd: &'a Option<String>, user: &'a Option<String> },
        Copy { content: &'a str, dest: &'a str, chown: &'a Option<String>, chmod: Option<u32>, cwd: &'a Option<String> },
    }
    let canon = match a {
        Action::Run { argv, env, cwd, user } => Canon::Run { argv, env, cwd, user },
        Action::Copy { set, dest, chown, chmod, cwd } => {
            Canon::Copy { content: &set.digest, dest, chown, chmod: *chmod, cwd }
        }
    };
    let json = serde_json::to_vec(&canon).expect("plain data serializes");
    context::hex(&Sha256::new_with_prefix(b"forkvm-build-step-v1\0").chain_update(json).finalize())
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
        let p = plan_of(text, &[("V", "2"), ("UNUSED", "x")], d.path()).unwrap();
        assert_eq!(p.from, "tiny");
        assert_eq!(p.unused_build_args, ["UNUSED"]);
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
        assert_eq!(again.steps[0].digest, p.steps[0].digest);
        let other = plan_of(text, &[("V", "3")], d.path()).unwrap();
        assert_ne!(other.steps[0].digest, p.steps[0].digest);
        assert_eq!(other.steps[1].digest, p.steps[1].digest, "the copy does not depend on V");
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
        ] {
            let e = plan_of(text, &[], d.path()).unwrap_err();
            assert_eq!(e.line, Some(line), "{text}: {e}");
            assert!(e.to_string().contains(needle), "{text}: {e}");
        }
    }
}
