#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_core::fuzzing::big_integers_in(data));
