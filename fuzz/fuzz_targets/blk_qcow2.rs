#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| microvirt_fuzz::qcow2::run(data));
