//! `quant-residual`: a tensor as a reference tensor plus its uniformly quantized difference.
//!
//! For element `i` with value `x` and reference value `r` (the decoded content of the record's
//! base object, whatever its codec), the code is `q = round((x − r) / step)`; the decoder
//! rebuilds `round_dtype(r + q·step)` in `f64` arithmetic, which is exactly reproducible
//! ([`Mode::Linear`]; [`Mode::Log`] and [`Mode::Scaled`] code Adam's moments the same way). The
//! error of every element is therefore at most `step / 2` plus half a unit in the last place
//! of the result — it scales with how far the tensor moved from its reference, not with the
//! weights' magnitude, which is what a fine-tune (small residual from a pretrained base) or a
//! checkpoint after a lossy restore (small residual from the restored weights) needs.
//!
//! Codes are bytes: `zigzag(q)` for `|q| ≤ 126`, [`ZERO`] for +0, and [`EXACT`] for an element
//! kept exactly
//! (a non-finite value or reference, a residual beyond ±127 steps, or a result that does not
//! round back to a finite number); the exact values follow the step in element order. The code
//! bytes are one entropy stream ([`crate::huffman`]), whose sparse form takes the zero-heavy
//! code streams of tensors that barely moved. Layout: `docs/FORMAT.md`.
//!
//! Because the reference is decoded first and the residual is taken against that decoded
//! content, errors never accumulate along a chain: every object decodes to exactly what its
//! commit measured.

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use crate::huffman::{decode_stream, encode_stream, Histogram};
use crate::scalar;
use crate::tensor::{ErrorStats, Moments};
use crate::varint;

/// The code of an element stored exactly (its low byte, 255, in a one-byte payload).
pub const EXACT: u16 = 0xffff;
/// The code of an element that is +0 (254 in a one-byte payload).
pub const ZERO: u16 = 0xfffe;
/// Largest residual, in steps, that gets a code in linear mode (zigzag codes stay below
/// [`ZERO`]).
pub const MAX_STEPS: i64 = 32766;
/// The same in log and scaled modes (their codes fit one byte).
pub const MAX_MOMENT_STEPS: i64 = 126;
/// Codes below this fit a one-byte payload.
const NARROW: u16 = 254;

/// Elements per parallel work item, and per chunk of the statistics' sums.
pub const CHUNK: usize = 1 << 16;

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

/// Element `i` of the reference, `0` without one (`quant-uniform`).
#[inline(always)]
fn reference_value(dtype: Dtype, reference: Option<&[u8]>, i: usize) -> f64 {
    reference.map_or(0.0, |r| scalar::value(dtype, r, i))
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

/// How codes become values, given the reference value `r` of the element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Mode {
    /// `r + q·step`: a weight and its previous version.
    Linear = 0,
    /// `r · 2^(q·step)`: a positive tensor spanning decades (Adam's `exp_avg_sq`) and its
    /// previous version; the factors come from the stored `2^step` by repeated multiplication,
    /// so every machine computes the same values.
    Log = 1,
    /// `q · step · √r`: Adam's `exp_avg` in the optimizer's own units, against a second moment
    /// (its previous version), whose square root scales each element's step.
    Scaled = 2,
}

impl Mode {
    fn from_u8(b: u8) -> Option<Mode> {
        match b {
            0 => Some(Mode::Linear),
            1 => Some(Mode::Log),
            2 => Some(Mode::Scaled),
            _ => None,
        }
    }

    /// The name `mdl show` prints.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Linear => "linear",
            Mode::Log => "log",
            Mode::Scaled => "scaled",
        }
    }
}

/// Evaluates `$body` once for each [`Mode`] with `$m` bound to `$mode` as a constant, so the
/// quantizer's per-element `match` on its mode folds away (as [`scalar::for_dtype`] does for
/// the dtype).
macro_rules! for_mode {
    ($mode:expr, $m:ident => $body:expr) => {
        match $mode {
            Mode::Linear => {
                const $m: Mode = Mode::Linear;
                $body
            }
            Mode::Log => {
                const $m: Mode = Mode::Log;
                $body
            }
            Mode::Scaled => {
                const $m: Mode = Mode::Scaled;
                $body
            }
        }
    };
}

