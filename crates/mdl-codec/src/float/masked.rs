//! Masked delta payloads (format 11): a delta where few elements changed, coded as *which*
//! elements changed, once for all planes, and then only those elements' deltas
//! (`docs/FORMAT.md`, "Masked delta payload").
//!
//! ```text
//! u8 1 (MASKED) | varint changed | rANS table | varint mask_len | mask (mask_len bytes)
//!   | values: the plain float or sub-delta payload of the `changed` elements (absent when 0)
//! ```
//!
//! The mask is the tensor's flag bytes (bit `k` of byte `j` set ⇔ element `8j + k` differs from
//! the base), rANS-coded under the one table. A plane-by-plane delta pays for the positions of
//! its non-zero symbols in every plane, and the Huffman coder's floor of a bit a flag byte: at
//! 1 % of elements changed that is about 0.3 bit an element, where the mask's information is
//! 0.08 (RL steps of bf16 weights, `docs/BENCHMARKS.md`). The values are the changed elements
//! of the new version coded against the same elements of the base, as any delta of the record's
//! codec (planes XORed per its head, or the difference), so decoding them against zeros gives
//! each element's *delta word*, which is then applied to the base where the mask says: the base
//! itself is needed only a window at a time.

use mdl_format::{Dtype, FormatError};

use super::payload::decode_whole;
use super::{analyze, encode, Analysis};
use crate::engine::Engine;
use crate::planes::{layout, spec_layout_of, word_mask, PlaneSpec, Transform, SAMPLE};
use crate::{rans, varint};

/// First byte of a masked payload (a plain one starts with its plane count, at least 2; a
/// framed one with 0).
const MASKED: u8 = 1;

/// The largest fraction of changed elements a masked payload is tried for: past it, the mask
/// costs about what the planes' own flags do.
const MAX_CHANGED: f64 = 0.25;

/// Whether `payload` (of codec xor-delta or sub-delta) is masked.
pub fn is_masked(payload: &[u8]) -> bool {
    payload.first() == Some(&MASKED)
}

/// A delta payload and the planes it is coded in (the record's codec: xor-delta for
/// [`Transform::Planes`], sub-delta for [`Transform::Sub`]).
pub struct DeltaPayload {
    /// The payload's bytes.
    pub payload: Vec<u8>,
    /// How its values are coded.
    pub transform: Transform,
}

/// Codes `data` against `base` (the same dtype and length) as a masked payload when at most a
/// quarter of the elements changed (`None` otherwise, or for a dtype the float codecs do not
/// take apart). The values take the smallest of float-split, xor-delta and sub-delta of the
/// changed elements.
pub fn encode_masked(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: &[u8],
) -> Result<Option<DeltaPayload>, FormatError> {
    let Some(l) = layout(dtype) else {
        return Ok(None);
    };
    if data.len() != base.len() || !data.len().is_multiple_of(l.width) {
        return Err(FormatError::invalid(
            "masked delta",
            "tensor and base lengths differ",
        ));
    }
    let w = l.width;
    let n = data.len() / w;
    let mut flags = vec![0u8; n.div_ceil(8)];
    let mut changed = 0usize;
    let most = (MAX_CHANGED * n as f64) as usize;
    for (i, (d, b)) in data.chunks_exact(w).zip(base.chunks_exact(w)).enumerate() {
        if d != b {
            flags[i / 8] |= 1 << (i % 8);
            changed += 1;
        }
        // Most elements changed (the usual case for a trained tensor in f32): stop early.
        let seen = i + 1;
        if seen % SAMPLE == 0 && changed > most.max(seen / 2) {
            return Ok(None);
        }
    }
    if changed > most {
        return Ok(None);
    }
    let (mut new, mut old) = (
        Vec::with_capacity(changed * w),
        Vec::with_capacity(changed * w),
    );
    for_changed(&flags, n, |i| {
        new.extend_from_slice(&data[i * w..(i + 1) * w]);
        old.extend_from_slice(&base[i * w..(i + 1) * w]);
    });
    let mut payload = vec![MASKED];
    varint::put(&mut payload, changed as u64);
    let mut counts = [0u64; 256];
    flags.iter().for_each(|&f| counts[f as usize] += 1);
    let table = rans::Table::from_counts(&counts);
    rans::Table::write(table.as_ref(), &mut payload);
    let mut mask = Vec::new();
    if let Some(t) = table {
        rans::encode(&flags, |r, c| c.resize(r.len(), 0), &[Some(t)], &mut mask);
    }
    varint::put(&mut payload, mask.len() as u64);
    payload.extend_from_slice(&mask);
    let mut transform = Transform::Sub;
    if changed > 0 {
        let a: Analysis = analyze(engine, dtype, &new, Some(&old))?;
        let choice = a.best_delta().unwrap_or(&a.plain);
        transform = choice.transform;
        let b = (choice.transform == Transform::Sub || choice.xor_mask != 0).then_some(&old[..]);
        encode(engine, dtype, &new, b, choice, &mut payload)?;
    }
    Ok(Some(DeltaPayload { payload, transform }))
}

