//! Framed float payloads (format 7): a tensor too large to hold is encoded a frame of element
//! chunks at a time, each frame a complete float payload with codes of its own, written as
//! soon as it is encoded (`docs/FORMAT.md`, "Framed float payload").
//!
//! ```text
//! u8 0 (FRAMED) | u8 log2 of chunks a frame | frame × ⌈chunks / frame chunks⌉
//! ```
//!
//! A frame is the float payload of its elements (every frame but the last holds whole
//! frames' worth of chunks), so nothing of a frame depends on the rest of the tensor: a
//! writer needs no pass to count the whole tensor first and no place to keep coded chunks
//! until every length is known, and a reader decodes frame after frame in file order.
//! A plain payload starts with its plane count, never 0, so the first byte tells them apart.

use mdl_format::{Dtype, FormatError};

use super::payload::{decode_whole, Encoded, ReadAt};
use super::{encode_pieces, encode_split, Count, PlaneCount};
use crate::engine::Engine;
use crate::planes::{spec_layout_of, PlaneSpec, Transform, CHUNK};

/// First byte of a framed payload (a plain one starts with its plane count, at least 2).
const FRAMED: u8 = 0;

/// Log2 of the element chunks in a frame that writers use: 16 chunks, 2 Mi elements.
pub const FRAME_LOG2: u8 = 4;

/// The largest frame a reader accepts (log2 of its chunks): a reader holds a frame's coded
/// bytes and its decoded elements at once, and reads a tensor a window of 16 chunks at a time.
const MAX_FRAME_LOG2: u8 = FRAME_LOG2;

/// Element chunks in a frame of the writers' size.
pub const FRAME_CHUNKS: usize = 1 << FRAME_LOG2;

/// Whether `payload` (of codec float-split, xor-delta or sub-delta) is framed.
pub fn is_framed(payload: &[u8]) -> bool {
    payload.first() == Some(&FRAMED)
}

/// Encodes a framed payload frame by frame. Each frame chooses its own plane codes; which
/// planes are XORed with the base (or whether the difference is taken) is the record's.
pub struct FrameEncoder {
    dtype: Dtype,
    count: Count,
    with_base: bool,
    /// Bytes of a whole frame.
    frame_bytes: usize,
    /// Whether a partial frame was encoded (none may follow it).
    ended: bool,
    /// The planes of the frame being encoded (kept for the next).
    planes: Vec<Vec<u8>>,
}

impl FrameEncoder {
    /// An encoder of `dtype` frames holding the planes `transform` and `xor_mask` say, against
    /// a base when `with_base`.
    pub fn new(
        dtype: Dtype,
        transform: Transform,
        xor_mask: u8,
        with_base: bool,
    ) -> Result<FrameEncoder, FormatError> {
        let count = match transform {
            Transform::Sub => Count::Sub,
            Transform::Planes if xor_mask == 0 => Count::Plain,
            Transform::Planes => Count::Masked(xor_mask),
        };
        if (count != Count::Plain) != with_base {
            return Err(FormatError::invalid(
                "delta",
                "a base is given exactly to deltas",
            ));
        }
        let width = dtype.size();
        Ok(FrameEncoder {
            dtype,
            count,
            with_base,
            frame_bytes: (CHUNK << FRAME_LOG2) * width,
            ended: false,
            planes: Vec::new(),
        })
    }

    /// The payload's head, written before the first frame.
    pub fn head(&self) -> [u8; 2] {
        [FRAMED, FRAME_LOG2]
    }

    /// Bytes of tensor a whole frame holds.
    pub fn frame_bytes(&self) -> usize {
        self.frame_bytes
    }

    /// Encodes the next frames: `data` (and `base`'s same bytes) is whole frames, or ends the
    /// tensor. Returns each frame's payload, in order.
    pub fn encode(
        &mut self,
        engine: &dyn Engine,
        data: &[u8],
        base: Option<&[u8]>,
    ) -> Result<Vec<Encoded>, FormatError> {
        if self.ended {
            return Err(FormatError::invalid(
                "framed payload",
                "a frame follows a partial frame",
            ));
        }
        if base.is_some() != self.with_base || base.is_some_and(|b| b.len() != data.len()) {
            return Err(FormatError::invalid(
                "delta",
                "base missing or of another length",
            ));
        }
        self.ended = !data.len().is_multiple_of(self.frame_bytes);
        data.chunks(self.frame_bytes)
            .enumerate()
            .map(|(k, frame)| {
                let at = k * self.frame_bytes;
                let base = base.map(|b| &b[at..at + frame.len()]);
                let mut count = PlaneCount::new(self.dtype, self.count)?;
                if !engine.splits_on_host(frame) {
                    count.add(engine, frame, base)?;
                    return encode_pieces(engine, self.dtype, frame, base, &count.choice());
                }
                // Split once, for the counts and for the codes chosen from them.
                count.add_splitting(engine, frame, base, &mut self.planes)?;
                encode_split(
                    engine,
                    self.dtype,
                    &self.planes,
                    self.with_base,
                    &count.choice(),
                )
            })
            .collect()
    }
}

