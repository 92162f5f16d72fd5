//! What quantizing a tensor at some steps would give, without storing anything: code counts
//! and error sums ([`ResidualStats`]), in one fixed summation order ([`LANES`] per block of
//! [`BLOCK`] elements, blocks then chunks in order) that every engine reproduces, and how far a
//! tensor moved from its reference ([`distance_sq`]).

use mdl_format::Dtype;
use rayon::prelude::*;

use super::quantizer::{for_mode, Mode, Quantizer};
use super::steps::Gains;
use super::{reference_value, Steps, CHUNK, EXACT, ZERO};
use crate::huffman::Histogram;
use crate::scalar;
use crate::tensor::{ErrorStats, Moments};

/// What quantizing a tensor against a reference at one step gives, without storing anything.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ResidualStats {
    /// Counts of each code's low byte.
    pub codes: Histogram,
    /// Counts of each code's high byte (specials count as 0: they need no second byte).
    pub high: Histogram,
    /// Elements kept exactly.
    pub exact: u64,
    /// The reconstruction's error (and, with moments, the loss estimate's sums).
    pub err: ErrorStats,
}

impl ResidualStats {
    /// Estimated payload bits: the codes' order-0 entropy (the entropy coder gets within a few
    /// per cent of it) plus the exact values and the step.
    pub fn bits(&self, dtype: Dtype) -> f64 {
        self.codes.entropy_bits()
            + self.high.entropy_bits()
            + (self.exact as f64) * (dtype.size() * 8) as f64
            + 136.0
    }

    /// Statistics measured on a sample, scaled by `factor` to stand for the whole tensor (the
    /// largest error stays the sample's).
    pub fn scaled(mut self, factor: f64) -> ResidualStats {
        let scale = |c: &mut u64| *c = (*c as f64 * factor).round() as u64;
        self.codes.0.iter_mut().for_each(scale);
        self.high.0.iter_mut().for_each(scale);
        scale(&mut self.exact);
        let e = &mut self.err;
        for x in [
            &mut e.sum_sq,
            &mut e.sum_sq_err,
            &mut e.sum_m_delta,
            &mut e.sum_v_delta2,
        ] {
            *x *= factor;
        }
        self
    }

    fn merge(mut self, o: ResidualStats) -> ResidualStats {
        self.codes.add(&o.codes);
        self.high.add(&o.high);
        self.exact += o.exact;
        self.err = ErrorStats::fold(&[self.err, o.err]);
        self
    }
}

/// Lanes a block's sums are kept in: element `k` of a block adds to lane `k mod 32`, each lane
/// in element order, and [`lane_sum`] joins them. A block's sums are then the same bits
/// whether one CPU thread or a warp of 32 GPU threads (one lane each) computed them.
pub const LANES: usize = 32;

/// The sum of a block's lanes, the upper half folded onto the lower until one is left: the
/// order a warp's butterfly reduction adds in.
#[inline(always)]
pub fn lane_sum(mut lanes: [f64; LANES]) -> f64 {
    let mut half = LANES / 2;
    while half > 0 {
        for j in 0..half {
            lanes[j] += lanes[j + half];
        }
        half /= 2;
    }
    lanes[0]
}

/// `Σ (a − b)²` over the elements where both are finite (`b` absent: zeros) — how far a tensor
/// moved from its reference. Summed in [`LANES`] per block of [`BLOCK`] elements, the blocks of
/// each chunk of [`CHUNK`] in order ([`distance_of_chunks`] adds the chunks' sums): the same
/// on every machine and every engine.
pub fn distance_sq(dtype: Dtype, a: &[u8], b: Option<&[u8]>) -> f64 {
    let n = a.len() / dtype.size();
    let chunks: Vec<f64> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let end = ((c + 1) * CHUNK).min(n);
            let mut sum = 0.0;
            for start in (c * CHUNK..end).step_by(BLOCK) {
                let mut lanes = [0f64; LANES];
                for i in start..(start + BLOCK).min(end) {
                    let d = scalar::value(dtype, a, i) - reference_value(dtype, b, i);
                    if d.is_finite() {
                        lanes[i % LANES] += d * d;
                    }
                }
                sum += lane_sum(lanes);
            }
            sum
        })
        .collect();
    distance_of_chunks(&chunks)
}

