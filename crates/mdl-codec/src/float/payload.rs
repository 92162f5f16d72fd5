//! The float payload of `docs/FORMAT.md` (`u8 planes | u8 xor_mask | u64 stream_len × planes |
//! entropy stream × planes`), written and read whole or a window of element chunks at a time.
//!
//! Every plane stream shares the chunking of [`CHUNK`] elements, so any run of whole chunks of
//! a tensor (a *window*) is encoded from, and decoded into, that run of each plane's chunks.
//! A reader that cannot hold a tensor decodes it window by window ([`PayloadIndex`]); a writer
//! that cannot hold the payload encodes it window by window ([`PayloadWriter`]), keeping each
//! plane's chunks apart until the heads (which need every chunk's length) are known.

use std::ops::Range;

use mdl_format::{Dtype, FormatError};

use super::{check_lengths, Choice};
use crate::engine::Engine;
use crate::huffman::{StreamHead, StreamWriter};
use crate::planes::{spec_layout_of, word_mask, Layout, PlaneSpec, Transform, CHUNK};

/// An encoded payload, kept as the pieces it was produced in (chunks encoded in parallel), so
/// it can be written out without first being copied into one buffer.
pub struct Encoded {
    /// Plane count, mask and stream lengths.
    head: Vec<u8>,
    /// Per plane: its stream header and its chunks.
    planes: Vec<(Vec<u8>, Vec<Vec<u8>>)>,
}

impl Encoded {
    /// The payload, in order.
    pub fn pieces(&self) -> Vec<&[u8]> {
        let mut out = vec![self.head.as_slice()];
        for (head, chunks) in &self.planes {
            out.push(head);
            out.extend(chunks.iter().map(Vec::as_slice));
        }
        out
    }
}

/// Encodes `data` as `choice` says (XORing the chosen planes with `base`, or taking the
/// difference from it), appending the payload to `out`.
pub fn encode(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: Option<&[u8]>,
    choice: &Choice,
    out: &mut Vec<u8>,
) -> Result<(), FormatError> {
    for piece in encode_pieces(engine, dtype, data, base, choice)?.pieces() {
        out.extend_from_slice(piece);
    }
    Ok(())
}

/// Like [`encode`], returning the payload in pieces.
pub fn encode_pieces(
    engine: &dyn Engine,
    dtype: Dtype,
    data: &[u8],
    base: Option<&[u8]>,
    choice: &Choice,
) -> Result<Encoded, FormatError> {
    let mut writer = PayloadWriter::new(dtype, choice, base.is_some())?;
    let chunks = writer.add(engine, data, base)?;
    Ok(writer.into_encoded(chunks))
}

/// [`encode_pieces`] of several whole tensors `(dtype, data, choice)` (no base), with one call
/// of the engine ([`Engine::encode_many`]): the same payloads.
pub fn encode_whole(
    engine: &dyn Engine,
    items: &[(Dtype, &[u8], &Choice)],
) -> Result<Vec<Encoded>, FormatError> {
    let mut writers = Vec::with_capacity(items.len());
    for &(dtype, data, choice) in items {
        let mut w = PayloadWriter::new(dtype, choice, false)?;
        check_lengths(&w.l, data, None)?;
        w.next_window(data.len() / w.l.width)?;
        writers.push(w);
    }
    let jobs: Vec<(PlaneSpec, &[u8], &[StreamWriter])> = (writers.iter().zip(items))
        .map(|(w, &(_, data, _))| (w.spec, data, &w.writers[..]))
        .collect();
    let coded = engine.encode_many(&jobs);
    Ok(writers
        .into_iter()
        .zip(coded)
        .map(|(mut w, coded)| {
            let coded = w.coded(coded);
            w.into_encoded(coded)
        })
        .collect())
}

/// [`encode_pieces`] of a window already split into its `planes`
/// ([`super::PlaneCount::add_splitting`], which counts them for `choice`): the same payload.
pub fn encode_split<P: AsRef<[u8]>>(
    engine: &dyn Engine,
    dtype: Dtype,
    planes: &[P],
    with_base: bool,
    choice: &Choice,
) -> Result<Encoded, FormatError> {
    let mut writer = PayloadWriter::new(dtype, choice, with_base)?;
    let split: Vec<&[u8]> = planes.iter().map(AsRef::as_ref).collect();
    let coded = writer.add_split(engine, &split)?;
    Ok(writer.into_encoded(coded))
}

