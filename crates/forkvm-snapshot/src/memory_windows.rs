//! Guest memory served window by window, for a restore that does not wait for its image.
//!
//! A lazily restored VMM maps empty memory and, on the first touch of a 64 KiB window,
//! asks a [`WindowSource`] for that window's bytes (`forkvm_vmm::vstate::lazy_memory`).
//! [`PageMapWindows`] is the source for a chunked snapshot: it applies the chain's page
//! maps, base to head, to just that window, reading the chunks it names from wherever
//! they are ([`ChunkSource`]: the local chunk store, or a remote with a cache).
//!
//! A jailed VMM has no network, no keys and no store: it reaches its source over a Unix
//! stream ([`SocketWindows`] in the VMM, [`serve_windows`] on the host). The wire is a
//! request of one little-endian `u64` window index and a reply of a status byte, then
//! either the window's [`WINDOW_BYTES`] bytes (0) or a `u32` length and an error message
//! of at most [`MAX_ERROR_BYTES`] (1).

use crate::chunk_store::{ChunkId, ChunkStore};
use crate::page_map::{ExtentContent, PageMap, PAGE, PAGES_PER_CHUNK};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;

/// Bytes in a window: the unit a lazy restore fetches (a page map's chunk window).
pub const WINDOW_BYTES: u64 = PAGE * PAGES_PER_CHUNK as u64;
/// Longest error message carried on the wire.
pub const MAX_ERROR_BYTES: usize = 4096;
/// The request index that says "every window is in" (no reply).
const COMPLETE: u64 = u64::MAX;
const STATUS_OK: u8 = 0;
const STATUS_ERROR: u8 = 1;

/// Environment variable turning fetching ahead off (`0`): a lazily restored VMM then
/// fetches only the windows its guest touches, its memory server fetches nothing on its
/// own, and the memory never completes (forks and live branches of the VMM wait in
/// vain). For measuring what a guest touches.
pub const AHEAD_ENV: &str = "FORKVM_LAZY_AHEAD";

/// Whether fetching ahead is on ([`AHEAD_ENV`] is not `0`).
pub fn ahead_from_env() -> bool {
    std::env::var(AHEAD_ENV).map_or(true, |v| v.trim() != "0")
}

/// Where a lazily restored guest's memory comes from.
pub trait WindowSource: Send {
    /// Fills `out` ([`WINDOW_BYTES`] long) with window `index` of the memory image, or
    /// says why it cannot (the guest must then never see the window).
    fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String>;

    /// Told once every window is in: nothing more will be asked.
    fn complete(&mut self) {}
}

/// Where the chunks a page map names are read from; every chunk is checked against its
/// name by the source.
pub trait ChunkSource: Send {
    fn chunk_into(&mut self, id: &ChunkId, out: &mut Vec<u8>) -> Result<(), String>;
}

impl ChunkSource for ChunkStore {
    fn chunk_into(&mut self, id: &ChunkId, out: &mut Vec<u8>) -> Result<(), String> {
        self.get_into(id, out).map_err(|e| e.to_string())
    }
}

/// A chunked snapshot's memory: its chain's page maps, base first, each with the source
/// of its chunks.
pub struct PageMapWindows {
    links: Vec<(PageMap, Box<dyn ChunkSource>)>,
    mem_size: u64,
    chunk: Vec<u8>,
    /// Chunks read so far.
    pub chunks_read: u64,
}

impl PageMapWindows {
    /// `links` base first; every map must describe `mem_size` bytes (checked by the
    /// caller, which read them).
    pub fn new(links: Vec<(PageMap, Box<dyn ChunkSource>)>, mem_size: u64) -> PageMapWindows {
        PageMapWindows { links, mem_size, chunk: Vec::new(), chunks_read: 0 }
    }

    /// Windows in the image.
    pub fn windows(&self) -> u64 {
        self.mem_size.div_ceil(WINDOW_BYTES)
    }
}

impl std::fmt::Debug for PageMapWindows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PageMapWindows")
            .field("links", &self.links.len())
            .field("mem_size", &self.mem_size)
            .field("chunks_read", &self.chunks_read)
            .finish()
    }
}

