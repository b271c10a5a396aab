//! Writes the seed corpora, `fuzz/corpus/<target>/seed-*`: small inputs that parse, made
//! with the project's own writers (PackWriter, PageMap::encode, the virtio devices'
//! `save`, the protocol crate's frame writer ...) so the fuzzers start past the first
//! checks. Regression inputs (`regress-*`) are added by hand and never touched here.
//!
//! Run from the repository root (any toolchain; no sanitizer needed):
//!
//! ```text
//! cargo run --manifest-path fuzz/Cargo.toml --example gen_seeds
//! ```

use forkvm_fuzz::virtq::{self, Builder, Case, CountingInterrupt};
use forkvm_proto::{
    write_frame, write_json, AgentError, ChangeKind, Command, ErrorKind, EvalOutcome, EvalResponse, ExecRequest,
    ExitStatus, FileInfo, FileType, FrameKind, IdentityApplied, IdentityRequest, MkdirRequest, Pong, ProtocolError,
    ProtocolErrorCode, Request, Response, WatchMessage, WatchRequest, WriteFileRequest,
};
use forkvm_proto::{
    ProcAttachRequest, ProcInfo, ProcInputRequest, ProcNews, ProcResizeRequest, ProcStartRequest, PtySize,
};
use forkvm_snapshot::layered_disk::{LayerId, SealedLayerBuilder};
use forkvm_snapshot::pack_archive::signature::read_secret_key;
use forkvm_snapshot::pack_archive::SparseExtents;
use forkvm_snapshot::vault::lazy::{Recording, Touch};
use forkvm_snapshot::vault::Playbook;
use forkvm_snapshot::{encode_vmstate, ChunkId, ChunkStore, Extent, ExtentContent, PackWriter, PageMap};
use forkvm_vmm::arch::x86_64::cpuid::CpuTemplate;
use forkvm_vmm::devices::ioapic::IoapicState;
use forkvm_vmm::devices::serial::SerialDeviceState;
use forkvm_vmm::devices::virtio::blk::Block;
use forkvm_vmm::devices::virtio::mmio::{MmioTransport, MmioTransportState};
use forkvm_vmm::devices::virtio::rng::Rng;
use forkvm_vmm::devices::virtio::vsock::Vsock;
use forkvm_vmm::devices::virtio::VirtioDevice;
use forkvm_vmm::devices::DevicesState;
use forkvm_vmm::persist::VmState;
use forkvm_vmm::vstate::irqchip::{IrqchipMode, KernelIrqchipState};
use forkvm_vmm::vstate::vcpu_state::{FpuState, VcpuState, XsaveState};
use std::path::{Path, PathBuf};
use std::sync::Arc;

struct Corpus {
    root: PathBuf,
    count: usize,
}

impl Corpus {
    fn put(&mut self, target: &str, name: &str, bytes: &[u8]) {
        let dir = self.root.join(target);
        std::fs::create_dir_all(&dir).unwrap();
        assert!(bytes.len() <= 16 << 10, "seed {target}/{name} is {} bytes", bytes.len());
        std::fs::write(dir.join(format!("seed-{name}")), bytes).unwrap();
        self.count += 1;
    }

    /// `mode` byte, then `bytes`.
    fn put_mode(&mut self, target: &str, name: &str, mode: u8, bytes: &[u8]) {
        self.put(target, name, &[&[mode][..], bytes].concat());
    }
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let mut c = Corpus { root, count: 0 };
    let tmp = tempfile::tempdir().unwrap();
    vmstate(&mut c, tmp.path());
    packs(&mut c, tmp.path());
    chunk_index(&mut c, tmp.path());
    page_map(&mut c);
    agent_host(&mut c);
    agent_guest(&mut c);
    control(&mut c);
    virtio(&mut c);
    rest(&mut c);
    oci(&mut c, tmp.path());
    x86(&mut c);
    println!("wrote {} seeds under {}", c.count, c.root.display());
}

// ---------------------------------------------------------------------------- vmstate

/// A device brought up by the driver the virtio targets play, after one request.
fn transport(device: Box<dyn VirtioDevice>, queues: usize, input: &[u8]) -> MmioTransportState {
    let mem = virtq::memory();
    let mut case = Case::parse(input, queues, &mem);
    let mut t = MmioTransport::new(device, mem.clone(), Arc::new(CountingInterrupt::default()));
    virtq::mmio::bring_up(&mut t, &case);
    virtq::mmio::run(&mut t, &mem, &mut case);
    assert!(t.is_activated(), "seed device did not activate");
    t.save()
}

fn vcpu() -> VcpuState {
    VcpuState {
        cpuid: vec![Default::default(); 2],
        regs: Default::default(),
        sregs: Default::default(),
        fpu: FpuState {
            fpr: [[0; 16]; 8],
            fcw: 0x37f,
            fsw: 0,
            ftwx: 0,
            last_opcode: 0,
            last_ip: 0,
            last_dp: 0,
            xmm: [[0; 16]; 16],
            mxcsr: 0x1f80,
        },
        // Shorter than KVM's 4 KiB: decoding does not care, and the seed stays small.
        xsave: XsaveState(vec![0; 64]),
        xcrs: Default::default(),
        lapic: Default::default(),
        msrs: vec![Default::default(); 2],
        vcpu_events: Default::default(),
        mp_state: Default::default(),
        debugregs: Default::default(),
    }
}