/// Calls `f` with each element index whose flag bit is set, in order.
fn for_changed(flags: &[u8], n: usize, mut f: impl FnMut(usize)) {
    for (j, &byte) in flags.iter().enumerate() {
        let mut bits = byte;
        while bits != 0 {
            let i = j * 8 + bits.trailing_zeros() as usize;
            if i < n {
                f(i);
            }
            bits &= bits - 1;
        }
    }
}

/// A masked payload decoded but for its base: the mask and each changed element's delta word,
/// applied to the base a window of elements at a time ([`Self::apply_next`]).
pub struct MaskedDelta {
    transform: Transform,
    /// Bits of a word taken as `value ^ base` (float planes; 0 for sub-delta).
    mask: u64,
    width: usize,
    /// Elements of the tensor.
    n: usize,
    flags: Vec<u8>,
    /// The changed elements' delta words, in element order.
    words: Vec<u8>,
    /// The next element a window starts at, and the next word.
    next: usize,
    word: usize,
}

impl MaskedDelta {
    /// Decodes the mask and the values of a masked `payload` of a tensor of `content_len`
    /// bytes whose planes `spec` names (its mask is the payload's).
    pub fn open(
        engine: &dyn Engine,
        spec: PlaneSpec,
        content_len: u64,
        payload: &[u8],
    ) -> Result<MaskedDelta, FormatError> {
        let bad = |why: &str| FormatError::invalid("masked delta", why.to_string());
        let l = spec_layout_of(spec).ok_or_else(|| bad("not a float dtype"))?;
        let width = l.width;
        if !content_len.is_multiple_of(width as u64) {
            return Err(bad("length is not a whole number of elements"));
        }
        let n = usize::try_from(content_len / width as u64).map_err(|_| bad("too long"))?;
        if payload.first() != Some(&MASKED) {
            return Err(bad("not a masked payload"));
        }
        let mut at = 1;
        let changed = varint::read(payload, &mut at).ok_or_else(|| bad("truncated head"))?;
        if changed > n as u64 {
            return Err(bad("more elements changed than the tensor has"));
        }
        let changed = changed as usize;
        let table = rans::Table::read(payload, &mut at)?;
        let mask_len = varint::read(payload, &mut at).ok_or_else(|| bad("truncated head"))?;
        let end = usize::try_from(mask_len)
            .ok()
            .and_then(|m| at.checked_add(m))
            .filter(|&e| e <= payload.len())
            .ok_or_else(|| bad("mask overruns the payload"))?;
        let mut flags = vec![0u8; n.div_ceil(8)];
        match table {
            Some(t) => rans::decode(
                &payload[at..end],
                |r, c| c.resize(r.len(), 0),
                &[Some(t)],
                &mut flags,
            )?,
            None if flags.is_empty() && end == at => {}
            None => return Err(bad("a mask without a table")),
        }
        let set: usize = flags.iter().map(|f| f.count_ones() as usize).sum();
        if set != changed {
            return Err(bad("the mask disagrees with the count of changed elements"));
        }
        if n % 8 != 0 && flags.last().is_some_and(|&f| f >> (n % 8) != 0) {
            return Err(bad("mask bits past the last element"));
        }
        let values = &payload[end..];
        let mut words = vec![0u8; changed * width];
        let mut mask = 0;
        if changed == 0 {
            if !values.is_empty() {
                return Err(bad("values where nothing changed"));
            }
        } else {
            // The values' own head says which planes are XORed; decoded against zeros they
            // are the delta words.
            let xor_mask = *values.get(1).ok_or_else(|| bad("truncated values"))?;
            let with_base = spec.transform == Transform::Sub || xor_mask != 0;
            let zeros = vec![0u8; if with_base { words.len() } else { 0 }];
            let inner = PlaneSpec { mask: 0, ..spec };
            decode_whole(
                engine,
                inner,
                values,
                with_base.then_some(&zeros[..]),
                &mut words,
            )?;
            if spec.transform == Transform::Planes {
                if l.planes < 8 && xor_mask >> l.planes != 0 {
                    return Err(bad("XOR planes past the dtype's"));
                }
                mask = word_mask(&l, xor_mask);
            }
        }
        Ok(MaskedDelta {
            transform: spec.transform,
            mask,
            width,
            n,
            flags,
            words,
            next: 0,
            word: 0,
        })
    }