/// Encodes a payload a window of whole element chunks at a time (the last window may end in a
/// partial chunk). The caller keeps each plane's chunks, in order, wherever it likes; the
/// payload is then the head, and for each plane its stream head followed by its chunks.
pub struct PayloadWriter {
    l: Layout,
    spec: PlaneSpec,
    xor_mask: u8,
    writers: Vec<StreamWriter>,
    /// Per plane: the length of each chunk so far.
    lens: Vec<Vec<u32>>,
    with_base: bool,
    /// Whether a window ended in a partial chunk (no window may follow it).
    ended: bool,
}

impl PayloadWriter {
    /// A writer of `choice` for a `dtype` tensor, against a base when `with_base`.
    pub fn new(dtype: Dtype, choice: &Choice, with_base: bool) -> Result<Self, FormatError> {
        let mut spec = PlaneSpec {
            dtype,
            transform: choice.transform,
            mask: 0,
        };
        let l =
            spec_layout_of(spec).ok_or(FormatError::invalid("float-split", "not a float dtype"))?;
        if (choice.xor_mask != 0 || choice.transform == Transform::Sub) && !with_base {
            return Err(FormatError::invalid("delta", "no base given"));
        }
        spec.mask = word_mask(&l, choice.xor_mask);
        Ok(PayloadWriter {
            l,
            spec,
            xor_mask: choice.xor_mask,
            writers: choice
                .plans
                .iter()
                .map(|p| StreamWriter::new(p.clone()))
                .collect(),
            lens: vec![Vec::new(); l.planes],
            with_base,
            ended: false,
        })
    }

