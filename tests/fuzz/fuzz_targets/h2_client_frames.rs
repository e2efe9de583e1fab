//! Fuzz target: see `proxy::fuzzing::h2_client_frames` for the input's layout and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| proxy::fuzzing::h2_client_frames(data));
