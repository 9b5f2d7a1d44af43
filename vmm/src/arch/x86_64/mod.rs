//! x86_64: memory layout, boot protocols, CPU state.
pub mod boot;
pub mod cpuid;
pub mod gdt;
pub mod layout;
pub mod mptable;
pub mod msr;
pub mod regs;