    /// Encodes the next window of the tensor (and of its base): `result[plane][chunk]`.
    pub fn add(
        &mut self,
        engine: &dyn Engine,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Result<Vec<Vec<Vec<u8>>>, FormatError> {
        check_lengths(&self.l, data, base)?;
        if base.is_some() != self.with_base {
            return Err(FormatError::invalid(
                "delta",
                "base given to one window only",
            ));
        }
        self.next_window(data.len() / self.l.width)?;
        let coded = engine.encode_planes(self.spec, data, base, &self.writers);
        Ok(self.coded(coded))
    }

    /// [`Self::add`] of a window already split into its planes
    /// ([`Engine::split_planes`] with this payload's spec): the same chunks.
    fn add_split(
        &mut self,
        engine: &dyn Engine,
        planes: &[&[u8]],
    ) -> Result<Vec<Vec<Vec<u8>>>, FormatError> {
        let n = planes.first().map_or(0, |p| p.len());
        if planes.len() != self.l.planes || planes.iter().any(|p| p.len() != n) {
            return Err(FormatError::invalid(
                "float tensor",
                "planes of another count or length",
            ));
        }
        self.next_window(n)?;
        let coded = engine.encode_split(planes, &self.writers);
        Ok(self.coded(coded))
    }

    /// Checks that a window of `n` elements may follow (none follows a partial chunk).
    fn next_window(&mut self, n: usize) -> Result<(), FormatError> {
        if self.ended {
            return Err(FormatError::invalid(
                "float payload",
                "a window follows a partial chunk",
            ));
        }
        self.ended = !n.is_multiple_of(CHUNK);
        Ok(())
    }

    /// Notes the lengths of a window's coded chunks.
    fn coded(&mut self, coded: Vec<Vec<Vec<u8>>>) -> Vec<Vec<Vec<u8>>> {
        for (lens, chunks) in self.lens.iter_mut().zip(&coded) {
            lens.extend(chunks.iter().map(|c| c.len() as u32));
        }
        coded
    }

    /// The payload, once every window is added: its head, and each plane's stream head and
    /// chunks (`coded[plane][chunk]`).
    fn into_encoded(self, coded: Vec<Vec<Vec<u8>>>) -> Encoded {
        let (head, heads) = self.finish();
        Encoded {
            head,
            planes: heads.into_iter().zip(coded).collect(),
        }
    }

    /// The payload's head (plane count, mask, stream lengths) and each plane's stream head.
    pub fn finish(self) -> (Vec<u8>, Vec<Vec<u8>>) {
        let heads: Vec<Vec<u8>> = self
            .writers
            .iter()
            .zip(&self.lens)
            .map(|(w, lens)| w.head_of_lengths(lens))
            .collect();
        let mut head = vec![self.l.planes as u8, self.xor_mask];
        for (h, lens) in heads.iter().zip(&self.lens) {
            let len = h.len() as u64 + lens.iter().map(|&c| c as u64).sum::<u64>();
            head.extend_from_slice(&len.to_le_bytes());
        }
        (head, heads)
    }
}

/// Decodes a whole (unframed) payload held in memory: one window of every chunk.
pub(super) fn decode_whole(
    engine: &dyn Engine,
    spec: PlaneSpec,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let index = PayloadIndex::in_memory(spec, out.len() as u64, payload, base.is_some())?;
    let chunks = index.chunks();
    let planes: Vec<&[u8]> = (0..index.planes())
        .map(|p| {
            let r = index.plane_range(p, 0, chunks);
            &payload[r.start as usize..r.end as usize]
        })
        .collect();
    index.decode(engine, 0, &planes, base, out)
}

/// Reads payload bytes at an offset into a buffer of the length wanted.
pub type ReadAt<'a> = dyn FnMut(u64, &mut [u8]) -> Result<(), FormatError> + 'a;

/// A payload's head and its planes' stream heads: what it takes to read and decode any window
/// of element chunks alone.
pub struct PayloadIndex {
    spec: PlaneSpec,
    width: usize,
    /// Elements.
    n: u64,
    /// Per plane: where its stream starts in the payload, and its head.
    streams: Vec<(u64, StreamHead)>,
    /// The bytes no window covers, in payload order: the payload's head, then each stream's.
    heads: Vec<Vec<u8>>,
}

impl PayloadIndex {
    /// [`Self::open`] of a payload held in memory.
    pub fn in_memory(
        spec: PlaneSpec,
        content_len: u64,
        payload: &[u8],
        with_base: bool,
    ) -> Result<PayloadIndex, FormatError> {
        let mut read = |at: u64, buf: &mut [u8]| {
            let at = at as usize;
            buf.copy_from_slice(&payload[at..at + buf.len()]);
            Ok(())
        };
        let len = payload.len() as u64;
        Self::open(spec, content_len, len, with_base, &mut read)
    }

