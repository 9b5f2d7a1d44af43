#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| microvirt_fuzz::blk::run(
    data,
    microvirt_fuzz::blk::Backend::Raw
));
