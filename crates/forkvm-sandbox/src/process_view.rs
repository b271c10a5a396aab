//! The API's background processes ([`forkvm_api::processes`]) in terms of the agent's
//! (`forkvm_proto::procs`), so that the daemon's routes and the CLI's local backend
//! check a start the same way and say what a process wrote the same way.

use base64::Engine;
use forkvm_api::{ProcessExit, ProcessInfo, ProcessOutputEvent, StartProcessRequest, TerminalSize};
use forkvm_proto::procs::{MAX_RING_BYTES, MAX_TAG};
use forkvm_proto::{ClientError, Command, ProcAttachment, ProcEvent, ProcInfo, ProcStartRequest, PtySize};
use std::io::{Read, Write};

use crate::exec_view::{exit_code, BadExecRequest, MAX_TIMEOUT_SECS};

/// The agent's start request for an API one; the error names the field that is wrong.
pub fn agent_request(req: &StartProcessRequest) -> Result<ProcStartRequest, BadExecRequest> {
    let bad = |m: String| Err(BadExecRequest::new(m));
    let command = match (&req.cmd, req.args.is_empty()) {
        (Some(_), false) => return bad("give either args or cmd, not both".into()),
        (Some(c), true) if c.trim().is_empty() => return bad("cmd is empty".into()),
        (Some(c), true) => Command::Shell(c.clone()),
        (None, true) => return bad("args is empty (give args or cmd)".into()),
        (None, false) if req.args[0].is_empty() => return bad("args[0] is empty".into()),
        (None, false) => Command::Argv(req.args.clone()),
    };
    if let Some(t) = req.timeout_secs.filter(|t| !(1..=MAX_TIMEOUT_SECS).contains(t)) {
        return bad(format!("timeout_secs must be between 1 and {MAX_TIMEOUT_SECS}, got {t}"));
    }
    if let Some(n) = req.ring_bytes.filter(|n| !(1..=MAX_RING_BYTES).contains(n)) {
        return bad(format!("ring_bytes must be between 1 and {MAX_RING_BYTES}, got {n}"));
    }
    if req.tag.as_ref().is_some_and(|t| t.len() > MAX_TAG) {
        return bad(format!("tag is longer than {MAX_TAG} bytes"));
    }
    let pty = req.pty.map(pty_size);
    if let Some(size) = pty.filter(|s| !s.is_valid()) {
        return bad(format!("pty {}x{}: rows and cols must be between 1 and 1000", size.rows, size.cols));
    }
    Ok(ProcStartRequest {
        command,
        env: req.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        cwd: req.cwd.clone(),
        user: req.user.clone(),
        pty,
        tag: req.tag.clone(),
        ring_bytes: req.ring_bytes,
        timeout_ms: req.timeout_secs.map(|t| t * 1000),
    })
}

/// Why `e` failed when the sandbox's agent is older than background processes (it
/// rejects their requests as frames it does not know): the snapshot was made before.
pub fn agent_too_old(id: &str, e: &ClientError) -> Option<String> {
    match e {
        ClientError::Rejected(p) => Some(format!(
            "sandbox {id}: its agent predates background processes ({}): make its snapshot again",
            p.message
        )),
        _ => None,
    }
}

/// The agent's terminal size for the API's.
pub fn pty_size(s: TerminalSize) -> PtySize {
    PtySize { rows: s.rows, cols: s.cols }
}

/// The API's view of one of the agent's processes.
pub fn info(p: ProcInfo) -> ProcessInfo {
    ProcessInfo {
        pid: p.pid,
        argv: p.argv,
        tag: p.tag,
        pty: p.pty.map(|s| TerminalSize { rows: s.rows, cols: s.cols }),
        started_at_unix_ms: p.started_at_unix_ms,
        output_end: p.output_end,
        output_start: p.output_start,
        stdin_open: p.stdin_open,
        running: p.exit.is_none(),
        exit: p.exit.map(|st| ProcessExit {
            exit_code: exit_code(&st),
            signal: st.signal,
            timed_out: st.timed_out,
            duration_ms: st.duration_ms,
        }),
    }
}

