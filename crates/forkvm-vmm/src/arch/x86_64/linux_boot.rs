//! Linux boot protocol: put a kernel, its command line and initrd into guest memory and
//! fill the zero page, so a vCPU can jump straight to the kernel's 64-bit entry point.
//!
//! forkvm boots Linux without firmware and without the real-mode setup code: the VMM
//! builds long mode itself (see the boot GDT and page tables in `layout`) and enters the
//! kernel with `rsi` = [`LoadedKernel::boot_params_addr`], as the "64-bit boot protocol"
//! of `Documentation/arch/x86/boot.rst` describes. Two image formats are accepted:
//!
//! - an uncompressed `vmlinux` ELF, whose segments go to their physical addresses (which
//!   must lie at or above `HIMEM_START`) and whose entry is `e_entry`;
//! - a `bzImage`, whose protected-mode payload goes to `HIMEM_START` and whose 64-bit
//!   entry (`startup_64` of the decompressor) is 0x200 bytes into that payload.
//!
//! This module only writes guest memory and reports where things went; registers, page
//! tables and the GDT are set up by the caller.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

use linux_loader::loader::bootparam::{
    boot_e820_entry, boot_params, setup_header, CAN_USE_HEAP, E820_MAX_ENTRIES_ZEROPAGE, LOADED_HIGH, XLF_KERNEL_64,
};
use linux_loader::loader::{BzImage, Elf, KernelLoader};
use vm_memory::{Bytes, GuestAddress, GuestMemoryError, GuestMemoryMmap};

use super::layout;

/// First four bytes of every ELF file.
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// `e_ident[EI_CLASS]` value of a 64-bit ELF.
const ELF_CLASS_64: u8 = 2;
/// `e_machine` of x86-64.
const ELF_MACHINE_X86_64: u16 = 62;
/// File offsets of the bzImage boot-sector flag and of the setup header magic.
const BOOT_FLAG_OFFSET: usize = 0x1fe;
const HDRS_OFFSET: usize = 0x202;
/// How many leading bytes of the kernel file are enough to tell the formats apart.
const PROBE_LEN: usize = HDRS_OFFSET + 4;
/// `boot_flag` (0xAA55) and `header` ("HdrS") magic values of the setup header.
const BOOT_FLAG_MAGIC: u16 = 0xaa55;
const HDRS_MAGIC: u32 = 0x5372_6448;
/// Boot protocol version we claim when the kernel (ELF) has no setup header of its own:
/// 2.06 covers every header field we fill (cmd_line_ptr, initrd_addr_max,
/// kernel_alignment, cmdline_size).
const SYNTHETIC_HEADER_VERSION: u16 = 0x0206;
/// Offset of `startup_64` in the protected-mode part of a bzImage.
const BZIMAGE_64BIT_ENTRY_OFFSET: u64 = 0x200;
/// `type_of_loader` for a boot loader without an assigned id.
const LOADER_TYPE_UNDEFINED: u8 = 0xff;
/// `heap_end_ptr`: end of the setup heap (0xe000) minus 0x200, per boot.rst. Only the
/// real-mode setup code uses it, which we skip, but it must be valid with `CAN_USE_HEAP`.
const HEAP_END_PTR: u16 = 0xe000 - 0x200;
/// Highest initrd address (inclusive) for kernels that do not say (boot protocol < 2.03).
const DEFAULT_INITRD_ADDR_MAX: u32 = 0x37ff_ffff;
/// `kernel_alignment` when the kernel gives none: the usual `CONFIG_PHYSICAL_ALIGN`.
const DEFAULT_KERNEL_ALIGNMENT: u32 = 0x100_0000;
/// The initrd starts on a page boundary.
const PAGE_SIZE: u64 = 0x1000;
/// e820 type of usable RAM.
pub const E820_RAM: u32 = 1;

/// Which kind of kernel image `load_linux` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KernelFormat {
    /// Uncompressed `vmlinux` ELF.
    Elf,
    /// Compressed `bzImage` (setup sectors + self-decompressing payload).
    BzImage,
}

/// What to boot: the kernel image, an optional initrd and the command line.
#[derive(Debug)]
pub struct LinuxBootConfig<'a> {
    pub kernel: &'a mut File,
    pub initrd: Option<&'a mut File>,
    pub cmdline: &'a str,
}

