//! virtio-blk tests through the MMIO transport against a temporary image file.

use super::*;
use crate::devices::virtio::mmio::{MmioTransport, MmioTransportState};
use crate::devices::virtio::test_utils::{bring_up, notify, reg_read, test_memory, CountingInterrupt, Desc, TestQueue};
use crate::devices::virtio::VirtioDeviceState;
use std::io::Write;
use std::sync::Arc;
use tempfile::NamedTempFile;
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

const HEADER: u64 = 0x10000;
const DATA: u64 = 0x20000;
const STATUS: u64 = 0x30000;

struct Rig {
    image: NamedTempFile,
    mem: GuestMemoryMmap,
    irq: Arc<CountingInterrupt>,
    t: MmioTransport,
    q: TestQueue,
}

/// An image of `sectors` sectors, each filled with its own sector number.
fn rig(sectors: u64, read_only: bool) -> Rig {
    let mut image = NamedTempFile::new().unwrap();
    for s in 0..sectors {
        image.write_all(&[s as u8; SECTOR_SIZE as usize]).unwrap();
    }
    let block = Block::new(image.path(), read_only, "forkvm-disk-0").unwrap();
    let mem = test_memory();
    let irq = Arc::new(CountingInterrupt::default());
    let mut t = MmioTransport::new(Box::new(block), mem.clone(), irq.clone());
    let q = TestQueue::new(GuestAddress(0), 16);
    bring_up(&mut t, std::slice::from_ref(&q));
    Rig { image, mem, irq, t, q }
}

impl Rig {
    /// Posts one request with `data` as its data descriptors; returns (status, used len).
    fn submit(&mut self, kind: u32, sector: u64, data: &[Desc]) -> (u8, u32) {
        self.mem.write_obj(kind.to_le(), GuestAddress(HEADER)).unwrap();
        self.mem.write_obj(sector.to_le(), GuestAddress(HEADER + 8)).unwrap();
        self.mem.write_obj(0xffu8, GuestAddress(STATUS)).unwrap();
        let mut chain = vec![Desc::r(HEADER, 16)];
        chain.extend_from_slice(data);
        chain.push(Desc::w(STATUS, 1));
        let head = self.q.add_chain(&self.mem, &chain);
        let before = self.q.used_idx(&self.mem);
        notify(&mut self.t, 0);
        assert_eq!(self.q.used_idx(&self.mem), before.wrapping_add(1));
        let (id, len) = self.q.used_elem(&self.mem, before);
        assert_eq!(id, u32::from(head));
        (self.mem.read_obj(GuestAddress(STATUS)).unwrap(), len)
    }

    fn guest(&self, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        self.mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }
}

#[test]
fn config_space_holds_capacity_and_features_match_mode() {
    let mut r = rig(8, true);
    let low = reg_read(&mut r.t, 0x100);
    let high = reg_read(&mut r.t, 0x104);
    assert_eq!(u64::from(low) | (u64::from(high) << 32), 8);
    let features = r.t.device().device_features();
    assert_ne!(features & F_RO, 0);
    assert_ne!(features & F_FLUSH, 0);
    assert_eq!(rig(8, false).t.device().device_features() & F_RO, 0);
}

#[test]
fn write_read_flush_round_trip() {
    let mut r = rig(16, false);
    let pattern: Vec<u8> = (0..1536u32).map(|i| (i * 7 + 3) as u8).collect();
    r.mem.write_slice(&pattern[..512], GuestAddress(DATA)).unwrap();
    r.mem.write_slice(&pattern[512..], GuestAddress(DATA + 0x1000)).unwrap();
    assert_eq!(r.submit(T_OUT, 5, &[Desc::r(DATA, 512), Desc::r(DATA + 0x1000, 1024)]), (S_OK, 1));
    assert_eq!(r.submit(T_FLUSH, 0, &[]), (S_OK, 1));

    // The file holds exactly the written bytes; its neighbours are untouched.
    let file = std::fs::read(r.image.path()).unwrap();
    assert_eq!(&file[5 * 512..8 * 512], &pattern[..]);
    assert_eq!(file[5 * 512 - 1], 4);
    assert_eq!(file[8 * 512], 8);
    assert_eq!(file.len(), 16 * 512);

    // Reading back into a differently split buffer gives the same bytes.
    let (status, len) = r.submit(T_IN, 4, &[Desc::w(0x50000, 1024), Desc::w(0x60000, 1024)]);
    assert_eq!((status, len), (S_OK, 2049));
    assert_eq!(r.guest(0x50000, 512), vec![4u8; 512]);
    let mut back = r.guest(0x50000 + 512, 512);
    back.extend(r.guest(0x60000, 1024));
    assert_eq!(back, pattern);
    assert_eq!(r.irq.count(), 3);
}

