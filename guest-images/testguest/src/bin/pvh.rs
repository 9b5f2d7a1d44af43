//! The test guest linked with the PVH ELF note (XEN_ELFNOTE_PHYS32_ENTRY -> `_start_pvh`).
#![no_std]
#![no_main]

extern crate testguest;
