//! A predicted reference for Adam's second moment: log-domain residuals taken against
//! `√r · R_row · C_col` (with a previous version `r`) or `R_row · C_col` (without one), where
//! the row and column factors are fitted to the tensor being coded and stored with it.
//!
//! `exp_avg_sq` is an average of squared gradients over a window of about `1 / (1 − β2)` steps:
//! from one checkpoint to the next it is part memory (its previous value, decayed) and part new
//! gradients, whose scale varies by row and column far more than element by element (Adafactor
//! stores nothing but such factors). Coding `log v` against half of `log r` plus a row and a
//! column term leaves residuals a third to a half narrower than against `r` itself, measured on
//! the corpus (`docs/BENCHMARKS.md`); without a previous version the factors alone replace the
//! code-table quantizer.
//!
//! The payload is `PREDICTED`, a flags byte, the view's rows and columns (varints), each
//! factor's exponent in eighths of an octave as zigzag deltas from the previous one (varints:
//! rows, then columns when the tensor has them), then a complete log-mode payload coded against
//! the prediction. The prediction is computed the same on every machine: `√r` and products of
//! `f64`s are correctly rounded, `2^(k/8)` is a power of two times one of eight constants, and
//! the result is rounded to the tensor's dtype before it serves as the log payload's reference.

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use super::factors::Factors;
use super::{Mode, PREDICTED};
use crate::scalar;

/// Flag: the prediction starts from `√r` (a previous version); else from 1.
const FROM_REFERENCE: u8 = 1;

/// Rows per block of the target's computation.
const FIT_ROWS: usize = 64;

/// The fitted factors of a predicted reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictor {
    from_reference: bool,
    factors: Factors,
}

/// The view a tensor of `shape` is factored as: its first dimension by the rest, or one row.
pub fn view_of(shape: &[u64]) -> (usize, usize) {
    let n: u64 = shape.iter().product();
    match shape {
        [rows, ..] if shape.len() >= 2 && *rows > 0 => (*rows as usize, (n / rows) as usize),
        _ => (1, n as usize),
    }
}

impl Predictor {
    /// Fits the factors to `values` (positive elements only; zeros and non-finite ones are
    /// left to the log payload's own codes) viewed as `rows × cols`, against `reference` when
    /// there is one: each row's mean of `log2 v − ½·log2 r`, then each column's mean of what
    /// the rows leave, both rounded to eighths of an octave.
    pub fn fit(
        dtype: Dtype,
        values: &[u8],
        reference: Option<&[u8]>,
        (rows, cols): (usize, usize),
    ) -> Predictor {
        let n = rows * cols;
        assert_eq!(n * dtype.size(), values.len(), "the view covers the tensor");
        // Each element's `log2 v − ½·log2 r`, once (NaN where it has none), kept as f32: the
        // factors are rounded to eighths of an octave.
        let mut target = vec![f32::NAN; n];
        target
            .par_chunks_mut(FIT_ROWS * cols.max(1))
            .enumerate()
            .for_each(|(b, out)| {
                let first = b * FIT_ROWS * cols;
                for (k, t) in out.iter_mut().enumerate() {
                    let i = first + k;
                    let v = scalar::value(dtype, values, i);
                    let base = match reference {
                        Some(r) => match scalar::value(dtype, r, i) {
                            r if r.is_finite() && r > 0.0 => 0.5 * r.log2(),
                            _ => continue,
                        },
                        None => 0.0,
                    };
                    if v.is_finite() && v > 0.0 {
                        *t = (v.log2() - base) as f32;
                    }
                }
            });
        Predictor {
            from_reference: reference.is_some(),
            factors: Factors::fit(&target, (rows, cols)),
        }
    }

    /// The prediction as a tensor of `dtype`: what the log payload is coded against.
    /// `reference` must be given exactly when the predictor was fitted with one.
    pub fn predict(&self, dtype: Dtype, reference: Option<&[u8]>) -> Result<Vec<u8>, FormatError> {
        let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
        if reference.is_some() != self.from_reference {
            return Err(bad(
                "a predicted payload's reference is missing or unexpected",
            ));
        }
        let size = dtype.size();
        let Factors { rows, cols, .. } = self.factors;
        let n = rows * cols;
        if reference.is_some_and(|r| r.len() != n * size) {
            return Err(bad("reference and prediction sizes differ"));
        }
        let across_rows = self.factors.row_values();
        let down = self.factors.col_values();
        let mut out = vec![0u8; n * size];
        out.par_chunks_mut(cols.max(1) * size)
            .enumerate()
            .for_each(|(r, row)| {
                let across = across_rows[r];
                for (j, o) in row.chunks_exact_mut(size).enumerate() {
                    let start = match reference {
                        Some(x) => scalar::value(dtype, x, r * cols + j).max(0.0).sqrt(),
                        None => 1.0,
                    };
                    // NaN (a non-finite reference) becomes +0: such elements are stored
                    // exactly.
                    let p = start * across * down[j];
                    scalar::put_rounded(dtype, if p.is_finite() { p } else { 0.0 }, o);
                }
            });
        Ok(out)
    }

    /// `inner` (a log-mode payload coded against [`Self::predict`]) with the factors before it.
    pub fn wrap(&self, inner: &[u8]) -> Vec<u8> {
        let flags = if self.from_reference {
            FROM_REFERENCE
        } else {
            0
        };
        self.factors.wrap(PREDICTED, flags, inner)
    }

