//! Row and column factors of a tensor viewed as `rows × cols`, in eighths of an octave: fitted
//! to a per-element target in the log domain, stored as a header before an inner payload, and
//! turned into `f64`s exactly as every machine computes them. Two payload kinds use them: a
//! second moment's predicted reference ([`super::Predictor`]) and a weight's steps
//! ([`super::Steps`]).
//!
//! Header: the kind's first byte, a flags byte, the view's rows and columns (varints), each
//! factor's exponent as zigzag deltas from the previous one (varints: rows, then columns when
//! flag [`COLUMNS`] is set), then the inner payload.

use mdl_format::FormatError;
use rayon::prelude::*;

use crate::varint;

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

/// Flag: column factors follow the row factors.
pub(super) const COLUMNS: u8 = 2;

/// Rows per block of the fit's column sums.
const FIT_ROWS: usize = 64;

/// A factor's exponent is within this many eighths of an octave of 1 (far beyond any finite
/// `f32` ratio; it keeps `2^(k/8)` and its products finite).
pub(super) const MAX_EIGHTHS: i64 = 8 * 512;

/// `2^(k/8)`, exactly as every machine computes it.
pub(super) fn exp2_eighths(k: i64) -> f64 {
    let (e, j) = (k.div_euclid(8), k.rem_euclid(8));
    f64::from_bits(EIGHTHS[j as usize]) * f64::powi(2.0, e as i32)
}

/// A header's flags (without [`COLUMNS`]), its factors and the inner payload after it.
pub(super) type Unwrapped<'a> = (u8, Factors, &'a [u8]);

/// A tensor's view and its factors' exponents.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Factors {
    pub(super) rows: usize,
    pub(super) cols: usize,
    /// Each row's exponent, in eighths of an octave.
    pub(super) row: Vec<i64>,
    /// Each column's (empty: all zero, and not stored).
    pub(super) col: Vec<i64>,
}

impl Factors {
    /// Fits `target` (one `log2` value an element, NaN where an element has none) viewed as
    /// `rows × cols`: each row's mean, then each column's mean of what the rows leave (with
    /// more than one row), both rounded to eighths of an octave. The same exponents whatever
    /// the thread count: column sums are added over fixed blocks of rows, in block order.
    pub(super) fn fit(target: &[f32], (rows, cols): (usize, usize)) -> Factors {
        assert_eq!(target.len(), rows * cols, "the view covers the tensor");
        let mean = |sum: f64, count: u64| if count > 0 { sum / count as f64 } else { 0.0 };
        let eighths = |x: f64| ((x * 8.0).round() as i64).clamp(-MAX_EIGHTHS, MAX_EIGHTHS);
        if target.is_empty() {
            return Factors {
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
        Factors {
            rows,
            cols,
            row: row_mean.into_iter().map(eighths).collect(),
            col,
        }
    }

    /// Each row's factor `2^(k/8)`.
    pub(super) fn row_values(&self) -> Vec<f64> {
        self.row.iter().map(|&k| exp2_eighths(k)).collect()
    }

    /// Each column's factor (all 1 without column factors).
    pub(super) fn col_values(&self) -> Vec<f64> {
        match self.col.is_empty() {
            true => vec![1.0; self.cols],
            false => self.col.iter().map(|&k| exp2_eighths(k)).collect(),
        }
    }

    /// `inner` behind the header of kind `lead` with `flags` ([`COLUMNS`] is added here when
    /// there are column factors).
    pub(super) fn wrap(&self, lead: u8, flags: u8, inner: &[u8]) -> Vec<u8> {
        let flags = flags | if self.col.is_empty() { 0 } else { COLUMNS };
        let mut out = vec![lead, flags];
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

    /// A payload's flags, factors and inner payload when its first byte is `lead` (`None`:
    /// another kind), checked against a tensor of `n` elements when `n` is given. `known`: the
    /// flags the kind may set besides [`COLUMNS`].
    pub(super) fn unwrap(
        payload: &[u8],
        lead: u8,
        known: u8,
        n: Option<usize>,
    ) -> Result<Option<Unwrapped<'_>>, FormatError> {
        let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
        if payload.first() != Some(&lead) {
            return Ok(None);
        }
        let flags = *payload.get(1).ok_or_else(|| bad("truncated factors"))?;
        if flags & !(known | COLUMNS) != 0 {
            return Err(bad("unknown factor flags"));
        }
        let mut at = 2;
        let mut count = || -> Result<usize, FormatError> {
            let v = varint::read(payload, &mut at).ok_or_else(|| bad("truncated factors"))?;
            usize::try_from(v).map_err(|_| bad("factored view too large"))
        };
        let (rows, cols) = (count()?, count()?);
        let covered = rows.checked_mul(cols);
        if covered.is_none() || n.is_some_and(|n| covered != Some(n)) || rows == 0 {
            return Err(bad("factored view does not cover the tensor"));
        }
        let with_cols = flags & COLUMNS != 0;
        // Each factor takes at least a byte: a count beyond the payload is refused before any
        // allocation.
        if rows.saturating_add(if with_cols { cols } else { 0 }) > payload.len() {
            return Err(bad("truncated factors"));
        }
        let mut exponents = |len: usize| -> Result<Vec<i64>, FormatError> {
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
        let row = exponents(rows)?;
        let col = if with_cols {
            exponents(cols)?
        } else {
            Vec::new()
        };
        let factors = Factors {
            rows,
            cols,
            row,
            col,
        };
        Ok(Some((flags & !COLUMNS, factors, &payload[at..])))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn a_fit_takes_row_means_then_column_means_in_eighths() {
        // log2 target = row term + column term, exactly representable.
        let (rows, cols) = (3, 4);
        let row = [-2.0f32, 0.5, 3.0];
        let col = [0.0f32, 0.25, -0.25, 1.0];
        let mut target: Vec<f32> = (0..rows * cols)
            .map(|i| row[i / cols] + col[i % cols])
            .collect();
        target[5] = f32::NAN;
        let f = Factors::fit(&target, (rows, cols));
        // Row means include the columns' mean (0.25); one element missing moves row 1's.
        assert_eq!(f.row[0], -14);
        assert_eq!(f.row[2], 26);
        assert_eq!(f.col.len(), cols);
        // A one-row view has no column factors.
        assert!(Factors::fit(&target[..cols], (1, cols)).col.is_empty());
    }
}
