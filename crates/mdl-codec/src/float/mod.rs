//! `float-split`, `xor-delta` and `sub-delta`: floats taken apart into byte planes
//! ([`crate::planes`]), each plane entropy-coded with the chunked Huffman coder (or stored, or
//! constant — whichever is smallest). `xor-delta` splits `value ^ base` (the base being an
//! object of the same dtype and shape), plane by plane where that codes smaller: where little
//! changed, every plane is mostly zeros. `sub-delta` codes the integer difference instead.
//!
//! All planes share one chunking, so chunk `i` of the tensor is decoded from chunk `i` of each
//! plane, in parallel.

use mdl_format::{Dtype, FormatError};

use crate::engine::{Engine, WholeCounts};
use crate::huffman::{Histogram, Plan};
use crate::planes::{layout, sub_layout, word_mask, Layout, PlaneSpec, Transform, CHUNK, SAMPLE};

mod framed;
mod mask;
mod masked;
mod payload;
mod scan;

pub use framed::{is_framed, FrameEncoder, Frames, FRAME_CHUNKS, FRAME_LOG2};
pub use masked::{encode_masked, invert as invert_masked, is_masked, DeltaPayload, MaskedDelta};
pub use payload::{
    encode, encode_pieces, encode_split, encode_whole, Encoded, PayloadIndex, PayloadWriter, ReadAt,
};

/// Decodes a payload into `out` (whose length is the tensor's byte length), XORing the planes
/// the payload says with `base`.
pub fn decode(
    engine: &dyn Engine,
    dtype: Dtype,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    decode_any(engine, PlaneSpec::planes(dtype, 0), payload, base, out)
}

/// Decodes a `sub-delta` payload against `base` into `out`.
pub fn decode_sub(
    engine: &dyn Engine,
    dtype: Dtype,
    payload: &[u8],
    base: &[u8],
    out: &mut [u8],
) -> Result<(), FormatError> {
    decode_any(engine, PlaneSpec::sub(dtype), payload, Some(base), out)
}

/// Decodes a payload held in memory, framed (`framed.rs`), masked (`masked.rs`) or whole
/// (`payload.rs`).
fn decode_any(
    engine: &dyn Engine,
    spec: PlaneSpec,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    if masked::is_masked(payload) {
        masked::decode(spec, payload, base, out)
    } else if framed::is_framed(payload) {
        framed::decode(engine, spec, payload, base, out)
    } else {
        payload::decode_whole(engine, spec, payload, base, out)
    }
}

/// A masked delta under this fraction of the tensor's bytes is taken without counting the
/// tensor's planes: no float-split or plane-by-plane delta of it comes close.
pub const MASKED_AT_ONCE: usize = 8;

/// The smallest delta payload of `data` against `base` (both held whole): plane by plane
/// ([`analyze`]'s best delta) or masked ([`encode_masked`]), whichever is smaller; `None` when
/// neither codes smaller than float-split. A masked delta under [`MASKED_AT_ONCE`] of the
/// tensor is taken without counting the rest.
pub fn encode_delta(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<Option<DeltaPayload>, FormatError> {
    let masked = encode_masked(dtype, data, base)?;
    if let Some(m) = masked.as_ref() {
        if m.payload.len() < data.len() / MASKED_AT_ONCE {
            return Ok(masked);
        }
    }
    let analysis = analyze(engine, dtype, data, Some(base))?;
    let masked = masked.filter(|m| (m.payload.len() as u64) < analysis.plain.size);
    let planes = analysis.best_delta();
    if let Some(m) = masked.filter(|m| planes.is_none_or(|c| (m.payload.len() as u64) < c.size)) {
        return Ok(Some(m));
    }
    let Some(choice) = planes else {
        return Ok(None);
    };
    let mut payload = Vec::new();
    encode(engine, dtype, data, Some(base), choice, &mut payload)?;
    Ok(Some(DeltaPayload {
        payload,
        transform: choice.transform,
    }))
}

/// Whether `dtype` has a float plane layout.
pub fn supports(dtype: Dtype) -> bool {
    layout(dtype).is_some()
}

/// How to hold one tensor: per plane, whether it is XORed with the base and how it is coded.
#[derive(Clone, Debug)]
pub struct Choice {
    plans: Vec<Plan>,
    /// Which planes these are.
    pub transform: Transform,
    /// Bit `p` set: plane `p` holds `value ^ base` rather than `value`.
    pub xor_mask: u8,
    /// Plane sizes in bytes, in plane order.
    pub plane_bytes: Vec<u64>,
    /// Order-0 entropy of each plane as chosen, in bits (the bound this payload is near).
    pub plane_entropy_bits: Vec<f64>,
    /// Payload size in bytes (exact to within one byte per plane chunk).
    pub size: u64,
}

/// What [`analyze`] found.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// `float-split`: every plane from the value itself.
    pub plain: Choice,
    /// `xor-delta` against the base given to [`analyze`]: each plane from the value or from
    /// `value ^ base`, whichever codes smaller (`None` without a base, or when no plane gains).
    pub delta: Option<Choice>,
    /// `sub-delta` against the base given to [`analyze`] (`None` without a base).
    pub sub: Option<Choice>,
}