fn serial() -> SerialDeviceState {
    SerialDeviceState {
        baud_divisor_low: 1,
        baud_divisor_high: 0,
        interrupt_enable: 0,
        interrupt_identification: 1,
        line_control: 3,
        line_status: 0x60,
        modem_control: 8,
        modem_status: 0xb0,
        scratch: 0,
        in_buffer: b"ls\n".to_vec(),
    }
}

fn vmstate(c: &mut Corpus, tmp: &Path) {
    let rng = transport(Box::new(Rng::new()), 1, &rng_input());
    let image = tmp.join("disk.img");
    std::fs::write(&image, vec![0u8; 32 * 512]).unwrap();
    let blk = transport(Box::new(Block::new(&image, false, "fuzz-disk").unwrap()), 1, &blk_input(0));
    let vsock = transport(Box::new(Vsock::new(3, tmp.join("v.sock")).unwrap()), 3, &vsock_input(false));
    let split = VmState {
        mem_size: 2 << 20,
        cpu_template: CpuTemplate::Host,
        irqchip_mode: IrqchipMode::Split,
        vcpus: vec![vcpu()],
        kernel_irqchip: None,
        clock: Default::default(),
        devices: DevicesState {
            serial: serial(),
            ioapic: Some(IoapicState { id: 0, ioregsel: 0, redirection: vec![0x1_0000; 24] }),
            virtio: vec![vsock, rng, blk],
        },
    };
    split.validate().unwrap();
    let kernel = VmState {
        irqchip_mode: IrqchipMode::Kernel,
        kernel_irqchip: Some(KernelIrqchipState {
            pic_master: Default::default(),
            pic_slave: Default::default(),
            ioapic: Default::default(),
            pit: Default::default(),
        }),
        devices: DevicesState { ioapic: None, virtio: vec![], serial: serial() },
        ..split.clone()
    };
    kernel.validate().unwrap();
    let (s, k) = (split.encode_payload().unwrap(), kernel.encode_payload().unwrap());
    c.put_mode("vmstate", "container", 0, &encode_vmstate(&k));
    c.put_mode("vmstate", "payload-split-devices", 1, &s);
    c.put_mode("vmstate", "payload-kernel-irqchip", 1, &k);
    c.put_mode("vmstate", "vmstate-bin-split", 3, &encode_vmstate(&s));

    let meta = serde_json::json!({
        "format_version": 1, "tag": "t1", "created_at_unix_ms": 1_700_000_000_000u64, "status": "ready",
        "mem_size_bytes": 2 << 20, "vcpu_count": 1, "irqchip": "split",
        "guest": {"kind": "linux", "name": "vmlinux", "content_hash": null},
        "parent_tag": "base", "parent_hash": "ab".repeat(32), "branched_from": null, "volumes": ["data"],
        "memory_bytes_allocated": 4096, "writer_pid": 42,
        "devices": {"vsock_cid": 3, "rng": true, "disks": [
            {"file": "disk0.img", "read_only": true, "id": "forkvm-root"},
            {"file": "disk1.img", "read_only": false, "id": "forkvm-data", "layers": ["47f1b771249791fe3978e68070ee1d46"]}
        ]},
        "template": "python", "memory_format": "chunked", "content_hash": "cd".repeat(32)
    });
    c.put_mode("vmstate", "snapshot-json", 2, serde_json::to_string_pretty(&meta).unwrap().as_bytes());
    let minimal = r#"{"format_version":1,"tag":"t","created_at_unix_ms":1,"status":"ready","mem_size_bytes":4096,
"vcpu_count":1,"irqchip":"kernel","guest":{"kind":"testguest","name":"g"},"memory_bytes_allocated":0}"#;
    c.put_mode("vmstate", "snapshot-json-minimal", 2, minimal.as_bytes());

    let layer_dir = tmp.join("layer");
    let mut b = SealedLayerBuilder::create(&layer_dir, 256 << 10, LayerId::BASE).unwrap();
    b.put_block(0, &[1u8; 4096]).unwrap();
    b.put_blocks(5, &[2u8; 3 * 4096]).unwrap();
    b.finish().unwrap();
    c.put_mode("vmstate", "layer-bitmap", 4, &std::fs::read(layer_dir.join("bitmap")).unwrap());
}

// ------------------------------------------------------------------------------ packs

