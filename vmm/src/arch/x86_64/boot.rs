//! Guest memory map, kernel/initrd loading and the boot information the kernel
//! reads: the Linux zero page (64-bit boot protocol) or the PVH start info.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use linux_loader::loader::bootparam::{boot_e820_entry, boot_params};
use linux_loader::loader::elf::start_info::{
    hvm_memmap_table_entry, hvm_modlist_entry, hvm_start_info, XEN_HVM_START_MAGIC_VALUE,
};
use linux_loader::loader::{BzImage, Elf, KernelLoader, PvhBootCapability};
use vm_memory::{Address, Bytes, GuestAddress};

use super::layout::*;
use super::regs::BootProtocol;
use crate::vstate::memory::GuestMemoryMmap;

pub const E820_RAM: u32 = 1;
pub const E820_RESERVED: u32 = 2;
const MIB: u64 = 1 << 20;
const ELF_MAGIC: [u8; 4] = *b"\x7fELF";
const KERNEL_BOOT_FLAG_MAGIC: u16 = 0xaa55;
const KERNEL_HDR_MAGIC: u32 = 0x5372_6448; // "HdrS"
const KERNEL_LOADER_OTHER: u8 = 0xff;
const KERNEL_MIN_ALIGNMENT: u32 = 0x0100_0000;
/// Default highest initrd address for kernels that do not say (boot protocol < 2.03).
const DEFAULT_INITRD_ADDR_MAX: u64 = 0x37ff_ffff;

#[derive(Debug, thiserror::Error)]
pub enum BootError {
    #[error("cannot open kernel {path}: {source}")]
    OpenKernel {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot read initrd {path}: {source}")]
    ReadInitrd {
        path: String,
        source: std::io::Error,
    },
    #[error("kernel {path} is neither an ELF vmlinux nor a bzImage ({detail})")]
    UnknownKernelFormat { path: String, detail: String },
    #[error("kernel {path} could not be loaded: {detail}")]
    LoadKernel { path: String, detail: String },
    #[error("the kernel needs {needed_mib} MiB of guest memory but the VM has {have_mib} MiB")]
    MemoryTooSmall { needed_mib: u64, have_mib: u64 },
    #[error("the initrd ({size} bytes) does not fit in guest memory between the kernel end {kernel_end:#x} and {limit:#x}")]
    InitrdTooLarge {
        size: u64,
        kernel_end: u64,
        limit: u64,
    },
    #[error("kernel command line is {len} bytes; the limit is {max} bytes")]
    CmdlineTooLong { len: usize, max: usize },
    #[error("invalid kernel command line: {0}")]
    Cmdline(String),
    #[error("writing boot information into guest memory: {0}")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
}

/// Host-side layout of guest RAM: below the 32-bit MMIO gap, then from 4 GiB.
pub fn memory_regions(mem_size: u64) -> Vec<(GuestAddress, usize)> {
    let low = mem_size.min(MMIO_GAP_START);
    let mut regions = vec![(GuestAddress(0), low as usize)];
    if mem_size > MMIO_GAP_START {
        regions.push((
            GuestAddress(RAM_ABOVE_GAP_START),
            (mem_size - MMIO_GAP_START) as usize,
        ));
    }
    regions
}

/// One entry of the guest's physical memory map.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemMapEntry {
    pub addr: u64,
    pub size: u64,
    pub kind: u32,
}

/// The e820 / PVH memory map for `mem_size` bytes of RAM. The ACPI table and generation ID area
/// (the legacy BIOS area 0xe0000..0x100000) is reserved whether or not the VM has ACPI tables:
/// a PC reserves it too, and the map stays the same for both.
pub fn memory_map(mem_size: u64) -> Vec<MemMapEntry> {
    let low_end = mem_size.min(MMIO_GAP_START);
    let mut map = vec![
        MemMapEntry {
            addr: 0,
            size: EBDA_START,
            kind: E820_RAM,
        },
        MemMapEntry {
            addr: EBDA_START,
            size: 0xa0000 - EBDA_START,
            kind: E820_RESERVED,
        },
        MemMapEntry {
            addr: ACPI_TABLES_START,
            size: BIOS_AREA_END - ACPI_TABLES_START,
            kind: E820_RESERVED,
        },
    ];
    if low_end > HIGH_MEMORY_START {
        map.push(MemMapEntry {
            addr: HIGH_MEMORY_START,
            size: low_end - HIGH_MEMORY_START,
            kind: E820_RAM,
        });
    }
    if mem_size > MMIO_GAP_START {
        map.push(MemMapEntry {
            addr: RAM_ABOVE_GAP_START,
            size: mem_size - MMIO_GAP_START,
            kind: E820_RAM,
        });
    }
    map
}