impl Analysis {
    /// The smallest delta encoding, if any is smaller than `float-split`.
    pub fn best_delta(&self) -> Option<&Choice> {
        [self.delta.as_ref(), self.sub.as_ref()]
            .into_iter()
            .flatten()
            .filter(|c| c.size < self.plain.size)
            .min_by_key(|c| c.size)
    }
}

fn check_lengths(l: &Layout, data: &[u8], base: Option<&[u8]>) -> Result<(), FormatError> {
    if !data.len().is_multiple_of(l.width) {
        return Err(FormatError::invalid(
            "float tensor",
            "length is not a whole number of elements",
        ));
    }
    if base.is_some_and(|b| b.len() != data.len()) {
        return Err(FormatError::invalid(
            "delta",
            "base length differs from the tensor's",
        ));
    }
    Ok(())
}

/// Entropy, in bits a symbol, above which a sampled plane is taken to be noise and stored
/// without counting the rest of it (uniform bytes carry 8 bits; Huffman cannot gain there).
const NOISE_BITS: f64 = 7.97;

/// What the analysis pass counted for one plane.
#[derive(Clone)]
struct PlaneStats {
    /// Symbol counts (of the sample only when `counted` is false).
    hist: Histogram,
    /// Counts of sparse-mode flag bytes, where zeros are common enough to matter.
    flags: Option<Histogram>,
    /// Whether `hist` covers the whole plane; otherwise the plane looked like noise.
    counted: bool,
}

/// Per-plane statistics of a tensor (XORed with a base under `spec.mask`, or subtracted),
/// counted a window of whole chunks at a time; counts add exactly, so any windowing gives the
/// same result. Planes whose sample (the first [`sample_len`](crate::planes::sample_len)
/// elements) looks like noise are not counted further (they will be stored raw); planes with
/// many zeros also get their sparse-mode flag counts.
#[derive(Clone)]
pub struct PlaneCount {
    l: Layout,
    spec: PlaneSpec,
    /// The planes XORed with the base ([`Count::Masked`]).
    xor_mask: u8,
    /// Whether the count is against a base.
    with_base: bool,
    /// Elements counted.
    n: u64,
    /// The sample's counts (symbols and flags of every plane).
    sample: Vec<(Histogram, Histogram)>,
    /// Per plane, `(symbols, flags)`: what is counted after the sample decided.
    want: Vec<(bool, bool)>,
    totals: Vec<(Histogram, Histogram)>,
}

/// Which planes a [`PlaneCount`] counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Count {
    /// `float-split`: the value's own planes.
    Plain,
    /// Every float plane XORed with the base (what `xor-delta` chooses from, plane by plane).
    Xor,
    /// `sub-delta`: the planes of the difference from the base.
    Sub,
    /// `xor-delta` with these planes (bit `p`: plane `p`) XORed with the base.
    Masked(u8),
}

impl PlaneCount {
    /// A count of a `dtype` tensor's planes of kind `count`.
    pub fn new(dtype: Dtype, count: Count) -> Result<PlaneCount, FormatError> {
        let not_float = || FormatError::invalid("float-split", "not a float dtype");
        let spec = match count {
            Count::Plain => PlaneSpec::planes(dtype, 0),
            Count::Xor => PlaneSpec::planes(dtype, u64::MAX),
            Count::Sub => PlaneSpec::sub(dtype),
            Count::Masked(m) => {
                PlaneSpec::planes(dtype, word_mask(&layout(dtype).ok_or_else(not_float)?, m))
            }
        };
        let l = crate::planes::spec_layout_of(spec).ok_or_else(not_float)?;
        let xor_mask = match count {
            Count::Masked(m) => m,
            _ => 0,
        };
        Ok(Self::of(&l, spec, xor_mask, count != Count::Plain))
    }