/// Where the kernel was put and how to enter it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedKernel {
    /// 64-bit entry point: jump here in long mode with `rsi` = `boot_params_addr`.
    pub entry: GuestAddress,
    pub format: KernelFormat,
    /// The zero page (`boot_params`); always `layout::ZERO_PAGE_START`.
    pub boot_params_addr: GuestAddress,
    /// Guest address and size in bytes of the initrd, if one was loaded.
    pub initrd: Option<(u64, u64)>,
}

/// One entry of the e820 memory map handed to the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E820Entry {
    pub addr: u64,
    pub size: u64,
    /// e820 type, e.g. [`E820_RAM`].
    pub kind: u32,
}

/// Why loading Linux failed; each variant names the step.
#[derive(Debug, thiserror::Error)]
pub enum LinuxBootError {
    #[error("failed to read the kernel image")]
    ReadKernel(#[source] io::Error),
    #[error("the kernel image is neither an ELF vmlinux nor a bzImage")]
    UnknownKernelFormat,
    #[error("the ELF kernel is not 64-bit x86-64 (class {class}, machine {machine})")]
    UnsupportedElf { class: u8, machine: u16 },
    #[error("the bzImage has no 64-bit entry point (boot protocol {version:#06x}, xloadflags {xloadflags:#x})")]
    No64BitEntry { version: u16, xloadflags: u16 },
    #[error("failed to load the kernel image")]
    LoadKernel(#[source] linux_loader::loader::Error),
    #[error("the kernel command line takes {len} bytes with its NUL, more than the {max} allowed")]
    CommandLineTooLong { len: usize, max: usize },
    #[error("the kernel command line contains a NUL byte")]
    CommandLineHasNul,
    #[error("failed to write the kernel command line to guest memory")]
    WriteCommandLine(#[source] GuestMemoryError),
    #[error("failed to read the initrd")]
    ReadInitrd(#[source] io::Error),
    #[error("the initrd ({size} bytes) does not fit between the kernel end {kernel_end:#x} and {limit:#x}")]
    InitrdTooLarge { size: u64, kernel_end: u64, limit: u64 },
    #[error("failed to load the initrd into guest memory")]
    LoadInitrd(#[source] GuestMemoryError),
    #[error("failed to write boot_params to the zero page")]
    WriteBootParams(#[source] GuestMemoryError),
}

/// Loads the kernel, command line and initrd of `config` into `mem` (which holds
/// `mem_size` bytes of RAM laid out as `layout::ram_regions`) and writes the zero page.
pub fn load_linux(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    config: LinuxBootConfig<'_>,
) -> Result<LoadedKernel, LinuxBootError> {
    let LinuxBootConfig { kernel, initrd, cmdline } = config;
    let himem = GuestAddress(layout::HIMEM_START);

    let format = detect_format(kernel)?;
    let (entry, header, kernel_end) = match format {
        KernelFormat::Elf => {
            // No offset: a vmlinux runs at the physical addresses it was linked for.
            let loaded = Elf::load(mem, None, kernel, Some(himem)).map_err(LinuxBootError::LoadKernel)?;
            (loaded.kernel_load, None, loaded.kernel_end)
        }
        KernelFormat::BzImage => {
            let loaded = BzImage::load(mem, Some(himem), kernel, Some(himem)).map_err(LinuxBootError::LoadKernel)?;
            // The bzImage loader always returns the header it parsed.
            let hdr = loaded.setup_header.unwrap_or_default();
            let (version, xloadflags) = (hdr.version, hdr.xloadflags);
            if version < 0x020c || xloadflags & XLF_KERNEL_64 == 0 {
                return Err(LinuxBootError::No64BitEntry { version, xloadflags });
            }
            let entry = GuestAddress(layout::HIMEM_START + BZIMAGE_64BIT_ENTRY_OFFSET);
            (entry, Some(hdr), bzimage_footprint_end(&hdr, loaded.kernel_end))
        }
    };

    write_cmdline(mem, cmdline, cmdline_max(header.as_ref()))?;

    let initrd = match initrd {
        Some(file) => {
            let lowest = kernel_end.next_multiple_of(PAGE_SIZE);
            let limit = initrd_limit(mem_size, header.as_ref());
            Some(load_initrd(mem, file, lowest, limit)?)
        }
        None => None,
    };

    let params = build_boot_params(header, cmdline.len(), initrd, mem_size);
    let boot_params_addr = GuestAddress(layout::ZERO_PAGE_START);
    mem.write_obj(params, boot_params_addr).map_err(LinuxBootError::WriteBootParams)?;

    Ok(LoadedKernel { entry, format, boot_params_addr, initrd })
}

/// The e820 map for `mem_size` bytes of guest RAM: every region of
/// `layout::ram_regions` as RAM, minus the legacy hole [EBDA_START, HIMEM_START)
/// (EBDA, VGA window and BIOS area, which a PC never reports as RAM).
pub fn e820_entries(mem_size: u64) -> Vec<E820Entry> {
    let mut entries = Vec::new();
    let mut push = |start: u64, end: u64| {
        if end > start {
            entries.push(E820Entry { addr: start, size: end - start, kind: E820_RAM });
        }
    };
    for (start, size) in layout::ram_regions(mem_size) {
        let end = start + size;
        push(start, end.min(layout::EBDA_START));
        push(start.max(layout::HIMEM_START), end);
    }
    entries
}

/// Tells the formats apart by their magic numbers: `\x7fELF` at 0, or the bzImage
/// boot flag 0xAA55 at 0x1fe together with "HdrS" at 0x202.
fn detect_format(kernel: &mut File) -> Result<KernelFormat, LinuxBootError> {
    kernel.rewind().map_err(LinuxBootError::ReadKernel)?;
    let mut probe = Vec::with_capacity(PROBE_LEN);
    Read::by_ref(kernel).take(PROBE_LEN as u64).read_to_end(&mut probe).map_err(LinuxBootError::ReadKernel)?;
    kernel.rewind().map_err(LinuxBootError::ReadKernel)?;

    if probe.starts_with(ELF_MAGIC) {
        let class = probe.get(4).copied().unwrap_or(0);
        let machine = probe.get(18..20).map_or(0, |b| u16::from_le_bytes([b[0], b[1]]));
        if class != ELF_CLASS_64 || machine != ELF_MACHINE_X86_64 {
            return Err(LinuxBootError::UnsupportedElf { class, machine });
        }
        return Ok(KernelFormat::Elf);
    }
    if probe.len() == PROBE_LEN {
        let flag = u16::from_le_bytes([probe[BOOT_FLAG_OFFSET], probe[BOOT_FLAG_OFFSET + 1]]);
        let magic = u32::from_le_bytes([
            probe[HDRS_OFFSET],
            probe[HDRS_OFFSET + 1],
            probe[HDRS_OFFSET + 2],
            probe[HDRS_OFFSET + 3],
        ]);
        if flag == BOOT_FLAG_MAGIC && magic == HDRS_MAGIC {
            return Ok(KernelFormat::BzImage);
        }
    }
    Err(LinuxBootError::UnknownKernelFormat)
}

/// End of the memory a bzImage kernel needs once it has decompressed itself. The
/// decompressor (boot protocol 2.10+) runs the kernel at the load address rounded up to
/// `kernel_alignment`, or at `pref_address` if that is higher, and needs `init_size`
/// bytes there; anything we place must stay above that.
fn bzimage_footprint_end(hdr: &setup_header, payload_end: u64) -> u64 {
    if hdr.version < 0x020a {
        return payload_end;
    }
    let align = u64::from(hdr.kernel_alignment).max(1);
    let runtime_start = layout::HIMEM_START.next_multiple_of(align).max(hdr.pref_address);
    payload_end.max(runtime_start.saturating_add(u64::from(hdr.init_size)))
}

/// Longest command line (with its NUL) we accept: our buffer, or less if the kernel
/// says it takes less (`cmdline_size`, boot protocol 2.06+, excludes the NUL).
fn cmdline_max(header: Option<&setup_header>) -> usize {
    let kernel_max = header
        .filter(|h| h.version >= 0x0206 && h.cmdline_size != 0)
        .map_or(usize::MAX, |h| (h.cmdline_size as usize).saturating_add(1));
    layout::CMDLINE_MAX_SIZE.min(kernel_max)
}

/// Writes `cmdline` and its terminating NUL at `layout::CMDLINE_START`.
fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str, max: usize) -> Result<(), LinuxBootError> {
    let len = cmdline.len() + 1;
    if len > max {
        return Err(LinuxBootError::CommandLineTooLong { len, max });
    }
    if cmdline.as_bytes().contains(&0) {
        return Err(LinuxBootError::CommandLineHasNul);
    }
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(cmdline.as_bytes());
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(layout::CMDLINE_START)).map_err(LinuxBootError::WriteCommandLine)
}

/// Exclusive upper bound for the initrd: the end of low RAM (RAM or the MMIO gap), and
/// the kernel's `initrd_addr_max` (protocol 2.03+; 0x37ffffff for older or ELF kernels).
fn initrd_limit(mem_size: u64, header: Option<&setup_header>) -> u64 {
    let addr_max = header
        .filter(|h| h.version >= 0x0203 && h.initrd_addr_max != 0)
        .map_or(DEFAULT_INITRD_ADDR_MAX, |h| h.initrd_addr_max);
    mem_size.min(layout::MMIO_GAP_START).min(u64::from(addr_max) + 1)
}

/// Copies the whole of `file` page-aligned at the highest address in [lowest, limit).
fn load_initrd(mem: &GuestMemoryMmap, file: &mut File, lowest: u64, limit: u64) -> Result<(u64, u64), LinuxBootError> {
    let size = file.seek(SeekFrom::End(0)).map_err(LinuxBootError::ReadInitrd)?;
    file.rewind().map_err(LinuxBootError::ReadInitrd)?;
    let too_large = LinuxBootError::InitrdTooLarge { size, kernel_end: lowest, limit };
    let Some(top) = limit.checked_sub(size) else {
        return Err(too_large);
    };
    let addr = top & !(PAGE_SIZE - 1);
    if addr < lowest {
        return Err(too_large);
    }
    let count = usize::try_from(size).map_err(|_| too_large)?;
    mem.read_exact_volatile_from(GuestAddress(addr), file, count).map_err(LinuxBootError::LoadInitrd)?;
    Ok((addr, size))
}

/// The zero page: the kernel's own setup header if it has one (so fields such as
/// `init_size` and `kernel_alignment` reach the decompressor), or a minimal synthetic one,
/// plus what the loader fills in: loader type, flags, command line, initrd and e820 map.
fn build_boot_params(
    header: Option<setup_header>,
    cmdline_len: usize,
    initrd: Option<(u64, u64)>,
    mem_size: u64,
) -> boot_params {
    let mut params = boot_params {
        hdr: header.unwrap_or(setup_header {
            boot_flag: BOOT_FLAG_MAGIC,
            header: HDRS_MAGIC,
            version: SYNTHETIC_HEADER_VERSION,
            ..Default::default()
        }),
        ..Default::default()
    };
    let hdr = &mut params.hdr;
    hdr.type_of_loader = LOADER_TYPE_UNDEFINED;
    hdr.loadflags |= LOADED_HIGH;
    if hdr.version >= 0x0201 {
        hdr.heap_end_ptr = HEAP_END_PTR;
        hdr.loadflags |= CAN_USE_HEAP;
    }
    if hdr.kernel_alignment == 0 {
        hdr.kernel_alignment = DEFAULT_KERNEL_ALIGNMENT;
    }
    // The command line and the initrd live below the MMIO gap, so below 4 GiB: the
    // 32-bit fields hold them without loss.
    hdr.cmd_line_ptr = layout::CMDLINE_START as u32;
    hdr.cmdline_size = cmdline_len as u32;
    if let Some((addr, size)) = initrd {
        hdr.ramdisk_image = addr as u32;
        hdr.ramdisk_size = size as u32;
    }

    let entries = e820_entries(mem_size);
    debug_assert!(entries.len() <= E820_MAX_ENTRIES_ZEROPAGE);
    for (slot, entry) in params.e820_table.iter_mut().zip(&entries) {
        *slot = boot_e820_entry { addr: entry.addr, size: entry.size, r#type: entry.kind };
    }
    params.e820_entries = entries.len().min(E820_MAX_ENTRIES_ZEROPAGE) as u8;
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const MEM_SIZE: u64 = 64 << 20;
    const MIB: u64 = 1 << 20;

    fn guest_mem() -> GuestMemoryMmap {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), MEM_SIZE as usize)]).unwrap()
    }

    fn file_with(bytes: &[u8]) -> File {
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(bytes).unwrap();
        file.rewind().unwrap();
        file
    }

    fn put(buf: &mut [u8], offset: usize, bytes: &[u8]) {
        buf[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// `hlt; jmp $-1`, so the code is recognisable in guest memory.
    const CODE: &[u8] = &[0x90, 0x90, 0xf4, 0xeb, 0xfd];

    /// A minimal ELF64 x86-64 executable: header, one PT_LOAD header, then `CODE`,
    /// loaded at physical address `paddr` with entry `entry`.
    fn elf_image(machine: u16, paddr: u64, entry: u64) -> Vec<u8> {
        const EHDR_SIZE: usize = 64;
        const PHDR_SIZE: usize = 56;
        let code_offset = EHDR_SIZE + PHDR_SIZE;
        let mut img = vec![0u8; code_offset + CODE.len()];
        put(&mut img, 0, b"\x7fELF");
        put(&mut img, 4, &[2, 1, 1]); // ELFCLASS64, little endian, EV_CURRENT
        put(&mut img, 16, &2u16.to_le_bytes()); // ET_EXEC
        put(&mut img, 18, &machine.to_le_bytes());
        put(&mut img, 20, &1u32.to_le_bytes()); // e_version
        put(&mut img, 24, &entry.to_le_bytes());
        put(&mut img, 32, &(EHDR_SIZE as u64).to_le_bytes()); // e_phoff
        put(&mut img, 52, &(EHDR_SIZE as u16).to_le_bytes()); // e_ehsize
        put(&mut img, 54, &(PHDR_SIZE as u16).to_le_bytes()); // e_phentsize
        put(&mut img, 56, &1u16.to_le_bytes()); // e_phnum
        let ph = EHDR_SIZE;
        put(&mut img, ph, &1u32.to_le_bytes()); // PT_LOAD
        put(&mut img, ph + 4, &5u32.to_le_bytes()); // R + X
        put(&mut img, ph + 8, &(code_offset as u64).to_le_bytes()); // p_offset
        let vaddr = 0xffff_ffff_8000_0000 | paddr;
        put(&mut img, ph + 16, &vaddr.to_le_bytes()); // p_vaddr
        put(&mut img, ph + 24, &paddr.to_le_bytes()); // p_paddr
        put(&mut img, ph + 32, &(CODE.len() as u64).to_le_bytes()); // p_filesz
        put(&mut img, ph + 40, &0x1000u64.to_le_bytes()); // p_memsz
        put(&mut img, ph + 48, &0x1000u64.to_le_bytes()); // p_align
        put(&mut img, code_offset, CODE);
        img
    }

    struct FakeBzImage {
        xloadflags: u16,
        initrd_addr_max: u32,
        cmdline_size: u32,
    }

    impl Default for FakeBzImage {
        fn default() -> Self {
            Self { xloadflags: XLF_KERNEL_64, initrd_addr_max: 0x2ff_ffff, cmdline_size: 0x7ff }
        }
    }

    const SETUP_SECTS: u8 = 3;
    const BZ_KERNEL_ALIGNMENT: u32 = 0x20_0000;
    const BZ_PREF_ADDRESS: u64 = 0x100_0000;
    const BZ_INIT_SIZE: u32 = 0x100_0000;

    impl FakeBzImage {
        /// Boot sector + setup sectors with a 2.15 setup header at 0x1f1, then a
        /// protected-mode payload whose byte `i` is `i as u8`, with `CODE` at 0x200.
        fn build(&self) -> Vec<u8> {
            let setup_len = (usize::from(SETUP_SECTS) + 1) * 512;
            let mut img = vec![0u8; setup_len + 0x1000];
            put(&mut img, 0x1f1, &[SETUP_SECTS]);
            put(&mut img, 0x1fe, &0xaa55u16.to_le_bytes());
            put(&mut img, 0x200, &[0xeb, 0x66]); // jmp over the header
            put(&mut img, 0x202, b"HdrS");
            put(&mut img, 0x206, &0x020fu16.to_le_bytes());
            put(&mut img, 0x211, &[LOADED_HIGH]);
            put(&mut img, 0x214, &0x10_0000u32.to_le_bytes()); // code32_start
            put(&mut img, 0x22c, &self.initrd_addr_max.to_le_bytes());
            put(&mut img, 0x230, &BZ_KERNEL_ALIGNMENT.to_le_bytes());
            put(&mut img, 0x234, &[1]); // relocatable_kernel
            put(&mut img, 0x236, &self.xloadflags.to_le_bytes());
            put(&mut img, 0x238, &self.cmdline_size.to_le_bytes());
            put(&mut img, 0x258, &BZ_PREF_ADDRESS.to_le_bytes());
            put(&mut img, 0x260, &BZ_INIT_SIZE.to_le_bytes());
            for (i, byte) in img[setup_len..].iter_mut().enumerate() {
                *byte = i as u8;
            }
            put(&mut img, setup_len + 0x200, CODE);
            img
        }
    }

    fn boot(
        mem: &GuestMemoryMmap,
        kernel: &[u8],
        initrd: Option<&[u8]>,
        cmdline: &str,
    ) -> Result<LoadedKernel, LinuxBootError> {
        let mut kernel = file_with(kernel);
        let mut initrd = initrd.map(file_with);
        load_linux(mem, MEM_SIZE, LinuxBootConfig { kernel: &mut kernel, initrd: initrd.as_mut(), cmdline })
    }

    fn read_params(mem: &GuestMemoryMmap) -> boot_params {
        mem.read_obj(GuestAddress(layout::ZERO_PAGE_START)).unwrap()
    }

    fn read_bytes(mem: &GuestMemoryMmap, addr: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        mem.read_slice(&mut buf, GuestAddress(addr)).unwrap();
        buf
    }

    fn e820_of(params: &boot_params) -> Vec<E820Entry> {
        let table = params.e820_table;
        table[..usize::from(params.e820_entries)]
            .iter()
            .map(|e| E820Entry { addr: e.addr, size: e.size, kind: e.r#type })
            .collect()
    }

    #[test]
    fn elf_loads_at_its_physical_address_with_a_synthetic_header() {
        let mem = guest_mem();
        let img = elf_image(ELF_MACHINE_X86_64, 2 * MIB, 2 * MIB + 2);
        let cmdline = "console=ttyS0 reboot=k panic=1";
        let loaded = boot(&mem, &img, None, cmdline).unwrap();

        assert_eq!(loaded.format, KernelFormat::Elf);
        assert_eq!(loaded.entry, GuestAddress(2 * MIB + 2));
        assert_eq!(loaded.boot_params_addr, GuestAddress(layout::ZERO_PAGE_START));
        assert_eq!(loaded.initrd, None);
        assert_eq!(read_bytes(&mem, 2 * MIB, CODE.len()), CODE);

        let mut expected_cmdline = cmdline.as_bytes().to_vec();
        expected_cmdline.push(0);
        assert_eq!(read_bytes(&mem, layout::CMDLINE_START, expected_cmdline.len()), expected_cmdline);

        let params = read_params(&mem);
        let hdr = params.hdr;
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert!({ hdr.version } >= 0x0202);
        assert_eq!(hdr.type_of_loader, 0xff);
        assert_eq!(hdr.loadflags, LOADED_HIGH | CAN_USE_HEAP);
        assert_eq!({ hdr.heap_end_ptr }, 0xde00);
        assert_eq!({ hdr.cmd_line_ptr }, layout::CMDLINE_START as u32);
        assert_eq!({ hdr.cmdline_size }, cmdline.len() as u32);
        assert_ne!({ hdr.kernel_alignment }, 0);
        assert_eq!({ hdr.ramdisk_image }, 0);
        assert_eq!({ hdr.ramdisk_size }, 0);
        assert_eq!(e820_of(&params), e820_entries(MEM_SIZE));
        assert_eq!(params.e820_entries, 2);
    }

    #[test]
    fn elf_entry_below_himem_is_rejected() {
        let img = elf_image(ELF_MACHINE_X86_64, 0x8000, 0x8000);
        let err = boot(&guest_mem(), &img, None, "").unwrap_err();
        assert!(matches!(err, LinuxBootError::LoadKernel(_)), "{err:?}");
    }

    #[test]
    fn elf_for_another_machine_is_rejected() {
        let img = elf_image(183 /* aarch64 */, 2 * MIB, 2 * MIB);
        let err = boot(&guest_mem(), &img, None, "").unwrap_err();
        assert!(matches!(err, LinuxBootError::UnsupportedElf { class: 2, machine: 183 }), "{err:?}");
    }

    #[test]
    fn bzimage_payload_goes_to_himem_and_enters_at_startup_64() {
        let mem = guest_mem();
        let img = FakeBzImage::default().build();
        let loaded = boot(&mem, &img, None, "quiet").unwrap();

        assert_eq!(loaded.format, KernelFormat::BzImage);
        assert_eq!(loaded.entry, GuestAddress(layout::HIMEM_START + BZIMAGE_64BIT_ENTRY_OFFSET));
        // The payload, not the setup sectors, starts at HIMEM_START.
        assert_eq!(read_bytes(&mem, layout::HIMEM_START, 4), [0, 1, 2, 3]);
        assert_eq!(read_bytes(&mem, loaded.entry.0, CODE.len()), CODE);

        let hdr = read_params(&mem).hdr;
        // Copied from the image's setup header.
        assert_eq!(hdr.setup_sects, SETUP_SECTS);
        assert_eq!({ hdr.boot_flag }, 0xaa55);
        assert_eq!({ hdr.header }, 0x5372_6448);
        assert_eq!({ hdr.version }, 0x020f);
        assert_eq!({ hdr.kernel_alignment }, BZ_KERNEL_ALIGNMENT);
        assert_eq!(hdr.relocatable_kernel, 1);
        assert_eq!({ hdr.xloadflags }, XLF_KERNEL_64);
        assert_eq!({ hdr.pref_address }, BZ_PREF_ADDRESS);
        assert_eq!({ hdr.init_size }, BZ_INIT_SIZE);
        assert_eq!({ hdr.initrd_addr_max }, 0x2ff_ffff);
        assert_eq!({ hdr.code32_start }, layout::HIMEM_START as u32);
        // Filled in by the loader.
        assert_eq!(hdr.type_of_loader, 0xff);
        assert_eq!(hdr.loadflags, LOADED_HIGH | CAN_USE_HEAP);
        assert_eq!({ hdr.heap_end_ptr }, 0xde00);
        assert_eq!({ hdr.cmd_line_ptr }, layout::CMDLINE_START as u32);
        assert_eq!({ hdr.cmdline_size }, 5);
        assert_eq!(read_bytes(&mem, layout::CMDLINE_START, 6), b"quiet\0");
    }

    #[test]
    fn bzimage_without_64bit_entry_is_rejected() {
        let img = FakeBzImage { xloadflags: 0, ..Default::default() }.build();
        let err = boot(&guest_mem(), &img, None, "").unwrap_err();
        assert!(matches!(err, LinuxBootError::No64BitEntry { xloadflags: 0, .. }), "{err:?}");
    }

    #[test]
    fn initrd_goes_page_aligned_to_the_top_of_memory() {
        let mem = guest_mem();
        let initrd: Vec<u8> = (0..5000u32).map(|i| (i * 7) as u8).collect();
        let img = elf_image(ELF_MACHINE_X86_64, 2 * MIB, 2 * MIB);
        let loaded = boot(&mem, &img, Some(&initrd), "").unwrap();

        let (addr, size) = loaded.initrd.unwrap();
        assert_eq!(size, 5000);
        assert_eq!(addr, MEM_SIZE - 0x2000);
        assert_eq!(read_bytes(&mem, addr, initrd.len()), initrd);
        let hdr = read_params(&mem).hdr;
        assert_eq!({ hdr.ramdisk_image }, addr as u32);
        assert_eq!({ hdr.ramdisk_size }, 5000);
    }

    #[test]
    fn initrd_stays_below_the_bzimage_initrd_addr_max() {
        let mem = guest_mem();
        let initrd = vec![0x5a; 3 * 0x1000 + 1];
        let img = FakeBzImage::default().build();
        let loaded = boot(&mem, &img, Some(&initrd), "").unwrap();

        let (addr, size) = loaded.initrd.unwrap();
        assert_eq!(addr % PAGE_SIZE, 0);
        assert!(addr + size <= 0x300_0000);
        assert_eq!(addr, 0x300_0000 - 4 * 0x1000);
        assert_eq!(read_bytes(&mem, addr, initrd.len()), initrd);
        assert_eq!({ read_params(&mem).hdr.ramdisk_image }, addr as u32);
    }

    #[test]
    fn initrd_overlapping_the_decompressed_kernel_is_refused() {
        // The fake kernel runs at pref_address (16 MiB) and needs init_size (16 MiB), so
        // only [32 MiB, 48 MiB) is free for the initrd.
        let mut initrd = tempfile::tempfile().unwrap();
        initrd.set_len(20 * MIB).unwrap();
        let mut kernel = file_with(&FakeBzImage::default().build());
        let err = load_linux(
            &guest_mem(),
            MEM_SIZE,
            LinuxBootConfig { kernel: &mut kernel, initrd: Some(&mut initrd), cmdline: "" },
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                LinuxBootError::InitrdTooLarge {
                    size,
                    kernel_end: 0x200_0000,
                    limit: 0x300_0000,
                } if size == 20 * MIB
            ),
            "{err:?}"
        );
    }

    #[test]
    fn initrd_larger_than_memory_is_refused() {
        let mut initrd = tempfile::tempfile().unwrap();
        initrd.set_len(MEM_SIZE).unwrap();
        let mut kernel = file_with(&elf_image(ELF_MACHINE_X86_64, 2 * MIB, 2 * MIB));
        let err = load_linux(
            &guest_mem(),
            MEM_SIZE,
            LinuxBootConfig { kernel: &mut kernel, initrd: Some(&mut initrd), cmdline: "" },
        )
        .unwrap_err();
        assert!(matches!(err, LinuxBootError::InitrdTooLarge { .. }), "{err:?}");
    }

    #[test]
    fn initrd_limit_honours_memory_gap_and_kernel_maximum() {
        let hdr = |version: u16, initrd_addr_max: u32| setup_header { version, initrd_addr_max, ..Default::default() };
        assert_eq!(initrd_limit(MEM_SIZE, None), MEM_SIZE);
        assert_eq!(initrd_limit(5 << 30, None), 0x3800_0000);
        assert_eq!(initrd_limit(5 << 30, Some(&hdr(0x020f, 0x7fff_ffff))), 0x8000_0000);
        assert_eq!(initrd_limit(5 << 30, Some(&hdr(0x020f, 0xffff_ffff))), layout::MMIO_GAP_START);
        // Before 2.03 the field does not exist.
        assert_eq!(initrd_limit(5 << 30, Some(&hdr(0x0202, 0xffff_ffff))), 0x3800_0000);
    }

    #[test]
    fn command_line_longer_than_the_buffer_is_refused() {
        let img = elf_image(ELF_MACHINE_X86_64, 2 * MIB, 2 * MIB);
        let cmdline = "x".repeat(layout::CMDLINE_MAX_SIZE);
        let err = boot(&guest_mem(), &img, None, &cmdline).unwrap_err();
        assert!(
            matches!(
                err,
                LinuxBootError::CommandLineTooLong { len, max }
                    if len == layout::CMDLINE_MAX_SIZE + 1 && max == layout::CMDLINE_MAX_SIZE
            ),
            "{err:?}"
        );
        // One byte shorter fits exactly, NUL included.
        let cmdline = "x".repeat(layout::CMDLINE_MAX_SIZE - 1);
        boot(&guest_mem(), &img, None, &cmdline).unwrap();
    }

    #[test]
    fn command_line_longer_than_the_kernel_takes_is_refused() {
        let img = FakeBzImage::default().build();
        let err = boot(&guest_mem(), &img, None, &"y".repeat(0x800)).unwrap_err();
        assert!(matches!(err, LinuxBootError::CommandLineTooLong { len: 0x801, max: 0x800 }), "{err:?}");
    }

    #[test]
    fn command_line_with_nul_is_refused() {
        let img = elf_image(ELF_MACHINE_X86_64, 2 * MIB, 2 * MIB);
        let err = boot(&guest_mem(), &img, None, "a\0b").unwrap_err();
        assert!(matches!(err, LinuxBootError::CommandLineHasNul), "{err:?}");
    }

    #[test]
    fn garbage_and_empty_files_are_unknown_formats() {
        let garbage: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 7) as u8).collect();
        for img in [&garbage[..], &[], b"\x7fEL"] {
            let err = boot(&guest_mem(), img, None, "").unwrap_err();
            assert!(matches!(err, LinuxBootError::UnknownKernelFormat), "{err:?}");
        }
    }

    #[test]
    fn e820_for_512_mib() {
        let mem_size = 512 * MIB;
        assert_eq!(
            e820_entries(mem_size),
            vec![
                E820Entry { addr: 0, size: layout::EBDA_START, kind: E820_RAM },
                E820Entry { addr: layout::HIMEM_START, size: mem_size - layout::HIMEM_START, kind: E820_RAM },
            ]
        );
    }

    #[test]
    fn e820_for_5_gib_skips_the_mmio_gap() {
        let mem_size = 5 << 30;
        let expected = vec![
            E820Entry { addr: 0, size: layout::EBDA_START, kind: E820_RAM },
            E820Entry { addr: layout::HIMEM_START, size: layout::MMIO_GAP_START - layout::HIMEM_START, kind: E820_RAM },
            E820Entry { addr: layout::MMIO_GAP_END, size: mem_size - layout::MMIO_GAP_START, kind: E820_RAM },
        ];
        assert_eq!(e820_entries(mem_size), expected);
        // And the zero page carries all three.
        let params = build_boot_params(None, 0, None, mem_size);
        assert_eq!(e820_of(&params), expected);
    }

    #[test]
    fn e820_for_memory_ending_at_the_gap_and_below_himem() {
        assert_eq!(e820_entries(layout::MMIO_GAP_START).len(), 2);
        assert_eq!(e820_entries(0x8_0000), vec![E820Entry { addr: 0, size: 0x8_0000, kind: E820_RAM }]);
    }
}
