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

mod classes;
mod factors;
mod measure;
mod predict;
mod quantizer;
mod steps;

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

pub use measure::{
    distance_of_chunks, distance_sq, lane_sum, measure, measure_stepped, measure_steps,
    ResidualStats, BLOCK, LANES,
};
pub use predict::{view_of, Predictor};
pub use quantizer::{device_quantizer, valid_step, Mode, DEVICE_QUANTIZER};
use quantizer::{for_mode, unzigzag, Quantizer};
use steps::Gains;
pub use steps::Steps;

use crate::huffman::{decode_stream, encode_stream};
use crate::scalar;
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
/// The first byte of a payload whose log-mode codes are taken against a predicted reference
/// ([`Predictor`]); the mode bytes are 0 to 2.
pub const PREDICTED: u8 = 3;
/// The first byte of a payload whose linear-mode codes have a step per row and column
/// ([`Steps`]; format 14).
pub const STEPPED: u8 = 4;
/// Codes below this fit a one-byte payload.
const NARROW: u16 = 254;

/// Elements per parallel work item, and per chunk of the statistics' sums.
pub const CHUNK: usize = 1 << 16;

/// Element `i` of the reference, `0` without one (`quant-uniform`).
#[inline(always)]
fn reference_value(dtype: Dtype, reference: Option<&[u8]>, i: usize) -> f64 {
    reference.map_or(0.0, |r| scalar::value(dtype, r, i))
}

/// A payload's mode and step (in log2 units for [`Mode::Log`]), as [`encode`] took them.
pub fn mode_and_step(payload: &[u8]) -> Result<(Mode, f64), FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    // The tensor's size is not known here: whatever view the header names will do.
    if let Some((_, inner)) = Predictor::unwrap(payload, None)? {
        return mode_and_step(inner);
    }
    if let Some((_, inner)) = Steps::unwrap(payload, None)? {
        return mode_and_step(inner);
    }
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

/// Quantizes `values` against `reference` (`None`: zeros, a `quant-uniform` payload, linear
/// mode only) at `step` (see [`Mode`]): the payload and the reconstruction.
pub fn encode(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    mode: Mode,
    step: f64,
) -> (Vec<u8>, Vec<u8>) {
    encode_codes(dtype, values, reference, mode, step, None)
}

/// [`encode`] in linear mode with `steps`' factor on each element's step: a stepped payload
/// (`steps` must cover the tensor).
pub fn encode_stepped(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    steps: &Steps,
    step: f64,
) -> (Vec<u8>, Vec<u8>) {
    let gains = steps.gains_for(dtype, values.len());
    let (inner, render) = encode_codes(dtype, values, reference, Mode::Linear, step, Some(&gains));
    (steps.wrap(&inner), render)
}

/// [`encode`], each element's linear step times its factor in `gains` when there are any.
fn encode_codes(
    dtype: Dtype,
    values: &[u8],
    reference: Option<&[u8]>,
    mode: Mode,
    step: f64,
    gains: Option<&Gains>,
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
            let factors = gains.map(|g| g.run(first, codes.len()));
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
                    let gain = factors.as_ref().map_or((1.0, 1.0), |f| (f[k], 1.0 / f[k]));
                    match quant.code(M, D, x, r, gain) {
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

/// A payload's parts, checked against the tensor it decodes to: what a decoder needs.
pub struct Parts<'a> {
    /// How the codes map to values.
    pub mode: Mode,
    quant: Quantizer,
    /// How many elements are stored exactly.
    pub exact_count: u64,
    /// Their bytes, in element order.
    pub exact: &'a [u8],
    /// How the codes are stored.
    pub codes: Codes<'a>,
}

/// A payload's codes as stored (its width byte says which).
#[derive(Clone, Copy)]
pub enum Codes<'a> {
    /// Huffman streams ([`crate::huffman`]): the low bytes, and the high bytes of a two-plane
    /// payload (widths 1 and 2).
    Huffman {
        /// The low bytes' stream.
        low: &'a [u8],
        /// The high bytes' stream, in a two-plane payload.
        high: Option<&'a [u8]>,
    },
    /// One plane of bytes coded by classes of rows or columns (width 3, `classes`).
    Classed(&'a [u8]),
}

impl Codes<'_> {
    /// The codes' low bytes and, for a two-plane payload, their high bytes, decoded.
    pub fn planes(self, n: usize) -> Result<(Vec<u8>, Option<Vec<u8>>), FormatError> {
        let mut low = vec![0u8; n];
        match self {
            Codes::Huffman { low: l, high } => {
                decode_stream(l, &mut low)?;
                let high = high
                    .map(|stream| {
                        let mut high = vec![0u8; n];
                        decode_stream(stream, &mut high).map(|()| high)
                    })
                    .transpose()?;
                Ok((low, high))
            }
            Codes::Classed(section) => {
                classes::decode(section, &mut low)?;
                Ok((low, None))
            }
        }
    }
}

