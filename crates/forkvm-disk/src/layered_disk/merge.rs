//! Merging consecutive sealed layers into one, and swapping the merge into a live stack.
//!
//! Why this exists: a long-running sandbox seals its disk's top for every disk
//! snapshot in which it wrote (once a minute under the daemon), so its stack grows by a
//! layer a minute: an open data file and an in-memory bitmap each (128 KiB for a 4 GiB
//! disk), and one more bitmap per block read that misses the newer layers. A day is
//! ~1 440 layers and ~180 MiB of bitmaps. Merging the layers the vault already holds
//! keeps the stack short.
//!
//! The merge of layers `a..=b` (oldest first, each the parent of the next) holds, for
//! every block any of them holds, the newest one's copy; it keeps `b`'s id and `a`'s
//! parent. A layer id names "the disk as of this layer", and the merge is exactly that
//! disk, so the layer above `b` still names its parent correctly, and a vault whose last
//! snapshot covers `b` still finds `b` in the stack (its lineage continues).

use super::layer::Role;
use super::stack::check_layer;
use super::{blocks_for, Layer, LayerError, LayerStack, SealedLayerBuilder, BLOCK_SIZE};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

/// Blocks copied per read: one 64 KiB window at a time.
const RUN_BLOCKS: u64 = 16;

/// Merges the sealed layers `layers` (oldest first, each the parent of the next) into a
/// new sealed layer at `dir` (which must not exist): see the module doc. Built in
/// `<dir>.partial/` and renamed into place, like every built layer.
pub fn merge_layers(dir: &Path, layers: &[PathBuf]) -> Result<Layer, LayerError> {
    let bad = |reason: String| LayerError::Merge { path: dir.to_path_buf(), reason };
    if layers.len() < 2 {
        return Err(bad(format!("{} layers given, at least 2 needed", layers.len())));
    }
    let opened = layers.iter().map(|l| Layer::open_sealed(l)).collect::<Result<Vec<_>, _>>()?;
    for pair in opened.windows(2) {
        if pair[1].parent() != pair[0].id() || pair[1].disk_size() != pair[0].disk_size() {
            return Err(bad(format!(
                "{} does not sit on {} (parent {}, size {} vs {})",
                pair[1].dir().display(),
                pair[0].dir().display(),
                pair[1].parent(),
                pair[1].disk_size(),
                pair[0].disk_size()
            )));
        }
    }
    let (first, last) = (&opened[0], &opened[opened.len() - 1]);
    let size = first.disk_size();
    let mut builder = SealedLayerBuilder::create(dir, size, first.parent())?.with_id(last.id());
    let mut buf = vec![0u8; (RUN_BLOCKS * BLOCK_SIZE) as usize];
    let blocks = blocks_for(size);
    let mut b = 0;
    while b < blocks {
        // The next block any layer holds.
        let Some(next) = opened.iter().filter_map(|l| l.bitmap().next_one(b)).min() else { break };
        // A run of consecutive blocks that the same layer provides.
        let source = opened.iter().rposition(|l| l.is_present(next)).expect("a layer holds it");
        let mut end = next + 1;
        while end < blocks && end - next < RUN_BLOCKS && opened.iter().rposition(|l| l.is_present(end)) == Some(source)
        {
            end += 1;
        }
        let from = &opened[source];
        let len = ((end * BLOCK_SIZE).min(size) - next * BLOCK_SIZE) as usize;
        from.data().read_exact_at(&mut buf[..len], next * BLOCK_SIZE).map_err(|source| LayerError::Merge {
            path: dir.to_path_buf(),
            reason: format!("reading {}: {source}", from.data_path().display()),
        })?;
        builder.put_blocks(next, &buf[..len])?;
        b = end;
    }
    builder.finish()
}