fn packs(c: &mut Corpus, tmp: &Path) {
    // A pack with nested entries and a sparse entry, as `chain::pack` writes them.
    let disk = tmp.join("disk.raw");
    let mut content = vec![0u8; 64 << 10];
    content[..300].fill(0xaa);
    content[40_000..40_100].fill(0xbb);
    std::fs::write(&disk, &content).unwrap();
    let mut extents = SparseExtents::new(content.len() as u64);
    extents.push(0, 300);
    extents.push(40_000, 100);
    let pack = tmp.join("p.tar.zst");
    let mut w = PackWriter::create(&pack).unwrap();
    w.add_bytes("snapshots/t1/snapshot.json", br#"{"format_version":1}"#).unwrap();
    w.add_bytes("snapshots/t1/vmstate.bin", b"FKVMSTAT").unwrap();
    w.add_bytes(&format!("chunks/{}", ChunkId::of(b"chunk").to_hex()), b"chunk").unwrap();
    w.add_sparse_file("disks/0", &disk, &extents).unwrap();
    let (_, manifest) = w.finish(serde_json::json!({"head": "t1", "links": []})).unwrap();
    let packed = std::fs::read(&pack).unwrap();
    c.put_mode("pack_reader", "pack", 0, &packed);
    c.put_mode("pack_reader", "pack-chain-names", 2, &packed);
    let tar = zstd::decode_all(&packed[..]).unwrap();
    c.put_mode("pack_reader", "tar", 1, &tar);
    c.put_mode("pack_reader", "tar-chain-names", 3, &tar);

    c.put_mode("pack_manifest", "manifest", 0, &serde_json::to_vec_pretty(&manifest).unwrap());
    // A signed pack (`pack --sign`), and key files as `pack-keygen` writes them, for a
    // fixed throwaway key (so the seeds are the same on every run; it signs nothing else).
    let secret = tmp.join("pack.key");
    std::fs::write(&secret, format!("forkvm-ed25519-secret:{}\n", "5e".repeat(32))).unwrap();
    let key = read_secret_key(&secret).unwrap();
    let public = tmp.join("pack.key.pub");
    let hex: String = key.verifying_key().as_bytes().iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&public, format!("forkvm-ed25519-public:{hex}\n")).unwrap();
    let signed = tmp.join("signed.tar.zst");
    let mut w = PackWriter::create(&signed).unwrap();
    w.add_bytes("snapshots/t1/snapshot.json", br#"{"format_version":1}"#).unwrap();
    let (_, signed_manifest) = w.finish_signed(serde_json::json!({"head": "t1", "links": []}), Some(&key)).unwrap();
    c.put_mode("pack_reader", "signed-pack", 0, &std::fs::read(&signed).unwrap());
    c.put_mode("pack_manifest", "signed-manifest", 0, &serde_json::to_vec_pretty(&signed_manifest).unwrap());
    c.put_mode("pack_manifest", "secret-key-file", 2, &std::fs::read(&secret).unwrap());
    c.put_mode("pack_manifest", "public-key-file", 2, &std::fs::read(&public).unwrap());
    // The sparse entry exactly as it travels in the pack.
    let staging = tmp.join("staging");
    std::fs::create_dir(&staging).unwrap();
    forkvm_snapshot::extract_pack(&pack, &staging, &|_| true, &Default::default()).unwrap();
    c.put_mode("pack_manifest", "sparse-entry", 1, &std::fs::read(staging.join("disks/0")).unwrap());
    let empty =
        [&b"FKVMSPRS"[..], &1u32.to_le_bytes(), &0u32.to_le_bytes(), &(1u64 << 30).to_le_bytes(), &0u64.to_le_bytes()]
            .concat();
    c.put_mode("pack_manifest", "sparse-empty-1gib", 1, &empty);
}

// ------------------------------------------------------------------------ chunk_index

fn chunk_index(c: &mut Corpus, tmp: &Path) {
    let id = ChunkId::of(b"some chunk bytes");
    c.put_mode("chunk_index", "chunk-name", 0, id.to_hex().as_bytes());

    let store = ChunkStore::open(tmp);
    let data: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
    let put = store.put(&data).unwrap();
    c.put_mode("chunk_index", "chunk-file", 1, &std::fs::read(store.path_of(&put.id)).unwrap());

    let mut entries = Vec::new();
    let mut entry = |dir: u8, name: &str, content: &[u8]| {
        entries.push(dir);
        entries.push(name.len() as u8);
        entries.extend_from_slice(name.as_bytes());
        entries.push(content.len() as u8);
        entries.extend_from_slice(content);
    };
    let ab = |tail: &str| format!("ab{}", tail.repeat(62 / tail.len()));
    entry(0, &ab("0"), b"chunk");
    entry(0, &ab("1"), b"chunk");
    entry(0, &ab("2"), b"");
    entry(0, &format!(".{}.1.0.tmp", ab("3")), b"");
    entry(0, "README", b"not a chunk");
    entry(1, &ab("4"), b"");
    entry(2, "0000000000000001.sandbox-1", b"/nonexistent/anchor");
    entry(2, "0000000000000002.sandbox-2", b"");
    entry(3, "0000000000000001.snap", b"FKVMVSN1");
    c.put_mode("chunk_index", "entries", 2, &entries);

    let json = serde_json::json!({"seq": 1, "created_unix_ms": 1_764_500_000_000u64, "disks": [
        {"id": "rootfs", "base_key": "ubuntu@sha256:00", "size": 1 << 20, "layer_id": "base",
         "extents": [[0, 16, ab("5")], [16, 3, ab("6")], [40, 1, ab("7")]]},
        {"id": "memory", "base_key": "", "size": 70_000, "layer_id": "0123456789abcdef0123456789abcdef",
         "extents": [[17, 1, ab("8")]]}
    ]});
    let json = serde_json::to_vec(&json).unwrap();
    c.put_mode("chunk_index", "manifest-file", 3, &forkvm_fuzz::vault_seal::seal_manifest(&json, 1));
    c.put_mode("chunk_index", "manifest-json", 4, &json);

    let rec = Recording {
        touches: vec![
            Touch { block: 0, at_micros: 10 },
            Touch { block: 16, at_micros: 200 },
            Touch { block: 48, at_micros: 5000 },
        ],
    };
    c.put_mode("chunk_index", "playbook", 5, &Playbook::from_recording(1 << 20, &rec).encode());
}

// --------------------------------------------------------------------------- page_map

fn page_map(c: &mut Corpus) {
    let ids: Vec<ChunkId> = forkvm_fuzz::page_map_chunks().iter().map(|d| ChunkId::of(d)).collect();
    let map = PageMap {
        mem_size: 48 * 4096,
        extents: vec![
            Extent { first_page: 0, pages: 1, content: ExtentContent::Chunk(ids[0]) },
            Extent { first_page: 1, pages: 2, content: ExtentContent::Zero },
            Extent { first_page: 4, pages: 2, content: ExtentContent::Chunk(ids[1]) },
            Extent { first_page: 16, pages: 16, content: ExtentContent::Chunk(ids[2]) },
            Extent { first_page: 40, pages: 3, content: ExtentContent::Zero },
        ],
    };
    c.put_mode("page_map", "map", 0, &map.encode());
    c.put_mode("page_map", "map-empty", 0, &PageMap { mem_size: 8 * 4096, extents: vec![] }.encode());
    // Build inputs: size byte, diff byte, then (page, offset, value) records.
    let mut flat = vec![20, 0];
    for (page, value) in [(0u8, 1u8), (1, 2), (17, 3), (18, 0), (19, 9)] {
        flat.extend_from_slice(&[page, 7, value]);
    }
    c.put_mode("page_map", "build-flat", 1, &flat);
    let mut diff = vec![20, 0x80];
    for (page, value) in [(0u8, 1u8), (0x40 | 1, 2), (0x80 | 2, 3), (0x40 | 17, 4), (17, 5)] {
        diff.extend_from_slice(&[page, 3, value]);
    }
    c.put_mode("page_map", "build-diff", 1, &diff);
}

// --------------------------------------------------------------------- agent protocol

fn frame(out: &mut Vec<u8>, kind: FrameKind, payload: &[u8]) {
    write_frame(out, kind, payload).unwrap();
}

fn response(out: &mut Vec<u8>, r: &Response) {
    write_json(out, FrameKind::Response, r).unwrap();
}

fn info(name: &str, file_type: FileType) -> FileInfo {
    FileInfo {
        name: name.into(),
        file_type,
        size: 4096,
        mode: 0o755,
        mtime_unix_ns: 1_700_000_000_000_000_000,
        owner: None,
        group: None,
        symlink_target: None,
    }
}

fn agent_host(c: &mut Corpus) {
    let one = |r: Response| {
        let mut out = Vec::new();
        response(&mut out, &r);
        out
    };
    let pong = Pong {
        agent_version: "0.1.0".into(),
        protocol_version: 1,
        uptime_ms: 1234,
        sandbox_id: Some("sb-1".into()),
        generation: 2,
        eval_available: true,
    };
    c.put_mode("agent_frames_host", "ping", 0, &one(Response::Pong(pong)));
    let mut exec = Vec::new();
    frame(&mut exec, FrameKind::Stdout, b"hello\n");
    frame(&mut exec, FrameKind::Stderr, b"warning\n");
    frame(&mut exec, FrameKind::Stdout, b"world\n");
    response(&mut exec, &Response::Exit(ExitStatus { code: Some(0), signal: None, timed_out: false, duration_ms: 5 }));
    c.put_mode("agent_frames_host", "exec", 1, &exec);
    c.put_mode("agent_frames_host", "exec-stdin", 2, &exec);
    let mut read = Vec::new();
    frame(&mut read, FrameKind::Data, b"file ");
    frame(&mut read, FrameKind::Data, b"bytes");
    response(&mut read, &Response::ReadDone { bytes: 10 });
    c.put_mode("agent_frames_host", "read-file", 3, &read);
    c.put_mode("agent_frames_host", "write-file", 4, &one(Response::Written { bytes: 10 }));
    let entries = vec![info("bin", FileType::Dir), info("a.txt", FileType::File), info("l", FileType::Symlink)];
    c.put_mode("agent_frames_host", "list", 5, &one(Response::Entries { entries }));
    c.put_mode("agent_frames_host", "stat", 6, &one(Response::Stat(info("/", FileType::Dir))));
    c.put_mode("agent_frames_host", "mkdir", 7, &one(Response::Done));
    let err = AgentError { kind: ErrorKind::NotFound, message: "remove /tmp/d: not found".into(), errno: Some(2) };
    c.put_mode("agent_frames_host", "remove-error", 8, &one(Response::Error(err)));
    let eval = EvalResponse {
        outcome: EvalOutcome::Exception { exception: "ZeroDivisionError".into(), traceback: "Traceback".into() },
        stdout: "x\n".into(),
        stderr: String::new(),
    };
    c.put_mode("agent_frames_host", "eval", 9, &one(Response::Eval(eval)));
    let applied = IdentityApplied { generation: 3, entropy: forkvm_proto::EntropyOutcome::Credited, timings: None };
    c.put_mode("agent_frames_host", "identity", 10, &one(Response::Identity(applied)));
    c.put_mode("agent_frames_host", "shutdown", 11, &one(Response::ShuttingDown));
    let mut raw = Vec::new();
    let pe = ProtocolError {
        code: ProtocolErrorCode::Malformed,
        message: "malformed Request frame payload".into(),
        agent_protocol_version: 1,
    };
    write_json(&mut raw, FrameKind::Error, &pe).unwrap();
    let report = r#"{"level":"avx","advertised":"avx512","xcr0":"e7","kernel_xfeatures":null,"processes":4,
"switches":3000,"classes":[{"class":"xmm","checked":3000,"wrong":0},{"class":"ymm_upper","checked":3000,"wrong":12}]}"#;
    frame(&mut raw, FrameKind::Stdout, report.as_bytes());
    response(&mut raw, &Response::Done);
    c.put_mode("agent_frames_host", "raw-frames", 12, &raw);
    let mut watch = Vec::new();
    for m in [
        WatchMessage::Armed { directories: 2 },
        WatchMessage::Change { kind: ChangeKind::Create, path: "a/b".into() },
        WatchMessage::Keepalive,
        WatchMessage::Overflow,
        WatchMessage::Change { kind: ChangeKind::Remove, path: "a/b".into() },
    ] {
        write_json(&mut watch, FrameKind::Watch, &m).unwrap();
    }
    response(&mut watch, &Response::Done);
    c.put_mode("agent_frames_host", "watch", 13, &watch);
    let proc_info = |exit: Option<ExitStatus>| ProcInfo {
        pid: 7,
        argv: vec!["/bin/sh".into(), "-c".into(), "make".into()],
        tag: Some("build".into()),
        pty: Some(PtySize { rows: 24, cols: 80 }),
        started_at_unix_ms: 1_764_500_000_000,
        output_end: 12,
        output_start: 0,
        stdin_open: exit.is_none(),
        exit,
    };
    let mut attach = Vec::new();
    write_json(&mut attach, FrameKind::ProcNews, &ProcNews::Attached { offset: 0, skipped: 3 }).unwrap();
    frame(&mut attach, FrameKind::Stdout, b"compiling\n");
    write_json(&mut attach, FrameKind::ProcNews, &ProcNews::Keepalive).unwrap();
    frame(&mut attach, FrameKind::Stderr, b"ok");
    let ended = ExitStatus { code: Some(2), signal: None, timed_out: false, duration_ms: 9 };
    response(&mut attach, &Response::Proc(proc_info(Some(ended))));
    c.put_mode("agent_frames_host", "proc-attach", 14, &attach);
    let mut calls = Vec::new();
    response(&mut calls, &Response::Proc(proc_info(None)));
    c.put_mode("agent_frames_host", "proc-start", 15, &calls);
    c.put_mode("agent_frames_host", "proc-list", 15, &one(Response::Procs { procs: vec![proc_info(None)] }));
}

