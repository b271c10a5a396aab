//! virtio-vsock's queue processing with its userspace backend, driven by a fuzzed guest:
//! tx packets parsed from descriptor chains and routed by the muxer (connections to host
//! Unix sockets, resets, credit updates, shutdowns), host bytes packed into rx buffers,
//! and the transport-reset event.
//!
//! The real device does this work on its backend thread: `Vsock::queue_notify` only kicks
//! an eventfd, and the thread runs `Shared::process_queues` (and `Muxer::host_io` for
//! readable host sockets). This target builds the same `Shared` (listener, muxer, the
//! activated queues) and calls those functions directly, so a run is deterministic and
//! needs no thread. A host service listens on `<uds>_1234` (the port the seeds connect
//! to) and answers every connection with bytes from the ops.
//!
//! Input layout: `forkvm_fuzz::virtq` (queues rx, tx, event). Ops: `Notify` runs
//! `process_queues`; `Write { offset, value }` is a host action (`offset % 4`: 0 the
//! service writes `value`'s bytes to every connection, 1 `host_io` on every stream, 2 the
//! service closes its connections, 3 it half-closes them); `Read` runs `host_io` and
//! `process_queues`; `Repost` re-posts chains and runs `process_queues`. Flag bit 4 sets a
//! pending transport-reset event, as after a restore.

#![no_main]

use forkvm_fuzz::virtq::{self, Case, CountingInterrupt, Op};
use forkvm_vmm::devices::virtio::vsock::backend::{ActiveQueues, Shared};
use forkvm_vmm::devices::virtio::vsock::metrics::VsockMetrics;
use forkvm_vmm::devices::virtio::vsock::muxer::Muxer;
use forkvm_vmm::devices::virtio::vsock::QUEUE_SIZE;
use libfuzzer_sys::fuzz_target;
use std::io::Write;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use virtio_queue::{Queue, QueueT};
use vm_memory::GuestAddress;

/// The guest's CID (what the seeds' packets carry as `src_cid`).
const GUEST_CID: u64 = 3;
/// The host port with a listening service.
const SERVICE_PORT: u32 = 1234;

struct Host {
    uds: PathBuf,
    /// The device's listener for host clients (`CONNECT <port>`); cloned per run.
    listener: UnixListener,
    /// The service behind `<uds>_1234`.
    service: UnixListener,
}

fn host() -> &'static Host {
    static HOST: OnceLock<Host> = OnceLock::new();
    HOST.get_or_init(|| {
        let dir = forkvm_fuzz::scratch().join("vsock");
        std::fs::create_dir_all(&dir).expect("harness: vsock dir");
        let uds = dir.join("v.sock");
        let listener = UnixListener::bind(&uds).expect("harness: binding the device listener");
        listener.set_nonblocking(true).expect("harness: non-blocking listener");
        let service =
            UnixListener::bind(Muxer::host_socket_path(&uds, SERVICE_PORT)).expect("harness: binding the service");
        service.set_nonblocking(true).expect("harness: non-blocking service");
        Host { uds, listener, service }
    })
}

/// Accepts whatever connected to the service since the last call.
fn accept(service: &UnixListener, conns: &mut Vec<UnixStream>) {
    while let Ok((s, _)) = service.accept() {
        let _ = s.set_nonblocking(true);
        conns.push(s);
    }
}

/// The device's queue `spec`, configured as the transport would hand it over, or `None`
/// where the transport would refuse to activate the device.
fn queue(spec: &virtq::QueueSpec, mem: &vm_memory::GuestMemoryMmap) -> Option<Queue> {
    let mut q = Queue::new(QUEUE_SIZE).ok()?;
    q.try_set_size(spec.size).ok()?;
    q.try_set_desc_table_address(GuestAddress(spec.desc)).ok()?;
    q.try_set_avail_ring_address(GuestAddress(spec.avail)).ok()?;
    q.try_set_used_ring_address(GuestAddress(spec.used)).ok()?;
    q.set_ready(true);
    q.is_valid(mem).then_some(q)
}

fuzz_target!(|data: &[u8]| {
    let host = host();
    let mem = virtq::memory();
    let mut case = Case::parse(data, 3, &mem);
    let (Some(rx), Some(tx), Some(event)) =
        (queue(&case.queues[0], &mem), queue(&case.queues[1], &mem), queue(&case.queues[2], &mem))
    else {
        return;
    };
    let metrics = Arc::new(VsockMetrics::default());
    let muxer = Muxer::new(GUEST_CID, host.uds.clone(), metrics.clone());
    let listener = host.listener.try_clone().expect("harness: cloning the listener");
    let mut shared = Shared::new(listener, muxer, metrics.clone());
    shared.active = Some(ActiveQueues { mem: mem.clone(), rx, tx, event, irq: Arc::new(CountingInterrupt::default()) });
    shared.reset_event_pending = case.flags & 0x10 != 0;

    let mut conns = Vec::new();
    let keys = |s: &Shared| s.muxer.poll_interest().into_iter().map(|(k, _, _)| k).collect::<Vec<_>>();
    shared.process_queues();
    for op in case.ops.clone() {
        accept(&host.service, &mut conns);
        match op {
            Op::Notify { .. } => shared.process_queues(),
            Op::Write { offset, value } => match offset % 4 {
                0 => {
                    let n = (value >> 24) as usize % 64;
                    let bytes: Vec<u8> = value.to_le_bytes().iter().copied().cycle().take(n.max(1)).collect();
                    for c in &mut conns {
                        let _ = c.write(&bytes);
                    }
                }
                1 => {
                    for k in keys(&shared) {
                        shared.muxer.host_io(k);
                    }
                }
                2 => conns.clear(),
                _ => {
                    for c in &conns {
                        let _ = c.shutdown(std::net::Shutdown::Write);
                    }
                }
            },
            Op::Read { .. } => {
                for k in keys(&shared) {
                    shared.muxer.host_io(k);
                }
                shared.process_queues();
            }
            Op::Repost { queue, count } => {
                virtq::repost(&mem, &mut case.queues[usize::from(queue)], count);
                shared.process_queues();
            }
        }
    }
    if forkvm_fuzz::debug() {
        eprintln!("vsock: {:?}; host connections accepted: {}", metrics.snapshot(), conns.len());
    }
    shared.muxer.clear();
    drop(shared);
    accept(&host.service, &mut conns);
});
