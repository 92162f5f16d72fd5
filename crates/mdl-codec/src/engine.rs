//! The hot kernels of the codecs behind one trait, so a GPU implementation can stand in for the
//! CPU one: float planes (split, XOR or subtract, histogram, Huffman-code, decode, merge) and
//! the lossy codecs' key histograms, lookups, grouped deltas and error sums. Every kernel's
//! result is a function of its input alone — never of thread count, scheduling or device —
//! because what it computes ends up in stored bytes: sums are taken in fixed point (integer
//! addition is associative) or in a fixed chunk order, and coded chunks are defined bit for bit
//! by their symbols and code. What is decided from the kernels' results (codes, plans, record
//! layout) stays in shared code ([`crate::float`], [`crate::quant`], [`crate::qrecord`]).

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use crate::huffman::{Histogram, Stream, StreamWriter};
use crate::planes::PlaneSpec;
use crate::scalar::{self, KEYS};

/// What [`Engine::keep`] returns: while it lives, the engine keeps a copy of the bytes where
/// it computes, so kernels called meanwhile on them (or on a part of them) do not copy them
/// again. Dropping it lets the copy go.
#[must_use = "the bytes are kept only while the guard lives"]
pub struct Kept<'a> {
    /// Dropped with the guard: whatever releases the kept copy.
    _release: Option<Box<dyn Send + 'a>>,
}

impl<'a> Kept<'a> {
    /// A guard that keeps nothing (engines that compute where the bytes already are).
    pub fn nothing() -> Kept<'a> {
        Kept { _release: None }
    }

    /// A guard whose drop releases what `inner`'s drop releases.
    pub fn new(inner: Box<dyn Send + 'a>) -> Kept<'a> {
        Kept {
            _release: Some(inner),
        }
    }
}

/// A float tensor (bf16, f16 or f32), little-endian.
#[derive(Clone, Copy, Debug)]
pub struct FloatView<'a> {
    /// Element type.
    pub dtype: Dtype,
    /// The elements' bytes.
    pub bytes: &'a [u8],
}

impl FloatView<'_> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.bytes.len() / self.dtype.size()
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    #[inline]
    fn value(&self, i: usize) -> f64 {
        scalar::value(self.dtype, self.bytes, i)
    }
}

/// A parameter's Adam moments: first (`m`, `exp_avg`) and second (`v`, `exp_avg_sq`), each
/// with as many elements as the parameter.
#[derive(Clone, Copy, Debug)]
pub struct Moments<'a> {
    /// First moment.
    pub m: FloatView<'a>,
    /// Second moment.
    pub v: FloatView<'a>,
}

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

/// A key → code table with the keys whose elements are kept exactly.
#[derive(Clone, Debug)]
pub struct Lut {
    /// Code per key (for protected keys, the code of the nearest table value).
    pub code: Vec<u8>,
    /// Whether a key's elements are protected (stored exactly).
    pub protect: Vec<bool>,
}

/// A tensor's codes and its protected element indices (ascending).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assigned {
    /// One code per element.
    pub codes: Vec<u8>,
    /// Indices of protected elements.
    pub protected: Vec<u64>,
}

/// Error of a reconstruction against its original, with the moment-weighted sums of the
/// quality estimate (zero without moments). Non-finite pairs are skipped.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ErrorStats {
    /// max |recon − orig|
    pub max_abs: f64,
    /// Σ (recon − orig)²
    pub sum_sq_err: f64,
    /// Σ orig²
    pub sum_sq: f64,
    /// Σ m·(recon − orig)
    pub sum_m_delta: f64,
    /// Σ v·(recon − orig)²
    pub sum_v_delta2: f64,
}

impl ErrorStats {
    /// Combines per-chunk results (of [`ERROR_CHUNK`] elements each) in chunk order: the
    /// one order every engine sums in.
    pub fn fold(chunks: &[ErrorStats]) -> ErrorStats {
        chunks.iter().fold(ErrorStats::default(), |mut a, e| {
            a.max_abs = a.max_abs.max(e.max_abs);
            a.sum_sq_err += e.sum_sq_err;
            a.sum_sq += e.sum_sq;
            a.sum_m_delta += e.sum_m_delta;
            a.sum_v_delta2 += e.sum_v_delta2;
            a
        })
    }