fn agent_guest(c: &mut Corpus) {
    let req = |r: &Request| {
        let mut out = Vec::new();
        write_json(&mut out, FrameKind::Request, r).unwrap();
        out
    };
    c.put("agent_frames_guest", "ping", &req(&Request::Ping));
    let mut exec = ExecRequest::argv(["sh", "-c", "cat"]);
    exec.env = vec![("A".into(), "1".into())];
    exec.cwd = Some("/tmp".into());
    exec.stdin = true;
    exec.timeout_ms = Some(5000);
    let mut s = req(&Request::Exec(exec));
    frame(&mut s, FrameKind::Stdin, b"input line\n");
    frame(&mut s, FrameKind::Stdin, b"more");
    frame(&mut s, FrameKind::End, b"");
    c.put("agent_frames_guest", "exec-stdin", &s);
    c.put(
        "agent_frames_guest",
        "exec-shell",
        &req(&Request::Exec(ExecRequest { command: Command::Shell("ls /".into()), ..ExecRequest::shell("") })),
    );
    let mut w = req(&Request::WriteFile(WriteFileRequest {
        path: "/tmp/f".into(),
        mode: Some(0o600),
        create_parents: true,
        owner: None,
    }));
    frame(&mut w, FrameKind::Data, b"contents");
    frame(&mut w, FrameKind::End, b"");
    c.put("agent_frames_guest", "write-file", &w);
    c.put("agent_frames_guest", "read-file", &req(&Request::ReadFile { path: "/etc/hostname".into() }));
    c.put("agent_frames_guest", "tar", &req(&Request::Tar { path: "/etc".into() }));
    c.put("agent_frames_guest", "hash-file", &req(&Request::HashFile { path: "/etc/hostname".into() }));
    c.put("agent_frames_guest", "list", &req(&Request::List { path: "/".into() }));
    c.put("agent_frames_guest", "stat", &req(&Request::Stat { path: "/bin".into() }));
    c.put(
        "agent_frames_guest",
        "mkdir",
        &req(&Request::Mkdir(MkdirRequest { path: "/tmp/a/b".into(), parents: true, mode: Some(0o700), owner: None })),
    );
    c.put("agent_frames_guest", "remove", &req(&Request::Remove { path: "/tmp/a".into(), recursive: true }));
    c.put("agent_frames_guest", "eval", &req(&Request::Eval { code: "import os\nos.getpid()".into() }));
    let identity = IdentityRequest {
        sandbox_id: "sb-7".into(),
        hostname: "sandbox-7".into(),
        wall_clock_unix_ns: 1_764_500_000_000_000_000,
        entropy: (0..32).collect(),
        interpreter_seed: Vec::new(),
    };
    c.put("agent_frames_guest", "identity", &req(&Request::Identity(identity)));
    c.put("agent_frames_guest", "shutdown", &req(&Request::Shutdown));
    c.put("agent_frames_guest", "watch", &req(&Request::Watch(WatchRequest { path: "/tmp".into(), recursive: true })));
    let start = ProcStartRequest {
        command: Command::Shell("make -j4".into()),
        env: vec![("TERM".into(), "xterm".into())],
        cwd: Some("/work".into()),
        user: Some("user".into()),
        pty: Some(PtySize { rows: 24, cols: 80 }),
        tag: Some("build".into()),
        ring_bytes: Some(1 << 20),
        timeout_ms: Some(60_000),
    };
    c.put("agent_frames_guest", "proc-start", &req(&Request::ProcStart(start)));
    c.put("agent_frames_guest", "proc-list", &req(&Request::ProcList));
    let attach = ProcAttachRequest { pid: 7, offset: Some(12), follow: true };
    c.put("agent_frames_guest", "proc-attach", &req(&Request::ProcAttach(attach)));
    let mut input = req(&Request::ProcInput(ProcInputRequest { pid: 7, close: true }));
    frame(&mut input, FrameKind::Stdin, b"ls\r");
    frame(&mut input, FrameKind::End, b"");
    c.put("agent_frames_guest", "proc-input", &input);
    let resize = ProcResizeRequest { pid: 7, size: PtySize { rows: 50, cols: 132 } };
    c.put("agent_frames_guest", "proc-resize", &req(&Request::ProcResize(resize)));
    let mut wrong = Vec::new();
    frame(&mut wrong, FrameKind::Stdin, b"not a request");
    c.put("agent_frames_guest", "wrong-kind", &wrong);
}