/// A mode and step, ready to code elements.
struct Quantizer {
    mode: Mode,
    /// `step` (Linear, Scaled) or `2^step` (Log): the value the payload stores.
    param: f64,
    /// `1 / param`: a code is chosen by multiplying with it (the decoder never divides).
    inverse: f64,
    /// Log: `2^(q·step)` for `q` = −[`MAX_MOMENT_STEPS`] … [`MAX_MOMENT_STEPS`].
    factors: Vec<f64>,
    /// Log: the ratios `x / r` at which the code steps up (see [`log_thresholds`]).
    thresholds: Vec<f64>,
}

impl Quantizer {
    /// From the value a payload stores (`None` when it cannot serve).
    fn new(mode: Mode, param: f64) -> Option<Quantizer> {
        if !(param.is_finite() && param > 0.0) || (mode == Mode::Log && param <= 1.0) {
            return None;
        }
        let mut factors = Vec::new();
        if mode == Mode::Log {
            let m = MAX_MOMENT_STEPS as usize;
            factors = vec![1.0; 2 * m + 1];
            for q in 1..=m {
                factors[m + q] = factors[m + q - 1] * param;
                factors[m - q] = factors[m - q + 1] / param;
            }
        }
        let thresholds = match mode {
            Mode::Log => log_thresholds(param, &factors),
            _ => Vec::new(),
        };
        Some(Quantizer {
            mode,
            param,
            inverse: 1.0 / param,
            factors,
            thresholds,
        })
    }

    /// For a step (in log2 units for [`Mode::Log`]).
    fn with_step(mode: Mode, step: f64) -> Option<Quantizer> {
        match mode {
            Mode::Log => Quantizer::new(mode, step.exp2()),
            _ => Quantizer::new(mode, step),
        }
    }

    /// One element's code and reconstruction (`None`: kept exactly). `mode` is the quantizer's
    /// own: callers pass it (and `dtype`) as constants, see [`for_mode`].
    #[inline(always)]
    fn code(&self, mode: Mode, dtype: Dtype, x: f64, r: f64) -> Option<(u16, f64)> {
        debug_assert_eq!(mode, self.mode);
        if !x.is_finite() || !r.is_finite() {
            return None;
        }
        let q = match mode {
            Mode::Linear => round((x - r) * self.inverse),
            Mode::Log => {
                if x == 0.0 {
                    return Some((ZERO, 0.0));
                }
                if x < 0.0 || r <= 0.0 {
                    return None;
                }
                log_code(x / r, self.param.log2(), &self.thresholds)
            }
            Mode::Scaled => {
                if r < 0.0 {
                    return None;
                }
                if x == 0.0 {
                    // Code 0 rebuilds +0 here: the entropy coder's sparse form takes runs of it.
                    return Some((0, 0.0));
                }
                if r == 0.0 {
                    return None;
                }
                round(x / (self.param * r.sqrt()))
            }
        };
        let max = match mode {
            Mode::Linear => MAX_STEPS,
            _ => MAX_MOMENT_STEPS,
        };
        if q.is_nan() || q.abs() > max as f64 {
            return None;
        }
        let c = zigzag(q as i64);
        let y = scalar::rounded(dtype, self.value(mode, r, c));
        y.is_finite().then_some((c, y))
    }

    /// The decoder's value for reference `r` and a code other than [`EXACT`], before it is
    /// rounded to the dtype.
    #[inline(always)]
    fn value(&self, mode: Mode, r: f64, c: u16) -> f64 {
        if c == ZERO {
            return 0.0;
        }
        let q = unzigzag(c);
        match mode {
            Mode::Linear => r + q as f64 * self.param,
            Mode::Log => r * self.factors[(q + MAX_MOMENT_STEPS) as usize],
            Mode::Scaled => q as f64 * self.param * r.sqrt(),
        }
    }
}

/// The ratios at which a log-mode code steps up: entry `j` is `2^((j − 127 + ½)·step)`, for
/// `j` = 0 … 253, each one product of a factor (`2^(q·step)`, built by multiplication) and
/// `√(2^step)`. Correctly rounded operations only, so every engine (the GPU's included) builds
/// the same table from the stored `2^step`.
fn log_thresholds(param: f64, factors: &[f64]) -> Vec<f64> {
    let half = param.sqrt();
    let below = factors[0] / param;
    std::iter::once(below)
        .chain(factors.iter().copied())
        .map(|f| f * half)
        .collect()
}

