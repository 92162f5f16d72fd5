//! The combinations, element by element, in an order fixed so that a reference in any language
//! reproduces them bit for bit (`tests/python/test_merge.py` does, in numpy): every operation
//! is one IEEE-754 operation of the computing type (fp32; fp64 for fp64 tensors), rounded to
//! nearest, in the order written here, with no fused multiply-add.
//!
//! - `linear`: `c_i = w_i / Σw` (in f64, then rounded to the computing type);
//!   `out = c_0·x_0 + c_1·x_1 + …`, summed left to right.
//! - `task-arithmetic`: `out = base + (w_0·(x_0 − base) + w_1·(x_1 − base) + …)`.
//! - `ties` (Yadav et al., 2023): each task vector `t_i = x_i − base` keeps its entries whose
//!   magnitude is at least its k-th largest, `k = ⌈density · n⌉` (ties at the threshold kept),
//!   the rest set to 0; the elected sign of an entry is that of `s = w_0·t_0 + w_1·t_1 + …`; the
//!   merged task vector is `(Σ w_i·t_i) / (Σ w_i)` over the `i` whose kept entry is non-zero and
//!   of the elected sign (summed left to right from +0; 0 where there is none);
//!   `out = base + merged`.
//!
//! The result is rounded to the tensor's dtype to nearest, ties to even.

use std::fmt;
use std::ops::{Add, Div, Mul, Sub};

use mdl_codec::scalar;
use mdl_format::Dtype;

/// A merge strategy.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Strategy {
    /// A weighted average (a model soup).
    Linear,
    /// The base plus the weighted sum of the task vectors (`x_i − base`).
    TaskArithmetic,
    /// TIES: task vectors trimmed to their largest `density` of entries, signs elected, the
    /// agreeing entries averaged.
    Ties {
        /// The fraction of each task vector's entries kept, in (0, 1].
        density: f64,
    },
}

impl Strategy {
    /// Whether it combines task vectors over a base.
    pub fn has_base(&self) -> bool {
        !matches!(self, Strategy::Linear)
    }

    /// The strategy named `name` (`linear`, `task-arithmetic`, `ties`); `density` is TIES'.
    pub fn parse(name: &str, density: f64) -> Result<Strategy, String> {
        match name {
            "linear" => Ok(Strategy::Linear),
            "task-arithmetic" => Ok(Strategy::TaskArithmetic),
            "ties" => Ok(Strategy::Ties { density }),
            _ => Err(format!(
                "unknown merge strategy {name:?}: expected linear, task-arithmetic or ties"
            )),
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Strategy::Linear => "linear",
            Strategy::TaskArithmetic => "task-arithmetic",
            Strategy::Ties { .. } => "ties",
        })
    }
}

/// Refuses weights and parameters the strategy cannot use.
pub(crate) fn check(strategy: &Strategy, weights: &[f64]) -> Result<(), String> {
    if let Some(w) = weights.iter().find(|w| !w.is_finite()) {
        return Err(format!("weight {w} is not a finite number"));
    }
    match strategy {
        Strategy::Linear if weights.iter().sum::<f64>() == 0.0 => {
            Err("the weights of a linear merge sum to 0".into())
        }
        Strategy::Ties { density } if !(*density > 0.0 && *density <= 1.0) => Err(format!(
            "density {density} is out of range: expected more than 0 and at most 1"
        )),
        _ => Ok(()),
    }
}

/// The weights over their sum (a linear merge's coefficients).
pub(crate) fn normalized(weights: &[f64]) -> Vec<f64> {
    let sum: f64 = weights.iter().sum();
    weights.iter().map(|w| w / sum).collect()
}

