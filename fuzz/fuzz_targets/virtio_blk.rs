//! virtio-blk driven by a fuzzed guest driver through its virtio-mmio transport: request
//! headers and data segments parsed from descriptor chains (`blk::request::parse`) and
//! executed against a small image file, raw or layered (base + fresh writable top).
//! Input layout: `forkvm_fuzz::virtq` (one queue); the device byte picks the disk:
//! bit 0 read-only, bit 1 layered, bits 2-3 the image size (16 KiB, empty, 16 KiB + 100
//! bytes, one sector).
//!
//! Checked after every run: a read-only disk's image is byte for byte unchanged, a raw
//! image keeps its length, and a layered disk never writes its base.

#![no_main]

use forkvm_fuzz::virtq::{self, Case, CountingInterrupt};
use forkvm_vmm::devices::virtio::blk::Block;
use forkvm_vmm::devices::virtio::mmio::MmioTransport;
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

/// The image: each byte its offset's low 8 bits mixed with the sector number.
fn image(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u8) ^ ((i / 512) as u8).wrapping_mul(37)).collect()
}

fuzz_target!(|data: &[u8]| {
    let mem = virtq::memory();
    let mut case = Case::parse(data, 1, &mem);
    let read_only = case.device_byte & 1 != 0;
    let layered = case.device_byte & 2 != 0;
    let len = match (case.device_byte >> 2) & 3 {
        0 => 32 * 512,
        1 => 0,
        2 => 32 * 512 + 100,
        _ => 512,
    };
    let dir = forkvm_fuzz::fresh_dir("blk");
    let base = dir.join("disk.img");
    let original = image(len);
    std::fs::write(&base, &original).expect("harness: writing the image");
    let block = if layered {
        Block::layered(&base, &[], &dir.join("top"), "fuzz-disk")
    } else {
        Block::new(&base, read_only, "fuzz-disk")
    }
    .expect("harness: opening the disk");
    let metrics = block.metrics();
    let mut t = MmioTransport::new(Box::new(block), mem.clone(), Arc::new(CountingInterrupt::default()));
    virtq::mmio::bring_up(&mut t, &case);
    virtq::mmio::run(&mut t, &mem, &mut case);
    let activated = t.is_activated();
    drop(t);
    if forkvm_fuzz::debug() {
        eprintln!("blk: activated {activated}, {:?}", metrics.snapshot());
    }

    let after = std::fs::read(&base).expect("harness: reading the image back");
    if read_only || layered {
        assert!(after == original, "the image of a read-only or layered disk was modified");
    } else {
        assert_eq!(after.len(), original.len(), "a raw image changed length");
    }
});
