//! Byte planes: how a float tensor is taken apart for entropy coding and put back together,
//! and the CPU kernels that do it (the GPU engine has its own). What is coded from the planes
//! and how the payload is laid out stays in [`crate::float`].
//!
//! Float planes, per dtype (bit numbers of the little-endian word):
//!
//! | dtype | planes |
//! | --- | --- |
//! | bf16 | exponent `14..7`; sign `15` with mantissa `6..0` |
//! | f16 | exponent `14..10`; mantissa `7..0`; sign `15` with mantissa `9..8` |
//! | f32 | exponent `30..23`; sign `31` with mantissa `22..16`; mantissa `15..8`; mantissa `7..0` |
//! | f64 | exponent `59..52`; exponent `62..60`, sign, mantissa `51..48`; six mantissa bytes |
//!
//! Every bit lands in exactly one plane, so any bit pattern (±0, subnormals, ±Inf, every NaN
//! payload) survives. With a base, chosen bits of each word are XORed with the base's first
//! ([`PlaneSpec::mask`]); the `sub` planes instead hold the bytes of the zigzagged integer
//! difference from the base.
//!
//! Work is split into chunks of `1 << CHUNK_LOG2` elements; all planes share the chunking, so
//! chunk `i` of the tensor is split from, and merged into, chunk `i` of each plane.

use mdl_format::{Dtype, FormatError};
use rayon::prelude::*;

use crate::huffman::{flag_histogram, Histogram, Plan, Stream, StreamWriter, CHUNK_LOG2};

/// Elements in one chunk of every plane.
pub(crate) const CHUNK: usize = 1 << CHUNK_LOG2;

