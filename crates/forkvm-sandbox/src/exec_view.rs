//! The API's exec ([`forkvm_api::ExecRequest`], its exit code) in terms of the agent's,
//! so that the daemon's routes and the CLI's local backend run a command the same way
//! and report its end the same way (forkd's `exit_code`).

use forkvm_api::ExecRequest;
use forkvm_proto::{ClientError, Command, ErrorKind, ExitStatus};

/// Longest exec timeout accepted (a day).
pub const MAX_TIMEOUT_SECS: u64 = 86_400;

/// An exec request the agent cannot be given; the message says which field is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadExecRequest(String);

impl BadExecRequest {
    pub fn new(message: impl Into<String>) -> BadExecRequest {
        BadExecRequest(message.into())
    }

    pub fn code(&self) -> forkvm_api::ErrorCode {
        forkvm_api::ErrorCode::BadRequest
    }
}

/// The agent's exec request for an API exec request (`args` or `cmd`, a timeout of 1 s
/// to a day). The request's `stdin` is the caller's to stream.
pub fn agent_request(req: &ExecRequest) -> Result<forkvm_proto::ExecRequest, BadExecRequest> {
    let bad = |m: &str| Err(BadExecRequest(m.to_string()));
    let command = match (&req.cmd, req.args.is_empty()) {
        (Some(_), false) => return bad("give either args or cmd, not both"),
        (Some(c), true) if c.trim().is_empty() => return bad("cmd is empty"),
        (Some(c), true) => Command::Shell(c.clone()),
        (None, true) => return bad("args is empty (give args or cmd)"),
        (None, false) if req.args[0].is_empty() => return bad("args[0] is empty"),
        (None, false) => Command::Argv(req.args.clone()),
    };
    if req.timeout_secs == 0 || req.timeout_secs > MAX_TIMEOUT_SECS {
        return Err(BadExecRequest(format!(
            "timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}, got {}",
            req.timeout_secs
        )));
    }
    Ok(forkvm_proto::ExecRequest {
        command,
        env: req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cwd: req.cwd.clone(),
        stdin: false,
        timeout_ms: Some(req.timeout_secs * 1000),
        user: None,
        report_start: false,
    })
}

/// forkd's `exit_code` for how a process ended: its code, else 128 + signal, else 124
/// for a timeout (as `timeout(1)`).
pub fn exit_code(st: &ExitStatus) -> i32 {
    match (st.code, st.signal) {
        _ if st.timed_out => 124,
        (Some(c), _) => c,
        (None, Some(sig)) => 128 + sig,
        (None, None) => -1,
    }
}

/// A program that could not be started (missing, not executable) ends like it would in a
/// shell: 127 or 126, with the reason for stderr. Any other failure is the caller's.
pub fn not_started(e: &ClientError) -> Option<(i32, String)> {
    match e {
        ClientError::Agent(a) if a.kind == ErrorKind::NotFound => Some((127, format!("{}\n", a.message))),
        ClientError::Agent(a) if a.kind == ErrorKind::PermissionDenied => Some((126, format!("{}\n", a.message))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str], cmd: Option<&str>, timeout_secs: u64) -> ExecRequest {
        ExecRequest {
            args: args.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.map(String::from),
            timeout_secs,
            ..ExecRequest::default()
        }
    }

    #[test]
    fn requests_are_checked_field_by_field() {
        assert!(matches!(agent_request(&req(&["ls"], None, 30)).unwrap().command, Command::Argv(_)));
        assert!(matches!(agent_request(&req(&[], Some("ls | wc"), 30)).unwrap().command, Command::Shell(_)));
        assert_eq!(agent_request(&req(&["ls"], None, 30)).unwrap().timeout_ms, Some(30_000));
        for (bad, says) in [
            (req(&["ls"], Some("ls"), 30), "either args or cmd"),
            (req(&[], Some("  "), 30), "cmd is empty"),
            (req(&[], None, 30), "args is empty"),
            (req(&[""], None, 30), "args[0] is empty"),
            (req(&["ls"], None, 0), "timeout_secs"),
            (req(&["ls"], None, MAX_TIMEOUT_SECS + 1), "timeout_secs"),
        ] {
            let e = agent_request(&bad).unwrap_err();
            assert!(e.to_string().contains(says), "{e} should say {says}");
        }
    }

    #[test]
    fn exit_codes_follow_forkd() {
        let st = |code, signal, timed_out| ExitStatus { code, signal, timed_out, duration_ms: 0 };
        assert_eq!(exit_code(&st(Some(3), None, false)), 3);
        assert_eq!(exit_code(&st(None, Some(9), false)), 137);
        assert_eq!(exit_code(&st(None, Some(9), true)), 124);
        assert_eq!(exit_code(&st(None, None, false)), -1);
    }
}
