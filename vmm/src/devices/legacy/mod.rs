//! Legacy PC devices.
