//! Masked delta payloads (format 11 on): a delta where few elements changed, coded as *which*
//! elements changed, once for all planes, and then only those elements' deltas
//! (`docs/FORMAT.md`, "Masked delta payload").
//!
//! ```text
//! u8 form (1 or 9) | varint changed | mask | coded byte plane × width (when changed > 0)
//! coded: rANS table | varint len | len bytes of rANS-coded symbols
//!     or u8 0 (no table) | varint len | the len symbols as they are
//! ```
//!
//! The mask says which elements differ from the base, as the tensor's flag bytes or as runs of
//! them (`mask.rs`); the comparing pass that finds them is `scan.rs`. A plane-by-plane delta pays for the positions of its non-zero symbols in every
//! plane, at the Huffman coder's floor of a bit a flag byte: at 1 % of elements changed that is
//! about 0.3 bit an element, where the mask's information is 0.08 (RL steps of bf16 weights,
//! `docs/BENCHMARKS.md`). Each changed element's *delta word* — `zigzag(value − base)` for
//! sub-delta, `value ^ base` for xor-delta (the record's codec says which) — is then cut into
//! byte planes, each rANS-coded under its own table: a few bytes of table where a Huffman stream
//! head takes two hundred, which weighs on tensors with a few hundred changes. The words are
//! applied to the base where the mask says, so a reader needs the base a window at a time.

use mdl_format::{Dtype, FormatError};

use super::mask::{self, code, coded_bits, decode_coded, for_changed, Form};
use super::scan::{low_bits, scan, unzigzag, word, zigzag, Scan};
use crate::planes::{layout, spec_layout_of, PlaneSpec, Transform};
use crate::varint;

/// The largest fraction of changed elements a masked payload is tried for: past it, the mask
/// costs about what the planes' own flags do.
const MAX_CHANGED: f64 = 0.25;

