//! The test guest linked without the PVH note: the VMM uses the 64-bit Linux boot protocol and
//! enters `_start64` (the ELF entry point) with RSI = boot_params.
#![no_std]
#![no_main]

extern crate testguest;
