//! The hot kernels of the codecs behind one trait, so a GPU implementation can stand in for the
//! CPU one: float planes (split, XOR or subtract, histogram, Huffman-code, decode, merge) and
//! the lossy codecs' key histograms, lookups, grouped deltas and error sums, and the residual
//! quantizer's distance, step statistics and encode. Every kernel's
//! result is a function of its input alone — never of thread count, scheduling or device —
//! because what it computes ends up in stored bytes: sums are taken in fixed point (integer
//! addition is associative) or in a fixed chunk order, and coded chunks are defined bit for bit
//! by their symbols and code. What is decided from the kernels' results (codes, plans, record
//! layout) stays in shared code ([`crate::float`], [`crate::quant`], [`crate::qrecord`]).

mod cpu;
mod stats;

use std::sync::Arc;

use mdl_format::{Dtype, FormatError, ObjectId, TensorHasher};

use crate::huffman::{Histogram, Stream, StreamWriter};
use crate::planes::PlaneSpec;
use crate::residual::{self, ResidualStats};

pub use crate::tensor::{ErrorStats, FloatView, Moments};
pub use cpu::{check_ungroup, CpuEngine};
pub use stats::{mean_second_moment, scales, sum, KeyStats};

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

/// Where a copy of some host bytes already lies in a CUDA device's memory: the device's
/// ordinal and the copy's address in the process's primary context (where PyTorch's tensors
/// live). Given to [`Engine::adopt`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceCopy {
    /// The CUDA device.
    pub ordinal: usize,
    /// The first byte's device address.
    pub address: u64,
}

/// How [`Engine::mirror_into`] left the device copy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mirror {
    /// Written in place by the engine's kernels as they decoded, and verified there: what
    /// crossed to the device was the coded bytes (and, for a delta, its base). The host
    /// buffer's contents are unspecified.
    Written,
    /// Filled on the host (in part or whole) and copied over.
    Copied,
    /// The engine is not on that device: nothing was copied.
    NotMine,
    /// `fill` failed: the device copy is unspecified.
    Failed,
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

/// Elements per chunk of the chunked kernels (fixed: it defines the summation order).
const CHUNK: usize = 1 << 16;

/// Elements per chunk of [`Engine::error_stats`]: each chunk is summed in index order, and the
/// chunks' sums are combined by [`ErrorStats::fold`].
pub const ERROR_CHUNK: usize = CHUNK;

/// A whole tensor's counts ([`Engine::whole_counts`]).
#[derive(Clone, Debug)]
pub struct WholeCounts {
    /// Its sample's: every plane's symbols, and the flags of the planes that want them.
    pub sample: Vec<(Histogram, Histogram)>,
    /// All its elements': every plane's symbols and flags.
    pub all: Vec<(Histogram, Histogram)>,
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

    /// Like [`Engine::keep`], for bytes of which `copy` already holds a device copy (the
    /// caller's; it must stay unchanged while the guard lives): an engine on that device
    /// computes on that copy instead of copying the bytes over. Others ignore it.
    fn adopt<'a>(&'a self, bytes: &'a [u8], copy: DeviceCopy) -> Kept<'a> {
        let _ = (bytes, copy);
        Kept::nothing()
    }

