//! Entry points, mode switches, page tables, GDT and the AP trampoline (assembly).
//!
//! * `_start_pvh`: PVH entry (32-bit protected mode, paging off, EBX = `hvm_start_info`).
//! * `_start64`: 64-bit Linux boot protocol entry (long mode on the VMM's page tables,
//!   RSI = `boot_params`). `_start64_bzimage`, at image start + 0x200 as the bzImage protocol
//!   wants, jumps there.
//!
//! Both zero `.bss`, switch to the guest's own identity map of the low 4 GiB with 2 MiB pages
//! (uncached from 3 GiB up: the MMIO gap, IOAPIC and LAPIC; prebuilt in `.data`), load the
//! guest's GDT, switch to the guest stack and call [`crate::rust_entry`] with the boot kind and
//! the boot-info pointer. The Rust code is compiled without SSE (see `.cargo/config.toml`): under
//! PVM, SSE instructions end in KVM emulation failures.
//!
//! `ap_tramp_start..ap_tramp_end` is real-mode code that the BSP copies to a page below 1 MiB and
//! points the SIPI vector at. Each AP switches to long mode on the same page tables, increments
//! [`AP_COUNT`] and halts forever (or, with [`AP_SPIN`] set, counts in [`CPU_COUNTERS`]).

use core::arch::global_asm;
use core::sync::atomic::{AtomicU32, AtomicU64};

/// Boot kind passed to `rust_entry` by `_start_pvh`.
pub const BOOT_PVH: u64 = 1;
/// Boot kind passed to `rust_entry` by `_start64`.
pub const BOOT_LINUX64: u64 = 2;

/// Number of APs that reached long mode.
#[no_mangle]
pub static AP_COUNT: AtomicU32 = AtomicU32::new(0);

/// Set (before the APs start) to make every AP count in [`CPU_COUNTERS`] instead of halting.
#[no_mangle]
pub static AP_SPIN: AtomicU32 = AtomicU32::new(0);

/// One counter per CPU (index = check-in order, the BSP is 0), for the `counter` scenario.
#[no_mangle]
pub static CPU_COUNTERS: [AtomicU64; MAX_CPUS] = [const { AtomicU64::new(0) }; MAX_CPUS];

/// Most CPUs the counters cover.
pub const MAX_CPUS: usize = 32;

const STACK_SIZE: usize = 32 * 1024;

#[repr(C, align(16))]
struct Stack([u8; STACK_SIZE]);

/// The guest stack; in its own NOLOAD section that the entry code does not zero.
#[no_mangle]
#[link_section = ".bss.stack"]
static mut GUEST_STACK: Stack = Stack([0; STACK_SIZE]);

extern "C" {
    static ap_tramp_start: u8;
    static ap_tramp_end: u8;
}

/// The AP trampoline's code, to be copied to a 4 KiB-aligned page below 1 MiB.
pub fn ap_trampoline() -> &'static [u8] {
    // SAFETY: both symbols are labels in the same assembled section (see the global_asm below),
    // `ap_tramp_end` follows `ap_tramp_start`, and the bytes between them are immutable code.
    unsafe {
        let start = core::ptr::addr_of!(ap_tramp_start);
        let end = core::ptr::addr_of!(ap_tramp_end);
        let len = (end as usize).saturating_sub(start as usize);
        core::slice::from_raw_parts(start, len)
    }
}

