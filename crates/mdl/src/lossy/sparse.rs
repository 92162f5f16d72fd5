//! Dropping the small part of Adam's moments before they are coded (ExCP's joint shrinking,
//! made safe for Adam): a first moment keeps only its large elements, and where it is dropped
//! the second moment holds on to its previous value while that stays close.
//!
//! Both rules only change the values handed to the residual coder; the recorded error is
//! measured against the tensor as committed, so `mdl show` reports what was dropped.

use mdl_format::Dtype;

use mdl_codec::engine::FloatView;
use mdl_codec::scalar;
use rayon::prelude::*;

/// What the encoder drops from a moment coded as a residual.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Sparsify {
    /// `exp_avg`: elements of magnitude at most `threshold` become +0.
    Small { threshold: f64 },
    /// `exp_avg_sq`: where the first moment (tensor `first`) is dropped (magnitude at most
    /// `threshold`), the reference's value is kept while the value is within `octaves` of it.
    Hold {
        first: usize,
        threshold: f64,
        octaves: f64,
    },
}

/// `factor` times the mean magnitude of `values`' finite elements: below it, a first moment is
/// dropped.
pub(crate) fn small_threshold(dtype: Dtype, values: &[u8], factor: f64) -> f64 {
    const CHUNK: usize = 1 << 16;
    let n = values.len() / dtype.size();
    // Summed a chunk at a time, the chunks' sums added in order: the same on every machine.
    let chunks: Vec<(f64, u64)> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            (c * CHUNK..((c + 1) * CHUNK).min(n))
                .map(|i| scalar::value(dtype, values, i).abs())
                .filter(|a| a.is_finite())
                .fold((0.0f64, 0u64), |(s, c), a| (s + a, c + 1))
        })
        .collect();
    let (sum, count) = chunks
        .iter()
        .fold((0.0, 0), |(s, c), &(cs, cc)| (s + cs, c + cc));
    factor * sum / count.max(1) as f64
}

/// `values` with the elements `s` drops replaced: by +0 ([`Sparsify::Small`]) or by the
/// reference's element ([`Sparsify::Hold`], which needs `reference` and the first moment).
/// Non-finite elements are never replaced.
pub(crate) fn apply(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    first: Option<FloatView<'_>>,
    s: Sparsify,
) -> Vec<u8> {
    let size = dtype.size();
    let mut out = values.to_vec();
    out.par_chunks_mut(size).enumerate().for_each(|(i, o)| {
        let x = scalar::value(dtype, values, i);
        if !x.is_finite() {
            return;
        }
        match s {
            Sparsify::Small { threshold } => {
                if x.abs() <= threshold {
                    o.fill(0);
                }
            }
            Sparsify::Hold {
                threshold, octaves, ..
            } => {
                let (Some(r), Some(m)) = (reference, first) else {
                    return;
                };
                let dropped = scalar::value(m.dtype, m.bytes, i).abs() <= threshold;
                let rv = scalar::value(dtype, r, i);
                if dropped
                    && x > 0.0
                    && rv > 0.0
                    && rv.is_finite()
                    && (x / rv).log2().abs() <= octaves
                {
                    o.copy_from_slice(&r[i * size..(i + 1) * size]);
                }
            }
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn small_first_moments_drop_and_second_moments_hold_only_where_close() {
        let m = f32s(&[0.1, -0.1, 3.0, -0.2, f32::NAN, 0.1]);
        // Mean magnitude of the finite elements: 3.5 / 5 = 0.7.
        let t = small_threshold(Dtype::F32, &m, 2.0);
        assert!((t - 1.4).abs() < 1e-6, "{t}");
        let dropped = apply(Dtype::F32, &m, None, None, Sparsify::Small { threshold: t });
        let d = back(&dropped);
        assert_eq!(&d[..4], &[0.0, 0.0, 3.0, 0.0]);
        assert!(d[4].is_nan(), "non-finite elements are kept");
        let v = f32s(&[1.0, 1.0, 1.0, 8.0, 1.0, 1.0]);
        let r = f32s(&[1.5, 0.5, 2.0, 1.0, 2.0, 0.0]);
        let hold = Sparsify::Hold {
            first: 0,
            threshold: t,
            octaves: 1.0,
        };
        let first = FloatView {
            dtype: Dtype::F32,
            bytes: &m,
        };
        let held = back(&apply(Dtype::F32, &v, Some(&r), Some(first), hold));
        // Held: 1.5 (0.58 octaves) and 0.5 (1 octave). Kept: 1.0 (its first moment is kept),
        // 8.0 (3 octaves from 1.0), 1.0 (its first moment is NaN, not small), and 1.0 (a
        // zero reference cannot be held).
        assert_eq!(held, vec![1.5, 0.5, 1.0, 8.0, 1.0, 1.0]);
    }
}
