#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_worker::fuzzing::agents_toml(data));