// Selectors in the guest GDT.
//   0x08: 64-bit code, 0x10: flat data, 0x18: flat 32-bit code.
global_asm!(
    r#"
    .set CR0_PE, 1 << 0
    .set CR0_MP, 1 << 1
    .set CR0_EM, 1 << 2
    .set CR0_NW, 1 << 29
    .set CR0_CD, 1 << 30
    .set CR0_PG, 1 << 31
    .set CR4_PAE, 1 << 5
    .set CR4_OSFXSR, 1 << 9
    .set CR4_OSXMMEXCPT, 1 << 10
    .set MSR_EFER, 0xc0000080
    .set EFER_LME, 1 << 8
    .set PT_PML4, guest_pml4
    .set STACK_TOP, GUEST_STACK + {stack_size}

    /* bzImage convention: the 64-bit entry is 0x200 past the start of the loaded image. */
    .section .text.head, "ax"
    .code64
    .skip 0x200, 0xcc
    .global _start64_bzimage
_start64_bzimage:
    jmp _start64

    .section .text.boot, "ax"

    /* ---------------- PVH entry: 32-bit protected mode, paging off ---------------- */
    .code32
    .global _start_pvh
_start_pvh:
    cli
    cld
    mov $0x80, %dx                      /* POST code 0x80: "first guest instruction" marker */
    out %al, %dx                        /* (the VMM times it for its start-to-guest benchmark) */
    mov %ebx, %esi                      /* hvm_start_info, survives until rust_entry */
    /* zero .bss (the page tables are initialised data, the stack is not in .bss) */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    shr $2, %ecx
    xor %eax, %eax
    rep stosl
    /* long mode */
    mov $PT_PML4, %eax
    mov %eax, %cr3
    mov %cr4, %eax
    or $CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT, %eax
    mov %eax, %cr4
    mov $MSR_EFER, %ecx
    rdmsr
    or $EFER_LME, %eax
    wrmsr
    mov %cr0, %eax
    and $~(CR0_EM | CR0_NW | CR0_CD), %eax
    or $CR0_PE | CR0_MP | CR0_PG, %eax
    mov %eax, %cr0
    lgdt guest_gdt_desc
    ljmp $0x08, $pvh_long

    .code64
pvh_long:
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    mov $STACK_TOP, %esp
    mov %esi, %esi                      /* zero-extend the start_info pointer */
    mov ${boot_pvh}, %edi
    call rust_entry
4:  cli
    hlt
    jmp 4b

    /* ---------------- 64-bit Linux boot protocol entry ---------------- */
    .global _start64
_start64:
    cli
    cld
    mov $0x80, %dx                      /* POST code 0x80: "first guest instruction" marker */
    out %al, %dx                        /* (the VMM times it for its start-to-guest benchmark) */
    mov %rsi, %r12                      /* boot_params */
    mov $__bss_start, %edi
    mov $__bss_end, %ecx
    sub %edi, %ecx
    shr $3, %ecx
    xor %eax, %eax
    rep stosq
    mov $PT_PML4, %eax
    mov %rax, %cr3
    mov %cr4, %rax
    or $CR4_PAE | CR4_OSFXSR | CR4_OSXMMEXCPT, %eax
    mov %rax, %cr4
    mov %cr0, %rax
    and $~(CR0_EM | CR0_NW | CR0_CD), %eax
    or $CR0_MP, %eax
    mov %rax, %cr0
    lgdt guest_gdt_desc
    mov $STACK_TOP, %esp
    push $0x08
    push $5f
    lretq
5:  mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %eax, %fs
    mov %eax, %gs
    mov %r12, %rsi
    mov ${boot_linux64}, %edi
    call rust_entry
6:  cli
    hlt
    jmp 6b

    /* ---------------- AP: 32-bit part (entered from the trampoline) ---------------- */
    .code32
ap_pm32:
    mov $0x10, %eax
    mov %eax, %ds
    mov %eax, %es
    mov %eax, %ss
    mov %cr4, %eax
    or $CR4_PAE, %eax
    mov %eax, %cr4
    mov $PT_PML4, %eax
    mov %eax, %cr3
    mov $MSR_EFER, %ecx
    rdmsr
    or $EFER_LME, %eax
    wrmsr
    mov %cr0, %eax
    and $~(CR0_NW | CR0_CD), %eax
    or $CR0_PE | CR0_PG, %eax
    mov %eax, %cr0
    ljmp $0x08, $ap_long

    .code64
ap_long:
    mov $1, %eax
    lock xaddl %eax, AP_COUNT(%rip)     /* eax = this AP's index - 1 */
    cmpl $0, AP_SPIN(%rip)
    je 7f
    cmp ${max_ap_index}, %eax           /* no counter past the table: halt */
    ja 7f
    lea CPU_COUNTERS(%rip), %rdx
8:  incq 8(%rdx,%rax,8)                 /* counter: CPU_COUNTERS[index], index 1.. */
    pause
    jmp 8b
7:  cli
    hlt
    jmp 7b

    /* ---------------- AP trampoline (real mode, copied below 1 MiB) ---------------- */
    .code16
    .balign 16
    .global ap_tramp_start
ap_tramp_start:
    cli
    cld
    mov %cs, %ax
    mov %ax, %ds
    lgdtl (ap_gdt_desc - ap_tramp_start)
    mov %cr0, %eax
    or $CR0_PE, %eax
    mov %eax, %cr0
    ljmpl $0x18, $ap_pm32
    .balign 8
ap_gdt_desc:
    .word guest_gdt_end - guest_gdt - 1
    .long guest_gdt
    .global ap_tramp_end
ap_tramp_end:

    .code64
    .section .rodata.guest_gdt, "a"
    .balign 16
guest_gdt:
    .quad 0
    .quad 0x00af9a000000ffff            /* 0x08: 64-bit code */
    .quad 0x00cf92000000ffff            /* 0x10: flat data */
    .quad 0x00cf9a000000ffff            /* 0x18: flat 32-bit code */
guest_gdt_end:
    .balign 8
guest_gdt_desc:
    .word guest_gdt_end - guest_gdt - 1
    .quad guest_gdt

    /* Page tables: the identity map of the low 4 GiB with 2 MiB pages (accessed and dirty
       preset), cache-disabled from 3 GiB up (MMIO gap, IOAPIC, LAPIC). Built at assembly time
       so that boot does no per-entry work: this guest may run under an instruction emulator. */
    .section .data.pagetables, "aw"
    .balign 4096
guest_pml4:
    .quad guest_pdpt + 0x3
    .fill 511, 8, 0
guest_pdpt:
    .quad guest_pd + 0x0003
    .quad guest_pd + 0x1003
    .quad guest_pd + 0x2003
    .quad guest_pd + 0x3003
    .fill 508, 8, 0
guest_pd:
    .set pde, 0
    .rept 1536
    .quad (pde << 21) | 0xe3
    .set pde, pde + 1
    .endr
    .rept 512
    .quad (pde << 21) | 0xe3 | 0x18
    .set pde, pde + 1
    .endr

    /* PVH ELF note (kept only by the PVH binary's linker script) */
    .section .note.pvh, "a", @note
    .balign 4
    .long 4                             /* namesz: "Xen\0" */
    .long 4                             /* descsz */
    .long 18                            /* XEN_ELFNOTE_PHYS32_ENTRY */
    .asciz "Xen"
    .long _start_pvh
    .balign 4

    .text
"#,
    stack_size = const STACK_SIZE,
    boot_pvh = const BOOT_PVH,
    boot_linux64 = const BOOT_LINUX64,
    max_ap_index = const MAX_CPUS - 2,
    options(att_syntax)
);
