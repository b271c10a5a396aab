//! `COPY --from=STAGE`: paths of an earlier stage's result into a step's sandbox. The
//! stage's result runs as a sandbox of its own beside the step's; each path goes from its
//! agent to the step's agent as one tar stream through the host, never landing on the
//! host's disk: a directory as the agent's `tar` (its entries relative to it, links kept
//! as links), a file as a one-entry archive made here around the agent's `read_file`.
//! The step's agent unpacks it confined to the destination (`untar`), as for COPY from
//! the context. With `--chmod`, a file's archive is made with that mode, and a
//! directory's stream has its modes rewritten on the way
//! ([`forkvm_image::dockerfile::tar_mode`]).

use crate::chain_ops::ChainOpError;
use forkvm_proto::{AgentClient, FileInfo, FileType, UntarRequest, DATA_CHUNK};
use std::io::{self, Write};
use std::os::unix::net::UnixStream;

/// Puts `paths` of `source` at `dest` in `target`: into it when it ends in `/`, when a
/// path is a directory, or when it is a directory in the target; else the one file
/// becomes `dest`. `mode`, when given, is every copied file's and directory's.
pub fn copy_from(
    target: &AgentClient<UnixStream>,
    source: &AgentClient<UnixStream>,
    text: &str,
    paths: &[String],
    dest: &str,
    owner: Option<&str>,
    mode: Option<u32>,
) -> Result<String, ChainOpError> {
    let work = |detail: String| ChainOpError::Work { step: text.to_string(), detail };
    let mut sent = 0;
    for path in paths {
        let trimmed = match path.trim_end_matches('/') {
            "" => "/",
            p => p,
        };
        let info = source.stat(trimmed).map_err(|e| work(format!("{path} in the stage: {e}")))?;
        let is_dir = info.file_type == FileType::Dir;
        if !is_dir && info.file_type != FileType::File {
            return Err(work(format!("{path} in the stage is neither a file nor a directory")));
        }
        if path.ends_with('/') && !is_dir {
            return Err(work(format!("{path} in the stage is not a directory")));
        }
        let into_dir = dest.ends_with('/') || is_dir || target.stat(dest).is_ok_and(|i| i.file_type == FileType::Dir);
        let (dir, name) = if into_dir {
            let file_name = trimmed.rsplit('/').next().unwrap_or(trimmed).to_string();
            (dest.trim_end_matches('/').to_string(), file_name)
        } else {
            let (parent, name) = dest.rsplit_once('/').unwrap_or(("", dest));
            (parent.to_string(), name.to_string())
        };
        let dir = if dir.is_empty() { "/".to_string() } else { dir };
        let req = UntarRequest { dir: dir.clone(), owner: owner.map(str::to_string) };
        let (unpacked, produced) = std::thread::scope(|scope| {
            let (mut reader, writer) = io::pipe().map_err(|e| work(format!("a pipe: {e}")))?;
            let producer = scope.spawn(move || -> io::Result<()> {
                let mut out = io::BufWriter::with_capacity(DATA_CHUNK, writer);
                match (is_dir, mode) {
                    (true, None) => {
                        source.tar(trimmed, &mut out).map_err(io::Error::other)?;
                    }
                    (true, Some(mode)) => remoded_tar(source, trimmed, mode, &mut out)?,
                    (false, _) => {
                        let mut info = info.clone();
                        if let Some(mode) = mode {
                            info.mode = mode;
                        }
                        one_file_archive(source, trimmed, &name, &info, &mut out)?;
                    }
                }
                out.flush()
            });
            let unpacked = target.untar(&req, &mut reader);
            drop(reader);
            let produced = producer.join().unwrap_or_else(|_| Err(io::Error::other("the stage's reader panicked")));
            Ok::<_, ChainOpError>((unpacked, produced))
        })?;
        // The root cause first: a stage that failed cut the stream short; an agent that
        // failed stopped reading it (the producer's broken pipe).
        sent += match (unpacked, produced) {
            (_, Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => {
                return Err(work(format!("reading {path} from the stage: {e}")))
            }
            (Err(source), _) => {
                return Err(ChainOpError::Agent { step: format!("{text}: unpacking into {dir}"), source })
            }
            (Ok(_), Err(e)) => return Err(work(format!("reading {path} from the stage: {e}"))),
            (Ok(n), Ok(())) => n,
        };
    }
    Ok(format!("{} path(s) from the stage into {dest} ({sent} bytes)\n", paths.len()))
}

/// The agent's tar stream of directory `path`, every file's and directory's mode made
/// `mode` on its way to `out`.
fn remoded_tar(source: &AgentClient<UnixStream>, path: &str, mode: u32, out: &mut dyn Write) -> io::Result<()> {
    std::thread::scope(|scope| {
        let (reader, writer) = io::pipe()?;
        let producer = scope.spawn(move || -> io::Result<()> {
            let mut w = io::BufWriter::with_capacity(DATA_CHUNK, writer);
            source.tar(path, &mut w).map_err(io::Error::other)?;
            w.flush()
        });
        let copied = forkvm_image::dockerfile::tar_mode::copy_with_mode(io::BufReader::new(reader), out, mode);
        // The reader is gone here: a producer still writing sees a broken pipe.
        let produced = producer.join().unwrap_or_else(|_| Err(io::Error::other("the stage's tar panicked")));
        match (copied, produced) {
            (_, Err(e)) if e.kind() != io::ErrorKind::BrokenPipe => Err(e),
            (Err(e), _) => Err(e),
            (Ok(_), Err(e)) => Err(e),
            (Ok(_), Ok(())) => Ok(()),
        }
    })
}

/// A tar archive of one regular file, `name`, with `info`'s size, mode and mtime, its
/// bytes streamed from `source` as they come.
fn one_file_archive(
    source: &AgentClient<UnixStream>,
    path: &str,
    name: &str,
    info: &FileInfo,
    out: &mut dyn Write,
) -> io::Result<()> {
    out.write_all(file_header(name, info)?.as_bytes())?;
    let n = source.read_file(path, out).map_err(io::Error::other)?;
    if n != info.size {
        return Err(io::Error::other(format!("{path} changed size while it was read ({} then {n} bytes)", info.size)));
    }
    out.write_all(&[0u8; 512][..padding(n)])?;
    out.write_all(&[0u8; 1024])
}

/// The tar header of a regular file `name` with `info`'s size, mode and mtime, owned by
/// root (the untar request's owner, if any, applies on top).
fn file_header(name: &str, info: &FileInfo) -> io::Result<tar::Header> {
    let mut header = tar::Header::new_gnu();
    header.set_path(name)?;
    header.set_entry_type(tar::EntryType::Regular);
    header.set_size(info.size);
    header.set_mode(info.mode & 0o7777);
    header.set_mtime(u64::try_from(info.mtime_unix_ns / 1_000_000_000).unwrap_or(0));
    header.set_uid(0);
    header.set_gid(0);
    header.set_cksum();
    Ok(header)
}

/// Zero bytes after `n` bytes of data, to the next 512-byte block.
fn padding(n: u64) -> usize {
    (512 - (n % 512) as usize) % 512
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_file_archive_reads_back_with_its_name_mode_and_bytes() {
        for size in [0u64, 3, 512, 513] {
            let info = FileInfo {
                name: "x".into(),
                file_type: FileType::File,
                size,
                mode: 0o104755,
                mtime_unix_ns: 1_700_000_000_123_000_000,
                owner: None,
                group: None,
                symlink_target: None,
            };
            let data: Vec<u8> = (0..size).map(|i| i as u8).collect();
            let mut bytes = file_header("tool", &info).unwrap().as_bytes().to_vec();
            bytes.extend_from_slice(&data);
            bytes.extend(std::iter::repeat_n(0u8, padding(size) + 1024));
            assert_eq!(bytes.len() % 512, 0);
            let mut archive = tar::Archive::new(bytes.as_slice());
            let mut entries = archive.entries().unwrap();
            let mut e = entries.next().unwrap().unwrap();
            let h = e.header().clone();
            assert_eq!((e.path().unwrap().display().to_string(), h.mode().unwrap()), ("tool".into(), 0o4755));
            assert_eq!(h.mtime().unwrap(), 1_700_000_000);
            let mut read = Vec::new();
            io::Read::read_to_end(&mut e, &mut read).unwrap();
            assert_eq!(read, data);
            drop(e);
            assert!(entries.next().is_none(), "one entry, then the end");
        }
    }
}