/// Decodes a framed payload held in memory into `out` (against `base`'s same bytes).
pub(super) fn decode(
    engine: &dyn Engine,
    spec: PlaneSpec,
    payload: &[u8],
    base: Option<&[u8]>,
    out: &mut [u8],
) -> Result<(), FormatError> {
    let mut read = |at: u64, buf: &mut [u8]| {
        let at = at as usize;
        match payload.get(at..at + buf.len()) {
            Some(bytes) => {
                buf.copy_from_slice(bytes);
                Ok(())
            }
            None => Err(FormatError::Truncated {
                what: "framed payload",
                needed: at + buf.len() - payload.len(),
            }),
        }
    };
    let mut frames = Frames::open(spec, out.len() as u64, payload.len() as u64, &mut read)?;
    let mut buf = Vec::new();
    frames.decode_next(engine, &mut read, &mut buf, base, out, &mut |_| {})?;
    frames.finish()
}

/// Reads a framed payload's frames in order, a window of whole frames at a time.
pub struct Frames {
    spec: PlaneSpec,
    width: usize,
    planes: usize,
    /// The payload's head.
    head: [u8; 2],
    /// Bytes of tensor a whole frame holds.
    frame_bytes: u64,
    content_len: u64,
    payload_len: u64,
    /// Where the next frame starts in the payload, and in the tensor.
    at: u64,
    decoded: u64,
}

impl Frames {
    /// Reads the head of a framed payload of `payload_len` bytes for a tensor of `content_len`
    /// bytes laid out as `spec` says, with `read(offset, buf)`.
    pub fn open(
        spec: PlaneSpec,
        content_len: u64,
        payload_len: u64,
        read: &mut ReadAt<'_>,
    ) -> Result<Frames, FormatError> {
        let l = spec_layout_of(spec)
            .ok_or(FormatError::invalid("framed payload", "not a float dtype"))?;
        if !content_len.is_multiple_of(l.width as u64) {
            return Err(FormatError::invalid(
                "float tensor",
                "length is not a whole number of elements",
            ));
        }
        if payload_len < 2 {
            return Err(FormatError::Truncated {
                what: "framed payload",
                needed: 2 - payload_len as usize,
            });
        }
        let mut head = [0u8; 2];
        read(0, &mut head)?;
        if head[0] != FRAMED || head[1] > MAX_FRAME_LOG2 {
            return Err(FormatError::invalid(
                "framed payload",
                "not framed, or frames too large",
            ));
        }
        Ok(Frames {
            spec,
            width: l.width,
            planes: l.planes,
            head,
            frame_bytes: ((CHUNK as u64) << head[1]) * l.width as u64,
            content_len,
            payload_len,
            at: 2,
            decoded: 0,
        })
    }

    /// Bytes of tensor a whole frame holds.
    pub fn frame_bytes(&self) -> u64 {
        self.frame_bytes
    }

    /// Bytes an element.
    pub fn width(&self) -> u64 {
        self.width as u64
    }

    /// The payload's head (what a reader checksums before the frames).
    pub fn head(&self) -> [u8; 2] {
        self.head
    }

    /// Reads (through `buf`) and decodes the next frames into `out`, which is whole frames
    /// or the rest of the tensor, against `base`'s same bytes; `seen` gets the payload bytes
    /// read, in order.
    pub fn decode_next(
        &mut self,
        engine: &dyn Engine,
        read: &mut ReadAt<'_>,
        buf: &mut Vec<u8>,
        base: Option<&[u8]>,
        out: &mut [u8],
        seen: &mut dyn FnMut(&[u8]),
    ) -> Result<(), FormatError> {
        let len = out.len() as u64;
        let whole = len.is_multiple_of(self.frame_bytes) || self.decoded + len == self.content_len;
        if self.decoded + len > self.content_len
            || !whole
            || base.is_some_and(|b| b.len() != out.len())
        {
            return Err(FormatError::invalid(
                "framed payload",
                "window is not whole frames of the tensor",
            ));
        }
        for (k, window) in out.chunks_mut(self.frame_bytes as usize).enumerate() {
            let fixed = 2 + 8 * self.planes as u64;
            if self.payload_len - self.at < fixed {
                return Err(FormatError::Truncated {
                    what: "framed payload",
                    needed: (fixed - (self.payload_len - self.at)) as usize,
                });
            }
            buf.resize(fixed as usize, 0);
            read(self.at, buf)?;
            let mut frame_len = fixed;
            for len in buf[2..].chunks_exact(8) {
                let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
                frame_len = frame_len
                    .checked_add(len)
                    .filter(|&f| f <= self.payload_len - self.at)
                    .ok_or(FormatError::invalid(
                        "framed payload",
                        "frame overruns the payload",
                    ))?;
            }
            // Exactly as large as the largest frame so far: frames vary in size, and doubling
            // would hold twice what a reader needs.
            buf.reserve_exact((frame_len as usize).saturating_sub(buf.len()));
            buf.resize(frame_len as usize, 0);
            read(self.at + fixed, &mut buf[fixed as usize..])?;
            seen(buf);
            let at = k * self.frame_bytes as usize;
            let base = base.map(|b| &b[at..at + window.len()]);
            decode_whole(engine, self.spec, buf, base, window)?;
            self.at += frame_len;
        }
        self.decoded += len;
        Ok(())
    }

