//! Scalar conversions between the lossy codecs' float dtypes and `f64`, and the 16-bit keys the
//! quantizer's histograms are built on.

use mdl_format::Dtype;

/// Number of distinct 16-bit keys.
pub const KEYS: usize = 1 << 16;

/// Whether the lossy codecs take tensors of `dtype`: bf16, f16 and f32 (f64's top 16 bits keep
/// only 4 mantissa bits, too coarse a key; f64 tensors stay lossless).
pub fn lossy_supported(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::BF16 | Dtype::F16 | Dtype::F32)
}

/// `f16` bits to `f32`, exactly.
#[inline]
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match exp {
        0 if man == 0 => sign,
        0 => {
            // Subnormal: value = man · 2^-24.
            let v = man as f32 * f32::from_bits(0x3380_0000);
            return if sign != 0 { -v } else { v };
        }
        0x1f => sign | 0x7f80_0000 | (man << 13),
        _ => sign | ((exp + 112) << 23) | (man << 13),
    };
    f32::from_bits(bits)
}

/// `f32` to `f16` bits, rounding to nearest even (overflow gives ±Inf; NaN stays NaN).
#[inline]
pub fn f32_to_f16(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = ((bits >> 16) & 0x8000) as u16;
    let exp = ((bits >> 23) & 0xff) as i32;
    let man = bits & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal result: shift the full significand and round.
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut r = m >> shift;
        if rest > half || (rest == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && r & 1 == 1) {
        r += 1; // a carry into the exponent is the correct rounding (up to Inf)
    }
    sign | r as u16
}

/// `f32` to `bf16` bits, rounding to nearest even (NaN stays NaN).
#[inline]
pub fn f32_to_bf16(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// Evaluates `$body` once for each lossy dtype with `$d` bound to `$dtype` as a constant (any
/// other dtype: as the value itself), so the per-element conversions it calls ([`value`],
/// [`put_rounded`], [`rounded`], [`key`]) are specialized: their `match` on the dtype folds away
/// and the loop around them is compiled for that dtype. Dispatch once per chunk, not per
/// element.
macro_rules! for_dtype {
    ($dtype:expr, $d:ident => $body:expr) => {
        match $dtype {
            mdl_format::Dtype::F32 => {
                const $d: mdl_format::Dtype = mdl_format::Dtype::F32;
                $body
            }
            mdl_format::Dtype::BF16 => {
                const $d: mdl_format::Dtype = mdl_format::Dtype::BF16;
                $body
            }
            mdl_format::Dtype::F16 => {
                const $d: mdl_format::Dtype = mdl_format::Dtype::F16;
                $body
            }
            #[allow(non_snake_case)]
            $d => $body,
        }
    };
}
pub(crate) use for_dtype;

/// The value of element `i` of a little-endian tensor of `dtype` (bf16, f16 or f32).
#[inline(always)]
pub fn value(dtype: Dtype, bytes: &[u8], i: usize) -> f64 {
    match dtype {
        Dtype::F32 => f32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().unwrap()) as f64,
        Dtype::BF16 => {
            f32::from_bits((u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]) as u32) << 16)
                as f64
        }
        Dtype::F16 => f16_to_f32(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])) as f64,
        _ => f64::NAN,
    }
}

/// Element `i`'s 16-bit key: the bit pattern of a 16-bit float, the top 16 bits of an f32.
#[inline(always)]
pub fn key(dtype: Dtype, bytes: &[u8], i: usize) -> u16 {
    match dtype {
        Dtype::F32 => u16::from_le_bytes([bytes[4 * i + 2], bytes[4 * i + 3]]),
        _ => u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]]),
    }
}

/// The value a key stands for: exact for 16-bit floats; for f32, the value with the low 16 bits
/// cleared (what the key's elements are assigned by).
pub fn key_value(dtype: Dtype, key: u16) -> f64 {
    match dtype {
        Dtype::F16 => f16_to_f32(key) as f64,
        _ => f32::from_bits((key as u32) << 16) as f64,
    }
}

/// `x` rounded to `dtype` (nearest even), as little-endian bytes appended to `out`.
pub fn push_rounded(dtype: Dtype, x: f64, out: &mut Vec<u8>) {
    match dtype {
        Dtype::F32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
        Dtype::BF16 => out.extend_from_slice(&f32_to_bf16(x as f32).to_le_bytes()),
        Dtype::F16 => out.extend_from_slice(&f32_to_f16(x as f32).to_le_bytes()),
        _ => unreachable!("lossy dtypes only"),
    }
}

/// `x` rounded to `dtype`, written into `out` (exactly one element's bytes).
#[inline(always)]
pub fn put_rounded(dtype: Dtype, x: f64, out: &mut [u8]) {
    match dtype {
        Dtype::F32 => out.copy_from_slice(&(x as f32).to_le_bytes()),
        Dtype::BF16 => out.copy_from_slice(&f32_to_bf16(x as f32).to_le_bytes()),
        Dtype::F16 => out.copy_from_slice(&f32_to_f16(x as f32).to_le_bytes()),
        _ => unreachable!("lossy dtypes only"),
    }
}

/// `x` rounded to `dtype`, as a value.
#[inline(always)]
pub fn rounded(dtype: Dtype, x: f64) -> f64 {
    match dtype {
        Dtype::F32 => x as f32 as f64,
        Dtype::BF16 => f32::from_bits((f32_to_bf16(x as f32) as u32) << 16) as f64,
        Dtype::F16 => f16_to_f32(f32_to_f16(x as f32)) as f64,
        _ => unreachable!("lossy dtypes only"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f16_round_trips_every_pattern() {
        for h in 0..=u16::MAX {
            let x = f16_to_f32(h);
            let back = f32_to_f16(x);
            if x.is_nan() {
                assert!(f16_to_f32(back).is_nan());
            } else {
                assert_eq!(back, h, "{h:#x}");
            }
        }
    }

    #[test]
    fn f16_rounding_is_nearest_even() {
        // 1 + 2^-11 lies halfway between 1 and the next f16; it rounds to the even one (1).
        assert_eq!(f32_to_f16(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f32_to_f16(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f32_to_f16(70000.0), 0x7c00);
        assert_eq!(f32_to_f16(2f32.powi(-25)), 0); // halfway to the smallest subnormal: even
        assert_eq!(f32_to_f16(3.0 * 2f32.powi(-26)), 1);
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert_eq!(f32_to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        assert!(f32::from_bits((f32_to_bf16(f32::NAN) as u32) << 16).is_nan());
    }
}