/// Where and how the kernel was loaded.
#[derive(Clone, Copy, Debug)]
pub struct LoadedKernel {
    pub protocol: BootProtocol,
    pub entry: u64,
    pub kernel_end: u64,
    pub setup_header: Option<linux_loader::loader::bootparam::setup_header>,
}

/// Highest guest physical address an ELF's loadable segments reach (p_paddr + p_memsz).
fn elf_highest_address(f: &mut File) -> Option<u64> {
    let mut eh = [0u8; 64];
    f.seek(SeekFrom::Start(0)).ok()?;
    f.read_exact(&mut eh).ok()?;
    let phoff = u64::from_le_bytes(eh[32..40].try_into().ok()?);
    let phentsize = u16::from_le_bytes([eh[54], eh[55]]) as u64;
    let phnum = u16::from_le_bytes([eh[56], eh[57]]) as u64;
    if phentsize < 56 || phnum > 256 {
        return None;
    }
    let mut highest = 0u64;
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        f.seek(SeekFrom::Start(phoff.checked_add(i * phentsize)?))
            .ok()?;
        f.read_exact(&mut ph).ok()?;
        let p_type = u32::from_le_bytes(ph[0..4].try_into().ok()?);
        if p_type != 1 {
            continue; // PT_LOAD only
        }
        let paddr = u64::from_le_bytes(ph[24..32].try_into().ok()?);
        let memsz = u64::from_le_bytes(ph[40..48].try_into().ok()?);
        highest = highest.max(paddr.checked_add(memsz)?);
    }
    Some(highest)
}

/// Loads an ELF vmlinux (PVH entry when it has the PVH note) or a bzImage at 1 MiB.
/// `mem_size` is the VM's RAM size in bytes.
pub fn load_kernel(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    path: &Path,
) -> Result<LoadedKernel, BootError> {
    let mut f = open_kernel(path)?;
    load_kernel_file(mem, mem_size, &mut f, &path.display().to_string())
}

/// Opens the kernel image (kept open for in-place reboots, which load it again).
pub fn open_kernel(path: &Path) -> Result<File, BootError> {
    File::open(path).map_err(|source| BootError::OpenKernel {
        path: path.display().to_string(),
        source,
    })
}

/// [`load_kernel`] from an open file (read from its start), named `shown` in errors.
pub fn load_kernel_file(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    f: &mut File,
    shown: &str,
) -> Result<LoadedKernel, BootError> {
    let shown = shown.to_string();
    f.seek(SeekFrom::Start(0))
        .map_err(|source| BootError::OpenKernel {
            path: shown.clone(),
            source,
        })?;
    let mut magic = [0u8; 4];
    let is_elf = f.read_exact(&mut magic).is_ok() && magic == ELF_MAGIC;
    let low_end = mem_size.min(MMIO_GAP_START);
    let too_small = |end: u64| BootError::MemoryTooSmall {
        needed_mib: end.div_ceil(MIB),
        have_mib: mem_size / MIB,
    };

    if is_elf {
        if let Some(end) = elf_highest_address(f) {
            if end > low_end {
                return Err(too_small(end));
            }
        }
        let r = Elf::load(mem, None, f, Some(GuestAddress(HIGH_MEMORY_START))).map_err(|e| {
            BootError::LoadKernel {
                path: shown.clone(),
                detail: e.to_string(),
            }
        })?;
        let (protocol, entry) = match r.pvh_boot_cap {
            PvhBootCapability::PvhEntryPresent(addr) => (BootProtocol::Pvh, addr.raw_value()),
            _ => (BootProtocol::Linux64, r.kernel_load.raw_value()),
        };
        return Ok(LoadedKernel {
            protocol,
            entry,
            kernel_end: r.kernel_end,
            setup_header: None,
        });
    }

    let file_len = f.seek(SeekFrom::End(0)).unwrap_or(0);
    if HIGH_MEMORY_START + file_len > low_end {
        return Err(too_small(HIGH_MEMORY_START + file_len));
    }
    match BzImage::load(mem, None, f, Some(GuestAddress(HIGH_MEMORY_START))) {
        Ok(r) => Ok(LoadedKernel {
            protocol: BootProtocol::Linux64,
            // The 64-bit entry point is 0x200 past the protected-mode code's start.
            entry: r.kernel_load.raw_value() + 0x200,
            kernel_end: r.kernel_end,
            setup_header: r.setup_header,
        }),
        Err(e) => Err(BootError::UnknownKernelFormat {
            path: shown,
            detail: e.to_string(),
        }),
    }
}

