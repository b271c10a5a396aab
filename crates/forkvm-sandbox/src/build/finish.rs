//! The build's last step: the Dockerfile's configuration written where every front end
//! finds it, its command started when asked, and READY waited for, so the snapshot the
//! build ends with is warm.
//!
//! ENV, WORKDIR and USER go into the guest's exec defaults (`/etc/forkvm/exec.json`),
//! over what the base image had there; the agent reads the file again when it changes,
//! so the sandbox the step runs in (and every sandbox after) execs with them. CMD and
//! ENTRYPOINT are started only with `start` (a detached service, as a template's `start`
//! is): a sandbox is a machine to exec in, not one process.

use super::BuildEvent;
use crate::chain_ops::ChainOpError;
use crate::template_start::{launch, wait_ready, READY_TIMEOUT};
use forkvm_image::dockerfile::FinalConfig;
use forkvm_proto::exec_defaults::{ExecDefaultsFile, EXEC_DEFAULTS_PATH, MAX_EXEC_DEFAULTS_BYTES};
use forkvm_proto::{AgentClient, ClientError, ErrorKind, ExecRequest, MkdirRequest, WriteFileRequest};
use std::os::unix::net::UnixStream;

const STEP: &str = "finishing the build";

/// Applies `config` in the sandbox; starts its command when `start`; waits for READY.
pub fn run(
    client: &AgentClient<UnixStream>,
    config: &FinalConfig,
    start: bool,
    events: &mut dyn FnMut(BuildEvent),
) -> Result<String, ChainOpError> {
    let agent = |what: &str| {
        let step = format!("{STEP}: {what}");
        move |source| ChainOpError::Agent { step, source }
    };
    let defaults = merged(current(client)?, config);
    let json = serde_json::to_vec_pretty(&defaults).expect("plain data serializes");
    let req =
        WriteFileRequest { path: EXEC_DEFAULTS_PATH.into(), mode: Some(0o644), create_parents: true, owner: None };
    client.write_file(&req, &mut &json[..]).map_err(agent("writing the exec defaults"))?;
    if let Some(dir) = &defaults.cwd {
        let req = MkdirRequest { path: dir.clone(), parents: true, mode: None, owner: None };
        client.mkdir(&req).map_err(agent("making the working directory"))?;
    }
    let mut out = String::new();
    if start {
        let argv = config.command().ok_or_else(|| ChainOpError::Work {
            step: STEP.into(),
            detail: "--start: the Dockerfile has no CMD or ENTRYPOINT to start".into(),
        })?;
        let line = argv.iter().map(|a| shell_quote(a)).collect::<Vec<_>>().join(" ");
        launch(client, &line, defaults.user.as_deref())
            .map_err(|e| ChainOpError::Work { step: STEP.into(), detail: e.to_string() })?;
        out.push_str(&format!("started {line}\n"));
    }
    if let Some(ready) = &config.ready {
        let argv = config.argv(ready);
        let shown = argv.join(" ");
        events(BuildEvent::Output { step: 0, text: format!("READY {shown}: waiting\n") });
        let waited = wait_ready(client, &shown, ExecRequest::argv(argv), defaults.user.as_deref(), READY_TIMEOUT)
            .map_err(|e| ChainOpError::Work { step: "READY".into(), detail: e.to_string() })?;
        out.push_str(&format!("READY after {:.1} s\n", waited.as_secs_f64()));
    }
    Ok(out)
}

/// The guest's exec defaults as they are (none: empty).
fn current(client: &AgentClient<UnixStream>) -> Result<ExecDefaultsFile, ChainOpError> {
    match client.read_file_to_vec(EXEC_DEFAULTS_PATH) {
        Ok(bytes) if bytes.len() as u64 <= MAX_EXEC_DEFAULTS_BYTES => {
            serde_json::from_slice(&bytes).map_err(|e| ChainOpError::Work {
                step: STEP.into(),
                detail: format!("the base's {EXEC_DEFAULTS_PATH} is not valid: {e}"),
            })
        }
        Ok(bytes) => Err(ChainOpError::Work {
            step: STEP.into(),
            detail: format!("the base's {EXEC_DEFAULTS_PATH} is {} bytes, over the limit", bytes.len()),
        }),
        Err(ClientError::Agent(e)) if e.kind == ErrorKind::NotFound => Ok(ExecDefaultsFile::default()),
        Err(source) => Err(ChainOpError::Agent { step: format!("{STEP}: reading {EXEC_DEFAULTS_PATH}"), source }),
    }
}

/// `base` with the Dockerfile's ENV (replacing variables of the same name), WORKDIR
/// and USER over it.
pub fn merged(mut base: ExecDefaultsFile, config: &FinalConfig) -> ExecDefaultsFile {
    for (k, v) in &config.env {
        base.env.retain(|(e, _)| e != k);
        base.env.push((k.clone(), v.clone()));
    }
    if config.workdir.is_some() {
        base.cwd = config.workdir.clone();
    }
    if config.user.is_some() {
        base.user = config.user.clone();
    }
    base
}

/// `s` as one word of a POSIX shell command line.
fn shell_quote(s: &str) -> String {
    if !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_./=:@%+,".contains(c)) {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_dockerfile_config_goes_over_the_base_images() {
        let base = ExecDefaultsFile {
            env: vec![("PATH".into(), "/bin".into()), ("A".into(), "old".into())],
            cwd: Some("/base".into()),
            user: Some("root".into()),
        };
        let config = FinalConfig {
            env: vec![("A".into(), "new".into()), ("B".into(), "b".into())],
            workdir: Some("/app".into()),
            ..Default::default()
        };
        let m = merged(base, &config);
        assert_eq!(m.env, [("PATH".into(), "/bin".into()), ("A".into(), "new".into()), ("B".into(), "b".into())]);
        assert_eq!((m.cwd.as_deref(), m.user.as_deref()), (Some("/app"), Some("root")));
        assert_eq!(shell_quote("python3"), "python3");
        assert_eq!(shell_quote("it's a b"), "'it'\\''s a b'");
        assert_eq!(shell_quote(""), "''");
    }
}