/// Combines `inputs` (each a little-endian tensor of `dtype`, one per commit, of one length)
/// with `weights` (one per input) and, for the strategies that have one, `base`; the result's
/// bytes in `dtype`. `dtype` is F16, BF16, F32 or F64.
pub fn combine(
    dtype: Dtype,
    strategy: &Strategy,
    weights: &[f64],
    base: Option<&[u8]>,
    inputs: &[Vec<u8>],
) -> Vec<u8> {
    assert_eq!(weights.len(), inputs.len());
    if dtype == Dtype::F64 {
        let inputs: Vec<Vec<f64>> = inputs.iter().map(|b| decode64(b)).collect();
        let base = base.map(decode64);
        let out = lanes(strategy, weights, base.as_deref(), &inputs);
        return out.iter().flat_map(|x| x.to_le_bytes()).collect();
    }
    let inputs: Vec<Vec<f32>> = inputs.iter().map(|b| decode32(dtype, b)).collect();
    let base = base.map(|b| decode32(dtype, b));
    let out = lanes(strategy, weights, base.as_deref(), &inputs);
    encode32(dtype, &out)
}

/// A computing type: f32 or f64.
trait Lane:
    Copy
    + PartialOrd
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
{
    const ZERO: Self;
    fn of(x: f64) -> Self;
    fn magnitude(self) -> Self;
    fn nan(self) -> bool;
}

impl Lane for f32 {
    const ZERO: f32 = 0.0;
    fn of(x: f64) -> f32 {
        x as f32
    }
    fn magnitude(self) -> f32 {
        self.abs()
    }
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Lane for f64 {
    const ZERO: f64 = 0.0;
    fn of(x: f64) -> f64 {
        x
    }
    fn magnitude(self) -> f64 {
        self.abs()
    }
    fn nan(self) -> bool {
        self.is_nan()
    }
}

fn lanes<L: Lane>(
    strategy: &Strategy,
    weights: &[f64],
    base: Option<&[L]>,
    xs: &[Vec<L>],
) -> Vec<L> {
    let n = xs[0].len();
    match *strategy {
        Strategy::Linear => {
            let c: Vec<L> = normalized(weights).into_iter().map(L::of).collect();
            (0..n)
                .map(|j| {
                    let mut acc = c[0] * xs[0][j];
                    for i in 1..xs.len() {
                        acc = acc + c[i] * xs[i][j];
                    }
                    acc
                })
                .collect()
        }
        Strategy::TaskArithmetic => {
            let base = base.expect("task arithmetic has a base");
            let w: Vec<L> = weights.iter().map(|&w| L::of(w)).collect();
            (0..n)
                .map(|j| {
                    let mut acc = w[0] * (xs[0][j] - base[j]);
                    for i in 1..xs.len() {
                        acc = acc + w[i] * (xs[i][j] - base[j]);
                    }
                    base[j] + acc
                })
                .collect()
        }
        Strategy::Ties { density } => {
            let base = base.expect("ties has a base");
            let w: Vec<L> = weights.iter().map(|&w| L::of(w)).collect();
            let trimmed: Vec<Vec<L>> = xs
                .iter()
                .map(|x| {
                    let t: Vec<L> = x.iter().zip(base).map(|(&x, &b)| x - b).collect();
                    let keep = threshold(&t, density);
                    t.into_iter()
                        .map(|v| if v.magnitude() >= keep { v } else { L::ZERO })
                        .collect()
                })
                .collect();
            (0..n)
                .map(|j| {
                    let mut s = w[0] * trimmed[0][j];
                    for i in 1..xs.len() {
                        s = s + w[i] * trimmed[i][j];
                    }
                    let (mut num, mut den) = (L::ZERO, L::ZERO);
                    for i in 0..xs.len() {
                        let t = trimmed[i][j];
                        if (s > L::ZERO && t > L::ZERO) || (s < L::ZERO && t < L::ZERO) {
                            num = num + w[i] * t;
                            den = den + w[i];
                        }
                    }
                    let merged = if den == L::ZERO { L::ZERO } else { num / den };
                    base[j] + merged
                })
                .collect()
        }
    }
}

/// The k-th largest magnitude of `t`, `k = ⌈density · n⌉` (at least 1); entries of at least
/// this magnitude are kept. NaN magnitudes sort below every number.
fn threshold<L: Lane>(t: &[L], density: f64) -> L {
    if t.is_empty() {
        return L::ZERO;
    }
    let k = ((density * t.len() as f64).ceil() as usize).clamp(1, t.len());
    let mut m: Vec<L> = t.iter().map(|v| v.magnitude()).collect();
    // Largest first, NaN after every number.
    let order = |a: &L, b: &L| match (a.nan(), b.nan()) {
        (false, false) => b.partial_cmp(a).expect("numbers compare"),
        (x, y) => x.cmp(&y),
    };
    let (_, kth, _) = m.select_nth_unstable_by(k - 1, order);
    *kth
}

fn decode32(dtype: Dtype, bytes: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect(),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|c| f32::from_bits((u16::from_le_bytes([c[0], c[1]]) as u32) << 16))
            .collect(),
        Dtype::F16 => bytes
            .chunks_exact(2)
            .map(|c| scalar::f16_to_f32(u16::from_le_bytes([c[0], c[1]])))
            .collect(),
        other => unreachable!("merging computes on floats, not {other:?}"),
    }
}

