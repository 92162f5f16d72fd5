//! Untrusted bytes as a quant-base or quant-delta payload (and as the run-length stream inside a
//! delta): decoding must never panic. Quantized tensors built from the fuzz bytes must
//! round-trip through both record kinds.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mdl_codec::engine::CpuEngine;
use mdl_codec::qrecord::{rle_decode, rle_encode, QuantTensor};
use mdl_format::Dtype;

const DTYPES: [Dtype; 3] = [Dtype::BF16, Dtype::F16, Dtype::F32];

fuzz_target!(|input: &[u8]| {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let dtype = DTYPES[(sel % 3) as usize];
    let n = (sel as usize >> 2) * 61;
    // As payloads: any bytes.
    let base_codes: Vec<u8> = (0..n).map(|i| (i % 7) as u8).collect();
    let _ = QuantTensor::decode(&CpuEngine, dtype, n, rest, None);
    let _ = QuantTensor::decode(&CpuEngine, dtype, n, rest, Some(&base_codes));
    let _ = rle_decode(rest, n, 9);
    // As codes: a tensor whose codes are the fuzz bytes folded into a small table.
    let bins = 1 + (sel as usize % 33);
    let size = dtype.size();
    let codes: Vec<u8> = rest.iter().map(|&b| b % bins as u8).collect();
    let protected: Vec<u64> = (0..codes.len() as u64).filter(|i| i % 13 == 5).collect();
    let q = QuantTensor {
        dtype,
        table: (0..bins * size).map(|i| i as u8).collect(),
        protected_values: vec![0xab; protected.len() * size],
        protected,
        codes,
    };
    let len = q.codes.len();
    let back = QuantTensor::decode(&CpuEngine, dtype, len, &q.encode_base(), None).expect("base");
    assert_eq!(back, q);
    let base: Vec<u8> = q.codes.iter().rev().map(|&c| c % 5).collect();
    let delta = q.encode_delta(&CpuEngine, &base, 5);
    let back = QuantTensor::decode(&CpuEngine, dtype, len, &delta, Some(&base)).expect("delta");
    assert_eq!(back, q);
    let small: Vec<u8> = rest.iter().map(|&b| b % 9).collect();
    assert_eq!(rle_decode(&rle_encode(&small), small.len(), 9).expect("runs"), small);
});