#[test]
fn read_only_disk_refuses_writes() {
    let mut r = rig(4, true);
    let before = std::fs::read(r.image.path()).unwrap();
    r.mem.write_slice(&[0xaa; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(r.submit(T_OUT, 1, &[Desc::r(DATA, 512)]).0, S_IOERR);
    assert_eq!(std::fs::read(r.image.path()).unwrap(), before);
    assert_eq!(r.submit(T_IN, 1, &[Desc::w(DATA, 512)]), (S_OK, 513));
    assert_eq!(r.guest(DATA, 512), vec![1u8; 512]);
    assert_eq!(r.submit(T_FLUSH, 0, &[]).0, S_OK);
}

#[test]
fn out_of_range_sectors_are_io_errors() {
    let mut r = rig(4, false);
    assert_eq!(r.submit(T_IN, 4, &[Desc::w(DATA, 512)]).0, S_IOERR);
    assert_eq!(r.submit(T_IN, 3, &[Desc::w(DATA, 1024)]).0, S_IOERR, "straddles the end");
    assert_eq!(r.submit(T_OUT, u64::MAX, &[Desc::r(DATA, 512)]).0, S_IOERR, "overflowing sector");
    assert_eq!(r.submit(T_IN, 3, &[Desc::w(DATA, 512)]).0, S_OK, "last sector is fine");
    assert_eq!(r.submit(T_IN, 0, &[Desc::w(0x1_0000_0000, 512)]).0, S_IOERR, "buffer outside guest memory");
    assert_eq!(r.submit(T_IN, 0, &[Desc::w(DATA, 100)]).0, S_IOERR, "partial sector");
}

#[test]
fn get_id_and_unsupported_types() {
    let mut r = rig(4, false);
    let (status, len) = r.submit(T_GET_ID, 0, &[Desc::w(DATA, 64)]);
    assert_eq!((status, len), (S_OK, 21));
    let mut want = b"forkvm-disk-0".to_vec();
    want.resize(BLOCK_ID_BYTES, 0);
    assert_eq!(r.guest(DATA, BLOCK_ID_BYTES), want);
    assert_eq!(r.submit(0x77, 0, &[]).0, S_UNSUPP);
    let m = match r.t.device().save() {
        VirtioDeviceState::Block(s) => s,
        _ => panic!("not a block state"),
    };
    assert_eq!(m.id, "forkvm-disk-0");
}

#[test]
fn chain_without_status_byte_is_used_with_zero_length() {
    let mut r = rig(4, false);
    r.q.add_chain(&r.mem, &[Desc::r(HEADER, 16)]);
    notify(&mut r.t, 0);
    assert_eq!(r.q.used_idx(&r.mem), 1);
    assert_eq!(r.q.used_elem(&r.mem, 0).1, 0);
    // And the queue still works afterwards.
    assert_eq!(r.submit(T_IN, 0, &[Desc::w(DATA, 512)]).0, S_OK);
}

#[test]
fn new_reports_clear_errors() {
    let missing = Block::new(std::path::Path::new("/nonexistent/disk.img"), true, "x");
    assert!(matches!(missing, Err(BlockError::OpenImage { .. })));
    let image = NamedTempFile::new().unwrap();
    let long = Block::new(image.path(), true, "this-serial-is-too-long-for-virtio");
    assert!(matches!(long, Err(BlockError::IdTooLong(_))));
    std::fs::write(image.path(), vec![0u8; 1000]).unwrap();
    assert_eq!(Block::new(image.path(), true, "x").unwrap().capacity(), 1, "partial sector dropped");
}

#[test]
fn save_restore_save_round_trip() {
    let mut r = rig(8, false);
    r.mem.write_slice(&[0x5a; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(r.submit(T_OUT, 2, &[Desc::r(DATA, 512)]).0, S_OK);

    let saved = r.t.save();
    let bytes = bincode::serialize(&saved).unwrap();
    let saved: MmioTransportState = bincode::deserialize(&bytes).unwrap();
    let VirtioDeviceState::Block(ref state) = saved.device else { panic!("not a block state") };
    assert_eq!((state.capacity, state.read_only), (8, false));
    let device = Block::restore(r.image.path(), state).unwrap();
    let mut restored = MmioTransport::restore(&saved, Box::new(device), r.mem.clone(), r.irq.clone()).unwrap();
    assert_eq!(restored.save(), saved);

    // The restored device reads what the original wrote, continuing the same rings.
    r.t = restored;
    assert_eq!(r.submit(T_IN, 2, &[Desc::w(0x50000, 512)]), (S_OK, 513));
    assert_eq!(r.guest(0x50000, 512), vec![0x5a; 512]);
    restored = r.t;
    assert_eq!(restored.save().queues[0].next_used, 2);
}

#[test]
fn restore_rejects_a_resized_image() {
    let r = rig(8, false);
    let VirtioDeviceState::Block(mut state) = r.t.device().save() else { panic!("not a block state") };
    state.capacity = 9;
    assert!(matches!(Block::restore(r.image.path(), &state), Err(BlockError::RestoreCapacity { .. })));
    state.capacity = 8;
    state.acked_features |= 1 << 50;
    assert!(matches!(Block::restore(r.image.path(), &state), Err(BlockError::RestoreFeatures { .. })));
}

/// A transport around a layered disk over `base` (sealed layers `sealed`, top in `top`).
fn layered_transport(
    r: &Rig,
    base: &std::path::Path,
    sealed: &[std::path::PathBuf],
    top: &std::path::Path,
) -> MmioTransport {
    let block = Block::layered(base, sealed, top, "forkvm-data").unwrap();
    let mut t = MmioTransport::new(Box::new(block), r.mem.clone(), r.irq.clone());
    bring_up(&mut t, std::slice::from_ref(&r.q));
    t
}

#[test]
fn a_layered_disk_writes_its_top_seals_and_leaves_the_base_alone() {
    let mut r = rig(64, false);
    let base_before = std::fs::read(r.image.path()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let base = r.image.path().to_path_buf();
    r.t = layered_transport(&r, &base, &[], &dir.path().join("top-0"));
    assert_eq!(r.t.device().device_features() & F_RO, 0, "a layered disk is writable");
    assert!(!dir.path().join("top-0").exists(), "no files before the first write");

    // Unwritten sectors read from the base; a write of one sector lands in the top.
    assert_eq!(r.submit(T_IN, 9, &[Desc::w(0x50000, 512)]), (S_OK, 513));
    assert_eq!(r.guest(0x50000, 512), vec![9u8; 512]);
    r.mem.write_slice(&[0xa5; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(r.submit(T_OUT, 9, &[Desc::r(DATA, 512)]).0, S_OK);
    assert_eq!(r.submit(T_FLUSH, 0, &[]).0, S_OK);
    assert_eq!(std::fs::read(&base).unwrap(), base_before, "the base is never written");
    assert_eq!(r.submit(T_IN, 8, &[Desc::w(0x50000, 1024)]).0, S_OK);
    assert_eq!(r.guest(0x50000, 512), vec![8u8; 512], "the rest of the 4 KiB block was copied up");
    assert_eq!(r.guest(0x50000 + 512, 512), vec![0xa5; 512]);

    // Seal: the written block becomes a sealed layer; an untouched top seals to nothing.
    let block = r.t.device_mut().as_block_mut().unwrap();
    let sealed = block.seal(&dir.path().join("top-1")).unwrap().expect("the top had a block");
    assert_eq!((sealed.dir.clone(), sealed.blocks), (dir.path().join("top-0"), 1));
    assert!(block.seal(&dir.path().join("top-2")).unwrap().is_none(), "nothing new to seal");
    let VirtioDeviceState::Block(state) = r.t.device().save() else { panic!("not a block state") };
    assert_eq!(state.layers, Some(vec![sealed.id.to_string()]));

    // A restore must be given exactly those layers: none (or a raw image) is refused.
    let fresh = Block::layered(&base, &[], &dir.path().join("other"), "forkvm-data").unwrap();
    let err = fresh.with_state(&state).unwrap_err();
    assert!(matches!(err, BlockError::RestoreLayers { .. }), "{err}");
    assert!(Block::restore(&base, &state).is_err(), "a raw image is not the layered disk");
    let child = Block::layered(&base, std::slice::from_ref(&sealed.dir), &dir.path().join("child"), "forkvm-data")
        .unwrap()
        .with_state(&state)
        .unwrap();
    let mut ct = MmioTransport::new(Box::new(child), r.mem.clone(), r.irq.clone());
    bring_up(&mut ct, std::slice::from_ref(&r.q));
    r.t = ct;
    assert_eq!(r.submit(T_IN, 9, &[Desc::w(0x50000, 512)]).0, S_OK);
    assert_eq!(r.guest(0x50000, 512), vec![0xa5; 512], "a child on the sealed layer sees the write");
}

/// A vault snapshot of a layered disk over the rig's image whose sectors 9 and 40 were
/// written (0xa5, 0x5a); returns (vault dir, seq).
fn vault_snapshot(r: &mut Rig, dir: &std::path::Path) -> (std::path::PathBuf, u64) {
    use forkvm_snapshot::vault::{DiskInput, SandboxKey, Vault};
    let base = r.image.path().to_path_buf();
    r.t = layered_transport(r, &base, &[], &dir.join("src-top-0"));
    for (sector, byte) in [(9, 0xa5u8), (40, 0x5a)] {
        r.mem.write_slice(&[byte; 512], GuestAddress(DATA)).unwrap();
        assert_eq!(r.submit(T_OUT, sector, &[Desc::r(DATA, 512)]).0, S_OK);
    }
    let block = r.t.device_mut().as_block_mut().unwrap();
    let sealed = block.seal(&dir.join("src-top-1")).unwrap().unwrap();
    let vault_dir = dir.join("vault");
    let vault = Vault::open(&vault_dir, SandboxKey::from_bytes([7; 32])).unwrap();
    let input = DiskInput { id: "forkvm-data".into(), base_key: "test-base".into(), layers: vec![sealed.dir] };
    (vault_dir, vault.snapshot(&[input]).unwrap().seq)
}

fn lazy_source(dir: &std::path::Path, vault: &std::path::Path, seq: u64, cache: &str, prefetch: bool) -> LazySource {
    LazySource {
        vault: vault.to_path_buf(),
        key: forkvm_snapshot::vault::SandboxKey::from_bytes([7; 32]),
        seq,
        disk_id: "forkvm-data".into(),
        cache: dir.join(cache),
        playbook: Some(dir.join("playbooks/t/forkvm-data.playbook")),
        prefetch,
    }
}

/// What the VMM's caller does with a report that ended the recording: merges its first
/// reads into the source's playbook. Returns the runs the playbook has learned from.
fn learn(source: &LazySource, report: &mut LazyReport) -> u64 {
    use forkvm_snapshot::vault::lazy::{MergeRule, Playbook};
    let rec = report.take_recording().expect("the report that ended the recording carries the first reads");
    let path = source.playbook.as_ref().unwrap();
    Playbook::merge_into_file(path, report.size, &rec, &MergeRule::default()).unwrap().runs()
}

fn lazy_transport(r: &Rig, source: &LazySource, top: &std::path::Path) -> MmioTransport {
    let block = Block::layered_lazy(r.image.path(), source, &[], top, "forkvm-data").unwrap();
    let mut t = MmioTransport::new(Box::new(block), r.mem.clone(), r.irq.clone());
    bring_up(&mut t, std::slice::from_ref(&r.q));
    t
}

#[test]
fn a_lazily_restored_disk_fetches_on_read_learns_a_playbook_and_settles_into_an_ordinary_layer() {
    let mut r = rig(64, false);
    let dir = tempfile::tempdir().unwrap();
    let (vault, seq) = vault_snapshot(&mut r, dir.path());
    let source = lazy_source(dir.path(), &vault, seq, "cache-a", true);
    r.t = lazy_transport(&r, &source, &dir.path().join("top-0"));
    let block = r.t.device_mut().as_block_mut().unwrap();
    assert!(block.is_lazy());
    let first = block.lazy_report(false).unwrap();
    assert_eq!(
        (first.stats.filled_blocks, first.playbook_entries, first.stats.misses),
        (0, 0, 0),
        "nothing local, no playbook"
    );

    // Reads: the snapshot's sector through the lazy layer, the rest from the base.
    assert_eq!(r.submit(T_IN, 9, &[Desc::w(0x50000, 512)]), (S_OK, 513));
    assert_eq!(r.guest(0x50000, 512), vec![0xa5; 512]);
    assert_eq!(r.submit(T_IN, 3, &[Desc::w(0x50000, 512)]).0, S_OK);
    assert_eq!(r.guest(0x50000, 512), vec![3u8; 512], "not in the snapshot: the base");
    let block = r.t.device_mut().as_block_mut().unwrap();
    let mut after = block.lazy_report(true).unwrap();
    assert!(after.stats.misses >= 1 && after.stats.fetched_extents >= 1, "{after:?}");
    assert_eq!(after.first_reads.as_ref().map(Vec::len), Some(1), "one extent read first: {after:?}");
    assert_eq!(after.size, r.image.as_file().metadata().unwrap().len());
    assert_eq!(learn(&source, &mut after), 1);
    assert!(source.playbook.as_ref().unwrap().is_file(), "the VMM wrote no playbook; its caller did");
    let again = block.lazy_report(true).unwrap();
    assert_eq!(again.first_reads, None, "the first reads are handed out once");

    // A write, then a settle: the cache becomes the first sealed layer; nothing changes
    // for the guest, and the disk seals and captures like any layered disk.
    r.mem.write_slice(&[0x11; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(r.submit(T_OUT, 41, &[Desc::r(DATA, 512)]).0, S_OK);
    let block = r.t.device_mut().as_block_mut().unwrap();
    let settled = block.settle_lazy().unwrap().expect("it was lazy");
    assert_eq!(settled, dir.path().join("cache-a"));
    assert!(!block.is_lazy() && block.lazy_report(false).is_none());
    assert_eq!(block.settle_lazy().unwrap(), None, "settling twice is a no-op");
    let sealed_top = block.seal(&dir.path().join("top-1")).unwrap().unwrap();
    let layers = block.sealed_layers().unwrap();
    assert_eq!(
        layers.iter().map(|(d, _)| d.clone()).collect::<Vec<_>>(),
        vec![settled.clone(), sealed_top.dir.clone()]
    );
    for (sector, byte) in [(9u64, 0xa5u8), (40, 0x5a), (41, 0x11), (5, 5)] {
        assert_eq!(r.submit(T_IN, sector, &[Desc::w(0x50000, 512)]).0, S_OK);
        assert_eq!(r.guest(0x50000, 512), vec![byte; 512], "sector {sector} after settling");
    }
    // The settled layers open as an ordinary disk without the vault.
    std::fs::remove_dir_all(&vault).unwrap();
    let plain = Block::layered(r.image.path(), &[settled, sealed_top.dir], &dir.path().join("plain"), "forkvm-data");
    r.t = {
        let mut t = MmioTransport::new(Box::new(plain.unwrap()), r.mem.clone(), r.irq.clone());
        bring_up(&mut t, std::slice::from_ref(&r.q));
        t
    };
    assert_eq!(r.submit(T_IN, 40, &[Desc::w(0x50000, 512)]).0, S_OK);
    assert_eq!(r.guest(0x50000, 512), vec![0x5a; 512]);
}

#[test]
fn a_lazy_restore_replays_the_saved_playbook_so_the_same_reads_hit() {
    let mut r = rig(64, false);
    let dir = tempfile::tempdir().unwrap();
    let (vault, seq) = vault_snapshot(&mut r, dir.path());
    // A first restore reads sector 40 and saves what it read.
    let source = lazy_source(dir.path(), &vault, seq, "cache-1", true);
    r.t = lazy_transport(&r, &source, &dir.path().join("a"));
    assert_eq!(r.submit(T_IN, 40, &[Desc::w(0x50000, 512)]).0, S_OK);
    let mut first = r.t.device_mut().as_block_mut().unwrap().lazy_report(true).unwrap();
    assert_eq!((first.stats.misses, learn(&source, &mut first)), (1, 1));

    // A stopped VM's lazy layer no longer pins the snapshot.
    let pinned = || {
        forkvm_snapshot::vault::Vault::open(&vault, forkvm_snapshot::vault::SandboxKey::from_bytes([7; 32]))
            .unwrap()
            .pins()
            .unwrap()
            .len()
    };
    assert_eq!(pinned(), 1);
    r.t.device_mut().shutdown();
    assert_eq!(pinned(), 0, "released at shutdown");

    // A second restore without prefetch misses again; one with prefetch finds it local.
    for (cache, prefetch, misses) in [("cache-2", false, 1), ("cache-3", true, 0)] {
        r.t = lazy_transport(
            &r,
            &lazy_source(dir.path(), &vault, seq, cache, prefetch),
            &dir.path().join(cache).with_extension("top"),
        );
        let block = r.t.device_mut().as_block_mut().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !block.lazy_report(false).unwrap().prefetch_done {
            assert!(std::time::Instant::now() < deadline, "the replay ends");
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        assert_eq!(r.submit(T_IN, 40, &[Desc::w(0x50000, 512)]).0, S_OK);
        assert_eq!(r.guest(0x50000, 512), vec![0x5a; 512]);
        let report = r.t.device_mut().as_block_mut().unwrap().lazy_report(false).unwrap();
        assert_eq!(report.stats.misses, misses, "{cache}: {report:?}");
        assert_eq!(report.playbook_entries, if prefetch { 1 } else { 0 }, "{report:?}");
    }
}

#[test]
fn a_lazy_disk_opened_ahead_reads_its_vault_once_the_vault_cannot_be_named() {
    let mut r = rig(64, false);
    let dir = tempfile::tempdir().unwrap();
    let (vault, seq) = vault_snapshot(&mut r, dir.path());
    let source = lazy_source(dir.path(), &vault, seq, "cache-ahead", false);
    lazy::preopen(&source);
    // What a VMM under its sandbox's uid finds: the vault's path leads nowhere.
    let moved = dir.path().join("vault-elsewhere");
    std::fs::rename(&vault, &moved).unwrap();
    r.t = lazy_transport(&r, &source, &dir.path().join("ahead-top"));
    for (sector, byte) in [(9u64, 0xa5u8), (40, 0x5a)] {
        assert_eq!(r.submit(T_IN, sector, &[Desc::w(0x50000, 512)]).0, S_OK);
        assert_eq!(r.guest(0x50000, 512), vec![byte; 512], "sector {sector} fetched through the open vault");
    }
    let report = r.t.device_mut().as_block_mut().unwrap().lazy_report(false).unwrap();
    assert_eq!(report.stats.misses, 2, "{report:?}");
    // Not opened ahead, the same source fails to open.
    let other = lazy_source(dir.path(), &vault, seq, "cache-late", false);
    assert!(Block::layered_lazy(r.image.path(), &other, &[], &dir.path().join("late-top"), "forkvm-data").is_err());
}

#[test]
fn a_disk_rebuilt_from_a_vault_snapshot_restores_in_place_of_the_layers_it_stands_for() {
    let mut r = rig(64, false);
    let dir = tempfile::tempdir().unwrap();
    let (vault, seq) = vault_snapshot(&mut r, dir.path());
    // The state the guest was saved with: the source's sealed layer.
    let VirtioDeviceState::Block(state) = r.t.device().save() else { panic!("not a block state") };
    let saved = state.layers.clone().unwrap();
    assert_eq!(saved.len(), 1);
    let open = |cache: &str| {
        let source = lazy_source(dir.path(), &vault, seq, cache, false);
        Block::layered_lazy(r.image.path(), &source, &[], &dir.path().join(format!("{cache}-top")), "forkvm-data")
            .unwrap()
    };
    // Without saying what it stands for, the lazy disk is refused; standing for the
    // wrong layers too; for exactly the saved ones it restores and reads the snapshot.
    assert!(matches!(open("a").with_state(&state), Err(BlockError::RestoreLayers { .. })));
    let wrong = vec!["0123456789abcdef0123456789abcdef".to_string()];
    assert!(matches!(open("b").with_state_replacing(&state, &wrong), Err(BlockError::RestoreLayers { .. })));
    let block = open("c").with_state_replacing(&state, &saved).unwrap();
    let mut t = MmioTransport::new(Box::new(block), r.mem.clone(), r.irq.clone());
    bring_up(&mut t, std::slice::from_ref(&r.q));
    r.t = t;
    assert_eq!(r.submit(T_IN, 40, &[Desc::w(0x50000, 512)]).0, S_OK);
    assert_eq!(r.guest(0x50000, 512), vec![0x5a; 512]);
}

#[test]
fn an_empty_volume_slot_takes_a_disk_at_restore_and_says_so_once_with_a_config_change() {
    let mut r = rig(64, false);
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty-slot");
    std::fs::write(&empty, b"").unwrap();
    // The slot as the template booted it: a layered disk of nothing.
    let slot = Block::layered(&empty, &[], &dir.path().join("slot-top"), "forkvm-vol0").unwrap();
    let mut st = MmioTransport::new(Box::new(slot), r.mem.clone(), r.irq.clone());
    bring_up(&mut st, std::slice::from_ref(&r.q));
    assert_eq!(st.device().device_features() & F_RO, 0, "a slot is negotiated writable");
    let VirtioDeviceState::Block(state) = st.device().save() else { panic!("not a block state") };
    assert!(state.is_empty_slot(), "{state:?}");
    let saved = st.save();

    // A restore puts a read-only volume (the rig's image as its base) into the slot.
    let base = r.image.path().to_path_buf();
    let volume = Block::layered(&base, &[], &dir.path().join("vol-top"), "forkvm-vol0").unwrap().refusing_writes(true);
    let mut volume = volume.with_state(&state).unwrap();
    assert_eq!(volume.capacity(), 64);
    assert!(volume.take_media_change(), "the driver must be told");
    assert!(!volume.take_media_change(), "once");
    volume.media_changed = true;
    let mut restored = MmioTransport::restore(&saved, Box::new(volume), r.mem.clone(), r.irq.clone()).unwrap();
    let before = r.irq.count();
    assert!(restored.device_mut().take_config_change());
    restored.notify_config_change().unwrap();
    assert_eq!(r.irq.count(), before + 1);
    assert_eq!(reg_read(&mut restored, virtio_bindings::virtio_mmio::VIRTIO_MMIO_INTERRUPT_STATUS) & 2, 2);
    assert_eq!(reg_read(&mut restored, virtio_bindings::virtio_mmio::VIRTIO_MMIO_CONFIG_GENERATION), 1);
    let mut config = [0u8; 8];
    restored.read(0x100, &mut config);
    assert_eq!(u64::from_le_bytes(config), 64, "the driver reads the new capacity");
    r.t = restored;
    assert_eq!(r.submit(T_IN, 9, &[Desc::w(0x50000, 512)]), (S_OK, 513));
    assert_eq!(r.guest(0x50000, 512), vec![9u8; 512]);
    r.mem.write_slice(&[0xa5; 512], GuestAddress(DATA)).unwrap();
    assert_eq!(r.submit(T_OUT, 9, &[Desc::r(DATA, 512)]).0, S_IOERR, "a read-only volume refuses writes");
    assert!(!dir.path().join("vol-top").exists(), "its top is never written");

    // Another serial is not this slot's disk; a slot that holds a disk is not empty.
    let other = Block::layered(&base, &[], &dir.path().join("other-top"), "forkvm-vol1").unwrap();
    assert!(matches!(other.with_state(&state).unwrap_err(), BlockError::RestoreLayers { .. }));
    let VirtioDeviceState::Block(full) = r.t.device().save() else { panic!("not a block state") };
    assert!(!full.is_empty_slot());
    let empty_again = Block::layered(&empty, &[], &dir.path().join("again"), "forkvm-vol0").unwrap();
    assert!(empty_again.with_state(&full).is_err(), "a volume is not taken out by a restore");
}