/// [`distance_sq`] from its chunks' sums, added in chunk order.
pub fn distance_of_chunks(chunks: &[f64]) -> f64 {
    chunks.iter().fold(0.0, |a, &c| a + c)
}

/// The statistics of quantizing `values` (little-endian `dtype`) against `reference` (`None`:
/// zeros) at `step`, in one parallel pass; with the values' Adam moments, also the sums the
/// loss estimate needs.
pub fn measure(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
    mode: Mode,
    step: f64,
) -> ResidualStats {
    let mut all = measure_steps(dtype, values, reference, moments, mode, &[step], 1);
    all.pop().unwrap_or_default()
}

/// Elements [`measure_steps`] reads at a time, before trying every step on them.
pub const BLOCK: usize = 1024;

/// [`measure`] at each of `steps` (an invalid step gets empty statistics), in one pass over the
/// tensor: each block of [`BLOCK`] elements is read once and then coded at every step. With
/// `every` above 1, only every `every`-th block is measured (a sample: scale it with
/// [`ResidualStats::scaled`]).
pub fn measure_steps(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
    mode: Mode,
    steps: &[f64],
    every: usize,
) -> Vec<ResidualStats> {
    measure_with(dtype, values, reference, moments, mode, steps, every, None)
}

/// [`measure_steps`] in linear mode with `factors`' step factors: what
/// [`super::encode_stepped`] would give at each of `steps` (the statistics count the codes
/// only, not the factors' few bytes).
pub fn measure_stepped(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
    factors: &Steps,
    steps: &[f64],
    every: usize,
) -> Vec<ResidualStats> {
    let gains = factors.gains_for(dtype, values.len());
    let linear = Mode::Linear;
    measure_with(
        dtype,
        values,
        reference,
        moments,
        linear,
        steps,
        every,
        Some(&gains),
    )
}

#[allow(clippy::too_many_arguments)]
fn measure_with(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    moments: Option<Moments<'_>>,
    mode: Mode,
    steps: &[f64],
    every: usize,
    gains: Option<&Gains>,
) -> Vec<ResidualStats> {
    let every = every.max(1);
    let quants: Vec<Option<Quantizer>> = steps
        .iter()
        .map(|&s| Quantizer::with_step(mode, s))
        .collect();
    let n = values.len() / dtype.size();
    let empty = || vec![ResidualStats::default(); steps.len()];
    // Counts add up in any order. The error sums have one order, whatever the thread count or
    // the engine: each measured block's in `LANES`, a chunk's blocks added in order
    // (`measure_chunk`), the chunks folded in order (`ErrorStats::fold`, as the engines' error
    // statistics are). Each of at most `TASKS` parallel tasks measures a run of chunks.
    const TASKS: usize = 64;
    let chunks = n.div_ceil(CHUNK);
    let per_task = chunks.div_ceil(TASKS).max(1);
    let tasks: Vec<(Vec<ResidualStats>, Vec<Vec<ErrorStats>>)> = (0..chunks.div_ceil(per_task))
        .into_par_iter()
        .map(|t| {
            let mut total = empty();
            let mut errs = vec![Vec::new(); steps.len()];
            for c in t * per_task..((t + 1) * per_task).min(chunks) {
                let mut stats = empty();
                let elements = c * CHUNK..((c + 1) * CHUNK).min(n);
                scalar::for_dtype!(dtype, D => for_mode!(mode, M => {
                    let chunk = Chunk {
                        values,
                        reference,
                        moments: moments.as_ref(),
                        gains,
                        elements,
                    };
                    measure_chunk(D, M, chunk, &quants, every, &mut stats)
                }));
                for ((sum, s), e) in total.iter_mut().zip(stats).zip(&mut errs) {
                    e.push(s.err);
                    *sum = std::mem::take(sum).merge(s);
                }
            }
            (total, errs)
        })
        .collect();
    let mut out = empty();
    let mut errs = vec![Vec::new(); steps.len()];
    for (total, task_errs) in tasks {
        for ((o, t), (all, part)) in out
            .iter_mut()
            .zip(total)
            .zip(errs.iter_mut().zip(task_errs))
        {
            *o = std::mem::take(o).merge(t);
            all.extend(part);
        }
    }
    for (o, e) in out.iter_mut().zip(&errs) {
        o.err = ErrorStats::fold(e);
    }
    out
}