/// Loads the initrd as high as the kernel allows; returns (address, size).
pub fn load_initrd(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    path: &Path,
    kernel: &LoadedKernel,
) -> Result<(u64, u64), BootError> {
    let mut file = File::open(path).map_err(|source| BootError::ReadInitrd {
        path: path.display().to_string(),
        source,
    })?;
    load_initrd_file(
        mem,
        mem_size,
        &mut file,
        &path.display().to_string(),
        kernel,
    )
}

/// [`load_initrd`] from an open file (read from its start), named `shown` in errors.
pub fn load_initrd_file(
    mem: &GuestMemoryMmap,
    mem_size: u64,
    file: &mut File,
    shown: &str,
    kernel: &LoadedKernel,
) -> Result<(u64, u64), BootError> {
    let read_err = |source| BootError::ReadInitrd {
        path: shown.to_string(),
        source,
    };
    file.seek(SeekFrom::Start(0)).map_err(read_err)?;
    let size = file.metadata().map_err(read_err)?.len();
    let addr_max = kernel
        .setup_header
        .map(|h| u64::from(h.initrd_addr_max))
        .filter(|m| *m != 0)
        .unwrap_or(DEFAULT_INITRD_ADDR_MAX);
    let limit = mem_size.min(MMIO_GAP_START).min(addr_max.saturating_add(1));
    let kernel_end = kernel.kernel_end.max(HIGH_MEMORY_START);
    let too_large = BootError::InitrdTooLarge {
        size,
        kernel_end,
        limit,
    };
    let start = limit.checked_sub(size).ok_or(too_large)? & !0xfff;
    if start < kernel_end {
        return Err(BootError::InitrdTooLarge {
            size,
            kernel_end,
            limit,
        });
    }
    // Straight from the file into guest memory: no heap copy that would stay in the VMM's RSS.
    mem.read_exact_volatile_from(GuestAddress(start), file, size as usize)
        .map_err(|e| read_err(std::io::Error::other(e.to_string())))?;
    Ok((start, size))
}

/// Writes the NUL-terminated command line at CMDLINE_START.
pub fn write_cmdline(mem: &GuestMemoryMmap, cmdline: &str) -> Result<(), BootError> {
    if cmdline.len() + 1 > COMMAND_LINE_MAX {
        return Err(BootError::CmdlineTooLong {
            len: cmdline.len(),
            max: COMMAND_LINE_MAX - 1,
        });
    }
    if cmdline
        .bytes()
        .any(|b| b == 0 || !(0x20..0x7f).contains(&b))
    {
        return Err(BootError::Cmdline("only printable ASCII is allowed".into()));
    }
    let mut bytes = cmdline.as_bytes().to_vec();
    bytes.push(0);
    mem.write_slice(&bytes, GuestAddress(CMDLINE_START))?;
    Ok(())
}

