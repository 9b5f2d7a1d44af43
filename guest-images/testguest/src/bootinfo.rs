//! Boot information from the VMM (PVH `hvm_start_info` or Linux `boot_params`), copied out of low
//! memory into a [`BootInfo`] before anything else runs. Every length and pointer is bounded.

use crate::io::{phys_range_ok, phys_read, phys_u32, phys_u64, phys_u8};

/// Longest command line kept (Linux's COMMAND_LINE_SIZE, NUL included).
pub const CMDLINE_MAX: usize = 2048;
/// Most RAM ranges kept.
pub const MAX_RAM_RANGES: usize = 32;

const PVH_MAGIC: u32 = 0x336e_c578;
/// `boot_params` e820 table holds at most this many entries.
const E820_MAX: usize = 128;
const E820_RAM: u32 = 1;

/// Where the guest was entered.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    Pvh,
    Linux64,
}

impl Entry {
    pub fn name(self) -> &'static str {
        match self {
            Entry::Pvh => "pvh",
            Entry::Linux64 => "linux64",
        }
    }
}

/// A guest-physical range `[start, start + len)`.
#[derive(Clone, Copy, Default)]
pub struct Range {
    pub start: u64,
    pub len: u64,
}

/// What the guest needs from the boot protocol.
pub struct BootInfo {
    pub entry: Entry,
    /// Whether the protocol's magic/signature checked out.
    pub valid: bool,
    cmdline: [u8; CMDLINE_MAX],
    cmdline_len: usize,
    pub ram: [Range; MAX_RAM_RANGES],
    pub ram_count: usize,
    /// Sum of all RAM entries (also those beyond `MAX_RAM_RANGES`).
    pub ram_bytes: u64,
    pub initrd: Option<Range>,
    /// The ACPI RSDP's address the boot information gives (PVH `rsdp_paddr`, zero page
    /// `acpi_rsdp_addr`); 0 when it gives none.
    pub rsdp: u64,
}

impl BootInfo {
    /// Nothing known yet.
    pub const EMPTY: BootInfo = BootInfo {
        entry: Entry::Pvh,
        valid: false,
        cmdline: [0; CMDLINE_MAX],
        cmdline_len: 0,
        ram: [Range { start: 0, len: 0 }; MAX_RAM_RANGES],
        ram_count: 0,
        ram_bytes: 0,
        initrd: None,
        rsdp: 0,
    };

    /// The command line as received (without the NUL).
    pub fn cmdline(&self) -> &[u8] {
        &self.cmdline[..self.cmdline_len]
    }

    /// Value of the first `key=value` parameter named `key`.
    pub fn param<'a>(&'a self, key: &'a str) -> Option<&'a [u8]> {
        self.params(key).next()
    }

    /// Values of all `key=value` parameters named `key`, in order.
    pub fn params<'a>(&'a self, key: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        crate::parse::params(self.cmdline(), key)
    }

    /// Whether `[addr, addr + len)` lies inside one RAM range and inside the identity map.
    pub fn in_ram(&self, addr: u64, len: u64) -> bool {
        let Some(end) = addr.checked_add(len) else {
            return false;
        };
        phys_range_ok(addr, len)
            && self.ram[..self.ram_count]
                .iter()
                .any(|r| addr >= r.start && end <= r.start.saturating_add(r.len))
    }

    fn read_cmdline(&mut self, addr: u64) {
        if addr == 0 {
            return;
        }
        let mut n = 0;
        while n < CMDLINE_MAX - 1 {
            let Some(a) = addr.checked_add(n as u64) else {
                break;
            };
            if !phys_range_ok(a, 1) {
                break;
            }
            let b = phys_u8(a);
            if b == 0 {
                break;
            }
            self.cmdline[n] = b;
            n += 1;
        }
        self.cmdline_len = n;
    }

    fn add_ram(&mut self, start: u64, len: u64) {
        self.ram_bytes = self.ram_bytes.saturating_add(len);
        if self.ram_count < MAX_RAM_RANGES {
            self.ram[self.ram_count] = Range { start, len };
            self.ram_count += 1;
        }
    }

    /// Parses PVH `hvm_start_info` at `addr`.
    pub fn load_pvh(&mut self, addr: u64) {
        let bi = self;
        bi.entry = Entry::Pvh;
        if !phys_range_ok(addr, 56) || phys_u32(addr) != PVH_MAGIC {
            return;
        }
        bi.valid = true;
        let nr_modules = phys_u32(addr + 12);
        let modlist = phys_u64(addr + 16);
        let cmdline = phys_u64(addr + 24);
        let memmap = phys_u64(addr + 40);
        let memmap_entries = phys_u32(addr + 48) as usize;
        bi.rsdp = phys_u64(addr + 32);
        bi.read_cmdline(cmdline);
        // hvm_memmap_table_entry: u64 addr, u64 size, u32 type, u32 reserved.
        for i in 0..memmap_entries.min(E820_MAX) {
            let e = memmap.saturating_add(i as u64 * 24);
            if !phys_range_ok(e, 24) {
                break;
            }
            if phys_u32(e + 16) == E820_RAM {
                bi.add_ram(phys_u64(e), phys_u64(e + 8));
            }
        }
        // hvm_modlist_entry: u64 paddr, u64 size, u64 cmdline_paddr, u64 reserved.
        if nr_modules > 0 && phys_range_ok(modlist, 32) {
            let size = phys_u64(modlist + 8);
            if size > 0 {
                bi.initrd = Some(Range {
                    start: phys_u64(modlist),
                    len: size,
                });
            }
        }
    }

    /// Parses Linux `boot_params` (the zero page) at `addr`.
    pub fn load_boot_params(&mut self, addr: u64) {
        let bi = self;
        bi.entry = Entry::Linux64;
        if !phys_range_ok(addr, 4096) {
            return;
        }
        // hdr.header "HdrS" at 0x202; a VMM may leave it zero, so it only sets `valid`.
        bi.valid = phys_u32(addr + 0x202) == 0x5372_6448;
        let cmd_line_ptr =
            u64::from(phys_u32(addr + 0x228)) | (u64::from(phys_u32(addr + 0xc8)) << 32);
        bi.read_cmdline(cmd_line_ptr);
        bi.rsdp = phys_u64(addr + 0x70);
        let entries = usize::from(phys_u8(addr + 0x1e8)).min(E820_MAX);
        for i in 0..entries {
            let e = addr + 0x2d0 + i as u64 * 20;
            let mut raw = [0u8; 20];
            if !phys_read(e, &mut raw) {
                break;
            }
            let start = u64::from_le_bytes(raw[0..8].try_into().unwrap_or([0; 8]));
            let len = u64::from_le_bytes(raw[8..16].try_into().unwrap_or([0; 8]));
            let ty = u32::from_le_bytes(raw[16..20].try_into().unwrap_or([0; 4]));
            if ty == E820_RAM {
                bi.add_ram(start, len);
            }
        }
        let image = u64::from(phys_u32(addr + 0x218)) | (u64::from(phys_u32(addr + 0xc0)) << 32);
        let size = u64::from(phys_u32(addr + 0x21c)) | (u64::from(phys_u32(addr + 0xc4)) << 32);
        if size > 0 {
            bi.initrd = Some(Range {
                start: image,
                len: size,
            });
        }
    }
}