/// Whether `payload` (of codec xor-delta or sub-delta) is masked.
pub fn is_masked(payload: &[u8]) -> bool {
    Form::of(payload).is_some()
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
/// take apart). The changed elements take sub-delta or xor-delta words, whichever codes smaller.
pub fn encode_masked(
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
    let most = (MAX_CHANGED * n as f64) as usize;
    let Some(Scan {
        flags,
        counts,
        runs,
        changed,
        sub,
        xor,
    }) = (match w {
        2 => scan::<2>(data, base, most),
        4 => scan::<4>(data, base, most),
        _ => scan::<8>(data, base, most),
    })
    else {
        return Ok(None);
    };
    let mut coded_mask = Vec::new();
    let form = mask::write(&flags, &counts, &runs, &mut coded_mask);
    let mut payload = vec![form.first_byte()];
    varint::put(&mut payload, changed as u64);
    payload.extend_from_slice(&coded_mask);
    let cost = |planes: &[Vec<u8>]| planes.iter().map(|p| coded_bits(p)).sum::<f64>();
    let (planes, transform) = match cost(&xor) < cost(&sub) {
        true => (xor, Transform::Planes),
        false => (sub, Transform::Sub),
    };
    if changed > 0 {
        for plane in &planes {
            code(plane, &mut payload);
        }
    }
    Ok(Some(DeltaPayload { payload, transform }))
}

/// The masked payload that codes `base` against the tensor: given `payload`, which codes a
/// tensor against `base` (both `content_len` bytes, words as `spec` names), the delta the other
/// way round — what a reverse delta stored for an older version is, turned into the forward
/// delta a receiver holding that version needs. The mask is the same (the same elements
/// differ); XOR words are their own inverse, and a difference's words are negated, so only the
/// changed elements' words are decoded and coded again, never the tensors.
pub fn invert(spec: PlaneSpec, content_len: u64, payload: &[u8]) -> Result<Vec<u8>, FormatError> {
    let l = spec_layout_of(spec).ok_or_else(|| bad("not a float dtype"))?;
    if spec.transform == Transform::Planes {
        return Ok(payload.to_vec());
    }
    let w = l.width;
    let (form, n) = head(payload, content_len, w)?;
    let mut at = 1;
    let changed = changed(payload, &mut at, n)?;
    // The mask's coded bytes, kept as they are.
    mask::skip(form, payload, &mut at, n)?;
    let mut out = payload[..at].to_vec();
    if changed == 0 {
        return Ok(out);
    }
    let mut words = vec![0u64; changed];
    let mut plane = vec![0u8; changed];
    for k in 0..w {
        decode_coded(payload, &mut at, &mut plane)?;
        for (x, &b) in words.iter_mut().zip(&plane) {
            *x |= u64::from(b) << (8 * k);
        }
    }
    if at != payload.len() {
        return Err(bad("bytes after the last plane"));
    }
    let bits = 8 * w as u32;
    for x in &mut words {
        *x = zigzag(unzigzag(*x).wrapping_neg() & low_bits(bits), bits);
    }
    for k in 0..w {
        let plane: Vec<u8> = words.iter().map(|x| (x >> (8 * k)) as u8).collect();
        code(&plane, &mut out);
    }
    Ok(out)
}

/// A masked payload's form and the elements of its tensor of `content_len` bytes (elements of
/// `width` bytes).
fn head(payload: &[u8], content_len: u64, width: usize) -> Result<(Form, usize), FormatError> {
    let form = Form::of(payload).ok_or_else(|| bad("not a masked payload"))?;
    if !content_len.is_multiple_of(width as u64) {
        return Err(bad("length is not a whole number of elements"));
    }
    let n = usize::try_from(content_len / width as u64).map_err(|_| bad("too long"))?;
    Ok((form, n))
}

/// The count of changed elements at `*at` (moved past it), at most `n`.
fn changed(payload: &[u8], at: &mut usize, n: usize) -> Result<usize, FormatError> {
    let changed = varint::read(payload, at).ok_or_else(|| bad("truncated head"))?;
    if changed > n as u64 {
        return Err(bad("more elements changed than the tensor has"));
    }
    Ok(changed as usize)
}

fn bad(why: &str) -> FormatError {
    FormatError::invalid("masked delta", why.to_string())
}

/// A masked payload decoded but for its base: the mask and each changed element's delta word,
/// applied to the base a window of elements at a time ([`Self::apply_next`]).
pub struct MaskedDelta {
    transform: Transform,
    width: usize,
    /// Elements of the tensor.
    n: usize,
    flags: Vec<u8>,
    /// The changed elements' delta words, in element order (little-endian, `width` bytes each).
    words: Vec<u8>,
    /// The next element a window starts at, and the next word.
    next: usize,
    word: usize,
}

impl MaskedDelta {
    /// Decodes the mask and the delta words of a masked `payload` of a tensor of `content_len`
    /// bytes whose words `spec` names (sub-delta's differences, or xor-delta's XOR).
    pub fn open(
        spec: PlaneSpec,
        content_len: u64,
        payload: &[u8],
    ) -> Result<MaskedDelta, FormatError> {
        let l = spec_layout_of(spec).ok_or_else(|| bad("not a float dtype"))?;
        let width = l.width;
        let (form, n) = head(payload, content_len, width)?;
        let mut at = 1;
        let changed = changed(payload, &mut at, n)?;
        let flags = mask::read(form, payload, &mut at, n, changed)?;
        let mut words = vec![0u8; changed * width];
        if changed > 0 {
            let mut plane = vec![0u8; changed];
            for k in 0..width {
                decode_coded(payload, &mut at, &mut plane)?;
                for (w, &b) in words.chunks_exact_mut(width).zip(&plane) {
                    w[k] = b;
                }
            }
        }
        if at != payload.len() {
            return Err(bad("bytes after the last plane"));
        }
        Ok(MaskedDelta {
            transform: spec.transform,
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
        if base.len() != out.len() {
            return Err(out_of_step());
        }
        out.copy_from_slice(base);
        self.apply_next_in_place(out)
    }

    /// [`Self::apply_next`] where `window` holds the base's bytes already: the changed
    /// elements are written over them.
    pub fn apply_next_in_place(&mut self, window: &mut [u8]) -> Result<(), FormatError> {
        let w = self.width;
        let count = window.len() / w;
        if !window.len().is_multiple_of(w)
            || self.next + count > self.n
            || (!self.next.is_multiple_of(8))
        {
            return Err(out_of_step());
        }
        let flags = &self.flags[self.next / 8..(self.next + count).div_ceil(8)];
        self.word = self.apply(flags, self.word, window);
        self.next += count;
        Ok(())
    }

    /// Writes every changed element into `data`, which holds the whole base (the tensor's
    /// length): the tensor in place, touching only what changed. Independent of the windows
    /// read so far.
    pub fn patch(&self, data: &mut [u8]) -> Result<(), FormatError> {
        if data.len() != self.n * self.width {
            return Err(out_of_step());
        }
        self.apply(&self.flags, 0, data);
        Ok(())
    }

    /// Undoes [`Self::patch`] (or the windows applied in place so far) on `data`: the tensor
    /// patched, or its first whole windows. Exact: XOR is its own inverse, and a difference
    /// modulo the element's width is taken back off.
    pub fn unpatch(&self, data: &mut [u8]) -> Result<(), FormatError> {
        if data.len() > self.n * self.width || !data.len().is_multiple_of(self.width) {
            return Err(out_of_step());
        }
        let undo = match self.transform {
            Transform::Sub => Op::Sub,
            Transform::Planes => Op::Xor,
        };
        self.apply_as(undo, &self.flags, 0, data);
        Ok(())
    }

    /// Applies the words from `first` to the elements `flags` marks in `out` (whose first
    /// element is flag bit 0 of `flags`); the next word after.
    fn apply(&self, flags: &[u8], first: usize, out: &mut [u8]) -> usize {
        let how = match self.transform {
            Transform::Sub => Op::Add,
            Transform::Planes => Op::Xor,
        };
        self.apply_as(how, flags, first, out)
    }

    fn apply_as(&self, how: Op, flags: &[u8], first: usize, out: &mut [u8]) -> usize {
        let words = &self.words[first * self.width..];
        first
            + match self.width {
                2 => apply_words::<2>(how, words, flags, out),
                4 => apply_words::<4>(how, words, flags, out),
                8 => apply_words::<8>(how, words, flags, out),
                w => unreachable!("float widths are 2, 4 or 8, not {w}"),
            }
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

/// What a delta word does to its element: added (sub-delta), taken off (sub-delta undone),
/// or XORed (xor-delta, either way).
#[derive(Clone, Copy)]
enum Op {
    Add,
    Sub,
    Xor,
}

/// [`MaskedDelta::apply`] for elements of `W` bytes (a constant, so that each element is read
/// and written as one word): how many words it applied.
fn apply_words<const W: usize>(how: Op, words: &[u8], flags: &[u8], out: &mut [u8]) -> usize {
    let keep = low_bits(8 * W as u32);
    let mut words = words.chunks_exact(W);
    let mut k = 0;
    for_changed(flags, out.len() / W, |i| {
        let o: &mut [u8; W] = (&mut out[i * W..i * W + W]).try_into().expect("W bytes");
        let (b, d) = (
            word(o),
            word(words.next().expect("a word a changed element")),
        );
        let v = match how {
            Op::Add => b.wrapping_add(unzigzag(d)),
            Op::Sub => b.wrapping_sub(unzigzag(d)),
            Op::Xor => b ^ d,
        } & keep;
        o.copy_from_slice(&v.to_le_bytes()[..W]);
        k += 1;
    });
    k
}

fn out_of_step() -> FormatError {
    FormatError::invalid(
        "masked delta",
        "window out of step with the tensor".to_string(),
    )
}

/// Decodes a masked payload against the whole `base` into `out`.
pub(super) fn decode(
    spec: PlaneSpec,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let base = base.ok_or(FormatError::invalid("masked delta", "no base given"))?;
    let mut delta = MaskedDelta::open(spec, out.len() as u64, payload)?;
    delta.apply_next(base, out)?;
    delta.finish()
}