    /// Checks, once every frame is decoded, that the payload ends with the last.
    pub fn finish(&self) -> Result<(), FormatError> {
        if self.decoded != self.content_len || self.at != self.payload_len {
            return Err(FormatError::invalid(
                "framed payload",
                "frames do not cover the tensor and the payload exactly",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{decode, decode_sub};
    use super::*;
    use crate::engine::CpuEngine;

    /// `n` drifting values of `dtype` and a base a step earlier, as bytes.
    fn pair(dtype: Dtype, n: usize) -> (Vec<u8>, Vec<u8>) {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        let base: Vec<f32> = (0..n).map(|_| rnd() * 0.1).collect();
        let data: Vec<f32> = base.iter().map(|b| b + rnd() * 1e-4).collect();
        let bytes = |v: &[f32]| -> Vec<u8> {
            match dtype {
                Dtype::F32 => v.iter().flat_map(|f| f.to_le_bytes()).collect(),
                _ => v
                    .iter()
                    .flat_map(|f| ((f.to_bits() >> 16) as u16).to_le_bytes())
                    .collect(),
            }
        };
        (bytes(&data), bytes(&base))
    }

    /// Encodes `data` framed, a window of `window` frames at a time.
    fn framed(
        dtype: Dtype,
        transform: Transform,
        mask: u8,
        data: &[u8],
        base: Option<&[u8]>,
        window: usize,
    ) -> Vec<u8> {
        let mut enc = FrameEncoder::new(dtype, transform, mask, base.is_some()).unwrap();
        let step = enc.frame_bytes() * window;
        let mut out = enc.head().to_vec();
        for (k, d) in data.chunks(step).enumerate() {
            let b = base.map(|b| &b[k * step..k * step + d.len()]);
            for frame in enc.encode(&CpuEngine, d, b).unwrap() {
                frame.pieces().iter().for_each(|p| out.extend_from_slice(p));
            }
        }
        out
    }

    /// Framed payloads of every kind round-trip, whole and frame by frame, whatever the
    /// window they were encoded in; a frame's codes are its own, so they cost next to nothing.
    #[test]
    fn framed_payloads_round_trip() {
        for dtype in [Dtype::F32, Dtype::BF16] {
            // Two and a half frames.
            let n = (CHUNK << FRAME_LOG2) * 5 / 2;
            let (data, base) = pair(dtype, n);
            let kinds = [
                (Transform::Planes, 0u8, None),
                (Transform::Planes, 0b1, Some(&base[..])),
                (Transform::Sub, 0, Some(&base[..])),
            ];
            for (transform, mask, b) in kinds {
                let one = framed(dtype, transform, mask, &data, b, 1);
                assert_eq!(one, framed(dtype, transform, mask, &data, b, 2));
                // Each frame is what the whole-tensor path makes of its elements: counted
                // (splitting as it counts), chosen, encoded (splitting again).
                let count = match transform {
                    Transform::Sub => Count::Sub,
                    _ if mask == 0 => Count::Plain,
                    _ => Count::Masked(mask),
                };
                let mut reference = vec![0u8, FRAME_LOG2];
                let step = CHUNK << FRAME_LOG2;
                for (k, frame) in data.chunks(step * dtype.size()).enumerate() {
                    let at = k * step * dtype.size();
                    let fb = b.map(|b| &b[at..at + frame.len()]);
                    let mut c = PlaneCount::new(dtype, count).unwrap();
                    c.add(&CpuEngine, frame, fb).unwrap();
                    super::super::encode(&CpuEngine, dtype, frame, fb, &c.choice(), &mut reference)
                        .unwrap();
                }
                assert_eq!(one, reference, "{dtype:?} {transform:?} {mask}");
                assert!(is_framed(&one));
                let mut out = vec![0u8; data.len()];
                match transform {
                    Transform::Sub => {
                        decode_sub(&CpuEngine, dtype, &one, b.unwrap(), &mut out).unwrap()
                    }
                    Transform::Planes => decode(&CpuEngine, dtype, &one, b, &mut out).unwrap(),
                }
                assert_eq!(out, data, "{dtype:?} {transform:?} {mask}");

                // Frame by frame from a reader, as a store reads a record.
                let spec = match transform {
                    Transform::Planes => PlaneSpec::planes(dtype, 0),
                    Transform::Sub => PlaneSpec::sub(dtype),
                };
                let mut read = |at: u64, buf: &mut [u8]| {
                    buf.copy_from_slice(&one[at as usize..at as usize + buf.len()]);
                    Ok(())
                };
                let mut frames =
                    Frames::open(spec, data.len() as u64, one.len() as u64, &mut read).unwrap();
                let step = frames.frame_bytes() as usize;
                let (mut seen, mut buf) = (frames.head().to_vec(), Vec::new());
                let mut out = vec![0u8; data.len()];
                for (k, w) in out.chunks_mut(step).enumerate() {
                    let bw = b.map(|b| &b[k * step..k * step + w.len()]);
                    frames
                        .decode_next(&CpuEngine, &mut read, &mut buf, bw, w, &mut |x| {
                            seen.extend_from_slice(x)
                        })
                        .unwrap();
                }
                frames.finish().unwrap();
                assert_eq!(out, data);
                assert_eq!(seen, one, "the reader sees every payload byte, in order");
            }
        }
    }

    /// A damaged framed payload is refused, never mis-decoded.
    #[test]
    fn damaged_framed_payloads_are_refused() {
        let dtype = Dtype::BF16;
        let n = (CHUNK << FRAME_LOG2) + 1000;
        let (data, _) = pair(dtype, n);
        let good = framed(dtype, Transform::Planes, 0, &data, None, 1);
        let mut out = vec![0u8; data.len()];
        decode(&CpuEngine, dtype, &good, None, &mut out).unwrap();
        let mut longer = good.clone();
        longer.push(0);
        let mut big_frames = good.clone();
        big_frames[1] = FRAME_LOG2 + 1;
        let mut overrun = good.clone();
        overrun[4] = 0xff;
        for bad in [
            &good[..good.len() - 1],
            &good[..2],
            &longer[..],
            &big_frames[..],
            &overrun[..],
        ] {
            assert!(decode(&CpuEngine, dtype, bad, None, &mut out).is_err());
        }
        // Content of another length: frames do not cover it.
        let mut short = vec![0u8; data.len() - 2];
        assert!(decode(&CpuEngine, dtype, &good, None, &mut short).is_err());
    }

    /// A framed payload, spelled out: its head, then each frame as the plain payload of its
    /// elements (here one partial frame).
    #[test]
    fn a_framed_payload_byte_for_byte() {
        let data: Vec<u8> = [1.0f32, -2.0, 0.5, 0.0]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        let payload = framed(Dtype::F32, Transform::Planes, 0, &data, None, 1);
        let plain = super::super::analyze(&CpuEngine, Dtype::F32, &data, None).unwrap();
        let mut frame = Vec::new();
        super::super::encode(
            &CpuEngine,
            Dtype::F32,
            &data,
            None,
            &plain.plain,
            &mut frame,
        )
        .unwrap();
        assert_eq!(payload[..2], [0, 4]);
        assert_eq!(payload[2..], frame[..]);
        assert_eq!(frame[..2], [4, 0], "four planes, nothing XORed");
        let mut out = vec![0u8; data.len()];
        decode(&CpuEngine, Dtype::F32, &payload, None, &mut out).unwrap();
        assert_eq!(out, data);
    }

    /// A frame is encoded against its base exactly when the record is a delta.
    #[test]
    fn a_base_is_given_exactly_to_deltas() {
        assert!(FrameEncoder::new(Dtype::F32, Transform::Planes, 0, true).is_err());
        assert!(FrameEncoder::new(Dtype::F32, Transform::Planes, 1, false).is_err());
        assert!(FrameEncoder::new(Dtype::F32, Transform::Sub, 0, false).is_err());
        let mut enc = FrameEncoder::new(Dtype::F32, Transform::Planes, 0, false).unwrap();
        let d = vec![0u8; 8];
        assert!(enc.encode(&CpuEngine, &d, Some(&d)).is_err());
        enc.encode(&CpuEngine, &d, None).unwrap();
        assert!(
            enc.encode(&CpuEngine, &d, None).is_err(),
            "nothing follows a partial frame"
        );
    }
}