impl Parts<'_> {
    /// The quantizer as a device kernel takes it ([`device_quantizer`]).
    pub fn device_quantizer(&self) -> Vec<f64> {
        self.quant.device_table()
    }
}

/// A predicted payload's prediction (the reference its log-mode codes were taken against) and
/// that inner payload.
pub type Unwrapped<'a> = (Vec<u8>, &'a [u8]);

/// For a predicted payload of `out_len` bytes of `dtype`, its [`Unwrapped`] parts; `None` for
/// any other payload. Every engine decodes a predicted payload so: the prediction on the host,
/// then the inner payload as any other.
pub fn unwrap_predicted<'a>(
    dtype: Dtype,
    payload: &'a [u8],
    reference: Option<&[u8]>,
    out_len: usize,
) -> Result<Option<Unwrapped<'a>>, FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    if !scalar::lossy_supported(dtype) || !out_len.is_multiple_of(dtype.size()) {
        return Err(bad("not a bf16, f16 or f32 tensor"));
    }
    let Some((predictor, inner)) = Predictor::unwrap(payload, Some(out_len / dtype.size()))? else {
        return Ok(None);
    };
    Ok(Some((predictor.predict(dtype, reference)?, inner)))
}

/// Splits a payload of `out_len` bytes of `dtype` into its parts, checking what can be checked
/// without decoding the streams. `reference_len`: the reference's length, if there is one.
pub fn parse(
    dtype: Dtype,
    payload: &[u8],
    reference_len: Option<usize>,
    out_len: usize,
) -> Result<Parts<'_>, FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    let size = dtype.size();
    if !scalar::lossy_supported(dtype) {
        return Err(bad("not a bf16, f16 or f32 tensor"));
    }
    if reference_len.is_some_and(|r| r != out_len) || !out_len.is_multiple_of(size) {
        return Err(bad("reference and output sizes differ"));
    }
    let n = out_len / size;
    // A predicted or stepped payload is parsed by its inner payload only.
    if payload
        .first()
        .is_some_and(|&b| b == PREDICTED || b == STEPPED)
    {
        return Err(bad(
            "a wrapped payload's inner payload is parsed, not the payload",
        ));
    }
    let (mode, _) = mode_and_step(payload)?;
    if reference_len.is_none() && mode != Mode::Linear {
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
    let codes = match width {
        1 => Codes::Huffman {
            low: &payload[at..],
            high: None,
        },
        2 => {
            let len = varint::read(payload, &mut at).ok_or_else(|| bad("truncated code stream"))?;
            let end = at
                .checked_add(usize::try_from(len).map_err(|_| bad("code stream too long"))?)
                .filter(|&e| e <= payload.len())
                .ok_or_else(|| bad("truncated code stream"))?;
            Codes::Huffman {
                low: &payload[at..end],
                high: Some(&payload[end..]),
            }
        }
        3 => Codes::Classed(&payload[at..]),
        _ => return Err(bad("unknown code width")),
    };
    Ok(Parts {
        mode,
        quant,
        exact_count: count,
        exact,
        codes,
    })
}