// ------------------------------------------------------------------ control messages

fn control(c: &mut Corpus) {
    let lines = [
        r#"{"op":"status"}"#,
        r#"{"op":"pause"}"#,
        r#"{"op":"resume"}"#,
        r#"{"op":"snapshot","dir":"/var/lib/forkvm/snapshots/t1"}"#,
        r#"{"op":"send_input","hex":"6c730a"}"#,
        r#"{"op":"branch","store":"/store/snapshots","tag":"b-1","mode":"live","wait":false,"disks":"reference"}"#,
        r#"{"op":"fork","children":[{"socket":"/run/c1.sock","console_log":"/run/c1.log","vsock_uds":"/run/c1.v","labels":{"sandbox_id":"c1","template":"python"},"run_dir":"/run/c1","cgroup":"forkvm/c1","disk_dir":"/run/c1/disks"}]}"#,
        r#"{"op":"label","sandbox_id":"sb-1","template":"tiny"}"#,
        r#"{"op":"seal_disks"}"#,
        r#"{"op":"lazy_disks","finish_recording":true}"#,
        r#"{"op":"record_memory_playbook","path":"/store/playbooks/python.mem"}"#,
        r#"{"op":"compact_disks","covered":[{"disk":"forkvm-data","layer":"47f1b771249791fe3978e68070ee1d46"}],"min_layers":3}"#,
        r#"{"op":"inject_fault","point":"write_memory"}"#,
        r#"{"op":"pause","extra":1}"#,
    ];
    c.put("control_messages", "requests", (lines.join("\n") + "\n").as_bytes());
    c.put("control_messages", "shutdown", b"{\"op\":\"status\"}\n{\"op\":\"shutdown\"}\n{\"op\":\"status\"}\n");
    let responses = [
        r#"{"ok":true,"result":{"state":"running","vcpus":1,"mem_size_bytes":268435456}}"#,
        r#"{"ok":false,"error":"branch tag \"x\": a snapshot with this tag already exists","code":"conflict"}"#,
        r#"{"ok":true,"result":null}"#,
    ];
    c.put("control_messages", "responses", (responses.join("\n") + "\n").as_bytes());
}

