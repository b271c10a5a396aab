//! One build step in its sandbox: a RUN as an exec (streamed out as it prints), a COPY
//! or ADD as a tar stream the agent unpacks, a COPY --from as one from another
//! sandbox's agent ([`super::copy_from`]). Only the guest runs anything; the host
//! reads the build context and nothing else.

use super::BuildEvent;
use crate::chain_ops::ChainOpError;
use forkvm_image::dockerfile::context::{archive_reader, write_tar, CopySet};
use forkvm_image::dockerfile::Action;
use forkvm_proto::{AgentClient, ExecRequest, FileType, MkdirRequest, UntarRequest};
use std::os::unix::net::UnixStream;

/// How much of a step's output is kept for its error message.
const OUTPUT_TAIL: usize = 16 << 10;

/// Runs `work` with the agent of a sandbox of stage `index`'s result (COPY --from's
/// source), which is stopped after.
pub type StageSource<'a> = dyn Fn(usize, &mut dyn FnMut(&AgentClient<UnixStream>) -> Result<String, ChainOpError>) -> Result<String, ChainOpError>
    + 'a;

/// Runs `action` (step `n`, written `text`); returns what it printed (its tail).
pub fn run(
    client: &AgentClient<UnixStream>,
    n: u32,
    text: &str,
    action: &Action,
    stage: &StageSource<'_>,
    events: &mut dyn FnMut(BuildEvent),
) -> Result<String, ChainOpError> {
    match action {
        Action::Run { argv, env, cwd, user } => {
            make_dir(client, text, cwd.as_deref())?;
            let mut req = ExecRequest::argv(argv.clone());
            req.env = env.clone();
            req.cwd = cwd.clone();
            req.user = user.clone();
            exec(client, n, text, &req, events)
        }
        Action::Copy { set, dest, chown, chmod, cwd } => {
            make_dir(client, text, cwd.as_deref())?;
            copy(client, text, set, dest, chown.as_deref(), *chmod)
        }
        Action::CopyFrom { stage: index, paths, dest, chown, chmod, cwd } => {
            make_dir(client, text, cwd.as_deref())?;
            stage(*index, &mut |source| {
                super::copy_from::copy_from(client, source, text, paths, dest, chown.as_deref(), *chmod)
            })
        }
    }
}

/// Runs `req`, passing its output on as events; fails unless it exits 0.
pub(super) fn exec(
    client: &AgentClient<UnixStream>,
    n: u32,
    text: &str,
    req: &ExecRequest,
    events: &mut dyn FnMut(BuildEvent),
) -> Result<String, ChainOpError> {
    let tail = std::cell::RefCell::new(Vec::<u8>::new());
    let keep = |chunk: &[u8]| {
        let mut t = tail.borrow_mut();
        t.extend_from_slice(chunk);
        if t.len() > 2 * OUTPUT_TAIL {
            let cut = t.len() - OUTPUT_TAIL;
            t.drain(..cut);
        }
    };
    let events = std::cell::RefCell::new(events);
    let status = client
        .exec(
            req,
            None,
            &mut |c| {
                keep(c);
                (events.borrow_mut())(BuildEvent::Output { step: n, text: String::from_utf8_lossy(c).into_owned() })
            },
            &mut |c| {
                keep(c);
                (events.borrow_mut())(BuildEvent::Output { step: n, text: String::from_utf8_lossy(c).into_owned() })
            },
        )
        .map_err(|source| ChainOpError::Agent { step: text.to_string(), source })?;
    let output = String::from_utf8_lossy(&tail.into_inner()).into_owned();
    if status.code == Some(0) {
        Ok(output)
    } else {
        Err(ChainOpError::StepFailed { step: text.to_string(), outcome: crate::chain_ops::ended(&status), output })
    }
}

fn make_dir(client: &AgentClient<UnixStream>, text: &str, dir: Option<&str>) -> Result<(), ChainOpError> {
    let Some(dir) = dir else { return Ok(()) };
    client
        .mkdir(&MkdirRequest { path: dir.to_string(), parents: true, mode: None, owner: None })
        .map_err(|source| ChainOpError::Agent { step: format!("{text}: making {dir}"), source })
}

/// Puts `set` at `dest`: into it when it ends in `/` or is a directory in the guest,
/// else the single file becomes `dest`.
fn copy(
    client: &AgentClient<UnixStream>,
    text: &str,
    set: &CopySet,
    dest: &str,
    owner: Option<&str>,
    chmod: Option<u32>,
) -> Result<String, ChainOpError> {
    let into_dir =
        dest.ends_with('/') || !set.single_file || client.stat(dest).is_ok_and(|i| i.file_type == FileType::Dir);
    let (dir, rename) = if into_dir {
        (dest.trim_end_matches('/').to_string(), None)
    } else {
        let (parent, name) = dest.rsplit_once('/').unwrap_or(("", dest));
        (parent.to_string(), Some(name.to_string()))
    };
    let dir = if dir.is_empty() { "/".to_string() } else { dir };
    let req = UntarRequest { dir: dir.clone(), owner: owner.map(str::to_string) };
    let agent = |source| ChainOpError::Agent { step: format!("{text}: unpacking into {dir}"), source };
    let mut sent = 0;
    if !set.entries.is_empty() || set.archives.is_empty() {
        let (mut reader, writer) = std::io::pipe()
            .map_err(|e| ChainOpError::Work { step: text.to_string(), detail: format!("a pipe: {e}") })?;
        let set_for_writer = set.clone();
        // Buffered: every write to the pipe can become a frame, and every frame costs the
        // guest a receive (emulated on some hosts); a tar header alone is 512 bytes.
        let writer = std::thread::spawn(move || {
            let out = std::io::BufWriter::with_capacity(forkvm_proto::DATA_CHUNK, writer);
            write_tar(&set_for_writer, rename.as_deref(), chmod, out)
        });
        let result = client.untar(&req, &mut reader);
        drop(reader);
        let written = writer.join().unwrap_or_else(|_| Err(std::io::Error::other("the tar writer panicked")));
        let context = |e: std::io::Error| ChainOpError::Work {
            step: text.to_string(),
            detail: format!("reading the build context: {e}"),
        };
        // The root cause first: a context that failed (a file changed) cut the stream
        // short; an agent that failed stopped reading it (the writer's broken pipe).
        sent += match (result, written) {
            (_, Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => return Err(context(e)),
            (Err(source), _) => return Err(agent(source)),
            (Ok(_), Err(e)) => return Err(context(e)),
            (Ok(n), Ok(())) => n,
        };
    }
    for (archive, size, _) in &set.archives {
        let mut reader = archive_reader(archive, *size)
            .map_err(|e| ChainOpError::Work { step: text.to_string(), detail: format!("an ADD archive: {e}") })?;
        sent += client.untar(&req, &mut reader).map_err(agent)?;
    }
    Ok(format!("{} path(s) and {} archive(s) into {dir} ({sent} bytes)\n", set.entries.len(), set.archives.len()))
}