/// `payload`, of a `dtype` tensor viewed as `rows × cols`, with its one-byte codes coded by
/// classes (`classes`, width 3) where that is smaller than their Huffman stream; any other
/// payload unchanged. Every engine's payload passes through here, so both store the same bytes.
pub fn context_code(dtype: Dtype, payload: Vec<u8>, (rows, cols): (usize, usize)) -> Vec<u8> {
    let n = rows * cols;
    let inner = match Predictor::unwrap(&payload, Some(n)) {
        Ok(Some((_, inner))) => Ok(Some(inner)),
        Ok(None) => Steps::unwrap(&payload, Some(n)).map(|s| s.map(|(_, inner)| inner)),
        Err(e) => Err(e),
    };
    let inner_at = match inner {
        Ok(Some(inner)) => payload.len() - inner.len(),
        Ok(None) => 0,
        Err(_) => return payload,
    };
    let len = n * dtype.size();
    let stream = match parse(dtype, &payload[inner_at..], Some(len), len) {
        Ok(Parts {
            codes: Codes::Huffman { low, high: None },
            ..
        }) => low,
        _ => return payload,
    };
    let mut low = vec![0u8; n];
    if n == 0 || decode_stream(stream, &mut low).is_err() {
        return payload;
    }
    let section = classes::encode(&low, rows);
    if section.len() >= stream.len() {
        return payload;
    }
    // The width byte sits right before the stream, which runs to the end.
    let mut out = payload[..payload.len() - stream.len() - 1].to_vec();
    out.push(3);
    out.extend_from_slice(&section);
    out
}

/// Decodes a payload into `out`: a `quant-residual` one against `reference` (the base's decoded
/// content), a `quant-uniform` one (linear mode) without.
pub fn decode(
    dtype: Dtype,
    payload: &[u8],
    reference: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    if let Some(predicted) = unwrap_predicted(dtype, payload, reference, out.len())? {
        let (prediction, inner) = predicted;
        return decode(dtype, inner, Some(&prediction), out);
    }
    let n = out.len() / dtype.size().max(1);
    if let Some((steps, inner)) = Steps::unwrap(payload, Some(n))? {
        return decode_codes(dtype, inner, reference, out, Some(&steps.gains()));
    }
    decode_codes(dtype, payload, reference, out, None)
}

/// [`decode`] of a payload that is neither predicted nor stepped, each element's linear step
/// times its factor in `gains` when there are any.
fn decode_codes(
    dtype: Dtype,
    payload: &[u8],
    reference: Option<&[u8]>,
    out: &mut [u8],
    gains: Option<&Gains>,
) -> Result<(), FormatError> {
    let bad = |why: &str| FormatError::invalid("quant-residual", why.to_string());
    let size = dtype.size();
    let parts = parse(dtype, payload, reference.map(<[u8]>::len), out.len())?;
    let (mode, quant, count, exact) = (parts.mode, &parts.quant, parts.exact_count, parts.exact);
    let n = out.len() / size;
    let (low, high) = parts.codes.planes(n)?;
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
            let gains = gains.map(|g| (g, chunk * CHUNK));
            scalar::for_dtype!(dtype, D => for_mode!(mode, M => {
                rebuild(D, M, quant, out, &codes, reference, exact, gains)
            }))
        });
    Ok(())
}

/// Writes one chunk of [`decode`]'s output: each element from its code and its reference value
/// ([`Quantizer::value`], rounded to `dtype`), or the next of `exact` for [`EXACT`]; `gains`:
/// the step factors and the chunk's first element, in a stepped payload. Inlined into each
/// caller with a constant dtype and mode.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn rebuild(
    dtype: Dtype,
    mode: Mode,
    quant: &Quantizer,
    out: &mut [u8],
    codes: &[u16],
    reference: Option<&[u8]>,
    exact: &[u8],
    gains: Option<(&Gains, usize)>,
) {
    let size = dtype.size();
    let mut exact = exact.chunks_exact(size);
    let factor = gains.map_or_else(Vec::new, |(g, first)| g.run(first, codes.len()));
    for (j, (&c, o)) in codes.iter().zip(out.chunks_exact_mut(size)).enumerate() {
        if c == EXACT {
            o.copy_from_slice(exact.next().expect("counted exact values"));
            continue;
        }
        let r = reference_value(dtype, reference, j);
        let gain = factor.get(j).copied().unwrap_or(1.0);
        scalar::put_rounded(dtype, quant.value(mode, r, c, gain), o);
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