impl LayerStack {
    /// Replaces sealed layers `range` (indexes into [`LayerStack::sealed_layers`]) with
    /// `merged`, their merge ([`merge_layers`]): it must be sealed, have the last one's
    /// id and the first one's parent. The replaced layers' files are closed, not removed.
    pub fn replace_sealed(&mut self, range: std::ops::Range<usize>, merged: &Path) -> Result<(), LayerError> {
        let bad = |reason: String| LayerError::Merge { path: merged.to_path_buf(), reason };
        if range.is_empty() || range.end > self.sealed.len() {
            return Err(bad(format!("layers {range:?} of {}", self.sealed.len())));
        }
        let layer = Layer::open(merged, Role::Sealed)?;
        let first_parent = self.sealed[range.start].parent();
        check_layer(&layer, self.size(), first_parent)?;
        let last = self.sealed[range.end - 1].id();
        if layer.id() != last {
            return Err(bad(format!("its id {} is not {last}, the last layer it replaces", layer.id())));
        }
        self.sealed.splice(range, [layer]);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layered_disk::LayerId;

    #[test]
    fn a_merge_reads_like_the_layers_it_replaces_and_keeps_the_stack_chained() {
        let tmp = tempfile::tempdir().unwrap();
        let bs = BLOCK_SIZE as usize;
        let size = 40 * BLOCK_SIZE + 300;
        let base = tmp.path().join("base");
        std::fs::write(&base, vec![0xb0; size as usize]).unwrap();
        let mut stack = LayerStack::create(&base, &[], &tmp.path().join("top-0")).unwrap();
        // Four seals: overlapping writes, a zero write (must not fall through), the
        // partial last block, and a run longer than one read.
        let writes: [&[(u64, u8)]; 4] = [
            &[(0, 1), (1, 1), (2, 1), (17, 1), (18, 1), (19, 1), (20, 1), (21, 1)],
            &[(1, 2), (5, 2), (18, 0)],
            &[(2, 3), (40, 3)],
            &[(5, 4), (30, 4)],
        ];
        for (n, round) in writes.iter().enumerate() {
            for &(block, byte) in *round {
                let len = if block == 40 { 300 } else { bs };
                stack.write_at(&vec![byte; len], block * BLOCK_SIZE).unwrap();
            }
            stack.seal(&tmp.path().join(format!("top-{}", n + 1))).unwrap();
        }
        stack.write_at(&[9u8; 10], 3).unwrap();
        let mut before = vec![0u8; size as usize];
        stack.read_at(&mut before, 0).unwrap();
        let dirs: Vec<PathBuf> = stack.sealed_layers().iter().map(|l| l.dir().to_path_buf()).collect();
        let ids: Vec<LayerId> = stack.sealed_layers().iter().map(Layer::id).collect();

        // Merge the middle three (1..4): same id as the last, parent of the first.
        let merged = merge_layers(&tmp.path().join("merged"), &dirs[1..4]).unwrap();
        assert_eq!((merged.id(), merged.parent()), (ids[3], ids[0]));
        assert_eq!(merged.present_count(), 6, "blocks 1, 2, 5, 18, 30 and 40");
        stack.replace_sealed(1..4, &tmp.path().join("merged")).unwrap();
        assert_eq!(stack.sealed_layers().len(), 2);
        let mut after = vec![0u8; size as usize];
        stack.read_at(&mut after, 0).unwrap();
        assert!(after == before, "the disk reads the same");
        // The stack goes on: seal, reopen from the directories, read the same.
        stack.seal(&tmp.path().join("top-5")).unwrap();
        let now: Vec<PathBuf> = stack.sealed_layers().iter().map(|l| l.dir().to_path_buf()).collect();
        let reopened = LayerStack::create(&base, &now, &tmp.path().join("top-6")).unwrap();
        let mut again = vec![0u8; size as usize];
        reopened.read_at(&mut again, 0).unwrap();
        assert!(again == before);

        // Refused: one layer, layers out of order, a merge that is not of that range.
        assert!(matches!(merge_layers(&tmp.path().join("m1"), &dirs[..1]), Err(LayerError::Merge { .. })));
        let swapped = [dirs[1].clone(), dirs[0].clone()];
        assert!(matches!(merge_layers(&tmp.path().join("m2"), &swapped), Err(LayerError::Merge { .. })));
        let other = merge_layers(&tmp.path().join("m3"), &dirs[..2]).unwrap();
        drop(other);
        let err = stack.replace_sealed(0..1, &tmp.path().join("m3")).unwrap_err();
        assert!(matches!(err, LayerError::Merge { .. }), "{err}");
    }
}
