//! `COPY --from=STAGE --chmod=MODE` of a directory: the stage's agent writes a tar stream
//! of it, and on its way through the host to the step's agent every file's and
//! directory's mode becomes MODE (symlinks and hard links keep theirs, as they have
//! none of their own).
//!
//! The stream is the guest's, so it is untrusted: it is read entry by entry in the
//! `tar` crate's raw mode (GNU long names and PAX records are passed through as the
//! entries they are, never gathered in memory), each header is rewritten and its data
//! copied as it comes, and nothing of it lands on the host's disk. The receiving agent
//! unpacks it confined to the destination, as any COPY. Fuzzed: `fuzz/fuzz_targets/tar_mode.rs`.

use std::io::{self, Read, Write};

/// Copies the tar archive `input` to `out` with the mode of every regular file and
/// directory set to `mode` (at most `0o7777`); returns the data bytes copied. An archive
/// that ends early or has a malformed header is an error (what was written so far is
/// then not a whole archive: the receiver refuses it).
pub fn copy_with_mode(input: impl Read, out: &mut dyn Write, mode: u32) -> io::Result<u64> {
    if mode > 0o7777 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("mode {mode:o} is more than 7777")));
    }
    let mut archive = tar::Archive::new(input);
    let mut copied = 0u64;
    for entry in archive.entries()?.raw(true) {
        let mut entry = entry?;
        let mut header = entry.header().clone();
        let kind = header.entry_type();
        if kind.is_file() || kind.is_dir() || kind == tar::EntryType::Continuous {
            header.set_mode(mode);
            header.set_cksum();
        }
        let size = header.entry_size()?;
        out.write_all(header.as_bytes())?;
        let n = io::copy(&mut (&mut entry).take(size), out)?;
        if n != size {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("an entry ended after {n} of {size} bytes"),
            ));
        }
        out.write_all(&[0u8; 512][..padding(size)])?;
        copied += size;
    }
    out.write_all(&[0u8; 1024])?;
    Ok(copied)
}

/// Zero bytes after `n` bytes of data, to the next 512-byte block.
fn padding(n: u64) -> usize {
    (512 - (n % 512) as usize) % 512
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let mut dir = tar::Header::new_gnu();
        dir.set_entry_type(tar::EntryType::Directory);
        dir.set_mode(0o700);
        dir.set_size(0);
        b.append_data(&mut dir, "sub/", io::empty()).unwrap();
        let mut file = tar::Header::new_gnu();
        file.set_mode(0o600);
        file.set_size(5);
        b.append_data(&mut file, "sub/a.txt", &b"hello"[..]).unwrap();
        // A name longer than a header holds: a GNU long-name entry goes first.
        let long = format!("sub/{}.txt", "n".repeat(150));
        let mut file = tar::Header::new_gnu();
        file.set_mode(0o644);
        file.set_size(3);
        b.append_data(&mut file, &long, &b"abc"[..]).unwrap();
        let mut link = tar::Header::new_gnu();
        link.set_entry_type(tar::EntryType::Symlink);
        link.set_mode(0o777);
        link.set_size(0);
        b.append_link(&mut link, "sub/link", "a.txt").unwrap();
        b.into_inner().unwrap()
    }

    #[test]
    fn files_and_directories_get_the_mode_and_links_and_contents_stay() {
        let mut out = Vec::new();
        assert_eq!(copy_with_mode(&archive()[..], &mut out, 0o750).unwrap(), 5 + 3 + (150 + 8 + 1));
        let mut a = tar::Archive::new(&out[..]);
        let mut seen = Vec::new();
        for e in a.entries().unwrap() {
            let mut e = e.unwrap();
            let path = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = String::new();
            e.read_to_string(&mut data).unwrap();
            let mode = e.header().mode().unwrap();
            let link = e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned());
            seen.push((path, mode, data, link));
        }
        let long = format!("sub/{}.txt", "n".repeat(150));
        assert_eq!(
            seen,
            [
                ("sub/".to_string(), 0o750, String::new(), None),
                ("sub/a.txt".to_string(), 0o750, "hello".to_string(), None),
                (long, 0o750, "abc".to_string(), None),
                ("sub/link".to_string(), 0o777, String::new(), Some("a.txt".to_string())),
            ]
        );
    }

    #[test]
    fn a_cut_or_corrupt_stream_and_a_bad_mode_are_errors() {
        let whole = archive();
        assert!(copy_with_mode(&whole[..700], &mut Vec::new(), 0o644).is_err(), "cut inside an entry");
        let mut bad = whole.clone();
        bad[148] ^= 0x55; // the first header's checksum
        assert!(copy_with_mode(&bad[..], &mut Vec::new(), 0o644).is_err());
        assert!(copy_with_mode(&whole[..], &mut Vec::new(), 0o17777).is_err());
        // Nothing at all is an empty archive.
        let mut out = Vec::new();
        assert_eq!(copy_with_mode(&[][..], &mut out, 0o644).unwrap(), 0);
        assert_eq!(out, [0u8; 1024]);
    }
}
