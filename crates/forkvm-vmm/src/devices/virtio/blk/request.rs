//! Parsing a virtio-blk descriptor chain into a typed request.
//!
//! The chain layout is guest-controlled, so this is kept apart from the file I/O and
//! tested on its own. A request is: a 16-byte header (type, reserved, sector) in
//! device-readable buffers, then data (device-readable for OUT, device-writable for IN
//! and GET_ID), then one device-writable status byte — the chain's last byte. The
//! driver may split any of these across descriptors however it likes (VERSION_1 implies
//! ANY_LAYOUT), so parsing works on byte ranges, not on descriptor positions.

use super::{SECTOR_SIZE, T_FLUSH, T_GET_ID, T_IN, T_OUT};
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

/// Size of the request header.
pub const HEADER_LEN: u64 = 16;

/// A guest buffer: `len` bytes at `addr`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// What the driver asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Read from `sector` into `data` (device-writable).
    In {
        sector: u64,
        data: Vec<Segment>,
    },
    /// Write `data` (device-readable) at `sector`.
    Out {
        sector: u64,
        data: Vec<Segment>,
    },
    Flush,
    /// Write the disk's serial into `data`.
    GetId {
        data: Vec<Segment>,
    },
    /// A request type this device does not implement.
    Unsupported {
        kind: u32,
    },
}

/// A chain whose status byte was found; `command` is the error to answer IOERR to if
/// the rest of the chain is malformed.
#[derive(Debug)]
pub struct Request {
    pub status: GuestAddress,
    pub command: Result<Command, RequestError>,
}

#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error("the chain does not end with a device-writable byte for the status")]
    NoStatusByte,
    #[error("a device-readable descriptor follows a device-writable one")]
    ReadableAfterWritable,
    #[error("the request header is {0} bytes, expected 16")]
    ShortHeader(u64),
    #[error("reading the request header")]
    ReadHeader(#[source] GuestMemoryError),
    #[error("the data is {0} bytes, not a multiple of 512")]
    DataNotSectorMultiple(u64),
}

/// Parses `chain` (whose buffers are in `mem`). `Err` only when there is no status
/// byte, i.e. nothing can be answered; other problems are in `Request::command`.
pub fn parse(mem: &GuestMemoryMmap, chain: DescriptorChain<&GuestMemoryMmap>) -> Result<Request, RequestError> {
    let mut readable = Vec::new();
    let mut writable = Vec::new();
    let mut misordered = false;
    let mut last: Option<(Segment, bool)> = None;
    for desc in chain {
        let seg = Segment { addr: desc.addr(), len: desc.len() };
        let is_writable = desc.is_write_only();
        last = Some((seg, is_writable));
        if is_writable {
            writable.push(seg);
        } else if writable.is_empty() {
            readable.push(seg);
        } else {
            misordered = true;
        }
    }
    let status = match last {
        Some((seg, true)) if seg.len > 0 => {
            seg.addr.checked_add(u64::from(seg.len) - 1).ok_or(RequestError::NoStatusByte)?
        }
        _ => return Err(RequestError::NoStatusByte),
    };
    // The status byte is not data.
    let (writable, _) = split_at(&writable, total_len(&writable) - 1);
    let command = if misordered { Err(RequestError::ReadableAfterWritable) } else { command(mem, &readable, writable) };
    Ok(Request { status, command })
}

fn command(mem: &GuestMemoryMmap, readable: &[Segment], writable: Vec<Segment>) -> Result<Command, RequestError> {
    let (header_segs, out_data) = split_at(readable, HEADER_LEN);
    let header_len = total_len(&header_segs);
    if header_len < HEADER_LEN {
        return Err(RequestError::ShortHeader(header_len));
    }
    let mut header = [0u8; HEADER_LEN as usize];
    let mut filled = 0usize;
    for seg in &header_segs {
        let end = filled + seg.len as usize;
        mem.read_slice(&mut header[filled..end], seg.addr).map_err(RequestError::ReadHeader)?;
        filled = end;
    }
    let kind = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let mut sector_bytes = [0u8; 8];
    sector_bytes.copy_from_slice(&header[8..16]);
    let sector = u64::from_le_bytes(sector_bytes);
    let whole_sectors = |data: Vec<Segment>| {
        let len = total_len(&data);
        if len & (SECTOR_SIZE - 1) == 0 {
            Ok(data)
        } else {
            Err(RequestError::DataNotSectorMultiple(len))
        }
    };
    Ok(match kind {
        T_IN => Command::In { sector, data: whole_sectors(writable)? },
        T_OUT => Command::Out { sector, data: whole_sectors(out_data)? },
        T_FLUSH => Command::Flush,
        T_GET_ID => Command::GetId { data: writable },
        kind => Command::Unsupported { kind },
    })
}

