//! Background processes (`/v1/sandboxes/{id}/processes*`): start, list, read the output
//! from an offset (following it as it comes), input, signals and terminal resizes.

use crate::client::{collect, decode, encode_json, Client};
use crate::encode::Target;
use crate::error::ClientError;
use crate::transport;
use forkvm_api::{
    ProcessInfo, ProcessInputWritten, ProcessOutputEvent, SignalProcessRequest, StartProcessRequest, TerminalSize,
};
use hyper::Method;
use std::io::Read;

/// Largest reply to a call that answers a small JSON object.
const REPLY_LIMIT: usize = 1 << 20;

fn processes(id: &str) -> Result<Target, ClientError> {
    Ok(Target::new("/v1/sandboxes").segment("sandbox id", id)?.push("/processes"))
}

pub(crate) fn process(id: &str, pid: u32, suffix: &'static str) -> Result<Target, ClientError> {
    Ok(processes(id)?.segment("pid", &pid.to_string())?.push(suffix))
}

impl Client {
    /// `GET /v1/sandboxes/{id}/processes`: running and ended ones.
    pub fn list_processes(&self, id: &str) -> Result<Vec<ProcessInfo>, ClientError> {
        self.call_json(Method::GET, &processes(id)?.build(), None::<&()>, "processes")
    }

    /// `POST /v1/sandboxes/{id}/processes`: the process, once it runs.
    pub fn start_process(&self, id: &str, req: &StartProcessRequest) -> Result<ProcessInfo, ClientError> {
        self.call_json(Method::POST, &processes(id)?.build(), Some(req), "started process")
    }

    /// `GET /v1/sandboxes/{id}/processes/{pid}/output?offset=&follow=`: hands
    /// `on_event` each line (`from` first) until it returns `false` or the `end` line,
    /// which is returned (`None`: the caller stopped). An `error` line is
    /// [`ClientError::Stream`]; a body that stops without either is
    /// [`ClientError::Truncated`].
    pub fn process_output(
        &self,
        id: &str,
        pid: u32,
        offset: Option<u64>,
        follow: bool,
        mut on_event: impl FnMut(&ProcessOutputEvent) -> bool,
    ) -> Result<Option<ProcessInfo>, ClientError> {
        let mut target = process(id, pid, "/output")?;
        if let Some(o) = offset {
            target = target.query("offset", &o.to_string());
        }
        if follow {
            target = target.query("follow", "true");
        }
        let target = target.build();
        let what = "process output line";
        self.read_lines(Method::GET, &target, transport::empty(), None, what, |event| match event {
            ProcessOutputEvent::Error { error } => Err(ClientError::Stream { message: error }),
            ProcessOutputEvent::End { process } => Ok(Some(Some(process))),
            // Stopped by the caller: the process runs on.
            event => Ok((!on_event(&event)).then_some(None)),
        })
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/input?close=`: `src` to its stdin
    /// (streamed), then closes it if asked; the bytes it took.
    pub fn process_input(&self, id: &str, pid: u32, src: &mut dyn Read, close: bool) -> Result<u64, ClientError> {
        let mut target = process(id, pid, "/input")?;
        if close {
            target = target.query("close", "true");
        }
        let reply = self.upload(Method::POST, &target.build(), "application/octet-stream", src, REPLY_LIMIT)?;
        decode::<ProcessInputWritten>(&reply, "process input reply").map(|w| w.bytes)
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/signal`: to its process group.
    pub fn signal_process(&self, id: &str, pid: u32, signal: i32) -> Result<(), ClientError> {
        self.post_no_reply(&process(id, pid, "/signal")?.build(), &SignalProcessRequest { signal })
    }

    /// `POST /v1/sandboxes/{id}/processes/{pid}/resize`: its terminal's new size.
    pub fn resize_process(&self, id: &str, pid: u32, size: TerminalSize) -> Result<(), ClientError> {
        self.post_no_reply(&process(id, pid, "/resize")?.build(), &size)
    }

    /// A POST of JSON whose reply (204) has no body.
    fn post_no_reply(&self, target: &str, body: &impl serde::Serialize) -> Result<(), ClientError> {
        let body = transport::full(encode_json(body)?);
        self.block_on(async {
            let resp = self.send(Method::POST, target, body, Some("application/json")).await?;
            collect(resp.into_body(), REPLY_LIMIT, &format!("POST {target}")).await.map(drop)
        })
    }
}
