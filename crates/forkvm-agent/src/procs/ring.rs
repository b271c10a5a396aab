//! A background process's output: the last bytes it wrote, as chunks tagged with the
//! stream they came from, addressed by offsets that count every byte since the start.
//! Bounded: a chunk that pushes the total past the limit drops the oldest bytes.

use std::collections::VecDeque;

/// Which stream a chunk came from (a terminal's output is `Stdout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

#[derive(Debug)]
struct Chunk {
    stream: Stream,
    /// Offset of its first byte.
    at: u64,
    bytes: Vec<u8>,
}

/// The kept output of one process.
#[derive(Debug)]
pub struct OutputRing {
    chunks: VecDeque<Chunk>,
    /// Bytes held.
    held: u64,
    limit: u64,
    /// Offset after the last byte.
    end: u64,
}

impl OutputRing {
    pub fn new(limit: u64) -> OutputRing {
        OutputRing { chunks: VecDeque::new(), held: 0, limit: limit.max(1), end: 0 }
    }

    /// Offset of the oldest byte held (`end` when none is).
    pub fn start(&self) -> u64 {
        self.end - self.held
    }

    pub fn end(&self) -> u64 {
        self.end
    }

    /// Appends what a stream wrote, dropping the oldest bytes past the limit.
    pub fn push(&mut self, stream: Stream, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // Only the last `limit` bytes of a chunk larger than the ring can stay.
        let keep = &bytes[bytes.len().saturating_sub(self.limit as usize)..];
        let at = self.end + (bytes.len() - keep.len()) as u64;
        self.end += bytes.len() as u64;
        self.chunks.push_back(Chunk { stream, at, bytes: keep.to_vec() });
        self.held += keep.len() as u64;
        self.held = self.held.min(self.end);
        while self.held > self.limit {
            let excess = (self.held - self.limit) as usize;
            let front = self.chunks.front_mut().expect("bytes held are in chunks");
            if front.bytes.len() <= excess {
                self.held -= front.bytes.len() as u64;
                self.chunks.pop_front();
            } else {
                front.bytes.drain(..excess);
                front.at += excess as u64;
                self.held -= excess as u64;
            }
        }
    }

    /// The held output from `offset` on (clamped to what is held), in chunks of at most
    /// `max` bytes each, up to `budget` bytes in all.
    pub fn read_from(&self, offset: u64, max: usize, budget: usize) -> Vec<(Stream, Vec<u8>)> {
        let mut out = Vec::new();
        let mut left = budget;
        let from = offset.max(self.start());
        for c in &self.chunks {
            let c_end = c.at + c.bytes.len() as u64;
            if c_end <= from {
                continue;
            }
            let skip = from.saturating_sub(c.at) as usize;
            for piece in c.bytes[skip..].chunks(max.max(1)) {
                if left == 0 {
                    return out;
                }
                let piece = &piece[..piece.len().min(left)];
                left -= piece.len();
                out.push((c.stream, piece.to_vec()));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(parts: &[(Stream, Vec<u8>)]) -> String {
        parts.iter().map(|(_, b)| String::from_utf8_lossy(b).into_owned()).collect()
    }

    #[test]
    fn output_is_read_from_any_held_offset_with_its_stream() {
        let mut r = OutputRing::new(100);
        r.push(Stream::Stdout, b"hello ");
        r.push(Stream::Stderr, b"world");
        assert_eq!((r.start(), r.end()), (0, 11));
        let all = r.read_from(0, 64, usize::MAX);
        assert_eq!(all, vec![(Stream::Stdout, b"hello ".to_vec()), (Stream::Stderr, b"world".to_vec())]);
        assert_eq!(text(&r.read_from(3, 64, usize::MAX)), "lo world");
        assert_eq!(text(&r.read_from(8, 2, usize::MAX)), "rld");
        assert_eq!(r.read_from(8, 2, usize::MAX).len(), 2, "pieces of at most 2 bytes");
        assert_eq!(text(&r.read_from(0, 64, 4)), "hell", "the budget caps a read");
        assert!(r.read_from(11, 64, usize::MAX).is_empty());
    }

    #[test]
    fn the_oldest_bytes_go_past_the_limit_and_offsets_keep_counting() {
        let mut r = OutputRing::new(8);
        r.push(Stream::Stdout, b"abcdef");
        r.push(Stream::Stdout, b"ghij");
        assert_eq!((r.start(), r.end()), (2, 10));
        assert_eq!(text(&r.read_from(0, 64, usize::MAX)), "cdefghij", "an offset no longer held starts at the oldest");
        r.push(Stream::Stderr, b"0123456789xyz");
        assert_eq!((r.start(), r.end()), (15, 23));
        assert_eq!(text(&r.read_from(0, 64, usize::MAX)), "56789xyz");
        assert_eq!(text(&r.read_from(20, 64, usize::MAX)), "xyz");
    }
}
