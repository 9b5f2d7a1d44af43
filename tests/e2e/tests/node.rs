//! Whole-system tests: microvirt on a real node (placeholder; scenarios follow).

fn main() {}