    /// Relative L2 error (0 for an all-zero original).
    pub fn rel_l2(&self) -> f64 {
        if self.sum_sq > 0.0 {
            (self.sum_sq_err / self.sum_sq).sqrt()
        } else {
            self.sum_sq_err.sqrt()
        }
    }
}

/// The codecs' kernels. Implementations must return identical results; [`CpuEngine`] is the
/// reference.
pub trait Engine: Send + Sync + std::fmt::Debug {
    /// A short name for messages.
    fn name(&self) -> &'static str;

    /// Keeps `bytes` where the engine computes until the guard drops (see [`Kept`]). The
    /// borrow guarantees the bytes do not change meanwhile.
    fn keep<'a>(&'a self, bytes: &'a [u8]) -> Kept<'a> {
        let _ = bytes;
        Kept::nothing()
    }

    /// Per plane of `data` taken apart as `spec` says (against `base`, of the same length,
    /// where the spec uses one): the symbol histogram and the histogram of sparse-mode flag
    /// bytes ([`crate::huffman::flag_histogram`], per chunk of
    /// [`crate::huffman::CHUNK_LOG2`] elements). `want[p]` says which of the two plane `p`
    /// needs; the other is left empty. `spec.dtype` must be a float type.
    fn plane_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        want: &[(bool, bool)],
    ) -> Vec<(Histogram, Histogram)>;

    /// A first look at a tensor: [`Engine::plane_histograms`] of every plane's symbols, and of
    /// the flag bytes only of the planes whose symbols want them
    /// ([`crate::huffman::Plan::wants_flags`]; the others' flag counts are left empty), the
    /// only flags a plan is ever chosen with.
    fn sample_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Vec<(Histogram, Histogram)> {
        let planes = spec.shape().map_or(0, |(_, planes)| planes);
        let mut counts = self.plane_histograms(spec, data, base, &vec![(true, true); planes]);
        crate::planes::forget_unwanted_flags(&mut counts);
        counts
    }

    /// Every chunk of every plane of `data` (as in [`Engine::plane_histograms`]) coded by that
    /// plane's writer ([`StreamWriter::chunk`]): `result[plane][chunk]`.
    fn encode_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &[StreamWriter],
    ) -> Vec<Vec<Vec<u8>>>;

    /// `data` taken apart into its planes as `spec` says (against `base`), into `planes`
    /// (`planes[p]`: a byte of each element; buffers reused from call to call). With
    /// [`Engine::encode_split`], a frame is split once for both counting and coding. The CPU's
    /// kernels unless an engine has its own.
    fn split_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        planes: &mut Vec<Vec<u8>>,
    ) {
        crate::planes::cpu_split_planes(spec, data, base, planes)
    }

    /// [`Engine::encode_planes`] of planes already split ([`Engine::split_planes`]):
    /// `result[plane][chunk]`.
    fn encode_split(&self, planes: &[&[u8]], writers: &[StreamWriter]) -> Vec<Vec<Vec<u8>>> {
        crate::planes::cpu_encode_split(planes, writers)
    }

    /// Decodes one stream per plane and merges the planes into `out` (undoing the XOR with,
    /// or the difference from, `base`). Fails on a damaged stream.
    fn decode_planes(
        &self,
        spec: PlaneSpec,
        streams: &[Stream<'_>],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError>;

    /// The 16-bit-key histogram with per-key sums of `w` and, when given, its moments.
    fn key_stats(&self, w: FloatView<'_>, moments: Option<Moments<'_>>) -> KeyStats;

    /// Each element's code by its key, and the protected elements.
    fn assign(&self, w: FloatView<'_>, lut: &Lut) -> Assigned;

    /// How often each (base code, code by `lut`) pair occurs over the elements of `w`; `base`
    /// holds one code per element, all below `base_bins`, and `lut`'s codes are below `bins`.
    fn code_pairs(
        &self,
        w: FloatView<'_>,
        lut: &Lut,
        bins: usize,
        base: &[u8],
        base_bins: usize,
    ) -> CodePairs;

    /// `(base − cur) mod modulus` per element, in the order of a stable counting sort by the
    /// base code (all elements whose base code is 0 in index order, then 1, …).
    fn group_delta(&self, base: &[u8], cur: &[u8], modulus: u8) -> Vec<u8>;

    /// Inverts [`Engine::group_delta`]: the current codes from the base codes and the grouped
    /// deltas. Fails if a base code is not below `modulus` or the lengths differ.
    fn ungroup_delta(
        &self,
        base: &[u8],
        deltas: &[u8],
        modulus: u8,
        out: &mut [u8],
    ) -> Result<(), FormatError>;

    /// Error of `recon` against `orig` (same dtype and length).
    fn error_stats(
        &self,
        orig: FloatView<'_>,
        recon: FloatView<'_>,
        moments: Option<Moments<'_>>,
    ) -> ErrorStats;
}

/// Counts of code pairs: `count[b * bins + c]` elements have base code `b` and code `c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CodePairs {
    /// Codes of the new assignment (columns; one row per base code).
    pub bins: usize,
    /// Row-major counts.
    pub count: Vec<u64>,
}

impl CodePairs {
    /// Σ over pairs of `n(b, c) · log2(n(b) / n(b, c))`: the order-0 cost of the codes when each
    /// base code's elements are coded apart (the conditional entropy times the element count).
    pub fn conditional_bits(&self) -> f64 {
        self.count
            .chunks(self.bins.max(1))
            .map(|row| {
                let total: u64 = row.iter().sum();
                row.iter()
                    .filter(|&&c| c > 0)
                    .map(|&c| c as f64 * (total as f64 / c as f64).log2())
                    .sum::<f64>()
            })
            .sum()
    }
}

/// The reference engine: rayon over fixed-size chunks.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuEngine;

/// Elements per chunk of the chunked kernels (fixed: it defines the summation order).
const CHUNK: usize = 1 << 16;

/// Elements per chunk of [`Engine::error_stats`]: each chunk is summed in index order, and the
/// chunks' sums are combined by [`ErrorStats::fold`].
pub const ERROR_CHUNK: usize = CHUNK;

thread_local! {
    /// A dense per-key table for [`Engine::key_stats`], kept zeroed between uses.
    static STATS_SCRATCH: std::cell::RefCell<(Vec<u64>, Vec<[i64; sum::N]>)> =
        const { std::cell::RefCell::new((Vec::new(), Vec::new())) };
}

/// Elements per partial histogram of [`Engine::key_stats`].
const STATS_PART: usize = 1 << 18;

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
fn max_abs(v: FloatView<'_>) -> f64 {
    (0..v.len())
        .into_par_iter()
        .with_min_len(CHUNK)
        .map(|i| v.value(i).abs())
        .filter(|x| x.is_finite())
        .reduce(|| 0.0, f64::max)
}

impl Engine for CpuEngine {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn plane_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        want: &[(bool, bool)],
    ) -> Vec<(Histogram, Histogram)> {
        crate::planes::cpu_plane_histograms(spec, data, base, want)
    }

    fn sample_histograms(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Vec<(Histogram, Histogram)> {
        crate::planes::cpu_sample_histograms(spec, data, base)
    }

    fn encode_planes(
        &self,
        spec: PlaneSpec,
        data: &[u8],
        base: Option<&[u8]>,
        writers: &[StreamWriter],
    ) -> Vec<Vec<Vec<u8>>> {
        crate::planes::cpu_encode_planes(spec, data, base, writers)
    }

    fn decode_planes(
        &self,
        spec: PlaneSpec,
        streams: &[Stream<'_>],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        crate::planes::cpu_decode_planes(spec, streams, base, out)
    }

    fn key_stats(&self, w: FloatView<'_>, moments: Option<Moments<'_>>) -> KeyStats {
        let n = w.len();
        let wmax = max_abs(w);
        let (mmax, vmax) = moments.map_or((0.0, 0.0), |mv| (max_abs(mv.m), max_abs(mv.v)));
        let sc = scales(n, wmax, mmax, vmax);
        let parts = n
            .div_ceil(STATS_PART)
            .clamp(1, rayon::current_num_threads().max(1));
        let per = n.div_ceil(parts).max(1);
        // Each part accumulates into a dense per-thread table (reused across calls, so no
        // 4.7 MB allocation per tensor) and hands back its touched keys, resetting them.
        let partials: Vec<Vec<(u16, u64, [i64; sum::N])>> = (0..parts)
            .into_par_iter()
            .map(|p| {
                STATS_SCRATCH.with(|cell| {
                    let mut scratch = cell.borrow_mut();
                    let (count, acc) = &mut *scratch;
                    if count.is_empty() {
                        *count = vec![0u64; KEYS];
                        *acc = vec![[0i64; sum::N]; KEYS];
                    }
                    // Truncation toward zero: one instruction, and as order-independent as
                    // rounding.
                    let fix = |x: f64, j: usize| (x * sc[j]) as i64;
                    for i in p * per..((p + 1) * per).min(n) {
                        let k = scalar::key(w.dtype, w.bytes, i) as usize;
                        count[k] += 1;
                        let x = w.value(i);
                        if !x.is_finite() {
                            continue;
                        }
                        let a = &mut acc[k];
                        a[sum::W] += fix(x, sum::W);
                        a[sum::W2] += fix(x * x, sum::W2);
                        if let Some(mv) = moments {
                            let (m, v) = (mv.m.value(i), mv.v.value(i));
                            if m.is_finite() && v.is_finite() {
                                a[sum::M] += fix(m, sum::M);
                                a[sum::MW] += fix(m * x, sum::MW);
                                a[sum::V] += fix(v, sum::V);
                                a[sum::VW] += fix(v * x, sum::VW);
                                a[sum::VW2] += fix(v * x * x, sum::VW2);
                                a[sum::SENS] += fix((m * x).abs(), sum::SENS);
                            }
                        }
                    }
                    let mut touched = Vec::new();
                    for k in 0..KEYS {
                        if count[k] > 0 {
                            touched.push((k as u16, count[k], acc[k]));
                            count[k] = 0;
                            acc[k] = [0; sum::N];
                        }
                    }
                    touched
                })
            })
            .collect();
        let mut all: Vec<(u16, u64, [i64; sum::N])> = partials.concat();
        all.sort_by_key(|e| e.0);
        let mut merged: Vec<(u16, u64, [i64; sum::N])> = Vec::with_capacity(all.len());
        for (k, c, a) in all {
            match merged.last_mut() {
                Some(last) if last.0 == k => {
                    last.1 += c;
                    for (x, y) in last.2.iter_mut().zip(a) {
                        *x = x.wrapping_add(y);
                    }
                }
                _ => merged.push((k, c, a)),
            }
        }
        KeyStats::from_fixed_point(n as u64, merged, &sc, moments.is_some())
    }

    fn assign(&self, w: FloatView<'_>, lut: &Lut) -> Assigned {
        let n = w.len();
        let mut codes = vec![0u8; n];
        let protected: Vec<Vec<u64>> = codes
            .par_chunks_mut(CHUNK)
            .enumerate()
            .map(|(c, out)| {
                let mut prot = Vec::new();
                for (j, o) in out.iter_mut().enumerate() {
                    let i = c * CHUNK + j;
                    let k = scalar::key(w.dtype, w.bytes, i) as usize;
                    *o = lut.code[k];
                    if lut.protect[k] {
                        prot.push(i as u64);
                    }
                }
                prot
            })
            .collect();
        Assigned {
            codes,
            protected: protected.concat(),
        }
    }

    fn code_pairs(
        &self,
        w: FloatView<'_>,
        lut: &Lut,
        bins: usize,
        base: &[u8],
        base_bins: usize,
    ) -> CodePairs {
        debug_assert_eq!(w.len(), base.len());
        let cells = base_bins * bins;
        let count = base
            .par_chunks(STATS_PART)
            .enumerate()
            .map(|(c, part)| {
                let mut count = vec![0u64; cells];
                for (j, &b) in part.iter().enumerate() {
                    let k = scalar::key(w.dtype, w.bytes, c * STATS_PART + j) as usize;
                    count[b as usize * bins + lut.code[k] as usize] += 1;
                }
                count
            })
            .reduce(
                || vec![0u64; cells],
                |mut a, b| {
                    a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                    a
                },
            );
        CodePairs { bins, count }
    }

    fn group_delta(&self, base: &[u8], cur: &[u8], modulus: u8) -> Vec<u8> {
        debug_assert_eq!(base.len(), cur.len());
        let mut start = group_starts(base);
        let mut out = vec![0u8; base.len()];
        let m = modulus as u16;
        for (&b, &c) in base.iter().zip(cur) {
            let slot = &mut start[b as usize];
            out[*slot] = ((b as u16 + m - c as u16) % m) as u8;
            *slot += 1;
        }
        out
    }

    fn ungroup_delta(
        &self,
        base: &[u8],
        deltas: &[u8],
        modulus: u8,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        check_ungroup(base, deltas, modulus, out.len())?;
        let mut start = group_starts(base);
        let m = modulus as u16;
        for (&b, o) in base.iter().zip(out.iter_mut()) {
            let slot = &mut start[b as usize];
            let d = deltas[*slot] as u16 % m;
            *slot += 1;
            *o = ((b as u16 + m - d) % m) as u8;
        }
        Ok(())
    }

    fn error_stats(
        &self,
        orig: FloatView<'_>,
        recon: FloatView<'_>,
        moments: Option<Moments<'_>>,
    ) -> ErrorStats {
        let n = orig.len().min(recon.len());
        let chunks: Vec<ErrorStats> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let mut e = ErrorStats::default();
                for i in c * CHUNK..((c + 1) * CHUNK).min(n) {
                    let (x, y) = (orig.value(i), recon.value(i));
                    if !x.is_finite() || !y.is_finite() {
                        continue;
                    }
                    let d = y - x;
                    e.max_abs = e.max_abs.max(d.abs());
                    e.sum_sq_err += d * d;
                    e.sum_sq += x * x;
                    if let Some(mv) = moments {
                        let (m, v) = (mv.m.value(i), mv.v.value(i));
                        if m.is_finite() && v.is_finite() {
                            e.sum_m_delta += m * d;
                            e.sum_v_delta2 += v * d * d;
                        }
                    }
                }
                e
            })
            .collect();
        // Chunk results are combined in chunk order: the same sums on any thread count.
        ErrorStats::fold(&chunks)
    }
}

