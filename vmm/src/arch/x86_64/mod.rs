//! x86_64: memory layout, boot protocols, CPU state.
pub mod layout;
