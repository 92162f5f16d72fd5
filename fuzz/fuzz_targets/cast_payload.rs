//! `mdl_fuzzing::cast_payload` under libFuzzer (what it checks: that function's documentation).
#![no_main]

libfuzzer_sys::fuzz_target!(|input: &[u8]| mdl_fuzzing::cast_payload(input));