impl WindowSource for PageMapWindows {
    fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String> {
        if out.len() as u64 != WINDOW_BYTES || index >= self.windows() {
            return Err(format!("window {index} of a {}-byte image", self.mem_size));
        }
        out.fill(0);
        let first = index * u64::from(PAGES_PER_CHUNK);
        let end = first + u64::from(PAGES_PER_CHUNK);
        // Head first: a page a later link wrote is never read from an earlier one, so a
        // chunk is fetched only if it holds a page no later link covers.
        let mut decided: u32 = 0;
        for (map, chunks) in self.links.iter_mut().rev() {
            let from = map.extents.partition_point(|e| e.first_page < first);
            for e in map.extents[from..].iter().take_while(|e| e.first_page < end) {
                let at = ((e.first_page - first) * PAGE) as usize;
                let len = e.pages as usize * PAGE as usize;
                let Some(dst) = out.get_mut(at..at + len) else {
                    return Err(format!("an extent at page {} crosses window {index}", e.first_page));
                };
                let pages = ((1u32 << e.pages) - 1) << (e.first_page - first);
                let mine = (pages & !decided) >> (e.first_page - first);
                decided |= pages;
                // `out` starts zeroed and only undecided pages are written: a zero
                // extent has nothing to do.
                let ExtentContent::Chunk(id) = e.content else { continue };
                if mine == 0 {
                    continue;
                }
                chunks.chunk_into(&id, &mut self.chunk)?;
                if self.chunk.len() != len {
                    return Err(format!("chunk {} holds {} bytes, its extent {len}", id.to_hex(), self.chunk.len()));
                }
                self.chunks_read += 1;
                copy_pages(dst, &self.chunk, mine);
            }
        }
        Ok(())
    }
}

/// Copies the pages of `src` whose bits are set in `pages` into `dst`.
fn copy_pages(dst: &mut [u8], src: &[u8], pages: u32) {
    for (i, (d, s)) in dst.chunks_mut(PAGE as usize).zip(src.chunks(PAGE as usize)).enumerate() {
        if pages & (1 << i) != 0 {
            d.copy_from_slice(s);
        }
    }
}

/// A [`WindowSource`] on the far side of a Unix stream ([`serve_windows`]).
#[derive(Debug)]
pub struct SocketWindows {
    stream: UnixStream,
}

impl SocketWindows {
    pub fn new(stream: UnixStream) -> SocketWindows {
        SocketWindows { stream }
    }
}

impl WindowSource for SocketWindows {
    fn complete(&mut self) {
        // Best effort: a source that is gone needs no news.
        let _ = self.stream.write_all(&COMPLETE.to_le_bytes());
    }

    fn fill(&mut self, index: u64, out: &mut [u8]) -> Result<(), String> {
        let lost = |e: std::io::Error| format!("the memory source is gone: {e}");
        self.stream.write_all(&index.to_le_bytes()).map_err(lost)?;
        let mut status = [0u8; 1];
        self.stream.read_exact(&mut status).map_err(lost)?;
        match status[0] {
            STATUS_OK if out.len() as u64 == WINDOW_BYTES => self.stream.read_exact(out).map_err(lost),
            STATUS_ERROR => {
                let mut len = [0u8; 4];
                self.stream.read_exact(&mut len).map_err(lost)?;
                let len = u32::from_le_bytes(len) as usize;
                if len > MAX_ERROR_BYTES {
                    return Err(format!("the memory source sent a {len}-byte error"));
                }
                let mut msg = vec![0u8; len];
                self.stream.read_exact(&mut msg).map_err(lost)?;
                Err(String::from_utf8_lossy(&msg).into_owned())
            }
            other => Err(format!("the memory source answered status {other}")),
        }
    }
}

/// What [`serve_windows`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Served {
    /// Windows sent.
    pub windows: u64,
    /// Whether the VMM said its memory is complete before it hung up.
    pub complete: bool,
}

