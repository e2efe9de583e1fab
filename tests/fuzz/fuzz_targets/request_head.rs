//! Fuzz target: see `proxy::fuzzing::request_head` for the input's layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy::fuzzing::request_head(data));
