//! A snapshot whose files are damaged or do not belong together is refused before any
//! VM is created, with an error that names the problem.

mod common;
use common::*;
use forkvm_snapshot::{read_meta, write_meta, MEMORY_IMG, SNAPSHOT_JSON, VMSTATE_BIN};
use forkvm_testguest::TestGuest;
use forkvm_vmm::prepare;
use forkvm_vmm::vstate::irqchip::IrqchipMode;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// One good snapshot, made once; each test copies it and damages the copy. It lives in
/// cargo's per-target scratch directory under a fixed name, replaced by the next run: a
/// static is never dropped, so a temporary directory here would be left in /tmp.
fn good_snapshot() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let snap = Path::new(env!("CARGO_TARGET_TMPDIR")).join("snapshot-errors-good");
        let _ = std::fs::remove_dir_all(&snap);
        let (mut vmm, mut console) = boot_guest(TestGuest::Hello, &[], 16, IrqchipMode::Split);
        console.wait_for("hello from ring 3\n", T);
        vmm.snapshot(&snap).unwrap();
        snap
    })
}

fn damaged(name: &str, damage: impl FnOnce(&Path)) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    std::fs::create_dir(&dir).unwrap();
    for f in [SNAPSHOT_JSON, VMSTATE_BIN, MEMORY_IMG] {
        std::fs::copy(good_snapshot().join(f), dir.join(f)).unwrap();
    }
    damage(&dir);
    (tmp, dir)
}

fn refused(dir: &Path) -> String {
    prepare(dir).map(|_| ()).expect_err("a damaged snapshot must be refused").to_string()
}

fn edit(path: &Path, f: impl FnOnce(&mut Vec<u8>)) {
    let mut b = std::fs::read(path).unwrap();
    f(&mut b);
    std::fs::write(path, b).unwrap();
}

#[test]
fn the_good_snapshot_is_accepted() {
    let snap = prepare(good_snapshot()).unwrap();
    assert_eq!(snap.state.mem_size, 16 << 20);
}

#[test]
fn a_flipped_byte_in_vmstate_is_a_checksum_error() {
    let (_t, dir) = damaged("flip", |d| edit(&d.join(VMSTATE_BIN), |b| b[100] ^= 0x40));
    let e = refused(&dir);
    assert!(e.contains("checksum mismatch"), "{e}");
}

#[test]
fn a_truncated_vmstate_is_refused() {
    let (_t, dir) = damaged("trunc", |d| edit(&d.join(VMSTATE_BIN), |b| b.truncate(b.len() / 2)));
    let e = refused(&dir);
    assert!(e.contains("truncated"), "{e}");
}

#[test]
fn a_wrong_format_version_is_refused() {
    let (_t, dir) =
        damaged("version", |d| edit(&d.join(VMSTATE_BIN), |b| b[8..12].copy_from_slice(&99u32.to_le_bytes())));
    let e = refused(&dir);
    assert!(e.contains("version 99"), "{e}");
}

#[test]
fn a_missing_memory_image_is_refused() {
    let (_t, dir) = damaged("nomem", |d| std::fs::remove_file(d.join(MEMORY_IMG)).unwrap());
    let e = refused(&dir);
    assert!(e.contains("memory.img"), "{e}");
}

#[test]
fn a_short_memory_image_is_refused() {
    let (_t, dir) = damaged("short", |d| {
        let f = std::fs::OpenOptions::new().write(true).open(d.join(MEMORY_IMG)).unwrap();
        f.set_len(8 << 20).unwrap();
    });
    let e = refused(&dir);
    assert!(e.contains("truncated or not this snapshot"), "{e}");
}

#[test]
fn metadata_that_disagrees_with_the_state_is_refused() {
    let (_t, dir) = damaged("mismatch", |d| {
        let p = d.join(SNAPSHOT_JSON);
        let mut meta = read_meta(&p).unwrap();
        meta.mem_size_bytes = 32 << 20;
        write_meta(&p, &meta).unwrap();
    });
    let e = refused(&dir);
    assert!(e.contains("memory size 33554432") && e.contains("16777216"), "{e}");
}

#[test]
fn garbage_metadata_is_refused() {
    let (_t, dir) = damaged("json", |d| std::fs::write(d.join(SNAPSHOT_JSON), b"{not json").unwrap());
    let e = refused(&dir);
    assert!(e.contains("snapshot.json"), "{e}");
}

#[test]
fn a_missing_directory_is_refused() {
    let e = refused(Path::new("/nonexistent/forkvm/snapshot"));
    assert!(e.contains("/nonexistent/forkvm/snapshot"), "{e}");
}

#[test]
fn snapshot_into_an_existing_directory_fails_and_the_vm_runs_on() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut vmm, mut console) = boot_guest(TestGuest::Echo, &[], 16, IrqchipMode::Split);
    console.wait_for("echo ready\n", T);
    let dir = tmp.path().join("taken");
    std::fs::create_dir(&dir).unwrap();
    let e = vmm.snapshot(&dir).unwrap_err().to_string();
    assert!(e.contains("exists"), "{e}");
    assert!(!tmp.path().join("taken.partial").exists(), "no partial directory left behind");
    vmm.send_serial_input(b"still here").unwrap();
    console.wait_for("still here", T);
    let e = vmm.snapshot(&tmp.path().join("../bad tag")).unwrap_err().to_string();
    assert!(e.contains("tag"), "{e}");
}