// ------------------------------------------------------------------------------ virtio

fn rng_input() -> Vec<u8> {
    let mut b = Builder::new(1, 8);
    let (x, y) = (b.buffer(64), b.buffer(32));
    b.chain(0, &[(x, 64, true), (y, 32, true)]);
    let r = b.data(b"readable");
    let z = b.buffer(16);
    b.chain(0, &[(r, 8, false), (z, 16, true)]);
    b.encode()
}

/// virtio-blk request header: type, reserved, sector.
fn blk_header(kind: u32, sector: u64) -> Vec<u8> {
    [&kind.to_le_bytes()[..], &0u32.to_le_bytes(), &sector.to_le_bytes()].concat()
}

fn blk_input(device_byte: u8) -> Vec<u8> {
    let mut b = Builder::new(1, 16);
    b.device_byte = device_byte;
    // OUT: header, 2 sectors of data, status.
    let h = b.data(&blk_header(1, 3));
    let d = b.data(&[0x5a; 1024]);
    let s = b.buffer(1);
    b.chain(0, &[(h, 16, false), (d, 1024, false), (s, 1, true)]);
    // IN: header, 1 sector split over two buffers, status.
    let h = b.data(&blk_header(0, 3));
    let (d1, d2, s) = (b.buffer(256), b.buffer(256), b.buffer(1));
    b.chain(0, &[(h, 16, false), (d1, 256, true), (d2, 256, true), (s, 1, true)]);
    // FLUSH.
    let h = b.data(&blk_header(4, 0));
    let s = b.buffer(1);
    b.chain(0, &[(h, 16, false), (s, 1, true)]);
    // GET_ID.
    let h = b.data(&blk_header(8, 0));
    let (d, s) = (b.buffer(20), b.buffer(1));
    b.chain(0, &[(h, 16, false), (d, 20, true), (s, 1, true)]);
    b.op(3, 0, 0, 4); // re-post all four
    b.encode()
}

