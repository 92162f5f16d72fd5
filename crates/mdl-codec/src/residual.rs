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

use crate::engine::{ErrorStats, Moments};
use crate::huffman::{decode_stream, encode_stream, Histogram};
use crate::qrecord::varint;
use crate::scalar;

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

/// Elements per parallel work item.
const CHUNK: usize = 1 << 16;

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
#[inline]
fn reference_value(dtype: Dtype, reference: Option<&[u8]>, i: usize) -> f64 {
    reference.map_or(0.0, |r| scalar::value(dtype, r, i))
}

/// `Σ (a − b)²` over the elements where both are finite (`b` absent: zeros) — how far a tensor
/// moved from its reference.
pub fn distance_sq(dtype: Dtype, a: &[u8], b: Option<&[u8]>) -> f64 {
    let n = a.len() / dtype.size();
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            (c * CHUNK..((c + 1) * CHUNK).min(n))
                .map(|i| scalar::value(dtype, a, i) - reference_value(dtype, b, i))
                .filter(|d| d.is_finite())
                .map(|d| d * d)
                .sum::<f64>()
        })
        .sum()
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

/// A mode and step, ready to code elements.
struct Quantizer {
    mode: Mode,
    /// `step` (Linear, Scaled) or `2^step` (Log): the value the payload stores.
    param: f64,
    /// `1 / param`: a code is chosen by multiplying with it (the decoder never divides).
    inverse: f64,
    /// Log: `2^(q·step)` for `q` = −[`MAX_MOMENT_STEPS`] … [`MAX_MOMENT_STEPS`].
    factors: Vec<f64>,
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
        Some(Quantizer {
            mode,
            param,
            inverse: 1.0 / param,
            factors,
        })
    }

    /// For a step (in log2 units for [`Mode::Log`]).
    fn with_step(mode: Mode, step: f64) -> Option<Quantizer> {
        match mode {
            Mode::Log => Quantizer::new(mode, step.exp2()),
            _ => Quantizer::new(mode, step),
        }
    }

    /// One element's code and reconstruction (`None`: kept exactly).
    #[inline(always)]
    fn code(&self, dtype: Dtype, x: f64, r: f64) -> Option<(u16, f64)> {
        if !x.is_finite() || !r.is_finite() {
            return None;
        }
        let q = match self.mode {
            Mode::Linear => round((x - r) * self.inverse),
            Mode::Log => {
                if x == 0.0 {
                    return Some((ZERO, 0.0));
                }
                if x < 0.0 || r <= 0.0 {
                    return None;
                }
                round((x / r).log2() / self.param.log2())
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
        let max = match self.mode {
            Mode::Linear => MAX_STEPS,
            _ => MAX_MOMENT_STEPS,
        };
        if q.is_nan() || q.abs() > max as f64 {
            return None;
        }
        let c = zigzag(q as i64);
        let y = self.rebuild(dtype, r, c);
        y.is_finite().then_some((c, y))
    }

    /// The decoder's value for reference `r` and a code other than [`EXACT`].
    #[inline(always)]
    fn rebuild(&self, dtype: Dtype, r: f64, c: u16) -> f64 {
        scalar::rounded(dtype, self.value(r, c))
    }

    /// [`Quantizer::rebuild`] before it is rounded to the dtype.
    #[inline(always)]
    fn value(&self, r: f64, c: u16) -> f64 {
        if c == ZERO {
            return 0.0;
        }
        let q = unzigzag(c);
        match self.mode {
            Mode::Linear => r + q as f64 * self.param,
            Mode::Log => r * self.factors[(q + MAX_MOMENT_STEPS) as usize],
            Mode::Scaled => q as f64 * self.param * r.sqrt(),
        }
    }
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
    let whole = a as u64 as f64;
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
    (0..n.div_ceil(CHUNK))
        .into_par_iter()
        .map(|c| {
            let mut stats = empty();
            let mut x = [0f64; BLOCK];
            let mut r = [0f64; BLOCK];
            let mut m = [0f64; BLOCK];
            let mut v = [0f64; BLOCK];
            let end = ((c + 1) * CHUNK).min(n);
            for start in (c * CHUNK..end).step_by(BLOCK * every) {
                let len = BLOCK.min(end - start);
                for k in 0..len {
                    x[k] = scalar::value(dtype, values, start + k);
                    r[k] = reference_value(dtype, reference, start + k);
                    if let Some(mv) = &moments {
                        m[k] = scalar::value(mv.m.dtype, mv.m.bytes, start + k);
                        v[k] = scalar::value(mv.v.dtype, mv.v.bytes, start + k);
                    }
                }
                let sum_sq: f64 = x[..len]
                    .iter()
                    .filter(|x| x.is_finite())
                    .map(|x| x * x)
                    .sum();
                for (s, quant) in stats.iter_mut().zip(&quants) {
                    let Some(quant) = quant else { continue };
                    let e = &mut s.err;
                    e.sum_sq += sum_sq;
                    for k in 0..len {
                        match quant.code(dtype, x[k], r[k]) {
                            Some((code, y)) => {
                                s.codes.0[code as u8 as usize] += 1;
                                let high = if code >= ZERO { 0 } else { code >> 8 };
                                s.high.0[high as usize] += 1;
                                let d = y - x[k];
                                e.sum_sq_err += d * d;
                                e.max_abs = e.max_abs.max(d.abs());
                                if moments.is_some() {
                                    e.sum_m_delta += m[k] * d;
                                    e.sum_v_delta2 += v[k] * d * d;
                                }
                            }
                            None => {
                                s.codes.0[EXACT as u8 as usize] += 1;
                                s.high.0[0] += 1;
                                s.exact += 1;
                            }
                        }
                    }
                }
            }
            stats
        })
        .reduce(empty, |a, b| {
            a.into_iter().zip(b).map(|(a, b)| a.merge(b)).collect()
        })
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
            for (k, code) in codes.iter_mut().enumerate() {
                let i = c * CHUNK + k;
                let x = scalar::value(dtype, values, i);
                let r = reference_value(dtype, reference, i);
                let o = &mut out[k * size..(k + 1) * size];
                match quant.code(dtype, x, r) {
                    Some((q, y)) => {
                        *code = q;
                        scalar::put_rounded(dtype, y, o);
                    }
                    None => {
                        *code = EXACT;
                        o.copy_from_slice(&values[i * size..(i + 1) * size]);
                    }
                }
            }
        });
    let mut payload = vec![mode as u8];
    payload.extend_from_slice(&quant.param.to_le_bytes());
    let exact: Vec<usize> = (0..n).filter(|&i| codes[i] == EXACT).collect();
    varint(&mut payload, exact.len() as u64);
    for i in exact {
        payload.extend_from_slice(&values[i * size..(i + 1) * size]);
    }
    match &planes(&codes)[..] {
        [low] => {
            payload.push(1);
            encode_stream(low, &mut payload);
        }
        [low, high] => {
            payload.push(2);
            let mut first = Vec::new();
            encode_stream(low, &mut first);
            varint(&mut payload, first.len() as u64);
            payload.extend_from_slice(&first);
            encode_stream(high, &mut payload);
        }
        _ => unreachable!("one or two planes"),
    }
    (payload, render)
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
    let count = read_varint(payload, &mut at).ok_or_else(|| bad("truncated exact count"))?;
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
    let codes: Vec<u16> = match width {
        1 => {
            decode_stream(&payload[at..], &mut low)?;
            low.iter()
                .map(|&c| match c as u16 {
                    c if c < NARROW => c,
                    254 => ZERO,
                    _ => EXACT,
                })
                .collect()
        }
        2 => {
            let len = read_varint(payload, &mut at).ok_or_else(|| bad("truncated code stream"))?;
            let end = at
                .checked_add(usize::try_from(len).map_err(|_| bad("code stream too long"))?)
                .filter(|&e| e <= payload.len())
                .ok_or_else(|| bad("truncated code stream"))?;
            decode_stream(&payload[at..end], &mut low)?;
            let mut high = vec![0u8; n];
            decode_stream(&payload[end..], &mut high)?;
            low.iter()
                .zip(&high)
                .map(|(&l, &h)| l as u16 | (h as u16) << 8)
                .collect()
        }
        _ => return Err(bad("unknown code width")),
    };
    // One look at every code: each chunk's exact elements, and whether a moment code is beyond
    // its mode's range.
    let moment = mode != Mode::Linear;
    let scans: Vec<(usize, bool)> = codes
        .par_chunks(CHUNK)
        .map(|chunk| {
            let exact = chunk.iter().filter(|&&c| c == EXACT).count();
            let wide = moment
                && chunk
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
        .zip(codes.par_chunks(CHUNK))
        .zip(firsts)
        .enumerate()
        .for_each(|(chunk, ((out, codes), mut k))| {
            for (j, &c) in codes.iter().enumerate() {
                let o = &mut out[j * size..(j + 1) * size];
                if c == EXACT {
                    o.copy_from_slice(&exact[k * size..(k + 1) * size]);
                    k += 1;
                    continue;
                }
                let r = reference_value(dtype, reference, chunk * CHUNK + j);
                scalar::put_rounded(dtype, quant.value(r, c), o);
            }
        });
    Ok(())
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

fn read_varint(buf: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *buf.get(*at)?;
        *at += 1;
        v |= ((b & 0x7f) as u64) << shift;
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64, for test data.
    struct Rng(u64);
    impl Rng {
        fn next_f64(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    fn enc(dtype: Dtype, v: &[f64]) -> Vec<u8> {
        let mut out = Vec::new();
        for &x in v {
            scalar::push_rounded(dtype, x, &mut out);
        }
        out
    }

    fn normal(r: &mut Rng) -> f64 {
        let (a, b) = (r.next_f64().max(1e-12), r.next_f64());
        (-2.0 * a.ln()).sqrt() * (std::f64::consts::TAU * b).cos()
    }

    /// Round trips of every dtype: the decoder rebuilds exactly the encoder's reconstruction,
    /// every element is within step/2 plus half an ulp of the original, non-finite values and
    /// far outliers are exact, and the measured statistics are those of the reconstruction.
    #[test]
    fn round_trips_within_the_step() {
        let mut rng = Rng(3);
        for dtype in [Dtype::BF16, Dtype::F16, Dtype::F32] {
            let n = 150_000;
            let base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.02).collect();
            let mut cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
            cur[10] = f64::NAN;
            cur[11] = f64::INFINITY;
            cur[12] += 1e3; // beyond 32766 steps
            let (vb, rb) = (enc(dtype, &cur), enc(dtype, &base));
            for step in [1e-4, 5e-4, 2e-3] {
                let (payload, render) = encode(dtype, &vb, Some(&rb), Mode::Linear, step);
                let mut out = vec![0u8; vb.len()];
                decode(dtype, &payload, Some(&rb), &mut out).unwrap();
                assert_eq!(out, render, "{dtype:?} step {step}");
                let size = dtype.size();
                for i in [10usize, 11, 12] {
                    assert_eq!(out[i * size..][..size], vb[i * size..][..size]);
                }
                let mut sq = 0.0;
                for i in 0..n {
                    let (x, y) = (scalar::value(dtype, &vb, i), scalar::value(dtype, &out, i));
                    if !x.is_finite() {
                        continue;
                    }
                    // Half a unit in the last place of the result (and of f16's subnormals).
                    let (bits, tiny) = match dtype {
                        Dtype::BF16 => (8, 0.0),
                        Dtype::F16 => (11, 2f64.powi(-25)),
                        _ => (24, 0.0),
                    };
                    let half_ulp = y.abs() * 2f64.powi(-bits) + tiny;
                    assert!(
                        (y - x).abs() <= step / 2.0 + half_ulp,
                        "{dtype:?} {i}: {x} → {y}"
                    );
                    sq += (y - x) * (y - x);
                }
                let m = measure(dtype, &vb, Some(&rb), None, Mode::Linear, step);
                assert_eq!(m.exact, 3);
                assert!(
                    (m.err.sum_sq_err - sq).abs() <= 1e-9 * sq,
                    "{} vs {sq}",
                    m.err.sum_sq_err
                );
                assert_eq!(m.codes.total(), n as u64);
                assert!(m.bits(dtype) > 0.0);
            }
        }
    }

    /// One pass over several steps gives, at each, the statistics of what `encode` produces at
    /// that step: the error sums with the moments' weights, and the exactly kept elements.
    #[test]
    fn one_pass_over_many_steps_measures_each_encoding() {
        let mut rng = Rng(9);
        let n = 150_000;
        let mut base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.05).collect();
        let mut cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
        let m: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 1e-3).collect();
        let v: Vec<f64> = (0..n).map(|_| normal(&mut rng).powi(2) * 1e-6).collect();
        cur[7] = f64::NAN;
        base[70_000] = f64::INFINITY;
        let (vb, rb) = (enc(Dtype::F32, &cur), enc(Dtype::F32, &base));
        let (mb, wb) = (enc(Dtype::F32, &m), enc(Dtype::F32, &v));
        let view = |bytes| crate::engine::FloatView {
            dtype: Dtype::F32,
            bytes,
        };
        let moments = Moments {
            m: view(&mb),
            v: view(&wb),
        };
        let steps = [0.0, 1e-2, 1e-3, 1e-4, 1e-5];
        let all = measure_steps(
            Dtype::F32,
            &vb,
            Some(&rb),
            Some(moments),
            Mode::Linear,
            &steps,
            1,
        );
        assert_eq!(
            all[0],
            ResidualStats::default(),
            "an invalid step measures nothing"
        );
        for (st, &step) in all.iter().zip(&steps).skip(1) {
            let (_, render) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, step);
            let (mut sq, mut md, mut vd) = (0.0, 0.0, 0.0);
            for i in 0..n {
                let (x, y) = (
                    scalar::value(Dtype::F32, &vb, i),
                    scalar::value(Dtype::F32, &render, i),
                );
                if x.is_finite() && i != 70_000 {
                    let d = y - x;
                    sq += d * d;
                    md += scalar::value(Dtype::F32, &mb, i) * d;
                    vd += scalar::value(Dtype::F32, &wb, i) * d * d;
                }
            }
            let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-300);
            assert_eq!(st.exact, 2, "step {step}");
            assert_eq!(st.codes.total(), n as u64);
            assert!(
                close(st.err.sum_sq_err, sq),
                "{step}: {} vs {sq}",
                st.err.sum_sq_err
            );
            assert!(
                close(st.err.sum_m_delta, md),
                "{step}: {} vs {md}",
                st.err.sum_m_delta
            );
            assert!(close(st.err.sum_v_delta2, vd), "{step}");
        }
        // A sample of every eighth block, scaled, stands for the whole within a few per cent.
        let sampled = measure_steps(
            Dtype::F32,
            &vb,
            Some(&rb),
            Some(moments),
            Mode::Linear,
            &steps,
            8,
        );
        for ((st, full), step) in sampled.into_iter().zip(&all).zip(steps).skip(1) {
            let total = st.codes.total() as f64;
            assert!(total < n as f64 / 7.0, "a sample, not the whole");
            let st = st.scaled(n as f64 / total);
            let near = |a: f64, b: f64| (a / b - 1.0).abs() < 0.05;
            // The sample holds the NaN, which scaled up stands for 16 exact elements, not one.
            let (a, b) = (st.bits(Dtype::F32), full.bits(Dtype::F32));
            assert!((a - b).abs() < 0.05 * b + 16.0 * 32.0, "{step}: {a} vs {b}");
            assert!(near(st.err.sum_sq_err, full.err.sum_sq_err));
            assert!(near(st.err.sum_v_delta2, full.err.sum_v_delta2));
        }
    }

    #[test]
    fn rounding_is_half_away_from_zero() {
        for t in [
            0.0,
            -0.0,
            0.5,
            1.5,
            2.5,
            -0.5,
            -2.5,
            0.49999999999999994,
            -0.49999999999999994,
            2.5000000000000004,
            4503599627370495.5,
            1e300,
            f64::INFINITY,
        ] {
            assert_eq!(round(t).to_bits(), t.round().to_bits(), "{t}");
        }
        assert!(round(f64::NAN).is_nan());
    }

    /// The error shrinks with the step and stays below the movement; a finer step costs more.
    #[test]
    fn finer_steps_cost_more_and_err_less() {
        let mut rng = Rng(5);
        let n = 100_000;
        let base: Vec<f64> = (0..n).map(|_| normal(&mut rng) * 0.05).collect();
        let cur: Vec<f64> = base.iter().map(|b| b + normal(&mut rng) * 1e-3).collect();
        let (vb, rb) = (enc(Dtype::F32, &cur), enc(Dtype::F32, &base));
        let mut last: Option<ResidualStats> = None;
        for step in [4e-3, 2e-3, 1e-3, 5e-4, 2.5e-4] {
            let m = measure(Dtype::F32, &vb, Some(&rb), None, Mode::Linear, step);
            // Uniform quantization: mean squared error near step²/12.
            let mse = m.err.sum_sq_err / n as f64;
            assert!(mse <= step * step / 12.0 * 1.2 + 1e-14, "{step}: {mse}");
            let moved = distance_sq(Dtype::F32, &vb, Some(&rb));
            assert!((m.err.sum_sq_err / moved).sqrt() < 1.0);
            if let Some(l) = &last {
                assert!(m.err.sum_sq_err < l.err.sum_sq_err);
                assert!(m.bits(Dtype::F32) > l.bits(Dtype::F32));
            }
            last = Some(m);
        }
    }

    /// Without a reference (`quant-uniform`), fine steps need two-byte codes: they round trip,
    /// and every element is within half a step (plus rounding).
    #[test]
    fn uniform_codes_are_wide_when_the_steps_are_fine() {
        let mut rng = Rng(4);
        let w: Vec<f64> = (0..70_000).map(|_| normal(&mut rng) * 0.02).collect();
        let vb = enc(Dtype::F32, &w);
        for (step, width) in [(1e-2, 1u8), (2e-5, 2)] {
            let (payload, render) = encode(Dtype::F32, &vb, None, Mode::Linear, step);
            assert_eq!(payload[1 + 8 + 1], width, "step {step}");
            let mut out = vec![0u8; vb.len()];
            decode(Dtype::F32, &payload, None, &mut out).unwrap();
            assert_eq!(out, render);
            for (i, &x) in w.iter().enumerate() {
                let (x, y) = (x as f32 as f64, scalar::value(Dtype::F32, &out, i));
                assert!((y - x).abs() <= step / 2.0 + y.abs() * 1e-7, "{i}");
            }
            let m = measure(Dtype::F32, &vb, None, None, Mode::Linear, step);
            assert_eq!(m.exact, 0);
            assert_eq!(m.high.entropy_bits() > 0.0, width == 2);
        }
        let (payload, _) = encode(Dtype::F32, &vb, Some(&vb), Mode::Log, 0.5);
        let mut bad = payload.clone();
        bad[0] = 1;
        let mut out = vec![0u8; vb.len()];
        assert!(decode(Dtype::F32, &bad, None, &mut out).is_err());
    }

    /// Codes of exactly 127 and −128 steps are the one-byte forms of the special codes: a
    /// tensor that has them (and nothing wider) takes two-byte codes, and decodes to itself.
    #[test]
    fn codes_next_to_the_special_ones_round_trip() {
        let n = 1000;
        let reference = vec![0.0f64; n];
        let values: Vec<f64> = (0..n)
            .map(|i| match i % 4 {
                0 => 127.0,
                1 => -128.0,
                2 => 3.0,
                _ => -1.0,
            })
            .collect();
        let (vb, rb) = (enc(Dtype::F32, &values), enc(Dtype::F32, &reference));
        let (payload, render) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, 1.0);
        assert_eq!(payload[1 + 8 + 1], 2);
        assert_eq!(render, vb);
        let mut out = vec![0u8; vb.len()];
        decode(Dtype::F32, &payload, Some(&rb), &mut out).unwrap();
        assert_eq!(out, vb);
    }

    /// The moment modes: a second moment against its previous version in the log domain
    /// (relative error within half a step of octaves), a first moment in units of the square
    /// root of a second moment; zeros stay zeros, what cannot be coded is exact, and the
    /// decoder rebuilds exactly the encoder's reconstruction.
    #[test]
    fn moment_modes_round_trip_within_their_steps() {
        let mut rng = Rng(9);
        let n = 120_000;
        let v0: Vec<f64> = (0..n)
            .map(|_| 1e-8 * (normal(&mut rng) * 3.0).exp2())
            .collect();
        let mut v1: Vec<f64> = v0
            .iter()
            .map(|v| v * (normal(&mut rng) * 0.5).exp2())
            .collect();
        v1[3] = 0.0;
        let mut m1: Vec<f64> = v1
            .iter()
            .map(|v| v.sqrt() * normal(&mut rng) * 0.3)
            .collect();
        m1[5] = 0.0;
        let mut v0b = v0.clone();
        v0b[7] = 0.0; // no scale for element 7: its first moment is exact
        for dtype in [Dtype::F32, Dtype::BF16] {
            let (r, x) = (enc(dtype, &v0), enc(dtype, &v1));
            let (payload, render) = encode(dtype, &x, Some(&r), Mode::Log, 0.5);
            let mut out = vec![0u8; x.len()];
            decode(dtype, &payload, Some(&r), &mut out).unwrap();
            assert_eq!(out, render);
            // Rounding to the dtype, in octaves (bf16 keeps 8 significant bits).
            let slack = if dtype == Dtype::BF16 {
                2f64.powi(-7)
            } else {
                1e-6
            };
            for i in 0..n {
                let (a, b) = (scalar::value(dtype, &x, i), scalar::value(dtype, &out, i));
                if a == 0.0 {
                    assert_eq!(b, 0.0);
                    continue;
                }
                let ratio = (b / a).log2().abs();
                let r = scalar::value(dtype, &r, i);
                assert!(
                    ratio <= 0.25 + slack,
                    "{dtype:?} {i}: {a} → {b} (reference {r})"
                );
            }
            let (s, x) = (enc(dtype, &v0b), enc(dtype, &m1));
            let (payload, render) = encode(dtype, &x, Some(&s), Mode::Scaled, 0.25);
            decode(dtype, &payload, Some(&s), &mut out).unwrap();
            assert_eq!(out, render);
            let size = dtype.size();
            assert_eq!(out[7 * size..8 * size], x[7 * size..8 * size]);
            for i in 0..n {
                let (a, b) = (scalar::value(dtype, &x, i), scalar::value(dtype, &out, i));
                let unit = scalar::value(dtype, &s, i).sqrt();
                if i == 7 || unit == 0.0 {
                    continue;
                }
                assert!(
                    (a - b).abs() <= 0.125 * unit + b.abs() * slack,
                    "{i}: {a} → {b}"
                );
            }
            assert_eq!(scalar::value(dtype, &out, 5), 0.0);
        }
    }

    #[test]
    fn corrupt_payloads_are_errors() {
        let rb = enc(Dtype::F32, &[0.5; 1000]);
        let vb = enc(Dtype::F32, &[0.6; 1000]);
        let (payload, _) = encode(Dtype::F32, &vb, Some(&rb), Mode::Linear, 0.01);
        let mut out = vec![0u8; vb.len()];
        for cut in [0, 1, 4, 9, 10, payload.len() - 1] {
            assert!(decode(Dtype::F32, &payload[..cut], Some(&rb), &mut out).is_err());
        }
        let mut bad = payload.clone();
        bad[1..9].copy_from_slice(&(-1.0f64).to_le_bytes());
        assert!(decode(Dtype::F32, &bad, Some(&rb), &mut out).is_err());
        let mut bad = payload.clone();
        bad[0] = 7;
        assert!(decode(Dtype::F32, &bad, Some(&rb), &mut out).is_err());
        assert!(decode(Dtype::F32, &payload, Some(&rb[4..]), &mut out).is_err());
        assert!(decode(Dtype::I32, &payload, Some(&rb), &mut out).is_err());
    }
}

#[cfg(test)]
mod golden {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// Known-answer vectors of the payload layout (`docs/FORMAT.md`): a change here is a format
    /// change.
    #[test]
    fn payload_bytes() {
        let reference = f32s(&[1.0, 2.0, 0.5, 4.0]);
        let values = f32s(&[1.25, 1.5, f32::NAN, 0.0]);
        let (payload, render) = encode(Dtype::F32, &values, Some(&reference), Mode::Linear, 0.25);
        // mode 0 | step 0.25 | one exact value (the NaN) | one-byte codes | a stored entropy
        // stream of them: +1 step, −2 steps, exact, −16 steps.
        let expected = [
            0, 0, 0, 0, 0, 0, 0, 208, 63, 1, 0, 0, 192, 127, 1, 0, 2, 3, 255, 31,
        ];
        assert_eq!(payload, expected);
        assert_eq!(render[..8], f32s(&[1.25, 1.5])[..]);
        let mut out = vec![0u8; 16];
        decode(Dtype::F32, &payload, Some(&reference), &mut out).unwrap();
        assert_eq!(out, render);
    }
}