    /// Keeps `content` where the engine computes for as long as the guard lives, however long
    /// that is (the guard holds `content`): what a process committing repeatedly keeps of its
    /// last commit, the next commit's delta bases. `like`, when given, holds the same bytes;
    /// if the engine already keeps those ([`Engine::adopt`], [`Engine::keep`]), it copies
    /// from there rather than from the host. An engine short of room keeps nothing.
    fn keep_shared(&self, content: &Arc<Vec<u8>>, like: Option<&[u8]>) -> Kept<'static> {
        let _ = (content, like);
        Kept::nothing()
    }

    /// Fills `out` by calling `fill` (a decode: true when it succeeded, its content verified
    /// by [`Engine::content_id`]) and leaves the result at `copy` in device memory, if the
    /// engine is on that device: its decode kernels write there instead of into `out`
    /// ([`Mirror::Written`]); what other code wrote into `out` is copied over after
    /// ([`Mirror::Copied`]). [`Mirror::NotMine`] (the default): nothing was copied, `out`
    /// holds the result, the caller copies.
    fn mirror_into(
        &self,
        out: &mut [u8],
        copy: DeviceCopy,
        fill: &mut dyn FnMut(&mut [u8]) -> bool,
    ) -> Mirror {
        let _ = copy;
        if fill(out) {
            Mirror::NotMine
        } else {
            Mirror::Failed
        }
    }

    /// The id of content `data` after the canonical header `prefix`
    /// ([`TensorHeader::canonical`]; [`TensorHeader::object_id`] of the two). An engine that
    /// has `data` on its device hashes it there (kept, adopted, or a load it decoded onto the
    /// device, [`Engine::mirror_into`]): only the id comes back.
    fn content_id(&self, prefix: &[u8], data: &[u8]) -> ObjectId {
        let mut h = TensorHasher::new(prefix);
        h.update(data);
        h.finalize()
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

    /// [`Engine::content_id`] of each `(prefix, data)`, all at once: an engine on a device
    /// hashes them all before it waits for their ids.
    fn content_ids(&self, items: &[(&[u8], &[u8])]) -> Vec<ObjectId> {
        items
            .iter()
            .map(|&(prefix, data)| self.content_id(prefix, data))
            .collect()
    }

    /// What a whole tensor's count is made of ([`crate::float::count_whole`]), for each
    /// `(spec, data)` at once (no base): the counts of its sample, as
    /// [`Engine::sample_histograms`] makes them, and every plane's symbols and flags over all
    /// its elements.
    fn whole_counts(&self, items: &[(PlaneSpec, &[u8])]) -> Vec<WholeCounts> {
        items
            .iter()
            .map(|&(spec, data)| {
                let (width, planes) = spec.shape().unwrap_or((1, 0));
                let sample = crate::planes::sample_len(data.len() / width) * width;
                WholeCounts {
                    sample: self.sample_histograms(spec, &data[..sample], None),
                    all: self.plane_histograms(spec, data, None, &vec![(true, true); planes]),
                }
            })
            .collect()
    }

    /// [`Engine::encode_planes`] of each `(spec, data, writers)` (no base), all at once: an
    /// engine on a device runs each pass for every tensor before it waits.
    /// `result[tensor][plane][chunk]`.
    fn encode_many(&self, items: &[(PlaneSpec, &[u8], &[StreamWriter])]) -> Vec<Vec<Vec<Vec<u8>>>> {
        items
            .iter()
            .map(|&(spec, data, writers)| self.encode_planes(spec, data, None, writers))
            .collect()
    }

    /// Whether `data`'s planes are best split on the host, once for their counts and their
    /// codes ([`Engine::split_planes`], [`Engine::encode_split`]), rather than counted and
    /// coded where the engine computes ([`Engine::plane_histograms`],
    /// [`Engine::encode_planes`]): the same bytes either way. True for the CPU; an engine on
    /// a device says false for what it would take there, so that the work goes to it.
    fn splits_on_host(&self, data: &[u8]) -> bool {
        let _ = data;
        true
    }

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

    /// The mean second moment of `w`'s elements ([`mean_second_moment`]): what a residual
    /// search needs of the key statistics. The same bits on every engine.
    fn mean_second_moment(&self, w: FloatView<'_>, moments: Moments<'_>) -> f64;

    /// How far `values` moved from `reference` ([`crate::residual::distance_sq`]).
    fn residual_distance(&self, values: FloatView<'_>, reference: Option<&[u8]>) -> f64;

    /// [`crate::residual::measure_steps`]: the statistics of quantizing `values` against
    /// `reference` at each of `steps`, on every `every`-th block; with `factors` (linear mode
    /// only), [`crate::residual::measure_stepped`].
    #[allow(clippy::too_many_arguments)]
    fn residual_measure(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        moments: Option<Moments<'_>>,
        mode: residual::Mode,
        factors: Option<&residual::Steps>,
        steps: &[f64],
        every: usize,
    ) -> Vec<ResidualStats>;

    /// [`crate::residual::encode`]: the payload and the reconstruction of `values` quantized
    /// against `reference` at `step`; with `factors` (linear mode only), a stepped payload
    /// ([`crate::residual::encode_stepped`]).
    fn residual_encode(
        &self,
        values: FloatView<'_>,
        reference: Option<&[u8]>,
        mode: residual::Mode,
        factors: Option<&residual::Steps>,
        step: f64,
    ) -> (Vec<u8>, Vec<u8>);

    /// [`crate::residual::decode`]: a residual payload of `dtype` decoded into `out` against
    /// `reference` (none for `quant-uniform`). Fails on a damaged payload.
    fn residual_decode(
        &self,
        dtype: Dtype,
        payload: &[u8],
        reference: Option<&[u8]>,
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