/// A vsock packet header (virtio 1.2 §5.10.6).
#[allow(clippy::too_many_arguments)]
fn vsock_hdr(src_port: u32, dst_port: u32, len: u32, op: u16, flags: u32, buf_alloc: u32, fwd_cnt: u32) -> Vec<u8> {
    [
        &3u64.to_le_bytes()[..],
        &2u64.to_le_bytes(),
        &src_port.to_le_bytes(),
        &dst_port.to_le_bytes(),
        &len.to_le_bytes(),
        &1u16.to_le_bytes(),
        &op.to_le_bytes(),
        &flags.to_le_bytes(),
        &buf_alloc.to_le_bytes(),
        &fwd_cnt.to_le_bytes(),
    ]
    .concat()
}

fn vsock_input(host_closes: bool) -> Vec<u8> {
    let mut b = Builder::new(3, 16);
    b.flags = 0x10; // a transport reset is owed, as after a restore
    for _ in 0..6 {
        let rx = b.buffer(44 + 256);
        b.chain(0, &[(rx, 44 + 256, true)]);
    }
    let ev = b.buffer(8);
    b.chain(2, &[(ev, 8, true)]);
    // Connect to the service on port 1234, send data, ask for credit, shut down.
    let req = b.data(&vsock_hdr(5000, 1234, 0, 1, 0, 65536, 0));
    b.chain(1, &[(req, 44, false)]);
    let rw = b.data(&vsock_hdr(5000, 1234, 5, 5, 0, 65536, 0));
    let payload = b.data(b"hello");
    b.chain(1, &[(rw, 44, false), (payload, 5, false)]);
    let credit = b.data(&vsock_hdr(5000, 1234, 0, 7, 0, 65536, 0));
    b.chain(1, &[(credit, 44, false)]);
    // A connection to a port where nothing listens (answered with RST).
    let nobody = b.data(&vsock_hdr(5001, 99, 0, 1, 0, 65536, 0));
    b.chain(1, &[(nobody, 44, false)]);
    // Held back until the host has answered.
    let shutdown = b.data(&vsock_hdr(5000, 1234, 0, 4, 3, 65536, 5));
    b.chain(1, &[(shutdown, 44, false)]);
    b.hold(1, 1);
    b.op(1, 0, 0, 0x0400_6968); // the service writes "hi\0\x04"
    b.op(1, 0, 1, 0); // host_io on every stream
    b.op(0, 0, 0, 0); // process the queues: "hi\0\x04" goes to the guest
    if host_closes {
        b.op(1, 0, 2, 0); // the service hangs up
        b.op(2, 0, 0, 0); // host_io and process: the guest is told
    }
    b.op(3, 1, 0, 1); // the guest's shutdown
    b.op(2, 0, 0, 0);
    b.encode()
}

fn virtio(c: &mut Corpus) {
    c.put("virtio_rng", "two-chains", &rng_input());
    let mut b = Builder::new(1, 4);
    let big = b.buffer(16);
    b.chain(0, &[(big, 1 << 20, true)]); // longer than the cap and than memory
    b.op(1, 0, 0x70, 0); // reset through the status register
    b.op(0, 0, 0, 0);
    c.put("virtio_rng", "oversized-and-reset", &b.encode());

    c.put("virtio_blk", "out-in-flush-getid", &blk_input(0));
    c.put("virtio_blk", "read-only", &blk_input(1));
    c.put("virtio_blk", "layered", &blk_input(2));
    c.put("virtio_blk", "tail-sector", &blk_input(8));

    c.put("virtio_vsock", "connect-rw-credit-shutdown", &vsock_input(false));
    c.put("virtio_vsock", "host-hangs-up", &vsock_input(true));
}

// -------------------------------------------------------------------------------- rest

