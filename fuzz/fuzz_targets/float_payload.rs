//! Untrusted bytes as a float-split, xor-delta or sub-delta payload of every float dtype: decoding must
//! never panic. Valid inputs built from the fuzz bytes must round-trip bit for bit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mdl_codec::float;
use mdl_format::Dtype;

const DTYPES: [Dtype; 4] = [Dtype::BF16, Dtype::F16, Dtype::F32, Dtype::F64];

fuzz_target!(|input: &[u8]| {
    let Some((&sel, rest)) = input.split_first() else {
        return;
    };
    let dtype = DTYPES[(sel & 3) as usize];
    let with_base = sel & 4 != 0;
    let w = dtype.size();
    // As a payload: any bytes, for a tensor of a size derived from the selector.
    let n = (sel as usize >> 3) * 97;
    let base = vec![0x5au8; n * w];
    let mut out = vec![0u8; n * w];
    let _ = float::decode(dtype, rest, with_base.then_some(&base[..]), &mut out);
    let _ = float::decode_sub(dtype, rest, &base, &mut out);
    // As data: encoding then decoding gives back every bit.
    let data = &rest[..rest.len() / w * w];
    let base: Vec<u8> = data.iter().rev().copied().collect();
    let b = with_base.then_some(&base[..]);
    let a = float::analyze(dtype, data, b).expect("valid lengths");
    let choice = match (&a.delta, with_base) {
        (Some(d), true) => d,
        _ => &a.plain,
    };
    let mut payload = Vec::new();
    let b = (choice.xor_mask != 0).then_some(&base[..]);
    float::encode(dtype, data, b, choice, &mut payload).expect("encodes");
    let mut back = vec![0u8; data.len()];
    float::decode(dtype, &payload, b, &mut back).expect("decodes what it encoded");
    assert_eq!(back, data);
    // And as a sub-delta against the reversed bytes.
    let sub = float::analyze_sub(dtype, data, &base).expect("valid lengths");
    let mut payload = Vec::new();
    float::encode(dtype, data, Some(&base), &sub, &mut payload).expect("encodes");
    float::decode_sub(dtype, &payload, &base, &mut back).expect("decodes what it encoded");
    assert_eq!(back, data);
});
