//! virtio-rng driven by a fuzzed guest driver through its virtio-mmio transport: feature
//! negotiation, queue setup, descriptor chains, notifies and stray register accesses,
//! exactly as `MmioTransport` receives them from a vCPU's MMIO exit.
//! Input layout: `forkvm_fuzz::virtq` (one queue).

#![no_main]

use forkvm_fuzz::virtq::{self, Case, CountingInterrupt};
use forkvm_vmm::devices::virtio::mmio::MmioTransport;
use forkvm_vmm::devices::virtio::rng::{Rng, MAX_BYTES_PER_REQUEST};
use libfuzzer_sys::fuzz_target;
use std::sync::Arc;

fuzz_target!(|data: &[u8]| {
    let mem = virtq::memory();
    let mut case = Case::parse(data, 1, &mem);
    let rng = Rng::new();
    let metrics = rng.metrics();
    let mut t = MmioTransport::new(Box::new(rng), mem.clone(), Arc::new(CountingInterrupt::default()));
    virtq::mmio::bring_up(&mut t, &case);
    virtq::mmio::run(&mut t, &mem, &mut case);

    let m = metrics.snapshot();
    if forkvm_fuzz::debug() {
        eprintln!("rng: activated {}, {m:?}", t.is_activated());
    }
    assert!(m.bytes <= m.requests * MAX_BYTES_PER_REQUEST as u64, "rng served more than its cap: {m:?}");
});