/// Hands `on_event` an attachment's lines, `from` first, until it returns `false` (the
/// attachment is dropped: the process runs on) or the attachment ends (its `end` line
/// was the last handed over).
pub fn relay<S: Read + Write>(
    mut attachment: ProcAttachment<S>,
    on_event: &mut dyn FnMut(ProcessOutputEvent) -> bool,
) -> Result<(), ClientError> {
    let mut offset = 0;
    while let Some(event) = attachment.recv()? {
        let (line, last) = match event {
            ProcEvent::From { offset: at, skipped } => {
                offset = at;
                (ProcessOutputEvent::From { offset: at, skipped }, false)
            }
            ProcEvent::Stdout(b) => (output("stdout", &mut offset, &b), false),
            ProcEvent::Stderr(b) => (output("stderr", &mut offset, &b), false),
            ProcEvent::Keepalive => (ProcessOutputEvent::Keepalive, false),
            ProcEvent::End(p) => (ProcessOutputEvent::End { process: info(p) }, true),
        };
        if !on_event(line) || last {
            return Ok(());
        }
    }
    Ok(())
}

fn output(stream: &str, offset: &mut u64, bytes: &[u8]) -> ProcessOutputEvent {
    let at = *offset;
    *offset += bytes.len() as u64;
    let data = base64::engine::general_purpose::STANDARD.encode(bytes);
    ProcessOutputEvent::Output { stream: stream.into(), offset: at, data }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(args: &[&str], cmd: Option<&str>) -> StartProcessRequest {
        StartProcessRequest {
            args: args.iter().map(|s| s.to_string()).collect(),
            cmd: cmd.map(String::from),
            ..StartProcessRequest::default()
        }
    }

    #[test]
    fn a_start_names_what_is_wrong_with_it() {
        let err = |r: StartProcessRequest| agent_request(&r).unwrap_err().to_string();
        assert!(err(req(&[], None)).contains("args is empty"));
        assert!(err(req(&["ls"], Some("ls"))).contains("not both"));
        assert!(err(StartProcessRequest { timeout_secs: Some(0), ..req(&["ls"], None) }).contains("timeout_secs"));
        assert!(err(StartProcessRequest { ring_bytes: Some(1 << 40), ..req(&["ls"], None) }).contains("ring_bytes"));
        let wide = Some(TerminalSize { rows: 24, cols: 0 });
        assert!(err(StartProcessRequest { pty: wide, ..req(&["sh"], None) }).contains("pty 24x0"));
        assert!(err(StartProcessRequest { tag: Some("x".repeat(200)), ..req(&["ls"], None) }).contains("tag"));
        let ok = agent_request(&StartProcessRequest { timeout_secs: Some(5), ..req(&[], Some("echo hi")) }).unwrap();
        assert_eq!((ok.command, ok.timeout_ms), (Command::Shell("echo hi".into()), Some(5000)));
    }

    #[test]
    fn an_agent_older_than_background_processes_is_named_so() {
        let rejected = ClientError::Rejected(forkvm_proto::ProtocolError {
            code: forkvm_proto::ProtocolErrorCode::Malformed,
            message: "unknown variant `proc_start`".into(),
            agent_protocol_version: 1,
        });
        let said = agent_too_old("sb", &rejected).unwrap();
        assert!(said.contains("predates background processes") && said.contains("proc_start"), "{said}");
        let other = ClientError::Unexpected { step: "proc_list", got: "Done".into() };
        assert_eq!(agent_too_old("sb", &other), None);
    }

    #[test]
    fn output_lines_carry_their_offsets_in_base64() {
        let mut offset = 10;
        let line = output("stdout", &mut offset, b"hi");
        assert_eq!(offset, 12);
        assert_eq!(
            serde_json::to_string(&line).unwrap(),
            r#"{"type":"output","stream":"stdout","offset":10,"data":"aGk="}"#
        );
    }
}