/// Writes the boot information for `kernel.protocol`; `rsdp` is the ACPI RSDP's address when
/// the VM has ACPI tables.
pub fn write_boot_info(
    mem: &GuestMemoryMmap,
    kernel: &LoadedKernel,
    mem_size: u64,
    cmdline_len: usize,
    initrd: Option<(u64, u64)>,
    rsdp: Option<u64>,
) -> Result<(), BootError> {
    let map = memory_map(mem_size);
    match kernel.protocol {
        BootProtocol::Linux64 => {
            let mut params = boot_params::default();
            if let Some(hdr) = kernel.setup_header {
                params.hdr = hdr;
            }
            params.hdr.type_of_loader = KERNEL_LOADER_OTHER;
            params.hdr.boot_flag = KERNEL_BOOT_FLAG_MAGIC;
            params.hdr.header = KERNEL_HDR_MAGIC;
            if params.hdr.kernel_alignment == 0 {
                params.hdr.kernel_alignment = KERNEL_MIN_ALIGNMENT;
            }
            params.hdr.cmd_line_ptr = CMDLINE_START as u32;
            params.hdr.cmdline_size = cmdline_len as u32 + 1;
            if let Some((addr, size)) = initrd {
                params.hdr.ramdisk_image = addr as u32;
                params.hdr.ramdisk_size = size as u32;
                params.ext_ramdisk_image = (addr >> 32) as u32;
                params.ext_ramdisk_size = (size >> 32) as u32;
            }
            for (i, e) in map.iter().enumerate() {
                params.e820_table[i] = boot_e820_entry {
                    addr: e.addr,
                    size: e.size,
                    r#type: e.kind,
                };
            }
            params.e820_entries = map.len() as u8;
            params.acpi_rsdp_addr = rsdp.unwrap_or(0);
            mem.write_obj(params, GuestAddress(ZERO_PAGE_START))?;
        }
        BootProtocol::Pvh => {
            let mut info = hvm_start_info {
                magic: XEN_HVM_START_MAGIC_VALUE,
                version: 1,
                cmdline_paddr: CMDLINE_START,
                memmap_paddr: PVH_MEMMAP_START,
                memmap_entries: map.len() as u32,
                rsdp_paddr: rsdp.unwrap_or(0),
                ..Default::default()
            };
            if let Some((paddr, size)) = initrd {
                let module = hvm_modlist_entry {
                    paddr,
                    size,
                    ..Default::default()
                };
                mem.write_obj(module, GuestAddress(PVH_MODLIST_START))?;
                info.nr_modules = 1;
                info.modlist_paddr = PVH_MODLIST_START;
            }
            debug_assert!(map.len() <= PVH_MEMMAP_MAX_ENTRIES);
            for (i, e) in map.iter().enumerate() {
                let entry = hvm_memmap_table_entry {
                    addr: e.addr,
                    size: e.size,
                    type_: e.kind,
                    reserved: 0,
                };
                let at =
                    PVH_MEMMAP_START + (i * std::mem::size_of::<hvm_memmap_table_entry>()) as u64;
                mem.write_obj(entry, GuestAddress(at))?;
            }
            mem.write_obj(info, GuestAddress(PVH_INFO_START))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_map_leaves_the_mmio_gap() {
        let small = memory_map(128 * MIB);
        assert_eq!(small.len(), 4);
        assert_eq!(
            small[2],
            MemMapEntry {
                addr: 0xe_0000,
                size: 0x2_0000,
                kind: E820_RESERVED
            }
        );
        assert_eq!(
            small[3],
            MemMapEntry {
                addr: MIB,
                size: 127 * MIB,
                kind: E820_RAM
            }
        );
        let big = memory_map(4096 * MIB);
        assert_eq!(
            big.last().unwrap(),
            &MemMapEntry {
                addr: 1 << 32,
                size: 1024 * MIB,
                kind: E820_RAM
            }
        );
        let ram: u64 = big
            .iter()
            .filter(|e| e.kind == E820_RAM)
            .map(|e| e.size)
            .sum();
        assert_eq!(ram, 4096 * MIB - (MIB - EBDA_START));
        assert_eq!(memory_regions(4096 * MIB).len(), 2);
        assert_eq!(
            memory_regions(64 * MIB),
            vec![(GuestAddress(0), (64 * MIB) as usize)]
        );
    }

    #[test]
    fn rsdp_reaches_both_boot_protocols() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (4 * MIB) as usize)]).unwrap();
        for (protocol, at) in [
            (BootProtocol::Linux64, ZERO_PAGE_START + 0x70),
            (BootProtocol::Pvh, PVH_INFO_START + 32),
        ] {
            let k = LoadedKernel {
                protocol,
                entry: HIGH_MEMORY_START,
                kernel_end: 2 * MIB,
                setup_header: None,
            };
            for rsdp in [Some(ACPI_TABLES_START), None] {
                write_boot_info(&mem, &k, 4 * MIB, 10, None, rsdp).unwrap();
                let got: u64 = mem.read_obj(GuestAddress(at)).unwrap();
                assert_eq!(got, rsdp.unwrap_or(0), "{protocol:?}");
            }
        }
    }

    #[test]
    fn cmdline_limits() {
        let mem = GuestMemoryMmap::from_ranges(&[(GuestAddress(0), (4 * MIB) as usize)]).unwrap();
        write_cmdline(&mem, "console=ttyS0").unwrap();
        let long = "x".repeat(COMMAND_LINE_MAX);
        assert!(matches!(
            write_cmdline(&mem, &long),
            Err(BootError::CmdlineTooLong { .. })
        ));
        assert!(write_cmdline(&mem, &"y".repeat(COMMAND_LINE_MAX - 1)).is_ok());
        assert!(matches!(
            write_cmdline(&mem, "a\nb"),
            Err(BootError::Cmdline(_))
        ));
    }
}
