//! Background processes through the real agent binary: started, listed, attached to
//! from an offset (again after a detach), fed input, signalled, resized on a terminal,
//! bounded rings and tables, bad requests refused.

mod common;

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::TestAgent;
use forkvm_proto::{
    AgentClient, ClientError, Command, ErrorKind, ProcAttachRequest, ProcEvent, ProcInfo, ProcStartRequest, PtySize,
};

fn start(command: Command) -> ProcStartRequest {
    ProcStartRequest::new(command)
}

fn shell(script: &str) -> ProcStartRequest {
    ProcStartRequest::shell(script)
}

/// Everything an attachment from `offset` brings until its end: (stdout, stderr, the
/// first `From`, the end).
fn read_all(
    client: &AgentClient<UnixStream>,
    pid: u32,
    offset: Option<u64>,
    follow: bool,
) -> (String, String, (u64, u64), ProcInfo) {
    let mut a = client.proc_attach(&ProcAttachRequest { pid, offset, follow }).unwrap();
    let (mut out, mut err, mut from) = (Vec::new(), Vec::new(), None);
    loop {
        match a.recv().unwrap().expect("an end") {
            ProcEvent::From { offset, skipped } => {
                from.get_or_insert((offset, skipped));
            }
            ProcEvent::Stdout(b) => out.extend(b),
            ProcEvent::Stderr(b) => err.extend(b),
            ProcEvent::Keepalive => {}
            ProcEvent::End(info) => {
                let text = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
                return (text(out), text(err), from.expect("a first From"), info);
            }
        }
    }
}

fn wait_ended(client: &AgentClient<UnixStream>, pid: u32) -> ProcInfo {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = client.proc_list().unwrap().into_iter().find(|p| p.pid == pid).expect("listed");
        if info.exit.is_some() {
            return info;
        }
        assert!(Instant::now() < deadline, "process {pid} still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_process_outlives_its_attachments_and_is_read_again_from_any_offset() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let mut req = shell("echo one; echo err >&2; read line; echo \"got $line\"; exit 4");
    req.tag = Some("job".into());
    let info = client.proc_start(&req).unwrap();
    assert_eq!(info.argv, ["/bin/sh", "-c", "echo one; echo err >&2; read line; echo \"got $line\"; exit 4"]);
    assert_eq!((info.tag.as_deref(), info.exit.as_ref(), info.stdin_open), (Some("job"), None, true));

    // Attached, then detached while it waits for input: it runs on.
    let mut a = client.proc_attach(&ProcAttachRequest { pid: info.pid, offset: None, follow: true }).unwrap();
    assert_eq!(a.recv().unwrap(), Some(ProcEvent::From { offset: 0, skipped: 0 }));
    let mut seen = Vec::new();
    while seen.len() < 8 {
        match a.recv().unwrap().unwrap() {
            ProcEvent::Stdout(b) | ProcEvent::Stderr(b) => seen.extend(b),
            other => panic!("{other:?}"),
        }
    }
    drop(a);
    let listed = client.proc_list().unwrap();
    assert!(listed.iter().any(|p| p.pid == info.pid && p.exit.is_none()), "{listed:?}");

    // Input from another connection, with the end of input.
    assert_eq!(client.proc_input(info.pid, &mut &b"hello\n"[..], true).unwrap(), 6);
    let ended = wait_ended(&client, info.pid);
    assert_eq!(ended.exit.as_ref().unwrap().code, Some(4));
    assert!(!ended.stdin_open);

    let (out, err, from, end) = read_all(&client, info.pid, None, true);
    assert_eq!((out.as_str(), err.as_str(), from), ("one\ngot hello\n", "err\n", (0, 0)));
    assert_eq!(end.output_end, 18);
    // From an offset: the bytes after it.
    let (out, err, from, _) = read_all(&client, info.pid, Some(4), false);
    assert_eq!(format!("{out}{err}").len(), 14);
    assert_eq!(from, (4, 0));
    let e = client.proc_attach(&ProcAttachRequest { pid: info.pid, offset: Some(19), follow: false }).unwrap_err();
    assert!(matches!(&e, ClientError::Agent(a) if a.kind == ErrorKind::InvalidInput), "{e}");
}