/// The log-mode step count of a ratio `x / r`: −127 plus how many thresholds it reaches, so
/// ±127 (beyond [`MAX_MOMENT_STEPS`]) mean "keep exactly". The logarithm only guesses; the
/// comparisons with the table decide, so the code does not depend on a `log2` that differs
/// between machines in its last bits.
#[inline(always)]
fn log_code(ratio: f64, log_param: f64, thresholds: &[f64]) -> f64 {
    let top = MAX_MOMENT_STEPS + 1;
    let guess = round(ratio.log2() / log_param);
    let mut q = if guess.is_nan() {
        0
    } else {
        guess.clamp(-top as f64, top as f64) as i64
    };
    let t = |q: i64| thresholds[(q + top) as usize];
    while q > -top && ratio < t(q - 1) {
        q -= 1;
    }
    while q < top && ratio >= t(q) {
        q += 1;
    }
    q as f64
}

/// `t` rounded half away from zero, as `f64::round` does, without its library call on the
/// baseline x86-64 target (this is the search's innermost operation).
#[inline(always)]
fn round(t: f64) -> f64 {
    let a = t.abs();
    // Beyond 2^52 (and for NaN) every value is already whole.
    if a.is_nan() || a >= 4_503_599_627_370_496.0 {
        return t.round();
    }
    // Signed conversions: one instruction each way on x86-64 (`a` is below 2^52 here), where
    // unsigned ones take a sequence.
    let whole = a as i64 as f64;
    // Exact: `a − whole` is the fraction, representable below 2^52. Without a branch: which
    // way a residual rounds is a coin toss the predictor cannot learn.
    let up = f64::from(u8::from(a - whole >= 0.5));
    (whole + up).copysign(t)
}

#[inline]
fn zigzag(q: i64) -> u16 {
    ((q << 1) ^ (q >> 63)) as u16
}

#[inline]
fn unzigzag(c: u16) -> i64 {
    let c = c as i64;
    (c >> 1) ^ -(c & 1)
}

/// Whether `step` can serve as a quantization step of `mode`.
pub fn valid_step(mode: Mode, step: f64) -> bool {
    Quantizer::with_step(mode, step).is_some()
}

