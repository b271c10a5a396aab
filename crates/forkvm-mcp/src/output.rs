//! Fitting command output and file content into an agent's context: long text keeps
//! its head and its tail (where errors usually are) with a marker saying how much is
//! left out, and a file read is a window `[offset, offset + max_bytes)` of the file.

use std::io::{self, Write};

/// Text cut to a byte budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Clipped {
    /// What the agent sees.
    pub text: String,
    /// Bytes of the original left out (0: nothing was cut).
    pub elided_bytes: usize,
}

/// `text` whole when it fits in `limit` bytes, else its first and last `limit / 2`
/// bytes (on character boundaries) around a line saying how many bytes are left out.
pub fn clip(text: &str, limit: usize) -> Clipped {
    if text.len() <= limit {
        return Clipped { text: text.to_string(), elided_bytes: 0 };
    }
    let mut head_end = limit / 2;
    while !text.is_char_boundary(head_end) {
        head_end -= 1;
    }
    let mut tail_start = text.len() - (limit - limit / 2);
    while !text.is_char_boundary(tail_start) {
        tail_start += 1;
    }
    let elided = tail_start - head_end;
    Clipped {
        text: format!("{}\n[... {elided} bytes left out ...]\n{}", &text[..head_end], &text[tail_start..]),
        elided_bytes: elided,
    }
}

/// A sink that keeps the bytes of `[offset, offset + max)` of what is written to it
/// and refuses more once it has them (so a download of a large file stops early).
#[derive(Debug)]
pub struct Window {
    offset: u64,
    max: usize,
    seen: u64,
    pub kept: Vec<u8>,
    /// Bytes came after the window (the file goes on).
    pub more: bool,
}

/// The error a [`Window`] stops a download with once full.
pub const WINDOW_FULL: &str = "read window is full";

impl Window {
    pub fn new(offset: u64, max: usize) -> Window {
        Window { offset, max, seen: 0, kept: Vec::new(), more: false }
    }
}

impl Write for Window {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let start = self.seen;
        let end = start + buf.len() as u64;
        self.seen = end;
        let from = self.offset.max(start);
        let room = self.max - self.kept.len();
        let to = end.min(self.offset + self.max as u64);
        if from < to {
            let a = (from - start) as usize;
            let b = (to - start) as usize;
            self.kept.extend_from_slice(&buf[a..b.min(a + room)]);
        }
        if end > self.offset + self.max as u64 {
            self.more = true;
            return Err(io::Error::other(WINDOW_FULL));
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_whole() {
        assert_eq!(clip("hello", 5), Clipped { text: "hello".into(), elided_bytes: 0 });
    }

    #[test]
    fn long_text_keeps_head_and_tail_on_char_boundaries() {
        let text = format!("{}{}", "é".repeat(100), "end");
        // 21 bytes: a head of 10 (five 2-byte chars) and a tail of 11 (4 chars + "end").
        let c = clip(&text, 21);
        assert_eq!(c.elided_bytes, 182);
        assert_eq!(c.text, format!("{}\n[... 182 bytes left out ...]\n{}end", "é".repeat(5), "é".repeat(4)));
        // An odd split point moves to the character boundary before (head) or after (tail).
        let c = clip(&text, 20);
        assert_eq!(c.text, format!("{}\n[... 184 bytes left out ...]\n{}end", "é".repeat(5), "é".repeat(3)));
    }

    #[test]
    fn a_window_keeps_its_range_across_writes_and_stops_after_it() {
        let mut w = Window::new(3, 4);
        assert_eq!(w.write(b"ab").unwrap(), 2);
        assert_eq!(w.write(b"cde").unwrap(), 3);
        let err = w.write(b"fghij").unwrap_err();
        assert_eq!(err.to_string(), WINDOW_FULL);
        assert_eq!(w.kept, b"defg");
        assert!(w.more);
    }

    #[test]
    fn a_window_reaching_the_end_exactly_says_no_more() {
        let mut w = Window::new(0, 4);
        w.write_all(b"abcd").unwrap();
        assert_eq!(w.kept, b"abcd");
        assert!(!w.more);
        let mut past = Window::new(10, 4);
        past.write_all(b"abcd").unwrap();
        assert!(past.kept.is_empty() && !past.more);
    }
}
