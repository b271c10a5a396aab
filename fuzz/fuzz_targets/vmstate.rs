//! What a restore reads from a snapshot directory, before anything touches KVM.
//!
//! The first input byte picks the file (`% 4`); the rest is its contents:
//! * 0 — `vmstate.bin` container only (`decode_vmstate`): magic, version, size cap, CRC.
//!   A file it accepts must re-encode to the same bytes.
//! * 1 — the container's payload (`VmState::decode_payload`, what `builder::prepare`
//!   calls after `read_vmstate_file` checked the CRC), then the device state a restore
//!   rebuilds without KVM: the IOAPIC (`Ioapic::restore`) and every virtio-mmio transport
//!   with its device (`Rng::restore`, `Block::restore` on a scratch image,
//!   `Vsock::restore` on a scratch socket, then `MmioTransport::restore`), where a
//!   restored transport's saved state must restore to itself (save → restore → save is
//!   a fixed point).
//!   (vCPU, irqchip and clock state are loaded by KVM ioctls and are not reached.)
//! * 2 — `snapshot.json` (`read_meta`, then `SnapshotDir::open`), which must round-trip
//!   through `write_meta`, and whose disk names must stay inside `disk/` when accepted.
//! * 3 — a whole `vmstate.bin` (`VmState::decode`: container, then payload).
//! * 4 — a layered disk's sealed layer `bitmap` file (`disk/<file>.layers/<id>/bitmap`,
//!   read by `layered_disk::inspect` and `Layer::open_sealed` at restore), beside a data
//!   file of the size it declares (up to 16 MiB, sparse): an accepted layer's present
//!   blocks must be exactly as many as the bitmap counts.

#![no_main]

use forkvm_fuzz::virtq::{self, CountingInterrupt};
use forkvm_snapshot::layered_disk::inspect;
use forkvm_snapshot::{decode_vmstate, encode_vmstate, read_meta, write_meta_unsynced, Layer, SnapshotDir};
use forkvm_vmm::devices::ioapic::Ioapic;
use forkvm_vmm::devices::virtio::blk::Block;
use forkvm_vmm::devices::virtio::net::{FrameEndpoint, Net};
use forkvm_vmm::devices::virtio::mmio::{MmioTransport, MmioTransportState};
use forkvm_vmm::devices::virtio::rng::Rng;
use forkvm_vmm::devices::virtio::vsock::Vsock;
use forkvm_vmm::devices::virtio::{VirtioDevice, VirtioDeviceState};
use forkvm_vmm::persist::VmState;
use libfuzzer_sys::fuzz_target;
use std::path::Component;
use std::sync::Arc;

/// Largest layer data file the harness creates (sparse).
const MAX_LAYER_BYTES: u64 = 16 << 20;
/// Largest image the harness creates for a saved block device (sparse).
const MAX_IMAGE_SECTORS: u64 = 1 << 20;

fn check_state(state: &VmState) {
    // The encoding is canonical: what decodes re-encodes and decodes to the same bytes.
    let bytes = state.encode_payload().expect("a decoded VmState must encode");
    let again = VmState::decode_payload(&bytes).expect("a re-encoded VmState must decode");
    assert_eq!(again.encode_payload().expect("encode"), bytes, "VmState encoding is not stable");

    if let Some(io) = &state.devices.ioapic {
        if let Ok(ioapic) = Ioapic::restore(io) {
            assert_eq!(ioapic.save(), *io, "IOAPIC save after restore differs");
        }
    }
    for (i, ts) in state.devices.virtio.iter().enumerate() {
        check_transport(i, ts);
    }
}

/// Restores slot `slot` from `ts` (device, then transport) and returns what it saves.
fn restore_transport(slot: usize, ts: &MmioTransportState) -> Option<MmioTransportState> {
    let dir = forkvm_fuzz::fresh_dir("vmstate-devices");
    let device: Box<dyn VirtioDevice> = match &ts.device {
        VirtioDeviceState::Rng(s) => Box::new(Rng::restore(s).ok()?),
        VirtioDeviceState::Block(s) => {
            let image = dir.join(format!("disk{slot}.img"));
            let file = std::fs::File::create(&image).expect("harness: image");
            file.set_len(s.capacity.min(MAX_IMAGE_SECTORS) * 512).expect("harness: sizing the image");
            Box::new(Block::restore(&image, s).ok()?)
        }
        VirtioDeviceState::Vsock(s) => Box::new(Vsock::restore(s, dir.join(format!("v{slot}.sock"))).ok()?),
        VirtioDeviceState::Net(s) => Box::new(Net::restore(s, Arc::new(PairEndpoint::new()), Default::default()).ok()?),
    };
    let mem = virtq::memory();
    let t = MmioTransport::restore(ts, device, mem, Arc::new(CountingInterrupt::default())).ok()?;
    Some(without_path(t.save()))
}

