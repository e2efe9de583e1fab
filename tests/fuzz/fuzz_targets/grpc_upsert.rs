//! Fuzz target: see `embedded_qdrant::fuzzing::grpc_upsert` for the input and the invariants.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| embedded_qdrant::fuzzing::grpc_upsert(data));