/// Total bytes in `segs`.
pub fn total_len(segs: &[Segment]) -> u64 {
    segs.iter().map(|s| u64::from(s.len)).sum()
}

/// Splits `segs` after `n` bytes; zero-length pieces are dropped.
pub fn split_at(segs: &[Segment], n: u64) -> (Vec<Segment>, Vec<Segment>) {
    let mut head = Vec::new();
    let mut tail = Vec::new();
    let mut left = n;
    for seg in segs {
        let take = u64::from(seg.len).min(left);
        left -= take;
        if take > 0 {
            head.push(Segment { addr: seg.addr, len: take as u32 });
        }
        let rest = u64::from(seg.len) - take;
        if rest > 0 {
            // `take` bytes past a guest address that was the start of a `len`-byte
            // buffer; wrapping is impossible unless the buffer itself wraps, which the
            // later memory access rejects.
            tail.push(Segment { addr: GuestAddress(seg.addr.0.wrapping_add(take)), len: rest as u32 });
        }
    }
    (head, tail)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::virtio::test_utils::{test_memory, Desc, TestQueue};
    use virtio_queue::{Queue, QueueT};

    fn header(mem: &GuestMemoryMmap, at: u64, kind: u32, sector: u64) {
        mem.write_obj(kind.to_le(), GuestAddress(at)).unwrap();
        mem.write_obj(0u32, GuestAddress(at + 4)).unwrap();
        mem.write_obj(sector.to_le(), GuestAddress(at + 8)).unwrap();
    }

    fn parse_chain(mem: &GuestMemoryMmap, descs: &[Desc]) -> Result<Request, RequestError> {
        let mut tq = TestQueue::new(GuestAddress(0), 16);
        tq.add_chain(mem, descs);
        let mut q: Queue = tq.queue();
        let chain = q.pop_descriptor_chain(mem).unwrap();
        parse(mem, chain)
    }

    #[test]
    fn parses_a_read_with_split_header_and_data() {
        let mem = test_memory();
        header(&mem, 0x10000, T_IN, 7);
        let req = parse_chain(
            &mem,
            &[Desc::r(0x10000, 8), Desc::r(0x10008, 8), Desc::w(0x20000, 512), Desc::w(0x30000, 513)],
        )
        .unwrap();
        assert_eq!(req.status, GuestAddress(0x30000 + 512));
        let data =
            vec![Segment { addr: GuestAddress(0x20000), len: 512 }, Segment { addr: GuestAddress(0x30000), len: 512 }];
        assert_eq!(req.command.unwrap(), Command::In { sector: 7, data });
    }

    #[test]
    fn parses_a_write_with_header_and_data_in_one_descriptor() {
        let mem = test_memory();
        header(&mem, 0x10000, T_OUT, 3);
        let req = parse_chain(&mem, &[Desc::r(0x10000, 16 + 1024), Desc::w(0x30000, 1)]).unwrap();
        let data = vec![Segment { addr: GuestAddress(0x10010), len: 1024 }];
        assert_eq!(req.command.unwrap(), Command::Out { sector: 3, data });
    }

    #[test]
    fn rejects_chains_without_status_short_headers_and_partial_sectors() {
        let mem = test_memory();
        header(&mem, 0x10000, T_IN, 0);
        assert!(matches!(parse_chain(&mem, &[Desc::r(0x10000, 16)]), Err(RequestError::NoStatusByte)));
        let short = parse_chain(&mem, &[Desc::r(0x10000, 8), Desc::w(0x30000, 1)]).unwrap();
        assert!(matches!(short.command, Err(RequestError::ShortHeader(8))));
        let partial = parse_chain(&mem, &[Desc::r(0x10000, 16), Desc::w(0x20000, 100), Desc::w(0x30000, 1)]).unwrap();
        assert!(matches!(partial.command, Err(RequestError::DataNotSectorMultiple(100))));
        let misordered =
            parse_chain(&mem, &[Desc::r(0x10000, 16), Desc::w(0x20000, 512), Desc::r(0x21000, 4), Desc::w(0x30000, 1)])
                .unwrap();
        assert!(matches!(misordered.command, Err(RequestError::ReadableAfterWritable)));
    }

    #[test]
    fn unknown_types_are_unsupported() {
        let mem = test_memory();
        header(&mem, 0x10000, 0xdead, 0);
        let req = parse_chain(&mem, &[Desc::r(0x10000, 16), Desc::w(0x30000, 1)]).unwrap();
        assert_eq!(req.command.unwrap(), Command::Unsupported { kind: 0xdead });
    }
}
