//! Fuzz target: see `proxy::fuzzing::config_text` for the input's layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy::fuzzing::config_text(data));
