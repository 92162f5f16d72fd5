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

use super::{Mode, PREDICTED};
use crate::{scalar, varint};

/// `2^(j/8)` for `j` in `0..8`, as their correctly rounded `f64` bits.
const EIGHTHS: [u64; 8] = [
    0x3ff0_0000_0000_0000,
    0x3ff1_72b8_3c7d_517b,
    0x3ff3_06fe_0a31_b715,
    0x3ff4_bfda_d536_2a27,
    0x3ff6_a09e_667f_3bcd,
    0x3ff8_ace5_422a_a0db,
    0x3ffa_e89f_995a_d3ad,
    0x3ffd_5818_dcfb_a487,
];

/// Flag: the prediction starts from `√r` (a previous version); else from 1.
const FROM_REFERENCE: u8 = 1;
/// Flag: column factors follow the row factors.
const COLUMNS: u8 = 2;

/// Rows per block of the fit's column sums.
const FIT_ROWS: usize = 64;

/// A factor's exponent is within this many eighths of an octave of 1 (far beyond any finite
/// `f32` ratio; it keeps `2^(k/8)` and its products finite).
const MAX_EIGHTHS: i64 = 8 * 512;

/// `2^(k/8)`, exactly as every machine computes it.
fn exp2_eighths(k: i64) -> f64 {
    let (e, j) = (k.div_euclid(8), k.rem_euclid(8));
    f64::from_bits(EIGHTHS[j as usize]) * f64::powi(2.0, e as i32)
}

