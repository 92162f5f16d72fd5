//! `mantissa-trim` (NeuZip's lossy mode): each float keeps its sign, its exponent and the top `k`
//! bits of its mantissa, rounded to nearest even; the trimmed tensor is then stored with the
//! float-split planes, where the cleared low bits cost next to nothing. For normal numbers the
//! relative error is at most 2^-(k+1) (half a unit in the last kept place), so below the stated
//! bound of 2^-k; subnormals keep an absolute error of half their unit. ±0, ±Inf and NaN pass
//! through unchanged, and a value that would round up past the largest finite number is
//! truncated instead.

use mdl_format::Dtype;
use rayon::prelude::*;

/// Mantissa bits of a trimmable dtype.
pub fn mantissa_bits(dtype: Dtype) -> Option<u32> {
    match dtype {
        Dtype::BF16 => Some(7),
        Dtype::F16 => Some(10),
        Dtype::F32 => Some(23),
        Dtype::F64 => Some(52),
        _ => None,
    }
}

/// Rounds the mantissa of each element of `data` to `keep` bits (nearest even), writing `out`.
/// `keep` at or above the dtype's mantissa width copies the data.
pub fn trim(dtype: Dtype, data: &[u8], keep: u32, out: &mut [u8]) {
    let Some(mbits) = mantissa_bits(dtype) else {
        out.copy_from_slice(data);
        return;
    };
    if keep >= mbits {
        out.copy_from_slice(data);
        return;
    }
    let drop = mbits - keep;
    let width = dtype.size();
    let ebits = (width as u32 * 8) - 1 - mbits;
    let exp_mask = ((1u64 << ebits) - 1) << mbits;
    let round = |bits: u64| -> u64 {
        if bits & exp_mask == exp_mask {
            return bits; // Inf or NaN
        }
        let half = 1u64 << (drop - 1);
        let lsb = (bits >> drop) & 1;
        let up = (bits + half - 1 + lsb) & !((1u64 << drop) - 1);
        if up & exp_mask == exp_mask {
            bits & !((1u64 << drop) - 1) // would overflow to Inf: truncate
        } else {
            up
        }
    };
    out.par_chunks_mut(1 << 16)
        .zip(data.par_chunks(1 << 16))
        .for_each(|(o, d)| {
            for (oc, dc) in o.chunks_exact_mut(width).zip(d.chunks_exact(width)) {
                let mut b = [0u8; 8];
                b[..width].copy_from_slice(dc);
                let r = round(u64::from_le_bytes(b)).to_le_bytes();
                oc.copy_from_slice(&r[..width]);
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_error_is_within_the_bound() {
        let xs: Vec<f32> = (1..100_000)
            .map(|i| (i as f32 * 0.731).sin() * 10f32.powi(i % 20 - 10))
            .collect();
        let data: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        for keep in [0, 1, 3, 7, 10, 22] {
            let mut out = vec![0u8; data.len()];
            trim(Dtype::F32, &data, keep, &mut out);
            for (x, o) in xs.iter().zip(out.chunks_exact(4)) {
                let y = f32::from_le_bytes(o.try_into().unwrap());
                let rel = ((y as f64 - *x as f64) / *x as f64).abs();
                assert!(rel <= 2f64.powi(-(keep as i32 + 1)), "{x} → {y} ({keep})");
                assert_eq!(y.to_bits() & ((1 << (23 - keep)) - 1), 0);
            }
        }
    }

    #[test]
    fn specials_pass_and_rounding_is_even() {
        let xs = [
            0.0f32,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            1.5,
            1.25,
            1.75,
        ];
        let data: Vec<u8> = xs.iter().flat_map(|x| x.to_le_bytes()).collect();
        let mut out = vec![0u8; data.len()];
        trim(Dtype::F32, &data, 1, &mut out);
        let ys: Vec<f32> = out
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(ys[..4], xs[..4]);
        assert!(ys[4].is_finite());
        assert_eq!(&ys[5..], &[1.5, 1.0, 2.0]); // 1.25 ties to even 1.0; 1.75 to 2.0
        let nan = [0x7fc0_0001u32.to_le_bytes()].concat();
        let mut o = vec![0u8; 4];
        trim(Dtype::F32, &nan, 2, &mut o);
        assert_eq!(o, nan);
    }

    #[test]
    fn bf16_keeps_the_requested_bits() {
        let data: Vec<u8> = (0..=u16::MAX).flat_map(|h| h.to_le_bytes()).collect();
        let mut out = vec![0u8; data.len()];
        trim(Dtype::BF16, &data, 3, &mut out);
        for (i, o) in out.chunks_exact(2).enumerate() {
            let (a, b) = (i as u16, u16::from_le_bytes([o[0], o[1]]));
            let (x, y) = (
                f32::from_bits((a as u32) << 16),
                f32::from_bits((b as u32) << 16),
            );
            if x.is_nan() {
                assert_eq!(a, b);
            } else if x.is_finite() && x != 0.0 && y.is_finite() && (a & 0x7f80) != 0 {
                assert!(((y - x) / x).abs() <= 1.0 / 16.0, "{x} {y}");
            }
        }
    }
}