fn encode32(dtype: Dtype, values: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
        Dtype::BF16 => values
            .iter()
            .flat_map(|&x| scalar::f32_to_bf16(x).to_le_bytes())
            .collect(),
        Dtype::F16 => values
            .iter()
            .flat_map(|&x| scalar::f32_to_f16(x).to_le_bytes())
            .collect(),
        other => unreachable!("merging computes on floats, not {other:?}"),
    }
}

fn decode64(bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(8)
        .map(|c| f64::from_le_bytes(c.try_into().expect("eight bytes")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        decode32(Dtype::F32, b)
    }

    #[test]
    fn linear_averages_with_normalized_weights() {
        let a = f32s(&[1.0, 2.0, -4.0]);
        let b = f32s(&[3.0, 2.0, 4.0]);
        let out = combine(Dtype::F32, &Strategy::Linear, &[1.0, 3.0], None, &[a, b]);
        assert_eq!(back(&out), vec![2.5, 2.0, 2.0]);
    }

    #[test]
    fn task_arithmetic_adds_task_vectors() {
        let base = f32s(&[1.0, 1.0]);
        let a = f32s(&[2.0, 1.0]);
        let b = f32s(&[1.0, 3.0]);
        let out = combine(
            Dtype::F32,
            &Strategy::TaskArithmetic,
            &[1.0, 0.5],
            Some(&base),
            &[a, b],
        );
        assert_eq!(back(&out), vec![2.0, 2.0]);
    }

    #[test]
    fn ties_trims_elects_and_averages_agreeing_entries() {
        let base = f32s(&[0.0; 4]);
        // Task vectors: a keeps its two largest (4, -3), b its two largest (2, 5).
        let a = f32s(&[4.0, -3.0, 0.5, 0.1]);
        let b = f32s(&[2.0, 1.0, 5.0, 0.2]);
        let out = combine(
            Dtype::F32,
            &Strategy::Ties { density: 0.5 },
            &[1.0, 1.0],
            Some(&base),
            &[a, b],
        );
        // Entry 0: both positive → (4 + 2) / 2; entry 1: only a's −3 kept; entry 2: b's 5;
        // entry 3: neither kept.
        assert_eq!(back(&out), vec![3.0, -3.0, 5.0, 0.0]);
    }

    #[test]
    fn half_precision_rounds_back_to_nearest_even() {
        // bf16 1.0 and the next value up (1 + 2^-7): their mean is a tie, rounded to even.
        let one = 0x3f80u16.to_le_bytes().to_vec();
        let next = 0x3f81u16.to_le_bytes().to_vec();
        let out = combine(
            Dtype::BF16,
            &Strategy::Linear,
            &[1.0, 1.0],
            None,
            &[one, next],
        );
        assert_eq!(out, 0x3f80u16.to_le_bytes());
    }

    #[test]
    fn bad_parameters_are_refused() {
        assert!(check(&Strategy::Linear, &[1.0, -1.0]).is_err());
        assert!(check(&Strategy::Linear, &[1.0, f64::NAN]).is_err());
        assert!(check(&Strategy::Ties { density: 0.0 }, &[1.0, 1.0]).is_err());
        assert!(check(&Strategy::Ties { density: 1.5 }, &[1.0, 1.0]).is_err());
        assert!(check(&Strategy::TaskArithmetic, &[1.0, -1.0]).is_ok());
        assert!(Strategy::parse("soup", 0.2).is_err());
    }
}