    /// A payload's factors and its inner log-mode payload (`None`: not a predicted payload),
    /// checked against a tensor of `n` elements when `n` is given.
    pub fn unwrap(
        payload: &[u8],
        n: Option<usize>,
    ) -> Result<Option<(Predictor, &[u8])>, FormatError> {
        let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
        let Some((flags, factors, inner)) = Factors::unwrap(payload, PREDICTED, FROM_REFERENCE, n)?
        else {
            return Ok(None);
        };
        if inner.first() != Some(&(Mode::Log as u8)) {
            return Err(bad("a predicted payload's codes must be log-mode"));
        }
        let predictor = Predictor {
            from_reference: flags & FROM_REFERENCE != 0,
            factors,
        };
        Ok(Some((predictor, inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Computed apart from this code, by the documented formula in Python's doubles.
    const PINNED: [u32; 6] = [
        0x304a_2402,
        0x3083_126f,
        0x308e_ef5e,
        0x3bb4_4a53,
        0x0000_0000,
        0x399c_3bae,
    ];

    /// A second moment with row and column structure, and its version a few steps earlier.
    fn moments(dtype: Dtype, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut noise = || {
            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            ((seed >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        };
        let (mut now, mut before) = (vec![0u8; rows * cols * dtype.size()], Vec::new());
        before.resize(now.len(), 0);
        let size = dtype.size();
        for r in 0..rows {
            for c in 0..cols {
                let i = r * cols + c;
                let scale = (-20.0 + 0.05 * r as f64 - 0.01 * c as f64 + 2.0 * noise()).exp2();
                // A few zeros (never touched) and one element with nothing before it.
                let v = if i.is_multiple_of(97) { 0.0 } else { scale };
                let old = if i == 5 { 0.0 } else { v * (1.0 + noise()) };
                scalar::put_rounded(dtype, v, &mut now[i * size..(i + 1) * size]);
                scalar::put_rounded(dtype, old, &mut before[i * size..(i + 1) * size]);
            }
        }
        (now, before)
    }

    #[test]
    fn predicted_payloads_decode_to_what_was_coded_within_half_a_step() {
        for dtype in [Dtype::F32, Dtype::BF16] {
            for (rows, cols) in [(48, 80), (1, 500)] {
                let (now, before) = moments(dtype, rows, cols);
                for reference in [Some(&before[..]), None] {
                    let p = Predictor::fit(dtype, &now, reference, (rows, cols));
                    let prediction = p.predict(dtype, reference).unwrap();
                    let (inner, render) =
                        super::super::encode(dtype, &now, Some(&prediction), Mode::Log, 1.0);
                    let payload = p.wrap(&inner);
                    let mut out = vec![0u8; now.len()];
                    super::super::decode(dtype, &payload, reference, &mut out).unwrap();
                    assert_eq!(out, render, "{dtype:?} {rows}×{cols}");
                    assert_eq!(
                        super::super::mode_and_step(&payload).unwrap(),
                        (Mode::Log, 1.0)
                    );
                    let n = now.len() / dtype.size();
                    for i in 0..n {
                        let (x, y) = (scalar::value(dtype, &now, i), scalar::value(dtype, &out, i));
                        if x == 0.0 {
                            assert_eq!(y, 0.0);
                        } else {
                            // Half an octave, plus the dtype's rounding of the result.
                            let off = (y / x).log2().abs();
                            assert!(off <= 0.5 + 0.006, "{dtype:?} [{i}]: {off} octaves");
                        }
                    }
                    // The other reference (or none where one was fitted) is refused.
                    let wrong = match reference {
                        Some(_) => None,
                        None => Some(&before[..]),
                    };
                    assert!(super::super::decode(dtype, &payload, wrong, &mut out).is_err());
                }
            }
        }
    }

    #[test]
    fn a_prediction_is_pinned_bit_for_bit() {
        // What every machine must compute (docs/FORMAT.md, "predicted"): a change here changes
        // the decoded content of every predicted record, and so breaks their ids.
        let p = Predictor {
            from_reference: true,
            factors: Factors {
                rows: 2,
                cols: 3,
                row: vec![-163, 7],
                col: vec![0, -5, 12],
            },
        };
        let reference: Vec<u8> = [1e-6f32, 4e-6, 2.5e-7, 9e-6, 0.0, 3.3e-9]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let got: Vec<u32> = p
            .predict(Dtype::F32, Some(&reference))
            .unwrap()
            .chunks(4)
            .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(got, PINNED, "{got:#010x?}");
    }

    #[test]
    fn factors_round_trip_and_damaged_headers_are_refused() {
        let p = Predictor {
            from_reference: true,
            factors: Factors {
                rows: 3,
                cols: 2,
                row: vec![-400, 5, 4],
                col: vec![0, -9],
            },
        };
        let payload = p.wrap(&[Mode::Log as u8, 1, 2, 3]);
        let (back, inner) = Predictor::unwrap(&payload, Some(6)).unwrap().unwrap();
        assert_eq!(back, p);
        assert_eq!(inner, &[Mode::Log as u8, 1, 2, 3]);
        assert!(Predictor::unwrap(&payload, Some(7)).is_err());
        assert!(Predictor::unwrap(&[Mode::Log as u8], Some(6))
            .unwrap()
            .is_none());
        for cut in 1..payload.len() - 4 {
            assert!(
                Predictor::unwrap(&payload[..cut], Some(6)).is_err(),
                "{cut}"
            );
        }
        let mut linear = p.wrap(&[Mode::Linear as u8]);
        assert!(Predictor::unwrap(&linear, Some(6)).is_err());
        linear[1] = 0x80;
        assert!(Predictor::unwrap(&linear, Some(6)).is_err());
    }
}