/// A restore may settle an edited state (the transport's negotiated features win over
/// the device's own), but what it settles on must restore to itself: save → restore →
/// save is a fixed point. A vsock or net backend thread moves ring positions on its own
/// after activation, so those slots are only restored, not compared.
fn check_transport(slot: usize, ts: &MmioTransportState) {
    let Some(first) = restore_transport(slot, ts) else { return };
    if matches!(ts.device, VirtioDeviceState::Vsock(_) | VirtioDeviceState::Net(_)) {
        return;
    }
    let second = restore_transport(slot, &first).expect("a restored transport's own state must restore");
    assert_eq!(second, first, "virtio-mmio slot {slot}: save → restore → save is not a fixed point");
}

/// A network device's host side in the harness: one end of a datagram socket pair (a
/// tap needs root and a namespace; the device only reads, writes and polls it).
#[derive(Debug)]
struct PairEndpoint {
    sock: std::os::unix::net::UnixDatagram,
    _peer: std::os::unix::net::UnixDatagram,
}

impl PairEndpoint {
    fn new() -> PairEndpoint {
        let (sock, peer) = std::os::unix::net::UnixDatagram::pair().expect("harness: a socket pair");
        sock.set_nonblocking(true).expect("harness: non-blocking");
        PairEndpoint { sock, _peer: peer }
    }
}

impl FrameEndpoint for PairEndpoint {
    fn raw_fd(&self) -> std::os::fd::RawFd {
        std::os::fd::AsRawFd::as_raw_fd(&self.sock)
    }
    fn read_frame(&self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.sock.recv(buf)
    }
    fn write_frame(&self, frame: &[u8]) -> std::io::Result<usize> {
        self.sock.send(frame)
    }
    fn set_offload(&self, _flags: u32) -> std::io::Result<()> {
        Ok(())
    }
}

/// A block device's saved path is informational (a restore is given its own image).
fn without_path(mut s: MmioTransportState) -> MmioTransportState {
    if let VirtioDeviceState::Block(b) = &mut s.device {
        b.path.clear();
    }
    s
}

fn check_meta(json: &[u8]) {
    let dir = forkvm_fuzz::fresh_dir("vmstate-meta");
    let path = dir.join("snapshot.json");
    std::fs::write(&path, json).expect("harness: writing snapshot.json");
    let Ok(meta) = read_meta(&path) else { return };
    let copy = dir.join("copy.json");
    write_meta_unsynced(&copy, &meta).expect("an accepted snapshot.json must be writable");
    assert_eq!(read_meta(&copy).expect("a written snapshot.json must read back"), meta, "snapshot.json round trip");

    let disk_dir = dir.join("disk");
    for d in meta.devices.iter().flat_map(|d| d.disks.iter()) {
        if !d.has_plain_name() {
            continue;
        }
        let escapes = |p: &std::path::Path| {
            p.strip_prefix(&disk_dir).map_or(true, |r| !r.components().all(|c| matches!(c, Component::Normal(_))))
        };
        let image = disk_dir.join(&d.file);
        assert!(!escapes(&image) && image.parent() == Some(&disk_dir), "disk file {:?} leaves disk/", d.file);
        for l in d.layer_dirs(&disk_dir) {
            assert!(!escapes(&l), "layer dir {} leaves disk/", l.display());
        }
    }
    for name in ["vmstate.bin", "memory.img", "memory.map"] {
        std::fs::write(dir.join(name), b"").expect("harness");
    }
    if let Ok(snap) = SnapshotDir::open(&dir) {
        assert_eq!(snap.meta, meta);
    }
}

fn check_layer(bitmap: &[u8]) {
    let dir = forkvm_fuzz::fresh_dir("vmstate-layer");
    std::fs::write(dir.join("bitmap"), bitmap).expect("harness: bitmap");
    let Ok(info) = inspect(&dir) else { return };
    if info.disk_size > MAX_LAYER_BYTES {
        return;
    }
    let data = std::fs::File::create(dir.join("data")).expect("harness: data file");
    data.set_len(info.disk_size).expect("harness: sizing the data file");
    let Ok(layer) = Layer::open_sealed(&dir) else { return };
    assert_eq!(layer.present_count(), info.blocks, "present count differs from inspect");
    let mut n = 0u64;
    for item in layer.present_blocks() {
        let (block, bytes) = item.expect("reading a present block of a data file of the right size");
        assert!(layer.is_present(block), "present_blocks yields an absent block");
        assert_eq!(bytes.len(), layer.block_len(block), "a present block's bytes have the wrong length");
        n += 1;
    }
    assert_eq!(n, info.blocks, "present_blocks yields another count than the bitmap holds");
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    match mode % 5 {
        0 => {
            if let Ok(payload) = decode_vmstate(rest) {
                assert_eq!(encode_vmstate(payload), rest, "container round trip");
            }
        }
        1 => {
            if let Ok(state) = VmState::decode_payload(rest) {
                check_state(&state);
            }
        }
        2 => check_meta(rest),
        3 => {
            if let Ok(state) = VmState::decode(rest) {
                check_state(&state);
            }
        }
        _ => check_layer(rest),
    }
});