thread_local! {
    /// Plane buffers reused across chunks (fresh ones would be zeroed and faulted in each time).
    static SCRATCH: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` with a scratch buffer of `len` bytes (contents unspecified). The buffer is taken out
/// of the thread's slot for the call, so a nested use (rayon may run another task on this
/// thread while `f` waits) gets its own.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    let mut buf = SCRATCH.take();
    if buf.len() < len {
        buf.resize(len, 0);
    }
    let r = f(&mut buf[..len]);
    SCRATCH.set(buf);
    r
}

/// Splits elements into planes: `(data, planes, base, base bits to XOR in)`.
type SplitFn = fn(&[u8], &mut [&mut [u8]], Option<&[u8]>, u64);
/// Merges planes back into elements: `(planes, out, base, base bits to XOR in)`.
type MergeFn = fn(&[&[u8]], &mut [u8], Option<&[u8]>, u64);

#[derive(Clone, Copy)]
pub(crate) struct Layout {
    /// Bytes an element.
    pub(crate) width: usize,
    /// How many planes.
    pub(crate) planes: usize,
    split: SplitFn,
    merge: MergeFn,
    /// The bits of the little-endian word each plane holds.
    plane_bits: &'static [u64],
}

pub(crate) fn layout(dtype: Dtype) -> Option<Layout> {
    Some(match dtype {
        Dtype::BF16 => Layout {
            width: 2,
            planes: 2,
            split: split_bf16,
            merge: merge_bf16,
            plane_bits: &[0x7f80, 0x807f],
        },
        Dtype::F16 => Layout {
            width: 2,
            planes: 3,
            split: split_f16,
            merge: merge_f16,
            plane_bits: &[0x7c00, 0x00ff, 0x8300],
        },
        Dtype::F32 => Layout {
            width: 4,
            planes: 4,
            split: split_f32,
            merge: merge_f32,
            plane_bits: &[0x7f80_0000, 0x807f_0000, 0xff00, 0xff],
        },
        Dtype::F64 => Layout {
            width: 8,
            planes: 8,
            split: split_f64,
            merge: merge_f64,
            plane_bits: &[
                0x0ff0 << 48,
                0xf00f << 48,
                0xff << 40,
                0xff << 32,
                0xff << 24,
                0xff << 16,
                0xff << 8,
                0xff,
            ],
        },
        _ => return None,
    })
}

// The split and merge loops below are written as zipped iterators over exact chunks, one loop
// without a base and one with, so the compiler sees no bounds checks and vectorizes them.

/// Loops over the elements of `$data` (and of `$base`, XORed in under `$mask`) as `$ty` words.
macro_rules! for_words {
    ($ty:ty, $data:expr, $base:expr, $mask:expr, |$w:ident, $i:ident| $body:block) => {{
        const W: usize = std::mem::size_of::<$ty>();
        match $base {
            None => {
                for ($i, c) in $data.chunks_exact(W).enumerate() {
                    let $w = <$ty>::from_le_bytes(c.try_into().unwrap());
                    $body
                }
            }
            Some(b) => {
                let m = $mask as $ty;
                for ($i, (c, b)) in $data.chunks_exact(W).zip(b.chunks_exact(W)).enumerate() {
                    let $w = <$ty>::from_le_bytes(c.try_into().unwrap())
                        ^ (<$ty>::from_le_bytes(b.try_into().unwrap()) & m);
                    $body
                }
            }
        }
    }};
}

/// Writes `$value(i)` as the elements of `$out`, XORed with `$base` under `$mask`.
macro_rules! store_words {
    ($ty:ty, $out:expr, $base:expr, $mask:expr, |$i:ident| $value:expr) => {{
        const W: usize = std::mem::size_of::<$ty>();
        match $base {
            None => {
                for ($i, o) in $out.chunks_exact_mut(W).enumerate() {
                    let v: $ty = $value;
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
            Some(b) => {
                let m = $mask as $ty;
                for ($i, (o, b)) in $out.chunks_exact_mut(W).zip(b.chunks_exact(W)).enumerate() {
                    let v: $ty = $value ^ (<$ty>::from_le_bytes(b.try_into().unwrap()) & m);
                    o.copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }};
}

fn split_bf16(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, mask: u64) {
    let n = data.len() / 2;
    let [e, m, ..] = p else { unreachable!() };
    let (e, m) = (&mut e[..n], &mut m[..n]);
    for_words!(u16, data, base, mask, |w, i| {
        e[i] = (w >> 7) as u8;
        m[i] = ((w >> 8) & 0x80 | w & 0x7f) as u8;
    });
}

fn merge_bf16(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, mask: u64) {
    let n = out.len() / 2;
    let [e, m, ..] = p else { unreachable!() };
    let (e, m) = (&e[..n], &m[..n]);
    store_words!(u16, out, base, mask, |i| {
        let (e, m) = (e[i] as u16, m[i] as u16);
        (m & 0x80) << 8 | e << 7 | m & 0x7f
    });
}

fn split_f16(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, mask: u64) {
    let n = data.len() / 2;
    let [e, lo, hi, ..] = p else { unreachable!() };
    let (e, lo, hi) = (&mut e[..n], &mut lo[..n], &mut hi[..n]);
    for_words!(u16, data, base, mask, |w, i| {
        e[i] = ((w >> 10) & 0x1f) as u8;
        lo[i] = w as u8;
        hi[i] = ((w >> 13) & 0x4 | (w >> 8) & 0x3) as u8;
    });
}

fn merge_f16(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, mask: u64) {
    let n = out.len() / 2;
    let [e, lo, hi, ..] = p else { unreachable!() };
    let (e, lo, hi) = (&e[..n], &lo[..n], &hi[..n]);
    store_words!(u16, out, base, mask, |i| {
        let (e, lo, hi) = (e[i] as u16 & 0x1f, lo[i] as u16, hi[i] as u16);
        (hi & 0x4) << 13 | e << 10 | (hi & 0x3) << 8 | lo
    });
}

fn split_f32(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, mask: u64) {
    let n = data.len() / 4;
    let [e, hi, mid, lo, ..] = p else {
        unreachable!()
    };
    let (e, hi, mid, lo) = (&mut e[..n], &mut hi[..n], &mut mid[..n], &mut lo[..n]);
    for_words!(u32, data, base, mask, |w, i| {
        e[i] = (w >> 23) as u8;
        hi[i] = ((w >> 24) & 0x80 | (w >> 16) & 0x7f) as u8;
        mid[i] = (w >> 8) as u8;
        lo[i] = w as u8;
    });
}

fn merge_f32(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, mask: u64) {
    let n = out.len() / 4;
    let [e, hi, mid, lo, ..] = p else {
        unreachable!()
    };
    let (e, hi, mid, lo) = (&e[..n], &hi[..n], &mid[..n], &lo[..n]);
    store_words!(u32, out, base, mask, |i| {
        let (e, hi, mid, lo) = (e[i] as u32, hi[i] as u32, mid[i] as u32, lo[i] as u32);
        (hi & 0x80) << 24 | e << 23 | (hi & 0x7f) << 16 | mid << 8 | lo
    });
}

fn split_f64(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, mask: u64) {
    for_words!(u64, data, base, mask, |w, i| {
        p[0][i] = (w >> 52) as u8;
        // exponent bits 62..60 → 6..4, sign → 7, mantissa 51..48 → 3..0.
        p[1][i] = ((w >> 56) & 0xf0 | (w >> 48) & 0x0f) as u8;
        for k in 0..6 {
            p[2 + k][i] = (w >> (40 - 8 * k)) as u8;
        }
    });
}

fn merge_f64(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, mask: u64) {
    store_words!(u64, out, base, mask, |i| {
        let b1 = p[1][i] as u64;
        let mut w = (b1 & 0xf0) << 56 | (p[0][i] as u64) << 52 | (b1 & 0x0f) << 48;
        for k in 0..6 {
            w |= (p[2 + k][i] as u64) << (40 - 8 * k);
        }
        w
    });
}

// sub-delta: the difference from the base, as integers (the float's bit pattern read as an
// unsigned integer, wrapping), zigzag-mapped so small negative differences are small too, split
// into its little-endian bytes. Two floats of the same sign that are close have bit patterns
// that are close as integers, so where XOR turns a carry across a byte boundary into a run of
// ones (0x3f7fffff ^ 0x3f800000 = 0x00ffffff), the difference stays small (1).

macro_rules! sub_codec {
    ($split:ident, $merge:ident, $ty:ty, $sty:ty) => {
        fn $split(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, _mask: u64) {
            const W: usize = std::mem::size_of::<$ty>();
            const BITS: u32 = <$ty>::BITS;
            let zero = [0u8; W];
            let base = base.map(|b| b.chunks_exact(W));
            let mut base = base.into_iter().flatten();
            for (i, c) in data.chunks_exact(W).enumerate() {
                let b = base.next().unwrap_or(&zero);
                let v = <$ty>::from_le_bytes(c.try_into().unwrap());
                let d = v.wrapping_sub(<$ty>::from_le_bytes(b.try_into().unwrap())) as $sty;
                let z = ((d << 1) ^ (d >> (BITS - 1))) as $ty;
                for (k, plane) in p.iter_mut().enumerate().take(W) {
                    plane[i] = (z >> (8 * k)) as u8;
                }
            }
        }

        fn $merge(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, _mask: u64) {
            const W: usize = std::mem::size_of::<$ty>();
            let zero = [0u8; W];
            let base = base.map(|b| b.chunks_exact(W));
            let mut base = base.into_iter().flatten();
            for (i, o) in out.chunks_exact_mut(W).enumerate() {
                let b = base.next().unwrap_or(&zero);
                let mut z: $ty = 0;
                for (k, plane) in p.iter().enumerate().take(W) {
                    z |= (plane[i] as $ty) << (8 * k);
                }
                let d = ((z >> 1) as $sty) ^ -((z & 1) as $sty);
                let v = <$ty>::from_le_bytes(b.try_into().unwrap()).wrapping_add(d as $ty);
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
    };
}

sub_codec!(split_sub64, merge_sub64, u64, i64);

// The 16- and 32-bit versions, which carry nearly all tensors, name each plane so the loops
// have no per-byte plane indexing.

fn zigzag32(d: i32) -> u32 {
    ((d << 1) ^ (d >> 31)) as u32
}

fn unzigzag32(z: u32) -> i32 {
    ((z >> 1) as i32) ^ -((z & 1) as i32)
}

fn split_sub32(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, _mask: u64) {
    let n = data.len() / 4;
    let [p0, p1, p2, p3, ..] = p else {
        unreachable!()
    };
    let (p0, p1, p2, p3) = (&mut p0[..n], &mut p1[..n], &mut p2[..n], &mut p3[..n]);
    let zero = vec![0u8; if base.is_some() { 0 } else { data.len() }];
    let base = base.unwrap_or(&zero);
    for (i, (c, b)) in data.chunks_exact(4).zip(base.chunks_exact(4)).enumerate() {
        let v = u32::from_le_bytes(c.try_into().unwrap());
        let b = u32::from_le_bytes(b.try_into().unwrap());
        let z = zigzag32(v.wrapping_sub(b) as i32);
        p0[i] = z as u8;
        p1[i] = (z >> 8) as u8;
        p2[i] = (z >> 16) as u8;
        p3[i] = (z >> 24) as u8;
    }
}

fn merge_sub32(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, _mask: u64) {
    let n = out.len() / 4;
    let [p0, p1, p2, p3, ..] = p else {
        unreachable!()
    };
    let (p0, p1, p2, p3) = (&p0[..n], &p1[..n], &p2[..n], &p3[..n]);
    let zero = vec![0u8; if base.is_some() { 0 } else { out.len() }];
    let base = base.unwrap_or(&zero);
    for (i, (o, b)) in out
        .chunks_exact_mut(4)
        .zip(base.chunks_exact(4))
        .enumerate()
    {
        let z = p0[i] as u32 | (p1[i] as u32) << 8 | (p2[i] as u32) << 16 | (p3[i] as u32) << 24;
        let b = u32::from_le_bytes(b.try_into().unwrap());
        o.copy_from_slice(&b.wrapping_add(unzigzag32(z) as u32).to_le_bytes());
    }
}

fn split_sub16(data: &[u8], p: &mut [&mut [u8]], base: Option<&[u8]>, _mask: u64) {
    let n = data.len() / 2;
    let [p0, p1, ..] = p else { unreachable!() };
    let (p0, p1) = (&mut p0[..n], &mut p1[..n]);
    let zero = vec![0u8; if base.is_some() { 0 } else { data.len() }];
    let base = base.unwrap_or(&zero);
    for (i, (c, b)) in data.chunks_exact(2).zip(base.chunks_exact(2)).enumerate() {
        let v = u16::from_le_bytes(c.try_into().unwrap());
        let b = u16::from_le_bytes(b.try_into().unwrap());
        let d = v.wrapping_sub(b) as i16;
        let z = ((d << 1) ^ (d >> 15)) as u16;
        p0[i] = z as u8;
        p1[i] = (z >> 8) as u8;
    }
}

fn merge_sub16(p: &[&[u8]], out: &mut [u8], base: Option<&[u8]>, _mask: u64) {
    let n = out.len() / 2;
    let [p0, p1, ..] = p else { unreachable!() };
    let (p0, p1) = (&p0[..n], &p1[..n]);
    let zero = vec![0u8; if base.is_some() { 0 } else { out.len() }];
    let base = base.unwrap_or(&zero);
    for (i, (o, b)) in out
        .chunks_exact_mut(2)
        .zip(base.chunks_exact(2))
        .enumerate()
    {
        let z = p0[i] as u16 | (p1[i] as u16) << 8;
        let d = ((z >> 1) as i16) ^ -((z & 1) as i16);
        let b = u16::from_le_bytes(b.try_into().unwrap());
        o.copy_from_slice(&b.wrapping_add(d as u16).to_le_bytes());
    }
}

pub(crate) fn sub_layout(dtype: Dtype) -> Option<Layout> {
    let (width, split, merge): (usize, SplitFn, MergeFn) = match dtype {
        Dtype::BF16 | Dtype::F16 => (2, split_sub16, merge_sub16),
        Dtype::F32 => (4, split_sub32, merge_sub32),
        Dtype::F64 => (8, split_sub64, merge_sub64),
        _ => return None,
    };
    Some(Layout {
        width,
        planes: width,
        split,
        merge,
        plane_bits: &[],
    })
}

/// How a payload's planes relate to the tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transform {
    /// Float planes (exponent, sign and mantissa), each from the value or, where the XOR mask
    /// says, from `value ^ base`: codecs float-split and xor-delta.
    Planes,
    /// Byte planes of the zigzag-mapped integer difference `value − base`: codec sub-delta.
    Sub,
}

pub(crate) fn word_mask(l: &Layout, xor_mask: u8) -> u64 {
    (0..l.planes)
        .filter(|p| xor_mask & (1 << p) != 0)
        .map(|p| l.plane_bits[p])
        .fold(0, |a, b| a | b)
}

/// Splits one chunk (with its base chunk) and counts its planes ([`count_planes`]).
fn count_chunk(
    l: &Layout,
    chunk: &[u8],
    base: Option<&[u8]>,
    mask: u64,
    want: &[(bool, bool)],
    flags_if_zeros: bool,
) -> Vec<(Histogram, Histogram)> {
    with_scratch(CHUNK * l.planes, |scratch| {
        let n = chunk.len() / l.width;
        let mut planes: Vec<&mut [u8]> = scratch.chunks_mut(CHUNK).map(|p| &mut p[..n]).collect();
        (l.split)(chunk, &mut planes, base, mask);
        count_planes(planes.iter().map(|p| &**p), want, flags_if_zeros)
    })
}

/// Counts each plane's symbols and sparse-mode flag bytes, as `want` says per plane:
/// `(symbols, flags)`. With `flags_if_zeros`, a plane's flags are counted only where its
/// symbols [`Plan::wants_flags`] (left empty otherwise).
fn count_planes<'p>(
    planes: impl Iterator<Item = &'p [u8]>,
    want: &[(bool, bool)],
    flags_if_zeros: bool,
) -> Vec<(Histogram, Histogram)> {
    let count = |yes: bool, f: fn(&[u8]) -> Histogram, p: &[u8]| {
        if yes {
            f(p)
        } else {
            Histogram::default()
        }
    };
    planes
        .zip(want)
        .map(|(p, &(symbols, flags))| {
            let h = count(symbols, Histogram::of, p);
            let flags = flags && (!flags_if_zeros || Plan::wants_flags(&h));
            (h, count(flags, flag_histogram, p))
        })
        .collect()
}

/// Per-plane counts `b` added to `a`.
fn add_counts(
    mut a: Vec<(Histogram, Histogram)>,
    b: Vec<(Histogram, Histogram)>,
) -> Vec<(Histogram, Histogram)> {
    for ((x, fx), (y, fy)) in a.iter_mut().zip(&b) {
        x.add(y);
        fx.add(fy);
    }
    a
}

/// The layout a plane spec names, if any.
pub(crate) fn spec_layout_of(spec: PlaneSpec) -> Option<Layout> {
    match spec.transform {
        Transform::Planes => layout(spec.dtype),
        Transform::Sub => sub_layout(spec.dtype),
    }
}

/// The layout a plane spec names (the kernels are given float dtypes only).
pub(crate) fn spec_layout(spec: PlaneSpec) -> Layout {
    spec_layout_of(spec).expect("plane kernels are given float dtypes only")
}

/// [`PlaneSpec::shape`]: element width and plane count.
pub(crate) fn plane_shape(spec: PlaneSpec) -> Option<(usize, usize)> {
    spec_layout_of(spec).map(|l| (l.width, l.planes))
}

/// The CPU's [`Engine::plane_histograms`](crate::engine::Engine::plane_histograms):
/// chunks in parallel, counts added (exact).
pub(crate) fn cpu_plane_histograms(
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
    want: &[(bool, bool)],
) -> Vec<(Histogram, Histogram)> {
    let l = spec_layout(spec);
    let step = CHUNK * l.width;
    if data.len() <= step {
        return count_chunk(&l, data, base, spec.mask, want, false);
    }
    data.par_chunks(step)
        .enumerate()
        .map(|(c, chunk)| {
            let b = base.map(|b| &b[c * step..c * step + chunk.len()]);
            count_chunk(&l, chunk, b, spec.mask, want, false)
        })
        .reduce(
            || vec![(Histogram::default(), Histogram::default()); l.planes],
            add_counts,
        )
}

/// The CPU's [`Engine::sample_histograms`](crate::engine::Engine::sample_histograms).
pub(crate) fn cpu_sample_histograms(
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
) -> Vec<(Histogram, Histogram)> {
    let l = spec_layout(spec);
    if data.len() > CHUNK * l.width {
        let want = vec![(true, true); l.planes];
        let mut counts = cpu_plane_histograms(spec, data, base, &want);
        forget_unwanted_flags(&mut counts);
        return counts;
    }
    count_chunk(
        &l,
        data,
        base,
        spec.mask,
        &vec![(true, true); l.planes],
        true,
    )
}

/// Empties the flag counts of planes whose symbols do not [`Plan::wants_flags`].
pub fn forget_unwanted_flags(counts: &mut [(Histogram, Histogram)]) {
    for (symbols, flags) in counts {
        if !Plan::wants_flags(symbols) {
            *flags = Histogram::default();
        }
    }
}

/// The CPU's [`Engine::encode_planes`](crate::engine::Engine::encode_planes):
/// element chunks in parallel, each split once.
pub(crate) fn cpu_encode_planes(
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
    writers: &[StreamWriter],
) -> Vec<Vec<Vec<u8>>> {
    let l = spec_layout(spec);
    let step = CHUNK * l.width;
    // by_chunk[c][p]: the coded bytes of plane p in element chunk c.
    let by_chunk: Vec<Vec<Vec<u8>>> = data
        .par_chunks(step)
        .enumerate()
        .map(|(c, chunk)| {
            with_scratch(CHUNK * l.planes, |scratch| {
                let n = chunk.len() / l.width;
                let mut planes: Vec<&mut [u8]> =
                    scratch.chunks_mut(CHUNK).map(|p| &mut p[..n]).collect();
                let b = base.map(|b| &b[c * step..c * step + chunk.len()]);
                (l.split)(chunk, &mut planes, b, spec.mask);
                planes
                    .iter()
                    .zip(writers)
                    .map(|(p, w)| {
                        let mut v = Vec::new();
                        w.chunk(p, &mut v);
                        v
                    })
                    .collect()
            })
        })
        .collect();
    by_plane(by_chunk, l.planes)
}

/// `by_chunk[c][p]` (coded bytes of plane `p` in element chunk `c`) as `result[p][c]`.
fn by_plane(mut by_chunk: Vec<Vec<Vec<u8>>>, planes: usize) -> Vec<Vec<Vec<u8>>> {
    (0..planes)
        .map(|p| {
            by_chunk
                .iter_mut()
                .map(|c| std::mem::take(&mut c[p]))
                .collect()
        })
        .collect()
}

/// The CPU's [`Engine::split_planes`](crate::engine::Engine::split_planes): element chunks
/// in parallel, each into its chunk of every plane.
pub(crate) fn cpu_split_planes(
    spec: PlaneSpec,
    data: &[u8],
    base: Option<&[u8]>,
    planes: &mut Vec<Vec<u8>>,
) {
    let l = spec_layout(spec);
    let n = data.len() / l.width;
    let step = CHUNK * l.width;
    planes.resize_with(l.planes, Vec::new);
    // by_chunk[c][p]: chunk c of plane p.
    let mut by_chunk: Vec<Vec<&mut [u8]>> = (0..n.div_ceil(CHUNK)).map(|_| Vec::new()).collect();
    for plane in planes.iter_mut() {
        // Reused window after window: only a longer window grows (and zeroes) a plane.
        plane.resize(n, 0);
        for (c, chunk) in plane.chunks_mut(CHUNK).enumerate() {
            by_chunk[c].push(chunk);
        }
    }
    by_chunk
        .par_iter_mut()
        .zip(data.par_chunks(step))
        .enumerate()
        .for_each(|(c, (out, chunk))| {
            let b = base.map(|b| &b[c * step..c * step + chunk.len()]);
            (l.split)(chunk, out, b, spec.mask);
        });
}

/// The CPU's [`Engine::encode_split`](crate::engine::Engine::encode_split): chunks in
/// parallel.
pub(crate) fn cpu_encode_split(planes: &[&[u8]], writers: &[StreamWriter]) -> Vec<Vec<Vec<u8>>> {
    let chunks = planes.first().map_or(0, |p| p.len().div_ceil(CHUNK));
    let by_chunk: Vec<Vec<Vec<u8>>> = (0..chunks)
        .into_par_iter()
        .map(|c| {
            planes
                .iter()
                .zip(writers)
                .map(|(p, w)| {
                    let mut v = Vec::new();
                    w.chunk(&p[c * CHUNK..((c + 1) * CHUNK).min(p.len())], &mut v);
                    v
                })
                .collect()
        })
        .collect();
    by_plane(by_chunk, planes.len())
}

/// What [`cpu_plane_histograms`] counts, from planes already split: chunks in parallel.
pub(crate) fn split_histograms(
    planes: &[&[u8]],
    want: &[(bool, bool)],
) -> Vec<(Histogram, Histogram)> {
    let chunks = planes.first().map_or(0, |p| p.len().div_ceil(CHUNK));
    (0..chunks)
        .into_par_iter()
        .map(|c| {
            let chunk = planes
                .iter()
                .map(|p| &p[c * CHUNK..((c + 1) * CHUNK).min(p.len())]);
            count_planes(chunk, want, false)
        })
        .reduce(
            || vec![(Histogram::default(), Histogram::default()); planes.len()],
            add_counts,
        )
}

/// Elements of the first window (`n` elements) whose counts decide which planes are counted
/// further (see `PlaneCount`): its first [`SAMPLE`], enough to tell noise from a plane worth
/// coding. Windows are whole chunks but for a tensor's last, so this is the same whatever the
/// windowing.
pub fn sample_len(n: usize) -> usize {
    n.min(SAMPLE)
}

/// Elements a sample counts at most ([`sample_len`]).
pub(crate) const SAMPLE: usize = 1 << 15;

/// What [`cpu_sample_histograms`] counts, from planes already split: their
/// [`sample_len`] first symbols.
pub(crate) fn split_sample(planes: &[&[u8]]) -> Vec<(Histogram, Histogram)> {
    let first = planes.iter().map(|p| &p[..sample_len(p.len())]);
    count_planes(first, &vec![(true, true); planes.len()], true)
}

/// The CPU's [`Engine::decode_planes`](crate::engine::Engine::decode_planes):
/// element chunks in parallel.
pub(crate) fn cpu_decode_planes(
    spec: PlaneSpec,
    streams: &[Stream<'_>],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let l = spec_layout(spec);
    let step = CHUNK * l.width;
    out.par_chunks_mut(step)
        .enumerate()
        .try_for_each(|(c, chunk)| {
            with_scratch(CHUNK * l.planes, |scratch| {
                let n = chunk.len() / l.width;
                // Stored planes are merged from the stream itself; the others are decoded
                // into the scratch first.
                let planes = streams
                    .iter()
                    .zip(scratch.chunks_mut(CHUNK))
                    .map(|(s, p)| match s.stored_chunk(c, n) {
                        Some(stored) => Ok(stored),
                        None => {
                            let p = &mut p[..n];
                            s.decode_chunk(c, p)?;
                            Ok(&*p)
                        }
                    })
                    .collect::<Result<Vec<&[u8]>, FormatError>>()?;
                let b = base.map(|b| &b[c * step..c * step + chunk.len()]);
                (l.merge)(&planes, chunk, b, spec.mask);
                Ok(())
            })
        })
}

/// Which byte planes a float codec takes a tensor apart into (the table above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlaneSpec {
    /// Element type (bf16, f16, f32 or f64).
    pub dtype: Dtype,
    /// Float planes, or the zigzagged difference's byte planes.
    pub transform: Transform,
    /// Bits of each little-endian word XORed with the base before splitting (float planes
    /// only; 0 without a base).
    pub mask: u64,
}

impl PlaneSpec {
    /// Float planes of `value ^ (base & mask)`.
    pub fn planes(dtype: Dtype, mask: u64) -> PlaneSpec {
        PlaneSpec {
            dtype,
            transform: Transform::Planes,
            mask,
        }
    }

    /// `(bytes an element, planes)` of this layout, or `None` for a dtype the float codecs do
    /// not take apart.
    pub fn shape(&self) -> Option<(usize, usize)> {
        plane_shape(*self)
    }

    /// Byte planes of `zigzag(value − base)`.
    pub fn sub(dtype: Dtype) -> PlaneSpec {
        PlaneSpec {
            dtype,
            transform: Transform::Sub,
            mask: 0,
        }
    }
}