/// Where each base code's group starts in the grouped order.
/// Checks the inputs of [`Engine::ungroup_delta`] (every engine does, with this one message):
/// one delta and one output per base code, and every base code below the modulus.
pub fn check_ungroup(
    base: &[u8],
    deltas: &[u8],
    modulus: u8,
    out_len: usize,
) -> Result<(), FormatError> {
    if base.len() != deltas.len() || base.len() != out_len {
        return Err(FormatError::invalid("quant-delta", "code counts differ"));
    }
    if modulus == 0 || base.par_iter().any(|&b| b >= modulus) {
        return Err(FormatError::invalid(
            "quant-delta",
            "a base code is not below the modulus",
        ));
    }
    Ok(())
}

fn group_starts(base: &[u8]) -> [usize; 256] {
    let mut count = [0usize; 256];
    for &b in base {
        count[b as usize] += 1;
    }
    let mut start = [0usize; 256];
    let mut at = 0;
    for g in 0..256 {
        start[g] = at;
        at += count[g];
    }
    start
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn key_stats_sum_exactly_and_ignore_thread_count() {
        let w: Vec<f32> = (0..700_000)
            .map(|i| ((i as f32) * 0.37).sin() * 0.1)
            .collect();
        let m: Vec<f32> = (0..700_000)
            .map(|i| ((i as f32) * 0.11).cos() * 1e-3)
            .collect();
        let v: Vec<f32> = m.iter().map(|x| x * x + 1e-9).collect();
        let (wb, mb, vb) = (f32s(&w), f32s(&m), f32s(&v));
        fn view(bytes: &[u8]) -> FloatView<'_> {
            FloatView {
                dtype: Dtype::F32,
                bytes,
            }
        }
        let run = |threads| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(|| {
                    CpuEngine.key_stats(
                        view(&wb),
                        Some(Moments {
                            m: view(&mb),
                            v: view(&vb),
                        }),
                    )
                })
        };
        let one = run(1);
        assert_eq!(one, run(3));
        assert_eq!(one.count.iter().sum::<u64>(), 700_000);
        let total_w: f64 = one.sums.iter().map(|s| s[sum::W]).sum();
        let exact: f64 = w.iter().map(|&x| x as f64).sum();
        assert!((total_w - exact).abs() < 1e-6, "{total_w} vs {exact}");
        let total_mw: f64 = one.sums.iter().map(|s| s[sum::MW]).sum();
        let exact: f64 = w.iter().zip(&m).map(|(&x, &y)| x as f64 * y as f64).sum();
        assert!((total_mw - exact).abs() < 1e-9);
    }

    #[test]
    fn the_mean_second_moment_alone_equals_the_key_stats_one() {
        let n = 300_000;
        let mut w: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.37).sin()).collect();
        let m: Vec<f32> = (0..n).map(|i| ((i as f32) * 0.11).cos() * 1e-3).collect();
        let mut v: Vec<f32> = m.iter().map(|x| x * x * 7.0 + 1e-12).collect();
        // Elements whose weight or moment is not finite add nothing to either.
        w[5] = f32::NAN;
        v[9] = f32::INFINITY;
        w[70_000] = f32::NEG_INFINITY;
        let (wb, mb, vb) = (f32s(&w), f32s(&m), f32s(&v));
        let view = |bytes| FloatView {
            dtype: Dtype::F32,
            bytes,
        };
        let moments = Moments {
            m: view(&mb),
            v: view(&vb),
        };
        let stats = CpuEngine.key_stats(view(&wb), Some(moments));
        let alone = mean_second_moment(view(&wb), moments);
        assert_eq!(alone.to_bits(), stats.mean_v().to_bits());
        let direct: f64 = (0..n)
            .filter(|&i| i != 5 && i != 9 && i != 70_000)
            .map(|i| v[i] as f64)
            .sum::<f64>()
            / n as f64;
        assert!(
            (alone - direct).abs() <= direct * 1e-9,
            "{alone} vs {direct}"
        );
        assert_eq!(CpuEngine.key_stats(view(&wb), None).mean_v(), 0.0);
    }

    #[test]
    fn grouped_deltas_invert() {
        let base: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 13) as u8).collect();
        let cur: Vec<u8> = (0..10_000u32).map(|i| (i * 5 % 17) as u8).collect();
        let d = CpuEngine.group_delta(&base, &cur, 17);
        // Grouped by base code: the first group holds the elements whose base code is 0.
        let zeros: Vec<u8> = base
            .iter()
            .zip(&cur)
            .filter(|(b, _)| **b == 0)
            .map(|(_, c)| ((17 - *c as u16) % 17) as u8)
            .collect();
        assert_eq!(&d[..zeros.len()], &zeros[..]);
        let mut out = vec![0u8; cur.len()];
        CpuEngine.ungroup_delta(&base, &d, 17, &mut out).unwrap();
        assert_eq!(out, cur);
        assert!(CpuEngine.ungroup_delta(&base, &d, 12, &mut out).is_err());
    }

    #[test]
    fn error_stats_match_a_direct_computation() {
        let a: Vec<f32> = (0..200_000).map(|i| (i as f32 * 0.01).sin()).collect();
        let b: Vec<f32> = a.iter().map(|x| (x * 8.0).round() / 8.0).collect();
        let (ab, bb) = (f32s(&a), f32s(&b));
        let e = CpuEngine.error_stats(
            FloatView {
                dtype: Dtype::F32,
                bytes: &ab,
            },
            FloatView {
                dtype: Dtype::F32,
                bytes: &bb,
            },
            None,
        );
        let max = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (*y as f64 - *x as f64).abs())
            .fold(0.0, f64::max);
        assert_eq!(e.max_abs, max);
        assert!(e.max_abs <= 1.0 / 16.0 + 1e-7);
        assert!(e.rel_l2() > 0.0 && e.rel_l2() < 0.1);
    }
}
