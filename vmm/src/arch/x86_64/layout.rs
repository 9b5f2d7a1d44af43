//! Guest physical memory layout (x86_64). Every fixed address the VMM uses is here.
//!
//! ```text
//! 0x0000_0500  GDT (4 entries)            0x0000_0520  IDT (empty)
//! 0x0000_6000  PVH hvm_start_info         0x0000_6040  PVH module list (initrd)
//! 0x0000_6100  PVH memory map             0x0000_7000  Linux zero page (boot_params)
//! 0x0000_8ff0  boot stack top             0x0000_9000  PML4, 0xa000 PDPT, 0xb000.. 4 PDs
//! 0x0002_0000  kernel command line (COMMAND_LINE_MAX bytes incl. NUL)
//! 0x0009_fc00  MP table (EBDA, reserved in e820) up to 0xa0000
//! 0x000e_0000  ACPI tables, RSDP first (reserved in e820) up to 0xff000
//! 0x000f_f000  VM generation ID, 16 bytes (reserved in e820, rest of the page unused)
//! 0x0010_0000  kernel load address (1 MiB)
//! 0xc000_0000  start of the 32-bit MMIO gap (RAM above it is moved to 4 GiB)
//! 0xc000_0000  boot-timer device (4 KiB): guest writes byte 123 -> boot-time log line
//! 0xc000_1000  virtio-mmio slots, 4 KiB each, assigned by the device manager
//! 0xfec0_0000  IOAPIC                     0xfee0_0000  local APIC
//! 0xfffb_d000  KVM TSS (3 pages)          0x1_0000_0000 RAM above the gap
//! ```

pub const GDT_START: u64 = 0x500;
pub const IDT_START: u64 = 0x520;
pub const PVH_INFO_START: u64 = 0x6000;
pub const PVH_MODLIST_START: u64 = 0x6040;
pub const PVH_MEMMAP_START: u64 = 0x6100;
pub const PVH_MEMMAP_MAX_ENTRIES: usize = 8;
pub const ZERO_PAGE_START: u64 = 0x7000;
pub const BOOT_STACK_POINTER: u64 = 0x8ff0;
pub const PML4_START: u64 = 0x9000;
pub const PDPTE_START: u64 = 0xa000;
/// Four page directories (0xb000..0xf000) identity-map the low 4 GiB with 2 MiB pages.
pub const PDE_START: u64 = 0xb000;
pub const CMDLINE_START: u64 = 0x20000;
/// Linux's x86 COMMAND_LINE_SIZE, including the terminating NUL.
pub const COMMAND_LINE_MAX: usize = 2048;
pub const EBDA_START: u64 = 0x9fc00;
pub const MPTABLE_START: u64 = EBDA_START;
pub const MPTABLE_MAX_SIZE: u64 = 0xa0000 - EBDA_START;
/// The ACPI tables: the RSDP at the start (where a guest without boot information scans for
/// it), the others after it; reserved in the memory map (the legacy BIOS area).
pub const ACPI_TABLES_START: u64 = 0xe_0000;
pub const ACPI_TABLES_END: u64 = VMGENID_ADDR;
/// The VM generation ID (acpi/vmgenid.rs): 16 bytes at the start of the legacy BIOS area's
/// last page, which only it uses; the DSDT's `\_SB.VGEN.ADDR` returns this address.
pub const VMGENID_ADDR: u64 = 0xf_f000;
pub const VMGENID_LEN: u64 = 16;
/// The end of the legacy BIOS area (ACPI tables and generation ID), reserved in the memory map.
pub const BIOS_AREA_END: u64 = 0x10_0000;
const _: () = assert!(
    VMGENID_ADDR.is_multiple_of(16)
        && VMGENID_ADDR >= ACPI_TABLES_END
        && VMGENID_ADDR + VMGENID_LEN <= BIOS_AREA_END
);
pub const HIGH_MEMORY_START: u64 = 0x10_0000;
pub const KERNEL_START: u64 = HIGH_MEMORY_START;
pub const MMIO_GAP_START: u64 = 0xc000_0000;
pub const MMIO_GAP_END: u64 = 0x1_0000_0000;
pub const BOOT_TIMER_ADDR: u64 = MMIO_GAP_START;
pub const BOOT_TIMER_SIZE: u64 = 0x1000;
pub const VIRTIO_MMIO_START: u64 = MMIO_GAP_START + 0x1000;
pub const VIRTIO_MMIO_SLOT_SIZE: u64 = 0x1000;
/// Slots stop well below the IOAPIC.
pub const VIRTIO_MMIO_END: u64 = 0xd000_0000;
pub const IOAPIC_ADDR: u64 = 0xfec0_0000;
pub const APIC_ADDR: u64 = 0xfee0_0000;
pub const KVM_TSS_ADDR: u64 = 0xfffb_d000;
pub const RAM_ABOVE_GAP_START: u64 = MMIO_GAP_END;

/// Legacy IRQs.
pub const SERIAL_IRQ: u32 = 4;
pub const I8042_IRQ: u32 = 1;
/// The ACPI Generic Event Device's interrupt (ISA IRQ 3: COM2's, which this VM does not have;
/// outside the virtio range).
pub const ACPI_GED_IRQ: u32 = 3;
/// GSIs handed to virtio-mmio devices, in order.
pub const VIRTIO_IRQ_FIRST: u32 = 5;
pub const VIRTIO_IRQ_LAST: u32 = 23;

/// Legacy ports.
pub const SERIAL_PORT: u16 = 0x3f8;
pub const I8042_PORT: u16 = 0x60;
pub const I8042_CMD_PORT: u16 = 0x64;
/// The ACPI platform registers (GED event, sleep control, sleep status, reset): 4 ports.
pub const ACPI_PM_PORT: u16 = 0x600;
pub const ACPI_PM_PORT_LEN: u16 = 4;

/// Most vCPUs the MP table area and the IOAPIC routing support.
pub const MAX_VCPUS: u8 = 32;
/// The byte a guest writes to the boot timer to mark "booted".
pub const BOOT_TIMER_MAGIC: u8 = microvirt_crds::workload::BOOT_TIMER_MAGIC;
// The guest's init finds the page at the address the wire type names.
const _: () = assert!(BOOT_TIMER_ADDR == microvirt_crds::workload::BOOT_TIMER_ADDR);