    /// Writes the next `out.len()` bytes of the tensor into `out` from the same bytes of the
    /// base: every window but the last a whole number of 8 elements.
    pub fn apply_next(&mut self, base: &[u8], out: &mut [u8]) -> Result<(), FormatError> {
        let w = self.width;
        let count = out.len() / w;
        if base.len() != out.len()
            || !out.len().is_multiple_of(w)
            || self.next + count > self.n
            || (!self.next.is_multiple_of(8))
        {
            return Err(FormatError::invalid(
                "masked delta",
                "window out of step with the tensor".to_string(),
            ));
        }
        out.copy_from_slice(base);
        let first = self.next / 8;
        let flags = &self.flags[first..(self.next + count).div_ceil(8)];
        let (words, transform, mask) = (&self.words, self.transform, self.mask);
        let mut k = self.word;
        for_changed(flags, count, |i| {
            let o = &mut out[i * w..(i + 1) * w];
            let d = &words[k * w..(k + 1) * w];
            apply(transform, mask, o, d);
            k += 1;
        });
        self.word = k;
        self.next += count;
        Ok(())
    }

    /// Checks that every window was applied.
    pub fn finish(&self) -> Result<(), FormatError> {
        if self.next != self.n || self.word * self.width != self.words.len() {
            return Err(FormatError::invalid(
                "masked delta",
                "tensor not read to its end".to_string(),
            ));
        }
        Ok(())
    }
}

/// Applies one delta word `d` to the base element held in `o` (both little-endian words of
/// `o.len()` bytes): `base + d` for sub-delta, `d ^ (base & mask)` for float planes.
fn apply(transform: Transform, mask: u64, o: &mut [u8], d: &[u8]) {
    let mut b = [0u8; 8];
    let mut v = [0u8; 8];
    b[..o.len()].copy_from_slice(o);
    v[..d.len()].copy_from_slice(d);
    let (b, v) = (u64::from_le_bytes(b), u64::from_le_bytes(v));
    let r = match transform {
        Transform::Sub => b.wrapping_add(v),
        Transform::Planes => v ^ (b & mask),
    };
    let n = o.len();
    o.copy_from_slice(&r.to_le_bytes()[..n]);
}

/// Decodes a masked payload against the whole `base` into `out`.
pub(super) fn decode(
    engine: &dyn Engine,
    spec: PlaneSpec,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let base = base.ok_or(FormatError::invalid("masked delta", "no base given"))?;
    let mut delta = MaskedDelta::open(engine, spec, out.len() as u64, payload)?;
    delta.apply_next(base, out)?;
    delta.finish()
}
