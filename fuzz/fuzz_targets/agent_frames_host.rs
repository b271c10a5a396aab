//! The host side of the agent protocol: what the host reads from a guest it does not
//! trust. `AgentClient` is driven over an in-memory stream whose read side is the fuzz
//! input (the agent's replies) and whose write side is discarded.
//!
//! The first input byte picks the conversation (`% 16`): the client's `ping`, `exec`
//! (with and without stdin), `read_file`, `write_file`, `list`, `stat`, `mkdir`,
//! `remove`, `eval`, `identity`, `shutdown`, (12) a raw loop of `read_frame` decoding
//! each frame's payload as the host would (`Response`, `ProtocolError`, the vector-check
//! report the host parses from the agent's output), (13) a `watch` read to its end, (14)
//! a background process's attachment read to its end, or (15) `proc_start`, `proc_list`
//! and `proc_input` on the same replies.
//! The rest is the byte stream.
//!
//! Checked: `read_file` reports exactly the bytes it delivered to the sink, and `exec`
//! collects exactly the `Stdout`/`Stderr` frames the stream held before its `Exit`.

#![no_main]

use forkvm_proto::vector_check::VectorCheckReport;
use forkvm_proto::{
    read_frame, AgentClient, ExecRequest, FrameKind, IdentityRequest, IdleLimit, MkdirRequest, ProcAttachRequest,
    ProcNews, ProcStartRequest, ProtocolError, Response, WatchMessage, WatchRequest, WriteFileRequest,
};
use libfuzzer_sys::fuzz_target;
use std::io::{self, Cursor, Read, Write};
use std::sync::Arc;

/// The agent's side of one connection: replies from the input, requests discarded.
struct Peer {
    replies: Cursor<Arc<[u8]>>,
}

impl Read for Peer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.replies.read(buf)
    }
}

/// In memory, nothing ever waits.
impl IdleLimit for Peer {
    fn set_idle_limit(&self, _: std::time::Duration) -> io::Result<()> {
        Ok(())
    }
}

impl Write for Peer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What `exec_collect` must have gathered: the output frames before the first other one.
fn expected_output(stream: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let mut r = stream;
    while let Ok(f) = read_frame(&mut r) {
        match f.kind {
            FrameKind::Stdout => out.extend_from_slice(&f.payload),
            FrameKind::Stderr => err.extend_from_slice(&f.payload),
            _ => break,
        }
    }
    (out, err)
}

fuzz_target!(|data: &[u8]| {
    let Some((&which, stream)) = data.split_first() else { return };
    let replies: Arc<[u8]> = stream.into();
    let r = replies.clone();
    let client = AgentClient::new(move || Ok(Peer { replies: Cursor::new(r.clone()) }));
    match which % 16 {
        0 => {
            let _ = client.ping();
        }
        1 => {
            if let Ok(out) = client.exec_collect(&ExecRequest::shell("true"), b"") {
                assert_eq!((out.stdout, out.stderr), expected_output(stream), "exec output differs from its frames");
            }
        }
        2 => {
            let _ = client.exec_collect(&ExecRequest::argv(["cat"]), b"stdin bytes");
        }
        3 => {
            let mut sink = Vec::new();
            if let Ok(n) = client.read_file("/etc/hostname", &mut sink) {
                assert_eq!(n, sink.len() as u64, "read_file counted other bytes than it delivered");
            }
        }
        4 => {
            let req = WriteFileRequest { path: "/tmp/x".into(), mode: None, create_parents: false, owner: None };
            let _ = client.write_file(&req, &mut &b"file bytes"[..]);
        }
        5 => {
            let _ = client.list("/");
        }
        6 => {
            let _ = client.stat("/");
        }
        7 => {
            let _ = client.mkdir(&MkdirRequest { path: "/tmp/d".into(), parents: true, mode: None, owner: None });
        }
        8 => {
            let _ = client.remove("/tmp/d", true);
        }
        9 => {
            let _ = client.eval("1 + 1");
        }
        10 => {
            let req = IdentityRequest {
                sandbox_id: "sb".into(),
                hostname: "h".into(),
                wall_clock_unix_ns: 1,
                entropy: vec![1, 2, 3],
                interpreter_seed: vec![4, 5, 6, 7],
            };
            let _ = client.identity(&req);
        }
        11 => {
            let _ = client.shutdown();
        }
        13 => {
            if let Ok((mut watch, _)) = client.watch(&WatchRequest { path: "/tmp".into(), recursive: true }) {
                // Each message is at least one frame header: the input bounds the loop.
                while let Ok(Some(_)) = watch.recv() {}
                let _ = watch.stop();
            }
        }
        14 => {
            if let Ok(mut attached) = client.proc_attach(&ProcAttachRequest { pid: 7, offset: None, follow: true }) {
                // Each event is at least one frame header: the input bounds the loop.
                while let Ok(Some(_)) = attached.recv() {}
            }
        }
        15 => {
            let req = ProcStartRequest::shell("true");
            let _ = client.proc_start(&req);
            let _ = client.proc_list();
            let _ = client.proc_input(7, &mut &b"x"[..], true);
        }
        _ => {
            let mut r: &[u8] = stream;
            while let Ok(frame) = read_frame(&mut r) {
                let _ = frame.json::<Response>();
                let _ = frame.json::<ProtocolError>();
                let _ = frame.json::<WatchMessage>();
                let _ = frame.json::<ProcNews>();
                let _ = serde_json::from_slice::<VectorCheckReport>(&frame.payload);
            }
        }
    }
});
