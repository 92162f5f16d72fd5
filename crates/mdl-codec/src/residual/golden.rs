//! Known-answer vectors of the `quant-residual` payload layout.

use super::{decode, encode, Mode};
use mdl_format::Dtype;

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Known-answer vectors of the payload layout (`docs/FORMAT.md`): a change here is a format
/// change.
#[test]
fn payload_bytes() {
    let reference = f32s(&[1.0, 2.0, 0.5, 4.0]);
    let values = f32s(&[1.25, 1.5, f32::NAN, 0.0]);
    let (payload, render) = encode(Dtype::F32, &values, Some(&reference), Mode::Linear, 0.25);
    // mode 0 | step 0.25 | one exact value (the NaN) | one-byte codes | a stored entropy
    // stream of them: +1 step, −2 steps, exact, −16 steps.
    let expected = [
        0, 0, 0, 0, 0, 0, 0, 208, 63, 1, 0, 0, 192, 127, 1, 0, 2, 3, 255, 31,
    ];
    assert_eq!(payload, expected);
    assert_eq!(render[..8], f32s(&[1.25, 1.5])[..]);
    let mut out = vec![0u8; 16];
    decode(Dtype::F32, &payload, Some(&reference), &mut out).unwrap();
    assert_eq!(out, render);
}