#[test]
fn a_follower_sees_output_as_it_comes_and_input_on_its_own_connection() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let info = client.proc_start(&shell("while read l; do echo \"<$l>\"; done; echo bye")).unwrap();
    let mut a = client.proc_attach(&ProcAttachRequest { pid: info.pid, offset: None, follow: true }).unwrap();
    let mut input = a.input().unwrap();
    assert!(matches!(a.recv().unwrap(), Some(ProcEvent::From { offset: 0, .. })));
    let mut out = Vec::new();
    for word in ["a", "b"] {
        input.send(format!("{word}\n").as_bytes()).unwrap();
        while !String::from_utf8_lossy(&out).contains(&format!("<{word}>")) {
            match a.recv().unwrap().unwrap() {
                ProcEvent::Stdout(b) => out.extend(b),
                other => panic!("{other:?}"),
            }
        }
    }
    input.close_stdin().unwrap();
    loop {
        match a.recv().unwrap().unwrap() {
            ProcEvent::Stdout(b) => out.extend(b),
            ProcEvent::End(info) => {
                assert_eq!(info.exit.unwrap().code, Some(0));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(String::from_utf8_lossy(&out), "<a>\n<b>\nbye\n");
}

#[test]
fn a_terminal_process_has_a_controlling_terminal_of_its_size_and_takes_resizes() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let mut req = shell("tty; stty size; read x; stty size; echo \"[$x]\"");
    req.pty = Some(PtySize { rows: 24, cols: 80 });
    let info = client.proc_start(&req).unwrap();
    assert_eq!(info.pty, Some(PtySize { rows: 24, cols: 80 }));
    let mut a = client.proc_attach(&ProcAttachRequest { pid: info.pid, offset: None, follow: true }).unwrap();
    let mut input = a.input().unwrap();
    let mut out = String::new();
    while !out.contains("24 80") {
        match a.recv().unwrap().unwrap() {
            ProcEvent::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
            ProcEvent::From { .. } => {}
            other => panic!("{other:?} after {out:?}"),
        }
    }
    assert!(out.starts_with("/dev/pts/"), "{out:?}");
    input.resize(PtySize { rows: 50, cols: 132 }).unwrap();
    // The resize is in before the line that lets the shell go on.
    std::thread::sleep(Duration::from_millis(100));
    input.send(b"typed\r").unwrap();
    let end = loop {
        match a.recv().unwrap().unwrap() {
            ProcEvent::Stdout(b) => out.push_str(&String::from_utf8_lossy(&b)),
            ProcEvent::End(info) => break info,
            other => panic!("{other:?}"),
        }
    };
    assert!(out.contains("50 132\r\n[typed]\r\n"), "{out:?}");
    assert_eq!(end.pty, Some(PtySize { rows: 50, cols: 132 }));
    assert_eq!(end.exit.unwrap().code, Some(0));
    let e = client.proc_resize(end.pid, PtySize { rows: 0, cols: 80 }).unwrap_err();
    assert!(matches!(&e, ClientError::Agent(a) if a.kind == ErrorKind::InvalidInput), "{e}");
}

#[test]
fn signals_and_timeouts_end_background_processes() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let info = client.proc_start(&shell("sleep 30 & wait")).unwrap();
    client.signal(info.pid, 15).unwrap();
    let ended = wait_ended(&client, info.pid);
    assert_eq!(ended.exit.unwrap().signal, Some(15));
    let mut req = shell("sleep 30");
    req.timeout_ms = Some(200);
    let info = client.proc_start(&req).unwrap();
    let exit = wait_ended(&client, info.pid).exit.unwrap();
    assert!(exit.timed_out && exit.signal == Some(9), "{exit:?}");
    // An ended process takes no signal or input.
    assert!(client.signal(info.pid, 15).is_err());
    let e = client.proc_input(info.pid, &mut &b"x"[..], false).unwrap_err();
    assert!(matches!(&e, ClientError::Agent(_)), "{e}");
}

#[test]
fn a_ring_keeps_the_last_bytes_and_says_what_was_skipped() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let mut req = shell("i=0; while [ $i -lt 100 ]; do echo line$i; i=$((i+1)); done");
    req.ring_bytes = Some(64);
    let info = client.proc_start(&req).unwrap();
    let ended = wait_ended(&client, info.pid);
    let total: u64 = (0..100).map(|i| format!("line{i}\n").len() as u64).sum();
    assert_eq!((ended.output_start, ended.output_end), (total - 64, total));
    let (out, _, from, _) = read_all(&client, info.pid, Some(0), false);
    assert_eq!(from, (total - 64, total - 64));
    assert!(out.ends_with("line98\nline99\n") && out.len() == 64, "{out:?}");
}

#[test]
fn bad_requests_are_refused_and_the_table_is_bounded() {
    let agent = TestAgent::start_with(&[]);
    let client = agent.client();
    let refused = |req: ProcStartRequest| {
        let e = client.proc_start(&req).unwrap_err();
        assert!(matches!(&e, ClientError::Agent(_)), "{e}");
        e.to_string()
    };
    let mut req = shell("true");
    req.ring_bytes = Some(0);
    assert!(refused(req).contains("ring_bytes"));
    let mut req = shell("true");
    req.ring_bytes = Some(1 << 30);
    assert!(refused(req).contains("ring_bytes"));
    let mut req = shell("true");
    req.pty = Some(PtySize { rows: 24, cols: 0 });
    assert!(refused(req).contains("terminal"));
    assert!(refused(start(Command::Argv(vec!["/no/such/program".into()]))).contains("spawning"));
    assert!(client.proc_attach(&ProcAttachRequest { pid: 999_999, offset: None, follow: false }).is_err());
    assert!(client.proc_input(999_999, &mut &b"x"[..], false).is_err());

    // 64 running fill the table; one ending makes room again.
    let running: Vec<u32> = (0..64).map(|_| client.proc_start(&shell("sleep 30")).unwrap().pid).collect();
    assert!(refused(shell("true")).contains("64 background processes"));
    client.signal(running[0], 9).unwrap();
    wait_ended(&client, running[0]);
    let next = client.proc_start(&shell("true")).unwrap();
    let listed = client.proc_list().unwrap();
    assert_eq!(listed.len(), 64);
    assert!(listed.iter().any(|p| p.pid == next.pid) && !listed.iter().any(|p| p.pid == running[0]));
    for pid in &running[1..] {
        client.signal(*pid, 9).unwrap();
    }
}