/// A payload's mode and step (in log2 units for [`Mode::Log`]), as [`encode`] took them.
pub fn mode_and_step(payload: &[u8]) -> Result<(Mode, f64), FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    let mode = payload
        .first()
        .and_then(|&b| Mode::from_u8(b))
        .ok_or_else(|| bad("unknown or missing mode"))?;
    let param = f64::from_le_bytes(
        payload
            .get(1..9)
            .ok_or_else(|| bad("truncated step"))?
            .try_into()
            .unwrap(),
    );
    let quant = Quantizer::new(mode, param).ok_or_else(|| bad("step out of range"))?;
    Ok(match mode {
        Mode::Log => (mode, quant.param.log2()),
        _ => (mode, quant.param),
    })
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
                    let chunk = Chunk { values, reference, moments: moments.as_ref(), elements };
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
    let end = chunk.elements.end;
    for start in chunk.elements.step_by(BLOCK * every) {
        let len = BLOCK.min(end - start);
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
                match quant.code(mode, dtype, x[k], r[k]) {
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

/// Quantizes `values` against `reference` (`None`: zeros, a `quant-uniform` payload, linear
/// mode only) at `step` (see [`Mode`]): the payload and the reconstruction.
pub fn encode(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    mode: Mode,
    step: f64,
) -> (Vec<u8>, Vec<u8>) {
    assert!(
        reference.is_some() || mode == Mode::Linear,
        "uniform payloads are linear"
    );
    let quant = Quantizer::with_step(mode, step).expect("a valid residual step");
    let size = dtype.size();
    let n = values.len() / size;
    let mut codes = vec![0u16; n];
    let mut render = vec![0u8; values.len()];
    codes
        .par_chunks_mut(CHUNK)
        .zip(render.par_chunks_mut(CHUNK * size))
        .enumerate()
        .for_each(|(c, (codes, out))| {
            let first = c * CHUNK;
            // One loop per dtype and mode, as in `measure_steps`.
            scalar::for_dtype!(dtype, D => for_mode!(mode, M => {
                let size = D.size();
                let at = first * size..(first + codes.len()) * size;
                let values = &values[at.clone()];
                let reference = reference.map(|r| &r[at]);
                let elements = codes.iter_mut().zip(out.chunks_exact_mut(size));
                for (k, (code, o)) in elements.enumerate() {
                    let x = scalar::value(D, values, k);
                    let r = reference_value(D, reference, k);
                    match quant.code(M, D, x, r) {
                        Some((q, y)) => {
                            *code = q;
                            scalar::put_rounded(D, y, o);
                        }
                        None => {
                            *code = EXACT;
                            o.copy_from_slice(&values[k * size..(k + 1) * size]);
                        }
                    }
                }
            }))
        });
    let exact: Vec<usize> = (0..n).filter(|&i| codes[i] == EXACT).collect();
    let mut exact_values = Vec::with_capacity(exact.len() * size);
    for &i in &exact {
        exact_values.extend_from_slice(&values[i * size..(i + 1) * size]);
    }
    let streams: Vec<Vec<u8>> = planes(&codes)
        .iter()
        .map(|plane| {
            let mut stream = Vec::new();
            encode_stream(plane, &mut stream);
            stream
        })
        .collect();
    let payload = assemble(
        mode,
        quant.param,
        exact.len() as u64,
        &exact_values,
        &streams,
    );
    (payload, render)
}

/// A payload from its parts (`docs/FORMAT.md`): the mode, the stored parameter (the step, or
/// `2^step` in log mode), the exact elements' count and bytes, and one entropy stream per code
/// plane (the low bytes, then the high bytes when the codes need them).
pub fn assemble(
    mode: Mode,
    param: f64,
    exact: u64,
    exact_values: &[u8],
    streams: &[Vec<u8>],
) -> Vec<u8> {
    let mut payload = vec![mode as u8];
    payload.extend_from_slice(&param.to_le_bytes());
    varint::put(&mut payload, exact);
    payload.extend_from_slice(exact_values);
    match streams {
        [low] => {
            payload.push(1);
            payload.extend_from_slice(low);
        }
        [low, high] => {
            payload.push(2);
            varint::put(&mut payload, low.len() as u64);
            payload.extend_from_slice(low);
            payload.extend_from_slice(high);
        }
        _ => unreachable!("one or two planes"),
    }
    payload
}

/// Doubles in [`device_quantizer`]'s table.
pub const DEVICE_QUANTIZER: usize = 510;

/// The quantizer of `mode` at `step` as a device kernel takes it (`None`: not a valid step):
/// the stored parameter, its inverse, its `log2` (a guess's divisor only), then in log mode
/// the factors `2^(q·step)` for `q` = −126 … 126 and the thresholds of [`log_code`], zeros
/// after. Built here, so the device computes with the very table the CPU does.
pub fn device_quantizer(mode: Mode, step: f64) -> Option<Vec<f64>> {
    let quant = Quantizer::with_step(mode, step)?;
    let mut table = vec![quant.param, quant.inverse, quant.param.log2()];
    table.extend_from_slice(&quant.factors);
    table.extend_from_slice(&quant.thresholds);
    table.resize(DEVICE_QUANTIZER, 0.0);
    Some(table)
}

/// Decodes a payload into `out`: a `quant-residual` one against `reference` (the base's decoded
/// content), a `quant-uniform` one (linear mode) without.
pub fn decode(
    dtype: Dtype,
    payload: &[u8],
    reference: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    let size = dtype.size();
    if !scalar::lossy_supported(dtype) {
        return Err(bad("not a bf16, f16 or f32 tensor"));
    }
    if reference.is_some_and(|r| r.len() != out.len()) || !out.len().is_multiple_of(size) {
        return Err(bad("reference and output sizes differ"));
    }
    let n = out.len() / size;
    let (mode, _) = mode_and_step(payload)?;
    if reference.is_none() && mode != Mode::Linear {
        return Err(bad("a payload without a reference must be linear"));
    }
    let param = f64::from_le_bytes(payload[1..9].try_into().unwrap());
    let quant = Quantizer::new(mode, param).ok_or_else(|| bad("step out of range"))?;
    let mut at = 9;
    let count = varint::read(payload, &mut at).ok_or_else(|| bad("truncated exact count"))?;
    if count > n as u64 {
        return Err(bad("more exact elements than elements"));
    }
    let exact_len = count as usize * size;
    let exact = payload
        .get(at..at + exact_len)
        .ok_or_else(|| bad("truncated exact values"))?;
    at += exact_len;
    let width = *payload.get(at).ok_or_else(|| bad("truncated code width"))?;
    at += 1;
    let mut low = vec![0u8; n];
    let high: Option<Vec<u8>> = match width {
        1 => {
            decode_stream(&payload[at..], &mut low)?;
            None
        }
        2 => {
            let len = varint::read(payload, &mut at).ok_or_else(|| bad("truncated code stream"))?;
            let end = at
                .checked_add(usize::try_from(len).map_err(|_| bad("code stream too long"))?)
                .filter(|&e| e <= payload.len())
                .ok_or_else(|| bad("truncated code stream"))?;
            decode_stream(&payload[at..end], &mut low)?;
            let mut high = vec![0u8; n];
            decode_stream(&payload[end..], &mut high)?;
            Some(high)
        }
        _ => return Err(bad("unknown code width")),
    };
    let high = high.as_deref();
    // Chunk `c`'s codes, as their byte planes.
    let planes_of = |c: usize| {
        let range = c * CHUNK..((c + 1) * CHUNK).min(n);
        Planes {
            low: &low[range.clone()],
            high: high.map(|h| &h[range]),
        }
    };
    // One look at every code: each chunk's exact elements, and whether a moment code is beyond
    // its mode's range.
    let moment = mode != Mode::Linear;
    let scans: Vec<(usize, bool)> = (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let codes = planes_of(c).codes();
            let exact = codes.iter().filter(|&&c| c == EXACT).count();
            let wide = moment
                && codes
                    .iter()
                    .any(|&c| c < ZERO && unzigzag(c).abs() > MAX_MOMENT_STEPS);
            (exact, wide)
        })
        .collect();
    if scans.iter().any(|&(_, wide)| wide) {
        return Err(bad("a code is beyond the mode's range"));
    }
    if scans.iter().map(|&(e, _)| e as u64).sum::<u64>() != count {
        return Err(bad("exact codes and exact values disagree"));
    }
    // Each chunk's first exact value: the exact values are stored in element order.
    let firsts: Vec<usize> = scans
        .iter()
        .scan(0, |k, &(exact, _)| {
            let first = *k;
            *k += exact;
            Some(first)
        })
        .collect();
    out.par_chunks_mut(CHUNK * size)
        .zip(firsts)
        .enumerate()
        .for_each(|(chunk, (out, k))| {
            let codes = planes_of(chunk).codes();
            let at = chunk * CHUNK * size;
            let reference = reference.map(|r| &r[at..at + out.len()]);
            let exact = &exact[k * size..];
            // One loop per dtype and mode, as in `measure_steps`.
            scalar::for_dtype!(dtype, D => for_mode!(mode, M => {
                rebuild(D, M, &quant, out, &codes, reference, exact)
            }))
        });
    Ok(())
}

/// Writes one chunk of [`decode`]'s output: each element from its code and its reference value
/// ([`Quantizer::value`], rounded to `dtype`), or the next of `exact` for [`EXACT`]. Inlined
/// into each caller with a constant dtype and mode.
#[inline(always)]
fn rebuild(
    dtype: Dtype,
    mode: Mode,
    quant: &Quantizer,
    out: &mut [u8],
    codes: &[u16],
    reference: Option<&[u8]>,
    exact: &[u8],
) {
    let size = dtype.size();
    let mut exact = exact.chunks_exact(size);
    for (j, (&c, o)) in codes.iter().zip(out.chunks_exact_mut(size)).enumerate() {
        if c == EXACT {
            o.copy_from_slice(exact.next().expect("counted exact values"));
            continue;
        }
        let r = reference_value(dtype, reference, j);
        scalar::put_rounded(dtype, quant.value(mode, r, c), o);
    }
}

/// Codes as a payload stores them: the low bytes, and the high bytes when the payload has two
/// planes (see [`planes`]).
#[derive(Clone, Copy)]
struct Planes<'a> {
    low: &'a [u8],
    high: Option<&'a [u8]>,
}

impl Planes<'_> {
    /// The codes, in element order (one plain loop a plane width, which the compiler vectorizes).
    fn codes(self) -> Vec<u16> {
        match self.high {
            // 254 and 255 stand for ZERO and EXACT.
            None => self
                .low
                .iter()
                .map(|&l| match l as u16 {
                    l if l >= NARROW => 0xff00 | l,
                    l => l,
                })
                .collect(),
            Some(high) => self
                .low
                .iter()
                .zip(high)
                .map(|(&l, &h)| l as u16 | (h as u16) << 8)
                .collect(),
        }
    }
}

/// The codes as byte planes: one plane (the low bytes, with [`ZERO`] and [`EXACT`] as 254 and
/// 255) when every other code is below 254, else the low and the high bytes of every code.
fn planes(codes: &[u16]) -> Vec<Vec<u8>> {
    let narrow = codes.iter().all(|&c| !(NARROW..ZERO).contains(&c));
    let low = codes.iter().map(|&c| c as u8).collect();
    if narrow {
        return vec![low];
    }
    vec![low, codes.iter().map(|&c| (c >> 8) as u8).collect()]
}

#[cfg(test)]
mod golden;
#[cfg(test)]
mod tests;
