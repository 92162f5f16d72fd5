//! A weight residual's step by row and column: linear-mode codes whose step is the payload's
//! step times a factor per row and a factor per column, fitted so that each element's step
//! goes as `1 / √(v̂ + φ·mean v̂)` — the curvature the loss estimate charges an element's error
//! with (`quant::Correction::loss_change`). At one estimated loss change, elements the loss
//! barely sees get coarse steps and sensitive ones fine steps, instead of one step for all: a
//! third of a bit an element less on the corpus weights, measured before this was built
//! (`bench/lossy-bound/step-scaling.py`, docs/BENCHMARKS.md).
//!
//! The payload is [`STEPPED`](super::STEPPED), then the factors' header ([`Factors`], no
//! flags but columns), then a complete linear-mode payload whose element `i` is
//! `round_dtype(r_i + q·(step·G_i))` with `G_i = R_row · C_col`, all in `f64` (correctly rounded
//! products: every machine rebuilds the same values). The factors need nothing at decode time
//! but the payload: the second moment only chooses them.

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use super::factors::Factors;
use super::{Mode, STEPPED};
use crate::scalar;

/// Rows per block of the target's computation.
const FIT_ROWS: usize = 64;

/// A stepped payload's factors.
#[derive(Clone, Debug, PartialEq)]
pub struct Steps {
    factors: Factors,
}

/// Each element's step factor, as the coder takes it: `G_i = row[i / cols] · col[i % cols]`.
pub(super) struct Gains {
    row: Vec<f64>,
    col: Vec<f64>,
}

impl Gains {
    /// The factors of elements `start..start + len` (a chunk the coder takes at a time).
    pub(super) fn run(&self, start: usize, len: usize) -> Vec<f64> {
        let mut out = vec![0.0; len];
        self.fill(start, &mut out);
        out
    }

    /// The factors of elements `start..start + out.len()`, into `out`.
    pub(super) fn fill(&self, start: usize, out: &mut [f64]) {
        let cols = self.col.len();
        let (mut r, mut c) = (start / cols, start % cols);
        for g in out {
            *g = self.row[r] * self.col[c];
            c += 1;
            if c == cols {
                c = 0;
                r += 1;
            }
        }
    }
}

impl Steps {
    /// Fits the factors to the second moment `v` (`v_dtype`, little-endian) of a tensor viewed
    /// as `rows × cols`: each element's target is `−½·log2(v_i + floor · mean v)` (NaN where
    /// `v_i` is not finite), rows then columns as [`Factors::fit`] takes them, the rows moved
    /// so that their mean exponent is 0 (the payload's step stays about the tensor's own).
    /// `None` where factors cannot help: one row, or a second moment with no positive mean.
    pub fn fit(
        v_dtype: Dtype,
        v: &[u8],
        (rows, cols): (usize, usize),
        floor: f64,
    ) -> Option<Steps> {
        let n = rows * cols;
        assert_eq!(n * v_dtype.size(), v.len(), "the view covers the tensor");
        if rows < 2 || cols == 0 {
            return None;
        }
        // The mean, in a fixed order (per block of rows, blocks in order).
        let parts: Vec<(f64, u64)> = (0..rows.div_ceil(FIT_ROWS))
            .into_par_iter()
            .map(|b| {
                let elements = b * FIT_ROWS * cols..((b + 1) * FIT_ROWS * cols).min(n);
                elements
                    .map(|i| scalar::value(v_dtype, v, i))
                    .filter(|x| x.is_finite())
                    .fold((0.0, 0), |(s, c), x| (s + x.max(0.0), c + 1))
            })
            .collect();
        let (sum, count) = parts
            .iter()
            .fold((0.0, 0), |(s, c), &(ps, pc)| (s + ps, c + pc));
        let mean = sum / count.max(1) as f64;
        if !(mean > 0.0 && mean.is_finite()) {
            return None;
        }
        let add = floor * mean;
        let mut target = vec![f32::NAN; n];
        target
            .par_chunks_mut(FIT_ROWS * cols)
            .enumerate()
            .for_each(|(b, out)| {
                let first = b * FIT_ROWS * cols;
                for (k, t) in out.iter_mut().enumerate() {
                    let x = scalar::value(v_dtype, v, first + k);
                    if x.is_finite() {
                        *t = (-0.5 * (x.max(0.0) + add).log2()) as f32;
                    }
                }
            });
        let mut factors = Factors::fit(&target, (rows, cols));
        let centre = factors.row.iter().sum::<i64>() as f64 / rows as f64;
        let centre = centre.round() as i64;
        factors.row.iter_mut().for_each(|k| *k -= centre);
        Some(Steps { factors })
    }

