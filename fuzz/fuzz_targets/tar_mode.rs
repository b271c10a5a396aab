//! `COPY --from=STAGE --chmod=MODE` of a directory: the stage's guest writes a tar stream
//! and the host rewrites its modes on the way to the step's guest
//! (`forkvm_image::dockerfile::tar_mode`). The stream is the guest's: any bytes must end
//! in an error or a whole archive, in memory bounded by the entries' headers.
//!
//! The input is two bytes of mode (taken modulo 0o10000) and then the stream. A copy
//! that succeeds must be a sequence of 512-byte blocks ending in two zero blocks, whose
//! every file and directory header, read back raw, has the mode and a valid checksum.

#![no_main]

use forkvm_image::dockerfile::tar_mode::copy_with_mode;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let mode = u32::from(u16::from_le_bytes([data[0], data[1]])) & 0o7777;
    let mut out = Vec::new();
    let Ok(copied) = copy_with_mode(&data[2..], &mut out, mode) else { return };
    assert_eq!(out.len() % 512, 0);
    assert!(out.len() >= 1024 && out[out.len() - 1024..].iter().all(|b| *b == 0));
    assert!(copied <= data.len() as u64);
    let mut again = tar::Archive::new(&out[..]);
    for entry in again.entries().expect("our own archive opens").raw(true) {
        let entry = entry.expect("our own archive reads back");
        let h = entry.header();
        let kind = h.entry_type();
        if kind.is_file() || kind.is_dir() || kind == tar::EntryType::Continuous {
            assert_eq!(h.mode().expect("a mode we wrote"), mode);
        }
    }
});