/// Answers window requests on `stream` from `source` until the other side closes it.
pub fn serve_windows(mut stream: UnixStream, source: &mut dyn WindowSource) -> std::io::Result<Served> {
    let mut window = vec![0u8; WINDOW_BYTES as usize];
    let mut served = Served::default();
    loop {
        let mut index = [0u8; 8];
        match stream.read_exact(&mut index) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(served),
            Err(e) => return Err(e),
        }
        let index = u64::from_le_bytes(index);
        if index == COMPLETE {
            served.complete = true;
            continue;
        }
        match source.fill(index, &mut window) {
            Ok(()) => {
                stream.write_all(&[STATUS_OK])?;
                stream.write_all(&window)?;
                served.windows += 1;
            }
            Err(msg) => {
                let mut msg = msg.into_bytes();
                msg.truncate(MAX_ERROR_BYTES);
                stream.write_all(&[STATUS_ERROR])?;
                stream.write_all(&(msg.len() as u32).to_le_bytes())?;
                stream.write_all(&msg)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::page_map::Extent;

    /// Chunks from a map of id → bytes.
    struct Chunks(std::collections::HashMap<ChunkId, Vec<u8>>);
    impl ChunkSource for Chunks {
        fn chunk_into(&mut self, id: &ChunkId, out: &mut Vec<u8>) -> Result<(), String> {
            let bytes = self.0.get(id).ok_or_else(|| format!("no chunk {}", id.to_hex()))?;
            out.clear();
            out.extend_from_slice(bytes);
            Ok(())
        }
    }

    fn id(n: u8) -> ChunkId {
        ChunkId([n; 32])
    }

    fn windows() -> PageMapWindows {
        let mut chunks = std::collections::HashMap::new();
        chunks.insert(id(1), vec![0x11; 2 * PAGE as usize]);
        chunks.insert(id(2), vec![0x22; PAGE as usize]);
        let extent = |first_page, pages, content| Extent { first_page, pages, content };
        let base = PageMap {
            mem_size: 4 * WINDOW_BYTES,
            extents: vec![extent(0, 2, ExtentContent::Chunk(id(1))), extent(17, 2, ExtentContent::Chunk(id(1)))],
        };
        // The diff zeroes page 1 and rewrites page 18.
        let diff = PageMap {
            mem_size: 4 * WINDOW_BYTES,
            extents: vec![extent(1, 1, ExtentContent::Zero), extent(18, 1, ExtentContent::Chunk(id(2)))],
        };
        let source = || Box::new(Chunks(chunks.clone())) as Box<dyn ChunkSource>;
        PageMapWindows::new(vec![(base, source()), (diff, source())], 4 * WINDOW_BYTES)
    }

    #[test]
    fn a_window_is_the_maps_applied_base_to_head() {
        let mut w = windows();
        let mut out = vec![0xffu8; WINDOW_BYTES as usize];
        w.fill(0, &mut out).unwrap();
        assert!(out[..PAGE as usize].iter().all(|&b| b == 0x11));
        assert!(out[PAGE as usize..].iter().all(|&b| b == 0), "the diff zeroed page 1");
        w.fill(1, &mut out).unwrap();
        let page = |n: usize| &out[n * PAGE as usize..(n + 1) * PAGE as usize];
        assert!(page(0).iter().all(|&b| b == 0));
        assert!(page(1).iter().all(|&b| b == 0x11));
        assert!(page(2).iter().all(|&b| b == 0x22));
        w.fill(3, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert!(w.fill(4, &mut out).unwrap_err().contains("window 4"));
    }

    #[test]
    fn a_chunk_every_page_of_which_a_later_link_rewrote_is_not_read() {
        let mut chunks = std::collections::HashMap::new();
        chunks.insert(id(2), vec![0x22; PAGE as usize]);
        let extent = |first_page, pages, content| Extent { first_page, pages, content };
        // The base's chunk 1 is not to be had; the diff rewrote (zeroed) its only page.
        let base = PageMap { mem_size: WINDOW_BYTES, extents: vec![extent(3, 1, ExtentContent::Chunk(id(1)))] };
        let diff = PageMap { mem_size: WINDOW_BYTES, extents: vec![extent(3, 1, ExtentContent::Zero)] };
        let source = || Box::new(Chunks(chunks.clone())) as Box<dyn ChunkSource>;
        let mut w = PageMapWindows::new(vec![(base, source()), (diff, source())], WINDOW_BYTES);
        let mut out = vec![0xffu8; WINDOW_BYTES as usize];
        w.fill(0, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        assert_eq!(w.chunks_read, 0);
    }

    #[test]
    fn a_missing_chunk_is_an_error_not_zeros() {
        let mut w = windows();
        w.links[0].1 = Box::new(Chunks(Default::default()));
        let mut out = vec![0u8; WINDOW_BYTES as usize];
        assert!(w.fill(0, &mut out).unwrap_err().contains("no chunk"));
    }

    #[test]
    fn the_wire_carries_windows_and_errors() {
        let (vmm, host) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || serve_windows(host, &mut windows()).unwrap());
        let mut remote = SocketWindows::new(vmm);
        let mut out = vec![0u8; WINDOW_BYTES as usize];
        remote.fill(1, &mut out).unwrap();
        assert_eq!(out[2 * PAGE as usize], 0x22);
        assert!(remote.fill(9, &mut out).unwrap_err().contains("window 9"));
        remote.complete();
        drop(remote);
        assert_eq!(server.join().unwrap(), Served { windows: 1, complete: true });
    }

    #[test]
    fn a_reply_with_a_huge_error_length_is_refused() {
        let (vmm, mut host) = UnixStream::pair().unwrap();
        let mut remote = SocketWindows::new(vmm);
        host.write_all(&[STATUS_ERROR]).unwrap();
        host.write_all(&u32::MAX.to_le_bytes()).unwrap();
        let mut out = vec![0u8; WINDOW_BYTES as usize];
        assert!(remote.fill(0, &mut out).unwrap_err().contains("byte error"));
    }
}
