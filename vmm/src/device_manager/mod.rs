//! Device managers: they assign bus addresses and IRQs; devices never choose their own.
pub mod mmio;
