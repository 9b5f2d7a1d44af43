#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| microvirt_fuzz::bootdisk::run(data));
