#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| baton_coordinator::fuzzing::worker_request(data));
