//! Reading an exported data-disk image from the host, for the Linux-tier disk tests:
//! `e2fsck` replays its journal (a disk snapshot is a crash-consistent cut) and
//! `debugfs` reads files from it (the overlay's upper directory is `/upper` there).

use std::path::Path;
use std::process::Command;

/// Replays the journal of the ext4 image at `image` and checks it is sound.
pub fn fsck(image: &Path) {
    let out = Command::new("e2fsck").args(["-fy"]).arg(image).output().expect("e2fsck (e2fsprogs) runs");
    // 0: clean; 1: errors corrected (the journal replayed). Anything else is damage.
    assert!(
        matches!(out.status.code(), Some(0 | 1)),
        "{} is not a sound ext4: {}",
        image.display(),
        String::from_utf8_lossy(&out.stdout)
    );
}

/// The content of `path` (inside the data disk) in `image`, or `None` if it is not there.
pub fn read_in_image(image: &Path, path: &str) -> Option<Vec<u8>> {
    let dump = image.with_extension("dump");
    let _ = std::fs::remove_file(&dump);
    let out = Command::new("debugfs")
        .arg("-R")
        .arg(format!("dump {path} {}", dump.display()))
        .arg(image)
        .output()
        .expect("debugfs (e2fsprogs) runs");
    assert!(out.status.success(), "debugfs: {}", String::from_utf8_lossy(&out.stderr));
    std::fs::read(&dump).ok()
}
