//! forkd's `measure_diff`: how big a diff over a parent would be, measured on a whole
//! memory image without writing anything. A full branch asked to measure reports the
//! diff it could have been next to the snapshot it is, so a user can choose the mode.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Instant;

use super::convert::open_image;
use super::{AssembledCache, Chain, ChainError};
use crate::store::Store;

const PAGE: usize = 4096;
const BLOCK: usize = 1 << 20;

/// What a diff of an image over its parent would hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiffMeasure {
    /// Guest pages whose bytes differ from the parent's.
    pub pages: u64,
    /// Their bytes (`pages` × 4 KiB): what a diff stores before compression.
    pub bytes: u64,
    /// The memory size the diff covers.
    pub logical_bytes: u64,
    /// Milliseconds the measurement took (assembling the parent's image, if it was not
    /// cached, included).
    pub ms: f64,
}

/// Measures whole memory image `image` against the memory of chain `parent` (same size).
pub fn measure_diff(
    store: &Store,
    cache: &AssembledCache,
    parent: &Chain,
    image: &Path,
) -> Result<DiffMeasure, ChainError> {
    let started = Instant::now();
    let mem_size = parent.head().meta.mem_size_bytes;
    let (parent_image, _) = cache.memory_for(store, parent)?;
    let (mine, theirs) = (open_image(image, mem_size)?, open_image(&parent_image, mem_size)?);
    let pages = differing_pages(&mine, &theirs, mem_size).map_err(|source| ChainError::Io {
        step: "reading memory images to measure a diff".into(),
        path: image.to_path_buf(),
        source,
    })?;
    Ok(DiffMeasure {
        pages,
        bytes: pages * PAGE as u64,
        logical_bytes: mem_size,
        ms: started.elapsed().as_secs_f64() * 1e3,
    })
}

/// Pages of the first `size` bytes in which `a` and `b` differ.
fn differing_pages(a: &File, b: &File, size: u64) -> std::io::Result<u64> {
    let (mut abuf, mut bbuf) = (vec![0u8; BLOCK], vec![0u8; BLOCK]);
    let mut pages = 0;
    let mut pos = 0u64;
    while pos < size {
        let len = BLOCK.min((size - pos) as usize);
        a.read_exact_at(&mut abuf[..len], pos)?;
        b.read_exact_at(&mut bbuf[..len], pos)?;
        if abuf[..len] != bbuf[..len] {
            pages += abuf[..len].chunks(PAGE).zip(bbuf[..len].chunks(PAGE)).filter(|(x, y)| x != y).count() as u64;
        }
        pos += len as u64;
    }
    Ok(pages)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(dir: &Path, name: &str, pages: &[(usize, u8)], size: usize) -> File {
        let path = dir.join(name);
        let mut bytes = vec![0u8; size];
        for &(page, byte) in pages {
            bytes[page * PAGE + 17] = byte;
        }
        std::fs::write(&path, bytes).unwrap();
        File::open(path).unwrap()
    }

    #[test]
    fn counts_the_pages_that_differ_and_only_those() {
        let dir = tempfile::tempdir().unwrap();
        let size = 3 * BLOCK + 5 * PAGE;
        let a = image(dir.path(), "a", &[(0, 1), (300, 2), (3 * 256 + 4, 9)], size);
        let b = image(dir.path(), "b", &[(0, 1), (300, 3), (700, 4)], size);
        // Page 300 differs in value, 700 and 772 exist on one side only; page 0 matches.
        assert_eq!(differing_pages(&a, &b, size as u64).unwrap(), 3);
        assert_eq!(differing_pages(&a, &a, size as u64).unwrap(), 0);
    }
}