/// The inputs of one parallel work item of [`measure_steps`].
struct Chunk<'a> {
    values: &'a [u8],
    reference: Option<&'a [u8]>,
    moments: Option<&'a Moments<'a>>,
    /// Each element's step factor, in a stepped measure.
    gains: Option<&'a Gains>,
    /// The chunk's elements.
    elements: std::ops::Range<usize>,
}

/// [`measure_steps`] on one chunk, adding to `stats` (one entry a quantizer). Inlined into
/// each caller with a constant dtype and mode.
#[inline(always)]
fn measure_chunk(
    dtype: Dtype,
    mode: Mode,
    chunk: Chunk<'_>,
    quants: &[Option<Quantizer>],
    every: usize,
    stats: &mut [ResidualStats],
) {
    let mut x = [0f64; BLOCK];
    let mut r = [0f64; BLOCK];
    let mut m = [0f64; BLOCK];
    let mut v = [0f64; BLOCK];
    // Each element's step factor and its inverse: 1 without factors.
    let mut g = [1f64; BLOCK];
    let mut ig = [1f64; BLOCK];
    let end = chunk.elements.end;
    for start in chunk.elements.step_by(BLOCK * every) {
        let len = BLOCK.min(end - start);
        if let Some(gains) = chunk.gains {
            gains.fill(start, &mut g[..len]);
            for k in 0..len {
                ig[k] = 1.0 / g[k];
            }
        }
        for k in 0..len {
            x[k] = scalar::value(dtype, chunk.values, start + k);
            r[k] = reference_value(dtype, chunk.reference, start + k);
            if let Some(mv) = chunk.moments {
                m[k] = scalar::value(mv.m.dtype, mv.m.bytes, start + k);
                v[k] = scalar::value(mv.v.dtype, mv.v.bytes, start + k);
            }
        }
        let mut sq = [0f64; LANES];
        for k in 0..len {
            if x[k].is_finite() {
                sq[k % LANES] += x[k] * x[k];
            }
        }
        let sum_sq = lane_sum(sq);
        for (s, quant) in stats.iter_mut().zip(quants) {
            let Some(quant) = quant else { continue };
            // The block's sums in lanes (see `LANES`): independent chains the processor runs
            // side by side.
            let mut sq_err = [0f64; LANES];
            let mut m_delta = [0f64; LANES];
            let mut v_delta2 = [0f64; LANES];
            let mut max_abs = 0f64;
            for k in 0..len {
                match quant.code(mode, dtype, x[k], r[k], (g[k], ig[k])) {
                    Some((code, y)) => {
                        s.codes.0[code as u8 as usize] += 1;
                        // High bytes of 0 are counted once, at the end.
                        if (256..ZERO).contains(&code) {
                            s.high.0[(code >> 8) as usize] += 1;
                        }
                        let d = y - x[k];
                        let lane = k % LANES;
                        sq_err[lane] += d * d;
                        max_abs = max_abs.max(d.abs());
                        if chunk.moments.is_some() {
                            m_delta[lane] += m[k] * d;
                            v_delta2[lane] += v[k] * d * d;
                        }
                    }
                    None => {
                        s.codes.0[EXACT as u8 as usize] += 1;
                        s.exact += 1;
                    }
                }
            }
            let e = &mut s.err;
            e.sum_sq += sum_sq;
            e.sum_sq_err += lane_sum(sq_err);
            e.max_abs = e.max_abs.max(max_abs);
            if chunk.moments.is_some() {
                e.sum_m_delta += lane_sum(m_delta);
                e.sum_v_delta2 += lane_sum(v_delta2);
            }
        }
    }
    // Every element measured has one low byte and one high byte: those not counted above are 0
    // (one hot counter less in the loop).
    for s in stats.iter_mut() {
        let wide: u64 = s.high.0[1..].iter().sum();
        s.high.0[0] = s.codes.total() - wide;
    }
}
