//! Legacy PC devices.
pub mod boot_timer;
pub mod debug_port;
pub mod i8042;
pub mod serial;