    /// The view the factors cover.
    pub fn view(&self) -> (usize, usize) {
        (self.factors.rows, self.factors.cols)
    }

    /// The factors as the coder multiplies with them, for a tensor of `len` bytes of `dtype`,
    /// which they must cover.
    pub(super) fn gains_for(&self, dtype: Dtype, len: usize) -> Gains {
        let (rows, cols) = self.view();
        assert_eq!(
            rows * cols * dtype.size(),
            len,
            "the steps cover the tensor"
        );
        self.gains()
    }

    /// The factors as the coder multiplies with them.
    pub(super) fn gains(&self) -> Gains {
        Gains {
            row: self.factors.row_values(),
            col: self.factors.col_values(),
        }
    }

    /// `inner` (a linear-mode payload coded with [`Self::gains`]) with the factors before it.
    pub fn wrap(&self, inner: &[u8]) -> Vec<u8> {
        self.factors.wrap(STEPPED, 0, inner)
    }

    /// A payload's factors and its inner linear-mode payload (`None`: not a stepped payload),
    /// checked against a tensor of `n` elements when `n` is given.
    pub fn unwrap(payload: &[u8], n: Option<usize>) -> Result<Option<(Steps, &[u8])>, FormatError> {
        let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
        let Some((_, factors, inner)) = Factors::unwrap(payload, STEPPED, 0, n)? else {
            return Ok(None);
        };
        if inner.first() != Some(&(Mode::Linear as u8)) {
            return Err(bad("a stepped payload's codes must be linear"));
        }
        Ok(Some((Steps { factors }, inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::residual::{decode, encode, encode_stepped, measure_stepped, measure_steps};
    use crate::tensor::{FloatView, Moments};

    /// A weight, its previous version and its moments, with rows and columns whose second
    /// moments differ by orders of magnitude (as embeddings' rows and attention's columns do).
    struct Case {
        rows: usize,
        cols: usize,
        now: Vec<u8>,
        before: Vec<u8>,
        m: Vec<u8>,
        v: Vec<u8>,
    }

    fn case(dtype: Dtype, rows: usize, cols: usize) -> Case {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut noise = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed >> 11) as f64 / (1u64 << 53) as f64 - 0.5
        };
        let size = dtype.size();
        let mut c = Case {
            rows,
            cols,
            now: vec![0; rows * cols * size],
            before: vec![0; rows * cols * size],
            m: vec![0; rows * cols * size],
            v: vec![0; rows * cols * size],
        };
        for i in 0..rows * cols {
            let (r, j) = (i / cols, i % cols);
            let v = (-30.0 + 0.2 * r as f64 - 0.05 * j as f64 + noise()).exp2();
            let w = 0.02 * noise();
            let moved = w + 1e-3 * noise() / (1.0 + 0.1 * r as f64);
            let at = i * size..(i + 1) * size;
            scalar::put_rounded(dtype, w, &mut c.before[at.clone()]);
            scalar::put_rounded(dtype, moved, &mut c.now[at.clone()]);
            scalar::put_rounded(dtype, 1e-4 * noise(), &mut c.m[at.clone()]);
            // One never-touched element: the floor keeps its step finite.
            scalar::put_rounded(dtype, if i == 17 { 0.0 } else { v }, &mut c.v[at]);
        }
        c
    }

    #[test]
    fn steps_follow_the_curvature_and_decode_to_what_was_measured() {
        for dtype in [Dtype::F32, Dtype::BF16] {
            let c = case(dtype, 40, 96);
            let steps = Steps::fit(dtype, &c.v, (c.rows, c.cols), 0.1).unwrap();
            // Larger second moments (later rows, earlier columns) get finer steps.
            let g = steps.gains().run(0, c.rows * c.cols);
            assert!(g[39 * 96] < g[0] / 4.0, "{dtype:?}");
            assert!(g[39 * 96 + 95] > g[39 * 96], "{dtype:?}");
            let view = |bytes| FloatView { dtype, bytes };
            let moments = Some(Moments {
                m: view(&c.m),
                v: view(&c.v),
            });
            for step in [1e-4, 1e-3] {
                let reference = Some(&c.before[..]);
                let (payload, render) = encode_stepped(dtype, &c.now, reference, &steps, step);
                let mut out = vec![0u8; c.now.len()];
                decode(dtype, &payload, reference, &mut out).unwrap();
                assert!(out == render, "{dtype:?} {step}: decoded ≠ encoded");
                // Each element within half its own step (plus the dtype's rounding).
                for (i, gain) in g.iter().enumerate() {
                    let (x, y) = (
                        scalar::value(dtype, &c.now, i),
                        scalar::value(dtype, &out, i),
                    );
                    let half_ulp = y.abs() * 2f64.powi(if dtype == Dtype::BF16 { -8 } else { -24 });
                    let bound = step * gain / 2.0 + half_ulp;
                    assert!((y - x).abs() <= bound, "{dtype:?} [{i}] {x} → {y}");
                }
                // The measure counts what the encoder made: the same sums, bit for bit.
                let m = measure_stepped(dtype, &c.now, reference, moments, &steps, &[step], 1);
                let (mut sq, mut vd2) = (0.0, 0.0);
                for i in 0..c.rows * c.cols {
                    let d = scalar::value(dtype, &out, i) - scalar::value(dtype, &c.now, i);
                    sq += d * d;
                    vd2 += scalar::value(dtype, &c.v, i) * d * d;
                }
                let e = &m[0].err;
                assert!((e.sum_sq_err - sq).abs() <= 1e-9 * sq, "{dtype:?} {step}");
                assert!(
                    (e.sum_v_delta2 - vd2).abs() <= 1e-9 * vd2,
                    "{dtype:?} {step}"
                );
                // Unit factors are the plain payload's codes (what `measure_steps` counts).
                let flat = Steps {
                    factors: Factors {
                        rows: c.rows,
                        cols: c.cols,
                        row: vec![0; c.rows],
                        col: vec![0; c.cols],
                    },
                };
                let a = measure_stepped(dtype, &c.now, reference, moments, &flat, &[step], 1);
                let b = measure_steps(dtype, &c.now, reference, moments, Mode::Linear, &[step], 1);
                assert_eq!(a, b, "{dtype:?} {step}");
                let (plain, plain_render) = encode(dtype, &c.now, reference, Mode::Linear, step);
                let (wrapped, wrapped_render) =
                    encode_stepped(dtype, &c.now, reference, &flat, step);
                assert_eq!(plain_render, wrapped_render);
                assert!(wrapped.ends_with(&plain));
            }
        }
    }

    #[test]
    fn stepped_payloads_at_one_estimate_take_fewer_bits() {
        // At the weighted error one step gives, steps by row and column cost fewer bits.
        let dtype = Dtype::F32;
        let c = case(dtype, 64, 128);
        let view = |bytes| FloatView { dtype, bytes };
        let moments = Some(Moments {
            m: view(&c.m),
            v: view(&c.v),
        });
        let reference = Some(&c.before[..]);
        let steps = Steps::fit(dtype, &c.v, (c.rows, c.cols), 0.1).unwrap();
        let grid: Vec<f64> = (0..40).map(|k| 1e-5 * 2f64.powf(k as f64 / 4.0)).collect();
        let one = measure_steps(dtype, &c.now, reference, moments, Mode::Linear, &grid, 1);
        let rowcol = measure_stepped(dtype, &c.now, reference, moments, &steps, &grid, 1);
        // The one-step candidate in the middle, and the cheapest stepped one as accurate.
        let pick = &one[20];
        let best = rowcol
            .iter()
            .filter(|s| s.err.sum_v_delta2 <= pick.err.sum_v_delta2)
            .map(|s| s.bits(dtype))
            .fold(f64::INFINITY, f64::min);
        assert!(
            best < 0.9 * pick.bits(dtype),
            "{best} vs {}",
            pick.bits(dtype)
        );
    }

    #[test]
    fn damaged_stepped_payloads_are_refused() {
        let dtype = Dtype::F32;
        let c = case(dtype, 8, 32);
        let steps = Steps::fit(dtype, &c.v, (8, 32), 0.1).unwrap();
        let reference = Some(&c.before[..]);
        let (payload, _) = encode_stepped(dtype, &c.now, reference, &steps, 1e-3);
        let mut out = vec![0u8; c.now.len()];
        let (back, inner) = Steps::unwrap(&payload, Some(256)).unwrap().unwrap();
        assert_eq!(back, steps);
        let header = payload.len() - inner.len();
        for cut in 1..header {
            assert!(
                decode(dtype, &payload[..cut], reference, &mut out).is_err(),
                "{cut}"
            );
        }
        // A view that does not cover the tensor, unknown flags, a log-mode inner payload.
        let mut wrong = payload.clone();
        wrong[2] = 9;
        assert!(decode(dtype, &wrong, reference, &mut out).is_err());
        let mut flags = payload.clone();
        flags[1] |= 1;
        assert!(decode(dtype, &flags, reference, &mut out).is_err());
        let mut log = payload.clone();
        log[header] = Mode::Log as u8;
        assert!(decode(dtype, &log, reference, &mut out).is_err());
        // One row, or moments that are all zero, give no factors.
        assert!(Steps::fit(dtype, &c.v, (1, 256), 0.1).is_none());
        assert!(Steps::fit(dtype, &vec![0u8; c.v.len()], (8, 32), 0.1).is_none());
    }
}
