//! The unpack of an image's layers, run as root of the build's user namespace.
//!
//! Layers are untrusted archives: applying them is the one part of an image build that
//! interprets an image's bytes on the host. It runs in a process of its own, forkvm
//! re-executed as `forkvm __oci-unpack` under `rootfs::userns::run_confined`, so even a
//! bug in [`super::apply`] could write only what the build's unprivileged id range may:
//! the build directory. The parent streams the layer blobs to it on stdin (the blob
//! store is not readable by that range), each as a little-endian u64 length and the
//! bytes; the helper unpacks into `/tmp/root` (the build directory, as the namespace sees
//! it) and leaves its counts in `/tmp/unpack.json`.

use super::apply::{apply_layer, ApplyStats};
use crate::rootfs::userns::{pipe, run_confined, IdRange, BUILD_DIR};
use crate::rootfs::RootfsError;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The first argument that makes forkvm this helper (see [`helper_main`]).
pub const HELPER_ARG: &str = "__oci-unpack";

/// The helper's side: reads framed layers from stdin and applies them, lowest first,
/// onto `<BUILD_DIR>/root`; writes the counts to `<BUILD_DIR>/unpack.json`. Returns the
/// process's exit code (the error is on stderr, which the build's log keeps).
pub fn helper_main() -> i32 {
    // Only ever the child `unpack_confined` starts: root of a user namespace mapped onto
    // an id range. Run by hand on the host it would unpack into the host's /tmp.
    let map = std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default();
    let identity = map.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"];
    if identity || map.is_empty() {
        eprintln!("{HELPER_ARG}: runs only inside an image build's user namespace");
        return 2;
    }
    match unpack_stdin(&Path::new(BUILD_DIR).join("root")) {
        Ok(stats) => {
            let json = serde_json::to_vec(&stats).unwrap_or_default();
            match std::fs::write(Path::new(BUILD_DIR).join("unpack.json"), json) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("writing the unpack counts: {e}");
                    1
                }
            }
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn unpack_stdin(root: &Path) -> Result<ApplyStats, String> {
    std::fs::create_dir(root).map_err(|e| format!("creating {}: {e}", root.display()))?;
    let dir = std::fs::File::open(root).map_err(|e| format!("opening {}: {e}", root.display()))?;
    let mut stdin = std::io::stdin().lock();
    let mut total = ApplyStats::default();
    let mut budget = super::MAX_IMAGE_BYTES;
    for n in 1.. {
        let mut len = [0u8; 8];
        match stdin.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => return Err(format!("reading layer {n}'s length: {e}")),
        }
        let mut layer = (&mut stdin).take(u64::from_le_bytes(len));
        let stats = apply_layer(&dir, &mut layer, &mut budget).map_err(|e| format!("layer {n}: {e}"))?;
        // What follows the tar's end-of-archive blocks (padding) is not the next layer.
        std::io::copy(&mut layer, &mut std::io::sink()).map_err(|e| format!("reading layer {n}: {e}"))?;
        total.add(&stats);
    }
    Ok(total)
}

/// The parent's side: unpacks `layers` (blob files, lowest first) into
/// `<build_dir>/root` through the helper `exe`, confined to `ids`; the helper's output
/// goes to `log`.
pub fn unpack_confined(
    exe: &Path,
    layers: &[PathBuf],
    ids: IdRange,
    build_dir: &Path,
    log: &Path,
) -> Result<ApplyStats, RootfsError> {
    let step = "unpacking the image's layers";
    let spawn_err = |source: std::io::Error| RootfsError::Spawn { step: step.into(), source };
    let (read, write) = pipe().map_err(spawn_err)?;
    let mut cmd = Command::new(exe);
    cmd.arg(HELPER_ARG).stdin(Stdio::from(read));
    let files: Vec<PathBuf> = layers.to_vec();
    let feeder = std::thread::spawn(move || -> std::io::Result<()> {
        let mut out = std::fs::File::from(write);
        for path in files {
            let mut blob = std::fs::File::open(&path)?;
            out.write_all(&blob.metadata()?.len().to_le_bytes())?;
            std::io::copy(&mut blob, &mut out)?;
        }
        Ok(())
    });
    let ran = run_confined(step, &mut cmd, ids, build_dir, log);
    // Dropping `cmd` closes our copy of the read end, so a feeder blocked on a helper
    // that died sees EPIPE rather than waiting forever.
    drop(cmd);
    let fed = feeder.join().unwrap_or_else(|_| Err(std::io::Error::other("the layer feeder panicked")));
    ran?;
    fed.map_err(|source| RootfsError::Stage { dir: build_dir.into(), step: "streaming the layers".into(), source })?;
    // The helper's file, read as host root: never through a link, never a FIFO, bounded.
    let counts = build_dir.join("unpack.json");
    let read_err =
        |source| RootfsError::Stage { dir: build_dir.into(), step: "reading the unpack counts".into(), source };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&counts)
        .map_err(read_err)?;
    if !file.metadata().map_err(read_err)?.is_file() {
        return Err(read_err(std::io::Error::other("not a regular file")));
    }
    let mut text = Vec::new();
    file.take(1 << 16).read_to_end(&mut text).map_err(read_err)?;
    serde_json::from_slice(&text).map_err(|e| RootfsError::Stage {
        dir: build_dir.into(),
        step: "reading the unpack counts".into(),
        source: std::io::Error::other(e),
    })
}