    /// Parses the heads of a payload of `payload_len` bytes for a tensor of `content_len`
    /// bytes, laid out as `spec` says (its mask is the payload's), reading payload bytes with
    /// `read(offset, buf)`. `with_base` says whether the record names a base.
    pub fn open(
        mut spec: PlaneSpec,
        content_len: u64,
        payload_len: u64,
        with_base: bool,
        read: &mut ReadAt<'_>,
    ) -> Result<PayloadIndex, FormatError> {
        let what = match spec.transform {
            Transform::Planes => "float-split",
            Transform::Sub => "sub-delta",
        };
        let l = spec_layout_of(spec).ok_or(FormatError::invalid(what, "not a float dtype"))?;
        if !content_len.is_multiple_of(l.width as u64) {
            return Err(FormatError::invalid(
                "float tensor",
                "length is not a whole number of elements",
            ));
        }
        let n = content_len / l.width as u64;
        let fixed = 2 + 8 * l.planes as u64;
        if payload_len < fixed {
            return Err(FormatError::Truncated {
                what: "float payload",
                needed: (fixed - payload_len) as usize,
            });
        }
        let mut head = vec![0u8; fixed as usize];
        read(0, &mut head)?;
        let (count, xor_mask) = (head[0], head[1]);
        if count as usize != l.planes {
            return Err(FormatError::invalid(
                "float payload",
                "plane count does not match the dtype",
            ));
        }
        let bad_mask = match spec.transform {
            Transform::Planes => {
                (l.planes < 8 && xor_mask >> l.planes != 0) || (xor_mask != 0) != with_base
            }
            Transform::Sub => xor_mask != 0 || !with_base,
        };
        if bad_mask {
            return Err(FormatError::invalid(
                "float payload",
                "XOR planes disagree with the record's base",
            ));
        }
        let mut streams = Vec::with_capacity(l.planes);
        let mut heads = Vec::with_capacity(1 + l.planes);
        let mut at = fixed;
        for len in head[2..].chunks_exact(8) {
            let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
            if len > payload_len - at {
                return Err(FormatError::invalid(
                    "float payload",
                    "plane overruns the payload",
                ));
            }
            let mut bytes = vec![0u8; StreamHead::max_len(n).min(len) as usize];
            read(at, &mut bytes)?;
            let stream = StreamHead::parse(&bytes, n, len)?;
            if stream.chunk_len() != CHUNK {
                return Err(FormatError::invalid(
                    "float payload",
                    "plane chunk size differs from the codec's",
                ));
            }
            bytes.truncate(stream.byte_range(0, 0).start as usize);
            heads.push(bytes);
            streams.push((at, stream));
            at += len;
        }
        if at != payload_len {
            return Err(FormatError::invalid(
                "float payload",
                "bytes after the last plane",
            ));
        }
        spec.mask = word_mask(&l, xor_mask);
        heads.insert(0, head);
        Ok(PayloadIndex {
            spec,
            width: l.width,
            n,
            streams,
            heads,
        })
    }

    /// Element chunks (of [`CHUNK`] elements; the last may hold fewer).
    pub fn chunks(&self) -> usize {
        self.n.div_ceil(CHUNK as u64) as usize
    }

    /// Planes.
    pub fn planes(&self) -> usize {
        self.streams.len()
    }

    /// Where plane `p`'s chunks `first..first + count` lie in the payload. Over all windows in
    /// order, a plane's ranges cover its stream after the stream's head, without gaps.
    pub fn plane_range(&self, p: usize, first: usize, count: usize) -> Range<u64> {
        let (at, head) = &self.streams[p];
        let r = head.byte_range(first, count);
        at + r.start..at + r.end
    }

    /// The payload's bytes that no window covers, in payload order: its head, then each
    /// stream's head (a reader checksums them with the windows' bytes).
    pub fn heads(&self) -> &[Vec<u8>] {
        &self.heads
    }

