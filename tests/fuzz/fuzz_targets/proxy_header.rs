//! Fuzz target: see `proxy::fuzzing::proxy_header` for the input's layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy::fuzzing::proxy_header(data));