fn rest(c: &mut Corpus) {
    let bodies = [
        ("create-snapshot", r#"{"tag":"py-1","template":"python"}"#),
        ("compact-snapshot", r#"{"to":"flat-1"}"#),
        (
            "create-sandbox",
            r#"{"snapshot_tag":"py-1","n":2,"memory_limit_mib":512,"per_child_netns":false,"prewarm":true,"live_fork":false,"hugepages":false,"ttl_seconds":600}"#,
        ),
        ("fork-sandbox", r#"{"n":3,"memory_limit_mib":256,"ttl_seconds":0}"#),
        (
            "branch-sandbox",
            r#"{"tag":"b-1","mode":"diff","live":false,"diff":true,"measure_diff":true,"wait":false,"parent_tag":"py-1"}"#,
        ),
        (
            "exec",
            r#"{"args":["python3","-c","print(1)"],"timeout_secs":10,"env":{"A":"1"},"cwd":"/root","stdin":"x","max_output_bytes":65536}"#,
        ),
        ("exec-cmd", r#"{"cmd":"ls -la /","timeout_secs":5}"#),
        ("eval", r#"{"code":"1 + 1"}"#),
        ("disk-snapshot", r#"{"keep_last":3,"keep_hourly":24,"keep_daily":7}"#),
        ("restore", r#"{"ttl_seconds":3600}"#),
        ("disk-fork", r#"{"seq":4,"memory_limit_mib":512,"ttl_seconds":60,"restore":"lazy_playbook"}"#),
        ("set-ttl", r#"{"ttl_seconds":120}"#),
        ("empty", ""),
        ("unknown-field", r#"{"tag":"t","template":"tiny","extra":true}"#),
        ("names", r#"{"tag":"a..b","to":"x.partial","k":["0123456789abcdef0123456789abcdef",".hidden","../up"]}"#),
    ];
    for (name, body) in bodies {
        c.put("rest_bodies", name, body.as_bytes());
    }
}

// -------------------------------------------------------------------------------- oci

fn oci(c: &mut Corpus, tmp: &Path) {
    use forkvm_image::oci::writer::{ImageSpec, LayerBuilder};
    let layer = || {
        LayerBuilder::new()
            .dir("etc", 0o755, 0)?
            .file("etc/a", b"a", 0o644, 0)?
            .whiteout("etc/a")?
            .file("opt/x", b"x", 0o644, 1000)?
            .opaque("opt")?
            .symlink("out", "/")?
            .file("out/etc/through", b"t", 0o644, 0)?
            .symlink("up", "../../..")?
            .file("up/x", b"u", 0o644, 0)?
            .hard_link("etc/h", "opt/x")?
            .symlink("var/run", "/run")?
            .file("var/run/pid", b"1", 0o644, 0)
    };
    let plain = layer().unwrap().finish().unwrap();
    c.put_mode("oci_image", "layer", 0, &plain);
    c.put_mode("oci_image", "layer-gzip", 2, &layer().unwrap().finish_gzip().unwrap());
    let small = LayerBuilder::new().file("bin/x", b"x", 0o755, 0).unwrap().finish().unwrap();
    let spec = ImageSpec { layers: vec![small], config: serde_json::json!({"Env": ["A=1"], "User": "1000"}) };
    let path = tmp.join("docker-save.tar");
    spec.write_docker_save(&path, "x:1").unwrap();
    c.put_mode("oci_image", "docker-save", 1, &std::fs::read(&path).unwrap());
    spec.write_oci_archive(&path).unwrap();
    c.put_mode("oci_image", "oci-archive", 3, &std::fs::read(&path).unwrap());
}

// -------------------------------------------------------------------------- emulation

fn x86(c: &mut Corpus) {
    // XSAVE64 [rbx] / XRSTOR64 [rbx] with RAX = 7 (x87, SSE, AVX), RBX = 0x10000.
    for (name, insn) in [("xsave64", [0x48u8, 0x0f, 0xae, 0x23]), ("xrstor64", [0x48, 0x0f, 0xae, 0x2b])] {
        let mut s = Vec::new();
        let mut bytes = [0x90u8; 16];
        bytes[..4].copy_from_slice(&insn);
        s.extend_from_slice(&bytes);
        for v in [7u64, 0, 0, 0x10000] {
            s.extend_from_slice(&v.to_le_bytes());
        }
        s.push(1 | 2 | 8); // paging, WP, OSXSAVE, CPL 0
        s.push(1); // CR3 = page 1
        for v in [0u64, 0, 7] {
            s.extend_from_slice(&v.to_le_bytes()); // FS, GS, XCR0
        }
        let mut pte = |page: u16, index: u16, value: u64| {
            s.extend_from_slice(&((page << 9) | index).to_le_bytes());
            s.extend_from_slice(&value.to_le_bytes());
        };
        pte(1, 0, 0x2000 | 7); // PML4[0] -> PDPT
        pte(2, 0, 0x3000 | 7); // PDPT[0] -> PD
        pte(3, 0, 0x4000 | 7); // PD[0] -> PT
        for i in 16..18 {
            pte(4, i, (u64::from(i) << 12) | 7); // identity-map the area's pages
        }
        c.put("x86_emulation", name, &s);
    }
    let mut gs = vec![0x65u8, 0x0f, 0xae, 0x64, 0x8d, 0x40];
    gs.resize(16, 0x90);
    c.put("x86_emulation", "gs-sib-disp8", &gs);
    let mut xgetbv = vec![0x0f, 0x01, 0xd0];
    xgetbv.resize(16, 0x90);
    c.put("x86_emulation", "xgetbv", &xgetbv);
}