    /// Decodes the window starting at chunk `first` into `out` (its whole chunks, the last
    /// possibly partial), from each plane's bytes of [`Self::plane_range`] for that window and
    /// the base's same window.
    pub fn decode(
        &self,
        engine: &dyn Engine,
        first: usize,
        planes: &[&[u8]],
        base: Option<&[u8]>,
        out: &mut [u8],
    ) -> Result<(), FormatError> {
        let elements = (out.len() / self.width) as u64;
        let start = first as u64 * CHUNK as u64;
        let count = elements.div_ceil(CHUNK as u64) as usize;
        let fits = out.len().is_multiple_of(self.width)
            && start + elements <= self.n
            && (elements.is_multiple_of(CHUNK as u64) || start + elements == self.n)
            && planes.len() == self.streams.len()
            && base.is_none_or(|b| b.len() == out.len())
            && (0..planes.len()).all(|p| {
                let r = self.plane_range(p, first, count);
                planes[p].len() as u64 == r.end - r.start
            });
        if !fits {
            return Err(FormatError::invalid(
                "float payload",
                "window is not whole chunks of the tensor",
            ));
        }
        let streams: Vec<_> = self
            .streams
            .iter()
            .zip(planes)
            .map(|((_, h), bytes)| h.window(first, count, bytes))
            .collect();
        engine.decode_planes(self.spec, &streams, base, out)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{analysis_of, analyze, deltas_to_count, Count, PlaneCount};
    use super::*;
    use crate::engine::CpuEngine;

    /// A drifting series of f32 weights: `base` and a step later.
    fn pair(n: usize) -> (Vec<u8>, Vec<u8>) {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let base: Vec<f32> = (0..n).map(|_| rnd() * 0.1).collect();
        let data: Vec<f32> = base.iter().map(|b| b + rnd() * 1e-4).collect();
        let bytes = |v: &[f32]| v.iter().flat_map(|f| f.to_le_bytes()).collect();
        (bytes(&data), bytes(&base))
    }

    /// Counting, encoding and decoding a window of chunks at a time gives exactly the bytes
    /// and the choices of doing each at once.
    #[test]
    fn windows_match_the_whole() {
        let dtype = Dtype::F32;
        // Five and a half chunks, in windows of two chunks.
        let n = CHUNK * 5 + CHUNK / 2;
        let (data, base) = pair(n);
        let step = 2 * CHUNK * 4;
        let whole = analyze(&CpuEngine, dtype, &data, Some(&base)).unwrap();

        let mut plain = PlaneCount::new(dtype, Count::Plain).unwrap();
        let kinds = deltas_to_count(&CpuEngine, dtype, &data[..step], &base[..step]).unwrap();
        let mut deltas: Vec<PlaneCount> = kinds
            .iter()
            .map(|&k| PlaneCount::new(dtype, k).unwrap())
            .collect();
        for (d, b) in data.chunks(step).zip(base.chunks(step)) {
            plain.add(&CpuEngine, d, None).unwrap();
            for c in &mut deltas {
                c.add(&CpuEngine, d, Some(b)).unwrap();
            }
        }
        let windowed = analysis_of(&plain, &deltas);
        let choice = whole.best_delta().unwrap();
        let same = windowed.best_delta().unwrap();
        assert_eq!(
            (choice.size, choice.xor_mask, choice.transform),
            (same.size, same.xor_mask, same.transform)
        );
        assert_eq!(windowed.plain.size, whole.plain.size);

        for (c, b) in [(&whole.plain, None), (choice, Some(&base[..]))] {
            let mut expected = Vec::new();
            encode(&CpuEngine, dtype, &data, b, c, &mut expected).unwrap();
            let mut writer = PayloadWriter::new(dtype, c, b.is_some()).unwrap();
            let mut planes: Vec<Vec<u8>> = Vec::new();
            for (k, d) in data.chunks(step).enumerate() {
                let bw = b.map(|b| &b[k * step..k * step + d.len()]);
                let coded = writer.add(&CpuEngine, d, bw).unwrap();
                planes.resize(coded.len(), Vec::new());
                for (p, chunks) in planes.iter_mut().zip(coded) {
                    chunks.iter().for_each(|c| p.extend_from_slice(c));
                }
            }
            let (head, heads) = writer.finish();
            let mut payload = head;
            for (h, p) in heads.iter().zip(&planes) {
                payload.extend_from_slice(h);
                payload.extend_from_slice(p);
            }
            assert_eq!(payload, expected);

            // Decoded a window at a time from the payload's ranges.
            let spec = match c.transform {
                Transform::Planes => PlaneSpec::planes(dtype, 0),
                Transform::Sub => PlaneSpec::sub(dtype),
            };
            let index =
                PayloadIndex::in_memory(spec, data.len() as u64, &payload, b.is_some()).unwrap();
            let mut out = vec![0u8; data.len()];
            for (k, w) in out.chunks_mut(step).enumerate() {
                let first = k * 2;
                let bytes: Vec<&[u8]> = (0..index.planes())
                    .map(|p| {
                        let r = index.plane_range(p, first, 2);
                        &payload[r.start as usize..r.end as usize]
                    })
                    .collect();
                let bw = b.map(|b| &b[k * step..k * step + w.len()]);
                index.decode(&CpuEngine, first, &bytes, bw, w).unwrap();
            }
            assert_eq!(out, data);
            // A window that is not whole chunks is refused, not mis-decoded.
            let bytes: Vec<&[u8]> = (0..index.planes()).map(|_| &payload[..0]).collect();
            assert!(index
                .decode(&CpuEngine, 0, &bytes, b.map(|b| &b[..4]), &mut out[..4])
                .is_err());
        }
    }
}
