//! Newline-delimited JSON as it arrives: body frames are cut wherever the network cut
//! them, so a line (even a UTF-8 character) may span frames and a frame may hold many
//! lines. [`Lines`] keeps the unfinished tail and yields whole lines only.

use crate::client::{decode, next_data, Client};
use crate::error::ClientError;
use crate::transport::ReqBody;
use hyper::Method;
use serde::de::DeserializeOwned;
use std::cell::RefCell;

/// Longest line accepted (one output chunk of an exec stream is far smaller).
pub(crate) const MAX_LINE: usize = 16 << 20;

impl Client {
    /// Sends a request whose answer is NDJSON lines of `T` and hands `on_line` each one
    /// as it arrives, until it returns `Some(end)`, which is returned at once (the
    /// connection is dropped, which ends the stream on the daemon's side; lines after
    /// it are not read). A body that ends first is [`ClientError::Truncated`].
    pub(crate) fn read_lines<T: DeserializeOwned, R>(
        &self,
        method: Method,
        target: &str,
        body: ReqBody,
        content_type: Option<&'static str>,
        what: &'static str,
        mut on_line: impl FnMut(T) -> Result<Option<R>, ClientError>,
    ) -> Result<R, ClientError> {
        let name = format!("{method} {target}");
        self.block_on(async {
            let resp = self.send(method, target, body, content_type).await?;
            let mut body = resp.into_body();
            let mut lines = Lines::default();
            let end: RefCell<Option<R>> = RefCell::new(None);
            let mut each = |raw: &[u8]| -> Result<(), ClientError> {
                if end.borrow().is_none() {
                    *end.borrow_mut() = on_line(decode::<T>(raw, what)?)?;
                }
                Ok(())
            };
            while let Some(data) = next_data(&mut body, &name).await? {
                let too_long = || ClientError::TooLarge { request: name.clone(), limit: MAX_LINE };
                lines.feed(&data, too_long, &mut each)?;
                if let Some(done) = end.borrow_mut().take() {
                    return Ok(done);
                }
            }
            lines.finish(&mut each)?;
            end.into_inner().ok_or(ClientError::Truncated)
        })
    }
}

#[derive(Debug, Default)]
pub(crate) struct Lines {
    pending: Vec<u8>,
}

impl Lines {
    /// Adds `chunk` and calls `each` for every line it completes (without `\n` or a
    /// trailing `\r`; blank lines skipped). Fails when a line outgrows [`MAX_LINE`].
    pub(crate) fn feed<E>(
        &mut self,
        chunk: &[u8],
        too_long: impl FnOnce() -> E,
        mut each: impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut rest = chunk;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if self.pending.is_empty() {
                emit(head, &mut each)?;
            } else {
                self.pending.extend_from_slice(head);
                let line = std::mem::take(&mut self.pending);
                emit(&line, &mut each)?;
            }
        }
        self.pending.extend_from_slice(rest);
        if self.pending.len() > MAX_LINE {
            return Err(too_long());
        }
        Ok(())
    }

    /// The last line, if the body ended without a final newline.
    pub(crate) fn finish<E>(self, mut each: impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
        emit(&self.pending, &mut each)
    }
}

fn emit<E>(line: &[u8], each: &mut impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        return Ok(());
    }
    each(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(chunks: &[&[u8]]) -> Vec<String> {
        let mut lines = Lines::default();
        let mut out = Vec::new();
        for c in chunks {
            lines
                .feed::<()>(
                    c,
                    || (),
                    |l| {
                        out.push(String::from_utf8(l.to_vec()).unwrap());
                        Ok(())
                    },
                )
                .unwrap();
        }
        lines
            .finish::<()>(|l| {
                out.push(String::from_utf8(l.to_vec()).unwrap());
                Ok(())
            })
            .unwrap();
        out
    }

    #[test]
    fn lines_split_anywhere_come_out_whole() {
        let text = "{\"a\":\"é\"}\n{\"b\":2}\r\n\n{\"c\":3}\n";
        let want = vec!["{\"a\":\"é\"}", "{\"b\":2}", "{\"c\":3}"];
        let bytes = text.as_bytes();
        // Every way of cutting the text in two, and one byte per frame.
        for cut in 0..=bytes.len() {
            assert_eq!(split(&[&bytes[..cut], &bytes[cut..]]), want, "cut at {cut}");
        }
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(split(&singles), want);
    }

    #[test]
    fn a_last_line_without_newline_is_kept() {
        assert_eq!(split(&[b"{\"x\":1}\n{\"y\"", b":2}"]), vec!["{\"x\":1}", "{\"y\":2}"]);
    }

    #[test]
    fn an_endless_line_is_refused() {
        let mut lines = Lines::default();
        let big = vec![b'x'; MAX_LINE / 2 + 1];
        assert_eq!(lines.feed(&big, || "long", |_| Ok(())), Ok(()));
        assert_eq!(lines.feed(&big, || "long", |_| Ok(())), Err("long"));
    }
}
