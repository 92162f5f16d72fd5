//! The sums the kernels take, the same whatever the engine or the thread count: key sums in
//! fixed point (integer addition is associative), error sums a chunk at a time, the chunks'
//! sums added in chunk order.

use rayon::prelude::*;

use super::{FloatView, Moments, CHUNK};

/// Per-key sums kept by [`KeyStats`], in this order.
pub mod sum {
    /// Σ w
    pub const W: usize = 0;
    /// Σ w²
    pub const W2: usize = 1;
    /// Σ m
    pub const M: usize = 2;
    /// Σ m·w
    pub const MW: usize = 3;
    /// Σ v
    pub const V: usize = 4;
    /// Σ v·w
    pub const VW: usize = 5;
    /// Σ v·w²
    pub const VW2: usize = 6;
    /// Σ |m·w| (sensitivity)
    pub const SENS: usize = 7;
    /// How many sums there are.
    pub const N: usize = 8;
}

/// A tensor's histogram over 16-bit keys, with per-key sums of the quantities the quantizer and
/// the quality estimate need (see [`sum`]). Non-finite elements are counted but add nothing to
/// the sums. The moment sums are zero without moments.
#[derive(Clone, Debug, PartialEq)]
pub struct KeyStats {
    /// Elements.
    pub n: u64,
    /// The keys that occur, ascending; the other fields are indexed like this list.
    pub keys: Vec<u16>,
    /// Elements per key.
    pub count: Vec<u64>,
    /// Sums per key.
    pub sums: Vec<[f64; sum::N]>,
    /// Whether moments were given.
    pub moments: bool,
    /// The sum of the second moment over all keys, as [`mean_second_moment`] takes it.
    pub v_total: f64,
}

impl KeyStats {
    /// The stats from per-key counts and fixed-point sums (taken with [`scales`]), given for
    /// the keys that occur, ascending: each sum is divided by its scale. Both engines end here,
    /// so the conversion is one.
    pub fn from_fixed_point(
        n: u64,
        entries: impl IntoIterator<Item = (u16, u64, [i64; sum::N])>,
        sc: &[f64; sum::N],
        moments: bool,
    ) -> KeyStats {
        let mut stats = KeyStats {
            n,
            keys: Vec::new(),
            count: Vec::new(),
            sums: Vec::new(),
            moments,
            v_total: 0.0,
        };
        let mut v_total = 0i64;
        for (k, c, a) in entries {
            v_total = v_total.wrapping_add(a[sum::V]);
            stats.keys.push(k);
            stats.count.push(c);
            stats
                .sums
                .push(std::array::from_fn(|j| a[j] as f64 / sc[j]));
        }
        stats.v_total = v_total as f64 / sc[sum::V];
        stats
    }

    /// The mean second moment over all elements (0 without moments): the loss estimate's
    /// curvature, equal to [`mean_second_moment`]'s.
    pub fn mean_v(&self) -> f64 {
        if !self.moments || self.n == 0 {
            return 0.0;
        }
        self.v_total / self.n as f64
    }
}

/// [`KeyStats::mean_v`] without the rest of the stats (what a residual search needs of them):
/// the second moment summed in the same fixed point over the elements where the weight and
/// both moments are finite, so the two agree to the bit whatever the order of the sums.
pub fn mean_second_moment(w: FloatView<'_>, moments: Moments<'_>) -> f64 {
    let n = w.len();
    if n == 0 {
        return 0.0;
    }
    let sc = scales(n, 0.0, 0.0, max_abs(moments.v))[sum::V];
    let total = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut t = 0i64;
            for i in c * CHUNK..((c + 1) * CHUNK).min(n) {
                let (x, m, v) = (w.value(i), moments.m.value(i), moments.v.value(i));
                if x.is_finite() && m.is_finite() && v.is_finite() {
                    t = t.wrapping_add((v * sc) as i64);
                }
            }
            t
        })
        .reduce(|| 0, i64::wrapping_add);
    total as f64 / sc / n as f64
}

/// Fixed-point scales for the key sums (every engine uses these, from the exact maxima): each term is multiplied by a power of two chosen so that
/// no sum over `n` terms can overflow an `i64`, then truncated; the integer sums are exact and
/// independent of order.
pub fn scales(n: usize, wmax: f64, mmax: f64, vmax: f64) -> [f64; sum::N] {
    let limit = 2f64.powi(62) / n.max(1) as f64;
    let scale = |bound: f64| {
        if bound > 0.0 && bound.is_finite() {
            2f64.powi((limit / bound).log2().floor() as i32)
        } else {
            1.0
        }
    };
    let mut s = [0.0; sum::N];
    s[sum::W] = scale(wmax);
    s[sum::W2] = scale(wmax * wmax);
    s[sum::M] = scale(mmax);
    s[sum::MW] = scale(mmax * wmax);
    s[sum::V] = scale(vmax);
    s[sum::VW] = scale(vmax * wmax);
    s[sum::VW2] = scale(vmax * wmax * wmax);
    s[sum::SENS] = scale(mmax * wmax);
    s
}

/// Largest finite |value| of a view (exact: max does not depend on order).
pub(super) fn max_abs(v: FloatView<'_>) -> f64 {
    (0..v.len())
        .into_par_iter()
        .with_min_len(CHUNK)
        .map(|i| v.value(i).abs())
        .filter(|x| x.is_finite())
        .reduce(|| 0.0, f64::max)
}