/// The fitted factors of a predicted reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Predictor {
    from_reference: bool,
    rows: usize,
    cols: usize,
    /// Each row's exponent, in eighths of an octave.
    row: Vec<i64>,
    /// Each column's (empty: all zero).
    col: Vec<i64>,
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
        let mean = |sum: f64, count: u64| if count > 0 { sum / count as f64 } else { 0.0 };
        let eighths = |x: f64| ((x * 8.0).round() as i64).clamp(-MAX_EIGHTHS, MAX_EIGHTHS);
        if n == 0 {
            // Nothing to fit (callers code tensors of hundreds of elements or more).
            return Predictor {
                from_reference: reference.is_some(),
                rows,
                cols,
                row: vec![0; rows],
                col: Vec::new(),
            };
        }
        let row_mean: Vec<f64> = target
            .par_chunks(cols)
            .map(|row| {
                let (s, c) = row
                    .iter()
                    .filter(|x| !x.is_nan())
                    .fold((0.0, 0u64), |(s, c), &x| (s + f64::from(x), c + 1));
                mean(s, c)
            })
            .collect();
        let col = if rows > 1 {
            // Column sums over fixed blocks of rows, added in block order: the same factors
            // whatever the thread count, so a checkpoint stores the same bytes on any machine.
            let parts: Vec<Vec<(f64, u64)>> = target
                .par_chunks(FIT_ROWS * cols)
                .enumerate()
                .map(|(b, block)| {
                    let mut sums = vec![(0.0f64, 0u64); cols];
                    for (r, row) in block.chunks(cols).enumerate() {
                        let m = row_mean[b * FIT_ROWS + r];
                        for (s, &x) in sums.iter_mut().zip(row) {
                            if !x.is_nan() {
                                s.0 += f64::from(x) - m;
                                s.1 += 1;
                            }
                        }
                    }
                    sums
                })
                .collect();
            let mut sums = vec![(0.0f64, 0u64); cols];
            for part in parts {
                for (s, p) in sums.iter_mut().zip(part) {
                    s.0 += p.0;
                    s.1 += p.1;
                }
            }
            sums.into_iter().map(|(s, c)| eighths(mean(s, c))).collect()
        } else {
            Vec::new()
        };
        Predictor {
            from_reference: reference.is_some(),
            rows,
            cols,
            row: row_mean.into_iter().map(eighths).collect(),
            col,
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
        let n = self.rows * self.cols;
        if reference.is_some_and(|r| r.len() != n * size) {
            return Err(bad("reference and prediction sizes differ"));
        }
        let down: Vec<f64> = match self.col.is_empty() {
            true => vec![1.0; self.cols],
            false => self.col.iter().map(|&k| exp2_eighths(k)).collect(),
        };
        let mut out = vec![0u8; n * size];
        out.par_chunks_mut(self.cols.max(1) * size)
            .enumerate()
            .for_each(|(r, row)| {
                let across = exp2_eighths(self.row[r]);
                for (j, o) in row.chunks_exact_mut(size).enumerate() {
                    let start = match reference {
                        Some(x) => scalar::value(dtype, x, r * self.cols + j).max(0.0).sqrt(),
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
        let mut out = vec![PREDICTED];
        out.push(
            if self.from_reference {
                FROM_REFERENCE
            } else {
                0
            } | if self.col.is_empty() { 0 } else { COLUMNS },
        );
        varint::put(&mut out, self.rows as u64);
        varint::put(&mut out, self.cols as u64);
        for ks in [&self.row, &self.col] {
            let mut last = 0i64;
            for &k in ks {
                let d = k - last;
                varint::put(&mut out, ((d << 1) ^ (d >> 63)) as u64);
                last = k;
            }
        }
        out.extend_from_slice(inner);
        out
    }

    /// A payload's factors and its inner log-mode payload (`None`: not a predicted payload),
    /// checked against a tensor of `n` elements when `n` is given.
    pub fn unwrap(
        payload: &[u8],
        n: Option<usize>,
    ) -> Result<Option<(Predictor, &[u8])>, FormatError> {
        let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
        if payload.first() != Some(&PREDICTED) {
            return Ok(None);
        }
        let flags = *payload.get(1).ok_or_else(|| bad("truncated predictor"))?;
        if flags & !(FROM_REFERENCE | COLUMNS) != 0 {
            return Err(bad("unknown predictor flags"));
        }
        let mut at = 2;
        let mut count = || -> Result<usize, FormatError> {
            let v = varint::read(payload, &mut at).ok_or_else(|| bad("truncated predictor"))?;
            usize::try_from(v).map_err(|_| bad("predictor view too large"))
        };
        let (rows, cols) = (count()?, count()?);
        let covered = rows.checked_mul(cols);
        if covered.is_none() || n.is_some_and(|n| covered != Some(n)) || rows == 0 {
            return Err(bad("predictor view does not cover the tensor"));
        }
        let with_cols = flags & COLUMNS != 0;
        // Each factor takes at least a byte: a count beyond the payload is refused before any
        // allocation.
        if rows + if with_cols { cols } else { 0 } > payload.len() {
            return Err(bad("truncated predictor"));
        }
        let mut factors = |len: usize| -> Result<Vec<i64>, FormatError> {
            let mut last = 0i64;
            (0..len)
                .map(|_| {
                    let z =
                        varint::read(payload, &mut at).ok_or_else(|| bad("truncated factor"))?;
                    let d = ((z >> 1) as i64) ^ -((z & 1) as i64);
                    last = last
                        .checked_add(d)
                        .filter(|k| k.abs() <= MAX_EIGHTHS)
                        .ok_or_else(|| bad("factor out of range"))?;
                    Ok(last)
                })
                .collect()
        };
        let row = factors(rows)?;
        let col = if with_cols {
            factors(cols)?
        } else {
            Vec::new()
        };
        let inner = &payload[at..];
        if inner.first() != Some(&(Mode::Log as u8)) {
            return Err(bad("a predicted payload's codes must be log-mode"));
        }
        Ok(Some((
            Predictor {
                from_reference: flags & FROM_REFERENCE != 0,
                rows,
                cols,
                row,
                col,
            },
            inner,
        )))
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

    #[test]
    fn eighths_of_an_octave_are_the_correctly_rounded_powers() {
        for (j, bits) in EIGHTHS.iter().enumerate() {
            let want = (j as f64 / 8.0).exp2();
            assert!((f64::from_bits(*bits) - want).abs() <= f64::EPSILON * want);
        }
        assert_eq!(exp2_eighths(-8), 0.5);
        assert_eq!(exp2_eighths(17), 4.0 * f64::from_bits(EIGHTHS[1]));
        assert_eq!(exp2_eighths(-1), 0.5 * f64::from_bits(EIGHTHS[7]));
    }

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
            rows: 2,
            cols: 3,
            row: vec![-163, 7],
            col: vec![0, -5, 12],
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
            rows: 3,
            cols: 2,
            row: vec![-400, 5, 4],
            col: vec![0, -9],
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