    fn of(l: &Layout, spec: PlaneSpec, xor_mask: u8, with_base: bool) -> PlaneCount {
        PlaneCount {
            l: *l,
            spec,
            xor_mask,
            with_base,
            n: 0,
            sample: Vec::new(),
            want: Vec::new(),
            totals: vec![(Histogram::default(), Histogram::default()); l.planes],
        }
    }

    /// Counts the next window of the tensor (whole chunks, but for the tensor's last) and of
    /// its base (given exactly when the count is against a base).
    pub fn add(
        &mut self,
        engine: &dyn Engine,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Result<(), FormatError> {
        self.check_window(data, base)?;
        let (n, width) = (data.len() / self.l.width, self.l.width);
        let (spec, step) = (self.spec, crate::planes::sample_len(n) * width);
        self.absorb(
            n as u64,
            step == data.len(),
            || engine.sample_histograms(spec, &data[..step], base.map(|b| &b[..step])),
            |want, skip| {
                let from = skip * width;
                engine.plane_histograms(spec, &data[from..], base.map(|b| &b[from..]), want)
            },
        );
        Ok(())
    }

    /// [`Self::add`], splitting the window into `planes` on the way (buffers reused from call
    /// to call), from which the counts are taken — the same counts — and [`encode_split`]
    /// codes: a window split once for both.
    pub fn add_splitting(
        &mut self,
        engine: &dyn Engine,
        data: &[u8],
        base: Option<&[u8]>,
        planes: &mut Vec<Vec<u8>>,
    ) -> Result<(), FormatError> {
        self.check_window(data, base)?;
        engine.split_planes(self.spec, data, base, planes);
        let split: Vec<&[u8]> = planes.iter().map(Vec::as_slice).collect();
        self.add_split(&split)
    }

    /// Counts a whole tensor of `n` elements from its [`WholeCounts`]: what [`Self::add`] of
    /// the tensor as one window counts (the sample decides what is wanted; the rest is the
    /// whole's counts less the sample's, which add back exactly).
    fn add_whole(&mut self, n: u64, counts: WholeCounts) {
        let WholeCounts { sample, all } = counts;
        let minus =
            |a: &Histogram, b: &Histogram| Histogram(std::array::from_fn(|k| a.0[k] - b.0[k]));
        let rest: Vec<(Histogram, Histogram)> = (all.iter().zip(&sample))
            .map(|((a, af), (s, sf))| (minus(a, s), minus(af, sf)))
            .collect();
        let only_the_sample = crate::planes::sample_len(n as usize) as u64 == n;
        self.absorb(
            n,
            only_the_sample,
            || sample,
            |want, _| {
                let none = Histogram::default;
                (rest.into_iter().zip(want))
                    .map(|((h, f), &(symbols, flags))| {
                        (
                            if symbols { h } else { none() },
                            if flags { f } else { none() },
                        )
                    })
                    .collect()
            },
        );
    }

    /// Whether `data` and `base` make a window of this count.
    fn check_window(&self, data: &[u8], base: Option<&[u8]>) -> Result<(), FormatError> {
        check_lengths(&self.l, data, base)?;
        if base.is_some() != self.with_base {
            return Err(FormatError::invalid(
                "delta",
                "base given where none is counted",
            ));
        }
        Ok(())
    }

    /// [`Self::add`] of a window already split into its planes (as this count's spec
    /// splits); the counts are the same.
    fn add_split(&mut self, planes: &[&[u8]]) -> Result<(), FormatError> {
        let n = planes.first().map_or(0, |p| p.len());
        if planes.len() != self.l.planes || planes.iter().any(|p| p.len() != n) {
            return Err(FormatError::invalid(
                "float tensor",
                "planes of another count or length",
            ));
        }
        self.absorb(
            n as u64,
            n <= crate::planes::SAMPLE,
            || crate::planes::split_sample(planes),
            |want, skip| {
                let rest: Vec<&[u8]> = planes.iter().map(|p| &p[skip..]).collect();
                crate::planes::split_histograms(&rest, want)
            },
        );
        Ok(())
    }

    /// Adds a window of `n` elements: on the first window, the counts of its first
    /// [`sample_len`](crate::planes::sample_len) elements (`sample`: every plane's symbols,
    /// and flags where they are wanted) decide what is counted from then on; `count(want,
    /// skip)` counts the window for that from its element `skip` on (the first window's sample
    /// is not counted twice: counts add exactly, and the sample's flag groups of 8 symbols end
    /// where the rest's begin). A first window no longer than the sample is counted once, as it.
    fn absorb(
        &mut self,
        n: u64,
        only_the_sample: bool,
        sample: impl FnOnce() -> Vec<(Histogram, Histogram)>,
        count: impl FnOnce(&[(bool, bool)], usize) -> Vec<(Histogram, Histogram)>,
    ) {
        let counts = if self.sample.is_empty() {
            self.sample = sample();
            self.want = wanted(&self.sample);
            if only_the_sample {
                self.sample.clone()
            } else {
                let skip = crate::planes::sample_len(n as usize);
                let mut counts = count(&self.want, skip);
                for (((c, cf), (s, sf)), &(symbols, flags)) in
                    counts.iter_mut().zip(&self.sample).zip(&self.want)
                {
                    if symbols {
                        c.add(s);
                    }
                    if flags {
                        cf.add(sf);
                    }
                }
                counts
            }
        } else {
            count(&self.want, 0)
        };
        for ((t, tf), (c, cf)) in self.totals.iter_mut().zip(&counts) {
            t.add(c);
            tf.add(cf);
        }
        self.n += n;
    }

    /// Bytes of tensor counted so far.
    pub fn counted_bytes(&self) -> u64 {
        self.n * self.l.width as u64
    }

    /// How to hold the planes counted: for [`Count::Plain`], [`Count::Sub`] and
    /// [`Count::Masked`], once the whole tensor is counted.
    pub fn choice(&self) -> Choice {
        let stats = self.stats();
        let refs: Vec<&PlaneStats> = stats.iter().collect();
        choice(&self.l, self.spec.transform, self.n, &refs, self.xor_mask)
    }

    fn stats(&self) -> Vec<PlaneStats> {
        let none = (Histogram::default(), Histogram::default());
        (0..self.l.planes)
            .map(|p| {
                let (symbols, flags) = self.want.get(p).copied().unwrap_or((true, false));
                let (h, f) = &self.totals[p];
                PlaneStats {
                    hist: if symbols {
                        h.clone()
                    } else {
                        self.sample.get(p).unwrap_or(&none).0.clone()
                    },
                    flags: flags.then(|| f.clone()),
                    counted: symbols,
                }
            })
            .collect()
    }
}

/// The plain counts ([`Count::Plain`]) of several whole tensors `(dtype, data)`, with one
/// call of the engine ([`Engine::whole_counts`]): the counts [`PlaneCount::add`] makes of each.
pub fn count_whole(
    engine: &dyn Engine,
    items: &[(Dtype, &[u8])],
) -> Result<Vec<PlaneCount>, FormatError> {
    let mut counts = Vec::with_capacity(items.len());
    for &(dtype, data) in items {
        let count = PlaneCount::new(dtype, Count::Plain)?;
        check_lengths(&count.l, data, None)?;
        counts.push(count);
    }
    let jobs: Vec<(PlaneSpec, &[u8])> = (counts.iter().zip(items))
        .map(|(c, &(_, data))| (c.spec, data))
        .collect();
    for ((count, whole), &(_, data)) in counts.iter_mut().zip(engine.whole_counts(&jobs)).zip(items)
    {
        let n = (data.len() / count.l.width) as u64;
        count.add_whole(n, whole);
    }
    Ok(counts)
}

/// Per plane, whether its symbols and its flags are worth counting past the sample, from the
/// sample's counts: a plane that looks like noise is not (it will be stored raw).
fn wanted(sample: &[(Histogram, Histogram)]) -> Vec<(bool, bool)> {
    sample
        .iter()
        .map(|(h, _)| {
            let noise = h.entropy_bits() >= NOISE_BITS * h.total() as f64;
            (!noise, !noise && Plan::wants_flags(h))
        })
        .collect()
}

fn choice(l: &Layout, transform: Transform, n: u64, stats: &[&PlaneStats], xor_mask: u8) -> Choice {
    let mut plans = Vec::with_capacity(l.planes);
    let mut plane_bytes = Vec::with_capacity(l.planes);
    let mut plane_entropy_bits = Vec::with_capacity(l.planes);
    for st in stats {
        let (plan, size) = if st.counted {
            Plan::choose(&st.hist, st.flags.as_ref())
        } else {
            (Plan::Stored, n + 1)
        };
        plans.push(plan);
        plane_bytes.push(size);
        // Sampled planes: the sample's entropy a symbol, scaled to the plane.
        plane_entropy_bits.push(st.hist.entropy_bits() * n as f64 / st.hist.total().max(1) as f64);
    }
    Choice {
        plans,
        transform,
        xor_mask,
        size: 2 + 8 * l.planes as u64 + plane_bytes.iter().sum::<u64>(),
        plane_bytes,
        plane_entropy_bits,
    }
}

/// Splits `data` into planes (and, with a base, `data ^ base` too) and chooses how to hold
/// each. Nothing is encoded yet; [`Choice::size`] is what [`encode`] will produce.
pub fn analyze(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: Option<&[u8]>,
) -> Result<Analysis, FormatError> {
    let l = float_layout(dtype)?;
    check_lengths(&l, data, base)?;
    let mut plain = PlaneCount::new(dtype, Count::Plain)?;
    plain.add(engine, data, None)?;
    let mut deltas = Vec::new();
    if let Some(b) = base {
        for count in deltas_to_count(engine, dtype, data, b)? {
            let mut c = PlaneCount::new(dtype, count)?;
            c.add(engine, data, Some(b))?;
            deltas.push(c);
        }
    }
    Ok(analysis_of(&plain, &deltas))
}

/// Which deltas against a base are worth counting in full, judged from the tensor's first
/// window `data` (at least its first chunk, or all of it) and the base's: on tensors of several
/// chunks, the one whose first chunk codes smaller (counting both would cost a whole extra pass
/// for nothing).
pub fn deltas_to_count(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<Vec<Count>, FormatError> {
    let l = float_layout(dtype)?;
    check_lengths(&l, data, Some(base))?;
    if data.len() <= CHUNK * l.width {
        return Ok(vec![Count::Xor, Count::Sub]);
    }
    let s = sample_delta_sizes(engine, dtype, &l, data, base, CHUNK);
    Ok(vec![if s.xor < s.sub {
        Count::Xor
    } else {
        Count::Sub
    }])
}

/// The plane layout of a float `dtype`; an error for any other.
fn float_layout(dtype: Dtype) -> Result<Layout, FormatError> {
    layout(dtype).ok_or(FormatError::invalid("float-split", "not a float dtype"))
}

/// What [`delta_to_count`] found worth counting of a tensor against its base.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToCount {
    /// A tensor of 32 Ki elements or fewer: its planes and every delta, all of it (as cheap
    /// as a sample).
    Everything,
    /// The delta whose first 32 Ki elements code smallest: [`Count::Sub`], or
    /// [`Count::Masked`] with the planes that code smaller XORed.
    Delta(Count),
    /// No delta's first 32 Ki elements code smaller than the planes taken as they are.
    Nothing,
}

/// The one delta of `data` against `base` worth counting, judged from their first windows (at
/// least the first 32 Ki elements of each, or all of it): the delta and, for xor-delta,
/// which planes to XOR, chosen on those elements, so that the rest is counted once, as it will
/// be coded.
pub fn delta_to_count(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<ToCount, FormatError> {
    let l = float_layout(dtype)?;
    check_lengths(&l, data, Some(base))?;
    match delta_sample_bytes(dtype, data.len()) {
        None => Ok(ToCount::Everything),
        Some(n) => delta_to_count_on_sample(engine, dtype, &data[..n], &base[..n]),
    }
}

/// How many of the first bytes of a tensor of `len` bytes [`delta_to_count`] judges it on;
/// `None` when it counts all of it ([`ToCount::Everything`]) or `dtype` is not a float.
pub fn delta_sample_bytes(dtype: Dtype, len: usize) -> Option<usize> {
    let n = SAMPLE * layout(dtype)?.width;
    (len > n).then_some(n)
}

/// [`delta_to_count`] of a tensor longer than its sample, from the sample alone: the first
/// [`delta_sample_bytes`] bytes of the tensor and of its base, so that a caller can judge a
/// stored pair before decoding the rest. Never [`ToCount::Everything`].
pub fn delta_to_count_on_sample(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<ToCount, FormatError> {
    let l = float_layout(dtype)?;
    if data.len() != SAMPLE * l.width || base.len() != data.len() {
        return Err(FormatError::invalid(
            "delta sample",
            "not the first 32 Ki elements of a tensor and its base",
        ));
    }
    let s = sample_delta_sizes(engine, dtype, &l, data, base, SAMPLE);
    Ok(if s.sub <= s.xor && s.sub < s.plain {
        ToCount::Delta(Count::Sub)
    } else if s.xor_mask != 0 {
        ToCount::Delta(Count::Masked(s.xor_mask))
    } else {
        ToCount::Nothing
    })
}

/// The choices that counts of the whole tensor give: `plain` of kind [`Count::Plain`], and
/// `deltas` of the other kinds against a base.
pub fn analysis_of(plain: &PlaneCount, deltas: &[PlaneCount]) -> Analysis {
    let (l, n) = (&plain.l, plain.n);
    let plain_h = plain.stats();
    let plain_choice = choice(
        l,
        Transform::Planes,
        n,
        &plain_h.iter().collect::<Vec<_>>(),
        0,
    );
    let of = |t: Transform, mask: bool| {
        deltas
            .iter()
            .find(|d| d.spec.transform == t && (d.spec.mask != 0) == mask)
            .map(PlaneCount::stats)
    };
    let delta = of(Transform::Planes, true).and_then(|xor_h| {
        let xor = choice(
            l,
            Transform::Planes,
            n,
            &xor_h.iter().collect::<Vec<_>>(),
            0,
        );
        let mut mask = 0u8;
        let mut picked = Vec::with_capacity(l.planes);
        for p in 0..l.planes {
            if xor.plane_bytes[p] < plain_choice.plane_bytes[p] {
                mask |= 1 << p;
                picked.push(&xor_h[p]);
            } else {
                picked.push(&plain_h[p]);
            }
        }
        (mask != 0).then(|| choice(l, Transform::Planes, n, &picked, mask))
    });
    let sub = deltas
        .iter()
        .find(|d| d.spec.transform == Transform::Sub)
        .map(|d| {
            let stats = d.stats();
            choice(
                &d.l,
                Transform::Sub,
                n,
                &stats.iter().collect::<Vec<_>>(),
                0,
            )
        });
    Analysis {
        plain: plain_choice,
        delta,
        sub,
    }
}

/// Estimated sizes of a tensor's first elements ([`sample_delta_sizes`]).
struct SampleSizes {
    /// Its planes as they are.
    plain: u64,
    /// As xor-delta, each plane XORed or not, whichever is smaller.
    xor: u64,
    /// The planes XORed in `xor`.
    xor_mask: u8,
    /// As sub-delta (`u64::MAX` where the dtype has none).
    sub: u64,
}

/// Estimated sizes of the first `n` elements as planes, as xor-delta and as sub-delta.
fn sample_delta_sizes(
    engine: &dyn Engine,
    dtype: Dtype,
    l: &Layout,
    data: &[u8],
    base: &[u8],
    n: usize,
) -> SampleSizes {
    let step = n * l.width;
    let (first, base) = (&data[..step], &base[..step]);
    let sizes = |spec: PlaneSpec, b: Option<&[u8]>| -> Vec<u64> {
        engine
            .sample_histograms(spec, first, b)
            .iter()
            .map(|(h, f)| Plan::choose(h, Plan::wants_flags(h).then_some(f)).1)
            .collect()
    };
    let plain = sizes(PlaneSpec::planes(dtype, 0), None);
    let xor = sizes(PlaneSpec::planes(dtype, u64::MAX), Some(base));
    let xor_mask = (0..l.planes)
        .filter(|&p| xor[p] < plain[p])
        .fold(0u8, |m, p| m | 1 << p);
    SampleSizes {
        plain: plain.iter().sum(),
        xor: plain.iter().zip(&xor).map(|(p, x)| *p.min(x)).sum(),
        xor_mask,
        sub: match sub_layout(dtype) {
            Some(_) => sizes(PlaneSpec::sub(dtype), Some(base)).iter().sum(),
            None => u64::MAX,
        },
    }
}

/// Counts the `sub-delta` planes of `data` against `base` and chooses how to hold each.
pub fn analyze_sub(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<Choice, FormatError> {
    count_and_choose(engine, dtype, Count::Sub, data, base)
}

/// One counting pass of `data` against `base`, and the resulting choice.
fn count_and_choose(
    engine: &dyn Engine,
    dtype: Dtype,
    count: Count,
    data: &[u8],
    base: &[u8],
) -> Result<Choice, FormatError> {
    let mut c = PlaneCount::new(dtype, count)?;
    c.add(engine, data, Some(base))?;
    Ok(c.choice())
}

#[cfg(test)]
mod tests;
